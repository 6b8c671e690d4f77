//! Windows published to object storage, which has no rename.
//!
//! A window's files are uploaded under a version prefix of their own,
//! `KEY/v=TOKEN/`, and then its `KEY/_manifest.json` is put conditionally:
//! `If-None-Match: *` for a first version, `If-Match` on the ETag read just
//! before for the next. Readers read the manifest and then the files it
//! names, so they see one version whole: never a mix, never half of one.
//! The window lease already makes one process the publisher; the condition
//! also stops a holder that lost its lease while frozen.
//!
//! A superseded version stays for `version_retention_s` (a reader may still
//! be reading it): the manifest carries the list of superseded versions and
//! when they were superseded, and each publish deletes those past it.

use super::Folders;
use crate::error::IngestError;
use highwater_core::window::{format_rfc3339, Window};
use highwater_objects::Put;
use highwater_store::lease::now_ns;
use serde_json::json;
use std::path::Path;

impl Folders {
    /// The window's published manifest, local or in object storage.
    pub(crate) fn published_manifest(
        &self,
        w: &Window,
        abs: &Path,
    ) -> Result<Option<serde_json::Value>, IngestError> {
        if self.t.spec.output_place.is_none() {
            return Ok(std::fs::read(abs.join("_manifest.json"))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok()));
        }
        let key = self.window_key(w);
        let got = self
            .t
            .objects()
            .get(&format!("{key}/_manifest.json"))
            .map_err(|e| self.t.store_err(&w.to_string(), e))?;
        Ok(got.and_then(|(b, _)| serde_json::from_slice(&b).ok()))
    }

    /// For the warehouse load from a bucket (issue 21): the manifest of the
    /// Parquet window `w` as published there, its `files` rewritten to the
    /// names under the version's prefix, and that prefix (`KEY/v=TOKEN`).
    /// `None`: no manifest in the bucket.
    pub(crate) fn bucket_window_for_load(
        &self,
        w: &Window,
    ) -> Result<Option<(serde_json::Value, String)>, IngestError> {
        let Some(mut m) = self.published_manifest(w, Path::new(""))? else {
            return Ok(None);
        };
        let version = m["version"].as_str().unwrap_or_default().to_string();
        let prefix = format!("{}/{version}", self.window_key(w));
        let strip = format!("{version}/");
        let files: Vec<serde_json::Value> = m["files"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter_map(|f| f.as_str())
            // A name outside the version's prefix is kept whole, and the
            // load's check refuses it.
            .map(|f| json!({"path": f.strip_prefix(&strip).unwrap_or(f)}))
            .collect();
        m["files"] = json!(files);
        Ok(Some((m, prefix)))
    }

    fn window_key(&self, w: &Window) -> String {
        self.t
            .spec
            .window_path(w)
            .expect("the template was checked at config load")
    }

    /// Uploads the sealed staging folder of window `k` as version `token`
    /// and publishes its manifest; the staging folder goes after.
    pub(crate) fn publish_objects(
        &self,
        k: i64,
        staging: &Path,
        token: &str,
    ) -> Result<(), IngestError> {
        let w = self.t.spec.grid.window(k);
        let label = w.to_string();
        let key = self.window_key(&w);
        let o = self.t.objects();
        let err = |e: &dyn std::fmt::Display| self.t.store_err(&label, e);
        let local: serde_json::Value = std::fs::read(staging.join("_manifest.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| err(&"the sealed staging folder has no readable _manifest.json"))?;
        let version = format!("v={token}");
        let mut names: Vec<String> = std::fs::read_dir(staging)
            .map_err(|e| IngestError::io("listing", staging, e))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "_manifest.json")
            .collect();
        names.sort();
        for n in &names {
            o.put_file(&staging.join(n), &format!("{key}/{version}/{n}"))
                .map_err(|e| err(&e))?;
        }
        let manifest_key = format!("{key}/_manifest.json");
        let current = o.get(&manifest_key).map_err(|e| err(&e))?;
        let now = now_ns();
        let retention_ns = (self.t.spec.version_retention_s as i64).saturating_mul(1_000_000_000);
        let (mut superseded, expected) = match &current {
            None => (Vec::new(), None),
            Some((bytes, etag)) => {
                let m: serde_json::Value = serde_json::from_slice(bytes).unwrap_or_default();
                let mut list: Vec<serde_json::Value> =
                    m["superseded"].as_array().cloned().unwrap_or_default();
                if let Some(v) = m["version"].as_str() {
                    list.push(json!({"version": v, "at_ns": now}));
                }
                (list, Some(etag.clone()))
            }
        };
        let (expired, kept): (Vec<_>, Vec<_>) = superseded
            .drain(..)
            .partition(|s| s["at_ns"].as_i64().is_some_and(|t| t + retention_ns <= now));
        let mut manifest = local;
        manifest["version"] = json!(version);
        manifest["files"] = json!(names
            .iter()
            .map(|n| format!("{version}/{n}"))
            .collect::<Vec<_>>());
        manifest["superseded"] = json!(kept);
        manifest["published_at"] = json!(format_rfc3339(now / 1000));
        let body = serde_json::to_vec_pretty(&manifest).expect("plain data");
        match o
            .put_if(&manifest_key, body, expected.as_deref())
            .map_err(|e| err(&e))?
        {
            Put::Done(_) => {}
            Put::Lost => {
                return Err(err(&"another publisher changed the window's manifest meanwhile; this version was not published (its files stay until the window's retention sweeps them) and the window runs again"));
            }
        }
        for s in expired {
            if let Some(v) = s["version"].as_str().filter(|v| v.starts_with("v=")) {
                self.remove_objects(&format!("{key}/{v}"), &label)?;
            }
        }
        let _ = std::fs::remove_dir_all(staging);
        Ok(())
    }

    /// Deletes every object under `prefix` (a folder).
    pub(crate) fn remove_objects(&self, prefix: &str, window: &str) -> Result<(), IngestError> {
        let o = self.t.objects();
        for obj in o.list(prefix).map_err(|e| self.t.store_err(window, e))? {
            o.delete(&obj.key)
                .map_err(|e| self.t.store_err(window, e))?;
        }
        Ok(())
    }
}
