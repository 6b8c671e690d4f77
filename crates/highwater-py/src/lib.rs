//! `highwater._core`: the Python extension (issue 22). The same file-stage
//! engine as the CLI's (manifest, guard, atomic outputs and deletions); a
//! stage's transform is a Python callable instead of a command.
//!
//! The pure-Python package (`python/highwater`) declares the stages, computes
//! their code recipes and runs items in a process pool; this module only
//! turns its declarations into [`highwater_files::StageSpec`]s and drives the
//! engine. The GIL is released for the engine's own work (walk, hash, plan,
//! commit) and taken only to hand an item to the Python dispatcher, which
//! itself waits for the pool without holding it.

use highwater_files::{OnDelete, Pipeline, PipelineSpec, RunOptions, StageSpec, Transform};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyList;
use std::path::PathBuf;
use std::sync::Arc;

pyo3::create_exception!(
    _core,
    HighwaterError,
    PyException,
    "The engine refused or failed; the message names what and why."
);
pyo3::create_exception!(
    _core,
    GuardError,
    HighwaterError,
    "The guard refused the run: too many items would be redone (pass force=True)."
);

/// Jobs per run, whatever the caller asks for (the engine caps it again).
const JOBS_MAX: usize = 1024;

fn err(e: highwater_files::FilesError) -> PyErr {
    match e {
        highwater_files::FilesError::Guard { .. } => GuardError::new_err(e.to_string()),
        _ => HighwaterError::new_err(e.to_string()),
    }
}

fn bad(msg: String) -> PyErr {
    HighwaterError::new_err(msg)
}

/// One stage as the Python package declares it, in JSON.
fn stage_from_json(v: &serde_json::Value, transform: Transform) -> PyResult<StageSpec> {
    let name = v["name"]
        .as_str()
        .ok_or_else(|| bad(format!("a stage declaration has no name: {v}")))?;
    // The CLI's rule for stage names: they become metric labels, page
    // cells and file names beside the state.
    if !highwater_files::config::name_ok(name) {
        return Err(bad(format!(
            "stage name {name:?}: use only letters, digits, `_` and `-`"
        )));
    }
    let strs = |key: &str| -> PyResult<Vec<String>> {
        v[key]
            .as_array()
            .ok_or_else(|| bad(format!("stage `{name}`: `{key}` must be a list of strings")))?
            .iter()
            .map(|s| {
                s.as_str().map(str::to_string).ok_or_else(|| {
                    bad(format!("stage `{name}`: `{key}` must be a list of strings"))
                })
            })
            .collect()
    };
    let inputs = strs("inputs")?;
    let output = v["output"]
        .as_str()
        .ok_or_else(|| bad(format!("stage `{name}`: `output` must be a string")))?;
    let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let mut s = StageSpec::new(name, &refs, output, transform);
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
            return Err(bad(format!(
                "stage `{name}`: on_delete = {o:?}; use \"remove\" or \"keep\""
            )))
        }
    }
    // The code recipe is computed in Python and arrives as a config: each
    // named component's digest changes the recipe id.
    s.recipe.version = v["version"].as_str().unwrap_or_default().to_string();
    s.recipe.config = v["recipe"].clone();
    s.declared_in = v["declared_in"].as_str().unwrap_or("python").to_string();
    // Closures are never observed; said here so that no note claims otherwise.
    s.observe = false;
    Ok(s)
}

fn spec(
    root: &str,
    state: Option<&str>,
    stages_json: &str,
    make: &dyn Fn(&str) -> Transform,
) -> PyResult<Pipeline> {
    let stages: serde_json::Value = serde_json::from_str(stages_json)
        .map_err(|e| bad(format!("stage declarations are not JSON: {e}")))?;
    let mut p = PipelineSpec::new(PathBuf::from(root));
    if let Some(s) = state {
        p.state = PathBuf::from(s);
    }
    for v in stages
        .as_array()
        .ok_or_else(|| bad("stage declarations must be a list".into()))?
    {
        let name = v["name"].as_str().unwrap_or_default();
        p.stages.push(stage_from_json(v, make(name))?);
    }
    Pipeline::open(p).map_err(err)
}

fn plan_only(_: &str) -> Transform {
    Transform::Closure(Arc::new(|_| {
        Err("a plan never runs items (highwater internal error)".into())
    }))
}

fn recipes(p: &Pipeline) -> serde_json::Value {
    p.stage_names()
        .into_iter()
        .map(|n| (n.to_string(), serde_json::json!(p.recipe_id(n))))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The plan of every (or one) stage, as JSON: per stage its recipe id,
/// counts and changed items with their reasons.
#[pyfunction]
#[pyo3(signature = (root, state, stages_json, only=None, rehash=false))]
fn plan(
    py: Python<'_>,
    root: &str,
    state: Option<&str>,
    stages_json: &str,
    only: Option<&str>,
    rehash: bool,
) -> PyResult<String> {
    let p = spec(root, state, stages_json, &plan_only)?;
    let (plans, last) = py
        .detach(|| -> Result<_, highwater_files::FilesError> {
            let plans = p.plan(only, rehash)?;
            // The recipe each stage's last run recorded (id and config),
            // from the state store, so that a changed code recipe is named
            // by its parts.
            let last: std::collections::BTreeMap<String, serde_json::Value> = p
                .open_store()?
                .last_runs()?
                .into_iter()
                .map(|r| (r.stage, r.summary["recipe"].clone()))
                .collect();
            Ok((plans, last))
        })
        .map_err(err)?;
    let recipes = recipes(&p);
    let stages: Vec<_> = plans
        .iter()
        .map(|s| {
            serde_json::json!({
                "name": s.stage,
                "recipe": recipes[&s.stage],
                "last_recipe": last.get(&s.stage).cloned().unwrap_or_default(),
                "total": s.total,
                "unchanged": s.unchanged,
                "counts": s.counts().iter().map(|(r, n)| (r.as_str(), *n)).collect::<std::collections::BTreeMap<_, _>>(),
                "changed": s.changed.iter().map(|c| serde_json::json!({
                    "input": c.item, "reason": c.reason, "output": c.output,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(serde_json::json!({ "stages": stages }).to_string())
}

/// Runs every (or one) stage. `dispatch(stage, input, inputs, output,
/// relpath)` runs one item and returns None, or the error (the traceback)
/// as a string. Returns the run report as JSON.
#[pyfunction]
#[pyo3(signature = (root, state, stages_json, dispatch, jobs, force=false, only=None))]
#[allow(clippy::too_many_arguments)]
fn run(
    py: Python<'_>,
    root: &str,
    state: Option<&str>,
    stages_json: &str,
    dispatch: Py<PyAny>,
    jobs: usize,
    force: bool,
    only: Option<String>,
) -> PyResult<String> {
    let dispatch = Arc::new(dispatch);
    let make = |stage: &str| -> Transform {
        let d = dispatch.clone();
        let stage = stage.to_string();
        Transform::Closure(Arc::new(move |ctx| {
            Python::attach(|py| {
                let inputs = PyList::new(
                    py,
                    ctx.inputs.iter().map(|p| p.to_string_lossy().into_owned()),
                )
                .map_err(|e| e.to_string())?;
                let r = d
                    .call1(
                        py,
                        (
                            stage.as_str(),
                            ctx.input.map(|p| p.to_string_lossy().into_owned()),
                            inputs,
                            ctx.output.to_string_lossy().into_owned(),
                            ctx.relpath,
                        ),
                    )
                    .map_err(|e| format!("the dispatcher failed: {e}"))?;
                if r.is_none(py) {
                    Ok(())
                } else {
                    Err(r
                        .extract::<String>(py)
                        .unwrap_or_else(|_| "the item failed".to_string()))
                }
            })
        }))
    };
    let p = spec(root, state, stages_json, &make)?;
    let opts = RunOptions {
        stage: only,
        jobs: jobs.clamp(1, JOBS_MAX),
        force,
        rehash: false,
    };
    let report = py
        .detach(|| p.run(&opts, &highwater_files::NoProgress))
        .map_err(err)?;
    let mut v = serde_json::to_value(&report).map_err(|e| bad(e.to_string()))?;
    v["recipes"] = recipes(&p);
    Ok(v.to_string())
}

/// The recipe id of each stage, as JSON.
#[pyfunction]
#[pyo3(signature = (root, state, stages_json))]
fn recipe_ids(root: &str, state: Option<&str>, stages_json: &str) -> PyResult<String> {
    let p = spec(root, state, stages_json, &plan_only)?;
    Ok(recipes(&p).to_string())
}

/// `highwater status --json` of these stages.
#[pyfunction]
#[pyo3(signature = (root, state, stages_json))]
fn status(py: Python<'_>, root: &str, state: Option<&str>, stages_json: &str) -> PyResult<String> {
    let p = spec(root, state, stages_json, &plan_only)?;
    let v = py.detach(|| p.status()).map_err(err)?;
    Ok(v.to_string())
}

/// `highwater export --json`: every entry of the state, as JSON.
#[pyfunction]
#[pyo3(signature = (root, state, stages_json))]
fn export(py: Python<'_>, root: &str, state: Option<&str>, stages_json: &str) -> PyResult<String> {
    let p = spec(root, state, stages_json, &plan_only)?;
    let v = py.detach(|| p.export()).map_err(err)?;
    Ok(v.to_string())
}

/// The `highwater` command line, in this process; argv[0] is the program.
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.detach(|| highwater_cli::main_from(argv))
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(recipe_ids, m)?)?;
    m.add_function(wrap_pyfunction!(status, m)?)?;
    m.add_function(wrap_pyfunction!(export, m)?)?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    m.add("HighwaterError", m.py().get_type::<HighwaterError>())?;
    m.add("GuardError", m.py().get_type::<GuardError>())?;
    m.add("ENGINE_VERSION", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
