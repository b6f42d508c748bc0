#!/usr/bin/perl
# idempotency_unique and idempotency_lock on a Redis Cluster (3 masters, 3
# replicas) while `redis-cli --cluster reshard` moves the slots of a unique
# key and of a lock key under load (docs/business-keys.md, "Reshards and
# failovers"): the event and the environment are chosen so that both keys'
# slots are among the first slots of one master, the ones the reshard
# moves.  Concurrent clients send, each with a new Idempotency-Key every
# time, the same event to /tickets and a deployment to the same environment
# to /deployments, while a long deployment holds the lock through the
# reshard:
#   - both slots end on the other master, moved while requests ran;
#   - every answer is documented (201, 201 reused, 409 in-progress,
#     409 lock-held, 503 store-unavailable);
#   - the event has exactly one upstream effect, and a new key of it is
#     reused after the reshard (the unique key moved with its slot);
#   - no two deployments overlap at the upstream (effects.log "t" to
#     responses.log "t"), none runs while the long one does (no lock lost
#     while its operation runs), and deployments run again afterwards.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $t = Idem::Test->new;

my @ports = $t->start_cluster(masters => 3, replicas => 1);
$t->start_upstream;
$t->start_nginx(<<"EOF", workers => 2);
idempotency_json_var \$environment /environment;
idempotency_json_var \$source_event_id /source_event_id;
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis_cluster @{[ join ' ', map { "127.0.0.1:$_" } @ports ]} connect_timeout=300ms timeout=2s;
    proxy_ignore_client_abort on;
    location /deployments {
        idempotency on;
        idempotency_lease 10s;
        idempotency_lock deploy:\$environment;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /tickets {
        idempotency on;
        idempotency_unique ev:\$source_event_id shared=t;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

sub lock_name { $t->lock_name($_[0]) }
sub unique_name { $t->unique_shared_name('t', $_[0]) }
sub node_id { $t->redis_at($_[0], 'CLUSTER', 'MYID') }

ok($t->wait_for(sub { my $sh = $t->cluster_shards; @$sh == 3 && !grep { !@{ $_->{replicas} } } @$sh }, 30),
   'three masters, each with its replica');
my $owner = $t->cluster_owners;
my @masters = do { my %m = map { $_ => 1 } grep { defined } @$owner; sort { $a <=> $b } keys %m };
my ($from, $to) = @masters[0, 1];

# redis-cli --cluster reshard with one source moves its lowest slots first:
# the two keys' slots are chosen in the middle of those, moved under load
my $SLOTS = 1000;
my @first = (grep { ($owner->[$_] // 0) == $from } 0 .. 16383)[0 .. $SLOTS - 1];
my %moving = map { $_ => 1 } @first[300 .. 700];
my ($env, $ev);
for my $i (1 .. 1_000_000) { $env = "prod-$$-$i"; last if $moving{ $t->key_slot(lock_name("deploy:$env")) } }
for my $i (1 .. 1_000_000) { $ev = "ev-$$-$i"; last if $moving{ $t->key_slot(unique_name("ev:$ev")) } }
my ($L, $U) = (lock_name("deploy:$env"), unique_name("ev:$ev"));
my ($sl, $su) = ($t->key_slot($L), $t->key_slot($U));
ok($moving{$sl} && $moving{$su}, "the lock key's slot $sl and the unique key's slot $su are among the $SLOTS that move, "
   . 'in the middle');

sub deploy {
    my ($k, $delay) = @_;
    return $t->http(POST => '/deployments', key => $k, timeout => 20,
                    json => { id => $k, environment => $env }, headers => [ 'X-Delay' => $delay ]);
}
sub ticket { $t->http(POST => '/tickets', key => $_[0], timeout => 20, json => { source_event_id => $ev }) }

sub answer {
    my ($r) = @_;
    return join ' ', grep { $_ ne '' } $r->{status}, $t->ptype($r) // '',
        (($r->{headers}{'idempotent-reused'} // '') eq 'true' ? 'reused' : '');
}
my %DOC_TICKET = map { $_ => 1 } ('201', '201 reused', '409 in-progress', '503 store-unavailable');
my %DOC_DEPLOY = map { $_ => 1 } ('201', '409 lock-held', '503 store-unavailable');

# the long deployment: it holds the lock through the first part of the
# reshard, which starts 1.5 s after the clients
my $long = $t->key('long');
my $bg = $t->http_bg(POST => '/deployments', key => $long, timeout => 60,
                     json => { id => $long, environment => $env }, headers => [ 'X-Delay' => 5 ]);
ok($t->wait_for(sub { $t->effects(key => $long) == 1 }, 10), 'the long deployment runs at the upstream');

my $stop = $t->prefix . '/reshard.done';
my $log = $t->prefix . '/reshard.log';
my $cli = Idem::Test::_which('redis-cli') // '/usr/bin/redis-cli';
my ($pid, $t0, $started, $ended);
my $res = $t->parallel(8, sub {
    my $c = shift;
    my (@log, $i);
    my $end = time + 90;
    while (time < $end) {
        my $k = "rs-$$-$c-" . $i++;
        push @log, [ 'ticket', $k, time, answer(ticket("t$k")) ];
        push @log, [ 'deploy', $k, time, answer(deploy("d$k", 0.1)) ];
        last if -e $stop;
    }
    return \@log;
}, timeout => 150, tick => sub {
    $t0 //= time;
    if (!$started && time > $t0 + 1.5) {
        $started = time;
        $pid = Idem::Test::_spawn(stdout => $log, argv => [ $cli, '--cluster', 'reshard',
            "127.0.0.1:$from", '--cluster-from', node_id($from), '--cluster-to', node_id($to),
            '--cluster-slots', $SLOTS, '--cluster-yes' ]);
    } elsif ($started && !$ended && !kill(0, $pid)) {
        $ended = time;
    } elsif ($ended && time > $ended + 2 && time > $started + 6 && !-e $stop) {
        open my $fh, '>', $stop or die "$stop: $!";
        close $fh;
    }
});
ok($ended, 'redis-cli --cluster reshard has ended while the clients ran');
diag(sprintf 'reshard: %d slots moved in %.1f s, under load', $SLOTS, $ended - $started) if $ended;
my $out = Idem::Test::_slurp($log);
like($out, qr/Moving slot $sl\b/, "redis-cli moved slot $sl");
like($out, qr/Moving slot $su\b/, "... and slot $su");
unlike($out, qr/\[ERR\]|\bERR\b/, 'without an error') or diag($out);
ok($t->wait_for(sub { $t->cluster_agree($sl, $to) && $t->cluster_agree($su, $to) }, 10),
   "every node says both slots are $to\'s");

is($bg->result(60)->{status}, 201, 'the long deployment completes');

my (%seen, @bad, @during);
for my $x (@$res) {
    if (!$x) { push @bad, 'a client died'; next }
    for my $l (@$x) {
        my ($kind, $k, $t1, $a) = @$l;
        $seen{"$kind $a"}++;
        push @bad, "$kind $k: $a" unless ($kind eq 'ticket' ? \%DOC_TICKET : \%DOC_DEPLOY)->{$a};
        push @during, $l if $t1 >= $started && $t1 <= ($ended // 0);
    }
}
diag(join ', ', map { "$_: $seen{$_}" } sort keys %seen);
is(join('; ', @bad[0 .. ($#bad < 9 ? $#bad : 9)]), '', 'every answer is documented')
    or diag(join '', grep { /\[(error|alert|crit)\]/ } split /^/m, $t->error_log);
ok(scalar(grep { $_->[0] eq 'ticket' } @during) && scalar(grep { $_->[0] eq 'deploy' } @during),
   'tickets and deployments were answered while the reshard ran');

my @tickets = grep { ($_->{json}{source_event_id} // '') eq $ev } $t->effect_list(uri => '/tickets');
is(scalar @tickets, 1, 'the event has exactly one upstream effect');
my $again = ticket($t->key('after'));
is(answer($again), '201 reused', 'after the reshard, a new key of the event is reused');

my @eff = sort { $a->[0] <=> $b->[0] }
    map { [ $_->{t}, $_->{n}, $_->{key} ] } grep { ($_->{json}{environment} // '') eq $env } $t->effect_list(uri => '/deployments');
my %end = map { $_->{n} => $_->{t} } $t->upstream_responses;
my $overlaps = 0;
for my $i (1 .. $#eff) {
    $overlaps++ if $eff[$i][0] < ($end{ $eff[$i - 1][1] } // 9e9);
}
is($overlaps, 0, 'no two deployments at the upstream at once');
my ($l) = grep { $_->[2] eq $long } @eff;
ok($l && $l->[0] < $started && ($end{ $l->[1] } // 0) > $started, 'the long deployment ran when the reshard began');
ok($l && !(grep { $_->[0] > $l->[0] && $_->[0] < ($end{ $l->[1] } // 9e9) } @eff),
   'none began while the long deployment ran (the lock held through the reshard)');
my %per;
$per{ $_->[2] }++ for @eff;
is(scalar(grep { $_ != 1 } values %per), 0, 'each deployment key executed at most once');
ok(scalar(grep { $_->[0] > ($end{ $l->[1] } // 9e9) } @eff) >= 1, 'deployments ran again after the long one')
    if $l;
my $last = deploy($t->key('last'), 0);
is($last->{status}, 201, 'and one more executes once the load is over') or diag($t->show($last));

done_testing;
