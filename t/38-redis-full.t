#!/usr/bin/perl
# Redis at maxmemory with noeviction (docs/redis.md): every write is refused
# with OOM, reads still work.  Stored records keep replaying; a new key gets
# 503 store-unavailable and is not executed; fail-open passes it through, as
# documented.  A completion refused by OOM leaves the record in progress, so
# retries get in-progress, then (once Redis can write) outcome-unknown:
# the operation never runs twice.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Idem::Test;

my $t = Idem::Test->new;
$t->start_stack(<<'EOF', workers => 1, redis => { args => [ '--maxmemory-policy', 'noeviction' ] });
server {
    listen 127.0.0.1:%%PORT%%;
    location / {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_lease 6s;
        proxy_ignore_client_abort on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /open/ {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_store_failure open;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

# maxmemory 1 byte: Redis is always over it, so it refuses every write
sub redis_full {
    my ($full) = @_;
    is($t->redis('CONFIG', 'SET', 'maxmemory', $full ? 1 : 0), 'OK',
        'CONFIG SET maxmemory ' . ($full ? '1 (full)' : '0 (no limit)'));
}

sub oom_lines { scalar(() = $t->error_log =~ /\Q$_[0]\E script failed: OOM command not allowed/g) }

my $k1 = $t->key('stored');
my @req1 = (key => $k1, json => { order => 'before full' });
my ($first) = $t->retry_until_final('/orders', 5, @req1);
is($first->{status}, 201, 'a write before Redis is full executes') or diag($t->show($first));
is($t->effects(key => $k1), 1, 'one effect');
# the completion goes out as the response ends: let it land before filling Redis
ok($t->wait_state($k1, undef, 'completed'),
    'its record is completed');

# ---- a full Redis: a test write shows what the module will meet
redis_full(1);
my $probe = $t->redis('SET', 'probe', 'x');
ok($t->is_redis_error($probe) && $probe->message =~ /^OOM /, 'Redis refuses a write with OOM')
    or diag(explain $probe);

{
    my $r = $t->http(POST => '/orders', @req1);
    is($r->{status}, 201, 'full: a stored key still replays (the claim only reads)');
    is($r->{headers}{'idempotent-replayed'}, 'true', 'full: marked as a replay');
    is($r->{content}, $first->{content}, 'full: the same body');
    is($t->effects(key => $k1), 1, 'full: still one effect');
}

{
    my $k = $t->key('new');
    for my $i (1 .. 3) {
        my $r = $t->http(POST => '/orders', key => $k, json => { order => 'while full' });
        $t->is_problem($r, 503, 'store-unavailable', key => $k, retry_after => 1,
            name => "full, new key, attempt $i: 503 store-unavailable with Retry-After");
    }
    is($t->effects(key => $k), 0, 'full: the new key was not executed');
    ok(!$t->record($k), 'full: no record was written for it');
    like($t->error_log, qr/\[error\].*idempotency: claim failed: OOM command not allowed/,
        'full: the refusal is in error.log at error level, with Redis\'s words');
}

{
    my $k = $t->key('open');
    for my $i (1 .. 2) {
        my $r = $t->http(POST => '/open/x', key => $k, json => { order => 'fail open' });
        is($r->{status}, 201, "full, fail open, attempt $i: passes through") or diag($t->show($r));
        ok(!exists $r->{headers}{'idempotent-replayed'}, "full, fail open, attempt $i: not a replay");
    }
    is($t->effects(key => $k), 2,
        'full, fail open: unprotected, every attempt is an effect (what "open" means)');
    like($t->error_log, qr/\[warn\].*passing key "\Q$k\E" through unprotected/,
        'full, fail open: logged at warn, naming the key');
}

# ---- Redis fills up while the upstream works: the completion is refused
{
    redis_full(0);
    my $k = $t->key('complete');
    my @req = (key => $k, json => { order => 'filled mid-request' });
    my $before = oom_lines('complete');
    my $bg = $t->http_bg(POST => '/orders', @req, headers => [ 'X-Delay' => 2 ], timeout => 10);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'the request reached the upstream');
    redis_full(1);

    my $r = $bg->result(10);
    is($r && $r->{status}, 201, 'the client still gets the upstream\'s answer') or diag($t->show($r // {}));
    ok($t->wait_for(sub { oom_lines('complete') > $before }, 5),
        'error.log: the complete script failed with OOM');
    like($t->error_log, qr/complete script failed: OOM [^\n]*; the record turns unknown when its lease lapses/,
        'error.log says what becomes of the record');
    is(($t->record($k) // {})->{state}, 'in_progress', 'the record is still in progress');

    my $again = $t->http(POST => '/orders', @req);
    $t->is_problem($again, 409, 'in-progress', key => $k, retry_after => 1,
        name => 'a retry while the lease runs: 409 in-progress');

    # The lease (6 s) outlives the request (2 s), and a renewal while Redis
    # is full is refused.  The lapse needs a write (the record turns
    # unknown), which a full Redis refuses too.  Wait for it by Redis's clock.
    my $left = $t->lease_left($t->record($k));
    ok(defined $left && $left > 0, "the record has a lease left ($left ms)");
    ok($t->wait_for(sub { ($t->lease_left($t->record($k)) // 1) < -50 }, 10),
        'the lease lapsed');
    my $lapsed = $t->http(POST => '/orders', @req);
    $t->is_problem($lapsed, 503, 'store-unavailable', key => $k, retry_after => 1,
        name => 'lease lapsed, Redis still full: 503 store-unavailable');

    redis_full(0);
    my $unknown = $t->http(POST => '/orders', @req);
    $t->is_problem($unknown, 409, 'outcome-unknown', key => $k, retry_after => 0,
        name => 'Redis writable again: 409 outcome-unknown, never a second execution');
    is(($t->record($k) // {})->{state}, 'unknown', 'the record is unknown');
    is($t->effects(key => $k), 1, 'one effect through all of it');
}

# ---- and once Redis has room, everything works again
{
    my $k = $t->key('after');
    my @req = (key => $k, json => { order => 'after' });
    my $r = $t->http(POST => '/orders', @req);
    is($r->{status}, 201, 'room again: a new key executes');
    my $again = $t->http(POST => '/orders', @req);
    is($again->{headers}{'idempotent-replayed'}, 'true', 'room again: its retry replays');
    is($t->effects(key => $k), 1, 'room again: one effect');
}

$t->check_logs;
done_testing;
