//! Compaction: the published windows of a period rewritten as a few files
//! near the target size, and swapped in as one folder.
//!
//! A period's windows all lie in one folder of their own
//! ([`SourceSpec::period_dir`], checked at config load). Compaction builds
//! the compacted period in a staging folder beside it, checks it (row
//! count and per-window content digests equal to the inputs'), describes it
//! in `_manifest.json` (`"kind": "compacted"`, each window with its row
//! offset, rows, digest and the token it was published under), and swaps it
//! with the period's folder in one `renameat2(RENAME_EXCHANGE)`. A reader
//! that reads every Parquet file under the output root sees the windows or
//! the compacted period, never both and never neither.
//!
//! The rows of a compacted period are in window order, so each window is a
//! contiguous row range: re-ingesting one window rewrites the period with
//! that range replaced ([`rewrite_period`]), under the same lease.

use crate::digest::RowsDigest;
use crate::error::IngestError;
use crate::publish;
use crate::sink::{FileInfo, ParquetSink, Written};
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};

/// One window inside a compacted period.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PeriodWindow {
    pub start_us: i64,
    pub end_us: i64,
    /// The window's first row in the period's row order.
    pub offset: u64,
    pub rows: u64,
    pub digest: String,
    /// The token the window was published under (its record's token).
    pub token: String,
}

/// A compacted period's `_manifest.json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PeriodManifest {
    pub kind: String,
    pub source: String,
    pub start_us: i64,
    pub end_us: i64,
    pub token: String,
    pub files: Vec<FileInfo>,
    pub rows: u64,
    pub windows: Vec<PeriodWindow>,
}

pub const KIND_COMPACTED: &str = "compacted";

/// The manifest of a compacted period at `dir`, if `dir` holds one.
pub fn read_manifest(dir: &Path) -> Option<PeriodManifest> {
    let text = std::fs::read(dir.join("_manifest.json")).ok()?;
    let m: PeriodManifest = serde_json::from_slice(&text).ok()?;
    (m.kind == KIND_COMPACTED).then_some(m)
}

/// Where one window's rows come from when a period is written.
pub enum Input {
    /// The Parquet files of a window folder (or a window's staging), in
    /// name order.
    Files(PathBuf, Vec<String>),
    /// The next `rows` rows of the period being rewritten.
    Old(u64),
}

/// The rows of a list of files, in order, taken a row range at a time.
struct Rows {
    files: VecDeque<PathBuf>,
    reader: Option<ParquetRecordBatchReader>,
    held: Option<RecordBatch>,
}

fn perr(path: &Path, e: impl ToString) -> IngestError {
    IngestError::Parquet {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Rows per batch read back from Parquet.
const READ_BATCH_ROWS: usize = 65_536;

fn open_reader(path: &Path) -> Result<ParquetRecordBatchReader, IngestError> {
    let f = std::fs::File::open(path).map_err(|e| IngestError::io("reading", path, e))?;
    ParquetRecordBatchReaderBuilder::try_new(f)
        .and_then(|b| b.with_batch_size(READ_BATCH_ROWS).build())
        .map_err(|e| perr(path, e))
}

impl Rows {
    fn new(files: impl IntoIterator<Item = PathBuf>) -> Rows {
        Rows {
            files: files.into_iter().collect(),
            reader: None,
            held: None,
        }
    }

    fn next_batch(&mut self) -> Result<Option<RecordBatch>, IngestError> {
        if let Some(b) = self.held.take() {
            return Ok(Some(b));
        }
        loop {
            if let Some(r) = self.reader.as_mut() {
                match r.next() {
                    Some(b) => {
                        return b
                            .map(Some)
                            .map_err(|e| perr(Path::new("(a compacted period)"), e))
                    }
                    None => self.reader = None,
                }
            }
            let Some(p) = self.files.pop_front() else {
                return Ok(None);
            };
            self.reader = Some(open_reader(&p)?);
        }
    }

    /// Passes the next `n` rows (all that remain for `u64::MAX`) to `f`.
    fn take(
        &mut self,
        mut n: u64,
        mut f: impl FnMut(RecordBatch) -> Result<(), IngestError>,
    ) -> Result<u64, IngestError> {
        let mut taken = 0;
        while n > 0 {
            let Some(b) = self.next_batch()? else { break };
            let len = b.num_rows() as u64;
            if len <= n {
                n -= len;
                taken += len;
                f(b)?;
            } else {
                f(b.slice(0, n as usize))?;
                self.held = Some(b.slice(n as usize, (len - n) as usize));
                taken += n;
                n = 0;
            }
        }
        Ok(taken)
    }
}

/// The Parquet files of a folder, by name.
pub fn parquet_files(dir: &Path) -> Result<Vec<String>, IngestError> {
    let rd = std::fs::read_dir(dir).map_err(|e| IngestError::io("listing", dir, e))?;
    let mut names: Vec<String> = rd
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".parquet") && !n.starts_with('.'))
        .collect();
    names.sort();
    Ok(names)
}

/// The schema of the first of `files`.
pub fn schema_of(path: &Path) -> Result<SchemaRef, IngestError> {
    let f = std::fs::File::open(path).map_err(|e| IngestError::io("reading", path, e))?;
    let b = ParquetRecordBatchReaderBuilder::try_new(f).map_err(|e| perr(path, e))?;
    Ok(b.schema().clone())
}

/// `batch` in the period's `schema`: its columns by name, each of the same
/// type or one it widens into, and nulls for the period's columns it lacks ([`crate::sink::widens`]), cast. `None`
/// when it cannot be, with what is wrong.
pub fn widen_batch(batch: RecordBatch, schema: &SchemaRef) -> Result<RecordBatch, String> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float32Type, Int16Type, Int32Type};
    use arrow_array::{ArrayRef, Float64Array, Int32Array, Int64Array};
    use arrow_schema::DataType as D;
    if batch.schema().fields() == schema.fields() {
        return Ok(batch);
    }
    let names = |s: &arrow_schema::Schema| -> Vec<String> {
        s.fields().iter().map(|f| f.name().clone()).collect()
    };
    // Columns are matched by name: every column of the batch must be in
    // the period's schema (a dropped column does not widen), and a column
    // the period has and the batch lacks (added later, issue 21) is null.
    let bs = batch.schema();
    if let Some(gone) = bs
        .fields()
        .iter()
        .find(|f| schema.field_with_name(f.name()).is_err())
    {
        return Err(format!(
            "column `{}` of its files is not in the period's schema (its columns are {} where the period's are {})",
            gone.name(),
            names(&bs).join(", "),
            names(schema).join(", ")
        ));
    }
    let mut cols: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for f in schema.fields().iter() {
        let Some(c) = batch.column_by_name(f.name()) else {
            if !f.is_nullable() {
                return Err(format!(
                    "column `{}` is not in its files and the period's schema does not allow nulls",
                    f.name()
                ));
            }
            cols.push(arrow_array::new_null_array(f.data_type(), batch.num_rows()));
            continue;
        };
        let c: ArrayRef = match (c.data_type(), f.data_type()) {
            (a, b) if a == b => c.clone(),
            (D::Int16, D::Int32) => std::sync::Arc::new(
                c.as_primitive::<Int16Type>()
                    .iter()
                    .map(|v| v.map(i32::from))
                    .collect::<Int32Array>(),
            ),
            (D::Int16, D::Int64) => std::sync::Arc::new(
                c.as_primitive::<Int16Type>()
                    .iter()
                    .map(|v| v.map(i64::from))
                    .collect::<Int64Array>(),
            ),
            (D::Int32, D::Int64) => std::sync::Arc::new(
                c.as_primitive::<Int32Type>()
                    .iter()
                    .map(|v| v.map(i64::from))
                    .collect::<Int64Array>(),
            ),
            (D::Float32, D::Float64) => std::sync::Arc::new(
                c.as_primitive::<Float32Type>()
                    .iter()
                    .map(|v| v.map(f64::from))
                    .collect::<Float64Array>(),
            ),
            (a, b) => {
                return Err(format!(
                    "column `{}` is {a} in its files where the period's is {b}, which it does not widen into",
                    f.name()
                ))
            }
        };
        cols.push(c);
    }
    RecordBatch::try_new(schema.clone(), cols).map_err(|e| e.to_string())
}

/// The schema a period of windows with `schemas` (in window order) is
/// written in: the newest, when every other widens into it column by
/// column; otherwise the first pair that does not, by index.
pub fn period_schema(schemas: &[SchemaRef]) -> Result<SchemaRef, (usize, usize, String)> {
    let last = schemas.len() - 1;
    let target = &schemas[last];
    for (i, s) in schemas.iter().enumerate() {
        let empty = RecordBatch::new_empty(s.clone());
        if let Err(why) = widen_batch(empty, target) {
            return Err((i, last, why));
        }
    }
    Ok(target.clone())
}

/// One window to write into a period, with the digest its rows must have
/// (`None`: take the inputs' as they are, for windows recorded before
/// digests were).
pub struct WindowIn {
    pub start_us: i64,
    pub end_us: i64,
    pub token: String,
    pub input: Input,
    pub expect: Option<String>,
    /// `false`: the rows are read (to keep the old period's stream in
    /// step) and dropped: the window being replaced.
    pub keep: bool,
}

/// Writes the windows, in order, into `staging` as files near
/// `target_bytes`, then reads them back and checks that each window's row
/// range has the rows (count and content digest) it had going in.
/// `old` is the folder of the period being rewritten, for `Input::Old`.
pub fn write_period(
    staging: &Path,
    schema: SchemaRef,
    windows: Vec<WindowIn>,
    old: Option<&Path>,
    target_bytes: u64,
) -> Result<(Written, Vec<PeriodWindow>), IngestError> {
    let mut old_rows = match old {
        Some(dir) => Rows::new(parquet_files(dir)?.into_iter().map(|n| dir.join(n))),
        None => Rows::new(Vec::new()),
    };
    // A Delta table's files (they carry the window stamp) get Delta's
    // per-file statistics; a period folder's do not need them.
    let extras = crate::sink::Extras {
        stamp: None,
        stats: schema.field_with_name(crate::delta::WINDOW_COLUMN).is_ok(),
    };
    let mut sink = ParquetSink::with_schema_extras(
        staging,
        schema.clone(),
        READ_BATCH_ROWS,
        usize::MAX,
        target_bytes,
        "",
        &[],
        extras,
    );
    let mut out = Vec::with_capacity(windows.len());
    let mut offset = 0u64;
    for w in windows {
        // `d_in` over the rows as published (checked against the
        // window's digest), `d` over the rows as written: they differ
        // only where a column was widened.
        let mut d = RowsDigest::default();
        let mut d_in = RowsDigest::default();
        let keep = w.keep;
        let start_us = w.start_us;
        let mut push = |b: RecordBatch| {
            if !keep {
                return Ok(());
            }
            d_in.add_batch(&b);
            let b = if b.schema().fields() == schema.fields() {
                d.add_batch(&b);
                b
            } else {
                let c = widen_batch(b, &schema).map_err(|why| IngestError::Parquet {
                    path: staging.to_path_buf(),
                    message: format!(
                        "the window starting {}: {why}",
                        highwater_core::window::format_rfc3339(start_us)
                    ),
                })?;
                d.add_batch(&c);
                c
            };
            sink.push_batch(b)
        };
        match &w.input {
            Input::Files(dir, names) => {
                Rows::new(names.iter().map(|n| dir.join(n))).take(u64::MAX, &mut push)?;
            }
            Input::Old(n) => {
                let got = old_rows.take(*n, &mut push)?;
                if got != *n {
                    return Err(IngestError::Parquet {
                        path: old.unwrap_or(staging).to_path_buf(),
                        message: format!(
                            "the compacted period holds {got} rows where its manifest says {n} for the window starting {}",
                            highwater_core::window::format_rfc3339(w.start_us)
                        ),
                    });
                }
            }
        }
        if !keep {
            continue;
        }
        let digest = d.render();
        let published = d_in.render();
        if let Some(e) = w.expect.as_deref().filter(|e| *e != published) {
            return Err(IngestError::Parquet {
                path: match &w.input {
                    Input::Files(dir, _) => dir.clone(),
                    Input::Old(_) => old.unwrap_or(staging).to_path_buf(),
                },
                message: format!(
                    "the window starting {} reads back as {published} where it was published as {e}; its files changed since. Re-ingest it (`ingest --window`) before compacting",
                    highwater_core::window::format_rfc3339(w.start_us)
                ),
            });
        }
        out.push(PeriodWindow {
            start_us: w.start_us,
            end_us: w.end_us,
            offset,
            rows: d.rows,
            digest,
            token: w.token,
        });
        offset += d.rows;
    }
    let written = sink.finish()?;
    // The check, on what was written: each window's range, read back.
    let mut back = Rows::new(written.files.iter().map(|f| staging.join(&f.path)));
    for w in &out {
        let mut d = RowsDigest::default();
        back.take(w.rows, |b| {
            d.add_batch(&b);
            Ok(())
        })?;
        if d.render() != w.digest {
            return Err(IngestError::Parquet {
                path: staging.to_path_buf(),
                message: format!(
                    "the compacted rows of the window starting {} read back as {} where {} went in; nothing was swapped",
                    highwater_core::window::format_rfc3339(w.start_us),
                    d.render(),
                    w.digest
                ),
            });
        }
    }
    if back.take(u64::MAX, |_| Ok(()))? != 0 || written.rows != offset {
        return Err(IngestError::Parquet {
            path: staging.to_path_buf(),
            message: format!(
                "the compacted period holds {} rows where {offset} went in; nothing was swapped",
                written.rows
            ),
        });
    }
    Ok((written, out))
}

/// Seals the staged period and swaps it with `period_dir` (which exists:
/// it holds the windows or the previous compaction).
pub fn seal_and_swap(
    staging: &Path,
    period_dir: &Path,
    manifest: &PeriodManifest,
    before_swap: impl FnOnce() -> Result<bool, IngestError>,
) -> Result<bool, IngestError> {
    publish::seal(
        staging,
        &serde_json::to_value(manifest).expect("a manifest serializes"),
    )?;
    if !before_swap()? {
        let _ = std::fs::remove_dir_all(staging);
        return Ok(false);
    }
    publish::swap_in(staging, period_dir)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{ArrayRef, Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    use proptest::prelude::*;
    use std::sync::Arc;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("note", DataType::Utf8, true),
        ]))
    }

    /// Writes `ids` as a window folder of files of `per_file` rows.
    fn window_dir(dir: &Path, ids: &[i64], per_file: usize) -> Input {
        std::fs::create_dir_all(dir).unwrap();
        let mut sink =
            ParquetSink::with_schema(dir, schema(), 7, per_file.max(1), u64::MAX, "", &[]);
        for part in ids.chunks(5) {
            let b = RecordBatch::try_new(
                schema(),
                vec![
                    Arc::new(Int64Array::from(part.to_vec())) as ArrayRef,
                    Arc::new(StringArray::from(
                        part.iter().map(|i| format!("n{i}")).collect::<Vec<_>>(),
                    )) as ArrayRef,
                ],
            )
            .unwrap();
            sink.push_batch(b).unwrap();
        }
        let w = sink.finish().unwrap();
        Input::Files(
            dir.to_path_buf(),
            w.files.iter().map(|f| f.path.clone()).collect(),
        )
    }

    fn ids_of(dir: &Path, files: &[FileInfo]) -> Vec<i64> {
        let mut out = Vec::new();
        Rows::new(files.iter().map(|f| dir.join(&f.path)))
            .take(u64::MAX, |b| {
                let a = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                out.extend(a.values().iter().copied());
                Ok(())
            })
            .unwrap();
        out
    }

    fn windows_in(root: &Path, tag: &str, windows: &[Vec<i64>], per_file: usize) -> Vec<WindowIn> {
        windows
            .iter()
            .enumerate()
            .map(|(i, ids)| WindowIn {
                start_us: i as i64,
                end_us: i as i64 + 1,
                token: format!("t{i}"),
                input: window_dir(&root.join(format!("{tag}{i}")), ids, per_file),
                expect: None,
                keep: true,
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Incremental equals rebuild: rewriting a compacted period with
        /// one window replaced gives the rows, files' content and per-window
        /// digests that compacting the changed windows from scratch gives.
        #[test]
        fn rewriting_one_window_equals_compacting_from_scratch(
            sizes in proptest::collection::vec(0usize..40, 1..6),
            per_file in 1usize..30,
            replaced in 0usize..6,
            new_len in 0usize..50,
            target in 200u64..5000,
        ) {
            let tmp = tempfile::tempdir().unwrap();
            let root = tmp.path();
            let mut next = 0i64;
            let mut windows: Vec<Vec<i64>> = sizes
                .iter()
                .map(|n| (0..*n).map(|_| { next += 1; next }).collect())
                .collect();
            let j = replaced % windows.len();
            // The period as compacted from the original windows.
            let old_dir = root.join("period");
            std::fs::create_dir_all(&old_dir).unwrap();
            let (w_old, pw_old) = write_period(&old_dir, schema(), windows_in(root, "a", &windows, per_file), None, target).unwrap();
            prop_assert_eq!(ids_of(&old_dir, &w_old.files), windows.concat());
            // Window j re-ingested with other rows.
            let new_rows: Vec<i64> = (0..new_len as i64).map(|i| 1_000_000 + i).collect();
            let staged = window_dir(&root.join("staged"), &new_rows, per_file);
            let ins: Vec<WindowIn> = pw_old
                .iter()
                .enumerate()
                .flat_map(|(i, w)| {
                    let old = WindowIn {
                        start_us: w.start_us,
                        end_us: w.end_us,
                        token: w.token.clone(),
                        input: Input::Old(w.rows),
                        expect: Some(w.digest.clone()),
                        keep: i != j,
                    };
                    if i == j {
                        let Input::Files(d, n) = &staged else { unreachable!() };
                        vec![
                            WindowIn { start_us: w.start_us, end_us: w.end_us, token: "new".into(), input: Input::Files(d.clone(), n.clone()), expect: None, keep: true },
                            old,
                        ]
                    } else {
                        vec![old]
                    }
                })
                .collect();
            let inc_dir = root.join("incremental");
            std::fs::create_dir_all(&inc_dir).unwrap();
            let (w_inc, pw_inc) = write_period(&inc_dir, schema(), ins, Some(&old_dir), target).unwrap();
            // The rebuild: the changed windows compacted from scratch.
            windows[j] = new_rows;
            let full_dir = root.join("rebuild");
            std::fs::create_dir_all(&full_dir).unwrap();
            let (w_full, pw_full) = write_period(&full_dir, schema(), windows_in(root, "b", &windows, per_file), None, target).unwrap();
            prop_assert_eq!(ids_of(&inc_dir, &w_inc.files), ids_of(&full_dir, &w_full.files));
            prop_assert_eq!(ids_of(&inc_dir, &w_inc.files), windows.concat());
            let digests = |p: &[PeriodWindow]| p.iter().map(|w| (w.offset, w.rows, w.digest.clone())).collect::<Vec<_>>();
            prop_assert_eq!(digests(&pw_inc), digests(&pw_full));
            prop_assert_eq!(w_inc.digest, w_full.digest);
        }
    }

    #[test]
    fn a_window_whose_files_changed_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let mut ins = windows_in(tmp.path(), "w", &[vec![1, 2, 3]], 10);
        ins[0].expect = Some("rd1:3:0".into());
        let out = tmp.path().join("out");
        std::fs::create_dir_all(&out).unwrap();
        let e = write_period(&out, schema(), ins, None, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("its files changed since"), "{e}");
    }
}
