#!/usr/bin/perl
# Redis stalls for about 3 s (a busy script, then the process stopped with
# SIGSTOP) while 40 clients each send a new key, get 503 store-unavailable,
# retry once during the stall and again after it. A claim the worker gave
# up on may still run when Redis wakes, after the give-back the worker sent
# on its next connection (docs/states.md, "A claim nobody waits for"): it
# must never create a live record. So, in every trial:
#   - every key executes exactly once;
#   - no record stays in progress: once Redis answers again, every claim
#     that ran late is given back (the workers reconnect soon while a
#     give-back waits, docs/states.md);
#   - the retries after that are never told in-progress or outcome-unknown:
#     each executes once (201), and the next retry replays.
# A retry that arrives in the short window between Redis waking and the
# give-backs landing is told in-progress with Retry-After (docs/states.md);
# the clients wait for the window to close before their retries "after",
# and the diagnostics say how long it was.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $CLIENTS = 40;
my $STALL   = 3;
my $TRIALS  = $ENV{IDEM_STALL_TRIALS} // 3;

my $t = Idem::Test->new;
$t->start_stack(<<'EOF', workers => 2);
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%% connect_timeout=500ms timeout=500ms;
    location / {
        idempotency on;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

sub answer {
    my ($r) = @_;
    my $p = $t->ptype($r);
    return "$r->{status}" . ($p ? " $p" : '')
        . (($r->{headers}{'idempotent-replayed'} // '') eq 'true' ? ' replayed' : '');
}

sub trial {
    my ($how, $n) = @_;
    my $name = "$how, trial $n";
    my $run = "$$-" . int(time);
    my @keys = map { "stall-$how-$n-$run-$_" } 0 .. $CLIENTS - 1;
    my $go = $t->prefix . "/go-$how-$n";
    my $start = time + 2.5;     # the clients are forked and waiting by then
    my ($stall, $stalled, $woke, $clear);
    my $res = $t->parallel($CLIENTS, sub {
        my $c = shift;
        my $k = $keys[$c];
        my @req = (key => $k, json => { client => $c, trial => "$how-$n" });
        my $d = $start + 0.2 - time;
        sleep $d if $d > 0;
        my @during;
        for (1 .. 2) {
            my $r = $t->http(POST => "/stall/$how/$n", @req, timeout => 5);
            push @during, answer($r);
            last unless $r->{status} == 503;
            sleep($r->{headers}{'retry-after'} // 1);
        }
        $t->wait_for(sub { -e $go }, 30);
        my ($final, @after) = $t->retry_until_final("/stall/$how/$n", 20, @req);
        # the record is completed just after the answer went out (a retry
        # in between is told in-progress): let it land, then retry once more
        $t->wait_state($k, undef, 'completed', 5);
        my $check = $t->http(POST => "/stall/$how/$n", @req, timeout => 5);
        return { key => $k, during => \@during, after => \@after,
                 final => answer($final), check => answer($check) };
    }, timeout => 60, tick => sub {
        if (!$stall) {
            return if time < $start;
            $stall = $t->redis_stall($STALL, how => $how);
            $stalled = time;
            return;
        }
        return if $clear || time < $stalled + $STALL;
        $woke //= _port_answers($t) ? time : undef;
        return unless $woke;
        # no key of this trial in progress: every late claim was given back
        return if grep { (($t->record($_) // {})->{state} // '') eq 'in_progress' } @keys;
        $clear = time;
        open(my $fh, '>', $go) or die "$go: $!";
        close $fh;
    });
    ok($clear, "$name: once Redis answered again, no key stayed in progress")
        or diag(join ' ', grep { (($t->record($_) // {})->{state} // '') eq 'in_progress' } @keys);
    diag(sprintf '%s: keys clear %.2f s after Redis answered again', $name, $clear - $woke)
        if $clear && $woke;
    ok($stall && $t->redis_stall_end($stall), "$name: Redis stalled and answers again");

    my (%during, %after, @bad);
    for my $x (@$res) {
        if (!$x) { push @bad, 'a client died'; next }
        $during{$_}++ for @{ $x->{during} };
        $after{$_}++ for @{ $x->{after} };
        my $effects = $t->effects(key => $x->{key});
        push @bad, "$x->{key}: $effects effects" unless $effects == 1;
        push @bad, "$x->{key}: final $x->{final}" unless $x->{final} =~ /^201\b/;
        push @bad, "$x->{key}: check $x->{check}" unless $x->{check} eq '201 replayed';
        my $rec = $t->record($x->{key}) // {};
        push @bad, "$x->{key}: record " . ($rec->{state} // 'none')
            unless ($rec->{state} // '') eq 'completed';
        push @bad, "$x->{key}: answered outcome-unknown"
            if grep { /outcome-unknown/ } @{ $x->{during} }, @{ $x->{after} };
        push @bad, "$x->{key}: told in-progress after the stall"
            if grep { /in-progress/ } @{ $x->{after} };
    }
    is(scalar(@bad), 0, "$name: every key executed once, ended 201 without in-progress, replays, is completed")
        or diag(join "\n", @bad[0 .. ($#bad < 15 ? $#bad : 15)]);
    ok(($during{'503 store-unavailable'} // 0) >= $CLIENTS,
        "$name: the stall was seen: store-unavailable during it")
        or diag(explain \%during);
    diag(sprintf '%s: during %s; after %s', $name,
        join(', ', map { "$_ x$during{$_}" } sort keys %during),
        join(', ', map { "$_ x$after{$_}" } sort keys %after));
}

sub _port_answers {
    my ($t) = @_;
    return (eval { $t->redis('PING') } // '') eq 'PONG';
}

for my $how (qw(script stop)) {
    trial($how, $_) for 1 .. $TRIALS;
}

$t->check_logs;
done_testing;
