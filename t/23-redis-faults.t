#!/usr/bin/perl
# Redis stops answering (CLIENT PAUSE, DEBUG SLEEP) while a claim is on its
# way: the client gets 503 store-unavailable and nothing executes; a claim
# Redis still applies once it wakes up (DEBUG SLEEP: the queued command runs)
# is released by the worker (fenced by its owner token) after it reconnects,
# so the next retry executes exactly once. Redis pausing while a completion is
# on its way must never lead to a second execution.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use POSIX ();
use Time::HiRes qw(time sleep);
use Idem::Test;

my $t = Idem::Test->new;
# DEBUG SLEEP: Redis stops reading for a while but then runs what was queued
$t->start_stack(<<'EOF', workers => 2, redis => { args => [ '--enable-debug-command', 'yes' ] });
server {
    listen 127.0.0.1:%%PORT%%;
    location / {
        idempotency on;
        idempotency_redis %%REDIS%% timeout=300ms;
        idempotency_lease 2s;
        proxy_ignore_client_abort on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /long/ {
        idempotency on;
        idempotency_redis %%REDIS%% timeout=300ms;
        idempotency_lease 30s;
        proxy_ignore_client_abort on;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

sub produced { my @r = $t->upstream_responses(key => $_[0]); $r[-1] }
sub cmdstats {
    my $info = $t->redis('INFO', 'commandstats');
    my %c;
    $c{$1} = $2 while !ref($info) && $info =~ /^cmdstat_(\w+):calls=(\d+)/mg;
    return \%c;
}
sub sleep_until { my $d = $_[0] - time; sleep $d if $d > 0 }

# ---- Redis paused during a claim
{
    my $k = $t->key('pause');
    my @req = (key => $k, json => { pay => 'during pause' });
    my $t0 = time;
    is($t->redis_pause(2000), 'OK', 'CLIENT PAUSE 2000 ALL');
    my $r1 = $t->http(POST => '/pay', @req, timeout => 5);
    $t->is_problem($r1, 503, 'store-unavailable', key => $k, retry_after => 1,
        name => 'claim while Redis is paused -> 503 store-unavailable (Retry-After)');
    is($t->effects(key => $k), 0, 'paused: nothing executed');

    sleep_until($t0 + 2.2);    # the pause is over
    my ($r, @seen) = $t->retry_until_final('/pay', 10, @req);
    note('answers after the pause: ' . join(', ', @seen));
    is($r->{status}, 201, 'after the pause: the retry executes') or diag($t->show($r));
    ok(!exists $r->{headers}{'idempotent-replayed'}, 'after the pause: an execution, not a replay');
    ok(!grep({ /^409 (?!in-progress)/ || /^2\d\d/ } @seen[0 .. $#seen - 1]),
        'before that only 503 store-unavailable / 409 in-progress') or diag(explain \@seen);
    is($t->effects(key => $k), 1, 'after the pause: exactly one effect');
    my $again = $t->http(POST => '/pay', @req);
    is($again->{headers}{'idempotent-replayed'}, 'true', 'next retry replays');
    is($t->sha256($again->{content}), (produced($k) // {})->{sha}, 'replay = the upstream\'s body');
    is($t->effects(key => $k), 1, 'still one effect');
}

# ---- Redis asleep (DEBUG SLEEP) during a claim: the claim is applied after
#      the client was told 503; the worker releases it once it reconnects
{
    my $k = $t->key('sleep');
    my @req = (key => $k, json => { pay => 'during sleep' });
    my $before = cmdstats();
    my $pid = fork;
    die "fork: $!" unless defined $pid;
    if (!$pid) { $t->redis('DEBUG', 'SLEEP', '1.5'); POSIX::_exit(0) }
    sleep 0.2;
    my $r1 = $t->http(POST => '/pay', @req, timeout => 5);
    $t->is_problem($r1, 503, 'store-unavailable', key => $k, retry_after => 1,
        name => 'claim while Redis sleeps -> 503 store-unavailable');
    waitpid($pid, 0);
    is($t->effects(key => $k), 0, 'asleep: nothing executed');
    # The claim ran in Redis after the timeout; its owner gives it back,
    # leaving a tombstone of its token (a released marker with no status)
    # that no late copy of that claim may take.
    my $rec;
    ok($t->wait_for(sub { $rec = $t->record($k);
                          $rec && $rec->{state} eq 'released' && $rec->{status} eq ''
                          && $rec->{owner} }, 5),
        'the claim whose reply was lost is given back by its worker: a tombstone')
        or diag(explain $rec);
    my $after = cmdstats();
    note(sprintf('while asleep + after: %d SET and %d EVALSHA calls in Redis (the late claim and its give-back)',
        map { ($after->{$_} // 0) - ($before->{$_} // 0) } qw(set evalsha)));
    my ($r, @seen) = $t->retry_until_final('/pay', 10, @req);
    note('answers after the sleep: ' . join(', ', @seen));
    is($r->{status}, 201, 'after the sleep: the retry executes') or diag($t->show($r));
    ok(!exists $r->{headers}{'idempotent-replayed'}, 'after the sleep: an execution');
    is($t->effects(key => $k), 1, 'after the sleep: exactly one effect');
    my $again = $t->http(POST => '/pay', @req);
    is($again->{headers}{'idempotent-replayed'}, 'true', 'next retry replays');
    is($t->effects(key => $k), 1, 'still one effect');
}

# ---- several claims lost in the same pause, on both workers
{
    my @k = map { $t->key('pausemany') } 1 .. 6;
    my $t0 = time;
    is($t->redis_pause(1500), 'OK', 'CLIENT PAUSE 1500 ALL');
    my $res = $t->parallel(scalar @k, sub {
        my $i = shift;
        my $r = $t->http(POST => '/pay', key => $k[$i], json => { i => $i }, timeout => 5);
        return { status => $r->{status}, type => $t->ptype($r) };
    });
    is(scalar(grep { $_ && $_->{status} == 503 && $_->{type} eq 'store-unavailable' } @$res), scalar @k,
        'every claim during the pause -> 503') or diag(explain $res);
    sleep_until($t0 + 1.7);
    for my $i (0 .. $#k) {
        my ($r, @seen) = $t->retry_until_final('/pay', 10, key => $k[$i], json => { i => $i });
        is($r->{status}, 201, "key $i after the pause: executes") or diag(join ', ', @seen);
        ok(!exists $r->{headers}{'idempotent-replayed'}, "key $i: not a replay");
        is($t->effects(key => $k[$i]), 1, "key $i: one effect");
    }
}

# ---- a command queued during the pause and answered late must not confuse
#      the next request on the same connection
{
    my $t0 = time;
    is($t->redis_pause(1000), 'OK', 'CLIENT PAUSE 1000 ALL');
    my $kk = $t->key('late');
    my $r1 = $t->http(POST => '/pay', key => $kk, json => { n => 1 }, timeout => 5);
    is($r1->{status}, 503, 'paused: 503');
    sleep_until($t0 + 1.2);
    my @other = map { $t->key('after') } 1 .. 4;
    for my $i (0 .. $#other) {
        my ($r, @seen) = $t->retry_until_final('/pay', 10, key => $other[$i], json => { o => $i });
        is($r->{status}, 201, "fresh key $i after a late reply: executes") or diag(join ', ', @seen);
        is($t->effects(key => $other[$i]), 1, "fresh key $i: one effect");
        # The other worker's link may still be reconnecting (503) and the
        # completion is written after the response (409 in-progress): a
        # client following the retry rule gets the replay in the end.
        my ($b, @again) = $t->retry_until_final('/pay', 10, key => $other[$i], json => { o => $i });
        is($b->{headers}{'idempotent-replayed'}, 'true', "fresh key $i: replayed")
            or diag(join ', ', @again);
        note("fresh key $i, answers before the replay: @again[0 .. $#again - 1]") if @again > 1;
        is($t->sha256($b->{content}), (produced($other[$i]) // {})->{sha}, "fresh key $i: its own body");
        is($t->effects(key => $other[$i]), 1, "fresh key $i: still one effect after the retries");
    }
    my ($r, @seen) = $t->retry_until_final('/pay', 10, key => $kk, json => { n => 1 });
    is($r->{status}, 201, 'the paused key executes once') or diag(join ', ', @seen);
    is($t->effects(key => $kk), 1, 'paused key: one effect');
}

# ---- Redis paused while the completion is on its way: the outcome may be
#      replayed or end unknown, but the operation never executes twice
{
    my $k = $t->key('pausecomplete');
    my @req = (key => $k, json => { pay => 'completion during pause' });
    my $bg = $t->http_bg(POST => '/pay', @req, headers => [ 'X-Delay' => 0.6 ], timeout => 10);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'request reached the upstream');
    my $t0 = time;
    $t->redis_pause(1500);
    my $r1 = $bg->result(10);
    note("first attempt, completion during the pause: $r1->{status}");
    sleep_until($t0 + 1.7);
    my ($r, @seen) = $t->retry_until_final('/pay', 8, @req);
    note('answers after the pause: ' . join(', ', @seen));
    ok(($r->{status} == 201 && ($r->{headers}{'idempotent-replayed'} // '') eq 'true')
        || ($r->{status} == 409 && $t->ptype($r) eq 'outcome-unknown'),
        'after the pause: the replay or outcome-unknown') or diag($t->show($r));
    if ($r->{status} == 201) {
        is($t->sha256($r->{content}), (produced($k) // {})->{sha}, 'replay = the upstream\'s body');
    }
    is($t->effects(key => $k), 1, 'completion during a pause: never executed twice');
}

# ---- the same with a lease that outlives the pause: the completion whose
#      answer was lost is sent again after the reconnect, so the retry gets
#      the replay, not outcome-unknown
{
    my $k = $t->key('resend');
    my @req = (key => $k, json => { pay => 'resent completion' });
    my $bg = $t->http_bg(POST => '/long/pay', @req, headers => [ 'X-Delay' => 0.6 ], timeout => 10);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'resend: request reached the upstream');
    my $t0 = time;
    $t->redis_pause(1500);
    my $r1 = $bg->result(10);
    is($r1->{status}, 201, 'resend: the first attempt got its answer');
    sleep_until($t0 + 1.7);
    my ($r, @seen) = $t->retry_until_final('/long/pay', 10, @req);
    note('answers after the pause: ' . join(', ', @seen));
    is($r->{status}, 201, 'resend: the retry is answered 201') or diag($t->show($r));
    is($r->{headers}{'idempotent-replayed'}, 'true', 'resend: ... as a replay');
    is($t->sha256($r->{content}), (produced($k) // {})->{sha}, 'resend: replay = the upstream\'s body');
    is($t->effects(key => $k), 1, 'resend: one effect');
    like($t->error_log, qr/sending \d+ unrecorded results again/, 'resend: the worker sent the result again');
}

$t->check_logs;
done_testing;
