//! The OSM operations the CLI offers: config, apply (with dry run and
//! expire output), replicate from a local replication directory, status.

use crate::dataset::{Dataset, Kind};
use crate::derive::apply_indexed;
use crate::fetch::{check_forward, FetchError, Fetched, Server};
use crate::import::{read_state, sequence_path, ImportError, State};
use crate::model::Change;
use crate::store::{Store, StoreError, Writer};
use crate::xml::OsmError;
use highwater_core::tile::Tile;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum OpsError {
    #[error("{path}: [osm] {message}")]
    Config { path: PathBuf, message: String },
    #[error(transparent)]
    Osm(#[from] OsmError),
    #[error(transparent)]
    Import(#[from] ImportError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Replication(String),
    #[error("{}: {message}", path.display())]
    Sequence { path: PathBuf, message: String },
    #[error("{}: {message}", path.display())]
    Output { path: PathBuf, message: String },
    #[error("--sequence {sequence}: the store is already at sequence {have}; the diffs would end at or before where it stands: nothing was applied (give the sequence the store stands at after these diffs)")]
    Declare { sequence: i64, have: i64 },
    #[error(transparent)]
    Fetch(#[from] FetchError),
}

/// `[osm]` without its dataset sections (`[osm.KIND.NAME]`, read by
/// each kind: [`crate::dataset::Kind::configure`]).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOsm {
    store: Option<String>,
    rebuild_gap_max: Option<i64>,
    lease_duration_s: Option<i64>,
    replication_url: Option<String>,
    replication_url_env: Option<String>,
    replication_retries_max: Option<u32>,
    replication_backoff_ms: Option<u64>,
    replication_timeout_s: Option<u64>,
    cache_mb: Option<u64>,
    flat_nodes: Option<String>,
}

/// A parsed diff and the replication state beside it, if any.
pub type Diff = (Vec<Change>, Option<State>);

/// The config's datasets, every kind, in the order of the kinds given to
/// [`OsmConfig::parse_with`] (the registry's) and each kind's by name;
/// with each its kind's [`Kind::order`].
#[derive(Clone, Default)]
pub struct Datasets(Vec<(u8, std::sync::Arc<dyn Dataset>)>);

impl Datasets {
    /// In the order of the kinds, each kind's by name.
    pub fn iter(&self) -> impl Iterator<Item = &dyn Dataset> {
        self.0.iter().map(|(_, d)| &**d)
    }
}

impl std::fmt::Debug for Datasets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(
                self.iter()
                    .map(|d| format!("[osm.{}.{}]", d.kind(), d.name())),
            )
            .finish()
    }
}

#[derive(Clone, Debug)]
pub struct OsmConfig {
    pub store: PathBuf,
    /// Every dataset, as its kind read it from `[osm.KIND.NAME]`.
    pub all: Datasets,
    /// A dataset this many sequences behind is better rebuilt.
    pub rebuild_gap_max: i64,
    /// How long the store's writer lease lasts without renewal.
    pub lease_duration_s: i64,
    /// The replication server (`[osm] replication_url`); wins over the URL
    /// the extract's header gave at import.
    pub replication_url: Option<String>,
    /// `[osm] replication_url_env`: the variable that holds the server's
    /// URL instead (credentials and all), read at use.
    pub replication_url_env: Option<String>,
    /// The config file, for errors about it.
    pub config_path: PathBuf,
    /// Retries, backoff and timeout of replication requests.
    pub retry: crate::fetch::RetryPolicy,
    /// `[osm] cache_mb`: the memory `osm import` may use.
    pub import: crate::import::ImportOptions,
    /// Per dataset, `affected_guard`: a diff whose affected set is more
    /// than this many times the median of the dataset's recent ones holds
    /// the dataset (0: no guard). Absent: [`crate::dataset::AFFECTED_GUARD_DEFAULT`].
    /// With `affected_guard_min`: an affected set this small is never held
    /// (a median of 0 would make any diff "far outside" it).
    pub affected_guard: BTreeMap<String, (f64, usize)>,
}

/// Refuses a store whose flat node file does not match the config's
/// `[osm] flat_nodes` (imported with flat nodes, opened without the
/// setting, or the reverse, or with another file): exit 2, naming both.
pub fn check_flat_nodes(cfg: &OsmConfig, store: &Store) -> Result<(), OpsError> {
    let want = cfg.import.flat_nodes.as_deref();
    let have = store.flat_nodes();
    let same = match (want, have) {
        (None, None) => true,
        (Some(a), Some(b)) => a == b || a.canonicalize().ok() == b.canonicalize().ok(),
        _ => false,
    };
    if same {
        return Ok(());
    }
    let what = match (want, have) {
        (None, Some(b)) => format!(
            "it was imported with flat nodes in {}, and {} has no `flat_nodes` in [osm]: add flat_nodes = {:?}, or import the extract again without it (--replace)",
            b.display(),
            cfg.config_path.display(),
            b.display().to_string()
        ),
        (Some(a), None) => format!(
            "{} sets flat_nodes = {:?} in [osm], but the store was imported without flat nodes: remove the setting, or import the extract again with it (--replace)",
            cfg.config_path.display(),
            a.display().to_string()
        ),
        (Some(a), Some(b)) => format!(
            "{} sets flat_nodes = {:?}, but the store's flat node file is {}: name that file, or import the extract again (--replace)",
            cfg.config_path.display(),
            a.display().to_string(),
            b.display()
        ),
        (None, None) => unreachable!("same"),
    };
    Err(OpsError::Store(StoreError::Corrupt {
        path: store.path().to_path_buf(),
        what,
    }))
}

impl OsmConfig {
    /// The server the config names: `replication_url`, or the URL in the
    /// variable `replication_url_env` names, read now. It may hold
    /// credentials: show it only through [`crate::fetch::redact_url`].
    pub fn server_url(&self) -> Result<Option<String>, OpsError> {
        let Some(var) = &self.replication_url_env else {
            return Ok(self.replication_url.clone());
        };
        let bad = |message: String| OpsError::Config {
            path: self.config_path.clone(),
            message,
        };
        let u = std::env::var(var).map_err(|_| {
            bad(format!(
                "replication_url_env = {var:?}, but that environment variable is not set: set it to the server's http(s):// URL (credentials may go in it), or remove replication_url_env"
            ))
        })?;
        crate::fetch::check_url(&u)
            .map(Some)
            .map_err(|e| bad(format!("replication_url_env = {var:?}: {e}")))
    }
}

impl OsmConfig {
    /// The low-zoom predicate of the shapes index: the one the config's
    /// datasets share (the tile datasets'), else none.
    pub fn low(&self) -> std::sync::Arc<crate::features::LowZoom> {
        self.all
            .iter()
            .find_map(|d| d.low_zoom())
            .unwrap_or_else(|| std::sync::Arc::new(crate::features::LowZoom::none()))
    }

    /// Every dataset, in the order apply and drains visit them: by their
    /// kind's [`crate::dataset::Kind::order`] (the keyed datasets drain
    /// first: they are cheap, and a tile drain may be bounded by --max),
    /// then as the registry lists the kinds.
    pub fn datasets(&self) -> Vec<&dyn Dataset> {
        let mut out: Vec<&(u8, std::sync::Arc<dyn Dataset>)> = self.all.0.iter().collect();
        out.sort_by_key(|(order, _)| *order);
        out.into_iter().map(|(_, d)| &**d).collect()
    }

    /// A dataset by name.
    pub fn dataset(&self, name: &str) -> Option<&dyn Dataset> {
        self.datasets().into_iter().find(|d| d.name() == name)
    }

    /// The datasets of one kind, by its type (`cfg.of::<TileDataset>()`),
    /// for the commands about that kind.
    pub fn of<T: Dataset + 'static>(&self) -> Vec<&T> {
        self.all
            .iter()
            .filter_map(|d| d.as_any().downcast_ref::<T>())
            .collect()
    }

    /// Reads `[osm]` with the registry's kinds.
    pub fn parse(
        value: Option<&toml::Value>,
        config_path: &Path,
        root: &Path,
    ) -> Result<OsmConfig, OpsError> {
        Self::parse_with(value, config_path, root, &crate::registry::KINDS)
    }

    /// Reads `[osm]` with the kinds given: each `[osm.KIND.NAME]` is read
    /// by its kind; any other key is `[osm]`'s own.
    pub fn parse_with(
        value: Option<&toml::Value>,
        config_path: &Path,
        root: &Path,
        kinds: &[Kind],
    ) -> Result<OsmConfig, OpsError> {
        let bad = |message: String| OpsError::Config {
            path: config_path.to_path_buf(),
            message,
        };
        let mut value = value.cloned();
        // Each kind's section, taken out before `[osm]`'s own keys are read.
        let mut sections: Vec<(&Kind, toml::Value)> = Vec::new();
        if let Some(toml::Value::Table(t)) = &mut value {
            for k in kinds {
                if let Some(v) = t.remove(k.name) {
                    sections.push((k, v));
                }
            }
        }
        let raw: RawOsm = match value {
            Some(v) => v.try_into().map_err(|e: toml::de::Error| {
                let m = e.message().to_string();
                // An unknown key: the dataset kinds are known too.
                bad(if m.starts_with("unknown field") {
                    let names: Vec<String> =
                        kinds.iter().map(|k| format!("`{}`", k.name)).collect();
                    format!("{m}, or a kind of dataset: {}", names.join(", "))
                } else {
                    m
                })
            })?,
            None => RawOsm {
                store: None,
                rebuild_gap_max: None,
                lease_duration_s: None,
                replication_url: None,
                replication_url_env: None,
                replication_retries_max: None,
                replication_backoff_ms: None,
                replication_timeout_s: None,
                cache_mb: None,
                flat_nodes: None,
            },
        };
        let mut named: Vec<(&Kind, BTreeMap<String, toml::Value>)> = Vec::new();
        for (k, v) in sections {
            let by_name: BTreeMap<String, toml::Value> = v
                .try_into()
                .map_err(|e: toml::de::Error| bad(e.message().to_string()))?;
            named.push((k, by_name));
        }
        // Dataset names are unique across kinds: they key the markers,
        // dirty sets and the commands.
        for (i, (k, by_name)) in named.iter().enumerate() {
            for name in by_name.keys() {
                if let Some((other, _)) = named[..i].iter().find(|(_, o)| o.contains_key(name)) {
                    return Err(bad(format!(
                        "[osm.{}.{name}]: another dataset has that name ([osm.{}.{name}]); dataset names must be unique",
                        k.name, other.name
                    )));
                }
            }
        }
        let mut all = Vec::new();
        let mut affected_guard = BTreeMap::new();
        for (k, by_name) in named {
            for c in (k.configure)(root, by_name).map_err(bad)? {
                let name = c.dataset.name().to_string();
                let g = c
                    .affected_guard
                    .unwrap_or(crate::dataset::AFFECTED_GUARD_DEFAULT);
                if !(g == 0.0 || (g >= 1.0 && g.is_finite())) {
                    return Err(bad(format!(
                        "[osm.{}.{name}] affected_guard = {g}: give a factor of 1 or more (50: hold the dataset when a diff affects more than 50 times the median of its recent diffs), or 0 for no guard",
                        k.name
                    )));
                }
                let min = c
                    .affected_guard_min
                    .unwrap_or(crate::dataset::AFFECTED_GUARD_MIN_DEFAULT);
                affected_guard.insert(name, (g, min));
                all.push((k.order, c.dataset));
            }
        }
        Ok(OsmConfig {
            store: root.join(raw.store.unwrap_or_else(|| ".highwater/osm".into())),
            all: Datasets(all),
            rebuild_gap_max: raw.rebuild_gap_max.unwrap_or(1000),
            lease_duration_s: match raw.lease_duration_s {
                None => crate::store::WRITER_LEASE_DURATION_S,
                Some(s) if (1..=86_400).contains(&s) => s,
                Some(s) => {
                    return Err(bad(format!(
                        "lease_duration_s = {s}: give 1 to 86400 seconds"
                    )))
                }
            },
            // Credentials in the URL (`https://user:secret@host/`) stay in
            // memory: sent as a header, shown and stored as `***`. The
            // variable keeps them out of the config file too; it is read
            // at use, by the commands that ask a server.
            replication_url: match (&raw.replication_url, &raw.replication_url_env) {
                (Some(_), Some(_)) => {
                    return Err(bad(
                        "replication_url and replication_url_env both name the server: keep one"
                            .into(),
                    ))
                }
                (Some(u), None) => Some(
                    crate::fetch::check_url(u).map_err(|e| bad(format!("replication_url: {e}")))?,
                ),
                _ => None,
            },
            replication_url_env: raw.replication_url_env.clone(),
            import: {
                use crate::import::{IMPORT_CACHE_MB_MAX, IMPORT_CACHE_MB_MIN};
                // `flat_nodes = "path"`: its folder must exist (a typo must
                // not scatter a 100 GB file somewhere new).
                let flat_nodes = match &raw.flat_nodes {
                    None => None,
                    Some(f) => {
                        let p = root.join(f);
                        let dir = crate::import::parent_dir(&p);
                        if f.is_empty() || p.is_dir() || !dir.is_dir() {
                            return Err(bad(format!(
                                "flat_nodes = {f:?}: the folder {} does not exist (or the path is a folder); create it, or name a file in an existing folder",
                                dir.display()
                            )));
                        }
                        Some(p)
                    }
                };
                match raw.cache_mb {
                    None => crate::import::ImportOptions {
                        flat_nodes,
                        ..Default::default()
                    },
                    Some(mb) if (IMPORT_CACHE_MB_MIN..=IMPORT_CACHE_MB_MAX).contains(&mb) => {
                        crate::import::ImportOptions { cache_mb: mb, flat_nodes }
                    }
                    Some(mb) => {
                        return Err(bad(format!(
                            "cache_mb = {mb}: give {IMPORT_CACHE_MB_MIN} to {IMPORT_CACHE_MB_MAX} (MiB of memory an import may use)"
                        )))
                    }
                }
            },
            config_path: config_path.to_path_buf(),
            affected_guard,
            retry: {
                let d = crate::fetch::RetryPolicy::default();
                let retries_max = raw.replication_retries_max.unwrap_or(d.retries_max);
                let backoff_base_ms = raw.replication_backoff_ms.unwrap_or(d.backoff_base_ms);
                let timeout_s = raw.replication_timeout_s.unwrap_or(d.timeout_s);
                if retries_max > 100 || !(1..=3_600).contains(&timeout_s) {
                    return Err(bad(format!(
                        "replication_retries_max = {retries_max} (at most 100), replication_timeout_s = {timeout_s} (1 to 3600): out of range"
                    )));
                }
                crate::fetch::RetryPolicy {
                    retries_max,
                    backoff_base_ms,
                    backoff_max_ms: d.backoff_max_ms.max(backoff_base_ms),
                    timeout_s,
                }
            },
        })
    }

    /// Every place the config names, with what it is, for the collision
    /// check at config load.
    pub fn paths(&self) -> Vec<(String, PathBuf)> {
        let mut out = vec![(
            "the OSM store ([osm] store)".to_string(),
            self.store.clone(),
        )];
        for d in self.all.iter() {
            out.extend(d.paths());
        }
        out
    }
}

pub use crate::dataset::DatasetReport;

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ApplyReport {
    pub diffs: usize,
    pub sequence: Option<i64>,
    pub datasets: Vec<DatasetReport>,
    pub dry_run: bool,
    #[serde(skip)]
    pub tiles: BTreeSet<Tile>,
    /// Every dataset's warnings (the guard's holds, empty derivations).
    pub warnings: Vec<String>,
}

/// Whether a diff may follow the store: a diff with a sequence applies only
/// as the store's next; a store that took a diff without one no longer
/// follows a sequence and takes no sequenced diff (it cannot know which is
/// next). `diff` names the file for the message.
fn check_sequence(
    store_seq: Option<i64>,
    unsequenced: bool,
    state: Option<&State>,
) -> Result<(), OpsError> {
    let Some(s) = state else { return Ok(()) };
    let diff = &s.path;
    match store_seq {
        _ if unsequenced => Err(OpsError::Sequence {
            path: diff.to_path_buf(),
            message: format!(
                "it has sequence {}, but the store took diffs without a state file and no longer follows a replication sequence: import a current extract with `highwater osm import EXTRACT --replace`",
                s.sequence
            ),
        }),
        Some(have) if s.sequence != have + 1 => Err(OpsError::Sequence {
            path: diff.to_path_buf(),
            message: if s.sequence <= have {
                format!(
                    "it has sequence {}, but the store is already at {have}: it was applied before (or is older); nothing was applied",
                    s.sequence
                )
            } else {
                format!(
                    "it has sequence {}, but the store is at {have}: sequences {}..{} are missing; apply them first (nothing was applied)",
                    s.sequence,
                    have + 1,
                    s.sequence - 1
                )
            },
        }),
        _ => Ok(()),
    }
}

/// Derives and applies diffs in order, in one transaction (rolled back on a
/// dry run): each dataset's affected tiles from the state before each diff,
/// then the diff, then the dirty sets and markers. `before_commit` runs
/// inside the transaction with the report, for what must be durable before
/// the store moves (the expire list): its error rolls everything back.
pub fn apply(
    store: &mut Store,
    cfg: &OsmConfig,
    diffs: &[Diff],
    dry_run: bool,
) -> Result<ApplyReport, OpsError> {
    apply_with(store, cfg, diffs, dry_run, &mut |_, _| Ok(()))
}

/// [`apply`] with a step that runs inside the transaction, before it
/// commits.
pub fn apply_with(
    store: &mut Store,
    cfg: &OsmConfig,
    diffs: &[Diff],
    dry_run: bool,
    before_commit: &mut dyn FnMut(&mut Writer<'_>, &ApplyReport) -> Result<(), OpsError>,
) -> Result<ApplyReport, OpsError> {
    apply_to(store, cfg, &cfg.datasets(), diffs, dry_run, before_commit)
}

/// [`apply_with`] for the datasets given: the config's, or (in tests)
/// any other [`crate::dataset::Dataset`], called in the order that trait
/// documents.
pub fn apply_to(
    store: &mut Store,
    cfg: &OsmConfig,
    sets: &[&dyn crate::dataset::Dataset],
    diffs: &[Diff],
    dry_run: bool,
    before_commit: &mut dyn FnMut(&mut Writer<'_>, &ApplyReport) -> Result<(), OpsError>,
) -> Result<ApplyReport, OpsError> {
    apply_sets(store, cfg, sets, diffs, dry_run, None, before_commit)
}

/// [`apply_with`] for diffs without state files whose result the operator
/// vouches is replication sequence `sequence` (`osm apply --sequence`):
/// declared in the same transaction as the diffs, so the store and every
/// dataset's marker say `sequence` at once (issue 50: declared after, the
/// markers stayed one behind and status showed "gap 1"). Refused, with
/// nothing applied, when the store already stands at or past `sequence`.
pub fn apply_declaring(
    store: &mut Store,
    cfg: &OsmConfig,
    diffs: &[Diff],
    sequence: i64,
    before_commit: &mut dyn FnMut(&mut Writer<'_>, &ApplyReport) -> Result<(), OpsError>,
) -> Result<ApplyReport, OpsError> {
    apply_sets(
        store,
        cfg,
        &cfg.datasets(),
        diffs,
        false,
        Some(sequence),
        before_commit,
    )
}

fn apply_sets(
    store: &mut Store,
    cfg: &OsmConfig,
    sets: &[&dyn crate::dataset::Dataset],
    diffs: &[Diff],
    dry_run: bool,
    declare: Option<i64>,
    before_commit: &mut dyn FnMut(&mut Writer<'_>, &ApplyReport) -> Result<(), OpsError>,
) -> Result<ApplyReport, OpsError> {
    let run = |w: &mut Writer<'_>| -> Result<ApplyReport, OpsError> {
        let mut per: Vec<DatasetReport> = sets
            .iter()
            .map(|d| DatasetReport {
                name: d.name().to_string(),
                ..Default::default()
            })
            .collect();
        let mut report = ApplyReport {
            diffs: diffs.len(),
            dry_run,
            ..Default::default()
        };
        // Every diff is checked against the sequence the ones before it
        // leave, before anything is derived: a refusal touches nothing.
        let mut seq: Option<i64> = w.meta("sequence")?.and_then(|s| s.parse().ok());
        let mut unsequenced = w.meta("unsequenced")?.is_some();
        for (_, state) in diffs {
            check_sequence(seq, unsequenced, state.as_ref())?;
            match state {
                Some(s) => seq = Some(s.sequence),
                None => unsequenced = true,
            }
        }
        if let (Some(n), Some(have)) = (declare, seq) {
            if n <= have {
                return Err(OpsError::Declare { sequence: n, have });
            }
        }
        if !diffs.is_empty() {
            w.bump_generation()?;
        }
        // The order `dataset` gives: each dataset derives from the store
        // before a diff, the diff is applied, each hears what it touched;
        // one commit per batch.
        for (k, (changes, state)) in diffs.iter().enumerate() {
            let before: Option<i64> = w.meta("sequence")?.and_then(|s| s.parse().ok());
            for (d, r) in sets.iter().zip(per.iter_mut()) {
                r.last_affected = None;
                r.last_read = 0;
                d.derive(w, changes, r)?;
            }
            let touched = apply_indexed(w, changes, &cfg.low())?;
            for (d, r) in sets.iter().zip(per.iter_mut()) {
                d.touched(w, &touched, r)?;
                if r.last_affected.is_none() && !d.dirties_tiles() {
                    r.last_affected = Some(touched.all.len());
                }
            }
            // The guard on the affected set (issue 23), per dataset: the
            // primary store follows the sequence whatever it says.
            let label = match state {
                Some(s) => {
                    let p = s.path.display().to_string();
                    let osc = p.strip_suffix(".state.txt").map(|b| format!("{b}.osc.gz"));
                    format!("{} (sequence {})", osc.unwrap_or(p), s.sequence)
                }
                None => format!("#{} of the batch (no state file)", k + 1),
            };
            for (d, r) in sets.iter().zip(per.iter_mut()) {
                let Some(size) = r.last_affected else {
                    continue;
                };
                if size == 0 && r.last_read > 0 {
                    r.warnings.push(format!(
                        "{}: diff {label} changed the tags it reads on {} feature(s), yet derived nothing for it: a derivation bug? (check with `highwater osm verify {}`)",
                        d.name(),
                        r.last_read,
                        d.name()
                    ));
                }
                let (factor, min) = cfg.affected_guard.get(d.name()).copied().unwrap_or((
                    crate::dataset::AFFECTED_GUARD_DEFAULT,
                    crate::dataset::AFFECTED_GUARD_MIN_DEFAULT,
                ));
                if let crate::dataset::Guarded::HeldNow(h) = crate::dataset::guard(
                    w,
                    d.name(),
                    (factor, min),
                    (size, changes.len()),
                    &label,
                    before,
                )? {
                    r.warnings.push(h.message(d.name()));
                    r.held = Some(h);
                }
            }
            match state {
                Some(s) => {
                    w.set_meta("sequence", &s.sequence.to_string())?;
                    w.set_meta("timestamp", &s.timestamp)?;
                }
                None => {
                    // Recorded, so status can say the store no longer
                    // follows a replication sequence.
                    let n: i64 = w
                        .meta("unsequenced")?
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    w.set_meta("unsequenced", &(n + 1).to_string())?;
                }
            }
        }
        if let Some(n) = declare {
            w.set_meta("sequence", &n.to_string())?;
            w.del_meta("unsequenced")?;
        }
        // The markers say up to which sequence the dirty sets are recorded:
        // the store's, whether or not these diffs carried one.
        report.sequence = w.meta("sequence")?.and_then(|s| s.parse().ok());
        for (d, r) in sets.iter().zip(per.iter_mut()) {
            d.commit(w, report.sequence, r)?;
            // A held dataset's marker stays where the hold found it; its
            // dirty set still records the diffs, for `--force`.
            if let Some(h) = crate::dataset::held_in(w, d.name())? {
                w.set_marker(d.name(), h.marker, d.recipe())?;
                if r.held.is_none() {
                    r.warnings.push(h.message(d.name()));
                    r.held = Some(h);
                }
            }
            report.tiles.extend(r.dirty.iter().copied());
            report.warnings.extend(r.warnings.iter().cloned());
        }
        report.datasets = sets
            .iter()
            .zip(per)
            .filter(|(d, _)| d.dirties_tiles())
            .map(|(_, r)| r)
            .collect();
        before_commit(w, &report)?;
        if std::env::var_os("HIGHWATER_FAILPOINT").is_some_and(|v| v == "osm-slow-commit") {
            // For the overlap tests: hold the writer lease the way a large
            // batch does: while the gate file the test names exists (at most
            // a minute), else three seconds. A gate, not a fixed time: the
            // test's own commands must all run while the lease is held,
            // however fast or loaded the machine.
            match std::env::var_os("HIGHWATER_FAILPOINT_GATE") {
                Some(gate) => {
                    let t0 = std::time::Instant::now();
                    while std::path::Path::new(&gate).exists() && t0.elapsed().as_secs() < 60 {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                }
                None => std::thread::sleep(std::time::Duration::from_secs(3)),
            }
        }
        if std::env::var_os("HIGHWATER_FAILPOINT").is_some_and(|v| v == "osm-before-commit") {
            // For the crash test: die with everything written but not
            // committed, the way a killed process dies.
            // SAFETY: a signal to our own pid has no memory effects.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
        Ok(report)
    };
    if dry_run {
        store.rehearse_then(run)
    } else {
        store.write_then(run)
    }
}

/// Says that the store now stands at replication sequence `sequence`: for
/// diffs made without state files (e.g. by `osmium derive-changes` between
/// two snapshots) whose result the operator vouches for. The store follows
/// a sequence again from there.
pub fn declare_sequence(store: &mut Store, sequence: i64) -> Result<(), OpsError> {
    store.write(|w| {
        w.set_meta("sequence", &sequence.to_string())?;
        w.del_meta("unsequenced")
    })?;
    Ok(())
}

/// The sequence a replication path `AAA/BBB/CCC.osc.gz` stands for.
pub fn sequence_of_path(p: &Path) -> Option<i64> {
    let name = p.file_name()?.to_str()?;
    let c = name.split('.').next()?;
    let b = p.parent()?.file_name()?.to_str()?;
    let a = p.parent()?.parent()?.file_name()?.to_str()?;
    let three = |s: &str| s.len() == 3 && s.bytes().all(|x| x.is_ascii_digit());
    (three(a) && three(b) && three(c)).then(|| format!("{a}{b}{c}").parse().ok())?
}

/// Reads diff files (refusing any malformed one before anything moves), with
/// the state file beside each when there is one. A state file whose
/// sequence disagrees with its replication path is refused: trusting it
/// would move the store to the wrong sequence.
pub fn read_diffs(paths: &[PathBuf]) -> Result<Vec<Diff>, OpsError> {
    read_diffs_max(paths, u64::MAX)
}

/// [`read_diffs`], refusing a diff that unpacks past `unpacked_max` bytes
/// (found while unpacking it, so a gzip bomb stops at the limit).
pub fn read_diffs_max(paths: &[PathBuf], unpacked_max: u64) -> Result<Vec<Diff>, OpsError> {
    let mut out = Vec::new();
    for p in paths {
        let (changes, _) = crate::xml::read_changes_max(p, unpacked_max)?;
        let name = p.file_name().unwrap_or_default().to_string_lossy();
        let stem = name.trim_end_matches(".gz").trim_end_matches(".osc");
        let state_path = p.with_file_name(format!("{stem}.state.txt"));
        let state = state_path
            .exists()
            .then(|| read_state(&state_path))
            .transpose()?;
        if let (Some(s), Some(want)) = (&state, sequence_of_path(p)) {
            if s.sequence != want {
                return Err(OpsError::Sequence {
                    path: state_path,
                    message: format!(
                        "sequenceNumber={} but its path says {want}: the replication folder is inconsistent; re-fetch it (nothing was applied)",
                        s.sequence
                    ),
                });
            }
        }
        out.push((changes, state));
    }
    Ok(out)
}

/// The diffs after the store's sequence in a replication directory, in
/// order, each with its state file. Refuses a missing folder, a store that
/// follows no sequence, a diff without its state file, and a gap: a missing
/// sequence with a later one present anywhere in the folder (the top
/// `state.txt`, or the newest `AAA/BBB/CCC.osc.gz`).
pub fn pending(store: &Store, dir: &Path) -> Result<Vec<PathBuf>, OpsError> {
    if !dir.is_dir() {
        return Err(OpsError::Replication(format!(
            "replication folder {} does not exist (a typo, or a share that is not mounted?)",
            dir.display()
        )));
    }
    let seq = store_state(store)?.sequence;
    let mut out = Vec::new();
    let mut next = seq + 1;
    loop {
        let base = dir.join(sequence_path(next));
        let osc = base.with_extension("osc.gz");
        if !osc.exists() {
            break;
        }
        let state = base.with_extension("state.txt");
        if !state.exists() {
            return Err(OpsError::Replication(format!(
                "{} has no state file {}: re-fetch it (nothing was applied)",
                osc.display(),
                state.display()
            )));
        }
        out.push(osc);
        next += 1;
    }
    let top = newest_sequence(dir)?;
    if let Some(top) = top.filter(|&t| t >= next) {
        return Err(OpsError::Replication(format!(
            "gap in {}: sequence {next} ({}) is missing but {top} is there; fetch {next} first",
            dir.display(),
            sequence_path(next)
        )));
    }
    Ok(out)
}

/// The newest sequence a replication folder offers: its top `state.txt`,
/// or else the largest `AAA/BBB/CCC.osc.gz` (three folder listings).
fn newest_sequence(dir: &Path) -> Result<Option<i64>, OpsError> {
    let top_state = dir.join("state.txt");
    let from_state = if top_state.exists() {
        Some(read_state(&top_state)?.sequence)
    } else {
        None
    };
    let largest = |d: &Path, suffix: &str| -> Option<(i64, PathBuf)> {
        std::fs::read_dir(d)
            .ok()?
            .flatten()
            .filter_map(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                let num = n.strip_suffix(suffix)?;
                (num.len() == 3)
                    .then(|| num.parse::<i64>().ok())
                    .flatten()
                    .map(|v| (v, e.path()))
            })
            .max()
    };
    let mut from_files = None;
    if let Some((a, pa)) = largest(dir, "") {
        if let Some((b, pb)) = largest(&pa, "") {
            if let Some((c, _)) = largest(&pb, ".osc.gz") {
                from_files = Some(a * 1_000_000 + b * 1000 + c);
            }
        }
    }
    Ok(from_state.max(from_files))
}

/// Where `osm replicate` fetches from: `--url`, else `[osm]
/// replication_url`, else the URL the extract's header named at import.
pub fn replication_url(
    store: &Store,
    cfg: &OsmConfig,
    given: Option<&str>,
) -> Result<String, OpsError> {
    if let Some(u) = given {
        return Ok(crate::fetch::check_url(u)?);
    }
    if let Some(u) = cfg.server_url()? {
        return Ok(u);
    }
    match store.meta("replication_url")? {
        Some(u) => Ok(crate::fetch::check_url(&u)?),
        None => Err(OpsError::Replication(
            "no replication server: give --url URL (or --from FOLDER), set `replication_url` in [osm], or import an extract whose header names one".into(),
        )),
    }
}

/// The store's replication sequence and the state it stands at, refusing
/// a store that follows none.
fn store_state(store: &Store) -> Result<State, OpsError> {
    if let Some(n) = store.meta("unsequenced")? {
        return Err(OpsError::Replication(format!(
            "the store took {n} diff(s) without a state file and no longer follows a replication sequence: import a current extract with `highwater osm import EXTRACT --replace`"
        )));
    }
    let sequence: i64 = store
        .meta("sequence")?
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| OpsError::Replication("the store has no replication sequence: import an extract whose header has one, or apply diffs with their state files".into()))?;
    Ok(State {
        sequence,
        timestamp: store.meta("timestamp")?.unwrap_or_default(),
        path: PathBuf::from("(the store)"),
    })
}

/// One batch fetched over HTTP: the server's top state, the diffs after
/// the store's sequence (checked, in the cache folder), and the error that
/// stopped the batch early, if one did (the diffs before it are good).
pub struct FetchedBatch {
    pub top: State,
    pub fetched: Vec<Fetched>,
    pub stopped: Option<FetchError>,
}

/// Fetches the diffs after the store's sequence, in order, until their
/// unpacked size reaches `bytes_max` (at least one diff), never past the
/// server's top state. One diff that unpacks past `bytes_max` is refused
/// ([`FetchError::TooLarge`]), found while unpacking it. Each state must be no older than the one before it.
pub fn fetch_batch(
    store: &Store,
    server: &mut Server,
    cache: &Path,
    bytes_max: u64,
) -> Result<FetchedBatch, OpsError> {
    let at = store_state(store)?;
    let top = server.top()?;
    let mut batch = FetchedBatch {
        top: top.clone(),
        fetched: Vec::new(),
        stopped: None,
    };
    if top.sequence < at.sequence {
        // Another stream (minutely diffs for a daily store), or a server
        // restored from an old backup: either way not ours to follow.
        return Err(FetchError::Refused {
            url: server.state_url(None),
            message: format!(
                "the server's newest sequence {} is older than the store's {}: is this the server the store was imported from?",
                top.sequence, at.sequence
            ),
        }
        .into());
    }
    if top.sequence == at.sequence {
        return Ok(batch);
    }
    let mut prev = at.clone();
    let mut bytes = 0u64;
    for k in at.sequence + 1..=top.sequence {
        let step = (|| -> Result<Fetched, FetchError> {
            let state = match server.state(k)? {
                Some(s) => s,
                // The first one missing: a hole in the server's range (then
                // retried), or the server no longer keeps it.
                None if k == at.sequence + 1 => {
                    match server.missing_next(at.sequence, k, top.sequence) {
                        FetchError::Missing { .. } => server.state_in_range(k)?,
                        other => return Err(other),
                    }
                }
                None => server.state_in_range(k)?,
            };
            let url = server.state_url(Some(k));
            check_forward(Some(&prev), &state, &url)?;
            server.diff(k, state, cache, bytes_max)
        })();
        match step {
            Ok(f) => {
                bytes += f.unpacked_bytes;
                prev = f.state.clone();
                batch.fetched.push(f);
                if bytes >= bytes_max {
                    break;
                }
            }
            // Nothing was fetched: the error is the whole answer.
            Err(e) if batch.fetched.is_empty() => return Err(e.into()),
            Err(e) => {
                batch.stopped = Some(e);
                break;
            }
        }
    }
    Ok(batch)
}

/// Status of the store and each dataset.
pub fn status(store: &Store, cfg: &OsmConfig) -> Result<serde_json::Value, OpsError> {
    let seq: Option<i64> = store.meta("sequence")?.and_then(|s| s.parse().ok());
    let markers: BTreeMap<String, (Option<i64>, String, i64)> = store
        .datasets()?
        .into_iter()
        .map(|(n, s, r, d)| (n, (s, r, d)))
        .collect();
    let cx = crate::dataset::StatusContext {
        sequence: seq,
        markers,
        rebuild_gap_max: cfg.rebuild_gap_max,
    };
    // As the registry lists the kinds (tiles first), each kind's by name.
    let mut datasets = Vec::new();
    for d in cfg.all.iter() {
        datasets.push(d.status(store, &cx)?);
    }
    let writer = store
        .writer_lease()?
        .filter(|l| l.expires_at_ns > highwater_store::lease::now_ns());
    Ok(serde_json::json!({
        "sequence": seq,
        "timestamp": store.meta("timestamp")?,
        // Diffs applied without a state file: the store no longer follows
        // a replication sequence.
        "unsequenced": store.meta("unsequenced")?.and_then(|n| n.parse::<i64>().ok()),
        "writer": writer.map(|l| serde_json::json!({
            "owner": l.owner,
            "host": l.host,
            "pid": l.pid,
            "token": l.token,
            "expires": highwater_core::window::format_rfc3339(l.expires_at_ns / 1000),
        })),
        "datasets": datasets,
    }))
}

/// The tiles as a GeoJSON FeatureCollection of polygons (for QGIS or
/// geojson.io), each with its z, x and y.
pub fn tiles_geojson(tiles: &BTreeSet<Tile>) -> serde_json::Value {
    highwater_core::tile::tiles_geojson(tiles)
}
