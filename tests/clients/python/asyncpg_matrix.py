"""Client matrix: asyncpg (binary protocol, every query is a prepared statement)."""

import asyncio
import json

import asyncpg

import common as c
from common import CheckFailed, expect

CLIENT = "asyncpg"
P = "asyncpg_"
R = c.Reporter(CLIENT)

conn = None
ledger = {}


async def connect():
    cn = await asyncpg.connect(host=c.PGHOST, port=c.PGPORT, user=c.PGUSER, database=c.PGDATABASE,
                               password=c.PGPASSWORD, timeout=10)
    await cn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    return cn


async def recover():
    """After a failed check: a fresh connection unless the old one is idle and healthy."""
    global conn
    if conn is not None and not conn.is_closed() and not conn.is_in_transaction():
        try:
            await asyncio.wait_for(conn.fetchval("SELECT 1"), 5)
            return
        except Exception:  # noqa: BLE001
            pass
    if conn is not None:
        conn.terminate()
    conn = await connect()


async def ensure():
    """Before each check: a new session if the last one could not be recovered."""
    global conn
    if conn is None or conn.is_closed():
        conn = await connect()


async def check_connect():
    global conn
    conn = await connect()
    expect(await conn.fetchval("SELECT 1") == 1, "SELECT 1")


async def check_ddl():
    for stmt in c.fmt(c.ddl(P), P):
        await conn.execute(stmt)
    if c.TESSERA:
        for stmt in c.fmt(c.distribute(P), P):
            await conn.execute(stmt)


async def check_insert_returning():
    cust, amount, note = c.order_rows(1)[0]
    key = await conn.fetchval(
        "INSERT INTO asyncpg_orders (customer_id, amount, note) VALUES ($1, $2, $3) RETURNING id", cust, amount, note)
    expect(key is not None, "no id returned")
    ledger[key] = (cust, amount)


async def check_batch_insert():
    rows = c.order_rows(100, start=1)
    # asyncpg's batch API with results (pipelined executions of one prepared statement).
    async with conn.transaction():
        ids = [r[0] for r in await conn.fetchmany(
            "INSERT INTO asyncpg_orders (customer_id, amount, note) VALUES ($1, $2, $3) RETURNING id", rows)]
    expect(len(ids) == 100 and None not in ids and len(set(ids)) == 100, "ids not distinct / NULL")
    expect(not set(ids) & set(ledger), "ids collide with earlier ids")
    for i, (cust, amount, _) in zip(ids, rows):
        ledger[i] = (cust, amount)


async def check_serial_insert():
    seqs = []
    async with conn.transaction():
        for t in (1, 2, 3, 1, 2, 3):
            seqs.append(await conn.fetchval(
                "INSERT INTO asyncpg_events (tenant_id, payload) VALUES ($1, $2) RETURNING seq", t, "event for %d" % t))
    expect(None not in seqs and len(set(seqs)) == len(seqs), "seqs not distinct/non-null: %r" % seqs)
    n = await conn.fetchval("SELECT count(*) FROM asyncpg_events WHERE tenant_id = $1", 2)
    expect(n == 2, "tenant 2 has %d events, want 2" % n)


async def check_prepared_select():
    expect(ledger, "no orders to select (inserts failed)")
    stmt = await conn.prepare("SELECT id, customer_id, amount FROM asyncpg_orders WHERE id = $1")
    for key, (cust, amount) in list(ledger.items())[:10]:
        row = await stmt.fetchrow(key)
        expect(row is not None and tuple(row) == (key, cust, amount), "id %d: got %r" % (key, row))


async def check_aggregate():
    rows = c.order_rows(30, start=500)
    await conn.executemany("INSERT INTO asyncpg_orders (id, customer_id, amount, note) VALUES ($1, $2, $3, $4)",
                           [(c.AGG_ID_BASE + i,) + r for i, r in enumerate(rows)])
    for i, (cust, amount, _) in enumerate(rows):
        ledger[c.AGG_ID_BASE + i] = (cust, amount)
    got = {r[0]: (r[1], r[2]) for r in await conn.fetch(
        "SELECT customer_id, count(*), sum(amount) FROM asyncpg_orders GROUP BY customer_id ORDER BY customer_id")}
    want = c.expected_aggregate(ledger)
    expect(got == want, "got %r, want %r" % (got, want))


async def check_ref_join():
    await conn.executemany("INSERT INTO asyncpg_customers (id, name) VALUES ($1, $2)", c.CUSTOMERS)
    got = {r[0]: r[1] for r in await conn.fetch(
        "SELECT c.name, count(*) FROM asyncpg_orders o JOIN asyncpg_customers c ON c.id = o.customer_id"
        " GROUP BY c.name ORDER BY c.name")}
    want = c.expected_join(ledger)
    expect(got == want, "got %r, want %r" % (got, want))


async def check_rollback():
    tr = conn.transaction()
    await tr.start()
    try:
        await conn.execute("INSERT INTO asyncpg_orders (id, customer_id, amount, note) VALUES ($1, 1, 1, 'rolled back')",
                           c.ROLLBACK_ID)
        n = await conn.fetchval("SELECT count(*) FROM asyncpg_orders WHERE id = $1", c.ROLLBACK_ID)
        expect(n == 1, "row not visible inside its transaction")
    finally:
        await tr.rollback()
    n = await conn.fetchval("SELECT count(*) FROM asyncpg_orders WHERE id = $1", c.ROLLBACK_ID)
    expect(n == 0, "row still there after rollback")


async def check_types():
    cols = c.TYPED_COLUMNS
    await conn.execute("INSERT INTO asyncpg_types (id, %s) VALUES ($1, %s)"
                       % (", ".join(cols), ", ".join("$%d" % (i + 2) for i in range(len(cols)))),
                       1, *c.TYPED.values())
    row = await conn.fetchrow("SELECT %s FROM asyncpg_types WHERE id = $1" % ", ".join(cols), 1)
    expect(row is not None, "row not found")
    got = dict(row)
    # asyncpg returns its own UUID type; compare as the standard one.
    if got["c_uuid"] is not None:
        import uuid
        got["c_uuid"] = uuid.UUID(str(got["c_uuid"]))
    c.compare_typed(got)


async def check_unique_violation():
    expect(ledger, "no orders (inserts failed)")
    existing = next(iter(ledger))
    try:
        await conn.execute("INSERT INTO asyncpg_orders (id, customer_id, amount, note) VALUES ($1, 1, 1, 'dup')",
                           existing)
    except asyncpg.PostgresError as e:
        expect(e.sqlstate == "23505", "SQLSTATE %s, want 23505: %s" % (e.sqlstate, e))
        expect(e.table_name == "asyncpg_orders", "table_name %r, want 'asyncpg_orders'" % e.table_name)
        expect(e.constraint_name == "asyncpg_orders_pkey",
               "constraint_name %r, want 'asyncpg_orders_pkey'" % e.constraint_name)
        return
    raise CheckFailed("duplicate key accepted")


async def check_cursor():
    table, fill = c.big_table(P)
    if fill:
        await conn.execute(fill)
    count = total = 0
    async with conn.transaction():
        cur = await conn.cursor("SELECT id, v FROM " + table)
        first = await cur.fetch(3)
        expect(len(first) == 3, "fetch(3) returned %d rows" % len(first))
        for r in first:
            count += 1
            total += r["v"]
        while True:
            batch = await cur.fetch(1000)
            if not batch:
                break
            expect(len(batch) <= 1000, "fetch(1000) returned %d rows" % len(batch))
            count += len(batch)
            total += sum(r["v"] for r in batch)
    expect(count == c.BIG_ROWS and total == c.BIG_SUM_V,
           "count %d sum %d, want %d %d" % (count, total, c.BIG_ROWS, c.BIG_SUM_V))


async def check_listen_notify():
    listener = await connect()
    notifier = await connect()
    try:
        got = asyncio.get_running_loop().create_future()

        def on_notify(_conn, pid, channel, payload):
            if not got.done():
                got.set_result((channel, payload))

        await listener.add_listener("asyncpg_channel", on_notify)
        await notifier.execute("SELECT pg_notify('asyncpg_channel', $1)", c.NOTIFY_PAYLOAD)
        try:
            channel, payload = await asyncio.wait_for(got, 5)
        except asyncio.TimeoutError:
            raise CheckFailed("no notification within 5 s")
        expect(channel == "asyncpg_channel" and payload == c.NOTIFY_PAYLOAD, "got %r %r" % (channel, payload))
    finally:
        await listener.close()
        await notifier.close()


async def main():
    await R.arun("connect", check_connect, recover)
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
        async def with_conn(fn=fn):
            await ensure()
            return await fn()

        await R.arun(name, with_conn, recover)
    if conn is not None and not conn.is_closed():
        await conn.close()
    R.finish()


if __name__ == "__main__":
    asyncio.run(main())
