#!/usr/bin/perl
# Two nginx instances (two workers each) append to one audit stream on one
# Redis, under 64 clients sending first writes for 10 seconds (each a new
# key, retried by the retry rule after a timeout, 503 or in-progress). The chain
# never forks: every worker's entries are hashed on the head Redis has, and
# one that lost the race is hashed again on the new head. Afterwards
# `idempotency-audit verify` (with the HMAC key) passes, the sequence
# numbers are 1..N without a gap, no two entries name the same previous
# hash, every key executed once and its operation has its four events once,
# and the two instances' idempotency_audit_appends_total add up to N.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $t = Idem::Test->new;
my $KEYFILE = $t->prefix . '/audit.key';
open(my $fh, '>', $KEYFILE) or die;
print $fh 'x' x 48;
close $fh;

my $conf = <<"EOF";
idempotency_metrics_zone idem 64k;
server {
    listen 127.0.0.1:%%PORT%%;
    location / {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_audit on;
        idempotency_audit_key $KEYFILE;
        idempotency_audit_stream idem:load anchor=500;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /metrics {
        idempotency_metrics;
    }
}
EOF

$t->start_stack($conf, workers => 2);
my $t2 = Idem::Test->new;
$t2->{redis_port} = $t->{redis_port};
$t2->{upstream_port} = $t->{upstream_port};
$t2->start_nginx($conf, workers => 2);

my $SECS = 10;
my $res = $t->parallel(64, sub {
    my ($i) = @_;
    my $via = $i % 2 ? $t2 : $t;
    my $end = time + $SECS;
    my @done;
    for (my $n = 0; time < $end; $n++) {
        my $k = "k-load-$$-$i-$n";
        my ($r, $tries);
        # the retry rule: the same key again after a timeout, 503 or in-progress
        for ($tries = 1; $tries <= 50; $tries++) {
            $r = $via->http(POST => '/load', key => $k, json => { i => $i, n => $n }, timeout => 30);
            last unless $r->{status} == 599 || $r->{status} == 503
                        || ($r->{status} == 409 && $t->ptype($r) eq 'in-progress');
            sleep 0.2;
        }
        push @done, [ $k, $r->{status}, $tries ];
    }
    return \@done;
}, timeout => $SECS + 120);

my @all = map { @{ $_ // [] } } @$res;
is(scalar(grep { defined } @$res), 64, 'all 64 clients finished');
ok(@all > 64, scalar(@all) . ' first writes sent');
is(scalar(grep { $_->[1] != 201 } @all), 0, 'every key ended executed (201)')
    or diag(explain [ grep { $_->[1] != 201 } @all ]);
my $retried = grep { $_->[2] > 1 } @all;
note("$retried keys were retried (a timeout, 503 or in-progress first)");
is($t->effects, scalar @all, 'upstream effects: exactly one per key');

my $e = $t->audit_entries('idem:load');
my $stream = $t->audit_stream('idem:load');
my $n = @$stream;
note("$n entries, " . scalar(@$e) . ' events');
is_deeply([ map { $_->{id} } @$stream ], [ map { "$_-0" } 1 .. $n ], 'sequence numbers 1..N, contiguous');
my %prev;
$prev{ $_->{decoded}{prev} }++ for @$stream;
is(scalar(grep { $_ > 1 } values %prev), 0, 'no fork: no two entries name the same previous entry');
my %h = map { $_->{h} => 1 } @$stream;
is(scalar(grep { !$h{ $_->{decoded}{prev} } && $_->{seq} != 1 } @$stream), 0, 'every prev is an entry of the stream');

my (%events, %sent, %released);
for my $en (@$e) {
    push @{ $events{ $en->{key} } }, $en->{event};
}
my @odd = grep {
    my @ev = @{ $events{ $_->[0] } // [] };
    my $c = grep { $_ eq 'completed' } @ev;
    my $s = grep { $_ eq 'sent' } @ev;
    my $r = grep { $_ eq 'released' } @ev;
    my $a = grep { $_ eq 'accepted' } @ev;
    !($c == 1 && $a == 1 && $s == $r + 1 && $ev[-1] eq 'completed')
} @all;
is(scalar @odd, 0, 'each key: one completed operation (attempted sent accepted completed), '
   . 'every other claim released') or diag(explain [ map { [ $_->[0], $events{ $_->[0] } ] } @odd[0 .. 4] ]);

my ($rc, $out, $err) = $t->audit_tool('--stream', 'idem:load', '--key-file', $KEYFILE, 'verify');
is($rc, 0, 'verify with the key: intact') or diag("$out$err");
is($out, "$n $e->[-1]{h}\n", 'verify: the head');

my ($sum, $lost) = (0, 0);
for my $x ($t, $t2) {
    my $m = $x->http(GET => '/metrics')->{content};
    $sum += ($m =~ /^idempotency_audit_appends_total (\d+)$/m)[0] // 0;
    $lost += ($m =~ /^idempotency_audit_races_lost_total (\d+)$/m)[0] // 0;
}
is($sum, $n, 'the two instances\' idempotency_audit_appends_total add up to the entries');
ok($lost > 0, "the writers did race for the head ($lost commands hashed again)");

my @lost = ($t->error_log . $t2->error_log) =~ /lost the race for the head of audit stream/g;
note(scalar(@lost) . ' commands gave up after losing the race ' . 'too often (answered 503, nothing written)');

$t2->check_logs;
$t->check_logs;
done_testing;
