#!/usr/bin/perl
# The counting upstream of the integration tests.
#
#   perl t/lib/upstream.pl --port PORT --dir DIR
#
# An HTTP/1.1 server on 127.0.0.1:PORT that forks per connection (slow requests
# run concurrently) and answers one request per connection (Connection: close).
# Every request it receives -- after its whole body (Content-Length or chunked)
# has been read -- is one *effect*: one JSON line appended under flock to
# DIR/effects.log, numbered by a global counter kept in DIR/effects.seq:
#
#   {"n":SEQ,"method":M,"uri":U,"key":<Idempotency-Key as received, or null>,
#    "len":BODY_LENGTH,"sha":SHA256_HEX_OF_BODY,"ct":<Content-Type or null>,
#    "auth":<Authorization or null>,"t":EPOCH_SECONDS,
#    "json":<the body (up to 64 KiB) parsed as JSON whatever its Content-Type,
#            as many frameworks do, or null>}
# "t" here and in responses.log (when the answer is produced) bound the time the
# effect was executing: two effects whose spans meet ran side by side.
#
# Request headers that steer the answer:
#   X-Delay: SECONDS      sleep after recording the effect, before answering
#   X-Drop: 1             record the effect (and sleep X-Delay), then close unanswered
#   X-Status: N           answer status N (default 201); 204 and 304 without a body
#                         and without Content-Length
#   X-Body-Size: N        answer N deterministic bytes (Idem::Upstream::body_bytes),
#                         Content-Type application/octet-stream
#   X-Reply-Header: Name: value   add this header to the answer (repeatable)
#   X-Drop: rst           like X-Drop: 1, but the connection is reset (RST), not closed
#   X-Truncate: N         send the head (with the full Content-Length) and only the
#                         first N bytes of the body, then close
#   X-Chunked: 1          send the body with Transfer-Encoding: chunked (chunks of
#                         7 bytes) instead of Content-Length; with X-Truncate: N,
#                         only the chunks of the first N bytes, never the last
#                         (zero-size) chunk, then close
#
# Every answer it produces (not for X-Drop) is logged before it is sent, one JSON
# line appended under the same flock to DIR/responses.log:
#
#   {"n":SEQ,"key":<Idempotency-Key or null>,"status":N,"len":BODY_LENGTH,
#    "sha":SHA256_HEX_OF_THE_ANSWER_BODY,"truncated":0|1,"t":EPOCH_SECONDS}
#
# Default answer: 201, Location: /things/SEQ, Content-Type: application/json,
# X-Upstream-Seq: SEQ, Content-Length, Connection: close, body
#   {"id":SEQ,"method":M,"uri":U,"body_len":LEN,"body_sha256":HEX}
#
# Loaded with `require` (as Idem::Test does) it only defines Idem::Upstream::body_bytes.

package Idem::Upstream;

use strict;
use warnings;

# N bytes: block b (256 bytes each) holds 0..255 rotated by b, so a shifted,
# truncated or reordered copy never matches.
sub body_bytes {
    my ($n) = @_;
    my $base = join '', map { chr } 0 .. 255;
    my $out = '';
    for (my $b = 0; length($out) < $n; $b++) {
        my $r = $b % 256;
        $out .= substr($base, $r) . substr($base, 0, $r);
    }
    return substr($out, 0, $n);
}

package main;

use strict;
use warnings;

use Digest::SHA qw(sha256_hex);
use Fcntl qw(:flock);
use IO::Socket::INET;
use IO::Select;
use JSON::PP;
use POSIX ();
use Socket ();
use Time::HiRes qw(time sleep);

my %REASON = (
    200 => 'OK', 201 => 'Created', 202 => 'Accepted', 204 => 'No Content',
    400 => 'Bad Request', 404 => 'Not Found', 409 => 'Conflict',
    422 => 'Unprocessable Content', 429 => 'Too Many Requests',
    500 => 'Internal Server Error', 502 => 'Bad Gateway',
    503 => 'Service Unavailable',
);

my $JSON = JSON::PP->new->canonical->allow_nonref->latin1;

sub upstream_main {
    my %arg;
    while (@ARGV) {
        my $o = shift @ARGV;
        if ($o eq '--port') { $arg{port} = shift @ARGV }
        elsif ($o eq '--dir') { $arg{dir} = shift @ARGV }
        else { die "upstream.pl: unknown option $o\n" }
    }
    die "usage: upstream.pl --port PORT --dir DIR\n" unless $arg{port} && $arg{dir};

    my $listen = IO::Socket::INET->new(
        LocalAddr => '127.0.0.1', LocalPort => $arg{port}, Proto => 'tcp',
        Listen => 512, ReuseAddr => 1,
    ) or die "upstream.pl: listen 127.0.0.1:$arg{port}: $!\n";

    $SIG{CHLD} = 'IGNORE';    # children are reaped by the kernel
    $SIG{PIPE} = 'IGNORE';
    $SIG{TERM} = sub { POSIX::_exit(0) };

    while (1) {
        my $c = $listen->accept;
        unless ($c) {
            next if $!{EINTR} || $!{ECONNABORTED};
            die "upstream.pl: accept: $!\n";
        }
        my $pid = fork;
        if (!defined $pid) {
            warn "upstream.pl: fork: $!\n";
            close $c;
            next;
        }
        if ($pid == 0) {
            close $listen;
            $SIG{TERM} = 'DEFAULT';
            eval { handle($c, $arg{dir}); 1 } or warn "upstream.pl: $@";
            POSIX::_exit(0);
        }
        close $c;
    }
}

# Reads from $c into $$buf until $want->() is true; false on EOF or timeout.
sub fill {
    my ($c, $buf, $want, $deadline) = @_;
    my $sel = IO::Select->new($c);
    until ($want->()) {
        my $left = $deadline - time;
        return 0 if $left <= 0;
        return 0 unless $sel->can_read($left);
        my $n = sysread($c, $$buf, 65536, length $$buf);
        return 0 unless $n;
    }
    return 1;
}

sub handle {
    my ($c, $dir) = @_;
    binmode $c;
    my $deadline = time + 60;
    my $buf = '';

    fill($c, \$buf, sub { index($buf, "\r\n\r\n") >= 0 }, $deadline) or return;
    my $hend = index($buf, "\r\n\r\n");
    my $head = substr($buf, 0, $hend);
    $buf = substr($buf, $hend + 4);

    my ($line, @hl) = split /\r\n/, $head;
    my ($method, $uri, $proto) = split / /, $line, 3;
    my (%h, @reply_headers);
    for (@hl) {
        my ($n, $v) = /^([^:]+):[ \t]*(.*?)[ \t]*$/s or next;
        $n = lc $n;
        push @reply_headers, $v if $n eq 'x-reply-header';
        $h{$n} //= $v;    # first occurrence wins
    }

    my $body = '';
    if (($h{'transfer-encoding'} // '') =~ /chunked/i) {
        while (1) {
            fill($c, \$buf, sub { index($buf, "\r\n") >= 0 }, $deadline) or return;
            my $e = index($buf, "\r\n");
            my ($size) = substr($buf, 0, $e) =~ /^([0-9a-fA-F]+)/ or return;
            $size = hex $size;
            if ($size == 0) {
                # trailers until an empty line
                fill($c, \$buf, sub { $buf =~ /^(?:[^\r\n]+\r\n)*\r\n/ }, $deadline)
                    or return;
                last;
            }
            fill($c, \$buf, sub { length($buf) >= $e + 2 + $size + 2 }, $deadline)
                or return;
            $body .= substr($buf, $e + 2, $size);
            $buf = substr($buf, $e + 2 + $size + 2);
        }
    } elsif (defined $h{'content-length'}) {
        my $len = $h{'content-length'};
        fill($c, \$buf, sub { length($buf) >= $len }, $deadline) or return;
        $body = substr($buf, 0, $len);
    }

    my $sha = sha256_hex($body);
    # like many frameworks, the body is read as JSON whatever its label
    # (up to 64 KiB: JSON::PP would spend seconds of CPU on the huge ones)
    my $parsed = length $body && length $body <= 65536
        ? eval { JSON::PP->new->utf8->allow_nonref->decode($body) } : undef;
    # a number JSON::PP reads as infinity (1e400) would be written "Inf",
    # which no JSON reader takes back: such a body is not recorded as JSON
    $parsed = undef if defined $parsed
        && !eval { JSON::PP->new->allow_nonref->decode(
                       JSON::PP->new->allow_nonref->encode($parsed)); 1 };
    my $n = record_effect($dir, {
        method => $method, uri => $uri, key => $h{'idempotency-key'},
        len => length($body), sha => $sha, ct => $h{'content-type'},
        auth => $h{authorization}, t => time, json => $parsed,
    });

    sleep $h{'x-delay'} if ($h{'x-delay'} // '') =~ /^[0-9.]+$/ && $h{'x-delay'} > 0;
    if ($h{'x-drop'}) {
        if ($h{'x-drop'} eq 'rst') {
            # SO_LINGER {on, 0}: close() sends a RST
            setsockopt($c, Socket::SOL_SOCKET(), Socket::SO_LINGER(), pack('ii', 1, 0));
        }
        close $c;
        return;
    }

    my $status = ($h{'x-status'} // '') =~ /^[1-5][0-9][0-9]$/ ? $h{'x-status'} : 201;
    my ($ctype, $out);
    if (($h{'x-body-size'} // '') =~ /^[0-9]+$/) {
        $ctype = 'application/octet-stream';
        $out = Idem::Upstream::body_bytes($h{'x-body-size'});
    } else {
        $ctype = 'application/json';
        $out = '{"id":' . $n . ',"method":' . $JSON->encode($method)
            . ',"uri":' . $JSON->encode($uri) . ',"body_len":' . length($body)
            . ',"body_sha256":"' . $sha . '"}';
    }
    # 204 and 304 have no body, and are sent without Content-Length
    my $bodiless = $status == 204 || $status == 304;
    $out = '' if $bodiless;
    my $chunked = ($h{'x-chunked'} // '') eq '1';
    my $resp = "HTTP/1.1 $status " . ($REASON{$status} // 'Whatever') . "\r\n"
        . "Location: /things/$n\r\n"
        . "Content-Type: $ctype\r\n"
        . "X-Upstream-Seq: $n\r\n"
        . join('', map { "$_\r\n" } @reply_headers)
        . ($bodiless ? '' : $chunked ? "Transfer-Encoding: chunked\r\n" : "Content-Length: " . length($out) . "\r\n")
        . "Connection: close\r\n\r\n";
    my $trunc = ($h{'x-truncate'} // '') =~ /^[0-9]+$/ && $h{'x-truncate'} < length($out)
        ? $h{'x-truncate'} : undef;
    record_response($dir, {
        n => $n, key => $h{'idempotency-key'}, status => 0 + $status,
        len => length($out), sha => sha256_hex($out), truncated => defined $trunc ? 1 : 0,
        t => time,
    });
    my $sent = defined $trunc ? substr($out, 0, $trunc) : $out;
    if ($chunked) {
        $sent = join('', map { sprintf("%x\r\n%s\r\n", length $_, $_) } unpack('(a7)*', $sent))
            . (defined $trunc ? '' : "0\r\n\r\n");
    }
    $resp .= $sent unless $method eq 'HEAD';

    local $SIG{PIPE} = 'IGNORE';
    my $off = 0;
    while ($off < length $resp) {
        my $w = syswrite($c, $resp, length($resp) - $off, $off);
        last unless $w;
        $off += $w;
    }
    shutdown($c, 1);
    # let the peer read everything before the socket goes away
    my $sel = IO::Select->new($c);
    my $junk;
    while ($sel->can_read(2)) { last unless sysread($c, $junk, 65536) }
    close $c;
}

sub record_response {
    my ($dir, $e) = @_;
    open my $lock, '>>', "$dir/effects.lock" or die "effects.lock: $!";
    flock($lock, LOCK_EX) or die "flock: $!";
    open my $log, '>>', "$dir/responses.log" or die "responses.log: $!";
    print $log $JSON->encode($e), "\n";
    close $log;
    close $lock;
}

sub record_effect {
    my ($dir, $e) = @_;
    open my $lock, '>>', "$dir/effects.lock" or die "effects.lock: $!";
    flock($lock, LOCK_EX) or die "flock: $!";

    # The counter is replaced by a rename, never rewritten in place: a
    # child killed here (stop_upstream signals the whole group) must not
    # leave it empty, or the numbering would start again at 1.
    my $cur;
    if (open my $sf, '<', "$dir/effects.seq") { $cur = <$sf>; close $sf }
    my $n = (defined $cur && $cur =~ /^(\d+)/ ? $1 : 0) + 1;
    open my $nf, '>', "$dir/effects.seq.new" or die "effects.seq.new: $!";
    print $nf "$n\n";
    close $nf or die "effects.seq.new: $!";
    rename "$dir/effects.seq.new", "$dir/effects.seq" or die "effects.seq: $!";

    $e->{n} = $n;
    open my $log, '>>', "$dir/effects.log" or die "effects.log: $!";
    print $log $JSON->encode($e), "\n";
    close $log;

    close $lock;    # releases the lock
    return $n;
}

upstream_main() unless caller;

1;
