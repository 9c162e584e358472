-- The Tessera catalog, kept in the coordinator database. Table and column names
-- follow Citus so that tools and scripts written for Citus can read them.
-- Every statement is idempotent: the coordinator runs this file at every start.
CREATE SCHEMA IF NOT EXISTS tessera;

CREATE SEQUENCE IF NOT EXISTS tessera.pg_dist_node_nodeid_seq;
CREATE SEQUENCE IF NOT EXISTS tessera.pg_dist_groupid_seq;
CREATE SEQUENCE IF NOT EXISTS tessera.pg_dist_shardid_seq START 102008;
CREATE SEQUENCE IF NOT EXISTS tessera.pg_dist_placement_placementid_seq;
CREATE SEQUENCE IF NOT EXISTS tessera.pg_dist_colocationid_seq;

CREATE TABLE IF NOT EXISTS tessera.pg_dist_node (
    nodeid int PRIMARY KEY DEFAULT nextval('tessera.pg_dist_node_nodeid_seq'),
    groupid int NOT NULL DEFAULT nextval('tessera.pg_dist_groupid_seq'),
    nodename text NOT NULL,
    nodeport int NOT NULL DEFAULT 5432,
    noderack text NOT NULL DEFAULT 'default',
    hasmetadata bool NOT NULL DEFAULT false,
    isactive bool NOT NULL DEFAULT true,
    noderole text NOT NULL DEFAULT 'primary',
    nodecluster name NOT NULL DEFAULT 'default',
    metadatasynced bool NOT NULL DEFAULT false,
    shouldhaveshards bool NOT NULL DEFAULT true,
    UNIQUE (nodename, nodeport)
);

CREATE TABLE IF NOT EXISTS tessera.pg_dist_colocation (
    colocationid int PRIMARY KEY,
    shardcount int NOT NULL,
    replicationfactor int NOT NULL,
    distributioncolumntype oid NOT NULL,
    distributioncolumncollation oid NOT NULL
);

-- partmethod 'h' hash-distributed, 'n' reference table. partkey holds the
-- distribution column's name (Citus stores a serialized expression there).
CREATE TABLE IF NOT EXISTS tessera.pg_dist_partition (
    logicalrelid regclass PRIMARY KEY,
    partmethod "char" NOT NULL,
    partkey text,
    colocationid int NOT NULL DEFAULT 0,
    repmodel "char" NOT NULL DEFAULT 's',
    autoconverted bool NOT NULL DEFAULT false
);

-- Shards are hash partitions: shard k of a table with n shards holds the rows
-- PostgreSQL's PARTITION BY HASH would put in MODULUS n REMAINDER k. shardindex is
-- k; shardminvalue/shardmaxvalue hold k too, as text, for Citus tools.
CREATE TABLE IF NOT EXISTS tessera.pg_dist_shard (
    logicalrelid regclass NOT NULL,
    shardid bigint PRIMARY KEY,
    shardstorage "char" NOT NULL DEFAULT 't',
    shardminvalue text,
    shardmaxvalue text,
    shardindex int NOT NULL
);
CREATE INDEX IF NOT EXISTS pg_dist_shard_logicalrelid_index ON tessera.pg_dist_shard (logicalrelid);

CREATE TABLE IF NOT EXISTS tessera.pg_dist_placement (
    placementid bigint PRIMARY KEY DEFAULT nextval('tessera.pg_dist_placement_placementid_seq'),
    shardid bigint NOT NULL,
    shardstate int NOT NULL DEFAULT 1,
    shardlength bigint NOT NULL DEFAULT 0,
    groupid int NOT NULL
);
CREATE INDEX IF NOT EXISTS pg_dist_placement_shardid_index ON tessera.pg_dist_placement (shardid);

-- Citus's name, kept for tools that read it; always empty (see
-- the DROP FUNCTION of record_commits below).
CREATE TABLE IF NOT EXISTS tessera.pg_dist_transaction (
    groupid int NOT NULL,
    gid text NOT NULL,
    PRIMARY KEY (groupid, gid)
);

-- Functions and procedures made distributed by create_distributed_function,
-- with Citus's columns. (Every other object a node shares is propagated
-- without a row here.) distribution_argument_index counts from 0.
CREATE TABLE IF NOT EXISTS tessera.pg_dist_object (
    classid oid NOT NULL,
    objid oid NOT NULL,
    objsubid int NOT NULL DEFAULT 0,
    type text,
    object_names text[],
    object_args text[],
    distribution_argument_index int,
    colocationid int,
    force_delegation bool,
    PRIMARY KEY (classid, objid, objsubid)
);

-- Catalog changes a table's owner may make, through the coordinator: the
-- catalog tables themselves only the superuser may change. Each checks that
-- the caller owns the table (or is a member of the owning role), as
-- PostgreSQL does for ALTER TABLE. Inside these functions current_user is
-- their owner; the caller is the role the session set, or logged in as.
CREATE OR REPLACE FUNCTION tessera.check_owner(rel regclass) RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, tessera AS $$
DECLARE
    caller name := CASE current_setting('role') WHEN 'none' THEN session_user ELSE current_setting('role') END;
BEGIN
    IF NOT pg_has_role(caller, (SELECT relowner FROM pg_class WHERE oid = rel), 'USAGE') THEN
        RAISE EXCEPTION 'must be owner of table %', (SELECT relname FROM pg_class WHERE oid = rel) USING ERRCODE = '42501';
    END IF;
END $$;
CREATE OR REPLACE FUNCTION tessera.new_colocation(shards int, replicas int, column_type oid, column_collation oid) RETURNS int LANGUAGE sql
SECURITY DEFINER SET search_path = pg_catalog, tessera
AS 'INSERT INTO tessera.pg_dist_colocation VALUES (nextval(''tessera.pg_dist_colocationid_seq''), shards, replicas, column_type, column_collation) RETURNING colocationid';
-- Records a table as distributed with shards placed as `placements` says:
-- row i lists the node groups holding shard i. Returns the shard ids, in order.
CREATE OR REPLACE FUNCTION tessera.record_distribution(rel regclass, method "char", key text, colocation int, placements int[]) RETURNS bigint[] LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, tessera AS $$
DECLARE
    ids bigint[] := '{}';
    id bigint;
BEGIN
    PERFORM tessera.check_owner(rel);
    INSERT INTO tessera.pg_dist_partition (logicalrelid, partmethod, partkey, colocationid, repmodel)
    VALUES (rel, method, key, colocation, CASE method WHEN 'n' THEN 't' ELSE 's' END);
    FOR i IN 1 .. array_length(placements, 1) LOOP
        id := nextval('tessera.pg_dist_shardid_seq');
        ids := ids || id;
        INSERT INTO tessera.pg_dist_shard (logicalrelid, shardid, shardminvalue, shardmaxvalue, shardindex) VALUES (rel, id, (i - 1)::text, (i - 1)::text, i - 1);
        INSERT INTO tessera.pg_dist_placement (shardid, groupid) SELECT id, g FROM unnest(placements[i:i]) g;
    END LOOP;
    RETURN ids;
END $$;
CREATE OR REPLACE FUNCTION tessera.forget_distribution(rel regclass) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, tessera AS $$
BEGIN
    PERFORM tessera.check_owner(rel);
    DELETE FROM tessera.pg_dist_placement WHERE shardid IN (SELECT shardid FROM tessera.pg_dist_shard WHERE logicalrelid = rel);
    DELETE FROM tessera.pg_dist_shard WHERE logicalrelid = rel;
    DELETE FROM tessera.pg_dist_partition WHERE logicalrelid = rel;
    -- Its general-fallback stand-in goes now, not at the next rebuild: the
    -- types its columns use could not be dropped meanwhile.
    PERFORM tessera.drop_stand_in(rel::oid);
    DELETE FROM tessera.fallback_tables WHERE relid = rel::oid;
END $$;
CREATE OR REPLACE FUNCTION tessera.rename_distribution_column(rel regclass, name text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, tessera AS $$
BEGIN
    PERFORM tessera.check_owner(rel);
    UPDATE tessera.pg_dist_partition SET partkey = name WHERE logicalrelid = rel;
END $$;
-- A write a session planned while a table was still local, and which then
-- waited for create_distributed_table's lock on it, would reach the table's
-- empty shell once the table is distributed, out of every query's sight.
-- Guard triggers on every shell (tessera_distributed_shell: UPDATE, DELETE,
-- TRUNCATE, per statement; tessera_distributed_shell_rows: each INSERTed
-- row, so that COPY's empty run on the shell passes) turn such writes into
-- an error to retry. Tessera's own writes to shells SET LOCAL
-- tessera.shell_writes. (The coordinator sends a lone write that meets the
-- guard again, matching its message: server/session.rs.) The function
-- names this server and database: in a
-- restore of a dump elsewhere, which carries the triggers, they let every
-- write through.
DO $guard$
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION tessera.refuse_shell_write() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $body$
        BEGIN
            IF current_setting('tessera.shell_writes', true) IS DISTINCT FROM 'on'
               AND current_database() = %L AND (SELECT system_identifier FROM pg_control_system()) = %s
               AND EXISTS (SELECT FROM tessera.pg_dist_partition WHERE logicalrelid = TG_RELID) THEN
                RAISE EXCEPTION 'relation "%%" was distributed while this statement waited for it', TG_TABLE_NAME
                    USING ERRCODE = '40001', HINT = 'Run the statement again: it will reach the table''s shards.';
            END IF;
            -- The row, for a row trigger (NULL would skip it); NULL for a statement's.
            RETURN NEW;
        END $body$ $f$, current_database(), (SELECT system_identifier FROM pg_control_system()));
END $guard$;
CREATE OR REPLACE FUNCTION tessera.guard_shell(rel regclass) RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
    EXECUTE format('CREATE OR REPLACE TRIGGER tessera_distributed_shell BEFORE UPDATE OR DELETE OR TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION tessera.refuse_shell_write()', rel);
    IF (SELECT relkind FROM pg_class WHERE oid = rel) <> 'p' THEN
        EXECUTE format('CREATE OR REPLACE TRIGGER tessera_distributed_shell_rows BEFORE INSERT ON %s FOR EACH ROW EXECUTE FUNCTION tessera.refuse_shell_write()', rel);
    END IF;
END $$;
-- Shells distributed before the guards existed get them now.
DO $$
DECLARE
    rel regclass;
BEGIN
    FOR rel IN SELECT p.logicalrelid FROM tessera.pg_dist_partition p
               WHERE NOT EXISTS (SELECT FROM pg_trigger t WHERE t.tgrelid = p.logicalrelid AND t.tgname = 'tessera_distributed_shell') LOOP
        PERFORM tessera.guard_shell(rel);
    END LOOP;
END $$;

-- Distributed functions co-located with a group that has no tables left
-- (alter_distributed_table gave its last one a new shard count) follow that
-- table to its new group, when both groups hash the same type.
CREATE OR REPLACE FUNCTION tessera.follow_colocation(old_group int, new_group int) RETURNS void LANGUAGE sql
SECURITY DEFINER SET search_path = pg_catalog, tessera AS $$
    UPDATE tessera.pg_dist_object o SET colocationid = new_group
     WHERE o.colocationid = old_group
       AND NOT EXISTS (SELECT FROM tessera.pg_dist_partition p WHERE p.colocationid = old_group)
       AND (SELECT c.distributioncolumntype FROM tessera.pg_dist_colocation c WHERE c.colocationid = old_group)
         = (SELECT c.distributioncolumntype FROM tessera.pg_dist_colocation c WHERE c.colocationid = new_group)
$$;

-- Two-phase commits are decided by commit records on the deciding node
-- (tessera_commit.commit_records, in this database too); versions before
-- wrote them here.
DROP FUNCTION IF EXISTS tessera.record_commits(int[], text[]);

-- What an operation (a shard move) made on the nodes and must remove when it
-- ends (policy_type 2, "always") or only when it did not finish (1, "on
-- failure"), as Citus records it. object_type: 1 a shard table, 2 a
-- subscription, 3 a replication slot, 4 a publication. A running operation
-- holds the advisory lock (OPERATION_LOCK_CLASS, operation_id) in the
-- coordinator database; records of operations nobody holds are cleaned up.
CREATE SEQUENCE IF NOT EXISTS tessera.pg_dist_operationid_seq;
CREATE TABLE IF NOT EXISTS tessera.pg_dist_cleanup (
    record_id bigserial PRIMARY KEY,
    operation_id bigint NOT NULL,
    object_type int NOT NULL,
    object_name text NOT NULL,
    node_group_id int NOT NULL,
    policy_type int NOT NULL
);

-- Background jobs (citus_rebalance_start): a job is a list of tasks, each one
-- shard-group move, run in task order by whichever coordinator process holds
-- the advisory lock (JOB_LOCK_CLASS, job_id) of operations/background.rs, so
-- a job outlives the process that started it. Job states: scheduled, running,
-- cancelling, finished, cancelled, failed; task states: runnable, running,
-- done, error, cancelled (Citus's names).
CREATE TABLE IF NOT EXISTS tessera.pg_dist_background_job (
    job_id bigserial PRIMARY KEY,
    state text NOT NULL DEFAULT 'scheduled',
    job_type name NOT NULL,
    description text NOT NULL,
    started_at timestamptz,
    finished_at timestamptz
);
-- One rebalance at a time.
CREATE UNIQUE INDEX IF NOT EXISTS pg_dist_background_job_one_active ON tessera.pg_dist_background_job (job_type)
    WHERE state IN ('scheduled', 'running', 'cancelling');
CREATE TABLE IF NOT EXISTS tessera.pg_dist_background_task (
    job_id bigint NOT NULL REFERENCES tessera.pg_dist_background_job ON DELETE CASCADE,
    task_id bigserial PRIMARY KEY,
    status text NOT NULL DEFAULT 'runnable',
    command text NOT NULL,
    message text,
    shardid bigint NOT NULL,
    source_groupid int NOT NULL,
    target_groupid int NOT NULL,
    shard_transfer_mode text NOT NULL
);

-- Bumped by trigger on every catalog change; coordinator processes LISTEN for it
-- and reload their in-memory snapshot.
CREATE TABLE IF NOT EXISTS tessera.catalog_version (version bigint NOT NULL);
INSERT INTO tessera.catalog_version SELECT 1 WHERE NOT EXISTS (SELECT FROM tessera.catalog_version);
-- What the fallback tier's stand-ins follow: changes of distributed tables,
-- not of views and functions (which bump `version` only).
ALTER TABLE tessera.catalog_version ADD COLUMN IF NOT EXISTS tables_version bigint;
UPDATE tessera.catalog_version SET tables_version = version WHERE tables_version IS NULL;

-- Which distributed tables each catalog version changed, so that a
-- coordinator whose snapshot is a few versions behind reads only those
-- tables again (`metadata::load_since`): with hundreds of tables and tens
-- of thousands of shards, reading the whole catalog after every DDL
-- statement cost more than the statement. A row without a relid stands for
-- a change whose tables are not known: the whole catalog is read then.
CREATE TABLE IF NOT EXISTS tessera.catalog_changes (version bigint NOT NULL, relid oid);
CREATE INDEX IF NOT EXISTS catalog_changes_version ON tessera.catalog_changes (version);
-- The first version whose changes are all still recorded (older ones are pruned).
ALTER TABLE tessera.catalog_version ADD COLUMN IF NOT EXISTS changes_kept_from bigint;
UPDATE tessera.catalog_version SET changes_kept_from = version + 1 WHERE changes_kept_from IS NULL;

-- Records a change of the distributed tables `relids` (NULL: of any), which
-- the fallback tier's stand-ins follow too. The version row is locked until
-- commit, so versions are handed out in commit order and a reader sees
-- every change up to the version it reads.
CREATE OR REPLACE FUNCTION tessera.tables_changed(relids oid[]) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, tessera AS $$
DECLARE
    changed bigint;
BEGIN
    UPDATE tessera.catalog_version SET version = version + 1, tables_version = tables_version + 1 RETURNING version INTO changed;
    INSERT INTO tessera.catalog_changes SELECT changed, r FROM unnest(coalesce(relids, ARRAY[NULL::oid])) r;
    -- A coordinator a thousand versions behind reads the whole catalog.
    IF changed % 100 = 0 THEN
        DELETE FROM tessera.catalog_changes WHERE version <= changed - 1000;
        UPDATE tessera.catalog_version SET changes_kept_from = greatest(changes_kept_from, changed - 999);
    END IF;
    PERFORM pg_notify('tessera_catalog', '');
END $$;

-- A change of distributed tables that are not named. Any role's DDL may call for it.
CREATE OR REPLACE FUNCTION tessera.catalog_changed() RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, tessera AS $$
BEGIN
    PERFORM tessera.tables_changed(NULL);
END $$;

-- After DDL on views, functions, triggers or aggregates: the coordinators
-- reload (metadata/user_code.rs), the fallback's stand-ins stay.
CREATE OR REPLACE FUNCTION tessera.user_code_changed() RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, tessera AS $$
BEGIN
    -- A distributed function dropped: its row goes with it.
    DELETE FROM tessera.pg_dist_object o WHERE o.classid = 'pg_proc'::regclass AND NOT EXISTS (SELECT FROM pg_proc p WHERE p.oid = o.objid);
    UPDATE tessera.catalog_version SET version = version + 1;
    PERFORM pg_notify('tessera_catalog', '');
END $$;

-- Nodes, co-location groups and distributed objects: coordinators read
-- them whole on every reload, so a change names no table; a TRUNCATE of
-- any catalog table calls for reading everything.
CREATE OR REPLACE FUNCTION tessera.bump_catalog_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tessera.tables_changed(CASE WHEN TG_OP = 'TRUNCATE' THEN NULL ELSE '{}'::oid[] END);
    RETURN NULL;
END $$;

-- Rows of pg_dist_partition, pg_dist_shard and pg_dist_placement changed:
-- their tables are recorded, from the statement's rows (an UPDATE's old
-- rows: no command changes which table a row belongs to).
CREATE OR REPLACE FUNCTION tessera.record_changed_rows() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    relids oid[];
BEGIN
    IF TG_TABLE_NAME = 'pg_dist_placement' THEN
        -- A placement whose shard row is already gone was recorded with the shard.
        SELECT array_agg(DISTINCT s.logicalrelid::oid) INTO relids FROM changed_rows r JOIN tessera.pg_dist_shard s USING (shardid);
    ELSE
        SELECT array_agg(DISTINCT r.logicalrelid::oid) INTO relids FROM changed_rows r;
    END IF;
    PERFORM tessera.tables_changed(coalesce(relids, '{}'));
    RETURN NULL;
END $$;

DO $$
DECLARE
    t text;
    event text;
BEGIN
    FOREACH t IN ARRAY ARRAY['pg_dist_node', 'pg_dist_colocation', 'pg_dist_object'] LOOP
        IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgname = t || '_changed') THEN
            EXECUTE format('CREATE TRIGGER %I AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON tessera.%I FOR EACH STATEMENT EXECUTE FUNCTION tessera.bump_catalog_version()', t || '_changed', t);
        END IF;
    END LOOP;
    FOREACH t IN ARRAY ARRAY['pg_dist_partition', 'pg_dist_shard', 'pg_dist_placement'] LOOP
        -- Catalogs from before changes were recorded per table.
        EXECUTE format('DROP TRIGGER IF EXISTS %I ON tessera.%I', t || '_changed', t);
        IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgname = t || '_truncated') THEN
            EXECUTE format('CREATE TRIGGER %I AFTER TRUNCATE ON tessera.%I FOR EACH STATEMENT EXECUTE FUNCTION tessera.bump_catalog_version()', t || '_truncated', t);
        END IF;
        -- PostgreSQL gives transition tables to triggers of one event only.
        FOREACH event IN ARRAY ARRAY['INSERT', 'UPDATE', 'DELETE'] LOOP
            IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgname = t || '_' || lower(event)) THEN
                EXECUTE format('CREATE TRIGGER %I AFTER %s ON tessera.%I REFERENCING %s TABLE AS changed_rows FOR EACH STATEMENT EXECUTE FUNCTION tessera.record_changed_rows()',
                               t || '_' || lower(event), event, t, CASE event WHEN 'INSERT' THEN 'NEW' ELSE 'OLD' END);
            END IF;
        END LOOP;
    END LOOP;
END $$;

-- What users see of the catalog lives in pg_catalog, as Citus's does: the names
-- resolve on any search_path, and psql's \dt, \dv and \df leave them out.
-- The tables stay in schema tessera; pg_catalog holds views over them (a
-- relation may be created there only with allow_system_table_mods). Earlier
-- versions put schema tessera on the search path and the functions in it.
DO $$
DECLARE
    f regprocedure;
BEGIN
    DROP VIEW IF EXISTS tessera.citus_shards, tessera.citus_tables;
    FOR f IN SELECT p.oid FROM pg_proc p WHERE p.pronamespace = 'tessera'::regnamespace
             AND p.proname IN ('create_distributed_table', 'create_reference_table', 'undistribute_table', 'citus_add_node', 'master_add_node',
                               'citus_remove_node', 'master_remove_node', 'recover_prepared_transactions', 'master_get_active_worker_nodes', 'citus_get_active_worker_nodes') LOOP
        EXECUTE format('DROP FUNCTION %s', f);
    END LOOP;
    IF EXISTS (SELECT FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase
               WHERE d.datname = current_database() AND s.setrole = 0 AND 'search_path="$user", public, tessera' = ANY (s.setconfig)) THEN
        EXECUTE format('ALTER DATABASE %I RESET search_path', current_database());
    END IF;
END $$;

SET allow_system_table_mods = on;
CREATE OR REPLACE VIEW pg_catalog.pg_dist_node AS SELECT * FROM tessera.pg_dist_node;
CREATE OR REPLACE VIEW pg_catalog.pg_dist_colocation AS SELECT * FROM tessera.pg_dist_colocation;
CREATE OR REPLACE VIEW pg_catalog.pg_dist_partition AS SELECT * FROM tessera.pg_dist_partition;
CREATE OR REPLACE VIEW pg_catalog.pg_dist_shard AS SELECT * FROM tessera.pg_dist_shard;
CREATE OR REPLACE VIEW pg_catalog.pg_dist_placement AS SELECT * FROM tessera.pg_dist_placement;
CREATE OR REPLACE VIEW pg_catalog.pg_dist_transaction AS SELECT * FROM tessera.pg_dist_transaction;
CREATE OR REPLACE VIEW pg_catalog.pg_dist_object AS SELECT * FROM tessera.pg_dist_object;
CREATE OR REPLACE VIEW pg_catalog.pg_dist_cleanup AS SELECT * FROM tessera.pg_dist_cleanup;
CREATE OR REPLACE VIEW pg_catalog.pg_dist_background_job AS SELECT * FROM tessera.pg_dist_background_job;
CREATE OR REPLACE VIEW pg_catalog.pg_dist_background_task AS SELECT * FROM tessera.pg_dist_background_task;


-- Partitions of tables partitioned by range on one date or time column,
-- with their bounds as text (MINVALUE/MAXVALUE and default partitions left out).
CREATE OR REPLACE VIEW pg_catalog.time_partitions AS
SELECT i.inhparent::regclass AS parent_table,
       a.attname AS partition_column,
       c.oid::regclass AS partition,
       b[1] AS from_value,
       b[2] AS to_value,
       am.amname AS access_method
FROM pg_partitioned_table pt
JOIN pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = pt.partattrs[0]
JOIN pg_inherits i ON i.inhparent = pt.partrelid
JOIN pg_class c ON c.oid = i.inhrelid
LEFT JOIN pg_am am ON am.oid = c.relam
CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), $re$^FOR VALUES FROM \('([^']*)'\) TO \('([^']*)'\)$$re$) b
WHERE pt.partstrat = 'r' AND pt.partnatts = 1 AND a.atttypid IN ('date'::regtype, 'timestamp'::regtype, 'timestamptz'::regtype);
RESET allow_system_table_mods;
GRANT SELECT ON pg_catalog.pg_dist_node, pg_catalog.pg_dist_colocation, pg_catalog.pg_dist_partition, pg_catalog.pg_dist_shard,
    pg_catalog.pg_dist_placement, pg_catalog.pg_dist_object,
    pg_catalog.pg_dist_background_job, pg_catalog.pg_dist_background_task, pg_catalog.time_partitions TO PUBLIC;

-- The CREATE TABLE … PARTITION OF statements create_time_partitions runs
-- (through the coordinator, so that a distributed table's partitions get
-- shards): partitions of partition_interval from start_from up to end_at,
-- aligned to the interval's unit (a month's start, a Monday, midnight, …)
-- and named <table>_p<start> in that unit's precision; with partitions there
-- already, they continue after the last one and before the first.
CREATE OR REPLACE FUNCTION tessera.missing_time_partitions(table_name regclass, partition_interval interval, end_at timestamptz, start_from timestamptz)
RETURNS SETOF text LANGUAGE plpgsql SET search_path = pg_catalog, tessera AS $$
DECLARE
    column_type regtype;
    months int := extract(year FROM partition_interval)::int * 12 + extract(month FROM partition_interval)::int;
    days int := extract(day FROM partition_interval)::int;
    seconds numeric := extract(hour FROM partition_interval) * 3600 + extract(minute FROM partition_interval) * 60 + extract(second FROM partition_interval);
    unit text;
    pattern text;
    parent_schema name;
    parent_name name;
    lowest timestamptz;
    highest timestamptz;
    bound timestamptz;
    made int := 0;
BEGIN
    SELECT a.atttypid INTO column_type FROM pg_partitioned_table pt JOIN pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = pt.partattrs[0]
     WHERE pt.partrelid = table_name AND pt.partstrat = 'r' AND pt.partnatts = 1;
    IF column_type IS NULL OR column_type NOT IN ('date'::regtype, 'timestamp'::regtype, 'timestamptz'::regtype) THEN
        RAISE EXCEPTION '% is not partitioned by range on one column of type date, timestamp or timestamptz', table_name USING ERRCODE = '22023';
    END IF;
    IF months < 0 OR days < 0 OR seconds < 0 OR partition_interval = interval '0' THEN
        RAISE EXCEPTION 'partition_interval must be positive' USING ERRCODE = '22023';
    END IF;
    unit := CASE WHEN days = 0 AND seconds = 0 AND months % 12 = 0 THEN 'year'
                 WHEN days = 0 AND seconds = 0 THEN 'month'
                 WHEN months = 0 AND seconds = 0 AND days % 7 = 0 THEN 'week'
                 WHEN months = 0 AND seconds = 0 THEN 'day'
                 WHEN months = 0 AND days = 0 AND seconds % 3600 = 0 THEN 'hour'
                 WHEN months = 0 AND days = 0 AND seconds % 60 = 0 THEN 'minute'
                 ELSE 'second' END;
    IF column_type = 'date'::regtype AND unit IN ('hour', 'minute', 'second') THEN
        RAISE EXCEPTION 'partitions of the date column of % must span whole days', table_name USING ERRCODE = '22023';
    END IF;
    pattern := CASE unit WHEN 'year' THEN 'YYYY' WHEN 'month' THEN 'YYYY_MM' WHEN 'week' THEN 'IYYY"w"IW' WHEN 'day' THEN 'YYYY_MM_DD'
                         WHEN 'second' THEN 'YYYY_MM_DD_HH24MISS' ELSE 'YYYY_MM_DD_HH24MI' END;
    SELECT n.nspname, c.relname INTO parent_schema, parent_name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = table_name;
    SELECT min(p.from_value::timestamptz), max(p.to_value::timestamptz) INTO lowest, highest FROM pg_catalog.time_partitions p WHERE p.parent_table = table_name;
    IF highest IS NULL THEN
        lowest := date_trunc(unit, start_from);
        highest := lowest;
    END IF;
    bound := highest;
    WHILE bound < end_at LOOP
        RETURN NEXT tessera.time_partition_sql(table_name, parent_schema, parent_name, column_type, pattern, bound, bound + partition_interval);
        bound := bound + partition_interval;
        made := made + 1;
        IF made > 10000 THEN
            RAISE EXCEPTION 'more than 10000 partitions of % up to %', table_name, end_at USING ERRCODE = '54000', HINT = 'Use a longer partition_interval or an earlier end_at.';
        END IF;
    END LOOP;
    bound := lowest;
    WHILE bound > start_from LOOP
        RETURN NEXT tessera.time_partition_sql(table_name, parent_schema, parent_name, column_type, pattern, bound - partition_interval, bound);
        bound := bound - partition_interval;
        made := made + 1;
        IF made > 10000 THEN
            RAISE EXCEPTION 'more than 10000 partitions of % from %', table_name, start_from USING ERRCODE = '54000', HINT = 'Use a longer partition_interval or a later start_from.';
        END IF;
    END LOOP;
END $$;
CREATE OR REPLACE FUNCTION tessera.time_partition_sql(parent regclass, parent_schema name, parent_name name, column_type regtype, pattern text, lower_bound timestamptz, upper_bound timestamptz)
RETURNS text LANGUAGE sql STABLE SET search_path = pg_catalog AS $$
    SELECT format('CREATE TABLE %I.%I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)', parent_schema, left(parent_name || '_p' || to_char(lower_bound, pattern), 63), parent,
                  CASE column_type WHEN 'date'::regtype THEN lower_bound::date::text WHEN 'timestamp'::regtype THEN lower_bound::timestamp::text ELSE lower_bound::text END,
                  CASE column_type WHEN 'date'::regtype THEN upper_bound::date::text WHEN 'timestamp'::regtype THEN upper_bound::timestamp::text ELSE upper_bound::text END)
$$;
-- The DROP TABLE statements drop_old_time_partitions runs: partitions whose
-- upper bound is at or before older_than, oldest first.
CREATE OR REPLACE FUNCTION tessera.old_time_partitions(table_name regclass, older_than timestamptz)
RETURNS SETOF text LANGUAGE sql STABLE SET search_path = pg_catalog AS $$
    SELECT format('DROP TABLE %s', p.partition) FROM pg_catalog.time_partitions p
     WHERE p.parent_table = table_name AND p.to_value::timestamptz <= older_than ORDER BY p.from_value::timestamptz
$$;

-- Makes a function or procedure distributed, as Citus's does: calls whose
-- distribution argument is a constant or a parameter then run on the node
-- holding that value's shard of the co-located tables (planner/delegation.rs).
-- The function itself already exists on every node (CREATE FUNCTION through
-- the coordinator reaches them all). Without a distribution argument the
-- function is only recorded. The caller must own the function.
CREATE OR REPLACE FUNCTION tessera.distribute_function(function_name regprocedure, distribution_arg_name text, colocate_with regclass, force_delegation bool)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, tessera AS $$
DECLARE
    caller name := CASE current_setting('role') WHEN 'none' THEN session_user ELSE current_setting('role') END;
    proc pg_proc;
    arg_index int;
    arg_type oid;
    colocation int;
BEGIN
    SELECT * INTO proc FROM pg_proc WHERE oid = function_name;
    IF NOT pg_has_role(caller, proc.proowner, 'USAGE') THEN
        RAISE EXCEPTION 'must be owner of function %', proc.proname USING ERRCODE = '42501';
    END IF;
    IF distribution_arg_name IS NOT NULL THEN
        IF distribution_arg_name ~ '^\$[0-9]+$' THEN
            arg_index := substr(distribution_arg_name, 2)::int - 1;
        ELSE
            arg_index := array_position(proc.proargnames[1:proc.pronargs], distribution_arg_name) - 1;
        END IF;
        IF arg_index IS NULL OR arg_index < 0 OR arg_index >= proc.pronargs THEN
            RAISE EXCEPTION 'cannot distribute the function "%" since the distribution argument is not valid', proc.proname
                USING ERRCODE = '42602', HINT = 'Name one of its input arguments, or give its position as $1, $2, ….';
        END IF;
        arg_type := proc.proargtypes[arg_index];
        IF colocate_with IS NULL THEN
            SELECT c.colocationid INTO colocation FROM tessera.pg_dist_colocation c
            WHERE c.distributioncolumntype = arg_type AND EXISTS (SELECT FROM tessera.pg_dist_partition p WHERE p.colocationid = c.colocationid AND p.partmethod = 'h')
            ORDER BY c.colocationid LIMIT 1;
            IF colocation IS NULL THEN
                RAISE EXCEPTION 'cannot distribute the function "%": no distributed table has a distribution column of type %', proc.proname, format_type(arg_type, NULL)
                    USING ERRCODE = '0A000', HINT = 'Distribute a table by a column of that type first, or name a table with colocate_with.';
            END IF;
        ELSE
            SELECT p.colocationid INTO colocation FROM tessera.pg_dist_partition p WHERE p.logicalrelid = colocate_with AND p.partmethod = 'h';
            IF colocation IS NULL THEN
                RAISE EXCEPTION 'relation % is not a hash-distributed table', colocate_with USING ERRCODE = '0A000';
            END IF;
            IF (SELECT distributioncolumntype FROM tessera.pg_dist_colocation WHERE colocationid = colocation) <> arg_type THEN
                RAISE EXCEPTION 'cannot colocate function "%" and table "%" because the distribution column types don''t match', proc.proname, colocate_with
                    USING ERRCODE = '0A000', HINT = 'Give the function''s distribution argument the type of the table''s distribution column.';
            END IF;
        END IF;
    ELSIF force_delegation THEN
        RAISE EXCEPTION 'force_delegation needs a distribution argument' USING ERRCODE = '22023';
    END IF;
    INSERT INTO tessera.pg_dist_object
    SELECT 'pg_proc'::regclass, proc.oid, 0, CASE proc.prokind WHEN 'p' THEN 'procedure' ELSE 'function' END,
           ARRAY[n.nspname::text, proc.proname::text], (SELECT coalesce(array_agg(format_type(t, NULL) ORDER BY i), '{}') FROM unnest(proc.proargtypes::oid[]) WITH ORDINALITY a(t, i)),
           arg_index, colocation, force_delegation
    FROM pg_namespace n WHERE n.oid = proc.pronamespace
    ON CONFLICT (classid, objid, objsubid) DO UPDATE SET distribution_argument_index = EXCLUDED.distribution_argument_index,
        colocationid = EXCLUDED.colocationid, force_delegation = EXCLUDED.force_delegation, object_names = EXCLUDED.object_names;
END $$;
CREATE OR REPLACE FUNCTION pg_catalog.create_distributed_function(function_name regprocedure, distribution_arg_name text DEFAULT NULL,
    colocate_with text DEFAULT 'default', force_delegation bool DEFAULT NULL) RETURNS void LANGUAGE sql
-- The table name is looked up on the caller's search_path, here.
AS $$ SELECT tessera.distribute_function(function_name, distribution_arg_name,
          CASE WHEN colocate_with IS NULL OR lower(colocate_with) = 'default' THEN NULL ELSE colocate_with::regclass END, force_delegation) $$;

-- The cluster functions are carried out by the coordinator process, which
-- intercepts calls to them. These definitions make them visible to \df+ and give a
-- clear error when someone calls them on the coordinator database directly.
-- What the cluster functions' stand-ins raise when the coordinator did not
-- carry the call out itself: sent to the coordinator database directly, or
-- called inside another query or expression, which the coordinator does not
-- take apart. The caller's name comes from the call stack.
CREATE OR REPLACE FUNCTION tessera.coordinator_only() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    stack text;
    called text;
BEGIN
    GET DIAGNOSTICS stack = PG_CONTEXT;
    called := coalesce(substring(stack from 'SQL function "([^"]+)"'), 'this function');
    RAISE EXCEPTION '% is carried out by the Tessera coordinator, as a statement of its own', called
        USING ERRCODE = '0A000',
              HINT = format('Send SELECT %1$s(...) or SELECT * FROM %1$s(...) (CALL for a procedure) through the coordinator, alone: not to the coordinator database directly, and not inside another expression such as a cast.', called);
END $$;
CREATE OR REPLACE FUNCTION pg_catalog.create_distributed_table(table_name regclass, distribution_column text, distribution_type text DEFAULT 'hash', colocate_with text DEFAULT 'default', shard_count int DEFAULT NULL)
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION pg_catalog.create_distributed_table_concurrently(table_name regclass, distribution_column text, distribution_type text DEFAULT 'hash', colocate_with text DEFAULT 'default', shard_count int DEFAULT NULL)
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION pg_catalog.create_reference_table(table_name regclass)
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION pg_catalog.undistribute_table(table_name regclass, cascade_via_foreign_keys boolean DEFAULT false)
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION pg_catalog.alter_distributed_table(table_name regclass, distribution_column text DEFAULT NULL, shard_count int DEFAULT NULL,
                                                              colocate_with text DEFAULT NULL, cascade_to_colocated boolean DEFAULT NULL)
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION pg_catalog.citus_add_node(nodename text, nodeport int DEFAULT 5432, groupid int DEFAULT -1, noderole text DEFAULT 'primary', nodecluster name DEFAULT 'default')
    RETURNS int LANGUAGE sql AS 'SELECT tessera.coordinator_only(); SELECT 0';
CREATE OR REPLACE FUNCTION pg_catalog.master_add_node(nodename text, nodeport int DEFAULT 5432, groupid int DEFAULT -1, noderole text DEFAULT 'primary', nodecluster name DEFAULT 'default')
    RETURNS int LANGUAGE sql AS 'SELECT tessera.coordinator_only(); SELECT 0';
-- Former primaries a failover left behind (operations/failover.rs): a
-- coordinator that finds one answering as a primary stops it.
CREATE TABLE IF NOT EXISTS tessera.fenced_nodes (
    nodename text NOT NULL,
    nodeport int NOT NULL,
    fenced_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (nodename, nodeport)
);
-- Registers a streaming standby of the primary at primaryname:primaryport
-- (a worker, or this coordinator database) as its secondary (same group):
-- the coordinator promotes it and points the node at it (or moves to it)
-- when the primary stops answering (operations/failover.rs).
CREATE OR REPLACE FUNCTION pg_catalog.citus_add_secondary_node(nodename text, nodeport int, primaryname text, primaryport int, nodecluster name DEFAULT 'default')
RETURNS int LANGUAGE plpgsql SET search_path = pg_catalog AS $$
DECLARE
    primary_group int;
    id int;
BEGIN
    -- Checked here, not by revoking EXECUTE: pg_dump would carry a changed
    -- privilege of a pg_catalog function into every dump.
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        RAISE EXCEPTION 'permission denied for function citus_add_secondary_node' USING ERRCODE = '42501';
    END IF;
    SELECT n.groupid INTO primary_group FROM tessera.pg_dist_node n
     WHERE n.nodename = primaryname AND n.nodeport = primaryport AND n.noderole = 'primary';
    -- The coordinator database itself: group 0, as Citus numbers the coordinator.
    IF primary_group IS NULL AND primaryport = current_setting('port')::int
       AND (primaryname IN ('localhost', '127.0.0.1', '::1') OR primaryname = host(inet_server_addr())) THEN
        primary_group := 0;
    END IF;
    IF primary_group IS NULL THEN
        RAISE EXCEPTION 'node at "%:%" does not exist', primaryname, primaryport USING ERRCODE = '42704',
            HINT = 'SELECT nodename, nodeport FROM pg_dist_node WHERE noderole = ''primary'' lists the primaries.';
    END IF;
    INSERT INTO tessera.pg_dist_node AS n (nodename, nodeport, groupid, noderole, nodecluster)
    VALUES (citus_add_secondary_node.nodename, citus_add_secondary_node.nodeport, primary_group, 'secondary', citus_add_secondary_node.nodecluster)
    ON CONFLICT ON CONSTRAINT pg_dist_node_nodename_nodeport_key DO UPDATE SET groupid = excluded.groupid, noderole = 'secondary'
    WHERE n.noderole = 'secondary'
    RETURNING n.nodeid INTO id;
    IF id IS NULL THEN
        RAISE EXCEPTION 'node at "%:%" is a primary', nodename, nodeport USING ERRCODE = '22023';
    END IF;
    -- A former primary made a standby again is no longer fenced.
    DELETE FROM tessera.fenced_nodes f WHERE f.nodename = citus_add_secondary_node.nodename AND f.nodeport = citus_add_secondary_node.nodeport;
    RETURN id;
END $$;
CREATE OR REPLACE FUNCTION pg_catalog.citus_remove_node(nodename text, nodeport int)
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION pg_catalog.master_remove_node(nodename text, nodeport int)
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION pg_catalog.citus_update_node(node_id int, new_node_name text, new_node_port int, force bool DEFAULT false, lock_cooldown int DEFAULT 10000)
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION pg_catalog.master_update_node(node_id int, new_node_name text, new_node_port int, force bool DEFAULT false, lock_cooldown int DEFAULT 10000)
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION pg_catalog.citus_disable_node(nodename text, nodeport int, synchronous bool DEFAULT false)
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION pg_catalog.master_disable_node(nodename text, nodeport int)
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION pg_catalog.citus_activate_node(nodename text, nodeport int)
    RETURNS int LANGUAGE sql AS 'SELECT tessera.coordinator_only(); SELECT 0';
CREATE OR REPLACE FUNCTION pg_catalog.master_activate_node(nodename text, nodeport int)
    RETURNS int LANGUAGE sql AS 'SELECT tessera.coordinator_only(); SELECT 0';
CREATE OR REPLACE FUNCTION pg_catalog.recover_prepared_transactions()
    RETURNS int LANGUAGE sql AS 'SELECT tessera.coordinator_only(); SELECT 0';
CREATE OR REPLACE FUNCTION pg_catalog.citus_create_restore_point(name text)
    RETURNS pg_lsn LANGUAGE sql AS 'SELECT tessera.coordinator_only(); SELECT NULL::pg_lsn';
CREATE OR REPLACE FUNCTION pg_catalog.citus_move_shard_placement(shard_id bigint, source_node_name text, source_node_port int, target_node_name text, target_node_port int, shard_transfer_mode text DEFAULT 'auto')
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION pg_catalog.citus_cleanup_orphaned_resources()
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION pg_catalog.get_rebalance_table_shards_plan(relation regclass DEFAULT NULL, threshold float4 DEFAULT 0, max_shard_moves int DEFAULT 1000000, excluded_shard_list bigint[] DEFAULT '{}', drain_only boolean DEFAULT false, rebalance_strategy name DEFAULT NULL, improvement_threshold float4 DEFAULT NULL)
    RETURNS TABLE (table_name text, shardid bigint, shard_size bigint, sourcename text, sourceport int, targetname text, targetport int) LANGUAGE sql AS 'SELECT tessera.coordinator_only(); SELECT NULL::text, 0::bigint, 0::bigint, NULL::text, 0, NULL::text, 0 WHERE false';
CREATE OR REPLACE FUNCTION pg_catalog.rebalance_table_shards(relation regclass DEFAULT NULL, threshold float4 DEFAULT NULL, max_shard_moves int DEFAULT 1000000, excluded_shard_list bigint[] DEFAULT '{}', shard_transfer_mode text DEFAULT 'auto', drain_only boolean DEFAULT false, rebalance_strategy name DEFAULT NULL)
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION pg_catalog.citus_drain_node(nodename text, nodeport int, shard_transfer_mode text DEFAULT 'auto', rebalance_strategy name DEFAULT NULL)
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION pg_catalog.citus_set_node_property(nodename text, nodeport int, property text, value boolean)
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION pg_catalog.citus_copy_shard_placement(shard_id bigint, source_node_name text, source_node_port int, target_node_name text, target_node_port int, transfer_mode text DEFAULT 'auto')
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION pg_catalog.replicate_reference_tables(shard_transfer_mode text DEFAULT 'auto')
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION pg_catalog.create_time_partitions(table_name regclass, partition_interval interval, end_at timestamptz, start_from timestamptz DEFAULT now())
    RETURNS boolean LANGUAGE sql AS 'SELECT tessera.coordinator_only(); SELECT false';
CREATE OR REPLACE PROCEDURE pg_catalog.drop_old_time_partitions(table_name regclass, older_than timestamptz)
    LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION pg_catalog.citus_rebalance_start(rebalance_strategy name DEFAULT NULL, drain_only boolean DEFAULT false, shard_transfer_mode text DEFAULT 'auto')
    RETURNS bigint LANGUAGE sql AS 'SELECT tessera.coordinator_only(); SELECT 0::bigint';
CREATE OR REPLACE FUNCTION pg_catalog.run_command_on_workers(command text, parallel boolean DEFAULT true, OUT nodename text, OUT nodeport int, OUT success boolean, OUT result text)
    RETURNS SETOF record LANGUAGE sql AS 'SELECT tessera.coordinator_only(); SELECT NULL::text, 0, false, NULL::text WHERE false';
CREATE OR REPLACE FUNCTION pg_catalog.run_command_on_all_nodes(command text, parallel boolean DEFAULT true, give_warning_for_connection_errors boolean DEFAULT false, OUT nodeid int, OUT success boolean, OUT result text)
    RETURNS SETOF record LANGUAGE sql AS 'SELECT tessera.coordinator_only(); SELECT 0, false, NULL::text WHERE false';
CREATE OR REPLACE FUNCTION pg_catalog.run_command_on_shards(table_name regclass, command text, parallel boolean DEFAULT true, OUT shardid bigint, OUT success boolean, OUT result text)
    RETURNS SETOF record LANGUAGE sql AS 'SELECT tessera.coordinator_only(); SELECT 0::bigint, false, NULL::text WHERE false';
CREATE OR REPLACE FUNCTION pg_catalog.run_command_on_placements(table_name regclass, command text, parallel boolean DEFAULT true, OUT nodename text, OUT nodeport int, OUT shardid bigint, OUT success boolean, OUT result text)
    RETURNS SETOF record LANGUAGE sql AS 'SELECT tessera.coordinator_only(); SELECT NULL::text, 0, 0::bigint, false, NULL::text WHERE false';
CREATE OR REPLACE FUNCTION pg_catalog.run_command_on_colocated_placements(table_name1 regclass, table_name2 regclass, command text, parallel boolean DEFAULT true,
                                                                          OUT nodename text, OUT nodeport int, OUT shardid1 bigint, OUT shardid2 bigint, OUT success boolean, OUT result text)
    RETURNS SETOF record LANGUAGE sql AS 'SELECT tessera.coordinator_only(); SELECT NULL::text, 0, 0::bigint, 0::bigint, false, NULL::text WHERE false';

-- The background rebalance's own functions only read and mark the job
-- tables, so the coordinator database runs them like any query; the
-- coordinator process that runs the job notices a stop at its next safe point.
CREATE OR REPLACE FUNCTION pg_catalog.citus_rebalance_status(raw boolean DEFAULT false)
    RETURNS TABLE (job_id bigint, state text, job_type name, description text, started_at timestamptz, finished_at timestamptz, details jsonb)
    LANGUAGE sql STABLE AS $$
    SELECT j.job_id, j.state, j.job_type, j.description, j.started_at, j.finished_at,
           jsonb_build_object(
               'task_state_counts', (SELECT jsonb_object_agg(c.status, c.n) FROM (SELECT t.status, count(*) AS n FROM pg_catalog.pg_dist_background_task t WHERE t.job_id = j.job_id GROUP BY t.status) c),
               'tasks', (SELECT coalesce(jsonb_agg(jsonb_build_object('task_id', t.task_id, 'state', t.status, 'command', t.command, 'message', t.message) ORDER BY t.task_id), '[]')
                           FROM pg_catalog.pg_dist_background_task t WHERE t.job_id = j.job_id AND t.status IN ('running', 'error')))
      FROM pg_catalog.pg_dist_background_job j WHERE j.job_type = 'rebalance' ORDER BY j.job_id DESC LIMIT 1 $$;
CREATE OR REPLACE FUNCTION pg_catalog.citus_rebalance_wait() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    job bigint;
    job_state text;
    failure text;
BEGIN
    SELECT j.job_id INTO job FROM pg_catalog.pg_dist_background_job j WHERE j.job_type = 'rebalance' ORDER BY j.job_id DESC LIMIT 1;
    IF job IS NULL THEN
        RAISE NOTICE 'no ongoing rebalance that can be waited on';
        RETURN;
    END IF;
    LOOP
        SELECT j.state INTO job_state FROM pg_catalog.pg_dist_background_job j WHERE j.job_id = job;
        EXIT WHEN job_state IN ('finished', 'cancelled', 'failed');
        PERFORM pg_sleep(0.1);
    END LOOP;
    IF job_state = 'failed' THEN
        SELECT t.message INTO failure FROM pg_catalog.pg_dist_background_task t WHERE t.job_id = job AND t.status = 'error' ORDER BY t.task_id LIMIT 1;
        RAISE EXCEPTION 'rebalance job % failed: %', job, coalesce(failure, 'see the coordinator log')
            USING ERRCODE = '55000', HINT = 'Run SELECT * FROM citus_rebalance_status() for details; citus_rebalance_start() starts a new rebalance.';
    ELSIF job_state = 'cancelled' THEN
        RAISE NOTICE 'rebalance job % was stopped', job;
    END IF;
END $$;
CREATE OR REPLACE FUNCTION pg_catalog.citus_rebalance_stop() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tessera.pg_dist_background_job SET state = 'cancelling' WHERE job_type = 'rebalance' AND state IN ('scheduled', 'running');
    IF NOT FOUND THEN
        RAISE NOTICE 'no ongoing rebalance that can be stopped';
    END IF;
END $$;

-- Functions that only read and change the catalog's rows run in the
-- coordinator database like any query; the coordinators reload after them.
-- create_distributed_table leaves the shell empty already: this one only
-- checks what Citus's does.
CREATE OR REPLACE FUNCTION pg_catalog.truncate_local_data_after_distributing_table(function_name regclass) RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, tessera AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM tessera.pg_dist_partition WHERE logicalrelid = function_name) THEN
        RAISE EXCEPTION 'supplied parameter is not a distributed relation' USING ERRCODE = '22023',
            HINT = format('Distribute %s first with create_distributed_table or create_reference_table.', function_name);
    END IF;
    PERFORM tessera.check_owner(function_name);
END $$;
-- Moves a table (with its partitions) into another co-location group
-- without moving data: the group of the table named, whose shards must sit
-- on the same nodes index by index, or with 'none' a group of its own.
CREATE OR REPLACE FUNCTION tessera.change_colocation(table_name regclass, colocate_with regclass) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, tessera AS $$
DECLARE
    own tessera.pg_dist_partition;
    own_group tessera.pg_dist_colocation;
    target tessera.pg_dist_partition;
    target_group tessera.pg_dist_colocation;
    new_group int;
BEGIN
    PERFORM tessera.check_owner(table_name);
    SELECT * INTO own FROM tessera.pg_dist_partition WHERE logicalrelid = table_name;
    IF own IS NULL OR own.partmethod <> 'h' THEN
        RAISE EXCEPTION '% is not a hash-distributed table', table_name USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT FROM pg_inherits WHERE inhrelid = table_name) THEN
        RAISE EXCEPTION '% is a partition; change the co-location of its parent', table_name USING ERRCODE = '22023';
    END IF;
    SELECT * INTO own_group FROM tessera.pg_dist_colocation WHERE colocationid = own.colocationid;
    IF colocate_with IS NULL THEN
        IF NOT EXISTS (SELECT FROM tessera.pg_dist_partition p WHERE p.colocationid = own.colocationid AND p.logicalrelid <> table_name
                          AND NOT EXISTS (SELECT FROM pg_inherits i WHERE i.inhrelid = p.logicalrelid AND i.inhparent = table_name)) THEN
            RETURN;
        END IF;
        new_group := tessera.new_colocation(own_group.shardcount, own_group.replicationfactor, own_group.distributioncolumntype, own_group.distributioncolumncollation);
    ELSE
        SELECT * INTO target FROM tessera.pg_dist_partition WHERE logicalrelid = colocate_with;
        IF target IS NULL OR target.partmethod <> 'h' THEN
            RAISE EXCEPTION 'cannot colocate with %: it is not a hash-distributed table', colocate_with USING ERRCODE = '22023';
        END IF;
        SELECT * INTO target_group FROM tessera.pg_dist_colocation WHERE colocationid = target.colocationid;
        IF target_group.shardcount <> own_group.shardcount OR target_group.distributioncolumntype <> own_group.distributioncolumntype THEN
            RAISE EXCEPTION 'cannot colocate tables % and %', table_name, colocate_with USING ERRCODE = '22023',
                DETAIL = format('%s has %s shards of type %s, %s has %s of type %s', table_name, own_group.shardcount, format_type(own_group.distributioncolumntype, NULL),
                                colocate_with, target_group.shardcount, format_type(target_group.distributioncolumntype, NULL)),
                HINT = 'alter_distributed_table(table_name, colocate_with => ...) distributes the table anew in that group.';
        END IF;
        IF EXISTS (SELECT s.shardindex, p.groupid FROM tessera.pg_dist_shard s JOIN tessera.pg_dist_placement p USING (shardid) WHERE s.logicalrelid = table_name
                   EXCEPT SELECT s.shardindex, p.groupid FROM tessera.pg_dist_shard s JOIN tessera.pg_dist_placement p USING (shardid) WHERE s.logicalrelid = target.logicalrelid) THEN
            RAISE EXCEPTION 'cannot colocate tables % and %: their shards are on different nodes', table_name, colocate_with USING ERRCODE = '22023',
                HINT = 'Move the shards to match (citus_move_shard_placement), or distribute the table anew with alter_distributed_table.';
        END IF;
        new_group := target.colocationid;
    END IF;
    UPDATE tessera.pg_dist_partition SET colocationid = new_group
     WHERE logicalrelid = table_name OR logicalrelid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = table_name);
END $$;
-- The table named in the caller's search_path; NULL for 'none'.
CREATE OR REPLACE FUNCTION pg_catalog.update_distributed_table_colocation(table_name regclass, colocate_with text) RETURNS void LANGUAGE sql
AS $$ SELECT tessera.change_colocation(table_name, CASE WHEN lower(colocate_with) = 'none' THEN NULL ELSE colocate_with::regclass END) $$;

-- Read-only catalog functions are ordinary SQL functions: they work anywhere in
-- a query, including in FROM.
CREATE OR REPLACE FUNCTION pg_catalog.master_get_active_worker_nodes(OUT node_name text, OUT node_port bigint)
    RETURNS SETOF record LANGUAGE sql STABLE
    AS 'SELECT nodename, nodeport::bigint FROM pg_catalog.pg_dist_node WHERE isactive AND noderole = ''primary'' ORDER BY nodeid';
CREATE OR REPLACE FUNCTION pg_catalog.citus_get_active_worker_nodes(OUT node_name text, OUT node_port bigint)
    RETURNS SETOF record LANGUAGE sql STABLE AS 'SELECT * FROM pg_catalog.master_get_active_worker_nodes()';
-- The shard of a table that holds a distribution value, found by PostgreSQL's
-- own hash partitioning: satisfies_hash_partition over an empty table
-- partitioned by a key of the column's type (one per type a table can be
-- distributed by: hash::distributable_type_oids fills them in) tells which
-- remainder the value has. The value arrives as text (a literal of unknown
-- type picks this signature) and is cast to the column's type here.
DO $$
DECLARE
    key_type name;
BEGIN
    FOR key_type IN SELECT typname FROM pg_catalog.pg_type WHERE oid IN (@DISTRIBUTABLE_TYPE_OIDS@) LOOP
        EXECUTE format('CREATE TABLE IF NOT EXISTS tessera.%I (key pg_catalog.%I) PARTITION BY HASH (key)', 'hash_probe_' || key_type, key_type);
    END LOOP;
END $$;
CREATE OR REPLACE FUNCTION pg_catalog.get_shard_id_for_distribution_column(table_name regclass, distribution_value text DEFAULT NULL)
    RETURNS bigint LANGUAGE plpgsql STABLE SET search_path = pg_catalog AS $$
DECLARE
    dist record;
    probe regclass;
    remainder int;
BEGIN
    SELECT p.partmethod, a.atttypid AS key_type,
           (SELECT count(*) FROM pg_catalog.pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid) AS shard_count
      INTO dist
      FROM pg_catalog.pg_dist_partition p
      LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = p.logicalrelid AND a.attname = p.partkey AND NOT a.attisdropped
     WHERE p.logicalrelid = table_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'relation % is not distributed', table_name
            USING ERRCODE = 'wrong_object_type', HINT = 'Distribute it with create_distributed_table or create_reference_table first.';
    END IF;
    IF dist.partmethod = 'n' THEN
        RETURN (SELECT shardid FROM pg_catalog.pg_dist_shard WHERE logicalrelid = table_name);
    END IF;
    IF distribution_value IS NULL THEN
        RAISE EXCEPTION 'distribution value cannot be NULL for the hash-distributed table %', table_name
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT c.oid INTO probe
      FROM pg_catalog.pg_type t JOIN pg_catalog.pg_class c
        ON c.relnamespace = 'tessera'::regnamespace AND c.relname = 'hash_probe_' || t.typname
     WHERE t.oid = dist.key_type
        OR t.oid IN (SELECT casttarget FROM pg_catalog.pg_cast WHERE castsource = dist.key_type AND castmethod = 'b')
     ORDER BY t.oid <> dist.key_type
     LIMIT 1;
    EXECUTE format('SELECT r FROM pg_catalog.generate_series(0, $2 - 1) r WHERE pg_catalog.satisfies_hash_partition($1, $2, r, $3::%s)',
                   pg_catalog.format_type(dist.key_type, NULL))
       INTO remainder USING probe, dist.shard_count::int, distribution_value;
    RETURN (SELECT shardid FROM pg_catalog.pg_dist_shard WHERE logicalrelid = table_name AND shardindex = remainder);
END $$;
CREATE OR REPLACE FUNCTION pg_catalog.get_shard_id_for_distribution_column(table_name regclass, distribution_value anyelement)
    RETURNS bigint LANGUAGE sql STABLE
    AS 'SELECT pg_catalog.get_shard_id_for_distribution_column(table_name, distribution_value::text)';
CREATE OR REPLACE FUNCTION pg_catalog.citus_version() RETURNS text LANGUAGE sql STABLE
    AS $$SELECT format('Tessera %s (Citus 12.1 API) on %s', '@TESSERA_VERSION@', substring(pg_catalog.version() from ' on (.*)$'))$$;

-- What only the nodes know. Before a statement that reads citus_stat_activity
-- or calls a size function runs, the coordinator gathers every node's part into
-- temporary tables of the session (see executor/cluster_views.rs); these read
-- them, and say what to do when called on the coordinator database directly.
CREATE TABLE IF NOT EXISTS tessera.cluster_activity AS
    SELECT 0::bigint AS global_pid, 0 AS nodeid, false AS is_worker_query, a.* FROM pg_catalog.pg_stat_activity a WITH NO DATA;
-- The rows the coordinator gathered into the session's temporary table
-- `name` for `view`, typed as `template`.
CREATE OR REPLACE FUNCTION tessera.gathered_rows(template anyelement, name text, view text) RETURNS SETOF anyelement LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF to_regclass(format('pg_temp.%I', name)) IS NULL THEN
        RAISE EXCEPTION '% must be read through the Tessera coordinator, not on the coordinator database directly', view
            USING ERRCODE = '0A000';
    END IF;
    RETURN QUERY EXECUTE format('SELECT * FROM pg_temp.%I', name);
END $$;
CREATE OR REPLACE FUNCTION tessera.gathered_size(relation regclass, kind text) RETURNS bigint LANGUAGE plpgsql STABLE STRICT AS $$
DECLARE
    size bigint;
BEGIN
    IF to_regclass('pg_temp.tessera_shard_sizes') IS NULL THEN
        RAISE EXCEPTION 'citus_%_size() must be called through the Tessera coordinator, not on the coordinator database directly', kind
            USING ERRCODE = '0A000';
    END IF;
    EXECUTE format('SELECT %I FROM pg_temp.tessera_shard_sizes WHERE logicalrelid = $1', kind || '_size') INTO size USING relation;
    IF size IS NULL THEN
        RAISE EXCEPTION 'cannot calculate the size because relation "%" is not distributed', relation
            USING ERRCODE = '42809', HINT = 'Use pg_relation_size(), pg_table_size() or pg_total_relation_size() for a local table.';
    END IF;
    RETURN size;
END $$;
-- PostgreSQL's size functions, called through the coordinator, come here:
-- the shards' size for a distributed table (psql's \dt+, monitoring queries),
-- PostgreSQL's own answer for anything else.
CREATE OR REPLACE FUNCTION tessera.size_of(relation regclass, kind text) RETURNS bigint LANGUAGE plpgsql STABLE STRICT AS $$
BEGIN
    IF to_regclass('pg_temp.tessera_shard_sizes') IS NOT NULL
       AND EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition WHERE logicalrelid = relation) THEN
        IF kind = 'indexes' THEN
            RETURN tessera.gathered_size(relation, 'total') - tessera.gathered_size(relation, 'table');
        END IF;
        RETURN tessera.gathered_size(relation, kind);
    END IF;
    RETURN CASE kind
        WHEN 'relation' THEN pg_catalog.pg_relation_size(relation)
        WHEN 'table' THEN pg_catalog.pg_table_size(relation)
        WHEN 'total' THEN pg_catalog.pg_total_relation_size(relation)
        WHEN 'indexes' THEN pg_catalog.pg_indexes_size(relation)
    END;
END $$;
-- A placement's total size on its node, gathered when citus_shards is read.
CREATE OR REPLACE FUNCTION tessera.gathered_placement_size(shard bigint, node_group int) RETURNS bigint LANGUAGE plpgsql STABLE STRICT AS $$
DECLARE
    size bigint;
BEGIN
    IF to_regclass('pg_temp.tessera_placement_sizes') IS NULL THEN
        RAISE EXCEPTION 'citus_shards must be read through the Tessera coordinator, not on the coordinator database directly'
            USING ERRCODE = '0A000';
    END IF;
    SELECT total_size INTO size FROM pg_temp.tessera_placement_sizes WHERE shardid = shard AND groupid = node_group;
    RETURN size;
END $$;
CREATE OR REPLACE FUNCTION pg_catalog.citus_relation_size(logicalrelid regclass) RETURNS bigint LANGUAGE sql STABLE STRICT
    BEGIN ATOMIC SELECT tessera.gathered_size(logicalrelid, 'relation'); END;
CREATE OR REPLACE FUNCTION pg_catalog.citus_table_size(logicalrelid regclass) RETURNS bigint LANGUAGE sql STABLE STRICT
    BEGIN ATOMIC SELECT tessera.gathered_size(logicalrelid, 'table'); END;
CREATE OR REPLACE FUNCTION pg_catalog.citus_total_relation_size(logicalrelid regclass, fail_on_error boolean DEFAULT true) RETURNS bigint LANGUAGE sql STABLE STRICT
    BEGIN ATOMIC SELECT tessera.gathered_size(logicalrelid, 'total'); END;
-- Citus's columns, table_size among them (gathered from the nodes; earlier
-- versions had none, and a view cannot take a column in the middle).
DO $$
BEGIN
    IF to_regclass('pg_catalog.citus_tables') IS NOT NULL
       AND NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass('pg_catalog.citus_tables') AND attname = 'table_size') THEN
        SET LOCAL allow_system_table_mods = on;
        DROP VIEW pg_catalog.citus_tables;
    END IF;
END $$;
SET allow_system_table_mods = on;
CREATE OR REPLACE VIEW pg_catalog.citus_tables AS
SELECT p.logicalrelid AS table_name,
       CASE p.partmethod WHEN 'h' THEN 'distributed' ELSE 'reference' END AS citus_table_type,
       coalesce(p.partkey, '<none>') AS distribution_column,
       p.colocationid AS colocation_id,
       pg_catalog.pg_size_pretty(tessera.gathered_size(p.logicalrelid, 'total')) AS table_size,
       (SELECT count(*) FROM tessera.pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid) AS shard_count,
       pg_get_userbyid(c.relowner) AS table_owner,
       am.amname AS access_method
FROM tessera.pg_dist_partition p
JOIN pg_class c ON c.oid = p.logicalrelid
LEFT JOIN pg_am am ON am.oid = c.relam;
CREATE OR REPLACE VIEW pg_catalog.citus_shards AS
SELECT p.logicalrelid AS table_name,
       s.shardid,
       format('%s_%s', p.logicalrelid::text, s.shardid) AS shard_name,
       CASE p.partmethod WHEN 'h' THEN 'distributed' ELSE 'reference' END AS citus_table_type,
       p.colocationid AS colocation_id,
       n.nodename,
       n.nodeport,
       tessera.gathered_placement_size(s.shardid, pl.groupid) AS shard_size
FROM tessera.pg_dist_shard s
JOIN tessera.pg_dist_partition p USING (logicalrelid)
JOIN tessera.pg_dist_placement pl USING (shardid)
JOIN tessera.pg_dist_node n ON n.groupid = pl.groupid AND n.noderole = 'primary';
CREATE OR REPLACE VIEW pg_catalog.citus_stat_activity AS
SELECT * FROM tessera.gathered_rows(NULL::tessera.cluster_activity, 'tessera_cluster_activity', 'citus_stat_activity');
RESET allow_system_table_mods;
GRANT SELECT ON pg_catalog.citus_stat_activity, tessera.cluster_activity, pg_catalog.citus_tables, pg_catalog.citus_shards TO PUBLIC;
-- Backends waiting for a lock and each backend they wait for, on every node
-- (pg_blocking_pids), by global pid; the statements come from the activity.
-- Whether each node reaches each node, as the coordinator gathered it.
CREATE TABLE IF NOT EXISTS tessera.node_health (from_nodename text, from_nodeport int, to_nodename text, to_nodeport int, result boolean);
CREATE OR REPLACE FUNCTION pg_catalog.citus_check_cluster_node_health() RETURNS SETOF tessera.node_health LANGUAGE sql STABLE AS
$$ SELECT * FROM tessera.gathered_rows(NULL::tessera.node_health, 'tessera_node_health', 'citus_check_cluster_node_health()') ORDER BY 1, 2, 3, 4 $$;
GRANT SELECT ON tessera.node_health TO PUBLIC;
CREATE TABLE IF NOT EXISTS tessera.cluster_lock_wait (waiting_gpid bigint, blocking_gpid bigint, waiting_nodeid int, blocking_nodeid int);
SET allow_system_table_mods = on;
CREATE OR REPLACE VIEW pg_catalog.citus_lock_waits AS
SELECT w.waiting_gpid, w.blocking_gpid, waiting.query AS blocked_statement, blocking.query AS current_statement_in_blocking_process, w.waiting_nodeid, w.blocking_nodeid
FROM tessera.gathered_rows(NULL::tessera.cluster_lock_wait, 'tessera_cluster_lock_wait', 'citus_lock_waits') w
LEFT JOIN pg_catalog.citus_stat_activity waiting ON waiting.global_pid = w.waiting_gpid
LEFT JOIN pg_catalog.citus_stat_activity blocking ON blocking.global_pid = w.blocking_gpid;
RESET allow_system_table_mods;
GRANT SELECT ON pg_catalog.citus_lock_waits, tessera.cluster_lock_wait TO PUBLIC;

-- What only the coordinator process knows, handed over the same way: its
-- connection pools (one row per node, the coordinator database first) and
-- its client sessions (`tessera status` shows both).
CREATE TABLE IF NOT EXISTS tessera.pool_usage (node text, open_connections int, idle_connections int, max_connections int, blocks int, max_blocks int);
CREATE TABLE IF NOT EXISTS tessera.client_session (session_name text, user_name text, held_connections int, pinned_by text);
CREATE OR REPLACE VIEW tessera.connection_pools AS SELECT * FROM tessera.gathered_rows(NULL::tessera.pool_usage, 'tessera_pool_usage', 'tessera.connection_pools');
CREATE OR REPLACE VIEW tessera.client_sessions AS SELECT * FROM tessera.gathered_rows(NULL::tessera.client_session, 'tessera_client_session', 'tessera.client_sessions');
-- The process's statistics (src/stats): statements by normalised text,
-- tier and partition key; the busiest tenants, with the node their shard
-- is on; event counters. Another role's statement text is shown to
-- superusers and members of pg_read_all_stats only, as pg_stat_statements does.
CREATE TABLE IF NOT EXISTS tessera.stat_statement (queryid bigint, userid oid, dbid oid, query text, executor text, partition_key text,
    calls bigint, total_time double precision, mean_time double precision, rows bigint);
CREATE TABLE IF NOT EXISTS tessera.stat_tenant (colocation_id int, tenant_attribute text, read_count_in_this_period int, read_count_in_last_period int,
    query_count_in_this_period int, query_count_in_last_period int, cpu_usage_in_this_period double precision, cpu_usage_in_last_period double precision);
CREATE TABLE IF NOT EXISTS tessera.stat_counter (database_id oid, name text, connection_establishment_succeeded bigint,
    connection_establishment_failed bigint, connection_reused bigint, query_execution_single_shard bigint, query_execution_multi_shard bigint,
    rows_copied bigint, two_phase_commits bigint, one_phase_commits bigint, prepared_transactions_recovered bigint, fallback_statements bigint,
    stats_reset timestamptz);
SET allow_system_table_mods = on;
CREATE OR REPLACE VIEW pg_catalog.citus_stat_statements AS
SELECT s.queryid, s.userid, s.dbid,
       CASE WHEN pg_catalog.pg_has_role(s.userid, 'USAGE') OR pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE')
            THEN s.query ELSE '<insufficient privilege>' END AS query,
       s.executor, s.partition_key, s.calls, s.total_time, s.mean_time, s.rows
  FROM tessera.gathered_rows(NULL::tessera.stat_statement, 'tessera_stat_statement', 'citus_stat_statements') s;
CREATE OR REPLACE VIEW pg_catalog.citus_stat_tenants AS
SELECT (SELECT n.nodeid FROM pg_catalog.pg_dist_placement pl JOIN pg_catalog.pg_dist_node n ON n.groupid = pl.groupid
         WHERE pl.shardid = pg_catalog.get_shard_id_for_distribution_column(
                   (SELECT p.logicalrelid FROM pg_catalog.pg_dist_partition p WHERE p.colocationid = t.colocation_id ORDER BY p.logicalrelid LIMIT 1),
                   t.tenant_attribute)
         ORDER BY n.nodeid LIMIT 1) AS nodeid,
       t.*
  FROM tessera.gathered_rows(NULL::tessera.stat_tenant, 'tessera_stat_tenant', 'citus_stat_tenants') t;
CREATE OR REPLACE VIEW pg_catalog.citus_stat_counters AS
SELECT * FROM tessera.gathered_rows(NULL::tessera.stat_counter, 'tessera_stat_counter', 'citus_stat_counters');
RESET allow_system_table_mods;
GRANT SELECT ON pg_catalog.citus_stat_statements, pg_catalog.citus_stat_tenants, pg_catalog.citus_stat_counters,
    tessera.stat_statement, tessera.stat_tenant, tessera.stat_counter TO PUBLIC;
CREATE OR REPLACE FUNCTION pg_catalog.citus_stat_statements_reset()
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION pg_catalog.citus_stat_tenants_reset()
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION pg_catalog.citus_stat_counters_reset(database_id oid DEFAULT 0)
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
-- Earlier versions read each kind through a function of its own.
DROP FUNCTION IF EXISTS tessera.gathered_activity(), tessera.process_rows(anyelement, text);
GRANT SELECT ON tessera.connection_pools, tessera.client_sessions, tessera.pool_usage, tessera.client_session TO PUBLIC;

-- pg_dump writes out the privileges of system objects that differ from their
-- initial ones; recording ours as initial keeps them out of users' dumps, which
-- then restore into plain PostgreSQL too.
SET allow_system_table_mods = on;
DELETE FROM pg_catalog.pg_init_privs i USING pg_catalog.pg_class c
 WHERE i.classoid = 'pg_catalog.pg_class'::regclass AND i.objoid = c.oid
   AND c.relnamespace = 'pg_catalog'::regnamespace AND (c.relname LIKE 'pg\_dist\_%' OR c.relname LIKE 'citus\_%' OR c.relname = 'time_partitions');
INSERT INTO pg_catalog.pg_init_privs (objoid, classoid, objsubid, privtype, initprivs)
SELECT c.oid, 'pg_catalog.pg_class'::regclass, 0, 'i', c.relacl FROM pg_catalog.pg_class c
 WHERE c.relnamespace = 'pg_catalog'::regnamespace AND (c.relname LIKE 'pg\_dist\_%' OR c.relname LIKE 'citus\_%' OR c.relname = 'time_partitions') AND c.relacl IS NOT NULL;
RESET allow_system_table_mods;

-- Combines per-shard float8 variance states ({N, Σx, Σ(x − mean)²}) as
-- PostgreSQL combines its parallel workers' (executor/multi_shard.rs).
CREATE OR REPLACE AGGREGATE tessera.float8_combined(float8[]) (SFUNC = pg_catalog.float8_combine, STYPE = float8[], INITCOND = '{0,0,0}');

-- Other roles may look the helpers above up, and run them, but nothing else
-- in the schema: its tables stay unreadable.
GRANT USAGE ON SCHEMA tessera TO PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA tessera FROM PUBLIC;
-- Every role's combining statements use it.
GRANT EXECUTE ON FUNCTION tessera.float8_combined(float8[]) TO PUBLIC;
GRANT EXECUTE ON FUNCTION tessera.check_owner(regclass), tessera.catalog_changed(), tessera.tables_changed(oid[]), tessera.user_code_changed(), tessera.new_colocation(int, int, oid, oid),
    tessera.record_distribution(regclass, "char", text, int, int[]), tessera.forget_distribution(regclass), tessera.rename_distribution_column(regclass, text),
    tessera.follow_colocation(int, int), tessera.change_colocation(regclass, regclass), tessera.coordinator_only(),
    tessera.refuse_shell_write(), tessera.guard_shell(regclass),
    tessera.missing_time_partitions(regclass, interval, timestamptz, timestamptz), tessera.old_time_partitions(regclass, timestamptz),
    tessera.time_partition_sql(regclass, name, name, regtype, text, timestamptz, timestamptz), tessera.gathered_rows(anyelement, text, text), tessera.gathered_size(regclass, text), tessera.gathered_placement_size(bigint, int), tessera.size_of(regclass, text),
    tessera.distribute_function(regprocedure, text, regclass, bool) TO PUBLIC;

-- New or dropped aggregates change how queries split across shards, and
-- views, functions and triggers change which user code reads distributed
-- tables (metadata/user_code.rs); reload.
CREATE OR REPLACE FUNCTION tessera.bump_catalog_version_on_ddl() RETURNS event_trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tessera.user_code_changed();
END $$;
DROP EVENT TRIGGER IF EXISTS tessera_aggregates_changed;
DROP EVENT TRIGGER IF EXISTS tessera_user_code_changed;
CREATE EVENT TRIGGER tessera_user_code_changed ON ddl_command_end
    WHEN TAG IN ('CREATE AGGREGATE', 'ALTER AGGREGATE', 'DROP AGGREGATE',
                 'CREATE VIEW', 'ALTER VIEW', 'DROP VIEW',
                 'CREATE MATERIALIZED VIEW', 'ALTER MATERIALIZED VIEW', 'DROP MATERIALIZED VIEW',
                 'CREATE FUNCTION', 'ALTER FUNCTION', 'DROP FUNCTION',
                 'CREATE PROCEDURE', 'ALTER PROCEDURE', 'DROP PROCEDURE',
                 'CREATE TRIGGER', 'ALTER TRIGGER', 'DROP TRIGGER')
    EXECUTE FUNCTION tessera.bump_catalog_version_on_ddl();

-- DDL that changes what coordinators know of distributed tables without a
-- catalog row changing (columns, names, schemas, keys) records the tables
-- it touched, with the partitions below them, whichever path ran it; a
-- type's change (its name, an enum's values) calls for reading everything.
-- A detached partition is no longer below its parent here: the coordinator
-- names it itself (commands/mod.rs).
CREATE OR REPLACE FUNCTION tessera.record_ddl_tables() RETURNS event_trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, tessera AS $$
DECLARE
    touched oid[] := '{}';
    command record;
BEGIN
    FOR command IN SELECT classid, objid FROM pg_event_trigger_ddl_commands() LOOP
        IF command.classid = 'pg_type'::regclass THEN
            PERFORM tessera.catalog_changed();
            RETURN;
        ELSIF command.classid = 'pg_namespace'::regclass THEN
            touched := touched || ARRAY(SELECT c.oid FROM pg_class c WHERE c.relnamespace = command.objid);
        ELSIF command.classid = 'pg_class'::regclass THEN
            touched := touched || command.objid;
        END IF;
    END LOOP;
    SELECT array_agg(DISTINCT p.logicalrelid::oid) INTO touched
    FROM (WITH RECURSIVE down(relid) AS (SELECT unnest(touched) UNION SELECT i.inhrelid FROM pg_inherits i JOIN down ON i.inhparent = down.relid)
          SELECT relid FROM down) d
    JOIN tessera.pg_dist_partition p ON p.logicalrelid::oid = d.relid;
    IF touched IS NOT NULL THEN
        PERFORM tessera.tables_changed(touched);
    END IF;
END $$;
DROP EVENT TRIGGER IF EXISTS tessera_tables_altered;
CREATE EVENT TRIGGER tessera_tables_altered ON ddl_command_end
    WHEN TAG IN ('ALTER TABLE', 'ALTER SCHEMA', 'ALTER TYPE', 'ALTER DOMAIN')
    EXECUTE FUNCTION tessera.record_ddl_tables();

-- Distributed tables dropped with their catalog rows left behind (DROP
-- SCHEMA … CASCADE, DROP OWNED): coordinators forget them.
CREATE OR REPLACE FUNCTION tessera.record_dropped_tables() RETURNS event_trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, tessera AS $$
DECLARE
    dropped oid[];
BEGIN
    SELECT array_agg(d.objid) INTO dropped FROM pg_event_trigger_dropped_objects() d
    WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0 AND EXISTS (SELECT FROM tessera.pg_dist_partition p WHERE p.logicalrelid::oid = d.objid);
    IF dropped IS NOT NULL THEN
        PERFORM tessera.tables_changed(dropped);
    END IF;
END $$;
DROP EVENT TRIGGER IF EXISTS tessera_tables_dropped;
CREATE EVENT TRIGGER tessera_tables_dropped ON sql_drop
    EXECUTE FUNCTION tessera.record_dropped_tables();

-- A view's query with every relation qualified by its schema, whatever the
-- caller's search_path, so that the coordinator can expand it into the
-- queries that read the view. NULL for a view dropped since the caller's
-- snapshot was taken (the catalog is read in one snapshot; the view's
-- definition is looked up as it is now).
CREATE OR REPLACE FUNCTION pg_catalog.tessera_view_definition(view oid) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog AS $$
BEGIN
    RETURN pg_catalog.pg_get_viewdef(view);
EXCEPTION WHEN OTHERS THEN
    RETURN NULL;
END $$;

-- The general fallback tier. Queries the shards cannot answer on their own run
-- here, in the coordinator database, against one hash-partitioned table per
-- distributed table whose partitions are postgres_fdw foreign tables over the
-- shards (and one foreign table per reference table). The objects live in the
-- schema tessera_fallback and are rebuilt from the catalog whenever a
-- coordinator finds them older than its catalog snapshot.
CREATE EXTENSION IF NOT EXISTS postgres_fdw SCHEMA tessera;
CREATE SCHEMA IF NOT EXISTS tessera_fallback;
GRANT USAGE ON SCHEMA tessera_fallback TO PUBLIC;
CREATE TABLE IF NOT EXISTS tessera.fallback_state (version bigint NOT NULL);
INSERT INTO tessera.fallback_state SELECT 0 WHERE NOT EXISTS (SELECT FROM tessera.fallback_state);

-- Column definitions of a table, for CREATE TABLE (LIKE cannot make a foreign table).
CREATE OR REPLACE FUNCTION tessera.column_definitions(rel regclass) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT string_agg(format('%I %s%s', a.attname, format_type(a.atttypid, a.atttypmod),
                             CASE WHEN a.attcollation <> t.typcollation THEN ' COLLATE ' || a.attcollation::regcollation::text ELSE '' END),
                      ', ' ORDER BY a.attnum)
    FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
    WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped
$$;

-- Gives `role` a user mapping on every node's foreign server that lacks one
-- (or lacks the certificate it logs in with, `tessera.link_security`), so
-- that foreign scans run as that role reach the workers as that role.
CREATE OR REPLACE FUNCTION tessera.map_role_to_nodes(role name, password text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, tessera AS $$
DECLARE
    s record;
    options text;
BEGIN
    SELECT string_agg(format('%I %L', l.option, l.value), ', ') INTO options FROM tessera.link_security(role) l WHERE l.option IN ('sslcert', 'sslkey');
    FOR s IN SELECT f.srvname, m.umid IS NOT NULL AS mapped FROM pg_foreign_server f
             LEFT JOIN pg_user_mappings m ON m.srvid = f.oid AND m.usename = role
             WHERE f.srvname LIKE 'tessera\_node\_%'
               AND (m.umid IS NULL OR (options IS NOT NULL AND NOT EXISTS (SELECT FROM unnest(m.umoptions) o WHERE o LIKE 'sslcert=%'))) LOOP
        IF s.mapped THEN
            EXECUTE format('DROP USER MAPPING FOR %I SERVER %I', role, s.srvname);
        END IF;
        IF password IS NULL THEN
            EXECUTE format('CREATE USER MAPPING FOR %I SERVER %I OPTIONS (user %L, password_required ''false''%s)', role, s.srvname, role, coalesce(', ' || options, ''));
        ELSE
            EXECUTE format('CREATE USER MAPPING FOR %I SERVER %I OPTIONS (user %L, password %L%s)', role, s.srvname, role, password, coalesce(', ' || options, ''));
        END IF;
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION tessera.map_role_to_nodes(name, text) FROM PUBLIC;

-- Which stand-in each distributed table has: what it was made from (the
-- table's name, columns, distribution and shards with their placements),
-- as a signature. A stand-in is made again only when its table's changed.
CREATE TABLE IF NOT EXISTS tessera.fallback_tables (relid oid PRIMARY KEY, signature text NOT NULL);

CREATE OR REPLACE FUNCTION tessera.fallback_signatures() RETURNS TABLE (relid oid, signature text)
LANGUAGE sql STABLE SET search_path = pg_catalog, tessera AS $$
    SELECT p.logicalrelid::oid,
           md5(concat_ws('|', ns.nspname, c.relname, p.partmethod, p.partkey, tessera.column_definitions(p.logicalrelid),
                         (SELECT string_agg(format('%s:%s:%s', s.shardid, s.shardindex, s.groupid), ',' ORDER BY s.shardindex)
                          FROM (SELECT sh.shardid, sh.shardindex, min(pl.groupid) AS groupid FROM tessera.pg_dist_shard sh JOIN tessera.pg_dist_placement pl USING (shardid)
                                WHERE sh.logicalrelid = p.logicalrelid GROUP BY sh.shardid, sh.shardindex) s)))
    FROM tessera.pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid JOIN pg_namespace ns ON ns.oid = c.relnamespace
$$;

-- Drops the stand-in of table `relid` (a foreign table for a reference
-- table, a partitioned one otherwise), if there is one.
CREATE OR REPLACE FUNCTION tessera.drop_stand_in(relid oid) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, tessera AS $$
DECLARE
    stand_in regclass := to_regclass(format('tessera_fallback.%I', 'dist_' || relid));
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = stand_in) = 'f' THEN
        EXECUTE format('DROP FOREIGN TABLE %s CASCADE', stand_in);
    ELSIF stand_in IS NOT NULL THEN
        EXECUTE format('DROP TABLE %s CASCADE', stand_in);
    END IF;
END $$;

-- Brings the fallback objects up to the current catalog (unless another
-- coordinator already did) and gives `role` a user mapping on every node, so
-- that the foreign tables reach the workers as that role, like the
-- coordinator's own worker connections do. Only the stand-ins of tables
-- that changed are made again: rebuilding every one took seconds once
-- hundreds of tables existed, after each change of any.
CREATE OR REPLACE FUNCTION tessera.prepare_fallback(role name, password text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, tessera AS $$
DECLARE
    current bigint;
    n record;
    t record;
    s record;
    server text;
BEGIN
    PERFORM pg_advisory_xact_lock(7482911);
    SELECT tables_version INTO current FROM tessera.catalog_version;
    IF current > (SELECT version FROM tessera.fallback_state) THEN
        FOR n IN SELECT DISTINCT ON (groupid) groupid, nodename, nodeport FROM tessera.pg_dist_node WHERE noderole = 'primary' ORDER BY groupid, nodeid LOOP
            server := 'tessera_node_' || n.groupid;
            -- Not async_capable: PostgreSQL 15's asynchronous Append over
            -- postgres_fdw now and then fails a correlated subquery with
            -- "epoll_ctl() failed: File exists" when the machine is loaded.
            IF EXISTS (SELECT FROM pg_foreign_server WHERE srvname = server) THEN
                EXECUTE format('ALTER SERVER %I OPTIONS (SET host %L, SET port %L)', server, n.nodename, n.nodeport::text);
                IF EXISTS (SELECT FROM pg_foreign_server WHERE srvname = server AND 'async_capable=true' = ANY (srvoptions)) THEN
                    EXECUTE format('ALTER SERVER %I OPTIONS (DROP async_capable)', server);
                END IF;
            ELSE
                EXECUTE format('CREATE SERVER %I FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host %L, port %L, dbname %L, fetch_size ''10000'')',
                               server, n.nodename, n.nodeport::text, current_database());
            END IF;
        END LOOP;
        FOR s IN SELECT srvname FROM pg_foreign_server
                 WHERE srvname LIKE 'tessera\_node\_%' AND substr(srvname, 14) NOT IN (SELECT groupid::text FROM tessera.pg_dist_node) LOOP
            -- Takes the foreign tables over that node's shards along.
            EXECUTE format('DROP SERVER %I CASCADE', s.srvname);
            TRUNCATE tessera.fallback_tables;
        END LOOP;
        PERFORM tessera.secure_servers();
        FOR t IN SELECT f.relid FROM tessera.fallback_tables f LEFT JOIN tessera.fallback_signatures() now USING (relid)
                 WHERE now.signature IS DISTINCT FROM f.signature LOOP
            PERFORM tessera.drop_stand_in(t.relid);
            DELETE FROM tessera.fallback_tables WHERE relid = t.relid;
        END LOOP;
        FOR t IN SELECT p.logicalrelid::oid AS relid, p.partmethod, p.partkey, c.relname, ns.nspname, now.signature,
                        (SELECT count(*) FROM tessera.pg_dist_shard x WHERE x.logicalrelid = p.logicalrelid) AS shards
                 FROM tessera.pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid JOIN pg_namespace ns ON ns.oid = c.relnamespace
                 JOIN tessera.fallback_signatures() now ON now.relid = p.logicalrelid
                 WHERE p.logicalrelid NOT IN (SELECT relid FROM tessera.fallback_tables) LOOP
            -- One left from before the signatures were kept.
            PERFORM tessera.drop_stand_in(t.relid);
            IF t.partmethod = 'h' THEN
                EXECUTE format('CREATE TABLE tessera_fallback.%I (%s) PARTITION BY HASH (%I)', 'dist_' || t.relid, tessera.column_definitions(t.relid::regclass), t.partkey);
                FOR s IN SELECT sh.shardid, sh.shardindex, min(pl.groupid) AS groupid FROM tessera.pg_dist_shard sh JOIN tessera.pg_dist_placement pl USING (shardid)
                         WHERE sh.logicalrelid = t.relid::regclass GROUP BY sh.shardid, sh.shardindex LOOP
                    EXECUTE format('CREATE FOREIGN TABLE tessera_fallback.%I PARTITION OF tessera_fallback.%I FOR VALUES WITH (MODULUS %s, REMAINDER %s) SERVER %I OPTIONS (schema_name %L, table_name %L)',
                                   'dist_' || t.relid || '_' || s.shardindex, 'dist_' || t.relid, t.shards, s.shardindex, 'tessera_node_' || s.groupid, t.nspname, t.relname || '_' || s.shardid);
                END LOOP;
            ELSE
                SELECT sh.shardid, min(pl.groupid) AS groupid INTO s FROM tessera.pg_dist_shard sh JOIN tessera.pg_dist_placement pl USING (shardid)
                WHERE sh.logicalrelid = t.relid::regclass GROUP BY sh.shardid;
                EXECUTE format('CREATE FOREIGN TABLE tessera_fallback.%I (%s) SERVER %I OPTIONS (schema_name %L, table_name %L)',
                               'dist_' || t.relid, tessera.column_definitions(t.relid::regclass), 'tessera_node_' || s.groupid, t.nspname, t.relname || '_' || s.shardid);
            END IF;
            EXECUTE format('GRANT SELECT ON tessera_fallback.%I TO PUBLIC', 'dist_' || t.relid);
            INSERT INTO tessera.fallback_tables VALUES (t.relid, t.signature);
        END LOOP;
        UPDATE tessera.fallback_state SET version = current;
    END IF;
    PERFORM tessera.map_role_to_nodes(role, password);
END $$;
REVOKE ALL ON FUNCTION tessera.prepare_fallback(name, text), tessera.fallback_signatures(), tessera.drop_stand_in(oid) FROM PUBLIC;

-- Settings that let the fallback push work to the shards: joins and aggregates
-- split per partition, and foreign scans of all shards started at once.
DO $$
BEGIN
    EXECUTE format('ALTER DATABASE %I SET enable_partitionwise_join = on', current_database());
    EXECUTE format('ALTER DATABASE %I SET enable_partitionwise_aggregate = on', current_database());
END $$;

-- Materialized views over distributed tables (planner/materialized_views.rs)
-- keep the user's definition, which names the shells. While one statement
-- runs such a view's query, each shell it reads lends it the shards' rows as
-- foreign-table children in tessera_lent, which PostgreSQL scans with the
-- shell; they are dropped again in the same transaction. A deferred check
-- makes sure no lent child outlives its transaction, whoever called.
CREATE SCHEMA IF NOT EXISTS tessera_lent;
CREATE TABLE IF NOT EXISTS tessera.lendings (backend int NOT NULL);

CREATE OR REPLACE FUNCTION tessera.check_shards_returned() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
    IF EXISTS (SELECT FROM pg_class WHERE relnamespace = 'tessera_lent'::regnamespace) THEN
        RAISE EXCEPTION 'shards lent to a materialized view''s query were not returned before commit'
            USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'Call tessera.return_shards() in the transaction that called tessera.lend_shards().';
    END IF;
    RETURN NULL;
END $$;
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgname = 'shards_returned' AND tgrelid = 'tessera.lendings'::regclass) THEN
        CREATE CONSTRAINT TRIGGER shards_returned AFTER INSERT ON tessera.lendings
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION tessera.check_shards_returned();
    END IF;
END $$;

-- Lends the shards of the distributed tables `shells` to this transaction;
-- `reader` is the role the view's query runs as, whose user mapping the
-- foreign scans use (the workers check its privileges on the shards).
CREATE OR REPLACE FUNCTION tessera.lend_shards(shells oid[], reader name) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, tessera AS $$
DECLARE
    t record;
    s record;
BEGIN
    -- postgres_fdw logs in to the workers as the reader itself.
    IF NOT (SELECT rolcanlogin OR rolsuper FROM pg_roles WHERE rolname = reader) THEN
        RAISE EXCEPTION 'the role "%", which this materialized view''s query runs as, cannot log in; the workers check its privileges over a connection of its own', reader
            USING ERRCODE = 'feature_not_supported', HINT = 'Give the role LOGIN, or make a role that can log in own the materialized view.';
    END IF;
    PERFORM tessera.map_role_to_nodes(reader, NULL);
    INSERT INTO tessera.lendings VALUES (pg_backend_pid());
    FOR t IN SELECT p.logicalrelid::oid AS relid, c.relname, ns.nspname
             FROM tessera.pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid JOIN pg_namespace ns ON ns.oid = c.relnamespace
             WHERE p.logicalrelid::oid = ANY (shells) LOOP
        FOR s IN SELECT sh.shardid, min(pl.groupid) AS groupid FROM tessera.pg_dist_shard sh JOIN tessera.pg_dist_placement pl USING (shardid)
                 WHERE sh.logicalrelid = t.relid::regclass GROUP BY sh.shardid LOOP
            EXECUTE format('CREATE FOREIGN TABLE tessera_lent.%I () INHERITS (%s) SERVER %I OPTIONS (schema_name %L, table_name %L)',
                           'shard_' || s.shardid, t.relid::regclass, 'tessera_node_' || s.groupid, t.nspname, t.relname || '_' || s.shardid);
        END LOOP;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION tessera.return_shards() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, tessera AS $$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT relname FROM pg_class WHERE relnamespace = 'tessera_lent'::regnamespace AND relkind = 'f' LOOP
        EXECUTE format('DROP FOREIGN TABLE tessera_lent.%I', c.relname);
    END LOOP;
    DELETE FROM tessera.lendings WHERE backend = pg_backend_pid();
END $$;
GRANT EXECUTE ON FUNCTION tessera.lend_shards(oid[], name), tessera.return_shards() TO PUBLIC;
