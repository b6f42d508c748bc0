#!/usr/bin/perl
# Tampering with the audit stream, done with redis-cli as someone with
# write access to Redis would: change one field, delete an entry in the
# middle, insert a forged entry, swap two entries, delete the tail and
# append other entries, rewrite the whole chain. On a plain SHA-256 chain
# and on an HMAC chain (idempotency_audit_key): `idempotency-audit verify`
# exits 1 naming the entry and what is wrong; with the key, entries written
# without it are "wrong HMAC"; what a plain chain cannot show by itself
# (a tail re-chained, the whole chain rewritten) the anchored head shows.
# Also: export and verify --file (an archive verified offline), export
# resumed from a sequence number, show of a key used in two scopes.

use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use JSON::PP;
use Idem::Test;

my $t = Idem::Test->new;
my $KEYFILE = $t->prefix . '/audit.key';
my $SECRET = 'k' x 40;
open(my $fh, '>', $KEYFILE) or die "$KEYFILE: $!";
print $fh "$SECRET\n";
close $fh;

$t->start_stack(<<"EOF");
server {
    listen 127.0.0.1:%%PORT%%;
    idempotency_redis %%REDIS%%;
    idempotency_scope \$http_authorization;
    idempotency_audit on;
    location /plain/ {
        idempotency on;
        idempotency_audit_stream audit:plain;
        proxy_pass http://%%UPSTREAM%%;
    }
    location /keyed/ {
        idempotency on;
        idempotency_audit_stream audit:keyed;
        idempotency_audit_key $KEYFILE;
        proxy_pass http://%%UPSTREAM%%;
    }
}
EOF

# a little history in each stream: first writes and replays (two entries
# each, of two events)
for my $s (qw(plain keyed)) {
    for my $i (1 .. 4) {
        my $k = $t->key("$s$i");
        my @req = (key => $k, json => { n => $i }, headers => [ Authorization => 'Bearer a' ]);
        is($t->http(POST => "/$s/x", @req)->{status}, 201, "$s: first write $i");
        ok($t->wait_state($k, 'Bearer a', 'completed'), "$s: recorded $i");
        is($t->http(POST => "/$s/x", @req)->{headers}{'idempotent-replayed'}, 'true', "$s: replay $i");
    }
}

# the stream's entries as stored: [id, h, e] each (h the raw digest)
sub snapshot {
    my ($stream) = @_;
    return [ map { [ $_->{id}, $_->{h}, $_->{e} ] } @{ $t->audit_stream($stream) } ];
}

sub hex_of { unpack 'H*', $_[0] }

sub verify {
    my ($stream, @args) = @_;
    my ($rc, $out, $err) = $t->audit_tool('--stream', $stream, @args, 'verify');
    return ($rc, $out . $err);
}

# entry $e with field $name set to $value (the hash is left as it was):
# seq and prev are the entry's, the others its first event's
sub with_field {
    my ($e, $name, $value) = @_;
    my $f = $t->audit_decode($e);
    if ($name eq 'prev' || $name eq 'seq') {
        $f->{$name} = $value;
    } else {
        $f->{events}[0]{$name} = $value;
    }
    return $t->audit_encode($f);
}

# a forged entry: as the module would write it, hashed by someone without the key
sub forge {
    my ($seq, $prev, %f) = @_;
    my $e = $t->audit_encode({ seq => $seq, prev => $prev,
                               events => [ { time => 1700000000000, event => 'completed',
                                             op => 'f' x 32, key => 'forged', fp => 'f' x 64,
                                             route => '/plain/x', status => 201, identity => 'mallory', %f } ] });
    return [ "$seq-0", $t->audit_digest($e), $e ];
}

# the entries from index $i on, re-added with IDs moved up by one
sub moved_up {
    my ($snap, $i) = @_;
    return map { my ($n) = $_->[0] =~ /^(\d+)/; [ ($n + 1) . '-0', $_->[1], $_->[2] ] } @$snap[$i .. $#$snap];
}

for my $case ([ 'audit:plain', [] ], [ 'audit:keyed', [ '--key-file', $KEYFILE ] ]) {
    my ($stream, $key) = @$case;
    my $what = @$key ? 'HMAC chain' : 'SHA-256 chain';
    my $orig = snapshot($stream);
    my $n = @$orig;
    ok($n >= 10, "$what: $n entries");

    my ($rc, $out) = verify($stream, @$key);
    is($rc, 0, "$what: intact") or diag($out);
    my ($head) = $out =~ /^(\d+ [0-9a-f]{64})$/m;
    is($head, "$n " . hex_of($orig->[-1][1]), "$what: verify prints the head");
    my $anchor = "$n:" . hex_of($orig->[-1][1]);

    # change one field of entry 3 (its hash kept)
    my @e = @$orig;
    $e[2] = [ $e[2][0], $e[2][1], with_field($e[2][2], 'identity', 'mallory') ];
    $t->audit_rewrite($stream, @e);
    ($rc, $out) = verify($stream, @$key);
    is($rc, 1, "$what: a changed field: exit 1");
    like($out, qr/^entry 3: modified:/m, "$what: a changed field: entry 3 modified") or diag($out);

    # delete one entry in the middle
    $t->audit_rewrite($stream, @$orig);
    is($t->redis_cli('XDEL', $stream, '4-0'), '1', "$what: XDEL 4-0");
    ($rc, $out) = verify($stream, @$key);
    is($rc, 1, "$what: an entry deleted: exit 1");
    like($out, qr/^entry 4: missing:/m, "$what: entry 4 missing") or diag($out);

    # insert a forged entry as entry 5, hashed right (as one without the key can)
    $t->audit_rewrite($stream, @$orig[0 .. 3], forge(5, $orig->[3][1]), moved_up($orig, 4));
    ($rc, $out) = verify($stream, @$key);
    is($rc, 1, "$what: a forged entry inserted: exit 1");
    like($out, @$key ? qr/^entry 5: wrong HMAC:/m : qr/^entry 5: inserted:/m,
         "$what: entry 5 " . (@$key ? 'wrong HMAC' : 'inserted')) or diag($out);

    # swap entries 6 and 7
    @e = @$orig;
    @e[5, 6] = ([ '6-0', @{ $orig->[6] }[1, 2] ], [ '7-0', @{ $orig->[5] }[1, 2] ]);
    $t->audit_rewrite($stream, @e);
    ($rc, $out) = verify($stream, @$key);
    is($rc, 1, "$what: two entries swapped: exit 1");
    like($out, qr/^entry 6: reordered:/m, "$what: entry 6 reordered") or diag($out);

    # delete the tail (3 entries) and append others, chained right without the key
    my @tail = (forge($n - 2, $orig->[$n - 4][1]));
    push @tail, forge($n - 1, $tail[-1][1], event => 'released', status => '');
    push @tail, forge($n, $tail[-1][1], event => 'resolved');
    $t->audit_rewrite($stream, @$orig[0 .. $n - 4], @tail);
    ($rc, $out) = verify($stream, @$key);
    if (@$key) {
        is($rc, 1, "$what: tail deleted and re-appended: exit 1");
        like($out, qr/^entry ${\($n - 2)}: wrong HMAC:/m, "$what: the first re-appended entry: wrong HMAC")
            or diag($out);
    } else {
        is($rc, 0, "$what: a re-chained tail verifies on its own: only the anchored head can tell")
            or diag($out);
    }
    ($rc, $out) = verify($stream, @$key, '--anchor', $anchor);
    is($rc, 1, "$what: tail re-appended, with the anchored head: exit 1");
    like($out, @$key ? qr/^entry ${\($n - 2)}: wrong HMAC:/m : qr/^entry $n: modified: its hash is not the anchored/m,
         "$what: the anchor names the entry") or diag($out);

    # delete the tail only: the anchor tells
    $t->audit_rewrite($stream, @$orig[0 .. $n - 3]);
    ($rc, $out) = verify($stream, @$key, '--anchor', $anchor);
    is($rc, 1, "$what: tail deleted, with the anchored head: exit 1");
    like($out, qr/^entry ${\($n - 1)}: missing: the stream ends at entry ${\($n - 2)}/m,
         "$what: the anchor says the tail is missing") or diag($out);

    # the whole chain rewritten, entry 2 changed (chained right, without the key)
    my @all;
    my $prev = "\0" x 32;
    for my $en (@$orig) {
        my $e2 = with_field($en->[2], 'prev', $prev);
        $e2 = with_field($e2, 'identity', 'mallory') if $en->[0] eq '2-0';
        push @all, [ $en->[0], $t->audit_digest($e2), $e2 ];
        $prev = $all[-1][1];
    }
    $t->audit_rewrite($stream, @all);
    ($rc, $out) = verify($stream, @$key);
    if (@$key) {
        is($rc, 1, "$what: the whole chain rewritten without the key: exit 1");
        like($out, qr/^entry 1: wrong HMAC:/m, "$what: entry 1 wrong HMAC") or diag($out);
    } else {
        is($rc, 0, "$what: the whole chain rewritten verifies on its own (no key)");
        ($rc, $out) = verify($stream, '--anchor', $anchor);
        is($rc, 1, "$what: ... but not against the anchored head");
        like($out, qr/^entry $n: modified:/m, "$what: the anchor names the head") or diag($out);
    }

    # back to the original; the module goes on appending on it
    $t->audit_rewrite($stream, @$orig);
    ($rc, $out) = verify($stream, @$key);
    is($rc, 0, "$what: restored: intact") or diag($out);
}

# the HMAC chain read without the key
{
    my ($rc, $out) = verify('audit:keyed');
    is($rc, 1, 'HMAC chain verified without --key-file: exit 1');
    like($out, qr/^entry 1: modified: .*--key-file/m, 'and the tool says a key is needed') or diag($out);
}

# entries deleted at the tail with XDEL: the stream keeps its last ID, the
# module appends after it, chained on the head it appended last (its head
# key, audit.lua), and the gap is in the stream for verify to see
{
    my $orig = snapshot('audit:keyed');
    my $n = @$orig;
    my $anchor = "$n:" . hex_of($orig->[-1][1]);
    $t->redis_cli('XDEL', 'audit:keyed', "$n-0", ($n - 1) . '-0');
    my $k = $t->key('after-cut');
    is($t->http(POST => '/keyed/x', key => $k, json => {}, headers => [ Authorization => 'Bearer a' ])->{status},
       201, 'a write after the tail was deleted');
    ok($t->wait_state($k, 'Bearer a', 'completed'), 'recorded');
    my $now = $t->audit_stream('audit:keyed');
    is_deeply([ map { $_->{seq} } @$now ], [ 1 .. $n - 2, $n + 1 .. $n + 2 ],
        'the module appended after the stream\'s last ID (the claim\'s entry, the completion\'s)');
    is($now->[$n - 2]{decoded}{prev}, $orig->[$n - 1][1],
       'chained on the deleted entry, the head the module appended last');
    my ($rc, $out) = verify('audit:keyed', '--key-file', $KEYFILE);
    is($rc, 1, 'verify: exit 1');
    like($out, qr/^entry ${\($n - 1)}: missing: entries ${\($n - 1)} to $n are not in the stream/m,
         'verify names the deleted entries') or diag($out);
    # what an operator who rebuilds the stream instead (DEL, XADD) can hide,
    # the anchored head shows
    $t->audit_rewrite('audit:keyed', @$orig[0 .. $n - 3]);
    ($rc, $out) = verify('audit:keyed', '--key-file', $KEYFILE);
    is($rc, 0, 'a stream rebuilt without its tail verifies on its own') or diag($out);
    ($rc, $out) = verify('audit:keyed', '--key-file', $KEYFILE, '--anchor', $anchor);
    is($rc, 1, '... but not against the anchored head');
    like($out, qr/^entry ${\($n - 1)}: missing: the stream ends at entry ${\($n - 2)}/m, 'the anchor names it')
        or diag($out);
    $t->audit_rewrite('audit:keyed', @$orig);
}

# export, an offline verify of the archive, and a resumed export
{
    my ($rc, $json, $err) = $t->audit_tool('--stream', 'audit:plain', 'export');
    is($rc, 0, 'export: exit 0') or diag($err);
    my @lines = split /\n/, $json;
    my $entries = $t->audit_entries('audit:plain');
    is(scalar @lines, scalar @$entries, 'export: one JSON line per event');
    my @docs = map { JSON::PP->new->decode($_) } @lines;
    is_deeply([ map { "$_->{seq}.$_->{index}" } @docs ], [ map { "$_->{seq}.$_->{index}" } @$entries ],
              'export: in order, each event with its entry and its place in it');
    my $nentries = $docs[-1]{seq};
    is_deeply([ map { $_->{seq} } grep { $_->{index} == 1 } @docs ], [ 1 .. $nentries ],
              'export: every entry');
    is_deeply([ map { $_->{event} } @docs ], [ map { $_->{event} } @$entries ], 'export: the events');
    ok(!grep({ !defined $_->{e} || !defined $_->{hash} } @docs), 'export: every line carries its hash and bytes');
    my $file = $t->prefix . '/archive.jsonl';
    open(my $out, '>', $file) or die;
    print $out $json;
    close $out;
    my ($vrc, $vout) = $t->audit_tool('--stream', 'audit:plain', '--file', $file, 'verify');
    is($vrc, 0, 'verify --file of the export: intact');
    like($vout, qr/^$nentries $docs[-1]{hash}$/m, 'verify --file: the same head');
    (my $bad = $json) =~ s/("seq":3,.*?"e":")([^"]+)/$1 . b64url_edit($2)/e;
    open($out, '>', $file) or die;
    print $out $bad;
    close $out;
    ($vrc, $vout) = $t->audit_tool('--file', $file, 'verify');
    is($vrc, 1, 'verify --file of an edited archive: exit 1');
    like($vout, qr/^entry 3: modified:/m, 'verify --file names entry 3') or diag($vout);

    # an event left out of the archive
    my @cut = grep { !/"seq":4,.*"index":2,/ } @lines;
    open($out, '>', $file) or die;
    print $out map { "$_\n" } @cut;
    close $out;
    ($vrc, $vout) = $t->audit_tool('--file', $file, 'verify');
    is($vrc, 1, 'verify --file of an archive without one event: exit 1');
    like($vout, qr/^entry 4: modified: its event 2 is not in the export/m, 'verify --file names it') or diag($vout);

    ($rc, $json) = $t->audit_tool('--stream', 'audit:plain', 'export', '--from', 5);
    my @from = map { JSON::PP->new->decode($_)->{seq} } split /\n/, $json;
    is_deeply(\@from, [ map { $_->{seq} } grep { $_->{seq} >= 5 } @docs ], 'export --from 5: entries 5 to the head');
}

# show: a key is looked up in every scope (the stream has none)
{
    my $k = $t->key('two-scopes');
    for my $who ('Bearer a', 'Bearer b') {
        is($t->http(POST => '/plain/x', key => $k, json => {}, headers => [ Authorization => $who ])->{status},
           201, "the same key in scope $who executes");
        ok($t->wait_state($k, $who, 'completed'), 'recorded');
    }
    my ($rc, $out) = $t->audit_tool('--stream', 'audit:plain', 'show', $k);
    my @ops = $out =~ / op=([0-9a-f]{32})/g;
    my %ops = map { $_ => 1 } @ops;
    is(scalar keys %ops, 2, 'show by key: the two operations of the two scopes');
    is(scalar @ops, 8, 'show by key: their eight entries');
    ($rc, $out) = $t->audit_tool('--stream', 'audit:plain', 'show', 'no-such-key');
    is($rc, 1, 'show of an unknown key: exit 1');
    is($t->effects, 11, 'upstream effects: 4 + 4 writes, 1 after the cut, 2 in two scopes');
}

# base64url of the encoding with its first event's identity "x"
sub b64url_edit {
    my ($b64) = @_;
    require MIME::Base64;
    (my $std = $b64) =~ tr{-_}{+/};
    my $e = MIME::Base64::decode_base64($std . '=' x ((4 - length($std) % 4) % 4));
    my $f = $t->audit_decode($e);
    $f->{events}[0]{identity} = 'x';
    my $out = MIME::Base64::encode_base64($t->audit_encode($f), '');
    $out =~ tr{+/}{-_};
    $out =~ s/=+$//;
    return $out;
}

$t->check_logs;
done_testing;
