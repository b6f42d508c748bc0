#!/usr/bin/perl
# build/idempotency-call against nginx + the module + Redis + the counting
# upstream: a created action replays on rerun; a response cut on its way
# back, an upstream slower than --max-time, a changed body, an unknown
# outcome, kill -9 of the tool at three points, concurrent runs of one
# --op, and bad input. The upstream's effect count is checked each time.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Digest::SHA ();
use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use POSIX ();
use Time::HiRes qw(time sleep);
use Idem::Test;

my $TOOL = "$FindBin::Bin/../build/idempotency-call";
unless (-x $TOOL) {
    print "1..1\nnot ok 1 - build/idempotency-call missing: run make tools\n";
    exit 1;
}

my $t = Idem::Test->new;
$t->start_stack(<<'EOF');
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    idempotency_scope $http_authorization;
    location / {
        idempotency on;
        proxy_ignore_client_abort on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /idempotency/status {
        idempotency_status;
    }
}
EOF

delete $ENV{IDEMPOTENCY_CALL_TEST_PAUSE};
my $P      = $t->prefix;
my $SD     = "$P/state";
my $BASE   = 'http://127.0.0.1:' . $t->nginx_port;
my $STATUS = "$BASE/idempotency/status";
my $AUTH   = "Bearer agent-$$";
my $RUNS   = 0;

# the argument list of one call: op, body, extra headers, where to send
sub args {
    my ($op, %o) = @_;
    return ('--op', $op, '--state-dir', $o{state_dir} // $SD,
        ($o{no_status} ? () : ('--status-url', $STATUS)),
        '--max-time', $o{max_time} // 5, '--deadline', $o{deadline} // 20,
        '-H', "Authorization: $AUTH", '-H', 'Content-Type: application/json',
        (map { ('-H', $_) } @{ $o{headers} // [] }),
        @{ $o{extra} // [] },
        '-X', $o{method} // 'POST', $o{url} // "$BASE/tickets",
        '-d', $o{data} // '{"title":"disk full"}');
}

sub spawn_call {
    my ($args, %env) = @_;
    my $n = ++$RUNS;
    my $c = { out => "$P/call-$n.out", err => "$P/call-$n.err" };
    $c->{pid} = fork;
    die "fork: $!" unless defined $c->{pid};
    if ($c->{pid} == 0) {
        $ENV{$_} = $env{$_} for keys %env;
        open STDIN, '<', '/dev/null';
        open STDOUT, '>', $c->{out};
        open STDERR, '>', $c->{err};
        { no warnings 'exec'; exec { $TOOL } $TOOL, @$args; }
        POSIX::_exit(127);
    }
    return $c;
}

# waits for the run; rc, sig, json (the stdout object), err
sub finish {
    my ($c) = @_;
    waitpid($c->{pid}, 0);
    $c->{rc} = $? >> 8;
    $c->{sig} = $? & 127;
    my $out = Idem::Test::_slurp($c->{out});
    $c->{json} = eval { JSON::PP->new->decode($out) };
    $c->{stdout} = $out;
    $c->{err} = Idem::Test::_slurp($c->{err});
    return $c;
}

sub call { finish(spawn_call([ args(@_) ])) }

sub state_of {
    my ($op, $dir) = @_;
    my $s = Idem::Test::_slurp(($dir // $SD) . "/$op.json");
    return length $s ? eval { JSON::PP->new->decode($s) } : undef;
}

sub stopped {
    my ($pid) = @_;
    return (Idem::Test::_slurp("/proc/$pid/stat") =~ /\)\s+T\b/) ? 1 : 0;
}

sub show { my $c = shift; "rc=$c->{rc} sig=$c->{sig}\nstdout: $c->{stdout}\nstderr: $c->{err}" }

# ---- a first call executes, a rerun with the same --op replays
{
    my $c = call('basic');
    is($c->{rc}, 0, 'first call: exit 0') or diag(show($c));
    my $j = $c->{json} // {};
    is($j->{outcome}, 'created', 'outcome created');
    like($j->{key} // '', qr/^[0-9a-f]{32}$/, 'key: 128 bits, 32 hex');
    is($j->{status}, 201, 'status of the upstream');
    is(ref $j->{body} && $j->{body}{body_len}, length '{"title":"disk full"}',
        'body: the upstream\'s JSON, parsed');
    like($j->{operation_id} // '', qr/^[0-9a-f]{32}$/, 'operation_id from the status endpoint');
    is($j->{attempts}, 1, 'one attempt');
    my $st = state_of('basic');
    is($st && $st->{key}, $j->{key}, 'the state file holds that key');
    is($st && $st->{last}{outcome}, 'created', 'and records the outcome');
    is((stat "$SD/basic.json")[2] & 0777, 0600, 'state file mode 0600');
    is((stat $SD)[2] & 0777, 0700, 'state dir mode 0700');
    is($t->effects(key => $j->{key}), 1, 'one effect');

    my $c2 = call('basic');
    is($c2->{rc}, 10, 'rerun: exit 10') or diag(show($c2));
    is($c2->{json}{outcome}, 'replayed', 'rerun: replayed');
    is($c2->{json}{key}, $j->{key}, 'rerun: same key');
    is_deeply($c2->{json}{body}, $j->{body}, 'rerun: the same body');
    is($c2->{json}{operation_id}, $j->{operation_id}, 'rerun: same operation_id');
    is($t->effects(key => $j->{key}), 1, 'still one effect');

    my $c3 = call('basic', extra => ['--new']);
    is($c3->{json}{outcome}, 'created', '--new: a new action executes');
    isnt($c3->{json}{key}, $j->{key}, '--new: a new key');
    is($t->effects(key => $c3->{json}{key}), 1, '--new: its own effect');
    is($t->effects(key => $j->{key}), 1, 'the old action still has one');

    # --replaces: a new action only while the state holds the key it names, so a job
    # runner that reruns the step resumes the replacement instead of a third action
    my $c4 = call('basic', extra => ['--replaces', $c3->{json}{key}]);
    is($c4->{json}{outcome}, 'created', '--replaces KEY: a new action executes') or diag(show($c4));
    isnt($c4->{json}{key}, $c3->{json}{key}, '--replaces KEY: under a new key');
    my $c5 = call('basic', extra => ['--replaces', $c3->{json}{key}]);
    is($c5->{rc}, 10, '--replaces KEY again: exit 10') or diag(show($c5));
    is($c5->{json}{outcome}, 'replayed', '--replaces KEY again: the replacement replays');
    is($c5->{json}{key}, $c4->{json}{key}, '--replaces KEY again: no third key');
    is($t->effects(key => $c4->{json}{key}), 1, '--replaces: one effect');
    my $c6 = call('basic', extra => ['--replaces', 'NOT-A-KEY']);
    is($c6->{rc}, 64, '--replaces with a malformed key: usage error, exit 64') or diag(show($c6));
    like($c6->{err}, qr/--replaces wants a key/, '... naming the option');
}

# ---- a proxy that cuts the first connection once nginx starts answering:
#      the upstream completed, the answer never reaches the tool
sub relay {
    my ($c, $port, $cut) = @_;
    my $u = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port") or return;
    my $sel = IO::Select->new($c, $u);
    while (my @r = $sel->can_read(30)) {
        for my $fh (@r) {
            my $n = sysread($fh, my $buf, 65536);
            return unless $n;
            if ($fh == $c) { syswrite($u, $buf); next }
            if ($cut) {
                open my $f, '>>', "$P/cuts"; print $f "cut\n"; close $f;
                return;
            }
            syswrite($c, $buf);
        }
    }
}

sub start_cutter {
    my $l = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0,
        Listen => 16, ReuseAddr => 1) or die "cutter: $!";
    my $pid = fork;
    die "fork: $!" unless defined $pid;
    if ($pid == 0) {
        POSIX::setpgid(0, 0);
        $SIG{CHLD} = 'IGNORE';
        my $n = 0;
        while (1) {
            my $c = $l->accept or next;
            my $cut = ++$n == 1;
            if (fork == 0) { relay($c, $t->nginx_port, $cut); POSIX::_exit(0) }
            close $c;
        }
    }
    my $port = $l->sockport;
    close $l;
    return ($port, $pid);
}

{
    my ($port, $pid) = start_cutter();
    my $c = call('cut', url => "http://127.0.0.1:$port/tickets");
    kill 'KILL', -$pid;
    waitpid($pid, 0);
    my $j = $c->{json} // {};
    is(Idem::Test::_slurp("$P/cuts"), "cut\n", 'the proxy cut one answer');
    like($j->{outcome} // '', qr/^(created|replayed)$/, 'cut answer: the call still ends well')
        or diag(show($c));
    is($j->{status}, 201, 'with the upstream\'s status');
    is($j->{attempts}, 2, 'after a second attempt with the same key');
    is($t->effects(key => $j->{key}), 1, 'cut answer: one effect');
}

# ---- the upstream is slower than --max-time: wait (in-progress), then replay
{
    my $c = call('slow', headers => ['X-Delay: 2.5'], max_time => 1);
    my $j = $c->{json} // {};
    is($j->{outcome}, 'replayed', 'slow upstream: replayed after the wait') or diag(show($c));
    is($c->{rc}, 10, 'exit 10');
    cmp_ok($j->{attempts} // 0, '>=', 2, 'more than one attempt');
    is($t->effects(key => $j->{key}), 1, 'slow upstream: one effect');
}

# ---- a changed body under the same --op
{
    my $c = call('change', data => '{"title":"a"}');
    is($c->{json}{outcome}, 'created', 'first body executed');
    my $key = $c->{json}{key};
    my $c2 = call('change', data => '{"title":"b"}');
    is($c2->{rc}, 30, 'changed body: exit 30') or diag(show($c2));
    is($c2->{json}{outcome}, 'conflict', 'changed body: conflict');
    is($c2->{json}{attempts}, 0, 'found in the state file: nothing sent');
    like($c2->{err}, qr/body differs .*--new/, 'stderr names the difference and --new');
    is($t->effects(key => $key), 1, 'changed body: one effect');

    # the module's own refusal: a state file whose key another request used
    my $k = substr(Digest::SHA::sha256_hex("foreign-$$-" . time), 0, 32);
    my $r = $t->http(POST => '/tickets', key => $k, json => { title => 'x' },
        headers => [ Authorization => $AUTH ]);
    is($r->{status}, 201, 'another client used key K');
    my $body = '{"title":"y"}';
    Idem::Test::_spew("$SD/foreign.json", JSON::PP->new->encode({ v => 1, op => 'foreign',
        key => $k, method => 'POST', url => "$BASE/tickets",
        body_sha256 => Digest::SHA::sha256_hex($body) }));
    my $c3 = call('foreign', data => $body);
    is($c3->{rc}, 30, 'server-side mismatch: exit 30') or diag(show($c3));
    is($c3->{json}{outcome}, 'conflict', 'conflict');
    is($c3->{json}{problem}, 'fingerprint-mismatch', 'from the module\'s fingerprint-mismatch');
    is($c3->{json}{status}, 409, 'status 409');
    is($c3->{json}{attempts}, 1, 'not retried');
    is($t->effects(key => $k), 1, 'K: one effect');
}

# ---- unknown: the upstream drops the connection after acting
{
    my $c = call('unk', headers => ['X-Drop: 1']);
    my $j = $c->{json} // {};
    is($c->{rc}, 31, 'unknown: exit 31') or diag(show($c));
    is($j->{outcome}, 'unknown', 'outcome unknown (from the status endpoint)');
    is($j->{attempts}, 1, 'stopped: no resend');
    is($t->effects(key => $j->{key}), 1, 'unknown: one effect');

    my $c2 = call('unk2', headers => ['X-Drop: 1'], no_status => 1);
    is($c2->{json}{outcome}, 'unknown', 'without --status-url: unknown too') or diag(show($c2));
    is($c2->{json}{problem}, 'outcome-unknown', 'from the module\'s outcome-unknown');
    is($c2->{json}{attempts}, 2, 'after one resend with the same key');
    is($t->effects(key => $c2->{json}{key}), 1, 'one effect');
    my $c3 = call('unk2', headers => ['X-Drop: 1'], no_status => 1);
    is($c3->{json}{outcome}, 'unknown', 'a rerun stops again');
    is($t->effects(key => $c2->{json}{key}), 1, 'still one effect');
}

# ---- a business failure is final: never retried
{
    my $c = call('biz', headers => ['X-Status: 422']);
    is($c->{rc}, 40, 'upstream 422: exit 40') or diag(show($c));
    is($c->{json}{outcome}, 'failed', 'failed');
    is($c->{json}{status}, 422, 'status 422');
    is($c->{json}{attempts}, 1, 'one attempt');
    is($t->effects(key => $c->{json}{key}), 1, 'one effect');
}

# ---- kill -9 of the tool: before sending, during the request, after the
#      answer; each rerun uses the persisted key and the effect stays 1
{
    my $c = spawn_call([ args('k-before') ], IDEMPOTENCY_CALL_TEST_PAUSE => 'before_send');
    ok($t->wait_for(sub { stopped($c->{pid}) }, 5), 'before_send: paused');
    my $key = (state_of('k-before') // {})->{key};
    like($key // '', qr/^[0-9a-f]{32}$/, 'the key is on disk before anything is sent');
    is($t->effects(key => $key), 0, 'nothing sent yet');
    kill 'KILL', $c->{pid};
    finish($c);
    is($c->{sig}, 9, 'killed');
    my $r = call('k-before');
    is($r->{json}{key}, $key, 'rerun: the same key');
    is($r->{json}{outcome}, 'created', 'rerun: executes (it never ran)') or diag(show($r));
    is($t->effects(key => $key), 1, 'before_send: one effect');
}
{
    my $c = spawn_call([ args('k-during', headers => ['X-Delay: 2']) ]);
    my $key;
    ok($t->wait_for(sub { $key = (state_of('k-during') // {})->{key};
                          $key && $t->effects(key => $key) == 1 }, 5),
        'during: the upstream is executing');
    kill 'KILL', $c->{pid};
    finish($c);
    is($c->{sig}, 9, 'killed mid-request');
    my $r = call('k-during', headers => ['X-Delay: 2']);
    is($r->{json}{key}, $key, 'rerun: the same key');
    is($r->{json}{outcome}, 'replayed', 'rerun: waits, then the replay') or diag(show($r));
    is($t->effects(key => $key), 1, 'during: one effect');
}
{
    my $c = spawn_call([ args('k-after') ], IDEMPOTENCY_CALL_TEST_PAUSE => 'after_answer');
    ok($t->wait_for(sub { stopped($c->{pid}) }, 10), 'after_answer: paused');
    my $key = (state_of('k-after') // {})->{key};
    is($t->effects(key => $key), 1, 'the answer came');
    kill 'KILL', $c->{pid};
    finish($c);
    is($c->{stdout}, '', 'killed before printing');
    my $r = call('k-after');
    is($r->{json}{key}, $key, 'rerun: the same key');
    is($r->{json}{outcome}, 'replayed', 'rerun: the replay') or diag(show($r));
    is($t->effects(key => $key), 1, 'after_answer: one effect');
}

# ---- concurrent runs of one --op share one key and one effect
{
    my $before = $t->effects;
    my @c = map { spawn_call([ args('conc', headers => ['X-Delay: 1']) ]) } 1 .. 4;
    finish($_) for @c;
    my %keys = map { (($_->{json} // {})->{key} // 'none') => 1 } @c;
    is(scalar(keys %keys), 1, 'four concurrent runs: one key') or diag(join "\n", map { show($_) } @c);
    my @out = sort map { ($_->{json} // {})->{outcome} // 'none' } @c;
    is("@out", 'created replayed replayed replayed', 'one created, three replayed');
    is($t->effects - $before, 1, 'concurrent: one effect');
}

# ---- bad input: a clear error, a documented exit code, nothing sent
{
    my $before = $t->effects;
    Idem::Test::_spew("$P/plainfile", "x");
    my $c = call('bad1', state_dir => "$P/plainfile");
    is($c->{rc}, 73, 'state dir is a file: exit 73');
    like($c->{err}, qr/state dir .*plainfile.*not a directory/i, 'stderr says so');
    $c = call('bad2', state_dir => "$P/plainfile/sub");
    is($c->{rc}, 73, 'state dir under a file: exit 73');
    like($c->{err}, qr/cannot create .*Not a directory/, 'stderr says so');
    if ($> != 0) {
        mkdir "$P/ro", 0500;
        $c = call('bad3', state_dir => "$P/ro");
        is($c->{rc}, 73, 'read-only state dir: exit 73');
    }

    Idem::Test::_spew("$SD/corrupt.json", '{"key": "abc"');
    $c = call('corrupt');
    is($c->{rc}, 73, 'corrupt state file: exit 73');
    like($c->{err}, qr/corrupt\.json is corrupt.*nothing was sent/, 'stderr says so');
    is(Idem::Test::_slurp("$SD/corrupt.json"), '{"key": "abc"', 'and leaves the file alone');

    $c = call('noscheme', url => '127.0.0.1:' . $t->nginx_port . '/tickets');
    is($c->{rc}, 64, 'URL without scheme: exit 64');
    like($c->{err}, qr/no http:\/\/ or https:\/\/ scheme/, 'stderr says so');
    ok(!-e "$SD/noscheme.json", 'no state file created');

    $c = call('nofile', data => "\@$P/does-not-exist.json");
    is($c->{rc}, 64, 'missing body file: exit 64');
    like($c->{err}, qr/does-not-exist\.json: No such file/, 'stderr names the file');
    ok(!-e "$SD/nofile.json", 'no state file created');

    $c = call('../evil');
    is($c->{rc}, 64, 'an --op with a slash: exit 64');

    # a token given to -H without its name: refused, and never echoed
    $c = call('badheader', headers => ["Bearer tok-$$-secret"]);
    is($c->{rc}, 64, 'a -H without a colon: exit 64');
    like($c->{err}, qr/-H wants 'Name: value'/, 'stderr says what -H wants');
    unlike($c->{err}, qr/tok-$$-secret/, '... and does not show the argument');
    ok(!-e "$SD/badheader.json", 'no state file created');
    is($t->effects, $before, 'bad input: nothing reached the upstream');
}

$t->check_logs;
done_testing;
