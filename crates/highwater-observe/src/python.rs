//! Which folder listings Python's import system makes (issue 47).
//!
//! A listing dependency counts every name of a folder, since a command may
//! print them all. Python's import system lists a folder on `sys.path` only
//! to look module names up in it: a new `notes.txt` beside a script cannot
//! change an import, a new `helpers.py` can. The kernel cannot tell the two
//! listings apart, so the commands are told to say it: an observed
//! command's environment puts a folder of highwater's first on
//! `PYTHONPATH`, whose `sitecustomize.py` adds an audit hook that stats a
//! path that never exists before each `os.listdir` and `os.scandir`, naming
//! the folder when the caller is the import system's `FileFinder`
//! (`listing/i<hex of the path>`) and nothing otherwise (`listing/u`). The
//! tracer reads those stats as announcements (see `Announced`), never as
//! lookups. A Python started with `-I`, `-E` or `-S`, or one older than
//! 3.8, announces nothing: its listings count whole, which is never less
//! safe.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const SITECUSTOMIZE: &str = include_str!("sitecustomize.py");

/// The folder holding `sitecustomize.py`, written once per process under
/// the user's cache (`$XDG_CACHE_HOME` or `~/.cache`), never under a
/// shared `/tmp` where another user could plant one. `None` when it cannot
/// be written: Python's listings then count whole.
pub(crate) fn hook_dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| install().ok()).as_deref()
}

fn install() -> std::io::Result<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .ok_or_else(|| std::io::Error::other("no HOME"))?;
    // Versioned by content: a changed hook is a new folder, so a run never
    // sees a half-replaced file and an old highwater keeps its own.
    let dir = cache.join("highwater").join(format!(
        "python-hook-{:016x}",
        fnv(SITECUSTOMIZE.as_bytes())
    ));
    let file = dir.join("sitecustomize.py");
    if std::fs::read(&file).ok().as_deref() == Some(SITECUSTOMIZE.as_bytes()) {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir)?;
    let tmp = dir.join(format!(".sitecustomize.{}.tmp", std::process::id()));
    std::fs::write(&tmp, SITECUSTOMIZE)?;
    std::fs::rename(&tmp, &file)?;
    Ok(dir)
}

/// FNV-1a, 64 bits: names the hook's folder by its content.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Puts the hook's folder first on the command's `PYTHONPATH`, keeping
/// what it had (set on `cmd`, or inherited).
pub(crate) fn prepare(cmd: &mut Command) {
    let Some(dir) = hook_dir() else { return };
    let set = cmd
        .get_envs()
        .find(|(k, _)| *k == "PYTHONPATH")
        .map(|(_, v)| v.map(|v| v.to_os_string()));
    let old = match set {
        Some(v) => v,
        None => std::env::var_os("PYTHONPATH"),
    };
    let mut value = OsString::from(dir);
    if let Some(old) = old.filter(|o| !o.is_empty()) {
        value.push(":");
        value.push(old);
    }
    cmd.env("PYTHONPATH", value);
}

/// What a stat of the announcement path says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Announced {
    /// The import system is about to list this folder.
    Import(PathBuf),
    /// Some other code is about to list a folder.
    Other,
}

/// Whether `path` (as the tracee named it) is an announcement.
pub(crate) fn announced(path: &[u8]) -> Option<Announced> {
    let dir = hook_dir()?;
    let rest = path.strip_prefix(dir.as_os_str().as_bytes())?;
    let rest = rest.strip_prefix(b"/listing/")?;
    match rest.split_first()? {
        (b'u', []) => Some(Announced::Other),
        (b'i', hex) => unhex(hex).map(|p| Announced::Import(PathBuf::from(OsString::from_vec(p)))),
        _ => None,
    }
}

/// Whether `path` lies in the hook's folder: what Python reads there is
/// highwater's, never the command's dependency.
pub(crate) fn is_hook_path(path: &Path) -> bool {
    hook_dir().is_some_and(|d| path.starts_with(d))
}

fn unhex(hex: &[u8]) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    hex.chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// Whether a name in a folder could be matched by an import: a module
/// name has no dot, so only `NAME` (a package or namespace folder) and
/// `NAME.py`, `NAME.pyc`, `NAME.so` or `NAME.TAG.so` (an extension module)
/// can. Everything else (`notes.txt`, `data.csv`, `.x.swp`) cannot.
pub fn importable(name: &str) -> bool {
    let Some((stem, rest)) = name.split_once('.') else {
        return !name.is_empty();
    };
    !stem.is_empty()
        && (matches!(rest, "py" | "pyc" | "so")
            || rest
                .strip_suffix(".so")
                .is_some_and(|tag| !tag.is_empty() && !tag.contains('/')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_an_import_can_match() {
        for n in [
            "helpers.py",
            "json.py",
            "pkg",
            "m.pyc",
            "fast.cpython-311-x86_64-linux-gnu.so",
            "x.abi3.so",
            "e.so",
            "Makefile",
        ] {
            assert!(importable(n), "{n}");
        }
        for n in [
            "notes.txt",
            ".x.swp",
            "data.csv",
            "a.b.py",
            ".hidden.py",
            "",
            "x.py~",
            "README.md",
        ] {
            assert!(!importable(n), "{n}");
        }
    }

    #[test]
    fn announcements_round_trip() {
        let dir = hook_dir().expect("a writable cache");
        let mut p = dir.as_os_str().as_bytes().to_vec();
        p.extend_from_slice(b"/listing/i");
        p.extend(
            b"/w/a b"
                .iter()
                .flat_map(|b| format!("{b:02x}").into_bytes()),
        );
        assert_eq!(announced(&p), Some(Announced::Import("/w/a b".into())));
        let mut u = dir.as_os_str().as_bytes().to_vec();
        u.extend_from_slice(b"/listing/u");
        assert_eq!(announced(&u), Some(Announced::Other));
        assert_eq!(announced(b"/etc/passwd"), None);
        assert!(is_hook_path(&dir.join("sitecustomize.py")));
    }
}
