#!/usr/bin/perl
# idempotency_audit file= alone (docs/audit.md, "The file device"): a
# claim's lines wait for the end of the event loop's turn and its request is
# resumed from the posted event once the turn's write() put them in the
# file. Lines written "now" in the same turn (the answers that change no
# record: two replays here) write the waiting lines with theirs; the
# waiting request must still be resumed after the second of them (it was
# left waiting for ever: the second write took the posted event back).
#
# The replies must reach nginx in one read: Redis is paused (CLIENT PAUSE)
# while the claim and the two replays are sent on the worker's one
# connection, so it answers the three at once, in the order they came.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(sleep);
use Idem::Test;

my $t = Idem::Test->new;
my $P = $t->prefix;

$t->start_stack(<<"EOF", workers => 1);
server {
    listen 127.0.0.1:%%PORT%%;
    location / {
        idempotency on;
        idempotency_redis %%REDIS%% timeout=5s;
        idempotency_audit file=$P/turn.log;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

my $done = $t->key('done');
my $r = $t->http(POST => '/x', key => $done, json => { d => 1 });
is($r->{status}, 201, 'a first write executes');
$r = $t->http(POST => '/x', key => $done, json => { d => 1 });
is($r->{headers}{'idempotent-replayed'}, 'true', 'its retry replays');

for my $round (1 .. 3) {
    my $k = $t->key("turn$round");
    is($t->redis_pause(1500), 'OK', "round $round: Redis paused");
    my $a = $t->http_bg(POST => '/x', key => $k, json => { n => $round }, timeout => 20);
    sleep 0.2;
    my @b = map { my $b = $t->http_bg(POST => '/x', key => $done, json => { d => 1 }, timeout => 20); sleep 0.2; $b } 1 .. 2;
    my $ra = $a->result(30) // {};
    is($ra->{status}, 201, "round $round: the claim whose lines waited for the turn's write() goes on")
        or diag($t->show($ra));
    for my $i (0 .. 1) {
        my $rb = $b[$i]->result(30) // {};
        is($rb->{headers}{'idempotent-replayed'}, 'true', "round $round: replay " . ($i + 1) . ' in the same turn');
    }
    is($t->effects(key => $k), 1, "round $round: the claim executed once");
    # the completion's lines go at the end of the turn that answered it
    ok($t->wait_for(sub { ($t->audit_tool('show', $k, '--file', "$P/turn.log"))[1] =~ /completed/ }, 5),
       "round $round: its completion is written");
    my ($rc, $out) = $t->audit_tool('show', $k, '--file', "$P/turn.log");
    like($out, qr/attempted.*sent.*accepted.*completed/s, "round $round: its lines are in the file") or diag($out);
}

my ($rc, $out) = $t->audit_tool('verify', '--file', "$P/turn.log");
is($rc, 0, 'the file verifies') or diag($out);

# one line per step (format version 2), also for the steps of one turn
# that shared a write(): each claim, completion and replay is its own line
my %steps;
$steps{ join ' ', map { $_->{event} // '?' } @{ $_->{events} // [] } }++ for @{ $t->audit_file_lines("$P/turn.log") };
is(join(', ', map { "$_ x$steps{$_}" } sort keys %steps),
   'accepted completed x4, attempted replayed x7, attempted sent x4',
   'one line per step: 4 claims, 4 completions, 7 replays');

done_testing;
