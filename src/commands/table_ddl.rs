//! Reads a table's definition from the coordinator database and writes the DDL
//! that creates one of its shards on a worker: columns, defaults, constraints and
//! indexes, with every object name given the shard id as suffix.

use crate::connection::{quote_ident, PgConnection, QUALIFIED_NAMES};
use crate::error::{PgError, PgResult};
use pg_query::NodeEnum;

/// The parts of a table definition that each shard repeats.
pub struct TableDefinition {
    pub schema: String,
    columns: Vec<String>,
    /// `PARTITION BY …` of a partitioned table.
    partition_key: Option<String>,
    /// `FOR VALUES …` of a partition: its shards are partitions of the
    /// parent's shards, from which they take their columns, constraints
    /// and indexes.
    partition_bound: Option<String>,
    /// (constraint name, definition) for primary key, unique and check constraints.
    constraints: Vec<(String, String)>,
    /// CREATE INDEX statements for indexes that back no constraint.
    indexes: Vec<String>,
}

impl TableDefinition {
    /// Reads the definition of table `oid` with every name in it qualified
    /// (`QUALIFIED_NAMES`), so that it means on a worker what it means in
    /// the coordinator database, whatever the session's search_path.
    pub async fn read(conn: &mut PgConnection, oid: u32) -> PgResult<Self> {
        let saved = conn.set_for_now(&QUALIFIED_NAMES).await?;
        let definition = Self::read_as_set(conn, oid).await;
        conn.restore_after(saved, definition).await
    }

    async fn read_as_set(conn: &mut PgConnection, oid: u32) -> PgResult<Self> {
        let rows = conn
            .query(&format!(
                "SELECT n.nspname, CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) END, CASE WHEN c.relispartition THEN pg_get_expr(c.relpartbound, c.oid) END
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = {oid}"
            ))
            .await?;
        let [schema, partition_key, partition_bound] =
            <[Option<String>; 3]>::try_from(rows.into_iter().next().ok_or_else(|| PgError::internal(format!("table {oid} vanished")))?)
                .map_err(|_| PgError::internal("unexpected row shape"))?;
        let schema = schema.unwrap_or_default();
        let mut columns = Vec::new();
        for r in conn
            .query(&format!(
                "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                        pg_get_expr(d.adbin, d.adrelid),
                        CASE WHEN a.attcollation <> t.typcollation THEN a.attcollation::regcollation::text END,
                        a.attgenerated
                 FROM pg_attribute a
                 JOIN pg_type t ON t.oid = a.atttypid
                 LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                 WHERE a.attrelid = {oid} AND a.attnum > 0 AND NOT a.attisdropped
                 ORDER BY a.attnum"
            ))
            .await?
        {
            let name = r[0].clone().unwrap_or_default();
            let mut col = format!("{} {}", quote_ident(&name), r[1].as_deref().unwrap_or("text"));
            if let Some(coll) = &r[4] {
                col.push_str(&format!(" COLLATE {coll}"));
            }
            if let Some(default) = &r[3] {
                if r[5].as_deref() == Some("s") {
                    col.push_str(&format!(" GENERATED ALWAYS AS ({default}) STORED"));
                } else if !default.contains("nextval(") {
                    // Sequences live on the coordinator, which fills such values in.
                    col.push_str(&format!(" DEFAULT {default}"));
                }
            }
            if r[2].as_deref() == Some("t") {
                col.push_str(" NOT NULL");
            }
            columns.push(col);
        }
        // A partition's own, not those it takes from its parent.
        let constraints = conn
            .query(&format!(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
                 WHERE conrelid = {oid} AND contype IN ('p', 'u', 'c') AND conparentid = 0 AND coninhcount = 0 ORDER BY contype DESC, conname"
            ))
            .await?
            .into_iter()
            .map(|r| (r[0].clone().unwrap_or_default(), r[1].clone().unwrap_or_default()))
            .collect();
        let indexes = conn
            .query(&format!(
                "SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i
                 WHERE i.indrelid = {oid} AND NOT EXISTS (SELECT FROM pg_constraint c WHERE c.conindid = i.indexrelid)
                   AND NOT EXISTS (SELECT FROM pg_inherits h WHERE h.inhrelid = i.indexrelid)
                 ORDER BY i.indexrelid"
            ))
            .await?
            .into_iter()
            .filter_map(|r| r[0].clone())
            .collect();
        Ok(TableDefinition { schema, columns, partition_key, partition_bound, constraints, indexes })
    }

    /// Column definitions as the shards have them (defaults drawing from
    /// sequences left to the coordinator).
    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// Statements creating the shard `relname` (in the table's schema); for
    /// a partition, as a partition of `parent_shard` (its parent's shard of
    /// the same index, schema-qualified).
    pub fn shard_ddl(&self, relname: &str, shard_id: i64, parent_shard: Option<&str>) -> PgResult<Vec<String>> {
        let qualified = format!("{}.{}", quote_ident(&self.schema), quote_ident(relname));
        let constraint = |name: &str, def: &str| format!("CONSTRAINT {} {def}", quote_ident(&format!("{name}_{shard_id}")));
        // A table's constraints are made with it, which costs a worker less
        // than adding each after; one NOT VALID is added after (CREATE TABLE
        // would take it as valid), as are a partition's own.
        let partition_of = parent_shard.zip(self.partition_bound.as_ref());
        let made_after = |(_, def): &&(String, String)| partition_of.is_some() || def.ends_with("NOT VALID");
        let mut create = match partition_of {
            Some((parent, bound)) => format!("CREATE TABLE {qualified} PARTITION OF {parent} {bound}"),
            None => {
                let inline = self.constraints.iter().filter(|c| !made_after(c)).map(|(name, def)| constraint(name, def));
                format!("CREATE TABLE {qualified} ({})", self.columns.iter().cloned().chain(inline).collect::<Vec<_>>().join(", "))
            }
        };
        if let Some(key) = &self.partition_key {
            create.push_str(&format!(" PARTITION BY {key}"));
        }
        let mut out = vec![create];
        for (name, def) in self.constraints.iter().filter(made_after) {
            out.push(format!("ALTER TABLE {qualified} ADD {}", constraint(name, def)));
        }
        for index in &self.indexes {
            out.push(rewrite_index(index, &self.schema, relname, shard_id)?);
        }
        Ok(out)
    }
}

/// Points a CREATE INDEX statement at a shard and suffixes the index name.
fn rewrite_index(sql: &str, schema: &str, relname: &str, shard_id: i64) -> PgResult<String> {
    let mut parsed = pg_query::parse(sql).map_err(|e| PgError::internal(format!("could not parse index definition: {e}")))?.protobuf;
    if let Some(NodeEnum::IndexStmt(ix)) = parsed.stmts.first_mut().and_then(|s| s.stmt.as_mut()).and_then(|n| n.node.as_mut()) {
        ix.idxname = format!("{}_{shard_id}", ix.idxname);
        if let Some(rel) = ix.relation.as_mut() {
            rel.relname = relname.to_string();
            rel.schemaname = schema.to_string();
        }
    }
    crate::planner::deparse::deparse_faithfully(&parsed)
}
