#!/usr/bin/perl
# The shape of the source tree, as docs/architecture.md describes it:
#   - every glue .c includes <ngx_config.h> then <ngx_core.h> before any
#     other header (nginx's rule: ngx_config.h sets _GNU_SOURCE and the
#     platform's feature macros; a system header included before it fixes
#     them otherwise, and nginx 1.25+ then stops at ngx_event_udp.h);
#   - the Redis transport (_redis.c and the files split from it) includes
#     no request-flow header and names no HTTP request type;
#   - the calls between the nginx glue files form no cycle;
#   - no C function outside fuzz/ is longer than 80 lines;
#   - nothing in the tree points to a file outside the repository;
#   - the built module exports no symbol of test-only code.
# Each check names what broke it.

use strict;
use warnings;
use FindBin;
use File::Basename qw(basename);
use Test::More;

my $root = "$FindBin::Bin/..";
my $mod  = "$root/ngx_http_idempotency_module";

sub slurp { my $f = shift; open(my $fh, '<', $f) or die "$f: $!"; local $/; <$fh> }

# definitions: a name at column 0 followed by "(" whose line above is not
# "static ..." (nginx style puts the return type on its own line)
sub external_functions {
    my $text = shift;
    my @names;
    my $prev = '';
    for my $line (split /\n/, $text) {
        push @names, $1 if $line =~ /^([a-z_][a-z0-9_]*)\(/ && $prev !~ /^static\b/;
        $prev = $line;
    }
    return @names;
}

sub c_files { map { glob("$root/$_/*.c") } @_ }

# the transport: _redis.c and the files split from it (the hiredis adapter,
# WAIT, the waiters, building commands and reading replies)
my @transport = qw(redis io replicas waiters command);
my $transport = join '|', @transport;

subtest 'nginx headers first in every glue file' => sub {
    my @files = sort glob("$mod/ngx_http_idempotency*.c");
    ok(@files > 10, 'found the glue files');
    for my $f (@files) {
        my @inc = slurp($f) =~ /^\s*#\s*include\s+([<"][^>"]+[>"])/mg;
        is("@inc[0, 1]", '<ngx_config.h> <ngx_core.h>',
           basename($f) . ': <ngx_config.h> then <ngx_core.h> before any other #include');
    }
};

subtest 'the transport knows nothing of requests' => sub {
    for my $f (map { ("$mod/ngx_http_idempotency_$_.c", "$mod/ngx_http_idempotency_$_.h") } @transport) {
        next unless -f $f;
        my $text = slurp($f);
        my $name = basename($f);
        my @inc = $text =~ /^#include\s+"([^"]+)"/mg;
        my @up  = grep { !/^(idem_[a-z_]+|ngx_http_idempotency_($transport|transport|script|metrics))\.h$/ } @inc;
        is("@up", '', "$name includes no request-flow header");
        unlike($text, qr/\bngx_http_request_t\b|\bngx_http_idem_ctx_t\b/,
               "$name names no request or request context");
    }
};

subtest 'no call cycle between the glue files' => sub {
    my @files = sort glob("$mod/ngx_http_idempotency_*.c");
    my (%text, %owner, %edges);
    for my $f (@files) {
        my $n = basename($f, '.c');
        $text{$n} = slurp($f);
        $owner{$_} = $n for external_functions($text{$n});
    }
    ok(keys %owner > 20, 'found the glue files\' functions');

    for my $n (keys %text) {
        for my $fn (keys %owner) {
            next if $owner{$fn} eq $n;
            $edges{$n}{$owner{$fn}} = 1 if $text{$n} =~ /\b\Q$fn\E\b/;
        }
    }

    # depth-first search; a grey node reached again closes a cycle
    my (%colour, @cycle);
    my $visit;
    $visit = sub {
        my ($n, @path) = @_;
        $colour{$n} = 1;
        for my $m (sort keys %{ $edges{$n} || {} }) {
            if (($colour{$m} // 0) == 1) {
                @cycle = (@path, $n, $m) unless @cycle;
            } elsif (!$colour{$m}) {
                $visit->($m, @path, $n);
            }
        }
        $colour{$n} = 2;
    };
    $visit->($_) for grep { !$colour{$_} } sort keys %text;
    is(join(' -> ', @cycle), '', 'the calls between glue files are acyclic');

    # the counters of idempotency_metrics are below the transport: a leaf
    my @up = grep { !/^ngx_http_idempotency_($transport|metrics)$/ }
             sort map { keys %{ $edges{"ngx_http_idempotency_$_"} || {} } } @transport;
    is("@up", '', 'the transport calls no other glue file than the metrics counters');
    ok(!$edges{ngx_http_idempotency_metrics}, 'the metrics counters call no other glue file');
    my @into = grep { $_ ne "ngx_http_idempotency_module" && $edges{$_}{ngx_http_idempotency_handler} } keys %edges;
    is("@into", "", "only the registration (_module.c) calls into the request flow (_handler.c)");
};

subtest 'config builds every glue file' => sub {
    my $config = slurp("$root/config");
    my @missing = grep { $config !~ /\$IDEM_SRC\/\Q$_\E\b/ }
                  map { basename($_) } glob("$mod/ngx_http_idempotency*.[ch]");
    is("@missing", '', 'each ngx_http_idempotency*.c and .h is named in config');
};

subtest 'no function over 80 lines outside fuzz/' => sub {
    my @files = c_files('ngx_http_idempotency_module', 'tools', 't/unit', 'bench');
    ok(@files > 20, 'found the C sources');
    my @long;
    for my $f (@files) {
        my @lines = split /\n/, slurp($f);
        my ($name, $start);
        for my $i (0 .. $#lines) {
            if ($lines[$i] =~ /^([a-z_][a-z0-9_]*)\(/) {
                $name = $1;
            } elsif ($lines[$i] eq '{' && defined $name) {
                $start = $i;
            } elsif ($lines[$i] eq '}' && defined $start) {
                my $len = $i - $start + 1;
                push @long, basename($f) . ": $name ($len lines)" if $len > 80;
                undef $name;
                undef $start;
            } elsif ($lines[$i] =~ /^[;}]/ || $lines[$i] =~ /^\S.*;\s*$/ && !defined $start) {
                undef $name;
            }
        }
    }
    is(join(', ', @long), '', 'every function fits in 80 lines');
};

subtest 'the tree explains itself' => sub {
    my @files = grep { -f } map { glob("$root/$_") }
        qw(config Makefile README.md .ci/run ngx_http_idempotency_module/* redis-scripts/*
           t/*.t t/lib/*.pl t/lib/Idem/*.pm t/unit/* tools/* fuzz/*.c fuzz/*.h fuzz/README.md
           bench/* demo/* docs/*);
    ok(@files > 50, 'found the files');
    my @bad;
    for my $f (@files) {
        next if $f =~ m{/t/02-tree\.t$};
        my $text = slurp($f);
        push @bad, basename($f) if $text =~ m{\.\./shared|\bDESIGN\b|ENGINEERING\.md};
    }
    is("@bad", '', 'no file points outside the repository');
};

subtest 'the module exports no test-only code' => sub {
    my $so = "$root/build/ngx_http_idempotency_module.so";
    ok(-f $so, 'the module is built') or return;
    my @exported = map { (split ' ')[2] } grep { /^\S+ [TDBR] / } `nm -D --defined-only '$so'`;
    ok(@exported > 20, 'nm -D lists the module\'s symbols');
    my %exported = map { $_ => 1 } @exported;

    my @test_only;
    for my $f (c_files('t/unit', 'bench', 'fuzz', 'tools')) {
        push @test_only, map { [$_, basename($f)] } external_functions(slurp($f));
    }
    ok(@test_only > 10, 'found the test-only functions');
    my @leaked = map { "$_->[0] ($_->[1])" } grep { $exported{ $_->[0] } } @test_only;
    is("@leaked", '', 'no test, fuzz, bench or tool function is in the module');
    ok(!grep({ /^cJSON_/ } @exported), 'the module does not carry its own cJSON');
};

done_testing();
