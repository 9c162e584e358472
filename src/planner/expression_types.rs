//! The type of a simple expression over a query's distributed tables, as
//! far as the catalog and the expression's own text tell: a cast names its
//! type, a column of a table in the query's FROM has the type the catalog
//! recorded. Anything else is unknown, and whoever asks falls back to
//! what works for every type.

use super::resolve_range_var;
use crate::metadata::{Catalog, DistributedTable};
use pg_query::protobuf::{self, a_const, Node, SelectStmt};
use pg_query::NodeEnum;
use std::sync::Arc;

pub const INT8: u32 = 20;
pub const INT2: u32 = 21;
pub const INT4: u32 = 23;
pub const FLOAT4: u32 = 700;
pub const FLOAT8: u32 = 701;

/// The tables a query's FROM names, by the name its columns are qualified with.
pub struct FromTables {
    tables: Vec<(String, Arc<DistributedTable>)>,
    /// The FROM also has subqueries, functions or local tables, whose
    /// columns an unqualified name may mean.
    others: bool,
    /// The FROM has an outer join.
    pub outer_joins: bool,
}

impl FromTables {
    pub fn of(select: &SelectStmt, catalog: &Catalog) -> FromTables {
        let mut from = FromTables { tables: Vec::new(), others: false, outer_joins: false };
        for item in &select.from_clause {
            from.collect(item, catalog);
        }
        from
    }

    fn collect(&mut self, item: &Node, catalog: &Catalog) {
        match item.node.as_ref() {
            Some(NodeEnum::RangeVar(rv)) => match resolve_range_var(rv, catalog) {
                Some(table) => {
                    let name = rv.alias.as_ref().map_or(&rv.relname, |a| &a.aliasname).clone();
                    self.tables.push((name, table.clone()));
                }
                None => self.others = true,
            },
            Some(NodeEnum::JoinExpr(join)) => {
                self.outer_joins |= join.jointype != protobuf::JoinType::JoinInner as i32;
                for side in [join.larg.as_deref(), join.rarg.as_deref()].into_iter().flatten() {
                    self.collect(side, catalog);
                }
            }
            _ => self.others = true,
        }
    }

    /// The names (alias, or the table's own) under which the FROM reads table `oid`.
    pub fn names_of(&self, oid: u32) -> Vec<&str> {
        self.tables.iter().filter(|(_, table)| table.oid == oid).map(|(name, _)| name.as_str()).collect()
    }

    /// The table a column reference reads, and the column's name, when the
    /// FROM tells it for certain.
    pub fn column_of<'r>(&self, c: &'r protobuf::ColumnRef) -> Option<(&Arc<DistributedTable>, &'r str)> {
        let names = super::column_ref_names(c)?;
        let (qualifier, column) = match names[..] {
            [column] => (None, column),
            [.., qualifier, column] => (Some(qualifier), column),
            [] => return None,
        };
        if qualifier.is_none() && self.others {
            return None;
        }
        let mut found = self
            .tables
            .iter()
            .filter(|(name, table)| qualifier.is_none_or(|q| q == name) && table.columns.iter().any(|c| c == column))
            .map(|(_, t)| t);
        let table = found.next()?;
        // Two tables with such a column: ambiguous, PostgreSQL refuses it.
        found.next().is_none().then_some((table, column))
    }

    /// The type oid of `expr`, when it is a cast or a column of one of the tables.
    pub fn type_of(&self, expr: &Node) -> Option<u32> {
        match expr.node.as_ref()? {
            NodeEnum::TypeCast(cast) => {
                let name = cast.type_name.as_ref()?.names.last()?;
                match name.node.as_ref()? {
                    NodeEnum::String(s) => match s.sval.as_str() {
                        "int8" => Some(INT8),
                        "int2" => Some(INT2),
                        "int4" => Some(INT4),
                        "float4" => Some(FLOAT4),
                        "float8" => Some(FLOAT8),
                        _ => None,
                    },
                    _ => None,
                }
            }
            NodeEnum::ColumnRef(c) => {
                let (table, column) = self.column_of(c)?;
                table.columns.iter().position(|name| name == column).and_then(|i| table.column_type_oids.get(i).copied()).filter(|oid| *oid != 0)
            }
            // Arithmetic with a float8 operand and a number is float8 (not
            // with an interval: float8 * interval is an interval). Of
            // integers, the wider operand's type (int2 with int2 stays int2;
            // an integer constant is an int4), as PostgreSQL's integer
            // operators give.
            NodeEnum::AExpr(e) if e.kind == protobuf::AExprKind::AexprOp as i32 => {
                let operator = match e.name.as_slice() {
                    [name] => match name.node.as_ref()? {
                        NodeEnum::String(s) => s.sval.as_str(),
                        _ => return None,
                    },
                    _ => return None,
                };
                if !matches!(operator, "+" | "-" | "*" | "/" | "%") {
                    return None;
                }
                // Some(None) for a decimal constant (a numeric), which only
                // a float8 operand types.
                let number = |side: Option<&Node>| match side?.node.as_ref()? {
                    NodeEnum::AConst(c) if matches!(c.val, Some(a_const::Val::Ival(_))) => Some(Some(INT4)),
                    NodeEnum::AConst(c) if matches!(c.val, Some(a_const::Val::Fval(_))) => Some(None),
                    _ => self.type_of(side?).filter(|t| matches!(*t, INT2 | INT4 | INT8 | FLOAT4 | FLOAT8)).map(Some),
                };
                let (left, right) = (number(e.lexpr.as_deref())?, number(e.rexpr.as_deref())?);
                if left == Some(FLOAT8) || right == Some(FLOAT8) {
                    return (operator != "%").then_some(FLOAT8);
                }
                match (left?, right?) {
                    (INT8, INT2 | INT4 | INT8) | (INT2 | INT4, INT8) => Some(INT8),
                    (INT2, INT2) => Some(INT2),
                    (INT2 | INT4, INT2 | INT4) => Some(INT4),
                    _ => None,
                }
            }
            _ => None,
        }
    }
}
