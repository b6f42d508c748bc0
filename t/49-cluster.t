#!/usr/bin/perl
# Redis Cluster, the ground under idempotency_redis_cluster: the harness's
# cluster (3 masters, 3 replicas, started by PID in the prefix) is up with
# every slot served, and the key slots the module's C core computes
# (t/unit/test_slot.c checks it against t/data/slots/keyslot.txt) are the
# ones this live cluster gives: every key of that file is asked again here,
# and its 1,000 record keys land on all three masters.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Idem::Test;

my $t = Idem::Test->new;
my @ports = $t->start_cluster(masters => 3, replicas => 1);
is(scalar @ports, 6, 'six nodes started');

my $masters = $t->cluster_masters;
is(scalar keys %$masters, 3, 'three masters serve slots');

my @owner;
for my $port (keys %$masters) {
    for my $r (@{ $masters->{$port} }) {
        $owner[$_] = $port for $r->[0] .. $r->[1];
    }
}
is(scalar(grep { defined } @owner[0 .. 16383]), 16384, 'every slot is served');

open(my $fh, '<', "$FindBin::Bin/data/slots/keyslot.txt") or die $!;
my (@wrong, %hit, $records);
while (my $line = <$fh>) {
    chomp $line;
    my ($slot, $key) = split /\t/, $line, 2;
    my $live = $t->redis_at($ports[0], 'CLUSTER', 'KEYSLOT', $key);
    push @wrong, "$key: file $slot, live $live" if $live ne $slot;
    if ($key =~ /^idem:\{[0-9a-f]{32}\}:r$/) {
        $records++;
        $hit{ $owner[$slot] }++;
    }
}
is("@wrong", '', 'the recorded slots are the live cluster\'s');
cmp_ok($records, '>=', 1000, "$records record keys");
is(scalar keys %hit, 3, 'the record keys land on all three masters')
    or diag(explain \%hit);
cmp_ok($hit{$_}, '>', 200, "master $_ owns $hit{$_} of them") for sort keys %hit;

# a record key written through the master that owns its slot stays there
my ($key) = map { (split /\t/)[1] } grep { /\tidem:\{/ } `cat $FindBin::Bin/data/slots/keyslot.txt`;
chomp $key;
my $slot = $t->redis_at($ports[0], 'CLUSTER', 'KEYSLOT', $key);
my $other = (grep { $_ != $owner[$slot] } keys %$masters)[0];
like("" . $t->redis_at($other, 'SET', $key, 'x'), qr/^MOVED $slot 127\.0\.0\.1:$owner[$slot]$/,
     'another master answers MOVED to the owner');
is($t->redis_at($owner[$slot], 'SET', $key, 'x'), 'OK', 'the owner takes the write');

done_testing;
