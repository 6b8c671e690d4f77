//! The checks a window passes before anyone can see it (`[sources.NAME.checks]`):
//! duplicate keys, volume against the previous days, keys shared with the
//! window before, the schema against the neighbour window's, extraction
//! time against the interval. Each check's policy decides whether a finding
//! fails the window, warns, or is not looked for.

use crate::config::Policy;
use crate::engine::{Ctx, Ingestor, DAY_US};
use crate::error::IngestError;
use highwater_core::window::Window;
use highwater_store::{WindowRecord, WindowStatus};
use std::path::Path;

/// What the checks look at of one extracted window.
pub(crate) struct Checked<'a> {
    pub(crate) rows: u64,
    /// Keys that occur more than once, when `unique_key` was checked.
    pub(crate) dups: Option<u64>,
    /// The staged files.
    pub(crate) staging: &'a Path,
    /// The window's schema, as its record keeps it.
    pub(crate) schema: &'a serde_json::Value,
    pub(crate) extract_ms: i64,
}

pub(crate) fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

impl Ingestor {
    /// Runs the checks of window `k`: the findings that fail it (empty:
    /// it may be published); warnings go to `warnings`.
    pub(crate) fn check_window(
        &self,
        k: i64,
        c: &Checked<'_>,
        ctx: &Ctx<'_>,
        warnings: &mut Vec<String>,
    ) -> Result<Vec<String>, IngestError> {
        let w = self.t.spec.grid.window(k);
        let (rows, dups, staging, schema, extract_ms) =
            (c.rows, c.dups, c.staging, c.schema, c.extract_ms);
        let mut failures = Vec::new();
        let mut judge = |policy: Policy, msg: String, warnings: &mut Vec<String>| match policy {
            Policy::Fail => failures.push(msg),
            Policy::Warn => warnings.push(msg),
            Policy::Off => {}
        };
        if let Some(d) = dups.filter(|d| *d > 0) {
            judge(
                self.t.spec.checks.unique_key,
                format!("{d} keys occur more than once in window {w} (check unique_key)"),
                warnings,
            );
        }
        if let Some(v) = &self.t.spec.checks.volume {
            let prior: Vec<f64> = (1..=v.compare_days as i64)
                .filter_map(|d| {
                    ctx.records
                        .get(&self.t.spec.grid.index_of(w.start_us - d * DAY_US))
                })
                .filter(|r| r.status == WindowStatus::Published)
                .map(|r| r.rows as f64)
                .collect();
            if let Some(m) = median(prior) {
                let dev = (rows as f64 - m).abs() / m.max(1.0);
                if dev > v.max_deviation {
                    judge(
                        v.on_fail,
                        format!("window {w} has {rows} rows against a median of {m} on the previous {} days ({:.0}% off; check volume)", v.compare_days, dev * 100.0),
                        warnings,
                    );
                }
            }
        }
        if self.t.spec.checks.adjacent_duplicates != Policy::Off && k > 0 {
            let prev = self.t.spec.grid.window(k - 1);
            let prev_dir = self
                .format
                .window_rows_dir(&prev)?
                .unwrap_or_else(|| self.t.window_path(&prev).1);
            let before = crate::sink::key_hashes(&prev_dir, &self.t.spec.key)?;
            if !before.is_empty() {
                let now = crate::sink::key_hashes(staging, &self.t.spec.key)?;
                let both = now.intersection(&before).count();
                if both > 0 {
                    judge(
                        self.t.spec.checks.adjacent_duplicates,
                        format!("{both} keys of window {w} also appear in the window before it (check adjacent_duplicates)"),
                        warnings,
                    );
                }
            }
        }
        // The window's schema against its neighbour's (the nearest
        // published window before it, else after it): a reader of the
        // output must not see one column with two types unannounced.
        // A format whose table has one schema checked it before the run.
        if self.t.spec.checks.schema != Policy::Off && self.format.neighbour_schema_check() {
            let with_schema = |r: &&WindowRecord| {
                r.status == WindowStatus::Published && r.extra["schema"].is_array()
            };
            let neighbour = ctx
                .records
                .range(..k)
                .rev()
                .map(|(_, r)| r)
                .find(with_schema)
                .or_else(|| ctx.records.range(k + 1..).map(|(_, r)| r).find(with_schema));
            if let Some(n) = neighbour {
                let (changes, widening) = crate::sink::schema_changes(&n.extra["schema"], schema);
                let nw = Window {
                    start_us: n.start_us,
                    end_us: n.end_us,
                };
                if !changes.is_empty() && widening {
                    warnings.push(format!(
                        "window {w}: {} since window {nw} (check schema); compaction widens the older windows' files to match",
                        changes.join("; ")
                    ));
                } else if !changes.is_empty() {
                    judge(
                        self.t.spec.checks.schema,
                        format!(
                            "window {w}: {} since window {nw} (check schema). A reader of the output would see two types in one column, and a compaction of a period holding both would fail. If the source changed on purpose: cast the column back in a `query` (e.g. `SELECT ..., amount::int4 AS amount`), or land the new schema under a new source name and output, or set `[sources.{}.checks] schema = \"warn\"` to publish it as it is",
                            changes.join("; "),
                            self.t.spec.name
                        ),
                        warnings,
                    );
                }
            }
        }
        if let Some(d) = &self.t.spec.checks.duration {
            let interval_ms = self.t.spec.grid.interval_us as f64 / 1000.0;
            if extract_ms as f64 > d.warn_share_of_interval * interval_ms {
                warnings.push(format!(
                    "extracting window {w} took {extract_ms} ms, {:.0}% of the interval: runs will soon overlap (check duration)",
                    extract_ms as f64 / interval_ms * 100.0
                ));
            }
        }
        Ok(failures)
    }
}
