#!/usr/bin/perl
# idempotency_audit, the scripted story of docs/audit.md: a first write, a
# lost response, its retry replayed, a conflicting reuse of a key, a
# duplicate while the first attempt is in flight, an upstream 503 (released,
# then executed), a worker killed with -9 mid-request (unknown, then an
# operator's resolution). Each operation's history, as `idempotency-audit
# show` prints it, is exactly the expected sequence of events; a replay is
# "replayed", never "completed" or "sent". Every entry carries the request's
# $request_id, the caller's identity and none of the secrets (the scope in
# Authorization, the body, Set-Cookie); the chain verifies, the
# error log anchors the head every 5 appends, and
# idempotency_audit_appends_total counts exactly the entries.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $t = Idem::Test->new;
$t->start_stack(<<'EOF', workers => 1, redis => { unixsocket => 1 }, log_format => 'rid=$request_id key="$idempotency_key" outcome=$idempotency_outcome');
idempotency_metrics_zone idem 64k;
server {
    listen 127.0.0.1:%%PORT%%;
    location / {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_scope $http_authorization;
        idempotency_lease 1s;
        idempotency_audit on;
        idempotency_audit_identity $http_x_user;
        idempotency_audit_ref_header X-Provider-Ref;
        idempotency_audit_stream idem:story anchor=5;
        proxy_ignore_client_abort on;
        proxy_read_timeout 30s;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /admin {
        idempotency_redis %%REDIS%%;
        idempotency_scope $http_x_client_authorization;
        idempotency_admin on;
        idempotency_audit on;
        idempotency_audit_identity $http_x_user;
        idempotency_audit_stream idem:story anchor=5;
    }
    location = /metrics {
        idempotency_metrics;
    }
}
EOF

my $SCOPE  = "Bearer scope-secret-$$";
my $BODY   = "body-secret-$$";
my $COOKIE = "sid=cookie-secret-$$";
my @who    = (Authorization => $SCOPE, 'X-User' => 'alice');

sub post {
    my ($k, $json, @h) = @_;
    return $t->http(POST => '/pay', key => $k, json => $json, headers => [ @who, @h ]);
}

# the events of an operation id or key, as the tool shows them
sub shown {
    my ($what) = @_;
    my ($rc, $out, $err) = $t->audit_tool('--stream', 'idem:story', 'show', $what);
    return [ map { (split ' ')[2] } grep { /\S/ } split /\n/, $out ];
}

sub op_of { my ($k) = @_; my $r = $t->record($k, $SCOPE); $r && $r->{op} }

# ---- A: a first write, its retry replayed, the key reused for another body
my $ka = $t->key('first');
my $r = post($ka, { pay => $BODY, n => 1 }, 'X-Reply-Header' => "Set-Cookie: $COOKIE",
             'X-Reply-Header' => 'X-Provider-Ref: tx-a');
is($r->{status}, 201, 'A: first write executes');
ok($t->wait_state($ka, $SCOPE, 'completed'), 'A: recorded');
$r = post($ka, { pay => $BODY, n => 1 });
is($r->{headers}{'idempotent-replayed'}, 'true', 'A: the retry is replayed');
$r = post($ka, { pay => $BODY, n => 2 });
is($r->{status}, 409, 'A: the key reused for another body: 409');
my $opa = op_of($ka);
is_deeply(shown($opa), [qw(attempted sent accepted completed attempted replayed attempted conflict)],
    'A: attempted sent accepted completed, then attempted replayed, then attempted conflict');
is($t->effects(key => $ka), 1, 'A: one effect');

# ---- B: the response is lost (the client gives up), the retry is replayed
my $kb = $t->key('lost');
$r = $t->http(POST => '/pay', key => $kb, json => { pay => $BODY }, timeout => 0.3,
              headers => [ @who, 'X-Delay' => 1, 'X-Reply-Header' => 'X-Provider-Ref: tx-b' ]);
is($r->{status}, 599, 'B: the client gave up before the answer');
ok($t->wait_for(sub { $t->effects(key => $kb) == 1 }, 5), 'B: reached the upstream');
ok($t->wait_state($kb, $SCOPE, 'completed', 5), 'B: recorded although nobody read it');
$r = post($kb, { pay => $BODY });
is($r->{headers}{'idempotent-replayed'}, 'true', 'B: the retry is replayed');
is_deeply(shown(op_of($kb)), [qw(attempted sent accepted completed attempted replayed)],
    'B: attempted sent accepted completed, then attempted replayed');
is($t->effects(key => $kb), 1, 'B: one effect');

# ---- C: a duplicate while the first attempt is in flight
my $kc = $t->key('dup');
my $bg = $t->http_bg(POST => '/pay', key => $kc, json => { pay => $BODY }, headers => [ @who, 'X-Delay' => 1.5 ]);
ok($t->wait_for(sub { $t->effects(key => $kc) == 1 }, 5), 'C: the first attempt reached the upstream');
$r = post($kc, { pay => $BODY });
is("$r->{status} " . $t->ptype($r), '409 in-progress', 'C: the duplicate is told in-progress');
is(($bg->result(15) // {})->{status}, 201, 'C: the first attempt completes');
ok($t->wait_state($kc, $SCOPE, 'completed'), 'C: recorded');
is_deeply(shown(op_of($kc)), [qw(attempted sent attempted in_progress accepted completed)],
    'C: attempted sent, the duplicate attempted in_progress, then accepted completed');
is($t->effects(key => $kc), 1, 'C: one effect');

# ---- D: the upstream answers 503: released; the retry executes (a new operation)
my $kd = $t->key('503');
$r = post($kd, { pay => $BODY }, 'X-Status' => 503);
is($r->{status}, 503, 'D: the upstream\'s 503 passes');
my $d1 = $t->audit_entries('idem:story')->[-1]{op};
$r = post($kd, { pay => $BODY });
is($r->{status}, 201, 'D: the retry executes');
ok($t->wait_state($kd, $SCOPE, 'completed'), 'D: recorded');
my $d2 = op_of($kd);
isnt($d2, $d1, 'D: the retry is a new operation');
is_deeply(shown($d1), [qw(attempted sent accepted released)], 'D: attempted sent accepted(503) released');
is_deeply(shown($d2), [qw(attempted sent accepted completed)], 'D: the retry: attempted sent accepted completed');
is_deeply(shown($kd), [qw(attempted sent accepted released attempted sent accepted completed)],
    'D: show by key gives both operations in order');
is($t->effects(key => $kd), 2, 'D: two effects (the 503 and the retry)');

# ---- E: kill -9 of the worker mid-request: unknown, then resolved by an operator
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
is($r->{status}, 200, 'E: an operator resolves it (complete 201)') or diag($t->show($r));
$r = post($ke, { pay => $BODY });
is("$r->{status} $r->{headers}{'idempotent-replayed'}", '201 true', 'E: then retries replay 201');
my $ope = op_of($ke);
is_deeply(shown($ope), [qw(attempted sent attempted unknown resolved attempted replayed)],
    'E: attempted sent, attempted unknown, resolved, attempted replayed');
is($t->effects(key => $ke), 1, 'E: one effect');

# ---- what the entries hold
my $all = $t->audit_entries('idem:story');
my $stream = $t->audit_stream('idem:story');
ok(!grep({ $_->{bad} } @$all), 'every entry decodes as docs/audit.md says');
is_deeply([ map { $_->{seq} } @$stream ], [ 1 .. @$stream ], 'sequence numbers 1..N, contiguous');
is_deeply([ map { $_->{id} } @$stream ], [ map { "$_-0" } 1 .. @$stream ], 'stream IDs are <seq>-0');
ok(!grep({ $_->{decoded}{version} != 2 } @$stream), 'every entry is of version 2');
ok(!grep({ @{ $_->{decoded}{events} } > 2 } @$stream), 'at most two events per entry');
is(scalar(grep { $_->{event} eq 'sent' } @$all), 6, 'six first writes...');
my %per_request;
$per_request{ $_->{request} }{ $_->{id} } = 1 for grep { $_->{event} ne 'resolved' } @$all;
ok(!grep({ keys %$_ > 2 } values %per_request), '... and no request made more than two appends');
my @sizes = map { length($_->{h}) + length($_->{e}) } @$stream;
ok(!grep({ $_ > 260 } @sizes), 'every entry (h and e) is at most 260 bytes: ' . join(' ', @sizes));

my ($bad_hash, $bad_prev) = (0, 0);
my $prev = "\0" x 32;
for my $en (@$stream) {
    $bad_hash++ unless $en->{h} eq $t->audit_digest($en->{e});
    $bad_prev++ unless $en->{decoded}{prev} eq $prev;
    $prev = $en->{h};
}
is($bad_hash, 0, 'every h is the SHA-256 of its e (computed here in Perl)');
is($bad_prev, 0, 'every prev is the h of the entry before');

my @leak = grep { my $x = join "\0", @{ $_->{fields} };
                  index($x, $SCOPE) >= 0 || index($x, "scope-secret-$$") >= 0
                  || index($x, $BODY) >= 0 || index($x, "cookie-secret-$$") >= 0 } @$all;
is(scalar @leak, 0, 'no entry holds the scope, the body or Set-Cookie (' . scalar(@$all) . ' scanned)');
is_deeply([ sort keys %{ { map { $_->{identity} => 1 } @$all } } ], [qw(alice operator-olga)],
    'the identity is the caller\'s (and the operator\'s for the resolution)');

my ($completed_a) = grep { $_->{event} eq 'completed' && $_->{key} eq $ka } @$all;
my ($produced) = $t->upstream_responses(key => $ka);
is($completed_a->{response}, $produced->{sha}, 'A: "completed" holds the SHA-256 of the body the upstream produced');
is($completed_a->{ref}, 'tx-a', 'A: and the upstream reference (X-Provider-Ref)');
is($completed_a->{status}, '201', 'A: and its status');
my ($replayed_a) = grep { $_->{event} eq 'replayed' && $_->{key} eq $ka } @$all;
is($replayed_a->{response}, $produced->{sha}, 'A: "replayed" holds the same digest');
my ($released) = grep { $_->{event} eq 'released' } @$all;
is($released->{status}, '503', 'D: "released" holds the upstream\'s 503');
my ($resolved) = grep { $_->{event} eq 'resolved' } @$all;
is($resolved->{status}, '201', 'E: "resolved" holds the status the operator gave');

# a replay is never "completed" or "sent": group by the request id
my %by_rid;
push @{ $by_rid{ $_->{request} } }, $_->{event} for @$all;
my @logged = map { /rid=([0-9a-f]{32}) .*outcome=(\w+)/ ? [$1, $2] : () } $t->access_log(12);
my @replays = grep { $_->[1] eq 'replayed' } @logged;
is(scalar @replays, 3, 'three replays in the access log');
is_deeply([ map { join ' ', @{ $by_rid{ $_->[0] } // [] } } @replays ], [ ('attempted replayed') x 3 ],
    'each replay\'s request id has exactly "attempted replayed" in the stream');
my @executed = grep { $_->[1] eq 'executed' } @logged;
ok(!grep({ !$by_rid{ $_->[0] } } @executed), 'every executed request\'s $request_id is in the stream');

# ---- the chain, the anchors in the error log, the counter
my ($rc, $out, $err) = $t->audit_tool('--stream', 'idem:story', 'verify');
is($rc, 0, 'verify: intact') or diag("$out$err");
is($out, scalar(@$stream) . " $all->[-1]{h}\n", 'verify prints the head: seq hash');
my ($urc, $uout) = $t->audit_tool('--redis', $t->redis_socket, '--stream', 'idem:story', 'verify');
is("$urc $uout", "0 $out", 'verify over the unix socket: the same head');
my @anchors = $t->error_log =~ /audit stream "idem:story" head (\d+) ([0-9a-f]{64})/g;
my %anchored = @anchors;
ok(%anchored && !grep({ $_ % 5 } keys %anchored), 'the error log anchors the head at multiples of 5');
is_deeply([ map { $anchored{$_} } sort { $a <=> $b } keys %anchored ],
          [ map { unpack 'H*', $stream->[$_ - 1]{h} } sort { $a <=> $b } keys %anchored ],
          'each anchor is that entry\'s hash');
my $m = $t->http(GET => '/metrics');
my ($appends) = $m->{content} =~ /^idempotency_audit_appends_total (\d+)$/m;
is($appends, scalar @$stream, 'idempotency_audit_appends_total = the entries in the stream');

$t->check_logs(ignore => qr/worker process \d+ exited on signal 9/);
done_testing;
