// Client matrix: postgres.js (`postgres`), which prepares every statement by default.
import postgres from 'postgres';

import * as c from './common.js';

const { CheckFailed, expect } = c;
const CLIENT = 'postgresjs';
const P = 'pgjs_';
const R = new c.Reporter(CLIENT);

let sql = null;
const ledger = new Map(); // id (string) -> {customer_id, cents}

function connect() {
  return postgres({
    host: c.env.host, port: c.env.port, user: c.env.user, database: c.env.database, password: c.env.password,
    max: 1, connect_timeout: 10, onnotice: () => {},
  });
}

async function recover() {
  if (sql) {
    const old = sql;
    sql = null;
    await old.end({ timeout: 0 }).catch(() => {});
  }
  sql = connect();
}

const T = (name) => sql(P + name); // table identifier

async function checkConnect() {
  const s = connect();
  const [r] = await s`SELECT 1 AS one`;
  sql = s;
  expect(r.one === 1, 'SELECT 1');
}

async function checkDdl() {
  for (const s of c.ddl(P)) await sql.unsafe(s);
  if (c.env.tessera) for (const s of c.distribute(P)) await sql.unsafe(s);
}

async function checkInsertReturning() {
  const [row] = c.orderRows(1);
  const r = await sql`INSERT INTO ${T('orders')} (customer_id, amount, note)
                      VALUES (${row.customer_id}, ${row.amount}, ${row.note}) RETURNING id`;
  expect(r.length === 1 && r[0].id != null, 'no id returned');
  ledger.set(String(r[0].id), row);
}

async function checkBatchInsert() {
  const rows = c.orderRows(100, 1);
  // postgres.js's batch insert: one multi-row VALUES from an array of objects.
  const r = await sql.begin((tx) => tx`INSERT INTO ${tx(P + 'orders')} ${tx(rows, 'customer_id', 'amount', 'note')} RETURNING id`);
  const ids = r.map((x) => x.id);
  expect(ids.length === 100, `expected 100 ids, got ${ids.length}`);
  expect(!ids.includes(null) && new Set(ids).size === 100, 'ids not distinct / NULL');
  expect(!ids.some((id) => ledger.has(String(id))), 'ids collide with earlier ids');
  ids.forEach((id, i) => ledger.set(String(id), rows[i]));
}

async function checkSerialInsert() {
  const seqs = await sql.begin(async (tx) => {
    const out = [];
    for (const t of [1, 2, 3, 1, 2, 3]) {
      const [r] = await tx`INSERT INTO ${tx(P + 'events')} (tenant_id, payload) VALUES (${t}, ${`event ${t}`}) RETURNING seq`;
      out.push(r.seq);
    }
    return out;
  });
  expect(!seqs.includes(null) && new Set(seqs).size === seqs.length, `seqs not distinct/non-null: ${seqs}`);
  const [{ n }] = await sql`SELECT count(*)::int AS n FROM ${T('events')} WHERE tenant_id = ${2}`;
  expect(n === 2, `tenant 2 has ${n} events, want 2`);
}

async function checkPreparedSelect() {
  expect(ledger.size > 0, 'no orders to select (inserts failed)');
  for (const [id, row] of [...ledger.entries()].slice(0, 10)) {
    const r = await sql`SELECT id, customer_id, amount FROM ${T('orders')} WHERE id = ${id}`; // prepared (default)
    expect(r.length === 1, `id ${id}: ${r.length} rows`);
    const got = r[0];
    expect(String(got.id) === id && got.customer_id === row.customer_id && c.centsOf(got.amount) === row.cents,
      `id ${id}: got ${JSON.stringify(got)}`);
  }
}

async function checkAggregate() {
  const rows = c.orderRows(30, 500).map((row, i) => ({ id: c.AGG_ID_BASE + i, ...row }));
  await sql`INSERT INTO ${T('orders')} ${sql(rows, 'id', 'customer_id', 'amount', 'note')}`;
  rows.forEach((row) => ledger.set(String(row.id), row));
  const r = await sql`SELECT customer_id, count(*) AS n, sum(amount) AS s FROM ${T('orders')} GROUP BY customer_id ORDER BY customer_id`;
  const got = new Map(r.map((x) => [x.customer_id, [Number(x.n), c.centsOf(x.s)]]));
  const want = c.expectedAggregate(ledger);
  expect(c.mapsEqual(got, want), `got ${c.showMap(got)}, want ${c.showMap(want)}`);
}

async function checkRefJoin() {
  await sql`INSERT INTO ${T('customers')} ${sql(c.CUSTOMERS.map(([id, name]) => ({ id, name })))}`;
  const r = await sql`SELECT c.name, count(*) AS n FROM ${T('orders')} o JOIN ${T('customers')} c ON c.id = o.customer_id
                      GROUP BY c.name ORDER BY c.name`;
  const got = new Map(r.map((x) => [x.name, Number(x.n)]));
  const want = c.expectedJoin(ledger);
  expect(c.mapsEqual(got, want), `got ${c.showMap(got)}, want ${c.showMap(want)}`);
}

class Rollback extends Error {}

async function checkRollback() {
  try {
    await sql.begin(async (tx) => {
      await tx`INSERT INTO ${tx(P + 'orders')} (id, customer_id, amount, note) VALUES (${c.ROLLBACK_ID}, 1, 1, 'rolled back')`;
      const [{ n }] = await tx`SELECT count(*)::int AS n FROM ${tx(P + 'orders')} WHERE id = ${c.ROLLBACK_ID}`;
      expect(n === 1, 'row not visible inside its transaction');
      throw new Rollback();
    });
  } catch (err) {
    if (!(err instanceof Rollback)) throw err;
  }
  const [{ n }] = await sql`SELECT count(*)::int AS n FROM ${T('orders')} WHERE id = ${c.ROLLBACK_ID}`;
  expect(n === 0, 'row still there after rollback');
}

async function checkTypes() {
  const t = c.TYPED;
  await sql`INSERT INTO ${T('types')} (id, c_int2, c_int4, c_int8, c_numeric, c_float8, c_bool, c_text, c_bytea,
              c_date, c_ts, c_uuid, c_jsonb, c_int_arr, c_text_arr)
            VALUES (1, ${t.c_int2}, ${t.c_int4}, ${t.c_int8}, ${t.c_numeric}, ${t.c_float8}, ${t.c_bool}, ${t.c_text},
              ${t.c_bytea}, ${t.c_date}, ${t.c_ts}, ${t.c_uuid}, ${sql.json(t.c_jsonb)}, ${t.c_int_arr},
              ${t.c_text_arr})`;
  const r = await sql`SELECT ${sql(c.TYPED_COLUMNS)} FROM ${T('types')} WHERE id = ${1}`;
  expect(r.length === 1, 'row not found');
  const got = { ...r[0] };
  const d = got.c_date; // postgres.js parses date as UTC midnight
  if (d instanceof Date) got.c_date = d.toISOString().slice(0, 10);
  c.compareTyped(got);
}

async function checkUniqueViolation() {
  expect(ledger.size > 0, 'no orders (inserts failed)');
  const existing = ledger.keys().next().value;
  try {
    await sql`INSERT INTO ${T('orders')} (id, customer_id, amount, note) VALUES (${existing}, 1, 1, 'dup')`;
  } catch (err) {
    if (err instanceof CheckFailed) throw err;
    expect(err.code === '23505', `SQLSTATE ${err.code}, want 23505: ${err.message}`);
    expect(err.table_name === `${P}orders`, `table_name ${JSON.stringify(err.table_name)}, want '${P}orders'`);
    expect(err.constraint_name === `${P}orders_pkey`,
      `constraint_name ${JSON.stringify(err.constraint_name)}, want '${P}orders_pkey'`);
    return;
  }
  throw new CheckFailed('duplicate key accepted');
}

async function checkCursor() {
  const { table, fill } = c.bigTable(P);
  if (fill) await sql.unsafe(fill);
  let count = 0;
  let total = 0n;
  let batches = 0;
  for await (const rows of sql`SELECT id, v FROM ${sql(table)}`.cursor(10)) {
    batches++;
    expect(rows.length >= 1 && rows.length <= 10,
      `cursor(10) gave a batch of ${rows.length} rows (batch #${batches}, after ${count} rows)`);
    for (const r of rows) { count++; total += BigInt(r.v); }
  }
  expect(count === c.BIG_ROWS && total === c.BIG_SUM_V, `count ${count} sum ${total}, want ${c.BIG_ROWS} ${c.BIG_SUM_V}`);
  expect(batches >= c.BIG_ROWS / 10, `only ${batches} batches`);
}

async function checkListenNotify() {
  let resolve;
  const got = new Promise((res) => { resolve = res; });
  // postgres.js listens on a connection of its own.
  const { unlisten } = await sql.listen(`${P}channel`, (payload) => resolve(payload));
  try {
    await sql.notify(`${P}channel`, c.NOTIFY_PAYLOAD);
    let timer;
    const payload = await Promise.race([got, new Promise((res) => { timer = setTimeout(() => res(null), 5000); })]);
    clearTimeout(timer);
    expect(payload !== null, 'no notification within 5 s');
    expect(payload === c.NOTIFY_PAYLOAD, `got ${JSON.stringify(payload)}`);
  } finally {
    await unlisten().catch(() => {});
  }
}

async function main() {
  await R.run('connect', checkConnect, recover);
  if (!sql) {
    R.fail('all', 'cannot connect, remaining checks skipped');
    R.finish();
    return;
  }
  const checks = [
    ['ddl', checkDdl],
    ['insert_returning', checkInsertReturning],
    ['batch_insert', checkBatchInsert],
    ['serial_insert', checkSerialInsert],
    ['prepared_select', checkPreparedSelect],
    ['aggregate', checkAggregate],
    ['ref_join', checkRefJoin],
    ['rollback', checkRollback],
    ['types', checkTypes],
    ['unique_violation', checkUniqueViolation],
    ['cursor', checkCursor],
    ['listen_notify', checkListenNotify],
  ];
  for (const [name, fn] of checks) await R.run(name, fn, recover);
  if (sql) await sql.end({ timeout: 1 }).catch(() => {});
  R.finish();
}

main().catch((err) => {
  console.log(`FAIL ${CLIENT} program: ${c.describe(err)}`);
  process.exit(1);
});
