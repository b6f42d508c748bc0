#!/usr/bin/perl
# A tiny "tickets" API used by demo/run: the upstream nginx protects.
# Core Perl only. One connection at a time, HTTP/1.x, Connection: close.
#
#   POST /tickets[...]   creates a ticket: effects += 1, answers 201,
#                        Location: /tickets/N, JSON {"id":N,"effects":E,...}
#                        ?slow=S sleeps S seconds (max 30) before answering,
#                        to watch a concurrent retry get "in progress".
#   GET  /tickets/N      the ticket, or 404
#   GET  /effects        {"effects":E}: how many times a POST really ran
#
# Usage: upstream.pl --listen 127.0.0.1:0 [--port-file FILE]
# With port 0 the kernel picks a free port; it is written to FILE (and stdout).

use strict;
use warnings;
use IO::Socket::INET;
use JSON::PP;
use Getopt::Long;
use Time::HiRes ();

my $listen    = '127.0.0.1:0';
my $port_file = '';
GetOptions('listen=s' => \$listen, 'port-file=s' => \$port_file)
    or die "usage: $0 --listen HOST:PORT [--port-file FILE]\n";
my ($host, $port) = $listen =~ /^(.*):(\d+)$/
    or die "bad --listen '$listen' (want HOST:PORT)\n";

my $server = IO::Socket::INET->new(
    LocalAddr => $host, LocalPort => $port, Proto => 'tcp',
    Listen => 128, ReuseAddr => 1,
) or die "upstream: cannot listen on $listen: $!\n";

$port = $server->sockport;
if ($port_file ne '') {
    open my $fh, '>', "$port_file.tmp" or die "upstream: $port_file: $!\n";
    print $fh "$port\n";
    close $fh;
    rename "$port_file.tmp", $port_file or die "upstream: $port_file: $!\n";
}
$| = 1;
print "listening on $host:$port\n";

$SIG{TERM} = $SIG{INT} = sub { exit 0 };
$SIG{PIPE} = 'IGNORE';

my $json    = JSON::PP->new->canonical->utf8;
my $effects = 0;
my %tickets;
my $current = '';

while (1) {
    my $c = $server->accept or next;
    eval { serve($c); 1 } or warn "upstream: $@";
    close $c;
}

sub serve {
    my ($c) = @_;
    $c->autoflush(1);
    local $SIG{ALRM} = sub { die "client timeout\n" };
    alarm 10;

    my $head = '';
    while ($head !~ /\r?\n\r?\n/) {
        my $n = sysread($c, $head, 8192, length $head);
        die "connection closed before the headers ended\n" unless $n;
        die "headers too large\n" if length $head > 65536;
    }
    my ($hdr, $body) = split /\r?\n\r?\n/, $head, 2;
    my ($request_line, @lines) = split /\r?\n/, $hdr;
    my ($method, $target) = split / /, $request_line;
    my %h;
    for (@lines) {
        my ($k, $v) = /^([^:]+):\s*(.*?)\s*$/ or next;
        $h{lc $k} = $v;
    }

    if (($h{'transfer-encoding'} // '') =~ /chunked/i) {
        $body = read_chunked($c, $body);
    } elsif (my $len = $h{'content-length'}) {
        while (length $body < $len) {
            my $n = sysread($c, $body, $len - length $body, length $body);
            die "connection closed inside the body\n" unless $n;
        }
    }
    alarm 0;

    $current = "$method $target";
    my ($path, $query) = split /\?/, $target, 2;
    $query //= '';

    if ($method eq 'POST' && $path =~ m{^/tickets/?$}) {
        if ($query =~ /(?:^|&)slow=(\d+(?:\.\d+)?)/) {
            Time::HiRes::sleep($1 > 30 ? 30 : $1);
        }
        $effects++;
        my $id = $effects;
        my $request = eval { $json->decode($body) } // { raw_bytes => length $body };
        my $ticket = { id => $id, effects => $effects, request => $request,
                       created_at => time() };
        $tickets{$id} = $ticket;
        return reply($c, 201, 'Created', $ticket, "Location: /tickets/$id");
    }
    if ($method eq 'GET' && $path =~ m{^/tickets/(\d+)$}) {
        return reply($c, 200, 'OK', $tickets{$1}) if $tickets{$1};
        return reply($c, 404, 'Not Found', { error => "no ticket $1" });
    }
    if ($method eq 'GET' && $path eq '/effects') {
        return reply($c, 200, 'OK', { effects => $effects });
    }
    if ($path =~ m{^/tickets}) {
        return reply($c, 405, 'Method Not Allowed', { error => "$method not supported" },
                     'Allow: GET, POST');
    }
    return reply($c, 404, 'Not Found', { error => "no route for $path" });
}

sub read_chunked {
    my ($c, $buf) = @_;
    my $out = '';
    while (1) {
        while ($buf !~ /\r\n/) {
            sysread($c, $buf, 8192, length $buf) or die "eof in chunk size\n";
        }
        $buf =~ s/^([0-9a-fA-F]+)[^\r]*\r\n// or die "bad chunk size\n";
        my $size = hex $1;
        if ($size == 0) {
            # skip optional trailers up to the final empty line
            while ($buf !~ /^\r\n/ && $buf !~ /\r\n\r\n/) {
                sysread($c, $buf, 8192, length $buf) or last;
            }
            return $out;
        }
        while (length $buf < $size + 2) {
            sysread($c, $buf, 8192, length $buf) or die "eof in chunk\n";
        }
        $out .= substr($buf, 0, $size);
        substr($buf, 0, $size + 2) = '';
    }
}

sub reply {
    my ($c, $status, $reason, $data, @extra) = @_;
    my $body = $json->encode($data) . "\n";
    log_line("$current -> $status" . ($status == 201 ? " ticket $data->{id} (effects=$effects)" : ''));
    print $c join("\r\n",
        "HTTP/1.1 $status $reason",
        'Content-Type: application/json',
        'Content-Length: ' . length($body),
        'Connection: close',
        @extra,
        '', '') . $body;
    return;
}

sub log_line {
    my ($msg) = @_;
    my @t = localtime;
    printf "%02d:%02d:%02d %s\n", @t[2, 1, 0], $msg;
}
