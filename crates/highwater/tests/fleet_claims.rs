//! Issue 11: many `highwater run` processes on one PostgreSQL state, each
//! changed item processed once, killed and frozen workers handled by claims
//! with leases and fencing tokens.

mod common;

use common::fleet::{count, finish, spawn, wait_for};
use common::ingest::{pg_database, pg_serial};
use common::{contents, Project};
use std::process::Stdio;
use std::time::Duration;

/// A stage whose command logs each execution (one line per run of an
/// item) and takes a while, so that processes overlap.
fn config(lease_s: u64, batch: usize) -> String {
    format!(
        r#"
[state]
url_env = "HIGHWATER_STATE_URL"
lease_duration_s = {lease_s}
claim_batch_max = {batch}

[stages.upper]
inputs = ["data/*.txt"]
output = "out/{{relpath}}.up"
command = ["sh", "work.sh", "{{input}}", "{{output}}"]
[stages.upper.recipe]
files = ["work.sh"]
"#
    )
}

fn project(lease_s: u64, batch: usize, sleep: &str, items: usize) -> Project {
    let p = Project::new(&config(lease_s, batch));
    p.write(
        "work.sh",
        &format!(
            "set -eu\nmkdir -p started\ntouch \"started/$(basename \"$1\")\"\nsleep {sleep}\ntr 'a-z' 'A-Z' < \"$1\" > \"$2\"\n"
        ),
    );
    for i in 0..items {
        p.write(&format!("data/{i:04}.txt"), &format!("item {i}\n"));
    }
    p
}

/// The outputs a single process makes with the embedded SQLite state.
fn rebuild(items: usize) -> std::collections::BTreeMap<String, Vec<u8>> {
    let p = Project::new(&common::upper_config(""));
    for i in 0..items {
        p.write(&format!("data/{i:04}.txt"), &format!("item {i}\n"));
    }
    p.run_json(&[], 0);
    contents(&p.tree("out"))
        .into_iter()
        .map(|(k, v)| (k.replace(".txt.upper", ".txt.up"), v))
        .collect()
}

#[test]
fn issue11_three_processes_one_killed_record_each_item_once() {
    let _pg = pg_serial();
    let (mut db, url) = pg_database("fleet3");
    let p = project(2, 4, "0.02", 500);
    let a = spawn(&p, &url, &["run", "--json", "--jobs", "2"]);
    let b = spawn(&p, &url, &["run", "--json", "--jobs", "2"]);
    let mut c = spawn(&p, &url, &["run", "--json", "--jobs", "2"]);
    // Kill one process mid-run, with claims in flight: frozen first, so that
    // what it holds can be read and cannot change before the kill.
    wait_for("a quarter of the items to start", || {
        std::fs::read_dir(p.path("started")).map_or(0, |d| d.count()) > 125
    });
    let pid = c.id() as i32;
    loop {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        let held = db
            .query_one(
                "SELECT count(*) FROM work w JOIN processes p ON w.owner = p.owner
                 WHERE p.pid = $1 AND w.state = 'claimed'",
                &[&(pid as i64)],
            )
            .unwrap()
            .get::<_, i64>(0);
        if held > 0 {
            break;
        }
        unsafe { libc::kill(pid, libc::SIGCONT) };
        std::thread::sleep(Duration::from_millis(5));
    }
    c.kill().unwrap();
    c.wait().unwrap();
    let killed_open = count(&mut db, "SELECT count(*) FROM work WHERE state <> 'done'");
    assert!(killed_open > 0, "the kill came while work was open");
    // Restarted, it joins what is left.
    let c2 = spawn(&p, &url, &["run", "--json", "--jobs", "2"]);
    let mut processed = 0;
    let mut takeovers = 0;
    for child in [a, b, c2] {
        let (code, json, stderr) = finish(child);
        assert_eq!(code, 0, "{stderr}");
        let s = &json["stages"][0];
        processed += s["processed"].as_i64().unwrap();
        takeovers += s["fleet"]["takeovers"].as_i64().unwrap();
    }
    // Every item recorded once, by exactly one completion.
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM entries WHERE stage = 'upper' AND status = 'ok'"
        ),
        500
    );
    assert_eq!(
        count(&mut db, "SELECT count(*) FROM work WHERE state = 'done'"),
        500
    );
    assert_eq!(
        count(&mut db, "SELECT sum(done)::bigint FROM processes"),
        500
    );
    // The survivors did what the killed process left, taking its claims over.
    assert!(processed <= 500, "{processed}");
    assert!(takeovers > 0, "the killed process's claims were taken over");
    // A next run on the fleet's state finds nothing to do, and (a claim's
    // lease after the kill) sweeps the temp outputs the killed process
    // left: they may not be a live process's.
    std::thread::sleep(Duration::from_millis(2_100));
    let (_, plan, _) = finish(spawn(&p, &url, &["plan", "--json"]));
    let (code, json, stderr) = finish(spawn(&p, &url, &["run", "--json"]));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json["stages"][0]["unchanged"], 500, "{plan}");
    assert_eq!(json["stages"][0]["processed"], 0);
    // Outputs equal a single-process rebuild with SQLite state.
    assert_eq!(contents(&p.tree("out")), rebuild(500));
}

#[test]
fn issue11_a_frozen_worker_is_fenced_and_overwrites_nothing() {
    let _pg = pg_serial();
    let (mut db, url) = pg_database("fleetstop");
    let p = project(2, 1, "1.5", 3);
    let frozen = spawn(&p, &url, &["run", "--json", "--jobs", "1"]);
    let pid = frozen.id() as i32;
    wait_for("the first item to start", || p.exists("started/0000.txt"));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    // Another process takes every item, the frozen one's after its claim
    // expires.
    let (code, json, stderr) = finish(spawn(&p, &url, &["run", "--json", "--jobs", "3"]));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json["stages"][0]["fleet"]["takeovers"], 1, "{json}");
    assert_eq!(json["stages"][0]["processed"], 3);
    let out = p.path("out/0000.txt.up");
    let before = std::fs::metadata(&out).unwrap();
    let entry_before: i64 = count(
        &mut db,
        "SELECT processed_at_ns FROM entries WHERE item = 'data/0000.txt'",
    );
    // Thawed, its command finishes; its result is refused.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let (code, json, stderr) = finish(frozen);
    assert_eq!(code, 0, "{stderr}");
    let s = &json["stages"][0];
    assert_eq!(s["fleet"]["fenced"], 1, "{json}");
    assert_eq!(s["processed"], 0, "{json}");
    let after = std::fs::metadata(&out).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (before.ino(), before.mtime_nsec()),
        (after.ino(), after.mtime_nsec())
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "ITEM 0\n");
    assert_eq!(
        count(
            &mut db,
            "SELECT processed_at_ns FROM entries WHERE item = 'data/0000.txt'"
        ),
        entry_before
    );
    assert_eq!(
        count(&mut db, "SELECT sum(fenced)::bigint FROM processes"),
        1
    );
    // No temp output of the fenced attempt is left behind.
    let names: Vec<String> = std::fs::read_dir(p.path("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
}

#[test]
fn issue11_a_missing_state_url_is_refused_by_name() {
    let p = project(2, 1, "0", 1);
    let r = p
        .cmd(&["run"])
        .env_remove("HIGHWATER_STATE_URL")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("HIGHWATER_STATE_URL"), "{stderr}");
    // A wrong URL names the variable, never the URL (it may hold a password).
    let r = p
        .cmd(&["run"])
        .env(
            "HIGHWATER_STATE_URL",
            "host=127.0.0.1 port=1 user=secretuser password=hunter2",
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert_ne!(r.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("HIGHWATER_STATE_URL"), "{stderr}");
    assert!(
        !stderr.contains("hunter2") && !stderr.contains("secretuser"),
        "{stderr}"
    );
}

/// Two `highwater ingest` processes on one PostgreSQL source and one
/// PostgreSQL state: every window landed once, none skipped, the bookmark
/// contiguous and at the end, every row landed.
#[test]
fn issue11_two_ingest_processes_share_a_sources_windows() {
    let _pg = pg_serial();
    let (mut src, src_url) = pg_database("fleetsrc");
    let (mut db, state_url) = pg_database("fleetstate");
    src.batch_execute(
        "CREATE TABLE orders(id bigint PRIMARY KEY, amount numeric(12, 3), note text,
            payload jsonb, day date, updated_at timestamptz NOT NULL);
         INSERT INTO orders
         SELECT i, i, 'n' || i, NULL, NULL,
                timestamptz '2026-03-01T00:00:00Z' + (i * interval '37 seconds')
         FROM generate_series(0, 4799) AS i;",
    )
    .unwrap();
    // 4,800 rows, 37 s apart: 49.3 hours, so 48 closed hourly windows.
    let cfg = format!(
        "[state]\nurl_env = \"HIGHWATER_STATE_URL\"\nlease_duration_s = 5\n{}",
        common::ingest::pg_source("updated_at", "0s")
    );
    let p = Project::new(&cfg);
    let run = || {
        p.cmd(&[
            "ingest",
            "orders",
            "--json",
            "--now",
            "2026-03-03T00:05:00Z",
            "--max-parallel",
            "1",
        ])
        .env("HIGHWATER_STATE_URL", &state_url)
        .env("ORDERS_DATABASE_URL", &src_url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
    };
    let (a, b) = (run(), run());
    let mut landed = Vec::new();
    let mut shares = Vec::new();
    for c in [a, b] {
        let (code, json, stderr) = finish(c);
        assert_eq!(code, 0, "{stderr}\n{json}");
        shares.push(json["windows"].as_array().unwrap().len());
        for w in json["windows"].as_array().unwrap() {
            assert_eq!(w["status"], "published", "{w}");
            landed.push(w["start"].as_str().unwrap().to_string());
        }
    }
    // Each of the 48 windows landed by exactly one of the two.
    landed.sort();
    let before = landed.len();
    landed.dedup();
    assert_eq!(before, landed.len(), "a window landed twice: {landed:?}");
    assert_eq!(landed.len(), 48, "{landed:?}");
    eprintln!("windows landed by each process: {shares:?}");
    assert!(
        shares.iter().all(|&n| n > 0),
        "both processes landed windows: {shares:?}"
    );
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM windows WHERE status = 'published'"
        ),
        48
    );
    // The bookmark is contiguous and at the last closed window's end.
    assert_eq!(
        count(
            &mut db,
            "SELECT last_end_us FROM bookmarks WHERE source = 'orders'"
        ),
        highwater_core::window::parse_rfc3339("2026-03-03T00:00:00Z").unwrap()
    );
    // Every row in the window of its timestamp, once.
    let rows = common::ingest::landed_pg(&p.path("raw/orders"));
    assert_eq!(rows.len(), 48 * 3600 / 37 + 1, "{}", rows.len());
    let mut ids: Vec<i64> = rows.iter().map(|r| r.1).collect();
    ids.dedup();
    assert_eq!(ids.len(), rows.len());
}

/// `state migrate` copies the embedded SQLite state into PostgreSQL with
/// checksums; with the config switched over, nothing looks changed, and
/// the fleet shows in `status`.
#[test]
fn issue11_state_migrate_moves_sqlite_state_and_nothing_looks_changed() {
    let _pg = pg_serial();
    let (mut db, url) = pg_database("migrate");
    let sqlite_cfg = format!(
        "{}{}",
        common::upper_config(""),
        common::ingest::SQLITE_SOURCE
    );
    let p = Project::new(&sqlite_cfg);
    for i in 0..30 {
        p.write(&format!("data/{i}.txt"), &format!("x{i}"));
    }
    let src = rusqlite::Connection::open(p.path("src.db")).unwrap();
    src.execute_batch(
        "CREATE TABLE orders(id INTEGER PRIMARY KEY, amount REAL, note TEXT, updated_at TEXT NOT NULL);
         INSERT INTO orders VALUES (1, 1.0, 'a', '2026-03-01T08:10:00Z'), (2, 2.0, 'b', '2026-03-01T09:20:00Z');",
    )
    .unwrap();
    p.run_json(&[], 0);
    let now = ["--now", "2026-03-01T10:30:00Z"];
    p.check(&[&["ingest", "orders", "--json"][..], &now[..]].concat(), 0);
    let migrate = |code| {
        let o = p
            .cmd(&[
                "state",
                "migrate",
                "--to-env",
                "HIGHWATER_STATE_URL",
                "--json",
            ])
            .env("HIGHWATER_STATE_URL", &url)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(code), "{stderr}");
        (
            serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap_or_default(),
            stderr,
        )
    };
    let (report, _) = migrate(0);
    let rows: std::collections::BTreeMap<String, i64> = report["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["table"].as_str().unwrap().to_string(),
                t["rows"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(rows["entries"], 30, "{report}");
    assert_eq!(rows["windows"], 2, "{report}");
    assert_eq!(rows["bookmarks"], 1, "{report}");
    assert!(rows["runs"] >= 1 && rows["output_dirs"] >= 1, "{report}");
    assert_eq!(count(&mut db, "SELECT count(*) FROM entries"), 30);
    // Into a database that holds state: refused, nothing overwritten.
    let (_, stderr) = migrate(2);
    assert!(stderr.contains("already holds state"), "{stderr}");
    // The config now names the shared state: nothing looks changed.
    p.write(
        "highwater.toml",
        &format!("[state]\nurl_env = \"HIGHWATER_STATE_URL\"\n{sqlite_cfg}"),
    );
    let (code, json, stderr) = finish(spawn(&p, &url, &["run", "--json"]));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json["stages"][0]["unchanged"], 30, "{json}");
    assert_eq!(json["stages"][0]["processed"], 0, "{json}");
    let o = p
        .cmd(&[&["ingest", "orders", "--json"][..], &now[..]].concat())
        .env("HIGHWATER_STATE_URL", &url)
        .output()
        .unwrap();
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(o.status.code(), Some(0), "{r}");
    assert_eq!(r["windows"].as_array().unwrap().len(), 0, "{r}");
    assert_eq!(r["bookmark_after"], "2026-03-01T10:00:00Z", "{r}");
    // Status shows the fleet: the run's process, finished, with its counts.
    let o = p
        .cmd(&["status", "--json"])
        .env("HIGHWATER_STATE_URL", &url)
        .output()
        .unwrap();
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let procs = s["fleet"]["processes"].as_array().unwrap();
    assert!(
        procs
            .iter()
            .any(|p| p["command"] == "run" && p["state"] == "finished"),
        "{s}"
    );
    assert!(s["fleet"]["queues"]["upper"]["todo"] == 0, "{s}");
    let human = p
        .cmd(&["status"])
        .env("HIGHWATER_STATE_URL", &url)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.contains("fleet (shared state):") && text.contains("queue upper:"),
        "{text}"
    );
}
