// Client matrix: node-postgres (`pg`) with `pg-cursor`.
import pg from 'pg';
import Cursor from 'pg-cursor';

import * as c from './common.js';

const { CheckFailed, expect } = c;
const CLIENT = 'node-pg';
const P = 'nodepg_';
const R = new c.Reporter(CLIENT);

let client = null;
const ledger = new Map(); // id (string) -> {customer_id, cents}

async function connect() {
  const cl = new pg.Client({
    host: c.env.host, port: c.env.port, user: c.env.user, database: c.env.database, password: c.env.password,
    connectionTimeoutMillis: 10000,
  });
  cl.on('error', () => {}); // a dropped connection is noticed by the next query
  await cl.connect();
  return cl;
}

async function recover() {
  // Simplest robust recovery: a fresh session (the old one may be mid-transaction or dead).
  if (client) {
    const old = client;
    client = null;
    old.end().catch(() => {});
    if (old.connection && old.connection.stream) old.connection.stream.destroy();
  }
  client = await connect(); // if this fails, the next check tries again
}

async function q(text, values) {
  return client.query(text, values);
}

async function checkConnect() {
  client = await connect();
  const r = await q('SELECT 1 AS one');
  expect(r.rows[0].one === 1, 'SELECT 1');
}

async function checkDdl() {
  for (const s of c.ddl(P)) await q(s);
  if (c.env.tessera) for (const s of c.distribute(P)) await q(s);
}

async function checkInsertReturning() {
  const [row] = c.orderRows(1);
  const r = await q(`INSERT INTO ${P}orders (customer_id, amount, note) VALUES ($1, $2, $3) RETURNING id`,
    [row.customer_id, row.amount, row.note]);
  expect(r.rows.length === 1 && r.rows[0].id != null, 'no id returned');
  ledger.set(String(r.rows[0].id), row);
}

async function checkBatchInsert() {
  const rows = c.orderRows(100, 1);
  // node-postgres has no executemany: applications build one multi-row VALUES.
  const values = [];
  const params = [];
  rows.forEach((row, i) => {
    values.push(`($${3 * i + 1}, $${3 * i + 2}, $${3 * i + 3})`);
    params.push(row.customer_id, row.amount, row.note);
  });
  await q('BEGIN');
  const r = await q(`INSERT INTO ${P}orders (customer_id, amount, note) VALUES ${values.join(', ')} RETURNING id`, params);
  await q('COMMIT');
  const ids = r.rows.map((x) => x.id);
  expect(ids.length === 100, `expected 100 ids, got ${ids.length}`);
  expect(!ids.includes(null) && new Set(ids).size === 100, 'ids not distinct / NULL');
  expect(!ids.some((id) => ledger.has(String(id))), 'ids collide with earlier ids');
  ids.forEach((id, i) => ledger.set(String(id), rows[i]));
}

async function checkSerialInsert() {
  const seqs = [];
  await q('BEGIN');
  for (const t of [1, 2, 3, 1, 2, 3]) {
    const r = await q(`INSERT INTO ${P}events (tenant_id, payload) VALUES ($1, $2) RETURNING seq`, [t, `event ${t}`]);
    seqs.push(r.rows[0].seq);
  }
  await q('COMMIT');
  expect(!seqs.includes(null) && new Set(seqs).size === seqs.length, `seqs not distinct/non-null: ${seqs}`);
  const n = (await q(`SELECT count(*)::int AS n FROM ${P}events WHERE tenant_id = $1`, [2])).rows[0].n;
  expect(n === 2, `tenant 2 has ${n} events, want 2`);
}

async function checkPreparedSelect() {
  expect(ledger.size > 0, 'no orders to select (inserts failed)');
  for (const [id, row] of [...ledger.entries()].slice(0, 10)) {
    const r = await client.query({
      name: 'nodepg_order_by_id', // a named (server-side prepared) statement
      text: `SELECT id, customer_id, amount FROM ${P}orders WHERE id = $1`,
      values: [id],
    });
    expect(r.rows.length === 1, `id ${id}: ${r.rows.length} rows`);
    const got = r.rows[0];
    expect(String(got.id) === id && got.customer_id === row.customer_id && c.centsOf(got.amount) === row.cents,
      `id ${id}: got ${JSON.stringify(got)}`);
  }
}

async function checkAggregate() {
  const rows = c.orderRows(30, 500);
  const values = [];
  const params = [];
  rows.forEach((row, i) => {
    values.push(`($${4 * i + 1}, $${4 * i + 2}, $${4 * i + 3}, $${4 * i + 4})`);
    params.push(c.AGG_ID_BASE + i, row.customer_id, row.amount, row.note);
  });
  await q(`INSERT INTO ${P}orders (id, customer_id, amount, note) VALUES ${values.join(', ')}`, params);
  rows.forEach((row, i) => ledger.set(String(c.AGG_ID_BASE + i), row));
  const r = await q(`SELECT customer_id, count(*) AS n, sum(amount) AS s FROM ${P}orders GROUP BY customer_id ORDER BY customer_id`);
  const got = new Map(r.rows.map((x) => [x.customer_id, [Number(x.n), c.centsOf(x.s)]]));
  const want = c.expectedAggregate(ledger);
  expect(c.mapsEqual(got, want), `got ${c.showMap(got)}, want ${c.showMap(want)}`);
}

async function checkRefJoin() {
  for (const [id, name] of c.CUSTOMERS) await q(`INSERT INTO ${P}customers (id, name) VALUES ($1, $2)`, [id, name]);
  const r = await q(`SELECT c.name, count(*) AS n FROM ${P}orders o JOIN ${P}customers c ON c.id = o.customer_id GROUP BY c.name ORDER BY c.name`);
  const got = new Map(r.rows.map((x) => [x.name, Number(x.n)]));
  const want = c.expectedJoin(ledger);
  expect(c.mapsEqual(got, want), `got ${c.showMap(got)}, want ${c.showMap(want)}`);
}

async function checkRollback() {
  await q('BEGIN');
  try {
    await q(`INSERT INTO ${P}orders (id, customer_id, amount, note) VALUES ($1, 1, 1, 'rolled back')`, [c.ROLLBACK_ID]);
    const n = (await q(`SELECT count(*)::int AS n FROM ${P}orders WHERE id = $1`, [c.ROLLBACK_ID])).rows[0].n;
    expect(n === 1, 'row not visible inside its transaction');
  } finally {
    await q('ROLLBACK');
  }
  const n = (await q(`SELECT count(*)::int AS n FROM ${P}orders WHERE id = $1`, [c.ROLLBACK_ID])).rows[0].n;
  expect(n === 0, 'row still there after rollback');
}

async function checkTypes() {
  const cols = c.TYPED_COLUMNS;
  const params = cols.map((k) => (k === 'c_jsonb' ? JSON.stringify(c.TYPED[k]) : c.TYPED[k]));
  await q(`INSERT INTO ${P}types (id, ${cols.join(', ')}) VALUES ($1, ${cols.map((_, i) => `$${i + 2}`).join(', ')})`,
    [1, ...params]);
  const r = await q(`SELECT ${cols.join(', ')} FROM ${P}types WHERE id = $1`, [1]);
  expect(r.rows.length === 1, 'row not found');
  const got = { ...r.rows[0] };
  const d = got.c_date; // node-postgres parses date as local midnight
  if (d instanceof Date) got.c_date = `${d.getFullYear()}-${c.pad2(d.getMonth() + 1)}-${c.pad2(d.getDate())}`;
  c.compareTyped(got);
}

async function checkUniqueViolation() {
  expect(ledger.size > 0, 'no orders (inserts failed)');
  const existing = ledger.keys().next().value;
  try {
    await q(`INSERT INTO ${P}orders (id, customer_id, amount, note) VALUES ($1, 1, 1, 'dup')`, [existing]);
  } catch (err) {
    if (err instanceof CheckFailed) throw err;
    expect(err.code === '23505', `SQLSTATE ${err.code}, want 23505: ${err.message}`);
    expect(err.table === `${P}orders`, `table ${JSON.stringify(err.table)}, want '${P}orders'`);
    expect(err.constraint === `${P}orders_pkey`, `constraint ${JSON.stringify(err.constraint)}, want '${P}orders_pkey'`);
    return;
  }
  throw new CheckFailed('duplicate key accepted');
}

async function checkCursor() {
  const { table, fill } = c.bigTable(P);
  if (fill) await q(fill);
  const cursor = client.query(new Cursor(`SELECT id, v FROM ${table}`));
  let count = 0;
  let total = 0n;
  try {
    const first = await cursor.read(10);
    expect(first.length === 10, `read(10) returned ${first.length} rows`);
    for (const r of first) { count++; total += BigInt(r.v); }
    for (;;) {
      const rows = await cursor.read(1000);
      if (rows.length === 0) break;
      expect(rows.length <= 1000, `read(1000) returned ${rows.length} rows`);
      for (const r of rows) { count++; total += BigInt(r.v); }
    }
  } finally {
    await cursor.close();
  }
  expect(count === c.BIG_ROWS && total === c.BIG_SUM_V, `count ${count} sum ${total}, want ${c.BIG_ROWS} ${c.BIG_SUM_V}`);
}

async function checkListenNotify() {
  const listener = await connect();
  const notifier = await connect();
  try {
    let resolve;
    const got = new Promise((res) => { resolve = res; });
    listener.on('notification', (msg) => resolve(msg));
    await listener.query(`LISTEN ${P}channel`);
    await notifier.query('SELECT pg_notify($1, $2)', [`${P}channel`, c.NOTIFY_PAYLOAD]);
    let timer;
    const msg = await Promise.race([got, new Promise((res) => { timer = setTimeout(() => res(null), 5000); })]);
    clearTimeout(timer);
    expect(msg !== null, 'no notification within 5 s');
    expect(msg.channel === `${P}channel` && msg.payload === c.NOTIFY_PAYLOAD, `got ${JSON.stringify(msg)}`);
  } finally {
    await listener.end().catch(() => {});
    await notifier.end().catch(() => {});
  }
}

async function main() {
  await R.run('connect', checkConnect, recover);
  if (!client) {
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
  for (const [name, fn] of checks) {
    await R.run(name, async () => {
      if (!client) client = await connect(); // the last recovery could not reconnect
      return fn();
    }, recover);
  }
  if (client) await client.end().catch(() => {});
  R.finish();
}

main().catch((err) => {
  console.log(`FAIL ${CLIENT} program: ${c.describe(err)}`);
  process.exit(1);
});
