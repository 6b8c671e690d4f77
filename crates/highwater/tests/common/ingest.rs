//! Helpers for ingestion tests: a project with a source, and reading the
//! landed Parquet back.

#![allow(dead_code)]

use arrow_array::{Array, Int64Array, StringArray};
use std::collections::BTreeMap;
use std::path::Path;

/// Calls `f(window dir, batch)` for every record batch of every Parquet
/// file under `root`.
pub fn each_batch(root: &Path, mut f: impl FnMut(&str, &arrow_array::RecordBatch)) {
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "parquet") {
                let win = p
                    .parent()
                    .unwrap()
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                let file = std::fs::File::open(&p).unwrap();
                let reader =
                    parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
                        .unwrap()
                        .build()
                        .unwrap();
                for batch in reader {
                    f(&win, &batch.unwrap());
                }
            }
        }
    }
}

/// A batch's Int64 column by name.
pub fn i64_column<'a>(b: &'a arrow_array::RecordBatch, name: &str) -> &'a Int64Array {
    b.column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"))
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap_or_else(|| panic!("{name} is not Int64"))
}

/// A batch's Utf8 column by name.
pub fn str_column<'a>(b: &'a arrow_array::RecordBatch, name: &str) -> &'a StringArray {
    b.column_by_name(name)
        .unwrap_or_else(|| panic!("no column {name}"))
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap_or_else(|| panic!("{name} is not Utf8"))
}

/// Every row landed under `root` (all windows), as (window dir, id, cursor text).
pub fn landed(root: &Path) -> Vec<(String, i64, String)> {
    let mut out = Vec::new();
    each_batch(root, |win, b| {
        let ids = b
            .column_by_name("id")
            .unwrap()
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        let cur = b.column_by_name("updated_at").unwrap();
        let cur = cur.as_any().downcast_ref::<StringArray>();
        for i in 0..ids.len() {
            let c = cur.map_or(String::new(), |c| c.value(i).to_string());
            out.push((win.to_string(), ids.value(i), c));
        }
    });
    out.sort();
    out
}

/// The landed rows deduped on id, keeping the latest cursor.
pub fn latest(rows: &[(String, i64, String)]) -> BTreeMap<i64, String> {
    let mut m: BTreeMap<i64, String> = BTreeMap::new();
    for (_, id, c) in rows {
        let e = m.entry(*id).or_default();
        if *c > *e {
            *e = c.clone();
        }
    }
    m
}

pub const SQLITE_SOURCE: &str = r#"
[sources.orders]
kind = "sqlite"
path = "src.db"
table = "orders"
key = ["id"]
mode = "updated_at"
cursor = "updated_at"
interval = "1h"
start = "2026-03-01T08:00:00Z"
lookback = "10m"
settle = "2m"
output = "raw/orders/ingest_date={date}/ingest_hour={hour}"
[sources.orders.checks]
unique_key = "fail"
continuity = "warn"
"#;

/// Serialises the PostgreSQL tests of one test binary: the transaction
/// horizon is cluster-wide, so one test's open transactions would show up in
/// another's horizon.
pub fn pg_serial() -> std::sync::MutexGuard<'static, ()> {
    static PG: std::sync::Mutex<()> = std::sync::Mutex::new(());
    PG.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh database on the test cluster started by `scripts/test.sh`, and
/// its connection string. Without the cluster this fails loudly: the
/// PostgreSQL tests never skip.
pub fn pg_database(tag: &str) -> (postgres::Client, String) {
    let base = std::env::var("HIGHWATER_TEST_PG_URL").expect(
        "HIGHWATER_TEST_PG_URL is not set: run the tests with `bash scripts/test.sh`, which starts PostgreSQL",
    );
    let mut admin =
        postgres::Client::connect(&base, postgres::NoTls).expect("the test cluster answers");
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let name = format!(
        "hw_{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    );
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .unwrap();
    let url = format!("{base} dbname={name}");
    let client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    (client, url)
}

/// Every row landed under `root`, for PostgreSQL sources: (window, id,
/// updated_at in microseconds).
pub fn landed_pg(root: &Path) -> Vec<(String, i64, i64)> {
    use arrow_array::TimestampMicrosecondArray;
    let mut out = Vec::new();
    each_batch(root, |win, b| {
        let ids = b
            .column_by_name("id")
            .unwrap()
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        let ts = b
            .column_by_name("updated_at")
            .unwrap()
            .as_any()
            .downcast_ref::<TimestampMicrosecondArray>()
            .unwrap();
        for i in 0..ids.len() {
            out.push((win.to_string(), ids.value(i), ts.value(i)));
        }
    });
    out.sort();
    out
}

pub fn pg_source(mode: &str, lookback: &str) -> String {
    format!(
        r#"
[sources.orders]
kind = "postgres"
url_env = "ORDERS_DATABASE_URL"
table = "orders"
key = ["id"]
mode = "{mode}"
cursor = "updated_at"
interval = "1h"
start = "2026-03-01T00:00:00Z"
lookback = "{lookback}"
settle = "2m"
output = "raw/orders/ingest_date={{date}}/ingest_hour={{hour}}"
[sources.orders.checks]
unique_key = "fail"
continuity = "warn"
volume = {{ compare_days = 7, max_deviation = 0.5, on_fail = "warn" }}
duration = {{ warn_share_of_interval = 0.5 }}
"#
    )
}
