//! The PostgreSQL state store: the same manifest, runs, windows, bookmarks
//! and leases as [`crate::SqliteStore`], shared by every highwater process
//! of a fleet, plus the work queue ([`crate::WorkQueue`]) they claim items
//! from.
//!
//! The connection string comes from an environment variable the config
//! names (`[state] url_env`) and is never printed: errors say "the
//! PostgreSQL state store (HIGHWATER_STATE_URL)", never the URL, since it
//! may carry a password.
//!
//! Migrations use the same numbering as SQLite's: version `v` means the same
//! tables in both, so `state migrate` can copy one into the other and refuse
//! a target newer than the binary. Each migration step runs in a transaction
//! under a transaction-level advisory lock, so processes starting together
//! migrate once.
//!
//! Times: leases use the caller's clock as the trait says (the acquisition
//! loop's takeover of a dead local owner needs it); work-queue claims use
//! the server's clock, so machines whose clocks drift still agree on which
//! claim expired.

use crate::{
    Batch, Bookmark, Claim, DirRecord, DoneDeps, Fence, FleetProcess, Lease, LeaseOutcome,
    QueueCounts, QueuePlan, RunRecord, StageEntries, StateStore, StoreError, WindowCommit,
    WindowRecord, WindowStatus, WorkQueue,
};
use highwater_core::evidence::Digest;
use highwater_core::{Entry, EntryKind, Stat, Status};
use postgres::{Client, NoTls, Transaction};

/// The migrations, in the same numbering as SQLite's (see `sqlite.rs`).
const MIGRATIONS: &[&str] = &[
    // 0 -> 1: the manifest.
    "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
     CREATE TABLE entries(
        stage TEXT NOT NULL,
        kind TEXT NOT NULL,
        item TEXT NOT NULL,
        digest TEXT,
        size BIGINT NOT NULL,
        mtime_ns BIGINT NOT NULL,
        ctime_ns BIGINT NOT NULL,
        ino BIGINT NOT NULL,
        dev BIGINT NOT NULL,
        observed_at_ns BIGINT NOT NULL,
        recipe TEXT NOT NULL,
        output TEXT NOT NULL,
        status TEXT NOT NULL,
        error TEXT,
        processed_at_ns BIGINT NOT NULL,
        PRIMARY KEY(stage, kind, item)
     );",
    // 1 -> 2: item durations and the run log.
    "ALTER TABLE entries ADD COLUMN duration_ms BIGINT NOT NULL DEFAULT 0;
     CREATE TABLE runs(
        id BIGSERIAL PRIMARY KEY,
        stage TEXT NOT NULL,
        started_at_ns BIGINT NOT NULL,
        finished_at_ns BIGINT,
        summary TEXT NOT NULL DEFAULT '{}',
        exit_code INTEGER
     );
     CREATE INDEX runs_stage ON runs(stage, id);",
    // 2 -> 3: the output-folder cache.
    "CREATE TABLE output_dirs(
        stage TEXT NOT NULL,
        dir TEXT NOT NULL,
        mtime_ns BIGINT NOT NULL,
        ctime_ns BIGINT NOT NULL,
        ino BIGINT NOT NULL,
        observed_at_ns BIGINT NOT NULL,
        PRIMARY KEY(stage, dir)
     );",
    // 3 -> 4: ingestion: bookmarks, windows, leases.
    "CREATE TABLE bookmarks(
        source TEXT PRIMARY KEY,
        last_end_us BIGINT NOT NULL,
        horizon BIGINT
     );
     CREATE TABLE windows(
        source TEXT NOT NULL,
        start_us BIGINT NOT NULL,
        end_us BIGINT NOT NULL,
        status TEXT NOT NULL,
        rows BIGINT NOT NULL,
        files TEXT NOT NULL,
        duration_ms BIGINT NOT NULL,
        token TEXT NOT NULL,
        recipe TEXT NOT NULL,
        updated_at_ns BIGINT NOT NULL,
        error TEXT,
        extra TEXT NOT NULL,
        PRIMARY KEY(source, start_us)
     );
     CREATE TABLE leases(
        name TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        host TEXT NOT NULL,
        pid BIGINT NOT NULL,
        acquired_at_ns BIGINT NOT NULL,
        expires_at_ns BIGINT NOT NULL,
        token BIGINT NOT NULL
     );",
    // 4 -> 5: the work queue and the fleet's processes.
    concat!(work_sql!(), "CREATE SEQUENCE work_token;"),
    // 5 -> 6: observed dependency sets (issue 24).
    crate::DEPS_SQL,
    // 6 -> 7: nothing. SQLite's manifest tokens validate snapshots of a
    // local file; a shared store is read by many machines, each its own
    // way, and keeps none. The step keeps both stores' versions one
    // numbering.
    "SELECT 1;",
    // 7 -> 8: nothing. SQLite keeps each window's head apart for plans
    // over landed windows (issue 49); a shared store's `window_heads`
    // reads the whole records (the trait's default), its plans being few
    // beside its runs.
    "SELECT 1;",
    // 8 -> 9: nothing. SQLite's window tokens validate snapshots of window
    // heads in a local file; a shared store keeps none (as 6 -> 7).
    "SELECT 1;",
];

/// The schema version this highwater writes; equal to SQLite's.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// A key for `pg_advisory_xact_lock` while migrating ("hw-migr").
const MIGRATE_LOCK_KEY: i64 = 0x0068_772d_6d69_6772;

/// The server's clock in nanoseconds since the epoch, as SQL.
const NOW_NS: &str = "(extract(epoch from clock_timestamp()) * 1e9)::bigint";

pub struct PgStore {
    /// In a cell: reads take `&self` as the trait says, and a store is
    /// used by one thread at a time (`Send`, not `Sync`).
    client: std::cell::RefCell<Client>,
    /// The name of the variable the URL came from: what errors show.
    what: String,
}

impl PgStore {
    /// Connects with the URL in environment variable `var` and migrates the
    /// schema forward.
    pub fn open_env(var: &str) -> Result<PgStore, StoreError> {
        let url = std::env::var(var).map_err(|_| StoreError::NoUrl {
            var: var.to_string(),
        })?;
        Self::open(&url, var)
    }

    /// Connects with `url`; `what` names it in errors instead of the URL.
    pub fn open(url: &str, what: &str) -> Result<PgStore, StoreError> {
        Self::open_at(url, what, SCHEMA_VERSION)
    }

    #[doc(hidden)]
    pub fn open_at(url: &str, what: &str, version: u32) -> Result<PgStore, StoreError> {
        assert!(version <= SCHEMA_VERSION);
        let client = Client::connect(url, NoTls).map_err(|source| StoreError::Pg {
            what: what.to_string(),
            source,
        })?;
        let mut s = PgStore {
            client: std::cell::RefCell::new(client),
            what: what.to_string(),
        };
        s.migrate(version)?;
        Ok(s)
    }

    fn enqueue_with(
        &mut self,
        stage: &str,
        batch: &Batch,
        items: &[(String, String)],
        fence: &Fence,
        plan: Option<&QueuePlan>,
    ) -> Result<WindowCommit, StoreError> {
        let plan_text = plan.map(|p| serde_json::to_string(p).expect("a plan is plain data"));
        self.fenced(fence, |tx| {
            if let Some(text) = &plan_text {
                tx.execute(
                    "INSERT INTO meta(key, value) VALUES('queue:' || $1, $2)
                     ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    &[&stage, text],
                )?;
            }
            // Earlier plans' rows are history now: the stage had nothing
            // pending when this plan began (the planner checks under the
            // plan lease), so only done rows remain.
            tx.execute(
                "DELETE FROM work WHERE stage = $1 AND state = 'done'",
                &[&stage],
            )?;
            apply_batch(tx, batch)?;
            let ins = tx.prepare(
                "INSERT INTO work(stage, item, state, token, claims, payload)
                 VALUES($1, $2, 'todo', 0, 0, $3)",
            )?;
            for (item, payload) in items {
                tx.execute(&ins, &[&stage, item, payload])?;
            }
            Ok(WindowCommit::Done)
        })
    }

    fn claim_with(
        &mut self,
        stage: &str,
        owner: &str,
        n: usize,
        lease_ns: i64,
        recipe: Option<&str>,
    ) -> Result<Vec<Claim>, StoreError> {
        // One statement: pick unclaimed rows and rows whose claim expired,
        // skipping rows another claimer has locked, and give each a new,
        // globally increasing token. With `recipe`, only while the stage's
        // plan has it (a plan queued before plans were recorded: anyone's);
        // the plan row and its items commit together, so one statement
        // never sees one without the other.
        let sql = format!(
            "WITH picked AS (
                SELECT stage, item, state AS was FROM work
                WHERE stage = $1 AND (state = 'todo' OR (state = 'claimed' AND lease_until_ns <= {NOW_NS}))
                AND ($5::text IS NULL
                     OR coalesce((SELECT value::json->>'recipe' FROM meta
                                  WHERE key = 'queue:' || $1), $5) = $5)
                ORDER BY item LIMIT $2 FOR UPDATE SKIP LOCKED)
             UPDATE work w SET state = 'claimed', owner = $3, token = nextval('work_token'),
                lease_until_ns = {NOW_NS} + $4, claims = w.claims + 1
             FROM picked WHERE w.stage = picked.stage AND w.item = picked.item
             RETURNING w.item, w.token, w.payload, picked.was = 'claimed'"
        );
        let rows = self
            .client
            .borrow_mut()
            .query(&sql, &[&stage, &(n as i64), &owner, &lease_ns, &recipe])
            .map_err(|e| self.err(e))?;
        let claims: Vec<Claim> = rows
            .iter()
            .map(|r| Claim {
                item: r.get(0),
                token: r.get(1),
                payload: r.get(2),
                takeover: r.get(3),
            })
            .collect();
        let takeovers = claims.iter().filter(|c| c.takeover).count() as i64;
        if !claims.is_empty() {
            self.client
                .borrow_mut()
                .execute(
                    "UPDATE processes SET claimed = claimed + $2, takeovers = takeovers + $3
                     WHERE owner = $1",
                    &[&owner, &(claims.len() as i64), &takeovers],
                )
                .map_err(|e| self.err(e))?;
        }
        Ok(claims)
    }

    fn err(&self, source: postgres::Error) -> StoreError {
        StoreError::Pg {
            what: self.what.clone(),
            source,
        }
    }

    fn version_in(tx: &mut Transaction<'_>) -> Result<u32, postgres::Error> {
        let has_meta: bool = tx
            .query_one("SELECT to_regclass('meta') IS NOT NULL", &[])?
            .get(0);
        if !has_meta {
            return Ok(0);
        }
        Ok(tx
            .query_opt("SELECT value FROM meta WHERE key = 'schema_version'", &[])?
            .and_then(|r| r.get::<_, String>(0).parse().ok())
            .unwrap_or(0))
    }

    fn migrate(&mut self, target: u32) -> Result<(), StoreError> {
        let what = self.what.clone();
        let err = |source| StoreError::Pg {
            what: what.clone(),
            source,
        };
        loop {
            let mut tx = self.client.get_mut().transaction().map_err(err)?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATE_LOCK_KEY])
                .map_err(err)?;
            let v = Self::version_in(&mut tx).map_err(err)?;
            if v > SCHEMA_VERSION {
                return Err(StoreError::TooNew {
                    path: what.clone().into(),
                    found: v,
                    known: SCHEMA_VERSION,
                });
            }
            if v >= target {
                return Ok(());
            }
            tx.batch_execute(MIGRATIONS[v as usize]).map_err(err)?;
            tx.execute(
                "INSERT INTO meta(key, value) VALUES('schema_version', $1)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                &[&(v + 1).to_string()],
            )
            .map_err(err)?;
            tx.commit().map_err(err)?;
        }
    }

    fn row_to_entry(&self, row: &postgres::Row) -> Result<(String, Entry), StoreError> {
        let stage: String = row.get(14);
        let item: String = row.get(1);
        let corrupt = |what: String| StoreError::Corrupt {
            path: self.what.clone().into(),
            stage: stage.clone(),
            item: item.clone(),
            what,
        };
        let kind = match row.get::<_, &str>(0) {
            "item" => EntryKind::Item,
            "member" => EntryKind::Member,
            other => return Err(corrupt(format!("unknown kind {other:?}"))),
        };
        let status = match row.get::<_, &str>(12) {
            "ok" => Status::Ok,
            "failed" => Status::Failed,
            other => return Err(corrupt(format!("unknown status {other:?}"))),
        };
        let size: i64 = row.get(3);
        if size < 0 {
            return Err(corrupt(format!("negative size {size}")));
        }
        let duration: i64 = row.get(15);
        let entry = Entry {
            kind,
            item: item.clone(),
            digest: row.get::<_, Option<&str>>(2).and_then(Digest::parse),
            stat: Stat {
                size: size as u64,
                mtime_ns: row.get(4),
                ctime_ns: row.get(5),
                ino: row.get::<_, i64>(6) as u64,
                dev: row.get::<_, i64>(7) as u64,
            },
            observed_at_ns: row.get(8),
            recipe: row.get(9),
            output: row.get(10),
            error: row.get(11),
            status,
            processed_at_ns: row.get(13),
            duration_ms: duration.max(0) as u64,
        };
        Ok((stage, entry))
    }

    fn select(
        &self,
        where_clause: &str,
        args: &[&(dyn postgres::types::ToSql + Sync)],
    ) -> Result<Vec<(String, Entry)>, StoreError> {
        let sql = format!(
            "SELECT kind, item, digest, size, mtime_ns, ctime_ns, ino, dev, observed_at_ns,
                    recipe, output, error, status, processed_at_ns, stage, duration_ms
             FROM entries {where_clause} ORDER BY stage, kind, item"
        );
        let rows = self
            .client
            .borrow_mut()
            .query(&sql, args)
            .map_err(|e| self.err(e))?;
        rows.iter().map(|r| self.row_to_entry(r)).collect()
    }

    /// Runs `body` in a transaction if the fence still holds (the lease row
    /// is locked for the transaction, so no takeover can interleave), and
    /// commits only on `Done`.
    fn fenced(
        &mut self,
        fence: &Fence,
        body: impl FnOnce(&mut Transaction<'_>) -> Result<WindowCommit, postgres::Error>,
    ) -> Result<WindowCommit, StoreError> {
        let what = self.what.clone();
        let err = |source| StoreError::Pg {
            what: what.clone(),
            source,
        };
        let mut tx = self.client.get_mut().transaction().map_err(err)?;
        let held: Option<i64> = tx
            .query_opt(
                "SELECT token FROM leases WHERE name = $1 FOR UPDATE",
                &[&fence.name],
            )
            .map_err(err)?
            .map(|r| r.get(0));
        if held != Some(fence.token) {
            return Ok(WindowCommit::Fenced);
        }
        let outcome = body(&mut tx).map_err(err)?;
        if outcome == WindowCommit::Done {
            tx.commit().map_err(err)?;
        }
        Ok(outcome)
    }

    fn runs_where(&self, clause: &str) -> Result<Vec<RunRecord>, StoreError> {
        let sql = format!(
            "SELECT id, stage, started_at_ns, finished_at_ns, summary, exit_code FROM runs {clause}"
        );
        let rows = self
            .client
            .borrow_mut()
            .query(&sql, &[])
            .map_err(|e| self.err(e))?;
        Ok(rows
            .iter()
            .map(|r| RunRecord {
                id: r.get(0),
                stage: r.get(1),
                started_at_ns: r.get(2),
                finished_at_ns: r.get(3),
                summary: serde_json::from_str(r.get::<_, &str>(4))
                    .unwrap_or(serde_json::Value::Null),
                exit_code: r.get(5),
            })
            .collect())
    }

    /// Writes a dump into this store in one transaction: the target of
    /// `state migrate`. Refuses a store that already holds state, so that
    /// nothing in it is overwritten or mixed.
    pub fn restore(&mut self, d: &crate::StateDump) -> Result<(), StoreError> {
        let what = self.what.clone();
        let err = |source| StoreError::Pg {
            what: what.clone(),
            source,
        };
        let mut tx = self.client.get_mut().transaction().map_err(err)?;
        let held: i64 = tx
            .query_one(
                "SELECT (SELECT count(*) FROM entries) + (SELECT count(*) FROM windows)
                      + (SELECT count(*) FROM bookmarks) + (SELECT count(*) FROM runs)",
                &[],
            )
            .map_err(err)?
            .get(0);
        if held > 0 {
            return Err(StoreError::NotEmpty {
                what: what.clone(),
                rows: held,
            });
        }
        let mut dirs: std::collections::BTreeMap<String, Vec<DirRecord>> = Default::default();
        for (stage, dr) in &d.dirs {
            dirs.entry(stage.clone()).or_default().push(dr.clone());
        }
        apply_batch(
            &mut tx,
            &Batch {
                upserts: d.entries.clone(),
                deletes: Vec::new(),
                dirs: dirs.into_iter().collect(),
                deps: d
                    .deps
                    .iter()
                    .map(|(s, i, id)| (s.clone(), i.clone(), Some(id.clone())))
                    .collect(),
                dep_sets: d.dep_sets.clone(),
            },
        )
        .map_err(err)?;
        for r in &d.runs {
            tx.execute(
                "INSERT INTO runs(id, stage, started_at_ns, finished_at_ns, summary, exit_code)
                 VALUES($1, $2, $3, $4, $5, $6)",
                &[
                    &r.id,
                    &r.stage,
                    &r.started_at_ns,
                    &r.finished_at_ns,
                    &r.summary.to_string(),
                    &r.exit_code,
                ],
            )
            .map_err(err)?;
        }
        // Run ids go on from the copied ones.
        tx.execute(
            "SELECT setval('runs_id_seq', GREATEST((SELECT max(id) FROM runs), 1))",
            &[],
        )
        .map_err(err)?;
        for b in &d.bookmarks {
            tx.execute(
                "INSERT INTO bookmarks(source, last_end_us, horizon) VALUES($1, $2, $3)",
                &[&b.source, &b.last_end_us, &b.horizon],
            )
            .map_err(err)?;
        }
        for w in &d.windows {
            put_window(&mut tx, w).map_err(err)?;
        }
        tx.commit().map_err(err)
    }

    /// Who holds lease `name` now (expired or not), if anyone.
    pub fn lease(&self, name: &str) -> Result<Option<Lease>, StoreError> {
        let row = self
            .client
            .borrow_mut()
            .query_opt(
                "SELECT owner, host, pid, acquired_at_ns, expires_at_ns, token FROM leases WHERE name = $1",
                &[&name],
            )
            .map_err(|e| self.err(e))?;
        Ok(row.map(|r| lease_of(name, &r)))
    }
}

fn lease_of(name: &str, r: &postgres::Row) -> Lease {
    Lease {
        name: name.to_string(),
        owner: r.get(0),
        host: r.get(1),
        pid: r.get(2),
        acquired_at_ns: r.get(3),
        expires_at_ns: r.get(4),
        token: r.get(5),
    }
}

fn upsert_entries(
    tx: &mut Transaction<'_>,
    upserts: &[(String, Entry)],
) -> Result<(), postgres::Error> {
    if upserts.is_empty() {
        return Ok(());
    }
    let up = tx.prepare(
        "INSERT INTO entries(stage, kind, item, digest, size, mtime_ns,
            ctime_ns, ino, dev, observed_at_ns, recipe, output, status, error,
            processed_at_ns, duration_ms)
         VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
         ON CONFLICT(stage, kind, item) DO UPDATE SET
            digest = excluded.digest, size = excluded.size, mtime_ns = excluded.mtime_ns,
            ctime_ns = excluded.ctime_ns, ino = excluded.ino, dev = excluded.dev,
            observed_at_ns = excluded.observed_at_ns, recipe = excluded.recipe,
            output = excluded.output, status = excluded.status, error = excluded.error,
            processed_at_ns = excluded.processed_at_ns, duration_ms = excluded.duration_ms",
    )?;
    for (stage, e) in upserts {
        assert!(!e.item.is_empty(), "empty item name in stage {stage}");
        assert!(e.status == Status::Failed || e.error.is_none());
        tx.execute(
            &up,
            &[
                stage,
                &e.kind.as_str(),
                &e.item,
                &e.digest.as_ref().map(|d| d.to_string()),
                &(e.stat.size as i64),
                &e.stat.mtime_ns,
                &e.stat.ctime_ns,
                &(e.stat.ino as i64),
                &(e.stat.dev as i64),
                &e.observed_at_ns,
                &e.recipe,
                &e.output,
                &e.status.as_str(),
                &e.error,
                &e.processed_at_ns,
                &(e.duration_ms as i64),
            ],
        )?;
    }
    Ok(())
}

fn apply_batch(tx: &mut Transaction<'_>, batch: &Batch) -> Result<(), postgres::Error> {
    if !batch.deletes.is_empty() {
        let del = tx.prepare("DELETE FROM entries WHERE stage = $1 AND kind = $2 AND item = $3")?;
        let del_deps = tx.prepare("DELETE FROM item_deps WHERE stage = $1 AND item = $2")?;
        for (stage, kind, item) in &batch.deletes {
            tx.execute(&del, &[stage, &kind.as_str(), item])?;
            if *kind == EntryKind::Item {
                tx.execute(&del_deps, &[stage, item])?;
            }
        }
    }
    if !batch.dep_sets.is_empty() {
        let put =
            tx.prepare("INSERT INTO dep_sets(id, body) VALUES($1, $2) ON CONFLICT(id) DO NOTHING")?;
        for (id, body) in &batch.dep_sets {
            tx.execute(&put, &[id, body])?;
        }
    }
    if !batch.deps.is_empty() {
        let put = tx.prepare(
            "INSERT INTO item_deps(stage, item, set_id) VALUES($1, $2, $3)
             ON CONFLICT(stage, item) DO UPDATE SET set_id = excluded.set_id",
        )?;
        let del = tx.prepare("DELETE FROM item_deps WHERE stage = $1 AND item = $2")?;
        for (stage, item, set) in &batch.deps {
            match set {
                Some(id) => tx.execute(&put, &[stage, item, id])?,
                None => tx.execute(&del, &[stage, item])?,
            };
        }
    }
    upsert_entries(tx, &batch.upserts)?;
    for (stage, dirs) in &batch.dirs {
        tx.execute("DELETE FROM output_dirs WHERE stage = $1", &[stage])?;
        let ins = tx.prepare(
            "INSERT INTO output_dirs(stage, dir, mtime_ns, ctime_ns, ino, observed_at_ns)
             VALUES($1, $2, $3, $4, $5, $6)",
        )?;
        for d in dirs {
            tx.execute(
                &ins,
                &[
                    stage,
                    &d.dir,
                    &d.mtime_ns,
                    &d.ctime_ns,
                    &(d.ino as i64),
                    &d.observed_at_ns,
                ],
            )?;
        }
    }
    Ok(())
}

fn put_window(tx: &mut Transaction<'_>, r: &WindowRecord) -> Result<u64, postgres::Error> {
    tx.execute(
        "INSERT INTO windows(source, start_us, end_us, status, rows, files,
            duration_ms, token, recipe, updated_at_ns, error, extra)
         VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
         ON CONFLICT(source, start_us) DO UPDATE SET end_us = excluded.end_us,
            status = excluded.status, rows = excluded.rows, files = excluded.files,
            duration_ms = excluded.duration_ms, token = excluded.token,
            recipe = excluded.recipe, updated_at_ns = excluded.updated_at_ns,
            error = excluded.error, extra = excluded.extra",
        &[
            &r.source,
            &r.start_us,
            &r.end_us,
            &r.status.as_str(),
            &r.rows,
            &r.files.to_string(),
            &r.duration_ms,
            &r.token,
            &r.recipe,
            &r.updated_at_ns,
            &r.error,
            &r.extra.to_string(),
        ],
    )
}

impl StateStore for PgStore {
    fn load(&self, stage: &str) -> Result<StageEntries, StoreError> {
        let mut items = Vec::new();
        let mut members = Vec::new();
        for (_, e) in self.select("WHERE stage = $1", &[&stage])? {
            match e.kind {
                EntryKind::Item => items.push(e),
                EntryKind::Member => members.push(e),
            };
        }
        let rows = self
            .client
            .borrow_mut()
            .query(
                "SELECT dir, mtime_ns, ctime_ns, ino, observed_at_ns FROM output_dirs WHERE stage = $1",
                &[&stage],
            )
            .map_err(|e| self.err(e))?;
        let dirs = rows
            .iter()
            .map(|r| {
                let d = DirRecord {
                    dir: r.get(0),
                    mtime_ns: r.get(1),
                    ctime_ns: r.get(2),
                    ino: r.get::<_, i64>(3) as u64,
                    observed_at_ns: r.get(4),
                };
                (d.dir.clone(), d)
            })
            .collect();
        // Sorted here, by bytes: the server's collation may order names
        // otherwise.
        let items: highwater_core::Entries = items.into_iter().collect();
        let mut links: Vec<(String, String)> = self
            .client
            .borrow_mut()
            .query(
                "SELECT item, set_id FROM item_deps WHERE stage = $1",
                &[&stage],
            )
            .map_err(|e| self.err(e))?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        links.sort_unstable();
        let mut linker = crate::DepLinker::new(&items);
        for (item, id) in &links {
            linker.push(item, id);
        }
        let (item_sets, ids) = linker.finish();
        let mut dep_sets = Vec::with_capacity(ids.len());
        for (id, item) in ids {
            let row = self
                .client
                .borrow_mut()
                .query_opt("SELECT body FROM dep_sets WHERE id = $1", &[&id])
                .map_err(|e| self.err(e))?;
            let Some(row) = row else {
                return Err(StoreError::Corrupt {
                    path: std::path::PathBuf::from(&self.what),
                    stage: stage.to_string(),
                    item,
                    what: format!("its dependency set {id} is not stored"),
                });
            };
            dep_sets.push((id, row.get(0)));
        }
        Ok(StageEntries {
            items,
            members: members.into_iter().collect(),
            dirs,
            item_sets,
            dep_sets,
        })
    }

    fn commit(&mut self, batch: &Batch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let what = self.what.clone();
        let err = |source| StoreError::Pg {
            what: what.clone(),
            source,
        };
        let mut tx = self.client.get_mut().transaction().map_err(err)?;
        apply_batch(&mut tx, batch).map_err(err)?;
        tx.commit().map_err(err)
    }

    fn begin_run(&mut self, stage: &str, started_at_ns: i64) -> Result<i64, StoreError> {
        let r = self
            .client
            .borrow_mut()
            .query_one(
                "INSERT INTO runs(stage, started_at_ns) VALUES($1, $2) RETURNING id",
                &[&stage, &started_at_ns],
            )
            .map_err(|e| self.err(e))?;
        Ok(r.get(0))
    }

    fn finish_run(
        &mut self,
        run: i64,
        finished_at_ns: i64,
        summary: &serde_json::Value,
        exit_code: i32,
    ) -> Result<(), StoreError> {
        let n = self
            .client
            .borrow_mut()
            .execute(
                "UPDATE runs SET finished_at_ns = $2, summary = $3, exit_code = $4 WHERE id = $1",
                &[&run, &finished_at_ns, &summary.to_string(), &exit_code],
            )
            .map_err(|e| self.err(e))?;
        assert_eq!(n, 1, "run {run} was begun by this store");
        Ok(())
    }

    fn last_runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.runs_where("WHERE id IN (SELECT max(id) FROM runs GROUP BY stage) ORDER BY stage")
    }

    fn unfinished_runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.runs_where("WHERE finished_at_ns IS NULL ORDER BY id DESC")
    }

    fn export(&self) -> Result<Vec<(String, Entry)>, StoreError> {
        self.select("", &[])
    }

    fn schema_version(&self) -> Result<u32, StoreError> {
        let what = self.what.clone();
        let err = |source| StoreError::Pg {
            what: what.clone(),
            source,
        };
        let mut c = self.client.borrow_mut();
        let mut tx = c.transaction().map_err(err)?;
        Self::version_in(&mut tx).map_err(err)
    }

    fn bookmark(&self, source: &str) -> Result<Option<Bookmark>, StoreError> {
        let row = self
            .client
            .borrow_mut()
            .query_opt(
                "SELECT last_end_us, horizon FROM bookmarks WHERE source = $1",
                &[&source],
            )
            .map_err(|e| self.err(e))?;
        Ok(row.map(|r| Bookmark {
            source: source.to_string(),
            last_end_us: r.get(0),
            horizon: r.get(1),
        }))
    }

    fn windows(&self, source: &str) -> Result<Vec<WindowRecord>, StoreError> {
        let rows = self
            .client
            .borrow_mut()
            .query(
                "SELECT start_us, end_us, status, rows, files, duration_ms, token, recipe,
                        updated_at_ns, error, extra
                 FROM windows WHERE source = $1 ORDER BY start_us",
                &[&source],
            )
            .map_err(|e| self.err(e))?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let start_us: i64 = r.get(0);
            let end_us: i64 = r.get(1);
            let corrupt = |what: String| StoreError::Corrupt {
                path: self.what.clone().into(),
                stage: source.to_string(),
                item: format!("window starting {start_us}"),
                what,
            };
            let status = WindowStatus::parse(r.get::<_, &str>(2)).ok_or_else(|| {
                corrupt(format!("unknown window status `{}`", r.get::<_, &str>(2)))
            })?;
            if end_us <= start_us {
                return Err(corrupt("window end is not after its start".into()));
            }
            out.push(WindowRecord {
                source: source.to_string(),
                start_us,
                end_us,
                status,
                rows: r.get(3),
                files: serde_json::from_str(r.get::<_, &str>(4))
                    .map_err(|e| corrupt(e.to_string()))?,
                duration_ms: r.get(5),
                token: r.get(6),
                recipe: r.get(7),
                updated_at_ns: r.get(8),
                error: r.get(9),
                extra: serde_json::from_str(r.get::<_, &str>(10))
                    .map_err(|e| corrupt(e.to_string()))?,
            });
        }
        Ok(out)
    }

    fn commit_window(
        &mut self,
        record: &WindowRecord,
        advance: Option<(Option<i64>, &Bookmark)>,
        fence: &Fence,
    ) -> Result<WindowCommit, StoreError> {
        assert!(record.end_us > record.start_us, "window bounds are ours");
        self.fenced(fence, |tx| {
            if let Some((expected, new)) = advance {
                assert_eq!(new.source, record.source);
                let changed = match expected {
                    Some(prev) => tx.execute(
                        "UPDATE bookmarks SET last_end_us = $2, horizon = $3
                         WHERE source = $1 AND last_end_us = $4",
                        &[&new.source, &new.last_end_us, &new.horizon, &prev],
                    )?,
                    None => tx.execute(
                        "INSERT INTO bookmarks(source, last_end_us, horizon) VALUES($1, $2, $3)
                         ON CONFLICT(source) DO NOTHING",
                        &[&new.source, &new.last_end_us, &new.horizon],
                    )?,
                };
                if changed != 1 {
                    return Ok(WindowCommit::BookmarkMoved);
                }
            }
            put_window(tx, record)?;
            Ok(WindowCommit::Done)
        })
    }

    fn commit_windows(
        &mut self,
        records: &[WindowRecord],
        fence: &Fence,
    ) -> Result<WindowCommit, StoreError> {
        self.fenced(fence, |tx| {
            for r in records {
                assert!(r.end_us > r.start_us, "window bounds are ours");
                put_window(tx, r)?;
            }
            Ok(WindowCommit::Done)
        })
    }

    fn advance_horizon(
        &mut self,
        source: &str,
        expected_end: i64,
        horizon: i64,
        fence: &Fence,
    ) -> Result<WindowCommit, StoreError> {
        self.fenced(fence, |tx| {
            let n = tx.execute(
                "UPDATE bookmarks SET horizon = $3 WHERE source = $1 AND last_end_us = $2",
                &[&source, &expected_end, &horizon],
            )?;
            Ok(if n == 1 {
                WindowCommit::Done
            } else {
                WindowCommit::BookmarkMoved
            })
        })
    }

    fn acquire_lease(
        &mut self,
        name: &str,
        owner: &str,
        host: &str,
        pid: i64,
        now_ns: i64,
        duration_ns: i64,
    ) -> Result<LeaseOutcome, StoreError> {
        assert!(duration_ns > 0);
        let what = self.what.clone();
        let err = |source| StoreError::Pg {
            what: what.clone(),
            source,
        };
        let mut tx = self.client.get_mut().transaction().map_err(err)?;
        // The row is created first (if missing) so that two first
        // acquisitions serialise on its lock instead of racing an insert.
        tx.execute(
            "INSERT INTO leases(name, owner, host, pid, acquired_at_ns, expires_at_ns, token)
             VALUES($1, '', '', 0, 0, 0, 0) ON CONFLICT(name) DO NOTHING",
            &[&name],
        )
        .map_err(err)?;
        let r = tx
            .query_one(
                "SELECT owner, host, pid, acquired_at_ns, expires_at_ns, token FROM leases
                 WHERE name = $1 FOR UPDATE",
                &[&name],
            )
            .map_err(err)?;
        let current = lease_of(name, &r);
        if current.owner != owner && current.expires_at_ns > now_ns {
            return Ok(LeaseOutcome::Held(current));
        }
        let token = if current.owner == owner {
            current.token
        } else {
            current.token + 1
        };
        let lease = Lease {
            name: name.to_string(),
            owner: owner.to_string(),
            host: host.to_string(),
            pid,
            acquired_at_ns: now_ns,
            expires_at_ns: now_ns.saturating_add(duration_ns),
            token,
        };
        tx.execute(
            "UPDATE leases SET owner = $2, host = $3, pid = $4, acquired_at_ns = $5,
                expires_at_ns = $6, token = $7 WHERE name = $1",
            &[
                &lease.name,
                &lease.owner,
                &lease.host,
                &lease.pid,
                &lease.acquired_at_ns,
                &lease.expires_at_ns,
                &lease.token,
            ],
        )
        .map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(LeaseOutcome::Acquired(lease))
    }

    fn renew_lease(
        &mut self,
        fence: &Fence,
        now_ns: i64,
        duration_ns: i64,
    ) -> Result<bool, StoreError> {
        let n = self
            .client
            .borrow_mut()
            .execute(
                "UPDATE leases SET expires_at_ns = $3 WHERE name = $1 AND token = $2",
                &[
                    &fence.name,
                    &fence.token,
                    &now_ns.saturating_add(duration_ns),
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(n == 1)
    }

    fn release_lease(&mut self, fence: &Fence) -> Result<(), StoreError> {
        self.client
            .borrow_mut()
            .execute(
                "UPDATE leases SET expires_at_ns = 0 WHERE name = $1 AND token = $2",
                &[&fence.name, &fence.token],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    fn lease(&self, name: &str) -> Result<Option<Lease>, StoreError> {
        PgStore::lease(self, name)
    }

    fn dump(&self) -> Result<crate::StateDump, StoreError> {
        let mut d = crate::StateDump {
            entries: self.export()?,
            runs: self.runs_where("ORDER BY id")?,
            ..Default::default()
        };
        let rows = self
            .client
            .borrow_mut()
            .query(
                "SELECT stage, dir, mtime_ns, ctime_ns, ino, observed_at_ns FROM output_dirs ORDER BY stage, dir",
                &[],
            )
            .map_err(|e| self.err(e))?;
        d.dirs = rows
            .iter()
            .map(|r| {
                (
                    r.get(0),
                    DirRecord {
                        dir: r.get(1),
                        mtime_ns: r.get(2),
                        ctime_ns: r.get(3),
                        ino: r.get::<_, i64>(4) as u64,
                        observed_at_ns: r.get(5),
                    },
                )
            })
            .collect();
        let rows = self
            .client
            .borrow_mut()
            .query(
                "SELECT source FROM bookmarks UNION SELECT source FROM windows ORDER BY 1",
                &[],
            )
            .map_err(|e| self.err(e))?;
        for r in rows {
            let src: String = r.get(0);
            d.bookmarks.extend(self.bookmark(&src)?);
            d.windows.extend(self.windows(&src)?);
        }
        let rows = self
            .client
            .borrow_mut()
            .query(
                "SELECT stage, item, set_id FROM item_deps ORDER BY stage, item",
                &[],
            )
            .map_err(|e| self.err(e))?;
        d.deps = rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        let rows = self
            .client
            .borrow_mut()
            .query("SELECT id, body FROM dep_sets ORDER BY id", &[])
            .map_err(|e| self.err(e))?;
        d.dep_sets = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        Ok(d)
    }

    fn leases(&self, prefix: &str) -> Result<Vec<Lease>, StoreError> {
        let rows = self
            .client
            .borrow_mut()
            .query(
                "SELECT owner, host, pid, acquired_at_ns, expires_at_ns, token, name FROM leases
                 WHERE left(name, length($1)) = $1 ORDER BY name",
                &[&prefix],
            )
            .map_err(|e| self.err(e))?;
        Ok(rows.iter().map(|r| lease_of(r.get(6), r)).collect())
    }

    fn as_queue(&mut self) -> Option<&mut dyn WorkQueue> {
        Some(self)
    }
}

/// The advisory lock between recording dependency sets and pruning them
/// ("hwdeps").
const DEP_SETS_LOCK: i64 = 0x6877_6465_7073;

impl WorkQueue for PgStore {
    fn pending(&mut self, stage: &str) -> Result<QueueCounts, StoreError> {
        let sql = format!(
            "SELECT count(*) FILTER (WHERE state = 'todo'),
                    count(*) FILTER (WHERE state = 'claimed' AND lease_until_ns > {NOW_NS}),
                    count(*) FILTER (WHERE state = 'claimed' AND lease_until_ns <= {NOW_NS}),
                    count(*) FILTER (WHERE state = 'done'),
                    count(*) FILTER (WHERE claims > 1)
             FROM work WHERE stage = $1"
        );
        let r = self
            .client
            .borrow_mut()
            .query_one(&sql, &[&stage])
            .map_err(|e| self.err(e))?;
        Ok(QueueCounts {
            todo: r.get::<_, i64>(0) as u64,
            claimed: r.get::<_, i64>(1) as u64,
            expired: r.get::<_, i64>(2) as u64,
            done: r.get::<_, i64>(3) as u64,
            retried: r.get::<_, i64>(4) as u64,
        })
    }

    fn enqueue(
        &mut self,
        stage: &str,
        batch: &Batch,
        items: &[(String, String)],
        fence: &Fence,
    ) -> Result<WindowCommit, StoreError> {
        self.enqueue_with(stage, batch, items, fence, None)
    }

    fn enqueue_plan(
        &mut self,
        stage: &str,
        batch: &Batch,
        items: &[(String, String)],
        fence: &Fence,
        plan: &QueuePlan,
    ) -> Result<WindowCommit, StoreError> {
        self.enqueue_with(stage, batch, items, fence, Some(plan))
    }

    fn queue_plan(&mut self, stage: &str) -> Result<Option<QueuePlan>, StoreError> {
        let sql = format!(
            "SELECT m.value,
                    ARRAY(SELECT DISTINCT p.host || ' pid ' || p.pid FROM work w
                          JOIN processes p ON p.owner = w.owner
                          WHERE w.stage = $1 AND w.state = 'claimed'
                          AND w.lease_until_ns > {NOW_NS})
             FROM meta m WHERE m.key = 'queue:' || $1"
        );
        let row = self
            .client
            .borrow_mut()
            .query_opt(&sql, &[&stage])
            .map_err(|e| self.err(e))?;
        let Some(row) = row else { return Ok(None) };
        let text: String = row.get(0);
        // Written by `enqueue_plan` only; a row that does not parse is
        // treated as no plan, so that the next plan rewrites it.
        let Ok(mut plan) = serde_json::from_str::<QueuePlan>(&text) else {
            return Ok(None);
        };
        plan.holders = row.get(1);
        Ok(Some(plan))
    }

    fn claim_recipe(
        &mut self,
        stage: &str,
        owner: &str,
        n: usize,
        lease_ns: i64,
        recipe: &str,
    ) -> Result<Vec<Claim>, StoreError> {
        self.claim_with(stage, owner, n, lease_ns, Some(recipe))
    }

    fn claim(
        &mut self,
        stage: &str,
        owner: &str,
        n: usize,
        lease_ns: i64,
    ) -> Result<Vec<Claim>, StoreError> {
        self.claim_with(stage, owner, n, lease_ns, None)
    }
    fn heartbeat(&mut self, owner: &str, lease_ns: i64) -> Result<u64, StoreError> {
        // Rows locked now are skipped: our own `complete` is moving them to
        // done (row by row, in its transaction), or another process is
        // taking them over. Waiting on them would let the two lock the
        // same rows in opposite orders: a deadlock that PostgreSQL breaks
        // by failing one of them, the completion perhaps (issue 20).
        let sql = format!(
            "WITH mine AS (SELECT stage, item FROM work
                WHERE owner = $1 AND state = 'claimed' FOR UPDATE SKIP LOCKED),
             renewed AS (UPDATE work w SET lease_until_ns = {NOW_NS} + $2
                FROM mine WHERE w.stage = mine.stage AND w.item = mine.item RETURNING 1)
             UPDATE processes SET heartbeat_at_ns = {NOW_NS} WHERE owner = $1
             RETURNING (SELECT count(*) FROM renewed)"
        );
        let r = self
            .client
            .borrow_mut()
            .query_opt(&sql, &[&owner, &lease_ns])
            .map_err(|e| self.err(e))?;
        Ok(r.map_or(0, |r| r.get::<_, i64>(0) as u64))
    }

    fn holds(
        &mut self,
        stage: &str,
        item: &str,
        token: i64,
        margin_ns: i64,
    ) -> Result<bool, StoreError> {
        let sql = format!(
            "SELECT 1 FROM work WHERE stage = $1 AND item = $2 AND token = $3
             AND state = 'claimed' AND lease_until_ns > {NOW_NS} + $4"
        );
        let r = self
            .client
            .borrow_mut()
            .query_opt(&sql, &[&stage, &item, &token, &margin_ns])
            .map_err(|e| self.err(e))?;
        Ok(r.is_some())
    }

    fn complete_observed(
        &mut self,
        stage: &str,
        owner: &str,
        done: &[(String, i64, Option<Entry>)],
        deps: Option<&DoneDeps>,
        refused: u64,
    ) -> Result<Vec<bool>, StoreError> {
        let what = self.what.clone();
        let err = |source| StoreError::Pg {
            what: what.clone(),
            source,
        };
        let mut tx = self.client.get_mut().transaction().map_err(err)?;
        let fin = tx
            .prepare(
                "UPDATE work SET state = 'done', owner = NULL, lease_until_ns = NULL
                 WHERE stage = $1 AND item = $2 AND token = $3 AND state = 'claimed'",
            )
            .map_err(err)?;
        let mut kept = Vec::with_capacity(done.len());
        let mut upserts = Vec::new();
        for (item, token, entry) in done {
            // The fence: only the current token's row moves to done, and
            // only then is the entry written, in the same transaction.
            let n = tx.execute(&fin, &[&stage, item, token]).map_err(err)?;
            kept.push(n == 1);
            if let (1, Some(entry)) = (n, entry) {
                upserts.push((stage.to_string(), entry.clone()));
            }
        }
        upsert_entries(&mut tx, &upserts).map_err(err)?;
        if let Some(d) = deps {
            // Shared against `prune_dep_sets`: a set this transaction finds
            // already stored (ON CONFLICT DO NOTHING takes no row lock) and
            // names must not be pruned before it commits.
            tx.execute("SELECT pg_advisory_xact_lock_shared($1)", &[&DEP_SETS_LOCK])
                .map_err(err)?;
            // A fenced result records no dependencies either: the item's
            // set stays the one of the entry that stays.
            let batch = Batch {
                deps: d
                    .sets
                    .iter()
                    .zip(done)
                    .zip(&kept)
                    .filter(|(_, k)| **k)
                    .map(|((set, (item, _, _)), _)| (stage.to_string(), item.clone(), set.clone()))
                    .collect(),
                dep_sets: d.bodies.clone(),
                ..Batch::default()
            };
            apply_batch(&mut tx, &batch).map_err(err)?;
        }
        let fenced = (kept.iter().filter(|k| !**k).count() as u64 + refused) as i64;
        tx.execute(
            "UPDATE processes SET done = done + $2, fenced = fenced + $3 WHERE owner = $1",
            &[
                &owner,
                &(kept.iter().filter(|k| **k).count() as i64),
                &fenced,
            ],
        )
        .map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(kept)
    }

    fn prune_dep_sets(&mut self) -> Result<u64, StoreError> {
        let what = self.what.clone();
        let err = |source| StoreError::Pg {
            what: what.clone(),
            source,
        };
        let mut tx = self.client.get_mut().transaction().map_err(err)?;
        // Exclusive: every completion naming a set has committed (and is
        // seen by the DELETE's snapshot, taken after the lock) or waits.
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&DEP_SETS_LOCK])
            .map_err(err)?;
        let n = tx
            .execute(
                "DELETE FROM dep_sets s WHERE NOT EXISTS
                 (SELECT 1 FROM item_deps d WHERE d.set_id = s.id)",
                &[],
            )
            .map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(n)
    }

    fn register(&mut self, p: &FleetProcess) -> Result<(), StoreError> {
        let sql = format!(
            "INSERT INTO processes(owner, host, pid, command, started_at_ns, heartbeat_at_ns,
                claimed, done, takeovers, fenced)
             VALUES($1, $2, $3, $4, {NOW_NS}, {NOW_NS}, 0, 0, 0, 0)
             ON CONFLICT(owner) DO UPDATE SET heartbeat_at_ns = {NOW_NS}"
        );
        self.client
            .borrow_mut()
            .execute(&sql, &[&p.owner, &p.host, &p.pid, &p.command])
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    fn finish(&mut self, owner: &str) -> Result<(), StoreError> {
        let sql = format!("UPDATE processes SET finished_at_ns = {NOW_NS} WHERE owner = $1");
        self.client
            .borrow_mut()
            .execute(&sql, &[&owner])
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    fn fleet(&mut self) -> Result<Vec<FleetProcess>, StoreError> {
        let sql = format!(
            "SELECT owner, host, pid, command, started_at_ns, heartbeat_at_ns, finished_at_ns,
                    claimed, done, takeovers, fenced,
                    (SELECT count(*) FROM work w WHERE w.owner = p.owner AND w.state = 'claimed'),
                    {NOW_NS}
             FROM processes p ORDER BY started_at_ns, owner"
        );
        let rows = self
            .client
            .borrow_mut()
            .query(&sql, &[])
            .map_err(|e| self.err(e))?;
        Ok(rows
            .iter()
            .map(|r| FleetProcess {
                owner: r.get(0),
                host: r.get(1),
                pid: r.get(2),
                command: r.get(3),
                started_at_ns: r.get(4),
                heartbeat_at_ns: r.get(5),
                finished_at_ns: r.get(6),
                claimed: r.get::<_, i64>(7) as u64,
                done: r.get::<_, i64>(8) as u64,
                takeovers: r.get::<_, i64>(9) as u64,
                fenced: r.get::<_, i64>(10) as u64,
                holding: r.get::<_, i64>(11) as u64,
                now_ns: r.get(12),
            })
            .collect())
    }
}
