//! A search index as a server reads it (issue 50): one [`Snapshot`] of the
//! last commit, shared by every query until the index commits again.
//!
//! A commit (a drain, a rebuild's swap) replaces `meta.json` by a rename,
//! so its identity (inode, modification time, size) moves with every
//! commit; each query looks at it (one `stat`) and opens the new commit
//! when it moved. Opening can fail while another process commits (tantivy
//! deletes the segment files a commit no longer uses, and a rebuild swaps
//! the whole folder): it is tried again, and if it still fails the
//! previous snapshot answers, which is a committed state too and says its
//! sequence. A query never sees half of a commit: a snapshot's segment
//! files stay readable to it after they are deleted (they are mapped).

use super::{SearchDataset, SearchError, Snapshot};
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex};

/// Tries at opening a new commit before the previous snapshot answers.
const OPEN_TRIES_MAX: usize = 5;

/// `meta.json`'s identity: (device, inode, mtime ns, size).
type Identity = (u64, u64, i64, u64);

fn identity(d: &SearchDataset) -> Option<Identity> {
    let m = std::fs::metadata(d.index.join("meta.json")).ok()?;
    Some((
        m.dev(),
        m.ino(),
        m.mtime() * 1_000_000_000 + m.mtime_nsec(),
        m.size(),
    ))
}

/// The last commit of one search dataset's index, reopened when it moves.
pub struct LiveIndex {
    d: SearchDataset,
    current: Mutex<Option<(Identity, Arc<Snapshot>)>>,
}

impl LiveIndex {
    pub fn new(d: SearchDataset) -> LiveIndex {
        LiveIndex {
            d,
            current: Mutex::new(None),
        }
    }

    pub fn dataset(&self) -> &SearchDataset {
        &self.d
    }

    /// The snapshot of the last commit (opened now if the index moved).
    pub fn snapshot(&self) -> Result<Arc<Snapshot>, SearchError> {
        let mut last_err = None;
        for _ in 0..OPEN_TRIES_MAX {
            let Some(id) = identity(&self.d) else {
                // Missing (never built), or mid-swap by a rebuild.
                match self.kept() {
                    Some(s) => return Ok(s),
                    None => {
                        last_err = Some(Snapshot::open(&self.d).err());
                        std::thread::sleep(std::time::Duration::from_millis(2));
                        continue;
                    }
                }
            };
            if let Some((kept, s)) = self.current.lock().expect("not poisoned").as_ref() {
                if *kept == id {
                    return Ok(s.clone());
                }
            }
            match Snapshot::open(&self.d) {
                // Kept under the identity seen before opening: if the index
                // moved in between, the next query opens it again.
                Ok(s) => {
                    let s = Arc::new(s);
                    *self.current.lock().expect("not poisoned") = Some((id, s.clone()));
                    return Ok(s);
                }
                Err(e) => last_err = Some(Some(e)),
            }
        }
        match (self.kept(), last_err.flatten()) {
            (Some(s), _) => Ok(s),
            (None, Some(e)) => Err(e),
            (None, None) => Snapshot::open(&self.d).map(Arc::new),
        }
    }

    fn kept(&self) -> Option<Arc<Snapshot>> {
        self.current
            .lock()
            .expect("not poisoned")
            .as_ref()
            .map(|(_, s)| s.clone())
    }
}
