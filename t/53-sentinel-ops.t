#!/usr/bin/perl
# The operations endpoints and idempotency_wait behind Sentinel: the status
# endpoint reads the record from the master the sentinels name, the admin
# endpoint resolves an unknown record there, and a duplicate that waits for
# an attempt in flight is woken by the completion's announcement (pub/sub on
# the master). After SENTINEL FAILOVER the same three work on the new
# master: the subscriptions move with the links.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $t = Idem::Test->new;

my @SAFE = ('--min-replicas-to-write', 1, '--min-replicas-max-lag', 10,
            '--repl-diskless-sync-delay', 0);

sub linked {
    my ($port) = @_;
    return ($t->redis_at($port, 'INFO', 'replication') // '') =~ /master_link_status:up/;
}

my @M = ($t->start_redis_instance(name => 'ops-0', args => \@SAFE));
push @M, $t->start_redis_instance(name => 'ops-1',
    args => [ @SAFE, '--replicaof', '127.0.0.1', $M[0] ]);
ok($t->wait_for(sub { linked($M[1]) }, 15), 'the replica is in sync');

my @S = map {
    $t->start_sentinel(name => "sentinel-$_", down_after => 1000, failover_timeout => 5000,
                       monitor => [ [ 'ops', $M[0], 2 ] ])
} 1 .. 3;
ok($t->wait_for(sub { !grep { !$t->sentinel_ready($_, 'ops', 1) } @S }, 30),
   'the three sentinels know each other and the replica');

$t->start_upstream;
my $seeds = join ' ', map { "127.0.0.1:$_" } @S;
$t->start_nginx(<<"EOF", workers => 2);
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis_sentinel ops $seeds connect_timeout=300ms timeout=500ms;
    proxy_ignore_client_abort on;
    location / {
        idempotency on;
        idempotency_wait 5s;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /status {
        idempotency_status;
    }
    location = /admin {
        idempotency_admin on;
    }
}
EOF

sub master_of {
    for my $s (@S) {
        my $a = $t->redis_at($s, 'SENTINEL', 'get-master-addr-by-name', 'ops');
        return $a->[1] if ref $a eq 'ARRAY';
    }
    return undef;
}

my $before = $t->ops_round('before', $M[0]);

is($t->redis_at($S[0], 'SENTINEL', 'FAILOVER', 'ops'), 'OK', 'SENTINEL FAILOVER ops');
my $new = $t->wait_for(sub { my $m = master_of(); $m && $m != $M[0] ? $m : 0 }, 20);
ok($new, "the sentinels name the new master ($new)");
ok($t->wait_for(sub { $t->workers_connected_to($new) >= 2 }, 15),
   'both workers are on the new master');
ok($t->wait_for(sub { linked($M[0]) }, 40), 'the old master replicates the new one');

my ($code, $st) = $t->status_of($before);
is($st->{state}, 'completed', 'after the failover the status endpoint reads the replicated record');

$t->ops_round('after', $new);

$t->check_logs;
done_testing();
