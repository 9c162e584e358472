"""Client matrix: Django 5 ORM on psycopg 3 (settings in djangoapp/matrix_settings.py)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "djangoapp"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "matrix_settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import IntegrityError, connection, connections, transaction  # noqa: E402
from django.db.models import Count, Sum  # noqa: E402

import common as c  # noqa: E402
from common import CheckFailed, expect  # noqa: E402
from matrixapp.models import Big, Customer, Order, Typed  # noqa: E402

CLIENT = "django"
R = c.Reporter(CLIENT)
ledger = {}
connected = False


def recover():
    # Django reconnects lazily; atomic() has already rolled back.
    connections.close_all()


def check_connect():
    global connected
    with connection.cursor() as cur:
        cur.execute("SELECT 1")
        expect(cur.fetchone()[0] == 1, "SELECT 1")
    connected = True


def check_migrate():
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS dj_orders, dj_events, dj_customers, dj_types, dj_big CASCADE")
        cur.execute("SELECT to_regclass('django_migrations') IS NOT NULL")
        if cur.fetchone()[0]:
            cur.execute("DELETE FROM django_migrations WHERE app = 'matrixapp'")
    call_command("migrate", "matrixapp", verbosity=0, interactive=False)
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM django_migrations WHERE app = 'matrixapp'")
        expect(cur.fetchone()[0] == 1, "migration not recorded")


def check_insert_returning():
    cust, amount, note = c.order_rows(1)[0]
    o = Order.objects.create(customer_id=cust, amount=amount, note=note)
    expect(o.id is not None, "no id returned")
    ledger[o.id] = (cust, amount)


def check_batch_insert():
    rows = c.order_rows(100, start=1)
    objs = Order.objects.bulk_create([Order(customer_id=cu, amount=a, note=n) for cu, a, n in rows])
    ids = [o.id for o in objs]
    expect(None not in ids and len(set(ids)) == 100, "bulk_create ids not set / not distinct: %r" % ids[:5])
    expect(not set(ids) & set(ledger), "ids collide with earlier ids")
    for i, (cust, amount, _) in zip(ids, rows):
        ledger[i] = (cust, amount)


def check_serial_insert():
    seqs = []
    with transaction.atomic(), connection.cursor() as cur:
        for t in (1, 2, 3, 1, 2, 3):
            cur.execute("INSERT INTO dj_events (tenant_id, payload) VALUES (%s, %s) RETURNING seq", [t, "event %d" % t])
            seqs.append(cur.fetchone()[0])
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM dj_events WHERE tenant_id = %s", [2])
        n = cur.fetchone()[0]
    expect(None not in seqs and len(set(seqs)) == len(seqs), "seqs not distinct/non-null: %r" % seqs)
    expect(n == 2, "tenant 2 has %d events, want 2" % n)


def check_prepared_select():
    expect(ledger, "no orders to select (inserts failed)")
    for key, (cust, amount) in list(ledger.items())[:10]:
        o = Order.objects.using("prepared").get(pk=key)
        expect((o.customer_id, o.amount) == (cust, amount), "id %d: got %r" % (key, (o.customer_id, o.amount)))


def add_ledger_rows(objs):
    for o in objs:
        ledger[o.id] = (o.customer_id, o.amount)


def check_aggregate():
    rows = c.order_rows(30, start=500)
    objs = [Order(id=c.AGG_ID_BASE + i, customer_id=cu, amount=a, note=n) for i, (cu, a, n) in enumerate(rows)]
    Order.objects.bulk_create(objs)
    add_ledger_rows(objs)
    got = {r["customer_id"]: (r["n"], r["s"]) for r in
           Order.objects.values("customer_id").annotate(n=Count("id"), s=Sum("amount")).order_by("customer_id")}
    want = c.expected_aggregate(ledger)
    expect(got == want, "got %r, want %r" % (got, want))


def check_ref_join():
    Customer.objects.bulk_create([Customer(id=i, name=n) for i, n in c.CUSTOMERS])
    got = {r["customer__name"]: r["n"] for r in
           Order.objects.values("customer__name").annotate(n=Count("id")).order_by("customer__name")}
    want = c.expected_join(ledger)
    expect(got == want, "got %r, want %r" % (got, want))
    # select_related: the same join, row by row.
    o = Order.objects.select_related("customer").order_by("id").first()
    expect(o is not None and o.customer.name == dict(c.CUSTOMERS)[o.customer_id], "select_related mismatch")


def check_rollback():
    class Rollback(Exception):
        pass

    try:
        with transaction.atomic():
            Order.objects.create(id=c.ROLLBACK_ID, customer_id=1, amount=1, note="rolled back")
            expect(Order.objects.filter(id=c.ROLLBACK_ID).exists(), "row not visible inside its transaction")
            raise Rollback()
    except Rollback:
        pass
    expect(not Order.objects.filter(id=c.ROLLBACK_ID).exists(), "row still there after rollback")


def check_types():
    Typed.objects.create(id=1, **c.TYPED)
    obj = Typed.objects.get(id=1)
    c.compare_typed({k: getattr(obj, k) for k in c.TYPED_COLUMNS})


def check_unique_violation():
    expect(ledger, "no orders (inserts failed)")
    existing = next(iter(ledger))
    try:
        with transaction.atomic():
            Order.objects.create(id=existing, customer_id=1, amount=1, note="dup")
    except IntegrityError as e:
        d = e.__cause__
        expect(d is not None and d.sqlstate == "23505", "SQLSTATE %s, want 23505: %s" % (c.sqlstate_of(e), e))
        expect(d.diag.table_name == "dj_orders", "table_name %r, want 'dj_orders'" % d.diag.table_name)
        expect(d.diag.constraint_name == "dj_orders_pkey",
               "constraint_name %r, want 'dj_orders_pkey'" % d.diag.constraint_name)
        return
    raise CheckFailed("duplicate key accepted")


def check_bulk_create_ignore():
    existing = sorted(k for k in ledger if k < c.AGG_ID_BASE)[:5]
    expect(len(existing) == 5, "not enough orders (inserts failed)")
    new_ids = [3_000_001 + i for i in range(5)]
    objs = [Order(id=k, customer_id=1, amount=1, note="ignored") for k in existing]
    objs += [Order(id=k, customer_id=2, amount=2, note="inserted") for k in new_ids]
    Order.objects.bulk_create(objs, ignore_conflicts=True)
    for k in new_ids:
        ledger[k] = (2, 2)
    notes = dict(Order.objects.filter(id__in=existing + new_ids).values_list("id", "note"))
    expect(all(notes.get(k) not in (None, "ignored") for k in existing), "conflicting rows were changed: %r" % notes)
    expect(all(notes.get(k) == "inserted" for k in new_ids), "new rows missing: %r" % notes)


def check_bulk_create_update():
    existing = sorted(k for k in ledger if k < c.AGG_ID_BASE)[5:10]
    expect(len(existing) == 5, "not enough orders (inserts failed)")
    new_ids = [3_000_101 + i for i in range(5)]
    objs = [Order(id=k, customer_id=ledger[k][0], amount=ledger[k][1], note="updated") for k in existing]
    objs += [Order(id=k, customer_id=3, amount=3, note="upserted") for k in new_ids]
    Order.objects.bulk_create(objs, update_conflicts=True, unique_fields=["id"], update_fields=["note"])
    for k in new_ids:
        ledger[k] = (3, 3)
    notes = dict(Order.objects.filter(id__in=existing + new_ids).values_list("id", "note"))
    expect(all(notes.get(k) == "updated" for k in existing), "conflicting rows not updated: %r" % notes)
    expect(all(notes.get(k) == "upserted" for k in new_ids), "new rows missing: %r" % notes)


def check_iterator_atomic():
    with transaction.atomic():
        o = Order.objects.create(customer_id=4, amount=4, note="before iterating")
        ledger[o.id] = (4, 4)
        seen = set()
        for row in Order.objects.order_by("id").iterator(chunk_size=100):  # server-side cursor in the transaction
            seen.add(row.id)
    expect(o.id in seen, "the row written before the cursor is not seen")
    expect(seen == set(ledger), "cursor saw %d orders, want %d" % (len(seen), len(ledger)))


def shared_big_model(table):
    """An unmanaged model over the runner's shared 200,000-row table."""
    from django.db import models

    class SharedBig(models.Model):
        id = models.BigIntegerField(primary_key=True)
        k = models.IntegerField()
        v = models.BigIntegerField()

        class Meta:
            app_label = "matrixapp"
            db_table = table
            managed = False

    return SharedBig


def check_cursor():
    table, fill = c.big_table("dj_")
    if fill:
        with connection.cursor() as cur:
            cur.execute(fill)
    model = Big if table == Big._meta.db_table else shared_big_model(table)
    count = total = 0
    # Autocommit: Django declares the server-side cursor WITH HOLD.
    for _id, v in model.objects.values_list("id", "v").iterator(chunk_size=2000):
        count += 1
        total += v
    expect(count == c.BIG_ROWS and total == c.BIG_SUM_V,
           "count %d sum %d, want %d %d" % (count, total, c.BIG_ROWS, c.BIG_SUM_V))


def check_listen_notify():
    lconn = connections["listener"]
    try:
        with lconn.cursor() as cur:
            cur.execute("LISTEN dj_channel")
        with connection.cursor() as cur:
            cur.execute("SELECT pg_notify('dj_channel', %s)", [c.NOTIFY_PAYLOAD])
        got = None
        for n in lconn.connection.notifies(timeout=5, stop_after=1):  # the psycopg connection underneath
            got = n
        expect(got is not None, "no notification within 5 s")
        expect(got.channel == "dj_channel" and got.payload == c.NOTIFY_PAYLOAD, "got %r" % (got,))
    finally:
        lconn.close()


def main():
    R.run("connect", check_connect, recover)
    if not connected:
        R.fail("all", "cannot connect, remaining checks skipped")
        R.finish()
    for name, fn in [
        ("migrate", check_migrate),
        ("insert_returning", check_insert_returning),
        ("batch_insert", check_batch_insert),
        ("serial_insert", check_serial_insert),
        ("prepared_select", check_prepared_select),
        ("aggregate", check_aggregate),
        ("ref_join", check_ref_join),
        ("rollback", check_rollback),
        ("types", check_types),
        ("unique_violation", check_unique_violation),
        ("bulk_create_ignore", check_bulk_create_ignore),
        ("bulk_create_update", check_bulk_create_update),
        ("iterator_atomic", check_iterator_atomic),
        ("cursor", check_cursor),
        ("listen_notify", check_listen_notify),
    ]:
        R.run(name, fn, recover)
    R.finish()


if __name__ == "__main__":
    main()
