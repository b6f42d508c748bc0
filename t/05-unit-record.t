#!/usr/bin/perl
# Runs the C unit test build/unit/test_record (TAP on stdout); build it with
# "make unit".  A missing binary fails rather than skips.

use strict;
use warnings;
use FindBin;

my $bin = "$FindBin::Bin/../build/unit/test_record";

unless (-x $bin) {
    print "1..1\nnot ok 1 - build/unit/test_record missing: run make unit\n";
    exit 1;
}

exec { $bin } $bin or do {
    print "1..1\nnot ok 1 - cannot exec $bin: $!\n";
    exit 1;
};
