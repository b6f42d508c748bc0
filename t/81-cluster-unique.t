#!/usr/bin/perl
# idempotency_unique and idempotency_lock on a Redis Cluster (3 masters,
# 3 replicas), docs/business-keys.md "On a Redis Cluster": the record is
# claimed in its slot, then each business key in its own slot.
#   - nginx -t accepts them with idempotency_redis_cluster;
#   - one event, two keys: one effect, the second key is reused; its retry
#     too; another event executes; the unique key is on another master than
#     the record, and names the record and its operation;
#   - 200 concurrent requests, 200 keys, one source_event_id: 1 effect, the
#     others the reuse or 409 in-progress, and retried, the reuse;
#   - the same with two nginx instances on the cluster;
#   - a refused request leaves no record and no business key naming it.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $t = Idem::Test->new;
my $dead = Idem::Test::free_port();

my $SNIPPET = <<'EOF';
idempotency_json_var $source_event_id /source_event_id;
idempotency_json_var $environment /environment;
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis_cluster @SEEDS@ connect_timeout=300ms timeout=2s;
    proxy_ignore_client_abort on;
    location /tickets {
        idempotency on;
        idempotency_lease 10s;
        idempotency_unique tickets:$source_event_id;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /deployments {
        idempotency on;
        idempotency_lease 10s;
        idempotency_lock deploy:$environment;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

{
    (my $conf = $SNIPPET) =~ s/\@SEEDS\@/127.0.0.1:$dead/;
    $conf =~ s/%%UPSTREAM%%/127.0.0.1:$dead/g;
    my ($rc, $out) = $t->nginx_test_conf($conf);
    is($rc, 0, 'nginx -t accepts idempotency_unique and idempotency_lock with idempotency_redis_cluster')
        or diag($out);
}

my @ports = $t->start_cluster(masters => 3, replicas => 1);
my $seeds = join ' ', map { "127.0.0.1:$_" } @ports[0, 1];
(my $conf = $SNIPPET) =~ s/\@SEEDS\@/$seeds/;
$t->start_upstream;
$t->start_nginx($conf, workers => 2);

sub ticket {
    my ($tt, $key, $event, %o) = @_;
    return $tt->http(POST => '/tickets', key => $key,
                     json => { source_event_id => $event, title => "t $key" },
                     headers => [ 'X-Delay' => $o{delay} // 0 ], timeout => 20);
}

# GET of $key on the master that owns its slot now
sub get_anywhere {
    my ($key) = @_;
    my $m = $t->cluster_owners->[$t->key_slot($key)] // return undef;
    my $v = $t->redis_at($m, 'GET', $key);
    return ref $v ? undef : $v;
}

sub event_effects {
    my ($event) = @_;
    return scalar grep { ($_->{json}{source_event_id} // '') eq $event } $t->effect_list(uri => '/tickets');
}

# the unique key of an event (docs/business-keys.md), found by its value's
# prefix: the record key and operation id of the operation that holds it
sub unique_holders {
    my ($rkey) = @_;
    my @held;
    for my $port (@ports) {
        for my $k (@{ $t->redis_at($port, 'KEYS', 'idem:*:u') // [] }) {
            my $v = $t->redis_at($port, 'GET', $k);
            next if !defined $v || ref $v;
            push @held, [ $k, $v ] if !defined $rkey || index($v, $rkey) == 0;
        }
    }
    return @held;
}

# ---- one event, two keys
{
    my $ev = "alert-" . time;
    my ($k1, $k2) = ($t->key('u1'), $t->key('u2'));
    my $a = ticket($t, $k1, $ev);
    is($a->{status}, 201, 'the first delivery executes') or diag($t->show($a));
    my $b = ticket($t, $k2, $ev);
    is(join(' ', $b->{status}, $b->{headers}{'idempotent-reused'} // '-'), '201 true',
       'the second delivery, another key: the first\'s answer, Idempotent-Reused') or diag($t->show($b));
    is($b->{content}, $a->{content}, '... the same body');
    like($b->{headers}{'idempotency-operation'} // '', qr/^[0-9a-f]{32}$/, '... the first operation\'s id');
    my $b2 = ticket($t, $k2, $ev);
    is(join(' ', $b2->{status}, $b2->{headers}{'idempotent-reused'} // '-'), '201 true', 'its retry: reused again');
    is(event_effects($ev), 1, 'one effect');
    my $c = ticket($t, $t->key('u3'), "$ev-other");
    is($c->{status}, 201, 'another event executes');
    is(event_effects("$ev-other"), 1, '... once');

    my $rk = $t->record_name($k1);
    my @held = unique_holders($rk);
    is(scalar @held, 1, 'one unique key names the first key\'s record');
    isnt($t->key_slot($held[0][0]), $t->key_slot($rk), '... in another slot than the record') if @held;
    my $op = $b->{headers}{'idempotency-operation'} // 'none';
    like($held[0][1] // '', qr/^\Q$rk$op\E/, '... with its operation id') if @held;
    is(scalar(unique_holders($t->record_name($k2))), 0, 'no unique key names the reusing key');
}

# ---- 200 concurrent requests, 200 keys, one event
sub storm_of {
    my ($name, $ev, @nginx) = @_;
    my @keys = map { $t->key("s$_") } 0 .. 199;
    my $res = $t->parallel(200, sub {
        my $i = shift;
        my $tt = $nginx[$i % @nginx];
        my $r = ticket($tt, $keys[$i], $ev, delay => 1);
        my $first = join ' ', $r->{status}, $tt->ptype($r), $r->{headers}{'idempotent-reused'} // '-';
        my ($f) = $tt->retry_until_final('/tickets', 30, key => $keys[$i],
                                         json => { source_event_id => $ev, title => "t $keys[$i]" });
        return [ $first, join(' ', $f->{status}, $tt->ptype($f), $f->{headers}{'idempotent-reused'} // '-'),
                 $f->{content}, $r->{content} ];
    }, timeout => 120);
    my (%first, %final, %bodies);
    for my $x (@$res) {
        $first{ $x ? $x->[0] : 'none' }++;
        $final{ $x ? $x->[1] : 'none' }++;
        $bodies{ $x->[2] // '' }++ if $x;
    }
    is(event_effects($ev), 1, "$name: exactly 1 upstream effect");
    is($first{'201  -'} // 0, 1, "$name: one executed") or diag(explain \%first);
    is(($first{'201  true'} // 0) + ($first{'409 in-progress -'} // 0), 199,
       "$name: the 199 others: the reuse or 409 in-progress") or diag(explain \%first);
    is(($final{'201  true'} // 0), 199, "$name: retried, all 199 the reuse") or diag(explain \%final);
    is(scalar keys %bodies, 1, "$name: one body for all 200");
}

storm_of('one nginx', 'storm-' . time, $t);

# ---- two nginx instances on the cluster, the same upstream
{
    my $t2 = Idem::Test->new;
    $t2->{upstream_port} = $t->upstream_port;
    $t2->start_nginx($conf, workers => 2);
    storm_of('two nginx', 'storm2-' . time, $t, $t2);
    $t2->stop_nginx;
}

# ---- a refused request keeps nothing
{
    my $ev = 'refused-' . time;
    my ($k1, $k2) = ($t->key('h1'), $t->key('h2'));
    my $bg = $t->http_bg(POST => '/tickets', key => $k1, json => { source_event_id => $ev, title => 'a' },
                         headers => [ 'X-Delay' => 2 ], timeout => 20);
    ok($t->wait_for(sub { event_effects($ev) == 1 }, 10), 'the holder reached the upstream');
    my $x = ticket($t, $k2, $ev);
    $t->is_problem($x, 409, 'in-progress', name => 'a second key while it runs');
    ok(!defined get_anywhere($t->record_name($k2)), '... and no record of its key');
    is(scalar(unique_holders($t->record_name($k2))), 0, '... no unique key names it');
    $bg->result(20);
    my $y = ticket($t, $k2, $ev);
    is(join(' ', $y->{status}, $y->{headers}{'idempotent-reused'} // '-'), '201 true', 'retried once it completed: reused');
    is(event_effects($ev), 1, 'one effect');
}

done_testing;
