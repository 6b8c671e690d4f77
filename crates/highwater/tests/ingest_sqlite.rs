//! Windowed ingestion from SQLite, the embedded default, through the real
//! binary: late rows, re-runs, failed checks, gaps, leases and crashes.

mod common;
use common::ingest::*;
use common::*;

fn db(p: &Project) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(p.path("src.db")).unwrap();
    c.execute_batch(
        "PRAGMA journal_mode=WAL;
         CREATE TABLE IF NOT EXISTS orders(id INTEGER PRIMARY KEY, amount REAL, note TEXT, updated_at TEXT NOT NULL);",
    )
    .unwrap();
    c
}

fn put(c: &rusqlite::Connection, id: i64, at: &str) {
    c.execute(
        "INSERT OR REPLACE INTO orders VALUES(?1, ?2, ?3, ?4)",
        rusqlite::params![id, id as f64 * 1.5, format!("note {id}"), at],
    )
    .unwrap();
}

fn project() -> (Project, rusqlite::Connection) {
    let p = Project::new(SQLITE_SOURCE);
    let c = db(&p);
    (p, c)
}

fn ingest(p: &Project, now: &str, extra: &[&str], code: i32) -> serde_json::Value {
    let mut args = vec!["ingest", "orders", "--json", "--now", now];
    args.extend_from_slice(extra);
    p.check(&args, code).json()
}

fn statuses(r: &serde_json::Value) -> Vec<(String, String)> {
    r["windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["start"].as_str().unwrap()[11..16].to_string(),
                w["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The seed's row B: updated at 08:59:59.9, committed after the 08:00 window
/// was read. The 09:00 window's lookback picks it up.
#[test]
fn row_b_lands_within_the_lookback() {
    let (p, c) = project();
    put(&c, 1, "2026-03-01T08:12:00Z");
    let r = ingest(&p, "2026-03-01T09:02:30Z", &[], 0);
    assert_eq!(statuses(&r), [("08:00".into(), "published".into())]);
    // Row B commits now, after its window was read.
    put(&c, 2, "2026-03-01T08:59:59.900Z");
    put(&c, 3, "2026-03-01T09:04:00Z");
    let r = ingest(&p, "2026-03-01T10:05:00Z", &[], 0);
    assert_eq!(statuses(&r), [("09:00".into(), "published".into())]);
    let rows = landed(&p.path("raw/orders"));
    let ids: Vec<_> = rows.iter().map(|(w, id, _)| (w.as_str(), *id)).collect();
    assert_eq!(
        ids,
        [
            ("ingest_date=2026-03-01/ingest_hour=08", 1),
            ("ingest_date=2026-03-01/ingest_hour=09", 2),
            ("ingest_date=2026-03-01/ingest_hour=09", 3)
        ]
    );
    let grid = p
        .check(&["windows", "orders", "--now", "2026-03-01T10:05:00Z"], 0)
        .stdout;
    assert!(grid.contains("2026-03-01 ##"), "{grid}");
}

#[test]
fn rerunning_an_old_window_replaces_it() {
    let (p, c) = project();
    for i in 0..20 {
        put(&c, i, &format!("2026-03-01T08:{:02}:00Z", i * 2));
    }
    ingest(&p, "2026-03-01T12:00:00Z", &[], 0);
    let w8 = p.path("raw/orders/ingest_date=2026-03-01/ingest_hour=08");
    let before = std::fs::read_to_string(w8.join("_manifest.json")).unwrap();
    c.execute("DELETE FROM orders WHERE id >= 10", []).unwrap();
    let r = ingest(
        &p,
        "2026-03-01T12:00:00Z",
        &["--window", "2026-03-01T08:00:00Z/2026-03-01T09:00:00Z"],
        0,
    );
    assert_eq!(r["windows"][0]["rows"], 10);
    let after = std::fs::read_to_string(w8.join("_manifest.json")).unwrap();
    assert_ne!(before, after);
    let rows = landed(&p.path("raw/orders"));
    assert_eq!(rows.len(), 10, "replaced, not appended beside");
    let names: Vec<_> = std::fs::read_dir(w8.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.contains("hw-staging")), "{names:?}");
    // The bookmark did not move backwards or forwards.
    let r = ingest(&p, "2026-03-01T12:00:00Z", &[], 0);
    assert_eq!(r["bookmark_before"], "2026-03-01T11:00:00Z");
}

/// A window whose keys are not unique is never published: the previous
/// version stays, byte for byte, and the bookmark does not move.
#[test]
fn a_failed_check_leaves_the_published_state_untouched() {
    let p = Project::new(&SQLITE_SOURCE.replace(
        "table = \"orders\"",
        "query = \"SELECT * FROM orders UNION ALL SELECT * FROM extra\"",
    ));
    let c = db(&p);
    c.execute_batch("CREATE TABLE extra(id INTEGER, amount REAL, note TEXT, updated_at TEXT)")
        .unwrap();
    put(&c, 1, "2026-03-01T08:10:00Z");
    put(&c, 2, "2026-03-01T09:10:00Z");
    ingest(&p, "2026-03-01T09:30:00Z", &[], 0);
    let before = p.tree("raw");
    let state_before = p
        .check(
            &[
                "windows",
                "orders",
                "--json",
                "--now",
                "2026-03-01T09:30:00Z",
            ],
            0,
        )
        .stdout;
    c.execute(
        "INSERT INTO extra VALUES(1, 9.0, 'dup', '2026-03-01T08:20:00Z')",
        [],
    )
    .unwrap();
    let r = ingest(
        &p,
        "2026-03-01T10:30:00Z",
        &["--window", "2026-03-01T08:00:00Z/2026-03-01T10:00:00Z"],
        1,
    );
    assert_eq!(
        statuses(&r),
        [
            ("08:00".into(), "failed".into()),
            ("09:00".into(), "published".into())
        ]
    );
    assert!(
        r["windows"][0]["error"]
            .as_str()
            .unwrap()
            .contains("1 keys occur more than once"),
        "{r}"
    );
    let after = p.tree("raw");
    let w8 = "orders/ingest_date=2026-03-01/ingest_hour=08/part-00000.parquet";
    assert_eq!(
        before[w8], after[w8],
        "the previous version of the window is untouched"
    );
    assert_eq!(
        r["bookmark_after"], "2026-03-01T10:00:00Z",
        "the earlier version of 08 still counts"
    );
    let state_after = p
        .check(
            &[
                "windows",
                "orders",
                "--json",
                "--now",
                "2026-03-01T09:30:00Z",
            ],
            0,
        )
        .stdout;
    let (b, a): (serde_json::Value, serde_json::Value) = (
        serde_json::from_str(&state_before).unwrap(),
        serde_json::from_str(&state_after).unwrap(),
    );
    assert_eq!(
        b["windows"][0], a["windows"][0],
        "the record of 08 is as it was"
    );
}

/// A failed window in the middle of a sequence: later windows publish, the
/// bookmark stops before it, and the next run picks it up first.
#[test]
fn a_failed_window_in_the_middle_is_the_next_runs_first() {
    let (p, c) = project();
    for h in 8..12 {
        put(&c, h, &format!("2026-03-01T{h:02}:30:00Z"));
    }
    // A value SQLite accepts but the integer column cannot take.
    c.execute(
        "INSERT INTO orders VALUES(100, 'not a number', 'x', '2026-03-01T09:40:00Z')",
        [],
    )
    .unwrap();
    c.execute_batch("CREATE VIEW IF NOT EXISTS v AS SELECT 1")
        .unwrap();
    let p2 = Project::new(&SQLITE_SOURCE.replace("table = \"orders\"", "query = \"SELECT id, CAST(amount AS TEXT) AS amount_text, CAST(amount AS INTEGER) + 0 AS amount_int, updated_at FROM orders\""));
    drop(p2);
    // Make window 09 unreadable: its row has text where a REAL column is declared.
    let r = ingest(&p, "2026-03-01T12:05:00Z", &[], 1);
    let s = statuses(&r);
    assert_eq!(s[1], ("09:00".into(), "failed".into()), "{r}");
    assert!(
        r["windows"][1]["error"]
            .as_str()
            .unwrap()
            .contains("column `amount`"),
        "{r}"
    );
    assert_eq!(s[2].1, "published");
    assert_eq!(r["bookmark_after"], "2026-03-01T09:00:00Z");
    let grid = p
        .check(&["windows", "orders", "--now", "2026-03-01T12:05:00Z"], 0)
        .stdout;
    assert!(grid.contains("2026-03-01 #F##"), "{grid}");
    c.execute("UPDATE orders SET amount = 1.0 WHERE id = 100", [])
        .unwrap();
    let r = ingest(&p, "2026-03-01T12:05:00Z", &[], 0);
    assert_eq!(statuses(&r), [("09:00".into(), "published".into())]);
    assert_eq!(
        r["bookmark_after"], "2026-03-01T12:00:00Z",
        "jumps over the windows already published"
    );
}

#[test]
fn a_held_lease_refuses_and_an_expired_one_is_taken_over() {
    use highwater_store::{LeaseOutcome, SqliteStore, StateStore};
    let (p, c) = project();
    put(&c, 1, "2026-03-01T08:10:00Z");
    std::fs::create_dir_all(p.path(".highwater")).unwrap();
    let mut s = SqliteStore::open(&p.path(".highwater/state.db")).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64;
    let LeaseOutcome::Acquired(l) = s
        .acquire_lease(
            "ingest:orders",
            "other:42",
            "elsewhere",
            42,
            now,
            3_600_000_000_000,
        )
        .unwrap()
    else {
        panic!()
    };
    let r = p.check(&["ingest", "orders", "--now", "2026-03-01T09:30:00Z"], 2);
    assert!(
        r.stderr
            .contains("another ingest holds the lease (owner other:42, host elsewhere, pid 42)"),
        "{}",
        r.stderr
    );
    assert!(!p.exists("raw"));
    // The owner dies; its lease expires; the next run takes over.
    s.acquire_lease(
        "ingest:orders",
        "other:42",
        "elsewhere",
        42,
        now - 7_200_000_000_000,
        1,
    )
    .unwrap();
    ingest(&p, "2026-03-01T09:30:00Z", &[], 0);
    let LeaseOutcome::Acquired(again) = s
        .acquire_lease(
            "ingest:orders",
            "third",
            "h",
            1,
            now + 10_000_000_000_000,
            1,
        )
        .unwrap()
    else {
        panic!()
    };
    assert!(
        again.token > l.token + 1,
        "each takeover raised the fencing token"
    );
}

/// Two ingests at once on one source: every window is published exactly
/// once, and the bookmark skips nothing.
#[test]
fn two_concurrent_ingests_neither_duplicate_nor_skip() {
    let (p, c) = project();
    for h in 0..48 {
        for i in 0..20 {
            put(
                &c,
                h * 100 + i,
                &format!(
                    "2026-03-{:02}T{:02}:{:02}:00Z",
                    1 + (8 + h) / 24,
                    (8 + h) % 24,
                    i * 3
                ),
            );
        }
    }
    let spawn = || {
        p.cmd(&[
            "ingest",
            "orders",
            "--json",
            "--wait",
            "--now",
            "2026-03-03T12:00:00Z",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(a.status.success() && b.status.success(), "{a:?} {b:?}");
    let ra: serde_json::Value = serde_json::from_slice(&a.stdout).unwrap();
    let rb: serde_json::Value = serde_json::from_slice(&b.stdout).unwrap();
    let mut starts: Vec<String> = Vec::new();
    for r in [&ra, &rb] {
        for w in r["windows"].as_array().unwrap() {
            assert_eq!(w["status"], "published");
            starts.push(w["start"].as_str().unwrap().to_string());
        }
    }
    let n = starts.len();
    starts.sort();
    starts.dedup();
    assert_eq!(starts.len(), n, "no window published twice");
    assert_eq!(
        n, 51,
        "none skipped: every closed window from 03-01 08:00 to 03-03 11:00"
    );
    let g = p
        .check(
            &[
                "windows",
                "orders",
                "--json",
                "--now",
                "2026-03-03T12:00:00Z",
            ],
            0,
        )
        .json();
    assert_eq!(g["bookmark"], "2026-03-03T11:00:00Z");
    // The lookback lands rows of the last ten minutes twice; deduped on the
    // key, the landed data is the source exactly.
    let source: std::collections::BTreeMap<i64, String> = c
        .prepare("SELECT id, updated_at FROM orders")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(latest(&landed(&p.path("raw/orders"))), source);
}

/// SIGKILL-equivalent aborts at the two dangerous points of a publish. After
/// the swap: the restart finds the attempt's token in `_manifest.json` and
/// records the window without re-running it. Before the swap: nothing is
/// visible, and the restart runs the window again. Either way the window is
/// complete exactly once.
#[test]
fn a_crash_mid_publish_leaves_the_window_complete_exactly_once() {
    for point in ["after-swap", "before-swap"] {
        let (p, c) = project();
        for i in 0..30 {
            put(&c, i, &format!("2026-03-01T08:{:02}:00Z", i));
        }
        let out = p
            .cmd(&["ingest", "orders", "--now", "2026-03-01T09:30:00Z"])
            .env("HIGHWATER_FAILPOINT", point)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{point}: the failpoint aborts");
        let w8 = p.path("raw/orders/ingest_date=2026-03-01/ingest_hour=08");
        assert_eq!(w8.exists(), point == "after-swap");
        let r = ingest(&p, "2026-03-01T09:30:00Z", &[], 0);
        assert_eq!(r["bookmark_after"], "2026-03-01T09:00:00Z", "{point}: {r}");
        if point == "after-swap" {
            assert!(
                r["windows"].as_array().unwrap().is_empty(),
                "recovered, not re-run: {r}"
            );
        }
        let rows = landed(&p.path("raw/orders"));
        assert_eq!(rows.len(), 30, "{point}");
        let leftovers: Vec<_> = std::fs::read_dir(w8.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("staging"))
            .collect();
        assert!(leftovers.is_empty(), "{point}: {leftovers:?}");
    }
}

#[test]
fn catch_up_is_capped_and_windows_must_be_closed() {
    let p = Project::new(&SQLITE_SOURCE.replace(
        "settle = \"2m\"",
        "settle = \"2m\"\ncatch_up_windows_max = 5",
    ));
    let c = db(&p);
    put(&c, 1, "2026-03-01T08:10:00Z");
    let r = ingest(&p, "2026-03-02T08:00:00Z", &[], 0);
    assert_eq!(r["windows"].as_array().unwrap().len(), 5);
    assert_eq!(r["bookmark_after"], "2026-03-01T13:00:00Z");
    let r = p.check(
        &[
            "ingest",
            "orders",
            "--now",
            "2026-03-02T08:00:00Z",
            "--window",
            "2026-03-02T07:00:00Z/2026-03-02T08:00:00Z",
        ],
        2,
    );
    assert!(
        r.stderr
            .contains("is not closed until 2026-03-02T08:02:00Z"),
        "{}",
        r.stderr
    );
    let r = p.check(
        &[
            "ingest",
            "orders",
            "--window",
            "2026-03-01T08:30:00Z/2026-03-01T09:00:00Z",
        ],
        2,
    );
    assert!(r.stderr.contains("not aligned"), "{}", r.stderr);
}

#[test]
fn bad_source_config_is_named() {
    let p = Project::new(&SQLITE_SOURCE.replace("interval = \"1h\"", "interval = \"1 hour\""));
    let r = p.check(&["ingest", "orders"], 2);
    assert!(
        r.stderr.contains("[sources.orders] interval"),
        "{}",
        r.stderr
    );
    let p = Project::new(&SQLITE_SOURCE.replace(
        "ingest_date={date}/ingest_hour={hour}",
        "ingest_date={date}",
    ));
    let r = p.check(&["ingest", "orders"], 2);
    assert!(
        r.stderr.contains("gives two windows the same path"),
        "{}",
        r.stderr
    );
    let p = Project::new(SQLITE_SOURCE);
    let r = p.check(&["ingest", "nope"], 2);
    assert!(
        r.stderr
            .contains("no source named `nope`; the config has: orders"),
        "{}",
        r.stderr
    );
}

/// The window-level checks on their own: keys in two adjacent windows (the
/// lookback's doing here), and continuity set to fail.
#[test]
fn adjacent_duplicates_and_continuity_are_reported() {
    let cfg = SQLITE_SOURCE.replace(
        "continuity = \"warn\"",
        "continuity = \"fail\"\nadjacent_duplicates = \"warn\"",
    );
    let p = Project::new(&cfg);
    let c = db(&p);
    put(&c, 1, "2026-03-01T08:55:00Z");
    put(&c, 2, "2026-03-01T09:20:00Z");
    let r = ingest(&p, "2026-03-01T10:05:00Z", &[], 0);
    let w9 = &r["windows"][1];
    assert_eq!(w9["status"], "published");
    assert!(
        w9["warnings"].to_string().contains("1 keys of window [2026-03-01T09:00:00Z, 2026-03-01T10:00:00Z) also appear in the window before it"),
        "{r}"
    );
    // A hole in the middle: 10:00 fails to read, 11:00 publishes.
    c.execute(
        "INSERT INTO orders VALUES(9, 'bad', 'x', '2026-03-01T10:30:00Z')",
        [],
    )
    .unwrap();
    put(&c, 3, "2026-03-01T11:30:00Z");
    let r = ingest(&p, "2026-03-01T12:05:00Z", &[], 1);
    assert!(
        r["warnings"]
            .to_string()
            .contains("continuity: 1 windows between the first and the newest are not published"),
        "{r}"
    );
}

#[test]
fn commit_order_needs_a_table_and_postgres() {
    let p =
        Project::new(&SQLITE_SOURCE.replace("mode = \"updated_at\"", "mode = \"commit_order\""));
    let r = p.check(&["ingest", "orders"], 2);
    assert!(
        r.stderr.contains("needs PostgreSQL's transaction ids"),
        "{}",
        r.stderr
    );
}

/// Writers commit with a lag while ingest runs again and again; with a
/// lookback longer than the lag, the landed data deduped on the key equals
/// the source table.
#[test]
fn concurrent_writers_with_commit_lag_lose_nothing_on_sqlite() {
    let start_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let start = highwater_core::window::format_rfc3339(start_s as i64 * 1_000_000);
    let cfg = SQLITE_SOURCE
        .replace("interval = \"1h\"", "interval = \"1s\"")
        .replace(
            "start = \"2026-03-01T08:00:00Z\"",
            &format!("start = \"{start}\""),
        )
        .replace("lookback = \"10m\"", "lookback = \"2s\"")
        .replace("settle = \"2m\"", "settle = \"0s\"")
        .replace("ingest_hour={hour}", "w={start}");
    let p = Project::new(&cfg);
    let c = db(&p);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let mut writers = Vec::new();
        for w in 0..3i64 {
            let path = p.path("src.db");
            writers.push(s.spawn(move || {
                let cl = rusqlite::Connection::open(path).unwrap();
                cl.busy_timeout(std::time::Duration::from_secs(30)).unwrap();
                let mut seed = 0x2545_F491_4F6C_DD1Du64 ^ (w as u64 + 7);
                for n in 0..30i64 {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let id = w * 1000 + (seed % 15) as i64;
                    cl.execute_batch("BEGIN IMMEDIATE").unwrap();
                    cl.execute(
                        "INSERT INTO orders VALUES(?1, ?2, 'w', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
                         ON CONFLICT(id) DO UPDATE SET amount = excluded.amount, updated_at = excluded.updated_at",
                        rusqlite::params![id, n as f64],
                    )
                    .unwrap();
                    std::thread::sleep(std::time::Duration::from_millis(seed % 300));
                    cl.execute_batch("COMMIT").unwrap();
                }
            }));
        }
        let ingester = s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let out = p.cmd(&["ingest", "orders"]).output().unwrap();
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                std::thread::sleep(std::time::Duration::from_millis(120));
            }
        });
        for w in writers {
            w.join().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        ingester.join().unwrap();
    });
    std::thread::sleep(std::time::Duration::from_millis(1200));
    p.check(&["ingest", "orders"], 0);
    let source: std::collections::BTreeMap<i64, String> = c
        .prepare("SELECT id, updated_at FROM orders")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(latest(&landed(&p.path("raw/orders"))), source);
}

/// Windows extracted in parallel still move the bookmark only over
/// contiguous published windows, and land every row once.
#[test]
fn parallel_windows_keep_the_bookmark_contiguous() {
    let (p, c) = project();
    for h in 0..24 {
        for i in 0..5 {
            put(
                &c,
                h * 10 + i,
                &format!("2026-03-01T{:02}:{:02}:00Z", (8 + h) % 24, 20 + i),
            );
        }
    }
    let r = ingest(&p, "2026-03-01T23:59:00Z", &["--max-parallel", "4"], 0);
    assert_eq!(r["windows"].as_array().unwrap().len(), 15);
    assert!(r["windows"]
        .as_array()
        .unwrap()
        .iter()
        .all(|w| w["status"] == "published"));
    assert_eq!(r["bookmark_after"], "2026-03-01T23:00:00Z");
    let rows = landed(&p.path("raw/orders"));
    assert_eq!(
        latest(&rows).len(),
        15 * 5 + 8 * 5 - 8 * 5,
        "{}",
        rows.len()
    );
}

/// Issue 9, failure 10: a source whose definition changed no longer carries
/// on silently from its bookmark. Windows published under the old recipe
/// show as stale, are re-landed oldest first under the guard, and a changed
/// interval or cursor is named.
/// Issue 46 (found by its period re-land test): a re-land after a recipe
/// change, killed before its swap, leaves the window published under the
/// recipe of the version still on disk, so it stays stale and the next run
/// re-lands it, never shown fresh while holding the old recipe's rows.
#[test]
fn a_reland_killed_before_its_swap_leaves_the_window_stale() {
    let (p, c) = project();
    for i in 0..30 {
        put(&c, i, &format!("2026-03-01T08:{:02}:00Z", i));
    }
    let now = "2026-03-01T09:30:00Z";
    ingest(&p, now, &[], 0);
    // The new recipe: a query keeping only even ids.
    p.write(
        "highwater.toml",
        &SQLITE_SOURCE.replace(
            "table = \"orders\"",
            "query = \"SELECT * FROM orders WHERE id % 2 = 0\"",
        ),
    );
    let out = p
        .cmd(&["ingest", "orders", "--now", now, "--force"])
        .env("HIGHWATER_FAILPOINT", "before-swap")
        .output()
        .unwrap();
    assert!(!out.status.success(), "the failpoint aborts");
    // The next run recovers the dead attempt: the window keeps the old
    // version and its recipe, so it is still stale, and the run re-lands
    // it, naming what changed (a window recovered as fresh would be left
    // with the old rows, and the run would land nothing).
    let r = ingest(&p, now, &[], 0);
    assert_eq!(
        statuses(&r),
        vec![("08:00".to_string(), "published".to_string())]
    );
    assert!(r["warnings"].to_string().contains("table or query"), "{r}");
    let ids: Vec<i64> = landed(&p.path("raw/orders"))
        .iter()
        .map(|(_, id, _)| *id)
        .collect();
    assert_eq!(ids, (0..30).step_by(2).collect::<Vec<_>>(), "as a rebuild");
}

#[test]
fn issue9_10_a_changed_source_definition_re_lands_its_windows() {
    let (p, c) = project();
    for h in 8..20 {
        put(&c, h, &format!("2026-03-01T{h:02}:30:00Z"));
    }
    let now = "2026-03-01T20:05:00Z";
    let r = ingest(&p, now, &[], 0);
    assert_eq!(statuses(&r).len(), 12);
    let before = latest(&landed(&p.path("raw/orders")));
    assert_eq!(before.len(), 12);
    // The source with its output moved, and one more change.
    let moved = |from: &str, to: &str| {
        SQLITE_SOURCE
            .replace(
                "output = \"raw/orders/ingest_date={date}/ingest_hour={hour}\"",
                "output = \"moved/orders/{date}/{hour}\"",
            )
            .replace(from, to)
    };
    // The output moves: every window is stale, more than the guard allows.
    p.write("highwater.toml", &moved("", ""));
    let grid = p
        .check(
            &["windows", "orders", "--json", "--now", now, "--last", "12"],
            0,
        )
        .json();
    let cells: Vec<&str> = grid["windows"]
        .as_array()
        .or_else(|| grid.as_array())
        .unwrap()
        .iter()
        .map(|w| w["status"].as_str().unwrap())
        .collect();
    assert_eq!(cells, vec!["stale"; 12], "{grid}");
    let text = p
        .check(&["windows", "orders", "--now", now, "--last", "12"], 0)
        .stdout;
    assert!(text.contains("SSSSSSSSSSSS"), "{text}");
    let r = p.hw(&["ingest", "orders", "--now", now]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("output") && r.stderr.contains("--force"),
        "{}",
        r.stderr
    );
    assert!(p.exists("raw/orders"), "nothing was touched");
    // --force re-lands them, oldest first; the old folders go.
    let r = ingest(&p, now, &["--force"], 0);
    let st = statuses(&r);
    assert_eq!(st.first().unwrap().0, "08:00");
    assert!(st.iter().all(|(_, s)| s == "published"), "{st:?}");
    assert_eq!(latest(&landed(&p.path("moved/orders"))), before);
    assert!(
        landed(&p.path("raw/orders")).is_empty(),
        "the old windows are gone"
    );
    let grid = p
        .check(
            &["windows", "orders", "--json", "--now", now, "--last", "12"],
            0,
        )
        .json();
    assert!(!grid.to_string().contains("stale"), "{grid}");
    // A new cursor column changes what a window holds: named, and refused
    // without --force however few the windows.
    p.write(
        "highwater.toml",
        &moved("cursor = \"updated_at\"", "cursor = \"note\""),
    );
    let r = p.hw(&["ingest", "orders", "--now", now]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("cursor"), "{}", r.stderr);
    // A new interval moves the grid: refused even with --force.
    p.write(
        "highwater.toml",
        &moved("interval = \"1h\"", "interval = \"2h\""),
    );
    let r = p.hw(&["ingest", "orders", "--now", now, "--force"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("interval"), "{}", r.stderr);
    assert_eq!(latest(&landed(&p.path("moved/orders"))), before);
}
