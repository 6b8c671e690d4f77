//! Issue 49: file stages over landed windows. A stage over a source's
//! hourly windows by day, through the real binary: the first run makes one
//! output per day; a compaction, a re-land with the same rows and another
//! engine's OPTIMIZE of a Delta table re-run nothing; a re-land with a
//! changed row re-runs that day only, with the window named as the reason,
//! and makes what a full rebuild makes; a window that failed holds its day
//! while the other days run (exit 1). The same on PostgreSQL state.

mod common;
use common::*;
use serde_json::Value;

/// Hourly windows from 2026-03-01T00:00Z, compacted by day.
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
[sources.orders.checks]
unique_key = "fail"
"#;

const COMPACT: &str = r#"
[sources.orders.compact]
into = "1d"
target_file_mb = 1
"#;

/// Two days closed.
const NOW: &str = "2026-03-03T00:30:00Z";
/// Three days closed.
const NOW3: &str = "2026-03-04T00:30:00Z";

/// The day's rows from the window's files: `{files}` may hold other
/// windows' rows (a compacted period, a Delta table), so the rows are
/// chosen by the window's bounds.
const ROLLUP: &str = r#"
import json, sys
import pyarrow.parquet as pq
start, end, out, *files = sys.argv[1:]
rows = []
for f in files:
    t = pq.read_table(f, columns=["id", "amount", "updated_at"])
    cols = [t.column(c).to_pylist() for c in ["id", "amount", "updated_at"]]
    for i, a, u in zip(*cols):
        if start <= u < end:
            rows.append([i, a])
rows.sort()
with open(out, "w") as o:
    json.dump({"start": start, "rows": len(rows), "total": sum(a for _, a in rows), "ids": rows}, o)
"#;

fn python() -> String {
    std::env::var("HIGHWATER_TEST_PYTHON").expect(
        "HIGHWATER_TEST_PYTHON is not set: run the tests with `bash scripts/test.sh`, which installs pyarrow in its venv",
    )
}

fn stage(state: &str) -> String {
    format!(
        r#"{state}
[stages.daily_totals]
inputs = {{ source = "orders", by = "day" }}
output = "marts/daily_totals/{{day}}.json"
command = ["{}", "rollup.py", "{{window_start}}", "{{window_end}}", "{{output}}", "{{files}}"]
"#,
        python()
    )
}

fn project(source: &str, state: &str) -> (Project, rusqlite::Connection) {
    let p = Project::new(&format!("{}{source}", stage(state)));
    p.write("rollup.py", ROLLUP);
    let c = rusqlite::Connection::open(p.path("src.db")).unwrap();
    // No primary key: a duplicated id is what fails a window's check.
    c.execute_batch(
        "PRAGMA journal_mode=WAL;
         CREATE TABLE orders(id INTEGER, amount INTEGER, updated_at TEXT NOT NULL);",
    )
    .unwrap();
    (p, c)
}

/// Three rows an hour for `days` days from 2026-03-0`first`.
fn fill(c: &rusqlite::Connection, first: i64, days: i64) {
    for day in first..first + days {
        for hour in 0..24 {
            for i in 0..3 {
                let id = (day * 24 + hour) * 3 + i;
                c.execute(
                    "INSERT INTO orders VALUES(?1, ?2, ?3)",
                    rusqlite::params![
                        id,
                        id % 7,
                        format!("2026-03-0{day}T{hour:02}:{:02}:00Z", 10 + i * 10)
                    ],
                )
                .unwrap();
            }
        }
    }
}

fn env(p: &Project, url: Option<&str>, args: &[&str]) -> std::process::Command {
    let mut c = p.cmd(args);
    if let Some(u) = url {
        c.env("HIGHWATER_STATE_URL", u);
    }
    c
}

/// Runs highwater; asserts the exit code; the JSON it printed.
fn hw(p: &Project, url: Option<&str>, args: &[&str], code: i32) -> Value {
    let o = env(p, url, args).output().unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(
        o.status.code(),
        Some(code),
        "{args:?}\nstdout: {out}\nstderr: {err}"
    );
    serde_json::from_str(&out).unwrap_or(Value::Null)
}

fn ingest(p: &Project, url: Option<&str>, now: &str, window: Option<&str>, code: i32) -> Value {
    let mut args = vec!["ingest", "orders", "--now", now, "--json"];
    if let Some(w) = window {
        args.extend(["--window", w]);
    }
    hw(p, url, &args, code)
}

/// The stage's report of a run: (processed, held items).
fn run(p: &Project, url: Option<&str>, code: i32) -> (u64, Vec<Value>) {
    let r = hw(p, url, &["run", "--json"], code);
    let s = stage_of(&r, "daily_totals");
    (
        s["processed"].as_u64().unwrap(),
        s["held"].as_array().cloned().unwrap_or_default(),
    )
}

fn stage_of<'a>(r: &'a Value, name: &str) -> &'a Value {
    r["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no stage {name} in {r}"))
}

fn plan(p: &Project, url: Option<&str>) -> Value {
    stage_of(&hw(p, url, &["plan", "--json"], 0), "daily_totals").clone()
}

fn day(p: &Project, d: &str) -> Value {
    serde_json::from_str(&p.read(&format!("marts/daily_totals/{d}.json"))).unwrap()
}

const D1: &str = "orders/2026-03-01T00:00:00Z/2026-03-02T00:00:00Z";
const D2: &str = "orders/2026-03-02T00:00:00Z/2026-03-03T00:00:00Z";
const D3: &str = "orders/2026-03-03T00:00:00Z/2026-03-04T00:00:00Z";

/// First run, compaction, a same-rows re-land and a changed row: the
/// sequence every state store must pass.
fn first_run_and_changed_row(p: &Project, c: &rusqlite::Connection, url: Option<&str>) {
    fill(c, 1, 2);
    let r = ingest(p, url, NOW, None, 0);
    assert_eq!(r["windows"].as_array().unwrap().len(), 48, "{r}");
    assert_eq!(run(p, url, 0), (2, vec![]));
    assert_eq!(day(p, "2026-03-01")["rows"], 72);
    assert_eq!(day(p, "2026-03-02")["rows"], 72);
    assert_eq!(run(p, url, 0).0, 0, "a second run has nothing to do");

    // A changed row in 2026-03-01T09: that day only, the window named.
    c.execute(
        "UPDATE orders SET amount = 1000 WHERE id = ?1",
        [(24 + 9) * 3 + 1],
    )
    .unwrap();
    let w9 = "2026-03-01T09:00:00Z/2026-03-01T10:00:00Z";
    ingest(p, url, NOW, Some(w9), 0);
    let pl = plan(p, url);
    let changed = pl["changed"].as_array().unwrap();
    assert_eq!(changed.len(), 1, "{pl}");
    assert_eq!(changed[0]["input"], D1);
    assert_eq!(changed[0]["reason"], "content");
    assert_eq!(
        changed[0]["detail"], "re-landed 2026-03-01T09 (rows changed)",
        "{pl}"
    );
    let before2 = p.read("marts/daily_totals/2026-03-02.json");
    assert_eq!(run(p, url, 0).0, 1);
    assert_eq!(p.read("marts/daily_totals/2026-03-02.json"), before2);
    let incremental = (day(p, "2026-03-01"), day(p, "2026-03-02"));
    assert!(incremental.0["ids"]
        .as_array()
        .unwrap()
        .contains(&serde_json::json!([(24 + 9) * 3 + 1, 1000])));
    // A full rebuild makes the same outputs.
    std::fs::remove_dir_all(p.path("marts")).unwrap();
    assert_eq!(run(p, url, 0).0, 2);
    assert_eq!((day(p, "2026-03-01"), day(p, "2026-03-02")), incremental);
}

#[test]
fn stage_over_hourly_windows_by_day_reruns_exactly_the_changed_day() {
    let (p, c) = project(&format!("{SOURCE}{COMPACT}"), "");
    first_run_and_changed_row(&p, &c, None);
    let outputs = || p.tree("marts");

    // A compaction rewrites every file and keeps every row: nothing runs.
    let before = outputs();
    let r = hw(&p, None, &["compact", "orders", "--now", NOW, "--json"], 0);
    assert!(r.to_string().contains("compacted"), "{r}");
    assert_eq!(plan(&p, None)["changed"], serde_json::json!([]));
    assert_eq!(run(&p, None, 0).0, 0);
    assert_eq!(contents(&outputs()), contents(&before));

    // A re-land with the same rows (into the compacted period): nothing.
    ingest(
        &p,
        None,
        NOW,
        Some("2026-03-02T05:00:00Z/2026-03-02T06:00:00Z"),
        0,
    );
    assert_eq!(run(&p, None, 0).0, 0);

    // A changed row after compaction: that day only, from the period's files.
    c.execute(
        "UPDATE orders SET amount = 2000 WHERE id = ?1",
        [(48 + 5) * 3],
    )
    .unwrap();
    ingest(
        &p,
        None,
        NOW,
        Some("2026-03-02T05:00:00Z/2026-03-02T06:00:00Z"),
        0,
    );
    let before1 = p.read("marts/daily_totals/2026-03-01.json");
    assert_eq!(run(&p, None, 0).0, 1);
    assert_eq!(p.read("marts/daily_totals/2026-03-01.json"), before1);
    assert_eq!(day(&p, "2026-03-02")["rows"], 72);
    assert!(day(&p, "2026-03-02")["ids"]
        .as_array()
        .unwrap()
        .contains(&serde_json::json!([(48 + 5) * 3, 2000])));

    // A third day whose 05 window fails its check at landing: the day is
    // held (never run on 23 windows), while a change to day 2 runs; exit 1.
    fill(&c, 3, 1);
    c.execute(
        "INSERT INTO orders VALUES(?1, 1, '2026-03-03T05:55:00Z')",
        [(72 + 5) * 3],
    )
    .unwrap();
    ingest(&p, None, NOW3, None, 1);
    c.execute(
        "UPDATE orders SET amount = 3000 WHERE id = ?1",
        [(48 + 7) * 3],
    )
    .unwrap();
    ingest(
        &p,
        None,
        NOW3,
        Some("2026-03-02T07:00:00Z/2026-03-02T08:00:00Z"),
        0,
    );
    let pl = plan(&p, None);
    let held = pl["held"].as_array().unwrap();
    assert_eq!(held.len(), 1, "{pl}");
    assert_eq!(held[0]["item"], D3);
    assert_eq!(held[0]["waiting"], false);
    assert!(
        held[0]["why"]
            .as_str()
            .unwrap()
            .contains("2026-03-03T05 failed"),
        "{pl}"
    );
    let text = p.check(&["plan"], 0).stdout;
    assert!(text.contains("held") && text.contains(D3), "{text}");
    let (n, held) = run(&p, None, 1);
    assert_eq!(n, 1, "day 2 ran");
    assert_eq!(held.len(), 1);
    assert!(!p.exists("marts/daily_totals/2026-03-03.json"));
    let status = hw(&p, None, &["status", "--json"], 0);
    assert!(
        status.to_string().contains("2026-03-03T05 failed"),
        "{status}"
    );
    // The status page of `highwater serve` shows the held day and why.
    let served = common::serve::serve(&p, &[]);
    let (code, _, body) = common::serve::http(&served.addr, "GET", "/", &[]);
    assert_eq!(code, 200);
    let page = String::from_utf8(body).unwrap();
    let row = page
        .split("<tr class=\"held\">")
        .nth(1)
        .unwrap_or_else(|| panic!("no held row on the status page: {page}"));
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(
        row.contains("held ") && row.contains(D3) && row.contains("2026-03-03T05 failed"),
        "{row}"
    );
    drop(served);

    // The window fixed and landed: the day runs, on all 24 windows.
    c.execute(
        "DELETE FROM orders WHERE rowid = (SELECT max(rowid) FROM orders)",
        [],
    )
    .unwrap();
    ingest(&p, None, NOW3, None, 0);
    assert_eq!(run(&p, None, 0), (1, vec![]));
    assert_eq!(day(&p, "2026-03-03")["rows"], 72);
}

/// Windows not landed yet hold their day as waiting, not as a failure.
#[test]
fn a_day_still_landing_waits_without_failing_the_run() {
    let (p, c) = project(SOURCE, "");
    fill(&c, 1, 2);
    ingest(&p, None, "2026-03-02T10:30:00Z", None, 0);
    let (n, held) = run(&p, None, 0);
    assert_eq!(n, 1);
    assert_eq!(held.len(), 1);
    assert_eq!(held[0]["item"], D2);
    assert_eq!(held[0]["waiting"], true);
    ingest(&p, None, NOW, None, 0);
    assert_eq!(run(&p, None, 0), (1, vec![]));
}

/// A window whose files are gone (a hand's `rm`, a retention sweep)
/// holds the items that would read it, and only those: a plan looks for
/// the files of the windows it would run, never of up-to-date ones, whose
/// outputs were made when the files were there (issue 49: those lookups
/// were a third of a no-change plan over 1,000 windows).
#[test]
fn a_window_gone_from_disk_holds_only_the_items_that_would_read_it() {
    let (p, c) = project(SOURCE, "");
    fill(&c, 1, 2);
    ingest(&p, None, NOW, None, 0);
    assert_eq!(run(&p, None, 0), (2, vec![]));
    std::fs::remove_dir_all(p.path("raw/orders/date=2026-03-01/hour=07")).unwrap();
    std::fs::remove_dir_all(p.path("raw/orders/date=2026-03-02/hour=03")).unwrap();
    // Up to date: nothing to run, nothing held.
    let pl = plan(&p, None);
    assert_eq!(pl["changed"], serde_json::json!([]), "{pl}");
    assert_eq!(pl["held"], serde_json::json!([]), "{pl}");
    assert_eq!(run(&p, None, 0).0, 0);
    // Day 1's output removed: it would run, and its files are not there.
    std::fs::remove_file(p.path("marts/daily_totals/2026-03-01.json")).unwrap();
    let pl = plan(&p, None);
    assert_eq!(pl["changed"], serde_json::json!([]), "{pl}");
    let held = pl["held"].as_array().unwrap();
    assert_eq!(held.len(), 1, "{pl}");
    assert_eq!(held[0]["item"], D1);
    assert_eq!(held[0]["waiting"], false);
    assert!(
        held[0]["why"]
            .as_str()
            .unwrap()
            .contains("2026-03-01T07 gone from the output"),
        "{pl}"
    );
    let (n, held) = run(&p, None, 1);
    assert_eq!((n, held.len()), (0, 1));
    assert!(!p.exists("marts/daily_totals/2026-03-01.json"));
    // Landed again, the day runs; day 2, still up to date, does not.
    ingest(
        &p,
        None,
        NOW,
        Some("2026-03-01T07:00:00Z/2026-03-01T08:00:00Z"),
        0,
    );
    assert_eq!(run(&p, None, 0), (1, vec![]));
    assert_eq!(day(&p, "2026-03-01")["rows"], 72);
}

/// By window, an item is one window: its evidence names the window and
/// the digest of its rows, so no member entry is kept beside it (they
/// doubled what each plan loaded, issue 49), and a re-land with a changed
/// row still names the window. A state that kept members (an earlier
/// highwater) has them pruned by the next run.
#[test]
fn a_stage_by_window_names_the_relanded_window_without_member_entries() {
    let p = Project::new(&format!(
        r#"
[stages.hourly]
inputs = {{ source = "orders", by = "window" }}
output = "marts/hourly/{{window_start}}.json"
command = ["{}", "rollup.py", "{{window_start}}", "{{window_end}}", "{{output}}", "{{files}}"]
{SOURCE}"#,
        python()
    ));
    p.write("rollup.py", ROLLUP);
    let c = rusqlite::Connection::open(p.path("src.db")).unwrap();
    c.execute_batch("CREATE TABLE orders(id INTEGER, amount INTEGER, updated_at TEXT NOT NULL);")
        .unwrap();
    fill(&c, 1, 1);
    let now = "2026-03-02T00:30:00Z";
    ingest(&p, None, now, None, 0);
    let ran =
        |code| stage_of(&hw(&p, None, &["run", "--json"], code), "hourly")["processed"].clone();
    assert_eq!(ran(0), 24);
    let state = rusqlite::Connection::open(p.path(".highwater/state.db")).unwrap();
    let members = || -> i64 {
        state
            .query_row(
                "SELECT count(*) FROM entries WHERE stage = 'hourly' AND kind = 'member'",
                [],
                |r| r.get(0),
            )
            .unwrap()
    };
    assert_eq!(members(), 0);

    // As an earlier highwater left it: a member beside an unchanged item.
    state
        .execute(
            "INSERT INTO entries(stage, kind, item, digest, size, mtime_ns, ctime_ns, ino, dev,
                 observed_at_ns, recipe, output, error, status, processed_at_ns, duration_ms)
             VALUES('hourly', 'member', 'orders@2026-03-01T10:00:00Z', NULL, 0, 0, 0, 0, 0, 0, '',
                 'orders/2026-03-01T10:00:00Z/2026-03-01T11:00:00Z', NULL, 'ok', 0, 0)",
            [],
        )
        .unwrap();
    c.execute(
        "UPDATE orders SET amount = 1000 WHERE id = ?1",
        [(24 + 9) * 3 + 1],
    )
    .unwrap();
    ingest(
        &p,
        None,
        now,
        Some("2026-03-01T09:00:00Z/2026-03-01T10:00:00Z"),
        0,
    );
    let pl = stage_of(&hw(&p, None, &["plan", "--json"], 0), "hourly").clone();
    let changed = pl["changed"].as_array().unwrap();
    assert_eq!(changed.len(), 1, "{pl}");
    assert_eq!(
        changed[0]["input"],
        "orders/2026-03-01T09:00:00Z/2026-03-01T10:00:00Z"
    );
    assert_eq!(
        changed[0]["detail"], "re-landed 2026-03-01T09 (rows changed)",
        "{pl}"
    );
    assert_eq!(ran(0), 1);
    assert_eq!(members(), 0, "the earlier member is pruned");
    let h9: Value =
        serde_json::from_str(&p.read("marts/hourly/2026-03-01T09:00:00Z.json")).unwrap();
    assert!(h9["ids"]
        .as_array()
        .unwrap()
        .contains(&serde_json::json!([(24 + 9) * 3 + 1, 1000])));
    // A full rebuild makes the same outputs.
    let made = contents(&p.tree("marts"));
    std::fs::remove_dir_all(p.path("marts")).unwrap();
    assert_eq!(ran(0), 24);
    assert_eq!(contents(&p.tree("marts")), made);
}

/// A Delta table another engine (deltalake) OPTIMIZEs: the files change,
/// the rows do not, and nothing re-runs; a rebuild from the new files
/// makes the same outputs.
#[test]
fn delta_optimize_by_another_engine_reruns_nothing() {
    let source = SOURCE.replace(
        "output = \"raw/orders/date={date}/hour={hour}\"",
        "output = \"raw/orders\"\nformat = \"delta\"",
    );
    let (p, c) = project(&source, "");
    fill(&c, 1, 2);
    ingest(&p, None, NOW, None, 0);
    assert_eq!(run(&p, None, 0).0, 2);
    let made = contents(&p.tree("marts"));
    let o = std::process::Command::new(python())
        .arg("-c")
        .arg(include_str!("delta_foreign/actor.py"))
        .arg(p.path("raw/orders"))
        .arg(r#"{"op": "optimize"}"#)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        m["numFilesRemoved"].as_u64().unwrap() >= 48 && m["numFilesAdded"].as_u64().unwrap() >= 1,
        "the optimize rewrote the windows' files: {m}"
    );
    assert_eq!(plan(&p, None)["changed"], serde_json::json!([]));
    assert_eq!(run(&p, None, 0).0, 0);
    std::fs::remove_dir_all(p.path("marts")).unwrap();
    assert_eq!(run(&p, None, 0).0, 2);
    assert_eq!(contents(&p.tree("marts")), made);
}

/// On PostgreSQL state: the first run and a changed row, the same.
#[test]
fn stage_over_windows_on_postgres_state() {
    let _serial = common::ingest::pg_serial();
    let (_db, url) = common::ingest::pg_database("windows");
    let (p, c) = project(SOURCE, "[state]\nurl_env = \"HIGHWATER_STATE_URL\"\n");
    first_run_and_changed_row(&p, &c, Some(&url));
}

/// Issue 49: a plan reads only the windows' heads, and an item's data
/// files are read as it runs. A window landed again between the plan and
/// the item (here by the run's own first item, as another process would)
/// fails that item with the window named; it never runs on rows other than
/// planned, and the next run does it, making what a rebuild makes.
#[test]
fn a_window_landed_again_during_the_run_fails_its_day_and_runs_next_time() {
    // Row 150 is 2026-03-02T02:10 (day 2, hour 2).
    let relander = format!(
        r#"
if [ "$1" = "2026-03-01T00:00:00Z" ] && [ ! -f relanded ]; then
  touch relanded
  "{py}" -c "import sqlite3; c = sqlite3.connect('src.db'); c.execute('UPDATE orders SET amount = 1000 WHERE id = 150'); c.commit()"
  "{hw}" ingest orders --now {NOW} --window 2026-03-02T02:00:00Z/2026-03-02T03:00:00Z >/dev/null || exit 9
fi
exec "{py}" rollup.py "$@"
"#,
        py = python(),
        hw = bin(),
    );
    let p = Project::new(&format!(
        r#"
[stages.daily_totals]
inputs = {{ source = "orders", by = "day" }}
output = "marts/daily_totals/{{day}}.json"
command = ["sh", "relander.sh", "{{window_start}}", "{{window_end}}", "{{output}}", "{{files}}"]
observe = false
{SOURCE}"#
    ));
    p.write("rollup.py", ROLLUP);
    p.write("relander.sh", &relander);
    let c = rusqlite::Connection::open(p.path("src.db")).unwrap();
    c.execute_batch("CREATE TABLE orders(id INTEGER, amount INTEGER, updated_at TEXT NOT NULL);")
        .unwrap();
    fill(&c, 1, 2);
    ingest(&p, None, NOW, None, 0);
    let r = hw(&p, None, &["run", "--jobs", "1", "--json"], 1);
    let s = stage_of(&r, "daily_totals");
    assert_eq!(s["processed"], 1, "{r}");
    let failed = s["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{r}");
    assert_eq!(failed[0]["input"], D2, "{r}");
    // Refused by the window's record (read before the re-land) against
    // its folder now, or by the plan's token against the record: either
    // way the item names the window and never runs on the new rows.
    let why = failed[0]["error"].as_str().unwrap();
    assert!(
        why.contains("date=2026-03-02/hour=02") && why.contains("another attempt")
            || why.contains("2026-03-02T02:00:00Z")
                && why.contains("landed again since this run planned it"),
        "{why}"
    );
    assert!(!p.exists("marts/daily_totals/2026-03-02.json"));
    // The next run does the day on the rows landed now.
    assert_eq!(run(&p, None, 0).0, 1);
    let incremental = (day(&p, "2026-03-01"), day(&p, "2026-03-02"));
    assert!(incremental.1["ids"]
        .as_array()
        .unwrap()
        .contains(&serde_json::json!([150, 1000])));
    std::fs::remove_dir_all(p.path("marts")).unwrap();
    assert_eq!(run(&p, None, 0).0, 2);
    assert_eq!((day(&p, "2026-03-01"), day(&p, "2026-03-02")), incremental);
}
