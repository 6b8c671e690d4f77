//! SQLite's WAL-index header, read without a lock or a system call: how
//! serve's [`super::fresh::FreshView`] tells, on every tile request, that
//! nobody committed to the store since it last asked SQLite (issue 23).
//!
//! In WAL mode every commit ends by writing the 48-byte WAL-index header
//! at the start of the database's `-shm` file, twice: copy 1, a memory
//! barrier, copy 0 (`walIndexWriteHdr` in SQLite's wal.c); each commit
//! moves `iChange` and `mxFrame` (or the salts, when the log restarts).
//! SQLite's own readers read copy 0, a barrier, copy 1, and take the
//! header only when the two are equal, initialised, and their checksum
//! holds (`walIndexTryHdr`); a header that differs from the one a
//! connection last read is what moves its `PRAGMA data_version`. This
//! module reads the header the same way from a read-only map of the same
//! file, so "the header is byte for byte the one seen when the view was
//! last confirmed" stands for "no commit since" exactly as SQLite takes
//! it; anything else (a torn read, a bad checksum, a header that moved)
//! is answered by asking SQLite itself.

use std::path::Path;
use std::sync::atomic::{fence, AtomicU32, Ordering};

/// The header: 12 native-order words (`WalIndexHdr`).
pub type Header = [u32; 12];

/// Bytes of the `-shm` file read: the two header copies and the
/// checkpoint information after them (`WALINDEX_HDR_SIZE`).
const HDR_BYTES: usize = 136;

/// A read-only map of a database's `-shm` file, its first page.
pub struct WalIndex {
    map: *mut libc::c_void,
    len: usize,
}

// SAFETY: the map is read-only and only read through atomic loads; it is
// unmapped once, on drop, by its one owner.
unsafe impl Send for WalIndex {}

impl WalIndex {
    /// Maps `db`'s `-shm` file, `db` being the name SQLite opened the
    /// database by (`sqlite3_db_filename`, from which it names the `-shm`
    /// file). `None` (the caller asks SQLite every time) unless the file
    /// is there, holds a header, and is open elsewhere in this process:
    /// then it is the very file a connection of ours reads the header
    /// from, and no other process can truncate or re-create it while
    /// that connection lives (SQLite holds a shared lock on it from open
    /// to close, and a `-shm` is only reset by the connection that gets
    /// it exclusively).
    pub fn open(db: &Path) -> Option<WalIndex> {
        use std::os::fd::AsRawFd;
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::MetadataExt;
        let mut shm = db.as_os_str().as_bytes().to_vec();
        shm.extend_from_slice(b"-shm");
        let file = std::fs::File::open(std::ffi::OsStr::from_bytes(&shm)).ok()?;
        let meta = file.metadata().ok()?;
        if (meta.len() as usize) < HDR_BYTES {
            return None;
        }
        if !open_elsewhere(file.as_raw_fd(), (meta.dev(), meta.ino())) {
            return None;
        }
        // SAFETY: a fresh read-only shared map of an open file's first
        // bytes, at least HDR_BYTES long (checked above); the file is not
        // truncated while a connection of ours holds it (see above).
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                HDR_BYTES,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return None;
        }
        Some(WalIndex {
            map,
            len: HDR_BYTES,
        })
    }

    /// The header as SQLite's readers take it, or `None` when it is in
    /// doubt (being written, not initialised, its checksum wrong).
    pub fn header(&self) -> Option<Header> {
        let words = self.map as *const AtomicU32;
        // SAFETY: the map is HDR_BYTES long, page-aligned, and lives as
        // long as self; words 0..24 are the two copies.
        let word = |i: usize| unsafe { (*words.add(i)).load(Ordering::Relaxed) };
        // What the request saw happen (a commit) is in memory before this.
        fence(Ordering::SeqCst);
        let mut h0 = [0u32; 12];
        for (i, w) in h0.iter_mut().enumerate() {
            *w = word(i);
        }
        // Copy 0 before copy 1: the writer writes them the other way.
        fence(Ordering::SeqCst);
        let mut h1 = [0u32; 12];
        for (i, w) in h1.iter_mut().enumerate() {
            *w = word(12 + i);
        }
        if h0 != h1 || !is_init(&h0) || checksum(&h0[..10]) != [h0[10], h0[11]] {
            return None;
        }
        Some(h0)
    }
}

impl Drop for WalIndex {
    fn drop(&mut self) {
        // SAFETY: mapped in `open`, unmapped only here.
        unsafe {
            libc::munmap(self.map, self.len);
        }
    }
}

/// `isInit`: the byte after `iVersion`, `unused`, `iChange`.
fn is_init(h: &Header) -> bool {
    h[3].to_ne_bytes()[0] != 0
}

/// SQLite's `walChecksumBytes` in native order, from zero.
fn checksum(words: &[u32]) -> [u32; 2] {
    let (mut s1, mut s2) = (0u32, 0u32);
    for pair in words.chunks_exact(2) {
        s1 = s1.wrapping_add(pair[0]).wrapping_add(s2);
        s2 = s2.wrapping_add(pair[1]).wrapping_add(s1);
    }
    [s1, s2]
}

/// Whether a descriptor of this process other than `me` is open on the
/// file `id` (device, inode). Read from /proc/self/fd: `false` when it
/// cannot be read.
fn open_elsewhere(me: i32, id: (u64, u64)) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return false;
    };
    dir.flatten().any(|e| {
        let fd = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok());
        fd.is_some_and(|fd| fd != me)
            && std::fs::metadata(e.path()).is_ok_and(|m| (m.dev(), m.ino()) == id)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(p: &Path) -> rusqlite::Connection {
        let c = rusqlite::Connection::open(p).unwrap();
        c.pragma_update(None, "journal_mode", "WAL").unwrap();
        c
    }

    /// The header moves with every commit, by this process or another
    /// connection, and stays put across reads; what SQLite's
    /// `data_version` says agrees.
    #[test]
    fn the_header_moves_with_each_commit_and_only_then() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.db");
        let w = conn(&p);
        w.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")
            .unwrap();
        let r =
            rusqlite::Connection::open_with_flags(&p, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .unwrap();
        let dv = || -> i64 {
            r.query_row("PRAGMA data_version", [], |x| x.get(0))
                .unwrap()
        };
        let v0 = dv();
        let name = std::path::PathBuf::from(r.path().unwrap());
        let wi = WalIndex::open(&name).expect("the -shm of an open WAL database maps");
        let h0 = wi.header().expect("a consistent header");
        let _: i64 = r
            .query_row("SELECT count(*) FROM t", [], |x| x.get(0))
            .unwrap();
        assert_eq!(wi.header(), Some(h0), "a read moves nothing");
        assert_eq!(dv(), v0);
        w.execute("INSERT INTO t VALUES (2)", []).unwrap();
        let h1 = wi.header().unwrap();
        assert_ne!(h1, h0, "a commit moves the header");
        assert_ne!(dv(), v0, "and data_version");
        // A transaction rolled back moves neither.
        w.execute_batch("BEGIN; INSERT INTO t VALUES (3); ROLLBACK;")
            .unwrap();
        assert_eq!(wi.header(), Some(h1));
        // A checkpoint that empties the log, then a commit that restarts
        // it from its first frame: the salts move, the header too.
        w.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
        w.execute("INSERT INTO t VALUES (4)", []).unwrap();
        let h2 = wi.header().unwrap();
        assert_ne!(h2, h1);
        assert_ne!(h2, h0);
        // A torn read (the copies differ) and a bad checksum are doubt.
        let mut torn = h2;
        torn[2] ^= 1;
        assert_ne!(checksum(&torn[..10]), [torn[10], torn[11]]);
    }

    /// No map when the database is not in WAL mode (no -shm), or when no
    /// connection of this process has the -shm open.
    #[test]
    fn no_map_without_a_live_wal_index() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.db");
        let c = rusqlite::Connection::open(&p).unwrap();
        c.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")
            .unwrap();
        assert!(WalIndex::open(&p).is_none(), "rollback journal: no -shm");
        drop(c);
        // A -shm file nobody here has open (left by another process).
        std::fs::write(dir.path().join("d.db-shm"), vec![0u8; 32768]).unwrap();
        assert!(WalIndex::open(&p).is_none());
    }
}
