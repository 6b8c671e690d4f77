//! The primary store: every node, way and relation of the imported extract
//! with the diffs applied, plus the reverse indexes that derivation needs
//! (node → ways, member → relations). Bundled SQLite; one transaction per
//! applied diff (or batch), so a crash leaves the store at a whole diff.
//!
//! Nodes live in blocks of consecutive ids, each entry with the ways
//! through the node ([`crate::nodeblocks`]); their tags in `node_tags`.
//! With `[osm] flat_nodes`, untagged nodes' locations are in a flat file
//! indexed by node id ([`crate::flatnodes`]) and their entries say so;
//! `read_node` and `edit_nodes` are the seam. Meta [`FLAT_NODES_META`]
//! names the file, [`FLAT_TOKEN_META`] the token its slot 0 must hold.

use crate::flatnodes::FlatNodes;
use crate::model::{Element, Member, MemberKind, Node, Relation, Tags, Way};
use crate::nodeblocks::{self, Entry};
use rusqlite::{params, Connection, OptionalExtension, Transaction};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use thiserror::Error;

/// Meta row: the flat node file of a store imported with `[osm]
/// flat_nodes` (the path as the config resolved it).
pub const FLAT_NODES_META: &str = "flat_nodes";
/// Meta row: the token the flat node file's slot 0 holds.
pub const FLAT_TOKEN_META: &str = "flat_nodes_token";
/// Meta row: the last flat-node write epoch the store committed (see the
/// undo log in [`crate::flatnodes`]).
pub const FLAT_EPOCH_META: &str = "flat_nodes_epoch";

/// What the crates above the store add to every store it opens or
/// creates. The store knows no dataset and no feature: the derived
/// datasets' tables are created with its own (so a published store never
/// lacks one), and the shapes index, derived from features, is rebuilt by
/// code above it when a migration dropped it. `highwater_osm` gives the one
/// it uses (`highwater_osm::store_extension`, from its registry of kinds).
#[derive(Clone, Debug)]
pub struct Extension {
    /// Every dataset kind's tables (`CREATE TABLE IF NOT EXISTS ...`).
    pub tables: Vec<&'static str>,
    /// Rebuilds the shapes index from every feature in the store.
    pub rebuild_shapes: fn(&mut Store) -> Result<usize, StoreError>,
}

/// The undo log beside a flat node file.
pub(crate) fn undo_path(flat: &Path) -> PathBuf {
    let mut n = flat.file_name().unwrap_or_default().to_os_string();
    n.push(".undo");
    flat.with_file_name(n)
}

/// Where node locations are, beside the blocks: the flat file, and the
/// locations a writer has not written to it yet.
#[derive(Clone, Copy, Default)]
struct Locs<'a> {
    flat: Option<&'a FlatNodes>,
    pending: Option<&'a BTreeMap<i64, (i32, i32)>>,
}

impl Locs<'_> {
    fn get(&self, id: i64) -> rusqlite::Result<Option<(i32, i32)>> {
        if let Some(l) = self.pending.and_then(|p| p.get(&id)) {
            return Ok(Some(*l));
        }
        match self.flat {
            Some(f) => f
                .get(id)
                .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e))),
            None => Ok(None),
        }
    }
}

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("OSM store {path}: {err}")]
    Sqlite { path: PathBuf, err: rusqlite::Error },
    #[error("OSM store {path}: {what}")]
    Corrupt { path: PathBuf, what: String },
    #[error("no OSM store at {}: run `highwater osm import EXTRACT` to create one (or check --store and [osm] store for a typo, or a share that is not mounted)", dir.display())]
    Missing { dir: PathBuf },
    #[error("OSM store {}: the file is empty (0 bytes), not a store. Restore it from a backup, or import an extract again with `highwater osm import EXTRACT --replace`", path.display())]
    Empty { path: PathBuf },
    #[error("OSM store {}: another process writes it (owner {owner}, pid {pid} on {host}, lease until {expires}). Wait for it with --wait, or stop that process; its lease expires on its own if it died", path.display())]
    Held {
        path: PathBuf,
        owner: String,
        host: String,
        pid: i64,
        expires: String,
    },
    #[error("OSM store {}: this process lost its writer lease to another (its token is no longer current); it wrote nothing more. Run the command again", path.display())]
    Fenced { path: PathBuf },
    #[error(transparent)]
    Flat(#[from] crate::flatnodes::FlatNodesError),
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS node_blocks(first INTEGER PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS node_tags(id INTEGER PRIMARY KEY, tags TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS ways(id INTEGER PRIMARY KEY, refs BLOB NOT NULL, tags TEXT);
CREATE TABLE IF NOT EXISTS relations(id INTEGER PRIMARY KEY, members TEXT NOT NULL, tags TEXT);
CREATE TABLE IF NOT EXISTS markers(dataset TEXT PRIMARY KEY, sequence INTEGER, recipe TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS dirty(dataset TEXT NOT NULL, z INTEGER NOT NULL, x INTEGER NOT NULL, y INTEGER NOT NULL, PRIMARY KEY(dataset, z, x, y)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS member_rels(kind INTEGER NOT NULL, member INTEGER NOT NULL, rel INTEGER NOT NULL, PRIMARY KEY(kind, member, rel)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS shape_cells(cell INTEGER NOT NULL, id INTEGER NOT NULL, minx REAL NOT NULL, miny REAL NOT NULL, maxx REAL NOT NULL, maxy REAL NOT NULL, zmin INTEGER NOT NULL DEFAULT 0, PRIMARY KEY(cell, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS shape_cells_low(cell INTEGER NOT NULL, id INTEGER NOT NULL, minx REAL NOT NULL, miny REAL NOT NULL, maxx REAL NOT NULL, maxy REAL NOT NULL, zmin INTEGER NOT NULL DEFAULT 0, PRIMARY KEY(cell, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS shape_data(id INTEGER PRIMARY KEY, cell INTEGER NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS dirty_keys(dataset TEXT NOT NULL, kind INTEGER NOT NULL, id INTEGER NOT NULL, PRIMARY KEY(dataset, kind, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS replication_log(sequence INTEGER PRIMARY KEY, url TEXT NOT NULL, sha256 TEXT NOT NULL, timestamp TEXT NOT NULL, applied_at_ns INTEGER NOT NULL);
";

/// One applied HTTP diff: sequence, URL, sha256 of the body, the state's
/// timestamp, when it was applied (ns since the epoch).
pub type ReplicationLogRow = (i64, String, String, String, i64);

/// The writer lease's name in the store's `leases` table.
pub const WRITER_LEASE: &str = "osm-writer";

/// How long a writer lease lasts without renewal, in seconds. The holder's
/// heartbeat renews it every third of that; a holder that paused longer
/// loses it and its next write is refused.
pub const WRITER_LEASE_DURATION_S: i64 = 60;

/// How long `--wait` waits for the writer lease, in lease durations.
pub const WRITER_WAIT_LEASES_MAX: u32 = 3;

/// SQLite's page cache for the store, in KiB: bounds the memory the store
/// may hold beyond the operating system's page cache. Small on purpose:
/// each page it holds is fresh memory a short-lived command must fault in
/// (on the 2-core VM of the benchmarks, up to ~10 us a page), while a page
/// read again costs one copy from the operating system's cache. A
/// minutely diff on the 100M-node store reads and writes ~13k distinct
/// pages: with 64 MiB it faulted them all in and was ~0.14 s slower than
/// with 16 MiB, for the same 36 MB written to the WAL (no dirty page
/// spilled twice). An import sets its own (`[osm] cache_mb`).
pub const STORE_CACHE_KIB: i64 = 16 * 1024;

/// SQLite's page cache of a store made [`Store::beside`] another, in KiB.
/// Smaller than [`STORE_CACHE_KIB`]: work beside (a search or aggregates
/// drain) reads pages scattered over the store about once each, so a
/// page kept costs a fresh page faulted in and saves nothing. On the
/// 100M-node store's minutely diff, two drains beside the tiles drain
/// faulted in ~30k pages with 16 MiB each and ~22k with 2 MiB (0.5 MiB:
/// no fewer), and finished ~0.05 s sooner.
pub const BESIDE_CACHE_KIB: i64 = 2 * 1024;

/// The write-ahead log's size past which a commit starts a checkpoint
/// beside it: SQLite's own default (1,000 pages of 4 KiB).
pub const CHECKPOINT_WAL_BYTES: u64 = 4 * 1024 * 1024;

/// The write-ahead log's size past which the next write first waits for
/// the running checkpoint: bounds the log while commits outrun
/// checkpoints (a replication catch-up).
pub const WAL_BYTES_MAX: u64 = 256 * 1024 * 1024;

fn wal_path(db: &Path) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push("-wal");
    PathBuf::from(s)
}

/// A connection to a published store file: busy timeout, commits fsynced
/// (`synchronous = FULL`), a page cache of `cache_kib`, and no
/// autocheckpoint (a large commit starts a checkpoint on a connection of
/// its own instead, `Store::checkpoint_beside`).
fn connect(path: &Path, cache_kib: i64) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(30))?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "cache_size", -cache_kib)?;
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    Ok(conn)
}

/// The writer lease this process holds: its fence, and the heartbeat that
/// renews it, shared with the stores made beside its holder.
struct HeldLease {
    fence: highwater_store::Fence,
    /// `None` once the holder gave the lease back.
    heartbeat: std::sync::Mutex<Option<highwater_store::lease::Heartbeat>>,
}

impl HeldLease {
    /// Lost to another writer, or given back by the holder: either way
    /// nothing more is written under it.
    fn lost(&self) -> bool {
        self.heartbeat
            .lock()
            .expect("the lease's lock is never poisoned")
            .as_ref()
            .is_none_or(|h| h.lost())
    }

    /// Stops the heartbeat (so nothing renews the lease after it is given
    /// back) and says which fence to release.
    fn give_back(&self) -> highwater_store::Fence {
        drop(
            self.heartbeat
                .lock()
                .expect("the lease's lock is never poisoned")
                .take(),
        );
        self.fence.clone()
    }
}

/// At most one checkpoint on a thread and connection of its own.
#[derive(Default)]
struct Checkpointer(RefCell<Option<std::thread::JoinHandle<rusqlite::Result<()>>>>);

impl Checkpointer {
    fn start(&self, path: PathBuf) {
        let mut slot = self.0.borrow_mut();
        assert!(slot.is_none(), "one checkpoint at a time");
        *slot = Some(std::thread::spawn(move || {
            let c = connect(&path, BESIDE_CACHE_KIB)?;
            // PASSIVE: never waits for readers or writers; what it cannot
            // fold now, the next one does. Busy means another connection
            // is checkpointing: that is the same work done.
            match c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(0)) {
                Ok(_) => Ok(()),
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if e.code == rusqlite::ErrorCode::DatabaseBusy =>
                {
                    Ok(())
                }
                Err(e) => Err(e),
            }
        }));
    }

    fn running(&self) -> bool {
        self.0.borrow().is_some()
    }

    /// Joins a finished checkpoint, if any; a running one is left.
    fn reap(&self) -> rusqlite::Result<()> {
        if self.0.borrow().as_ref().is_some_and(|h| h.is_finished()) {
            return self.join();
        }
        Ok(())
    }

    /// Waits for the running checkpoint, if any, and returns its result.
    fn join(&self) -> rusqlite::Result<()> {
        match self.0.borrow_mut().take() {
            None => Ok(()),
            Some(h) => h.join().expect("the checkpoint thread does not panic"),
        }
    }
}

/// The meta key under which a search or aggregates dataset records the
/// recipe it was last rebuilt with.
pub fn built_recipe_key(dataset: &str) -> String {
    format!("built_recipe:{dataset}")
}

/// Which dirty tiles a drain takes first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainOrder {
    /// Coarse tiles first: they are seen by the most people.
    LowZoomFirst,
    /// Tiles dirtied by the most diffs first.
    MostEdited,
}

/// What the shapes index keeps of an element: its bounding box (min x, min
/// y, max x, max y), opaque bytes (its feature), and the lowest zoom any
/// tile dataset shows it at ([`ZOOM_NONE`]: none does). Below
/// [`LOW_ZOOM`] it is also in the low-zoom index.
pub type ShapeRow<'a> = ((f64, f64, f64, f64), &'a [u8], u8);

/// A row for [`Writer::insert_shapes`]: the element, then as [`ShapeRow`].
pub type ShapeInsert<'a> = ((MemberKind, i64), (f64, f64, f64, f64), &'a [u8], u8);

/// Below this zoom a tile's candidates come from the low-zoom index (the
/// features that show below it): at z10 a tile is about 40 km wide, and a
/// base map shows only major roads, water, forests, boundaries and places
/// there.
pub const LOW_ZOOM: u8 = 10;

/// A shape's lowest zoom when no tile dataset shows it at all: it is a
/// candidate of no tile (search and aggregates still find it).
pub const ZOOM_NONE: u8 = u8::MAX;

/// A row of the shapes index as a build or a cut lists it: the element,
/// its bounding box and its lowest zoom.
pub type ShapeBox = ((MemberKind, i64), (f64, f64, f64, f64), u8);

fn shape_box_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ShapeBox> {
    Ok((
        unshape_id(r.get(0)?),
        (r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?),
        r.get::<_, i64>(5)?.clamp(0, i64::from(ZOOM_NONE)) as u8,
    ))
}

/// An element's key in the shapes index: the id with its type in the low
/// two bits.
fn shape_id(kind: MemberKind, id: i64) -> i64 {
    (id << 2) | kind_code(kind)
}

/// Rings as bytes, exactly: per ring its point count (u32), then each
/// point's x and y (f64), little-endian. Text would round the floats, and an
/// area whose stored shape differs from its real one looks changed.
pub fn rings_blob(rings: &[Vec<(f64, f64)>]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in rings {
        out.extend_from_slice(&(r.len() as u32).to_le_bytes());
        for p in r {
            out.extend_from_slice(&p.0.to_le_bytes());
            out.extend_from_slice(&p.1.to_le_bytes());
        }
    }
    out
}

pub fn rings_from_blob(b: &[u8]) -> Option<Vec<Vec<(f64, f64)>>> {
    let mut out = Vec::new();
    let mut i = 0;
    let f =
        |i: usize| -> Option<f64> { Some(f64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?)) };
    while i < b.len() {
        let n = u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?) as usize;
        i += 4;
        let mut r = Vec::with_capacity(n);
        for _ in 0..n {
            r.push((f(i)?, f(i + 8)?));
            i += 16;
        }
        out.push(r);
    }
    Some(out)
}

pub fn kind_of(code: i64) -> MemberKind {
    match code {
        0 => MemberKind::Node,
        1 => MemberKind::Way,
        _ => MemberKind::Relation,
    }
}

fn unshape_id(v: i64) -> (MemberKind, i64) {
    let kind = match v & 3 {
        0 => MemberKind::Node,
        1 => MemberKind::Way,
        _ => MemberKind::Relation,
    };
    (kind, v >> 2)
}

/// A dataset's name, marker sequence, recipe id and dirty-set size.
pub type DatasetRow = (String, Option<i64>, String, i64);

pub struct Store {
    pub(crate) conn: Connection,
    pub(crate) path: PathBuf,
    /// The writer lease, once taken: every write transaction checks its
    /// token. Released when the store is dropped.
    writer: Option<Arc<HeldLease>>,
    /// A store made by [`Store::beside`]: it writes under its owner's
    /// lease, and neither takes nor gives back one of its own.
    shares_lease: bool,
    lease_duration_s: i64,
    /// The flat node file, for a store imported with `[osm] flat_nodes`.
    pub(crate) flat: Option<Arc<FlatNodes>>,
    /// The store file's (device, inode) when it was opened: a retired store
    /// still at its path was not replaced, its replace died before the swap.
    opened_as: Option<(u64, u64)>,
    /// Decoded node blocks, kept only inside [`Store::snapshot`] (`cached`
    /// set): outside one, another process may commit between two reads.
    blocks: RefCell<nodeblocks::Cache>,
    cached: Cell<bool>,
    /// The checkpoint folding the write-ahead log into the file beside
    /// the work that follows a large commit ([`Store::checkpoint_beside`]).
    checkpointer: Checkpointer,
}

impl Drop for Store {
    fn drop(&mut self) {
        // Its own connection; joined so the process never exits halfway
        // through a checkpoint it started (harmless, but wasted).
        let _ = self.checkpointer.join();
        if self.shares_lease {
            return;
        }
        if let Some(lease) = self.writer.take() {
            let fence = lease.give_back();
            // No fsync needed (see `lease_writer`).
            let _ = self.conn.pragma_update(None, "synchronous", "NORMAL");
            let _ = highwater_store::lease::release(&self.conn, &fence);
        }
    }
}

pub(crate) fn tags_text(t: &Tags) -> Option<String> {
    (!t.is_empty()).then(|| serde_json::to_string(t).expect("tags serialize"))
}

pub fn kind_code(k: MemberKind) -> i64 {
    match k {
        MemberKind::Node => 0,
        MemberKind::Way => 1,
        MemberKind::Relation => 2,
    }
}

pub(crate) fn refs_blob(refs: &[i64]) -> Vec<u8> {
    refs.iter().flat_map(|r| r.to_le_bytes()).collect()
}

impl Store {
    /// Opens the store in `dir`. A missing or empty store is an error: only
    /// [`Store::create`] (`osm import`) makes one, so a typo in a path never
    /// turns into a fresh, empty store that looks current.
    pub fn open(dir: &Path, ext: &Extension) -> Result<Store, StoreError> {
        Self::open_path(Self::published(dir)?, ext)
    }

    /// The published store file in `dir`: there, and not empty.
    fn published(dir: &Path) -> Result<PathBuf, StoreError> {
        let path = dir.join("store.db");
        match std::fs::metadata(&path) {
            Err(_) => Err(StoreError::Missing {
                dir: dir.to_path_buf(),
            }),
            Ok(m) if m.len() == 0 => Err(StoreError::Empty { path }),
            Ok(_) => Ok(path),
        }
    }

    /// Opens the store in `dir`, creating the folder and an empty store
    /// when there is none: for `import::import` into a store of its own
    /// (tests, library users); `osm import` builds unseen instead.
    pub fn create(dir: &Path, ext: &Extension) -> Result<Store, StoreError> {
        let path = dir.join("store.db");
        if std::fs::metadata(&path).is_ok_and(|m| m.len() == 0) {
            return Err(StoreError::Empty { path });
        }
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Corrupt {
            path: dir.to_path_buf(),
            what: format!("cannot create the store folder: {e}"),
        })?;
        Self::open_path(path, ext)
    }

    /// Opens a new store file that nobody else can see yet, for an import
    /// to fill: no journal and no fsync while it is written, since a crash
    /// leaves only a hidden file that the next import sweeps away.
    /// [`Store::seal`] makes it durable; it is published by renaming.
    pub(crate) fn create_unpublished(path: &Path, ext: &Extension) -> Result<Store, StoreError> {
        let err = |err| StoreError::Sqlite {
            path: path.to_path_buf(),
            err,
        };
        let conn = Connection::open(path).map_err(err)?;
        conn.pragma_update(None, "journal_mode", "OFF")
            .map_err(err)?;
        conn.pragma_update(None, "synchronous", "OFF")
            .map_err(err)?;
        conn.pragma_update(None, "cache_size", -STORE_CACHE_KIB)
            .map_err(err)?;
        init_schema(&conn, ext).map_err(err)?;
        Ok(Store {
            conn,
            path: path.to_path_buf(),
            writer: None,
            shares_lease: false,
            lease_duration_s: WRITER_LEASE_DURATION_S,
            flat: None,
            opened_as: None,
            blocks: Default::default(),
            cached: Cell::new(false),
            checkpointer: Default::default(),
        })
    }

    /// Closes a store made by [`Store::create_unpublished`] and syncs its
    /// file, so that once renamed into place it survives a power cut.
    pub(crate) fn seal(self) -> Result<(), StoreError> {
        let path = self.path.clone();
        let io = |e: std::io::Error| StoreError::Corrupt {
            path: path.clone(),
            what: format!("cannot sync the new store: {e}"),
        };
        let mut me = self;
        // The import's writer lease is given back in the file itself: the
        // drop below would release it on the stand-in connection, leaving a
        // live lease in the published store that this process (a library
        // caller opening the store next) would find held.
        if let Some(lease) = me.writer.take() {
            let fence = lease.give_back();
            let _ = highwater_store::lease::release(&me.conn, &fence);
        }
        let conn = std::mem::replace(
            &mut me.conn,
            Connection::open_in_memory().map_err(|e| StoreError::Sqlite {
                path: path.clone(),
                err: e,
            })?,
        );
        // Published in WAL mode (the mode lives in the file), so the first
        // processes to open it then never race to switch it.
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(|err| StoreError::Sqlite {
                path: path.clone(),
                err,
            })?;
        conn.close().map_err(|(_, err)| StoreError::Sqlite {
            path: path.clone(),
            err,
        })?;
        drop(me);
        std::fs::File::open(&path)
            .and_then(|f| f.sync_all())
            .map_err(io)
    }

    /// Opens the store in `dir` that `osm import --replace` is about to
    /// retire, for its lease, its token and the retirement mark only: its
    /// flat node file is not opened, nor its shapes index rebuilt. A
    /// replace killed after putting its new flat file in place leaves an
    /// old store whose file is no longer its own; `open` refuses that
    /// store (rightly), and the next replace must not.
    pub(crate) fn open_to_replace(dir: &Path, ext: &Extension) -> Result<Store, StoreError> {
        Self::open_with(Self::published(dir)?, false, ext)
    }

    fn open_path(path: PathBuf, ext: &Extension) -> Result<Store, StoreError> {
        Self::open_with(path, true, ext)
    }

    fn open_with(path: PathBuf, nodes: bool, ext: &Extension) -> Result<Store, StoreError> {
        let err = |err| StoreError::Sqlite {
            path: path.clone(),
            err,
        };
        let opened_as = file_id(&path);
        let conn = connect(&path, STORE_CACHE_KIB).map_err(err)?;
        // Stores published before `seal` set WAL switch on first open; two
        // processes opening such a store at once must not fail.
        highwater_store::sqlite::ensure_wal(&conn, std::time::Duration::from_secs(30))
            .map_err(err)?;
        let rtree_shapes = init_schema(&conn, ext).map_err(err)?;
        let flat = if nodes {
            open_flat(&conn, &path)?
        } else {
            None
        };
        let mut store = Store {
            conn,
            path,
            writer: None,
            shares_lease: false,
            lease_duration_s: WRITER_LEASE_DURATION_S,
            flat,
            opened_as,
            blocks: Default::default(),
            cached: Cell::new(false),
            checkpointer: Default::default(),
        };
        if rtree_shapes && nodes {
            (ext.rebuild_shapes)(&mut store)?;
        }
        Ok(store)
    }

    /// Sets SQLite's page cache (an import sizes it from `[osm] cache_mb`).
    pub(crate) fn set_cache_kib(&self, kib: i64) -> Result<(), StoreError> {
        self.conn
            .pragma_update(None, "cache_size", -kib)
            .map_err(|e| self.err(e))
    }

    /// The store has no rollback journal (an unpublished import's file):
    /// a failed transaction cannot be undone, only the file discarded.
    pub(crate) fn unjournaled(&self) -> Result<bool, StoreError> {
        let mode: String = self
            .conn
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .map_err(|e| self.err(e))?;
        Ok(mode.eq_ignore_ascii_case("off"))
    }

    /// Folds the write-ahead log into the database file.
    pub fn checkpoint(&self) -> Result<(), StoreError> {
        self.checkpointer.join().map_err(|e| self.err(e))?;
        self.conn
            .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .map_err(|e| self.err(e))
    }

    /// The same store on a connection of its own, for work beside this
    /// one in this process (the drains after an apply, each on its own
    /// thread): it reads its own snapshots, and writes under this store's
    /// writer lease, fenced by the same token, so it writes nothing once
    /// this store has lost the lease or given it back. SQLite serialises
    /// the two's write transactions (each waits up to the busy timeout).
    /// Take the lease on this store first if the work writes.
    pub fn beside(&self) -> Result<Store, StoreError> {
        let conn = connect(&self.path, BESIDE_CACHE_KIB).map_err(|e| self.err(e))?;
        Ok(Store {
            conn,
            path: self.path.clone(),
            writer: self.writer.clone(),
            shares_lease: true,
            lease_duration_s: self.lease_duration_s,
            flat: self.flat.clone(),
            opened_as: self.opened_as,
            blocks: Default::default(),
            cached: Cell::new(false),
            checkpointer: Default::default(),
        })
    }

    /// The store file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sets how long the writer lease lasts without renewal (before it is
    /// taken).
    pub fn set_lease_duration_s(&mut self, s: i64) {
        assert!(s > 0, "a lease lasts a positive time");
        self.lease_duration_s = s;
    }

    /// Takes the store's writer lease (one writer per store): waits for it
    /// with `wait` (up to a few lease durations), takes it over at once
    /// from a dead process of this host, or refuses naming the holder. A
    /// heartbeat renews it until the store is dropped.
    pub fn lease_writer(&mut self, wait: bool) -> Result<(), StoreError> {
        if self.writer.is_some() {
            return Ok(());
        }
        // Made beside a store that held no lease: taking one here would
        // make two writers of one process.
        assert!(
            !self.shares_lease,
            "a store made beside another writes under its lease: take it there first"
        );
        let host = highwater_store::lease::host();
        let pid = std::process::id() as i64;
        let owner = format!("{host}:{pid}:{}", highwater_store::lease::now_ns());
        let duration_ns = self.lease_duration_s * 1_000_000_000;
        let deadline = std::time::Instant::now()
            + std::time::Duration::from_secs(
                (self.lease_duration_s as u64) * u64::from(WRITER_WAIT_LEASES_MAX),
            );
        let path = self.path.clone();
        // Taking and giving back the lease need no fsync of their own: after
        // a crash nobody holds anything, and every write that relies on the
        // lease checks and extends it in its own fully synced transaction.
        let _ = self.conn.pragma_update(None, "synchronous", "NORMAL");
        let conn = &mut self.conn;
        let got = highwater_store::lease::take(
            |at| {
                highwater_store::lease::acquire(
                    conn,
                    WRITER_LEASE,
                    &owner,
                    &host,
                    pid,
                    at,
                    duration_ns,
                )
            },
            wait,
            deadline,
        )
        .map_err(|err| StoreError::Sqlite {
            path: path.clone(),
            err,
        });
        self.conn
            .pragma_update(None, "synchronous", "FULL")
            .map_err(|err| StoreError::Sqlite {
                path: path.clone(),
                err,
            })?;
        match got? {
            Ok(lease) => {
                let fence = highwater_store::Fence {
                    name: WRITER_LEASE.into(),
                    token: lease.token,
                };
                let hb = highwater_store::lease::Heartbeat::start(
                    path.clone(),
                    fence.clone(),
                    duration_ns,
                );
                self.writer = Some(Arc::new(HeldLease {
                    fence,
                    heartbeat: std::sync::Mutex::new(Some(hb)),
                }));
                self.recover_flat()
            }
            Err(h) => Err(StoreError::Held {
                path,
                owner: h.owner,
                host: h.host,
                pid: h.pid,
                expires: highwater_core::window::format_rfc3339(h.expires_at_ns / 1000),
            }),
        }
    }

    /// The flat node file, if the store has one.
    pub fn flat_nodes(&self) -> Option<&Path> {
        self.flat.as_deref().map(FlatNodes::path)
    }

    /// Attaches the flat node file an import writes.
    pub(crate) fn attach_flat(&mut self, f: Arc<FlatNodes>) {
        self.flat = Some(f);
    }

    /// Settles an undo log a killed writer left (see [`crate::flatnodes`]):
    /// rolled back if the store did not commit its epoch, dropped if it
    /// did. Run under the writer lease, before anything reads for writing.
    fn recover_flat(&mut self) -> Result<(), StoreError> {
        let Some(flat) = self.flat.clone() else {
            return Ok(());
        };
        let undo = undo_path(flat.path());
        let Ok(log) = std::fs::read(&undo) else {
            return Ok(());
        };
        let committed: u64 = self
            .meta(FLAT_EPOCH_META)?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let bad = || {
            StoreError::Corrupt {
            path: undo.clone(),
            what: "this is not a flat nodes' undo log; the flat node file may hold a killed apply's locations: import the extract again with --replace".into(),
        }
        };
        if log.len() < 8 || &log[..8] != UNDO_MAGIC {
            return Err(bad());
        }
        // A log cut short was never complete, so the file was not touched
        // after it (it is fsynced before any slot is written).
        let n = log
            .get(16..24)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize);
        let complete = n.is_some_and(|n| log.len() == 24 + 16 * n);
        if complete {
            let epoch = u64::from_le_bytes(log[8..16].try_into().expect("8 bytes"));
            if committed < epoch {
                for rec in log[24..].chunks_exact(16) {
                    let id = i64::from_le_bytes(rec[..8].try_into().expect("8 bytes"));
                    flat.put_raw(id, rec[8..].try_into().expect("8 bytes"))?;
                }
                flat.sync()?;
            }
        }
        std::fs::remove_file(&undo).map_err(|e| StoreError::Corrupt {
            path: undo.clone(),
            what: format!("cannot remove the settled undo log: {e}"),
        })?;
        Ok(())
    }

    /// Makes the writer lease's next token larger than `used` (for a store
    /// replacing another, or made beside outputs an older store wrote): a
    /// released lease at token `used`, which the next writer takes over
    /// with `used + 1`. Never lowers a token.
    pub(crate) fn continue_tokens(&mut self, used: i64) -> Result<(), StoreError> {
        if used <= 0 {
            return Ok(());
        }
        self.conn
            .execute(
                "INSERT INTO leases(name, owner, host, pid, acquired_at_ns, expires_at_ns, token)
                 VALUES(?1, 'osm import', ?2, ?3, ?4, 0, ?5)
                 ON CONFLICT(name) DO UPDATE SET token = max(token, excluded.token), expires_at_ns = 0",
                params![
                    WRITER_LEASE,
                    highwater_store::lease::host(),
                    std::process::id() as i64,
                    highwater_store::lease::now_ns(),
                    used
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// The token of the writer lease this process holds, if it holds one.
    pub fn writer_token(&self) -> Option<i64> {
        self.writer.as_ref().map(|l| l.fence.token)
    }

    /// Whether this process still holds the writer lease (its token is the
    /// current one and its heartbeat found no other): for steps outside a
    /// store transaction, such as swapping in a rebuilt file.
    pub fn check_fence(&self) -> Result<(), StoreError> {
        let path = self.path.clone();
        let Some(lease) = &self.writer else {
            return Err(StoreError::Fenced { path });
        };
        let holds = highwater_store::lease::holds(&self.conn, &lease.fence).map_err(|err| {
            StoreError::Sqlite {
                path: path.clone(),
                err,
            }
        })?;
        if lease.lost() || !holds {
            return Err(StoreError::Fenced { path });
        }
        Ok(())
    }

    /// The writer lease as it stands (whoever holds it), for status.
    pub fn writer_lease(&self) -> Result<Option<highwater_store::Lease>, StoreError> {
        highwater_store::lease::current(&self.conn, WRITER_LEASE).map_err(|e| self.err(e))
    }

    /// The store's generation: how many write transactions that change OSM
    /// data (imports and diffs) have committed. Dirty rows record theirs, so
    /// a rebuild or drain that read generation G removes only rows of G or
    /// older: a diff applied after its read stays dirty.
    pub fn generation(&self) -> Result<i64, StoreError> {
        Ok(self
            .meta("generation")?
            .and_then(|g| g.parse().ok())
            .unwrap_or(0))
    }

    /// Whether the store holds no element and follows no sequence.
    pub fn is_empty(&self) -> Result<bool, StoreError> {
        let n: i64 = self
            .conn
            .query_row(
                "SELECT (SELECT count(*) FROM (SELECT 1 FROM node_blocks LIMIT 1))
                      + (SELECT count(*) FROM (SELECT 1 FROM ways LIMIT 1))
                      + (SELECT count(*) FROM (SELECT 1 FROM relations LIMIT 1))
                      + (SELECT count(*) FROM meta WHERE key IN ('sequence', 'imported'))",
                [],
                |r| r.get(0),
            )
            .map_err(|e| self.err(e))?;
        Ok(n == 0)
    }

    /// An SQLite error of this store, naming its file.
    pub fn err(&self, err: rusqlite::Error) -> StoreError {
        StoreError::Sqlite {
            path: self.path.clone(),
            err,
        }
    }

    /// The connection, for the datasets' own tables (created with the
    /// store, [`Extension::tables`]): they read them through it.
    pub fn conn(&self) -> &Connection {
        &self.conn
    }

    /// Runs `f` in one write transaction and rolls it back: a dry run.
    pub fn rehearse<T>(
        &mut self,
        f: impl FnOnce(&mut Writer<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.rehearse_then(f)
    }

    /// [`Store::rehearse`] for callers with their own error type.
    pub fn rehearse_then<T, E: From<StoreError>>(
        &mut self,
        f: impl FnOnce(&mut Writer<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|err| StoreError::Sqlite {
                path: path.clone(),
                err,
            })?;
        let mut w = Writer {
            tx,
            path,
            flat: self.flat.clone(),
            pending: BTreeMap::new(),
            blocks: Default::default(),
        };
        // Dropping the transaction without commit rolls it back.
        f(&mut w)
    }

    /// Per dataset: its marker (sequence, recipe) and dirty-set size.
    pub fn datasets(&self) -> Result<Vec<DatasetRow>, StoreError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT m.dataset, m.sequence, m.recipe,
                        (SELECT count(*) FROM dirty d WHERE d.dataset = m.dataset)
                 FROM markers m ORDER BY 1",
            )
            .map_err(|e| self.err(e))?;
        let v = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .map_err(|e| self.err(e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.err(e))?;
        Ok(v)
    }

    /// The elements whose shape's bounding box meets the box (world
    /// coordinates). With a zoom, only those some tile dataset shows at
    /// that zoom or below it (their lowest zoom, [`ShapeRow`], is at most
    /// `zoom`): a superset of the features that show in a tile of that
    /// zoom; below [`LOW_ZOOM`] read from the low-zoom index (a second,
    /// smaller one: a low-zoom tile covers much, and shows little of it).
    /// Without, every element (search and aggregates).
    pub fn shapes_in(
        &self,
        bbox: (f64, f64, f64, f64),
        zoom: Option<u8>,
    ) -> Result<Vec<(MemberKind, i64)>, StoreError> {
        let mut out: Vec<(MemberKind, i64)> = self
            .shape_rows_in(bbox, zoom)?
            .into_iter()
            .map(|(k, _, _)| k)
            .collect();
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// [`Store::shapes_in`] with each element's bounding box and lowest
    /// zoom, unordered.
    pub fn shape_rows_in(
        &self,
        bbox: (f64, f64, f64, f64),
        zoom: Option<u8>,
    ) -> Result<Vec<ShapeBox>, StoreError> {
        let (minx, miny, maxx, maxy) = bbox;
        let sql = match zoom {
            Some(z) if z < LOW_ZOOM => {
                "SELECT id, minx, miny, maxx, maxy, zmin FROM shape_cells_low WHERE cell BETWEEN ?1 AND ?2 AND zmin <= ?3"
            }
            _ => {
                "SELECT id, minx, miny, maxx, maxy, zmin FROM shape_cells WHERE cell BETWEEN ?1 AND ?2 AND zmin <= ?3"
            }
        };
        // Every row's zmin is at most ZOOM_NONE.
        let zmax = i64::from(zoom.unwrap_or(ZOOM_NONE));
        let mut st = self.conn.prepare_cached(sql).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for (a, b) in crate::cells::ranges(bbox) {
            let rows = st
                .query_map([a, b, zmax], shape_box_row)
                .map_err(|e| self.err(e))?;
            for r in rows {
                let (k, (x0, y0, x1, y1), zmin) = r.map_err(|e| self.err(e))?;
                if x1 >= minx && x0 <= maxx && y1 >= miny && y0 <= maxy {
                    out.push((k, (x0, y0, x1, y1), zmin));
                }
            }
        }
        Ok(out)
    }

    /// How many elements of the shapes index some tile dataset shows.
    pub fn shapes_shown(&self) -> Result<usize, StoreError> {
        self.conn
            .query_row(
                "SELECT count(*) FROM shape_cells WHERE zmin < ?1",
                [i64::from(ZOOM_NONE)],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as usize)
            .map_err(|e| self.err(e))
    }

    /// Every row of the shapes index shown at some zoom (its lowest zoom
    /// below [`ZOOM_NONE`]; with `low_only`, below [`LOW_ZOOM`]), in the
    /// index's order, handed to `f` one by one: a build lists its tiles
    /// from them without holding them.
    pub fn scan_shapes(
        &self,
        low_only: bool,
        mut f: impl FnMut(ShapeBox),
    ) -> Result<(), StoreError> {
        let sql = match low_only {
            true => "SELECT id, minx, miny, maxx, maxy, zmin FROM shape_cells_low WHERE zmin < ?1",
            false => "SELECT id, minx, miny, maxx, maxy, zmin FROM shape_cells WHERE zmin < ?1",
        };
        let mut st = self.conn.prepare(sql).map_err(|e| self.err(e))?;
        let rows = st
            .query_map([i64::from(ZOOM_NONE)], shape_box_row)
            .map_err(|e| self.err(e))?;
        for r in rows {
            f(r.map_err(|e| self.err(e))?);
        }
        Ok(())
    }

    /// The elements a reverse index (`sql`: a SELECT of kind and id,
    /// bound to dataset, area kind and area id) lists for an area.
    pub fn keys_of_area(
        &self,
        sql: &str,
        dataset: &str,
        area: (MemberKind, i64),
    ) -> Result<Vec<(MemberKind, i64)>, StoreError> {
        let mut st = self.conn.prepare_cached(sql).map_err(|e| self.err(e))?;
        let rows = st
            .query_map(params![dataset, kind_code(area.0), area.1], |r| {
                Ok((kind_of(r.get(0)?), r.get(1)?))
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    /// The bytes stored with an element's shape (the features module's
    /// encoding of its feature; opaque here).
    pub fn shape_data(&self, kind: MemberKind, id: i64) -> Result<Option<Vec<u8>>, StoreError> {
        shape_data(&self.conn, kind, id).map_err(|e| self.err(e))
    }

    /// An element's row in the shapes index, as [`Store::shape_rows_in`]
    /// would list it (its bounding box and lowest zoom), with its bytes:
    /// what a tile patch needs to decide, exactly as a full cut's candidate
    /// query would, whether the element is a candidate of a tile.
    pub fn shape_entry(
        &self,
        kind: MemberKind,
        id: i64,
    ) -> Result<Option<(ShapeBox, Vec<u8>)>, StoreError> {
        self.conn
            .prepare_cached(
                "SELECT c.id, c.minx, c.miny, c.maxx, c.maxy, c.zmin, d.data
                 FROM shape_data d JOIN shape_cells c ON c.cell = d.cell AND c.id = d.id
                 WHERE d.id = ?1",
            )
            .and_then(|mut st| {
                st.query_row([shape_id(kind, id)], |r| Ok((shape_box_row(r)?, r.get(6)?)))
                    .optional()
            })
            .map_err(|e| self.err(e))
    }

    /// Up to `max` dirty tiles of a dataset, in the order a drain takes them.
    pub fn dirty_tiles(
        &self,
        dataset: &str,
        order: DrainOrder,
        max: usize,
    ) -> Result<Vec<highwater_core::tile::Tile>, StoreError> {
        let sql = match order {
            DrainOrder::LowZoomFirst => {
                "SELECT z, x, y FROM dirty WHERE dataset = ?1 ORDER BY z, x, y LIMIT ?2"
            }
            DrainOrder::MostEdited => {
                "SELECT z, x, y FROM dirty WHERE dataset = ?1 ORDER BY hits DESC, z, x, y LIMIT ?2"
            }
        };
        let mut st = self.conn.prepare(sql).map_err(|e| self.err(e))?;
        let rows = st
            .query_map(params![dataset, max.min(i64::MAX as usize) as i64], |r| {
                Ok(highwater_core::tile::Tile {
                    z: r.get(0)?,
                    x: r.get(1)?,
                    y: r.get(2)?,
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    /// The number of dirty tiles of a dataset.
    pub fn dirty_count(&self, dataset: &str) -> Result<i64, StoreError> {
        self.conn
            .query_row(
                "SELECT count(*) FROM dirty WHERE dataset = ?1",
                [dataset],
                |r| r.get(0),
            )
            .map_err(|e| self.err(e))
    }

    /// Tagged elements whose tags text contains `fragment` (JSON, e.g.
    /// `"boundary":"administrative"`): a cheap pre-filter, callers check the
    /// parsed tags.
    pub fn tagged_like(&self, fragment: &str) -> Result<Vec<(MemberKind, i64)>, StoreError> {
        let pattern = format!("%{}%", fragment.replace(['%', '_'], ""));
        let mut out = Vec::new();
        for (kind, sql) in [
            (
                MemberKind::Node,
                "SELECT id FROM node_tags WHERE tags LIKE ?1 ORDER BY id",
            ),
            (
                MemberKind::Way,
                "SELECT id FROM ways WHERE tags LIKE ?1 ORDER BY id",
            ),
            (
                MemberKind::Relation,
                "SELECT id FROM relations WHERE tags LIKE ?1 ORDER BY id",
            ),
        ] {
            let mut st = self.conn.prepare_cached(sql).map_err(|e| self.err(e))?;
            let ids = st
                .query_map([&pattern], |r| r.get::<_, i64>(0))
                .map_err(|e| self.err(e))?;
            for id in ids {
                out.push((kind, id.map_err(|e| self.err(e))?));
            }
        }
        Ok(out)
    }

    /// The elements a diff touched since a dataset last drained.
    pub fn dirty_keys(&self, dataset: &str) -> Result<BTreeSet<(MemberKind, i64)>, StoreError> {
        let mut st = self
            .conn
            .prepare_cached("SELECT kind, id FROM dirty_keys WHERE dataset = ?1")
            .map_err(|e| self.err(e))?;
        let rows = st
            .query_map([dataset], |r| Ok((kind_of(r.get(0)?), r.get(1)?)))
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    /// Runs `f` inside one read transaction: every read sees the same
    /// snapshot, and SQLite takes its file lock once instead of once per
    /// statement (a full rebuild reads every tagged element).
    pub fn snapshot<T>(
        &self,
        f: impl FnOnce(&Store) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        // Nested: the outer snapshot already holds one.
        if !self.conn.is_autocommit() {
            return f(self);
        }
        self.conn
            .execute_batch("BEGIN DEFERRED")
            .map_err(|e| self.err(e))?;
        // Nothing commits under a read transaction: the blocks read
        // during it stay true until it ends.
        self.cached.set(true);
        let out = f(self);
        self.cached.set(false);
        self.blocks.borrow_mut().clear();
        let end = if out.is_ok() { "COMMIT" } else { "ROLLBACK" };
        self.conn.execute_batch(end).map_err(|e| self.err(e))?;
        out
    }

    /// Runs `f` in one write transaction, under the writer lease (taken
    /// now, without waiting, if this process does not hold it yet). The
    /// transaction commits only while the lease's token is current.
    pub fn write<T>(
        &mut self,
        f: impl FnOnce(&mut Writer<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.write_then(f)
    }

    /// [`Store::write`] for callers with their own error type.
    pub fn write_then<T, E: From<StoreError>>(
        &mut self,
        f: impl FnOnce(&mut Writer<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        self.checkpoint_settled()?;
        let mut recover = false;
        let r = self.write_inner(f, &mut recover);
        // The transaction did not commit after the flat file was written:
        // roll the file back now, from the undo log.
        if recover {
            self.recover_flat()?;
        }
        let out = r?;
        self.checkpoint_beside();
        Ok(out)
    }

    fn write_inner<T, E: From<StoreError>>(
        &mut self,
        f: impl FnOnce(&mut Writer<'_>) -> Result<T, E>,
        recover: &mut bool,
    ) -> Result<T, E> {
        self.lease_writer(false)?;
        let path = self.path.clone();
        let lease = self.writer.as_ref().expect("the lease was just taken");
        let fence = &lease.fence;
        if lease.lost() {
            return Err(StoreError::Fenced { path }.into());
        }
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|err| StoreError::Sqlite {
                path: path.clone(),
                err,
            })?;
        let holds =
            highwater_store::lease::holds(&tx, fence).map_err(|err| StoreError::Sqlite {
                path: path.clone(),
                err,
            })?;
        if !holds {
            return Err(StoreError::Fenced { path }.into());
        }
        // Each write extends the lease too, so a long run of writes never
        // leaves it to the heartbeat alone.
        highwater_store::lease::renew(
            &tx,
            fence,
            highwater_store::lease::now_ns(),
            self.lease_duration_s * 1_000_000_000,
        )
        .map_err(|err| StoreError::Sqlite {
            path: path.clone(),
            err,
        })?;
        let retired: Option<String> = tx
            .query_row("SELECT value FROM meta WHERE key = 'retired'", [], |r| {
                r.get(0)
            })
            .optional()
            .map_err(|err| StoreError::Sqlite {
                path: path.clone(),
                err,
            })?;
        if let Some(why) = retired {
            let what = if self.opened_as.is_some() && file_id(&path) == self.opened_as {
                "an `osm import --replace` retired this store and died before it swapped its new one in; run `osm import --replace` again".to_string()
            } else {
                format!("this store was {why} while this command waited; run it again")
            };
            return Err(StoreError::Corrupt { path, what }.into());
        }
        let mut w = Writer {
            tx,
            path: path.clone(),
            flat: self.flat.clone(),
            pending: BTreeMap::new(),
            blocks: Default::default(),
        };
        let out = f(&mut w)?;
        let flushed = w.flush_flat()?;
        let committed = {
            let Writer {
                tx,
                flat,
                pending,
                path: wpath,
                blocks,
            } = w;
            drop((flat, pending, wpath, blocks));
            tx.commit()
        };
        if flushed {
            // Committed: the log is settled; not: the caller rolls back.
            match committed {
                Ok(()) => {
                    if let Some(f) = &self.flat {
                        let _ = std::fs::remove_file(undo_path(f.path()));
                    }
                }
                Err(_) => *recover = true,
            }
        }
        committed.map_err(|err| StoreError::Sqlite { path, err })?;
        Ok(out)
    }

    /// After a commit: once the write-ahead log holds
    /// [`CHECKPOINT_WAL_BYTES`], folds it into the store file on a thread
    /// and connection of its own, so the work after the commit (the
    /// drains after an apply) runs while the checkpoint writes and
    /// fsyncs. A minutely diff on the 100M-node store commits ~36 MB of
    /// WAL; its checkpoint (the same again to the file, then an fsync of
    /// ~0.1 s) used to run inside the commit. Durability is the commit's
    /// (the WAL is fsynced, `synchronous = FULL`); the checkpoint only
    /// bounds the WAL. One runs at a time.
    fn checkpoint_beside(&self) {
        if self.checkpointer.running() {
            return;
        }
        if std::fs::metadata(wal_path(&self.path)).map_or(0, |m| m.len()) >= CHECKPOINT_WAL_BYTES {
            self.checkpointer.start(self.path.clone());
        }
    }

    /// Before a write: the finished checkpoint's result (a failed one
    /// refuses the write, which then has written nothing); past
    /// [`WAL_BYTES_MAX`] the running one is waited for, so the WAL stays
    /// bounded while commits outrun checkpoints.
    fn checkpoint_settled(&self) -> Result<(), StoreError> {
        self.checkpointer.reap().map_err(|e| self.err(e))?;
        if self.checkpointer.running()
            && std::fs::metadata(wal_path(&self.path)).map_or(0, |m| m.len()) >= WAL_BYTES_MAX
        {
            self.checkpointer.join().map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    pub fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.conn
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()
            .map_err(|e| self.err(e))
    }

    /// The newest `limit` diffs fetched over HTTP and applied: sequence,
    /// URL, sha256 of the body, state timestamp, when applied (ns).
    pub fn replication_log(&self, limit: usize) -> Result<Vec<ReplicationLogRow>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT sequence, url, sha256, timestamp, applied_at_ns FROM replication_log
                 ORDER BY sequence DESC LIMIT ?1",
            )
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([limit as i64], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.err(e))
    }

    pub fn node(&self, id: i64) -> Result<Option<Node>, StoreError> {
        read_node(&self.conn, self.cache(), self.locs(), id).map_err(|e| self.err(e))
    }

    /// The block cache, inside a snapshot.
    fn cache(&self) -> Option<&RefCell<nodeblocks::Cache>> {
        self.cached.get().then_some(&self.blocks)
    }

    fn locs(&self) -> Locs<'_> {
        Locs {
            flat: self.flat.as_deref(),
            pending: None,
        }
    }

    pub fn way(&self, id: i64) -> Result<Option<Way>, StoreError> {
        read_way(&self.conn, id).map_err(|e| self.err(e))
    }

    pub fn relation(&self, id: i64) -> Result<Option<Relation>, StoreError> {
        read_relation(&self.conn, id).map_err(|e| self.err(e))
    }

    /// The ways that use a node.
    pub fn ways_of_node(&self, node: i64) -> Result<Vec<i64>, StoreError> {
        ways_of_node(&self.conn, self.cache(), node).map_err(|e| self.err(e))
    }

    /// The relations that have an element as a member.
    pub fn relations_of(&self, kind: MemberKind, id: i64) -> Result<Vec<i64>, StoreError> {
        relations_of(&self.conn, kind, id).map_err(|e| self.err(e))
    }

    /// Every element, ordered by type and id: for exports and comparisons.
    pub fn export(&self, mut sink: impl FnMut(Element)) -> Result<(), StoreError> {
        {
            let mut st = self
                .conn
                .prepare("SELECT first, data FROM node_blocks ORDER BY first")
                .map_err(|e| self.err(e))?;
            let blocks = st
                .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)))
                .map_err(|e| self.err(e))?;
            for b in blocks {
                let (first, data) = b.map_err(|e| self.err(e))?;
                let entries = nodeblocks::decode(first, &data)
                    .ok_or_else(|| self.err(corrupt_block(first)))?;
                for e in entries {
                    if let Some(n) = node_of(&self.conn, self.locs(), e).map_err(|e| self.err(e))? {
                        sink(Element::Node(n));
                    }
                }
            }
        }
        for sql in [
            "SELECT id FROM ways ORDER BY id",
            "SELECT id FROM relations ORDER BY id",
        ] {
            let mut st = self.conn.prepare(sql).map_err(|e| self.err(e))?;
            let ids: Vec<i64> = st
                .query_map([], |r| r.get(0))
                .map_err(|e| self.err(e))?
                .collect::<Result<_, _>>()
                .map_err(|e| self.err(e))?;
            for id in ids {
                let e = if sql.contains("ways") {
                    self.way(id)?.map(Element::Way)
                } else {
                    self.relation(id)?.map(Element::Relation)
                };
                sink(e.expect("listed ids exist"));
            }
        }
        Ok(())
    }
}

fn parse_tags(t: Option<String>) -> Tags {
    t.and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default()
}

/// A node block that does not decode: named by its first id.
fn corrupt_block(first: i64) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(
        0,
        rusqlite::types::Type::Blob,
        format!("node block {first} is not a node block (damaged store: import the extract again with --replace)").into(),
    )
}

/// The block that holds `id`'s entry if there is one: the last block
/// starting at or before it.
fn block_of(c: &Connection, id: i64) -> rusqlite::Result<Option<(i64, Vec<u8>)>> {
    c.prepare_cached(
        "SELECT first, data FROM node_blocks WHERE first <= ?1 ORDER BY first DESC LIMIT 1",
    )?
    .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
    .optional()
}

/// The entry of node `id`, from `cache` when it holds the block, else
/// from the store (and then the decoded block kept in `cache`).
fn node_entry(
    c: &Connection,
    cache: Option<&RefCell<nodeblocks::Cache>>,
    id: i64,
) -> rusqlite::Result<Option<Entry>> {
    if let Some(hit) = cache.and_then(|k| k.borrow().get(id).map(|e| e.cloned())) {
        return Ok(hit);
    }
    let Some((first, data)) = block_of(c, id)? else {
        return Ok(None);
    };
    let Some(cache) = cache else {
        return nodeblocks::find(first, &data, id).ok_or_else(|| corrupt_block(first));
    };
    let entries = nodeblocks::decode(first, &data).ok_or_else(|| corrupt_block(first))?;
    let e = entries
        .binary_search_by_key(&id, |e| e.id)
        .ok()
        .map(|p| entries[p].clone());
    cache.borrow_mut().put(first, entries);
    Ok(e)
}

/// The node an entry describes, with its tags; none for an entry that only
/// records ways through a node the store does not hold.
fn node_of(c: &Connection, locs: Locs<'_>, e: Entry) -> rusqlite::Result<Option<Node>> {
    let loc = if e.flat { locs.get(e.id)? } else { e.loc };
    let Some((lat, lon)) = loc else {
        return Ok(None);
    };
    let tags = if e.tagged {
        c.prepare_cached("SELECT tags FROM node_tags WHERE id = ?1")?
            .query_row([e.id], |r| r.get(0))
            .optional()?
    } else {
        None
    };
    Ok(Some(Node {
        id: e.id,
        lat_e7: Some(lat),
        lon_e7: Some(lon),
        tags: parse_tags(tags),
    }))
}

fn read_node(
    c: &Connection,
    cache: Option<&RefCell<nodeblocks::Cache>>,
    locs: Locs<'_>,
    id: i64,
) -> rusqlite::Result<Option<Node>> {
    match node_entry(c, cache, id)? {
        Some(e) => node_of(c, locs, e),
        None => Ok(None),
    }
}

/// A file's (device, inode), if it can be looked at.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The undo log's first bytes.
const UNDO_MAGIC: &[u8; 8] = b"hwundo01";

/// Opens the flat node file a store names, checking it is this store's.
fn open_flat(conn: &Connection, store: &Path) -> Result<Option<Arc<FlatNodes>>, StoreError> {
    let meta = |k: &str| -> Result<Option<String>, StoreError> {
        conn.query_row("SELECT value FROM meta WHERE key = ?1", [k], |r| r.get(0))
            .optional()
            .map_err(|err| StoreError::Sqlite {
                path: store.to_path_buf(),
                err,
            })
    };
    let Some(path) = meta(FLAT_NODES_META)? else {
        return Ok(None);
    };
    let path = PathBuf::from(path);
    let f = FlatNodes::open_existing(&path).map_err(|e| StoreError::Corrupt {
        path: path.clone(),
        what: format!("the flat node file of OSM store {} cannot be opened ({e}); restore it, or import the extract again with --replace", store.display()),
    })?;
    let want: u64 = meta(FLAT_TOKEN_META)?
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let have = f.token()?;
    if have != want {
        return Err(StoreError::Corrupt {
            path,
            what: format!(
                "this flat node file belongs to another store (token {have}, OSM store {} wants {want}): another import replaced it. Import the extract again with --replace",
                store.display()
            ),
        });
    }
    Ok(Some(Arc::new(f)))
}

/// Brings a store's schema to this version: its own tables, each dataset
/// kind's, the leases, and the migrations of stores made by earlier
/// versions. Every store, new or opened, goes through here, so a published
/// store never lacks a column that the next opener would race to add. True
/// when the shapes index was dropped and must be rebuilt.
fn init_schema(conn: &Connection, ext: &Extension) -> rusqlite::Result<bool> {
    let rtree_shapes = drop_rtree_shapes(conn)?;
    conn.execute_batch(SCHEMA)?;
    for tables in &ext.tables {
        conn.execute_batch(tables)?;
    }
    migrate_node_rows(conn)?;
    // Stores made before dirty tiles counted their edits.
    add_column(conn, "dirty", "hits", "INTEGER NOT NULL DEFAULT 1")?;
    // Stores made before dirty rows recorded the generation that dirtied
    // them.
    add_column(conn, "dirty", "gen", "INTEGER NOT NULL DEFAULT 0")?;
    add_column(conn, "dirty_keys", "gen", "INTEGER NOT NULL DEFAULT 0")?;
    // Stores made before the shapes index kept each shape's lowest zoom:
    // 0 (shows everywhere) keeps every old row a candidate of every tile
    // until the index is rebuilt (its version in `shapes_low` changed).
    add_column(conn, "shape_cells", "zmin", "INTEGER NOT NULL DEFAULT 0")?;
    add_column(
        conn,
        "shape_cells_low",
        "zmin",
        "INTEGER NOT NULL DEFAULT 0",
    )?;
    conn.execute_batch(highwater_store::lease::LEASES_SQL)?;
    scrub_credentials(conn)?;
    Ok(rtree_shapes)
}

/// Stores made before URLs were redacted kept a replication URL's
/// credentials (`user:secret@`) in `replication_log` and the `meta` row of
/// the extract's URL: they are redacted once, with SQLite's secure delete
/// on so the old text is overwritten, and the log checkpointed so no copy
/// stays in the -wal either.
fn scrub_credentials(c: &Connection) -> rusqlite::Result<()> {
    const FIND: &str = "SELECT url FROM replication_log WHERE url LIKE '%://%@%' AND url NOT LIKE '%://***@%'
         UNION SELECT value FROM meta WHERE key = 'replication_url' AND value LIKE '%://%@%' AND value NOT LIKE '%://***@%'";
    let found = |c: &Connection| -> rusqlite::Result<Vec<String>> {
        let mut st = c.prepare(FIND)?;
        let rows = st.query_map([], |r| r.get(0))?;
        rows.collect()
    };
    // A read first: opening a clean store never asks for the write lock.
    if found(c)?.is_empty() {
        return Ok(());
    }
    c.pragma_update(None, "secure_delete", "ON")?;
    let tx = rusqlite::Transaction::new_unchecked(c, rusqlite::TransactionBehavior::Immediate)?;
    for url in found(&tx)? {
        let clean = crate::redact::redact_url(&url);
        tx.execute(
            "UPDATE replication_log SET url = ?2 WHERE url = ?1",
            params![url, clean],
        )?;
        tx.execute(
            "UPDATE meta SET value = ?2 WHERE key = 'replication_url' AND value = ?1",
            params![url, clean],
        )?;
    }
    tx.commit()?;
    c.pragma_update(None, "secure_delete", "OFF")?;
    // Folds the log into the file and truncates it (best effort: a reader
    // may hold it; the next open's checkpoint does it then).
    let _ = c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)");
    Ok(())
}

/// Adds a column a table lacks, once: checked by a read, then again under
/// the write lock, since another process may be adding it too.
fn add_column(c: &Connection, table: &str, column: &str, decl: &str) -> rusqlite::Result<()> {
    let has = |c: &Connection| -> rusqlite::Result<bool> {
        c.query_row(
            &format!("SELECT count(*) FROM pragma_table_info('{table}') WHERE name = ?1"),
            [column],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n > 0)
    };
    if has(c)? {
        return Ok(());
    }
    let tx = rusqlite::Transaction::new_unchecked(c, rusqlite::TransactionBehavior::Immediate)?;
    if !has(&tx)? {
        tx.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))?;
    }
    tx.commit()
}

/// Stores made before the cell-keyed shapes index kept it in R-trees: the
/// index is derived, so it is dropped here and rebuilt from the elements
/// once the store is open. True when that is needed.
fn drop_rtree_shapes(c: &Connection) -> rusqlite::Result<bool> {
    let rtree = |c: &Connection| -> rusqlite::Result<bool> {
        c.query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = 'shapes' AND sql LIKE '%rtree%'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n > 0)
    };
    // A read first: opening a current store never asks for the write lock,
    // which another process's long write may hold.
    if !rtree(c)? {
        return Ok(false);
    }
    let tx = rusqlite::Transaction::new_unchecked(c, rusqlite::TransactionBehavior::Immediate)?;
    if !rtree(&tx)? {
        tx.commit()?;
        return Ok(false);
    }
    tx.execute_batch(
        "DROP TABLE shapes; DROP TABLE IF EXISTS shapes_low; DROP TABLE IF EXISTS shape_data;
         DELETE FROM meta WHERE key IN ('shapes', 'shapes_low');",
    )?;
    tx.commit()?;
    Ok(true)
}

/// Stores made before node blocks kept a row per node (`nodes`) and per
/// node and way (`node_ways`): their content moves into blocks, once, in
/// one transaction, so a store is never half in each form.
fn migrate_node_rows(c: &Connection) -> rusqlite::Result<()> {
    let old = |c: &Connection| -> rusqlite::Result<bool> {
        c.query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'nodes'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n > 0)
    };
    if !old(c)? {
        return Ok(());
    }
    let tx = rusqlite::Transaction::new_unchecked(c, rusqlite::TransactionBehavior::Immediate)?;
    // Another process may have migrated it while this one waited.
    if !old(&tx)? {
        return tx.commit();
    }
    let mut entries: Vec<Entry> = Vec::new();
    {
        let mut st = tx.prepare("SELECT id, lat, lon, tags IS NOT NULL FROM nodes ORDER BY id")?;
        let mut rows = st.query([])?;
        while let Some(r) = rows.next()? {
            entries.push(Entry {
                id: r.get(0)?,
                loc: Some((r.get(1)?, r.get(2)?)),
                tagged: r.get(3)?,
                ways: Vec::new(),
                flat: false,
            });
        }
        let mut st = tx.prepare("SELECT node, way FROM node_ways ORDER BY node, way")?;
        let mut rows = st.query([])?;
        let mut refs: Vec<(i64, i64)> = Vec::new();
        while let Some(r) = rows.next()? {
            refs.push((r.get(0)?, r.get(1)?));
        }
        entries = merge_refs(
            std::mem::take(&mut entries).into_iter(),
            refs.iter().copied(),
        )
        .collect();
    }
    tx.execute_batch(
        "INSERT INTO node_tags(id, tags) SELECT id, tags FROM nodes WHERE tags IS NOT NULL;
         DROP TABLE nodes; DROP TABLE node_ways;",
    )?;
    insert_blocks(&tx, Entries(entries.into_iter()), |_| {})?;
    tx.commit()
}

/// Nodes (ascending ids) joined with (node, way) references sorted by node
/// then way: every node's entry with its ways, and a location-less entry
/// for each referenced node the store does not hold. Streams: an import
/// never holds all entries at once.
pub(crate) fn merge_refs<'a>(
    nodes: impl Iterator<Item = Entry> + 'a,
    refs: impl Iterator<Item = (i64, i64)> + 'a,
) -> impl Iterator<Item = Entry> + 'a {
    let mut nodes = nodes.peekable();
    let mut refs = refs.peekable();
    std::iter::from_fn(move || {
        let next_ref = refs.peek().map(|p| p.0);
        let mut e = match (nodes.peek().map(|n| n.id), next_ref) {
            (None, None) => return None,
            (Some(n), Some(f)) if f < n => Entry {
                id: f,
                ..Entry::default()
            },
            (Some(_), _) => nodes.next().expect("peeked"),
            (None, Some(f)) => Entry {
                id: f,
                ..Entry::default()
            },
        };
        while let Some(&(node, way)) = refs.peek() {
            if node != e.id {
                break;
            }
            if e.ways.last() != Some(&way) {
                e.ways.push(way);
            }
            refs.next();
        }
        Some(e)
    })
}

/// An import's rows, encoded: node tags (JSON), ways (refs blob, tags
/// JSON), relations.
#[derive(Default)]
pub(crate) struct BulkRows {
    pub node_tags: Vec<(i64, String)>,
    pub ways: Vec<(i64, Vec<u8>, Option<String>)>,
    pub relations: Vec<Relation>,
}

/// Rows one bulk INSERT statement carries: amortises a statement's
/// per-execution cost over many rows (SQLite allows 32,766 parameters).
const INSERT_ROWS_PER_STATEMENT: usize = 128;

/// Inserts `values`, `ncols` per row, with `head` (`INSERT INTO t(cols)`),
/// [`INSERT_ROWS_PER_STATEMENT`] rows per statement.
fn insert_rows(
    c: &Connection,
    head: &str,
    ncols: usize,
    values: &[&dyn rusqlite::ToSql],
) -> rusqlite::Result<()> {
    debug_assert_eq!(values.len() % ncols, 0);
    let row = format!("({})", vec!["?"; ncols].join(","));
    let sql = |rows: usize| format!("{head} VALUES {}", vec![row.as_str(); rows].join(","));
    let chunk = INSERT_ROWS_PER_STATEMENT * ncols;
    let mut full = c.prepare_cached(&sql(INSERT_ROWS_PER_STATEMENT))?;
    let mut parts = values.chunks_exact(chunk);
    for part in parts.by_ref() {
        full.execute(rusqlite::params_from_iter(part))?;
    }
    let rest = parts.remainder();
    if !rest.is_empty() {
        c.prepare(&sql(rest.len() / ncols))?
            .execute(rusqlite::params_from_iter(rest))?;
    }
    Ok(())
}

/// Writes sorted entries as new blocks of [`nodeblocks::BLOCK_ENTRIES_IMPORT`].
/// Node entries pulled one at a time into an entry the caller keeps, so
/// that a stream of millions (an import's merge, [`crate::spill`]) reuses
/// each entry's ways vector instead of allocating one per node.
pub(crate) trait EntrySource {
    /// Overwrites `e` with the next entry; false at the end.
    fn next_into(&mut self, e: &mut Entry) -> bool;
}

impl<T: EntrySource + ?Sized> EntrySource for &mut T {
    fn next_into(&mut self, e: &mut Entry) -> bool {
        (**self).next_into(e)
    }
}

/// An iterator of entries as an [`EntrySource`].
pub(crate) struct Entries<I>(pub I);

impl<I: Iterator<Item = Entry>> EntrySource for Entries<I> {
    fn next_into(&mut self, e: &mut Entry) -> bool {
        match self.0.next() {
            Some(x) => {
                *e = x;
                true
            }
            None => false,
        }
    }
}

/// Writes sorted entries as blocks of [`nodeblocks::BLOCK_ENTRIES_IMPORT`],
/// each entry passed through `map` first. The block's entries and its
/// encoding buffer are reused from one block to the next.
fn insert_blocks(
    c: &Connection,
    mut entries: impl EntrySource,
    mut map: impl FnMut(&mut Entry),
) -> rusqlite::Result<()> {
    let mut st = c.prepare_cached("INSERT INTO node_blocks(first, data) VALUES(?1, ?2)")?;
    let mut block = vec![Entry::default(); nodeblocks::BLOCK_ENTRIES_IMPORT];
    let mut bytes = Vec::new();
    let mut flush = |block: &[Entry]| -> rusqlite::Result<()> {
        if let Some(first) = block.first().map(|e| e.id) {
            nodeblocks::encode_into(block, &mut bytes);
            st.execute(params![first, bytes])?;
        }
        Ok(())
    };
    let mut n = 0;
    while entries.next_into(&mut block[n]) {
        map(&mut block[n]);
        n += 1;
        if n == block.len() {
            flush(&block)?;
            n = 0;
        }
    }
    flush(&block[..n])
}

fn read_way(c: &Connection, id: i64) -> rusqlite::Result<Option<Way>> {
    c.prepare_cached("SELECT refs, tags FROM ways WHERE id = ?1")?
        .query_row([id], |r| {
            let blob: Vec<u8> = r.get(0)?;
            Ok(Way {
                id,
                refs: blob
                    .chunks_exact(8)
                    .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
                    .collect(),
                tags: parse_tags(r.get(1)?),
            })
        })
        .optional()
}

fn read_relation(c: &Connection, id: i64) -> rusqlite::Result<Option<Relation>> {
    c.prepare_cached("SELECT members, tags FROM relations WHERE id = ?1")?
        .query_row([id], |r| {
            let m: String = r.get(0)?;
            let members: Vec<(u8, i64, String)> = serde_json::from_str(&m).unwrap_or_default();
            Ok(Relation {
                id,
                members: members
                    .into_iter()
                    .map(|(k, id, role)| Member {
                        kind: match k {
                            0 => MemberKind::Node,
                            1 => MemberKind::Way,
                            _ => MemberKind::Relation,
                        },
                        id,
                        role,
                    })
                    .collect(),
                tags: parse_tags(r.get(1)?),
            })
        })
        .optional()
}

/// Reading the store, from outside a transaction or inside one (where reads
/// see the transaction's own writes). Derivation is written against this, so
/// that a batch of diffs can be derived one diff at a time inside the one
/// transaction that applies them all.
pub trait OsmRead {
    fn node(&self, id: i64) -> Result<Option<Node>, StoreError>;
    fn way(&self, id: i64) -> Result<Option<Way>, StoreError>;
    fn ways_of_node(&self, node: i64) -> Result<Vec<i64>, StoreError>;
    fn relation(&self, id: i64) -> Result<Option<Relation>, StoreError>;
    fn relations_of(&self, kind: MemberKind, id: i64) -> Result<Vec<i64>, StoreError>;
    fn meta(&self, key: &str) -> Result<Option<String>, StoreError>;
    /// The ways tagged `natural=coastline` (the sea is assembled from
    /// them, `highwater_osm::coast`): a scan of the ways' tags, paid only by a
    /// rebuild and by a diff that touches a coastline.
    fn coastline_ways(&self) -> Result<Vec<i64>, StoreError>;
    /// Up to `limit` ids of tagged elements of one type, above `after`, in
    /// id order: a full pass reads the store a page at a time, so that
    /// what it holds does not grow with the store.
    fn tagged_page(
        &self,
        kind: MemberKind,
        after: i64,
        limit: usize,
    ) -> Result<Vec<i64>, StoreError>;
    /// An element's feature bytes in the shapes index (`None`: no row, or
    /// no index): the feature as every key sees it, kept by each apply, so
    /// a reader that trusts a live index never assembles it from nodes.
    fn shape_data(&self, kind: MemberKind, id: i64) -> Result<Option<Vec<u8>>, StoreError>;
    /// The store file, for errors.
    fn file(&self) -> &Path;
}

fn shape_data(c: &Connection, kind: MemberKind, id: i64) -> rusqlite::Result<Option<Vec<u8>>> {
    c.prepare_cached("SELECT data FROM shape_data WHERE id = ?1")
        .and_then(|mut st| st.query_row([shape_id(kind, id)], |r| r.get(0)).optional())
}

fn tagged_page(
    c: &Connection,
    kind: MemberKind,
    after: i64,
    limit: usize,
) -> rusqlite::Result<Vec<i64>> {
    let sql = match kind {
        MemberKind::Node => "SELECT id FROM node_tags WHERE id > ?1 ORDER BY id LIMIT ?2",
        MemberKind::Way => {
            "SELECT id FROM ways WHERE id > ?1 AND tags IS NOT NULL ORDER BY id LIMIT ?2"
        }
        MemberKind::Relation => {
            "SELECT id FROM relations WHERE id > ?1 AND tags IS NOT NULL ORDER BY id LIMIT ?2"
        }
    };
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    c.prepare_cached(sql)?
        .query_map(params![after, limit], |r| r.get(0))?
        .collect()
}

fn coastline_ways(c: &Connection) -> rusqlite::Result<Vec<i64>> {
    c.prepare_cached(
        "SELECT id FROM ways WHERE tags LIKE '%\"natural\":\"coastline\"%' ORDER BY id",
    )?
    .query_map([], |r| r.get(0))?
    .collect()
}

fn relations_of(c: &Connection, kind: MemberKind, id: i64) -> rusqlite::Result<Vec<i64>> {
    c.prepare_cached("SELECT rel FROM member_rels WHERE kind = ?1 AND member = ?2")?
        .query_map(params![kind_code(kind), id], |r| r.get(0))?
        .collect()
}

fn ways_of_node(
    c: &Connection,
    cache: Option<&RefCell<nodeblocks::Cache>>,
    node: i64,
) -> rusqlite::Result<Vec<i64>> {
    Ok(node_entry(c, cache, node)?
        .map(|e| e.ways)
        .unwrap_or_default())
}

impl OsmRead for Store {
    fn node(&self, id: i64) -> Result<Option<Node>, StoreError> {
        Store::node(self, id)
    }
    fn way(&self, id: i64) -> Result<Option<Way>, StoreError> {
        Store::way(self, id)
    }
    fn ways_of_node(&self, node: i64) -> Result<Vec<i64>, StoreError> {
        Store::ways_of_node(self, node)
    }
    fn relation(&self, id: i64) -> Result<Option<Relation>, StoreError> {
        Store::relation(self, id)
    }
    fn relations_of(&self, kind: MemberKind, id: i64) -> Result<Vec<i64>, StoreError> {
        relations_of(&self.conn, kind, id).map_err(|e| self.err(e))
    }
    fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        Store::meta(self, key)
    }
    fn coastline_ways(&self) -> Result<Vec<i64>, StoreError> {
        coastline_ways(&self.conn).map_err(|e| self.err(e))
    }
    fn tagged_page(
        &self,
        kind: MemberKind,
        after: i64,
        limit: usize,
    ) -> Result<Vec<i64>, StoreError> {
        tagged_page(&self.conn, kind, after, limit).map_err(|e| self.err(e))
    }
    fn shape_data(&self, kind: MemberKind, id: i64) -> Result<Option<Vec<u8>>, StoreError> {
        shape_data(&self.conn, kind, id).map_err(|e| self.err(e))
    }
    fn file(&self) -> &Path {
        &self.path
    }
}

impl OsmRead for Writer<'_> {
    fn node(&self, id: i64) -> Result<Option<Node>, StoreError> {
        Writer::node(self, id)
    }
    fn way(&self, id: i64) -> Result<Option<Way>, StoreError> {
        Writer::way(self, id)
    }
    fn ways_of_node(&self, node: i64) -> Result<Vec<i64>, StoreError> {
        ways_of_node(&self.tx, Some(&self.blocks), node).map_err(|e| self.err(e))
    }
    fn relation(&self, id: i64) -> Result<Option<Relation>, StoreError> {
        Writer::relation(self, id)
    }
    fn relations_of(&self, kind: MemberKind, id: i64) -> Result<Vec<i64>, StoreError> {
        relations_of(&self.tx, kind, id).map_err(|e| self.err(e))
    }
    fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        Writer::meta(self, key)
    }
    fn coastline_ways(&self) -> Result<Vec<i64>, StoreError> {
        coastline_ways(&self.tx).map_err(|e| self.err(e))
    }
    fn tagged_page(
        &self,
        kind: MemberKind,
        after: i64,
        limit: usize,
    ) -> Result<Vec<i64>, StoreError> {
        tagged_page(&self.tx, kind, after, limit).map_err(|e| self.err(e))
    }
    fn shape_data(&self, kind: MemberKind, id: i64) -> Result<Option<Vec<u8>>, StoreError> {
        shape_data(&self.tx, kind, id).map_err(|e| self.err(e))
    }
    fn file(&self) -> &Path {
        &self.path
    }
}

/// Writes inside one transaction. Reads through the writer see its own
/// writes.
pub struct Writer<'s> {
    pub(crate) tx: Transaction<'s>,
    pub(crate) path: PathBuf,
    flat: Option<Arc<FlatNodes>>,
    /// Untagged nodes' locations for the flat file, written just before
    /// the transaction commits ([`Writer::flush_flat`]); reads see them.
    pending: BTreeMap<i64, (i32, i32)>,
    /// Decoded node blocks read in this transaction; emptied whenever the
    /// writer edits blocks, so they are always the transaction's own.
    blocks: RefCell<nodeblocks::Cache>,
}

impl<'s> Writer<'s> {
    /// An SQLite error of this store, naming its file.
    pub fn err(&self, err: rusqlite::Error) -> StoreError {
        StoreError::Sqlite {
            path: self.path.clone(),
            err,
        }
    }

    /// The write transaction, for the datasets' own tables (created with
    /// the store, [`Extension::tables`]): they write them through it.
    pub fn tx(&self) -> &Transaction<'s> {
        &self.tx
    }

    /// The store's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.tx
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()
            .map_err(|e| self.err(e))
    }

    pub fn del_meta(&mut self, key: &str) -> Result<(), StoreError> {
        self.tx
            .execute("DELETE FROM meta WHERE key = ?1", [key])
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Records a diff fetched over HTTP, in the transaction that applies it.
    pub fn log_replication(
        &mut self,
        sequence: i64,
        url: &str,
        sha256: &str,
        timestamp: &str,
    ) -> Result<(), StoreError> {
        self.tx
            .execute(
                "INSERT OR REPLACE INTO replication_log(sequence, url, sha256, timestamp, applied_at_ns)
                 VALUES(?1, ?2, ?3, ?4, ?5)",
                // Redacted here too: no credential is ever stored.
                params![
                    sequence,
                    crate::redact::redact_url(url),
                    sha256,
                    timestamp,
                    highwater_store::lease::now_ns()
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    pub fn set_meta(&mut self, key: &str, value: &str) -> Result<(), StoreError> {
        self.tx
            .execute(
                "INSERT INTO meta(key, value) VALUES(?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                params![key, value],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    pub fn node(&self, id: i64) -> Result<Option<Node>, StoreError> {
        let locs = Locs {
            flat: self.flat.as_deref(),
            pending: Some(&self.pending),
        };
        read_node(&self.tx, Some(&self.blocks), locs, id).map_err(|e| self.err(e))
    }

    /// Writes the pending flat-node locations, under the undo protocol of
    /// [`crate::flatnodes`]: the next epoch recorded in the transaction,
    /// the old slots logged and fsynced, then the slots written and
    /// fsynced. True when it wrote (the caller removes the log once the
    /// transaction committed).
    fn flush_flat(&mut self) -> Result<bool, StoreError> {
        let Some(flat) = self.flat.clone() else {
            return Ok(false);
        };
        if self.pending.is_empty() {
            return Ok(false);
        }
        let epoch: u64 = self
            .meta(FLAT_EPOCH_META)?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
            + 1;
        self.set_meta(FLAT_EPOCH_META, &epoch.to_string())?;
        let mut log = Vec::with_capacity(24 + 16 * self.pending.len());
        log.extend_from_slice(UNDO_MAGIC);
        log.extend_from_slice(&epoch.to_le_bytes());
        log.extend_from_slice(&(self.pending.len() as u64).to_le_bytes());
        for &id in self.pending.keys() {
            log.extend_from_slice(&id.to_le_bytes());
            log.extend_from_slice(&flat.raw(id)?);
        }
        let undo = undo_path(flat.path());
        let io = |e: std::io::Error| {
            StoreError::Corrupt {
            path: undo.clone(),
            what: format!("cannot write the flat nodes' undo log (is the disk full?): {e}; nothing was applied"),
        }
        };
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&undo).map_err(io)?;
            f.write_all(&log).map_err(io)?;
            f.sync_all().map_err(io)?;
        }
        crate::import::sync_parent(&undo).map_err(io)?;
        for (&id, &(lat, lon)) in &self.pending {
            flat.set(id, lat, lon)?;
        }
        flat.sync()?;
        Ok(true)
    }

    /// Adds tiles to a dataset's dirty set (deduplicated).
    pub fn add_dirty(
        &mut self,
        dataset: &str,
        tiles: &std::collections::BTreeSet<highwater_core::tile::Tile>,
    ) -> Result<(), StoreError> {
        let mut st = self
            .tx
            .prepare_cached(
                "INSERT INTO dirty(dataset, z, x, y, hits, gen) VALUES(?1, ?2, ?3, ?4, 1,
                    COALESCE((SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'generation'), 0))
                 ON CONFLICT DO UPDATE SET hits = hits + 1, gen = excluded.gen",
            )
            .map_err(|e| self.err(e))?;
        for t in tiles {
            st.execute(params![dataset, t.z, t.x, t.y])
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// Moves a dataset's marker.
    /// Records (or with `None`, removes) an element's shape: its bounding
    /// box, the bytes to keep with it, and its lowest zoom.
    pub fn set_shape(
        &mut self,
        kind: MemberKind,
        id: i64,
        shape: Option<ShapeRow<'_>>,
    ) -> Result<(), StoreError> {
        let key = shape_id(kind, id);
        let old: Option<i64> = self
            .tx
            .prepare_cached("SELECT cell FROM shape_data WHERE id = ?1")
            .and_then(|mut st| st.query_row([key], |r| r.get(0)).optional())
            .map_err(|e| self.err(e))?;
        if let Some(cell) = old {
            for sql in [
                "DELETE FROM shape_cells WHERE cell = ?1 AND id = ?2",
                "DELETE FROM shape_cells_low WHERE cell = ?1 AND id = ?2",
            ] {
                self.tx
                    .prepare_cached(sql)
                    .and_then(|mut st| st.execute([cell, key]))
                    .map_err(|e| self.err(e))?;
            }
            self.tx
                .prepare_cached("DELETE FROM shape_data WHERE id = ?1")
                .and_then(|mut st| st.execute([key]))
                .map_err(|e| self.err(e))?;
        }
        if let Some((bbox, data, zmin)) = shape {
            self.insert_shape(key, bbox, data, zmin)?;
        }
        Ok(())
    }

    fn insert_shape(
        &mut self,
        key: i64,
        bbox: (f64, f64, f64, f64),
        data: &[u8],
        zmin: u8,
    ) -> Result<(), StoreError> {
        let cell = crate::cells::cell_of(bbox);
        let (minx, miny, maxx, maxy) = bbox;
        let tables: &[&str] = if zmin < LOW_ZOOM {
            &["shape_cells", "shape_cells_low"]
        } else {
            &["shape_cells"]
        };
        for t in tables {
            self.tx
                .prepare_cached(&format!(
                    "INSERT INTO {t}(cell, id, minx, miny, maxx, maxy, zmin) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)"
                ))
                .and_then(|mut st| st.execute(params![cell, key, minx, miny, maxx, maxy, zmin]))
                .map_err(|e| self.err(e))?;
        }
        self.tx
            .prepare_cached("INSERT INTO shape_data(id, cell, data) VALUES(?1, ?2, ?3)")
            .and_then(|mut st| st.execute(params![key, cell, data]))
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Fills an emptied shapes index (a rebuild's), a page of elements at
    /// a time: each row an element, its box, its encoded feature and its
    /// lowest zoom. Inserts only, each table's rows in its own key order,
    /// many rows per statement.
    pub fn insert_shapes<'d>(
        &mut self,
        rows: impl Iterator<Item = ShapeInsert<'d>>,
    ) -> Result<(), StoreError> {
        let mut cells = Vec::new();
        let mut data: Vec<(i64, i64, &[u8])> = Vec::new();
        for ((kind, id), bbox, d, zmin) in rows {
            let (key, cell) = (shape_id(kind, id), crate::cells::cell_of(bbox));
            cells.push((cell, key, bbox, zmin));
            data.push((key, cell, d));
        }
        cells.sort_unstable_by_key(|c| (c.0, c.1));
        data.sort_unstable_by_key(|d| d.0);
        for (table, low_only) in [("shape_cells", false), ("shape_cells_low", true)] {
            let values: Vec<&dyn rusqlite::ToSql> = cells
                .iter()
                .filter(|c| !low_only || c.3 < LOW_ZOOM)
                .flat_map(|(cell, key, (minx, miny, maxx, maxy), zmin)| {
                    [
                        cell as &dyn rusqlite::ToSql,
                        key,
                        minx,
                        miny,
                        maxx,
                        maxy,
                        zmin,
                    ]
                })
                .collect();
            insert_rows(
                &self.tx,
                &format!("INSERT INTO {table}(cell, id, minx, miny, maxx, maxy, zmin)"),
                7,
                &values,
            )
            .map_err(|e| self.err(e))?;
        }
        let values: Vec<&dyn rusqlite::ToSql> = data
            .iter()
            .flat_map(|(key, cell, d)| [key as &dyn rusqlite::ToSql, cell, d])
            .collect();
        insert_rows(
            &self.tx,
            "INSERT INTO shape_data(id, cell, data)",
            3,
            &values,
        )
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Records elements a diff touched, for each aggregates dataset.
    pub fn add_dirty_keys(
        &mut self,
        dataset: &str,
        keys: &BTreeSet<(MemberKind, i64)>,
    ) -> Result<(), StoreError> {
        let mut st = self
            .tx
            .prepare_cached(
                "INSERT INTO dirty_keys(dataset, kind, id, gen) VALUES(?1, ?2, ?3,
                    COALESCE((SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'generation'), 0))
                 ON CONFLICT DO UPDATE SET gen = excluded.gen",
            )
            .map_err(|e| self.err(e))?;
        for (k, id) in keys {
            st.execute(params![dataset, kind_code(*k), id])
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// Records when a dataset last caught up (a drain or rebuild), in the
    /// transaction that clears its dirty rows: `osm status` and the status
    /// page show it.
    fn drained(&mut self, dataset: &str) -> Result<(), StoreError> {
        let now = highwater_core::window::format_rfc3339(highwater_store::lease::now_ns() / 1000);
        self.set_meta(&format!("drained_at:{dataset}"), &now)
    }

    /// Removes the dirty keys recorded at generation `upto` or before:
    /// what the caller read at `upto` covers them; later ones stay.
    pub fn clear_dirty_keys(&mut self, dataset: &str, upto: i64) -> Result<(), StoreError> {
        self.tx
            .execute(
                "DELETE FROM dirty_keys WHERE dataset = ?1 AND gen <= ?2",
                params![dataset, upto],
            )
            .map_err(|e| self.err(e))?;
        self.drained(dataset)
    }

    /// Counts one more change of OSM data (an import or a diff); returns the
    /// new generation, which the dirty rows written after it record.
    pub fn bump_generation(&mut self) -> Result<i64, StoreError> {
        let g = self
            .meta("generation")?
            .and_then(|g| g.parse::<i64>().ok())
            .unwrap_or(0)
            + 1;
        self.set_meta("generation", &g.to_string())?;
        Ok(g)
    }

    /// Deletes a dataset's rows from our own tables (names are constants
    /// of this file, never input).
    pub fn clear_dataset(
        &mut self,
        tables: &[&'static str],
        dataset: &str,
    ) -> Result<(), StoreError> {
        for t in tables {
            self.tx
                .execute(&format!("DELETE FROM {t} WHERE dataset = ?1"), [dataset])
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// Empties the shapes index, before a full rebuild of it.
    pub fn clear_shapes(&mut self) -> Result<(), StoreError> {
        self.tx
            .execute_batch(
                "DELETE FROM shape_cells; DELETE FROM shape_cells_low; DELETE FROM shape_data;",
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Removes tiles from a dataset's dirty set (they have been re-cut from
    /// the store as of generation `upto`; tiles dirtied later stay).
    pub fn clean(
        &mut self,
        dataset: &str,
        tiles: &[highwater_core::tile::Tile],
        upto: i64,
    ) -> Result<(), StoreError> {
        let mut st = self
            .tx
            .prepare_cached(
                "DELETE FROM dirty WHERE dataset = ?1 AND z = ?2 AND x = ?3 AND y = ?4 AND gen <= ?5",
            )
            .map_err(|e| self.err(e))?;
        for t in tiles {
            st.execute(params![dataset, t.z, t.x, t.y, upto])
                .map_err(|e| self.err(e))?;
        }
        drop(st);
        self.drained(dataset)
    }

    /// Empties a dataset's dirty set after a rebuild that read the store at
    /// generation `upto`: tiles dirtied by later diffs stay.
    pub fn clear_dirty(&mut self, dataset: &str, upto: i64) -> Result<(), StoreError> {
        self.tx
            .execute(
                "DELETE FROM dirty WHERE dataset = ?1 AND gen <= ?2",
                params![dataset, upto],
            )
            .map_err(|e| self.err(e))?;
        self.drained(dataset)
    }

    pub fn set_marker(
        &mut self,
        dataset: &str,
        sequence: Option<i64>,
        recipe: &str,
    ) -> Result<(), StoreError> {
        self.tx
            .execute(
                "INSERT INTO markers(dataset, sequence, recipe) VALUES(?1, ?2, ?3)
                 ON CONFLICT(dataset) DO UPDATE SET sequence = excluded.sequence, recipe = excluded.recipe",
                params![dataset, sequence, recipe],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    pub fn way(&self, id: i64) -> Result<Option<Way>, StoreError> {
        read_way(&self.tx, id).map_err(|e| self.err(e))
    }

    pub fn relation(&self, id: i64) -> Result<Option<Relation>, StoreError> {
        read_relation(&self.tx, id).map_err(|e| self.err(e))
    }

    /// Edits the node entries of `ids` (ascending, distinct), block by
    /// block: `f` gets each id's entry, a void one when there is none.
    /// Void entries are dropped, empty blocks deleted, and a block grown
    /// past [`nodeblocks::BLOCK_ENTRIES_MAX`] split.
    fn edit_nodes(&mut self, ids: &[i64], mut f: impl FnMut(&mut Entry)) -> Result<(), StoreError> {
        debug_assert!(ids.windows(2).all(|w| w[0] < w[1]));
        self.blocks.get_mut().clear();
        let mut i = 0;
        while i < ids.len() {
            // The block an id belongs in: the last starting at or before
            // it, else (an id below every block) the first.
            let found = match block_of(&self.tx, ids[i]).map_err(|e| self.err(e))? {
                Some(b) => Some(b),
                None => self
                    .tx
                    .prepare_cached("SELECT first, data FROM node_blocks ORDER BY first LIMIT 1")
                    .and_then(|mut st| st.query_row([], |r| Ok((r.get(0)?, r.get(1)?))).optional())
                    .map_err(|e| self.err(e))?,
            };
            let (key, mut entries) = match found {
                Some((first, data)) => (
                    Some(first),
                    nodeblocks::decode(first, &data)
                        .ok_or_else(|| self.err(corrupt_block(first)))?,
                ),
                None => (None, Vec::new()),
            };
            // The block covers ids up to where the next one starts.
            let next: Option<i64> = match key {
                Some(k) => self
                    .tx
                    .prepare_cached(
                        "SELECT first FROM node_blocks WHERE first > ?1 ORDER BY first LIMIT 1",
                    )
                    .and_then(|mut st| st.query_row([k], |r| r.get(0)).optional())
                    .map_err(|e| self.err(e))?,
                None => None,
            };
            let mut j = i;
            while j < ids.len() && next.is_none_or(|n| ids[j] < n) {
                let id = ids[j];
                match entries.binary_search_by_key(&id, |e| e.id) {
                    Ok(p) => f(&mut entries[p]),
                    Err(p) => {
                        let mut e = Entry {
                            id,
                            ..Entry::default()
                        };
                        f(&mut e);
                        entries.insert(p, e);
                    }
                }
                j += 1;
            }
            entries.retain(|e| !e.is_void());
            if let Some(k) = key {
                self.tx
                    .prepare_cached("DELETE FROM node_blocks WHERE first = ?1")
                    .and_then(|mut st| st.execute([k]))
                    .map_err(|e| self.err(e))?;
            }
            let per_block = if entries.len() > nodeblocks::BLOCK_ENTRIES_MAX {
                nodeblocks::BLOCK_ENTRIES_IMPORT
            } else {
                nodeblocks::BLOCK_ENTRIES_MAX
            };
            let mut st = self
                .tx
                .prepare_cached("INSERT INTO node_blocks(first, data) VALUES(?1, ?2)")
                .map_err(|e| self.err(e))?;
            for (first, data) in nodeblocks::blocks(&entries, per_block) {
                st.execute(params![first, data]).map_err(|e| self.err(e))?;
            }
            i = j;
        }
        Ok(())
    }

    /// Moves way `way` from the entries of `old` refs to those of `new`.
    fn reindex_way(&mut self, way: i64, old: &[i64], new: &[i64]) -> Result<(), StoreError> {
        let sorted = |r: &[i64]| -> Vec<i64> {
            let mut v = r.to_vec();
            v.sort_unstable();
            v.dedup();
            v
        };
        let (old, new) = (sorted(old), sorted(new));
        let mut ids: Vec<i64> = old.iter().chain(&new).copied().collect();
        ids.sort_unstable();
        ids.dedup();
        self.edit_nodes(&ids, |e| {
            let uses = new.binary_search(&e.id).is_ok();
            match (e.ways.binary_search(&way), uses) {
                (Ok(p), false) => {
                    e.ways.remove(p);
                }
                (Err(p), true) => e.ways.insert(p, way),
                _ => {}
            }
        })
    }

    /// Inserts or replaces an element, keeping the reverse indexes true.
    pub fn put(&mut self, e: &Element) -> Result<(), StoreError> {
        match e {
            Element::Node(n) => {
                let (Some(lat), Some(lon)) = (n.lat_e7, n.lon_e7) else {
                    return Err(StoreError::Corrupt {
                        path: self.path.clone(),
                        what: format!("n{} has no location", n.id),
                    });
                };
                let tagged = !n.tags.is_empty();
                // Untagged nodes of a flat-nodes store: the location goes
                // to the flat file (at commit), the entry says so.
                let flat = self.flat.is_some() && !tagged;
                if flat {
                    crate::flatnodes::check_id(self.flat.as_deref().expect("flat"), n.id)?;
                    self.pending.insert(n.id, (lat, lon));
                } else {
                    self.pending.remove(&n.id);
                }
                self.edit_nodes(&[n.id], |e| {
                    e.loc = (!flat).then_some((lat, lon));
                    e.flat = flat;
                    e.tagged = tagged;
                })?;
                self.set_node_tags(n.id, &n.tags)?;
            }
            Element::Way(w) => {
                let old = self.way(w.id)?.map(|o| o.refs).unwrap_or_default();
                self.put_way_row(w)?;
                self.reindex_way(w.id, &old, &w.refs)?;
            }
            Element::Relation(r) => {
                self.unindex_relation(r.id)?;
                self.put_relation_row(r)?;
                self.index_relation(r)?;
            }
        }
        Ok(())
    }

    fn set_node_tags(&mut self, id: i64, tags: &Tags) -> Result<(), StoreError> {
        match tags_text(tags) {
            Some(t) => self
                .tx
                .prepare_cached("INSERT OR REPLACE INTO node_tags(id, tags) VALUES(?1, ?2)")
                .and_then(|mut s| s.execute(params![id, t])),
            None => self
                .tx
                .prepare_cached("DELETE FROM node_tags WHERE id = ?1")
                .and_then(|mut s| s.execute([id])),
        }
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    fn put_way_row(&mut self, w: &Way) -> Result<(), StoreError> {
        self.tx
            .prepare_cached("INSERT OR REPLACE INTO ways(id, refs, tags) VALUES(?1, ?2, ?3)")
            .and_then(|mut s| s.execute(params![w.id, refs_blob(&w.refs), tags_text(&w.tags)]))
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    fn put_relation_row(&mut self, r: &Relation) -> Result<(), StoreError> {
        let members: Vec<(i64, i64, &str)> = r
            .members
            .iter()
            .map(|m| (kind_code(m.kind), m.id, m.role.as_str()))
            .collect();
        self.tx
            .prepare_cached(
                "INSERT OR REPLACE INTO relations(id, members, tags) VALUES(?1, ?2, ?3)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    r.id,
                    serde_json::to_string(&members).expect("members serialize"),
                    tags_text(&r.tags)
                ])
            })
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    fn index_relation(&mut self, r: &Relation) -> Result<(), StoreError> {
        let mut st = self
            .tx
            .prepare_cached(
                "INSERT OR IGNORE INTO member_rels(kind, member, rel) VALUES(?1, ?2, ?3)",
            )
            .map_err(|e| self.err(e))?;
        for m in &r.members {
            st.execute(params![kind_code(m.kind), m.id, r.id])
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// Writes an extract's node entries (sorted; each with the ways through
    /// it, see [`merge_refs`]) into an empty store. Only `osm import`
    /// calls it, on a store it just created.
    /// With a flat node file (an import's new one, which nothing reads
    /// yet), untagged nodes' locations go there in id order instead.
    pub(crate) fn put_node_blocks(&mut self, entries: impl EntrySource) -> Result<(), StoreError> {
        self.blocks.get_mut().clear();
        let Some(flat) = self.flat.clone() else {
            return insert_blocks(&self.tx, entries, |_| {}).map_err(|e| self.err(e));
        };
        let mut seq = flat.seq_writer();
        let mut failed = None;
        let r = insert_blocks(&self.tx, entries, |e| {
            if let (Some((lat, lon)), false, true) = (e.loc, e.tagged, failed.is_none()) {
                match seq.set(e.id, lat, lon) {
                    Ok(()) => {
                        e.flat = true;
                        e.loc = None;
                    }
                    Err(x) => failed = Some(x),
                }
            }
        });
        if let Some(e) = failed {
            return Err(e.into());
        }
        r.map_err(|e| self.err(e))?;
        seq.flush()?;
        Ok(())
    }

    /// Writes an extract's rows, encoded beforehand (in parallel), into an
    /// empty store: node tags, ways, relations with their member index.
    /// Without the per-element index upkeep of [`Writer::put`].
    pub(crate) fn put_rows(&mut self, rows: &BulkRows) -> Result<(), StoreError> {
        let node_tags: Vec<&dyn rusqlite::ToSql> = rows
            .node_tags
            .iter()
            .flat_map(|(id, t)| [id as &dyn rusqlite::ToSql, t])
            .collect();
        insert_rows(&self.tx, "INSERT INTO node_tags(id, tags)", 2, &node_tags)
            .map_err(|e| self.err(e))?;
        let ways: Vec<&dyn rusqlite::ToSql> = rows
            .ways
            .iter()
            .flat_map(|(id, refs, t)| [id as &dyn rusqlite::ToSql, refs, t])
            .collect();
        insert_rows(&self.tx, "INSERT INTO ways(id, refs, tags)", 3, &ways)
            .map_err(|e| self.err(e))?;
        for r in &rows.relations {
            self.put_relation_row(r)?;
            self.index_relation(r)?;
        }
        Ok(())
    }

    fn unindex_relation(&mut self, id: i64) -> Result<(), StoreError> {
        if let Some(old) = self.relation(id)? {
            let mut st = self
                .tx
                .prepare_cached(
                    "DELETE FROM member_rels WHERE kind = ?1 AND member = ?2 AND rel = ?3",
                )
                .map_err(|e| self.err(e))?;
            for m in &old.members {
                st.execute(params![kind_code(m.kind), m.id, id])
                    .map_err(|e| self.err(e))?;
            }
        }
        Ok(())
    }

    /// Deletes an element (absent is fine: deletes are idempotent).
    pub fn delete(&mut self, kind: MemberKind, id: i64) -> Result<(), StoreError> {
        let sql = match kind {
            MemberKind::Node => {
                self.pending.remove(&id);
                self.edit_nodes(&[id], |e| {
                    e.loc = None;
                    e.flat = false;
                    e.tagged = false;
                })?;
                "DELETE FROM node_tags WHERE id = ?1"
            }
            MemberKind::Way => {
                if let Some(old) = self.way(id)? {
                    self.reindex_way(id, &old.refs, &[])?;
                }
                "DELETE FROM ways WHERE id = ?1"
            }
            MemberKind::Relation => {
                self.unindex_relation(id)?;
                "DELETE FROM relations WHERE id = ?1"
            }
        };
        self.tx.execute(sql, [id]).map_err(|e| self.err(e))?;
        Ok(())
    }
}
