//! Staging and the atomic swap. A window is written into a hidden staging
//! folder beside its final path, fsynced, described by `_manifest.json`,
//! and then made visible in one step: `renameat2(RENAME_EXCHANGE)` swaps it
//! with the previous version (or a plain rename when there is none), so a
//! reader sees the old window or the new one, never half of either.

use crate::error::IngestError;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Staging folders are named `.NAME.hw-staging-TOKEN` beside the window.
pub const STAGING_MARK: &str = ".hw-staging-";

pub fn staging_path(final_path: &Path, token: &str) -> PathBuf {
    let name = final_path.file_name().unwrap_or_default().to_string_lossy();
    final_path.with_file_name(format!(".{name}{STAGING_MARK}{token}"))
}

fn fsync_dir(path: &Path) -> Result<(), IngestError> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| IngestError::io("syncing", path, e))
}

/// Writes `_manifest.json` into the staging folder and fsyncs the folder.
pub fn seal(staging: &Path, manifest: &serde_json::Value) -> Result<(), IngestError> {
    let p = staging.join("_manifest.json");
    let text = serde_json::to_vec_pretty(manifest).expect("a JSON value serializes");
    std::fs::write(&p, text).map_err(|e| IngestError::io("writing", &p, e))?;
    std::fs::File::open(&p)
        .and_then(|f| f.sync_all())
        .map_err(|e| IngestError::io("syncing", &p, e))?;
    fsync_dir(staging)
}

/// Makes the staged window visible at `final_path`, replacing any previous
/// version atomically, then removes the previous version.
pub fn swap_in(staging: &Path, final_path: &Path) -> Result<(), IngestError> {
    let parent = final_path.parent().expect("a window path has a parent");
    if final_path.exists() {
        let a = CString::new(staging.as_os_str().as_bytes()).expect("no NUL in our paths");
        let b = CString::new(final_path.as_os_str().as_bytes()).expect("no NUL in our paths");
        // SAFETY: both are valid NUL-terminated paths; AT_FDCWD resolves
        // them as ordinary paths.
        let r = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                a.as_ptr(),
                libc::AT_FDCWD,
                b.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        };
        if r != 0 {
            return Err(IngestError::io(
                "swapping in",
                final_path,
                std::io::Error::last_os_error(),
            ));
        }
        fsync_dir(parent)?;
        // The staging path now holds the previous version.
        std::fs::remove_dir_all(staging)
            .map_err(|e| IngestError::io("removing the previous version", staging, e))?;
    } else {
        std::fs::rename(staging, final_path)
            .map_err(|e| IngestError::io("publishing", final_path, e))?;
        fsync_dir(parent)?;
    }
    Ok(())
}

/// The token in a published window's `_manifest.json`, if any.
pub fn published_token(final_path: &Path) -> Option<String> {
    let text = std::fs::read(final_path.join("_manifest.json")).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    v.get("token")?.as_str().map(str::to_string)
}

/// Removes staging folders left by runs that died, beside `final_path`,
/// except the one of the attempt `keep` (a chunked window resuming).
pub fn sweep_staging(final_path: &Path, keep: Option<&Path>) {
    let Some(parent) = final_path.parent() else {
        return;
    };
    let Ok(rd) = std::fs::read_dir(parent) else {
        return;
    };
    for e in rd.flatten() {
        if e.file_name().to_string_lossy().contains(STAGING_MARK)
            && keep.is_none_or(|k| k != e.path())
        {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}
