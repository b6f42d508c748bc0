#!/usr/bin/perl
# idempotency_approve: a recorded approval. The person posts the proposal's
# operation id and the fingerprint they saw to an operator location; the
# record turns approved, and the caller's next attempt with the same key
# and body executes once, without carrying anything. Another fingerprint,
# an unknown or executed operation, a malformed approval and an expired
# approval each get their own answer and no effect.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use Time::HiRes qw(sleep);
use Idem::Test;

my $t = Idem::Test->new;
my $p = $t->prefix;
my $TOOL = "$FindBin::Bin/../build/idempotency-approve";
system("openssl rand -hex 32 > $p/hs.key") == 0 or BAIL_OUT('openssl rand');

$t->start_stack(<<"EOF", log_format => 'outcome=$idempotency_outcome approver="$idempotency_approver" key=$idempotency_key');
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    location /pay {
        idempotency on;
        idempotency_confirm on;
        idempotency_confirm_show /amount;
        idempotency_confirm_key hs256 $p/hs.key;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /upay {
        idempotency on;
        idempotency_confirm on;
        idempotency_unique pay:\$http_x_order;
        idempotency_confirm_key hs256 $p/hs.key;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /approve {
        allow 127.0.0.1;
        deny all;
        idempotency_approve;
    }
    location = /status {
        idempotency_status;
    }
}
EOF

my $body = { amount => 4200, to => 'ACME Ltd' };

sub pay {
    my ($key, %o) = @_;
    return $t->http(POST => '/pay', key => $key, json => $o{json} // $body);
}

sub approve {
    my ($what) = @_;
    return $t->http(POST => '/approve',
                    json => ref $what ? JSON::PP->new->canonical->encode($what) : $what);
}

sub proposal {
    my ($key, %o) = @_;
    my $r = pay($key, %o);
    is($r->{status}, 428, "$key: 428 first") or diag($t->show($r));
    return (($t->problem($r) // {})->{proposal} // {});
}

sub body_of { my $r = shift; eval { JSON::PP->new->decode($r->{content}) } // {} }

# ---- approve the proposal's fingerprint: the retry executes once
my $k1 = $t->key('approve-1');
my $prop = proposal($k1);
my $op = $prop->{operation_id} // '';
my $fp = $prop->{fingerprint} // '';
is($t->effects(key => $k1), 0, 'no effect before the approval');

my $r = approve({ operation_id => $op, fingerprint => $fp,
                  approved_by => 'alice@example.com', expires_in => 600 });
is($r->{status}, 200, 'recorded approval: 200') or diag($t->show($r));
my $a = body_of($r);
is($a->{state}, 'approved', 'answer: state approved');
is($a->{operation_id}, $op, 'answer: the operation id');
is($a->{approved_by}, 'alice@example.com', 'answer: the approver');
like($a->{approval_expires_at} // '', qr/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/,
     'answer: the approval\'s expiry');

my $rec = $t->record($k1) // {};
is($rec->{state}, 'approved', 'the record is approved');
is($rec->{approver}, 'alice@example.com', 'the record names the approver');
is($rec->{fp}, $fp, 'the record keeps the proposal\'s fingerprint');
ok(($rec->{approved_until} // 0) > (time + 590) * 1000
   && ($rec->{approved_until} // 0) < (time + 610) * 1000, 'approved for expires_in');
ok(($rec->{pttl} // 0) > 590_000, 'the record lives at least as long as its approval');

$r = $t->http(GET => '/status', key => $k1);
my $st = body_of($r);
is($st->{state}, 'approved', 'status endpoint: approved');
is($st->{approved_by}, 'alice@example.com', 'status endpoint: approved_by');
ok($st->{approval_expires_at}, 'status endpoint: approval_expires_at');
is($t->effects(key => $k1), 0, 'approving executes nothing by itself');

$r = pay($k1);
is($r->{status}, 201, 'the retry after the approval executes') or diag($t->show($r));
is($t->effects(key => $k1), 1, 'one effect');
is(($t->record($k1) // {})->{op}, $op, 'the executed operation keeps the proposal\'s operation id');
$r = pay($k1);
is($r->{headers}{'idempotent-replayed'}, 'true', 'the next retry replays');
is($t->effects(key => $k1), 1, 'still one effect');

# ---- a location where claim.lua looks first (idempotency_unique): the
# approved proposal is claimed there, and the operation is still the
# proposal's, executed as its approver's
{
    my $k = $t->key('approve-unique');
    my @h = (headers => [ 'X-Order' => "order-$k" ]);
    my $x = $t->http(POST => '/upay', key => $k, json => $body, @h);
    is($x->{status}, 428, 'unique location: 428 first') or diag($t->show($x));
    my $pp = (($t->problem($x) // {})->{proposal} // {});
    $x = approve({ operation_id => $pp->{operation_id}, fingerprint => $pp->{fingerprint},
                   approved_by => 'carol@example.com', expires_in => 600 });
    is($x->{status}, 200, '... approved');
    $x = $t->http(POST => '/upay', key => $k, json => $body, @h);
    is($x->{status}, 201, '... the retry executes') or diag($t->show($x));
    is($t->effects(key => $k), 1, '... one effect');
    is(($t->record($k) // {})->{op}, $pp->{operation_id},
       '... the completed record keeps the proposal\'s operation id');
    ok($t->wait_for(sub { grep { /^outcome=executed approver="carol\@example\.com" key=\Q$k\E$/ } $t->access_log }, 5),
       '... executed as the recorded approver\'s');

    # a signed approval carried by the retry: claim.lua claims the proposal
    # at once, and its operation id must reach the module
    my $k2 = $t->key('approve-unique-signed');
    my @h2 = (headers => [ 'X-Order' => "order-$k2" ]);
    $x = $t->http(POST => '/upay', key => $k2, json => $body, @h2);
    my $p2 = (($t->problem($x) // {})->{proposal} // {});
    open(my $fh, '>', "$p/u428.json") or die; print $fh $x->{content}; close $fh;
    my $jws = `$TOOL --trust-file --key $p/hs.key --sub dave --yes $p/u428.json 2>/dev/null`;
    chomp $jws;
    $x = $t->http(POST => '/upay', key => $k2, json => $body,
                  headers => [ 'X-Order' => "order-$k2", 'Idempotency-Confirmation' => $jws ]);
    is($x->{status}, 201, 'a signed approval on the unique location executes') or diag($t->show($x));
    is(($t->record($k2) // {})->{op}, $p2->{operation_id},
       '... and the record keeps the proposal\'s operation id');
    is($t->effects(key => $k2), 1, '... one effect');
}

# ---- an executed operation cannot be approved again
$r = approve({ operation_id => $op, fingerprint => $fp, approved_by => 'bob', expires_in => 60 });
is($r->{status}, 409, 'approving an executed operation: 409');
is($t->ptype($r), 'not-approvable', '... not-approvable');
is(($t->problem($r) // {})->{state}, 'completed', '... naming its state');

# ---- another fingerprint is refused; the proposal still waits
my $k2 = $t->key('approve-2');
$prop = proposal($k2);
my $other = join '', reverse split //, $prop->{fingerprint};
$r = approve({ operation_id => $prop->{operation_id}, fingerprint => $other,
               approved_by => 'alice', expires_in => 60 });
is($r->{status}, 409, 'approving another fingerprint: 409');
is($t->ptype($r), 'approval-mismatch', '... approval-mismatch');
is(($t->record($k2) // {})->{state}, 'awaiting_confirmation', 'the proposal still awaits');
$r = pay($k2);
is($t->ptype($r), 'confirmation-required', 'the retry still needs an approval');
is($t->effects(key => $k2), 0, 'no effect');

# a changed body under an approved key: a fingerprint mismatch, not run
$r = approve({ operation_id => $prop->{operation_id}, fingerprint => $prop->{fingerprint},
               approved_by => 'alice', expires_in => 60 });
is($r->{status}, 200, 'approve the real fingerprint');
$r = pay($k2, json => { amount => 999999, to => 'Mallory' });
is($r->{status}, 409, 'a changed body under the approved key: 409');
is($t->ptype($r), 'fingerprint-mismatch', '... fingerprint-mismatch');
is($t->effects(key => $k2), 0, 'the changed body did not run');
is(($t->record($k2) // {})->{state}, 'approved', 'the approval is still there for the real body');

# ---- unknown operation
$r = approve({ operation_id => 'f' x 32, fingerprint => 'a' x 64, approved_by => 'a',
               expires_in => 60 });
is($r->{status}, 404, 'unknown operation: 404');
is($t->ptype($r), 'not-found', '... not-found');

# ---- an approval that has expired: 428 confirmation-expired, then renewed
my $k3 = $t->key('approve-3');
$prop = proposal($k3);
$r = approve({ operation_id => $prop->{operation_id}, fingerprint => $prop->{fingerprint},
               approved_by => 'carol', expires_in => 1 });
is($r->{status}, 200, 'a one-second approval');
sleep 1.3;
$r = pay($k3);
is($r->{status}, 428, 'after its expiry: 428');
is($t->ptype($r), 'confirmation-expired', '... confirmation-expired');
is($t->effects(key => $k3), 0, 'no effect');
$r = approve({ operation_id => $prop->{operation_id}, fingerprint => $prop->{fingerprint},
               approved_by => 'carol', expires_in => 60 });
is($r->{status}, 200, 'approved again');
$r = pay($k3);
is($r->{status}, 201, 'then the retry executes');
is($t->effects(key => $k3), 1, 'one effect');

# ---- 20 concurrent retries after one approval: one effect
my $k4 = $t->key('approve-4');
$prop = proposal($k4);
approve({ operation_id => $prop->{operation_id}, fingerprint => $prop->{fingerprint},
          approved_by => 'dave', expires_in => 60 });
my $res = $t->parallel(20, sub { my $x = pay($k4); "$x->{status} " . $t->ptype($x) });
is($t->effects(key => $k4), 1, '20 concurrent retries after the approval: one effect');
my @bad = grep { !defined $_ || !/^(201 |409 in-progress)$/ } @$res;
is("@bad", '', 'every other answer is in-progress');

# ---- malformed approvals: 400 bad-approval-request, nothing changes
my $k5 = $t->key('approve-5');
$prop = proposal($k5);
my %good = (operation_id => $prop->{operation_id}, fingerprint => $prop->{fingerprint},
            approved_by => 'erin', expires_in => 60);
my @malformed = (
    [ 'not JSON', 'operation_id=1' ],
    [ 'an array', '[1,2]' ],
    [ 'empty body', '' ],
    [ 'no operation_id', { %good, operation_id => undef } ],
    [ 'short operation_id', { %good, operation_id => 'abc' } ],
    [ 'uppercase operation_id', { %good, operation_id => uc $good{operation_id} } ],
    [ 'no fingerprint', { %good, fingerprint => undef } ],
    [ 'fingerprint not hex', { %good, fingerprint => 'z' x 64 } ],
    [ 'numeric fingerprint', { %good, fingerprint => 12 } ],
    [ 'empty approved_by', { %good, approved_by => '' } ],
    [ 'approved_by over 256 bytes', { %good, approved_by => 'x' x 257 } ],
    [ 'approved_by with a newline', { %good, approved_by => "eve\nX-Injected: 1" } ],
    [ 'expires_in 0', { %good, expires_in => 0 } ],
    [ 'expires_in fractional', { %good, expires_in => 1.5 } ],
    [ 'expires_in a string', { %good, expires_in => '60' } ],
    [ 'expires_in over 30 days', { %good, expires_in => 2592001 } ],
    [ 'duplicate member', '{"operation_id":"' . $good{operation_id} . '","operation_id":"'
        . ('f' x 32) . '","fingerprint":"' . $good{fingerprint}
        . '","approved_by":"x","expires_in":60}' ],
    [ 'over 8 KiB', { %good, pad => 'x' x 9000 } ],
);
for my $m (@malformed) {
    my ($name, $what) = @$m;
    if (ref $what) { delete $what->{$_} for grep { !defined $what->{$_} } keys %$what }
    $r = approve($what);
    is($r->{status}, 400, "$name: 400");
    is($t->ptype($r), 'bad-approval-request', "$name: bad-approval-request");
}
is(($t->record($k5) // {})->{state}, 'awaiting_confirmation', 'after all of them the proposal still awaits');
is($t->effects(key => $k5), 0, 'and nothing ran');
$r = $t->http(GET => '/approve');
is($r->{status}, 405, 'GET on the approval endpoint: 405');

# ---- idempotency-approve --endpoint: 428 body -> --yes -> recorded -> executes
my $k6 = $t->key('approve-tool');
$r = pay($k6);
open my $fh, '>', "$p/answer.json" or die; print $fh $r->{content}; close $fh;
my $url = "http://127.0.0.1:" . $t->{nginx_port} . "/approve";
my $out = `$TOOL --endpoint $url --status http://127.0.0.1:$t->{nginx_port}/status --header 'X-Operator: 1' --sub frank --ttl 120 --yes $p/answer.json 2>$p/shown`;
is($?, 0, 'idempotency-approve --endpoint --yes: exit 0');
like($out, qr/"state":"approved"/, 'it prints the endpoint\'s answer');
my $shown = do { local (@ARGV, $/) = ("$p/shown"); <> } // '';
like($shown, qr{/amount = 4200}, 'it showed the proposal first');
is(($t->record($k6) // {})->{approver}, 'frank', 'recorded with --sub as approver');
$r = pay($k6);
is($r->{status}, 201, 'the retry executes') or diag($t->show($r));
is($t->effects(key => $k6), 1, 'one effect');
$out = `$TOOL --trust-file --endpoint $url --sub frank --yes $p/answer.json 2>/dev/null`;
is($? >> 8, 2, 'approving it again (executed): exit 2');
$out = `$TOOL --trust-file --endpoint $url --key $p/x --sub frank --yes $p/answer.json 2>/dev/null`;
is($? >> 8, 2, '--endpoint and --key together: usage, exit 2');

# ---- the approver in the access log
my $log = do { local (@ARGV, $/) = ("$p/access.log"); <> } // '';
like($log, qr/outcome=executed approver="alice\@example.com" key=\Q$k1\E/,
     '$idempotency_approver is the recorded approver');
like($log, qr/outcome=confirm_required approver="-" key=\Q$k3\E/, 'expired: confirm_required');

# ---- Redis down: 503, and nothing approved
$t->stop_redis;
$r = approve(\%good);
is($r->{status}, 503, 'Redis down: 503');
is($t->ptype($r), 'store-unavailable', '... store-unavailable');
$t->start_redis;

$t->check_logs;
done_testing();
