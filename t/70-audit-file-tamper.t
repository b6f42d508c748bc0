#!/usr/bin/perl
# The audit file device under attack and on a failing disk (docs/audit.md,
# "The file device").
#   - Tampering with the file, on a SHA-256 chain and on an HMAC chain
#     (idempotency_audit_key): a changed byte, a deleted line, two lines
#     swapped, a forged line put in, the tail cut (at a line's end, and
#     inside a line) and the module appending after it: `verify --file`
#     exits 1 and names the file and line; a forged line hashed without the
#     key is "wrong HMAC". The untouched file verifies.
#   - Fail closed: the file moved to a failing device (a symlink to
#     /dev/full, reopened with USR1): first writes get 503 audit-unavailable
#     with Retry-After and never reach the upstream (effect 0); a replay of a
#     recorded key still answers; the failures are counted in
#     idempotency_audit_errors_total{device="file"} and logged at alert.
#     A write whose completion comes after the disk failed still answers
#     and completes (its retry replays), counted and logged at alert.
#     Lines are format version 2, one per step: a first write is two lines.
#     Back on a disk (USR1 again), the refused keys execute once, and
#     `verify --file` passes across the three files: the lines that could
#     not be written are not in the chain.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $t = Idem::Test->new;
my $P = $t->prefix;
my $KEYFILE = "$P/audit.key";
Idem::Test::_spew($KEYFILE, 'k' x 40);
my ($PLAIN, $KEYED, $FULL) = ("$P/plain.log", "$P/keyed.log", "$P/full.log");

$t->start_stack(<<"EOF", workers => 2);
idempotency_metrics_zone idem 64k;
server {
    listen 127.0.0.1:%%PORT%%;
    location /plain {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_audit file=$PLAIN;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /keyed {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_audit file=$KEYED fsync=2;
        idempotency_audit_key $KEYFILE;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /full {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_audit file=$FULL;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /metrics {
        idempotency_metrics;
    }
}
EOF

for my $loc (qw(plain keyed)) {
    for my $i (1 .. 4) {
        my $k = $t->key("$loc-$i");
        my $r = $t->http(POST => "/$loc/x", key => $k, json => { i => $i });
        is($r->{status}, 201, "$loc: write $i");
        $t->wait_state($k, '', 'completed');
        $r = $t->http(POST => "/$loc/x", key => $k, json => { i => $i });
        is($r->{headers}{'idempotent-replayed'}, 'true', "$loc: its replay");
    }
}

sub lines { my ($f) = @_; [ split /(?<=\n)/, Idem::Test::_slurp($f) ] }

sub verify {
    my ($text, @args) = @_;
    my $f = "$P/tampered.log";
    Idem::Test::_spew($f, $text);
    my ($rc, $out, $err) = $t->audit_tool('verify', '--file', $f, @args);
    return ($rc, $out . $err);
}

# a line as the module would write it, hashed by someone without the key
sub forge {
    my ($line, %set) = @_;
    return $t->audit_file_forge({ %{ decode_json($line) }, %set }) . "\n";
}

for my $case ([ $PLAIN, [] ], [ $KEYED, [ '--key-file', $KEYFILE ] ]) {
    my ($file, $key) = @$case;
    my $what = @$key ? 'HMAC chain' : 'SHA-256 chain';
    my $orig = lines($file);
    my $n = @$orig;
    is($n, 12, "$what: 12 lines (4 x [attempted sent] [accepted completed] [attempted replayed])");
    my ($rc, $out) = verify(join('', @$orig), @$key);
    is($rc, 0, "$what: the untouched file verifies") or diag($out);

    # a changed byte
    my @l = @$orig;
    $l[3] =~ s/"event":"attempted"/"event":"attempteD"/ or die;
    ($rc, $out) = verify(join('', @l), @$key);
    is($rc, 1, "$what: a changed byte: exit 1");
    like($out, qr/tampered\.log:4: modified: not an entry the module writes: "event" is not an event/, "$what: names line 4")
        or diag($out);
    @l = @$orig;
    $l[4] =~ s/"identity":""/"identity":"x"/ or die;
    ($rc, $out) = verify(join('', @l), @$key);
    like($out, qr/tampered\.log:5: modified: its (hash|HMAC) does not match its fields/, "$what: a changed value: line 5")
        or diag($out);
    @l = @$orig;
    $l[4] =~ s/("event":"accepted"[^}]*"time":\d+)(\d)/$1 . (($2 + 1) % 10)/e or die;
    ($rc, $out) = verify(join('', @l), @$key);
    like($out, qr/tampered\.log:5: modified: its (hash|HMAC) does not match its fields/,
         "$what: the time of one event of a line changed: line 5") or diag($out);

    # a deleted line
    @l = @$orig;
    splice @l, 5, 1;
    ($rc, $out) = verify(join('', @l), @$key);
    is($rc, 1, "$what: a deleted line: exit 1");
    like($out, qr/tampered\.log:6: missing: entry 7 follows entry 5: entries 6 to 6 are not there/,
         "$what: names line 6") or diag($out);

    # the first line deleted: the file no longer starts at entry 1
    @l = @$orig;
    shift @l;
    ($rc, $out) = verify(join('', @l), @$key);
    like($out, qr/tampered\.log:1: missing: the first line is entry 2/, "$what: the first line deleted: line 1")
        or diag($out);
    ($rc, $out) = verify(join('', @l), @$key, '--partial');
    is($rc, 0, "$what: --partial takes a series that starts later") or diag($out);

    # two lines swapped
    @l = @$orig;
    @l[6, 7] = @l[7, 6];
    ($rc, $out) = verify(join('', @l), @$key);
    is($rc, 1, "$what: two lines swapped: exit 1");
    like($out, qr/tampered\.log:7: missing: entry 8 follows entry 6/, "$what: names line 7") or diag($out);

    # a forged line put in: chained on the line before it, hashed anew
    @l = @$orig;
    my $prev = decode_json($l[7])->{hash};
    splice @l, 8, 0, forge($l[8], identity => 'mallory', prev => $prev, seq => 9);
    ($rc, $out) = verify(join('', @l), @$key);
    is($rc, 1, "$what: a forged line put in: exit 1");
    if (@$key) {
        like($out, qr/tampered\.log:9: wrong HMAC: its hash is a plain SHA-256/, "$what: the forged line 9: wrong HMAC")
            or diag($out);
    } else {
        like($out, qr/tampered\.log:10: reordered: entry 9 follows entry 9/, "$what: line 10 repeats entry 9")
            or diag($out);
    }

    # a forged line replacing one (same place, same chain link)
    @l = @$orig;
    $l[9] = forge($l[9], identity => 'mallory');
    ($rc, $out) = verify(join('', @l), @$key);
    if (@$key) {
        like($out, qr/tampered\.log:10: wrong HMAC/, "$what: a line replaced: wrong HMAC at line 10") or diag($out);
    } else {
        like($out, qr/tampered\.log:11: modified: entry 11 is chained on another hash than the previous line's/,
             "$what: a line replaced: line 11 was chained on another") or diag($out);
    }
    # without the key, an HMAC file does not verify
    if (@$key) {
        ($rc, $out) = verify(join('', @$orig));
        like($out, qr/tampered\.log:1: modified: its hash does not match its fields \(a file written with idempotency_audit_key needs --key-file\)/,
             "$what: verified without --key-file: says so") or diag($out);
    }
}

# the tail cut, then the module appends after it (its head is in memory)
{
    my $orig = lines($PLAIN);
    Idem::Test::_spew($PLAIN, join '', @$orig[0 .. 9]);
    my $k = $t->key('after-cut');
    my $r = $t->http(POST => '/plain/x', key => $k, json => { cut => 1 });
    is($r->{status}, 201, 'cut at a line\'s end: the next write');
    $t->wait_state($k, '', 'completed');
    my ($rc, $out, $err) = $t->audit_tool('verify', '--file', $PLAIN);
    is($rc, 1, 'the tail cut at a line\'s end, appended after: exit 1');
    like($out, qr/plain\.log:11: missing: entry 13 follows entry 10: entries 11 to 12 are not there/,
         'names line 11, the first written after the cut') or diag("$out$err");

    my $text = join '', @$orig;
    Idem::Test::_spew($PLAIN, substr($text, 0, length($text) - 40));
    $k = $t->key('after-cut2');
    $r = $t->http(POST => '/plain/x', key => $k, json => { cut => 2 });
    is($r->{status}, 201, 'cut inside a line: the next write');
    $t->wait_state($k, '', 'completed');
    ($rc, $out, $err) = $t->audit_tool('verify', '--file', $PLAIN);
    like($out, qr/plain\.log:12: modified: not an entry the module writes: not a JSON object/,
         'the tail cut inside a line, appended after: the joined line is named') or diag("$out$err");
}

# ---- fail closed: the file on a failing device
my $k0 = $t->key('full-before');
my $r = $t->http(POST => '/full/x', key => $k0, json => { a => 1 });
is($r->{status}, 201, 'full: a first write while the disk works');
$t->wait_state($k0, '', 'completed');
rename $FULL, "$FULL.1" or die;
symlink '/dev/full', $FULL or die;
kill 'USR1', $t->nginx_pid;
sleep 1;

my @refused;
for my $i (1 .. 4) {
    my $k = $t->key("full-$i");
    $r = $t->http(POST => '/full/x', key => $k, json => { a => $i });
    push @refused, $k;
    is($r->{status} . ' ' . $t->ptype($r), '503 audit-unavailable', "full: first write $i: 503 audit-unavailable")
        or diag($t->show($r));
    ok($r->{headers}{'retry-after'}, "full: first write $i: Retry-After");
    is($t->effects(key => $k), 0, "full: first write $i: never executed");
}
$r = $t->http(POST => '/full/x', key => $k0, json => { a => 1 });
is("$r->{status} $r->{headers}{'idempotent-replayed'}", '201 true', 'full: a replay still answers');
my $m = $t->http(GET => '/metrics');
my ($errors) = $m->{content} =~ /^idempotency_audit_errors_total\{device="file"\} (\d+)$/m;
cmp_ok($errors, '>=', 5, "full: idempotency_audit_errors_total{device=\"file\"} = $errors");
like($t->error_log, qr/\[alert\].*the audit file could not record the claim of key "\Q$refused[0]\E"; it is released and answered 503/,
     'full: each refusal logged at alert');

# an entry after execution that cannot be written: the record completes anyway
unlink $FULL;
kill 'USR1', $t->nginx_pid;
sleep 1;
my $kslow = $t->key('full-slow');
my $bg = $t->http_bg(POST => '/full/x', key => $kslow, json => { slow => 1 }, headers => [ 'X-Delay' => 2 ]);
ok($t->wait_for(sub { $t->effects(key => $kslow) == 1 }, 5), 'full: a slow write claimed (recorded) and at the upstream');
rename $FULL, "$FULL.2" or die;
symlink '/dev/full', $FULL or die;
kill 'USR1', $t->nginx_pid;
is(($bg->result(15) // {})->{status}, 201, 'full: the disk failed meanwhile: the write still answers 201');
ok($t->wait_state($kslow, '', 'completed'), 'full: and its record is completed');
$r = $t->http(POST => '/full/x', key => $kslow, json => { slow => 1 });
is("$r->{status} $r->{headers}{'idempotent-replayed'}", '201 true', 'full: its retry replays');
$m = $t->http(GET => '/metrics');
my ($errors2) = $m->{content} =~ /^idempotency_audit_errors_total\{device="file"\} (\d+)$/m;
cmp_ok($errors2, '>=', $errors + 2, "full: the completion's and the replay's failures counted ($errors2)");
like($t->error_log, qr/\[alert\].*write\(\) of 1 audit entries to "\Q$FULL\E" failed/,
     'full: logged at alert (the completion\'s one line)');
is(join(' ', map { "$_->{line}:$_->{event}" } @{ $t->audit_file_events("$FULL.2") }), '1:attempted 1:sent',
   'full: the file before the failure has the claim, one line; its end is not in the chain');

unlink $FULL;
kill 'USR1', $t->nginx_pid;
sleep 1;
for my $k (@refused) {
    $r = $t->http(POST => '/full/x', key => $k, json => { a => 1 });
    is($r->{status}, 201, "full: back on a disk, $k executes");
    $t->wait_state($k, '', 'completed');
    is($t->effects(key => $k), 1, "full: $k: once");
}
my ($rc, $out, $err) = $t->audit_tool('verify', "$FULL.1", "$FULL.2", $FULL);
is($rc, 0, 'full: verify --file old new: intact across the failure') or diag("$out$err");
like($out, qr/^11 /, 'full: 2 + 1 + 8 lines: none of the failed writes is in the chain');
is(scalar @{ lines("$FULL.1") }, 2, 'full: the old file has the 2 written before the failure (a first write)');

$t->check_logs(ignore => [ qr/audit file could not record|write\(\) of \d+ audit entries/ ]);
done_testing;
