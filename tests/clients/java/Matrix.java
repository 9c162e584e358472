// Client matrix: pgjdbc (JDBC, prepareThreshold=1 so statements are prepared on
// the server from their first execution). Run as a single-file program:
//   java -Xmx64m -cp lib/postgresql-VERSION.jar Matrix.java
// One line per check; exit 1 if any check failed.

import java.math.BigDecimal;
import java.sql.Array;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.LocalDate;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.UUID;

import org.postgresql.PGConnection;
import org.postgresql.PGNotification;
import org.postgresql.PGStatement;
import org.postgresql.util.PGobject;
import org.postgresql.util.PSQLException;
import org.postgresql.util.ServerErrorMessage;

public class Matrix {
    static final String CLIENT = "pgjdbc";
    static final int BIG_ROWS = 200_000;
    static final long BIG_SUM_V = 3L * BIG_ROWS * (BIG_ROWS + 1) / 2;
    static final long AGG_ID_BASE = 1_000_000L;
    static final long ROLLBACK_ID = 2_000_001L;
    static final String NOTIFY_PAYLOAD = "hello from the matrix: ünïcødé, 'quotes'";
    static final boolean TESSERA = "1".equals(System.getenv("TESSERA"));

    static Connection conn;
    static final Map<Long, Order> ledger = new LinkedHashMap<>();
    static int failed = 0;

    record Order(int customerId, BigDecimal amount, String note) {}

    static class CheckFailed extends Exception {
        CheckFailed(String msg) { super(msg); }
    }

    interface Check { void run() throws Exception; }

    static String env(String name, String def) {
        String v = System.getenv(name);
        return v == null || v.isEmpty() ? def : v;
    }

    static Connection connect() throws SQLException {
        int timeout = Integer.parseInt(env("CHECK_TIMEOUT", "60"));
        String url = "jdbc:postgresql://" + env("PGHOST", "127.0.0.1") + ":" + env("PGPORT", "5432") + "/"
            + env("PGDATABASE", "postgres") + "?prepareThreshold=1&connectTimeout=10&socketTimeout=" + timeout
            + "&ApplicationName=client-matrix";
        return DriverManager.getConnection(url, env("PGUSER", "postgres"), System.getenv("PGPASSWORD"));
    }

    static void expect(boolean cond, String what) throws CheckFailed {
        if (!cond) throw new CheckFailed(what);
    }

    static String describe(Throwable e) {
        if (e instanceof CheckFailed) return "CheckFailed: " + e.getMessage();
        String msg = String.valueOf(e.getMessage()).replaceAll("\\s*\\n\\s*", " | ");
        if (msg.length() > 400) msg = msg.substring(0, 400) + "...";
        Throwable cause = e.getCause();
        if (cause != null && cause != e) msg += " (cause: " + cause.getClass().getSimpleName() + ": " + cause.getMessage() + ")";
        if (e instanceof SQLException se && se.getSQLState() != null) {
            return e.getClass().getSimpleName() + " [SQLSTATE " + se.getSQLState() + "] " + msg;
        }
        return e.getClass().getSimpleName() + ": " + msg;
    }

    static void recover() {
        try {
            if (conn != null && !conn.isClosed() && conn.isValid(5)) {
                if (!conn.getAutoCommit()) conn.rollback();
                conn.setAutoCommit(true);
                return;
            }
        } catch (SQLException ignored) {
            // fall through to a fresh connection
        }
        try {
            if (conn != null) conn.close();
        } catch (SQLException ignored) {
            // already gone
        }
        try {
            conn = connect();
        } catch (SQLException e) {
            System.err.println("# " + CLIENT + ": reconnect failed: " + describe(e));
            conn = null;
        }
    }

    static void run(String name, Check check) {
        try {
            if (conn == null && !name.equals("connect")) conn = connect(); // the last recovery could not reconnect
            check.run();
            System.out.println("ok " + CLIENT + " " + name);
        } catch (Throwable e) {
            failed++;
            System.out.println("FAIL " + CLIENT + " " + name + ": " + describe(e));
            if ("1".equals(System.getenv("MATRIX_VERBOSE"))) e.printStackTrace();
            recover();
        }
    }

    static List<Order> orderRows(int n, int start) {
        List<Order> rows = new ArrayList<>();
        for (int i = start; i < start + n; i++) {
            rows.add(new Order(1 + i % 10, new BigDecimal((i % 97) + ".25"), "order " + i));
        }
        return rows;
    }

    static void exec(String sql) throws SQLException {
        try (Statement st = conn.createStatement()) {
            st.execute(sql);
        }
    }

    static long count(String sql, long param) throws SQLException {
        try (PreparedStatement ps = conn.prepareStatement(sql)) {
            ps.setLong(1, param);
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                return rs.getLong(1);
            }
        }
    }

    static void checkConnect() throws Exception {
        conn = connect();
        try (Statement st = conn.createStatement(); ResultSet rs = st.executeQuery("SELECT 1")) {
            expect(rs.next() && rs.getInt(1) == 1, "SELECT 1");
        }
    }

    static void checkDdl() throws Exception {
        exec("DROP TABLE IF EXISTS pgjdbc_orders, pgjdbc_events, pgjdbc_customers, pgjdbc_types, pgjdbc_big CASCADE");
        exec("CREATE TABLE pgjdbc_orders (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, customer_id int,"
            + " amount numeric, note text, created timestamptz DEFAULT now())");
        exec("CREATE TABLE pgjdbc_events (seq bigserial, tenant_id int NOT NULL, payload text, PRIMARY KEY (tenant_id, seq))");
        exec("CREATE TABLE pgjdbc_customers (id int PRIMARY KEY, name text)");
        exec("CREATE TABLE pgjdbc_types (id int PRIMARY KEY, c_int2 int2, c_int4 int4, c_int8 int8, c_numeric numeric,"
            + " c_float8 float8, c_bool bool, c_text text, c_bytea bytea, c_date date, c_ts timestamptz, c_uuid uuid,"
            + " c_jsonb jsonb, c_int_arr int[], c_text_arr text[])");
        exec("CREATE TABLE pgjdbc_big (id bigint PRIMARY KEY, k int, v bigint)");
        if (TESSERA) {
            exec("SELECT create_distributed_table('pgjdbc_orders', 'id')");
            exec("SELECT create_distributed_table('pgjdbc_events', 'tenant_id')");
            exec("SELECT create_reference_table('pgjdbc_customers')");
            exec("SELECT create_distributed_table('pgjdbc_types', 'id')");
            exec("SELECT create_distributed_table('pgjdbc_big', 'id')");
        }
    }

    static final String INSERT_ORDER = "INSERT INTO pgjdbc_orders (customer_id, amount, note) VALUES (?, ?, ?)";

    static void checkInsertReturning() throws Exception {
        Order o = orderRows(1, 0).get(0);
        // JDBC's generated keys: the driver appends RETURNING "id".
        try (PreparedStatement ps = conn.prepareStatement(INSERT_ORDER, new String[] {"id"})) {
            ps.setInt(1, o.customerId());
            ps.setBigDecimal(2, o.amount());
            ps.setString(3, o.note());
            expect(ps.executeUpdate() == 1, "update count");
            try (ResultSet keys = ps.getGeneratedKeys()) {
                expect(keys.next(), "no generated key");
                long id = keys.getLong(1);
                expect(!keys.wasNull(), "NULL generated key");
                ledger.put(id, o);
            }
        }
    }

    static void checkBatchInsert() throws Exception {
        List<Order> rows = orderRows(100, 1);
        List<Long> ids = new ArrayList<>();
        conn.setAutoCommit(false);
        try (PreparedStatement ps = conn.prepareStatement(INSERT_ORDER, new String[] {"id"})) {
            for (Order o : rows) {
                ps.setInt(1, o.customerId());
                ps.setBigDecimal(2, o.amount());
                ps.setString(3, o.note());
                ps.addBatch();
            }
            ps.executeBatch();
            try (ResultSet keys = ps.getGeneratedKeys()) {
                while (keys.next()) {
                    long id = keys.getLong(1);
                    expect(!keys.wasNull(), "NULL generated key");
                    ids.add(id);
                }
            }
            conn.commit();
        } finally {
            conn.setAutoCommit(true);
        }
        expect(ids.size() == 100, "expected 100 keys, got " + ids.size());
        expect(new HashSet<>(ids).size() == 100, "keys not distinct");
        for (Long id : ids) expect(!ledger.containsKey(id), "keys collide with earlier ids");
        for (int i = 0; i < ids.size(); i++) ledger.put(ids.get(i), rows.get(i));
    }

    static void checkSerialInsert() throws Exception {
        List<Long> seqs = new ArrayList<>();
        conn.setAutoCommit(false);
        try (PreparedStatement ps = conn.prepareStatement(
                "INSERT INTO pgjdbc_events (tenant_id, payload) VALUES (?, ?) RETURNING seq")) {
            for (int t : new int[] {1, 2, 3, 1, 2, 3}) {
                ps.setInt(1, t);
                ps.setString(2, "event " + t);
                try (ResultSet rs = ps.executeQuery()) {
                    expect(rs.next(), "no seq returned");
                    seqs.add(rs.getObject(1, Long.class));
                }
            }
            conn.commit();
        } finally {
            conn.setAutoCommit(true);
        }
        expect(!seqs.contains(null) && new HashSet<>(seqs).size() == seqs.size(), "seqs not distinct/non-null: " + seqs);
        long n = count("SELECT count(*) FROM pgjdbc_events WHERE tenant_id = ?", 2);
        expect(n == 2, "tenant 2 has " + n + " events, want 2");
    }

    static void checkPreparedSelect() throws Exception {
        expect(!ledger.isEmpty(), "no orders to select (inserts failed)");
        try (PreparedStatement ps = conn.prepareStatement("SELECT id, customer_id, amount FROM pgjdbc_orders WHERE id = ?")) {
            int n = 0;
            for (Map.Entry<Long, Order> e : ledger.entrySet()) {
                if (n++ == 10) break;
                ps.setLong(1, e.getKey());
                try (ResultSet rs = ps.executeQuery()) {
                    expect(rs.next(), "id " + e.getKey() + " not found");
                    expect(rs.getLong(1) == e.getKey() && rs.getInt(2) == e.getValue().customerId()
                        && rs.getBigDecimal(3).compareTo(e.getValue().amount()) == 0, "id " + e.getKey() + " differs");
                }
                expect(ps.unwrap(PGStatement.class).isUseServerPrepare(), "statement not server-prepared");
            }
        }
    }

    static void checkAggregate() throws Exception {
        List<Order> rows = orderRows(30, 500);
        StringBuilder sql = new StringBuilder("INSERT INTO pgjdbc_orders (id, customer_id, amount, note) VALUES ");
        for (int i = 0; i < rows.size(); i++) sql.append(i == 0 ? "" : ", ").append("(?, ?, ?, ?)");
        try (PreparedStatement ps = conn.prepareStatement(sql.toString())) {
            int p = 1;
            for (int i = 0; i < rows.size(); i++) {
                ps.setLong(p++, AGG_ID_BASE + i);
                ps.setInt(p++, rows.get(i).customerId());
                ps.setBigDecimal(p++, rows.get(i).amount());
                ps.setString(p++, rows.get(i).note());
            }
            ps.executeUpdate();
        }
        for (int i = 0; i < rows.size(); i++) ledger.put(AGG_ID_BASE + i, rows.get(i));
        Map<Integer, String> want = new TreeMap<>();
        Map<Integer, long[]> counts = new TreeMap<>();
        Map<Integer, BigDecimal> sums = new TreeMap<>();
        for (Order o : ledger.values()) {
            counts.computeIfAbsent(o.customerId(), k -> new long[1])[0]++;
            sums.merge(o.customerId(), o.amount(), BigDecimal::add);
        }
        for (Integer k : counts.keySet()) want.put(k, counts.get(k)[0] + "/" + sums.get(k).stripTrailingZeros().toPlainString());
        Map<Integer, String> got = new TreeMap<>();
        try (Statement st = conn.createStatement();
             ResultSet rs = st.executeQuery("SELECT customer_id, count(*), sum(amount) FROM pgjdbc_orders GROUP BY customer_id ORDER BY customer_id")) {
            while (rs.next()) got.put(rs.getInt(1), rs.getLong(2) + "/" + rs.getBigDecimal(3).stripTrailingZeros().toPlainString());
        }
        expect(got.equals(want), "got " + got + ", want " + want);
    }

    static void checkRefJoin() throws Exception {
        try (PreparedStatement ps = conn.prepareStatement("INSERT INTO pgjdbc_customers (id, name) VALUES (?, ?)")) {
            for (int i = 1; i <= 10; i++) {
                ps.setInt(1, i);
                ps.setString(2, "customer " + i);
                ps.addBatch();
            }
            ps.executeBatch();
        }
        Map<String, Long> want = new TreeMap<>();
        for (Order o : ledger.values()) want.merge("customer " + o.customerId(), 1L, Long::sum);
        Map<String, Long> got = new TreeMap<>();
        try (Statement st = conn.createStatement();
             ResultSet rs = st.executeQuery("SELECT c.name, count(*) FROM pgjdbc_orders o JOIN pgjdbc_customers c"
                 + " ON c.id = o.customer_id GROUP BY c.name ORDER BY c.name")) {
            while (rs.next()) got.put(rs.getString(1), rs.getLong(2));
        }
        expect(got.equals(want), "got " + got + ", want " + want);
    }

    static void checkRollback() throws Exception {
        conn.setAutoCommit(false);
        try {
            try (PreparedStatement ps = conn.prepareStatement(
                    "INSERT INTO pgjdbc_orders (id, customer_id, amount, note) VALUES (?, 1, 1, 'rolled back')")) {
                ps.setLong(1, ROLLBACK_ID);
                ps.executeUpdate();
            }
            expect(count("SELECT count(*) FROM pgjdbc_orders WHERE id = ?", ROLLBACK_ID) == 1,
                "row not visible inside its transaction");
            conn.rollback();
        } finally {
            conn.setAutoCommit(true);
        }
        expect(count("SELECT count(*) FROM pgjdbc_orders WHERE id = ?", ROLLBACK_ID) == 0, "row still there after rollback");
    }

    static void checkTypes() throws Exception {
        byte[] bytea = new byte[256];
        for (int i = 0; i < 256; i++) bytea[i] = (byte) i;
        BigDecimal numeric = new BigDecimal("12345678901234567890.123456789");
        String text = "héllo ☃ 'single' \"double\" \\ back\ttab";
        LocalDate date = LocalDate.of(2024, 2, 29);
        OffsetDateTime ts = OffsetDateTime.of(2024, 3, 10, 12, 34, 56, 789_000_000, ZoneOffset.UTC);
        UUID uuid = UUID.fromString("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11");
        String json = "{\"a\": [1, 2, {\"b\": null}], \"c\": \"ünï\", \"d\": 1.5, \"e\": true}"; // jsonb's own text form
        Integer[] ints = {1, -2, 2147483647};
        String[] texts = {"a", "b c", "with,comma", "\"q\"", "", "ü"};
        try (PreparedStatement ps = conn.prepareStatement("INSERT INTO pgjdbc_types (id, c_int2, c_int4, c_int8, c_numeric,"
                + " c_float8, c_bool, c_text, c_bytea, c_date, c_ts, c_uuid, c_jsonb, c_int_arr, c_text_arr)"
                + " VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")) {
            ps.setShort(1, Short.MIN_VALUE);
            ps.setInt(2, Integer.MAX_VALUE);
            ps.setLong(3, Long.MIN_VALUE);
            ps.setBigDecimal(4, numeric);
            ps.setDouble(5, 1.0000000000000002);
            ps.setBoolean(6, true);
            ps.setString(7, text);
            ps.setBytes(8, bytea);
            ps.setObject(9, date);
            ps.setObject(10, ts);
            ps.setObject(11, uuid);
            PGobject jsonb = new PGobject();
            jsonb.setType("jsonb");
            jsonb.setValue(json);
            ps.setObject(12, jsonb);
            ps.setArray(13, conn.createArrayOf("int4", ints));
            ps.setArray(14, conn.createArrayOf("text", texts));
            ps.executeUpdate();
        }
        try (PreparedStatement ps = conn.prepareStatement("SELECT c_int2, c_int4, c_int8, c_numeric, c_float8, c_bool, c_text,"
                + " c_bytea, c_date, c_ts, c_uuid, c_jsonb, c_int_arr, c_text_arr FROM pgjdbc_types WHERE id = ?")) {
            ps.setInt(1, 1);
            try (ResultSet rs = ps.executeQuery()) {
                expect(rs.next(), "row not found");
                expect(rs.getShort(1) == Short.MIN_VALUE, "c_int2: " + rs.getShort(1));
                expect(rs.getInt(2) == Integer.MAX_VALUE, "c_int4: " + rs.getInt(2));
                expect(rs.getLong(3) == Long.MIN_VALUE, "c_int8: " + rs.getLong(3));
                expect(rs.getBigDecimal(4).equals(numeric), "c_numeric: " + rs.getBigDecimal(4));
                expect(rs.getDouble(5) == 1.0000000000000002, "c_float8: " + rs.getDouble(5));
                expect(rs.getBoolean(6), "c_bool");
                expect(text.equals(rs.getString(7)), "c_text: " + rs.getString(7));
                expect(Arrays.equals(bytea, rs.getBytes(8)), "c_bytea differs");
                expect(date.equals(rs.getObject(9, LocalDate.class)), "c_date: " + rs.getObject(9, LocalDate.class));
                OffsetDateTime gotTs = rs.getObject(10, OffsetDateTime.class);
                expect(gotTs != null && gotTs.isEqual(ts), "c_ts: " + gotTs);
                expect(uuid.equals(rs.getObject(11, UUID.class)), "c_uuid: " + rs.getObject(11));
                expect(json.equals(rs.getString(12)), "c_jsonb: " + rs.getString(12));
                Array ia = rs.getArray(13);
                expect(ia != null && Arrays.equals(ints, (Integer[]) ia.getArray()), "c_int_arr: " + ia);
                Array ta = rs.getArray(14);
                expect(ta != null && Arrays.equals(texts, (String[]) ta.getArray()), "c_text_arr: " + ta);
            }
        }
    }

    static void checkUniqueViolation() throws Exception {
        expect(!ledger.isEmpty(), "no orders (inserts failed)");
        long existing = ledger.keySet().iterator().next();
        try (PreparedStatement ps = conn.prepareStatement(
                "INSERT INTO pgjdbc_orders (id, customer_id, amount, note) VALUES (?, 1, 1, 'dup')")) {
            ps.setLong(1, existing);
            ps.executeUpdate();
        } catch (PSQLException e) {
            expect("23505".equals(e.getSQLState()), "SQLSTATE " + e.getSQLState() + ", want 23505: " + e.getMessage());
            ServerErrorMessage m = e.getServerErrorMessage();
            expect(m != null, "no server error message");
            expect("pgjdbc_orders".equals(m.getTable()), "table " + m.getTable() + ", want pgjdbc_orders");
            expect("pgjdbc_orders_pkey".equals(m.getConstraint()), "constraint " + m.getConstraint() + ", want pgjdbc_orders_pkey");
            return;
        }
        throw new CheckFailed("duplicate key accepted");
    }

    static void checkCursor() throws Exception {
        // The runner fills one shared table (MATRIX_BIG_TABLE); without it, our own.
        String table = env("MATRIX_BIG_TABLE", "");
        if (table.isEmpty()) {
            table = "pgjdbc_big";
            exec("INSERT INTO pgjdbc_big (id, k, v) SELECT g, g % 100, g * 3 FROM generate_series(1, 200000) g");
        }
        long count = 0;
        long sum = 0;
        // A fetch size takes effect only outside autocommit (portal + Execute with a row limit).
        conn.setAutoCommit(false);
        try (Statement st = conn.createStatement()) {
            st.setFetchSize(1000);
            try (ResultSet rs = st.executeQuery("SELECT id, v FROM " + table)) {
                while (rs.next()) {
                    count++;
                    sum += rs.getLong(2);
                }
            }
            conn.commit();
        } finally {
            conn.setAutoCommit(true);
        }
        expect(count == BIG_ROWS && sum == BIG_SUM_V, "count " + count + " sum " + sum + ", want " + BIG_ROWS + " " + BIG_SUM_V);
    }

    static void checkListenNotify() throws Exception {
        try (Connection listener = connect(); Connection notifier = connect()) {
            try (Statement st = listener.createStatement()) {
                st.execute("LISTEN pgjdbc_channel");
            }
            try (PreparedStatement ps = notifier.prepareStatement("SELECT pg_notify(?, ?)")) {
                ps.setString(1, "pgjdbc_channel");
                ps.setString(2, NOTIFY_PAYLOAD);
                ps.execute();
            }
            // Blocks on the socket without sending anything, up to 5 s.
            PGNotification[] ns = listener.unwrap(PGConnection.class).getNotifications(5000);
            expect(ns != null && ns.length > 0, "no notification within 5 s");
            expect("pgjdbc_channel".equals(ns[0].getName()) && NOTIFY_PAYLOAD.equals(ns[0].getParameter()),
                "got " + ns[0].getName() + " " + ns[0].getParameter());
        }
    }

    public static void main(String[] args) {
        run("connect", Matrix::checkConnect);
        if (conn == null) {
            System.out.println("FAIL " + CLIENT + " all: cannot connect, remaining checks skipped");
            System.exit(1);
        }
        run("ddl", Matrix::checkDdl);
        run("insert_returning", Matrix::checkInsertReturning);
        run("batch_insert", Matrix::checkBatchInsert);
        run("serial_insert", Matrix::checkSerialInsert);
        run("prepared_select", Matrix::checkPreparedSelect);
        run("aggregate", Matrix::checkAggregate);
        run("ref_join", Matrix::checkRefJoin);
        run("rollback", Matrix::checkRollback);
        run("types", Matrix::checkTypes);
        run("unique_violation", Matrix::checkUniqueViolation);
        run("cursor", Matrix::checkCursor);
        run("listen_notify", Matrix::checkListenNotify);
        try {
            if (conn != null) conn.close();
        } catch (SQLException ignored) {
            // closing anyway
        }
        System.exit(failed > 0 ? 1 : 0);
    }
}
