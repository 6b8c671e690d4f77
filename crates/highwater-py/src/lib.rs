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

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use highwater_core::plan::Reason;
use highwater_files::{OnDelete, Pipeline, PipelineSpec, RunOptions, StageSpec, Transform};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
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

/// Nesting of a declaration, whatever the caller passes: a deeper (or
/// cyclic) value is refused, not followed until the stack runs out.
const DEPTH_MAX: usize = 64;

/// A declaration from Python (dicts, lists, tuples, strings, numbers,
/// booleans, None) as a JSON value: the same value `json.loads(json.dumps(x))`
/// gives, so a recipe id does not depend on the way it crossed. Taken as
/// objects, not as JSON text, so that a plan does not import `json` (issue
/// 22: a no-change plan counts the interpreter's start).
fn to_json(v: &Bound<'_, PyAny>, depth: usize) -> PyResult<serde_json::Value> {
    use serde_json::Value;
    if depth > DEPTH_MAX {
        return Err(bad(format!(
            "a stage declaration is nested deeper than {DEPTH_MAX} levels (or refers to itself)"
        )));
    }
    if v.is_none() {
        return Ok(Value::Null);
    }
    // `bool` before `int`: in Python a bool is an int.
    if let Ok(b) = v.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if let Ok(i) = v.cast::<PyInt>() {
        if let Ok(n) = i.extract::<i64>() {
            return Ok(Value::from(n));
        }
        if let Ok(n) = i.extract::<u64>() {
            return Ok(Value::from(n));
        }
        return Err(bad(format!(
            "a stage declaration holds the integer {i}, which is out of range"
        )));
    }
    if let Ok(f) = v.cast::<PyFloat>() {
        let x = f.value();
        return serde_json::Number::from_f64(x)
            .map(Value::Number)
            .ok_or_else(|| {
                bad(format!(
                    "a stage declaration holds {x}, which JSON cannot hold"
                ))
            });
    }
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(Value::String(s.to_str()?.to_string()));
    }
    if let Ok(d) = v.cast::<PyDict>() {
        let mut m = serde_json::Map::new();
        for (k, x) in d.iter() {
            let k = k.cast::<PyString>().map_err(|_| {
                bad(format!(
                    "a stage declaration has the key {k:?}; keys must be strings"
                ))
            })?;
            m.insert(k.to_str()?.to_string(), to_json(&x, depth + 1)?);
        }
        return Ok(Value::Object(m));
    }
    if let Ok(l) = v.cast::<PyList>() {
        return l
            .iter()
            .map(|x| to_json(&x, depth + 1))
            .collect::<PyResult<_>>()
            .map(Value::Array);
    }
    if let Ok(t) = v.cast::<PyTuple>() {
        return t
            .iter()
            .map(|x| to_json(&x, depth + 1))
            .collect::<PyResult<_>>()
            .map(Value::Array);
    }
    Err(bad(format!(
        "a stage declaration holds a {}, which is not a dict, list, string, number, boolean or None",
        v.get_type().name()?
    )))
}

/// A JSON value as Python objects (what `json.loads` would give).
fn to_py<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value;
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.into_pyobject(py)?.into_any(),
            (_, Some(u), _) => u.into_pyobject(py)?.into_any(),
            (_, _, Some(f)) => PyFloat::new(py, f).into_any(),
            _ => {
                return Err(bad(format!(
                    "the engine returned the number {n}, which Python cannot hold"
                )))
            }
        },
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(a) => {
            let l = PyList::empty(py);
            for x in a {
                l.append(to_py(py, x)?)?;
            }
            l.into_any()
        }
        Value::Object(m) => {
            let d = PyDict::new(py);
            for (k, x) in m {
                d.set_item(k, to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
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
    // A table of inputs names a source's landed windows (issue 49).
    let items = match &v["inputs"] {
        serde_json::Value::Object(_) => Some(
            highwater_files::inputs::InputsSpec::from_json(&v["inputs"])
                .map_err(|m| bad(format!("stage `{name}`: {m}")))?,
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
        .ok_or_else(|| bad(format!("stage `{name}`: `output` must be a string")))?;
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
            return Err(bad(format!(
                "stage `{name}`: on_delete = {o:?}; use \"remove\" or \"keep\""
            )))
        }
    }
    // `compare=` (issue 49): as `compare` in highwater.toml.
    if !v["compare"].is_null() {
        s.compare = highwater_files::compare::parse_spec_json(&v["compare"])
            .map_err(|e| bad(format!("stage `{name}`: compare: {e}")))?;
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
    stages: &Bound<'_, PyAny>,
    make: &dyn Fn(&str) -> Transform,
) -> PyResult<Pipeline> {
    let stages = to_json(stages, 0)?;
    let mut p = PipelineSpec::new(PathBuf::from(root));
    if let Some(s) = state {
        p.state = PathBuf::from(s);
    }
    let list = stages
        .as_array()
        .ok_or_else(|| bad("stage declarations must be a list".into()))?;
    for v in list {
        let name = v["name"].as_str().unwrap_or_default();
        p.stages.push(stage_from_json(v, make(name))?);
    }
    // Stages over a source's windows (issue 49) name the config that
    // declares the source: its [sources] and [storage] are read from it.
    if let Some(cfg) = list.iter().find_map(|v| v["sources_from"].as_str()) {
        let root = PathBuf::from(root);
        let path = root.join(cfg);
        let c = highwater_files::config::load(&path).map_err(err)?;
        p.sources = c.sources;
        p.storage = c.storage;
        p.providers.landed = Some(Arc::new(highwater_cli::landed::IngestLanded::new(
            &p, &path, &root,
        )));
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

/// The plan of every (or one) stage: per stage its recipe id,
/// counts and changed items with their reasons.
#[pyfunction]
#[pyo3(signature = (root, state, stages, only=None, rehash=false))]
fn plan<'py>(
    py: Python<'py>,
    root: &str,
    state: Option<&str>,
    stages: &Bound<'_, PyAny>,
    only: Option<&str>,
    rehash: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let p = spec(root, state, stages, &plan_only)?;
    let (plans, last) = py
        .detach(|| -> Result<_, highwater_files::FilesError> {
            let plans = p.plan(only, rehash)?;
            // The recipe each stage's last run recorded (id and config),
            // from the state store, so that a changed code recipe is named
            // by its parts. Read only when some item re-runs for its
            // recipe: a no-change plan does not open the store again.
            let last: std::collections::BTreeMap<String, serde_json::Value> = if plans
                .iter()
                .any(|s| s.changed.iter().any(|c| c.reason == Reason::Recipe))
            {
                p.open_store()?
                    .last_runs()?
                    .into_iter()
                    .map(|r| (r.stage, r.summary["recipe"].clone()))
                    .collect()
            } else {
                Default::default()
            };
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
                    "detail": s.details.get(&c.item),
                })).collect::<Vec<_>>(),
                "held": s.held,
                // Unchanged: bytes changed, data did not (issue 49).
                "layout": s.layout.iter().map(|i| serde_json::json!({
                    "input": i, "reason": "layout",
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    to_py(py, &serde_json::json!({ "stages": stages }))
}

/// Runs every (or one) stage. `dispatch(stage, input, inputs, output,
/// relpath)` runs one item and returns None, or the error (the traceback)
/// as a string. Returns the run report.
#[pyfunction]
#[pyo3(signature = (root, state, stages, dispatch, jobs, force=false, only=None))]
#[allow(clippy::too_many_arguments)]
fn run<'py>(
    py: Python<'py>,
    root: &str,
    state: Option<&str>,
    stages: &Bound<'_, PyAny>,
    dispatch: Py<PyAny>,
    jobs: usize,
    force: bool,
    only: Option<String>,
) -> PyResult<Bound<'py, PyAny>> {
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
    let p = spec(root, state, stages, &make)?;
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
    to_py(py, &v)
}

/// The recipe id of each stage.
#[pyfunction]
#[pyo3(signature = (root, state, stages))]
fn recipe_ids<'py>(
    py: Python<'py>,
    root: &str,
    state: Option<&str>,
    stages: &Bound<'_, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let p = spec(root, state, stages, &plan_only)?;
    to_py(py, &recipes(&p))
}

/// `highwater status --json` of these stages, as Python objects.
#[pyfunction]
#[pyo3(signature = (root, state, stages))]
fn status<'py>(
    py: Python<'py>,
    root: &str,
    state: Option<&str>,
    stages: &Bound<'_, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let p = spec(root, state, stages, &plan_only)?;
    let v = py.detach(|| p.status()).map_err(err)?;
    to_py(py, &v)
}

/// `highwater export --json`: every entry of the state, as Python objects.
#[pyfunction]
#[pyo3(signature = (root, state, stages))]
fn export<'py>(
    py: Python<'py>,
    root: &str,
    state: Option<&str>,
    stages: &Bound<'_, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let p = spec(root, state, stages, &plan_only)?;
    let v = py.detach(|| p.export()).map_err(err)?;
    to_py(py, &v)
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
