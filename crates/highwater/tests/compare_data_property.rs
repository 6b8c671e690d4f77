//! Issue 49, the property: random edits that change data or only layout,
//! interleaved; the data digest changes exactly when a reader would see
//! different rows. For SQLite: inserts, deletes and updates against
//! `VACUUM`, a `page_size` change, the rows re-inserted in another order
//! into a new file, a row deleted and put back, WAL on and off. For
//! Parquet: other compression, row groups, dictionary and page versions
//! against changed, added, removed and swapped values (a swap is data when
//! order counts, layout when it does not).

use highwater_files::compare::{data_digest, Order};
use proptest::prelude::*;
use std::collections::HashMap;
use std::path::Path;

/// Asserts that `digest` is a function of `model` and that no two models
/// share one: the digest changes exactly when the data does.
fn check<M: std::hash::Hash + Eq + Clone + std::fmt::Debug>(
    seen: &mut HashMap<M, [u8; 32]>,
    by_digest: &mut HashMap<[u8; 32], M>,
    model: &M,
    digest: [u8; 32],
    step: &str,
) -> Result<(), TestCaseError> {
    if let Some(d) = seen.get(model) {
        prop_assert_eq!(*d, digest, "same rows, another digest after {}", step);
    }
    if let Some(m) = by_digest.get(&digest) {
        prop_assert_eq!(m, model, "other rows, the same digest after {}", step);
    }
    seen.insert(model.clone(), digest);
    by_digest.insert(digest, model.clone());
    Ok(())
}

// ---------------------------------------------------------------- SQLite

/// `t` has an INTEGER PRIMARY KEY (the id is data); `u` has none (its
/// rowids are not data, and repeated rows count).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Db {
    t: std::collections::BTreeMap<i64, (String, Option<i64>)>,
    u: Vec<(String, Vec<u8>)>,
}

impl Db {
    /// The model a reader sees: `u` as a multiset.
    fn canon(&self) -> Db {
        let mut c = self.clone();
        c.u.sort();
        c
    }
}

#[derive(Clone, Debug)]
enum SqlOp {
    Insert(i64, String, Option<i64>),
    Delete(usize),
    Update(usize, String),
    InsertU(String, Vec<u8>),
    DeleteU(usize),
    Vacuum,
    PageSize(u32),
    Rebuild,
    Churn,
    Wal,
}

fn sql_op() -> impl Strategy<Value = SqlOp> {
    prop_oneof![
        (0i64..40, "[a-c]{0,3}", proptest::option::of(0i64..3))
            .prop_map(|(i, n, v)| SqlOp::Insert(i, n, v)),
        any::<usize>().prop_map(SqlOp::Delete),
        (any::<usize>(), "[a-c]{0,3}").prop_map(|(i, n)| SqlOp::Update(i, n)),
        ("[xy]{0,2}", proptest::collection::vec(0u8..3, 0..3))
            .prop_map(|(k, v)| SqlOp::InsertU(k, v)),
        any::<usize>().prop_map(SqlOp::DeleteU),
        Just(SqlOp::Vacuum),
        prop_oneof![Just(1024u32), Just(4096), Just(65536)].prop_map(SqlOp::PageSize),
        Just(SqlOp::Rebuild),
        Just(SqlOp::Churn),
        Just(SqlOp::Wal),
    ]
}

const SCHEMA: &str = "CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT NOT NULL, v INTEGER);
                      CREATE TABLE u(k TEXT, v BLOB);
                      CREATE INDEX u_k ON u(k);";

fn fill(c: &rusqlite::Connection, db: &Db, reverse: bool) {
    let mut t: Vec<_> = db.t.iter().collect();
    let mut u: Vec<_> = db.u.iter().collect();
    if reverse {
        t.reverse();
        u.reverse();
    }
    for (id, (n, v)) in t {
        c.execute(
            "INSERT INTO t VALUES (?1, ?2, ?3)",
            rusqlite::params![id, n, v],
        )
        .unwrap();
    }
    for (k, v) in u {
        c.execute("INSERT INTO u VALUES (?1, ?2)", rusqlite::params![k, v])
            .unwrap();
    }
}

fn apply_sql(path: &Path, db: &mut Db, op: &SqlOp) {
    let c = rusqlite::Connection::open(path).unwrap();
    match op {
        SqlOp::Insert(id, n, v) if !db.t.contains_key(id) => {
            c.execute(
                "INSERT INTO t VALUES (?1, ?2, ?3)",
                rusqlite::params![id, n, v],
            )
            .unwrap();
            db.t.insert(*id, (n.clone(), *v));
        }
        SqlOp::Delete(i) if !db.t.is_empty() => {
            let id = *db.t.keys().nth(i % db.t.len()).unwrap();
            c.execute("DELETE FROM t WHERE id = ?1", [id]).unwrap();
            db.t.remove(&id);
        }
        SqlOp::Update(i, n) if !db.t.is_empty() => {
            let id = *db.t.keys().nth(i % db.t.len()).unwrap();
            c.execute(
                "UPDATE t SET name = ?2 WHERE id = ?1",
                rusqlite::params![id, n],
            )
            .unwrap();
            db.t.get_mut(&id).unwrap().0 = n.clone();
        }
        SqlOp::InsertU(k, v) => {
            c.execute("INSERT INTO u VALUES (?1, ?2)", rusqlite::params![k, v])
                .unwrap();
            db.u.push((k.clone(), v.clone()));
        }
        SqlOp::DeleteU(i) if !db.u.is_empty() => {
            let (k, v) = db.u.remove(i % db.u.len());
            c.execute(
                "DELETE FROM u WHERE rowid = (SELECT rowid FROM u WHERE k = ?1 AND v = ?2 LIMIT 1)",
                rusqlite::params![k, v],
            )
            .unwrap();
        }
        SqlOp::Vacuum => c.execute_batch("VACUUM").unwrap(),
        SqlOp::PageSize(n) => c
            .execute_batch(&format!(
                "PRAGMA journal_mode = DELETE; PRAGMA page_size = {n}; VACUUM"
            ))
            .unwrap(),
        SqlOp::Rebuild => {
            drop(c);
            std::fs::remove_file(path).unwrap();
            let c = rusqlite::Connection::open(path).unwrap();
            c.execute_batch(SCHEMA).unwrap();
            fill(&c, db, true);
        }
        SqlOp::Churn if !db.u.is_empty() => {
            // The first row of `u` moves to a new rowid, its values kept.
            c.execute_batch(
                "CREATE TEMP TABLE one AS SELECT k, v FROM u ORDER BY rowid LIMIT 1;
                 DELETE FROM u WHERE rowid = (SELECT min(rowid) FROM u);
                 INSERT INTO u SELECT k, v FROM one;",
            )
            .unwrap();
        }
        SqlOp::Wal => {
            let mode: String = c
                .query_row("PRAGMA journal_mode", [], |r| r.get(0))
                .unwrap();
            let next = if mode == "wal" { "DELETE" } else { "WAL" };
            c.query_row(&format!("PRAGMA journal_mode = {next}"), [], |_| Ok(()))
                .unwrap();
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn sqlite_data_digest_changes_exactly_when_the_rows_do(
        ops in proptest::collection::vec(sql_op(), 1..30),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.sqlite");
        let mut db = Db::default();
        {
            let c = rusqlite::Connection::open(&path).unwrap();
            c.execute_batch(SCHEMA).unwrap();
        }
        let (mut seen, mut by_digest) = (HashMap::new(), HashMap::new());
        let (d, format) = data_digest(&path, Order::Ordered).unwrap();
        prop_assert_eq!(format, Some("sqlite"));
        check(&mut seen, &mut by_digest, &db.canon(), *d.as_bytes(), "creation")?;
        for (i, op) in ops.iter().enumerate() {
            apply_sql(&path, &mut db, op);
            let (d, _) = data_digest(&path, Order::Ordered).unwrap();
            check(&mut seen, &mut by_digest, &db.canon(), *d.as_bytes(), &format!("step {i}: {op:?}"))?;
        }
    }
}

// ---------------------------------------------------------------- Parquet

type Row = (i64, Option<String>, i64);

#[derive(Clone, Debug)]
struct Layout {
    compression: u8,
    group: usize,
    dictionary: bool,
    v2: bool,
    page_rows: usize,
}

fn layout() -> impl Strategy<Value = Layout> {
    (0u8..4, 1usize..40, any::<bool>(), any::<bool>(), 1usize..20).prop_map(
        |(compression, group, dictionary, v2, page_rows)| Layout {
            compression,
            group,
            dictionary,
            v2,
            page_rows,
        },
    )
}

#[derive(Clone, Debug)]
enum PqOp {
    Rewrite(Layout),
    Set(usize, i64),
    Push(Row),
    Remove(usize),
    Swap(usize, usize),
}

fn pq_op() -> impl Strategy<Value = PqOp> {
    let row = (0i64..5, proptest::option::of("[ab]{0,2}"), 0i64..3);
    prop_oneof![
        layout().prop_map(PqOp::Rewrite),
        (any::<usize>(), 0i64..3).prop_map(|(i, v)| PqOp::Set(i, v)),
        row.prop_map(PqOp::Push),
        any::<usize>().prop_map(PqOp::Remove),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| PqOp::Swap(a, b)),
    ]
}

fn write_parquet(path: &Path, rows: &[Row], l: &Layout) {
    use arrow_array::{Int64Array, RecordBatch, StringArray};
    use parquet::basic::{Compression, ZstdLevel};
    use parquet::file::properties::{WriterProperties, WriterVersion};
    use std::sync::Arc;
    let batch = RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))) as _,
        ),
        (
            "name",
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.1.clone()))) as _,
        ),
        (
            "v",
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))) as _,
        ),
    ])
    .unwrap();
    let props = WriterProperties::builder()
        .set_compression(match l.compression {
            0 => Compression::UNCOMPRESSED,
            1 => Compression::SNAPPY,
            2 => Compression::ZSTD(ZstdLevel::try_new(3).unwrap()),
            _ => Compression::LZ4_RAW,
        })
        .set_max_row_group_row_count(Some(l.group))
        .set_dictionary_enabled(l.dictionary)
        .set_writer_version(if l.v2 {
            WriterVersion::PARQUET_2_0
        } else {
            WriterVersion::PARQUET_1_0
        })
        .set_data_page_row_count_limit(l.page_rows)
        .set_created_by(format!("property test {l:?}"))
        .build();
    let f = std::fs::File::create(path).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(f, batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn parquet_data_digest_changes_exactly_when_the_values_do(
        start in proptest::collection::vec((0i64..5, proptest::option::of("[ab]{0,2}"), 0i64..3), 0..12),
        first in layout(),
        ops in proptest::collection::vec(pq_op(), 1..25),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let mut rows = start;
        let mut l = first;
        write_parquet(&path, &rows, &l);
        let (mut seen_o, mut by_o) = (HashMap::new(), HashMap::new());
        let (mut seen_f, mut by_f) = (HashMap::new(), HashMap::new());
        for (i, op) in std::iter::once(None).chain(ops.iter().map(Some)).enumerate() {
            match op {
                None => {}
                Some(PqOp::Rewrite(n)) => l = n.clone(),
                Some(PqOp::Set(i, v)) if !rows.is_empty() => {
                    let n = rows.len();
                    rows[i % n].2 = *v;
                }
                Some(PqOp::Push(r)) => rows.push(r.clone()),
                Some(PqOp::Remove(i)) if !rows.is_empty() => {
                    let n = rows.len();
                    rows.remove(i % n);
                }
                Some(PqOp::Swap(a, b)) if !rows.is_empty() => {
                    let n = rows.len();
                    rows.swap(a % n, b % n);
                }
                Some(_) => {}
            }
            write_parquet(&path, &rows, &l);
            let step = format!("step {i}: {op:?}");
            let (d, format) = data_digest(&path, Order::Ordered).unwrap();
            prop_assert_eq!(format, Some("parquet"));
            check(&mut seen_o, &mut by_o, &rows, *d.as_bytes(), &step)?;
            let mut sorted = rows.clone();
            sorted.sort();
            let (d, _) = data_digest(&path, Order::Free).unwrap();
            check(&mut seen_f, &mut by_f, &sorted, *d.as_bytes(), &step)?;
        }
    }
}
