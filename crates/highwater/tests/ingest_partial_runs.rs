//! Issue 46, "Exit codes as README says" and "Refused at config load":
//! a run that committed some windows and then lost its object storage
//! (the S3 server stops mid-run) reports both, and exits 1, not 2 with an
//! empty stdout; two sources, or a source and a file stage, that would
//! write one output are refused before anything is touched, naming both.

mod common;
use common::Project;
use highwater_objects::testing::Moto;
use serde_json::Value;
use std::time::{Duration, Instant};

fn delta_source(name: &str, output: &str, table: &str) -> String {
    format!(
        r#"
[sources.{name}]
kind = "sqlite"
path = "src.db"
table = "{table}"
key = ["id"]
mode = "updated_at"
cursor = "updated_at"
interval = "1h"
start = "2026-03-01T08:00:00Z"
settle = "2m"
output = "{output}"
format = "delta"
"#
    )
}

fn fill(p: &Project, table: &str, hours: i64) {
    let c = rusqlite::Connection::open(p.path("src.db")).unwrap();
    c.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS {table}(id INTEGER PRIMARY KEY, amount REAL, updated_at TEXT NOT NULL);"
    ))
    .unwrap();
    for h in 0..hours {
        for i in 0..5 {
            c.execute(
                &format!("INSERT OR REPLACE INTO {table} VALUES(?1, ?2, ?3)"),
                rusqlite::params![
                    h * 5 + i,
                    1.5,
                    format!("2026-03-01T{:02}:{:02}:00Z", 8 + h, i * 10)
                ],
            )
            .unwrap();
        }
    }
}

/// The S3 server stops after the first window's commit: that window
/// stays published and reported, the next fails naming object storage,
/// the rest are reported not run, and the exit code is 1.
#[test]
fn an_outage_after_some_commits_reports_both_and_exits_1() {
    let moto = Moto::start();
    moto.bucket("lakehouse");
    let storage = "[storage.lake]\nkind = \"s3\"\nbucket = \"lakehouse\"\nendpoint_env = \"S3_ENDPOINT\"\nregion = \"us-east-1\"\n";
    let p = Project::new(&format!(
        "{storage}{}",
        delta_source("orders", "lake:tables/orders", "orders")
    ));
    fill(&p, "orders", 4);
    let gate = p.path("gate");
    std::fs::write(&gate, b"").unwrap();
    let mut reached = gate.clone().into_os_string();
    reached.push(".reached");
    let mut cmd = p.cmd(&[
        "ingest",
        "orders",
        "--json",
        "--max-parallel",
        "1",
        "--now",
        "2026-03-01T12:05:00Z",
    ]);
    for (k, v) in moto.env() {
        cmd.env(k, v);
    }
    let child = cmd
        .env("HIGHWATER_FAILPOINT", "ingest-gate")
        .env("HIGHWATER_FAILPOINT_GATE", &gate)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !std::path::Path::new(&reached).exists() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the first window never finished"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The outage: the server is gone before the second window's commit.
    drop(moto);
    std::fs::remove_file(&gate).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "some work done, some not: {stderr}"
    );
    let r: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("a report on stdout ({e}): {stderr}"));
    let windows = r["windows"].as_array().unwrap();
    assert_eq!(windows.len(), 4, "{r}");
    let status: Vec<&str> = windows
        .iter()
        .map(|w| w["status"].as_str().unwrap())
        .collect();
    assert_eq!(status, ["published", "failed", "failed", "failed"], "{r}");
    assert!(
        windows[1]["error"]
            .as_str()
            .unwrap()
            .contains("object storage"),
        "{r}"
    );
    for w in &windows[2..] {
        assert!(
            w["error"]
                .as_str()
                .unwrap()
                .starts_with("not run: an earlier window failed"),
            "{r}"
        );
    }
}

/// Two sources with one Delta table as output, and a source whose Parquet
/// folders lie inside a file stage's output root: refused before anything
/// is read or written (exit 2), naming both.
#[test]
fn two_writers_of_one_output_are_refused_naming_both() {
    let p = Project::new(&format!(
        "{}{}",
        delta_source("orders", "lake/orders", "orders"),
        delta_source("refunds", "lake/orders", "refunds")
    ));
    fill(&p, "orders", 2);
    fill(&p, "refunds", 2);
    for name in ["orders", "refunds"] {
        let r = p.hw(&["ingest", name, "--now", "2026-03-01T12:05:00Z"]);
        assert_eq!(r.code, 2, "{}", r.stderr);
        for s in ["source `orders`", "source `refunds`", "lake/orders"] {
            assert!(r.stderr.contains(s), "wanted {s:?} in {}", r.stderr);
        }
    }
    assert!(!p.exists("lake/orders"), "nothing written");
    // A stage whose outputs land where a source's windows do.
    let p = Project::new(&format!(
        "{}\n[stages.report]\ninputs = [\"in/*.txt\"]\noutput = \"raw/{{relpath}}.out\"\ncommand = [\"cp\", \"{{input}}\", \"{{output}}\"]\n",
        delta_source("orders", "raw/orders", "orders")
    ));
    p.write("in/a.txt", "a");
    fill(&p, "orders", 1);
    for args in [
        vec!["ingest", "orders", "--now", "2026-03-01T12:05:00Z"],
        vec!["run"],
    ] {
        let r = p.hw(&args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        for s in ["source `orders`", "stage `report`"] {
            assert!(
                r.stderr.contains(s),
                "{args:?}: wanted {s:?} in {}",
                r.stderr
            );
        }
    }
    assert!(!p.exists("raw"), "nothing written");
}
