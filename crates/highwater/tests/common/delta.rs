//! Helpers for the Delta tests (issues 21 and 46): a SQLite source landed
//! as a Delta table, its rows, and the Python that reads it back.

#![allow(dead_code)]

use super::ingest::SQLITE_SOURCE;
use super::Project;
use serde_json::Value;

/// The Python of the venv scripts/test.sh makes, with deltalake and
/// Polars.
pub fn python() -> String {
    std::env::var("HIGHWATER_TEST_PYTHON").expect(
        "HIGHWATER_TEST_PYTHON is not set: run the tests with `bash scripts/test.sh`, which installs deltalake and polars in its venv",
    )
}

/// `[sources.orders]` from SQLite into a Delta table at `output`, no
/// lookback, `extra` lines added to the source.
pub fn config(output: &str, extra: &str) -> String {
    SQLITE_SOURCE.replace("lookback = \"10m\"\n", "").replace(
        "output = \"raw/orders/ingest_date={date}/ingest_hour={hour}\"",
        &format!("output = \"{output}\"\nformat = \"delta\"\n{extra}"),
    )
}

/// The source database, with its `orders` table.
pub fn db(p: &Project) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(p.path("src.db")).unwrap();
    c.execute_batch(
        "PRAGMA journal_mode=WAL;
         CREATE TABLE IF NOT EXISTS orders(id INTEGER PRIMARY KEY, amount REAL, note TEXT, updated_at TEXT NOT NULL);",
    )
    .unwrap();
    c
}

/// `n` rows per hour for `hours` hours from 2026-03-01T08:00Z, ids from 0:
/// row `id` belongs to window `id / n`.
pub fn fill(c: &rusqlite::Connection, hours: i64, n: i64, note: &str) {
    for h in 0..hours {
        for i in 0..n {
            let id = h * n + i;
            let t = 8 * 60 + h * 60 + i * 60 / n;
            c.execute(
                "INSERT OR REPLACE INTO orders VALUES(?1, ?2, ?3, ?4)",
                rusqlite::params![
                    id,
                    id as f64 * 1.5,
                    note,
                    format!(
                        "2026-03-{:02}T{:02}:{:02}:00Z",
                        1 + t / (24 * 60),
                        t / 60 % 24,
                        t % 60
                    )
                ],
            )
            .unwrap();
        }
    }
}

/// How many windows an `ingest --json` report says were published.
pub fn published(r: &Value) -> usize {
    r["windows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["status"] == "published")
        .count()
}
