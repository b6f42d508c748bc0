#!/usr/bin/perl
# An internal redirect does not step around a guard. A request that another
# location's settings already handled (let through without a key, or
# claimed under that location's confirmation, identity and lock) and that
# try_files (or error_page, X-Accel-Redirect) then moves into a guarded
# location is refused there, 500 with a line in error.log naming both
# locations, and never reaches the upstream. A redirect between unguarded
# locations, and a guarded location reached directly, work as before.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use Idem::Test;

my $t = Idem::Test->new;
my $p = $t->prefix;

open my $fh, '>', "$p/hs.key" or die; print $fh 'g' x 40; close $fh;

$t->start_stack(<<"EOF", log_format => 'G|$idempotency_key|$idempotency_outcome');
idempotency_json_var \$source_event_id /source_event_id;
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    idempotency on;
    idempotency_confirm_key hs256 $p/hs.key kid=hs;

    location /pay {
        try_files /maintenance.html \@app;
    }
    location \@app {
        idempotency_confirm on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /events {
        idempotency_unique ev:\$source_event_id;
        try_files /maintenance.html \@events;
    }
    location \@events {
        idempotency_unique other:\$source_event_id;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /plain {
        try_files /maintenance.html \@plain;
    }
    location \@plain {
        proxy_pass http://%%UPSTREAM%%;
    }
    location /off {
        idempotency off;
        try_files /maintenance.html \@app;
    }
    location /err {
        proxy_intercept_errors on;
        error_page 418 = \@app;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /accel {
        proxy_pass http://%%UPSTREAM%%;
    }
    location /direct {
        idempotency_confirm on;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

my $JS = JSON::PP->new->canonical;
sub post {
    my ($path, $key, $body) = @_;
    return $t->http(POST => $path, (defined $key ? (key => $key) : ()),
                    body => $JS->encode($body), headers => [ 'Content-Type' => 'application/json' ]);
}
my $pay = { amount => 990000, to => 'Mallory Ltd' };

# ---- unguarded /pay (idempotency on at server level) lets a keyless POST
# through, try_files moves it into the guarded @app: refused, not proxied
{
    my $r = post('/pay', undef, $pay);
    is($r->{status}, 500, 'no key, /pay into guarded @app: 500');
    is($t->effects(uri => '/pay'), 0, '... 0 effects (never proxied unconfirmed)');
    like($t->error_log, qr/redirected internally from location "\/pay" into guarded location "\@app" is refused/,
         '... error.log names both locations');
}

# ---- with a key: the claim is /pay's, @app's confirmation never looked
{
    my $k = $t->key('redirect-key');
    my $r = post('/pay', $k, $pay);
    is($r->{status}, 500, 'with a key, /pay into guarded @app: 500 (not 201, not 428)');
    $r = post('/pay', $k, $pay);
    is($r->{status}, 500, '... again: 500, the refusal is not a stored answer to replay');
    is($t->effects(uri => '/pay'), 0, '... 0 effects');
}

# ---- guarded into guarded-other: /events claimed under its own identity,
# @events' identity never ran
{
    my $k = $t->key('redirect-events');
    my $r = post('/events', $k, { source_event_id => 'e1' });
    is($r->{status}, 500, 'guarded /events into guarded @events: 500');
    is($t->effects(uri => '/events'), 0, '... 0 effects');
}

# ---- error_page: /err proxied its keyless request (unguarded, 1 effect),
# the upstream's 418 is redirected into @app: refused, not proxied again
{
    my $r = $t->http(POST => '/err', body => $JS->encode($pay),
                     headers => [ 'Content-Type' => 'application/json', 'X-Status' => 418 ]);
    is($r->{status}, 500, 'error_page from /err into guarded @app: 500');
    is($t->effects(uri => '/err'), 1, '... only /err\'s own effect, @app never proxied');
}

# ---- X-Accel-Redirect: /accel claimed its key and proxied (1 effect), its
# upstream's answer moves the request into @app: refused, @app never proxied
{
    my $k = $t->key('accel');
    my $r = $t->http(POST => '/accel', key => $k, body => $JS->encode($pay),
                     headers => [ 'Content-Type' => 'application/json',
                                  'X-Reply-Header' => 'X-Accel-Redirect: @app' ]);
    is($r->{status}, 500, 'X-Accel-Redirect from /accel into guarded @app: 500');
    is($t->effects(uri => '/accel'), 1, '... only /accel\'s own effect, @app never proxied');
    like($t->error_log, qr/redirected internally from location "\/accel" into guarded location "\@app" is refused/,
         '... refused by the guard (not an nginx redirect loop): error.log names both locations');
}

# ---- a first location without idempotency made no context: the guarded
# location guards the request as if it came directly
{
    my $r = post('/off', undef, $pay);
    $t->is_problem($r, 400, 'key-missing', name => '/off (idempotency off) into @app, no key: 400 key-missing');
    $r = post('/off', $t->key('off'), $pay);
    is($r->{status}, 428, '/off into @app with a key: 428, a proposal');
    is($t->effects(uri => '/off'), 0, '... 0 effects');
}

# ---- controls: an unguarded redirect, and the guard reached directly
{
    my $r = post('/plain', undef, $pay);
    is($r->{status}, 201, 'unguarded /plain into unguarded @plain: proxied as before');
    is($t->effects(uri => '/plain'), 1, '... 1 effect');
    $r = post('/direct', undef, $pay);
    $t->is_problem($r, 400, 'key-missing', name => 'guarded /direct, no key: 400 key-missing');
    $r = post('/direct', $t->key('direct'), $pay);
    is($r->{status}, 428, 'guarded /direct with a key: 428, a proposal');
    is($t->effects(uri => '/direct'), 0, '... 0 effects');
}

done_testing;
