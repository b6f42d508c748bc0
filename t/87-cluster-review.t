#!/usr/bin/perl
# idempotency_lock on a Redis Cluster: writes lost with a failover.
# First, the lock key lost while its operation runs: the next keep
# (business_key.lua) names the operation in it again.  Then the gate's
# opening lost with a failover of the record's master (docs/business-keys.md, "Reshards and
# failovers").  Replication is asynchronous: the master that ran the DEL
# of the gate (business_gate.lua "open") can die before its replica has it,
# and the promoted replica still has the gate shut, naming an operation
# that ran.  Its record turning unknown later (its worker lost) would then
# read as "never ran": its own key's retry and a competitor for the lock
# would take it over and run again.  The lost write is made here by hand
# (the gate SET back as the replica kept it): the next lease renewal opens
# the gate again (renew.lua), so once the worker is killed, the retry gets
# outcome-unknown, the competitor lock-held, and nothing runs twice.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(time sleep);
use Digest::SHA;
use Idem::Test;

my $t = Idem::Test->new;

my @ports = $t->start_cluster(masters => 3, replicas => 1);
my $seeds = join ' ', map { "127.0.0.1:$_" } @ports[0, 1];
$t->start_upstream;
$t->start_nginx(<<"EOF", workers => 1);
idempotency_json_var \$environment /environment;
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis_cluster $seeds connect_timeout=300ms timeout=5s;
    proxy_ignore_client_abort on;
    location /l {
        idempotency on;
        idempotency_lease 2s;
        idempotency_lock deploy:\$environment;
        proxy_read_timeout 60s;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

my $OWNERS = $t->cluster_owners;
sub master_of { $OWNERS->[$t->key_slot($_[0])] }

sub get_at {
    my ($key) = @_;
    my $v = $t->redis_at(master_of($key), 'GET', $key);
    return ref $v ? undef : $v;
}

sub deploy {
    my ($key, $env, %o) = @_;
    my @h = ('X-Delay' => $o{delay} // 0);
    return $o{bg} ? $t->http_bg(POST => '/l', key => $key, json => { environment => $env }, headers => \@h, timeout => 60)
                  : $t->http(POST => '/l', key => $key, json => { environment => $env }, headers => \@h, timeout => 10);
}

sub answer_of { my $r = shift; join ' ', $r->{status}, $t->ptype($r) // '' }

sub effects_of {
    my ($env) = @_;
    return scalar grep { ($_->{json}{environment} // '') eq $env } $t->effect_list;
}

# the worker has the slot map before A
deploy($t->key("warm$_"), "warm-$$-$_") for 1 .. 3;

sub lock_name { $t->lock_name($_[0]) }

# ---- the lock key lost with a failover of its master while its operation
# runs: the next keep (a third of the lease) makes it name the operation
# again, so a competitor after that is refused; a key that names another
# operation while it runs is logged
{
    my $env2 = "stage-$$-" . int(time);
    my $kb = $t->key('b');
    my $L = lock_name("deploy:$env2");
    my $bgb = deploy($kb, $env2, delay => 40, bg => 1);
    ok($t->wait_for(sub { effects_of($env2) == 1 }, 10), 'B reached the upstream');
    my $name = get_at($L) // '';
    like($name, qr/^\Q${\ $t->record_name($kb)}\E[0-9a-f]{32}/, 'the lock key names B');
    $t->redis_at(master_of($L), 'DEL', $L);
    ok($t->wait_for(sub { (get_at($L) // '') eq $name }, 5),
       'the lock key lost (its master failed over before its replica had it): B\'s next keep names B in it again');
    is(answer_of(deploy($t->key('d'), $env2)), '409 lock-held', 'a competitor: lock-held, not run beside B');
    is(effects_of($env2), 1, 'one effect');
    my $other = 'idem:{' . ('0' x 32) . '}:r' . ('1' x 32);
    $t->redis_at(master_of($L), 'SET', $L, $other, 'PX', 600000);
    ok($t->wait_for(sub { $t->error_log =~ /business key "\Q$L\E" names another operation while its own runs/ }, 5),
       'a lock key taken from B while B runs is logged');
}

my $env = "prod-$$-" . int(time);
my $ka = $t->key('a');
my $rk = $t->record_name($ka);
my $gate = "$rk:p";

# A runs, and stays at the upstream
my $bg = deploy($ka, $env, delay => 40, bg => 1);
ok($t->wait_for(sub { effects_of($env) == 1 }, 10), 'A reached the upstream');
my $rec = $t->record_at($rk, at => master_of($rk));
is($rec->{state}, 'in_progress', 'A is in progress');
my $op = $rec->{op};
is(get_at($gate), undef, 'A\'s gate is open');

# the failover that lost the gate's opening: the promoted replica has it shut
$t->redis_at(master_of($gate), 'SET', $gate, $op, 'PX', 600000);
is(get_at($gate), $op, 'the gate names A again, as the replica kept it');

ok($t->wait_for(sub { !defined get_at($gate) }, 5),
   'A\'s next lease renewal opens its gate again (it runs, so the gate must not name it)');

# A's worker lost: its record lapses to unknown
ok($t->kill_worker, 'A\'s worker killed while A is at the upstream');
deploy($t->key("warm-after$_"), "warm-after-$$-$_") for 1 .. 3;

my $retry;
ok($t->wait_for(sub { $retry = deploy($ka, $env); answer_of($retry) ne '409 in-progress' }, 10),
   'A\'s lease lapses');
is(answer_of($retry), '409 outcome-unknown', 'A\'s retry: outcome unknown, not run again');
my $comp = deploy($t->key('c'), $env);
is(answer_of($comp), '409 lock-held', 'a competitor for the lock: lock-held, not run beside A');
is(effects_of($env), 1, 'one effect: nothing ran twice');
is($t->record_at($rk, at => master_of($rk))->{op}, $op, 'A\'s record is still A\'s, for an operator to resolve');

done_testing;
