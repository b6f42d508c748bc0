#!/usr/bin/perl
# A person's "no", and who the approver is. A declined proposal refuses
# every attempt of its key (403 confirmation-declined, no effect), the
# status endpoint and the audit say who declined. With
# idempotency_approve_identity the approver is who nginx authenticated,
# never a name in the body. The JSON approve endpoint takes
# application/json only and refuses a request from another site (issue 35
# row 13). The proposal is kept as it was shown, with describe, labels and
# approve_url, and served by operation id (row 14's gateway side).

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use MIME::Base64;
use Idem::Test;

my $t = Idem::Test->new;
my $p = $t->prefix;
system("openssl rand -hex 32 > $p/hs.key") == 0 or BAIL_OUT('openssl rand');
my $crypt = crypt('secret', '$1$saltsalt$') // BAIL_OUT('crypt');
open(my $pw, '>', "$p/htpasswd") or die; print $pw "alice:$crypt\nbob:$crypt\n"; close $pw;

$t->start_stack(<<"EOF", log_format => 'outcome=$idempotency_outcome approver="$idempotency_approver" key=$idempotency_key');
idempotency_json_var \$amount /amount;
idempotency_json_var \$to /to;
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    location /pay {
        idempotency on;
        idempotency_confirm on;
        idempotency_confirm_show /amount "label=Amount (cents)" /to label=Payee /currency;
        idempotency_confirm_describe "Pay \$amount cents to \$to";
        idempotency_confirm_link https://ops.example/approve;
        idempotency_confirm_key hs256 $p/hs.key;
        idempotency_audit on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /approve {
        idempotency_approve;
        idempotency_audit on;
    }
    location = /approve-sso {
        auth_basic "approvers";
        auth_basic_user_file $p/htpasswd;
        idempotency_approve_identity \$remote_user;
        idempotency_approve;
    }
    location = /status {
        idempotency_status;
    }
}
EOF

my $J = JSON::PP->new->canonical;
my $body = { amount => 4200, to => 'ACME Ltd', currency => 'EUR', memo => 'March' };
sub pay { my ($k, %o) = @_; $t->http(POST => '/pay', key => $k, json => $o{json} // $body) }
sub body_of { my $r = shift; eval { JSON::PP->new->decode($r->{content}) } // {} }
sub basic { 'Basic ' . encode_base64("$_[0]:secret", '') }

sub proposal {
    my ($k) = @_;
    my $r = pay($k);
    is($r->{status}, 428, "$k: 428") or diag($t->show($r));
    return (($t->problem($r) // {})->{proposal} // {});
}

# ---- the proposal as a person must see it, kept with its operation id
my $k1 = $t->key('describe');
my $prop = proposal($k1);
my ($op, $fp) = ($prop->{operation_id} // '', $prop->{fingerprint} // '');
is($prop->{describe}, 'Pay 4200 cents to ACME Ltd', 'describe, with its variables');
is_deeply($prop->{labels}, { '/amount' => 'Amount (cents)', '/to' => 'Payee', '/currency' => '/currency' },
          'a label per shown value (default: the pointer)');
is_deeply($prop->{show}, { '/amount' => 4200, '/to' => 'ACME Ltd', '/currency' => 'EUR' }, 'the shown values');
is($prop->{approve_url}, "https://ops.example/approve?op=$op", 'approve_url names the operation');
like($prop->{host} // '', qr/^127\.0\.0\.1/, 'the host');
is($prop->{method}, 'POST', 'the method');
is($prop->{requested_by}, 'no scope', 'who asked: no scope here');

my $r = $t->http(GET => "/status?op=$op");
is($r->{status}, 200, 'status by operation id') or diag($t->show($r));
my $st = body_of($r);
is($st->{state}, 'awaiting_confirmation', '... its state');
is_deeply($st->{proposal}, $prop, '... the proposal exactly as the 428 showed it');
$r = $t->http(GET => '/status?op=' . ('0' x 32));
is($r->{status}, 404, 'an unknown operation id: 404');
$r = $t->http(GET => '/status?op=xyz');
is($r->{status}, 404, 'a malformed operation id: 404');

# ---- row 13: the JSON endpoint takes application/json only
my $approval = $J->encode({ operation_id => $op, fingerprint => $fp, approved_by => 'alice', expires_in => 600 });
for my $ct ('text/plain', 'application/x-www-form-urlencoded', undef, 'application/jsonx') {
    $r = $t->http(POST => '/approve', body => $approval,
                  headers => [ defined $ct ? ('Content-Type' => $ct) : () ]);
    is($r->{status}, 415, 'approve posted as ' . ($ct // 'no Content-Type') . ': 415');
    is($t->ptype($r), 'unsupported-media-type', '... unsupported-media-type');
}
for my $h ([ Origin => 'https://evil.example' ], [ 'Sec-Fetch-Site' => 'cross-site' ],
           [ 'Sec-Fetch-Site' => 'same-site' ], [ Origin => 'null' ],
           [ Origin => "http://127.0.0.1:" . $t->{nginx_port}, 'Sec-Fetch-Site' => 'cross-site' ]) {
    $r = $t->http(POST => '/approve', json => $approval, headers => $h);
    is($r->{status}, 403, "approve with $h->[0]: $h->[1]: 403");
    is($t->ptype($r), 'cross-site-request', '... cross-site-request');
}
is(($t->record($k1) // {})->{state}, 'awaiting_confirmation', 'nothing was recorded');
pay($k1);
is($t->effects(key => $k1), 0, 'no effect');

# ---- decline: every attempt of the key is refused
$r = $t->http(POST => '/approve', json => { operation_id => $op, fingerprint => $fp,
                                            approved_by => 'alice', decision => 'decline' },
              headers => [ Origin => "http://127.0.0.1:" . $t->{nginx_port}, 'Sec-Fetch-Site' => 'same-origin' ]);
is($r->{status}, 200, 'decline: 200 (same-origin Origin and Sec-Fetch-Site pass)') or diag($t->show($r));
my $d = body_of($r);
is($d->{state}, 'declined', '... state declined');
is($d->{declined_by}, 'alice', '... declined_by');
ok($d->{declined_at}, '... declined_at');
my $rec = $t->record($k1) // {};
is($rec->{state}, 'declined', 'the record is declined');
is($rec->{approver}, 'alice', '... naming who declined');

$r = pay($k1);
is($r->{status}, 403, 'the retry: 403');
is($t->ptype($r), 'confirmation-declined', '... confirmation-declined');
$r = pay($k1, json => { %$body, amount => 1 });
is($t->ptype($r), 'confirmation-declined', 'another body under the key: declined too');
my $jws = `$FindBin::Bin/../build/idempotency-approve --trust-file --key $p/hs.key --sub carol --yes - <<'X' 2>/dev/null
{"proposal":{"operation_id":"$op","idempotency_key":"$k1","fingerprint":"$fp","method":"POST","route":"/pay","query":"","expires":@{[time+600]}}}
X`;
chomp $jws;
$r = $t->http(POST => '/pay', key => $k1, json => $body, headers => [ 'Idempotency-Confirmation' => $jws ]);
is($t->ptype($r), 'confirmation-declined', 'a signed approval cannot undo a decline') or diag($t->show($r));
is($t->effects(key => $k1), 0, 'no effect');

$st = body_of($t->http(GET => '/status', key => $k1));
is($st->{state}, 'declined', 'status by key: declined');
is($st->{declined_by}, 'alice', '... and who declined');
like($st->{declined_at} // '', qr/^\d{4}-\d\d-\d\dT/, '... and when');
$st = body_of($t->http(GET => "/status?op=$op"));
is($st->{state}, 'declined', 'status by operation id: declined');
is($st->{declined_by}, 'alice', '... and who declined');

$r = $t->http(POST => '/approve', json => $approval);
is($r->{status}, 409, 'approving a declined operation: 409');
is(($t->problem($r) // {})->{state}, 'declined', '... naming its state');
is(($t->record($k1) // {})->{state}, 'declined', 'still declined');

my @ev = map { $_->{event} } grep { ($_->{op} // '') eq $op } @{ $t->audit_entries };
ok((grep { $_ eq 'declined' } @ev), 'the audit has a "declined" entry') or diag("@ev");
my ($de) = grep { $_->{event} eq 'declined' } @{ $t->audit_entries };
is($de->{approver}, 'alice', '... naming who declined');
ok((grep { $_ eq 'conflict' } @ev), 'the refused retries are in the audit');

$r = $t->http(POST => '/approve', json => { operation_id => $op, fingerprint => $fp,
                                            approved_by => 'a', decision => 'maybe' });
is($t->ptype($r), 'bad-approval-request', 'an unknown decision: 400');

# ---- at the JSON endpoint, a decline also ends an approval not claimed yet
{
    my $k = $t->key('revoke');
    my $pp = proposal($k);
    my %id = (operation_id => $pp->{operation_id}, fingerprint => $pp->{fingerprint});
    $r = $t->http(POST => '/approve', json => { %id, approved_by => 'alice', expires_in => 600 });
    is($r->{status}, 200, 'approved');
    $r = $t->http(POST => '/approve', json => { %id, approved_by => 'alice', decision => 'decline' });
    is($r->{status}, 200, 'then declined before the retry (a change of mind)');
    $r = pay($k);
    is($t->ptype($r), 'confirmation-declined', 'the retry: confirmation-declined');
    is($t->effects(key => $k), 0, 'no effect');
}

# ---- the identity: approved_by comes from the authenticated user
my $k2 = $t->key('identity');
$prop = proposal($k2);
my %a2 = (operation_id => $prop->{operation_id}, fingerprint => $prop->{fingerprint}, expires_in => 600);
$r = $t->http(POST => '/approve-sso', json => { %a2, approved_by => 'someone-else' },
              headers => [ Authorization => basic('alice') ]);
is($r->{status}, 403, 'approved_by naming someone else: 403');
is($t->ptype($r), 'approver-mismatch', '... approver-mismatch');
is(($t->record($k2) // {})->{state}, 'awaiting_confirmation', '... nothing recorded');
$r = $t->http(POST => '/approve-sso', json => { %a2 });
is($r->{status}, 401, 'no credentials: 401 (auth_basic)');
$r = $t->http(POST => '/approve-sso', json => { %a2 }, headers => [ Authorization => basic('bob') ]);
is($r->{status}, 200, 'without approved_by: the authenticated user') or diag($t->show($r));
is(body_of($r)->{approved_by}, 'bob', '... approved_by bob');
$r = $t->http(POST => '/approve-sso', json => { %a2, approved_by => 'alice' },
              headers => [ Authorization => basic('alice') ]);
is($r->{status}, 200, 'approved_by equal to the authenticated user: 200');
is(($t->record($k2) // {})->{approver}, 'alice', 'the record names the authenticated approver');
$r = pay($k2);
is($r->{status}, 201, 'the retry executes') or diag($t->show($r));
is($t->effects(key => $k2), 1, 'one effect');
ok($t->wait_for(sub { grep { /^outcome=executed approver="alice" key=\Q$k2\E$/ } $t->access_log }, 5),
   '$idempotency_approver is the authenticated user');

# ---- idempotency-approve shows what the gateway stored (issue 35 row 14)
my $TOOL = "$FindBin::Bin/../build/idempotency-approve";
my $ST = "http://127.0.0.1:$t->{nginx_port}/status";
my $EP = "http://127.0.0.1:$t->{nginx_port}/approve";
sub spew { my ($f, $c) = @_; open(my $fh, '>', $f) or die; print $fh $c; close $fh }
sub slurp { my $f = shift; local (@ARGV, $/) = ($f); <> // '' }

my $k3 = $t->key('tool-edited');
my $real = { amount => 990000, to => 'Mallory Ltd', currency => 'EUR' };
$r = pay($k3, json => $real);
is($r->{status}, 428, 'the real request: 428');
my $edited = $r->{content};
$edited =~ s/"\/amount":990000/"\/amount":42/ or fail('edit the amount');
$edited =~ s/"\/to":"Mallory Ltd"/"\/to":"ACME Ltd"/ or fail('edit the payee');
spew("$p/edited.json", $edited);
my $jws3 = `$TOOL --key $p/hs.key --sub carol --status $ST --yes $p/edited.json 2>$p/edited.err`;
is($? >> 8, 2, 'an edited proposal file: refused, exit 2');
is($jws3, '', '... no approval printed');
my $err = slurp("$p/edited.err");
like($err, qr{show: the file says \{.*"/amount":42.*\}, the gateway stored \{.*"/amount":990000}, '... the difference shown') or diag($err);
unlike($err, qr/Approve this operation/, '... nothing asked');
$r = pay($k3, json => $real);
is($t->effects(key => $k3), 0, 'no effect');

# the same file untouched: accepted, and what is shown is the gateway's
spew("$p/real.json", $r->{content});
my $op3 = (($t->problem($r) // {})->{proposal} // {})->{operation_id};
$jws3 = `$TOOL $p/real.json --sub carol --status=$ST --key $p/hs.key --yes 2>$p/real.err`;
is($?, 0, 'the file as the gateway stored it, options after it (GNU style): exit 0') or diag(slurp("$p/real.err"));
like(slurp("$p/real.err"), qr{Amount \(cents\) = 990000}, '... shows the stored value under its label');
like(slurp("$p/real.err"), qr{state now:\s+awaiting_confirmation}, '... and the state now');
$jws3 = `$TOOL --op $op3 --status $ST --key $p/hs.key --sub carol --yes 2>$p/op.err`;
is($?, 0, '--op ID: the proposal fetched by operation id alone');
like(slurp("$p/op.err"), qr{Payee = "Mallory Ltd"}, '... shows the gateway\'s values');
`$TOOL --key $p/hs.key --sub carol --yes $p/real.json 2>/dev/null`;
is($? >> 8, 2, 'neither --status nor --trust-file: usage, exit 2');

# ---- every value printed to a terminal is escaped (row 15)
my $k4 = $t->key('tool-escape');
my $nasty = { amount => 1, to => "Mallory\x7f\x{202E}Ltd", currency => "\e[2K\e[8mEUR" };
$r = $t->http(POST => '/pay/%1B[2K%1B[8mhidden', key => $k4, json => JSON::PP->new->utf8->encode($nasty));
is($r->{status}, 428, 'a route and values with escape sequences: 428');
spew("$p/nasty.json", $r->{content});
`$TOOL --key $p/hs.key --sub carol --status $ST --yes $p/nasty.json 2>$p/nasty.err`;
is($?, 0, 'the tool shows it');
my $shown = slurp("$p/nasty.err");
unlike($shown, qr/[\x00-\x08\x0b-\x1f\x7f]/, 'no raw control byte or DEL reaches the terminal');
like($shown, qr{/pay/\\x1B\[2K\\x1B\[8mhidden}, 'the route\'s ESC shown as \\x1B');
like($shown, qr{Mallory\\x7F\\u\{202E\}Ltd}, 'DEL and U+202E shown as escapes');
is($t->effects(key => $k4), 0, 'no effect');

# ---- idempotency-approve --decline, and idempotency-call agrees
my $CALL = "$FindBin::Bin/../build/idempotency-call";
my $sd = "$p/call-state";
mkdir $sd;
my @call = ($CALL, '--op', 'pay-decline', '--state-dir', $sd, '--deadline', '5',
            '-X', 'POST', "http://127.0.0.1:$t->{nginx_port}/pay",
            '-H', 'Content-Type: application/json', '-d', '{"amount":7,"to":"Eve","currency":"EUR"}');
my $c1 = `@{[ join ' ', map { "'$_'" } @call ]} 2>/dev/null`;
my $c1j = eval { JSON::PP->new->decode($c1) } // {};
isnt($? >> 8, 0, 'idempotency-call: the first call needs confirmation') or diag($c1);
my ($op5) = $c1 =~ /"operation_id"\s*:\s*"([0-9a-f]{32})"/;
ok($op5, '... and names the operation') or diag($c1);
my $out5 = `$TOOL --endpoint $EP --status $ST --op $op5 --decline --sub dave --yes 2>$p/decline.err`;
is($?, 0, 'idempotency-approve --decline: exit 0') or diag(slurp("$p/decline.err"));
like($out5, qr/"state":"declined"/, '... prints the endpoint\'s answer: declined');
my $c2 = `@{[ join ' ', map { "'$_'" } @call ]} 2>/dev/null`;
isnt($? >> 8, 0, 'idempotency-call after the decline: a failure');
like($c2, qr/confirmation-declined/, '... naming confirmation-declined') or diag($c2);
$st = body_of($t->http(GET => "/status?op=$op5"));
is($st->{state}, 'declined', 'the status endpoint agrees: declined');
is($st->{declined_by}, 'dave', '... by dave');
my ($k5) = $c1 =~ /"(?:idempotency_)?key"\s*:\s*"([^"]+)"/;
ok($k5, 'idempotency-call names its key') or diag($c1);
is($t->effects(key => $k5), 0, 'no effect for the declined operation');

# ---- nginx -t: the new directives
sub conf_ok {
    my ($what, $loc, $want) = @_;
    my ($rc, $out) = $t->nginx_test_conf("server { listen 127.0.0.1:%%PORT%%; idempotency_redis 127.0.0.1:1; location / { $loc proxy_pass http://127.0.0.1:1; } }");
    if (defined $want) {
        isnt($rc, 0, "nginx -t refuses: $what");
        like($out, $want, '... saying why') or diag($out);
    } else {
        is($rc, 0, "nginx -t accepts: $what") or diag($out);
    }
}
my $K = "idempotency on; idempotency_confirm on; idempotency_confirm_key hs256 $p/hs.key;";
conf_ok('show and exclude apart', "$K idempotency_confirm_show /amount /meta/to; idempotency_fingerprint_exclude /memo /meta/trace;");
conf_ok('show equal to an excluded pointer', "$K idempotency_confirm_show /amount /memo; idempotency_fingerprint_exclude /memo;",
        qr/idempotency_confirm_show.*\/memo.*idempotency_fingerprint_exclude/);
conf_ok('show inside an excluded pointer', "$K idempotency_confirm_show /meta/to; idempotency_fingerprint_exclude /memo /meta;",
        qr/\/meta\/to/);
conf_ok('show containing an excluded pointer', "$K idempotency_confirm_show /meta; idempotency_fingerprint_exclude /meta/trace;",
        qr/\/meta/);
conf_ok('exclude at server level, show in the location', "$K idempotency_confirm_show /memo; } location /x { idempotency_fingerprint_exclude /memo;");
conf_ok('label before a pointer', "$K idempotency_confirm_show label=Amount /amount;", qr/label/);
conf_ok('a label twice', "$K idempotency_confirm_show /amount label=A label=B;", qr/label/);
conf_ok('an empty label', "$K idempotency_confirm_show /amount label=;", qr/label/);
conf_ok('a relative link', "$K idempotency_confirm_link /approve;", qr/idempotency_confirm_link/);
conf_ok('a link with a fragment', "$K idempotency_confirm_link https://x.example/a#b;", qr/idempotency_confirm_link/);
conf_ok('describe twice', "$K idempotency_confirm_describe a; idempotency_confirm_describe b;", qr/duplicate/);
# the describe is shown to the person as the show pointers are: a JSON
# variable the fingerprint leaves out, or a header it does not count, would
# let the retry pay someone else under the approved fingerprint
for my $c (
    [ 'describe of a member apart from the excluded ones', '$amount to $payee', '/memo', undef ],
    [ 'describe of a member inside an excluded one', 'Pay $amount to $payee', '/meta',
      qr/\[emerg\].*"idempotency_confirm_describe" shows \$payee, whose member \/meta\/to is.*"idempotency_fingerprint_exclude"/ ],
    [ 'describe of a member equal to an excluded one', 'Pay ${amount} to $payee', '/memo /amount',
      qr/\[emerg\].*"idempotency_confirm_describe" shows \$amount/ ],
    [ 'describe of a member holding an excluded one', 'Pay $amount to $meta', '/meta/trace',
      qr/\[emerg\].*"idempotency_confirm_describe" shows \$meta/ ],
    [ 'describe of a header not fingerprinted', 'Pay $amount to $http_x_payee', '/memo',
      qr/\[emerg\].*"idempotency_confirm_describe" shows \$http_x_payee.*"idempotency_fingerprint_headers"/ ],
    [ 'describe of a header fingerprinted', 'Pay $amount to $http_x_payee', '/memo', undef, 'idempotency_fingerprint_headers X-Payee;' ],
) {
    my ($what, $text, $ex, $want, $more) = @$c;
    my ($rc, $out) = $t->nginx_test_conf('idempotency_json_var $amount /amount; idempotency_json_var $payee /meta/to; idempotency_json_var $meta /meta; '
        . "server { listen 127.0.0.1:%%PORT%%; idempotency_redis 127.0.0.1:1; location / { $K idempotency_fingerprint_exclude $ex; "
        . "idempotency_confirm_describe \"$text\"; @{[ $more // '' ]} proxy_pass http://127.0.0.1:1; } }");
    if (defined $want) {
        isnt($rc, 0, "nginx -t refuses: $what");
        like($out, $want, '... naming the directive, the variable and why') or diag($out);
    } else {
        is($rc, 0, "nginx -t accepts: $what") or diag($out);
    }
}
{
    my ($rc, $out);
    my $loc = sub { "server { listen 127.0.0.1:%%PORT%%; idempotency_redis 127.0.0.1:1; location = /approve { $_[0] } }" };
    system("printf short > $p/short.key");
    for my $c ([ 'the page with identity and a secret', "idempotency_approve_identity \$remote_user; idempotency_approve_page secret=$p/hs.key;" ],
               [ 'the page with identity, no secret', "idempotency_approve_identity \$remote_user; idempotency_approve_page;" ],
               [ 'the page without identity', 'idempotency_approve_page;', qr/idempotency_approve_page.*needs.*idempotency_approve_identity/ ],
               [ 'the page, a parameter other than secret=', "idempotency_approve_identity \$remote_user; idempotency_approve_page key=$p/hs.key;", qr/secret=FILE/ ],
               [ 'the page, a missing secret file', "idempotency_approve_identity \$remote_user; idempotency_approve_page secret=$p/nope.key;", qr/idempotency_approve_page/ ],
               [ 'the page, a short secret', "idempotency_approve_identity \$remote_user; idempotency_approve_page secret=$p/short.key;", qr/idempotency_approve_page/ ],
               [ 'the page with max_ttl', "idempotency_approve_identity \$remote_user; idempotency_approve_page max_ttl=2h secret=$p/hs.key;" ],
               [ 'the page, max_ttl under 5 minutes', "idempotency_approve_identity \$remote_user; idempotency_approve_page max_ttl=1m;", qr/max_ttl/ ],
               [ 'the page, max_ttl not a time', "idempotency_approve_identity \$remote_user; idempotency_approve_page max_ttl=soon;", qr/max_ttl/ ],
               [ 'the page twice', "idempotency_approve_identity \$remote_user; idempotency_approve_page; idempotency_approve_page;", qr/duplicate/ ],
               [ 'the page beside proxy_pass', "idempotency_approve_identity \$remote_user; idempotency_approve_page; proxy_pass http://127.0.0.1:1;", qr/content handler/ ]) {
        ($rc, $out) = $t->nginx_test_conf($loc->($c->[1]));
        if ($c->[2]) {
            isnt($rc, 0, "nginx -t refuses: $c->[0]");
            like($out, $c->[2], '... saying why') or diag($out);
        } else {
            is($rc, 0, "nginx -t accepts: $c->[0]") or diag($out);
        }
    }
}
conf_ok('identity twice', "idempotency_approve_identity \$remote_user; idempotency_approve_identity \$remote_user;", qr/duplicate/);

done_testing();
