//! `format = "delta"`: a source's windows as commits of one Delta Lake
//! table, written by highwater itself beside any other engine that
//! maintains the same table (issue 46): the log is newline-delimited JSON
//! actions, and what a window needs of it is small (see `bench/README.md`
//! and ARCHITECTURE.md for why not `deltalake-core` or `delta_kernel`).
//!
//! Layout:
//! - [`log`]: which log files a reader replays (checkpoints first);
//! - [`protocol`]: whether highwater may write the table, and its duties;
//! - [`rewrite`]: a window's rows taken out of the files that hold them;
//! - [`stats`]: per-file statistics from the Parquet footer;
//! - [`schema`], [`checkpoint`], [`compact`]: the schema rule, classic
//!   checkpoints, `highwater compact`.
//!
//! Layout of a table at `output` (local, or `NAME:prefix` in object storage):
//! - `_delta_log/NNNNNNNNNNNNNNNNNNNN.json`: one commit per window (and
//!   other engines' commits and checkpoints);
//! - `data/START/TOKEN/part-*.parquet`: the files of one attempt of the
//!   window starting at START (compact UTC), never rewritten, and the
//!   files a re-land of it rewrote without its rows (`part-rewrite-*`);
//! - `data/PSTART/TOKEN/part-*.parquet`: a period compacted by
//!   `highwater compact` (see [`compact`]), its adds `dataChange = false`.
//!
//! Every row carries its window start in [`WINDOW_COLUMN`]. A window's
//! commit holds `add` actions for its files (with statistics), `remove`
//! actions for every file that held its rows (and `add`s for those written
//! back without them), a `txn` action (app id = the source, version = the
//! window's index), and `commitInfo` naming the window, the recipe and the
//! attempt's token, with the window's manifest (rows, files, digest,
//! schema). The first commit of a new table adds `protocol` (1, 2) and
//! `metaData`; a commit whose source gained a column adds a new
//! `metaData` (older files read the column as null).
//!
//! Commits are put-if-absent: locally a hard link of a fsynced temporary
//! file (`link` fails if the name exists), in object storage the
//! conditional put (`If-None-Match: *`). A commit that loses the race reads
//! the commits that won and makes its actions again from the newer
//! snapshot; one that finds its own token already in the log (a retry
//! whose first put did land) is done. The window is recorded, and the
//! bookmark moved, only after the put.
//!
//! Files a commit removed stay for `version_retention_s` (a reader may be
//! reading the version before); `vacuum` deletes them after that, and files
//! no commit ever added (a run killed before its commit) once they are as
//! old and at least [`UNCOMMITTED_GRACE_S`] old (another writer may be
//! about to commit them).

pub mod checkpoint;
pub mod compact;
pub mod log;
pub mod protocol;
pub mod rewrite;
pub mod schema;
pub mod stats;

use crate::error::IngestError;
use crate::failpoints::kill_self;
use crate::format::{OnDisk, StagedWindow, TableFormat, WindowFiles};
use crate::periods::PeriodOutcome;
use crate::sink::{Column, Extras};
use crate::table::Held;
use crate::table::Table;
use highwater_core::window::{format_compact, format_rfc3339, Window};
use highwater_objects::Put;
use highwater_store::lease::now_ns;
use highwater_store::WindowRecord;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The column every file highwater writes into a Delta table carries: the
/// start of the window its rows were landed in (timestamp, UTC). Rows
/// keep it through another engine's OPTIMIZE, DELETE or UPDATE, so a
/// re-land finds them wherever they live ([`rewrite`]); a foreign row has
/// none. The same name as the warehouse load's column
/// ([`crate::load::WINDOW_COLUMN`]), for the same purpose.
pub const WINDOW_COLUMN: &str = crate::load::WINDOW_COLUMN;

/// Attempts of one window's commit against other writers of the table.
pub const COMMIT_ATTEMPTS_MAX: usize = 64;

/// Files that no commit names are deleted only once this old, whatever
/// `version_retention_s` says: another process may have placed them and
/// not committed yet (its window is still running).
pub const UNCOMMITTED_GRACE_S: i64 = 86_400;

/// Windows as commits of one Delta Lake table (`format = "delta"`).
pub(crate) struct Delta {
    t: Arc<Table>,
    /// The table's log as read so far (commits are only ever appended, so
    /// a refresh reads the new ones; a checkpoint past it reads afresh).
    snapshot: Mutex<Snapshot>,
}

impl Delta {
    pub(crate) fn new(t: Arc<Table>) -> Delta {
        Delta {
            t,
            snapshot: Mutex::default(),
        }
    }
}

/// The table's state after replaying its log, as far as highwater reads it.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The newest version read; -1 before the first commit.
    pub version: i64,
    /// The newest `protocol` action.
    pub protocol: Option<Value>,
    pub metadata: Option<Value>,
    pub fields: Option<Vec<schema::Field>>,
    /// Active files: path → its `add` action.
    pub files: BTreeMap<String, Value>,
    /// The newest `txn` action of each app id.
    pub txns: BTreeMap<String, Value>,
    /// Removed files: path → deletion time (ms).
    pub tombstones: BTreeMap<String, i64>,
    /// The newest commit of each window (by start, µs): its version and
    /// `commitInfo.highwater`.
    pub windows: BTreeMap<i64, (i64, Value)>,
    /// Whether `version` has been read at all (a fresh snapshot reads from 0).
    loaded: bool,
}

impl Snapshot {
    fn apply(&mut self, version: i64, text: &[u8]) -> Result<(), String> {
        for (i, line) in text.split(|b| *b == b'\n').enumerate() {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let a: Value = serde_json::from_slice(line)
                .map_err(|e| format!("commit {version}, line {}: {e}", i + 1))?;
            self.apply_action(version, &a);
        }
        self.version = version;
        Ok(())
    }

    /// Only the `commitInfo` of commit `version` (one a checkpoint
    /// already holds the rest of); an unreadable line is passed over.
    fn apply_commit_info(&mut self, version: i64, text: &[u8]) {
        for line in text.split(|b| *b == b'\n') {
            if let Ok(a) = serde_json::from_slice::<Value>(line) {
                if a.get("commitInfo").is_some() {
                    self.apply_action(version, &a);
                }
            }
        }
    }

    /// One action of version `version` (from a commit or a checkpoint).
    fn apply_action(&mut self, version: i64, a: &Value) {
        if let Some(add) = a.get("add") {
            let p = add["path"].as_str().unwrap_or_default().to_string();
            self.tombstones.remove(&p);
            self.files.insert(p, add.clone());
        } else if let Some(rm) = a.get("remove") {
            let p = rm["path"].as_str().unwrap_or_default().to_string();
            self.files.remove(&p);
            self.tombstones
                .insert(p, rm["deletionTimestamp"].as_i64().unwrap_or(0));
        } else if let Some(p) = a.get("protocol") {
            self.protocol = Some(p.clone());
        } else if let Some(md) = a.get("metaData") {
            self.fields = md["schemaString"]
                .as_str()
                .and_then(schema::parse_schema_string);
            self.metadata = Some(md.clone());
        } else if let Some(t) = a.get("txn") {
            let app = t["appId"].as_str().unwrap_or_default().to_string();
            self.txns.insert(app, t.clone());
        } else if let Some(ci) = a.get("commitInfo") {
            // One window's commit, or the windows of a publish group (a
            // compacted period re-landed) in one commit (`highwater.group`).
            let hw = &ci["highwater"];
            let one = std::slice::from_ref(hw);
            for m in hw["group"].as_array().map_or(one, Vec::as_slice) {
                if let Some(start) = m["window_start_us"].as_i64() {
                    self.windows.insert(start, (version, m.clone()));
                }
            }
        }
    }

    /// What the table's protocol and metadata ask of highwater as a
    /// writer, or why it may not write (see [`protocol`]).
    pub fn duties(&self) -> Result<protocol::Duties, Vec<String>> {
        match &self.protocol {
            Some(p) => protocol::check(p, self.metadata.as_ref()),
            None => Ok(protocol::Duties::default()),
        }
    }
}

/// Where the table is.
enum Place<'a> {
    Local(PathBuf),
    Objects(&'a highwater_objects::Objects, String),
}

fn log_name(v: i64) -> String {
    format!("_delta_log/{v:020}.json")
}

impl Delta {
    fn place(&self) -> Place<'_> {
        let out = self.t.spec.output.trim_end_matches('/').to_string();
        match &self.t.objects {
            Some(o) if self.t.spec.output_place.is_some() => Place::Objects(o, out),
            _ => Place::Local(self.t.root.join(out)),
        }
    }

    fn delta_err(&self, window: &str, message: impl std::fmt::Display) -> IngestError {
        IngestError::Storage {
            name: self.t.spec.name.clone(),
            window: window.to_string(),
            message: format!("Delta table `{}`: {message}", self.t.spec.output),
        }
    }

    /// Reads commit `v`, if it exists.
    fn read_commit(&self, v: i64) -> Result<Option<Vec<u8>>, IngestError> {
        Ok(self.read_table_file(&log_name(v))?.map(|b| b.to_vec()))
    }

    /// Reads the file at `rel` (a path relative to the table root, already
    /// checked), if it exists.
    fn read_table_file(&self, rel: &str) -> Result<Option<bytes::Bytes>, IngestError> {
        match self.place() {
            Place::Local(root) => {
                let p = root.join(rel);
                match std::fs::read(&p) {
                    Ok(b) => Ok(Some(b.into())),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(IngestError::io("reading", p, e)),
                }
            }
            Place::Objects(o, prefix) => o
                .get(&format!("{prefix}/{rel}"))
                .map(|g| g.map(|(b, _)| b))
                .map_err(|e| self.delta_err("-", e)),
        }
    }

    /// The names in `_delta_log`.
    fn list_log(&self) -> Result<Vec<String>, IngestError> {
        match self.place() {
            Place::Local(root) => {
                let dir = root.join("_delta_log");
                let rd = match std::fs::read_dir(&dir) {
                    Ok(rd) => rd,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                    Err(e) => return Err(IngestError::io("listing", dir, e)),
                };
                let mut out = Vec::new();
                for e in rd {
                    let e = e.map_err(|e| IngestError::io("listing", &dir, e))?;
                    out.push(e.file_name().to_string_lossy().into_owned());
                }
                Ok(out)
            }
            Place::Objects(o, prefix) => Ok(o
                .list(&format!("{prefix}/_delta_log"))
                .map_err(|e| self.delta_err("-", e))?
                .into_iter()
                .filter_map(|i| i.key.rsplit('/').next().map(str::to_string))
                .collect()),
        }
    }

    /// The table read from scratch, as a reader does: the newest complete
    /// checkpoint, then the commits after it (see [`log`]).
    fn delta_load(&self) -> Result<Snapshot, IngestError> {
        let names = self.list_log()?;
        let start = log::start(&names)
            .map_err(|m| self.delta_err("-", format!("the log cannot be read: {m}")))?;
        let mut s = Snapshot {
            version: start.first_commit - 1,
            loaded: true,
            ..Default::default()
        };
        if let Some((v, parts)) = start.checkpoint {
            for part in parts {
                let rel = format!("_delta_log/{part}");
                let bytes = self.read_table_file(&rel)?.ok_or_else(|| {
                    self.delta_err(
                        "-",
                        format!("checkpoint `{rel}` went away while it was read; run again"),
                    )
                })?;
                let actions = log::checkpoint_actions(bytes)
                    .map_err(|m| self.delta_err("-", format!("checkpoint `{rel}`: {m}")))?;
                for a in &actions {
                    s.apply_action(v, a);
                }
            }
            // A checkpoint keeps no `commitInfo`: the windows' commits are
            // read from the commits still in the log before it (all of
            // them until another engine's log cleanup deletes the oldest).
            let kept = names.iter().filter_map(|n| match log::parse_name(n) {
                log::LogFile::Commit(c) if c <= v => Some(c),
                _ => None,
            });
            for c in kept.collect::<std::collections::BTreeSet<_>>() {
                if let Some(text) = self.read_commit(c)? {
                    s.apply_commit_info(c, &text);
                }
            }
        }
        Ok(s)
    }

    /// Whether another writer checkpointed the table past `version` (and
    /// may have deleted the commits after it that this process has not
    /// read): then the snapshot is read again from scratch.
    fn checkpointed_past(&self, version: i64) -> Result<bool, IngestError> {
        let Some(b) = self.read_table_file("_delta_log/_last_checkpoint")? else {
            return Ok(false);
        };
        // A hint only (PROTOCOL.md): unreadable, it says nothing.
        let v = serde_json::from_slice::<Value>(&b)
            .ok()
            .and_then(|h| h["version"].as_i64());
        Ok(v.is_some_and(|v| v > version))
    }

    /// Puts commit `v` only if no commit `v` exists: whether it did.
    fn put_commit(&self, v: i64, body: &[u8], token: &str) -> Result<bool, IngestError> {
        match self.place() {
            Place::Local(root) => {
                let dir = root.join("_delta_log");
                std::fs::create_dir_all(&dir).map_err(|e| IngestError::io("creating", &dir, e))?;
                let tmp = dir.join(format!(".{v:020}.json.{token}.tmp"));
                let fin = root.join(log_name(v));
                let written = std::fs::write(&tmp, body)
                    .and_then(|_| std::fs::File::open(&tmp)?.sync_all())
                    .map_err(|e| IngestError::io("writing", &tmp, e));
                if let Err(e) = written {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(e);
                }
                // A hard link fails if the name exists: put-if-absent, and
                // the commit appears whole (it was fsynced under its
                // temporary name first).
                let linked = std::fs::hard_link(&tmp, &fin);
                let _ = std::fs::remove_file(&tmp);
                match linked {
                    Ok(()) => {
                        std::fs::File::open(&dir)
                            .and_then(|d| d.sync_all())
                            .map_err(|e| IngestError::io("syncing", &dir, e))?;
                        Ok(true)
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
                    Err(e) => Err(IngestError::io("committing", fin, e)),
                }
            }
            Place::Objects(o, prefix) => {
                match o
                    .put_if(&format!("{prefix}/{}", log_name(v)), body.to_vec(), None)
                    .map_err(|e| self.delta_err("-", e))?
                {
                    Put::Done(_) => Ok(true),
                    Put::Lost => Ok(false),
                }
            }
        }
    }

    /// The snapshot, brought up to the table's newest commit.
    pub(crate) fn delta_snapshot(
        &self,
    ) -> Result<std::sync::MutexGuard<'_, Snapshot>, IngestError> {
        let mut s = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
        if !s.loaded || self.checkpointed_past(s.version)? {
            *s = self.delta_load()?;
        }
        loop {
            let v = s.version + 1;
            let Some(text) = self.read_commit(v)? else {
                break;
            };
            s.apply(v, &text).map_err(|m| self.delta_err("-", m))?;
        }
        Ok(s)
    }

    /// The schema rule, before any window runs: the source's column names,
    /// the table's protocol and features ([`protocol`]), and the source's
    /// columns against the table's schema. Returns the columns as the
    /// table's files are written (the stamp column is the sink's).
    pub(crate) fn delta_columns(
        &self,
        columns: &[Column],
        warnings: &mut Vec<String>,
    ) -> Result<Vec<Column>, IngestError> {
        if let Err(lines) = schema::check_names(columns) {
            return Err(IngestError::Schema {
                name: self.t.spec.name.clone(),
                message: format!(
                    "the source's columns cannot land in Delta table `{}`: {}. Nothing was committed. Rename the columns in the source's `query` (`SELECT ..., x AS other_name`)",
                    self.t.spec.output,
                    lines.join("; ")
                ),
            });
        }
        let snap = self.delta_snapshot()?;
        if let Err(why) = snap.duties() {
            return Err(self.protocol_refusal(&why, snap.version));
        }
        let table = schema::table_columns(columns, snap.fields.as_deref());
        if let Some(fields) = &snap.fields {
            let stamped = schema::stamped(&table);
            if let Err(lines) = schema::evolve(fields, &stamped, self.tolerate_dropped()) {
                return Err(self.schema_refusal(&lines, snap.version));
            }
            let dropped: Vec<&str> = fields
                .iter()
                .filter(|f| !stamped.iter().any(|c| c.name == f.name))
                .map(|f| f.name.as_str())
                .collect();
            if !dropped.is_empty() {
                warnings.push(format!(
                    "Delta table `{}` has column(s) {} that the source no longer gives; the new rows read them as null (checks.schema = \"{}\")",
                    self.t.spec.output,
                    dropped.iter().map(|d| format!("`{d}`")).collect::<Vec<_>>().join(", "),
                    if self.t.spec.checks.schema == crate::config::Policy::Warn { "warn" } else { "off" }
                ));
            }
        }
        Ok(table)
    }

    /// Whether a column the source dropped may stay in the table (its new
    /// rows null): `checks.schema` other than `fail`, as for folders.
    fn tolerate_dropped(&self) -> bool {
        self.t.spec.checks.schema != crate::config::Policy::Fail
    }

    /// The refusal of a table whose protocol or features highwater does
    /// not implement as a writer.
    fn protocol_refusal(&self, why: &[String], version: i64) -> IngestError {
        IngestError::Schema {
            name: self.t.spec.name.clone(),
            message: format!(
                "highwater does not write Delta table `{}` (version {version}): {}. Nothing was committed. Land into a table without these features (a new source name and output), or remove them with the engine that added them (the book: docs/src/guides/delta.md, \"Tables other engines also maintain\")",
                self.t.spec.output,
                why.join("; ")
            ),
        }
    }

    fn schema_refusal(&self, lines: &[String], version: i64) -> IngestError {
        IngestError::Schema {
            name: self.t.spec.name.clone(),
            message: format!(
                "the source's columns no longer fit Delta table `{}` (version {version}): {}. Nothing was committed. A Delta table's columns may only be added to (protocol (1, 2) has no type widening): cast the column back to its old type in a `query` (e.g. `SELECT ..., amount::float8 AS amount`), or land the new schema into a new table (a new source name and output)",
                self.t.spec.output,
                lines.join("; ")
            ),
        }
    }

    /// The manifest of window `w`'s newest commit, as `recover` reads a
    /// folder's `_manifest.json`.
    pub(crate) fn delta_window_manifest(&self, w: &Window) -> Result<Option<Value>, IngestError> {
        let snap = self.delta_snapshot()?;
        Ok(snap.windows.get(&w.start_us).map(|(_, m)| m.clone()))
    }

    /// For the warehouse load: where the table is (its root folder, or
    /// its key prefix in the bucket), and the active files that may hold
    /// window `w`'s rows now (paths relative to it; see [`rewrite`]),
    /// whoever wrote them. `Err` when the table's newest commit of the
    /// window is of another attempt than `token` (the run that made it
    /// settles it), or a file lies outside the table.
    pub(crate) fn delta_window_for_load(
        &self,
        w: &Window,
        token: &str,
    ) -> Result<(crate::format::LoadFrom, Vec<String>), IngestError> {
        let snap = self.delta_snapshot()?.clone();
        let label = w.to_string();
        if let Some((_, m)) = snap.windows.get(&w.start_us) {
            if m["token"].as_str() != Some(token) {
                return Err(self.delta_err(&label, format!("the table's newest commit of window {label} is of another attempt than the record; the next `highwater ingest {}` settles it", self.t.spec.name)));
            }
        }
        let taken = rewrite::Taken::new([(w.start_us, format!("{}/", Self::window_dir(w)))]);
        let mut files = Vec::new();
        for (path, add) in &snap.files {
            if rewrite::fate_by_log(path, add, &taken) == rewrite::Fate::Keep {
                continue;
            }
            files.push(rewrite::table_relative(path).ok_or_else(|| {
                self.delta_err(&label, format!("active file `{path}` is not inside the table; the load reads only the table's own files"))
            })?);
        }
        let from = match self.place() {
            Place::Local(root) => crate::format::LoadFrom::Local(root),
            Place::Objects(_, prefix) => crate::format::LoadFrom::Bucket(prefix),
        };
        Ok((from, files))
    }

    /// The folder of window `w`'s attempts, relative to the table root.
    fn window_dir(w: &Window) -> String {
        format!("data/{}", format_compact(w.start_us))
    }

    /// Publishes staged (and checked) windows as one commit: one window,
    /// or the windows of a compacted period a run re-lands together. Each
    /// window's `manifest` is what a Parquet window's `_manifest.json`
    /// holds. The commit adds the windows' files and takes out their
    /// earlier rows wherever they now live ([`rewrite`]); it is made
    /// against the newest snapshot, and made again when another writer
    /// commits first.
    pub(crate) fn delta_publish(
        &self,
        ws: &[StagedWindow<'_>],
        columns: &[Column],
    ) -> Result<(), IngestError> {
        let Some(first) = ws.first() else {
            return Ok(());
        };
        let windows: Vec<Window> = ws.iter().map(|s| self.t.spec.grid.window(s.k)).collect();
        let label = match windows.as_slice() {
            [w] => w.to_string(),
            [a, .., b] => format!("{a} .. {b} ({} windows)", windows.len()),
            [] => unreachable!("at least one window"),
        };
        let dirs: Vec<String> = ws
            .iter()
            .zip(&windows)
            .map(|(s, w)| format!("{}/{}", Self::window_dir(w), s.token))
            .collect();
        let taken = rewrite::Taken::new(
            windows
                .iter()
                .map(|w| (w.start_us, format!("{}/", Self::window_dir(w)))),
        );
        let files: Vec<Vec<crate::sink::FileInfo>> = ws
            .iter()
            .map(|s| serde_json::from_value(s.manifest["files"].clone()).unwrap_or_default())
            .collect();
        // A table highwater may not write: refused before anything is
        // placed.
        {
            let snap = self.delta_snapshot()?;
            match snap.duties() {
                Err(why) => return Err(self.protocol_refusal(&why, snap.version)),
                Ok(d) if d.append_only => {
                    // Refused before the files are placed when the table
                    // may hold the windows' rows already (a re-land would
                    // remove them); the commit loop checks again exactly.
                    let mut held = 0;
                    for (p, a) in &snap.files {
                        held += match rewrite::fate_by_log(p, a, &taken) {
                            rewrite::Fate::Keep => 0,
                            rewrite::Fate::Remove => 1,
                            rewrite::Fate::Read => usize::from(
                                self.delta_count_window_rows(p, a, &taken, &label)?.0 > 0,
                            ),
                        };
                    }
                    if held > 0 {
                        return Err(self.append_only_refusal(&label, held));
                    }
                }
                Ok(_) => {}
            }
        }
        for (i, s) in ws.iter().enumerate() {
            self.delta_place(s.staging, &dirs[i], &files[i], &windows[i].to_string())?;
        }
        if std::env::var_os("HIGHWATER_FAILPOINT").is_some_and(|v| v == "before-commit-put") {
            // For the crash tests: die with the files placed, uncommitted.
            kill_self();
        }
        let now_ms = now_ns() / 1_000_000;
        let starts: Vec<String> = windows.iter().map(|w| format_rfc3339(w.start_us)).collect();
        let infos: Vec<Value> = ws
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let mut info = s.manifest.clone();
                info["window_start_us"] = json!(windows[i].start_us);
                info["window_index"] = json!(s.k);
                info["data"] = json!(dirs[i]);
                info
            })
            .collect();
        let highwater = match infos.as_slice() {
            [one] => one.clone(),
            _ => json!({ "group": infos }),
        };
        let mut params = json!({"mode": "Append", "window": starts[0]});
        if ws.len() > 1 {
            params["windows"] = json!(ws.len());
        }
        let mut decided = rewrite::Decided::new();
        for attempt in 0..COMMIT_ATTEMPTS_MAX {
            let snap = self.delta_snapshot()?.clone();
            if snap
                .windows
                .get(&windows[0].start_us)
                .is_some_and(|(_, m)| m["token"].as_str() == Some(first.token))
            {
                // A retry whose earlier put landed: already committed.
                break;
            }
            let duties = snap
                .duties()
                .map_err(|why| self.protocol_refusal(&why, snap.version))?;
            let out = self.delta_take_out(&snap, &taken, &dirs[0], &label, &mut decided)?;
            if duties.append_only && !out.removed.is_empty() {
                return Err(self.append_only_refusal(&label, out.removed.len()));
            }
            let mut actions: Vec<Value> = vec![json!({"commitInfo": {
                "timestamp": now_ms,
                "operation": "WRITE",
                "operationParameters": params,
                "engineInfo": concat!("highwater/", env!("CARGO_PKG_VERSION")),
                "isBlindAppend": out.removed.is_empty(),
                "highwater": highwater,
            }})];
            actions.extend(self.delta_schema_actions(&snap, columns, first.token, now_ms)?);
            // One `txn` per app id in a commit: the newest window's index.
            actions.push(json!({"txn": {
                "appId": self.t.spec.name,
                "version": ws.iter().map(|s| s.k).max(),
                "lastUpdated": now_ms,
            }}));
            for (path, add) in &out.removed {
                actions.push(remove_action(path, add, now_ms, true));
            }
            for (i, fs) in files.iter().enumerate() {
                let tags = json!({"highwater.window": starts[i]});
                for f in fs {
                    let rel = format!("{}/{}", dirs[i], f.path);
                    actions.push(add_action(&rel, f, now_ms, &tags));
                }
            }
            for (from, f) in &out.added {
                let tags = json!({"highwater.window": starts[0], "highwater.rewritten_from": from});
                actions.push(add_action(&f.path, f, now_ms, &tags));
            }
            let mut body = Vec::new();
            for a in &actions {
                body.extend_from_slice(a.to_string().as_bytes());
                body.push(b'\n');
            }
            let v = snap.version + 1;
            drop(snap);
            if !out.added.is_empty()
                && std::env::var_os("HIGHWATER_FAILPOINT")
                    .is_some_and(|v| v == "delta-after-rewrite")
            {
                // For the crash tests: die with files rewritten (copy on
                // write) and placed, the commit not put.
                kill_self();
            }
            if self.put_commit(v, &body, first.token)? {
                let every = self.t.spec.checkpoint_every_commits as i64;
                if v > 0 && v % every == 0 {
                    self.delta_checkpoint(v, first.token)?;
                }
                break;
            }
            if attempt + 1 == COMMIT_ATTEMPTS_MAX {
                return Err(self.delta_err(
                    &label,
                    format!("{COMMIT_ATTEMPTS_MAX} commits in a row lost to other writers; nothing was committed, and the window runs again"),
                ));
            }
        }
        if let Place::Objects(..) = self.place() {
            for s in ws {
                let _ = std::fs::remove_dir_all(s.staging);
            }
        }
        Ok(())
    }

    /// The refusal of a re-land of window `label` on an append-only table
    /// where `files` files may hold its rows.
    fn append_only_refusal(&self, label: &str, files: usize) -> IngestError {
        IngestError::Schema {
            name: self.t.spec.name.clone(),
            message: format!(
                "Delta table `{}` is append-only (`delta.appendOnly = true`), and {files} of its files may hold rows of window {label}: landing it again would remove them. Nothing was committed. Leave the window out, or land into a table that is not append-only",
                self.t.spec.output,
            ),
        }
    }

    /// The window's files placed where the commit will name them; until
    /// it is put, no reader knows of them.
    fn delta_place(
        &self,
        staging: &Path,
        dir_rel: &str,
        files: &[crate::sink::FileInfo],
        label: &str,
    ) -> Result<(), IngestError> {
        match self.place() {
            Place::Local(root) => {
                let to = root.join(dir_rel);
                let parent = to.parent().expect("a window folder has a parent");
                std::fs::create_dir_all(parent)
                    .map_err(|e| IngestError::io("creating", parent, e))?;
                std::fs::rename(staging, &to).map_err(|e| IngestError::io("placing", &to, e))?;
                std::fs::File::open(parent)
                    .and_then(|d| d.sync_all())
                    .map_err(|e| IngestError::io("syncing", parent, e))?;
            }
            Place::Objects(o, prefix) => {
                for f in files {
                    o.put_file(
                        &staging.join(&f.path),
                        &format!("{prefix}/{dir_rel}/{}", f.path),
                    )
                    .map_err(|e| self.delta_err(label, e))?;
                }
            }
        }
        Ok(())
    }

    /// The `protocol` and `metaData` actions a commit of `columns` needs on
    /// `snap`: both for a new table, a new `metaData` for a column added
    /// at the source, none otherwise.
    fn delta_schema_actions(
        &self,
        snap: &Snapshot,
        columns: &[Column],
        token: &str,
        now_ms: i64,
    ) -> Result<Vec<Value>, IngestError> {
        // `columns` are the table's already (`delta_columns`).
        let table = schema::stamped(columns);
        Ok(match &snap.fields {
            None => {
                let id = blake3::hash(format!("{}:{token}", self.t.spec.name).as_bytes())
                    .to_hex()
                    .to_string();
                vec![
                    json!({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}),
                    json!({"metaData": {
                        "id": format!("{}-{}-{}-{}-{}", &id[0..8], &id[8..12], &id[12..16], &id[16..20], &id[20..32]),
                        "name": self.t.spec.name,
                        "format": {"provider": "parquet", "options": {}},
                        "schemaString": schema::schema_string(&schema::fields_of(&table)),
                        "partitionColumns": [],
                        "configuration": {},
                        "createdTime": now_ms,
                    }}),
                ]
            }
            Some(fields) => match schema::evolve(fields, &table, self.tolerate_dropped()) {
                Ok(None) => Vec::new(),
                Ok(Some(new)) => {
                    // A column added at the source: a new metaData, the
                    // rest of the table's metadata as it is.
                    let mut md = snap.metadata.clone().unwrap_or_default();
                    md["schemaString"] = json!(schema::schema_string(&new));
                    vec![json!({ "metaData": md })]
                }
                Err(lines) => return Err(self.schema_refusal(&lines, snap.version)),
            },
        })
    }

    /// What window `w`'s commit takes out of `snap` ([`rewrite`]): the files
    /// removed, and the files written back without the window's rows
    /// (each with the path it was rewritten from). Files read for an
    /// earlier attempt are in `decided`.
    fn delta_take_out(
        &self,
        snap: &Snapshot,
        taken: &rewrite::Taken,
        dir_rel: &str,
        label: &str,
        decided: &mut rewrite::Decided,
    ) -> Result<TakeOut, IngestError> {
        let mut out = TakeOut::default();
        for (path, add) in &snap.files {
            let fate = match rewrite::fate_by_log(path, add, taken) {
                rewrite::Fate::Keep => None,
                rewrite::Fate::Remove => Some(None),
                rewrite::Fate::Read => match decided.get(path) {
                    Some(d) => d.clone(),
                    None => {
                        let n = decided.len();
                        let d = self.delta_read_out(path, add, taken, dir_rel, label, n)?;
                        decided.insert(path.clone(), d.clone());
                        d
                    }
                },
            };
            match fate {
                None => {}
                Some(written) => {
                    out.removed.push((path.clone(), add.clone()));
                    for f in written.into_iter().flatten() {
                        out.added.push((path.clone(), f));
                    }
                }
            }
        }
        Ok(out)
    }

    /// How many rows of active file `path` (its `add` action `add`) are
    /// taken windows' and how many not, reading only the stamp column; with
    /// the file's path in the table and its bytes. A file without the
    /// stamp column holds no window's rows (foreign rows), unless it is a
    /// period highwater compacted before stamps existed: refused.
    fn delta_count_window_rows(
        &self,
        path: &str,
        add: &Value,
        taken: &rewrite::Taken,
        label: &str,
    ) -> Result<(usize, usize, String, bytes::Bytes), IngestError> {
        use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        let rel = rewrite::table_relative(path).ok_or_else(|| {
            self.delta_err(label, format!("active file `{path}` is not inside the table; highwater reads only the table's own files, so it cannot take window {label}'s rows out of it. Nothing was committed"))
        })?;
        let bytes = self.read_table_file(&rel)?.ok_or_else(|| {
            self.delta_err(label, format!("active file `{rel}` is missing (deleted by a vacuum that did not follow the log?); the table cannot be read as its log says. Nothing was committed"))
        })?;
        let bad = |e: &dyn std::fmt::Display| {
            self.delta_err(
                label,
                format!("reading active file `{rel}`: {e}. Nothing was committed"),
            )
        };
        let builder =
            ParquetRecordBatchReaderBuilder::try_new_with_options(bytes.clone(), foreign_options())
                .map_err(|e| bad(&e))?;
        let Some(idx) = builder
            .schema()
            .fields()
            .iter()
            .position(|f| f.name() == WINDOW_COLUMN)
        else {
            for start in taken.starts() {
                if let Some(e) = self.delta_compacted_refusal_of(add, start, label) {
                    return Err(e);
                }
            }
            return Ok((0, 0, rel, bytes));
        };
        let mask = parquet::arrow::ProjectionMask::roots(builder.parquet_schema(), [idx]);
        let (mut mine, mut others) = (0usize, 0usize);
        for b in builder.with_projection(mask).build().map_err(|e| bad(&e))? {
            let (m, o) = rewrite::count(&b.map_err(|e| bad(&e))?, taken);
            mine += m;
            others += o;
        }
        Ok((mine, others, rel, bytes))
    }

    /// Reads active file `path` for window `w`'s rows: `None` when it has
    /// none (it stays), `Some(None)` when it has only those (removed
    /// whole), `Some(Some(files))` when it has both: its other rows are
    /// written back as `files` (paths relative to the table) under the
    /// window's attempt folder `dir_rel`. Two passes: the stamp column
    /// alone to count, then every column, a batch at a time, so memory
    /// stays bounded whatever the file's size.
    fn delta_read_out(
        &self,
        path: &str,
        add: &Value,
        taken: &rewrite::Taken,
        dir_rel: &str,
        label: &str,
        n: usize,
    ) -> Result<Option<Option<Vec<crate::sink::FileInfo>>>, IngestError> {
        use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        let (mine, others, rel, bytes) = self.delta_count_window_rows(path, add, taken, label)?;
        if mine == 0 {
            return Ok(None);
        }
        if others == 0 {
            return Ok(Some(None));
        }
        let bad = |e: &dyn std::fmt::Display| {
            self.delta_err(
                label,
                format!("reading active file `{rel}`: {e}. Nothing was committed"),
            )
        };
        let builder =
            ParquetRecordBatchReaderBuilder::try_new_with_options(bytes, foreign_options())
                .map_err(|e| bad(&e))?;
        let schema = builder.schema().clone();
        // Never under the window's own folder: a later re-land removes
        // that folder's files whole, and these hold other windows' rows.
        let rw_rel = rewrite_dir(dir_rel);
        let (dir, upload) = match self.place() {
            Place::Local(root) => {
                let d = root.join(&rw_rel);
                std::fs::create_dir_all(&d).map_err(|e| IngestError::io("creating", &d, e))?;
                (d, None)
            }
            Place::Objects(o, prefix) => {
                let s = self
                    .t
                    .root
                    .join(".highwater/objects-staging")
                    .join(&self.t.spec.name)
                    .join(format!("rewrite-{}", taken.starts().next().unwrap_or(0)));
                let _ = std::fs::remove_dir_all(&s);
                std::fs::create_dir_all(&s).map_err(|e| IngestError::io("creating", &s, e))?;
                (s, Some((o, prefix)))
            }
        };
        let mut sink = crate::sink::ParquetSink::with_schema_extras(
            &dir,
            schema,
            self.t.spec.batch_rows,
            self.t.spec.file_rows_max,
            u64::MAX,
            &format!("rewrite-{n:04}-"),
            &[],
            crate::sink::Extras {
                stamp: None,
                stats: true,
            },
        );
        for b in builder.build().map_err(|e| bad(&e))? {
            let rest = rewrite::without(&b.map_err(|e| bad(&e))?, taken).map_err(|e| bad(&e))?;
            if rest.num_rows() > 0 {
                sink.push_batch(rest)?;
            }
        }
        let written = sink.finish()?;
        let mut files = Vec::new();
        for mut f in written.files {
            if let Some((o, prefix)) = &upload {
                o.put_file(&dir.join(&f.path), &format!("{prefix}/{rw_rel}/{}", f.path))
                    .map_err(|e| self.delta_err(label, e))?;
            }
            f.path = format!("{rw_rel}/{}", f.path);
            files.push(f);
        }
        match upload {
            Some(_) => {
                let _ = std::fs::remove_dir_all(&dir);
            }
            None => {
                for d in [Some(dir.as_path()), dir.parent()].into_iter().flatten() {
                    std::fs::File::open(d)
                        .and_then(|f| f.sync_all())
                        .map_err(|e| IngestError::io("syncing", d, e))?;
                }
            }
        }
        Ok(Some(Some(files)))
    }

    /// Writes the checkpoint of version `v` and points `_last_checkpoint`
    /// at it, unless the table has moved past `v` meanwhile (a later
    /// commit's writer checkpoints then). A checkpoint is a cache of the
    /// log: one that fails to write costs readers time, never data.
    fn delta_checkpoint(&self, v: i64, token: &str) -> Result<(), IngestError> {
        let snap = self.delta_snapshot()?.clone();
        if snap.version != v {
            return Ok(());
        }
        let bytes = checkpoint::encode(&snap).map_err(|m| self.delta_err("-", m))?;
        let rows = 2 + snap.txns.len() + snap.files.len() + snap.tombstones.len();
        let last = json!({"version": v, "size": rows}).to_string().into_bytes();
        let cp = format!("_delta_log/{v:020}.checkpoint.parquet");
        match self.place() {
            Place::Local(root) => {
                for (name, body) in [
                    (cp.as_str(), &bytes),
                    ("_delta_log/_last_checkpoint", &last),
                ] {
                    let fin = root.join(name);
                    // Hidden until renamed: readers list `_delta_log`.
                    let tmp = root.join(format!(
                        "_delta_log/.{}.{token}.tmp",
                        name.trim_start_matches("_delta_log/")
                    ));
                    std::fs::write(&tmp, body)
                        .and_then(|_| std::fs::File::open(&tmp)?.sync_all())
                        .and_then(|_| std::fs::rename(&tmp, &fin))
                        .map_err(|e| IngestError::io("writing the checkpoint", &fin, e))?;
                }
            }
            Place::Objects(o, prefix) => {
                let scratch = self
                    .t
                    .root
                    .join(".highwater/objects-staging")
                    .join(&self.t.spec.name);
                std::fs::create_dir_all(&scratch)
                    .map_err(|e| IngestError::io("creating", &scratch, e))?;
                for (name, body) in [
                    (cp.as_str(), &bytes),
                    ("_delta_log/_last_checkpoint", &last),
                ] {
                    let tmp = scratch.join(format!("checkpoint.{token}.tmp"));
                    std::fs::write(&tmp, body).map_err(|e| IngestError::io("writing", &tmp, e))?;
                    let put = o.put_file(&tmp, &format!("{prefix}/{name}"));
                    let _ = std::fs::remove_file(&tmp);
                    put.map_err(|e| self.delta_err("-", e))?;
                }
            }
        }
        Ok(())
    }

    /// Deletes files removed from the table more than
    /// `version_retention_s` ago, and files no commit added (a run killed
    /// before its commit) that are as old. Returns how many went.
    pub(crate) fn delta_vacuum(&self) -> Result<usize, IngestError> {
        let snap = self.delta_snapshot()?.clone();
        let now_ms = now_ns() / 1_000_000;
        let keep_ms = (self.t.spec.version_retention_s as i64).saturating_mul(1000);
        let expired = |path: &str, modified_ms: i64| -> bool {
            if snap.files.contains_key(path) {
                return false;
            }
            match snap.tombstones.get(path) {
                Some(removed_ms) => removed_ms.saturating_add(keep_ms) <= now_ms,
                None => {
                    let grace_ms = keep_ms.max(UNCOMMITTED_GRACE_S * 1000);
                    modified_ms.saturating_add(grace_ms) <= now_ms
                }
            }
        };
        let mut gone = 0;
        match self.place() {
            Place::Local(root) => {
                let data = root.join("data");
                let mut stack = vec![data.clone()];
                let mut dirs = Vec::new();
                while let Some(d) = stack.pop() {
                    let Ok(rd) = std::fs::read_dir(&d) else {
                        continue;
                    };
                    for e in rd.flatten() {
                        let p = e.path();
                        let name = e.file_name().to_string_lossy().into_owned();
                        if name.contains(crate::publish::STAGING_MARK) {
                            // A run's staging folder: swept by the runs.
                            continue;
                        }
                        if p.is_dir() {
                            dirs.push(p.clone());
                            stack.push(p);
                            continue;
                        }
                        let rel = p
                            .strip_prefix(&root)
                            .expect("under the root")
                            .to_string_lossy()
                            .into_owned();
                        let modified_ms = e
                            .metadata()
                            .ok()
                            .and_then(|m| m.modified().ok())
                            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                            .map_or(now_ms, |d| d.as_millis() as i64);
                        if expired(&rel, modified_ms) {
                            std::fs::remove_file(&p)
                                .map_err(|e| IngestError::io("vacuuming", &p, e))?;
                            gone += 1;
                        }
                    }
                }
                // Deepest first; a folder still holding files stays.
                dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
                for d in dirs {
                    let _ = std::fs::remove_dir(d);
                }
            }
            Place::Objects(o, prefix) => {
                let objs = o
                    .list(&format!("{prefix}/data/"))
                    .map_err(|e| self.delta_err("-", e))?;
                for obj in objs {
                    let Some(rel) = obj.key.strip_prefix(&format!("{prefix}/")) else {
                        continue;
                    };
                    if expired(rel, obj.last_modified_ns / 1_000_000) {
                        o.delete(&obj.key).map_err(|e| self.delta_err("-", e))?;
                        gone += 1;
                    }
                }
            }
        }
        Ok(gone)
    }
}

/// What one window's commit takes out of the table.
#[derive(Default)]
struct TakeOut {
    /// Active files removed: path → their `add` action.
    removed: Vec<(String, Value)>,
    /// Files written back without the window's rows, each with the path
    /// it was rewritten from.
    added: Vec<(String, crate::sink::FileInfo)>,
}

/// The `remove` action of active file `path` (its `add` action `add`).
pub(crate) fn remove_action(path: &str, add: &Value, now_ms: i64, data_change: bool) -> Value {
    json!({"remove": {
        "path": path,
        "deletionTimestamp": now_ms,
        "dataChange": data_change,
        "extendedFileMetadata": true,
        "partitionValues": add.get("partitionValues").cloned().unwrap_or_else(|| json!({})),
        "size": add["size"],
    }})
}

/// The `add` action of a file highwater wrote at `path` (relative to the
/// table), with its statistics.
fn add_action(path: &str, f: &crate::sink::FileInfo, now_ms: i64, tags: &Value) -> Value {
    let stats = f
        .stats
        .clone()
        .unwrap_or_else(|| json!({"numRecords": f.rows}));
    json!({"add": {
        "path": path,
        "partitionValues": {},
        "size": f.bytes,
        "modificationTime": now_ms,
        "dataChange": true,
        "stats": stats.to_string(),
        "tags": tags,
    }})
}

/// Other engines' files are read with their Parquet schema, not an Arrow
/// schema their writer embedded (delta-rs asks for Utf8View): what is read
/// and written back is plain Arrow.
fn foreign_options() -> parquet::arrow::arrow_reader::ArrowReaderOptions {
    parquet::arrow::arrow_reader::ArrowReaderOptions::new().with_skip_arrow_metadata(true)
}

/// Where a re-land whose attempt folder is `dir_rel`
/// (`data/START/TOKEN`) writes the files it rewrote without the window's
/// rows: `data/RSTART/TOKEN`, outside every window's folder.
fn rewrite_dir(dir_rel: &str) -> String {
    match dir_rel.strip_prefix("data/") {
        Some(rest) => format!("data/R{rest}"),
        None => format!("R{dir_rel}"),
    }
}

impl TableFormat for Delta {
    /// Every file carries the window stamp and its statistics.
    fn extras(&self, w: &Window) -> Extras {
        Extras {
            stamp: Some(w.start_us),
            stats: true,
        }
    }

    fn columns(
        &self,
        columns: Vec<Column>,
        _records: &BTreeMap<i64, WindowRecord>,
        warnings: &mut Vec<String>,
    ) -> Result<Vec<Column>, IngestError> {
        self.delta_columns(&columns, warnings)
    }

    /// The table's own schema was checked in [`Self::columns`].
    fn neighbour_schema_check(&self) -> bool {
        false
    }

    /// A window inside a period compacted before rows carried their stamp
    /// (see [`compact`]).
    fn refuse_windows(&self, ks: &[i64]) -> Result<(), IngestError> {
        let snap = self.delta_snapshot()?;
        for &k in ks {
            let w = self.t.spec.grid.window(k);
            if let Some(e) = self.delta_compacted_refusal(&snap, w.start_us, &w.to_string()) {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Files go by `remove` actions and vacuum, never by folder.
    fn window_folders(&self) -> bool {
        false
    }

    fn remove_old_window(&self, _old: &str, _label: &str) -> Result<(), IngestError> {
        Ok(())
    }

    /// A window is in the table's log, not a folder of its own.
    fn has_window(
        &self,
        _r: &WindowRecord,
        _periods: &mut BTreeMap<String, Option<crate::compact::PeriodManifest>>,
    ) -> bool {
        true
    }

    fn on_disk(&self, w: &Window, _abs: &Path) -> Result<Option<OnDisk>, IngestError> {
        let Some(m) = self.delta_window_manifest(w)? else {
            return Ok(None);
        };
        Ok(m["token"].as_str().map(|token| OnDisk {
            token: token.to_string(),
            recipe: m["recipe"].as_str().map(str::to_string),
            recipe_parts: m["recipe_parts"].clone(),
            rows: m["rows"].as_i64(),
            files: m["files"].clone(),
            digest: m["digest"].clone(),
            compacted: None,
        }))
    }

    /// The folder of the window's newest commit.
    fn window_rows_dir(&self, w: &Window) -> Result<Option<PathBuf>, IngestError> {
        let Some(m) = self.delta_window_manifest(w)? else {
            return Ok(None);
        };
        let data = Path::new(m["data"].as_str().unwrap_or_default());
        // Read back from the table's log: checked like a path from the
        // state store.
        let safe = data
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        Ok(safe.then(|| self.t.root.join(&self.t.spec.output).join(data)))
    }

    /// A window inside a period `highwater compact` rewrote: the period's
    /// windows that a run re-lands (after a recipe change) go in one
    /// commit, so the compacted file is taken apart once, not once per
    /// window, and readers see the period before or after, never half.
    fn publish_group(&self, k: i64) -> Result<Option<i64>, IngestError> {
        if self.t.spec.compaction.is_none() {
            return Ok(None);
        }
        let start = self.t.spec.grid.window(k).start_us;
        let snap = self.delta_snapshot()?;
        let compacted = snap
            .files
            .values()
            .any(|a| compact::period_of_add(a).is_some_and(|(s, e)| s <= start && start < e));
        Ok(compacted.then(|| self.t.spec.period_of(k)))
    }

    fn publish(
        &self,
        ws: &[StagedWindow<'_>],
        columns: &[Column],
    ) -> Result<Vec<Option<Value>>, IngestError> {
        self.delta_publish(ws, columns)?;
        Ok(vec![None; ws.len()])
    }

    /// Records follow the log, which has no period manifests to repair from.
    fn reconcile(&self, _held: &Held<'_>) -> Result<(), IngestError> {
        Ok(())
    }

    /// Files removed longer than `version_retention_s` ago go now.
    fn after_run(&self) -> Result<(), IngestError> {
        self.delta_vacuum().map(|_| ())
    }

    /// Inside the table: the period's files (see [`compact`]).
    fn period_path(&self, p: i64) -> Result<(String, PathBuf), IngestError> {
        let rel = format!(
            "{}/{}",
            self.t.spec.output.trim_end_matches('/'),
            self.delta_period_dir(p)
        );
        let abs = self.t.root.join(&rel);
        Ok((rel, abs))
    }

    /// A Delta period is compacted only once no run re-lands its windows:
    /// past `horizon_us`. One commit, under the table's own concurrency
    /// control; the lease is the source's, held by the caller.
    fn compact_period(
        &self,
        p: i64,
        records: &BTreeMap<i64, WindowRecord>,
        horizon_us: i64,
        _held: &Held<'_>,
    ) -> Result<PeriodOutcome, IngestError> {
        self.delta_compact_period(p, records, horizon_us)
    }

    /// The table's current files that hold the window's stamped rows,
    /// whoever compacted, rewrote or vacuumed the table since the window's
    /// commit (issue 46).
    fn window_files(&self, w: &Window, r: &WindowRecord) -> Result<WindowFiles, String> {
        let (from, files) = self
            .delta_window_for_load(w, &r.token)
            .map_err(|e| e.to_string())?;
        Ok(WindowFiles {
            from,
            files,
            rows: crate::format::Rows::Stamped,
        })
    }
}
