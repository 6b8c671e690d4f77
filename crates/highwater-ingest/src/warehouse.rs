//! Published windows loaded into the warehouse (`[sources.NAME.load]`), as
//! a run owes them: the windows it published, and those whose load failed
//! before, read back from their table format's current files
//! ([`crate::format::TableFormat::window_files`]) and loaded by
//! [`crate::load::Loader`], one transaction each.

use crate::engine::{IngestReport, Ingestor};
use crate::error::IngestError;
use crate::format::{LoadFrom, Rows};
use crate::load::{loaded, LoadOutcome, LoadSpec, Loaded, Loader};
use highwater_core::window::{format_rfc3339, Window};
use highwater_store::lease::now_ns;
use highwater_store::{Fence, StateStore, WindowCommit, WindowRecord, WindowStatus};
use serde_json::json;
use std::sync::Mutex;
use std::time::Instant;

/// The warehouse a source loads into: its spec and connection string.
struct Target<'a> {
    spec: &'a LoadSpec,
    url: &'a str,
}

impl Ingestor {
    /// Refuses, before anything is touched, a load whose connection string
    /// is not in the environment.
    pub(crate) fn check_load_env(&self) -> Result<(), IngestError> {
        if let Some(l) = &self.t.spec.load {
            if std::env::var_os(&l.url_env).is_none() {
                return Err(IngestError::LoadEnv {
                    name: self.t.spec.name.clone(),
                    var: l.url_env.clone(),
                });
            }
        }
        Ok(())
    }

    /// Loads window record `r` from `files` (paths relative to `from`): from
    /// a bucket they are read back into a scratch folder first (removed
    /// when the load is done, whatever its outcome), then loaded as from a
    /// local folder, on `loader`'s connection (made if there is none, and
    /// dropped after a failure: the server may be gone, and the next window
    /// connects afresh).
    fn load_files(
        &self,
        r: &WindowRecord,
        from: LoadFrom,
        files: &[String],
        rows: Rows,
        target: &Target<'_>,
        loader: &mut Option<Loader>,
    ) -> Result<Loaded, String> {
        let mut scratch = None;
        let dir = match from {
            LoadFrom::Local(d) => d,
            LoadFrom::Bucket(prefix) => {
                let s = self.t.scratch(&format!("load-{}", r.token));
                let _ = std::fs::remove_dir_all(&s.0);
                for f in files {
                    if let Some(parent) = s.0.join(f).parent() {
                        std::fs::create_dir_all(parent)
                            .map_err(|e| format!("creating {}: {e}", parent.display()))?;
                    }
                }
                self.t.download(&prefix, files, &s.0)?;
                let d = s.0.clone();
                scratch = Some(s);
                d
            }
        };
        if loader.is_none() {
            *loader = Some(Loader::connect(target.spec, target.url).map_err(|e| {
                format!(
                    "cannot connect to the warehouse ({}): {e}",
                    target.spec.url_env
                )
            })?);
        }
        let l = loader.as_mut().expect("just connected");
        let out = l.load_window(r.start_us, &dir, files, rows);
        if out.is_err() {
            *loader = None;
        }
        drop(scratch);
        out
    }

    /// Loads every published window (current recipe) whose current version
    /// is not in the warehouse yet, oldest first, at most
    /// `catch_up_windows_max` per run: the windows this run published, and
    /// those whose load failed before (read back from their files, not
    /// extracted again). Each load is recorded in the window's record.
    pub(crate) fn load_owed(
        &self,
        report: &mut IngestReport,
        store: &Mutex<Box<dyn StateStore>>,
        fence: &Fence,
    ) -> Result<(), IngestError> {
        let Some(spec) = &self.t.spec.load else {
            return Ok(());
        };
        let owed: Vec<WindowRecord> = store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .windows(&self.t.spec.name)?
            .into_iter()
            .filter(|r| {
                r.status == WindowStatus::Published
                    && r.recipe == self.t.recipe
                    && r.extra["compacted"].is_null()
                    && !loaded(r)
            })
            .take(self.t.spec.catch_up_windows_max)
            .collect();
        if owed.is_empty() {
            return Ok(());
        }
        if self.t.spec.output_place.is_some() {
            // Scratch folders of a run killed mid-load (under the lease).
            self.t.sweep_scratch("load");
        }
        let url = std::env::var(&spec.url_env).map_err(|_| IngestError::LoadEnv {
            name: self.t.spec.name.clone(),
            var: spec.url_env.clone(),
        })?;
        let mut loader: Option<Loader> = None;
        for mut r in owed {
            let w = Window {
                start_us: r.start_us,
                end_us: r.end_us,
            };
            // The fence, before each load: a run that lost the source to
            // another loads nothing more (the other may be re-landing the
            // window this one would load the old files of).
            let ours = store
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .renew_lease(
                    fence,
                    now_ns(),
                    self.t.spec.lease_duration_s as i64 * 1_000_000_000,
                )?;
            if !ours {
                report.loads.push(LoadOutcome {
                    start: format_rfc3339(w.start_us),
                    end: format_rfc3339(w.end_us),
                    table: spec.table.clone(),
                    status: "failed",
                    rows: 0,
                    replaced_rows: 0,
                    duration_ms: 0,
                    error: Some(format!(
                        "not loaded: {}; the next `highwater ingest {}` loads it",
                        self.lost_to(store, fence),
                        self.t.spec.name
                    )),
                });
                break;
            }
            let t0 = Instant::now();
            let result = (|| -> Result<Loaded, String> {
                let wf = self.format.window_files(&w, &r)?;
                let target = Target { spec, url: &url };
                self.load_files(&r, wf.from, &wf.files, wf.rows, &target, &mut loader)
            })();
            let ms = t0.elapsed().as_millis() as u64;
            let mut outcome = LoadOutcome {
                start: format_rfc3339(w.start_us),
                end: format_rfc3339(w.end_us),
                table: spec.table.clone(),
                status: "loaded",
                rows: 0,
                replaced_rows: 0,
                duration_ms: ms,
                error: None,
            };
            match &result {
                Ok(l) => {
                    outcome.rows = l.rows;
                    outcome.replaced_rows = l.replaced_rows;
                    r.extra["load"] = json!({
                        "status": "loaded", "token": r.token, "table": spec.table,
                        "rows": l.rows, "at_ns": now_ns(), "duration_ms": ms,
                    });
                }
                Err(e) => {
                    outcome.status = "failed";
                    outcome.error = Some(format!("{e}; the next `highwater ingest {}` loads it again from the published files", self.t.spec.name));
                    r.extra["load"] = json!({
                        "status": "failed", "token": r.token, "table": spec.table,
                        "at_ns": now_ns(), "error": e,
                    });
                }
            }
            let fenced = store
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .commit_window(&r, None, fence)?
                == WindowCommit::Fenced;
            if fenced {
                outcome.status = "failed";
                outcome.error = Some(format!(
                    "{}: {} before the load was recorded; the next `highwater ingest {}` loads the window again",
                    if result.is_ok() { "loaded" } else { "not loaded" },
                    self.lost_to(store, fence),
                    self.t.spec.name
                ));
                report.loads.push(outcome);
                break;
            }
            report.loads.push(outcome);
        }
        Ok(())
    }
}
