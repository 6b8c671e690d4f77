//! `compact` and what ingestion does around compacted periods: publishing a
//! window into one (the period is rewritten with that window's rows
//! replaced), recovering a window whose attempt died after such a rewrite,
//! and bringing window records up to date with the periods on disk.
//!
//! Disk is the truth and records follow it: a period's folder is swapped
//! first and the window records are rewritten after, in one transaction;
//! a crash in between is repaired by [`Ingestor::reconcile`] from the
//! period's manifest, which names the token of every window it holds.

use crate::compact::{self, Input, PeriodManifest, PeriodWindow, WindowIn};
use crate::engine::{kill_self, Ingestor};
use crate::error::IngestError;
use crate::publish;
use highwater_core::window::{format_rfc3339, Window};
use highwater_store::lease::now_ns;
use highwater_store::{Fence, StateStore, WindowCommit, WindowRecord, WindowStatus};
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// What `compact` does.
#[derive(Clone, Debug)]
pub struct CompactOptions {
    pub from_us: Option<i64>,
    pub to_us: Option<i64>,
    pub now_us: i64,
    pub wait: bool,
}

/// What happened to one period.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PeriodOutcome {
    pub start: String,
    pub end: String,
    pub path: String,
    /// compacted, already (compacted before), skipped, failed.
    pub status: &'static str,
    pub windows: usize,
    pub rows: u64,
    pub files_before: usize,
    pub files_after: usize,
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub duration_ms: u64,
    pub reason: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CompactReport {
    pub source: String,
    pub periods: Vec<PeriodOutcome>,
}

impl CompactReport {
    /// Periods asked for and not compacted, failed or skipped (a window
    /// inside not published): non-zero means exit 1, since what was asked
    /// was not done.
    pub fn failed(&self) -> usize {
        self.periods
            .iter()
            .filter(|p| p.status == "failed" || p.status == "skipped")
            .count()
    }
}

fn store_of(s: &Mutex<Box<dyn StateStore>>) -> std::sync::MutexGuard<'_, Box<dyn StateStore>> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

fn failpoint(name: &str) -> bool {
    std::env::var_os("HIGHWATER_FAILPOINT").is_some_and(|v| v == name)
}

impl Ingestor {
    /// The folder of period `p`, relative and absolute.
    fn period_path(&self, p: i64) -> Result<(String, PathBuf), IngestError> {
        if self.is_delta() {
            // Inside the table: the period's files (see `delta::compact`).
            let rel = format!(
                "{}/{}",
                self.spec.output.trim_end_matches('/'),
                self.delta_period_dir(p)
            );
            let abs = self.root.join(&rel);
            return Ok((rel, abs));
        }
        let rel = self
            .spec
            .period_dir(p)
            .map_err(|message| IngestError::Schema {
                name: self.spec.name.clone(),
                message,
            })?;
        let abs = self.root.join(&rel);
        Ok((rel, abs))
    }

    /// If window `k` lies in a compacted period on disk: its entry there,
    /// and the `compacted` fact its record carries.
    pub(crate) fn compacted_window(&self, k: i64) -> Option<(PeriodWindow, serde_json::Value)> {
        self.spec.compaction.as_ref()?;
        let p = self.spec.period_of(k);
        let (rel, abs) = self.period_path(p).ok()?;
        let m = compact::read_manifest(&abs)?;
        let start = self.spec.grid.window(k).start_us;
        let pw = m.windows.iter().find(|w| w.start_us == start)?.clone();
        let info = json!({
            "period": {"start": format_rfc3339(m.start_us), "end": format_rfc3339(m.end_us)},
            "path": rel,
            "token": m.token,
            "offset": pw.offset,
            "layout_only": true,
        });
        Some((pw, info))
    }

    /// Brings published window records up to date with the compacted
    /// periods on disk (a crash between a period's swap and its records).
    pub(crate) fn reconcile(
        &self,
        store: &Mutex<Box<dyn StateStore>>,
        fence: &Fence,
    ) -> Result<(), IngestError> {
        if self.spec.compaction.is_none() {
            return Ok(());
        }
        let records = store_of(store).windows(&self.spec.name)?;
        let mut fixed = Vec::new();
        for mut r in records {
            if r.status != WindowStatus::Published {
                continue;
            }
            let k = self.spec.grid.index_of(r.start_us);
            let Some((pw, info)) = self.compacted_window(k) else {
                continue;
            };
            if pw.token == r.token && r.extra["compacted"] != info {
                r.files = json!([]);
                r.extra["digest"] = json!(pw.digest);
                r.extra["compacted"] = info;
                fixed.push(r);
            }
        }
        if !fixed.is_empty() {
            store_of(store).commit_windows(&fixed, fence)?;
        }
        Ok(())
    }

    /// Makes a staged window visible: swapped in at its own path, or, when
    /// its period is compacted, by rewriting the period with the window's
    /// rows replaced. Returns the `compacted` fact in the second case.
    pub(crate) fn publish_window(
        &self,
        k: i64,
        staging: &Path,
        abs: &Path,
        token: &str,
    ) -> Result<Option<serde_json::Value>, IngestError> {
        let period = match &self.spec.compaction {
            Some(_) => {
                let (_, pabs) = self.period_path(self.spec.period_of(k))?;
                compact::read_manifest(&pabs).map(|m| (pabs, m))
            }
            None => None,
        };
        let Some((pabs, old)) = period else {
            if self.objects.is_some() {
                self.publish_objects(k, staging, token)?;
                return Ok(None);
            }
            publish::swap_in(staging, abs)?;
            return Ok(None);
        };
        let start = self.spec.grid.window(k).start_us;
        let names = compact::parquet_files(staging)?;
        // The period's files and the window's may differ by a widening
        // (either way round): the rewritten period takes the wider one.
        let wschema = compact::schema_of(&staging.join(&names[0]))?;
        let schema = match compact::parquet_files(&pabs)?.first() {
            None => wschema,
            Some(n) => {
                let pschema = compact::schema_of(&pabs.join(n))?;
                compact::period_schema(&[pschema.clone(), wschema.clone()])
                    .or_else(|_| compact::period_schema(&[wschema, pschema]))
                    .map_err(|(_, _, why)| IngestError::Schema {
                        name: self.spec.name.clone(),
                        message: format!(
                            "window {} cannot be written into its compacted period {}: {why}; the period keeps its previous rows. Cast the column back to its old type in a `query`, or keep `[sources.{}.checks] schema = \"fail\"` (the default) so that such a window is refused before it is published",
                            self.spec.grid.window(k),
                            pabs.display(),
                            self.spec.name
                        ),
                    })?
            }
        };
        let mut ins = Vec::new();
        let mut placed = false;
        let ours = |ins: &mut Vec<WindowIn>| {
            ins.push(WindowIn {
                start_us: start,
                end_us: self.spec.grid.window(k).end_us,
                token: token.to_string(),
                input: Input::Files(staging.to_path_buf(), names.clone()),
                expect: None,
                keep: true,
            })
        };
        // The period's rows in window order, this window's range replaced
        // (or, if the period did not hold it, inserted in its place).
        for w in &old.windows {
            if !placed && w.start_us >= start {
                ours(&mut ins);
                placed = true;
            }
            ins.push(WindowIn {
                start_us: w.start_us,
                end_us: w.end_us,
                token: w.token.clone(),
                input: Input::Old(w.rows),
                expect: Some(w.digest.clone()),
                keep: w.start_us != start,
            });
        }
        if !placed {
            ours(&mut ins);
        }
        let pstaging = publish::staging_path(&pabs, token);
        std::fs::create_dir_all(&pstaging)
            .map_err(|e| IngestError::io("creating", &pstaging, e))?;
        // The old rows of the replaced window are read (to keep the stream
        // in step) and then dropped from what is written.
        let result =
            compact::write_period(&pstaging, schema, ins, Some(&pabs), self.target_bytes());
        let (written, windows) = match result {
            Ok(x) => x,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&pstaging);
                return Err(e);
            }
        };
        let manifest = PeriodManifest {
            kind: compact::KIND_COMPACTED.into(),
            source: self.spec.name.clone(),
            start_us: old.start_us,
            end_us: old.end_us,
            token: token.to_string(),
            files: written.files,
            rows: written.rows,
            windows,
        };
        compact::seal_and_swap(&pstaging, &pabs, &manifest, || Ok(true))?;
        // The window's own staging lived inside the old period's folder,
        // which the swap removed; nothing else is left of it.
        let _ = std::fs::remove_dir_all(staging);
        let pw = manifest
            .windows
            .iter()
            .find(|w| w.start_us == start)
            .expect("the window was written into its period");
        Ok(Some(json!({
            "period": {"start": format_rfc3339(manifest.start_us), "end": format_rfc3339(manifest.end_us)},
            "path": self.spec.period_dir(self.spec.period_of(k)).expect("checked above"),
            "token": manifest.token,
            "offset": pw.offset,
            "layout_only": true,
        })))
    }

    fn target_bytes(&self) -> u64 {
        self.spec
            .compaction
            .as_ref()
            .map_or(u64::MAX, |c| c.target_file_bytes)
    }

    /// `highwater compact`: rewrites the published windows of each closed
    /// period in range into files near the target size, under the lease
    /// `ingest` takes.
    pub fn compact(&self, opts: &CompactOptions) -> Result<CompactReport, IngestError> {
        if self.spec.compaction.is_none() {
            return Err(IngestError::Schema {
                name: self.spec.name.clone(),
                message: "has no [compact] section; add one, e.g. `[sources.NAME.compact]` with `into = \"1d\"`".into(),
            });
        }
        self.leased(opts.wait, |store, fence, lost| {
            self.wait_for_window_leases(store)?;
            self.recover(store, fence)?;
            self.reconcile(store, fence)?;
            self.compact_leased(opts, store, fence, lost)
        })
    }

    /// On shared state, windows of this source run under leases of their
    /// own; with the source lease held (no new window starts), waits until
    /// every live one lapses, so that no window is published into a
    /// period being swapped.
    fn wait_for_window_leases(
        &self,
        store: &Mutex<Box<dyn StateStore>>,
    ) -> Result<(), IngestError> {
        if !self.state.is_shared() {
            return Ok(());
        }
        let prefix = format!("ingest:{}@", self.spec.name);
        let deadline = std::time::Instant::now()
            + std::time::Duration::from_secs(self.spec.lease_duration_s.saturating_mul(4));
        loop {
            let now = highwater_store::lease::now_ns();
            let live: Vec<highwater_store::Lease> = store_of(store)
                .leases(&prefix)?
                .into_iter()
                .filter(|l| l.expires_at_ns > now)
                .collect();
            let Some(l) = live.into_iter().next() else {
                return Ok(());
            };
            if std::time::Instant::now() > deadline {
                return Err(IngestError::held(&l.name.clone(), l));
            }
            std::thread::sleep(std::time::Duration::from_millis(
                highwater_store::lease::LEASE_POLL_MS,
            ));
        }
    }

    fn compact_leased(
        &self,
        opts: &CompactOptions,
        store: &Mutex<Box<dyn StateStore>>,
        fence: &Fence,
        lost: &AtomicBool,
    ) -> Result<CompactReport, IngestError> {
        let g = &self.spec.grid;
        let closed = g.closed_count(opts.now_us, self.spec.settle_us);
        let records: BTreeMap<i64, WindowRecord> = store_of(store)
            .windows(&self.spec.name)?
            .into_iter()
            .map(|r| (g.index_of(r.start_us), r))
            .collect();
        let first_k = match opts.from_us {
            Some(t) => g.index_of(t).max(0),
            None => records.keys().next().copied().unwrap_or(0),
        };
        let last_k = match opts.to_us {
            // `to` is exclusive: the window that starts at it is out.
            Some(t) => g.index_of(t) - 1,
            // Up to the newest window ingestion has reached: periods past
            // it are not asked for yet (and would only be skipped), while
            // any period within it that is skipped makes the run exit 1.
            None => (closed - 1).min(records.keys().next_back().copied().unwrap_or(-1)),
        };
        let mut report = CompactReport {
            source: self.spec.name.clone(),
            periods: Vec::new(),
        };
        if last_k < first_k {
            return Ok(report);
        }
        let (p0, p1) = (self.spec.period_of(first_k), self.spec.period_of(last_k));
        // Why the run stopped short, once it has: every period asked for
        // after that is reported failed with it (exit 1), never left out
        // of the report as if it had not been asked for.
        let mut stopped: Option<String> = None;
        for p in p0..=p1 {
            let ks = self.spec.period_windows(p);
            // Only whole periods in range, and only closed ones.
            if ks.start < first_k || ks.end - 1 > last_k || ks.end > closed {
                continue;
            }
            if stopped.is_none() {
                // The heartbeat's flag, and the store itself: a takeover
                // between two heartbeats is seen before the next period.
                let ours = !lost.load(Ordering::SeqCst)
                    && store_of(store).renew_lease(
                        fence,
                        now_ns(),
                        self.spec.lease_duration_s as i64 * 1_000_000_000,
                    )?;
                if !ours {
                    stopped = Some(self.lost_to(store, fence));
                }
            }
            let o = match &stopped {
                None if self.is_delta() => {
                    // A Delta period is compacted only once no run re-lands
                    // its windows: past settle and lookback.
                    let horizon_us = opts.now_us - self.spec.settle_us - self.spec.lookback_us;
                    self.delta_compact_period(p, &records, horizon_us)?
                }
                None => self.compact_period(p, &records, store, fence)?,
                Some(why) => self.not_compacted(p, why)?,
            };
            report.periods.push(o);
            if failpoint("compact-gate") {
                crate::engine::gate();
            }
        }
        Ok(report)
    }

    /// Period `p`, asked for and not reached: failed, with why and what
    /// to do.
    fn not_compacted(&self, p: i64, why: &str) -> Result<PeriodOutcome, IngestError> {
        let g = &self.spec.grid;
        let ks = self.spec.period_windows(p);
        let (rel, _) = self.period_path(p)?;
        Ok(PeriodOutcome {
            start: format_rfc3339(g.window(ks.start).start_us),
            end: format_rfc3339(g.window(ks.end - 1).end_us),
            path: rel,
            status: "failed",
            windows: ks.count(),
            rows: 0,
            files_before: 0,
            files_after: 0,
            bytes_before: 0,
            bytes_after: 0,
            duration_ms: 0,
            reason: Some(format!(
                "not compacted: {why} before this period was reached; nothing of it was touched. Run `highwater compact {}` again (with --wait, if the other holder is still at work)",
                self.spec.name
            )),
        })
    }

    fn compact_period(
        &self,
        p: i64,
        records: &BTreeMap<i64, WindowRecord>,
        store: &Mutex<Box<dyn StateStore>>,
        fence: &Fence,
    ) -> Result<PeriodOutcome, IngestError> {
        let started = std::time::Instant::now();
        let g = &self.spec.grid;
        let ks = self.spec.period_windows(p);
        let (rel, pabs) = self.period_path(p)?;
        let mut o = PeriodOutcome {
            start: format_rfc3339(g.window(ks.start).start_us),
            end: format_rfc3339(g.window(ks.end - 1).end_us),
            path: rel.clone(),
            status: "skipped",
            windows: ks.clone().count(),
            rows: 0,
            files_before: 0,
            files_after: 0,
            bytes_before: 0,
            bytes_after: 0,
            duration_ms: 0,
            reason: None,
        };
        if let Some(m) = compact::read_manifest(&pabs) {
            o.status = "already";
            o.rows = m.rows;
            o.files_before = m.files.len();
            o.files_after = m.files.len();
            o.bytes_before = m.files.iter().map(|f| f.bytes).sum();
            o.bytes_after = o.bytes_before;
            return Ok(o);
        }
        let not_ready: Vec<i64> = ks
            .clone()
            .filter(|k| {
                records
                    .get(k)
                    .is_none_or(|r| r.status != WindowStatus::Published || r.recipe != self.recipe)
            })
            .collect();
        if let Some(first) = not_ready.first() {
            // What the first of them is, in its record's words.
            let what = match records.get(first) {
                None => "never ingested".to_string(),
                Some(r) if r.status == WindowStatus::Published => {
                    "published under another recipe".to_string()
                }
                Some(r) => match &r.error {
                    Some(e) => format!("{}: {e}", r.status.as_str()),
                    None => r.status.as_str().to_string(),
                },
            };
            o.reason = Some(format!(
                "{} of its windows are not published under the current recipe (first: {}, {what}); ingest them first (`highwater ingest {}`), then compact again",
                not_ready.len(),
                g.window(*first),
                self.spec.name
            ));
            return Ok(o);
        }
        let token = self.token(p);
        let mut ins = Vec::new();
        // Each window's schema, from its first file, with the window.
        let mut schemas: Vec<(Window, arrow_schema::SchemaRef)> = Vec::new();
        for k in ks.clone() {
            let r = &records[&k];
            let w = Window {
                start_us: r.start_us,
                end_us: r.end_us,
            };
            let (_, wabs) = self.window_path(&w);
            // The window on disk must be the one its record names.
            if publish::published_token(&wabs).as_deref() != Some(r.token.as_str()) {
                o.status = "failed";
                o.reason = Some(format!(
                    "window {w} on disk ({}) is not the version its record names; re-ingest it (`ingest --window`)",
                    wabs.display()
                ));
                return Ok(o);
            }
            let names = compact::parquet_files(&wabs)?;
            for n in &names {
                let bytes = std::fs::metadata(wabs.join(n))
                    .map_err(|e| IngestError::io("reading", wabs.join(n), e))?
                    .len();
                o.files_before += 1;
                o.bytes_before += bytes;
            }
            if let Some(n) = names.first() {
                schemas.push((w, compact::schema_of(&wabs.join(n))?));
            }
            ins.push(WindowIn {
                start_us: r.start_us,
                end_us: r.end_us,
                token: r.token.clone(),
                input: Input::Files(wabs, names),
                expect: r.extra["digest"].as_str().map(str::to_string),
                keep: true,
            });
        }
        if schemas.is_empty() {
            o.reason = Some("its windows have no files".into());
            return Ok(o);
        }
        // One schema for the period: the newest window's, when every
        // older one widens into it (their files are cast as they are
        // copied); otherwise the period is not compacted, and the two
        // windows that disagree are named.
        let only: Vec<arrow_schema::SchemaRef> = schemas.iter().map(|(_, s)| s.clone()).collect();
        let schema = match compact::period_schema(&only) {
            Ok(s) => s,
            Err((a, b, why)) => {
                o.status = "failed";
                o.reason = Some(format!(
                    "its windows have schemas that do not widen into one: window {} against window {}: {why}. Re-ingest the older windows so they are read with the source's current types (`highwater ingest {} --from {} --to {}`), then compact again",
                    schemas[a].0,
                    schemas[b].0,
                    self.spec.name,
                    format_rfc3339(schemas[a].0.start_us),
                    format_rfc3339(schemas[b].0.start_us),
                ));
                return Ok(o);
            }
        };
        let staging = publish::staging_path(&pabs, &token);
        publish::sweep_staging(&pabs, None);
        std::fs::create_dir_all(&staging).map_err(|e| IngestError::io("creating", &staging, e))?;
        let (written, windows) =
            match compact::write_period(&staging, schema, ins, None, self.target_bytes()) {
                Ok(x) => x,
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&staging);
                    o.status = "failed";
                    o.reason = Some(e.to_string());
                    return Ok(o);
                }
            };
        let g0 = g.window(ks.start).start_us;
        let manifest = PeriodManifest {
            kind: compact::KIND_COMPACTED.into(),
            source: self.spec.name.clone(),
            start_us: g0,
            end_us: g.window(ks.end - 1).end_us,
            token: token.clone(),
            files: written.files.clone(),
            rows: written.rows,
            windows: windows.clone(),
        };
        let swapped = compact::seal_and_swap(&staging, &pabs, &manifest, || {
            let ours = store_of(store).renew_lease(
                fence,
                now_ns(),
                self.spec.lease_duration_s as i64 * 1_000_000_000,
            )?;
            if ours && failpoint("compact-before-swap") {
                kill_self();
            }
            Ok(ours)
        })?;
        if !swapped {
            o.status = "failed";
            o.reason = Some(format!(
                "not compacted: {} before the swap; nothing was swapped. Run `highwater compact {}` again",
                self.lost_to(store, fence),
                self.spec.name
            ));
            return Ok(o);
        }
        if failpoint("compact-after-swap") {
            kill_self();
        }
        let info = |pw: &PeriodWindow| {
            json!({
                "period": {"start": format_rfc3339(manifest.start_us), "end": format_rfc3339(manifest.end_us)},
                "path": rel,
                "token": manifest.token,
                "offset": pw.offset,
                // Delta's dataChange=false: the rows are the same (the
                // digest proves it); only the files they live in changed.
                "layout_only": true,
            })
        };
        let updated: Vec<WindowRecord> = windows
            .iter()
            .map(|pw| {
                let mut r = records[&g.index_of(pw.start_us)].clone();
                r.files = json!([]);
                r.extra["digest"] = json!(pw.digest);
                r.extra["compacted"] = info(pw);
                r.updated_at_ns = now_ns();
                r
            })
            .collect();
        if store_of(store).commit_windows(&updated, fence)? == WindowCommit::Fenced {
            o.status = "failed";
            o.reason = Some(format!(
                "compacted on disk, but not recorded: {} after the swap; the next `highwater compact {}` (or `ingest`) records it",
                self.lost_to(store, fence),
                self.spec.name
            ));
            return Ok(o);
        }
        o.status = "compacted";
        o.rows = written.rows;
        o.files_after = written.files.len();
        o.bytes_after = written.files.iter().map(|f| f.bytes).sum();
        o.duration_ms = started.elapsed().as_millis() as u64;
        Ok(o)
    }
}
