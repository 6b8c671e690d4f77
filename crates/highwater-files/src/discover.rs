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

fn is_temp(e: &walkdir::DirEntry) -> bool {
    let name = e.file_name().to_string_lossy();
    name.starts_with('.') && name.contains(TEMP_MARK)
}

/// One input found by a glob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// Path relative to the config folder, `/`-separated: the item's name.
    pub item: String,
    /// Path relative to the glob's base folder, for `{relpath}`.
    pub relpath: String,
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
    use std::os::unix::ffi::OsStrExt;
    let mut found: Vec<Found> = Vec::new();
    for pattern in patterns {
        let g = compile(stage, pattern)?;
        let walk_root = if g.base.is_empty() {
            root.to_path_buf()
        } else {
            root.join(&g.base)
        };
        if !walk_root.exists() {
            continue;
        }
        let skip = walk_root.as_os_str().len() + 1;
        let walker = walkdir::WalkDir::new(&walk_root)
            .follow_links(false)
            .into_iter()
            .filter_entry(|e| !e.path().starts_with(exclude) && !is_temp(e));
        for entry in walker {
            let entry = entry.map_err(|e| {
                let path = e.path().map(Path::to_path_buf).unwrap_or(walk_root.clone());
                FilesError::InputUnreadable {
                    stage: stage.to_string(),
                    path,
                    source: e
                        .into_io_error()
                        .unwrap_or_else(|| std::io::Error::other("walk error")),
                }
            })?;
            if entry.file_type().is_dir() {
                continue;
            }
            // The path below the walk root, by slicing rather than by
            // component-wise strip_prefix: this loop runs once per file.
            let bytes = entry.path().as_os_str().as_bytes();
            let Ok(rel) = std::str::from_utf8(&bytes[skip.min(bytes.len())..]) else {
                return Err(FilesError::NonUtf8Path {
                    stage: stage.to_string(),
                    path: entry.path().to_path_buf(),
                });
            };
            let item = if g.base.is_empty() {
                rel.to_string()
            } else {
                let mut s = String::with_capacity(g.base.len() + 1 + rel.len());
                s.push_str(&g.base);
                s.push('/');
                s.push_str(rel);
                s
            };
            if !g.matcher.is_match(&item) {
                continue;
            }
            found.push(Found {
                relpath: rel.to_string(),
                item,
            });
        }
    }
    // A file matched by two globs is listed once, with the first glob's
    // relpath (the sort is stable).
    found.sort_by(|a, b| a.item.cmp(&b.item));
    found.dedup_by(|b, a| a.item == b.item);
    Ok(found)
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
                Found {
                    item: format!("{place}:{}", o.key),
                    relpath: rel,
                },
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
        let items: Vec<_> = f
            .iter()
            .map(|f| (f.item.as_str(), f.relpath.as_str()))
            .collect();
        assert_eq!(
            items,
            [("data/a/c.txt", "a/c.txt"), ("data/b.txt", "b.txt")]
        );
    }
}
