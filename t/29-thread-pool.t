#!/usr/bin/perl
# idempotency_thread_pool: JSON bodies from min_size up are canonicalized
# in an nginx thread pool. The fingerprint is the same as in the event loop
# (the offline tool's), for bodies in memory, spooled to a file, and not
# JSON after all; smaller bodies stay in the event loop; a full queue falls
# back to the event loop; concurrent duplicates still execute once; a client
# that goes away while its body is being fingerprinted leaves nothing behind.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Idem::Test;

my $t = Idem::Test->new;
$t->start_stack(<<'EOF', log_format => 'F|$request_uri|$idempotency_fingerprint|$idempotency_body_form|$idempotency_outcome', error_log_level => 'debug', main => "thread_pool idem threads=2;\nthread_pool tiny threads=1 max_queue=1;");
client_body_buffer_size 16k;
client_max_body_size 8m;
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    idempotency_thread_pool idem min_size=4k;
    location / {
        idempotency on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /file-only/ {
        idempotency on;
        client_body_in_file_only clean;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /tiny/ {
        idempotency on;
        idempotency_thread_pool tiny min_size=1;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /default-pool/ {
        idempotency on;
        idempotency_thread_pool default;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /no-threads/ {
        idempotency on;
        idempotency_thread_pool off;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

my $THREAD = qr/idempotency: body fingerprinted in a thread, rc:0/;
sub threaded { scalar grep { /$THREAD/ } split /\n/, $t->error_log }

my $tool = "$FindBin::Bin/../build/idempotency-fingerprint";
sub tool_fp {
    my ($uri, $body) = @_;
    my $f = "$t->{prefix}/fp-body.json";
    open my $fh, '>', $f or die "$f: $!";
    print $fh $body;
    close $fh;
    my $out = `$tool --method POST --route $uri --content-type application/json --body-file $f 2>/dev/null`;
    return ($out =~ /\b([0-9a-f]{64})\b/)[0];
}
sub logged {
    my ($uri) = @_;
    my @l;
    $t->wait_for(sub { @l = grep { /^F\|\Q$uri\E\|/ } $t->access_log; @l }, 5);
    my (undef, undef, $fp, $form, $outcome) = split /\|/, $l[-1] // '';
    return ($fp // '', $form // '', $outcome // '');
}

my @n = map { $_ * 7 } 1 .. 20000;
my $json = "{ \"z\" : [" . join(', ', @n) . "], \"a\": {\"y\":1,\"b\":\"\\u00e9\"} }";
my $dup = "{ \"z\" : [" . join(', ', @n) . "], \"a\": 1e20, \"a\": 2 }";
my $mem = '{"pad":"' . ('x' x 6000) . '","b":2,"a":1}';    # 6 KiB: in memory

# ---- each body form in a thread: the tool's fingerprint, replay, conflict
for my $c (
    [ '/fp-spooled',    $json, 'json',             1 ],
    [ '/file-only/fp',  $json, 'json',             1 ],
    [ '/fp-memory',     $mem,  'json',             1 ],
    [ '/file-only/dup', $dup,  'raw-invalid-json', 1 ],
    [ '/fp-dup',        $dup,  'raw-invalid-json', 1 ],
    [ '/fp-small',      '{"b":2,"a":1}', 'json',   0 ],    # below min_size
    [ '/no-threads/fp', $json, 'json',             0 ],
    [ '/default-pool/fp', $json, 'json',           1 ],
) {
    my ($uri, $body, $want_form, $in_thread) = @$c;
    my $k = $t->key('tp');
    my $before = threaded();
    my $r = $t->http(POST => $uri, key => $k, json => $body);
    is($r->{status}, 201, "$uri: executes") or diag($t->show($r));
    my ($got, $form) = logged($uri);
    is($form, $want_form, "$uri: body form $want_form");
    my $hex = tool_fp($uri, $body);
    ok($hex && $got eq $hex, "$uri: the tool's fingerprint") or diag("module $got, tool " . ($hex // 'none'));
    is(threaded() - $before, $in_thread, "$uri: " . ($in_thread ? 'fingerprinted in a thread' : 'fingerprinted in the event loop'));

    my $again = $t->http(POST => $uri, key => $k, json => $body);
    is($again->{headers}{'idempotent-replayed'}, 'true', "$uri: the retry replays");
    is($again->{content}, $r->{content}, "$uri: replayed body identical");
    my $changed = $body =~ s/: 2 }$/: 3 }/r =~ s/"y":1/"y":3/r =~ s/"b":2/"b":3/r;
    isnt($changed, $body, "$uri: the changed body differs");
    my $c = $t->http(POST => $uri, key => $k, json => $changed);
    $t->is_problem($c, 409, 'fingerprint-mismatch', key => $k, name => "$uri: a changed value conflicts");
    is($t->effects(key => $k), 1, "$uri: one effect");
}

# ---- one document spelled compactly and re-spaced and reordered, both
#      fingerprinted in threads: the retry replays
{
    my $uri = '/same-doc';
    my $k = $t->key('tp-same');
    my $compact = '{"a":1,"z":[' . join(',', @n) . ']}';
    my $spaced = "{ \"z\" : [ " . join(' ,  ', @n) . " ] ,\n \"a\" : 1.0 }";
    my $a = $t->http(POST => $uri, key => $k, json => $compact);
    is($a->{status}, 201, 'reordered document: first executes');
    my $b = $t->http(POST => $uri, key => $k, json => $spaced);
    is($b->{headers}{'idempotent-replayed'}, 'true', 'reordered, re-spaced document replays');
    is($t->effects(key => $k), 1, 'reordered document: one effect');
}

# ---- 30 concurrent identical large bodies: one effect
{
    my $k = $t->key('tp-conc');
    my $res = $t->parallel(30, sub {
        my $r = $t->http(POST => '/conc', key => $k, json => $json, timeout => 30);
        return { status => $r->{status}, replayed => $r->{headers}{'idempotent-replayed'} };
    });
    my $ok = grep { $_ && ($_->{status} == 201 || $_->{status} == 409) } @$res;
    is($ok, 30, '30 concurrent large bodies: each answered 201 or 409')
        or diag(join ' ', map { $_ ? $_->{status} : 'none' } @$res);
    is($t->effects(key => $k), 1, '30 concurrent large bodies: exactly one effect');
}

# ---- a pool with one thread and a queue of one: what does not fit is
#      fingerprinted in the event loop, and every request still gets its own
{
    my $before = threaded();
    my @keys = map { $t->key('tp-tiny') } 1 .. 12;
    my $res = $t->parallel(12, sub {
        my $i = shift;
        my $r = $t->http(POST => "/tiny/$i", key => $keys[$i], json => $json, timeout => 30);
        return { status => $r->{status} };
    });
    is(scalar(grep { $_ && $_->{status} == 201 } @$res), 12, 'full queue: all 12 execute');
    is($t->effects(key => $_), 1, "full queue: one effect for $_") for @keys[0, 11];
    my $total = 0;
    $total += $t->effects(key => $_) for @keys;
    is($total, 12, 'full queue: 12 effects for 12 keys');
    my $n = threaded() - $before;
    ok($n >= 1 && $n <= 12, "full queue: $n of 12 fingerprinted in the thread");
    for my $i (0 .. 11) {
        my ($fp) = logged("/tiny/$i");
        is($fp, tool_fp("/tiny/$i", $json), "full queue: /tiny/$i has the tool's fingerprint") if $i == 0 || $i == 11;
    }
    for my $i (0, 11) {
        my $r = $t->http(POST => "/tiny/$i", key => $keys[$i], json => $json);
        is($r->{headers}{'idempotent-replayed'}, 'true', "full queue: /tiny/$i retry replays");
    }
}

# ---- the client goes away right after sending a 4 MiB body: no alert, no
#      leak, and at most one effect whatever the retry finds
{
    my $k = $t->key('tp-gone');
    my $big = '{"v":[' . join(',', 1 .. 600000) . ']}';
    ok(length($big) > 4_000_000, 'the abandoned body is over 4 MB');
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $t->nginx_port, Proto => 'tcp')
        or die "connect: $!";
    binmode $s;
    print $s $t->request_bytes(POST => '/gone', key => $k, json => $big);
    close $s;
    my $r;
    $t->wait_for(sub {
        $r = $t->http(POST => '/gone', key => $k, json => $big, timeout => 30);
        $r->{status} == 201;
    }, 20);
    is($r->{status}, 201, 'after the abandoned request, the retry gets a 201') or diag($t->show($r));
    is($t->effects(key => $k), 1, 'abandoned request and its retries: one effect');
    my $ok = $t->http(POST => '/after', key => $t->key('tp-after'), json => { ok => 1 });
    is($ok->{status}, 201, 'the worker still serves requests');
}

# ---- nginx -t: an undefined pool is refused with the line of the directive
{
    my ($rc, $out) = $t->nginx_test_conf(<<'EOF');
server {
    listen 127.0.0.1:%%PORT%%;
    location / {
        idempotency on;
        idempotency_redis 127.0.0.1:1;
        idempotency_thread_pool nosuch;
        proxy_pass http://127.0.0.1:1;
    }
}
EOF
    isnt($rc, 0, 'nginx -t rejects an undefined thread pool');
    like($out, qr/unknown thread pool "nosuch" in \S+:\d+/, 'the message names the pool and the line') or diag($out);
    ($rc, $out) = $t->nginx_test_conf(<<'EOF', main => 'thread_pool fp threads=2;');
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_thread_pool fp min_size=1m;
    location / {
        idempotency on;
        idempotency_redis 127.0.0.1:1;
        proxy_pass http://127.0.0.1:1;
    }
}
EOF
    is($rc, 0, 'nginx -t accepts a defined pool with min_size') or diag($out);
}

$t->check_logs;
done_testing;
