#!/usr/bin/perl
# A bounded randomized fault test. 8 clients run 200 trials in all (one fresh
# key each); every attempt of a trial may carry an upstream fault (slow,
# slower than proxy_read_timeout, dropped, reset, truncated) and an impatient
# client timeout, and the client retries by the documented rule (same key on
# 502/503/504/timeouts/in-progress, stop on a 201 or outcome-unknown).
# Meanwhile the test kills nginx workers (-9), pauses Redis (CLIENT PAUSE),
# stalls Redis (a busy script, SIGSTOP) while clients retry, restarts the
# upstream and restarts Redis (appendonly). At the end, after
# one clean retry per key:
#   - every key has at most one upstream effect;
#   - every 201 any client got, executed or replayed, is the response the
#     upstream produced for that key's one effect (body sha, X-Upstream-Seq);
#   - nothing else than the documented answers came back.
# IDEM_CHAOS_SEED and IDEM_CHAOS_TRIALS override the fixed seed / trial count.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $SEED    = $ENV{IDEM_CHAOS_SEED} // 20261202;
my $TRIALS  = $ENV{IDEM_CHAOS_TRIALS} // 200;
my $CLIENTS = 8;
my $BUDGET  = 60;    # seconds for the trial phase; trials left then are skipped (and counted)
diag("chaos seed $SEED (IDEM_CHAOS_SEED=$SEED to replay the same choices), $TRIALS trials");

my $t = Idem::Test->new;
$t->start_stack(<<'EOF', workers => 2, redis => { appendonly => 1 });
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%% connect_timeout=300ms timeout=300ms;
    idempotency_lease 2s;
    proxy_read_timeout 1s;
    proxy_connect_timeout 1s;
    location /a/ {
        idempotency on;
        proxy_ignore_client_abort on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /b/ {
        idempotency on;
        idempotency_wait 1s;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF


# What a client does with an answer.
sub classify {
    my ($r) = @_;
    my $s = $r->{status};
    return 'executed' if $s == 201 && !exists $r->{headers}{'idempotent-replayed'};
    return 'replayed' if $s == 201 && ($r->{headers}{'idempotent-replayed'} // '') eq 'true';
    my $p = $t->ptype($r);
    return 'unknown'     if $s == 409 && $p eq 'outcome-unknown';
    return 'in-progress' if $s == 409 && $p eq 'in-progress';
    return 'store-unavailable' if $s == 503 && $p eq 'store-unavailable';
    return 'gateway-502' if $s == 502 && !$p;
    return 'gateway-504' if $s == 504 && !$p;
    return 'no-answer'   if $s == 599;
    return "unexpected-$s" . ($p ? "-$p" : '');
}
my %RETRY = map { $_ => 1 } qw(in-progress store-unavailable gateway-502 gateway-504 no-answer);

# One attempt with random faults; returns its record.
sub attempt {
    my ($path, $key, $body) = @_;
    my @h;
    my $f = rand;
    my $fault = 'none';
    if    ($f < 0.10) { $fault = 'drop';     push @h, 'X-Drop' => 1, 'X-Delay' => 0.1 }
    elsif ($f < 0.15) { $fault = 'reset';    push @h, 'X-Drop' => 'rst' }
    elsif ($f < 0.20) { $fault = 'truncate'; push @h, 'X-Truncate' => 7 }
    elsif ($f < 0.30) { $fault = 'timeout';  push @h, 'X-Delay' => 1.4 }     # > proxy_read_timeout
    elsif ($f < 0.50) { $fault = 'slow';     push @h, 'X-Delay' => 0.2 + rand(0.5) }
    my $ctimeout = rand() < 0.2 ? 0.25 : 3;
    $fault .= '+impatient' if $ctimeout < 1;
    my $r = $t->http(POST => $path, key => $key, json => $body, headers => \@h, timeout => $ctimeout);
    return { class => classify($r), status => $r->{status}, fault => $fault,
             sha => $t->sha256($r->{content}), seq => $r->{headers}{'x-upstream-seq'} };
}

# ---- the trials, with faults injected by the parent meanwhile
my %faults = (kill => 0, pause => 0, stall => 0, upstream_restart => 0, redis_restart => 0);
# the fault sequence follows the seed too (its own generator: the parent's
# rand() is also used by the modules it calls)
my $fn = 0;
sub frand { hex(substr($t->sha256("$SEED:fault:" . $fn++), 0, 8)) / 4294967296 * ($_[0] // 1) }
my $t0 = time;
my $next_fault = $t0 + 0.5;
my @fault_log;
my $stall_until = 0;
my $inject = sub {
    return if time < $next_fault || time < $stall_until;
    my $x = frand();
    if ($x < 0.35) {
        my @w = $t->worker_pids;
        my $pid = $w[int frand(scalar @w)];
        if ($pid && $t->kill_worker($pid)) { $faults{kill}++; push @fault_log, sprintf('%.1f kill', time - $t0) }
    } elsif ($x < 0.65) {
        my $ms = 300 + int frand(700);
        $t->redis_pause($ms);
        $faults{pause}++;
        push @fault_log, sprintf('%.1f pause %dms', time - $t0, $ms);
    } elsif ($x < 0.80) {
        # Redis stops answering (a busy script, or the process stopped)
        # while clients time out and retry: claims given up on run late
        my $secs = 1 + frand(1.5);
        my $how = frand() < 0.5 ? 'script' : 'stop';
        $t->redis_stall($secs, how => $how);
        $stall_until = time + $secs + 0.2;
        $faults{stall}++;
        push @fault_log, sprintf('%.1f stall %s %.1fs', time - $t0, $how, $secs);
    } elsif ($x < 0.90) {
        $t->stop_upstream;
        sleep 0.1;
        $t->start_upstream;
        $faults{upstream_restart}++;
        push @fault_log, sprintf('%.1f upstream restart', time - $t0);
    } else {
        $t->restart_redis;
        $faults{redis_restart}++;
        push @fault_log, sprintf('%.1f redis restart', time - $t0);
    }
    $next_fault = time + 0.5 + frand(1.0);
};

my $deadline = $t0 + $BUDGET;
my $per = int(($TRIALS + $CLIENTS - 1) / $CLIENTS);
my $res = $t->parallel($CLIENTS, sub {
    my $c = shift;
    srand($SEED * 1000 + $c);
    my @trials;
    for my $j (0 .. $per - 1) {
        my $n = $c * $per + $j;
        last if $n >= $TRIALS;
        if (time > $deadline) { push @trials, { skipped => 1 }; next }
        my $key = "chaos-$SEED-$$-$c-$j";
        my $path = rand() < 0.5 ? '/a/ops' : '/b/ops';
        my $body = { client => $c, trial => $j, amount => int rand 1000 };
        my @att;
        for my $a (1 .. 5) {
            my $x = attempt($path, $key, $body);
            push @att, $x;
            last unless $RETRY{ $x->{class} };
            sleep 0.1 + rand 0.3;
        }
        push @trials, { key => $key, path => $path, body => $body, attempts => \@att };
    }
    return \@trials;
}, timeout => $BUDGET + 60, tick => $inject);
my $elapsed = time - $t0;

is(scalar(grep { defined } @$res), $CLIENTS, "all $CLIENTS chaos clients finished")
    or diag(explain [ map { defined $_ ? 'ok' : 'died/hung' } @$res ]);
my @trials = map { @{ $_ // [] } } @$res;
my @skipped = grep { $_->{skipped} } @trials;
@trials = grep { !$_->{skipped} } @trials;

# ---- settle: in-flight upstream work ends, leases of dead owners lapse, the
#      store is reachable; then one clean retry per key (following in-progress
#      and store-unavailable for a while)
$t->redis('PING');
$t->wait_for(sub { ($t->redis('PING') // '') eq 'PONG' }, 10);
sleep 2.5;
my %final;
for my $tr (@trials) {
    my $x;
    my $end = time + 8;
    while (1) {
        my $r = $t->http(POST => $tr->{path}, key => $tr->{key}, json => $tr->{body}, timeout => 5);
        $x = { class => classify($r), status => $r->{status}, fault => 'final',
               sha => $t->sha256($r->{content}), seq => $r->{headers}{'x-upstream-seq'} };
        last unless $RETRY{ $x->{class} } && time < $end;
        sleep 0.3;
    }
    push @{ $tr->{attempts} }, $x;
    $final{ $x->{class} }++;
}

# ---- the invariants
my (%eff, %resp);
push @{ $eff{ $_->{key} // '' } }, $_ for $t->effect_list;
$resp{ $_->{n} } = $_ for $t->upstream_responses;

my (%answers, %byfault, @multi, @badbody, @unexpected, @double_exec);
my ($checked201, $keys0, $keys1) = (0, 0, 0);
for my $tr (@trials) {
    my @e = @{ $eff{ $tr->{key} } // [] };
    push @multi, "$tr->{key}: " . scalar(@e) . ' effects' if @e > 1;
    @e ? $keys1++ : $keys0++;
    my $execs = 0;
    for my $x (@{ $tr->{attempts} }) {
        $answers{ $x->{class} }++;
        $byfault{"$x->{fault} -> $x->{class}"}++;
        push @unexpected, "$tr->{key} ($x->{fault}): $x->{class}" if $x->{class} =~ /^unexpected/;
        next unless $x->{class} eq 'executed' || $x->{class} eq 'replayed';
        $execs++ if $x->{class} eq 'executed';
        $checked201++;
        my $want = @e == 1 ? $resp{ $e[0]{n} } : undef;
        push @badbody, "$tr->{key}: $x->{class} but " . scalar(@e) . ' effects' unless @e == 1;
        push @badbody, sprintf('%s: %s (%s, status %s, seq %s) body sha %s != produced seq %s sha %s%s; attempts: %s',
            $tr->{key}, $x->{class}, $x->{fault}, $x->{status}, $x->{seq} // 'none', $x->{sha}, $e[0]{n},
            $want ? $want->{sha} : 'none', $want && $want->{truncated} ? ' (truncated)' : '',
            join(' ', map { "$_->{fault}=>$_->{class}" } @{ $tr->{attempts} }))
            if @e == 1 && (!$want || $want->{sha} ne $x->{sha} || ($x->{seq} // '') ne $e[0]{n});
    }
    push @double_exec, $tr->{key} if $execs > 1;
}

diag(sprintf('%d trials (%d skipped at the time budget) in %.1f s, %d attempts; faults injected: %s',
    scalar @trials, scalar @skipped, $elapsed, scalar(map { @{ $_->{attempts} } } @trials),
    join(', ', map { "$_=$faults{$_}" } sort keys %faults)));
diag('answers: ' . join(', ', map { "$_=$answers{$_}" } sort keys %answers));
diag('final clean retry per key: ' . join(', ', map { "$_=$final{$_}" } sort keys %final));
diag("keys with 0 effects: $keys0, with 1 effect: $keys1; 201 answers checked against the upstream: $checked201");
note("$_: $byfault{$_}") for sort keys %byfault;
diag("faults at (s): " . join(", ", @fault_log));

is(scalar(@trials) + scalar(@skipped), $TRIALS, "$TRIALS trials planned");
ok(@trials >= $TRIALS / 2, 'at least half of the trials ran within the time budget');
ok(!@multi, 'every key has at most one upstream effect') or diag(join "\n", @multi[0 .. ($#multi < 19 ? $#multi : 19)]);
ok(!@double_exec, 'no key was answered "executed" twice') or diag(join "\n", @double_exec);
ok(!@badbody, 'every 201 (executed or replayed) is the response the upstream produced for that key')
    or diag(join "\n", @badbody[0 .. ($#badbody < 19 ? $#badbody : 19)]);
ok(!@unexpected, 'only documented answers') or diag(join "\n", @unexpected[0 .. ($#unexpected < 19 ? $#unexpected : 19)]);
ok(!grep({ $RETRY{$_} } keys %final), 'after the chaos every key is settled (replay, execution or outcome-unknown)')
    or diag(explain \%final);
ok($checked201 > 0 && ($answers{replayed} // 0) > 0, 'the run produced executions and replays to check');
ok($faults{stall} > 0 && $faults{kill} > 0 && $faults{pause} > 0, 'the run stalled, paused Redis and killed workers')
    or diag(explain \%faults);

# harness invariants: the upstream numbers its effects uniquely (the check
# on bodies above keys on that number), and every effect belongs to a trial
my %seen_n;
my @dup_n = grep { $seen_n{ $_->{n} }++ } $t->effect_list;
is(scalar(@dup_n), 0, 'every effect has its own number') or diag(explain [ map { $_->{n} } @dup_n ]);
my %known = map { $_->{key} => 1 } @trials;
is(scalar(grep { !$known{$_} } grep { length } keys %eff), 0, 'every effect belongs to a trial key');

$t->check_logs(ignore => qr/worker process \d+ exited on signal 9/);
done_testing;
