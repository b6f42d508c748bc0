#!/usr/bin/perl
# The audit file device with idempotency_redis_sentinel (docs/audit.md,
# "With other features"): a master, a replica and a sentinel; a first
# write, its replay and a conflict, an upstream 503 then a retry, each
# operation's events in the file as the story says; then a failover
# (SENTINEL FAILOVER): first writes through the new master go on, their
# lines chain on the file's head (the file does not live in Redis), and
# `verify --file` passes across the failover.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $t = Idem::Test->new;
my $p = $t->prefix;
my $FILE = "$p/sentinel.log";

sub linked { ($t->redis_at($_[0], 'INFO', 'replication') // '') =~ /master_link_status:up/ }

my $m = $t->start_redis_instance(name => 'm0');
my $r1 = $t->start_redis_instance(name => 'm1', args => [ '--replicaof', '127.0.0.1', $m ]);
ok($t->wait_for(sub { linked($r1) }, 15), 'the replica is in sync');
my $s = $t->start_sentinel(name => 'sentinel-1', monitor => [ [ 'pay', $m, 1 ] ]);
ok($t->wait_for(sub { my $r = $t->redis_at($s, 'SENTINEL', 'replicas', 'pay'); ref $r eq 'ARRAY' && @$r }, 15),
   'the sentinel knows the replica');
$t->{redis_port} = $m;
$t->start_upstream;
$t->start_nginx(<<"EOF", workers => 2);
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis_sentinel pay 127.0.0.1:$s connect_timeout=300ms timeout=1s;
    location / {
        idempotency on;
        idempotency_audit file=$FILE;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

sub shown {
    my ($what) = @_;
    my ($rc, $out) = $t->audit_tool('show', $what, '--file', $FILE);
    return join ' ', map { (split ' ')[2] } grep { /\S/ } split /\n/, $out;
}

my $ka = $t->key('a');
my $r = $t->http(POST => '/pay', key => $ka, json => { a => 1 });
is($r->{status}, 201, 'A: a first write through the sentinel\'s master');
ok($t->wait_for(sub { shown($ka) eq 'attempted sent accepted completed' }, 5), 'A: completed in the file');
$r = $t->http(POST => '/pay', key => $ka, json => { a => 1 });
is($r->{headers}{'idempotent-replayed'}, 'true', 'A: replayed');
$r = $t->http(POST => '/pay', key => $ka, json => { a => 2 });
is($r->{status}, 409, 'A: another body: 409');
is(shown($ka), 'attempted sent accepted completed attempted replayed attempted conflict', 'A: the story in the file');
{
    my ($rc, $out) = $t->audit_tool('show', $ka, '--file', $FILE);
    my $placed = join ' ', map { (split ' ')[0] } grep { /\S/ } split /\n/, $out;
    like($placed, qr/^(\d+)\.1 \1\.2 (\d+)\.1 \2\.2 (\d+)\.1 \3\.2 (\d+)\.1 \4\.2$/,
         'A: one line per step, two events each (the first write: its claim\'s line, its completion\'s)') or diag($placed);
}
my $kd = $t->key('d');
$r = $t->http(POST => '/pay', key => $kd, json => { d => 1 }, headers => [ 'X-Status' => 503 ]);
# the 503 reaches the client before its own worker writes `accepted released`; a retry
# that another worker executes at once would interleave its lines with those
ok($t->wait_for(sub { shown($kd) eq 'attempted sent accepted released' }, 5), 'D: the 503 released, in the file')
    or diag(shown($kd));
# the retry rule: the release may still be on its way (409 in-progress)
ok($t->wait_for(sub { $t->http(POST => '/pay', key => $kd, json => { d => 1 })->{status} == 201 }, 5),
   'D: the retry after a 503 executes');
# (a retry told in-progress while the release was on its way is its own pair)
ok($t->wait_for(sub { (shown($kd) =~ s/ attempted in_progress//gr) eq 'attempted sent accepted released attempted sent accepted completed' }, 5),
   'D: released, then completed') or diag(shown($kd));

is($t->redis_at($s, 'SENTINEL', 'FAILOVER', 'pay'), 'OK', 'SENTINEL FAILOVER');
ok($t->wait_for(sub { my $a = $t->redis_at($s, 'SENTINEL', 'get-master-addr-by-name', 'pay');
                      ref $a eq 'ARRAY' && $a->[1] == $r1 }, 20), 'the replica is the master now');
my @after;
ok($t->wait_for(sub {
    my $k = $t->key('after');
    my $x = $t->http(POST => '/pay', key => $k, json => { n => 1 });
    push @after, $k if $x->{status} == 201;
    $x->{status} == 201 }, 20), 'a first write through the new master');
for my $i (1 .. 3) {
    # each worker learns the new master on its own: the retry rule, same key
    my $k = $t->key("after-$i");
    ok($t->wait_for(sub { $t->http(POST => '/pay', key => $k, json => { n => $i })->{status} == 201 }, 20),
       "first write $i after the failover (retried with its key until 201)");
    push @after, $k;
}
# a try whose answer was lost in the failover makes the next one a replay (or, while
# it runs, in_progress): the operation completed once, whatever the tries around it
ok($t->wait_for(sub {
    my $ev = shown($after[-1]);
    $ev =~ /^attempted sent accepted completed( attempted (in_progress|replayed))*$/
}, 15), 'the last one completed in the file') or diag(shown($after[-1]));
is($t->effects(key => $_), 1, "$_: once") for ($ka, @after);
my ($rc, $out, $err) = $t->audit_tool('verify', '--file', $FILE);
is($rc, 0, 'verify --file: intact across the failover') or diag("$out$err");

$t->check_logs;
done_testing;
