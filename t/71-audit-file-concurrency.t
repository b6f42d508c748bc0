#!/usr/bin/perl
# The audit file device shared by two workers under 64 clients sending
# first writes (each a new key, retried by the retry rule after a timeout
# or 503) for a bounded time, with a log rotation in the middle: the file
# renamed and nginx told to reopen (kill -USR1 the master). The chain is
# one across the two files: `idempotency-audit verify --file old new`
# (with the HMAC key) passes, the sequence numbers are 1..N without a gap
# across the files, no two lines name the same previous hash, the new
# file's first line carries the old file's last hash, every key executed
# once with its four events once, in two lines (the claim's "attempted
# sent", the completion's "accepted completed": one line per step), and no
# line went to the old file after one went to the new (the workers reopen
# at different instants).

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
Idem::Test::_spew($KEYFILE, 'x' x 48);
my $FILE = "$P/load.log";

$t->start_stack(<<"EOF", workers => 2);
server {
    listen 127.0.0.1:%%PORT%%;
    location / {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_audit file=$FILE fsync=100;
        idempotency_audit_key $KEYFILE;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

my $SECS = 6;
my $t0 = time;
my $rotated;
my $res = $t->parallel(64, sub {
    my ($i) = @_;
    my $end = time + $SECS;
    my @done;
    for (my $n = 0; time < $end; $n++) {
        my $k = "k-file-$$-$i-$n";
        my ($r, $tries);
        for ($tries = 1; $tries <= 50; $tries++) {
            $r = $t->http(POST => '/load', key => $k, json => { i => $i, n => $n }, timeout => 30);
            last unless $r->{status} == 599 || $r->{status} == 503
                        || ($r->{status} == 409 && $t->ptype($r) eq 'in-progress');
            sleep 0.2;
        }
        push @done, [ $k, $r->{status}, $tries ];
    }
    return \@done;
}, timeout => $SECS + 120, tick => sub {
    # the rotation, in the middle of the load
    return if $rotated || time < $t0 + 0.5 + 64 * 0.02 + $SECS / 2;
    rename $FILE, "$FILE.1" or die "rename: $!";
    kill 'USR1', $t->nginx_pid;
    $rotated = 1;
});

ok($rotated, 'the file was rotated during the load');
my @all = map { @{ $_ // [] } } @$res;
is(scalar(grep { defined } @$res), 64, 'all 64 clients finished');
ok(@all > 64, scalar(@all) . ' first writes sent');
is(scalar(grep { $_->[1] != 201 } @all), 0, 'every key ended executed (201)')
    or diag(explain [ grep { $_->[1] != 201 } @all[0 .. 4] ]);
is($t->effects, scalar @all, 'upstream effects: exactly one per key');

my @old = @{ $t->audit_file_lines("$FILE.1") };
my @new = @{ $t->audit_file_lines($FILE) };
my @e = (@old, @new);
my $n = @e;
ok(@old > 0 && @new > 0, scalar(@old) . ' lines in the old file, ' . scalar(@new) . ' in the new');
is_deeply([ map { $_->{seq} } @e ], [ 1 .. $n ], 'seq 1..N, contiguous across the two files');
is($new[0]{prev}, $old[-1]{hash}, 'the new file\'s first line is chained on the old file\'s last');
my %prev;
$prev{ $_->{prev} }++ for @e;
is(scalar(grep { $_ > 1 } values %prev), 0, 'no fork: no two lines name the same previous hash');

my %events;
push @{ $events{ $_->{key} } }, $_->{event} for @{ $t->audit_file_events("$FILE.1") }, @{ $t->audit_file_events($FILE) };
my @odd = grep {
    my @ev = @{ $events{ $_->[0] } // [] };
    my $c = grep { $_ eq 'completed' } @ev;
    my $s = grep { $_ eq 'sent' } @ev;
    my $r = grep { $_ eq 'released' } @ev;
    !($c == 1 && $s == $r + 1 && $ev[-1] eq 'completed')
} @all;
is(scalar @odd, 0, 'each key: one completed operation, every other claim released')
    or diag(explain [ map { [ $_->[0], $events{ $_->[0] } ] } @odd[0 .. 4] ]);
my %steps = map { (join ' ', map { $_->{event} } @{ $_->{events} }) => 1 } @e;
is(join(',', sort keys %steps), join(',', sort grep { $steps{$_} } 'attempted sent', 'accepted completed',
                                                     'accepted released', 'attempted', 'released'),
   'one line per step: ' . join(',', sort keys %steps));
ok($steps{'attempted sent'} && $steps{'accepted completed'}, 'a claim\'s line and a completion\'s');

my ($rc, $out, $err) = $t->audit_tool('verify', '--key-file', $KEYFILE, '--file', "$FILE.1", $FILE);
is($rc, 0, 'verify --file old new (with the key): intact') or diag("$out$err");
is($out, "$n $e[-1]{hash}\n", 'verify: the head');
($rc, $out) = $t->audit_tool('verify', '--key-file', $KEYFILE, $FILE);
is($rc, 1, 'the new file alone: entries before it are missing');
($rc, $out) = $t->audit_tool('verify', '--key-file', $KEYFILE, '--partial', $FILE);
is($rc, 0, 'the new file alone with --partial: intact') or diag($out);
($rc, $out) = $t->audit_tool('verify', '--key-file', $KEYFILE, $FILE, "$FILE.1");
is($rc, 1, 'the two files in the wrong order: exit 1');

$t->check_logs;
done_testing;
