//! The relay to the coordinator database: statements it runs itself pass
//! through message by message, COPY data included, until it is ready again.

use super::*;

impl Session {
    /// Forwards the coordinator database's responses to the client up to its
    /// ReadyForQuery, feeding it the client's COPY data when it asks for some.
    /// With `withhold_distributed`, an error saying the statement's table was
    /// distributed while it waited (the shell's guard, schema.sql
    /// `tessera.refuse_shell_write`) is kept back when nothing but notices
    /// came before it: true then, for the caller to send the statement again.
    pub(super) async fn relay_local_until_ready(&mut self, withhold_distributed: bool) -> Result<bool, Failure> {
        let mut failed = false;
        let mut answered = false;
        let mut withheld = false;
        loop {
            let msg = self.parts.held_local()?.recv().await?;
            match msg.tag() {
                b'Z' => break,
                b'E' => {
                    if withhold_distributed
                        && !answered
                        && !failed
                        && backend::decode_error_fields(&msg).is_ok_and(|e| e.code() == "40001" && e.message().ends_with(DISTRIBUTED_MEANWHILE))
                    {
                        withheld = true;
                        continue;
                    }
                    failed = true;
                    self.client.out().extend_from_slice(msg.frame());
                }
                b'G' => {
                    answered = true;
                    self.client.out().extend_from_slice(msg.frame());
                    self.client.flush().await.map_err(client_lost)?;
                    self.pump_copy_in().await?;
                }
                tag => {
                    answered |= !matches!(tag, b'N' | b'S');
                    self.client.out().extend_from_slice(msg.frame());
                    self.client.flush_if_large().await?;
                }
            }
        }
        match (withheld, failed) {
            (true, _) => Ok(true),
            (false, true) => Err(Failure::Reported),
            (false, false) => Ok(false),
        }
    }

    /// Passes the client's CopyData through to the coordinator database until
    /// CopyDone or CopyFail.
    pub(super) async fn pump_copy_in(&mut self) -> PgResult<()> {
        loop {
            let Some(msg) = self.client.recv().await.map_err(client_lost)? else {
                let local = self.parts.held_local()?;
                frontend::copy_fail(local.out(), "client connection lost");
                local.flush().await?;
                return Err(client_lost("end of stream"));
            };
            let local = self.parts.held_local()?;
            match msg.tag() {
                b'd' => {
                    local.out().extend_from_slice(msg.frame());
                    if local.out().len() >= 256 * 1024 {
                        local.flush().await?;
                    }
                }
                b'c' | b'f' => {
                    local.out().extend_from_slice(msg.frame());
                    local.flush().await?;
                    return Ok(());
                }
                _ => {} // Flush and Sync are ignored during COPY, as PostgreSQL does
            }
        }
    }

    // ---- extended query protocol ----

    /// Forwards one extended-protocol message to the coordinator database; its
    /// response is relayed later, in order.
    pub(super) async fn forward_local(&mut self, msg: &Message) -> anyhow::Result<()> {
        match self.parts.local().await {
            Ok(local) => {
                local.out().extend_from_slice(msg.frame());
                self.local_expected += 1;
                self.local_unsynced = true;
            }
            Err(e) => self.extended_error(Failure::Error(e)),
        }
        Ok(())
    }

    /// Relays what the coordinator database owes for forwarded messages, so that
    /// a response we produce ourselves goes out in the right order.
    pub(super) async fn drain_local(&mut self) -> anyhow::Result<()> {
        if self.local_expected == 0 {
            return Ok(());
        }
        let flushed = self.parts.held_local().map(|local| frontend::flush(local.out()));
        if let Err(e) = flushed {
            self.local_expected = 0;
            self.extended_error(Failure::Error(e));
            return Ok(());
        }
        while self.local_expected > 0 {
            let msg = match self.parts.held_local()?.recv().await {
                Ok(m) => m,
                Err(e) => {
                    self.local_expected = 0;
                    self.extended_error(Failure::Error(e));
                    return Ok(());
                }
            };
            if msg.tag() == b'G' {
                self.client.out().extend_from_slice(msg.frame());
                self.client.flush().await?;
                self.pump_copy_in().await?;
                continue;
            }
            match msg.tag() {
                b'1' | b'2' | b'3' | b'T' | b'n' | b'C' | b'I' | b's' => self.local_expected -= 1,
                b'E' => {
                    self.local_expected = 0;
                    self.skip_until_sync = true;
                }
                _ => {}
            }
            self.client.out().extend_from_slice(msg.frame());
            self.client.flush_if_large().await?;
        }
        Ok(())
    }
}
