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

CREATE TABLE IF NOT EXISTS tessera.pg_dist_transaction (
    groupid int NOT NULL,
    gid text NOT NULL,
    PRIMARY KEY (groupid, gid)
);

-- Bumped by trigger on every catalog change; coordinator processes LISTEN for it
-- and reload their in-memory snapshot.
CREATE TABLE IF NOT EXISTS tessera.catalog_version (version bigint NOT NULL);
INSERT INTO tessera.catalog_version SELECT 1 WHERE NOT EXISTS (SELECT FROM tessera.catalog_version);

CREATE OR REPLACE FUNCTION tessera.bump_catalog_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tessera.catalog_version SET version = version + 1;
    PERFORM pg_notify('tessera_catalog', '');
    RETURN NULL;
END $$;

DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['pg_dist_node', 'pg_dist_colocation', 'pg_dist_partition', 'pg_dist_shard', 'pg_dist_placement'] LOOP
        IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgname = t || '_changed') THEN
            EXECUTE format('CREATE TRIGGER %I AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON tessera.%I FOR EACH STATEMENT EXECUTE FUNCTION tessera.bump_catalog_version()', t || '_changed', t);
        END IF;
    END LOOP;
END $$;

CREATE OR REPLACE VIEW tessera.citus_shards AS
SELECT p.logicalrelid AS table_name,
       s.shardid,
       format('%s_%s', p.logicalrelid::text, s.shardid) AS shard_name,
       CASE p.partmethod WHEN 'h' THEN 'distributed' ELSE 'reference' END AS citus_table_type,
       p.colocationid AS colocation_id,
       n.nodename,
       n.nodeport,
       pl.shardlength AS shard_size
FROM tessera.pg_dist_shard s
JOIN tessera.pg_dist_partition p USING (logicalrelid)
JOIN tessera.pg_dist_placement pl USING (shardid)
JOIN tessera.pg_dist_node n ON n.groupid = pl.groupid;

CREATE OR REPLACE VIEW tessera.citus_tables AS
SELECT p.logicalrelid AS table_name,
       CASE p.partmethod WHEN 'h' THEN 'distributed' ELSE 'reference' END AS citus_table_type,
       coalesce(p.partkey, '<none>') AS distribution_column,
       p.colocationid AS colocation_id,
       (SELECT count(*) FROM tessera.pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid) AS shard_count,
       pg_get_userbyid(c.relowner) AS table_owner
FROM tessera.pg_dist_partition p
JOIN pg_class c ON c.oid = p.logicalrelid;

-- The cluster functions are carried out by the coordinator process, which
-- intercepts calls to them. These definitions make them visible to \df and give a
-- clear error when someone calls them on the coordinator database directly.
CREATE OR REPLACE FUNCTION tessera.coordinator_only() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'this function must be called through the Tessera coordinator, not on the coordinator database directly'
        USING ERRCODE = '0A000';
END $$;
CREATE OR REPLACE FUNCTION tessera.create_distributed_table(table_name regclass, distribution_column text, distribution_type text DEFAULT 'hash', colocate_with text DEFAULT 'default', shard_count int DEFAULT NULL)
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION tessera.create_reference_table(table_name regclass)
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION tessera.undistribute_table(table_name regclass, cascade_via_foreign_keys boolean DEFAULT false)
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION tessera.citus_add_node(nodename text, nodeport int DEFAULT 5432, groupid int DEFAULT -1, noderole text DEFAULT 'primary', nodecluster name DEFAULT 'default')
    RETURNS int LANGUAGE sql AS 'SELECT tessera.coordinator_only(); SELECT 0';
CREATE OR REPLACE FUNCTION tessera.master_add_node(nodename text, nodeport int DEFAULT 5432, groupid int DEFAULT -1, noderole text DEFAULT 'primary', nodecluster name DEFAULT 'default')
    RETURNS int LANGUAGE sql AS 'SELECT tessera.coordinator_only(); SELECT 0';
CREATE OR REPLACE FUNCTION tessera.citus_remove_node(nodename text, nodeport int)
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION tessera.master_remove_node(nodename text, nodeport int)
    RETURNS void LANGUAGE sql AS 'SELECT tessera.coordinator_only()';
CREATE OR REPLACE FUNCTION tessera.recover_prepared_transactions()
    RETURNS int LANGUAGE sql AS 'SELECT tessera.coordinator_only(); SELECT 0';

-- Read-only catalog functions are ordinary SQL functions: they work anywhere in
-- a query, including in FROM.
CREATE OR REPLACE FUNCTION tessera.master_get_active_worker_nodes(OUT node_name text, OUT node_port bigint)
    RETURNS SETOF record LANGUAGE sql STABLE
    AS 'SELECT nodename, nodeport::bigint FROM tessera.pg_dist_node WHERE isactive AND noderole = ''primary'' ORDER BY nodeid';
CREATE OR REPLACE FUNCTION tessera.citus_get_active_worker_nodes(OUT node_name text, OUT node_port bigint)
    RETURNS SETOF record LANGUAGE sql STABLE AS 'SELECT * FROM tessera.master_get_active_worker_nodes()';

-- New or dropped aggregates change how queries split across shards; reload.
CREATE OR REPLACE FUNCTION tessera.bump_catalog_version_on_ddl() RETURNS event_trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tessera.catalog_version SET version = version + 1;
    PERFORM pg_notify('tessera_catalog', '');
END $$;
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_event_trigger WHERE evtname = 'tessera_aggregates_changed') THEN
        CREATE EVENT TRIGGER tessera_aggregates_changed ON ddl_command_end
            WHEN TAG IN ('CREATE AGGREGATE', 'ALTER AGGREGATE', 'DROP AGGREGATE')
            EXECUTE FUNCTION tessera.bump_catalog_version_on_ddl();
    END IF;
END $$;
