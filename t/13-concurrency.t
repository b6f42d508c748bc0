#!/usr/bin/perl
# 50 identical requests at the same instant against a slow upstream: exactly
# one executes; every other one is told "in flight" (409 + Retry-After) or,
# if it arrived after completion, gets the replay.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Idem::Test;

my $t = Idem::Test->new;
$t->start_stack(<<'EOF', workers => 2);
server {
    listen 127.0.0.1:%%PORT%%;
    location / {
        idempotency on;
        idempotency_redis %%REDIS%%;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

my $N = 50;
my $k = $t->key('conc');
my $res = $t->parallel($N, sub {
    my $r = $t->http(POST => '/transfers', key => $k, json => { from => 'a', to => 'b', amount => 7 },
        headers => [ 'X-Delay' => 1.5 ], timeout => 20);
    my $p = $t->problem($r);
    return {
        status   => $r->{status},
        replayed => $r->{headers}{'idempotent-replayed'},
        retry    => $r->{headers}{'retry-after'},
        type     => $p ? $p->{type} : undef,
        state    => $p ? $p->{state} : undef,
        pkey     => $p ? $p->{idempotency_key} : undef,
        content  => $r->{content},
    };
});

is(scalar(grep { defined } @$res), $N, "all $N clients answered");
is($t->effects, 1, "$N concurrent identical requests: exactly one effect");
is($t->effects(key => $k), 1, 'the one effect carries the key');

my @exec = grep { $_ && $_->{status} == 201 && !$_->{replayed} } @$res;
my @replay = grep { $_ && $_->{status} == 201 && ($_->{replayed} // '') eq 'true' } @$res;
my @busy = grep {
    $_ && $_->{status} == 409
        && ($_->{type} // '') eq 'urn:ngx-idempotency:problem:in-progress'
        && ($_->{retry} // '') =~ /^\d+$/
        && ($_->{state} // '') eq 'in_progress'
        && ($_->{pkey} // '') eq $k
} @$res;
is(scalar(@exec), 1, 'exactly one answer is the executed one');
is(scalar(@exec) + scalar(@replay) + scalar(@busy), $N,
    'every other answer is 409 in-progress with Retry-After or a replay')
    or diag(explain [ map { { %{ $_ // {} }, content => undef } }
        grep { !$_ || !($_->{status} == 201 || $_->{status} == 409) || ($_->{status} == 409 && ($_->{type} // '') !~ /in-progress/) } @$res ]);
note(sprintf("answers: %d executed, %d in-progress, %d replayed", scalar(@exec), scalar(@busy), scalar(@replay)));
ok(@busy >= 1, 'at least one client was told the operation is in flight');
if (@exec) {
    is(scalar(grep { $_->{content} eq $exec[0]{content} } @replay), scalar(@replay),
        'every replay carries the executed body');
}

# once complete, a retry replays
my $r = $t->http(POST => '/transfers', key => $k, json => { from => 'a', to => 'b', amount => 7 });
is($r->{status}, 201, 'retry after completion: 201');
is($r->{headers}{'idempotent-replayed'}, 'true', 'retry after completion replays');
is($r->{content}, $exec[0] ? $exec[0]{content} : '', 'replay is the executed body');
is($t->effects, 1, 'still exactly one effect');

# concurrent requests with different keys all execute (no false sharing)
my $res2 = $t->parallel(10, sub {
    my $i = shift;
    my $r = $t->http(POST => '/transfers', key => "$k-distinct-$i", json => { i => $i },
        headers => [ 'X-Delay' => 0.3 ], timeout => 20);
    return { status => $r->{status}, replayed => $r->{headers}{'idempotent-replayed'} };
});
is(scalar(grep { $_ && $_->{status} == 201 && !$_->{replayed} } @$res2), 10,
    '10 concurrent distinct keys: all execute');
is($t->effects, 11, '10 concurrent distinct keys: 10 more effects');

$t->check_logs;
done_testing;
