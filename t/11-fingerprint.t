#!/usr/bin/perl
# The fingerprint: JSON bodies compare by value (member order and whitespace
# do not matter), anything else by bytes; a key reused for a different
# request is refused with 409 (or 422) and never executes.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
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
    location /draft/ {
        idempotency on;
        idempotency_conflict_status 422;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

sub post {
    my ($path, $key, $body, $ct) = @_;
    return $t->http(POST => $path, key => $key, body => $body,
        headers => [ 'Content-Type' => $ct // 'application/json' ]);
}

# ---- JSON: member order and whitespace do not matter
{
    my $k = $t->key('fp');
    my $a = post('/orders', $k, '{"customer":"c-1","items":[{"sku":"A","qty":2},{"sku":"B","qty":1}],"total":12.5}');
    is($a->{status}, 201, 'JSON body executes') or diag($t->show($a));
    my $b = post('/orders', $k, qq({\n  "total" : 12.50,\n\t"items": [ {"qty":2, "sku":"A"}, {"qty":1,"sku":"B"} ],\n  "customer":"c-1"\n}\n));
    is($b->{status}, 201, 'reordered, re-spaced JSON: same status');
    is($b->{headers}{'idempotent-replayed'}, 'true', 'reordered, re-spaced JSON replays');
    is($b->{content}, $a->{content}, 'replayed body identical');
    is($t->effects(key => $k), 1, 'reordered JSON: one effect');

    # ---- a changed body is a conflict, whatever was stored
    my $c = post('/orders', $k, '{"customer":"c-1","items":[{"sku":"A","qty":2},{"sku":"B","qty":1}],"total":13}');
    $t->is_problem($c, 409, 'fingerprint-mismatch', key => $k, state => 'completed',
        operation_id => 1, name => 'changed JSON value -> 409 fingerprint-mismatch');
    unlike($c->{content}, qr/body_sha256|things/, 'conflict does not echo the stored response');
    is($t->effects(key => $k), 1, 'conflict: still one effect');

    # array order matters
    my $d = post('/orders', $k, '{"customer":"c-1","items":[{"sku":"B","qty":1},{"sku":"A","qty":2}],"total":12.5}');
    $t->is_problem($d, 409, 'fingerprint-mismatch', key => $k, name => 'reordered array -> conflict');
    is($t->effects(key => $k), 1, 'reordered array: still one effect');

    # the original still replays after conflicts
    my $e = post('/orders', $k, '{"total":12.5,"customer":"c-1","items":[{"sku":"A","qty":2},{"sku":"B","qty":1}]}');
    is($e->{headers}{'idempotent-replayed'}, 'true', 'original request still replays after conflicts');
    is($e->{content}, $a->{content}, 'and gets the original body');
    is($t->effects(key => $k), 1, 'one effect in total');

    # the problem's operation_id is the one of the stored record
    my $p = $t->problem($c) // {};
    my $p2 = $t->problem($d) // {};
    ok(defined $p->{operation_id} && defined $p2->{operation_id}
        && $p->{operation_id} eq $p2->{operation_id}, 'conflicts name the same operation');
}

# ---- a conflict while the first attempt is still running is a conflict too
{
    my $k = $t->key('fp');
    my $slow = $t->parallel(2, sub {
        my $i = shift;
        if ($i == 0) {
            return $t->http(POST => '/orders', key => $k, json => { n => 1 },
                headers => [ 'X-Delay' => 1.5 ]);
        }
        sleep 0.7;
        return $t->http(POST => '/orders', key => $k, json => { n => 2 });
    });
    is($slow->[0]{status}, 201, 'slow first attempt completes');
    $t->is_problem($slow->[1], 409, 'fingerprint-mismatch', key => $k, state => 'in_progress',
        name => 'different body while in flight -> fingerprint-mismatch (not in-progress)');
    is($t->effects(key => $k), 1, 'in-flight conflict: one effect');
}

# ---- media types: +json and parameters are JSON, text/plain is bytes
{
    my $k = $t->key('fp');
    post('/orders', $k, '{"a":1,"b":[1,2]}', 'application/merge-patch+json');
    my $r = post('/orders', $k, '{ "b":[1,2], "a":1 }', 'application/merge-patch+json');
    is($r->{headers}{'idempotent-replayed'}, 'true', '*+json body compared as JSON');
    is($t->effects(key => $k), 1, '*+json: one effect');

    $k = $t->key('fp');
    post('/orders', $k, '{"a":1,"b":2}', 'application/json; charset=utf-8');
    $r = post('/orders', $k, '{"b":2,"a":1}', 'application/json; charset=utf-8');
    is($r->{headers}{'idempotent-replayed'}, 'true', 'application/json with parameters compared as JSON');
    is($t->effects(key => $k), 1, 'JSON with charset: one effect');

    $k = $t->key('fp');
    post('/orders', $k, '{"a":1,"b":2}', 'text/plain');
    $r = post('/orders', $k, '{"a":1,"b":2}', 'text/plain');
    is($r->{headers}{'idempotent-replayed'}, 'true', 'identical text body replays');
    $r = post('/orders', $k, '{"b":2,"a":1}', 'text/plain');
    $t->is_problem($r, 409, 'fingerprint-mismatch', key => $k,
        name => 'text/plain hashed raw: reordered JSON text is a different body');
    is($t->effects(key => $k), 1, 'text/plain: one effect');
}

# ---- JSON that RFC 8785 cannot canonicalize is hashed raw, never altered
for my $case (
    [ 'duplicate member names', '{"a":1,"a":2}', '{"a":1, "a":2}' ],
    [ 'invalid JSON', '{"a":1,', '{"a":1 ,' ],
    [ 'trailing garbage', '{"a":1} x', '{"a":1}  x' ],
    [ 'lone surrogate', '{"a":"\ud800"}', '{ "a":"\ud800"}' ],
    [ 'NUL escape', '{"a":"x\u0000y"}', '{"a": "x\u0000y"}' ],
    [ 'number overflowing a double', '{"a":1e400}', '{"a": 1e400}' ],
) {
    my ($what, $body, $variant) = @$case;
    my $k = $t->key('fp');
    my $a = post('/orders', $k, $body);
    is($a->{status}, 201, "$what: executes") or diag($t->show($a));
    my $b = post('/orders', $k, $body);
    is($b->{headers}{'idempotent-replayed'}, 'true', "$what: identical bytes replay");
    my $c = post('/orders', $k, $variant);
    $t->is_problem($c, 409, 'fingerprint-mismatch', key => $k,
        name => "$what: hashed as raw bytes, whitespace change is a conflict");
    is($t->effects(key => $k), 1, "$what: one effect");
}

# ---- query string and method are part of the fingerprint
{
    my $k = $t->key('fp');
    my $a = $t->http(POST => '/orders?dry_run=0', key => $k, json => { x => 1 });
    is($a->{status}, 201, 'with query: executes');
    my $b = $t->http(POST => '/orders?dry_run=1', key => $k, json => { x => 1 });
    $t->is_problem($b, 409, 'fingerprint-mismatch', key => $k, name => 'other query -> conflict');
    my $c = $t->http(PATCH => '/orders?dry_run=0', key => $k, json => { x => 1 });
    $t->is_problem($c, 409, 'fingerprint-mismatch', key => $k, name => 'other method -> conflict');
    my $d = $t->http(POST => '/orders?dry_run=0', key => $k, json => { x => 1 });
    is($d->{headers}{'idempotent-replayed'}, 'true', 'same query replays');
    is($t->effects(key => $k), 1, 'query/method: one effect');
}

# ---- idempotency_conflict_status 422
{
    my $k = $t->key('fp');
    my $a = $t->http(POST => '/draft/orders', key => $k, json => { x => 1 });
    is($a->{status}, 201, '422 location: executes');
    my $b = $t->http(POST => '/draft/orders', key => $k, json => { x => 2 });
    $t->is_problem($b, 422, 'fingerprint-mismatch', key => $k, state => 'completed',
        operation_id => 1, name => 'idempotency_conflict_status 422 -> 422');
    my $c = $t->http(POST => '/draft/orders', key => $k, json => { x => 1 });
    is($c->{headers}{'idempotent-replayed'}, 'true', '422 location: original replays');
    is($t->effects(key => $k), 1, '422 location: one effect');
}

$t->check_logs;
done_testing;
