#!/usr/bin/perl
# idempotency_confirm: a request that needs an approval is answered 428 with
# a proposal and never reaches the upstream; its record awaits confirmation.
# A retry with a signed approval (Ed25519 or HS256) bound to its key and
# fingerprint executes once, later retries replay, a changed body is a
# fingerprint-mismatch, and every refused approval is a 428 with its reason
# and no effect. The tokens are signed here, by openssl and Digest::SHA,
# not by the module's code; the keys are made at test time.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use MIME::Base64 qw(encode_base64url);
use Digest::SHA qw(hmac_sha256);
use Idem::Test;

my $t = Idem::Test->new;
my $p = $t->prefix;

# ---- keys: two Ed25519 pairs (rotation) and one HS256 secret
for my $k (qw(ed1 ed2)) {
    system("openssl genpkey -algorithm ed25519 -out $p/$k.key 2>/dev/null") == 0
        or BAIL_OUT('openssl genpkey');
    system("openssl pkey -in $p/$k.key -pubout -out $p/$k.pub 2>/dev/null") == 0
        or BAIL_OUT('openssl pkey -pubout');
}
my $HS = join '', map { sprintf '%02x', int rand 256 } 1 .. 24;   # 48 bytes
open my $fh, '>', "$p/hs.key" or die; print $fh "$HS\n"; close $fh;

# the tool's own key pair: the module must accept what idempotency-approve signs
my $TOOL = "$FindBin::Bin/../build/idempotency-approve";
mkdir "$p/tool";
my $kg = `$TOOL --keygen ed25519 $p/tool`;
is($?, 0, 'idempotency-approve --keygen ed25519 writes a key pair');
ok(-f "$p/tool/ed25519.pub" && ((stat "$p/tool/ed25519.key")[2] & 0777) == 0600,
   'the private key is 0600, the public key beside it');
`$TOOL --keygen ed25519 $p/tool 2>/dev/null`;
is($? >> 8, 2, '--keygen does not overwrite a key pair');

my $KEYS = <<"EOF";
        idempotency_confirm_key ed25519 $p/tool/ed25519.pub kid=tool;
        idempotency_confirm_key ed25519 $p/ed1.pub kid=ed1;
        idempotency_confirm_key ed25519 $p/ed2.pub kid=ed2;
        idempotency_confirm_key hs256 $p/hs.key kid=hs1;
        idempotency_confirm_show /amount /to /missing;
EOF

# a port nothing listens on: Redis unreachable for /open
my $DEAD = $t->free_port;

$t->start_stack(<<"EOF", log_format => 'outcome=$idempotency_outcome approver="$idempotency_approver" key=$idempotency_key');
map \$http_x_risk \$needs_confirm {
    default 0;
    high    1;
}
server {
    listen 127.0.0.1:%%PORT%%;
    large_client_header_buffers 4 32k;
    idempotency_redis %%REDIS%%;
    location /pay {
        idempotency on;
        idempotency_confirm on;
$KEYS
        proxy_pass http://%%UPSTREAM%%;
    }
    location /short {
        idempotency on;
        idempotency_confirm on;
        idempotency_confirm_ttl 2s;
$KEYS
        proxy_pass http://%%UPSTREAM%%;
    }
    location /mapped {
        idempotency on;
        idempotency_confirm \$needs_confirm;
$KEYS
        proxy_pass http://%%UPSTREAM%%;
    }
    location /plain {
        idempotency on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /open {
        idempotency on;
        idempotency_confirm on;
        idempotency_redis 127.0.0.1:$DEAD timeout=300ms;
        idempotency_store_failure open;
$KEYS
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /status {
        idempotency_status;
    }
}
EOF

# ---- signing, independent of the module
sub b64 { encode_base64url($_[0]) }

sub sign_raw {
    my ($alg, $kid, $input) = @_;
    return hmac_sha256($input, $HS) if $alg eq 'HS256';
    my $f = "$p/msg.$$";
    open my $m, '>', $f or die; binmode $m; print $m $input; close $m;
    my $sig = `openssl pkeyutl -sign -inkey $p/$kid.key -rawin -in $f`;
    unlink $f;
    return $sig;
}

# token(alg => , kid => , claims => {...}, header => {...} (replaces), signer => kid)
sub token {
    my %o = @_;
    my $alg = $o{alg} // 'EdDSA';
    my $hdr = $o{header} // { alg => $alg, typ => 'JWT', kid => $o{kid} // 'ed1' };
    my $h = b64(JSON::PP->new->canonical->encode($hdr));
    my $c = b64(ref $o{claims} ? JSON::PP->new->canonical->encode($o{claims}) : $o{claims});
    my $sig = sign_raw($o{sign_alg} // $alg, $o{signer} // $o{kid} // 'ed1', "$h.$c");
    return "$h.$c." . b64($sig);
}

sub claims {
    my ($key, $fp, %o) = @_;
    return { idk => $key, fp => $fp, sub => 'alice@example.com', iat => int(time),
             exp => int(time) + 300, %o };
}

my $body = { amount => 4200, to => 'ACME Ltd', memo => 'not shown' };

sub pay {
    my ($path, $key, %o) = @_;
    return $t->http(POST => $path, key => $key, json => $o{json} // $body,
        headers => [ ($o{token} ? ('Idempotency-Confirmation' => $o{token}) : ()),
                     @{ $o{headers} // [] } ]);
}

# ---- no approval: 428 with the proposal, no effect, awaiting_confirmation
my $k1 = $t->key('confirm-ed');
my $r = pay('/pay', $k1);
is($r->{status}, 428, 'no approval: 428') or diag($t->show($r));
is($t->ptype($r), 'confirmation-required', 'type confirmation-required');
my $prop = ($t->problem($r) // {})->{proposal} // {};
is($prop->{idempotency_key}, $k1, 'proposal: key');
like($prop->{fingerprint} // '', qr/^[0-9a-f]{64}$/, 'proposal: fingerprint');
like($prop->{operation_id} // '', qr/^[0-9a-f]{32}$/, 'proposal: operation id');
is($prop->{method}, 'POST', 'proposal: method');
is($prop->{route}, '/pay', 'proposal: route');
is_deeply($prop->{show}, { '/amount' => 4200, '/to' => 'ACME Ltd', '/missing' => undef },
          'proposal: the shown members, and only those');
unlike($r->{content}, qr/not shown/, 'the body itself is not in the proposal');
like($prop->{expires_at} // '', qr/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/, 'proposal: expiry');
ok(abs(($prop->{expires} // 0) - (time + 3600)) < 10, 'proposal expires in idempotency_confirm_ttl (1h)');
is($prop->{approve}{header}, 'Idempotency-Confirmation', 'proposal: how to approve');
is_deeply([ sort @{ $prop->{approve}{kids} // [] } ], [qw(ed1 ed2 hs1 tool)], 'proposal: the kids');
is($t->effects(key => $k1), 0, 'no approval: no effect');
my $rec = $t->record($k1) // {};
is($rec->{state}, 'awaiting_confirmation', 'record awaits confirmation');
is($rec->{fp}, $prop->{fingerprint}, 'record holds the proposal\'s fingerprint');
is($rec->{op}, $prop->{operation_id}, 'record holds the proposal\'s operation id');
ok($rec->{pttl} > 3590_000 && $rec->{pttl} <= 3600_000, 'record lives for idempotency_confirm_ttl');
my $fp = $prop->{fingerprint};

my $st = $t->http(GET => '/status', key => $k1);
is($st->{status}, 200, 'status endpoint answers') or diag($t->show($st));
my $sj = eval { decode_json($st->{content}) } // {};
is($sj->{state}, 'awaiting_confirmation', 'status endpoint shows awaiting_confirmation');
ok($sj->{expires_at}, 'status endpoint shows the proposal\'s expiry');

$r = pay('/pay', $k1);
is($t->ptype($r), 'confirmation-required', 'again without approval: 428 again');
is(($t->problem($r) // {})->{proposal}{operation_id}, $prop->{operation_id}, 'the same proposal');

# 20 concurrent copies of another request: all 428, no effect
my $k20 = $t->key('confirm-20');
my $res = $t->parallel(20, sub { my $x = pay('/pay', $k20); "$x->{status} " . $t->ptype($x) });
is(scalar(grep { ($_ // '') eq '428 confirmation-required' } @$res), 20, '20 concurrent copies: all 428');
is($t->effects(key => $k20), 0, '20 concurrent copies: no effect');

# ---- Ed25519 approval: executes once, then replays without approval
my $tok = token(kid => 'ed1', claims => claims($k1, $fp));
$r = pay('/pay', $k1, token => $tok);
is($r->{status}, 201, 'Ed25519 approval: executed') or diag($t->show($r));
is($t->effects(key => $k1), 1, 'Ed25519 approval: one effect');
my $first = $r->{content};
$r = pay('/pay', $k1, token => $tok);
is($r->{headers}{'idempotent-replayed'}, 'true', 'same approval again: replay');
$r = pay('/pay', $k1);
is($r->{headers}{'idempotent-replayed'}, 'true', 'no approval after execution: replay');
is($r->{content}, $first, 'replay is the recorded answer');
is($t->effects(key => $k1), 1, 'still one effect');

# changed body under the same key, with the old approval: 409 (the key
# belongs to another request; no approval can make it this one's)
$r = pay('/pay', $k1, token => $tok, json => { %$body, amount => 999999 });
is($r->{status}, 409, 'changed body, old approval: 409') or diag($t->show($r));
is($t->ptype($r), 'fingerprint-mismatch', 'changed body, old approval: fingerprint-mismatch');
$r = pay('/pay', $k1, json => { %$body, amount => 999999 });
is($r->{status}, 409, 'changed body, no approval: 409') or diag($t->show($r));
is($t->ptype($r), 'fingerprint-mismatch', 'fingerprint-mismatch');
is($t->effects(key => $k1), 1, 'changed body: no new effect');

# new key + new approval for the changed body executes
my $k1b = $t->key('confirm-ed-b');
$r = pay('/pay', $k1b, json => { %$body, amount => 999999 });
my $fpb = (($t->problem($r) // {})->{proposal} // {})->{fingerprint} // '';
$r = pay('/pay', $k1b, json => { %$body, amount => 999999 },
         token => token(kid => 'ed2', claims => claims($k1b, $fpb)));
is($r->{status}, 201, 'new key, new approval (kid ed2, rotation): executed') or diag($t->show($r));
is($t->effects(key => $k1b), 1, 'one effect');

# ---- HS256 approval; 20 concurrent retries with it: one effect
$r = pay('/pay', $k20);
my $fp20 = (($t->problem($r) // {})->{proposal} // {})->{fingerprint} // '';
my $hs = token(alg => 'HS256', kid => 'hs1', claims => claims($k20, $fp20));
$res = $t->parallel(20, sub {
    my $x = pay('/pay', $k20, token => $hs);
    "$x->{status} " . ($x->{headers}{'idempotent-replayed'} // $t->ptype($x));
});
is($t->effects(key => $k20), 1, 'HS256: 20 concurrent approved retries, one effect');
is(scalar(grep { ($_ // '') =~ /^(201 |201 true|409 in-progress)$/ } @$res), 20,
   '20 concurrent: executed, replayed or in-progress') or diag(explain $res);
is(scalar(grep { ($_ // '') eq '201 ' } @$res), 1, 'exactly one executed');

# ---- refused approvals: each a 428 with its reason, no effect
my $kx = $t->key('confirm-refused');
$r = pay('/pay', $kx);
my $fpx = (($t->problem($r) // {})->{proposal} // {})->{fingerprint} // '';
my $good = token(kid => 'ed1', claims => claims($kx, $fpx));
my ($gh, $gc, $gs) = split /\./, $good;
sub flip { my ($s, $i) = @_; substr($s, $i, 1) = substr($s, $i, 1) eq 'A' ? 'B' : 'A'; $s }

my @bad = (
    [ 'expired', 'confirmation-expired', undef,
      token(kid => 'ed1', claims => claims($kx, $fpx, exp => int(time) - 5)) ],
    [ 'payload byte changed', 'confirmation-invalid', 'bad_signature',
      join('.', $gh, flip($gc, 10), $gs) ],
    [ 'signature byte changed', 'confirmation-invalid', 'bad_signature',
      join('.', $gh, $gc, flip($gs, 10)) ],
    [ 'signed by ed2, kid ed1', 'confirmation-invalid', 'bad_signature',
      token(kid => 'ed1', signer => 'ed2', claims => claims($kx, $fpx)) ],
    [ 'wrong idk', 'confirmation-invalid', 'wrong_key',
      token(kid => 'ed1', claims => claims($k1, $fpx)) ],
    [ 'wrong fp', 'confirmation-invalid', 'wrong_fingerprint',
      token(kid => 'ed1', claims => claims($kx, $fpb)) ],
    [ 'unknown kid', 'confirmation-invalid', 'unknown_kid',
      token(kid => 'ed9', signer => 'ed1', claims => claims($kx, $fpx)) ],
    [ 'alg none', 'confirmation-invalid', 'refused_alg',
      b64('{"alg":"none","kid":"ed1"}') . ".$gc." ],
    [ 'HS256 token against the Ed25519 kid', 'confirmation-invalid', 'refused_alg',
      token(alg => 'HS256', kid => 'ed1', claims => claims($kx, $fpx)) ],
    [ 'EdDSA token against the HS256 kid', 'confirmation-invalid', 'refused_alg',
      token(header => { alg => 'EdDSA', kid => 'hs1' }, signer => 'ed1',
            claims => claims($kx, $fpx)) ],
    [ 'missing sub', 'confirmation-invalid', 'malformed',
      token(kid => 'ed1', claims => { idk => $kx, fp => $fpx, iat => int(time), exp => int(time) + 60 }) ],
    [ 'missing exp', 'confirmation-invalid', 'malformed',
      token(kid => 'ed1', claims => { idk => $kx, fp => $fpx, iat => int(time), sub => 'a' }) ],
    [ 'typ JOSE', 'confirmation-invalid', 'malformed',
      token(header => { alg => 'EdDSA', kid => 'ed1', typ => 'JOSE' }, claims => claims($kx, $fpx)) ],
    [ 'padding', 'confirmation-invalid', 'malformed', "$good=" ],
    [ 'not base64url', 'confirmation-invalid', 'malformed', "$gh.$gc.\@\@\@" ],
    [ 'garbage', 'confirmation-invalid', 'malformed', 'hello' ],
    [ 'over 8 KiB', 'confirmation-invalid', 'malformed', $good . ('A' x 8200) ],
);
for my $b (@bad) {
    my ($what, $type, $reason, $token) = @$b;
    my $x = pay('/pay', $kx, token => $token);
    is($x->{status}, 428, "$what: 428") or diag($t->show($x));
    is($t->ptype($x), $type, "$what: $type");
    is(($t->problem($x) // {})->{reason}, $reason, "$what: reason " . ($reason // 'none'));
}
{
    my $x = $t->http(POST => '/pay', key => $kx, json => $body,
        headers => [ 'Idempotency-Confirmation' => $good, 'Idempotency-Confirmation' => $good ]);
    is(($t->problem($x) // {})->{reason}, 'malformed', 'the header twice: malformed');
}
is($t->effects(key => $kx), 0, 'refused approvals: no effect');
is(($t->record($kx) // {})->{state}, 'awaiting_confirmation', 'the proposal still awaits');
$r = pay('/pay', $kx, token => $good);
is($r->{status}, 201, 'then the good approval executes') or diag($t->show($r));
is($t->effects(key => $kx), 1, 'one effect');

# ---- idempotency_store_failure open never runs a request awaiting approval
{
    my $k = $t->key('confirm-open');
    my $x = pay('/open', $k);
    $t->is_problem($x, 503, 'store-unavailable', name => 'Redis down, fail-open, no approval: 503, not passed through');
    $x = pay('/open', $k, token => 'hello');
    $t->is_problem($x, 503, 'store-unavailable', name => '... nor with a refused approval');
    is($t->effects(key => $k), 0, '... 0 effects');
    # no proposal without Redis: the fingerprint from the offline command
    open(my $bf, '>', "$p/open.json") or die; print $bf JSON::PP->new->encode($body); close $bf;
    my $fpo = `$FindBin::Bin/../build/idempotency-fingerprint --method POST --route /open --content-type application/json --body-file $p/open.json 2>/dev/null`;
    chomp $fpo;
    # it passed through unprotected before issue 35 (changed on purpose:
    # sent 3 times it executed 3 times; t/74-guards.t row 9)
    $x = pay('/open', $k, token => token(kid => 'ed1', claims => claims($k, $fpo)));
    $t->is_problem($x, 503, 'store-unavailable', name => 'a valid approval is 503 too: fail-open does not apply to a guarded location');
    is($t->effects(key => $k), 0, '... 0 effects');
}

# ---- the proposal expires with idempotency_confirm_ttl
my $ks = $t->key('confirm-short');
$r = pay('/short', $ks);
is($t->ptype($r), 'confirmation-required', 'short ttl: 428');
my $ps = ($t->problem($r) // {})->{proposal} // {};
ok(($t->record($ks) // {})->{pttl} <= 2000, 'short ttl: the record lives 2 s');
sleep 2.5;
is($t->record($ks), undef, 'short ttl: the proposal is gone after it');
$r = pay('/short', $ks);
is($t->ptype($r), 'confirmation-required', 'after expiry: a new proposal');
isnt((($t->problem($r) // {})->{proposal} // {})->{operation_id}, $ps->{operation_id},
     'with a new operation id');
is($t->effects(key => $ks), 0, 'short ttl: no effect');

# ---- a map decides per request
my $km = $t->key('confirm-map-low');
$r = pay('/mapped', $km, headers => [ 'X-Risk' => 'low' ]);
is($r->{status}, 201, 'map: low risk executes without approval') or diag($t->show($r));
is($t->effects(key => $km), 1, 'map: low risk, one effect');
my $kh = $t->key('confirm-map-high');
$r = pay('/mapped', $kh, headers => [ 'X-Risk' => 'high' ]);
is($t->ptype($r), 'confirmation-required', 'map: high risk needs approval');
is($t->effects(key => $kh), 0, 'map: high risk, no effect');
my $fph = (($t->problem($r) // {})->{proposal} // {})->{fingerprint} // '';
$r = pay('/mapped', $kh, headers => [ 'X-Risk' => 'high' ],
         token => token(alg => 'HS256', kid => 'hs1', claims => claims($kh, $fph)));
is($r->{status}, 201, 'map: high risk with approval executes') or diag($t->show($r));
is($t->effects(key => $kh), 1, 'map: high risk approved, one effect');

# ---- a location without idempotency_confirm is unchanged
my $kp = $t->key('confirm-plain');
$r = pay('/plain', $kp);
is($r->{status}, 201, 'no idempotency_confirm: executes');
is($t->effects(key => $kp), 1, 'no idempotency_confirm: one effect');

# ---- idempotency-approve: 428 body -> yes -> JWS -> the retry executes
sub spew { open my $f, '>', $_[0] or die; print $f $_[1]; close $f }
my $kt = $t->key('confirm-tool');
$r = pay('/pay', $kt);
spew("$p/answer.json", $r->{content});
my $jws = `$TOOL --trust-file --key $p/tool/ed25519.key --kid tool --sub carol --yes $p/answer.json 2>$p/shown`;
is($?, 0, 'idempotency-approve --yes: exit 0');
chomp $jws;
like($jws, qr/^[\w-]+\.[\w-]+\.[\w-]+$/, 'it prints a compact JWS');
my $shown = do { local (@ARGV, $/) = ("$p/shown"); <> } // '';
like($shown, qr{/amount = 4200}, 'the printed proposal shows /amount');
like($shown, qr{/to = "ACME Ltd"}, 'the printed proposal shows /to');
like($shown, qr{POST /pay}, 'the printed proposal shows the request');
like($shown, qr{\Q$kt\E}, 'the printed proposal shows the key');
unlike($shown, qr{not shown}, 'the body itself is not printed');
$r = pay('/pay', $kt, token => $jws);
is($r->{status}, 201, "the tool's approval executes") or diag($t->show($r));
is($t->effects(key => $kt), 1, "the tool's approval: one effect");
$r = pay('/pay', $kt);
is($r->{headers}{'idempotent-replayed'}, 'true', 'then a replay');

# a number cJSON's printer rounds (15 digits when they read back within
# DBL_EPSILON): the proposal and the tool show it exactly, as the
# fingerprint reads it; 1e21 and -0 as ECMAScript writes them
{
    my $kn = $t->key('confirm-exact');
    my $raw = '{"amount":0.30000000000000004,"to":{"b":1e21,"a":-0.0},"memo":"x"}';
    my $x = $t->http(POST => '/pay', key => $kn, json => $raw);
    is($x->{status}, 428, 'a body with a number cJSON would round: 428');
    like($x->{content}, qr#"/amount":0\.30000000000000004[,}]#, 'the proposal shows the amount exactly');
    like($x->{content}, qr{"/to":\{"a":0,"b":1e\+21\}}, 'an object: members sorted, numbers as ECMAScript writes them');
    spew("$p/exact.json", $x->{content});
    `$TOOL --trust-file --key $p/tool/ed25519.key --kid tool --sub carol --yes $p/exact.json 2>$p/shown-exact >/dev/null`;
    my $sx = do { local (@ARGV, $/) = ("$p/shown-exact"); <> } // '';
    like($sx, qr{/amount = 0\.30000000000000004\n}, 'idempotency-approve shows the amount exactly');
    like($sx, qr{/to = \{"a":0,"b":1e\+21\}\n}, '... and the object canonically');
    is($t->effects(key => $kn), 0, 'no effect');
}

my $kt2 = $t->key('confirm-tool-hs');
$r = pay('/pay', $kt2);
spew("$p/answer2.json", $r->{content});
$jws = `$TOOL --trust-file --key $p/hs.key --kid hs1 --sub dave --yes - < $p/answer2.json 2>/dev/null`;
chomp $jws;
$r = pay('/pay', $kt2, token => $jws);
is($r->{status}, 201, "the tool's HS256 approval (answer on stdin) executes") or diag($t->show($r));
is($t->effects(key => $kt2), 1, 'one effect');

my $kt3 = $t->key('confirm-tool-no');
$r = pay('/pay', $kt3);
spew("$p/answer3.json", $r->{content});
$jws = `setsid -w $TOOL --trust-file --key $p/tool/ed25519.key --kid tool --sub carol $p/answer3.json 2>/dev/null`;
is($? >> 8, 1, 'without --yes and without a terminal: not approved (exit 1)');
is($jws, '', 'and no token printed');
spew("$p/notanswer.json", '{"type":"x"}');
$jws = `$TOOL --trust-file --key $p/tool/ed25519.key --yes $p/notanswer.json 2>/dev/null`;
is($? >> 8, 2, 'not a 428 answer: exit 2');
$jws = `$TOOL --trust-file --key $p/tool/ed25519.pub --yes $p/answer3.json 2>/dev/null`;
is($? >> 8, 2, 'a public key cannot sign: exit 2');
is($t->effects(key => $kt3), 0, 'no effect');

# ---- the variables in the access log
my $log = do { local (@ARGV, $/) = ("$p/access.log"); <> } // '';
like($log, qr/outcome=confirm_required approver="-" key=\Q$k1\E/, '$idempotency_outcome confirm_required');
like($log, qr/outcome=executed approver="alice\@example.com" key=\Q$k1\E/, '$idempotency_approver is the sub');
like($log, qr/outcome=executed approver="carol" key=\Q$kt\E/, '$idempotency_approver of the tool\'s approval');

$t->check_logs;
done_testing();
