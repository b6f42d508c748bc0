#!/usr/bin/perl
# The same key on another route is a conflict; the same key in another scope
# is another operation that executes on its own and never sees the first
# one's response. The scope is never stored in clear.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Idem::Test;

my $t = Idem::Test->new;
$t->start_stack(<<'EOF');
server {
    listen 127.0.0.1:%%PORT%%;
    location / {
        idempotency on;
        idempotency_redis %%REDIS%%;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /tenant/ {
        idempotency on;
        idempotency_redis %%REDIS%%;
        idempotency_scope $http_authorization;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

# ---- same key, another path -> conflict
{
    my $k = $t->key('scope');
    my $a = $t->http(POST => '/orders', key => $k, json => { v => 1 });
    is($a->{status}, 201, '/orders executes');
    my $b = $t->http(POST => '/invoices', key => $k, json => { v => 1 });
    $t->is_problem($b, 409, 'fingerprint-mismatch', key => $k, state => 'completed',
        name => 'same key on another path -> 409 fingerprint-mismatch');
    unlike($b->{content}, qr/body_sha256|"id"/, 'conflict does not leak the /orders response');
    is($t->effects(key => $k), 1, 'other path: one effect');
    is($t->effects(uri => '/invoices'), 0, '/invoices never reached the upstream');
}

# ---- same key, another scope -> its own operation
my $secret_a = 'Bearer tok-alice-' . $$ . '-s3cr3t';
my $secret_b = 'Bearer tok-bob-' . $$ . '-s3cr3t';
{
    my $k = $t->key('scope');
    my @body = (json => { amount => 5 });
    my $a = $t->http(POST => '/tenant/pay', key => $k, @body, headers => [ Authorization => $secret_a ]);
    is($a->{status}, 201, 'scope A executes');
    is($t->effects(key => $k), 1, 'scope A: one effect');

    my $b = $t->http(POST => '/tenant/pay', key => $k, @body, headers => [ Authorization => $secret_b ]);
    is($b->{status}, 201, 'scope B, same key and body: executes its own');
    ok(!exists $b->{headers}{'idempotent-replayed'}, 'scope B is not a replay');
    isnt($b->{content}, $a->{content}, 'scope B does not get scope A\'s body');
    isnt($b->{headers}{location}, $a->{headers}{location}, 'scope B does not get scope A\'s Location');
    is($t->effects(key => $k), 2, 'two scopes: two effects');

    my $a2 = $t->http(POST => '/tenant/pay', key => $k, @body, headers => [ Authorization => $secret_a ]);
    is($a2->{headers}{'idempotent-replayed'}, 'true', 'scope A retry replays');
    is($a2->{content}, $a->{content}, 'scope A retry gets A\'s body');
    my $b2 = $t->http(POST => '/tenant/pay', key => $k, @body, headers => [ Authorization => $secret_b ]);
    is($b2->{headers}{'idempotent-replayed'}, 'true', 'scope B retry replays');
    is($b2->{content}, $b->{content}, 'scope B retry gets B\'s body');

    # no Authorization at all is a third scope ("")
    my $n = $t->http(POST => '/tenant/pay', key => $k, @body);
    is($n->{status}, 201, 'empty scope executes its own');
    ok(!exists $n->{headers}{'idempotent-replayed'}, 'empty scope is not a replay');
    isnt($n->{content}, $a->{content}, 'empty scope does not see A');
    isnt($n->{content}, $b->{content}, 'empty scope does not see B');
    is($t->effects(key => $k), 3, 'three scopes: three effects');

    # a conflict in scope B says nothing about scope A
    my $bc = $t->http(POST => '/tenant/pay', key => $k, json => { amount => 6 },
        headers => [ Authorization => $secret_b ]);
    $t->is_problem($bc, 409, 'fingerprint-mismatch', key => $k, name => 'scope B changed body -> conflict');
    is($t->effects(key => $k), 3, 'conflict in scope B: no effect');

    my %state = map { ($_ eq '' ? 'none' : $_) => ($t->record($k, $_) // {})->{state} // 'missing' }
        ($secret_a, $secret_b, '');
    is_deeply([ @state{$secret_a, $secret_b, 'none'} ], [ ('completed') x 3 ],
        'one completed record per scope, each under its own name')
        or diag(explain \%state);
}

# ---- scope values are never stored in clear
{
    my @all = $t->redis_keys('*');
    my $dump = join "\n", @all;
    for my $k (@all) {
        my $type = $t->redis('TYPE', $k);
        if ($type eq 'hash') {
            my $h = $t->redis('HGETALL', $k);
            $dump .= "\n" . join("\n", @$h) if ref $h;
        } elsif ($type eq 'string') {
            $dump .= "\n" . ($t->redis('GET', $k) // '');
        } elsif ($type eq 'stream') {
            my $x = $t->redis('XRANGE', $k, '-', '+');
            $dump .= "\n" . _flat($x);
        }
    }
    unlike($dump, qr/tok-alice|tok-bob/, 'no Authorization value in Redis keys or values');
}

sub _flat { my $x = shift; ref $x eq 'ARRAY' ? join("\n", map { _flat($_) } @$x) : ($x // '') }

$t->check_logs;
done_testing;
