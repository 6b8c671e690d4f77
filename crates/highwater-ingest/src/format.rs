//! Table formats: how a source's windows become a table readers read.
//!
//! The engine decides which windows run, reads them, checks them and keeps
//! their records and leases; a [`TableFormat`] decides where a window's
//! files go and how they become visible. The engine names no format: it
//! holds a `Box<dyn TableFormat>` made by [`open`], the one line that
//! registers each format. Each format lives in a folder of its own:
//! - [`crate::folders`]: Parquet, a folder per window (`_manifest.json`,
//!   swapped in by rename, or put conditionally in a bucket); compacted
//!   periods as folders of their own.
//! - [`crate::delta`]: windows as commits of one Delta Lake table.
//!
//! A third format (Iceberg, say) is a folder implementing this trait and a
//! line in [`open`].

use crate::config::Format;
use crate::error::IngestError;
use crate::periods::PeriodOutcome;
use crate::sink::{Column, Extras};
use crate::table::{Held, Table};
use highwater_core::window::Window;
use highwater_store::WindowRecord;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The format a source's `format` key names, built on its context.
pub(crate) fn open(t: Arc<Table>) -> Box<dyn TableFormat> {
    match t.spec.format {
        Format::Parquet => Box::new(crate::folders::Folders::new(t)),
        Format::Delta => Box::new(crate::delta::Delta::new(t)),
    }
}

/// What a load's files hold.
#[derive(Clone, Copy, Debug)]
pub enum Rows {
    /// The window's own files: this many rows (the manifest's count; a
    /// COPY that counts otherwise rolls back).
    Manifest(u64),
    /// Files of a Delta table's current state: only the rows stamped with
    /// the window are loaded, however many the table holds now (another
    /// engine may have deleted some).
    Stamped,
}

/// Where a window's published files are read back from for its load.
pub(crate) enum LoadFrom {
    /// A local folder.
    Local(std::path::PathBuf),
    /// A key prefix in the source's bucket: downloaded into a scratch
    /// folder first.
    Bucket(String),
}

/// A published window's current files, for a reader of its rows (the
/// warehouse load).
pub(crate) struct WindowFiles {
    pub(crate) from: LoadFrom,
    /// Paths relative to `from`.
    pub(crate) files: Vec<String>,
    pub(crate) rows: Rows,
}

/// One staged and checked window, as a format publishes it.
pub(crate) struct StagedWindow<'a> {
    /// The window's grid index.
    pub(crate) k: i64,
    /// Its files, and the manifest a folder's `_manifest.json` holds.
    pub(crate) staging: &'a Path,
    /// Its own local folder.
    pub(crate) abs: &'a Path,
    pub(crate) manifest: &'a Value,
    /// The attempt.
    pub(crate) token: &'a str,
}

/// What the output holds of a window, as a run that died left it: the
/// attempt it holds and the facts its record takes from it.
pub(crate) struct OnDisk {
    pub(crate) token: String,
    /// The recipe it was published under, and its parts, when the output
    /// says.
    pub(crate) recipe: Option<String>,
    pub(crate) recipe_parts: Value,
    pub(crate) rows: Option<i64>,
    pub(crate) files: Value,
    pub(crate) digest: Value,
    /// When the window lives in a compacted period: the `compacted` fact.
    pub(crate) compacted: Option<Value>,
}

/// One table format. Every method takes what the engine knows (window,
/// records, columns) and the format reads or writes its own output.
pub(crate) trait TableFormat: Send + Sync {
    /// What a window's files carry beyond its rows (a stamp, statistics).
    fn extras(&self, w: &Window) -> Extras;

    /// The schema rule, before any window runs: the columns the windows
    /// of this run are written with, given the source's `columns` and the
    /// records of published windows; `Err` refuses the run (exit 2) with
    /// nothing written. Warnings go to `warnings`.
    fn columns(
        &self,
        columns: Vec<Column>,
        records: &BTreeMap<i64, WindowRecord>,
        warnings: &mut Vec<String>,
    ) -> Result<Vec<Column>, IngestError>;

    /// Whether each window's schema is also compared with its neighbour
    /// window's record (a format whose table has one schema of its own
    /// checks that in [`Self::columns`] instead).
    fn neighbour_schema_check(&self) -> bool;

    /// Refuses, before any window runs, windows `ks` that this format
    /// cannot publish now (exit 2, nothing written).
    fn refuse_windows(&self, ks: &[i64]) -> Result<(), IngestError>;

    /// Whether window folders of records can move (an `output` template
    /// changed): the old folder is removed once the window is published
    /// at the new one.
    fn window_folders(&self) -> bool;

    /// Removes the old folder `old` (as its record named it) of a window
    /// now published at a new one.
    fn remove_old_window(&self, old: &str, label: &str) -> Result<(), IngestError>;

    /// Whether the window a published record names is still in the
    /// output (cheaply: a format that cannot tell without a request per
    /// window says yes, and `compact` checks what it reads).
    fn has_window(
        &self,
        r: &WindowRecord,
        periods: &mut BTreeMap<String, Option<crate::compact::PeriodManifest>>,
    ) -> bool;

    /// The attempt of window `w` the output holds now, if any; `abs` is
    /// the window's local folder.
    fn on_disk(&self, w: &Window, abs: &Path) -> Result<Option<OnDisk>, IngestError>;

    /// A local folder holding the rows of published window `w` (for the
    /// adjacent-duplicates check), when there is one.
    fn window_rows_dir(&self, w: &Window) -> Result<Option<PathBuf>, IngestError>;

    /// The group window `k` is published with: the windows of one group
    /// that a run lands are published together, in one step, so readers
    /// see the group before or after, never half re-landed (the windows of
    /// a compacted Delta period). `None`: alone.
    fn publish_group(&self, k: i64) -> Result<Option<i64>, IngestError>;

    /// Makes staged windows visible (first landings or re-lands): one
    /// window, or the windows of one [`Self::publish_group`] at once, all
    /// written with `columns`. Per window, `Some(fact)` when it joined a
    /// compacted period (the `compacted` fact of its record).
    fn publish(
        &self,
        ws: &[StagedWindow<'_>],
        columns: &[Column],
    ) -> Result<Vec<Option<Value>>, IngestError>;

    /// Brings published window records up to date with the output (a
    /// crash between a period's swap and its records).
    fn reconcile(&self, held: &Held<'_>) -> Result<(), IngestError>;

    /// Housekeeping after a run's windows (files past their retention).
    /// A failure is a warning: nothing published depends on it.
    fn after_run(&self) -> Result<(), IngestError>;

    /// The relative and absolute path of period `p`'s compacted files.
    fn period_path(&self, p: i64) -> Result<(String, PathBuf), IngestError>;

    /// Compacts period `p` under the lease `held`. `horizon_us`: rows of
    /// windows that end after it may still be re-landed.
    fn compact_period(
        &self,
        p: i64,
        records: &BTreeMap<i64, WindowRecord>,
        horizon_us: i64,
        held: &Held<'_>,
    ) -> Result<PeriodOutcome, IngestError>;

    /// The current files of published window `w` (record `r`), for a
    /// reader of its rows; `Err` says why they cannot be read.
    fn window_files(&self, w: &Window, r: &WindowRecord) -> Result<WindowFiles, String>;
}
