#!/usr/bin/perl
# The native claim of idempotency_unique and idempotency_lock on one Redis
# server (docs/business-keys.md, "The native claim"): a first write is
# claimed by SET NX PX GET of the record, then of the unique key, the lock
# key and the h key, pipelined in this order, with no EVALSHA; its replay
# needs no script either. A claim that does not take every key goes on to
# claim.lua with "undo", which deletes by a compare what the attempt took
# (never a plain DEL, never another operation's name) before deciding:
# a lock held by a running deployment keeps naming it, the refused
# request leaves no key behind, a competitor's name written between the
# EXEC and the give-back stays.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use IO::Socket::INET;
use IO::Select;
use Idem::Test;

my $t = Idem::Test->new;

# the ACL user of docs/redis.md, exactly
$t->start_redis;
$t->redis('ACL', 'SETUSER', 'old', split ' ', 'on >old-pw ~idem:* &idem:done +evalsha +eval '
          . '+script|load +select +subscribe +set +get +pttl +pexpire +del +type +time +publish '
          . '+hmget +hset +hdel');
$t->start_upstream;
$t->start_nginx(<<'EOF');
idempotency_json_var $event /event;
idempotency_json_var $environment /environment;

server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    location /jobs {
        idempotency on;
        idempotency_unique jobs:$event shared=jobs;
        idempotency_lock deploy:$environment;
        proxy_ignore_client_abort on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /old-acl {
        idempotency on;
        idempotency_redis %%REDIS%% user=old password=old-pw db=5;
        idempotency_unique jobs:$event;
        idempotency_lock deploy:$environment;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /status {
        idempotency_status;
    }
}
EOF

sub job {
    my ($key, $event, $env, %o) = @_;
    my @h = $o{delay} ? ('X-Delay' => $o{delay}) : ();
    my @a = (POST => $o{path} // '/jobs', key => $key, timeout => 20, headers => \@h,
             json => JSON::PP->new->canonical->encode({ event => $event, environment => $env }));
    return $o{bg} ? $t->http_bg(@a) : $t->http(@a);
}

sub hkey { my $r = $t->record_name($_[0]); $r =~ s/:r$/:h/; $r }

# MONITOR on a connection of its own: the commands Redis runs, in order,
# as [name, first argument, from a script]
my $mon = IO::Socket::INET->new(PeerAddr => $t->redis_addr, Timeout => 5)
    or die "monitor: $!";
syswrite $mon, "MONITOR\r\n";
my $sel = IO::Select->new($mon);
my $monbuf = '';

# (sysread: a buffered readline would hide lines from select)
sub monitored {
    my @cmds;
    while ($sel->can_read(0.5)) {
        sysread($mon, $monbuf, 65536, length $monbuf) or last;
    }
    while ($monbuf =~ s/\A([^\n]*)\n//) {
        my $line = $1;
        next unless $line =~ /^\+[\d.]+ \[\d+ ([^\]]+)\] "([^"]+)"(?: "((?:[^"\\]|\\.)*)")?/;
        my ($from, $name, $arg) = ($1, uc $2, $3 // '');
        next unless $name =~ /^(EVALSHA|EVAL|SET|DEL|GET)$/;
        next if $from eq 'lua' && $name ne 'DEL';
        push @cmds, [$name, $arg, $from eq 'lua' ? 1 : 0];
    }
    return @cmds;
}

sub names { join ' ', map { $_->[0] . ($_->[2] ? '(lua)' : '') } @_ }

my $L = $t->lock_name('deploy:production');

# make test-asan runs the suite with idempotency_complete_beside on: the
# completion is then a native SET beside the claim (no complete.lua), and a
# first replay folds it into the record with one claim.lua (t/64)
my $beside = ($ENV{IDEM_COMPLETE_BESIDE} // '') eq 'on';

# ---- a first write: native, record first, no script before the upstream
{
    monitored();
    my ($set0, $eval0) = map { $t->command_calls($_) } qw(set evalsha);
    my $k = $t->key('first');
    my $r = job($k, 'ev-1', 'staging');
    is($r->{status}, 201, 'first write: executed');
    my @c = monitored();
    my @claim = @c[0 .. 4];
    is(names(@claim), 'SET SET SET SET ' . ($beside ? 'SET' : 'EVALSHA'),
       'the claim: four SETs, then the completion')
        or diag(names(@c));
    is_deeply([map { $_->[1] } @claim[0 .. 3]],
              [$t->record_name($k), $t->unique_shared_name('jobs', 'jobs:ev-1'),
               $t->lock_name('deploy:staging'), hkey($k)],
              'the record first, then the unique key, the lock key, the h key');
    is($t->command_calls('set') - $set0, 5, 'five SETs (the completion\'s own inside its script)');
    is($t->command_calls('evalsha') - $eval0, $beside ? 0 : 1,
       ($beside ? 'no EVALSHA' : 'one EVALSHA: the completion') . ', no claim.lua');
    like($t->redis('GET', $t->unique_shared_name('jobs', 'jobs:ev-1')) // '',
         qr/^\Q${\ $t->record_name($k)}\E[0-9a-f]{32}/, 'the unique key names the record and its operation');

    # a replay: nothing taken, the record's reply is the answer
    monitored();
    $eval0 = $t->command_calls('evalsha');
    my $again = job($k, 'ev-1', 'staging');
    is($again->{status}, 201, 'replay: 201');
    is($again->{headers}{'idempotent-replayed'}, 'true', '... Idempotent-Replayed');
    is($t->command_calls('evalsha') - $eval0, $beside ? 1 : 0,
       $beside ? '... one script: the fold of the completion' : '... no script at all');
    is($t->effects(key => $k), 1, '... executed once');
}

# ---- a lock held by a running deployment: refused; its lock untouched,
# the refused request's record, unique key and h key given back
my ($kx, $bgx) = ($t->key('holder'));
{
    $bgx = job($kx, 'ev-x', 'production', bg => 1, delay => 3);
    ok($t->wait_for(sub { $t->effects(key => $kx) == 1 }, 5), 'the holder runs');
    my $held_by = $t->redis('GET', $L);
    like($held_by // '', qr/^\Q${\ $t->record_name($kx)}\E/, 'the lock key names the holder');

    monitored();
    my $kb = $t->key('refused');
    my $b = job($kb, 'ev-b', 'production');
    $t->is_problem($b, 409, 'lock-held', key => $kb, name => 'a second deployment is held');
    my @c = grep { !$_->[2] } monitored();
    is(names(@c[0 .. 4]), 'SET SET SET SET EVALSHA',
       'the native claim, then claim.lua') or diag(names(@c));
    ok(!grep({ $_->[0] eq 'DEL' } @c), 'no plain DEL: the give-back is inside claim.lua');
    is($t->redis('GET', $L), $held_by, 'the holder\'s lock key is untouched');
    is($t->redis('EXISTS', $t->record_name($kb)), 0, 'the refused request keeps no record');
    is($t->redis('EXISTS', $t->unique_shared_name('jobs', 'jobs:ev-b')), 0, '... no unique key');
    is($t->redis('EXISTS', hkey($kb)), 0, '... no h key');
    is($t->effects(key => $kb), 0, '... and did not run');

    # the holder's key again with a changed body naming another identity
    # and another lock: a conflict; the holder's h key still names its lock,
    # the keys the retry took are given back
    my $hbefore = $t->redis('GET', hkey($kx));
    like($hbefore // '', qr/\Q$L\E$/, 'the holder\'s h key names its lock');
    my $changed = job($kx, 'ev-y', 'canary');
    $t->is_problem($changed, 409, 'fingerprint-mismatch', key => $kx,
                   name => 'the holder\'s key with a changed body');
    is($t->redis('GET', hkey($kx)), $hbefore, '... the holder\'s h key is untouched');
    is($t->redis('EXISTS', $t->lock_name('deploy:canary')), 0, '... the lock the retry took is given back');
    is($t->redis('EXISTS', $t->unique_shared_name('jobs', 'jobs:ev-y')), 0, '... and its identity');
    my $st = $t->http(GET => '/status', key => $kx);
    like($st->{content} // '', qr/"lock":"\Q$L\E"/, '... the status still shows the holder\'s lock')
        or diag($st->{content});

    # the same event under another key while the holder runs: in progress
    my $kc = $t->key('same-event');
    my $c = job($kc, 'ev-x', 'staging');
    $t->is_problem($c, 409, 'in-progress', key => $kc, name => 'the holder\'s event under another key');
    is($t->redis('EXISTS', $t->lock_name('deploy:staging')) ? 1 : 0, 1,
       '(deploy:staging is the first write\'s lock, left in place)');
    like($t->redis('GET', $t->unique_shared_name('jobs', 'jobs:ev-x')) // '',
         qr/^\Q${\ $t->record_name($kx)}\E/, '... the holder keeps the identity');

    is(($bgx->result(20) // {})->{status}, 201, 'the holder completes');
    my $b2 = job($kb, 'ev-b', 'production');
    is($b2->{status}, 201, 'the held deployment\'s retry then runs');
    is($t->effects(key => $kb), 1, '... once');

    # the identity of a completed operation: reused, the lock left as it is
    my $kd = $t->key('reuse');
    my $d = job($kd, 'ev-x', 'production');
    is($d->{status}, 201, 'another key of a completed event: its answer');
    is($d->{headers}{'idempotent-reused'}, 'true', '... Idempotent-Reused');
    is($t->effects(key => $kd), 0, '... not executed');
    like($t->redis('GET', $L) // '', qr/^\Q${\ $t->record_name($kb)}\E/,
         '... the lock key still names its last holder');
}

# ---- claim.lua's give-back compares: a name replaced between the EXEC
# and the give-back (a competitor's) stays; this attempt's own are deleted
{
    my $claim = $t->redis('SCRIPT', 'LOAD', $t->script_text('claim'));
    my $R = $t->record_name($t->key('undo'));
    my ($U, $Lk) = ($t->unique_shared_name('jobs', 'jobs:ev-undo'), $t->lock_name('deploy:undo'));
    (my $H = $R) =~ s/:r$/:h/;
    my ($op, $owner, $fp) = ('a' x 32, 'b' x 32, 'c' x 64);
    my $now = int($t->redis('TIME')->[0] * 1000);
    my $value = $t->encode_record({ state => 'in_progress', op => $op, fp => $fp, owner => $owner,
                                    created => $now, lease_ms => 30000, ttl_ms => 86400000 });
    my ($loc, $scope) = ('l' x 32, 's' x 32);
    # what the native claim took: the record, the lock key, the h key; the
    # unique key was taken too, and replaced since by a competitor
    my $competitor = $t->record_name('other') . ('d' x 32) . $loc;
    $t->redis('SET', $R, $value, 'PX', 86400000);
    $t->redis('SET', $U, $competitor, 'PX', 86400000);
    $t->redis('SET', $Lk, "$R$op$scope", 'PX', 86400000);
    $t->redis('SET', $H, "$R$op$Lk", 'PX', 86400000);
    # the competitor's record does not exist: the identity holds nothing,
    # so the claim goes on and takes every key anew
    my $r = $t->redis('EVALSHA', $claim, 4, $R, $U, $Lk, $H,
                      $fp, $owner, $value, 86400000, 0, '', 0, $scope, $loc, 1);
    is_deeply($r, ['claimed'], 'undo, then the claim decides: claimed');
    is($t->redis('GET', $U), "$R$op$loc", 'the unique key taken anew (the competitor\'s name held nothing)');

    # the same with the competitor's record in progress: its name stays
    my $CR = $t->record_name('other-live');
    my $cvalue = $t->encode_record({ state => 'in_progress', op => 'e' x 32, fp => $fp, owner => 'f' x 32,
                                     created => $now, lease_ms => 30000, ttl_ms => 86400000 });
    $t->redis('SET', $CR, $cvalue, 'PX', 86400000);
    my $live = $CR . ('e' x 32) . $loc;
    $t->redis('SET', $U, $live, 'PX', 86400000);
    my ($op2, $owner2) = ('1' x 32, '2' x 32);
    my $R2 = $t->record_name($t->key('undo2'));
    (my $H2 = $R2) =~ s/:r$/:h/;
    my $value2 = $t->encode_record({ state => 'in_progress', op => $op2, fp => $fp, owner => $owner2,
                                     created => $now, lease_ms => 30000, ttl_ms => 86400000 });
    $t->redis('SET', $R2, $value2, 'PX', 86400000);
    $t->redis('SET', $Lk, "$R2$op2$scope", 'PX', 86400000);
    $t->redis('SET', $H2, "$R2$op2$Lk", 'PX', 86400000);
    $r = $t->redis('EVALSHA', $claim, 4, $R2, $U, $Lk, $H2,
                   $fp, $owner2, $value2, 86400000, 0, '', 0, $scope, $loc, 1);
    is(ref $r && $r->[0], 'reused', 'the live competitor holds the identity: reused');
    is($t->redis('GET', $U), $live, 'the competitor\'s name is not deleted');
    is($t->redis('EXISTS', $Lk), 0, 'this attempt\'s lock key is deleted');
    is($t->redis('EXISTS', $H2), 0, '... and its h key');
    like($t->redis('GET', $R2) // '', qr/^2s0e{32}/, 'its record is now the alias of the competitor (state s)');

    # without undo the same keys are left as they are (claim.lua as before)
    $t->redis('SET', $R2, $value2, 'PX', 86400000);
    $t->redis('SET', $Lk, "$R2$op2$scope", 'PX', 86400000);
    $r = $t->redis('EVALSHA', $claim, 4, $R2, $U, $Lk, $H2,
                   $fp, $owner2, $value2, 86400000, 0, '', 0, $scope, $loc, '');
    is(ref $r && $r->[0], 'in_progress', 'no undo: this attempt\'s own claim is met');
}

# ---- the documented ACL user (docs/redis.md, t/36) needs nothing more
{
    my $k = $t->key('old-acl');
    my $r = job($k, 'ev-old', 'old-1', path => '/old-acl');
    is($r->{status}, 201, 'old ACL user: a first write executes');
    my $again = job($k, 'ev-old', 'old-1', path => '/old-acl');
    is($again->{headers}{'idempotent-replayed'}, 'true', '... its retry is a replay');
    my $other = job($t->key('old-acl-2'), 'ev-old', 'old-2', path => '/old-acl');
    is($other->{headers}{'idempotent-reused'}, 'true', '... another key of the same event: reused');
    is($t->effects(key => $k), 1, '... executed once');
    my $log = $t->redis('ACL', 'LOG');
    my @refused = ref $log eq 'ARRAY' ? grep { my %e = @$_; ($e{username} // '') eq 'old' } @$log : ();
    is(scalar @refused, 0, '... Redis refused it nothing (ACL LOG)') or diag(explain \@refused);
}

done_testing;
