#!/usr/bin/perl
# Guarded locations fail closed (issue 35): a location with
# idempotency_confirm, idempotency_unique or idempotency_lock cannot be
# stepped around by what a client omits or relabels. One block per row of
# the issue's table (1-10, 12, 17), each with its upstream effect count. The
# counting upstream parses a JSON body whatever its Content-Type, as many
# frameworks do (t/lib/upstream.pl, "json"), so a relabelled body is one the
# upstream acts on.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use MIME::Base64 qw(encode_base64url);
use Digest::SHA qw(hmac_sha256);
use Time::HiRes qw(sleep time);
use Idem::Test;

my $t = Idem::Test->new;
my $p = $t->prefix;

my $HS = 'g' x 40;
open my $fh, '>', "$p/hs.key" or die; print $fh $HS; close $fh;

# a port nothing listens on: Redis unreachable for /open-*
my $DEAD = $t->free_port;
my $KEYS = "idempotency_confirm_key hs256 $p/hs.key kid=hs;";

$t->start_stack(<<"EOF", log_format => 'G|$idempotency_key|$idempotency_outcome');
idempotency_json_var \$amount /amount;
idempotency_json_var \$source_event_id /source_event_id;
idempotency_json_var \$environment /environment;

map \$amount \$needs_approval {
    default        0;
    "~^[0-9]{4,}\$"  1;
}

server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;

    location /pay {
        idempotency on;
        idempotency_confirm on;
        $KEYS
        proxy_pass http://%%UPSTREAM%%;
    }
    location /mapped {
        idempotency on;
        idempotency_confirm \$needs_approval;
        $KEYS
        proxy_pass http://%%UPSTREAM%%;
    }
    location /events {
        idempotency on;
        idempotency_unique ev:\$source_event_id;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /legacy-events {
        idempotency on;
        idempotency_unique ev:\$source_event_id;
        idempotency_json_types text/json;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /deploy {
        idempotency on;
        idempotency_lock deploy:\$environment;
        proxy_ignore_client_abort on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /deploy-optional {
        idempotency on;
        idempotency_lock deploy:\$environment optional;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /orders {
        idempotency on;
        idempotency_unique \$source_event_id;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /refunds {
        idempotency on;
        idempotency_unique \$source_event_id;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /ledger-a {
        idempotency on;
        idempotency_unique \$source_event_id shared=ledger;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /ledger-b {
        idempotency on;
        idempotency_unique \$source_event_id shared=ledger;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /audited-a {
        idempotency on;
        idempotency_audit on;
        idempotency_audit_stream idem:guards;
        idempotency_unique \$source_event_id shared=audited;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /audited-b {
        idempotency on;
        idempotency_audit on;
        idempotency_audit_stream idem:guards;
        idempotency_unique \$source_event_id shared=audited;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /open-pay {
        idempotency on;
        idempotency_redis 127.0.0.1:$DEAD timeout=300ms;
        idempotency_store_failure open;
        idempotency_confirm on;
        $KEYS
        proxy_pass http://%%UPSTREAM%%;
    }
    location /open-events {
        idempotency on;
        idempotency_redis 127.0.0.1:$DEAD timeout=300ms;
        idempotency_store_failure open;
        idempotency_unique ev:\$source_event_id;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /open-plain {
        idempotency on;
        idempotency_redis 127.0.0.1:$DEAD timeout=300ms;
        idempotency_store_failure open;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /approve {
        idempotency_approve;
    }
}
EOF

my $JS = JSON::PP->new->canonical;

sub post {
    my ($path, $key, $body, %o) = @_;
    return $t->http($o{method} // 'POST', $path, (defined $key ? (key => $key) : ()),
                    body => ref $body ? $JS->encode($body) : $body,
                    headers => [ (defined $o{ct} ? ('Content-Type' => $o{ct}) : ()),
                                 @{ $o{headers} // [] } ]);
}

sub token {
    my ($key, $fp, $sub) = @_;
    my $h = encode_base64url($JS->encode({ alg => 'HS256', typ => 'JWT', kid => 'hs' }));
    my $c = encode_base64url($JS->encode({ idk => $key, fp => $fp, sub => $sub // 'alice@example.com',
                                           iat => int(time), exp => int(time) + 300 }));
    return "$h.$c." . encode_base64url(hmac_sha256("$h.$c", $HS));
}

# ---- row 1: no Idempotency-Key where idempotency_confirm is on: refused,
# never executed unconfirmed (idempotency_required is implied)
{
    my $r = post('/pay', undef, { amount => 990000, to => 'Mallory Ltd' }, ct => 'application/json');
    $t->is_problem($r, 400, 'key-missing', name => 'row 1: confirm, no key: 400 key-missing');
    is($t->effects(uri => '/pay'), 0, 'row 1: 0 effects');
    $r = post('/events', undef, { source_event_id => 'e-nokey' }, ct => 'application/json');
    $t->is_problem($r, 400, 'key-missing', name => 'row 1: unique, no key: 400 key-missing');
    is($t->effects(uri => '/events'), 0, 'row 1: unique: 0 effects');
}

# ---- row 2: a write method the location does not handle: 405 with Allow
{
    my $k = $t->key('row2');
    my $r = post('/pay', $k, { amount => 990000, to => 'Mallory Ltd' }, ct => 'application/json',
                 method => 'DELETE');
    $t->is_problem($r, 405, 'method-not-allowed', name => 'row 2: DELETE /pay: 405 method-not-allowed');
    is($r->{headers}{allow}, 'GET, HEAD, OPTIONS, POST, PUT, PATCH',
       'row 2: Allow lists what a guarded location answers');
    for my $m (qw(PROPFIND LOCK)) {
        my $x = post('/pay', $t->key("row2-$m"), '{}', ct => 'application/json', method => $m);
        is($x->{status}, 405, "row 2: $m /pay: 405");
    }
    is($t->effects(uri => '/pay'), 0, 'row 2: 0 effects');
    my $g = $t->http(GET => '/pay');
    is($g->{status}, 201, 'row 2: GET passes (reads are not guarded)');
    is($t->effects(uri => '/pay', method => 'GET'), 1, 'row 2: the GET reached the upstream');
    is($t->effects(uri => '/pay', method => 'DELETE'), 0, 'row 2: no DELETE did');
}

# ---- row 3: idempotency_confirm by a map of $amount; the same JSON sent as
# text/plain (which the upstream parses all the same)
{
    my $body = { amount => 990000, to => 'Mallory Ltd' };
    for my $ct ('text/plain', 'application/x-www-form-urlencoded', undef) {
        my $k = $t->key('row3');
        my $r = post('/mapped', $k, $body, ct => $ct);
        $t->is_problem($r, 415, 'unsupported-media-type',
                       name => 'row 3: ' . ($ct // 'no Content-Type') . ': 415 unsupported-media-type');
        is($t->effects(key => $k), 0, 'row 3: ... 0 effects');
    }
    my $k = $t->key('row3-json');
    my $r = post('/mapped', $k, $body, ct => 'application/json');
    is($t->ptype($r), 'confirmation-required', 'row 3: as JSON: 428 confirmation-required');
    $k = $t->key('row3-json-charset');
    $r = post('/mapped', $k, $body, ct => 'application/json; charset=utf-8');
    is($t->ptype($r), 'confirmation-required', 'row 3: JSON with a charset: 428');
    $k = $t->key('row3-small');
    $r = post('/mapped', $k, { amount => 42 }, ct => 'application/merchant+json');
    is($r->{status}, 201, 'row 3: a +json type is JSON: a small amount executes');
    $k = $t->key('row3-empty');
    $r = post('/mapped', $k, '', ct => 'text/plain');
    is($r->{status}, 201, 'row 3: an empty body follows the value rules (no amount: no approval)');
    is($t->effects(uri => '/mapped'), 2, 'row 3: 2 effects in all (+json, empty), none unconfirmed');
}

# ---- row 4: idempotency_unique, one event sent twice as text/plain and
# text/json with two keys: at most one effect
{
    my $ev = { source_event_id => 'alert-row4', title => 'CPU high' };
    for my $ct ('text/plain', 'text/json') {
        for my $i (1, 2) {
            my $r = post('/events', $t->key("row4-$ct-$i"), $ev, ct => $ct);
            $t->is_problem($r, 415, 'unsupported-media-type', name => "row 4: $ct ($i): 415");
        }
    }
    is($t->effects(uri => '/events'), 0, 'row 4: 0 effects');
    # idempotency_json_types: the location reads text/json as JSON
    my @r = map { post('/legacy-events', $t->key("row4-legacy-$_"), $ev, ct => 'text/json') } 1, 2;
    is($r[0]{status}, 201, 'row 4: json_types text/json: the first executes');
    is($r[1]{headers}{'idempotent-reused'}, 'true', 'row 4: the second is reused');
    is($t->effects(uri => '/legacy-events'), 1, 'row 4: json_types: 1 effect');
}

# ---- row 5: a lock holder runs; another deployment without a key, or as
# text/plain, never reaches the upstream beside it
{
    my $body = { id => 'dep-1', environment => 'production' };
    my $k = $t->key('row5-holder');
    my $bg = $t->http_bg(POST => '/deploy', key => $k, body => $JS->encode($body), timeout => 20,
                         headers => [ 'Content-Type' => 'application/json', 'X-Delay' => 1.5 ]);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'row 5: the holder runs');
    my $other = { id => 'dep-2', environment => 'production' };
    my $x = post('/deploy', undef, $other, ct => 'application/json');
    $t->is_problem($x, 400, 'key-missing', name => 'row 5: no key: 400 key-missing');
    $x = post('/deploy', $t->key('row5-plain'), $other, ct => 'text/plain');
    $t->is_problem($x, 415, 'unsupported-media-type', name => 'row 5: text/plain: 415');
    $x = post('/deploy', $t->key('row5-json'), $other, ct => 'application/json');
    $t->is_problem($x, 409, 'lock-held', name => 'row 5: as JSON: 409 lock-held');
    my $r = $bg->result(10);
    is($r->{status}, 201, 'row 5: the holder completes');
    is($t->effects(uri => '/deploy'), 1, 'row 5: 1 effect: nothing ran beside the holder');
}

# ---- row 6: idempotency_lock deploy:$environment, body without
# environment: refused 400, unless the lock is optional
{
    my $k = $t->key('row6');
    my $x = post('/deploy', $k, { id => 'dep-3' }, ct => 'application/json');
    $t->is_problem($x, 400, 'lock-value-missing', name => 'row 6: no environment: 400 lock-value-missing');
    $x = post('/deploy', $t->key('row6-null'), { id => 'dep-3', environment => undef }, ct => 'application/json');
    $t->is_problem($x, 400, 'lock-value-missing', name => 'row 6: environment null: 400 lock-value-missing');
    $x = post('/deploy', $t->key('row6-empty'), '');
    $t->is_problem($x, 400, 'lock-value-missing', name => 'row 6: an empty body: 400 lock-value-missing');
    $x = post('/deploy', $t->key('row6-empty-json'), '', ct => 'application/json');
    $t->is_problem($x, 400, 'body-unreadable', name => 'row 6: an empty body said to be JSON: 400 body-unreadable');
    is($t->effects(uri => '/deploy', key => $k), 0, 'row 6: 0 effects');
    $x = post('/deploy-optional', $t->key('row6-opt'), { id => 'dep-3' }, ct => 'application/json');
    is($x->{status}, 201, 'row 6: "optional": no environment runs without a lock');
    is($t->effects(uri => '/deploy-optional'), 1, 'row 6: optional: 1 effect');
}

# ---- row 7: two different events whose source_event_id is null are two
# events, not one identity
{
    my @r = map { post('/events', $t->key("row7-$_"), { source_event_id => undef, title => "event $_" },
                       ct => 'application/json') } 1, 2;
    is($r[0]{status}, 201, 'row 7: the first null-id event executes');
    is($r[1]{status}, 201, 'row 7: the second executes too');
    ok(!$r[1]{headers}{'idempotent-reused'}, "row 7: ... not given the first's answer");
    is($t->effects(uri => '/events'), 2, 'row 7: 2 effects');
}

# ---- row 8: /orders and /refunds with the same event id: each location's
# identity is its own; shared=NAME: one identity, 409 from another location
{
    my $ev = { source_event_id => 'evt-row8', amount => 10 };
    my $o = post('/orders', $t->key('row8-order'), $ev, ct => 'application/json');
    is($o->{status}, 201, 'row 8: the order executes');
    my $f = post('/refunds', $t->key('row8-refund'), $ev, ct => 'application/json');
    is($f->{status}, 201, 'row 8: the refund with the same event id executes');
    ok(!$f->{headers}{'idempotent-reused'}, "row 8: ... never answered with the order's body");
    isnt($f->{content}, $o->{content}, "row 8: ... its body is its own");
    is($t->effects(uri => '/refunds'), 1, 'row 8: the refund ran: 1 effect');
    my $f2 = post('/refunds', $t->key('row8-refund-2'), $ev, ct => 'application/json');
    is($f2->{headers}{'idempotent-reused'}, 'true', 'row 8: a second refund of it is reused (its own location)');
    is($f2->{content}, $f->{content}, "row 8: ... with the refund's body");

    my $a = post('/ledger-a', $t->key('row8-a'), $ev, ct => 'application/json');
    is($a->{status}, 201, 'row 8: shared=ledger: the first location executes');
    my $k = $t->key('row8-b');
    my $b = post('/ledger-b', $k, $ev, ct => 'application/json');
    $t->is_problem($b, 409, 'identity-held-elsewhere', name => 'row 8: shared=ledger: another location: 409 identity-held-elsewhere');
    isnt($b->{content}, $a->{content}, "row 8: ... never the holder's body");
    ok(!defined(($t->problem($b) // {})->{operation_id}), "row 8: ... nor its operation id");
    is($t->effects(uri => '/ledger-b'), 0, 'row 8: shared: 0 effects in the other location');
    my $a2 = post('/ledger-a', $t->key('row8-a2'), $ev, ct => 'application/json');
    is($a2->{headers}{'idempotent-reused'}, 'true', 'row 8: shared: the same location is reused');
    is($t->effects(uri => '/ledger-a'), 1, 'row 8: shared: 1 effect');

    # with idempotency_audit, the refusal is an answer in the stream
    is(post('/audited-a', $t->key('row8-aa'), $ev, ct => 'application/json')->{status}, 201,
       'row 8: audited, shared: the first location executes');
    $k = $t->key('row8-ab');
    $b = post('/audited-b', $k, $ev, ct => 'application/json');
    $t->is_problem($b, 409, 'identity-held-elsewhere', name => 'row 8: audited: 409 identity-held-elsewhere');
    is($t->effects(uri => '/audited-b'), 0, 'row 8: audited: 0 effects in the other location');
    my ($refusal) = grep { $_->{key} eq $k && $_->{event} eq 'conflict' } @{ $t->audit_entries('idem:guards') };
    ok($refusal && $refusal->{status} eq '409' && $refusal->{op} eq '',
       "row 8: audited: the refusal is in the stream, a 409 conflict without the holder's operation id");
}

# ---- row 9: store_failure open, Redis down, one signed approval sent 3
# times: 503 each time, 0 executions
{
    my $body = $JS->encode({ amount => 990000, to => 'Mallory Ltd' });
    open my $bf, '>', "$p/row9.json" or die; print $bf $body; close $bf;
    my $fp = `$FindBin::Bin/../build/idempotency-fingerprint --method POST --route /open-pay --content-type application/json --body-file $p/row9.json 2>/dev/null`;
    chomp $fp;
    like($fp, qr/^[0-9a-f]{64}$/, 'row 9: the fingerprint, offline');
    my $k = $t->key('row9');
    my $tok = token($k, $fp);
    for my $i (1 .. 3) {
        my $x = post('/open-pay', $k, $body, ct => 'application/json',
                     headers => [ 'Idempotency-Confirmation' => $tok ]);
        $t->is_problem($x, 503, 'store-unavailable', name => "row 9: approved, Redis down, open ($i): 503");
    }
    is($t->effects(uri => '/open-pay'), 0, 'row 9: 0 executions');
    my $x = post('/open-plain', $t->key('row9-plain'), $body, ct => 'application/json');
    is($x->{status}, 201, 'row 9: an unguarded location still fails open');
}

# ---- row 10: store_failure open, idempotency_unique, one event with two
# keys: 503, at most one execution
{
    my $ev = { source_event_id => 'evt-row10' };
    for my $i (1, 2) {
        my $x = post('/open-events', $t->key("row10-$i"), $ev, ct => 'application/json');
        $t->is_problem($x, 503, 'store-unavailable', name => "row 10: unique, Redis down, open ($i): 503");
    }
    is($t->effects(uri => '/open-events'), 0, 'row 10: 0 executions');
}

# ---- row 12: an approval whose sub forges a log line and sends ESC: the
# error log shows it escaped
{
    my $body = { amount => 5, to => 'ACME Ltd' };
    my $k = $t->key('row12');
    my $r = post('/pay', $k, $body, ct => 'application/json');
    my $fp = (($t->problem($r) // {})->{proposal} // {})->{fingerprint} // '';
    my $sub = "alice\n2026/12/07 10:00:00 [notice] 1#1: FAKE forged line\x1b[31m\x7f\xc3";
    $r = post('/pay', $k, $body, ct => 'application/json',
              headers => [ 'Idempotency-Confirmation' => token($k, $fp, $sub) ]);
    is($r->{status}, 201, 'row 12: the approval executes') or diag($t->show($r));
    is($t->effects(key => $k), 1, 'row 12: 1 effect');
    my $log = '';
    $t->wait_for(sub { $log = $t->error_log; $log =~ /approved by/ }, 5);
    like($log, qr/approved by "alice\\x0A2026\/12\/07 10:00:00 \[notice\] 1#1: FAKE forged line\\x1B\[31m\\x7F\\xC3"/,
         'row 12: the sub is logged escaped (\x0A, \x1B, \x7F, \xC3)');
    unlike($log, qr/^2026\/12\/07 10:00:00 \[notice\] 1#1: FAKE/m, 'row 12: no forged line');
    unlike($log, qr/\x1b/, 'row 12: no raw ESC in error.log');
}

# ---- row 17: the operation-id index (idem:{op}:o) lost; the same proposal
# sent again writes it again, and the operation can be approved
{
    my $body = { amount => 7, to => 'ACME Ltd' };
    my $k = $t->key('row17');
    my $r = post('/pay', $k, $body, ct => 'application/json');
    my $prop = ($t->problem($r) // {})->{proposal} // {};
    my $op = $prop->{operation_id} // '';
    like($op, qr/^[0-9a-f]{32}$/, 'row 17: a proposal');
    my $index = "idem:{$op}:o";
    # acknowledged by Redis before the 428 leaves
    is($t->redis('EXISTS', $index), 1, 'row 17: its index exists');
    $t->redis('DEL', $index);
    $r = post('/pay', $k, $body, ct => 'application/json');
    is($t->ptype($r), 'confirmation-required', 'row 17: the same proposal sent again: 428');
    is($t->redis('EXISTS', $index), 1, 'row 17: ... and the index is back');
    my $ttl = $t->redis('PTTL', $index);
    ok($ttl > 0 && $ttl <= 3600 * 1000, "row 17: ... for the proposal's life left ($ttl ms)");
    my $a = $t->http(POST => '/approve', headers => [ 'Content-Type' => 'application/json' ],
                     body => $JS->encode({ operation_id => $op, fingerprint => $prop->{fingerprint},
                                           approved_by => 'bob@example.com', expires_in => 600 }));
    is($a->{status}, 200, 'row 17: the approval endpoint finds the operation') or diag($t->show($a));
    $r = post('/pay', $k, $body, ct => 'application/json');
    is($r->{status}, 201, 'row 17: the approved request executes');
    is($t->effects(key => $k), 1, 'row 17: 1 effect');
}

# ---- row 12, the approval endpoint: an approved_by that would forge a log
# line is refused (nothing recorded), so it never reaches error.log raw
{
    my $body = { amount => 9, to => 'ACME Ltd' };
    my $k = $t->key('row12b');
    my $r = post('/pay', $k, $body, ct => 'application/json');
    my $prop = ($t->problem($r) // {})->{proposal} // {};
    my $who = "bob\n2026/12/07 10:00:00 [notice] 1#1: FAKE approver line\x1b[8m";
    my $a = $t->http(POST => '/approve', headers => [ 'Content-Type' => 'application/json' ],
                     body => $JS->encode({ operation_id => $prop->{operation_id} // '',
                                           fingerprint => $prop->{fingerprint} // '',
                                           approved_by => $who, expires_in => 600 }));
    $t->is_problem($a, 400, 'bad-approval-request', name => 'row 12 (endpoint): a control character in approved_by: 400');
    $r = post('/pay', $k, $body, ct => 'application/json');
    is($t->ptype($r), 'confirmation-required', 'row 12 (endpoint): ... nothing was approved');
    is($t->effects(key => $k), 0, 'row 12 (endpoint): 0 effects');
    my $log = $t->error_log;
    unlike($log, qr/^2026\/12\/07 10:00:00 \[notice\] 1#1: FAKE approver/m, 'row 12 (endpoint): no forged line');
    unlike($log, qr/\x1b/, 'row 12 (endpoint): no raw ESC in error.log');
}

$t->check_logs;
done_testing();
