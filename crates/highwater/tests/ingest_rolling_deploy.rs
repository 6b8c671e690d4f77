//! Issue 46, item 8: a rolling deploy of a source. Two `highwater ingest`
//! processes share PostgreSQL state with configs that differ only in the
//! source's `query` (the old deploy and the new). Before, both exited 0
//! and the 48 windows held a mix of both queries' rows. Now a process
//! claims only windows queued under its own recipe, and one that meets
//! another recipe's open queue is refused (exit 2) naming both recipes:
//! no mix is ever reported as success.

mod common;
use common::ingest::{pg_database, pg_serial};
use common::Project;
use serde_json::Value;
use std::collections::BTreeMap;

fn config(note: &str) -> String {
    format!(
        r#"
[state]
url_env = "HIGHWATER_STATE_URL"
[sources.orders]
kind = "sqlite"
path = "src.db"
query = "SELECT id, amount, '{note}' AS note, updated_at FROM orders"
key = ["id"]
mode = "updated_at"
cursor = "updated_at"
interval = "1h"
start = "2026-03-01T00:00:00Z"
settle = "2m"
output = "lake/orders"
format = "delta"
"#
    )
}

const NOW: &str = "2026-03-03T00:05:00Z";

#[test]
fn a_rolling_deploy_never_reports_a_mix_of_recipes_as_success() {
    let _pg = pg_serial();
    for round in 0..3 {
        let (_db, url) = pg_database("rolling");
        let p = Project::new(&config("old"));
        p.write("new.toml", &config("new"));
        let c = rusqlite::Connection::open(p.path("src.db")).unwrap();
        c.execute_batch(
            "CREATE TABLE orders(id INTEGER PRIMARY KEY, amount REAL, updated_at TEXT NOT NULL);",
        )
        .unwrap();
        for h in 0..48 {
            for i in 0..5 {
                c.execute(
                    "INSERT INTO orders VALUES(?1, 1.5, ?2)",
                    rusqlite::params![
                        h * 5 + i,
                        format!("2026-03-{:02}T{:02}:{:02}:00Z", 1 + h / 24, h % 24, i * 10)
                    ],
                )
                .unwrap();
            }
        }
        let spawn = |config: &str| {
            p.cmd(&[
                "--config", config, "ingest", "orders", "--json", "--now", NOW, "--wait",
            ])
            .env("HIGHWATER_STATE_URL", &url)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
        };
        // Old and new together; which plans first is up to the race.
        let (old, new) = (spawn("highwater.toml"), spawn("new.toml"));
        let mut exits = BTreeMap::new();
        for (who, child) in [("old", old), ("new", new)] {
            let o = child.wait_with_output().unwrap();
            let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
            let code = o.status.code();
            if code == Some(2) {
                assert!(
                    stderr.contains("recipe") && stderr.contains("another deploy"),
                    "round {round}, {who}: a refusal names the recipes: {stderr}"
                );
            } else {
                assert_eq!(code, Some(0), "round {round}, {who}: {stderr}");
                let _: Value = serde_json::from_slice(&o.stdout).unwrap();
            }
            eprintln!("round {round}, {who}: exit {code:?}\n{stderr}");
            exits.insert(who, code);
        }
        // What the table holds: each window's rows from one query only,
        // and a process that exited 0 left no window of the other recipe.
        let out = std::process::Command::new(
            std::env::var("HIGHWATER_TEST_PYTHON").expect("HIGHWATER_TEST_PYTHON: run scripts/test.sh"),
        )
        .args([
            "-c",
            // os._exit: pyarrow's threads once aborted the interpreter's
            // shutdown ("terminate called without an active exception")
            // after the answer was printed.
            "import sys, os, json\nfrom deltalake import DeltaTable\nt = DeltaTable(sys.argv[1]).to_pyarrow_table().to_pylist()\nprint(json.dumps(sorted(set(r['note'] for r in t))), flush=True)\nos._exit(0)",
            p.path("lake/orders").to_str().unwrap(),
        ])
        .output()
        .unwrap();
        assert!(
            out.status.success(),
            "round {round} ({exits:?}): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let notes: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            notes.len(),
            1,
            "round {round}: one recipe's rows only: {notes:?} ({exits:?})"
        );
        let winner = notes[0].as_str();
        assert_eq!(
            exits[winner],
            Some(0),
            "round {round}: the deploy whose rows landed succeeded ({exits:?})"
        );
    }
}
