#!/usr/bin/perl
# GET and methods not listed in idempotency_methods pass through untouched:
# every request executes, nothing is added, nothing is written to Redis.

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
    idempotency_redis %%REDIS%%;
    location / {
        idempotency on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /put-delete/ {
        idempotency on;
        idempotency_methods PUT DELETE;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /off/ {
        idempotency off;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

sub untouched {
    my ($method, $path, $what, %o) = @_;
    my $k = $t->key('m');
    my $records = scalar $t->redis_keys;
    my $before = $t->effects(uri => $path);
    for my $n (1 .. 3) {
        my $r = $t->http($method => $path, key => $k, %o);
        is($r->{status}, 201, "$what, attempt $n: executed") or diag($t->show($r));
        ok(!exists $r->{headers}{'idempotent-replayed'}, "$what, attempt $n: no replay header");
        ok(!defined $t->problem($r), "$what, attempt $n: no module answer");
    }
    is($t->effects(uri => $path) - $before, 3, "$what: three attempts, three effects");
    is($t->effects(key => $k), 3, "$what: the key header reached the upstream each time");
    is(scalar($t->redis_keys), $records, "$what: no Redis record created");
}

untouched(GET => '/items', 'GET with a key');
untouched(GET => '/items?x=1', 'GET with a query and a key');
untouched(DELETE => '/items/1', 'DELETE (not in the default POST PUT PATCH)');
untouched(OPTIONS => '/items', 'OPTIONS');
untouched(POST => '/put-delete/items', 'POST where methods are PUT DELETE', json => { a => 1 });
untouched(PATCH => '/put-delete/items', 'PATCH where methods are PUT DELETE', json => { a => 1 });
untouched(POST => '/off/items', 'POST with idempotency off', json => { a => 1 });

# the configured methods are handled
for my $c ([ PATCH => '/items/2', 'PATCH (default)' ],
           [ PUT => '/items/4', 'PUT (default)' ],
           [ POST => '/items', 'POST (default)' ],
           [ PUT => '/put-delete/items/3', 'PUT (configured)' ],
           [ DELETE => '/put-delete/items/3', 'DELETE (configured)' ]) {
    my ($method, $path, $what) = @$c;
    my $k = $t->key('m');
    my $a = $t->http($method => $path, key => $k, json => { a => 1 });
    is($a->{status}, 201, "$what: executes");
    my $b = $t->http($method => $path, key => $k, json => { a => 1 });
    is($b->{headers}{'idempotent-replayed'}, 'true', "$what: retry replays");
    my $c = $t->http($method => $path, key => $k, json => { a => 2 });
    is($c->{status}, 409, "$what: the key reused with a changed body is refused");
    like($c->{headers}{'content-type'} // '', qr{^application/problem\+json}, "$what: as problem+json");
    is($t->effects(key => $k), 1, "$what: one effect");
}

# HEAD is never handled
{
    my $k = $t->key('m');
    my $before = $t->effects(method => 'HEAD');
    for (1 .. 2) {
        my $r = $t->http(HEAD => '/items', key => $k);
        is($r->{status}, 201, 'HEAD passes through');
        ok(!exists $r->{headers}{'idempotent-replayed'}, 'HEAD: no replay header');
    }
    is($t->effects(method => 'HEAD') - $before, 2, 'HEAD: every request executes');
}

$t->check_logs;
done_testing;
