"""Shared plumbing for the Python client programs of the client matrix.

Every program prints one line per check, `ok <client> <check>` or
`FAIL <client> <check>: <reason>`, keeps going after a failure and exits 1 if
any check failed. The expected data (values, the 200,000-row table, the
typed row) is defined here once so that every Python client checks the same
thing; the Node, Go and Java programs use the same constants.
"""

import datetime
import decimal
import os
import re
import signal
import sys
import threading
import traceback
import uuid

PGHOST = os.environ.get("PGHOST", "127.0.0.1")
PGPORT = int(os.environ.get("PGPORT", "5432"))
PGUSER = os.environ.get("PGUSER", "postgres")
PGDATABASE = os.environ.get("PGDATABASE", "postgres")
PGPASSWORD = os.environ.get("PGPASSWORD") or None
TESSERA = os.environ.get("TESSERA", "0") == "1"

# Seconds one check may take before it is abandoned as failed.
CHECK_TIMEOUT = int(os.environ.get("CHECK_TIMEOUT", "60"))

# The 200,000-row table read by the cursor check: rows (g, g % 100, g * 3).
BIG_ROWS = 200_000
BIG_SUM_V = 3 * BIG_ROWS * (BIG_ROWS + 1) // 2

# Ids chosen by the program (never by the identity sequence).
AGG_ID_BASE = 1_000_000  # rows the aggregate check adds with explicit ids
ROLLBACK_ID = 2_000_001
CUSTOMERS = [(i, "customer %d" % i) for i in range(1, 11)]

NOTIFY_PAYLOAD = "hello from the matrix: ünïcødé, 'quotes'"

# The typed row of check `types`.
TYPED = {
    "c_int2": -32768,
    "c_int4": 2147483647,
    "c_int8": -9223372036854775808,
    "c_numeric": decimal.Decimal("12345678901234567890.123456789"),
    "c_float8": 1.0000000000000002,
    "c_bool": True,
    "c_text": "héllo ☃ 'single' \"double\" \\ back\ttab",
    "c_bytea": bytes(range(256)),
    "c_date": datetime.date(2024, 2, 29),
    "c_ts": datetime.datetime(2024, 3, 10, 12, 34, 56, 789000, tzinfo=datetime.timezone.utc),  # ms: JS Dates
    "c_uuid": uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    "c_jsonb": {"a": [1, 2, {"b": None}], "c": "ünï", "d": 1.5, "e": True},
    "c_int_arr": [1, -2, 2147483647],
    "c_text_arr": ["a", "b c", "with,comma", '"q"', "", "ü"],
}
TYPED_COLUMNS = list(TYPED)


def order_rows(n, start=0):
    """(customer_id, amount, note) for n orders, deterministic."""
    return [
        (1 + (i % 10), decimal.Decimal(i % 97) + decimal.Decimal("0.25"), "order %d" % i)
        for i in range(start, start + n)
    ]


def sqlstate_of(exc):
    """The SQLSTATE carried by a driver exception (or its cause), if any."""
    seen = set()
    e = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        for attr in ("sqlstate", "pgcode"):
            v = getattr(e, attr, None)
            if isinstance(v, str) and v:
                return v
        orig = getattr(e, "orig", None)
        e = orig if orig is not None else e.__cause__
    return None


def describe(exc):
    state = sqlstate_of(exc)
    msg = str(exc).strip()
    msg = re.sub(r"\s*\(Background on this error at: [^)]*\)", "", msg)
    msg = re.sub(r"\s*\n\s*", " | ", msg)
    if len(msg) > 400:
        msg = msg[:400] + "..."
    name = type(exc).__name__
    if state:
        return "%s [SQLSTATE %s] %s" % (name, state, msg)
    return "%s: %s" % (name, msg)


class CheckFailed(Exception):
    """A check's own assertion failed (the server did not raise)."""


def expect(cond, what):
    if not cond:
        raise CheckFailed(what)


class CheckTimeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise CheckTimeout("check did not finish within %d s" % CHECK_TIMEOUT)


class Reporter:
    def __init__(self, client):
        self.client = client
        self.failed = 0
        self.passed = 0
        self.verbose = os.environ.get("MATRIX_VERBOSE") == "1"

    def ok(self, check):
        self.passed += 1
        print("ok %s %s" % (self.client, check), flush=True)

    def fail(self, check, reason):
        self.failed += 1
        print("FAIL %s %s: %s" % (self.client, check, reason), flush=True)

    def run(self, check, fn, on_error=None, interrupt=None):
        """Runs a synchronous check with a time limit; returns its result or None.

        The limit is SIGALRM, which interrupts drivers that wait in Python
        (psycopg 3). For drivers that block inside C (psycopg2) pass interrupt:
        a function a watchdog thread calls at the limit to break the wait."""
        timed_out = []
        watchdog = None
        if interrupt is None:
            signal.signal(signal.SIGALRM, _on_alarm)
            signal.alarm(CHECK_TIMEOUT)
        else:
            def fire():
                timed_out.append(True)
                interrupt()
            watchdog = threading.Timer(CHECK_TIMEOUT, fire)
            watchdog.daemon = True
            watchdog.start()
        try:
            result = fn()
            signal.alarm(0)
            if watchdog:
                watchdog.cancel()
            if timed_out:
                raise CheckTimeout("check did not finish within %d s" % CHECK_TIMEOUT)
            self.ok(check)
            return result
        except BaseException as exc:  # noqa: BLE001 - report and go on
            signal.alarm(0)
            if watchdog:
                watchdog.cancel()
            if isinstance(exc, KeyboardInterrupt):
                raise
            if timed_out and not isinstance(exc, CheckTimeout):
                exc = CheckTimeout("check did not finish within %d s (then: %s)" % (CHECK_TIMEOUT, describe(exc)))
            self.fail(check, describe(exc))
            if self.verbose:
                traceback.print_exc()
            if on_error is not None:
                try:
                    on_error()
                except Exception as exc2:  # noqa: BLE001
                    print("# %s: recovery after %s failed: %s" % (self.client, check, describe(exc2)),
                          file=sys.stderr, flush=True)
            return None

    async def arun(self, check, coro_fn, on_error=None):
        import asyncio

        try:
            result = await asyncio.wait_for(coro_fn(), CHECK_TIMEOUT)
            self.ok(check)
            return result
        except asyncio.TimeoutError:
            self.fail(check, "check did not finish within %d s" % CHECK_TIMEOUT)
        except Exception as exc:  # noqa: BLE001
            self.fail(check, describe(exc))
            if self.verbose:
                traceback.print_exc()
        if on_error is not None:
            try:
                await on_error()
            except Exception as exc2:  # noqa: BLE001
                print("# %s: recovery after %s failed: %s" % (self.client, check, describe(exc2)),
                      file=sys.stderr, flush=True)
        return None

    def finish(self):
        sys.stdout.flush()
        sys.exit(1 if self.failed else 0)


def ddl(p):
    """The schema every plain-SQL client creates (prefix p)."""
    return [
        "DROP TABLE IF EXISTS {p}orders, {p}events, {p}customers, {p}types, {p}big CASCADE",
        "CREATE TABLE {p}orders (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,"
        " customer_id int, amount numeric, note text, created timestamptz DEFAULT now())",
        "CREATE TABLE {p}events (seq bigserial, tenant_id int NOT NULL, payload text,"
        " PRIMARY KEY (tenant_id, seq))",
        "CREATE TABLE {p}customers (id int PRIMARY KEY, name text)",
        "CREATE TABLE {p}types (id int PRIMARY KEY, c_int2 int2, c_int4 int4, c_int8 int8,"
        " c_numeric numeric, c_float8 float8, c_bool bool, c_text text, c_bytea bytea,"
        " c_date date, c_ts timestamptz, c_uuid uuid, c_jsonb jsonb, c_int_arr int[], c_text_arr text[])",
        "CREATE TABLE {p}big (id bigint PRIMARY KEY, k int, v bigint)",
    ]


def distribute(p):
    """The Citus API calls (Tessera only)."""
    return [
        "SELECT create_distributed_table('{p}orders', 'id')",
        "SELECT create_distributed_table('{p}events', 'tenant_id')",
        "SELECT create_reference_table('{p}customers')",
        "SELECT create_distributed_table('{p}types', 'id')",
        "SELECT create_distributed_table('{p}big', 'id')",
    ]


def fmt(stmts, p):
    return [s.format(p=p) for s in stmts]


BIG_INSERT = "INSERT INTO {p}big (id, k, v) SELECT g, g % 100, g * 3 FROM generate_series(1, 200000) g"

# The runner fills one shared 200,000-row table (MATRIX_BIG_TABLE) before the
# programs start; without it each program fills its own <prefix>big.
SHARED_BIG = os.environ.get("MATRIX_BIG_TABLE") or None


def big_table(p):
    """(table to read, INSERT to run first or None)."""
    if SHARED_BIG:
        return SHARED_BIG, None
    return p + "big", BIG_INSERT.format(p=p)


def expected_aggregate(ledger):
    """{customer_id: (count, sum)} from a ledger {id: (customer_id, amount)}."""
    out = {}
    for cust, amount in ledger.values():
        n, s = out.get(cust, (0, decimal.Decimal(0)))
        out[cust] = (n + 1, s + amount)
    return out


def expected_join(ledger):
    """{customer name: count of orders} from the ledger."""
    names = dict(CUSTOMERS)
    out = {}
    for cust, _ in ledger.values():
        out[names[cust]] = out.get(names[cust], 0) + 1
    return out


def compare_typed(got):
    """got: dict column -> value; raises CheckFailed on the first difference."""
    for col in TYPED_COLUMNS:
        want = TYPED[col]
        have = got[col]
        if isinstance(have, memoryview):
            have = bytes(have)
        if col == "c_ts" and have is not None:
            equal = have == want and have.utcoffset() is not None
        else:
            equal = have == want and type(have) is type(want)
        if not equal:
            raise CheckFailed("%s: sent %r, got back %r" % (col, want, have))
