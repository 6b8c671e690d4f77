//! `highwater.toml` into a [`PipelineSpec`]. Paths in the config are relative
//! to the config file's folder. Unknown keys are errors, so that a typo such
//! as `on_delet` is reported instead of silently ignored.

use crate::error::FilesError;
use crate::spec::{OnDelete, PipelineSpec, RecipeSpec, StageSpec, Transform};
use highwater_core::Signal;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    state: Option<RawState>,
    #[serde(default)]
    stages: BTreeMap<String, RawStage>,
    #[serde(default)]
    sources: BTreeMap<String, toml::Value>,
    osm: Option<toml::Value>,
    #[serde(default)]
    storage: BTreeMap<String, highwater_objects::StorageSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawState {
    store: Option<String>,
    url_env: Option<String>,
    lease_duration_s: Option<u64>,
    claim_batch_max: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStage {
    /// A list of globs, or a table naming another kind of input (issue
    /// 49: `{ source = "orders", by = "day" }`): read by hand, so that a
    /// mistake in either is named as such.
    inputs: toml::Value,
    output: String,
    command: Vec<String>,
    signal: Option<Signal>,
    guard: Option<f64>,
    guard_items_min: Option<usize>,
    on_delete: Option<RawOnDelete>,
    rehash: Option<bool>,
    mtime_margin_ms: Option<u64>,
    recipe: Option<RawRecipe>,
    observe: Option<bool>,
    #[serde(default)]
    observe_ignore: Vec<String>,
    observe_ignore_defaults: Option<bool>,
    compare: Option<toml::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawOnDelete {
    Remove,
    Keep,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRecipe {
    version: Option<String>,
    #[serde(default)]
    files: Vec<String>,
    #[serde(default)]
    tools: Vec<String>,
    config: Option<toml::Value>,
}

/// Reads and validates a config file.
pub fn load(path: &Path) -> Result<PipelineSpec, FilesError> {
    let text = std::fs::read_to_string(path).map_err(|e| FilesError::Config {
        path: path.to_path_buf(),
        message: format!(
            "cannot read the config: {e}. Pass --config PATH or create highwater.toml"
        ),
    })?;
    let root = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut spec = parse(&text, path, &root)?;
    spec.places
        .push(("the config file".into(), path.to_path_buf()));
    Ok(spec)
}

/// Parses config text. `path` is only used in messages.
pub fn parse(text: &str, path: &Path, root: &Path) -> Result<PipelineSpec, FilesError> {
    let bad = |message: String| FilesError::Config {
        path: path.to_path_buf(),
        message,
    };
    let raw: RawConfig = toml::from_str(text).map_err(|e| bad(format!("invalid config: {e}")))?;
    let mut spec = PipelineSpec::new(root);
    let (store, url_env, lease_s, claim_max) = match raw.state {
        Some(s) => (s.store, s.url_env, s.lease_duration_s, s.claim_batch_max),
        None => (None, None, None, None),
    };
    if let Some(var) = url_env {
        if var.is_empty() || !var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(bad(format!(
                "[state] url_env = {var:?}: give the NAME of an environment variable (letters, digits, `_`) that holds the postgres:// URL, not the URL itself"
            )));
        }
        if store.is_some() {
            return Err(bad(
                "[state] names both `store` (SQLite) and `url_env` (PostgreSQL); keep one".into(),
            ));
        }
        spec.state_url_env = Some(var);
    }
    if let Some(s) = lease_s {
        if !(1..=86_400).contains(&s) {
            return Err(bad(format!(
                "[state] lease_duration_s = {s}: give 1 to 86400 seconds (how long a claim lives without a heartbeat)"
            )));
        }
        spec.fleet.lease_duration_s = s;
    }
    if let Some(n) = claim_max {
        if !(1..=10_000).contains(&n) {
            return Err(bad(format!(
                "[state] claim_batch_max = {n}: give 1 to 10000 items per claim"
            )));
        }
        spec.fleet.claim_batch_max = n;
    }
    if let Some(store) = store {
        match store.split_once(':') {
            Some(("sqlite", p)) if !p.is_empty() => spec.state = PathBuf::from(p),
            Some(("postgres" | "postgresql", _)) => {
                return Err(bad(
                    "[state] store: a URL in the config would put its password there; write `url_env = \"HIGHWATER_STATE_URL\"` and set that variable to the postgres:// URL".into(),
                ))
            }
            _ => {
                return Err(bad(format!(
                    "[state] store = {store:?} is not understood; use `sqlite:.highwater/state.db`"
                )))
            }
        }
    }
    if raw.stages.is_empty() && raw.sources.is_empty() && raw.osm.is_none() {
        return Err(bad(
            "nothing to do: add a [stages.NAME] table (inputs, output, command), a [sources.NAME] table or an [osm] table".into(),
        ));
    }
    for (name, st) in &raw.storage {
        if !name_ok(name) {
            return Err(bad(format!(
                "storage name {name:?}: use only letters, digits, `_` and `-`"
            )));
        }
        if st.kind != "s3" {
            return Err(bad(format!(
                "[storage.{name}] kind = {:?}: only \"s3\" (any S3-compatible service) is known",
                st.kind
            )));
        }
    }
    spec.storage = raw.storage;
    spec.sources = raw.sources;
    spec.osm = raw.osm;
    for (name, s) in raw.stages {
        if !name_ok(&name) {
            return Err(bad(format!(
                "stage name {name:?}: use only letters, digits, `_` and `-`"
            )));
        }
        let (globs, items) = match s.inputs {
            toml::Value::Array(a) if a.is_empty() => {
                return Err(bad(format!(
                    "[stages.{name}] inputs is empty; give at least one glob"
                )))
            }
            toml::Value::Array(a) => (
                a.into_iter()
                    .map(|g| match g {
                        toml::Value::String(g) => Ok(g),
                        other => Err(bad(format!(
                            "[stages.{name}] inputs: a {} is not a glob; give strings such as \"data/*.csv\"",
                            other.type_str()
                        ))),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                None,
            ),
            toml::Value::Table(t) => (
                Vec::new(),
                Some(
                    crate::inputs::InputsSpec::parse(t)
                        .map_err(|m| bad(format!("[stages.{name}] inputs: {m}")))?,
                ),
            ),
            other => {
                return Err(bad(format!(
                    "[stages.{name}] inputs is a {}: give a list of globs, or a source's windows as {{ source = \"NAME\", by = \"day\" }}",
                    other.type_str()
                )))
            }
        };
        if s.command.is_empty() || s.command[0].is_empty() {
            return Err(bad(format!(
                "[stages.{name}] command is empty; give an argv such as [\"cp\", \"{{input}}\", \"{{output}}\"]"
            )));
        }
        let guard = s.guard.unwrap_or(0.5);
        if !(guard > 0.0 && guard <= 1.0) {
            return Err(bad(format!(
                "[stages.{name}] guard = {guard} must be above 0 and at most 1 (the share of changed items that needs --force)"
            )));
        }
        let recipe = match s.recipe {
            Some(r) => RecipeSpec {
                version: r.version.unwrap_or_default(),
                files: r.files,
                tools: r.tools,
                config: match r.config {
                    Some(v) => serde_json::to_value(v)
                        .map_err(|e| bad(format!("[stages.{name}.recipe] config: {e}")))?,
                    None => serde_json::Value::Null,
                },
            },
            None => RecipeSpec::default(),
        };
        let mut stage = StageSpec::new(&name, &[], &s.output, Transform::Command(s.command));
        stage.inputs = globs;
        stage.items = items;
        stage.signal = s.signal.unwrap_or_default();
        stage.guard = guard;
        stage.guard_items_min = s.guard_items_min.unwrap_or(10);
        stage.on_delete = match s.on_delete {
            Some(RawOnDelete::Keep) => OnDelete::Keep,
            Some(RawOnDelete::Remove) | None => OnDelete::Remove,
        };
        stage.rehash = s.rehash.unwrap_or(false);
        stage.mtime_margin_ms = s.mtime_margin_ms.unwrap_or(1000);
        stage.recipe = recipe;
        stage.observe = s.observe.unwrap_or(true);
        for g in &s.observe_ignore {
            globset::Glob::new(g).map_err(|e| {
                bad(format!(
                    "[stages.{name}] observe_ignore = {g:?} is not a glob: {e}"
                ))
            })?;
        }
        stage.observe_ignore = s.observe_ignore;
        stage.observe_ignore_defaults = s.observe_ignore_defaults.unwrap_or(true);
        if let Some(c) = &s.compare {
            stage.compare = crate::compare::parse_spec(c)
                .map_err(|e| bad(format!("[stages.{name}] compare: {e}")))?;
        }
        spec.stages.push(stage);
    }
    Ok(spec)
}

/// The rule for a stage's or a storage's name: letters, digits, `_` and
/// `-`, at least one. Names become metric labels, page cells and parts of
/// file names beside the state, so nothing else is let in.
pub fn name_ok(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_readme_example() {
        let text = r#"
[state]
store = "sqlite:.highwater/state.db"

[stages.upper]
inputs = ["data/**/*.txt"]
output = "out/{relpath}.upper"
command = ["sh", "-c", "tr a-z A-Z < \"$1\" > \"$2\"", "_", "{input}", "{output}"]
signal = "hash"
guard = 0.5
on_delete = "remove"
[stages.upper.recipe]
version = "1"
files = ["transform.sh"]
tools = ["sh --version"]
config = { crs = "EPSG:3857" }
"#;
        let spec = parse(text, Path::new("highwater.toml"), Path::new(".")).unwrap();
        assert_eq!(spec.stages.len(), 1);
        let s = &spec.stages[0];
        assert_eq!(s.recipe.config, serde_json::json!({"crs": "EPSG:3857"}));
        assert_eq!(s.signal, Signal::Hash);
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let err = parse(
            "[stages.x]\ninputs = [\n",
            Path::new("cfg.toml"),
            Path::new("."),
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("cfg.toml: invalid config"), "{err}");
        assert!(err.contains("line"), "{err}");
        let err = parse(
            "[stages.x]\ninputs=['a']\noutput='o/{name}'\ncommand=['cp']\non_delet='keep'\n",
            Path::new("cfg.toml"),
            Path::new("."),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("on_delet"), "{err}");
    }
}
