#!/usr/bin/perl
# build/idempotency-mcp driven by the official MCP TypeScript SDK's Client
# and StdioClientTransport (t/mcp/client.mjs, @modelcontextprotocol/sdk
# pinned by t/mcp/package-lock.json, installed with `npm ci` in t/mcp),
# against nginx + the module + Redis + the counting upstream: each item of
# the acceptance list of docs/agents.md's MCP section, the upstream's
# effects counted, and a random credential searched for in every result,
# every stderr line and every state file. The configuration's refusals are
# checked here directly.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use POSIX ();
use Digest::SHA ();
use Idem::Test;

my $ROOT = "$FindBin::Bin/..";
my $BIN  = "$ROOT/build/idempotency-mcp";
my $NODE_MODULES = "$FindBin::Bin/mcp/node_modules/\@modelcontextprotocol/sdk";

unless (-d $NODE_MODULES) {
    plan skip_all => 't/mcp/node_modules missing (cd t/mcp && npm ci)' if $ENV{IDEM_ALLOW_SKIP};
    print "1..1\nnot ok 1 - t/mcp/node_modules missing: run npm ci in t/mcp\n";
    exit 1;
}
for my $b ($BIN, "$ROOT/build/idempotency-approve") {
    next if -x $b;
    print "1..1\nnot ok 1 - $b missing: run make tools\n";
    exit 1;
}

my $t = Idem::Test->new;
my $P = $t->prefix;
system("openssl rand -hex 32 > $P/hs.key") == 0 or BAIL_OUT('openssl rand');

$t->start_stack(<<"EOF");
idempotency_json_var \$environment /environment;
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    idempotency_scope \$http_authorization;
    proxy_ignore_client_abort on;
    location /tickets {
        idempotency on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /deployments {
        idempotency on;
        idempotency_lock deploy:\$environment;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /pay {
        idempotency on;
        idempotency_confirm on;
        idempotency_confirm_show /amount;
        idempotency_confirm_key hs256 $P/hs.key;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /admin {
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /approve {
        idempotency_approve;
    }
    location = /idempotency/status {
        idempotency_status;
    }
}
EOF

my $BASE  = 'http://127.0.0.1:' . $t->nginx_port;
my $TOKEN = 'Bearer tok-' . join '', map { sprintf '%02x', int rand 256 } 1 .. 24;
my $SD    = "$P/state";
my $JSON  = JSON::PP->new->canonical;

sub spew_mode {
    my ($f, $text, $mode) = @_;
    Idem::Test::_spew($f, $text);
    chmod $mode, $f;
}

my %target = (base_url => $BASE, headers => { Authorization => { env => 'MCP_TEST_TOKEN' } },
    methods => [qw(POST PUT PATCH)], paths => [qw(/tickets /deployments /pay)],
    status_url => "$BASE/idempotency/status", max_time => 2, deadline => 20);
# "other": another target on the same gateway, for the operation_status
# refusal of an operation that was sent to "api"
my %other = (%target, base_url => "$BASE/admin", paths => ['/']);
spew_mode("$P/mcp.json", $JSON->encode({ state_dir => $SD, targets => { api => \%target, other => \%other } }), 0600);

# ---- the configuration's refusals: each names the member, none the secret
sub server_with {
    my ($cfg, %env) = @_;
    my $pid = fork // die;
    if ($pid == 0) {
        $ENV{$_} = $env{$_} for keys %env;
        open STDIN, '<', '/dev/null';
        open STDOUT, '>', "$P/cfg.out";
        open STDERR, '>', "$P/cfg.err";
        { no warnings 'exec'; exec $BIN, '--config', $cfg; }
        POSIX::_exit(127);
    }
    waitpid($pid, 0);
    return ($? >> 8, Idem::Test::_slurp("$P/cfg.err"));
}
{
    my $secret = 'Bearer inline-' . int(rand 1e9);
    my @cases = (
        [ 'malformed JSON', '{"targets": {', qr/malformed JSON/ ],
        [ 'no paths', { targets => { api => { base_url => $BASE } } }, qr/targets\.api\.paths/ ],
        [ 'unknown member', { targetz => {} }, qr/\(top\)\.targetz: unknown member/ ],
        [ 'bad base_url', { targets => { api => { base_url => 'ftp://x', paths => ['/'] } } }, qr/targets\.api\.base_url/ ],
        [ 'bad header value', { targets => { api => { %target, headers => { 'X-A' => 5 } } } },
          qr/targets\.api\.headers\.X-A: a string, \{"env"/ ],
        [ 'env not set', { targets => { api => { %target, headers => { Authorization => { env => 'NOPE_NOT_SET' } } } } },
          qr/targets\.api\.headers\.Authorization: \{"env": "NOPE_NOT_SET"\}: the variable is not set/ ],
        [ 'method', { targets => { api => { %target, methods => ['GET'] } } }, qr/targets\.api\.methods\[0\]/ ],
        [ 'deadline', { targets => { api => { %target, deadline => -1 } } }, qr/targets\.api\.deadline/ ],
        [ 'base_url with userinfo', { targets => { api => { %target, base_url => "http://u:$secret\@127.0.0.1:1" } } },
          qr/targets\.api\.base_url: an http:\/\/ or https:\/\/ URL, without user:password\@/ ],
        [ 'base_url with a query', { targets => { api => { %target, base_url => "$BASE/?token=$secret" } } },
          qr/targets\.api\.base_url: .*query/ ],
        [ 'status_url with userinfo', { targets => { api => { %target, status_url => "http://u:$secret\@127.0.0.1:1/s" } } },
          qr/targets\.api\.status_url: .*user:password\@/ ],
        [ 'status_url with a query', { targets => { api => { %target, status_url => "$BASE/idempotency/status?t=$secret" } } },
          qr/targets\.api\.status_url: .*query/ ],
    );
    for my $c (@cases) {
        my ($name, $cfg, $re) = @$c;
        spew_mode("$P/bad.json", ref $cfg ? $JSON->encode($cfg) : $cfg, 0600);
        my ($rc, $err) = server_with("$P/bad.json", MCP_TEST_TOKEN => 'Bearer x');
        is($rc, 78, "config $name: refused, exit 78");
        like($err, $re, "config $name: the message names the member") or diag($err);
        unlike($err, qr/\Q$secret\E/, "config $name: and not the secret");
    }
    my ($rc, $err) = server_with("$P/does-not-exist.json");
    is($rc, 78, 'unreadable config: exit 78');
    like($err, qr/does-not-exist\.json: cannot read it/, 'unreadable config: says so');

    my $inline = $JSON->encode({ state_dir => $SD, targets => { api => { %target,
        headers => { Authorization => $secret } } } });
    spew_mode("$P/inline.json", $inline, 0644);
    ($rc, $err) = server_with("$P/inline.json");
    is($rc, 78, 'an inline secret in a world-readable config: refused');
    like($err, qr/holds a header value \(a secret\) and is readable by group or others \(mode 0644\)/,
        '... the message says why');
    unlike($err, qr/\Q$secret\E/, '... and does not show the secret');
    chmod 0600, "$P/inline.json";
    ($rc, $err) = server_with("$P/inline.json");
    is($rc, 0, 'the same config, mode 0600: the server starts (and ends with stdin)') or diag($err);
    spew_mode("$P/secret-file", "$secret\n", 0644);
    spew_mode("$P/sf.json", $JSON->encode({ targets => { api => { %target,
        headers => { Authorization => { file => "$P/secret-file" } } } } }), 0600);
    ($rc, $err) = server_with("$P/sf.json");
    is($rc, 78, 'a secret file readable by others: refused');
    like($err, qr/targets\.api\.headers\.Authorization: \{"file": ".*secret-file"\}: readable/, '... naming the member');
    unlike($err, qr/\Q$secret\E/, '... and not the secret');
}

# ---- an operation begun by idempotency-call (x-shared), finished by the MCP
#      server; one begun by the MCP server (x-shared2) finished by idempotency-call
sub call_tool {
    my ($op, $body) = @_;
    my $out = `$ROOT/build/idempotency-call --op $op --state-dir $SD -H 'Authorization: $TOKEN' -H 'Content-Type: application/json' --status-url $BASE/idempotency/status -X POST $BASE/tickets -d '$body' 2>&1`;
    return eval { JSON::PP->new->decode($out) } // { raw => $out };
}
my $shared1 = call_tool('x-shared', '{"title":"shared"}');
is($shared1->{outcome}, 'created', 'idempotency-call begins x-shared');

# ---- the SDK client's scenarios
my %env = (MCP_BIN => $BIN, MCP_CONFIG => "$P/mcp.json", MCP_STATE_DIR => $SD,
    MCP_EFFECTS => "$P/effects.log", MCP_BASE => $BASE, MCP_APPROVE => "$ROOT/build/idempotency-approve",
    MCP_REPORT => "$P/report.json", MCP_STDERR => "$P/mcp-stderr.log", MCP_TEST_TOKEN => $TOKEN);
{
    local @ENV{ keys %env } = values %env;
    system('node', "$FindBin::Bin/mcp/client.mjs");
    is($?, 0, 'the node client ran to its end');
}
my $report_text = Idem::Test::_slurp("$P/report.json");
my $R = eval { JSON::PP->new->decode($report_text) } // {};
for my $k (grep { /^error_/ } sort keys %$R) {
    fail("client step $k") ; diag($R->{$k});
}

sub sc { my $r = shift; ($r // {})->{structuredContent} // {} }
sub outcome { sc(shift)->{outcome} // 'none' }
sub key_of { sc(shift)->{idempotency_key} }

# the text content is the same JSON as structuredContent
sub same_text {
    my ($r, $name) = @_;
    my $txt = eval { JSON::PP->new->decode((($r // {})->{content} // [{}])->[0]{text} // '') };
    is_deeply($txt, sc($r), "$name: the text content is structuredContent's JSON");
}

# initialize, each protocol version
is($R->{versions}{'2025-11-25'}, '2025-11-25', 'initialize 2025-11-25: answered with it');
is($R->{versions}{'2025-06-18'}, '2025-06-18', 'initialize 2025-06-18: answered with it');
is($R->{versions}{'2025-03-26'}, '2025-03-26', 'initialize 2025-03-26: answered with it');
is($R->{versions}{'2024-01-01'}, '2025-11-25', 'an unsupported version: the newest');
for my $v (qw(2025-11-25 2025-06-18 2025-03-26)) {
    my $r = $R->{versionsClient}{$v} // {};
    is($r->{answered}, $v, "the SDK Client initialized with $v: answered $v");
    is($r->{tools}, 'idempotent_request,list_operations,operation_status', "... and tools/list works under it");
}

# tools/list
{
    my %tools = map { $_->{name} => $_ } @{ $R->{tools} // [] };
    is(join(',', sort keys %tools), 'idempotent_request,list_operations,operation_status', 'tools/list: the three tools');
    my $ir = $tools{idempotent_request} // {};
    is_deeply($ir->{annotations} && { map { $_ => $ir->{annotations}{$_} ? 1 : 0 }
        qw(readOnlyHint destructiveHint idempotentHint openWorldHint) },
        { readOnlyHint => 0, destructiveHint => 1, idempotentHint => 1, openWorldHint => 1 },
        'idempotent_request: its annotations');
    is(join(',', sort @{ $ir->{inputSchema}{required} // [] }), 'operation,path,target', 'its required arguments');
    is(join(',', sort keys %{ $ir->{inputSchema}{properties} // {} }),
        'body,body_text,content_type,headers,method,new_operation,operation,path,target', 'its arguments');
    ok($tools{$_}{outputSchema}{type} eq 'object', "$_: an outputSchema") for sort keys %tools;
}

# created, replayed
{
    is(outcome($R->{created}), 'created', 'first call: created');
    ok(!$R->{created}{isError}, 'created: isError false');
    same_text($R->{created}, 'created');
    is(sc($R->{created})->{response}{status}, 201, 'the response status');
    is(sc($R->{created})->{response}{body}{body_len}, length('{"title":"a"}'), 'the response body, JSON');
    like(sc($R->{created})->{operation_id} // '', qr/^[0-9a-f]{32}$/, 'operation_id');
    like(sc($R->{created})->{next_step} // '', qr/^Done/, 'next_step');
    is(outcome($R->{replayed}), 'replayed', 'second call: replayed');
    is(key_of($R->{replayed}), key_of($R->{created}), 'the same key');
    is($t->effects(key => key_of($R->{created})), 1, 'created + replayed: effect 1');
    my ($e) = $t->effect_list(key => key_of($R->{created}));
    is($e && $e->{auth}, $TOKEN, 'the target\'s credential reached the upstream (and only there)');
    is($e && $e->{ct}, 'application/json', 'the body went as application/json');
}

# a lost response (upstream slower than max_time), then the call again
{
    is(outcome($R->{lost1}), 'replayed', 'response lost (max_time): the call waits and gets the replay');
    cmp_ok(sc($R->{lost1})->{attempts} // 0, '>=', 2, '... after more than one attempt');
    is(outcome($R->{lost2}), 'replayed', 'the call again: replayed');
    is($t->effects(key => key_of($R->{lost1})), 1, 'lost response: effect 1');
}

# a body that is not text
{
    my $b = sc($R->{binary})->{response} // {};
    is(outcome($R->{binary}), 'created', 'a binary answer: created');
    ok($b->{binary} && !defined $b->{body}, '... its body is not given as text');
    my $big = sc($R->{big})->{response} // {};
    is(outcome($R->{big}), 'created', 'a 3 MB answer: created') or diag(explain(sc($R->{big})));
    ok($big->{truncated}, '... marked truncated (only 1 MiB is kept in memory)') or diag(explain($big));
    is($big->{body_bytes}, 3000000, '... all its bytes counted');
    is($b->{body_bytes}, 70000, '... only its size');
}

# operation_status, list_operations
{
    is(sc($R->{status})->{state}, 'completed', 'operation_status: completed');
    is(sc($R->{status})->{last}{outcome}, 'replayed', '... with the last local outcome');
    my @ops = map { $_->{operation} } @{ sc($R->{list})->{operations} // [] };
    ok((grep { $_ eq 't-created' } @ops) && (grep { $_ eq 't-lost' } @ops), 'list_operations: the operations');
}

# concurrency
{
    my @o = map { outcome($_) } @{ $R->{conc} // [] };
    is(scalar @o, 20, '20 concurrent calls of one operation: 20 answers');
    # one created, unless the first attempt outlived max_time on a slow machine
    cmp_ok(scalar(grep { $_ eq 'created' } @o), '<=', 1, '... at most one created');
    is(scalar(grep { /^(created|replayed)$/ } @o), 20, '... the others replayed') or diag("@o");
    is($t->effects(key => $R->{concKey}), 1, '... effect 1');
    cmp_ok($R->{pendingAtPing} // 0, '>', 0, 'ping answered while calls were waiting');
    my @many = @{ $R->{many} // [] };
    is(scalar(grep { outcome($many[$_]) eq 'created' && sc($many[$_])->{operation} eq "t-many-$_" } 0 .. $#many), 20,
        '20 concurrent operations: each answer is its own (matched by id)');
    my %keys = map { (key_of($_) // '') => 1 } @many;
    is(scalar keys %keys, 20, '... 20 keys');
    is(scalar(grep { $t->effects(key => $_) == 1 } keys %keys), 20, '... 20 effects, one each');
}

# conflict, new_operation
{
    is(outcome($R->{conf1}), 'created', 'conflict: the first body executes');
    is(outcome($R->{conf2}), 'conflict', 'a changed body under the same operation: conflict');
    ok($R->{conf2}{isError}, '... isError');
    like(sc($R->{conf2})->{next_step} // '', qr/^Stop/, '... next_step says stop');
    is(outcome($R->{confTrue}), 'created', 'new_operation: true executes a second time');
    isnt(key_of($R->{confTrue}), key_of($R->{conf1}), '... under a new key');
    is(outcome($R->{confBad}), 'refused', 'new_operation: neither true nor a key: refused');
    like(sc($R->{confBad})->{detail} // '', qr/idempotency_key of the action it replaces/, '... the detail says what to pass');
    is(outcome($R->{conf3}), 'created', 'new_operation: the replaced key: executes again');
    isnt(key_of($R->{conf3}), key_of($R->{confTrue}), '... under a new key');
    is(outcome($R->{conf4}), 'replayed', 'the same call again (a host retry): the new action replays');
    is(key_of($R->{conf4}), key_of($R->{conf3}), '... under the new key, not a fourth');
    is($t->effects(key => key_of($R->{conf1})), 1, 'the first: effect 1');
    is($t->effects(key => key_of($R->{confTrue})), 1, 'the second (true): effect 1');
    is($t->effects(key => key_of($R->{conf3})), 1, 'the third (by key): effect 1');
}

# confirmation_required, approval, executes once
{
    is(outcome($R->{confirm1}), 'confirmation_required', 'confirmation_required');
    like(sc($R->{confirm1})->{proposal}{fingerprint} // '', qr/^[0-9a-f]{64}$/, '... with the proposal');
    like(sc($R->{confirm1})->{next_step} // '', qr/person must approve/, '... next_step: a person approves');
    like($R->{approveOut} // '', qr/"state":"approved"/, 'idempotency-approve approved it');
    is(outcome($R->{confirm2}), 'created', 'the same call after the approval: created');
    is(outcome($R->{confirm3}), 'replayed', 'and again: replayed');
    is($t->effects(key => key_of($R->{confirm2})), 1, 'approved: effect 1');
}

# lock_held, in_progress, unknown
{
    is(outcome($R->{lock}), 'created', 'lock held by another operation: waited out, created');
    cmp_ok(sc($R->{lock})->{attempts} // 0, '>=', 2, '... after lock_held answers');
    is($t->effects(key => key_of($R->{lock})), 1, '... effect 1');
    is($R->{holderStatus}, 201, 'the holder completed');
    is(outcome($R->{inprog}), 'replayed', 'in progress in another server process: waited out, replayed');
    like(outcome($R->{inprogFirst}), qr/^(created|replayed)$/, '... the first call done too');
    is($t->effects(key => key_of($R->{inprog})), 1, '... effect 1');
    is(outcome($R->{unknown}), 'unknown', 'a lost outcome: unknown');
    like(sc($R->{unknown})->{next_step} // '', qr/^Stop: .*operator/, '... next_step names the operator');
    is($t->effects(key => key_of($R->{unknown})), 1, '... effect 1, no resend');
}

# kill -9 of the server during a call
{
    ok($R->{killDuring}, 'kill -9: the call was executing upstream');
    like(outcome($R->{killAgain}), qr/^(replayed|created)$/, 'a new server, the same call: done');
    is(key_of($R->{killAgain}), $R->{killKey}, '... with the persisted key');
    is($t->effects(key => $R->{killKey}), 1, 'kill -9: effect 1');
}

# refusals
{
    my $r = $R->{refusals} // {};
    for my $n (qw(outside dotdot absolute hostpath authHeader keyHeader unknownTarget method wrongType badOp)) {
        is(outcome($r->{$n}), 'refused', "refused: $n");
        ok($r->{$n}{isError}, "$n: isError");
    }
    like(sc($r->{outside})->{detail} // '', qr/outside the target's paths/, 'outside: says why');
    like(sc($r->{dotdot})->{detail} // '', qr/"\.\." segment/, '..: says why');
    for my $n (qw(dotdotParam dotParam escDot escSlash escBackslash escPercent backslash noBoundary
                  overrideHeader forwardedHeader originalUrl statusOtherTarget)) {
        is(outcome($r->{$n}), 'refused', "refused: $n");
        ok($r->{$n}{isError}, "$n: isError");
    }
    like(sc($r->{dotdotParam})->{detail} // '', qr/"\.\." segment/, '..;: says why');
    like(sc($r->{escPercent})->{detail} // '', qr/escaped dot, slash, backslash or percent/, '%25: says why');
    like(sc($r->{noBoundary})->{detail} // '', qr/outside the target's paths/, '/tickets-admin: outside /tickets');
    like(sc($r->{overrideHeader})->{detail} // '', qr/x-http-method-override may not be set/, 'method override: says why');
    like(sc($r->{forwardedHeader})->{detail} // '', qr/X-Forwarded-Host may not be set/, 'X-Forwarded-*: says why');
    like(sc($r->{statusOtherTarget})->{detail} // '', qr/not sent to this target/, 'status with another target: says why');
    ok(!defined sc($r->{statusOtherTarget})->{idempotency_key}, '... and shows no key') or diag(explain($r->{statusOtherTarget}));
    is(scalar(grep { $_->{uri} =~ m{admin} } $t->effect_list), 0, 'nothing sent toward /admin for a refusal');
    ok(!-e "$SD/r-$_.json", "no state file for refusal r-$_") for 9 .. 19;
    like(sc($r->{authHeader})->{detail} // '', qr/Authorization may not be set/, 'Authorization: says why');
    like(sc($r->{unknownTarget})->{detail} // '', qr/not a target/, 'unknown target: says why');
    like(sc($r->{method})->{detail} // '', qr/DELETE is not allowed/, 'method: says why');
    is(($r->{unknownTool}{rpcError} // {})->{code}, -32602, 'an unknown tool: JSON-RPC -32602');
    is($R->{pingAfterRefusals}, '{}', 'ping answered after the refusals');
    is(scalar($t->effect_list(uri => '/admin/users')), 0, 'nothing sent for a refusal');
    ok(!-e "$SD/r-1.json", 'no state file for a refusal');
}

# numbers cJSON cannot send unchanged: refused, nothing sent
{
    my $l = $R->{lossy} // {};
    for my $n (qw(big exact neg inf)) {
        is(outcome($l->{$n}), 'refused', "a body with a lossy number ($n): refused") or diag(explain($l->{$n}));
        ok($l->{$n}{isError}, "... $n: isError");
        like(sc($l->{$n})->{detail} // '', qr/magnitude 2\^53 \(9007199254740992\) or more, or not finite/, "... $n: says why");
        ok(!-e "$SD/n-$n.json", "... $n: no state file");
    }
    is(outcome($l->{max}), 'created', '2^53 - 1 and 0.1: sent') or diag(explain($l->{max}));
    my ($e) = $t->effect_list(key => key_of($l->{max}));
    is($e && $e->{sha}, Digest::SHA::sha256_hex('{"n":9007199254740991,"f":0.1}'), '... unchanged');
}

# malformed JSON-RPC lines
{
    my @want = (-32700, -32600, -32600, -32600, -32600, -32600, -32602, -32602, -32601, -32700, -32700, -32600);
    my @m = @{ $R->{malformed} // [] };
    is(scalar @m, scalar @want, 'each malformed line was sent');
    for my $i (0 .. $#m) {
        my @got = @{ $m[$i]{got} };
        my ($err) = grep { $_->{error} } @got;
        is($err && $err->{error}{code}, $want[$i], "malformed: $m[$i]{sent}: error $want[$i]");
        ok((grep { ($_->{id} // '') eq 1001 + $i && $_->{result} } @got), '... and ping still answered');
    }
    is(($R->{malformedExit} // {})->{code}, 0, 'the server ends cleanly at the end of stdin');
}

# cancelled, and the other program's operations
{
    ok(($R->{cancelFirst}{rpcError} // {})->{message}, 'a cancelled call: the client stopped waiting');
    is($R->{cancelPing}, '{}', 'ping answered after the cancel');
    like($R->{cancelKey} // '', qr/^[0-9a-f]{32}$/, 'the key is kept');
    is(key_of($R->{cancelAgain}), $R->{cancelKey}, 'the same call again: the same key');
    is(outcome($R->{cancelAgain}), 'replayed', '... and the one execution\'s answer');
    is($t->effects(key => $R->{cancelKey}), 1, 'cancelled: effect 1');

    is(outcome($R->{sharedMcp}), 'replayed', 'begun by idempotency-call, finished by idempotency-mcp: replayed');
    is(key_of($R->{sharedMcp}), $shared1->{key}, '... with its key');
    is($t->effects(key => $shared1->{key}), 1, '... effect 1');
    is(outcome($R->{sharedMcp2}), 'created', 'idempotency-mcp begins x-shared2');
    my $again = call_tool('x-shared2', '{"title":"shared2"}');
    is($again->{outcome}, 'replayed', '... idempotency-call finishes it: replayed');
    is($t->effects(key => key_of($R->{sharedMcp2})), 1, '... effect 1');
}

# the credential: in no result, no stderr line, no state file
{
    unlike($report_text, qr/\Q$TOKEN\E|tok-[0-9a-f]{48}/, 'the credential is in no result');
    my $stderr = Idem::Test::_slurp("$P/mcp-stderr.log");
    ok(length $stderr, 'the servers wrote log lines');
    unlike($stderr, qr/\Q$TOKEN\E|tok-[0-9a-f]{48}/, 'the credential is in no stderr line');
    my @files = glob("$SD/*");
    ok(@files > 20, 'state files were written');
    is(scalar(grep { Idem::Test::_slurp($_) =~ /\Q$TOKEN\E|tok-[0-9a-f]{48}/ } @files), 0,
        'the credential is in no state file');
}

$t->check_logs;
done_testing;
