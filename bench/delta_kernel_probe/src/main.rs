//! Issue 46 probe: what `delta_kernel` 0.30.1 (default engine, arrow 60) does
//! on a Delta table another engine maintains.
//!
//! usage: probe <table-path> [--write] [--amount N] [--id N]
//!
//! (a) loads the latest snapshot and prints version, protocol, schema, active
//!     files and rows (a full kernel scan, deletion vectors applied);
//! (b) with --write: one kernel transaction that writes one small parquet
//!     file with the default engine (one row: id = --id, amount = --amount,
//!     other columns filled per type) and commits one `add`.
//!
//! The last line is `RESULT {json}` for run.py. Exit 0 whatever the kernel
//! decided; exit 1 only if the probe itself failed (bad arguments).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use delta_kernel::arrow::array::{
    ArrayRef, BooleanArray, Date32Array, Float32Array, Float64Array, Int16Array, Int32Array,
    Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use delta_kernel::committer::FileSystemCommitter;
use delta_kernel::engine::arrow_conversion::TryIntoArrow;
use delta_kernel::engine::arrow_data::{ArrowEngineData, EngineDataArrowExt};
use delta_kernel::expressions::Scalar;
use delta_kernel::schema::{DataType, PrimitiveType};
use delta_kernel::transaction::{CommitResult, UpdateTableOperation};
use delta_kernel::{Engine, Snapshot};
use delta_kernel_default_engine::storage::store_from_url;
use delta_kernel_default_engine::executor::tokio::TokioBackgroundExecutor;
use delta_kernel_default_engine::executor::TaskExecutor;
use delta_kernel_default_engine::{DefaultEngine, DefaultEngineBuilder};
use serde_json::{json, Value};

struct Args {
    path: String,
    write: bool,
    amount: i64,
    id: i64,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut args = Args { path: String::new(), write: false, amount: 7, id: 990_001 };
    while let Some(a) = it.next() {
        match a.as_str() {
            "--write" => args.write = true,
            "--amount" => {
                args.amount = it.next().ok_or("--amount N")?.parse().map_err(|e| format!("{e}"))?
            }
            "--id" => args.id = it.next().ok_or("--id N")?.parse().map_err(|e| format!("{e}"))?,
            p if !p.starts_with("--") && args.path.is_empty() => args.path = p.to_string(),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.path.is_empty() {
        return Err("usage: probe <table-path> [--write] [--amount N] [--id N]".into());
    }
    Ok(args)
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let mut result = json!({ "table": args.path });
    probe(&args, &mut result);
    println!("RESULT {}", result);
}

fn probe(args: &Args, out: &mut Value) {
    let abs = std::fs::canonicalize(&args.path)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| args.path.clone());
    let url = match delta_kernel::try_parse_uri(&abs) {
        Ok(u) => u,
        Err(e) => {
            out["read_error"] = json!(format!("{e}"));
            return;
        }
    };
    let store = match store_from_url(&url) {
        Ok(s) => s,
        Err(e) => {
            out["read_error"] = json!(format!("{e}"));
            return;
        }
    };
    let engine = Arc::new(DefaultEngineBuilder::new(store).build());

    // (a) read
    let t = Instant::now();
    let snapshot = match Snapshot::builder_for(url.clone()).build(engine.as_ref()) {
        Ok(s) => s,
        Err(e) => {
            println!("snapshot: REFUSED/FAILED: {e}");
            out["read_ok"] = json!(false);
            out["read_error"] = json!(format!("{e}"));
            return;
        }
    };
    let tc = snapshot.table_configuration();
    let protocol = tc.protocol();
    let feats = |f: Option<&[delta_kernel::table_features::TableFeature]>| -> Vec<String> {
        f.map(|v| v.iter().map(|x| x.to_string()).collect()).unwrap_or_default()
    };
    let partition_columns: Vec<String> = tc.metadata().partition_columns().to_vec();
    println!("version: {}", snapshot.version());
    println!(
        "protocol: ({}, {}) reader_features={:?} writer_features={:?}",
        protocol.min_reader_version(),
        protocol.min_writer_version(),
        feats(protocol.reader_features()),
        feats(protocol.writer_features())
    );
    println!("partition columns: {partition_columns:?}");
    println!("schema: {}", compact_schema(&snapshot));
    out["version"] = json!(snapshot.version());
    out["protocol"] = json!({
        "min_reader": protocol.min_reader_version(),
        "min_writer": protocol.min_writer_version(),
        "reader_features": feats(protocol.reader_features()),
        "writer_features": feats(protocol.writer_features()),
    });
    out["partition_columns"] = json!(partition_columns);
    out["schema"] = json!(compact_schema(&snapshot));

    match scan(&snapshot, engine.clone()) {
        Ok((files, rows)) => {
            println!("active files: {files}, rows: {rows} ({:.0?})", t.elapsed());
            out["read_ok"] = json!(true);
            out["files"] = json!(files);
            out["rows"] = json!(rows);
        }
        Err(e) => {
            println!("scan: FAILED: {e}");
            out["read_ok"] = json!(false);
            out["read_error"] = json!(format!("{e}"));
        }
    }

    if !args.write {
        return;
    }
    // (b) write: one append
    match append(&snapshot, &engine, &partition_columns, args) {
        Ok(v) => {
            println!("write: COMMITTED version {v}");
            out["write"] = json!("committed");
            out["write_version"] = json!(v);
        }
        Err((stage, e)) => {
            println!("write: REFUSED at {stage}: {e}");
            out["write"] = json!("refused");
            out["write_stage"] = json!(stage);
            out["write_error"] = json!(e);
        }
    }
}

fn compact_schema(snapshot: &Snapshot) -> String {
    snapshot
        .schema()
        .fields()
        .map(|f| format!("{}:{}{}", f.name(), f.data_type(), if f.is_nullable() { "" } else { " not null" }))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Number of active files (from the log) and of rows (read, DVs applied).
fn scan(
    snapshot: &Arc<Snapshot>,
    engine: Arc<dyn Engine>,
) -> delta_kernel::KernelResult<(usize, usize)> {
    let scan = snapshot.clone().scan_builder().build()?;
    let mut files = 0usize;
    for meta in scan.scan_metadata(engine.as_ref())? {
        let meta = meta?;
        files += meta.scan_files.selection_vector().iter().filter(|b| **b).count()
            + meta
                .scan_files
                .data()
                .len()
                .saturating_sub(meta.scan_files.selection_vector().len());
    }
    let mut rows = 0usize;
    for batch in scan.execute(engine)? {
        rows += batch?.try_into_record_batch()?.num_rows();
    }
    Ok((files, rows))
}

type Stage = &'static str;

fn append(
    snapshot: &Arc<Snapshot>,
    engine: &Arc<DefaultEngine<TokioBackgroundExecutor>>,
    partition_columns: &[String],
    args: &Args,
) -> Result<u64, (Stage, String)> {
    let mut txn = snapshot
        .clone()
        .update_table(UpdateTableOperation::Write, "highwater-delta-kernel-probe/0.1", true)
        .with_blind_append()
        .build(engine.as_ref(), Box::new(FileSystemCommitter::new()))
        .map_err(|e| ("transaction build", e.to_string()))?;
    let write_state = txn.write_state().map_err(|e| ("write_state", e.to_string()))?;

    // Partition values: the same per-type values as the data columns below.
    let schema = snapshot.schema();
    let mut pvals: HashMap<String, Scalar> = HashMap::new();
    for name in partition_columns {
        let field = schema.field(name).ok_or(("partition values", format!("no column {name}")))?;
        pvals.insert(name.clone(), scalar_for(name, field.data_type(), args)?);
    }
    // An unpartitioned table takes no partition values at all (an empty map
    // is refused: "table is not partitioned").
    let mut builder = write_state.write_context_builder();
    if !pvals.is_empty() {
        builder = builder.with_partition_values(pvals);
    }
    let ctx = builder
        .build()
        .map_err(|e| ("write context", e.to_string()))?;

    let logical = ctx.logical_data_schema().clone();
    let arrow_schema: delta_kernel::arrow::datatypes::Schema =
        logical.as_ref().try_into_arrow().map_err(|e| ("arrow schema", e.to_string()))?;
    let mut columns: Vec<ArrayRef> = Vec::new();
    for f in logical.fields() {
        columns.push(array_for(f.name(), f.data_type(), args)?);
    }
    let batch = RecordBatch::try_new(Arc::new(arrow_schema), columns)
        .map_err(|e| ("record batch", e.to_string()))?;

    // write_parquet is async and the executor wants a 'static future.
    let (eng, ctx) = (engine.clone(), Arc::new(ctx));
    let data = ArrowEngineData::new(batch);
    let add = TokioBackgroundExecutor::new()
        .block_on(async move { eng.write_parquet(&data, &ctx).await })
        .map_err(|e| ("write_parquet", e.to_string()))?;
    txn.add_files(add);
    match txn.commit(engine.as_ref()).map_err(|e| ("commit", e.to_string()))? {
        CommitResult::Committed(c) => Ok(c.commit_version()),
        CommitResult::Conflicted(c) => {
            Err(("commit", format!("conflicted with version {}", c.conflict_version())))
        }
        CommitResult::Retryable(r) => Err(("commit", format!("retryable: {}", r.error))),
    }
}

fn scalar_for(name: &str, dt: &DataType, args: &Args) -> Result<Scalar, (Stage, String)> {
    let n = value_for(name, args);
    Ok(match dt {
        DataType::Primitive(p) => match p {
            PrimitiveType::Long => Scalar::Long(n),
            PrimitiveType::Integer => Scalar::Integer(n as i32),
            PrimitiveType::Short => Scalar::Short(n as i16),
            PrimitiveType::Double => Scalar::Double(n as f64),
            PrimitiveType::Float => Scalar::Float(n as f32),
            PrimitiveType::String => Scalar::String(format!("probe-{n}")),
            PrimitiveType::Boolean => Scalar::Boolean(true),
            other => return Err(("partition values", format!("type {other} not handled"))),
        },
        other => return Err(("partition values", format!("type {other} not handled"))),
    })
}

fn value_for(name: &str, args: &Args) -> i64 {
    match name {
        "id" | "value" => args.id,
        "amount" => args.amount,
        _ => 1,
    }
}

fn array_for(name: &str, dt: &DataType, args: &Args) -> Result<ArrayRef, (Stage, String)> {
    let n = value_for(name, args);
    Ok(match dt {
        DataType::Primitive(p) => match p {
            PrimitiveType::Long => Arc::new(Int64Array::from(vec![n])),
            PrimitiveType::Integer => Arc::new(Int32Array::from(vec![n as i32])),
            PrimitiveType::Short => Arc::new(Int16Array::from(vec![n as i16])),
            PrimitiveType::Double => Arc::new(Float64Array::from(vec![n as f64])),
            PrimitiveType::Float => Arc::new(Float32Array::from(vec![n as f32])),
            PrimitiveType::String => Arc::new(StringArray::from(vec![format!("probe-{n}")])),
            PrimitiveType::Boolean => Arc::new(BooleanArray::from(vec![true])),
            PrimitiveType::Date => Arc::new(Date32Array::from(vec![20_000])),
            PrimitiveType::Timestamp => Arc::new(
                TimestampMicrosecondArray::from(vec![1_700_000_000_000_000]).with_timezone("UTC"),
            ),
            PrimitiveType::TimestampNtz => {
                Arc::new(TimestampMicrosecondArray::from(vec![1_700_000_000_000_000]))
            }
            other => return Err(("data", format!("type {other} not handled"))),
        },
        other => return Err(("data", format!("type {other} not handled"))),
    })
}
