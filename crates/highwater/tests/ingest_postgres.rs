//! Windowed ingestion from a real PostgreSQL server (started by
//! `scripts/test.sh` on loopback): late commits in commit_order and
//! updated_at modes, concurrent writers, type mapping, secrets.

mod common;
use common::ingest::*;
use common::*;
use highwater_core::window::parse_rfc3339;

const TABLE: &str = "CREATE TABLE orders(
    id bigint PRIMARY KEY,
    amount numeric(12, 3),
    note text,
    payload jsonb,
    day date,
    updated_at timestamptz NOT NULL)";

fn ingest(p: &Project, url: &str, now: &str, code: i32) -> serde_json::Value {
    let r = p
        .cmd(&["ingest", "orders", "--json", "--now", now])
        .env("ORDERS_DATABASE_URL", url)
        .output()
        .unwrap();
    assert_eq!(
        r.status.code(),
        Some(code),
        "stdout {} stderr {}",
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&r.stderr)
    );
    serde_json::from_slice(&r.stdout).unwrap()
}

fn windows(r: &serde_json::Value) -> Vec<String> {
    r["windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            format!(
                "{} {}",
                &w["start"].as_str().unwrap()[11..16],
                w["status"].as_str().unwrap()
            )
        })
        .collect()
}

/// The seed's row B in commit_order mode, with no lookback at all: the
/// transaction that writes 08:59:59.9 commits after the 08:00 window was
/// read. The horizon held back by it brings the window back, and B lands.
#[test]
fn row_b_lands_in_commit_order_without_lookback() {
    let _serial = pg_serial();
    let (mut c, url) = pg_database("rowb_co");
    c.batch_execute(TABLE).unwrap();
    c.execute("INSERT INTO orders VALUES (1, 10.5, 'a', '{\"k\": 1}', '2026-03-01', '2026-03-01T08:12:00Z')", &[]).unwrap();
    let p = Project::new(&pg_source("commit_order", "0s"));
    // Row B's transaction starts and writes, but does not commit yet.
    let mut late = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let mut tx = late.transaction().unwrap();
    tx.execute(
        "INSERT INTO orders VALUES (2, 20.25, 'b', NULL, NULL, '2026-03-01T08:59:59.9Z')",
        &[],
    )
    .unwrap();
    let r = ingest(&p, &url, "2026-03-01T09:02:30Z", 0);
    assert!(windows(&r).contains(&"08:00 published".to_string()), "{r}");
    // Still open at the next run: the horizon cannot move, and it says why.
    let r = ingest(&p, &url, "2026-03-01T09:03:00Z", 0);
    let warnings = r["warnings"].to_string();
    assert!(warnings.contains("horizon pinned by xid"), "{r}");
    tx.commit().unwrap();
    c.execute(
        "INSERT INTO orders VALUES (3, 1, 'c', NULL, NULL, '2026-03-01T09:04:00Z')",
        &[],
    )
    .unwrap();
    let r = ingest(&p, &url, "2026-03-01T10:05:00Z", 0);
    assert_eq!(
        windows(&r),
        ["08:00 published", "09:00 published"],
        "08:00 re-published with B: {r}"
    );
    let rows = landed_pg(&p.path("raw/orders"));
    let ids: Vec<_> = rows.iter().map(|(w, id, _)| (w.as_str(), *id)).collect();
    assert_eq!(
        ids,
        [
            ("ingest_date=2026-03-01/ingest_hour=08", 1),
            ("ingest_date=2026-03-01/ingest_hour=08", 2),
            ("ingest_date=2026-03-01/ingest_hour=09", 3),
        ]
    );
    // The horizon is cluster-wide, so transactions of other databases (the
    // other tests) may hold it back and bring windows back again: that is
    // idempotent, and the landed data stays exactly the same.
    ingest(&p, &url, "2026-03-01T10:06:00Z", 0);
    assert_eq!(landed_pg(&p.path("raw/orders")), rows);
}

#[test]
fn row_b_lands_in_updated_at_mode_within_the_lookback() {
    let _serial = pg_serial();
    let (mut c, url) = pg_database("rowb_ua");
    c.batch_execute(TABLE).unwrap();
    c.execute(
        "INSERT INTO orders VALUES (1, 1, 'a', NULL, NULL, '2026-03-01T08:12:00Z')",
        &[],
    )
    .unwrap();
    let p = Project::new(&pg_source("updated_at", "10m"));
    ingest(&p, &url, "2026-03-01T09:02:30Z", 0);
    c.execute(
        "INSERT INTO orders VALUES (2, 2, 'b', NULL, NULL, '2026-03-01T08:59:59.9Z')",
        &[],
    )
    .unwrap();
    let r = ingest(&p, &url, "2026-03-01T10:05:00Z", 0);
    assert_eq!(windows(&r), ["09:00 published"]);
    let rows = landed_pg(&p.path("raw/orders"));
    assert!(
        rows.iter()
            .any(|(w, id, _)| *id == 2 && w.ends_with("ingest_hour=09")),
        "{rows:?}"
    );
}

/// The type mapping, read back from the Parquet file.
#[test]
fn types_land_as_documented() {
    let _serial = pg_serial();
    use arrow_array::{Array, Date32Array, StringArray, TimestampMicrosecondArray};
    let (mut c, url) = pg_database("types");
    c.batch_execute(TABLE).unwrap();
    c.execute(
        "INSERT INTO orders VALUES (7, 123456789.125, 'é \"q\"', '{\"a\": [1, 2]}', '2026-02-28', '2026-03-01T08:30:00.123456Z'),
                                   (8, NULL, NULL, NULL, NULL, '2026-03-01T08:31:00Z')",
        &[],
    )
    .unwrap();
    let p = Project::new(&pg_source("updated_at", "0s"));
    ingest(&p, &url, "2026-03-01T09:05:00Z", 0);
    let f = std::fs::File::open(
        p.path("raw/orders/ingest_date=2026-03-01/ingest_hour=08/part-00000.parquet"),
    )
    .unwrap();
    let mut reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap()
        .build()
        .unwrap();
    let b = reader.next().unwrap().unwrap();
    let text = |n: &str| {
        b.column_by_name(n)
            .unwrap()
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap()
            .clone()
    };
    let (amount, note, payload) = (text("amount"), text("note"), text("payload"));
    let row = (0..b.num_rows()).find(|&i| note.is_valid(i)).unwrap();
    assert_eq!(
        amount.value(row),
        "123456789.125",
        "numeric keeps every digit"
    );
    assert_eq!(note.value(row), "é \"q\"");
    assert_eq!(payload.value(row), "{\"a\": [1, 2]}");
    let day = b
        .column_by_name("day")
        .unwrap()
        .as_any()
        .downcast_ref::<Date32Array>()
        .unwrap()
        .clone();
    assert_eq!(
        day.value(row),
        (parse_rfc3339("2026-02-28T00:00:00Z").unwrap() / 86_400_000_000) as i32
    );
    let ts = b.column_by_name("updated_at").unwrap();
    assert_eq!(ts.data_type().to_string(), "Timestamp(µs, \"UTC\")");
    let ts = ts
        .as_any()
        .downcast_ref::<TimestampMicrosecondArray>()
        .unwrap();
    assert_eq!(
        ts.value(row),
        parse_rfc3339("2026-03-01T08:30:00.123456Z").unwrap()
    );
    let other = 1 - row;
    assert!(
        amount.is_null(other)
            && note.is_null(other)
            && payload.is_null(other)
            && day.is_null(other)
    );
}

/// Writers commit with random delays while ingest runs again and again.
/// At the end, the landed data deduped on the key (keeping the latest
/// version) equals the source table exactly: no row lost to a late commit.
#[test]
fn concurrent_writers_with_commit_lag_lose_nothing() {
    let _serial = pg_serial();
    for mode in ["commit_order", "updated_at"] {
        let (mut c, url) = pg_database("writers");
        c.batch_execute(TABLE).unwrap();
        let start_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let start = highwater_core::window::format_rfc3339(start_s as i64 * 1_000_000);
        let cfg = pg_source(mode, if mode == "updated_at" { "3s" } else { "0s" })
            .replace("interval = \"1h\"", "interval = \"1s\"")
            .replace(
                "start = \"2026-03-01T00:00:00Z\"",
                &format!("start = \"{start}\""),
            )
            .replace("settle = \"2m\"", "settle = \"0s\"")
            .replace("ingest_hour={hour}", "w={start}")
            .replace("catch_up_windows_max", "x");
        let p = Project::new(&cfg);
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let mut writers = Vec::new();
            for w in 0..4i64 {
                let url = url.clone();
                writers.push(s.spawn(move || {
                    let mut cl = postgres::Client::connect(&url, postgres::NoTls).unwrap();
                    let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ (w as u64 + 1);
                    for n in 0..40i64 {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        let id = w * 1000 + (seed % 25) as i64;
                        let mut tx = cl.transaction().unwrap();
                        tx.execute(
                            "INSERT INTO orders(id, amount, note, updated_at) VALUES ($1, $2::int8, 'w', clock_timestamp())
                             ON CONFLICT (id) DO UPDATE SET amount = excluded.amount, updated_at = clock_timestamp()",
                            &[&id, &n],
                        )
                        .unwrap();
                        // The commit lags the timestamp by up to 400 ms.
                        std::thread::sleep(std::time::Duration::from_millis(seed % 400));
                        tx.commit().unwrap();
                    }
                }));
            }
            let ingester = s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let out = p
                        .cmd(&["ingest", "orders", "--json"])
                        .env("ORDERS_DATABASE_URL", &url)
                        .output()
                        .unwrap();
                    assert!(
                        out.status.success(),
                        "{}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                    std::thread::sleep(std::time::Duration::from_millis(150));
                }
            });
            for w in writers {
                w.join().unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
            ingester.join().unwrap();
        });
        // Let the last windows close, then two more runs: one to publish,
        // one to see the horizon pass everything.
        std::thread::sleep(std::time::Duration::from_millis(1500));
        for _ in 0..2 {
            let out = p
                .cmd(&["ingest", "orders"])
                .env("ORDERS_DATABASE_URL", &url)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let source: std::collections::BTreeMap<i64, i64> = c
            .query(
                "SELECT id, floor(extract(epoch FROM updated_at) * 1000000)::int8 FROM orders",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let mut landed: std::collections::BTreeMap<i64, i64> = std::collections::BTreeMap::new();
        for (_, id, ts) in landed_pg(&p.path("raw/orders")) {
            let e = landed.entry(id).or_insert(ts);
            *e = (*e).max(ts);
        }
        assert_eq!(
            landed, source,
            "{mode}: landed (deduped, latest) equals the source"
        );
    }
}

#[test]
fn the_connection_string_is_never_printed() {
    let _serial = pg_serial();
    let p = Project::new(&pg_source("updated_at", "0s"));
    let r = p
        .cmd(&["ingest", "orders", "--now", "2026-03-01T09:05:00Z"])
        .env(
            "ORDERS_DATABASE_URL",
            "postgresql://u:s3cr3t-pw@127.0.0.1:1/db",
        )
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(2));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(all.contains("cannot connect"), "{all}");
    assert!(!all.contains("s3cr3t"), "{all}");
    let r = p
        .cmd(&["ingest", "orders"])
        .env_remove("ORDERS_DATABASE_URL")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&r.stderr).contains("ORDERS_DATABASE_URL is not set"));
}

/// The publish path against PostgreSQL too: two ingests at once neither
/// duplicate nor skip a window, a SIGKILL after the swap is recovered from
/// the manifest's token, and re-running a window replaces it.
#[test]
fn concurrent_ingests_crashes_and_reruns_on_postgres() {
    let _serial = pg_serial();
    let (mut c, url) = pg_database("publish");
    c.batch_execute(TABLE).unwrap();
    c.execute(
        "INSERT INTO orders(id, amount, note, updated_at)
         SELECT g, g, 'n', timestamptz '2026-03-01T00:00:00Z' + g * interval '1 minute' FROM generate_series(1, 1440) g",
        &[],
    )
    .unwrap();
    let p = Project::new(&pg_source("updated_at", "0s"));
    let spawn = || {
        p.cmd(&[
            "ingest",
            "orders",
            "--json",
            "--wait",
            "--now",
            "2026-03-02T00:05:00Z",
        ])
        .env("ORDERS_DATABASE_URL", &url)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(a.status.success() && b.status.success());
    let mut starts = Vec::new();
    for out in [&a, &b] {
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        for w in r["windows"].as_array().unwrap() {
            assert_eq!(w["status"], "published");
            starts.push(w["start"].as_str().unwrap().to_string());
        }
    }
    let n = starts.len();
    starts.sort();
    starts.dedup();
    assert_eq!(
        (n, starts.len()),
        (24, 24),
        "each of the day's 24 windows exactly once"
    );
    // SIGKILL between the swap and the record; the restart records it.
    c.execute("UPDATE orders SET note = 'changed' WHERE id <= 60", &[])
        .unwrap();
    let out = p
        .cmd(&[
            "ingest",
            "orders",
            "--now",
            "2026-03-02T00:05:00Z",
            "--window",
            "2026-03-01T00:00:00Z/2026-03-01T01:00:00Z",
        ])
        .env("ORDERS_DATABASE_URL", &url)
        .env("HIGHWATER_FAILPOINT", "after-swap")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let r = ingest(&p, &url, "2026-03-02T00:05:00Z", 0);
    assert!(
        r["windows"].as_array().unwrap().is_empty(),
        "recovered, not re-run: {r}"
    );
    assert_eq!(r["bookmark_after"], "2026-03-02T00:00:00Z");
    let rows = landed_pg(&p.path("raw/orders"));
    // Row 1440 sits at 00:00 of the next day: its window is not closed yet.
    assert_eq!(rows.len(), 1439, "every row of the closed windows, once");
}
