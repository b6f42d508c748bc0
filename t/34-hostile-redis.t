#!/usr/bin/perl
# Foreign or damaged data under the module's record key (computed as the
# module does, docs/states.md: "idem:{" + hex of the first 16 bytes of
# SHA-256("idem-record-v1\0" . u64be(len scope) . scope . key) + "}:r"):
# a plain string, a list, a hash of another application, a record whose
# layout version, state, status or stored headers are wrong. Each is a clear
# 500 store-error problem, never an execution (no upstream effect), never a
# crash, and the foreign value is left as it was. The status endpoint says
# store-error too, never another record's data.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use Idem::Test;

my $t = Idem::Test->new;
$t->start_redis;
$t->start_upstream;
$t->start_nginx(<<'EOF');
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    idempotency_scope $http_authorization;
    location / {
        idempotency on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /status {
        idempotency_status;
    }
}
EOF

my $AUTH = "Bearer foreign-$$";
my @A = (headers => [ Authorization => $AUTH ]);
my $n = 0;

sub dump_key {
    my ($name) = @_;
    my $type = $t->redis('TYPE', $name);
    return "$type:" . ($type eq 'string' ? $t->redis('GET', $name)
        : $type eq 'hash' ? join(',', map { $_ // '' } sort @{ $t->redis('HGETALL', $name) })
        : $type eq 'list' ? join(',', @{ $t->redis('LRANGE', $name, 0, -1) })
        : $type eq 'set'  ? join(',', sort @{ $t->redis('SMEMBERS', $name) })
        : $type eq 'zset' ? join(',', @{ $t->redis('ZRANGE', $name, 0, -1) }) : '');
}

# store-error for a value placed under the key before the first request
sub foreign_case {
    my ($what, @setup) = @_;
    my $k = $t->key('foreign');
    my $name = $t->record_name($k, $AUTH);
    my $uri = '/foreign/' . ++$n;
    for my $cmd (@setup) {
        my $r = $t->redis(map { $_ eq 'NAME' ? $name : $_ } @$cmd);
        die "setup of $what: $r" if $t->is_redis_error($r);
    }
    my $before = dump_key($name);
    my $r = $t->http(POST => $uri, key => $k, json => { a => 1 }, @A);
    $t->is_problem($r, 500, 'store-error', key => $k, name => "$what: 500 store-error");
    my $p = $t->problem($r) // {};
    ok(!defined $p->{operation_id} || $p->{operation_id} =~ /^[0-9a-f]{32}$/, "$what: no garbage operation_id");
    ok(!defined $p->{state} || $p->{state} =~ /^(in_progress|completed|unknown)$/, "$what: no garbage state");
    my $r2 = $t->http(POST => $uri, key => $k, json => { a => 1 }, @A);
    is($r2->{status}, 500, "$what: a retry is refused the same way");
    is($t->effects(uri => $uri), 0, "$what: no effect");
    is(dump_key($name), $before, "$what: the foreign value is left untouched");
    my $s = $t->http(GET => '/status', key => $k, @A);
    ok($s->{status} == 500 || $s->{status} == 404, "$what: status endpoint answers $s->{status}, no crash");
    ok(($s->{content} // '') !~ /foreign-payload/, "$what: status endpoint shows none of the foreign data");
    return $k;
}

foreign_case('plain string', [ 'SET', 'NAME', 'foreign-payload' ]);
foreign_case('empty string', [ 'SET', 'NAME', '' ]);
foreign_case('list', [ 'RPUSH', 'NAME', 'foreign-payload', 'x' ]);
foreign_case('set', [ 'SADD', 'NAME', 'foreign-payload' ]);
foreign_case('sorted set', [ 'ZADD', 'NAME', '1', 'foreign-payload' ]);
foreign_case('hash of another application', [ 'HSET', 'NAME', 'user', 'foreign-payload', 'visits', '3' ]);
foreign_case('hash with a state but no layout version',
    [ 'HSET', 'NAME', 'state', 'completed', 'status', '200', 'body', 'foreign-payload' ]);
foreign_case('layout version 2', [ 'HSET', 'NAME', 'v', '2', 'state', 'completed', 'fp', 'f' x 64,
    'op', '0' x 32, 'body', 'foreign-payload' ]);
foreign_case('v=1 but no fingerprint', [ 'HSET', 'NAME', 'v', '1', 'state', 'completed', 'op', '0' x 32 ]);
foreign_case('v=1, unknown state, other fingerprint', [ 'HSET', 'NAME', 'v', '1', 'state', 'exploded',
    'fp', 'f' x 64, 'op', '1' x 32, 'body', 'foreign-payload' ]);
foreign_case('v=1, operation id not hex', [ 'HSET', 'NAME', 'v', '1', 'state', 'completed',
    'fp', 'f' x 64, 'op', 'foreign-payload' ]);

# ---- a real record, then damaged field by field: same fingerprint now
sub damaged_case {
    my ($what, $hset, %o) = @_;
    my $k = $t->key('damaged');
    my $uri = '/damaged/' . ++$n;
    my $a = $t->http(POST => $uri, key => $k, json => { a => 1 }, @A);
    is($a->{status}, 201, "$what: first request executes");
    my $name = $t->record_name($k, $AUTH);
    # the record is completed right after the answer went out: wait for it
    ok($t->wait_for(sub { ($t->redis('HGET', $name, 'state') // '') eq 'completed' }, 5),
        "$what: record completed");
    $t->redis('HSET', $name, @$hset);
    $t->redis('HDEL', $name, @{ $o{hdel} }) if $o{hdel};
    my $before = dump_key($name);
    my $r = $t->http(POST => $uri, key => $k, json => { a => 1 }, @A);
    if ($o{ok}) {
        $o{ok}->($r);
    } else {
        $t->is_problem($r, 500, 'store-error', key => $k, name => "$what: retry gets 500 store-error");
        ok(($r->{content} // '') !~ /foreign-payload/, "$what: nothing of the damaged record is shown");
    }
    is($t->effects(uri => $uri), 1, "$what: no second execution");
    is(dump_key($name), $before, "$what: the record is not rewritten");
    # the status endpoint reads the same record: valid JSON or store-error
    my $s = $t->http(GET => '/status', key => $k, @A);
    if (($o{status_endpoint} // 500) == 200) {
        is($s->{status}, 200, "$what: the status endpoint answers 200") or diag($t->show($s));
        my $j = eval { JSON::PP->new->decode($s->{content}) };
        ok(ref $j eq 'HASH', "$what: its body is valid JSON") or diag($s->{content});
        $o{status_json}->($j // {}) if $o{status_json};
    } else {
        $t->is_problem($s, 500, 'store-error', key => $k,
            name => "$what: the status endpoint answers 500 store-error");
    }
    ok(($s->{content} // '') !~ /foreign-payload/, "$what: the status endpoint shows nothing of it");
    is(dump_key($name), $before, "$what: the status endpoint left the record alone");
}

damaged_case('state rewritten to garbage', [ 'state', 'exploded' ]);
damaged_case('layout version 0', [ 'v', '0' ]);
damaged_case('layout version missing', [], hdel => [ 'v' ]);
damaged_case('operation id missing', [], hdel => [ 'op' ]);
damaged_case('status not a number', [ 'status', 'foreign-payload' ]);
damaged_case('status out of range', [ 'status', '999' ]);
damaged_case('status missing', [], hdel => [ 'status' ]);
damaged_case('headers blob malformed', [ 'hdr', '12:Content-Type,99:foreign-payload,' ], status_endpoint => 200);
damaged_case('headers blob with a leading zero', [ 'hdr', '012:Content-Type,1:x,' ], status_endpoint => 200);
damaged_case('headers blob with a huge length', [ 'hdr', '99999999999999999999:x,1:y,' ], status_endpoint => 200);
damaged_case('headers blob with an empty name', [ 'hdr', '0:,3:abc,' ], status_endpoint => 200);
# header injection through a stored value: never a new header line on the wire
sub ns { join '', map { length($_) . ":$_," } @_ }
damaged_case('header value with CRLF', [ 'hdr', ns('X-Stuff', "a\r\nSet-Cookie: injected=foreign") ],
    status_endpoint => 200,
    ok => sub {
        my ($r) = @_;
        ok(!exists $r->{headers}{'set-cookie'}, 'header value with CRLF: no injected Set-Cookie on the wire')
            or diag($t->show($r));
        ok($r->{status} == 500 || ($r->{headers}{'idempotent-replayed'} // '') eq 'true',
            "header value with CRLF: refused (500) or replayed without the injection ($r->{status})");
    });
damaged_case('header name with CRLF', [ 'hdr', ns("X-A\r\nSet-Cookie: injected=1", 'x') ],
    status_endpoint => 200,
    ok => sub {
        my ($r) = @_;
        ok(!exists $r->{headers}{'set-cookie'}, 'header name with CRLF: no injected Set-Cookie')
            or diag($t->show($r));
    });
damaged_case('body field missing, stored=1', [ 'stored', '1' ], hdel => [ 'body' ],
    status_endpoint => 200,
    ok => sub {
        my ($r) = @_;
        ok($r->{status} == 500 || ($r->{headers}{'idempotent-replayed'} // '') eq 'true',
            "body field missing: refused or replayed ($r->{status}), no crash");
    });

# status written with a leading zero: the claim reads 201, the status
# endpoint prints a JSON number (not "0201", which is not JSON)
damaged_case('status with a leading zero', [ 'status', '0201' ], status_endpoint => 200,
    status_json => sub { is($_[0]{response_status}, 201, 'status with a leading zero: response_status 201') },
    ok => sub {
        is($_[0]{headers}{'idempotent-replayed'}, 'true', 'status with a leading zero: replayed');
        is($_[0]{status}, 201, 'status with a leading zero: as 201');
    });
# times the claim never reads, but the status endpoint prints
damaged_case('creation time after year 9999', [ 'created', '253402300800000' ],
    ok => sub { is($_[0]{headers}{'idempotent-replayed'}, 'true', 'creation time after 9999: still replayed') });
damaged_case('completion time not a number', [ 'completed', 'foreign-payload' ],
    ok => sub { is($_[0]{headers}{'idempotent-replayed'}, 'true', 'completion time garbage: still replayed') });
damaged_case('fingerprint shortened', [ 'fp', 'f' x 63 ],
    ok => sub { $t->is_problem($_[0], 409, 'fingerprint-mismatch', name => 'fingerprint shortened: 409 mismatch') });

# ---- the module keeps working for clean keys afterwards
{
    my $k = $t->key('after');
    my $a = $t->http(POST => '/after', key => $k, json => { a => 1 }, @A);
    is($a->{status}, 201, 'a clean key still executes');
    my $b = $t->http(POST => '/after', key => $k, json => { a => 1 }, @A);
    is($b->{headers}{'idempotent-replayed'}, 'true', 'and replays');
    is($t->effects(uri => '/after'), 1, 'clean key: one effect');
}

$t->check_logs;
done_testing;
