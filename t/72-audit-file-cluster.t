#!/usr/bin/perl
# The audit file device with idempotency_redis_cluster (docs/audit.md,
# "With other features"): nginx -t accepts it (the stream stays refused),
# and the scripted story of t/58-audit.t on a cluster of 3 masters, with a
# key on each master: the file holds each operation's events as the
# stream would (read back with `idempotency-audit show --file`), each key
# executed as the story says, and `verify --file` passes.  With
# idempotency_unique and idempotency_lock, whose keys are taken in a step of
# their own there (docs/business-keys.md): the events of one server, the
# claim's "sent" written by that step before the upstream sees the request,
# and a file that cannot write it refuses the request (503).

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $t = Idem::Test->new;
my $p = $t->prefix;
my $FILE = "$p/cluster.log";
my $dead = Idem::Test::free_port();

my ($rc, $out) = $t->nginx_test_conf("server { listen 127.0.0.1:1; location / { idempotency on;
    idempotency_redis_cluster 127.0.0.1:$dead; idempotency_audit on; } }");
like($out, qr/"idempotency_audit" cannot be used with "idempotency_redis_cluster"/, 'nginx -t: the stream is refused with a cluster');

my @ports = $t->start_cluster(masters => 3, replicas => 0);
my $seeds = join ' ', map { "127.0.0.1:$_" } @ports;
$t->start_upstream;
my $FULL = "$p/full.log";
$t->start_nginx(<<"EOF", workers => 2);
idempotency_json_var \$source_event_id /source_event_id;
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis_cluster $seeds connect_timeout=300ms timeout=2s;
    proxy_ignore_client_abort on;
    location / {
        idempotency on;
        idempotency_lease 1s;
        idempotency_audit file=$FILE;
        idempotency_audit_identity \$http_x_user;
        proxy_read_timeout 30s;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /tickets {
        idempotency on;
        idempotency_lease 1s;
        idempotency_unique tickets:\$source_event_id;
        idempotency_audit file=$FILE;
        idempotency_audit_identity \$http_x_user;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /deploy {
        idempotency on;
        idempotency_lease 1s;
        idempotency_lock deploy:\$http_x_env;
        idempotency_audit file=$FILE;
        idempotency_audit_identity \$http_x_user;
        proxy_read_timeout 30s;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /full {
        idempotency on;
        idempotency_lease 1s;
        idempotency_unique full:\$source_event_id;
        idempotency_lock full:\$http_x_env;
        idempotency_audit file=$FULL;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /admin {
        idempotency_admin on;
        idempotency_audit file=$FILE;
        idempotency_audit_identity \$http_x_user;
    }
}
EOF

my @owner = @{ $t->cluster_owners };
my @masters = do { my %m = map { $_ => 1 } grep { defined } @owner; sort keys %m };
is(scalar @masters, 3, 'three masters serve the slots');
sub key_on { my ($tag, $port) = @_; $t->key_where($tag, sub { ($owner[$_[0]] // 0) == $port }) }

sub shown {
    my ($what) = @_;
    my ($rc, $out) = $t->audit_tool('show', $what, '--file', $FILE, '--redis', "127.0.0.1:$ports[0]");
    return [ map { (split ' ')[2] } grep { /\S/ } split /\n/, $out ];
}
# the events' places, LINE.INDEX each (show's first column)
sub placed {
    my ($what) = @_;
    my ($rc, $out) = $t->audit_tool('show', $what, '--file', $FILE, '--redis', "127.0.0.1:$ports[0]");
    return join ' ', map { (split ' ')[0] } grep { /\S/ } split /\n/, $out;
}
sub post { my ($k, $json, @h) = @_; $t->http(POST => '/pay', key => $k, json => $json, headers => [ 'X-User' => 'alice', @h ]) }

for my $m (@masters) {
    # A: a first write, its retry replayed, the key reused for another body
    my $ka = key_on('a', $m);
    my $r = post($ka, { n => 1 });
    is($r->{status}, 201, "master $m: A: first write executes");
    ok($t->wait_for(sub { "@{ shown($ka) }" eq 'attempted sent accepted completed' }, 5), "master $m: A: completed");
    $r = post($ka, { n => 1 });
    is($r->{headers}{'idempotent-replayed'}, 'true', "master $m: A: the retry is replayed");
    $r = post($ka, { n => 2 });
    is($r->{status}, 409, "master $m: A: another body: 409");
    is_deeply(shown($ka), [qw(attempted sent accepted completed attempted replayed attempted conflict)], "master $m: A: the story in the file");
    like(placed($ka), qr/^(\d+)\.1 (\d+)\.2 (\d+)\.1 \3\.2 (\d+)\.1 \4\.2 (\d+)\.1 \5\.2$/,
         "master $m: A: one line per step, two events each (the first write: two lines)") or diag(placed($ka));
    like(placed($ka), qr/^(\d+)\.1 \1\.2 /, "master $m: A: the claim's attempted and sent in one line");
    is($t->effects(key => $ka), 1, "master $m: A: one effect");

    # C: a duplicate while the first attempt is in flight
    my $kc = key_on('c', $m);
    my $bg = $t->http_bg(POST => '/pay', key => $kc, json => { c => 1 }, headers => [ 'X-User' => 'alice', 'X-Delay' => 1.5 ]);
    ok($t->wait_for(sub { $t->effects(key => $kc) == 1 }, 5), "master $m: C: the first reached the upstream");
    $r = post($kc, { c => 1 });
    is("$r->{status} " . $t->ptype($r), '409 in-progress', "master $m: C: the duplicate: in-progress");
    is(($bg->result(15) // {})->{status}, 201, "master $m: C: the first completes");
    ok($t->wait_for(sub { "@{ shown($kc) }" eq 'attempted sent attempted in_progress accepted completed' }, 5),
       "master $m: C: attempted sent attempted in_progress accepted completed") or diag("@{ shown($kc) }");

    # D: the upstream answers 503: released; the retry executes
    my $kd = key_on('d', $m);
    $r = post($kd, { d => 1 }, 'X-Status' => 503);
    is($r->{status}, 503, "master $m: D: the upstream's 503");
    # the 503 reaches the client before its own worker writes `accepted released`; a
    # retry another worker executes at once would interleave its lines with those
    ok($t->wait_for(sub { "@{ shown($kd) }" eq 'attempted sent accepted released' }, 5),
       "master $m: D: the 503 released, in the file") or diag("@{ shown($kd) }");
    # the retry rule: the release may still be on its way (409 in-progress)
    ok($t->wait_for(sub { post($kd, { d => 1 })->{status} == 201 }, 5), "master $m: D: the retry executes");
    # (a retry told in-progress while the release was on its way is its own pair)
    ok($t->wait_for(sub { ("@{ shown($kd) }" =~ s/ attempted in_progress//gr) eq 'attempted sent accepted released attempted sent accepted completed' }, 5),
       "master $m: D: released, then a new operation completed") or diag("@{ shown($kd) }");
    is($t->effects(key => $kd), 2, "master $m: D: two effects");
}

# E: kill -9 mid-request: unknown, then an operator resolves it
my $ke = key_on('e', $masters[0]);
my $bg = $t->http_bg(POST => '/pay', key => $ke, json => { e => 1 }, headers => [ 'X-User' => 'alice', 'X-Delay' => 3 ], timeout => 15);
ok($t->wait_for(sub { $t->effects(key => $ke) == 1 }, 5), 'E: reached the upstream');
ok($t->kill_worker(($t->workers_connected_to)[0]), 'E: the worker holding the claim is killed (-9)');
$bg->result(15);
my $r;
ok($t->wait_for(sub { $r = post($ke, { e => 1 }); $t->ptype($r) eq 'outcome-unknown' }, 10), 'E: the retry after the lapse: outcome-unknown');
$r = $t->http(POST => '/admin?action=complete&status=201', key => $ke, headers => [ 'X-User' => 'operator-olga' ]);
is($r->{status}, 200, 'E: an operator resolves it') or diag($t->show($r));
$r = post($ke, { e => 1 });
is("$r->{status} $r->{headers}{'idempotent-replayed'}", '201 true', 'E: then retries replay 201');
# a worker's lines of a turn reach the file at the turn's end, just after
# its answers: two workers' lines of one key may change places by that much
# (docs/audit.md, "How lines are written"), so the events are counted, not
# placed, after the first two
my @e;
my %n;
$t->wait_for(sub { @e = @{ shown($ke) }; %n = (); $n{$_}++ for @e[2 .. $#e]; $n{replayed} && $n{resolved} }, 5);
is("@e[0, 1]", 'attempted sent', 'E: attempted sent');
is(join(' ', map { "$_=" . ($n{$_} // 0) } qw(resolved replayed)), 'resolved=1 replayed=1',
   'E: then one resolved and one replayed') or diag("@e");
ok(!grep({ !/^(attempted|in_progress|unknown|resolved|replayed)$/ } @e[2 .. $#e]), 'E: besides, only attempts answered in_progress (the lease) or unknown')
    or diag("@e");
is($n{attempted}, ($n{in_progress} // 0) + ($n{unknown} // 0) + ($n{replayed} // 0), 'E: each attempt with its answer')
    or diag("@e");
is(scalar(grep { $_ eq 'unknown' } @e), 1, 'E: one unknown');
is($t->effects(key => $ke), 1, 'E: one effect');

# F: idempotency_unique on the cluster (its key taken in a step of its own,
# docs/business-keys.md): the events of one server (t/62-audit-events.t),
# the claim's "sent" written once the step let the request run
sub ticket { my ($k, $ev, @h) = @_; $t->http(POST => '/tickets', key => $k, json => { source_event_id => $ev }, headers => [ 'X-User' => 'alice', @h ]) }
{
    my ($k1, $k2) = ($t->key('uniq-1'), $t->key('uniq-2'));
    my $ev = "ev-$$";
    is(ticket($k1, $ev)->{status}, 201, 'F: the first delivery executes');
    ok($t->wait_for(sub { "@{ shown($k1) }" eq 'attempted sent accepted completed' }, 5), 'F: attempted sent accepted completed')
        or diag("@{ shown($k1) }");
    $r = ticket($k2, $ev);
    is("$r->{status} " . ($r->{headers}{'idempotent-reused'} // ''), '201 true', 'F: another key, the same event: reused');
    $r = ticket($k2, $ev);
    is($r->{headers}{'idempotent-reused'}, 'true', 'F: and its retry');
    is("@{ shown($k2) }", 'attempted reused attempted reused', 'F: the second key: attempted reused, twice (no sent)');
    is($t->effects(key => $k1) + $t->effects(key => $k2), 1, 'F: one effect');

    # a delivery while the first is in flight: refused by the unique key
    my ($k3, $k4) = ($t->key('uniq-3'), $t->key('uniq-4'));
    my $ev2 = "ev2-$$";
    my $bg = $t->http_bg(POST => '/tickets', key => $k3, json => { source_event_id => $ev2 }, headers => [ 'X-User' => 'alice', 'X-Delay' => 1.5 ]);
    ok($t->wait_for(sub { $t->effects(key => $k3) == 1 }, 5), 'F: a first delivery reached the upstream');
    is("@{ shown($k3) }", 'attempted sent', 'F: its "sent" was written before the upstream saw it');
    $r = ticket($k4, $ev2);
    is("$r->{status} " . $t->ptype($r), '409 in-progress', 'F: another key meanwhile: in-progress');
    is(($bg->result(15) // {})->{status}, 201, 'F: the first completes');
    # "reused" with the holder's 409, as on one server (a reuse is told by
    # the state of the operation whose identity it takes)
    is("@{ shown($k4) }", 'attempted reused', 'F: the refused key: attempted reused, no sent');
    is($t->effects(key => $k4), 0, 'F: the refused one did not run');
}

# G: idempotency_lock on the cluster: the refused deploy has no operation
sub dep { my ($k, $env, @h) = @_; $t->http_bg(POST => '/deploy', key => $k, json => { v => $k }, headers => [ 'X-User' => 'alice', 'X-Env' => $env, @h ]) }
{
    my ($k1, $k2) = ($t->key('lock-1'), $t->key('lock-2'));
    my $env = "prod-$$";
    my $bg = dep($k1, $env, 'X-Delay' => 1.5);
    ok($t->wait_for(sub { $t->effects(key => $k1) == 1 }, 5), 'G: the first deploy runs');
    $r = dep($k2, $env)->result(15) // {};
    is("$r->{status} " . $t->ptype($r), '409 lock-held', 'G: another deploy: 409 lock-held');
    is(($bg->result(15) // {})->{status}, 201, 'G: the first completes');
    ok($t->wait_for(sub { "@{ shown($k1) }" eq 'attempted sent accepted completed' }, 5), 'G: the holder: attempted sent accepted completed')
        or diag("@{ shown($k1) }");
    is("@{ shown($k2) }", 'attempted in_progress', 'G: the refused deploy: attempted in_progress');
    my @ops = map { (/ op=(\S*)/)[0] // '' } grep { /\S/ } split /\n/, ($t->audit_tool('show', $k2, '--file', $FILE, '--redis', "127.0.0.1:$ports[0]"))[1];
    ok(!grep({ $_ ne '' } @ops), 'G: it names no operation (it has none)') or diag("@ops");
    $r = dep($k2, $env)->result(15) // {};
    is($r->{status}, 201, 'G: its retry, the lock free: executes');
    ok($t->wait_for(sub { "@{ shown($k2) }" eq 'attempted in_progress attempted sent accepted completed' }, 5), 'G: then attempted sent accepted completed')
        or diag("@{ shown($k2) }");
}

# H: fail closed: the file on a failing device; nothing runs without its
# "sent", the record, the unique and the lock keys all given back
{
    my $k0 = $t->key('full-before');
    is($t->http(POST => '/full', key => $k0, json => { source_event_id => "f0-$$" }, headers => [ 'X-Env' => "f0-$$" ])->{status}, 201,
       'H: a first write while the disk works');
    rename $FULL, "$FULL.1" or die;
    symlink '/dev/full', $FULL or die;
    kill 'USR1', $t->nginx_pid;
    # the workers reopen the file when their loop next turns: a request
    # before that still goes to the old file and runs, so each try is a new
    # action (key, event, environment), and the one refused is checked
    my ($k, @req);
    my $try = 0;
    ok($t->wait_for(sub {
        $try++;
        $k = $t->key("full-$try");
        @req = (json => { source_event_id => "f-$$-$try" }, headers => [ 'X-Env' => "f-$$-$try" ]);
        $r = $t->http(POST => '/full', key => $k, @req);
        $r->{status} != 201 }, 10), 'H: the file fails');
    is($r->{status} . ' ' . $t->ptype($r), '503 audit-unavailable', 'H: 503 audit-unavailable');
    is($t->effects(key => $k), 0, 'H: nothing ran');
    unlink $FULL;
    rename "$FULL.1", $FULL or die;
    kill 'USR1', $t->nginx_pid;
    my $k2 = $t->key('full-after');
    ok($t->wait_for(sub { $t->http(POST => '/full', key => $k2, @req)->{status} == 201 }, 10),
       'H: the disk back, another key with the same event and environment executes (neither key was kept)');
    is($t->effects(key => $k) + $t->effects(key => $k2), 1, 'H: one effect');
}

($rc, $out, my $err) = $t->audit_tool('verify', '--file', $FILE, '--redis', "127.0.0.1:$ports[0]");
is($rc, 0, 'verify --file: intact') or diag("$out$err");

$t->check_logs(ignore => [ qr/worker process \d+ exited on signal 9/, qr/\Q$FULL\E" failed|could not record the claim of key "k-full-/ ]);
done_testing;
