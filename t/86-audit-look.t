#!/usr/bin/perl
# idempotency_audit: a first look (GET) finds a key free, and another
# attempt claims it before this one's claim runs. The claim of a free key
# goes to claimnew.lua (claim.lua's free-key case alone); finding the key
# taken, it writes nothing and says so ("audit-look"), and the module sends
# the same command to claim.lua, which decides: one attempt executes, the
# other is told in-progress, each with its events in the stream.
#
# The race is made with two nginx instances on one Redis (each its own
# connection) and Redis's CLIENT PAUSE WRITE: both first looks (reads) are
# answered, both claims (scripts) wait until the pause ends.
#
# Also: a stream an older module wrote (version 1) goes on in version 2,
# and verify, show read it as one chain (docs/audit.md, "Upgrading").

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(time);
use Idem::Test;

my $conf = <<'EOF2';
server {
    listen 127.0.0.1:%%PORT%%;
    location / {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_audit on;
        idempotency_audit_stream idem:look;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF2

my $t = Idem::Test->new;
$t->start_stack($conf, workers => 1);
my $t2 = Idem::Test->new;
$t2->{redis_port} = $t->{redis_port};
$t2->{upstream_port} = $t->{upstream_port};
$t2->start_nginx($conf, workers => 1);

# each instance's link is up and has learned the stream's head
for my $x ($t, $t2) {
    my $k = $t->key('warm');
    is($x->http(POST => '/pay', key => $k, json => {})->{status}, 201, 'a first write through each instance');
}


sub shown {
    my ($what) = @_;
    my ($rc, $out) = $t->audit_tool('--stream', 'idem:look', 'show', $what);
    return join ' ', map { (split ' ')[2] } grep { /\S/ } split /\n/, $out;
}

my $k = $t->key('race');
my $before = $t->command_calls('get');
is($t->redis('CLIENT', 'PAUSE', 10000, 'WRITE'), 'OK', 'Redis holds writes and scripts (reads go on)');
my @bg = map { $_->http_bg(POST => '/pay', key => $k, json => { same => 1 }, headers => [ 'X-Delay' => 1 ],
                           timeout => 20) } $t, $t2;
ok($t->wait_for(sub { $t->command_calls('get') >= $before + 2 }, 10), 'both first looks answered: the key is free for both');
is($t->redis('CLIENT', 'UNPAUSE'), 'OK', 'the claims run, one after the other');
my @st = sort map { ($_->result(20) // {})->{status} // 0 } @bg;
is("@st", '201 409', 'one attempt executes, the other is told in-progress');
is($t->effects(key => $k), 1, 'one effect');
ok($t->wait_state($k, undef, 'completed'), 'recorded');
is(shown($k), 'attempted sent attempted in_progress accepted completed',
   'the stream: the claim, the other attempt told in-progress, the completion');

my ($rc, $out, $err) = $t->audit_tool('--stream', 'idem:look', 'verify');
is($rc, 0, 'verify: intact') or diag("$out$err");

# ---- a stream an older module wrote (version 1: one entry per event, hex
# hashes) goes on in version 2, and verifies as one chain
{
    my $S = 'idem:look';
    # an older module never wrote the head key (audit.lua): gone with the stream
    $t->redis('DEL', $S, "$S:head");
    my $prev = '0' x 64;
    for my $seq (1 .. 2) {
        my $e = $t->audit_encode({ version => 1, seq => $seq, prev => $prev,
                                   events => [ { time => int(time * 1000), event => $seq == 1 ? 'attempted' : 'sent',
                                                 op => 'a' x 32, key => 'old-key', fp => 'b' x 64, route => '/pay' } ] });
        my $h = $t->audit_hash($e);
        $t->redis('XADD', $S, "$seq-0", 'h', $h, 'e', $e);
        $prev = $h;
    }
    my $k2 = $t->key('after-v1');
    is($t->http(POST => '/pay', key => $k2, json => {})->{status}, 201, 'a first write on a stream of version 1');
    ok($t->wait_state($k2, undef, 'completed'), 'recorded');
    my $st = $t->audit_stream($S);
    is_deeply([ map { $_->{decoded}{version} } @$st ], [ 1, 1, 2, 2 ], 'two entries of version 1, then two of 2');
    is($st->[2]{decoded}{prev}, $prev, 'the first of version 2 is chained on the last of version 1 (its hex hash)');
    ($rc, $out, $err) = $t->audit_tool('--stream', $S, 'verify');
    is($rc, 0, 'verify: one chain across the versions') or diag("$out$err");
    like($err, qr/^4 entries \(6 events\)/m, 'verify counts the entries and their events');
    ($rc, $out) = $t->audit_tool('--stream', $S, 'show', 'old-key');
    like($out, qr/^1 \S+ attempted .*\n2 \S+ sent /, 'show: the version-1 events by their seq');
    ($rc, $out) = $t->audit_tool('--stream', $S, 'show', $k2);
    like($out, qr/^3\.1 \S+ attempted .*\n3\.2 \S+ sent .*\n4\.1 \S+ accepted .*\n4\.2 \S+ completed /,
         'show: the version-2 events by their entry and place');
}

# ---- Redis lost its scripts: claimnew.lua's NOSCRIPT resends claim.lua's
# text, with the arguments claimnew.lua is not sent (claim.lua reads them)
{
    my $k3 = $t->key('noscript');
    my $evals = $t->command_calls('eval');
    is($t->redis('SCRIPT', 'FLUSH'), 'OK', 'the script cache emptied');
    is($t->http(POST => '/pay', key => $k3, json => {})->{status}, 201, 'a first write after SCRIPT FLUSH');
    ok($t->command_calls('eval') > $evals, '... sent as EVAL');
    is($t->effects(key => $k3), 1, 'one effect');
    ok($t->wait_state($k3, undef, 'completed'), 'recorded');
    is(shown($k3), 'attempted sent accepted completed', 'its events, once each');
    my ($rc, $out, $err) = $t->audit_tool('--stream', 'idem:look', 'verify');
    is($rc, 0, 'verify: intact') or diag("$out$err");
}

$t2->check_logs;
$t->check_logs;
done_testing;
