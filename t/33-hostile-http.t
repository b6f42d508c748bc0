#!/usr/bin/perl
# HTTP-level hostility: HEAD and GET with a key (untouched), Expect:
# 100-continue (works, one effect, the retry replays), pipelined requests
# mixing keys, retries, conflicts and refusals on one connection, HTTP/2
# (first, replay, conflict, and concurrent streams with one key on one
# connection), and a slowly uploaded body: no claim in Redis before the body
# is complete; a client that gives up mid-body leaves no record and no effect.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use File::Temp qw(tempfile);
use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use Test::More;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $t = Idem::Test->new;
$t->start_redis;
$t->start_upstream;
$t->{port2} = Idem::Test::free_port();    # h2c (HTTP/2 with prior knowledge)
$t->start_nginx(<<'EOF' =~ s/%%PORT2%%/$t->{port2}/r);
client_body_buffer_size 16k;
client_body_timeout 30s;
server {
    listen 127.0.0.1:%%PORT%%;
    listen 127.0.0.1:%%PORT2%% http2;
    idempotency_redis %%REDIS%%;
    idempotency_scope $http_authorization;
    location / {
        idempotency on;
        idempotency_methods POST PUT PATCH DELETE;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

# ---- HEAD and GET with a key: untouched
{
    my $k = $t->key('head');
    for my $m (qw(HEAD GET)) {
        for my $i (1, 2) {
            my $r = $t->http($m => "/safe/$m", key => $k);
            is($r->{status}, 201, "$m #$i with a key: the upstream's answer");
            ok(!exists $r->{headers}{'idempotent-replayed'}, "$m #$i: not a replay");
        }
        is($t->effects(uri => "/safe/$m"), 2, "$m with a key: every request reaches the upstream");
    }
    ok(!$t->record($k), 'HEAD/GET with a key: no record in Redis');
    my @l = grep { m{"(?:HEAD|GET) /safe/} } $t->access_log(4);
    is(scalar(grep { /outcome=- / } @l), 4, 'HEAD/GET: $idempotency_outcome empty (module did not look)');
}

# ---- Expect: 100-continue
sub expect_continue {
    my ($k, $body, %o) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $t->nginx_port, Proto => 'tcp')
        or die "connect: $!";
    binmode $s;
    my $head = $t->request_bytes(POST => $o{uri} // '/expect', key => $k, body => '',
        headers => [ 'Content-Type' => 'application/json', Expect => '100-continue' ]);
    $head =~ s/Content-Length: 0\r\n/'Content-Length: ' . length($body) . "\r\n"/e;
    syswrite($s, $head);
    my ($buf, $got100) = ('', 0);
    my $sel = IO::Select->new($s);
    my $end = time + 10;
    while (time < $end && $sel->can_read($end - time)) {
        my $n = sysread($s, $buf, 65536, length $buf) or last;
        last if $buf =~ /\r\n\r\n/;
    }
    if ($buf =~ s{^HTTP/1\.1 100 Continue\r\n\r\n}{}) {
        $got100 = 1;
        syswrite($s, $body);
    }
    while (time < $end) {
        my @r = $t->parse_responses($buf);
        last if @r && (defined $r[0]{headers}{'content-length'} || ($r[0]{headers}{'transfer-encoding'} // '') =~ /chunked/);
        last unless $sel->can_read($end - time);
        my $n = sysread($s, $buf, 65536, length $buf) or last;
    }
    close $s;
    my ($r) = $t->parse_responses($buf);
    return ($got100, $r // { status => 599, headers => {}, content => $buf });
}
{
    my $k = $t->key('expect');
    my $body = '{"amount":5,"note":"' . ('x' x 40000) . '"}';
    my ($c1, $a) = expect_continue($k, $body);
    ok($c1, 'Expect: 100-continue: nginx sent 100 Continue');
    is($a->{status}, 201, 'Expect: 100-continue: executes') or diag($t->show($a));
    my ($c2, $b) = expect_continue($k, $body);
    ok($c2, 'retry: 100 Continue again (the body is needed for the fingerprint)');
    is($b->{headers}{'idempotent-replayed'}, 'true', 'Expect retry replays');
    is($b->{content}, $a->{content}, 'Expect retry: same answer');
    my ($c3, $c) = expect_continue($k, '{"amount":6}');
    $t->is_problem($c, 409, 'fingerprint-mismatch', key => $k, name => 'Expect with another body conflicts');
    my (undef, $d) = expect_continue('bad key', $body, uri => '/expect-bad');
    $t->is_problem($d, 400, 'key-malformed', name => 'Expect with a malformed key: 400');
    is($t->effects(uri => '/expect'), 1, 'Expect: one effect');
    is($t->effects(uri => '/expect-bad'), 0, 'Expect with a malformed key: no effect');
}

# ---- pipelined: many keys, retries, conflicts and refusals in one write
{
    my ($k1, $k2, $k3) = map { $t->key('pipe') } 1 .. 3;
    my @q = (
        [ POST => $k1, { v => 1 } ],   # executed
        [ POST => $k2, { v => 2 } ],   # executed
        [ POST => $k1, { v => 1 } ],   # replayed
        [ POST => $k1, { v => 9 } ],   # conflict
        [ HEAD => $k2, undef ],        # untouched
        [ POST => 'a b', { v => 3 } ], # key-malformed
        [ PUT  => $k3, { v => 3 } ],   # executed (another method, another key)
        [ POST => $k2, { v => 2 } ],   # replayed
        [ PUT  => $k3, { v => 3 } ],   # replayed
        [ POST => undef, { v => 4 } ], # no key: bypassed
    );
    my $bytes = join '', map {
        my ($m, $k, $j) = @{ $q[$_] };
        $t->request_bytes($m => '/pipe', key => $k, (defined $j ? (json => $j) : ()),
            connection => ($_ == $#q ? 'close' : undef))
    } 0 .. $#q;
    my $raw = $t->raw($bytes, timeout => 20);
    # HEAD has no body: parse it as such
    my @p;
    my $rest = $raw;
    for my $i (0 .. $#q) {
        my ($r) = $t->parse_responses($rest, head => $q[$i][0] eq 'HEAD');
        last unless $r;
        push @p, $r;
        $rest = substr($rest, length $r->{raw});
    }
    is(scalar(@p), scalar(@q), 'pipelined: one answer per request, in order');
    is(join(',', map { $_->{status} } @p), '201,201,201,409,201,400,201,201,201,201', 'pipelined: statuses');
    is(join(',', map { $_->{headers}{'idempotent-replayed'} // '-' } @p), '-,-,true,-,-,-,-,true,true,-',
        'pipelined: exactly the retries are replays');
    is($p[2] && $p[2]{content}, $p[0] && $p[0]{content}, 'pipelined: k1 retry is k1\'s answer');
    is($p[7] && $p[7]{content}, $p[1] && $p[1]{content}, 'pipelined: k2 retry is k2\'s answer');
    is($p[8] && $p[8]{content}, $p[6] && $p[6]{content}, 'pipelined: k3 retry is k3\'s answer');
    is($t->effects(uri => '/pipe'), 5, 'pipelined: five effects (k1, k2, HEAD, k3, no key)');
    is($t->effects(uri => '/pipe', method => 'POST', key => $k1), 1, 'pipelined: k1 once');
}

# ---- HTTP/2 (h2c, prior knowledge)
my ($fh, $bodyfile) = tempfile(DIR => $t->prefix, UNLINK => 0);
sub h2 {
    my ($k, $body, %o) = @_;
    open my $b, '>', $bodyfile or die; binmode $b; print $b $body; close $b;
    my $hdr = $t->prefix . '/h2-headers-' . int(rand 1e9);
    my $out = $t->prefix . '/h2-body-' . int(rand 1e9);
    my @cmd = ('curl', '-s', '--http2-prior-knowledge', '-X', 'POST', '--max-time', '20',
        '-H', "Idempotency-Key: $k", '-H', 'Content-Type: application/json',
        ($o{auth} ? ('-H', "Authorization: $o{auth}") : ()),
        ($o{delay} ? ('-H', "X-Delay: $o{delay}") : ()),
        '--data-binary', "\@$bodyfile", '-D', $hdr, '-o', $out, '-w', '%{http_version}',
        'http://127.0.0.1:' . $t->{port2} . ($o{uri} // '/h2'));
    open my $p, '-|', @cmd or die "curl: $!";
    my $ver = do { local $/; <$p> };
    close $p;
    my %h;
    my $status = 0;
    for (split /\r?\n/, Idem::Test::_slurp($hdr)) {
        $status = $1 if m{^HTTP/\S+ (\d{3})};
        $h{lc $1} = $2 if /^([^:]+):\s*(.*)$/;
    }
    return { status => $status, headers => \%h, content => Idem::Test::_slurp($out), version => $ver };
}
# h2_streams({path, headers => [name => value, ...], body}, ...): opens one
# h2c connection, sends every request at once (stream 1, 3, 5, ...), then
# reads until each stream ended. Request headers are HPACK literals without
# indexing (no Huffman); of the response headers only :status is decoded
# (nginx writes it indexed, or as a literal with the indexed name and three
# raw digits). Returns ({status, body, end, rst}, ...) in request order.
sub h2_streams {
    my @req = @_;
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $t->{port2}, Proto => 'tcp')
        or die "connect: $!";
    binmode $s;
    my $frame = sub { my ($type, $flags, $sid, $payload) = @_;
        substr(pack('N', length $payload), 1) . pack('CCN', $type, $flags, $sid) . $payload };
    my $int7 = sub { my $n = shift; return chr($n) if $n < 127; my $o = chr(127); $n -= 127;
        while ($n >= 128) { $o .= chr(($n & 127) | 128); $n >>= 7 } $o . chr($n) };
    my $lit = sub { my ($n, $v) = @_; "\x00" . $int7->(length $n) . $n . $int7->(length $v) . $v };
    my $out = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" . $frame->(4, 0, 0, '');
    my %st;
    my $sid = 1;
    my @sids;
    for my $r (@req) {
        my $block = join '', map { $lit->(@$_) } [ ':method', 'POST' ], [ ':scheme', 'http' ],
            [ ':path', $r->{path} ], [ ':authority', "127.0.0.1:$t->{port2}" ],
            [ 'content-length', length $r->{body} ], map { [ $r->{headers}[2 * $_], $r->{headers}[2 * $_ + 1] ] }
            0 .. @{ $r->{headers} } / 2 - 1;
        $out .= $frame->(1, 0x4, $sid, $block);
        $st{$sid} = { body => '' };
        push @sids, $sid;
        $sid += 2;
    }
    $out .= $frame->(0, 0x1, $sids[$_], $req[$_]{body}) for 0 .. $#req;
    syswrite($s, $out);
    my $buf = '';
    my $sel = IO::Select->new($s);
    my $end = time + 20;
    while (grep({ !$st{$_}{end} } @sids) && time < $end) {
        last unless $sel->can_read($end - time);
        my $n = sysread($s, $buf, 65536, length $buf) or last;
        while (length($buf) >= 9) {
            my ($l, $type, $flags, $id) = (unpack('N', "\0" . substr($buf, 0, 3)), unpack('CCN', substr($buf, 3, 6)));
            $id &= 0x7fffffff;
            last if length($buf) < 9 + $l;
            my $p = substr($buf, 9, $l);
            substr($buf, 0, 9 + $l) = '';
            if ($type == 4 && !($flags & 1)) { syswrite($s, $frame->(4, 1, 0, '')) }
            elsif ($type == 1 && $st{$id}) {
                my $b0 = ord $p;
                my %idx = (0x88 => 200, 0x89 => 204, 0x8a => 206, 0x8b => 304, 0x8c => 400, 0x8d => 404, 0x8e => 500);
                $st{$id}{status} = $idx{$b0} // ($b0 == 0x48 && ord(substr($p, 1, 1)) == 3 ? substr($p, 2, 3) : "?$b0");
                $st{$id}{end} = 1 if $flags & 1;
            }
            elsif ($type == 0 && $st{$id}) {
                $st{$id}{body} .= $p;
                $st{$id}{end} = 1 if $flags & 1;
            }
            elsif ($type == 3 && $st{$id}) { $st{$id}{rst} = unpack('N', $p); $st{$id}{end} = 1 }
            elsif ($type == 7) { $st{$_}{end} //= 0 for @sids; $end = 0 }
        }
    }
    close $s;
    return map { $st{$_} } @sids;
}

SKIP: {
    my $probe = `curl --version 2>/dev/null`;
    skip 'curl without HTTP/2', 1 unless $probe =~ /\bHTTP2\b/;
    my $k = $t->key('h2');
    my $a = h2($k, '{"a":1,"b":[1,2]}');
    is($a->{version}, '2', 'HTTP/2 used');
    is($a->{status}, 201, 'HTTP/2: executes') or diag(explain $a);
    my $b = h2($k, '{ "b" : [1,2], "a" : 1 }');
    is($b->{status}, 201, 'HTTP/2 retry: 201');
    is($b->{headers}{'idempotent-replayed'}, 'true', 'HTTP/2 retry (reordered JSON) replays');
    is($b->{content}, $a->{content}, 'HTTP/2 retry: same body');
    my $c = h2($k, '{"a":2}');
    is($c->{status}, 409, 'HTTP/2 with another body: 409');
    like($c->{headers}{'content-type'} // '', qr{^application/problem\+json}, 'HTTP/2 409 is a problem');
    is(eval { decode_json($c->{content})->{type} }, 'urn:ngx-idempotency:problem:fingerprint-mismatch',
        'HTTP/2 409 type fingerprint-mismatch');
    # HTTP/1.1 retry of the HTTP/2 request: same key, same request
    my $d = $t->http(POST => '/h2', key => $k, json => '{"a":1,"b":[1,2]}');
    is($d->{headers}{'idempotent-replayed'}, 'true', 'HTTP/1.1 retry of the HTTP/2 request replays');
    is($t->effects(uri => '/h2'), 1, 'HTTP/2: one effect');

    # three streams with one key on one connection, sent at once, the
    # first still running (curl's --parallel cannot multiplex h2c, so a
    # minimal HTTP/2 client of our own)
    my $k2 = $t->key('h2par');
    my @streams = h2_streams(map { { path => '/h2par', body => '{"p":1}',
        headers => [ 'idempotency-key' => $k2, 'content-type' => 'application/json', 'x-delay' => '1' ] } } 1 .. 3);
    my @codes = sort map { $_->{status} // 'none' } @streams;
    is(scalar(grep { $_->{end} } @streams), 3, 'HTTP/2 multiplexed: three complete answers on one connection')
        or diag(explain \@streams);
    is(scalar(grep { $_ eq '201' } @codes), 1, 'HTTP/2 multiplexed: exactly one 201') or diag("@codes");
    is(scalar(grep { $_ eq '409' } @codes), 2, 'HTTP/2 multiplexed: the two others 409') or diag("@codes");
    is(scalar(grep { ($_->{body} // '') =~ /problem:in-progress/ } @streams), 2, 'HTTP/2 multiplexed: in-progress problems');
    is($t->effects(uri => '/h2par'), 1, 'HTTP/2 multiplexed: one effect');
    my $e = h2($k2, '{"p":1}', uri => '/h2par');
    is($e->{headers}{'idempotent-replayed'}, 'true', 'HTTP/2 multiplexed: a later retry replays');
    is($t->effects(uri => '/h2par'), 1, 'HTTP/2 multiplexed: still one effect');
}

# ---- slowly uploaded body: no claim before the body is complete
for my $chunked (0, 1) {
    my $what = $chunked ? 'chunked' : 'Content-Length';
    my $k = $t->key('slow');
    my $auth = "Bearer slow-$$";
    my $uri = "/slow/$chunked";
    my $body = '{"slow":"' . ('s' x 3000) . '"}';
    my $req = $t->request_bytes(POST => $uri, key => $k, body => $body, connection => 'close',
        headers => [ 'Content-Type' => 'application/json', Authorization => $auth ],
        ($chunked ? (chunked => [ 500 ]) : ()));
    my $hend = index($req, "\r\n\r\n") + 4;
    my %before = map { $_ => 1 } $t->redis_keys('*');
    my $c = $t->conn(timeout => 30);
    $c->send(substr($req, 0, $hend + 100));
    my $seen = 0;
    my $step = int((length($req) - $hend - 100) / 5);
    for my $i (0 .. 4) {
        sleep 0.3;
        # SCAN every key: nothing new may appear while the body trickles
        $seen++ if $t->record($k, $auth) || grep { !$before{$_} } $t->redis_keys('*');
        my $from = $hend + 100 + $i * $step;
        $c->send(substr($req, $from, $i == 4 ? length($req) - $from - 1 : $step));
    }
    sleep 0.3;
    ok(!$t->record($k, $auth), "slow $what body, all but the last byte sent: no record yet");
    is($seen, 0, "slow $what body: Redis never held a claim while the body trickled")
        or diag(join ' ', grep { !$before{$_} } $t->redis_keys('*'));
    is($t->effects(uri => $uri), 0, "slow $what body: nothing reached the upstream yet");
    $c->send(substr($req, -1));
    my $r = $c->response(timeout => 20);
    $c->close;
    is($r && $r->{status}, 201, "slow $what body: executes once complete") or diag($r ? $t->show($r) : 'no response');
    ok($t->record($k, $auth), "slow $what body: the record exists now");
    my $again = $t->http(POST => $uri, key => $k, body => $body,
        headers => [ 'Content-Type' => 'application/json', Authorization => $auth ]);
    is($again->{headers}{'idempotent-replayed'}, 'true', "slow $what body: retry replays");
    is($t->effects(uri => $uri), 1, "slow $what body: one effect");
}

# ---- a client that gives up mid-body: no record, no effect, key still free
{
    my $k = $t->key('abandon');
    my $body = '{"x":"' . ('a' x 5000) . '"}';
    my $req = $t->request_bytes(POST => '/abandon', key => $k, body => $body,
        headers => [ 'Content-Type' => 'application/json' ]);
    my $c = $t->conn;
    $c->send(substr($req, 0, length($req) - 2000));
    sleep 0.3;
    $c->close;
    sleep 0.5;
    ok(!$t->record($k), 'abandoned upload: no record');
    is($t->effects(uri => '/abandon'), 0, 'abandoned upload: no effect');
    my $r = $t->http(POST => '/abandon', key => $k, body => $body, headers => [ 'Content-Type' => 'application/json' ]);
    is($r->{status}, 201, 'abandoned upload: the key is free, the full request executes');
    ok(!exists $r->{headers}{'idempotent-replayed'}, 'abandoned upload: not a replay');
    is($t->effects(uri => '/abandon'), 1, 'abandoned upload: one effect in all');
}

$t->check_logs;
done_testing;
