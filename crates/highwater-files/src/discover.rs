//! Discovery: which files a stage's globs match now, and which files its
//! output root holds. It decides nothing; it only lists.

use crate::error::FilesError;
use globset::{GlobBuilder, GlobMatcher};
use highwater_core::evidence::is_racy;
use highwater_core::template::normalize_lexically;
use highwater_store::DirRecord;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

/// Temp outputs live in private folders named `.NAME.hw-tmp-PID-SEQ`,
/// beside their final path.
pub const TEMP_MARK: &str = ".hw-tmp-";

/// One input found by a glob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// Path relative to the config folder, `/`-separated: the item's name.
    pub item: String,
    /// How many bytes at the end of `item` are its path relative to the
    /// glob's base folder: the relpath is always a suffix of the item, so
    /// it is not a second string (a million of them were 40 MB, issue 24).
    relpath_len: usize,
}

impl Found {
    /// `item`, whose last `relpath.len()` bytes are `relpath`.
    pub fn new(item: String, relpath: &str) -> Found {
        assert!(
            item.ends_with(relpath),
            "an input's relpath {relpath:?} is not the end of its item {item:?}"
        );
        Found {
            relpath_len: relpath.len(),
            item,
        }
    }

    /// Path relative to the glob's base folder, for `{relpath}`.
    pub fn relpath(&self) -> &str {
        &self.item[self.item.len() - self.relpath_len..]
    }
}

/// The literal folder before a glob's first wildcard.
fn glob_base(pattern: &str) -> String {
    let norm = normalize_lexically(pattern);
    let mut base = Vec::new();
    let comps: Vec<&str> = norm.split('/').collect();
    for (i, c) in comps.iter().enumerate() {
        if i + 1 == comps.len() || c.contains(['*', '?', '[', '{']) {
            break;
        }
        base.push(*c);
    }
    let b = base.join("/");
    if norm.starts_with('/') && !b.starts_with('/') {
        format!("/{b}")
    } else {
        b
    }
}

struct Glob {
    base: String,
    matcher: GlobMatcher,
}

fn compile(stage: &str, pattern: &str) -> Result<Glob, FilesError> {
    let norm = normalize_lexically(pattern);
    let matcher = GlobBuilder::new(&norm)
        .literal_separator(true)
        .build()
        .map_err(|e| FilesError::Glob {
            stage: stage.to_string(),
            pattern: pattern.to_string(),
            message: e.kind().to_string(),
        })?
        .compile_matcher();
    Ok(Glob {
        base: glob_base(pattern),
        matcher,
    })
}

/// Checks that every glob compiles.
pub fn validate_globs(stage: &str, patterns: &[String]) -> Result<(), FilesError> {
    for p in patterns {
        compile(stage, p)?;
    }
    Ok(())
}

/// Lists the files the globs match, sorted by item. A file matched by two
/// globs is listed once, with the first glob's relpath. Files under
/// `exclude` (the state folder) and temp outputs are never inputs.
pub fn find_inputs(
    root: &Path,
    stage: &str,
    patterns: &[String],
    exclude: &Path,
) -> Result<Vec<Found>, FilesError> {
    Ok(walk_inputs(root, stage, patterns, exclude, false)?
        .into_iter()
        .map(|(f, _)| f)
        .collect())
}

/// What a stat of one input found, with the instant taken just before the
/// stats of its folder: a write during or after the stat then makes the
/// record racy rather than trusted.
pub type StatAt = (crate::stat::Statted, i64);

/// [`find_inputs`] with each input's stat, taken in the same pass: each
/// folder is listed and its matching files are stat'ed relative to it
/// (`fstatat`) while it is open, and folders are walked in parallel. This
/// walk is most of a no-change plan (issues 22 and 24).
pub fn find_inputs_statted(
    root: &Path,
    stage: &str,
    patterns: &[String],
    exclude: &Path,
) -> Result<(Vec<Found>, Vec<StatAt>), FilesError> {
    Ok(walk_inputs(root, stage, patterns, exclude, true)?
        .into_iter()
        .map(|(f, s)| (f, s.expect("a statted walk stats every file it finds")))
        .unzip())
}

fn is_temp_name(name: &[u8]) -> bool {
    name.starts_with(b".")
        && name
            .windows(TEMP_MARK.len())
            .any(|w| w == TEMP_MARK.as_bytes())
}

/// One walk for both: the same folders pruned, the same names matched, so
/// that what a plan stats and what a run renders never differ.
fn walk_inputs(
    root: &Path,
    stage: &str,
    patterns: &[String],
    exclude: &Path,
    stat: bool,
) -> Result<Vec<(Found, Option<StatAt>)>, FilesError> {
    use std::os::unix::ffi::OsStrExt;
    let mut found = Vec::new();
    for pattern in patterns {
        let g = compile(stage, pattern)?;
        let walk_root = if g.base.is_empty() {
            root.to_path_buf()
        } else {
            root.join(&g.base)
        };
        // A missing base (or one that cannot be looked at) matches nothing.
        let Ok(meta) = std::fs::metadata(&walk_root) else {
            continue;
        };
        if walk_root.starts_with(exclude)
            || walk_root
                .file_name()
                .is_some_and(|n| is_temp_name(n.as_bytes()))
        {
            continue;
        }
        let w = Walk {
            stage,
            glob: &g,
            exclude,
            stat,
        };
        if meta.is_dir() {
            let blocks = w.dir(&walk_root, &[])?;
            found.reserve(blocks.iter().map(Vec::len).sum());
            for b in blocks {
                found.extend(b);
            }
        } else {
            // A base that is a file is its own only entry, with an empty
            // relpath (what a directory walk from it yields).
            let item = w.item(b"", b"").map_err(|()| FilesError::NonUtf8Path {
                stage: stage.to_string(),
                path: walk_root.clone(),
            })?;
            if g.matcher.is_match(&item.item) {
                let at = crate::now_ns();
                let st = stat.then(|| (crate::stat::stat_path(&walk_root), at));
                found.push((item, st));
            }
        }
    }
    // One glob's walk comes out sorted (see `Walk::dir`). Of several, a
    // file matched by two is listed once, with the first glob's relpath
    // (the sort is stable).
    let sorted = found.windows(2).all(|w| w[0].0.item < w[1].0.item);
    // One glob out of order would be our bug (tested); sorting is then
    // still right, so a release build recovers.
    debug_assert!(sorted || patterns.len() > 1, "a walk came out unsorted");
    if !sorted {
        found.sort_by(|a, b| a.0.item.cmp(&b.0.item));
        found.dedup_by(|b, a| a.0.item == b.0.item);
    }
    Ok(found)
}

/// What one folder's walk yields: runs of inputs, in item order when
/// concatenated.
type Blocks = Vec<Vec<(Found, Option<StatAt>)>>;

struct Walk<'a> {
    stage: &'a str,
    glob: &'a Glob,
    exclude: &'a Path,
    stat: bool,
}

impl Walk<'_> {
    /// Whether `abs`/`name` is the excluded path, without joining them: a
    /// joined path per file was a million allocations in a large walk.
    fn is_exclude(&self, abs: &Path, name: &std::ffi::OsStr) -> bool {
        self.exclude.file_name() == Some(name) && self.exclude.parent() == Some(abs)
    }

    fn unreadable(&self, path: &Path, source: std::io::Error) -> FilesError {
        FilesError::InputUnreadable {
            stage: self.stage.to_string(),
            path: path.to_path_buf(),
            source,
        }
    }

    /// The input at `rel` + `name` below the walk root; `Err` when the path
    /// is not UTF-8 (an item is a string).
    fn item(&self, rel: &[u8], name: &[u8]) -> Result<Found, ()> {
        let rel = std::str::from_utf8(rel).map_err(|_| ())?;
        let name = std::str::from_utf8(name).map_err(|_| ())?;
        let base = &self.glob.base;
        let sep = usize::from(!base.is_empty());
        let mut item = String::with_capacity(base.len() + sep + rel.len() + name.len());
        if !base.is_empty() {
            item.push_str(base);
            item.push('/');
        }
        item.push_str(rel);
        item.push_str(name);
        Ok(Found {
            relpath_len: rel.len() + name.len(),
            item,
        })
    }

    /// The inputs in folder `abs` (at `rel` below the walk root, ending in
    /// `/` unless empty) and below it, as runs that are in item order when
    /// concatenated: items compare as bytes, and every item below folder
    /// `d` starts with `d/`, which no other name here does, so the folder's
    /// entries sorted by `name` for a file and `name/` for a folder give
    /// the order of the whole walk without a sort of it.
    fn dir(&self, abs: &Path, rel: &[u8]) -> Result<Blocks, FilesError> {
        use rayon::prelude::*;
        use std::os::unix::ffi::OsStrExt;
        let mut files = Vec::new();
        let mut dirs = Vec::new();
        let rd = std::fs::read_dir(abs).map_err(|e| self.unreadable(abs, e))?;
        for e in rd {
            let e = e.map_err(|e| self.unreadable(abs, e))?;
            let name = e.file_name();
            if is_temp_name(name.as_bytes()) {
                continue;
            }
            // Not followed: a symlink, even to a folder, is an entry.
            let ft = e
                .file_type()
                .map_err(|err| self.unreadable(&e.path(), err))?;
            if ft.is_dir() {
                let child = abs.join(&name);
                if !child.starts_with(self.exclude) {
                    dirs.push((child, name));
                }
            } else if !self.is_exclude(abs, &name) {
                files.push(name);
            }
        }
        files.sort_unstable();
        let mut matched = Vec::with_capacity(files.len());
        for name in files {
            let found = self
                .item(rel, name.as_bytes())
                .map_err(|()| FilesError::NonUtf8Path {
                    stage: self.stage.to_string(),
                    path: abs.join(&name),
                })?;
            if self.glob.matcher.is_match(&found.item) {
                matched.push((found, name));
            }
        }
        let mut here = Vec::with_capacity(matched.len());
        if !matched.is_empty() {
            let dir = if self.stat {
                Some(crate::stat::Dir::open(abs))
            } else {
                None
            };
            let at = crate::now_ns();
            for (found, name) in matched {
                let st = dir.as_ref().map(|d| {
                    let statted = match d {
                        Ok(d) => match name.to_str() {
                            Some(n) => d.stat(n),
                            None => Err(std::io::Error::other("name is not UTF-8")),
                        },
                        Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
                    };
                    (statted, at)
                });
                here.push((found, st));
            }
        }
        if dirs.is_empty() {
            return Ok(vec![here]);
        }
        // By `name/`, not by name: `a-b/` comes before `a/`.
        dirs.sort_unstable_by(|a, b| {
            let (a, b) = (a.1.as_bytes(), b.1.as_bytes());
            a.iter().chain(b"/").cmp(b.iter().chain(b"/"))
        });
        let below = dirs
            .par_iter()
            .map(|(child, name)| {
                let mut r = Vec::with_capacity(rel.len() + name.len() + 1);
                r.extend_from_slice(rel);
                r.extend_from_slice(name.as_bytes());
                r.push(b'/');
                self.dir(child, &r)
            })
            .collect::<Vec<_>>();
        // Files and folders merged by key: a file's name, a folder's name
        // followed by `/`.
        let mut out: Blocks = Vec::new();
        let mut files = here.into_iter().peekable();
        for ((_, dname), b) in dirs.iter().zip(below) {
            let b = b?;
            let mut key = dname.as_bytes().to_vec();
            key.push(b'/');
            let mut run = Vec::new();
            while let Some(f) = files.next_if(|f| f.0.relpath().as_bytes()[rel.len()..] < key[..]) {
                run.push(f);
            }
            if !run.is_empty() {
                out.push(run);
            }
            out.extend(b);
        }
        let rest: Vec<_> = files.collect();
        if !rest.is_empty() {
            out.push(rest);
        }
        Ok(out)
    }
}

/// What the output folders hold now, as far as a plan needs to know.
#[derive(Debug, Default)]
pub struct OutputScan {
    /// Files found in the folders that had to be listed, as templates
    /// render them (relative to the config folder).
    pub files: HashSet<String>,
    /// Folders whose record still holds: every output recorded in them
    /// exists, and they were not listed.
    pub trusted: HashSet<String>,
    /// Temp folders (or files) left by a run that died.
    pub temps: Vec<PathBuf>,
}

impl OutputScan {
    /// Whether an output exists: listed, or recorded in a trusted folder.
    pub fn exists(&self, output: &str, recorded: bool) -> bool {
        (recorded && self.trusted.contains(crate::stat::split_parent(output).0))
            || self.files.contains(output)
    }

    /// Whether any output exists at all (for the guard).
    pub fn any(&self) -> bool {
        !self.files.is_empty() || !self.trusted.is_empty()
    }
}

/// Looks at the folders that hold (or will hold) a stage's outputs. A folder
/// whose mtime and inode match its record, and whose record is not racy, is
/// trusted without listing; any other folder is listed (one readdir, no stat
/// per file). Folders are handled in parallel.
pub fn scan_output_dirs(
    root: &Path,
    dirs: &[String],
    recorded: &BTreeMap<String, DirRecord>,
    granularity_ns: i64,
) -> Result<OutputScan, FilesError> {
    use rayon::prelude::*;
    use std::os::unix::fs::MetadataExt;
    enum One {
        Trusted(String),
        Listed(Vec<String>, Vec<PathBuf>),
    }
    let per_dir = dirs
        .par_iter()
        .map(|dir| -> Result<One, FilesError> {
            let path = if dir.is_empty() {
                root.to_path_buf()
            } else {
                root.join(dir)
            };
            let m = match std::fs::metadata(&path) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Ok(One::Listed(Vec::new(), Vec::new()))
                }
                Err(e) => return Err(FilesError::io("reading output folder", path, e)),
            };
            let mtime_ns = m
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(m.mtime_nsec());
            let ctime_ns = m
                .ctime()
                .saturating_mul(1_000_000_000)
                .saturating_add(m.ctime_nsec());
            if let Some(r) = recorded.get(dir) {
                if r.mtime_ns == mtime_ns
                    && r.ctime_ns == ctime_ns
                    && r.ino == m.ino()
                    && !is_racy(r.mtime_ns, r.observed_at_ns, granularity_ns)
                {
                    return Ok(One::Trusted(dir.clone()));
                }
            }
            let mut files = Vec::new();
            let mut temps = Vec::new();
            let rd = std::fs::read_dir(&path)
                .map_err(|e| FilesError::io("listing output folder", &path, e))?;
            for e in rd {
                let e = e.map_err(|e| FilesError::io("listing output folder", &path, e))?;
                let name = e.file_name();
                let Some(name) = name.to_str() else { continue };
                if name.starts_with('.') && name.contains(TEMP_MARK) {
                    temps.push(e.path());
                    continue;
                }
                if e.file_type().is_ok_and(|t| !t.is_dir()) {
                    files.push(if dir.is_empty() {
                        name.to_string()
                    } else {
                        format!("{dir}/{name}")
                    });
                }
            }
            Ok(One::Listed(files, temps))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut scan = OutputScan::default();
    for one in per_dir {
        match one {
            One::Trusted(d) => {
                scan.trusted.insert(d);
            }
            One::Listed(files, temps) => {
                scan.files.extend(files);
                scan.temps.extend(temps);
            }
        }
    }
    Ok(scan)
}

/// Stats output folders to record them after a run. The instant is taken
/// before the stat, so a folder changed in the same tick stays racy.
pub fn record_output_dirs(root: &Path, dirs: &[String]) -> Vec<DirRecord> {
    use rayon::prelude::*;
    use std::os::unix::fs::MetadataExt;
    dirs.par_iter()
        .filter_map(|dir| {
            let observed_at_ns = crate::now_ns();
            let path = if dir.is_empty() {
                root.to_path_buf()
            } else {
                root.join(dir)
            };
            let m = std::fs::metadata(path).ok()?;
            Some(DirRecord {
                dir: dir.clone(),
                mtime_ns: m
                    .mtime()
                    .saturating_mul(1_000_000_000)
                    .saturating_add(m.mtime_nsec()),
                ctime_ns: m
                    .ctime()
                    .saturating_mul(1_000_000_000)
                    .saturating_add(m.ctime_nsec()),
                ino: m.ino(),
                observed_at_ns,
            })
        })
        .collect()
}

/// The distinct folders of a set of output paths, sorted.
pub fn output_dirs<'a>(outputs: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut dirs: Vec<&str> = outputs.map(|o| crate::stat::split_parent(o).0).collect();
    dirs.sort_unstable();
    dirs.dedup();
    dirs.into_iter().map(str::to_string).collect()
}

/// The inputs of a stage whose globs lie in object storage `place`: each
/// glob's literal base is listed once, and its objects matched. An item is
/// `PLACE:KEY`. The listing is the stat: size, last-modified time, and the
/// ETag (hashed into the inode field, so that the planner's stat cache
/// compares it like any other stat field: an unchanged ETag means no read).
pub fn find_objects(
    objects: &highwater_objects::Objects,
    place: &str,
    stage: &str,
    patterns: &[String],
) -> Result<Vec<(Found, highwater_core::Stat)>, FilesError> {
    let mut found = Vec::new();
    for pattern in patterns {
        let g = compile(stage, pattern)?;
        let listed = objects.list(&g.base).map_err(|e| FilesError::Storage {
            stage: stage.to_string(),
            message: e.to_string(),
        })?;
        for o in listed {
            if !g.matcher.is_match(&o.key) {
                continue;
            }
            let rel = if g.base.is_empty() {
                o.key.clone()
            } else {
                o.key[g.base.len() + 1..].to_string()
            };
            found.push((
                Found::new(format!("{place}:{}", o.key), &rel),
                object_stat(&o),
            ));
        }
    }
    found.sort_by(|a, b| a.0.item.cmp(&b.0.item));
    found.dedup_by(|b, a| a.0.item == b.0.item);
    Ok(found)
}

/// An object's listing as a stat: the ETag goes where a file's inode goes.
pub fn object_stat(o: &highwater_objects::ObjectInfo) -> highwater_core::Stat {
    let h = blake3::hash(o.etag.as_bytes());
    let mut ino = [0u8; 8];
    ino.copy_from_slice(&h.as_bytes()[..8]);
    highwater_core::Stat {
        size: o.size,
        mtime_ns: o.last_modified_ns,
        ctime_ns: o.last_modified_ns,
        ino: u64::from_le_bytes(ino),
        dev: 0,
    }
}

/// The outputs a stage has in object storage under `root` (its template's
/// literal root), as `PLACE:KEY`.
pub fn scan_objects(
    objects: &highwater_objects::Objects,
    place: &str,
    stage: &str,
    root: &str,
) -> Result<OutputScan, FilesError> {
    let listed = objects.list(root).map_err(|e| FilesError::Storage {
        stage: stage.to_string(),
        message: e.to_string(),
    })?;
    Ok(OutputScan {
        files: listed
            .into_iter()
            .map(|o| format!("{place}:{}", o.key))
            .collect(),
        ..OutputScan::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bases() {
        assert_eq!(glob_base("data/**/*.txt"), "data");
        assert_eq!(glob_base("./data/x/*.txt"), "data/x");
        assert_eq!(glob_base("*.txt"), "");
        assert_eq!(glob_base("data/a.txt"), "data");
        assert_eq!(glob_base("/abs/d/*.c"), "/abs/d");
    }

    #[test]
    fn finds_matching_files_sorted() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        for p in [
            "data/b.txt",
            "data/a/c.txt",
            "data/a/d.csv",
            "data/.x.hw-tmp-1-2",
            "other/e.txt",
        ] {
            let p = r.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "x").unwrap();
        }
        let f = find_inputs(r, "s", &["data/**/*.txt".into()], &r.join(".highwater")).unwrap();
        let items: Vec<_> = f.iter().map(|f| (f.item.as_str(), f.relpath())).collect();
        assert_eq!(
            items,
            [("data/a/c.txt", "a/c.txt"), ("data/b.txt", "b.txt")]
        );
    }

    #[test]
    fn one_glob_walks_in_item_order_without_a_sort() {
        // '-' < '.' < '/' < '0' < 'A' < 'a': a folder's block sits between
        // the files around its name followed by `/`.
        let names = [
            "data/a0.txt",
            "data/a/b/c.txt",
            "data/A.txt",
            "data/a-b/x.txt",
            "data/a/x.txt",
            "data/a.txt",
            "data/a/b.txt",
            "data/a/b.d/e.txt",
            "data/b/a.txt",
        ];
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        for p in names {
            let p = r.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "x").unwrap();
        }
        let (found, _) =
            find_inputs_statted(r, "s", &["data/**/*.txt".into()], &r.join(".highwater")).unwrap();
        let got: Vec<_> = found.iter().map(|f| f.item.as_str()).collect();
        let mut want = names.to_vec();
        want.sort();
        assert_eq!(got, want);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Any tree of names that sort close together comes out in item
        /// order, each file once.
        #[test]
        fn any_tree_walks_in_item_order(
            paths in proptest::collection::vec(
                proptest::collection::vec("[aA0-][aA0.-]?", 1..4), 1..30)
        ) {
            let dir = tempfile::tempdir().unwrap();
            let r = dir.path();
            let mut want = Vec::new();
            for comps in paths {
                let rel = format!("data/{}.t", comps.join("/"));
                let p = r.join(&rel);
                // A name already taken by a file (or a folder) is skipped.
                if std::fs::create_dir_all(p.parent().unwrap()).is_err() || p.exists() {
                    continue;
                }
                if std::fs::write(&p, "x").is_ok() {
                    want.push(rel);
                }
            }
            let (found, _) =
                find_inputs_statted(r, "s", &["data/**/*.t".into()], &r.join(".highwater")).unwrap();
            let got: Vec<_> = found.iter().map(|f| f.item.clone()).collect();
            want.sort();
            want.dedup();
            proptest::prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn the_statted_walk_finds_the_same_inputs_with_their_own_stats() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        for (i, p) in [
            "data/z.txt",
            "data/a/b/c.txt",
            "data/a.txt",
            "data/a/x.csv",
            "data/.o.hw-tmp-1-2/inside.txt",
            "data/.highwater/state.txt",
            "elsewhere/e.txt",
        ]
        .iter()
        .enumerate()
        {
            let p = r.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "x".repeat(i + 1)).unwrap();
        }
        // A symlink to a folder is an entry, not followed into.
        std::os::unix::fs::symlink(r.join("elsewhere"), r.join("data/link.txt")).unwrap();
        let globs = ["data/**/*.txt".to_string(), "data/*.txt".to_string()];
        let exclude = r.join("data/.highwater");
        let plain = find_inputs(r, "s", &globs, &exclude).unwrap();
        let (found, stats) = find_inputs_statted(r, "s", &globs, &exclude).unwrap();
        assert_eq!(found, plain);
        let items: Vec<_> = found.iter().map(|f| f.item.as_str()).collect();
        assert_eq!(
            items,
            [
                "data/a.txt",
                "data/a/b/c.txt",
                "data/link.txt",
                "data/z.txt"
            ]
        );
        assert_eq!(found[1].relpath(), "a/b/c.txt");
        for (f, (st, _)) in found.iter().zip(&stats) {
            let m = std::fs::metadata(r.join(&f.item)).unwrap();
            let (st, is_file) = st.as_ref().unwrap();
            assert_eq!((st.size, st.ino), (m.len(), m.ino()), "{}", f.item);
            assert_eq!(*is_file, m.is_file(), "{}", f.item);
        }
    }
}
