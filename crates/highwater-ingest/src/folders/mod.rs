//! Parquet window folders: each window a folder of its own under the
//! `output` template, holding its files and a `_manifest.json` that names
//! them and the attempt (token) they are of. Locally a window is staged
//! beside its folder and swapped in by one rename ([`crate::publish`]); in
//! a bucket, which has no rename, its files go under a version prefix and
//! the manifest is put conditionally ([`bucket`]). A compacted period is a
//! folder of its own holding its windows' rows ([`periods`]).

mod bucket;
mod periods;

use crate::config::Policy;
use crate::error::IngestError;
use crate::format::{LoadFrom, Rows};
use crate::format::{OnDisk, StagedWindow, TableFormat, WindowFiles};
use crate::periods::PeriodOutcome;
use crate::publish;
use crate::sink::{Column, Extras};
use crate::table::{Held, Table};
use highwater_core::window::Window;
use highwater_store::{WindowRecord, WindowStatus};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Windows as Parquet folders.
pub(crate) struct Folders {
    t: Arc<Table>,
}

impl Folders {
    pub(crate) fn new(t: Arc<Table>) -> Folders {
        Folders { t }
    }

    /// Whether published window `r` is still on disk where its record says:
    /// its folder's `_manifest.json`, or its compacted period's manifest
    /// listing it. A folder deleted out of band is caught here, so that
    /// `windows` does not show it as published and `ingest` lands it again.
    /// Windows in object storage are not checked (that would be a request
    /// per window); `compact` checks every window it reads.
    fn has_window_folder(
        &self,
        r: &WindowRecord,
        periods: &mut BTreeMap<String, Option<crate::compact::PeriodManifest>>,
    ) -> bool {
        if self.t.spec.output_place.is_some() {
            return true;
        }
        let safe = |p: &str| {
            Path::new(p)
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
        };
        if let Some(period) = r.extra["compacted"]["path"].as_str().filter(|p| safe(p)) {
            let m = periods
                .entry(period.to_string())
                .or_insert_with(|| crate::compact::read_manifest(&self.t.root.join(period)));
            return m
                .as_ref()
                .is_some_and(|m| m.windows.iter().any(|w| w.start_us == r.start_us));
        }
        let rel = match r.extra["path"].as_str().filter(|p| safe(p)) {
            Some(p) => p.to_string(),
            None => {
                self.t
                    .window_path(&Window {
                        start_us: r.start_us,
                        end_us: r.end_us,
                    })
                    .0
            }
        };
        self.t.root.join(rel).join("_manifest.json").is_file()
    }

    /// The schema rule for window folders (issue 21), before any window
    /// runs: the source's columns against the newest published window's.
    /// An added column or a widened type goes on (each window's check
    /// warns of it; a compaction fills and widens the older files); a
    /// dropped column or a type that does not widen is refused, so that
    /// nothing lands in a schema no reader can read beside the others.
    /// `[checks] schema = "warn"` (or `"off"`) publishes it anyway.
    fn folder_schema_rule(
        &self,
        columns: &[crate::sink::Column],
        records: &BTreeMap<i64, WindowRecord>,
    ) -> Result<(), IngestError> {
        if self.t.spec.checks.schema != Policy::Fail {
            return Ok(());
        }
        let Some(newest) = records
            .values()
            .rev()
            .find(|r| r.status == WindowStatus::Published && r.extra["schema"].is_array())
        else {
            return Ok(());
        };
        let now = crate::sink::schema_json(columns);
        let (changes, widening) = crate::sink::schema_changes(&newest.extra["schema"], &now);
        if changes.is_empty() || widening {
            return Ok(());
        }
        let nw = Window {
            start_us: newest.start_us,
            end_us: newest.end_us,
        };
        Err(IngestError::Schema {
            name: self.t.spec.name.clone(),
            message: format!(
                "the source's schema does not match the newest published window {nw}: {}. Nothing was landed. If the source changed on purpose: cast the column back in a `query` (e.g. `SELECT ..., amount::int4 AS amount`), or land the new schema under a new source name and output, or set `[sources.{}.checks] schema = \"warn\"` to publish it as it is",
                changes.join("; "),
                self.t.spec.name
            ),
        })
    }
}

impl TableFormat for Folders {
    fn extras(&self, _w: &Window) -> Extras {
        Extras::default()
    }

    fn columns(
        &self,
        columns: Vec<Column>,
        records: &BTreeMap<i64, WindowRecord>,
        _warnings: &mut Vec<String>,
    ) -> Result<Vec<Column>, IngestError> {
        self.folder_schema_rule(&columns, records)?;
        Ok(columns)
    }

    fn neighbour_schema_check(&self) -> bool {
        true
    }

    fn refuse_windows(&self, _ks: &[i64]) -> Result<(), IngestError> {
        Ok(())
    }

    fn window_folders(&self) -> bool {
        true
    }

    fn remove_old_window(&self, old: &str, label: &str) -> Result<(), IngestError> {
        if let Some(place) = &self.t.spec.output_place {
            if let Some(key) = old.strip_prefix(&format!("{place}:")) {
                self.remove_objects(key, label)?;
            }
            return Ok(());
        }
        // Our own rendering, relative and without `..`; checked anyway,
        // since it was read back from the state store.
        let safe = Path::new(old)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        let abs = self.t.root.join(old);
        if safe && abs.is_dir() {
            std::fs::remove_dir_all(&abs)
                .map_err(|e| IngestError::io("removing the old window", &abs, e))?;
        }
        Ok(())
    }

    fn has_window(
        &self,
        r: &WindowRecord,
        periods: &mut BTreeMap<String, Option<crate::compact::PeriodManifest>>,
    ) -> bool {
        self.has_window_folder(r, periods)
    }

    fn on_disk(&self, w: &Window, abs: &Path) -> Result<Option<OnDisk>, IngestError> {
        // Inside a compacted period, the period's manifest says which
        // attempt of the window it holds.
        let in_period = self.compacted_window(self.t.spec.grid.index_of(w.start_us));
        let published = self.published_manifest(w, abs)?;
        let token = published
            .as_ref()
            .and_then(|m| m["token"].as_str().map(str::to_string))
            .or_else(|| in_period.as_ref().map(|(pw, _)| pw.token.clone()));
        let Some(token) = token else {
            return Ok(None);
        };
        Ok(Some(match in_period {
            Some((pw, info)) => OnDisk {
                token,
                // A period's manifest does not keep its windows' recipes.
                recipe: None,
                recipe_parts: Value::Null,
                rows: Some(pw.rows as i64),
                files: json!([]),
                digest: json!(pw.digest),
                compacted: Some(info),
            },
            None => {
                let m = published.unwrap_or(Value::Null);
                OnDisk {
                    token,
                    recipe: m["recipe"].as_str().map(str::to_string),
                    recipe_parts: m["recipe_parts"].clone(),
                    rows: m["rows"].as_i64(),
                    files: m["files"].clone(),
                    digest: m["digest"].clone(),
                    compacted: None,
                }
            }
        }))
    }

    fn window_rows_dir(&self, w: &Window) -> Result<Option<PathBuf>, IngestError> {
        Ok(Some(self.t.window_path(w).1))
    }

    fn publish_group(&self, _k: i64) -> Result<Option<i64>, IngestError> {
        Ok(None)
    }

    fn publish(
        &self,
        ws: &[StagedWindow<'_>],
        _columns: &[Column],
    ) -> Result<Vec<Option<Value>>, IngestError> {
        let mut out = Vec::with_capacity(ws.len());
        for s in ws {
            publish::seal(s.staging, s.manifest)?;
            out.push(self.publish_window(s.k, s.staging, s.abs, s.token)?);
        }
        Ok(out)
    }

    fn reconcile(&self, held: &Held<'_>) -> Result<(), IngestError> {
        self.reconcile_periods(held)
    }

    fn after_run(&self) -> Result<(), IngestError> {
        Ok(())
    }

    fn period_path(&self, p: i64) -> Result<(String, PathBuf), IngestError> {
        self.folder_period_path(p)
    }

    fn compact_period(
        &self,
        p: i64,
        records: &BTreeMap<i64, WindowRecord>,
        _horizon_us: i64,
        held: &Held<'_>,
    ) -> Result<PeriodOutcome, IngestError> {
        self.compact_folder_period(p, records, held)
    }

    fn window_files(&self, w: &Window, r: &WindowRecord) -> Result<WindowFiles, String> {
        if self.t.spec.output_place.is_none() {
            if let Some(period) = r.extra["compacted"]["path"].as_str() {
                return self.period_files(w, r, period);
            }
        }
        let (from, m) = if self.t.spec.output_place.is_some() {
            let (m, prefix) = self
                .bucket_window_for_load(w)
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("window {w} has no _manifest.json in the bucket; `highwater ingest {}` lands the window again", self.t.spec.name))?;
            (LoadFrom::Bucket(prefix), m)
        } else {
            let rel = r.extra["path"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| self.t.window_path(w).0);
            if !Path::new(&rel)
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
            {
                return Err(format!("the record's path `{rel}` is not a relative path"));
            }
            let dir = self.t.root.join(&rel);
            let m: Value = std::fs::read(dir.join("_manifest.json"))
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
                .map_err(|e| format!("reading {}/_manifest.json: {e}; `highwater ingest {}` lands the window again", dir.display(), self.t.spec.name))?;
            (LoadFrom::Local(dir), m)
        };
        let place = match &from {
            LoadFrom::Local(d) => d.display().to_string(),
            LoadFrom::Bucket(prefix) => format!(
                "{}:{prefix}",
                self.t.spec.output_place.as_deref().unwrap_or_default()
            ),
        };
        if m["token"] != r.token.as_str() {
            return Err(format!("the manifest of {place} is of another attempt than the record; the next `highwater ingest {}` settles it", self.t.spec.name));
        }
        let files: Vec<String> = m["files"]
            .as_array()
            .map(|fs| {
                fs.iter()
                    .filter_map(|f| f["path"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        if files.iter().any(|f| f.contains('/') || f.starts_with('.')) {
            return Err(format!(
                "the manifest of {place} lists a file outside the window's folder"
            ));
        }
        Ok(WindowFiles {
            from,
            files,
            rows: Rows::Manifest(m["rows"].as_u64().unwrap_or(0)),
        })
    }
}

impl Folders {
    /// The files of the compacted period (`path`, relative) that holds
    /// window `w` (record `r`): the period's files hold its other windows'
    /// rows too, the window's at its offset (issue 49: `{files}`).
    fn period_files(
        &self,
        w: &Window,
        r: &WindowRecord,
        path: &str,
    ) -> Result<WindowFiles, String> {
        if !Path::new(path)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
        {
            return Err(format!(
                "the record's period path `{path}` is not a relative path"
            ));
        }
        let dir = self.t.root.join(path);
        let m = crate::compact::read_manifest(&dir).ok_or_else(|| {
            format!(
                "{}/_manifest.json is not a compacted period's manifest; `highwater ingest {}` lands window {w} again",
                dir.display(),
                self.t.spec.name
            )
        })?;
        if r.extra["compacted"]["token"].as_str() != Some(m.token.as_str()) {
            return Err(format!("the period {} is of another compaction than window {w}'s record; the next `highwater ingest {}` or `compact` settles it", dir.display(), self.t.spec.name));
        }
        let rows = m
            .windows
            .iter()
            .find(|pw| pw.start_us == w.start_us)
            .map(|pw| pw.rows)
            .ok_or_else(|| format!("the period {} does not hold window {w}", dir.display()))?;
        let files: Vec<String> = m.files.into_iter().map(|f| f.path).collect();
        if files.iter().any(|f| f.contains('/') || f.starts_with('.')) {
            return Err(format!(
                "the manifest of {} lists a file outside the period's folder",
                dir.display()
            ));
        }
        Ok(WindowFiles {
            from: LoadFrom::Local(dir),
            files,
            rows: Rows::Manifest(rows),
        })
    }
}
