#!/usr/bin/perl
# The Redis link's own limits: connect_timeout bounds the whole set-up of a
# connection (TCP, AUTH, SELECT, SCRIPT LOAD), so a server that accepts and
# never answers costs a request connect_timeout, not the command timeout;
# and an operations answer that cannot be sent (the client went away) ends
# the request, without a second answer or a complaint about Redis.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Socket qw(SOL_SOCKET SO_LINGER);
use Test::More;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $t = Idem::Test->new;
$t->start_redis;
$t->start_upstream;
my $silent = $t->start_silent_server;
$t->start_nginx(<<"EOF");
server {
    listen 127.0.0.1:%%PORT%%;
    location /silent/ {
        idempotency on;
        # a command timeout far beyond the client's patience: only the
        # set-up bound can answer in time
        idempotency_redis 127.0.0.1:$silent connect_timeout=300ms timeout=120s;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /silent-auth/ {
        idempotency on;
        idempotency_redis 127.0.0.1:$silent password=secret db=2
                          connect_timeout=300ms timeout=120s;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /api/ {
        idempotency on;
        idempotency_redis %%REDIS%%;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /status {
        idempotency_redis %%REDIS%%;
        idempotency_status;
    }
}
EOF

# ---- a silent server: every request is answered 503 by the set-up bound
for my $path ('/silent/a', '/silent-auth/a') {
    for my $n (1 .. 3) {
        my $k = $t->key('silent');
        my $r = $t->http(POST => $path, key => $k, json => { n => $n }, timeout => 20);
        $t->is_problem($r, 503, 'store-unavailable', key => $k, retry_after => 1,
            operation_id => 0, name => "$path request $n: 503 store-unavailable, not a client timeout");
        is($t->effects(key => $k), 0, "$path request $n: nothing executed");
    }
}
like($t->error_log, qr/connect to redis 127\.0\.0\.1:$silent timed out/,
    'the set-up of the silent link timed out (connect_timeout), and error.log says so');
unlike($t->error_log, qr/redis 127\.0\.0\.1:$silent command timed out/,
    'no command waited for its own timeout');

# ---- the real Redis beside it still works
{
    my $k = $t->key('api');
    my $r = $t->http(POST => '/api/x', key => $k, json => { a => 1 });
    is($r->{status}, 201, 'a healthy Redis beside it: executes');
    is($t->effects(key => $k), 1, 'one effect');
}

# ---- a status answer to a client that is gone
# Redis is paused, so the status script's answer comes after the client has
# reset its connection: sending it fails, and that is the request's end.
{
    my $k = $t->key('gone');
    $t->http(POST => '/api/x', key => $k, json => { a => 2 });
    my $before = $t->error_log;
    for my $n (1 .. 3) {
        $t->redis_pause(600);
        my $c = $t->conn;
        $c->send($t->request_bytes(GET => '/status', key => $k));
        sleep 0.2;
        setsockopt($c->{sock}, SOL_SOCKET, SO_LINGER, pack('ii', 1, 0));
        $c->close;     # RST: every write to it fails
        sleep 0.8;
    }
    my $r = $t->http(GET => '/status', key => $k);
    is($r->{status}, 200, 'the status endpoint still answers afterwards');
    my $new = substr($t->error_log, length $before);
    unlike($new, qr/unexpected reply from redis/,
        'a failed send is not logged as an unexpected reply from Redis');
    unlike($new, qr/header already sent|\[alert\]/, 'no second answer after the first was sent');
}

$t->check_logs;
done_testing;
