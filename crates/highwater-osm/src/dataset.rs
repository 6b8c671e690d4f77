//! One trait for every derived dataset. Each kind implements it in its
//! own folder, which owns its tables and describes itself as a [`Kind`];
//! the registry (`crate::registry`, the one list of kinds) gives their
//! tables to the store. This module names no dataset: it is below them,
//! and they import it. `ops::apply` and the CLI's drain, rebuild and verify
//! reach datasets only through this trait, and the config reaches a
//! kind's section (`[osm.KIND.NAME]`) only through its [`Kind::configure`],
//! so a fourth kind is its own folder and a line in the registry.
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
use crate::store::{DrainOrder, Store, StoreError, Writer};
use highwater_core::tile::Tile;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One kind of dataset, as the registry (`crate::registry`) lists it.
#[derive(Clone, Copy, Debug)]
pub struct Kind {
    /// What [`Dataset::kind`] says, and its config section: the datasets
    /// of the kind are `[osm.NAME_OF_KIND.NAME]`.
    pub name: &'static str,
    /// The tables it keeps in the store (`CREATE TABLE IF NOT EXISTS
    /// ...`), created with the store's own: its own, and any shared one it
    /// uses (kinds may list one twice; it is created once).
    pub tables: &'static [&'static str],
    /// Where apply and the drains visit its datasets: lower first, then
    /// in the registry's order (cheap keyed datasets before a tile drain
    /// that `--max` may bound).
    pub order: u8,
    /// Reads its section of the config: every `[osm.KIND.NAME]`, by name,
    /// with the project root (files it names are inside it). An error is
    /// the message after `[osm] `; the section's own keys are refused by
    /// the kind (`#[serde(deny_unknown_fields)]`, through [`section`]).
    pub configure: Configure,
}

/// A kind's [`Kind::configure`]: the project root and every
/// `[osm.KIND.NAME]` section of the config, by name.
pub type Configure = fn(&Path, Sections) -> Result<Vec<Configured>, String>;

/// A kind's config sections, `[osm.KIND.NAME]` by `NAME`.
pub type Sections = BTreeMap<String, toml::Value>;

/// One dataset as its kind read it from the config, with the guard
/// settings every kind takes (`affected_guard`, `affected_guard_min`),
/// which the config checks alike for all.
pub struct Configured {
    pub dataset: Arc<dyn Dataset>,
    pub affected_guard: Option<f64>,
    pub affected_guard_min: Option<usize>,
}

/// A dataset's section (`[osm.KIND.NAME]`) as the kind's own struct: an
/// unknown key is refused, named with its section, with the keys it knows.
pub fn section<T: serde::de::DeserializeOwned>(
    kind: &str,
    name: &str,
    v: toml::Value,
) -> Result<T, String> {
    v.try_into()
        .map_err(|e: toml::de::Error| format!("[osm.{kind}.{name}]: {}", e.message()))
}

/// A relative path without `..`, joined to the project root: the files
/// and folders a dataset's section names.
pub fn safe_file(root: &Path, f: &str) -> Option<PathBuf> {
    let p = Path::new(f);
    let ok = !f.is_empty()
        && p.components().all(|c| {
            matches!(
                c,
                std::path::Component::Normal(_) | std::path::Component::CurDir
            )
        });
    ok.then(|| root.join(p))
}

/// Any dataset as [`std::any::Any`], so a caller that knows a kind (its
/// own commands: `osm tiles`, `osm search`) finds its datasets by type,
/// never by name.
pub trait AsAny {
    fn as_any(&self) -> &dyn std::any::Any;
}

impl<T: std::any::Any> AsAny for T {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// What `osm status` shows of every dataset alike.
pub struct StatusContext {
    /// The store's sequence.
    pub sequence: Option<i64>,
    /// Per dataset: its marker, recorded recipe and dirty count.
    pub markers: BTreeMap<String, (Option<i64>, String, i64)>,
    /// `[osm] rebuild_gap_max`.
    pub rebuild_gap_max: i64,
}

/// What one apply did, per dataset.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DatasetReport {
    pub name: String,
    pub tiles: usize,
    /// The tiles the batch dirtied (tile datasets), gathered diff by diff
    /// and written once by `Dataset::commit`.
    #[serde(skip)]
    pub dirty: BTreeSet<Tile>,
    /// Per dirty tile, the features whose cut in it the batch changed, or
    /// `None` when the tile must be cut whole (tile datasets; see
    /// `tiles::patch`).
    #[serde(skip)]
    pub touched: std::collections::BTreeMap<Tile, Option<BTreeSet<crate::features::ElementKey>>>,
    pub changes: usize,
    pub filtered: usize,
    /// Set when a diff dirtied more than `tiles_affected_max` tiles and
    /// expiry zoomed out to this zoom for it.
    pub zoomed_out_to: Option<u8>,
    /// The size of the current diff's affected set (before any zooming
    /// out), for the guard; set by `derive` (tiles) or from the touched
    /// set (keyed datasets).
    #[serde(skip)]
    pub last_affected: Option<usize>,
    /// The current diff's features whose read tags changed.
    #[serde(skip)]
    pub last_read: usize,
    /// What step 1 kept of the current diff for step 3 to finish its
    /// affected set from the shapes index (tile datasets,
    /// [`crate::derive::Before`]).
    #[serde(skip)]
    pub before: Option<crate::derive::Before>,
    /// Set when the guard holds the dataset (issue 23).
    pub held: Option<Held>,
    /// Said on stderr: a diff that changed what the dataset reads yet
    /// derived nothing, a hold.
    pub warnings: Vec<String>,
}

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
    /// Dirty tiles `serve` was asked for first, most requested first
    /// (`--priority requested`, issue 23); then `order`.
    pub requested: bool,
}

impl Default for DrainLimits {
    fn default() -> Self {
        DrainLimits {
            tiles_max: usize::MAX,
            order: DrainOrder::LowZoomFirst,
            requested: false,
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

pub trait Dataset: Send + Sync + AsAny {
    fn name(&self) -> &str;
    /// Its [`Kind::name`].
    fn kind(&self) -> &'static str;
    fn recipe(&self) -> &str;
    /// What the dirty set holds, for messages (`dirty tiles`).
    fn dirty_what(&self) -> &'static str {
        "dirty keys"
    }

    /// Whether its dirty set is tiles: its `derive` measures the affected
    /// set itself (else it is the elements a diff touched), and the apply
    /// report lists it. Default: no.
    fn dirties_tiles(&self) -> bool {
        false
    }

    /// The key of its outcome JSON (or of the JSON's `rebuilt`) that
    /// counts the units a rebuild made, for the crossover. Default: none
    /// (its rebuilds record 0 units).
    fn unit_key(&self) -> Option<&'static str> {
        None
    }

    /// The low-zoom predicate of the shapes index it needs, if any (all
    /// tile datasets of a config share one). Default: none.
    fn low_zoom(&self) -> Option<Arc<crate::features::LowZoom>> {
        None
    }

    /// The files and folders it names, each with what it is
    /// (`[osm.KIND.NAME] key`), for the collision check at config load.
    /// Default: none.
    fn paths(&self) -> Vec<(String, PathBuf)> {
        Vec::new()
    }

    /// Its entry in `osm status`. Default: a keyed dataset's
    /// ([`keyed_status`]).
    fn status(&self, store: &Store, cx: &StatusContext) -> Result<serde_json::Value, StoreError> {
        keyed_status(store, cx, (self.kind(), self.name(), self.recipe()), None)
    }

    /// Step 1: before a diff is applied, what it affects. Default: nothing.
    fn derive(
        &self,
        _w: &mut Writer<'_>,
        _changes: &[Change],
        _report: &mut DatasetReport,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    /// Step 3: after the diff is applied (in the same transaction), the
    /// elements it touched, with what step 1 put in `report`. Default: a
    /// keyed dataset's, the touched elements recorded as its dirty keys
    /// ([`record_touched`]), which its drain recomputes.
    fn touched(
        &self,
        w: &mut Writer<'_>,
        touched: &Touched,
        _report: &mut DatasetReport,
    ) -> Result<(), StoreError> {
        record_touched(w, self.name(), touched)
    }

    /// Step 4: the batch's dirty set and marker.
    fn commit(
        &self,
        w: &mut Writer<'_>,
        sequence: Option<i64>,
        _report: &mut DatasetReport,
    ) -> Result<(), StoreError> {
        w.set_marker(self.name(), sequence, self.recipe())?;
        Ok(())
    }

    /// The units its drain clears: its dirty keys (a kind whose dirty set
    /// is elsewhere says so).
    fn dirty_units(&self, store: &Store) -> Result<u64, StoreError> {
        Ok(store.dirty_keys(self.name())?.len() as u64)
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

/// The outcome of comparing a dataset with its rebuild, given what was
/// checked and a line per difference.
pub fn verified(name: &str, t0: Instant, checked: usize, differences: Vec<String>) -> Outcome {
    verified_pending(name, t0, checked, differences, Vec::new())
}

/// [`verified`], with the entries that differ only because their keys
/// are dirty (recorded, not yet drained: a held dataset's, or a deferred
/// drain's) counted apart (issue 50): they are what the next drain
/// applies, not differences, as tile `verify` skips dirty tiles.
pub fn verified_pending(
    name: &str,
    t0: Instant,
    checked: usize,
    differences: Vec<String>,
    pending: Vec<String>,
) -> Outcome {
    let mut text = format!(
        "{name}: {checked} checked against a rebuild, {} differ",
        differences.len()
    );
    if !pending.is_empty() {
        text += &format!(
            "; {} more differ only by dirty keys the next drain applies (`highwater osm drain {name}`), not counted",
            pending.len()
        );
    }
    for d in &differences {
        text += &format!("\n  {d}");
    }
    let n = differences.len();
    let json = serde_json::json!({
        "dataset": name,
        "checked": checked,
        "differences": differences,
        "pending": pending.len(),
    });
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

// ---------------------------------------------------------------------
// The guard on the affected set (issue 23): "Affected set size
// distribution: a derivation returning nothing, or everything:
// investigate before applying the update." Each dataset keeps the sizes
// of its recent affected sets (in the store's meta, so the history
// survives restarts); a diff far outside them still applies to the
// primary store, which must follow the sequence, but holds that dataset:
// its marker stops, its drain refuses, until `--force` or a rebuild.

/// Affected-set sizes kept per dataset: the guard's median is of these.
pub const AFFECTED_HISTORY_MAX: usize = 50;

/// The default `affected_guard`: a diff more than this many times the
/// median of the recent affected sets holds the dataset.
pub const AFFECTED_GUARD_DEFAULT: f64 = 50.0;

/// The default `affected_guard_min`: affected sets up to this size are
/// never held, whatever the median (Monaco's real minutely diffs have a
/// median of 0 tiles and now and then dirty 80).
pub const AFFECTED_GUARD_MIN_DEFAULT: usize = 1000;

/// The share rule (issue 50): an affected set of at least this share of
/// the dataset's units (as its last rebuild made them) is "everything",
/// held however small the dataset (below `affected_guard_min`, a city's
/// whole tile set is), when it is also more than
/// [`AFFECTED_GUARD_SHARE_FACTOR`] times the recent median.
pub const AFFECTED_GUARD_SHARE: f64 = 0.5;

/// Under the share rule, "far above the median" is this many times it: a
/// dataset smaller than `affected_guard` times its median can never be
/// that far above it, yet a diff touching half of it after diffs that
/// touch one unit is no routine edit.
pub const AFFECTED_GUARD_SHARE_FACTOR: f64 = 4.0;

/// Under the share rule, the diff also changes at least this many
/// elements: one edit to a large feature (Monaco's boundary relation, in
/// real diff 3065, one element) legitimately touches most of a small
/// dataset; "everything moved" is many elements (every building of
/// Monaco: 8,521 nodes). Monaco's real minutely diffs change at most 11.
pub const AFFECTED_GUARD_SHARE_CHANGES_MIN: usize = 100;

fn history_key(name: &str) -> String {
    format!("affected_sizes:{name}")
}

fn held_key(name: &str) -> String {
    format!("held:{name}")
}

/// Why a dataset is held: the diff, its affected-set size, the median it
/// was measured against, and the marker the dataset stopped at.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Held {
    pub diff: String,
    pub size: usize,
    pub median: f64,
    pub factor: f64,
    /// The dataset's marker when it was held (the sequence before the diff).
    pub marker: Option<i64>,
    /// Held by the share rule: the dataset's units (its last rebuild's),
    /// of which the diff affected at least [`AFFECTED_GUARD_SHARE`].
    #[serde(default)]
    pub total: Option<usize>,
}

impl Held {
    /// The refusal, for people.
    pub fn message(&self, dataset: &str) -> String {
        let why = match self.total {
            Some(t) => format!(
                "{} of its {t} units (at least {:.0}%, with {} or more elements changed), more than {} times the median {} of its last affected sets",
                self.size,
                AFFECTED_GUARD_SHARE * 100.0,
                AFFECTED_GUARD_SHARE_CHANGES_MIN,
                AFFECTED_GUARD_SHARE_FACTOR,
                self.median
            ),
            None => format!(
                "{} units, more than affected_guard = {} times the median {} of its last affected sets",
                self.size, self.factor, self.median
            ),
        };
        format!(
            "{dataset} is held: diff {} affected {why} (a mass edit, vandalism or a derivation bug?); investigate, then `highwater osm drain {dataset} --force` (apply what is recorded and end the hold) or `highwater osm rebuild {dataset}`",
            self.diff
        )
    }
}

/// The hold on a dataset, if any.
pub fn held(store: &Store, name: &str) -> Result<Option<Held>, StoreError> {
    Ok(store
        .meta(&held_key(name))?
        .and_then(|v| serde_json::from_str(&v).ok()))
}

pub(crate) fn held_in(w: &Writer<'_>, name: &str) -> Result<Option<Held>, StoreError> {
    Ok(w.meta(&held_key(name))?
        .and_then(|v| serde_json::from_str(&v).ok()))
}

/// Ends a hold (after `--force` or a rebuild).
pub fn release(store: &mut Store, name: &str) -> Result<(), StoreError> {
    store.write(|w| w.del_meta(&held_key(name)))
}

/// Ends a hold after a forced drain: the marker moves to the store's
/// sequence (the dirty set holds every diff since the hold).
pub fn release_at_store(store: &mut Store, d: &dyn Dataset) -> Result<(), StoreError> {
    store.write(|w| {
        let seq: Option<i64> = w.meta("sequence")?.and_then(|s| s.parse().ok());
        w.set_marker(d.name(), seq, d.recipe())?;
        w.del_meta(&held_key(d.name()))
    })
}

/// The median of a list of sizes (0 for none).
pub fn median(sizes: &[usize]) -> f64 {
    if sizes.is_empty() {
        return 0.0;
    }
    let mut v = sizes.to_vec();
    v.sort_unstable();
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2] as f64
    } else {
        (v[n / 2 - 1] + v[n / 2]) as f64 / 2.0
    }
}

/// The recent affected-set sizes of a dataset, oldest first.
pub fn history(store: &Store, name: &str) -> Result<Vec<usize>, StoreError> {
    Ok(parse_sizes(store.meta(&history_key(name))?))
}

fn parse_sizes(v: Option<String>) -> Vec<usize> {
    v.map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_default()
}

/// What the guard decided for one diff of one dataset.
#[derive(Debug, PartialEq)]
pub enum Guarded {
    /// Within the distribution (or no history yet): recorded.
    Passed,
    /// Held now, by this diff.
    HeldNow(Held),
    /// Held already, by an earlier diff: the marker stays where it was.
    StillHeld(Held),
}

/// Checks one diff's affected-set size against the dataset's history, in
/// the apply's transaction. The rule (issue 50), with `m` the median of
/// the recent affected sets (0 counted as 1) and `T` the units the
/// dataset's last rebuild made:
/// - held when the set is more than `min` units and more than `factor`
///   times `m` (large datasets: the floor keeps routine diffs of a few
///   hundred units from being held after quiet ones), or
/// - held when the set is at least [`AFFECTED_GUARD_SHARE`] of `T`, more
///   than [`AFFECTED_GUARD_SHARE_FACTOR`] times `m`, and the diff changed
///   at least [`AFFECTED_GUARD_SHARE_CHANGES_MIN`] elements ("everything",
///   at any size: a city's whole tile set is below the floor; one edit to
///   one large feature is not "everything").
///
/// `size` is (the affected set's units, the diff's changed elements).
///
/// `factor` 0 turns the guard off. A first diff, with no history, is never
/// held; a held diff's size does not enter the history (it would drag the
/// median towards the mass edit).
pub fn guard(
    w: &mut Writer<'_>,
    name: &str,
    (factor, min): (f64, usize),
    (size, changes): (usize, usize),
    diff: &str,
    marker: Option<i64>,
) -> Result<Guarded, StoreError> {
    if let Some(h) = held_in(w, name)? {
        return Ok(Guarded::StillHeld(h));
    }
    let mut sizes = parse_sizes(w.meta(&history_key(name))?);
    let m = median(&sizes);
    // A median of 0 (diffs that affect nothing) counts as 1: a diff of a
    // few units after many empty ones is no mass edit.
    let total: Option<usize> = w
        .meta(&costs_key(name))?
        .and_then(|t| serde_json::from_str::<Costs>(&t).ok())
        .and_then(|c| c.rebuilds.last().map(|r| r.units as usize))
        .filter(|t| *t > 0);
    let far = |k: f64| size as f64 > k * m.max(1.0);
    let by_floor = size > min && far(factor);
    let by_share = total.is_some_and(|t| size as f64 >= AFFECTED_GUARD_SHARE * t as f64)
        && far(AFFECTED_GUARD_SHARE_FACTOR.min(factor))
        && changes >= AFFECTED_GUARD_SHARE_CHANGES_MIN;
    if factor > 0.0 && !sizes.is_empty() && (by_floor || by_share) {
        let h = Held {
            diff: diff.to_string(),
            size,
            median: m,
            factor,
            marker,
            total: (!by_floor).then_some(total).flatten(),
        };
        w.set_meta(
            &held_key(name),
            &serde_json::to_string(&h).expect("plain data"),
        )?;
        return Ok(Guarded::HeldNow(h));
    }
    sizes.push(size);
    let drop = sizes.len().saturating_sub(AFFECTED_HISTORY_MAX);
    sizes.drain(..drop);
    let text: Vec<String> = sizes.iter().map(|s| s.to_string()).collect();
    w.set_meta(&history_key(name), &text.join(","))?;
    Ok(Guarded::Passed)
}

// ---------------------------------------------------------------------
// The rebuild crossover (issue 23): "The crossover point is
// dataset-specific and worth measuring rather than guessing." Every drain
// and rebuild records its duration and size; status predicts the
// backlog's drain time from the measured cost per dirty unit, against the
// last rebuild's time, and watches the cost per diff trend towards it.

/// Drains and rebuilds remembered per dataset.
pub const COSTS_KEPT_MAX: usize = 20;

fn costs_key(name: &str) -> String {
    format!("costs:{name}")
}

/// One measured run: seconds, dirty units it cleared (or units a rebuild
/// made), and diffs it covered (drains).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Run {
    pub seconds: f64,
    pub units: u64,
    #[serde(default)]
    pub diffs: u64,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Costs {
    pub drains: Vec<Run>,
    pub rebuilds: Vec<Run>,
    /// The store's sequence at the last drain or rebuild: the next drain
    /// covers the diffs after it.
    pub sequence: Option<i64>,
}

pub fn costs(store: &Store, name: &str) -> Result<Costs, StoreError> {
    Ok(store
        .meta(&costs_key(name))?
        .and_then(|v| serde_json::from_str(&v).ok())
        .unwrap_or_default())
}

fn keep(v: &mut Vec<Run>, r: Run) {
    v.push(r);
    let drop = v.len().saturating_sub(COSTS_KEPT_MAX);
    v.drain(..drop);
}

/// Records a drain (`rebuilt` false) or rebuild of `units` in `seconds`.
pub fn record_run(
    store: &mut Store,
    name: &str,
    rebuilt: bool,
    seconds: f64,
    units: u64,
) -> Result<(), StoreError> {
    let mut c = costs(store, name)?;
    let seq: Option<i64> = store.meta("sequence")?.and_then(|s| s.parse().ok());
    let diffs = match (seq, c.sequence) {
        (Some(a), Some(b)) => (a - b).max(0) as u64,
        _ => 0,
    };
    if rebuilt {
        keep(
            &mut c.rebuilds,
            Run {
                seconds,
                units,
                diffs,
            },
        );
    } else if units > 0 {
        // A drain of nothing measures only its overhead.
        keep(
            &mut c.drains,
            Run {
                seconds,
                units,
                diffs,
            },
        );
    }
    c.sequence = seq;
    let text = serde_json::to_string(&c).expect("plain data");
    let failed = store.meta(&failed_key(name))?.is_some();
    store.write(|w| {
        w.set_meta(&costs_key(name), &text)?;
        // A drain or rebuild that succeeded ends the failure status shows.
        if failed {
            w.del_meta(&failed_key(name))?;
        }
        Ok(())
    })
}

fn failed_key(name: &str) -> String {
    format!("drain_failed:{name}")
}

/// The last drain of a dataset that failed, kept until a drain or rebuild
/// succeeds (issue 50: status showed only "N dirty" and the previous
/// drain's time, green, while every drain failed).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FailedDrain {
    /// RFC 3339, UTC.
    pub at: String,
    pub error: String,
}

/// Records a failed drain; a store that cannot take it is said on stderr
/// by the caller, the drain's own error being the one to report.
pub fn record_failed_drain(store: &mut Store, name: &str, error: &str) -> Result<(), StoreError> {
    let f = FailedDrain {
        at: highwater_core::window::format_rfc3339(highwater_store::lease::now_ns() / 1000),
        error: error.chars().take(FAILED_DRAIN_ERROR_CHARS_MAX).collect(),
    };
    let text = serde_json::to_string(&f).expect("plain data");
    store.write(|w| w.set_meta(&failed_key(name), &text))
}

/// An error kept for status is cut to this many characters.
pub const FAILED_DRAIN_ERROR_CHARS_MAX: usize = 2000;

/// The failed drain [`record_failed_drain`] kept, if no drain has
/// succeeded since.
pub fn failed_drain(store: &Store, name: &str) -> Result<Option<FailedDrain>, StoreError> {
    Ok(store
        .meta(&failed_key(name))?
        .and_then(|t| serde_json::from_str(&t).ok()))
}

/// The crossover as status shows it, for a backlog of `backlog` units.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Crossover {
    pub last_drain_s: Option<f64>,
    pub last_rebuild_s: Option<f64>,
    /// Measured over the recent drains: their seconds over their units.
    pub drain_s_per_unit: Option<f64>,
    pub backlog_predicted_s: Option<f64>,
    /// `rebuild` when the backlog costs more to drain than the last
    /// rebuild took; `drain` when less; null without measurements.
    pub advice: Option<String>,
    /// The seed's leading indicator: the cost per diff of recent drains
    /// rising towards the rebuild's cost.
    pub trend_warning: Option<String>,
    /// Why there is no prediction, when the drains measured so far cleared
    /// too few units to predict from (issue 50).
    pub prediction_note: Option<String>,
}

/// Units the measured drains must have cleared, together, before their
/// cost per unit predicts a backlog (issue 50: a 1-tile drain's 0.95 s,
/// mostly fixed cost, predicted 19.2 s for 20 tiles and advised a
/// rebuild): this many, or [`PREDICTION_SHARE_MIN`] of the units the last
/// rebuild made, whichever is fewer (a small dataset has few units to
/// drain at all).
pub const PREDICTION_UNITS_MIN: u64 = 100;

/// See [`PREDICTION_UNITS_MIN`].
pub const PREDICTION_SHARE_MIN: f64 = 0.25;

/// The predicted backlog drain time against the last rebuild, from
/// measured runs only.
pub fn crossover(c: &Costs, backlog: u64) -> Crossover {
    let mut out = Crossover {
        last_drain_s: c.drains.last().map(|r| r.seconds),
        last_rebuild_s: c.rebuilds.last().map(|r| r.seconds),
        ..Default::default()
    };
    let (s, u) = c
        .drains
        .iter()
        .fold((0.0, 0u64), |(s, u), r| (s + r.seconds, u + r.units));
    let need = match c.rebuilds.last() {
        Some(r) => PREDICTION_UNITS_MIN
            .min((PREDICTION_SHARE_MIN * r.units as f64).ceil() as u64)
            .max(1),
        None => PREDICTION_UNITS_MIN,
    };
    if u >= need {
        let per = s / u as f64;
        out.drain_s_per_unit = Some(per);
        out.backlog_predicted_s = Some(per * backlog as f64);
    } else if !c.drains.is_empty() {
        out.prediction_note = Some(format!(
            "not predicted: the drains measured so far cleared {u} units, and a prediction needs {need} (a small drain's time is mostly its fixed cost, which would overstate the backlog's)"
        ));
    }
    if let (Some(p), Some(r)) = (out.backlog_predicted_s, out.last_rebuild_s) {
        out.advice = Some(if p > r { "rebuild" } else { "drain" }.to_string());
    }
    // Cost per diff of the drains that covered diffs, oldest first: the
    // newer half's mean above the older half's, and past half a rebuild.
    let per_diff: Vec<f64> = c
        .drains
        .iter()
        .filter(|r| r.diffs > 0)
        .map(|r| r.seconds / r.diffs as f64)
        .collect();
    if let (Some(r), true) = (out.last_rebuild_s, per_diff.len() >= 4) {
        let half = per_diff.len() / 2;
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let (old, new) = (mean(&per_diff[..half]), mean(&per_diff[half..]));
        if new > old && new >= 0.5 * r {
            out.trend_warning = Some(format!(
                "the incremental cost per diff rose from {old:.3} s to {new:.3} s, towards the rebuild's {r:.3} s: reassess the crossover (batch more diffs per drain, or rebuild on a schedule)"
            ));
        }
    }
    out
}

/// The units a dataset's drain clears ([`Dataset::dirty_units`]).
pub fn dirty_units(store: &Store, d: &dyn Dataset) -> Result<u64, StoreError> {
    d.dirty_units(store)
}

/// A drain, measured and recorded for the crossover. A drain that
/// rebuilt instead (its JSON says `rebuilt`) is recorded as a rebuild.
pub fn drain_recorded(
    d: &dyn Dataset,
    store: &mut Store,
    limits: DrainLimits,
) -> Result<Outcome, DatasetError> {
    let before = dirty_units(store, d).map_err(|e| error_text(&e))?;
    let drained = if std::env::var("HIGHWATER_FAILPOINT")
        .is_ok_and(|v| v == format!("fail-drain:{}", d.name()))
    {
        Err(format!(
            "dataset {}: failed on purpose (HIGHWATER_FAILPOINT)",
            d.name()
        ))
    } else {
        d.drain(store, limits)
    };
    let o = match drained {
        Ok(o) => o,
        Err(e) => {
            if let Err(r) = record_failed_drain(store, d.name(), &e) {
                return Err(format!(
                    "{e} (and the failure could not be recorded for status: {})",
                    error_text(&r)
                ));
            }
            return Err(e);
        }
    };
    let after = dirty_units(store, d).map_err(|e| error_text(&e))?;
    let rebuilt = !o.json["rebuilt"].is_null() && o.json["rebuilt"] != false;
    let units = if rebuilt {
        built_units(d, &o.json)
    } else {
        before.saturating_sub(after)
    };
    record_run(store, d.name(), rebuilt, o.took.as_secs_f64(), units)
        .map_err(|e| error_text(&e))?;
    Ok(o)
}

/// A rebuild, measured and recorded; it ends a hold.
pub fn rebuild_recorded(d: &dyn Dataset, store: &mut Store) -> Result<Outcome, DatasetError> {
    let o = d.rebuild(store)?;
    record_run(
        store,
        d.name(),
        true,
        o.took.as_secs_f64(),
        built_units(d, &o.json),
    )
    .and_then(|_| release(store, d.name()))
    .map_err(|e| error_text(&e))?;
    Ok(o)
}

/// The units a rebuild made, under the dataset's [`Dataset::unit_key`].
fn built_units(d: &dyn Dataset, j: &serde_json::Value) -> u64 {
    let b = if j["rebuilt"].is_object() {
        &j["rebuilt"]
    } else {
        j
    };
    d.unit_key().and_then(|k| b[k].as_u64()).unwrap_or(0)
}

/// The status of a dataset kept current from dirty keys: its marker, its
/// dirty keys, whether it was built with its recipe, its hold and
/// crossover; `documents` when the kind counts them.
pub fn keyed_status(
    store: &Store,
    cx: &StatusContext,
    (kind, name, recipe): (&str, &str, &str),
    documents: Option<usize>,
) -> Result<serde_json::Value, StoreError> {
    let marker = cx.markers.get(name).and_then(|m| m.0);
    let built = store.meta(&crate::store::built_recipe_key(name))?;
    let held = held(store, name)?;
    let dirty = store.dirty_keys(name)?.len();
    let crossover = crossover(&costs(store, name)?, dirty as u64);
    let rebuild = match &built {
        None => Some(format!(
            "it was never built: run `highwater osm rebuild {name}`"
        )),
        Some(r) if r != recipe => {
            Some("its recipe changed (config or code): the next apply rebuilds it".to_string())
        }
        Some(_) => match (&held, crossover.advice.as_deref()) {
            (Some(h), _) => Some(h.message(name)),
            (None, Some("rebuild")) => Some(format!(
                "draining its {dirty} dirty keys is predicted to take {:.2} s (measured), more than its last rebuild's {:.2} s",
                crossover.backlog_predicted_s.unwrap_or(0.0),
                crossover.last_rebuild_s.unwrap_or(0.0)
            )),
            _ => None,
        },
    };
    Ok(serde_json::json!({
        "name": name,
        "kind": kind,
        "marker": marker,
        "gap": match (cx.sequence, marker) { (Some(x), Some(y)) => Some(x - y), _ => None },
        "dirty": dirty,
        "held": held,
        "crossover": crossover,
        "documents": documents,
        "recipe": recipe,
        "recorded_recipe": built,
        "rebuild": rebuild,
        "last_drain": store.meta(&format!("drained_at:{name}"))?,
        "last_failed_drain": failed_drain(store, name)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(seconds: f64, units: u64, diffs: u64) -> Run {
        Run {
            seconds,
            units,
            diffs,
        }
    }

    /// Issue 23: the advice and the trend warning, from recorded runs.
    #[test]
    fn the_crossover_follows_the_recorded_runs() {
        // (drains, rebuilds, backlog, advice, trend warned)
        type Case = (Vec<Run>, Vec<Run>, u64, Option<&'static str>, bool);
        let cases: Vec<Case> = vec![
            (vec![], vec![], 10, None, false),
            (vec![run(1.0, 100, 1)], vec![], 10, None, false),
            (
                vec![run(1.0, 100, 1)],
                vec![run(5.0, 1000, 0)],
                10,
                Some("drain"),
                false,
            ),
            (
                vec![run(1.0, 100, 1)],
                vec![run(5.0, 1000, 0)],
                600,
                Some("rebuild"),
                false,
            ),
            // Issue 50: one drain of one unit predicts nothing.
            (
                vec![run(0.95, 1, 1)],
                vec![run(5.0, 1000, 0)],
                20,
                None,
                false,
            ),
            // Cost per diff rising past half a rebuild: warned.
            (
                vec![
                    run(0.1, 10, 1),
                    run(0.2, 10, 1),
                    run(3.0, 10, 1),
                    run(4.0, 10, 1),
                ],
                vec![run(5.0, 100, 0)],
                0,
                Some("drain"),
                true,
            ),
            // Rising, but far below a rebuild: not yet.
            (
                vec![
                    run(0.1, 10, 1),
                    run(0.2, 10, 1),
                    run(0.3, 10, 1),
                    run(0.4, 10, 1),
                ],
                vec![run(5.0, 100, 0)],
                0,
                Some("drain"),
                false,
            ),
        ];
        for (drains, rebuilds, backlog, advice, warned) in cases {
            let c = Costs {
                drains: drains.clone(),
                rebuilds,
                sequence: None,
            };
            let x = crossover(&c, backlog);
            assert_eq!(x.advice.as_deref(), advice, "{drains:?} {backlog}");
            assert_eq!(
                x.prediction_note.is_some(),
                !drains.is_empty() && x.backlog_predicted_s.is_none(),
                "{drains:?}: {x:?}"
            );
            assert_eq!(x.trend_warning.is_some(), warned, "{drains:?}: {x:?}");
        }
    }

    #[test]
    fn medians() {
        for (v, m) in [
            (vec![], 0.0),
            (vec![3], 3.0),
            (vec![5, 1, 3], 3.0),
            (vec![4, 1, 2, 3], 2.5),
        ] {
            assert_eq!(median(&v), m, "{v:?}");
        }
    }
}
