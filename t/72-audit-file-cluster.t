#!/usr/bin/perl
# The audit file device with idempotency_redis_cluster (docs/audit.md,
# "With other features"): nginx -t accepts it (the stream stays refused),
# and the scripted story of t/58-audit.t on a cluster of 3 masters, with a
# key on each master: the file holds each operation's events as the
# stream would (read back with `idempotency-audit show --file`), each key
# executed as the story says, and `verify --file` passes.

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
$t->start_nginx(<<"EOF", workers => 2);
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
my @e = @{ shown($ke) };
is("@e[0, 1]", 'attempted sent', 'E: attempted sent');
is("@e[-3 .. -1]", 'resolved attempted replayed', 'E: ... resolved attempted replayed');
ok(!grep({ $_ !~ /^(attempted|in_progress|unknown)$/ } @e[2 .. $#e - 3]), 'E: between them, only attempts answered in_progress (the lease) or unknown')
    or diag("@e");
is(scalar(grep { $_ eq 'unknown' } @e), 1, 'E: one unknown');
is($t->effects(key => $ke), 1, 'E: one effect');

($rc, $out, my $err) = $t->audit_tool('verify', '--file', $FILE, '--redis', "127.0.0.1:$ports[0]");
is($rc, 0, 'verify --file: intact') or diag("$out$err");

$t->check_logs(ignore => qr/worker process \d+ exited on signal 9/);
done_testing;
