package Idem::Test;

# Integration-test harness: one temp prefix per test file, a real redis-server,
# the counting upstream (t/lib/upstream.pl) and the stock nginx with the built
# module, all on free loopback ports, all started and stopped by PID.
#
#   use lib 't/lib';  use Idem::Test;
#   my $t = Idem::Test->new;            # fails loudly if the .so or redis-server is missing
#   $t->start_stack(<<'EOF');          # Redis, the upstream, then nginx
#   server { listen 127.0.0.1:%%PORT%%;
#            location / { idempotency on; idempotency_redis %%REDIS%%;
#                         proxy_pass http://%%UPSTREAM%%; } }
#   EOF
#   my $r = $t->http(POST => '/things', key => $t->key, json => {a => 1});
#   is $t->effects, 1;
#   ...
#   $t->check_logs; done_testing;
#
# Environment: IDEM_MODULE (path of the .so), IDEM_NGINX (nginx binary),
# IDEM_REDIS_SERVER (redis-server binary), IDEM_TEST_KEEP=1 (keep the prefix,
# its path is printed), IDEM_ALLOW_SKIP=1 (skip instead of failing when the
# module or redis-server is missing).
#
# IDEM_SANITIZE=1 (what `make test-asan` sets, with IDEM_MODULE pointing at
# build-asan/ngx_http_idempotency_module.so): nginx (and `nginx -t`) runs with
# the ASan/UBSan runtimes preloaded (LD_PRELOAD, from `gcc -print-file-name`,
# or IDEM_SANITIZE_PRELOAD), ASAN_OPTIONS/UBSAN_OPTIONS writing reports to
# PREFIX/sanitizer/, and `env` lines in the main context so that workers keep
# them. check_logs then fails on any sanitizer report there, except leak
# reports whose stacks do not go through the module (nginx itself leaves some
# arrays unfreed at exit). IDEM_SANITIZE_LEAKS=0 turns leak detection off;
# IDEM_ASAN_OPTIONS adds ASan flags (see nginx_env).

use strict;
use warnings;

use Cwd qw(abs_path);
use Fcntl qw(:flock);
use File::Basename qw(dirname);
use File::Path qw(make_path);
use File::Spec;
use File::Temp qw(tempdir);
use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use POSIX qw(WNOHANG);
use Test::More;
use Time::HiRes qw(time sleep);

our $LIB  = abs_path(File::Spec->catdir(dirname(__FILE__), '..'));
our $REPO = abs_path(File::Spec->catdir($LIB, '..', '..'));

require "$LIB/upstream.pl";    # Idem::Upstream::body_bytes

my $JSON = JSON::PP->new->canonical->allow_nonref->latin1;
my @INSTANCES;
my $KEY_COUNTER = 0;

# ---------------------------------------------------------------- setup

sub new {
    my ($class, %o) = @_;

    my $module = $ENV{IDEM_MODULE} // "$REPO/build/ngx_http_idempotency_module.so";
    my $nginx  = $ENV{IDEM_NGINX} // '/usr/sbin/nginx';
    my $redis  = $ENV{IDEM_REDIS_SERVER} // _which('redis-server') // '/usr/bin/redis-server';

    my @missing;
    push @missing, "module $module (run `make module`)" unless -f $module;
    push @missing, "nginx binary $nginx" unless -x $nginx;
    push @missing, "redis-server ($redis)" unless -x $redis;
    if (@missing) {
        if ($ENV{IDEM_ALLOW_SKIP}) {
            plan skip_all => 'missing: ' . join(', ', @missing);
        }
        fail("prerequisite present: $_") for @missing;
        diag('integration tests need these; set IDEM_ALLOW_SKIP=1 to skip instead');
        done_testing();
        exit 1;
    }

    my $keep = $ENV{IDEM_TEST_KEEP} ? 1 : 0;
    my $sanitize = ($o{sanitize} // $ENV{IDEM_SANITIZE}) ? 1 : 0;
    my $prefix = tempdir('idem-test-XXXXXX', TMPDIR => 1, CLEANUP => !$keep);
    # nginx workers run as an unprivileged user when the master is root:
    # they must traverse the prefix (temp files, redis unix socket).
    chmod 0755, $prefix;
    diag("test prefix kept: $prefix") if $keep;

    my $self = bless {
        %o,
        module   => abs_path($module),
        nginx    => $nginx,
        redis_bin => $redis,
        prefix   => $prefix,
        owner    => $$,
        test_confs => 0,
        sanitize => $sanitize,
    }, $class;
    make_path("$prefix/redis");
    if ($sanitize) {
        # workers run as nobody when the master is root: they write here too
        make_path("$prefix/sanitizer");
        chmod 01777, "$prefix/sanitizer";
    }
    chmod 0755, "$prefix/redis";
    push @INSTANCES, $self;
    return $self;
}

sub prefix { $_[0]{prefix} }
sub module { $_[0]{module} }

# The text of a module script as Redis runs it (the shared prelude, its
# arguments as locals, the script): the build writes it next to the module,
# in objs/redis-scripts/NAME.lua.
sub script_text {
    my ($self, $name) = @_;
    my $f = dirname($self->{module}) . "/objs/redis-scripts/$name.lua";
    return _slurp($f) || die "script_text: $f is missing or empty (run make)\n";
}

# A fresh idempotency key, unique across test files and runs.
sub key {
    my ($self, $tag) = @_;
    $KEY_COUNTER++;
    return 'k-' . ($tag // 't') . '-' . int(time) . "-$$-$KEY_COUNTER";
}

sub _which {
    my ($prog) = @_;
    for my $d (split /:/, $ENV{PATH} // '') {
        return "$d/$prog" if -x "$d/$prog";
    }
    return undef;
}

# Ports. Test files run in parallel (prove -j), and beside them the
# machine's own connections: "bind port 0, close, hand the number on" is
# racy twice over, since another test file's bind(0) or any connect()'s
# ephemeral source port can take the number before our server binds it.
# So ports come from below the kernel's ephemeral range (never handed out
# implicitly), and each is reserved for the life of this test process by a
# lock on a file named after it (flock: released by the kernel when the
# process ends, however it ends); only a port that is also bindable right
# now is taken.
my %PORT_HELD;    # port => the locked file handle
my $PORT_DIR = File::Spec->catdir(File::Spec->tmpdir, 'idem-test-ports');

sub _port_range {
    my ($lo, $hi) = (10000, 32767);
    if (open my $fh, '<', '/proc/sys/net/ipv4/ip_local_port_range') {
        my ($elo, $ehi) = split ' ', scalar <$fh>;
        if ($elo && $elo - 1 - $lo >= 15000) { $hi = $elo - 1 }
        elsif ($ehi && 65535 - $ehi >= 15000) { ($lo, $hi) = ($ehi + 1, 65535) }
        else { die "free_port: no room outside the ephemeral range $elo-$ehi\n" }
    }
    return ($lo, $hi);
}

sub _claim_port {
    my ($p) = @_;
    return 0 if $PORT_HELD{$p};
    unless (-d $PORT_DIR) { make_path($PORT_DIR); chmod 01777, $PORT_DIR }
    open my $fh, '>>', "$PORT_DIR/$p" or return 0;
    flock($fh, LOCK_EX | LOCK_NB) or return 0;
    # the servers set SO_REUSEADDR too: a TIME_WAIT left on it is no obstacle
    my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $p,
                                  Proto => 'tcp', Listen => 1, ReuseAddr => 1)
        or return 0;
    close $s;
    $PORT_HELD{$p} = $fh;
    return 1;
}

# free_port(): a port nothing listens on, reserved for this test file (also
# a "dead" address for a test that needs a refused connection).
sub free_port {
    my ($lo, $hi) = _port_range();
    for (1 .. 2000) {
        my $p = $lo + int(rand($hi - $lo + 1));
        return $p if _claim_port($p);
    }
    die "free_port: no free port in $lo-$hi\n";
}

sub _port_open {
    my ($port) = @_;
    my $s = IO::Socket::INET->new(
        PeerAddr => '127.0.0.1', PeerPort => $port, Proto => 'tcp', Timeout => 1,
    );
    return 0 unless $s;
    close $s;
    return 1;
}

# Polls $cond every 50 ms until it returns true or $timeout seconds pass;
# returns the last value of $cond.
sub wait_for {
    my ($self, $cond, $timeout) = @_;
    $timeout //= 5;
    my $end = time + $timeout;
    while (1) {
        my $v = $cond->();
        return $v if $v || time >= $end;
        sleep 0.05;
    }
}

sub _spawn {
    my (%o) = @_;    # argv, stdout, pgrp, env (hashref added to the environment)
    my $pid = fork;
    die "fork: $!" unless defined $pid;
    if ($pid == 0) {
        POSIX::setpgid(0, 0) if $o{pgrp};
        $ENV{$_} = $o{env}{$_} for keys %{ $o{env} // {} };
        open STDIN, '<', '/dev/null';
        if ($o{stdout}) {
            open STDOUT, '>>', $o{stdout};
            open STDERR, '>&', \*STDOUT;
        }
        { no warnings "exec"; exec { $o{argv}[0] } @{ $o{argv} }; }
        print STDERR "exec $o{argv}[0]: $!\n";
        POSIX::_exit(127);
    }
    return $pid;
}

# Sends $sig to $pid (or to its process group with $group), then waits up to
# $wait seconds for it to go away, then KILLs it. Returns true when it went
# away before the KILL.
sub _stop_pid {
    my ($pid, $sig, $wait, %o) = @_;
    return 1 unless $pid;
    my $target = $o{group} ? -$pid : $pid;
    kill $sig, $target;
    my $end = time + $wait;
    while (time < $end) {
        my $r = waitpid($pid, WNOHANG);
        return 1 if $r == $pid || ($r == -1 && !kill(0, $pid));
        sleep 0.02;
    }
    kill 'KILL', $target;
    waitpid($pid, 0);
    return 0;
}

# ---------------------------------------------------------------- redis

# start_redis(appendonly => 1, unixsocket => 1, port => P, args => [...],
#             auth => [password] or [user, password]: what the harness's own
#             commands send as AUTH, for a server started with requirepass)
sub start_redis {
    my ($self, %o) = @_;
    %o = (%{ $self->{redis_opts} // {} }, %o);
    $self->{redis_opts} = \%o;
    $self->{redis_auth} = $o{auth};
    my $port = $self->{redis_port} = $o{port} // $self->{redis_port} // free_port();
    my $dir = "$self->{prefix}/redis";
    my @argv = ($self->{redis_bin},
        '--port', $port, '--bind', '127.0.0.1', '--save', '',
        '--appendonly', ($o{appendonly} ? 'yes' : 'no'),
        '--dir', $dir, '--daemonize', 'no', '--logfile', "$dir/redis.log");
    if ($o{unixsocket}) {
        push @argv, '--unixsocket', $self->redis_socket, '--unixsocketperm', '777';
    }
    push @argv, @{ $o{args} // [] };
    $self->{redis_pid} = _spawn(argv => \@argv, stdout => "$dir/redis.stdout");

    my $ok = $self->wait_for(sub {
        return 1 if ($self->redis('PING') // '') eq 'PONG';
        if (waitpid($self->{redis_pid}, WNOHANG) == $self->{redis_pid}) {
            delete $self->{redis_pid};
            return -1;
        }
        0;
    }, 10);
    if (!$ok || $ok == -1) {
        my $log = _slurp("$dir/redis.log") . _slurp("$dir/redis.stdout");
        die "redis-server did not start on port $port:\n$log";
    }
    return $port;
}

sub stop_redis {
    my ($self) = @_;
    my $pid = delete $self->{redis_pid} or return;
    _stop_pid($pid, 'TERM', 10);
}

sub restart_redis {
    my ($self, %o) = @_;
    $self->stop_redis;
    $self->start_redis(%o);
}

sub redis_port   { $_[0]{redis_port} }
sub redis_addr   { '127.0.0.1:' . $_[0]{redis_port} }
sub redis_socket { "$_[0]{prefix}/redis/redis.sock" }
sub redis_running { $_[0]{redis_pid} ? 1 : 0 }

# ------------------------------------------------- more redis instances

# start_redis_instance(name => 'r2', port => P, args => [...]): another
# redis-server (a replica with args => ['--replicaof', '127.0.0.1', $port],
# say) in $prefix/NAME, stopped by PID with the stack; its port.
sub start_redis_instance {
    my ($self, %o) = @_;
    my $name = $o{name} or die "start_redis_instance: name";
    my $dir = "$self->{prefix}/$name";
    make_path($dir);
    chmod 0755, $dir;
    my $port = $o{port} // ($self->{instances}{$name} // {})->{port} // free_port();
    my @argv = ($self->{redis_bin},
        '--port', $port, '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
        '--dir', $dir, '--daemonize', 'no', '--logfile', "$dir/redis.log",
        @{ $o{args} // [] });
    return $self->_start_instance($name, $port, \@argv, "$dir/redis.log");
}

# start_sentinel(name => 's1', monitor => [[master_name, port, quorum], ...],
#                down_after => ms (1000), failover_timeout => ms (5000),
#                lines => [extra sentinel.conf lines]): a Redis Sentinel with
# its config file in $prefix/NAME (Sentinel rewrites it); its port.
sub start_sentinel {
    my ($self, %o) = @_;
    my $name = $o{name} or die "start_sentinel: name";
    my $dir = "$self->{prefix}/$name";
    make_path($dir);
    chmod 0755, $dir;
    my $port = $o{port} // ($self->{instances}{$name} // {})->{port} // free_port();
    my $conf = "port $port\nbind 127.0.0.1\ndir $dir\nlogfile $dir/sentinel.log\n"
        . "daemonize no\n";
    for my $m (@{ $o{monitor} // [] }) {
        my ($mn, $mport, $quorum) = @$m;
        $conf .= "sentinel monitor $mn 127.0.0.1 $mport " . ($quorum // 2) . "\n"
            . "sentinel down-after-milliseconds $mn " . ($o{down_after} // 1000) . "\n"
            . "sentinel failover-timeout $mn " . ($o{failover_timeout} // 5000) . "\n"
            . "sentinel parallel-syncs $mn 1\n";
    }
    $conf .= "$_\n" for @{ $o{lines} // [] };
    _spew("$dir/sentinel.conf", $conf);
    return $self->_start_instance($name, $port,
        [ $self->{redis_bin}, "$dir/sentinel.conf", '--sentinel' ], "$dir/sentinel.log");
}

# sentinel_ready($sentinel_port, $name, $replicas): that sentinel knows the
# two others watching $name and $replicas replicas of it that it could
# promote (flags "slave" alone, link to the master up).  A SENTINEL FAILOVER
# sent before it has read a replica's own INFO answers NOGOODSLAVE.
sub sentinel_ready {
    my ($self, $s, $name, $replicas) = @_;
    my $m = $self->redis_at($s, 'SENTINEL', 'master', $name);
    return 0 unless ref $m eq 'ARRAY' && ({ @$m }->{'num-other-sentinels'} // 0) >= 2;
    my $r = $self->redis_at($s, 'SENTINEL', 'replicas', $name);
    return 0 unless ref $r eq 'ARRAY';
    my @good = grep { my %f = @$_; ($f{flags} // '') eq 'slave' && ($f{'master-link-status'} // '') eq 'ok' } @$r;
    return @good >= $replicas;
}

sub _start_instance {
    my ($self, $name, $port, $argv, $log) = @_;
    my $pid = _spawn(argv => $argv, stdout => "$log.stdout");
    $self->{instances}{$name} = { pid => $pid, port => $port };
    my $ok = $self->wait_for(sub {
        return 1 if ($self->redis_at($port, 'PING') // '') eq 'PONG';
        return -1 if waitpid($pid, WNOHANG) == $pid;
        0;
    }, 10);
    die "$name did not start on port $port:\n" . _slurp($log) . _slurp("$log.stdout")
        if !$ok || $ok == -1;
    return $port;
}

# start_cluster(masters => 3, replicas => 1, node_timeout => ms (2000)):
# a Redis Cluster of cluster-enabled redis-servers named c1, c2, ... in the
# prefix (masters first, as "redis-cli --cluster create" pairs them), slots
# spread by redis-cli; waits until every node says cluster_state:ok.  The
# nodes' ports, masters first; each is stopped by PID like any instance.
# a free port P whose cluster bus port P + 10000 is free too, both reserved
sub _cluster_port {
    my ($lo, $hi) = _port_range();
    for (1 .. 2000) {
        my $p = $lo + int(rand($hi - 10000 - $lo + 1));
        next unless _claim_port($p);
        return $p if _claim_port($p + 10000);
        close delete $PORT_HELD{$p};
    }
    die "no free cluster port pair";
}

sub start_cluster {
    my ($self, %o) = @_;
    my $masters = $o{masters} // 3;
    my $n = $masters * (1 + ($o{replicas} // 1));
    my @ports;
    for my $i (1 .. $n) {
        push @ports, $self->start_redis_instance(name => "c$i", port => _cluster_port(), args => [
            '--cluster-enabled', 'yes',
            '--cluster-config-file', "$self->{prefix}/c$i/nodes.conf",
            '--cluster-node-timeout', $o{node_timeout} // 2000 ]);
    }
    my $cli = _which('redis-cli') // '/usr/bin/redis-cli';
    my $out = `$cli --cluster create @{[ map { "127.0.0.1:$_" } @ports ]} --cluster-replicas @{[ $o{replicas} // 1 ]} --cluster-yes 2>&1`;
    die "redis-cli --cluster create failed:\n$out" if $?;
    $self->{cluster} = [@ports];
    $self->wait_cluster_ok(20) or die "the cluster did not reach cluster_state:ok";
    return @ports;
}

# wait_cluster_ok(seconds): every running node of the cluster says
# cluster_state:ok and knows the same number of nodes
sub wait_cluster_ok {
    my ($self, $secs) = @_;
    return $self->wait_for(sub {
        for my $i (1 .. @{ $self->{cluster} }) {
            next unless $self->instance_pid("c$i");
            my $info = $self->redis_at($self->instance_port("c$i"), 'CLUSTER', 'INFO');
            return 0 if ref($info) || $info !~ /cluster_state:ok/;
        }
        1;
    }, $secs // 20);
}

# cluster_masters(): { port => [[first, last], ...] } from CLUSTER SLOTS of a
# running node
sub cluster_masters {
    my ($self) = @_;
    my %m;
    push @{ $m{ $_->{master} } }, [ $_->{first}, $_->{last} ] for @{ $self->cluster_shards };
    return \%m;
}

# cluster_shards(): [ { first, last, master => port, replicas => [ports] }, ... ]
# from CLUSTER SLOTS of a running node, one entry per slot range
sub cluster_shards {
    my ($self) = @_;
    for my $i (1 .. @{ $self->{cluster} // [] }) {
        next unless $self->instance_pid("c$i");
        my $slots = $self->redis_at($self->instance_port("c$i"), 'CLUSTER', 'SLOTS');
        next if ref($slots) ne 'ARRAY';
        return [ map { { first => $_->[0], last => $_->[1], master => $_->[2][1],
                         replicas => [ map { $_->[1] } @$_[3 .. $#$_] ] } } @$slots ];
    }
    return [];
}

# cluster_owners(): [ slot => its master's port ] from CLUSTER SLOTS of a
# running node
sub cluster_owners {
    my ($self) = @_;
    my @owner;
    for my $s (@{ $self->cluster_shards }) {
        $owner[$_] = $s->{master} for $s->{first} .. $s->{last};
    }
    return \@owner;
}

# cluster_agree($slot, $port, @skip): every running cluster node, but those
# on the ports in @skip, says in CLUSTER SLOTS that the master on $port
# serves $slot
sub cluster_agree {
    my ($self, $slot, $port, @skip) = @_;
    my %skip = map { $_ => 1 } @skip;
    for my $i (1 .. @{ $self->{cluster} // [] }) {
        my $p = $self->instance_port("c$i");
        next if $skip{$p} || !$self->instance_pid("c$i");
        my $sl = $self->redis_at($p, 'CLUSTER', 'SLOTS');
        return 0 unless ref $sl eq 'ARRAY'
            && grep { $_->[0] <= $slot && $slot <= $_->[1] && $_->[2][1] == $port } @$sl;
    }
    return 1;
}

# key_where($tag, sub { $slot }): a fresh key (key($tag)) whose record lies
# in a slot the sub accepts
sub key_where {
    my ($self, $tag, $want) = @_;
    for (1 .. 200000) {
        my $k = $self->key($tag);
        return $k if $want->($self->key_slot($self->record_name($k)));
    }
    die "no key for $tag";
}

# key_slot($redis_key): its Redis Cluster slot, CRC16/XMODEM of the key (or
# of its hash tag: what lies between the first "{" and the next "}", when
# that is not empty) modulo 16384, as Redis computes it
sub key_slot {
    my ($self, $key) = @_;
    $key = $1 if $key =~ /\{(.*?)\}/s && length $1;
    my $crc = 0;
    for my $c (unpack 'C*', $key) {
        $crc ^= $c << 8;
        $crc = $crc & 0x8000 ? (($crc << 1) ^ 0x1021) & 0xffff : ($crc << 1) & 0xffff for 1 .. 8;
    }
    return $crc & 16383;
}

sub instance_port { ($_[0]{instances}{$_[1]} // {})->{port} }
sub instance_pid  { ($_[0]{instances}{$_[1]} // {})->{pid} }

# stop_instance(name, signal => 'KILL'): TERM by default, by PID.
sub stop_instance {
    my ($self, $name, %o) = @_;
    my $i = $self->{instances}{$name} or return;
    my $pid = delete $i->{pid} or return;
    _stop_pid($pid, $o{signal} // 'TERM', 10);
}

# redis_at($port, @cmd): redis(@cmd) to another instance, without AUTH.
sub redis_at {
    my ($self, $port, @cmd) = @_;
    local $self->{redis_port} = $port;
    local $self->{redis_auth} = undef;
    return $self->redis(@cmd);
}

# redis_at_multi($port, [cmd...], ...): redis_multi to another instance.
sub redis_at_multi {
    my ($self, $port, @cmds) = @_;
    local $self->{redis_port} = $port;
    local $self->{redis_auth} = undef;
    return $self->redis_multi(@cmds);
}

# redis(@cmd): one command over a fresh connection; the decoded reply:
# simple/bulk strings as strings, nil as undef, integers as numbers, arrays as
# arrayrefs, errors (and connection failures) as Idem::Test::RedisError objects.
sub redis {
    my ($self, @cmd) = @_;
    my @r = $self->redis_multi(\@cmd);
    return $r[-1];
}

# redis_multi([cmd...], [cmd...]): several commands on one connection (so
# SELECT applies to the following ones); the list of replies.
sub redis_multi {
    my ($self, @cmds) = @_;
    my $s = IO::Socket::INET->new(
        PeerAddr => '127.0.0.1', PeerPort => $self->{redis_port}, Proto => 'tcp',
        Timeout => 3,
    ) or return (Idem::Test::RedisError->new("ERRCONN connect: $!"));
    binmode $s;
    # a password-protected server (redis_auth => [password] or [user, password])
    @cmds = ([ 'AUTH', @{ $self->{redis_auth} } ], @cmds) if $self->{redis_auth};
    my $req = join '', map {
        my @cmd = @$_;
        '*' . @cmd . "\r\n" . join('', map { '$' . length($_) . "\r\n$_\r\n" } @cmd)
    } @cmds;
    my $off = 0;
    while ($off < length $req) {
        my $w = syswrite($s, $req, length($req) - $off, $off);
        return Idem::Test::RedisError->new("ERRCONN write: $!") unless $w;
        $off += $w;
    }
    my $rd = { sock => $s, buf => '', deadline => time + 10 };
    my @replies;
    for (@cmds) {
        my $reply = eval { _resp_read($rd) };
        return (@replies, Idem::Test::RedisError->new("ERRCONN read: $@")) if $@;
        push @replies, $reply;
    }
    close $s;
    shift @replies if $self->{redis_auth};
    return @replies;
}

sub is_redis_error { ref($_[-1]) && ref($_[-1]) eq 'Idem::Test::RedisError' }

sub _resp_fill {
    my ($rd, $want) = @_;
    my $sel = IO::Select->new($rd->{sock});
    until ($want->()) {
        my $left = $rd->{deadline} - time;
        die "timeout\n" if $left <= 0;
        next unless $sel->can_read($left);
        my $n = sysread($rd->{sock}, $rd->{buf}, 65536, length $rd->{buf});
        die "eof\n" unless $n;
    }
}

sub _resp_line {
    my ($rd) = @_;
    _resp_fill($rd, sub { index($rd->{buf}, "\r\n") >= 0 });
    my $i = index($rd->{buf}, "\r\n");
    my $l = substr($rd->{buf}, 0, $i);
    substr($rd->{buf}, 0, $i + 2) = '';
    return $l;
}

sub _resp_read {
    my ($rd) = @_;
    my $l = _resp_line($rd);
    my ($t, $v) = (substr($l, 0, 1), substr($l, 1));
    return $v if $t eq '+';
    return Idem::Test::RedisError->new($v) if $t eq '-';
    return 0 + $v if $t eq ':';
    if ($t eq '$') {
        return undef if $v < 0;
        _resp_fill($rd, sub { length($rd->{buf}) >= $v + 2 });
        my $s = substr($rd->{buf}, 0, $v);
        substr($rd->{buf}, 0, $v + 2) = '';
        return $s;
    }
    if ($t eq '*') {
        return undef if $v < 0;
        return [ map { _resp_read($rd) } 1 .. $v ];
    }
    die "bad RESP line: $l\n";
}

# All keys matching $pattern (SCAN, default 'idem:*'), sorted.
sub redis_keys {
    my ($self, $pattern) = @_;
    $pattern //= 'idem:*';
    my ($cursor, %k) = (0);
    do {
        my $r = $self->redis('SCAN', $cursor, 'MATCH', $pattern, 'COUNT', 1000);
        die "SCAN: $r" if is_redis_error($r);
        $cursor = $r->[0];
        $k{$_} = 1 for @{ $r->[1] };
    } while ($cursor ne '0');
    my @k = sort keys %k;
    return @k;
}

# start_silent_server(): a TCP server on a free port that accepts every
# connection and reads from it, but never answers a byte (a Redis that hangs
# after accept). Returns its port; stopped with the other processes.
# start_fake_sentinel($file): a Sentinel that names as master whatever
# "host port" $file holds when asked (SENTINEL get-master-addr-by-name),
# accepts SUBSCRIBE and never announces a switch; for the paths a real
# Sentinel hides (a stale answer, a demotion nobody announced). Its port.
sub start_fake_sentinel {
    my ($self, $file) = @_;
    my $s = IO::Socket::INET->new(
        LocalAddr => '127.0.0.1', LocalPort => 0, Proto => 'tcp', Listen => 64,
        ReuseAddr => 1,
    ) or die "fake sentinel: $!";
    my $port = $s->sockport;
    my $pid = fork;
    die "fork: $!" unless defined $pid;
    if ($pid == 0) {
        my $sel = IO::Select->new($s);
        my %buf;
        while (1) {
            for my $fh ($sel->can_read(1)) {
                if ($fh == $s) {
                    my $c = $s->accept or next;
                    $buf{$c} = '';
                    $sel->add($c);
                    next;
                }
                if (!sysread($fh, $buf{$fh}, 65536, length $buf{$fh})) {
                    $sel->remove($fh);
                    delete $buf{$fh};
                    close $fh;
                    next;
                }
                while (my @cmd = _resp_take(\$buf{$fh})) {
                    syswrite($fh, _fake_sentinel_reply($file, @cmd));
                }
            }
        }
    }
    close $s;
    push @{ $self->{silent_pids} }, $pid;
    return $port;
}

# one complete command (a RESP array of bulk strings) off the front of $$b
sub _resp_take {
    my ($b) = @_;
    return () unless $$b =~ /\A\*(\d+)\r\n/;
    my ($n, $pos, @cmd) = ($1, length($&));
    for (1 .. $n) {
        return () unless substr($$b, $pos) =~ /\A\$(\d+)\r\n/;
        my $len = $1;
        $pos += length($&);
        return () if length($$b) < $pos + $len + 2;
        push @cmd, substr($$b, $pos, $len);
        $pos += $len + 2;
    }
    substr($$b, 0, $pos) = '';
    return @cmd;
}

sub _fake_sentinel_reply {
    my ($file, @cmd) = @_;
    my $bulk = sub { join '', map { '$' . length($_) . "\r\n$_\r\n" } @_ };
    my $c = uc($cmd[0] // '');
    if ($c eq 'SENTINEL') {
        my ($host, $port) = split ' ', _slurp($file);
        return "*-1\r\n" unless $port;
        return "*2\r\n" . $bulk->($host, $port);
    }
    return "*3\r\n" . $bulk->('subscribe', $cmd[1]) . ":1\r\n" if $c eq 'SUBSCRIBE';
    return "+PONG\r\n" if $c eq 'PING';
    return "+OK\r\n";
}

sub start_silent_server {
    my ($self) = @_;
    my $s = IO::Socket::INET->new(
        LocalAddr => '127.0.0.1', LocalPort => 0, Proto => 'tcp', Listen => 64,
        ReuseAddr => 1,
    ) or die "silent server: $!";
    my $port = $s->sockport;
    my $pid = fork;
    die "fork: $!" unless defined $pid;
    if ($pid == 0) {
        my $sel = IO::Select->new($s);
        my @keep;
        while (1) {
            for my $fh ($sel->can_read(1)) {
                if ($fh == $s) {
                    my $c = $s->accept or next;
                    push @keep, $c;
                    $sel->add($c);
                } elsif (!sysread($fh, my $buf, 65536)) {
                    $sel->remove($fh);
                    @keep = grep { $_ != $fh } @keep;
                    close $fh;
                }
            }
        }
    }
    close $s;
    push @{ $self->{silent_pids} }, $pid;
    return $port;
}

# ---------------------------------------------------------------- upstream

sub start_upstream {
    my ($self, %o) = @_;
    my $port = $self->{upstream_port} = $o{port} // $self->{upstream_port} // free_port();
    $self->{upstream_pid} = _spawn(
        argv => [ $^X, "$LIB/upstream.pl", '--port', $port, '--dir', $self->{prefix} ],
        stdout => "$self->{prefix}/upstream.log",
        pgrp => 1,
    );
    my $ok = $self->wait_for(sub { _port_open($port) }, 10);
    die "upstream did not start on port $port:\n" . _slurp("$self->{prefix}/upstream.log")
        unless $ok;
    return $port;
}

# Stops the upstream and every connection it is still serving (its process group).
sub stop_upstream {
    my ($self) = @_;
    my $pid = delete $self->{upstream_pid} or return;
    _stop_pid($pid, 'TERM', 5, group => 1);
    kill 'KILL', -$pid;    # stragglers serving slow requests
}

sub upstream_port { $_[0]{upstream_port} }
sub upstream_addr { '127.0.0.1:' . $_[0]{upstream_port} }

# effect_list(key => K, uri => U, method => M): the effects recorded by the
# upstream (hashrefs n, method, uri, key, len, sha, ct, auth, t), in order.
sub effect_list {
    my ($self, %f) = @_;
    return grep {
        (!exists $f{key} || _same($_->{key}, $f{key}))
        && (!exists $f{uri} || $_->{uri} eq $f{uri})
        && (!exists $f{method} || $_->{method} eq $f{method})
    } $self->_upstream_log('effects.log');
}

# The JSON lines of one of the upstream's logs, read under its lock.
sub _upstream_log {
    my ($self, $name) = @_;
    my @e;
    open my $fh, '<', "$self->{prefix}/$name" or return ();
    open my $lock, '>>', "$self->{prefix}/effects.lock" or die "effects.lock: $!";
    flock($lock, LOCK_SH);
    while (my $l = <$fh>) {
        chomp $l;
        push @e, $JSON->decode($l) if length $l;
    }
    close $lock;
    return @e;
}

sub _same { (!defined $_[0] && !defined $_[1]) || (defined $_[0] && defined $_[1] && $_[0] eq $_[1]) }

# Number of upstream effects, optionally filtered like effect_list.
sub effects {
    my ($self, %f) = @_;
    my @e = $self->effect_list(%f);
    return scalar @e;
}

# The N-byte body the upstream answers to X-Body-Size: N.
sub upstream_body { shift; Idem::Upstream::body_bytes(@_) }

# upstream_responses(key => K, n => SEQ): the answers the upstream produced
# (hashrefs n, key, status, len, sha, truncated, t), logged before sending, in
# order; n is the effect's sequence number (X-Upstream-Seq).
sub upstream_responses {
    my ($self, %f) = @_;
    return grep {
        (!exists $f{key} || _same($_->{key}, $f{key}))
        && (!exists $f{n} || $_->{n} == $f{n})
    } $self->_upstream_log('responses.log');
}

# The lowercase hex SHA-256 of $bytes.
sub sha256 { shift; require Digest::SHA; Digest::SHA::sha256_hex($_[0] // '') }

# ---------------------------------------------------------------- faults

# kill_worker($pid?): SIGKILLs one nginx worker (the given one, or the first)
# and waits (up to 10 s) until the master has started a replacement. Returns
# the killed pid, or undef when there was none or no replacement came.
sub kill_worker {
    my ($self, $pid) = @_;
    my @w = $self->worker_pids;
    $pid //= $w[0];
    return undef unless $pid && grep { $_ == $pid } @w;
    kill 'KILL', $pid;
    my $ok = $self->wait_for(sub {
        my @now = $self->worker_pids;
        !grep({ $_ == $pid } @now) && @now >= $self->{workers};
    }, 10);
    return $ok ? $pid : undef;
}

# workers_connected_to($port): the pids of the nginx workers holding an
# established TCP connection to 127.0.0.1:$port (default: the upstream), e.g.
# the worker that owns a slow request.
sub workers_connected_to {
    my ($self, $port) = @_;
    $port //= $self->{upstream_port};
    my %ino;
    for my $f ('/proc/net/tcp', '/proc/net/tcp6') {
        open my $fh, '<', $f or next;
        <$fh>;
        while (my $l = <$fh>) {
            my @c = split ' ', $l;
            next unless @c > 9 && $c[3] eq '01';    # ESTABLISHED
            my ($rp) = $c[2] =~ /:([0-9A-Fa-f]{4})$/ or next;
            $ino{ $c[9] } = 1 if hex($rp) == $port;
        }
    }
    my @w;
    for my $pid ($self->worker_pids) {
        opendir my $d, "/proc/$pid/fd" or next;
        for my $fd (readdir $d) {
            my $l = readlink("/proc/$pid/fd/$fd") // '';
            if ($l =~ /^socket:\[(\d+)\]$/ && $ino{$1}) { push @w, $pid; last }
        }
    }
    return @w;
}

# later($secs, $code): runs $code in a forked child $secs seconds from now,
# while the test goes on (sends a request, say); returns the child's pid
# for waitpid.
sub later {
    my ($self, $secs, $code) = @_;
    my $pid = fork;
    die "fork: $!" unless defined $pid;
    if ($pid == 0) {
        sleep $secs if $secs > 0;
        $code->();
        POSIX::_exit(0);
    }
    return $pid;
}

# redis_pause($ms, $mode): CLIENT PAUSE $ms ALL|WRITE (default ALL); the reply.
sub redis_pause {
    my ($self, $ms, $mode) = @_;
    return $self->redis('CLIENT', 'PAUSE', $ms, $mode // 'ALL');
}

# redis_stall($secs, how => 'script' | 'stop'): Redis stops answering for
# $secs without closing a connection, in the background: a script that
# busy-loops for $secs (below busy-reply-threshold, so nobody gets BUSY),
# or SIGSTOP and SIGCONT of redis-server. Returns at once with a pid to
# give to redis_stall_end, which waits until Redis answers again.
my $BUSY_LUA = "local t0 = redis.call('TIME') "
    . "local s = t0[1] * 1000000 + t0[2] "
    . "while true do local t = redis.call('TIME') "
    . "if t[1] * 1000000 + t[2] - s >= tonumber(ARGV[1]) then return 1 end end";
sub redis_stall {
    my ($self, $secs, %o) = @_;
    my $how = $o{how} // 'script';
    my $rpid = $self->{redis_pid} or die 'redis_stall: no redis';
    kill 'STOP', $rpid if $how eq 'stop';
    my $pid = fork;
    die "fork: $!" unless defined $pid;
    if ($pid == 0) {
        if ($how eq 'stop') {
            sleep $secs;
            kill 'CONT', $rpid;
        } else {
            $self->redis('EVAL', $BUSY_LUA, 0, int($secs * 1e6));
        }
        POSIX::_exit(0);
    }
    # the script has started once a PING stops being answered at once
    if ($how eq 'script') {
        $self->wait_for(sub { !_port_answers_ping($self->{redis_port}) }, 2);
    }
    return $pid;
}

sub redis_stall_end {
    my ($self, $pid) = @_;
    waitpid($pid, 0);
    return $self->wait_for(sub { ($self->redis('PING') // '') eq 'PONG' }, 10);
}

sub _port_answers_ping {
    my ($port) = @_;
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port", Timeout => 0.2) or return 0;
    $s->syswrite("PING\r\n");
    my $in = IO::Select->new($s);
    my $ok = $in->can_read(0.1) ? 1 : 0;
    close $s;
    return $ok;
}

# How many times Redis ran the command $name (lower case, as INFO commandstats
# names it: "evalsha", "wait", "asking"), on the harness's Redis or on $port.
sub command_calls {
    my ($self, $name, $port) = @_;
    my $info = defined $port ? $self->redis_at($port, 'INFO', 'commandstats')
                             : $self->redis('INFO', 'commandstats');
    return 0 if !defined $info || ref $info;
    my ($n) = $info =~ /^cmdstat_\Q$name\E:calls=(\d+)/m;
    return $n // 0;
}

# The Redis key of the record of ($key, $scope) (docs/states.md).
sub record_name {
    my ($self, $key, $scope) = @_;
    require Digest::SHA;
    $scope //= '';
    return 'idem:{' . substr(Digest::SHA::sha256_hex("idem-record-v1\0"
        . pack('Q>', length $scope) . $scope . $key), 0, 32) . '}:r';
}

# The lock key of a value of idempotency_lock, and the unique key of a value of
# idempotency_unique ... shared=$ns, without idempotency_scope (docs/business-keys.md:
# "idem-lock-v1" or "idem-unique-v2" NUL, the length-prefixed scope, the value).
sub lock_name {
    my ($self, $v) = @_;
    require Digest::SHA;
    return 'idem:{' . substr(Digest::SHA::sha256_hex("idem-lock-v1\0" . pack('Q>', 0) . $v), 0, 32) . '}:l';
}

sub unique_shared_name {
    my ($self, $ns, $v) = @_;
    require Digest::SHA;
    return 'idem:{' . substr(Digest::SHA::sha256_hex("idem-unique-v2\0" . pack('Q>', 0)
        . "shared:$ns\0$v"), 0, 32) . '}:u';
}

# decode_record($value): a record of layout 2 (docs/states.md) as a hashref
# with the names layout 1 used (v, state, fp, op, owner, created, completed,
# status, stored, resolved, hdr, body, unknown_at, waiters) plus lease_ms,
# ttl_ms and, for a released marker, retry_after; undef when $value is not
# such a record. Written from the documented layout, not from the C code,
# so it checks what the module writes.
my %STATE = (i => 'in_progress', c => 'completed', u => 'unknown', r => 'released',
             a => 'awaiting_confirmation', p => 'approved', d => 'declined');
my %FIELDS = (
    i => [qw(created lease_ms ttl_ms)],
    c => [qw(created completed status stored resolved hdr body)],
    u => [qw(created unknown_at)],
    r => [qw(status retry_after)],
    a => [qw(created expires)],
    p => [qw(created expires approved_until approver)],
    d => [qw(created expires declined_at approver)],
);
sub decode_record {
    my ($self, $v) = @_;
    return undef unless defined $v && length($v) >= 131
        && $v =~ /\A2([icurapd])([01])([0-9a-f]{32})([0-9a-f]{64})([0-9a-f]{32}|-{32})/;
    my %r = (v => 2, state => $STATE{$1}, waiters => $2, op => $3, fp => $4);
    $r{owner} = $5 unless $5 eq '-' x 32;
    my $pos = 131;
    for my $f (@{ $FIELDS{$1} }) {
        return undef unless substr($v, $pos) =~ /\A(0|[1-9][0-9]*):/;
        my ($n, $hl) = ($1, length($1) + 1);
        return undef unless length($v) >= $pos + $hl + $n + 1
            && substr($v, $pos + $hl + $n, 1) eq ',';
        $r{$f} = substr($v, $pos + $hl, $n);
        $pos += $hl + $n + 1;
    }
    return undef unless $pos == length $v;
    return \%r;
}

# encode_record($hashref): the layout-2 value of a record as decode_record
# returns it; fields may be any bytes, so tests can damage one (a field
# named in %$r{drop} is left out, $r->{raw_state} replaces the state byte).
my %CODE = reverse %STATE;
sub encode_record {
    my ($self, $r) = @_;
    my $st = $CODE{ $r->{state} } // die "state $r->{state}";
    my %drop = map { $_ => 1 } @{ $r->{drop} // [] };
    my $v = ($r->{v} // 2) . ($r->{raw_state} // $st) . ($r->{waiters} // 0) . $r->{op} . $r->{fp}
        . ($r->{owner} // '-' x 32);
    $v .= length($r->{$_} // '') . ':' . ($r->{$_} // '') . ','
        for grep { !$drop{$_} } @{ $FIELDS{$st} };
    return $v;
}

# The record of ($key, $scope) as a hashref, undef when there is none: a
# layout-2 string decoded (decode_record), with pttl, its TTL in ms; a
# hash of layout 1 as its fields (HGETALL). A string that does not decode
# is {corrupt => value}. A claim whose owner wrote its completion beside
# it (docs/states.md: "<record key>:c:<owner token>") is that completion,
# with beside => 1 and the pttl of the completion's key; raw => 1 reads
# the record key alone.
sub record {
    my ($self, $key, $scope, %o) = @_;
    return $self->record_at($self->record_name($key, $scope), %o);
}

# The same, of the record key $name; at => PORT reads it on another node
# (a Cluster replica: readonly => 1 sends READONLY first), as redis_at_multi.
sub record_at {
    my ($self, $name, %o) = @_;
    local $self->{redis_port} = $o{at} // $self->{redis_port};
    local $self->{redis_auth} = $o{at} ? undef : $self->{redis_auth};
    my $multi = sub {
        my @r = $self->redis_multi(($o{readonly} ? ['READONLY'] : ()), @_);
        shift @r if $o{readonly};
        return @r;
    };
    my ($type) = $multi->([ 'TYPE', $name ]);
    $type //= '';
    if ($type eq 'string') {
        my ($v, $pttl) = $multi->([ 'GET', $name ], [ 'PTTL', $name ]);
        my $r = $self->decode_record($v) // return { corrupt => $v };
        $r->{pttl} = $pttl;
        if (!$o{raw} && $r->{state} eq 'in_progress' && $r->{owner}) {
            my $done = "$name:c:$r->{owner}";
            my ($c, $cttl) = $multi->([ 'GET', $done ], [ 'PTTL', $done ]);
            my $cr = $self->decode_record($c);
            if ($cr && $cr->{state} eq 'completed') {
                @$cr{qw(pttl beside)} = ($cttl, 1);
                return $cr;
            }
        }
        return $r;
    }
    return undef unless $type eq 'hash';
    my ($h) = $multi->([ 'HGETALL', $name ]);
    return undef unless ref $h eq 'ARRAY' && @$h;
    return { @$h };
}

# The lease left of an in_progress record of layout 2, in ms (its ttl_ms
# minus its age, the time since its TTL was last set), or undef.
sub lease_left {
    my ($self, $rec) = @_;
    return undef unless $rec && ($rec->{state} // '') eq 'in_progress' && defined $rec->{pttl};
    return $rec->{lease_ms} - ($rec->{ttl_ms} - $rec->{pttl});
}

# restart_nginx(%opts): stops nginx (QUIT) and starts it again with the same
# configuration snippet, options and port. Returns the new master pid.
# wait_state($key, $scope, $state[, $secs]): true once the record of
# ($key, $scope) is in $state (completions and failures land after the answer)
sub wait_state {
    my ($self, $key, $scope, $state, $secs) = @_;
    return $self->wait_for(sub { (($self->record($key, $scope) // {})->{state} // '') eq $state },
                           $secs // 5);
}

sub restart_nginx {
    my ($self, %o) = @_;
    my $snippet = $self->{nginx_snippet};
    my %opts = (%{ $self->{nginx_opts} // {} }, %o);
    $self->stop_nginx;
    return $self->start_nginx($snippet, %opts);
}

# ---------------------------------------------------------------- nginx

sub _conf_text {
    my ($self, $snippet, %o) = @_;
    my $p = $self->{prefix};
    my $errlog = $o{error_log_file} // "$p/error.log";
    my $level = $o{error_log_level} // $self->{error_log_level} // $ENV{IDEM_ERROR_LOG_LEVEL} // 'info';
    my $workers = $o{workers} // 1;
    my $log_format = $o{log_format} // join(' ',
        '$remote_addr [$time_local] "$request" $status $body_bytes_sent',
        'outcome=$idempotency_outcome key="$idempotency_key"',
        'fp=$idempotency_fingerprint op=$idempotency_operation_id rt=$request_time');
    $log_format =~ s/'/\\'/g;
    # IDEM_COMPLETE_BESIDE=on runs a suite with the completion beside its
    # claim everywhere (make test-asan); a test that sets it does so below
    # the http level
    my $beside = ($ENV{IDEM_COMPLETE_BESIDE} // '') =~ /^(on|off)$/
        ? "    idempotency_complete_beside $1;\n" : '';

    my $conf = <<"EOF";
load_module $self->{module};
daemon off;
master_process on;
worker_processes $workers;
pid $p/nginx.pid;
error_log $errlog $level;
@{[ $self->{sanitize} ? "env LD_PRELOAD;\nenv ASAN_OPTIONS;\nenv UBSAN_OPTIONS;\n" : '' ]}@{[ $o{main} // '' ]}
events {
    worker_connections 1024;
}

http {
    client_body_temp_path $p/client_body_temp;
    proxy_temp_path       $p/proxy_temp;
    fastcgi_temp_path     $p/fastcgi_temp;
    uwsgi_temp_path       $p/uwsgi_temp;
    scgi_temp_path        $p/scgi_temp;

    log_format idem '$log_format';
    access_log $p/access.log idem;
$beside
$snippet
}
EOF
    return $self->_subst($conf);
}

sub _subst {
    my ($self, $s) = @_;
    my %v = (
        PORT     => $self->{nginx_port},
        REDIS    => defined $self->{redis_port} ? $self->redis_addr : undef,
        REDIS_SOCKET => $self->redis_socket,
        UPSTREAM => defined $self->{upstream_port} ? $self->upstream_addr : undef,
        PREFIX   => $self->{prefix},
    );
    $s =~ s{%%(\w+)%%}{
        defined $v{$1} ? $v{$1} : die "placeholder %%$1%% has no value (start that service first)\n"
    }ge;
    return $s;
}

# start_stack($http_snippet, redis => {start_redis options},
#             upstream => {start_upstream options}, start_nginx options...):
# what nearly every test starts with: Redis, the counting upstream, and nginx
# with the snippet, in that order (the snippet's %%REDIS%% and %%UPSTREAM%%
# need the first two). Returns what start_nginx returns.
sub start_stack {
    my ($self, $snippet, %o) = @_;
    $self->start_redis(%{ delete $o{redis} // {} });
    $self->start_upstream(%{ delete $o{upstream} // {} });
    return $self->start_nginx($snippet, %o);
}

# start_nginx($http_snippet, workers => N, error_log_level => 'debug',
#             main => 'extra main-context lines', log_format => '...')
sub start_nginx {
    my ($self, $snippet, %o) = @_;
    my $p = $self->{prefix};
    $self->{nginx_port} //= free_port();
    $self->{nginx_snippet} = $snippet;
    $self->{nginx_opts} = \%o;
    $self->{workers} = $o{workers} // 1;
    _spew("$p/nginx.conf", $self->_conf_text($snippet, %o));
    unlink "$p/nginx.pid";

    my $pid = $self->{nginx_pid} = _spawn(
        argv => [ $self->{nginx}, '-p', "$p/", '-c', "$p/nginx.conf", '-e', "$p/error.log" ],
        stdout => "$p/nginx.stdout",
        env => { $self->nginx_env },
    );
    my $ok = $self->wait_for(sub {
        if (waitpid($pid, WNOHANG) == $pid) {
            delete $self->{nginx_pid};
            return -1;
        }
        my $pf = _slurp("$p/nginx.pid");
        return 0 unless $pf =~ /^(\d+)/ && $1 == $pid;
        return 0 unless scalar($self->worker_pids) >= $self->{workers};
        return _port_open($self->{nginx_port});
    }, 10);
    if (!$ok || $ok == -1) {
        my $why = _slurp("$p/nginx.stdout") . _tail("$p/error.log", 30);
        $self->stop_nginx;
        die "nginx did not start:\n$why";
    }
    $self->{nginx_started} = 1;
    return $pid;
}

sub nginx_port { $_[0]{nginx_port} }
sub nginx_pid  { $_[0]{nginx_pid} }

# Pids of the master's children (workers, and old workers while they exit).
sub worker_pids {
    my ($self) = @_;
    my $m = $self->{nginx_pid} or return ();
    my @w;
    opendir my $d, '/proc' or return ();
    for my $pid (grep { /^\d+$/ } readdir $d) {
        my $st = _slurp("/proc/$pid/stat");
        next unless $st =~ /\)\s+\S+\s+(\d+)/;
        push @w, $pid if $1 == $m;
    }
    @w = sort { $a <=> $b } @w;
    return @w;
}

# reload_nginx($new_snippet?, %opts): rewrites nginx.conf when a snippet is
# given, sends HUP, waits until a full set of new workers runs and the old
# ones are gone. Returns true on success.
sub reload_nginx {
    my ($self, $snippet, %o) = @_;
    my $p = $self->{prefix};
    if (defined $snippet) {
        %o = (%{ $self->{nginx_opts} }, %o);
        $self->{nginx_snippet} = $snippet;
        $self->{nginx_opts} = \%o;
        $self->{workers} = $o{workers} // 1;
        _spew("$p/nginx.conf", $self->_conf_text($snippet, %o));
    }
    my %old = map { $_ => 1 } $self->worker_pids;
    kill 'HUP', $self->{nginx_pid} or return 0;
    return $self->wait_for(sub {
        my @w = $self->worker_pids;
        return 0 if grep { $old{$_} } @w;
        return scalar(@w) >= $self->{workers};
    }, 15) ? 1 : 0;
}

# Graceful stop (QUIT); KILL after $wait seconds (default 10). Returns true
# when nginx exited gracefully in time.
sub stop_nginx {
    my ($self, $wait) = @_;
    my $pid = $self->{nginx_pid} or return 1;
    my @workers = $self->worker_pids;
    my $ok = _stop_pid($pid, 'QUIT', $wait // 10);
    kill 'KILL', $_ for grep { kill 0, $_ } @workers;
    delete $self->{nginx_pid};
    $self->{nginx_stop_failed} = 1 unless $ok;
    return $ok;
}

# nginx_test_conf($snippet, %start_opts) -> (exit code, output of `nginx -t`
# including the error log it wrote).
sub nginx_test_conf {
    my ($self, $snippet, %o) = @_;
    my $p = $self->{prefix};
    my $n = ++$self->{test_confs};
    local $self->{nginx_port} = $self->{nginx_port} // free_port();
    my $log = "$p/test-$n.log";
    _spew("$p/test-$n.conf", $self->_conf_text($snippet, %o, error_log_file => $log));
    my %env = $self->nginx_env(leaks => 0);
    my $cmd = join ' ', map { _sh_quote($_) }
        (%env ? ('env', map { "$_=$env{$_}" } sort keys %env) : ()),
        $self->{nginx}, '-t', '-p', "$p/", '-c', "$p/test-$n.conf", '-e', $log;
    my $out = `$cmd 2>&1`;
    my $rc = $? >> 8;
    my $logtext = _slurp($log);
    $out .= $logtext unless index($out, $logtext) >= 0;
    return ($rc, $out);
}

sub _sh_quote { my $s = shift; $s =~ s/'/'\\''/g; "'$s'" }

# ---------------------------------------------------------------- clients

# request_bytes(METHOD, path, headers => [Name => value, ...] or {...},
#   key => K, body => BYTES, json => DATA, chunked => [sizes] | 1,
#   host => ..., connection => 'close'|'keep-alive'|undef)
sub request_bytes {
    my ($self, $method, $path, %o) = @_;
    my @h = ref $o{headers} eq 'HASH' ? %{ $o{headers} } : @{ $o{headers} // [] };
    my $body = $o{body};
    if (exists $o{json}) {
        $body = ref $o{json} ? $JSON->encode($o{json}) : $o{json};
        push @h, 'Content-Type' => 'application/json'
            unless grep { lc($_) eq 'content-type' } @h[ grep { !($_ % 2) } 0 .. $#h ];
    }
    unshift @h, 'Idempotency-Key' => $o{key} if defined $o{key};
    my $conn = exists $o{connection} ? $o{connection} : 'close';
    my $req = "$method $path HTTP/1.1\r\n"
        . 'Host: ' . ($o{host} // "127.0.0.1:$self->{nginx_port}") . "\r\n";
    $req .= "Connection: $conn\r\n" if defined $conn;
    for (my $i = 0; $i < @h; $i += 2) {
        $req .= "$h[$i]: $h[$i + 1]\r\n";
    }
    if ($o{chunked}) {
        $req .= "Transfer-Encoding: chunked\r\n\r\n";
        $body //= '';
        my @sizes = ref $o{chunked} ? @{ $o{chunked} } : (length $body);
        my $off = 0;
        while ($off < length $body) {
            my $sz = @sizes ? shift @sizes : length($body) - $off;
            $sz = length($body) - $off if $sz > length($body) - $off || $sz <= 0;
            $req .= sprintf("%x\r\n", $sz) . substr($body, $off, $sz) . "\r\n";
            $off += $sz;
        }
        $req .= "0\r\n\r\n";
    } elsif (defined $body || $method =~ /^(POST|PUT|PATCH)$/) {
        $body //= '';
        $req .= 'Content-Length: ' . length($body) . "\r\n\r\n" . $body;
    } else {
        $req .= "\r\n";
    }
    return $req;
}

# http_bg(METHOD, path, %http_opts): the same request as http(), sent from a
# forked client; returns a handle whose ->result($wait) gives the response
# (undef when the client did not finish within $wait seconds, default 60).
sub http_bg {
    my ($self, @args) = @_;
    my $dir = $self->{bg_dir} //= tempdir('bg-XXXXXX', DIR => $self->{prefix}, CLEANUP => 0);
    my $file = "$dir/" . ++$self->{bg_count} . '.json';
    my $pid = fork;
    die "fork: $!" unless defined $pid;
    if ($pid == 0) {
        my $rc = 0;
        eval {
            my $r = $self->http(@args);
            $r->{t_done} = time;
            _spew("$file.tmp", $JSON->encode($r));
            rename "$file.tmp", $file;
            1;
        } or do { print STDERR "http_bg: $@"; $rc = 1 };
        POSIX::_exit($rc);
    }
    return bless { pid => $pid, file => $file, t_start => time }, 'Idem::Test::Bg';
}

# http(METHOD, path, %request_bytes_opts, timeout => S) -> {status, reason,
# headers (lowercased names; repeated ones joined by ", "), header_list
# ([name, value] as sent), content, raw}. status 599 + error on failure.
sub http {
    my ($self, $method, $path, %o) = @_;
    my $raw = $self->raw($self->request_bytes($method, $path, %o),
        timeout => $o{timeout}, responses => 1,
        ($method eq 'HEAD' ? (head => 1) : ()));
    my ($r) = $self->parse_responses($raw, head => $method eq 'HEAD');
    return $r // { status => 599, error => 'no complete response', raw => $raw,
                   headers => {}, header_list => [], content => '' };
}

# raw($bytes | [$piece, $delay, $piece, ...], timeout => S, responses => N):
# sends the bytes on one connection, reads until EOF, timeout or N complete
# responses; returns everything read.
sub raw {
    my ($self, $data, %o) = @_;
    my $timeout = $o{timeout} // 10;
    my $s = IO::Socket::INET->new(
        PeerAddr => '127.0.0.1', PeerPort => $self->{nginx_port}, Proto => 'tcp',
        Timeout => $timeout,
    ) or return '';
    binmode $s;
    local $SIG{PIPE} = 'IGNORE';
    my @pieces = ref $data ? @$data : ($data);
    while (@pieces) {
        my $piece = shift @pieces;
        my $off = 0;
        while ($off < length $piece) {
            my $w = syswrite($s, $piece, length($piece) - $off, $off);
            last unless $w;
            $off += $w;
        }
        sleep(shift @pieces) if @pieces;
    }
    my $buf = '';
    my $sel = IO::Select->new($s);
    my $end = time + $timeout;
    while ((my $left = $end - time) > 0) {
        last unless $sel->can_read($left);
        my $n = sysread($s, $buf, 65536, length $buf);
        last unless $n;
        if ($o{responses}) {
            my @r = $self->parse_responses($buf, head => $o{head});
            last if @r >= $o{responses};
        }
    }
    close $s;
    return $buf;
}

# conn(): one client connection to nginx for keep-alive sequences:
#   my $c = $t->conn; $c->send($t->request_bytes(..., connection => undef));
#   my $r = $c->response;   # next complete response (parsed), undef on timeout/EOF
#   $c->eof;                # true once the server closed
sub conn {
    my ($self, %o) = @_;
    my $s = IO::Socket::INET->new(
        PeerAddr => '127.0.0.1', PeerPort => $self->{nginx_port}, Proto => 'tcp',
        Timeout => $o{timeout} // 10,
    ) or die "connect to nginx: $!";
    binmode $s;
    return bless { t => $self, sock => $s, buf => '', eof => 0 }, 'Idem::Test::Conn';
}

# Complete HTTP/1.x responses found one after another in $buf.
sub parse_responses {
    my ($self, $buf, %o) = @_;
    my @out;
    my $pos = 0;
    while ($pos < length $buf) {
        my $hend = index($buf, "\r\n\r\n", $pos);
        last if $hend < 0;
        my $head = substr($buf, $pos, $hend - $pos);
        my ($sl, @lines) = split /\r\n/, $head;
        last unless $sl =~ m{^HTTP/\d\.\d (\d{3})(?: (.*))?$};
        my %r = (status => $1, reason => $2 // '', header_list => [], headers => {},
                 raw_headers => $head);
        for (@lines) {
            my ($n, $v) = /^([^:]+):[ \t]*(.*?)[ \t]*$/ or next;
            push @{ $r{header_list} }, [ $n, $v ];
            my $ln = lc $n;
            $r{headers}{$ln} = exists $r{headers}{$ln} ? "$r{headers}{$ln}, $v" : $v;
        }
        my $p = $hend + 4;
        my $content = '';
        my $bodyless = $o{head} || $r{status} =~ /^(1..|204|304)$/;
        if ($bodyless) {
            # nothing
        } elsif (($r{headers}{'transfer-encoding'} // '') =~ /chunked/i) {
            my $done = 0;
            while (1) {
                my $e = index($buf, "\r\n", $p);
                last if $e < 0;
                my ($sz) = substr($buf, $p, $e - $p) =~ /^([0-9a-fA-F]+)/ or last;
                $sz = hex $sz;
                if ($sz == 0) {
                    my $t = index($buf, "\r\n\r\n", $e);
                    # no trailers: "0\r\n\r\n"
                    if (substr($buf, $e, 4) eq "\r\n\r\n") { $p = $e + 4; $done = 1 }
                    elsif ($t >= 0) { $p = $t + 4; $done = 1 }
                    last;
                }
                last if length($buf) < $e + 2 + $sz + 2;
                $content .= substr($buf, $e + 2, $sz);
                $p = $e + 2 + $sz + 2;
            }
            last unless $done;
        } elsif (defined $r{headers}{'content-length'}) {
            my $len = $r{headers}{'content-length'};
            last if length($buf) < $p + $len;
            $content = substr($buf, $p, $len);
            $p += $len;
        } else {
            $content = substr($buf, $p);    # until EOF
            $p = length $buf;
        }
        $r{content} = $content;
        $r{raw} = substr($buf, $pos, $p - $pos);
        push @out, \%r;
        $pos = $p;
    }
    return @out;
}

# parallel(N, sub { my $i = shift; ...; return $result }): forks N clients that
# all start at the same instant (a barrier on a shared start time) and returns
# their results (JSON-serializable) as an arrayref in index order; undef for a
# client that died or did not finish within `timeout` (default 60 s).
# With tick => sub { ... }, the parent calls it every ~20 ms while it waits
# (e.g. to inject faults while the clients run). The wait reaps any child
# (waitpid -1), so a process the tick stops may already be reaped when the
# tick waits for it (stop_redis / stop_upstream cope with that).
sub parallel {
    my ($self, $n, $code, %o) = @_;
    my $dir = tempdir('par-XXXXXX', DIR => $self->{prefix}, CLEANUP => 0);
    my $start = time + 0.5 + $n * 0.02;
    my %kids;
    for my $i (0 .. $n - 1) {
        my $pid = fork;
        die "fork: $!" unless defined $pid;
        if ($pid == 0) {
            my $rc = 0;
            eval {
                my $d = $start - time;
                sleep $d if $d > 0;
                my $res = $code->($i);
                _spew("$dir/$i.json.tmp", $JSON->encode($res));
                rename "$dir/$i.json.tmp", "$dir/$i.json";
                1;
            } or do { print STDERR "parallel client $i: $@"; $rc = 1 };
            POSIX::_exit($rc);
        }
        $kids{$pid} = $i;
    }
    my $end = time + ($o{timeout} // 60);
    while (%kids && time < $end) {
        my $pid = waitpid(-1, WNOHANG);
        if ($pid > 0) { delete $kids{$pid}; next }
        $o{tick}->() if $o{tick};
        sleep 0.02;
    }
    for my $pid (keys %kids) { kill 'KILL', $pid; waitpid($pid, 0) }
    my @res;
    for my $i (0 .. $n - 1) {
        my $f = "$dir/$i.json";
        push @res, -f $f ? $JSON->decode(_slurp($f)) : undef;
    }
    return \@res;
}

# ---------------------------------------------------------------- audit

# The fields of an audit entry's encoding, in order (docs/audit.md):
# version 1 (fifteen netstrings, one event per entry) and version 2 (the
# events of one step; the bits of an event's mask, in order).
our @AUDIT_FIELDS = qw(version seq time prev event op key fp route status
                       identity approver response ref request);
our @AUDIT_BITS   = qw(time op key fp route status identity approver response ref request);
our @AUDIT_EVENTS = qw(attempted confirmation_required approved sent accepted completed replayed
                       reused conflict in_progress unknown released resolved declined);
my %AUDIT_DIGEST  = (op => 16, fp => 32, response => 32, request => 16);

# audit_tool(@args): build/idempotency-audit with --redis this test's Redis
# (unless @args has one) and @args; returns (exit code, stdout, stderr).
sub audit_tool {
    my ($self, @args) = @_;
    my $bin = $ENV{IDEM_AUDIT_TOOL} // "$REPO/build/idempotency-audit";
    unshift @args, '--redis', $self->redis_addr unless grep { $_ eq '--redis' } @args;
    my $out = "$self->{prefix}/audit-tool.out";
    my $err = "$self->{prefix}/audit-tool.err";
    my $cmd = join ' ', map { _sh_quote($_) } $bin, @args;
    system("$cmd >" . _sh_quote($out) . ' 2>' . _sh_quote($err));
    return ($? == -1 ? 255 : $? >> 8, _slurp($out), _slurp($err));
}

# audit_decode($e): an entry's encoding as { version, seq, prev, events =>
# [ { event, time, op, ... }, ... ] } (digests in hex, prev as stored), or
# undef when it is not one the module writes. Written from docs/audit.md,
# not from the C.
sub audit_decode {
    my ($self, $e) = @_;
    return _audit_decode2($e) if length $e && substr($e, 0, 1) eq "\x02";
    my @f;
    while (length $e) {
        $e =~ s/^(0|[1-9]\d*)://s or return undef;
        my $n = $1;
        return undef if length($e) < $n + 1 || substr($e, $n, 1) ne ',';
        push @f, substr($e, 0, $n);
        $e = substr($e, $n + 1);
    }
    return undef unless @f == @AUDIT_FIELDS && $f[0] eq 'idem-audit-1';
    my %h;
    @h{@AUDIT_FIELDS} = @f;
    my %ev = map { $_ => $h{$_} } grep { !/^(version|seq|prev)$/ } @AUDIT_FIELDS;
    return { version => 1, seq => $h{seq}, prev => $h{prev}, events => [ \%ev ] };
}

sub _audit_decode2 {
    my ($e) = @_;
    my $at = 1;
    my $take = sub { my ($n) = @_; die "short\n" if $at + $n > length $e; my $v = substr($e, $at, $n); $at += $n; $v };
    my $d = eval {
        my $seq = unpack 'Q>', $take->(8);
        my $prev = $take->(unpack 'C', $take->(1));
        my $n = unpack 'C', $take->(1);
        my (@ev, %was);
        for my $k (1 .. $n) {
            my %v = (%was, event => $AUDIT_EVENTS[unpack 'C', $take->(1)]);
            my $mask = unpack 'n', $take->(2);
            die "no time\n" if $k == 1 && !($mask & 1);
            for my $i (0 .. $#AUDIT_BITS) {
                next unless $mask & (1 << $i);
                my $name = $AUDIT_BITS[$i];
                if ($name eq 'time') { $v{time} = unpack 'Q>', $take->(8) }
                elsif ($name eq 'status') { my $st = unpack 'n', $take->(2); $v{status} = $st ? $st : '' }
                else {
                    my $b = $take->(unpack 'n', $take->(2));
                    $v{$name} = $AUDIT_DIGEST{$name} ? unpack('H*', $b) : $b;
                }
            }
            $v{$_} //= '' for @AUDIT_BITS;
            %was = %v;
            push @ev, \%v;
        }
        die "trailing\n" if $at != length $e || !@ev;
        { version => 2, seq => $seq, prev => $prev, events => \@ev };
    };
    return $d;
}

# audit_encode(\%entry): the encoding of an entry as audit_decode gives it
# (version 2 unless it says 1; events' missing fields empty), the inverse.
sub audit_encode {
    my ($self, $h) = @_;
    if (($h->{version} // 2) == 1) {
        my %f = (%{ $h->{events}[0] }, seq => $h->{seq}, prev => $h->{prev});
        return join '', map { my $v = $_ eq 'version' ? 'idem-audit-1' : $f{$_} // '';
                              length($v) . ":$v," } @AUDIT_FIELDS;
    }
    my %code = map { $AUDIT_EVENTS[$_] => $_ } 0 .. $#AUDIT_EVENTS;
    my $out = "\x02" . pack('Q>', $h->{seq}) . pack('C', length $h->{prev}) . $h->{prev}
              . pack('C', scalar @{ $h->{events} });
    my %was;
    for my $ev (@{ $h->{events} }) {
        my ($mask, $body) = (0, '');
        for my $i (0 .. $#AUDIT_BITS) {
            my $name = $AUDIT_BITS[$i];
            my $v = $ev->{$name} // '';
            $v = 0 + ($v || 0) if $name eq 'status' || $name eq 'time';
            next if %was ? $v eq $was{$name}
                         : $name eq 'time' ? 0 : $name eq 'status' ? $v == 0 : $v eq '';
            $mask |= 1 << $i;
            $body .= $name eq 'time' ? pack('Q>', $v) : $name eq 'status' ? pack('n', $v)
                   : $AUDIT_DIGEST{$name} ? pack('n', length($v) / 2) . pack('H*', $v)
                   : pack('n', length $v) . $v;
        }
        $out .= pack('C', $code{ $ev->{event} }) . pack('n', $mask) . $body;
        %was = map { my $v = $ev->{$_} // ''; ($_ => ($_ eq 'status' || $_ eq 'time') ? 0 + ($v || 0) : $v) }
               @AUDIT_BITS;
    }
    return $out;
}

# audit_hash($e, $key): the entry hash of an encoding, SHA-256 or with $key
# HMAC-SHA256, in lowercase hex; audit_digest: the same, raw (a version-2
# entry's "h").
sub audit_hash {
    my ($self, $e, $key) = @_;
    require Digest::SHA;
    return defined $key ? Digest::SHA::hmac_sha256_hex($e, $key) : Digest::SHA::sha256_hex($e);
}

sub audit_digest {
    my ($self, $e, $key) = @_;
    require Digest::SHA;
    return defined $key ? Digest::SHA::hmac_sha256($e, $key) : Digest::SHA::sha256($e);
}

# a stored hash as people read it: hex of a raw digest, a version-1 one as it is
sub _audit_text { my ($h) = @_; defined $h && length $h == 32 ? unpack('H*', $h) : $h }

# audit_stream($stream): the stream's entries in order (XRANGE), each a
# hashref: id, h and e as stored, seq, and the decoded entry (undef when
# e does not decode).
sub audit_stream {
    my ($self, $stream) = @_;
    my $x = $self->redis('XRANGE', $stream // 'idem:audit', '-', '+');
    return [] unless ref $x eq 'ARRAY';
    my @out;
    for my $en (@$x) {
        my %f = @{ $en->[1] };
        my $d = defined $f{e} ? $self->audit_decode($f{e}) : undef;
        push @out, { id => $en->[0], h => $f{h}, e => $f{e}, seq => $d && $d->{seq}, decoded => $d,
                     fields => $en->[1] };
    }
    return \@out;
}

# audit_entries($stream): the stream's events in order, one hashref each:
# the entry's id, h and prev (as text: hex of a raw digest), e, seq and
# fields, the event's index in its entry, and its fields by name (event,
# op, key, ...).
sub audit_entries {
    my ($self, $stream) = @_;
    my @out;
    for my $en (@{ $self->audit_stream($stream) }) {
        my $d = $en->{decoded};
        my %base = (id => $en->{id}, h => _audit_text($en->{h}), e => $en->{e}, fields => $en->{fields});
        if (!$d) {
            push @out, { %base, bad => 1 };
            next;
        }
        my $i = 0;
        push @out, { %$_, %base, seq => $d->{seq}, prev => _audit_text($d->{prev}), index => ++$i,
                     version => $d->{version} } for @{ $d->{events} };
    }
    return \@out;
}

# ---------------------------------------------------------------- the audit file
# Lines of the file device (docs/audit.md, "The format"), written from the
# doc, not from the C: version 2, one line per step, its events in "events"
# with only the fields that are not the line's; version 1, one line per event.

our @AUDIT_FILE_FIELDS = qw(approver fingerprint identity key operation_id ref request_id
                            response_sha256 route status);

# audit_file_lines($path): the file's lines in order, each decoded (a hashref,
# or undef for a line that is not a JSON object).
sub audit_file_lines {
    my ($self, $path) = @_;
    my $json = JSON::PP->new->utf8;
    return [ map { my $o = eval { $json->decode($_) }; ref $o eq 'HASH' ? $o : undef }
             grep { /\S/ } split /\n/, _slurp($path) ];
}

# audit_file_events($path): the events of the file's lines in order, each a
# hashref: the event's fields under the line's names (event, time,
# operation_id, key, ..., status: a number or undef), its line's seq, prev,
# hash and v, the line's number in the file (line), the event's place in
# its line (index, from 1) and how many the line has (events). A line that
# is not JSON gives { line => N, bad => 1 }.
sub audit_file_events {
    my ($self, $path) = @_;
    my ($n, @out) = (0);
    for my $o (@{ $self->audit_file_lines($path) }) {
        $n++;
        if (!$o) {
            push @out, { line => $n, bad => 1 };
            next;
        }
        my %line = map { $_ => $o->{$_} } qw(seq prev hash v);
        my @ev = ($o->{v} // 0) == 1 ? ({ event => $o->{event}, time => $o->{time} }) : @{ $o->{events} // [] };
        my $i = 0;
        for my $e (@ev) {
            my %f = map { $_ => (exists $e->{$_} ? $e->{$_} : $o->{$_}) } @AUDIT_FILE_FIELDS;
            push @out, { %f, %line, event => $e->{event}, time => $e->{time}, line => $n, index => ++$i,
                         events => scalar @ev };
        }
    }
    return \@out;
}

# audit_file_forge(\%line, $key): the text of a line (no newline) as the
# module writes it: the RFC 8785 form of %line without "hash" (members
# sorted, no spaces; seq, v, times and statuses as numbers), hashed with
# SHA-256, or HMAC-SHA256 with $key, and "hash" last. In list context also
# the hash.
sub audit_file_forge {
    my ($self, $o, $key) = @_;
    my $num = sub { my ($h) = @_; $h->{$_} = 0 + $h->{$_} for grep { defined $h->{$_} } qw(seq v time status) };
    my %c = %$o;
    delete $c{hash};
    $num->(\%c);
    $c{events} = [ map { my %e = %$_; $num->(\%e); \%e } @{ $c{events} } ] if ref $c{events};
    my $body = JSON::PP->new->utf8->canonical->encode(\%c);
    my $h = $self->audit_hash($body, $key);
    my $text = substr($body, 0, -1) . ",\"hash\":\"$h\"}";
    return wantarray ? ($text, $h) : $text;
}

# redis_cli(@args): the redis-cli binary against this test's Redis (as an
# operator with write access would tamper with it); its output, chomped.
sub redis_cli {
    my ($self, @args) = @_;
    my $cli = _which('redis-cli') // '/usr/bin/redis-cli';
    my $cmd = join ' ', map { _sh_quote($_) } $cli, '-p', $self->{redis_port}, @args;
    my $out = `$cmd 2>&1`;
    chomp $out;
    return $out;
}

# audit_rewrite($stream, @entries): the stream replaced by these entries
# ([id, h, e] each), written with redis-cli --pipe: DEL, then one XADD each.
sub audit_rewrite {
    my ($self, $stream, @entries) = @_;
    my $resp = join '', map { my @a = @$_; '*' . @a . "\r\n" . join('', map { '$' . length($_) . "\r\n$_\r\n" } @a) }
        [ 'DEL', $stream ], map { [ 'XADD', $stream, $_->[0], 'h', $_->[1], 'e', $_->[2] ] } @entries;
    my $f = "$self->{prefix}/audit-rewrite.resp";
    _spew($f, $resp);
    my $cli = _which('redis-cli') // '/usr/bin/redis-cli';
    my $out = `@{[ _sh_quote($cli) ]} -p $self->{redis_port} --pipe < @{[ _sh_quote($f) ]} 2>&1`;
    die "redis-cli --pipe: $out" unless $out =~ /errors: 0, replies: @{[ @entries + 1 ]}/;
    return scalar @entries;
}

# ---------------------------------------------------------------- assertions

# The decoded problem+json body of $r, or undef.
sub problem {
    my ($self, $r) = @_;
    return undef unless ($r->{headers}{'content-type'} // '') =~ m{^application/problem\+json\b};
    my $p = eval { JSON::PP->new->decode($r->{content}) };
    return ref $p eq 'HASH' ? $p : undef;
}

# The problem type of $r without its URN prefix ("in-progress", ...), or ''.
sub ptype {
    my ($self, $r) = @_;
    return (($self->problem($r) // {})->{type} // '') =~ s/^urn:ngx-idempotency:problem://r;
}

# A client following the retry rule (docs/states.md): POSTs again after
# 503 store-unavailable and 409 in-progress, 0.3 s apart, for at most $max s.
# Returns (the final response, "status slug" of every answer in order).
sub retry_until_final {
    my ($self, $path, $max, @req) = @_;
    my (@seen, $r);
    my $end = time + $max;
    while (1) {
        $r = $self->http(POST => $path, @req, timeout => 5);
        my $p = $self->ptype($r);
        push @seen, "$r->{status} $p";
        last unless ($r->{status} == 503 && $p eq 'store-unavailable')
            || ($r->{status} == 409 && $p eq 'in-progress');
        last if time > $end;
        sleep 0.3;
    }
    return ($r, @seen);
}

# answer($r): "status slug" of $r, with " replayed" for a replay and
# " no-retry-after" for an error answer without Retry-After: what a storm
# compares with the answers a topology's failure is documented to give.
sub answer {
    my ($self, $r) = @_;
    my $p = $self->ptype($r);
    return "$r->{status}" . ($p ? " $p" : '')
        . (($r->{headers}{'idempotent-replayed'} // '') eq 'true' ? ' replayed' : '')
        . ($r->{status} >= 400 && !defined $r->{headers}{'retry-after'} ? ' no-retry-after' : '');
}

# storm(name => N, path => P, fault => sub, moved => sub, documented => {answer => 1},
#       clients => 4, run => 16 (s), at => 3 (s), attempts => 6, bound => 30 (s),
#       counts => sub { $key }): a topology fault under load.  `clients`
# forked clients each send new keys to P for `run` seconds, each key up to
# `attempts` times until a final answer (a 201 is sent once more, to see it
# replayed), 0.2 s after a 503 or 409 in-progress; `fault` runs `at` seconds
# in, then `moved` is polled until it returns a true value (the topology has
# moved: a new master named, say).  Tests: the fault and the move happened,
# every answer is documented, no key executed twice (effects <= 1 for every
# key sent), keys executed before the fault, and a key that `counts`
# accepts (default: any) executed within `bound` seconds of the fault (the
# first after the first refusal, 503 or 409 in-progress, of such a key);
# the recovery is printed.  Returns { keys, fault_t, moved_t, moved, first }.
sub storm {
    my ($self, %o) = @_;
    my ($name, $path) = @o{qw(name path)};
    my $clients = $o{clients} // 4;
    my $run = $o{run} // 16;
    my $start = time + 0.5 + $clients * 0.02;
    my %s;
    my $res = $self->parallel($clients, sub {
        my $c = shift;
        return $self->_storm_client($path, "$name-$$-$c", $run, $o{attempts} // 6);
    }, timeout => $run + 60, tick => sub {
        if (!$s{fault_t} && time >= $start + ($o{at} // 3)) {
            $s{fault_t} = time;
            $o{fault}->();
        }
        if ($s{fault_t} && !$s{moved_t}) {
            my $m = $o{moved}->();
            @s{qw(moved moved_t)} = ($m, time) if $m;
        }
    });
    local $Test::Builder::Level = $Test::Builder::Level + 1;
    return $self->_storm_check(\%o, \%s, $res);
}

sub _storm_client {
    my ($self, $path, $tag, $run, $attempts) = @_;
    my (@keys, @log);
    my $end = time + $run;
    my $n = 0;
    while (time < $end) {
        my $k = "storm-$tag-" . $n++;
        my $body = { tag => $tag, n => $n };
        push @keys, $k;
        for my $i (1 .. $attempts) {
            my $t1 = time;
            my $a = $self->answer($self->http(POST => $path, key => $k, json => $body, timeout => 5));
            push @log, [ $k, $i, $t1, $a ];
            last if $a =~ /^201 replayed|^409 outcome-unknown/;
            if ($a eq '201') {
                my $again = $self->http(POST => $path, key => $k, json => $body, timeout => 5);
                push @log, [ $k, $i + 1, time, $self->answer($again) ];
                last;
            }
            last unless $a =~ /^503 store-(?:unavailable|not-replicated)|^409 in-progress/;
            sleep 0.2;
        }
    }
    return { keys => \@keys, log => \@log };
}

sub _storm_check {
    my ($self, $o, $s, $res) = @_;
    my $name = $o->{name};
    my (%seen, @bad, @keys, @exec, @refused);
    for my $x (@$res) {
        if (!$x) { push @bad, 'a client died'; next }
        push @keys, @{ $x->{keys} };
        for my $l (@{ $x->{log} }) {
            my ($k, $i, $t1, $a) = @$l;
            $seen{$a}++;
            push @bad, "$k attempt $i: $a" unless $o->{documented}{$a};
            push @exec, [ $t1, $k ] if $a eq '201';
            push @refused, [ $t1, $k ] if $a =~ /^503|^409 in-progress/;
        }
    }
    my %effects;
    $effects{ $_->{key} // '' }++ for $self->effect_list(uri => $o->{path});
    my @twice = grep { ($effects{$_} // 0) > 1 } @keys;
    ok($s->{fault_t} && $s->{moved_t}, "$name: the fault happened and the topology moved")
        or diag('fault at ' . ($s->{fault_t} // 'never') . ', moved ' . ($s->{moved_t} // 'never'));
    ok(@keys >= 5 * ($o->{clients} // 4), "$name: " . scalar(@keys) . ' keys sent');
    is(scalar(@bad), 0, "$name: every answer is a documented one")
        or diag(join "\n", @bad[0 .. ($#bad < 15 ? $#bad : 15)]);
    is(scalar(@twice), 0, "$name: no key executed twice (effects <= 1 for each of " . scalar(@keys) . ')')
        or diag(join "\n", map { "$_: $effects{$_} effects" } @twice[0 .. ($#twice < 15 ? $#twice : 15)]);
    diag("$name: answers: " . join(', ', map { "$_ x$seen{$_}" } sort keys %seen));
    ok((grep { $_->[0] < ($s->{fault_t} // 0) } @exec) > 0, "$name: keys executed before the fault");
    return { keys => \@keys } unless $s->{fault_t} && $s->{moved_t};

    # recovery: the first execution after the first refusal the fault caused
    my $counts = $o->{counts} // sub { 1 };
    my ($down) = sort { $a <=> $b } map { $_->[0] }
        grep { $_->[0] >= $s->{fault_t} && $counts->($_->[1]) } @refused;
    my ($first) = sort { $a <=> $b } map { $_->[0] }
        grep { $_->[0] >= ($down // $s->{fault_t}) && $counts->($_->[1]) } @exec;
    my $bound = $o->{bound} // 30;
    ok(defined $first && $first - $s->{fault_t} < $bound,
        "$name: new keys execute again within $bound s of the fault");
    my @gap = sort { $a <=> $b } map { $_->[0] } grep { $counts->($_->[1]) } @exec;
    my $gap = 0;
    for my $i (1 .. $#gap) { $gap = $gap[$i] - $gap[$i - 1] if $gap[$i] - $gap[$i - 1] > $gap }
    diag(sprintf '%s: recovery: the topology moved %.2f s after the fault; first refusal %s; '
        . 'first new key executed after it %.2f s after the fault; longest gap between executions %.2f s',
        $name, $s->{moved_t} - $s->{fault_t},
        defined $down ? sprintf('%.2f s after the fault', $down - $s->{fault_t}) : 'none',
        ($first // time) - $s->{fault_t}, $gap);
    return { keys => \@keys, %$s, first => $first };
}

# status_of($key): the status endpoint's answer for $key (GET /status): its
# HTTP status and its decoded JSON body ({} when there is none)
sub status_of {
    my ($self, $k) = @_;
    my $r = $self->http(GET => '/status', key => $k);
    return ($r->{status}, eval { JSON::PP->new->decode($r->{content}) } // {});
}

# waiters($name, $key, $n): one slow attempt of $key (POST /w, 1.5 s at the
# upstream) and $n duplicates that wait for it (idempotency_wait): every
# duplicate is woken with the replay (none runs out into in-progress), and
# the key executes once.
sub waiters {
    my ($self, $name, $k, $n) = @_;
    local $Test::Builder::Level = $Test::Builder::Level + 1;
    my $bg = $self->http_bg(POST => '/w', key => $k, json => { w => 1 },
                            headers => [ 'X-Delay' => 1.5 ], timeout => 20);
    ok($self->wait_for(sub { $self->effects(key => $k) == 1 }, 10), "$name: the first attempt runs");
    my $res = $self->parallel($n, sub {
        my $r = $self->http(POST => '/w', key => $k, json => { w => 1 }, timeout => 20);
        return "$r->{status} " . ($r->{headers}{'idempotent-replayed'} // $self->ptype($r));
    }, timeout => 30);
    my $first = $bg->result(20);
    is($first && $first->{status}, 201, "$name: the first attempt completes");
    is(scalar(grep { ($_ // '') eq '201 true' } @$res), $n,
       "$name: all $n waiting duplicates got the replay") or diag(explain $res);
    is($self->effects(key => $k), 1, "$name: one effect");
}

# ops_round($name, $port, key => sub { $tag -> a fresh key }, waiters => N):
# the operations endpoints and idempotency_wait against the Redis server
# (a master) on $port, through a configuration with "/" protected and
# waiting, "= /status" and "= /admin": a write's status (completed, its
# upstream status), 404 for an unknown key, an unknown record written on
# $port shown as unknown, told outcome-unknown, released by the admin
# endpoint (gone from $port), then executed once; then waiters().  The
# keys come from `key` (default $self->key), so a test can place them.
# Returns the key of the completed write.
sub ops_round {
    my ($self, $name, $port, %o) = @_;
    local $Test::Builder::Level = $Test::Builder::Level + 1;
    my $key = $o{key} // sub { $self->key(shift) };
    (my $tag = $name) =~ s/[^A-Za-z0-9]+/-/g;    # keys are tokens

    # as a client would (a worker may still be finding its server)
    my $k = $key->("$tag-status");
    my ($r, @seen) = $self->retry_until_final('/s', 10, key => $k, json => { s => 1 });
    is($r->{status}, 201, "$name: a write executes") or diag("@seen");
    my ($code, $st) = $self->status_of($k);
    is($code, 200, "$name: the status endpoint answers");
    is($st->{state}, 'completed', "$name: ... completed");
    is($st->{response_status}, 201, "$name: ... with the upstream's status");
    ($code) = $self->status_of($key->("$tag-none"));
    is($code, 404, "$name: status of an unknown key: 404");

    # an unknown record of the same request (the key is not part of the
    # fingerprint): the admin endpoint releases it
    my $ku = $key->("$tag-unknown");
    my $op = join '', map { sprintf '%02x', int rand 256 } 1 .. 16;
    my $now = int(time * 1000);
    is($self->redis_at($port, 'SET', $self->record_name($ku),
                       $self->encode_record({ state => 'unknown', op => $op, fp => $st->{fingerprint} // 'a' x 64,
                                              created => $now, unknown_at => $now }),
                       'PX', 600000), 'OK', "$name: an unknown record on $port");
    (undef, $st) = $self->status_of($ku);
    is($st->{state}, 'unknown', "$name: status shows it unknown");
    $r = $self->http(POST => '/s', key => $ku, json => { s => 1 });
    is($self->ptype($r), 'outcome-unknown', "$name: a retry is told outcome-unknown");
    $r = $self->http(POST => '/admin?action=release', key => $ku);
    is($r->{status}, 200, "$name: admin release: 200") or diag(_show($r));
    is(($self->redis_at($port, 'EXISTS', $self->record_name($ku)) // -1), 0,
       "$name: the record is gone from $port");
    $r = $self->http(POST => '/s', key => $ku, json => { s => 1 });
    is($r->{status}, 201, "$name: then the retry executes");
    is($self->effects(key => $ku), 1, "$name: once");
    is($self->effects(key => $k), 1, "$name: (and the first key once)");

    $self->waiters("$name, wait", $key->("$tag-wait"), $o{waiters} // 6);
    return $k;
}

# is_problem($r, $status, $slug, key => K|undef, state => S, operation_id => 1|0,
#            retry_after => 1|0, name => ...): one subtest.
sub is_problem {
    my ($self, $r, $status, $slug, %o) = @_;
    my $name = $o{name} // "$status $slug problem";
    local $Test::Builder::Level = $Test::Builder::Level + 1;
    subtest $name => sub {
        is($r->{status}, $status, 'status') or diag(_show($r));
        like($r->{headers}{'content-type'} // '', qr{^application/problem\+json\b},
            'Content-Type application/problem+json');
        like($r->{headers}{'cache-control'} // '', qr/\bno-store\b/, 'Cache-Control: no-store');
        ok(!exists $r->{headers}{'idempotent-replayed'}, 'no Idempotent-Replayed header');
        my $p = $self->problem($r);
        ok($p, 'body is a JSON object') or return;
        is($p->{type}, "urn:ngx-idempotency:problem:$slug", 'type');
        is($p->{status}, $status, 'status member');
        ok(defined $p->{title} && !ref $p->{title} && length $p->{title}, 'title');
        ok(defined $p->{detail} && !ref $p->{detail} && length $p->{detail}, 'detail');
        if (exists $o{key}) {
            ok(exists $p->{idempotency_key}, 'idempotency_key member present');
            is($p->{idempotency_key}, $o{key}, 'idempotency_key');
        }
        if (exists $o{state}) {
            is($p->{state}, $o{state}, 'state');
        }
        if (exists $o{operation_id}) {
            if ($o{operation_id}) {
                like($p->{operation_id} // '', qr/^[0-9a-f]{32}$/, 'operation_id is 32 hex');
            } else {
                ok(!defined $p->{operation_id}, 'no operation_id');
            }
        }
        if (exists $o{retry_after}) {
            if ($o{retry_after}) {
                like($r->{headers}{'retry-after'} // '', qr/^\d+$/, 'Retry-After');
            } else {
                ok(!exists $r->{headers}{'retry-after'}, 'no Retry-After');
            }
        }
    };
}

sub _show {
    my ($r) = @_;
    my $c = $r->{content} // '';
    $c = substr($c, 0, 400) . '...' if length $c > 400;
    return "got: " . ($r->{raw_headers} // "status $r->{status} " . ($r->{error} // '')) . "\n\n$c";
}
sub show { shift; _show(@_) }

# Stops nginx gracefully (exit-time alerts such as "open socket left" are
# written then), then adds tests: it stopped in time, and its logs have no
# alert/crit/emerg or sanitizer lines.
#
# check_logs(ignore => qr/.../ | [qr/.../, ...]): lines matching one of these
# (e.g. the alert of a worker the test killed on purpose) are not counted.
sub check_logs {
    my ($self, %o) = @_;
    my @ignore = ref $o{ignore} eq 'ARRAY' ? @{ $o{ignore} } : grep { defined } $o{ignore};
    local $Test::Builder::Level = $Test::Builder::Level + 1;
    $self->stop_nginx if $self->{nginx_pid};
    ok(!$self->{nginx_stop_failed}, 'nginx exited gracefully on QUIT within 10 s')
        if $self->{nginx_started};

    my @bad;
    for my $f ("$self->{prefix}/error.log", "$self->{prefix}/nginx.stdout") {
        next unless -f $f;
        open my $fh, '<', $f or next;
        while (my $l = <$fh>) {
            next if grep { $l =~ $_ } @ignore;
            push @bad, $l if $l =~ /\[(?:alert|crit|emerg)\]|open socket .*left|AddressSanitizer|LeakSanitizer|runtime error|exited on signal/;
        }
    }
    ok(!@bad, 'error.log has no alert/crit/emerg/open-socket/sanitizer lines')
        or diag(join '', @bad[0 .. ($#bad < 20 ? $#bad : 19)]);
    $self->check_sanitizer if $self->{sanitize};
}

# ---------------------------------------------------------------- sanitizers

my $PRELOAD;

# The sanitizer runtimes to preload into the (uninstrumented) stock nginx.
sub sanitizer_preload {
    return $PRELOAD //= $ENV{IDEM_SANITIZE_PRELOAD} // join ' ', grep { -e } map {
        my $f = `gcc -print-file-name=$_ 2>/dev/null`;
        chomp $f;
        $f;
    } 'libasan.so', 'libubsan.so';
}

sub sanitize { $_[0]{sanitize} }

# Environment for nginx processes: empty unless IDEM_SANITIZE is on.
# Allocation stacks use ASan's fast (frame-pointer) unwinder: the module is
# built with frame pointers, nginx and the Debian libraries are not, so
# these stacks can be short. IDEM_ASAN_OPTIONS=fast_unwind_on_malloc=0 gives
# whole stacks (for diagnosing a report) but makes every malloc several
# times slower: timing-sensitive tests then fail for that reason alone.
# IDEM_ASAN_OPTIONS is appended to ASAN_OPTIONS (later flags win).
# nginx_env(leaks => 0): no leak detection (`nginx -t` exits without
# freeing its cycle, and a leak report would change its exit status).
sub nginx_env {
    my ($self, %o) = @_;
    return () unless $self->{sanitize};
    my $d = "$self->{prefix}/sanitizer";
    my $leaks = $o{leaks} // $ENV{IDEM_SANITIZE_LEAKS} // 1;
    return (
        LD_PRELOAD   => sanitizer_preload(),
        ASAN_OPTIONS => join(':', "log_path=$d/asan", "detect_leaks=$leaks",
            'malloc_context_size=30',
            'halt_on_error=1', 'abort_on_error=0', 'print_summary=1',
            'detect_stack_use_after_return=0',
            ($ENV{IDEM_ASAN_OPTIONS} // ())),
        UBSAN_OPTIONS => join(':', "log_path=$d/ubsan", 'print_stacktrace=1',
            'halt_on_error=1', 'print_summary=1'),
    );
}

# A leak report block concerns the module when one of its frames is in it.
my $MODULE_FRAME = qr/ngx_http_idempotency_module\.so|\bngx_http_idem\w*|\bidem_\w+|\/ngx_http_idempotency_module\//;

# sanitizer_reports() -> (problems, ignored): the report files under
# PREFIX/sanitizer split into reports; problems are every ASan/UBSan error
# and every leak that goes through the module; ignored are nginx's own leaks.
sub sanitizer_reports {
    my ($self) = @_;
    my $d = "$self->{prefix}/sanitizer";
    my (@bad, @ignored);
    opendir my $dh, $d or return ([], []);
    for my $f (sort grep { !/^\./ } readdir $dh) {
        my $text = _slurp("$d/$f");
        next unless $text =~ /\S/;
        if ($text =~ /ERROR: LeakSanitizer: detected memory leaks/
            && $text !~ /ERROR: AddressSanitizer|runtime error/) {
            for my $block (split /\n(?=(?:Direct|Indirect) leak of )/, $text) {
                next unless $block =~ /^(?:Direct|Indirect) leak of /;
                $block =~ s/\n\s*SUMMARY:.*//s;
                if ($block =~ $MODULE_FRAME) { push @bad, "$f: $block\n" }
                else { push @ignored, "$f: $block\n" }
            }
        } else {
            push @bad, "$f:\n$text";
        }
    }
    return (\@bad, \@ignored);
}

# Adds a test: no sanitizer report (see sanitizer_reports), and none of the
# runtime's own complaints in error.log (e.g. it could not write a report).
sub check_sanitizer {
    my ($self) = @_;
    local $Test::Builder::Level = $Test::Builder::Level + 1;
    my ($bad, $ignored) = $self->sanitizer_reports;
    my @own = grep { /ERROR: Can't open file|Sanitizer|==\d+==ERROR/ }
        split /^/, _slurp("$self->{prefix}/error.log") . _slurp("$self->{prefix}/nginx.stdout");
    push @$bad, @own;
    note(scalar(@$ignored) . ' leak report(s) of nginx itself ignored (no module frame)')
        if @$ignored;
    ok(!@$bad, 'no sanitizer report (ASan, UBSan, leaks through the module)')
        or diag(join "\n", map { length > 6000 ? substr($_, 0, 6000) . "...\n" : $_ } @$bad[0 .. ($#$bad < 5 ? $#$bad : 4)]);
}

# Lines of access.log; with $n, waits (up to 5 s) until there are at least $n.
sub access_log {
    my ($self, $n) = @_;
    my $f = "$self->{prefix}/access.log";
    $self->wait_for(sub { my @l = split /\n/, _slurp($f); @l >= $n }, 5) if $n;
    return split /\n/, _slurp($f);
}

sub error_log { _slurp("$_[0]{prefix}/error.log") }

# ---------------------------------------------------------------- utils

sub _slurp {
    my ($f) = @_;
    open my $fh, '<', $f or return '';
    binmode $fh;
    local $/;
    my $s = <$fh>;
    return $s // '';
}

sub _tail {
    my ($f, $n) = @_;
    my @l = split /\n/, _slurp($f);
    @l = @l[-$n .. -1] if @l > $n;
    return join("\n", @l) . "\n";
}

sub _spew {
    my ($f, $s) = @_;
    open my $fh, '>', $f or die "$f: $!";
    binmode $fh;
    print $fh $s;
    close $fh or die "$f: $!";
}

sub cleanup {
    my ($self) = @_;
    return unless $self->{owner} && $self->{owner} == $$;
    $self->stop_nginx(5) if $self->{nginx_pid};
    $self->stop_upstream;
    $self->stop_redis;
    $self->stop_instance($_) for sort keys %{ $self->{instances} // {} };
    _stop_pid($_, 'TERM', 2) for @{ delete $self->{silent_pids} // [] };
}

sub DESTROY { $_[0]->cleanup }

END {
    my $rc = $?;
    $_->cleanup for grep { defined } @INSTANCES;
    @INSTANCES = ();
    $? = $rc;
}

package Idem::Test::Conn;

use IO::Select;
use Time::HiRes qw(time);

sub send {
    my ($c, $bytes) = @_;
    local $SIG{PIPE} = 'IGNORE';
    my $off = 0;
    while ($off < length $bytes) {
        my $w = syswrite($c->{sock}, $bytes, length($bytes) - $off, $off);
        return 0 unless $w;
        $off += $w;
    }
    return 1;
}

sub response {
    my ($c, %o) = @_;
    my $end = time + ($o{timeout} // 10);
    my $sel = IO::Select->new($c->{sock});
    while (1) {
        my ($r) = $c->{t}->parse_responses($c->{buf}, head => $o{head});
        # a response without a length is complete only at EOF
        if ($r && (defined $r->{headers}{'content-length'}
                   || ($r->{headers}{'transfer-encoding'} // '') =~ /chunked/i || $c->{eof})) {
            substr($c->{buf}, 0, length $r->{raw}) = '';
            return $r;
        }
        return undef if $c->{eof};
        my $left = $end - time;
        return undef if $left <= 0;
        next unless $sel->can_read($left);
        my $n = sysread($c->{sock}, $c->{buf}, 65536, length $c->{buf});
        $c->{eof} = 1 unless $n;
    }
}

sub eof {
    my ($c, $timeout) = @_;
    return 1 if $c->{eof};
    my $sel = IO::Select->new($c->{sock});
    if ($sel->can_read($timeout // 2)) {
        my $n = sysread($c->{sock}, $c->{buf}, 65536, length $c->{buf});
        $c->{eof} = 1 unless $n;
    }
    return $c->{eof};
}

sub close { close $_[0]{sock} }

package Idem::Test::Bg;

use POSIX qw(WNOHANG);
use Time::HiRes qw(time sleep);

# The response of the background request (the hash http() returns, plus
# t_done, the client's clock when it finished); undef when it did not finish
# within $wait seconds (the client is then killed).
sub result {
    my ($b, $wait) = @_;
    return $b->{result} if $b->{done};
    my $end = time + ($wait // 60);
    while (1) {
        my $r = waitpid($b->{pid}, WNOHANG);
        last if $r == $b->{pid} || $r == -1;
        if (time >= $end) { kill 'KILL', $b->{pid}; waitpid($b->{pid}, 0); last }
        sleep 0.02;
    }
    $b->{done} = 1;
    my $s = Idem::Test::_slurp($b->{file});
    $b->{result} = length $s ? JSON::PP->new->latin1->decode($s) : undef;
    return $b->{result};
}

sub pid { $_[0]{pid} }

package Idem::Test::RedisError;

use overload '""' => sub { $_[0]{message} }, 'eq' => sub { "$_[0]" eq "$_[1]" }, fallback => 1;

sub new { bless { message => $_[1] }, $_[0] }
sub message { $_[0]{message} }

1;
