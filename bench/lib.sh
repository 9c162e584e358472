# Shared by the benchmark scripts: helpers, the plain PostgreSQL and Tessera
# targets (started in temp dirs, stopped on exit), and pgbench data set-up.
# A script may set PG_BIN, TESSERA_BIN, TESSERA_START_TIMEOUT and
# BENCH_ONLY_PLAIN (defaults below) and its own knobs such as SCALE, then
# sources this file.

: "${REPO_ROOT:=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)}"
: "${TESSERA_BIN:=$REPO_ROOT/target/release/tessera}"
: "${PG_BIN:=/usr/lib/postgresql/15/bin}"
: "${TESSERA_START_TIMEOUT:=180}"
: "${BENCH_ONLY_PLAIN:=0}"
# Plain PostgreSQL runs without TLS; the embedded Tessera cluster offers it.
# Clients of both targets go without, so that they are compared like for like.
export PGSSLMODE=disable

# ---------------------------------------------------------------- helpers

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# die MESSAGE [LOGFILE]: print the message (and the log's tail) and exit 1.
die() {
    printf 'ERROR: %s\n' "$1" >&2
    if [[ -n ${2:-} && -f $2 ]]; then
        printf -- '--- last lines of %s ---\n' "$2" >&2
        tail -n 25 -- "$2" >&2 || true
        printf -- '---\n' >&2
    fi
    exit 1
}

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }

# The median of the numbers on stdin, one per line (nothing for none).
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# require_positive NAME...: each named variable must be a positive integer.
require_positive() {
    local name
    for name in "$@"; do
        if ! is_uint "${!name}" || [[ ${!name} -eq 0 ]]; then die "$name must be a positive integer (got '${!name}')"; fi
    done
}

# Run a PostgreSQL server-side binary as the postgres OS user when we are root
# (initdb and postgres refuse to run as root). Runs from / so that the postgres
# user never trips over an unreadable working directory.
as_pg() {
    if [[ $EUID -eq 0 ]]; then
        (cd / && runuser -u postgres -- "$@")
    else
        (cd / && "$@")
    fi
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# A random TCP port that nothing listens on, with the next 3 ports free as
# well (room for servers that put helpers right above their own port).
free_port() {
    local p i k ok
    for ((i = 0; i < 500; i++)); do
        p=$((20000 + RANDOM % 30000))
        ok=1
        for ((k = 0; k < 4; k++)); do
            if port_in_use $((p + k)); then ok=0; break; fi
        done
        if [[ $ok -eq 1 ]]; then echo "$p"; return 0; fi
    done
    die "could not find a free TCP port"
}

psql_at() { # psql_at PORT [psql args...]
    local port=$1; shift
    "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$(host_of "$port")" -p "$port" -U postgres -d postgres "$@"
}

# The host psql reaches PORT at: a node of the Tessera cluster by its Unix
# socket, in its data directory (over TCP the nodes take only certificates
# of the cluster's CA), anything else at the loopback address.
host_of() {
    local dir
    for dir in "${TESSERA_DIR:-/nonexistent}"/coordinator-db "${TESSERA_DIR:-/nonexistent}"/worker-*; do
        if [[ -S $dir/.s.PGSQL.$1 ]]; then
            echo "$dir"
            return
        fi
    done
    echo 127.0.0.1
}

# Coordinator CPU time (utime+stime, clock ticks) from /proc/PID/stat fields
# 14 and 15; empty when there is no coordinator process to account.
COORD_PID=
coord_ticks() {
    local stat rest
    local -a f
    if [[ -z $COORD_PID || ! -r /proc/$COORD_PID/stat ]]; then echo ""; return 0; fi
    stat=$(<"/proc/$COORD_PID/stat") || { echo ""; return 0; }
    rest=${stat##*) }            # drop "pid (comm) ": rest starts at field 3
    read -r -a f <<<"$rest"
    echo $((f[11] + f[12]))      # fields 14 (utime) and 15 (stime)
}

# CPU ticks per server of a target so far, one "name=ticks" per line: each
# postgres data directory under the target's (its postmaster and children)
# by directory name, and Tessera's coordinator process as "coordinator".
node_ticks() { # node_ticks plain|tessera
    node_ticks_input "$1" | awk '
    $1 == "END" { listed = 1; next }
    !listed { name[$2] = $1; order[++n] = $2; next }
    { pid = $1; rest = $0; sub(/^.*\) /, "", rest); split(rest, f, " ")
      if (pid in name) t[pid] += f[12] + f[13] + f[14] + f[15]
      else if (f[2] in name && name[f[2]] != "coordinator") t[f[2]] += f[12] + f[13] + f[14] + f[15] }
    END { for (i = 1; i <= n; i++) print name[order[i]] "=" t[order[i]] + 0 }'
}

# The servers of a target ("name pid" per line), END, then every process's
# /proc stat line: what node_ticks adds up.
node_ticks_input() { # node_ticks_input plain|tessera
    local dir base=$PLAIN_DIR
    [[ $1 == tessera ]] && base=$TESSERA_DIR
    for dir in "$base"/*/; do
        [[ -r $dir/postmaster.pid ]] || continue
        echo "$(basename "$dir") $(head -n 1 "$dir/postmaster.pid")"
    done
    if [[ $1 == tessera && -n $COORD_PID ]]; then echo "coordinator $COORD_PID"; fi
    echo END
    cat /proc/[0-9]*/stat 2>/dev/null || true
}

# "name=µs" per server per transaction, space-separated, from two node_ticks
# listings and a transaction count.
node_us_per_txn() { # node_us_per_txn BEFORE AFTER TXNS
    [[ -n $1 && -n $2 && -n $3 && $3 -gt 0 ]] || return 0
    awk -v n="$3" -v hz="$CLK_TCK" -v before="$1" -v after="$2" 'BEGIN {
        split(before, b, "\n"); for (i in b) { split(b[i], kv, "="); t0[kv[1]] = kv[2] }
        k = split(after, a, "\n"); out = ""
        for (i = 1; i <= k; i++) { split(a[i], kv, "="); if (kv[1] in t0) out = out sprintf("%s%s=%.0f", out == "" ? "" : " ", kv[1], (kv[2] - t0[kv[1]]) * 1e6 / hz / n) }
        print out }'
}

# The sum of a node_ticks listing: every server process of the target
# (exited ones count through their postmaster's reaped-children counters);
# empty when the target is not running.
sum_ticks() { # sum_ticks "$(node_ticks TARGET)"
    awk -F= '{ total += $2 } END { if (NR) print total + 0 }' <<<"$1"
}

# µs of coordinator CPU per transaction, or empty.
us_per_txn() { # us_per_txn TICKS_BEFORE TICKS_AFTER TXNS
    if [[ -z $1 || -z $2 || -z $3 || $3 -eq 0 ]]; then echo ""; return 0; fi
    awk -v a="$1" -v b="$2" -v n="$3" -v hz="$CLK_TCK" 'BEGIN { printf "%.1f", (b - a) * 1e6 / hz / n }'
}

# Results, keyed "<target>:<workload>".
# ---------------------------------------------------------------- checks

if ! is_uint "$TESSERA_START_TIMEOUT"; then die "TESSERA_START_TIMEOUT must be a number of seconds"; fi
for b in initdb pg_ctl postgres pgbench psql; do
    [[ -x $PG_BIN/$b ]] || die "$PG_BIN/$b not found (install postgresql-15, or set PG_BIN)"
done
if [[ $EUID -eq 0 ]]; then
    id postgres >/dev/null 2>&1 || die "running as root but there is no 'postgres' OS user"
fi
if [[ $BENCH_ONLY_PLAIN != 1 && ! -x $TESSERA_BIN ]]; then
    die "$TESSERA_BIN not found: run 'cargo build --release' in $REPO_ROOT first (or BENCH_ONLY_PLAIN=1 to measure only plain PostgreSQL)"
fi
CLK_TCK=$(getconf CLK_TCK)

BENCH_LOG_DIR=${BENCH_LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/tessera-bench-logs.XXXXXX")}
mkdir -p -- "$BENCH_LOG_DIR"
BENCH_LOG_DIR=$(cd -- "$BENCH_LOG_DIR" && pwd)


# ---------------------------------------------------------------- cleanup

PLAIN_DIR='' PLAIN_STARTED=0 PLAIN_PORT=''
TESSERA_DIR='' TESSERA_STARTED=0 TESSERA_UP_PID='' TESSERA_PORT=''

stop_plain() {
    if [[ $PLAIN_STARTED -eq 1 ]]; then
        as_pg "$PG_BIN/pg_ctl" -D "$PLAIN_DIR/data" -m fast -w stop >>"$BENCH_LOG_DIR/plain-pg_ctl.log" 2>&1 ||
            printf 'warning: could not stop the plain PostgreSQL server\n' >&2
        PLAIN_STARTED=0
    fi
    if [[ -n $PLAIN_DIR ]]; then
        cp -- "$PLAIN_DIR/postgres.log" "$BENCH_LOG_DIR/plain-postgres.log" 2>/dev/null || true
        rm -rf -- "$PLAIN_DIR"
        PLAIN_DIR=
    fi
}

stop_tessera() {
    if [[ $TESSERA_STARTED -eq 1 ]]; then
        "$TESSERA_BIN" down --data-dir "$TESSERA_DIR" >>"$BENCH_LOG_DIR/tessera-down.log" 2>&1 ||
            printf 'warning: tessera down failed (see %s/tessera-down.log)\n' "$BENCH_LOG_DIR" >&2
        TESSERA_STARTED=0
    fi
    if [[ -n $TESSERA_UP_PID ]]; then
        # `tessera up` may run in the foreground; it should be gone after `down`.
        if kill -0 "$TESSERA_UP_PID" 2>/dev/null; then
            sleep 2
            kill "$TESSERA_UP_PID" 2>/dev/null || true
        fi
        wait "$TESSERA_UP_PID" 2>/dev/null || true
        TESSERA_UP_PID=
    fi
    if [[ -n $TESSERA_DIR ]]; then
        # Keep the nodes' own logs for post-mortems.
        if [[ -d $TESSERA_DIR ]]; then
            mkdir -p -- "$BENCH_LOG_DIR/tessera-node-logs"
            find "$TESSERA_DIR" -type f \( -name '*.log' -o -name '*.csv' \) -size -100M 2>/dev/null |
                while IFS= read -r f; do
                    rel=${f#"$TESSERA_DIR"/}
                    cp -- "$f" "$BENCH_LOG_DIR/tessera-node-logs/${rel//\//_}" 2>/dev/null || true
                done
        fi
        rm -rf -- "$TESSERA_DIR"
        TESSERA_DIR=
    fi
}

cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    stop_tessera
    stop_plain
    if [[ $rc -ne 0 ]]; then
        printf 'benchmark FAILED (exit %s); raw outputs in %s\n' "$rc" "$BENCH_LOG_DIR" >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------ rounds of pgbench runs

# Throughput by "target:round", for scripts that alternate targets.
declare -A TPS=()

# pgbench_round TARGET PORT ROUND NAME [PGBENCH ARGS...]: one pgbench run of
# $DURATION s with 8 clients over 2 threads and prepared statements, its tps
# recorded in TPS[TARGET:ROUND].
pgbench_round() {
    local target=$1 port=$2 round=$3 name=$4 out tps
    shift 4
    out=$BENCH_LOG_DIR/$target-$name-$round.log
    "$PG_BIN/pgbench" -h 127.0.0.1 -p "$port" -U postgres "$@" -M prepared -c 8 -j 2 -T "$DURATION" -n postgres >"$out" 2>&1 ||
        die "$target: pgbench failed" "$out"
    tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time).*/\1/p' "$out" | head -n 1)
    [[ -n $tps ]] || die "$target: could not parse pgbench's output" "$out"
    TPS[$target:$round]=$tps
    log "$target: round $round: tps=$tps"
}

# round_ratios NUMERATOR DENOMINATOR: min / median / max over the $ROUNDS rounds
# of TPS[NUMERATOR:r] / TPS[DENOMINATOR:r].
round_ratios() {
    local r
    for ((r = 1; r <= ROUNDS; r++)); do awk -v a="${TPS[$1:$r]}" -v b="${TPS[$2:$r]}" 'BEGIN { printf "%.3f\n", a / b }'; done | spread
}

# spread: min / median / max of the numbers on stdin.
spread() {
    local values
    values=$(sort -g)
    printf '%s / %s / %s' "$(head -n 1 <<<"$values")" "$(median <<<"$values")" "$(tail -n 1 <<<"$values")"
}

# print_tps TARGET...: each target's tps by round, a line each.
print_tps() {
    local target r
    for target in "$@"; do
        printf '%-8s' "$target"
        for ((r = 1; r <= ROUNDS; r++)); do printf ' %10s' "${TPS[$target:$r]}"; done
        echo
    done
}

# restart_coordinator CONFIG [BIN]: the coordinator of the embedded cluster
# stopped and started again (by BIN, default $TESSERA_BIN) on the
# configuration file CONFIG.
restart_coordinator() {
    local pid
    cp -- "$1" "$TESSERA_DIR/tessera.toml"
    pid=$(cat "$TESSERA_DIR/coordinator.pid")
    kill "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    "${2:-$TESSERA_BIN}" up --data-dir "$TESSERA_DIR" --port "$TESSERA_PORT" --workers 2 >>"$BENCH_LOG_DIR/tessera-up.log" 2>&1 ||
        die "tessera up on $1 failed" "$BENCH_LOG_DIR/tessera-up.log"
    COORD_PID=$(cat "$TESSERA_DIR/coordinator.pid")
}

# ---------------------------------------------------------------- targets

start_plain() {
    PLAIN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/tessera-bench-plain.XXXXXX")
    local data=$PLAIN_DIR/data
    mkdir -- "$data"
    if [[ $EUID -eq 0 ]]; then chown -R postgres:postgres -- "$PLAIN_DIR"; fi
    chmod 700 -- "$data"
    PLAIN_PORT=$(free_port)
    log "plain: initdb in $data"
    as_pg "$PG_BIN/initdb" -D "$data" -U postgres -A trust >"$BENCH_LOG_DIR/plain-initdb.log" 2>&1 ||
        die "initdb failed" "$BENCH_LOG_DIR/plain-initdb.log"
    # The settings Tessera writes for its nodes.
    cat >>"$data/postgresql.conf" <<CONF

# --- bench/pgbench.sh: same settings as Tessera's nodes ---
port = $PLAIN_PORT
listen_addresses = '127.0.0.1'
# Tessera's nodes have 300; plain PostgreSQL serves the 1000-client workloads itself.
max_connections = 1100
# As Tessera's coordinator database; its two workers have 128MB each, as much together.
shared_buffers = 256MB
max_prepared_transactions = 200
wal_level = logical
max_wal_size = 4GB
checkpoint_timeout = 30min
# Tessera's nodes compile no plan with LLVM (cluster/instance.rs says why);
# with JIT on, plain PostgreSQL spends 20-100 ms compiling each TPC-H plan
# at scale factor 1, which would count against it. Their random_page_cost
# (1.1) is not copied: it makes plain PostgreSQL's TPC-H Q14 16x slower
# (an index nested loop over all of lineitem), which would flatter Tessera.
jit = off
unix_socket_directories = '$data'
CONF
    PLAIN_SOCKET_DIR=$data
    log "plain: starting PostgreSQL 15 on 127.0.0.1:$PLAIN_PORT"
    PLAIN_STARTED=1
    as_pg "$PG_BIN/pg_ctl" -D "$data" -l "$PLAIN_DIR/postgres.log" -w -t 120 start >"$BENCH_LOG_DIR/plain-pg_ctl.log" 2>&1 || {
        cp -- "$PLAIN_DIR/postgres.log" "$BENCH_LOG_DIR/plain-postgres.log" 2>/dev/null || true
        die "could not start the plain PostgreSQL server" "$BENCH_LOG_DIR/plain-postgres.log"
    }
}

start_tessera() {
    TESSERA_DIR=$(mktemp -d "${TMPDIR:-/tmp}/tessera-bench-cluster.XXXXXX")
    if [[ $EUID -eq 0 ]]; then chown postgres:postgres -- "$TESSERA_DIR"; fi
    local port up_log=$BENCH_LOG_DIR/tessera-up.log status_file=$BENCH_LOG_DIR/tessera-status.env
    port=$(free_port)
    log "tessera: up --data-dir $TESSERA_DIR --port $port --workers 2"
    TESSERA_STARTED=1
    # In the background so that it works whether `up` daemonizes or stays in
    # the foreground; readiness is "the coordinator answers SELECT 1".
    "$TESSERA_BIN" up --data-dir "$TESSERA_DIR" --port "$port" --workers 2 >"$up_log" 2>&1 &
    TESSERA_UP_PID=$!
    local deadline=$((SECONDS + TESSERA_START_TIMEOUT)) rc
    until psql_at "$port" -At -c 'SELECT 1' >/dev/null 2>&1; do
        if ! kill -0 "$TESSERA_UP_PID" 2>/dev/null; then
            rc=0
            wait "$TESSERA_UP_PID" || rc=$?
            TESSERA_UP_PID=
            [[ $rc -eq 0 ]] || die "tessera up exited with status $rc" "$up_log"
        fi
        [[ $SECONDS -lt $deadline ]] || die "the coordinator did not accept connections on port $port within ${TESSERA_START_TIMEOUT}s" "$up_log"
        sleep 0.5
    done
    "$TESSERA_BIN" status --data-dir "$TESSERA_DIR" --format env >"$status_file" 2>&1 ||
        die "tessera status failed" "$status_file"
    local key val
    TS_COORDINATOR_PORT='' TS_COORDINATOR_PID='' TS_COORDINATOR_DB_PORT='' TS_WORKER_PORTS=''
    while IFS='=' read -r key val; do
        val=${val%$'\r'}
        val=${val#\"}; val=${val%\"}; val=${val#\'}; val=${val%\'}
        case $key in
            COORDINATOR_PORT | COORDINATOR_PID | COORDINATOR_DB_PORT | WORKER_PORTS)
                printf -v "TS_$key" '%s' "$val" ;;
        esac
    done <"$status_file"
    TESSERA_PORT=${TS_COORDINATOR_PORT:-$port}
    is_uint "$TESSERA_PORT" || die "bad COORDINATOR_PORT in tessera status output" "$status_file"
    if [[ $TESSERA_PORT != "$port" ]]; then
        printf 'warning: asked for port %s but status reports COORDINATOR_PORT=%s; using the latter\n' "$port" "$TESSERA_PORT" >&2
    fi
    if is_uint "$TS_COORDINATOR_PID" && [[ -r /proc/$TS_COORDINATOR_PID/stat ]]; then
        COORD_PID=$TS_COORDINATOR_PID
    else
        COORD_PID=
        printf 'warning: no usable COORDINATOR_PID in tessera status output; coordinator CPU will not be reported\n' >&2
    fi
    log "tessera: coordinator 127.0.0.1:$TESSERA_PORT pid=${COORD_PID:-?} db_port=${TS_COORDINATOR_DB_PORT:-?} workers=[${TS_WORKER_PORTS:-?}]"
}

# ---------------------------------------------------------------- pgbench data

pgbench_init() { # pgbench_init TARGET PORT
    local out=$BENCH_LOG_DIR/$1-pgbench-init.log
    log "$1: pgbench -i -s $SCALE"
    "$PG_BIN/pgbench" -h 127.0.0.1 -p "$2" -U postgres -i -s "$SCALE" postgres >"$out" 2>&1 ||
        die "$1: pgbench -i failed" "$out"
}

distribute_pgbench_tables() { # distribute_pgbench_tables PORT
    local out=$BENCH_LOG_DIR/tessera-distribute-pgbench.log
    log "tessera: create_distributed_table on the pgbench tables"
    psql_at "$1" -f - >"$out" 2>&1 <<'SQL' || die "tessera: distributing the pgbench tables failed" "$out"
SET citus.shard_count = 32;
SELECT create_distributed_table('pgbench_accounts','aid');
SELECT create_distributed_table('pgbench_branches','bid');
SELECT create_distributed_table('pgbench_tellers','tid');
SELECT create_distributed_table('pgbench_history','aid');
SQL
}

# Plain PostgreSQL and the embedded Tessera cluster, both with pgbench's
# tables at $SCALE (distributed on Tessera).
start_pgbench_targets() {
    start_plain
    pgbench_init plain "$PLAIN_PORT"
    start_tessera
    pgbench_init tessera "$TESSERA_PORT"
    distribute_pgbench_tables "$TESSERA_PORT"
}

# run_pgbench TARGET PORT WORKLOAD [pgbench args...]; fails the script on error.
