#!/usr/bin/perl
# Completions kept while Redis is down fill the worker's resend queue (1024
# commands or 64 MiB, docs/redis.md); past it a completion cannot be kept and
# its record turns unknown when its lease lapses (logged). With the audit
# stream a completion alone in its turn is sent from the end of the turn
# (ngx_http_idempotency_close_batch.c): the command the transport refused
# and freed must not be freed again there (it was: the worker aborted on a
# double free). 70 completions of 1 MB answers, each in a turn of its own,
# go to a stopped Redis: the worker survives, the queue's refusal is
# logged, every client gets the upstream's answer, and once Redis is back
# the kept completions are recorded.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $N = 70;
my $t = Idem::Test->new;
$t->start_stack(<<'EOF', workers => 1, redis => { appendonly => 1 });
server {
    listen 127.0.0.1:%%PORT%%;
    location / {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_lease 60s;
        idempotency_audit on;
        idempotency_audit_stream idem:full;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

my ($worker) = $t->worker_pids;
my @keys = map { "k-full-$$-$_" } 1 .. $N;
my $dir = $t->prefix;
my @pids;
for my $i (0 .. $N - 1) {
    # answers 0.1 s apart: each completion alone in its turn
    push @pids, $t->later(0, sub {
        my $r = $t->http(POST => '/f', key => $keys[$i], json => { i => $i }, timeout => 60,
                         headers => [ 'X-Delay' => 2 + 0.1 * $i, 'X-Body-Size' => 1000000 ]);
        open(my $fh, '>', "$dir/full-$i") or die;
        print $fh "$r->{status} " . length($r->{content});
        close $fh;
    });
}
ok($t->wait_for(sub { $t->effects >= $N }, 30), "$N requests at the upstream");
$t->stop_redis;
waitpid $_, 0 for @pids;

my @got = map {
    my $fh;
    open($fh, '<', "$dir/full-$_") ? scalar(<$fh>) : 'none'
} 0 .. $N - 1;
is(scalar(grep { $_ eq '201 1000000' } @got), $N, "the $N clients got the upstream's 1 MB answer")
    or diag("@got[0 .. 9]");
is($t->effects, $N, "$N effects: each executed once");
my $log = $t->error_log;
unlike($log, qr/exited on signal|double free|corruption/, 'the worker did not crash');
is(($t->worker_pids)[0], $worker, 'the same worker process');
like($log, qr/too many unrecorded results kept for redis/, 'the full resend queue is logged');

$t->restart_redis;
ok($t->wait_for(sub { my $r = $t->record($keys[0]); $r && $r->{state} eq 'completed' }, 20),
   'Redis back: a kept completion is recorded');
my $done = 0;
for my $try (1 .. 30) {
    $done = grep { my $r = $t->record($_); $r && $r->{state} eq 'completed' } @keys;
    diag("after $try s: $done") if $ENV{DEBUG95};
    last if $done >= 60;
    sleep 1;
}
ok($done >= 60 && $done < $N, "$done of $N records completed: the kept ones, not those past the queue's 64 MiB");
$t->check_logs;
done_testing;
