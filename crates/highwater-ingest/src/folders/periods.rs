//! Compacted periods of window folders: a period's windows rewritten into
//! a few files under a folder of its own, swapped in whole; a window
//! published into a compacted period rewrites the period with its rows
//! replaced.
//!
//! Disk is the truth and records follow it: a period's folder is swapped
//! first and the window records are rewritten after, in one transaction;
//! a crash in between is repaired by [`Folders::reconcile_periods`] from
//! the period's manifest, which names the token of every window it holds.

use super::Folders;
use crate::compact::{self, Input, PeriodManifest, PeriodWindow, WindowIn};
use crate::error::IngestError;
use crate::failpoints::{failpoint, kill_self};
use crate::periods::PeriodOutcome;
use crate::publish;
use crate::table::Held;
use highwater_core::window::{format_rfc3339, Window};
use highwater_store::lease::now_ns;
use highwater_store::{WindowCommit, WindowRecord, WindowStatus};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

impl Folders {
    /// The folder of period `p`, relative and absolute.
    pub(crate) fn folder_period_path(&self, p: i64) -> Result<(String, PathBuf), IngestError> {
        let rel = self
            .t
            .spec
            .period_dir(p)
            .map_err(|message| IngestError::Schema {
                name: self.t.spec.name.clone(),
                message,
            })?;
        let abs = self.t.root.join(&rel);
        Ok((rel, abs))
    }

    /// If window `k` lies in a compacted period on disk: its entry there,
    /// and the `compacted` fact its record carries.
    pub(crate) fn compacted_window(&self, k: i64) -> Option<(PeriodWindow, serde_json::Value)> {
        self.t.spec.compaction.as_ref()?;
        let p = self.t.spec.period_of(k);
        let (rel, abs) = self.folder_period_path(p).ok()?;
        let m = compact::read_manifest(&abs)?;
        let start = self.t.spec.grid.window(k).start_us;
        let pw = m.windows.iter().find(|w| w.start_us == start)?.clone();
        let info = json!({
            "period": {"start": format_rfc3339(m.start_us), "end": format_rfc3339(m.end_us)},
            "path": rel,
            "token": m.token,
            "offset": pw.offset,
            "layout_only": true,
        });
        Some((pw, info))
    }

    /// Brings published window records up to date with the compacted
    /// periods on disk (a crash between a period's swap and its records).
    pub(crate) fn reconcile_periods(&self, held: &Held<'_>) -> Result<(), IngestError> {
        if self.t.spec.compaction.is_none() {
            return Ok(());
        }
        let records = held.store().windows(&self.t.spec.name)?;
        let mut fixed = Vec::new();
        for mut r in records {
            if r.status != WindowStatus::Published {
                continue;
            }
            let k = self.t.spec.grid.index_of(r.start_us);
            let Some((pw, info)) = self.compacted_window(k) else {
                continue;
            };
            if pw.token == r.token && r.extra["compacted"] != info {
                r.files = json!([]);
                r.extra["digest"] = json!(pw.digest);
                r.extra["compacted"] = info;
                fixed.push(r);
            }
        }
        if !fixed.is_empty() {
            held.store().commit_windows(&fixed, held.fence)?;
        }
        Ok(())
    }

    /// Makes a staged window visible: swapped in at its own path, or, when
    /// its period is compacted, by rewriting the period with the window's
    /// rows replaced. Returns the `compacted` fact in the second case.
    pub(crate) fn publish_window(
        &self,
        k: i64,
        staging: &Path,
        abs: &Path,
        token: &str,
    ) -> Result<Option<serde_json::Value>, IngestError> {
        let period = match &self.t.spec.compaction {
            Some(_) => {
                let (_, pabs) = self.folder_period_path(self.t.spec.period_of(k))?;
                compact::read_manifest(&pabs).map(|m| (pabs, m))
            }
            None => None,
        };
        let Some((pabs, old)) = period else {
            if self.t.objects.is_some() {
                self.publish_objects(k, staging, token)?;
                return Ok(None);
            }
            publish::swap_in(staging, abs)?;
            return Ok(None);
        };
        let start = self.t.spec.grid.window(k).start_us;
        let names = compact::parquet_files(staging)?;
        // The period's files and the window's may differ by a widening
        // (either way round): the rewritten period takes the wider one.
        let wschema = compact::schema_of(&staging.join(&names[0]))?;
        let schema = match compact::parquet_files(&pabs)?.first() {
            None => wschema,
            Some(n) => {
                let pschema = compact::schema_of(&pabs.join(n))?;
                compact::period_schema(&[pschema.clone(), wschema.clone()])
                    .or_else(|_| compact::period_schema(&[wschema, pschema]))
                    .map_err(|(_, _, why)| IngestError::Schema {
                        name: self.t.spec.name.clone(),
                        message: format!(
                            "window {} cannot be written into its compacted period {}: {why}; the period keeps its previous rows. Cast the column back to its old type in a `query`, or keep `[sources.{}.checks] schema = \"fail\"` (the default) so that such a window is refused before it is published",
                            self.t.spec.grid.window(k),
                            pabs.display(),
                            self.t.spec.name
                        ),
                    })?
            }
        };
        let mut ins = Vec::new();
        let mut placed = false;
        let ours = |ins: &mut Vec<WindowIn>| {
            ins.push(WindowIn {
                start_us: start,
                end_us: self.t.spec.grid.window(k).end_us,
                token: token.to_string(),
                input: Input::Files(staging.to_path_buf(), names.clone()),
                expect: None,
                keep: true,
            })
        };
        // The period's rows in window order, this window's range replaced
        // (or, if the period did not hold it, inserted in its place).
        for w in &old.windows {
            if !placed && w.start_us >= start {
                ours(&mut ins);
                placed = true;
            }
            ins.push(WindowIn {
                start_us: w.start_us,
                end_us: w.end_us,
                token: w.token.clone(),
                input: Input::Old(w.rows),
                expect: Some(w.digest.clone()),
                keep: w.start_us != start,
            });
        }
        if !placed {
            ours(&mut ins);
        }
        let pstaging = publish::staging_path(&pabs, token);
        std::fs::create_dir_all(&pstaging)
            .map_err(|e| IngestError::io("creating", &pstaging, e))?;
        // The old rows of the replaced window are read (to keep the stream
        // in step) and then dropped from what is written.
        let result =
            compact::write_period(&pstaging, schema, ins, Some(&pabs), self.target_bytes());
        let (written, windows) = match result {
            Ok(x) => x,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&pstaging);
                return Err(e);
            }
        };
        let manifest = PeriodManifest {
            kind: compact::KIND_COMPACTED.into(),
            source: self.t.spec.name.clone(),
            start_us: old.start_us,
            end_us: old.end_us,
            token: token.to_string(),
            files: written.files,
            rows: written.rows,
            windows,
        };
        compact::seal_and_swap(&pstaging, &pabs, &manifest, || Ok(true))?;
        // The window's own staging lived inside the old period's folder,
        // which the swap removed; nothing else is left of it.
        let _ = std::fs::remove_dir_all(staging);
        let pw = manifest
            .windows
            .iter()
            .find(|w| w.start_us == start)
            .expect("the window was written into its period");
        Ok(Some(json!({
            "period": {"start": format_rfc3339(manifest.start_us), "end": format_rfc3339(manifest.end_us)},
            "path": self.t.spec.period_dir(self.t.spec.period_of(k)).expect("checked above"),
            "token": manifest.token,
            "offset": pw.offset,
            "layout_only": true,
        })))
    }

    fn target_bytes(&self) -> u64 {
        self.t
            .spec
            .compaction
            .as_ref()
            .map_or(u64::MAX, |c| c.target_file_bytes)
    }

    pub(crate) fn compact_folder_period(
        &self,
        p: i64,
        records: &BTreeMap<i64, WindowRecord>,
        held: &Held<'_>,
    ) -> Result<PeriodOutcome, IngestError> {
        let started = std::time::Instant::now();
        let g = &self.t.spec.grid;
        let ks = self.t.spec.period_windows(p);
        let (rel, pabs) = self.folder_period_path(p)?;
        let mut o = PeriodOutcome {
            start: format_rfc3339(g.window(ks.start).start_us),
            end: format_rfc3339(g.window(ks.end - 1).end_us),
            path: rel.clone(),
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
        if let Some(m) = compact::read_manifest(&pabs) {
            o.status = "already";
            o.rows = m.rows;
            o.files_before = m.files.len();
            o.files_after = m.files.len();
            o.bytes_before = m.files.iter().map(|f| f.bytes).sum();
            o.bytes_after = o.bytes_before;
            return Ok(o);
        }
        let not_ready: Vec<i64> = ks
            .clone()
            .filter(|k| {
                records.get(k).is_none_or(|r| {
                    r.status != WindowStatus::Published || r.recipe != self.t.recipe
                })
            })
            .collect();
        if let Some(first) = not_ready.first() {
            // What the first of them is, in its record's words.
            let what = match records.get(first) {
                None => "never ingested".to_string(),
                Some(r) if r.status == WindowStatus::Published => {
                    "published under another recipe".to_string()
                }
                Some(r) => match &r.error {
                    Some(e) => format!("{}: {e}", r.status.as_str()),
                    None => r.status.as_str().to_string(),
                },
            };
            o.reason = Some(format!(
                "{} of its windows are not published under the current recipe (first: {}, {what}); ingest them first (`highwater ingest {}`), then compact again",
                not_ready.len(),
                g.window(*first),
                self.t.spec.name
            ));
            return Ok(o);
        }
        let token = self.t.token(p);
        let mut ins = Vec::new();
        // Each window's schema, from its first file, with the window.
        let mut schemas: Vec<(Window, arrow_schema::SchemaRef)> = Vec::new();
        for k in ks.clone() {
            let r = &records[&k];
            let w = Window {
                start_us: r.start_us,
                end_us: r.end_us,
            };
            let (_, wabs) = self.t.window_path(&w);
            // The window on disk must be the one its record names.
            if publish::published_token(&wabs).as_deref() != Some(r.token.as_str()) {
                o.status = "failed";
                o.reason = Some(format!(
                    "window {w} on disk ({}) is not the version its record names; re-ingest it (`ingest --window`)",
                    wabs.display()
                ));
                return Ok(o);
            }
            let names = compact::parquet_files(&wabs)?;
            for n in &names {
                let bytes = std::fs::metadata(wabs.join(n))
                    .map_err(|e| IngestError::io("reading", wabs.join(n), e))?
                    .len();
                o.files_before += 1;
                o.bytes_before += bytes;
            }
            if let Some(n) = names.first() {
                schemas.push((w, compact::schema_of(&wabs.join(n))?));
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
        // One schema for the period: the newest window's, when every
        // older one widens into it (their files are cast as they are
        // copied); otherwise the period is not compacted, and the two
        // windows that disagree are named.
        let only: Vec<arrow_schema::SchemaRef> = schemas.iter().map(|(_, s)| s.clone()).collect();
        let schema = match compact::period_schema(&only) {
            Ok(s) => s,
            Err((a, b, why)) => {
                o.status = "failed";
                o.reason = Some(format!(
                    "its windows have schemas that do not widen into one: window {} against window {}: {why}. Re-ingest the older windows so they are read with the source's current types (`highwater ingest {} --from {} --to {}`), then compact again",
                    schemas[a].0,
                    schemas[b].0,
                    self.t.spec.name,
                    format_rfc3339(schemas[a].0.start_us),
                    format_rfc3339(schemas[b].0.start_us),
                ));
                return Ok(o);
            }
        };
        let staging = publish::staging_path(&pabs, &token);
        publish::sweep_staging(&pabs, None);
        std::fs::create_dir_all(&staging).map_err(|e| IngestError::io("creating", &staging, e))?;
        let (written, windows) =
            match compact::write_period(&staging, schema, ins, None, self.target_bytes()) {
                Ok(x) => x,
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&staging);
                    o.status = "failed";
                    o.reason = Some(e.to_string());
                    return Ok(o);
                }
            };
        let g0 = g.window(ks.start).start_us;
        let manifest = PeriodManifest {
            kind: compact::KIND_COMPACTED.into(),
            source: self.t.spec.name.clone(),
            start_us: g0,
            end_us: g.window(ks.end - 1).end_us,
            token: token.clone(),
            files: written.files.clone(),
            rows: written.rows,
            windows: windows.clone(),
        };
        let swapped = compact::seal_and_swap(&staging, &pabs, &manifest, || {
            let ours = held.renew()?;
            if ours && failpoint("compact-before-swap") {
                kill_self();
            }
            Ok(ours)
        })?;
        if !swapped {
            o.status = "failed";
            o.reason = Some(format!(
                "not compacted: {} before the swap; nothing was swapped. Run `highwater compact {}` again",
                held.lost_to(),
                self.t.spec.name
            ));
            return Ok(o);
        }
        if failpoint("compact-after-swap") {
            kill_self();
        }
        let info = |pw: &PeriodWindow| {
            json!({
                "period": {"start": format_rfc3339(manifest.start_us), "end": format_rfc3339(manifest.end_us)},
                "path": rel,
                "token": manifest.token,
                "offset": pw.offset,
                // Delta's dataChange=false: the rows are the same (the
                // digest proves it); only the files they live in changed.
                "layout_only": true,
            })
        };
        let updated: Vec<WindowRecord> = windows
            .iter()
            .map(|pw| {
                let mut r = records[&g.index_of(pw.start_us)].clone();
                r.files = json!([]);
                r.extra["digest"] = json!(pw.digest);
                r.extra["compacted"] = info(pw);
                r.updated_at_ns = now_ns();
                r
            })
            .collect();
        if held.store().commit_windows(&updated, held.fence)? == WindowCommit::Fenced {
            o.status = "failed";
            o.reason = Some(format!(
                "compacted on disk, but not recorded: {} after the swap; the next `highwater compact {}` (or `ingest`) records it",
                held.lost_to(),
                self.t.spec.name
            ));
            return Ok(o);
        }
        o.status = "compacted";
        o.rows = written.rows;
        o.files_after = written.files.len();
        o.bytes_after = written.files.iter().map(|f| f.bytes).sum();
        o.duration_ms = started.elapsed().as_millis() as u64;
        Ok(o)
    }
}
