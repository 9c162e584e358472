// Shared plumbing for the Node.js client programs of the client matrix: the
// reporter (one line per check, keep going after failures, exit 1 if any
// failed) and the data every client checks (same values as ../python/common.py).

export const env = {
  host: process.env.PGHOST || '127.0.0.1',
  port: parseInt(process.env.PGPORT || '5432', 10),
  user: process.env.PGUSER || 'postgres',
  database: process.env.PGDATABASE || 'postgres',
  password: process.env.PGPASSWORD || undefined,
  tessera: process.env.TESSERA === '1',
};

export const CHECK_TIMEOUT_MS = 1000 * parseInt(process.env.CHECK_TIMEOUT || '60', 10);

export const BIG_ROWS = 200000;
export const BIG_SUM_V = 3n * BigInt(BIG_ROWS) * BigInt(BIG_ROWS + 1) / 2n;
export const AGG_ID_BASE = 1000000;
export const ROLLBACK_ID = 2000001;
export const CUSTOMERS = Array.from({ length: 10 }, (_, i) => [i + 1, `customer ${i + 1}`]);
export const NOTIFY_PAYLOAD = "hello from the matrix: ünïcødé, 'quotes'";

// (customer_id, amount, note); amounts are kept as strings (numeric) and as cents.
export function orderRows(n, start = 0) {
  const rows = [];
  for (let i = start; i < start + n; i++) {
    rows.push({ customer_id: 1 + (i % 10), amount: `${i % 97}.25`, cents: (i % 97) * 100 + 25, note: `order ${i}` });
  }
  return rows;
}

export function centsOf(numericText) {
  return Math.round(parseFloat(numericText) * 100);
}

// ledger: Map id(string) -> {customer_id, cents}
export function expectedAggregate(ledger) {
  const out = new Map();
  for (const { customer_id, cents } of ledger.values()) {
    const [n, s] = out.get(customer_id) || [0, 0];
    out.set(customer_id, [n + 1, s + cents]);
  }
  return out;
}

export function expectedJoin(ledger) {
  const names = new Map(CUSTOMERS);
  const out = new Map();
  for (const { customer_id } of ledger.values()) {
    const name = names.get(customer_id);
    out.set(name, (out.get(name) || 0) + 1);
  }
  return out;
}

export function mapsEqual(a, b) {
  return JSON.stringify([...a.entries()].sort()) === JSON.stringify([...b.entries()].sort());
}

export function showMap(m) {
  return JSON.stringify([...m.entries()].sort());
}

export const TYPED_COLUMNS = ['c_int2', 'c_int4', 'c_int8', 'c_numeric', 'c_float8', 'c_bool', 'c_text', 'c_bytea',
  'c_date', 'c_ts', 'c_uuid', 'c_jsonb', 'c_int_arr', 'c_text_arr'];

// The typed row. int8 and numeric travel as strings (both libraries return them so).
export const TYPED = {
  c_int2: -32768,
  c_int4: 2147483647,
  c_int8: '-9223372036854775808',
  c_numeric: '12345678901234567890.123456789',
  c_float8: 1.0000000000000002,
  c_bool: true,
  c_text: "héllo ☃ 'single' \"double\" \\ back\ttab",
  c_bytea: Buffer.from(Array.from({ length: 256 }, (_, i) => i)),
  c_date: '2024-02-29',
  c_ts: new Date('2024-03-10T12:34:56.789Z'),
  c_uuid: 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
  c_jsonb: { a: [1, 2, { b: null }], c: 'ünï', d: 1.5, e: true },
  c_int_arr: [1, -2, 2147483647],
  c_text_arr: ['a', 'b c', 'with,comma', '"q"', '', 'ü'],
};

function deepEqual(a, b) {
  if (Buffer.isBuffer(a) || Buffer.isBuffer(b)) return Buffer.isBuffer(a) && Buffer.isBuffer(b) && a.equals(b);
  if (a instanceof Date || b instanceof Date) return a instanceof Date && b instanceof Date && a.getTime() === b.getTime();
  if (Array.isArray(a) || Array.isArray(b)) {
    return Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((x, i) => deepEqual(x, b[i]));
  }
  if (a && b && typeof a === 'object' && typeof b === 'object') {
    const ka = Object.keys(a).sort();
    const kb = Object.keys(b).sort();
    return deepEqual(ka, kb) && ka.every((k) => deepEqual(a[k], b[k]));
  }
  return a === b;
}

function show(v) {
  if (Buffer.isBuffer(v)) return `<Buffer ${v.length} bytes ${v.subarray(0, 8).toString('hex')}...>`;
  if (v instanceof Date) return `Date(${v.toISOString()})`;
  return JSON.stringify(v);
}

// got: column -> value, with c_date already turned into 'YYYY-MM-DD' by the caller.
export function compareTyped(got) {
  for (const col of TYPED_COLUMNS) {
    if (!deepEqual(got[col], TYPED[col])) {
      throw new CheckFailed(`${col}: sent ${show(TYPED[col])}, got back ${show(got[col])}`);
    }
  }
}

export class CheckFailed extends Error {}

export function expect(cond, what) {
  if (!cond) throw new CheckFailed(what);
}

export function describe(err) {
  if (err instanceof CheckFailed) return `CheckFailed: ${err.message}`;
  const code = err && err.code;
  const msg = String((err && err.message) || err).replace(/\s*\n\s*/g, ' | ').slice(0, 400);
  if (typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code)) return `${err.name || 'Error'} [SQLSTATE ${code}] ${msg}`;
  return `${(err && err.name) || 'Error'}${code ? ` (${code})` : ''}: ${msg}`;
}

export class TimeoutError extends Error {}

export class Reporter {
  constructor(client) {
    this.client = client;
    this.failed = 0;
    this.passed = 0;
  }

  ok(check) {
    this.passed++;
    console.log(`ok ${this.client} ${check}`);
  }

  fail(check, reason) {
    this.failed++;
    console.log(`FAIL ${this.client} ${check}: ${reason}`);
  }

  // Runs one check with a time limit; on failure calls recover() and goes on.
  async run(check, fn, recover) {
    let timer;
    try {
      const limit = new Promise((_, reject) => {
        timer = setTimeout(() => reject(new TimeoutError(`check did not finish within ${CHECK_TIMEOUT_MS / 1000} s`)),
          CHECK_TIMEOUT_MS);
      });
      const result = await Promise.race([fn(), limit]);
      this.ok(check);
      return result;
    } catch (err) {
      this.fail(check, describe(err));
      if (process.env.MATRIX_VERBOSE === '1') console.error(err);
      if (recover) {
        try {
          await recover(err);
        } catch (err2) {
          console.error(`# ${this.client}: recovery after ${check} failed: ${describe(err2)}`);
        }
      }
      return undefined;
    } finally {
      clearTimeout(timer);
    }
  }

  finish() {
    process.exitCode = this.failed ? 1 : 0;
  }
}

export function ddl(p) {
  return [
    `DROP TABLE IF EXISTS ${p}orders, ${p}events, ${p}customers, ${p}types, ${p}big CASCADE`,
    `CREATE TABLE ${p}orders (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, customer_id int, amount numeric, note text, created timestamptz DEFAULT now())`,
    `CREATE TABLE ${p}events (seq bigserial, tenant_id int NOT NULL, payload text, PRIMARY KEY (tenant_id, seq))`,
    `CREATE TABLE ${p}customers (id int PRIMARY KEY, name text)`,
    `CREATE TABLE ${p}types (id int PRIMARY KEY, c_int2 int2, c_int4 int4, c_int8 int8, c_numeric numeric, c_float8 float8, c_bool bool, c_text text, c_bytea bytea, c_date date, c_ts timestamptz, c_uuid uuid, c_jsonb jsonb, c_int_arr int[], c_text_arr text[])`,
    `CREATE TABLE ${p}big (id bigint PRIMARY KEY, k int, v bigint)`,
  ];
}

export function distribute(p) {
  return [
    `SELECT create_distributed_table('${p}orders', 'id')`,
    `SELECT create_distributed_table('${p}events', 'tenant_id')`,
    `SELECT create_reference_table('${p}customers')`,
    `SELECT create_distributed_table('${p}types', 'id')`,
    `SELECT create_distributed_table('${p}big', 'id')`,
  ];
}

export function bigInsert(p) {
  return `INSERT INTO ${p}big (id, k, v) SELECT g, g % 100, g * 3 FROM generate_series(1, 200000) g`;
}

// The runner fills one shared 200,000-row table (MATRIX_BIG_TABLE) before the
// programs start; without it each program fills its own <prefix>big.
export function bigTable(p) {
  const shared = process.env.MATRIX_BIG_TABLE;
  return shared ? { table: shared, fill: null } : { table: `${p}big`, fill: bigInsert(p) };
}

export function pad2(n) {
  return String(n).padStart(2, '0');
}
