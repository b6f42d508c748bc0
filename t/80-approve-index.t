#!/usr/bin/perl
# The operation-id index of a proposal (idem:{op}:o) is in Redis before the
# 428 that names the operation leaves. With two workers, the approver's
# look-up that follows the 428 (the status endpoint's ?op=, the approval
# endpoint) often goes through the other worker's Redis link: were the index
# sent without waiting for its "OK", that look-up could reach Redis first
# and be told 404 (the same through a Redis Cluster, where the index is on
# another node's link than its record). When Redis refuses the index, the
# request is answered 503 store-unavailable (nothing runs), and the client's
# retry gets the same proposal again with its index written.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use Idem::Test;

my $JS = JSON::PP->new->canonical;
my $CPW = 'carolpw-' . int(rand 1e9);

my $t = Idem::Test->new;
my $p = $t->prefix;
system("openssl rand -hex 32 > $p/hs.key") == 0 or BAIL_OUT('openssl rand');
my $conf = <<"EOF";
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    idempotency_confirm_key hs256 $p/hs.key;
    location /pay {
        idempotency on;
        idempotency_confirm on;
        idempotency_confirm_show /amount /to /memo;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /acl {
        idempotency on;
        idempotency_redis %%REDIS%% user=carol password=$CPW;
        idempotency_confirm on;
        idempotency_confirm_show /amount;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /approve {
        idempotency_approve;
    }
    location = /status {
        idempotency_status;
    }
}
EOF
$t->start_stack($conf, workers => 2, redis => { args => [
    # the module's user on /acl: every key, until a test takes the index away
    '--user', 'carol', 'on', ">$CPW", '~*', '&*', '+@all',
] });

sub propose {
    my ($path, $k, $body) = @_;
    my $r = $t->http(POST => $path, key => $k, json => $body);
    return ($r, ((($t->problem($r) // {})->{proposal} // {})->{operation_id} // ''));
}

sub approval {
    my ($op, $fp) = @_;
    return (json => $JS->encode({ operation_id => $op, fingerprint => $fp,
                                  approved_by => 'alice', expires_in => 600 }));
}

sub approve { $t->http(POST => '/approve', approval(@_)) }

# ---- the look-up right after the 428, on a fresh connection, never 404s:
# the status endpoint (?op=) or the approval endpoint, in turn. Several
# clients at once, so that a worker has other requests to answer between a
# 428 and its next turn of the event loop, as on a loaded host.
sub race {
    my ($s, $what, $C, $N) = @_;
    my $res = $s->parallel($C, sub {
        my $c = shift;
        my ($proposed, $approved, @miss) = (0, 0);
        for my $i (1 .. $N) {
            my $r = $s->http(POST => '/pay', key => $s->key("race-$c-$i"),
                             json => { amount => $i, to => 'ACME Ltd', memo => 'm' x 512 });
            my $prop = ($s->problem($r) // {})->{proposal} // {};
            my $op = $prop->{operation_id} // '';
            next unless $r->{status} == 428 && $op =~ /^[0-9a-f]{32}$/;
            $proposed++;
            my $l = $i % 2 ? $s->http(GET => "/status?op=$op")
                           : $s->http(POST => '/approve', approval($op, $prop->{fingerprint} // ''));
            $approved++ if $l->{status} == 200 && !($i % 2);
            push @miss, "$c.$i: $l->{status}" if $l->{status} != 200;
        }
        return { proposed => $proposed, approved => $approved, miss => \@miss };
    }, timeout => 120);
    my ($proposed, $approved, @miss) = (0, 0);
    for (@$res) {
        $proposed += $_->{proposed} // 0;
        $approved += $_->{approved} // 0;
        push @miss, @{ $_->{miss} // [] };
    }
    is($proposed, $C * $N, "$what: " . $C * $N . ' proposals, each a 428 with its operation id');
    is(scalar @miss, 0, "$what: each operation was found by the next request (status ?op=, approve)")
        or diag(scalar(@miss) . ' not found: ' . join ', ', @miss);
    is($approved, $C * $N / 2, "$what: every other one approved at once");
    is($s->effects, 0, "$what: nothing ran: proposals and approvals only");
}

race($t, 'one Redis', 16, 60);

# ---- Redis refuses the index: 503 store-unavailable, nothing runs, the
# retry gets the same proposal and its index
{
    # carol may read every key and write every key but the index (NOPERM);
    # a key read and written by one command (SET NX GET) needs a pattern
    # that grants both
    is($t->redis('ACL', 'SETUSER', 'carol', 'resetkeys', '%R~*', '~idem:{*}:[^o]'), 'OK',
       'the index key is made unwritable for the module');
    my $k = $t->key('noindex');
    my $body = { amount => 77 };
    my $r = $t->http(POST => '/acl', key => $k, json => $body);
    is($r->{status}, 503, 'index refused: 503') or diag($t->show($r));
    is($t->ptype($r), 'store-unavailable', '... store-unavailable');
    ok(($r->{headers}{'retry-after'} // '') =~ /^\d+$/, '... with Retry-After');
    is($t->effects(key => $k), 0, '... and nothing ran');
    my $rec = $t->decode_record($t->redis('GET', $t->record_name($k))) // {};
    is($rec->{state}, 'awaiting_confirmation', 'the proposal itself is recorded');
    my $op = $rec->{op} // '';
    like($op, qr/^[0-9a-f]{32}$/, '... with its operation id');
    is($t->redis('EXISTS', "idem:{$op}:o"), 0, '... and no index');
    like($t->error_log, qr/operation index of key .* was not written/, 'the refusal is logged');

    # still refused: the retry is told 503 again, and nothing runs
    $r = $t->http(POST => '/acl', key => $k, json => $body);
    is($r->{status}, 503, 'retry while refused: 503 again');
    is($t->effects(key => $k), 0, '... nothing ran');

    is($t->redis('ACL', 'SETUSER', 'carol', 'resetkeys', '~*'), 'OK', 'the index key is writable again');
    my ($r2, $op2) = propose('/acl', $k, $body);
    is($r2->{status}, 428, 'the retry: 428') or diag($t->show($r2));
    is($op2, $op, '... with the same operation id');
    is($t->redis('EXISTS', "idem:{$op}:o"), 1, '... and the index exists as it arrives');
    my $ttl = $t->redis('PTTL', "idem:{$op}:o");
    ok($ttl > 0 && $ttl <= 3600 * 1000, "... for the proposal's life left ($ttl ms)");
    my $s = $t->http(GET => "/status?op=$op");
    is($s->{status}, 200, 'the status endpoint finds it') or diag($t->show($s));
    my $fp = ((($t->problem($r2) // {})->{proposal} // {})->{fingerprint} // '');
    my $a = approve($op, $fp);
    is($a->{status}, 200, 'the approval endpoint records the approval') or diag($t->show($a));
    $r = $t->http(POST => '/acl', key => $k, json => $body);
    is($r->{status}, 201, 'the approved request executes');
    is($t->effects(key => $k), 1, '... once');
}

# ---- the same through a Redis Cluster (the index and its record are in
# other hash slots, each look-up on the link of the index's node)
{
    my $c = Idem::Test->new;
    my $cp = $c->prefix;
    system("cp $p/hs.key $cp/hs.key") == 0 or BAIL_OUT('cp hs.key');
    my @ports = $c->start_cluster(masters => 3, replicas => 0);
    $c->start_upstream;
    my $seeds = join ' ', map { "127.0.0.1:$_" } @ports;
    $c->start_nginx(<<"EOF", workers => 2);
idempotency_redis_cluster $seeds;
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_confirm_key hs256 $cp/hs.key;
    location /pay {
        idempotency on;
        idempotency_confirm on;
        idempotency_confirm_show /amount /to /memo;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /approve {
        idempotency_approve;
    }
    location = /status {
        idempotency_status;
    }
}
EOF
    race($c, 'cluster', 16, 40);
}

done_testing;
