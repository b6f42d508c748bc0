#!/usr/bin/perl
# idempotency_lock: at most one operation in flight per value, across
# scopes. Deployment dep-118 (commit a1b2c3) to production holds
# deploy:production; dep-119 (commit d4e5f6) to production is refused with
# 409 lock-held and Retry-After, and executes once the first completes;
# staging is not blocked. A dead worker's lock becomes the unknown
# operation's lock, held until an operator resolves the operation. The
# status endpoint shows the lock key an operation holds ("lock"), and
# nothing once it holds none.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use Time::HiRes qw(sleep time);
use Idem::Test;

my $t = Idem::Test->new;

# a port nothing listens on: Redis unreachable for /open
my $DEAD = $t->free_port;

$t->start_stack(<<"EOF", log_format => 'L|$idempotency_key|$idempotency_outcome');
idempotency_json_var \$environment /environment;
idempotency_json_var \$region /region;

server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    idempotency_scope \$http_authorization;
    location /deployments {
        idempotency on;
        idempotency_lease 2s;
        idempotency_lock deploy:\$environment;
        proxy_ignore_client_abort on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /region {
        idempotency on;
        idempotency_lock deploy:\$environment:\$region;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /both {
        idempotency on;
        idempotency_unique both:\$region;
        idempotency_lock deploy:\$environment;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /open {
        idempotency on;
        idempotency_redis 127.0.0.1:$DEAD timeout=300ms;
        idempotency_store_failure open;
        idempotency_lock deploy:\$environment;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /status {
        idempotency_status;
    }
    location = /admin {
        idempotency_admin on;
    }
}
EOF

my $AUTH = 'Bearer team-release';

sub deploy {
    my ($key, $id, $commit, $env, %o) = @_;
    return $t->http(POST => '/deployments', key => $key,
                    json => JSON::PP->new->canonical->encode({ id => $id, commit => $commit, environment => $env }),
                    headers => [ Authorization => $o{auth} // $AUTH, @{ $o{headers} // [] } ]);
}

sub deploy_bg {
    my ($key, $id, $commit, $env, $delay) = @_;
    return $t->http_bg(POST => '/deployments', key => $key, timeout => 20,
                       json => JSON::PP->new->canonical->encode({ id => $id, commit => $commit, environment => $env }),
                       headers => [ Authorization => $AUTH, 'X-Delay' => $delay ]);
}

sub op_of { (($t->record($_[0], $AUTH)) // {})->{op} // '' }

# the lock key of a value, computed here as docs/business-keys.md derives
# it: "idem-lock-v1" NUL, an empty length-prefixed scope, the value
sub lock_name { $t->lock_name($_[0]) }

# the key beside a record that names the lock its operation took
sub holds_name { (my $h = $t->record_name($_[0], $AUTH)) =~ s/:r$/:h/; $h }

sub status_of { $t->http(GET => '/status', key => $_[0], headers => [ Authorization => $AUTH ]) }

# the status document of a key, undef unless 200
sub status_json {
    my $r = status_of($_[0]);
    return undef unless $r->{status} == 200;
    my $j = eval { JSON::PP->new->decode($r->{content}) };
    return ref $j eq 'HASH' ? $j : undef;
}

# ---- dep-118 to production is slow; dep-119 to production must wait
my ($k118, $k119, $kst) = map { $t->key($_) } qw(dep-118 dep-119 dep-staging);
my $bg = deploy_bg($k118, 'dep-118', 'a1b2c3', 'production', 2.5);
ok($t->wait_for(sub { $t->effects(key => $k118) == 1 }, 5), 'dep-118 reached the upstream');

# the lock outlives its record, renewed with the lease: a lock key that
# lapsed first would free the lock of a live (or unknown) operation
{
    sleep 1;    # past a renewal (lease 2s: every 0.67s)
    my ($lk) = grep { /:l$/ } $t->redis_keys('*');
    my $rk = $t->record_name($k118, $AUTH);
    cmp_ok($t->redis('PTTL', $lk), '>', $t->redis('PTTL', $rk) + 3_600_000,
           'the lock key lives past its record (renewed with it, twice the TTL)');
}

my $r = deploy($k119, 'dep-119', 'd4e5f6', 'production');
$t->is_problem($r, 409, 'lock-held', key => $k119, retry_after => 1,
               name => 'dep-119 to production while dep-118 runs: 409 lock-held');
is(($t->problem($r) // {})->{operation_id}, op_of($k118), '... naming the holder (same scope)');
is($t->effects(key => $k119), 0, '... 0 effects');
ok(!$t->record($k119, $AUTH), '... and no record for its key: a retry is a new attempt');

my $other = deploy($t->key('dep-other-team'), 'dep-120', 'f00', 'production', auth => 'Bearer other-team');
$t->is_problem($other, 409, 'lock-held', name => 'another scope: lock-held too (the lock is across scopes)');
ok(!exists(($t->problem($other) // {})->{operation_id}), '... without the holder\'s id (another scope)');

my $st = deploy($kst, 'dep-121', 'd4e5f6', 'staging');
is($st->{status}, 201, 'staging is not blocked: 201') or diag($t->show($st));
is($t->effects(key => $kst), 1, 'staging: 1 effect');

# ---- the status endpoint shows the lock an operation holds, and only then
my $LPROD = lock_name('deploy:production');
{
    my $s = status_json($k118) // {};
    is($s->{state}, 'in_progress', 'status of dep-118 while it holds the lock: in_progress');
    is($s->{lock}, $LPROD, '... "lock" is the lock key of deploy:production, as docs/business-keys.md derives it');
    my $name = $t->record_name($k118, $AUTH) . op_of($k118);
    is(substr($t->redis('GET', $LPROD) // '', 0, length $name), $name,
       '... the key Redis holds under that name names dep-118\'s record and operation');
    is($t->redis('GET', holds_name($k118)), $name . $LPROD,
       'beside the record, idem:{...}:h names the record, the operation and the lock key');
    cmp_ok(abs($t->redis('PTTL', holds_name($k118)) - $t->redis('PTTL', $LPROD)), '<', 300,
           '... and has the lock key\'s TTL (taken and renewed with it)');
    $t->is_problem(status_of($k119), 404, 'not-found', name => 'dep-119, refused lock-held: no record at the status endpoint');
    my $done = status_json($kst) // {};
    is($done->{state}, 'completed', 'the staging deployment that ran: completed');
    ok(!exists $done->{lock}, '... its status has no "lock"');

    my $ks = $t->key('dep-staging-slow');
    my $b = deploy_bg($ks, 'dep-122', 'beef', 'staging', 1.5);
    ok($t->wait_for(sub { $t->effects(key => $ks) == 1 }, 5), 'a slow deployment to staging runs beside dep-118');
    my $ss = status_json($ks) // {};
    is($ss->{lock}, lock_name('deploy:staging'), '... its status shows the lock key of deploy:staging');
    isnt($ss->{lock} // $LPROD, $LPROD, '... not production\'s');
    is(($b->result(20) // {})->{status}, 201, '... it completes');
    $ss = status_json($ks) // {};
    ok($ss->{state} eq 'completed' && !exists $ss->{lock}, '... and then its status has no "lock"')
        or diag(explain $ss);
    is($t->effects(key => $ks), 1, '... 1 effect');
}

my $r118 = $bg->result(20);
is($r118 && $r118->{status}, 201, 'dep-118 completes');
{
    my $s = status_json($k118) // {};
    is($s->{state}, 'completed', 'its status: completed');
    ok(!exists $s->{lock}, '... without "lock" (it holds the lock no more)');
}
$r = deploy($k119, 'dep-119', 'd4e5f6', 'production');
is($r->{status}, 201, 'then the retry of dep-119 executes') or diag($t->show($r));
is($t->effects(key => $k119), 1, 'dep-119: 1 effect');
is($t->effects(key => $k118), 1, 'dep-118: 1 effect');

# ---- a retry of the holder itself is not refused by its own lock
{
    my $k = $t->key('dep-self');
    my $b = deploy_bg($k, 'dep-130', 'c0ffee', 'canary', 1.5);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'the holder runs');
    my $again = deploy($k, 'dep-130', 'c0ffee', 'canary');
    $t->is_problem($again, 409, 'in-progress', name => 'its own retry: in-progress, not lock-held');
    $b->result(20);
    is(deploy($k, 'dep-130', 'c0ffee', 'canary')->{headers}{'idempotent-replayed'}, 'true', 'then its replay');
    is($t->effects(key => $k), 1, '1 effect');
}

# ---- released (the upstream's 503): the lock is free at once
{
    my ($a, $b) = ($t->key('dep-503'), $t->key('dep-after-503'));
    is(deploy($a, 'dep-140', 'aa', 'eu', headers => [ 'X-Status' => 503 ])->{status}, 503, 'a deployment answered 503 (released)');
    is(deploy($b, 'dep-141', 'bb', 'eu')->{status}, 201, 'the next one to eu executes');
    is($t->effects(key => $a) + $t->effects(key => $b), 2, '2 effects');
}

# ---- a lock belongs to the operation that took it: a key released, then
# used for a deployment elsewhere, does not hold production's lock
{
    my ($k, $k2) = ($t->key('lock-moved'), $t->key('lock-moved-2'));
    is(deploy($k, 'dep-160', 'aa', 'us', headers => [ 'X-Status' => 503 ])->{status}, 503,
       'key K to us: 503 (released)');
    my $bg = $t->http_bg(POST => '/deployments', key => $k, timeout => 20,
                         json => JSON::PP->new->canonical->encode({ id => 'dep-161', commit => 'bb', environment => 'mars' }),
                         headers => [ Authorization => $AUTH, 'X-Delay' => 1 ]);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'key K again, now to mars: runs');
    my $x = deploy($k2, 'dep-162', 'cc', 'us');
    is($x->{status}, 201, 'another key to us: executes, K\'s new operation holds no lock on us')
        or diag($t->show($x));
    $bg->result(20);
    is($t->effects(key => $k2), 1, '... 1 effect');
}

# ---- 20 concurrent deployments to one environment, 20 keys: one runs
{
    my @keys = map { $t->key("race-$_") } 0 .. 19;
    my $res = $t->parallel(20, sub {
        my $x = deploy($keys[$_[0]], "dep-r$_[0]", 'cc', 'race', headers => [ 'X-Delay' => 0.5 ]);
        return "$x->{status} " . $t->ptype($x);
    });
    my %n;
    $n{ $_ // 'none' }++ for @$res;
    is($n{'201 '} // 0, 1, '20 concurrent to one environment: one 201') or diag(explain \%n);
    is($n{'409 lock-held'} // 0, 19, '... 19 lock-held');
    is(scalar(grep { my $k = $_; $t->effects(key => $k) } @keys), 1, '... 1 effect');
}

# ---- kill -9 of the worker that holds the lock: held (unknown) until an
# operator resolves the operation
{
    my ($a, $b) = ($t->key('dep-killed'), $t->key('dep-blocked'));
    my $bgk = deploy_bg($a, 'dep-150', 'dd', 'apac', 4);
    ok($t->wait_for(sub { $t->effects(key => $a) == 1 }, 5), 'the holder reached the upstream');
    my ($victim) = $t->workers_connected_to;
    ok($t->kill_worker($victim), 'its worker killed with SIGKILL');
    $bgk->result(20);
    my $x = deploy($b, 'dep-151', 'ee', 'apac');
    $t->is_problem($x, 409, 'lock-held', name => 'while the dead owner\'s lease runs: lock-held');
    my $LAPAC = lock_name('deploy:apac');
    is((status_json($a) // {})->{lock}, $LAPAC, 'the dead owner\'s operation: its status shows the lock of deploy:apac');
    ok($t->wait_for(sub { (($t->problem(deploy($b, 'dep-151', 'ee', 'apac')) // {})->{type} // '') =~ /lock-held/
                          && ($t->record($a, $AUTH) // {})->{state} eq 'unknown' }, 10),
       'after the lease: the operation is unknown, and the lock still held');
    my $su = status_json($a) // {};
    is(join(' ', $su->{state} // 'none', $su->{lock} // 'none'), "unknown $LAPAC",
       'its status: unknown, still showing the lock');
    $x = deploy($b, 'dep-151', 'ee', 'apac');
    $t->is_problem($x, 409, 'lock-held', retry_after => 60, name => 'held by an unknown operation: Retry-After 60');
    is($t->effects(key => $b), 0, 'the blocked deployment: 0 effects');
    sleep 0.2 while time < $bgk->{t_start} + 4.3;
    is(deploy($b, 'dep-151', 'ee', 'apac')->{status}, 409, 'after the orphaned upstream answer: still held');
    my $adm = $t->http(POST => '/admin?action=release', key => $a, headers => [ Authorization => $AUTH ]);
    is($adm->{status}, 200, 'the operator releases the unknown operation') or diag($t->show($adm));
    $t->is_problem(status_of($a), 404, 'not-found', name => 'released: no record, no lock shown');
    $x = deploy($b, 'dep-151', 'ee', 'apac');
    is($x->{status}, 201, 'then the blocked deployment executes') or diag($t->show($x));
    ok(!exists((status_json($b) // { lock => 'no status' })->{lock}), '... its status, completed, has no "lock"');
    is($t->effects(key => $b), 1, '... 1 effect');
    is($t->effects(key => $a), 1, 'the killed one: still 1 effect');
}

# ---- an operation whose answer was lost (unknown) keeps its lock, and its
# status shows it, until an operator resolves it as completed
{
    my ($a, $b) = ($t->key('dep-dropped'), $t->key('dep-after-drop'));
    my $LOCE = lock_name('deploy:oceania');
    my $x = deploy($a, 'dep-170', 'ab', 'oceania', headers => [ 'X-Drop' => 1 ]);
    is($x->{status}, 502, 'the upstream closes without an answer: 502');
    ok($t->wait_state($a, $AUTH, 'unknown'), '... the operation is unknown');
    my $s = status_json($a) // {};
    is(join(' ', $s->{state} // 'none', $s->{lock} // 'none'), "unknown $LOCE",
       'its status: unknown, with the lock of deploy:oceania');
    $t->is_problem(deploy($b, 'dep-171', 'cd', 'oceania'), 409, 'lock-held', retry_after => 60,
                   name => '... which another deployment to oceania meets');
    my $adm = $t->http(POST => '/admin?action=complete&status=201', key => $a, headers => [ Authorization => $AUTH ]);
    is($adm->{status}, 200, 'the operator completes it') or diag($t->show($adm));
    $s = status_json($a) // {};
    ok(($s->{state} // '') eq 'completed' && !exists $s->{lock}, '... then its status: completed, no "lock"')
        or diag(explain $s);
    my $name = $t->record_name($a, $AUTH) . op_of($a);
    is(substr($t->redis('GET', $LOCE) // '', 0, length $name), $name,
       '... though the lock key still names it (a name that holds nothing)');
    is(deploy($b, 'dep-171', 'cd', 'oceania')->{status}, 201, 'the other deployment executes');
    is($t->effects(key => $a) + $t->effects(key => $b), 2, '2 effects');
}

# ---- no environment in the body: refused 400 lock-value-missing (before
# issue 35 it took no lock and ran beside any holder: changed on purpose;
# "idempotency_lock ... optional" keeps that, t/74-guards.t row 6)
{
    my @k = map { $t->key("nolock-$_") } 0 .. 1;
    for my $i (0, 1) {
        my $x = $t->http(POST => '/deployments', key => $k[$i], json => '{"id":"x' . $i . '"}',
                         headers => [ Authorization => $AUTH ]);
        $t->is_problem($x, 400, 'lock-value-missing', name => "no environment ($i): 400 lock-value-missing");
        is($t->effects(key => $k[$i]), 0, '... 0 effects');
    }
}

# ---- a lock is none only when every variable of its value is empty: a
# deployment to production without a region still takes deploy:production:
{
    my ($a, $b) = ($t->key('region-a'), $t->key('region-b'));
    my $bg = $t->http_bg(POST => '/region', key => $a, json => '{"environment":"production"}',
                         headers => [ Authorization => $AUTH, 'X-Delay' => 1 ]);
    ok($t->wait_for(sub { $t->effects(key => $a) == 1 }, 5), 'production, no region: runs');
    my $x = $t->http(POST => '/region', key => $b, json => '{"environment":"production"}',
                     headers => [ Authorization => $AUTH ]);
    $t->is_problem($x, 409, 'lock-held', name => 'another one like it: lock-held (one variable empty is still a lock)');
    $bg->result(10);
    is($t->effects(key => $b), 0, '... 0 effects');
    # neither variable: no lock value, refused (before issue 35 both ran,
    # side by side: changed on purpose)
    for my $k (map { $t->key("region-none-$_") } 0 .. 1) {
        my $x = $t->http(POST => '/region', key => $k, json => '{"id":"x"}', headers => [ Authorization => $AUTH ]);
        $t->is_problem($x, 400, 'lock-value-missing', name => 'neither variable: 400 lock-value-missing');
        is($t->effects(key => $k), 0, '... 0 effects');
    }
}

# ---- idempotency_store_failure open never runs a request that has a lock
# value: nobody can take the lock while Redis is down
{
    my $k = $t->key('open-locked');
    my $x = $t->http(POST => '/open', key => $k, json => '{"environment":"production"}',
                     headers => [ Authorization => $AUTH ]);
    $t->is_problem($x, 503, 'store-unavailable', name => 'Redis down, fail-open, a lock value: 503, not passed through');
    is($t->effects(key => $k), 0, '... 0 effects');
    # it passed through unprotected before issue 35 (changed on purpose)
    $k = $t->key('open-nolock');
    $x = $t->http(POST => '/open', key => $k, json => '{"id":"no environment"}', headers => [ Authorization => $AUTH ]);
    $t->is_problem($x, 400, 'lock-value-missing', name => 'no lock value: 400 lock-value-missing, never passed through');
    is($t->effects(key => $k), 0, '... 0 effects');
}

# ---- with idempotency_unique too: a request refused, or a retry with
# another body, leaves no unique or lock key of its own (a first claim
# takes them one by one, and gives back what it took when the next one is
# present: redis-scripts/claimfresh.lua)
{
    my $both = sub {
        my ($key, $env, $region, %o) = @_;
        my @a = (POST => '/both', key => $key,
                 json => JSON::PP->new->canonical->encode({ environment => $env, region => $region }),
                 headers => [ Authorization => $AUTH, 'X-Delay' => $o{delay} // 0 ]);
        return $o{bg} ? $t->http_bg(@a, timeout => 10) : $t->http(@a);
    };
    my ($a, $b, $c) = map { $t->key("both-$_") } 0 .. 2;
    my $bg = $both->($a, 'qa', 'r1', delay => 1.5, bg => 1);
    ok($t->wait_for(sub { $t->effects(key => $a) == 1 }, 5), 'unique + lock: the first runs');
    my @held = grep { /:u$/ } $t->redis_keys('*');
    is(scalar @held, 1, '... it took its unique key');
    my $x = $both->($b, 'qa', 'r2');
    $t->is_problem($x, 409, 'lock-held', name => 'unique + lock: another identity, the same lock: lock-held');
    is($t->effects(key => $b), 0, '... 0 effects');
    is_deeply([ grep { /:u$/ } $t->redis_keys('*') ], \@held,
              '... and its own unique key was given back: only the holder\'s is there');
    is($bg->result(10)->{status}, 201, 'the first completes');
    my $y = $both->($a, 'qa-changed', 'r3');
    $t->is_problem($y, 409, 'fingerprint-mismatch', name => 'a retry of the first with another body: fingerprint-mismatch');
    is($t->effects(key => $a), 1, '... 1 effect');
    is($t->redis('EXISTS', lock_name('deploy:qa-changed')), 0, '... its lock key was given back');
    is_deeply([ grep { /:u$/ } $t->redis_keys('*') ], \@held, '... and its unique key');
    my $z = $both->($c, 'qa', 'r2');
    is($z->{status}, 201, 'then the refused identity runs with a key of its own') or diag($t->show($z));
}

# ---- $idempotency_outcome locked; lock keys hold no value in clear
{
    ok(grep({ /^L\|\Q$k119\E\|locked$/ } $t->access_log), '$idempotency_outcome locked');
    ok(!grep({ /production|staging/ } $t->redis_keys('*')), 'no lock value in any Redis key name');
}

$t->check_logs(ignore => qr/worker process \d+ exited on signal 9/);
done_testing;
