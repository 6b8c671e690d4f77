//! Declarations: what a pipeline is made of, independent of where it was read
//! from. `highwater.toml` is parsed into these, and a Rust program can build
//! them directly with a closure as the transform.

use highwater_core::Signal;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A closure transform: writes `ctx.output` from `ctx.input`, or says why not.
pub type ClosureFn = dyn Fn(&ItemContext<'_>) -> Result<(), String> + Send + Sync;

/// What a stage does to an item.
#[derive(Clone)]
pub enum Transform {
    /// An argv; placeholders are expanded per argument and no shell is
    /// involved, so file names can hold spaces, quotes, `;` or newlines.
    Command(Vec<String>),
    /// A Rust closure. Its code is not hashed: bump `recipe.version` when it
    /// changes, or the outputs go stale.
    Closure(Arc<ClosureFn>),
}

impl fmt::Debug for Transform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transform::Command(argv) => f.debug_tuple("Command").field(argv).finish(),
            Transform::Closure(_) => f.write_str("Closure(..)"),
        }
    }
}

/// What a closure transform is given for one item.
pub struct ItemContext<'a> {
    /// The input, absolute. `None` for an aggregate.
    pub input: Option<&'a Path>,
    /// All inputs of an aggregate, absolute and sorted; the one input otherwise.
    pub inputs: &'a [PathBuf],
    /// Where to write: a temp path that highwater renames into place on success.
    pub output: &'a Path,
    /// The input's path relative to its glob's base folder.
    pub relpath: &'a str,
    /// Where a closure that sees its own reads reports them (issue 48: a
    /// Python stage's worker, by audit hooks): `read` and `written` as a
    /// command's observation would hold them, `started_ns` when the item
    /// started. Recorded as the item's dependencies when the stage says
    /// `reports_reads`; ignored otherwise.
    pub reads: &'a std::sync::Mutex<Option<highwater_observe::Observation>>,
}

/// What happens to an output when its input disappears.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnDelete {
    #[default]
    Remove,
    Keep,
}

/// Everything but the input that shapes the output.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecipeSpec {
    pub version: String,
    /// Code files, relative to the config folder; their contents are hashed.
    pub files: Vec<String>,
    /// Tool-version commands (split on whitespace, no shell); their output
    /// is hashed.
    pub tools: Vec<String>,
    pub config: serde_json::Value,
}

/// One stage.
#[derive(Clone, Debug)]
pub struct StageSpec {
    pub name: String,
    /// Globs relative to the config folder.
    pub inputs: Vec<String>,
    /// The output template.
    pub output: String,
    pub transform: Transform,
    pub signal: Signal,
    /// The share of changed items above which a run needs `--force`.
    pub guard: f64,
    /// The guard never fires for fewer redone items than this: it protects
    /// against mass rebuilds, and a handful of items is not one.
    pub guard_items_min: usize,
    pub on_delete: OnDelete,
    /// Always read every byte, never trust the stat cache (network filesystems).
    pub rehash: bool,
    /// Timestamps within this many milliseconds of the moment they were
    /// observed are not trusted (coarse filesystems, racy records).
    pub mtime_margin_ms: u64,
    pub recipe: RecipeSpec,
    /// Run the command observed and record what it reads as the item's
    /// dependencies (issue 24). Closures are never observed.
    pub observe: bool,
    /// Globs of paths that are never dependencies (absolute, or relative to
    /// the config folder), e.g. `/usr/share/zoneinfo/**`.
    pub observe_ignore: Vec<String>,
    /// Whether the default noise rules apply (`deps::CACHE_PATHS`,
    /// `deps::DROPPINGS`): caches of other dependencies and editor and OS
    /// droppings are never dependencies.
    pub observe_ignore_defaults: bool,
    /// Set when the stage's items are not files from globs but another
    /// kind of input (issue 49: a source's landed windows); `inputs` is
    /// then empty.
    pub items: Option<crate::inputs::InputsSpec>,
    /// Where the stage was declared ("highwater.toml", "python:pipeline.py"):
    /// recorded with each run, so that `status` and `serve` can show a stage
    /// that another program declared and ran on the same state (issue 22).
    pub declared_in: String,
    /// A closure transform that reports what it read through
    /// `ItemContext::reads` (a Python stage, issue 48): those reads are
    /// the item's dependencies, with the same evidence, racy rule and
    /// noise rules as an observed command's.
    pub reports_reads: bool,
    /// How an input whose bytes changed is compared (issue 49): by bytes,
    /// or read as data by its format.
    pub compare: crate::compare::CompareSpec,
}

impl StageSpec {
    /// A stage with defaults: hash signal, guard 0.5, outputs removed with
    /// their inputs.
    pub fn new(name: &str, inputs: &[&str], output: &str, transform: Transform) -> StageSpec {
        StageSpec {
            name: name.to_string(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            output: output.to_string(),
            transform,
            signal: Signal::Hash,
            guard: 0.5,
            guard_items_min: 10,
            on_delete: OnDelete::Remove,
            rehash: false,
            mtime_margin_ms: 1000,
            recipe: RecipeSpec::default(),
            observe: true,
            observe_ignore: Vec::new(),
            observe_ignore_defaults: true,
            items: None,
            declared_in: "highwater.toml".to_string(),
            reports_reads: false,
            compare: Default::default(),
        }
    }

    /// A stage whose transform is a closure.
    pub fn closure<F>(name: &str, inputs: &[&str], output: &str, f: F) -> StageSpec
    where
        F: Fn(&ItemContext<'_>) -> Result<(), String> + Send + Sync + 'static,
    {
        StageSpec::new(name, inputs, output, Transform::Closure(Arc::new(f)))
    }
}

/// `[state]` limits of a shared (PostgreSQL) state.
#[derive(Clone, Debug)]
pub struct FleetSettings {
    /// How long a claim (and the plan lease) lives without a heartbeat.
    pub lease_duration_s: u64,
    /// Items a process claims at a time.
    pub claim_batch_max: usize,
}

impl Default for FleetSettings {
    fn default() -> Self {
        FleetSettings {
            lease_duration_s: 30,
            claim_batch_max: 16,
        }
    }
}

/// A pipeline: its stages, where its state lives, and the other places it names.
#[derive(Clone, Debug)]
pub struct PipelineSpec {
    /// The folder that relative paths are relative to (the config's folder).
    pub root: PathBuf,
    /// The SQLite state file, relative to `root` unless absolute.
    pub state: PathBuf,
    /// `[state] url_env`: the variable holding a postgres:// URL. Set: the
    /// state is shared in PostgreSQL and runs claim work from its queue.
    pub state_url_env: Option<String>,
    pub fleet: FleetSettings,
    /// `[storage.NAME]`: object stores that stages name as `NAME:path`.
    pub storage: std::collections::BTreeMap<String, highwater_objects::StorageSpec>,
    pub stages: Vec<StageSpec>,
    /// `[sources.NAME]` tables, left raw: `highwater-ingest` reads them.
    pub sources: std::collections::BTreeMap<String, toml::Value>,
    /// The `[osm]` table, left raw: `highwater-osm` reads it.
    pub osm: Option<toml::Value>,
    /// What item sources other than globs read through (issue 49: the
    /// landed windows of `[sources]`, which the binary provides).
    pub providers: crate::inputs::Providers,
    /// Other places the config names (the config file itself, the OSM
    /// store, MBTiles files, search indexes), each with what it is: no two
    /// places, and no place and an output root, may overlap.
    pub places: Vec<(String, PathBuf)>,
}

impl PipelineSpec {
    pub fn new(root: impl Into<PathBuf>) -> PipelineSpec {
        PipelineSpec {
            root: root.into(),
            state: PathBuf::from(".highwater/state.db"),
            state_url_env: None,
            fleet: FleetSettings::default(),
            storage: Default::default(),
            stages: Vec::new(),
            sources: Default::default(),
            osm: None,
            providers: Default::default(),
            places: Vec::new(),
        }
    }

    pub fn stage(mut self, s: StageSpec) -> PipelineSpec {
        self.stages.push(s);
        self
    }
}
