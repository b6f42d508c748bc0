#!/usr/bin/perl
# Configuration: `nginx -t` rejects bad values and names the directive,
# succeeds without Redis; `nginx -s reload` with live Redis connections
# leaves no alerts and requests keep working.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Idem::Test;

my $t = Idem::Test->new;

# A free port where nothing listens: Redis must not be needed by `nginx -t`.
my $dead = Idem::Test::free_port();

sub conf {
    my ($loc, $srv) = @_;
    $srv //= '';
    return <<"EOF";
server {
    listen 127.0.0.1:%%PORT%%;
    $srv
    location / {
        $loc
        proxy_pass http://127.0.0.1:1;
    }
}
EOF
}

my $R = "idempotency_redis 127.0.0.1:$dead;";

# ---- valid configurations, no Redis running
for my $c (
    [ 'minimal', "idempotency on; $R" ],
    [ 'every directive', join ' ', "idempotency on;",
        "idempotency_redis 127.0.0.1:$dead password=secret db=2 connect_timeout=200ms timeout=2s;",
        'idempotency_methods POST PUT PATCH DELETE;', 'idempotency_key_header X-Idem-Key;',
        'idempotency_required on;', 'idempotency_scope $http_authorization;',
        'idempotency_ttl 1h;', 'idempotency_lease 30s;', 'idempotency_conflict_status 422;',
        'idempotency_store_max 512k;', 'idempotency_store_headers Location Content-Type X-Request-Id;',
        'idempotency_store_failure open;', 'idempotency_fingerprint_headers X-Tenant Accept-Language;',
        'idempotency_redis_wait 1 1500ms;',
        'idempotency_fingerprint_exclude /request_id /meta/sent_at;' ],
    [ 'redis_wait off', "idempotency on; $R idempotency_redis_wait off;" ],
    [ 'redis_wait with the default timeout', "idempotency on; $R idempotency_redis_wait 2;" ],
    [ 'redis_wait: one setting in two locations counts once', "idempotency on; $R idempotency_redis_wait 1 600ms; location /b { idempotency_redis_wait 1 600ms; }" ],
    [ 'unix socket', 'idempotency on; idempotency_redis unix:/tmp/no-such-redis.sock;' ],
    [ 'hostname', "idempotency on; idempotency_redis localhost:$dead;" ],
    [ 'IPv6 literal', "idempotency on; idempotency_redis [::1]:$dead;" ],
    [ 'a cluster', "idempotency on; idempotency_redis_cluster 127.0.0.1:$dead [::1]:$dead user=u password=p timeout=2s;" ],
    # unique and lock on a cluster: their step waits for the replicas and
    # writes the audit file's entries too (docs/business-keys.md)
    [ 'unique with a cluster and idempotency_redis_wait', "idempotency on; idempotency_redis_cluster 127.0.0.1:$dead; idempotency_redis_wait 1 100ms; idempotency_unique \$http_a;" ],
    [ 'lock with a cluster and idempotency_redis_wait', "idempotency on; idempotency_redis_cluster 127.0.0.1:$dead; idempotency_redis_wait 1 100ms; idempotency_lock deploy:\$http_env;" ],
    [ 'unique and lock with a cluster and the audit file', "idempotency on; idempotency_redis_cluster 127.0.0.1:$dead; idempotency_audit file=/tmp/idem-audit-never-written; idempotency_unique \$http_a; idempotency_lock deploy:\$http_env;" ],
    [ 'redis at http level, on per location', "idempotency on;", '' , "$R" ],
    [ 'off without redis', 'idempotency off;' ],
    [ 'conflict status 409', "idempotency on; $R idempotency_conflict_status 409;" ],
    [ 'complete_beside off', "idempotency on; $R idempotency_complete_beside off;" ],
) {
    my ($what, $loc, $srv, $http) = @$c;
    my ($rc, $out) = $t->nginx_test_conf(($http // '') . "\n" . conf($loc, $srv));
    is($rc, 0, "nginx -t accepts: $what (no Redis running)") or diag($out);
    like($out, qr/test is successful/, "nginx -t: $what: test is successful");
}

# ---- invalid values: nginx -t fails and names the directive
for my $c (
    [ 'negative ttl',            'idempotency_ttl',             "idempotency on; $R idempotency_ttl -1s;" ],
    [ 'zero ttl',                'idempotency_ttl',             "idempotency on; $R idempotency_ttl 0;" ],
    [ 'ttl garbage',             'idempotency_ttl',             "idempotency on; $R idempotency_ttl soon;" ],
    [ 'zero lease',              'idempotency_lease',           "idempotency on; $R idempotency_lease 0s;" ],
    [ 'negative lease',          'idempotency_lease',           "idempotency on; $R idempotency_lease -5s;" ],
    [ 'method GET',              'idempotency_methods',         "idempotency on; $R idempotency_methods POST GET;" ],
    [ 'method FOO',              'idempotency_methods',         "idempotency on; $R idempotency_methods FOO;" ],
    [ 'lowercase method',        'idempotency_methods',         "idempotency on; $R idempotency_methods post;" ],
    [ 'redis bad port',          'idempotency_redis',           'idempotency on; idempotency_redis nosuchport:abc;' ],
    [ 'redis empty unix path',   'idempotency_redis',           'idempotency on; idempotency_redis unix:;' ],
    [ 'redis port out of range', 'idempotency_redis',           'idempotency on; idempotency_redis 127.0.0.1:70000;' ],
    [ 'redis unknown parameter', 'idempotency_redis',           "idempotency on; idempotency_redis 127.0.0.1:$dead foo=bar;" ],
    [ 'redis bad db',            'idempotency_redis',           "idempotency on; idempotency_redis 127.0.0.1:$dead db=x;" ],
    [ 'redis bad timeout',       'idempotency_redis',           "idempotency on; idempotency_redis 127.0.0.1:$dead timeout=never;" ],
    [ 'redis unresolvable host', 'idempotency_redis',           'idempotency on; idempotency_redis no-such-host.invalid:6379;' ],
    [ 'conflict status 500',     'idempotency_conflict_status', "idempotency on; $R idempotency_conflict_status 500;" ],
    [ 'conflict status 410',     'idempotency_conflict_status', "idempotency on; $R idempotency_conflict_status 410;" ],
    [ 'store_failure maybe',     'idempotency_store_failure',   "idempotency on; $R idempotency_store_failure maybe;" ],
    [ 'complete_beside maybe',   'idempotency_complete_beside', "idempotency on; $R idempotency_complete_beside maybe;" ],
    [ 'complete_beside no value', 'idempotency_complete_beside', "idempotency on; $R idempotency_complete_beside;" ],
    [ 'store_max garbage',       'idempotency_store_max',       "idempotency on; $R idempotency_store_max lots;" ],
    [ 'on without redis',        'idempotency_redis',           'idempotency on;' ],
    [ 'idempotency maybe',       'idempotency',                 "idempotency maybe; $R" ],
    [ 'thread pool size garbage', 'idempotency_thread_pool',    "idempotency on; $R idempotency_thread_pool default min_size=big;" ],
    [ 'thread pool parameter',   'idempotency_thread_pool',     "idempotency on; $R idempotency_thread_pool default threads=4;" ],
    [ 'thread pool off + size',  'idempotency_thread_pool',     "idempotency on; $R idempotency_thread_pool off min_size=1k;" ],
    [ 'thread pool twice',       'idempotency_thread_pool',     "idempotency on; $R idempotency_thread_pool default; idempotency_thread_pool off;" ],
    [ 'thread pool no value',    'idempotency_thread_pool',     "idempotency on; $R idempotency_thread_pool;" ],
    [ 'redis_wait 0 replicas',   'idempotency_redis_wait',      "idempotency on; $R idempotency_redis_wait 0;" ],
    [ 'redis_wait garbage',      'idempotency_redis_wait',      "idempotency on; $R idempotency_redis_wait many;" ],
    [ 'redis_wait 65 replicas',  'idempotency_redis_wait',      "idempotency on; $R idempotency_redis_wait 65;" ],
    [ 'redis_wait zero timeout', 'idempotency_redis_wait',      "idempotency on; $R idempotency_redis_wait 1 0;" ],
    [ 'redis_wait bad timeout',  'idempotency_redis_wait',      "idempotency on; $R idempotency_redis_wait 1 soon;" ],
    [ 'redis_wait timeout not below the redis timeout', 'idempotency_redis_wait',
                                                                "idempotency on; $R idempotency_redis_wait 1 1s;" ],
    [ 'redis_wait off + timeout', 'idempotency_redis_wait',     "idempotency on; $R idempotency_redis_wait off 100ms;" ],
    [ 'redis_wait twice',        'idempotency_redis_wait',      "idempotency on; $R idempotency_redis_wait 1; idempotency_redis_wait 2;" ],
    [ 'redis_wait three values', 'idempotency_redis_wait',      "idempotency on; $R idempotency_redis_wait 1 100ms 3;" ],
    [ 'redis_wait settings adding up to the redis timeout', 'idempotency_redis_wait',
      "idempotency on; $R idempotency_redis_wait 1 600ms; location /b { idempotency_redis_wait 2 600ms; }" ],
    [ 'exclude without /',       'idempotency_fingerprint_exclude', "idempotency on; $R idempotency_fingerprint_exclude request_id;" ],
    [ 'exclude empty pointer',   'idempotency_fingerprint_exclude', "idempotency on; $R idempotency_fingerprint_exclude '';" ],
    [ 'exclude bad escape',      'idempotency_fingerprint_exclude', "idempotency on; $R idempotency_fingerprint_exclude /a~2;" ],
    [ 'exclude trailing ~',      'idempotency_fingerprint_exclude', "idempotency on; $R idempotency_fingerprint_exclude /a~;" ],
    [ 'exclude listed twice',    'idempotency_fingerprint_exclude', "idempotency on; $R idempotency_fingerprint_exclude /a /a;" ],
) {
    my ($what, $dir, $loc) = @$c;
    my ($rc, $out) = $t->nginx_test_conf(conf($loc));
    isnt($rc, 0, "nginx -t rejects: $what");
    like($out, qr/\Q$dir\E/, "nginx -t: $what: the message names $dir") or diag($out);
    like($out, qr/\[emerg\]/, "nginx -t: $what: reported as [emerg]");
}

# ---- idempotency_json_var (http context): the name, the pointer, duplicates
{
    my ($rc, $out) = $t->nginx_test_conf('idempotency_json_var $ev /source_event_id; idempotency_json_var $e2 /a~1b/0;' . conf("idempotency on; $R"));
    is($rc, 0, 'nginx -t accepts idempotency_json_var') or diag($out);

    for my $c (
        [ 'name without $', qr/"idempotency_json_var".*needs a variable name that starts with "\$"/,
          'idempotency_json_var ev /a;' ],
        [ 'just $', qr/"idempotency_json_var".*needs a variable name/, 'idempotency_json_var $ /a;' ],
        [ 'pointer without /', qr/"idempotency_json_var": "a" is not a JSON pointer/,
          'idempotency_json_var $ev a;' ],
        [ 'empty pointer', qr/"idempotency_json_var": "" is not a JSON pointer/,
          "idempotency_json_var \$ev '';" ],
        [ 'bad escape', qr/"idempotency_json_var": "\/a~2" is not a JSON pointer/,
          'idempotency_json_var $ev /a~2;' ],
        [ 'duplicate', qr/"idempotency_json_var": duplicate variable "\$EV"/,
          'idempotency_json_var $ev /a; idempotency_json_var $EV /b;' ],
        [ 'a built-in variable', qr/duplicate "uri" variable/, 'idempotency_json_var $uri /a;' ],
        [ 'one argument', qr/invalid number of arguments in "idempotency_json_var"/,
          'idempotency_json_var $ev;' ],
    ) {
        my ($what, $re, $http) = @$c;
        ($rc, $out) = $t->nginx_test_conf($http . conf("idempotency on; $R"));
        isnt($rc, 0, "nginx -t rejects idempotency_json_var: $what");
        like($out, qr/\[emerg\].*$re/, "nginx -t: json_var $what: [emerg] names the directive and the fault")
            or diag($out);
    }

    ($rc, $out) = $t->nginx_test_conf(conf("idempotency on; $R idempotency_json_var \$ev /a;"));
    isnt($rc, 0, 'nginx -t rejects idempotency_json_var in a location');
    like($out, qr/\[emerg\].*"idempotency_json_var" directive is not allowed here/,
         'nginx -t: json_var in a location: [emerg] names the directive') or diag($out);
}

# ---- idempotency_confirm: key files are read by nginx -t, each fault named
{
    my $p = $t->prefix;
    system("openssl genpkey -algorithm ed25519 -out $p/c-ed.key 2>/dev/null") == 0
        && system("openssl pkey -in $p/c-ed.key -pubout -out $p/c-ed.pub 2>/dev/null") == 0
        && system("openssl genpkey -algorithm x25519 -out $p/c-x.key 2>/dev/null") == 0
        && system("openssl pkey -in $p/c-x.key -pubout -out $p/c-x.pub 2>/dev/null") == 0
        or BAIL_OUT('openssl genpkey');
    my $spew = sub { open my $f, '>', "$p/$_[0]" or die; print $f $_[1]; close $f };
    $spew->('c-hs', ('s' x 40) . "\n");
    $spew->('c-short', ('s' x 31) . "\n");
    $spew->('c-empty', '');
    mkdir "$p/c-dir";
    my $ok = "idempotency on; $R idempotency_confirm on;";

    for my $c (
        [ 'Ed25519 and HS256 keys with kids', "$ok idempotency_confirm_key ed25519 $p/c-ed.pub kid=a; idempotency_confirm_key hs256 $p/c-hs kid=b; idempotency_confirm_show /amount /to; idempotency_confirm_ttl 10m;" ],
        [ 'a kid-less key', "$ok idempotency_confirm_key hs256 $p/c-hs;" ],
        [ 'a variable', "idempotency on; $R idempotency_confirm \$http_x_risk; idempotency_confirm_key hs256 $p/c-hs;" ],
        [ 'off without keys', "idempotency on; $R idempotency_confirm off;" ],
    ) {
        my ($rc, $out) = $t->nginx_test_conf(conf($c->[1]));
        is($rc, 0, "nginx -t accepts idempotency_confirm: $c->[0]") or diag($out);
    }

    for my $c (
        [ 'missing key file', qr/"idempotency_confirm_key": ".*c-none" cannot be read: No such file/,
          "$ok idempotency_confirm_key hs256 $p/c-none;" ],
        [ 'unreadable key file (a directory)', qr/"idempotency_confirm_key": ".*c-dir" cannot be read/,
          "$ok idempotency_confirm_key ed25519 $p/c-dir;" ],
        [ 'empty key file', qr/"idempotency_confirm_key": ".*c-empty" is empty/,
          "$ok idempotency_confirm_key hs256 $p/c-empty;" ],
        [ 'HS256 secret of 31 bytes', qr/"idempotency_confirm_key": .*holds 31 bytes/,
          "$ok idempotency_confirm_key hs256 $p/c-short;" ],
        [ 'a PEM file as HS256 secret', qr/"idempotency_confirm_key": .*is a PEM file, not an HS256 secret/,
          "$ok idempotency_confirm_key hs256 $p/c-ed.pub;" ],
        [ 'an HS256 secret as Ed25519 key', qr/"idempotency_confirm_key": .*is not a PEM public key/,
          "$ok idempotency_confirm_key ed25519 $p/c-hs;" ],
        [ 'a private key as Ed25519 public key', qr/"idempotency_confirm_key": .*holds a private key/,
          "$ok idempotency_confirm_key ed25519 $p/c-ed.key;" ],
        [ 'an X25519 key', qr/"idempotency_confirm_key": .*holds a X25519 key, not Ed25519/,
          "$ok idempotency_confirm_key ed25519 $p/c-x.pub;" ],
        [ 'unknown key type', qr/"idempotency_confirm_key": unknown type "rs256"/,
          "$ok idempotency_confirm_key rs256 $p/c-hs;" ],
        [ 'bad parameter', qr/"idempotency_confirm_key": invalid parameter "id=a"/,
          "$ok idempotency_confirm_key hs256 $p/c-hs id=a;" ],
        [ 'bad kid', qr/"idempotency_confirm_key": kid must be/,
          "$ok idempotency_confirm_key hs256 $p/c-hs kid=a\"b;" ],
        [ 'duplicate kid', qr/"idempotency_confirm_key": duplicate "kid=a"/,
          "$ok idempotency_confirm_key hs256 $p/c-hs kid=a; idempotency_confirm_key ed25519 $p/c-ed.pub kid=a;" ],
        [ 'confirm without a key', qr/"idempotency_confirm" needs at least one "idempotency_confirm_key"/,
          $ok ],
        [ 'show not a pointer', qr/"idempotency_confirm_show": "amount" is not a JSON pointer/,
          "$ok idempotency_confirm_key hs256 $p/c-hs; idempotency_confirm_show amount;" ],
        [ 'show: a bad escape', qr/"idempotency_confirm_show": "\/a~2" is not a JSON pointer.*~/,
          "$ok idempotency_confirm_key hs256 $p/c-hs; idempotency_confirm_show /amount /a~2;" ],
        [ 'show: the whole document', qr/"idempotency_confirm_show": "" is not a JSON pointer/,
          "$ok idempotency_confirm_key hs256 $p/c-hs; idempotency_confirm_show '';" ],
        [ 'ttl zero', qr/idempotency_confirm_ttl/,
          "$ok idempotency_confirm_key hs256 $p/c-hs; idempotency_confirm_ttl 0;" ],
        [ 'confirm twice', qr/"idempotency_confirm" directive is duplicate/,
          "$ok idempotency_confirm on; idempotency_confirm_key hs256 $p/c-hs;" ],
    ) {
        my ($what, $re, $loc) = @$c;
        my ($rc, $out) = $t->nginx_test_conf(conf($loc));
        isnt($rc, 0, "nginx -t rejects idempotency_confirm: $what");
        like($out, qr/\[emerg\].*$re/, "nginx -t: $what: [emerg] names the directive and the fault")
            or diag($out);
    }
}

# ---- idempotency_unique and idempotency_lock: a value with a variable (a
# constant identity would make every request of the location one), or off
{
    my $ok = "idempotency on; $R";
    for my $c (
        [ 'unique and lock', "$ok idempotency_unique tickets:\$http_x_event; idempotency_lock deploy:\$http_x_env;" ],
        [ 'a constant lock', "$ok idempotency_lock deploy:production;" ],
        [ 'off', "$ok idempotency_unique off; idempotency_lock off;" ],
    ) {
        my ($rc, $out) = $t->nginx_test_conf(conf($c->[1]));
        is($rc, 0, "nginx -t accepts: $c->[0]") or diag($out);
    }
    for my $c (
        [ 'unique empty', qr/"idempotency_unique" directive needs a value/, "$ok idempotency_unique '';" ],
        [ 'lock empty', qr/"idempotency_lock" directive needs a value/, "$ok idempotency_lock \"\";" ],
        [ 'unique constant', qr/"idempotency_unique" directive has no variable/, "$ok idempotency_unique tickets;" ],
        [ 'unique twice', qr/"idempotency_unique" directive is duplicate/,
          "$ok idempotency_unique \$http_a; idempotency_unique \$http_b;" ],
        [ 'lock twice', qr/"idempotency_lock" directive is duplicate/,
          "$ok idempotency_lock a; idempotency_lock b;" ],
        # a second argument is an option since issue 35 (shared=, optional)
        [ 'unique with two values', qr/"idempotency_unique": invalid parameter "\$http_b", expected shared=NAME/,
          "$ok idempotency_unique \$http_a \$http_b;" ],
        [ 'unique with three values', qr/invalid number of arguments in "idempotency_unique" directive/,
          "$ok idempotency_unique \$http_a shared=x \$http_b;" ],
        [ 'lock in a bad variable', qr/invalid variable name|unknown ".*" variable/,
          "$ok idempotency_lock \${;" ],
    ) {
        my ($what, $re, $loc) = @$c;
        my ($rc, $out) = $t->nginx_test_conf(conf($loc));
        isnt($rc, 0, "nginx -t rejects: $what");
        like($out, qr/\[emerg\].*$re/, "nginx -t: $what: [emerg] names the directive and the fault")
            or diag($out);
    }
}

# ---- guarded locations (idempotency_confirm, _unique, _lock; issue 35):
# shared=NAME and optional, idempotency_json_types; an explicit
# idempotency_required off beside a guard is refused, store_failure open
# beside one is a warning
{
    my $ok = "idempotency on; $R";
    my $hs = $t->prefix . '/guard-hs.key';
    open my $hf, '>', $hs or die; print $hf 'k' x 32; close $hf;
    for my $c (
        [ 'unique shared=NAME', "$ok idempotency_unique \$http_x_event shared=ledger.v1:a/b-c_d;" ],
        [ 'lock optional', "$ok idempotency_lock deploy:\$http_x_env optional;" ],
        [ 'json_types', "$ok idempotency_unique \$http_x_event; idempotency_json_types text/json application/x-json;" ],
        [ 'required on beside a guard', "$ok idempotency_required on; idempotency_lock deploy;" ],
        [ 'required off where no guard is', "$ok idempotency_required off; location /g { idempotency_lock deploy; idempotency_required on; }" ],
        [ 'required off above, a guard turned off below', "$ok idempotency_required off; location /g { idempotency_confirm off; }" ],
    ) {
        my ($rc, $out) = $t->nginx_test_conf(conf($c->[1]));
        is($rc, 0, "nginx -t accepts: $c->[0]") or diag($out);
    }
    for my $c (
        [ 'required off beside confirm', qr/"idempotency_required off" cannot be used where "idempotency_confirm" is in effect: a guarded location refuses a request without a key/,
          "$ok idempotency_required off; idempotency_confirm on; idempotency_confirm_key hs256 $hs;" ],
        [ 'required off beside unique', qr/"idempotency_required off" cannot be used where "idempotency_unique" is in effect/,
          "$ok idempotency_required off; idempotency_unique \$http_x_event;" ],
        [ 'required off inherited by a lock', qr/"idempotency_required off" cannot be used where "idempotency_lock" is in effect/,
          "$ok idempotency_required off; location /g { idempotency_lock deploy; }" ],
        [ 'unique optional', qr/"idempotency_unique": invalid parameter "optional", expected shared=NAME/,
          "$ok idempotency_unique \$http_x_event optional;" ],
        [ 'lock shared=', qr/"idempotency_lock": invalid parameter "shared=a", expected optional/,
          "$ok idempotency_lock deploy shared=a;" ],
        [ 'shared= without a name', qr/"idempotency_unique": invalid parameter "shared=", expected shared=NAME/,
          "$ok idempotency_unique \$http_x_event shared=;" ],
        [ 'shared= with a space', qr/"idempotency_unique": "shared=a b": the name is 1 to 64 characters/,
          "$ok idempotency_unique \$http_x_event 'shared=a b';" ],
        [ 'shared= too long', qr/"idempotency_unique": "shared=a{65}": the name is 1 to 64 characters/,
          "$ok idempotency_unique \$http_x_event shared=" . ('a' x 65) . ';' ],
        [ 'off with an option', qr/"idempotency_lock" directive takes no parameter after "off"/,
          "$ok idempotency_lock off optional;" ],
        [ 'json_types without a slash', qr/"idempotency_json_types": "json" is not a media type/,
          "$ok idempotency_json_types json;" ],
        [ 'json_types with a parameter', qr/"idempotency_json_types": "text\/json;charset=utf-8" is not a media type/,
          "$ok idempotency_json_types 'text/json;charset=utf-8';" ],
        [ 'json_types with a wildcard', qr/"idempotency_json_types": "text\/\*" is not a media type/,
          "$ok idempotency_json_types text/*;" ],
        [ 'json_types twice', qr/"idempotency_json_types" directive is duplicate/,
          "$ok idempotency_json_types text/json; idempotency_json_types text/x-json;" ],
    ) {
        my ($what, $re, $loc) = @$c;
        my ($rc, $out) = $t->nginx_test_conf(conf($loc));
        isnt($rc, 0, "nginx -t rejects: $what");
        like($out, qr/\[emerg\].*$re/, "nginx -t: $what: [emerg] names the directive and the fault")
            or diag($out);
    }
    my ($rc, $out) = $t->nginx_test_conf(conf("$ok idempotency_store_failure open; idempotency_lock deploy;"));
    is($rc, 0, 'nginx -t accepts store_failure open beside a guard');
    like($out, qr/\[warn\].*"idempotency_store_failure open" does not apply where "idempotency_lock" is in effect: a guarded request is answered 503/,
         '... and warns that it does not apply there') or diag($out);
    ($rc, $out) = $t->nginx_test_conf(conf("$ok idempotency_store_failure open;"));
    unlike($out, qr/\[warn\].*idempotency_store_failure/, 'no warning where no guard is') or diag($out);
}

# ---- idempotency_unique: a location's identities are its own, named by the
# server's first server_name and the location's name (the same on every host
# of a cluster). Two servers whose names are the same (or absent) and a
# location of the same name would share them: nginx -t refuses that.
{
    my $p2 = Idem::Test::free_port();
    my $srv = sub {
        my ($name, $port, $loc) = @_;
        return "server { listen 127.0.0.1:$port; @{[ defined $name ? \"server_name $name;\" : '' ]} $R "
             . "location /events { idempotency on; $loc proxy_pass http://127.0.0.1:1; } }";
    };
    my $U = 'idempotency_unique ev:$http_x_event;';
    for my $c (
        [ 'two servers without a server_name, one location name', $srv->(undef, '%%PORT%%', $U) . $srv->(undef, $p2, $U),
          qr/\[emerg\].*"idempotency_unique" of location "\/events" shares its identities with another location of the same name \(in a server with the same server_name "".*server_name.*shared=NAME/ ],
        [ 'two servers named "_", one location name', $srv->('_', '%%PORT%%', $U) . $srv->('_', $p2, $U),
          qr/\[emerg\].*"idempotency_unique" of location "\/events" shares its identities.*server_name "_"/ ],
        [ 'same first server_name, other names apart', $srv->('a.example b.example', '%%PORT%%', $U) . $srv->('a.example c.example', $p2, $U),
          qr/\[emerg\].*"idempotency_unique" of location "\/events" shares its identities/ ],
        [ 'an exact and a prefix location of one name', "server { listen 127.0.0.1:%%PORT%%; server_name a.example; $R "
          . "location = /events { idempotency on; $U proxy_pass http://127.0.0.1:1; } "
          . "location /events { idempotency on; $U proxy_pass http://127.0.0.1:1; } }",
          qr/\[emerg\].*"idempotency_unique" of location "\/events" shares its identities.*server_name "a.example"/ ],
        [ 'two servers with distinct server_names', $srv->('a.example', '%%PORT%%', $U) . $srv->('b.example', $p2, $U) ],
        [ 'two unnamed servers, the identity shared= by name', $srv->(undef, '%%PORT%%', "idempotency_unique ev:\$http_x_event shared=ev;")
          . $srv->(undef, $p2, "idempotency_unique ev:\$http_x_event shared=ev;") ],
        [ 'two unnamed servers, one with unique', $srv->(undef, '%%PORT%%', $U) . $srv->(undef, $p2, '') ],
        [ 'one location with if and limit_except inside', $srv->(undef, '%%PORT%%', "$U if (\$http_x_a) { set \$x 1; } limit_except GET POST { deny all; }") ],
    ) {
        my ($what, $conf, $want) = @$c;
        my ($rc, $out) = $t->nginx_test_conf($conf);
        if ($want) {
            isnt($rc, 0, "nginx -t refuses: $what");
            like($out, $want, '... naming the location and the way out') or diag($out);
        } else {
            is($rc, 0, "nginx -t accepts: $what") or diag($out);
        }
    }
}

# ---- idempotency_audit: the key file is read by nginx -t, each fault named;
# the identity is never the scope nor a credential; a reference header is
# never one that carries secrets; one stream, one key
{
    my $p = $t->prefix;
    my $spew = sub { open my $f, '>', "$p/$_[0]" or die; print $f $_[1]; close $f };
    $spew->('a-key', ('a' x 32) . "\n");
    $spew->('a-key2', ('b' x 40) . "\n");
    $spew->('a-short', 'a' x 31);
    $spew->('a-empty', '');
    mkdir "$p/a-dir";
    my $ok = "idempotency on; $R idempotency_scope \$http_authorization; idempotency_audit on;";

    for my $c (
        [ 'the defaults', $ok ],
        [ 'every directive', "$ok idempotency_audit_identity \$remote_user; idempotency_audit_ref_header X-Provider-Ref; idempotency_audit_key $p/a-key; idempotency_audit_stream audit:payments anchor=100;" ],
        [ 'a stream per location', "$ok idempotency_audit_stream a:1; location /b { idempotency_audit_stream a:2; idempotency_audit_key $p/a-key2; }" ],
        [ 'a key at server level', "$ok location /b { idempotency_audit on; }", "idempotency_audit_key $p/a-key;" ],
        [ 'off', "idempotency on; $R idempotency_audit off;" ],
    ) {
        my ($rc, $out) = $t->nginx_test_conf(conf($c->[1], $c->[2]));
        is($rc, 0, "nginx -t accepts idempotency_audit: $c->[0]") or diag($out);
    }

    for my $c (
        [ 'missing key file', qr/"idempotency_audit_key": ".*a-none" cannot be read: No such file/,
          "$ok idempotency_audit_key $p/a-none;" ],
        [ 'unreadable key file (a directory)', qr/"idempotency_audit_key": ".*a-dir" cannot be read/,
          "$ok idempotency_audit_key $p/a-dir;" ],
        [ 'empty key file', qr/"idempotency_audit_key": ".*a-empty" is empty/,
          "$ok idempotency_audit_key $p/a-empty;" ],
        [ 'key of 31 bytes', qr/"idempotency_audit_key": .*holds 31 bytes.* at least 32/,
          "$ok idempotency_audit_key $p/a-short;" ],
        [ 'key twice', qr/"idempotency_audit_key" directive is duplicate/,
          "$ok idempotency_audit_key $p/a-key; idempotency_audit_key $p/a-key;" ],
        [ 'one stream, two keys', qr/audit stream "s" is written with two different "idempotency_audit_key"/,
          "$ok idempotency_audit_stream s; idempotency_audit_key $p/a-key; location /b { idempotency_audit_key $p/a-key2; }" ],
        [ 'one stream with and without a key', qr/audit stream "s" is written with two different/,
          "$ok idempotency_audit_stream s; location /b { idempotency_audit_key $p/a-key; }" ],
        [ 'identity is the scope', qr/"idempotency_audit_identity" is the scope/,
          "$ok idempotency_audit_identity \$http_authorization;" ],
        [ 'identity holds a credential', qr/"idempotency_audit_identity" .*holds \$http_authorization/,
          "idempotency on; $R idempotency_scope \$remote_user; idempotency_audit on; idempotency_audit_identity user:\$http_authorization;" ],
        [ 'identity holds a cookie', qr/"idempotency_audit_identity" .*holds \$cookie_/,
          "$ok idempotency_audit_identity \$cookie_session;" ],
        [ 'ref header Set-Cookie', qr/"idempotency_audit_ref_header": "Set-Cookie" carries secrets/,
          "$ok idempotency_audit_ref_header Set-Cookie;" ],
        [ 'ref header Authorization', qr/"idempotency_audit_ref_header": "authorization" carries secrets/,
          "$ok idempotency_audit_ref_header authorization;" ],
        [ 'stream name with a space', qr/"idempotency_audit_stream": "a b" is not a stream name/,
          "$ok idempotency_audit_stream 'a b';" ],
        [ 'stream anchor=0', qr/"idempotency_audit_stream": invalid parameter "anchor=0"/,
          "$ok idempotency_audit_stream s anchor=0;" ],
        [ 'stream bad parameter', qr/"idempotency_audit_stream": invalid parameter "every=5"/,
          "$ok idempotency_audit_stream s every=5;" ],
        [ 'audit maybe', qr/idempotency_audit/, "$ok idempotency_audit maybe;" ],
        [ 'audit with a cluster', qr/"idempotency_audit" cannot be used with "idempotency_redis_cluster"/,
          "idempotency on; idempotency_redis_cluster 127.0.0.1:$dead; idempotency_audit on;" ],
        # the stream stays refused on a cluster beside unique and lock too
        [ 'audit stream with a cluster and unique', qr/"idempotency_audit" cannot be used with "idempotency_redis_cluster"/,
          "idempotency on; idempotency_redis_cluster 127.0.0.1:$dead; idempotency_audit on; idempotency_unique \$http_a;" ],
        [ 'audit stream and file with a cluster and lock', qr/"idempotency_audit" cannot be used with "idempotency_redis_cluster"/,
          "idempotency on; idempotency_redis_cluster 127.0.0.1:$dead; idempotency_audit on file=/tmp/idem-audit-never-written; idempotency_lock deploy:\$http_env;" ],
    ) {
        my ($what, $re, $loc) = @$c;
        my ($rc, $out) = $t->nginx_test_conf(conf($loc));
        isnt($rc, 0, "nginx -t rejects idempotency_audit: $what");
        like($out, qr/\[emerg\].*$re/, "nginx -t: $what: [emerg] names the directive and the fault")
            or diag($out);
    }
}

# ---- a content handler of another module after the module's own: nginx
# would run that one and never say so
for my $c (
    [ 'status then proxy_pass', "idempotency_status; $R proxy_pass http://127.0.0.1:1;" ],
    [ 'admin then stub_status', "idempotency_admin on; $R stub_status;" ],
    [ 'approve then proxy_pass', "idempotency_approve; $R proxy_pass http://127.0.0.1:1;" ],
    [ 'metrics then proxy_pass', 'idempotency_metrics; proxy_pass http://127.0.0.1:1;',
      'idempotency_metrics_zone idem_m 1m;' ],
) {
    my ($what, $loc, $http) = @$c;
    my ($rc, $out) = $t->nginx_test_conf(($http // '') . <<"EOF");
server {
    listen 127.0.0.1:%%PORT%%;
    location /ops { $loc }
}
EOF
    isnt($rc, 0, "nginx -t rejects: $what");
    like($out, qr/\[emerg\].*location "\/ops" has "idempotency_status", "idempotency_admin", "idempotency_approve" or "idempotency_metrics" and another content handler/,
         "nginx -t: $what: [emerg] names the location and the directives") or diag($out);
}
for my $c (
    [ 'approve without idempotency_redis', 'idempotency_approve;',
      qr/"idempotency_status\/admin\/approve" needs "idempotency_redis"/ ],
    [ 'approve with an argument', "idempotency_approve on; $R",
      qr/invalid number of arguments in "idempotency_approve"/ ],
    [ 'approve in server{}', '',
      qr/"idempotency_approve" directive is not allowed here/, "idempotency_approve; $R" ],
) {
    my ($what, $loc, $re, $srv) = @$c;
    $srv //= '';
    my ($rc, $out) = $t->nginx_test_conf(<<"EOF");
server {
    listen 127.0.0.1:%%PORT%%;
    $srv
    location /ops { $loc }
}
EOF
    isnt($rc, 0, "nginx -t rejects: $what");
    like($out, qr/\[emerg\].*$re/, "nginx -t: $what: [emerg] names the directive") or diag($out);
}
for my $c (
    [ 'status alone', "idempotency_status; $R" ],
    [ 'approve alone', "idempotency_approve; $R" ],
    [ 'proxy_pass in the location, status in a nested one',
      "$R proxy_pass http://127.0.0.1:1; location /ops/s { idempotency_status; }" ],
) {
    my ($what, $loc) = @$c;
    my ($rc, $out) = $t->nginx_test_conf(<<"EOF");
server {
    listen 127.0.0.1:%%PORT%%;
    location /ops { $loc }
}
EOF
    is($rc, 0, "nginx -t accepts: $what") or diag($out);
}

# ---- reload with live Redis connections
$t->start_redis;
$t->start_upstream;
my $conf = <<'EOF';
server {
    listen 127.0.0.1:%%PORT%%;
    location / {
        idempotency on;
        idempotency_redis %%REDIS%%;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF
$t->start_nginx($conf, workers => 2);

my @keys;
for (1 .. 6) {
    my $k = $t->key('reload');
    push @keys, $k;
    my $r = $t->http(POST => '/r', key => $k, json => { k => $k });
    is($r->{status}, 201, "before reload: $_ executes");
}
my $clients = $t->redis('CLIENT', 'LIST');
# every client but this one (whose last command is CLIENT LIST) is a worker's
my $nclients = () = ($clients // '') =~ /^id=(?!.*\bcmd=client\|list\b).*$/mg;
ok($nclients >= 2, "both workers hold Redis connections ($nclients, not counting this one)")
    or diag($clients);

my @old = $t->worker_pids;
ok($t->reload_nginx, 'reload: new workers up, old workers gone');
my @new = $t->worker_pids;
is(scalar(@new), 2, 'two workers after reload');
ok(!grep({ my $o = $_; grep { $_ == $o } @new } @old), 'all workers replaced');

for my $k (@keys) {
    my $r = $t->http(POST => '/r', key => $k, json => { k => $k });
    is($r->{headers}{'idempotent-replayed'}, 'true', 'after reload: earlier key replays');
}
{
    my $k = $t->key('reload');
    my $a = $t->http(POST => '/r', key => $k, json => {});
    is($a->{status}, 201, 'after reload: new key executes');
    my $b = $t->http(POST => '/r', key => $k, json => {});
    is($b->{headers}{'idempotent-replayed'}, 'true', 'after reload: new key replays');
}
is($t->effects, 7, 'reload: 7 effects (6 before, 1 after), no re-execution');

# reload during a slow request: the old worker finishes and records it
{
    my $k = $t->key('reload-slow');
    my $res = $t->parallel(2, sub {
        my $i = shift;
        if ($i == 0) {
            return $t->http(POST => '/slow', key => $k, json => {}, headers => [ 'X-Delay' => 1.5 ]);
        }
        sleep 0.5;
        return { reloaded => $t->reload_nginx ? 1 : 0 };
    });
    is($res->[0] && $res->[0]{status}, 201, 'slow request across a reload completes');
    my $r = $t->http(POST => '/slow', key => $k, json => {});
    is($r->{headers}{'idempotent-replayed'}, 'true', 'slow request across a reload was recorded');
    is($t->effects(key => $k), 1, 'slow request across a reload: one effect');
}

# reload to a changed configuration (new ttl) and again
ok($t->reload_nginx($conf =~ s/idempotency on;/idempotency on; idempotency_ttl 1h;/r), 'reload with a changed ttl');
{
    my $k = $t->key('reload-ttl');
    $t->http(POST => '/ttl', key => $k, json => {});
    my @ttls = map { $t->redis('TTL', $_) } $t->redis_keys;
    ok(scalar(grep { $_ > 0 && $_ <= 3600 } @ttls) >= 1, 'new ttl in effect after reload') or diag("@ttls");
    my $b = $t->http(POST => '/ttl', key => $k, json => {});
    is($b->{headers}{'idempotent-replayed'}, 'true', 'replay after second reload');
    is($t->effects(key => $k), 1, 'second reload: one effect');
}
ok($t->reload_nginx, 'third reload');
is($t->http(POST => '/last', key => $t->key('last'), json => {})->{status}, 201, 'requests work after three reloads');

$t->check_logs;
done_testing;
