//! What a session tells the process's statistics about each statement it
//! runs through the distributed tiers: the tier that carried it out, its
//! time and rows, its normalised text, and for a routed statement the
//! tenant (distribution-key value) it ran for.

use super::*;
use crate::connection::client::OutputMark;
use crate::planner::{KeyValue, RouterPlan};
use crate::stats::{queryid_of, StatementKey, Tier, Tracked};
use std::time::Instant;

/// Normalised texts a session remembers, at most (statements that embed
/// literals never repeat).
const NORMALIZED_LIMIT: usize = 2000;

impl Session {
    /// Runs a statement of the distributed tiers (as `run_distributed`)
    /// and counts it.
    pub(super) async fn execute_distributed(&mut self, sql: &str, plan: &Plan, extended: Option<(&Bind, &Shape)>) -> Result<(), Failure> {
        self.ran_tier = None;
        let (started, mark) = (Instant::now(), self.client.output_mark());
        let result = self.run_distributed(sql, plan, extended).await;
        self.count_statement(sql, plan, extended, started, mark, &result);
        result
    }

    fn count_statement(
        &mut self,
        sql: &str,
        plan: &Plan,
        extended: Option<(&Bind, &Shape)>,
        started: Instant,
        mark: OutputMark,
        result: &Result<(), Failure>,
    ) {
        let Some(tier) = self.ran_tier.take() else { return };
        match result {
            Ok(()) => {}
            Err(Failure::Error(e)) => return self.coordinator.stats.record_error(e.code()),
            Err(Failure::Reported) => return,
        }
        let elapsed = started.elapsed();
        let rows = self.client.rows_completed_since(mark);
        self.coordinator.stats.observe(tier, elapsed, rows);
        if !self.coordinator.stats.config.track {
            return;
        }
        let (queryid, normalized) = self.normalized(sql);
        let routed = match plan {
            Plan::Router(route) => Some(route),
            Plan::KeysMeet(meet) if tier == Tier::Router => Some(&meet.route),
            _ => None,
        };
        let tenant = routed.and_then(|route| tenant_of(route, extended));
        let key = StatementKey { queryid, user: self.stats_user.clone(), tier, partition_key: tenant.as_ref().map(|(_, value)| value.clone()) };
        let is_write = routed.is_some_and(|route| route.is_write());
        self.coordinator.stats.track(Tracked { key: &key, normalized: &|| normalized.clone(), tenant, is_write }, elapsed, rows);
    }

    /// The statement's id and its text with constants replaced by `$n`,
    /// as `pg_stat_statements` shows it.
    fn normalized(&mut self, sql: &str) -> (i64, Arc<str>) {
        if let Some(known) = self.normalized.get(sql) {
            return known.clone();
        }
        if self.normalized.len() >= NORMALIZED_LIMIT {
            self.normalized.clear();
        }
        let text: Arc<str> = pg_query::normalize(sql).map(Arc::from).unwrap_or_else(|_| Arc::from(sql));
        let known = (queryid_of(&text), text);
        self.normalized.insert(sql.into(), known.clone());
        known
    }
}

/// The tier a plan runs in, for the plans that are counted.
pub(super) fn tier_of(plan: &Plan) -> Option<Tier> {
    Some(match plan {
        Plan::Router(_) | Plan::KeysMeet(_) => Tier::Router,
        Plan::Delegated(_) => Tier::FunctionCall,
        Plan::MultiShard(_) => Tier::MultiShard,
        Plan::Fallback(_) => Tier::Fallback,
        Plan::Explain(_) => Tier::Explain,
        Plan::InsertSelect(_) => Tier::InsertSelect,
        Plan::MergeThroughCoordinator(_) => Tier::Merge,
        Plan::Copy(_) => Tier::Copy,
        Plan::Ddl(_) => Tier::Ddl,
        Plan::ClusterFunction(_) => Tier::ClusterFunction,
        Plan::Empty
        | Plan::Local
        | Plan::LocalWithClusterData(_)
        | Plan::LocalOverShards(_)
        | Plan::Transaction(_)
        | Plan::WithLocalRows(_)
        | Plan::SqlPrepare(_)
        | Plan::SqlExecute(_)
        | Plan::SqlDeallocate(_)
        | Plan::Unsupported(_) => return None,
    })
}

/// The co-location group and the distribution-key value, as text, that a
/// routed statement ran for.
fn tenant_of(route: &RouterPlan, extended: Option<(&Bind, &Shape)>) -> Option<(i32, Arc<str>)> {
    let colocation = route.anchor.as_ref()?.colocation_id;
    let value: Arc<str> = match route.tenant.as_ref()? {
        KeyValue::Literal { text, .. } => text.as_str().into(),
        KeyValue::Param(index) => {
            let (bind, shape) = extended?;
            let raw = bind.params.get(*index)?.as_deref()?;
            if bind.param_format(*index) == 1 {
                binary_as_text(raw, shape.param_types.get(*index).copied().unwrap_or(0)).into()
            } else {
                String::from_utf8_lossy(raw).as_ref().into()
            }
        }
        KeyValue::Default => return None,
    };
    Some((colocation, value))
}

/// A key value sent in binary, as text: integers and uuids as PostgreSQL
/// prints them, anything else as bytea's hex form.
fn binary_as_text(raw: &[u8], type_oid: u32) -> String {
    match (type_oid, raw.len()) {
        (21, 2) => i16::from_be_bytes([raw[0], raw[1]]).to_string(),
        (23, 4) => i32::from_be_bytes(raw.try_into().unwrap()).to_string(),
        (20, 8) => i64::from_be_bytes(raw.try_into().unwrap()).to_string(),
        (2950, 16) => {
            let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
            format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
        }
        _ => format!("\\x{}", raw.iter().map(|b| format!("{b:02x}")).collect::<String>()),
    }
}

#[cfg(test)]
mod tests {
    use super::binary_as_text;

    #[test]
    fn binary_keys_read_as_postgresql_prints_them() {
        assert_eq!(binary_as_text(&(-7i32).to_be_bytes(), 23), "-7");
        assert_eq!(binary_as_text(&42i64.to_be_bytes(), 20), "42");
        assert_eq!(binary_as_text(&[0x12; 16], 2950), "12121212-1212-1212-1212-121212121212");
        assert_eq!(binary_as_text(b"ab", 17), "\\x6162");
    }
}
