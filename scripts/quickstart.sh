#!/usr/bin/env bash
# From a fresh clone: install dependencies, build the release binary, start a
# local cluster (coordinator database + 2 workers + coordinator) and show it
# working. Re-running reuses the running cluster.
set -euo pipefail
cd "$(dirname "$0")/.."

PORT="${TESSERA_PORT:-5432}"
DATA_DIR="${TESSERA_DATA_DIR:-./tessera-data}"

scripts/setup.sh
cargo build --release
target/release/tessera up --data-dir "$DATA_DIR" --port "$PORT" --workers 2

psql=(psql -X -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1)
"${psql[@]}" -q <<'SQL'
DROP TABLE IF EXISTS quickstart_events;
CREATE TABLE quickstart_events (tenant_id int, event_id bigint, payload text, PRIMARY KEY (tenant_id, event_id));
-- Rows already in the table move into the shards when it is distributed.
INSERT INTO quickstart_events SELECT t, e, 'event ' || e FROM generate_series(1, 3) t, generate_series(1, 4) e;
SELECT create_distributed_table('quickstart_events', 'tenant_id');
INSERT INTO quickstart_events VALUES (4, 1, 'late'), (5, 1, 'later');
CREATE OR REPLACE FUNCTION quickstart_count(t int) RETURNS bigint LANGUAGE plpgsql
  AS $$ BEGIN RETURN (SELECT count(*) FROM quickstart_events WHERE tenant_id = t); END $$;
SQL
echo
echo "-- shards per node:"
"${psql[@]}" -c "SELECT nodename, nodeport, count(*) AS shards FROM citus_shards WHERE table_name = 'quickstart_events'::regclass GROUP BY 1, 2 ORDER BY 2"
echo "-- a single-shard query, routed to one worker:"
"${psql[@]}" -c "SELECT * FROM quickstart_events WHERE tenant_id = 2 ORDER BY event_id"
echo "-- a query across all shards:"
"${psql[@]}" -c "SELECT count(*), min(event_id), max(event_id) FROM quickstart_events"
echo "-- a PL/pgSQL function, run on a worker, which sees whole tables:"
"${psql[@]}" -c "SELECT quickstart_count(2)"
echo
target/release/tessera status --data-dir "$DATA_DIR"
echo
echo "Connect with:  psql -h 127.0.0.1 -p $PORT -U postgres postgres"
echo "Stop with:     target/release/tessera down --data-dir $DATA_DIR"
