#!/usr/bin/perl
# idempotency_audit file=PATH (docs/audit.md, "The file device"): the
# scripted story of t/58-audit.t written to the stream and to a file at once
# (`idempotency_audit redis file=...`), and to a file alone in another
# location (no stream: Redis appends nothing). For each operation the file
# holds the same sequence of events as the stream, read back with
# `idempotency-audit show --file`; the lines carry the stream's fields (the
# same op, key, fingerprint, request id, response digest), one line per step
# as one stream entry per step (format version 2: a first write is two
# lines, the claim's "attempted sent" and the completion's "accepted
# completed"); `verify --file` passes, with seq 1..N; the file's head is anchored in the error log every
# anchor= entries; a restart continues the chain from the file's last line;
# `nginx -t` refuses bad file=/fsync= values, and the stream with a cluster
# while it accepts the file. An upgrade: a file of version-1 lines (one line
# per event, as the module wrote before) goes on with version-2 lines
# chained on its last line, and the mixed file verifies and shows. A
# version-2 line with an event field equal to the line's, no event, five
# events or a member the format does not define is refused by verify, the
# line named. Row 16 of issue 35: verify of a stream that is
# not there, or of an empty file, fails ("no entries") unless --allow-empty;
# an entry with a field the encoding does not define fails, named.

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
my $FILE = "$P/story.log";
my $SOLO = "$P/solo.log";

# ---- nginx -t
my $dead = Idem::Test::free_port();
my $R = "idempotency_redis 127.0.0.1:$dead;";
for my $c (
    [ 'fsync= without file=', "idempotency_audit on fsync=every;", qr/"idempotency_audit" directive has fsync= without file=/ ],
    [ 'fsync=0', "idempotency_audit file=$P/a.log fsync=0;", qr/"idempotency_audit": invalid parameter "fsync=0"/ ],
    [ 'fsync=sometimes', "idempotency_audit file=$P/a.log fsync=sometimes;", qr/invalid parameter "fsync=sometimes"/ ],
    [ 'file= empty', "idempotency_audit file=;", qr/invalid parameter "file="/ ],
    [ 'two file=', "idempotency_audit file=$P/a.log file=$P/b.log;", qr/invalid parameter "file=\Q$P\E\/b.log"/ ],
    [ 'an unknown word', "idempotency_audit stream;", qr/invalid parameter "stream"/ ],
    [ 'off with a file', "idempotency_audit off file=$P/a.log;", qr/invalid parameter "off"/ ],
    [ 'a directory', "idempotency_audit file=$P;", qr/\[emerg\].*open\(\) "\Q$P\E" failed/ ],
) {
    my ($rc, $out) = $t->nginx_test_conf("server { listen 127.0.0.1:1; location / { idempotency on; $R $c->[1] } }");
    isnt($rc, 0, "nginx -t refuses $c->[0]");
    like($out, $c->[2], "$c->[0]: says why") or diag($out);
}
{
    my ($rc, $out) = $t->nginx_test_conf("server { listen 127.0.0.1:1;
        location /a { idempotency on; $R idempotency_audit file=$P/a.log fsync=every; }
        location /b { idempotency on; $R idempotency_audit file=$P/a.log; } }");
    like($out, qr/audit file "\Q$P\E\/a.log" is written with two fsync= settings/, 'one file, two fsync=: refused');
    ($rc, $out) = $t->nginx_test_conf("server { listen 127.0.0.1:1;
        location /a { idempotency on; $R idempotency_audit file=$P/a.log; idempotency_audit_stream s anchor=5; }
        location /b { idempotency on; $R idempotency_audit file=$P/a.log; } }");
    like($out, qr/audit file "\Q$P\E\/a.log" is written with two different "idempotency_audit_key" or anchor= settings/,
         'one file, two anchors: refused');
    for my $ok ('on', 'redis', 'off', "file=$P/a.log", "redis file=$P/a.log fsync=every", "file=$P/a.log fsync=100 on") {
        ($rc, $out) = $t->nginx_test_conf("server { listen 127.0.0.1:1; location / { idempotency on; $R idempotency_audit $ok; } }");
        is($rc, 0, "nginx -t accepts idempotency_audit $ok") or diag($out);
    }
    Idem::Test::_spew("$P/garbage.log", "not a line of the module\n");
    ($rc, $out) = $t->nginx_test_conf("server { listen 127.0.0.1:1; location / { idempotency on; $R idempotency_audit file=$P/garbage.log; } }");
    isnt($rc, 0, 'nginx -t refuses a file that ends with a line the module did not write');
    like($out, qr/audit file "\Q$P\E\/garbage.log" ends with a line the module did not write \(not a JSON object\): its chain cannot go on/,
         'and says why') or diag($out);
    Idem::Test::_spew("$P/torn.log", "{\"v\":1,");
    ($rc, $out) = $t->nginx_test_conf("server { listen 127.0.0.1:1; location / { idempotency on; $R idempotency_audit file=$P/torn.log; } }");
    is($rc, 0, 'a file that ends inside a line (a cut write) is taken: its next line starts anew') or diag($out);
    my $C = "idempotency_redis_cluster 127.0.0.1:$dead;";
    ($rc, $out) = $t->nginx_test_conf("server { listen 127.0.0.1:1; location / { idempotency on; $C idempotency_audit file=$P/a.log; } }");
    is($rc, 0, 'nginx -t accepts the file device with idempotency_redis_cluster') or diag($out);
    ($rc, $out) = $t->nginx_test_conf("server { listen 127.0.0.1:1; location / { idempotency on; $C idempotency_audit redis file=$P/a.log; } }");
    like($out, qr/"idempotency_audit" cannot be used with "idempotency_redis_cluster"/, 'the stream stays refused with a cluster');
}

# a file an older module wrote: two version-1 lines, a claim's attempted and sent
my $V1 = "$P/v1.log";
my %v1 = (approver => '', fingerprint => 'ab' x 32, identity => 'alice', key => 'k-v1-old',
          operation_id => '0123456789abcdef0123456789abcdef', ref => '', request_id => 'fe' x 16,
          response_sha256 => '', route => '/v1up', status => undef, time => 1733460000123, v => 1);
my ($v1a, $v1h) = $t->audit_file_forge({ %v1, event => 'attempted', seq => 1, prev => '0' x 64 });
my $v1b = $t->audit_file_forge({ %v1, event => 'sent', seq => 2, prev => $v1h });
Idem::Test::_spew($V1, "$v1a\n$v1b\n");

$t->start_stack(<<"EOF", workers => 1, log_format => 'rid=$request_id key="$idempotency_key" outcome=$idempotency_outcome');
idempotency_metrics_zone idem 64k;
server {
    listen 127.0.0.1:%%PORT%%;
    location / {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_scope \$http_authorization;
        idempotency_lease 1s;
        idempotency_audit redis file=$FILE;
        idempotency_audit_identity \$http_x_user;
        idempotency_audit_ref_header X-Provider-Ref;
        idempotency_audit_stream idem:story anchor=5;
        proxy_ignore_client_abort on;
        proxy_read_timeout 30s;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /solo {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_scope \$http_authorization;
        idempotency_lease 1s;
        idempotency_audit file=$SOLO fsync=every;
        idempotency_audit_identity \$http_x_user;
        idempotency_audit_stream idem:solo anchor=4;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /solorep {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_redis_wait 1 50ms;
        idempotency_audit file=$P/rep.log;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /solowait {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_scope \$http_authorization;
        idempotency_wait 5s;
        idempotency_audit file=$SOLO fsync=every;
        idempotency_audit_identity \$http_x_user;
        idempotency_audit_stream idem:solo anchor=4;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /v1up {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_audit file=$V1;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /admin {
        idempotency_redis %%REDIS%%;
        idempotency_scope \$http_x_client_authorization;
        idempotency_admin on;
        idempotency_audit redis file=$FILE;
        idempotency_audit_identity \$http_x_user;
        idempotency_audit_stream idem:story anchor=5;
    }
    location = /metrics {
        idempotency_metrics;
    }
}
EOF

my $SCOPE = "Bearer scope-secret-$$";
my $BODY  = "body-secret-$$";
my @who   = (Authorization => $SCOPE, 'X-User' => 'alice');

sub post {
    my ($k, $json, @h) = @_;
    return $t->http(POST => '/pay', key => $k, json => $json, headers => [ @who, @h ]);
}

sub events { my ($out) = @_; [ map { (split ' ')[2] } grep { /\S/ } split /\n/, $out ] }

# the events of an operation id or key: [stream's, file's]
sub shown {
    my ($what) = @_;
    my ($rc, $out) = $t->audit_tool('show', $what, '--stream', 'idem:story');
    my ($frc, $fout, $ferr) = $t->audit_tool('show', $what, '--file', $FILE);
    diag($ferr) if $ferr;
    return (events($out), events($fout));
}

sub same_story {
    my ($what, $want, $name) = @_;
    my ($s, $f) = shown($what);
    is_deeply($s, $want, "$name (stream)");
    is_deeply($f, $want, "$name (file, show --file)");
}

sub op_of { my ($k) = @_; my $r = $t->record($k, $SCOPE); $r && $r->{op} }

# ---- A: a first write, its retry replayed, the key reused for another body
my $ka = $t->key('first');
my $r = post($ka, { pay => $BODY, n => 1 }, 'X-Reply-Header' => 'X-Provider-Ref: tx-a');
is($r->{status}, 201, 'A: first write executes');
ok($t->wait_state($ka, $SCOPE, 'completed'), 'A: recorded');
$r = post($ka, { pay => $BODY, n => 1 });
is($r->{headers}{'idempotent-replayed'}, 'true', 'A: the retry is replayed');
$r = post($ka, { pay => $BODY, n => 2 });
is($r->{status}, 409, 'A: the key reused for another body: 409');
same_story(op_of($ka), [qw(attempted sent accepted completed attempted replayed attempted conflict)], 'A');
is($t->effects(key => $ka), 1, 'A: one effect');

# ---- B: the response is lost, the retry is replayed
my $kb = $t->key('lost');
$r = $t->http(POST => '/pay', key => $kb, json => { pay => $BODY }, timeout => 0.3,
              headers => [ @who, 'X-Delay' => 1 ]);
is($r->{status}, 599, 'B: the client gave up before the answer');
ok($t->wait_state($kb, $SCOPE, 'completed', 5), 'B: recorded although nobody read it');
$r = post($kb, { pay => $BODY });
is($r->{headers}{'idempotent-replayed'}, 'true', 'B: the retry is replayed');
same_story(op_of($kb), [qw(attempted sent accepted completed attempted replayed)], 'B');

# ---- C: a duplicate while the first attempt is in flight
my $kc = $t->key('dup');
my $bg = $t->http_bg(POST => '/pay', key => $kc, json => { pay => $BODY }, headers => [ @who, 'X-Delay' => 1.5 ]);
ok($t->wait_for(sub { $t->effects(key => $kc) == 1 }, 5), 'C: the first attempt reached the upstream');
$r = post($kc, { pay => $BODY });
is("$r->{status} " . $t->ptype($r), '409 in-progress', 'C: the duplicate is told in-progress');
is(($bg->result(15) // {})->{status}, 201, 'C: the first attempt completes');
ok($t->wait_state($kc, $SCOPE, 'completed'), 'C: recorded');
same_story(op_of($kc), [qw(attempted sent attempted in_progress accepted completed)], 'C');

# ---- D: the upstream answers 503: released; the retry executes
my $kd = $t->key('503');
$r = post($kd, { pay => $BODY }, 'X-Status' => 503);
is($r->{status}, 503, 'D: the upstream\'s 503 passes');
$r = post($kd, { pay => $BODY });
is($r->{status}, 201, 'D: the retry executes');
ok($t->wait_state($kd, $SCOPE, 'completed'), 'D: recorded');
same_story($kd, [qw(attempted sent accepted released attempted sent accepted completed)], 'D (by key)');

# ---- E: kill -9 of the worker mid-request: unknown, then resolved
my $ke = $t->key('kill');
$bg = $t->http_bg(POST => '/pay', key => $ke, json => { pay => $BODY }, headers => [ @who, 'X-Delay' => 3 ],
                  timeout => 15);
ok($t->wait_for(sub { $t->effects(key => $ke) == 1 }, 5), 'E: reached the upstream');
ok($t->kill_worker, 'E: the worker holding the claim is killed (-9)');
$bg->result(15);
ok($t->wait_for(sub { my $l = $t->lease_left($t->record($ke, $SCOPE)); defined $l && $l <= 0 }, 10),
   'E: the dead owner\'s lease lapses');
$r = post($ke, { pay => $BODY });
is("$r->{status} " . $t->ptype($r), '409 outcome-unknown', 'E: the retry after the lapse: outcome-unknown');
$r = $t->http(POST => '/admin?action=complete&status=201', key => $ke,
              headers => [ 'X-Client-Authorization' => $SCOPE, 'X-User' => 'operator-olga' ]);
is($r->{status}, 200, 'E: an operator resolves it') or diag($t->show($r));
$r = post($ke, { pay => $BODY });
is("$r->{status} $r->{headers}{'idempotent-replayed'}", '201 true', 'E: then retries replay 201');
same_story(op_of($ke), [qw(attempted sent attempted unknown resolved attempted replayed)], 'E');
is($t->effects(key => $ke), 1, 'E: one effect');

# ---- the file's lines: the stream's fields, a chain of its own
my @lines = @{ $t->audit_file_lines($FILE) };
my $fev = $t->audit_file_events($FILE);
my $all = $t->audit_entries('idem:story');
is(scalar @lines, scalar @{ $t->audit_stream('idem:story') },
   'the file has as many lines as the stream has entries, one a step (' . scalar(@lines) . ')');
is(scalar @$fev, scalar @$all, 'and as many events (' . scalar(@$fev) . ')');
my @diff;
for my $i (0 .. $#$fev) {
    my ($l, $s) = ($fev->[$i], $all->[$i]);
    my %want = (event => $s->{event}, operation_id => $s->{op}, key => $s->{key}, fingerprint => $s->{fp},
                route => $s->{route}, identity => $s->{identity}, approver => $s->{approver},
                response_sha256 => $s->{response}, ref => $s->{ref}, request_id => $s->{request},
                status => $s->{status} eq '' ? undef : 0 + $s->{status}, index => $s->{index});
    for (sort keys %want) {
        push @diff, "event $i $_" unless (defined $l->{$_} ? $l->{$_} : 'null') eq (defined $want{$_} ? $want{$_} : 'null');
    }
}
is("@diff", '', 'each event holds the fields of the stream\'s, at the same place of a line as in its entry');
is_deeply([ map { $_->{seq} } @lines ], [ 1 .. @lines ], 'the file\'s seq: 1..N');
is_deeply([ sort keys %{ $lines[0] } ],
          [ sort qw(approver events fingerprint hash identity key operation_id prev ref request_id
                    response_sha256 route seq status v) ], 'the members of a line (docs/audit.md)');
is_deeply([ map { $_->{v} } @lines ], [ (2) x @lines ], 'every line is version 2');
my @extra = grep { my $o = $_; grep { my $e = $_; grep { exists $e->{$_} && ($e->{$_} // '') eq ($o->{$_} // '') }
                                      @Idem::Test::AUDIT_FILE_FIELDS } @{ $o->{events} } } @lines;
is(scalar @extra, 0, 'no event repeats a field of its line');
is_deeply([ map { join ',', sort keys %{ $_->{events}[-1] } } @lines ], [ ('event,time') x @lines ],
          'the last event of each line is its name and time: the line\'s fields are its');
my $ka_op = op_of($ka);
is_deeply([ map { join ' ', map { $_->{event} } @{ $_->{events} } } grep { $_->{operation_id} eq $ka_op } @lines ],
          [ 'attempted sent', 'accepted completed', 'attempted replayed', 'attempted conflict' ],
          'A: a first write is two lines, the claim\'s and the completion\'s; a replay and a conflict one each');

# the chain, computed here from docs/audit.md: canonical form without "hash"
my $prev = '0' x 64;
my ($bad_hash, $bad_prev) = (0, 0);
for my $line (grep { /\S/ } split /\n/, Idem::Test::_slurp($FILE)) {
    my ($body, $h) = $line =~ /^(.*),"hash":"([0-9a-f]{64})"\}$/ or do { $bad_hash++; next };
    $bad_hash++ unless $t->sha256("$body}") eq $h;
    my $o = decode_json($line);
    $bad_prev++ unless $o->{prev} eq $prev;
    $prev = $h;
}
is($bad_hash, 0, 'every hash is the SHA-256 of the line without "hash" (its canonical form)');
is($bad_prev, 0, 'every prev is the hash of the line before');

my ($rc, $out, $err) = $t->audit_tool('verify', '--file', $FILE);
is($rc, 0, 'verify --file: intact') or diag("$out$err");
is($out, scalar(@lines) . " $prev\n", 'verify --file prints the head: seq hash');
my @anchors = $t->error_log =~ /audit file "\Q$FILE\E" head (\d+) ([0-9a-f]{64})/g;
my %anchored = @anchors;
ok(%anchored && !grep({ $_ % 5 } keys %anchored), 'the error log anchors the file\'s head at multiples of 5');

# ---- the file alone (no stream): the same histories, nothing in Redis
my $ks = $t->key('solo');
$r = $t->http(POST => '/solo', key => $ks, json => { pay => 1 }, headers => [ @who ]);
is($r->{status}, 201, 'solo: first write executes');
ok($t->wait_state($ks, $SCOPE, 'completed'), 'solo: recorded');
$r = $t->http(POST => '/solo', key => $ks, json => { pay => 1 }, headers => [ @who ]);
is($r->{headers}{'idempotent-replayed'}, 'true', 'solo: the retry is replayed');
$r = $t->http(POST => '/solo', key => $ks, json => { pay => 2 }, headers => [ @who ]);
is($r->{status}, 409, 'solo: the key reused for another body: 409');
my $kd2 = $t->key('solo503');
$r = $t->http(POST => '/solo', key => $kd2, json => { pay => 1 }, headers => [ @who, 'X-Status' => 503 ]);
is($r->{status}, 503, 'solo: an upstream 503');
my $kc2 = $t->key('solodup');
my $bg2 = $t->http_bg(POST => '/solo', key => $kc2, json => { c => 1 }, headers => [ @who, 'X-Delay' => 1.5 ]);
ok($t->wait_for(sub { $t->effects(key => $kc2) == 1 }, 5), 'solo: a first attempt in flight');
$r = $t->http(POST => '/solo', key => $kc2, json => { c => 1 }, headers => [ @who ]);
is("$r->{status} " . $t->ptype($r), '409 in-progress', 'solo: its duplicate: in-progress');
is(($bg2->result(15) // {})->{status}, 201, 'solo: the first completes');
ok($t->wait_state($kc2, $SCOPE, 'completed'), 'solo: recorded');
my $ke2 = $t->key('solokill');
$bg2 = $t->http_bg(POST => '/solo', key => $ke2, json => { e => 1 }, headers => [ @who, 'X-Delay' => 3 ], timeout => 15);
ok($t->wait_for(sub { $t->effects(key => $ke2) == 1 }, 5), 'solo: another at the upstream');
ok($t->kill_worker, 'solo: its worker killed (-9)');
$bg2->result(15);
ok($t->wait_for(sub { my $l = $t->lease_left($t->record($ke2, $SCOPE)); defined $l && $l <= 0 }, 10), 'solo: its lease lapses');
$r = $t->http(POST => '/solo', key => $ke2, json => { e => 1 }, headers => [ @who ]);
is("$r->{status} " . $t->ptype($r), '409 outcome-unknown', 'solo: the retry: outcome-unknown');
my $kw = $t->key('solowait');
$bg2 = $t->http_bg(POST => '/solowait', key => $kw, json => { w => 1 }, headers => [ @who, 'X-Delay' => 1.5 ]);
ok($t->wait_for(sub { $t->effects(key => $kw) == 1 }, 5), 'solo wait: a first attempt in flight');
$r = $t->http(POST => '/solowait', key => $kw, json => { w => 1 }, headers => [ @who ]);
is("$r->{status} $r->{headers}{'idempotent-replayed'}", '201 true', 'solo wait: the duplicate waited and replays');
is(($bg2->result(15) // {})->{status}, 201, 'solo wait: the first completed');
is($t->effects(key => $kw), 1, 'solo wait: one effect');
($rc, $out) = $t->audit_tool('show', $kw, '--file', $SOLO);
is_deeply(events($out), [qw(attempted sent accepted completed attempted replayed)],
          'solo wait: the waiting duplicate is "attempted replayed", after the completion');
($rc, $out) = $t->audit_tool('show', $kc2, '--file', $SOLO);
is_deeply(events($out), [qw(attempted sent attempted in_progress accepted completed)], 'solo: the duplicate\'s story');
($rc, $out) = $t->audit_tool('show', $ke2, '--file', $SOLO);
is_deeply(events($out), [qw(attempted sent attempted unknown)], 'solo: the lapsed lease\'s story');
($rc, $out) = $t->audit_tool('show', $ks, '--file', $SOLO);
is_deeply(events($out), [qw(attempted sent accepted completed attempted replayed attempted conflict)],
          'solo: the file holds the story');
($rc, $out) = $t->audit_tool('--file', $SOLO, 'show', $kd2);
is_deeply(events($out), [qw(attempted sent accepted released)], 'solo: and the released attempt');
is($t->redis('EXISTS', 'idem:solo'), 0, 'solo: no stream in Redis');
is_deeply([ map { join ' ', map { $_->{event} } @{ $_->{events} } } grep { $_->{key} eq $ks } @{ $t->audit_file_lines($SOLO) } ],
          [ 'attempted sent', 'accepted completed', 'attempted replayed', 'attempted conflict' ],
          'solo: the first write is exactly two lines (its claim, its completion), the replay and the conflict one each');
is($t->effects(key => $ks), 1, 'solo: one effect');
($rc, $out, $err) = $t->audit_tool('verify', $SOLO);
is($rc, 0, 'solo: verify FILE (a file after the command)') or diag("$out$err");
my $nsolo = @{ $t->audit_file_lines($SOLO) };
@anchors = $t->error_log =~ /audit file "\Q$SOLO\E" head (\d+) /g;
is("@anchors", join(' ', grep { $_ % 4 == 0 } 1 .. $nsolo), "solo: the head anchored every 4 entries (anchor=4) of $nsolo");
($rc, $out) = $t->audit_tool('export', '--file', $SOLO, '--from', $nsolo - 1);
is(scalar(() = $out =~ /\n/g), 2, 'export --file --from N-1: the last two lines');
like($out, qr/^\{"approver":"","events":\[\{"event":"accepted".*"seq":${\($nsolo - 1)},.*\n
                \{"approver":"","events":\[\{"event":"attempted".*\{"event":"replayed".*"seq":$nsolo,/x,
     'export --file prints the lines as they are (the last: the completion, then the waiter\'s replay)');

# $request_id made by the module from its reserve of random bytes (docs/audit.md,
# "The request id"): what the access log prints, one id per request
my %rid_file;
for my $o (@{ $t->audit_file_events($SOLO) }) {
    $rid_file{ $o->{request_id} } = 1 if $o->{key} eq $ks;
}
my %rid_log = map { /^rid=([0-9a-f]{32}) key="\Q$ks\E"/ ? ($1 => 1) : () } $t->access_log;
is(join(' ', sort keys %rid_file), join(' ', sort keys %rid_log),
   'solo: the lines\' request_id is the access log\'s $request_id');
is(scalar(keys %rid_file), 3, 'solo: one id per request (first write, replay, conflict)');

# a claim waiting for its lines (written with the turn's others), then for a
# replica that is not there: released, 503, never executed
my $kr = $t->key('solorep');
$r = $t->http(POST => '/solorep', key => $kr, json => { r => 1 });
is("$r->{status} " . $t->ptype($r), '503 store-not-replicated',
   'solo WAIT: the claim written, then not replicated: 503 store-not-replicated');
is($t->effects(key => $kr), 0, 'solo WAIT: never executed');
ok($t->wait_for(sub { ($t->audit_tool('show', $kr, '--file', "$P/rep.log"))[1] =~ /released/ }, 5),
   'solo WAIT: the release is written');
($rc, $out) = $t->audit_tool('show', $kr, '--file', "$P/rep.log");
is_deeply(events($out), [qw(attempted sent released)], 'solo WAIT: attempted, sent, released');

# ---- an upgrade: the version-1 file goes on in version 2
my $kv = $t->key('v1up');
$r = $t->http(POST => '/v1up', key => $kv, json => { v => 1 });
is($r->{status}, 201, 'upgrade: a first write on a file of version-1 lines');
ok($t->wait_state($kv, '', 'completed'), 'upgrade: recorded');
my $vl = $t->audit_file_lines($V1);
is_deeply([ map { "$_->{seq}:$_->{v}" } @$vl ], [ '1:1', '2:1', '3:2', '4:2' ],
          'upgrade: two version-2 lines (claim, completion) after the two version-1 lines');
is($vl->[2]{prev}, $vl->[1]{hash}, 'upgrade: the first version-2 line is chained on the last version-1 line');
($rc, $out, $err) = $t->audit_tool('verify', '--file', $V1);
is($rc, 0, 'upgrade: verify --file of the mixed file: intact') or diag("$out$err");
like($err, qr/^4 entries \(1 to 4, 6 events\)/m, 'upgrade: 4 lines, 6 events') or diag($err);
($rc, $out) = $t->audit_tool('show', 'k-v1-old', '--file', $V1);
like($out, qr/^1 \S+ attempted .*\n2 \S+ sent /, 'upgrade: show names a version-1 line\'s event by its line') or diag($out);
($rc, $out) = $t->audit_tool('show', $kv, '--file', $V1);
like($out, qr/^3\.1 \S+ attempted .*\n3\.2 \S+ sent .*\n4\.1 \S+ accepted .*\n4\.2 \S+ completed /,
     'upgrade: and a version-2 line\'s events by line and place') or diag($out);

# ---- a restart: the chain goes on from the file's last line
my $m = $t->http(GET => '/metrics');
like($m->{content}, qr/^idempotency_audit_errors_total\{device="file"\} 0$/m, 'no audit error counted');
$t->restart_nginx;
my $k2 = $t->key('after');
$r = $t->http(POST => '/solo', key => $k2, json => { pay => 1 }, headers => [ @who ]);
is($r->{status}, 201, 'after a restart: a first write');
ok($t->wait_state($k2, $SCOPE, 'completed'), 'after a restart: recorded');
($rc, $out, $err) = $t->audit_tool('verify', '--file', $SOLO);
is($rc, 0, 'after a restart: verify --file still intact (the chain went on)') or diag("$out$err");
like($out, qr/^${\($nsolo + 2)} [0-9a-f]{64}$/, "after a restart: the first write's 2 lines follow entry $nsolo");

# ---- issue 35 row 16: nothing to verify is no proof
($rc, $out) = $t->audit_tool('--stream', 'idem:typo', 'verify');
is($rc, 1, 'verify of a stream that does not exist: exit 1');
like($out, qr/^no entries: stream "idem:typo" is empty or does not exist/m, 'it says "no entries"');
($rc, $out) = $t->audit_tool('verify', '--stream', 'idem:typo', '--allow-empty');
is("$rc $out", "0 0 ${\('0' x 64)}\n", '--allow-empty: a new deployment verifies, head 0 genesis');
open(my $fh, '>', "$P/empty.log") or die;
close $fh;
($rc, $out) = $t->audit_tool('verify', '--file', "$P/empty.log");
is($rc, 1, 'verify --file of an empty file: exit 1');
like($out, qr/^no entries/m, 'it says "no entries"');
my $s12 = $t->audit_stream('idem:story');
$t->redis('XADD', 'idem:extra', '1-0', 'h', $s12->[0]{h}, 'e', $s12->[0]{e});
$t->redis('XADD', 'idem:extra', '2-0', 'h', $s12->[1]{h}, 'e', $s12->[1]{e}, 'note', 'x');
($rc, $out) = $t->audit_tool('verify', '--stream', 'idem:extra');
is($rc, 1, 'a stream entry with a field the encoding does not define: exit 1');
like($out, qr/^entry 2: inserted: a field the encoding does not define: "note"/m, 'named, with the field')
    or diag($out);
my $first = (split /\n/, Idem::Test::_slurp($FILE))[0];
(my $extra = $first) =~ s/^\{/{"note":"x",/;
Idem::Test::_spew("$P/extra.log", "$extra\n");
($rc, $out) = $t->audit_tool('verify', '--file', "$P/extra.log");
is($rc, 1, 'a line with a member the format does not define: exit 1');
like($out, qr/^\Q$P\E\/extra.log:1: modified: not an entry the module writes: a member the format does not define: "note"/m,
     'named, with the member') or diag($out);

# version 2's own rules, each on the third line of a copy of the solo file
# (re-hashed, so that only the rule can refuse it)
my @solo = @{ $t->audit_file_lines($SOLO) };
for my $c (
    [ 'an event with a field equal to the line\'s', sub { $_[0]{events}[0]{key} = $_[0]{key} },
      qr/event 1: "key" is the line's/ ],
    [ 'the last event with a field of its own', sub { $_[0]{events}[-1]{route} = '/elsewhere' },
      qr/event \d has fields of its own/ ],
    [ 'no event', sub { $_[0]{events} = [] }, qr/"events" has 0 events, not 1 to 4/ ],
    [ 'five events', sub { unshift @{ $_[0]{events} }, map { { event => 'attempted', time => 1, key => "x$_" } } 1 .. 5 - @{ $_[0]{events} } },
      qr/"events" has 5 events, not 1 to 4/ ],
    [ 'an unknown member in an event', sub { $_[0]{events}[0]{note} = 'x' },
      qr/event 1: a member the format does not define: "note"/ ],
    [ 'an unknown member', sub { $_[0]{note} = 'x' }, qr/a member the format does not define: "note"/ ],
    [ 'a version-1 member in a version-2 line', sub { $_[0]{time} = 1 },
      qr/a member the format does not define in version 2: "time"/ ],
) {
    my ($what, $edit, $why) = @$c;
    my @l = map { JSON::PP->new->decode(JSON::PP->new->encode($_)) } @solo[0 .. 3];
    $edit->($l[2]);
    my ($text2, $h2) = $t->audit_file_forge($l[2]);
    $l[3]{prev} = $h2;
    Idem::Test::_spew("$P/v2rule.log", join '', map { "$_\n" } scalar($t->audit_file_forge($l[0])),
                      scalar($t->audit_file_forge($l[1])), $text2, scalar($t->audit_file_forge($l[3])));
    ($rc, $out) = $t->audit_tool('verify', '--file', "$P/v2rule.log");
    is($rc, 1, "verify refuses $what");
    like($out, qr/^\Q$P\E\/v2rule\.log:3: modified: not an entry the module writes: $why/m, "$what: line 3 named")
        or diag($out);
}
{
    my @l = map { JSON::PP->new->decode(JSON::PP->new->encode($_)) } @solo[0 .. 3];
    Idem::Test::_spew("$P/v2rule.log", join '', map { scalar($t->audit_file_forge($_)) . "\n" } @l);
    ($rc, $out) = $t->audit_tool('verify', '--file', "$P/v2rule.log");
    is($rc, 0, 'the same four lines forged by the same code unchanged: intact (the cases above fail by their rule)')
        or diag($out);
}

$t->check_logs(ignore => qr/worker process \d+ exited on signal 9/);
done_testing;
