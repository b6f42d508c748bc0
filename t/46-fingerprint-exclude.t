#!/usr/bin/perl
# idempotency_fingerprint_exclude: the JSON body members it names do not
# count toward the fingerprint (docs/fingerprint.md section 3.1).  Retries
# that differ only there replay, any other change is still a conflict,
# build/idempotency-fingerprint --exclude gives the module's fingerprint,
# the body's strict checks still apply under an excluded member, and
# nginx -t refuses bad pointers naming the directive.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use File::Temp qw(tempfile);
use JSON::PP;
use Test::More;
use Idem::Test;

my $tool = "$FindBin::Bin/../build/idempotency-fingerprint";
ok(-x $tool, 'build/idempotency-fingerprint is built') or BAIL_OUT('run make tools');

my $t = Idem::Test->new;
$t->start_stack(<<'EOF', log_format => 'F|$request_uri|$idempotency_fingerprint|$idempotency_body_form|$idempotency_outcome', main => 'thread_pool idem threads=1;', error_log_level => 'debug');
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    client_max_body_size 8m;
    idempotency_fingerprint_exclude /request_id /meta/sent_at;

    location /ex/ {
        idempotency on;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /tp/ {
        idempotency on;
        idempotency_thread_pool idem min_size=1;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /off/ {
        idempotency on;
        idempotency_fingerprint_exclude off;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /own/ {
        idempotency on;
        idempotency_fingerprint_exclude /note /items/1;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

my @EX = ('/request_id', '/meta/sent_at');
my $JSON = JSON::PP->new->canonical;

sub post {
    my ($path, $key, $body) = @_;
    return $t->http(POST => $path, key => $key, body => $body,
        headers => [ 'Content-Type' => 'application/json' ]);
}

# the access log line of a request URI: (fingerprint, body form, outcome)
sub logged {
    my ($uri) = @_;
    my $l;
    $t->wait_for(sub { ($l) = grep { /^F\|\Q$uri\E\|/ } $t->access_log; defined $l }, 5);
    my (undef, undef, $fp, $form, $outcome) = split /\|/, $l // '', -1;
    return ($fp // '', $form // '', $outcome // '');
}

# the command's fingerprint of a POST with a JSON body
sub tool {
    my ($route, $body, @ex) = @_;
    my ($fh, $name) = tempfile(UNLINK => 1);
    binmode $fh;
    print $fh $body;
    close $fh;
    # the body form on its stderr is not this test's output
    open(my $err, '>&', \*STDERR) or die "dup: $!";
    open(STDERR, '>', '/dev/null') or die "/dev/null: $!";
    open(my $out, '-|', $tool, '--method', 'POST', '--route', $route,
         '--content-type', 'application/json', '--body-file', $name,
         map { ('--exclude', $_) } @ex) or die "$tool: $!";
    my $fp = do { local $/; <$out> } // '';
    close $out;
    open(STDERR, '>&', $err) or die "dup: $!";
    $fp =~ s/\s+\z//;
    return $fp;
}

# ---- retries that differ only in excluded members replay
{
    my $k = $t->key('ex');
    my $a = post('/ex/orders', $k, '{"amount":10,"request_id":"r-1","meta":{"sent_at":"12:00:00","src":"web"}}');
    is($a->{status}, 201, 'first attempt executes') or diag($t->show($a));

    my $b = post('/ex/orders', $k, qq({"meta": {"src":"web", "sent_at":"12:00:05"},\n "request_id":"r-2", "amount":10.0}));
    is($b->{status}, 201, 'another request_id and sent_at: same status');
    is($b->{headers}{'idempotent-replayed'}, 'true', 'another request_id and sent_at: replayed');
    is($b->{content}, $a->{content}, 'replayed body identical');
    is($t->effects(key => $k), 1, 'one upstream effect');

    my $c = post('/ex/orders', $k, '{"amount":10,"meta":{"src":"web"}}');
    is($c->{headers}{'idempotent-replayed'}, 'true', 'excluded members absent: replayed');

    my $d = post('/ex/orders', $k, '{"amount":11,"request_id":"r-1","meta":{"sent_at":"12:00:00","src":"web"}}');
    $t->is_problem($d, 409, 'fingerprint-mismatch', key => $k,
        name => 'another amount -> 409 fingerprint-mismatch');

    my $e = post('/ex/orders', $k, '{"amount":10,"request_id":"r-1","meta":{"sent_at":"12:00:00","src":"app"}}');
    $t->is_problem($e, 409, 'fingerprint-mismatch', key => $k,
        name => 'a member next to an excluded one still counts');

    my $f = post('/ex/orders', $k, '{"amount":10,"request_id":"r-1","meta":{"sent_at":"12:00:00","src":"web"},"sent_at":1}');
    $t->is_problem($f, 409, 'fingerprint-mismatch', key => $k,
        name => 'a top-level sent_at is not /meta/sent_at');
    is($t->effects(key => $k), 1, 'conflicts: still one effect');
}

# ---- "off" and a location's own list replace the inherited one
{
    my $k = $t->key('off');
    post('/off/orders', $k, '{"amount":10,"request_id":"r-1"}');
    my $b = post('/off/orders', $k, '{"amount":10,"request_id":"r-2"}');
    $t->is_problem($b, 409, 'fingerprint-mismatch', name => 'off: request_id counts again');

    $k = $t->key('own');
    post('/own/orders', $k, '{"amount":10,"note":"a","items":[1,2,3]}');
    my $c = post('/own/orders', $k, '{"amount":10,"note":"b","items":[1,9,3]}');
    is($c->{headers}{'idempotent-replayed'}, 'true', 'own list: /note and /items/1 excluded');
    my $d = post('/own/orders', $k, '{"amount":10,"note":"a","items":[1,2,3],"request_id":"x"}');
    $t->is_problem($d, 409, 'fingerprint-mismatch', name => 'own list: the inherited /request_id is not');
    is($t->effects(key => $k), 1, 'own list: one effect');
}

# ---- the command agrees with $idempotency_fingerprint
srand(46);
my @names = qw(a b id x sent_at request_id meta);

sub gen {
    my ($d) = @_;
    my $r = int(rand($d > 3 ? 2 : 4));
    return int(rand(1000)) / 4 if $r == 0;
    return 'v' . int(rand(100)) if $r == 1;
    return [ map { gen($d + 1) } 1 .. int(rand(4)) ] if $r == 2;
    return { map { $names[int(rand(@names))] => gen($d + 1) } 1 .. int(rand(4)) };
}

my ($agree, $differs) = (0, 0);
for my $i (1 .. 20) {
    my $doc = { amount => $i, body => gen(1) };
    $doc->{request_id} = "r-$i" if $i % 2;
    $doc->{meta} = { sent_at => "t$i", deep => gen(2) } if $i % 3;
    my $body = $JSON->encode($doc);
    my $uri = "/ex/gen/$i";

    my $r = post($uri, $t->key('gen'), $body);
    my ($fp, $form) = logged($uri);
    my $want = tool($uri, $body, @EX);
    $agree++ if $r->{status} == 201 && $form eq 'json' && $fp =~ /^[0-9a-f]{64}$/ && $fp eq $want;
    diag("$uri: module $fp ($form), command $want; $body") unless $fp eq $want;

    # the command without --exclude differs exactly when there was something to drop
    my $plain = tool($uri, $body);
    $differs++ if ($plain ne $want) == (($i % 2) || ($i % 3) ? 1 : 0);
}
is($agree, 20, 'idempotency-fingerprint --exclude = $idempotency_fingerprint for 20 generated bodies');
is($differs, 20, 'and it differs from the fingerprint without --exclude exactly when an excluded member was there');

# ---- hostile bodies
{
    # a 10k-element array next to an excluded member
    my $items = '[' . join(',', map { qq({"n":$_,"request_id":$_}) } 1 .. 10000) . ']';
    my $body = qq({"items":$items,"request_id":"big","meta":{"sent_at":1}});
    my $k = $t->key('big');
    my $a = post('/ex/big', $k, $body);
    is($a->{status}, 201, '10k-element array: executes');
    my ($fp, $form) = logged('/ex/big');
    is($form, 'json', '10k-element array: canonicalized');
    is($fp, tool('/ex/big', $body, @EX), '10k-element array: the command agrees');
    is($fp, tool('/ex/big', qq({"items":$items,"meta":{}}), @EX),
       '10k-element array: the same as without the excluded members');
    my $b = post('/ex/big', $k, qq({"meta":{"sent_at":2},"items":$items,"request_id":"other"}));
    is($b->{headers}{'idempotent-replayed'}, 'true', '10k-element array: replayed');

    # the same in the thread pool: the set is only read there
    post('/tp/big', $t->key('tp'), $body);
    my ($tfp, $tform) = logged('/tp/big');
    is($tfp, tool('/tp/big', qq({"items":$items,"meta":{}}), @EX),
       'in idempotency_thread_pool: the same exclusion');
    like($t->error_log, qr/idempotency: body fingerprinted in a thread, rc:0/,
         'and it was computed in a thread');

    # nesting at the limit under an excluded member: removed
    my $deep = qq({"a":1,"request_id":) . ('[' x 127) . (']' x 127) . '}';
    post('/ex/deep128', $t->key('deep'), $deep);
    ($fp, $form) = logged('/ex/deep128');
    is($form, 'json', 'depth 128 under /request_id: canonicalized');
    is($fp, tool('/ex/deep128', '{"a":1}', @EX), 'depth 128 under /request_id: as if absent');

    # one deeper: refused as without the exclusion, hashed raw
    my $deeper = qq({"a":1,"request_id":) . ('[' x 128) . (']' x 128) . '}';
    post('/ex/deep129', $t->key('deep'), $deeper);
    ($fp, $form) = logged('/ex/deep129');
    is($form, 'raw-invalid-json', 'depth 129 under /request_id: still refused, hashed raw');
    is($fp, tool('/ex/deep129', $deeper, @EX), 'depth 129: the command agrees');

    # an invalid value under an excluded member is still invalid
    for my $bad ('{"a":1,"request_id":01}', qq({"a":1,"request_id":"\\ud800"}),
                 '{"a":1,"request_id":1,"request_id":2}', '{"a":1,"meta":{"sent_at":[1,]}}') {
        my $uri = '/ex/bad/' . (++$t->{n_bad});
        post($uri, $t->key('bad'), $bad);
        ($fp, $form) = logged($uri);
        is($form, 'raw-invalid-json', "invalid under an excluded member stays invalid: $bad");
    }

    # a huge string under an excluded member (spooled to a temp file,
    # canonicalized in place): as if absent, and the command agrees
    my $huge = 'x' x (3 * 1024 * 1024);
    $body = qq({"amount":5,"request_id":"$huge","meta":{"sent_at":"$huge","k":1}});
    $k = $t->key('huge');
    $a = post('/ex/huge', $k, $body);
    is($a->{status}, 201, '3 MiB strings under excluded members: executes');
    ($fp, $form) = logged('/ex/huge');
    is($form, 'json', 'huge strings: canonicalized');
    is($fp, tool('/ex/huge', '{"amount":5,"meta":{"k":1}}', @EX), 'huge strings: as if absent');
    is($fp, tool('/ex/huge', $body, @EX), 'huge strings: the command agrees');
    $b = post('/ex/huge', $k, '{"meta":{"k":1},"amount":5}');
    is($b->{headers}{'idempotent-replayed'}, 'true', 'huge strings: the small retry replays');
    is($t->effects(key => $k), 1, 'huge strings: one effect');
}

# ---- nginx -t
sub conf {
    my ($line) = @_;
    return <<"EOF";
server {
    listen 127.0.0.1:%%PORT%%;
    location / {
        idempotency on;
        idempotency_redis 127.0.0.1:1;
        $line
        proxy_pass http://127.0.0.1:1;
    }
}
EOF
}

my $many = join ' ', map { "/m$_" } 1 .. 65;
my $sixty_four = join ' ', map { "/m$_" } 1 .. 64;
my $deepest = '/a' x 128;

for my $c (
    [ 'two pointers', '/request_id /meta/sent_at' ],
    [ 'escapes', "/a~0b~1c '/with space' /caf\xc3\xa9" ],
    [ 'a leading zero is a member name', '/items/01' ],
    [ 'an index and "-"', '/items/0 /items/-' ],
    [ 'the empty member name', '/' ],
    [ 'a pointer below another', '/meta /meta/sent_at' ],
    [ 'off', 'off' ],
    [ '64 pointers', $sixty_four ],
    [ '128 tokens', $deepest ],
) {
    my ($what, $args) = @$c;
    my ($rc, $out) = $t->nginx_test_conf(conf("idempotency_fingerprint_exclude $args;"));
    is($rc, 0, "nginx -t accepts: $what") or diag($out);
}

for my $c (
    [ 'no leading slash', 'request_id', qr/must start with "\/"/ ],
    [ 'a URI fragment', '"#/a"', qr/must start with "\/"/ ],
    [ 'the empty pointer', '""', qr/whole body/ ],
    [ 'a bad escape ~2', '/a~2', qr/"~" must be followed by "0" or "1"/ ],
    [ 'a trailing ~', '/a~', qr/"~" must be followed by "0" or "1"/ ],
    [ 'listed twice', '/a /b /a', qr/listed twice/ ],
    [ 'more than 64', $many, qr/more than 64/ ],
    [ 'more than 128 tokens', "$deepest/a", qr/128/ ],
    [ 'not UTF-8', "/\xff", qr/UTF-8/ ],
    [ 'off with a pointer', 'off /a', qr/must start with "\/"/ ],
) {
    my ($what, $args, $why) = @$c;
    my ($rc, $out) = $t->nginx_test_conf(conf("idempotency_fingerprint_exclude $args;"));
    isnt($rc, 0, "nginx -t refuses: $what");
    like($out, qr/\[emerg\].*idempotency_fingerprint_exclude/, "$what: [emerg] names the directive")
        or diag($out);
    like($out, $why, "$what: says why");
}

{
    my ($rc, $out) = $t->nginx_test_conf(conf("idempotency_fingerprint_exclude /a; idempotency_fingerprint_exclude /b;"));
    isnt($rc, 0, 'nginx -t refuses the directive twice in one block');
    like($out, qr/"idempotency_fingerprint_exclude" directive is duplicate/, 'twice: is duplicate');
}

$t->check_logs;
done_testing();
