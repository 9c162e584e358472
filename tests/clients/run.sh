#!/usr/bin/env bash
# Client matrix runner: runs the nine client programs in parallel against one
# database, then a pg_dump round trip, and prints a summary table.
#
#   PGHOST PGPORT PGUSER PGDATABASE [PGPASSWORD]   the target
#   TESSERA=1|0         1: the target is Tessera (programs distribute their tables)
#   RESTORE_PGHOST RESTORE_PGPORT RESTORE_PGUSER   a plain PostgreSQL 15 server the
#                       runner may create a database in (pg_dump round trip);
#                       without RESTORE_PGPORT the round trip is skipped
#   MATRIX_CLIENTS      space-separated subset of clients (default: all)
#   MATRIX_DUMP=0       skip the pg_dump round trip
#   MATRIX_OWN_BIG=1    every program fills its own 200,000-row table with
#                       INSERT ... SELECT (default: the runner fills one shared
#                       table, matrix_big, before the programs start, and they read it)
#   MATRIX_OUT          directory for per-client logs (default: a temp dir)
#   CHECK_TIMEOUT       seconds per check (default 60); PROGRAM_TIMEOUT per program (150)
#
# Every output line is `[client seconds] ok|FAIL client check...` (seconds since the start). Exits 1 if any check
# failed or any program died. Install the clients first: scripts/setup-clients.sh
set -uo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
export PGHOST="${PGHOST:-127.0.0.1}" PGPORT="${PGPORT:-5432}" PGUSER="${PGUSER:-postgres}" PGDATABASE="${PGDATABASE:-postgres}"
export TESSERA="${TESSERA:-0}"
export CHECK_TIMEOUT="${CHECK_TIMEOUT:-60}"
PROGRAM_TIMEOUT="${PROGRAM_TIMEOUT:-150}"
ALL_CLIENTS="psycopg3 psycopg2 asyncpg sqlalchemy django node-pg postgresjs pgx pgjdbc"
CLIENTS="${MATRIX_CLIENTS:-$ALL_CLIENTS}"
OUT="${MATRIX_OUT:-$(mktemp -d /tmp/client-matrix.XXXXXX)}"
mkdir -p "$OUT"

PGBIN=/usr/lib/postgresql/15/bin
[ -x "$PGBIN/pg_dump" ] || PGBIN="$(dirname "$(command -v pg_dump)")"
JAR="$HERE/java/lib/postgresql-$(cat "$HERE/java/pgjdbc.version").jar"

command_for() {
    case "$1" in
        psycopg3) echo "python3 $HERE/python/psycopg3_matrix.py" ;;
        psycopg2) echo "python3 $HERE/python/psycopg2_matrix.py" ;;
        asyncpg) echo "python3 $HERE/python/asyncpg_matrix.py" ;;
        sqlalchemy) echo "python3 $HERE/python/sqlalchemy_matrix.py" ;;
        django) echo "python3 $HERE/python/django_matrix.py" ;;
        node-pg) echo "node $HERE/node/pg_matrix.js" ;;
        postgresjs) echo "node $HERE/node/postgresjs_matrix.js" ;;
        pgx) echo "$HERE/go/bin/pgx-matrix" ;;
        pgjdbc) echo "java -Xmx64m -cp $JAR $HERE/java/Matrix.java" ;;
        *) return 1 ;;
    esac
}

missing=()
[ -d "$HERE/node/node_modules/pg" ] || missing+=("node modules")
[ -x "$HERE/go/bin/pgx-matrix" ] || missing+=("pgx binary")
[ -f "$JAR" ] || missing+=("pgjdbc jar")
python3 -c "import psycopg, psycopg2, asyncpg, sqlalchemy, django" 2>/dev/null || missing+=("python packages")
if ((${#missing[@]})); then
    echo "missing: ${missing[*]} -- run scripts/setup-clients.sh first" >&2
    exit 2
fi

echo "# client matrix against $PGHOST:$PGPORT/$PGDATABASE (TESSERA=$TESSERA), logs in $OUT"
start=$(date +%s)
T0=${EPOCHREALTIME/./}

# Prefixes every line with [name seconds-since-start].
prefix() {
    local name=$1 line us
    while IFS= read -r line; do
        us=$(( ${EPOCHREALTIME/./} - T0 ))
        printf '[%s %d.%ds] %s\n' "$name" $((us / 1000000)) $((us % 1000000 / 100000)) "$line"
    done
}

# ---- the shared 200,000-row table the cursor checks read (filled once, here) ----
setup_big() {
    local c=setup psql=(psql -X -q -v ON_ERROR_STOP=1 -h "$PGHOST" -p "$PGPORT" -U "$PGUSER" -d "$PGDATABASE")
    local t0 t1
    if ! "${psql[@]}" -c "DROP TABLE IF EXISTS matrix_big" -c "CREATE TABLE matrix_big (id bigint PRIMARY KEY, k int, v bigint)" \
            >/dev/null 2>"$OUT/setup.err"; then
        echo "FAIL $c big_table: $(grep -m2 -E 'ERROR|FATAL' "$OUT/setup.err" | tr '\n' ' ')"
        return
    fi
    if [ "$TESSERA" = 1 ] && ! "${psql[@]}" -c "SELECT create_distributed_table('matrix_big', 'id')" >/dev/null 2>"$OUT/setup.err"; then
        echo "FAIL $c big_distribute: $(grep -m2 -E 'ERROR|FATAL' "$OUT/setup.err" | tr '\n' ' ')"
        return
    fi
    t0=$(date +%s%N)
    if timeout 150 "${psql[@]}" -c "INSERT INTO matrix_big (id, k, v) SELECT g, g % 100, g * 3 FROM generate_series(1, 200000) g" \
            >/dev/null 2>"$OUT/setup.err"; then
        t1=$(date +%s%N)
        echo "ok $c big_insert"
        echo "# $c: INSERT ... SELECT of 200000 rows took $(( (t1 - t0) / 1000000 )) ms"
    else
        echo "FAIL $c big_insert: $(grep -m2 -E 'ERROR|FATAL' "$OUT/setup.err" | tr '\n' ' ') (or timed out after 150 s)"
    fi
}
if [ "${MATRIX_OWN_BIG:-0}" = 1 ]; then
    unset MATRIX_BIG_TABLE  # every program fills its own <prefix>big
else
    export MATRIX_BIG_TABLE=matrix_big
    setup_big 2>&1 | tee "$OUT/setup.out" | prefix setup
fi

# One program per client, all at once; each line gets the client's prefix.
pids=()
for client in $CLIENTS; do
    cmd="$(command_for "$client")" || { echo "unknown client $client" >&2; exit 2; }
    (
        (
            t0=$(date +%s%N)
            timeout --kill-after=5 "$PROGRAM_TIMEOUT" $cmd 2>"$OUT/$client.err"
            rc=$?
            echo "$rc $(( ($(date +%s%N) - t0) / 1000000 ))" >"$OUT/$client.rc"
        ) | tee "$OUT/$client.out" | prefix "$client"
    ) &
    pids+=($!)
done
wait "${pids[@]}" 2>/dev/null

# ---- pg_dump round trip, once, over the whole target database ----
dump_check() { # prints ok/FAIL lines for the pseudo-client pg_dump
    local c=pg_dump
    if [ -z "${RESTORE_PGPORT:-}" ] || [ "${MATRIX_DUMP:-1}" = 0 ]; then
        echo "# $c: skipped (RESTORE_PGPORT not set, or MATRIX_DUMP=0)"
        return
    fi
    local rhost="${RESTORE_PGHOST:-$PGHOST}" ruser="${RESTORE_PGUSER:-$PGUSER}"
    local rdb="matrix_restore_$$"
    local dump="$OUT/dump.sql"
    if ! PGTZ=UTC "$PGBIN/pg_dump" -h "$PGHOST" -p "$PGPORT" -U "$PGUSER" "$PGDATABASE" >"$dump" 2>"$OUT/pg_dump.err"; then
        echo "FAIL $c dump: $(grep -m3 -v '^$' "$OUT/pg_dump.err" | tr '\n' ' ')"
        return
    fi
    echo "ok $c dump"
    "$PGBIN/dropdb" -h "$rhost" -p "$RESTORE_PGPORT" -U "$ruser" --if-exists "$rdb" 2>/dev/null
    if ! "$PGBIN/createdb" -h "$rhost" -p "$RESTORE_PGPORT" -U "$ruser" "$rdb" 2>"$OUT/createdb.err"; then
        echo "FAIL $c restore: createdb: $(head -c 300 "$OUT/createdb.err")"
        return
    fi
    if PGTZ=UTC psql -X -q -v ON_ERROR_STOP=1 -h "$rhost" -p "$RESTORE_PGPORT" -U "$ruser" -d "$rdb" \
            -f "$dump" >/dev/null 2>"$OUT/restore.err"; then
        echo "ok $c restore"
    else
        echo "FAIL $c restore: $(grep -m3 -E 'ERROR|FATAL' "$OUT/restore.err" | tr '\n' ' ')"
    fi
    # Tables of Tessera's own schemas (its catalog, the commit records of
    # transactions the coordinator database decides, which come and go, and
    # the fallback's foreign tables) are listed, not compared.
    local internal
    internal="$(grep -oE '^CREATE (FOREIGN )?TABLE tessera[a-z_]*\.' "$dump" | sort | uniq -c | awk '{$1=$1; print}' | tr '\n' ';')"
    [ -z "$internal" ] || echo "# $c: the dump also holds Tessera's internal schemas (count, statement): $internal"
    local q_tables="SELECT quote_ident(schemaname) || '.' || quote_ident(tablename) FROM pg_tables
                    WHERE schemaname NOT IN ('pg_catalog', 'information_schema', 'tessera', 'tessera_fallback', 'tessera_commit') ORDER BY 1"
    local src_tables dst_tables
    src_tables="$(PGTZ=UTC psql -X -At -h "$PGHOST" -p "$PGPORT" -U "$PGUSER" -d "$PGDATABASE" -c "$q_tables" 2>&1)"
    dst_tables="$(PGTZ=UTC psql -X -At -h "$rhost" -p "$RESTORE_PGPORT" -U "$ruser" -d "$rdb" -c "$q_tables" 2>&1)"
    local only_src
    only_src="$(comm -23 <(echo "$src_tables") <(echo "$dst_tables") | tr '\n' ' ')"
    if [ -n "${only_src// /}" ]; then
        echo "FAIL $c tables: not restored: $only_src"
    else
        echo "ok $c tables"
    fi
    # count and hash of every restored table, on both sides: one query per side,
    # table by table only if the combined query fails.
    local t q all="" s_all d_all s d
    for t in $dst_tables; do
        q="SELECT '$t', count(*) || ' ' || coalesce(sum(hashtext(x::text)), 0) FROM $t x"
        all="${all:+$all UNION ALL }$q"
    done
    [ -n "$all" ] || return
    s_all="$(PGTZ=UTC psql -X -At -F '|' -h "$PGHOST" -p "$PGPORT" -U "$PGUSER" -d "$PGDATABASE" -c "$all" 2>/dev/null)" || s_all=""
    d_all="$(PGTZ=UTC psql -X -At -F '|' -h "$rhost" -p "$RESTORE_PGPORT" -U "$ruser" -d "$rdb" -c "$all" 2>&1)"
    for t in $dst_tables; do
        d="$(grep -m1 "^$t|" <<<"$d_all" | cut -d'|' -f2)"
        if [ -n "$s_all" ]; then
            s="$(grep -m1 "^$t|" <<<"$s_all" | cut -d'|' -f2)"
        else
            q="SELECT count(*) || ' ' || coalesce(sum(hashtext(x::text)), 0) FROM $t x"
            s="$(PGTZ=UTC psql -X -At -h "$PGHOST" -p "$PGPORT" -U "$PGUSER" -d "$PGDATABASE" -c "$q" 2>&1 | tr '\n' ' ' | sed 's/ *$//')"
        fi
        if [ -n "$s" ] && [ "$s" = "$d" ]; then
            echo "ok $c table $t"
        else
            echo "FAIL $c table $t: source (count hash) = ${s:-?}, restored = ${d:-?}"
        fi
    done
    [ "${KEEP_RESTORE:-0}" = 1 ] || "$PGBIN/dropdb" -h "$rhost" -p "$RESTORE_PGPORT" -U "$ruser" --if-exists "$rdb" 2>/dev/null
}
dump_check 2>&1 | tee "$OUT/pg_dump.out" | prefix pg_dump

end=$(date +%s)

# ---- summary ----
status=0
echo
printf '%-12s %4s %7s %8s  %s\n' client ok failed seconds note
for client in setup $CLIENTS pg_dump; do
    f="$OUT/$client.out"
    [ -f "$f" ] || continue
    grep -q '^\(ok\|FAIL\) ' "$f" || continue
    okn=$(grep -c '^ok ' "$f")
    failn=$(grep -c '^FAIL ' "$f")
    note=""
    secs=""
    if [ -f "$OUT/$client.rc" ]; then
        read -r rc ms <"$OUT/$client.rc"
        secs=$(printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)))
        if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
            note="killed after ${PROGRAM_TIMEOUT}s"
            failn=$((failn + 1))
        elif [ "$rc" != 0 ] && [ "$failn" = 0 ]; then
            note="exit $rc: $(tail -n 1 "$OUT/$client.err")"
            failn=1
        fi
    fi
    [ "$failn" = 0 ] || status=1
    printf '%-12s %4s %7s %8s  %s\n' "$client" "$okn" "$failn" "$secs" "$note"
done
echo "# total $((end - start)) s; logs in $OUT"
exit $status
