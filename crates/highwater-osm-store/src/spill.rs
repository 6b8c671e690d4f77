//! Scratch files of an import in bounded memory (issue 25): node records
//! in file order, and (node, way) references sorted in runs of a bounded
//! size, merged back in node order.
//!
//! Why: a node block holds the ways through each node, but an extract
//! lists ways after all nodes. Holding every node and reference until the
//! ways arrive made an import's memory grow with the extract (1.9 GiB at
//! 10M nodes). Instead nodes stream to a file (17 bytes each), references
//! are sorted in memory up to a budget and spilled as sorted runs, and the
//! blocks are written at the end by one pass merging the node file with
//! the runs. Memory is then the budget, whatever the extract's size.
//!
//! The files live in a folder beside the store being built, named after it
//! (`<store file>.spill`), so that a killed import's leftovers are swept
//! with its unpublished store.

use crate::nodeblocks::Entry;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// Bytes of a node record: id (i64), lat, lon (i32 each), tagged (u8).
const NODE_RECORD: usize = 17;
/// Bytes of a reference record: node id, way id (i64 each).
const REF_RECORD: usize = 16;
/// Read buffer per file during the merge; the budget caps it when there
/// are many runs.
const READ_BUFFER_MAX: usize = 1 << 16;

pub struct Spill {
    dir: PathBuf,
    nodes: BufWriter<File>,
    refs: Vec<(i64, i64)>,
    refs_max: usize,
    runs: Vec<PathBuf>,
    /// Bytes the merge's read buffers may take.
    read_budget: usize,
}

impl Spill {
    /// Creates the folder `dir` (emptied first): references are spilled
    /// once `refs_budget_bytes` of them are held.
    pub fn create(dir: &Path, refs_budget_bytes: usize) -> io::Result<Spill> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir)?;
        let nodes = BufWriter::with_capacity(1 << 16, File::create(dir.join("nodes"))?);
        let refs_max = (refs_budget_bytes / REF_RECORD).max(1024);
        Ok(Spill {
            dir: dir.to_path_buf(),
            nodes,
            refs: Vec::new(),
            refs_max,
            runs: Vec::new(),
            read_budget: refs_budget_bytes.max(1 << 20),
        })
    }

    /// Records a node (in ascending id order).
    pub fn node(&mut self, id: i64, lat: i32, lon: i32, tagged: bool) -> io::Result<()> {
        let mut b = [0u8; NODE_RECORD];
        b[..8].copy_from_slice(&id.to_le_bytes());
        b[8..12].copy_from_slice(&lat.to_le_bytes());
        b[12..16].copy_from_slice(&lon.to_le_bytes());
        b[16] = u8::from(tagged);
        self.nodes.write_all(&b)
    }

    /// Records that way `way` passes node `node`.
    pub fn way_ref(&mut self, node: i64, way: i64) -> io::Result<()> {
        if self.refs.len() >= self.refs_max {
            self.spill_run()?;
        }
        // Reserve the whole budget at once, never the doubling beyond it.
        if self.refs.capacity() == 0 {
            self.refs.reserve_exact(self.refs_max);
        }
        self.refs.push((node, way));
        Ok(())
    }

    /// Sorted runs written so far.
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    fn spill_run(&mut self) -> io::Result<()> {
        self.refs.sort_unstable();
        self.refs.dedup();
        let path = self.dir.join(format!("refs-{}", self.runs.len()));
        let mut w = BufWriter::with_capacity(1 << 16, File::create(&path)?);
        for &(n, way) in &self.refs {
            w.write_all(&n.to_le_bytes())?;
            w.write_all(&way.to_le_bytes())?;
        }
        w.flush()?;
        self.refs.clear();
        self.runs.push(path);
        Ok(())
    }

    /// Ends the writing: the node entries in id order, each with the ways
    /// through it, and a location-less entry for each referenced node the
    /// extract lacks (see [`crate::store::merge_refs`]). A read error ends
    /// the entries early and is kept in `error`, for the caller to check.
    pub fn finish(mut self) -> io::Result<Merged> {
        self.nodes.flush()?;
        if !self.runs.is_empty() && !self.refs.is_empty() {
            self.spill_run()?;
        }
        self.refs.sort_unstable();
        self.refs.dedup();
        let per = (self.read_budget / (self.runs.len() + 1)).clamp(4096, READ_BUFFER_MAX);
        let nodes = BufReader::with_capacity(per, File::open(self.dir.join("nodes"))?);
        let mut runs = Vec::new();
        for p in &self.runs {
            runs.push(BufReader::with_capacity(per, File::open(p)?));
        }
        let memory = std::mem::take(&mut self.refs);
        Ok(Merged {
            dir: self.dir,
            nodes,
            refs: RefMerge::new(runs, memory)?,
            error: None,
        })
    }
}

/// Reads exactly `N` bytes, or none at the end of the file.
fn read_record<const N: usize>(r: &mut impl Read) -> io::Result<Option<[u8; N]>> {
    let mut b = [0u8; N];
    let mut got = 0;
    while got < N {
        match r.read(&mut b[got..])? {
            0 if got == 0 => return Ok(None),
            0 => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "a truncated scratch record",
                ))
            }
            n => got += n,
        }
    }
    Ok(Some(b))
}

fn i64_at(b: &[u8], at: usize) -> i64 {
    i64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The sorted runs merged (and the in-memory remainder): one ascending
/// stream of (node, way) without repeats.
pub struct RefMerge {
    runs: Vec<BufReader<File>>,
    /// (Reverse((node, way)), source): source `runs.len()` is `memory`.
    heap: BinaryHeap<(std::cmp::Reverse<(i64, i64)>, usize)>,
    memory: std::vec::IntoIter<(i64, i64)>,
    last: Option<(i64, i64)>,
}

impl RefMerge {
    fn new(mut runs: Vec<BufReader<File>>, memory: Vec<(i64, i64)>) -> io::Result<RefMerge> {
        let mut heap = BinaryHeap::new();
        for (i, r) in runs.iter_mut().enumerate() {
            if let Some(b) = read_record::<REF_RECORD>(r)? {
                heap.push((std::cmp::Reverse((i64_at(&b, 0), i64_at(&b, 8))), i));
            }
        }
        let mut memory = memory.into_iter();
        if let Some(p) = memory.next() {
            heap.push((std::cmp::Reverse(p), runs.len()));
        }
        Ok(RefMerge {
            runs,
            heap,
            memory,
            last: None,
        })
    }

    fn next_ref(&mut self) -> io::Result<Option<(i64, i64)>> {
        loop {
            let Some((std::cmp::Reverse(p), src)) = self.heap.pop() else {
                return Ok(None);
            };
            let next = if src == self.runs.len() {
                self.memory.next()
            } else {
                read_record::<REF_RECORD>(&mut self.runs[src])?
                    .map(|b| (i64_at(&b, 0), i64_at(&b, 8)))
            };
            if let Some(n) = next {
                self.heap.push((std::cmp::Reverse(n), src));
            }
            if self.last != Some(p) {
                self.last = Some(p);
                return Ok(Some(p));
            }
        }
    }
}

/// The merge's result, an iterator of node entries.
pub struct Merged {
    dir: PathBuf,
    nodes: BufReader<File>,
    refs: RefMerge,
    /// The first read error, which ended the entries.
    pub error: Option<io::Error>,
}

impl Merged {
    /// The entries (see [`Spill::finish`]); check [`Merged::error`] after.
    pub fn entries(&mut self) -> impl Iterator<Item = Entry> + '_ {
        let Merged {
            nodes, refs, error, ..
        } = self;
        let failed = std::cell::RefCell::new(None::<io::Error>);
        let failed = std::rc::Rc::new(failed);
        let (f1, f2, f3) = (failed.clone(), failed.clone(), failed);
        let nodes = std::iter::from_fn(move || match read_record::<NODE_RECORD>(nodes) {
            Ok(Some(b)) => Some(Entry {
                id: i64_at(&b, 0),
                loc: Some((
                    i32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
                    i32::from_le_bytes(b[12..16].try_into().expect("4 bytes")),
                )),
                tagged: b[16] != 0,
                flat: false,
                ways: Vec::new(),
            }),
            Ok(None) => None,
            Err(e) => {
                f1.borrow_mut().get_or_insert(e);
                None
            }
        });
        let refs = std::iter::from_fn(move || match refs.next_ref() {
            Ok(p) => p,
            Err(e) => {
                f2.borrow_mut().get_or_insert(e);
                None
            }
        });
        crate::store::merge_refs(nodes, refs).chain(std::iter::from_fn(move || {
            if let Some(e) = f3.borrow_mut().take() {
                error.get_or_insert(e);
            }
            None
        }))
    }
}

impl Drop for Merged {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs spilled at a tiny budget merge to what sorting everything in
    /// memory gives, with location-less entries for missing nodes.
    #[test]
    fn spilled_runs_merge_like_one_sort() {
        let t = tempfile::tempdir().unwrap();
        let mut s = Spill::create(&t.path().join("x.spill"), 0).unwrap();
        let nodes: Vec<i64> = (1..5000).map(|i| i * 3).collect();
        for &n in &nodes {
            s.node(n, n as i32, -(n as i32), n % 2 == 0).unwrap();
        }
        let mut refs = Vec::new();
        for w in 0..3000i64 {
            for k in 0..3 {
                let n = (w * 7 + k * 5) % 16000 + 1;
                refs.push((n, w));
                s.way_ref(n, w).unwrap();
            }
        }
        assert!(s.runs() > 2, "the budget forced runs");
        let mut m = s.finish().unwrap();
        let got: Vec<Entry> = m.entries().collect();
        assert!(m.error.is_none());
        refs.sort_unstable();
        refs.dedup();
        let want: Vec<Entry> = crate::store::merge_refs(
            nodes.iter().map(|&n| Entry {
                id: n,
                loc: Some((n as i32, -(n as i32))),
                tagged: n % 2 == 0,
                ways: Vec::new(),
                flat: false,
            }),
            refs.iter().copied(),
        )
        .collect();
        assert_eq!(got, want);
        drop(m);
        assert!(!t.path().join("x.spill").exists(), "scratch removed");
    }
}
