//! Issue 13: chunked windows on a real PostgreSQL server (started by
//! `scripts/test.sh`): one exported snapshot for every chunk while writers
//! keep writing, and SIGKILL between chunks and before the swap.

mod common;
use common::ingest::*;
use common::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

fn source(chunk_rows: usize) -> String {
    format!(
        r#"
[sources.orders]
kind = "postgres"
url_env = "ORDERS_DATABASE_URL"
table = "orders"
key = ["id"]
mode = "updated_at"
cursor = "updated_at"
interval = "1d"
start = "2026-03-01T00:00:00Z"
settle = "1m"
output = "raw/orders/{{date}}"
chunk_by = "id"
chunk_rows = {chunk_rows}
"#
    )
}

const NOW: &str = "2026-03-02T01:00:00Z";
const WINDOW: &str = "2026-03-01";

fn create(c: &mut postgres::Client, rows: i64) {
    c.batch_execute(&format!(
        "CREATE TABLE orders(id int8 PRIMARY KEY, v int8 NOT NULL, note text, updated_at timestamptz NOT NULL);
         INSERT INTO orders SELECT g, 100, md5(g::text), timestamptz '2026-03-01' + (g % 86000) * interval '1 s'
           FROM generate_series(1, {rows}) g;
         ANALYZE orders;"
    ))
    .unwrap();
}

/// Every landed row: id -> (v, times seen).
fn landed_v(root: &std::path::Path) -> BTreeMap<i64, (i64, usize)> {
    let mut out: BTreeMap<i64, (i64, usize)> = BTreeMap::new();
    each_batch(root, |_, b| {
        let (ids, v) = (i64_column(b, "id"), i64_column(b, "v"));
        for i in 0..ids.len() {
            let e = out.entry(ids.value(i)).or_default();
            e.0 = v.value(i);
            e.1 += 1;
        }
    });
    out
}

fn manifest(p: &Project) -> serde_json::Value {
    serde_json::from_str(&p.read(&format!("raw/orders/{WINDOW}/_manifest.json"))).unwrap()
}

/// The chunk records of the window, from the state store.
fn chunk_records(p: &Project) -> Vec<serde_json::Value> {
    let c = rusqlite::Connection::open(p.path(".highwater/state.db")).unwrap();
    let extra: String = c
        .query_row(
            "SELECT extra FROM windows WHERE source = 'orders'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&extra).unwrap();
    v["chunks"].as_array().cloned().unwrap_or_default()
}

/// 2,000,000 rows in one window, chunked about 8 ways, while writers move
/// value between rows of different chunks and insert rows counted on row 1.
/// Each writer transaction keeps two invariants, so the landed rows can only
/// satisfy them if every chunk read the same snapshot: the sum of `v` over
/// the original rows, and row 1's `v` against the number of inserted rows.
#[test]
fn issue13_chunked_window_is_one_snapshot_under_concurrent_writers() {
    let _serial = pg_serial();
    let (mut c, url) = pg_database("chunks8");
    const ROWS: i64 = 2_000_000;
    create(&mut c, ROWS);
    let p = Project::new(&source(260_000));
    let stop = AtomicBool::new(false);
    let writes = AtomicU64::new(0);
    let during = std::thread::scope(|s| {
        for w in 0..2i64 {
            let (url, stop, writes) = (&url, &stop, &writes);
            s.spawn(move || {
                let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
                let mut n: i64 = 0;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let mut tx = c.transaction().unwrap();
                    // From a low id to a high one: different chunks.
                    let a = 2 + (n * 7919 + w) % 900_000;
                    let b = 1_000_000 + (n * 104_729 + w) % 999_000;
                    tx.execute("UPDATE orders SET v = v - 1 WHERE id = $1", &[&a])
                        .unwrap();
                    tx.execute("UPDATE orders SET v = v + 1 WHERE id = $1", &[&b])
                        .unwrap();
                    if n % 3 == 0 {
                        let id = 10_000_000 + w * 1_000_000 + n;
                        tx.execute(
                            "INSERT INTO orders VALUES ($1, 0, 'new', timestamptz '2026-03-01T12:00:00Z')",
                            &[&id],
                        )
                        .unwrap();
                        tx.execute("UPDATE orders SET v = v + 1 WHERE id = 1", &[])
                            .unwrap();
                    }
                    tx.commit().unwrap();
                    writes.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
        // Let the writers get going, then ingest while they write.
        while writes.load(Ordering::SeqCst) < 50 {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let before = writes.load(Ordering::SeqCst);
        let r = p
            .cmd(&[
                "ingest",
                "orders",
                "--now",
                NOW,
                "--max-parallel",
                "4",
                "--json",
            ])
            .env("ORDERS_DATABASE_URL", &url)
            .output()
            .unwrap();
        let after = writes.load(Ordering::SeqCst);
        stop.store(true, Ordering::SeqCst);
        assert!(
            r.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&r.stdout),
            String::from_utf8_lossy(&r.stderr)
        );
        after - before
    });
    assert!(during > 0, "the writers wrote while the window was read");
    let m = manifest(&p);
    let chunks = m["chunks"].as_array().unwrap();
    assert!(
        (6..=10).contains(&chunks.len()),
        "about 8 chunks of ~260k rows: {}",
        chunks.len()
    );
    let snapshots: std::collections::BTreeSet<&str> = chunks
        .iter()
        .map(|c| c["snapshot"].as_str().unwrap())
        .collect();
    assert_eq!(snapshots.len(), 1, "every chunk read one snapshot");
    let rows = landed_v(&p.path("raw/orders"));
    let twice: Vec<_> = rows.iter().filter(|(_, (_, n))| *n != 1).take(5).collect();
    assert!(twice.is_empty(), "rows landed more than once: {twice:?}");
    let inserted = rows.keys().filter(|id| **id >= 10_000_000).count() as i64;
    let original_sum: i64 = rows
        .iter()
        .filter(|(id, _)| **id >= 2 && **id <= ROWS)
        .map(|(_, (v, _))| v)
        .sum();
    assert_eq!(
        original_sum,
        (ROWS - 1) * 100,
        "value moved between chunks is neither lost nor counted twice"
    );
    assert_eq!(rows[&1].0 - 100, inserted, "row 1 counts the inserted rows");
    assert_eq!(rows.len() as i64, ROWS + inserted);
    assert_eq!(m["rows"].as_i64(), Some(ROWS + inserted));
    // The per-chunk digests add up to the window's.
    assert!(m["digest"]
        .as_str()
        .unwrap()
        .starts_with(&format!("rd1:{}:", ROWS + inserted)));
}

/// SIGKILL after a chunk is recorded, then before the swap: every row lands
/// exactly once, and a chunk that finished is never read again.
#[test]
fn issue13_killed_chunked_window_resumes_without_rereading_finished_chunks() {
    let _serial = pg_serial();
    let (mut c, url) = pg_database("chunkkill");
    create(&mut c, 20_000);
    let p = Project::new(&source(2_500));
    let run = |failpoint: Option<&str>| {
        let mut cmd = p.cmd(&["ingest", "orders", "--now", NOW, "--max-parallel", "2"]);
        cmd.env("ORDERS_DATABASE_URL", &url);
        if let Some(f) = failpoint {
            cmd.env("HIGHWATER_FAILPOINT", f);
        }
        cmd.output().unwrap()
    };
    let r = run(Some("after-chunk"));
    assert_eq!(r.status.code(), None, "killed");
    let first: Vec<serde_json::Value> = chunk_records(&p);
    assert!(first.len() >= 4, "{first:?}");
    let done_first: Vec<usize> = (0..first.len())
        .filter(|i| first[*i]["status"] == "done")
        .collect();
    assert!(
        !done_first.is_empty(),
        "a chunk was recorded before the kill"
    );
    // The files of the finished chunks, as they were.
    let window_glob = |p: &Project| -> BTreeMap<String, std::time::SystemTime> {
        let dir = p.path("raw/orders");
        let mut out = BTreeMap::new();
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.contains(".hw-staging-") || name == WINDOW {
                for f in std::fs::read_dir(e.path()).unwrap().flatten() {
                    out.insert(
                        f.file_name().to_string_lossy().into_owned(),
                        f.metadata().unwrap().modified().unwrap(),
                    );
                }
            }
        }
        out
    };
    let files_first = window_glob(&p);
    let r = run(Some("before-swap"));
    assert_eq!(r.status.code(), None, "killed");
    assert!(
        !p.exists(&format!("raw/orders/{WINDOW}")),
        "not published yet"
    );
    let r = run(None);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let last = chunk_records(&p);
    assert_eq!(last.len(), first.len(), "the plan was kept");
    for i in &done_first {
        assert_eq!(
            last[*i]["reads"], 1,
            "chunk {i} finished in the first run and was not read again"
        );
        assert_eq!(last[*i]["snapshot"], first[*i]["snapshot"]);
        for f in last[*i]["files"].as_array().unwrap() {
            let name = f["path"].as_str().unwrap();
            assert_eq!(
                window_glob(&p).get(name),
                files_first.get(name),
                "chunk {i}'s file {name} was not rewritten"
            );
        }
    }
    // The third run read nothing: every chunk was done by the second.
    assert!(last.iter().all(|c| c["status"] == "done"));
    let total_reads: u64 = last.iter().map(|c| c["reads"].as_u64().unwrap()).sum();
    assert!(
        total_reads <= last.len() as u64 + 2,
        "at most the chunks running at the first kill were read twice: {total_reads} reads of {} chunks",
        last.len()
    );
    let rows = landed_v(&p.path("raw/orders"));
    assert_eq!(rows.len(), 20_000);
    assert!(
        rows.values().all(|(_, n)| *n == 1),
        "every row exactly once"
    );
    let w = p
        .cmd(&["windows", "orders", "--now", NOW, "--json"])
        .output()
        .unwrap();
    let w: serde_json::Value = serde_json::from_slice(&w.stdout).unwrap();
    let cell = w["windows"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(cell["status"], "published", "{w}");
    assert_eq!(
        cell["chunks"]["done"].as_u64(),
        Some(last.len() as u64),
        "{w}"
    );
}

#[test]
fn issue13_chunk_by_is_refused_where_it_cannot_hold() {
    let sqlite = source(5_000).replace("kind = \"postgres\"", "kind = \"sqlite\"\npath = \"x.db\"");
    let r = Project::new(&sqlite).check(&["windows", "orders"], 2);
    assert!(
        r.stderr.contains("`chunk_by` needs a PostgreSQL `table`"),
        "{}",
        r.stderr
    );
    let small = source(10);
    let r = Project::new(&small).check(&["windows", "orders"], 2);
    assert!(r.stderr.contains("give at least 1000"), "{}", r.stderr);
}
