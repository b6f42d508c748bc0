#!/usr/bin/perl
# Guarded locations, property test (issue 35): random rounds of concurrent
# requests, each a random (location, method, key present or not and from a
# small pool, media type, member present / null / empty / absent), against
# three guarded locations: a confirmation decided by a map of the body's
# amount, a business identity, a lock. The counting upstream parses every
# body as JSON whatever its Content-Type; whatever the sequence, it never
# sees
#   - an unconfirmed execution (an amount that needs approval: none is ever
#     given here),
#   - a duplicate (one key, or one non-empty event id, executed twice),
#   - an overlap (two executions of one environment running side by side),
#   - a write method the location does not handle.
# The seed is printed; IDEM_SEED=N replays a sequence.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use Time::HiRes qw(sleep time);
use Idem::Test;

my $seed = $ENV{IDEM_SEED} // (time ^ $$) % 1000000;
diag("seed $seed (IDEM_SEED=$seed replays this sequence)");
srand($seed);

my $t = Idem::Test->new;
my $p = $t->prefix;
open my $fh, '>', "$p/hs.key" or die; print $fh 'p' x 40; close $fh;

$t->start_stack(<<"EOF");
idempotency_json_var \$amount /amount;
idempotency_json_var \$source_event_id /source_event_id;
idempotency_json_var \$environment /environment;

map \$amount \$needs_approval {
    default        0;
    "~^[0-9]{4,}\$"  1;
}

server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    idempotency_methods POST PUT PATCH;

    location /confirm {
        idempotency on;
        idempotency_confirm \$needs_approval;
        idempotency_confirm_key hs256 $p/hs.key;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /unique {
        idempotency on;
        idempotency_unique ev:\$source_event_id;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /lock {
        idempotency on;
        idempotency_lock deploy:\$environment;
        proxy_ignore_client_abort on;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

my %MEMBER = (confirm => 'amount', unique => 'source_event_id', lock => 'environment');
my %VALUES = (confirm => [ 5, 990000, '42', '123456' ], unique => [ 'e1', 'e2', 'e3' ],
              lock => [ 'production', 'staging' ]);
# weighted towards requests that execute, so that executions meet
my @METHODS = (('POST') x 6, qw(PUT PATCH DELETE LOCK GET));
my @TYPES = (('application/json') x 5, 'application/problem+json',
             'text/plain', 'text/json', 'application/x-www-form-urlencoded', undef);
my @KEYS = map { "prop-$seed-$_" } 1 .. 40;
my $JS = JSON::PP->new->canonical;

sub pick { $_[int rand @_] }

# one random request: (method, path, %http options)
sub random_request {
    my $loc = pick(qw(confirm unique lock));
    my %body = (note => 'n' . int rand 1000);
    my $v = pick(qw(present present present present present null empty absent));
    $body{ $MEMBER{$loc} } = $v eq 'present' ? pick(@{ $VALUES{$loc} })
                           : $v eq 'null' ? undef : $v eq 'empty' ? '' : ();
    delete $body{ $MEMBER{$loc} } if $v eq 'absent';
    my $ct = pick(@TYPES);
    my $body = rand() < 0.1 ? '' : $JS->encode(\%body);
    my @h = (defined $ct ? ('Content-Type' => $ct) : ());
    push @h, 'X-Delay' => 0.3 if $loc eq 'lock';
    return (pick(@METHODS), "/$loc",
            (rand() < 0.8 ? (key => pick(@KEYS)) : ()),
            body => $body, headers => \@h, timeout => 20);
}

my %answers;
for my $round (1 .. 20) {
    my @bg = map { $t->http_bg(random_request()) } 1 .. 8;
    for my $b (@bg) {
        my $r = $b->result(30);
        $answers{ $r ? $r->{status} : 'none' }++;
    }
}
diag('answers: ' . join(' ', map { "$_ x$answers{$_}" } sort keys %answers));

my @effects = grep { $_->{method} !~ /^(GET|HEAD|OPTIONS)$/ } $t->effect_list;
my %end = map { $_->{n} => $_->{t} } $t->upstream_responses;
sub member { my ($e, $m) = @_; ref $e->{json} eq 'HASH' ? $e->{json}{$m} : undef }

# a write method the location does not handle never reaches the upstream
is(scalar(grep { $_->{method} !~ /^(POST|PUT|PATCH)$/ } @effects), 0,
   'no DELETE, LOCK or other unhandled write reached the upstream');

# never unconfirmed: an amount that needs approval (as the upstream reads it)
my @unconfirmed = grep {
    $_->{uri} eq '/confirm' && defined member($_, 'amount') && member($_, 'amount') =~ /^[0-9]{4,}$/
} @effects;
is(scalar @unconfirmed, 0, 'no execution of an amount that needs approval')
    or diag(explain(\@unconfirmed));

# never a duplicate: one execution per key and location, and per event id
my (%by_key, %by_event);
for my $e (@effects) {
    push @{ $by_key{"$e->{uri} " . ($e->{key} // '(none)')} }, $e->{n};
    my $ev = $e->{uri} eq '/unique' ? member($e, 'source_event_id') : undef;
    push @{ $by_event{$ev} }, $e->{n} if defined $ev && !ref $ev && length $ev;
}
is(scalar(grep { /\(none\)$/ } keys %by_key), 0, 'no execution without a key');
is(scalar(grep { @{ $by_key{$_} } > 1 } keys %by_key), 0, 'no key executed twice')
    or diag(explain(\%by_key));
is(scalar(grep { @{ $by_event{$_} } > 1 } keys %by_event), 0, 'no event id executed twice')
    or diag(explain(\%by_event));

# never side by side: two executions of one environment do not overlap
my @locked = grep { $_->{uri} eq '/lock' } @effects;
my @overlaps;
for my $i (0 .. $#locked) {
    for my $j ($i + 1 .. $#locked) {
        my ($a, $b) = @locked[$i, $j];
        my ($ea, $eb) = (member($a, 'environment'), member($b, 'environment'));
        next unless defined $ea && defined $eb && !ref $ea && $ea eq $eb && length $ea;
        my ($a1, $b1) = ($end{ $a->{n} } // 9e9, $end{ $b->{n} } // 9e9);
        push @overlaps, [ $a->{n}, $b->{n}, $ea ] if $a->{t} < $b1 && $b->{t} < $a1;
    }
}
is(scalar @overlaps, 0, 'no two executions of one environment ran side by side')
    or diag(explain(\@overlaps));
is(scalar(grep { !defined member($_, 'environment') || member($_, 'environment') eq '' } @locked), 0,
   'no lock execution without an environment');
ok(@effects > 0, 'some requests executed (' . scalar(@effects) . ')');

$t->check_logs;
done_testing();
