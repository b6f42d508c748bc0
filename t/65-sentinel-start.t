#!/usr/bin/perl
# idempotency_redis_sentinel at a worker's start (docs/redis.md, "What a
# request sees while a worker finds its master"): a request that arrives
# while the worker is still asking the sentinels waits for the answer
# (within connect_timeout + timeout) instead of being answered 503.
#   - nginx started, a request sent on the first connection its port
#     accepts: 201, one effect; five fresh starts, and one where the first
#     sentinel accepts and never answers (the worker asks the next one
#     after timeout=);
#   - nginx -s reload (twice) under 64 concurrent clients each sending first
#     writes, a key of its own per request: no 503, every key executed
#     once.  On loopback a worker finds its master within a millisecond or
#     two, so the sentinels of this location are a silent one first: every
#     new worker takes timeout= to find its master, as it would with a
#     sentinel host gone;
#   - a sentinel that accepts and never answers (and three of them): the
#     request is answered 503 store-unavailable once the worker gives up on
#     it (the sentinel's own timeout, or connect_timeout + timeout when
#     there are more sentinels than that leaves time for), never hangs.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use POSIX qw(WNOHANG);
use Time::HiRes qw(time sleep);
use Idem::Test;

my $ROUNDS  = $ENV{IDEM_SENTINEL_STARTS} // 5;
my $CLIENTS = 64;
my $PER     = 40;       # requests per client at most, during the reloads
my $RUN     = 8;        # seconds of traffic at most

my $t = Idem::Test->new;
my $dead = Idem::Test::free_port();

my $m = $t->start_redis_instance(name => 'st-0');
my $r = $t->start_redis_instance(name => 'st-1', args => [ '--replicaof', '127.0.0.1', $m ]);
ok($t->wait_for(sub { ($t->redis_at($r, 'INFO', 'replication') // '') =~ /master_link_status:up/ }, 15),
   'the replica is in sync');
my @S = map {
    $t->start_sentinel(name => "sentinel-$_", monitor => [ [ 'st', $m, 2 ] ])
} 1 .. 3;
ok($t->wait_for(sub { !grep { !$t->sentinel_ready($_, 'st', 1) } @S }, 30),
   'the three sentinels know each other and the replica');
my @quiet = map { $t->start_silent_server } 1 .. 3;

$t->start_upstream;
# the first seed is down: discovery at start goes on to the next one
my $seeds = join ' ', "127.0.0.1:$dead", map { "127.0.0.1:$_" } @S;
my $conf = <<"EOF";
server {
    listen 127.0.0.1:%%PORT%%;
    location /st/ {
        idempotency_redis_sentinel st $seeds connect_timeout=300ms timeout=500ms;
        idempotency on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /slow/ {
        idempotency_redis_sentinel st 127.0.0.1:$quiet[0] $seeds connect_timeout=300ms timeout=500ms;
        idempotency on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /silent/ {
        idempotency_redis_sentinel silent 127.0.0.1:$quiet[0] connect_timeout=300ms timeout=500ms;
        idempotency on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /silent3/ {
        idempotency_redis_sentinel silent3 @{[ join ' ', map { "127.0.0.1:$_" } @quiet ]}
                                   connect_timeout=300ms timeout=500ms;
        idempotency on;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF
$t->{nginx_port} = Idem::Test::free_port();

# The request is sent on the first connection nginx's port accepts: the
# master listens before it starts its workers, so the request is there when
# a worker takes its first event, before it has heard from any sentinel.
# Returns a handle for first_result(), and the error.log the moment the
# answer came (what the worker had logged by then).
sub first_request {
    my ($path, $k) = @_;
    my $file = $t->prefix . "/first-$k.json";
    my $req = $t->request_bytes(POST => $path, key => $k, json => { k => $k });
    my $pid = fork;
    die "fork: $!" unless defined $pid;
    if ($pid == 0) {
        my ($s, $end) = (undef, time + 20);
        until ($s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $t->nginx_port,
                                          Proto => 'tcp')) {
            POSIX::_exit(1) if time > $end;
            sleep 0.001;
        }
        my $t0 = time;
        syswrite($s, $req);
        my ($buf, $sel) = ('', IO::Select->new($s));
        while ($sel->can_read(20)) {
            last unless sysread($s, $buf, 65536, length $buf);
            last if $t->parse_responses($buf);
        }
        my $log = $t->error_log;
        my ($res) = $t->parse_responses($buf);
        $res //= { status => 599, headers => {}, content => '' };
        open my $fh, '>', "$file.tmp" or POSIX::_exit(1);
        print $fh JSON::PP->new->encode({ %$res, log => $log, took => time - $t0 });
        close $fh;
        rename "$file.tmp", $file;
        POSIX::_exit(0);
    }
    return { pid => $pid, file => $file };
}

sub first_result {
    my ($h) = @_;
    waitpid($h->{pid}, 0);
    open my $fh, '<', $h->{file} or return { status => 599, headers => {}, content => '', log => '' };
    local $/;
    return JSON::PP->new->decode(<$fh>);
}

subtest 'nginx started, then at once a first write' => sub {
    for my $i (1 .. $ROUNDS + 1) {
        my $path = $i > $ROUNDS ? '/slow/x' : '/st/x';
        my $k = $t->key("start$i");
        my $h = first_request($path, $k);
        $t->start_nginx($conf, workers => 2);
        my $res = first_result($h);
        is($t->answer($res), '201', "start $i: the first request to $path executes")
            or diag($res->{content});
        is($t->effects(key => $k), 1, "start $i: once");
        diag(sprintf 'start %d: answered %.3f s after it was sent', $i, $res->{took} // -1);
        $t->stop_nginx;
    }
};

subtest 'a sentinel that never answers: 503 once the worker gives up on it' => sub {
    my $k = $t->key('silent');
    my $h = first_request('/silent/x', $k);
    $t->start_nginx($conf, workers => 2);
    my $res = first_result($h);
    is($t->answer($res), '503 store-unavailable', 'answered 503 store-unavailable, with Retry-After');
    is($t->effects(key => $k), 0, 'not executed');
    like($res->{log}, qr/sentinel 127\.0\.0\.1:$quiet[0] timed out/,
         'the answer came after the sentinel timed out (timeout=), not before');
    diag(sprintf 'one silent sentinel: answered %.3f s after the request', $res->{took} // -1);

    # three silent sentinels take 3 x timeout to give up on: the request
    # is answered at connect_timeout + timeout
    $k = $t->key('silent3');
    $t->stop_nginx;
    $h = first_request('/silent3/x', $k);
    $t->start_nginx($conf, workers => 2);
    $res = first_result($h);
    is($t->answer($res), '503 store-unavailable', 'three silent sentinels: 503 store-unavailable');
    is($t->effects(key => $k), 0, 'not executed');
    like($res->{log}, qr/redis sentinel:silent3: no master named within connect_timeout \+ timeout/,
         'answered at connect_timeout + timeout, while the worker still asks');
    unlike($res->{log}, qr/no sentinel named the master "silent3"/,
           'before the third sentinel timed out');
    diag(sprintf 'three silent sentinels: answered %.3f s after the request', $res->{took} // -1);
    $t->stop_nginx;
};

subtest 'nginx -s reload under 64 clients of first writes' => sub {
    $t->start_nginx($conf, workers => 2);
    my @before = $t->worker_pids;
    my ($start, @hup) = (time + 0.5 + $CLIENTS * 0.02);
    my $res = $t->parallel($CLIENTS, sub {
        my $c = shift;
        my (@log, $n);
        my $end = time + $RUN;
        while ($n++ < $PER && time < $end) {
            my $k = "reload-$$-$c-$n";
            push @log, [ $k, $t->answer($t->http(POST => '/slow/x', key => $k, json => { c => $c, n => $n },
                                                 timeout => 10)) ];
        }
        return \@log;
    }, timeout => $RUN + 60, tick => sub {
        # two reloads, 1 s and 2.5 s into the traffic
        for my $at (1, 2.5) {
            next if grep { $_ == $at } @hup or time < $start + $at;
            push @hup, $at;
            kill 'HUP', $t->nginx_pid;
        }
    });
    is(scalar(@hup), 2, 'nginx was reloaded twice under the traffic');
    ok($t->wait_for(sub { my %b = map { $_ => 1 } @before; !grep { $b{$_} } $t->worker_pids }, 20),
       'the workers of before are gone');
    my (%seen, @bad, @keys);
    for my $x (@$res) {
        if (!$x) { push @bad, 'a client died'; next }
        for (@$x) {
            my ($k, $a) = @$_;
            push @keys, $k;
            $seen{$a}++;
            push @bad, "$k: $a" unless $a eq '201';
        }
    }
    my %effects;
    $effects{ $_->{key} // '' }++ for $t->effect_list(uri => '/slow/x');
    my @wrong = grep { ($effects{$_} // 0) != 1 } @keys;
    diag('answers: ' . join(', ', map { "$_ x$seen{$_}" } sort keys %seen));
    ok(@keys >= $CLIENTS * 5, scalar(@keys) . ' requests sent');
    is(scalar(@bad), 0, 'every request was answered 201: no 503')
        or diag(join "\n", @bad[0 .. ($#bad < 15 ? $#bad : 15)]);
    is(scalar(@wrong), 0, 'every request executed exactly once')
        or diag(join "\n", map { "$_: " . ($effects{$_} // 0) . ' effects' } @wrong[0 .. ($#wrong < 15 ? $#wrong : 15)]);
};

$t->check_logs;
done_testing;
