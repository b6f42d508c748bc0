#!/usr/bin/perl
# idempotency_redis_wait with idempotency_lock and idempotency_unique on a Redis Cluster
# (docs/business-keys.md, "Reshards and failovers"): the step that takes
# the business keys waits for a replica of each key's master, and of the
# record's master once the gate is opened, before the request runs.
#
# 1. The gate's opening lost with a failover of the record's master: the
#    record and its shut gate have reached the replica S; S stops
#    (SIGSTOP, its replication link closed) before the gate is opened.  The request goes to the
#    upstream only once S has the opening (its WAIT holds it until S
#    resumes); then the master is killed (-9), and the worker too, before
#    any renewal: S is promoted, with the gate opened.  A's retry after its
#    lease gets outcome-unknown, a competitor for the lock lock-held, one
#    effect.  Without the WAIT (IDEM_T90_NOWAIT=1 drops the directive) the
#    request runs while S is stopped, S is promoted with the gate shut, and
#    the retry takes the claim over as one that never ran: two effects.
# 2. A replica that cannot acknowledge (stopped): the lock key's, the
#    unique key's, or the record's once the gate is opened: 503 store-not-replicated, nothing
#    run, everything given back (the retry, with the replica back, runs).

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $t = Idem::Test->new;
my $NOWAIT = $ENV{IDEM_T90_NOWAIT};

my @ports = $t->start_cluster(masters => 3, replicas => 1);
my $seeds = join ' ', map { "127.0.0.1:$_" } @ports;
my $wait_l = $NOWAIT ? '' : 'idempotency_redis_wait 1 6s;';
$t->start_upstream;
$t->start_nginx(<<"EOF", workers => 1);
idempotency_json_var \$environment /environment;
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis_cluster $seeds connect_timeout=300ms timeout=10s;
    proxy_ignore_client_abort on;
    location /l {
        idempotency on;
        idempotency_lease 2s;
        $wait_l
        idempotency_lock deploy:\$environment;
        proxy_read_timeout 60s;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /u {
        idempotency on;
        idempotency_lease 2s;
        idempotency_redis_wait 1 300ms;
        idempotency_unique ev:\$environment shared=u;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /s {
        idempotency on;
        idempotency_lease 2s;
        idempotency_redis_wait 1 300ms;
        idempotency_lock deploy:\$environment;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

ok($t->wait_for(sub { my $sh = $t->cluster_shards; @$sh && !grep { !@{ $_->{replicas} } } @$sh }, 30),
   'every master has its replica');
my $SHARDS = $t->cluster_shards;
sub shard_of { my $s = $t->key_slot($_[0]); (grep { $_->{first} <= $s && $s <= $_->{last} } @$SHARDS)[0] }
sub name_on { my ($port) = @_; (grep { $t->instance_port($_) == $port } map { "c$_" } 1 .. @ports)[0] }

sub get_at {
    my ($port, $key) = @_;
    my $v = $t->redis_at($port, 'GET', $key);
    return ref $v ? undef : $v;
}
sub get_replica {
    my ($port, $key) = @_;
    my @r = $t->redis_at_multi($port, ['READONLY'], ['GET', $key]);
    return ref $r[1] ? undef : $r[1];
}

sub deploy {
    my ($loc, $key, $env, %o) = @_;
    my @h = ('X-Delay' => $o{delay} // 0);
    return $o{bg} ? $t->http_bg(POST => $loc, key => $key, json => { environment => $env }, headers => \@h, timeout => 60)
                  : $t->http(POST => $loc, key => $key, json => { environment => $env }, headers => \@h, timeout => 20);
}
sub answer_of { my $r = shift; join ' ', $r->{status}, $t->ptype($r) // '' }
sub effects_of { my ($env) = @_; scalar grep { ($_->{json}{environment} // '') eq $env } $t->effect_list }

# a key and an environment whose record and lock key are on two masters
sub pick {
    my ($tag) = @_;
    for my $i (1 .. 500) {
        my ($env, $key) = ("$tag-$$-$i", $t->key("$tag$i"));
        my ($r, $l) = (shard_of($t->record_name($key)), shard_of($t->lock_name("deploy:$env")));
        return ($key, $env, $r, $l) if $r->{master} != $l->{master};
    }
    die "no pair for $tag";
}

# a replica stopped and resumed (SIGSTOP, SIGCONT): it answers nothing, its
# master's WAIT counts it out, and it stays a replica
my %stopped;
sub stop_replica { my ($port) = @_; kill 'STOP', $t->instance_pid(name_on($port)); $stopped{$port} = 1 }
sub cont_replica { my ($port) = @_; kill 'CONT', $t->instance_pid(name_on($port)) if delete $stopped{$port} }
END { cont_replica($_) for keys %stopped }

# a client of the master blocked in WAIT (the request held for its replica)
sub waiting_on {
    my ($port) = @_;
    my $list = $t->redis_at($port, 'CLIENT', 'LIST');
    return !ref $list && $list =~ /^(?=.*\bflags=\S*b)(?=.*\bcmd=wait\b)/m;
}

# the worker has the slot map
deploy('/s', $t->key("warm$_"), "warm-$$-$_") for 1 .. 3;

# ---- 2a: the lock key's replica cannot acknowledge: 503, nothing runs
{
    my ($key, $env, $rs, $ls) = pick('ks');
    my $L = $t->lock_name("deploy:$env");
    stop_replica($ls->{replicas}[0]);
    my $r = deploy('/s', $key, $env);
    is(answer_of($r), '503 store-not-replicated', 'the lock key\'s replica stopped: 503 store-not-replicated');
    is($r->{headers}{'retry-after'}, '1', 'Retry-After: 1');
    cont_replica($ls->{replicas}[0]);
    is(effects_of($env), 0, 'nothing ran');
    ok($t->wait_for(sub { !defined get_at($ls->{master}, $L) }, 5), 'the lock key is given back');
    ok($t->wait_for(sub { !defined get_at($rs->{master}, $t->record_name($key)) }, 5), 'the record is given back');
    ok($t->wait_for(sub { deploy('/s', $key, $env)->{status} == 201 }, 10), 'with the replica back, the retry runs');
    is(effects_of($env), 1, 'once');
}

# ---- 2a': the same with idempotency_unique: the unique key's replica
{
    my ($key, $env, $rs, $us);
    for my $i (1 .. 500) {
        ($env, $key) = ("us-$$-$i", $t->key("us$i"));
        ($rs, $us) = (shard_of($t->record_name($key)), shard_of($t->unique_shared_name('u', "ev:$env")));
        last if $rs->{master} != $us->{master};
    }
    my $U = $t->unique_shared_name('u', "ev:$env");
    stop_replica($us->{replicas}[0]);
    my $r = deploy('/u', $key, $env);
    is(answer_of($r), '503 store-not-replicated', 'the unique key\'s replica stopped: 503 store-not-replicated');
    cont_replica($us->{replicas}[0]);
    is(effects_of($env), 0, 'nothing ran');
    ok($t->wait_for(sub { !defined get_at($us->{master}, $U) }, 5), 'the unique key is given back');
    ok($t->wait_for(sub { deploy('/u', $t->key('us-other'), $env)->{status} == 201 }, 10),
       'with the replica back, another key with the same identity runs (nothing held it)');
    is(effects_of($env), 1, 'once');
}

# hold A at its lock key (its master paused for writes) until its record
# and its shut gate are on the record's replica; then stop that replica,
# cut it off its master (it reconnects once resumed, while its master
# lives), and let A go on
sub held_then_replica_stopped {
    my ($loc, $key, $env, $rs, $ls) = @_;
    my $gate = $t->record_name($key) . ':p';
    $t->redis_at($ls->{master}, 'CLIENT', 'PAUSE', 20000, 'WRITE');
    my $bg = deploy($loc, $key, $env, delay => 30, bg => 1);
    ok($t->wait_for(sub { defined get_replica($rs->{replicas}[0], $gate) }, 10),
       "$loc: A's record and shut gate have reached the record's replica");
    stop_replica($rs->{replicas}[0]);
    # and its link closed: what the master writes next is not even in its
    # socket (a stopped process still receives), only in the backlog
    $t->redis_at($rs->{master}, 'CLIENT', 'KILL', 'TYPE', 'replica');
    $t->redis_at($ls->{master}, 'CLIENT', 'UNPAUSE');
    ok($t->wait_for(sub { !defined get_at($rs->{master}, $gate) }, 10), "$loc: A's gate is opened on the master");
    return $bg;
}

# ---- 2b: the record's replica cannot acknowledge the gate's opening
{
    my ($key, $env, $rs, $ls) = pick('gs');
    my $bg = held_then_replica_stopped('/s', $key, $env, $rs, $ls);
    my $r = $bg->result(30) // {};
    is(answer_of($r), '503 store-not-replicated', 'the record\'s replica stopped at the opening: 503 store-not-replicated');
    cont_replica($rs->{replicas}[0]);
    is(effects_of($env), 0, 'nothing ran');
    ok($t->wait_for(sub { !defined get_at($ls->{master}, $t->lock_name("deploy:$env")) }, 5), 'the lock key is given back');
    ok($t->wait_for(sub { deploy('/s', $key, $env)->{status} == 201 }, 10), 'with the replica back, the retry runs');
    is(effects_of($env), 1, 'once');
}

# ---- 1: the record's master fails over once A is at the upstream
my ($ka, $env, $rs, $ls) = pick('a');
my $S = $rs->{replicas}[0];
my $bg = held_then_replica_stopped('/l', $ka, $env, $rs, $ls);
ok($t->wait_for(sub { effects_of($env) == 1 || waiting_on($rs->{master}) }, 10),
   'A is at the upstream, or waits for the replica (WAIT)');
if (!effects_of($env)) {
    # the request is held until the replica has the opening
    cont_replica($S);
    ok($t->wait_for(sub { effects_of($env) == 1 }, 10), 'the replica resumed: A is at the upstream');
}
my $victim = name_on($rs->{master});
ok($t->stop_instance($victim, signal => 'KILL') // 1, "kill -9 of $victim, the record's master");
ok($t->kill_worker, 'A\'s worker killed too, before any renewal');
cont_replica($S);
ok($t->wait_for(sub { $t->cluster_agree($t->key_slot($t->record_name($ka)), $S) }, 30),
   'the record\'s replica is promoted');
$t->wait_cluster_ok(30);

my $retry;
ok($t->wait_for(sub { $retry = deploy('/l', $ka, $env); answer_of($retry) !~ /^(409 in-progress|503 )/ }, 20),
   'A\'s lease lapses') or diag(answer_of($retry));
is(answer_of($retry), '409 outcome-unknown', 'A\'s retry: outcome unknown, not run again');
# the competitor's record on another shard: the promoted master has no
# replica left, so a claim there would be answered store-not-replicated
my ($kc) = grep { shard_of($t->record_name($_))->{master} != $rs->{master} } map { $t->key("c$_") } 1 .. 100;
my $comp = deploy('/l', $kc, $env);
is(answer_of($comp), '409 lock-held', 'a competitor for the lock: lock-held, not run beside A');
is(effects_of($env), 1, 'one effect: the opening was on the replica before the upstream saw A');

$t->check_logs(ignore => qr/worker process \d+ exited on signal 9/);
done_testing;
