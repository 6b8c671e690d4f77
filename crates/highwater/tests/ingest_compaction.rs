//! Issue 13: compaction of small windows into periods, through the real
//! binary. The reader here is the plainest one: every Parquet file under
//! the output root (hidden entries skipped, as Spark, Hive and DuckDB's
//! globbing do), read in a loop while compactions and re-ingests race it.

mod common;
use common::ingest::{i64_column, str_column};
use common::*;
use std::collections::BTreeMap;
use std::path::Path;

const SOURCE: &str = r#"
[sources.orders]
kind = "sqlite"
path = "src.db"
table = "orders"
key = ["id"]
mode = "updated_at"
cursor = "updated_at"
interval = "1h"
start = "2026-03-01T00:00:00Z"
settle = "1m"
output = "raw/orders/date={date}/hour={hour}"
[sources.orders.compact]
into = "1d"
target_file_mb = 1
"#;

const NOW: &str = "2026-03-04T00:30:00Z";

fn db(p: &Project) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(p.path("src.db")).unwrap();
    c.execute_batch(
        "PRAGMA journal_mode=WAL;
         CREATE TABLE IF NOT EXISTS orders(id INTEGER PRIMARY KEY, note TEXT, updated_at TEXT NOT NULL);",
    )
    .unwrap();
    c
}

/// Three days of hourly windows, `per_hour` rows in each.
fn fill(c: &rusqlite::Connection, per_hour: i64) {
    let tx = c.unchecked_transaction().unwrap();
    for day in 1..=3 {
        for hour in 0..24 {
            for i in 0..per_hour {
                let id = (day * 24 + hour) * per_hour + i;
                tx.execute(
                    "INSERT INTO orders VALUES(?1, ?2, ?3)",
                    rusqlite::params![
                        id,
                        format!("note {id}"),
                        format!("2026-03-0{day}T{hour:02}:{:02}:00Z", i % 60)
                    ],
                )
                .unwrap();
            }
        }
    }
    tx.commit().unwrap();
}

/// What the plainest reader sees: id -> note, and how often each id came
/// back. `None` when a file vanished under it (a swap between its listing
/// and its read): a reader retries then, as it does on any object store.
fn read_all(root: &Path) -> Option<BTreeMap<i64, (String, usize)>> {
    let mut out: BTreeMap<i64, (String, usize)> = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let rd = match std::fs::read_dir(&d) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => panic!("{}: {e}", d.display()),
        };
        for e in rd {
            let e = match e {
                Ok(e) => e,
                Err(_) => return None,
            };
            if e.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "parquet") {
                let file = match std::fs::File::open(&p) {
                    Ok(f) => f,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
                    Err(e) => panic!("{}: {e}", p.display()),
                };
                let reader =
                    parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
                        .unwrap()
                        .build()
                        .unwrap();
                for b in reader {
                    let b = b.unwrap();
                    let (ids, notes) = (i64_column(&b, "id"), str_column(&b, "note"));
                    for i in 0..ids.len() {
                        let e = out.entry(ids.value(i)).or_default();
                        e.0 = notes.value(i).to_string();
                        e.1 += 1;
                    }
                }
            }
        }
    }
    Some(out)
}

fn parquet_count(root: &Path) -> usize {
    let mut n = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            if e.path().is_dir() {
                stack.push(e.path());
            } else if e.path().extension().is_some_and(|x| x == "parquet") {
                n += 1;
            }
        }
    }
    n
}

/// Each window's content digest, as `windows --json` gives it.
fn digests(p: &Project) -> BTreeMap<String, String> {
    let v = p
        .check(
            &[
                "windows", "orders", "--now", NOW, "--json", "--last", "1000",
            ],
            0,
        )
        .json();
    let mut out = BTreeMap::new();
    for w in v["windows"].as_array().into_iter().flatten() {
        out.insert(
            w["start"].as_str().unwrap().to_string(),
            w["digest"].as_str().unwrap_or("").to_string(),
        );
    }
    out
}

fn table(c: &rusqlite::Connection) -> BTreeMap<i64, String> {
    let mut s = c.prepare("SELECT id, note FROM orders").unwrap();
    s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(|r| r.unwrap())
        .collect()
}

fn exactly_once(seen: &BTreeMap<i64, (String, usize)>, want: &BTreeMap<i64, String>) {
    let twice: Vec<_> = seen.iter().filter(|(_, (_, n))| *n != 1).take(5).collect();
    assert!(twice.is_empty(), "rows seen more than once: {twice:?}");
    let got: BTreeMap<i64, String> = seen.iter().map(|(k, (v, _))| (*k, v.clone())).collect();
    assert_eq!(got.len(), want.len(), "row count");
    assert!(got == *want, "the rows differ from the table's");
}

#[test]
fn issue13_compaction_rolls_hours_into_days_layout_only() {
    let p = Project::new(SOURCE);
    let c = db(&p);
    fill(&c, 20);
    p.check(&["ingest", "orders", "--now", NOW, "--json"], 0);
    let root = p.path("raw/orders");
    let want = table(&c);
    exactly_once(&read_all(&root).unwrap(), &want);
    assert_eq!(parquet_count(&root), 72);
    let before = digests(&p);
    assert_eq!(before.len(), 72);
    assert!(
        before.values().all(|d| d.starts_with("rd1:20:")),
        "{before:?}"
    );
    // The layout advice: 72 tiny files.
    let w = p
        .check(&["windows", "orders", "--now", NOW, "--json"], 0)
        .json();
    let advice = w["layout"]["advice"].as_str().unwrap_or_default();
    assert!(advice.contains("highwater compact orders"), "{w}");

    let r = p
        .check(&["compact", "orders", "--now", NOW, "--json"], 0)
        .json();
    let statuses: Vec<&str> = r["periods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["compacted", "compacted", "compacted"], "{r}");
    assert_eq!(r["periods"][0]["files_before"], 24);
    assert_eq!(r["periods"][0]["files_after"], 1);
    assert_eq!(parquet_count(&root), 3);
    exactly_once(&read_all(&root).unwrap(), &want);
    // Layout only: every window's content digest is what it was.
    assert_eq!(digests(&p), before);
    // `windows` shows the compacted periods, and cells as C.
    let w = p
        .check(&["windows", "orders", "--now", NOW, "--json"], 0)
        .json();
    assert_eq!(
        w["layout"]["compacted_periods"].as_array().unwrap().len(),
        3,
        "{w}"
    );
    assert_eq!(
        w["windows"][0]["compacted"].as_str(),
        Some("raw/orders/date=2026-03-01"),
        "{w}"
    );
    let text = p.check(&["windows", "orders", "--now", NOW], 0).stdout;
    assert!(
        text.contains("2026-03-01 CCCCCCCCCCCCCCCCCCCCCCCC"),
        "{text}"
    );
    // Compacting again changes nothing.
    let r = p
        .check(&["compact", "orders", "--now", NOW, "--json"], 0)
        .json();
    assert!(
        r["periods"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["status"] == "already"),
        "{r}"
    );

    // Re-ingesting a window inside a compacted period re-compacts it: the
    // changed rows replace the old ones, nothing doubles.
    c.execute(
        "UPDATE orders SET note = 'changed' WHERE updated_at LIKE '2026-03-02T05:%'",
        [],
    )
    .unwrap();
    p.check(
        &[
            "ingest",
            "orders",
            "--now",
            NOW,
            "--window",
            "2026-03-02T05:00:00Z/2026-03-02T06:00:00Z",
        ],
        0,
    );
    let want = table(&c);
    exactly_once(&read_all(&root).unwrap(), &want);
    assert_eq!(parquet_count(&root), 3);
    let after = digests(&p);
    let changed: Vec<_> = after
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(v))
        .collect();
    assert_eq!(
        changed.len(),
        1,
        "only the re-ingested window's content changed: {changed:?}"
    );
}

#[test]
fn issue13_compaction_racing_ingest_never_shows_a_row_twice_or_not_at_all() {
    let p = Project::new(SOURCE);
    let c = db(&p);
    fill(&c, 30);
    p.check(&["ingest", "orders", "--now", NOW], 0);
    let root = p.path("raw/orders");
    let want = table(&c);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (reads, retries) = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let (mut reads, mut retries) = (0, 0);
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                match read_all(&root) {
                    Some(seen) => {
                        // Every row of the table, each exactly once, at
                        // every read (the notes do not change in this race).
                        exactly_once(&seen, &want);
                        reads += 1;
                    }
                    None => retries += 1,
                }
            }
            (reads, retries)
        });
        // Compactions of each day, racing re-ingests of windows inside
        // them, each waiting for the other's lease.
        for round in 0..3 {
            let day = round + 1;
            let from = format!("2026-03-0{day}T00:00:00Z");
            let to = format!("2026-03-0{}T00:00:00Z", day + 1);
            let window = format!("2026-03-0{day}T07:00:00Z/2026-03-0{day}T08:00:00Z");
            let mut compact = p
                .cmd(&[
                    "compact", "orders", "--now", NOW, "--wait", "--from", &from, "--to", &to,
                ])
                .spawn()
                .unwrap();
            let mut ingest = p
                .cmd(&[
                    "ingest", "orders", "--now", NOW, "--wait", "--window", &window,
                ])
                .spawn()
                .unwrap();
            assert!(compact.wait().unwrap().success());
            assert!(ingest.wait().unwrap().success());
            // And a re-ingest of an already compacted period.
            p.check(
                &[
                    "ingest", "orders", "--now", NOW, "--wait", "--window", &window,
                ],
                0,
            );
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        reader.join().unwrap()
    });
    eprintln!("reader: {reads} whole reads, {retries} retried after a swap");
    assert!(
        reads > 0,
        "the reader completed no read ({retries} retries)"
    );
    exactly_once(&read_all(&root).unwrap(), &want);
    assert_eq!(parquet_count(&root), 3);
}

#[test]
fn issue13_compaction_killed_around_the_swap_loses_nothing() {
    for failpoint in ["compact-before-swap", "compact-after-swap"] {
        let p = Project::new(SOURCE);
        let c = db(&p);
        fill(&c, 5);
        p.check(&["ingest", "orders", "--now", NOW], 0);
        let root = p.path("raw/orders");
        let want = table(&c);
        let before = digests(&p);
        let r = p
            .cmd(&["compact", "orders", "--now", NOW])
            .env("HIGHWATER_FAILPOINT", failpoint)
            .output()
            .unwrap();
        assert_eq!(r.status.code(), None, "{failpoint}: killed by SIGKILL");
        exactly_once(&read_all(&root).unwrap(), &want);
        // The next run repairs the records (or redoes the compaction).
        let r = p
            .check(&["compact", "orders", "--now", NOW, "--json"], 0)
            .json();
        assert!(
            r["periods"]
                .as_array()
                .unwrap()
                .iter()
                .all(|p| p["status"] == "compacted" || p["status"] == "already"),
            "{failpoint}: {r}"
        );
        exactly_once(&read_all(&root).unwrap(), &want);
        assert_eq!(parquet_count(&root), 3, "{failpoint}");
        assert_eq!(digests(&p), before, "{failpoint}");
        let w = p
            .check(&["windows", "orders", "--now", NOW, "--json"], 0)
            .json();
        assert!(
            w["windows"]
                .as_array()
                .unwrap()
                .iter()
                .all(|w| w["compacted"].is_string()),
            "{failpoint}: every record knows its period: {w}"
        );
    }
}

#[test]
fn issue13_compaction_refuses_a_layout_it_cannot_swap_and_a_source_without_it() {
    // Hourly windows directly under one folder: no folder of a day's own.
    let flat = SOURCE.replace("raw/orders/date={date}/hour={hour}", "raw/orders/{start}");
    let p = Project::new(&flat);
    let r = p.check(&["windows", "orders", "--now", NOW], 2);
    assert!(
        r.stderr
            .contains("compact.into needs each period's windows in a folder of their own"),
        "{}",
        r.stderr
    );
    let bad_into = SOURCE.replace("into = \"1d\"", "into = \"90m\"");
    let r = Project::new(&bad_into).check(&["windows", "orders", "--now", NOW], 2);
    assert!(
        r.stderr.contains("whole number of intervals"),
        "{}",
        r.stderr
    );
    let none = SOURCE.replace(
        "[sources.orders.compact]\ninto = \"1d\"\ntarget_file_mb = 1\n",
        "",
    );
    let p = Project::new(&none);
    db(&p);
    let r = p.check(&["compact", "orders", "--now", NOW], 2);
    assert!(
        r.stderr.contains("has no [compact] section"),
        "{}",
        r.stderr
    );
}
