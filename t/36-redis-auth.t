#!/usr/bin/perl
# idempotency_redis password= and user=: against a redis-server that requires
# a password (requirepass) and has an ACL user, the module authenticates its
# command and subscription links (idempotency_wait), so claims, replays and
# waiting work; a wrong password or user gets 503 store-unavailable with
# nothing executed, Redis's refusal is logged, and the password itself never
# reaches error.log.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes ();
use Idem::Test;

my $PW  = 'masterpw-' . int(rand 1e9);
my $UPW = 'alicepw-' . int(rand 1e9);
my $BAD = 'wrongpw-' . int(rand 1e9);

# docs/redis.md, "ACL user": keep the two in step
my $MIN_ACL = '~idem:* &idem:done +evalsha +eval +script|load +select +subscribe '
            . '+set +get +pttl +pexpire +del +type +time +publish +hmget +hset +hdel';

my $t = Idem::Test->new;
$t->start_redis(auth => [$PW], args => [
    '--requirepass', $PW,
    # the least an ACL user needs, as docs/redis.md gives it: every script
    # (claim, complete, renew, fail, status, admin) runs through it below
    '--user', 'alice', 'on', ">$UPW", split(' ', $MIN_ACL),
    '--user', 'bob', 'on', ">bobpw-$UPW", '~*', '&*', '-@all', '+ping',
]);
$t->start_upstream;

my $R = '%%REDIS%%';
$t->start_nginx(<<"EOF", workers => 2, error_log_level => 'info');
server {
    listen 127.0.0.1:%%PORT%%;
    location /pw/ {
        idempotency on;
        idempotency_redis $R password=$PW;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /acl/ {
        idempotency on;
        idempotency_redis $R user=alice password=$UPW db=3;
        idempotency_wait 5s;
        idempotency_lease 3s;
        proxy_ignore_client_abort on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /acl-lock/ {
        idempotency on;
        idempotency_redis $R user=alice password=$UPW db=3;
        idempotency_lease 3s;
        idempotency_unique t:\$http_x_event;
        idempotency_lock deploy:\$http_x_env;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /acl-status {
        idempotency_redis $R user=alice password=$UPW db=3;
        idempotency_status;
    }
    location = /acl-admin {
        idempotency_redis $R user=alice password=$UPW db=3;
        idempotency_admin on;
    }
    location /nopw/ {
        idempotency on;
        idempotency_redis $R;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /badpw/ {
        idempotency on;
        idempotency_redis $R password=$BAD;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /baduser/ {
        idempotency on;
        idempotency_redis $R user=mallory password=$UPW;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /noperm/ {
        idempotency on;
        idempotency_redis $R user=bob password=bobpw-$UPW;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF


for my $c ([ '/pw/x', 'password=' ], [ '/acl/x', 'user= password= db=' ]) {
    my ($path, $what) = @$c;
    my $k = $t->key('auth');
    my @req = (key => $k, json => { pay => $path });
    # a link authenticates when it connects, which may be just after the
    # first request: retry by the rule, as a client would
    my ($r) = $t->retry_until_final($path, 5, @req);
    is($r->{status}, 201, "$what: first write executes") or diag($t->show($r));
    is($t->effects(key => $k), 1, "$what: one effect");
    my $again = $t->http(POST => $path, @req);
    is($again->{status}, 201, "$what: retry");
    is($again->{headers}{'idempotent-replayed'}, 'true', "$what: retry replayed");
    is($again->{content}, $r->{content}, "$what: same body");
    is($t->effects(key => $k), 1, "$what: still one effect");
}

# the ACL user's records are in db 3, the default user's in db 0
{
    my @db0 = $t->redis_keys('idem:*');
    my (undef, $db3) = $t->redis_multi([ 'SELECT', 3 ], [ 'KEYS', 'idem:*' ]);
    my $n3 = ref $db3 eq 'ARRAY' ? scalar @$db3 : -1;
    is(scalar @db0, 1, 'password= location: its record in db 0');
    is($n3, 1, 'user= db=3 location: its record in db 3');
}

# idempotency_wait through an authenticated subscriber link
{
    my $N = 5;
    my $k = $t->key('authwait');
    my $res = $t->parallel($N, sub {
        my $r = $t->http(POST => '/acl/w', key => $k, json => { w => 1 },
            headers => [ 'X-Delay' => 1 ], timeout => 15);
        return { status => $r->{status}, replayed => $r->{headers}{'idempotent-replayed'},
                 type => $t->ptype($r) };
    }, timeout => 20);
    is($t->effects(key => $k), 1, "$N waiting duplicates as an ACL user: one effect");
    is(scalar(grep { $_ && $_->{status} == 201 } @$res), $N, 'every duplicate got the 201')
        or diag(explain $res);
    is(scalar(grep { $_ && ($_->{replayed} // '') eq 'true' } @$res), $N - 1,
        'the others waited and got the replay');
}

# the documented ACL is enough for the rest: renew (a request longer than a
# third of the lease), fail (an upstream that drops the connection), status
# and admin
{
    my $k = $t->key('aclops');
    my @req = (key => $k, json => { ops => 1 });
    my $bg = $t->http_bg(POST => '/acl/drop', @req, headers => [ 'X-Drop' => 1, 'X-Delay' => 4 ],
                         timeout => 15);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'ACL user: the request reached the upstream');
    # lease 3 s, renewed every second while the upstream works (4 s)
    my $db3 = sub {
        my (undef, $v, $pttl) = $t->redis_multi([ 'SELECT', 3 ], [ 'GET', $t->record_name($k) ],
                                                [ 'PTTL', $t->record_name($k) ]);
        my $rec = $t->decode_record($v) // return {};
        $rec->{pttl} = $pttl;
        return $rec;
    };
    # a live claim older than its lease: only a renewal (PEXPIRE) keeps it so
    ok($t->wait_for(sub { my $rec = $db3->();
                          ($rec->{state} // '') eq 'in_progress'
                          && int(Time::HiRes::time() * 1000) - $rec->{created} > 3200
                          && $t->lease_left($rec) > 0 }, 3.8),
        'ACL user: the renew script moved the lease past claim time + 3 s');
    my $r = $bg->result(15);
    is($r && $r->{status}, 502, 'ACL user: the upstream dropped the connection -> 502');
    ok($t->wait_for(sub { ($db3->()->{state} // '') eq 'unknown' }, 5),
        'ACL user: the fail script marked the record unknown');
    my $u = $t->http(POST => '/acl/drop', @req);
    $t->is_problem($u, 409, 'outcome-unknown', key => $k,
        name => 'ACL user: a retry is told outcome-unknown');
    my $st = $t->http(GET => '/acl-status', key => $k);
    is($st->{status}, 200, 'ACL user: the status endpoint reads the record');
    like($st->{content}, qr/"state":"unknown"/, 'ACL user: status says unknown');
    my $a = $t->http(POST => '/acl-admin?action=release', key => $k);
    is($a->{status}, 200, 'ACL user: the admin endpoint releases it') or diag($t->show($a));
    my $again = $t->http(POST => '/acl/drop', @req);
    is($again->{status}, 201, 'ACL user: after the release, a retry executes');
    is($t->effects(key => $k), 2, 'ACL user: two effects, the second allowed by the operator');
    # Redis logs every refusal by ACL with the user's name (bob's are expected)
    my $log = $t->redis('ACL', 'LOG');
    my @refused = ref $log eq 'ARRAY'
        ? grep { my %e = @$_; ($e{username} // '') eq 'alice' } @$log : ('no ACL LOG');
    is(scalar @refused, 0, 'ACL user: Redis refused alice nothing (ACL LOG)') or diag(explain \@refused);
}

# the documented ACL is enough for idempotency_unique and idempotency_lock:
# claim.lua takes the unique, lock and h keys, renew.lua extends them, the
# status script reads the lock
{
    my ($k1, $k2, $k3) = map { $t->key("acl-lock-$_") } 1 .. 3;
    my @h = ('X-Env' => 'production');
    my $bg = $t->http_bg(POST => '/acl-lock/deploy', key => $k1, json => { build => 1 },
                         headers => [ @h, 'X-Event' => 'ev-1', 'X-Delay' => 4 ], timeout => 15);
    ok($t->wait_for(sub { $t->effects(key => $k1) == 1 }, 5), 'ACL user, lock: the first deployment runs');
    my $held = $t->http(POST => '/acl-lock/deploy', key => $k2, json => { build => 2 },
                        headers => [ @h, 'X-Event' => 'ev-2' ]);
    $t->is_problem($held, 409, 'lock-held', key => $k2, name => 'ACL user, lock: a second deployment is held');
    # past the lease (3 s): only renewals keep the claim, the lock and the h key
    Time::HiRes::sleep(3.3);
    my $st = $t->http(GET => '/acl-status', key => $k1);
    is($st->{status}, 200, 'ACL user, lock: the status of the holder');
    like($st->{content}, qr/"state":"in_progress".*"lock":"idem:\{[0-9a-f]{32}\}:l"/s,
         'ACL user, lock: in progress, its lock shown, after a renewal') or diag($st->{content});
    my $r = $bg->result(15);
    is($r && $r->{status}, 201, 'ACL user, lock: the first deployment completes');
    my $reuse = $t->http(POST => '/acl-lock/deploy', key => $k3, json => { build => 3 },
                         headers => [ @h, 'X-Event' => 'ev-1' ]);
    is($reuse->{status}, 201, 'ACL user, unique: another key of the same event gets the first answer');
    is($reuse->{headers}{'idempotent-reused'}, 'true', '... marked Idempotent-Reused');
    my $again = $t->http(POST => '/acl-lock/deploy', key => $k2, json => { build => 2 },
                         headers => [ @h, 'X-Event' => 'ev-2' ]);
    is($again->{status}, 201, 'ACL user, lock: once the first has completed, the second executes');
    is($t->effects(uri => '/acl-lock/deploy'), 2, 'ACL user, lock: two effects in all');
    my $log = $t->redis('ACL', 'LOG');
    my @refused = ref $log eq 'ARRAY'
        ? grep { my %e = @$_; ($e{username} // '') eq 'alice' } @$log : ('no ACL LOG');
    is(scalar @refused, 0, 'ACL user, unique and lock: Redis refused alice nothing (ACL LOG)')
        or diag(explain \@refused);
}

# refused credentials: 503, nothing executed, and it stays so
for my $c (
    [ '/nopw/x',    'no password',          qr/NOAUTH|Authentication required/ ],
    [ '/badpw/x',   'wrong password',       qr/WRONGPASS|invalid password|invalid username-password/ ],
    [ '/baduser/x', 'unknown user',         qr/WRONGPASS|invalid username-password/ ],
    [ '/noperm/x',  'user without EVALSHA', qr/NOPERM|no permissions/ ],
) {
    my ($path, $what, $logged) = @$c;
    my $k = $t->key('badauth');
    for my $try (1 .. 3) {
        my $r = $t->http(POST => $path, key => $k, json => { bad => $what });
        $t->is_problem($r, 503, 'store-unavailable', key => $k, retry_after => 1,
            name => "$what, attempt $try -> 503 store-unavailable");
        sleep 0.3;
    }
    is($t->effects(key => $k), 0, "$what: nothing executed");
    like($t->error_log, $logged, "$what: Redis's refusal is in error.log");
}

# the passwords are not logged (AUTH's arguments never are)
{
    my $log = $t->error_log;
    my @found = grep { index($log, $_) >= 0 } ($PW, $UPW, $BAD);
    is(scalar @found, 0, 'no password in error.log (info level)') or diag("@found");
}

$t->check_logs;
done_testing;
