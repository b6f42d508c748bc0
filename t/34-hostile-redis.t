#!/usr/bin/perl
# Foreign or damaged data under the module's record key (computed as the
# module does, docs/states.md: "idem:{" + hex of the first 16 bytes of
# SHA-256("idem-record-v1\0" . u64be(len scope) . scope . key) + "}:r"):
# a plain string, a list, a hash of another application, a record whose
# layout, state, owner, status, netstrings or stored headers are wrong, in
# layout 2 (one string) and in layout 1 (a hash, as earlier versions wrote). Each is a clear
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
$t->start_stack(<<'EOF');
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

# ---- a real record (layout 2, one string), then damaged field by field:
# same fingerprint now. $damage gets the decoded record and returns the new
# value, written with the record's TTL kept.
sub damaged_case {
    my ($what, $damage, %o) = @_;
    my $k = $t->key('damaged');
    my $uri = '/damaged/' . ++$n;
    my $a = $t->http(POST => $uri, key => $k, json => { a => 1 }, @A);
    is($a->{status}, 201, "$what: first request executes");
    my $name = $t->record_name($k, $AUTH);
    # the record is completed right after the answer went out: wait for it
    ok($t->wait_state($k, $AUTH, 'completed'), "$what: record completed");
    my $rec = $t->record($k, $AUTH);
    $t->redis('SET', $name, $damage->({ %$rec }), 'KEEPTTL');
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

sub enc { $t->encode_record($_[0]) }
sub with { my %o = @_; sub { enc({ %{ $_[0] }, %o }) } }
sub raw { my ($code) = @_; sub { local $_ = enc($_[0]); $code->(); $_ } }

damaged_case('state byte rewritten to garbage', with(raw_state => 'x'));
damaged_case('state byte says in_progress without an owner', with(raw_state => 'i'));
damaged_case('layout byte 0', raw(sub { substr($_, 0, 1) = '0' }));
damaged_case('layout byte 1 in a string', raw(sub { substr($_, 0, 1) = '1' }));
damaged_case('head cut short', raw(sub { $_ = substr($_, 0, 100) }));
damaged_case('waiters byte not 0 or 1', with(waiters => '7'));
damaged_case('operation id not hex', with(op => 'foreign-payload-' . 'z' x 16));
damaged_case('owner on a completed record', with(owner => 'a' x 32));
damaged_case('owner half dashes', with(owner => 'a' x 16 . '-' x 16));
damaged_case('status not a number', with(status => 'foreign-payload'));
damaged_case('status out of range', with(status => '999'));
damaged_case('status empty', with(status => ''));
damaged_case('status missing', with(drop => ['status']));
damaged_case('status with a leading zero', with(status => '0201'));
damaged_case('stored flag 2', with(stored => '2'));
damaged_case('body field missing', with(drop => ['body']));
damaged_case('creation time after year 9999', with(created => '253402300800000'));
damaged_case('completion time not a number', with(completed => 'foreign-payload'));
damaged_case('a netstring length with a leading zero', raw(sub { s/,(\d+):/",0$1:"/e }));
damaged_case('a netstring length beyond the value', raw(sub { s/,(\d+):/",99$1:"/e }));
damaged_case('a netstring without its comma', raw(sub { s/,$/;/ }));
damaged_case('trailing bytes after the fields', raw(sub { $_ .= '3:foreign-payload,' }));
damaged_case('fingerprint not hex', with(fp => 'g' x 64));

# the stored headers are a netstring blob inside one field: the record
# decodes, the replay refuses the blob, the status endpoint still answers
sub ns { join '', map { length($_) . ":$_," } @_ }
damaged_case('headers blob malformed', with(hdr => '12:Content-Type,99:foreign-payload,'), status_endpoint => 200);
damaged_case('headers blob with a leading zero', with(hdr => '012:Content-Type,1:x,'), status_endpoint => 200);
damaged_case('headers blob with a huge length', with(hdr => '99999999999999999999:x,1:y,'), status_endpoint => 200);
damaged_case('headers blob with an empty name', with(hdr => '0:,3:abc,'), status_endpoint => 200);
# header injection through a stored value: never a new header line on the wire
damaged_case('header value with CRLF', with(hdr => ns('X-Stuff', "a\r\nSet-Cookie: injected=foreign")),
    status_endpoint => 200,
    ok => sub {
        my ($r) = @_;
        ok(!exists $r->{headers}{'set-cookie'}, 'header value with CRLF: no injected Set-Cookie on the wire')
            or diag($t->show($r));
        ok($r->{status} == 500 || ($r->{headers}{'idempotent-replayed'} // '') eq 'true',
            "header value with CRLF: refused (500) or replayed without the injection ($r->{status})");
    });
damaged_case('header name with CRLF', with(hdr => ns("X-A\r\nSet-Cookie: injected=1", 'x')),
    status_endpoint => 200,
    ok => sub {
        my ($r) = @_;
        ok(!exists $r->{headers}{'set-cookie'}, 'header name with CRLF: no injected Set-Cookie')
            or diag($t->show($r));
    });
# another operation's fingerprint under this key: the request changed
damaged_case('fingerprint of another request', with(fp => 'f' x 64),
    status_endpoint => 200,
    ok => sub { $t->is_problem($_[0], 409, 'fingerprint-mismatch', name => 'other fingerprint: 409 mismatch') });

# ---- records of layout 1 (a hash, as earlier module versions wrote them)
# go through the layout-1 reader: damaged ones are store-error as well
sub v1_case {
    my ($what, %h) = @_;
    my $k = $t->key('v1');
    my $uri = '/v1/' . ++$n;
    my $a = $t->http(POST => $uri, key => $k, json => { a => 1 }, @A);
    is($a->{status}, 201, "v1 $what: first request executes");
    ok($t->wait_state($k, $AUTH, 'completed'), "v1 $what: record completed");
    my $rec = $t->record($k, $AUTH);
    my $name = $t->record_name($k, $AUTH);
    my %v1 = (v => 1, state => 'completed', fp => $rec->{fp}, op => $rec->{op},
        created => $rec->{created}, completed => $rec->{completed}, status => $rec->{status},
        stored => $rec->{stored}, hdr => $rec->{hdr}, body => $rec->{body}, %h);
    $t->redis('DEL', $name);
    $t->redis('HSET', $name, map { ($_ => $v1{$_}) } grep { defined $v1{$_} } sort keys %v1);
    $t->redis('PEXPIRE', $name, 600000);
    my $before = dump_key($name);
    my $r = $t->http(POST => $uri, key => $k, json => { a => 1 }, @A);
    if ($h{expect_replay}) {
        is($r->{headers}{'idempotent-replayed'}, 'true', "v1 $what: replayed") or diag($t->show($r));
        is($r->{content}, $a->{content}, "v1 $what: the same body");
    } else {
        $t->is_problem($r, 500, 'store-error', key => $k, name => "v1 $what: retry gets 500 store-error");
    }
    is($t->effects(uri => $uri), 1, "v1 $what: no second execution");
    is(dump_key($name), $before, "v1 $what: the record is not rewritten");
}
v1_case('intact', expect_replay => 1);
v1_case('state garbage', state => 'exploded');
v1_case('version 0', v => 0);
v1_case('version missing', v => undef);
v1_case('operation id missing', op => undef);
v1_case('status not a number', status => 'foreign-payload');
v1_case('status out of range', status => '999');

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
