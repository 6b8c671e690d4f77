//! Node locations for planet-scale stores: one flat file indexed by node
//! id, 8 bytes per id (latitude and longitude in 1e-7 degrees, i32 each,
//! little-endian), as osm2pgsql's flat nodes.
//!
//! Why: the planet has about 10 billion node ids and 9 billion nodes, and
//! almost every one is a way's vertex with no tags. A B-tree row per node
//! costs several times the 8 bytes of its location and a lookup costs a
//! tree descent; here a lookup is one `pread` at `id * 8`, the file is about
//! 100 GB at today's largest id, and the OS page cache holds the hot part.
//! Ids never used are holes of a sparse file, and take no disk.
//!
//! Absence: a hole reads as zeros, and (0, 0) is a real place (Null
//! Island), so the latitude is stored with its sign bit flipped: a stored
//! zero would be a latitude of `i32::MIN` (-214.7°), which no node has, and
//! reads as "no node".
//!
//! In the store (`[osm] flat_nodes = "path"`, see `store.rs`): tagged
//! nodes and ways stay in SQLite; untagged nodes' locations are here, and
//! their node-block entries say so (flag 4) and keep the ways through
//! them, behind the same `OsmRead::node`. Slot 0 (id 0 is never a node)
//! holds the token of the store the file belongs to, so that a store
//! never reads another import's file.
//!
//! Writes: an import writes a new file (`PATH.hw-import`) in id order
//! ([`SeqWriter`]) and renames it over `PATH` just before it publishes the
//! store. An apply keeps its locations in the writer until the store's
//! transaction is about to commit, then writes them under the writer
//! lease with an undo log (`PATH.undo`: the old slots, and the flat
//! epoch the transaction commits), fsynced before the file is touched. On
//! the next lease, a log whose epoch the store did not commit is rolled
//! back, one it did is dropped: a crash at any point leaves the file as
//! the store's committed state says, so derive-before-apply of the
//! re-applied diff reads the true old locations. [`NODE_ID_MAX`] bounds
//! the file: an id above it is refused by name, never a 1 TB file by
//! accident.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Bytes per node id.
const SLOT: u64 = 8;

/// The largest node id the planet may reach within this design's life
/// (ids are about 1.3e10 in 2026): 2^36 ids, a 512 GiB sparse file at most.
pub const NODE_ID_MAX: i64 = 1 << 36;

#[derive(Debug, thiserror::Error)]
pub enum FlatNodesError {
    #[error("flat nodes {}: {err}", path.display())]
    Io { path: PathBuf, err: std::io::Error },
    #[error("flat nodes {}: node id {id} is outside 1..={max} (node_id_max, 2^36): the flat file holds ids in that range only. An id this large is a corrupt input, not a real node; to store it anyway, import without `flat_nodes` in [osm]", path.display())]
    IdOutOfRange { path: PathBuf, id: i64, max: i64 },
}

pub struct FlatNodes {
    file: File,
    path: PathBuf,
    max: i64,
}

impl FlatNodes {
    /// Opens (or creates) the file.
    pub fn open(path: &Path) -> Result<FlatNodes, FlatNodesError> {
        Self::open_with_max(path, NODE_ID_MAX)
    }

    pub fn open_with_max(path: &Path, max: i64) -> Result<FlatNodes, FlatNodesError> {
        let mut opts = std::fs::OpenOptions::new();
        opts.read(true).write(true).create(true).truncate(false);
        Self::open_as(&opts, path, max)
    }

    fn open_as(
        opts: &std::fs::OpenOptions,
        path: &Path,
        max: i64,
    ) -> Result<FlatNodes, FlatNodesError> {
        let file = opts.open(path).map_err(|err| FlatNodesError::Io {
            path: path.to_path_buf(),
            err,
        })?;
        Ok(FlatNodes {
            file,
            path: path.to_path_buf(),
            max,
        })
    }

    pub(crate) fn offset(&self, id: i64) -> Result<u64, FlatNodesError> {
        if id < 1 || id > self.max {
            return Err(FlatNodesError::IdOutOfRange {
                path: self.path.clone(),
                id,
                max: self.max,
            });
        }
        Ok(id as u64 * SLOT)
    }

    fn io(&self, err: std::io::Error) -> FlatNodesError {
        FlatNodesError::Io {
            path: self.path.clone(),
            err,
        }
    }

    /// Opens a file that must exist (a store's).
    pub fn open_existing(path: &Path) -> Result<FlatNodes, FlatNodesError> {
        let mut opts = std::fs::OpenOptions::new();
        opts.read(true).write(true);
        Self::open_as(&opts, path, NODE_ID_MAX)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records a node's location.
    pub fn set(&self, id: i64, lat_e7: i32, lon_e7: i32) -> Result<(), FlatNodesError> {
        let at = self.offset(id)?;
        self.file
            .write_all_at(&slot(lat_e7, lon_e7), at)
            .map_err(|e| self.io(e))
    }

    /// The raw 8 bytes of a slot (zeros past the end), for the undo log.
    pub fn raw(&self, id: i64) -> Result<[u8; 8], FlatNodesError> {
        let at = self.offset(id)?;
        let mut b = [0u8; 8];
        match self.file.read_exact_at(&mut b, at) {
            Ok(()) => Ok(b),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok([0; 8]),
            Err(e) => Err(self.io(e)),
        }
    }

    /// Writes a slot's raw bytes back (rolling back from the undo log).
    pub fn put_raw(&self, id: i64, b: [u8; 8]) -> Result<(), FlatNodesError> {
        let at = self.offset(id)?;
        self.file.write_all_at(&b, at).map_err(|e| self.io(e))
    }

    /// The token of the store this file belongs to (slot 0); 0 for none.
    pub fn token(&self) -> Result<u64, FlatNodesError> {
        let mut b = [0u8; 8];
        match self.file.read_exact_at(&mut b, 0) {
            Ok(()) => Ok(u64::from_le_bytes(b)),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(0),
            Err(e) => Err(self.io(e)),
        }
    }

    pub fn set_token(&self, token: u64) -> Result<(), FlatNodesError> {
        self.file
            .write_all_at(&token.to_le_bytes(), 0)
            .map_err(|e| self.io(e))
    }

    /// The bytes the file takes on disk (its holes take none).
    pub fn disk_bytes(&self) -> Result<u64, FlatNodesError> {
        use std::os::unix::fs::MetadataExt;
        Ok(self.file.metadata().map_err(|e| self.io(e))?.blocks() * 512)
    }

    /// A writer of ascending ids that joins runs of consecutive slots into
    /// one write (an import writes millions of nodes).
    pub fn seq_writer(&self) -> SeqWriter<'_> {
        SeqWriter {
            f: self,
            at: 0,
            buf: Vec::new(),
        }
    }

    /// Forgets a node (a deletion).
    pub fn delete(&self, id: i64) -> Result<(), FlatNodesError> {
        let at = self.offset(id)?;
        // Past the end there is nothing to forget, and writing would grow
        // the file.
        let len = self.file.metadata().map_err(|e| self.io(e))?.len();
        if at >= len {
            return Ok(());
        }
        self.file
            .write_all_at(&[0u8; 8], at)
            .map_err(|e| self.io(e))
    }

    /// A node's location, if it has one.
    pub fn get(&self, id: i64) -> Result<Option<(i32, i32)>, FlatNodesError> {
        let at = self.offset(id)?;
        let mut b = [0u8; 8];
        match self.file.read_exact_at(&mut b, at) {
            Ok(()) => {}
            // Past the end: never written.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(self.io(e)),
        }
        let lat = u32::from_le_bytes(b[..4].try_into().expect("4 bytes"));
        if lat == 0 {
            return Ok(None);
        }
        let lon = i32::from_le_bytes(b[4..].try_into().expect("4 bytes"));
        Ok(Some(((lat ^ 0x8000_0000) as i32, lon)))
    }

    /// Makes what was written durable.
    pub fn sync(&self) -> Result<(), FlatNodesError> {
        self.file.sync_data().map_err(|e| self.io(e))
    }
}

fn slot(lat_e7: i32, lon_e7: i32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&((lat_e7 as u32) ^ 0x8000_0000).to_le_bytes());
    b[4..].copy_from_slice(&lon_e7.to_le_bytes());
    b
}

/// Bytes a [`SeqWriter`] gathers before it writes.
const SEQ_WRITE_BYTES: usize = 1 << 20;

/// See [`FlatNodes::seq_writer`]. Call [`SeqWriter::flush`] at the end.
pub struct SeqWriter<'f> {
    f: &'f FlatNodes,
    /// The file offset of `buf`'s first byte.
    at: u64,
    buf: Vec<u8>,
}

impl SeqWriter<'_> {
    pub fn set(&mut self, id: i64, lat_e7: i32, lon_e7: i32) -> Result<(), FlatNodesError> {
        let at = self.f.offset(id)?;
        if self.buf.is_empty()
            || at != self.at + self.buf.len() as u64
            || self.buf.len() >= SEQ_WRITE_BYTES
        {
            self.flush()?;
            self.at = at;
        }
        self.buf.extend_from_slice(&slot(lat_e7, lon_e7));
        Ok(())
    }

    pub fn flush(&mut self) -> Result<(), FlatNodesError> {
        if !self.buf.is_empty() {
            self.f
                .file
                .write_all_at(&self.buf, self.at)
                .map_err(|e| self.f.io(e))?;
            self.buf.clear();
        }
        Ok(())
    }
}

/// Refuses an id the file cannot hold, before anything is written.
pub(crate) fn check_id(f: &FlatNodes, id: i64) -> Result<(), FlatNodesError> {
    f.offset(id).map(|_| ())
}
