#!/usr/bin/perl
# The owner token fences every script that closes or extends a claim. A
# stale owner (a worker frozen with SIGSTOP past its lease, whose record an
# operator then released and a retry claimed again) wakes up, gets its
# upstream answer and sends complete and renew with its old token: both are
# refused, and the record keeps the new attempt's response. The scripts
# themselves, called with a wrong token on a live claim, change nothing.
# Two nginx instances share one Redis and one upstream, so the frozen one
# can be told apart from the one that goes on serving.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(sleep);
use Idem::Test;

my $conf = <<'EOF';
server {
    listen 127.0.0.1:%%PORT%%;
    location / {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_lease 2s;
        proxy_ignore_client_abort on;
        proxy_read_timeout 30s;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /admin {
        idempotency_redis %%REDIS%%;
        idempotency_admin on;
    }
}
EOF

my $t = Idem::Test->new;      # its worker goes stale
$t->start_redis;
$t->start_upstream;
$t->start_nginx($conf, workers => 1);
my $t2 = Idem::Test->new;     # serves the retries meanwhile
$t2->{redis_port} = $t->{redis_port};
$t2->{upstream_port} = $t->{upstream_port};
$t2->start_nginx($conf, workers => 1);

sub produced_all { $t->upstream_responses(key => $_[0]) }

my $k = $t->key('fence');
my @req = (key => $k, json => { pay => 'fenced' });
my $rname = $t->record_name($k);

# ---- the first attempt holds the claim; wrong tokens change nothing
my $bg = $t->http_bg(POST => '/pay', @req, headers => [ 'X-Delay' => 1 ], timeout => 30);
ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'first attempt reached the upstream');
my $rec = $t->record($k) // {};
is($rec->{state}, 'in_progress', 'claimed: in_progress');
like($rec->{owner} // '', qr/^[0-9a-f]{32}$/, 'the claim names its owner token');
my $wrong = 'f' x 32;
my $forged = $t->encode_record({ %$rec, state => 'completed', owner => undef, completed => $rec->{created},
    status => 200, stored => 1, resolved => 0, hdr => '', body => 'forged' });
my $forged_u = $t->encode_record({ %$rec, state => 'unknown', owner => undef, unknown_at => $rec->{created} });
my $marker = $t->encode_record({ %$rec, state => 'released', status => '', retry_after => '' });
for my $c (
    [ complete => [ 1, $rname, $wrong, $forged, 60000 ] ],
    [ release  => [ 1, $rname, $wrong, '', 1000, '0' ] ],
    [ release  => [ 1, $rname, $wrong, $marker, 1000, '1' ] ],
    [ fail     => [ 1, $rname, $wrong, $forged_u ] ],
    [ renew    => [ 1, $rname, $wrong, 1 ] ],     # would expire it at once
) {
    my ($name, $args) = @$c;
    is($t->redis('EVAL', $t->script_text($name), @$args), 0, "$name.lua with a wrong owner token -> 0");
}
my $after = $t->record($k) // {};
is_deeply([ @$after{qw(state owner lease_ms ttl_ms)} ], [ @$rec{qw(state owner lease_ms ttl_ms)} ],
    'the record is as it was: same state, owner and lease');
ok(!defined $after->{body}, 'no forged body stored');

# ---- the owner freezes past its lease; an operator releases; a retry runs
my @w = $t->worker_pids;
is(scalar @w, 1, 'one worker holds the claim');
kill 'STOP', @w;
sleep 2.6;                     # the lease (2 s) lapses: no renewal while frozen
my $u = $t2->http(POST => '/pay', @req);
$t->is_problem($u, 409, 'outcome-unknown', key => $k, state => 'unknown',
    name => 'lease lapsed under a frozen owner -> 409 outcome-unknown');
my $rel = $t2->http(POST => '/admin?action=release', key => $k);
is($rel->{status}, 200, 'operator releases the unknown record') or diag($t->show($rel));
my $second = $t2->http(POST => '/pay', @req, headers => [ 'X-Delay' => 0.2 ]);
is($second->{status}, 201, 'the retry after the release executes');
ok(!exists $second->{headers}{'idempotent-replayed'}, 'the retry is an execution');
is($t->effects(key => $k), 2, 'two effects: the frozen one and the released retry');
my $rec2 = $t->record($k) // {};
is($rec2->{state}, 'completed', 'the retry completed the record');

# ---- the stale owner wakes up: its complete and renew are refused
kill 'CONT', @w;
my $first = $bg->result(20);
is($first && $first->{status}, 201, 'the stale owner answers its own client');
ok($t->wait_for(sub { $t->error_log =~ /idempotency: complete script: the claim was no longer held by this request/ }, 5),
    'its complete script was refused (logged at warn)');
my $rec3 = $t->record($k) // {};
is_deeply([ @$rec3{qw(state status body completed)} ], [ @$rec2{qw(state status body completed)} ],
    'the record still holds the retry\'s response');
my @prod = produced_all($k);
is(scalar @prod, 2, 'the upstream produced two responses');
my $replay = $t2->http(POST => '/pay', @req);
is($replay->{headers}{'idempotent-replayed'}, 'true', 'next retry: replay');
is($t->sha256($replay->{content}), $prod[-1]{sha}, 'the replay is the second execution\'s body');
isnt($t->sha256($replay->{content}), $prod[0]{sha}, 'not the stale owner\'s');
my $replay1 = $t->http(POST => '/pay', @req);
is($replay1->{content}, $replay->{content}, 'the woken instance replays the same');
is($t->effects(key => $k), 2, 'still two effects');

$t2->check_logs;
$t->check_logs;
done_testing;
