#!/usr/bin/perl
# How the upstream's behaviour decides the record:
#   - it did the work, then dropped / reset the connection, timed out or sent
#     a truncated body (also chunked, cut before its last chunk) -> unknown: retries get 409 outcome-unknown, never a
#     second execution; the status endpoint says unknown; an operator's
#     release lets the next retry execute;
#   - it could not be reached (connect refused) -> released: the retry
#     executes once it is back;
#   - 429 / 503 (idempotency_release_statuses) -> released; other finals
#     (500, the upstream's own 502, 4xx) are stored and replayed;
#   - a response above idempotency_store_max -> completed without body,
#     retries get 409 response-not-stored.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use Idem::Test;

my $t = Idem::Test->new;
$t->start_stack(<<'EOF');
server {
    listen 127.0.0.1:%%PORT%%;
    proxy_ignore_client_abort on;
    location / {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_scope $http_authorization;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /h11/ {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_scope $http_authorization;
        proxy_http_version 1.1;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /slow/ {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_scope $http_authorization;
        proxy_read_timeout 500ms;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /off/ {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_release_statuses off;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /custom/ {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_release_statuses 409;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /small/ {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_store_max 1k;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /status {
        idempotency_redis %%REDIS%%;
        idempotency_scope $http_authorization;
        idempotency_status;
    }
    location = /admin {
        idempotency_redis %%REDIS%%;
        idempotency_scope $http_authorization;
        idempotency_admin on;
    }
}
EOF

my $AUTH = "Bearer outcomes-$$";

sub json_of { my $r = shift; my $j = eval { JSON::PP->new->decode($r->{content}) }; ref $j eq 'HASH' ? $j : {} }
sub produced { my @r = $t->upstream_responses(key => $_[0]); $r[-1] }

# The request is sent, the upstream acts, the response never arrives whole.
sub unknown_case {
    my ($what, $path, $hdr, $want_status) = @_;
    my $k = $t->key('unk');
    my @req = (key => $k, json => { case => $what }, headers => [ Authorization => $AUTH ]);
    my $r1 = $t->http(POST => $path, @req, headers => [ Authorization => $AUTH, @$hdr ], timeout => 5);
    if (defined $want_status) {
        is($r1->{status}, $want_status, "$what: first attempt answered $want_status") or diag($t->show($r1));
    } else {
        ok($r1->{status} == 599 || ($r1->{content} // '') ne '', "$what: first attempt got a broken answer")
            or diag($t->show($r1));
    }
    is($t->effects(key => $k), 1, "$what: the upstream did the work once");
    my $rec;
    $t->wait_for(sub { $rec = $t->record($k, $AUTH); $rec && $rec->{state} ne 'in_progress' }, 5);
    is($rec && $rec->{state}, 'unknown', "$what: record state unknown");
    for my $n (1 .. 2) {
        my $r = $t->http(POST => $path, @req);
        $t->is_problem($r, 409, 'outcome-unknown', key => $k, state => 'unknown',
            operation_id => 1, retry_after => 0, name => "$what: retry $n -> 409 outcome-unknown, no Retry-After");
    }
    is($t->effects(key => $k), 1, "$what: retries never executed (1 effect)");
    return ($k, \@req);
}

# ---- upstream drops the connection after doing the work
{
    my ($k, $req) = unknown_case('upstream closes unanswered', '/pay', [ 'X-Drop' => 1 ], 502);

    my $s = $t->http(GET => '/status', key => $k, headers => [ Authorization => $AUTH ]);
    is($s->{status}, 200, 'status endpoint answers 200') or diag($t->show($s));
    like($s->{headers}{'content-type'} // '', qr{^application/json\b}, 'status: application/json');
    my $sj = json_of($s);
    is($sj->{state}, 'unknown', 'status endpoint says unknown');
    is($sj->{idempotency_key}, $k, 'status: idempotency_key');
    like($sj->{operation_id} // '', qr/^[0-9a-f]{32}$/, 'status: operation_id');
    ok(exists $sj->{response_status} && !defined $sj->{response_status}, 'status: response_status null');
    ok(exists $sj->{completed_at} && !defined $sj->{completed_at}, 'status: completed_at null');

    my $a = $t->http(POST => '/admin?action=release', key => $k, headers => [ Authorization => $AUTH ]);
    is($a->{status}, 200, 'admin release: 200') or diag($t->show($a));
    is(json_of($a)->{result}, 'released', 'admin release: result released');
    is(json_of($a)->{idempotency_key}, $k, 'admin release: idempotency_key');
    is($t->record($k, $AUTH), undef, 'admin release: the record is gone');

    my $r = $t->http(POST => '/pay', @$req);
    is($r->{status}, 201, 'after release: the retry executes') or diag($t->show($r));
    ok(!exists $r->{headers}{'idempotent-replayed'}, 'after release: not a replay');
    my @e = $t->effect_list(key => $k);
    is(scalar(@e), 2, 'after release: 2 effects in total');
    is($r->{headers}{'x-upstream-seq'}, $e[1] && $e[1]{n}, 'the second effect is the retry\'s');
    my $r2 = $t->http(POST => '/pay', @$req);
    is($r2->{headers}{'idempotent-replayed'}, 'true', 'the next retry replays the new result');
    is($r2->{content}, $r->{content}, 'replay of the retry\'s body');
    is($t->effects(key => $k), 2, 'still 2 effects');
}

# ---- the other ways to lose the response
unknown_case('upstream resets (RST)', '/pay', [ 'X-Drop' => 'rst' ], 502);
unknown_case('upstream read timeout', '/slow/pay', [ 'X-Delay' => 1.5 ], 504);
unknown_case('body shorter than Content-Length', '/pay', [ 'X-Truncate' => 10 ], undef);
# chunked: the upstream closes before the last (zero-size) chunk, so nginx
# never sees the end of the body (no last_buf): the record must not be
# completed with the part that came
unknown_case('chunked body cut before its last chunk', '/h11/pay',
    [ 'X-Chunked' => 1, 'X-Truncate' => 20 ], undef);

# ---- a whole chunked body is recorded whole, and replayed byte for byte
{
    my $k = $t->key('chunked');
    my @req = (key => $k, json => { case => 'chunked' }, headers => [ Authorization => $AUTH ]);
    my $r1 = $t->http(POST => '/h11/pay', @req, headers => [ Authorization => $AUTH, 'X-Chunked' => 1 ]);
    is($r1->{status}, 201, 'chunked answer: 201') or diag($t->show($r1));
    ok(($r1->{headers}{'transfer-encoding'} // '') =~ /chunked/ && !exists $r1->{headers}{'content-length'},
        'chunked answer: it came without a length (nginx passes it on chunked)') or diag($t->show($r1));
    is($t->sha256($r1->{content}), (produced($k) // {})->{sha}, 'chunked answer: the client got the whole body');
    ok($t->wait_state($k, $AUTH, 'completed'),
        'chunked answer: record completed');
    is(($t->record($k, $AUTH) // {})->{body}, $r1->{content}, 'chunked answer: the stored body is the whole body');
    my $r2 = $t->http(POST => '/h11/pay', @req);
    is($r2->{headers}{'idempotent-replayed'}, 'true', 'chunked answer: the retry replays');
    is($r2->{content}, $r1->{content}, 'chunked answer: replayed byte for byte');
    is($t->effects(key => $k), 1, 'chunked answer: one effect');
}

# ---- upstream down: connect refused -> 502, released; back -> executes once
{
    my $k = $t->key('down');
    my @req = (key => $k, json => { case => 'down' }, headers => [ Authorization => $AUTH ]);
    $t->stop_upstream;
    my $r1 = $t->http(POST => '/pay', @req);
    is($r1->{status}, 502, 'upstream down: nginx 502') or diag($t->show($r1));
    ok(!$t->problem($r1), 'upstream down: nginx\'s own 502, not a problem document');
    my $left = $t->record($k, $AUTH);
    note("the release was still on its way when the 502 arrived: ", explain($left)) if $left;
    ok($t->wait_for(sub { !$t->record($k, $AUTH) }, 3), "upstream down: the claim was released");
    my $r2 = $t->http(POST => '/pay', @req);
    is($r2->{status}, 502, 'upstream still down: 502 again (not in-progress/unknown)');
    is($t->effects(key => $k), 0, 'upstream down: no effect');

    $t->start_upstream;
    my $r3 = $t->http(POST => '/pay', @req);
    is($r3->{status}, 201, 'upstream back: the retry executes') or diag($t->show($r3));
    ok(!exists $r3->{headers}{'idempotent-replayed'}, 'upstream back: not a replay');
    is($t->effects(key => $k), 1, 'upstream back: exactly one effect');
    my $r4 = $t->http(POST => '/pay', @req);
    is($r4->{headers}{'idempotent-replayed'}, 'true', 'then replayed');
    is($r4->{content}, $r3->{content}, 'replay body identical');
    is($t->effects(key => $k), 1, 'still one effect');
}

# ---- release statuses: 429 and 503 by default
for my $st (429, 503) {
    my $k = $t->key("rel$st");
    my @req = (key => $k, json => { case => "release $st" }, headers => [ Authorization => $AUTH ]);
    my $r1 = $t->http(POST => '/pay', @req, headers => [ Authorization => $AUTH, 'X-Status' => $st ]);
    is($r1->{status}, $st, "$st: passed to the client");
    ok(!exists $r1->{headers}{'idempotent-replayed'}, "$st: not a replay");
    # the release is sent as the answer goes out; its reply may come later.
    # What stays is a marker for the duplicates that waited: no claim, and
    # the upstream's status.
    my $m;
    ok($t->wait_for(sub { $m = $t->record($k, $AUTH); $m && $m->{state} eq 'released' }, 5),
        "$st: released (a marker, no live record)") or diag(explain $m);
    is($m && $m->{status}, $st, "$st: the marker keeps the upstream's status");
    ok($m && $m->{pttl} > 0 && $m->{pttl} <= 60_000 + 1000,
        "$st: the marker lives about a lease") or diag($m && $m->{pttl});
    my $r2 = $t->http(POST => '/pay', @req, headers => [ Authorization => $AUTH, 'X-Status' => $st ]);
    is($r2->{status}, $st, "$st: the retry executes again");
    ok(!exists $r2->{headers}{'idempotent-replayed'}, "$st: the retry is not a replay");
    is($t->effects(key => $k), 2, "$st: 2 effects (each attempt executed)");
    my $r3 = $t->http(POST => '/pay', @req);
    is($r3->{status}, 201, "$st: once the upstream accepts, the retry executes");
    is($t->effects(key => $k), 3, "$st: 3 effects");
    my $r4 = $t->http(POST => '/pay', @req, headers => [ Authorization => $AUTH, 'X-Status' => $st ]);
    is($r4->{status}, 201, "$st: after the success, replay (the upstream is not asked)");
    is($r4->{headers}{'idempotent-replayed'}, 'true', "$st: replay marked");
    is($t->effects(key => $k), 3, "$st: still 3 effects");
}

# ---- 204 and 304 come without a body and without Content-Length: the
# replay adds none (the headers are the original's)
for my $st (204, 304) {
    my $k = $t->key("nobody$st");
    my @req = (key => $k, json => { case => "bodiless $st" });
    my @h = (headers => [ Authorization => $AUTH, 'X-Status' => $st ]);
    my $r1 = $t->http(POST => '/pay', @req, @h);
    is($r1->{status}, $st, "$st: passed to the client");
    ok(!exists $r1->{headers}{'content-length'}, "$st: the original has no Content-Length")
        or diag($t->show($r1));
    ok($t->wait_state($k, $AUTH, 'completed'), "$st: recorded");
    my $r2 = $t->http(POST => '/pay', @req, @h);
    is($r2->{status}, $st, "$st: the retry gets the stored $st");
    is($r2->{headers}{'idempotent-replayed'}, 'true', "$st: replayed");
    ok(!exists $r2->{headers}{'content-length'}, "$st: the replay has no Content-Length either")
        or diag($t->show($r2));
    is($r2->{content}, '', "$st: and no body");
    my %skip = map { $_ => 1 } qw(date idempotent-replayed);
    is_deeply([ grep { !$skip{$_} } sort keys %{ $r2->{headers} } ],
              [ grep { !$skip{$_} } sort keys %{ $r1->{headers} } ],
        "$st: the replay has the original's header names");
    is($t->effects(key => $k), 1, "$st: one effect");
}

# ---- other final statuses are stored and replayed
for my $c ([ '/pay', 500 ], [ '/pay', 502 ], [ '/pay', 404 ], [ '/off/pay', 503 ],
           [ '/off/pay', 429 ], [ '/custom/pay', 429 ]) {
    my ($path, $st) = @$c;
    my $k = $t->key("st$st");
    my @req = (key => $k, json => { case => "$path $st" }, headers => [ Authorization => $AUTH ]);
    my $r1 = $t->http(POST => $path, @req, headers => [ Authorization => $AUTH, 'X-Status' => $st ]);
    is($r1->{status}, $st, "$path $st: passed to the client");
    my $r2 = $t->http(POST => $path, @req);
    is($r2->{status}, $st, "$path $st: the retry gets the stored $st") or diag($t->show($r2));
    is($r2->{headers}{'idempotent-replayed'}, 'true', "$path $st: replayed");
    is($r2->{content}, $r1->{content}, "$path $st: replayed body identical");
    is($t->sha256($r2->{content}), (produced($k) // {})->{sha}, "$path $st: = the upstream's body");
    is($t->effects(key => $k), 1, "$path $st: one effect");
}

# ---- a custom release list: 409 releases, 429 (above) does not
{
    my $k = $t->key('custom409');
    my @req = (key => $k, json => { case => 'custom 409' });
    my $r1 = $t->http(POST => '/custom/pay', @req, headers => [ 'X-Status' => 409 ]);
    is($r1->{status}, 409, 'custom list: upstream 409 passed');
    my $r2 = $t->http(POST => '/custom/pay', @req);
    is($r2->{status}, 201, 'custom list: 409 released, the retry executes');
    ok(!exists $r2->{headers}{'idempotent-replayed'}, 'custom list: not a replay');
    is($t->effects(key => $k), 2, 'custom list: 2 effects');
}

# ---- larger than idempotency_store_max: completed without body
{
    my $k = $t->key('big');
    my @req = (key => $k, json => { case => 'big' });
    my $r1 = $t->http(POST => '/small/things', @req, headers => [ 'X-Body-Size' => 4000 ]);
    is($r1->{status}, 201, 'big response: passed to the client');
    ok($r1->{content} eq $t->upstream_body(4000), 'big response: the whole body reaches the first client');
    my $r2 = $t->http(POST => '/small/things', @req, headers => [ 'X-Body-Size' => 4000 ]);
    $t->is_problem($r2, 409, 'response-not-stored', key => $k, state => 'completed', operation_id => 1,
        name => 'retry of a too-large response -> 409 response-not-stored');
    my $p = $t->problem($r2) // {};
    is($p->{response_status}, 201, 'response-not-stored: response_status 201');
    is($p->{location}, $r1->{headers}{location}, 'response-not-stored: location of the original');
    is($t->effects(key => $k), 1, 'big response: one effect');
    my $rec = $t->record($k);
    is($rec && $rec->{state}, 'completed', 'big response: record completed');
    is($rec && $rec->{stored}, '0', 'big response: stored=0');

    my $k2 = $t->key('fits');
    my $a = $t->http(POST => '/small/things', key => $k2, json => {}, headers => [ 'X-Body-Size' => 1024 ]);
    my $b = $t->http(POST => '/small/things', key => $k2, json => {});
    is($b->{status}, 201, 'exactly store_max: replayed');
    is($b->{headers}{'idempotent-replayed'}, 'true', 'exactly store_max: marked replayed');
    ok($b->{content} eq $t->upstream_body(1024), 'exactly store_max: whole body replayed');
    is($t->effects(key => $k2), 1, 'exactly store_max: one effect');
}

$t->check_logs;
done_testing;
