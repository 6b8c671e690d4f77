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
use highwater_files::{Pipeline, PipelineSpec, RunOptions, Transform};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

// The package's own exceptions (python/highwater/errors.py, issue 48):
// raised here as those very classes, so that they carry the package's name
// and pickle.
pyo3::import_exception!(highwater.errors, HighwaterError);
pyo3::import_exception!(highwater.errors, GuardError);

/// Jobs per run, whatever the caller asks for (the engine caps it again).
const JOBS_MAX: usize = 1024;

fn err(e: highwater_files::FilesError) -> PyErr {
    match e {
        // The engine's message is the CLI's; a Python caller passes a
        // keyword, not a flag.
        highwater_files::FilesError::Guard { .. } => {
            GuardError::new_err(e.to_string().replace("--force", "force=True"))
        }
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
        p.stages
            .push(highwater_files::declared::stage_from_json(v, make(name)).map_err(bad)?);
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

/// Records the declarations beside the state, for the CLI's `plan`,
/// `status` and `deps` (issue 48); written only when they change.
fn record(p: &Pipeline, stages: &Bound<'_, PyAny>) -> PyResult<()> {
    let decls = to_json(stages, 0)?;
    let decls = decls.as_array().cloned().unwrap_or_default();
    let path = highwater_files::declared::record_path(p.state_path());
    highwater_files::declared::record(&path, &decls).map_err(err)
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
    record(&p, stages)?;
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
                    "dependency": c.dependency,
                    // The input's digests now (what a run would record;
                    // None for a deleted item): Dagster's data version of
                    // the stage's inputs (issue 48).
                    "digests": c.observation.as_ref().map(|o| o.digests.to_vec()),
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

/// A run's stop switch (issue 48): `set()` (a Ctrl-C in the calling
/// thread) stops the engine from starting any further item or stage; the
/// items running finish and are recorded.
#[pyclass(frozen)]
struct Cancel {
    flag: Arc<AtomicBool>,
}

#[pymethods]
impl Cancel {
    #[new]
    fn new() -> Self {
        Cancel {
            flag: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Stops the run at the next item.
    fn set(&self) {
        self.flag.store(true, Ordering::SeqCst);
    }

    /// Whether `set()` was called.
    fn is_set(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }
}

/// The engine's progress sink for a Python run: the stop switch, and a
/// progress bar on stderr when stderr is a terminal (issue 48; nothing
/// otherwise: a library prints nothing unasked, and the Python side logs
/// each stage's outcome to the `highwater` logger).
struct Stop {
    flag: Option<Arc<AtomicBool>>,
    bar: std::sync::Mutex<Option<indicatif::ProgressBar>>,
    tty: bool,
}

impl highwater_files::Progress for Stop {
    fn stage_start(&self, stage: &str, items: usize) {
        if !self.tty || items == 0 {
            return;
        }
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(items as u64),
            indicatif::ProgressDrawTarget::stderr(),
        );
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{prefix} [{bar:30}] {pos}/{len} {elapsed} eta {eta}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(stage.to_string());
        *self.bar.lock().unwrap_or_else(|e| e.into_inner()) = Some(bar);
    }

    fn item_done(&self, _stage: &str, _item: &str, _ok: bool) {
        if let Some(b) = self.bar.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            b.inc(1);
        }
    }

    fn stage_done(&self, _stage: &str) {
        if let Some(b) = self.bar.lock().unwrap_or_else(|e| e.into_inner()).take() {
            b.finish_and_clear();
        }
    }

    fn cancelled(&self) -> bool {
        self.flag.as_ref().is_some_and(|f| f.load(Ordering::SeqCst))
    }
}

/// Runs every (or one) stage. `dispatch(stage, input, inputs, output,
/// relpath)` runs one item and returns None, or the error (the traceback)
/// as a string. Returns the run report.
#[pyfunction]
#[pyo3(signature = (root, state, stages, dispatch, jobs, force=false, only=None, cancel=None, items=None))]
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
    cancel: Option<&Bound<'_, Cancel>>,
    items: Option<Vec<String>>,
) -> PyResult<Bound<'py, PyAny>> {
    let stop = Stop {
        flag: cancel.map(|c| c.get().flag.clone()),
        bar: std::sync::Mutex::new(None),
        tty: std::io::IsTerminal::is_terminal(&std::io::stderr()),
    };
    let dispatch = Arc::new(dispatch);
    let make = |stage: &str| -> Transform {
        let d = dispatch.clone();
        let stage = stage.to_string();
        Transform::Closure(Arc::new(move |ctx| {
            let started_ns = highwater_observe::coarse_now_ns();
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
                // None (done), the error as text, or (error or None, paths
                // read, paths written): what the worker's audit hook saw.
                let (error, reads) =
                    match r.extract::<(Option<String>, Vec<String>, Vec<String>)>(py) {
                        Ok((e, read, written)) => (e, Some((read, written))),
                        Err(_) if r.is_none(py) => (None, None),
                        Err(_) => (
                            Some(
                                r.extract::<String>(py)
                                    .unwrap_or_else(|_| "the item failed".to_string()),
                            ),
                            None,
                        ),
                    };
                if let Some((read, written)) = reads {
                    let obs = highwater_observe::Observation {
                        read: read.into_iter().map(PathBuf::from).collect(),
                        written: written.into_iter().map(PathBuf::from).collect(),
                        started_ns,
                        ..Default::default()
                    };
                    if let Ok(mut slot) = ctx.reads.lock() {
                        *slot = Some(obs);
                    }
                }
                match error {
                    None => Ok(()),
                    Some(e) => Err(e),
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
        items: items.map(|v| v.into_iter().collect()),
    };
    let report = py.detach(|| p.run(&opts, &stop)).map_err(err)?;
    record(&p, stages)?;
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

/// `highwater deps STAGE --json`: each item's recorded dependencies (the
/// files its function read) and whether each changed since.
#[pyfunction]
#[pyo3(signature = (root, state, stages, stage))]
fn deps<'py>(
    py: Python<'py>,
    root: &str,
    state: Option<&str>,
    stages: &Bound<'_, PyAny>,
    stage: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let p = spec(root, state, stages, &plan_only)?;
    let v = py.detach(|| p.deps(stage, None)).map_err(err)?;
    to_py(py, &serde_json::json!(v))
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
    m.add_function(wrap_pyfunction!(deps, m)?)?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    m.add("HighwaterError", m.py().get_type::<HighwaterError>())?;
    m.add("GuardError", m.py().get_type::<GuardError>())?;
    m.add_class::<Cancel>()?;
    m.add("ENGINE_VERSION", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
