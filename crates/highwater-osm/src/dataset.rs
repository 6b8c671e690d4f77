//! One trait for every derived dataset. Tiles ([`crate::tiles`]), search
//! ([`crate::search`]) and aggregates ([`crate::aggregates`]) each
//! implement it in their own module, which owns its tables (its `TABLES`,
//! created with the store: [`tables`]). `ops::apply` and the CLI's drain,
//! rebuild and verify reach datasets only through this trait, so a fourth
//! kind is its own module, a line in [`tables`], and its config
//! (`OsmConfig`'s parsing and `OsmConfig::datasets`).
//!
//! Ordering contract, for a batch of diffs applied in one transaction:
//!
//! 1. for each diff, [`Dataset::derive`] on every dataset, reading the store
//!    as it is before that diff (derive-before-apply: the old state is gone
//!    once the diff is applied);
//! 2. the diff is applied: elements and the shapes index;
//! 3. [`Dataset::touched`] on every dataset, with the elements the diff
//!    touched (read the store as it is now);
//! 4. after the last diff, [`Dataset::commit`] on every dataset: its dirty
//!    set and its marker at the batch's sequence, in the same transaction,
//!    so a crash keeps both or neither.
//!
//! Drains, rebuilds and verifies run outside that transaction, each taking
//! the writer lease when it writes.

use crate::derive::Touched;
use crate::model::Change;
use crate::ops::{DatasetReport, OpsError};
use crate::store::{DrainOrder, Store, StoreError, Writer};
use std::time::{Duration, Instant};

/// What a drain, rebuild or verify did: a line for people, a JSON value
/// for machines (under `key`), and the differences a verify found.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// `build`, `drain`, `search`, `aggregates` or `verify`.
    pub key: &'static str,
    pub json: serde_json::Value,
    /// For people; may span lines.
    pub text: String,
    pub took: Duration,
    /// Differences a verify found (the command exits 1 when any).
    pub differences: usize,
    /// Said on stderr: a dirty set growing faster than it drains.
    pub warning: Option<String>,
}

/// How far a drain may go.
#[derive(Clone, Copy, Debug)]
pub struct DrainLimits {
    /// Dirty tiles re-cut at most (tiles only).
    pub tiles_max: usize,
    pub order: DrainOrder,
}

impl Default for DrainLimits {
    fn default() -> Self {
        DrainLimits {
            tiles_max: usize::MAX,
            order: DrainOrder::LowZoomFirst,
        }
    }
}

/// An error of one dataset's drain, rebuild or verify, as text: the
/// others still run (exit 1).
pub type DatasetError = String;

impl Outcome {
    /// An outcome whose text says the time taken (`took` in seconds).
    pub fn new(
        key: &'static str,
        json: serde_json::Value,
        t0: Instant,
        text: impl FnOnce(f64) -> String,
    ) -> Outcome {
        let took = t0.elapsed();
        Outcome {
            key,
            json,
            text: text(took.as_secs_f64()),
            took,
            differences: 0,
            warning: None,
        }
    }
}

pub trait Dataset: Sync {
    fn name(&self) -> &str;
    /// `tiles`, `search` or `aggregates`.
    fn kind(&self) -> &'static str;
    fn recipe(&self) -> &str;
    /// What the dirty set holds, for messages (`dirty tiles`).
    fn dirty_what(&self) -> &'static str {
        "dirty keys"
    }

    /// Step 1: before a diff is applied, what it affects. Default: nothing.
    fn derive(
        &self,
        _w: &mut Writer<'_>,
        _changes: &[Change],
        _report: &mut DatasetReport,
    ) -> Result<(), OpsError> {
        Ok(())
    }

    /// Step 3: after the diff is applied, the elements it touched. Default:
    /// nothing.
    fn touched(&self, _w: &mut Writer<'_>, _touched: &Touched) -> Result<(), StoreError> {
        Ok(())
    }

    /// Step 4: the batch's dirty set and marker.
    fn commit(
        &self,
        w: &mut Writer<'_>,
        sequence: Option<i64>,
        _report: &mut DatasetReport,
    ) -> Result<(), OpsError> {
        w.set_marker(self.name(), sequence, self.recipe())?;
        Ok(())
    }

    /// Whether `osm apply` drains it right after the commit.
    fn drains_on_apply(&self) -> bool {
        true
    }

    fn drain(&self, store: &mut Store, limits: DrainLimits) -> Result<Outcome, DatasetError>;
    fn rebuild(&self, store: &mut Store) -> Result<Outcome, DatasetError>;
    /// Compares with a rebuild: all of it, or a spread sample where the
    /// kind can sample.
    fn verify(&self, store: &Store, sample: Option<usize>) -> Result<Outcome, DatasetError>;
}

/// Every kind's tables, for the store to create.
pub fn tables() -> [&'static str; 3] {
    [
        crate::tiles::TABLES,
        crate::search::TABLES,
        crate::aggregates::TABLES,
    ]
}

/// The outcome of comparing a dataset with its rebuild, given what was
/// checked and a line per difference.
pub fn verified(name: &str, t0: Instant, checked: usize, differences: Vec<String>) -> Outcome {
    let mut text = format!(
        "{name}: {checked} checked against a rebuild, {} differ",
        differences.len()
    );
    for d in &differences {
        text += &format!("\n  {d}");
    }
    let n = differences.len();
    let json = serde_json::json!({"dataset": name, "checked": checked, "differences": differences});
    let mut o = Outcome::new("verify", json, t0, |_| text);
    o.differences = n;
    o
}

/// The datasets kept current from the elements a diff touched (search,
/// aggregates): step 3 records them as the dataset's dirty keys.
pub fn record_touched(w: &mut Writer<'_>, name: &str, t: &Touched) -> Result<(), StoreError> {
    w.add_dirty_keys(name, &t.all)
}

/// An error with its causes, each said once (a cause that its error's own
/// message already embeds is not repeated).
pub fn error_text(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let c_text = c.to_string();
        if !msg.contains(&c_text) {
            msg.push_str(": ");
            msg.push_str(&c_text);
        }
        cause = c.source();
    }
    msg
}
