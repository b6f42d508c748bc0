#!/usr/bin/perl
# idempotency_metrics: after a known sequence of requests over two workers
# the counters match the test's own counts exactly, the scrape parses as
# Prometheus text format 0.0.4 (a strict parser below), and Redis errors
# and connections show.  Plus nginx -t errors of the three directives.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Idem::Test;

my $t = Idem::Test->new;
# the stack's nginx.conf: $http at http level, then [path, label] locations
sub metrics_conf {
    my ($http, @locs) = @_;
    my $locs = join '', map {
        my ($path, $label) = @$_;
        "    location $path {\n        idempotency on;\n"
        . ($label ? "        idempotency_metrics_label $label;\n" : '')
        . "        proxy_pass http://%%UPSTREAM%%;\n    }\n";
    } @locs;
    return <<"EOF";
idempotency_metrics_zone idem 64k;
$http
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%% timeout=1s;
    proxy_ignore_client_abort on;
$locs    location = /metrics {
        idempotency_metrics;
    }
}
EOF
}

$t->start_stack(metrics_conf('', [ '/orders/' => 'orders' ], [ '/other/' ]), workers => 2);

# ---- a strict reader of the text format: every line is a HELP, a TYPE or
# a sample of the family the last TYPE named; returns {series => value}
sub parse_prom {
    my ($text) = @_;
    my (%v, %type, $family, @errors);
    my $name = qr/[a-zA-Z_:][a-zA-Z0-9_:]*/;
    my $num  = qr/[-+]?(?:[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|\+Inf|-Inf|NaN)/;
    push @errors, 'no final newline' unless $text =~ /\n\z/;
    for my $l (split /\n/, $text) {
        if ($l =~ /^# HELP ($name) \S.*$/) {
            $family = $1;
        } elsif ($l =~ /^# TYPE ($name) (counter|gauge|histogram|summary|untyped)$/) {
            push @errors, "TYPE $1 twice" if $type{$1};
            push @errors, "TYPE $1 without its HELP first" unless ($family // '') eq $1;
            $type{$1} = $2;
        } elsif ($l =~ /^($name)(\{(?:$name="(?:[^"\\\n]|\\[\\"n])*"(?:,$name="(?:[^"\\\n]|\\[\\"n])*")*)?\})? ($num)$/) {
            my ($n, $labels, $val) = ($1, $2 // '', $3);
            my $base = $n;
            $base =~ s/_(bucket|sum|count)$// if ($type{$base =~ s/_(bucket|sum|count)$//r} // '') eq 'histogram';
            push @errors, "sample $n outside its family ($family)" unless defined $family && $base eq $family;
            push @errors, "series $n$labels twice" if exists $v{"$n$labels"};
            $v{"$n$labels"} = $val;
        } else {
            push @errors, "bad line: $l";
        }
    }
    return (\%v, \%type, \@errors);
}

sub scrape {
    my $r = $t->http(GET => '/metrics');
    is($r->{status}, 200, 'the metrics location answers 200') or diag($t->show($r));
    like($r->{headers}{'content-type'} // '', qr{^text/plain; version=0\.0\.4}, 'as text format 0.0.4');
    my ($v, $type, $err) = parse_prom($r->{content});
    is_deeply($err, [], 'the scrape parses strictly') or diag($r->{content});
    return ($v, $type);
}

my %want;   # "outcome location" => count

# A request is counted in nginx's log phase, just after its last byte was
# written: the client may read the answer and scrape (perhaps another
# worker) first.  Wait, bounded, until the count is there; a count that
# never comes shows in the checks after.
sub counted {
    my ($outcome, $loc) = @_;
    my $series = "idempotency_requests_total{outcome=\"$outcome\",location=\"$loc\"}";
    $t->wait_for(sub {
        my ($x) = parse_prom($t->http(GET => '/metrics')->{content});
        ($x->{$series} // -1) >= $want{"$outcome $loc"};
    }, 5);
}
sub req {
    my ($outcome, $loc, @args) = @_;
    my $r = $t->http(@args);
    $want{"$outcome $loc"}++;
    diag("expected $outcome, got: " . $t->show($r))
        if $outcome eq 'executed' && $r->{status} != 201;
    counted($outcome, $loc);
    return $r;
}

# ---- the known sequence
my @ok;
for my $i (1 .. 5) {
    my $k = $t->key("m$i");
    push @ok, $k;
    my $r = req(executed => 'orders', POST => '/orders/x', key => $k, json => { i => $i });
    is($r->{status}, 201, "first write $i executes");
}
for my $i (0 .. 2) {
    my $r = req(replayed => 'orders', POST => '/orders/x', key => $ok[$i], json => { i => $i + 1 });
    is($r->{headers}{'idempotent-replayed'}, 'true', "retry $i replays");
}
for my $i (0 .. 1) {
    my $r = req(conflict => 'orders', POST => '/orders/x', key => $ok[$i], json => { i => 99 });
    is($r->{status}, 409, "reuse $i with another body conflicts");
}
req(bypassed => 'orders', POST => '/orders/x', json => { nokey => 1 });
{
    my $r = req(rejected => 'orders', POST => '/orders/x', key => "bad key\x01", json => { a => 1 });
    is($r->{status}, 400, 'a malformed key is rejected');
}
for my $i (1 .. 2) {
    req(executed => '', POST => '/other/x', key => $t->key("o$i"), json => { o => $i });
}
{
    my $k = $t->key('slow');
    my $bg = $t->http_bg(POST => '/orders/x', key => $k, json => { slow => 1 }, headers => [ 'X-Delay' => 1 ]);
    $want{'executed orders'}++;
    $t->wait_state($k, undef, 'in_progress', 5);
    my $r = req(in_progress => 'orders', POST => '/orders/x', key => $k, json => { slow => 1 });
    is($r->{status}, 409, 'a duplicate during the first is in progress');
    my $first = $bg->result(10);
    is($first && $first->{status}, 201, 'the slow first write completes');
    counted(executed => 'orders');
    push @ok, $k;
}
GET_IS_NOT_COUNTED: {
    $t->http(GET => '/orders/x');      # not a handled method: no outcome
}

my ($v, $type) = scrape();
is($type->{idempotency_requests_total}, 'counter', 'idempotency_requests_total is a counter');
for my $o (qw(executed replayed conflict in_progress unknown rejected bypassed)) {
    for my $l ('orders', '') {
        is($v->{"idempotency_requests_total{outcome=\"$o\",location=\"$l\"}"}, $want{"$o $l"} // 0,
           "requests_total{outcome=$o, location=\"$l\"} is the test's count");
    }
}

# stored bytes: the stored headers and bodies of the completed records
my $stored = 0;
for my $k (@ok) {
    my $rec = $t->record($k) or next;
    $stored += length($rec->{hdr}) + length($rec->{body});
}
my @other = map { $_->{key} } grep { ($_->{uri} // '') eq '/other/x' } $t->effect_list;
for my $k (@other) {
    my $rec = $t->record($k) or next;
    $stored += length($rec->{hdr}) + length($rec->{body});
}
cmp_ok($stored, '>', 0, 'the test found the stored records');
is($v->{idempotency_stored_bytes_total}, $stored, 'stored_bytes_total is the size of the stored headers and bodies');

# idempotency_audit's counters: there, counters, and 0 (no location here audits)
for my $m (qw(idempotency_audit_appends_total idempotency_audit_races_lost_total)) {
    is($type->{$m}, 'counter', "$m is a counter");
    is($v->{$m}, 0, "$m is 0 without idempotency_audit");
}

# the histogram: cumulative, ends at +Inf = count, sum > 0
is($type->{idempotency_redis_command_duration_seconds}, 'histogram', 'redis_command_duration_seconds is a histogram');
my @le = map { /le="([^"]+)"/ ? $1 : () } grep { /^idempotency_redis_command_duration_seconds_bucket/ } sort keys %$v;
my @bounds = sort { ($a eq '+Inf') <=> ($b eq '+Inf') || ($a eq '+Inf' ? 0 : $a <=> $b) } @le;
is($bounds[-1], '+Inf', 'the last bucket is +Inf');
my ($prev, $mono) = (0, 1);
for my $b (@bounds) {
    my $c = $v->{"idempotency_redis_command_duration_seconds_bucket{le=\"$b\"}"};
    $mono = 0 if $c < $prev;
    $prev = $c;
}
ok($mono, 'bucket counts never decrease');
my $count = $v->{idempotency_redis_command_duration_seconds_count};
is($v->{'idempotency_redis_command_duration_seconds_bucket{le="+Inf"}'}, $count, '+Inf equals _count');
cmp_ok($count, '>=', 5 + 3 + 2 + 2 + 2, 'at least one timed command per claim');
cmp_ok($v->{idempotency_redis_command_duration_seconds_sum}, '>', 0, '_sum is above 0');

my $conn = 0;
$conn += $v->{"idempotency_redis_connected{worker=\"$_\"}"} // 0 for 0, 1;
is($conn, 2, 'both workers are connected to Redis');
is($v->{"idempotency_redis_errors_total{kind=\"$_\"}"}, 0, "no Redis errors of kind $_ yet") for qw(connect lost timeout reply);

# ---- Redis goes away: errors and the gauge show it, and the 503 counts
$t->stop_redis;
my $r = req(rejected => 'orders', POST => '/orders/x', key => $t->key('down'), json => { d => 1 });
is($r->{status}, 503, 'Redis down: 503');
ok($t->wait_for(sub {
    my ($x) = parse_prom($t->http(GET => '/metrics')->{content});
    ($x->{'idempotency_redis_connected{worker="0"}'} // 1) == 0 && ($x->{'idempotency_redis_connected{worker="1"}'} // 1) == 0;
}, 10), 'Redis down: no worker is counted as connected');
($v) = scrape();
is($v->{'idempotency_redis_errors_total{kind="lost"}'}, 2, 'Redis down: the lost connections are counted (one per worker: no idempotency_wait, no subscriber)');
ok($t->wait_for(sub {
    my ($x) = parse_prom($t->http(GET => '/metrics')->{content});
    ($x->{'idempotency_redis_errors_total{kind="connect"}'} // 0) >= 2;
}, 10), 'Redis down: the failed reconnects are counted');
is($v->{'idempotency_requests_total{outcome="rejected",location="orders"}'}, $want{'rejected orders'}, 'Redis down: the 503 counts as rejected');

$t->start_redis;
ok($t->wait_for(sub {
    my ($x) = parse_prom($t->http(GET => '/metrics')->{content});
    ($x->{'idempotency_redis_connected{worker="0"}'} // 0) + ($x->{'idempotency_redis_connected{worker="1"}'} // 0) == 2;
}, 10), 'Redis back: both workers connected again');

# an error reply: a foreign value under a record's key (store-error) is not
# a Redis error; a command Redis refuses is
$t->redis('CONFIG', 'SET', 'maxmemory', '1');
$t->redis('CONFIG', 'SET', 'maxmemory-policy', 'noeviction');
$r = req(rejected => 'orders', POST => '/orders/x', key => $t->key('oom'), json => { big => 'x' x 100 });
$t->redis('CONFIG', 'SET', 'maxmemory', '0');
is($r->{status}, 503, 'Redis OOM: 503');
($v) = scrape();
cmp_ok($v->{'idempotency_redis_errors_total{kind="reply"}'}, '>=', 1, 'Redis OOM: an error reply is counted');
is($v->{'idempotency_requests_total{outcome="rejected",location="orders"}'}, $want{'rejected orders'}, 'Redis OOM: counted as rejected');

# ---- a reload keeps the counters (same labels), and the new workers count
{
    my ($before) = parse_prom($t->http(GET => '/metrics')->{content});
    $t->reload_nginx;
    my ($after) = parse_prom($t->http(GET => '/metrics')->{content});
    is($after->{'idempotency_requests_total{outcome="executed",location="orders"}'},
       $before->{'idempotency_requests_total{outcome="executed",location="orders"}'}, 'reload: the counters are kept');
    ok($t->wait_for(sub {
        my ($x) = parse_prom($t->http(GET => '/metrics')->{content});
        ($x->{'idempotency_redis_connected{worker="0"}'} // 0) + ($x->{'idempotency_redis_connected{worker="1"}'} // 0) == 2;
    }, 10), 'reload: the new workers are counted as connected, once each');
    req(executed => 'orders', POST => '/orders/x', key => $t->key('after-reload'), json => { r => 1 });
    my ($x) = parse_prom($t->http(GET => '/metrics')->{content});
    is($x->{'idempotency_requests_total{outcome="executed",location="orders"}'}, $want{'executed orders'}, 'reload: the new workers add to the same counters');
}

# ---- a reload that reorders and adds labels, with the cache helper
# processes of proxy_cache_path beside the workers: each series keeps its
# count by name, and worker 0's gauge stays worker 0's
{
    my ($before) = parse_prom($t->http(GET => '/metrics')->{content});
    my $conf = metrics_conf('proxy_cache_path %%PREFIX%%/cache keys_zone=c:1m;',
        [ '/fresh/' => 'fresh' ], [ '/other/' => 'orders' ], [ '/orders/' ]);
    ok($t->reload_nginx($conf), 'reload with reordered labels and proxy_cache_path');
    my ($after) = parse_prom($t->http(GET => '/metrics')->{content});
    for my $o (qw(executed replayed conflict rejected)) {
        for my $l ('orders', '') {
            my $series = "idempotency_requests_total{outcome=\"$o\",location=\"$l\"}";
            is($after->{$series}, $before->{$series}, "reordered labels: $series kept its count");
        }
    }
    is($after->{'idempotency_requests_total{outcome="executed",location="fresh"}'}, 0, 'a new label starts at 0');
    ok($t->wait_for(sub {
        my ($y) = parse_prom($t->http(GET => '/metrics')->{content});
        ($y->{'idempotency_redis_connected{worker="0"}'} // 0) == 1 && ($y->{'idempotency_redis_connected{worker="1"}'} // 0) == 1;
    }, 10), 'with the cache manager and loader running, each worker\'s gauge is its own');
    # the cache manager and loader serve no request: they hold no Redis
    # connection (and no metrics slot); only the two workers do
    my @clients = grep { !/cmd=client\|list/ } split /\n/, ($t->redis('CLIENT', 'LIST') // '');
    is(scalar @clients, 2, 'Redis has one connection per worker, none from the cache helpers')
        or diag(join "\n", @clients);
    req(executed => 'orders', POST => '/other/x', key => $t->key('relabel'), json => { r => 2 });
    req(executed => 'fresh', POST => '/fresh/x', key => $t->key('fresh'), json => { r => 3 });
    my ($x) = parse_prom($t->http(GET => '/metrics')->{content});
    is($x->{'idempotency_requests_total{outcome="executed",location="orders"}'}, $want{'executed orders'},
       'reordered labels: "orders", now on /other/, adds to its own series');
    is($x->{'idempotency_requests_total{outcome="executed",location="fresh"}'}, 1, 'the new label counts');
    $t->stop_redis;
    ok($t->wait_for(sub {
        $t->http(POST => '/fresh/x', key => $t->key('poke'), json => { p => 1 });
        my ($y) = parse_prom($t->http(GET => '/metrics')->{content});
        ($y->{'idempotency_redis_connected{worker="0"}'} // 1) == 0 && ($y->{'idempotency_redis_connected{worker="1"}'} // 1) == 0;
    }, 10), 'with the cache helpers running, Redis down shows as 0 for each worker');
    $t->start_redis;
}

{
    my $p = $t->http(POST => '/metrics', body => 'x');
    is($p->{status}, 405, 'POST to the metrics location: 405');
}

# ---- nginx -t
my $R = 'idempotency_redis 127.0.0.1:1;';
for my $c (
    [ 'metrics without a zone', 'idempotency_metrics', '', "location /m { idempotency_metrics; }" ],
    [ 'zone too small', 'idempotency_metrics_zone', 'idempotency_metrics_zone z 4k;', '' ],
    [ 'zone size garbage', 'idempotency_metrics_zone', 'idempotency_metrics_zone z lots;', '' ],
    [ 'zone twice', 'idempotency_metrics_zone', 'idempotency_metrics_zone z 64k; idempotency_metrics_zone y 64k;', '' ],
    [ 'label with a quote', 'idempotency_metrics_label', 'idempotency_metrics_zone z 64k;', "location /a { idempotency on; $R idempotency_metrics_label a\"b; }" ],
    [ 'label too long', 'idempotency_metrics_label', 'idempotency_metrics_zone z 64k;', "location /a { idempotency on; $R idempotency_metrics_label " . ('x' x 65) . '; }' ],
    [ 'label twice', 'idempotency_metrics_label', 'idempotency_metrics_zone z 64k;', "location /a { idempotency on; $R idempotency_metrics_label a; idempotency_metrics_label b; }" ],
    [ 'metrics with arguments', 'idempotency_metrics', 'idempotency_metrics_zone z 64k;', "location /m { idempotency_metrics on; }" ],
) {
    my ($what, $dir, $http, $loc) = @$c;
    my ($rc, $out) = $t->nginx_test_conf("$http\nserver { listen 127.0.0.1:%%PORT%%; $loc }");
    isnt($rc, 0, "nginx -t rejects: $what");
    like($out, qr/\Q$dir\E/, "nginx -t: $what: names $dir") or diag($out);
}
{
    my ($rc, $out) = $t->nginx_test_conf("idempotency_metrics_zone z 64k;\nserver { listen 127.0.0.1:%%PORT%%; location /m { idempotency_metrics; } location /a { idempotency on; $R idempotency_metrics_label a-b.c:d/e_1; } }");
    is($rc, 0, 'nginx -t accepts a zone, a metrics location and a label') or diag($out);
}

$t->check_logs;
done_testing;
