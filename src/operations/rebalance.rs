//! The rebalancer: plans shard-group moves that spread every co-location
//! group evenly over the nodes that should have shards (by shard count, as
//! Citus's `by_shard_count` strategy), and empties the nodes that should
//! not (`citus_drain_node`, `shouldhaveshards = false`). Plans are data,
//! made from the catalog alone, then carried out one move at a time.

use super::shard_move::{self, TransferMode};
use crate::config::{Login, ServerAddr};
use crate::connection::{quote_literal, PgConnection};
use crate::error::{PgError, PgResult};
use crate::metadata::{Catalog, Node};
use crate::process::context::CommandContext;
use std::collections::BTreeMap;
use std::fmt;

/// One move of a plan: the shard group of `shard_id` (a shard of `table`,
/// the group's first table by name) from `source` to `target`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedMove {
    pub table: String,
    pub shard_id: i64,
    pub source: Node,
    pub target: Node,
}

impl fmt::Display for PlannedMove {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shard {} of {} from {} to {}", self.shard_id, self.table, self.source.addr, self.target.addr)
    }
}

/// What to plan for.
#[derive(Clone, Copy, Debug, Default)]
pub struct Scope {
    /// Only this co-location group.
    pub colocation: Option<i32>,
    /// Only empty the nodes that should have no shards.
    pub drain_only: bool,
}

/// The moves, in order, that balance the cluster as `scope` says. Within a
/// co-location group each move goes from the node with the most shard
/// groups (a node that should have none first) to the eligible node with
/// the fewest, until the counts differ by at most one.
pub fn plan(catalog: &Catalog, scope: Scope) -> PgResult<Vec<PlannedMove>> {
    let eligible: Vec<&Node> = catalog.active_nodes().filter(|n| n.should_have_shards).collect();
    let mut groups: BTreeMap<i32, Vec<_>> = BTreeMap::new();
    for table in catalog.tables().filter(|t| !t.is_reference() && t.partition_of.is_none()) {
        if scope.colocation.is_none_or(|c| c == table.colocation_id) {
            groups.entry(table.colocation_id).or_default().push(table);
        }
    }
    let mut moves = Vec::new();
    for (_, mut tables) in groups {
        tables.sort_by_key(|t| t.qualified_name());
        let anchor = tables[0];
        // Shard indexes by node group.
        let mut held: BTreeMap<i32, Vec<usize>> = eligible.iter().map(|n| (n.group_id, Vec::new())).collect();
        for (i, shard) in anchor.shards.iter().enumerate() {
            if let Some(&group) = shard.placements.first() {
                held.entry(group).or_default().push(i);
            }
        }
        loop {
            let draining = held
                .iter()
                .filter(|(g, shards)| !shards.is_empty() && !eligible.iter().any(|n| n.group_id == **g))
                .max_by_key(|(g, s)| (s.len(), -**g))
                .map(|(g, _)| *g);
            let fewest = eligible.iter().min_by_key(|n| (held[&n.group_id].len(), n.group_id)).map(|n| n.group_id);
            let most = eligible.iter().max_by_key(|n| (held[&n.group_id].len(), -n.group_id)).map(|n| n.group_id);
            let (from, to) = match (draining, fewest, most) {
                (Some(_), None, _) => {
                    return Err(PgError::new("55000", "no node should have shards, so the shards of the nodes being drained have nowhere to go")
                        .with_hint("Let a node have shards with citus_set_node_property(host, port, 'shouldhaveshards', true), or add one."))
                }
                (Some(from), Some(to), _) => (from, to),
                (None, Some(to), Some(from)) if !scope.drain_only && held[&from].len() > held[&to].len() + 1 => (from, to),
                _ => break,
            };
            let index = held.get_mut(&from).and_then(Vec::pop).expect("the source holds a shard");
            held.get_mut(&to).expect("an eligible node").push(index);
            let node = |g: i32| catalog.node_for_group(g).cloned().ok_or_else(|| PgError::internal(format!("no node for group {g}")));
            moves.push(PlannedMove { table: anchor.qualified_name(), shard_id: anchor.shards[index].id, source: node(from)?, target: node(to)? });
        }
    }
    Ok(moves)
}

/// The bytes each planned move carries (its shard group's tables with
/// their indexes, as the source has them); 0 where a node cannot say.
pub async fn sizes(ctx: &CommandContext<'_>, moves: &[PlannedMove]) -> Vec<i64> {
    let mut out = Vec::new();
    for m in moves {
        let Some((anchor, shard)) = ctx.catalog.shard(m.shard_id) else {
            out.push(0);
            continue;
        };
        let names: Vec<String> = ctx
            .catalog
            .tables()
            .filter(|t| t.colocation_id == anchor.colocation_id && !t.is_reference())
            .filter_map(|t| t.shards.get(shard.index as usize).map(|s| t.qualified_shard_name(s)))
            .collect();
        out.push(shard_bytes(&m.source.addr, &ctx.coordinator.config.service_login(), &names).await.unwrap_or(0));
    }
    out
}

/// The bytes the shard tables `names` (qualified) take on the node at
/// `addr`, indexes and TOAST included; names it lacks count nothing.
pub async fn shard_bytes(addr: &ServerAddr, login: &Login, names: &[String]) -> PgResult<i64> {
    let list: Vec<String> = names.iter().map(|n| quote_literal(n)).collect();
    let sql = format!("SELECT coalesce(sum(pg_total_relation_size(to_regclass(n))), 0)::bigint FROM unnest(ARRAY[{}]::text[]) n", list.join(", "));
    let rows = PgConnection::query_once(addr, login, &sql).await?;
    Ok(crate::connection::first_value(rows).and_then(|b| b.parse().ok()).unwrap_or(0))
}

/// Carries out a plan, one move after another, telling the client how far
/// it got (moves, megabytes, time left).
pub async fn run(ctx: &mut CommandContext<'_>, moves: &[PlannedMove], mode: TransferMode) -> PgResult<()> {
    if moves.is_empty() {
        ctx.notice("the shards are balanced; nothing to move".into()).await;
        return Ok(());
    }
    let sizes = sizes(ctx, moves).await;
    let total: i64 = sizes.iter().sum();
    let started = std::time::Instant::now();
    let mut moved_bytes = 0;
    for (i, (m, size)) in moves.iter().zip(&sizes).enumerate() {
        ctx.notice(format!("rebalance: move {} of {}: {m} ({})", i + 1, moves.len(), megabytes(*size))).await;
        shard_move::move_shard_placement(ctx, m.shard_id, (&m.source.addr.host, m.source.addr.port), (&m.target.addr.host, m.target.addr.port), mode)
            .await?;
        ctx.catalog = ctx.coordinator.catalog.snapshot();
        moved_bytes += size;
        let elapsed = started.elapsed().as_secs_f64();
        let eta = if moved_bytes > 0 { elapsed * (total - moved_bytes) as f64 / moved_bytes as f64 } else { 0.0 };
        ctx.notice(format!("rebalance: {} of {} moved, {} of {}, {:.0} s left", i + 1, moves.len(), megabytes(moved_bytes), megabytes(total), eta))
            .await;
    }
    Ok(())
}

fn megabytes(bytes: i64) -> String {
    format!("{:.1} MB", bytes as f64 / 1_048_576.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServerAddr;
    use crate::metadata::{Coercion, DistributedTable, Distribution, KeyType, Shard};
    use std::sync::Arc;

    fn node(group: i32, should_have_shards: bool) -> Node {
        Node {
            id: group,
            group_id: group,
            addr: ServerAddr { host: "h".into(), port: 5000 + group as u16 },
            active: true,
            should_have_shards,
            type_oids: Default::default(),
        }
    }

    fn catalog(nodes: Vec<Node>, placements: &[i32]) -> Catalog {
        let shards = placements.iter().enumerate().map(|(i, g)| Shard { id: 100 + i as i64, index: i as u32, placements: vec![*g] }).collect();
        let table = DistributedTable {
            oid: 1,
            schema: "public".into(),
            name: "t".into(),
            distribution: Distribution::Hash {
                column: "k".into(),
                column_index: 0,
                column_type: crate::hash::HashType::Int4,
                key: KeyType { sql: "integer".into(), base_sql: "integer".into(), oid: 23, coercion: Coercion::None },
            },
            colocation_id: 1,
            columns: vec!["k".into()],
            column_type_oids: vec![23],
            copy_columns: vec!["k".into()],
            key_default: None,
            sequence_columns: vec![],
            always_identity: vec![],
            shards,
            partition_of: None,
            primary_key: vec![],
        };
        Catalog::for_tests(nodes, vec![Arc::new(table)])
    }

    fn counts(catalog: &Catalog, moves: &[PlannedMove], placements: &[i32]) -> BTreeMap<i32, usize> {
        let mut held: BTreeMap<i32, usize> = catalog.active_nodes().map(|n| (n.group_id, 0)).collect();
        for g in placements {
            *held.entry(*g).or_default() += 1;
        }
        for m in moves {
            *held.get_mut(&m.source.group_id).unwrap() -= 1;
            *held.get_mut(&m.target.group_id).unwrap() += 1;
        }
        held
    }

    #[test]
    fn a_new_node_gets_its_share() {
        let placements = [1, 2, 1, 2, 1, 2, 1, 2];
        let c = catalog(vec![node(1, true), node(2, true), node(3, true)], &placements);
        let moves = plan(&c, Scope::default()).unwrap();
        assert_eq!(moves.len(), 2);
        assert!(moves.iter().all(|m| m.target.group_id == 3));
        assert_eq!(counts(&c, &moves, &placements).into_values().collect::<Vec<_>>(), vec![3, 3, 2]);
        assert!(plan(&c, Scope { drain_only: true, ..Scope::default() }).unwrap().is_empty());
    }

    #[test]
    fn a_drained_node_is_emptied_evenly() {
        let placements = [1, 2, 3, 1, 2, 3];
        let c = catalog(vec![node(1, true), node(2, true), node(3, false)], &placements);
        let moves = plan(&c, Scope { drain_only: true, ..Scope::default() }).unwrap();
        assert_eq!(counts(&c, &moves, &placements).into_values().collect::<Vec<_>>(), vec![3, 3, 0]);
        let nowhere = catalog(vec![node(1, false)], &[1, 1]);
        assert!(plan(&nowhere, Scope::default()).is_err());
    }

    #[test]
    fn a_balanced_cluster_needs_no_moves() {
        let c = catalog(vec![node(1, true), node(2, true)], &[1, 2, 1]);
        assert!(plan(&c, Scope::default()).unwrap().is_empty());
    }
}
