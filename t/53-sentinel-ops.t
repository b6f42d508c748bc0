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
use JSON::PP;
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
ok($t->wait_for(sub {
    !grep {
        my $m = $t->redis_at($_, 'SENTINEL', 'master', 'ops');
        !(ref $m eq 'ARRAY' && ({ @$m }->{'num-other-sentinels'} // 0) >= 2)
    } @S
}, 20), 'the three sentinels know each other');

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

sub status_of {
    my ($k) = @_;
    my $r = $t->http(GET => '/status', key => $k);
    return ($r->{status}, eval { JSON::PP->new->decode($r->{content}) } // {});
}

# one slow attempt and $n duplicates that wait for it: one effect, and
# every duplicate is woken with the replay (none runs out into in-progress)
sub waiters {
    my ($name, $n) = @_;
    my $k = $t->key($name);
    my $bg = $t->http_bg(POST => '/w', key => $k, json => { w => 1 },
                         headers => [ 'X-Delay' => 1.5 ], timeout => 20);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 10), "$name: the first attempt runs");
    my $res = $t->parallel($n, sub {
        my $r = $t->http(POST => '/w', key => $k, json => { w => 1 }, timeout => 20);
        return "$r->{status} " . ($r->{headers}{'idempotent-replayed'} // $t->ptype($r));
    }, timeout => 30);
    my $first = $bg->result(20);
    is($first && $first->{status}, 201, "$name: the first attempt completes");
    is(scalar(grep { ($_ // '') eq '201 true' } @$res), $n,
       "$name: all $n waiting duplicates got the replay") or diag(explain $res);
    is($t->effects(key => $k), 1, "$name: one effect");
    return $k;
}

sub ops_round {
    my ($name, $master) = @_;

    my $k = $t->key("$name-status");
    my $r = $t->http(POST => '/s', key => $k, json => { s => 1 });
    is($r->{status}, 201, "$name: a write executes");
    my ($code, $st) = status_of($k);
    is($code, 200, "$name: the status endpoint answers");
    is($st->{state}, 'completed', "$name: ... completed");
    is($st->{response_status}, 201, "$name: ... with the upstream's status");
    ($code) = status_of($t->key("$name-none"));
    is($code, 404, "$name: status of an unknown key: 404");

    # an unknown record on the master: the admin endpoint releases it there
    # (the fingerprint of that request, read from another key's record: the
    # key is not part of it)
    my $kf = $t->key("$name-fp");
    $t->http(POST => '/u', key => $kf, json => { u => 1 });
    my (undef, $fst) = status_of($kf);
    my $ku = $t->key("$name-unknown");
    my $op = join '', map { sprintf '%02x', int rand 256 } 1 .. 16;
    my $now = int(time * 1000);
    is($t->redis_at($master, 'SET', $t->record_name($ku),
                    $t->encode_record({ state => 'unknown', op => $op, fp => $fst->{fingerprint} // 'a' x 64,
                                        created => $now, unknown_at => $now }),
                    'PX', 600000), 'OK', "$name: an unknown record on the master");
    ($code, $st) = status_of($ku);
    is($st->{state}, 'unknown', "$name: status shows it unknown");
    $r = $t->http(POST => '/u', key => $ku, json => { u => 1 });
    is($t->ptype($r), 'outcome-unknown', "$name: a retry is told outcome-unknown");
    $r = $t->http(POST => '/admin?action=release', key => $ku);
    is($r->{status}, 200, "$name: admin release: 200") or diag($t->show($r));
    is(($t->redis_at($master, 'EXISTS', $t->record_name($ku)) // -1), 0,
       "$name: the record is gone from the master");
    $r = $t->http(POST => '/u', key => $ku, json => { u => 1 });
    is($r->{status}, 201, "$name: then the retry executes");
    is($t->effects(key => $ku), 1, "$name: once");
    is($t->effects(key => $kf), 1, "$name: (and the other key once)");

    waiters("$name-wait", 6);
    return $k;
}

my $before = ops_round('before', $M[0]);

is($t->redis_at($S[0], 'SENTINEL', 'FAILOVER', 'ops'), 'OK', 'SENTINEL FAILOVER ops');
my $new = $t->wait_for(sub { my $m = master_of(); $m && $m != $M[0] ? $m : 0 }, 20);
ok($new, "the sentinels name the new master ($new)");
ok($t->wait_for(sub { $t->workers_connected_to($new) >= 2 }, 15),
   'both workers are on the new master');
ok($t->wait_for(sub { linked($M[0]) }, 40), 'the old master replicates the new one');

my ($code, $st) = status_of($before);
is($st->{state}, 'completed', 'after the failover the status endpoint reads the replicated record');

ops_round('after', $new);

$t->check_logs;
done_testing();
