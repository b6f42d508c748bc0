#!/usr/bin/perl
# Hostile keys: Redis-meaningful characters ({, }, *, ?, [, ], :, "idem:..."),
# spaces, NUL, CR/LF. Answers as docs/states.md and docs/directives.md say:
# braces, star and other punctuation are ordinary key bytes; the record's
# Redis name is a digest, so they can never change its hash tag or match a
# pattern; a bare key with a space is 400 key-malformed (quoted it is fine);
# NUL and bare CR are refused by HTTP parsing (400). Nothing executes twice.

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
        idempotency_scope $http_authorization;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

my $RECORD = qr/^idem:\{[0-9a-f]{32}\}:/;
my $n = 0;

# ---- Redis-meaningful punctuation: ordinary keys, digest record names
for my $c ([ 'hash tag', '{tag}' ], [ 'reversed braces', '}x{' ], [ 'empty hash tag', '{}' ],
           [ 'star', '*' ], [ 'glob', 'a*b?c[de]' ], [ 'colons', 'idem:{0123456789abcdef0123456789abcdef}:r' ],
           [ 'nested braces', '{{a}}' ], [ 'quoted braces and star', '{*} x', 1 ], [ 'backslash', 'a\\b' ]) {
    my ($what, $key, $quoted) = @$c;
    my $uniq = "$key-" . $t->key('p');
    (my $esc = $uniq) =~ s/(["\\])/\\$1/g;
    my $send = $quoted ? qq("$esc") : $uniq;
    my $uri = '/punct/' . ++$n;
    my $auth = "Bearer p-$$-$n";
    my @h = (headers => [ Authorization => $auth ]);
    my $a = $t->http(POST => $uri, key => $send, json => { n => $n }, @h);
    is($a->{status}, 201, "key with $what ($send): executes") or diag($t->show($a));
    my $b = $t->http(POST => $uri, key => $send, json => { n => $n }, @h);
    is($b->{headers}{'idempotent-replayed'}, 'true', "key with $what: replays");
    my $c2 = $t->http(POST => $uri, key => $send, json => { n => -$n }, @h);
    $t->is_problem($c2, 409, 'fingerprint-mismatch', key => $uniq, name => "key with $what: other body conflicts");
    is($t->effects(uri => $uri), 1, "key with $what: one effect");
    my $rec = $t->record($uniq, $auth);
    ok($rec && $rec->{state} eq 'completed', "key with $what: record under the digest name " . $t->record_name($uniq, $auth));
}
{
    my @keys = $t->redis_keys('*');
    my @odd = grep { $_ !~ $RECORD } @keys;
    ok(!@odd, 'every Redis key is idem:{<32 hex>}:...; punctuation never reaches a key name')
        or diag("odd keys: @odd");
    my %tags = map { /^idem:\{([0-9a-f]{32})\}/ ? ($1 => 1) : () } @keys;
    is(scalar(keys %tags), $n, "one hash tag per (scope, key): $n");
}

# ---- spaces: bare 400, quoted fine
{
    my $base = $t->key('sp');
    for my $v ("$base with space", " $base x", "$base\tx") {
        my $r = $t->http(POST => '/space', key => $v, json => { a => 1 });
        $t->is_problem($r, 400, 'key-malformed', key => undef, name => "bare key '$v': 400 key-malformed");
    }
    is($t->effects(uri => '/space'), 0, 'bare keys with spaces: no effect');
    my $a = $t->http(POST => '/space', key => qq("$base with space"), json => { a => 1 });
    is($a->{status}, 201, 'quoted key with a space executes');
    my $b = $t->http(POST => '/space', key => qq("$base with space"), json => { a => 1 });
    is($b->{headers}{'idempotent-replayed'}, 'true', 'quoted key with a space replays');
    is($t->effects(uri => '/space'), 1, 'quoted key with a space: one effect');
    # surrounding whitespace is not part of the key
    my $c = $t->http(POST => '/space', key => "  \"$base with space\"\t", json => { a => 1 });
    is($c->{headers}{'idempotent-replayed'}, 'true', 'surrounding whitespace ignored');
}

# ---- NUL, CR, LF
{
    my $k = $t->key('ctl');
    for my $c ([ 'NUL', "$k\x00x" ], [ 'NUL at the end', "$k\x00" ], [ 'bare CR', "$k\rx" ],
               [ 'CRLF obs-fold', "$k\r\n x" ], [ 'quoted NUL', "\"$k\x00\"" ]) {
        my ($what, $v) = @$c;
        my $uri = '/ctl/' . ++$n;
        my ($r) = $t->parse_responses($t->raw($t->request_bytes(POST => $uri, key => $v, json => { a => 1 })));
        is($r && $r->{status}, 400, "key with $what: 400") or diag($r ? $t->show($r) : 'no response');
        is($t->effects(uri => $uri), 0, "key with $what: no effect");
    }
    # LF alone ends the header line: the rest is another (bogus) header line
    my $uri = '/ctl/lf';
    my ($r) = $t->parse_responses($t->raw($t->request_bytes(POST => $uri, key => "$k\nX-Other: 1", json => { a => 1 })));
    ok($r && ($r->{status} == 201 || $r->{status} == 400), "key with LF: split by HTTP ($r->{status})");
    my @e = $t->effect_list(uri => $uri);
    ok(@e <= 1 && (!@e || $e[0]{key} eq $k), 'key with LF: at most one effect, with the part before the LF');
    is(scalar($t->redis_keys('*')) , scalar(grep { $_ =~ $RECORD } $t->redis_keys('*')), 'still only digest names');
}

$t->check_logs;
done_testing;
