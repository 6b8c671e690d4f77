//! Helpers for ingestion tests: a project with a source, and reading the
//! landed Parquet back.

#![allow(dead_code)]

use arrow_array::{Array, Int64Array, StringArray};
use std::collections::BTreeMap;
use std::path::Path;

/// Every row landed under `root` (all windows), as (window dir, id, cursor text).
pub fn landed(root: &Path) -> Vec<(String, i64, String)> {
    let mut out = Vec::new();
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
                let f = std::fs::File::open(&p).unwrap();
                let reader =
                    parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
                        .unwrap()
                        .build()
                        .unwrap();
                for batch in reader {
                    let b = batch.unwrap();
                    let ids = b
                        .column_by_name("id")
                        .unwrap()
                        .as_any()
                        .downcast_ref::<Int64Array>()
                        .unwrap()
                        .clone();
                    let cur = b.column_by_name("updated_at").unwrap();
                    let cur = cur.as_any().downcast_ref::<StringArray>().cloned();
                    for i in 0..ids.len() {
                        let c = cur
                            .as_ref()
                            .map_or(String::new(), |c| c.value(i).to_string());
                        out.push((win.clone(), ids.value(i), c));
                    }
                }
            }
        }
    }
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
