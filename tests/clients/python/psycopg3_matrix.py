"""Client matrix: psycopg 3 (synchronous API, server-side binding)."""

import decimal
import threading

import psycopg
from psycopg.types.json import Jsonb

import common as c
from common import CheckFailed, expect

CLIENT = "psycopg3"
P = "psycopg3_"
R = c.Reporter(CLIENT)


def connect(**kw):
    return psycopg.connect(host=c.PGHOST, port=c.PGPORT, user=c.PGUSER, dbname=c.PGDATABASE,
                           password=c.PGPASSWORD, connect_timeout=10, **kw)


conn = None
ledger = {}  # order id -> (customer_id, amount)


def recover():
    """After a failed check: reconnect if the connection is gone, else roll back."""
    global conn
    status = None if conn is None or conn.closed or conn.broken else conn.info.transaction_status
    TS = psycopg.pq.TransactionStatus
    if status in (TS.INTRANS, TS.INERROR):
        conn.rollback()
    elif status != TS.IDLE:
        # Gone, or a command still running (a check timed out): a fresh session.
        if conn is not None:
            conn.close()
        conn = connect(autocommit=True)


def ensure():
    """Before each check: a new session if the last one could not be recovered."""
    global conn
    if conn is None or conn.closed or conn.broken:
        conn = connect(autocommit=True)


def check_connect():
    global conn
    conn = connect(autocommit=True)
    expect(conn.execute("SELECT 1").fetchone()[0] == 1, "SELECT 1")


def check_ddl():
    for stmt in c.fmt(c.ddl(P), P):
        conn.execute(stmt)
    if c.TESSERA:
        for stmt in c.fmt(c.distribute(P), P):
            conn.execute(stmt)


def check_insert_returning():
    cust, amount, note = c.order_rows(1)[0]
    row = conn.execute(
        "INSERT INTO psycopg3_orders (customer_id, amount, note) VALUES (%s, %s, %s) RETURNING id",
        (cust, amount, note)).fetchone()
    expect(row is not None and row[0] is not None, "no id returned")
    ledger[row[0]] = (cust, amount)


def check_batch_insert():
    rows = c.order_rows(100, start=1)
    ids = []
    with conn.transaction():
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO psycopg3_orders (customer_id, amount, note) VALUES (%s, %s, %s) RETURNING id",
                rows, returning=True)
            while True:
                ids.append(cur.fetchone()[0])
                if not cur.nextset():
                    break
    expect(len(ids) == 100, "expected 100 ids, got %d" % len(ids))
    expect(None not in ids, "a returned id is NULL")
    expect(len(set(ids)) == 100, "returned ids are not distinct")
    expect(not set(ids) & set(ledger), "ids collide with earlier ids")
    for i, (cust, amount, _) in zip(ids, rows):
        ledger[i] = (cust, amount)


def check_serial_insert():
    seqs = []
    with conn.transaction():
        for t in (1, 2, 3, 1, 2, 3):
            seqs.append(conn.execute(
                "INSERT INTO psycopg3_events (tenant_id, payload) VALUES (%s, %s) RETURNING seq",
                (t, "event for %d" % t)).fetchone()[0])
    expect(None not in seqs and len(set(seqs)) == len(seqs), "seqs not distinct/non-null: %r" % seqs)
    n = conn.execute("SELECT count(*) FROM psycopg3_events WHERE tenant_id = %s", (2,)).fetchone()[0]
    expect(n == 2, "tenant 2 has %d events, want 2" % n)


def check_prepared_select():
    expect(ledger, "no orders to select (inserts failed)")
    for key, (cust, amount) in list(ledger.items())[:10]:
        row = conn.execute("SELECT id, customer_id, amount FROM psycopg3_orders WHERE id = %s",
                           (key,), prepare=True).fetchone()
        expect(row == (key, cust, amount), "id %d: got %r, want %r" % (key, row, (key, cust, amount)))


def add_aggregate_rows():
    """Rows with program-chosen ids, so the aggregate has data even if the
    key-returning inserts failed."""
    rows = c.order_rows(30, start=500)
    values = []
    params = []
    for i, (cust, amount, note) in enumerate(rows):
        values.append("(%s, %s, %s, %s)")
        params += [c.AGG_ID_BASE + i, cust, amount, note]
    conn.execute("INSERT INTO psycopg3_orders (id, customer_id, amount, note) VALUES " + ", ".join(values),
                 params)
    for i, (cust, amount, _) in enumerate(rows):
        ledger[c.AGG_ID_BASE + i] = (cust, amount)


def check_aggregate():
    add_aggregate_rows()
    got = {r[0]: (r[1], r[2]) for r in conn.execute(
        "SELECT customer_id, count(*), sum(amount) FROM psycopg3_orders GROUP BY customer_id ORDER BY customer_id")}
    want = c.expected_aggregate(ledger)
    expect(got == want, "got %r, want %r" % (got, want))


def check_ref_join():
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO psycopg3_customers (id, name) VALUES (%s, %s)", c.CUSTOMERS)
    got = dict(conn.execute(
        "SELECT c.name, count(*) FROM psycopg3_orders o JOIN psycopg3_customers c ON c.id = o.customer_id"
        " GROUP BY c.name ORDER BY c.name").fetchall())
    want = c.expected_join(ledger)
    expect(got == want, "got %r, want %r" % (got, want))


def check_rollback():
    class Rollback(Exception):
        pass

    try:
        with conn.transaction():
            conn.execute("INSERT INTO psycopg3_orders (id, customer_id, amount, note) VALUES (%s, 1, 1, 'rolled back')",
                         (c.ROLLBACK_ID,))
            n = conn.execute("SELECT count(*) FROM psycopg3_orders WHERE id = %s", (c.ROLLBACK_ID,)).fetchone()[0]
            expect(n == 1, "row not visible inside its transaction")
            raise Rollback()
    except Rollback:
        pass
    n = conn.execute("SELECT count(*) FROM psycopg3_orders WHERE id = %s", (c.ROLLBACK_ID,)).fetchone()[0]
    expect(n == 0, "row still there after rollback")


def check_types():
    cols = c.TYPED_COLUMNS
    values = [Jsonb(v) if k == "c_jsonb" else v for k, v in c.TYPED.items()]
    conn.execute("INSERT INTO psycopg3_types (id, %s) VALUES (%%s, %s)" % (", ".join(cols), ", ".join(["%s"] * len(cols))),
                 [1] + values)
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        got = cur.execute("SELECT %s FROM psycopg3_types WHERE id = %%s" % ", ".join(cols), (1,)).fetchone()
    expect(got is not None, "row not found")
    c.compare_typed(got)


def check_unique_violation():
    expect(ledger, "no orders (inserts failed)")
    existing = next(iter(ledger))
    try:
        conn.execute("INSERT INTO psycopg3_orders (id, customer_id, amount, note) VALUES (%s, 1, 1, 'dup')",
                     (existing,))
    except psycopg.Error as e:
        expect(e.sqlstate == "23505", "SQLSTATE %s, want 23505: %s" % (e.sqlstate, e))
        expect(e.diag.table_name == "psycopg3_orders", "table_name %r, want 'psycopg3_orders'" % e.diag.table_name)
        expect(e.diag.constraint_name == "psycopg3_orders_pkey",
               "constraint_name %r, want 'psycopg3_orders_pkey'" % e.diag.constraint_name)
        return
    raise CheckFailed("duplicate key accepted")


def check_cursor():
    table, fill = c.big_table(P)
    if fill:
        conn.execute(fill)
    count = 0
    total = 0
    with conn.transaction():
        with conn.cursor(name="psycopg3_big_cursor") as cur:
            cur.itersize = 1000
            cur.execute("SELECT id, v FROM " + table)
            for _id, v in cur:
                count += 1
                total += v
    expect(count == c.BIG_ROWS and total == c.BIG_SUM_V,
           "count %d sum %d, want %d %d" % (count, total, c.BIG_ROWS, c.BIG_SUM_V))


def check_listen_notify():
    listener = connect(autocommit=True)
    try:
        listener.execute("LISTEN psycopg3_channel")
        notifier = connect(autocommit=True)
        try:
            # Notify from another thread shortly after the listener went idle.
            t = threading.Timer(0.2, lambda: notifier.execute("SELECT pg_notify('psycopg3_channel', %s)",
                                                              (c.NOTIFY_PAYLOAD,)))
            t.start()
            got = None
            for n in listener.notifies(timeout=5, stop_after=1):
                got = n
            t.join()
            expect(got is not None, "no notification within 5 s")
            expect(got.channel == "psycopg3_channel" and got.payload == c.NOTIFY_PAYLOAD,
                   "got %r" % (got,))
        finally:
            notifier.close()
    finally:
        listener.close()


def main():
    R.run("connect", check_connect, recover)
    if conn is None:
        R.fail("all", "cannot connect, remaining checks skipped")
        R.finish()
    for name, fn in [
        ("ddl", check_ddl),
        ("insert_returning", check_insert_returning),
        ("batch_insert", check_batch_insert),
        ("serial_insert", check_serial_insert),
        ("prepared_select", check_prepared_select),
        ("aggregate", check_aggregate),
        ("ref_join", check_ref_join),
        ("rollback", check_rollback),
        ("types", check_types),
        ("unique_violation", check_unique_violation),
        ("cursor", check_cursor),
        ("listen_notify", check_listen_notify),
    ]:
        R.run(name, lambda fn=fn: (ensure(), fn())[1], recover)
    R.finish()


if __name__ == "__main__":
    main()
