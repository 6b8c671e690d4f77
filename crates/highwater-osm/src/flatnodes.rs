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
//! Design for the store (not wired in yet: extracts keep the `nodes`
//! table): tagged nodes and ways stay in SQLite; untagged nodes' locations
//! move here, behind the same `OsmRead::node`; the file is written inside
//! the same writer lease as the store, before the store's transaction
//! commits, and a crash between the two leaves locations the store's
//! sequence does not yet claim, which the re-applied diff writes again
//! (writes are idempotent). `node_id_max` bounds the file: an id above it
//! is refused by name, never a 1 TB file by accident.

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
    #[error("flat nodes {}: node id {id} is outside 1..={max}; an id this large is a corrupt input, not a real node", path.display())]
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
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|err| FlatNodesError::Io {
                path: path.to_path_buf(),
                err,
            })?;
        Ok(FlatNodes {
            file,
            path: path.to_path_buf(),
            max,
        })
    }

    fn offset(&self, id: i64) -> Result<u64, FlatNodesError> {
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

    /// Records a node's location.
    pub fn set(&self, id: i64, lat_e7: i32, lon_e7: i32) -> Result<(), FlatNodesError> {
        let at = self.offset(id)?;
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&((lat_e7 as u32) ^ 0x8000_0000).to_le_bytes());
        b[4..].copy_from_slice(&lon_e7.to_le_bytes());
        self.file.write_all_at(&b, at).map_err(|e| self.io(e))
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
