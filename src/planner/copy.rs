//! COPY of distributed and reference tables. `COPY t FROM STDIN` streams the
//! client's rows to the shards, split by the distribution column (to every
//! placement, for a reference table); `COPY t TO STDOUT` streams every shard's
//! rows back. `COPY (query) TO STDOUT` over distributed tables runs in the
//! general fallback, which can answer any query. Files and programs on the
//! server are refused: the shards live on other machines.

use super::deparse::deparse_statement as deparse;
use super::fallback::{self, FallbackPlan};
use super::rewrite::name_shard;
use super::walk::range_vars;
use super::{resolve_range_var, Plan};
use crate::copy::{CopyFormat, Format, KeyField};
use crate::error::PgError;
use crate::metadata::{Catalog, DistributedTable, Distribution};
use pg_query::protobuf::{self, Node};
use pg_query::NodeEnum;
use std::fmt;
use std::sync::Arc;

/// Where each row of a COPY FROM goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyPosition {
    /// A reference table: every row to every placement.
    Everywhere,
    /// The distribution column's field in each row.
    Field(KeyField),
    /// The column list leaves the distribution column out. An error, raised
    /// once PostgreSQL has checked the statement otherwise, so that an unknown
    /// column is reported as such.
    Missing,
}

#[derive(Debug)]
pub struct CopyPlan {
    pub table: Arc<DistributedTable>,
    /// COPY FROM STDIN; otherwise COPY TO STDOUT.
    pub from_client: bool,
    pub format: CopyFormat,
    pub key: KeyPosition,
    /// Fields in each row: the length of the column list.
    pub fields: usize,
    /// The client's statement for the table's empty shell in the coordinator
    /// database. Run first, it has PostgreSQL check the columns, options and
    /// privileges and describe the data. (Without HEADER for COPY FROM: with
    /// no data there is no header line to check; each shard checks it.)
    pub shell_sql: String,
    /// The statement for each shard, by shard index.
    pub shard_sql: Vec<String>,
    /// Defaults the coordinator evaluates for the serial and identity columns
    /// the column list leaves out (the shards have no sequences): their
    /// values follow each row's own fields, as the shard statements list them.
    pub fills: Vec<String>,
}

impl fmt::Display for CopyPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let direction = if self.from_client { "from client into" } else { "to client from" };
        write!(f, "{direction} {} ({} shards, {:?})", self.table.name, self.shard_sql.len(), self.format.format)
    }
}

/// Plans a COPY that involves distributed tables; None for other COPYs.
pub(super) fn plan(version: i32, stmt: &protobuf::CopyStmt, text: &str, catalog: &Catalog) -> Option<Plan> {
    let Some(table) = stmt.relation.as_ref().and_then(|rv| resolve_range_var(rv, catalog)) else {
        return plan_query(version, stmt, catalog);
    };
    if stmt.is_program || !stmt.filename.is_empty() {
        return Some(refuse_server_file(stmt.is_from));
    }
    let format = read_format(&stmt.options);
    let columns: Vec<String> = if stmt.attlist.is_empty() { table.copy_columns.clone() } else { names(&stmt.attlist) };
    let filled: Vec<&(String, String)> =
        if stmt.is_from { table.sequence_columns.iter().filter(|(name, _)| !columns.contains(name)).collect() } else { Vec::new() };
    let all_columns: Vec<&String> = columns.iter().chain(filled.iter().map(|(name, _)| name)).collect();
    let key = match &table.distribution {
        Distribution::Reference => KeyPosition::Everywhere,
        Distribution::Hash { column, .. } => match all_columns.iter().position(|c| *c == column) {
            Some(index) => KeyPosition::Field(KeyField {
                index,
                force_null: names_option(&stmt.options, "force_null", column),
                force_not_null: names_option(&stmt.options, "force_not_null", column),
            }),
            None => KeyPosition::Missing,
        },
    };
    let mut shard_sql = Vec::with_capacity(table.shards.len());
    for shard in &table.shards {
        let mut for_shard = stmt.clone();
        if let Some(rv) = for_shard.relation.as_mut() {
            name_shard(rv, table, shard);
        }
        for (name, _) in &filled {
            for_shard.attlist.push(Node { node: Some(NodeEnum::String(protobuf::String { sval: name.clone() })) });
        }
        match deparse(version, NodeEnum::CopyStmt(Box::new(for_shard))) {
            Ok(sql) => shard_sql.push(sql),
            Err(e) => return Some(Plan::Unsupported(e)),
        }
    }
    let shell_sql = if stmt.is_from && format.header {
        let mut shell = stmt.clone();
        shell.options.retain(|o| !matches!(o.node.as_ref(), Some(NodeEnum::DefElem(d)) if d.defname == "header"));
        match deparse(version, NodeEnum::CopyStmt(Box::new(shell))) {
            Ok(sql) => sql,
            Err(e) => return Some(Plan::Unsupported(e)),
        }
    } else {
        text.to_string()
    };
    let fills = filled.iter().map(|(_, default)| default.clone()).collect();
    Some(Plan::Copy(Arc::new(CopyPlan {
        table: table.clone(),
        from_client: stmt.is_from,
        format,
        key,
        fields: columns.len(),
        shell_sql,
        shard_sql,
        fills,
    })))
}

/// `COPY (query) TO STDOUT` whose query reads distributed tables: the query
/// runs in the coordinator database over the tables' stand-ins.
fn plan_query(version: i32, stmt: &protobuf::CopyStmt, catalog: &Catalog) -> Option<Plan> {
    let query = stmt.query.as_ref()?.node.as_ref()?;
    if !range_vars(query).iter().any(|rv| resolve_range_var(rv, catalog).is_some()) {
        return None;
    }
    if stmt.is_program || !stmt.filename.is_empty() {
        return Some(refuse_server_file(false));
    }
    let statement = NodeEnum::CopyStmt(Box::new(stmt.clone()));
    let tables = super::distributed_among(&range_vars(query), catalog);
    let over = |stand_in| {
        let mut copy = stmt.clone();
        copy.query = Some(Box::new(Node { node: Some(fallback::over_stand_ins(query, catalog, stand_in)?) }));
        Some(NodeEnum::CopyStmt(Box::new(copy)))
    };
    let Some(read) = fallback::CoordinatorRead::build(version, tables, over) else {
        return Some(super::not_supported("COPY of a query that writes to distributed tables is not supported"));
    };
    Some(match read {
        Ok(read) => Plan::Fallback(Arc::new(FallbackPlan {
            read,
            reason: "COPY (query) TO STDOUT reads distributed tables through the general fallback".to_string(),
            statement,
            version,
            broadcast_candidates: Vec::new(),
        })),
        Err(e) => Plan::Unsupported(e),
    })
}

fn refuse_server_file(from: bool) -> Plan {
    let message = if from {
        "COPY FROM a file or program on the server into a distributed table is not supported"
    } else {
        "COPY TO a file or program on the server from a distributed table is not supported"
    };
    Plan::Unsupported(
        PgError::not_supported(message).with_hint("Use psql's \\copy, or COPY ... FROM STDIN / COPY ... TO STDOUT, which go through the client."),
    )
}

fn names(nodes: &[Node]) -> Vec<String> {
    nodes
        .iter()
        .filter_map(|n| match n.node.as_ref() {
            Some(NodeEnum::String(s)) => Some(s.sval.clone()),
            _ => None,
        })
        .collect()
}

fn options(nodes: &[Node]) -> impl Iterator<Item = &protobuf::DefElem> {
    nodes.iter().filter_map(|n| match n.node.as_ref() {
        Some(NodeEnum::DefElem(d)) => Some(d.as_ref()),
        _ => None,
    })
}

/// An option's argument in text form; None when it has none.
fn option_text(d: &protobuf::DefElem) -> Option<String> {
    match d.arg.as_ref()?.node.as_ref()? {
        NodeEnum::String(s) => Some(s.sval.clone()),
        NodeEnum::Boolean(b) => Some(b.boolval.to_string()),
        NodeEnum::Integer(i) => Some(i.ival.to_string()),
        NodeEnum::Float(f) => Some(f.fval.clone()),
        _ => None,
    }
}

/// Whether a column-list option (FORCE_NULL, …) names `column`, or all columns.
fn names_option(nodes: &[Node], option: &str, column: &str) -> bool {
    options(nodes).filter(|d| d.defname == option).any(|d| match d.arg.as_ref().and_then(|a| a.node.as_ref()) {
        Some(NodeEnum::List(l)) => names(&l.items).iter().any(|n| n == column),
        Some(NodeEnum::AStar(_)) => true,
        _ => false,
    })
}

/// The data format the options describe. Values PostgreSQL would reject are
/// read leniently: the shell table's COPY rejects them before any row is read.
fn read_format(nodes: &[Node]) -> CopyFormat {
    let kind = options(nodes).filter(|d| d.defname == "format").filter_map(option_text).last();
    let mut format = CopyFormat::new(match kind.as_deref() {
        Some("csv") => Format::Csv,
        Some("binary") => Format::Binary,
        _ => Format::Text,
    });
    let mut escape = None;
    for d in options(nodes) {
        let value = option_text(d);
        let first_byte = value.as_deref().and_then(|v| v.bytes().next());
        match d.defname.as_str() {
            "delimiter" => format.delimiter = first_byte.unwrap_or(format.delimiter),
            "null" => format.null = value.unwrap_or_default().into_bytes(),
            "quote" => format.quote = first_byte.unwrap_or(format.quote),
            "escape" => escape = first_byte,
            "header" => format.header = !matches!(value.as_deref().map(str::to_ascii_lowercase).as_deref(), Some("false" | "off" | "0")),
            _ => {}
        }
    }
    format.escape = escape.unwrap_or(format.quote);
    format
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format_of(sql: &str) -> CopyFormat {
        let parsed = pg_query::parse(sql).unwrap();
        match parsed.protobuf.stmts[0].stmt.as_ref().unwrap().node.as_ref().unwrap() {
            NodeEnum::CopyStmt(c) => read_format(&c.options),
            other => panic!("not a COPY: {other:?}"),
        }
    }

    #[test]
    fn options_in_both_syntaxes() {
        let old = format_of("COPY t FROM STDIN CSV HEADER DELIMITER ';' QUOTE '''' NULL 'n/a'");
        let new = format_of("COPY t FROM STDIN (FORMAT csv, HEADER true, DELIMITER ';', QUOTE '''', NULL 'n/a')");
        assert_eq!(old, new);
        assert_eq!((old.format, old.delimiter, old.quote, old.escape, old.header), (Format::Csv, b';', b'\'', b'\'', true));
        assert_eq!(old.null, b"n/a");
        let text = format_of("COPY t FROM STDIN");
        assert_eq!((text.format, text.delimiter, text.null.as_slice(), text.header), (Format::Text, b'\t', &b"\\N"[..], false));
        assert!(!format_of("COPY t FROM STDIN (FORMAT csv, HEADER off)").header);
        assert!(format_of("COPY t FROM STDIN (FORMAT csv, HEADER match)").header);
        assert_eq!(format_of("COPY t FROM STDIN (FORMAT csv, ESCAPE '\\')").escape, b'\\');
        assert_eq!(format_of("COPY t TO STDOUT (FORMAT binary)").format, Format::Binary);
    }
}
