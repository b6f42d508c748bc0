#!/usr/bin/perl
# idempotency_audit's other events, each where the contract puts it:
# a proposal (confirmation_required), its recorded approval (approved, by
# the approval endpoint) and the claim that follows (sent, with the
# approver); a signed approval (approved and sent in the claim's step); a
# business identity reused by another key (reused, with the first
# operation's response); a lock held by another operation (in_progress);
# a duplicate that waits (idempotency_wait) and is replayed (no
# in_progress), or told "retry later" when the first attempt was released
# (released). The chain verifies at the end.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use Time::HiRes qw(time sleep);
use Idem::Test;

my $t = Idem::Test->new;
my $p = $t->prefix;
my $TOOL = "$FindBin::Bin/../build/idempotency-approve";
system("openssl rand -hex 32 > $p/hs.key") == 0 or BAIL_OUT('openssl rand');

$t->start_stack(<<"EOF", workers => 1, log_format => 'rid=\$request_id key=\$idempotency_key outcome=\$idempotency_outcome');
idempotency_json_var \$source_event_id /source_event_id;
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    idempotency_audit on;
    idempotency_audit_stream idem:ev;
    idempotency_audit_identity \$http_x_user;
    location /pay {
        idempotency on;
        idempotency_confirm on;
        idempotency_confirm_key hs256 $p/hs.key;
        proxy_pass http://%%UPSTREAM%%;
    }
    location = /approve {
        idempotency_approve;
    }
    location /tickets {
        idempotency on;
        idempotency_scope \$http_authorization;
        idempotency_unique tickets:\$source_event_id;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /deploy {
        idempotency on;
        idempotency_lock deploy:\$http_x_env;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /wait {
        idempotency on;
        idempotency_wait 10s;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

sub shown {
    my ($what) = @_;
    my ($rc, $out) = $t->audit_tool('--stream', 'idem:ev', 'show', $what);
    return join ' ', map { (split ' ')[2] } grep { /\S/ } split /\n/, $out;
}

sub entries_of { my ($k) = @_; [ grep { $_->{key} eq $k } @{ $t->audit_entries('idem:ev') } ] }

my @alice = ('X-User' => 'alice');
my $body = { amount => 4200 };

# ---- a proposal, its recorded approval, the claim that follows
{
    my $k = $t->key('recorded');
    my $r = $t->http(POST => '/pay', key => $k, json => $body, headers => [@alice]);
    is($r->{status}, 428, 'a proposal: 428');
    my $prop = ($t->problem($r) // {})->{proposal} // {};
    $r = $t->http(POST => '/approve', headers => [ 'X-User' => 'operator-olga' ],
                  json => JSON::PP->new->encode({ operation_id => $prop->{operation_id},
                      fingerprint => $prop->{fingerprint}, approved_by => 'bob', expires_in => 600 }));
    is($r->{status}, 200, 'recorded approval: 200') or diag($t->show($r));
    $r = $t->http(POST => '/pay', key => $k, json => $body, headers => [@alice]);
    is($r->{status}, 201, 'the approved request executes');
    ok($t->wait_state($k, undef, 'completed'), 'recorded');
    $r = $t->http(POST => '/pay', key => $k, json => $body, headers => [@alice]);
    is($r->{headers}{'idempotent-replayed'}, 'true', 'then a replay');
    is(shown($prop->{operation_id}),
       'attempted confirmation_required approved attempted sent accepted completed attempted replayed',
       'the operation: proposed, approved (by the endpoint), executed, replayed');
    my ($approved) = grep { $_->{event} eq 'approved' && $_->{op} eq $prop->{operation_id} }
                     @{ $t->audit_entries('idem:ev') };
    is($approved->{approver}, 'bob', '"approved": the approver');
    is($approved->{identity}, 'operator-olga', '"approved": the identity of who posted it');
    is($approved->{fp}, $prop->{fingerprint}, '"approved": the fingerprint the person saw');
    my ($sent) = grep { $_->{event} eq 'sent' } @{ entries_of($k) };
    is($sent->{approver}, 'bob', '"sent": executed as approved by bob');
    is($t->effects(key => $k), 1, 'one effect');
}

# ---- a signed approval: approved and sent in the claim's step
{
    my $k = $t->key('signed');
    my $r = $t->http(POST => '/pay', key => $k, json => $body, headers => [@alice]);
    is($r->{status}, 428, 'a proposal: 428');
    open my $f, '>', "$p/answer.json" or die;
    print $f $r->{content};
    close $f;
    my $jws = `$TOOL --trust-file --key $p/hs.key --sub carol --yes $p/answer.json 2>/dev/null`;
    chomp $jws;
    $r = $t->http(POST => '/pay', key => $k, json => $body,
                  headers => [ @alice, 'Idempotency-Confirmation' => $jws ]);
    is($r->{status}, 201, 'the signed approval executes') or diag($t->show($r));
    ok($t->wait_state($k, undef, 'completed'), 'recorded');
    my $op = entries_of($k)->[0]{op};
    is(shown($op), 'attempted confirmation_required attempted approved sent accepted completed',
       'the operation: proposed, then approved and sent in one step');
    is_deeply([ map { $_->{approver} } grep { $_->{event} =~ /^(approved|sent)$/ } @{ entries_of($k) } ],
              [qw(carol carol)], '"approved" and "sent" name the signer');
    is($t->effects(key => $k), 1, 'one effect');
}

# ---- a business identity reused by another key
{
    my ($k1, $k2) = ($t->key('uniq-1'), $t->key('uniq-2'));
    my @h = (headers => [ @alice, Authorization => 'Bearer t' ]);
    my $r = $t->http(POST => '/tickets', key => $k1, json => { source_event_id => 'ev-7' }, @h);
    is($r->{status}, 201, 'the first delivery executes');
    ok($t->wait_state($k1, 'Bearer t', 'completed'), 'recorded');
    $r = $t->http(POST => '/tickets', key => $k2, json => { source_event_id => 'ev-7' }, @h);
    is($r->{headers}{'idempotent-reused'}, 'true', 'the second key reuses it');
    $r = $t->http(POST => '/tickets', key => $k2, json => { source_event_id => 'ev-7' }, @h);
    is($r->{headers}{'idempotent-reused'}, 'true', 'and so does its retry');
    my $op = entries_of($k1)->[0]{op};
    is(shown($op), 'attempted sent accepted completed attempted reused attempted reused',
       'the first operation\'s history holds both reuses');
    is(shown($k2), 'attempted reused attempted reused', 'the second key: attempted reused, twice');
    my ($done) = grep { $_->{event} eq 'completed' } @{ entries_of($k1) };
    my @reused = grep { $_->{event} eq 'reused' } @{ entries_of($k2) };
    is_deeply([ map { "$_->{status} $_->{response}" } @reused ], [ ("201 $done->{response}") x 2 ],
        '"reused": the first operation\'s status and response digest');
    is($t->effects, 3, 'effects so far: 3 (one ticket)');
}

# ---- a lock held by another operation
{
    my ($k1, $k2) = ($t->key('lock-1'), $t->key('lock-2'));
    my $bg = $t->http_bg(POST => '/deploy', key => $k1, json => { v => 1 },
                         headers => [ @alice, 'X-Env' => 'prod', 'X-Delay' => 1.5 ]);
    ok($t->wait_for(sub { $t->effects(key => $k1) == 1 }, 5), 'the first deploy runs');
    my $r = $t->http(POST => '/deploy', key => $k2, json => { v => 2 }, headers => [ @alice, 'X-Env' => 'prod' ]);
    is("$r->{status} " . $t->ptype($r), '409 lock-held', 'another deploy: 409 lock-held');
    is(($bg->result(15) // {})->{status}, 201, 'the first completes');
    is(shown($k2), 'attempted in_progress', 'the refused deploy: attempted in_progress');
    is_deeply([ map { $_->{op} } @{ entries_of($k2) } ], [ '', '' ], 'it names no operation (it has none)');
    is($t->effects(key => $k1) . ' ' . $t->effects(key => $k2), '1 0', 'effects: the holder once, the refused none');
}

# ---- a duplicate that waits and is replayed; one told to retry later
{
    my $k = $t->key('wait');
    my $bg = $t->http_bg(POST => '/wait', key => $k, json => {}, headers => [ @alice, 'X-Delay' => 1 ]);
    ok($t->wait_for(sub { $t->effects(key => $k) == 1 }, 5), 'the first attempt runs');
    my $r = $t->http(POST => '/wait', key => $k, json => {}, headers => [@alice], timeout => 15);
    is($r->{headers}{'idempotent-replayed'}, 'true', 'the duplicate waited and got the replay');
    is(($bg->result(15) // {})->{status}, 201, 'the first completes');
    is(shown($k), 'attempted sent accepted completed attempted replayed',
       'the waiter: attempted replayed, never in_progress');
    is($t->effects(key => $k), 1, 'one effect');

    my $k2 = $t->key('wait-503');
    $bg = $t->http_bg(POST => '/wait', key => $k2, json => {}, headers => [ @alice, 'X-Delay' => 1, 'X-Status' => 503 ]);
    ok($t->wait_for(sub { $t->effects(key => $k2) == 1 }, 5), 'an attempt the upstream will refuse runs');
    $r = $t->http(POST => '/wait', key => $k2, json => {}, headers => [@alice], timeout => 15);
    is("$r->{status} " . $t->ptype($r), '503 retry-later', 'the waiter is told to retry later');
    is(($bg->result(15) // {})->{status}, 503, 'the first gets the 503');
    is(shown($k2), 'attempted sent accepted released attempted released',
       'released, then the waiter\'s attempted released');
    is(entries_of($k2)->[-1]{status}, '503', 'the waiter\'s "released" holds the 503 it got');
    is($t->effects(key => $k2), 1, 'one effect (the waiter did not run)');
}

my ($rc, $out, $err) = $t->audit_tool('--stream', 'idem:ev', 'verify');
is($rc, 0, 'verify: intact') or diag("$out$err");

$t->check_logs;
done_testing;
