#!/usr/bin/perl
# The shape of the source tree, as docs/architecture.md describes it:
#   - every glue .c includes <ngx_config.h> then <ngx_core.h> before any
#     other header (nginx's rule: ngx_config.h sets _GNU_SOURCE and the
#     platform's feature macros; a system header included before it fixes
#     them otherwise, and nginx 1.25+ then stops at ngx_event_udp.h);
#   - the Redis transport (_redis.c and the files split from it) includes
#     no request-flow header and names no HTTP request type;
#   - each glue file that exports functions declares exactly those in its
#     own header, ngx_http_idempotency_X.h; no header includes another glue
#     file's header; the umbrella ngx_http_idempotency.h declares none;
#   - the #include lines between the glue files (X.c including Y's header
#     calls into Y.c) form no cycle;
#   - line targets of the files every feature used to grow;
#   - no C function outside fuzz/ is longer than 80 lines;
#   - no Lua script reads the record head at bare offsets (head.lua does);
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
# WAIT, the waiters, building commands and reading replies), and the header
# of their types
my @transport = qw(redis io replicas waiters command transport);
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
        my @up  = grep { !/^(idem_[a-z_]+|ngx_http_idempotency_($transport|script|script_args|metrics))\.h$/ } @inc;
        is("@up", '', "$name includes no request-flow header");
        unlike($text, qr/\bngx_http_request_t\b|\bngx_http_idem_ctx_t\b/,
               "$name names no request or request context");
    }
};

# the names a header declares: each statement at column 0 that is not a
# type, a macro or a static inline (a prototype, an extern variable)
sub declared_names {
    my $text = shift;
    $text =~ s{/\*.*?\*/}{}gs;
    my @names;
    while ($text =~ /^((?!typedef\b|static\b|#|struct \w+ \{)[a-z_][^;{}#]*?);/mg) {
        my $stmt = $1;
        if ($stmt =~ /^extern\b/) {
            push @names, $1 if $stmt =~ /([a-z_][a-z0-9_]*)\s*(?:\[[^\]]*\])?\s*$/;
        } elsif ($stmt =~ /([a-z_][a-z0-9_]*)\s*\(/) {
            push @names, $1;
        }
    }
    return @names;
}

# A glue file's header, ngx_http_idempotency_X.h, declares what X.c exports.
# The edges of the graph are then the #include lines: a glue .c including
# the header of another glue .c calls into it.  The umbrella header
# (shared types) and the transport's types header have no .c: no edge.
sub include_graph {
    my %edges;
    for my $f (glob("$mod/ngx_http_idempotency_*.c")) {
        my $n = basename($f, '.c');
        $edges{$n} ||= {};
        for my $h (slurp($f) =~ /^\s*#\s*include\s+"(ngx_http_idempotency_[a-z_]+)\.h"/mg) {
            $edges{$n}{$h} = 1 if $h ne $n && -f "$mod/$h.c";
        }
    }
    return %edges;
}

# depth-first search; a grey node reached again closes a cycle
sub find_cycle {
    my %edges = @_;
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
    $visit->($_) for grep { !$colour{$_} } sort keys %edges;
    return @cycle;
}

subtest 'each glue file declares its exports in its own header' => sub {
    my @files = sort glob("$mod/ngx_http_idempotency_*.c");
    for my $f (@files) {
        my $n = basename($f, '.c');
        my $text = slurp($f);
        # the functions, and the variables defined at column 0 without static
        my %defined = map { $_ => 1 } external_functions($text),
            $text =~ /^(?!static\b|return\b)[a-z_][a-z0-9_ ]*[ *](ngx_http_idem[a-z0-9_]*)(?:\[\])?\s*[=;]/mg;
        next if $n eq 'ngx_http_idempotency_module';   # registers, exports none
        my $h = "$mod/$n.h";
        if (!-f $h) {
            is(join(' ', sort keys %defined), '', "$n.c exports nothing, having no header");
            next;
        }
        my %declared = map { $_ => 1 } declared_names(slurp($h));
        is(join(' ', sort grep { !$declared{$_} } keys %defined), '',
           "$n.h declares every function $n.c exports");
        is(join(' ', sort grep { !$defined{$_} } keys %declared), '',
           "$n.h declares only what $n.c defines");
    }

    # a header that included another glue file's header would give its
    # prototypes to every includer without an #include line saying so
    for my $h (sort glob("$mod/ngx_http_idempotency*.h")) {
        my @up = grep { -f "$mod/$_.c" }
                 slurp($h) =~ /^\s*#\s*include\s+"(ngx_http_idempotency_[a-z_]+)\.h"/mg;
        is("@up", '', basename($h) . ' includes no other glue file\'s header');
    }
    my @protos = declared_names(slurp("$mod/ngx_http_idempotency.h"));
    is("@protos", 'ngx_http_idempotency_module',
       'the umbrella header declares no function (shared types only)');
};

subtest 'no call cycle between the glue files' => sub {
    my %edges = include_graph();
    ok(keys %edges > 20, 'found the glue files');
    is(join(' -> ', find_cycle(%edges)), '', 'the #include graph between glue files is acyclic');

    # the counters of idempotency_metrics are below the transport: a leaf
    my @up = grep { !/^ngx_http_idempotency_($transport|metrics)$/ }
             sort map { keys %{ $edges{"ngx_http_idempotency_$_"} || {} } } @transport;
    is("@up", '', 'the transport calls no other glue file than the metrics counters');
    ok(!%{ $edges{ngx_http_idempotency_metrics} }, 'the metrics counters call no other glue file');
    my @into = grep { $_ ne "ngx_http_idempotency_module" && $edges{$_}{ngx_http_idempotency_handler} } keys %edges;
    is("@into", "", "only the registration (_module.c) calls into the request flow (_handler.c)");

    # the check itself: an edge back from the bottom of the spine is found
    my %bent = map { $_ => { %{ $edges{$_} } } } keys %edges;
    $bent{ngx_http_idempotency_metrics}{ngx_http_idempotency_module} = 1;
    isnt(join(' -> ', find_cycle(%bent)), '', 'a cycle added to the graph is found');
};

# one room per concern: the files that grew with every feature stay small
my %line_limit = (
    'ngx_http_idempotency_module.c' => 1000,
    'ngx_http_idempotency_claim.c'  => 900,
);

subtest 'line targets' => sub {
    for my $f (sort keys %line_limit) {
        my $n = () = slurp("$mod/$f") =~ /\n/g;
        cmp_ok($n, '<', $line_limit{$f}, "$f has fewer than $line_limit{$f} lines");
    }
};

subtest 'config builds every glue file' => sub {
    my $config = slurp("$root/config");
    my @missing = grep { $config !~ /\$IDEM_SRC\/\Q$_\E\b/ }
                  map { basename($_) } glob("$mod/ngx_http_idempotency*.[ch]");
    is("@missing", '', 'each ngx_http_idempotency*.c and .h is named in config');
};

# A string.sub (or string.byte, or :sub/:byte) whose offsets are all
# numbers reads a fixed place of a value: in the scripts that is the
# record's head, whose offsets idem_record.h defines and config copies into
# head.lua.  Anywhere else it would be a second definition that the build
# does not keep in step.
subtest 'Lua reads the record head only through head.lua' => sub {
    my @files = grep { basename($_) ne 'head.lua' } glob("$root/redis-scripts/*.lua");
    ok(@files > 5, 'found the scripts');
    my $num  = qr/\s*-?\d+(?:\s*[-+]\s*\d+)*\s*/;
    my $arg  = qr/[^,()]*(?:\([^()]*\)[^,()]*)*/;
    my $bare = qr/(?:\bstring\.(?:sub|byte)\s*\($arg,|:(?:sub|byte)\s*\()$num(?:,$num)?\)/;
    my @bad;
    for my $f (@files) {
        my $n = 0;
        for my $line (split /\n/, slurp($f)) {
            $n++;
            next if $line =~ /^\s*--/;
            push @bad, basename($f) . ":$n: $1" while $line =~ /($bare)/g;
        }
    }
    is(join('; ', @bad), '', 'no bare offset into a value outside head.lua');
    my $head = slurp("$root/redis-scripts/head.lua");
    like($head, qr/^--: head ${_}_of\(V\) /m, "head.lua defines ${_}_of")
        for qw(state waiters op fp owner);
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
