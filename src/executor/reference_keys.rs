//! Reference tables narrowed to their keys first. A large reference table
//! (a star schema's dimension) filtered by conditions of its own and joined
//! to a distributed table (TPC-H q8: `part` where `p_type = …`, joined on
//! `l_partkey`) would be scanned and filtered by every task of a
//! multi-shard read, once per shard group. Instead the coordinator reads,
//! once and from one replica, the joined column's values of the rows that
//! pass those conditions, and every task gets `name.column = ANY('{…}')`,
//! which its node answers through an index on that column (usually the
//! table's key). No answer changes: each row the query joins passes the
//! conditions and has a non-NULL joined column, so its value is in the
//! list. When the column is the table's primary key, the list stands for
//! those conditions exactly (each value is one row that passes them), and
//! may be longer; past `REFERENCE_KEYS_MAX` values the conditions leave
//! the task's statement, so that the node knows how many rows the table
//! gives: PostgreSQL often underestimates such conditions, which is
//! harmless for a few keys (an index probe each is what it should do) but
//! makes it probe an index per row of a large set where a hash join reads
//! less (TPC-H q22). For few keys its estimate of the list alone is the
//! worse guide: it then costs the probes above the scans they avoid (q8).
//! Outside transaction blocks only (the read is a statement of its own,
//! whose failure there would abort the block), and for at most
//! `REFERENCE_KEYS_MAX` values (`PRIMARY_KEYS_MAX` for a primary key).

use super::multi_shard::{collect_rows, shard_type_names, tasks_by_node};
use super::Mode;
use crate::connection::quote_ident;
use crate::error::PgResult;
use crate::metadata::{Catalog, DistributedTable};
use crate::planner::rewrite::ShardTemplate;
use crate::planner::table_conditions::{drop_own_conditions, joined_to_distributed, own_conditions};
use crate::planner::uncorrelated_subqueries::{array_text, typed_constant};
use crate::planner::{column_ref, conjunction, string_node};
use crate::transaction::Participants;
use crate::walk::visit_mut;
use pg_query::protobuf::{self, SelectStmt};
use pg_query::NodeEnum;
use std::sync::Arc;

/// More values than this make each task's statement long and the node's
/// index probes many: the reference table is then left to each task.
const REFERENCE_KEYS_MAX: usize = 4096;
/// The same for a primary key, whose list replaces the table's conditions
/// and tells the node the table's rows: at most about 200 kB of text per
/// task.
const PRIMARY_KEYS_MAX: usize = 32_768;

/// A reference table to narrow in one SELECT of the statement.
struct Narrowing {
    /// Which SELECT, counted in the order `visit_mut` meets them.
    select: usize,
    /// The name the SELECT gives the table, and its joined column.
    name: String,
    column: String,
    table: Arc<DistributedTable>,
    /// The read of the column's values that pass the table's conditions.
    read: String,
    /// The column is the table's primary key.
    primary_key: bool,
}

/// The most values a key list holds, on a primary key or another column.
fn most_keys(primary_key: bool) -> usize {
    if primary_key {
        PRIMARY_KEYS_MAX
    } else {
        REFERENCE_KEYS_MAX
    }
}

/// `template` with its reference tables narrowed to the keys the query can
/// join, or None when none is narrowed.
pub(super) async fn narrowed(parts: &mut Participants, template: &ShardTemplate, catalog: &Catalog) -> PgResult<Option<ShardTemplate>> {
    if parts.in_block() || !template.tables().iter().any(|t| t.is_reference()) {
        return Ok(None);
    }
    let Some(statement @ NodeEnum::SelectStmt(_)) = template.statement() else { return Ok(None) };
    let narrowings = narrowings(statement, template.tables(), catalog);
    // (narrowing, its condition, whether that replaces the table's own)
    let mut conditions: Vec<(&Narrowing, protobuf::Node, bool)> = Vec::new();
    for narrowing in &narrowings {
        if let Some((condition, keys)) = keys_condition(parts, template.version(), narrowing, catalog).await? {
            conditions.push((narrowing, condition, keys > REFERENCE_KEYS_MAX));
        }
    }
    if conditions.is_empty() {
        return Ok(None);
    }
    let mut statement = statement.clone();
    let mut select_number = 0;
    visit_mut(&mut statement, &mut |n| {
        if let NodeEnum::SelectStmt(select) = n {
            for (narrowing, condition, replaces) in conditions.iter().filter(|(nw, _, _)| nw.select == select_number) {
                if *replaces {
                    drop_own_conditions(select, &narrowing.table, catalog);
                }
                let existing = select.where_clause.take().map(|w| *w);
                select.where_clause = Some(Box::new(conjunction(existing.into_iter().chain([condition.clone()]).collect())));
            }
            select_number += 1;
        }
    });
    Ok(Some(template.clone().with_statement(statement)))
}

/// The reference tables of `tables` that a SELECT of `statement` filters
/// by their own conditions and joins to a distributed table.
fn narrowings(statement: &NodeEnum, tables: &[Arc<DistributedTable>], catalog: &Catalog) -> Vec<Narrowing> {
    let mut found = Vec::new();
    let mut select_number = 0;
    let mut statement = statement.clone();
    visit_mut(&mut statement, &mut |n| {
        if let NodeEnum::SelectStmt(select) = n {
            for table in tables.iter().filter(|t| t.is_reference()) {
                if let Some(narrowing) = narrowing(select, select_number, table, catalog) {
                    found.push(narrowing);
                }
            }
            select_number += 1;
        }
    });
    found
}

fn narrowing(select: &SelectStmt, select_number: usize, table: &Arc<DistributedTable>, catalog: &Catalog) -> Option<Narrowing> {
    let (name, conditions) = own_conditions(select, table, catalog)?;
    let column = joined_to_distributed(select, table, catalog).first()?.to_string();
    let key = format!("{}.{}", quote_ident(&name), quote_ident(&column));
    let primary_key = table.primary_key == [column.as_str()];
    let read = format!(
        "SELECT DISTINCT {key} FROM {} AS {} WHERE {conditions} AND {key} IS NOT NULL ORDER BY 1 LIMIT {}",
        table.qualified_name(),
        quote_ident(&name),
        most_keys(primary_key) + 1
    );
    Some(Narrowing { select: select_number, name, column, table: table.clone(), read, primary_key })
}

/// `name.column = ANY('{…}'::type[])` with the values `narrowing`'s read
/// finds, and how many; None when there are too many, or of a type no
/// literal spells.
async fn keys_condition(
    parts: &mut Participants,
    version: i32,
    narrowing: &Narrowing,
    catalog: &Catalog,
) -> PgResult<Option<(protobuf::Node, usize)>> {
    let template = ShardTemplate::for_own_query(version, &narrowing.read, &narrowing.table)?;
    let by_node = tasks_by_node(&template, &narrowing.table, catalog)?;
    let (fields, rows) = collect_rows(parts, &by_node, &Mode::Simple).await?;
    if rows.len() > most_keys(narrowing.primary_key) {
        return Ok(None);
    }
    let type_name = match shard_type_names(parts, catalog, &fields).await {
        Ok(mut types) if types.len() == 1 && !types[0].ends_with(']') => types.remove(0),
        _ => return Ok(None),
    };
    let values: Vec<Option<String>> = rows.into_iter().map(|row| row.into_iter().next().flatten()).collect();
    let count = values.len();
    let keys = typed_constant(Some(&array_text(&values)), &format!("{type_name}[]"))?;
    let any = protobuf::AExpr {
        kind: protobuf::AExprKind::AexprOpAny as i32,
        name: vec![string_node("=")],
        lexpr: Some(Box::new(column_ref(&[&narrowing.name, &narrowing.column]))),
        rexpr: Some(Box::new(protobuf::Node { node: Some(keys) })),
        location: -1,
    };
    Ok(Some((protobuf::Node { node: Some(NodeEnum::AExpr(Box::new(any))) }, count)))
}
