#!/usr/bin/perl
# idempotency_lock on a Redis Cluster: the slot of a lock key moved by hand
# (CLUSTER SETSLOT IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE) while its
# operation runs (docs/business-keys.md, "Reshards and failovers").  At each
# stage a competitor for the lock is refused 409 lock-held (the lock key is
# read where it is: on the migrating node, through ASK on the importing
# node, through MOVED on its new master); once the operation completes, the
# next one executes; never two at the upstream at once.  A unique key taken
# while its slot migrates is set through ASK, and its event reused.

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

my $owner = $t->cluster_owners;
my @masters = do { my %m = map { $_ => 1 } grep { defined } @$owner; sort keys %m };
my $env = "prod-$$-" . time;
my $L = lock_name("deploy:$env");
my $s = $t->key_slot($L);
my ($from, $to) = ($owner->[$s], (grep { $_ != $owner->[$s] } @masters)[0]);

sub deploy {
    my ($k) = @_;
    return $t->http(POST => '/deployments', key => $k, timeout => 20, json => { id => $k, environment => $env });
}

my $key = $t->key('holder');
my $bg = $t->http_bg(POST => '/deployments', key => $key, timeout => 40,
                     json => { id => $key, environment => $env }, headers => [ 'X-Delay' => 6 ]);
ok($t->wait_for(sub { $t->effects(key => $key) == 1 }, 10), 'the holder runs at the upstream');
like($t->redis_at($from, 'GET', $L) // '', qr/^idem:/, "its lock key is on $from (slot $s)");

is($t->redis_at($to, 'CLUSTER', 'SETSLOT', $s, 'IMPORTING', node_id($from)), 'OK', "$to imports slot $s");
is($t->redis_at($from, 'CLUSTER', 'SETSLOT', $s, 'MIGRATING', node_id($to)), 'OK', "$from migrates it");
$t->is_problem(deploy($t->key('c1')), 409, 'lock-held', name => 'slot migrating, the key still on its node: lock-held');

# a unique key of the migrating slot, absent: taken on the importing node (ASK)
my $ev;
for my $i (1 .. 100000) { $ev = "ev-$$-$i"; last if $t->key_slot(unique_name("ev:$ev")) == $s }
my $t1 = $t->http(POST => '/tickets', key => $t->key('u1'), json => { source_event_id => $ev });
is($t1->{status}, 201, 'a new event whose unique key is in the migrating slot executes');
my (undef, $uv) = $t->redis_at_multi($to, [ 'ASKING' ], [ 'GET', unique_name("ev:$ev") ]);
ok(defined $uv && !ref $uv, "its unique key was set on $to (ASK)");
my $t2 = $t->http(POST => '/tickets', key => $t->key('u2'), json => { source_event_id => $ev });
is(join(' ', $t2->{status}, $t2->{headers}{'idempotent-reused'} // '-'), '201 true', '... and another key of it is reused (ASK)');

is($t->redis_at($from, 'MIGRATE', '127.0.0.1', $to, '', 0, 5000, 'KEYS', $L), 'OK', "MIGRATE moves the lock key to $to");
$t->is_problem(deploy($t->key('c2')), 409, 'lock-held', name => 'the lock key on the importing node: lock-held (ASK)');

is($t->redis_at($_, 'CLUSTER', 'SETSLOT', $s, 'NODE', node_id($to)), 'OK', "SETSLOT $s NODE on $_")
    for ($to, $from, grep { $_ != $from && $_ != $to } @masters);
ok($t->wait_for(sub { $t->cluster_agree($s, $to) }, 10), "every node says slot $s is $to\'s");
$t->is_problem(deploy($t->key('c3')), 409, 'lock-held', name => 'the slot moved: lock-held (MOVED)');
ok(!$t->upstream_responses(key => $key), '... all while the holder ran');

is($bg->result(40)->{status}, 201, 'the holder completes');
like($t->redis_at($to, 'GET', $L) // '', qr/^idem:/, "its lock key is on $to");
my $after = deploy($t->key('after'));
is($after->{status}, 201, 'then a competitor executes') or diag($t->show($after));

my @eff = sort { $a->{t} <=> $b->{t} } grep { ($_->{json}{environment} // '') eq $env } $t->effect_list;
my %end = map { $_->{n} => $_->{t} } $t->upstream_responses;
is(scalar @eff, 2, 'two deployments ran, the holder and the one after');
ok($eff[1]{t} >= ($end{ $eff[0]{n} } // 9e9), 'one after the other') if @eff == 2;
is(scalar(grep { ($_->{json}{source_event_id} // '') eq $ev } $t->effect_list), 1, 'the event once');

done_testing;
