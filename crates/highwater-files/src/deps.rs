//! Observed dependencies (issue 24): what an item's command was seen to
//! read, execute, look up absent or list, recorded with evidence like an
//! input's, and checked at plan time.
//!
//! A dependency set is a sorted list of [`Dep`]s serialised to canonical
//! JSON; its id is a BLAKE3 of that text. Most items of a stage share one
//! set, so the store keeps each distinct set once and each item names its
//! set by id. A plan checks each distinct dependency once, whatever the
//! number of items or sets that name it.
//!
//! Paths inside the project root are recorded relative to it (moving the
//! project changes nothing); paths outside it are absolute. Never
//! dependencies: /proc, /sys, /dev; the item's declared inputs and its own
//! output; anything the run wrote (the item's command, another item's
//! command, or highwater itself: outputs, the folders it created for them,
//! temp folders, `__pycache__`), each path itself and not what lies under
//! it; the state folder; `.git`; `observe_ignore` globs. Absent paths and
//! listings count inside the project root only: outside it, an interpreter
//! probes hundreds of absent paths and lists folders such as /tmp that
//! change all the time.

use crate::discover::TEMP_MARK;
use crate::hash::blake3_file;
use highwater_core::evidence::is_racy;
use highwater_core::Stat;
use highwater_observe::Observation;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Files that are caches of other dependencies, never dependencies
/// themselves by default (`observe_ignore_defaults`): `ldconfig` rewrites
/// the loader's cache on every package install, while the libraries it
/// indexes, which the loader maps, are recorded on their own.
pub const CACHE_PATHS: &[&str] = &["/etc/ld.so.cache"];

/// Editor and OS droppings, by file name: swap, backup, lock and autosave
/// files and folder metadata, which no command reads on purpose; never
/// dependencies and never names in a listing by default
/// (`observe_ignore_defaults`), so a `.x.swp` beside the sources re-runs
/// nothing.
pub const DROPPINGS: &[&str] = &[
    ".*.sw?",      // vim swap (.x.swp, .x.swo, ...)
    "*~",          // vim, emacs and nano backups
    ".#*",         // emacs lock links
    "#*#",         // emacs autosave
    "4913",        // vim's probe of a folder's writability
    ".~lock.*#",   // LibreOffice locks
    ".DS_Store",   // macOS folder metadata
    "._*",         // macOS resource forks on foreign filesystems
    "Thumbs.db",   // Windows thumbnails
    "desktop.ini", // Windows folder settings
];

/// Names of a changed listing a plan shows (`dependency . (+a, -b)`).
pub const LISTING_NAMES_SHOWN_MAX: usize = 3;

/// One dependency of an item.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Dep {
    pub path: String,
    #[serde(flatten)]
    pub what: DepKind,
    /// The machine whose file this is: set on a fleet for a file outside
    /// the project root, which each machine has its own of (another
    /// Python). Only a plan on that machine checks it, so two machines
    /// that see different files never take turns re-running the items.
    /// `None`: inside the project (shared by the fleet), or a local run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum DepKind {
    /// A file read (or looked up and found).
    Read(FileEvidence),
    /// A program executed, or the interpreter behind a shebang.
    Exec(FileEvidence),
    /// Looked up and not found (inside the project root).
    Absent,
    /// A symbolic link whose text the command read (`readlink`), inside
    /// the project: re-pointing it changes what the command saw even when
    /// the new target's content is the same (issue 47).
    Link { target: String },
    /// A folder listed: the BLAKE3 of its sorted names, without the names
    /// the run created (kept in `excluded`, so that a plan drops them too).
    Listed {
        names: String,
        excluded: Vec<String>,
        /// The names hashed, so that a plan can say which appeared or went
        /// (`dependency . (+notes.txt)`). Empty in sets recorded before.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        list: Vec<String>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FileEvidence {
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub ino: u64,
    pub dev: u64,
    pub observed_at_ns: i64,
    /// `blake3:HEX`, the authority when the stat differs or is racy.
    pub digest: String,
}

impl FileEvidence {
    fn stat(&self) -> Stat {
        Stat {
            size: self.size,
            mtime_ns: self.mtime_ns,
            ctime_ns: self.ctime_ns,
            ino: self.ino,
            dev: self.dev,
        }
    }
}

impl DepKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            DepKind::Read(_) => "read",
            DepKind::Exec(_) => "exec",
            DepKind::Absent => "absent",
            DepKind::Listed { .. } => "listed",
            DepKind::Link { .. } => "link",
        }
    }
}

/// A set's canonical text and its id.
pub fn encode(set: &[Dep]) -> (String, String) {
    let body = serde_json::to_string(set).expect("deps serialise");
    let id = blake3::hash(body.as_bytes()).to_hex()[..32].to_string();
    (id, body)
}

pub fn decode(body: &str) -> Result<Vec<Dep>, String> {
    serde_json::from_str(body).map_err(|e| format!("dependency set is corrupt: {e}"))
}

/// What a stage's recording needs: the root in both spellings (as
/// configured and canonical, since the tracee reports canonical paths), the
/// state folder and the ignore globs.
pub struct Scope {
    keyer: Keyer,
    state_rel: Option<String>,
    ignore: globset::GlobSet,
    /// This machine's name: what a dependency recorded with a host is
    /// checked against.
    this_host: String,
    /// Whether files outside the root are recorded with `this_host` (a
    /// fleet's shared state).
    record_host: bool,
    /// [`CACHE_PATHS`] and [`DROPPINGS`], unless the stage turned the
    /// defaults off.
    droppings: Option<globset::GlobSet>,
}

/// Turns a path into its recorded spelling; cheap to clone into a tracer.
#[derive(Clone, Debug)]
pub struct Keyer {
    root: PathBuf,
    root_canon: PathBuf,
}

impl Keyer {
    /// The path relative to the root, when inside it.
    pub fn relative(&self, p: &Path) -> Option<String> {
        let rel = p
            .strip_prefix(&self.root_canon)
            .or_else(|_| p.strip_prefix(&self.root))
            .ok()?;
        Some(if rel.as_os_str().is_empty() {
            ".".to_string()
        } else {
            rel.to_string_lossy().into_owned()
        })
    }

    /// The recorded spelling of a path.
    pub fn key(&self, p: &Path) -> String {
        self.relative(p)
            .unwrap_or_else(|| p.to_string_lossy().into_owned())
    }
}

impl Scope {
    pub fn new(root: &Path, state_dir: &Path, ignore: &[String]) -> Scope {
        let mut b = globset::GlobSetBuilder::new();
        for g in ignore {
            // Checked by the config loader; a closure-built spec may pass
            // anything, and a bad glob then ignores nothing.
            if let Ok(g) = globset::Glob::new(g) {
                b.add(g);
            }
        }
        let root_canon = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
        let mut s = Scope {
            keyer: Keyer {
                root: root.to_path_buf(),
                root_canon,
            },
            state_rel: None,
            ignore: b.build().unwrap_or_else(|_| globset::GlobSet::empty()),
            this_host: highwater_store::lease::host(),
            record_host: false,
            droppings: Some(droppings()),
        };
        let state_abs = state_dir
            .canonicalize()
            .unwrap_or_else(|_| state_dir.to_path_buf());
        s.state_rel = s.relative(&state_abs);
        s
    }

    /// With `on = false`, [`CACHE_PATHS`] and [`DROPPINGS`] count like any
    /// other path (`observe_ignore_defaults = false`).
    pub fn with_defaults(mut self, on: bool) -> Scope {
        if !on {
            self.droppings = None;
        }
        self
    }

    /// Whether `name` (a file name) is an editor or OS dropping that does
    /// not count.
    pub fn is_dropping(&self, name: &str) -> bool {
        self.droppings.as_ref().is_some_and(|d| d.is_match(name))
    }

    /// Records files outside the root as this machine's (a fleet).
    pub fn on_fleet(mut self) -> Scope {
        self.record_host = true;
        self
    }

    /// Whether a plan here can check `d`: not when another machine
    /// recorded it (its own file outside the project).
    pub fn checkable(&self, d: &Dep) -> bool {
        d.host.as_ref().is_none_or(|h| *h == self.this_host)
    }

    pub fn keyer(&self) -> Keyer {
        self.keyer.clone()
    }

    /// The path relative to the root, when inside it.
    pub fn relative(&self, p: &Path) -> Option<String> {
        self.keyer.relative(p)
    }

    /// The recorded spelling of a path.
    pub fn key(&self, p: &Path) -> String {
        self.keyer.key(p)
    }

    /// The path to stat for a recorded spelling.
    pub fn abs(&self, key: &str) -> PathBuf {
        if key.starts_with('/') {
            PathBuf::from(key)
        } else if key == "." {
            self.keyer.root.clone()
        } else {
            self.keyer.root.join(key)
        }
    }

    fn never(&self, key: &str) -> bool {
        // /dev/shm is a shared-memory filesystem holding ordinary files
        // (issue 47): one another process wrote there is read like any
        // other (those the run made, semaphores included, are its own
        // writes and excluded as such).
        let shm = key.starts_with("/dev/shm/");
        if !shm
            && ["/proc", "/sys", "/dev"]
                .iter()
                .any(|p| key == *p || key.starts_with(&format!("{p}/")))
        {
            return true;
        }
        // git's own folder: a `git describe` in a command reads
        // `.git/index`, which git itself rewrites (its stat cache), so the
        // item would re-run after every git command.
        if key == ".git" || key.starts_with(".git/") {
            return true;
        }
        if self.droppings.is_some()
            && (CACHE_PATHS.contains(&key)
                || self.is_dropping(key.rsplit('/').next().unwrap_or(key)))
        {
            return true;
        }
        if key.split('/').any(|c| c.contains(TEMP_MARK)) {
            return true;
        }
        // A scratch folder holds the item's input downloaded from object
        // storage and its output bound there; highwater makes and removes
        // it around the command, so a read there is the declared input
        // (recorded as gone, it would re-run every item at every plan).
        // (The temp folder may lie inside the project: `TMPDIR`.)
        let tmp = std::env::temp_dir();
        if let Ok(rest) = self.abs(key).strip_prefix(&tmp) {
            if rest
                .components()
                .next()
                .and_then(|c| c.as_os_str().to_str())
                .is_some_and(|c| c.starts_with(crate::exec::SCRATCH_PREFIX))
            {
                return true;
            }
        }
        if let Some(s) = &self.state_rel {
            if key == s || key.starts_with(&format!("{s}/")) {
                return true;
            }
        }
        self.ignore.is_match(key)
    }
}

/// Paths the current run wrote, by any item's command or by highwater,
/// in recorded spelling, each file or folder itself: a folder the run
/// created does not hide what is inside it (another stage's output, a
/// table beside an output folder), only its own name in a listing. Shared by the run's workers and their tracers,
/// which add each path as they see the write coming: an item recorded
/// while another is still running already knows that item's temp files.
#[derive(Default, Clone)]
pub struct RunWritten(Arc<Mutex<HashSet<String>>>);

impl RunWritten {
    pub fn add(&self, keys: impl IntoIterator<Item = String>) {
        self.0.lock().expect("not poisoned").extend(keys);
    }

    /// `f` over the paths written so far, under the lock: never a copy of
    /// the set, which holds every output of the run (a copy per item made
    /// an observed run quadratic: 100,000 `cp` items took 22 minutes).
    fn with<R>(&self, f: impl FnOnce(&HashSet<String>) -> R) -> R {
        f(&self.0.lock().expect("not poisoned"))
    }

    /// The tracer's callback for [`highwater_observe::output_with`].
    pub fn sink(&self, keyer: Keyer) -> highwater_observe::OnWrite {
        let set = self.0.clone();
        Arc::new(move |p: &Path| {
            set.lock().expect("not poisoned").insert(keyer.key(p));
        })
    }
}

/// The evidence of a dependency that cannot be trusted to describe what
/// the command read: changed while it ran, or gone before it was
/// recorded. Its digest matches no file, so the next plan sees it changed.
const RACY: &str = "racy: changed while the command ran";
const GONE: &str = "gone: removed before it was recorded";

/// Evidence taken during one run (or recorded before it and not racy),
/// reused while a file's stat is unchanged: 400 items importing the same
/// 100 stdlib modules hash each module once, and, since they then record
/// the very same evidence, share one dependency set.
#[derive(Default)]
pub struct DigestCache(Mutex<HashMap<String, FileEvidence>>);

impl DigestCache {
    /// Seeds the cache with the evidence of earlier sets that the stat
    /// cache would trust (not racy): items re-run later then share their
    /// set with the items that did not re-run.
    pub fn seed(&self, scope: &Scope, sets: &[Vec<Dep>], granularity_ns: i64) {
        let mut m = self.0.lock().expect("not poisoned");
        for set in sets {
            // Another machine's file describes nothing here.
            for d in set.iter().filter(|d| scope.checkable(d)) {
                if let DepKind::Read(ev) | DepKind::Exec(ev) = &d.what {
                    // Racy and gone records stand for no content: seeded,
                    // they would be recorded again by the re-run, forever.
                    let real = ev.digest != RACY && ev.digest != GONE;
                    if real && !is_racy(ev.mtime_ns, ev.observed_at_ns, granularity_ns) {
                        m.entry(d.path.clone()).or_insert_with(|| ev.clone());
                    }
                }
            }
        }
    }
}

fn stat_of(p: &Path) -> std::io::Result<(Stat, bool)> {
    crate::stat::stat_path(p)
}

fn evidence(cache: &DigestCache, key: &str, abs: &Path) -> Option<FileEvidence> {
    let observed_at_ns = crate::now_ns();
    let (stat, is_file) = stat_of(abs).ok()?;
    if !is_file {
        return None;
    }
    let cached = cache
        .0
        .lock()
        .expect("not poisoned")
        .get(key)
        .filter(|ev| ev.stat() == stat)
        .cloned();
    if let Some(ev) = cached {
        return Some(ev);
    }
    let ev = FileEvidence {
        size: stat.size,
        mtime_ns: stat.mtime_ns,
        ctime_ns: stat.ctime_ns,
        ino: stat.ino,
        dev: stat.dev,
        observed_at_ns,
        digest: blake3_file(abs).ok()?.to_string(),
    };
    // Two workers may have taken the same file at once: the first one
    // recorded wins, so that both items record the same evidence (and
    // share one set).
    let mut m = cache.0.lock().expect("not poisoned");
    match m.get(key) {
        Some(first) if first.stat() == stat => Some(first.clone()),
        _ => {
            m.insert(key.to_string(), ev.clone());
            Some(ev)
        }
    }
}

/// The globs of [`DROPPINGS`].
fn droppings() -> globset::GlobSet {
    let mut b = globset::GlobSetBuilder::new();
    for g in DROPPINGS {
        b.add(globset::Glob::new(g).expect("a fixed glob"));
    }
    b.build().expect("fixed globs")
}

/// The sorted names of a folder, without temp names and droppings.
fn list_names(abs: &Path, scope: &Scope) -> Option<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(abs)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.contains(TEMP_MARK) && !scope.is_dropping(n))
        .collect();
    names.sort_unstable();
    Some(names)
}

fn hash_names(names: &[String]) -> String {
    let mut h = blake3::Hasher::new();
    for n in names {
        h.update(n.as_bytes());
        h.update(b"\0");
    }
    h.finalize().to_hex().to_string()
}

/// The names of a folder, minus temp names and `excluded`, hashed.
fn listing_hash(abs: &Path, excluded: &BTreeSet<String>, scope: &Scope) -> Option<String> {
    let names: Vec<String> = list_names(abs, scope)?
        .into_iter()
        .filter(|n| !excluded.contains(n))
        .collect();
    Some(hash_names(&names))
}

/// The dependency set of one finished item. `own` are the item's declared
/// inputs and its output, in recorded spelling.
///
/// Evidence is taken now, after the command exited, so it is git's racy
/// rule that keeps it honest: a file modified (mtime or ctime) at or after
/// the command started may have been read before the change, and is
/// recorded [`RACY`]; a file read and gone since is recorded [`GONE`]; a
/// path looked up absent is recorded absent even if it exists now. Each
/// makes the next plan re-run the item, which then records what it read.
pub fn record(
    scope: &Scope,
    obs: &Observation,
    own: &[String],
    run: &RunWritten,
    cache: &DigestCache,
) -> Vec<Dep> {
    let own: HashSet<&str> = own.iter().map(String::as_str).collect();
    // What the run wrote is asked as of each check, not as of a copy: a
    // later answer only knows more writes, and all of them are excluded.
    let keep =
        |key: &str| !scope.never(key) && !own.contains(key) && !run.with(|w| w.contains(key));
    let started_ns = obs.started_ns;
    let mut out = Vec::new();
    let mut files: BTreeMap<String, bool> = BTreeMap::new();
    for p in &obs.executed {
        files.insert(scope.key(p), true);
    }
    for p in &obs.read {
        files.entry(scope.key(p)).or_insert(false);
    }
    for (key, exec) in files {
        if !keep(&key) {
            continue;
        }
        let abs = scope.abs(&key);
        let ev = match evidence(cache, &key, &abs) {
            // Changed since the command started: its ctime says so (the
            // kernel sets it; no `touch` can), or an mtime within the run.
            // An mtime past the moment of this record (a future date from
            // a tarball or a skewed clock) is no write during the run: it
            // is recorded, not racy, or its items would re-run at every
            // plan forever (issue 47); plans re-hash it, as racy stats are.
            Some(ev)
                if ev.ctime_ns >= started_ns
                    || (ev.mtime_ns >= started_ns && ev.mtime_ns <= ev.observed_at_ns) =>
            {
                FileEvidence {
                    digest: RACY.to_string(),
                    ..ev
                }
            }
            Some(ev) => ev,
            // Not a regular file (a FIFO, a device): no content to compare.
            None if stat_of(&abs).is_ok() => continue,
            // Read, then removed by someone else before this record.
            None => FileEvidence {
                size: 0,
                mtime_ns: 0,
                ctime_ns: 0,
                ino: 0,
                dev: 0,
                observed_at_ns: crate::now_ns(),
                digest: GONE.to_string(),
            },
        };
        let host = (scope.record_host && key.starts_with('/')).then(|| scope.this_host.clone());
        out.push(Dep {
            path: key,
            what: if exec {
                DepKind::Exec(ev)
            } else {
                DepKind::Read(ev)
            },
            host,
        });
    }
    for p in &obs.absent {
        let Some(key) = scope.relative(p) else {
            continue;
        };
        // Absent when looked up, whatever it is now: one that appeared
        // while the command ran makes the next plan re-run the item.
        if keep(&key) {
            out.push(Dep {
                path: key,
                what: DepKind::Absent,
                host: None,
            });
        }
    }
    // Links whose text was read, inside the project (outside it, the
    // loader and interpreters read system links by the hundred).
    for p in &obs.links {
        let Some(key) = scope.relative(p) else {
            continue;
        };
        if !keep(&key) {
            continue;
        }
        if let Ok(t) = std::fs::read_link(scope.abs(&key)) {
            out.push(Dep {
                path: key,
                what: DepKind::Link {
                    target: t.to_string_lossy().into_owned(),
                },
                host: None,
            });
        }
    }
    for p in &obs.listed {
        let Some(key) = scope.relative(p) else {
            continue;
        };
        if scope.never(&key) || run.with(|w| w.contains(&key)) {
            continue;
        }
        let abs = scope.abs(&key);
        // One listing, and only then the run's writes: a name in the
        // listing that the run created was registered before it existed
        // (tracers say so at the call), so it is excluded, never counted.
        let Some(names) = list_names(&abs, scope) else {
            continue;
        };
        let (excluded, kept): (Vec<String>, Vec<String>) = run.with(|written| {
            names.into_iter().partition(|n| {
                let child = if key == "." {
                    n.clone()
                } else {
                    format!("{key}/{n}")
                };
                written.contains(&child) || scope.never(&child)
            })
        });
        // The names the command saw, when the tracer read them at its
        // listing, filtered alike: a name that came or went meanwhile (by
        // anyone but the run) makes the listing racy (issue 47).
        let changed_meanwhile = obs.listed_names.get(p).is_some_and(|then| {
            let then: Vec<&String> = run.with(|written| {
                then.iter()
                    .filter(|n| !n.contains(TEMP_MARK) && !scope.is_dropping(n))
                    .filter(|n| {
                        let child = if key == "." {
                            (*n).clone()
                        } else {
                            format!("{key}/{n}")
                        };
                        !written.contains(&child) && !scope.never(&child)
                    })
                    .collect()
            });
            then.len() != kept.len() || then.iter().zip(&kept).any(|(a, b)| *a != b)
        });
        out.push(Dep {
            path: key,
            what: DepKind::Listed {
                names: if changed_meanwhile {
                    RACY.to_string()
                } else {
                    hash_names(&kept)
                },
                excluded,
                list: kept,
            },
            host: None,
        });
    }
    out.sort();
    out.dedup();
    out
}

/// Checks dependencies, each distinct one once, caching answers across
/// sets (and across stages, when one checker serves a whole plan).
/// Removes the cached bytecode of every Python source among `sets` that
/// changed since it was recorded, and of `code` (the recipe's code files,
/// relative to the root), before a run's commands start (issue 47).
///
/// Python trusts a `__pycache__/NAME.TAG.pyc` whose header matches the
/// source's size and whole-second mtime. A helper edited to the same size
/// within the same second (a formatter right after a save, a `git
/// checkout` of a same-size version) is seen changed here, by its digest,
/// and its items re-run; without this they would run the old bytecode and
/// record the new source as their evidence: stale for good. Removing the
/// cache costs one compile of the module at its next import. Returns the
/// files removed.
pub fn forget_stale_bytecode(
    scope: &Scope,
    sets: &[Vec<Dep>],
    code: &[String],
    checker: &mut Checker<'_>,
) -> Vec<PathBuf> {
    let mut sources: BTreeSet<PathBuf> = code
        .iter()
        .filter(|c| c.ends_with(".py"))
        .map(|c| scope.abs(c))
        .collect();
    for d in sets.iter().flatten() {
        let py = d.path.ends_with(".py") && matches!(d.what, DepKind::Read(_) | DepKind::Exec(_));
        if py && !sources.contains(&scope.abs(&d.path)) && checker.changed(d) {
            sources.insert(scope.abs(&d.path));
        }
    }
    let prefix = std::env::var_os("PYTHONPYCACHEPREFIX").map(PathBuf::from);
    let mut removed = Vec::new();
    for src in &sources {
        let (Some(dir), Some(stem)) = (src.parent(), src.file_stem().and_then(|s| s.to_str()))
        else {
            continue;
        };
        // Beside the source, and under PYTHONPYCACHEPREFIX when it is set
        // (there the source's absolute folder, without its root, is
        // repeated: `PREFIX/home/u/p/helper.TAG.pyc`).
        let mut caches = vec![dir.join("__pycache__")];
        if let Some(p) = &prefix {
            let abs = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
            if let Ok(rel) = abs.strip_prefix("/") {
                caches.push(p.join(rel));
            }
        }
        let mark = format!("{stem}.");
        for cache in caches {
            let Ok(rd) = std::fs::read_dir(&cache) else {
                continue;
            };
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with(&mark)
                    && n.ends_with(".pyc")
                    && n[mark.len()..].matches('.').count() <= 2
                    && std::fs::remove_file(e.path()).is_ok()
                {
                    removed.push(e.path());
                }
            }
        }
    }
    removed
}

pub struct Checker<'a> {
    scope: &'a Scope,
    granularity_ns: i64,
    rehash: bool,
    seen: HashMap<Dep, bool>,
}

impl<'a> Checker<'a> {
    pub fn new(scope: &'a Scope, granularity_ns: i64, rehash: bool) -> Checker<'a> {
        Checker {
            scope,
            granularity_ns,
            rehash,
            seen: HashMap::new(),
        }
    }

    /// Whether a dependency differs from its record now. Another
    /// machine's file (a fleet) is that machine's plan's to check: here it
    /// counts as unchanged.
    pub fn changed(&mut self, d: &Dep) -> bool {
        if !self.scope.checkable(d) {
            return false;
        }
        if let Some(&c) = self.seen.get(d) {
            return c;
        }
        let abs = self.scope.abs(&d.path);
        let c = match &d.what {
            DepKind::Read(ev) | DepKind::Exec(ev) => match stat_of(&abs) {
                Err(_) | Ok((_, false)) => true,
                Ok(_) if ev.digest == RACY || ev.digest == GONE => true,
                Ok((stat, true)) => {
                    let trusted = !self.rehash
                        && stat == ev.stat()
                        && !is_racy(ev.mtime_ns, ev.observed_at_ns, self.granularity_ns);
                    !trusted
                        && blake3_file(&abs)
                            .map(|dg| dg.to_string() != ev.digest)
                            .unwrap_or(true)
                }
            },
            // Followed through symlinks, as the tracer looked it up (and as
            // the command's open would): a dangling link stays absent.
            DepKind::Absent => std::fs::metadata(&abs).is_ok(),
            DepKind::Link { target } => std::fs::read_link(&abs)
                .map(|t| t.to_string_lossy() != target.as_str())
                .unwrap_or(true),
            DepKind::Listed {
                names, excluded, ..
            } => {
                let ex: BTreeSet<String> = excluded.iter().cloned().collect();
                listing_hash(&abs, &ex, self.scope).as_ref() != Some(names)
            }
        };
        self.seen.insert(d.clone(), c);
        c
    }

    /// The first changed dependency of a set, if any, as [`Self::describe`]
    /// says it.
    pub fn first_changed(&mut self, set: &[Dep]) -> Option<String> {
        set.iter()
            .find(|d| self.changed(d))
            .map(|d| self.describe(d))
    }

    /// A changed dependency in words: its path, and for a listing the
    /// names that appeared (+) or went (-) since it was recorded, at most
    /// [`LISTING_NAMES_SHOWN_MAX`] of them.
    pub fn describe(&self, d: &Dep) -> String {
        let DepKind::Listed { excluded, list, .. } = &d.what else {
            return d.path.clone();
        };
        if list.is_empty() {
            return d.path.clone();
        }
        let ex: BTreeSet<&String> = excluded.iter().collect();
        let Some(now) = list_names(&self.scope.abs(&d.path), self.scope) else {
            return format!("{} (gone)", d.path);
        };
        let now: BTreeSet<&String> = now.iter().filter(|n| !ex.contains(n)).collect();
        let then: BTreeSet<&String> = list.iter().collect();
        let mut names: Vec<String> = now
            .difference(&then)
            .map(|n| format!("+{}", n.escape_debug()))
            .chain(
                then.difference(&now)
                    .map(|n| format!("-{}", n.escape_debug())),
            )
            .collect();
        if names.is_empty() {
            return d.path.clone();
        }
        let more = names.len().saturating_sub(LISTING_NAMES_SHOWN_MAX);
        names.truncate(LISTING_NAMES_SHOWN_MAX);
        if more > 0 {
            names.push(format!("{more} more"));
        }
        format!("{} ({})", d.path, names.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_dependencies() {
        let t = tempfile::tempdir().unwrap();
        let scope = Scope::new(
            t.path(),
            &t.path().join(".highwater"),
            &[
                "/usr/share/zoneinfo/**".to_string(),
                "vendor/**".to_string(),
            ],
        );
        let cases = [
            ("/proc/self/maps", true),
            ("/dev/null", true),
            ("/dev/shm/table.csv", false),
            ("/dev/shmx", true),
            ("/sys", true),
            ("/usr/share/zoneinfo/UTC", true),
            ("vendor/x.py", true),
            (".highwater/state.db", true),
            ("out/.a.txt.hw-tmp-1-2/a.txt", true),
            ("lib/helpers.py", false),
            ("/usr/bin/python3", false),
            ("/devices", false),
            (".git/index", true),
            (".git", true),
            (".github/workflows/ci.yml", false),
            // Issue 47: a cache of other dependencies, and droppings.
            ("/etc/ld.so.cache", true),
            ("/etc/ld.so.conf", false),
            ("lib/.helpers.py.swp", true),
            ("lib/helpers.py~", true),
            (".#notes.txt", true),
            ("#notes.txt#", true),
            ("sub/.DS_Store", true),
            ("lib/swp.py", false),
            ("lib/a~b.py", false),
        ];
        for (k, want) in cases {
            assert_eq!(scope.never(k), want, "{k}");
        }
        let plain = Scope::new(t.path(), &t.path().join(".highwater"), &[]).with_defaults(false);
        for k in ["/etc/ld.so.cache", "lib/.helpers.py.swp", "lib/helpers.py~"] {
            assert!(!plain.never(k), "{k}: observe_ignore_defaults = false");
        }
        // A scratch folder of highwater's own (a downloaded input), and a
        // folder beside it that only looks alike.
        let tmp = std::env::temp_dir();
        let scratch = tmp.join("highwater-scratch-1-2/in/a.txt");
        assert!(scope.never(&scratch.to_string_lossy()));
        let other = tmp.join("not-highwater-scratch-1/in/a.txt");
        assert!(!scope.never(&other.to_string_lossy()));
    }

    #[test]
    fn a_set_round_trips_and_its_id_is_its_content() {
        let set = vec![
            Dep {
                path: "a".into(),
                what: DepKind::Absent,
                host: None,
            },
            Dep {
                path: "lib".into(),
                what: DepKind::Listed {
                    names: "x".into(),
                    excluded: vec!["__pycache__".into()],
                    list: Vec::new(),
                },
                host: None,
            },
            Dep {
                path: "/usr/bin/python3".into(),
                what: DepKind::Exec(FileEvidence {
                    size: 1,
                    mtime_ns: 2,
                    ctime_ns: 3,
                    ino: 4,
                    dev: 5,
                    observed_at_ns: 6,
                    digest: "blake3:00".into(),
                }),
                host: Some("machine-a".into()),
            },
        ];
        let (id, body) = encode(&set);
        assert_eq!(decode(&body).unwrap(), set);
        assert_eq!(encode(&decode(&body).unwrap()).0, id);
        let (id2, _) = encode(&set[..1]);
        assert_ne!(id, id2);
        // Without a host, a set is spelled as before hosts were recorded:
        // local sets keep their ids.
        assert!(!encode(&set[..2]).1.contains("host"));
        assert!(body.contains(r#""host":"machine-a""#), "{body}");
    }
}
