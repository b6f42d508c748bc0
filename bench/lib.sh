# shellcheck shell=bash
# bench/lib.sh: shared by bench/run and bench/profile (sourced, not run).
#
# Starts, in a temporary prefix $T and on free loopback ports:
#   redis-server (--save '', no AOF),
#   the fast upstream: a second nginx answering every request with a fixed
#     201 and a small JSON body (plus stub_status on /__status, used to check
#     how many requests really reached it),
#   the nginx under test: server A = plain proxy_pass to the upstream,
#     server B = the same with "idempotency on".
# Every process is recorded and stopped by PID when the script exits.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BENCH=$ROOT/bench
MODULE=${MODULE:-$ROOT/build/ngx_http_idempotency_module.so}
NGINX=${NGINX:-/usr/sbin/nginx}
MODDIR=$ROOT/ngx_http_idempotency_module

say()  { printf '%s\n' "$*"; }
die()  { printf 'bench: %s\n' "$*" >&2; exit 1; }

# --- processes -------------------------------------------------------------

PROCS=()        # "pid signal name" of everything we started

track() { PROCS+=("$1 $2 $3"); }

stop_pid() {   # stop_pid PID SIGNAL NAME
    local pid=$1 sig=$2 i
    [ -n "$pid" ] || return 0
    kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
    kill -s "$sig" "$pid" 2>/dev/null || true
    for i in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        say "bench: $3 (pid $pid) did not stop, killing it" >&2
        kill -s KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

untrack_stop() {   # untrack_stop PID: stop one tracked process now
    local i entry pid sig name
    for i in "${!PROCS[@]}"; do
        entry=${PROCS[$i]}
        read -r pid sig name <<<"$entry"
        if [ "$pid" = "$1" ]; then
            stop_pid "$pid" "$sig" "$name"
            unset 'PROCS[$i]'
        fi
    done
}

stop_all() {
    local i entry pid sig name
    for (( i = ${#PROCS[@]} - 1; i >= 0; i-- )); do
        entry=${PROCS[$i]:-}
        [ -n "$entry" ] || continue
        read -r pid sig name <<<"$entry"
        stop_pid "$pid" "$sig" "$name"
    done
    PROCS=()
}

KEEP_TMP=${KEEP_TMP:-0}
T=''

bench_cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_all
    if [ -n "$T" ] && [ -d "$T" ]; then
        if [ "$KEEP_TMP" = 1 ]; then
            say "bench: kept $T" >&2
        else
            rm -rf "$T"
        fi
    fi
    exit "$rc"
}

bench_init() {   # bench_init NAME: temp prefix and traps
    T=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-$1.XXXXXX")
    # as root, nginx workers run as "nobody": let them reach their temp dirs
    [ "$(id -u)" = 0 ] && chmod 755 "$T"
    trap bench_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

free_ports() {   # free_ports N: N distinct free loopback TCP ports
    perl -MIO::Socket::INET -e '
        my @s = map { IO::Socket::INET->new(Listen => 1, LocalAddr => "127.0.0.1",
                       LocalPort => 0, Proto => "tcp") or die "no free port: $!\n" } 1..$ARGV[0];
        print join(" ", map { $_->sockport } @s), "\n";' "$1"
}

wait_port() {    # wait_port PORT PID NAME LOG [TRIES of 0.1s]
    local i tries=${5:-100}
    for (( i = 0; i < tries; i++ )); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
        kill -0 "$2" 2>/dev/null || { tail -n 20 "$4" >&2 2>/dev/null || true; die "$3 exited during start-up"; }
        sleep 0.1
    done
    tail -n 20 "$4" >&2 2>/dev/null || true
    die "$3 did not start listening on 127.0.0.1:$1"
}

worker_pid() {   # worker_pid MASTER_PID: the (single) worker of an nginx
    local i w
    for i in $(seq 1 50); do
        w=$(ps -o pid= --ppid "$1" 2>/dev/null | head -n 1 | tr -d ' ')
        [ -n "$w" ] && { echo "$w"; return 0; }
        sleep 0.1
    done
    return 1
}

rss_kb() {   # rss_kb PID [FIELD]: VmRSS (or VmHWM, ...) in KiB
    awk -v f="${2:-VmRSS}:" '$1 == f { print $2 }' "/proc/$1/status"
}

# --- redis -------------------------------------------------------------------

start_redis() {   # sets REDIS_PORT REDIS_PID
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no \
        --dir "$T" --logfile "$T/redis.log" --daemonize no </dev/null >/dev/null 2>&1 &
    REDIS_PID=$!
    track "$REDIS_PID" TERM redis-server
    wait_port "$REDIS_PORT" "$REDIS_PID" redis-server "$T/redis.log"
}

rcli() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" "$@"; }

info_cpu_us() {   # INFO cpu of one or more servers on stdin: their CPU (user + sys), summed, in microseconds
    tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ { t += $2 } END { printf "%.0f", t * 1e6 }'
}

redis_cpu_us() {   # Redis's CPU so far, in microseconds
    rcli INFO cpu | info_cpu_us
}

redis_reads() {   # Redis's socket reads so far (INFO stats total_reads_processed)
    rcli INFO stats | tr -d '\r' | sed -n 's/^total_reads_processed://p'
}

# the owner token of the records layout2_value builds
BENCH_TOKEN=0123456789abcdef0123456789abcdef

# layout2_value STATE N CHAR: a record of layout 2 (docs/states.md) as the
# scripts read its head: '2', STATE, no waiter, an operation id, a
# fingerprint, BENCH_TOKEN as its owner, then N bytes of CHAR
layout2_value() {
    printf '2%s0%032d%064d%s' "$1" 7 9 "$BENCH_TOKEN"
    printf "%$2s" '' | tr ' ' "$3"
}

worker_cpu_us() {   # worker_cpu_us PID: its user + system time so far, in microseconds
    awk -v t="$(( 1000000 / $(getconf CLK_TCK) ))" '{ print ($14 + $15) * t }' "/proc/$1/stat"
}

# start_cluster N: a Redis Cluster of N masters (no replicas) in $T/cN,
# each on a free port with its bus on another one (cluster-port), slots
# spread by redis-cli; sets CLUSTER_PORTS and BENCH_CLUSTER ("host:port ...")
start_cluster() {
    local n=$1 i p b ports pid
    read -r -a ports <<<"$(free_ports $(( 2 * n )))"
    CLUSTER_PORTS=() BENCH_CLUSTER=''
    for (( i = 0; i < n; i++ )); do
        p=${ports[$(( 2 * i ))]} b=${ports[$(( 2 * i + 1 ))]}
        mkdir -p "$T/c$i"
        redis-server --bind 127.0.0.1 --port "$p" --cluster-enabled yes --cluster-port "$b" \
            --cluster-config-file "$T/c$i/nodes.conf" --save '' --appendonly no \
            --dir "$T/c$i" --logfile "$T/c$i/redis.log" --daemonize no </dev/null >/dev/null 2>&1 &
        pid=$!
        track "$pid" TERM "redis-server-c$i"
        wait_port "$p" "$pid" "cluster node c$i" "$T/c$i/redis.log"
        CLUSTER_PORTS+=("$p")
        BENCH_CLUSTER="$BENCH_CLUSTER 127.0.0.1:$p"
    done
    # shellcheck disable=SC2086
    redis-cli --cluster create $BENCH_CLUSTER --cluster-replicas 0 --cluster-yes \
        >"$T/cluster-create.log" 2>&1 || { cat "$T/cluster-create.log" >&2; die "redis-cli --cluster create failed"; }
    for (( i = 0; i < 100; i++ )); do
        [ "$(ccli_all CLUSTER INFO | grep -c '^cluster_state:ok')" = "$n" ] && return 0
        sleep 0.1
    done
    die "the cluster did not reach cluster_state:ok"
}

ccli_all() {   # ccli_all CMD...: CMD on every cluster node, the answers one after another
    local p
    for p in "${CLUSTER_PORTS[@]}"; do redis-cli -h 127.0.0.1 -p "$p" "$@" | tr -d '\r'; done
}

# --- nginx -------------------------------------------------------------------

nginx_common() {   # nginx_common DIR: the http{} settings both nginx share
    cat <<EOF
    access_log off;
    default_type application/octet-stream;
    client_body_temp_path $1/client_body_temp;
    proxy_temp_path       $1/proxy_temp;
    fastcgi_temp_path     $1/fastcgi_temp;
    uwsgi_temp_path       $1/uwsgi_temp;
    scgi_temp_path        $1/scgi_temp;
    client_max_body_size  4m;
    keepalive_requests    100000;
EOF
}

start_upstream() {   # sets UPSTREAM_PID; listens on UPSTREAM_PORT
    local d=$T/upstream
    mkdir -p "$d"
    cat >"$d/nginx.conf" <<EOF
daemon off;
master_process on;
worker_processes 1;
pid $d/nginx.pid;
error_log $d/error.log warn;
events { worker_connections 4096; }
http {
$(nginx_common "$d")
    server {
        listen 127.0.0.1:$UPSTREAM_PORT backlog=4096;
        location = /__status { stub_status; }
        location / {
            default_type application/json;
            return 201 '{"id":"ord_1042","status":"created","amount":2500,"currency":"EUR"}\n';
        }
    }
}
EOF
    "$NGINX" -t -q -p "$d" -c "$d/nginx.conf" -e "$d/error.log" || die "nginx -t failed for the upstream"
    "$NGINX" -p "$d" -c "$d/nginx.conf" -e "$d/error.log" </dev/null &
    UPSTREAM_PID=$!
    track "$UPSTREAM_PID" QUIT upstream-nginx
    wait_port "$UPSTREAM_PORT" "$UPSTREAM_PID" upstream-nginx "$d/error.log"
}

upstream_requests() {   # total requests the upstream has answered so far
    curl -s "http://127.0.0.1:$UPSTREAM_PORT/__status" | awk 'NR == 3 { print $3 }'
}

# front_conf NAME A_PORT B_PORT MASTER(on|off) [C_PORT [D_PORT E_PORT]]: the
# nginx under test.  A_PORT or B_PORT may be empty to leave that server out.
# C_PORT adds server C: B's settings with the records in the Redis Cluster
# of the BENCH_CLUSTER nodes ("host:port ...", see start_cluster).  D_PORT
# adds D: C with idempotency_unique and idempotency_lock (values made of the
# Idempotency-Key, so every first write takes a unique key and a lock of its
# own, each in a slot of its own); E_PORT adds E: B with the same two.
front_conf() {
    local name=$1 pa=$2 pb=$3 master=$4 pc=${5:-} pd=${6:-} pe=${7:-} d=$T/$1
    mkdir -p "$d"
    local proxy="
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_ignore_client_abort on;"
    {
        cat <<EOF
load_module $MODULE;
daemon off;
master_process $master;
worker_processes 1;
pid $d/nginx.pid;
error_log $d/error.log error;
# B canonicalizes JSON bodies from 32 KiB up in these threads (the
# module's idempotency_thread_pool); BENCH_THREAD_POOL=off measures without
thread_pool idem threads=2;
events { worker_connections 4096; }
http {
$(nginx_common "$d")
    idempotency_redis 127.0.0.1:$REDIS_PORT;
${BENCH_HTTP_EXTRA:-}

    upstream backend {
        server 127.0.0.1:$UPSTREAM_PORT;
        keepalive ${BENCH_KEEPALIVE:-32};
        keepalive_requests 100000;
    }
EOF
        if [ -n "$pa" ]; then
            cat <<EOF

    # A: plain proxy_pass
    server {
        listen 127.0.0.1:$pa backlog=4096;
        location / {$proxy
        }
    }
EOF
        fi
        if [ -n "$pb" ]; then
            cat <<EOF

    # B: the same, with the idempotency module
    server {
        listen 127.0.0.1:$pb backlog=4096;
        location / {
            idempotency on;
            idempotency_thread_pool ${BENCH_THREAD_POOL:-idem};$proxy
        }
    }
EOF
        fi
        if [ -n "$pc" ]; then
            cat <<EOF

    # C: B with its records in a Redis Cluster
    server {
        listen 127.0.0.1:$pc backlog=4096;
        idempotency_redis_cluster $BENCH_CLUSTER;
        location / {
            idempotency on;
            idempotency_thread_pool ${BENCH_THREAD_POOL:-idem};$proxy
        }
    }
EOF
        fi
        local bkeys="
            idempotency_unique u:\$http_idempotency_key;
            idempotency_lock l:\$http_idempotency_key;"
        if [ -n "$pd" ]; then
            cat <<EOF

    # D: C with a unique key and a lock per first write
    server {
        listen 127.0.0.1:$pd backlog=4096;
        server_name bench-d;   # D and E: one identity and lock each
        idempotency_redis_cluster $BENCH_CLUSTER;
        location / {
            idempotency on;$bkeys
            idempotency_thread_pool ${BENCH_THREAD_POOL:-idem};$proxy
        }
    }
EOF
        fi
        if [ -n "$pe" ]; then
            cat <<EOF

    # E: B with a unique key and a lock per first write
    server {
        listen 127.0.0.1:$pe backlog=4096;
        server_name bench-e;   # D and E: one identity and lock each
        location / {
            idempotency on;$bkeys
            idempotency_thread_pool ${BENCH_THREAD_POOL:-idem};$proxy
        }
    }
EOF
        fi
        echo "}"
    } >"$d/nginx.conf"
    "$NGINX" -t -q -p "$d" -c "$d/nginx.conf" -e "$d/error.log" 2>"$d/nginx-t.log" \
        || { cat "$d/nginx-t.log" >&2; die "nginx -t failed for $d/nginx.conf"; }
}

# start_front NAME A_PORT B_PORT [C_PORT [D_PORT E_PORT]]: sets FRONT_PID (master) and FRONT_WORKER
start_front() {
    local d=$T/$1 port=${2:-$3}
    front_conf "$1" "$2" "$3" on "${4:-}" "${5:-}" "${6:-}"
    "$NGINX" -p "$d" -c "$d/nginx.conf" -e "$d/error.log" </dev/null &
    FRONT_PID=$!
    track "$FRONT_PID" QUIT "nginx-$1"
    wait_port "$port" "$FRONT_PID" "nginx ($1)" "$d/error.log"
    FRONT_WORKER=$(worker_pid "$FRONT_PID") || die "no worker process for nginx ($1)"
}

# --- requests ----------------------------------------------------------------

json_body() {   # json_body SIZE: the document of bench/lua/common.lua, to a file
    local f=$T/body.$1.json
    if [ ! -f "$f" ]; then
        perl -e '
            my $size = shift;
            my $head = q({"batch_id":"b-0001","items":[);
            my $tail = q(],"note":"); my $close = q("});
            my $cur = length($head) + length($tail) + length($close);
            my @r;
            for (my $i = 1; ; $i++) {
                my $rec = sprintf(q({"sku":"SKU-%06d","qty":%d,"price":%d.%02d,"active":%s,)
                    . q("tags":["red","large"],"name":"Item %d \u00e9t\u00e9"}),
                    $i, $i % 7 + 1, $i % 500, $i % 100, ($i % 2 == 0) ? "true" : "false", $i);
                my $add = length($rec) + ($i > 1 ? 1 : 0);
                last if $cur + $add > $size;
                push @r, $rec; $cur += $add;
            }
            print $head, join(",", @r), $tail, "x" x ($size - $cur), $close;' "$1" >"$f"
    fi
    echo "$f"
}

# store_keys PORT PREFIX N SIZE: POST PREFIX-1..N once each (one curl, one
# connection); fails unless every answer is 201.
store_keys() {
    local port=$1 prefix=$2 n=$3 body i args=()
    body=$(json_body "$4")
    for (( i = 1; i <= n; i++ )); do
        [ "$i" -gt 1 ] && args+=(--next)
        args+=(-s -o /dev/null -w '%{http_code}\n' -H 'Content-Type: application/json'
               -H "Idempotency-Key: $prefix-$i" --data-binary "@$body"
               "http://127.0.0.1:$port/v1/orders")
    done
    local codes
    codes=$(curl "${args[@]}" | sort | uniq -c | tr -s ' ' | tr '\n' ';')
    [ "$codes" = " $n 201;" ] || die "storing $n replay keys on port $port: status counts $codes"
}

# wrk_run OUT PORT SCRIPT CONNS DURATION ARGS...: one wrk run; appends the
# BENCH line (see bench/lua/common.lua) to OUT and echoes it.
# the tree parser (jcsparse) is test support: t/unit/jcs_tree.c
build_fpbench() {   # build_fpbench OUT: bench/fpbench.c with the pure-C core and the heap meter
    cc -g -O2 -Wall -Wextra -Wno-unused-parameter -I"$MODDIR" -I"$ROOT/t/unit" -o "$1" \
        "$BENCH/fpbench.c" "$MODDIR"/idem_*.c "$ROOT/t/unit/jcs_tree.c" "$BENCH/heapmeter.c" \
        -lcjson -lcrypto -lm >"$1-build.log" 2>&1 \
        || { cat "$1-build.log" >&2; die "cannot build bench/fpbench.c"; }
}

wrk_run() {
    local out=$1 port=$2 script=$3 conns=$4 dur=$5 line threads=2
    shift 5
    [ "$conns" -ge 2 ] || threads=1   # wrk needs a connection per thread
    # shellcheck disable=SC2086
    line=$(${PIN_CLIENTS:+taskset -c $PIN_CLIENTS} \
           wrk -t$threads -c"$conns" -d"$dur" --timeout 10s -s "$BENCH/lua/$script.lua" \
               "http://127.0.0.1:$port/v1/orders" -- "$@" 2>&1 | grep '^BENCH ' || true)
    [ -n "$line" ] || die "wrk ($script on port $port) printed no result"
    echo "$line" >>"$out"
    echo "$line"
}

# pin_cpus REDIS_CPU OTHERS_CPU [CLIENTS_CPU] | pin_cpus off: Redis on one
# CPU, the nginx processes (all threads) on another (or the same), and wrk
# (through PIN_CLIENTS) on CLIENTS_CPU, by default with the nginx processes;
# "off" gives every process every CPU again.
pin_cpus() {
    local r=$1 o=${2:-} all p
    all=$(( $(nproc) - 1 ))
    if [ "$r" = off ]; then
        r=0-$all o=0-$all
        PIN_CLIENTS=''
    else
        PIN_CLIENTS=${3:-$o}
    fi
    taskset -a -p -c "$r" "$REDIS_PID" >/dev/null || return 1
    for p in "$UPSTREAM_PID" $(ps -o pid= --ppid "$UPSTREAM_PID") \
             "$FRONT_PID" $(ps -o pid= --ppid "$FRONT_PID"); do
        taskset -a -p -c "$o" "$p" >/dev/null || return 1
    done
}

calc() {   # calc EXPR [DECIMALS]: awk arithmetic
    awk "BEGIN { printf \"%.${2:-3}f\", $1 }"
}

median() {   # median V...
    printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 }
        END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

field() {   # field LINE NAME: the value of NAME=... in a BENCH line
    local v
    v=${1##* $2=}
    [ "$v" = "$1" ] && v=${1##$2=}
    echo "${v%% *}"
}
