//! The format context: what a table format needs to know of its source
//! (where the output lives, the source's spec and recipe, the object store
//! the output may name) and of the lease it works under, and nothing of the
//! engine that drives it. Every [`crate::format::TableFormat`] is built
//! from a [`Table`]; the engine holds one too, so both see one truth about
//! paths.

use crate::config::SourceSpec;
use crate::error::IngestError;
use highwater_core::window::Window;
use highwater_objects::Objects;
use highwater_store::lease::now_ns;
use highwater_store::{Fence, StateStore};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// One source's output as a table format sees it.
pub(crate) struct Table {
    /// The project root every relative output path is under.
    pub(crate) root: PathBuf,
    pub(crate) spec: SourceSpec,
    /// The recipe id windows are published under.
    pub(crate) recipe: String,
    /// The client of the object store windows are published to, when
    /// `output` names one.
    pub(crate) objects: Option<Arc<Objects>>,
}

/// A scratch folder of highwater's own under `.highwater/objects-staging`
/// (files read back from a bucket), removed when dropped: on every way out.
pub(crate) struct Scratch(pub(crate) PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Table {
    /// The window's path as records and reports show it, and the local
    /// folder it is staged and (when local) published in. For object
    /// storage the path is `PLACE:KEY` and the local folder a staging area
    /// under `.highwater/objects-staging`.
    pub(crate) fn window_path(&self, w: &Window) -> (String, PathBuf) {
        let rel = self
            .spec
            .window_path(w)
            .expect("the template was checked at config load");
        match &self.spec.output_place {
            None => {
                let abs = self.root.join(&rel);
                (rel, abs)
            }
            Some(place) => {
                let abs = self
                    .root
                    .join(".highwater/objects-staging")
                    .join(&self.spec.name)
                    .join(&rel);
                (format!("{place}:{rel}"), abs)
            }
        }
    }

    /// A fresh attempt token for window (or period) `k`: unique across
    /// processes and runs, so two attempts never share a staging folder,
    /// a version prefix or a commit's identity.
    pub(crate) fn token(&self, k: i64) -> String {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let seed = format!(
            "{}:{k}:{}:{}:{}",
            self.spec.name,
            now_ns(),
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        blake3::hash(seed.as_bytes()).to_hex()[..20].to_string()
    }

    /// An error of the object store, for window `window`.
    pub(crate) fn store_err(&self, window: &str, e: impl std::fmt::Display) -> IngestError {
        IngestError::Storage {
            name: self.spec.name.clone(),
            window: window.to_string(),
            message: e.to_string(),
        }
    }

    /// The object store `output` names.
    pub(crate) fn objects(&self) -> &Objects {
        self.objects
            .as_deref()
            .expect("an object-storage source is opened with its store")
    }

    /// Downloads `files` (names under the key prefix `prefix`) into `to`.
    pub(crate) fn download(&self, prefix: &str, files: &[String], to: &Path) -> Result<(), String> {
        std::fs::create_dir_all(to).map_err(|e| format!("creating {}: {e}", to.display()))?;
        let o = self.objects();
        for f in files {
            o.get_to(&format!("{prefix}/{f}"), &to.join(f))
                .map_err(|e| format!("reading the published file back from the bucket: {e}"))?;
        }
        Ok(())
    }

    /// Scratch folder `what` of this source.
    pub(crate) fn scratch(&self, what: &str) -> Scratch {
        Scratch(
            self.root
                .join(".highwater/objects-staging")
                .join(&self.spec.name)
                .join(what),
        )
    }

    /// Removes this source's scratch folders named `KIND-*` left by a run
    /// killed before it removed them. Only under the source lease (one
    /// compaction or load of a source at a time), so none is in use.
    pub(crate) fn sweep_scratch(&self, kind: &str) {
        let dir = self
            .root
            .join(".highwater/objects-staging")
            .join(&self.spec.name);
        let Ok(rd) = std::fs::read_dir(&dir) else {
            return;
        };
        let mark = format!("{kind}-");
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with(&mark) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// The lease a format's long work runs under (a period's compaction): the
/// state store and the fence, so that the format can renew the lease right
/// before its swap and record what it swapped, and say who took the lease
/// when it was lost.
pub(crate) struct Held<'a> {
    pub(crate) store: &'a Mutex<Box<dyn StateStore>>,
    pub(crate) fence: &'a Fence,
    pub(crate) lease_duration_s: u64,
}

impl Held<'_> {
    pub(crate) fn store(&self) -> MutexGuard<'_, Box<dyn StateStore>> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Renews the lease; false when it is no longer ours.
    pub(crate) fn renew(&self) -> Result<bool, IngestError> {
        Ok(self.store().renew_lease(
            self.fence,
            now_ns(),
            self.lease_duration_s as i64 * 1_000_000_000,
        )?)
    }

    /// Who the lease was lost to, in words (see [`lost_to`]).
    pub(crate) fn lost_to(&self) -> String {
        lost_to(self.store, self.fence)
    }
}

/// Who the lease `fence` names was lost to, in words, for the reasons of
/// work left undone: the holder now (owner, host, pid) when the store can
/// say, else only that it was lost.
pub(crate) fn lost_to(store: &Mutex<Box<dyn StateStore>>, fence: &Fence) -> String {
    let holder = store
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .lease(&fence.name)
        .ok()
        .flatten()
        .filter(|l| l.token != fence.token);
    match holder {
        Some(l) => format!(
            "the lease `{}` was lost mid-run to {} (host {}, pid {})",
            fence.name, l.owner, l.host, l.pid
        ),
        None => format!("the lease `{}` was lost mid-run", fence.name),
    }
}
