//! The manifest snapshot: one stage's loaded manifest as one file, read in
//! one pass, so that a no-change plan does not decode a SQLite row per item
//! (issue 22: the load was 17 of a 20,000-item plan's 36 ms; git's index is
//! the model, one sorted array in one file).
//!
//! The snapshot is a cache, never the truth. It is taken only from what the
//! SQLite store loaded, and used only when it carries the stage's current
//! **manifest token**: a random number that SQLite triggers replace on every
//! insert, update or delete of that stage's rows (`entries`, `output_dirs`,
//! `item_deps`), in the writing transaction itself. So no writer, ours or a
//! future one, can change a stage without invalidating its snapshot, and a
//! state store replaced by another one, or restored from a backup, carries
//! tokens that no newer snapshot holds.
//!
//! Layout (little-endian): magic, token, stage, the items, the members, the
//! output folders, the dependency links and sets, and an XXH64 of all of it.
//! A file that is short, damaged, of another format, stage or token is not
//! used: the caller loads from SQLite, as without a snapshot.

use crate::{DirRecord, StageEntries};
use highwater_core::evidence::{Algo, Digest};
use highwater_core::{Entries, Entry, EntryKind, Stat, Status};
use std::hash::Hasher;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The format's name and version: a change of layout changes it.
const MAGIC: &[u8; 8] = b"HWMANI01";

/// The fewest bytes an entry takes, to bound what a count may reserve.
const ENTRY_BYTES_MIN: usize = 1 + 4 + 1 + 8 * 8 + 4 + 4 + 1 + 1;

/// The file that holds `stage`'s snapshot, beside the state store `db`:
/// `<db>.manifest/<hash of the stage name>` (a name may hold any character).
pub fn path_for(db: &Path, stage: &str) -> PathBuf {
    path_in(db, ".manifest", stage)
}

/// `<db><suffix>/<hash of name>`: the folder beside the store holding one
/// kind of cache file, one per name.
pub(crate) fn path_in(db: &Path, suffix: &str, name: &str) -> PathBuf {
    let mut dir = db.as_os_str().to_os_string();
    dir.push(suffix);
    let mut h = twox_hash::XxHash64::with_seed(0);
    h.write(name.as_bytes());
    PathBuf::from(dir).join(format!("{:016x}", h.finish()))
}

/// Writes `entries` as `stage`'s snapshot at `token`: a temporary file
/// renamed into place, so a reader sees a whole file or the previous one.
/// Not synced: after a power loss a torn file fails its checksum.
pub fn write(path: &Path, token: i64, stage: &str, entries: &StageEntries) -> std::io::Result<()> {
    write_file(path, &encode(token, stage, entries))
}

/// `bytes` at `path`, through a temporary file renamed into place.
pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().expect("a snapshot path has a folder");
    std::fs::create_dir_all(dir)?;
    // Unique per process and call: two writers never share a temporary.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".tmp-{}-{seq}", std::process::id()));
    let res = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes))
        .and_then(|()| std::fs::rename(&tmp, path));
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

/// A stage's snapshot as of a manifest token read in a transaction: read
/// and decoded later by [`Later::read`], on any thread.
#[derive(Clone, Debug)]
pub struct Later {
    pub(crate) path: PathBuf,
    pub(crate) token: i64,
    pub(crate) stage: String,
}

impl Later {
    /// The entries, if the file is whole and still at the token; `None`
    /// otherwise (never another state's entries).
    pub fn read(&self) -> Option<StageEntries> {
        read(&self.path, self.token, &self.stage)
    }
}

/// Reads `stage`'s snapshot if it is whole and at `token`.
pub fn read(path: &Path, token: i64, stage: &str) -> Option<StageEntries> {
    let bytes = std::fs::read(path).ok()?;
    decode(&bytes, token, stage)
}

/// Whether the file at `path` claims to be `stage`'s snapshot at `token`:
/// its head only, not its checksum (a damaged body is found, and replaced,
/// by the load that reads it).
pub fn is_current(path: &Path, token: i64, stage: &str) -> bool {
    use std::io::Read;
    let mut head = vec![0u8; 8 + 8 + 4 + stage.len()];
    let read = std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut head));
    let mut r = Reader { b: &head };
    read.is_ok() && r.take(8) == Some(MAGIC) && r.i64() == Some(token) && r.str() == Some(stage)
}

pub fn encode(token: i64, stage: &str, e: &StageEntries) -> Vec<u8> {
    let mut w = Vec::with_capacity(
        64 + (e.items.len() + e.members.len()) * (ENTRY_BYTES_MIN + 96) + e.item_sets.len() * 4,
    );
    w.extend_from_slice(MAGIC);
    w.extend_from_slice(&token.to_le_bytes());
    put_str(&mut w, stage);
    for list in [&e.items, &e.members] {
        put_len(&mut w, list.len());
        for entry in list.values() {
            put_entry(&mut w, entry);
        }
    }
    put_len(&mut w, e.dirs.len());
    for d in e.dirs.values() {
        put_str(&mut w, &d.dir);
        w.extend_from_slice(&d.mtime_ns.to_le_bytes());
        w.extend_from_slice(&d.ctime_ns.to_le_bytes());
        w.extend_from_slice(&d.ino.to_le_bytes());
        w.extend_from_slice(&d.observed_at_ns.to_le_bytes());
    }
    put_len(&mut w, e.item_sets.len());
    for s in &e.item_sets {
        w.extend_from_slice(&s.unwrap_or(u32::MAX).to_le_bytes());
    }
    put_len(&mut w, e.dep_sets.len());
    for (id, body) in &e.dep_sets {
        put_str(&mut w, id);
        put_str(&mut w, body);
    }
    let sum = checksum(&w);
    w.extend_from_slice(&sum.to_le_bytes());
    w
}

pub fn decode(bytes: &[u8], token: i64, stage: &str) -> Option<StageEntries> {
    let mut r = body(bytes, MAGIC, token, stage)?;
    let mut lists = [Vec::new(), Vec::new()];
    for (list, kind) in lists.iter_mut().zip([EntryKind::Item, EntryKind::Member]) {
        let n = r.len(ENTRY_BYTES_MIN)?;
        list.reserve_exact(n);
        for _ in 0..n {
            let e = r.entry()?;
            if e.kind != kind || list.last().is_some_and(|p: &Entry| p.item >= e.item) {
                return None;
            }
            list.push(e);
        }
    }
    let [items, members] = lists;
    let mut dirs = std::collections::BTreeMap::new();
    for _ in 0..r.len(4 + 32)? {
        let d = DirRecord {
            dir: r.str()?.to_string(),
            mtime_ns: r.i64()?,
            ctime_ns: r.i64()?,
            ino: r.u64()?,
            observed_at_ns: r.i64()?,
        };
        dirs.insert(d.dir.clone(), d);
    }
    let n = r.len(4)?;
    let mut item_sets = Vec::with_capacity(n);
    for _ in 0..n {
        let i = r.u32()?;
        item_sets.push((i != u32::MAX).then_some(i));
    }
    let n = r.len(8)?;
    let mut dep_sets = Vec::with_capacity(n);
    for _ in 0..n {
        dep_sets.push((r.str()?.to_string(), r.str()?.to_string()));
    }
    // What a load guarantees, checked: a link names a stored set, and the
    // links are as many as the items or none.
    if !r.b.is_empty()
        || !(item_sets.is_empty() || item_sets.len() == items.len())
        || item_sets
            .iter()
            .flatten()
            .any(|&i| i as usize >= dep_sets.len())
    {
        return None;
    }
    Some(StageEntries {
        items: Entries::from_sorted(items),
        members: Entries::from_sorted(members),
        dirs,
        item_sets,
        dep_sets,
    })
}

/// The body of a cache file of format `magic` for `name` at `token`,
/// after its head, once its checksum holds; `None` for anything else.
pub(crate) fn body<'a>(
    bytes: &'a [u8],
    magic: &[u8; 8],
    token: i64,
    name: &str,
) -> Option<Reader<'a>> {
    let (body, sum) = bytes.split_at_checked(bytes.len().checked_sub(8)?)?;
    if checksum(body) != u64::from_le_bytes(sum.try_into().ok()?) {
        return None;
    }
    let mut r = Reader { b: body };
    (r.take(8)? == magic && r.i64()? == token && r.str()? == name).then_some(r)
}

pub(crate) fn checksum(b: &[u8]) -> u64 {
    let mut h = twox_hash::XxHash64::with_seed(0x6877_6d61_6e69);
    h.write(b);
    h.finish()
}

pub(crate) fn put_len(w: &mut Vec<u8>, n: usize) {
    w.extend_from_slice(
        &u32::try_from(n)
            .expect("fewer than 2^32 rows")
            .to_le_bytes(),
    );
}

pub(crate) fn put_str(w: &mut Vec<u8>, s: &str) {
    put_len(w, s.len());
    w.extend_from_slice(s.as_bytes());
}

fn put_entry(w: &mut Vec<u8>, e: &Entry) {
    w.push(match e.kind {
        EntryKind::Item => 0,
        EntryKind::Member => 1,
    });
    put_str(w, &e.item);
    match &e.digest {
        None => w.push(0),
        Some(d) => {
            w.push(1);
            put_str(w, d.algo().prefix());
            w.extend_from_slice(d.as_bytes());
        }
    }
    for v in [e.stat.size, e.stat.ino, e.stat.dev, e.duration_ms] {
        w.extend_from_slice(&v.to_le_bytes());
    }
    for v in [
        e.stat.mtime_ns,
        e.stat.ctime_ns,
        e.observed_at_ns,
        e.processed_at_ns,
    ] {
        w.extend_from_slice(&v.to_le_bytes());
    }
    put_str(w, &e.recipe);
    put_str(w, &e.output);
    w.push(match e.status {
        Status::Ok => 0,
        Status::Failed => 1,
    });
    match &e.error {
        None => w.push(0),
        Some(s) => {
            w.push(1);
            put_str(w, s);
        }
    }
}

/// Reads the layout back; `None` at the first byte out of place.
pub(crate) struct Reader<'a> {
    pub(crate) b: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.b.split_at_checked(n)?;
        self.b = rest;
        Some(head)
    }
    pub(crate) fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    pub(crate) fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    /// A count of records of at least `min_bytes` each: never more than the
    /// bytes left could hold, so a bad count cannot reserve gigabytes.
    pub(crate) fn len(&mut self, min_bytes: usize) -> Option<usize> {
        let n = self.u32()? as usize;
        (n.checked_mul(min_bytes)? <= self.b.len()).then_some(n)
    }
    pub(crate) fn str(&mut self) -> Option<&'a str> {
        let n = self.u32()? as usize;
        std::str::from_utf8(self.take(n)?).ok()
    }
    fn entry(&mut self) -> Option<Entry> {
        let kind = match self.u8()? {
            0 => EntryKind::Item,
            1 => EntryKind::Member,
            _ => return None,
        };
        let item = self.str()?.to_string();
        let digest = match self.u8()? {
            0 => None,
            1 => {
                let algo = Algo::from_prefix(self.str()?)?;
                Some(Digest::from_bytes(algo, self.take(32)?.try_into().ok()?))
            }
            _ => return None,
        };
        let (size, ino, dev, duration_ms) = (self.u64()?, self.u64()?, self.u64()?, self.u64()?);
        let (mtime_ns, ctime_ns) = (self.i64()?, self.i64()?);
        let (observed_at_ns, processed_at_ns) = (self.i64()?, self.i64()?);
        let recipe = self.str()?.to_string();
        let output = self.str()?.to_string();
        let status = match self.u8()? {
            0 => Status::Ok,
            1 => Status::Failed,
            _ => return None,
        };
        let error = match self.u8()? {
            0 => None,
            1 => Some(self.str()?.to_string()),
            _ => return None,
        };
        Some(Entry {
            kind,
            item,
            digest,
            stat: Stat {
                size,
                mtime_ns,
                ctime_ns,
                ino,
                dev,
            },
            observed_at_ns,
            recipe,
            output,
            status,
            error,
            processed_at_ns,
            duration_ms,
        })
    }
}
