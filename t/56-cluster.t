#!/usr/bin/perl
# idempotency_redis_cluster (docs/redis.md, "Cluster"): a cluster of 3
# masters and 3 replicas started by the harness, two nginx workers that
# route each key's commands to the master of its slot.
#   - nginx -t refuses two topologies in one scope, a bad node list, no
#     node, db=; it accepts idempotency_unique/idempotency_lock with a
#     cluster and idempotency_redis_wait (t/81-cluster-unique.t runs them
#     on a cluster, t/90-cluster-bkeys-wait.t with the WAIT);
#   - claims, replays and conflicts on each master, the record on the
#     master that owns its slot; 1,000 keys spread over the three masters
#     execute once and replay; idempotency_redis_wait through the cluster;
#   - the status and admin endpoints and idempotency_wait, for a key on
#     each master (the subscriber is on one node: PUBLISH reaches all);
#     idempotency_approve (the operation id's key is in another slot than
#     the record's);
#   - a slot moved by hand (MIGRATING/IMPORTING, MIGRATE, SETSLOT NODE):
#     ASK and MOVED followed, every key replays, executed once;
#   - redis-cli --cluster reshard during load: every answer documented, no
#     key executed twice;
#   - kill -9 of a master under load, its replica promoted by the cluster:
#     every answer documented, no key executed twice, keys of the lost
#     master's slots execute again within a bounded time (printed:
#     "recovery"); then status, admin and waits again, a reload, and the
#     ACL LOG of every node empty (the module ran as a least-privilege user).

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $t = Idem::Test->new;
my $dead = Idem::Test::free_port();
my $D = 'idempotency_redis_cluster';

# ------------------------------------------------------------ nginx -t

my @bad = (
    [ 'cluster, then server in one block', "$D 127.0.0.1:$dead; idempotency_redis 127.0.0.1:$dead;",
      qr/"idempotency_redis" and "idempotency_redis_cluster" in one block: one Redis topology per scope/ ],
    [ 'server, then cluster in one block', "idempotency_redis 127.0.0.1:$dead; $D 127.0.0.1:$dead;",
      qr/"idempotency_redis_cluster" and "idempotency_redis" in one block/ ],
    [ 'sentinel, then cluster in one block', "idempotency_redis_sentinel m 127.0.0.1:$dead; $D 127.0.0.1:$dead;",
      qr/"idempotency_redis_cluster" and "idempotency_redis_sentinel" in one block/ ],
    [ 'cluster, then sentinel in one block', "$D 127.0.0.1:$dead; idempotency_redis_sentinel m 127.0.0.1:$dead;",
      qr/"idempotency_redis_sentinel" and "idempotency_redis_cluster" in one block/ ],
    [ 'twice in one block', "$D 127.0.0.1:$dead; $D 127.0.0.1:1;",
      qr/"idempotency_redis_cluster" directive is duplicate/ ],
    [ 'no argument', "$D;", qr/invalid number of arguments in "idempotency_redis_cluster"/ ],
    [ 'no node, only options', "$D timeout=1s password=x;",
      qr/"idempotency_redis_cluster" directive needs at least one cluster node host:port/ ],
    [ 'node without port', "$D 127.0.0.1;",
      qr/invalid cluster node address "127.0.0.1" in "idempotency_redis_cluster" directive: host:port expected/ ],
    [ 'a bad node among good ones', "$D 127.0.0.1:$dead 127.0.0.1 127.0.0.1:1;",
      qr/invalid cluster node address "127.0.0.1" in "idempotency_redis_cluster"/ ],
    [ 'port out of range', "$D 127.0.0.1:70000;",
      qr/invalid cluster node address "127.0.0.1:70000" in "idempotency_redis_cluster"/ ],
    [ 'port not a number', "$D 127.0.0.1:abc;",
      qr/invalid cluster node address "127.0.0.1:abc" in "idempotency_redis_cluster"/ ],
    [ 'unix socket', "$D unix:/tmp/cluster.sock;",
      qr/invalid cluster node address "unix:\/tmp\/cluster.sock" in "idempotency_redis_cluster"/ ],
    [ 'unresolvable node', "$D no-such-host.invalid:7000;",
      qr/invalid cluster node address "no-such-host.invalid:7000"/ ],
    [ 'db=', "$D 127.0.0.1:$dead db=1;",
      qr/invalid parameter "db=1" in "idempotency_redis_cluster" directive: a Redis Cluster has database 0 only/ ],
    [ 'unknown option', "$D 127.0.0.1:$dead foo=bar;",
      qr/invalid parameter "foo=bar" in "idempotency_redis_cluster"/ ],
    [ 'sentinel_password=', "$D 127.0.0.1:$dead sentinel_password=x;",
      qr/invalid parameter "sentinel_password=x" in "idempotency_redis_cluster"/ ],
    [ 'bad timeout', "$D 127.0.0.1:$dead timeout=never;",
      qr/invalid parameter "timeout=never" in "idempotency_redis_cluster"/ ],
);

for my $c (@bad) {
    my ($name, $lines, $re) = @$c;
    my ($rc, $out) = $t->nginx_test_conf("server { listen 127.0.0.1:%%PORT%%; $lines location / { idempotency on; } }");
    isnt($rc, 0, "nginx -t fails: $name");
    like($out, qr/\[emerg\].*$re/, "nginx -t names the directive and the fault: $name") or diag($out);
}

# unique and lock on a cluster wait for replicas too (docs/business-keys.md)
for my $c ([ 'idempotency_unique with a cluster and a WAIT', "$D 127.0.0.1:$dead; idempotency_redis_wait 1 100ms; idempotency_unique t:\$http_x_event;" ],
           [ 'idempotency_lock with a cluster and a WAIT', "$D 127.0.0.1:$dead; idempotency_redis_wait 1 100ms; idempotency_lock deploy:\$http_x_env;" ]) {
    my ($name, $lines) = @$c;
    my ($rc, $out) = $t->nginx_test_conf("server { listen 127.0.0.1:%%PORT%%; $lines location / { idempotency on; } }");
    is($rc, 0, "nginx -t accepts: $name") or diag($out);
}

{
    my ($rc, $out) = $t->nginx_test_conf(<<"EOF");
$D 127.0.0.1:$dead [::1]:$dead localhost:$dead user=idem password=p connect_timeout=200ms timeout=300ms;
idempotency_lock deploy:\$http_x_env;
server {
    listen 127.0.0.1:%%PORT%%;
    location / { idempotency on; idempotency_lock off; }
    location /status { idempotency_status; }
    location /single/ { idempotency_redis 127.0.0.1:$dead; idempotency on; }
}
EOF
    is($rc, 0, 'nginx -t accepts every option, nodes down, a lock turned off under a cluster, '
        . 'and a lock with a server in an inner scope') or diag($out);
}

# ------------------------------------------------------------ the stack

my $p = $t->prefix;
system("openssl rand -hex 32 > $p/hs.key") == 0 or BAIL_OUT('openssl rand');

my @ports = $t->start_cluster(masters => 3, replicas => 1);
my $seeds = join ' ', "127.0.0.1:$dead", map { "127.0.0.1:$_" } @ports[0, 4];

# the least the module needs, docs/redis.md "ACL user" with its Cluster,
# WAIT and confirmation (the pending operations' list) additions, on every
# node (ACL rules are not replicated)
my @ACL = qw(on >idem-secret ~idem:* &idem:done +evalsha +eval +script|load +subscribe +set
             +get +pttl +pexpire +del +type +time +publish +hmget +hset +hdel
             +cluster|slots +asking +wait
             +zadd +zremrangebyscore +zremrangebyrank +zrevrangebyscore);
is(scalar(grep { $t->redis_at($_, 'ACL', 'SETUSER', 'idem', 'reset', @ACL) eq 'OK' } @ports), 6,
   'the ACL user on the six nodes');
$t->start_upstream;
$t->start_nginx(<<"EOF", workers => 2);
server {
    listen 127.0.0.1:%%PORT%%;
    $D $seeds user=idem password=idem-secret connect_timeout=300ms timeout=500ms;
    proxy_ignore_client_abort on;
    location / {
        idempotency on;
        idempotency_wait 5s;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /replicated/ {
        idempotency on;
        idempotency_redis_wait 1 200ms;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /status {
        idempotency_status;
    }
    location = /admin {
        idempotency_admin on;
    }
    location /pay {
        idempotency on;
        idempotency_confirm on;
        idempotency_confirm_key hs256 $p/hs.key;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /approve {
        idempotency_approve;
    }
}
EOF

# slot => master port, from CLUSTER SLOTS now
my @owner;
sub learn_owners { @owner = @{ $t->cluster_owners } }
ok($t->wait_for(sub { my $sh = $t->cluster_shards; @$sh && !grep { !@{ $_->{replicas} } } @$sh }, 30),
   'every master has its replica');
learn_owners();
my @masters = do { my %m = map { $_ => 1 } grep { defined } @owner; sort keys %m };
is(scalar @masters, 3, 'three masters serve the slots');

sub slot_of { $t->key_slot($t->record_name($_[0])) }

# a fresh key whose record is in slot $s, or on master $port
sub key_in { $t->key_where(@_) }
sub key_on { my ($tag, $port) = @_; key_in($tag, sub { ($owner[$_[0]] // 0) == $port }) }

is(join(' ', map { $t->key_slot($_) } qw(idem:{abc}:r user1000 foo{}{bar})),
   join(' ', map { $t->redis_at($ports[0], 'CLUSTER', 'KEYSLOT', $_) } qw(idem:{abc}:r user1000 foo{}{bar})),
   'the test computes key slots as the cluster does');

subtest 'claim, replay and conflict on each master' => sub {
    for my $m (@masters) {
        my $k = key_on('basic', $m);
        my $r = $t->http(POST => '/basic', key => $k, json => { m => $m });
        is($t->answer($r), '201', "master $m: the first write executes");
        my $again = $t->http(POST => '/basic', key => $k, json => { m => $m });
        is($t->answer($again), '201 replayed', "master $m: its retry replays");
        is($again->{content}, $r->{content}, "master $m: the same body");
        my $other = $t->http(POST => '/basic', key => $k, json => { m => "not $m" });
        is($other->{status}, 409, "master $m: the key with another body: 409");
        is($t->ptype($other), 'fingerprint-mismatch', "master $m: ... fingerprint-mismatch");
        is($t->effects(key => $k), 1, "master $m: one effect");
        ok(defined $t->redis_at($m, 'GET', $t->record_name($k)), "master $m: the record is there");
    }
};

subtest '1,000 keys over the three masters' => sub {
    my $res = $t->parallel(4, sub {
        my $c = shift;
        my @out;
        for my $i (1 .. 250) {
            my $k = "many-$$-$c-$i";
            my $r = $t->http(POST => '/many', key => $k, json => { c => $c, i => $i });
            my $again = $t->http(POST => '/many', key => $k, json => { c => $c, i => $i });
            push @out, [ $k, $t->answer($r), $t->answer($again),
                         ($again->{content} // '') eq ($r->{content} // 'x') ? 1 : 0 ];
        }
        return \@out;
    }, timeout => 120);
    my @all = map { @{ $_ // [] } } @$res;
    is(scalar @all, 1000, '1,000 keys sent');
    my %per;
    $per{ $owner[ slot_of($_->[0]) ] }++ for @all;
    cmp_ok($per{$_} // 0, '>', 250, "master $_ holds " . ($per{$_} // 0) . ' of them') for @masters;
    is(scalar(grep { $_->[1] ne '201' } @all), 0, 'every first write executed')
        or diag(join ', ', map { "$_->[0]: $_->[1]" } grep { $_->[1] ne '201' } @all);
    is(scalar(grep { $_->[2] ne '201 replayed' || !$_->[3] } @all), 0,
       'every retry replayed the same body');
    my %effects;
    $effects{ $_->{key} }++ for $t->effect_list(uri => '/many');
    is(scalar(grep { ($effects{ $_->[0] } // 0) != 1 } @all), 0, 'one effect for each of the 1,000 keys');
};

subtest 'idempotency_redis_wait 1 through the cluster' => sub {
    for my $m (@masters) {
        my $k = key_on('wait1', $m);
        my $r = $t->http(POST => '/replicated/x', key => $k, json => { m => $m });
        is($t->answer($r), '201', "master $m: the claim and its completion reached a replica");
        is($t->effects(key => $k), 1, "master $m: one effect");
        my ($shard) = grep { $_->{master} == $m } @{ $t->cluster_shards };
        my $rec = $t->record_at($t->record_name($k), at => $shard->{replicas}[0], readonly => 1) // {};
        is($rec->{state}, 'completed', "master $m: the completed record is on its replica");
    }
};

# ------------------------------------------------- status, admin, wait

# for a key on each master: the completions are published on the record's
# master, and the cluster carries them to the subscriber's node
sub ops_round {
    my ($name) = @_;
    $t->ops_round("$name, master $_", $_, key => do { my $m = $_; sub { key_on(shift, $m) } }, waiters => 3)
        for @masters;
}

ops_round('ops');

# a recorded approval (idempotency_approve): the proposal's operation id
# names its record under a key of its own slot, so the approval reads one
# node and writes another
subtest 'idempotency_approve through the cluster' => sub {
    for my $m (@masters) {
        my $k = key_on('approve', $m);
        my $r = $t->http(POST => '/pay', key => $k, json => { amount => 42, m => $m });
        is($r->{status}, 428, "master $m: a proposal first") or diag($t->show($r));
        my $prop = ($t->problem($r) // {})->{proposal} // {};
        $r = $t->http(POST => '/approve', json => JSON::PP->new->canonical->encode(
            { operation_id => $prop->{operation_id}, fingerprint => $prop->{fingerprint},
              approved_by => 'alice', expires_in => 600 }));
        is($r->{status}, 200, "master $m: the approval is recorded") or diag($t->show($r));
        is(($t->decode_record($t->redis_at($m, 'GET', $t->record_name($k))) // {})->{state}, 'approved',
           "master $m: on the record's master");
        is($t->effects(key => $k), 0, "master $m: nothing executed yet");
        $r = $t->http(POST => '/pay', key => $k, json => { amount => 42, m => $m });
        is($r->{status}, 201, "master $m: the retry executes");
        $r = $t->http(POST => '/pay', key => $k, json => { amount => 42, m => $m });
        is($t->answer($r), '201 replayed', "master $m: and replays");
        is($t->effects(key => $k), 1, "master $m: once");
    }
};

# ------------------------------------------------- a slot moved by hand

sub node_id { $t->redis_at($_[0], 'CLUSTER', 'MYID') }
subtest 'ASK while a slot migrates, MOVED once it has moved' => sub {
    my $k0 = key_on('moved-0', $masters[0]);
    my $s = slot_of($k0);
    my ($a, $b) = ($owner[$s], (grep { $_ != $owner[$s] } @masters)[0]);
    is($t->answer($t->http(POST => '/m', key => $k0, json => { k => 0 })), '201', "a key in slot $s executes on $a");
    my $k1 = key_in('moved-1', sub { $_[0] == $s });
    my $asked = $t->command_calls('asking', $b);

    is($t->redis_at($b, 'CLUSTER', 'SETSLOT', $s, 'IMPORTING', node_id($a)), 'OK', "$b imports slot $s");
    is($t->redis_at($a, 'CLUSTER', 'SETSLOT', $s, 'MIGRATING', node_id($b)), 'OK', "$a migrates it");

    is($t->answer($t->http(POST => '/m', key => $k1, json => { k => 1 })), '201',
       'a new key of the migrating slot executes (ASK: on the importing node)');
    my (undef, $v) = $t->redis_at_multi($b, [ 'ASKING' ], [ 'GET', $t->record_name($k1) ]);
    ok(defined $v && !ref $v, "its record is on $b");
    is($t->answer($t->http(POST => '/m', key => $k1, json => { k => 1 })), '201 replayed', 'its retry replays (ASK)');
    is($t->answer($t->http(POST => '/m', key => $k0, json => { k => 0 })), '201 replayed',
       'the key still on the migrating node replays from there');
    # the status script has one key on a cluster: Redis refuses a script of
    # two keys of a migrating slot (TRYAGAIN) when one of them is missing
    my $st = $t->http(GET => '/status', key => $k0);
    is($st->{status}, 200, 'the status of the key still on the migrating node: 200') or diag($t->show($st));
    like($st->{content}, qr/"state":"completed"/, '... completed') or diag($st->{content});
    unlike($st->{content}, qr/"lock"/, '... and no lock');
    my $none = key_in('moved-none', sub { $_[0] == $s });
    is($t->http(GET => '/status', key => $none)->{status}, 404, 'a key of the migrating slot without a record: 404');

    is($t->redis_at($a, 'MIGRATE', '127.0.0.1', $b, '', 0, 5000, 'KEYS', $t->record_name($k0)), 'OK',
       "MIGRATE moves the older record to $b");
    for (1 .. 4) {
        is($t->answer($t->http(POST => '/m', key => $k0, json => { k => 0 })), '201 replayed',
           "the moved record replays (ASK), attempt $_");
    }
    cmp_ok($t->command_calls('asking', $b), '>', $asked, "the workers sent ASKING to $b");

    is($t->redis_at($_, 'CLUSTER', 'SETSLOT', $s, 'NODE', node_id($b)), 'OK', "SETSLOT $s NODE on $_")
        for ($b, $a, grep { $_ != $a && $_ != $b } @masters);
    ok($t->wait_for(sub { $t->cluster_agree($s, $b) }, 10), "every node says slot $s is $b\'s");
    for my $k ($k0, $k1) {
        for (1 .. 4) {
            is($t->answer($t->http(POST => '/m', key => $k, json => { k => $k eq $k0 ? 0 : 1 })), '201 replayed',
               "after the move the retry replays (MOVED followed), attempt $_");
        }
        is($t->effects(key => $k), 1, 'executed once');
    }
    ok($t->wait_for(sub { $t->error_log =~ /slot $s moved to 127\.0\.0\.1:$b/ }, 2),
       'a worker learned the move from MOVED');
    learn_owners();
};

# ------------------------------------------------- resharding under load

my $SLOTS = 1000;
my %RESHARD_OK = map { $_ => 1 } ('201', '201 replayed');
my $reshard_pid;
subtest 'redis-cli --cluster reshard under load' => sub {
    my ($from, $to) = @masters[1, 2];
    my $had = grep { ($_ // 0) == $to } @owner;
    my $cli = Idem::Test::_which('redis-cli') // '/usr/bin/redis-cli';
    my $log = $t->prefix . '/reshard.log';
    my $r = $t->storm(name => 'reshard', path => '/reshard', clients => 4, run => 14, at => 2, bound => 30,
        documented => \%RESHARD_OK,
        fault => sub {
            $reshard_pid = Idem::Test::_spawn(stdout => $log, argv => [ $cli, '--cluster', 'reshard',
                "127.0.0.1:$from", '--cluster-from', node_id($from), '--cluster-to', node_id($to),
                '--cluster-slots', $SLOTS, '--cluster-yes' ]);
        },
        # the storm's clients are reaped with waitpid(-1): this one may be too
        moved => sub { !kill(0, $reshard_pid) });
    ok($t->wait_for(sub { !kill(0, $reshard_pid) }, 60), 'redis-cli --cluster reshard has ended');
    diag(sprintf 'reshard: %d slots moved in %.1f s, under load', $SLOTS, $r->{moved_t} - $r->{fault_t})
        if $r->{moved_t};
    my $out = Idem::Test::_slurp($log);
    like($out, qr/Moving slot/, 'redis-cli moved slots');
    unlike($out, qr/\[ERR\]|\bERR\b/, 'without an error') or diag($out);
    learn_owners();
    is(scalar(grep { ($_ // 0) == $to } @owner), $had + $SLOTS, "$SLOTS slots moved to $to");
    my @keys = @{ $r->{keys} // [] };
    my %effects;
    $effects{ $_->{key} }++ for $t->effect_list(uri => '/reshard');
    my @not = grep {
        $effects{$_}
            && $t->ptype($t->http(POST => '/reshard', key => $_, json => { again => 1 })) ne 'fingerprint-mismatch'
    } @keys;
    is(scalar @not, 0, 'after the resharding every executed key is found in its record '
       . '(another body: fingerprint-mismatch)');
};

# ------------------------------------------------- a master killed

my %DOCUMENTED = map { $_ => 1 } (
    '201', '201 replayed', '409 in-progress', '409 outcome-unknown no-retry-after',
    '503 store-unavailable');

# the master the workers' subscriptions are on, if one is: its loss moves them
sub subscribed_master {
    for my $m (@masters) {
        return $m if ($t->redis_at($m, 'CLIENT', 'LIST') // '') =~ /\bsub=[1-9]/;
    }
    return undef;
}

subtest 'kill -9 of a master under load: its replica takes over' => sub {
    my $victim = subscribed_master() // $masters[0];
    diag("kill: the subscribers are on $victim") if ($victim == (subscribed_master() // 0));
    my ($shard) = grep { $_->{master} == $victim } @{ $t->cluster_shards };
    my ($name) = grep { $t->instance_port($_) == $victim } map { "c$_" } 1 .. @ports;
    my %lost = map { $_ => 1 } grep { ($owner[$_] // 0) == $victim } 0 .. 16383;
    my $r = $t->storm(name => 'kill', path => '/kill', clients => 4, run => 16, at => 3, bound => 30,
        documented => \%DOCUMENTED,
        fault => sub { $t->stop_instance($name, signal => 'KILL') },
        moved => sub {
            my $sh = $t->cluster_shards;
            my ($now) = grep { $_->{first} == $shard->{first} } @$sh;
            $now && $now->{master} != $victim ? $now->{master} : 0;
        },
        counts => sub { $lost{ slot_of($_[0]) } });
    diag("kill: the replica $r->{moved} took over the slots of $victim") if $r->{moved};
    learn_owners();
    @masters = do { my %m = map { $_ => 1 } grep { defined } @owner; sort keys %m };
    is(scalar @masters, 3, 'three masters again');
    ok(!grep({ $_ == $victim } @masters), 'the killed master is not one of them');
};

ops_round('after');

# a reload: the old workers close every node's connection, the new ones
# read the map again (check_logs: no "open socket left")
ok($t->reload_nginx, 'nginx -s reload');
{
    my $k = key_on('reload', $masters[0]);
    my ($r, @seen) = $t->retry_until_final('/reload', 10, key => $k, json => { r => 1 });
    is($t->answer($r), '201', 'after the reload a write executes') or diag("@seen");
    is($t->answer($t->http(POST => '/reload', key => $k, json => { r => 1 })), '201 replayed',
       'and its retry replays');
    is($t->effects(key => $k), 1, 'once');
}

my @refused = map {
    my $log = $t->redis_at($_, 'ACL', 'LOG');
    ref $log eq 'ARRAY' ? map { "$_" } @$log : ()
} grep { $t->redis_at($_, 'PING') eq 'PONG' } @ports;
is(scalar @refused, 0, 'no node refused the ACL user anything (ACL LOG)') or diag(explain \@refused);

$t->check_logs;
done_testing;
