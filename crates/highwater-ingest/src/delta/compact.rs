//! `highwater compact` on a `format = "delta"` source (issue 21): a closed
//! period's windows rewritten into files near `compact.target_file_mb`,
//! published as ONE commit of `remove` (the windows' files) and `add` (the
//! period's files) actions, every one `dataChange = false`: Delta's word
//! for "layout only", so streaming readers skip it and the rows read the
//! same before and after.
//!
//! The period's files live in `data/P<START>/<TOKEN>/`, tagged with the
//! period's bounds. A window inside a compacted period is not re-landed
//! (its old rows are inside the period's files, which a window commit
//! cannot take apart): `delta_publish` refuses it loudly, naming the
//! period, and nothing is committed. Only periods wholly older than the
//! source's re-land horizon (`settle` + `lookback` before now) are
//! compacted, so ordinary runs never meet that refusal.
//!
//! A table in object storage compacts the same way: the windows' files
//! are read back into a scratch folder under `.highwater/objects-staging`,
//! the period written there, uploaded, then the same one put-if-absent
//! commit.

use super::Delta;
use crate::compact::{self, Input, WindowIn};
use crate::error::IngestError;
use crate::failpoints::kill_self;
use crate::periods::PeriodOutcome;
use crate::publish;
use highwater_core::window::{format_compact, format_rfc3339};
use highwater_store::lease::now_ns;
use highwater_store::{WindowRecord, WindowStatus};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Tags on a compacted file's `add` action: the period it holds (µs).
pub const TAG_PERIOD_START: &str = "highwater.period_start_us";
pub const TAG_PERIOD_END: &str = "highwater.period_end_us";

/// The period an active file holds, if it is a compacted one.
pub(crate) fn period_of_add(add: &Value) -> Option<(i64, i64)> {
    let t = &add["tags"];
    let s = t[TAG_PERIOD_START].as_str()?.parse().ok()?;
    let e = t[TAG_PERIOD_END].as_str()?.parse().ok()?;
    Some((s, e))
}

impl Delta {
    /// Period `p`'s folder, relative to the table root.
    pub(crate) fn delta_period_dir(&self, p: i64) -> String {
        let k0 = self.t.spec.period_windows(p).start;
        format!(
            "data/P{}",
            format_compact(self.t.spec.grid.window(k0).start_us)
        )
    }

    /// The refusal of window start `start_us` if it lies in a period that
    /// `highwater compact` rewrote before rows carried their window stamp:
    /// such files cannot be taken apart by window. A period written with
    /// stamps (its statistics name the stamp column) is taken apart like
    /// any other file ([`super::rewrite`]).
    pub(crate) fn delta_compacted_refusal(
        &self,
        snap: &super::Snapshot,
        start_us: i64,
        label: &str,
    ) -> Option<IngestError> {
        snap.files
            .values()
            .find_map(|a| self.delta_compacted_refusal_of(a, start_us, label))
    }

    /// [`Self::delta_compacted_refusal`] for one active file.
    pub(crate) fn delta_compacted_refusal_of(
        &self,
        add: &Value,
        start_us: i64,
        label: &str,
    ) -> Option<IngestError> {
        let (s, e) = period_of_add(add).filter(|(s, e)| *s <= start_us && start_us < *e)?;
        let stamped = super::stats::timestamp_stats(add, super::WINDOW_COLUMN)
            .nulls
            .is_some();
        if stamped {
            return None;
        }
        Some(IngestError::Schema {
            name: self.t.spec.name.clone(),
            message: format!(
                "window {label} lies in the period {} .. {} of Delta table `{}` that `highwater compact` rewrote before rows carried their window (the `{}` column); a window commit cannot take the window's rows out of those files, so it is not landed again and nothing was committed. Leave the window out (`--from`/`--to`, `--window`), or land its rows into a new table (a new source name and output)",
                format_rfc3339(s),
                format_rfc3339(e),
                self.t.spec.output,
                super::WINDOW_COLUMN,
            ),
        })
    }

    /// Compacts period `p` of a Delta table: one commit, dataChange = false.
    pub(crate) fn delta_compact_period(
        &self,
        p: i64,
        records: &BTreeMap<i64, WindowRecord>,
        horizon_us: i64,
    ) -> Result<PeriodOutcome, IngestError> {
        let started = std::time::Instant::now();
        let g = &self.t.spec.grid;
        let ks = self.t.spec.period_windows(p);
        let (p_start, p_end) = (g.window(ks.start).start_us, g.window(ks.end - 1).end_us);
        let pdir = self.delta_period_dir(p);
        let root = self.t.root.join(self.t.spec.output.trim_end_matches('/'));
        let mut o = PeriodOutcome {
            start: format_rfc3339(p_start),
            end: format_rfc3339(p_end),
            path: format!("{}/{pdir}", self.t.spec.output.trim_end_matches('/')),
            status: "skipped",
            windows: ks.clone().count(),
            rows: 0,
            files_before: 0,
            files_after: 0,
            bytes_before: 0,
            bytes_after: 0,
            duration_ms: 0,
            reason: None,
        };
        let snap = self.delta_snapshot()?.clone();
        let compacted: Vec<&Value> = snap
            .files
            .values()
            .filter(|a| period_of_add(a) == Some((p_start, p_end)))
            .collect();
        if !compacted.is_empty() {
            o.status = "already";
            o.files_before = compacted.len();
            o.files_after = compacted.len();
            o.bytes_before = compacted.iter().filter_map(|a| a["size"].as_u64()).sum();
            o.bytes_after = o.bytes_before;
            o.rows = compacted
                .iter()
                .filter_map(|a| a["stats"].as_str())
                .filter_map(|s| serde_json::from_str::<Value>(s).ok())
                .filter_map(|s| s["numRecords"].as_u64())
                .sum();
            return Ok(o);
        }
        if p_end > horizon_us {
            o.reason = Some(format!(
                "the period ends at {}, inside the source's re-land horizon (settle + lookback before now, {}): its windows may still be landed again. Compact it later",
                format_rfc3339(p_end),
                format_rfc3339(horizon_us)
            ));
            return Ok(o);
        }
        let token = self.t.token(p);
        // A table in a bucket: the windows' files are read back into a
        // scratch folder of highwater's own, the period written there with
        // the same code, then uploaded; the folder goes whatever happens.
        let bucket = match self.place() {
            super::Place::Objects(o, prefix) => Some((o, prefix)),
            super::Place::Local(_) => None,
        };
        if bucket.is_some() {
            self.t.sweep_scratch("compact");
        }
        let scratch = bucket
            .as_ref()
            .map(|_| self.t.scratch(&format!("compact-{token}")));
        let root = scratch.as_ref().map_or(root, |s| s.0.join("table"));
        let mut ins = Vec::new();
        let mut schemas = Vec::new();
        let mut removed: Vec<(String, Value)> = Vec::new();
        for k in ks.clone() {
            let w = g.window(k);
            let Some(r) = records
                .get(&k)
                .filter(|r| r.status == WindowStatus::Published && r.recipe == self.t.recipe)
            else {
                o.reason = Some(format!(
                    "window {w} is not published under the current recipe; ingest it first (`highwater ingest {}`), then compact again",
                    self.t.spec.name
                ));
                return Ok(o);
            };
            // The table's newest commit of the window must be the one its
            // record names: the log is the truth.
            let m = snap.windows.get(&w.start_us).map(|(_, m)| m);
            let data = m.and_then(|m| m["data"].as_str()).unwrap_or_default();
            if m.and_then(|m| m["token"].as_str()) != Some(r.token.as_str())
                || !std::path::Path::new(data)
                    .components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)))
            {
                o.status = "failed";
                o.reason = Some(format!(
                    "window {w}'s newest commit in the table is not the version its record names; re-ingest it (`ingest --window`)"
                ));
                return Ok(o);
            }
            let prefix = format!("{data}/");
            let mut names = Vec::new();
            for (path, add) in snap.files.iter().filter(|(p, _)| p.starts_with(&prefix)) {
                names.push(path[prefix.len()..].to_string());
                o.files_before += 1;
                o.bytes_before += add["size"].as_u64().unwrap_or(0);
                removed.push((path.clone(), add.clone()));
            }
            let wabs = root.join(data);
            if let Some((store, prefix)) = &bucket {
                std::fs::create_dir_all(&wabs)
                    .map_err(|e| IngestError::io("creating", &wabs, e))?;
                for n in &names {
                    let key = format!("{prefix}/{data}/{n}");
                    if let Err(e) = store.get_to(&key, &wabs.join(n)) {
                        o.status = "failed";
                        o.reason = Some(format!(
                            "reading `{key}` back from the bucket: {e}; nothing was committed. Compact again"
                        ));
                        return Ok(o);
                    }
                }
            }
            if let Some(n) = names.first() {
                schemas.push(compact::schema_of(&wabs.join(n))?);
            }
            ins.push(WindowIn {
                start_us: r.start_us,
                end_us: r.end_us,
                token: r.token.clone(),
                input: Input::Files(wabs, names),
                expect: r.extra["digest"].as_str().map(str::to_string),
                keep: true,
            });
        }
        if schemas.is_empty() {
            o.reason = Some("its windows have no files".into());
            return Ok(o);
        }
        // Delta columns are only ever added to (the schema rule), so the
        // newest window's schema holds every older one.
        let schema = match compact::period_schema(&schemas) {
            Ok(s) => s,
            Err((_, _, why)) => {
                o.status = "failed";
                o.reason = Some(format!(
                    "its windows' files do not widen into one schema: {why}"
                ));
                return Ok(o);
            }
        };
        let final_rel = format!("{pdir}/{token}");
        let final_abs = root.join(&final_rel);
        let staging = match &scratch {
            Some(s) => s.0.join("period"),
            None => publish::staging_path(&final_abs, &token),
        };
        std::fs::create_dir_all(&staging).map_err(|e| IngestError::io("creating", &staging, e))?;
        let target = self
            .t
            .spec
            .compaction
            .as_ref()
            .map_or(u64::MAX, |c| c.target_file_bytes);
        // Writes and reads back: each window's rows, count and digest, as
        // they were published, or nothing is committed.
        let (written, windows) = match compact::write_period(&staging, schema, ins, None, target) {
            Ok(x) => x,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&staging);
                o.status = "failed";
                o.reason = Some(e.to_string());
                return Ok(o);
            }
        };
        match &bucket {
            // Uploaded where the commit will name them; until it is put,
            // no reader knows of them (an upload cut short leaves files no
            // commit added, which vacuum sweeps).
            Some((store, prefix)) => {
                for f in &written.files {
                    store
                        .put_file(
                            &staging.join(&f.path),
                            &format!("{prefix}/{final_rel}/{}", f.path),
                        )
                        .map_err(|e| self.delta_err(&format!("{} .. {}", o.start, o.end), e))?;
                }
            }
            None => {
                std::fs::rename(&staging, &final_abs)
                    .map_err(|e| IngestError::io("placing", &final_abs, e))?;
                if let Some(parent) = final_abs.parent() {
                    std::fs::File::open(parent)
                        .and_then(|d| d.sync_all())
                        .map_err(|e| IngestError::io("syncing", parent, e))?;
                }
            }
        }
        if std::env::var_os("HIGHWATER_FAILPOINT")
            .is_some_and(|v| v == "delta-compact-before-commit-put")
        {
            // For the crash tests: die with the period's files placed,
            // uncommitted.
            kill_self();
        }
        let label = format!("{} .. {}", o.start, o.end);
        let now_ms = now_ns() / 1_000_000;
        for attempt in 0..super::COMMIT_ATTEMPTS_MAX {
            let snap = self.delta_snapshot()?;
            // Another writer may have changed the period meanwhile (a
            // re-land); then its rows are not these, and nothing commits.
            if let Some((path, _)) = removed.iter().find(|(p, _)| !snap.files.contains_key(p)) {
                o.status = "failed";
                o.reason = Some(format!(
                    "file `{path}` left the table while the period was compacted (another writer committed); nothing was committed. Compact again"
                ));
                return Ok(o);
            }
            let mut actions = vec![json!({"commitInfo": {
                "timestamp": now_ms,
                "operation": "OPTIMIZE",
                "operationParameters": {"period": {"start": o.start, "end": o.end}},
                "engineInfo": concat!("highwater/", env!("CARGO_PKG_VERSION")),
                "isBlindAppend": false,
                "highwater": {
                    "kind": compact::KIND_COMPACTED,
                    "period": {"start_us": p_start, "end_us": p_end},
                    "token": token,
                    "data": final_rel,
                    "rows": written.rows,
                    "windows": windows,
                },
            }})];
            for (path, add) in &removed {
                actions.push(super::remove_action(path, add, now_ms, false));
            }
            for f in &written.files {
                actions.push(json!({"add": {
                    "path": format!("{final_rel}/{}", f.path),
                    "partitionValues": {},
                    "size": f.bytes,
                    "modificationTime": now_ms,
                    "dataChange": false,
                    "stats": f.stats.clone().unwrap_or_else(|| json!({"numRecords": f.rows})).to_string(),
                    "tags": {TAG_PERIOD_START: p_start.to_string(), TAG_PERIOD_END: p_end.to_string()},
                }}));
            }
            let mut body = Vec::new();
            for a in &actions {
                body.extend_from_slice(a.to_string().as_bytes());
                body.push(b'\n');
            }
            let v = snap.version + 1;
            drop(snap);
            if self.put_commit(v, &body, &token)? {
                let every = self.t.spec.checkpoint_every_commits as i64;
                if v > 0 && v % every == 0 {
                    self.delta_checkpoint(v, &token)?;
                }
                o.status = "compacted";
                o.rows = written.rows;
                o.files_after = written.files.len();
                o.bytes_after = written.files.iter().map(|f| f.bytes).sum();
                o.duration_ms = started.elapsed().as_millis() as u64;
                return Ok(o);
            }
            if attempt + 1 == super::COMMIT_ATTEMPTS_MAX {
                break;
            }
        }
        Err(self.delta_err(
            &label,
            format!(
                "{} commits in a row lost to other writers; nothing was committed. Compact again",
                super::COMMIT_ATTEMPTS_MAX
            ),
        ))
    }
}
