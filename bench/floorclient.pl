#!/usr/bin/perl
# bench/floorclient.pl: the Redis side of N first writes, without nginx,
# for bench/floor.  Usage:
#   floorclient.pl PORT VARIANT N CONNS DEPTH PREFIX CLAIM VALUE TTL [SHA]
# Keys are named as the module names a record, idem:{<32 hex>}:r, the hex
# made of PREFIX (a number: one per run), the connection and a counter.
# CONNS connections (one process each, as nginx workers keep one pipelined
# connection each); on each, DEPTH claims are written in one go and their
# answers read, then the DEPTH completions the same way, until N first
# writes are done.  VARIANT is claim, cas, script or beside (bench/floor).
# Every answer is checked: a claim must find a free key, a completion must
# be recorded; otherwise it dies, and bench/floor with it.
use strict;
use warnings;
use IO::Socket::INET;

my ($port, $variant, $n, $conns, $depth, $prefix, $claim, $value, $ttl, $sha) = @ARGV;
die "usage: floorclient.pl PORT VARIANT N CONNS DEPTH PREFIX CLAIM VALUE TTL [SHA]\n"
    unless defined $ttl;
die "floorclient: unknown variant $variant\n" unless $variant =~ /^(claim|cas|script|beside)$/;
die "floorclient: script needs its SHA\n" if $variant eq 'script' && !$sha;
for ($n, $conns, $depth, $prefix) {
    die "floorclient: N, CONNS, DEPTH and PREFIX are positive integers\n" unless /^[1-9][0-9]*\z/;
}

my $token = substr($claim, 99, 32);

sub resp {
    my $s = '*' . scalar(@_) . "\r\n";
    $s .= '$' . length($_) . "\r\n$_\r\n" for @_;
    return $s;
}

# one answer: a bulk string (undef for nil), an integer, or a status; an
# error dies
sub answer {
    my ($fh) = @_;
    my $l = <$fh>;
    die "floorclient: connection closed\n" unless defined $l;
    my $t = substr($l, 0, 1);
    $l =~ s/\r\n\z//;
    if ($t eq '$') {
        my $len = substr($l, 1);
        return undef if $len < 0;
        my $b = '';
        while (length($b) < $len + 2) {
            read($fh, $b, $len + 2 - length($b), length($b)) or die "floorclient: short read\n";
        }
        return substr($b, 0, $len);
    }
    return substr($l, 1) if $t eq ':' || $t eq '+';
    die "floorclient: Redis answered $l\n";
}

sub completion {
    my ($key) = @_;
    return resp('SET', $key, $value, 'XX', 'PX', $ttl) if $variant eq 'cas';
    return resp('EVALSHA', $sha, 1, $key, $token, $value, $ttl) if $variant eq 'script';
    return resp('SET', "$key:c:$token", $value, 'PX', $ttl, 'GET');
}

sub recorded {
    my ($a) = @_;
    return defined $a && $a eq 'OK' if $variant eq 'cas';
    return defined $a && $a eq '1' if $variant eq 'script';
    return !defined $a;
}

# a batch in as few writes as the socket takes, as a worker's pipelined
# connection sends it (print would cut it in 8 KiB pieces)
sub send_all {
    my ($fh, $data) = @_;
    while (length $data) {
        my $n = syswrite($fh, $data);
        die "floorclient: write: $!\n" unless defined $n;
        substr($data, 0, $n, '');
    }
}

sub client {
    my ($c, $count) = @_;
    my $fh = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port")
        or die "floorclient: connect: $!\n";
    for (my $i = 0; $i < $count; $i += $depth) {
        my $m = $count - $i < $depth ? $count - $i : $depth;
        my @keys = map { sprintf('idem:{%08x%08x%016x}:r', $prefix, $c, $i + $_) } 0 .. $m - 1;
        send_all($fh, join '', map { resp('SET', $_, $claim, 'NX', 'PX', $ttl, 'GET') } @keys);
        for (@keys) {
            my $a = answer($fh);
            die "floorclient: $_ was not free\n" if defined $a;
        }
        next if $variant eq 'claim';
        send_all($fh, join '', map { completion($_) } @keys);
        for (@keys) {
            recorded(answer($fh)) or die "floorclient: the completion of $_ was not recorded\n";
        }
    }
    close $fh;
}

my @kids;
for my $c (1 .. $conns) {
    my $share = int($n / $conns) + ($c <= $n % $conns ? 1 : 0);
    my $pid = fork;
    die "floorclient: fork: $!\n" unless defined $pid;
    if ($pid == 0) {
        eval { client($c, $share); 1 } or do { print STDERR $@; exit 1 };
        exit 0;
    }
    push @kids, $pid;
}
my $bad = 0;
for (@kids) {
    waitpid($_, 0);
    $bad = 1 if $?;
}
exit $bad;
