//! The extended query protocol: Parse, Bind, Describe, Execute, Close and
//! Sync, with portals that stream their rows a batch at a time.

use super::*;

impl Session {
    pub(super) fn extended_error(&mut self, failure: Failure) {
        self.report(failure);
        self.skip_until_sync = true;
    }

    pub(super) async fn on_parse(&mut self, msg: &Message) -> anyhow::Result<()> {
        let parse = frontend::decode_parse(msg)?;
        self.query_text.clear();
        self.query_text.push_str(&parse.sql);
        if let Err(f) = self.follow_search_path().await {
            self.extended_error(f);
            return Ok(());
        }
        if let Err(f) = self.check_catalog(&parse.sql).await {
            self.extended_error(f);
            return Ok(());
        }
        let planned = self.plan(&parse.sql);
        let distributed = planned.statements.len() == 1 && !matches!(planned.statements[0].plan, Plan::Local | Plan::Empty);
        if !distributed {
            self.user_code_unsynced |= planned.statements.iter().any(|s| s.changes_user_code);
            if !parse.name.is_empty() {
                self.parts.pin_local("a prepared statement");
            }
            self.statements.insert(parse.name.clone(), Statement::Local);
            return self.forward_local(msg).await;
        }
        self.drain_local().await?;
        match self.describe_shape(&parse.sql, &parse.param_types).await {
            Ok(shape) => {
                self.statements.insert(parse.name, Statement::Distributed(Arc::new(DistributedStatement { plan: planned, shape })));
                backend::parse_complete(self.client.out());
            }
            Err(e) => self.extended_error(Failure::Error(e)),
        }
        Ok(())
    }

    /// Parameter types and result columns of a distributed statement: the shell
    /// tables let the coordinator database describe it exactly as PostgreSQL would.
    pub(super) async fn describe_shape(&mut self, sql: &str, param_types: &[u32]) -> PgResult<Arc<Shape>> {
        self.catalog_to_run_under();
        let key = (sql.to_string(), param_types.to_vec());
        if let Some(shape) = self.shells.shapes.get(&key) {
            return Ok(shape.clone());
        }
        const NAME: &str = "tessera_describe";
        let local = self.parts.local_for_describe().await?;
        frontend::close(local.out(), Target::Statement, NAME);
        frontend::parse(local.out(), NAME, sql, param_types);
        frontend::describe(local.out(), Target::Statement, NAME);
        frontend::close(local.out(), Target::Statement, NAME);
        frontend::sync(local.out());
        let mut shape = Shape { param_types: param_types.to_vec(), fields: None };
        let mut error = None;
        loop {
            let msg = local.recv().await?;
            match msg.tag() {
                b't' => shape.param_types = backend::decode_parameter_description(&msg)?,
                b'T' => shape.fields = Some(backend::decode_row_description(&msg)?),
                b'E' => error = Some(backend::decode_error_fields(&msg)?),
                b'Z' => break,
                _ => {}
            }
        }
        self.parts.observe_local_status();
        if let Some(e) = error {
            return Err(e);
        }
        let shape = Arc::new(shape);
        self.shells.shapes.insert(key, shape.clone());
        Ok(shape)
    }

    /// Has the coordinator database check a statement whose rows move
    /// through the coordinator before it finishes, so that one PostgreSQL
    /// rejects fails at once, with PostgreSQL's error, before any rows move.
    /// EXPLAIN against the shells checks names, types and privileges and
    /// reads nothing (parameters are bound as NULLs); for what EXPLAIN does
    /// not take, Parse checks names and types. Statements found right are
    /// remembered until the catalog changes: the nodes check privileges
    /// again as they run the statement, so a stale entry costs only time.
    pub(super) async fn check_on_shells(&mut self, sql: &str, param_types: &[u32], check: ShellCheck) -> PgResult<()> {
        let key = (sql.to_string(), param_types.to_vec());
        if self.shells.checked.contains(&key) {
            return Ok(());
        }
        match check {
            ShellCheck::Parse => {
                self.describe_shape(sql, param_types).await?;
            }
            ShellCheck::Explain => {
                let local = self.parts.local_for_describe().await?;
                frontend::parse(local.out(), "", &format!("EXPLAIN (COSTS OFF) {sql}"), param_types);
                frontend::bind(local.out(), "", "", &[], &vec![None; param_types.len()], &[]);
                frontend::execute(local.out(), "", 0);
                frontend::sync(local.out());
                let mut error = None;
                loop {
                    let msg = local.recv().await?;
                    match msg.tag() {
                        b'E' => error = error.or(Some(backend::decode_error_fields(&msg)?)),
                        b'Z' => break,
                        _ => {}
                    }
                }
                self.parts.observe_local_status();
                if let Some(e) = error {
                    return Err(e);
                }
            }
        }
        self.shells.checked.insert(key);
        Ok(())
    }

    pub(super) async fn on_bind(&mut self, msg: &Message) -> anyhow::Result<()> {
        let bind = frontend::decode_bind(msg)?;
        self.end_stream_of(&bind.portal).await;
        match self.statements.get(&bind.statement) {
            Some(Statement::Distributed(statement)) => {
                let statement = statement.clone();
                self.drain_local().await?;
                self.portals.insert(bind.portal.clone(), Portal::Distributed { statement, bind, pending: None });
                backend::bind_complete(self.client.out());
                Ok(())
            }
            _ => {
                self.portals.insert(bind.portal, Portal::Local);
                self.forward_local(msg).await
            }
        }
    }

    pub(super) async fn on_describe(&mut self, msg: &Message) -> anyhow::Result<()> {
        let (target, name) = frontend::decode_describe_or_close(msg)?;
        let described = match target {
            Target::Statement => match self.statements.get(&name) {
                Some(Statement::Distributed(s)) => Some((s.shape.clone(), None)),
                _ => None,
            },
            Target::Portal => match self.portals.get(&name) {
                Some(Portal::Distributed { statement, bind, .. }) => Some((statement.shape.clone(), Some(bind.result_formats.clone()))),
                _ => None,
            },
        };
        let Some((shape, formats)) = described else {
            return self.forward_local(msg).await;
        };
        self.drain_local().await?;
        let out = self.client.out();
        if formats.is_none() {
            backend::parameter_description(out, &shape.param_types);
        }
        match &shape.fields {
            None => backend::no_data(out),
            Some(fields) => {
                let formats = formats.unwrap_or_default();
                let fields: Vec<FieldDescription> = fields
                    .iter()
                    .enumerate()
                    .map(|(i, f)| FieldDescription {
                        format: match formats.len() {
                            0 => 0,
                            1 => formats[0],
                            _ => formats.get(i).copied().unwrap_or(0),
                        },
                        ..f.clone()
                    })
                    .collect();
                backend::row_description(out, &fields);
            }
        }
        Ok(())
    }

    pub(super) async fn on_execute(&mut self, msg: &Message) -> anyhow::Result<()> {
        let (portal, max_rows) = frontend::decode_execute(msg)?;
        if !matches!(self.portals.get(&portal), Some(Portal::Distributed { .. })) {
            return self.forward_local(msg).await;
        }
        if let Some((name, mut stream)) = self.stream.take() {
            if name == portal {
                self.drain_local().await?;
                let progress = stream.read(&mut self.parts, max_rows, &mut self.client).await;
                self.after_stream_read(portal, stream, progress);
                return Ok(());
            }
            self.stream = Some((name, stream));
            self.settle_stream().await;
        }
        // Taken out for the execution and put back after (a named portal can be
        // executed again), which spares copying its parameters.
        let Some(Portal::Distributed { statement, bind, pending }) = self.portals.remove(&portal) else { unreachable!() };
        if let Some(pending) = pending {
            let pending = Some(self.send_rows(pending, max_rows));
            self.portals.insert(portal, Portal::Distributed { statement, bind, pending });
            return Ok(());
        }
        self.drain_local().await?;
        self.query_text.clear();
        self.query_text.push_str(&statement.plan.statements[0].sql);
        let limited = max_rows > 0;
        let plan = match self.current_plan(&statement).await {
            Ok(plan) => plan,
            Err(f) => {
                self.extended_error(f);
                self.portals.insert(portal, Portal::Distributed { statement, bind, pending: None });
                return Ok(());
            }
        };
        let stmt = &plan.statements[0];
        if limited && row_stream::streams(&stmt.plan) && self.check_not_failed(&stmt.plan).is_ok() {
            // Rows are read from the workers as the client asks for them.
            let started = {
                let catalog = self.catalog_to_run_under();
                let mode = Mode::Extended { bind: &bind, param_types: &statement.shape.param_types, sync: false };
                RowStream::start(&stmt.plan, &mut self.parts, &catalog, &mode).await
            };
            self.portals.insert(portal.clone(), Portal::Distributed { statement, bind, pending: None });
            match started {
                Ok(mut stream) => {
                    let progress = stream.read(&mut self.parts, max_rows, &mut self.client).await;
                    self.after_stream_read(portal, stream, progress);
                }
                Err(e) => {
                    self.parts.discard_broken();
                    self.extended_error(e.into());
                }
            }
            return Ok(());
        }
        // Otherwise, with a row limit, the whole result is held here and handed
        // out max_rows at a time, as a suspended portal of PostgreSQL's would.
        let start = self.client.out().len();
        self.client.hold_output(limited.then(|| Box::new(self.parts.limits().clone()) as Box<dyn MemoryCharge>));
        let mut result = match self.check_not_failed(&stmt.plan) {
            Ok(()) => self.execute_distributed(&stmt.sql, &stmt.plan, Some((&bind, &statement.shape))).await,
            Err(f) => Err(f),
        };
        if let Err(f) = &result {
            if self.client.out().len() == start && self.shard_gone(f, plan.version).await {
                result = match self.current_plan(&statement).await {
                    Ok(again) => self.execute_distributed(&again.statements[0].sql, &again.statements[0].plan, Some((&bind, &statement.shape))).await,
                    Err(f) => Err(f),
                };
            }
        }
        self.client.hold_output(None);
        let mut pending = None;
        match result {
            Err(f) => self.extended_error(f),
            Ok(()) if limited => pending = self.hold_back_rows(start).map(|rows| self.send_rows(rows, max_rows)),
            Ok(()) => {}
        }
        self.portals.insert(portal, Portal::Distributed { statement, bind, pending });
        Ok(())
    }

    /// Keeps a suspended stream for the portal's next Execute; a finished one
    /// leaves the portal exhausted (executing it again gives no rows).
    pub(super) fn after_stream_read(&mut self, portal: String, stream: RowStream, progress: PgResult<Progress>) {
        match progress {
            Ok(Progress::Suspended) => self.stream = Some((portal, stream)),
            Ok(Progress::Done) => {
                if let Some(Portal::Distributed { pending, .. }) = self.portals.get_mut(&portal) {
                    let mut complete = bytes::BytesMut::new();
                    backend::command_complete(&mut complete, "SELECT 0");
                    *pending = Some(PendingRows { rows: Default::default(), complete: complete.freeze() });
                }
            }
            Err(e) => self.extended_error(e.into()),
        }
    }

    /// Frees the worker connections of the streaming portal for other work:
    /// its remaining rows are read into memory and handed out from there.
    pub(super) async fn settle_stream(&mut self) {
        let Some((name, stream)) = self.stream.take() else { return };
        let (rows, complete) = stream.hold_rest(&mut self.parts).await;
        if let Some(Portal::Distributed { pending, .. }) = self.portals.get_mut(&name) {
            *pending = Some(PendingRows { rows, complete });
        }
    }

    /// The portal `name` is going away (closed, bound anew, or its implicit
    /// transaction ended): the rest of its stream is read and dropped.
    pub(super) async fn end_stream_of(&mut self, name: &str) {
        if self.stream.as_ref().is_some_and(|(streaming, _)| streaming == name) {
            if let Some((_, stream)) = self.stream.take() {
                stream.hold_rest(&mut self.parts).await;
            }
        }
    }

    /// Takes the DataRows and the CommandComplete written since `start` back
    /// out of the client's buffer; None (and the output left alone) when the
    /// statement did not answer with rows.
    pub(super) fn hold_back_rows(&mut self, start: usize) -> Option<PendingRows> {
        let mut produced = self.client.out().split_off(start);
        let mut messages = Vec::new();
        while let Ok(Some(msg)) = crate::protocol::take_message(&mut produced) {
            messages.push(msg);
        }
        let Some(complete) = messages.iter().position(|m| m.tag() == b'C') else {
            for msg in &messages {
                self.client.out().extend_from_slice(msg.frame());
            }
            return None;
        };
        let complete = messages.remove(complete).frame_bytes();
        let mut rows = std::collections::VecDeque::new();
        for msg in messages {
            match msg.tag() {
                b'D' => rows.push_back(msg.frame_bytes()),
                // Notices go out now.
                _ => self.client.out().extend_from_slice(msg.frame()),
            }
        }
        Some(PendingRows { rows, complete })
    }

    /// Sends up to `max_rows` (0: all) of `pending`'s rows. Having sent a full
    /// batch the portal is suspended, as in PostgreSQL (which cannot know
    /// whether more rows follow); otherwise it completes, and stays behind
    /// exhausted: executing it again gives no more rows.
    pub(super) fn send_rows(&mut self, mut pending: PendingRows, max_rows: i32) -> PendingRows {
        let batch = if max_rows > 0 { (max_rows as usize).min(pending.rows.len()) } else { pending.rows.len() };
        for row in pending.rows.drain(..batch) {
            self.client.out().extend_from_slice(&row);
        }
        if max_rows > 0 && batch == max_rows as usize {
            backend::portal_suspended(self.client.out());
        } else {
            let complete = crate::protocol::Message::from_frame(pending.complete.clone());
            match complete.tag() {
                b'C' => {
                    let tag = String::from_utf8_lossy(complete.body().strip_suffix(&[0]).unwrap_or(complete.body()));
                    backend::command_complete(self.client.out(), &backend::tag_with_count(&tag, batch as u64));
                }
                _ => self.client.out().extend_from_slice(&pending.complete),
            }
        }
        pending
    }

    /// The plan a prepared statement runs with now. After a catalog change it
    /// is planned again (shards, columns and placements may have moved), and,
    /// as PostgreSQL does for a prepared statement, it fails if its result
    /// columns changed under it.
    pub(super) async fn current_plan(&mut self, statement: &DistributedStatement) -> Result<Arc<CachedPlan>, Failure> {
        if let Some(planned) = statement.plan.statements.first() {
            self.hold_for_fences(&planned.plan).await;
        }
        self.follow_search_path().await?;
        if statement.plan.version == self.catalog().version && statement.plan.search_path == self.search_path.generation {
            return Ok(statement.plan.clone());
        }
        let sql = statement.plan.statements[0].sql.clone();
        let shape = self.describe_shape(&sql, &statement.shape.param_types).await?;
        let columns = |s: &Shape| s.fields.as_ref().map(|f| f.iter().map(|c| (c.type_oid, c.type_modifier)).collect::<Vec<_>>());
        if columns(&shape) != columns(&statement.shape) {
            return Err(PgError::new(sqlstate::FEATURE_NOT_SUPPORTED, "cached plan must not change result type").into());
        }
        Ok(self.plan(&sql))
    }

    pub(super) async fn on_close(&mut self, msg: &Message) -> anyhow::Result<()> {
        let (target, name) = frontend::decode_describe_or_close(msg)?;
        if target == Target::Portal {
            self.end_stream_of(&name).await;
        }
        let was_distributed = match target {
            Target::Statement => matches!(self.statements.remove(&name), Some(Statement::Distributed(_))),
            Target::Portal => matches!(self.portals.remove(&name), Some(Portal::Distributed { .. })),
        };
        if !was_distributed {
            return self.forward_local(msg).await;
        }
        self.drain_local().await?;
        backend::close_complete(self.client.out());
        Ok(())
    }

    pub(super) async fn sync(&mut self) -> anyhow::Result<()> {
        self.skip_until_sync = false;
        if self.local_unsynced {
            self.local_unsynced = false;
            self.local_expected = 0;
            frontend::sync(self.parts.held_local()?.out());
            // Everything still owed, then ReadyForQuery (not forwarded: ours follows).
            loop {
                match self.parts.held_local()?.recv().await {
                    Ok(msg) if msg.tag() == b'Z' => break,
                    Ok(msg) if msg.tag() == b'G' => {
                        // COPY FROM STDIN through the extended protocol: PostgreSQL
                        // ignored the Sync we passed on; the client sends another
                        // after its CopyDone/CopyFail.
                        self.client.out().extend_from_slice(msg.frame());
                        self.client.flush().await?;
                        self.pump_copy_in().await?;
                        if let Some(next) = self.client.recv().await? {
                            self.parts.held_local()?.out().extend_from_slice(next.frame());
                        }
                    }
                    Ok(msg) => self.client.out().extend_from_slice(msg.frame()),
                    Err(e) => {
                        self.report(Failure::Error(e));
                        break;
                    }
                }
            }
            self.parts.observe_local_status();
        }
        if std::mem::take(&mut self.user_code_unsynced) {
            if let Err(f) = self.see_user_code_change().await {
                self.report(f);
            }
        }
        let mut errors = Vec::new();
        for worker in self.parts.workers_needing_sync() {
            worker.needs_sync = false;
            frontend::sync(worker.conn.out());
            if let Err(e) = worker.conn.drain_until_ready().await {
                errors.push(e);
            }
        }
        if !errors.is_empty() {
            self.parts.discard_broken();
            for e in errors {
                self.report(Failure::Error(e));
            }
        }
        self.release_deadlocked_work().await;
        // Portals live until the end of the transaction; outside one, until Sync.
        if !self.parts.in_block() {
            self.end_stream_of("").await;
            self.portals.retain(|name, _| !name.is_empty());
        }
        self.parts.settle_links().await;
        backend::ready_for_query(self.client.out(), self.parts.status());
        self.client.flush().await?;
        if self.stream.is_none() {
            self.parts.release_connections(self.local_expected == 0 && !self.local_unsynced).await;
        }
        Ok(())
    }
}
