#!/usr/bin/perl
# Records outlive the processes: nginx restarted, Redis restarted (appendonly),
# both, a reload or a graceful stop while a request is in flight: the retry
# gets the replay (or the same unknown answer), never a second execution.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $t = Idem::Test->new;
$t->start_redis(appendonly => 1);
$t->start_upstream;
my $conf = <<'EOF';
server {
    listen 127.0.0.1:%%PORT%%;
    location / {
        idempotency on;
        idempotency_redis %%REDIS%% connect_timeout=300ms timeout=500ms;
        idempotency_scope $http_authorization;
        proxy_ignore_client_abort on;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF
$t->start_nginx($conf, workers => 2);

my $AUTH = "Bearer restarts-$$";

sub produced { my @r = $t->upstream_responses(key => $_[0]); $r[-1] }

# The answer once the store is reachable again (503 store-unavailable, while
# the worker reconnects, is retried for up to 8 s).
sub post {
    my (@req) = @_;
    my $r;
    $t->wait_for(sub {
        $r = $t->http(POST => '/orders', @req, timeout => 5);
        !($r->{status} == 503 && $t->ptype($r) eq 'store-unavailable');
    }, 8);
    return $r;
}

sub is_replay {
    my ($r, $k, $what) = @_;
    is($r->{status}, 201, "$what: 201") or diag($t->show($r));
    is($r->{headers}{'idempotent-replayed'}, 'true', "$what: replayed");
    is($t->sha256($r->{content}), (produced($k) // {})->{sha}, "$what: the body the upstream produced");
    is($t->effects(key => $k), 1, "$what: one effect");
}

my $k = $t->key('restart');
my @req = (key => $k, json => { order => 'survives' }, headers => [ Authorization => $AUTH ]);
my $first = $t->http(POST => '/orders', @req);
is($first->{status}, 201, 'first attempt executes');
is($t->effects(key => $k), 1, 'one effect');

# an unknown record survives too
my $ku = $t->key('restart-unknown');
my @requ = (key => $ku, json => { order => 'lost' }, headers => [ Authorization => $AUTH ]);
my $u = $t->http(POST => '/orders', @requ, headers => [ Authorization => $AUTH, 'X-Drop' => 1 ]);
is($u->{status}, 502, 'dropped attempt: 502');
ok($t->wait_state($ku, $AUTH, 'unknown'),
    'dropped attempt: record unknown');

# ---- nginx restarted
ok($t->restart_nginx, 'nginx stopped and started again');
is_replay(post(@req), $k, 'after an nginx restart');

# ---- Redis restarted (appendonly)
$t->restart_redis;
ok($t->record($k, $AUTH), 'the record is back after the Redis restart (AOF)');
is_replay(post(@req), $k, 'after a Redis restart');

# ---- both
$t->stop_nginx;
$t->restart_redis;
$t->start_nginx($conf, workers => 2);
is_replay(post(@req), $k, 'after restarting Redis and nginx');
my $ru = post(@requ);
$t->is_problem($ru, 409, 'outcome-unknown', key => $ku, state => 'unknown',
    name => 'the unknown record is still unknown after both restarts');
is($t->effects(key => $ku), 1, 'unknown record: one effect');

# ---- the client times out; nginx is restarted (graceful: the request
#      finishes and is recorded) and Redis is restarted before the retry
{
    my $k2 = $t->key('restart-lost');
    my @r2 = (key => $k2, json => { order => 'lost then restarts' }, headers => [ Authorization => $AUTH ]);
    my $a = $t->http(POST => '/orders', @r2, headers => [ Authorization => $AUTH, 'X-Delay' => 1 ], timeout => 0.3);
    is($a->{status}, 599, 'first attempt: the client timed out');
    ok($t->restart_nginx, 'nginx restarted (graceful stop waits for the request)');
    $t->restart_redis;
    is_replay(post(@r2), $k2, 'lost response, nginx and Redis restarted, retry');
}

# ---- a reload while a request is in flight: the old worker completes it
{
    my $k3 = $t->key('reload');
    my @r3 = (key => $k3, json => { order => 'across a reload' }, headers => [ Authorization => $AUTH ]);
    my $bg = $t->http_bg(POST => '/orders', @r3, headers => [ Authorization => $AUTH, 'X-Delay' => 1.5 ], timeout => 10);
    ok($t->wait_for(sub { $t->effects(key => $k3) == 1 }, 5), 'reload: the request reached the upstream');
    my $mid = $t->http(POST => '/orders', @r3);
    $t->is_problem($mid, 409, 'in-progress', name => 'reload: duplicate before the reload -> in-progress');
    ok($t->reload_nginx, 'nginx reloaded (HUP) while the request runs');
    my $r = $bg->result(10);
    is($r && $r->{status}, 201, 'the in-flight request completes on the old worker');
    is_replay(post(@r3), $k3, 'after the reload');
}

$t->check_logs;
done_testing;
