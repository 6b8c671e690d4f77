//! `[sources.NAME.load]`: each published window loaded into a warehouse
//! table (PostgreSQL), in one transaction that replaces that window's rows.
//!
//! The table carries one column of highwater's own, `_highwater_window`
//! (the window's start), and a window's load is
//!
//! ```sql
//! BEGIN;
//! SELECT pg_advisory_xact_lock(...);            -- one loader per table and window
//! DELETE FROM t WHERE _highwater_window = $start;
//! COPY t (..., _highwater_window) FROM STDIN (FORMAT binary);
//! COMMIT;
//! ```
//!
//! A reader sees the window's old rows until the commit and its new rows
//! after it, never part (MVCC: neither the delete nor the copied rows are
//! visible before the commit). The rows are copied straight into the table
//! rather than into a staging table first: the atomicity is the same, and
//! the server writes each row once instead of twice.
//!
//! The rows come from the window's published Parquet files, read back: a
//! load that failed is retried by the next run without extracting again.
//! From a bucket (Parquet folder versions or a Delta table), the window's
//! files are downloaded into a scratch folder under
//! `.highwater/objects-staging` first, removed after the load.

use crate::config::{quote_column, quote_ident};
use crate::format::Rows;
use crate::pg::{reason, Pg};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, TimestampMicrosecondType,
};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, TimeUnit};
use bytes::{BufMut, BytesMut};
use highwater_store::WindowRecord;
use serde::Deserialize;
use std::path::Path;

/// The column of the warehouse table that names each row's window (its
/// start): what a window's load deletes by.
pub const WINDOW_COLUMN: &str = "_highwater_window";

/// PostgreSQL truncates longer identifiers; a name that would be silently
/// cut is refused instead.
pub const IDENT_BYTES_MAX: usize = 63;

/// Bytes of COPY data encoded before they are sent: bounds the loader's
/// memory whatever the window's size.
pub const COPY_CHUNK_BYTES_MAX: usize = 1 << 20;

/// Microseconds and days from 1970-01-01 to PostgreSQL's epoch, 2000-01-01.
const PG_EPOCH_US: i64 = 946_684_800_000_000;
const PG_EPOCH_DAYS: i32 = 10_957;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadKind {
    Postgres,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLoad {
    kind: LoadKind,
    url_env: String,
    table: String,
    statement_timeout_s: Option<u64>,
}

/// How long one statement of a load may take (the wait for another
/// loader's lock on the window included) unless `statement_timeout_s`
/// says otherwise: a stuck warehouse fails the load, never hangs the run.
pub const STATEMENT_TIMEOUT_S_DEFAULT: u64 = 3600;

/// A validated `[sources.NAME.load]`.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadSpec {
    pub kind: LoadKind,
    /// The variable holding the warehouse's connection string (never
    /// printed: errors carry the server's reason only).
    pub url_env: String,
    /// `table` or `schema.table`, lower-case letters, digits and `_`.
    pub table: String,
    pub statement_timeout_s: u64,
}

impl LoadSpec {
    pub(crate) fn parse(raw: RawLoad, source: &str) -> Result<LoadSpec, String> {
        if raw.url_env.is_empty() {
            return Err(format!(
                "[sources.{source}.load] url_env names the variable that holds the warehouse's connection string; it is empty"
            ));
        }
        let parts: Vec<&str> = raw.table.split('.').collect();
        let ident_ok = |p: &str| {
            !p.is_empty()
                && p.len() <= IDENT_BYTES_MAX
                && p.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                && p.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        };
        if parts.len() > 2 || !parts.iter().all(|p| ident_ok(p)) {
            return Err(format!(
                "[sources.{source}.load] table `{}` is not a table name: give `table` or `schema.table`, each part lower-case letters, digits and `_` (not starting with a digit), at most {IDENT_BYTES_MAX} bytes",
                raw.table
            ));
        }
        let statement_timeout_s = raw
            .statement_timeout_s
            .unwrap_or(STATEMENT_TIMEOUT_S_DEFAULT);
        if statement_timeout_s == 0 {
            return Err(format!(
                "[sources.{source}.load] statement_timeout_s must be at least 1"
            ));
        }
        Ok(LoadSpec {
            kind: raw.kind,
            url_env: raw.url_env,
            table: raw.table,
            statement_timeout_s,
        })
    }

    /// The table, quoted for SQL.
    pub fn table_sql(&self) -> String {
        quote_ident(&self.table)
    }
}

/// The PostgreSQL type a Parquet column of a window is loaded as.
pub fn pg_type(t: &DataType) -> Option<String> {
    if let DataType::Decimal128(p, s) = t {
        return Some(format!("numeric({p},{s})"));
    }
    Some(
        match t {
            DataType::Boolean => "boolean",
            DataType::Int16 => "smallint",
            DataType::Int32 => "integer",
            DataType::Int64 => "bigint",
            DataType::Float32 => "real",
            DataType::Float64 => "double precision",
            DataType::Utf8 => "text",
            DataType::Binary => "bytea",
            DataType::Timestamp(TimeUnit::Microsecond, Some(_)) => "timestamp with time zone",
            DataType::Timestamp(TimeUnit::Microsecond, None) => "timestamp without time zone",
            DataType::Date32 => "date",
            _ => return None,
        }
        .to_string(),
    )
}

/// PostgreSQL's binary `numeric` for the Decimal128 integer `v` of
/// `scale`: ndigits, weight, sign, dscale, then base-10000 digits.
fn put_numeric(v: i128, scale: i8, out: &mut BytesMut) {
    let scale = scale.max(0) as usize;
    let digits = v.unsigned_abs().to_string();
    let digits = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = digits.split_at(digits.len() - scale);
    // Whole groups of four: the integer part padded on the left, the
    // fraction on the right.
    let int = format!("{int:0>width$}", width = int.len().div_ceil(4) * 4);
    let frac = format!("{frac:0<width$}", width = frac.len().div_ceil(4) * 4);
    let group = |s: &str| -> Vec<i16> {
        s.as_bytes()
            .chunks(4)
            .map(|c| {
                std::str::from_utf8(c)
                    .expect("ascii digits")
                    .parse()
                    .expect("four digits")
            })
            .collect()
    };
    let ints = group(&int);
    let mut groups = ints.clone();
    groups.extend(group(&frac));
    let mut weight = ints.len() as i16 - 1;
    while groups.first() == Some(&0) {
        groups.remove(0);
        weight -= 1;
    }
    while groups.last() == Some(&0) {
        groups.pop();
    }
    if groups.is_empty() {
        weight = 0;
    }
    out.put_i32(8 + 2 * groups.len() as i32);
    out.put_i16(groups.len() as i16);
    out.put_i16(weight);
    out.put_u16(if v < 0 { 0x4000 } else { 0 });
    out.put_i16(scale as i16);
    for g in groups {
        out.put_i16(g);
    }
}

/// Whether a table column of type `have` takes `want`'s binary COPY
/// format as it is.
fn compatible(want: &str, have: &str) -> bool {
    want == have || (want == "text" && have.starts_with("character varying"))
}

/// One column of a record batch, downcast once per batch.
enum Col<'a> {
    Bool(&'a arrow_array::BooleanArray),
    I16(&'a arrow_array::Int16Array),
    I32(&'a arrow_array::Int32Array),
    I64(&'a arrow_array::Int64Array),
    F32(&'a arrow_array::Float32Array),
    F64(&'a arrow_array::Float64Array),
    Text(&'a arrow_array::StringArray),
    Bytes(&'a arrow_array::BinaryArray),
    Ts(&'a arrow_array::TimestampMicrosecondArray),
    Date(&'a arrow_array::Date32Array),
    Decimal(&'a arrow_array::Decimal128Array, i8),
}

fn columns(b: &RecordBatch) -> Result<Vec<Col<'_>>, String> {
    b.columns()
        .iter()
        .zip(b.schema().fields())
        .map(|(c, f)| {
            Ok(match c.data_type() {
                DataType::Boolean => Col::Bool(c.as_boolean()),
                DataType::Int16 => Col::I16(c.as_primitive::<Int16Type>()),
                DataType::Int32 => Col::I32(c.as_primitive::<Int32Type>()),
                DataType::Int64 => Col::I64(c.as_primitive::<Int64Type>()),
                DataType::Float32 => Col::F32(c.as_primitive::<Float32Type>()),
                DataType::Float64 => Col::F64(c.as_primitive::<Float64Type>()),
                DataType::Utf8 => Col::Text(c.as_string::<i32>()),
                DataType::Binary => Col::Bytes(c.as_binary::<i32>()),
                DataType::Timestamp(TimeUnit::Microsecond, _) => {
                    Col::Ts(c.as_primitive::<TimestampMicrosecondType>())
                }
                DataType::Date32 => Col::Date(c.as_primitive::<Date32Type>()),
                DataType::Decimal128(_, s) => {
                    Col::Decimal(c.as_primitive::<arrow_array::types::Decimal128Type>(), *s)
                }
                other => {
                    return Err(format!(
                        "column `{}` is {other} in the Parquet files, which the load does not map",
                        f.name()
                    ))
                }
            })
        })
        .collect()
}

/// Rows `from..to` of `cols` as binary COPY tuples, each ending with the
/// window column.
fn encode(cols: &[Col<'_>], from: usize, to: usize, window_pg_us: i64, out: &mut BytesMut) {
    let fields = (cols.len() + 1) as i16;
    for r in from..to {
        out.put_i16(fields);
        for c in cols {
            macro_rules! fixed {
                ($a:expr, $len:expr, $put:ident, $v:expr) => {
                    if $a.is_null(r) {
                        out.put_i32(-1)
                    } else {
                        out.put_i32($len);
                        out.$put($v($a.value(r)));
                    }
                };
            }
            match c {
                Col::Bool(a) => fixed!(a, 1, put_u8, |v: bool| v as u8),
                Col::I16(a) => fixed!(a, 2, put_i16, |v| v),
                Col::I32(a) => fixed!(a, 4, put_i32, |v| v),
                Col::I64(a) => fixed!(a, 8, put_i64, |v| v),
                Col::F32(a) => fixed!(a, 4, put_f32, |v| v),
                Col::F64(a) => fixed!(a, 8, put_f64, |v| v),
                Col::Ts(a) => fixed!(a, 8, put_i64, |v: i64| v - PG_EPOCH_US),
                Col::Date(a) => fixed!(a, 4, put_i32, |v: i32| v - PG_EPOCH_DAYS),
                Col::Text(a) => {
                    if a.is_null(r) {
                        out.put_i32(-1)
                    } else {
                        let v = a.value(r).as_bytes();
                        out.put_i32(v.len() as i32);
                        out.put_slice(v);
                    }
                }
                Col::Bytes(a) => {
                    if a.is_null(r) {
                        out.put_i32(-1)
                    } else {
                        let v = a.value(r);
                        out.put_i32(v.len() as i32);
                        out.put_slice(v);
                    }
                }
                Col::Decimal(a, s) => {
                    if a.is_null(r) {
                        out.put_i32(-1)
                    } else {
                        put_numeric(a.value(r), *s, out);
                    }
                }
            }
        }
        out.put_i32(8);
        out.put_i64(window_pg_us);
    }
}

/// What one window's load did.
#[derive(Clone, Debug, PartialEq)]
pub struct Loaded {
    pub rows: u64,
    /// The window's rows the load replaced (a re-landed window's old rows).
    pub replaced_rows: u64,
}

/// A connection to the warehouse, reused for the windows of one run.
pub struct Loader {
    spec: LoadSpec,
    pg: Pg,
    /// The table's columns and types, once checked (or created).
    checked: Option<Vec<(String, String)>>,
    /// Columns the windows have and the table lacks (added at the source
    /// since the table was made): added by the next load, in its
    /// transaction, as `name type` definitions.
    add_columns: Vec<String>,
}

impl Loader {
    /// Connects; the error is the server's or the network's reason, never
    /// the connection string.
    pub fn connect(spec: &LoadSpec, url: &str) -> Result<Loader, String> {
        let mut pg = Pg::connect(url)?;
        pg.batch_execute(&format!(
            "SET statement_timeout = '{}s'",
            spec.statement_timeout_s
        ))
        .map_err(|e| reason(&e))?;
        Ok(Loader {
            spec: spec.clone(),
            pg,
            checked: None,
            add_columns: Vec::new(),
        })
    }

    /// The table's columns, creating the table (and its schema, and an
    /// index on the window column) from the window's Parquet schema when
    /// it does not exist yet.
    fn table_columns(
        &mut self,
        schema: &arrow_schema::Schema,
    ) -> Result<Vec<(String, String)>, String> {
        if let Some(c) = &self.checked {
            if schema
                .fields()
                .iter()
                .all(|f| c.iter().any(|(n, _)| n == f.name()))
            {
                return Ok(c.clone());
            }
        }
        self.add_columns.clear();
        let t = self.spec.table_sql();
        let cols_sql = "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum";
        let read = |pg: &mut Pg| -> Result<Vec<(String, String)>, String> {
            Ok(pg
                .query(cols_sql, &[&t])
                .map_err(|e| reason(&e))?
                .iter()
                .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
                .collect())
        };
        let mut cols = read(&mut self.pg)?;
        if cols.is_empty() {
            let mut defs = Vec::new();
            for f in schema.fields() {
                let ty = pg_type(f.data_type()).ok_or_else(|| {
                    format!(
                        "column `{}` is {} in the Parquet files, which the load does not map",
                        f.name(),
                        f.data_type()
                    )
                })?;
                defs.push(format!("{} {ty}", quote_column(f.name())));
            }
            defs.push(format!(
                "{} timestamp with time zone NOT NULL",
                quote_column(WINDOW_COLUMN)
            ));
            let schema_sql = match self.spec.table.split_once('.') {
                Some((s, _)) => format!("CREATE SCHEMA IF NOT EXISTS {};", quote_column(s)),
                None => String::new(),
            };
            // Under a lock, so that two loaders creating it at once do not
            // both try.
            let sql = format!(
                "BEGIN; SELECT pg_advisory_xact_lock(hashtextextended({lit}, 0)); {schema_sql} CREATE TABLE IF NOT EXISTS {t} ({defs}); CREATE INDEX IF NOT EXISTS {idx} ON {t} ({wc}); COMMIT;",
                lit = literal(&format!("highwater-load:{}", self.spec.table)),
                defs = defs.join(", "),
                idx = quote_column(&index_name(&self.spec.table)),
                wc = quote_column(WINDOW_COLUMN),
            );
            if let Err(e) = self.pg.batch_execute(&sql) {
                let _ = self.pg.batch_execute("ROLLBACK");
                return Err(format!("creating the table: {}", reason(&e)));
            }
            cols = read(&mut self.pg)?;
        }
        // Every column of the files, and the window column, with a type
        // the binary COPY fits.
        let mut wrong = Vec::new();
        let mut missing = Vec::new();
        let want = schema
            .fields()
            .iter()
            .map(|f| {
                (
                    f.name().as_str(),
                    pg_type(f.data_type()).unwrap_or_else(|| "?".into()),
                )
            })
            .chain(std::iter::once((
                WINDOW_COLUMN,
                "timestamp with time zone".to_string(),
            )));
        for (name, ty) in want {
            match cols.iter().find(|(c, _)| c == name) {
                None => missing.push(format!("{} {ty}", quote_column(name))),
                Some((_, have)) if !compatible(&ty, have) => {
                    wrong.push(format!("`{name}` is {have}, the windows have {ty}"))
                }
                Some(_) => {}
            }
        }
        // Columns added at the source since the table was made: added by
        // this window's load, in its transaction (the schema rule already
        // let them through: columns are only ever added).
        let window_missing = missing
            .iter()
            .any(|m| m.starts_with(&quote_column(WINDOW_COLUMN)));
        if !missing.is_empty() && !window_missing && wrong.is_empty() {
            self.add_columns = std::mem::take(&mut missing);
            self.checked = None;
            return Ok(cols);
        }
        if !missing.is_empty() {
            return Err(format!(
                "the table lacks column(s) the windows have: add them (ALTER TABLE {t} ADD COLUMN {}){}",
                missing.join(", ADD COLUMN "),
                if missing.iter().any(|m| m.starts_with(&quote_column(WINDOW_COLUMN))) {
                    format!("; `{WINDOW_COLUMN}` holds each row's window start, which a window's load replaces by")
                } else {
                    String::new()
                }
            ));
        }
        if !wrong.is_empty() {
            return Err(format!(
                "column types differ: {}; alter the table's columns to those types",
                wrong.join("; ")
            ));
        }
        self.checked = Some(cols.clone());
        Ok(cols)
    }

    /// Loads one published window (its folder `dir`, its Parquet `files`)
    /// in one transaction replacing the rows of the window starting at
    /// `start_us`. `rows`: what the files hold (see [`Rows`]).
    pub fn load_window(
        &mut self,
        start_us: i64,
        dir: &Path,
        files: &[String],
        rows: Rows,
    ) -> Result<Loaded, String> {
        use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
        let open = |f: &str| -> Result<ParquetRecordBatchReaderBuilder<std::fs::File>, String> {
            let p = dir.join(f);
            let file = std::fs::File::open(&p)
                .map_err(|e| format!("reading the published file {}: {e}", p.display()))?;
            // The Parquet schema, not an Arrow schema a writer embedded:
            // another engine's files (delta-rs) ask for Utf8View and other
            // view types that name the same Parquet columns.
            let options = parquet::arrow::arrow_reader::ArrowReaderOptions::new()
                .with_skip_arrow_metadata(true);
            ParquetRecordBatchReaderBuilder::try_new_with_options(file, options)
                .map_err(|e| format!("reading the published file {}: {e}", p.display()))
        };
        // A batch as the COPY takes it: a Delta table's files carry the
        // window stamp already (the load writes its own, the same value,
        // after the row), and files of the table's current state hold
        // other windows' rows too.
        let shape = |b: RecordBatch| -> Result<RecordBatch, String> {
            let b = match rows {
                Rows::Stamped => crate::delta::rewrite::only(
                    &b,
                    &crate::delta::rewrite::Taken::stamps([start_us]),
                )?,
                Rows::Manifest(_) => b,
            };
            let keep: Vec<usize> = (0..b.num_columns())
                .filter(|&i| b.schema().field(i).name() != WINDOW_COLUMN)
                .collect();
            b.project(&keep).map_err(|e| e.to_string())
        };
        let schema = match files.first() {
            // As the projection reads it: the stamp left out.
            Some(f) => arrow_schema::Schema::new(
                open(f)?
                    .schema()
                    .fields()
                    .iter()
                    .filter(|f| f.name() != WINDOW_COLUMN)
                    .cloned()
                    .collect::<Vec<_>>(),
            ),
            // An empty window: its old rows go, nothing comes in.
            None => arrow_schema::Schema::empty(),
        };
        if !files.is_empty() {
            self.table_columns(&schema)?;
        }
        let t = self.spec.table_sql();
        let wc = quote_column(WINDOW_COLUMN);
        let lock_key = format!("highwater-load:{}@{start_us}", self.spec.table);
        let result = (|| -> Result<Loaded, String> {
            self.pg.batch_execute("BEGIN").map_err(|e| reason(&e))?;
            self.pg
                .query(
                    "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                    &[&lock_key],
                )
                .map_err(|e| reason(&e))?;
            for def in &self.add_columns {
                self.pg
                    .batch_execute(&format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {def}"))
                    .map_err(|e| format!("adding column {def}: {}", reason(&e)))?;
            }
            let deleted = match self.pg.query_one(
                &format!("WITH d AS (DELETE FROM {t} WHERE {wc} = 'epoch'::timestamptz + $1::int8 * interval '1 microsecond' RETURNING 1) SELECT count(*) FROM d"),
                &[&start_us],
            ) {
                Ok(r) => r.get::<_, i64>(0) as u64,
                // No table yet and nothing to copy: nothing to replace.
                Err(e) if files.is_empty() && e.code() == Some(&postgres::error::SqlState::UNDEFINED_TABLE) => {
                    return Ok(Loaded { rows: 0, replaced_rows: 0 });
                }
                Err(e) => return Err(reason(&e)),
            };
            let mut copied = 0;
            if !files.is_empty() {
                let names: Vec<String> = schema
                    .fields()
                    .iter()
                    .map(|f| quote_column(f.name()))
                    .chain(std::iter::once(wc.clone()))
                    .collect();
                let sql = format!("COPY {t} ({}) FROM STDIN (FORMAT binary)", names.join(", "));
                let mut readers = files.iter();
                let mut batches: Option<parquet::arrow::arrow_reader::ParquetRecordBatchReader> =
                    None;
                let mut started = false;
                let mut ended = false;
                let window_pg_us = start_us - PG_EPOCH_US;
                let mut pending: Option<(RecordBatch, usize)> = None;
                let mut next = || -> Result<Option<bytes::Bytes>, String> {
                    if ended {
                        return Ok(None);
                    }
                    let mut buf = BytesMut::with_capacity(COPY_CHUNK_BYTES_MAX + (64 << 10));
                    if !started {
                        buf.put_slice(b"PGCOPY\n\xff\r\n\0");
                        buf.put_i32(0);
                        buf.put_i32(0);
                        started = true;
                    }
                    while buf.len() < COPY_CHUNK_BYTES_MAX {
                        if let Some((b, at)) = pending.take() {
                            let cols = columns(&b)?;
                            // A slice of rows at a time keeps the chunk near
                            // its bound whatever the batch's size.
                            let step = 4096.min(b.num_rows() - at);
                            encode(&cols, at, at + step, window_pg_us, &mut buf);
                            if at + step < b.num_rows() {
                                pending = Some((b, at + step));
                            }
                            continue;
                        }
                        if let Some(r) = batches.as_mut() {
                            match r.next() {
                                Some(b) => {
                                    let b =
                                        shape(b.map_err(|e| {
                                            format!("reading a published file: {e}")
                                        })?)?;
                                    if b.num_rows() > 0 {
                                        pending = Some((b, 0));
                                    }
                                    continue;
                                }
                                None => batches = None,
                            }
                        }
                        match readers.next() {
                            Some(f) => {
                                let b = open(f)?;
                                // Names and types: another engine's
                                // rewrite may differ in nullability.
                                let same = b
                                    .schema()
                                    .fields()
                                    .iter()
                                    .filter(|f| f.name() != WINDOW_COLUMN)
                                    .map(|f| (f.name(), f.data_type()))
                                    .eq(schema.fields().iter().map(|f| (f.name(), f.data_type())));
                                if !same {
                                    return Err(format!("the published file {} has another schema than {}; re-land the window", dir.join(f).display(), dir.join(&files[0]).display()));
                                }
                                batches = Some(b.build().map_err(|e| {
                                    format!("reading {}: {e}", dir.join(f).display())
                                })?);
                            }
                            None => {
                                buf.put_i16(-1);
                                ended = true;
                                break;
                            }
                        }
                    }
                    Ok(Some(buf.freeze()))
                };
                copied = self.pg.copy_in(&sql, &mut next)?;
            }
            if let Rows::Manifest(expected) = rows {
                if copied != expected {
                    return Err(format!(
                        "the COPY counted {copied} rows, the window's manifest {expected}; nothing was loaded"
                    ));
                }
            }
            if std::env::var_os("HIGHWATER_FAILPOINT").is_some_and(|v| v == "load-gate") {
                // For the reader test: the window's new rows are written,
                // not committed, while the test's reader counts.
                crate::failpoints::gate();
            }
            self.pg.batch_execute("COMMIT").map_err(|e| reason(&e))?;
            Ok(Loaded {
                rows: copied,
                replaced_rows: deleted,
            })
        })();
        if result.is_err() {
            let _ = self.pg.batch_execute("ROLLBACK");
        } else {
            self.add_columns.clear();
        }
        result
    }
}

/// What happened to one window's load in a run.
#[derive(Clone, Debug, serde::Serialize, PartialEq)]
pub struct LoadOutcome {
    pub start: String,
    pub end: String,
    pub table: String,
    /// loaded or failed.
    pub status: &'static str,
    pub rows: u64,
    pub replaced_rows: u64,
    pub duration_ms: u64,
    pub error: Option<String>,
}

/// A window's load state, as its record keeps it (`extra.load`) and the
/// grid shows it.
#[derive(Clone, Debug, serde::Serialize, PartialEq)]
pub struct LoadCell {
    /// loaded, failed, or pending (published, this version not loaded yet).
    pub status: &'static str,
    pub table: Option<String>,
    pub rows: Option<i64>,
    pub at: Option<String>,
    pub error: Option<String>,
}

/// Whether the record's current version (its token) is in the warehouse.
pub(crate) fn loaded(r: &WindowRecord) -> bool {
    r.extra["load"]["status"] == "loaded" && r.extra["load"]["token"] == r.token.as_str()
}

/// The load state of a published window.
pub(crate) fn cell(r: &WindowRecord) -> LoadCell {
    let l = &r.extra["load"];
    let this_version = l["token"] == r.token.as_str();
    let status = match l["status"].as_str() {
        Some("loaded") if this_version => "loaded",
        Some("failed") if this_version => "failed",
        _ => "pending",
    };
    LoadCell {
        status,
        table: l["table"].as_str().map(str::to_string),
        rows: l["rows"].as_i64().filter(|_| status == "loaded"),
        at: l["at_ns"]
            .as_i64()
            .map(|ns| highwater_core::window::format_rfc3339(ns / 1000)),
        error: l["error"]
            .as_str()
            .filter(|_| status == "failed")
            .map(str::to_string),
    }
}

/// The window column's index, named after the table (cut to fit).
fn index_name(table: &str) -> String {
    let base = table.rsplit('.').next().unwrap_or(table);
    let mut n = format!("{base}{WINDOW_COLUMN}_idx");
    n.truncate(IDENT_BYTES_MAX);
    n
}

/// A string literal for SQL (only ever our own validated names).
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}
