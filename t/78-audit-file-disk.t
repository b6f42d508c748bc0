#!/usr/bin/perl
# The audit file device on a disk that fills mid-line (docs/audit.md, "What
# fails closed"): the file lives on a 64k tmpfs mounted in the test prefix,
# nearly filled by another file, so that a write() of a claim's lines is cut
# short. The module cuts the file back to its size before the write (all or
# none): the request is refused 503 audit-unavailable and never reaches the
# upstream (effect 0), the file ends with a complete line, `verify --file`
# passes for what was written, a restart starts and goes on with the chain,
# and once the disk has room again the refused key executes once.
# Needs root (mount -t tmpfs); skipped with the reason when mount is refused.
#   - A failed fdatasync() (fsync=every; made to fail with EIO by a small
#     LD_PRELOAD shim built here, while a flag file exists) fails the claim
#     as a failed write does: 503 audit-unavailable, effect 0, logged at
#     alert; the lines are in the file and the head moved past them, so
#     `verify --file` passes; a replay still answers; the retry executes
#     once the disk syncs again. Skipped under the sanitizers (they own
#     LD_PRELOAD) or without a C compiler.
#   - Several first writes whose claims are written with one write() (the
#     claims of one turn of the event loop; Redis stopped while they are
#     sent, so that its replies come back together), and that write's
#     fdatasync() fails: every request of the batch is refused 503
#     audit-unavailable, none reaches the upstream, and the failure is
#     logged once for the batch, not once per request.
#   - A restart (not a reload) after a rotation, before a line went to the
#     new empty file: a new chain starts at entry 1 and says so in the error
#     log; `verify --file old new` fails at the new file's first line, each
#     file verifies alone (the documented limit, docs/audit.md "Rotation").

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use Idem::Test;

my $t = Idem::Test->new;
my $P = $t->prefix;
my $DISK = "$P/disk";
mkdir $DISK or die "mkdir $DISK: $!";
my $mounted = system("mount -t tmpfs -o size=64k tmpfs '$DISK' 2>/dev/null") == 0;
plan skip_all => 'mount -t tmpfs refused (needs root): a full disk cannot be made'
    unless $mounted;

END {
    my $rc = $?;
    if ($mounted) {
        $t->stop_nginx if $t;
        system("umount -l '$DISK'");
    }
    $? = $rc;
}

my $FILE = "$DISK/audit.log";
my $FILL = "$DISK/fill";

my $SYNC = "$P/sync.log";
my $BATCH = "$P/batch.log";
my $FAILFLAG = "$P/fail-fdatasync";

# fdatasync() fails with EIO while $FAILFLAG exists (a worker's environment
# is reset by nginx, so the flag's path is built in)
my $SHIM = '';
unless ($t->{sanitize}) {
    Idem::Test::_spew("$P/failsync.c", <<"C");
#define _GNU_SOURCE
#include <errno.h>
#include <unistd.h>
#include <sys/syscall.h>
int fdatasync(int fd)
{
    if (access("$FAILFLAG", F_OK) == 0) {
        errno = EIO;
        return -1;
    }
    return (int) syscall(SYS_fdatasync, fd);
}
C
    $SHIM = "$P/failsync.so"
        if system("cc -shared -fPIC -o '$P/failsync.so' '$P/failsync.c' 2>/dev/null") == 0;
}

$t->start_redis;
$t->start_upstream;
my $CONF = <<"EOF";
server {
    listen 127.0.0.1:%%PORT%%;
    location /disk {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_audit file=$FILE fsync=every;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /batch {
        idempotency on;
        idempotency_redis %%REDIS%% timeout=20s;
        idempotency_audit file=$BATCH fsync=every;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /sync {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_audit file=$SYNC fsync=every;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF
{
    local $ENV{LD_PRELOAD} = $SHIM if $SHIM;
    $t->start_nginx($CONF);
}

sub lines { [ split /(?<=\n)/, Idem::Test::_slurp($FILE) ] }

sub whole {
    my $text = Idem::Test::_slurp($_[0] // $FILE);
    return 0 unless $text eq '' || substr($text, -1) eq "\n";
    for (split /\n/, $text) {
        my $e = eval { decode_json($_) } or return 0;
    }
    return 1;
}

my $k1 = $t->key('first');
my $r = $t->http(POST => '/disk/x', key => $k1, json => { a => 1 });
is($r->{status}, 201, 'a first write while the disk has room');
$t->wait_state($k1, '', 'completed');

# fill the disk, then give back one page: the audit file has that page and
# the rest of its last one
open my $fh, '>', $FILL or die;
syswrite($fh, 'x' x 4096) or last for 1 .. 64;
close $fh;
truncate $FILL, (-s $FILL) - 4096 or die "truncate: $!";

my ($refused, $written);
for my $i (1 .. 40) {
    my $k = $t->key("fill-$i");
    $r = $t->http(POST => '/disk/x', key => $k, json => { a => $i, pad => 'p' x $i });
    if ($r->{status} == 503) {
        $refused = $k;
        is($t->ptype($r), 'audit-unavailable', "the disk full mid-line at write $i: 503 audit-unavailable");
        ok($r->{headers}{'retry-after'}, 'with Retry-After');
        is($t->effects(key => $k), 0, 'never executed');
        last;
    }
    is($r->{status}, 201, "write $i while the disk has room");
    $t->wait_state($k, '', 'completed');
    $written++;
}
ok($refused, "a claim was refused once the disk was full ($written written before)");
like($t->error_log, qr/\[alert\].*write\(\) of \d+ audit entries to "\Q$FILE\E" cut short \(\d+ of \d+ bytes\), undone/,
     'the cut write was logged at alert and undone');
ok(whole(), 'the file ends with a complete line: no cut line stays');
my ($rc, $out, $err) = $t->audit_tool('verify', '--file', $FILE);
is($rc, 0, 'verify --file passes for what was written') or diag("$out$err");
my ($seq) = $out =~ /^(\d+) /;

# a second refusal on the still full disk leaves the file as it was
my $before = Idem::Test::_slurp($FILE);
$r = $t->http(POST => '/disk/x', key => $refused, json => { a => 0 });
is($r->{status}, 503, 'the full disk: its retry is refused again');
is(Idem::Test::_slurp($FILE), $before, 'and the file is unchanged');

ok(eval { local $ENV{LD_PRELOAD} = $SHIM if $SHIM; $t->restart_nginx; 1 },
   'a restart on the full disk starts') or diag($@);

unlink $FILL or die;
$r = $t->http(POST => '/disk/x', key => $refused, json => { a => 0 });
is($r->{status}, 201, 'room again: the refused key executes');
$t->wait_state($refused, '', 'completed');
is($t->effects(key => $refused), 1, 'once');
($rc, $out, $err) = $t->audit_tool('verify', '--file', $FILE);
is($rc, 0, 'verify --file: the chain went on across the restart') or diag("$out$err");
my ($seq2) = $out =~ /^(\d+) /;
is($seq2, $seq + 2, 'the refused write is in the chain once (its claim\'s line, its completion\'s), after the restart');
ok(whole(), 'every line complete');

# ---- a failed fdatasync()
SKIP: {
    skip 'the sanitizers own LD_PRELOAD: no fdatasync() shim', 11 if $t->{sanitize};
    skip 'no C compiler for the fdatasync() shim', 11 unless $SHIM;
    my $ks = $t->key('sync-before');
    $r = $t->http(POST => '/sync/x', key => $ks, json => { s => 1 });
    is($r->{status}, 201, 'sync: a first write while fdatasync() works');
    $t->wait_state($ks, '', 'completed');

    Idem::Test::_spew($FAILFLAG, '');
    my $kf = $t->key('sync-fails');
    $r = $t->http(POST => '/sync/x', key => $kf, json => { s => 2 });
    is($r->{status} . ' ' . $t->ptype($r), '503 audit-unavailable',
       'sync: fdatasync() fails: the claim is refused 503 audit-unavailable') or diag($t->show($r));
    is($t->effects(key => $kf), 0, 'sync: never executed');
    like($t->error_log, qr/\[alert\].*fdatasync\(\) of audit file "\Q$SYNC\E" failed/,
         'sync: logged at alert');
    $r = $t->http(POST => '/sync/x', key => $ks, json => { s => 1 });
    is("$r->{status} $r->{headers}{'idempotent-replayed'}", '201 true', 'sync: a replay still answers');
    ($rc, $out, $err) = $t->audit_tool('verify', '--file', $SYNC);
    is($rc, 0, 'sync: verify --file passes: the unsynced lines are in the chain') or diag("$out$err");
    my @ev = map { ($_->{key} // '') eq $kf ? $_->{event} : () } @{ $t->audit_file_events($SYNC) };
    ok(scalar(grep { $_ eq 'attempted' } @ev), "sync: the refused claim's lines are in the file (@ev)");

    unlink $FAILFLAG or die;
    $r = $t->http(POST => '/sync/x', key => $kf, json => { s => 2 });
    is($r->{status}, 201, 'sync: fdatasync() works again: the retry executes');
    $t->wait_state($kf, '', 'completed');
    is($t->effects(key => $kf), 1, 'sync: once');
    ($rc, $out, $err) = $t->audit_tool('verify', '--file', $SYNC);
    is($rc, 0, 'sync: verify --file passes after the retry') or diag("$out$err");
    ok(whole($SYNC), 'sync: every line complete');
}

# ---- the claims of one turn in one write(), whose fdatasync() fails
SKIP: {
    skip 'the sanitizers own LD_PRELOAD: no fdatasync() shim', 7 if $t->{sanitize};
    skip 'no C compiler for the fdatasync() shim', 7 unless $SHIM;
    my $N = 6;
    my $kb = $t->key('batch-before');
    $r = $t->http(POST => '/batch/x', key => $kb, json => { b => 0 });
    is($r->{status}, 201, 'batch: a first write while fdatasync() works');
    $t->wait_state($kb, '', 'completed');

    my $alerts = () = $t->error_log =~ /fdatasync\(\) of audit file "\Q$BATCH\E" failed/g;
    Idem::Test::_spew($FAILFLAG, '');
    my @keys = map { $t->key("batch-$_") } 1 .. $N;
    my $stall = $t->redis_stall(3, how => 'stop');
    my $res = $t->parallel($N, sub {
        my $x = $t->http(POST => '/batch/x', key => $keys[$_[0]], json => { b => $_[0] + 1 },
                         timeout => 30);
        return { status => $x->{status}, type => $t->ptype($x) // '' };
    }, timeout => 60);
    $t->redis_stall_end($stall);
    unlink $FAILFLAG or die;

    is(join(' ', map { $_ ? "$_->{status} $_->{type}" : 'none' } @$res),
       join(' ', ('503 audit-unavailable') x $N),
       "batch: the $N claims of the failed write are all refused 503 audit-unavailable");
    is(join(' ', map { $t->effects(key => $_) } @keys), join(' ', (0) x $N),
       'batch: none reached the upstream');
    my $after = () = $t->error_log =~ /fdatasync\(\) of audit file "\Q$BATCH\E" failed/g;
    ok($after - $alerts >= 1 && $after - $alerts < $N,
       "batch: the claims went with fewer write()s than requests ("
       . ($after - $alerts) . " failed fdatasync() for $N claims)");
    my %sent = map { $_->{event} eq 'sent' ? ($_->{key} => 1) : () } @{ $t->audit_file_events($BATCH) };
    is(scalar(grep { $sent{$_} } @keys), $N, 'batch: their lines are in the file (written, not synced)');

    $r = $t->http(POST => '/batch/x', key => $keys[0], json => { b => 1 });
    is($r->{status}, 201, 'batch: fdatasync() works again: a refused key executes');
    $t->wait_state($keys[0], '', 'completed');
    is($t->effects(key => $keys[0]), 1, 'batch: once');
}

# ---- a restart after a rotation, before a line went to the new file
{
    my ($rc, $out, $err) = $t->audit_tool('verify', '--file', $FILE);
    my ($head) = $out =~ /^(\d+ [0-9a-f]{64})$/m;
    rename $FILE, "$FILE.1" or die;
    kill 'USR1', $t->nginx_pid;
    ok($t->wait_for(sub { -e $FILE }, 5), 'rotated: the new file is opened');
    is(-s $FILE, 0, 'rotated: and empty');
    ok(eval { local $ENV{LD_PRELOAD} = $SHIM if $SHIM; $t->restart_nginx; 1 },
       'rotated: a restart starts') or diag($@);
    like($t->error_log, qr/\[notice\].*audit file "\Q$FILE\E" is empty: a new chain starts at entry 1/,
         'rotated: the new chain is announced in the error log');
    my $k = $t->key('after-rotation');
    $r = $t->http(POST => '/disk/x', key => $k, json => { r => 1 });
    is($r->{status}, 201, 'rotated: a write after the restart');
    $t->wait_state($k, '', 'completed');
    ($rc, $out, $err) = $t->audit_tool('verify', '--file', "$FILE.1", $FILE);
    like($out, qr/^\Q$FILE\E:1: reordered: entry 1 follows entry \d+/m,
         'rotated: verify old new fails at the new chain\'s first line (the documented limit)');
    ($rc, $out, $err) = $t->audit_tool('verify', '--file', "$FILE.1");
    is($rc, 0, 'rotated: the old file verifies alone');
    like($out, qr/^\Q$head\E$/m, 'rotated: up to the head it had before the rotation');
    ($rc, $out, $err) = $t->audit_tool('verify', '--anchor', join(':', split / /, $head), '--file', "$FILE.1");
    is($rc, 0, 'rotated: and anchored by that head') or diag("$out$err");
    ($rc, $out, $err) = $t->audit_tool('verify', '--file', $FILE);
    like($out, qr/^2 [0-9a-f]{64}$/m, 'rotated: the new file verifies alone, from entry 1 (a first write: 2 lines)');
}

done_testing;
