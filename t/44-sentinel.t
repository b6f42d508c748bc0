#!/usr/bin/perl
# idempotency_redis_sentinel (docs/redis.md, "Sentinel"): the workers ask
# three sentinels where the master is, follow +switch-master, and re-ask
# after any loss or a master that refuses writes.  The Redis servers run
# with min-replicas-to-write 1, as docs/redis.md asks, so an old master
# refuses writes once its replicas have left it.
#   - nginx -t refuses a bad directive, and both topologies in one scope;
#   - a write goes through discovery (the first seed is dead): it executes
#     once, its retry replays, its record is on the master;
#   - SENTINEL FAILOVER without traffic: the idle links move to the new
#     master (+switch-master, not a failed command);
#   - SENTINEL FAILOVER, then kill -9 of the master, then SENTINEL FAILOVER
#     of a master with two replicas and idempotency_redis_wait 2, each under
#     concurrent first writes and retries: every answer is a documented
#     one, no key executes twice, and new keys execute again within a
#     bounded time (printed: "recovery").

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $CLIENTS  = $ENV{IDEM_SENTINEL_CLIENTS} // 4;
my $RUN      = $ENV{IDEM_SENTINEL_RUN} // 16;     # seconds of traffic
my $ATTEMPTS = 6;                                  # sends per key at most
my $RECOVERY = 30;                                 # seconds, the bound

my $t = Idem::Test->new;
my $dead = Idem::Test::free_port();

# ------------------------------------------------------------ nginx -t

my $D = 'idempotency_redis_sentinel';
my @bad = (
    [ 'sentinel, then server in one block',
      "$D m 127.0.0.1:$dead; idempotency_redis 127.0.0.1:$dead;",
      qr/"idempotency_redis" and "idempotency_redis_sentinel" in one block/ ],
    [ 'server, then sentinel in one block',
      "idempotency_redis 127.0.0.1:$dead; $D m 127.0.0.1:$dead;",
      qr/"idempotency_redis_sentinel" and "idempotency_redis" in one block/ ],
    [ 'twice in one block', "$D m 127.0.0.1:$dead; $D n 127.0.0.1:$dead;",
      qr/"idempotency_redis_sentinel" directive is duplicate/ ],
    [ 'only a name', "$D m;", qr/invalid number of arguments in "idempotency_redis_sentinel"/ ],
    [ 'no seed, only options', "$D m timeout=1s password=x;",
      qr/"idempotency_redis_sentinel" directive needs at least one sentinel host:port/ ],
    [ 'seed without port', "$D m 127.0.0.1;",
      qr/invalid sentinel address "127.0.0.1" in "idempotency_redis_sentinel" directive: host:port expected/ ],
    [ 'seed port out of range', "$D m 127.0.0.1:70000;",
      qr/invalid sentinel address "127.0.0.1:70000" in "idempotency_redis_sentinel"/ ],
    [ 'seed port not a number', "$D m 127.0.0.1:abc;",
      qr/invalid sentinel address "127.0.0.1:abc" in "idempotency_redis_sentinel"/ ],
    [ 'unix socket seed', "$D m unix:/tmp/sentinel.sock;",
      qr/invalid sentinel address "unix:\/tmp\/sentinel.sock" in "idempotency_redis_sentinel"/ ],
    [ 'unresolvable seed', "$D m no-such-host.invalid:26379;",
      qr/invalid sentinel address "no-such-host.invalid:26379"/ ],
    [ 'empty master name', qq{$D "" 127.0.0.1:$dead;},
      qr/invalid master name "" in "idempotency_redis_sentinel" directive/ ],
    [ 'a seed where the name belongs', "$D 127.0.0.1:$dead 127.0.0.1:$dead;",
      qr/invalid master name "127.0.0.1:$dead" in "idempotency_redis_sentinel"/ ],
    [ 'master name with a space', qq{$D "my master" 127.0.0.1:$dead;},
      qr/invalid master name "my master" in "idempotency_redis_sentinel"/ ],
    [ 'unknown option', "$D m 127.0.0.1:$dead foo=bar;",
      qr/invalid parameter "foo=bar" in "idempotency_redis_sentinel"/ ],
    [ 'bad timeout', "$D m 127.0.0.1:$dead timeout=never;",
      qr/invalid parameter "timeout=never" in "idempotency_redis_sentinel"/ ],
);

for my $c (@bad) {
    my ($name, $lines, $re) = @$c;
    my ($rc, $out) = $t->nginx_test_conf("server { listen 127.0.0.1:%%PORT%%; $lines location / { idempotency on; } }");
    isnt($rc, 0, "nginx -t fails: $name");
    like($out, $re, "nginx -t names the directive and the fault: $name");
}

{
    my ($rc, $out) = $t->nginx_test_conf(<<"EOF");
$D m 127.0.0.1:$dead [::1]:$dead localhost:$dead user=idem password=p sentinel_password=s db=1 connect_timeout=200ms timeout=300ms;
server {
    listen 127.0.0.1:%%PORT%%;
    location / { idempotency on; }
    location /single/ { idempotency_redis 127.0.0.1:$dead; idempotency on; }
}
EOF
    is($rc, 0, 'nginx -t accepts every option, sentinels down, and a server in an inner scope')
        or diag($out);
}

# ------------------------------------------------------------ the stack

# min-replicas-to-write 1: an old master refuses writes (NOREPLICAS) as
# soon as its replicas leave it, instead of taking claims that the
# failover then loses
my @SAFE = ('--min-replicas-to-write', 1, '--min-replicas-max-lag', 10,
            '--repl-diskless-sync-delay', 0);

sub linked {
    my ($port) = @_;
    return ($t->redis_at($port, 'INFO', 'replication') // '') =~ /master_link_status:up/;
}

# a master and $n replicas named $name, its ports
sub start_set {
    my ($name, $n) = @_;
    my $m = $t->start_redis_instance(name => "$name-0", args => \@SAFE);
    my @r = map {
        $t->start_redis_instance(name => "$name-$_",
            args => [ @SAFE, '--replicaof', '127.0.0.1', $m ])
    } 1 .. $n;
    # and online at the master (WAIT counts only those; a replica says
    # "link up" a moment before the master puts it online)
    ok($t->wait_for(sub { !grep({ !linked($_) } @r)
                          && ($t->redis_at($m, 'WAIT', $n, 100) // '') eq $n }, 15),
       "$name: $n replicas in sync");
    return ($m, @r);
}

# SENTINEL FAILOVER: one replica, so that the old master refuses writes
# the moment it is promoted (with two, the old master keeps one replica
# until the sentinel moves it, and writes it takes then are lost: this
# test saw a key execute twice that way)
my @A = start_set('fo', 1);
# kill -9: two replicas, so that the promoted one keeps a replica and may
# write (min-replicas-to-write 1)
my @B = start_set('kill', 2);
# SENTINEL FAILOVER with two replicas, the case min-replicas-to-write 1
# leaves open, closed by idempotency_redis_wait 2: a claim is proxied only
# once both replicas have it, so the promoted one has it
my @W = start_set('fowait', 2);
my @S = map {
    $t->start_sentinel(name => "sentinel-$_", down_after => 1000, failover_timeout => 5000,
                       monitor => [ [ 'fo', $A[0], 2 ], [ 'kill', $B[0], 2 ], [ 'fowait', $W[0], 2 ] ])
} 1 .. 3;
my %REPLICAS = (fo => 1, kill => 2, fowait => 2);
sub sentinels_ready {
    for my $s (@S) {
        for my $name (sort keys %REPLICAS) {
            return 0 unless $t->sentinel_ready($s, $name, $REPLICAS{$name});
        }
    }
    return 1;
}
ok($t->wait_for(\&sentinels_ready, 30), 'the three sentinels know each other and every replica');

# the paths a real Sentinel hides: a fake one that names what this file
# says and never announces a switch; two plain servers, "ro-1" a replica
my @R = ($t->start_redis_instance(name => 'ro-0'));
push @R, $t->start_redis_instance(name => 'ro-1', args => [ '--replicaof', '127.0.0.1', $R[0] ]);
my $named = $t->prefix . '/fake-master';
my $spew = sub { open(my $fh, '>', "$named.tmp") or die; print $fh "127.0.0.1 $_[0]\n"; close $fh; rename "$named.tmp", $named };
$spew->($R[1]);    # a stale answer: the replica
my $fake = $t->start_fake_sentinel($named);

$t->start_upstream;
my $seeds = join ' ', "127.0.0.1:$dead", map { "127.0.0.1:$_" } @S;
$t->start_nginx(<<"EOF", workers => 2);
server {
    listen 127.0.0.1:%%PORT%%;
    location /fo/ {
        $D fo $seeds connect_timeout=300ms timeout=500ms;
        idempotency on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /ro/ {
        $D ro 127.0.0.1:$fake connect_timeout=300ms timeout=500ms;
        idempotency on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /kill/ {
        $D kill $seeds connect_timeout=300ms timeout=500ms;
        idempotency on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /fowait/ {
        $D fowait $seeds connect_timeout=300ms timeout=500ms;
        idempotency_redis_wait 2 200ms;
        idempotency on;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

sub master_of {
    my ($name) = @_;
    for my $s (@S) {
        my $a = $t->redis_at($s, 'SENTINEL', 'get-master-addr-by-name', $name);
        return $a->[1] if ref $a eq 'ARRAY';
    }
    return undef;
}

# the answers docs/redis.md ("Sentinel") lists for a failover; with
# idempotency_redis_wait, a claim the replicas did not get is released
my %DOCUMENTED = map { $_ => 1 } (
    '201', '201 replayed', '409 in-progress', '409 outcome-unknown no-retry-after',
    '503 store-unavailable', '503 store-not-replicated');

subtest 'a write through discovery, the first seed dead' => sub {
    my $k = $t->key('discover');
    my ($r) = $t->retry_until_final('/fo/x', 10, key => $k, json => { a => 1 });
    is($t->answer($r), '201', 'the first write executes');
    my $again = $t->http(POST => '/fo/x', key => $k, json => { a => 1 });
    is($t->answer($again), '201 replayed', 'its retry replays');
    is($t->effects(key => $k), 1, 'one effect');
    ok(defined $t->redis_at($A[0], 'GET', $t->record_name($k)), 'the record is on the master');
    is($t->redis_at($A[1], 'ROLE')->[0], 'slave', 'the replica is still a replica');
};

subtest 'idle links follow +switch-master' => sub {
    my $new = do {
        is($t->redis_at($S[1], 'SENTINEL', 'FAILOVER', 'fo'), 'OK', 'SENTINEL FAILOVER fo');
        $t->wait_for(sub { my $m = master_of('fo'); $m && $m != $A[0] ? $m : 0 }, 20);
    };
    ok($new, "the sentinels name a new master ($new)") or return;
    my $t0 = time;
    ok($t->wait_for(sub { $t->workers_connected_to($new) >= 2 }, 10),
        'both workers connect to the new master without being sent a request');
    diag(sprintf 'idle workers on the new master %.2f s after the sentinels named it', time - $t0);
    ok($t->wait_for(sub { !$t->workers_connected_to($A[0]) }, 5), 'and leave the old one');
    @A = ($new, grep { $_ != $new } @A);
    ok($t->wait_for(sub { linked($A[1]) }, 40),
        'the old master has become a replica of the new one');
};

subtest 'a stale answer naming a replica, then a demotion nobody announced' => sub {
    ok($t->wait_for(sub { $t->error_log =~ /redis sentinel:ro at 127\.0\.0\.1:$R[1] is not a master/ }, 10),
        'ROLE: the named replica is found not to be a master');
    my $k = $t->key('ro');
    my $r = $t->http(POST => '/ro/x', key => $k, json => { a => 1 });
    is($t->answer($r), '503 store-unavailable', 'no master yet: 503 with Retry-After');
    is($t->effects(key => $k), 0, 'not executed');
    $spew->($R[0]);
    ($r) = $t->retry_until_final('/ro/x', 10, key => $k, json => { a => 1 });
    is($t->answer($r), '201', 'once the master is named, the retry executes');
    ok(defined $t->redis_at($R[0], 'GET', $t->record_name($k)), 'on the master');

    # ro-1 becomes the master and ro-0 its replica; nobody tells the workers
    is($t->redis_at($R[1], 'REPLICAOF', 'NO', 'ONE'), 'OK', 'ro-1 promoted by hand');
    is($t->redis_at($R[0], 'REPLICAOF', '127.0.0.1', $R[1]), 'OK', 'ro-0 demoted by hand');
    $spew->($R[1]);
    ok($t->wait_for(sub { linked($R[0]) }, 10), 'ro-0 replicates ro-1');
    my $t0 = time;
    my (@seen, $done);
    for my $i (1 .. 100) {
        last if time > $t0 + 20;
        my $k2 = $t->key('ro-after');
        my ($f, @a) = $t->retry_until_final('/ro/x', 3, key => $k2, json => { i => $i });
        push @seen, @a;
        is($t->effects(key => $k2), $t->answer($f) eq '201' ? 1 : 0, "key $i: executed at most once") or last;
        if ($t->answer($f) eq '201') { $done = time; last }
    }
    # the READONLY answer itself sends the worker to the sentinels: well
    # under the 2 s a command timeout and the reconnect backoff would take
    ok($done && $done - $t0 < 2, 'new keys execute on the new master within 2 s of READONLY')
        or diag("@seen");
    diag(sprintf 'ro: READONLY to the first execution on the new master: %.2f s (%s)',
        ($done // time) - $t0, join(', ', @seen));
    like($t->error_log, qr/redis sentinel:ro at 127\.0\.0\.1:$R[0] refuses writes \(READONLY/,
        'the READONLY answer sent the worker to the sentinels');
    # nginx runs two workers and the loop above taught one: the other may
    # still hold its link to ro-0, where its first command meets READONLY
    # and is answered 503 with Retry-After, which a client retries
    my ($again, @a) = $t->retry_until_final('/ro/x', 10, key => $k, json => { a => 1 });
    is($t->answer($again), '201 replayed', 'the key of before the demotion replays from the new master')
        or diag("@a");
    is(scalar(grep { $_ ne '503 store-unavailable' } @a[0 .. $#a - 1]), 0,
       '... after nothing but 503 store-unavailable, if anything') or diag("@a");
    is($t->effects(key => $k), 1, 'and executed once');
};

# $CLIENTS clients send new keys and their retries for $RUN s; the fault
# comes 3 s in (Idem::Test::storm)
sub storm {
    my ($name, $old, $at, $fault) = @_;
    my $r = $t->storm(name => $name, path => "/$name/storm", clients => $CLIENTS, run => $RUN,
                      attempts => $ATTEMPTS, at => $at, bound => $RECOVERY, fault => $fault,
                      documented => \%DOCUMENTED,
                      moved => sub { my $m = master_of($name); $m && $m != $old ? $m : 0 });
    diag("$name: new master $r->{moved}") if $r->{moved};
}

storm('fo', $A[0], 3, sub {
    my $r = $t->redis_at($S[0], 'SENTINEL', 'FAILOVER', 'fo');
    diag("SENTINEL FAILOVER fo: $r") unless $r eq 'OK';
});

storm('kill', $B[0], 3, sub { $t->stop_instance('kill-0', signal => 'KILL') });

storm('fowait', $W[0], 3, sub {
    my $r = $t->redis_at($S[0], 'SENTINEL', 'FAILOVER', 'fowait');
    diag("SENTINEL FAILOVER fowait: $r") unless $r eq 'OK';
});

$t->check_logs;
done_testing;
