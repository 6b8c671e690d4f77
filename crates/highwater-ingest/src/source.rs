//! Reading one window from a source, streaming, in one snapshot: the
//! duplicate-key count and the rows come from the same consistent view.
//! Window bounds are always bound parameters; identifiers are quoted.

use crate::config::{quote_column, Kind, SourceSpec};
use crate::error::IngestError;
use crate::sink::{ColType, Column, ParquetSink, Value};
use highwater_core::window::format_rfc3339;

/// Which rows a window takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pred {
    /// `lo_us <= cursor < hi_us`.
    Time { lo_us: i64, hi_us: i64 },
    /// `lo < id <= hi` (`lo = None`: from the first id).
    Ids { lo: Option<i64>, hi: i64 },
}

/// One key range of a chunked window on the `chunk_by` column: `lo <= c <
/// hi`; an open end is unbounded, and the first chunk (`lo = None`) also
/// takes the rows whose key is NULL, so the chunks partition the window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyRange {
    pub lo: Option<i64>,
    pub hi: Option<i64>,
}

/// What one read covers: a window, or one chunk of it read in the
/// coordinator's exported snapshot.
#[derive(Clone, Copy, Debug)]
pub struct Scope<'a> {
    pub pred: Pred,
    pub chunk: Option<(&'a str, KeyRange)>,
    pub snapshot: Option<&'a str>,
}

/// How a chunked window is cut, decided in the snapshot all its chunks read.
#[derive(Clone, Debug, PartialEq)]
pub struct ChunkPlan {
    /// The exported snapshot's id (`pg_export_snapshot()`).
    pub snapshot: String,
    /// The planner's estimate of the window's rows.
    pub estimate_rows: i64,
    /// The chunks, in key order; together they cover every key.
    pub ranges: Vec<KeyRange>,
    /// Keys that occur more than once in the window (`None`: not asked).
    pub duplicate_keys: Option<u64>,
}

/// Chunks a window may be cut into: bounds the connections a window opens
/// over its life and the size of its record.
pub const CHUNKS_MAX: usize = 256;

/// Rows sampled to place chunk boundaries: enough for quantiles within a
/// fraction of a percent, read from a sample of the table's pages.
pub const CHUNK_SAMPLE_ROWS: f64 = 20_000.0;

/// A connection to a source.
pub trait Reader: Send {
    fn columns(&mut self) -> Result<Vec<Column>, IngestError>;
    /// Streams one window (or one chunk of it) into `sink` and returns how
    /// many keys occur more than once in it (`None` when not asked).
    fn read(
        &mut self,
        scope: &Scope<'_>,
        unique: bool,
        sink: &mut ParquetSink,
        window: &str,
    ) -> Result<Option<u64>, IngestError>;
    /// Opens a window's consistent read for its chunks: exports the
    /// snapshot, counts duplicate keys in it, and cuts the key space of
    /// `chunk_by` into ranges of about `chunk_rows` rows from the table's
    /// statistics and a sample of its pages, never a full scan. The
    /// snapshot lives until `end_chunks`.
    fn plan_chunks(
        &mut self,
        pred: &Pred,
        unique: bool,
        chunk_by: &str,
        chunk_rows: usize,
        window: &str,
    ) -> Result<ChunkPlan, IngestError> {
        let _ = (pred, unique, chunk_by, chunk_rows, window);
        unreachable!("chunk_by is refused for this source kind at config load")
    }
    /// Whether an index leads with `column` (a chunk reads its key range
    /// through it; without one every chunk scans the whole window).
    fn leads_an_index(&mut self, column: &str) -> Result<bool, IngestError> {
        let _ = column;
        Ok(true)
    }
    /// Ends the read `plan_chunks` opened.
    fn end_chunks(&mut self) -> Result<(), IngestError> {
        Ok(())
    }
    /// The largest id now (append_id).
    fn max_id(&mut self) -> Result<Option<i64>, IngestError>;
    /// commit_order: the horizon (every transaction below it has ended),
    /// and the windows (by index) of rows written by transactions in
    /// `[from, horizon)`.
    fn horizon_and_late(&mut self, from: Option<i64>) -> Result<(i64, Vec<i64>), IngestError> {
        let _ = from;
        unreachable!("commit_order is refused for this source kind at config load")
    }
    /// commit_order: who holds the horizon back, when someone does.
    fn horizon_holder(&mut self) -> Result<Option<String>, IngestError> {
        Ok(None)
    }
}

/// Cuts a sorted sample of keys into `n` ranges at its quantiles; equal
/// quantiles merge, so a skewed key gives fewer, never empty-bounded, chunks.
pub fn cut(sample: &[i64], n: usize) -> Vec<KeyRange> {
    let mut bounds: Vec<i64> = (1..n)
        .filter_map(|i| sample.get(sample.len() * i / n).copied())
        .collect();
    bounds.dedup();
    if let Some(&first) = sample.first() {
        bounds.retain(|&b| b > first);
    }
    let mut out = Vec::with_capacity(bounds.len() + 1);
    let mut lo = None;
    for b in bounds {
        out.push(KeyRange { lo, hi: Some(b) });
        lo = Some(b);
    }
    out.push(KeyRange { lo, hi: None });
    out
}

pub fn open(spec: &SourceSpec) -> Result<Box<dyn Reader>, IngestError> {
    match spec.kind {
        Kind::Sqlite => Ok(Box::new(SqliteReader::open(spec)?)),
        Kind::Postgres => Ok(Box::new(PgReader::open(spec)?)),
    }
}

fn key_list(spec: &SourceSpec) -> String {
    spec.key
        .iter()
        .map(|k| format!("s.{}", quote_column(k)))
        .collect::<Vec<_>>()
        .join(", ")
}

// ---------------------------------------------------------------- SQLite

pub struct SqliteReader {
    spec: SourceSpec,
    conn: rusqlite::Connection,
}

impl SqliteReader {
    fn open(spec: &SourceSpec) -> Result<SqliteReader, IngestError> {
        let path = match (&spec.path, &spec.url_env) {
            (Some(p), _) => p.clone(),
            (None, Some(var)) => std::env::var_os(var)
                .map(std::path::PathBuf::from)
                .ok_or_else(|| IngestError::MissingEnv {
                    name: spec.name.clone(),
                    var: var.clone(),
                })?,
            (None, None) => unreachable!("checked at config load"),
        };
        let conn = rusqlite::Connection::open_with_flags(
            &path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| IngestError::Connect {
            name: spec.name.clone(),
            message: format!("{}: {e}", path.display()),
        })?;
        let _ = conn.busy_timeout(std::time::Duration::from_secs(30));
        Ok(SqliteReader {
            spec: spec.clone(),
            conn,
        })
    }

    fn pred_sql(&self, pred: &Pred) -> String {
        let c = quote_column(&self.spec.cursor);
        match pred {
            // SQLite keeps times as text; unixepoch normalises every ISO
            // form it accepts, with fractions.
            Pred::Time { .. } => {
                format!("unixepoch(s.{c}, 'subsec') >= ?1 AND unixepoch(s.{c}, 'subsec') < ?2")
            }
            Pred::Ids { lo: Some(_), .. } => format!("s.{c} > ?1 AND s.{c} <= ?2"),
            Pred::Ids { lo: None, .. } => format!("s.{c} <= ?1"),
        }
    }

    fn params(pred: &Pred) -> Vec<rusqlite::types::Value> {
        use rusqlite::types::Value as V;
        match *pred {
            Pred::Time { lo_us, hi_us } => {
                vec![V::Real(lo_us as f64 / 1e6), V::Real(hi_us as f64 / 1e6)]
            }
            Pred::Ids { lo: Some(lo), hi } => vec![V::Integer(lo), V::Integer(hi)],
            Pred::Ids { lo: None, hi } => vec![V::Integer(hi)],
        }
    }

    /// The type of column `i` (`name`), which has no declared type, from
    /// the storage classes of its values over the whole relation (issue
    /// 46: SQLite reports no type for an expression): integers only →
    /// int64; integers and reals → float64; text → utf8; blobs → binary;
    /// no value at all → utf8. Text beside numbers is refused, naming the
    /// CAST to write.
    fn inferred(&self, name: &str) -> Result<ColType, IngestError> {
        let bad = |e: rusqlite::Error| IngestError::Schema {
            name: self.spec.name.clone(),
            message: format!("cannot read the values of column `{name}` to type it: {e}"),
        };
        let sql = format!(
            "SELECT DISTINCT typeof(s.{}) FROM {} AS s",
            quote_column(name),
            self.spec.relation_sql()
        );
        let mut stmt = self.conn.prepare(&sql).map_err(bad)?;
        let classes: std::collections::BTreeSet<String> = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(bad)?
            .collect::<Result<_, _>>()
            .map_err(bad)?;
        let has = |c: &str| classes.contains(c);
        let numbers = has("integer") || has("real");
        Ok(match () {
            _ if has("blob") && (numbers || has("text")) || has("text") && numbers => {
                return Err(IngestError::Schema {
                    name: self.spec.name.clone(),
                    message: format!(
                        "column `{name}` has no declared type (an expression in the query) and its values mix {}; give it one type in the query, e.g. `CAST(... AS REAL) AS {name}` or `CAST(... AS TEXT) AS {name}`",
                        classes.iter().filter(|c| *c != "null").cloned().collect::<Vec<_>>().join(" and ")
                    ),
                })
            }
            _ if has("real") => ColType::F64,
            _ if has("integer") => ColType::I64,
            _ if has("blob") => ColType::Bytes,
            _ => ColType::Text,
        })
    }

    fn sql_err(&self, window: &str, e: rusqlite::Error) -> IngestError {
        IngestError::Read {
            name: self.spec.name.clone(),
            window: window.to_string(),
            message: e.to_string(),
        }
    }
}

impl Reader for SqliteReader {
    fn columns(&mut self) -> Result<Vec<Column>, IngestError> {
        let sql = format!("SELECT * FROM {} AS s LIMIT 0", self.spec.relation_sql());
        let stmt = self.conn.prepare(&sql).map_err(|e| IngestError::Schema {
            name: self.spec.name.clone(),
            message: format!("cannot read the columns: {e}"),
        })?;
        let declared: Vec<(String, String)> = stmt
            .columns()
            .iter()
            .map(|c| {
                (
                    c.name().to_string(),
                    c.decl_type().unwrap_or("").to_ascii_uppercase(),
                )
            })
            .collect();
        drop(stmt);
        let mut out = Vec::with_capacity(declared.len());
        for (name, decl) in declared {
            let (ty, source_type) = if decl.is_empty() {
                // An expression (`amount * 2 AS amount`) has no declared
                // type: its type is read from the values it gives.
                let ty = self.inferred(&name)?;
                (
                    ty,
                    format!("(no declared type; its values are {})", ty.name()),
                )
            } else if decl.contains("INT") {
                (ColType::I64, decl.to_ascii_lowercase())
            } else if decl.contains("REAL") || decl.contains("FLOA") || decl.contains("DOUB") {
                (ColType::F64, decl.to_ascii_lowercase())
            } else if decl.contains("BLOB") {
                (ColType::Bytes, decl.to_ascii_lowercase())
            } else {
                (ColType::Text, decl.to_ascii_lowercase())
            };
            out.push(Column {
                name,
                ty,
                source_type,
            });
        }
        Ok(out)
    }

    fn read(
        &mut self,
        scope: &Scope<'_>,
        unique: bool,
        sink: &mut ParquetSink,
        window: &str,
    ) -> Result<Option<u64>, IngestError> {
        assert!(scope.chunk.is_none(), "SQLite sources are never chunked");
        let pred = &scope.pred;
        let rel = self.spec.relation_sql();
        let where_ = self.pred_sql(pred);
        let params = Self::params(pred);
        // One read transaction: both statements see the same snapshot.
        let tx = self
            .conn
            .unchecked_transaction()
            .map_err(|e| self.sql_err(window, e))?;
        let dups = if unique {
            let sql = format!(
                "SELECT count(*) FROM (SELECT 1 FROM {rel} AS s WHERE {where_} GROUP BY {} HAVING count(*) > 1)",
                key_list(&self.spec)
            );
            let n: i64 = tx
                .query_row(&sql, rusqlite::params_from_iter(params.iter()), |r| {
                    r.get(0)
                })
                .map_err(|e| self.sql_err(window, e))?;
            Some(n as u64)
        } else {
            None
        };
        let sql = format!("SELECT * FROM {rel} AS s WHERE {where_}");
        let mut stmt = tx.prepare(&sql).map_err(|e| self.sql_err(window, e))?;
        let ncols = stmt.column_count();
        let mut rows = stmt
            .query(rusqlite::params_from_iter(params.iter()))
            .map_err(|e| self.sql_err(window, e))?;
        while let Some(row) = rows.next().map_err(|e| self.sql_err(window, e))? {
            use rusqlite::types::ValueRef as R;
            let mut vals = Vec::with_capacity(ncols);
            for i in 0..ncols {
                vals.push(match row.get_ref(i).map_err(|e| self.sql_err(window, e))? {
                    R::Null => Value::Null,
                    R::Integer(x) => Value::Int(x),
                    R::Real(x) => Value::Float(x),
                    R::Text(t) => Value::Text(std::str::from_utf8(t).unwrap_or("")),
                    R::Blob(b) => Value::Bytes(b),
                });
            }
            sink.push_row(vals.into_iter())
                .map_err(|message| IngestError::Read {
                    name: self.spec.name.clone(),
                    window: window.to_string(),
                    message,
                })?;
        }
        drop(rows);
        drop(stmt);
        tx.commit().map_err(|e| self.sql_err(window, e))?;
        Ok(dups)
    }

    fn max_id(&mut self) -> Result<Option<i64>, IngestError> {
        let sql = format!(
            "SELECT max(s.{}) FROM {} AS s",
            quote_column(&self.spec.cursor),
            self.spec.relation_sql()
        );
        self.conn
            .query_row(&sql, [], |r| r.get(0))
            .map_err(|e| self.sql_err("(max id)", e))
    }
}

// ------------------------------------------------------------ PostgreSQL

pub struct PgReader {
    spec: SourceSpec,
    client: crate::pg::Pg,
    columns: Option<Vec<(Column, String)>>,
}

/// The 64-bit transaction id of a row version: `xmin` widened against the
/// snapshot's epoch, so that wraparound cannot reorder it.
const ROW_XID: &str = "(CASE WHEN (((pg_snapshot_xmax(pg_current_snapshot())::text::bigint >> 32) << 32) | s.xmin::text::bigint) > pg_snapshot_xmax(pg_current_snapshot())::text::bigint \
     THEN (((pg_snapshot_xmax(pg_current_snapshot())::text::bigint >> 32) << 32) | s.xmin::text::bigint) - 4294967296 \
     ELSE (((pg_snapshot_xmax(pg_current_snapshot())::text::bigint >> 32) << 32) | s.xmin::text::bigint) END)";

impl PgReader {
    fn open(spec: &SourceSpec) -> Result<PgReader, IngestError> {
        let var = spec.url_env.as_ref().expect("checked at config load");
        let url = std::env::var(var).map_err(|_| IngestError::MissingEnv {
            name: spec.name.clone(),
            var: var.clone(),
        })?;
        // The server's reason never contains the URL (and so no
        // password); the variable is named so the operator knows where to
        // look.
        let connect_err = |reason: String| {
            IngestError::Connect {
            name: spec.name.clone(),
            message: format!(
                "{reason} (with the connection string in {var}, which is never printed; check the host, user, password and database in it)"
            ),
        }
        };
        let mut client = crate::pg::Pg::connect(&url).map_err(connect_err)?;
        client
            .batch_execute("SET TIME ZONE 'UTC'")
            .map_err(|e| connect_err(crate::pg::reason(&e)))?;
        Ok(PgReader {
            spec: spec.clone(),
            client,
            columns: None,
        })
    }

    fn err(&self, window: &str, e: postgres::Error) -> IngestError {
        IngestError::Read {
            name: self.spec.name.clone(),
            window: window.to_string(),
            message: crate::pg::reason(&e),
        }
    }

    /// Columns with the select expression that reads each one natively.
    fn described(&mut self) -> Result<Vec<(Column, String)>, IngestError> {
        if let Some(c) = &self.columns {
            return Ok(c.clone());
        }
        use postgres::types::Type;
        let sql = format!("SELECT * FROM {} AS s LIMIT 0", self.spec.relation_sql());
        let stmt = self.client.prepare(&sql).map_err(|e| IngestError::Schema {
            name: self.spec.name.clone(),
            message: format!(
                "cannot read the columns of {}: {}; {}",
                match &self.spec.relation {
                    crate::config::Relation::Table(t) => format!("table `{t}`"),
                    crate::config::Relation::Query(_) => "the query".to_string(),
                },
                crate::pg::reason(&e),
                if e.code() == Some(&postgres::error::SqlState::UNDEFINED_TABLE) {
                    format!(
                        "was it renamed or dropped? `table` (or `query`) in [sources.{}] names what is read",
                        self.spec.name
                    )
                } else {
                    format!("check `table` (or `query`) in [sources.{}]", self.spec.name)
                }
            ),
        })?;
        let cols: Vec<(Column, String)> = stmt
            .columns()
            .iter()
            .map(|c| {
                let q = format!("s.{}", quote_column(c.name()));
                let (ty, expr) = match *c.type_() {
                    Type::BOOL => (ColType::Bool, q),
                    Type::INT2 => (ColType::I16, q),
                    Type::INT4 => (ColType::I32, q),
                    Type::INT8 => (ColType::I64, q),
                    Type::FLOAT4 => (ColType::F32, q),
                    Type::FLOAT8 => (ColType::F64, q),
                    Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => (ColType::Text, q),
                    Type::BYTEA => (ColType::Bytes, q),
                    // Read in binary as they are (µs or days since 2000-01-01),
                    // see `copy`: no conversion on the server.
                    Type::TIMESTAMPTZ => (ColType::TimestampTz, q),
                    Type::TIMESTAMP => (ColType::Timestamp, q),
                    Type::DATE => (ColType::Date, q),
                    _ => (ColType::Text, format!("{q}::text")),
                };
                (
                    Column {
                        name: c.name().to_string(),
                        ty,
                        // `numeric(p,s)` with its precision: a Delta table lands
                        // it as decimal(p,s) (`delta::schema::table_columns`).
                        source_type: match (c.type_(), c.type_modifier()) {
                            (&Type::NUMERIC, m) if m >= 4 => {
                                format!(
                                    "numeric({},{})",
                                    ((m - 4) >> 16) & 0xffff,
                                    (m - 4) & 0xffff
                                )
                            }
                            (t, _) => t.name().to_string(),
                        },
                    },
                    expr,
                )
            })
            .collect();
        self.columns = Some(cols.clone());
        Ok(cols)
    }

    fn pred_sql(&self, pred: &Pred) -> String {
        let c = format!("s.{}", quote_column(&self.spec.cursor));
        match pred {
            // Parameters are typed explicitly, so that the text and int8 we
            // bind fit whatever type the cursor column has.
            Pred::Time { .. } => {
                format!("{c} >= $1::text::timestamptz AND {c} < $2::text::timestamptz")
            }
            Pred::Ids { lo: Some(_), .. } => format!("{c} > $1::int8 AND {c} <= $2::int8"),
            Pred::Ids { lo: None, .. } => format!("{c} <= $1::int8"),
        }
    }
}

enum PgParam {
    Text(String),
    Int(i64),
}

fn pg_params(pred: &Pred) -> Vec<PgParam> {
    match *pred {
        Pred::Time { lo_us, hi_us } => vec![
            PgParam::Text(format_rfc3339(lo_us)),
            PgParam::Text(format_rfc3339(hi_us)),
        ],
        Pred::Ids { lo: Some(lo), hi } => vec![PgParam::Int(lo), PgParam::Int(hi)],
        Pred::Ids { lo: None, hi } => vec![PgParam::Int(hi)],
    }
}

fn as_sql(p: &PgParam) -> &(dyn postgres::types::ToSql + Sync) {
    match p {
        PgParam::Text(s) => s,
        PgParam::Int(i) => i,
    }
}

impl PgReader {
    /// The window's predicate with its bounds as literals of our own
    /// rendering (digits and RFC 3339 only): COPY takes no parameters.
    fn pred_literal(&self, pred: &Pred) -> String {
        let c = format!("s.{}", quote_column(&self.spec.cursor));
        match *pred {
            Pred::Time { lo_us, hi_us } => format!(
                "{c} >= '{}'::timestamptz AND {c} < '{}'::timestamptz",
                format_rfc3339(lo_us),
                format_rfc3339(hi_us)
            ),
            Pred::Ids { lo: Some(lo), hi } => format!("{c} > {lo}::int8 AND {c} <= {hi}::int8"),
            Pred::Ids { lo: None, hi } => format!("{c} <= {hi}::int8"),
        }
    }

    fn range_literal(column: &str, r: &KeyRange) -> String {
        let c = format!("s.{}", quote_column(column));
        match (r.lo, r.hi) {
            (None, None) => "true".into(),
            (None, Some(hi)) => format!("({c} < {hi}::int8 OR {c} IS NULL)"),
            (Some(lo), None) => format!("{c} >= {lo}::int8"),
            (Some(lo), Some(hi)) => format!("{c} >= {lo}::int8 AND {c} < {hi}::int8"),
        }
    }

    /// Whether a primary key or unique index on exactly the key columns
    /// makes a duplicate key impossible (then the GROUP BY is skipped).
    fn key_guaranteed(&mut self) -> Result<bool, postgres::Error> {
        match &self.spec.relation {
            crate::config::Relation::Table(t) => {
                let sql = "SELECT coalesce(bool_or(ARRAY(SELECT a.attname::text FROM unnest(i.indkey) k \
                                JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k ORDER BY 1) = $2::text[]), false) \
                           FROM pg_index i WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indpred IS NULL";
                let mut key = self.spec.key.clone();
                key.sort();
                let rel_text = crate::config::quote_ident(t);
                Ok(self
                    .client
                    .query_one(sql, &[&rel_text, &key])?
                    .get::<_, bool>(0))
            }
            crate::config::Relation::Query(_) => Ok(false),
        }
    }

    /// The unique-key check in the current transaction: `None` when not
    /// asked, 0 when an index makes duplicates impossible, else the count.
    fn key_check(&mut self, pred: &Pred, unique: bool) -> Result<Option<u64>, postgres::Error> {
        if !unique {
            return Ok(None);
        }
        if self.key_guaranteed()? {
            return Ok(Some(0));
        }
        self.duplicate_keys(pred).map(Some)
    }

    /// Counts keys occurring more than once, in the current transaction.
    fn duplicate_keys(&mut self, pred: &Pred) -> Result<u64, postgres::Error> {
        let rel = self.spec.relation_sql();
        let where_ = self.pred_sql(pred);
        let keys = key_list(&self.spec);
        let params = pg_params(pred);
        let sql = format!(
            "SELECT count(*) FROM (SELECT 1 FROM {rel} AS s WHERE {where_} GROUP BY {keys} HAVING count(*) > 1) d"
        );
        let refs: Vec<_> = params.iter().map(as_sql).collect();
        let n: i64 = self.client.query_one(&sql, &refs)?.get(0);
        Ok(n as u64)
    }
}

impl Reader for PgReader {
    fn columns(&mut self) -> Result<Vec<Column>, IngestError> {
        Ok(self.described()?.into_iter().map(|(c, _)| c).collect())
    }

    fn read(
        &mut self,
        scope: &Scope<'_>,
        unique: bool,
        sink: &mut ParquetSink,
        window: &str,
    ) -> Result<Option<u64>, IngestError> {
        let cols = self.described()?;
        let rel = self.spec.relation_sql();
        let mut where_ = self.pred_literal(&scope.pred);
        if let Some((column, range)) = &scope.chunk {
            where_ = format!("{where_} AND {}", Self::range_literal(column, range));
        }
        let name = self.spec.name.clone();
        let werr = |e: postgres::Error| IngestError::Read {
            name: name.clone(),
            window: window.to_string(),
            message: crate::pg::reason(&e),
        };
        // One read-only repeatable-read transaction: the duplicate count
        // and the rows see the same snapshot; a chunk joins the snapshot
        // its window's coordinator exported.
        self.client
            .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .map_err(werr)?;
        let result = (|| -> Result<Option<u64>, IngestError> {
            if let Some(id) = scope.snapshot {
                // The id is the server's own (from pg_export_snapshot); it is
                // checked anyway before it is spliced in.
                assert!(
                    id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'),
                    "a snapshot id from pg_export_snapshot"
                );
                self.client
                    .batch_execute(&format!("SET TRANSACTION SNAPSHOT '{id}'"))
                    .map_err(werr)?;
            }
            let dups = self.key_check(&scope.pred, unique).map_err(werr)?;
            let list = cols
                .iter()
                .map(|(_, e)| e.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            let sql = format!(
                "COPY (SELECT {list} FROM {rel} AS s WHERE {where_}) TO STDOUT (FORMAT binary)"
            );
            let columns: Vec<Column> = cols.iter().map(|(c, _)| c.clone()).collect();
            let derr = |message: String| IngestError::Read {
                name: name.clone(),
                window: window.to_string(),
                message,
            };
            let mut dec = crate::copy::CopyDecoder::new();
            self.client
                .copy_out(&sql, |chunk| dec.feed(chunk, &columns, sink))
                .map_err(derr)?;
            dec.finish().map_err(derr)?;
            Ok(dups)
        })();
        match result {
            Ok(d) => {
                self.client.batch_execute("COMMIT").map_err(werr)?;
                Ok(d)
            }
            Err(e) => {
                let _ = self.client.batch_execute("ROLLBACK");
                Err(e)
            }
        }
    }

    fn plan_chunks(
        &mut self,
        pred: &Pred,
        unique: bool,
        chunk_by: &str,
        chunk_rows: usize,
        window: &str,
    ) -> Result<ChunkPlan, IngestError> {
        let name = self.spec.name.clone();
        let werr = |e: postgres::Error| IngestError::Read {
            name: name.clone(),
            window: window.to_string(),
            message: crate::pg::reason(&e),
        };
        let cols = self.described()?;
        match cols.iter().find(|(c, _)| c.name == chunk_by) {
            Some((c, _)) if matches!(c.ty, ColType::I16 | ColType::I32 | ColType::I64) => {}
            Some(_) => {
                return Err(IngestError::Schema {
                    name,
                    message: format!("chunk_by column `{chunk_by}` is not an integer column; chunk by an indexed integer key"),
                })
            }
            None => {
                return Err(IngestError::Schema {
                    name,
                    message: format!("chunk_by names `{chunk_by}`, which the table does not have"),
                })
            }
        }
        let crate::config::Relation::Table(table) = &self.spec.relation else {
            unreachable!("chunk_by with a query is refused at config load")
        };
        let table = crate::config::quote_ident(table);
        let rel = self.spec.relation_sql();
        let where_ = self.pred_literal(pred);
        let c = format!("s.{}", quote_column(chunk_by));
        self.client
            .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .map_err(werr)?;
        let plan = (|| -> Result<ChunkPlan, IngestError> {
            let snapshot: String = self
                .client
                .query_one("SELECT pg_export_snapshot()", &[])
                .map_err(werr)?
                .get(0);
            let duplicate_keys = self.key_check(pred, unique).map_err(werr)?;
            // The planner's estimate of the window's rows, from the table's
            // statistics.
            let explain = self
                .client
                .simple_query(&format!(
                    "EXPLAIN (FORMAT JSON) SELECT 1 FROM {rel} AS s WHERE {where_}"
                ))
                .map_err(werr)?;
            let explain: serde_json::Value = explain
                .iter()
                .find_map(|m| match m {
                    postgres::SimpleQueryMessage::Row(r) => r.get(0),
                    _ => None,
                })
                .and_then(|t| serde_json::from_str(t).ok())
                .unwrap_or(serde_json::Value::Null);
            let estimate_rows = explain[0]["Plan"]["Plan Rows"].as_f64().unwrap_or(0.0) as i64;
            let wanted = (estimate_rows as f64 / chunk_rows.max(1) as f64).ceil() as usize;
            let wanted = wanted.clamp(1, CHUNKS_MAX);
            let mut ranges = vec![KeyRange { lo: None, hi: None }];
            if wanted > 1 {
                let reltuples: f64 = self
                    .client
                    .query_one(
                        "SELECT coalesce((SELECT reltuples::float8 FROM pg_class WHERE oid = to_regclass($1)), -1)",
                        &[&table],
                    )
                    .map_err(werr)?
                    .get(0);
                let pct = if reltuples > 0.0 {
                    (CHUNK_SAMPLE_ROWS / reltuples * 100.0).clamp(0.0001, 100.0)
                } else {
                    100.0
                };
                let sample: Vec<i64> = self
                    .client
                    .query(
                        &format!(
                            "SELECT {c}::int8 FROM {rel} AS s TABLESAMPLE SYSTEM ({pct}) REPEATABLE (0) \
                             WHERE {where_} AND {c} IS NOT NULL ORDER BY 1"
                        ),
                        &[],
                    )
                    .map_err(werr)?
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                ranges = cut(&sample, wanted);
            }
            Ok(ChunkPlan {
                snapshot,
                estimate_rows,
                ranges,
                duplicate_keys,
            })
        })();
        if plan.is_err() {
            let _ = self.client.batch_execute("ROLLBACK");
        }
        plan
    }

    fn leads_an_index(&mut self, column: &str) -> Result<bool, IngestError> {
        let crate::config::Relation::Table(t) = &self.spec.relation else {
            return Ok(true);
        };
        let sql = "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a \
                     ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
                   WHERE i.indrelid = to_regclass($1) AND a.attname = $2 AND i.indpred IS NULL)";
        let rel = crate::config::quote_ident(t);
        let row = self
            .client
            .query_one(sql, &[&rel, &column])
            .map_err(|e| self.err("(chunk_by index)", e))?;
        Ok(row.get(0))
    }

    fn end_chunks(&mut self) -> Result<(), IngestError> {
        self.client
            .batch_execute("COMMIT")
            .map_err(|e| self.err("(chunks)", e))
    }

    fn max_id(&mut self) -> Result<Option<i64>, IngestError> {
        let sql = format!(
            "SELECT max(s.{})::int8 FROM {} AS s",
            quote_column(&self.spec.cursor),
            self.spec.relation_sql()
        );
        let row = self
            .client
            .query_one(&sql, &[])
            .map_err(|e| self.err("(max id)", e))?;
        Ok(row.get(0))
    }

    fn horizon_and_late(&mut self, from: Option<i64>) -> Result<(i64, Vec<i64>), IngestError> {
        let rel = self.spec.relation_sql();
        let c = format!("s.{}", quote_column(&self.spec.cursor));
        let (start, interval) = (self.spec.grid.start_us, self.spec.grid.interval_us);
        let name = self.spec.name.clone();
        let werr = |e: postgres::Error| IngestError::Read {
            name: name.clone(),
            window: "(horizon)".into(),
            message: crate::pg::reason(&e),
        };
        self.client
            .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .map_err(werr)?;
        let tx = &mut self.client;
        // Every transaction below the snapshot's xmin has ended: rows it
        // wrote are visible now or never will be. Everything at or above it
        // will show up in a later run, as a row with a larger id.
        let horizon: i64 = tx
            .query_one(
                "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint",
                &[],
            )
            .map_err(werr)?
            .get(0);
        let late = match from {
            None => Vec::new(),
            Some(from) => {
                let sql = format!(
                    "SELECT DISTINCT floor((extract(epoch FROM {c}) * 1000000 - $1::int8) / $2::int8)::int8 \
                     FROM {rel} AS s WHERE {ROW_XID} >= $3::int8 AND {c} IS NOT NULL"
                );
                tx.query(&sql, &[&start, &interval, &from])
                    .map_err(werr)?
                    .iter()
                    .map(|r| r.get::<_, i64>(0))
                    .collect()
            }
        };
        tx.batch_execute("COMMIT").map_err(werr)?;
        Ok((horizon, late))
    }

    fn horizon_holder(&mut self) -> Result<Option<String>, IngestError> {
        let rows = self
            .client
            .query(
                "SELECT pid, coalesce(state, ''), coalesce(backend_xid::text, backend_xmin::text), \
                        coalesce(extract(epoch FROM now() - xact_start)::int8, 0) \
                 FROM pg_stat_activity \
                 WHERE (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL) AND pid <> pg_backend_pid() \
                 ORDER BY xact_start NULLS LAST LIMIT 1",
                &[],
            )
            .map_err(|e| self.err("(horizon)", e))?;
        Ok(rows.first().map(|r| {
            let pid: i32 = r.get(0);
            let state: String = r.get(1);
            let xid: String = r.get(2);
            let secs: i64 = r.get(3);
            format!("horizon pinned by xid {xid} (pid {pid}, {state}) for {secs}s")
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the sample, the ranges partition the key space: the
        /// first is open below (and takes NULL keys), the last open above,
        /// each starts where the one before ends, and none is empty-bounded.
        #[test]
        fn cut_partitions_the_key_space(mut sample in proptest::collection::vec(-50i64..50, 0..200), n in 1usize..20) {
            sample.sort();
            let r = cut(&sample, n);
            prop_assert!(!r.is_empty() && r.len() <= n);
            prop_assert_eq!(r[0].lo, None);
            prop_assert_eq!(r[r.len() - 1].hi, None);
            for w in r.windows(2) {
                prop_assert_eq!(w[0].hi, w[1].lo);
                prop_assert!(w[0].lo.is_none_or(|lo| Some(lo) < w[0].hi));
            }
        }
    }
}
