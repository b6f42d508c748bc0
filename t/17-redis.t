#!/usr/bin/perl
# Redis: unix socket and db=, Redis down (fail closed -> 503, fail open ->
# pass through), Redis back (reconnect), script cache flushed and a real
# restart (NOSCRIPT -> EVAL fallback).

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Idem::Test;

my $t = Idem::Test->new;
$t->start_stack(<<'EOF', redis => { unixsocket => 1 });
server {
    listen 127.0.0.1:%%PORT%%;
    location / {
        idempotency on;
        idempotency_redis %%REDIS%% connect_timeout=500ms timeout=1s;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /open/ {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_store_failure open;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /unix/ {
        idempotency on;
        idempotency_redis unix:%%REDIS_SOCKET%%;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /db3/ {
        idempotency on;
        idempotency_redis %%REDIS%% db=3;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

# One execution and its replay. With $follow, the retry behaves as a client
# honouring Retry-After: a 409 in-progress (the completion of the first
# request may still be on its way to Redis when the client already has the
# answer, e.g. behind a NOSCRIPT round trip) is retried after Retry-After.
sub once_and_replay {
    my ($path, $what, $follow) = @_;
    my $k = $t->key('redis');
    my $a = $t->http(POST => $path, key => $k, json => { w => $what });
    is($a->{status}, 201, "$what: executes") or diag($t->show($a));
    my $b = $t->http(POST => $path, key => $k, json => { w => $what });
    for (1 .. 3) {
        last unless $follow && $b->{status} == 409
            && (($t->problem($b) // {})->{type} // '') =~ /in-progress$/;
        note("$what: retry answered 409 in-progress, following Retry-After");
        sleep($b->{headers}{'retry-after'} // 1);
        $b = $t->http(POST => $path, key => $k, json => { w => $what });
    }
    is($b->{status}, 201, "$what: retry status");
    is($b->{headers}{'idempotent-replayed'}, 'true', "$what: retry replays");
    is($b->{content}, $a->{content}, "$what: replay body identical");
    is($t->effects(key => $k), 1, "$what: one effect");
    return $k;
}

# Polls (up to ~5 s) until every Redis link is back: each idempotency_redis
# line has a link of its own, with its own reconnect backoff. Fresh keys on
# the locations that fail closed (not 503 any more), and on the fail-open one
# a retry that replays (it passes through unprotected while its link is down).
sub wait_store_back {
    my ($what) = @_;
    for my $loc ('/probe', '/unix/probe', '/db3/probe') {
        my $last;
        my $ok = $t->wait_for(sub {
            $last = $t->http(POST => $loc, key => $t->key('probe'), json => {});
            $last->{status} != 503;
        }, 5);
        ok($ok, "$what: $loc reconnects (a non-503 answer within ~5 s)")
            or diag($t->show($last));
        is($last->{status}, 201, "$what: $loc probe executes");
    }
    my $ok = $t->wait_for(sub {
        my $k = $t->key('probe');
        $t->http(POST => '/open/probe', key => $k, json => {});
        ($t->http(POST => '/open/probe', key => $k, json => {})->{headers}{'idempotent-replayed'} // '')
            eq 'true';
    }, 5);
    ok($ok, "$what: the fail-open location is protected again");
}

once_and_replay('/tcp', 'TCP, Redis up');
once_and_replay('/unix/x', 'unix socket');
{
    my $k = once_and_replay('/db3/x', 'db=3');
    my ($sel, $keys) = $t->redis_multi([ 'SELECT', 3 ], [ 'KEYS', 'idem:*' ]);
    ok(ref $keys && @$keys == 1, 'db=3: the record is in database 3') or diag(explain $keys);
}

# ---- Redis down
$t->stop_redis;
{
    my $k = $t->key('down');
    for my $n (1 .. 3) {
        my $r = $t->http(POST => '/tcp', key => $k, json => { a => 1 }, timeout => 10);
        $t->is_problem($r, 503, 'store-unavailable', key => $k, retry_after => 1,
            name => "Redis down, attempt $n -> 503 store-unavailable with Retry-After");
    }
    is($t->effects(key => $k), 0, 'Redis down, fail closed: no effect');

    my $u = $t->http(POST => '/unix/x', key => $k, json => { a => 1 });
    $t->is_problem($u, 503, 'store-unavailable', key => $k, retry_after => 1,
        name => 'Redis down (unix socket) -> 503');
    is($t->effects(key => $k), 0, 'Redis down, unix socket: no effect');

    my $g = $t->http(GET => '/tcp', key => $k);
    is($g->{status}, 201, 'Redis down: GET untouched');
    my $n = $t->http(POST => '/tcp-nokey', json => { a => 1 });
    is($n->{status}, 201, 'Redis down: POST without a key passes through');
    is($t->effects(uri => '/tcp-nokey'), 1, 'Redis down: the unkeyed POST is an effect');

    my $ko = $t->key('open');
    for my $i (1 .. 2) {
        my $o = $t->http(POST => '/open/x', key => $ko, json => { a => 1 });
        is($o->{status}, 201, "Redis down, fail open, attempt $i: passes through") or diag($t->show($o));
        ok(!exists $o->{headers}{'idempotent-replayed'}, "fail open, attempt $i: not a replay");
    }
    is($t->effects(key => $ko), 2, 'fail open: unprotected, every attempt is an effect');
    like($t->error_log, qr/\[warn\].*idempotency: redis unavailable, passing key "\Q$ko\E" through unprotected/,
        'fail open is logged at warn, naming the key');
}

# ---- Redis back on the same port
$t->start_redis;
wait_store_back('Redis started again');
once_and_replay('/tcp', 'after Redis came back');
once_and_replay('/unix/x', 'unix socket after Redis came back');
once_and_replay('/open/x', 'fail-open location with Redis up');

# ---- script cache flushed
is($t->redis('SCRIPT', 'FLUSH'), 'OK', 'SCRIPT FLUSH');
{
    my $k = once_and_replay('/tcp', 'after SCRIPT FLUSH (NOSCRIPT fallback)', 1);
    my @recs = $t->redis_keys('idem:*}:r');
    my $states = join ',', map { ($t->record_at($_) // {})->{state} // '?' } @recs;
    unlike($states, qr/in_progress|unknown/, 'after SCRIPT FLUSH: records were completed, not left in progress')
        or diag($states);
}
is($t->redis('SCRIPT', 'FLUSH'), 'OK', 'SCRIPT FLUSH again');
once_and_replay('/db3/x', 'db=3 after SCRIPT FLUSH', 1);

# ---- a real restart (empty data set, empty script cache)
$t->restart_redis;
wait_store_back('Redis restarted');
once_and_replay('/tcp', 'after a Redis restart');
once_and_replay('/unix/x', 'unix socket after a Redis restart');
once_and_replay('/db3/x', 'db=3 after a Redis restart');

# ---- Redis killed hard while nginx holds connections
kill 'KILL', $t->{redis_pid};
$t->stop_redis;
{
    my $k = $t->key('killed');
    my $r = $t->http(POST => '/tcp', key => $k, json => { a => 1 });
    $t->is_problem($r, 503, 'store-unavailable', key => $k, retry_after => 1, name => 'Redis killed -> 503');
    is($t->effects(key => $k), 0, 'Redis killed: no effect');
}
$t->start_redis;
wait_store_back('Redis after a hard kill');
once_and_replay('/tcp', 'after a hard kill');

$t->check_logs;
done_testing;
