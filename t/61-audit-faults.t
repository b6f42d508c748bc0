#!/usr/bin/perl
# idempotency_audit when something fails: a state change and its entries
# are all or nothing.
#   - a script that loses the race for the stream's head (or whose time is
#     off) writes nothing: the record and the stream are as they were;
#   - Redis down: the audited request gets the same 503 as the one without
#     audit, and nothing of it is in Redis afterwards; the retry executes;
#   - Redis full (OOM): 503, nothing written; once Redis can write, the
#     retry executes;
#   - Redis restarted while a request is at the upstream: its completion
#     (kept, sent again) and its entries land once;
#   - the stream's key holds another type: refused, nothing written;
#   - through the least ACL user of docs/redis.md: Redis refuses nothing,
#     also when every entry was deleted (the scripts then look up the
#     stream's last ID, and the next entries leave the gap in the stream).
# Every entry verifies at the end, and idempotency_audit_appends_total
# counts exactly the entries in the stream.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $t = Idem::Test->new;
$t->start_redis(appendonly => 1, args => [ '--maxmemory-policy', 'noeviction' ]);
my $ACL = 'idem on >acl-pw-1 ~idem:* &idem:done +evalsha +eval +script|load +select +subscribe '
        . '+set +get +pttl +pexpire +del +type +time +publish +hmget +hset +hdel '
        . '+xadd +xrevrange +xinfo|stream +exists';
is($t->redis('ACL', 'SETUSER', split ' ', $ACL), 'OK', 'the ACL user of docs/redis.md, with the audit\'s commands');
$t->start_upstream;
$t->start_nginx(<<'EOF', workers => 1);
idempotency_metrics_zone idem 64k;
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%% timeout=2s;
    proxy_ignore_client_abort on;
    location /acl/ {
        idempotency on;
        idempotency_redis %%REDIS%% user=idem password=acl-pw-1;
        idempotency_audit on;
        idempotency_audit_stream idem:acl;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /a/ {
        idempotency on;
        idempotency_audit on;
        idempotency_audit_stream idem:f;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /n/ {
        idempotency on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /wrongtype/ {
        idempotency on;
        idempotency_audit on;
        idempotency_audit_stream idem:not-a-stream;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /metrics {
        idempotency_metrics;
    }
}
EOF

sub xlen { my $n = $t->redis('XLEN', $_[0] // 'idem:f'); ref $n ? -1 : $n }
sub events { [ map { $_->{event} } grep { $_->{key} eq $_[0] } @{ $t->audit_entries('idem:f') } ] }

# ---- a lost race writes nothing
{
    my $k = $t->key('race');
    my $bg = $t->http_bg(POST => '/a/x', key => $k, json => {}, headers => [ 'X-Delay' => 1.5 ]);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'a claim in flight');
    my $rec = $t->record($k);
    my $name = $t->record_name($k);
    my $n = xlen();
    my $top = $t->redis('XREVRANGE', 'idem:f', '+', '-', 'COUNT', 1)->[0];
    my ($seq) = $top->[0] =~ /^(\d+)/;
    my $head = { @{ $top->[1] } }->{h};
    my $done = $t->encode_record({ %$rec, state => 'completed', owner => undef, completed => $rec->{created},
                                   status => 200, stored => 1, resolved => 0, hdr => '', body => 'forged' });
    my $e = $t->audit_encode({ seq => $seq + 1, prev => $head,
                               events => [ { time => int(time * 1000), event => 'completed', key => $k } ] });
    my @entry = ($t->audit_digest($e), $e);
    my $now = int(time * 1000);

    for my $c (
        [ 'a stale head', 1, 'f' x 64, $now ],
        [ 'a wrong sequence number', 5, $head, $now ],
        [ 'a time an hour off', 0, $head, $now - 3_600_000 ],
    ) {
        my ($what, $plus, $prev, $when) = @$c;
        my $r = $t->redis('EVAL', $t->script_text('complete'), 3, $name, 'idem:f', 'idem:f:head',
                          $rec->{owner}, $done, 60000, '', $seq + 1 + $plus, "$seq:$prev", $when, @entry);
        is(ref $r && $r->[0], 'audit-head', "complete.lua with $what: audit-head");
        is($r->[1], $seq, "... which names the head ($seq)");
        my $after = $t->record($k);
        is_deeply([ @$after{qw(state owner)} ], [ 'in_progress', $rec->{owner} ], '... and the claim is as it was');
        is(xlen(), $n, '... and nothing was appended');
    }

    my $free = $t->key('race-free');
    my $fname = $t->record_name($free);
    my $claim = $t->encode_record({ %$rec, op => 'a' x 32, owner => 'b' x 32 });
    my $r = $t->redis('EVAL', $t->script_text('claim'), 6, $fname, '', '', '', 'idem:f', 'idem:f:head',
                      $rec->{fp}, 'b' x 32, $claim, 60000, '0', '', '0', '', '', '',
                      'claim', $seq + 7, "$seq:$head", $now, @entry);
    is(ref $r && $r->[0], 'audit-head', 'claim.lua of a free key on a stale head: audit-head');
    ok(!defined $t->redis('GET', $fname), '... and the key is still free');
    $r = $t->redis('EVAL', $t->script_text('claim'), 6, $fname, '', '', '', 'idem:f', 'idem:f:head',
                   $rec->{fp}, 'b' x 32, $claim, 60000, '0', '', '0', '', '', '', '-', $seq + 1, "$seq:$head", $now);
    is(ref $r && "$r->[0] $r->[2]", 'audit-decide claim', 'claim.lua asked to decide: it would claim');
    ok(!defined $t->redis('GET', $fname), '... and wrote nothing');
    is(xlen(), $n, 'the stream is as it was');

    # claimnew.lua takes the record first (SET NX) and gives it back when
    # its entry cannot go in: a stale head, a wrong sequence number, an
    # error inside the audit's part (a head key of another type)
    for my $c ([ 'a stale head', $seq + 7, "$seq:$head" ],
               [ 'a head the head key does not hold', $seq + 1, "$seq:" . ('f' x 32) ]) {
        my ($what, $id, $h) = @$c;
        $r = $t->redis('EVAL', $t->script_text('claimnew'), 3, $fname, 'idem:f', 'idem:f:head',
                       $claim, 60000, 'claim', $id, $h, $now, @entry);
        is(ref $r && $r->[0], 'audit-head', "claimnew.lua of a free key on $what: audit-head");
        ok(!defined $t->redis('GET', $fname), '... and the key is free again');
        is(xlen(), $n, '... and nothing was appended');
    }
    my $hv = $t->redis('GET', 'idem:f:head');
    $t->redis('DEL', 'idem:f:head');
    $t->redis('HSET', 'idem:f:head', 'x', 1);
    $r = $t->redis('EVAL', $t->script_text('claimnew'), 3, $fname, 'idem:f', 'idem:f:head',
                   $claim, 60000, 'claim', $seq + 1, "$seq:$head", $now, @entry);
    like("$r", qr/WRONGTYPE/, 'claimnew.lua with a head key of another type: the error');
    ok(!defined $t->redis('GET', $fname), '... and the key is free again');
    is(xlen(), $n, '... and nothing was appended');
    $t->redis('DEL', 'idem:f:head');
    $t->redis('SET', 'idem:f:head', $hv) if defined $hv;
    $r = $t->redis('EVAL', $t->script_text('claimnew'), 3, $name, 'idem:f', 'idem:f:head',
                   $claim, 60000, 'claim', $seq + 1, "$seq:$head", $now, @entry);
    is(ref $r && "@$r", 'audit-look', 'claimnew.lua of a taken key: audit-look');

    # the head key is checked and moved on in one call (SET ... GET), and
    # put back as it was when the entry does not go in: here the head key
    # says 1, and an entry 2 was added without it (an older module)
    my ($g, $gh) = ('idem:g', 'idem:g:head');
    $t->redis('XADD', $g, '1-0', 'h', 'a' x 32, 'e', 'x');
    $t->redis('SET', $gh, '1:' . ('a' x 32));
    $t->redis('XADD', $g, '2-0', 'h', 'b' x 32, 'e', 'y');
    $r = $t->redis('EVAL', $t->script_text('claimnew'), 3, $fname, $g, $gh,
                   $claim, 60000, 'claim', 2, '1:' . ('a' x 32), '', @entry);
    is(ref $r && "$r->[0] $r->[1] $r->[2]", 'audit-head 2 ' . ('b' x 32),
       'claimnew.lua on the head key when the stream is past it: audit-head, the stream\'s last entry');
    is($t->redis('GET', $gh), '1:' . ('a' x 32), '... the head key as it was');
    is($t->redis('XLEN', $g), 2, '... nothing appended');
    ok(!defined $t->redis('GET', $fname), '... and the key is free again');
    $t->redis('DEL', $gh);
    $r = $t->redis('EVAL', $t->script_text('claimnew'), 3, $fname, $g, $gh,
                   $claim, 60000, 'claim', 2, '1:' . ('a' x 32), '', @entry);
    is(ref $r && "$r->[0] $r->[1]", 'audit-head 2', 'the same without a head key: audit-head');
    is($t->redis('EXISTS', $gh), 0, '... and still no head key');
    is($t->redis('XLEN', $g), 2, '... nothing appended');
    $t->redis('DEL', $g);
    is($t->record($k)->{owner}, $rec->{owner}, '... and the claim is as it was');
    is(xlen(), $n, '... and nothing was appended');

    is(($bg->result(10) // {})->{status}, 201, 'the request in flight completes');
    ok($t->wait_state($k, undef, 'completed'), 'recorded');
    is_deeply(events($k), [qw(attempted sent accepted completed)], 'its entries: once each');
}

# ---- Redis down: the same 503 with and without audit, nothing half-written
{
    my $n = xlen();
    $t->stop_redis;
    my %p;
    for my $loc (qw(a n)) {
        my $k = $t->key("down-$loc");
        my $r = $t->http(POST => "/$loc/x", key => $k, json => { down => 1 });
        $t->is_problem($r, 503, 'store-unavailable', key => $k, retry_after => 1,
                       name => "/$loc/: Redis down -> 503 store-unavailable");
        my $p = $t->problem($r) // {};
        delete @$p{qw(idempotency_key operation_id)};
        $p{$loc} = [ $r->{status}, $r->{headers}{'retry-after'}, $p ];
        $p{"k$loc"} = $k;
    }
    is_deeply($p{a}, $p{n}, 'the audited location answers exactly as the other');
    $t->start_redis;
    is(xlen(), $n, 'Redis back: the stream has nothing of the refused request');
    ok(!$t->record($p{ka}), 'and no record');
    my ($r) = $t->retry_until_final('/a/x', 10, key => $p{ka}, json => { down => 1 });
    is($r->{status}, 201, 'the retry executes');
    ok($t->wait_state($p{ka}, undef, 'completed'), 'recorded');
    is_deeply(events($p{ka}), [qw(attempted sent accepted completed)], 'its entries, once');
    is($t->effects(key => $p{ka}), 1, 'one effect');
}

# ---- Redis full: 503, nothing written
{
    my $n = xlen();
    my $k = $t->key('oom');
    is($t->redis('CONFIG', 'SET', 'maxmemory', 1), 'OK', 'maxmemory 1: every write refused');
    my $r = $t->http(POST => '/a/x', key => $k, json => { oom => 1 });
    $t->is_problem($r, 503, 'store-unavailable', key => $k, name => 'OOM: 503 store-unavailable');
    is($t->redis('CONFIG', 'SET', 'maxmemory', 0), 'OK', 'maxmemory 0');
    is(xlen(), $n, 'nothing appended');
    ok(!$t->record($k), 'no record');
    ($r) = $t->retry_until_final('/a/x', 10, key => $k, json => { oom => 1 });
    is($r->{status}, 201, 'once Redis can write, the retry executes');
    ok($t->wait_state($k, undef, 'completed'), 'recorded');
    is_deeply(events($k), [qw(attempted sent accepted completed)], 'its entries, once');
    is($t->effects(key => $k), 1, 'one effect');
}

# ---- Redis restarted while the request is at the upstream
{
    my $k = $t->key('restart');
    my $bg = $t->http_bg(POST => '/a/x', key => $k, json => {}, headers => [ 'X-Delay' => 1 ]);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'at the upstream');
    $t->stop_redis;
    ok($t->wait_for(sub { scalar $t->upstream_responses(key => $k) }, 5), 'the upstream answered');
    $t->start_redis;
    my $r = $bg->result(15);
    is($r && $r->{status}, 201, 'the client gets the upstream\'s answer');
    ok($t->wait_state($k, undef, 'completed', 10), 'the completion, kept, lands once Redis is back');
    is_deeply(events($k), [qw(attempted sent accepted completed)], 'its entries, once each');
    is($t->effects(key => $k), 1, 'one effect');
}

# ---- the stream's key holds a string
{
    is($t->redis('SET', 'idem:not-a-stream', 'x'), 'OK', 'idem:not-a-stream is a string');
    my $k = $t->key('wrongtype');
    my $r = $t->http(POST => '/wrongtype/x', key => $k, json => {});
    like($r->{status}, qr/^5\d\d$/, "refused ($r->{status})");
    ok(!$t->record($k), 'no record');
    is($t->effects(key => $k), 0, 'not executed');
}

# ---- through the ACL user: refused nothing, also after every entry was deleted
{
    # (the restarts above lost it: ACL users are configuration, not data)
    is($t->redis('ACL', 'SETUSER', split ' ', $ACL), 'OK', 'the ACL user again');
    my $k = $t->key('acl');
    my ($r) = $t->retry_until_final('/acl/x', 10, key => $k, json => {});
    is($r->{status}, 201, 'ACL user: executes');
    ok($t->wait_state($k, undef, 'completed'), 'recorded');
    is($t->http(POST => '/acl/x', key => $k, json => {})->{headers}{'idempotent-replayed'}, 'true', 'replays');
    my $n = xlen('idem:acl');
    is($n, 3, 'three entries (the claim\'s, the completion\'s, the replay\'s)');
    $t->redis('XDEL', 'idem:acl', map { "$_-0" } 1 .. $n);
    is(xlen('idem:acl'), 0, 'every entry deleted (the stream keeps its last ID)');
    my $k2 = $t->key('acl-2');
    ($r) = $t->retry_until_final('/acl/x', 10, key => $k2, json => {});
    is($r->{status}, 201, 'ACL user: the next write executes');
    ok($t->wait_state($k2, undef, 'completed'), 'recorded');
    is_deeply([ map { $_->{seq} } @{ $t->audit_stream('idem:acl') } ], [ 4 .. 5 ],
        'its entries come after the deleted ones');
    my ($rc, $out) = $t->audit_tool('--stream', 'idem:acl', 'verify');
    like($out, qr/^entry 1: missing: entries 1 to 3 are not in the stream/m, 'verify names the deleted entries');
    my $log = $t->redis('ACL', 'LOG');
    # (not the AUTH refused while the restarts had lost the user)
    my @refused = ref $log eq 'ARRAY'
        ? grep { my %e = @$_; ($e{username} // '') eq 'idem' && ($e{reason} // '') ne 'auth' } @$log
        : ('no ACL LOG');
    is(scalar @refused, 0, 'ACL LOG: Redis refused the user nothing') or diag(explain \@refused);
}

# ---- the stream's head key (audit.lua): "<seq>:<h>" of the last entry the
# module appended, read instead of the stream's last entry; without it the
# stream says where its head is, and the key is set again. Redis's TIME is
# called with a worker's first command of each second, not in every script.
sub head_of {
    my $top = $t->redis('XREVRANGE', $_[0], '+', '-', 'COUNT', 1)->[0];
    my ($seq) = $top->[0] =~ /^(\d+)/;
    return "$seq:" . { @{ $top->[1] } }->{h};
}
{
    is($t->redis('GET', 'idem:f:head'), head_of('idem:f'), 'the head key: the last entry\'s seq and h');
    $t->redis('CONFIG', 'RESETSTAT');
    my $start = time;
    for my $i (1 .. 5) {
        my $k = $t->key("head-$i");
        $t->redis('DEL', 'idem:f:head') if $i == 3;
        is($t->http(POST => '/a/x', key => $k, json => {})->{status}, 201, "first write $i" . ($i == 3 ? ' (the head key deleted before it)' : ''));
        ok($t->wait_state($k, undef, 'completed'), 'recorded');
        is_deeply(events($k), [qw(attempted sent accepted completed)], '... its entries');
    }
    my $secs = time - $start;
    is($t->redis('GET', 'idem:f:head'), head_of('idem:f'), 'the head key set again');
    my ($time) = $t->redis('INFO', 'commandstats') =~ /cmdstat_time:calls=(\d+)/;
    my ($scripts) = $t->redis('INFO', 'commandstats') =~ /cmdstat_evalsha:calls=(\d+)/;
    cmp_ok($time // 0, "<=", int($secs) + 3,
           "TIME: at most once a second and once for the missing head key ($scripts scripts in ${\ sprintf('%.1f', $secs)} s)");
}

my ($rc, $out, $err) = $t->audit_tool('--stream', 'idem:f', 'verify');
is($rc, 0, 'verify: intact') or diag("$out$err");
my ($appends) = $t->http(GET => '/metrics')->{content} =~ /^idempotency_audit_appends_total (\d+)$/m;
is($appends, xlen() + 5, 'idempotency_audit_appends_total = the entries of both streams (three deleted)');

$t->check_logs;
done_testing;
