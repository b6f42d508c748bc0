#!/usr/bin/perl
# idempotency_unique: one execution per business identity within a scope.
# Two deliveries of one alert with two keys make one ticket: the second key
# gets the first operation's stored response, marked Idempotent-Reused with
# the first operation's id, and becomes its alias. A first operation that
# stored a non-2xx or was released frees the identity (a business retry);
# the same identity in another scope is another identity.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use Time::HiRes qw(sleep time);
use Idem::Test;

my $t = Idem::Test->new;

$t->start_stack(<<"EOF", log_format => 'U|$idempotency_key|$idempotency_outcome|$idempotency_operation_id');
idempotency_json_var \$source_event_id /source_event_id;

server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    location /tickets {
        idempotency on;
        idempotency_scope \$http_authorization;
        idempotency_unique tickets:\$source_event_id;
        idempotency_fingerprint_exclude /title;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /strict {
        idempotency on;
        idempotency_unique tickets:\$source_event_id;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /mixed {
        idempotency on;
        idempotency_unique tickets:\$host:\$source_event_id;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /status {
        idempotency_scope \$http_authorization;
        idempotency_status;
    }
}
EOF

my $AUTH = 'Bearer tenant-a-secret';

sub ticket {
    my ($key, $event, %o) = @_;
    my $body = { source_event_id => $event, title => $o{title} // "alert $event" };
    $body->{severity} = $o{severity} if defined $o{severity};
    return $t->http(POST => $o{path} // '/tickets', key => $key,
                    json => JSON::PP->new->canonical->encode($body),
                    headers => [ Authorization => $o{auth} // $AUTH, @{ $o{headers} // [] } ]);
}

sub json_of { my $r = shift; my $j = eval { JSON::PP->new->decode($r->{content}) }; ref $j eq 'HASH' ? $j : {} }
sub op_of { (($t->record($_[0], $_[1] // $AUTH)) // {})->{op} // '' }

# ---- alert-7c91 delivered twice, with two keys and two titles: one ticket
my ($k1, $k2) = ($t->key('alert-a'), $t->key('alert-b'));
my $r1 = ticket($k1, 'alert-7c91', title => 'CPU high on db-1');
is($r1->{status}, 201, 'first delivery: 201') or diag($t->show($r1));
ok(!$r1->{headers}{'idempotent-reused'}, 'first delivery: not reused');
my $op1 = op_of($k1);
{
    # a unique key that lapsed before its completed record (whose retention
    # starts at completion) would free the identity too early
    my ($uk) = grep { /:u$/ } $t->redis_keys('*');
    cmp_ok($t->redis('PTTL', $uk), '>', $t->redis('PTTL', $t->record_name($k1, $AUTH)) + 3_600_000,
           'the unique key lives past the completed record');
}
like($op1, qr/^[0-9a-f]{32}$/, 'first delivery: its operation id');

my $r2 = ticket($k2, 'alert-7c91', title => 'db-1: CPU above 90%');
is($r2->{status}, 201, 'second delivery, another key: the first\'s status');
is($r2->{content}, $r1->{content}, '... and the first\'s body (the same ticket)');
is($r2->{headers}{'idempotent-reused'}, 'true', '... Idempotent-Reused: true');
is($r2->{headers}{'idempotency-operation'}, $op1, '... Idempotency-Operation: the first operation');
ok(!$r2->{headers}{'idempotent-replayed'}, '... not Idempotent-Replayed (its own key never ran)');
is($r2->{headers}{location}, $r1->{headers}{location}, '... the first\'s Location');
is($t->effects(uri => '/tickets'), 1, 'one ticket (1 effect)');

my $r2b = ticket($k2, 'alert-7c91', title => 'db-1: CPU above 90%');
is($r2b->{status}, 201, 'a retry of the second key: the same answer');
is($r2b->{content}, $r1->{content}, '... the same body');
is($r2b->{headers}{'idempotent-reused'}, 'true', '... reused');
my $raw = $t->redis('GET', $t->record_name($k2, $AUTH)) // '';
is(substr($raw, 0, 2), '2s', 'the second key\'s record is an alias (state s)');
is(substr($raw, 3, 32), $op1, '... naming the first operation');
my $s = $t->http(GET => '/status', key => $k2, headers => [ Authorization => $AUTH ]);
is($s->{status}, 200, 'status of the second key: 200') or diag($t->show($s));
is(json_of($s)->{state}, 'alias', 'status: state alias');
is(json_of($s)->{operation_id}, $op1, 'status: the operation it reuses');
is(json_of($s)->{alias_state}, 'completed', 'status: the state of that operation');

my $r1b = ticket($k1, 'alert-7c91', title => 'CPU high on db-1');
is($r1b->{headers}{'idempotent-replayed'}, 'true', 'a retry of the first key: an ordinary replay');
is($t->effects(uri => '/tickets'), 1, 'still 1 effect');

# the second key with another request is a reused key, as any key is
my $r2c = ticket($k2, 'alert-7c91', severity => 'page');
is($r2c->{status}, 409, 'the second key with a changed body: 409');
is($t->ptype($r2c), 'fingerprint-mismatch', '... fingerprint-mismatch');
my $r2d = ticket($k2, 'alert-other');
is($t->ptype($r2d), 'fingerprint-mismatch', '... another identity under that key too');
is($t->effects(uri => '/tickets'), 1, 'still 1 effect');

# ---- 50 concurrent deliveries, 50 keys, one identity: 1 effect
{
    my $ev = 'alert-burst-' . int(time * 1000);
    my @keys = map { $t->key("burst-$_") } 0 .. 49;
    my %mine = map { $_ => 1 } @keys;
    my $res = $t->parallel(50, sub {
        my $i = shift;
        my $r = ticket($keys[$i], $ev, headers => [ 'X-Delay' => 0.5 ]);
        return { status => $r->{status}, type => $t->ptype($r), reused => $r->{headers}{'idempotent-reused'} // '',
                 body => $r->{content} };
    });
    my @ok = grep { $_ && $_->{status} == 201 } @$res;
    my @busy = grep { $_ && $_->{status} == 409 && $_->{type} eq 'in-progress' } @$res;
    is(@ok + @busy, 50, '50 concurrent: each answer is 201 or 409 in-progress')
        or diag(explain [ map { $_ && "$_->{status} $_->{type}" } @$res ]);
    my @first = grep { !$_->{reused} } @ok;
    is(scalar @first, 1, 'exactly one of them executed');
    my @effects = grep { $mine{ $_->{key} // '' } } $t->effect_list(uri => '/tickets');
    is(scalar @effects, 1, '50 concurrent, one identity: 1 effect');
    # once it completed every key answers the one ticket
    my %bodies;
    for my $i (0 .. 49) {
        my $r = ticket($keys[$i], $ev);
        $bodies{"$r->{status} $r->{content}"}++;
    }
    is(scalar keys %bodies, 1, 'afterwards, the 50 keys answer one response');
    is((keys %bodies)[0], "201 $first[0]{body}", '... the executed one');
    is(scalar(grep { $mine{ $_->{key} // '' } } $t->effect_list(uri => '/tickets')), 1, 'still 1 effect');
}

# ---- a stored non-2xx frees the identity: a business retry executes
{
    my ($a, $b) = ($t->key('fail-a'), $t->key('fail-b'));
    my $ra = ticket($a, 'alert-500', headers => [ 'X-Status' => 500 ]);
    is($ra->{status}, 500, 'first operation answered 500 (stored)');
    my $rb = ticket($b, 'alert-500');
    is($rb->{status}, 201, 'a second key with the same identity executes');
    ok(!$rb->{headers}{'idempotent-reused'}, '... not reused');
    is($t->effects(key => $a) + $t->effects(key => $b), 2, 'stored 500, then a business retry: 2 effects');
    my $rc = ticket($t->key('fail-c'), 'alert-500');
    is($rc->{headers}{'idempotent-reused'}, 'true', 'a third key now reuses the retry\'s 201');
    is($rc->{content}, $rb->{content}, '... its body');
}

# ---- a released first operation (the upstream's 503) frees it too
{
    my ($a, $b) = ($t->key('rel-a'), $t->key('rel-b'));
    my $ra = ticket($a, 'alert-503', headers => [ 'X-Status' => 503 ]);
    is($ra->{status}, 503, 'first operation answered 503 (released)');
    my $rb = ticket($b, 'alert-503');
    is($rb->{status}, 201, 'a second key with the same identity executes');
    is($t->effects(key => $a) + $t->effects(key => $b), 2, 'released, then a business retry: 2 effects');
}

# ---- an in-flight first operation: the second key is told in-progress, of the first
{
    my ($a, $b) = ($t->key('fly-a'), $t->key('fly-b'));
    my $bg = $t->http_bg(POST => '/tickets', key => $a,
                         json => '{"source_event_id":"alert-fly","title":"x"}',
                         headers => [ Authorization => $AUTH, 'X-Delay' => 1.5 ]);
    ok($t->wait_for(sub { $t->effects(key => $a) == 1 }, 5), 'the first reached the upstream');
    my $rb = ticket($b, 'alert-fly');
    is($rb->{status}, 409, 'second key while the first runs: 409');
    is($t->ptype($rb), 'in-progress', '... in-progress');
    is(($t->problem($rb) // {})->{operation_id}, op_of($a), '... with the first operation\'s id');
    is(($t->problem($rb) // {})->{reused}, JSON::PP::true, '... marked reused');
    is($rb->{headers}{'retry-after'}, 1, '... Retry-After: 1');
    my $r1 = $bg->result(10);
    is($r1 && $r1->{status}, 201, 'the first completes');
    my $rb2 = ticket($b, 'alert-fly');
    is($rb2->{status}, 201, 'then the second key\'s retry gets its response');
    is($rb2->{headers}{'idempotent-reused'}, 'true', '... reused');
    is($t->effects(key => $a) + $t->effects(key => $b), 1, 'in flight, then reused: 1 effect');
}

# ---- an unknown first operation holds the identity: outcome-unknown, of the first
{
    my ($a, $b) = ($t->key('unk-a'), $t->key('unk-b'));
    my $ra = ticket($a, 'alert-unk', headers => [ 'X-Drop' => 1 ]);
    is($ra->{status}, 502, 'first operation: the upstream dropped the connection (502)');
    ok($t->wait_state($a, $AUTH, 'unknown'), 'its record is unknown');
    my $rb = ticket($b, 'alert-unk');
    is($rb->{status}, 409, 'second key: 409');
    is($t->ptype($rb), 'outcome-unknown', '... outcome-unknown');
    is(($t->problem($rb) // {})->{operation_id}, op_of($a), '... of the first operation');
    is($t->effects(key => $a) + $t->effects(key => $b), 1, 'unknown holds the identity: 1 effect');
}

# ---- the same identity in two scopes: two identities, nothing shared
{
    my ($a, $b) = ($t->key('scope-a'), $t->key('scope-b'));
    my $ra = ticket($a, 'alert-shared', auth => 'Bearer tenant-a');
    my $rb = ticket($b, 'alert-shared', auth => 'Bearer tenant-b');
    is($ra->{status}, 201, 'tenant a: 201');
    is($rb->{status}, 201, 'tenant b: 201');
    ok(!$rb->{headers}{'idempotent-reused'}, 'tenant b: not reused');
    isnt($rb->{content}, $ra->{content}, 'tenant b: its own response, nothing of tenant a\'s');
    is($t->effects(key => $a) + $t->effects(key => $b), 2, 'two scopes: 2 effects');
}

# ---- no identity (the member is absent, so every variable of the value is
# empty): keys are independent
{
    my ($a, $b) = ($t->key('none-a'), $t->key('none-b'));
    for my $k ($a, $b) {
        $t->http(POST => '/tickets', key => $k, json => '{"title":"no event id"}',
                 headers => [ Authorization => $AUTH ]);
    }
    is($t->effects(key => $a) + $t->effects(key => $b), 2, 'an empty identity holds nothing: 2 effects');
}

# ---- one empty variable among others ($host is never empty): no identity,
# or every body without the member would be one ticket
{
    my ($a, $b) = ($t->key('mixed-a'), $t->key('mixed-b'));
    for my $k ($a, $b) {
        $t->http(POST => '/mixed', key => $k, json => '{"title":"no event id"}');
    }
    is($t->effects(key => $a) + $t->effects(key => $b), 2, 'one of two variables empty: no identity, 2 effects');
    my ($c, $d) = ($t->key('mixed-c'), $t->key('mixed-d'));
    $t->http(POST => '/mixed', key => $_, json => '{"source_event_id":"ev-mixed"}') for $c, $d;
    is($t->effects(key => $c) + $t->effects(key => $d), 1, 'both set: one identity, 1 effect');
}

# ---- a 2 KiB identity: one identity, never stored raw
{
    my $long = 'e' x 2048;
    my ($a, $b) = ($t->key('long-a'), $t->key('long-b'));
    my $ra = ticket($a, $long, path => '/strict');
    my $rb = ticket($b, $long, path => '/strict', title => 'other');
    is($ra->{status}, 201, 'a 2 KiB identity: 201');
    is($rb->{headers}{'idempotent-reused'}, 'true', '... the second key reuses it');
    is($t->effects(key => $a) + $t->effects(key => $b), 1, '... 1 effect');
    my @names = $t->redis_keys('*');
    ok(!grep({ /eeeeeeee|alert-7c91|tenant/ } @names), 'no identity and no scope in any Redis key name');
    my @vals = map { $t->redis('GET', $_) // '' } grep { /:u$/ } @names;
    ok(@vals && !grep({ /eeeeeeee|alert/ } @vals), 'unique keys hold record keys, not identities');
}

# ---- an identity belongs to the operation that took it, not to its key:
# a key released and then used for another request does not carry it
{
    my ($k, $k3) = ($t->key('moved-a'), $t->key('moved-c'));
    my $r = ticket($k, 'alert-x', headers => [ 'X-Status' => 503 ]);
    is($r->{status}, 503, 'key A, identity X: 503 (released)');
    $r = ticket($k, 'alert-y');
    is($r->{status}, 201, 'key A again, now with identity Y: executes (a released key is free)');
    my $y = $r->{content};
    $r = ticket($k3, 'alert-x');
    is($r->{status}, 201, 'a third key with identity X: executes');
    ok(!$r->{headers}{'idempotent-reused'}, '... not reused (X was never done)');
    isnt($r->{content}, $y, '... and not given Y\'s answer');
    is($t->effects(key => $k3), 1, '... 1 effect');

    # an alias whose operation's key now holds another operation
    my ($ka, $kb) = ($t->key('gone-a'), $t->key('gone-b'));
    ticket($ka, 'alert-gone');
    $r = ticket($kb, 'alert-gone');
    is($r->{headers}{'idempotent-reused'}, 'true', 'key B is an alias of key A\'s operation');
    $t->redis('DEL', $t->record_name($ka, $AUTH));    # as if its record expired
    ticket($ka, 'alert-other');
    $r = ticket($kb, 'alert-gone');
    is($r->{status}, 201, 'key A now holds another operation: B\'s retry runs its own request');
    ok(!$r->{headers}{'idempotent-reused'}, '... not reused from the other operation');
    is($t->effects(key => $kb), 1, '... 1 effect for B');
}

# ---- $idempotency_outcome
{
    my @log = $t->access_log;
    ok(grep({ /^U\|\Q$k2\E\|reused\|\Q$op1\E$/ } @log), '$idempotency_outcome reused, $idempotency_operation_id the first\'s')
        or diag(join "\n", grep { /\Q$k2\E/ } @log);
}

$t->check_logs;
done_testing;
