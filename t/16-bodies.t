#!/usr/bin/perl
# Bodies: 1 MiB request bodies spooled to temp files (the fingerprint is
# computed from the file), a 1 MiB response replayed byte for byte, raw
# hashing of non-JSON and binary bodies, chunked request bodies, and several
# requests on one keep-alive connection.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Digest::SHA qw(sha256_hex);
use Test::More;
use Idem::Test;

my $t = Idem::Test->new;
$t->start_stack(<<'EOF', log_format => 'F|$request_uri|$idempotency_fingerprint|$idempotency_body_form');
client_body_buffer_size 16k;
client_max_body_size 4m;
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    location / {
        idempotency on;
        idempotency_store_max 2m;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /file-only/ {
        idempotency on;
        client_body_in_file_only clean;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

my $MiB = 1024 * 1024;

# ---- 1 MiB binary request body, spooled (above client_body_buffer_size)
for my $loc ('/upload', '/file-only/upload') {
    my $k = $t->key('big');
    my $body = $t->upstream_body($MiB);
    my @h = (headers => [ 'Content-Type' => 'application/octet-stream' ]);
    my $a = $t->http(POST => $loc, key => $k, body => $body, @h);
    is($a->{status}, 201, "$loc: 1 MiB body executes") or diag($t->show($a));
    my ($e) = $t->effect_list(key => $k);
    is($e && $e->{len}, $MiB, "$loc: upstream received the whole 1 MiB");
    is($e && $e->{sha}, sha256_hex($body), "$loc: upstream received the exact bytes");

    my $b = $t->http(POST => $loc, key => $k, body => $body, @h);
    is($b->{headers}{'idempotent-replayed'}, 'true', "$loc: 1 MiB retry replays");
    is($b->{content}, $a->{content}, "$loc: replayed body identical");

    my $changed = $body;
    substr($changed, -1, 1) = chr(ord(substr($changed, -1, 1)) ^ 1);
    my $c = $t->http(POST => $loc, key => $k, body => $changed, @h);
    $t->is_problem($c, 409, 'fingerprint-mismatch', key => $k,
        name => "$loc: last byte of 1 MiB changed -> conflict");
    my $first = $body;
    substr($first, 0, 1) = 'X';
    my $d = $t->http(POST => $loc, key => $k, body => $first, @h);
    $t->is_problem($d, 409, 'fingerprint-mismatch', key => $k,
        name => "$loc: first byte of 1 MiB changed -> conflict");
    is($t->effects(key => $k), 1, "$loc: 1 MiB body: one effect");
}

# ---- 1 MiB JSON request body, spooled: still compared as JSON
{
    my $k = $t->key('bigjson');
    my @n = (1 .. 150000);
    my $compact = '{"batch":"b-1","values":[' . join(',', @n) . ']}';
    my $spaced = "{\n  \"values\" : [ " . join(', ', @n) . " ],\n  \"batch\" : \"b-1\"\n}\n";
    ok(length($compact) > 16 * 1024 && length($spaced) > $MiB, "JSON bodies are large (" . length($compact) . " and " . length($spaced) . " bytes)");
    my $a = $t->http(POST => '/file-only/json', key => $k, json => $compact);
    is($a->{status}, 201, 'large JSON executes') or diag($t->show($a));
    my $b = $t->http(POST => '/file-only/json', key => $k, json => $spaced);
    is($b->{headers}{'idempotent-replayed'}, 'true', 'large JSON re-spaced and reordered replays');
    my $c = $t->http(POST => '/file-only/json', key => $k, json => $compact =~ s/150000\]/150001]/r);
    $t->is_problem($c, 409, 'fingerprint-mismatch', key => $k, name => 'large JSON, last value changed -> conflict');
    is($t->effects(key => $k), 1, 'large JSON: one effect');
}

# ---- a JSON body read from its temp file (file-only, or spooled past the
#      16k buffer) and canonicalized over that copy, or read where it is
#      (small): each gets the fingerprint the offline tool computes. A
#      spooled body that is not JSON after all (a duplicate name at its
#      end, found when the copy is mostly overwritten) is hashed raw from
#      the file again, so its retry replays and a changed byte conflicts.
{
    my $tool = "$FindBin::Bin/../build/idempotency-fingerprint";
    my @n = map { $_ * 7 } 1 .. 20000;
    my $json = "{ \"z\" : [" . join(', ', @n) . "], \"a\": {\"y\":1,\"b\":\"\\u00e9\"} }";
    my $dup = "{ \"z\" : [" . join(', ', @n) . "], \"a\": 1, \"a\": 2 }";
    my $dup_grow = "{ \"z\" : [" . join(', ', @n) . "], \"a\": 1e20, \"a\": 2 }";
    my %bodies = (
        '/file-only/fp' => [ $json, 'json' ],
        '/fp-spooled'   => [ $json, 'json' ],
        '/fp-small'     => [ '{"b":2,"a":1}', 'json' ],
        '/file-only/dup' => [ $dup, 'raw-invalid-json' ],
        '/fp-dup'       => [ $dup, 'raw-invalid-json' ],
        '/fp-dup-grow'  => [ $dup_grow, 'raw-invalid-json' ],    # 1e20 moves the output out
    );
    for my $uri (sort keys %bodies) {
        my ($body, $want_form) = @{ $bodies{$uri} };
        my $k = $t->key('fp');
        my $r = $t->http(POST => $uri, key => $k, json => $body);
        is($r->{status}, 201, "$uri: executes") or diag($t->show($r));
        my $f = "$t->{prefix}/fp-body.json";
        open my $fh, '>', $f or die "$f: $!";
        print $fh $body;
        close $fh;
        my $want = `$tool --method POST --route $uri --content-type application/json --body-file $f 2>/dev/null`;
        my ($hex) = $want =~ /\b([0-9a-f]{64})\b/;
        my @l;
        $t->wait_for(sub { @l = grep { /^F\|\Q$uri\E\|/ } $t->access_log; @l }, 5);
        my (undef, undef, $got, $form) = split /\|/, $l[-1] // '';
        is($form, $want_form, "$uri: body form $want_form");
        ok($hex && $got eq $hex, "$uri: the tool's fingerprint") or diag("module $got, tool " . ($hex // $want));
        my $again = $t->http(POST => $uri, key => $k, json => $body);
        is($again->{headers}{'idempotent-replayed'}, 'true', "$uri: the retry replays");
        my $changed = $t->http(POST => $uri, key => $k, json => $body =~ s/: 2 }$/: 3 }/r =~ s/"y":1/"y":3/r =~ s/"b":2/"b":3/r);
        $t->is_problem($changed, 409, 'fingerprint-mismatch', key => $k, name => "$uri: a changed value conflicts");
        is($t->effects(key => $k), 1, "$uri: one effect");
    }
}

# ---- 1 MiB response stored and replayed byte-exact
{
    my $k = $t->key('bigresp');
    my @h = (headers => [ 'X-Body-Size' => $MiB ]);
    my $a = $t->http(POST => '/download', key => $k, json => { want => 'big' }, @h);
    is($a->{status}, 201, '1 MiB response passes through') or diag($t->show($a));
    is(length $a->{content}, $MiB, 'first response is 1 MiB');
    is(sha256_hex($a->{content}), sha256_hex($t->upstream_body($MiB)), 'first response bytes exact');
    my $b = $t->http(POST => '/download', key => $k, json => { want => 'big' }, @h);
    is($b->{status}, 201, '1 MiB replay status');
    is($b->{headers}{'idempotent-replayed'}, 'true', '1 MiB response replayed');
    is(length $b->{content}, $MiB, 'replayed response is 1 MiB');
    is(sha256_hex($b->{content}), sha256_hex($a->{content}), 'replayed 1 MiB byte-exact (sha256)');
    is($b->{headers}{'content-type'}, 'application/octet-stream', 'replayed Content-Type');
    is($t->effects(key => $k), 1, '1 MiB response: one effect');

    # the same through a slow reader: many replays at once
    my $res = $t->parallel(5, sub {
        my $r = $t->http(POST => '/download', key => $k, json => { want => 'big' }, @h, timeout => 20);
        return { s => $r->{status}, rp => $r->{headers}{'idempotent-replayed'}, sha => sha256_hex($r->{content}) };
    });
    is(scalar(grep { $_ && $_->{s} == 201 && ($_->{rp} // '') eq 'true' && $_->{sha} eq sha256_hex($a->{content}) } @$res),
        5, '5 concurrent 1 MiB replays byte-exact');
    is($t->effects(key => $k), 1, 'concurrent 1 MiB replays: one effect');
}

# ---- non-JSON and binary bodies hashed raw
for my $c ([ 'text/plain', "hello world\n" x 10 ],
           [ 'application/octet-stream', join('', map { chr } 0 .. 255) x 4 ],
           [ 'application/x-www-form-urlencoded', 'a=1&b=2&c=%00' ],
           [ undef, "no content type \x00\xff" ]) {
    my ($ct, $body) = @$c;
    my $what = $ct // 'no Content-Type';
    my $k = $t->key('raw');
    my @h = (headers => [ defined $ct ? ('Content-Type' => $ct) : () ]);
    my $a = $t->http(POST => '/raw', key => $k, body => $body, @h);
    is($a->{status}, 201, "$what: executes");
    my ($e) = $t->effect_list(key => $k);
    is($e && $e->{sha}, sha256_hex($body), "$what: upstream got the exact bytes");
    my $b = $t->http(POST => '/raw', key => $k, body => $body, @h);
    is($b->{headers}{'idempotent-replayed'}, 'true', "$what: identical bytes replay");
    my $changed = $body;
    substr($changed, 5, 1) = chr(ord(substr($changed, 5, 1)) ^ 0x20);
    my $d = $t->http(POST => '/raw', key => $k, body => $changed, @h);
    $t->is_problem($d, 409, 'fingerprint-mismatch', key => $k, name => "$what: one changed byte -> conflict");
    my $f = $t->http(POST => '/raw', key => $k, body => "$body ", @h);
    $t->is_problem($f, 409, 'fingerprint-mismatch', key => $k, name => "$what: one more byte -> conflict");
    is($t->effects(key => $k), 1, "$what: one effect");
}

# ---- empty body
{
    my $k = $t->key('empty');
    my $a = $t->http(POST => '/empty', key => $k);
    is($a->{status}, 201, 'empty body executes');
    my $b = $t->http(POST => '/empty', key => $k);
    is($b->{headers}{'idempotent-replayed'}, 'true', 'empty body replays');
    my $c = $t->http(POST => '/empty', key => $k, body => 'x');
    $t->is_problem($c, 409, 'fingerprint-mismatch', key => $k, name => 'empty vs one byte -> conflict');
    is($t->effects(key => $k), 1, 'empty body: one effect');
}

# ---- chunked request bodies (raw socket)
for my $loc ('/chunked', '/file-only/chunked') {
    my $k = $t->key('chunk');
    my $body = '{"event":"ship","parcels":[' . join(',', map { qq({"id":$_,"w":1.5}) } 1 .. 2000) . ']}';
    my @ct = (headers => [ 'Content-Type' => 'application/json' ]);
    my $r1 = ($t->parse_responses($t->raw($t->request_bytes(POST => $loc, key => $k, body => $body,
        chunked => [ 1, 7, 300, 4096 ], @ct))))[0];
    is($r1 && $r1->{status}, 201, "$loc: chunked body executes");
    my ($e) = $t->effect_list(key => $k);
    is($e && $e->{sha}, sha256_hex($body), "$loc: upstream got the de-chunked body");

    my $r2 = ($t->parse_responses($t->raw($t->request_bytes(POST => $loc, key => $k, body => $body,
        chunked => [ 5000, 13 ], @ct))))[0];
    is($r2 && $r2->{headers}{'idempotent-replayed'}, 'true', "$loc: same body chunked differently replays");
    is($r2 && $r2->{content}, $r1 && $r1->{content}, "$loc: replay body identical");

    my $r3 = $t->http(POST => $loc, key => $k, body => $body, @ct);
    is($r3->{headers}{'idempotent-replayed'}, 'true', "$loc: same body with Content-Length replays");

    # chunks trickling in with pauses
    my $req = $t->request_bytes(POST => $loc, key => $k, body => $body, chunked => [ 100, 100 ], @ct);
    my $cut = index($req, "\r\n\r\n") + 4 + 60;
    my $r4 = ($t->parse_responses($t->raw([ substr($req, 0, $cut), 0.3, substr($req, $cut) ])))[0];
    is($r4 && $r4->{headers}{'idempotent-replayed'}, 'true', "$loc: slowly sent chunked body replays");

    my $r5 = ($t->parse_responses($t->raw($t->request_bytes(POST => $loc, key => $k,
        body => $body =~ s/"ship"/"SHIP"/r, chunked => [ 100 ], @ct))))[0];
    $t->is_problem($r5 // {}, 409, 'fingerprint-mismatch', key => $k, name => "$loc: other chunked body -> conflict");
    is($t->effects(key => $k), 1, "$loc: chunked: one effect");
}

# ---- several requests on one keep-alive connection
{
    my ($k1, $k2) = ($t->key('ka'), $t->key('ka'));
    my $c = $t->conn;
    my @r;
    for my $q ([ $k1, { n => 1 } ], [ $k2, { n => 2 } ], [ $k1, { n => 1 } ], [ undef, { n => 3 } ],
               [ $k2, { n => 99 } ], [ $k2, { n => 2 } ]) {
        $c->send($t->request_bytes(POST => '/ka', key => $q->[0], json => $q->[1], connection => undef));
        push @r, $c->response;
    }
    is(scalar(grep { defined } @r), 6, 'keep-alive: six answers on one connection');
    is($r[0] && $r[0]{status}, 201, 'keep-alive #1 (key 1) executes');
    ok($r[0] && !$r[0]{headers}{'idempotent-replayed'}, 'keep-alive #1 not replayed');
    is($r[1] && $r[1]{status}, 201, 'keep-alive #2 (key 2) executes');
    ok($r[1] && !$r[1]{headers}{'idempotent-replayed'}, 'keep-alive #2 not replayed');
    is($r[2] && $r[2]{headers}{'idempotent-replayed'}, 'true', 'keep-alive #3 (key 1 again) replays');
    is($r[2] && $r[2]{content}, $r[0] && $r[0]{content}, 'keep-alive #3 body is #1\'s');
    is($r[3] && $r[3]{status}, 201, 'keep-alive #4 (no key) executes');
    is($r[4] && $r[4]{status}, 409, 'keep-alive #5 (key 2, other body) conflicts');
    is($r[5] && $r[5]{headers}{'idempotent-replayed'}, 'true', 'keep-alive #6 (key 2) replays');
    is($r[5] && $r[5]{content}, $r[1] && $r[1]{content}, 'keep-alive #6 body is #2\'s');
    ok(!$c->eof(0.2), 'keep-alive connection still open');
    $c->close;
    is($t->effects(uri => '/ka'), 3, 'keep-alive: three effects (key 1, key 2, no key)');

    # pipelined: all requests in one write
    my ($k3, $k4) = ($t->key('pipe'), $t->key('pipe'));
    my @q = ([ $k3, 1 ], [ $k4, 2 ], [ $k3, 1 ], [ $k4, 2 ]);
    my $bytes = join '', map {
        $t->request_bytes(POST => '/pipe', key => $q[$_][0], json => { v => $q[$_][1] },
            connection => ($_ == $#q ? 'close' : undef))
    } 0 .. $#q;
    my @p = $t->parse_responses($t->raw($bytes, responses => 4));
    is(scalar(@p), 4, 'pipelined: four answers');
    is(join(',', map { $_->{status} } @p), '201,201,201,201', 'pipelined: statuses');
    is(join(',', map { $_->{headers}{'idempotent-replayed'} // '-' } @p), '-,-,true,true',
        'pipelined: the two retries replay');
    is($p[2] && $p[2]{content}, $p[0] && $p[0]{content}, 'pipelined: retry 1 body');
    is($p[3] && $p[3]{content}, $p[1] && $p[1]{content}, 'pipelined: retry 2 body');
    is($t->effects(uri => '/pipe'), 2, 'pipelined: two effects');

    # keep-alive with a 1 MiB replay followed by another request
    my $k5 = $t->key('ka-big');
    my $c2 = $t->conn;
    my @h = (headers => [ 'X-Body-Size' => $MiB ]);
    $c2->send($t->request_bytes(POST => '/ka-big', key => $k5, json => {}, @h, connection => undef));
    my $x1 = $c2->response(timeout => 20);
    $c2->send($t->request_bytes(POST => '/ka-big', key => $k5, json => {}, @h, connection => undef));
    my $x2 = $c2->response(timeout => 20);
    $c2->send($t->request_bytes(POST => '/ka-big', key => $t->key('ka-big'), json => {}, connection => undef));
    my $x3 = $c2->response;
    $c2->close;
    is($x2 && $x2->{headers}{'idempotent-replayed'}, 'true', 'keep-alive: 1 MiB replay');
    is($x2 && sha256_hex($x2->{content}), $x1 && sha256_hex($x1->{content}), 'keep-alive: 1 MiB replay byte-exact');
    is($x3 && $x3->{status}, 201, 'keep-alive: request after a 1 MiB replay answered');
    is($t->effects(uri => '/ka-big'), 2, 'keep-alive 1 MiB: two effects');
}

$t->check_logs;
done_testing;
