"""Client matrix: psycopg2 (libpq, client-side parameter interpolation)."""

import os
import select
import socket
import time

import psycopg2
import psycopg2.extensions
import psycopg2.extras

import common as c
from common import CheckFailed, expect

CLIENT = "psycopg2"
P = "psycopg2_"
R = c.Reporter(CLIENT)

psycopg2.extras.register_uuid()

conn = None
ledger = {}
open_conns = []  # every connection made, for the watchdog


def connect():
    cn = psycopg2.connect(host=c.PGHOST, port=c.PGPORT, user=c.PGUSER, dbname=c.PGDATABASE,
                          password=c.PGPASSWORD, connect_timeout=10)
    open_conns.append(cn)
    return cn


def interrupt():
    """Watchdog: psycopg2 blocks inside libpq, so shut the sockets down under it."""
    for cn in open_conns:
        if not cn.closed:
            try:
                s = socket.socket(fileno=os.dup(cn.fileno()))
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass


def recover():
    global conn
    if conn is None or conn.closed:
        conn = connect()
        return
    try:
        conn.rollback()
    except psycopg2.Error:
        conn.close()
        conn = connect()


def ensure():
    """Before each check: a new session if the last one could not be recovered."""
    global conn
    if conn is None or conn.closed:
        conn = connect()


def check_connect():
    global conn
    conn = connect()  # psycopg2's default: every statement opens a transaction, commit() ends it
    with conn.cursor() as cur:
        cur.execute("SELECT 1")
        expect(cur.fetchone()[0] == 1, "SELECT 1")
    conn.commit()


def check_ddl():
    with conn.cursor() as cur:
        for stmt in c.fmt(c.ddl(P), P):
            cur.execute(stmt)
        if c.TESSERA:
            for stmt in c.fmt(c.distribute(P), P):
                cur.execute(stmt)
    conn.commit()


def check_insert_returning():
    cust, amount, note = c.order_rows(1)[0]
    with conn.cursor() as cur:
        cur.execute("INSERT INTO psycopg2_orders (customer_id, amount, note) VALUES (%s, %s, %s) RETURNING id",
                    (cust, amount, note))
        row = cur.fetchone()
    conn.commit()
    expect(row is not None and row[0] is not None, "no id returned")
    ledger[row[0]] = (cust, amount)


def check_batch_insert():
    rows = c.order_rows(100, start=1)
    with conn.cursor() as cur:
        # psycopg2's batch helper: one multi-row VALUES statement per page.
        ids = [r[0] for r in psycopg2.extras.execute_values(
            cur, "INSERT INTO psycopg2_orders (customer_id, amount, note) VALUES %s RETURNING id",
            rows, page_size=100, fetch=True)]
    conn.commit()
    expect(len(ids) == 100, "expected 100 ids, got %d" % len(ids))
    expect(None not in ids and len(set(ids)) == 100, "ids not distinct / NULL")
    expect(not set(ids) & set(ledger), "ids collide with earlier ids")
    for i, (cust, amount, _) in zip(ids, rows):
        ledger[i] = (cust, amount)


def check_serial_insert():
    seqs = []
    with conn.cursor() as cur:
        for t in (1, 2, 3, 1, 2, 3):
            cur.execute("INSERT INTO psycopg2_events (tenant_id, payload) VALUES (%s, %s) RETURNING seq",
                        (t, "event for %d" % t))
            seqs.append(cur.fetchone()[0])
        conn.commit()
        cur.execute("SELECT count(*) FROM psycopg2_events WHERE tenant_id = %s", (2,))
        n = cur.fetchone()[0]
    conn.commit()
    expect(None not in seqs and len(set(seqs)) == len(seqs), "seqs not distinct/non-null: %r" % seqs)
    expect(n == 2, "tenant 2 has %d events, want 2" % n)


def check_prepared_select():
    # psycopg2 has no protocol-level prepare; applications use SQL PREPARE/EXECUTE.
    expect(ledger, "no orders to select (inserts failed)")
    with conn.cursor() as cur:
        cur.execute("PREPARE psycopg2_by_id (bigint) AS SELECT id, customer_id, amount FROM psycopg2_orders WHERE id = $1")
        try:
            for key, (cust, amount) in list(ledger.items())[:10]:
                cur.execute("EXECUTE psycopg2_by_id (%s)", (key,))
                row = cur.fetchone()
                expect(row == (key, cust, amount), "id %d: got %r" % (key, row))
        finally:
            conn.rollback()
            cur.execute("DEALLOCATE ALL")
    conn.commit()


def check_aggregate():
    rows = c.order_rows(30, start=500)
    with conn.cursor() as cur:
        psycopg2.extras.execute_values(
            cur, "INSERT INTO psycopg2_orders (id, customer_id, amount, note) VALUES %s",
            [(c.AGG_ID_BASE + i,) + r for i, r in enumerate(rows)])
        conn.commit()
        for i, (cust, amount, _) in enumerate(rows):
            ledger[c.AGG_ID_BASE + i] = (cust, amount)
        cur.execute("SELECT customer_id, count(*), sum(amount) FROM psycopg2_orders GROUP BY customer_id ORDER BY customer_id")
        got = {r[0]: (r[1], r[2]) for r in cur.fetchall()}
    conn.commit()
    want = c.expected_aggregate(ledger)
    expect(got == want, "got %r, want %r" % (got, want))


def check_ref_join():
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO psycopg2_customers (id, name) VALUES (%s, %s)", c.CUSTOMERS)
        conn.commit()
        cur.execute("SELECT c.name, count(*) FROM psycopg2_orders o JOIN psycopg2_customers c ON c.id = o.customer_id"
                    " GROUP BY c.name ORDER BY c.name")
        got = dict(cur.fetchall())
    conn.commit()
    want = c.expected_join(ledger)
    expect(got == want, "got %r, want %r" % (got, want))


def check_rollback():
    with conn.cursor() as cur:
        cur.execute("INSERT INTO psycopg2_orders (id, customer_id, amount, note) VALUES (%s, 1, 1, 'rolled back')",
                    (c.ROLLBACK_ID,))
        cur.execute("SELECT count(*) FROM psycopg2_orders WHERE id = %s", (c.ROLLBACK_ID,))
        expect(cur.fetchone()[0] == 1, "row not visible inside its transaction")
        conn.rollback()
        cur.execute("SELECT count(*) FROM psycopg2_orders WHERE id = %s", (c.ROLLBACK_ID,))
        n = cur.fetchone()[0]
    conn.commit()
    expect(n == 0, "row still there after rollback")


def check_types():
    cols = c.TYPED_COLUMNS
    values = [psycopg2.extras.Json(v) if k == "c_jsonb" else v for k, v in c.TYPED.items()]
    with conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
        cur.execute("INSERT INTO psycopg2_types (id, %s) VALUES (%%s, %s)" % (", ".join(cols), ", ".join(["%s"] * len(cols))),
                    [1] + values)
        conn.commit()
        cur.execute("SELECT %s FROM psycopg2_types WHERE id = %%s" % ", ".join(cols), (1,))
        got = cur.fetchone()
    conn.commit()
    expect(got is not None, "row not found")
    c.compare_typed(dict(got))


def check_unique_violation():
    expect(ledger, "no orders (inserts failed)")
    existing = next(iter(ledger))
    try:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO psycopg2_orders (id, customer_id, amount, note) VALUES (%s, 1, 1, 'dup')",
                        (existing,))
        conn.commit()
    except psycopg2.Error as e:
        conn.rollback()
        expect(e.pgcode == "23505", "SQLSTATE %s, want 23505: %s" % (e.pgcode, e))
        expect(e.diag.table_name == "psycopg2_orders", "table_name %r, want 'psycopg2_orders'" % e.diag.table_name)
        expect(e.diag.constraint_name == "psycopg2_orders_pkey",
               "constraint_name %r, want 'psycopg2_orders_pkey'" % e.diag.constraint_name)
        return
    raise CheckFailed("duplicate key accepted")


def check_cursor():
    table, fill = c.big_table(P)
    if fill:
        with conn.cursor() as cur:
            cur.execute(fill)
        conn.commit()
    count = total = 0
    with conn.cursor(name="psycopg2_big_cursor") as cur:  # DECLARE ... CURSOR, FETCH itersize at a time
        cur.itersize = 1000
        cur.execute("SELECT id, v FROM " + table)
        for _id, v in cur:
            count += 1
            total += v
    conn.commit()
    expect(count == c.BIG_ROWS and total == c.BIG_SUM_V,
           "count %d sum %d, want %d %d" % (count, total, c.BIG_ROWS, c.BIG_SUM_V))


def check_listen_notify():
    listener = connect()
    notifier = connect()
    try:
        listener.set_isolation_level(psycopg2.extensions.ISOLATION_LEVEL_AUTOCOMMIT)
        notifier.set_isolation_level(psycopg2.extensions.ISOLATION_LEVEL_AUTOCOMMIT)
        with listener.cursor() as cur:
            cur.execute("LISTEN psycopg2_channel")
        with notifier.cursor() as cur:
            cur.execute("NOTIFY psycopg2_channel, %s", (c.NOTIFY_PAYLOAD,))
        deadline = time.monotonic() + 5
        while not listener.notifies:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CheckFailed("no notification within 5 s")
            if select.select([listener], [], [], left) != ([], [], []):
                listener.poll()
        n = listener.notifies.pop(0)
        expect(n.channel == "psycopg2_channel" and n.payload == c.NOTIFY_PAYLOAD, "got %r" % (n,))
    finally:
        listener.close()
        notifier.close()


def main():
    R.run("connect", check_connect, recover, interrupt)
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
        R.run(name, lambda fn=fn: (ensure(), fn())[1], recover, interrupt)
    R.finish()


if __name__ == "__main__":
    main()
