#!/usr/bin/perl
# idempotency_unique and idempotency_lock on a Redis Cluster: a worker lost
# at each step of the claim there (docs/business-keys.md, "A worker lost at
# each step").  The mechanism: the master that the next step's command goes
# to is paused (CLIENT PAUSE WRITE: the command waits in its connection),
# the only worker is killed with SIGKILL while it waits, then the master is
# unpaused; the connection is gone, so the command never runs.  So:
#   - after 1: the unique key's master paused: A's record claimed, no key;
#     A's gate is still shut, so once A's lease lapsed A's retry takes the
#     claim over;
#   - after 2, part of it: the lock key's master paused: the unique key
#     names A, the lock key does not; A's gate is still shut, so once A's
#     lease lapsed a competitor takes A over and runs;
#   - after every key (about to proxy, or proxied): the upstream accepts
#     the connection and never answers: every key names A.
# After each, within one lease: A's retry and competitors (another key, the
# same event; another key, the same environment) get a decision; effects
# never 2; every business key that names A names a record of A's that is
# in progress or unknown.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use IO::Socket::INET;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $t = Idem::Test->new;

# a listener that never accepts: nginx connects and writes, nobody reads
my $hole = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 64, ReuseAddr => 1)
    or BAIL_OUT("listen: $!");
my $HOLE = '127.0.0.1:' . $hole->sockport;

my @ports = $t->start_cluster(masters => 3, replicas => 1);
my $seeds = join ' ', map { "127.0.0.1:$_" } @ports[0, 1];
$t->start_upstream;
$t->start_nginx(<<"EOF", workers => 1);
idempotency_json_var \$source_event_id /source_event_id;
idempotency_json_var \$environment /environment;
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis_cluster $seeds connect_timeout=300ms timeout=5s;
    proxy_ignore_client_abort on;
    location /u {
        idempotency on;
        idempotency_lease 2s;
        idempotency_unique ev:\$source_event_id shared=u;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /ul {
        idempotency on;
        idempotency_lease 2s;
        idempotency_unique ev:\$source_event_id shared=ul;
        idempotency_lock deploy:\$environment;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /hole {
        idempotency on;
        idempotency_lease 2s;
        idempotency_unique ev:\$source_event_id shared=ul;
        idempotency_lock deploy:\$environment;
        proxy_read_timeout 60s;
        proxy_pass http://$HOLE;
    }
}
EOF

# the keys as docs/business-keys.md derives them (no idempotency_scope)
sub unique_name { $t->unique_shared_name(@_) }
sub lock_name { $t->lock_name($_[0]) }

# the slot map, read once: a paused master answers nothing, not even
# CLUSTER SLOTS (and nothing moves slots here)
my $OWNERS = $t->cluster_owners;
sub master_of { $OWNERS->[$t->key_slot($_[0])] }

sub get_anywhere {
    my ($key) = @_;
    my $m = master_of($key) // return undef;
    my $v = $t->redis_at($m, 'GET', $key);
    return ref $v ? undef : $v;
}

sub req {
    my ($path, $key, $ev, $env, %o) = @_;
    my $body = { source_event_id => $ev, environment => $env };
    return $o{bg} ? $t->http_bg(POST => $path, key => $key, json => $body, timeout => 30)
                  : $t->http(POST => $path, key => $key, json => $body, timeout => 10);
}

sub answer_of { my $r = shift; join ' ', $r->{status}, $t->ptype($r) || (($r->{headers}{'idempotent-reused'} // '') eq 'true' ? 'reused' : '') }

sub effects_of {
    my ($ev) = @_;
    return scalar grep { ($_->{json}{source_event_id} // '') eq $ev } $t->effect_list;
}

# every business key that names record $rk: [key, value]
sub naming {
    my ($rk, @keys) = @_;
    return grep { index($_->[1], $rk) == 0 } map { [ $_, get_anywhere($_) // '' ] } @keys;
}

# the state of record $rk with operation $op, or 'none'
sub state_of {
    my ($rk, $op) = @_;
    my $r = $t->record_at($rk, at => master_of($rk)) or return 'none';
    return ($r->{op} // '') eq $op ? $r->{state} : 'other';
}

# values whose keys are on masters that differ as asked
sub pick {
    my ($want) = @_;
    for my $i (1 .. 500) {
        my $c = { key => $t->key("f$i"), ev => "ev-$$-$i-" . time, env => "env-$$-$i-" . time };
        return $c if $want->($c);
    }
    BAIL_OUT('no such values');
}

# pause the masters of @pause, send A, kill the worker while it waits, unpause
sub crash_while_paused {
    my ($path, $c, @pause) = @_;
    # a worker just started sends its first commands to a seed until it
    # has the slot map: it is had first
    req('/u', $t->key('warm'), "warm-$_-" . time . rand) for 1 .. 3;
    sleep 0.5;
    $t->redis_at($_, 'CLIENT', 'PAUSE', 8000, 'WRITE') for @pause;
    my $bg = req($path, $c->{key}, $c->{ev}, $c->{env}, bg => 1);
    my $rk = $t->record_name($c->{key});
    my $claimed = $t->wait_for(sub { defined get_anywhere($rk) }, 10);
    sleep 0.5;
    my $killed = $t->kill_worker;
    $t->redis_at($_, 'CLIENT', 'UNPAUSE') for @pause;
    $bg->result(10);
    return ($claimed, $killed);
}

# after the crash: the keys that name A name a live record of A's
sub check_names {
    my ($name, $c, $op, @keys) = @_;
    my $rk = $t->record_name($c->{key});
    for my $n (naming($rk, @keys)) {
        my $nop = substr($n->[1], length $rk, 32);
        like(state_of($rk, $nop), qr/^(in_progress|unknown)$/, "$name: $n->[0] names A's record, in progress or unknown");
    }
}

# ---- after 1: the record claimed, no business key
{
    my $c = pick(sub { my $c = shift;
        master_of(unique_name('u', "ev:$c->{ev}")) ne master_of($t->record_name($c->{key})) });
    my $U = unique_name('u', "ev:$c->{ev}");
    my ($claimed, $killed) = crash_while_paused('/u', $c, master_of($U));
    ok($claimed && $killed, 'after 1: A\'s record claimed, its worker killed while its unique key was being taken');
    is(get_anywhere($U), undef, 'after 1: no unique key');
    my $retry = req('/u', $c->{key}, $c->{ev}, $c->{env});
    like(answer_of($retry), qr/^409 (in-progress|outcome-unknown)$/, 'after 1: A\'s retry: in progress or unknown');
    my $ck = $t->key('comp1');
    my $comp = req('/u', $ck, $c->{ev});
    is(answer_of($comp), '201 ', 'after 1: a competitor with the same event executes (A never will)');
    is(effects_of($c->{ev}), 1, 'after 1: one effect');
    my $ckr = $t->record_name($ck);
    like(get_anywhere($U) // '', qr/^\Q$ckr\E/, 'after 1: the unique key names the competitor');
    is(scalar(naming($t->record_name($c->{key}), $U)), 0, 'after 1: no key names A');
    ok($t->wait_for(sub { answer_of(req('/u', $c->{key}, $c->{ev}, $c->{env})) eq '201 reused' }, 5),
       'after 1: after the lease, A\'s retry takes its claim over (its gate was shut) and gets the event\'s answer, reused');
    is(effects_of($c->{ev}), 1, 'after 1: still one effect');
}

# ---- after 2, part of it: the unique key taken, the lock key not
{
    my $c = pick(sub { my $c = shift;
        my $l = master_of(lock_name("deploy:$c->{env}"));
        $l ne master_of($t->record_name($c->{key})) && $l ne master_of(unique_name('ul', "ev:$c->{ev}")) });
    my ($U, $L) = (unique_name('ul', "ev:$c->{ev}"), lock_name("deploy:$c->{env}"));
    my ($claimed, $killed) = crash_while_paused('/ul', $c, master_of($L));
    ok($claimed && $killed, 'after 2 (part): A\'s worker killed while its lock key was being taken');
    my $rk = $t->record_name($c->{key});
    like(get_anywhere($U) // '', qr/^\Q$rk\E/, 'after 2 (part): the unique key names A');
    is(get_anywhere($L), undef, 'after 2 (part): no lock key');
    my $op = substr(get_anywhere($U) // '', length $rk, 32);
    check_names('after 2 (part)', $c, $op, $U, $L);
    like(answer_of(req('/ul', $c->{key}, $c->{ev}, $c->{env})), qr/^409 (in-progress|outcome-unknown)$/,
         'after 2 (part): A\'s retry: in progress or unknown');
    my $same = req('/ul', $t->key('comp2'), $c->{ev}, "other-$c->{env}");
    like(answer_of($same), qr/^409 (in-progress|outcome-unknown)$/,
         'after 2 (part): a competitor with the same event: A\'s in-progress or unknown, not executed');
    my $lockc = req('/ul', $t->key('comp3'), "other-$c->{ev}", $c->{env});
    is(answer_of($lockc), '201 ', 'after 2 (part): a competitor for the lock A never took executes');
    is(effects_of($c->{ev}), 0, 'after 2 (part): A\'s event: no effect');
    my @after;
    ok($t->wait_for(sub { my $a = answer_of(req('/ul', $t->key('comp4'), $c->{ev}, "o2-$c->{env}")); push @after, $a; $a eq '201 ' }, 6),
       'after 2 (part): once A\'s lease lapsed, a competitor with the same event takes A over and executes (A\'s gate was shut: A never ran)')
        or diag("@after");
    ok(!grep({ !/^(409 in-progress|201 )$/ } @after), '... before that: in-progress') or diag("@after");
    is(effects_of($c->{ev}), 1, 'after 2 (part): A\'s event: one effect');
    is(state_of($rk, $op), 'none', 'after 2 (part): A\'s record was taken over (deleted)');
    my $again = req('/ul', $c->{key}, $c->{ev}, $c->{env});
    is(answer_of($again), '201 reused', 'after 2 (part): A\'s retry then gets the event\'s answer, reused');
    is(effects_of($c->{ev}), 1, 'after 2 (part): still one effect');
    check_names('after 2 (part), after the lease', $c, $op, $U, $L);
}

# ---- after every key: proxied (or about to be), never answered
{
    my $c = pick(sub { 1 });
    my ($U, $L) = (unique_name('ul', "ev:$c->{ev}"), lock_name("deploy:$c->{env}"));
    my $bg = req('/hole', $c->{key}, $c->{ev}, $c->{env}, bg => 1);
    my $rk = $t->record_name($c->{key});
    ok($t->wait_for(sub { index(get_anywhere($L) // '', $rk) == 0 }, 10), 'after 2 and 3: every key names A');
    sleep 0.3;
    ok($t->kill_worker, 'after 2 and 3: A\'s worker killed while it waits for the upstream');
    $bg->result(10);
    my $op = substr(get_anywhere($U) // '', length $rk, 32);
    like(get_anywhere($U) // '', qr/^\Q$rk$op\E/, 'after 2 and 3: the unique key names A');
    check_names('after 2 and 3', $c, $op, $U, $L);
    my $lockc = req('/ul', $t->key('comp5'), "other-$c->{ev}", $c->{env});
    $t->is_problem($lockc, 409, 'lock-held', name => 'after 2 and 3: a competitor for the lock: lock-held');
    like(answer_of(req('/hole', $t->key('comp6'), $c->{ev}, "o-$c->{env}")), qr/^409 (in-progress|outcome-unknown)$/,
         'after 2 and 3: a competitor with the same event: in progress or unknown');
    $t->is_problem(req('/ul', $t->key('comp6b'), $c->{ev}, "o-$c->{env}"), 409, 'identity-held-elsewhere',
                   name => 'after 2 and 3: ... and in another location sharing the identity: held elsewhere');
    ok($t->wait_for(sub { answer_of(req('/hole', $c->{key}, $c->{ev}, $c->{env})) eq '409 outcome-unknown' }, 5),
       'after 2 and 3: after the lease, A\'s retry: outcome-unknown');
    $t->is_problem(req('/ul', $t->key('comp7'), "o3-$c->{ev}", $c->{env}), 409, 'lock-held', retry_after => 60,
                   name => 'after 2 and 3: the lock held by the unknown operation, Retry-After 60');
    is(effects_of("other-$c->{ev}") + effects_of($c->{ev}), 0, 'after 2 and 3: no effect at all');
    check_names('after 2 and 3, after the lease', $c, $op, $U, $L);
}

close $hole;
done_testing;
