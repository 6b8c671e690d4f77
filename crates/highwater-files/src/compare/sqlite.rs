//! SQLite and GeoPackage: the schema and each table's rows, order-free.
//!
//! Counted: every table's name and columns (name, declared type, NOT NULL,
//! default, primary key position), its rows as a multiset of typed values
//! (so `1` and `1.0` differ, as they do to a reader), and each view's SQL
//! (whitespace aside). In a GeoPackage that includes `gpkg_contents`,
//! `gpkg_spatial_ref_sys` (a changed SRS counts), `gpkg_geometry_columns`
//! and `gpkg_extensions`.
//!
//! Not counted: pages, free pages, the order of rows on disk, `VACUUM`,
//! `page_size`, the header (`user_version`, `application_id`), `sqlite_*`
//! tables (`sqlite_sequence`, `sqlite_stat1`), indexes and triggers (derived
//! or behaviour, not data), rowids that no column names (`VACUUM` may
//! renumber them), R-tree virtual tables (a GeoPackage's spatial index,
//! derived from the geometries) and every virtual table's shadow tables, and
//! the bookkeeping timestamps that GDAL's ogr2ogr rewrites on every export
//! (found by exporting the same features twice and diffing every table):
//! `gpkg_contents.last_change` and `gpkg_metadata_reference.timestamp`.
//!
//! The file is opened read-only (no journal, `-wal` or `-shm` is created by
//! us) in one read transaction, so a writer at work is seen as of one
//! commit; a database that cannot be opened so (a WAL database in a
//! read-only folder) is opened `immutable` only when it has no
//! write-ahead log beside it, since that mode would not see one.

use super::{CompareError, DataDigest, Order, Rows};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};
use std::path::Path;

/// Bookkeeping columns whose values are not data: (table, column).
const BOOKKEEPING: &[(&str, &str)] = &[
    ("gpkg_contents", "last_change"),
    ("gpkg_metadata_reference", "timestamp"),
];

/// How long a read waits for a writer's lock before failing (and the file
/// being compared by its bytes).
const BUSY_TIMEOUT_MS: u64 = 5_000;

pub struct Sqlite;

impl DataDigest for Sqlite {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    fn sniff(&self, head: &[u8]) -> bool {
        head.starts_with(b"SQLite format 3\0")
    }

    fn digest(
        &self,
        path: &Path,
        _order: Order,
        h: &mut blake3::Hasher,
    ) -> Result<(), CompareError> {
        let conn = open(path)?;
        conn.busy_timeout(std::time::Duration::from_millis(BUSY_TIMEOUT_MS))?;
        // Nothing in the file's schema runs on our behalf.
        conn.execute_batch("PRAGMA trusted_schema = OFF; BEGIN")?;
        let objects = objects(&conn)?;
        h.update(&(objects.len() as u64).to_le_bytes());
        for o in &objects {
            put_str(h, &o.kind);
            put_str(h, &o.name);
            match o.kind.as_str() {
                "view" => put_str(h, &squash(&o.sql)),
                _ => table(&conn, o, h)?,
            }
        }
        conn.execute_batch("COMMIT")?;
        Ok(())
    }
}

fn open(path: &Path) -> Result<Connection, CompareError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let first = Connection::open_with_flags(path, flags).and_then(|c| {
        c.query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(()))
            .map(|()| c)
    });
    match first {
        Ok(c) => Ok(c),
        Err(e) => {
            // A log or a hot journal beside it would not be seen.
            for suffix in ["-wal", "-journal"] {
                let mut side = path.as_os_str().to_os_string();
                side.push(suffix);
                if std::fs::metadata(&side).is_ok_and(|m| m.len() > 0) {
                    return Err(e.into());
                }
            }
            let uri = format!("file:{}?immutable=1", uri_path(path)?);
            Ok(Connection::open_with_flags(
                uri,
                flags | OpenFlags::SQLITE_OPEN_URI,
            )?)
        }
    }
}

/// A path as the path part of a `file:` URI: `%`, `?` and `#` escaped.
fn uri_path(path: &Path) -> Result<String, CompareError> {
    let abs = std::path::absolute(path)?;
    let s = abs
        .to_str()
        .ok_or_else(|| CompareError::Other("the path is not UTF-8".into()))?;
    Ok(s.replace('%', "%25")
        .replace('?', "%3f")
        .replace('#', "%23"))
}

struct Object {
    kind: String,
    name: String,
    sql: String,
}

/// The tables and views that hold data, by name.
fn objects(conn: &Connection) -> Result<Vec<Object>, CompareError> {
    // `table_list` knows shadow tables (the module must be compiled in:
    // the bundled SQLite has R-tree, FTS3/4/5 and geopoly).
    let mut st = conn.prepare(
        "SELECT l.name, l.type, coalesce(m.sql, '') FROM pragma_table_list AS l
         LEFT JOIN sqlite_schema AS m ON m.name = l.name AND m.type IN ('table', 'view')
         WHERE l.schema = 'main' ORDER BY l.name",
    )?;
    let rows = st.query_map([], |r| {
        Ok(Object {
            name: r.get(0)?,
            kind: r.get(1)?,
            sql: r.get(2)?,
        })
    })?;
    let mut out = Vec::new();
    for o in rows {
        let o = o?;
        let derived = o.name.starts_with("sqlite_")
            || o.kind == "shadow"
            || (o.kind == "virtual" && is_rtree(&o.sql));
        if !derived {
            out.push(o);
        }
    }
    Ok(out)
}

fn is_rtree(sql: &str) -> bool {
    let s = sql.to_ascii_lowercase();
    s.contains("using rtree") || s.contains("using \"rtree") || s.contains("using rtree_i32")
}

/// Whitespace runs as one space: a view reformatted is the same view.
fn squash(sql: &str) -> String {
    sql.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

fn put_str(h: &mut blake3::Hasher, s: &str) {
    h.update(&(s.len() as u64).to_le_bytes());
    h.update(s.as_bytes());
}

/// A table's columns and its rows.
fn table(conn: &Connection, o: &Object, h: &mut blake3::Hasher) -> Result<(), CompareError> {
    if o.kind == "virtual" {
        // Its module and arguments are its schema.
        put_str(h, &squash(&o.sql));
    }
    let mut st = conn.prepare(&format!(
        "SELECT name, type, \"notnull\", coalesce(dflt_value, ''), pk, hidden FROM pragma_table_xinfo({})",
        quote_literal(&o.name)
    ))?;
    let cols = st
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, i64>(5)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut read = Vec::new();
    h.update(&(cols.len() as u64).to_le_bytes());
    for (name, ty, notnull, dflt, pk, hidden) in &cols {
        put_str(h, name);
        put_str(h, ty);
        put_str(h, dflt);
        h.update(&[*notnull as u8, *pk as u8, *hidden as u8]);
        // Hidden (a virtual table's) and generated columns are not stored
        // data; bookkeeping timestamps are not data.
        let bookkeeping = BOOKKEEPING
            .iter()
            .any(|(t, c)| t.eq_ignore_ascii_case(&o.name) && c.eq_ignore_ascii_case(name));
        if *hidden == 0 && !bookkeeping {
            read.push(quote(name));
        }
    }
    let mut rows = Rows::new(Order::Free);
    if !read.is_empty() {
        let mut st = conn.prepare(&format!(
            "SELECT {} FROM {}",
            read.join(", "),
            quote(&o.name)
        ))?;
        let n = read.len();
        let mut q = st.query([])?;
        while let Some(r) = q.next()? {
            let mut rh = blake3::Hasher::new();
            for i in 0..n {
                put_value(&mut rh, r.get_ref(i)?);
            }
            let b = rh.finalize();
            rows.push(u128::from_le_bytes(
                b.as_bytes()[..16].try_into().expect("16 bytes"),
            ));
        }
    }
    rows.finish_into(h);
    Ok(())
}

/// A string as an SQL literal, for a table-valued pragma's argument.
fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A value with its storage class: a reader sees `1` and `1.0` differently.
fn put_value(h: &mut blake3::Hasher, v: ValueRef<'_>) {
    match v {
        ValueRef::Null => {
            h.update(&[0]);
        }
        ValueRef::Integer(i) => {
            h.update(&[1]);
            h.update(&i.to_le_bytes());
        }
        ValueRef::Real(f) => {
            h.update(&[2]);
            h.update(&f.to_bits().to_le_bytes());
        }
        ValueRef::Text(t) => {
            h.update(&[3]);
            h.update(&(t.len() as u64).to_le_bytes());
            h.update(t);
        }
        ValueRef::Blob(b) => {
            h.update(&[4]);
            h.update(&(b.len() as u64).to_le_bytes());
            h.update(b);
        }
    }
}
