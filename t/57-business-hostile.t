#!/usr/bin/perl
# Hostile input for the business features: idempotency_json_var pointers
# into huge bodies (spooled to a temp file: exactly 1 MiB is read, one byte
# more and several MiB are not, as documented: the variable is empty, and
# a location that decides by it, with idempotency_unique or
# idempotency_lock, refuses the request 400 body-unreadable), into a
# 10,000-element array and into a body nested 128 deep (129 is refused by
# the canonicalizer: body-unreadable too, as are JSON bodies that do not
# parse or have duplicate names), bodies of another media type (no
# identity, not refused), numbers that only their exact RFC
# 8785 text tells apart, a unique value longer than 1 KiB (Redis holds a
# digest of it, no key name or value holds it), idempotency_unique and
# idempotency_lock on one location, and pointers that nginx -t refuses.
# Every request counts the upstream's effects.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use Time::HiRes qw(sleep time);
use Idem::Test;

my $t = Idem::Test->new;

my $MiB = 1024 * 1024;
# a 128-token pointer: the string at the bottom of /d, 127 arrays deep
my $INNER = '/d' . ('/0' x 127);

# a location per variable: idempotency_unique of it, the variable echoed
my $UNIQUE_LOCATIONS = join '', map { my ($path, $value, $echo) = @$_; <<"EOF" }
    location $path {
        idempotency on;
        idempotency_unique $value;
        proxy_set_header X-Reply-Header "$echo";
        proxy_pass http://%%UPSTREAM%%;
    }
EOF
    [ '/huge',  'ev:$ev',      'X-Ev-Set: $ev_set' ],
    [ '/items', 'item:$item',  'X-Item: [$item]' ],
    [ '/deep',  'deep:$inner', 'X-Inner: [$inner]' ],
    [ '/num',   'n:$num',      'X-Num: [$num]' ];

$t->start_stack(<<"EOF", log_format => 'B|$idempotency_key|$idempotency_outcome|$idempotency_body_form|[$request_body_file]');
client_max_body_size 8m;
client_body_buffer_size 16k;

idempotency_json_var \$ev    /source_event_id;
idempotency_json_var \$item  /items/9999/id;
idempotency_json_var \$inner $INNER;
idempotency_json_var \$env   /environment;
idempotency_json_var \$num   /n;

map \$ev \$ev_set {
    ""       0;
    default  1;
}

server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    idempotency_scope \$http_authorization;

$UNIQUE_LOCATIONS
    location /capped {
        idempotency on;
        idempotency_lock deploy:\$ev;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /echo {
        idempotency on;
        proxy_set_header X-Reply-Header "X-Ev-Set: \$ev_set";
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /status {
        idempotency_status;
    }
    location = /admin {
        idempotency_admin on;
    }
    location /both {
        idempotency on;
        idempotency_lease 2s;
        idempotency_unique ev:\$ev;
        idempotency_lock deploy:\$env;
        proxy_ignore_client_abort on;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

my $AUTH = 'Bearer tenant-hostile';

sub post {
    my ($path, $key, $body, %o) = @_;
    return $t->http(POST => $path, key => $key, body => $body, timeout => 60,
        headers => [ 'Content-Type' => $o{ct} // 'application/json', Authorization => $AUTH,
                     @{ $o{headers} // [] } ]);
}

# the access-log fields (outcome, form, file) of key $k's first request
sub log_of {
    my ($k) = @_;
    my $l = '';
    $t->wait_for(sub { ($l) = grep { /^B\|\Q$k\E\|/ } $t->access_log; defined $l }, 5);
    my (undef, undef, $outcome, $form, $file) = split /\|/, $l // '', 5;
    return { outcome => $outcome // '', form => $form // '', file => ($file // '') =~ s/^\[|\]$//gr };
}

# Two requests of two keys (the second with $b2, or the same body): the
# answers, the upstream's effects of both keys, and the keys.
sub two_keys {
    my ($what, $path, $b1, $b2, %o) = @_;
    (my $tag = $what) =~ s/[^A-Za-z0-9]+/-/g;
    my ($k1, $k2) = ($t->key("$tag-1"), $t->key("$tag-2"));
    my $r1 = post($path, $k1, $b1, %o);
    my $r2 = post($path, $k2, $b2 // $b1, %o);
    return ($r1, $r2, $t->effects(key => $k1) + $t->effects(key => $k2), $k1, $k2);
}

# one business identity: the second key gets the first's answer, reused
sub one_identity {
    my ($what, @args) = @_;
    my ($r1, $r2, $n, $k1) = two_keys($what, @args);
    is($r1->{status}, 201, "$what: the first key executes") or diag($t->show($r1));
    is($r2->{status}, 201, "$what: the second key gets its status");
    is($r2->{headers}{'idempotent-reused'}, 'true', "$what: ... Idempotent-Reused");
    is($r2->{content}, $r1->{content}, "$what: ... and its body");
    is($n, 1, "$what: 1 effect");
    return ($r1, $r2, $k1);
}

# no business identity: each key executes on its own
sub no_identity {
    my ($what, @args) = @_;
    my ($r1, $r2, $n, $k1) = two_keys($what, @args);
    is($r1->{status}, 201, "$what: the first key executes") or diag($t->show($r1));
    is($r2->{status}, 201, "$what: the second key executes too") or diag($t->show($r2));
    ok(!$r2->{headers}{'idempotent-reused'}, "$what: ... not reused");
    is($n, 2, "$what: 2 effects");
    return ($r1, $r2, $k1);
}

# a body a decision cannot read: 400 body-unreadable for two keys, nothing
# executed or recorded
sub refused {
    my ($what, $path, $b1, $b2, %o) = @_;
    my ($r1, $r2, $n, $k1, $k2) = two_keys($what, $path, $b1, $b2, %o);
    $t->is_problem($r1, 400, 'body-unreadable', name => "$what: the first key: 400 body-unreadable");
    $t->is_problem($r2, 400, 'body-unreadable', name => "$what: the second key too");
    is($n, 0, "$what: 0 effects");
    ok(!$t->record($k1, $AUTH) && !$t->record($k2, $AUTH), "$what: nothing recorded");
    return ($r1, $r2, $k1);
}

# a JSON body of exactly $len bytes: a source_event_id of $c repeated
sub huge_body {
    my ($len, $c, $title) = @_;
    my $shell = qq({"source_event_id":"","title":"$title"});
    return qq({"source_event_id":") . ($c x ($len - length $shell)) . qq(","title":"$title"});
}

# ---- a pointer to a huge string, the body spooled to a temp file
{
    my ($r1, undef, $k) = one_identity('1 MiB body, a string of almost 1 MiB', '/huge',
                                       huge_body($MiB, 'h', 'a'), huge_body($MiB, 'h', 'b'));
    is($r1->{headers}{'x-ev-set'}, 1, '1 MiB: the variable is set');
    my $l = log_of($k);
    is($l->{form}, 'json', '1 MiB: the body was read as JSON');
    like($l->{file}, qr/\S/, '1 MiB: ... from the temp file nginx spooled it to');

    # over 1 MiB the variable is empty (docs/directives.md): a location
    # that decides by it refuses the request, one that only reads it
    # (proxy_set_header) passes it on
    refused('1 MiB + 1 byte', '/huge', huge_body($MiB + 1, 'i', 'a'), huge_body($MiB + 1, 'i', 'b'));
    refused('4 MiB body, a string of almost 4 MiB', '/huge',
            huge_body(4 * $MiB, 'H', 'a'), huge_body(4 * $MiB, 'H', 'b'));
    ($r1) = no_identity('1 MiB + 1 byte, no decision by it', '/echo',
                        huge_body($MiB + 1, 'j', 'a'), huge_body($MiB + 1, 'j', 'b'));
    is($r1->{headers}{'x-ev-set'}, 0, '1 MiB + 1: the variable is empty');
    ($r1, undef, $k) = no_identity('4 MiB, no decision by it', '/echo',
                                  huge_body(4 * $MiB, 'J', 'a'), huge_body(4 * $MiB, 'J', 'b'));
    is($r1->{headers}{'x-ev-set'}, 0, '4 MiB: the variable is empty');
    my ($e) = $t->effect_list(key => $k);
    is($e && $e->{len}, 4 * $MiB, '4 MiB: the upstream got the whole body');
    like(log_of($k)->{file}, qr/\S/, '4 MiB: spooled to a temp file');
}

# ---- a lock whose value comes from a body it cannot read is never
# skipped: the request is refused (docs/business-keys.md)
{
    my ($k1, $k2) = ($t->key('capped-over'), $t->key('capped-1m'));
    my $r = post('/capped', $k1, huge_body($MiB + 1, 'c', 'a'));
    $t->is_problem($r, 400, 'body-unreadable', name => 'a lock from the body, 1 MiB + 1 byte: 400 body-unreadable');
    ok(!$t->record($k1, $AUTH), '... no record');
    $r = post('/capped', $t->key('capped-dup'), '{"source_event_id":"x","source_event_id":"y"}');
    $t->is_problem($r, 400, 'body-unreadable', name => 'a lock from the body, duplicate member names: 400');
    my $locks = () = $t->redis_keys('*:l');
    $r = post('/capped', $k2, huge_body($MiB, 'c', 'a'));
    is($r->{status}, 201, '1 MiB: executes');
    is(scalar(() = $t->redis_keys('*:l')), $locks + 1, '... and took its lock');
    is($t->effects(key => $k1) + $t->effects(key => $k2), 1, '1 effect');
}

# ---- a pointer into a 10,000-element array
{
    my $items = join ',', map { qq({"id":"item-$_"}) } 0 .. 9999;
    my ($r1) = one_identity('10,000 elements, /items/9999/id', '/items',
                            qq({"items":[$items],"note":"a"}), qq({"note":"b","items":[$items]}));
    is($r1->{headers}{'x-item'}, '[item-9999]', '10,000 elements: the variable is the last element\'s id');

    my $short = join ',', map { qq({"id":"item-$_"}) } 0 .. 9998;
    ($r1) = no_identity('9,999 elements: /items/9999 is absent', '/items',
                        qq({"items":[$short],"note":"a"}), qq({"items":[$short],"note":"b"}));
    is($r1->{headers}{'x-item'}, '[]', '9,999 elements: the variable is empty');
}

# ---- deep nesting: 128 levels are JSON, 129 are not
{
    my $deep = sub { my ($n, $note) = @_; qq({"note":"$note","d":) . ('[' x $n) . '"deep-core"' . (']' x $n) . '}' };
    my ($r1, undef, $k) = one_identity('depth 128, a 128-token pointer', '/deep', $deep->(127, 'a'), $deep->(127, 'b'));
    is($r1->{headers}{'x-inner'}, '[deep-core]', 'depth 128: the variable is the innermost string');
    is(log_of($k)->{form}, 'json', 'depth 128: the body is JSON');

    (undef, undef, $k) = refused('depth 129', '/deep', $deep->(128, 'a'), $deep->(128, 'b'));
    is(log_of($k)->{form}, 'raw-invalid-json', 'depth 129: refused by the canonicalizer, hashed raw');
}

# ---- bodies of another media type: refused 415 where the identity reads
# the body (changed on purpose with the guards of issue 35: this test
# expected two executions, the variable empty, which an upstream that
# parses JSON whatever the label runs twice; t/74-guards.t row 4);
# JSON bodies that are not canonical JSON: refused
{
    my ($r1, $r2, $n, $k) = two_keys('text/plain', '/huge', '{"source_event_id":"e-text"}', undef, ct => 'text/plain');
    $t->is_problem($r1, 415, 'unsupported-media-type', name => 'text/plain: the first key: 415');
    $t->is_problem($r2, 415, 'unsupported-media-type', name => 'text/plain: the second key too');
    is($n, 0, 'text/plain: 0 effects');
    is(log_of($k)->{form}, 'raw', 'text/plain: hashed raw');

    for my $c ([ 'JSON that does not parse', '{"source_event_id":"e-bad",' ],
               [ 'duplicate member names', '{"source_event_id":"e-dup","source_event_id":"e-dup"}' ],
               [ 'a trailing value', '{"source_event_id":"e-trail"} {}' ]) {
        my ($what, $body) = @$c;
        (undef, undef, $k) = refused($what, '/huge', $body);
        is(log_of($k)->{form}, 'raw-invalid-json', "$what: hashed raw");
    }

    # a NUL inside the value is not JSON RFC 8785 represents: refused,
    # never the value cut at the NUL (which would make these two one)
    refused('\\u0000 inside the value', '/huge',
            '{"source_event_id":"e-nul\u0000a"}', '{"source_event_id":"e-nul\u0000b"}');
}

# ---- numbers: equal JSON values are one identity, different ones are not
{
    my ($r1, $r2) = no_identity('0.30000000000000004 and 0.3', '/num', '{"n":0.30000000000000004}', '{"n":0.3}');
    is($r1->{headers}{'x-num'}, '[0.30000000000000004]', '0.30000000000000004: its RFC 8785 text');
    is($r2->{headers}{'x-num'}, '[0.3]', '0.3: its RFC 8785 text');
    my $k = $t->key('num-3e-1');
    my $r = post('/num', $k, '{"n":3e-1}');
    is($r->{headers}{'idempotent-reused'}, 'true', '3e-1, a third key: 0.3\'s identity, reused');
    is($r->{content}, $r2->{content}, '... with 0.3\'s body');
    is($t->effects(key => $k), 0, '... 0 effects');
    ($r1) = one_identity('the largest double', '/num', '{"n":1.7976931348623157e308}', '{"n":17976931348623157e292}');
    is($r1->{headers}{'x-num'}, '[1.7976931348623157e+308]', 'the largest double: its RFC 8785 text');
    ($r1) = one_identity('an object with numbers', '/num', '{"n":{"b":[1.0,0.30000000000000004],"a":1e2}}',
                         '{"n":{"a":100,"b":[1,0.30000000000000004]}}');
    is($r1->{headers}{'x-num'}, '[{"a":100,"b":[1,0.30000000000000004]}]', 'an object: its RFC 8785 text');
    $k = $t->key('num-obj');
    $r = post('/num', $k, '{"n":{"a":100,"b":[1,0.3]}}');
    ok($r->{status} == 201 && !$r->{headers}{'idempotent-reused'}, 'the object with 0.3 in it: another identity');
    is($t->effects(key => $k), 1, '... 1 effect');
}

# ---- a unique value over 1 KiB: one identity, held as a digest only
my $LONG = join '', map { sprintf 'bizid-%04d-', $_ } 0 .. 299;    # 3,300 bytes
{
    one_identity('a 3,300-byte identity', '/huge', qq({"source_event_id":"$LONG","title":"a"}),
                 qq({"source_event_id":"$LONG","title":"b"}));
}

# ---- idempotency_unique and idempotency_lock on one location
{
    my $dep = sub {
        my ($k, $ev, $env, %o) = @_;
        my $body = $o{body} // JSON::PP->new->canonical->encode({ source_event_id => $ev, environment => $env });
        return $o{bg} ? $t->http_bg(POST => '/both', key => $k, body => $body, timeout => 20,
                                    headers => [ 'Content-Type' => 'application/json', Authorization => $AUTH,
                                                 'X-Delay' => $o{bg} ])
                      : post('/both', $k, $body);
    };
    my %k = map { $_ => $t->key("both-$_") } qw(a b c d e f g h i);
    my $bg = $dep->($k{a}, 'ev-1', 'production', bg => 2.5);
    ok($t->wait_for(sub { $t->effects(key => $k{a}) == 1 }, 5), 'a (ev-1, production) runs and holds both');

    my $r = $dep->($k{b}, 'ev-1', 'production');
    $t->is_problem($r, 409, 'in-progress', name => 'b, the same identity: in-progress of a, not lock-held');
    is(($t->problem($r) // {})->{reused}, JSON::PP::true, '... marked reused');
    $r = $dep->($k{c}, 'ev-2', 'production');
    $t->is_problem($r, 409, 'lock-held', retry_after => 1, name => 'c, another identity for production: lock-held');
    ok(!$t->record($k{c}, $AUTH), '... nothing recorded for c');
    $r = $dep->($k{d}, 'ev-3', 'staging');
    is($r->{status}, 201, 'd, another identity for staging: executes');
    $r = $dep->($k{e}, 'ev-4', 'production',
                body => '{"environment":"production","n":1.' . ('0' x 700) . '1,"source_event_id":"ev-4"}');
    $t->is_problem($r, 409, 'lock-held', name => 'e, with a 700-digit number in its body: lock-held too');

    # b is a's alias: the status endpoint says so, the admin endpoint refuses it
    my $st = $t->http(GET => '/status', key => $k{b}, headers => [ Authorization => $AUTH ]);
    my $sj = eval { JSON::PP->new->decode($st->{content}) } // {};
    is("$st->{status} " . ($sj->{state} // '') . ' ' . ($sj->{alias_state} // 'null'), '200 alias in_progress',
       'status of b: an alias of an operation in progress');
    is($sj->{operation_id}, ($t->record($k{a}, $AUTH) // {})->{op}, '... a\'s operation id');
    $r = $t->http(POST => '/admin?action=release', key => $k{b}, headers => [ Authorization => $AUTH ]);
    $t->is_problem($r, 409, 'not-resolvable', name => 'the admin endpoint refuses to release b (an alias)');
    is(($t->record($k{a}, $AUTH) // {})->{state}, 'in_progress', '... and a is untouched');

    # past a's 2 s lease: renewed with its unique and lock keys, still held
    sleep 0.1 while time < $bg->{t_start} + 2.2;
    cmp_ok($t->lease_left($t->record($k{a}, $AUTH)) // 0, '>', 0, 'a\'s lease was renewed past 2 s');
    $r = $dep->($k{e}, 'ev-4', 'production');
    $t->is_problem($r, 409, 'lock-held', retry_after => 1, name => 'e\'s retry then: lock-held, a in flight');
    $r = $dep->($k{b}, 'ev-1', 'production');
    $t->is_problem($r, 409, 'in-progress', name => 'b\'s retry then: in-progress of a');
    is($t->effects(key => $k{b}) + $t->effects(key => $k{c}) + $t->effects(key => $k{e}), 0,
       'while a runs: b, c and e have 0 effects');

    my $ra = $bg->result(20);
    is($ra && $ra->{status}, 201, 'a completes');
    $r = $dep->($k{b}, 'ev-1', 'production');
    is($r->{headers}{'idempotent-reused'}, 'true', 'then b\'s retry is reused');
    is($r->{content}, $ra && $ra->{content}, '... with a\'s body');
    $r = $dep->($k{c}, 'ev-2', 'production');
    is($r->{status}, 201, 'c\'s retry executes (the lock is free)');
    ok(!$r->{headers}{'idempotent-reused'}, '... not reused');
    $r = $dep->($k{f}, 'ev-1', 'staging');
    is($r->{headers}{'idempotent-reused'}, 'true', 'f, ev-1 for staging: a\'s answer (the identity counts first)');

    # the lock held by g does not stop a reused answer, nor a replay
    my $bg2 = $dep->($k{g}, 'ev-5', 'production', bg => 1.5);
    ok($t->wait_for(sub { $t->effects(key => $k{g}) == 1 }, 5), 'g (ev-5, production) runs');
    $r = $dep->($k{h}, 'ev-1', 'production');
    is($r->{headers}{'idempotent-reused'}, 'true', 'h, ev-1 for production while g holds the lock: a\'s answer');
    $r = $dep->($k{a}, 'ev-1', 'production');
    is($r->{headers}{'idempotent-replayed'}, 'true', 'a\'s own retry while g holds the lock: replayed');
    $r = $dep->($k{i}, 'ev-2', 'production');
    is($r->{headers}{'idempotent-reused'}, 'true', 'i, ev-2 (held by c, completed) while g holds the lock: reused');
    $r = $t->http(POST => '/both', key => $t->key('both-noev'), body => '{"environment":"production"}',
                  headers => [ 'Content-Type' => 'application/json', Authorization => $AUTH ]);
    $t->is_problem($r, 409, 'lock-held', name => 'no identity, production while g holds it: lock-held');
    $bg2->result(20);

    my %n = map { $_ => $t->effects(key => $k{$_}) } keys %k;
    is(join(' ', map { "$_=$n{$_}" } sort keys %n), 'a=1 b=0 c=1 d=1 e=0 f=0 g=1 h=0 i=0',
       'effects per key: a, c, d and g once, the others never');
}

# ---- Redis holds digests: no key name and no value holds an identity
{
    my @keys = $t->redis_keys('*');
    ok(@keys > 10, 'Redis holds the records (' . scalar(@keys) . ' keys)');
    my %hits;
    for my $k (@keys) {
        my $type = $t->redis('TYPE', $k);
        my @v = $type eq 'string' ? ($t->redis('GET', $k)) : ("(a $type)");
        for my $m ('bizid-0', 'bizid-0299', 'hhhhhhhhhhhhhhhh', 'HHHHHHHHHHHHHHHH', 'iiiiiiiiiiiiiiii', 'cccccccccccccccc',
                   'ev-1', 'production') {
            $hits{$m}++ if index($k, $m) >= 0 || grep { index($_ // '', $m) >= 0 } @v;
        }
        $hits{"type $type"}++ if $type ne 'string';
    }
    is(join(', ', sort keys %hits), '', 'no Redis key name or value holds an identity, a lock value or a huge string');
}

# ---- pointers nginx -t refuses, naming the directive (t/18-config.t has
# the name, "", no leading /, ~2 and duplicates)
{
    my $conf = sub {
        my ($ptr) = @_;
        return "idempotency_json_var \$v $ptr;\nserver { listen 127.0.0.1:%%PORT%%; location / { return 204; } }";
    };
    my ($rc, $out) = $t->nginx_test_conf($conf->($INNER));
    is($rc, 0, 'nginx -t accepts a pointer of 128 tokens') or diag($out);
    for my $c ([ 'a trailing ~', '/a~', qr/"~" must be followed by "0" or "1"/ ],
               [ '~ alone', '/a/~/b', qr/"~" must be followed by "0" or "1"/ ],
               [ '~ followed by ~', '/~~0', qr/"~" must be followed by "0" or "1"/ ],
               [ 'a byte that is not UTF-8', "/\xff", qr/not valid UTF-8/ ],
               [ 'a truncated UTF-8 sequence', "/caf\xc3", qr/not valid UTF-8/ ],
               [ 'an overlong UTF-8 encoding of /', "/a\xc0\xafb", qr/not valid UTF-8/ ],
               [ 'an encoded surrogate', "/\xed\xa0\x80", qr/not valid UTF-8/ ],
               [ '129 tokens', $INNER . '/0', qr/more than 128 reference tokens/ ]) {
        my ($what, $ptr, $why) = @$c;
        ($rc, $out) = $t->nginx_test_conf($conf->("'$ptr'"));
        isnt($rc, 0, "nginx -t refuses a pointer with $what");
        like($out, qr/\[emerg\] .*"idempotency_json_var": ".*" is not a JSON pointer \(RFC 6901\) of a member: $why/,
             "nginx -t: $what: [emerg] names the directive and why") or diag($out);
    }
}

$t->check_logs;
done_testing;
