#!/usr/bin/env bash
# What securing the coordinator's links to the nodes costs: pgbench TPC-B
# (-M prepared -c 8 -j 2) against plain PostgreSQL and against one Tessera
# cluster whose coordinator reaches its nodes three ways, alternating
# (plain, socket, tcp, tls, plain, …) for $ROUNDS rounds:
#   socket  the embedded default: the nodes' Unix sockets (no TLS needed)
#   tcp     loopback TCP in the clear, the nodes trusting it (no [node_tls],
#           a `host … trust` line for 127.0.0.1 in each node's pg_hba.conf)
#   tls     loopback TCP with TLS, each role logging in with its certificate
#           of the cluster's CA (`hostssl … cert`), as between hosts
# The coordinator restarts with the target's configuration before each run.
# Prints TPS per target and round, the ratios to plain PostgreSQL, and
# tls/tcp: the price of TLS and certificate logins on every node link.
#
# Then, with STANDBYS=1 (the default), a last stage: the socket target again
# after `tessera up --standbys 1` (a synchronous streaming standby for every
# node), alternating with plain: what synchronous standbys cost.
#
# Environment: DURATION=30 ROUNDS=3 SCALE=10 STANDBYS=1 TARGETS="socket tcp
# tls" BENCH_LOG_DIR TESSERA_BIN PG_BIN (as bench/pgbench.sh).
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd -- "$SCRIPT_DIR/.." && pwd)
DURATION=${DURATION:-30}
ROUNDS=${ROUNDS:-3}
SCALE=${SCALE:-10}
STANDBYS=${STANDBYS:-1}
BENCH_ONLY_PLAIN=0
TESSERA_BIN=${TESSERA_BIN:-$REPO_ROOT/target/release/tessera}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
TESSERA_START_TIMEOUT=${TESSERA_START_TIMEOUT:-180}

# shellcheck source=bench/lib.sh
source "$SCRIPT_DIR/lib.sh"
require_positive DURATION ROUNDS SCALE

# pgbench_tpcb TARGET PORT ROUND
pgbench_tpcb() { pgbench_round "$1" "$2" "$3" tpcb; }

# The coordinator's configuration for each way to the nodes, made once
# from the one `tessera up` wrote.
configure_targets() {
    python3 - "$TESSERA_DIR/tessera.toml" <<'PY'
import sys, tomllib
path = sys.argv[1]
text = open(path).read()
config = tomllib.loads(text)
def write(name, drop_sockets, drop_tls):
    lines = []
    skip = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith('['):
            skip = drop_tls and stripped == '[node_tls]'
        if skip:
            continue
        if drop_sockets and stripped.startswith('node_socket_directories'):
            line = 'node_socket_directories = []'
        lines.append(line)
    open(path + '.' + name, 'w').write('\n'.join(lines) + '\n')
write('socket', False, False)
write('tcp', True, True)
write('tls', True, False)
PY
    # The tcp target's clear-text logins from loopback, ahead of the
    # certificate lines; the tls target's coordinator asks for TLS, which
    # the same line would let in without a certificate, so it is taken out
    # again for that target.
    local node
    for node in "$TESSERA_DIR"/coordinator-db "$TESSERA_DIR"/worker-*; do
        cp -- "$node/pg_hba.conf" "$node/pg_hba.conf.tls"
        { echo "host all all 127.0.0.1/32 trust"; cat "$node/pg_hba.conf.tls"; } >"$node/pg_hba.conf.tcp"
        chown postgres:postgres -- "$node"/pg_hba.conf.* 2>/dev/null || true
    done
}

# use_target socket|tcp|tls: the nodes' pg_hba.conf and the coordinator's
# configuration for that target, the coordinator restarted on them.
use_target() {
    local hba=tls node
    [[ $1 == tcp ]] && hba=tcp
    for node in "$TESSERA_DIR"/coordinator-db "$TESSERA_DIR"/worker-*; do
        cp -- "$node/pg_hba.conf.$hba" "$node/pg_hba.conf"
        as_pg "$PG_BIN/pg_ctl" -D "$node" reload >/dev/null
    done
    restart_coordinator "$TESSERA_DIR/tessera.toml.$1"
}

log "node links benchmark: SCALE=$SCALE DURATION=${DURATION}s ROUNDS=$ROUNDS cpus=$(nproc); raw outputs in $BENCH_LOG_DIR"
start_pgbench_targets
configure_targets
read -r -a TARGETS <<<"${TARGETS:-socket tcp tls}"
for ((round = 1; round <= ROUNDS; round++)); do
    pgbench_tpcb plain "$PLAIN_PORT" "$round"
    for target in "${TARGETS[@]}"; do
        use_target "$target"
        pgbench_tpcb "$target" "$TESSERA_PORT" "$round"
    done
done

# Then the embedded default again with a synchronous standby for every
# node (`tessera up --standbys 1`): a stage of its own, after the others,
# since standbys are not taken away again. Plain PostgreSQL runs beside it
# in each round, so the ratios to plain compare across the stages.
if [[ $STANDBYS == 1 ]]; then
    use_target socket
    log "tessera: up --standbys 1"
    "$TESSERA_BIN" up --data-dir "$TESSERA_DIR" --port "$TESSERA_PORT" --workers 2 --standbys 1 >>"$BENCH_LOG_DIR/tessera-up.log" 2>&1 ||
        die "tessera up --standbys 1 failed" "$BENCH_LOG_DIR/tessera-up.log"
    for ((round = 1; round <= ROUNDS; round++)); do
        pgbench_tpcb plain_again "$PLAIN_PORT" "$round"
        pgbench_tpcb standbys "$TESSERA_PORT" "$round"
    done
fi

echo
echo "pgbench TPC-B, scale $SCALE, 8 clients, ${DURATION} s x $ROUNDS rounds (tps by round)"
print_tps plain "${TARGETS[@]}"
echo "ratio to plain (min / median / max):"
for target in "${TARGETS[@]}"; do printf '  %-8s %s\n' "$target" "$(round_ratios "$target" plain)"; done
if [[ " ${TARGETS[*]} " == *" tls "* && " ${TARGETS[*]} " == *" tcp "* ]]; then
    echo "tls / tcp (min / median / max): $(round_ratios tls tcp)"
fi
if [[ $STANDBYS == 1 ]]; then
    print_tps standbys
    echo "with a synchronous standby per node, ratio to plain (measured beside it): $(round_ratios standbys plain_again) (socket without: $(round_ratios socket plain))"
fi
