//! The landed windows of `[sources]` as file stages read them (issue 49):
//! `highwater_files::inputs::windows::Landed` over `highwater-ingest`'s
//! public `landed` API. Here, and only here, the two crates meet: the file
//! stages name no ingestion type, and ingestion knows no stage.

use highwater_files::inputs::windows::{Landed, LandedGrid, LandedWindow, WindowState};
use highwater_ingest::landed::{DataFile, Standing};
use highwater_ingest::{Ingestor, SourceSpec};
use highwater_objects::{Objects, StorageSpec};
use highwater_store::{StateLocation, StateStore, WindowRecord};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The sources of one config, each opened on first use.
pub struct IngestLanded {
    config: PathBuf,
    root: PathBuf,
    state: StateLocation,
    sources: BTreeMap<String, toml::Value>,
    storage: BTreeMap<String, StorageSpec>,
    open: Mutex<BTreeMap<String, Arc<Ingestor>>>,
    /// Each source's window heads as the last plan read them, by start:
    /// an item whose window was landed again since its plan (another
    /// token) fails and runs at the next run, never on other rows than
    /// planned.
    planned: Mutex<BTreeMap<String, Arc<Vec<WindowRecord>>>>,
    /// Each source's whole records, read once at the first item that asks
    /// for its files (a plan reads only the records' heads).
    records: Mutex<BTreeMap<String, Arc<BTreeMap<i64, WindowRecord>>>>,
}

impl IngestLanded {
    /// Over the `[sources]` of `spec`, read from `config`, whose state is
    /// where the pipeline's is.
    pub fn new(spec: &highwater_files::PipelineSpec, config: &Path, root: &Path) -> IngestLanded {
        let state = match &spec.state_url_env {
            Some(var) => StateLocation::Postgres { var: var.clone() },
            None => StateLocation::Sqlite(if spec.state.is_absolute() {
                spec.state.clone()
            } else {
                root.join(&spec.state)
            }),
        };
        IngestLanded {
            config: config.to_path_buf(),
            root: root.to_path_buf(),
            state,
            sources: spec.sources.clone(),
            storage: spec.storage.clone(),
            open: Mutex::new(BTreeMap::new()),
            planned: Mutex::new(BTreeMap::new()),
            records: Mutex::new(BTreeMap::new()),
        }
    }

    fn ingestor(&self, name: &str) -> Result<Arc<Ingestor>, String> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = open.get(name) {
            return Ok(i.clone());
        }
        let Some(value) = self.sources.get(name) else {
            return Err(format!(
                "the config has no [sources.{name}]{}",
                if self.sources.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (defined: {})",
                        self.sources.keys().cloned().collect::<Vec<_>>().join(", ")
                    )
                }
            ));
        };
        let spec =
            SourceSpec::parse(name, value, &self.config, &self.root).map_err(|e| e.to_string())?;
        let place = spec.output_place.clone();
        let mut ing = Ingestor::new(&self.root, self.state.clone(), spec);
        if let Some(p) = place {
            let storage = self.storage.get(&p).ok_or_else(|| {
                format!(
                    "[sources.{name}] output names storage `{p}`, which the config does not define"
                )
            })?;
            ing = ing.with_objects(Arc::new(
                Objects::open(&p, storage).map_err(|e| e.to_string())?,
            ));
        }
        let ing = Arc::new(ing);
        open.insert(name.to_string(), ing.clone());
        Ok(ing)
    }
}

impl Landed for IngestLanded {
    fn grid(&self, source: &str) -> Result<LandedGrid, String> {
        let ing = self.ingestor(source)?;
        let (start_us, interval_us) = ing.grid_start_interval();
        Ok(LandedGrid {
            start_us,
            interval_us,
            root: ing.local_output_root(),
        })
    }

    fn windows(&self, source: &str, store: &dyn StateStore) -> Result<Vec<LandedWindow>, String> {
        let ing = self.ingestor(source)?;
        let heads = ing.window_heads(store).map_err(|e| e.to_string())?;
        let landed = ing.landed_windows(&heads);
        self.planned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(source.to_string(), Arc::new(heads));
        Ok(landed
            .into_iter()
            .map(|w| LandedWindow {
                start_us: w.start_us,
                end_us: w.end_us,
                state: match w.standing {
                    Standing::Ready { digest } => WindowState::Ready { digest },
                    Standing::NotReady(why) => WindowState::NotReady(why),
                },
            })
            .collect())
    }

    fn gone(&self, source: &str, starts: &[i64]) -> Result<Vec<(i64, String)>, String> {
        let ing = self.ingestor(source)?;
        let Some(heads) = self
            .planned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(source)
            .cloned()
        else {
            return Err(format!("source `{source}`'s windows were not read yet"));
        };
        let records: Vec<&WindowRecord> = starts.iter().filter_map(|&s| head(&heads, s)).collect();
        Ok(ing
            .windows_without_files(&records)
            .into_iter()
            .map(|i| (records[i].start_us, "gone from the output".to_string()))
            .collect())
    }

    fn files(&self, source: &str, start_us: i64, end_us: i64) -> Result<Vec<String>, String> {
        let ing = self.ingestor(source)?;
        let planned = self
            .planned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(source)
            .and_then(|p| head(p, start_us).map(|r| r.token.clone()));
        let cached = self
            .records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(source)
            .cloned();
        // The records as read at this run's first item; read again when
        // the plan is newer than them (a later stage planned after a
        // re-land), never to stand in for what the plan saw.
        let stale = |records: &BTreeMap<i64, WindowRecord>| {
            planned
                .as_ref()
                .is_some_and(|t| records.get(&start_us).is_some_and(|r| &r.token != t))
        };
        let records = match cached {
            Some(r) if !stale(&r) => r,
            _ => {
                let all = ing.window_records().map_err(|e| e.to_string())?;
                let r: Arc<BTreeMap<i64, WindowRecord>> =
                    Arc::new(all.into_iter().map(|r| (r.start_us, r)).collect());
                self.records
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(source.to_string(), Arc::clone(&r));
                r
            }
        };
        let r = records
            .get(&start_us)
            .filter(|r| r.end_us == end_us)
            .ok_or_else(|| {
                format!(
                    "source `{source}` has no record of window {}",
                    highwater_core::window::format_rfc3339(start_us)
                )
            })?;
        if stale(&records) {
            return Err(format!(
                "window {} of source `{source}` was landed again since this run planned it; \
                 it runs at the next run, on the rows landed then",
                highwater_core::window::format_rfc3339(start_us)
            ));
        }
        ing.window_data_files(r)?
            .into_iter()
            .map(|f| match f {
                DataFile::Local(p) => Ok(p.to_string_lossy().into_owned()),
                // A command reads an object by its URL (pyarrow, DuckDB,
                // Polars and the AWS CLI all take `s3://BUCKET/KEY`).
                DataFile::Object { place, key } => self
                    .storage
                    .get(&place)
                    .map(|s| format!("s3://{}/{key}", s.bucket))
                    .ok_or_else(|| format!("storage `{place}` is not defined")),
            })
            .collect()
    }
}

/// The head of the window starting at `start_us` among `heads` (by start).
fn head(heads: &[WindowRecord], start_us: i64) -> Option<&WindowRecord> {
    heads
        .binary_search_by_key(&start_us, |r| r.start_us)
        .ok()
        .map(|i| &heads[i])
}
