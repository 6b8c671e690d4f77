//! Stat of many files, fast: files are grouped by folder, each folder is
//! opened once, and each file is stat'ed relative to it (`fstatat`), so the
//! kernel walks one path component per file instead of the whole path. This
//! loop is most of the cost of a no-change `plan`.

use highwater_core::Stat;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// What a stat found: the fields the stat cache compares, and whether the
/// path is a regular file (after following symlinks).
pub type Statted = io::Result<(Stat, bool)>;

// The casts are no-ops on x86_64 Linux but not on every target libc serves.
#[allow(clippy::unnecessary_cast)]
fn from_libc(st: &libc::stat) -> (Stat, bool) {
    let stat = Stat {
        size: st.st_size as u64,
        mtime_ns: (st.st_mtime as i64)
            .saturating_mul(1_000_000_000)
            .saturating_add(st.st_mtime_nsec as i64),
        ctime_ns: (st.st_ctime as i64)
            .saturating_mul(1_000_000_000)
            .saturating_add(st.st_ctime_nsec as i64),
        ino: st.st_ino as u64,
        dev: st.st_dev as u64,
    };
    (stat, st.st_mode & libc::S_IFMT == libc::S_IFREG)
}

/// An open folder to stat names in.
pub struct Dir {
    fd: libc::c_int,
}

impl Dir {
    pub fn open(path: &Path) -> io::Result<Dir> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::other("path contains a NUL byte"))?;
        // SAFETY: `c` is a valid NUL-terminated string; the flags ask for a
        // read-only directory handle that is closed on exec.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Dir { fd })
    }

    /// Stats `name` (one component) in this folder, following symlinks as
    /// `std::fs::metadata` does.
    pub fn stat(&self, name: &str) -> Statted {
        let c = CString::new(name).map_err(|_| io::Error::other("name contains a NUL byte"))?;
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: `self.fd` is an open directory, `c` is NUL-terminated and
        // `st` is valid for writes of one `libc::stat`.
        let r = unsafe { libc::fstatat(self.fd, c.as_ptr(), st.as_mut_ptr(), 0) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fstatat returned 0, so it filled `st`.
        Ok(from_libc(unsafe { &st.assume_init() }))
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        // SAFETY: `fd` was opened by `Dir::open` and is closed only here.
        unsafe {
            libc::close(self.fd);
        }
    }
}

/// Splits `a/b/c.txt` into (`a/b`, `c.txt`).
pub fn split_parent(item: &str) -> (&str, &str) {
    // A byte scan: `rfind('/')`'s char searcher cost five times as much on
    // short paths, and this runs for every item of every plan.
    match item.bytes().rposition(|b| b == b'/') {
        Some(i) => (&item[..i], &item[i + 1..]),
        None => ("", item),
    }
}

/// Stats one path, following symlinks (the dependency checks of issue 24).
pub fn stat_path(path: &Path) -> Statted {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::other("path contains a NUL byte"))?;
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `c` is NUL-terminated and `st` is valid for one `libc::stat`.
    let r = unsafe { libc::stat(c.as_ptr(), st.as_mut_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: stat returned 0, so it filled `st`.
    Ok(from_libc(unsafe { &st.assume_init() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_std_metadata() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), "hello").unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        let dir = Dir::open(d.path()).unwrap();
        let (s, is_file) = dir.stat("f").unwrap();
        let m = std::fs::metadata(d.path().join("f")).unwrap();
        assert!(is_file);
        assert_eq!(s.size, 5);
        assert_eq!(s.ino, m.ino());
        assert_eq!(s.mtime_ns, m.mtime() * 1_000_000_000 + m.mtime_nsec());
        assert!(!dir.stat("sub").unwrap().1);
        assert_eq!(
            dir.stat("nope").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }
}
