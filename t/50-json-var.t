#!/usr/bin/perl
# idempotency_json_var: a variable that is a member of the JSON request
# body, named by a JSON pointer (RFC 6901), read from the body the module
# already read (parsed once per request).  Strings give their value, other
# members their RFC 8785 (canonical JSON) text, and a member that is absent, a body that
# is not JSON, or a request whose body the module did not read give "".
# It works in proxy_set_header, map, log_format and idempotency_confirm.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Idem::Test;

my $t = Idem::Test->new;
my $p = $t->prefix;
open my $kf, '>', "$p/hs.key" or die "$p/hs.key: $!";
print $kf ('s' x 40), "\n";
close $kf;

$t->start_stack(<<"EOF", log_format => 'J|$request_uri|[$src]|[$idx]|[$m]|$idempotency_outcome');
idempotency_json_var \$src  /source_event_id;
idempotency_json_var \$esc  /a~1b/c~0d;
idempotency_json_var \$idx  /items/1;
idempotency_json_var \$num  /n;
idempotency_json_var \$t    /t;
idempotency_json_var \$z    /z;
idempotency_json_var \$o    /o;
idempotency_json_var \$miss /nope;
idempotency_json_var \$deep /items/9;
idempotency_json_var \$amount /amount;

map \$src \$m {
    alert-7c91  matched;
    default     other;
}

map \$amount \$big {
    "~^[0-9]{4,}\$"  1;
    default         0;
}

server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;

    location /j/ {
        idempotency on;
        proxy_set_header X-Reply-Header "X-V: [\$src][\$esc][\$idx][\$num][\$t][\$z][\$o][\$miss][\$deep][\$m]";
        proxy_pass http://%%UPSTREAM%%;
    }
    location /plain/ {
        proxy_set_header X-Reply-Header "X-V: [\$src][\$m]";
        proxy_pass http://%%UPSTREAM%%;
    }
    location /c/ {
        idempotency on;
        idempotency_confirm \$big;
        idempotency_confirm_key hs256 $p/hs.key;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

sub post {
    my ($path, $key, $body, $ct) = @_;
    return $t->http(POST => $path, (defined $key ? (key => $key) : ()), body => $body,
        headers => [ 'Content-Type' => $ct // 'application/json' ]);
}

sub logged {
    my ($uri) = @_;
    my $l;
    $t->wait_for(sub { ($l) = grep { /^J\|\Q$uri\E\|/ } $t->access_log; defined $l }, 5);
    return $l // '';
}

my $EMPTY = '[][][][][][][][][][other]';

# ---- every kind of member
{
    my $k = $t->key('all');
    my $body = '{"source_event_id":"alert-7c91","a/b":{"c~d":"esc"},"items":[10,"second"],'
             . '"n":1.0e2,"t":true,"z":null,"o":{"z":"\u00e9","k":[1,2.50]}}';
    my $r = post('/j/a', $k, $body);
    is($r->{status}, 201, 'JSON body: executes') or diag($t->show($r));
    is($r->{headers}{'x-v'},
       "[alert-7c91][esc][second][100][true][][{\"k\":[1,2.5],\"z\":\"\xc3\xa9\"}][][][matched]",
       'string value, ~1 ~0 escapes, array index, number/true/object as RFC 8785 text, null and absent empty, map');
    # null gave "null" before issue 35 (changed on purpose): two events
    # whose id is null were one identity (t/74-guards.t row 7)
    is($t->effects(key => $k), 1, 'one effect');
    like(logged('/j/a'), qr/^J\|\/j\/a\|\[alert-7c91\]\|\[second\]\|\[matched\]\|executed$/,
         'log_format sees the variables');

    my $b = post('/j/a', $k, $body);
    is($b->{headers}{'idempotent-replayed'}, 'true', 'retry replays');
    is($t->effects(key => $k), 1, 'retry: still one effect');
}

# ---- a string with escapes gives its decoded value
{
    my $k = $t->key('str');
    my $r = post('/j/s', $k, '{"source_event_id":"a\u0062c"}');
    like($r->{headers}{'x-v'} // '', qr/^\[abc\]/, 'JSON string escapes are decoded') or diag($t->show($r));
    is($t->effects(key => $k), 1, 'one effect');
}

# ---- not JSON: empty
{
    my $k = $t->key('txt');
    my $r = post('/j/t', $k, '{"source_event_id":"alert-7c91"}', 'text/plain');
    is($r->{status}, 201, 'text/plain body executes');
    is($r->{headers}{'x-v'}, $EMPTY, 'a body that is not of a JSON media type: every variable empty');

    $k = $t->key('bad');
    $r = post('/j/b', $k, '{"source_event_id":"alert-7c91",');
    is($r->{status}, 201, 'invalid JSON executes (hashed raw)');
    is($r->{headers}{'x-v'}, $EMPTY, 'invalid JSON: every variable empty');

    $k = $t->key('arr');
    $r = post('/j/r', $k, '[1,2]');
    is($r->{headers}{'x-v'}, $EMPTY, 'a top-level array: members absent, empty');
    is($t->effects(uri => '/j/t') + $t->effects(uri => '/j/b') + $t->effects(uri => '/j/r'), 3,
       'one effect each');
}

# ---- a location without the module: the body was not read by it
{
    my $r = post('/plain/x', undef, '{"source_event_id":"alert-7c91"}');
    is($r->{status}, 201, 'plain location executes');
    is($r->{headers}{'x-v'}, '[][other]', 'body not read by the module: empty');
    is($t->effects(uri => '/plain/x'), 1, 'plain location: one effect');
}

# ---- idempotency_confirm decided by a body member
{
    my $k = $t->key('big');
    my $r = post('/c/pay', $k, '{"amount":5000}');
    $t->is_problem($r, 428, 'confirmation-required', name => 'amount 5000: 428 confirmation-required');
    is($t->effects(key => $k), 0, 'amount 5000: no effect');

    $k = $t->key('small');
    $r = post('/c/pay', $k, '{"amount":10}');
    is($r->{status}, 201, 'amount 10: no confirmation, executes') or diag($t->show($r));
    is($t->effects(key => $k), 1, 'amount 10: one effect');

    # the upstream's parser may read the second amount: an empty $amount
    # (the body is not canonical JSON) must not mean "no confirmation"
    $k = $t->key('dup');
    $r = post('/c/pay', $k, '{"amount":10,"amount":5000}');
    $t->is_problem($r, 400, 'body-unreadable', name => 'two amounts: 400 body-unreadable, not executed unconfirmed');
    is($t->effects(key => $k), 0, 'two amounts: no effect');
    ok(!$t->record($k), 'two amounts: nothing recorded');
    $k = $t->key('dup-plain');
    $r = post('/j/x', $k, '{"source_event_id":"a","source_event_id":"b"}');
    is($r->{status}, 201, 'a location that only reads the variables (proxy_set_header) is not refused');
    is($t->effects(key => $k), 1, '... one effect');
}

done_testing;
