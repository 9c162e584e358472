//! Keeping the catalog snapshot current: reloads after changes (this
//! process's and, through notifications, others'), and the refusal of
//! statements while a reload fails although the coordinator database answers.

use super::Coordinator;
use crate::connection::PgConnection;
use crate::error::{sqlstate, PgError, PgResult};
use crate::metadata;

impl Coordinator {
    /// Loads the catalog afresh and swaps it in (never replacing a newer one).
    /// A failure while the coordinator database answers leaves the catalog
    /// unreliable until a reload succeeds (`check_catalog`); one because it
    /// cannot be reached does not: nothing can read a shell then, and
    /// statements that need no coordinator database go on under the last
    /// snapshot.
    pub async fn reload_catalog(&self) -> PgResult<()> {
        let result = self.load_catalog().await;
        match &result {
            Ok(()) => *self.unreliable_catalog.lock().unwrap() = None,
            Err(e) if !e.is_node_unreachable() => *self.unreliable_catalog.lock().unwrap() = Some(self.catalog_refusal(e)),
            Err(_) => {}
        }
        result
    }

    /// Whether statements may be planned under the catalog snapshot: after
    /// a failed reload it may miss a change that committed (a table just
    /// distributed, a view over one), and a statement planned under it
    /// could read a distributed table's empty shell for its rows. Then the
    /// reload is tried again, and while it fails, statements are refused
    /// with the reason.
    pub async fn check_catalog(&self) -> PgResult<()> {
        if self.unreliable_catalog.lock().unwrap().is_none() {
            return Ok(());
        }
        match self.reload_catalog().await {
            Err(e) if !e.is_node_unreachable() => Err(self.catalog_refusal(&e)),
            _ => Ok(()),
        }
    }

    /// Whether a reload failed and none succeeded since (`check_catalog`).
    pub fn catalog_unreliable(&self) -> bool {
        self.unreliable_catalog.lock().unwrap().is_some()
    }

    /// Reloads the catalog after a change that committed: its outcome
    /// stands whatever the reload does, so a failure is the WARNING this
    /// returns for the client, and statements are refused until a reload
    /// succeeds (`check_catalog`).
    pub async fn reload_after_commit(&self) -> Option<PgError> {
        let e = self.reload_catalog().await.err()?;
        tracing::warn!("could not reload the catalog after a change committed: {}", e.message());
        let refusal = self.catalog_refusal(&e);
        Some(
            PgError::warning("01000", format!("the change committed, but {}", refusal.message())).with_hint(
                "Statements that could read a distributed table are refused until the catalog can be reloaded; each statement tries again.",
            ),
        )
    }

    /// The error refusing statements while the catalog cannot be reloaded
    /// because of `cause`.
    pub fn catalog_refusal(&self, cause: &PgError) -> PgError {
        PgError::new(
            sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("the catalog could not be reloaded from the coordinator database at {}: {}; retry", self.config.coordinator_db_addr(), cause.message()),
        )
        .with_detail("The coordinator's catalog may miss a change that committed; a statement planned under it could read a distributed table's empty shell in the coordinator database.")
        .with_hint("Statements are refused until a reload succeeds; each one tries again. Look at the coordinator database's log for why the reload failed.")
    }

    /// `reload_catalog`'s work.
    async fn load_catalog(&self) -> PgResult<()> {
        let mut kept = self.reloads.lock().await;
        let addr = self.config.coordinator_db_addr();
        let mut conn = kept.take(&addr).await?;
        let fresh = self.load_fresh(&mut conn).await;
        kept.give_back(&addr, conn).await;
        let Some(fresh) = fresh? else { return Ok(()) };
        if fresh.version >= self.catalog.snapshot().version {
            self.catalog.replace(fresh);
        }
        Ok(())
    }

    /// The catalog as committed now, or None when the snapshot is of that
    /// version already.
    async fn load_fresh(&self, conn: &mut PgConnection) -> PgResult<Option<metadata::Catalog>> {
        let current = self.catalog.snapshot();
        if !current.type_oids_incomplete && metadata::committed_version(conn).await? == current.version {
            return Ok(None);
        }
        Ok(Some(metadata::load_since(conn, &self.config.service_login(), &current).await?))
    }
}
