//! The highwater state store.
//!
//! State lives behind the [`StateStore`] trait so that the planner and the
//! committer never see SQL, and a shared PostgreSQL backend can be added
//! without touching either. [`SqliteStore`] is the embedded default: bundled
//! SQLite in WAL mode, every write in one `BEGIN IMMEDIATE` transaction.
//!
//! Layout:
//! - this file: the trait, the batch and run types, the error type.
//! - [`sqlite`]: the SQLite implementation and its forward-only migrations.
//! - [`snapshot`]: one stage's manifest as one file, used by the SQLite
//!   store while the stage's manifest token says it is current.
//! - [`heads`]: one source's window heads as one file, the same way, at
//!   the source's window token.
//! - [`lease`]: leases with fencing tokens on any SQLite database, the
//!   acquisition loop and the heartbeat (ingestion and the OSM writer).
//!
//! Invariants: only this crate knows SQL for state; a store refuses to open a
//! database whose schema is newer than it understands rather than guess.

/// The work-queue tables, as SQL both stores read (PostgreSQL adds the
/// token sequence).
macro_rules! work_sql {
    () => {
        "CREATE TABLE work(
        stage TEXT NOT NULL,
        item TEXT NOT NULL,
        state TEXT NOT NULL,
        owner TEXT,
        token BIGINT NOT NULL,
        lease_until_ns BIGINT,
        claims INTEGER NOT NULL,
        payload TEXT NOT NULL,
        PRIMARY KEY(stage, item)
     );
     CREATE INDEX work_owner ON work(owner);
     CREATE TABLE processes(
        owner TEXT PRIMARY KEY,
        host TEXT NOT NULL,
        pid BIGINT NOT NULL,
        command TEXT NOT NULL,
        started_at_ns BIGINT NOT NULL,
        heartbeat_at_ns BIGINT NOT NULL,
        finished_at_ns BIGINT,
        claimed BIGINT NOT NULL,
        done BIGINT NOT NULL,
        takeovers BIGINT NOT NULL,
        fenced BIGINT NOT NULL
     );"
    };
}

pub mod heads;
pub mod lease;
pub mod pg;
pub mod snapshot;
pub mod sqlite;

use highwater_core::{Entry, EntryKind};
use serde::Serialize;
use std::path::PathBuf;
use thiserror::Error;

pub use pg::PgStore;

// One numbering of migrations for both stores, so that a dump of one
// restores into the other.
const _: () = assert!(sqlite::SCHEMA_VERSION == pg::SCHEMA_VERSION);
pub use sqlite::SqliteStore;

/// Where the state lives: the embedded SQLite file, or a PostgreSQL
/// database shared by a fleet, named by the variable holding its URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateLocation {
    Sqlite(PathBuf),
    Postgres { var: String },
}

impl StateLocation {
    /// Opens (creating and migrating) the store.
    pub fn open(&self) -> Result<Box<dyn StateStore>, StoreError> {
        Ok(match self {
            StateLocation::Sqlite(p) => Box::new(SqliteStore::open(p)?),
            StateLocation::Postgres { var } => Box::new(PgStore::open_env(var)?),
        })
    }

    /// Shared by many processes (and machines).
    pub fn is_shared(&self) -> bool {
        matches!(self, StateLocation::Postgres { .. })
    }

    /// Whether a store is there to read (a SQLite file may not exist yet;
    /// a PostgreSQL store is always asked).
    pub fn exists(&self) -> bool {
        match self {
            StateLocation::Sqlite(p) => p.exists(),
            StateLocation::Postgres { .. } => true,
        }
    }
}

/// What to do about an SQLite error, by its kind.
fn sqlite_hint(e: &rusqlite::Error) -> &'static str {
    use rusqlite::ErrorCode;
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => {
            "The state database is damaged: restore it from a backup, or delete it and run `highwater adopt` to record the existing outputs again"
        }
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            "Another process holds the database; wait for it, and check that the folder is not on a filesystem without locking"
        }
        Some(ErrorCode::ReadOnly | ErrorCode::PermissionDenied | ErrorCode::CannotOpen) => {
            "Check that the folder exists and is writable"
        }
        _ => "Check that the folder is writable and not on a filesystem without locking",
    }
}

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("state store {path}: {source}. {}", sqlite_hint(source))]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("state store {path} has schema version {found}, newer than this highwater understands ({known}); upgrade highwater")]
    TooNew {
        path: PathBuf,
        found: u32,
        known: u32,
    },
    #[error("state store {path}: row ({stage}, {item}) is corrupt: {what}. Export with `highwater state export`, fix or remove the row, or delete the store to start over (the guard will then ask for --force)")]
    Corrupt {
        path: PathBuf,
        stage: String,
        item: String,
        what: String,
    },
    #[error("the PostgreSQL state store ({what}): {source}. Check that the server is up, the URL in that variable is right, and the user may create tables")]
    Pg {
        /// The variable the URL came from; the URL itself may hold a
        /// password and is never shown.
        what: String,
        #[source]
        source: postgres::Error,
    },
    #[error("the PostgreSQL state store ({what}) already holds state ({rows} rows); migrate into an empty database, so that nothing in it is overwritten or mixed")]
    NotEmpty { what: String, rows: i64 },
    #[error("[state] url_env = {var:?}, but that environment variable is not set. Set it to a postgres:// URL, or remove url_env to use the embedded SQLite store")]
    NoUrl { var: String },
    #[error("cannot create the state folder {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Manifest entries of one stage, split by kind.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StageEntries {
    pub items: highwater_core::Entries,
    pub members: highwater_core::Entries,
    /// The output folders' stats as last recorded, by folder.
    pub dirs: std::collections::BTreeMap<String, DirRecord>,
    /// The observed dependency set of each item (issue 24), by the item's
    /// position in `items`: an index into `dep_sets`. Empty when no item
    /// has one, else as long as `items`. A position, not a map by name:
    /// at a million items a second copy of every name was a fifth of a
    /// no-change plan.
    pub item_sets: Vec<Option<u32>>,
    /// The dependency sets those indices name: (id, body as JSON). Most
    /// items of a stage share one set, so it is stored and loaded once.
    pub dep_sets: Vec<(String, String)>,
}

impl StageEntries {
    /// The dependency set (id, body) of the item at `index` of `items`.
    pub fn dep_set_of(&self, index: usize) -> Option<&(String, String)> {
        let i = (*self.item_sets.get(index)?)?;
        Some(&self.dep_sets[i as usize])
    }

    /// Each item that has a dependency set, in item order, with the set.
    pub fn item_deps(&self) -> impl Iterator<Item = (&highwater_core::Entry, &(String, String))> {
        self.items
            .values()
            .enumerate()
            .filter_map(|(i, e)| Some((e, self.dep_set_of(i)?)))
    }

    /// Whether any item has a dependency set.
    pub fn has_deps(&self) -> bool {
        self.item_sets.iter().any(Option::is_some)
    }
}

/// Links a stage's items to their dependency sets from `(item, set id)`
/// rows in item order (bytewise), without a copy of any name: each row is
/// paired with `items` by one merge, each distinct id kept once. A row
/// whose item has no entry is left out (it can only be a leftover; such
/// an item plans as new).
pub(crate) struct DepLinker<'a> {
    items: &'a [highwater_core::Entry],
    next: usize,
    item_sets: Vec<Option<u32>>,
    /// (id, the first item that names it, for an error about its body).
    ids: Vec<(String, String)>,
    last: Option<u32>,
}

impl<'a> DepLinker<'a> {
    pub(crate) fn new(items: &'a highwater_core::Entries) -> DepLinker<'a> {
        DepLinker {
            items: items.as_slice(),
            next: 0,
            item_sets: Vec::new(),
            ids: Vec::new(),
            last: None,
        }
    }

    pub(crate) fn push(&mut self, item: &str, id: &str) {
        while self.next < self.items.len() && self.items[self.next].item.as_str() < item {
            self.next += 1;
        }
        if self.next >= self.items.len() || self.items[self.next].item != item {
            return;
        }
        let set = match self.last {
            Some(l) if self.ids[l as usize].0 == id => l,
            _ => match self.ids.iter().position(|(i, _)| i == id) {
                Some(p) => p as u32,
                None => {
                    self.ids.push((id.to_string(), item.to_string()));
                    (self.ids.len() - 1) as u32
                }
            },
        };
        self.last = Some(set);
        if self.item_sets.is_empty() {
            self.item_sets = vec![None; self.items.len()];
        }
        self.item_sets[self.next] = Some(set);
        self.next += 1;
    }

    /// The links, and each distinct set's (id, first item) in index order.
    pub(crate) fn finish(self) -> (Vec<Option<u32>>, Vec<(String, String)>) {
        (self.item_sets, self.ids)
    }
}

/// The recorded stat of one output folder. While a folder's mtime is
/// unchanged (and the record is not racy), no name in it was added, removed
/// or renamed, so the outputs recorded in it still exist without listing it.
/// This is git's untracked cache, applied to outputs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DirRecord {
    pub dir: String,
    pub mtime_ns: i64,
    /// Compared too: `touch -d` can restore a folder's mtime after a file
    /// in it was deleted, but nothing outside the kernel sets a ctime.
    pub ctime_ns: i64,
    pub ino: u64,
    pub observed_at_ns: i64,
}

/// One atomic change to the manifest.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub upserts: Vec<(String, Entry)>,
    pub deletes: Vec<(String, EntryKind, String)>,
    /// Replaces every folder record of these stages.
    pub dirs: Vec<(String, Vec<DirRecord>)>,
    /// (stage, item, dependency set id): sets an item's observed
    /// dependencies; `None` removes them (observation off, or none seen).
    pub deps: Vec<(String, String, Option<String>)>,
    /// (id, body) of dependency sets, inserted when not already stored.
    pub dep_sets: Vec<(String, String)>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty()
            && self.deletes.is_empty()
            && self.dirs.is_empty()
            && self.deps.is_empty()
            && self.dep_sets.is_empty()
    }
    pub fn len(&self) -> usize {
        self.upserts.len() + self.deletes.len() + self.dirs.len() + self.deps.len()
    }
}

/// The observed dependencies of a batch of completed claims (issue 24).
#[derive(Clone, Debug, Default)]
pub struct DoneDeps {
    /// By index of the completed items: the item's set id, or `None`.
    pub sets: Vec<Option<String>>,
    /// (id, body) of the sets named.
    pub bodies: Vec<(String, String)>,
}

/// Forward migration 5 -> 6 in both stores (issue 24): observed
/// dependency sets, stored once per distinct set, and each item's set.
/// Rows of deleted items go with them; a set no item names any more is
/// pruned at the end of a run.
pub const DEPS_SQL: &str = "CREATE TABLE dep_sets(
        id TEXT PRIMARY KEY,
        body TEXT NOT NULL
     );
     CREATE TABLE item_deps(
        stage TEXT NOT NULL,
        item TEXT NOT NULL,
        set_id TEXT NOT NULL,
        PRIMARY KEY(stage, item)
     );
     CREATE INDEX item_deps_set ON item_deps(set_id);";

/// The record of one run of one stage.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RunRecord {
    pub id: i64,
    pub stage: String,
    pub started_at_ns: i64,
    pub finished_at_ns: Option<i64>,
    pub summary: serde_json::Value,
    pub exit_code: Option<i32>,
}

/// The end of the last contiguous published window of a source, and for
/// sources that track arrival order (commit_order, append_id) the horizon:
/// the transaction id or row id below which everything has been seen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Bookmark {
    pub source: String,
    pub last_end_us: i64,
    pub horizon: Option<i64>,
}

/// Where a window stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WindowStatus {
    /// Being extracted or published by the lease holder named in the token.
    Running,
    Published,
    Failed,
}

impl WindowStatus {
    /// The status a record's text names, as `as_str` writes it.
    pub fn parse(s: &str) -> Option<WindowStatus> {
        [
            WindowStatus::Running,
            WindowStatus::Published,
            WindowStatus::Failed,
        ]
        .into_iter()
        .find(|w| w.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WindowStatus::Running => "running",
            WindowStatus::Published => "published",
            WindowStatus::Failed => "failed",
        }
    }
}

/// The record of one window of one source.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WindowRecord {
    pub source: String,
    pub start_us: i64,
    pub end_us: i64,
    pub status: WindowStatus,
    pub rows: i64,
    /// The published files (as in `_manifest.json`).
    pub files: serde_json::Value,
    pub duration_ms: i64,
    /// The idempotency token of the attempt, also written into the window's
    /// `_manifest.json`: a crash between publish and record resolves by
    /// comparing the two.
    pub token: String,
    pub recipe: String,
    pub updated_at_ns: i64,
    pub error: Option<String>,
    /// Mode-specific facts, e.g. the id range of an append_id window.
    pub extra: serde_json::Value,
}

/// A lease: a lock with an owner, an expiry and a fencing token. The token
/// grows on every takeover, and every write made under the lease checks it,
/// so an owner that lost its lease can no longer publish or move a bookmark.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Lease {
    pub name: String,
    pub owner: String,
    pub host: String,
    pub pid: i64,
    pub acquired_at_ns: i64,
    pub expires_at_ns: i64,
    pub token: i64,
}

/// The proof of holding a lease, carried by every fenced write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub name: String,
    pub token: i64,
}

/// What `acquire_lease` found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseOutcome {
    /// Ours now: new, renewed, or taken over from an expired owner.
    Acquired(Lease),
    /// Someone else holds it and it has not expired.
    Held(Lease),
}

/// What a fenced window commit did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowCommit {
    Done,
    /// The lease was taken over: nothing was written.
    Fenced,
    /// The bookmark was not at the expected value: nothing was written.
    BookmarkMoved,
}

/// The state store interface. Every method that writes is one transaction.
pub trait StateStore: Send {
    /// All entries of a stage.
    fn load(&self, stage: &str) -> Result<StageEntries, StoreError>;
    /// The stage's current manifest snapshot, to be read and decoded
    /// later, off this connection (on another thread, while this one reads
    /// something else), when the store keeps one; `None`: call `load`.
    /// A snapshot that turns out not to be current reads as `None` then,
    /// and the caller calls `load`.
    fn snapshot_later(&self, _stage: &str) -> Result<Option<snapshot::Later>, StoreError> {
        Ok(None)
    }
    /// Applies upserts and deletes in one transaction.
    fn commit(&mut self, batch: &Batch) -> Result<(), StoreError>;
    /// Records the start of a run; returns its id.
    fn begin_run(&mut self, stage: &str, started_at_ns: i64) -> Result<i64, StoreError>;
    /// Records the end of a run.
    fn finish_run(
        &mut self,
        run: i64,
        finished_at_ns: i64,
        summary: &serde_json::Value,
        exit_code: i32,
    ) -> Result<(), StoreError>;
    /// The latest run of each stage.
    fn last_runs(&self) -> Result<Vec<RunRecord>, StoreError>;
    /// Runs that began and never finished (the process died), newest first.
    fn unfinished_runs(&self) -> Result<Vec<RunRecord>, StoreError>;
    /// Every entry of every stage, ordered by stage, kind and item.
    fn export(&self) -> Result<Vec<(String, Entry)>, StoreError>;
    /// The schema version after migrations.
    fn schema_version(&self) -> Result<u32, StoreError>;

    /// The bookmark of a source, if it has one.
    fn bookmark(&self, source: &str) -> Result<Option<Bookmark>, StoreError>;
    /// Every window record of a source, by start.
    fn windows(&self, source: &str) -> Result<Vec<WindowRecord>, StoreError>;
    /// Every window record of a source, by start, with only what says
    /// where each stands: `files` may be empty and `extra` may hold only
    /// `digest`, `path` and `compacted.path` (what a plan over landed
    /// windows reads, issue 49). By default, the whole records.
    fn window_heads(&self, source: &str) -> Result<Vec<WindowRecord>, StoreError> {
        self.windows(source)
    }
    /// In one transaction, if the fence still holds: writes the window
    /// record, and when `advance` is given, moves the bookmark from the
    /// expected end (`None`: no bookmark yet) to the new one by
    /// compare-and-set.
    fn commit_window(
        &mut self,
        record: &WindowRecord,
        advance: Option<(Option<i64>, &Bookmark)>,
        fence: &Fence,
    ) -> Result<WindowCommit, StoreError>;
    /// Rewrites several window records in one transaction, if the fence
    /// still holds (compaction: a period's windows change together). The
    /// bookmark does not move: only published windows are rewritten.
    fn commit_windows(
        &mut self,
        records: &[WindowRecord],
        fence: &Fence,
    ) -> Result<WindowCommit, StoreError>;
    /// Moves only the horizon of a bookmark whose end is still `expected_end`,
    /// under the fence.
    fn advance_horizon(
        &mut self,
        source: &str,
        expected_end: i64,
        horizon: i64,
        fence: &Fence,
    ) -> Result<WindowCommit, StoreError>;
    /// Takes the lease `name` if it is free, ours, or expired.
    fn acquire_lease(
        &mut self,
        name: &str,
        owner: &str,
        host: &str,
        pid: i64,
        now_ns: i64,
        duration_ns: i64,
    ) -> Result<LeaseOutcome, StoreError>;
    /// Extends a lease we hold; false when it was taken over.
    fn renew_lease(
        &mut self,
        fence: &Fence,
        now_ns: i64,
        duration_ns: i64,
    ) -> Result<bool, StoreError>;
    /// Gives a lease up (only if still ours).
    fn release_lease(&mut self, fence: &Fence) -> Result<(), StoreError>;
    /// Who holds lease `name` now (expired or not), if anyone.
    fn lease(&self, name: &str) -> Result<Option<Lease>, StoreError>;
    /// Every lease whose name starts with `prefix`, by name.
    fn leases(&self, prefix: &str) -> Result<Vec<Lease>, StoreError>;
    /// Everything a store holds that outlives a process (not leases, not
    /// the work queue), in a fixed order: what `state migrate` copies and
    /// compares.
    fn dump(&self) -> Result<StateDump, StoreError>;
    /// The work queue, when this store is shared by a fleet (PostgreSQL);
    /// `None` for a store one machine owns.
    fn as_queue(&mut self) -> Option<&mut dyn WorkQueue> {
        None
    }
}

/// The tables of the work queue and the fleet (migration 4 -> 5 in both
/// stores: SQLite keeps them empty, so that versions mean the same tables).
pub const WORK_SQL_SQLITE: &str = work_sql!();

/// The durable content of a state store, in a fixed order (see
/// [`StateStore::dump`]). Equal dumps mean equal stores.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StateDump {
    pub entries: Vec<(String, Entry)>,
    pub dirs: Vec<(String, DirRecord)>,
    pub runs: Vec<RunRecord>,
    pub bookmarks: Vec<Bookmark>,
    pub windows: Vec<WindowRecord>,
    /// (stage, item, set id), ordered by stage and item (issue 24).
    pub deps: Vec<(String, String, String)>,
    /// (id, body), ordered by id.
    pub dep_sets: Vec<(String, String)>,
}

impl StateDump {
    /// Rows per table, for messages.
    pub fn counts(&self) -> [(&'static str, usize); 7] {
        [
            ("entries", self.entries.len()),
            ("output_dirs", self.dirs.len()),
            ("runs", self.runs.len()),
            ("bookmarks", self.bookmarks.len()),
            ("windows", self.windows.len()),
            ("item_deps", self.deps.len()),
            ("dep_sets", self.dep_sets.len()),
        ]
    }
}

/// One claimed item: the token fences its result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub item: String,
    pub token: i64,
    /// What the planner wrote for the worker (JSON).
    pub payload: String,
    /// The claim took the item over from a holder whose claim expired.
    pub takeover: bool,
}

/// Where a stage's queued items stand.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QueueCounts {
    pub todo: u64,
    /// Claimed, and the claim has not expired.
    pub claimed: u64,
    /// Claimed, and the claim expired: claimable again.
    pub expired: u64,
    pub done: u64,
    /// Items claimed more than once (a claim expired and was taken over):
    /// the earlier holder may have left temp outputs behind.
    pub retried: u64,
}

impl QueueCounts {
    /// Items not yet done.
    pub fn open(&self) -> u64 {
        self.todo + self.claimed + self.expired
    }
}

/// One process of a fleet, as it registered and as it is going.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FleetProcess {
    pub owner: String,
    pub host: String,
    pub pid: i64,
    pub command: String,
    pub started_at_ns: i64,
    pub heartbeat_at_ns: i64,
    pub finished_at_ns: Option<i64>,
    /// Items it claimed, completed, took over from an expired claim, and
    /// whose results the fence refused.
    pub claimed: u64,
    pub done: u64,
    pub takeovers: u64,
    pub fenced: u64,
    /// Items it holds claimed now.
    pub holding: u64,
    /// The server's clock when this was read.
    pub now_ns: i64,
}

/// Who queued a stage's current plan, and under which recipe (issue 20: a
/// rolling deploy runs two recipes of one stage side by side). `replaced`
/// lists the recipes this plan's recipe took over from: a process whose
/// recipe is among them runs an older config and is refused, so that two
/// deploys never take turns remaking every item.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct QueuePlan {
    pub recipe: String,
    pub owner: String,
    pub host: String,
    pub pid: i64,
    pub planned_at_ns: i64,
    #[serde(default)]
    pub replaced: Vec<String>,
    /// Read back only: `host pid N` of every process holding a live claim
    /// of the stage now (not stored).
    #[serde(skip)]
    pub holders: Vec<String>,
}

/// The work queue of a shared store: the planner enqueues a stage's changed
/// items under the stage's plan lease; every process claims batches with
/// `FOR UPDATE SKIP LOCKED`, keeps its claims alive with a heartbeat, and
/// completes each item only if its token is still current.
///
/// Ordering contract: `enqueue` is called only while the stage has no open
/// item (checked under the plan lease); `complete` writes an item's entry in
/// the same transaction that checks its token; a claim that expired is
/// claimable again with a larger token, so the earlier holder's `complete`
/// writes nothing.
pub trait WorkQueue {
    fn pending(&mut self, stage: &str) -> Result<QueueCounts, StoreError>;
    /// Under the plan lease's fence: commits the plan's own batch
    /// (deletions, refreshed evidence) and queues `items` (item, payload).
    fn enqueue(
        &mut self,
        stage: &str,
        batch: &Batch,
        items: &[(String, String)],
        fence: &Fence,
    ) -> Result<WindowCommit, StoreError>;
    /// `enqueue`, recording `plan` as the stage's current plan in the same
    /// transaction: claims under another recipe then find nothing.
    fn enqueue_plan(
        &mut self,
        stage: &str,
        batch: &Batch,
        items: &[(String, String)],
        fence: &Fence,
        plan: &QueuePlan,
    ) -> Result<WindowCommit, StoreError>;
    /// The stage's current plan, with the processes holding its claims.
    fn queue_plan(&mut self, stage: &str) -> Result<Option<QueuePlan>, StoreError>;
    /// `claim`, only while the stage's current plan has `recipe`: a process
    /// never runs an item another recipe's plan queued.
    fn claim_recipe(
        &mut self,
        stage: &str,
        owner: &str,
        n: usize,
        lease_ns: i64,
        recipe: &str,
    ) -> Result<Vec<Claim>, StoreError>;
    /// Claims up to `n` items for `lease_ns` (server clock).
    fn claim(
        &mut self,
        stage: &str,
        owner: &str,
        n: usize,
        lease_ns: i64,
    ) -> Result<Vec<Claim>, StoreError>;
    /// Extends every live claim of `owner`; returns how many.
    fn heartbeat(&mut self, owner: &str, lease_ns: i64) -> Result<u64, StoreError>;
    /// Whether the claim is current and has more than `margin_ns` to run:
    /// asked just before an output is published.
    fn holds(
        &mut self,
        stage: &str,
        item: &str,
        token: i64,
        margin_ns: i64,
    ) -> Result<bool, StoreError>;
    /// Marks items done and records their entries (if any: a window's
    /// record is written by its own fenced commit), each only if its token
    /// is still current; says which were kept. `refused` counts results the
    /// worker already dropped because `holds` said no (for the fleet status).
    fn complete(
        &mut self,
        stage: &str,
        owner: &str,
        done: &[(String, i64, Option<Entry>)],
        refused: u64,
    ) -> Result<Vec<bool>, StoreError> {
        self.complete_observed(stage, owner, done, None, refused)
    }
    /// `complete`, with each item's observed dependencies (issue 24)
    /// written in the same transaction as its entry, and only for the items
    /// kept: `deps.sets[i]` is the set id of `done[i]` (`None` removes its
    /// set), `deps.bodies` the sets to store when not stored yet.
    fn complete_observed(
        &mut self,
        stage: &str,
        owner: &str,
        done: &[(String, i64, Option<Entry>)],
        deps: Option<&DoneDeps>,
        refused: u64,
    ) -> Result<Vec<bool>, StoreError>;
    /// Removes the dependency sets no item names any more (issue 24);
    /// says how many. Safe beside concurrent `complete_observed`s: see the
    /// implementation.
    fn prune_dep_sets(&mut self) -> Result<u64, StoreError>;
    /// Registers this process in the fleet.
    fn register(&mut self, p: &FleetProcess) -> Result<(), StoreError>;
    /// Marks this process finished.
    fn finish(&mut self, owner: &str) -> Result<(), StoreError>;
    /// Every process that registered, newest last.
    fn fleet(&mut self) -> Result<Vec<FleetProcess>, StoreError>;
}
