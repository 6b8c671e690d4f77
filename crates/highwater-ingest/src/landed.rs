//! What a downstream reader of a source's windows may ask (issue 49): the
//! grid, where each window stands with the digest of its rows, and a
//! published window's current data files. The one public surface file
//! stages over windows read through (the binary adapts it to
//! `highwater_files::inputs::windows::Landed`); it decides nothing and
//! writes nothing.

use crate::engine::Ingestor;
use crate::error::IngestError;
use crate::format::LoadFrom;
use highwater_core::window::Window;
use highwater_store::{StateStore, WindowRecord, WindowStatus};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Where one window with a record stands, for a reader of its rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Published under the source's current recipe, its checks passed,
    /// its files in place: the order-free digest of its rows.
    Ready { digest: String },
    /// Not to be read, in words (`failed: ...`, `running`, `stale`, `gone`).
    NotReady(String),
}

/// One window a source has a record of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LandedWindow {
    pub start_us: i64,
    pub end_us: i64,
    pub standing: Standing,
}

/// One current data file of a window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataFile {
    Local(PathBuf),
    /// A key in the object store the source's `output` names.
    Object {
        place: String,
        key: String,
    },
}

/// How many windows one thread of `landed_windows` checks at a time.
const LANDED_CHUNK_WINDOWS: usize = 128;

impl Ingestor {
    /// The grid's first window start and its interval.
    pub fn grid_start_interval(&self) -> (i64, i64) {
        (self.t.spec.grid.start_us, self.t.spec.grid.interval_us)
    }

    /// The local folder the source's files live under, relative to the
    /// config folder; `None` in object storage.
    pub fn local_output_root(&self) -> Option<String> {
        self.t
            .spec
            .output_place
            .is_none()
            .then(|| self.t.spec.output_root())
    }

    /// Every window record of the source, by start.
    pub fn window_records(&self) -> Result<Vec<WindowRecord>, IngestError> {
        Ok(self.state.open()?.windows(&self.t.spec.name)?)
    }

    /// The source's window records in `store` (the state the source's
    /// own runs write: a reader passes its open connection) with only what
    /// `landed_windows` and `windows_without_files` read
    /// (`StateStore::window_heads`): not for `window_data_files`.
    pub fn window_heads(&self, store: &dyn StateStore) -> Result<Vec<WindowRecord>, IngestError> {
        Ok(store.window_heads(&self.t.spec.name)?)
    }

    /// Where each window of `records` stands, as its record says: a
    /// published window's files are not looked for here (see
    /// [`Self::windows_without_files`]).
    pub fn landed_windows(&self, records: &[WindowRecord]) -> Vec<LandedWindow> {
        records
            .iter()
            .map(|r| LandedWindow {
                start_us: r.start_us,
                end_us: r.end_us,
                standing: self.standing(r),
            })
            .collect()
    }

    fn standing(&self, r: &WindowRecord) -> Standing {
        let not = |s: String| Standing::NotReady(s);
        match r.status {
            WindowStatus::Failed => not(format!(
                "failed: {}",
                r.error.as_deref().unwrap_or("(no error recorded)")
            )),
            WindowStatus::Running => not("running".into()),
            WindowStatus::Published if r.recipe != self.t.recipe => {
                not("stale (landed under another recipe of the source)".into())
            }
            WindowStatus::Published => match r.extra["digest"].as_str() {
                Some(d) => Standing::Ready {
                    digest: d.to_string(),
                },
                None => not("published without a digest of its rows".into()),
            },
        }
    }

    /// The positions in `records` of the published windows whose files are
    /// gone from the output ([`TableFormat::has_window`]), rising. Asked
    /// for the windows about to be read or landed again only: each is a
    /// lookup on disk (a `stat`), in chunks on rayon's threads, a compacted
    /// period's manifest read once per chunk.
    ///
    /// [`TableFormat::has_window`]: crate::format::TableFormat::has_window
    pub fn windows_without_files(&self, records: &[&WindowRecord]) -> Vec<usize> {
        use rayon::prelude::*;
        records
            .par_chunks(LANDED_CHUNK_WINDOWS)
            .enumerate()
            .flat_map_iter(|(c, chunk)| {
                let mut periods = BTreeMap::new();
                chunk
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.status == WindowStatus::Published)
                    .filter(|(_, r)| !self.format.has_window(r, &mut periods))
                    .map(|(i, _)| c * LANDED_CHUNK_WINDOWS + i)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The current data files holding the rows of published window
    /// record `r`. A compacted period's or a Delta table's files may hold
    /// other windows' rows too; a record another run has replaced since it
    /// was read is refused by the format (its token no longer matches).
    pub fn window_data_files(&self, r: &WindowRecord) -> Result<Vec<DataFile>, String> {
        let w = Window {
            start_us: r.start_us,
            end_us: r.end_us,
        };
        if r.status != WindowStatus::Published {
            return Err(format!(
                "window {w} of source `{}` is not published",
                self.t.spec.name
            ));
        }
        let wf = self.format.window_files(&w, r)?;
        Ok(wf
            .files
            .into_iter()
            .map(|f| match &wf.from {
                LoadFrom::Local(dir) => DataFile::Local(dir.join(f)),
                LoadFrom::Bucket(prefix) => DataFile::Object {
                    place: self.t.spec.output_place.clone().unwrap_or_default(),
                    key: format!("{prefix}/{f}"),
                },
            })
            .collect())
    }
}
