#!/usr/bin/perl
# The lease of a claim: renewed while its request is alive (a request longer
# than the lease stays in progress), lapsing when the owning worker dies
# (kill -9): retries are told in-progress while the lease runs, then
# outcome-unknown, and never execute a second time. An operator can then
# resolve the record.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $t = Idem::Test->new;
$t->start_stack(<<'EOF', workers => 1);
server {
    listen 127.0.0.1:%%PORT%%;
    location / {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_lease 2s;
        proxy_ignore_client_abort on;
        proxy_read_timeout 30s;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /status {
        idempotency_redis %%REDIS%%;
        idempotency_status;
    }
    location = /admin {
        idempotency_redis %%REDIS%%;
        idempotency_admin on;
    }
}
EOF

sub json_of { my $r = shift; my $j = eval { JSON::PP->new->decode($r->{content}) }; ref $j eq 'HASH' ? $j : {} }

# ---- kill -9 of the worker that holds the claim, mid-request
{
    my $k = $t->key('kill');
    my @req = (key => $k, json => { transfer => 'kill-9' });
    my $bg = $t->http_bg(POST => '/transfers', @req, headers => [ 'X-Delay' => 3 ], timeout => 15);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'the request reached the upstream');
    my $rec = $t->record($k);
    is($rec && $rec->{state}, 'in_progress', 'record in_progress while the upstream works');

    my ($victim) = $t->worker_pids;
    my $killed = $t->kill_worker($victim);
    ok($killed, "worker $victim killed with SIGKILL and replaced");
    my $r1 = $bg->result(15);
    is($r1 && $r1->{status}, 599, 'the first client lost its connection (no answer)')
        or diag($t->show($r1 // {}));

    # Retries while the dead owner's lease still runs: in-progress; once it
    # has lapsed: outcome-unknown. Never an execution.
    my (@answers, $last);
    my $end = time + 15;
    while (time < $end) {
        $last = $t->http(POST => '/transfers', @req);
        push @answers, $last->{status} . ' ' . $t->ptype($last);
        last unless $last->{status} == 409 && $t->ptype($last) eq 'in-progress';
        sleep 0.25;
    }
    note('answers after the kill: ' . join(', ', @answers));
    is($answers[0], '409 in-progress', 'right after the kill: 409 in-progress (the lease still runs)');
    ok(!grep({ $_ ne '409 in-progress' } @answers[0 .. $#answers - 1]),
        'every answer before the lease lapsed was 409 in-progress') or diag(explain \@answers);
    $t->is_problem($last, 409, 'outcome-unknown', key => $k, state => 'unknown', operation_id => 1,
        retry_after => 0, name => 'after the lease: 409 outcome-unknown');
    is($t->effects(key => $k), 1, 'kill -9: the retries never executed (1 effect)');

    my $s = $t->http(GET => '/status', key => $k);
    is(json_of($s)->{state}, 'unknown', 'status endpoint: unknown');
    $rec = $t->record($k);
    is($rec && $rec->{state}, 'unknown', 'record unknown in Redis');

    # the upstream finishes its (orphaned) work; nothing changes
    sleep 0.5 while time < ($bg->{t_start} + 3.3);
    my $r = $t->http(POST => '/transfers', @req);
    $t->is_problem($r, 409, 'outcome-unknown', key => $k,
        name => 'after the orphaned upstream answer: still outcome-unknown');
    is($t->effects(key => $k), 1, 'still 1 effect');

    # an operator confirms the upstream did act
    my $a = $t->http(POST => '/admin?action=complete&status=201', key => $k);
    is($a->{status}, 200, 'admin complete: 200') or diag($t->show($a));
    is(json_of($a)->{result}, 'completed', 'admin complete: result completed');
    my $rr = $t->http(POST => '/transfers', @req);
    is($rr->{status}, 201, 'after admin complete: the retry gets 201');
    is($rr->{headers}{'idempotent-replayed'}, 'true', 'after admin complete: replayed');
    is($rr->{content}, '', 'after admin complete: empty body');
    is($t->effects(key => $k), 1, 'after admin complete: still 1 effect');
}

# ---- a lapsed lease (dead owner) is resolvable by the admin before any
#      retry converted it; a live claim is not
{
    my $k = $t->key('kill2');
    my @req = (key => $k, json => { transfer => 'kill-9 again' });
    my $bg = $t->http_bg(POST => '/transfers', @req, headers => [ 'X-Delay' => 2 ], timeout => 15);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'second request reached the upstream');
    my $live = $t->http(POST => '/admin?action=release', key => $k);
    $t->is_problem($live, 409, 'not-resolvable', state => 'in_progress',
        name => 'admin on a live claim -> 409 not-resolvable');
    ok($t->kill_worker, 'worker killed');
    $bg->result(15);
    my $s;
    $t->wait_for(sub { $s = json_of($t->http(GET => '/status', key => $k)); ($s->{state} // '') eq 'unknown' }, 10);
    is($s->{state}, 'unknown', 'status endpoint reports the lapsed lease as unknown');
    my $a = $t->http(POST => '/admin?action=release', key => $k);
    is($a->{status}, 200, 'admin release of a lapsed claim: 200') or diag($t->show($a));
    is(json_of($a)->{result}, 'released', 'released');
    my $r = $t->http(POST => '/transfers', @req);
    is($r->{status}, 201, 'after release: the retry executes');
    ok(!exists $r->{headers}{'idempotent-replayed'}, 'after release: not a replay');
    is($t->effects(key => $k), 2, 'after the operator release: 2 effects (the second by the retry)');
}

# ---- the lease is renewed while the request is alive: a 4 s request with a
#      2 s lease stays in progress and completes normally
{
    my $k = $t->key('renew');
    my @req = (key => $k, json => { transfer => 'long' });
    my $bg = $t->http_bg(POST => '/transfers', @req, headers => [ 'X-Delay' => 4 ], timeout => 15);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'long request reached the upstream');
    my @seen;
    while (1) {
        my $r = $t->http(POST => '/transfers', @req);
        push @seen, $r->{status} . ' ' . $t->ptype($r);
        last if time > $bg->{t_start} + 3 || $r->{status} != 409;
        sleep 0.4;
    }
    note('answers while the long request runs: ' . join(', ', @seen));
    ok(!grep({ $_ ne '409 in-progress' } @seen),
        'a duplicate is told in-progress during the whole request, past the initial lease')
        or diag(explain \@seen);
    my $s = $t->http(GET => '/status', key => $k);
    is(json_of($s)->{state}, 'in_progress', 'status endpoint: still in_progress after 3 s (renewed)');
    my $r1 = $bg->result(15);
    is($r1 && $r1->{status}, 201, 'the long request completes with the upstream answer');
    my $r2 = $t->http(POST => '/transfers', @req);
    is($r2->{status}, 201, 'retry after completion: 201');
    is($r2->{headers}{'idempotent-replayed'}, 'true', 'retry after completion: replayed');
    is($r2->{content}, $r1 && $r1->{content}, 'replay = the original body');
    is($t->effects(key => $k), 1, 'long request: 1 effect');
}

$t->check_logs(ignore => qr/worker process \d+ exited on signal 9/);
done_testing;
