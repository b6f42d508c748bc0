#!/usr/bin/perl
# Hostile JSON bodies: nesting 100k deep (no stack overflow: the body falls
# back to the raw hash), an object with 200k members (no quadratic time: it
# completes within the harness timeout), and JSON that RFC 8785 cannot
# canonicalize (duplicate names, invalid UTF-8, lone surrogates, \u0000,
# numbers beyond a double, trailing garbage): hashed raw, so a byte-identical
# retry replays and any other spelling conflicts. Every case counts the
# upstream's effects: nothing executes twice.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Idem::Test;

my $t = Idem::Test->new;
$t->start_stack(<<'EOF', log_format => 'outcome=$idempotency_outcome form=$idempotency_body_form key="$idempotency_key" status=$status');
client_max_body_size 16m;
client_body_buffer_size 64k;
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    location / {
        idempotency on;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

# the access-log entries (outcome, form, status) of key $k, in order
sub log_of {
    my ($k, $n) = @_;
    my @l;
    $t->wait_for(sub {
        @l = grep { /key="\Q$k\E"/ } $t->access_log;
        @l >= ($n // 0);
    }, 5);
    return map { my %f = /(\w+)=("[^"]*"|\S+)/g; \%f } @l;
}

sub json_req {
    my ($k, $body, %o) = @_;
    return $t->http(POST => $o{uri} // '/j', key => $k, body => $body,
        headers => [ 'Content-Type' => 'application/json' ], timeout => $o{timeout} // 60);
}

# ---- 100k nested arrays: valid JSON, beyond the depth limit
for my $c ([ 'arrays', '[' x 100_000 . ']' x 100_000 ],
           [ 'objects', '{"a":' x 100_000 . '1' . '}' x 100_000 ],
           [ 'unclosed arrays', '[' x 100_000 ],
           [ 'mixed, 129 deep then garbage', ('[{"x":' x 65) . "\x00" ]) {
    my ($what, $body) = @$c;
    my $k = $t->key('deep');
    my $uri = '/deep/' . int(rand 1e9);
    my $a = json_req($k, $body, uri => $uri);
    is($a->{status}, 201, "deep $what (" . length($body) . " bytes): executes") or diag($t->show($a));
    my $b = json_req($k, $body, uri => $uri);
    is($b->{status}, 201, "deep $what: retry answered");
    is($b->{headers}{'idempotent-replayed'}, 'true', "deep $what: byte-identical retry replays");
    is($b->{content}, $a->{content}, "deep $what: replayed body identical");
    my $c2 = json_req($k, "$body ", uri => $uri);
    $t->is_problem($c2, 409, 'fingerprint-mismatch', key => $k,
        name => "deep $what: one more (JSON whitespace) byte conflicts: hashed raw");
    is($t->effects(uri => $uri), 1, "deep $what: one effect");
    my @l = log_of($k, 3);
    is($l[0] && $l[0]{form}, 'raw-invalid-json', "deep $what: body form raw-invalid-json");
    is($l[0] && $l[0]{outcome}, 'executed', "deep $what: outcome executed");
}

# ---- 128 deep is still JSON (the documented limit), 129 is not
{
    my $k = $t->key('d128');
    my $a = json_req($k, '[' x 128 . '1' . ']' x 128, uri => '/d128');
    is($a->{status}, 201, 'depth 128: executes');
    my $b = json_req($k, '[' x 128 . ' 1 ' . ']' x 128, uri => '/d128');
    is($b->{headers}{'idempotent-replayed'}, 'true', 'depth 128: re-spaced retry replays (canonical JSON)');
    my @l = log_of($k, 2);
    is($l[0] && $l[0]{form}, 'json', 'depth 128: body form json');

    my $k2 = $t->key('d129');
    json_req($k2, '[' x 129 . '1' . ']' x 129, uri => '/d129');
    my $d = json_req($k2, '[' x 129 . ' 1 ' . ']' x 129, uri => '/d129');
    $t->is_problem($d, 409, 'fingerprint-mismatch', key => $k2, name => 'depth 129: re-spaced retry conflicts (raw)');
    my @l2 = log_of($k2, 2);
    is($l2[0] && $l2[0]{form}, 'raw-invalid-json', 'depth 129: body form raw-invalid-json');
    is($t->effects(uri => '/d128') + $t->effects(uri => '/d129'), 2, 'depth 128/129: one effect each');
}

# ---- 200k members: canonicalized (sorted) in O(n log n)
{
    my $n = 200_000;
    my @m = map { sprintf('"m%06d":%d', $_, $_) } 0 .. $n - 1;
    my $fwd = '{' . join(',', @m) . '}';
    my $rev = "{\n" . join(",\n", reverse @m) . "\n}";
    my $k = $t->key('wide');
    my $a = json_req($k, $fwd, uri => '/wide', timeout => 120);
    is($a->{status}, 201, "200k members (" . length($fwd) . " bytes): executes") or diag($t->show($a));
    my $b = json_req($k, $rev, uri => '/wide', timeout => 120);
    is($b->{headers}{'idempotent-replayed'}, 'true', '200k members in reverse order, re-spaced: replays');
    is($b->{content}, $a->{content}, '200k members: replayed body identical');
    (my $changed = $fwd) =~ s/"m199999":199999/"m199999":199998/;
    my $c = json_req($k, $changed, uri => '/wide', timeout => 120);
    $t->is_problem($c, 409, 'fingerprint-mismatch', key => $k, name => '200k members, last value changed: conflict');
    is($t->effects(uri => '/wide'), 1, '200k members: one effect');
    my @l = log_of($k, 3);
    is($l[0] && $l[0]{form}, 'json', '200k members: body form json');

    # 200k members that are all the same name: duplicate detection must not be quadratic either
    my $dup = '{' . join(',', ('"same":1') x $n) . '}';
    my $k2 = $t->key('wide-dup');
    my $d = json_req($k2, $dup, uri => '/wide-dup', timeout => 120);
    is($d->{status}, 201, '200k duplicate members: executes');
    my $e = json_req($k2, $dup, uri => '/wide-dup', timeout => 120);
    is($e->{headers}{'idempotent-replayed'}, 'true', '200k duplicate members: identical retry replays');
    is($t->effects(uri => '/wide-dup'), 1, '200k duplicate members: one effect');
    my @l2 = log_of($k2, 2);
    is($l2[0] && $l2[0]{form}, 'raw-invalid-json', '200k duplicate members: raw-invalid-json');
}

# ---- JSON that cannot be canonicalized: raw hash, never altered
my @invalid = (
    [ 'duplicate names',            '{"a":1,"a":2}',             '{"a":2,"a":1}' ],
    [ 'duplicate after unescaping', '{"a":1,"\u0061":2}',        '{"\u0061":2,"a":1}' ],
    [ 'nested duplicate',           '{"x":{"b":1,"b":1}}',       '{ "x" : {"b":1,"b":1} }' ],
    [ 'invalid UTF-8 (\xff)',       qq({"a":"\xff","b":1}),      qq({"b":1,"a":"\xff"}) ],
    [ 'overlong UTF-8 (\xc0\x80)',  qq({"a":"\xc0\x80"}),        qq({ "a":"\xc0\x80"}) ],
    [ 'UTF-8 surrogate (\xed\xa0\x80)', qq(["\xed\xa0\x80",1]),  qq([ "\xed\xa0\x80",1]) ],
    [ 'lone surrogate escape',      '{"a":"\uD800","b":2}',      '{"b":2,"a":"\uD800"}' ],
    [ '\u0000',                     '{"a":"x\u0000y","b":2}',    '{"b":2,"a":"x\u0000y"}' ],
    [ 'number beyond a double',     '{"a":1e400,"b":2}',         '{"b":2,"a":1e400}' ],
    [ 'trailing garbage',           '{"a":1,"b":2} x',           '{"b":2,"a":1} x' ],
    [ 'byte-order mark',            "\xef\xbb\xbf{\"a\":1,\"b\":2}", "\xef\xbb\xbf{\"b\":2,\"a\":1}" ],
);
for my $c (@invalid) {
    my ($what, $body, $reordered) = @$c;
    my $k = $t->key('inv');
    my $uri = '/inv/' . int(rand 1e9);
    my $a = json_req($k, $body, uri => $uri);
    is($a->{status}, 201, "$what: executes") or diag($t->show($a));
    my $b = json_req($k, $body, uri => $uri);
    is($b->{headers}{'idempotent-replayed'}, 'true', "$what: byte-identical retry replays");
    is($b->{content}, $a->{content}, "$what: replayed body identical");
    my $d = json_req($k, $reordered, uri => $uri);
    $t->is_problem($d, 409, 'fingerprint-mismatch', key => $k,
        name => "$what: reordered/re-spaced retry conflicts (raw hash)");
    my @e = $t->effect_list(uri => $uri);
    is(scalar(@e), 1, "$what: one effect");
    is($e[0] && $e[0]{sha}, $t->sha256($body), "$what: the upstream got the bytes unaltered");
    my @l = log_of($k, 3);
    is($l[0] && $l[0]{form}, 'raw-invalid-json', "$what: body form raw-invalid-json");
}

$t->check_logs;
done_testing;
