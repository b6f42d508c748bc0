#!/usr/bin/perl
# The module's own endpoints (status, admin, approve, the approval page,
# metrics) answer a
# method they do not take with a 405 problem+json (method-not-allowed) and
# the Allow header, never nginx's HTML page, and nginx's own 413 (a body
# over client_max_body_size) and 500 as problems too; a body sent with it is
# discarded (the connection serves the next request), nothing is done (no
# release, no approval, no Redis write), and the methods they do take still
# get their usual answers.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Idem::Test;

my $t = Idem::Test->new;
$t->start_stack(<<'EOF');
idempotency_metrics_zone idem 64k;
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    location /orders {
        idempotency on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /status {
        client_max_body_size 1k;
        idempotency_status;
    }
    location = /status-broken {
        idempotency_status;
        return 500;
    }
    location = /approve-broken {
        idempotency_approve;
        return 500;
    }
    location = /admin {
        idempotency_admin on;
    }
    location = /approve {
        client_max_body_size 1k;
        idempotency_approve;
    }
    location = /metrics {
        idempotency_metrics;
    }
    location = /approve-page {
        idempotency_approve_identity $remote_user;
        idempotency_approve_page;
    }
}
EOF

my $KEY = "methods-$$";
my %ALLOW = (
    '/status'                => 'GET, HEAD',
    '/metrics'               => 'GET, HEAD',
    '/admin?action=release'  => 'POST',
    '/approve'               => 'POST',
    '/approve-page'          => 'GET, HEAD, POST',
);
my %REFUSED = (
    '/status'                => [qw(DELETE PUT POST PATCH)],
    '/metrics'               => [qw(DELETE PUT POST)],
    '/admin?action=release'  => [qw(DELETE PUT GET PATCH)],
    '/approve'               => [qw(DELETE PUT GET)],
    '/approve-page'          => [qw(DELETE PUT PATCH)],
);

# a record that a wrongly accepted admin or approve request would change
my $w = $t->http(POST => '/orders', key => $KEY, json => { n => 1 });
like($w->{status}, qr/^2/, 'a write makes a record') or diag($t->show($w));
my @keys_before = $t->redis_keys;
my $rec_before  = join '|', map { $t->redis('DUMP', $_) // '' } @keys_before;

for my $path (sort keys %REFUSED) {
    for my $m (@{ $REFUSED{$path} }) {
        my $r = $t->http($m => $path, key => $KEY,
            ($m =~ /^(POST|PUT|PATCH)$/ ? (json => { operation_id => '0' x 32 }) : ()));
        my $name = "$m $path";
        $t->is_problem($r, 405, 'method-not-allowed', name => "$name: 405 problem",
            key => undef, retry_after => 0);
        is($r->{headers}{allow}, $ALLOW{$path}, "$name: Allow: $ALLOW{$path}");
        unlike($r->{content}, qr/<html/i, "$name: not nginx's HTML page");
    }
}

# HEAD of a POST endpoint: the same answer without its body
{
    my $r = $t->http(HEAD => '/approve');
    is($r->{status}, 405, 'HEAD /approve: 405');
    like($r->{headers}{'content-type'} // '', qr{^application/problem\+json\b},
        'HEAD /approve: application/problem+json');
    is($r->{headers}{allow}, 'POST', 'HEAD /approve: Allow: POST');
    is($r->{content}, '', 'HEAD /approve: no body');
}

# nginx's own answers in these locations are problems too, not its HTML
# pages: a body over client_max_body_size (413, told by Content-Length
# before the endpoint runs, or found while the endpoint reads a chunked
# body), and a 500
{
    my $big = '{"operation_id":"' . ('a' x 32) . '","pad":"' . ('x' x 2048) . '"}';
    my $r = $t->http(POST => '/approve', body => $big,
                     headers => [ 'Content-Type' => 'application/json' ]);
    $t->is_problem($r, 413, 'body-too-large', name => 'POST /approve, 2 KiB over 1k: 413 problem',
        key => undef, retry_after => 0);
    unlike($r->{content}, qr/<html/i, 'POST /approve, too large: not nginx\'s HTML page');

    $r = $t->http(GET => '/status', key => $KEY, body => $big);
    $t->is_problem($r, 413, 'body-too-large', name => 'GET /status with a 2 KiB body: 413 problem',
        key => undef, retry_after => 0);

    my $chunk = sprintf("%x\r\n%s\r\n0\r\n\r\n", length $big, $big);
    my $raw = $t->raw("POST /approve HTTP/1.1\r\nHost: localhost\r\n"
                      . "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                      . "Connection: close\r\n\r\n$chunk");
    ($r) = $t->parse_responses($raw);
    $t->is_problem($r, 413, 'body-too-large', name => 'POST /approve, chunked 2 KiB: 413 problem',
        key => undef, retry_after => 0);

    for my $path ('/status-broken', '/approve-broken') {
        $r = $t->http(GET => $path, key => $KEY);
        $t->is_problem($r, 500, 'internal-error', name => "GET $path: 500 problem",
            key => undef, retry_after => 0);
        unlike($r->{content}, qr/<html/i, "GET $path: not nginx's HTML page");
    }

    $r = $t->http(HEAD => '/status-broken');
    is($r->{status}, 500, 'HEAD /status-broken: 500');
    like($r->{headers}{'content-type'} // '', qr{^application/problem\+json\b},
        'HEAD /status-broken: application/problem+json');
    is($r->{content}, '', 'HEAD /status-broken: no body');
}

# the refused request's body is read and dropped: the next request on the
# connection is answered as itself
{
    my $body = '{"operation_id":"' . ('a' x 32) . '"}';
    my $raw = $t->raw($t->request_bytes(PUT => '/approve', body => $body,
                                        headers => [ 'Content-Type' => 'application/json' ],
                                        connection => 'keep-alive')
                      . $t->request_bytes(GET => '/status', key => $KEY),
                      responses => 2);
    my @r = $t->parse_responses($raw);
    is(scalar @r, 2, 'a body sent with a refused method: two answers on one connection');
    is($r[0]{status}, 405, 'the first: 405');
    is($r[1]{status}, 200, 'the second is the status of the key, not a bad request')
        or diag($t->show($r[1] // {}));
}

# nothing was done: no release, no approval, no Redis write
is_deeply([ $t->redis_keys ], \@keys_before, 'the refused requests made or deleted no key');
is(join('|', map { $t->redis('DUMP', $_) // '' } $t->redis_keys), $rec_before,
   'and changed no record');
is($t->effects(key => $KEY), 1, 'the upstream acted once');

# the methods they take are answered as before
{
    my $r = $t->http(GET => '/status', key => $KEY);
    is($r->{status}, 200, 'GET /status: 200');
    like($r->{headers}{'content-type'} // '', qr{^application/json\b}, 'GET /status: JSON');

    $r = $t->http(HEAD => '/status', key => $KEY);
    is($r->{status}, 200, 'HEAD /status: 200');

    $r = $t->http(GET => '/metrics');
    is($r->{status}, 200, 'GET /metrics: 200');
    like($r->{headers}{'content-type'} // '', qr{^text/plain}, 'GET /metrics: text');

    $r = $t->http(POST => '/admin?action=nonsense', key => $KEY);
    $t->is_problem($r, 400, 'bad-admin-request', name => 'POST /admin: its own problem');

    $r = $t->http(POST => '/approve', json => { operation_id => '0' x 32 });
    $t->is_problem($r, 400, 'bad-approval-request', name => 'POST /approve: its own problem');
}

$t->check_logs;
done_testing();
