"""Client matrix: SQLAlchemy 2 (ORM + Core) on psycopg 3."""

import threading

from sqlalchemy import (BigInteger, Boolean, Date, DateTime, Float, Identity, Integer, LargeBinary,
                        MetaData, Numeric, SmallInteger, Table, Text, create_engine, func, insert, inspect, select, text)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import common as c
from common import CheckFailed, expect

CLIENT = "sqlalchemy"
P = "sqla_"
R = c.Reporter(CLIENT)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "sqla_orders"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    customer_id: Mapped[int] = mapped_column(Integer, nullable=True)
    amount = mapped_column(Numeric)
    note = mapped_column(Text)
    created = mapped_column(DateTime(timezone=True), server_default=func.now())


class Event(Base):
    __tablename__ = "sqla_events"
    # BIGSERIAL, not the distribution column.
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    tenant_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    payload = mapped_column(Text)


class Customer(Base):
    __tablename__ = "sqla_customers"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    name = mapped_column(Text)


class Typed(Base):
    __tablename__ = "sqla_types"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    c_int2 = mapped_column(SmallInteger)
    c_int4 = mapped_column(Integer)
    c_int8 = mapped_column(BigInteger)
    c_numeric = mapped_column(Numeric)
    c_float8 = mapped_column(Float(53))
    c_bool = mapped_column(Boolean)
    c_text = mapped_column(Text)
    c_bytea = mapped_column(LargeBinary)
    c_date = mapped_column(Date)
    c_ts = mapped_column(DateTime(timezone=True))
    c_uuid = mapped_column(UUID(as_uuid=True))
    c_jsonb = mapped_column(JSONB)
    c_int_arr = mapped_column(ARRAY(Integer))
    c_text_arr = mapped_column(ARRAY(Text))


class Big(Base):
    __tablename__ = "sqla_big"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    k = mapped_column(Integer)
    v = mapped_column(BigInteger)


URL = "postgresql+psycopg://%s@%s:%d/%s" % (c.PGUSER, c.PGHOST, c.PGPORT, c.PGDATABASE)
engine = None
ledger = {}


def make_engine():
    kw = {"connect_timeout": 10}
    if c.PGPASSWORD:
        kw["password"] = c.PGPASSWORD
    return create_engine(URL, connect_args=kw, pool_pre_ping=True)


def recover():
    # A check that timed out may leave a pooled connection mid-command: start
    # from a fresh pool (pre-ping replaces connections that died otherwise).
    if engine is not None:
        engine.dispose()


def check_connect():
    global engine
    eng = make_engine()
    with eng.connect() as conn:
        expect(conn.execute(text("SELECT 1")).scalar() == 1, "SELECT 1")
    engine = eng


def check_ddl():
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS sqla_orders, sqla_events, sqla_customers, sqla_types, sqla_big CASCADE"))
        Base.metadata.create_all(conn)
        if c.TESSERA:
            for stmt in c.fmt(c.distribute(P), P):
                conn.execute(text(stmt))


def check_reflect():
    md = MetaData()
    md.reflect(bind=engine, only=["sqla_orders", "sqla_events"])
    orders = md.tables["sqla_orders"]
    expect([col.name for col in orders.columns] == ["id", "customer_id", "amount", "note", "created"],
           "sqla_orders columns %r" % [col.name for col in orders.columns])
    expect([col.name for col in orders.primary_key] == ["id"], "sqla_orders primary key %r" % list(orders.primary_key))
    expect(orders.c.id.identity is not None, "sqla_orders.id not reflected as an identity column")
    insp = inspect(engine)
    pk = insp.get_pk_constraint("sqla_events")
    expect(sorted(pk["constrained_columns"]) == ["seq", "tenant_id"], "sqla_events pk %r" % pk)
    seq_col = [col for col in insp.get_columns("sqla_events") if col["name"] == "seq"][0]
    expect("nextval" in str(seq_col.get("default")), "sqla_events.seq default %r" % seq_col.get("default"))


def check_insert_returning():
    cust, amount, note = c.order_rows(1)[0]
    with engine.begin() as conn:
        key = conn.execute(insert(Order).values(customer_id=cust, amount=amount, note=note)
                           .returning(Order.id)).scalar_one()
    expect(key is not None, "no id returned")
    ledger[key] = (cust, amount)


def check_batch_insert():
    rows = c.order_rows(100, start=1)
    with engine.begin() as conn:
        # Core executemany with RETURNING: SQLAlchemy's "insertmanyvalues" batching.
        result = conn.execute(insert(Order.__table__).returning(Order.id, sort_by_parameter_order=True),
                              [dict(customer_id=cu, amount=a, note=n) for cu, a, n in rows])
        ids = [r[0] for r in result]
    expect(len(ids) == 100 and None not in ids and len(set(ids)) == 100, "ids not distinct / NULL: %r" % ids[:5])
    expect(not set(ids) & set(ledger), "ids collide with earlier ids")
    for i, (cust, amount, _) in zip(ids, rows):
        ledger[i] = (cust, amount)


def check_orm_add_all():
    rows = c.order_rows(100, start=200)
    with Session(engine) as session:
        objs = [Order(customer_id=cu, amount=a, note=n) for cu, a, n in rows]
        session.add_all(objs)
        session.commit()
        ids = [o.id for o in objs]
    expect(None not in ids and len(set(ids)) == 100, "ids not distinct / NULL")
    expect(not set(ids) & set(ledger), "ids collide with earlier ids")
    for i, (cust, amount, _) in zip(ids, rows):
        ledger[i] = (cust, amount)


def check_serial_insert():
    with Session(engine) as session:
        evs = [Event(tenant_id=t, payload="event for %d" % t) for t in (1, 2, 3, 1, 2, 3)]
        session.add_all(evs)
        session.commit()
        seqs = [e.seq for e in evs]
        n = session.scalar(select(func.count()).select_from(Event).where(Event.tenant_id == 2))
    expect(None not in seqs and len(set(seqs)) == len(seqs), "seqs not distinct/non-null: %r" % seqs)
    expect(n == 2, "tenant 2 has %d events, want 2" % n)


def check_prepared_select():
    # psycopg prepares a statement on the server after prepare_threshold (5)
    # executions of the same query on a connection; 10 executions get there.
    expect(ledger, "no orders to select (inserts failed)")
    with engine.connect() as conn:
        for key, (cust, amount) in list(ledger.items())[:10]:
            row = conn.execute(select(Order.id, Order.customer_id, Order.amount).where(Order.id == key)).one_or_none()
            expect(row is not None and tuple(row) == (key, cust, amount), "id %d: got %r" % (key, row))


def check_aggregate():
    rows = c.order_rows(30, start=500)
    with engine.begin() as conn:
        conn.execute(insert(Order.__table__), [dict(id=c.AGG_ID_BASE + i, customer_id=cu, amount=a, note=n)
                                               for i, (cu, a, n) in enumerate(rows)])
    for i, (cust, amount, _) in enumerate(rows):
        ledger[c.AGG_ID_BASE + i] = (cust, amount)
    with Session(engine) as session:
        got = {r[0]: (r[1], r[2]) for r in session.execute(
            select(Order.customer_id, func.count(), func.sum(Order.amount))
            .group_by(Order.customer_id).order_by(Order.customer_id))}
    want = c.expected_aggregate(ledger)
    expect(got == want, "got %r, want %r" % (got, want))


def check_ref_join():
    with Session(engine) as session:
        session.add_all([Customer(id=i, name=n) for i, n in c.CUSTOMERS])
        session.commit()
        got = dict(session.execute(
            select(Customer.name, func.count()).join(Order, Order.customer_id == Customer.id)
            .group_by(Customer.name).order_by(Customer.name)).all())
    want = c.expected_join(ledger)
    expect(got == want, "got %r, want %r" % (got, want))


def check_rollback():
    with Session(engine) as session:
        session.add(Order(id=c.ROLLBACK_ID, customer_id=1, amount=1, note="rolled back"))
        session.flush()
        expect(session.get(Order, c.ROLLBACK_ID) is not None, "row not visible inside its transaction")
        session.rollback()
        n = session.scalar(select(func.count()).select_from(Order).where(Order.id == c.ROLLBACK_ID))
    expect(n == 0, "row still there after rollback")


def check_types():
    with Session(engine) as session:
        session.add(Typed(id=1, **c.TYPED))
        session.commit()
    with Session(engine) as session:
        obj = session.get(Typed, 1)
        expect(obj is not None, "row not found")
        c.compare_typed({k: getattr(obj, k) for k in c.TYPED_COLUMNS})


def check_unique_violation():
    expect(ledger, "no orders (inserts failed)")
    existing = next(iter(ledger))
    try:
        with Session(engine) as session:
            session.add(Order(id=existing, customer_id=1, amount=1, note="dup"))
            session.commit()
    except DBAPIError as e:
        d = e.orig
        expect(d.sqlstate == "23505", "SQLSTATE %s, want 23505: %s" % (d.sqlstate, d))
        expect(d.diag.table_name == "sqla_orders", "table_name %r, want 'sqla_orders'" % d.diag.table_name)
        expect(d.diag.constraint_name == "sqla_orders_pkey",
               "constraint_name %r, want 'sqla_orders_pkey'" % d.diag.constraint_name)
        return
    raise CheckFailed("duplicate key accepted")


def check_cursor():
    table, fill = c.big_table(P)
    if fill:
        with engine.begin() as conn:
            conn.execute(text(fill))
    big = Big.__table__ if table == Big.__tablename__ else Table(table, MetaData(), autoload_with=engine)
    count = total = 0
    with engine.connect() as conn:
        # stream_results: a psycopg server-side (named) cursor, yield_per rows a FETCH.
        result = conn.execution_options(yield_per=1000).execute(select(big.c.id, big.c.v))
        for _id, v in result:
            count += 1
            total += v
    expect(count == c.BIG_ROWS and total == c.BIG_SUM_V,
           "count %d sum %d, want %d %d" % (count, total, c.BIG_ROWS, c.BIG_SUM_V))


def check_listen_notify():
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as listener:
        listener.execute(text("LISTEN sqla_channel"))
        pg = listener.connection.driver_connection  # SQLAlchemy has no LISTEN API of its own

        def notify():
            with engine.begin() as conn:
                conn.execute(text("SELECT pg_notify('sqla_channel', :p)"), {"p": c.NOTIFY_PAYLOAD})

        t = threading.Timer(0.2, notify)
        t.start()
        got = None
        for n in pg.notifies(timeout=5, stop_after=1):
            got = n
        t.join()
        listener.execute(text("UNLISTEN sqla_channel"))
    expect(got is not None, "no notification within 5 s")
    expect(got.channel == "sqla_channel" and got.payload == c.NOTIFY_PAYLOAD, "got %r" % (got,))


def main():
    R.run("connect", check_connect, recover)
    if engine is None:
        R.fail("all", "cannot connect, remaining checks skipped")
        R.finish()
    for name, fn in [
        ("ddl", check_ddl),
        ("reflect", check_reflect),
        ("insert_returning", check_insert_returning),
        ("batch_insert", check_batch_insert),
        ("orm_add_all", check_orm_add_all),
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
        R.run(name, fn, recover)
    R.finish()


if __name__ == "__main__":
    main()
