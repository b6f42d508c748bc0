#!/usr/bin/perl
# The approval page in a real headless Chromium (t/browser/approve-page.js,
# playwright-core driving Debian's chromium), against real nginx and Redis,
# as an approver nginx authenticates with auth_basic. Each check counts the
# upstream's effects: the page must never let an operation run unapproved,
# run twice, or be approved from another site.
#
# Skipped only when the browser or node_modules are missing AND
# IDEM_ALLOW_SKIP is set; otherwise a missing browser fails the test.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use File::Copy qw(copy);
use Idem::Test;

my $B = "$FindBin::Bin/browser";
my $CHROMIUM = $ENV{CHROMIUM} // '/usr/bin/chromium';
my $NODE = `command -v node 2>/dev/null`; chomp $NODE;
my @missing = grep { $_ } (!-d "$B/node_modules/playwright-core" && 'node_modules (run npm ci in t/browser)'),
                          (!-x $CHROMIUM && "chromium ($CHROMIUM)"), (!$NODE && 'node');
if (@missing) {
    plan skip_all => "missing: @missing" if $ENV{IDEM_ALLOW_SKIP};
    # a failure of this test, not of the whole run (BAIL_OUT would stop prove)
    fail("the approval page's browser test needs: @missing (set IDEM_ALLOW_SKIP=1 to skip)");
    done_testing();
    exit 1;
}

my $t = Idem::Test->new;
my $p = $t->prefix;
my $port = $t->{nginx_port} = Idem::Test::free_port();
my $base = "http://127.0.0.1:$port";
system("openssl rand -hex 32 > $p/hs.key") == 0 or BAIL_OUT('openssl rand');
system("openssl rand -hex 32 > $p/page.key") == 0 or BAIL_OUT('openssl rand');
my $crypt = crypt('secret', '$1$saltsalt$') // BAIL_OUT('crypt');
open(my $pw, '>', "$p/htpasswd") or die; print $pw "alice:$crypt\n"; close $pw;

my $confirm = <<"EOF";
        idempotency on;
        idempotency_scope \$http_authorization;
        idempotency_confirm on;
        idempotency_confirm_show /amount "label=Amount (cents)" /to label=Payee /ref label=Reference;
        idempotency_confirm_describe "Pay \$amount cents to \$to";
        idempotency_confirm_link $base/approve;
        idempotency_confirm_key hs256 $p/hs.key;
        idempotency_audit on;
        proxy_pass http://%%UPSTREAM%%;
EOF

$t->start_stack(<<"EOF", log_format => 'outcome=$idempotency_outcome approver="$idempotency_approver" key=$idempotency_key');
idempotency_json_var \$amount /amount;
idempotency_json_var \$to /to;
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    location /pay {
$confirm
    }
    location /pay-short {
$confirm
        idempotency_confirm_ttl 8s;
    }
    location = /approve {
        auth_basic "approvers";
        auth_basic_user_file $p/htpasswd;
        idempotency_approve_identity \$remote_user;
        idempotency_approve_page secret=$p/page.key max_ttl=4h;
        idempotency_audit on;
    }
    location = /status {
        idempotency_status;
    }
}
EOF

my $JS = JSON::PP->new->utf8->canonical;

# browser(cmd, args...): what the browser saw, as a hash
sub browser {
    my @cmd = ($NODE, "$B/approve-page.js", @_);
    my $out = `@{[ join ' ', map { "'$_'" } @cmd ]} 2>$p/browser.err`;
    my $r = eval { $JS->decode($out) };
    diag("browser @_: $? " . Idem::Test::_slurp("$p/browser.err")) unless $r;
    return $r // {};
}

sub pay {
    my ($key, $body, $loc) = @_;
    return $t->http(POST => $loc // '/pay', key => $key, json => $body,
                    headers => [ Authorization => 'Bearer agent-7' ]);
}

sub proposal {
    my ($key, $body, $loc) = @_;
    my $r = pay($key, $body, $loc);
    is($r->{status}, 428, "$key: 428") or diag($t->show($r));
    return (($t->problem($r) // {})->{proposal} // {});
}

my $XSS = q{<img src=x onerror="document.title='pwned'">};
my $RLO = "\x{202E}0001";

# ---- the page shows the exact operation; Approve; the retry runs once
my $k1 = $t->key('page-approve');
my $b1 = { amount => 4200, to => $XSS, ref => $RLO, memo => 'not shown' };
my $prop = proposal($k1, $b1);
my $url = $prop->{approve_url} // '';
is($url, "$base/approve?op=$prop->{operation_id}", 'the 428 carries approve_url');

my $v = browser('view', $url, "$p/shots");
is($v->{status}, 200, 'the page: 200');
is($v->{title}, 'Approve this operation?', 'the title is the page\'s (the XSS payload did not run)');
is($v->{images}, 0, 'no <img> element: the payload is text');
is($v->{scripts}, 0, 'no script on the page');
is($v->{describe}, "Pay 4200 cents to $XSS", 'describe, as text');
is($v->{rows}{'Amount (cents)'}, '4200', 'a labelled value');
is($v->{rows}{Payee}, $XSS, 'the payload shown as text under its label');
is($v->{rows}{Reference}, "\x{27E8}U+202E\x{27E9}0001", 'U+202E is a visible escape, not applied');
like($v->{rows}{Request} // '', qr{^POST 127\.0\.0\.1:\d+/pay$}, 'method, host and route');
is($v->{rows}{'Operation id'}, $prop->{operation_id}, 'the operation id');
like($v->{rows}{'Asked by'} // '', qr/^scope [0-9a-f]{12}$/, 'who asked: the scope, as a short digest');
unlike($v->{text} // '', qr/agent-7/, '... never the scope\'s value (a credential)');
is($v->{rows}{'Idempotency key'}, $k1, 'the key');
like($v->{rows}{'Proposal expires'} // '', qr/^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$/, 'the expiry');
is($v->{state}, 'awaiting_confirmation', 'the state');
ok($v->{approve} && $v->{decline}, 'Approve and Decline buttons');
is(join(' ', @{ $v->{ttls} // [] }), '300 900 3600 14400', 'approval lifetimes up to max_ttl (4h)');
is($v->{who}, 'alice', 'signed in as the authenticated approver');
unlike($v->{text} // '', qr/not shown/, 'a member not named by idempotency_confirm_show is not shown');
my $h = $v->{headers} // {};
like($h->{'content-security-policy'} // '', qr/default-src 'none'; style-src 'nonce-[0-9a-f]{32}'/, 'CSP: nothing but the nonce\'d style');
like($h->{'content-security-policy'} // '', qr/frame-ancestors 'none'/, 'CSP: frame-ancestors none');
is($h->{'x-frame-options'}, 'DENY', 'X-Frame-Options: DENY');
is($h->{'cache-control'}, 'no-store', 'Cache-Control: no-store');
is($h->{'referrer-policy'}, 'no-referrer', 'Referrer-Policy: no-referrer');
ok(-s "$p/shots/approve-page-390.png" && -s "$p/shots/approve-page-1280.png", 'screenshots at 390 and 1280 px');
ok(!$v->{overflow390} && !$v->{overflow1280}, 'nothing wider than the window at 390 or 1280 px (values wrap)');
if ($ENV{IDEM_SCREENSHOT_DIR} && -s "$p/shots/approve-page-1280.png") {
    copy("$p/shots/approve-page-$_.png", "$ENV{IDEM_SCREENSHOT_DIR}/approve-page-$_.png") for 390, 1280;
}
is($t->effects(key => $k1), 0, 'looking executes nothing');

# the list shows it; then Approve with the keyboard
my $l = browser('list', "$base/approve");
ok((grep { $_ eq $prop->{operation_id} } @{ $l->{ops} // [] }), 'the list shows the pending operation');

my $d = browser('decide', $url, 'approve');
is($d->{status}, 200, 'Approve (keyboard): 200') or diag(explain($d));
is($d->{title}, 'Approved', '... the result page says approved');
is(($t->record($k1, 'Bearer agent-7') // {})->{state}, 'approved', 'the record is approved');
is(($t->record($k1, 'Bearer agent-7') // {})->{approver}, 'alice', '... by the authenticated user');
my $r = pay($k1, $b1);
is($r->{status}, 201, 'the agent\'s retry executes') or diag($t->show($r));
is($t->effects(key => $k1), 1, 'upstream effect 1');
pay($k1, $b1);
is($t->effects(key => $k1), 1, 'still 1 after another retry');
ok($t->wait_for(sub { grep { /^outcome=executed approver="alice" key=\Q$k1\E$/ } $t->access_log }, 5),
   '$idempotency_approver is the authenticated user');

$l = browser('list', "$base/approve");
ok(!(grep { $_ eq $prop->{operation_id} } @{ $l->{ops} // [] }), 'the list no longer shows the finished operation');
$v = browser('view', $url);
ok(!$v->{approve} && !$v->{decline}, 'a finished operation\'s page has no buttons');
like($v->{why} // '', qr/no longer awaiting approval/, '... and says why');

# ---- Decline: every attempt is refused
my $k2 = $t->key('page-decline');
my $b2 = { amount => 990000, to => 'Mallory Ltd', ref => 'inv-9' };
my $p2 = proposal($k2, $b2);
$d = browser('decide', $p2->{approve_url}, 'decline');
is($d->{title}, 'Declined', 'Decline: the result page says declined') or diag(explain($d));
$r = pay($k2, $b2);
is($r->{status}, 403, 'the agent\'s retry: 403');
is($t->ptype($r), 'confirmation-declined', '... confirmation-declined');
is($t->effects(key => $k2), 0, 'upstream effect 0');
my $st = eval { decode_json($t->http(GET => "/status?op=$p2->{operation_id}")->{content}) } // {};
is($st->{state}, 'declined', 'status: declined');
is($st->{declined_by}, 'alice', 'status: who declined');
ok((grep { $_->{event} eq 'declined' && $_->{op} eq $p2->{operation_id} } @{ $t->audit_entries }),
   'the audit has the declined event');
$v = browser('view', $p2->{approve_url});
ok(!$v->{approve}, 'a declined operation\'s page has no buttons');
like($v->{why} // '', qr/already declined by alice/, '... and says who declined');

# ---- a form post from another origin is refused, effect 0
my $k3 = $t->key('page-evil');
my $p3 = proposal($k3, { amount => 1, to => 'x', ref => 'y' });
my $e = browser('evil', $p3->{approve_url});
is($e->{status}, 403, 'a post from another origin (another loopback port): 403') or diag(explain($e));
like($e->{result} // '', qr/another site/, '... the page says why');
is(($t->record($k3, 'Bearer agent-7') // {})->{state}, 'awaiting_confirmation', '... nothing recorded');
pay($k3, { amount => 1, to => 'x', ref => 'y' });
is($t->effects(key => $k3), 0, '... effect 0');

# ---- a token of operation A posted for B
my $k4 = $t->key('page-swap');
my $p4 = proposal($k4, { amount => 2, to => 'x', ref => 'y' });
my $s = browser('swap', $p3->{approve_url}, $p4->{approve_url});
is($s->{status}, 403, 'operation A\'s token for B: 403') or diag(explain($s));
like($s->{result} // '', qr/not valid for this operation/, '... the page says why');
is(($t->record($k4, 'Bearer agent-7') // {})->{state}, 'awaiting_confirmation', '... B is not approved');
is(($t->record($k3, 'Bearer agent-7') // {})->{state}, 'awaiting_confirmation', '... nor A');

# ---- a form replayed after a decision changes nothing
my $k6 = $t->key('page-twice');
my $p6 = proposal($k6, { amount => 6, to => 'x', ref => 'y' });
my $tw = browser('twice', $p6->{approve_url});
is($tw->{first}{title}, 'Approved', 'two tabs: the first approves');
is($tw->{second}{status}, 409, 'the second tab\'s form, replayed after the decision: 409') or diag(explain($tw));
like($tw->{second}{result} // '', qr/already decided: nothing changed/, '... the page says so');
is(($t->record($k6, 'Bearer agent-7') // {})->{state}, 'approved', '... the record is still approved');

# ---- an expired proposal: the page says so, no button; posting anyway is refused
my $k5 = $t->key('page-expired');
my $p5 = proposal($k5, { amount => 3, to => 'x', ref => 'y' }, '/pay-short');
my $wait = "$p/expired.flag";
my $bg = fork // die;
if (!$bg) {
    # the proposal lives 8 s: say it is over once Redis no longer has it
    $t->wait_for(sub { !$t->record($k5, 'Bearer agent-7') }, 10);
    open(my $f, '>', $wait); close $f;
    exit 0;
}
my $x = browser('stale', $p5->{approve_url}, $wait);
waitpid($bg, 0);
ok($x->{before}{approve}, 'while it lives: the Approve button');
ok(!$x->{after}{approve} && !$x->{after}{decline}, 'expired: no button');
like($x->{after}{why} // $x->{after}{result} // '', qr/expired/, '... the page says expired');
isnt($x->{posted}{status}, 200, 'posting the old form anyway is refused') or diag(explain($x));
like($x->{posted}{result} // '', qr/expired|nothing was recorded/, '... saying nothing was recorded');
pay($k5, { amount => 3, to => 'x', ref => 'y' }, '/pay-short');
is($t->effects(key => $k5), 0, 'effect 0');

done_testing();
