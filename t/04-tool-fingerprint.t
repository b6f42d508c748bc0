#!/usr/bin/perl
# build/idempotency-fingerprint ("make tools") against a fingerprint
# computed here from the definition in docs/fingerprint.md: the preimage
# written by hand, hashed with Digest::SHA.

use strict;
use warnings;
use FindBin;
use File::Temp qw(tempfile);
use Digest::SHA qw(sha256_hex);
use Test::More;

my $tool = "$FindBin::Bin/../build/idempotency-fingerprint";

unless (-x $tool) {
    print "1..1\nnot ok 1 - build/idempotency-fingerprint missing: "
        . "run make tools\n";
    exit 1;
}

# runs the tool with $stdin as its input: (exit status, stdout, stderr)
sub run {
    my ($stdin, @args) = @_;

    my ($in, $in_name) = tempfile(UNLINK => 1);
    binmode $in;
    print $in $stdin;
    close $in;

    my (undef, $err_name) = tempfile(UNLINK => 1);

    my $pid = open(my $out, '-|');
    die "fork: $!" unless defined $pid;

    if ($pid == 0) {
        open STDIN, '<', $in_name or die "$in_name: $!";
        open STDERR, '>', $err_name or die "$err_name: $!";
        exec { $tool } $tool, @args;
        exit 127;
    }

    binmode $out;
    my $stdout = do { local $/; <$out> } // '';
    close $out;
    my $rc = $? >> 8;

    open my $e, '<', $err_name or die "$err_name: $!";
    my $stderr = do { local $/; <$e> } // '';
    close $e;

    return ($rc, $stdout, $stderr);
}

my @req = ('--method', 'POST', '--route', '/v1/orders', '--query', 'dry=0',
           '--scope', 'acct_42', '--header', 'X-Tenant: blue');

my $body = qq({"amount": 12.50, "currency": "EUR",\n)
         . qq( "items": [{"sku": "b", "qty": 1}, {"qty": 2, "sku": "a"}]});
my $reordered = qq({"items":[{"qty":1,"sku":"b"},{"sku":"a","qty":2.0}],)
              . qq("currency":"EUR","amount":1.25e1});

my $expected_preimage =
      '{"body":{"amount":12.5,"currency":"EUR","items":[{"qty":1,"sku":"b"},'
    . '{"qty":2,"sku":"a"}]},"headers":{"x-tenant":"blue"},"method":"POST",'
    . '"query":"dry=0","route":"/v1/orders","scope":"acct_42","v":1}';

my ($rc, $out, $err) = run($body, @req, '--content-type', 'application/json',
                           '--preimage');
is($rc, 0, 'preimage: exit 0');
is($out, $expected_preimage, 'preimage: exact canonical bytes');
like($err, qr/^body: json$/m, 'preimage: body form json on stderr');

($rc, $out, $err) = run($body, @req, '--content-type', 'application/json');
is($rc, 0, 'fingerprint: exit 0');
is($out, sha256_hex($expected_preimage) . "\n",
   'fingerprint = sha256 of the hand-written preimage');

my ($fh, $file) = tempfile(UNLINK => 1);
print $fh $reordered;
close $fh;

my ($rc2, $out2) = run('', @req, '--content-type',
                       'application/vnd.shop+json; charset=utf-8',
                       '--body-file', $file);
is($rc2, 0, 'reordered body from --body-file: exit 0');
is($out2, $out, 'reordered JSON body, +json type: same fingerprint');

($rc2, $out2) = run($reordered, @req[0 .. 7], '--header', 'x-tenant:red',
                    '--content-type', 'application/json');
isnt($out2, $out, 'different header value: different fingerprint');

# not a JSON type: {"sha256": hex of the raw bytes}
($rc, $out, $err) = run($body, @req, '--content-type', 'text/plain',
                        '--preimage');
is($out, '{"body":{"sha256":"' . sha256_hex($body) . '"},'
         . '"headers":{"x-tenant":"blue"},"method":"POST","query":"dry=0",'
         . '"route":"/v1/orders","scope":"acct_42","v":1}',
   'raw body: digest of the bytes in the preimage');
like($err, qr/^body: raw$/m, 'raw body: body form raw');

($rc, $out, $err) = run('{"a":1,"a":2}', '--method', 'POST', '--route', '/',
                        '--content-type', 'application/json', '--preimage');
is($out, '{"body":{"sha256":"' . sha256_hex('{"a":1,"a":2}') . '"},'
         . '"headers":{},"method":"POST","query":"","route":"/","scope":"",'
         . '"v":1}', 'invalid JSON: raw digest, empty headers/query/scope');
like($err, qr/^body: raw-invalid-json \(duplicate member name\)$/m,
     'invalid JSON: form and reason on stderr');

($rc, $out) = run('', '--method', 'POST', '--route', "/caf\xff",
                  '--preimage');
like($out, qr/"route":\{"hex":"2f636166ff"\}/,
     'non-UTF-8 route in the hex form');

($rc, $out, $err) = run('', '--route', '/');
is($rc, 2, 'missing --method: usage error');

done_testing();
