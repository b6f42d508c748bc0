#!/usr/bin/perl
# idempotency_complete_beside on: the owner of a claim writes
# its completion with one native SET beside the record, under
# "<record key>:c:<owner token>", and no script runs on a first write. The
# completion counts only while the record is still that owner's claim: every
# reader (the claim's look, the status and admin endpoints, a renewal) sees
# it as the completed record, the first retry folds it into the record's
# place, a duplicate that waits is told of it, and a completion whose claim
# was taken away is dropped, never replayed, and logged. Records written by
# complete.lua (the setting off, or a version before it) replay the same.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(sleep);
use Idem::Test;

my $conf = <<'EOF';
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    idempotency_complete_beside on;
    proxy_ignore_client_abort on;
    location / {
        idempotency on;
        idempotency_ttl 1h;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /wait/ {
        idempotency on;
        idempotency_wait 30s;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /lease/ {
        idempotency on;
        idempotency_lease 2s;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /script/ {
        idempotency on;
        idempotency_ttl 1h;
        idempotency_complete_beside off;
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

my $t = Idem::Test->new;
$t->start_stack($conf, workers => 2);

sub beside_of { my ($rname, $owner) = @_; "$rname:c:$owner" }

# in_flight($path, $tag, $delay): a first attempt held $delay s at the
# upstream: its request, its background client, and the key beside its claim
sub in_flight {
    my ($path, $tag, $delay) = @_;
    my $key = $t->key($tag);
    my @req = (key => $key, json => { order => $tag });
    my $bg = $t->http_bg(POST => $path, @req, headers => [ 'X-Delay' => $delay ], timeout => 25);
    ok($t->wait_for(sub { $t->effects(key => $key) == 1 }, 5), "$tag: the first attempt is at the upstream");
    my $owner = ($t->record($key) // {})->{owner} // '';
    return (\@req, $bg, beside_of($t->record_name($key), $owner));
}

# ---- a first write: native claim, native completion beside the claim
my $k = $t->key('beside');
my @req = (key => $k, json => { order => 'beside' });
my $rname = $t->record_name($k);
my $before = $t->command_calls('evalsha');
my $r1 = $t->http(POST => '/orders', @req);
is($r1->{status}, 201, 'first write executes');
is($t->effects(key => $k), 1, 'one effect');
my $raw = $t->record($k, undef, raw => 1) // {};
is($raw->{state}, 'in_progress', 'the record key still holds the claim');
like($raw->{owner} // '', qr/^[0-9a-f]{32}$/, '... naming its owner token');
my $done = beside_of($rname, $raw->{owner} // '');
my $c = $t->decode_record(scalar $t->redis('GET', $done)) // {};
is($c->{state}, 'completed', 'the completion is beside it, under <record key>:c:<owner>');
is($c->{status}, 201, '... with the upstream\'s status');
is($c->{body}, $r1->{content}, '... and its body');
my $cttl = $t->redis('PTTL', $done);
ok($cttl > 3_500_000 && $cttl <= 3_600_000, "its TTL is idempotency_ttl from the completion ($cttl ms)");
is($t->command_calls('evalsha') - $before, 0, 'no script ran for the first write (INFO commandstats)');
is(($t->record($k) // {})->{state}, 'completed', 'read as the reader reads it: completed');

# ---- readers see the completion before anything folds it
my $st = $t->http(GET => '/status', key => $k);
is($st->{status}, 200, 'status endpoint answers') or diag($t->show($st));
like($st->{content}, qr/"state":"completed"/, 'status: completed');
$t->is_problem($t->http(POST => '/admin?action=release', key => $k), 409, 'not-resolvable',
    state => 'completed', name => 'admin release of a completion beside its claim -> 409 not-resolvable');
my $pttl = $t->redis('PTTL', $rname);
is($t->redis('EVAL', $t->script_text('renew'), 1, $rname, $raw->{owner}, 3_600_000), 0,
   'renew.lua with the owner token -> 0: completed, nothing to renew');
ok($t->redis('PTTL', $rname) <= $pttl, 'the claim\'s TTL was not set again');
is_deeply($t->redis('EVAL', $t->script_text('approve'), 1, $rname, $raw->{op}, $raw->{fp}, 'ops', 60000),
          [ 'refused', 'completed' ], 'approve.lua: refused, the operation is completed');
is($t->redis('EXISTS', $done), 1, 'nothing folded yet');

# ---- the first retry replays and folds the completion into the record
my $r2 = $t->http(POST => '/orders', @req);
is($r2->{status}, 201, 'retry: 201');
is($r2->{headers}{'idempotent-replayed'}, 'true', 'retry: replayed');
is($r2->{content}, $r1->{content}, 'retry: the same body');
is($t->effects(key => $k), 1, 'still one effect');
my $folded = $t->record($k, undef, raw => 1) // {};
is($folded->{state}, 'completed', 'the record key now holds the completion');
is($folded->{body}, $r1->{content}, '... the same one');
is($t->redis('EXISTS', $done), 0, 'the key beside it is gone');
ok($folded->{pttl} > 0 && $folded->{pttl} <= $cttl, "the record keeps the completion's TTL ($folded->{pttl} ms)");
my $r3 = $t->http(POST => '/orders', @req);
is($r3->{headers}{'idempotent-replayed'}, 'true', 'next retry: replayed from the record');
$t->is_problem($t->http(POST => '/orders', key => $k, json => { order => 'changed' }), 409,
    'fingerprint-mismatch', name => 'a changed request under the key -> 409 fingerprint-mismatch');
is($t->effects(key => $k), 1, 'one effect after three retries');

# ---- a duplicate that waits is told of the completion
my ($wreq, $first, $wdone) = in_flight('/wait/orders', 'beside-wait', 1.5);
my $kw = $wreq->[1];
my $dup = $t->http_bg(POST => '/wait/orders', @$wreq, timeout => 25);
ok($t->wait_for(sub { ($t->redis('GET', $wdone) // '') eq 'w' }, 5),
   'the waiter marked the claim: "w" beside it');
my $f = $first->result(25);
my $d = $dup->result(25);
is($f && $f->{status}, 201, 'first attempt: 201');
is($d && $d->{status}, 201, 'the waiter: 201, before its 30 s wait ran out');
is($d && $d->{headers}{'idempotent-replayed'}, 'true', 'the waiter: replayed');
is($d && $d->{content}, $f && $f->{content}, 'the waiter: the same body');
is($t->effects(key => $kw), 1, 'one effect');
ok($t->wait_for(sub { ($t->record($kw, undef, raw => 1) // {})->{state} eq 'completed'
                      && !$t->redis('EXISTS', $wdone) }, 5),
   'the waiter\'s look folded the completion');

# ---- a completion whose claim was taken away lands where nobody reads
my ($lreq, $bg, $ldone) = in_flight('/lease/orders', 'beside-lost', 1);
my $kl = $lreq->[1];
# what claim.lua or the admin endpoint leave for an owner whose claim they took
is($t->redis('SET', $ldone, 'x', 'PX', 60000), 'OK', 'the claim is marked as taken ("x")');
my $lr = $bg->result(20);
is($lr && $lr->{status}, 201, 'its client still gets the upstream\'s answer');
ok($t->wait_for(sub { $t->error_log =~ /idempotency: complete script: the claim was no longer held by this request/ }, 5),
   'the owner logs that its completion was not recorded');
ok($t->wait_for(sub { ($t->redis('GET', $ldone) // '') eq 'x' }, 5),
   'and puts the mark back in place of its unread completion');
is(($t->record($kl) // {})->{state}, 'in_progress', 'the record is not completed by it');
sleep 2.2;      # the lease (2 s) lapses: nobody renews a finished claim
my $lu = $t->http(POST => '/lease/orders', @$lreq);
$t->is_problem($lu, 409, 'outcome-unknown', key => $kl, state => 'unknown',
    name => 'the retry: 409 outcome-unknown, never its replay');
is($t->redis('GET', $ldone), 'x', 'the lapse leaves "x" for a late completion');
is($t->effects(key => $kl), 1, 'one effect, nothing executed again');

# ---- a value beside the claim that is no mark of ours: the completion
# replaces it and counts (the record still names its owner); the owner logs
# the answer it did not expect
my ($zreq, $zbg, $zdone) = in_flight('/orders', 'beside-foreign', 1);
my $kz = $zreq->[1];
is($t->redis('SET', $zdone, 'zz', 'PX', 60000), 'OK', 'a foreign value beside the claim');
my $z1 = $zbg->result(25);
is($z1 && $z1->{status}, 201, 'its client gets the upstream\'s answer');
ok($t->wait_for(sub { $t->error_log =~ /idempotency: unexpected reply to the complete script/ }, 5),
   'the owner logs the unexpected answer');
my $z2 = $t->http(POST => '/orders', @$zreq);
is($z2->{headers}{'idempotent-replayed'}, 'true', 'the retry replays the completion');
is($z2->{content}, $z1 && $z1->{content}, '... with its body');
is($t->effects(key => $kz), 1, 'one effect');

# ---- records written by complete.lua (the setting off, or an older version):
# a second nginx with the setting off shares the Redis and the upstream, as
# hosts mid-way through the upgrade docs/directives.md describes
(my $off_conf = $conf) =~ s/idempotency_complete_beside on;/idempotency_complete_beside off;/;
my $t2 = Idem::Test->new;
$t2->{redis_port} = $t->{redis_port};
$t2->{upstream_port} = $t->{upstream_port};
$t2->start_nginx($off_conf, workers => 1);
my $ks = $t->key('beside-script');
my @sreq = (key => $ks, json => { order => 'script' });
$before = $t->command_calls('evalsha');
my $s1 = $t2->http(POST => '/orders', @sreq);
is($s1->{status}, 201, 'complete_beside off (the default): executes');
is($t->command_calls('evalsha') - $before, 1, '... and complete.lua ran (one EVALSHA)');
is(($t->record($ks, undef, raw => 1) // {})->{state}, 'completed', '... into the record key itself');
is_deeply([ $t->redis_keys($t->record_name($ks) . ':c:*') ], [], '... nothing beside it');
my $s2 = $t2->http(POST => '/orders', @sreq);
is($s2->{headers}{'idempotent-replayed'}, 'true', 'replayed where it was written');
my $s3 = $t->http(POST => '/orders', @sreq);
is($s3->{headers}{'idempotent-replayed'}, 'true', 'replayed where the completion goes beside');
is($s3->{content}, $s1->{content}, '... the same body');
my $kb = $t->key('beside-read-off');
my @breq = (key => $kb, json => { order => 'read by off' });
my $b1 = $t->http(POST => '/orders', @breq);
is(($t->record($kb, undef, raw => 1) // {})->{state}, 'in_progress', 'a completion beside its claim ...');
my $b2 = $t2->http(POST => '/orders', @breq);
is($b2->{headers}{'idempotent-replayed'}, 'true', '... replays where the setting is off');
is($b2->{content}, $b1->{content}, '... the same body');
is($t->effects(key => $ks) + $t->effects(key => $kb), 2, 'one effect each');

$t2->check_logs;
$t->check_logs;
done_testing;
