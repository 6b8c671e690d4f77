//! Which windows to run, and running them: extract into staging, check,
//! publish atomically, then record the window and move the bookmark by
//! compare-and-set, all under a fenced lease with a heartbeat.

use crate::checks::{median, Checked};
use crate::config::{Mode, Policy, SourceSpec};
use crate::error::IngestError;
use crate::failpoints::{gate, kill_self};
use crate::format::{StagedWindow, TableFormat};
use crate::publish;
use crate::sink::{ColType, FileInfo, ParquetSink, Written};
use crate::source::{self, KeyRange, Pred, Reader, Scope};
use crate::table::{Held, Table};
use highwater_core::window::{format_rfc3339, Window};
use highwater_store::{
    Bookmark, Fence, StateLocation, StateStore, WindowCommit, WindowRecord, WindowStatus,
};
use serde::Serialize;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) const DAY_US: i64 = 86_400 * 1_000_000;

/// Re-landing more than this share of the published windows after a
/// recipe change needs --force (as the files guard's default).
pub const STALE_GUARD_SHARE: f64 = 0.5;

/// Fewer stale windows than this never trip the share (one edited window
/// of two is not a mass change).
pub const STALE_GUARD_ITEMS_MIN: usize = 10;

/// How long `--wait` waits for a held lease before giving up: a few lease
/// lifetimes, so a dead owner's lease has surely expired by then.
pub const LEASE_WAIT_LEASES_MAX: u64 = 3;

use highwater_store::lease::now_ns;

/// Compare-and-set attempts of one window commit against other processes
/// moving the same bookmark.
pub const COMMIT_RETRIES_MAX: usize = 64;

/// What to run.
#[derive(Clone, Debug)]
pub struct IngestOptions {
    /// Re-run exactly this window (or the grid windows it spans).
    pub window: Option<Window>,
    /// Backfill `[from, to)`.
    pub from_us: Option<i64>,
    pub to_us: Option<i64>,
    /// Windows extracted at once.
    pub max_parallel: usize,
    /// Decides only which windows are closed.
    pub now_us: i64,
    /// Wait for a held lease instead of exiting.
    pub wait: bool,
    /// Re-land windows published under another recipe even when they are
    /// more than the guard's share of the published ones.
    pub force: bool,
}

/// What happened to one window.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct WindowOutcome {
    pub start: String,
    pub end: String,
    pub path: String,
    pub status: &'static str,
    pub rows: u64,
    pub duration_ms: u64,
    pub warnings: Vec<String>,
    pub error: Option<String>,
}

/// What one `ingest` did.
#[derive(Clone, Debug, Serialize)]
pub struct IngestReport {
    pub source: String,
    pub bookmark_before: Option<String>,
    pub bookmark_after: Option<String>,
    pub windows: Vec<WindowOutcome>,
    pub warnings: Vec<String>,
    /// Source-level checks set to `fail` that failed (continuity).
    pub check_failures: usize,
    /// Windows loaded into the warehouse (`[sources.NAME.load]`), or not.
    pub loads: Vec<crate::load::LoadOutcome>,
}

impl IngestReport {
    /// Failed windows, failed loads and failed source-level checks:
    /// non-zero means exit 1.
    pub fn failed(&self) -> usize {
        self.windows.iter().filter(|w| w.status == "failed").count()
            + self.loads.iter().filter(|l| l.status == "failed").count()
            + self.check_failures
    }
}

/// One cell of the completion grid.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct GridRow {
    pub start: String,
    pub end: String,
    pub status: &'static str,
    pub rows: Option<i64>,
    /// The median rows of the same window on the previous days.
    pub prior_rows_median: Option<f64>,
    pub duration_ms: Option<i64>,
    pub duration_share_of_interval: Option<f64>,
    /// The Parquet files the window was published as (none once its
    /// period is compacted).
    pub files: Option<usize>,
    /// The compacted period's folder holding the window's rows.
    pub compacted: Option<String>,
    /// A chunked window's chunks by status.
    pub chunks: Option<BTreeMap<String, usize>>,
    /// What is wrong with the window beyond its status (a published
    /// window whose folder is gone).
    pub note: Option<String>,
    /// The content digest of the published rows: independent of files and
    /// row order, so it stays the same through a compaction.
    pub digest: Option<String>,
    /// With `[sources.NAME.load]`: the published window's load state.
    pub load: Option<crate::load::LoadCell>,
}

/// A compacted period, as `windows` shows it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CompactedPeriod {
    pub start: String,
    pub end: String,
    pub path: String,
    pub files: usize,
    pub bytes: u64,
}

/// The file layout of a source's published output, and what to do about it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Layout {
    /// Over the windows shown that are published and not compacted.
    pub files_per_window_median: Option<f64>,
    pub file_bytes_median: Option<u64>,
    pub compacted_periods: Vec<CompactedPeriod>,
    pub advice: Option<String>,
}

/// Parquet files below this are too small for an efficient read: each file
/// costs an open, a footer read and per-column metadata.
pub const EFFICIENT_FILE_BYTES: u64 = 32 << 20;

/// The grid, the bookmark and the layout: what `windows` shows.
#[derive(Clone, Debug, Serialize)]
pub struct GridView {
    pub rows: Vec<GridRow>,
    pub bookmark: Option<Bookmark>,
    pub layout: Layout,
}

/// Ingestion of one source: which windows run, reading and checking them,
/// their records, leases and bookmark. Where a window's files go and how
/// they become visible is its table format's ([`crate::format`]).
pub struct Ingestor {
    /// The output, as the engine and the format both see it.
    pub(crate) t: Arc<Table>,
    pub(crate) state: StateLocation,
    pub(crate) format: Box<dyn TableFormat>,
}

/// One chunk of a window, as its record keeps it.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct ChunkRecord {
    /// The key range: `lo <= chunk_by < hi`, open ends unbounded.
    pub lo: Option<i64>,
    pub hi: Option<i64>,
    /// pending, running, done or failed.
    pub status: String,
    pub rows: u64,
    pub files: Vec<FileInfo>,
    pub digest: Option<String>,
    /// The exported snapshot it was read in.
    pub snapshot: Option<String>,
    /// How many times it was read: a resumed window reads only the
    /// chunks that had not finished.
    pub reads: u32,
    pub error: Option<String>,
}

impl ChunkRecord {
    fn pending(r: KeyRange) -> ChunkRecord {
        ChunkRecord {
            lo: r.lo,
            hi: r.hi,
            status: "pending".into(),
            rows: 0,
            files: Vec::new(),
            digest: None,
            snapshot: None,
            reads: 0,
            error: None,
        }
    }

    fn range(&self) -> KeyRange {
        KeyRange {
            lo: self.lo,
            hi: self.hi,
        }
    }
}

/// Removes what chunk `i` wrote into `staging` (a torn write of a run that
/// died while reading it).
fn remove_chunk_files(staging: &Path, i: usize) -> Result<(), IngestError> {
    let prefix = format!("part-{i:04}-");
    let Ok(rd) = std::fs::read_dir(staging) else {
        return Ok(());
    };
    for e in rd.flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            std::fs::remove_file(e.path())
                .map_err(|err| IngestError::io("removing", e.path(), err))?;
        }
    }
    Ok(())
}

/// One attempt of a window, from its start to its publishing.
pub(crate) struct Attempt {
    k: i64,
    rec: WindowRecord,
    outcome: WindowOutcome,
    staging: PathBuf,
    /// The window's own local folder.
    abs: PathBuf,
    token: String,
    started: Instant,
    /// The window's published record before this attempt, if any: a
    /// failed re-land leaves it in place.
    previous: Option<WindowRecord>,
    /// Filled once staged and checked.
    manifest: serde_json::Value,
}

/// What a run owes, as `plan_windows` decided it.
pub(crate) struct WindowPlan {
    pub(crate) report: IngestReport,
    pub(crate) ks: Vec<i64>,
    pub(crate) records: BTreeMap<i64, WindowRecord>,
    pub(crate) columns: Vec<crate::sink::Column>,
    pub(crate) id_ranges: BTreeMap<i64, (Option<i64>, i64)>,
    pub(crate) horizon: Option<i64>,
    pub(crate) moved: BTreeMap<String, String>,
    pub(crate) first: Box<dyn Reader>,
}

/// The shared context of one run's window workers.
pub(crate) struct Ctx<'a> {
    pub(crate) store: &'a Mutex<Box<dyn StateStore>>,
    pub(crate) fence: &'a Fence,
    pub(crate) lost: &'a AtomicBool,
    pub(crate) records: BTreeMap<i64, WindowRecord>,
    pub(crate) columns: Vec<crate::sink::Column>,
    pub(crate) id_ranges: BTreeMap<i64, (Option<i64>, i64)>,
    /// Chunks of one window read at once.
    pub(crate) chunk_parallel: usize,
}

impl Ingestor {
    pub fn new(root: &Path, state: StateLocation, spec: SourceSpec) -> Ingestor {
        Self::with_table(
            Table {
                root: root.to_path_buf(),
                recipe: spec.recipe_id(),
                spec,
                objects: None,
            },
            state,
        )
    }

    fn with_table(t: Table, state: StateLocation) -> Ingestor {
        let t = Arc::new(t);
        Ingestor {
            format: crate::format::open(t.clone()),
            t,
            state,
        }
    }

    /// The lease a format's work runs under.
    pub(crate) fn held<'a>(
        &self,
        store: &'a Mutex<Box<dyn StateStore>>,
        fence: &'a Fence,
    ) -> Held<'a> {
        Held {
            store,
            fence,
            lease_duration_s: self.t.spec.lease_duration_s,
        }
    }

    pub fn spec(&self) -> &SourceSpec {
        &self.t.spec
    }

    /// Sets the object store `output` names (the caller opens it from the
    /// config's `[storage]`).
    pub fn with_objects(self, o: std::sync::Arc<highwater_objects::Objects>) -> Ingestor {
        let t = Table {
            root: self.t.root.clone(),
            spec: self.t.spec.clone(),
            recipe: self.t.recipe.clone(),
            objects: Some(o),
        };
        Self::with_table(t, self.state)
    }

    fn label(w: &Window) -> String {
        w.to_string()
    }

    /// The windows of this run, by grid index, oldest first.
    fn choose(
        &self,
        opts: &IngestOptions,
        bookmark: Option<&Bookmark>,
        records: &BTreeMap<i64, WindowRecord>,
        late: &[i64],
    ) -> Result<Vec<i64>, IngestError> {
        let g = &self.t.spec.grid;
        let closed = g.closed_count(opts.now_us, self.t.spec.settle_us);
        let explicit = |range: std::ops::Range<i64>| -> Result<Vec<i64>, IngestError> {
            if range.end > closed {
                let w = g.window(range.end - 1);
                return Err(IngestError::Schema {
                    name: self.t.spec.name.clone(),
                    message: format!(
                        "window {} is not closed until {} (end plus settle); wait, or lower `settle`",
                        w,
                        format_rfc3339(w.end_us + self.t.spec.settle_us)
                    ),
                });
            }
            Ok(range.collect())
        };
        if let Some(w) = &opts.window {
            return explicit(g.indices(w)?);
        }
        if opts.from_us.is_some() || opts.to_us.is_some() {
            let from = opts.from_us.unwrap_or(g.start_us);
            let to = opts.to_us.unwrap_or(g.window(closed).start_us);
            return explicit(g.indices(&Window {
                start_us: from,
                end_us: to,
            })?);
        }
        let k0 = bookmark.map_or(0, |b| g.index_of(b.last_end_us));
        let mut ks: BTreeSet<i64> = late
            .iter()
            .copied()
            .filter(|k| *k >= 0 && *k < k0)
            .collect();
        for k in k0..closed {
            if ks.len() >= self.t.spec.catch_up_windows_max {
                break;
            }
            if records
                .get(&k)
                .is_none_or(|r| r.status != WindowStatus::Published)
            {
                ks.insert(k);
            }
        }
        Ok(ks.into_iter().collect())
    }

    /// The published windows, under the current recipe, that are gone
    /// from the output ([`TableFormat::has_window`]), oldest first.
    fn gone_windows(&self, records: &BTreeMap<i64, WindowRecord>) -> Vec<i64> {
        let (keys, current): (Vec<i64>, Vec<&WindowRecord>) = records
            .iter()
            .filter(|(_, r)| r.recipe == self.t.recipe)
            .map(|(k, r)| (*k, r))
            .unzip();
        self.windows_without_files(&current)
            .into_iter()
            .map(|i| keys[i])
            .collect()
    }

    /// The parts of the recipe that differ between the current definition
    /// and the windows published under another recipe.
    fn changed_parts(&self, records: &BTreeMap<i64, WindowRecord>) -> Vec<String> {
        let now = self.t.spec.recipe_parts();
        let mut changed = BTreeSet::new();
        for r in records
            .values()
            .filter(|r| r.status == WindowStatus::Published && r.recipe != self.t.recipe)
        {
            match r.extra["recipe_parts"].as_object() {
                Some(old) => {
                    for (k, v) in old {
                        if now.get(k) != Some(v) {
                            changed.insert(match k.as_str() {
                                "relation" => "table or query".to_string(),
                                "interval_us" => "interval".to_string(),
                                "start_us" => "start".to_string(),
                                "lookback_us" => "lookback".to_string(),
                                other => other.to_string(),
                            });
                        }
                    }
                }
                None => {
                    changed.insert("a part recorded before recipe parts were".to_string());
                }
            }
        }
        changed.into_iter().collect()
    }

    /// The published windows whose recipe is not the current one, oldest
    /// first. Refuses when the change moves the grid (interval, start: old
    /// windows are not windows of the new grid) or changes the cursor
    /// without --force (it changes what a window means), and, like the
    /// files guard, when the stale windows are more than half of those
    /// published, unless --force.
    fn stale_windows(
        &self,
        opts: &IngestOptions,
        records: &BTreeMap<i64, WindowRecord>,
    ) -> Result<Vec<i64>, IngestError> {
        let published = records
            .values()
            .filter(|r| r.status == WindowStatus::Published)
            .count();
        let stale: Vec<i64> = records
            .iter()
            .filter(|(_, r)| r.status == WindowStatus::Published && r.recipe != self.t.recipe)
            .map(|(k, _)| *k)
            .collect();
        if stale.is_empty() {
            return Ok(stale);
        }
        let changed = self.changed_parts(records);
        let first = &records[&stale[0]];
        let span = format!(
            "{} windows from {}",
            stale.len(),
            Window {
                start_us: first.start_us,
                end_us: first.end_us
            }
        );
        if changed.iter().any(|c| c == "interval" || c == "start") {
            return Err(IngestError::RecipeChanged {
                name: self.t.spec.name.clone(),
                message: format!(
                    "its {} changed ({}), which changes what a window means: the {span} on the old grid are not windows of the new one. Give the source a new name and output to land on the new grid, or restore the old setting",
                    changed.join(", "),
                    "old windows keep their bounds",
                ),
            });
        }
        let share = stale.len() as f64 / published.max(1) as f64;
        let cursor = changed.iter().any(|c| c == "cursor");
        if !opts.force
            && (cursor || (stale.len() >= STALE_GUARD_ITEMS_MIN && share > STALE_GUARD_SHARE))
        {
            return Err(IngestError::RecipeChanged {
                name: self.t.spec.name.clone(),
                message: format!(
                    "its definition changed ({}); {span} ({:.0}% of the published) were landed under the old one and would be re-landed{}. Nothing was touched; re-run with --force if this is intended",
                    changed.join(", "),
                    share * 100.0,
                    if cursor {
                        ": a new cursor column changes which rows a window holds"
                    } else {
                        ""
                    }
                ),
            });
        }
        Ok(stale)
    }

    /// Finishes what a run that died left: a window whose swap happened
    /// (its `_manifest.json` carries the attempt's token) is recorded as
    /// published; any other attempt is recorded as failed and re-runs.
    pub(crate) fn recover(
        &self,
        store: &Mutex<Box<dyn StateStore>>,
        fence: &Fence,
    ) -> Result<(), IngestError> {
        let records = store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .windows(&self.t.spec.name)?;
        for mut r in records
            .into_iter()
            .filter(|r| r.status == WindowStatus::Running)
        {
            // On shared state a running window may be another process's,
            // alive under its window lease: it is not ours to settle.
            if self.state.is_shared() {
                let held = store
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .lease(&self.window_lease(r.start_us))?;
                if held.is_some_and(|l| l.expires_at_ns > now_ns()) {
                    continue;
                }
            }
            let w = Window {
                start_us: r.start_us,
                end_us: r.end_us,
            };
            let (_, abs) = self.t.window_path(&w);
            let on_disk = self.format.on_disk(&w, &abs)?;
            if let Some(d) = on_disk.as_ref().filter(|d| d.token != r.token) {
                // The attempt died before its swap; the version on disk is an
                // earlier, complete one, and it stays published, under the
                // recipe it was made with, not this attempt's: a re-land
                // after a recipe change that died leaves its window stale,
                // never fresh with the old rows. A recipe the output does
                // not keep counts as another one (the window lands again).
                r.token = d.token.clone();
                let recipe = d.recipe.clone().unwrap_or_default();
                if recipe != r.recipe {
                    r.recipe = recipe;
                    r.extra["recipe_parts"] = d.recipe_parts.clone();
                }
            }
            if let Some(d) = on_disk.filter(|d| d.token == r.token) {
                r.status = WindowStatus::Published;
                r.rows = d.rows.unwrap_or(r.rows);
                r.files = d.files;
                r.extra["digest"] = d.digest;
                if let Some(info) = d.compacted {
                    r.extra["compacted"] = info;
                }
                self.commit(store, fence, r)?;
            } else {
                r.status = WindowStatus::Failed;
                r.error = Some("interrupted before publish; it runs again".into());
                let mut s = store.lock().unwrap_or_else(|e| e.into_inner());
                s.commit_window(&r, None, fence)?;
            }
        }
        Ok(())
    }

    /// Records a window and moves the bookmark over every contiguous
    /// published window, by compare-and-set.
    ///
    /// On shared state other processes commit windows of the same source
    /// meanwhile: a compare-and-set that finds the bookmark moved reads
    /// again and retries, and after a published window is recorded the
    /// bookmark is settled once more from what is committed now. Of two
    /// windows committed at once, the later one's settle sees both, so the
    /// bookmark never stops short of a published window it could cover.
    fn commit(
        &self,
        store: &Mutex<Box<dyn StateStore>>,
        fence: &Fence,
        record: WindowRecord,
    ) -> Result<WindowCommit, IngestError> {
        let mut s = store.lock().unwrap_or_else(|e| e.into_inner());
        let g = &self.t.spec.grid;
        let mut written = false;
        for _ in 0..COMMIT_RETRIES_MAX {
            let bookmark = s.bookmark(&self.t.spec.name)?;
            let cur_end = bookmark.as_ref().map_or(g.start_us, |b| b.last_end_us);
            let mut published: BTreeSet<i64> = s
                .windows(&self.t.spec.name)?
                .into_iter()
                .filter(|r| r.status == WindowStatus::Published)
                .map(|r| r.start_us)
                .collect();
            if record.status == WindowStatus::Published {
                published.insert(record.start_us);
            } else {
                published.remove(&record.start_us);
            }
            let mut new_end = cur_end;
            while published.contains(&new_end) {
                new_end += g.interval_us;
            }
            let next = Bookmark {
                source: self.t.spec.name.clone(),
                last_end_us: new_end,
                horizon: bookmark.as_ref().and_then(|b| b.horizon),
            };
            if written && new_end == cur_end {
                return Ok(WindowCommit::Done);
            }
            let advance =
                (new_end != cur_end).then(|| (bookmark.as_ref().map(|b| b.last_end_us), &next));
            match s.commit_window(&record, advance, fence)? {
                WindowCommit::BookmarkMoved => continue,
                WindowCommit::Fenced => return Ok(WindowCommit::Fenced),
                WindowCommit::Done
                    if !self.state.is_shared() || record.status != WindowStatus::Published =>
                {
                    return Ok(WindowCommit::Done)
                }
                WindowCommit::Done => written = true,
            }
        }
        if written {
            // Recorded; the bookmark trails for now, and the next commit
            // of this source (or the next run) moves it.
            return Ok(WindowCommit::Done);
        }
        Ok(WindowCommit::BookmarkMoved)
    }

    /// The lease a window runs under on shared state.
    pub(crate) fn window_lease(&self, start_us: i64) -> String {
        format!("ingest:{}@{start_us}", self.t.spec.name)
    }

    fn record(&self, w: &Window, status: WindowStatus, token: &str) -> WindowRecord {
        let (path, _) = self.t.window_path(w);
        WindowRecord {
            source: self.t.spec.name.clone(),
            start_us: w.start_us,
            end_us: w.end_us,
            status,
            rows: 0,
            files: json!([]),
            duration_ms: 0,
            token: token.to_string(),
            recipe: self.t.recipe.clone(),
            updated_at_ns: now_ns(),
            error: None,
            extra: json!({"recipe_parts": self.t.spec.recipe_parts(), "path": path}),
        }
    }

    /// The attempt a chunked window resumes: its last record, not
    /// published, under the current recipe, with chunk records and its
    /// staging folder still there.
    fn resumable(
        &self,
        k: i64,
        records: &BTreeMap<i64, WindowRecord>,
        abs: &Path,
    ) -> Option<WindowRecord> {
        let by = &self.t.spec.chunking.as_ref()?.by;
        let r = records.get(&k)?;
        (r.status != WindowStatus::Published
            && r.recipe == self.t.recipe
            && r.extra["chunking"]["by"].as_str() == Some(by.as_str())
            && r.extra["chunks"].is_array()
            && publish::staging_path(abs, &r.token).is_dir())
        .then(|| r.clone())
    }

    /// Extracts a chunked window into `staging`: plans the chunks in an
    /// exported snapshot (or takes the recorded plan of the attempt it
    /// resumes), then reads the unfinished chunks `max_parallel` at a
    /// time, each on its own connection in that snapshot, recording each
    /// chunk as it finishes.
    #[allow(clippy::too_many_arguments)]
    fn extract_chunks(
        &self,
        w: &Window,
        pred: &Pred,
        staging: &Path,
        reader: &mut dyn Reader,
        ctx: &Ctx<'_>,
        rec: &Mutex<WindowRecord>,
        unique: bool,
    ) -> Result<(Option<u64>, Written), IngestError> {
        let chunking = self
            .t
            .spec
            .chunking
            .as_ref()
            .expect("called for chunked sources");
        let label = Self::label(w);
        let plan = reader.plan_chunks(pred, unique, &chunking.by, chunking.rows, &label)?;
        let result = (|| {
            let recorded: Option<Vec<ChunkRecord>> = {
                let r = rec.lock().unwrap_or_else(|e| e.into_inner());
                serde_json::from_value(r.extra["chunks"].clone()).ok()
            };
            let mut chunks: Vec<ChunkRecord> = match recorded {
                Some(c) if !c.is_empty() => c,
                _ => plan
                    .ranges
                    .iter()
                    .map(|r| ChunkRecord::pending(*r))
                    .collect(),
            };
            // A finished chunk counts only if its files are all there, as
            // written; anything else of it in staging is a torn write.
            for (i, c) in chunks.iter_mut().enumerate() {
                let whole = c.files.iter().all(|f| {
                    std::fs::metadata(staging.join(&f.path)).is_ok_and(|m| m.len() == f.bytes)
                });
                if c.status != "done" || !whole {
                    c.status = "pending".into();
                    remove_chunk_files(staging, i)?;
                }
            }
            {
                let mut r = rec.lock().unwrap_or_else(|e| e.into_inner());
                r.extra["chunking"] = json!({
                    "by": chunking.by,
                    "rows_target": chunking.rows,
                    "estimate_rows": plan.estimate_rows,
                });
                r.extra["chunks"] = json!(chunks);
                let mut s = ctx.store.lock().unwrap_or_else(|e| e.into_inner());
                if s.commit_window(&r, None, ctx.fence)? == WindowCommit::Fenced {
                    return Err(self.taken_over(&label));
                }
            }
            let todo: Vec<usize> = (0..chunks.len())
                .filter(|i| chunks[*i].status != "done")
                .collect();
            let chunks = Mutex::new(chunks);
            let next = AtomicUsize::new(0);
            let workers = ctx.chunk_parallel.clamp(1, 64).min(todo.len().max(1));
            std::thread::scope(|scope| -> Result<(), IngestError> {
                let handles: Vec<_> = (0..workers)
                    .map(|_| {
                        scope.spawn(|| -> Result<(), IngestError> {
                            let mut conn = source::open(&self.t.spec)?;
                            loop {
                                let Some(&i) = todo.get(next.fetch_add(1, Ordering::SeqCst)) else {
                                    return Ok(());
                                };
                                if ctx.lost.load(Ordering::SeqCst) {
                                    return Err(self.taken_over(&label));
                                }
                                self.read_chunk(
                                    i,
                                    w,
                                    pred,
                                    staging,
                                    conn.as_mut(),
                                    ctx,
                                    rec,
                                    &chunks,
                                    &plan.snapshot,
                                    &label,
                                )?;
                            }
                        })
                    })
                    .collect();
                let mut first_err = None;
                for h in handles {
                    if let Err(e) = h.join().expect("chunk workers do not panic") {
                        first_err.get_or_insert(e);
                    }
                }
                first_err.map_or(Ok(()), Err)
            })?;
            let chunks = chunks.into_inner().unwrap_or_else(|e| e.into_inner());
            let mut all = Written::default();
            for c in &chunks {
                all.files.extend(c.files.iter().cloned());
                all.rows += c.rows;
                let d = c
                    .digest
                    .as_deref()
                    .and_then(crate::digest::RowsDigest::parse)
                    .expect("a finished chunk records its digest");
                all.digest.merge(&d);
            }
            Ok((plan.duplicate_keys, all))
        })();
        let ended = reader.end_chunks();
        let out = result?;
        ended?;
        Ok(out)
    }

    /// Reads chunk `i` into its own files in `staging` and records it.
    #[allow(clippy::too_many_arguments)]
    fn read_chunk(
        &self,
        i: usize,
        w: &Window,
        pred: &Pred,
        staging: &Path,
        conn: &mut dyn Reader,
        ctx: &Ctx<'_>,
        rec: &Mutex<WindowRecord>,
        chunks: &Mutex<Vec<ChunkRecord>>,
        snapshot: &str,
        label: &str,
    ) -> Result<(), IngestError> {
        let by = &self.t.spec.chunking.as_ref().expect("chunked").by;
        let range = {
            let mut c = chunks.lock().unwrap_or_else(|e| e.into_inner());
            c[i].status = "running".into();
            c[i].reads += 1;
            c[i].snapshot = Some(snapshot.to_string());
            c[i].range()
        };
        let mut sink = ParquetSink::new_with(
            staging,
            &ctx.columns,
            self.t.spec.batch_rows,
            self.t.spec.file_rows_max,
            &format!("{i:04}-"),
            &self.t.spec.plain_columns(),
            self.format.extras(w),
        );
        let scope = Scope {
            pred: *pred,
            chunk: Some((by.as_str(), range)),
            snapshot: Some(snapshot),
        };
        let read = conn
            .read(&scope, false, &mut sink, label)
            .and_then(|_| sink.finish());
        let mut c = chunks.lock().unwrap_or_else(|e| e.into_inner());
        let failed = match &read {
            Ok(written) => {
                c[i].status = "done".into();
                c[i].rows = written.rows;
                c[i].files = written.files.clone();
                c[i].digest = Some(written.digest.render());
                c[i].error = None;
                false
            }
            Err(e) => {
                c[i].status = "failed".into();
                c[i].error = Some(e.to_string());
                true
            }
        };
        let mut r = rec.lock().unwrap_or_else(|e| e.into_inner());
        r.extra["chunks"] = json!(*c);
        drop(c);
        let fenced = {
            let mut s = ctx.store.lock().unwrap_or_else(|e| e.into_inner());
            s.commit_window(&r, None, ctx.fence)? == WindowCommit::Fenced
        };
        drop(r);
        read?;
        if fenced {
            return Err(self.taken_over(label));
        }
        if !failed && std::env::var_os("HIGHWATER_FAILPOINT").is_some_and(|v| v == "after-chunk") {
            // For the crash tests: die with this chunk recorded, others not.
            kill_self();
        }
        Ok(())
    }

    /// Who the lease `fence` names was lost to, in words, for the reasons
    /// of work left undone: the holder now (owner, host, pid) when the
    /// store can say, else only that it was lost.
    pub(crate) fn lost_to(&self, store: &Mutex<Box<dyn StateStore>>, fence: &Fence) -> String {
        crate::table::lost_to(store, fence)
    }

    fn taken_over(&self, window: &str) -> IngestError {
        IngestError::Read {
            name: self.t.spec.name.clone(),
            window: window.to_string(),
            message: "the lease was taken over; stopped".into(),
        }
    }

    /// The rows window `k` reads: its time range (widened by the lookback)
    /// or its id range, which its record keeps.
    fn pred_of(&self, k: i64, ctx: &Ctx<'_>, rec: &mut WindowRecord) -> Pred {
        let w = self.t.spec.grid.window(k);
        match self.t.spec.mode {
            Mode::UpdatedAt => Pred::Time {
                lo_us: w.start_us - self.t.spec.lookback_us,
                hi_us: w.end_us,
            },
            Mode::CommitOrder => Pred::Time {
                lo_us: w.start_us,
                hi_us: w.end_us,
            },
            Mode::AppendId => {
                let (lo, hi) = ctx.id_ranges[&k];
                rec.extra["id_range"] = json!({"after": lo, "through": hi});
                Pred::Ids { lo, hi }
            }
        }
    }

    /// Reads window `w`'s rows (`pred`) into `staging`: in one pass, or
    /// chunk by chunk (the chunks' progress kept in `rec`). Returns the
    /// duplicate keys found (when `unique_key` is checked) and what was
    /// written.
    fn extract(
        &self,
        w: &Window,
        pred: Pred,
        staging: &Path,
        reader: &mut dyn Reader,
        ctx: &Ctx<'_>,
        rec: &mut WindowRecord,
    ) -> Result<(Option<u64>, Written), IngestError> {
        let unique = self.t.spec.checks.unique_key != Policy::Off;
        if self.t.spec.chunking.is_some() {
            let shared = Mutex::new(rec.clone());
            let r = self.extract_chunks(w, &pred, staging, reader, ctx, &shared, unique);
            *rec = shared.into_inner().unwrap_or_else(|e| e.into_inner());
            r
        } else {
            let mut sink = ParquetSink::new_with(
                staging,
                &ctx.columns,
                self.t.spec.batch_rows,
                self.t.spec.file_rows_max,
                "",
                &self.t.spec.plain_columns(),
                self.format.extras(w),
            );
            let scope = Scope {
                pred,
                chunk: None,
                snapshot: None,
            };
            reader
                .read(&scope, unique, &mut sink, &Self::label(w))
                .and_then(|d| sink.finish().map(|written| (d, written)))
        }
    }

    /// The window's manifest: what was read and how, and `facts` (files,
    /// rows, digest, schema, checks, timing, token).
    fn manifest(
        &self,
        w: &Window,
        pred: &Pred,
        rec: &WindowRecord,
        facts: serde_json::Value,
    ) -> serde_json::Value {
        let mut m = json!({
            "source": self.t.spec.name,
            "window": {"start": format_rfc3339(w.start_us), "end": format_rfc3339(w.end_us)},
            "mode": self.t.spec.mode.as_str(),
            "read": match pred {
                Pred::Time { lo_us, hi_us } => json!({"cursor": self.t.spec.cursor, "from": format_rfc3339(*lo_us), "to": format_rfc3339(*hi_us)}),
                Pred::Ids { lo, hi } => json!({"cursor": self.t.spec.cursor, "after": lo, "through": hi}),
            },
            "chunks": rec.extra.get("chunks").cloned().unwrap_or(serde_json::Value::Null),
            "recipe": self.t.recipe,
            "recipe_parts": self.t.spec.recipe_parts(),
        });
        for (k, v) in facts.as_object().into_iter().flatten() {
            m[k] = v.clone();
        }
        m
    }

    /// Runs window `k` alone: read, checked, staged, published, recorded.
    pub(crate) fn run_one(
        &self,
        k: i64,
        reader: &mut dyn Reader,
        ctx: &Ctx<'_>,
    ) -> Result<WindowOutcome, IngestError> {
        match self.stage_one(k, reader, ctx)? {
            Err(done) => Ok(done),
            Ok(a) => Ok(self
                .publish_staged(vec![a], ctx)?
                .pop()
                .expect("one outcome per window")),
        }
    }

    /// Runs the windows `ks` of one publish group: each read, checked and
    /// staged in turn, then those that passed published together
    /// ([`TableFormat::publish_group`]). Outcomes in the order of `ks`.
    pub(crate) fn run_group(
        &self,
        ks: &[i64],
        reader: &mut dyn Reader,
        ctx: &Ctx<'_>,
    ) -> Result<Vec<WindowOutcome>, IngestError> {
        let mut done = Vec::new();
        let mut staged = Vec::new();
        for &k in ks {
            match self.stage_one(k, reader, ctx)? {
                Ok(a) => staged.push(a),
                Err(o) => done.push(o),
            }
        }
        done.extend(self.publish_staged(staged, ctx)?);
        done.sort_by(|a, b| a.start.cmp(&b.start));
        Ok(done)
    }

    /// Reads, checks and stages window `k`: the attempt, ready to publish;
    /// or (`Err`) the outcome of a window that will not be published now,
    /// its record already saying why.
    fn stage_one(
        &self,
        k: i64,
        reader: &mut dyn Reader,
        ctx: &Ctx<'_>,
    ) -> Result<Result<Attempt, WindowOutcome>, IngestError> {
        let w = self.t.spec.grid.window(k);
        let (rel, abs) = self.t.window_path(&w);
        // A chunked window that died part-way resumes its attempt: the same
        // token, staging folder and finished chunks.
        let resume = self.resumable(k, &ctx.records, &abs);
        let token = match &resume {
            Some(r) => r.token.clone(),
            None => self.t.token(k),
        };
        let mut a = Attempt {
            k,
            rec: self.record(&w, WindowStatus::Running, &token),
            outcome: WindowOutcome {
                start: format_rfc3339(w.start_us),
                end: format_rfc3339(w.end_us),
                path: rel,
                status: "failed",
                rows: 0,
                duration_ms: 0,
                warnings: Vec::new(),
                error: None,
            },
            staging: publish::staging_path(&abs, &token),
            abs,
            token,
            started: Instant::now(),
            previous: ctx
                .records
                .get(&k)
                .filter(|r| r.status == WindowStatus::Published)
                .cloned(),
            manifest: serde_json::Value::Null,
        };
        if let Some(r) = &resume {
            a.rec.extra["chunking"] = r.extra["chunking"].clone();
            a.rec.extra["chunks"] = r.extra["chunks"].clone();
        }
        let started_ok = ctx
            .store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .commit_window(&a.rec, None, ctx.fence)?;
        if started_ok == WindowCommit::Fenced {
            a.outcome.error = Some(format!(
                "not run: {}; run `highwater ingest {}` again",
                self.lost_to(ctx.store, ctx.fence),
                self.t.spec.name
            ));
            return Ok(Err(a.outcome));
        }
        let pred = self.pred_of(k, ctx, &mut a.rec);
        std::fs::create_dir_all(&a.staging)
            .map_err(|e| IngestError::io("creating", &a.staging, e))?;
        let extracted = self.extract(&w, pred, &a.staging, reader, ctx, &mut a.rec);
        let (
            dups,
            Written {
                files,
                rows,
                digest,
            },
        ) = match extracted {
            Ok(x) => x,
            Err(e) => {
                self.fail(&mut a, e.to_string(), ctx)?;
                return Ok(Err(a.outcome));
            }
        };
        a.rec.extra["digest"] = json!(digest.render());
        let extract_ms = a.started.elapsed().as_millis() as i64;
        a.outcome.rows = rows;
        let schema = crate::sink::schema_json(&ctx.columns);
        a.rec.extra["schema"] = schema.clone();
        // Checks, before anyone can see the window.
        let failures = self.check_window(
            k,
            &Checked {
                rows,
                dups,
                staging: &a.staging,
                schema: &schema,
                extract_ms,
            },
            ctx,
            &mut a.outcome.warnings,
        )?;
        if !failures.is_empty() {
            self.fail(
                &mut a,
                format!("not published: {}", failures.join("; ")),
                ctx,
            )?;
            return Ok(Err(a.outcome));
        }
        a.manifest = self.manifest(
            &w,
            &pred,
            &a.rec,
            json!({
                "files": files,
                "rows": rows,
                "digest": digest.render(),
                "schema": schema,
                "key_unique": {"checked": dups.is_some(), "duplicate_keys": dups},
                "extract_ms": extract_ms,
                "token": a.token,
            }),
        );
        Ok(Ok(a))
    }

    /// Attempt `a` fails with `msg`: a re-run that fails leaves the
    /// published version in place, and its record says so; only a window
    /// never published is recorded failed. A chunked window keeps its
    /// finished chunks for the next run.
    fn fail(&self, a: &mut Attempt, msg: String, ctx: &Ctx<'_>) -> Result<(), IngestError> {
        if self.t.spec.chunking.is_none() {
            let _ = std::fs::remove_dir_all(&a.staging);
        }
        a.outcome.error = Some(msg.clone());
        a.outcome.duration_ms = a.started.elapsed().as_millis() as u64;
        let record = match &a.previous {
            Some(p) => p.clone(),
            None => {
                a.rec.status = WindowStatus::Failed;
                a.rec.error = Some(msg);
                a.rec.duration_ms = a.outcome.duration_ms as i64;
                a.rec.clone()
            }
        };
        self.commit(ctx.store, ctx.fence, record)?;
        Ok(())
    }

    /// Publishes staged attempts (one, or one publish group together) and
    /// records them: the fence checked as late as possible before, each
    /// record committed after.
    fn publish_staged(
        &self,
        mut staged: Vec<Attempt>,
        ctx: &Ctx<'_>,
    ) -> Result<Vec<WindowOutcome>, IngestError> {
        if staged.is_empty() {
            return Ok(Vec::new());
        }
        let still_ours = !ctx.lost.load(Ordering::SeqCst) && {
            let mut s = ctx.store.lock().unwrap_or_else(|e| e.into_inner());
            s.renew_lease(
                ctx.fence,
                now_ns(),
                self.t.spec.lease_duration_s as i64 * 1_000_000_000,
            )?
        };
        if !still_ours {
            let why = self.lost_to(ctx.store, ctx.fence);
            return Ok(staged
                .into_iter()
                .map(|mut a| {
                    let _ = std::fs::remove_dir_all(&a.staging);
                    a.outcome.error = Some(format!(
                        "not published: {why} before publish; run `highwater ingest {}` again",
                        self.t.spec.name
                    ));
                    a.outcome
                })
                .collect());
        }
        if std::env::var_os("HIGHWATER_FAILPOINT").is_some_and(|v| v == "before-swap") {
            // For the crash tests: die with the window staged, not swapped.
            kill_self();
        }
        let ws: Vec<StagedWindow<'_>> = staged
            .iter()
            .map(|a| StagedWindow {
                k: a.k,
                staging: &a.staging,
                abs: &a.abs,
                manifest: &a.manifest,
                token: &a.token,
            })
            .collect();
        let published = self.format.publish(&ws, &ctx.columns);
        drop(ws);
        let compacted = match published {
            Ok(c) => c,
            // The windows' rows cannot join their compacted period (a type
            // that does not widen either way): they fail, the period keeps
            // its rows, and the run goes on.
            Err(e @ IngestError::Schema { .. }) => {
                let mut out = Vec::new();
                for mut a in staged {
                    self.fail(&mut a, e.to_string(), ctx)?;
                    out.push(a.outcome);
                }
                return Ok(out);
            }
            Err(e) => return Err(e),
        };
        if std::env::var_os("HIGHWATER_FAILPOINT").is_some_and(|v| v == "after-swap") {
            // For the crash tests: die between publish and record.
            kill_self();
        }
        let rewrote_period = compacted.iter().any(Option::is_some);
        let mut out = Vec::new();
        for (a, info) in staged.iter_mut().zip(compacted) {
            out.push(self.record_published(a, info, ctx)?);
        }
        if rewrote_period {
            // The other windows of the period moved within its new files.
            self.format.reconcile(&self.held(ctx.store, ctx.fence))?;
        }
        Ok(out)
    }

    /// Records published attempt `a` (`compacted`: the fact of the period
    /// its rows joined) and says so in its outcome.
    fn record_published(
        &self,
        a: &mut Attempt,
        compacted: Option<serde_json::Value>,
        ctx: &Ctx<'_>,
    ) -> Result<WindowOutcome, IngestError> {
        let mut rec = a.rec.clone();
        rec.status = WindowStatus::Published;
        rec.rows = a.outcome.rows as i64;
        rec.files = a.manifest["files"].clone();
        if let Some(info) = compacted {
            // The window's rows now live in its compacted period's files.
            rec.files = json!([]);
            rec.extra["compacted"] = info;
        }
        rec.duration_ms = a.started.elapsed().as_millis() as i64;
        rec.updated_at_ns = now_ns();
        let mut outcome = a.outcome.clone();
        match self.commit(ctx.store, ctx.fence, rec)? {
            WindowCommit::Done | WindowCommit::BookmarkMoved => {}
            WindowCommit::Fenced => {
                outcome.error = Some(format!(
                    "published, but not recorded: {} after publish; the next `highwater ingest {}` records it",
                    self.lost_to(ctx.store, ctx.fence),
                    self.t.spec.name
                ));
                return Ok(outcome);
            }
        }
        outcome.status = "published";
        outcome.duration_ms = a.started.elapsed().as_millis() as u64;
        Ok(outcome)
    }

    /// Ingests: recovers, chooses windows, runs them, moves the bookmark.
    pub fn run(&self, opts: &IngestOptions) -> Result<IngestReport, IngestError> {
        self.check_load_env()?;
        if self.state.is_shared() {
            return self.run_shared(opts);
        }
        self.leased(opts.wait, |store, fence, lost| {
            self.run_leased(opts, store, fence, lost)
        })
    }

    /// Runs `f` under the source's lease (shared by `ingest` and
    /// `compact`), with a heartbeat renewing it; releases it after.
    pub(crate) fn leased<T>(
        &self,
        wait: bool,
        f: impl FnOnce(&Mutex<Box<dyn StateStore>>, &Fence, &AtomicBool) -> Result<T, IngestError>,
    ) -> Result<T, IngestError> {
        let store = Mutex::new(self.state.open()?);
        let name = &self.t.spec.name;
        let lease_ns = self.t.spec.lease_duration_s as i64 * 1_000_000_000;
        let host = highwater_store::lease::host();
        let owner = format!("{host}:{}:{}", std::process::id(), &self.t.token(-1)[..8]);
        let lease_name = format!("ingest:{name}");
        let deadline = Instant::now()
            + Duration::from_secs(self.t.spec.lease_duration_s * LEASE_WAIT_LEASES_MAX);
        let acquire = |at_ns: i64| {
            store
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .acquire_lease(
                    &lease_name,
                    &owner,
                    &host,
                    std::process::id() as i64,
                    at_ns,
                    lease_ns,
                )
        };
        let lease = match highwater_store::lease::take(acquire, wait, deadline)? {
            Ok(l) => l,
            Err(h) => return Err(IngestError::held(name, h)),
        };
        let fence = Fence {
            name: lease_name,
            token: lease.token,
        };
        // The heartbeat renews the lease on its own connection; a renewal
        // that finds another token means another run took over, and this
        // run publishes nothing more.
        let heartbeat =
            highwater_store::lease::Heartbeat::start_in(&self.state, fence.clone(), lease_ns);
        let result = f(&store, &fence, heartbeat.lost_flag());
        drop(heartbeat);
        let _ = store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .release_lease(&fence);
        result
    }

    fn run_leased(
        &self,
        opts: &IngestOptions,
        store: &Mutex<Box<dyn StateStore>>,
        fence: &Fence,
        lost: &AtomicBool,
    ) -> Result<IngestReport, IngestError> {
        let plan = self.plan_windows(opts, store, fence)?;
        let ctx = Ctx {
            store,
            fence,
            lost,
            records: plan.records,
            columns: plan.columns,
            id_ranges: plan.id_ranges,
            chunk_parallel: opts.max_parallel,
        };
        let outcomes = self.run_windows(&plan.ks, &ctx, Some(plan.first), opts.max_parallel)?;
        let mut report = self.finish_windows(
            plan.report,
            outcomes,
            &plan.moved,
            plan.horizon,
            store,
            fence,
            lost,
        )?;
        self.load_owed(&mut report, store, fence)?;
        Ok(report)
    }

    /// What a run owes, decided under the source's lease: recovery of a
    /// dead run's windows, the windows to land, their id ranges, the
    /// horizon to move to when all are published.
    pub(crate) fn plan_windows(
        &self,
        opts: &IngestOptions,
        store: &Mutex<Box<dyn StateStore>>,
        fence: &Fence,
    ) -> Result<WindowPlan, IngestError> {
        let name = &self.t.spec.name;
        self.recover(store, fence)?;
        self.format.reconcile(&self.held(store, fence))?;
        let (bookmark, records) = {
            let s = store.lock().unwrap_or_else(|e| e.into_inner());
            (s.bookmark(name)?, s.windows(name)?)
        };
        let records: BTreeMap<i64, WindowRecord> = records
            .into_iter()
            .map(|r| (self.t.spec.grid.index_of(r.start_us), r))
            .collect();
        let mut report = IngestReport {
            source: name.clone(),
            bookmark_before: bookmark.as_ref().map(|b| format_rfc3339(b.last_end_us)),
            bookmark_after: None,
            windows: Vec::new(),
            warnings: Vec::new(),
            check_failures: 0,
            loads: Vec::new(),
        };
        let mut first = source::open(&self.t.spec)?;
        let columns = first.columns()?;
        // The format's schema rule, before any window runs: what no reader
        // could read beside what is published is refused (exit 2) with
        // nothing written.
        let columns = self
            .format
            .columns(columns, &records, &mut report.warnings)?;
        if let Some(ch) = &self.t.spec.chunking {
            // Refused before any window runs: every window would fail the
            // same way.
            let cut_on = columns.iter().find(|c| c.name == ch.by);
            match cut_on {
                Some(c) if matches!(c.ty, ColType::I16 | ColType::I32 | ColType::I64) => {}
                Some(c) => {
                    return Err(IngestError::Schema {
                        name: name.clone(),
                        message: format!(
                            "`chunk_by` column `{}` is {}, not an integer: chunks are ranges of an integer key. Chunk by an indexed integer column (the primary key, say), or remove `chunk_by`",
                            ch.by, c.source_type
                        ),
                    })
                }
                None => {
                    return Err(IngestError::Schema {
                        name: name.clone(),
                        message: format!(
                            "`chunk_by` names `{}`, which the table does not have (it has {}); name an indexed integer column",
                            ch.by,
                            columns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")
                        ),
                    })
                }
            }
            if !first.leads_an_index(&ch.by)? {
                report.warnings.push(format!(
                    "`chunk_by` column `{}` leads no index: each chunk scans the whole window for its key range, several times slower than through an index. Create one (`CREATE INDEX ON {} ({})`)",
                    ch.by,
                    self.t.spec.relation_sql(),
                    crate::config::quote_column(&ch.by)
                ));
            }
        }
        // commit_order: the horizon, and the published windows that rows of
        // late-committing transactions belong to.
        let (horizon, late) = if self.t.spec.mode == Mode::CommitOrder {
            let prev = bookmark.as_ref().and_then(|b| b.horizon);
            let (h, late) = first.horizon_and_late(prev)?;
            if prev == Some(h) {
                if let Some(who) = first.horizon_holder()? {
                    report.warnings.push(who);
                }
            }
            (Some(h), late)
        } else {
            (None, Vec::new())
        };
        let stale = self.stale_windows(opts, &records)?;
        let mut ks = self.choose(opts, bookmark.as_ref(), &records, &late)?;
        if opts.window.is_none() && opts.from_us.is_none() && opts.to_us.is_none() {
            // Windows published under another recipe, and published ones
            // whose folder is gone, are re-landed first, oldest first,
            // within the catch-up cap.
            let gone = self.gone_windows(&records);
            if let Some(first) = gone.first() {
                report.warnings.push(format!(
                    "{} published window(s) are gone from disk (first: {} at {}), deleted out of band: landing them again",
                    gone.len(),
                    self.t.spec.grid.window(*first),
                    records[first].extra["compacted"]["path"]
                        .as_str()
                        .or(records[first].extra["path"].as_str())
                        .unwrap_or("?")
                ));
            }
            let mut all: BTreeSet<i64> = stale.iter().chain(gone.iter()).copied().collect();
            for k in ks {
                if all.len() >= self.t.spec.catch_up_windows_max {
                    break;
                }
                all.insert(k);
            }
            ks = all.into_iter().collect();
            if !stale.is_empty() {
                report.warnings.push(format!(
                    "{} window(s) were published under another recipe ({}): re-landing them, oldest first",
                    stale.len(),
                    self.changed_parts(&records).join(", ")
                ));
            }
        }
        // append_id: ranges are given out in window order. A re-run reads
        // its recorded range; a new window takes what arrived since.
        let mut id_ranges = BTreeMap::new();
        if self.t.spec.mode == Mode::AppendId {
            let mut last = records
                .values()
                .filter_map(|r| r.extra["id_range"]["through"].as_i64())
                .max();
            let max_now = first.max_id()?;
            for &k in &ks {
                let recorded = records.get(&k).and_then(|r| {
                    let through = r.extra["id_range"]["through"].as_i64()?;
                    Some((r.extra["id_range"]["after"].as_i64(), through))
                });
                let range = match recorded {
                    Some(r) => r,
                    None => {
                        let hi = max_now.unwrap_or(0).max(last.unwrap_or(0));
                        let r = (last, hi);
                        last = Some(hi);
                        r
                    }
                };
                id_ranges.insert(k, range);
            }
        }
        self.format.refuse_windows(&ks)?;
        for &k in &ks {
            let abs = self.t.window_path(&self.t.spec.grid.window(k)).1;
            let keep = self
                .resumable(k, &records, &abs)
                .map(|r| publish::staging_path(&abs, &r.token));
            publish::sweep_staging(&abs, keep.as_deref());
        }
        // Where the stale windows were published, when the output moved:
        // the old folder goes once the window is published at the new one.
        // (Only for formats with a folder per window.)
        let moved: BTreeMap<String, String> = stale
            .iter()
            .filter(|_| self.format.window_folders())
            .filter_map(|k| {
                let r = &records[k];
                let old = r.extra["path"].as_str()?;
                let new = self.t.window_path(&self.t.spec.grid.window(*k)).0;
                (old != new).then(|| (format_rfc3339(r.start_us), old.to_string()))
            })
            .collect();
        Ok(WindowPlan {
            report,
            ks,
            records,
            columns,
            id_ranges,
            horizon,
            moved,
            first,
        })
    }

    /// Lands windows `ks` on up to `max_parallel` readers (one at a time for
    /// a chunked source, which spends the parallelism on chunks).
    pub(crate) fn run_windows(
        &self,
        ks: &[i64],
        ctx: &Ctx<'_>,
        first: Option<Box<dyn Reader>>,
        max_parallel: usize,
    ) -> Result<Vec<WindowOutcome>, IngestError> {
        let lost = ctx.lost;
        let groups = self.publish_groups(ks)?;
        let next = AtomicUsize::new(0);
        let outcomes = Mutex::new(Vec::new());
        let first = Mutex::new(first);
        // A chunked source runs its windows one at a time and spends the
        // parallelism on the chunks of each.
        let parallel = if self.t.spec.chunking.is_some() {
            1
        } else {
            max_parallel.clamp(1, 64).min(groups.len().max(1))
        };
        let stopped: Mutex<Option<String>> = Mutex::new(None);
        let first_error: Mutex<Option<IngestError>> = Mutex::new(None);
        std::thread::scope(|scope| -> Result<(), IngestError> {
            let mut handles = Vec::new();
            for _ in 0..parallel {
                handles.push(scope.spawn(|| -> Result<(), IngestError> {
                    let mut reader = match first.lock().unwrap_or_else(|e| e.into_inner()).take() {
                        Some(r) => r,
                        None => source::open(&self.t.spec)?,
                    };
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        let Some(group) = groups.get(i) else { return Ok(()) };
                        let not_run = |why: String| {
                            let mut o = outcomes.lock().unwrap_or_else(|e| e.into_inner());
                            o.extend(group.iter().map(|&k| self.failed_outcome(k, why.clone())));
                        };
                        // Lost: the windows not started are still owed, and
                        // reported failed (exit 1), not left out of the report
                        // as if the run had owed only the others.
                        if lost.load(Ordering::SeqCst) {
                            not_run(format!(
                                "not run: {}; run `highwater ingest {}` again",
                                self.lost_to(ctx.store, ctx.fence),
                                self.t.spec.name
                            ));
                            continue;
                        }
                        // An error that stops the run (storage gone, the
                        // state store failing): this window fails with it,
                        // the windows not started are reported not run, and
                        // the windows already published stay reported, so
                        // the exit code says some work was done (1), not
                        // none (2).
                        let stop = stopped.lock().unwrap_or_else(|e| e.into_inner()).clone();
                        if let Some(why) = stop {
                            not_run(format!(
                                "not run: an earlier window failed ({why}); run `highwater ingest {}` again",
                                self.t.spec.name
                            ));
                            continue;
                        }
                        let result = match group.as_slice() {
                            [k] => self.run_one(*k, reader.as_mut(), ctx).map(|o| vec![o]),
                            _ => self.run_group(group, reader.as_mut(), ctx),
                        };
                        match result {
                            Ok(o) => outcomes.lock().unwrap_or_else(|e| e.into_inner()).extend(o),
                            Err(e) => {
                                not_run(e.to_string());
                                stopped
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .get_or_insert_with(|| e.to_string());
                                first_error
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .get_or_insert(e);
                            }
                        }
                        if std::env::var_os("HIGHWATER_FAILPOINT")
                            .is_some_and(|v| v == "ingest-gate")
                        {
                            gate();
                        }
                    }
                }));
            }
            for h in handles {
                h.join().expect("window workers do not panic")?;
            }
            Ok(())
        })?;
        let mut outcomes = outcomes.into_inner().unwrap_or_else(|e| e.into_inner());
        // Nothing published: the error itself, as before any window ran
        // (exit 2, nothing was touched).
        if let Some(e) = first_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
            if !outcomes.iter().any(|o| o.status == "published") {
                return Err(e);
            }
        }
        outcomes.sort_by(|a, b| a.start.cmp(&b.start));
        Ok(outcomes)
    }

    /// `ks` (oldest first) in publish groups: consecutive windows the
    /// format publishes together ([`TableFormat::publish_group`]) form one
    /// group, every other window is a group of its own.
    fn publish_groups(&self, ks: &[i64]) -> Result<Vec<Vec<i64>>, IngestError> {
        let mut groups: Vec<(Option<i64>, Vec<i64>)> = Vec::new();
        for &k in ks {
            let g = self.format.publish_group(k)?;
            match groups.last_mut() {
                Some((last, members)) if g.is_some() && *last == g => members.push(k),
                _ => groups.push((g, vec![k])),
            }
        }
        Ok(groups.into_iter().map(|(_, members)| members).collect())
    }

    /// Window `k` reported failed with `error`, having published nothing.
    fn failed_outcome(&self, k: i64, error: String) -> WindowOutcome {
        let w = self.t.spec.grid.window(k);
        WindowOutcome {
            start: format_rfc3339(w.start_us),
            end: format_rfc3339(w.end_us),
            path: self.t.window_path(&w).0,
            status: "failed",
            rows: 0,
            duration_ms: 0,
            warnings: Vec::new(),
            error: Some(error),
        }
    }

    /// After the windows: old folders of moved windows go, the horizon
    /// moves when every owed window is published, continuity is checked.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn finish_windows(
        &self,
        mut report: IngestReport,
        outcomes: Vec<WindowOutcome>,
        moved: &BTreeMap<String, String>,
        horizon: Option<i64>,
        store: &Mutex<Box<dyn StateStore>>,
        fence: &Fence,
        lost: &AtomicBool,
    ) -> Result<IngestReport, IngestError> {
        let name = &self.t.spec.name;
        let all_ok = outcomes.iter().all(|o| o.status == "published");
        for o in outcomes.iter().filter(|o| o.status == "published") {
            let Some(old) = moved.get(&o.start) else {
                continue;
            };
            self.format.remove_old_window(old, &o.start)?;
        }
        report.windows = outcomes;
        // Files removed longer than their retention ago go now.
        if let Err(e) = self.format.after_run() {
            report.warnings.push(format!(
                "housekeeping of the output did not finish: {e}; the next run tries again"
            ));
        }
        let mut s = store.lock().unwrap_or_else(|e| e.into_inner());
        let after = s.bookmark(name)?;
        // The horizon moves only when every window this run owed is
        // published: otherwise the next run must look at the same rows.
        if let (Some(h), Some(b), true) = (horizon, after.as_ref(), all_ok) {
            if lost.load(Ordering::SeqCst) {
                // Not moved: the next run reads the same rows again. Not
                // everything asked was done, so the run says so (exit 1).
                drop(s);
                report.check_failures += 1;
                report.warnings.push(format!(
                    "the commit_order horizon was not moved: {}; run `highwater ingest {}` again",
                    self.lost_to(store, fence),
                    name
                ));
                s = store.lock().unwrap_or_else(|e| e.into_inner());
            } else {
                s.advance_horizon(name, b.last_end_us, h, fence)?;
            }
        }
        report.bookmark_after = after.map(|b| format_rfc3339(b.last_end_us));
        if self.t.spec.checks.continuity != Policy::Off {
            let recs = s.windows(name)?;
            let published: BTreeSet<i64> = recs
                .iter()
                .filter(|r| r.status == WindowStatus::Published)
                .map(|r| r.start_us)
                .collect();
            if let (Some(&lo), Some(&hi)) = (published.first(), published.last()) {
                let g = &self.t.spec.grid;
                let missing: Vec<String> = (g.index_of(lo)..=g.index_of(hi))
                    .map(|k| g.window(k))
                    .filter(|w| !published.contains(&w.start_us))
                    .map(|w| w.to_string())
                    .collect();
                if !missing.is_empty() {
                    if self.t.spec.checks.continuity == Policy::Fail {
                        report.check_failures += 1;
                    }
                    report.warnings.push(format!(
                        "continuity: {} windows between the first and the newest are not published: {}",
                        missing.len(),
                        missing.iter().take(10).cloned().collect::<Vec<_>>().join(", ")
                    ));
                }
            }
        }
        Ok(report)
    }

    /// Who holds the source's lease (shared by ingest and compact), if
    /// anyone: owner, host, pid, expiry.
    pub fn lease_holder(&self) -> Result<Option<highwater_store::Lease>, IngestError> {
        let s = self.state.open()?;
        Ok(s.lease(&format!("ingest:{}", self.t.spec.name))?)
    }

    /// The completion grid: one row per expected window up to `now`, the
    /// newest `last_n` of them, with the layout of their files.
    pub fn grid(&self, now_us: i64, last_n: usize) -> Result<GridView, IngestError> {
        let s = self.state.open()?;
        let g = &self.t.spec.grid;
        let records: BTreeMap<i64, WindowRecord> = s
            .windows(&self.t.spec.name)?
            .into_iter()
            .map(|r| (g.index_of(r.start_us), r))
            .collect();
        let closed = g.closed_count(now_us, self.t.spec.settle_us);
        let from = (closed - last_n as i64).max(0);
        let interval_ms = g.interval_us as f64 / 1000.0;
        let mut file_sizes = Vec::new();
        let mut files_per_window = Vec::new();
        let mut periods: BTreeMap<String, CompactedPeriod> = BTreeMap::new();
        let mut manifests = BTreeMap::new();
        let rows = (from..closed)
            .map(|k| {
                let w = g.window(k);
                let r = records.get(&k);
                // Published, but gone from disk: shown as missing, as the
                // next ingest sees it.
                let gone = r.filter(|r| {
                    r.status == WindowStatus::Published && !self.format.has_window(r, &mut manifests)
                });
                let note = gone.map(|r| {
                    format!(
                        "published at {}, but {} is gone (deleted out of band?); the next `highwater ingest {}` lands it again",
                        format_rfc3339(r.updated_at_ns / 1000),
                        r.extra["compacted"]["path"]
                            .as_str()
                            .or(r.extra["path"].as_str())
                            .unwrap_or("its folder"),
                        self.t.spec.name
                    )
                });
                let r = if gone.is_some() { None } else { r };
                let prior: Vec<f64> = (1..=7)
                    .filter_map(|d| records.get(&g.index_of(w.start_us - d * DAY_US)))
                    .filter(|r| r.status == WindowStatus::Published)
                    .map(|r| r.rows as f64)
                    .collect();
                let published = r.filter(|r| r.status == WindowStatus::Published);
                let compacted = published
                    .and_then(|r| r.extra["compacted"]["path"].as_str())
                    .map(str::to_string);
                let files = published.and_then(|r| r.files.as_array()).map(|f| f.len());
                if let (Some(r), None) = (published, &compacted) {
                    let fs = r.files.as_array().cloned().unwrap_or_default();
                    files_per_window.push(fs.len() as f64);
                    file_sizes.extend(fs.iter().filter_map(|f| f["bytes"].as_u64()));
                }
                if let Some(path) = &compacted {
                    if !periods.contains_key(path) {
                        let dir = self.t.root.join(path);
                        if let Some(m) = crate::compact::read_manifest(&dir) {
                            periods.insert(
                                path.clone(),
                                CompactedPeriod {
                                    start: format_rfc3339(m.start_us),
                                    end: format_rfc3339(m.end_us),
                                    path: path.clone(),
                                    files: m.files.len(),
                                    bytes: m.files.iter().map(|f| f.bytes).sum(),
                                },
                            );
                        }
                    }
                }
                let chunks = r.and_then(|r| r.extra["chunks"].as_array()).map(|cs| {
                    let mut by: BTreeMap<String, usize> = BTreeMap::new();
                    for c in cs {
                        *by.entry(c["status"].as_str().unwrap_or("?").to_string())
                            .or_default() += 1;
                    }
                    by
                });
                GridRow {
                    start: format_rfc3339(w.start_us),
                    end: format_rfc3339(w.end_us),
                    // Published under another recipe: stale until re-landed.
                    status: r.map_or("missing", |r| {
                        if r.status == WindowStatus::Published && r.recipe != self.t.recipe {
                            "stale"
                        } else {
                            r.status.as_str()
                        }
                    }),
                    rows: published.map(|r| r.rows),
                    prior_rows_median: median(prior),
                    duration_ms: r.map(|r| r.duration_ms),
                    duration_share_of_interval: r.map(|r| r.duration_ms as f64 / interval_ms),
                    files,
                    compacted,
                    chunks,
                    note,
                    digest: published
                        .and_then(|r| r.extra["digest"].as_str())
                        .map(str::to_string),
                    load: published
                        .filter(|_| self.t.spec.load.is_some())
                        .map(crate::load::cell),
                }
            })
            .collect();
        let file_bytes_median = median(file_sizes.iter().map(|b| *b as f64).collect());
        let advice = match file_bytes_median {
            Some(m) if file_sizes.len() >= 2 && (m as u64) < EFFICIENT_FILE_BYTES / 4 => {
                let mb = m / (1u64 << 20) as f64;
                Some(if self.t.spec.compaction.is_some() {
                    format!(
                        "files are a median {mb:.1} MB, far below the {} MB an efficient Parquet read wants: run `highwater compact {}` over the closed periods",
                        EFFICIENT_FILE_BYTES >> 20,
                        self.t.spec.name
                    )
                } else {
                    // How many windows it takes to fill an efficient file.
                    let per_window = m * median(files_per_window.clone()).unwrap_or(1.0);
                    let factor = (EFFICIENT_FILE_BYTES as f64 / per_window.max(1.0)).ceil();
                    format!(
                        "files are a median {mb:.1} MB, far below the {} MB an efficient Parquet read wants: a {}x longer interval, or a [sources.{}.compact] section rolling windows up (then `highwater compact`), would fix that",
                        EFFICIENT_FILE_BYTES >> 20,
                        factor,
                        self.t.spec.name
                    )
                })
            }
            _ => None,
        };
        Ok(GridView {
            rows,
            bookmark: s.bookmark(&self.t.spec.name)?,
            layout: Layout {
                files_per_window_median: median(files_per_window),
                file_bytes_median: file_bytes_median.map(|m| m as u64),
                compacted_periods: periods.into_values().collect(),
                advice,
            },
        })
    }
}
