#!/usr/bin/perl
# idempotency_redis_wait: a claim reaches the upstream only once the
# replicas have it, and the response ends only once they have its record.
# A claim the replicas did not get in time is released and answered 503
# (nothing executed); a completion they did not get in time is kept,
# logged, and the response still goes out.
#
# A real replica (redis-server --replicaof) of the harness's Redis; it is
# made slow with SIGSTOP/SIGCONT and stopped for real.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(time sleep);
use POSIX ();
use Idem::Test;

my $t = Idem::Test->new;
my $P = $t->prefix;
$t->start_stack(<<"EOF", workers => 2);
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency on;
    idempotency_redis %%REDIS%% timeout=3s;
    proxy_ignore_client_abort on;
    location / {
        idempotency_redis_wait 1 500ms;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /two/ {
        idempotency_redis_wait 2 300ms;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /plain/ {
        proxy_pass http://%%UPSTREAM%%;
    }
    location /file/ {
        idempotency_redis_wait 1 500ms;
        idempotency_audit file=$P/wait.log;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

# the replica: a second harness instance with a Redis of its own
my $rep = Idem::Test->new;
sub start_replica {
    $rep->start_redis(args => [ '--replicaof', '127.0.0.1', $t->redis_port ]);
    # connected_slaves counts a replica still syncing, and the replica says
    # "link up" before the master has its first ACK and puts it online; WAIT
    # counts only online replicas, so the first write could wait in vain on
    # a loaded machine. WAIT on a fresh connection (nothing written) answers
    # how many replicas are online.
    my $up = $t->wait_for(sub {
        ($rep->redis('INFO', 'replication') // '') =~ /master_link_status:up/
            && ($t->redis('INFO', 'replication') // '') =~ /connected_slaves:1/
            && ($t->redis('WAIT', 1, 100) // '') eq '1';
    }, 20);
    die 'the replica did not sync' unless $up;
}
start_replica();

sub rep_state {
    my $rec = $rep->record($_[0]);
    return $rec ? $rec->{state} : 'none';
}

# SIGSTOP the replica from $after to $after + $for seconds, from a child
sub freeze_replica {
    my ($after, $for) = @_;
    return $t->later($after, sub {
        kill 'STOP', $rep->{redis_pid};
        sleep $for;
        kill 'CONT', $rep->{redis_pid};
    });
}

# ---- writes flow through WAIT (that they wait is shown below, with a slow replica)
{
    my $k = $t->key('w');
    my @req = (key => $k, json => { a => 1 });
    my $r = $t->http(POST => '/x', @req);
    is($r->{status}, 201, 'with a replica: the first write executes') or diag($t->show($r));
    my $again = $t->http(POST => '/x', @req);
    is($again->{headers}{'idempotent-replayed'}, 'true', 'with a replica: the retry replays');
    is($t->effects(key => $k), 1, 'with a replica: one effect');
}

# ---- the audit file alone: the claim waits for its lines (written at the
# end of the event loop's turn), then for the replica, on the connection
# that carried it
{
    my $k = $t->key('filewait');
    my @req = (key => $k, json => { a => 1 });
    my $r = $t->http(POST => '/file/x', @req);
    is($r->{status}, 201, 'audit file, with a replica: the first write executes') or diag($t->show($r));
    my $again = $t->http(POST => '/file/x', @req);
    is($again->{headers}{'idempotent-replayed'}, 'true', 'audit file, with a replica: the retry replays');
    is($t->effects(key => $k), 1, 'audit file, with a replica: one effect');
}

# ---- a claim waits for the replica: the upstream sees nothing before
{
    my $k = $t->key('claimwait');
    my $t0 = time;
    my $child = freeze_replica(0, 0.3);
    sleep 0.05;
    my $r = $t->http(POST => '/x', key => $k, json => { a => 2 });
    waitpid($child, 0);
    is($r->{status}, 201, 'a slow replica: the write executes once it has the claim') or diag($t->show($r));
    my ($e) = $t->effect_list(key => $k);
    cmp_ok($e ? $e->{t} - $t0 : 0, '>=', 0.28,
           sprintf('a slow replica: the upstream got the request after the replica had the claim (%.2f s)', $e ? $e->{t} - $t0 : -1));
    is($t->effects(key => $k), 1, 'a slow replica: one effect');

    # the same without idempotency_redis_wait: the replica stays stopped throughout,
    # and the write completes all the same
    my $k2 = $t->key('nowait');
    kill 'STOP', $rep->{redis_pid};
    my $p = $t->http(POST => '/plain/x', key => $k2, json => { a => 2 });
    my $n = $t->effects(key => $k2);
    kill 'CONT', $rep->{redis_pid};
    is($p->{status}, 201, 'without idempotency_redis_wait: executed while the replica is stopped') or diag($t->show($p));
    is($n, 1, 'without idempotency_redis_wait: the upstream had it before the replica woke');
}

# ---- a completion waits for the replica before the response ends
{
    my $k = $t->key('completewait');
    my $t0 = time;
    my $child = freeze_replica(0.2, 0.45);     # stopped from 0.2 to 0.65 s
    my $r = $t->http(POST => '/x', key => $k, json => { a => 3 }, headers => [ 'X-Delay' => 0.4 ]);
    my $took = time - $t0;
    my $state = rep_state($k);
    waitpid($child, 0);
    is($r->{status}, 201, 'completion: the write executes') or diag($t->show($r));
    is($state, 'completed', 'completion: when the client has the response, the replica has the completed record');
    cmp_ok($took, '>=', 0.6, sprintf('completion: the response ended after the replica woke (%.2f s)', $took));
    is($t->effects(key => $k), 1, 'completion: one effect');
}

# ---- the replica cannot have the claim in time: released, 503, nothing executed
{
    my $k = $t->key('noreplica');
    my @req = (key => $k, json => { a => 4 });
    kill 'STOP', $rep->{redis_pid};
    # the replica stays stopped until the answer is in: an answer at all shows the
    # WAIT timeout bounded the claim (the client's own timeout is far longer)
    my $r = $t->http(POST => '/x', @req);
    my $p = $t->problem($r);
    is($r->{status}, 503, 'replica frozen: the claim is answered 503') or diag($t->show($r));
    is($t->ptype($r), 'store-not-replicated', 'replica frozen: type store-not-replicated');
    ok(defined $r->{headers}{'retry-after'}, 'replica frozen: with Retry-After');
    ok(!defined $p->{operation_id}, 'replica frozen: no operation id (no record was kept)');
    is($t->effects(key => $k), 0, 'replica frozen: nothing executed');
    ok($t->wait_for(sub { !defined $t->record($k) }, 5), 'replica frozen: the claim was released');
    ok($t->wait_for(sub { $t->error_log =~ /the claim of key "\Q$k\E" reached 0 of 1 replicas within 500ms; it is released and answered 503/ }, 5),
       'replica frozen: error.log names the key');

    # many at once: one WAIT in flight per connection serves them all
    my $N = 16;
    my $tag = "frozen-$$";      # $$ in a parallel client is the client's pid
    my $waits = $t->command_calls('wait');
    my $res = $t->parallel($N, sub {
        my $i = shift;
        my $x = $t->http(POST => '/x', key => "$tag-$i", json => { i => $i });
        return { status => $x->{status}, type => $t->ptype($x) // '' };
    });
    $waits = $t->command_calls('wait') - $waits;
    kill 'CONT', $rep->{redis_pid};
    my @bad = grep { !$_ || $_->{status} != 503 || $_->{type} ne 'store-not-replicated' } @$res;
    is(scalar @bad, 0, "replica frozen: $N claims at once, all 503 store-not-replicated") or diag(explain $res);
    cmp_ok($waits, '<', $N / 2, "replica frozen: $N claims answered by $waits WAITs, not one WAIT each");
    is(scalar(grep { ($_->{key} // '') =~ /^\Q$tag\E-/ } $t->effect_list), 0, "replica frozen: $N claims, nothing executed");

    ok($t->wait_for(sub { ($t->redis('INFO', 'replication') // '') =~ /slave0:.*state=online/ }, 10), 'the replica is back');
    my $again = $t->http(POST => '/x', @req);
    is($again->{status}, 201, 'replica back: the retry with the same key executes');
    is($again->{headers}{'idempotent-replayed'}, undef, 'replica back: not a replay');
    is($t->effects(key => $k), 1, 'replica back: one effect');
}

# ---- the replica stopped for real; and more replicas asked for than exist
{
    $rep->stop_redis;
    $t->wait_for(sub { ($t->redis('INFO', 'replication') // '') =~ /connected_slaves:0/ }, 10);
    my $k = $t->key('stopped');
    my $r = $t->http(POST => '/x', key => $k, json => { a => 5 });
    is($r->{status}, 503, 'replica stopped: 503') or diag($t->show($r));
    is($t->ptype($r), 'store-not-replicated', 'replica stopped: store-not-replicated');
    is($t->effects(key => $k), 0, 'replica stopped: nothing executed');
    start_replica();

    my $k2 = $t->key('two');
    my $r2 = $t->http(POST => '/two/x', key => $k2, json => { a => 6 });
    is($r2->{status}, 503, 'WAIT 2 with one replica: 503') or diag($t->show($r2));
    is($t->effects(key => $k2), 0, 'WAIT 2 with one replica: nothing executed');
    like($t->error_log, qr/the claim of key "\Q$k2\E" reached 1 of 2 replicas within 300ms/, 'WAIT 2 with one replica: logged with the count');
}

# ---- the completion cannot reach the replica in time: kept, logged, answered
{
    my $k = $t->key('lostack');
    my @req = (key => $k, json => { a => 7 });
    # stopped from 0.2 s (the claim has replicated) until the answer is in: an
    # answer at all shows the response was not held for the replica
    my $child = $t->later(0.2, sub { kill 'STOP', $rep->{redis_pid} });
    my $r = $t->http(POST => '/x', @req, headers => [ 'X-Delay' => 0.4 ]);
    waitpid($child, 0);
    kill 'CONT', $rep->{redis_pid};
    is($r->{status}, 201, 'completion unacknowledged: the client gets the upstream\'s answer') or diag($t->show($r));
    like($r->{content}, qr/^\{"id":\d+/, 'completion unacknowledged: with its body');
    is(($t->record($k) // {})->{state}, 'completed', 'completion unacknowledged: the record is kept on the master');
    ok($t->wait_for(sub { $t->error_log =~ /the record of key "\Q$k\E" reached 0 of 1 replicas within 500ms; it is kept/ }, 5),
       'completion unacknowledged: error.log says so');
    my $again = $t->http(POST => '/x', @req);
    is($again->{headers}{'idempotent-replayed'}, 'true', 'completion unacknowledged: the retry replays');
    is($t->effects(key => $k), 1, 'completion unacknowledged: one effect');
}

# ---- healthy replica, many first writes and their retries at once
{
    my $N = 30;
    my $tag = "many-$$";
    my $res = $t->parallel($N, sub {
        my $i = shift;
        my $k = "$tag-$i";
        my $a = $t->http(POST => '/x', key => $k, json => { i => $i });
        my $b = $t->http(POST => '/x', key => $k, json => { i => $i });
        return { a => $a->{status}, b => $b->{status}, replayed => $b->{headers}{'idempotent-replayed'} // '' };
    });
    my @bad = grep { !$_ || $_->{a} != 201 || $_->{replayed} ne 'true' } @$res;
    is(scalar @bad, 0, "$N first writes with WAIT 1, each retried: every retry replays") or diag(explain \@bad);
    my %per;
    $per{ $_->{key} }++ for grep { ($_->{key} // '') =~ /^\Q$tag\E-/ } $t->effect_list;
    is_deeply([ sort { $a <=> $b } values %per ], [ (1) x $N ], "$N first writes: one effect each");
}

$rep->stop_redis;
$t->check_logs;
done_testing;
