#!/usr/bin/perl
# The C unit tests: for every t/unit/test_*.c, runs build/unit/test_*
# (built by "make unit") with t/data/jcs as its argument and reads its TAP.
# Each program is one subtest with its own results; a program that is
# missing, exits non-zero, dies or does not keep its plan fails, so a test
# that was not built can never pass by being skipped.

use strict;
use warnings;
use FindBin;
use File::Basename qw(basename);
use Test::More;

my $t    = $FindBin::Bin;
my $data = "$t/data/jcs";
my @srcs = sort glob("$t/unit/test_*.c");

ok(@srcs > 0, 'there are unit tests in t/unit') or done_testing(), exit;

for my $src (@srcs) {
    my $name = basename($src, '.c');
    my $bin  = "$t/../build/unit/$name";

    subtest $name => sub { run_unit($name, $bin) };
}

done_testing();


sub run_unit {
    my ($name, $bin) = @_;

    unless (-x $bin) {
        fail("build/unit/$name missing: run make unit");
        return;
    }

    my $fh;
    unless (open($fh, '-|', $bin, $data)) {
        fail("cannot run $bin: $!");
        return;
    }

    my ($plan, $ran) = (undef, 0);

    while (my $line = <$fh>) {
        chomp $line;

        if ($line =~ /^1\.\.(\d+)$/) {
            $plan = $1;
        } elsif ($line =~ /^(not )?ok \d+(?: - (.*))?$/) {
            $ran++;
            ok(!defined $1, $2 // "$name test $ran");
        } elsif ($line =~ /^Bail out!/) {
            fail("$name: $line");
        } elsif ($line ne '') {
            note($line);
        }
    }

    close($fh);
    my $status = $?;

    ok($ran > 0, "$name ran tests");
    is($ran, $plan, "$name kept its plan") if defined $plan;
    ok(defined $plan, "$name printed a plan") unless defined $plan;
    is($status, 0, "$name exited 0"
       . ($status & 127 ? sprintf(' (killed by signal %d)', $status & 127)
                        : ''));
}
