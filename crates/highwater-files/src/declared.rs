//! Stages declared outside `highwater.toml` (issue 48): a Python pipeline
//! declares its stages in code the CLI cannot run, so each Python plan and
//! run records the declarations it planned with (inputs, output template,
//! the code recipe it computed, where it was declared) in
//! `python-stages.json` beside the state store. The CLI's `plan`, `status`
//! and `deps` read them, so that the CLI and Python agree on what the
//! folder's stages are. The CLI plans such a stage with the recorded code
//! recipe: an edit to the code since the last Python plan shows only in
//! Python's own plan, and the CLI says so. The CLI never runs them.

use crate::error::FilesError;
use crate::spec::{OnDelete, StageSpec, Transform};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The record's file name, in the state store's folder.
pub const RECORD_FILE: &str = "python-stages.json";

/// The record's path for a state store at `state_path`.
pub fn record_path(state_path: &Path) -> PathBuf {
    state_path
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join(RECORD_FILE)
}

/// One stage from its declaration as JSON (the Python package's form):
/// `name`, `inputs` (a list of globs, or a table naming a source's
/// windows), `output`, and optionally `on_delete`, `guard`,
/// `guard_items_min`, `compare`, `version`, `recipe` (the code recipe's
/// config) and `declared_in`. The message names the stage and the field.
pub fn stage_from_json(v: &Value, transform: Transform) -> Result<StageSpec, String> {
    let name = v["name"]
        .as_str()
        .ok_or_else(|| format!("a stage declaration has no name: {v}"))?;
    // The CLI's rule for stage names: they become metric labels, page
    // cells and file names beside the state.
    if !crate::config::name_ok(name) {
        return Err(format!(
            "stage name {name:?}: use only letters, digits, `_` and `-`"
        ));
    }
    let strs = |key: &str| -> Result<Vec<String>, String> {
        v[key]
            .as_array()
            .ok_or_else(|| format!("stage `{name}`: `{key}` must be a list of strings"))?
            .iter()
            .map(|s| {
                s.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("stage `{name}`: `{key}` must be a list of strings"))
            })
            .collect()
    };
    // A table of inputs names a source's landed windows (issue 49).
    let items = match &v["inputs"] {
        Value::Object(_) => Some(
            crate::inputs::InputsSpec::from_json(&v["inputs"])
                .map_err(|m| format!("stage `{name}`: {m}"))?,
        ),
        _ => None,
    };
    let inputs = if items.is_some() {
        Vec::new()
    } else {
        strs("inputs")?
    };
    let output = v["output"]
        .as_str()
        .ok_or_else(|| format!("stage `{name}`: `output` must be a string"))?;
    let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let mut s = StageSpec::new(name, &refs, output, transform);
    s.items = items;
    if let Some(g) = v["guard"].as_f64() {
        s.guard = g;
    }
    if let Some(n) = v["guard_items_min"].as_u64() {
        s.guard_items_min = n as usize;
    }
    match v["on_delete"].as_str() {
        None | Some("remove") => {}
        Some("keep") => s.on_delete = OnDelete::Keep,
        Some(o) => {
            return Err(format!(
                "stage `{name}`: on_delete = {o:?}; use \"remove\" or \"keep\""
            ))
        }
    }
    // `compare=` (issue 49): as `compare` in highwater.toml.
    if !v["compare"].is_null() {
        s.compare = crate::compare::parse_spec_json(&v["compare"])
            .map_err(|e| format!("stage `{name}`: compare: {e}"))?;
    }
    // The code recipe is computed in Python and arrives as a config: each
    // named component's digest changes the recipe id.
    s.recipe.version = v["version"].as_str().unwrap_or_default().to_string();
    s.recipe.config = v["recipe"].clone();
    s.declared_in = v["declared_in"].as_str().unwrap_or("python").to_string();
    // A Python function is not observed as a command is: its worker
    // reports what it opened (audit hooks, issue 48), unless the
    // declaration says `reports_reads: false`.
    s.observe = false;
    s.reports_reads = v["reports_reads"].as_bool().unwrap_or(false);
    Ok(s)
}

/// Records `decls` (the declarations one Python pipeline planned with) in
/// the record at `path`: replacing the stages of the same names, and
/// dropping those the same files declared before but no longer do. Written
/// only when it changes (a no-change plan writes nothing), beside the
/// target and renamed into place.
pub fn record(path: &Path, decls: &[Value]) -> Result<(), FilesError> {
    let old_text = std::fs::read_to_string(path).ok();
    let old: Vec<Value> = old_text
        .as_deref()
        .and_then(|t| serde_json::from_str::<Value>(t).ok())
        .and_then(|v| v["stages"].as_array().cloned())
        .unwrap_or_default();
    let site = |v: &Value| {
        let d = v["declared_in"].as_str().unwrap_or_default();
        crate::engine::declaration_site(d).to_string()
    };
    let ours_names: Vec<&str> = decls.iter().filter_map(|d| d["name"].as_str()).collect();
    let ours_sites: Vec<String> = decls.iter().map(site).collect();
    let mut stages: Vec<Value> = old
        .into_iter()
        .filter(|v| {
            let name = v["name"].as_str().unwrap_or_default();
            !ours_names.contains(&name) && !ours_sites.contains(&site(v))
        })
        .collect();
    stages.extend(decls.iter().cloned());
    stages.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    let text = serde_json::to_string_pretty(&serde_json::json!({ "version": 1, "stages": stages }))
        .map_err(|e| FilesError::Io {
            op: "encode",
            path: path.to_path_buf(),
            source: std::io::Error::other(e),
        })?
        + "\n";
    if old_text.as_deref() == Some(text.as_str()) {
        return Ok(());
    }
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| FilesError::io("create", dir, e))?;
    let tmp = dir.join(format!(".{RECORD_FILE}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, text.as_bytes()).map_err(|e| FilesError::io("write", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        FilesError::io("rename", path, e)
    })
}

/// The recorded declarations at `path` (none when there is no record). A
/// record that does not parse is refused, naming the file and the fix.
pub fn load(path: &Path) -> Result<Vec<Value>, FilesError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(FilesError::io("read", path, e)),
    };
    let bad = |why: String| {
        FilesError::Config {
        path: path.to_path_buf(),
        message: format!("{why}. This file records a Python pipeline's stages; delete it and plan the pipeline from Python again to rewrite it"),
    }
    };
    let v: Value = serde_json::from_str(&text).map_err(|e| bad(format!("invalid JSON: {e}")))?;
    v["stages"]
        .as_array()
        .cloned()
        .ok_or_else(|| bad("no `stages` list".into()))
}

/// A transform for a recorded Python stage: the CLI never runs one.
pub fn not_here(declared_in: &str) -> Transform {
    let msg = format!(
        "this stage is declared in Python ({declared_in}); run it from Python, not from the CLI"
    );
    Transform::Closure(std::sync::Arc::new(move |_| Err(msg.clone())))
}
