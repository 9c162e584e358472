#!/usr/bin/env bash
# Installs the client libraries of the client matrix (tests/clients/), at the
# exact versions pinned there. Idempotent and quick when everything is in place.
#   Python: tests/clients/python/requirements.txt   (pip, binary wheels)
#   Node:   tests/clients/node/package-lock.json     (npm ci)
#   Go:     tests/clients/go/go.mod + go.sum         (go build -> tests/clients/go/bin/)
#   Java:   pgjdbc jar, version in tests/clients/java/pgjdbc.version (Maven -> tests/clients/java/lib/)
# Needs python3/pip3, node/npm, go, java/mvn (present on the project's machines)
# and psql/pg_dump (installed here from Debian's packages if missing).
set -euo pipefail
cd "$(dirname "$0")/../tests/clients"

need() { command -v "$1" >/dev/null || { echo "setup-clients: $1 is required" >&2; exit 1; }; }
for tool in python3 pip3 node npm go java mvn; do need "$tool"; done

# PostgreSQL 15 client tools (psql, pg_dump, createdb) for the runner.
if ! command -v psql >/dev/null || ! command -v pg_dump >/dev/null; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends postgresql-client-15 >/dev/null
fi

# Python: install only when an installed version differs from a pin.
if ! python3 - python/requirements.txt <<'PY'
import re, sys
from importlib import metadata
ok = True
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, want = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?==(\S+)", line).groups()
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        have = None
    if have != want:
        ok = False
sys.exit(0 if ok else 1)
PY
then
    echo "setup-clients: installing Python packages"
    pip3 install -q --disable-pip-version-check --root-user-action=ignore --only-binary=:all: -r python/requirements.txt
fi

# Node: npm ci when the lock file changed since the last install.
stamp="node/node_modules/.matrix-lock.sha256"
lock_sum="$(sha256sum node/package-lock.json | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$lock_sum" ]; then
    echo "setup-clients: npm ci"
    (cd node && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    echo "$lock_sum" >"$stamp"
fi

# Go: go build is incremental (module and build caches).
(cd go && go build -o bin/pgx-matrix .)

# Java: the pgjdbc jar (the program runs with java's single-file source launcher).
pgjdbc="$(cat java/pgjdbc.version)"
if [ ! -f "java/lib/postgresql-$pgjdbc.jar" ]; then
    echo "setup-clients: fetching pgjdbc $pgjdbc"
    mvn -q -B dependency:copy -Dartifact="org.postgresql:postgresql:$pgjdbc" -DoutputDirectory=java/lib >/dev/null
fi

echo "setup-clients: ready (python $(python3 -c 'import psycopg, psycopg2, asyncpg, sqlalchemy, django; print("ok")'), node $(node -p 'require("./node/node_modules/pg/package.json").version + "/" + require("./node/node_modules/postgres/package.json").version'), pgx binary, pgjdbc $pgjdbc)"
