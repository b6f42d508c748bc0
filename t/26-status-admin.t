#!/usr/bin/perl
# The status endpoint (idempotency_status) per state -- in_progress during a
# slow request, completed, unknown, none (404) -- and only in the caller's own
# scope; the admin endpoint (idempotency_admin): release / complete of unknown
# records, refusal for completed records and live claims, bad requests.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $t = Idem::Test->new;
$t->start_stack(<<'EOF');
server {
    listen 127.0.0.1:%%PORT%%;
    location / {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_scope $http_authorization;
        proxy_ignore_client_abort on;
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
    # the operator sends the client's Authorization value in another header
    location = /ops/admin {
        allow 127.0.0.1;
        deny all;
        idempotency_redis %%REDIS%%;
        idempotency_scope $http_x_client_authorization;
        idempotency_admin on;
    }
}
EOF

my $ALICE = "Bearer alice-$$";
my $BOB   = "Bearer bob-$$";
my $RFC3339 = qr/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)$/;

sub json_of { my $r = shift; my $j = eval { JSON::PP->new->decode($r->{content}) }; ref $j eq 'HASH' ? $j : undef }
sub status_of {
    my ($k, $auth) = @_;
    return $t->http(GET => '/status', key => $k, defined $auth ? (headers => [ Authorization => $auth ]) : ());
}
sub admin {
    my ($query, $k, $auth, $method) = @_;
    return $t->http($method // 'POST', "/admin?$query", key => $k,
        defined $auth ? (headers => [ Authorization => $auth ]) : ());
}
# (fp, op) that the access log recorded for the execution of $k
sub logged_ids {
    my ($k) = @_;
    my ($line) = grep { /outcome=executed key="\Q$k\E"/ } $t->access_log;
    return ($line // '') =~ /fp=([0-9a-f]{64}) op=([0-9a-f]{32})/ ? ($1, $2) : ();
}

sub status_doc_ok {
    my ($r, $k, $state, $what) = @_;
    is($r->{status}, 200, "$what: 200") or diag($t->show($r));
    like($r->{headers}{'content-type'} // '', qr{^application/json\b}, "$what: application/json");
    like($r->{headers}{'cache-control'} // '', qr/\bno-store\b/, "$what: Cache-Control no-store");
    my $j = json_of($r) // {};
    is_deeply([ sort keys %$j ],
        [ sort qw(idempotency_key operation_id state created_at completed_at response_status fingerprint) ],
        "$what: exactly the documented members");
    is($j->{idempotency_key}, $k, "$what: idempotency_key");
    is($j->{state}, $state, "$what: state $state");
    like($j->{operation_id} // '', qr/^[0-9a-f]{32}$/, "$what: operation_id 32 hex");
    like($j->{fingerprint} // '', qr/^[0-9a-f]{64}$/, "$what: fingerprint 64 hex");
    like($j->{created_at} // '', $RFC3339, "$what: created_at RFC 3339");
    return $j;
}

# ---- in_progress during a slow request, then completed
my $k = $t->key('status');
my @req = (key => $k, json => { pay => 1 }, headers => [ Authorization => $ALICE ]);
{
    my $bg = $t->http_bg(POST => '/pay', @req, headers => [ Authorization => $ALICE, 'X-Delay' => 1.5 ]);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'slow request reached the upstream');
    my $j = status_doc_ok(status_of($k, $ALICE), $k, 'in_progress', 'status while in flight');
    ok(exists $j->{completed_at} && !defined $j->{completed_at}, 'in flight: completed_at null');
    ok(exists $j->{response_status} && !defined $j->{response_status}, 'in flight: response_status null');
    my $dup = $t->http(POST => '/pay', @req);
    is(($t->problem($dup) // {})->{operation_id}, $j->{operation_id},
        'in flight: operation_id = the one of the in-progress problem');

    my $other = status_of($k, $BOB);
    $t->is_problem($other, 404, 'not-found', key => $k, name => 'in flight, another scope -> 404 not-found');
    $t->is_problem(status_of($k), 404, 'not-found', name => 'in flight, no Authorization -> 404 not-found');

    my $first = $bg->result(10);
    is($first && $first->{status}, 201, 'the slow request completes');
    my $c = status_doc_ok(status_of($k, $ALICE), $k, 'completed', 'status after completion');
    is($c->{response_status}, 201, 'completed: response_status 201');
    like($c->{completed_at} // '', $RFC3339, 'completed: completed_at RFC 3339');
    ok(($c->{completed_at} // '') ge ($c->{created_at} // 'z'), 'completed_at is not before created_at');
    is($c->{operation_id}, $j->{operation_id}, 'completed: same operation_id');
    is($c->{fingerprint}, $j->{fingerprint}, 'completed: same fingerprint');
    my ($fp, $op) = logged_ids($k);
    is($c->{fingerprint}, $fp, 'fingerprint = $idempotency_fingerprint of the execution');
    is($c->{operation_id}, $op, 'operation_id = $idempotency_operation_id of the execution');
    my $s = status_of($k, $ALICE);
    unlike($s->{content}, qr/body_sha256|things/, 'the stored response is not shown');
    $t->is_problem(status_of($k, $BOB), 404, 'not-found', key => $k,
        name => 'completed, another scope -> 404 not-found');
    is($t->effects(key => $k), 1, 'status queries: one effect');
}

# ---- unknown
my $ku = $t->key('status-unknown');
my @requ = (key => $ku, json => { pay => 2 }, headers => [ Authorization => $ALICE ]);
{
    my $r = $t->http(POST => '/pay', @requ, headers => [ Authorization => $ALICE, 'X-Drop' => 1 ]);
    is($r->{status}, 502, 'dropped: 502');
    my $j;
    $t->wait_for(sub { $j = json_of(status_of($ku, $ALICE)) // {}; ($j->{state} // '') eq 'unknown' }, 5);
    status_doc_ok(status_of($ku, $ALICE), $ku, 'unknown', 'status of an unknown record');
    $t->is_problem(status_of($ku, $BOB), 404, 'not-found', name => 'unknown, another scope -> 404');
}

# ---- none, bad requests, methods
{
    my $kn = $t->key('status-none');
    $t->is_problem(status_of($kn, $ALICE), 404, 'not-found', key => $kn, name => 'never used -> 404 not-found');
    $t->is_problem($t->http(GET => '/status', headers => [ Authorization => $ALICE ]), 400, 'key-missing',
        name => 'status without a key -> 400 key-missing');
    $t->is_problem($t->http(GET => '/status', key => '"unterminated', headers => [ Authorization => $ALICE ]),
        400, 'key-malformed', name => 'status with a malformed key -> 400 key-malformed');
    my $p = $t->http(POST => '/status', key => $k, headers => [ Authorization => $ALICE ]);
    is($p->{status}, 405, 'POST on the status endpoint -> 405');
    my $h = $t->http(HEAD => '/status', key => $k, headers => [ Authorization => $ALICE ]);
    is($h->{status}, 200, 'HEAD on the status endpoint -> 200');
    is($h->{content}, '', 'HEAD: no body');

    # released (429): no record
    my $kr = $t->key('status-rel');
    $t->http(POST => '/pay', key => $kr, json => {}, headers => [ Authorization => $ALICE, 'X-Status' => 429 ]);
    ok($t->wait_for(sub { status_of($kr, $ALICE)->{status} == 404 }, 3), 'released (429) -> status 404');
}

# ---- admin endpoint
{
    my $kn = $t->key('admin-none');
    $t->is_problem(admin('action=release', $kn, $ALICE), 404, 'not-found', name => 'admin: no record -> 404');
    my $c = admin('action=release', $k, $ALICE);
    $t->is_problem($c, 409, 'not-resolvable', state => 'completed',
        name => 'admin release of a completed record -> 409 not-resolvable');
    $t->is_problem(admin('action=complete&status=200', $k, $ALICE), 409, 'not-resolvable', state => 'completed',
        name => 'admin complete of a completed record -> 409 not-resolvable');
    $t->is_problem(admin('action=release', $ku, $BOB), 404, 'not-found',
        name => 'admin in another scope -> 404');
    for my $q ('action=delete', 'action=complete', 'action=complete&status=99', 'action=complete&status=600',
               'action=complete&status=abc', '',
               # a repeated parameter is refused, never read as its first value
               'action=complete&status=201&status=500', 'action=complete&status=500&status=201',
               'action=release&action=complete&status=201', 'action=release&action=release') {
        # the problem names the key that was sent (it is valid), not null
        $t->is_problem(admin($q, $ku, $ALICE), 400, 'bad-admin-request', key => $ku,
            name => "admin '?$q' -> 400 bad-admin-request naming the key");
    }
    is(admin('action=release', $ku, $ALICE, 'GET')->{status}, 405, 'GET on the admin endpoint -> 405');
    is(status_of($ku, $ALICE)->{status}, 200, 'the refused/bad admin calls left the unknown record alone');
    is((json_of(status_of($ku, $ALICE)) // {})->{state}, 'unknown', 'still unknown');

    # live claim
    my $kl = $t->key('admin-live');
    my $bg = $t->http_bg(POST => '/pay', key => $kl, json => {}, headers => [ Authorization => $ALICE, 'X-Delay' => 1 ]);
    ok($t->wait_for(sub { $t->effects(key => $kl) == 1 }, 5), 'live claim reached the upstream');
    $t->is_problem(admin('action=complete&status=201', $kl, $ALICE), 409, 'not-resolvable', state => 'in_progress',
        name => 'admin on a live claim -> 409 not-resolvable (in_progress)');
    is(($bg->result(10) // {})->{status}, 201, 'the live claim completes normally');

    # complete an unknown record through the operator location
    my $a = $t->http(POST => '/ops/admin?action=complete&status=202', key => $ku,
        headers => [ 'X-Client-Authorization' => $ALICE ]);
    is($a->{status}, 200, 'operator complete (client scope in X-Client-Authorization): 200') or diag($t->show($a));
    is_deeply(json_of($a), { idempotency_key => $ku, result => 'completed' }, 'admin complete: the documented body');
    my $s = status_doc_ok(status_of($ku, $ALICE), $ku, 'completed', 'status after admin complete');
    is($s->{response_status}, 202, 'after admin complete: response_status 202');
    my $rr = $t->http(POST => '/pay', @requ);
    is($rr->{status}, 202, 'after admin complete: retries get 202');
    is($rr->{headers}{'idempotent-replayed'}, 'true', 'after admin complete: replayed');
    is($rr->{content}, '', 'after admin complete: empty body');
    is($t->effects(key => $ku), 1, 'after admin complete: still one effect');
    $t->is_problem(admin('action=release', $ku, $ALICE), 409, 'not-resolvable', state => 'completed',
        name => 'an admin-completed record cannot be released');

    # release an unknown record
    my $kx = $t->key('admin-release');
    my @rx = (key => $kx, json => { pay => 3 }, headers => [ Authorization => $BOB ]);
    $t->http(POST => '/pay', @rx, headers => [ Authorization => $BOB, 'X-Drop' => 1 ]);
    ok($t->wait_for(sub { ((json_of(status_of($kx, $BOB)) // {})->{state} // '') eq 'unknown' }, 5),
        'Bob\'s dropped request: unknown');
    $t->is_problem(admin('action=release', $kx, $ALICE), 404, 'not-found', name => 'Alice cannot release Bob\'s record');
    my $rel = admin('action=release', $kx, $BOB);
    is($rel->{status}, 200, 'admin release: 200');
    is_deeply(json_of($rel), { idempotency_key => $kx, result => 'released' }, 'admin release: the documented body');
    $t->is_problem(status_of($kx, $BOB), 404, 'not-found', name => 'after release: status 404');
    my $again = admin('action=release', $kx, $BOB);
    $t->is_problem($again, 404, 'not-found', name => 'release twice -> 404');
    my $r = $t->http(POST => '/pay', @rx);
    is($r->{status}, 201, 'after release: the retry executes');
    is($t->effects(key => $kx), 2, 'after release: 2 effects (the second by the retry)');
    like($t->error_log, qr/\[notice\].*(?:releas|resolv)/i, 'admin resolutions are logged at notice');
}

# ---- Redis down: the endpoints answer 503
$t->stop_redis;
$t->is_problem(status_of($k, $ALICE), 503, 'store-unavailable', name => 'status with Redis down -> 503');
$t->is_problem(admin('action=release', $ku, $ALICE), 503, 'store-unavailable', name => 'admin with Redis down -> 503');
$t->start_redis;

$t->check_logs;
done_testing;
