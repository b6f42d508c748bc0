#!/usr/bin/perl
# The key header: absent (optional or required), malformed, at the length
# limit, and the quoted sf-string form that names the same key.

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
    location /strict/ {
        idempotency on;
        idempotency_required on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /custom/ {
        idempotency on;
        idempotency_key_header X-Request-Token;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

sub show_bytes { join '', map { /[ -~]/ ? $_ : sprintf('\\x%02x', ord) } split //, shift }

# ---- no key, optional: passes through every time
{
    my $before = $t->effects;
    for my $n (1 .. 3) {
        my $r = $t->http(POST => '/nokey', json => { same => 'body' });
        is($r->{status}, 201, "no key, attempt $n: passes through");
        ok(!exists $r->{headers}{'idempotent-replayed'}, "no key, attempt $n: not a replay");
    }
    is($t->effects(uri => '/nokey'), 3, 'no key: every request is an effect');
    is(scalar($t->redis_keys), 0, 'no key: no record in Redis');
}

# ---- no key, required: 400 key-missing, no effect
{
    my $r = $t->http(POST => '/strict/pay', json => { a => 1 });
    $t->is_problem($r, 400, 'key-missing', key => undef, name => 'idempotency_required on, no key -> 400 key-missing');
    is($t->effects(uri => '/strict/pay'), 0, 'key-missing: no effect');
    my $ok = $t->http(POST => '/strict/pay', key => $t->key('keys'), json => { a => 1 });
    is($ok->{status}, 201, 'required location with a key executes');
    is($t->effects(uri => '/strict/pay'), 1, 'required location with a key: one effect');
    my $g = $t->http(GET => '/strict/pay');
    is($g->{status}, 201, 'required location: GET without key untouched');
}

# ---- malformed keys: 400 key-malformed, no effect, no record
my @malformed = (
    [ 'empty value',              '' ],
    [ '256 bytes',                'a' x 256 ],
    [ 'tab inside',               "ab\tcd" ],
    [ 'control character \x01',   "ab\x01cd" ],
    [ 'DEL \x7f',                 "ab\x7fcd" ],
    [ 'non-ASCII byte \xff',      "ab\xffcd" ],
    [ 'UTF-8 non-ASCII',          "caf\xc3\xa9" ],
    [ 'space inside a bare token', 'ab cd' ],
    [ 'unterminated quote',       '"abc' ],
    [ 'text after closing quote', '"abc"x' ],
    [ 'empty sf-string',          '""' ],
    [ 'sf-string of 256 bytes',   '"' . ('q' x 256) . '"' ],
    [ 'bad escape in sf-string',  '"a\\qb"' ],
    [ 'tab in sf-string',         "\"a\tb\"" ],
    [ 'non-ASCII in sf-string',   "\"caf\xc3\xa9\"" ],
);
{
    my $records = scalar $t->redis_keys;
    for my $c (@malformed) {
        my ($what, $v) = @$c;
        my $uri = '/bad/' . scalar($t->effect_list) . '-' . int(rand 1e9);
        my $r = $t->http(POST => $uri, key => $v, json => { a => 1 });
        $t->is_problem($r, 400, 'key-malformed', key => undef,
            name => "malformed key ($what: '" . show_bytes($v) . "') -> 400 key-malformed");
        is($t->effects(uri => $uri), 0, "malformed key ($what): no effect");
    }
    # two key headers
    my $r = $t->http(POST => '/bad/two', json => { a => 1 },
        headers => [ 'Idempotency-Key' => $t->key('keys'), 'Idempotency-Key' => $t->key('keys') ]);
    $t->is_problem($r, 400, 'key-malformed', name => 'two key headers -> 400 key-malformed');
    is($t->effects(uri => '/bad/two'), 0, 'two key headers: no effect');
    is(scalar($t->redis_keys), $records, 'malformed keys: no record created');
}

# ---- CRLF inside the value: what reaches nginx is split or rejected by HTTP
{
    # obs-fold continuation and bare CR: nginx (or the module) must refuse
    for my $c ([ 'CRLF + space (obs-fold)', "abc\r\n def" ], [ 'CRLF + tab (obs-fold)', "abc\r\n\tdef" ],
               [ 'bare CR', "abc\rdef" ], [ 'NUL', "ab\x00cd" ]) {
        my ($what, $v) = @$c;
        my $uri = '/crlf/' . int(rand 1e9);
        my $raw = $t->raw($t->request_bytes(POST => $uri, key => $v, json => { a => 1 }));
        my ($r) = $t->parse_responses($raw);
        is($r && $r->{status}, 400, "key with $what -> 400") or diag($raw);
        is($t->effects(uri => $uri), 0, "key with $what: no effect");
    }
    # CRLF + a header line: HTTP splits it into key "abc..." and another
    # header; the server sees a valid key and nothing else of the injection.
    my $k = $t->key('crlf');
    my $uri = '/crlf/split';
    my $raw = $t->raw($t->request_bytes(POST => $uri, key => "$k\r\nX-Injected: 1", json => { a => 1 }));
    my ($r) = $t->parse_responses($raw);
    is($r && $r->{status}, 201, 'CRLF-split value: the key before the CRLF is used');
    my @e = $t->effect_list(uri => $uri);
    is(scalar(@e), 1, 'CRLF-split value: one effect');
    is($e[0] && $e[0]{key}, $k, 'CRLF-split value: upstream saw only the part before the CRLF');
    my $again = $t->http(POST => $uri, key => $k, json => { a => 1 });
    is($again->{headers}{'idempotent-replayed'}, 'true', 'CRLF-split value: same key as the bare one');
    is($t->effects(uri => $uri), 1, 'CRLF-split value: still one effect');
    # CRLF CRLF: header section ends; the rest is not a header of this request
    my $uri2 = '/crlf/smuggle';
    $raw = $t->raw($t->request_bytes(POST => $uri2, key => "$k-s\r\n\r\nPOST /crlf/smuggled HTTP/1.1\r\nHost: x",
        json => { a => 1 }), timeout => 3);
    is($t->effects(uri => '/crlf/smuggled'), 0, 'CRLF CRLF: no smuggled request reached the upstream')
        or diag($raw);
}

# ---- 255-byte key is fine
{
    my $k = substr($t->key('len') . ('x' x 255), 0, 255);
    is(length $k, 255, 'key of 255 bytes');
    my $a = $t->http(POST => '/long', key => $k, json => { a => 1 });
    is($a->{status}, 201, '255-byte key executes') or diag($t->show($a));
    my $b = $t->http(POST => '/long', key => $k, json => { a => 1 });
    is($b->{headers}{'idempotent-replayed'}, 'true', '255-byte key replays');
    is($t->effects(key => $k), 1, '255-byte key: one effect');

    # sf-string of 255 bytes after unquoting
    my $q = substr($t->key('qlen') . ('y' x 255), 0, 255);
    my $c = $t->http(POST => '/long', key => "\"$q\"", json => { a => 1 });
    is($c->{status}, 201, 'sf-string of 255 bytes executes');
    my $d = $t->http(POST => '/long', key => $q, json => { a => 1 });
    is($d->{headers}{'idempotent-replayed'}, 'true', 'sf-string of 255 bytes = bare 255-byte key');
    is($t->effects(uri => '/long'), 2, '255-byte keys: two effects in total');

    # all printable ASCII except a leading quote is a valid bare token
    my $p = $t->key('p') . q{!#$%&'()*+,-./:;<=>?@[\]^_`{|}~"};
    my $e = $t->http(POST => '/punct', key => $p, json => { a => 1 });
    is($e->{status}, 201, 'bare token with punctuation executes') or diag($t->show($e));
    my $f = $t->http(POST => '/punct', key => $p, json => { a => 1 });
    is($f->{headers}{'idempotent-replayed'}, 'true', 'bare token with punctuation replays');
    is($t->effects(uri => '/punct'), 1, 'punctuation key: one effect');
}

# ---- quoted sf-string "abc" names the same key as bare abc
{
    my $k = $t->key('sf');
    my $a = $t->http(POST => '/sf', key => qq("$k"), json => { a => 1 });
    is($a->{status}, 201, 'quoted key executes');
    ok(!exists $a->{headers}{'idempotent-replayed'}, 'quoted key: first is not a replay');
    my $b = $t->http(POST => '/sf', key => $k, json => { a => 1 });
    is($b->{headers}{'idempotent-replayed'}, 'true', 'bare key replays the quoted one');
    is($b->{content}, $a->{content}, 'same body');
    is($t->effects(uri => '/sf'), 1, 'quoted = bare: one effect');

    my $c = $t->http(POST => '/sf', key => $k, json => { a => 2 });
    my $p = $t->problem($c) // {};
    is($p->{idempotency_key}, $k, 'problem carries the parsed (unquoted) key');

    # escapes: "a\"b\\c" is the key a"b\c
    my $e = $t->key('esc') . 'a"b\\c';
    (my $quoted = $e) =~ s/(["\\])/\\$1/g;
    my $d = $t->http(POST => '/sf-esc', key => qq("$quoted"), json => { a => 1 });
    is($d->{status}, 201, 'sf-string with escapes executes') or diag($t->show($d));
    my $f = $t->http(POST => '/sf-esc', key => $e, json => { a => 1 });
    is($f->{headers}{'idempotent-replayed'}, 'true', 'unescaped sf-string equals the bare token');
    is($t->effects(uri => '/sf-esc'), 1, 'escaped sf-string: one effect');

    # a space is allowed inside an sf-string
    my $s = $t->key('sp') . ' with space';
    my $g = $t->http(POST => '/sf-space', key => qq("$s"), json => { a => 1 });
    is($g->{status}, 201, 'sf-string with a space executes');
    my $h = $t->http(POST => '/sf-space', key => qq("$s"), json => { a => 1 });
    is($h->{headers}{'idempotent-replayed'}, 'true', 'sf-string with a space replays');
    is($t->effects(uri => '/sf-space'), 1, 'sf-string with a space: one effect');
}

# ---- idempotency_key_header names another header
{
    my $k = $t->key('hdr');
    my $a = $t->http(POST => '/custom/x', headers => [ 'X-Request-Token' => $k ], json => { a => 1 });
    is($a->{status}, 201, 'custom key header executes');
    my $b = $t->http(POST => '/custom/x', headers => [ 'X-Request-Token' => $k ], json => { a => 1 });
    is($b->{headers}{'idempotent-replayed'}, 'true', 'custom key header replays');
    my $c = $t->http(POST => '/custom/x', key => $k, json => { a => 1 });
    ok(!exists $c->{headers}{'idempotent-replayed'}, 'Idempotency-Key is not the key there');
    is($t->effects(uri => '/custom/x'), 2, 'custom key header: replay did not execute, unkeyed did');
}

$t->check_logs;
done_testing;
