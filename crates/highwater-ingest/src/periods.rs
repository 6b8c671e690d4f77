//! `compact`: under the source's lease, each closed period in range is
//! handed to the table format ([`crate::format::TableFormat::compact_period`]),
//! which rewrites it its own way; this module decides which periods, keeps
//! the lease, and reports each period's outcome.

use crate::engine::Ingestor;
use crate::error::IngestError;
use crate::failpoints::failpoint;
use highwater_core::window::format_rfc3339;
use highwater_store::lease::now_ns;
use highwater_store::{Fence, StateStore, WindowRecord};
use serde::Serialize;
use std::collections::BTreeMap;
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

impl Ingestor {
    /// `highwater compact`: rewrites the published windows of each closed
    /// period in range into files near the target size, under the lease
    /// `ingest` takes.
    pub fn compact(&self, opts: &CompactOptions) -> Result<CompactReport, IngestError> {
        if self.t.spec.compaction.is_none() {
            return Err(IngestError::Schema {
                name: self.t.spec.name.clone(),
                message: "has no [compact] section; add one, e.g. `[sources.NAME.compact]` with `into = \"1d\"`".into(),
            });
        }
        self.leased(opts.wait, |store, fence, lost| {
            self.wait_for_window_leases(store)?;
            self.recover(store, fence)?;
            self.format.reconcile(&self.held(store, fence))?;
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
        let prefix = format!("ingest:{}@", self.t.spec.name);
        let deadline = std::time::Instant::now()
            + std::time::Duration::from_secs(self.t.spec.lease_duration_s.saturating_mul(4));
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
        let g = &self.t.spec.grid;
        let closed = g.closed_count(opts.now_us, self.t.spec.settle_us);
        let records: BTreeMap<i64, WindowRecord> = store_of(store)
            .windows(&self.t.spec.name)?
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
            source: self.t.spec.name.clone(),
            periods: Vec::new(),
        };
        if last_k < first_k {
            return Ok(report);
        }
        let (p0, p1) = (
            self.t.spec.period_of(first_k),
            self.t.spec.period_of(last_k),
        );
        // Why the run stopped short, once it has: every period asked for
        // after that is reported failed with it (exit 1), never left out
        // of the report as if it had not been asked for.
        let mut stopped: Option<String> = None;
        for p in p0..=p1 {
            let ks = self.t.spec.period_windows(p);
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
                        self.t.spec.lease_duration_s as i64 * 1_000_000_000,
                    )?;
                if !ours {
                    stopped = Some(self.lost_to(store, fence));
                }
            }
            // Windows that end after the horizon may still be re-landed
            // by a run (past settle and lookback).
            let horizon_us = opts.now_us - self.t.spec.settle_us - self.t.spec.lookback_us;
            let o = match &stopped {
                None => {
                    self.format
                        .compact_period(p, &records, horizon_us, &self.held(store, fence))?
                }
                Some(why) => self.not_compacted(p, why)?,
            };
            report.periods.push(o);
            if failpoint("compact-gate") {
                crate::failpoints::gate();
            }
        }
        Ok(report)
    }

    /// Period `p`, asked for and not reached: failed, with why and what
    /// to do.
    fn not_compacted(&self, p: i64, why: &str) -> Result<PeriodOutcome, IngestError> {
        let g = &self.t.spec.grid;
        let ks = self.t.spec.period_windows(p);
        let (rel, _) = self.format.period_path(p)?;
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
                self.t.spec.name
            )),
        })
    }
}
