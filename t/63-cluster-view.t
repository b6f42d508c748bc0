#!/usr/bin/perl
# idempotency_redis_cluster and a node with a view of its own: a node that
# forgot the cluster (CLUSTER RESET HARD, or restarted with an empty
# nodes.conf) answers CLUSTER SLOTS with fewer slots than the map in use,
# here none.  A worker that took such a map would stop the links of every
# node it leaves out, answer 503 to everything, and ask its seeds again;
# with that node as its only seed it would never recover.  The module keeps
# the map it has, logs the refusal and asks the next node (docs/redis.md,
# "Cluster").
#
# The only seed is a replica.  Under load, it is reset and a slot is moved
# by hand, so that a MOVED makes the worker read the map again, from that
# seed: every answer stays a 201 or its replay, every key executes once.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $t = Idem::Test->new;

my @ports = $t->start_cluster(masters => 3, replicas => 1);
ok($t->wait_for(sub { my $sh = $t->cluster_shards; @$sh == 3 && !grep { !@{ $_->{replicas} } } @$sh }, 30),
   'three masters, each with its replica');

my @owner;
sub learn_owners { @owner = @{ $t->cluster_owners } }
learn_owners();
my @masters = do { my %m = map { $_ => 1 } grep { defined } @owner; sort keys %m };
my $seed = $t->cluster_shards->[0]{replicas}[0];

$t->start_upstream;
$t->start_nginx(<<"EOF", workers => 1);
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis_cluster 127.0.0.1:$seed connect_timeout=300ms timeout=500ms;
    location / {
        idempotency on;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

sub node_id { $t->redis_at($_[0], 'CLUSTER', 'MYID') }
sub key_in { $t->key_where(@_) }

for my $m (@masters) {
    my $k = key_in('before', sub { ($owner[$_[0]] // 0) == $m });
    is($t->answer($t->http(POST => '/before', key => $k, json => { m => $m })), '201',
       "through the replica seed: a key on master $m executes");
    is($t->answer($t->http(POST => '/before', key => $k, json => { m => $m })), '201 replayed',
       '... and replays');
}

# an empty slot of the first master, to be moved to the second by hand
my ($from, $to) = @masters[0, 1];
my ($slot) = grep { ($owner[$_] // 0) == $from
                    && $t->redis_at($from, 'CLUSTER', 'COUNTKEYSINSLOT', $_) == 0 } 0 .. 16383;
my $mk = key_in('moved', sub { $_[0] == $slot });

# The slot moves as a resharding moves it: IMPORTING on $to and MIGRATING on
# $from first, so that SETSLOT NODE on $to gives it a new config epoch, the
# highest.  Without that, whichever of the two has the higher epoch wins: a
# heartbeat of $from that reaches $to before $from is told (a loaded machine
# widens the window) gives the slot back to $from in $to's view, and each
# node sends the slot's keys to the other.
sub move_slot {
    my ($s, $a, $b) = @_;
    $t->redis_at($b, 'CLUSTER', 'SETSLOT', $s, 'IMPORTING', node_id($a));
    $t->redis_at($a, 'CLUSTER', 'SETSLOT', $s, 'MIGRATING', node_id($b));
    $t->redis_at($_, 'CLUSTER', 'SETSLOT', $s, 'NODE', node_id($b)) for ($b, $a, grep { $_ != $a && $_ != $b } @masters);
}

my $WARN = qr/the slot map from node \S+ serves 0 slots, fewer than the map in use: not taken/;
unlike($t->error_log, $WARN, 'no map refused before the seed forgets the cluster');

my $r = $t->storm(name => 'view', path => '/view', clients => 4, run => 8, at => 2, bound => 30,
    documented => { '201' => 1, '201 replayed' => 1 },
    fault => sub {
        $t->redis_at($seed, 'CLUSTER', 'RESET', 'HARD');
        move_slot($slot, $from, $to);
        # the worker still sends this slot to $from: MOVED, then a new map
        $t->http(POST => '/moved', key => $mk, json => { k => 1 });
    },
    moved => sub { $t->error_log =~ $WARN });

my $view = $t->redis_at($seed, 'CLUSTER', 'SLOTS');
is(ref $view eq 'ARRAY' ? scalar @$view : 'not a map', 0, 'the reset seed serves no slot');
like($t->error_log, $WARN, 'the worker asked it and did not take its map');
is($t->answer($t->http(POST => '/moved', key => $mk, json => { k => 1 })), '201 replayed',
   "the key of the moved slot $slot replays");
is($t->effects(key => $mk), 1, '... executed once');

ok($t->wait_for(sub { $t->cluster_agree($slot, $to, $seed) }, 10), "every node but the seed says slot $slot is $to\'s");
learn_owners();
is($owner[$slot], $to, "slot $slot is $to\'s now");
for my $m (@masters) {
    my $k = key_in('after', sub { ($owner[$_[0]] // 0) == $m });
    is($t->answer($t->http(POST => '/after', key => $k, json => { m => $m })), '201',
       "after the refusal a key on master $m executes");
    is($t->answer($t->http(POST => '/after', key => $k, json => { m => $m })), '201 replayed',
       '... and replays');
    is($t->effects(key => $k), 1, '... once');
}
unlike($t->error_log, qr/no cluster node is reachable/, 'the worker never lost every node');

$t->check_logs;
done_testing;
