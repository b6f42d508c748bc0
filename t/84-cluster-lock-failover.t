#!/usr/bin/perl
# idempotency_lock on a Redis Cluster: kill -9 of the master that holds a
# lock key while its operation runs (docs/business-keys.md, "Reshards and
# failovers").  The lock key has reached the master's replica (checked with
# READONLY before the kill); the cluster promotes the replica.  While the
# operation runs, competitors for the lock (new keys, retried after each
# answer) get 503 store-unavailable during the failover and 409 lock-held
# after it: none executes beside it (no two spans overlap at the
# upstream); once it has completed, the next one executes.

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
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis_cluster @{[ join ' ', map { "127.0.0.1:$_" } @ports ]} connect_timeout=300ms timeout=1s;
    proxy_ignore_client_abort on;
    location /deployments {
        idempotency on;
        idempotency_lease 10s;
        idempotency_lock deploy:\$environment;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

sub lock_name { $t->lock_name($_[0]) }

ok($t->wait_for(sub { my $sh = $t->cluster_shards; @$sh && !grep { !@{ $_->{replicas} } } @$sh }, 30),
   'every master has its replica');
my $shards = $t->cluster_shards;
sub shard_of { my $s = $t->key_slot($_[0]); (grep { $_->{first} <= $s && $s <= $_->{last} } @$shards)[0] }

# an environment whose lock key is on another master than the holder's record
my ($env, $key, $L, $shard);
for my $i (1 .. 500) {
    ($env, $key) = ("prod-$$-$i", $t->key("holder$i"));
    $L = lock_name("deploy:$env");
    $shard = shard_of($L);
    last if @{ $shard->{replicas} } && shard_of($t->record_name($key))->{master} != $shard->{master};
}
my ($victim) = grep { $t->instance_port($_) == $shard->{master} } map { "c$_" } 1 .. @ports;

sub deploy {
    my ($k, %o) = @_;
    return $t->http(POST => '/deployments', key => $k, timeout => 20,
                    json => { id => $k, environment => $env },
                    headers => [ 'X-Delay' => $o{delay} // 0 ]);
}

my $bg = $t->http_bg(POST => '/deployments', key => $key, timeout => 40,
                     json => { id => $key, environment => $env }, headers => [ 'X-Delay' => 10 ]);
ok($t->wait_for(sub { $t->effects(key => $key) == 1 }, 10), 'the holder runs at the upstream');
ok($t->wait_for(sub {
       my @r = $t->redis_at_multi($shard->{replicas}[0], ['READONLY'], ['GET', $L]);
       my $v = ref $r[1] ? '' : $r[1] // '';
       index($v, $t->record_name($key)) == 0 }, 5),
   'its lock key has reached the replica')
    or diag(explain [ $shard, $L, [ $t->redis_at_multi($shard->{replicas}[0], ['READONLY'], ['GET', $L]) ], $t->redis_at($shard->{master}, 'GET', $L) ]);

ok($t->stop_instance($victim, signal => 'KILL') // 1, "kill -9 of $victim, the lock key's master");
my (%seen, $executed_during);
my $end = time + 9;
my $i = 0;
while (time < $end && !$t->upstream_responses(key => $key)) {
    my $r = deploy($t->key('comp' . $i++));
    my $a = $t->answer($r);
    $seen{$a}++;
    $executed_during++ if $r->{status} == 201;
    sleep 0.2;
}
diag('while the holder ran: ' . join(', ', map { "$_ x$seen{$_}" } sort keys %seen));
ok(!$executed_during, 'no competitor executed while the holder ran');
ok(!grep({ !/^(409 lock-held|503 store-unavailable)$/ } keys %seen), 'each was answered lock-held or 503 store-unavailable');
ok($seen{'409 lock-held'}, 'after the failover: lock-held (the promoted replica has the lock key)');
my $done = $bg->result(40);
is($done->{status}, 201, 'the holder completes');
ok($t->wait_for(sub { deploy($t->key('after'))->{status} == 201 }, 15), 'then a competitor executes');
my @eff = sort { $a->{t} <=> $b->{t} } grep { ($_->{json}{environment} // '') eq $env } $t->effect_list;
my %end = map { $_->{n} => $_->{t} } $t->upstream_responses;
my $overlap = grep { $_ > 0 && $eff[$_]{t} < ($end{ $eff[$_ - 1]{n} } // 9e9) } 0 .. $#eff;
is($overlap, 0, 'never two at the upstream at once');

done_testing;
