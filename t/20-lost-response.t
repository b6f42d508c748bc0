#!/usr/bin/perl
# The client gives up before the answer arrives (its timeout, a dropped
# connection): the upstream's response is still read and recorded
# (proxy_ignore_client_abort on), so the retry with the same key gets the
# replay and the upstream runs once. Without proxy_ignore_client_abort the
# outcome cannot be recorded: the record becomes unknown (and a warning is
# logged), never free.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $t = Idem::Test->new;
$t->start_stack(<<'EOF');
server {
    listen 127.0.0.1:%%PORT%%;
    location / {
        idempotency on;
        idempotency_redis %%REDIS%%;
        proxy_ignore_client_abort on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /noignore/ {
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

sub sleep_until { my $d = $_[0] - time; sleep $d if $d > 0 }

# The answer the upstream produced for $key (its responses.log entry).
sub produced {
    my ($key) = @_;
    my @r = $t->upstream_responses(key => $key);
    return $r[-1];
}

# ---- lost response: client times out at 300 ms, upstream answers at 1.5 s,
#      the retry at 2.5 s gets the replay
{
    my $k = $t->key('lost');
    my @req = (key => $k, json => { order => 'o-1', amount => 42 });
    my $t0 = time;
    my $r1 = $t->http(POST => '/orders', @req, headers => [ 'X-Delay' => 1.5 ], timeout => 0.3);
    is($r1->{status}, 599, 'first attempt: the client gave up before any answer')
        or diag($t->show($r1));
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 3), 'the upstream received the request');

    sleep_until($t0 + 2.5);
    my $r2 = $t->http(POST => '/orders', @req);
    is($r2->{status}, 201, 'retry at 2.5 s: the upstream status') or diag($t->show($r2));
    is($r2->{headers}{'idempotent-replayed'}, 'true', 'retry at 2.5 s is a replay');
    my $p = produced($k);
    ok($p, 'the upstream logged the answer it produced');
    is($t->sha256($r2->{content}), $p && $p->{sha}, 'replayed body = the body the upstream produced');
    is($r2->{headers}{'x-upstream-seq'}, $p && $p->{n}, 'replayed X-Upstream-Seq = that effect');
    is($t->effects(key => $k), 1, 'lost response: exactly one effect');
    my $rec = $t->record($k);
    is($rec && $rec->{state}, 'completed', 'record completed in Redis');

    my $r3 = $t->http(POST => '/orders', @req);
    is($r3->{headers}{'idempotent-replayed'}, 'true', 'a further retry replays too');
    is($r3->{content}, $r2->{content}, 'same body again');
    is($t->effects(key => $k), 1, 'still one effect');
}

# ---- the client drops the connection itself (no timeout): same outcome
{
    my $k = $t->key('drop');
    my @req = (key => $k, json => { order => 'o-2' });
    my $c = $t->conn;
    $c->send($t->request_bytes(POST => '/orders', @req, headers => [ 'X-Delay' => 1 ]));
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 3), 'request reached the upstream');
    $c->close;
    # the record completes once the upstream has answered
    my $rec;
    $t->wait_for(sub { $rec = $t->record($k); $rec && $rec->{state} ne 'in_progress' }, 5);
    is($rec && $rec->{state}, 'completed', 'client closed mid-request: record completed');
    my $r = $t->http(POST => '/orders', @req);
    is($r->{status}, 201, 'retry gets the upstream status');
    is($r->{headers}{'idempotent-replayed'}, 'true', 'retry is a replay');
    is($t->sha256($r->{content}), (produced($k) // {})->{sha}, 'replay = produced body');
    is($t->effects(key => $k), 1, 'client close: one effect');
}

# ---- an impatient client: retries while the first attempt is still running
#      (in-progress), then after it completed (replay)
{
    my $k = $t->key('impatient');
    my @req = (key => $k, json => { order => 'o-3' });
    my $t0 = time;
    my $r1 = $t->http(POST => '/orders', @req, headers => [ 'X-Delay' => 1.5 ], timeout => 0.3);
    is($r1->{status}, 599, 'first attempt timed out at the client');
    my $r2 = $t->http(POST => '/orders', @req);
    $t->is_problem($r2, 409, 'in-progress', key => $k, state => 'in_progress',
        operation_id => 1, retry_after => 1, name => 'retry while in flight -> 409 in-progress');
    my $s = $t->http(GET => '/status', key => $k);
    my $sj = eval { JSON::PP->new->decode($s->{content}) } // {};
    is($sj->{state}, 'in_progress', 'status endpoint: in_progress while the upstream works');
    sleep_until($t0 + 2.5);
    my $r3 = $t->http(POST => '/orders', @req);
    is($r3->{status}, 201, 'retry after completion');
    is($r3->{headers}{'idempotent-replayed'}, 'true', 'retry after completion replays');
    is($t->sha256($r3->{content}), (produced($k) // {})->{sha}, 'replay = produced body');
    is($t->effects(key => $k), 1, 'impatient client: one effect');
}

# ---- without proxy_ignore_client_abort: the outcome is lost -> unknown
{
    my $k = $t->key('noignore');
    my @req = (key => $k, json => { order => 'o-4' });
    my $t0 = time;
    my $r1 = $t->http(POST => '/noignore/orders', @req, headers => [ 'X-Delay' => 1.5 ], timeout => 0.3);
    is($r1->{status}, 599, 'first attempt timed out at the client');
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 3), 'request reached the upstream');
    sleep_until($t0 + 2.5);
    my $r2 = $t->http(POST => '/noignore/orders', @req);
    $t->is_problem($r2, 409, 'outcome-unknown', key => $k, state => 'unknown',
        operation_id => 1, retry_after => 0,
        name => 'client abort without proxy_ignore_client_abort -> retry gets 409 outcome-unknown');
    my $r3 = $t->http(POST => '/noignore/orders', @req);
    $t->is_problem($r3, 409, 'outcome-unknown', key => $k, name => 'and again (never re-executed)');
    is($t->effects(key => $k), 1, 'no ignore_client_abort: one effect, never executed again');
    my $rec = $t->record($k);
    is($rec && $rec->{state}, 'unknown', 'record unknown in Redis');
    like($t->error_log,
        qr/\[warn\].*idempotency: no complete response for key "\Q$k\E", outcome unknown \(the client went away first; "proxy_ignore_client_abort on"/,
        'a warning about the client abort, naming the key and the remedy, is logged');
}

$t->check_logs;
done_testing;
