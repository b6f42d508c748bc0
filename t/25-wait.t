#!/usr/bin/perl
# idempotency_wait: a duplicate that arrives while the first attempt runs
# waits (Redis pub/sub, no polling) for it to finish and gets its replay; it
# executes itself if the first attempt was released; it gets the in-flight 409
# when the wait runs out, and the unknown answer when the first attempt's
# outcome was lost.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $t = Idem::Test->new;
$t->start_stack(<<'EOF', workers => 2);
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    proxy_ignore_client_abort on;
    location / {
        idempotency on;
        idempotency_wait 5s;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /short/ {
        idempotency on;
        idempotency_wait 1s;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /lease/ {
        idempotency on;
        idempotency_wait 5s;
        idempotency_lease 2s;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /status {
        idempotency_status;
    }
}
EOF

sub produced { my @r = $t->upstream_responses(key => $_[0]); $r[-1] }

sub commandstats {
    my $info = $t->redis('INFO', 'commandstats');
    my %c;
    $c{$1} = $2 while !ref($info) && $info =~ /^cmdstat_(\w+):calls=(\d+)/mg;
    return \%c;
}
sub evals { my $c = shift; ($c->{evalsha} // 0) + ($c->{eval} // 0) }

# ---- 20 concurrent duplicates, idempotency_wait 5s: all get the same answer
{
    my $N = 20;
    my $k = $t->key('wait');
    my $before = commandstats();
    my $res = $t->parallel($N, sub {
        my $r = $t->http(POST => '/transfers', key => $k, json => { amount => 20, to => 'x' },
            headers => [ 'X-Delay' => 1.5 ], timeout => 20);
        return { status => $r->{status}, replayed => $r->{headers}{'idempotent-replayed'},
                 type => $t->ptype($r), content => $r->{content},
                 seq => $r->{headers}{'x-upstream-seq'} };
    }, timeout => 30);
    my $after = commandstats();
    is(scalar(grep { defined } @$res), $N, "all $N clients answered");
    is($t->effects(key => $k), 1, "$N concurrent duplicates with idempotency_wait: exactly one effect");
    my %status = map { ($_ ? $_->{status} : 'none') => 1 } @$res;
    is_deeply([ sort keys %status ], [ 201 ], 'every client got the upstream status 201')
        or diag(explain [ map { { %{ $_ // {} }, content => undef } } @$res ]);
    my $body = (produced($k) // {})->{sha} // 'none';
    is(scalar(grep { $_ && $t->sha256($_->{content}) eq $body } @$res), $N,
        'every client got the body the upstream produced (identical bodies)');
    is(scalar(grep { $_ && !defined $_->{replayed} } @$res), 1, 'one answer is the execution');
    is(scalar(grep { $_ && ($_->{replayed} // '') eq 'true' } @$res), $N - 1,
        'the other answers are replays');
    is(scalar(grep { $_ && $_->{type} eq 'in-progress' } @$res), 0, 'nobody was told in-progress');
    # without polling: a handful of script calls per request, not one per tick
    my $calls = evals($after) - evals($before);
    note("EVAL/EVALSHA calls during the wait: $calls; commands: "
        . join(', ', map { "$_=" . (($after->{$_} // 0) - ($before->{$_} // 0)) } sort keys %$after));
    cmp_ok($calls, '<=', 3 * $N + 5, 'waiters do not poll Redis (at most ~3 script calls per request)');
}

# ---- the wait runs out: 409 in-progress with Retry-After
{
    my $k = $t->key('waitout');
    my @req = (key => $k, json => { long => 1 });
    my $bg = $t->http_bg(POST => '/short/x', @req, headers => [ 'X-Delay' => 3 ], timeout => 10);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'long request reached the upstream');
    my $r = $t->http(POST => '/short/x', @req, timeout => 10);
    $t->is_problem($r, 409, 'in-progress', key => $k, state => 'in_progress', retry_after => 1,
        name => 'idempotency_wait 1s, first attempt takes 3 s -> 409 in-progress');
    my $first = $bg->result(10);
    is($first && $first->{status}, 201, 'the first attempt completes');
    my $again = $t->http(POST => '/short/x', @req);
    is($again->{headers}{'idempotent-replayed'}, 'true', 'then a retry replays');
    is($t->effects(key => $k), 1, 'wait ran out: one effect');
}

# ---- the first attempt is released (upstream 429): the waiter gets the
#      upstream's "retry later" with its Retry-After, and only the client's
#      own later retry executes again
{
    my $k = $t->key('waitrel');
    my @req = (key => $k, json => { rel => 1 });
    my $bg = $t->http_bg(POST => '/x', @req, headers => [ 'X-Delay' => 1, 'X-Status' => 429,
        'X-Reply-Header' => 'Retry-After: 7' ], timeout => 10);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'first attempt reached the upstream');
    my $r = $t->http(POST => '/x', @req, timeout => 10);
    $t->is_problem($r, 429, 'retry-later', key => $k, retry_after => 1,
        name => 'the waiter gets 429 retry-later, not an execution of its own');
    is($r->{headers}{'retry-after'}, 7, "the waiter gets the upstream's Retry-After");
    is(($t->problem($r) // {})->{response_status}, 429, 'response_status is the upstream\'s');
    is(($bg->result(10) // {})->{status}, 429, 'the first attempt got the 429');
    is($t->effects(key => $k), 1, 'released, the waiter answered: still one effect');
    my $again = $t->http(POST => '/x', @req);
    is($again->{status}, 201, "the client's own retry executes");
    ok(!exists $again->{headers}{'idempotent-replayed'}, 'and is not a replay');
    is($t->effects(key => $k), 2, 'released, then retried: 2 effects');
    is($again->{headers}{'x-upstream-seq'}, ($t->effect_list(key => $k))[1]{n}, 'the second effect is the retry\'s');
}

# ---- 50 waiters, the upstream answers 503 every time: one effect, every
#      waiter gets 503 with Retry-After (no waiter executes in turn)
{
    my $k = $t->key('waitrelmany');
    my @req = (key => $k, json => { rel => 'many' });
    my $bg = $t->http_bg(POST => '/x', @req, headers => [ 'X-Delay' => 4, 'X-Status' => 503 ], timeout => 20);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'first attempt reached the upstream');
    my $res = $t->parallel(50, sub {
        my $r = $t->http(POST => '/x', @req, headers => [ 'X-Status' => 503 ], timeout => 20);
        return { status => $r->{status}, type => $t->ptype($r), ra => $r->{headers}{'retry-after'} };
    });
    is(($bg->result(20) // {})->{status}, 503, 'the first attempt got the 503');
    is($t->effects(key => $k), 1, '50 waiters on a 503: exactly one effect');
    my @ok = grep { $_ && $_->{status} == 503 && $_->{type} eq 'retry-later' && ($_->{ra} // '') =~ /^\d+$/ } @$res;
    is(scalar @ok, 50, 'every waiter got 503 retry-later with Retry-After')
        or diag(explain [ grep { !$_ || $_->{type} ne 'retry-later' } @$res ]);
    my $again = $t->http(POST => '/x', @req);
    is($again->{status}, 201, 'a later retry of the client executes');
    is($t->effects(key => $k), 2, 'and is the second effect');
}

# ---- the first attempt's outcome is lost: the waiter gets outcome-unknown
{
    my $k = $t->key('waitunk');
    my @req = (key => $k, json => { unk => 1 });
    my $bg = $t->http_bg(POST => '/x', @req, headers => [ 'X-Delay' => 1, 'X-Drop' => 1 ], timeout => 10);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'first attempt reached the upstream');
    my $r = $t->http(POST => '/x', @req, timeout => 10);
    $t->is_problem($r, 409, 'outcome-unknown', key => $k, state => 'unknown', retry_after => 0,
        name => 'waiter, first attempt dropped by the upstream -> 409 outcome-unknown');
    is(($bg->result(10) // {})->{status}, 502, 'the first attempt got 502');
    is($t->effects(key => $k), 1, 'lost outcome: one effect');
}

# ---- another request under the same key does not wait: fingerprint-mismatch
{
    my $k = $t->key('waitmis');
    my $bg = $t->http_bg(POST => '/x', key => $k, json => { v => 1 }, headers => [ 'X-Delay' => 1 ], timeout => 10);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'first attempt reached the upstream');
    my $r = $t->http(POST => '/x', key => $k, json => { v => 2 }, timeout => 10);
    $t->is_problem($r, 409, 'fingerprint-mismatch', key => $k, state => 'in_progress',
        name => 'different request, same key, while in flight -> fingerprint-mismatch');
    is(($bg->result(10) // {})->{status}, 201, 'first attempt completes');
    is($t->effects(key => $k), 1, 'mismatch: one effect');
}

# ---- a waiting client that goes away does not disturb anything
{
    my $k = $t->key('waitgone');
    my @req = (key => $k, json => { gone => 1 });
    my $bg = $t->http_bg(POST => '/x', @req, headers => [ 'X-Delay' => 1.5 ], timeout => 10);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'first attempt reached the upstream');
    my $w = $t->http(POST => '/x', @req, timeout => 0.3);
    is($w->{status}, 599, 'the waiting client gave up');
    my $first = $bg->result(10);
    is($first && $first->{status}, 201, 'the first attempt completes');
    my $r = $t->http(POST => '/x', @req);
    is($r->{headers}{'idempotent-replayed'}, 'true', 'a later retry replays');
    is($r->{content}, $first && $first->{content}, 'with the executed body');
    is($t->effects(key => $k), 1, 'one effect');
}

# ---- the subscriber connection is cut while a duplicate waits: the worker
#      subscribes again and the waiter still gets the replay
{
    my $k = $t->key('waitsub');
    my @req = (key => $k, json => { sub => 1 });
    my $bg = $t->http_bg(POST => '/x', @req, headers => [ 'X-Delay' => 2 ], timeout => 10);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'first attempt reached the upstream');
    my $w = $t->http_bg(POST => '/x', @req, timeout => 15);
    sleep 0.3;
    my $killed = $t->redis('CLIENT', 'KILL', 'TYPE', 'pubsub');
    ok(!ref $killed && $killed >= 1, "subscriber connections killed ($killed)");
    my $d = $t->http(POST => '/x', @req, timeout => 10);
    ok(($d->{status} == 409 && $t->ptype($d) eq 'in-progress')
        || ($d->{status} == 201 && ($d->{headers}{'idempotent-replayed'} // '') eq 'true'),
        'a duplicate right after the cut: in-progress at once, or (resubscribed) the replay')
        or diag($t->show($d));
    my $first = $bg->result(10);
    my $r = $w->result(15) // {};
    is($r->{status}, 201, 'the waiter gets 201 after the cut') or diag($t->show($r));
    is($r->{headers}{'idempotent-replayed'}, 'true', 'the waiter\'s answer is the replay');
    is($r->{content}, $first && $first->{content}, 'with the executed body');
    is($t->effects(key => $k), 1, 'subscriber cut: one effect');
}

# ---- the owner dies while duplicates wait: its lease lapses during their
#      wait; they never execute, and when the wait ends they are told what
#      the record now is (unknown), like the status endpoint says
{
    my $k = $t->key('waitdead');
    my @req = (key => $k, json => { dead => 1 });
    my $bg = $t->http_bg(POST => '/lease/x', @req, headers => [ 'X-Delay' => 3 ], timeout => 10);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'first attempt reached the upstream');
    my ($owner) = $t->workers_connected_to;
    ok($owner, 'found the worker that owns the request');
    ok($t->kill_worker($owner), 'owner killed (-9)');
    my @w = map { $t->http_bg(POST => '/lease/x', @req, timeout => 15) } 1 .. 4;
    my @res = map { $_->result(15) // {} } @w;
    my @ans = map { ($_->{status} // 'none') . ' ' . $t->ptype($_) } @res;
    note('waiters: ' . join(', ', @ans));
    is(scalar(grep { $_ eq '409 outcome-unknown' } @ans), 4,
        'owner dead: every waiter ends with 409 outcome-unknown (not in-progress, not executed)')
        or diag(explain \@ans);
    my $s = $t->http(GET => '/status', key => $k);
    like($s->{content}, qr/"state":"unknown"/, 'the status endpoint says unknown');
    $bg->result(10);
    is($t->effects(key => $k), 1, 'owner dead: one effect');
}

$t->check_logs(ignore => qr/worker process \d+ exited on signal 9/);
done_testing;
