#!/usr/bin/perl
# Size limits: 10 MB bodies right at client_max_body_size (binary and JSON,
# Content-Length and chunked) execute once and replay; one byte over is
# nginx's 413 before any claim (no effect, no record). Huge header values:
# a 30 KB key header is refused by nginx (400) or, where the header buffers
# are large enough to let it through, by the module (400 key-malformed);
# a 30 KB fingerprinted header is hashed like any other. Nothing executes
# twice.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Idem::Test;

my $MAX = 10 * 1024 * 1024;

my $t = Idem::Test->new;
$t->start_redis;
$t->start_upstream;
$t->{port2} = Idem::Test::free_port();    # a second server: large header buffers
$t->{port3} = Idem::Test::free_port();    # a third: a short Redis command timeout
$t->start_nginx(<<'EOF' =~ s/%%PORT2%%/$t->{port2}/r =~ s/%%PORT3%%/$t->{port3}/r);
client_max_body_size 10m;
client_body_buffer_size 64k;
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    location / {
        idempotency on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /big-headers/ {
        idempotency on;
        idempotency_fingerprint_headers X-Blob;
        proxy_pass http://%%UPSTREAM%%;
    }
}
server {
    listen 127.0.0.1:%%PORT2%%;
    large_client_header_buffers 4 64k;
    idempotency_redis %%REDIS%%;
    location / {
        idempotency on;
        idempotency_fingerprint_headers X-Blob;
        proxy_pass http://%%UPSTREAM%%;
    }
}
server {
    listen 127.0.0.1:%%PORT3%%;
    location / {
        idempotency on;
        idempotency_redis %%REDIS%% timeout=250ms;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

sub on_port2 {
    my ($code) = @_;
    local $t->{nginx_port} = $t->{port2};
    return $code->();
}

# ---- exactly client_max_body_size, binary: spooled to a file, hashed, replayed
{
    my $k = $t->key('10m');
    my $body = $t->upstream_body($MAX);
    my @h = (headers => [ 'Content-Type' => 'application/octet-stream' ], timeout => 120);
    my $a = $t->http(POST => '/ten', key => $k, body => $body, @h);
    is($a->{status}, 201, '10 MB (= client_max_body_size) binary body executes') or diag($t->show($a));
    my ($e) = $t->effect_list(key => $k);
    is($e && $e->{len}, $MAX, 'upstream got all 10 MB');
    is($e && $e->{sha}, $t->sha256($body), 'upstream got the exact bytes');
    my $b = $t->http(POST => '/ten', key => $k, body => $body, @h);
    is($b->{headers}{'idempotent-replayed'}, 'true', '10 MB retry replays');
    is($b->{content}, $a->{content}, '10 MB retry: same answer');
    my $x = $body;
    substr($x, $MAX / 2, 1) = chr(ord(substr($x, $MAX / 2, 1)) ^ 1);
    my $c = $t->http(POST => '/ten', key => $k, body => $x, @h);
    $t->is_problem($c, 409, 'fingerprint-mismatch', key => $k, name => '10 MB, one byte in the middle changed: conflict');
    is($t->effects(key => $k), 1, '10 MB binary: one effect');

    # the same body chunked (no Content-Length up front)
    my $r = ($t->parse_responses($t->raw($t->request_bytes(POST => '/ten', key => $k, body => $body,
        headers => [ 'Content-Type' => 'application/octet-stream' ], chunked => [ 65536 ]),
        timeout => 120, responses => 1)))[0];
    is($r && $r->{headers}{'idempotent-replayed'}, 'true', '10 MB chunked retry replays');
    is($t->effects(key => $k), 1, '10 MB chunked retry: still one effect');
}

# ---- a 10 MB JSON body (an array of 1.2M numbers): canonicalized from the temp file
{
    my $k = $t->key('10m-json');
    my $json = '[' . join(',', 1 .. 1_200_000) . ']';
    $json .= ' ' x ($MAX - 1 - length $json) . "\n" if length($json) < $MAX;
    ok(length($json) <= $MAX && length($json) > $MAX - 64, 'JSON body of ' . length($json) . ' bytes');
    my @h = (headers => [ 'Content-Type' => 'application/json' ], timeout => 120);
    my $a = $t->http(POST => '/ten-json', key => $k, body => $json, @h);
    is($a->{status}, 201, '10 MB JSON executes') or diag($t->show($a));
    (my $compact = $json) =~ s/\s+$//;
    my $b = $t->http(POST => '/ten-json', key => $k, body => $compact, @h);
    is($b->{headers}{'idempotent-replayed'}, 'true', '10 MB JSON without the padding replays (parsed as JSON)');
    is($t->effects(key => $k), 1, '10 MB JSON: one effect');
}

# ---- a 10 MB JSON body that takes longer to canonicalize than the Redis
# command timeout (250ms here): the time spent hashing is not Redis' time,
# the claim must not be declared lost (and left claimed) because of it
{
    my $k = $t->key('10m-slow');
    my $json = '[' . join(',', map { qq({"a":$_}) } 1 .. 700_000) . ']';
    ok(length($json) <= $MAX, 'dense JSON body of ' . length($json) . ' bytes');
    my @h = (headers => [ 'Content-Type' => 'application/json' ], timeout => 120);
    local $t->{nginx_port} = $t->{port3};
    my $a = $t->http(POST => '/ten-slow', key => $k, body => $json, @h);
    is($a->{status}, 201, 'dense 10 MB JSON, Redis timeout 250ms: executes') or diag($t->show($a));
    my $b = $t->http(POST => '/ten-slow', key => $k, body => $json, @h);
    is($b->{headers}{'idempotent-replayed'}, 'true', 'dense 10 MB JSON: the retry replays') or diag($t->show($b));
    is($t->effects(key => $k), 1, 'dense 10 MB JSON: one effect');
    my $rec = $t->record($k);
    is($rec && $rec->{state}, 'completed', 'dense 10 MB JSON: record completed, not left claimed')
        or diag(explain $rec);
}

# ---- the densest 10 MB JSON ([0,0,...], 5M values), default settings:
# executes once and replays; the worker's peak memory is reported
{
    my $k = $t->key('10m-zeros');
    my $json = '[' . join(',', (0) x 4_999_999) . ']';
    my @h = (headers => [ 'Content-Type' => 'application/json' ], timeout => 120);
    my ($w) = $t->worker_pids;
    my $hwm = sub { (Idem::Test::_slurp("/proc/$w/status") =~ /VmHWM:\s+(\d+)/)[0] // 0 };
    my $before = $hwm->();
    my $a = $t->http(POST => '/ten-zeros', key => $k, body => $json, @h);
    is($a->{status}, 201, 'dense 10 MB JSON of zeros, default Redis timeout: executes') or diag($t->show($a));
    note(sprintf('worker peak RSS %d MB -> %d MB for a %d MB JSON body', $before / 1024, $hwm->() / 1024,
        length($json) / 1048576));
    my $b = $t->http(POST => '/ten-zeros', key => $k, body => $json, @h);
    is($b->{headers}{'idempotent-replayed'}, 'true', 'dense 10 MB JSON of zeros: the retry replays');
    is($t->effects(key => $k), 1, 'dense 10 MB JSON of zeros: one effect');
}

# ---- one byte over: nginx's 413, before the module claims anything
{
    my $k = $t->key('over');
    my $body = $t->upstream_body($MAX + 1);
    my $a = $t->http(POST => '/over', key => $k, body => $body,
        headers => [ 'Content-Type' => 'application/octet-stream' ], timeout => 60);
    is($a->{status}, 413, '10 MB + 1 byte: 413 from nginx');
    ok(!$t->problem($a), '413 is nginx\'s own page, not a module problem');
    my $r = ($t->parse_responses($t->raw($t->request_bytes(POST => '/over', key => $k, body => $body,
        headers => [ 'Content-Type' => 'application/octet-stream' ], chunked => [ 65536 ]),
        timeout => 60, responses => 1)))[0];
    is($r && $r->{status}, 413, '10 MB + 1 byte chunked: 413');
    is($t->effects(uri => '/over'), 0, 'over the limit: no effect');
    ok(!$t->record($k), 'over the limit: no record in Redis');
    # the key is still free: a body within the limit executes
    my $ok = $t->http(POST => '/over', key => $k, body => 'small');
    is($ok->{status}, 201, 'the same key with a small body executes afterwards');
    ok(!exists $ok->{headers}{'idempotent-replayed'}, 'and is not a replay');
    is($t->effects(uri => '/over'), 1, 'one effect in total');
}

# ---- huge key header
{
    my $huge = 'k' x (30 * 1024);
    my $r = $t->http(POST => '/hugekey', key => $huge, json => { a => 1 });
    ok($r->{status} == 400 || $r->{status} == 494, "30 KB key header, default buffers: $r->{status} from nginx");
    ok(!$t->problem($r), 'nginx refused it before the module');
    is($t->effects(uri => '/hugekey'), 0, '30 KB key, default buffers: no effect');

    my $r2 = on_port2(sub { $t->http(POST => '/hugekey', key => $huge, json => { a => 1 }) });
    $t->is_problem($r2, 400, 'key-malformed', key => undef, name => '30 KB key through 64k buffers: 400 key-malformed');
    my $q = on_port2(sub { $t->http(POST => '/hugekey', key => qq("$huge"), json => { a => 1 }) });
    $t->is_problem($q, 400, 'key-malformed', key => undef, name => '30 KB quoted key: 400 key-malformed');
    is($t->effects(uri => '/hugekey'), 0, '30 KB key: no effect');
}

# ---- huge fingerprinted header value: part of the fingerprint, replayed
{
    my $k = $t->key('blob');
    my $blob = join '', map { chr(0x21 + $_ % 90) } 0 .. 30 * 1024 - 1;
    my $a = on_port2(sub { $t->http(POST => '/blob', key => $k, json => { a => 1 }, headers => [ 'X-Blob' => $blob ]) });
    is($a->{status}, 201, '30 KB fingerprinted header: executes') or diag($t->show($a));
    my $b = on_port2(sub { $t->http(POST => '/blob', key => $k, json => { a => 1 }, headers => [ 'X-Blob' => $blob ]) });
    is($b->{headers}{'idempotent-replayed'}, 'true', '30 KB fingerprinted header: identical retry replays');
    my $c = on_port2(sub { $t->http(POST => '/blob', key => $k, json => { a => 1 }, headers => [ 'X-Blob' => "${blob}x" ]) });
    $t->is_problem($c, 409, 'fingerprint-mismatch', key => $k, name => '30 KB header, one more byte: conflict');
    is($t->effects(uri => '/blob'), 1, '30 KB header: one effect');

    # many headers (a 60 KB header section) that do not count
    my @many = map { ("X-Pad-$_" => 'p' x 1000) } 1 .. 60;
    my $d = on_port2(sub { $t->http(POST => '/blob', key => $k, json => { a => 1 }, headers => [ 'X-Blob' => $blob, @many ]) });
    is($d->{headers}{'idempotent-replayed'}, 'true', '60 more KB of other headers: still a replay');
    is($t->effects(uri => '/blob'), 1, 'many headers: one effect');
}

$t->check_logs;
done_testing;
