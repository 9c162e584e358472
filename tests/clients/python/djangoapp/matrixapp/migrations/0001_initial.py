# Written by hand (not generated at test time). Like every Django migration on
# PostgreSQL it runs in one transaction; on Tessera it distributes the tables
# from inside that transaction with RunSQL.

import os

import django.contrib.postgres.fields
import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models

TESSERA = os.environ.get("TESSERA", "0") == "1"

EVENTS_SQL = (
    "CREATE TABLE dj_events (seq bigserial, tenant_id int NOT NULL, payload text, PRIMARY KEY (tenant_id, seq))"
)

DISTRIBUTE_SQL = [
    "SELECT create_reference_table('dj_customers')",
    "SELECT create_distributed_table('dj_orders', 'id')",
    "SELECT create_distributed_table('dj_types', 'id')",
    "SELECT create_distributed_table('dj_big', 'id')",
    "SELECT create_distributed_table('dj_events', 'tenant_id')",
]


class Migration(migrations.Migration):
    initial = True
    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Customer",
            fields=[
                ("id", models.IntegerField(primary_key=True, serialize=False)),
                ("name", models.TextField()),
            ],
            options={"db_table": "dj_customers"},
        ),
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("amount", models.DecimalField(decimal_places=2, max_digits=20)),
                ("note", models.TextField()),
                ("created", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ("customer", models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.DO_NOTHING,
                                               to="matrixapp.customer")),
            ],
            options={"db_table": "dj_orders"},
        ),
        migrations.CreateModel(
            name="Typed",
            fields=[
                ("id", models.IntegerField(primary_key=True, serialize=False)),
                ("c_int2", models.SmallIntegerField()),
                ("c_int4", models.IntegerField()),
                ("c_int8", models.BigIntegerField()),
                ("c_numeric", models.DecimalField(decimal_places=9, max_digits=40)),
                ("c_float8", models.FloatField()),
                ("c_bool", models.BooleanField()),
                ("c_text", models.TextField()),
                ("c_bytea", models.BinaryField()),
                ("c_date", models.DateField()),
                ("c_ts", models.DateTimeField()),
                ("c_uuid", models.UUIDField()),
                ("c_jsonb", models.JSONField()),
                ("c_int_arr", django.contrib.postgres.fields.ArrayField(base_field=models.IntegerField(), size=None)),
                ("c_text_arr", django.contrib.postgres.fields.ArrayField(base_field=models.TextField(), size=None)),
            ],
            options={"db_table": "dj_types"},
        ),
        migrations.CreateModel(
            name="Big",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("k", models.IntegerField()),
                ("v", models.BigIntegerField()),
            ],
            options={"db_table": "dj_big"},
        ),
        migrations.RunSQL(EVENTS_SQL, reverse_sql="DROP TABLE dj_events"),
        migrations.RunSQL(DISTRIBUTE_SQL if TESSERA else migrations.RunSQL.noop,
                          reverse_sql=migrations.RunSQL.noop),
    ]
