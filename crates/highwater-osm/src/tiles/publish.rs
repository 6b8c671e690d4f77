//! `osm tiles publish NAME --to PLACE` (issue 50): the tile dataset as a
//! PMTiles v3 archive ([`super::pmtiles`]) in a folder or a bucket, kept
//! current incrementally.
//!
//! **Versions and a pointer.** Each publish writes a new, never rewritten
//! archive `STEM.vNNNNNNNN.pmtiles` beside the place's pointer
//! `STEM.pmtiles.json` (`{"pmtiles": "STEM.v00000007.pmtiles", "version":
//! 7, "sequence": …}`), then swaps the pointer, conditionally on the ETag
//! it read (S3 `If-Match`; a folder: rename). A reader that read the
//! pointer reads one archive whose bytes never change, so it sees the old
//! version or the new one and never a mix, even across many range
//! requests and through a CDN that caches each range (an archive replaced
//! in place under one name would mix an old header with new tile bytes).
//! The last `pmtiles_versions_kept` versions stay for readers that read
//! the pointer before a swap; older ones are deleted after it. A publish
//! killed before the swap leaves the pointer on the previous archive
//! (its unfinished multipart upload never becomes an object).
//!
//! **Incremental.** The store keeps, per dataset and place, the published
//! archive's entries (tile id, offset, length, content hash) and the tiles
//! drains re-cut since (`pmtiles_changed`, filled in the drain's own store
//! transaction). A later publish lays out: new head (header, directories,
//! metadata), the previous archive's whole tile data section (copied:
//! `UploadPartCopy` in a bucket, `copy_file_range` in a folder), then the
//! changed tiles' blobs appended. Offsets of unchanged tiles stay; the
//! archive is no longer clustered. A changed tile equal to a stored blob
//! (the sea, empty land) points at it. Blobs no tile points at any more
//! are dead bytes; past `pmtiles_dead_share_max_pct` of the data section,
//! the publish rewrites the archive whole (clustered, dedup'd) instead.
//! A rebuilt MBTiles file, another recipe, or a pointer naming a version
//! the store did not record also rewrite it whole.
//!
//! State: `pmtiles_published` (per dataset and place: version, the
//! dataset's marker and dirty count it reflects, sizes), read by `osm
//! status`.

use super::pmtiles::{self, Header};
use super::{failpoint, path_of, Mbtiles, TileDataset, TilesError, OSM_ATTRIBUTION};
use crate::store::{Store, StoreError, Writer};
use highwater_core::tile::Tile;
use rusqlite::params;
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

pub const TABLES: &str = "CREATE TABLE IF NOT EXISTS pmtiles_published(dataset TEXT NOT NULL, target TEXT NOT NULL, version INTEGER NOT NULL, sequence INTEGER, dirty INTEGER NOT NULL, recipe TEXT NOT NULL, data_offset INTEGER NOT NULL, data_bytes INTEGER NOT NULL, dead_bytes INTEGER NOT NULL, archive_bytes INTEGER NOT NULL, sent_bytes INTEGER NOT NULL, full INTEGER NOT NULL, stale INTEGER NOT NULL DEFAULT 0, at_ns INTEGER NOT NULL, PRIMARY KEY(dataset, target));
CREATE TABLE IF NOT EXISTS pmtiles_entries(dataset TEXT NOT NULL, target TEXT NOT NULL, tile_id INTEGER NOT NULL, offset INTEGER NOT NULL, length INTEGER NOT NULL, hash BLOB NOT NULL, PRIMARY KEY(dataset, target, tile_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pmtiles_changed(dataset TEXT NOT NULL, target TEXT NOT NULL, z INTEGER NOT NULL, x INTEGER NOT NULL, y INTEGER NOT NULL, PRIMARY KEY(dataset, target, z, x, y)) WITHOUT ROWID;";

/// A place's failure, as the place words it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PlaceError(pub String);

/// What crossed to the place.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Sent {
    /// Bytes sent (uploaded to a bucket; written from memory to a folder).
    pub uploaded_bytes: u64,
    /// Bytes copied inside the place from the previous archive.
    pub copied_bytes: u64,
}

/// One piece of a new archive.
#[derive(Clone, Debug)]
pub enum Segment {
    Bytes(Vec<u8>),
    /// `len` bytes of the previous archive from `offset`.
    Previous {
        offset: u64,
        len: u64,
    },
}

/// Where archives are published: a folder, or a prefix of a bucket. Names
/// are file names within it.
pub trait Place {
    /// As the user named it (`lake:tiles/base.pmtiles`, a path).
    fn describe(&self) -> String;
    /// The archive's name without `.pmtiles`.
    fn stem(&self) -> &str;
    /// The object's bytes and a tag for a conditional replace.
    fn read(&self, name: &str) -> Result<Option<(Vec<u8>, String)>, PlaceError>;
    /// Writes `bytes` at `name` if it still has the tag `expected` (absent:
    /// `None`); false when it changed meanwhile.
    fn put_if(
        &self,
        name: &str,
        bytes: Vec<u8>,
        expected: Option<&str>,
    ) -> Result<bool, PlaceError>;
    /// Writes the file `from` at `name`, whole or not at all.
    fn put_file(&self, from: &Path, name: &str) -> Result<Sent, PlaceError>;
    /// Writes `segments` at `name`, whole or not at all; `Previous` ranges
    /// come from the object `previous`.
    fn compose(&self, name: &str, previous: &str, segments: &[Segment])
        -> Result<Sent, PlaceError>;
    /// The names in the place's folder.
    fn names(&self) -> Result<Vec<String>, PlaceError>;
    /// Removes `name`; absent is fine.
    fn delete(&self, name: &str) -> Result<(), PlaceError>;
}

/// The pointer's name.
pub fn pointer_name(stem: &str) -> String {
    format!("{stem}.pmtiles.json")
}

/// Version `n`'s archive name.
pub fn version_name(stem: &str, n: i64) -> String {
    format!("{stem}.v{n:08}.pmtiles")
}

fn version_of(stem: &str, name: &str) -> Option<i64> {
    name.strip_prefix(stem)?
        .strip_prefix(".v")?
        .strip_suffix(".pmtiles")?
        .parse()
        .ok()
}

/// The stem of a `.pmtiles` name, or a clear refusal.
pub fn stem_of(file: &str, given: &str) -> Result<String, TilesError> {
    match file.strip_suffix(".pmtiles") {
        Some(s) if !s.is_empty() && !s.contains('/') => Ok(s.to_string()),
        _ => Err(TilesError::Publish {
            target: given.to_string(),
            message: "name the archive NAME.pmtiles (readers find it through NAME.pmtiles.json, which points at the current version)".into(),
        }),
    }
}

/// A folder on this machine.
pub struct LocalPlace {
    dir: PathBuf,
    stem: String,
    given: String,
}

impl LocalPlace {
    /// `path` is `DIR/NAME.pmtiles`; the folder is made if absent.
    pub fn new(path: &Path) -> Result<LocalPlace, TilesError> {
        let given = path.display().to_string();
        let file = path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let stem = stem_of(&file, &given)?;
        let dir = crate::import::parent_dir(path).to_path_buf();
        std::fs::create_dir_all(&dir).map_err(|err| TilesError::Io {
            path: dir.clone(),
            err,
        })?;
        Ok(LocalPlace { dir, stem, given })
    }

    fn tmp(&self, name: &str) -> PathBuf {
        self.dir
            .join(format!(".{name}.hw-tmp-{}", std::process::id()))
    }

    /// Writes through a temporary file, fsynced, renamed into place.
    fn write_with(
        &self,
        name: &str,
        f: impl FnOnce(&mut std::fs::File) -> std::io::Result<Sent>,
    ) -> Result<Sent, PlaceError> {
        let tmp = self.tmp(name);
        let to = self.dir.join(name);
        let r = (|| {
            let mut file = std::fs::File::create(&tmp)?;
            let sent = f(&mut file)?;
            file.sync_all()?;
            std::fs::rename(&tmp, &to)?;
            crate::import::sync_parent(&to)?;
            Ok::<_, std::io::Error>(sent)
        })();
        r.map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            PlaceError(format!("{}: {e}", to.display()))
        })
    }
}

fn tag_of(b: &[u8]) -> String {
    use sha2::Digest;
    let h = sha2::Sha256::digest(b);
    h.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

impl Place for LocalPlace {
    fn describe(&self) -> String {
        self.given.clone()
    }

    fn stem(&self) -> &str {
        &self.stem
    }

    fn read(&self, name: &str) -> Result<Option<(Vec<u8>, String)>, PlaceError> {
        match std::fs::read(self.dir.join(name)) {
            Ok(b) => {
                let t = tag_of(&b);
                Ok(Some((b, t)))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(PlaceError(format!(
                "{}: {e}",
                self.dir.join(name).display()
            ))),
        }
    }

    /// The check and the rename are two steps: two publishers of one folder
    /// are serialised by the store's writer lease, not by this.
    fn put_if(
        &self,
        name: &str,
        bytes: Vec<u8>,
        expected: Option<&str>,
    ) -> Result<bool, PlaceError> {
        let now = self.read(name)?.map(|(_, t)| t);
        if now.as_deref() != expected {
            return Ok(false);
        }
        self.write_with(name, |f| {
            f.write_all(&bytes)?;
            Ok(Sent::default())
        })?;
        Ok(true)
    }

    fn put_file(&self, from: &Path, name: &str) -> Result<Sent, PlaceError> {
        self.write_with(name, |f| {
            let mut src = std::fs::File::open(from)?;
            let n = std::io::copy(&mut src, f)?;
            Ok(Sent {
                uploaded_bytes: n,
                copied_bytes: 0,
            })
        })
    }

    fn compose(
        &self,
        name: &str,
        previous: &str,
        segments: &[Segment],
    ) -> Result<Sent, PlaceError> {
        let prev = self.dir.join(previous);
        self.write_with(name, |f| {
            let mut sent = Sent::default();
            let mut src = std::fs::File::open(&prev)?;
            for s in segments {
                match s {
                    Segment::Bytes(b) => {
                        f.write_all(b)?;
                        sent.uploaded_bytes += b.len() as u64;
                    }
                    Segment::Previous { offset, len } => {
                        src.seek(SeekFrom::Start(*offset))?;
                        // File to file: the kernel copies (copy_file_range).
                        let n = std::io::copy(&mut (&mut src).take(*len), f)?;
                        if n != *len {
                            return Err(std::io::Error::new(
                                std::io::ErrorKind::UnexpectedEof,
                                format!("{} ends before byte {}", prev.display(), offset + len),
                            ));
                        }
                        sent.copied_bytes += n;
                    }
                }
            }
            Ok(sent)
        })
    }

    fn names(&self) -> Result<Vec<String>, PlaceError> {
        let rd = std::fs::read_dir(&self.dir)
            .map_err(|e| PlaceError(format!("{}: {e}", self.dir.display())))?;
        Ok(rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect())
    }

    fn delete(&self, name: &str) -> Result<(), PlaceError> {
        match std::fs::remove_file(self.dir.join(name)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(PlaceError(format!(
                "{}: {e}",
                self.dir.join(name).display()
            ))),
        }
    }
}

/// What the store records of the archive published to one place.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Published {
    pub target: String,
    pub version: i64,
    /// The dataset's marker when published: the sequence its tiles were
    /// current to.
    pub sequence: Option<i64>,
    /// Dirty tiles not yet drained when published (stale in the archive).
    pub dirty: i64,
    #[serde(skip)]
    pub recipe: String,
    #[serde(skip)]
    pub data_offset: u64,
    pub data_bytes: u64,
    pub dead_bytes: u64,
    pub archive_bytes: u64,
    /// Bytes the last publish sent.
    pub sent_bytes: u64,
    /// Whether the last publish wrote the archive whole.
    pub full: bool,
    /// The MBTiles file was rebuilt since: the next publish is whole.
    pub stale: bool,
    pub at_ns: i64,
    /// Tiles drained since, waiting for the next publish.
    pub changed_since: i64,
}

fn read_published(s: &Store, dataset: &str) -> Result<Vec<Published>, StoreError> {
    let mut st = s
        .conn()
        .prepare(
            "SELECT target, version, sequence, dirty, recipe, data_offset, data_bytes, dead_bytes, archive_bytes, sent_bytes, full, stale, at_ns,
                    (SELECT count(*) FROM pmtiles_changed c WHERE c.dataset = p.dataset AND c.target = p.target)
             FROM pmtiles_published p WHERE dataset = ?1 ORDER BY target",
        )
        .map_err(|e| s.err(e))?;
    let rows = st
        .query_map([dataset], |r| {
            Ok(Published {
                target: r.get(0)?,
                version: r.get(1)?,
                sequence: r.get(2)?,
                dirty: r.get(3)?,
                recipe: r.get(4)?,
                data_offset: r.get::<_, i64>(5)? as u64,
                data_bytes: r.get::<_, i64>(6)? as u64,
                dead_bytes: r.get::<_, i64>(7)? as u64,
                archive_bytes: r.get::<_, i64>(8)? as u64,
                sent_bytes: r.get::<_, i64>(9)? as u64,
                full: r.get(10)?,
                stale: r.get(11)?,
                at_ns: r.get(12)?,
                changed_since: r.get(13)?,
            })
        })
        .map_err(|e| s.err(e))?;
    rows.collect::<Result<_, _>>().map_err(|e| s.err(e))
}

/// Every place the dataset was published to (for `osm status`).
pub fn published(s: &Store, dataset: &str) -> Result<Vec<Published>, StoreError> {
    read_published(s, dataset)
}

/// Called in the drain's store transaction: `tiles` were re-cut, so every
/// place the dataset is published to must take them next time.
pub fn note_drained(w: &mut Writer<'_>, dataset: &str, tiles: &[Tile]) -> Result<(), StoreError> {
    let any: bool = w
        .tx()
        .query_row(
            "SELECT EXISTS(SELECT 1 FROM pmtiles_published WHERE dataset = ?1)",
            [dataset],
            |r| r.get(0),
        )
        .map_err(|e| w.err(e))?;
    if !any {
        return Ok(());
    }
    let mut st = w
        .tx()
        .prepare_cached(
            "INSERT OR IGNORE INTO pmtiles_changed(dataset, target, z, x, y)
             SELECT dataset, target, ?2, ?3, ?4 FROM pmtiles_published WHERE dataset = ?1",
        )
        .map_err(|e| w.err(e))?;
    for t in tiles {
        st.execute(params![dataset, t.z, t.x, t.y])
            .map_err(|e| w.err(e))?;
    }
    Ok(())
}

/// Called when the MBTiles file is rebuilt: the next publish to every
/// place is whole.
pub fn note_rebuilt(w: &mut Writer<'_>, dataset: &str) -> Result<(), StoreError> {
    for sql in [
        "UPDATE pmtiles_published SET stale = 1 WHERE dataset = ?1",
        "DELETE FROM pmtiles_changed WHERE dataset = ?1",
    ] {
        w.tx().execute(sql, [dataset]).map_err(|e| w.err(e))?;
    }
    Ok(())
}

/// Limits of a publish, from `[osm.tiles.NAME]`.
#[derive(Clone, Copy, Debug)]
pub struct PublishLimits {
    /// Above this share of dead bytes in the data section (percent), the
    /// archive is rewritten whole.
    pub dead_share_max_pct: f64,
    /// Versions kept after a publish, the new one included (at least 2:
    /// a reader that read the pointer just before the swap finishes).
    pub versions_kept: usize,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PublishReport {
    pub dataset: String,
    pub target: String,
    /// The archive readers now get (the pointer's), its name.
    pub version: i64,
    pub archive: String,
    /// Nothing changed since the last publish: nothing was written.
    pub unchanged: bool,
    /// Why the archive was written whole, when it was.
    pub full_reason: Option<String>,
    pub tiles: u64,
    pub tiles_changed: u64,
    pub archive_bytes: u64,
    pub dead_bytes: u64,
    pub uploaded_bytes: u64,
    pub copied_bytes: u64,
    pub sequence: Option<i64>,
    pub dirty: i64,
    pub versions_deleted: Vec<String>,
    /// Old versions could not be deleted (the publish itself succeeded).
    pub sweep_error: Option<String>,
}

type Hash = [u8; 16];

fn hash(b: &[u8]) -> Hash {
    use sha2::Digest;
    let h = sha2::Sha256::digest(b);
    h[..16].try_into().expect("16 bytes")
}

/// tile id → (offset, length, content hash)
type Entries = BTreeMap<u64, (u64, u32, Hash)>;

fn pub_err(target: &str) -> impl Fn(PlaceError) -> TilesError + '_ {
    move |e| TilesError::Publish {
        target: target.to_string(),
        message: e.0,
    }
}

#[derive(serde::Deserialize, serde::Serialize)]
struct Pointer {
    pmtiles: String,
    version: i64,
    dataset: String,
    sequence: Option<i64>,
    archive_bytes: u64,
    published_at_unix_s: i64,
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Publishes the dataset's MBTiles file to `place` (see the module doc).
/// Run under the store's writer lease: no drain changes the file or the
/// changed set meanwhile.
pub fn publish(
    store: &mut Store,
    d: &TileDataset,
    place: &dyn Place,
    limits: PublishLimits,
) -> Result<PublishReport, TilesError> {
    store.lease_writer(false)?;
    let path = path_of(d)?.to_path_buf();
    let mb = Mbtiles::open(&path)?.ok_or_else(|| TilesError::Publish {
        target: place.describe(),
        message: format!(
            "{} does not exist yet: run `highwater osm tiles build --dataset {}` first",
            path.display(),
            d.name
        ),
    })?;
    let target = place.describe();
    let perr = pub_err(&target);
    let stem = place.stem().to_string();
    crate::import::sweep_leftovers(&path);
    let recipe = mb.metadata("highwater_recipe")?.unwrap_or_default();
    let state = read_published(store, &d.name)?
        .into_iter()
        .find(|p| p.target == target);
    let pointer = place.read(&pointer_name(&stem)).map_err(&perr)?;
    let (pointer, tag) = match pointer {
        Some((b, t)) => match serde_json::from_slice::<Pointer>(&b) {
            Ok(p) => (Some(p), Some(t)),
            Err(e) => {
                return Err(TilesError::Publish {
                    target: target.clone(),
                    message: format!(
                        "{} is not a highwater pointer ({e}); move it away or publish elsewhere",
                        pointer_name(&stem)
                    ),
                })
            }
        },
        None => (None, None),
    };
    let (sequence, dirty) = store
        .datasets()?
        .into_iter()
        .find(|r| r.0 == d.name)
        .map(|r| (r.1, r.3))
        .unwrap_or((None, 0));
    let mut full = match (&state, &pointer) {
        (None, _) => Some("the first publish to this place".to_string()),
        (Some(s), _) if s.stale => Some("the MBTiles file was rebuilt since".to_string()),
        (Some(s), _) if s.recipe != recipe => {
            Some("the tiles were cut with another recipe".to_string())
        }
        (Some(s), None) => Some(format!(
            "the pointer {} is gone (the store recorded version {})",
            pointer_name(&stem),
            s.version
        )),
        (Some(s), Some(p)) if p.version != s.version || p.pmtiles != version_name(&stem, s.version) => {
            Some(format!(
                "the pointer names version {}, the store recorded {} (a publish killed after its swap, or another publisher)",
                p.version, s.version
            ))
        }
        _ => None,
    };
    let version = state
        .as_ref()
        .map_or(0, |s| s.version)
        .max(pointer.as_ref().map_or(0, |p| p.version))
        + 1;
    let mut report = PublishReport {
        dataset: d.name.clone(),
        target: target.clone(),
        sequence,
        dirty,
        ..Default::default()
    };
    let changed = changed_tiles(store, &d.name, &target)?;
    if full.is_none() && changed.is_empty() {
        // Nothing re-cut since: the archive already holds these tiles.
        let s = state.as_ref().expect("not full: recorded");
        store.write(|w| {
            w.tx()
                .execute(
                    "UPDATE pmtiles_published SET sequence = ?3, dirty = ?4 WHERE dataset = ?1 AND target = ?2",
                    params![d.name, target, sequence, dirty],
                )
                .map(|_| ())
                .map_err(|e| w.err(e))
        })?;
        report.version = s.version;
        report.archive = version_name(&stem, s.version);
        report.unchanged = true;
        report.archive_bytes = s.archive_bytes;
        report.dead_bytes = s.dead_bytes;
        return Ok(report);
    }
    let name = version_name(&stem, version);
    let meta = |sequence: Option<i64>| metadata(&mb, d, sequence, version);
    // The incremental layout, unless it must or should be whole.
    let mut written: Option<(Entries, Sent, u64, u64, u64, Vec<u64>)> = None;
    if full.is_none() {
        let s = state.as_ref().expect("recorded");
        let mut entries = load_entries(store, &d.name, &target)?;
        let tiles: Vec<Tile> = changed.iter().map(|(_, t)| *t).collect();
        let raw = mb.get_raw(&tiles)?;
        let mut by_hash: HashMap<Hash, (u64, u32)> =
            entries.values().map(|&(o, l, h)| (h, (o, l))).collect();
        let mut appended: Vec<u8> = Vec::new();
        let mut ids_changed = Vec::new();
        for (id, t) in &changed {
            match raw.get(t) {
                None => {
                    if entries.remove(id).is_some() {
                        ids_changed.push(*id);
                    }
                }
                Some(b) => {
                    let h = hash(b);
                    if entries.get(id).is_some_and(|e| e.2 == h) {
                        continue;
                    }
                    let (o, l) = *by_hash.entry(h).or_insert_with(|| {
                        let o = s.data_bytes + appended.len() as u64;
                        appended.extend_from_slice(b);
                        (o, b.len() as u32)
                    });
                    entries.insert(*id, (o, l, h));
                    ids_changed.push(*id);
                }
            }
        }
        let data_bytes = s.data_bytes + appended.len() as u64;
        let dead = data_bytes - live_bytes(&entries);
        if dead as f64 * 100.0 > limits.dead_share_max_pct * data_bytes as f64 {
            full = Some(format!(
                "{dead} of its {data_bytes} tile bytes would be dead, more than pmtiles_dead_share_max_pct = {}",
                limits.dead_share_max_pct
            ));
        } else {
            let head = head_of(&entries, &meta(sequence)?, d, false);
            let segments = [
                Segment::Bytes(head.bytes.clone()),
                Segment::Previous {
                    offset: s.data_offset,
                    len: s.data_bytes,
                },
                Segment::Bytes(appended),
            ];
            failpoint("fail-pmtiles-before-upload", &d.name)?;
            let sent = place
                .compose(&name, &version_name(&stem, s.version), &segments)
                .map_err(&perr)?;
            written = Some((
                entries,
                sent,
                head.header.data_offset,
                data_bytes,
                dead,
                ids_changed,
            ));
        }
    }
    let (entries, sent, data_offset, data_bytes, dead, ids_changed) = match written {
        Some(w) => w,
        None => {
            let (entries, sent, data_offset, data_bytes) =
                write_whole(&mb, d, place, &name, &meta(sequence)?, &path).map_err(
                    |e| match e {
                        WholeError::Tiles(e) => e,
                        WholeError::Place(e) => perr(e),
                    },
                )?;
            (entries, sent, data_offset, data_bytes, 0, Vec::new())
        }
    };
    report.tiles_changed = if full.is_some() {
        entries.len() as u64
    } else {
        ids_changed.len() as u64
    };
    report.tiles = entries.len() as u64;
    report.uploaded_bytes = sent.uploaded_bytes;
    report.copied_bytes = sent.copied_bytes;
    report.archive_bytes = data_offset + data_bytes;
    report.dead_bytes = dead;
    report.full_reason = full.clone();
    report.version = version;
    report.archive = name.clone();
    failpoint("kill-pmtiles-after-upload", &d.name)?;
    let p = Pointer {
        pmtiles: name.clone(),
        version,
        dataset: d.name.clone(),
        sequence,
        archive_bytes: report.archive_bytes,
        published_at_unix_s: now_ns() / 1_000_000_000,
    };
    let body = serde_json::to_vec_pretty(&p).expect("a pointer serialises");
    if !place
        .put_if(&pointer_name(&stem), body, tag.as_deref())
        .map_err(&perr)?
    {
        let _ = place.delete(&name);
        return Err(TilesError::Publish {
            target: target.clone(),
            message: format!(
                "{} changed while this publish ran: another publisher wrote it; run the publish again",
                pointer_name(&stem)
            ),
        });
    }
    failpoint("kill-pmtiles-after-swap", &d.name)?;
    let whole = full.is_some();
    store.write(|w| {
        let path = w.path().to_path_buf();
        let e = |err| StoreError::Sqlite {
            path: path.clone(),
            err,
        };
        let tx = w.tx();
        tx.execute(
            "INSERT OR REPLACE INTO pmtiles_published(dataset, target, version, sequence, dirty, recipe, data_offset, data_bytes, dead_bytes, archive_bytes, sent_bytes, full, stale, at_ns)
             VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, 0, ?13)",
            params![
                d.name, target, version, sequence, dirty, recipe,
                data_offset as i64, data_bytes as i64, dead as i64,
                (data_offset + data_bytes) as i64, sent.uploaded_bytes as i64, whole, now_ns()
            ],
        )
        .map_err(e)?;
        tx.execute(
            "DELETE FROM pmtiles_changed WHERE dataset = ?1 AND target = ?2",
            params![d.name, target],
        )
        .map_err(e)?;
        let mut put = tx
            .prepare_cached(
                "INSERT OR REPLACE INTO pmtiles_entries(dataset, target, tile_id, offset, length, hash) VALUES(?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .map_err(e)?;
        let mut del = tx
            .prepare_cached(
                "DELETE FROM pmtiles_entries WHERE dataset = ?1 AND target = ?2 AND tile_id = ?3",
            )
            .map_err(e)?;
        let write_one = |id: u64| match entries.get(&id) {
            Some(&(o, l, h)) => put.execute(params![
                d.name,
                target,
                id as i64,
                o as i64,
                l,
                &h[..]
            ]),
            None => del.execute(params![d.name, target, id as i64]),
        };
        if whole {
            tx.execute(
                "DELETE FROM pmtiles_entries WHERE dataset = ?1 AND target = ?2",
                params![d.name, target],
            )
            .map_err(e)?;
            let mut write_one = write_one;
            for &id in entries.keys() {
                write_one(id).map_err(e)?;
            }
        } else {
            let mut write_one = write_one;
            for &id in &ids_changed {
                write_one(id).map_err(e)?;
            }
        }
        Ok(())
    })?;
    // Published and recorded: a version that cannot be deleted is said
    // (exit 1), not an error that hides the publish.
    match sweep_versions(place, &stem, version, limits.versions_kept) {
        Ok(gone) => report.versions_deleted = gone,
        Err(e) => report.sweep_error = Some(e.0),
    }
    Ok(report)
}

/// Deletes versions older than the `kept` newest (the current included).
fn sweep_versions(
    place: &dyn Place,
    stem: &str,
    current: i64,
    kept: usize,
) -> Result<Vec<String>, PlaceError> {
    let oldest_kept = current - kept.max(2) as i64 + 1;
    let mut gone = Vec::new();
    for n in place.names()? {
        if let Some(v) = version_of(stem, &n) {
            if v < oldest_kept {
                place.delete(&n)?;
                gone.push(n);
            }
        }
    }
    gone.sort();
    Ok(gone)
}

fn changed_tiles(
    store: &Store,
    dataset: &str,
    target: &str,
) -> Result<Vec<(u64, Tile)>, StoreError> {
    let mut st = store
        .conn()
        .prepare("SELECT z, x, y FROM pmtiles_changed WHERE dataset = ?1 AND target = ?2")
        .map_err(|e| store.err(e))?;
    let rows = st
        .query_map(params![dataset, target], |r| {
            Ok(Tile {
                z: r.get(0)?,
                x: r.get(1)?,
                y: r.get(2)?,
            })
        })
        .map_err(|e| store.err(e))?;
    let mut v: Vec<(u64, Tile)> = rows
        .map(|t| t.map(|t| (pmtiles::tile_id(t.z, t.x, t.y), t)))
        .collect::<Result<_, _>>()
        .map_err(|e| store.err(e))?;
    v.sort_by_key(|(id, _)| *id);
    Ok(v)
}

fn load_entries(store: &Store, dataset: &str, target: &str) -> Result<Entries, StoreError> {
    let mut st = store
        .conn()
        .prepare(
            "SELECT tile_id, offset, length, hash FROM pmtiles_entries WHERE dataset = ?1 AND target = ?2",
        )
        .map_err(|e| store.err(e))?;
    let rows = st
        .query_map(params![dataset, target], |r| {
            let h: Vec<u8> = r.get(3)?;
            let mut hash = [0u8; 16];
            hash.copy_from_slice(&h[..16.min(h.len())]);
            Ok((
                r.get::<_, i64>(0)? as u64,
                (r.get::<_, i64>(1)? as u64, r.get::<_, u32>(2)?, hash),
            ))
        })
        .map_err(|e| store.err(e))?;
    rows.collect::<Result<_, _>>().map_err(|e| store.err(e))
}

/// Bytes of the data section some tile points at.
fn live_bytes(entries: &Entries) -> u64 {
    let mut blobs: HashMap<u64, u32> = HashMap::new();
    for &(o, l, _) in entries.values() {
        blobs.insert(o, l);
    }
    blobs.values().map(|&l| u64::from(l)).sum()
}

/// The archive's head for `entries`.
fn head_of(
    entries: &Entries,
    metadata: &serde_json::Value,
    d: &TileDataset,
    clustered: bool,
) -> pmtiles::Head {
    let runs = pmtiles::runs(entries.iter().map(|(&id, &(o, l, _))| (id, o, l)));
    let contents = entries
        .values()
        .map(|e| e.0)
        .collect::<std::collections::HashSet<_>>()
        .len();
    let (bounds, zmin, zmax) = pmtiles::bounds_of(entries.keys().copied()).unwrap_or((
        [-180.0, -85.05, 180.0, 85.05],
        d.layer.zoom_min,
        d.layer.zoom_max,
    ));
    let center = [(bounds[0] + bounds[2]) / 2.0, (bounds[1] + bounds[3]) / 2.0];
    // The zoom at which the bounds span about a tile: where a map opening
    // the archive shows all of it.
    let span = (bounds[2] - bounds[0]).max(1e-9);
    let fit = (360.0 / span).log2().floor().clamp(0.0, 22.0) as u8;
    let header = Header {
        addressed_tiles: entries.len() as u64,
        tile_entries: runs.len() as u64,
        tile_contents: contents as u64,
        clustered,
        min_zoom: zmin,
        max_zoom: zmax,
        bounds,
        center_zoom: fit.clamp(zmin, zmax),
        center,
        ..Default::default()
    };
    pmtiles::head(&runs, metadata, header)
}

/// The metadata JSON: the MBTiles file's layers, the attribution ODbL
/// asks for, and what the archive reflects.
fn metadata(
    mb: &Mbtiles,
    d: &TileDataset,
    sequence: Option<i64>,
    version: i64,
) -> Result<serde_json::Value, TilesError> {
    let layers = mb
        .metadata("json")?
        .and_then(|j| serde_json::from_str::<serde_json::Value>(&j).ok())
        .and_then(|j| j.get("vector_layers").cloned())
        .unwrap_or_else(|| serde_json::json!([]));
    Ok(serde_json::json!({
        "name": d.name,
        "description": format!("{} tiles from OpenStreetMap, published by highwater", d.name),
        "attribution": OSM_ATTRIBUTION,
        "type": mb.metadata("type")?.unwrap_or_else(|| "overlay".into()),
        "vector_layers": layers,
        "highwater_schema": mb.metadata("highwater_schema")?,
        "highwater_recipe": mb.metadata("highwater_recipe")?,
        "highwater_sequence": sequence,
        "highwater_version": version,
    }))
}

enum WholeError {
    Tiles(TilesError),
    Place(PlaceError),
}

impl From<TilesError> for WholeError {
    fn from(e: TilesError) -> Self {
        WholeError::Tiles(e)
    }
}

/// Tiles read from the MBTiles file per query batch of a whole write.
const WHOLE_BATCH_TILES: usize = 1024;

/// Writes the archive whole: tiles in tile-id order (clustered), equal
/// blobs stored once, into a file beside the MBTiles file, then put.
/// Returns its entries, what was sent, the data section's offset and size.
fn write_whole(
    mb: &Mbtiles,
    d: &TileDataset,
    place: &dyn Place,
    name: &str,
    metadata: &serde_json::Value,
    mbtiles: &Path,
) -> Result<(Entries, Sent, u64, u64), WholeError> {
    let mut tiles: Vec<(u64, Tile)> = mb
        .tiles()?
        .into_iter()
        .map(|t| (pmtiles::tile_id(t.z, t.x, t.y), t))
        .collect();
    tiles.sort_by_key(|(id, _)| *id);
    let file = mbtiles.file_name().unwrap_or_default().to_string_lossy();
    let dir = crate::import::parent_dir(mbtiles);
    let data_path = dir.join(format!(
        ".{file}.hw-tmp-pmtiles-data-{}",
        std::process::id()
    ));
    let out_path = dir.join(format!(".{file}.hw-tmp-pmtiles-{}", std::process::id()));
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |err| {
            WholeError::Tiles(TilesError::Io {
                path: path.clone(),
                err,
            })
        }
    };
    let result = (|| {
        let mut data =
            std::io::BufWriter::new(std::fs::File::create(&data_path).map_err(io(&data_path))?);
        let mut entries = Entries::new();
        let mut by_hash: HashMap<Hash, (u64, u32)> = HashMap::new();
        let mut at = 0u64;
        for chunk in tiles.chunks(WHOLE_BATCH_TILES) {
            let ts: Vec<Tile> = chunk.iter().map(|(_, t)| *t).collect();
            let raw = mb.get_raw(&ts)?;
            for (id, t) in chunk {
                let Some(b) = raw.get(t) else { continue };
                let h = hash(b);
                let (o, l) = match by_hash.get(&h) {
                    Some(&e) => e,
                    None => {
                        data.write_all(b).map_err(io(&data_path))?;
                        let e = (at, b.len() as u32);
                        at += b.len() as u64;
                        by_hash.insert(h, e);
                        e
                    }
                };
                entries.insert(*id, (o, l, h));
            }
        }
        data.flush().map_err(io(&data_path))?;
        drop(data);
        let head = head_of(&entries, metadata, d, true);
        let mut out = std::fs::File::create(&out_path).map_err(io(&out_path))?;
        out.write_all(&head.bytes).map_err(io(&out_path))?;
        let mut src = std::fs::File::open(&data_path).map_err(io(&data_path))?;
        std::io::copy(&mut src, &mut out).map_err(io(&out_path))?;
        out.sync_all().map_err(io(&out_path))?;
        drop(out);
        failpoint("fail-pmtiles-before-upload", &d.name)?;
        let sent = place.put_file(&out_path, name).map_err(WholeError::Place)?;
        Ok((entries, sent, head.header.data_offset, at))
    })();
    let _ = std::fs::remove_file(&data_path);
    let _ = std::fs::remove_file(&out_path);
    result
}

/// The text `osm tiles publish` prints.
pub fn report_text(r: &PublishReport) -> String {
    if r.unchanged {
        return format!(
            "{}: {} is current (version {}, no tile re-cut since); nothing written",
            r.dataset, r.target, r.version
        );
    }
    let how = match &r.full_reason {
        Some(why) => format!("whole ({why})"),
        None => format!("incremental: {} tiles changed", r.tiles_changed),
    };
    format!(
        "{}: published {} to {} ({how}); {} tiles, {} bytes ({} dead); sent {} bytes, copied {} in place; reflects sequence {}{}",
        r.dataset,
        r.archive,
        r.target,
        r.tiles,
        r.archive_bytes,
        r.dead_bytes,
        r.uploaded_bytes,
        r.copied_bytes,
        r.sequence.map_or("none".to_string(), |s| s.to_string()),
        if r.dirty > 0 {
            format!(", {} dirty tiles not yet drained", r.dirty)
        } else {
            String::new()
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_names_round_trip() {
        assert_eq!(version_name("base", 7), "base.v00000007.pmtiles");
        assert_eq!(version_of("base", "base.v00000007.pmtiles"), Some(7));
        assert_eq!(version_of("base", "base.pmtiles.json"), None);
        assert_eq!(version_of("base", "basement.v00000001.pmtiles"), None);
    }
}
