#!/usr/bin/perl
# With the audit stream as the only device, the completions a worker makes
# in one turn of its event loop go to Redis in one completes.lua and one
# stream entry (docs/audit.md, "Completions share an entry"). The worker is
# stopped (SIGSTOP) while the upstream answers, so that all the answers are
# read in one turn when it goes on:
#   A. 40 first writes: their completions go in batches of at most 16 (an
#      entry of 32 events, 16 + 16 + 8); every record is completed (each key
#      replays the upstream's answer, effect count 40), every operation has
#      attempted, sent, accepted, completed once, and verify passes;
#   B. a batch one of whose claims was taken from its owner (its lease
#      lapsed, another attempt holds it): completes.lua writes nothing, the
#      module sends the other completion again alone; the taken record is
#      left as it is, no "completed" for it in the stream, verify passes;
#   C. completes.lua itself, on a lost claim: nothing written, not even the
#      head key.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(time sleep);
use IO::Socket::INET;
use JSON::PP;
use Digest::SHA qw(sha1_hex);
use Idem::Test;

my $JSON = JSON::PP->new->canonical;

my $t = Idem::Test->new;
$t->start_stack(<<'EOF', workers => 1);
server {
    listen 127.0.0.1:%%PORT%%;
    location / {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_audit on;
        idempotency_audit_stream idem:batch;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

my ($worker) = $t->worker_pids;

# MONITOR on a connection of its own: the scripts Redis is sent, in order
my $mon = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $t->redis_port, Proto => 'tcp')
    or die "monitor: $!";
syswrite $mon, "MONITOR\r\n";
my $monitored = '';
sub monitored {
    my $end = time + 1;
    $mon->blocking(0);
    while (time < $end) {
        my $n = sysread($mon, my $buf, 1 << 20);
        if ($n) { $monitored .= $buf; $end = time + 0.3 } else { sleep 0.05 }
    }
    return $monitored;
}
my $completes = sha1_hex($t->script_text('completes'));

# n first writes held at the upstream, answered while the worker is stopped
sub held_batch {
    my ($keys, %o) = @_;
    my $base = $t->effects;
    my $pid = $t->later(0, sub {
        my $res = $t->parallel(scalar @$keys, sub {
            my ($i) = @_;
            my $r = $t->http(POST => '/b', key => $keys->[$i], json => { i => $i },
                             headers => [ 'X-Delay' => 1 ], timeout => 30);
            return [ $r->{status}, $r->{content} ];
        }, timeout => 60);
        open(my $fh, '>', $t->prefix . "/held-$keys->[0].json") or die;
        print $fh $JSON->encode($res);
        close $fh;
    });
    ok($t->wait_for(sub { $t->effects >= $base + @$keys }, 30), scalar(@$keys) . ' requests at the upstream');
    $o{before}->() if $o{before};
    kill 'STOP', $worker;
    sleep 1.8;               # the upstream answers them all meanwhile
    kill 'CONT', $worker;
    waitpid $pid, 0;
    my $f = $t->prefix . "/held-$keys->[0].json";
    open(my $fh, '<', $f) or return [];
    local $/;
    return $JSON->decode(<$fh>);
}

# ---- A. 40 completions in one turn
my @keys = map { "k-batch-$$-$_" } 1 .. 40;
my $res = held_batch(\@keys);
is(scalar(grep { $_ && $_->[0] == 201 } @$res), 40, 'A: the 40 first writes answered 201');
is($t->effects, 40, 'A: 40 effects');

my $stream = $t->audit_stream('idem:batch');
my @sizes = map { scalar @{ $_->{decoded}{events} } } @$stream;
my ($max) = sort { $b <=> $a } @sizes;
is($max, 32, 'A: the largest entry carries 32 events (16 completions)') or diag("@sizes");
ok((grep { $_ > 2 } @sizes) >= 3, 'A: three entries or more carry several completions (16 + 16 + 8)')
    or diag("@sizes");
like(monitored(), qr/"EVALSHA" "$completes" "18"/, 'A: a completes.lua of 16 records, the stream and its head');

my $e = $t->audit_entries('idem:batch');
my %events;
push @{ $events{ $_->{key} } }, $_->{event} for @$e;
my @odd = grep { join(' ', @{ $events{$_} // [] }) ne 'attempted sent accepted completed' } @keys;
is(scalar @odd, 0, 'A: each operation: attempted sent accepted completed, once')
    or diag(explain [ map { [ $_, $events{$_} ] } @odd[0 .. 2] ]);

my @bad;
for my $i (0 .. $#keys) {
    my $rec = $t->record($keys[$i]);
    push @bad, "$keys[$i]: state " . ($rec ? $rec->{state} : 'none')
        unless $rec && $rec->{state} eq 'completed';
}
is(scalar @bad, 0, 'A: every record completed') or diag(explain [ @bad[0 .. 2] ]);
my $r = $t->http(POST => '/b', key => $keys[7], json => { i => 7 });
is($r->{status}, 201, 'A: a retry is replayed');
is($r->{content}, $res->[7][1], 'A: with the upstream\'s answer');
is($t->effects, 40, 'A: still 40 effects');

my ($rc, $out, $err) = $t->audit_tool('--stream', 'idem:batch', 'verify');
is($rc, 0, 'A: verify passes') or diag("$out$err");

# ---- B. a batch with a claim taken from its owner
my @two = ("k-lost-$$-a", "k-lost-$$-b");
my $taken;
my $n0 = @{ $t->audit_stream('idem:batch') };
$monitored = '';
monitored();
$monitored = '';
$res = held_batch(\@two, before => sub {
    # another attempt holds the key now: the owner token is not the claim's
    my $name = $t->record_name($two[0]);
    my $rec = $t->decode_record($t->redis('GET', $name));
    $rec->{owner} = 'f' x 32;
    $taken = $t->encode_record($rec);
    $t->redis('SET', $name, $taken, 'PX', 600000);
});
is(scalar(grep { $_ && $_->[0] == 201 } @$res), 2, 'B: both answered with the upstream\'s 201');
my $sent = monitored();
my @calls = $sent =~ /"EVALSHA" "$completes" "(\d+)"/g;
is($calls[0], 4, 'B: the two completions went in one completes.lua (two records, the stream, its head)')
    or diag("@calls");
is($t->redis('GET', $t->record_name($two[0])), $taken, 'B: the taken record is left as it was');
is($t->record($two[1])->{state}, 'completed', 'B: the other one is completed');
$e = $t->audit_entries('idem:batch');
my @new = grep { $_->{seq} > $n0 } @$e;
my %ev2;
push @{ $ev2{ $_->{key} } }, $_->{event} for @new;
is(join(' ', @{ $ev2{ $two[1] } // [] }), 'attempted sent accepted completed', 'B: the other operation\'s events');
is(join(' ', @{ $ev2{ $two[0] } // [] }), 'attempted sent', 'B: no completion for the taken claim');
like($t->error_log, qr/complete script: the claim was no longer held by this request/,
     'B: the lost completion is logged');
($rc, $out, $err) = $t->audit_tool('--stream', 'idem:batch', 'verify');
is($rc, 0, 'B: verify passes') or diag("$out$err");

# ---- C. completes.lua alone: a lost claim writes nothing
my $text = $t->script_text('completes');
my $len = $t->redis('XLEN', 'idem:batch');
my $head = $t->redis('GET', 'idem:batch:head');
my $out1 = $t->redis('EVAL', $text, 4, $t->record_name($two[1]), $t->record_name($two[0]),
                     'idem:batch', 'idem:batch:head',
                     '', $len + 1, $head, '', 'h' x 32, "\x02junk",
                     'a' x 32, 'v1', 60000, 'b' x 32, 'v2', 60000);
is(ref $out1 && "@$out1", 'lost 1 2', 'C: completes.lua names the records not held by the owners given');
is($t->redis('XLEN', 'idem:batch'), $len, 'C: nothing appended');
is($t->redis('GET', 'idem:batch:head'), $head, 'C: the head key unchanged');
is($t->redis('GET', $t->record_name($two[0])), $taken, 'C: the records unchanged');

# ---- D. a batch after SCRIPT FLUSH: NOSCRIPT, sent again as EVAL with its text
sub check_all {
    my ($what, $keys) = @_;
    my @bad = grep { my $r = $t->record($_); !$r || $r->{state} ne 'completed' } @$keys;
    is(scalar @bad, 0, "$what: every record completed") or diag("@bad");
    my %ev;
    push @{ $ev{ $_->{key} // '' } }, $_->{event} for @{ $t->audit_entries('idem:batch') };
    my @odd = grep { join(' ', @{ $ev{$_} // [] }) ne 'attempted sent accepted completed' } @$keys;
    is(scalar @odd, 0, "$what: each operation's events once") or diag(explain [ map { [$_, $ev{$_}] } @odd ]);
    my ($rc, $out, $err) = $t->audit_tool('--stream', 'idem:batch', 'verify');
    is($rc, 0, "$what: verify passes") or diag("$out$err");
}
sub largest_since {
    my ($n0) = @_;
    my ($max) = sort { $b <=> $a } map { scalar @{ $_->{decoded}{events} } }
                grep { $_->{decoded} && $_->{seq} > $n0 } @{ $t->audit_stream('idem:batch') };
    return $max // 0;
}

is($t->redis('SCRIPT', 'FLUSH'), 'OK', 'D: SCRIPT FLUSH');
my @k4 = map { "k-ns-$$-$_" } 1 .. 5;
$n0 = $t->redis('XLEN', 'idem:batch');
$res = held_batch(\@k4);
is(scalar(grep { $_ && $_->[0] == 201 } @$res), 5, 'D: the five answered 201');
is(largest_since($n0), 10, 'D: their completions in one entry');
check_all('D', \@k4);

# ---- E. a batch that loses the race for the head: an entry appended by
# another writer while the worker is stopped; the batch is hashed again on it
my @k5 = map { "k-race-$$-$_" } 1 .. 5;
my $foreign;
$n0 = $t->redis('XLEN', 'idem:batch');
$res = held_batch(\@k5, before => sub {
    my ($seq) = $t->redis('GET', 'idem:batch:head') =~ /^(\d+):/;
    my $n = $foreign = $seq + 1;
    $t->redis('XADD', 'idem:batch', "$n-0", 'h', 'z' x 32, 'e', 'foreign');
    $t->redis('SET', 'idem:batch:head', "$n:" . ('z' x 32));
});
is(scalar(grep { $_ && $_->[0] == 201 } @$res), 5, 'E: the five answered 201');
is(largest_since($n0 + 1), 10, 'E: their completions in one entry, after the foreign one');
my @notdone = grep { my $r = $t->record($_); !$r || $r->{state} ne 'completed' } @k5;
is(scalar @notdone, 0, 'E: every record completed');
my ($rcE, $outE) = $t->audit_tool('--stream', 'idem:batch', 'verify');
is($t->effects, 40 + 2 + 5 + 5, 'every first write of A, B, D and E executed once, the replay not at all');
like($outE, qr/^entry $foreign: modified/, 'E: verify names the foreign entry (and no entry of the module\'s before it)')
    or diag($outE);

$t->check_logs;
done_testing;
