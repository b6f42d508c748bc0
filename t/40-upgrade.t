#!/usr/bin/perl
# A rolling upgrade from layout 1 (a hash per record) to layout 2 (one
# string, docs/states.md "Upgrading from layout 1"). The old workers are
# played by the scripts of that version (t/data/layout1, as it sent them):
# they write layout-1 records while this module serves the same keys.
#
# - a completed layout-1 record replays, a changed request is refused;
# - a layout-1 claim in flight answers in-progress, a waiter is woken by
#   the old worker's completion and replays it;
# - a layout-1 claim whose lease lapsed turns unknown, never free, and the
#   admin endpoint resolves it;
# - the status endpoint shows each;
# - an old worker meeting a layout-2 record gets an error from Redis and
#   writes nothing: it can answer store-error, never execute a second time.
# The upstream effect count says what ran.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use Time::HiRes qw(sleep);
use Idem::Test;

my $t = Idem::Test->new;
$t->start_stack(<<'EOF');
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    location / {
        idempotency on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /wait/ {
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

sub old_script {
    my ($name, $key, @args) = @_;
    my $text = do {
        local (@ARGV, $/) = ("$FindBin::Bin/data/layout1/$name.lua");
        <>;
    } // die "t/data/layout1/$name.lua: $!";
    return $t->redis('EVAL', $text, 1, $key, @args);
}
sub json_of { my $j = eval { JSON::PP->new->decode($_[0]{content}) }; ref $j eq 'HASH' ? $j : {} }
sub token { join '', map { sprintf '%02x', int rand 256 } 1 .. 16 }
sub ns { join '', map { length($_) . ":$_," } @_ }

# The fingerprint this module computes for a request: learnt from a claim
# of another key with the same request (the key is not part of it).
sub fingerprint_of {
    my ($uri, $json) = @_;
    my $k = $t->key('probe');
    my $r = $t->http(POST => $uri, key => $k, json => $json);
    die "probe: $r->{status}" unless $r->{status} == 201;
    $t->wait_state($k, undef, 'completed') or die 'probe not completed';
    return $t->record($k)->{fp};
}

# An old worker claims $key for a request with fingerprint $fp.
sub old_claim {
    my ($key, $fp, %o) = @_;
    my $owner = token();
    my $op = token();
    my $r = old_script('claim', $t->record_name($key), $fp, $owner, $op,
        $o{lease_ms} // 60000, 86400, '0');
    is(ref $r && $r->[0], 'claimed', "old worker claims $key");
    return ($owner, $op);
}

my $BODY = '{"id":"made-by-the-old-version"}';
my $HDR = ns('Content-Type', 'application/json', 'X-Old', 'yes');

# ---- a completed layout-1 record
{
    my $uri = '/orders/completed';
    my $json = { order => 'old' };
    my $fp = fingerprint_of($uri, $json);
    my $base = $t->effects(uri => $uri);
    my $k = $t->key('v1done');
    my ($owner, $op) = old_claim($k, $fp);
    is(old_script('complete', $t->record_name($k), $owner, 201, $HDR, $BODY, '1', 86400), 1,
        'old worker completes it');
    is($t->redis('TYPE', $t->record_name($k)), 'hash', 'the record is a layout-1 hash');

    my $r = $t->http(POST => $uri, key => $k, json => $json);
    is($r->{status}, 201, 'completed layout 1: a retry gets the stored status') or diag($t->show($r));
    is($r->{headers}{'idempotent-replayed'}, 'true', 'completed layout 1: replayed');
    is($r->{content}, $BODY, 'completed layout 1: the stored body');
    is($r->{headers}{'x-old'}, 'yes', 'completed layout 1: the stored header');
    is($r->{headers}{'idempotency-operation'} // $op, $op, 'completed layout 1: its operation id');

    my $m = $t->http(POST => $uri, key => $k, json => { order => 'changed' });
    $t->is_problem($m, 409, 'fingerprint-mismatch', key => $k,
        name => 'completed layout 1: a changed request is refused');

    my $s = $t->http(GET => '/status', key => $k);
    is($s->{status}, 200, 'completed layout 1: the status endpoint answers') or diag($t->show($s));
    my $j = json_of($s);
    is($j->{state}, 'completed', 'status endpoint: completed');
    is($j->{operation_id}, $op, 'status endpoint: the operation id');
    is($j->{response_status}, 201, 'status endpoint: the stored status');
    is($t->effects(uri => $uri), $base, 'completed layout 1: nothing executed here');
    is($t->redis('TYPE', $t->record_name($k)), 'hash', 'completed layout 1: left as it was');
}

# ---- a layout-1 claim in flight; a waiter; the old worker completes it
{
    my $uri = '/wait/in-flight';
    my $json = { order => 'in flight' };
    my $fp = fingerprint_of($uri, $json);
    my $base = $t->effects(uri => $uri);
    my $k = $t->key('v1flight');
    my ($owner, $op) = old_claim($k, $fp);

    my $plain = $t->http(POST => '/orders/in-flight', key => $k, json => $json);
    # another route is another request: the record's fingerprint differs
    $t->is_problem($plain, 409, 'fingerprint-mismatch', key => $k,
        name => 'in flight: another route with the same key is refused');

    my $bg = $t->http_bg(POST => $uri, key => $k, json => $json, timeout => 10);
    ok($t->wait_for(sub { ($t->redis('HGET', $t->record_name($k), 'waiters') // '') eq '1' }, 5),
        'in flight: the waiter marked the layout-1 record');
    my $s = json_of($t->http(GET => '/status', key => $k));
    is($s->{state}, 'in_progress', 'in flight: the status endpoint says in_progress');
    is(old_script('renew', $t->record_name($k), $owner, 60000), 1, 'the old worker still renews its lease');
    is(old_script('complete', $t->record_name($k), $owner, 201, $HDR, $BODY, '1', 86400), 1,
        'the old worker completes, and announces it');
    my $w = $bg->result(10);
    is($w && $w->{status}, 201, 'in flight: the waiter gets the stored status') or diag($t->show($w // {}));
    is($w && $w->{headers}{'idempotent-replayed'}, 'true', 'in flight: as a replay');
    is($w && $w->{content}, $BODY, 'in flight: of the old worker\'s body');
    is($t->effects(uri => $uri), $base, 'in flight: nothing executed here');
}

# ---- a layout-1 claim in flight, no waiting: in-progress with Retry-After
{
    my $uri = '/orders/busy';
    my $json = { order => 'busy' };
    my $fp = fingerprint_of($uri, $json);
    my $base = $t->effects(uri => $uri);
    my $k = $t->key('v1busy');
    old_claim($k, $fp);
    my $r = $t->http(POST => $uri, key => $k, json => $json);
    $t->is_problem($r, 409, 'in-progress', key => $k, retry_after => 1,
        name => 'layout-1 claim in flight: 409 in-progress');
    is($t->effects(uri => $uri), $base, 'layout-1 claim in flight: nothing executed');
}

# ---- a layout-1 claim whose old worker died: unknown, then resolved
{
    my $uri = '/orders/lapsed';
    my $json = { order => 'lapsed' };
    my $fp = fingerprint_of($uri, $json);
    my $base = $t->effects(uri => $uri);
    my $k = $t->key('v1lapsed');
    old_claim($k, $fp, lease_ms => 1);
    sleep 0.05;
    my $r = $t->http(POST => $uri, key => $k, json => $json);
    $t->is_problem($r, 409, 'outcome-unknown', key => $k,
        name => 'lapsed layout-1 claim: 409 outcome-unknown, never free');
    is($t->redis('HGET', $t->record_name($k), 'state'), 'unknown', 'the layout-1 record is now unknown');
    my $again = $t->http(POST => $uri, key => $k, json => $json);
    $t->is_problem($again, 409, 'outcome-unknown', key => $k, name => 'and stays unknown');
    is(json_of($t->http(GET => '/status', key => $k))->{state}, 'unknown', 'status endpoint: unknown');
    is($t->effects(uri => $uri), $base, 'lapsed layout-1 claim: nothing executed');

    my $rel = $t->http(POST => '/admin?action=release', key => $k);
    is($rel->{status}, 200, 'the admin endpoint releases the layout-1 record') or diag($t->show($rel));
    my $x = $t->http(POST => $uri, key => $k, json => $json);
    is($x->{status}, 201, 'after the release a retry executes');
    my $y = $t->http(POST => $uri, key => $k, json => $json);
    is($y->{headers}{'idempotent-replayed'}, 'true', 'and its retry replays');
    is($t->effects(uri => $uri), $base + 1, 'once');
    is($t->redis('TYPE', $t->record_name($k)), 'string', 'the new record is of layout 2');
}

# ---- an old worker that failed its request: unknown; the admin completes it
{
    my $uri = '/orders/failed';
    my $json = { order => 'failed' };
    my $fp = fingerprint_of($uri, $json);
    my $base = $t->effects(uri => $uri);
    my $k = $t->key('v1failed');
    my ($owner) = old_claim($k, $fp);
    is(old_script('fail', $t->record_name($k), $owner), 1, 'old worker marks it unknown');
    my $r = $t->http(POST => $uri, key => $k, json => $json);
    $t->is_problem($r, 409, 'outcome-unknown', key => $k, name => 'failed layout 1: 409 outcome-unknown');
    my $c = $t->http(POST => '/admin?action=complete&status=201', key => $k);
    is($c->{status}, 200, 'the admin endpoint completes the layout-1 record') or diag($t->show($c));
    my $after = $t->http(POST => $uri, key => $k, json => $json);
    is($after->{status}, 201, 'resolved: the retry gets the operator\'s status');
    is($t->effects(uri => $uri), $base, 'failed layout 1: nothing executed here');
}

# ---- the other direction: an old worker meets records of layout 2
{
    my $uri = '/orders/new';
    my $json = { order => 'new' };
    my $fp = fingerprint_of($uri, $json);
    my $base = $t->effects(uri => $uri);
    my $k = $t->key('v2');
    my $r = $t->http(POST => $uri, key => $k, json => $json);
    is($r->{status}, 201, 'this version executes a new key');
    ok($t->wait_state($k, undef, 'completed'), 'and completes it');
    my $name = $t->record_name($k);
    my $before = $t->redis('GET', $name);
    my $c = old_script('claim', $name, $fp, token(), token(), 60000, 86400, '0');
    ok($t->is_redis_error($c), 'an old worker\'s claim on a layout-2 record is an error reply')
        or diag(explain $c);
    is($t->redis('GET', $name), $before, 'and writes nothing');
    for my $s ([ complete => token(), 200, '', 'x', '1', 60 ], [ fail => token() ],
               [ release => token() ], [ renew => token(), 60000 ]) {
        my ($script, @args) = @$s;
        my $x = old_script($script, $name, @args);
        ok($t->is_redis_error($x) || (!ref $x && $x eq '0'),
            "an old worker's $script on a layout-2 record changes nothing (error or 0)");
        is($t->redis('GET', $name), $before, "old $script: the record is as it was");
    }
    is($t->effects(uri => $uri), $base + 1, 'layout 2: one effect');
}

$t->check_logs;
done_testing;
