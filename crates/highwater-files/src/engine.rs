//! The engine: plan, run, adopt, verify, export and status over a pipeline.
//!
//! A run of one stage has named, bounded stages joined by a bounded channel:
//! discovery and evidence (rayon, bounded by its pool), `jobs` worker
//! threads, and one committer (the calling thread), which alone writes the
//! state store, in batched transactions, after each output is durable.

use crate::compare;
use crate::deps::{self, DigestCache, RunWritten, Scope};
use crate::discover::{self, Found, OutputScan};
use crate::error::FilesError;
use crate::exec::{self, Job};
use crate::hash::digest_file;
use crate::now_ns;
use crate::recipe::stage_recipe_id;
use crate::spec::{OnDelete, PipelineSpec, StageSpec, Transform};
use highwater_core::evidence::Algo;
use highwater_core::guard::{self, Refusal};
use highwater_core::plan::{
    self, digest_needed, plan_aggregate_with_deps, plan_items_with_deps, reuse_cached_digest,
    Change, Observation, PlanSettings, Reason, StagePlan,
};
use highwater_core::template::{normalize_lexically, ArgTemplate, OutputTemplate};
use highwater_core::{time, Entries, Entry, EntryKind, Status};
use highwater_store::{Batch, StageEntries, StateLocation, StateStore};
use rayon::prelude::*;
use serde::Serialize;
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod fleet;
mod items;

/// The committer writes a transaction at least every this many results...
pub const COMMIT_BATCH_ITEMS_MAX: usize = 512;
/// ...or when this much time has passed since the last one, so that a crash
/// loses little finished work.
pub const COMMIT_INTERVAL_MS: u64 = 200;
/// Results waiting for the committer, per worker. Bounds memory when the
/// store is slower than the workers.
pub const RESULTS_QUEUE_PER_WORKER: usize = 4;
/// Workers per run, whatever `--jobs` asks for.
pub const JOBS_MAX: usize = 1024;
/// What an aggregate's one output is rendered from, in messages.
const AGGREGATE_INPUTS: &str = "(all its inputs)";

/// What a `highwater.toml` stage records as where it was declared.
const TOML_DECLARATION: &str = "highwater.toml";

/// A declaration's identity as far as stage names go: the file, not the
/// function in it (`python:etl.py:clean` is `python:etl.py`), so that
/// renaming the function keeps the stage.
pub(crate) fn declaration_site(declared_in: &str) -> &str {
    match declared_in.strip_prefix("python:") {
        Some(rest) => match rest.rsplit_once(':') {
            Some((file, _)) => &declared_in[..declared_in.len() - rest.len() + file.len()],
            None => declared_in,
        },
        None => declared_in,
    }
}

/// Receives progress. Every method has a no-op default.
pub trait Progress: Sync {
    fn stage_start(&self, _stage: &str, _items: usize) {}
    fn item_done(&self, _stage: &str, _item: &str, _ok: bool) {}
    fn stage_done(&self, _stage: &str) {}
    /// True once the caller wants the run stopped (a Python user's Ctrl-C,
    /// issue 48): no item or stage starts after it; the items running
    /// finish and are recorded, and the run ends with what it did.
    fn cancelled(&self) -> bool {
        false
    }
}

/// A progress sink that ignores everything.
pub struct NoProgress;
impl Progress for NoProgress {}

/// Options of `run`.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Run only this stage.
    pub stage: Option<String>,
    pub jobs: usize,
    /// Run even when the guard would refuse.
    pub force: bool,
    /// Read every byte, ignoring the stat cache.
    pub rehash: bool,
    /// Run only these items of the selected stage(s) (a Dagster partition,
    /// issue 48); the stage's other changes stay pending for a later run.
    /// `None`: every changed item.
    pub items: Option<std::collections::BTreeSet<String>>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            stage: None,
            jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
            force: false,
            rehash: false,
            items: None,
        }
    }
}

/// What one stage's run did.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct StageReport {
    pub name: String,
    pub discovered: usize,
    pub unchanged: usize,
    /// Changed items that still exist (deleted ones are counted apart).
    pub changed: usize,
    pub new: usize,
    pub processed: usize,
    pub deleted: usize,
    pub failed: Vec<FailedItem>,
    /// Set when the stage did not run because an upstream stage has failed
    /// items: an aggregate made from part of its inputs would be wrong.
    pub blocked: Option<String>,
    pub reasons: BTreeMap<String, usize>,
    pub changes: Vec<ChangeRow>,
    /// Items held back: part of what they cover is not ready (issue 49).
    /// One that is not only waiting makes the run partial (exit 1).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<plan::Held>,
    /// Inputs left unchanged although their bytes changed: compared as
    /// data, only their layout did (issue 49).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub layout: Vec<String>,
    pub duration_ms: u64,
    /// On shared state: what this process did of the fleet's work.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleet: Option<fleet::FleetStage>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FailedItem {
    pub input: String,
    pub error: String,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ChangeRow {
    pub input: String,
    pub reason: Reason,
    pub output: String,
}

impl StageReport {
    fn from_plan(plan: &StagePlan) -> StageReport {
        let deleted = plan.count(Reason::Deleted);
        StageReport {
            name: plan.stage.clone(),
            discovered: plan.total,
            unchanged: plan.unchanged,
            changed: plan.changed.len() - deleted,
            new: plan.count(Reason::New),
            reasons: plan
                .counts()
                .into_iter()
                .map(|(r, n)| (r.as_str().to_string(), n))
                .collect(),
            changes: plan
                .changed
                .iter()
                .map(|c| ChangeRow {
                    input: c.item.clone(),
                    reason: c.reason,
                    output: c.output.clone(),
                })
                .collect(),
            held: plan.held.clone(),
            layout: plan.layout.clone(),
            ..StageReport::default()
        }
    }
}

/// What a run did, stage by stage.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunReport {
    pub stages: Vec<StageReport>,
}

impl RunReport {
    pub fn failed(&self) -> usize {
        self.stages
            .iter()
            .map(|s| {
                s.failed.len()
                    + usize::from(s.blocked.is_some())
                    + s.held.iter().filter(|h| !h.waiting).count()
            })
            .sum()
    }
}

/// What `adopt` recorded and refused.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AdoptReport {
    pub stages: Vec<AdoptStage>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct AdoptStage {
    pub name: String,
    pub adopted: usize,
    /// Items whose output is missing: not adopted; a run will make them.
    pub refused: Vec<ChangeRow>,
}

/// The result of re-making one unchanged item in a scratch place.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct VerifyItem {
    pub stage: String,
    pub input: String,
    pub output: String,
    #[serde(flatten)]
    pub outcome: VerifyOutcome,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "lowercase", tag = "result")]
pub enum VerifyOutcome {
    Same,
    /// The bytes differ: a non-deterministic transform, or a recipe that
    /// misses a dependency.
    Differs {
        first_difference_at: u64,
    },
    Failed {
        error: String,
    },
}

struct Stage {
    spec: StageSpec,
    /// The object store the inputs lie in (`NAME:glob`), if not local.
    input_place: Option<String>,
    /// The globs without their place.
    input_globs: Vec<String>,
    /// The object store the outputs go to (`NAME:template`), if not local.
    output_place: Option<String>,
    /// Parsed from the output without its place.
    template: OutputTemplate,
    args: Vec<ArgTemplate>,
    settings: PlanSettings,
    /// The stages whose outputs this one reads.
    upstream: Vec<String>,
    /// Set: the items come from this source, not from globs (issue 49).
    items: Option<Box<dyn crate::inputs::ItemSource>>,
    /// How inputs whose bytes changed are compared (issue 49).
    compare: crate::compare::CompareRules,
}

impl Stage {
    /// Whether the stage's commands run observed (issue 24).
    fn observes(&self) -> bool {
        self.spec.observe && matches!(self.spec.transform, Transform::Command(_))
    }

    /// A closure that reports its own reads (a Python stage, issue 48).
    fn reports_reads(&self) -> bool {
        self.spec.reports_reads && matches!(self.spec.transform, Transform::Closure(_))
    }

    /// Whether the stage's items have dependency sets: recorded from an
    /// observed command, or from what a closure reported it read.
    fn records_deps(&self) -> bool {
        self.observes() || self.reports_reads()
    }
}

/// One item's observed dependencies, as `highwater deps` shows them.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ItemDeps {
    pub stage: String,
    pub item: String,
    pub deps: Vec<DepRow>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct DepRow {
    pub path: String,
    pub kind: &'static str,
    pub changed: bool,
    /// The machine that recorded this file outside the project (a fleet)
    /// when it is not this one: only a plan there checks it, and here it
    /// is never `changed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded_on: Option<String>,
}

/// What discovery and evidence found for a stage, with its plan.
/// Keeps only the changes of `items` (a run of some items: a Dagster
/// partition, issue 48). The others are not recorded, so they stay changed
/// and the next run does them; the counts say what this run does.
fn restrict(plan: &mut StagePlan, items: Option<&std::collections::BTreeSet<String>>) {
    let Some(items) = items else { return };
    plan.changed.retain(|c| items.contains(&c.item));
}

struct Observed {
    plan: StagePlan,
    listing: OutputScan,
    /// The folders of the stage's current outputs, for the folder cache.
    output_dirs: Vec<String>,
    /// The entries the plan was made against.
    prev: StageEntries,
    /// The inputs found, sorted by item.
    found: Vec<Found>,
    /// All inputs, for an aggregate's `{inputs}` (empty otherwise).
    inputs: Vec<String>,
    /// Every output the stage renders now, with the input it renders from
    /// (an aggregate: its one output), for the check that no two stages
    /// write one path.
    rendered: Vec<(String, String)>,
}

/// A validated pipeline, ready to plan and run.
pub struct Pipeline {
    root: PathBuf,
    state_path: PathBuf,
    /// Set: the state is shared in PostgreSQL (see `fleet`).
    state_url_env: Option<String>,
    storage: BTreeMap<String, highwater_objects::StorageSpec>,
    /// Clients of the object stores, opened on first use.
    objects: std::sync::Mutex<BTreeMap<String, std::sync::Arc<highwater_objects::Objects>>>,
    fleet: crate::spec::FleetSettings,
    stages: Vec<Stage>,
    /// The `[sources.NAME]` names, for export and status.
    sources: Vec<String>,
}

fn absolute(p: &Path) -> Result<PathBuf, FilesError> {
    std::path::absolute(p).map_err(|e| FilesError::io("resolving", p, e))
}

/// True when `inner` is `outer` or lies under it, comparing components.
fn is_within(inner: &str, outer: &str) -> bool {
    outer.is_empty()
        || inner == outer
        || (inner.starts_with(outer) && inner.as_bytes().get(outer.len()) == Some(&b'/'))
        || outer.starts_with('/') && inner.starts_with(outer) && outer.ends_with('/')
}

impl Pipeline {
    /// Reads `highwater.toml` and validates it.
    pub fn from_config(path: &Path) -> Result<Pipeline, FilesError> {
        Pipeline::open(crate::config::load(path)?)
    }

    /// Validates a pipeline: templates, globs, programs, the state location,
    /// recipe ids and the stage order. Touches nothing on disk.
    pub fn open(spec: PipelineSpec) -> Result<Pipeline, FilesError> {
        let root = absolute(&spec.root)?;
        let state_path = PathBuf::from(normalize_lexically(
            &absolute(&root.join(&spec.state))?.to_string_lossy(),
        ));
        // Every named place, absolute: none may overlap another.
        let mut places: Vec<(String, String)> = vec![(
            "the state store".into(),
            state_path.to_string_lossy().into_owned(),
        )];
        for (what, p) in &spec.places {
            let abs = if p.is_absolute() {
                p.clone()
            } else {
                absolute(p)?
            };
            places.push((what.clone(), normalize_lexically(&abs.to_string_lossy())));
        }
        for (i, (wa, a)) in places.iter().enumerate() {
            for (wb, b) in &places[i + 1..] {
                if is_within(a, b) || is_within(b, a) {
                    return Err(FilesError::PlacesCollide {
                        first_what: wa.clone(),
                        first: a.into(),
                        second_what: wb.clone(),
                        second: b.into(),
                    });
                }
            }
        }
        let mut stages = Vec::new();
        let storage_names: Vec<&str> = spec.storage.keys().map(String::as_str).collect();
        for mut s in spec.stages {
            let items = match &s.items {
                Some(i) => Some(crate::inputs::open(&s.name, i, &spec.providers)?),
                None => None,
            };
            let vars = items.as_ref().map_or(Default::default(), |i| i.vars());
            if let Some(i) = &items {
                // What the items' commands read of their inputs is evidence
                // through the parts' digests, never as dependencies.
                s.observe_ignore.extend(i.input_globs());
            }
            let tpl_err = |source| FilesError::Template {
                stage: s.name.clone(),
                source,
            };
            let place =
                |what: &'static str, v: &str| -> Result<(Option<String>, String), FilesError> {
                    match v.split_once(':') {
                        Some((n, rest)) if !n.is_empty() && !n.contains('/') => {
                            if storage_names.contains(&n) {
                                Ok((Some(n.to_string()), rest.to_string()))
                            } else {
                                Err(FilesError::UnknownPlace {
                                    stage: s.name.clone(),
                                    what,
                                    value: v.to_string(),
                                    place: n.to_string(),
                                    known: if storage_names.is_empty() {
                                        String::new()
                                    } else {
                                        format!(" (defined: {})", storage_names.join(", "))
                                    },
                                })
                            }
                        }
                        _ => Ok((None, v.to_string())),
                    }
                };
            let mut input_place = None;
            let mut input_globs = Vec::new();
            for (i, g) in s.inputs.iter().enumerate() {
                let (p, rest) = place("input", g)?;
                if i > 0 && p != input_place {
                    return Err(FilesError::Places {
                        stage: s.name.clone(),
                        message: format!(
                            "inputs {:?} lie in different places (local folders and object stores); give a stage inputs from one place",
                            s.inputs
                        ),
                    });
                }
                input_place = p;
                input_globs.push(rest);
            }
            let (output_place, output_rest) = place("output", &s.output)?;
            let template = OutputTemplate::parse_in(&output_rest, vars).map_err(tpl_err)?;
            if items.is_some() && template.is_aggregate() {
                return Err(FilesError::Inputs {
                    stage: s.name.clone(),
                    message: format!(
                        "output `{}` names one file for every item; put {{window_start}}, {{day}} or {{month}} in it",
                        s.output
                    ),
                });
            }
            if input_place.is_some() && template.is_aggregate() {
                return Err(FilesError::Places {
                    stage: s.name.clone(),
                    message: "an aggregate reads all its inputs at once; its inputs must be local files (copy them from the object store in a stage of their own)".into(),
                });
            }
            discover::validate_globs(&s.name, &input_globs)?;
            let args = match &s.transform {
                Transform::Command(argv) => {
                    let program = &argv[0];
                    exec::find_program(&root, program).map_err(|looked| {
                        FilesError::CommandNotFound {
                            stage: s.name.clone(),
                            program: program.clone(),
                            looked,
                        }
                    })?;
                    argv.iter()
                        .map(|a| ArgTemplate::parse_in(a, vars))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(tpl_err)?
                }
                Transform::Closure(_) => Vec::new(),
            };
            let out_root_abs = normalize_lexically(&root.join(template.root()).to_string_lossy());
            if output_place.is_none() && is_within(&state_path.to_string_lossy(), &out_root_abs) {
                return Err(FilesError::StateInsideOutput {
                    state: state_path.clone(),
                    stage: s.name.clone(),
                    root: if template.root().is_empty() {
                        ".".to_string()
                    } else {
                        template.root().to_string()
                    },
                });
            }
            for (what, p) in places.iter().skip(1) {
                if output_place.is_none()
                    && (is_within(p, &out_root_abs) || is_within(&out_root_abs, p))
                {
                    return Err(FilesError::PlacesCollide {
                        first_what: what.clone(),
                        first: p.into(),
                        second_what: format!("the output root of stage `{}`", s.name),
                        second: out_root_abs.clone().into(),
                    });
                }
            }
            if s.compare.any_data() && s.signal != highwater_core::Signal::Hash {
                return Err(FilesError::Compare {
                    stage: s.name.clone(),
                    message: format!(
                        "comparing as data needs signal = \"hash\" (the byte hash is its first check), not {:?}; remove `signal` or `compare`",
                        s.signal.as_str()
                    ),
                });
            }
            let compare = crate::compare::CompareRules::new(&s.name, &s.compare)?;
            let recipe = stage_recipe_id(&root, &s)?;
            let settings = PlanSettings {
                signal: s.signal,
                recipe,
                granularity_ns: (s.mtime_margin_ms as i64).saturating_mul(1_000_000),
                rehash: s.rehash,
            };
            stages.push(Stage {
                spec: s,
                input_place,
                input_globs,
                output_place,
                template,
                args,
                settings,
                upstream: Vec::new(),
                items,
                compare,
            });
        }
        let stages = topo_order(stages)?;
        Ok(Pipeline {
            root,
            state_path,
            state_url_env: spec.state_url_env,
            storage: spec.storage,
            objects: Default::default(),
            fleet: spec.fleet,
            stages,
            sources: spec.sources.keys().cloned().collect(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn state_path(&self) -> &Path {
        &self.state_path
    }

    /// Stage names in run order.
    pub fn stage_names(&self) -> Vec<&str> {
        self.stages.iter().map(|s| s.spec.name.as_str()).collect()
    }

    /// The recipe id of a stage.
    pub fn recipe_id(&self, stage: &str) -> Option<&str> {
        self.stages
            .iter()
            .find(|s| s.spec.name == stage)
            .map(|s| s.settings.recipe.as_str())
    }

    fn scope(&self, st: &Stage) -> Scope {
        let s = Scope::new(&self.root, &self.state_dir(), &st.spec.observe_ignore)
            .with_defaults(st.spec.observe_ignore_defaults);
        // On shared state each machine records its own files outside the
        // project as its own (issue 24: no ping-pong between machines).
        if self.is_shared() {
            s.on_fleet()
        } else {
            s
        }
    }

    /// Which items have a changed dependency, and the first one that did:
    /// each distinct set is decoded once, each distinct dependency
    /// checked once.
    fn changed_deps(
        &self,
        st: &Stage,
        prev: &StageEntries,
        settings: &PlanSettings,
    ) -> Result<BTreeMap<String, String>, FilesError> {
        let mut out = BTreeMap::new();
        if !st.records_deps() || !prev.has_deps() {
            return Ok(out);
        }
        let scope = self.scope(st);
        let mut checker = deps::Checker::new(&scope, settings.granularity_ns, settings.rehash);
        let mut by_set = Vec::with_capacity(prev.dep_sets.len());
        for (id, body) in &prev.dep_sets {
            let set = deps::decode(body).map_err(|what| {
                FilesError::Store(highwater_store::StoreError::Corrupt {
                    path: self.state_path.clone(),
                    stage: st.spec.name.clone(),
                    item: format!("dependency set {id}"),
                    what,
                })
            })?;
            by_set.push(checker.first_changed(&set));
        }
        if by_set.iter().all(Option::is_none) {
            return Ok(out);
        }
        for (e, set) in prev.items.values().zip(&prev.item_sets) {
            if let Some(Some(path)) = set.map(|i| &by_set[i as usize]) {
                out.insert(e.item.clone(), path.clone());
            }
        }
        Ok(out)
    }

    /// The observed dependencies of a stage's items (or one item), and
    /// which of them changed since they were recorded.
    pub fn deps(&self, stage: &str, item: Option<&str>) -> Result<Vec<ItemDeps>, FilesError> {
        let st = self
            .select(Some(stage))?
            .into_iter()
            .next()
            .expect("select names one stage");
        let prev = self.open_store()?.load(stage)?;
        let scope = self.scope(st);
        let mut checker = deps::Checker::new(&scope, st.settings.granularity_ns, false);
        let mut out = Vec::new();
        for (e, (_, body)) in prev.item_deps() {
            let it = &e.item;
            if item.is_some_and(|i| i != it) {
                continue;
            }
            let set = deps::decode(body).map_err(|what| {
                FilesError::Store(highwater_store::StoreError::Corrupt {
                    path: self.state_path.clone(),
                    stage: stage.to_string(),
                    item: it.clone(),
                    what,
                })
            })?;
            out.push(ItemDeps {
                stage: stage.to_string(),
                item: it.clone(),
                deps: set
                    .iter()
                    .map(|d| DepRow {
                        path: d.path.clone(),
                        kind: d.what.as_str(),
                        changed: checker.changed(d),
                        recorded_on: d.host.clone().filter(|_| !scope.checkable(d)),
                    })
                    .collect(),
            });
        }
        if let Some(i) = item {
            if out.is_empty() {
                return Err(FilesError::UnknownItem {
                    stage: stage.to_string(),
                    item: i.to_string(),
                });
            }
        }
        Ok(out)
    }

    fn state_dir(&self) -> PathBuf {
        self.state_path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| self.root.clone())
    }

    /// Opens the state store (creating it on first use): PostgreSQL when
    /// `[state] url_env` names one, the embedded SQLite file otherwise.
    pub fn open_store(&self) -> Result<Box<dyn StateStore>, FilesError> {
        Ok(self.state_location().open()?)
    }

    /// Where the state lives.
    pub fn state_location(&self) -> StateLocation {
        match &self.state_url_env {
            Some(var) => StateLocation::Postgres { var: var.clone() },
            None => StateLocation::Sqlite(self.state_path.clone()),
        }
    }

    /// The client of object store `place` (opened on first use).
    fn objects(
        &self,
        stage: &str,
        place: &str,
    ) -> Result<std::sync::Arc<highwater_objects::Objects>, FilesError> {
        let mut open = self.objects.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(o) = open.get(place) {
            return Ok(o.clone());
        }
        let spec = self
            .storage
            .get(place)
            .expect("places are checked against [storage] when the pipeline opens");
        let o =
            std::sync::Arc::new(highwater_objects::Objects::open(place, spec).map_err(|e| {
                FilesError::Storage {
                    stage: stage.to_string(),
                    message: e.to_string(),
                }
            })?);
        open.insert(place.to_string(), o.clone());
        Ok(o)
    }

    /// Whether the state is shared by a fleet (PostgreSQL).
    pub fn is_shared(&self) -> bool {
        self.state_url_env.is_some()
    }

    /// Takes the SQLite state store's run lock (for `state migrate`: no
    /// run writes while the state is copied). `None` on shared state.
    pub fn lock_state(&self) -> Result<Option<File>, FilesError> {
        self.lock()
    }

    /// Takes the single-writer lock: one run (or adopt) per SQLite state
    /// store. A shared store has no such lock: its processes coordinate
    /// through leases and claims.
    fn lock(&self) -> Result<Option<File>, FilesError> {
        if self.is_shared() {
            return Ok(None);
        }
        let dir = self.state_dir();
        std::fs::create_dir_all(&dir).map_err(|e| FilesError::io("creating", &dir, e))?;
        let path = dir.join("lock");
        let f = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| FilesError::io("opening", &path, e))?;
        match f.try_lock() {
            Ok(()) => Ok(Some(f)),
            Err(std::fs::TryLockError::WouldBlock) => Err(FilesError::Locked { path }),
            Err(std::fs::TryLockError::Error(e)) => Err(FilesError::io("locking", &path, e)),
        }
    }

    fn select(&self, only: Option<&str>) -> Result<Vec<&Stage>, FilesError> {
        match only {
            None => Ok(self.stages.iter().collect()),
            Some(name) => self
                .stages
                .iter()
                .find(|s| s.spec.name == name)
                .map(|s| vec![s])
                .ok_or_else(|| FilesError::UnknownStage {
                    name: name.to_string(),
                    known: self.stage_names().join(", "),
                }),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn observe_one(
        &self,
        st: &Stage,
        f: &Found,
        statted: crate::stat::Statted,
        observed_at_ns: i64,
        prev: Option<&Entry>,
        settings: &PlanSettings,
        output: String,
        output_exists: bool,
        notes: &std::sync::Mutex<Vec<String>>,
    ) -> Result<Observation, FilesError> {
        let unreadable = |source| FilesError::InputUnreadable {
            stage: st.spec.name.clone(),
            path: self.root.join(&f.item),
            source,
        };
        let (stat, is_file) = statted.map_err(unreadable)?;
        if !is_file {
            return Err(unreadable(std::io::Error::other("not a regular file")));
        }
        let mut digests = highwater_core::plan::Digests::new();
        let mode = st.compare.mode_for(&f.item);
        let prev_digest = prev.and_then(|e| e.digest.as_ref());
        let needed = compare::needed(digest_needed(prev, &stat, settings), mode, prev_digest);
        // An object is read only when its listing cannot vouch for it (the
        // same rule as a file's stat), into a scratch file that goes after.
        let mut _scratch = None;
        let abs = match (&st.input_place, needed.is_empty()) {
            // Nothing to read: no path to build (a no-change plan).
            (_, true) => PathBuf::new(),
            (Some(place), false) => {
                let key = &f.item[place.len() + 1..];
                let sc = exec::Scratch::new().map_err(unreadable)?;
                let local = sc.file(key);
                self.objects(&st.spec.name, place)?
                    .get_to(key, &local)
                    .map_err(|e| FilesError::Storage {
                        stage: st.spec.name.clone(),
                        message: e.to_string(),
                    })?;
                _scratch = Some(sc);
                local
            }
            _ => self.root.join(&f.item),
        };
        for algo in needed {
            let d = match (algo, mode) {
                (Algo::Data1, compare::Mode::Data { order }) => {
                    let (d, note) =
                        compare::data1_file(&abs, order, prev_digest).map_err(unreadable)?;
                    if let Some(n) = note {
                        let mut notes = notes.lock().unwrap_or_else(|p| p.into_inner());
                        notes.push(format!("{}: {n}", f.item));
                    }
                    d
                }
                _ => digest_file(&abs, algo).map_err(unreadable)?,
            };
            digests.push(d);
        }
        let mut obs = Observation {
            item: f.item.clone(),
            stat,
            digests,
            observed_at_ns,
            output,
            output_exists,
        };
        reuse_cached_digest(prev, &mut obs);
        Ok(obs)
    }

    /// Discovery, evidence and the plan of one stage. Reads files; writes
    /// nothing. The three listings (entries, inputs, outputs) are taken
    /// concurrently; the entries through a read connection of their own, so
    /// `prev = None` is safe while the caller holds the writing store.
    fn observe(
        &self,
        st: &Stage,
        rehash: bool,
        prev: Option<StageEntries>,
    ) -> Result<Observed, FilesError> {
        self.observe_in(st, rehash, prev, None)
    }

    /// [`Self::observe`], reading through `open` where a stage reads its
    /// state on this thread (a stage over an item source): the caller's
    /// open connection, with no transaction of its own.
    fn observe_in(
        &self,
        st: &Stage,
        rehash: bool,
        prev: Option<StageEntries>,
        open: Option<&dyn StateStore>,
    ) -> Result<Observed, FilesError> {
        if let Some(src) = &st.items {
            return self.observe_items(st, src.as_ref(), rehash, prev, open);
        }
        let name = &st.spec.name;
        let load = || -> Result<StageEntries, FilesError> {
            match prev {
                Some(p) => Ok(p),
                None => Ok(self.open_store()?.load(name)?),
            }
        };
        // The stats do not depend on the entries, so they run while the
        // manifest loads: on two cores this is most of a no-change plan.
        let (prev, found_stats) = rayon::join(load, || -> Result<_, FilesError> {
            if let Some(place) = &st.input_place {
                // The listing is the stat; the instant is taken before it.
                let at = now_ns();
                let listed = discover::find_objects(
                    &*self.objects(name, place)?,
                    place,
                    name,
                    &st.input_globs,
                )?;
                let (found, stats) = listed
                    .into_iter()
                    .map(|(f, stat)| (f, (Ok((stat, true)), at)))
                    .unzip();
                return Ok((found, stats));
            }
            discover::find_inputs_statted(&self.root, name, &st.input_globs, &self.state_dir())
        });
        let (prev, (found, stats)) = (prev?, found_stats?);
        let mut settings = st.settings.clone();
        settings.rehash |= rehash;
        let changed_deps = self.changed_deps(st, &prev, &settings)?;
        let dep = |item: &str| changed_deps.get(item).cloned();
        let tpl_err = |source| FilesError::Template {
            stage: name.clone(),
            source,
        };
        // An input that is where the stage writes, or that it wrote itself,
        // would be overwritten or fed back: refused before any work.
        let found_names = Names(&found, |f: &Found| f.item.as_str());
        if let Some(i) = first_common(
            found_names,
            Names(prev.items.as_slice(), |e: &Entry| e.output.as_str()),
        ) {
            return Err(FilesError::InputIsOwnOutput {
                stage: name.clone(),
                input: found[i].item.clone(),
                root: if st.template.root().is_empty() {
                    ".".to_string()
                } else {
                    st.template.root().to_string()
                },
            });
        }
        let inputs: Vec<String> = if st.template.is_aggregate() {
            found.iter().map(|f| f.item.clone()).collect()
        } else {
            Vec::new()
        };
        let render = |relpath: &str| -> Result<String, FilesError> {
            let out = st.template.render(relpath).map_err(tpl_err)?;
            Ok(match &st.output_place {
                Some(p) => format!("{p}:{out}"),
                None => out,
            })
        };
        // Outputs in object storage: one listing of the template's root;
        // there are no folders to cache.
        let scan = |output_dirs: &[String]| -> Result<(OutputScan, Vec<String>), FilesError> {
            match &st.output_place {
                Some(p) => Ok((
                    discover::scan_objects(&*self.objects(name, p)?, p, name, st.template.root())?,
                    Vec::new(),
                )),
                None => Ok((
                    discover::scan_output_dirs(
                        &self.root,
                        output_dirs,
                        &prev.dirs,
                        settings.granularity_ns,
                    )?,
                    output_dirs.to_vec(),
                )),
            }
        };
        let mut rendered = Vec::new();
        // Inputs compared as data that had to be compared by bytes.
        let notes = std::sync::Mutex::new(Vec::new());
        let (plan, listing, output_dirs) = if st.template.is_aggregate() {
            let output = render("")?;
            if found.iter().any(|f| f.item == output) {
                return Err(FilesError::OutputOverwritesInput {
                    stage: name.clone(),
                    input: output.clone(),
                    output,
                });
            }
            rendered.push((output.clone(), AGGREGATE_INPUTS.to_string()));
            let (listing, output_dirs) =
                scan(&discover::output_dirs(std::iter::once(output.as_str())))?;
            let members = found
                .par_iter()
                .zip(stats.into_par_iter())
                .map(|(f, (statted, at))| {
                    self.observe_one(
                        st,
                        f,
                        statted,
                        at,
                        prev.members.get(&f.item),
                        &settings,
                        String::new(),
                        true,
                        &notes,
                    )
                })
                .collect::<Result<Vec<_>, _>>()?;
            let recorded = prev
                .items
                .get(plan::AGGREGATE_ITEM)
                .is_some_and(|e| e.output == output);
            let exists = listing.exists(&output, recorded);
            let plan = plan_aggregate_with_deps(
                name,
                prev.items.get(plan::AGGREGATE_ITEM),
                &prev.members,
                members,
                &output,
                exists,
                &settings,
                &dep,
            );
            (plan, listing, output_dirs)
        } else {
            let outputs = found
                .iter()
                .map(|f| render(f.relpath()))
                .collect::<Result<Vec<_>, _>>()?;
            let output_names = Names(&outputs, |o: &String| o.as_str());
            if let Some(i) = first_common(output_names, found_names) {
                return Err(FilesError::OutputOverwritesInput {
                    stage: name.clone(),
                    input: outputs[i].clone(),
                    output: outputs[i].clone(),
                });
            }
            // Two inputs rendering to one output would overwrite each other.
            // An output template nearly always keeps its inputs' order, and
            // outputs in strictly rising order are distinct: one pass. Else
            // they are sorted (a million names take a third of a second).
            if let Some((a, b)) = (!output_names.strictly_rising())
                .then(|| {
                    let mut order: Vec<usize> = (0..outputs.len()).collect();
                    order.sort_unstable_by(|&a, &b| outputs[a].cmp(&outputs[b]));
                    order
                        .windows(2)
                        .find(|w| outputs[w[0]] == outputs[w[1]])
                        .map(|w| (w[0].min(w[1]), w[0].max(w[1])))
                })
                .flatten()
            {
                return Err(FilesError::OutputCollision {
                    stage: name.clone(),
                    output: outputs[a].clone(),
                    first: found[a].item.clone(),
                    second: found[b].item.clone(),
                });
            }
            // Only a pipeline of two stages or more can collide across them.
            if self.stages.len() > 1 {
                rendered = outputs
                    .iter()
                    .zip(&found)
                    .map(|(o, f)| (o.clone(), f.item.clone()))
                    .collect();
            }
            let (listing, output_dirs) =
                scan(&discover::output_dirs(outputs.iter().map(String::as_str)))?;
            // Each input's entry, by one merge of the two sorted lists
            // rather than a search per input.
            let prevs = merge_sorted(&found, &prev.items);
            // Collected by index into one list of the right size, then
            // unwrapped in place: a parallel collect into `Result<Vec>`
            // would gather pieces and copy them together.
            let mut observed = Vec::with_capacity(found.len());
            found
                .par_iter()
                .zip(outputs.into_par_iter())
                .zip(stats.into_par_iter())
                .zip(prevs.into_par_iter())
                .map(|(((f, out), (statted, at)), prev_item)| {
                    let exists = listing.exists(&out, prev_item.is_some_and(|e| e.output == out));
                    self.observe_one(
                        st, f, statted, at, prev_item, &settings, out, exists, &notes,
                    )
                })
                .collect_into_vec(&mut observed);
            let observations = observed.into_iter().collect::<Result<Vec<_>, _>>()?;
            (
                plan_items_with_deps(name, &prev.items, observations, &settings, &dep),
                listing,
                output_dirs,
            )
        };
        let mut plan = plan;
        let mut notes = notes.into_inner().unwrap_or_else(|p| p.into_inner());
        notes.sort();
        plan.notes.extend(notes);
        if matches!(st.spec.transform, Transform::Command(_)) && !st.spec.observe {
            plan.notes.push(format!(
                "stage `{name}`: observe = false, so its recipe is declared only: a change to a file its command reads is seen only if `recipe.files` lists it"
            ));
        }
        Ok(Observed {
            plan,
            listing,
            output_dirs,
            prev,
            found,
            inputs,
            rendered,
        })
    }

    /// Every output `st` renders now from its inputs as listed (no stat, no
    /// digest), with the input of each: the cross-stage check of a shared
    /// run, which does not observe every stage before the first one runs.
    fn rendered_outputs(&self, st: &Stage) -> Result<Vec<(String, String)>, FilesError> {
        if let Some(src) = &st.items {
            return self.rendered_items(st, src.as_ref());
        }
        let name = &st.spec.name;
        let found: Vec<Found> = match &st.input_place {
            Some(place) => {
                discover::find_objects(&*self.objects(name, place)?, place, name, &st.input_globs)?
                    .into_iter()
                    .map(|(f, _)| f)
                    .collect()
            }
            None => discover::find_inputs(&self.root, name, &st.input_globs, &self.state_dir())?,
        };
        let place = |out: String| match &st.output_place {
            Some(p) => format!("{p}:{out}"),
            None => out,
        };
        let tpl_err = |source| FilesError::Template {
            stage: name.clone(),
            source,
        };
        if st.template.is_aggregate() {
            let out = place(st.template.render("").map_err(tpl_err)?);
            return Ok(vec![(out, AGGREGATE_INPUTS.to_string())]);
        }
        found
            .iter()
            .map(|f| {
                Ok((
                    place(st.template.render(f.relpath()).map_err(tpl_err)?),
                    f.item.clone(),
                ))
            })
            .collect()
    }

    /// `check_outputs_disjoint` over `selected` (stage, rendered outputs)
    /// and every other stage of the pipeline as its inputs render now.
    fn check_against_all(
        &self,
        selected: &[(&str, &[(String, String)])],
    ) -> Result<(), FilesError> {
        if self.stages.len() < 2 {
            return Ok(());
        }
        let mut others = Vec::new();
        for st in &self.stages {
            if !selected.iter().any(|(n, _)| *n == st.spec.name) {
                others.push((st.spec.name.as_str(), self.rendered_outputs(st)?));
            }
        }
        let mut all: Vec<(&str, &[(String, String)])> = selected.to_vec();
        all.extend(others.iter().map(|(n, r)| (*n, r.as_slice())));
        Self::check_outputs_disjoint(&all)
    }

    /// Refuses two stages that render onto one output path (issue 20): the
    /// later would overwrite the earlier, both recorded as done.
    fn check_outputs_disjoint(per_stage: &[(&str, &[(String, String)])]) -> Result<(), FilesError> {
        if per_stage.len() < 2 {
            return Ok(());
        }
        let mut all: Vec<(&str, usize, &str)> = per_stage
            .iter()
            .enumerate()
            .flat_map(|(i, (_, outs))| outs.iter().map(move |(o, f)| (o.as_str(), i, f.as_str())))
            .collect();
        all.sort_unstable();
        for w in all.windows(2) {
            let ((o, a, fa), (p, b, fb)) = (w[0], w[1]);
            if o == p && a != b {
                return Err(FilesError::StagesShareOutput {
                    output: o.to_string(),
                    first_stage: per_stage[a].0.to_string(),
                    first_input: fa.to_string(),
                    second_stage: per_stage[b].0.to_string(),
                    second_input: fb.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Refuses a local output root that this process cannot write (issue
    /// 20): every item would run and then fail to publish. The root, or the
    /// nearest folder above it that exists (the run creates the rest), must
    /// be writable. An output that cannot be published below a writable
    /// root is a failed item, reported with exit 1.
    fn check_writable(&self, st: &Stage) -> Result<(), FilesError> {
        if st.output_place.is_some() {
            return Ok(());
        }
        let mut dir = self.root.join(st.template.root());
        while !dir.exists() {
            match dir.parent() {
                Some(p) => dir = p.to_path_buf(),
                None => return Ok(()),
            }
        }
        use std::os::unix::ffi::OsStrExt;
        let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
            return Ok(());
        };
        // SAFETY: `c` is a valid NUL-terminated path; access only reads it.
        if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } == 0 {
            return Ok(());
        }
        Err(FilesError::OutputUnwritable {
            stage: st.spec.name.clone(),
            path: dir,
            reason: std::io::Error::last_os_error().to_string(),
        })
    }

    /// Plans every (or one) stage. Read-only: the store is not written, no
    /// output is touched. A stage downstream of a changed stage is planned
    /// against the files as they are now, before upstream runs.
    pub fn plan(&self, only: Option<&str>, rehash: bool) -> Result<Vec<StagePlan>, FilesError> {
        // Opened once so that a first plan creates and migrates the store,
        // and held to the end: while one connection is open, SQLite keeps
        // the WAL and its index, which the plan's later opens would
        // otherwise create again after each close removed them.
        let store = self.open_store()?;
        let selected = self.select(only)?;
        self.check_declarations(store.as_ref(), &selected)?;
        let mut observed = Vec::new();
        for st in selected {
            observed.push((
                st.spec.name.as_str(),
                self.observe_in(st, rehash, None, Some(store.as_ref()))?,
            ));
        }
        self.check_against_all(
            &observed
                .iter()
                .map(|(n, o)| (*n, o.rendered.as_slice()))
                .collect::<Vec<_>>(),
        )?;
        let plans = observed
            .iter_mut()
            .map(|(_, o)| std::mem::take(&mut o.plan))
            .collect();
        drop_elsewhere(observed.into_iter().map(|(_, o)| o).collect::<Vec<_>>());
        Ok(plans)
    }

    /// Refuses a stage whose name another declaration in this root also
    /// uses (issue 48): a Python stage named like a `highwater.toml` stage,
    /// or a stage whose last run was declared in another file that still
    /// names it. Stage names are one namespace per state store; two
    /// declarations of one name would delete each other's outputs.
    fn check_declarations(
        &self,
        store: &dyn StateStore,
        selected: &[&Stage],
    ) -> Result<(), FilesError> {
        let mut runs = None;
        for st in selected {
            let (name, ours) = (st.spec.name.as_str(), st.spec.declared_in.as_str());
            let twice = |theirs: &str| FilesError::StageDeclaredTwice {
                stage: name.to_string(),
                ours: ours.to_string(),
                theirs: theirs.to_string(),
            };
            if ours.starts_with("python:") && self.toml_declares(name) {
                return Err(twice(TOML_DECLARATION));
            }
            if runs.is_none() {
                runs = Some(store.last_runs()?);
            }
            let last = runs.iter().flatten().find(|r| r.stage == name);
            let Some(theirs) = last.and_then(|r| r.summary["declared_in"].as_str()) else {
                continue;
            };
            if declaration_site(theirs) != declaration_site(ours)
                && self.still_declares(theirs, name)
            {
                return Err(twice(theirs));
            }
        }
        Ok(())
    }

    /// Whether this root's `highwater.toml` has a `[stages.NAME]` table. A
    /// file that does not parse declares nothing here (the CLI says why).
    fn toml_declares(&self, name: &str) -> bool {
        let Ok(text) = std::fs::read_to_string(self.root.join(TOML_DECLARATION)) else {
            return false;
        };
        text.parse::<toml::Table>().is_ok_and(|t| {
            t.get("stages")
                .and_then(|s| s.as_table())
                .is_some_and(|s| s.contains_key(name))
        })
    }

    /// Whether the declaration a run recorded still stands: the
    /// highwater.toml still has the stage, or the Python file still exists
    /// and names it (a file that no longer mentions the name cannot declare
    /// it; that is how a stage moves to another file).
    fn still_declares(&self, declared_in: &str, name: &str) -> bool {
        if declared_in == TOML_DECLARATION {
            return self.toml_declares(name);
        }
        let site = declaration_site(declared_in);
        match site.strip_prefix("python:") {
            Some(file) if file.ends_with(".py") => {
                std::fs::read_to_string(self.root.join(file)).is_ok_and(|text| text.contains(name))
            }
            _ => false,
        }
    }

    /// Runs every (or one) stage in dependency order.
    pub fn run(&self, opts: &RunOptions, progress: &dyn Progress) -> Result<RunReport, FilesError> {
        if self.is_shared() {
            if opts.items.is_some() {
                return Err(FilesError::Inputs {
                    stage: opts.stage.clone().unwrap_or_default(),
                    message: "a run of chosen items (a Dagster partition) is not supported with \
                              shared state (a fleet claims items itself); run the whole stage"
                        .into(),
                });
            }
            return self.run_fleet(opts, progress);
        }
        let _lock = self.lock()?;
        let mut store = self.open_store()?;
        let selected = self.select(opts.stage.as_deref())?;
        self.check_declarations(store.as_ref(), &selected)?;
        // Every stage is planned and guarded before anything is touched.
        let mut observed = Vec::with_capacity(selected.len());
        let mut refusals: Vec<Refusal> = Vec::new();
        for st in &selected {
            let mut o = self.observe(st, opts.rehash, None)?;
            restrict(&mut o.plan, opts.items.as_ref());
            if let Err(r) = guard::check(
                &o.plan,
                st.spec.guard,
                st.spec.guard_items_min,
                o.listing.any(),
                opts.force,
            ) {
                refusals.push(r);
            }
            observed.push(Some(o));
        }
        if !refusals.is_empty() {
            return Err(FilesError::Guard { refusals });
        }
        let rendered: Vec<(&str, Vec<(String, String)>)> = selected
            .iter()
            .zip(&observed)
            .map(|(st, o)| {
                let o = o.as_ref().expect("observed once per stage");
                (st.spec.name.as_str(), o.rendered.clone())
            })
            .collect();
        self.check_against_all(
            &rendered
                .iter()
                .map(|(n, r)| (*n, r.as_slice()))
                .collect::<Vec<_>>(),
        )?;
        for st in &selected {
            self.check_writable(st)?;
        }
        // Refused before any stage runs, when a stage with work would run
        // its commands observed and this machine cannot observe them.
        for (st, o) in selected.iter().zip(&observed) {
            let has_work = o.as_ref().is_some_and(|o| !o.plan.changed.is_empty());
            if st.observes() && has_work {
                observe_available(&st.spec.name)?;
            }
        }
        let mut report = RunReport::default();
        let mut upstream_worked = false;
        for (i, st) in selected.iter().enumerate() {
            if progress.cancelled() {
                break;
            }
            let mut r = StageReport {
                name: st.spec.name.clone(),
                ..StageReport::default()
            };
            // Upstream work changed this stage's inputs: look again. The
            // guard is not applied again, since these changes are real ones
            // that a guarded (or forced) upstream run made.
            let result = (|| -> Result<(), FilesError> {
                if st.template.is_aggregate() {
                    if let Some(why) = self.upstream_failures(store.as_ref(), st)? {
                        r = StageReport::from_plan(
                            &observed[i].take().expect("observed once per stage").plan,
                        );
                        r.changes.clear();
                        r.blocked = Some(why);
                        return Ok(());
                    }
                }
                let o = if upstream_worked {
                    let mut o = self.observe(st, opts.rehash, None)?;
                    restrict(&mut o.plan, opts.items.as_ref());
                    // Its inputs may be new, and so may every other
                    // stage's: checked again against all of them as they
                    // render now, before it runs.
                    self.check_against_all(&[(st.spec.name.as_str(), o.rendered.as_slice())])?;
                    o
                } else {
                    observed[i].take().expect("observed once per stage")
                };
                self.run_stage(store.as_mut(), st, o, opts, progress, &mut r)
            })();
            if let Err(e) = result {
                return Err(Self::local_unfinished(e, &report, &r, &selected[i + 1..]));
            }
            upstream_worked |= r.processed > 0 || r.deleted > 0 || !r.failed.is_empty();
            report.stages.push(r);
        }
        Ok(report)
    }

    /// The error a local run ends with when it stops part way (issue 20):
    /// once this run has made or recorded anything (an output, a deletion,
    /// a failed item), the error is `Unfinished` (exit 1), naming what was
    /// done and what is left; before any work it stays a refusal (exit 2).
    fn local_unfinished(
        e: FilesError,
        done: &RunReport,
        stage: &StageReport,
        later: &[&Stage],
    ) -> FilesError {
        let worked = |s: &StageReport| s.processed > 0 || s.deleted > 0 || !s.failed.is_empty();
        if !worked(stage) && !done.stages.iter().any(worked) {
            return e;
        }
        let mut parts: Vec<String> = done
            .stages
            .iter()
            .chain(std::iter::once(stage))
            .filter(|s| worked(s))
            .map(|s| {
                format!(
                    "stage `{}` made {} output(s), deleted {} and recorded {} failed item(s)",
                    s.name,
                    s.processed,
                    s.deleted,
                    s.failed.len()
                )
            })
            .collect();
        parts.push(format!("stage `{}` did not finish", stage.name));
        unfinished(
            e,
            &stage.name,
            parts,
            later,
            "Fix the cause above, then run again; what was recorded stays",
        )
    }

    /// Why an aggregate must wait: an upstream stage has items recorded as
    /// failed (in this run or before), so its inputs are incomplete.
    fn upstream_failures(
        &self,
        store: &dyn StateStore,
        st: &Stage,
    ) -> Result<Option<String>, FilesError> {
        for up in &st.upstream {
            let failed: Vec<String> = store
                .load(up)?
                .items
                .into_iter()
                .filter(|e| e.status == Status::Failed)
                .map(|e| e.item)
                .collect();
            if let Some(first) = failed.first() {
                return Ok(Some(format!(
                    "blocked: upstream stage `{up}` has {} failed item(s) (first: {first}); this aggregate waits until they succeed, so it is never made from part of its inputs",
                    failed.len()
                )));
            }
        }
        Ok(None)
    }

    /// The plan's own writes: refreshed evidence, pruned members, and the
    /// deleted items, each after its output is removed (`on_delete`); a
    /// removal that fails is reported and its entry kept.
    fn plan_batch(&self, st: &Stage, plan: &StagePlan, report: &mut StageReport) -> Batch {
        let name = &st.spec.name;
        let mut batch = Batch::default();
        for e in &plan.refresh {
            batch.upserts.push((name.clone(), e.clone()));
        }
        for m in &plan.prune_members {
            batch
                .deletes
                .push((name.clone(), EntryKind::Member, m.clone()));
        }
        for c in plan.changed.iter().filter(|c| c.reason == Reason::Deleted) {
            let removed = match st.spec.on_delete {
                OnDelete::Remove => self.remove_output(st, &c.output),
                OnDelete::Keep => Ok(()),
            };
            match removed {
                Ok(()) => {
                    batch
                        .deletes
                        .push((name.clone(), EntryKind::Item, c.item.clone()));
                    report.deleted += 1;
                }
                Err(error) => report.failed.push(FailedItem {
                    input: c.item.clone(),
                    error,
                }),
            }
        }
        batch
    }

    fn remove_output(&self, st: &Stage, output: &str) -> Result<(), String> {
        if let Some(place) = &st.output_place {
            let key = &output[place.len() + 1..];
            return self
                .objects(&st.spec.name, place)
                .map_err(|e| e.to_string())?
                .delete(key)
                .map_err(|e| format!("cannot remove output {output}: {e}"));
        }
        let path = self.root.join(output);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(format!("cannot remove output {}: {e}", path.display())),
        }
        let _ = exec::sync_parent(&path);
        // Remove folders the deletion left empty, up to the output root.
        let stop = self.root.join(st.template.root());
        let mut dir = path.parent();
        while let Some(d) = dir {
            if d == stop || !d.starts_with(&stop) || std::fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
        Ok(())
    }

    fn run_stage(
        &self,
        store: &mut dyn StateStore,
        st: &Stage,
        o: Observed,
        opts: &RunOptions,
        progress: &dyn Progress,
        report: &mut StageReport,
    ) -> Result<(), FilesError> {
        let started = Instant::now();
        let name = st.spec.name.clone();
        let run_id = store.begin_run(&name, now_ns())?;
        // Filled in as it goes, so that a stage that stops part way can say
        // what it did.
        *report = StageReport::from_plan(&o.plan);
        // Temp outputs are only left by a run that died; we hold the lock,
        // so none of them belongs to a live run.
        for t in &o.listing.temps {
            if std::fs::remove_dir_all(t).is_err() {
                let _ = std::fs::remove_file(t);
            }
        }
        // Deletions, refreshed evidence and pruned members: one transaction,
        // after the outputs are gone.
        let batch = self.plan_batch(st, &o.plan, report);
        store.commit(&batch)?;

        let work: Vec<&Change> = o
            .plan
            .changed
            .iter()
            .filter(|c| c.reason != Reason::Deleted)
            .collect();
        progress.stage_start(&name, work.len());
        if st.observes() && !work.is_empty() {
            observe_available(&name)?;
        }
        let jobs = opts.jobs.clamp(1, JOBS_MAX).min(work.len().max(1));
        let next = AtomicUsize::new(0);
        let abort = AtomicBool::new(false);
        // What this run writes, so that no item depends on it (issue 24):
        // every output from the start, and those of its folders that do
        // not exist yet (highwater makes them, unobserved), then what each
        // command wrote as it finishes. Each path itself only: an existing
        // `data/` above `data/out/` still has its tables read as evidence.
        let dep_scope = self.scope(st);
        let run_written = RunWritten::default();
        let digests = DigestCache::default();
        if st.records_deps() {
            let sets: Vec<Vec<deps::Dep>> = o
                .prev
                .dep_sets
                .iter()
                .filter_map(|(_, b)| deps::decode(b).ok())
                .collect();
            digests.seed(&dep_scope, &sets, st.settings.granularity_ns);
            if !work.is_empty() {
                // No bytecode cache may stand in for a changed source.
                let mut checker = deps::Checker::new(&dep_scope, st.settings.granularity_ns, false);
                deps::forget_stale_bytecode(&dep_scope, &sets, &st.spec.recipe.files, &mut checker);
            }
        }
        if st.records_deps() && st.output_place.is_none() {
            self.note_outputs(work.iter().map(|c| c.output.as_str()), &run_written);
        }
        type Done = (usize, Result<Option<(String, String)>, String>, u64);
        let (tx, rx) = mpsc::sync_channel::<Done>(jobs * RESULTS_QUEUE_PER_WORKER);
        let commit_result: Result<(), FilesError> = std::thread::scope(|scope| {
            for _ in 0..jobs {
                let tx = tx.clone();
                let (work, next, abort, o) = (&work, &next, &abort, &o);
                let (dep_scope, run_written, digests) = (&dep_scope, &run_written, &digests);
                scope.spawn(move || loop {
                    if abort.load(Ordering::Relaxed) || progress.cancelled() {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(c) = work.get(i) else { break };
                    let t0 = Instant::now();
                    let sink = run_written.sink(dep_scope.keyer());
                    let r = self.make_item(st, c, o, Some(sink)).map(|seen| {
                        seen.map(|seen| {
                            run_written.add(seen.written.iter().map(|p| dep_scope.key(p)));
                            let mut own: Vec<String> = if st.template.is_aggregate() {
                                o.inputs.clone()
                            } else {
                                vec![c.item.clone()]
                            };
                            own.push(c.output.clone());
                            deps::encode(&deps::record(
                                dep_scope,
                                &seen,
                                &own,
                                run_written,
                                digests,
                            ))
                        })
                    });
                    let ms = t0.elapsed().as_millis() as u64;
                    if tx.send((i, r, ms)).is_err() {
                        break;
                    }
                });
            }
            drop(tx);
            // The committer: the only writer of the state store.
            let mut pending = Batch::default();
            let mut last = Instant::now();
            let mut sets_sent = std::collections::HashSet::new();
            for (i, r, ms) in rx.iter() {
                let c = work[i];
                let obs = c
                    .observation
                    .as_ref()
                    .expect("only deletions lack an observation");
                let (status, error) = match &r {
                    Ok(_) => (Status::Ok, None),
                    Err(e) => (Status::Failed, Some(e.clone())),
                };
                // The item's dependency set goes in the same transaction as
                // its entry: a crash never leaves one without the other.
                let set_id = match &r {
                    Ok(Some((id, body))) => {
                        if sets_sent.insert(id.clone()) {
                            pending.dep_sets.push((id.clone(), body.clone()));
                        }
                        Some(id.clone())
                    }
                    _ => None,
                };
                pending.deps.push((name.clone(), c.item.clone(), set_id));
                let entry = if st.template.is_aggregate() {
                    plan::aggregate_entry(obs, &st.settings, status, error, now_ns(), ms)
                } else {
                    plan::entry_for(obs, &st.settings, status, error, now_ns(), ms)
                };
                pending.upserts.push((name.clone(), entry));
                match r {
                    Ok(_) => report.processed += 1,
                    Err(error) => report.failed.push(FailedItem {
                        input: c.item.clone(),
                        error,
                    }),
                }
                progress.item_done(&name, &c.item, status == Status::Ok);
                if pending.len() >= COMMIT_BATCH_ITEMS_MAX
                    || last.elapsed() >= Duration::from_millis(COMMIT_INTERVAL_MS)
                {
                    if let Err(e) = store.commit(&pending) {
                        abort.store(true, Ordering::Relaxed);
                        return Err(e.into());
                    }
                    pending = Batch::default();
                    last = Instant::now();
                }
            }
            store.commit(&pending)?;
            Ok(())
        });
        commit_result?;
        // Every output is in place: record its folders for the next plan.
        store.commit(&Batch {
            dirs: vec![(
                name.clone(),
                discover::record_output_dirs(&self.root, &o.output_dirs),
            )],
            ..Batch::default()
        })?;
        progress.stage_done(&name);
        report.duration_ms = started.elapsed().as_millis() as u64;
        report.failed.sort_by(|a, b| a.input.cmp(&b.input));
        let summary = json!({
            "discovered": report.discovered,
            "changed": report.changed,
            "unchanged": report.unchanged,
            "new": report.new,
            "processed": report.processed,
            "deleted": report.deleted,
            "failed": report.failed.len(),
            "reasons": report.reasons,
            "held": report.held,
            "declared_in": st.spec.declared_in,
            // What the recipe id stands for, kept in the state beside the
            // run, so that the next plan can name which part changed (a
            // Python stage's code components, issue 22).
            "recipe": {"id": st.settings.recipe, "config": st.spec.recipe.config},
        });
        let held = report.held.iter().any(|h| !h.waiting);
        let exit = if report.failed.is_empty() && !held {
            0
        } else {
            1
        };
        store.finish_run(run_id, now_ns(), &summary, exit)?;
        Ok(())
    }

    /// Adds to what the run wrote these outputs and those of their folders
    /// that do not exist yet (highwater makes them, unobserved). Each
    /// folder is looked at once, however many outputs it holds.
    fn note_outputs<'o>(&self, outputs: impl Iterator<Item = &'o str>, written: &RunWritten) {
        let mut folders: HashMap<String, bool> = HashMap::new();
        for output in outputs {
            let mut keys = vec![output.to_string()];
            let mut o = output;
            while let Some(i) = o.rfind('/') {
                o = &o[..i];
                let exists = *folders
                    .entry(o.to_string())
                    .or_insert_with(|| self.root.join(o).exists());
                if exists {
                    break;
                }
                keys.push(o.to_string());
            }
            written.add(keys);
        }
    }

    fn job<'a>(&'a self, st: &'a Stage, item: &'a str, o: &'a Observed) -> Job<'a> {
        let aggregate = st.template.is_aggregate();
        Job {
            root: &self.root,
            transform: &st.spec.transform,
            args: &st.args,
            input: if aggregate { None } else { Some(item) },
            // A per-item job's `{inputs}` is its one input (see `exec`).
            inputs: if aggregate { &o.inputs } else { &[] },
            relpath: o
                .found
                .binary_search_by(|f| f.item.as_str().cmp(item))
                .map_or("", |i| o.found[i].relpath()),
            // verify compares bytes only; what the command reads is not
            // recorded from a scratch run.
            observe: false,
            on_write: None,
            reports_reads: false,
        }
    }

    /// The relpath of `item` as discovered, or "".
    fn relpath_of<'o>(&self, o: &'o Observed, item: &str) -> &'o str {
        o.found
            .binary_search_by(|f| f.item.as_str().cmp(item))
            .map_or("", |i| o.found[i].relpath())
    }

    /// Makes one item's output durable and visible, or says why not.
    fn make_item(
        &self,
        st: &Stage,
        c: &Change,
        o: &Observed,
        on_write: Option<highwater_observe::OnWrite>,
    ) -> Result<exec::Seen, String> {
        let relpath = o
            .found
            .binary_search_by(|f| f.item.as_str().cmp(&c.item))
            .map_or("", |i| o.found[i].relpath());
        self.produce(
            st,
            &c.item,
            &c.output,
            relpath,
            &o.inputs,
            &mut || Ok(true),
            on_write,
        )
        .map(Option::flatten)
    }

    /// Runs the transform of one item and publishes its output, when
    /// `still_ours()` says so just before (a shared run asks its claim).
    /// `Ok(None)`: not published, since it was no longer ours.
    ///
    /// An input in object storage is downloaded into a scratch folder
    /// first, keeping its file name; an output bound for object storage is
    /// written there and uploaded to its key (S3 has no rename: the one PUT,
    /// or the completion of a multipart upload, is the publish).
    #[allow(clippy::too_many_arguments)]
    fn produce(
        &self,
        st: &Stage,
        item: &str,
        output: &str,
        relpath: &str,
        inputs: &[String],
        still_ours: &mut dyn FnMut() -> Result<bool, String>,
        on_write: Option<highwater_observe::OnWrite>,
    ) -> Result<Option<exec::Seen>, String> {
        let aggregate = st.template.is_aggregate();
        let scratch = if st.input_place.is_some() || st.output_place.is_some() {
            Some(exec::Scratch::new().map_err(|e| format!("cannot make a scratch folder: {e}"))?)
        } else {
            None
        };
        // A stage over windows (issue 49): `{files}` are the item's
        // current data files, found as it runs.
        let files = match &st.items {
            Some(src) => Some(src.files(relpath)?),
            None => None,
        };
        let input: Option<String> = match (&st.input_place, aggregate) {
            _ if files.is_some() => None,
            (_, true) => None,
            (None, false) => Some(item.to_string()),
            (Some(place), false) => {
                let key = &item[place.len() + 1..];
                let local = scratch.as_ref().expect("made for a remote input").file(key);
                self.objects(&st.spec.name, place)
                    .map_err(|e| e.to_string())?
                    .get_to(key, &local)
                    .map_err(|e| e.to_string())?;
                Some(local.to_string_lossy().into_owned())
            }
        };
        let job = Job {
            root: &self.root,
            transform: &st.spec.transform,
            args: &st.args,
            input: input.as_deref(),
            // A per-item job's `{inputs}` is its one input (see `exec`).
            inputs: match &files {
                Some(f) => f,
                None if aggregate => inputs,
                None => &[],
            },
            relpath,
            observe: st.observes(),
            on_write,
            reports_reads: st.reports_reads(),
        };
        let seen;
        match &st.output_place {
            None => {
                let final_path = self.root.join(output);
                let temp = exec::temp_path_for(&final_path);
                seen = exec::run_transform(&job, &temp)?;
                // Asked of the store: when it does not answer, the temp
                // output goes too (issue 20), not at the next plan.
                match still_ours() {
                    Ok(true) => {}
                    Ok(false) => {
                        exec::remove_temp(&temp);
                        return Ok(None);
                    }
                    Err(e) => {
                        exec::remove_temp(&temp);
                        return Err(e);
                    }
                }
                exec::publish(&temp, &final_path).map_err(|e| {
                    exec::remove_temp(&temp);
                    format!("cannot publish {}: {e}", final_path.display())
                })?;
            }
            Some(place) => {
                let key = &output[place.len() + 1..];
                let temp = scratch
                    .as_ref()
                    .expect("made for a remote output")
                    .output(key);
                seen = exec::run_transform(&job, &temp)?;
                if !still_ours()? {
                    return Ok(None);
                }
                self.objects(&st.spec.name, place)
                    .map_err(|e| e.to_string())?
                    .put_file(&temp, key)
                    .map_err(|e| format!("cannot publish {output}: {e}"))?;
            }
        }
        Ok(Some(seen))
    }

    /// Records the current inputs and their existing outputs as done,
    /// without running anything. Items whose output is missing are refused.
    pub fn adopt(&self, only: Option<&str>) -> Result<AdoptReport, FilesError> {
        let _lock = self.lock()?;
        let mut store = self.open_store()?;
        let mut report = AdoptReport::default();
        let mut batch = Batch::default();
        for st in self.select(only)? {
            let name = &st.spec.name;
            // An empty previous state: every digest is computed afresh.
            let o = self.observe(st, true, Some(StageEntries::default()))?;
            let mut a = AdoptStage {
                name: name.clone(),
                ..AdoptStage::default()
            };
            for e in &o.plan.refresh {
                batch.upserts.push((name.clone(), e.clone()));
            }
            for c in &o.plan.changed {
                let Some(obs) = &c.observation else { continue };
                if !obs.output_exists {
                    a.refused.push(ChangeRow {
                        input: c.item.clone(),
                        reason: Reason::Missing,
                        output: c.output.clone(),
                    });
                    continue;
                }
                let entry = if st.template.is_aggregate() {
                    plan::aggregate_entry(obs, &st.settings, Status::Ok, None, now_ns(), 0)
                } else {
                    plan::entry_for(obs, &st.settings, Status::Ok, None, now_ns(), 0)
                };
                batch.upserts.push((name.clone(), entry));
                // Nothing ran, so nothing was observed: a dependency set
                // from an earlier run does not describe the adopted output.
                batch.deps.push((name.clone(), c.item.clone(), None));
                a.adopted += 1;
            }
            batch.dirs.push((
                name.clone(),
                discover::record_output_dirs(&self.root, &o.output_dirs),
            ));
            report.stages.push(a);
        }
        store.commit(&batch)?;
        Ok(report)
    }

    /// Re-makes a sample of unchanged items in a scratch folder and compares
    /// them byte for byte with the published outputs. `sample == 0` means all.
    pub fn verify(&self, only: Option<&str>, sample: usize) -> Result<Vec<VerifyItem>, FilesError> {
        drop(self.open_store()?);
        let mut out = Vec::new();
        for st in self.select(only)? {
            let name = &st.spec.name;
            if st.input_place.is_some() || st.output_place.is_some() {
                return Err(FilesError::Places {
                    stage: name.clone(),
                    message: "verify re-makes outputs beside local files; it does not yet read or write object storage. Verify the stages with local inputs and outputs (--stage NAME)".into(),
                });
            }
            let o = self.observe(st, false, None)?;
            let prev = &o.prev;
            let changed: std::collections::HashSet<&str> =
                o.plan.changed.iter().map(|c| c.item.as_str()).collect();
            let mut candidates: Vec<&Entry> = prev
                .items
                .values()
                .filter(|e| e.status == Status::Ok && !changed.contains(e.item.as_str()))
                .collect();
            // A deterministic spread over the items, not the first N by name.
            candidates.sort_by_cached_key(|e| blake3::hash(e.item.as_bytes()).to_hex().to_string());
            if sample > 0 {
                candidates.truncate(sample);
            }
            let scratch = self.state_dir().join("verify").join(name);
            std::fs::create_dir_all(&scratch)
                .map_err(|e| FilesError::io("creating", &scratch, e))?;
            let items: Vec<VerifyItem> = candidates
                .par_iter()
                .enumerate()
                .map(|(n, e)| {
                    let temp = scratch
                        .join(format!("item-{n}"))
                        .join(Path::new(&e.output).file_name().unwrap_or_default());
                    // A stage over windows: the item's data files now.
                    let files = match &st.items {
                        Some(src) => src.files(self.relpath_of(&o, &e.item)).map(Some),
                        None => Ok(None),
                    };
                    let run = files.and_then(|files| {
                        let mut job = self.job(st, &e.item, &o);
                        if let Some(f) = &files {
                            job.input = None;
                            job.inputs = f;
                        }
                        exec::run_transform(&job, &temp)
                    });
                    let outcome = match run {
                        Err(error) => VerifyOutcome::Failed { error },
                        Ok(_) => compare_files(&temp, &self.root.join(&e.output)),
                    };
                    exec::remove_temp(&temp);
                    VerifyItem {
                        stage: name.clone(),
                        input: e.item.clone(),
                        output: e.output.clone(),
                        outcome,
                    }
                })
                .collect();
            let _ = std::fs::remove_dir_all(&scratch);
            out.extend(items);
        }
        // Gone when empty, so that verify leaves no trace behind.
        let _ = std::fs::remove_dir(self.state_dir().join("verify"));
        Ok(out)
    }

    /// The whole manifest as JSON.
    pub fn export(&self) -> Result<serde_json::Value, FilesError> {
        let store = self.open_store()?;
        let entries: Vec<serde_json::Value> = store
            .export()?
            .into_iter()
            .map(|(stage, e)| {
                json!({
                    "stage": stage,
                    "kind": e.kind,
                    "input": e.item,
                    "digest": e.digest,
                    "size": e.stat.size,
                    "mtime_ns": e.stat.mtime_ns,
                    "ctime_ns": e.stat.ctime_ns,
                    "ino": e.stat.ino,
                    "dev": e.stat.dev,
                    "observed_at_ns": e.observed_at_ns,
                    "recipe": e.recipe,
                    "output": e.output,
                    "status": e.status,
                    "error": e.error,
                    "processed_at": time::rfc3339_utc(e.processed_at_ns),
                    "duration_ms": e.duration_ms,
                })
            })
            .collect();
        let mut sources = Vec::new();
        for name in &self.sources {
            sources.push(json!({
                "name": name,
                "bookmark": store.bookmark(name)?.map(|b| json!({
                    "last_end": highwater_core::window::format_rfc3339(b.last_end_us),
                    "horizon": b.horizon,
                })),
                "windows": store.windows(name)?,
            }));
        }
        Ok(json!({
            "schema_version": store.schema_version()?,
            "entries": entries,
            "sources": sources,
        }))
    }

    /// Per stage: the last run, the entry counts, the failures. Stages this
    /// config does not declare but that ran on the same state (a Python
    /// pipeline's, issue 22) follow, with where they were declared.
    pub fn status(&self) -> Result<serde_json::Value, FilesError> {
        let mut store = self.open_store()?;
        let runs = store.last_runs()?;
        let mut stages = Vec::new();
        let fleet = self.fleet_status(store.as_mut())?;
        let stage_json = |store: &dyn StateStore,
                          name: &str,
                          recipe: Option<String>,
                          declared_in: &str|
         -> Result<serde_json::Value, FilesError> {
            let entries = store.load(name)?;
            let failed: Vec<serde_json::Value> = entries
                .items
                .values()
                .filter(|e| e.status == Status::Failed)
                .map(|e| json!({"input": e.item, "error": e.error}))
                .collect();
            let last = runs.iter().find(|r| r.stage == name).map(|r| {
                json!({
                    "started_at": time::rfc3339_utc(r.started_at_ns),
                    "finished_at": r.finished_at_ns.map(time::rfc3339_utc),
                    "exit_code": r.exit_code,
                    "summary": r.summary,
                })
            });
            // A stage declared elsewhere: its recipe is the one its entries
            // were last made under (the newest entry's).
            let recipe = recipe.or_else(|| {
                entries
                    .items
                    .values()
                    .max_by_key(|e| e.processed_at_ns)
                    .map(|e| e.recipe.clone())
            });
            Ok(json!({
                "name": name,
                "recipe": recipe,
                "declared_in": declared_in,
                "entries": entries.items.len(),
                "ok": entries.items.len() - failed.len(),
                "failed": failed,
                // Items the last run held back (issue 49), as it said.
                "held": runs
                    .iter()
                    .find(|r| r.stage == name)
                    .and_then(|r| r.summary["held"].as_array().cloned())
                    .unwrap_or_default(),
                "last_run": last,
            }))
        };
        for st in &self.stages {
            stages.push(stage_json(
                store.as_ref(),
                &st.spec.name,
                Some(st.settings.recipe.clone()),
                &st.spec.declared_in,
            )?);
        }
        for r in &runs {
            if self.stages.iter().any(|s| s.spec.name == r.stage) {
                continue;
            }
            // Runs recorded before `declared_in` was: say so, not guess.
            let declared_in = r.summary["declared_in"].as_str().unwrap_or("unknown");
            stages.push(stage_json(store.as_ref(), &r.stage, None, declared_in)?);
        }
        let mut sources = Vec::new();
        for name in &self.sources {
            let windows = store.windows(name)?;
            let count = |st: highwater_store::WindowStatus| {
                windows.iter().filter(|w| w.status == st).count()
            };
            sources.push(json!({
                "name": name,
                "bookmark": store.bookmark(name)?.map(|b| highwater_core::window::format_rfc3339(b.last_end_us)),
                "published": count(highwater_store::WindowStatus::Published),
                "failed": count(highwater_store::WindowStatus::Failed),
                "running": count(highwater_store::WindowStatus::Running),
            }));
        }
        let mut v = json!({ "stages": stages, "sources": sources });
        if let Some(f) = fleet {
            v["fleet"] = f;
        }
        Ok(v)
    }

    /// On shared state: every process that registered (host, pid, command,
    /// heartbeat age, items claimed, done, taken over, fenced, held now),
    /// every lease and its holder, and each stage's queue.
    fn fleet_status(
        &self,
        store: &mut dyn StateStore,
    ) -> Result<Option<serde_json::Value>, FilesError> {
        let leases = store.leases("")?;
        let Some(q) = store.as_queue() else {
            return Ok(None);
        };
        let procs = q.fleet()?;
        let now = procs.first().map_or_else(now_ns, |p| p.now_ns);
        let lease_ns = (self.fleet.lease_duration_s as i64).saturating_mul(1_000_000_000);
        let processes: Vec<serde_json::Value> = procs
            .iter()
            .map(|p| {
                let age_ms = (now - p.heartbeat_at_ns) / 1_000_000;
                json!({
                    "owner": p.owner,
                    "host": p.host,
                    "pid": p.pid,
                    "command": p.command,
                    "started_at": time::rfc3339_utc(p.started_at_ns),
                    "finished_at": p.finished_at_ns.map(time::rfc3339_utc),
                    "heartbeat_age_ms": age_ms,
                    "state": if p.finished_at_ns.is_some() {
                        "finished"
                    } else if age_ms * 1_000_000 > lease_ns {
                        "silent"
                    } else {
                        "alive"
                    },
                    "claimed": p.claimed,
                    "done": p.done,
                    "takeovers": p.takeovers,
                    "fenced": p.fenced,
                    "holding": p.holding,
                })
            })
            .collect();
        let mut queues = serde_json::Map::new();
        let names: Vec<String> = self
            .stages
            .iter()
            .map(|s| s.spec.name.clone())
            .chain(self.sources.iter().map(|s| format!("ingest:{s}")))
            .collect();
        for n in names {
            queues.insert(
                n.clone(),
                serde_json::to_value(q.pending(&n)?).unwrap_or_default(),
            );
        }
        let leases: Vec<serde_json::Value> = leases
            .iter()
            .map(|l| {
                json!({
                    "name": l.name,
                    "owner": l.owner,
                    "host": l.host,
                    "pid": l.pid,
                    "token": l.token,
                    "live": l.expires_at_ns > now_ns(),
                    "expires_at": time::rfc3339_utc(l.expires_at_ns),
                })
            })
            .collect();
        Ok(Some(json!({
            "processes": processes,
            "leases": leases,
            "queues": queues,
        })))
    }
}

/// Whether commands can be observed here, asked once per process: a
/// container without ptrace refuses the run (exit 2, the fix named)
/// before any item is touched, rather than running it unobserved.
pub(crate) fn observe_available(stage: &str) -> Result<(), FilesError> {
    static PROBE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    PROBE
        .get_or_init(|| highwater_observe::probe().map_err(|e| e.to_string()))
        .clone()
        .map_err(|message| FilesError::Observe {
            stage: stage.to_string(),
            message,
        })
}

/// Drops `v` on a thread of its own: what a plan read (a million entries,
/// inputs and names are a tenth of a no-change plan's time to free, issue
/// 24) is not freed on the way to its answer. A CLI process exits before
/// that thread is done, and the system takes the memory back at once.
fn drop_elsewhere<T: Send + 'static>(v: T) {
    // No thread to be had (a limit on threads): the closure, and `v` with
    // it, is dropped here, as before.
    let _ = std::thread::Builder::new()
        .name("hw-drop".into())
        .spawn(move || drop(v));
}

fn compare_files(a: &Path, b: &Path) -> VerifyOutcome {
    let (x, y) = match (std::fs::read(a), std::fs::read(b)) {
        (Ok(x), Ok(y)) => (x, y),
        (_, Err(e)) => {
            return VerifyOutcome::Failed {
                error: format!("cannot read published output {}: {e}", b.display()),
            }
        }
        (Err(e), _) => {
            return VerifyOutcome::Failed {
                error: format!("cannot read scratch output: {e}"),
            }
        }
    };
    match x.iter().zip(y.iter()).position(|(p, q)| p != q) {
        Some(i) => VerifyOutcome::Differs {
            first_difference_at: i as u64,
        },
        None if x.len() != y.len() => VerifyOutcome::Differs {
            first_difference_at: x.len().min(y.len()) as u64,
        },
        None => VerifyOutcome::Same,
    }
}

/// Orders stages so that a stage whose inputs lie under another stage's
/// output root runs after it. Ties are broken by name, so the order is
/// deterministic.
fn topo_order(stages: Vec<Stage>) -> Result<Vec<Stage>, FilesError> {
    let n = stages.len();
    // A place's paths are prefixed with its name, so that only paths of
    // one place compare.
    let prefix = |p: &Option<String>| p.as_ref().map_or(String::new(), |p| format!("{p}:"));
    let bases: Vec<Vec<String>> = stages
        .iter()
        .map(|s| {
            s.input_globs
                .iter()
                .map(|g| prefix(&s.input_place) + &glob_literal_dir(g))
                .collect()
        })
        .collect();
    // deps[b] holds a when b reads what a writes.
    let mut deps: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (a, sa) in stages.iter().enumerate() {
        let out_root = &(prefix(&sa.output_place) + sa.template.root());
        for b in 0..n {
            if a != b
                && bases[b]
                    .iter()
                    .any(|base| is_within(base, out_root) || is_within(out_root, base))
            {
                deps[b].push(a);
            }
        }
    }
    let names: Vec<String> = stages.iter().map(|s| s.spec.name.clone()).collect();
    let mut stages = stages;
    for (b, st) in stages.iter_mut().enumerate() {
        st.upstream = deps[b].iter().map(|&a| names[a].clone()).collect();
    }
    let mut order = Vec::with_capacity(n);
    let mut done = vec![false; n];
    while order.len() < n {
        let mut ready: Vec<usize> = (0..n)
            .filter(|&i| !done[i] && deps[i].iter().all(|&d| done[d]))
            .collect();
        if ready.is_empty() {
            let stuck: Vec<&str> = (0..n)
                .filter(|&i| !done[i])
                .map(|i| stages[i].spec.name.as_str())
                .collect();
            return Err(FilesError::Cycle {
                stages: stuck.join(" -> "),
            });
        }
        ready.sort_by(|&x, &y| stages[x].spec.name.cmp(&stages[y].spec.name));
        let pick = ready[0];
        done[pick] = true;
        order.push(pick);
    }
    let mut slots: Vec<Option<Stage>> = stages.into_iter().map(Some).collect();
    Ok(order
        .into_iter()
        .map(|i| slots[i].take().expect("each stage ordered once"))
        .collect())
}

/// The literal folder of a glob (before its first wildcard).
fn glob_literal_dir(g: &str) -> String {
    let norm = normalize_lexically(g);
    let cut = norm.find(['*', '?', '[', '{']).unwrap_or(norm.len());
    let lit = &norm[..cut];
    match lit.rfind('/') {
        Some(i) => lit[..i].to_string(),
        None => String::new(),
    }
}

/// `e`, stopped after work was recorded: exit 1 (`Unfinished`), naming
/// what was done (`parts`), the stages not started and what to do. The
/// reason reads the whole cause chain, lowest cause included.
fn unfinished(
    e: FilesError,
    stage: &str,
    mut parts: Vec<String>,
    later: &[&Stage],
    advice: &str,
) -> FilesError {
    if !later.is_empty() {
        parts.push(format!(
            "stages not started: {}",
            later
                .iter()
                .map(|s| format!("`{}`", s.spec.name))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let mut reason = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        let c_text = c.to_string();
        if !reason.contains(&c_text) {
            reason = format!("{reason}: {c_text}");
        }
        cause = c.source();
    }
    FilesError::Unfinished {
        stage: stage.to_string(),
        reason,
        unfinished: parts.join("; "),
        advice: advice.to_string(),
        source: Box::new(e),
    }
}

/// A list of names seen through a key function, for [`first_common`].
struct Names<'a, T>(&'a [T], fn(&T) -> &str);

impl<T> Clone for Names<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Names<'_, T> {}

impl<'a, T> Names<'a, T> {
    fn get(&self, i: usize) -> &'a str {
        (self.1)(&self.0[i])
    }

    fn strictly_rising(&self) -> bool {
        (1..self.0.len()).all(|i| self.get(i - 1) < self.get(i))
    }
}

/// The index in `a` of the first name that `b` holds too. Names nearly
/// always come sorted (found inputs are; outputs and recorded outputs are
/// when the template keeps the inputs' order), and then this is one merge
/// of the two lists; otherwise one hash set of `b`. At a million items
/// the two hash sets this replaced were a tenth of a no-change plan
/// (issue 24).
fn first_common<T, U>(a: Names<'_, T>, b: Names<'_, U>) -> Option<usize> {
    let (n, m) = (a.0.len(), b.0.len());
    if n == 0 || m == 0 {
        return None;
    }
    let a_sorted = (1..n).all(|i| a.get(i - 1) <= a.get(i));
    if a_sorted && (1..m).all(|j| b.get(j - 1) <= b.get(j)) {
        let mut j = 0;
        for i in 0..n {
            let x = a.get(i);
            while j < m && b.get(j) < x {
                j += 1;
            }
            if j == m {
                return None;
            }
            if b.get(j) == x {
                return Some(i);
            }
        }
        return None;
    }
    let set: rustc_hash::FxHashSet<&str> = (0..m).map(|j| b.get(j)).collect();
    (0..n).find(|&i| set.contains(a.get(i)))
}

/// The entry of each found input, in `found`'s order: one merge of two
/// lists sorted by item (`find_inputs` sorts; `Entries` is sorted).
fn merge_sorted<'a>(found: &[Found], entries: &'a Entries) -> Vec<Option<&'a Entry>> {
    let mut out = Vec::with_capacity(found.len());
    let mut it = entries.values().peekable();
    for f in found {
        while it.next_if(|e| e.item.as_str() < f.item.as_str()).is_some() {}
        out.push(it.next_if(|e| e.item == f.item));
    }
    // Unsorted input would make entries look missing, that is new work:
    // never stale, but wrong; checked in tests.
    debug_assert!(found.windows(2).all(|w| w[0].item <= w[1].item));
    out
}
