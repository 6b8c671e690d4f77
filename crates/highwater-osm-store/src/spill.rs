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
//! Two threads take work off the import's own, which reads the extract
//! and writes the store: one sorts each full buffer of references and
//! writes its run while the next buffer fills (the budget is three
//! buffers: filling, sorting, the sort's scratch), and one merges the runs
//! at the end, handing references over in batches while the import reads
//! the node file and writes blocks (into reused entries, see
//! `crate::store::EntrySource`).
//!
//! The files live in a folder beside the store being built, named after it
//! (`<store file>.spill`), so that a killed import's leftovers are swept
//! with its unpublished store.

use crate::nodeblocks::Entry;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
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
    /// The thread sorting and writing full buffers of references.
    sorter: Option<Sorter>,
}

/// A thread that sorts a full buffer of references and writes it as a run
/// while the import fills the next one: at most three buffers live, each
/// a third of the budget (the one filling, the one being sorted and the
/// sort's scratch).
struct Sorter {
    tx: std::sync::mpsc::SyncSender<(Vec<(i64, i64)>, PathBuf)>,
    /// Buffers written out, emptied, for the import to fill again: the
    /// same three serve the whole import.
    back: std::sync::mpsc::Receiver<Vec<(i64, i64)>>,
    thread: std::thread::JoinHandle<io::Result<()>>,
}

impl Sorter {
    fn start() -> io::Result<Sorter> {
        // No queue: a send waits until the thread has written the previous
        // run, so no third buffer is ever filled.
        let (tx, rx) = std::sync::mpsc::sync_channel::<(Vec<(i64, i64)>, PathBuf)>(0);
        let (give_back, back) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("import-sort".into())
            .spawn(move || -> io::Result<()> {
                let mut scratch = Vec::new();
                for (mut refs, path) in rx {
                    sort_refs(&mut refs, &mut scratch);
                    write_run(&mut refs, &path)?;
                    refs.clear();
                    let _ = give_back.send(refs);
                }
                Ok(())
            })?;
        Ok(Sorter { tx, back, thread })
    }

    /// Waits for the runs sent so far: the first error writing one.
    fn end(self) -> io::Result<()> {
        drop(self.tx);
        self.thread
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the sorting thread panicked")))
    }
}

/// Bits of the node id a pass of [`sort_refs`] sorts on.
const RADIX_BITS: u32 = 12;

/// Sorts references by (node, way). An import pushes them way by way in
/// ascending way order, so a stable sort on the node alone gives that
/// order: a least-significant-digit radix sort of the node's offset from
/// the smallest, [`RADIX_BITS`] per pass, through `scratch` (the two swap;
/// the caller's budget counts both). Were the ways not pushed in order, a
/// check finds it and a comparison sort settles it.
fn sort_refs(refs: &mut Vec<(i64, i64)>, scratch: &mut Vec<(i64, i64)>) {
    if refs.len() < 1 << 12 {
        refs.sort_unstable();
        return;
    }
    let (lo, hi) = refs.iter().fold((i64::MAX, i64::MIN), |(lo, hi), &(n, _)| {
        (lo.min(n), hi.max(n))
    });
    let span = hi.wrapping_sub(lo) as u64;
    let passes = (64 - span.leading_zeros()).div_ceil(RADIX_BITS) as usize;
    let buckets = 1usize << RADIX_BITS;
    let mask = (buckets - 1) as u64;
    let digit = |n: i64, pass: usize| {
        ((n.wrapping_sub(lo) as u64 >> (pass as u32 * RADIX_BITS)) & mask) as usize
    };
    // Every pass's counts in one read.
    let mut counts = vec![0usize; passes * buckets];
    for &(n, _) in refs.iter() {
        for pass in 0..passes {
            counts[pass * buckets + digit(n, pass)] += 1;
        }
    }
    scratch.clear();
    scratch.resize(refs.len(), (0, 0));
    for pass in 0..passes {
        let start = &mut counts[pass * buckets..(pass + 1) * buckets];
        let mut sum = 0;
        for c in start.iter_mut() {
            let k = *c;
            *c = sum;
            sum += k;
        }
        for &p in refs.iter() {
            let d = digit(p.0, pass);
            scratch[start[d]] = p;
            start[d] += 1;
        }
        std::mem::swap(refs, scratch);
    }
    if !refs.windows(2).all(|w| w[0] <= w[1]) {
        refs.sort_unstable();
    }
}

/// Writes sorted references, without repeats, to a run file.
fn write_run(refs: &mut Vec<(i64, i64)>, path: &Path) -> io::Result<()> {
    refs.dedup();
    let mut w = BufWriter::with_capacity(1 << 16, File::create(path)?);
    for &(n, way) in refs.iter() {
        let mut b = [0u8; REF_RECORD];
        b[..8].copy_from_slice(&n.to_le_bytes());
        b[8..].copy_from_slice(&way.to_le_bytes());
        w.write_all(&b)?;
    }
    w.flush()
}

impl Spill {
    /// Creates the folder `dir` (emptied first): references are sorted
    /// and spilled (on a thread of their own) once a third of
    /// `refs_budget_bytes` of them are held, the next third filling
    /// meanwhile (the last is the sort's scratch).
    pub fn create(dir: &Path, refs_budget_bytes: usize) -> io::Result<Spill> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir)?;
        let nodes = BufWriter::with_capacity(1 << 16, File::create(dir.join("nodes"))?);
        let refs_max = (refs_budget_bytes / REF_RECORD / 3).max(1024);
        Ok(Spill {
            dir: dir.to_path_buf(),
            nodes,
            refs: Vec::new(),
            refs_max,
            runs: Vec::new(),
            read_budget: refs_budget_bytes.max(1 << 20),
            sorter: Some(Sorter::start()?),
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
    #[inline]
    pub fn way_ref(&mut self, node: i64, way: i64) -> io::Result<()> {
        if self.refs.len() >= self.refs_max {
            self.spill_run()?;
        }
        // Reserve the whole buffer at once, never the doubling beyond it.
        if self.refs.capacity() == 0 {
            self.refs.reserve_exact(self.refs_max);
        }
        self.refs.push((node, way));
        Ok(())
    }

    /// Sorted runs written (or being written) so far.
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    /// Hands the full buffer to the sorting thread (waiting while it still
    /// writes the previous one).
    #[cold]
    fn spill_run(&mut self) -> io::Result<()> {
        let path = self.dir.join(format!("refs-{}", self.runs.len()));
        let full = std::mem::take(&mut self.refs);
        let sorter = self.sorter.as_ref().expect("a sorter until finish");
        if sorter.tx.send((full, path.clone())).is_err() {
            // The thread stopped on an error: that error.
            let sorter = self.sorter.take().expect("checked");
            sorter.end()?;
            return Err(io::Error::other("the sorting thread stopped"));
        }
        self.runs.push(path);
        // The thread took this buffer, so it gave back the one before.
        if let Ok(b) = sorter.back.try_recv() {
            self.refs = b;
        }
        Ok(())
    }

    /// Ends the writing: the node entries in id order, each with the ways
    /// through it, and a location-less entry for each referenced node the
    /// extract lacks (as [`crate::store::merge_refs`] gives them). The runs
    /// are merged on a thread of their own, which hands the references
    /// over in batches while the caller reads the node file and writes
    /// blocks. A read error ends the entries early and is kept in `error`,
    /// for the caller to check.
    pub fn finish(mut self) -> io::Result<Merged> {
        self.nodes.flush()?;
        if let Some(sorter) = self.sorter.take() {
            sorter.end()?;
        }
        // The last, partial buffer stays in memory and is merged as a run.
        self.refs.sort_unstable();
        self.refs.dedup();
        let per = (self.read_budget / (self.runs.len() + 1)).clamp(4096, READ_BUFFER_MAX);
        let nodes = Records::new(File::open(self.dir.join("nodes"))?, NODE_BUFFER);
        let mut runs = Vec::new();
        for p in &self.runs {
            runs.push(Records::new(File::open(p)?, per));
        }
        let memory = std::mem::take(&mut self.refs);
        let (tx, rx) = std::sync::mpsc::sync_channel(REF_BATCHES_QUEUED);
        let merger = std::thread::Builder::new()
            .name("import-merge".into())
            .spawn(move || merge_runs(runs, memory, tx))?;
        Ok(Merged {
            dir: std::mem::take(&mut self.dir),
            nodes,
            node: None,
            refs: Some(rx),
            batch: Vec::new(),
            at: 0,
            merger: Some(merger),
            error: None,
        })
    }
}

impl Drop for Spill {
    /// An import stopped early: the sorting thread ends before the caller
    /// removes the folder it writes in.
    fn drop(&mut self) {
        if let Some(sorter) = self.sorter.take() {
            let _ = sorter.end();
        }
    }
}

/// Read buffer of the node file during the merge.
const NODE_BUFFER: usize = 1 << 20;
/// References per batch the merging thread hands over.
const REF_BATCH: usize = 1 << 13;
/// Batches queued between the merging thread and the block writer.
const REF_BATCHES_QUEUED: usize = 4;

/// A batch of merged references, or the read error that ended them.
type RefBatch = io::Result<Vec<(i64, i64)>>;

/// Fixed-size records read from a scratch file through a buffer, parsed
/// from it in place.
struct Records<const N: usize> {
    file: File,
    buf: Vec<u8>,
    at: usize,
    end: usize,
}

impl<const N: usize> Records<N> {
    fn new(file: File, capacity: usize) -> Self {
        Records {
            file,
            buf: vec![0; capacity.max(N)],
            at: 0,
            end: 0,
        }
    }

    /// The next record, or none at the end of the file.
    #[inline]
    fn next(&mut self) -> io::Result<Option<&[u8]>> {
        if self.end - self.at < N && !self.refill()? {
            return Ok(None);
        }
        let r = &self.buf[self.at..self.at + N];
        self.at += N;
        Ok(Some(r))
    }

    /// Moves the partial record left to the front and reads behind it
    /// until a whole record is there; false at the end of the file.
    #[cold]
    fn refill(&mut self) -> io::Result<bool> {
        self.buf.copy_within(self.at..self.end, 0);
        self.end -= self.at;
        self.at = 0;
        while self.end < N {
            match self.file.read(&mut self.buf[self.end..])? {
                0 if self.end == 0 => return Ok(false),
                0 => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "a truncated scratch record",
                    ))
                }
                n => self.end += n,
            }
        }
        Ok(true)
    }
}

fn i64_at(b: &[u8], at: usize) -> i64 {
    i64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Merges the sorted runs (and the sorted in-memory remainder) into one
/// ascending stream of (node, way) without repeats (a closed way's node
/// may be in two runs), sent in batches over `tx`. Stops at the first
/// read error, which it sends, or when the receiver is gone.
fn merge_runs(
    mut runs: Vec<Records<REF_RECORD>>,
    memory: Vec<(i64, i64)>,
    tx: std::sync::mpsc::SyncSender<RefBatch>,
) {
    use std::cmp::Reverse;
    use std::collections::binary_heap::PeekMut;
    let mut memory = memory.into_iter();
    let mem_src = runs.len();
    let mut next_of = |src: usize| -> io::Result<Option<(i64, i64)>> {
        if src == mem_src {
            return Ok(memory.next());
        }
        Ok(runs[src].next()?.map(|b| (i64_at(b, 0), i64_at(b, 8))))
    };
    let mut heap = BinaryHeap::new();
    let mut batch = Vec::with_capacity(REF_BATCH);
    let mut last = None;
    let result = (|| -> io::Result<()> {
        for src in 0..=mem_src {
            if let Some(p) = next_of(src)? {
                heap.push(Reverse((p, src)));
            }
        }
        while let Some(mut top) = heap.peek_mut() {
            let Reverse((p, src)) = *top;
            // Replace the top with its source's next and sift once, rather
            // than a pop and a push.
            match next_of(src)? {
                Some(n) => *top = Reverse((n, src)),
                None => {
                    PeekMut::pop(top);
                }
            }
            if last != Some(p) {
                last = Some(p);
                batch.push(p);
                if batch.len() == REF_BATCH {
                    let full = std::mem::replace(&mut batch, Vec::with_capacity(REF_BATCH));
                    if tx.send(Ok(full)).is_err() {
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    })();
    let _ = match result {
        Ok(()) if batch.is_empty() => Ok(()),
        Ok(()) => tx.send(Ok(batch)),
        Err(e) => tx.send(Err(e)),
    };
}

/// The merge's result: the node entries, pulled through
/// `crate::store::EntrySource`.
pub struct Merged {
    dir: PathBuf,
    nodes: Records<NODE_RECORD>,
    /// The next node read from the file and not yet given.
    node: Option<Entry>,
    /// Batches from the merging thread; none once it ended.
    refs: Option<std::sync::mpsc::Receiver<RefBatch>>,
    batch: Vec<(i64, i64)>,
    at: usize,
    merger: Option<std::thread::JoinHandle<()>>,
    /// The first read error, which ended the entries.
    pub error: Option<io::Error>,
}

impl Merged {
    /// The next (node, way) without taking it.
    #[inline]
    fn peek_ref(&mut self) -> Option<(i64, i64)> {
        if self.at == self.batch.len() && !self.next_batch() {
            return None;
        }
        Some(self.batch[self.at])
    }

    #[cold]
    fn next_batch(&mut self) -> bool {
        let Some(rx) = &self.refs else {
            return false;
        };
        match rx.recv() {
            Ok(Ok(b)) => {
                self.batch = b;
                self.at = 0;
                !self.batch.is_empty()
            }
            Ok(Err(e)) => {
                self.error.get_or_insert(e);
                self.refs = None;
                false
            }
            Err(_) => {
                self.refs = None;
                false
            }
        }
    }

    /// The next node of the file (peeked, not taken), its ways empty.
    #[inline]
    fn peek_node(&mut self) -> Option<i64> {
        if self.node.is_none() && self.error.is_none() {
            match self.nodes.next() {
                Ok(Some(b)) => {
                    self.node = Some(Entry {
                        id: i64_at(b, 0),
                        loc: Some((i32_at(b, 8), i32_at(b, 12))),
                        tagged: b[16] != 0,
                        flat: false,
                        ways: Vec::new(),
                    })
                }
                Ok(None) => {}
                Err(e) => {
                    self.error = Some(e);
                }
            }
        }
        self.node.as_ref().map(|n| n.id)
    }
}

impl crate::store::EntrySource for Merged {
    /// As [`crate::store::merge_refs`], over the node file and the merged
    /// runs; ends early (with `error` set) on a read error.
    fn next_into(&mut self, e: &mut Entry) -> bool {
        let node = self.peek_node();
        if self.error.is_some() {
            return false;
        }
        let next_ref = self.peek_ref().map(|p| p.0);
        if self.error.is_some() {
            return false;
        }
        e.ways.clear();
        match (node, next_ref) {
            (None, None) => return false,
            (Some(n), Some(f)) if f < n => {
                e.id = f;
                e.loc = None;
                e.tagged = false;
                e.flat = false;
            }
            (Some(_), _) => {
                let n = self.node.take().expect("peeked");
                e.id = n.id;
                e.loc = n.loc;
                e.tagged = n.tagged;
                e.flat = false;
            }
            (None, Some(f)) => {
                e.id = f;
                e.loc = None;
                e.tagged = false;
                e.flat = false;
            }
        }
        while let Some((node, way)) = self.peek_ref() {
            if node != e.id {
                break;
            }
            if e.ways.last() != Some(&way) {
                e.ways.push(way);
            }
            self.at += 1;
        }
        self.error.is_none()
    }
}

impl Drop for Merged {
    fn drop(&mut self) {
        // The merging thread stops at its next send once the receiver is
        // gone.
        self.refs = None;
        if let Some(t) = self.merger.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The radix sort gives what a comparison sort gives: for references
    /// pushed in ascending way order (an import's), across wide and
    /// negative node ids, and for ways out of order (the fallback).
    #[test]
    fn radix_sorted_refs_equal_a_comparison_sort() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut scratch = Vec::new();
        for (span, ordered) in [
            (1u64 << 34, true),
            (1 << 61, true),
            (3, true),
            (1 << 20, false),
        ] {
            let mut refs = Vec::new();
            for w in 0..3000i64 {
                let way = if ordered { w } else { (rnd() % 5000) as i64 };
                for _ in 0..(rnd() % 7) {
                    let node = (rnd() % span) as i64 - (span / 2) as i64;
                    refs.push((node, way));
                }
            }
            let mut want = refs.clone();
            want.sort_unstable();
            sort_refs(&mut refs, &mut scratch);
            assert_eq!(refs, want, "span {span}, ordered {ordered}");
        }
    }

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
        let mut got: Vec<Entry> = Vec::new();
        let mut e = Entry::default();
        while crate::store::EntrySource::next_into(&mut m, &mut e) {
            got.push(e.clone());
        }
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
