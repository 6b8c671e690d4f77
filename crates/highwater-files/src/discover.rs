//! Discovery: which files a stage's globs match now, and which files its
//! output root holds. It decides nothing; it only lists.

use crate::error::FilesError;
use globset::{GlobBuilder, GlobMatcher};
use highwater_core::template::normalize_lexically;
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
    /// The path to open.
    pub abs: PathBuf,
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
    let mut found: BTreeMap<String, Found> = BTreeMap::new();
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
            let rel = entry
                .path()
                .strip_prefix(&walk_root)
                .expect("walkdir yields paths under its root");
            let Some(rel) = rel.to_str() else {
                return Err(FilesError::NonUtf8Path {
                    stage: stage.to_string(),
                    path: entry.path().to_path_buf(),
                });
            };
            let item = if g.base.is_empty() {
                rel.to_string()
            } else {
                format!("{}/{}", g.base, rel)
            };
            if !g.matcher.is_match(&item) {
                continue;
            }
            found.entry(item.clone()).or_insert_with(|| Found {
                item,
                relpath: rel.to_string(),
                abs: entry.path().to_path_buf(),
            });
        }
    }
    Ok(found.into_values().collect())
}

/// What an output root holds now.
#[derive(Debug, Default)]
pub struct OutputListing {
    /// Paths as templates render them (relative to the config folder).
    pub files: HashSet<String>,
    /// Temp folders (or files) left by a run that died.
    pub temps: Vec<PathBuf>,
}

/// Lists the files under an output root without a stat per file.
pub fn list_outputs(root: &Path, output_root: &str) -> Result<OutputListing, FilesError> {
    let mut out = OutputListing::default();
    let walk_root = if output_root.is_empty() {
        root.to_path_buf()
    } else {
        root.join(output_root)
    };
    if !walk_root.exists() {
        return Ok(out);
    }
    let mut walker = walkdir::WalkDir::new(&walk_root)
        .follow_links(false)
        .into_iter();
    while let Some(entry) = walker.next() {
        let entry = entry.map_err(|e| {
            FilesError::io(
                "listing output root",
                walk_root.clone(),
                e.into_io_error()
                    .unwrap_or_else(|| std::io::Error::other("walk error")),
            )
        })?;
        if is_temp(&entry) {
            out.temps.push(entry.path().to_path_buf());
            if entry.file_type().is_dir() {
                walker.skip_current_dir();
            }
            continue;
        }
        if entry.file_type().is_dir() {
            continue;
        }
        let rel = entry
            .path()
            .strip_prefix(&walk_root)
            .expect("walkdir yields paths under its root");
        if let Some(rel) = rel.to_str() {
            let p = if output_root.is_empty() {
                rel.to_string()
            } else {
                format!("{output_root}/{rel}")
            };
            out.files.insert(p);
        }
    }
    Ok(out)
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
