#!/usr/bin/perl
# The status and admin locations inside a server that has "idempotency on":
# they inherit it, but name a record rather than being operations
# themselves, so an admin POST carrying the client's key is never claimed,
# replayed or refused as a duplicate.

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
    idempotency on;
    idempotency_redis %%REDIS%%;
    idempotency_scope $http_authorization;
    proxy_ignore_client_abort on;

    location / {
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /status {
        idempotency_status;
    }
    location = /admin {
        idempotency_admin on;
    }
}
EOF

my $auth = 'Bearer inherit-1';
my $k = $t->key('inherit');
my @req = (key => $k, json => { n => 1 }, headers => [ Authorization => $auth ]);

my $r = $t->http(POST => '/pay', @req, headers => [ Authorization => $auth, 'X-Drop' => 1 ]);
is($r->{status}, 502, 'upstream dropped the connection after acting: 502');
is($t->effects(key => $k), 1, 'one effect');

my $u = $t->http(POST => '/pay', @req);
$t->is_problem($u, 409, 'outcome-unknown', key => $k, name => 'retry: outcome-unknown');

my $s = $t->http(GET => '/status', key => $k, headers => [ Authorization => $auth ]);
is($s->{status}, 200, 'status location answers');
like($s->{content}, qr/"state":"unknown"/, 'status: unknown');

my $a = $t->http(POST => '/admin?action=release', key => $k, headers => [ Authorization => $auth ]);
is($a->{status}, 200, 'admin POST with the client key is not claimed itself')
    or diag($t->show($a));
like($a->{content}, qr/"result":"released"/, 'admin: released');
ok(!defined $a->{headers}{'idempotent-replayed'}, 'admin answer is no replay');
is($t->effects(key => $k), 1, 'admin: no effect');

my $again = $t->http(POST => '/pay', @req);
is($again->{status}, 201, 'after release the retry executes');
is($t->effects(key => $k), 2, 'the retry is the second effect, made on purpose');
is($t->redis_keys('idem:*}:r') + 0, 1, 'one record, the retry\'s');
is(($t->record($k, $auth) // {})->{op}, ($t->record_at(($t->redis_keys('idem:*}:r'))[0]) // {})->{op},
   '... of this key');

$t->check_logs;
done_testing;
