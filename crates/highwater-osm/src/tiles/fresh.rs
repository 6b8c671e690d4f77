//! Dirty tiles served fresh, and re-cut by popularity (issue 23).
//!
//! The seed: "mark the tile dirty and let it be re-cut on the next
//! request, or on a background worker draining the dirty list by priority
//! … lets popularity decide what is actually worth recomputing".
//!
//! - [`cut_fresh`]: a dirty tile cut in memory from the store as it is,
//!   by the drain's own code ([`super::cut_batch`]) and gzipped as the
//!   drain stores it, so it equals what the next drain writes. It reads
//!   only: the MBTiles file and the store are never written, and the
//!   writer lease keeps its meaning.
//! - [`FreshView`]: what `serve` asks per request (the store's generation,
//!   whether a tile is dirty), from a read-only connection that re-reads
//!   only when SQLite's `data_version` says another connection committed.
//! - [`Requests`]: per-tile request counts, bounded, kept by `serve` in a
//!   file beside the store (`requests-NAME.json`, written whole and
//!   renamed): the drainer reads them for `--priority requested`, status
//!   for its counts. It is not the store: serve stays a reader of that.

use super::{cut_batch, gzip, TileDataset, TilesError};
use crate::store::{DrainOrder, Extension, Store, StoreError};
use highwater_core::tile::Tile;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// Tiles whose requests are counted at most: past it, the least
/// requested half is forgotten (bounded memory; the popular ones stay).
pub const REQUEST_COUNTS_MAX: usize = 65_536;

/// Dirty tiles a [`FreshView`] keeps per dataset at most; dirty tiles past
/// it (in low-zoom-first order) are served stale until drained.
pub const FRESH_DIRTY_CACHED_MAX: usize = 2_000_000;

/// Request counts and the fresh/stale tally of one tile dataset.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Requests {
    /// (z, x, y, requests).
    pub tiles: Vec<(u8, u32, u32, u64)>,
    /// Dirty tiles served cut fresh.
    pub fresh: u64,
    /// Dirty tiles served stale (the cut failed or ran out of time).
    pub stale: u64,
}

/// Where serve keeps a dataset's request counts: beside the store.
pub fn requests_path(store_dir: &Path, dataset: &str) -> PathBuf {
    store_dir.join(format!("requests-{dataset}.json"))
}

/// The counts serve recorded, if it recorded any (an unreadable file is
/// said, never silently taken as none).
pub fn load_requests(store_dir: &Path, dataset: &str) -> Result<Option<Requests>, TilesError> {
    let p = requests_path(store_dir, dataset);
    let text = match std::fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(TilesError::Io { path: p, err }),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| TilesError::Io {
            path: p,
            err: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("not request counts ({e}); delete it, serve writes it again"),
            ),
        })
}

/// Writes the counts whole (temporary file, rename).
pub fn save_requests(store_dir: &Path, dataset: &str, r: &Requests) -> Result<(), TilesError> {
    let p = requests_path(store_dir, dataset);
    let tmp = store_dir.join(format!(
        ".requests-{dataset}.json.hw-tmp-{}",
        std::process::id()
    ));
    let io = |path: &Path, err| TilesError::Io {
        path: path.to_path_buf(),
        err,
    };
    std::fs::write(&tmp, serde_json::to_vec(r).expect("plain data")).map_err(|e| io(&tmp, e))?;
    std::fs::rename(&tmp, &p).map_err(|e| io(&p, e))
}

/// The store's folder (requests live beside the store file).
fn store_dir(store: &Store) -> PathBuf {
    store
        .path()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The dirty tiles that were requested, most requested first (ties:
/// low zoom first), with their counts.
pub fn requested_dirty(store: &Store, d: &TileDataset) -> Result<Vec<(Tile, u64)>, TilesError> {
    let Some(r) = load_requests(&store_dir(store), &d.name)? else {
        return Ok(Vec::new());
    };
    let dirty: HashSet<Tile> = store
        .dirty_tiles(&d.name, DrainOrder::LowZoomFirst, usize::MAX)?
        .into_iter()
        .collect();
    let mut v: Vec<(Tile, u64)> = r
        .tiles
        .iter()
        .map(|&(z, x, y, n)| (Tile { z, x, y }, n))
        .filter(|(t, n)| *n > 0 && dirty.contains(t))
        .collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    Ok(v)
}

/// Whether serve has recorded any request for the dataset: then
/// `--priority requested` is the drain's default.
pub fn requests_seen(store: &Store, d: &TileDataset) -> Result<bool, TilesError> {
    Ok(load_requests(&store_dir(store), &d.name)?.is_some_and(|r| !r.tiles.is_empty()))
}

/// A tile cut fresh: the generation of the store it was cut from, and its
/// bytes gzipped as the MBTiles file stores them (`None`: nothing shows).
#[derive(Clone, Debug, PartialEq)]
pub struct Fresh {
    pub generation: i64,
    pub gz: Option<Vec<u8>>,
}

/// Cuts one tile from the store as it is, in one snapshot (its generation
/// and its features read together), by the drain's code. Refused when the
/// shapes index is not the one the drain would cut from (a drain rebuilds
/// it first; a reader cannot): the caller serves the stale tile.
pub fn cut_fresh(store: &Store, d: &TileDataset, t: Tile) -> Result<Fresh, TilesError> {
    // For the tests of serve's stale fallback: a cut that fails, and one
    // that outlasts serve's time limit.
    super::failpoint("fail-fresh-cut", &d.name)?;
    if std::env::var_os("HIGHWATER_FAILPOINT")
        .is_some_and(|v| v.to_string_lossy() == format!("slow-fresh-cut:{}", d.name))
    {
        std::thread::sleep(std::time::Duration::from_secs(3));
    }
    store
        .snapshot(|s| {
            if s.meta("shapes")?.is_none()
                || s.meta("shapes_low")?.as_deref() != Some(d.low.id.as_str())
            {
                return Err(StoreError::Corrupt {
                    path: s.path().to_path_buf(),
                    what: format!(
                        "the shapes index is not current for {}: the next drain rebuilds it",
                        d.name
                    ),
                });
            }
            let generation = s.generation()?;
            let sea = super::ocean::for_cut(s, &d.layer)?;
            let mut b = cut_batch(s, d, &[t], sea.as_ref())?;
            let gz = b.pop().and_then(|(_, b)| b).map(|b| gzip(&b));
            Ok(Fresh { generation, gz })
        })
        .map_err(TilesError::from)
}

/// What serve needs per tile request, cheaply: a read-only probe whose
/// `PRAGMA data_version` moves when anyone commits to the store; only then
/// are the generation and the dirty sets read again. Between commits the
/// probe itself is skipped: the store's WAL-index header
/// ([`super::wal_index`]), read from memory, still being the one seen when
/// the probe last confirmed the version says that nobody committed since
/// (SQLite's own test for `data_version`); a header in doubt or moved, or
/// a store not in WAL mode, asks the probe as before.
pub struct FreshView {
    probe: rusqlite::Connection,
    store: Store,
    version: i64,
    generation: i64,
    dirty: HashMap<String, HashSet<Tile>>,
    /// The probe's `-shm`, mapped; `None`: the probe answers every time.
    wal: Option<super::wal_index::WalIndex>,
    /// The WAL-index header read just before the probe last said
    /// `version`: while the header is still this, no commit came since.
    seen: Option<super::wal_index::Header>,
}

impl FreshView {
    /// Opens the store in `store_dir` with `ext` (the registry's,
    /// `highwater_osm::store_extension`: the datasets are below it).
    pub fn open(store_dir: &Path, ext: &Extension) -> Result<FreshView, TilesError> {
        // For the tests of the fallback through serve.
        let no_map = std::env::var_os("HIGHWATER_FAILPOINT").is_some_and(|v| v == "no-wal-index");
        Self::open_with(store_dir, ext, !no_map)
    }

    /// A view that asks the probe on every request, never the WAL-index
    /// header: what [`FreshView::open`] falls back to when the header
    /// cannot be mapped (for the tests of that fallback).
    pub fn open_probe_only(store_dir: &Path, ext: &Extension) -> Result<FreshView, TilesError> {
        Self::open_with(store_dir, ext, false)
    }

    fn open_with(
        store_dir: &Path,
        ext: &Extension,
        map_header: bool,
    ) -> Result<FreshView, TilesError> {
        let store = Store::open(store_dir, ext)?;
        let path = store.path().to_path_buf();
        let err = |err| StoreError::Sqlite {
            path: path.clone(),
            err,
        };
        let probe = rusqlite::Connection::open_with_flags(
            &path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(err)?;
        let mut v = FreshView {
            probe,
            store,
            version: i64::MIN,
            generation: 0,
            dirty: HashMap::new(),
            wal: None,
            seen: None,
        };
        // The first read opens the probe's WAL index (its -shm), which is
        // then mapped; the second read takes the header seen with it.
        v.refresh()?;
        let mode: String = v
            .probe
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .map_err(err)?;
        if mode.eq_ignore_ascii_case("wal") && map_header {
            v.wal = v
                .probe
                .path()
                .and_then(|p| super::wal_index::WalIndex::open(Path::new(p)));
        }
        v.refresh()?;
        Ok(v)
    }

    /// Whether the WAL-index header says that nobody committed since the
    /// probe last confirmed `version`. `false` is no answer: ask the probe.
    fn unmoved(&self) -> bool {
        match (&self.wal, &self.seen) {
            (Some(w), Some(seen)) => w.header().as_ref() == Some(seen),
            _ => false,
        }
    }

    /// The header now, read before the probe is asked (so that a commit
    /// after it moves it away from what is kept as `seen`).
    fn header(&self) -> Option<super::wal_index::Header> {
        self.wal.as_ref().and_then(|w| w.header())
    }

    /// `PRAGMA data_version` on the probe, its statement kept prepared.
    fn data_version(&self) -> Result<i64, TilesError> {
        self.probe
            .prepare_cached("PRAGMA data_version")
            .and_then(|mut st| st.query_row([], |r| r.get(0)))
            .map_err(|err| {
                StoreError::Sqlite {
                    path: self.store.path().to_path_buf(),
                    err,
                }
                .into()
            })
    }

    fn refresh(&mut self) -> Result<(), TilesError> {
        if self.unmoved() {
            return Ok(());
        }
        let header = self.header();
        self.seen = None;
        let version = self.data_version()?;
        if version != self.version {
            // Read before the generation: a commit in between moves the
            // version again (and the header away from `seen`), and the
            // next request reads again.
            self.version = version;
            self.generation = self.store.generation()?;
            self.dirty.clear();
        }
        self.seen = header;
        Ok(())
    }

    /// The store's generation now, and whether `t` is dirty in `dataset`.
    pub fn state(&mut self, dataset: &str, t: Tile) -> Result<(i64, bool), TilesError> {
        self.refresh()?;
        if !self.dirty.contains_key(dataset) {
            let set: HashSet<Tile> = self
                .store
                .dirty_tiles(dataset, DrainOrder::LowZoomFirst, FRESH_DIRTY_CACHED_MAX)?
                .into_iter()
                .collect();
            self.dirty.insert(dataset.to_string(), set);
        }
        Ok((self.generation, self.dirty[dataset].contains(&t)))
    }

    /// [`FreshView::state`] when it needs no more than knowing that the
    /// store has not moved, and that can be known without waiting (an
    /// error is for `state` to handle: the caller asks it):
    /// `Ok(None)` when the store moved since the last read or the
    /// dataset's dirty set is not loaded yet (reading those may take long;
    /// serve then asks [`FreshView::state`] off its event loop). Asked on
    /// every request, so the answer is as fresh as `state`'s: from the
    /// WAL-index header when it has not moved since the probe last
    /// confirmed the version, else from the probe (which, when the store
    /// did not move after all, takes the header as seen again).
    pub fn state_now(&mut self, dataset: &str, t: Tile) -> Result<Option<(i64, bool)>, TilesError> {
        if !self.unmoved() {
            let header = self.header();
            // Never wait for a lock here (the store is WAL: a reader waits
            // only in rare moments such as recovery); `state` waits as
            // before.
            let wait = |d| {
                self.probe
                    .busy_timeout(d)
                    .map_err(|err| StoreError::Sqlite {
                        path: self.store.path().to_path_buf(),
                        err,
                    })
            };
            wait(std::time::Duration::ZERO)?;
            let version = self.data_version();
            wait(std::time::Duration::from_secs(5))?;
            if version? != self.version {
                return Ok(None);
            }
            self.seen = header;
        }
        Ok(self
            .dirty
            .get(dataset)
            .map(|set| (self.generation, set.contains(&t))))
    }

    /// Whether the store's WAL-index header is still the one seen at the
    /// probe's last answer, so that [`FreshView::state_now`] answers
    /// without asking SQLite (for the tests of that path).
    pub fn header_unmoved(&self) -> bool {
        self.unmoved()
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The probe's `PRAGMA data_version` when the view was last read: it
    /// moves with every commit to the store by anyone (serve's clean-tile
    /// cache is dropped when it does).
    pub fn version(&self) -> i64 {
        self.version
    }
}

/// A served or stored tile's MVT bytes from its gzip.
pub fn gunzip(b: &[u8]) -> std::io::Result<Vec<u8>> {
    super::gunzip(b)
}
