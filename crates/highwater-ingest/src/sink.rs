//! Rows into Parquet, one record batch at a time, so memory stays bounded by
//! `batch_rows` whatever the window's size. Files roll over at
//! `file_rows_max`. Each file is hashed as it is written.
//!
//! Type mapping (PostgreSQL → Arrow/Parquet):
//!
//! | source | Arrow |
//! |---|---|
//! | boolean | Boolean |
//! | smallint, integer, bigint | Int16, Int32, Int64 |
//! | real, double precision | Float32, Float64 |
//! | text, varchar, char, name | Utf8 |
//! | bytea | Binary |
//! | timestamptz | Timestamp(µs, "UTC") |
//! | timestamp | Timestamp(µs), read as UTC |
//! | date | Date32 |
//! | numeric, json, jsonb, uuid, xid8, arrays, anything else | Utf8: the server's exact text (numeric keeps every digit) |
//! | numeric(p, s), p <= 38, into a Delta table | Decimal128(p, s), scaled from the exact text, never rounded |
//!
//! NULL is a null in every type. SQLite columns map by declared type
//! affinity: INT → Int64, REAL/FLOA/DOUB → Float64, BLOB → Binary, else Utf8.

use crate::error::IngestError;
use arrow_array::builder::{
    BinaryBuilder, BooleanBuilder, Date32Builder, Float32Builder, Float64Builder, Int16Builder,
    Int32Builder, Int64Builder, StringBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColType {
    Bool,
    I16,
    I32,
    I64,
    F32,
    F64,
    Text,
    Bytes,
    TimestampTz,
    Timestamp,
    Date,
    /// A PostgreSQL `numeric(p, s)` with p <= 38 landed in a Delta table:
    /// Arrow Decimal128(p, s), Delta `decimal(p,s)` (issue 46). Read as the
    /// server's exact text and scaled without rounding.
    Decimal(u8, i8),
}

impl ColType {
    fn data_type(self) -> DataType {
        match self {
            ColType::Bool => DataType::Boolean,
            ColType::I16 => DataType::Int16,
            ColType::I32 => DataType::Int32,
            ColType::I64 => DataType::Int64,
            ColType::F32 => DataType::Float32,
            ColType::F64 => DataType::Float64,
            ColType::Text => DataType::Utf8,
            ColType::Bytes => DataType::Binary,
            ColType::TimestampTz => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            ColType::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, None),
            ColType::Date => DataType::Date32,
            ColType::Decimal(p, s) => DataType::Decimal128(p, s),
        }
    }
}

impl ColType {
    /// The name a window's recorded schema gives the type.
    pub fn name(self) -> String {
        match self {
            ColType::Bool => "boolean",
            ColType::I16 => "int16",
            ColType::I32 => "int32",
            ColType::I64 => "int64",
            ColType::F32 => "float32",
            ColType::F64 => "float64",
            ColType::Text => "utf8",
            ColType::Bytes => "binary",
            ColType::TimestampTz => "timestamp[us, UTC]",
            ColType::Timestamp => "timestamp[us]",
            ColType::Date => "date32",
            ColType::Decimal(p, s) => return format!("decimal128({p}, {s})"),
        }
        .to_string()
    }
}

/// Whether a column of Arrow type `from` may become `to` between windows
/// without a reader of the output noticing anything but wider values:
/// int16 → int32 → int64 and float32 → float64, the changes Delta's type
/// widening and Iceberg's schema evolution both allow, and which
/// compaction carries out (every old value is exactly representable in
/// the new type). An integer becoming a float is not: int64 loses digits
/// past 2^53, sums and joins change meaning, and Iceberg refuses it.
pub fn widens(from: &DataType, to: &DataType) -> bool {
    use DataType as D;
    from == to
        || matches!(
            (from, to),
            (D::Int16, D::Int32)
                | (D::Int16, D::Int64)
                | (D::Int32, D::Int64)
                | (D::Float32, D::Float64)
        )
}

/// The Arrow type a recorded type name stands for.
pub fn type_of_name(name: &str) -> Option<DataType> {
    [
        ColType::Bool,
        ColType::I16,
        ColType::I32,
        ColType::I64,
        ColType::F32,
        ColType::F64,
        ColType::Text,
        ColType::Bytes,
        ColType::TimestampTz,
        ColType::Timestamp,
        ColType::Date,
    ]
    .into_iter()
    .find(|t| t.name() == name)
    .map(ColType::data_type)
    .or_else(|| {
        let (p, s) = name
            .strip_prefix("decimal128(")?
            .strip_suffix(')')?
            .split_once(", ")?;
        Some(ColType::Decimal(p.parse().ok()?, s.parse().ok()?).data_type())
    })
}

/// The text of a `numeric` (`-12.50`) as the integer of a Decimal128 of
/// `scale` (`-1250` at scale 2); `None` when it is not a finite number or
/// needs more fraction digits than the scale (it is never rounded).
pub fn decimal_of_text(text: &str, scale: i8) -> Option<i128> {
    let (neg, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let frac = frac.trim_end_matches('0');
    let scale = usize::try_from(scale).ok()?;
    if int.is_empty() && frac.is_empty() || frac.len() > scale {
        return None;
    }
    if !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut v: i128 = 0;
    for b in int.bytes().chain(frac.bytes()) {
        v = v.checked_mul(10)?.checked_add(i128::from(b - b'0'))?;
    }
    for _ in frac.len()..scale {
        v = v.checked_mul(10)?;
    }
    Some(if neg { -v } else { v })
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub ty: ColType,
    /// The source's own name for the type (`int4`, `numeric`, SQLite's
    /// declared type), for messages about a changed schema.
    pub source_type: String,
}

/// A window's schema as its record and manifest keep it: each column's
/// name, Arrow type and source type, in order.
pub fn schema_json(columns: &[Column]) -> serde_json::Value {
    serde_json::Value::Array(
        columns
            .iter()
            .map(|c| {
                serde_json::json!({"name": c.name, "type": c.ty.name(), "source_type": c.source_type})
            })
            .collect(),
    )
}

/// How the schema `new` differs from `old` (both as [`schema_json`]
/// records them): one line per column, and whether every change widens
/// (an added column does; a dropped one, a narrowed type or a new order
/// does not).
pub fn schema_changes(old: &serde_json::Value, new: &serde_json::Value) -> (Vec<String>, bool) {
    let cols = |v: &serde_json::Value| -> Vec<(String, String, String)> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .map(|c| {
                        let s = |k: &str| c[k].as_str().unwrap_or("?").to_string();
                        (s("name"), s("type"), s("source_type"))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let (old, new) = (cols(old), cols(new));
    let mut lines = Vec::new();
    let mut widening = true;
    for (name, ty, src) in &old {
        match new.iter().find(|c| &c.0 == name) {
            None => {
                widening = false;
                lines.push(format!("column `{name}` ({src}, {ty}) is gone"));
            }
            Some((_, nty, nsrc)) if nty != ty || nsrc != src => {
                let w = match (type_of_name(ty), type_of_name(nty)) {
                    (Some(a), Some(b)) => widens(&a, &b),
                    _ => false,
                };
                if nty == ty {
                    // Same Arrow type (e.g. varchar → text): the files
                    // cannot tell; say it and move on.
                    lines.push(format!(
                        "column `{name}` changed from {src} to {nsrc} (both {ty} in the files)"
                    ));
                    continue;
                }
                widening &= w;
                lines.push(format!(
                    "column `{name}` changed from {src} ({ty}) to {nsrc} ({nty}){}",
                    if w {
                        ", which widens"
                    } else {
                        ", which does not widen"
                    }
                ));
            }
            Some(_) => {}
        }
    }
    for (name, ty, src) in &new {
        if !old.iter().any(|c| &c.0 == name) {
            // An added column evolves the output (issue 21): older windows
            // read it as null, and a compaction fills it with nulls.
            lines.push(format!(
                "column `{name}` ({src}, {ty}) is new (older windows read it as null)"
            ));
        }
    }
    let order =
        |v: &[(String, String, String)]| -> Vec<String> { v.iter().map(|c| c.0.clone()).collect() };
    if lines.is_empty() && order(&old) != order(&new) {
        widening = false;
        lines.push(format!(
            "the columns are in another order ({} before, {} now)",
            order(&old).join(", "),
            order(&new).join(", ")
        ));
    }
    (lines, widening)
}

/// One value, borrowed from the source's row.
pub enum Value<'a> {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(&'a str),
    Bytes(&'a [u8]),
    /// Microseconds since the epoch, UTC.
    Micros(i64),
    /// Days since the epoch.
    Days(i32),
}

enum Builder {
    Bool(BooleanBuilder),
    I16(Int16Builder),
    I32(Int32Builder),
    I64(Int64Builder),
    F32(Float32Builder),
    F64(Float64Builder),
    Text(StringBuilder),
    Bytes(BinaryBuilder),
    Ts(TimestampMicrosecondBuilder, bool),
    Date(Date32Builder),
    Decimal(arrow_array::builder::Decimal128Builder, u8, i8),
}

impl Builder {
    /// A builder sized for `rows` values (and `bytes` of string or binary
    /// data), so that filling a batch does not reallocate as it grows.
    fn new(ty: ColType, rows: usize, bytes: usize) -> Builder {
        match ty {
            ColType::Bool => Builder::Bool(BooleanBuilder::with_capacity(rows)),
            ColType::I16 => Builder::I16(Int16Builder::with_capacity(rows)),
            ColType::I32 => Builder::I32(Int32Builder::with_capacity(rows)),
            ColType::I64 => Builder::I64(Int64Builder::with_capacity(rows)),
            ColType::F32 => Builder::F32(Float32Builder::with_capacity(rows)),
            ColType::F64 => Builder::F64(Float64Builder::with_capacity(rows)),
            ColType::Text => Builder::Text(StringBuilder::with_capacity(rows, bytes)),
            ColType::Bytes => Builder::Bytes(BinaryBuilder::with_capacity(rows, bytes)),
            ColType::TimestampTz => {
                Builder::Ts(TimestampMicrosecondBuilder::with_capacity(rows), true)
            }
            ColType::Timestamp => {
                Builder::Ts(TimestampMicrosecondBuilder::with_capacity(rows), false)
            }
            ColType::Date => Builder::Date(Date32Builder::with_capacity(rows)),
            ColType::Decimal(p, s) => Builder::Decimal(
                arrow_array::builder::Decimal128Builder::with_capacity(rows),
                p,
                s,
            ),
        }
    }

    /// Appends a value; `Err` names what was expected when the source's
    /// value does not fit the column (SQLite types are per value).
    fn push(&mut self, v: Value<'_>) -> Result<(), &'static str> {
        match (self, v) {
            (Builder::Bool(b), Value::Null) => b.append_null(),
            (Builder::I16(b), Value::Null) => b.append_null(),
            (Builder::I32(b), Value::Null) => b.append_null(),
            (Builder::I64(b), Value::Null) => b.append_null(),
            (Builder::F32(b), Value::Null) => b.append_null(),
            (Builder::F64(b), Value::Null) => b.append_null(),
            (Builder::Text(b), Value::Null) => b.append_null(),
            (Builder::Bytes(b), Value::Null) => b.append_null(),
            (Builder::Ts(b, _), Value::Null) => b.append_null(),
            (Builder::Date(b), Value::Null) => b.append_null(),
            (Builder::Decimal(b, ..), Value::Null) => b.append_null(),
            (Builder::Decimal(b, p, s), Value::Text(x)) => match decimal_of_text(x, *s) {
                Some(v) if v.unsigned_abs() < 10u128.pow(u32::from(*p)) => b.append_value(v),
                _ => return Err("a decimal of its precision and scale"),
            },
            (Builder::Bool(b), Value::Bool(x)) => b.append_value(x),
            (Builder::Bool(b), Value::Int(x)) => b.append_value(x != 0),
            (Builder::I16(b), Value::Int(x)) => b.append_value(x as i16),
            (Builder::I32(b), Value::Int(x)) => b.append_value(x as i32),
            (Builder::I64(b), Value::Int(x)) => b.append_value(x),
            (Builder::F32(b), Value::Float(x)) => b.append_value(x as f32),
            (Builder::F64(b), Value::Float(x)) => b.append_value(x),
            (Builder::F64(b), Value::Int(x)) => b.append_value(x as f64),
            (Builder::Text(b), Value::Text(x)) => b.append_value(x),
            (Builder::Text(b), Value::Int(x)) => b.append_value(x.to_string()),
            (Builder::Text(b), Value::Float(x)) => b.append_value(x.to_string()),
            (Builder::Bytes(b), Value::Bytes(x)) => b.append_value(x),
            (Builder::Bytes(b), Value::Text(x)) => b.append_value(x.as_bytes()),
            (Builder::Ts(b, _), Value::Micros(x)) => b.append_value(x),
            (Builder::Date(b), Value::Days(x)) => b.append_value(x),
            (Builder::Bool(_), _) => return Err("a boolean"),
            (Builder::I16(_) | Builder::I32(_) | Builder::I64(_), _) => return Err("an integer"),
            (Builder::F32(_) | Builder::F64(_), _) => return Err("a number"),
            (Builder::Text(_), _) => return Err("text"),
            (Builder::Bytes(_), _) => return Err("bytes"),
            (Builder::Ts(..), _) => return Err("a timestamp"),
            (Builder::Date(_), _) => return Err("a date"),
            (Builder::Decimal(..), _) => return Err("a decimal"),
        }
        Ok(())
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            Builder::Bool(b) => Arc::new(b.finish()),
            Builder::I16(b) => Arc::new(b.finish()),
            Builder::I32(b) => Arc::new(b.finish()),
            Builder::I64(b) => Arc::new(b.finish()),
            Builder::F32(b) => Arc::new(b.finish()),
            Builder::F64(b) => Arc::new(b.finish()),
            Builder::Text(b) => Arc::new(b.finish()),
            Builder::Bytes(b) => Arc::new(b.finish()),
            Builder::Ts(b, true) => Arc::new(b.finish().with_timezone("UTC")),
            Builder::Ts(b, false) => Arc::new(b.finish()),
            Builder::Date(b) => Arc::new(b.finish()),
            Builder::Decimal(b, p, s) => Arc::new(
                b.finish()
                    .with_precision_and_scale(*p, *s)
                    .expect("a precision of 1 to 38 and a scale within it"),
            ),
        }
    }
}

/// A `Write` that hashes what passes through it.
struct Hashing<W: Write> {
    inner: W,
    hasher: blake3::Hasher,
    bytes: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// One written file, as `_manifest.json` lists it.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct FileInfo {
    pub path: String,
    pub rows: u64,
    pub bytes: u64,
    pub blake3: String,
    /// Delta's per-file statistics (`delta::stats`), for the files of a
    /// Delta table; none elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<serde_json::Value>,
}

/// What a sink adds to what it is given, for a Delta table's files.
#[derive(Clone, Debug, Default)]
pub struct Extras {
    /// A last column `_highwater_window` (timestamp, UTC) holding this
    /// window start (µs) in every row (`delta::WINDOW_COLUMN`).
    pub stamp: Option<i64>,
    /// Each file's Delta statistics in its [`FileInfo`].
    pub stats: bool,
}

/// The file being written: its writer, path and rows so far.
type OpenFile = (
    ArrowWriter<Hashing<std::io::BufWriter<std::fs::File>>>,
    PathBuf,
    u64,
);

/// The string bytes a text or binary builder reserves per row before it
/// has seen a batch (then it reserves what the previous batch used).
const BYTES_PER_VALUE_GUESS: usize = 32;

/// Rows per Parquet row group: the encoder buffers one row group, so this
/// bounds its memory (about 100 bytes a row for typical tables).
pub const ROW_GROUP_ROWS_MAX: usize = 131_072;

/// What a sink wrote: its files, their rows, and the rows' content digest.
#[derive(Clone, Debug, Default)]
pub struct Written {
    pub files: Vec<FileInfo>,
    pub rows: u64,
    pub digest: crate::digest::RowsDigest,
}

/// The encoder thread's result.
type Encoded = Result<Written, IngestError>;

/// Record batches waiting for the encoder: bounds memory to this many
/// batches of `batch_rows` between the reader and the Parquet encoder.
pub const ENCODE_QUEUE_BATCHES_MAX: usize = 2;

/// Writes a window's rows as `part-NNNNN.parquet` files in a folder. Two
/// stages joined by a bounded channel: the caller's thread turns rows into
/// record batches; an encoder thread compresses and writes them, so that
/// reading from the source and encoding overlap.
pub struct ParquetSink {
    dir: PathBuf,
    schema: SchemaRef,
    builders: Vec<Builder>,
    columns: Vec<Column>,
    pending: usize,
    /// Values pushed into the row being built (`push_value`).
    row_values: usize,
    batch_rows: usize,
    tx: Option<std::sync::mpsc::SyncSender<RecordBatch>>,
    encoder: Option<std::thread::JoinHandle<Encoded>>,
}

/// The encoder stage: writes batches into files, rolling over at
/// `file_rows_max`, fsyncing and hashing each file.
struct Encoder {
    dir: PathBuf,
    /// The files' schema: the rows' schema, and the stamp column if any.
    schema: SchemaRef,
    extras: Extras,
    file_rows_max: usize,
    /// Files also roll over near this many bytes (compaction's target).
    file_bytes_max: u64,
    /// Columns written without a dictionary: the key and the cursor, whose
    /// values are (nearly) all distinct, so a dictionary only costs time
    /// before the writer falls back to plain encoding.
    plain: Vec<String>,
    /// File names start with this (a chunk's files do not collide with
    /// another chunk's in the same staging folder).
    prefix: String,
    writer: Option<OpenFile>,
    files: Vec<FileInfo>,
    rows: u64,
    digest: crate::digest::RowsDigest,
}

impl Encoder {
    fn err(path: &Path, e: impl ToString) -> IngestError {
        IngestError::Parquet {
            path: path.to_path_buf(),
            message: e.to_string(),
        }
    }

    fn open(&mut self) -> Result<(), IngestError> {
        let path = self.dir.join(format!(
            "part-{}{:05}.parquet",
            self.prefix,
            self.files.len()
        ));
        let f = std::fs::File::create(&path).map_err(|e| IngestError::io("creating", &path, e))?;
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(
                ZstdLevel::try_new(1).expect("level 1 is valid"),
            ))
            // The writer holds a row group in memory until it is full: this
            // bound keeps memory flat however large the window is.
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS_MAX));
        let props = self
            .plain
            .iter()
            .fold(props, |p, c| {
                p.set_column_dictionary_enabled(ColumnPath::from(c.as_str()), false)
            })
            .build();
        let w = ArrowWriter::try_new(
            Hashing {
                inner: std::io::BufWriter::with_capacity(1 << 20, f),
                hasher: blake3::Hasher::new(),
                bytes: 0,
            },
            self.schema.clone(),
            Some(props),
        )
        .map_err(|e| Self::err(&path, e))?;
        self.writer = Some((w, path, 0));
        Ok(())
    }

    fn write(&mut self, batch: &RecordBatch) -> Result<(), IngestError> {
        if self.writer.is_none() {
            self.open()?;
        }
        let (w, path, rows) = self.writer.as_mut().expect("opened above");
        // The digest is of the source's rows, stamp or no stamp.
        self.digest.add_batch(batch);
        match self.extras.stamp {
            Some(start) => {
                let mut columns = batch.columns().to_vec();
                columns.push(Arc::new(
                    arrow_array::TimestampMicrosecondArray::from_value(start, batch.num_rows())
                        .with_timezone("UTC"),
                ));
                let stamped = RecordBatch::try_new(self.schema.clone(), columns)
                    .map_err(|e| Self::err(path, e))?;
                w.write(&stamped).map_err(|e| Self::err(path, e))?;
            }
            None => w.write(batch).map_err(|e| Self::err(path, e))?,
        }
        *rows += batch.num_rows() as u64;
        self.rows += batch.num_rows() as u64;
        let bytes = w.bytes_written() as u64 + w.in_progress_size() as u64;
        if *rows >= self.file_rows_max as u64 || bytes >= self.file_bytes_max {
            self.close()?;
        }
        Ok(())
    }

    fn close(&mut self) -> Result<(), IngestError> {
        let Some((mut w, path, rows)) = self.writer.take() else {
            return Ok(());
        };
        let stats = if self.extras.stats {
            // The last row group into the footer's list, so its statistics
            // are there to read.
            w.flush().map_err(|e| Self::err(&path, e))?;
            Some(crate::delta::stats::of_row_groups(
                &self.schema,
                w.flushed_row_groups(),
                rows,
            ))
        } else {
            None
        };
        let hashing = w.into_inner().map_err(|e| Self::err(&path, e))?;
        let Hashing {
            inner,
            hasher,
            bytes,
        } = hashing;
        let file = inner
            .into_inner()
            .map_err(|e| IngestError::io("flushing", &path, e.into_error()))?;
        file.sync_all()
            .map_err(|e| IngestError::io("syncing", &path, e))?;
        self.files.push(FileInfo {
            path: path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
            rows,
            bytes,
            blake3: hasher.finalize().to_hex().to_string(),
            stats,
        });
        Ok(())
    }

    /// Closes the last file. A window with no rows still gets one (empty)
    /// file, so that "no rows" is a published fact with a schema, not a
    /// missing folder.
    fn finish(mut self, empty: RecordBatch) -> Encoded {
        if self.files.is_empty() && self.writer.is_none() {
            self.write(&empty)?;
        }
        self.close()?;
        Ok(Written {
            files: self.files,
            rows: self.rows,
            digest: self.digest,
        })
    }
}

impl ParquetSink {
    pub fn new(
        dir: &Path,
        columns: &[Column],
        batch_rows: usize,
        file_rows_max: usize,
        prefix: &str,
        plain: &[String],
    ) -> ParquetSink {
        Self::new_with(
            dir,
            columns,
            batch_rows,
            file_rows_max,
            prefix,
            plain,
            Extras::default(),
        )
    }

    /// [`ParquetSink::new`], with what a Delta table's files carry more.
    pub fn new_with(
        dir: &Path,
        columns: &[Column],
        batch_rows: usize,
        file_rows_max: usize,
        prefix: &str,
        plain: &[String],
        extras: Extras,
    ) -> ParquetSink {
        let fields: Vec<Field> = columns
            .iter()
            .map(|c| Field::new(&c.name, c.ty.data_type(), true))
            .collect();
        let schema: SchemaRef = Arc::new(Schema::new(fields));
        let mut sink = Self::with_schema_extras(
            dir,
            schema,
            batch_rows,
            file_rows_max,
            u64::MAX,
            prefix,
            plain,
            extras,
        );
        sink.builders = columns
            .iter()
            .map(|c| Builder::new(c.ty, batch_rows, batch_rows * BYTES_PER_VALUE_GUESS))
            .collect();
        sink.columns = columns.to_vec();
        sink
    }

    /// A sink for whole record batches of `schema` (`push_batch`), whose
    /// files roll over at `file_rows_max` rows or near `file_bytes_max`.
    pub fn with_schema(
        dir: &Path,
        schema: SchemaRef,
        batch_rows: usize,
        file_rows_max: usize,
        file_bytes_max: u64,
        prefix: &str,
        plain: &[String],
    ) -> ParquetSink {
        Self::with_schema_extras(
            dir,
            schema,
            batch_rows,
            file_rows_max,
            file_bytes_max,
            prefix,
            plain,
            Extras::default(),
        )
    }

    /// [`ParquetSink::with_schema`], with what a Delta table's files carry
    /// more.
    #[allow(clippy::too_many_arguments)]
    pub fn with_schema_extras(
        dir: &Path,
        schema: SchemaRef,
        batch_rows: usize,
        file_rows_max: usize,
        file_bytes_max: u64,
        prefix: &str,
        plain: &[String],
        extras: Extras,
    ) -> ParquetSink {
        let file_schema = match extras.stamp {
            Some(_) => {
                let mut fields: Vec<Field> =
                    schema.fields().iter().map(|f| f.as_ref().clone()).collect();
                fields.push(Field::new(
                    crate::delta::WINDOW_COLUMN,
                    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                    true,
                ));
                Arc::new(Schema::new(fields))
            }
            None => schema.clone(),
        };
        let (tx, rx) = std::sync::mpsc::sync_channel::<RecordBatch>(ENCODE_QUEUE_BATCHES_MAX);
        let mut enc = Encoder {
            dir: dir.to_path_buf(),
            schema: file_schema,
            extras,
            file_rows_max,
            file_bytes_max,
            plain: plain.to_vec(),
            prefix: prefix.to_string(),
            writer: None,
            files: Vec::new(),
            rows: 0,
            digest: Default::default(),
        };
        let empty = RecordBatch::new_empty(schema.clone());
        let encoder = std::thread::spawn(move || {
            for batch in rx {
                enc.write(&batch)?;
            }
            enc.finish(empty)
        });
        ParquetSink {
            dir: dir.to_path_buf(),
            schema,
            builders: Vec::new(),
            columns: Vec::new(),
            pending: 0,
            row_values: 0,
            batch_rows,
            tx: Some(tx),
            encoder: Some(encoder),
        }
    }

    /// Appends a whole record batch (of the sink's schema).
    pub fn push_batch(&mut self, batch: RecordBatch) -> Result<(), IngestError> {
        self.flush_batch()?;
        let sent = self.tx.as_ref().expect("open until finish").send(batch);
        if sent.is_err() {
            return self.join().map(|_| ());
        }
        Ok(())
    }

    /// Appends one row; `Err` says which column did not fit.
    pub fn push_row<'a>(&mut self, values: impl Iterator<Item = Value<'a>>) -> Result<(), String> {
        let mut n = 0;
        for (i, v) in values.enumerate() {
            self.builders[i].push(v).map_err(|want| {
                format!(
                    "column `{}` holds a value that is not {want}",
                    self.columns[i].name
                )
            })?;
            n += 1;
        }
        assert_eq!(n, self.builders.len(), "a row has one value per column");
        self.pending += 1;
        if self.pending >= self.batch_rows {
            self.flush_batch().map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Appends the next value of the row being built (values come in
    /// column order; `end_row` closes the row). No allocation per value.
    pub fn push_value(&mut self, i: usize, v: Value<'_>) -> Result<(), String> {
        debug_assert_eq!(i, self.row_values, "values come in column order");
        self.builders[i].push(v).map_err(|want| {
            format!(
                "column `{}` holds a value that is not {want}",
                self.columns[i].name
            )
        })?;
        self.row_values += 1;
        Ok(())
    }

    /// Closes the row built by `push_value`.
    pub fn end_row(&mut self) -> Result<(), String> {
        assert_eq!(
            self.row_values,
            self.builders.len(),
            "a row has one value per column"
        );
        self.row_values = 0;
        self.pending += 1;
        if self.pending >= self.batch_rows {
            self.flush_batch().map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn flush_batch(&mut self) -> Result<(), IngestError> {
        if self.pending == 0 {
            return Ok(());
        }
        let arrays: Vec<ArrayRef> = self.builders.iter_mut().map(Builder::finish).collect();
        // A finished Arrow builder starts again from no capacity: give each
        // the room of the batch just built, so that no batch regrows.
        for (b, (c, a)) in self
            .builders
            .iter_mut()
            .zip(self.columns.iter().zip(&arrays))
        {
            let bytes = a.get_buffer_memory_size();
            *b = Builder::new(c.ty, self.batch_rows, bytes);
        }
        let batch = RecordBatch::try_new(self.schema.clone(), arrays)
            .map_err(|e| Encoder::err(&self.dir, e))?;
        self.pending = 0;
        let sent = self.tx.as_ref().expect("open until finish").send(batch);
        if sent.is_err() {
            // The encoder stopped on an error; finish() reports it.
            return self.join().map(|_| ());
        }
        Ok(())
    }

    fn join(&mut self) -> Encoded {
        self.tx = None;
        match self.encoder.take() {
            Some(h) => h.join().expect("the encoder does not panic"),
            None => Err(Encoder::err(&self.dir, "the encoder already stopped")),
        }
    }

    /// Writes what is pending, closes the files and returns them with the
    /// row count and digest.
    pub fn finish(mut self) -> Encoded {
        self.flush_batch()?;
        self.join()
    }
}

impl Drop for ParquetSink {
    fn drop(&mut self) {
        // An abandoned sink (a failed read) still stops its encoder.
        self.tx = None;
        if let Some(h) = self.encoder.take() {
            let _ = h.join();
        }
    }
}

/// The hashes of the key values of every row in a window's Parquet files
/// (all `part-*.parquet` in `dir`), reading only the key columns.
pub fn key_hashes(
    dir: &Path,
    key: &[String],
) -> Result<std::collections::HashSet<u64>, IngestError> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{
        Date32Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type,
        TimestampMicrosecondType,
    };
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::arrow::ProjectionMask;
    let mut out = std::collections::HashSet::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Ok(out);
    };
    let mut files: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .collect();
    files.sort();
    for path in files {
        let perr = |e: &dyn std::fmt::Display| IngestError::Parquet {
            path: path.clone(),
            message: e.to_string(),
        };
        let f = std::fs::File::open(&path).map_err(|e| IngestError::io("reading", &path, e))?;
        let b = ParquetRecordBatchReaderBuilder::try_new(f).map_err(|e| perr(&e))?;
        let idx: Vec<usize> = key
            .iter()
            .filter_map(|k| b.schema().index_of(k).ok())
            .collect();
        if idx.len() != key.len() {
            continue;
        }
        let mask = ProjectionMask::roots(b.parquet_schema(), idx);
        for batch in b.with_projection(mask).build().map_err(|e| perr(&e))? {
            let batch = batch.map_err(|e| perr(&e))?;
            let mut hashers: Vec<blake3::Hasher> = (0..batch.num_rows())
                .map(|_| blake3::Hasher::new())
                .collect();
            for col in batch.columns() {
                for (r, h) in hashers.iter_mut().enumerate() {
                    if col.is_null(r) {
                        h.update(b"\0null");
                        continue;
                    }
                    match col.data_type() {
                        DataType::Int64 => {
                            h.update(&col.as_primitive::<Int64Type>().value(r).to_le_bytes())
                        }
                        DataType::Int32 => h.update(
                            &(col.as_primitive::<Int32Type>().value(r) as i64).to_le_bytes(),
                        ),
                        DataType::Int16 => h.update(
                            &(col.as_primitive::<Int16Type>().value(r) as i64).to_le_bytes(),
                        ),
                        DataType::Float64 => {
                            h.update(&col.as_primitive::<Float64Type>().value(r).to_le_bytes())
                        }
                        DataType::Float32 => {
                            h.update(&col.as_primitive::<Float32Type>().value(r).to_le_bytes())
                        }
                        DataType::Utf8 => h.update(col.as_string::<i32>().value(r).as_bytes()),
                        DataType::Binary => h.update(col.as_binary::<i32>().value(r)),
                        DataType::Boolean => h.update(&[col.as_boolean().value(r) as u8]),
                        DataType::Date32 => {
                            h.update(&col.as_primitive::<Date32Type>().value(r).to_le_bytes())
                        }
                        DataType::Timestamp(..) => h.update(
                            &col.as_primitive::<TimestampMicrosecondType>()
                                .value(r)
                                .to_le_bytes(),
                        ),
                        _ => h.update(b"?"),
                    };
                    h.update(b"\x1f");
                }
            }
            for h in hashers {
                let d = h.finalize();
                out.insert(u64::from_le_bytes(
                    d.as_bytes()[..8].try_into().expect("8 bytes"),
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 46: a numeric's exact text as a Decimal128 integer, never
    /// rounded.
    #[test]
    fn decimals_are_scaled_from_the_exact_text() {
        assert_eq!(decimal_of_text("12.345", 3), Some(12_345));
        assert_eq!(decimal_of_text("-12.3", 3), Some(-12_300));
        assert_eq!(decimal_of_text("7", 2), Some(700));
        assert_eq!(decimal_of_text("0.50", 1), Some(5));
        assert_eq!(decimal_of_text(".5", 1), Some(5));
        for bad in ["1.234", "NaN", "Infinity", "", "-", "1e5", "1.2.3"] {
            assert_eq!(decimal_of_text(bad, 2), None, "{bad}");
        }
        assert_eq!(
            type_of_name(&ColType::Decimal(12, 3).name()),
            Some(DataType::Decimal128(12, 3))
        );
    }

    /// A column as (name, Arrow type, source type).
    type Col<'a> = (&'a str, ColType, &'a str);

    fn cols(spec: &[Col<'_>]) -> serde_json::Value {
        schema_json(
            &spec
                .iter()
                .map(|(n, t, s)| Column {
                    name: n.to_string(),
                    ty: *t,
                    source_type: s.to_string(),
                })
                .collect::<Vec<_>>(),
        )
    }

    /// The widening rules of issue 20, as a table: (before, after,
    /// widens, what the message says).
    #[test]
    fn schema_changes_widen_only_where_every_value_is_exact() {
        use ColType::*;
        let base = [("id", I64, "int8"), ("amount", I32, "int4")];
        let cases: &[(&[Col<'_>], bool, &str)] = &[
            (&base, true, ""),
            (
                &[("id", I64, "int8"), ("amount", I64, "int8")],
                true,
                "to int8 (int64), which widens",
            ),
            (
                &[("id", I64, "int8"), ("amount", Text, "numeric")],
                false,
                "to numeric (utf8), which does not widen",
            ),
            (
                &[("id", I64, "int8"), ("amount", F64, "float8")],
                false,
                "to float8 (float64), which does not widen",
            ),
            (
                &[("id", I64, "int8"), ("amount", I16, "int2")],
                false,
                "to int2 (int16), which does not widen",
            ),
            (
                &[("id", I64, "int8")],
                false,
                "column `amount` (int4, int32) is gone",
            ),
            (
                &[
                    ("id", I64, "int8"),
                    ("amount", I32, "int4"),
                    ("note", Text, "text"),
                ],
                true,
                "column `note` (text, utf8) is new",
            ),
            (
                &[("amount", I32, "int4"), ("id", I64, "int8")],
                false,
                "in another order",
            ),
            (
                &[("id", I64, "int8"), ("amount", I32, "integer")],
                true,
                "both int32 in the files",
            ),
        ];
        for (after, widens, says) in cases {
            let (lines, w) = schema_changes(&cols(&base), &cols(after));
            assert_eq!(w, *widens, "{after:?}: {lines:?}");
            assert!(lines.join("; ").contains(says), "{after:?}: {lines:?}");
            assert_eq!(lines.is_empty(), says.is_empty(), "{after:?}: {lines:?}");
        }
        let (lines, w) = schema_changes(
            &cols(&[("r", F32, "float4")]),
            &cols(&[("r", F64, "float8")]),
        );
        assert!(w && lines[0].contains("which widens"), "{lines:?}");
    }
}
