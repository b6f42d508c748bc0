#!/usr/bin/perl
# Tenant isolation: a stored response is only ever replayed to the scope
# that produced it; neither the scope value nor the raw key appears in clear
# anywhere in Redis (every key and every value is scanned, with marker
# strings in scopes and keys); the Authorization header (the scope here)
# never reaches error.log at levels up to info, whatever the outcome; the
# status endpoint reveals nothing across scopes (404 for another scope).

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use JSON::PP;
use Test::More;
use Idem::Test;

my $t = Idem::Test->new;
$t->start_redis;
# every command the module sends, with its arguments, lands in the slow log
$t->redis('CONFIG', 'SET', 'slowlog-max-len', 100000);
$t->redis('CONFIG', 'SET', 'slowlog-log-slower-than', 0);
$t->start_upstream;
my $conf = <<'EOF';
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%% timeout=300ms connect_timeout=300ms;
    idempotency_scope $http_authorization;
    location / {
        idempotency on;
        idempotency_fingerprint_headers X-Tenant-Note;
        proxy_ignore_client_abort on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /strict/ {
        idempotency on;
        idempotency_required on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /status {
        idempotency_status;
    }
}
EOF
$t->start_nginx($conf, error_log_level => 'info');

my $M = "ZQX$$";    # marker: appears in every scope and key of this file
my %SCOPE = map { $_ => "Bearer SCOPEMARK-$M-$_-secret" } qw(alice bob carol);
my @KEYS;
sub mkkey { my $k = "KEYMARK-$M-" . scalar(@KEYS) . '-' . int(rand 1e9); push @KEYS, $k; $k }
sub as { my ($who, @rest) = @_; return (headers => [ Authorization => $SCOPE{$who}, @rest ]) }
sub body_id { my $r = shift; my $j = eval { decode_json($r->{content}) }; ref $j ? $j->{id} : undef }

# ---- the same key in three scopes: three operations, each replayed only to its owner
my $shared = mkkey();
my %first;
for my $who (qw(alice bob carol)) {
    my $r = $t->http(POST => '/orders', key => $shared, json => { item => 'same' }, as($who));
    is($r->{status}, 201, "$who: the shared key executes in $who\'s scope");
    ok(!exists $r->{headers}{'idempotent-replayed'}, "$who: not a replay of another scope");
    $first{$who} = $r;
}
is($t->effects(key => $shared), 3, 'shared key: one effect per scope');
my %ids = map { body_id($first{$_}) => 1 } keys %first;
is(scalar(keys %ids), 3, 'three different upstream results');
for my $who (qw(alice bob carol)) {
    for my $round (1, 2) {
        my $r = $t->http(POST => '/orders', key => $shared, json => { item => 'same' }, as($who));
        is($r->{headers}{'idempotent-replayed'}, 'true', "$who retry $round: replayed");
        is(body_id($r), body_id($first{$who}), "$who retry $round: $who\'s own result, never another scope\'s");
    }
}
# a different body under the shared key: conflicts only within the scope; the
# problem carries nothing of the other scopes
{
    my $r = $t->http(POST => '/orders', key => $shared, json => { item => 'other' }, as('alice'));
    $t->is_problem($r, 409, 'fingerprint-mismatch', key => $shared, name => 'alice, other body: conflict in her scope');
    my $p = $t->problem($r) // {};
    unlike($r->{content}, qr/SCOPEMARK|"id"|body_sha256/, 'the conflict shows no scope and no stored response');
    my $dave = $t->http(POST => '/orders', key => $shared, json => { item => 'other' },
        headers => [ Authorization => "Bearer SCOPEMARK-$M-dave-secret" ]);
    is($dave->{status}, 201, 'a fourth scope with the same key and another body executes: scopes do not meet');
    push @KEYS, $shared;
    $SCOPE{dave} = "Bearer SCOPEMARK-$M-dave-secret";
}
# no scope at all (empty Authorization) is a scope of its own too
{
    my $r = $t->http(POST => '/orders', key => $shared, json => { item => 'same' });
    is($r->{status}, 201, 'no Authorization: its own (empty) scope executes');
    ok(!exists $r->{headers}{'idempotent-replayed'}, 'no Authorization: not a replay of a named scope');
    # scopes that differ only in case or whitespace are different scopes
    my $r2 = $t->http(POST => '/orders', key => $shared, json => { item => 'same' },
        headers => [ Authorization => lc $SCOPE{alice} ]);
    ok(!exists $r2->{headers}{'idempotent-replayed'}, 'a scope differing in case does not get alice\'s response');
}

# ---- many more outcomes, to put every kind of record and log line in place
{
    my $k = mkkey();
    # in flight (slow upstream) + a concurrent duplicate: in-progress
    my $bg = $t->http_bg(POST => '/slow', key => $k, json => { s => 1 }, as('bob', 'X-Delay' => 1));
    $t->wait_for(sub { $t->record($k, $SCOPE{bob}) }, 5);
    my $dup = $t->http(POST => '/slow', key => $k, json => { s => 1 }, as('bob'));
    $t->is_problem($dup, 409, 'in-progress', key => $k, name => 'bob duplicate while in flight: in-progress');
    my $first = $bg->result(20);
    is($first && $first->{status}, 201, 'bob slow request completes');
    # fingerprinted header carrying the marker too
    my $k2 = mkkey();
    $t->http(POST => '/note', key => $k2, json => {}, as('carol', 'X-Tenant-Note' => "NOTEMARK-$M"));
    my $c = $t->http(POST => '/note', key => $k2, json => {}, as('carol', 'X-Tenant-Note' => "NOTEMARK-$M-2"));
    $t->is_problem($c, 409, 'fingerprint-mismatch', name => 'carol, other fingerprinted header: conflict');
    # malformed and missing keys
    my $bad = $t->http(POST => '/orders', key => "KEYMARK-$M with space", json => {}, as('alice'));
    is($bad->{status}, 400, 'malformed key: 400');
    my $miss = $t->http(POST => '/strict/x', json => {}, as('alice'));
    is($miss->{status}, 400, 'missing key where required: 400');
    # upstream failures recorded as is: 500 from the upstream
    my $k3 = mkkey();
    my $u = $t->http(POST => '/fail', key => $k3, json => {}, as('alice', 'X-Status' => 500));
    is($u->{status}, 500, 'upstream 500 passes through (and is recorded)');
}

# ---- foreign value: store-error, logged, still no secrets
{
    my $k = mkkey();
    $t->redis('SET', $t->record_name($k, $SCOPE{carol}), 'not ours');
    my $r = $t->http(POST => '/foreign', key => $k, json => {}, as('carol'));
    $t->is_problem($r, 500, 'store-error', name => 'foreign value: 500 store-error');
    $t->redis('DEL', $t->record_name($k, $SCOPE{carol}));
}

# ---- the status endpoint: own scope only
{
    my $k = $shared;
    my $own = $t->http(GET => '/status', key => $k, as('alice'));
    is($own->{status}, 200, 'status, own scope: 200');
    my $j = eval { decode_json($own->{content}) } // {};
    is($j->{state}, 'completed', 'status, own scope: completed');
    my $op_alice = $j->{operation_id} // 'none';
    my $fp_alice = $j->{fingerprint} // 'none';

    my $k2 = mkkey();
    $t->http(POST => '/only-alice', key => $k2, json => { x => 1 }, as('alice'));
    for my $who (qw(bob carol)) {
        my $r = $t->http(GET => '/status', key => $k2, as($who));
        $t->is_problem($r, 404, 'not-found', name => "status of alice\'s key from $who: 404 not-found");
        unlike($r->{content}, qr/"state"|fingerprint|created_at|response_status/, "$who learns nothing of alice\'s record");
    }
    my $none = $t->http(GET => '/status', key => $k2);
    $t->is_problem($none, 404, 'not-found', name => 'status without Authorization: 404');
    my $case = $t->http(GET => '/status', key => $k2, headers => [ Authorization => uc $SCOPE{alice} ]);
    $t->is_problem($case, 404, 'not-found', name => 'status with alice\'s scope in another case: 404');
    my $bob = $t->http(GET => '/status', key => $k, as('bob'));
    my $jb = eval { decode_json($bob->{content}) } // {};
    is($bob->{status}, 200, 'bob asks for the shared key: his own record');
    isnt($jb->{operation_id} // '', $op_alice, 'bob sees his operation id, not alice\'s');
    isnt($jb->{fingerprint} // '', $fp_alice, 'bob sees his fingerprint, not alice\'s');
    is($t->effects(uri => '/status'), 0, 'the status endpoint never reaches the upstream');
}

# ---- every key and every value in Redis: no scope, no raw key in clear
{
    my @names = $t->redis_keys('*');
    ok(@names >= 8, scalar(@names) . ' keys in Redis');
    my @leaks;
    my $values = 0;
    for my $name (@names) {
        push @leaks, "key name $name" if $name =~ /SCOPEMARK|KEYMARK|NOTEMARK|\Q$M\E/;
        my $type = $t->redis('TYPE', $name);
        my @v;
        if ($type eq 'string') { @v = ($t->redis('GET', $name)) }
        elsif ($type eq 'hash') { @v = @{ $t->redis('HGETALL', $name) } }
        elsif ($type eq 'list') { @v = @{ $t->redis('LRANGE', $name, 0, -1) } }
        elsif ($type eq 'set') { @v = @{ $t->redis('SMEMBERS', $name) } }
        elsif ($type eq 'zset') { @v = @{ $t->redis('ZRANGE', $name, 0, -1, 'WITHSCORES') } }
        elsif ($type eq 'stream') {
            my $x = $t->redis('XRANGE', $name, '-', '+');
            @v = map { ($_->[0], @{ $_->[1] }) } @$x;
        } else { push @leaks, "unexpected type $type of $name" }
        for my $v (@v) {
            $values++;
            next unless defined $v;
            push @leaks, "value in $name: " . substr($v, 0, 120) if $v =~ /SCOPEMARK|KEYMARK|NOTEMARK|\Q$M\E/;
            for my $s (values %SCOPE) { push @leaks, "scope $s in $name" if index($v, $s) >= 0 }
            for my $k (@KEYS) { push @leaks, "key $k in $name" if index($v, $k) >= 0 }
        }
    }
    # one value per record (layout 2, a string), and the scan reads them all
    ok($values >= @names && $values >= 8, "$values values scanned");
    ok(!@leaks, 'no scope, key or fingerprinted header value in clear in Redis') or diag(join "\n", @leaks[0 .. ($#leaks < 20 ? $#leaks : 19)]);
    # nor in what the module sent: the slow log keeps every command's
    # arguments (the first 128 bytes of each, where the markers are)
    $t->redis('ECHO', "control-$M");    # the scan must find this one
    my $slow = $t->redis('SLOWLOG', 'GET', 100000);
    my @cmds = grep { ref $_->[3] eq 'ARRAY' } @{ ref $slow eq 'ARRAY' ? $slow : [] };
    # the claims (SET ... NX PX ... GET) and the scripts that close them
    my @scripts = grep { $_->[3][0] =~ /^(?:eval(?:sha)?|set)$/i } @cmds;
    ok(@scripts > 20, scalar(@scripts) . ' claims and script calls in the slow log, with their arguments');
    my @sent = grep { join("\0", @{ $_->[3] }) =~ /SCOPEMARK|KEYMARK|NOTEMARK|\Q$M\E/ } @cmds;
    is(scalar(grep { lc $_->[3][0] eq 'echo' } @sent), 1, 'the scan finds a marker sent on purpose');
    @sent = grep { lc $_->[3][0] ne 'echo' } @sent;
    ok(!@sent, 'no command sent to Redis carries a scope, key or header value in clear')
        or diag(explain [ map { $_->[3] } @sent[0 .. ($#sent < 5 ? $#sent : 4)] ]);
}

# ---- Redis unreachable (last: the restart empties Redis): store-unavailable,
# logged, still no secrets
{
    $t->stop_redis;
    my $k = mkkey();
    my $r = $t->http(POST => '/down', key => $k, json => {}, as('alice'));
    $t->is_problem($r, 503, 'store-unavailable', name => 'Redis down: 503 store-unavailable');
    $t->start_redis;
    $t->wait_for(sub { $t->http(POST => '/up', key => mkkey(), json => {}, as('alice'))->{status} == 201 }, 10);
}

# ---- error.log at level info: never the Authorization value
$t->check_logs;
{
    my $log = $t->error_log;
    ok(length($log) > 0, 'error.log written (level info)');
    like($log, qr/\[(?:info|notice|warn|error)\]/, 'error.log has lines at info..error');
    my @hits = grep { /SCOPEMARK|\Q-secret\E/ } split /\n/, $log;
    ok(!@hits, 'the Authorization value (scope) never reaches error.log') or diag(join "\n", @hits[0 .. ($#hits < 10 ? $#hits : 9)]);
    my @notes = grep { /NOTEMARK/ } split /\n/, $log;
    ok(!@notes, 'fingerprinted header values never reach error.log') or diag(join "\n", @notes[0 .. ($#notes < 10 ? $#notes : 9)]);
    my @access = grep { /SCOPEMARK/ } $t->access_log;
    ok(!@access, 'nor the access log with the default variables') or diag($access[0]);
}

done_testing;
