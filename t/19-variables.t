#!/usr/bin/perl
# Variables for log_format: $idempotency_outcome, $idempotency_key,
# $idempotency_fingerprint, $idempotency_operation_id, $idempotency_body_form;
# the fingerprint is the public definition of docs/fingerprint.md, recomputed here.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Digest::SHA qw(sha256_hex);
use JSON::PP;
use Test::More;
use Idem::Test;

my $t = Idem::Test->new;
$t->start_stack(<<'EOF', log_format => 'V|$idempotency_outcome|$idempotency_key|$idempotency_fingerprint|$idempotency_operation_id|$idempotency_body_form|$request_method|$request_uri|$status');
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    location /v/ {
        idempotency on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /scoped/ {
        idempotency on;
        idempotency_scope $http_x_account;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /hdr/ {
        idempotency on;
        idempotency_fingerprint_headers X-Tenant Accept-Language;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /open/ {
        idempotency on;
        idempotency_redis 127.0.0.1:1;
        idempotency_store_failure open;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

my $JCS = JSON::PP->new->canonical->utf8;

# docs/fingerprint.md for bodies whose canonical form JSON::PP already writes as RFC
# 8785 does (ASCII member names, integers, strings).
sub fingerprint {
    my (%o) = @_;
    return sha256_hex($JCS->encode({
        v => 1, method => $o{method}, route => $o{route}, query => $o{query} // '',
        scope => $o{scope} // '', headers => $o{headers} // {}, body => $o{body},
    }));
}

my $n_logged = 0;
sub logged {
    my ($what) = @_;
    $n_logged++;
    my @l = grep { /^V\|/ } $t->access_log;
    $t->wait_for(sub { @l = grep { /^V\|/ } $t->access_log; @l >= $n_logged }, 5);
    my $l = $l[$n_logged - 1] // '';
    my @f = split /\|/, $l, -1;
    my %r;
    @r{qw(tag outcome key fp op form method uri status)} = @f;
    $r{line} = $l;
    ok(@f == 9, "$what: access log line") or diag("line: $l");
    return \%r;
}

my $hex64 = qr/^[0-9a-f]{64}$/;
my $hex32 = qr/^[0-9a-f]{32}$/;

# ---- executed, replayed, conflict
my $k = $t->key('var');
my $doc = { b => 2, a => [ 1, 'x', { z => 'q', y => undef } ], c => 'caf' };
my $a = $t->http(POST => '/v/orders?x=1&y=2', key => $k,
    json => '{"c":"caf", "a":[1,"x",{"z":"q","y":null}], "b":2}');
is($a->{status}, 201, 'executes');
my $la = logged('executed');
is($la->{outcome}, 'executed', 'first request: outcome executed');
is($la->{key}, $k, 'first request: $idempotency_key');
like($la->{fp}, $hex64, 'first request: fingerprint is 64 lowercase hex');
like($la->{op}, $hex32, 'first request: operation id is 32 lowercase hex');
is($la->{form}, 'json', 'first request: body form json');
is($la->{fp}, fingerprint(method => 'POST', route => '/v/orders', query => 'x=1&y=2', body => $doc),
    'fingerprint = sha256(JCS({v,method,route,query,scope,headers,body})) of docs/fingerprint.md');

my $b = $t->http(POST => '/v/orders?x=1&y=2', key => $k, json => '{"a":[1,"x",{"y":null,"z":"q"}],"b":2,"c":"caf"}');
is($b->{headers}{'idempotent-replayed'}, 'true', 'retry replays');
my $lb = logged('replayed');
is($lb->{outcome}, 'replayed', 'retry: outcome replayed');
is($lb->{key}, $k, 'retry: same key');
is($lb->{fp}, $la->{fp}, 'retry: same fingerprint');
is($lb->{op}, $la->{op}, 'retry: same operation id');

my $c = $t->http(POST => '/v/orders?x=1&y=2', key => $k, json => { a => 1 });
is($c->{status}, 409, 'changed body conflicts');
my $lc = logged('conflict');
is($lc->{outcome}, 'conflict', 'changed body: outcome conflict');
like($lc->{fp}, $hex64, 'conflict: fingerprint logged');
isnt($lc->{fp}, $la->{fp}, 'conflict: a different fingerprint');
is($lc->{fp}, fingerprint(method => 'POST', route => '/v/orders', query => 'x=1&y=2', body => { a => 1 }),
    'conflict: fingerprint of the refused request');
my $cp = $t->problem($c) // {};
is($lc->{op}, $cp->{operation_id} // 'none', 'conflict: operation id is the one the problem names');
is($cp->{operation_id}, $la->{op}, 'conflict names the original operation');
is($t->effects(key => $k), 1, 'executed/replayed/conflict: one effect');

# ---- bypassed, untouched, rejected
$t->http(POST => '/v/nokey', json => {});
my $ln = logged('no key');
is($ln->{outcome}, 'bypassed', 'no key: outcome bypassed');
is($ln->{key}, '-', 'no key: $idempotency_key empty');

$t->http(GET => '/v/get', key => $t->key('var'));
my $lg = logged('GET');
is($lg->{outcome}, '-', 'GET: outcome empty (module did not look at it)');
is($lg->{fp}, '-', 'GET: no fingerprint');

my $bad = $t->http(POST => '/v/bad', key => 'a' x 256, json => {});
is($bad->{status}, 400, 'malformed key: 400');
my $lr = logged('malformed');
is($lr->{outcome}, 'rejected', 'malformed key: outcome rejected');

my $ko = $t->key('var');
my $o = $t->http(POST => '/open/x', key => $ko, json => {});
is($o->{status}, 201, 'fail open passes through');
my $lo = logged('fail open');
is($lo->{outcome}, 'bypassed', 'fail open: outcome bypassed');

# ---- quoted key: the parsed key is logged
my $kq = $t->key('var');
$t->http(POST => '/v/q', key => qq("$kq"), json => {});
my $lq = logged('quoted key');
is($lq->{key}, $kq, 'quoted key: $idempotency_key is the unquoted key');
is($lq->{outcome}, 'executed', 'quoted key: executed');

# ---- in flight
{
    my $ki = $t->key('var');
    my $res = $t->parallel(2, sub {
        my $i = shift;
        sleep 0.6 if $i;
        my $r = $t->http(POST => '/v/slow', key => $ki, json => {}, headers => [ 'X-Delay' => 1.5 ]);
        return { s => $r->{status} };
    });
    is(join(',', map { $_ && $_->{s} } @$res), '201,409', 'slow request and a concurrent retry');
    my @two = (logged('in flight 1'), logged('in flight 2'));
    is(join(',', sort map { $_->{outcome} } @two), 'executed,in_progress', 'concurrent retry: outcome in_progress');
    is($two[0]{op}, $two[1]{op}, 'in flight: same operation id');
    is($t->effects(key => $ki), 1, 'in flight: one effect');
}

# ---- body forms
{
    my $kr = $t->key('var');
    $t->http(POST => '/v/raw', key => $kr, body => "plain text\n", headers => [ 'Content-Type' => 'text/plain' ]);
    my $l = logged('text/plain');
    is($l->{form}, 'raw', 'text/plain: body form raw');
    is($l->{fp}, fingerprint(method => 'POST', route => '/v/raw', body => { sha256 => sha256_hex("plain text\n") }),
        'text/plain: fingerprint uses {"sha256": hex of the raw bytes}');

    my $kd = $t->key('var');
    my $dup = '{"a":1,"a":2}';
    $t->http(POST => '/v/dup', key => $kd, json => $dup);
    $l = logged('duplicate names');
    is($l->{form}, 'raw-invalid-json', 'duplicate names: body form raw-invalid-json');
    is($l->{fp}, fingerprint(method => 'POST', route => '/v/dup', body => { sha256 => sha256_hex($dup) }),
        'duplicate names: hashed as raw bytes');

    my $ke = $t->key('var');
    $t->http(POST => '/v/empty', key => $ke);
    $l = logged('empty body');
    is($l->{fp}, fingerprint(method => 'POST', route => '/v/empty', body => { sha256 => sha256_hex('') }),
        'empty body: {"sha256": sha256 of nothing}');
}

# ---- scope enters the fingerprint
{
    my $ks = $t->key('var');
    $t->http(POST => '/scoped/x', key => $ks, json => { a => 1 }, headers => [ 'X-Account' => 'acct-42' ]);
    my $l = logged('scoped');
    is($l->{fp}, fingerprint(method => 'POST', route => '/scoped/x', scope => 'acct-42', body => { a => 1 }),
        'scope is part of the fingerprint');
    unlike(join("\n", $t->access_log), qr/acct-42/, 'scope value not in the access log');
}

# ---- idempotency_fingerprint_headers
{
    my $kh = $t->key('var');
    $t->http(POST => '/hdr/x', key => $kh, json => { a => 1 }, headers => [ 'X-Tenant' => 't1', 'X-Trace' => 'z' ]);
    my $l = logged('fingerprint headers');
    is($l->{fp}, fingerprint(method => 'POST', route => '/hdr/x', headers => { 'x-tenant' => 't1' }, body => { a => 1 }),
        'listed header enters the fingerprint by lowercased name; absent one does not');
    my $r = $t->http(POST => '/hdr/x', key => $kh, json => { a => 1 }, headers => [ 'X-Tenant' => 't1', 'X-Trace' => 'other' ]);
    is($r->{headers}{'idempotent-replayed'}, 'true', 'unlisted header change: replay');
    logged('fingerprint headers replay');
    $r = $t->http(POST => '/hdr/x', key => $kh, json => { a => 1 }, headers => [ 'X-Tenant' => 't2' ]);
    is($r->{status}, 409, 'listed header changed: conflict');
    logged('fingerprint headers conflict');
    $r = $t->http(POST => '/hdr/x', key => $kh, json => { a => 1 });
    is($r->{status}, 409, 'listed header removed: conflict');
    logged('fingerprint headers absent');
    is($t->effects(key => $kh), 1, 'fingerprint headers: one effect');

    # a header sent several times counts as its values joined with ", "
    my $km = $t->key('var');
    my @many = map { ('X-Tenant' => $_) } ('', 'b', 'c' .. 'v');
    $t->http(POST => '/hdr/x', key => $km, json => { a => 1 }, headers => \@many);
    $l = logged('fingerprint header repeated');
    is($l->{fp}, fingerprint(method => 'POST', route => '/hdr/x',
        headers => { 'x-tenant' => join(', ', '', 'b', 'c' .. 'v') }, body => { a => 1 }),
        'a repeated listed header (22 times, the first empty) enters as one joined value');
    $r = $t->http(POST => '/hdr/x', key => $km, json => { a => 1 }, headers => [ @many[0 .. $#many - 2] ]);
    is($r->{status}, 409, 'one occurrence fewer: conflict');
    logged('fingerprint header repeated conflict');
    is($t->effects(key => $km), 1, 'repeated header: one effect');
}

# ---- operation ids: 300 first writes, more than one refill of the
#      worker's 4 KiB random reserve (32 bytes per request), all distinct
{
    my (%seen, $bad);
    for my $i (1 .. 300) {
        my $ki = $t->key("opid$i");
        my $r = $t->http(POST => '/v/ids', key => $ki, json => { i => $i });
        my $l = logged("operation id $i");
        $bad++ unless $r->{status} == 201 && $l->{op} =~ $hex32 && !$seen{ $l->{op} }++;
    }
    ok(!$bad, '300 first writes: 300 distinct 32-hex operation ids');
    is(scalar(grep { ($_->{uri} // '') eq '/v/ids' } $t->effect_list), 300, '300 first writes: 300 effects');
}

$t->check_logs;
done_testing;
