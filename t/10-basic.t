#!/usr/bin/perl
# First request passes through; a retry replays the stored answer byte for
# byte, with Idempotent-Replayed: true, and the upstream runs once.

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
    location / {
        idempotency on;
        idempotency_redis %%REDIS%%;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

my $key = $t->key('basic');
my @req = (key => $key, json => { amount => 100, currency => 'EUR' },
    headers => [ 'X-Reply-Header' => 'X-Custom: kept', 'X-Reply-Header' => 'Set-Cookie: sid=secret',
                 'X-Reply-Header' => 'Keep-Alive: timeout=5' ]);

my $first = $t->http(POST => '/payments', @req);
is($first->{status}, 201, 'first request passes through') or diag($t->show($first));
ok(!exists $first->{headers}{'idempotent-replayed'}, 'first answer is not marked replayed');
like($first->{headers}{location} // '', qr{^/things/\d+$}, 'upstream Location');
is($first->{headers}{'x-custom'}, 'kept', 'upstream header reaches the client');
is($t->effects, 1, 'one effect after the first request');
is($t->effects(key => $key), 1, 'the upstream saw the key header');

for my $n (1 .. 2) {
    my $r = $t->http(POST => '/payments', @req);
    is($r->{status}, 201, "retry $n: same status") or diag($t->show($r));
    is($r->{headers}{'idempotent-replayed'}, 'true', "retry $n: Idempotent-Replayed: true");
    is($r->{content}, $first->{content}, "retry $n: body byte-identical");
    is($r->{headers}{location}, $first->{headers}{location}, "retry $n: Location identical");
    is($r->{headers}{'content-type'}, $first->{headers}{'content-type'},
        "retry $n: Content-Type identical");
    is($r->{headers}{'x-upstream-seq'}, $first->{headers}{'x-upstream-seq'},
        "retry $n: other upstream headers replayed");
    is($r->{headers}{'x-custom'}, 'kept', "retry $n: custom header replayed");
    ok(!exists $r->{headers}{'set-cookie'}, "retry $n: Set-Cookie is not stored by default");
    is($r->{headers}{'content-length'}, length($first->{content}),
        "retry $n: Content-Length matches the body");
}
is($t->effects, 1, 'still one effect after two retries');

# What the default idempotency_store_headers kept, as stored in Redis: the
# end-to-end headers, none of the excluded ones (the upstream sent
# Connection, Content-Length, Set-Cookie and Keep-Alive; nginx adds Date and
# Server; Transfer-Encoding when it chunks).
{
    my $hdr = ($t->record($key) // {})->{hdr} // '';
    my (@names, $i);
    while ($hdr =~ /\G(\d+):/gc) {
        my $v = substr($hdr, pos($hdr), $1);
        pos($hdr) += $1;
        last unless $hdr =~ /\G,/gc;
        push @names, lc $v if $i++ % 2 == 0;
    }
    is(pos($hdr) // 0, length $hdr, 'stored headers: well-formed netstrings');
    my %have = map { $_ => 1 } @names;
    ok($have{$_}, "stored headers include $_") for qw(location content-type x-custom x-upstream-seq);
    ok(!$have{$_}, "stored headers exclude $_")
        for qw(date server connection keep-alive transfer-encoding content-length set-cookie);
}

# The record lives in Redis under a digest, never under the raw key.
my @keys = $t->redis_keys('*');
ok(scalar(grep { /^idem:\{[0-9a-f]{32}\}:r$/ } @keys) == 1, 'one record idem:{<32 hex>}:r')
    or diag(explain \@keys);
ok(!grep({ index($_, $key) >= 0 } @keys), 'raw key not used in Redis key names');
my ($rec) = grep { /^idem:\{[0-9a-f]{32}\}:r$/ } @keys;
if ($rec) {
    my $ttl = $t->redis('TTL', $rec);
    ok(!ref $ttl && $ttl > 23 * 3600 && $ttl <= 24 * 3600, 'record TTL is the 24h default')
        or diag("TTL $ttl");
    is($t->redis('TYPE', $rec), 'string', 'the record is one string (layout 2)');
    my $h = $t->decode_record($t->redis('GET', $rec)) // {};
    is($h->{state}, 'completed', 'record state completed');
    is($h->{status}, 201, 'the record holds the status');
    is($h->{body}, $first->{content}, 'the record holds the body');
    ok(!defined $h->{owner}, 'a completed record names no owner');
}

# A second, unrelated key executes on its own.
my $key2 = $t->key('basic');
my $other = $t->http(POST => '/payments', key => $key2, json => { amount => 100, currency => 'EUR' });
is($other->{status}, 201, 'another key executes');
ok(!exists $other->{headers}{'idempotent-replayed'}, 'another key is not a replay');
isnt($other->{headers}{location}, $first->{headers}{location}, 'another key gets its own result');
is($t->effects, 2, 'two effects: one per key');

# Stored non-2xx final answers replay too (only 429/503 release by default).
my $key3 = $t->key('basic');
my $e422 = $t->http(POST => '/payments', key => $key3, body => 'x', headers => [ 'X-Status' => 422 ]);
is($e422->{status}, 422, 'upstream 422 passes through');
my $r422 = $t->http(POST => '/payments', key => $key3, body => 'x', headers => [ 'X-Status' => 422 ]);
is($r422->{status}, 422, 'upstream 422 replayed');
is($r422->{headers}{'idempotent-replayed'}, 'true', 'replayed 422 is marked');
is($r422->{content}, $e422->{content}, 'replayed 422 body identical');
is($t->effects(key => $key3), 1, 'a stored 422 does not execute again');

$t->check_logs;
done_testing;
