#!/usr/bin/perl
# build/idempotency-call and the module's "not yet" answers: 409 lock-held
# (another operation holds the idempotency_lock value), 503
# store-not-replicated (the replica is frozen) and retry-later (a waiter
# on an attempt the upstream answered 503) are each waited out with the
# same key and executed once; an answer marked Idempotent-Reused is the
# outcome reused (exit 11); a state dir writable by group or others is
# refused before anything is sent. The upstream's effects are counted.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Digest::SHA ();
use JSON::PP;
use POSIX ();
use Idem::Test;

my $TOOL = "$FindBin::Bin/../build/idempotency-call";
unless (-x $TOOL) {
    print "1..1\nnot ok 1 - build/idempotency-call missing: run make tools\n";
    exit 1;
}

my $t = Idem::Test->new;
$t->start_stack(<<'EOF');
idempotency_json_var $environment /environment;
idempotency_json_var $source_event_id /source_event_id;
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%% timeout=3s;
    idempotency_scope $http_authorization;
    proxy_ignore_client_abort on;
    location /deployments {
        idempotency on;
        idempotency_lock deploy:$environment;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /rep/ {
        idempotency on;
        idempotency_redis_wait 1 300ms;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /wait/ {
        idempotency on;
        idempotency_wait 10s;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /tickets {
        idempotency on;
        idempotency_unique tickets:$source_event_id;
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

sub args {
    my ($op, %o) = @_;
    return ('--op', $op, '--state-dir', $o{state_dir} // $SD, '--status-url', $STATUS,
        '--max-time', 5, '--deadline', $o{deadline} // 20,
        '-H', "Authorization: $AUTH", '-H', 'Content-Type: application/json',
        '-X', 'POST', "$BASE$o{path}", '-d', $o{data});
}

sub call {
    my @a = args(@_);
    my $n = ++$RUNS;
    my $c = { out => "$P/call-$n.out", err => "$P/call-$n.err" };
    my $pid = fork;
    die "fork: $!" unless defined $pid;
    if ($pid == 0) {
        open STDIN, '<', '/dev/null';
        open STDOUT, '>', $c->{out};
        open STDERR, '>', $c->{err};
        { no warnings 'exec'; exec { $TOOL } $TOOL, @a; }
        POSIX::_exit(127);
    }
    waitpid($pid, 0);
    $c->{rc} = $? >> 8;
    $c->{stdout} = Idem::Test::_slurp($c->{out});
    $c->{json} = eval { JSON::PP->new->decode($c->{stdout}) } // {};
    $c->{err} = Idem::Test::_slurp($c->{err});
    return $c;
}

sub show { my $c = shift; "rc=$c->{rc}\nstdout: $c->{stdout}\nstderr: $c->{err}" }

# ---- lock-held: another operation holds deploy:production; the call waits
#      (Retry-After) and executes once the holder completes
{
    my $hk = $t->key('holder');
    my $bg = $t->http_bg(POST => '/deployments', key => $hk, timeout => 20,
        json => '{"environment":"production","id":"dep-1"}',
        headers => [ Authorization => $AUTH, 'X-Delay' => 2.5 ]);
    ok($t->wait_for(sub { $t->effects(key => $hk) == 1 }, 5), 'the holder is executing');
    my $probe = $t->http(POST => '/deployments', key => $t->key('probe'),
        json => '{"environment":"production","id":"probe"}', headers => [ Authorization => $AUTH ]);
    is($t->ptype($probe), 'lock-held', 'meanwhile another key gets lock-held');
    my $c = call('dep-2', path => '/deployments', data => '{"environment":"production","id":"dep-2"}');
    my $j = $c->{json};
    is($c->{rc}, 0, 'lock-held: the call ends with exit 0') or diag(show($c));
    is($j->{outcome}, 'created', 'lock-held waited out: created');
    cmp_ok($j->{attempts} // 0, '>=', 2, 'after more than one attempt with the same key');
    is($t->effects(key => $j->{key}), 1, 'lock-held: the call executed once');
    is($t->effects(key => $hk), 1, 'the holder once');
    my $h = $bg->result(20);
    is($h && $h->{status}, 201, 'the holder completed');
}

# ---- store-not-replicated: the replica is frozen, the claim is released
#      and answered 503; the call waits and executes once it is back
{
    my $rep = Idem::Test->new;
    $rep->start_redis(args => [ '--replicaof', '127.0.0.1', $t->redis_port ]);
    ok($t->wait_for(sub {
        ($rep->redis('INFO', 'replication') // '') =~ /master_link_status:up/
            && ($t->redis('INFO', 'replication') // '') =~ /connected_slaves:1/ }, 20),
        'the replica is in sync');
    kill 'STOP', $rep->{redis_pid};
    my $probe = $t->http(POST => '/rep/x', key => $t->key('rprobe'), json => '{"p":1}',
        headers => [ Authorization => $AUTH ]);
    is($t->ptype($probe), 'store-not-replicated', 'replica frozen: store-not-replicated');
    my $thaw = $t->later(2, sub { kill 'CONT', $rep->{redis_pid} });
    my $c = call('rep-1', path => '/rep/x', data => '{"n":1}');
    waitpid($thaw, 0);
    my $j = $c->{json};
    is($c->{rc}, 0, 'store-not-replicated: exit 0') or diag(show($c));
    is($j->{outcome}, 'created', 'waited out: created');
    cmp_ok($j->{attempts} // 0, '>=', 2, 'after more than one attempt with the same key');
    is($t->effects(key => $j->{key}), 1, 'store-not-replicated: one effect');
    $rep->stop_redis;
}

# ---- retry-later: the call waits on an attempt of the same key that the
#      upstream answers 503 (released); it retries after Retry-After and
#      that retry executes
{
    my $k = substr(Digest::SHA::sha256_hex("rl-$$-" . time), 0, 32);
    my $body = '{"n":2}';
    mkdir $SD, 0700;
    Idem::Test::_spew("$SD/rl.json", JSON::PP->new->encode({ v => 1, op => 'rl', key => $k,
        method => 'POST', url => "$BASE/wait/x", body_sha256 => Digest::SHA::sha256_hex($body) }));
    my $bg = $t->http_bg(POST => '/wait/x', key => $k, json => $body, timeout => 20,
        headers => [ Authorization => $AUTH, 'X-Delay' => 3, 'X-Status' => 503 ]);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'an attempt of key K is executing');
    my $c = call('rl', path => '/wait/x', data => $body);
    my $j = $c->{json};
    is($c->{rc}, 0, 'retry-later: exit 0') or diag(show($c));
    is($j->{outcome}, 'created', 'retried after retry-later: created');
    is($j->{key}, $k, 'with key K');
    cmp_ok($j->{attempts} // 0, '>=', 2, 'after more than one attempt');
    is($t->effects(key => $k), 2, 'K: the released 503 attempt and one execution');
    my $h = $bg->result(20);
    is($h && $h->{status}, 503, 'the first attempt got the upstream\'s 503');
    my $c2 = call('rl', path => '/wait/x', data => $body);
    is($c2->{json}{outcome}, 'replayed', 'a rerun replays');
    is($t->effects(key => $k), 2, 'no further effect');
}

# ---- reused: another key's operation holds the business identity
{
    my $body = '{"source_event_id":"evt-77","title":"disk full"}';
    my $first = $t->http(POST => '/tickets', key => $t->key('evt-first'), json => $body,
        headers => [ Authorization => $AUTH ]);
    is($first->{status}, 201, 'the first delivery executes');
    my $c = call('ticket-evt-77', path => '/tickets', data => $body);
    my $j = $c->{json};
    is($c->{rc}, 11, 'reused: exit 11') or diag(show($c));
    is($j->{outcome}, 'reused', 'Idempotent-Reused: outcome reused');
    is($j->{status}, 201, 'with the first operation\'s status');
    is($t->effects(key => $j->{key}), 0, 'its own key never ran');
    is(scalar($t->effect_list(uri => '/tickets')), 1, 'one effect for the event');
    like($j->{operation_id} // '', qr/^[0-9a-f]{32}$/, 'the operation id of the first');
}

# ---- a state dir others may write is refused, nothing sent
{
    my $before = $t->effects;
    for my $mode (0777, 0770, 0702) {
        my $d = sprintf "$P/open-%o", $mode;
        mkdir $d;
        chmod $mode, $d;
        my $c = call('perm', state_dir => $d, path => '/tickets/p', data => '{"a":1}');
        is($c->{rc}, 73, sprintf('state dir mode %o: exit 73', $mode)) or diag(show($c));
        like($c->{err}, qr/writable by group or others/, 'stderr says why');
        ok(!-e "$d/perm.json", 'no state file written');
    }
    is($t->effects, $before, 'nothing reached the upstream');
}

$t->check_logs;
done_testing;
