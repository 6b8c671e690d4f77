//! Issue 21: `format = "delta"`: a source's windows as commits of one Delta
//! Lake table, local and in object storage (moto on loopback), read back by
//! the `deltalake` Python package from PyPI (and Polars' `read_delta`),
//! which know nothing of highwater: every row once, the schema, the log's
//! actions; re-lands, crashes around the commit put, two processes on
//! PostgreSQL state, and the schema rule.

mod common;
use common::delta::{config, db, fill, published, python};
use common::ingest::{pg_database, pg_serial};
use common::Project;
use highwater_objects::testing::Moto;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// The reader: the table's version, schema, rows (sorted by id), files
/// and, through Polars, its row count.
const READER: &str = r#"
import json, sys
from deltalake import DeltaTable
import polars as pl
uri = sys.argv[1]
opts = json.loads(sys.argv[2])
dt = DeltaTable(uri, storage_options=opts or None)
t = dt.to_pyarrow_table()
rows = sorted(t.to_pylist(), key=lambda r: r["id"])
for r in rows:
    for k, v in list(r.items()):
        if not isinstance(v, (int, float, str, type(None))):
            r[k] = str(v)
print(json.dumps({
    "version": dt.version(),
    "schema": [[f.name, str(f.type)] for f in dt.schema().fields],
    "protocol": [dt.protocol().min_reader_version, dt.protocol().min_writer_version],
    "files": sorted(dt.file_uris()),
    "rows": rows,
    "polars_rows": pl.read_delta(uri, storage_options=opts or None).height,
}))
"#;

/// What the deltalake reader sees of the table at `uri`.
fn read(uri: &str, opts: &Value) -> Value {
    let o = std::process::Command::new(python())
        .args(["-c", READER, uri, &opts.to_string()])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "the deltalake reader failed on {uri}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

fn ids(t: &Value) -> Vec<i64> {
    t["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect()
}

/// The commits of a local table's log, each as its actions.
fn log(table: &std::path::Path) -> Vec<Vec<Value>> {
    let mut out = Vec::new();
    for v in 0.. {
        let Ok(text) = std::fs::read_to_string(table.join(format!("_delta_log/{v:020}.json")))
        else {
            break;
        };
        out.push(
            text.lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect(),
        );
    }
    out
}

/// The actions of one kind in a commit.
fn actions<'a>(commit: &'a [Value], kind: &str) -> Vec<&'a Value> {
    commit.iter().filter_map(|a| a.get(kind)).collect()
}

const NOW: &str = "2026-03-02T08:05:00Z";

fn ingest(p: &Project, env: &[(&str, String)], extra: &[&str], code: i32) -> Value {
    ingest_at(p, NOW, env, extra, code)
}

/// `ingest` at `now`: the windows closed by then that are not published.
fn ingest_at(p: &Project, now: &str, env: &[(&str, String)], extra: &[&str], code: i32) -> Value {
    let mut c = p.cmd(&["ingest", "orders", "--json", "--now", now]);
    c.args(extra);
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "{stderr}");
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"))
}

/// Issue 21: 24 hourly windows into a local table: 24 commits, each with
/// its window's adds, a txn (app id = the source, version = the window's
/// index) and a commitInfo naming window and recipe, and a Parquet
/// checkpoint every 10 commits; the reader sees every row once, protocol
/// (1, 2), the source's schema.
#[test]
fn delta_local_table_24_windows_each_row_once() {
    let p = Project::new(&config("lake/orders", ""));
    let c = db(&p);
    fill(&c, 24, 10, "first");
    let r = ingest(&p, &[], &[], 0);
    assert_eq!(published(&r), 24, "{r}");
    let t = read(p.path("lake/orders").to_str().unwrap(), &Value::Null);
    assert_eq!(ids(&t), (0..240).collect::<Vec<_>>());
    assert_eq!(t["polars_rows"], 240);
    assert_eq!(t["version"], 23);
    assert_eq!(t["protocol"], serde_json::json!([1, 2]));
    let schema: Vec<String> = t["schema"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| format!("{}:{}", f[0].as_str().unwrap(), f[1].as_str().unwrap()))
        .collect();
    assert_eq!(
        schema
            .iter()
            .map(|s| s.split(':').next().unwrap())
            .collect::<Vec<_>>(),
        ["id", "amount", "note", "updated_at", "_highwater_window"],
        "the source's columns, then each row's window (issue 46): {schema:?}"
    );
    let windows: BTreeSet<&str> = t["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["_highwater_window"].as_str().unwrap())
        .collect();
    assert_eq!(windows.len(), 24, "one stamp per window: {windows:?}");
    assert!(
        schema[0].contains("int64") || schema[0].contains("long"),
        "{schema:?}"
    );
    let commits = log(&p.path("lake/orders"));
    assert_eq!(commits.len(), 24);
    let mut windows = BTreeSet::new();
    for (v, commit) in commits.iter().enumerate() {
        let txn = actions(commit, "txn");
        assert_eq!(txn.len(), 1, "commit {v}");
        assert_eq!(txn[0]["appId"], "orders");
        let info = actions(commit, "commitInfo")[0];
        let hw = &info["highwater"];
        assert_eq!(txn[0]["version"], hw["window_index"], "commit {v}");
        assert!(hw["recipe"].as_str().unwrap().starts_with("r1:"));
        windows.insert(hw["window"]["start"].as_str().unwrap().to_string());
        let adds = actions(commit, "add");
        assert!(!adds.is_empty() && adds.iter().all(|a| a["dataChange"] == true));
        assert!(actions(commit, "remove").is_empty());
        assert_eq!(actions(commit, "metaData").len(), usize::from(v == 0));
    }
    assert_eq!(windows.len(), 24);
    // Checkpoints every 10 commits; the reader above started from the
    // newest (version 20) and replayed 21 to 23.
    let last: Value =
        serde_json::from_str(&p.read("lake/orders/_delta_log/_last_checkpoint")).unwrap();
    assert_eq!(last["version"], 20, "{last}");
    for v in [10, 20] {
        assert!(p.exists(&format!(
            "lake/orders/_delta_log/{v:020}.checkpoint.parquet"
        )));
    }
    // A second run owes nothing and commits nothing.
    let r = ingest(&p, &[], &[], 0);
    assert_eq!(published(&r), 0, "{r}");
    assert_eq!(log(&p.path("lake/orders")).len(), 24);
}

/// Issue 21: the same into a bucket (`NAME:path` on `[storage.NAME]`),
/// read back through S3 by the deltalake reader.
#[test]
fn delta_table_in_a_bucket_24_windows_each_row_once() {
    let moto = Moto::start();
    let objects = moto.client("lakehouse");
    let storage = "[storage.lake]\nkind = \"s3\"\nbucket = \"lakehouse\"\nendpoint_env = \"S3_ENDPOINT\"\nregion = \"us-east-1\"\n";
    let p = Project::new(&format!("{storage}{}", config("lake:tables/orders", "")));
    let c = db(&p);
    fill(&c, 24, 10, "first");
    let env: Vec<(&str, String)> = moto.env();
    let r = ingest(&p, &env, &[], 0);
    assert_eq!(published(&r), 24, "{r}");
    let opts = serde_json::json!({
        "AWS_ENDPOINT_URL": moto.endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    });
    let t = read("s3://lakehouse/tables/orders", &opts);
    assert_eq!(ids(&t), (0..240).collect::<Vec<_>>());
    assert_eq!(t["version"], 23);
    let keys: Vec<String> = objects
        .list("tables/orders/_delta_log/")
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .filter(|k| k.ends_with(".json"))
        .collect();
    assert_eq!(keys.len(), 24, "{keys:?}");
    // Re-landing a window in the bucket: one more commit, the new values once.
    c.execute("UPDATE orders SET note = 'second' WHERE id < 10", [])
        .unwrap();
    let r = ingest(
        &p,
        &env,
        &["--window", "2026-03-01T08:00:00Z/2026-03-01T09:00:00Z"],
        0,
    );
    assert_eq!(published(&r), 1, "{r}");
    let t = read("s3://lakehouse/tables/orders", &opts);
    assert_eq!(ids(&t), (0..240).collect::<Vec<_>>());
    let second = t["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["note"] == "second")
        .count();
    assert_eq!(second, 10);
}

/// Issue 21: a re-landed window: its commit removes the files of its
/// previous version (dataChange = true) and adds the new ones; the reader
/// sees the new values once. The removed files stay until
/// version_retention_s has passed; then the vacuum deletes them.
#[test]
fn delta_relanded_window_removes_its_old_files_and_vacuum_deletes_them_later() {
    let check = |retention_s: u64, old_files_stay: bool| {
        let p = Project::new(&config(
            "lake/orders",
            &format!("version_retention_s = {retention_s}"),
        ));
        let c = db(&p);
        fill(&c, 3, 10, "first");
        ingest(&p, &[], &["--to", "2026-03-01T11:00:00Z"], 0);
        c.execute("UPDATE orders SET note = 'second' WHERE id < 10", [])
            .unwrap();
        c.execute("DELETE FROM orders WHERE id = 9", []).unwrap();
        let r = ingest(
            &p,
            &[],
            &["--window", "2026-03-01T08:00:00Z/2026-03-01T09:00:00Z"],
            0,
        );
        assert_eq!(published(&r), 1, "{r}");
        let table = p.path("lake/orders");
        let commits = log(&table);
        assert_eq!(commits.len(), 4);
        let first_adds: BTreeSet<String> = actions(&commits[0], "add")
            .iter()
            .map(|a| a["path"].as_str().unwrap().to_string())
            .collect();
        let last = &commits[3];
        let removed: BTreeSet<String> = actions(last, "remove")
            .iter()
            .map(|a| a["path"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(removed, first_adds);
        assert!(actions(last, "remove")
            .iter()
            .all(|a| a["dataChange"] == true));
        let t = read(table.to_str().unwrap(), &Value::Null);
        let got: Vec<(i64, String)> = t["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["id"].as_i64().unwrap(),
                    r["note"].as_str().unwrap().into(),
                )
            })
            .collect();
        let mut want: Vec<(i64, String)> = (0..9).map(|i| (i, "second".into())).collect();
        want.extend((10..30).map(|i| (i, "first".to_string())));
        assert_eq!(got, want);
        for f in &first_adds {
            assert_eq!(table.join(f).exists(), old_files_stay, "{f}");
        }
    };
    // Kept for an hour (a reader may still read version 2) ...
    check(3600, true);
    // ... and with no retention, gone at the end of the run that removed them.
    check(0, false);
}

/// Issue 21: killed just before the commit's put (files placed, no
/// commit) and just after it (committed, not recorded): the next run ends
/// with each window committed exactly once, and no commit that no window
/// record accounts for.
#[test]
fn delta_kill_before_and_after_the_commit_put_each_window_once() {
    for point in ["before-commit-put", "after-swap"] {
        let p = Project::new(&config("lake/orders", ""));
        let c = db(&p);
        fill(&c, 3, 10, "first");
        let o = p
            .cmd(&[
                "ingest",
                "orders",
                "--json",
                "--now",
                "2026-03-01T11:05:00Z",
            ])
            .env("HIGHWATER_FAILPOINT", point)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), None, "{point}: killed by its failpoint");
        let table = p.path("lake/orders");
        let before = log(&table).len();
        assert_eq!(before, usize::from(point == "after-swap"), "{point}");
        let r = ingest_at(&p, "2026-03-01T11:05:00Z", &[], &[], 0);
        let commits = log(&table);
        let mut per_window: BTreeMap<String, usize> = BTreeMap::new();
        for commit in &commits {
            let hw = &actions(commit, "commitInfo")[0]["highwater"];
            *per_window
                .entry(hw["window"]["start"].as_str().unwrap().to_string())
                .or_default() += 1;
        }
        assert_eq!(per_window.len(), 3, "{point}: {per_window:?}");
        assert!(
            per_window.values().all(|n| *n == 1),
            "{point}: {per_window:?}"
        );
        // The window committed before the kill was recovered, not re-landed.
        assert_eq!(published(&r), 3 - before, "{point}: {r}");
        let t = read(table.to_str().unwrap(), &Value::Null);
        assert_eq!(ids(&t), (0..30).collect::<Vec<_>>(), "{point}");
        // Every commit's token is the one its window's record holds.
        let export = p.check(&["state", "export"], 0).json();
        let text = export.to_string();
        for commit in &commits {
            let token = actions(commit, "commitInfo")[0]["highwater"]["token"]
                .as_str()
                .unwrap()
                .to_string();
            assert!(
                text.contains(&token),
                "{point}: commit of token {token} has no record"
            );
        }
        let grid = p
            .check(
                &[
                    "windows",
                    "orders",
                    "--now",
                    "2026-03-01T11:05:00Z",
                    "--json",
                ],
                0,
            )
            .json();
        let published_rows: i64 = grid["windows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["status"] == "published")
            .map(|r| r["rows"].as_i64().unwrap())
            .sum();
        assert_eq!(published_rows, 30, "{point}");
        // The files the killed run placed and never committed stay (another
        // writer's could look the same) until they are a day old; then the
        // next run's vacuum deletes them.
        let named: BTreeSet<String> = commits
            .iter()
            .flat_map(|c| actions(c, "add"))
            .map(|a| a["path"].as_str().unwrap().to_string())
            .collect();
        let on_disk: Vec<String> = common::tree(&table.join("data"))
            .into_keys()
            .map(|k| format!("data/{k}"))
            .collect();
        let orphans: Vec<&String> = on_disk.iter().filter(|f| !named.contains(*f)).collect();
        assert_eq!(
            orphans.is_empty(),
            point == "after-swap",
            "{point}: {on_disk:?}"
        );
        for f in &orphans {
            common::age(&table.join(f), 2 * 86_400);
        }
        ingest_at(&p, "2026-03-01T11:05:00Z", &[], &[], 0);
        for f in &orphans {
            assert!(!table.join(f).exists(), "{point}: {f} was vacuumed");
        }
        for f in &named {
            assert!(table.join(f).exists(), "{point}: {f} is the table's");
        }
    }
}

/// Issue 21: the schema rule. A column added at the source evolves the
/// table with a metaData commit (older rows read it as null); a type that
/// changes (double → long) is refused with exit 2 before anything is
/// committed, naming the column and both types.
#[test]
fn delta_schema_added_column_evolves_and_a_changed_type_is_refused() {
    let p = Project::new(&config("lake/orders", ""));
    let c = db(&p);
    fill(&c, 2, 10, "first");
    ingest_at(&p, "2026-03-01T10:05:00Z", &[], &[], 0);
    c.execute_batch("ALTER TABLE orders ADD COLUMN channel TEXT; UPDATE orders SET channel = 'web' WHERE id >= 20;")
        .unwrap();
    // Hour 10:00's rows, with the new column.
    for i in 20..30 {
        c.execute(
            "INSERT OR REPLACE INTO orders VALUES(?1, 1.0, 'first', ?2, 'web')",
            rusqlite::params![i, format!("2026-03-01T10:{:02}:00Z", (i - 20) * 6)],
        )
        .unwrap();
    }
    let r = ingest_at(&p, "2026-03-01T11:05:00Z", &[], &[], 0);
    assert_eq!(published(&r), 1, "{r}");
    let table = p.path("lake/orders");
    let commits = log(&table);
    assert_eq!(commits.len(), 3);
    let md = actions(&commits[2], "metaData");
    assert_eq!(md.len(), 1, "the added column is a metaData action");
    assert!(md[0]["schemaString"].as_str().unwrap().contains("channel"));
    let t = read(table.to_str().unwrap(), &Value::Null);
    let channels: Vec<Value> = t["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["channel"].clone())
        .collect();
    assert_eq!(channels.len(), 30);
    assert!(channels[..20].iter().all(Value::is_null), "{channels:?}");
    assert!(channels[20..].iter().all(|c| c == "web"), "{channels:?}");
    // amount becomes an INTEGER column: refused, nothing committed.
    c.execute_batch(
        "CREATE TABLE o2(id INTEGER PRIMARY KEY, amount INTEGER, note TEXT, updated_at TEXT NOT NULL, channel TEXT);
         INSERT INTO o2 SELECT id, CAST(amount AS INTEGER), note, updated_at, channel FROM orders;
         DROP TABLE orders; ALTER TABLE o2 RENAME TO orders;",
    )
    .unwrap();
    let before = std::fs::read_dir(table.join("_delta_log")).unwrap().count();
    let o = p
        .cmd(&[
            "ingest",
            "orders",
            "--json",
            "--now",
            "2026-03-01T12:05:00Z",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("`amount`") && stderr.contains("double") && stderr.contains("long"),
        "{stderr}"
    );
    assert!(stderr.contains("Nothing was committed"), "{stderr}");
    assert_eq!(
        std::fs::read_dir(table.join("_delta_log")).unwrap().count(),
        before
    );
    assert_eq!(log(&table).len(), 3);
}

/// Issue 21: two processes on PostgreSQL state landing windows of one
/// source into one table: their commits never collide (each version is
/// put once), and the table holds every row once, each window's commit
/// once.
#[test]
fn delta_two_processes_on_postgres_state_keep_the_table_consistent() {
    let _pg = pg_serial();
    let (_db, url) = pg_database("delta2");
    let p = Project::new(&format!(
        "[state]\nurl_env = \"HIGHWATER_STATE_URL\"\n{}",
        config("lake/orders", "")
    ));
    let c = db(&p);
    fill(&c, 24, 50, "first");
    let spawn = || {
        p.cmd(&["ingest", "orders", "--json", "--now", NOW, "--wait"])
            .env("HIGHWATER_STATE_URL", &url)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let mut total = 0;
    for child in [a, b] {
        let o = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{stderr}");
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        total += published(&r);
    }
    let table = p.path("lake/orders");
    let commits = log(&table);
    let starts: Vec<String> = commits
        .iter()
        .map(|c| {
            actions(c, "commitInfo")[0]["highwater"]["window"]["start"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let distinct: BTreeSet<&String> = starts.iter().collect();
    assert_eq!(distinct.len(), 24, "{starts:?}");
    assert_eq!(commits.len(), total, "one commit per window published");
    let t = read(table.to_str().unwrap(), &Value::Null);
    assert_eq!(ids(&t), (0..24 * 50).collect::<Vec<_>>());
}

/// Issue 21: `adjacent_duplicates` reads the previous window's files from
/// its newest commit's folder: with a lookback, the keys read twice near
/// the boundary are reported.
#[test]
fn delta_adjacent_duplicates_read_the_previous_commit() {
    let cfg = format!(
        "{}adjacent_duplicates = \"warn\"\n",
        config("lake/orders", "").replace("settle = \"2m\"", "settle = \"2m\"\nlookback = \"10m\"")
    );
    let p = Project::new(&cfg);
    let c = db(&p);
    fill(&c, 2, 10, "first");
    let r = ingest_at(&p, "2026-03-01T10:05:00Z", &[], &[], 0);
    assert_eq!(published(&r), 2, "{r}");
    let warned = r["windows"][1]["warnings"].to_string();
    // Id 9 (08:54) is within the 09:00 window's 10-minute lookback; id 8
    // (08:48) is not.
    assert!(
        warned.contains("1 keys of window") && warned.contains("adjacent_duplicates"),
        "{r}"
    );
}

/// Issue 21: the type mapping into Delta, from PostgreSQL, as the
/// deltalake reader sees it: timestamptz and timestamp both as
/// `timestamp` (µs, UTC), the rest in Delta's names; `numeric(p, s)` as
/// `decimal(p,s)` (issue 46), a `numeric` without a precision as its exact
/// text; values as written.
#[test]
fn delta_types_from_postgres_as_the_reader_sees_them() {
    let _pg = pg_serial();
    let (mut db, url) = pg_database("deltatypes");
    db.batch_execute(
        "CREATE TABLE orders(id int8 PRIMARY KEY, small int2, mid int4, ratio real, amount numeric(12, 3),
                             plain numeric, flagged bool, blob bytea, day date, naive timestamp,
                             updated_at timestamptz NOT NULL);
         INSERT INTO orders VALUES
           (1, 7, 70000, 0.5, -12.345, 123456789012345678901234567890.5, true, '\\x0102', '2026-03-01', '2026-03-01 00:10:00.123456', '2026-03-01T00:10:00.123456Z'),
           (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '2026-03-01T00:20:00Z');",
    )
    .unwrap();
    // Loaded into a warehouse table too (the same database): the decimal
    // goes back into PostgreSQL as numeric(12,3), in binary.
    let cfg = format!(
        "{}[sources.orders.load]\nkind = \"postgres\"\nurl_env = \"ORDERS_DATABASE_URL\"\ntable = \"wh.orders\"\n",
        common::ingest::pg_source("updated_at", "1m").replace(
            "output = \"raw/orders/ingest_date={date}/ingest_hour={hour}\"",
            "output = \"lake/orders\"\nformat = \"delta\"",
        )
    );
    let p = Project::new(&cfg);
    let ingest_pg = |extra: &[&str]| {
        let mut args = vec![
            "ingest",
            "orders",
            "--json",
            "--now",
            "2026-03-01T01:05:00Z",
        ];
        args.extend_from_slice(extra);
        let o = p
            .cmd(&args)
            .env("ORDERS_DATABASE_URL", &url)
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    ingest_pg(&[]);
    let t = read(p.path("lake/orders").to_str().unwrap(), &Value::Null);
    let schema: Vec<(String, String)> = t["schema"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f[0].as_str().unwrap().into(), f[1].as_str().unwrap().into()))
        .collect();
    let text = format!("{schema:?}");
    for (col, ty) in [
        ("id", "long"),
        ("small", "short"),
        ("mid", "integer"),
        ("ratio", "float"),
        ("amount", "decimal(12,3)"),
        ("plain", "string"),
        ("flagged", "boolean"),
        ("blob", "binary"),
        ("day", "date"),
        ("naive", "timestamp"),
        ("updated_at", "timestamp"),
    ] {
        let got = &schema.iter().find(|(n, _)| n == col).unwrap().1;
        assert!(got.contains(ty), "{col}: {got} ({text})");
        if col == "naive" {
            assert!(!got.contains("ntz"), "{col}: {got}");
        }
    }
    let rows = t["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["amount"], "-12.345");
    assert_eq!(rows[0]["plain"], "123456789012345678901234567890.5");
    assert_eq!(rows[0]["small"], 7);
    assert!(
        rows[0]["updated_at"]
            .as_str()
            .unwrap()
            .starts_with("2026-03-01 00:10:00.123456"),
        "{}",
        rows[0]
    );
    assert!(
        rows[0]["naive"]
            .as_str()
            .unwrap()
            .starts_with("2026-03-01 00:10:00.123456"),
        "{}",
        rows[0]
    );
    assert!(rows[1]["small"].is_null() && rows[1]["naive"].is_null());
    let wh = db
        .query(
            "SELECT amount::text, pg_typeof(amount)::text, format_type(a.atttypid, a.atttypmod)
             FROM wh.orders, pg_attribute a
             WHERE a.attrelid = 'wh.orders'::regclass AND a.attname = 'amount' ORDER BY id",
            &[],
        )
        .unwrap();
    let got: Vec<(Option<String>, String)> = wh.iter().map(|r| (r.get(0), r.get(2))).collect();
    assert_eq!(
        got,
        [
            (Some("-12.345".to_string()), "numeric(12,3)".to_string()),
            (None, "numeric(12,3)".to_string())
        ]
    );
    // Values across the binary numeric's digit groups, back as written.
    for v in [
        "0.001",
        "-0.010",
        "999999999.999",
        "10000.000",
        "1.000",
        "0.000",
    ] {
        db.execute(
            "UPDATE orders SET amount = $1::text::numeric WHERE id = 1",
            &[&v],
        )
        .unwrap();
        ingest_pg(&["--window", "2026-03-01T00:00:00Z/2026-03-01T01:00:00Z"]);
        let back: String = db
            .query_one("SELECT amount::text FROM wh.orders WHERE id = 1", &[])
            .unwrap()
            .get(0);
        assert_eq!(back, v);
    }
}

/// Issue 21: what `format = "delta"` refuses at config load (exit 2,
/// nothing touched): a templated output (the table is one root).
#[test]
fn delta_config_refusals_name_the_setting() {
    let check = |cfg: String, says: &[&str]| {
        let p = Project::new(&cfg);
        db(&p);
        let r = p.hw(&["ingest", "orders", "--json", "--now", NOW]);
        assert_eq!(r.code, 2, "{}", r.stderr);
        for s in says {
            assert!(r.stderr.contains(s), "wanted {s:?} in {}", r.stderr);
        }
        assert!(!p.exists("lake"), "nothing touched");
    };
    check(
        config("lake/orders/{date}", ""),
        &[
            "lake/orders/{date}",
            "table's root",
            "remove the placeholders",
        ],
    );
    // Compaction in a bucket is for Delta tables only: Parquet folder
    // versions there are refused, naming the way out.
    check(
        config("lake:tables/orders", "").replace("format = \"delta\"\n", "")
            + "[sources.orders.compact]\ninto = \"1d\"\n",
        &[
            "`lake:tables/orders`",
            "compaction of Parquet folder versions",
            "format = \"delta\"",
        ],
    );
}

/// `highwater compact orders` at `now`, with its exit code and JSON.
/// The (row id, window stamp) pairs a read of the table holds, each
/// asserted to occur once (`what` names the case in the message).
fn row_windows(t: &Value, what: &str) -> BTreeSet<(i64, String)> {
    let mut seen = BTreeSet::new();
    for r in t["rows"].as_array().unwrap() {
        let key = (
            r["id"].as_i64().unwrap(),
            r["_highwater_window"].as_str().unwrap().to_string(),
        );
        assert!(seen.insert(key.clone()), "{what}: twice: {key:?}");
    }
    seen
}

/// Every commit of the table's log: version and actions.
fn log_versions(p: &Project) -> Vec<(u64, Vec<Value>)> {
    let dir = p.path("lake/orders/_delta_log");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(v) = name.strip_suffix(".json").and_then(|v| v.parse().ok()) else {
            continue;
        };
        let text = std::fs::read_to_string(e.path()).unwrap();
        let actions = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        out.push((v, actions));
    }
    out.sort_by_key(|(v, _)| *v);
    out
}

fn compact_at(p: &Project, now: &str, code: i32) -> Value {
    let r = p.hw(&["compact", "orders", "--json", "--now", now]);
    assert_eq!(r.code, code, "{}\n{}", r.stderr, r.stdout);
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", r.stderr))
}

/// Issue 21: compaction of a Delta table is one commit of `remove` and
/// `add` actions, all `dataChange = false`: fewer files, the same rows
/// (the deltalake reader sees each once). A re-land of a window inside
/// the compacted period rewrites the period's file without the window's
/// rows in the same commit (issue 46); a window outside it re-lands; a
/// period inside the source's re-land horizon (settle + lookback) is not
/// compacted. Cases in, outcomes out.
#[test]
fn delta_compaction_is_one_layout_only_commit_and_relands_stay_correct() {
    let check = |lookback: &str, compacted: bool| {
        let cfg = format!(
            "{}[sources.orders.compact]\ninto = \"1d\"\n",
            // No retention: the files the compaction removed go at the
            // end of the next run that lands a window.
            config("lake/orders", "version_retention_s = 0")
                .replace("settle = \"2m\"", &format!("settle = \"2m\"\n{lookback}"))
        );
        let p = Project::new(&cfg);
        let c = db(&p);
        // 26 hourly windows: one whole day (period 0: 08:00 to 08:00,
        // the grid's start) and two windows of the next.
        fill(&c, 26, 10, "first");
        let r = ingest_at(&p, "2026-03-02T10:05:00Z", &[], &[], 0);
        assert_eq!(published(&r), 26, "{r}");
        let table = p.path("lake/orders");
        let before = log(&table);
        assert_eq!(before.len(), 26);
        let t0 = read(table.to_str().unwrap(), &Value::Null);
        let r = compact_at(&p, "2026-03-02T10:05:00Z", if compacted { 0 } else { 1 });
        let periods = r["periods"].as_array().unwrap();
        assert_eq!(periods.len(), 1, "only the whole closed day: {r}");
        let t = read(table.to_str().unwrap(), &Value::Null);
        // The same rows (with a lookback, rows near a window's start are
        // landed by both windows, as the source asks).
        assert_eq!(ids(&t), ids(&t0));
        let commits = log(&table);
        if !compacted {
            assert_eq!(periods[0]["status"], "skipped", "{r}");
            assert!(
                periods[0]["reason"]
                    .as_str()
                    .unwrap()
                    .contains("re-land horizon"),
                "{r}"
            );
            assert_eq!(commits.len(), 26, "nothing committed");
            return;
        }
        assert_eq!(periods[0]["status"], "compacted", "{r}");
        assert_eq!(ids(&t), (0..260).collect::<Vec<_>>(), "each row once");
        assert_eq!(t["rows"], t0["rows"]);
        assert_eq!(t["polars_rows"], 260);
        assert_eq!(periods[0]["rows"], 240, "{r}");
        assert_eq!(periods[0]["files_before"], 24, "{r}");
        assert_eq!(periods[0]["files_after"], 1, "{r}");
        assert_eq!(t["files"].as_array().unwrap().len(), 3, "{t}");
        assert_eq!(commits.len(), 27, "one commit");
        let last = &commits[26];
        assert_eq!(
            actions(last, "commitInfo")[0]["operation"],
            "OPTIMIZE",
            "{last:?}"
        );
        let removed: BTreeSet<String> = actions(last, "remove")
            .iter()
            .map(|a| a["path"].as_str().unwrap().to_string())
            .collect();
        let day_adds: BTreeSet<String> = before[..24]
            .iter()
            .flat_map(|c| actions(c, "add"))
            .map(|a| a["path"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(removed, day_adds, "the day's files, and only them");
        assert_eq!(actions(last, "add").len(), 1);
        for kind in ["add", "remove"] {
            for a in actions(last, kind) {
                assert_eq!(a["dataChange"], false, "{kind}: {a}");
            }
        }
        // Again: already compacted, nothing committed.
        let r = compact_at(&p, "2026-03-02T10:05:00Z", 0);
        assert_eq!(r["periods"][0]["status"], "already", "{r}");
        assert_eq!(log(&table).len(), 27);
        // A re-land of a window inside the compacted period (issue 46: no
        // dead end): the period's file is rewritten without the window's
        // rows (copy on write) in the window's own commit, and every row
        // reads once, the window's as the source has them now.
        c.execute("UPDATE orders SET note = 'second' WHERE id < 10", [])
            .unwrap();
        let r = ingest_at(
            &p,
            "2026-03-02T10:05:00Z",
            &[],
            &["--window", "2026-03-01T08:00:00Z/2026-03-01T09:00:00Z"],
            0,
        );
        assert_eq!(published(&r), 1, "{r}");
        let relanded = log(&table);
        assert_eq!(relanded.len(), 28, "one commit");
        let last = &relanded[27];
        let period_file = actions(&commits[26], "add")[0]["path"]
            .as_str()
            .unwrap()
            .to_string();
        let removed: Vec<&str> = actions(last, "remove")
            .iter()
            .map(|a| a["path"].as_str().unwrap())
            .collect();
        assert_eq!(removed, [period_file.as_str()], "{last:?}");
        assert!(actions(last, "remove")
            .iter()
            .all(|a| a["dataChange"] == true));
        let rewritten: Vec<&Value> = actions(last, "add")
            .into_iter()
            .filter(|a| a["tags"]["highwater.rewritten_from"] == period_file.as_str())
            .collect();
        assert_eq!(rewritten.len(), 1, "{last:?}");
        let stats: Value = serde_json::from_str(rewritten[0]["stats"].as_str().unwrap()).unwrap();
        assert_eq!(
            stats["numRecords"], 230,
            "the period's other 23 windows: {stats}"
        );
        let t = read(table.to_str().unwrap(), &Value::Null);
        assert_eq!(ids(&t), (0..260).collect::<Vec<_>>(), "each row once");
        let second: Vec<i64> = t["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["note"] == "second")
            .map(|r| r["id"].as_i64().unwrap())
            .collect();
        assert_eq!(second, (0..10).collect::<Vec<_>>());
        // A window outside the compacted period re-lands as before.
        c.execute("UPDATE orders SET note = 'second' WHERE id = 250", [])
            .unwrap();
        let r = ingest_at(
            &p,
            "2026-03-02T10:05:00Z",
            &[],
            &["--window", "2026-03-02T09:00:00Z/2026-03-02T10:00:00Z"],
            0,
        );
        assert_eq!(published(&r), 1, "{r}");
        let t = read(table.to_str().unwrap(), &Value::Null);
        assert_eq!(ids(&t), (0..260).collect::<Vec<_>>(), "each row once");
        let second: Vec<i64> = t["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["note"] == "second")
            .map(|r| r["id"].as_i64().unwrap())
            .collect();
        assert_eq!(second, (0..10).chain([250]).collect::<Vec<_>>());
        for f in &day_adds {
            assert!(!table.join(f).exists(), "vacuumed: {f}");
        }
    };
    check("", true);
    check("lookback = \"3h\"", false);
}

/// The commits of a table in a bucket, each as its actions.
fn bucket_log(o: &highwater_objects::Objects, prefix: &str) -> Vec<Vec<Value>> {
    let mut out = Vec::new();
    for v in 0.. {
        let Some((b, _)) = o.get(&format!("{prefix}/_delta_log/{v:020}.json")).unwrap() else {
            break;
        };
        out.push(
            String::from_utf8(b.to_vec())
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect(),
        );
    }
    out
}

/// Issue 21: `highwater compact` on a Delta table in a bucket (moto on
/// loopback): the period's window files read back from the bucket, the
/// period written and uploaded, ONE put-if-absent commit of remove + add,
/// every action dataChange = false; the deltalake reader sees each row
/// once in fewer files, and highwater's scratch folder is gone after. A
/// run killed before its commit put changes nothing readers see.
#[test]
fn delta_compaction_in_a_bucket_is_one_layout_only_commit() {
    let moto = Moto::start();
    let objects = moto.client("lakehouse");
    let storage = "[storage.lake]\nkind = \"s3\"\nbucket = \"lakehouse\"\nendpoint_env = \"S3_ENDPOINT\"\nregion = \"us-east-1\"\n";
    let p = Project::new(&format!(
        "{storage}{}[sources.orders.compact]\ninto = \"1d\"\n",
        config("lake:tables/orders", "")
    ));
    let c = db(&p);
    fill(&c, 26, 10, "first");
    let env: Vec<(&str, String)> = moto.env();
    let r = ingest_at(&p, "2026-03-02T10:05:00Z", &env, &[], 0);
    assert_eq!(published(&r), 26, "{r}");
    let opts = serde_json::json!({
        "AWS_ENDPOINT_URL": moto.endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    });
    let uri = "s3://lakehouse/tables/orders";
    let t0 = read(uri, &opts);
    assert_eq!(t0["files"].as_array().unwrap().len(), 26, "{t0}");
    let before = bucket_log(&objects, "tables/orders");
    assert_eq!(before.len(), 26);
    let run = |failpoint: Option<&str>| -> std::process::Output {
        let mut cmd = p.cmd(&[
            "compact",
            "orders",
            "--json",
            "--now",
            "2026-03-02T10:05:00Z",
        ]);
        for (k, v) in &env {
            cmd.env(k, v);
        }
        if let Some(f) = failpoint {
            cmd.env("HIGHWATER_FAILPOINT", f);
        }
        cmd.output().unwrap()
    };
    let compact = |code: i32| -> Value {
        let o = run(None);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{stderr}");
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"))
    };
    // Killed (SIGKILL) with the period's files uploaded, before the commit
    // put: nothing committed, the rows as they were; its scratch folder
    // stays until the next compaction sweeps it.
    let killed = run(Some("delta-compact-before-commit-put"));
    assert_eq!(killed.status.code(), None, "killed by the failpoint");
    assert_eq!(bucket_log(&objects, "tables/orders").len(), 26);
    let t = read(uri, &opts);
    assert_eq!(t["rows"], t0["rows"]);
    assert_eq!(t["files"].as_array().unwrap().len(), 26, "{t}");
    let scratch = p.path(".highwater/objects-staging/orders");
    let compact_scratch = || -> Vec<String> {
        std::fs::read_dir(&scratch)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("compact-"))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        compact_scratch().len(),
        1,
        "the killed run's scratch folder"
    );
    let r = compact(0);
    let periods = r["periods"].as_array().unwrap();
    assert_eq!(periods.len(), 1, "{r}");
    assert_eq!(periods[0]["status"], "compacted", "{r}");
    assert_eq!(periods[0]["rows"], 240, "{r}");
    assert_eq!(periods[0]["files_before"], 24, "{r}");
    assert_eq!(periods[0]["files_after"], 1, "{r}");
    let t = read(uri, &opts);
    assert_eq!(ids(&t), (0..260).collect::<Vec<_>>(), "each row once");
    assert_eq!(t["rows"], t0["rows"]);
    assert_eq!(t["polars_rows"], 260);
    assert_eq!(t["files"].as_array().unwrap().len(), 3, "fewer files: {t}");
    let commits = bucket_log(&objects, "tables/orders");
    assert_eq!(commits.len(), 27, "one commit");
    let last = &commits[26];
    assert_eq!(actions(last, "commitInfo")[0]["operation"], "OPTIMIZE");
    let removed: BTreeSet<String> = actions(last, "remove")
        .iter()
        .map(|a| a["path"].as_str().unwrap().to_string())
        .collect();
    let day_adds: BTreeSet<String> = before[..24]
        .iter()
        .flat_map(|c| actions(c, "add"))
        .map(|a| a["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(removed, day_adds, "the day's files, and only them");
    let adds = actions(last, "add");
    assert_eq!(adds.len(), 1);
    for kind in ["add", "remove"] {
        for a in actions(last, kind) {
            assert_eq!(a["dataChange"], false, "{kind}: {a}");
        }
    }
    // The period's file is in the bucket where the commit names it.
    let added = adds[0]["path"].as_str().unwrap();
    assert!(
        objects
            .get(&format!("tables/orders/{added}"))
            .unwrap()
            .is_some(),
        "{added}"
    );
    // The scratch folders the windows were read back into are gone: this
    // run's, and the killed run's (swept).
    let left = compact_scratch();
    assert!(left.is_empty(), "{left:?}");
    // Again: already compacted, nothing committed.
    let r = compact(0);
    assert_eq!(r["periods"][0]["status"], "already", "{r}");
    assert_eq!(bucket_log(&objects, "tables/orders").len(), 27);
}

/// Issue 46, item 9: SQLite reports no declared type for an expression in
/// a source's `query`. Its type comes from its values: `amount * 2` lands
/// as a double (the reader sees numbers, not strings), a count as a long;
/// an expression whose values mix text and numbers is refused (exit 2)
/// naming the column and the CAST to write, with nothing committed.
#[test]
fn delta_sqlite_expressions_land_with_their_values_type() {
    let query = "query = \"SELECT id, amount * 2 AS amount, length(note) AS n, note, updated_at FROM orders\"";
    let cfg = config("lake/orders", "").replace("table = \"orders\"", query);
    assert!(cfg.contains(query), "{cfg}");
    let p = Project::new(&cfg);
    let c = db(&p);
    fill(&c, 2, 5, "first");
    let r = ingest(&p, &[], &[], 0);
    assert_eq!(published(&r), 24, "{r}");
    let t = read(p.path("lake/orders").to_str().unwrap(), &Value::Null);
    let types: BTreeMap<String, String> = t["schema"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f[0].as_str().unwrap().to_string(),
                f[1].as_str().unwrap().to_lowercase(),
            )
        })
        .collect();
    assert!(types["amount"].contains("double"), "{types:?}");
    assert!(types["n"].contains("long"), "{types:?}");
    assert!(types["note"].contains("string"), "{types:?}");
    assert_eq!(t["rows"][1]["amount"], 3.0, "{}", t["rows"]);
    // Text beside numbers in one expression: refused before any window.
    let mixed = "query = \"SELECT id, CASE WHEN id % 2 = 0 THEN amount ELSE note END AS amount, note, updated_at FROM orders\"";
    let p = Project::new(&config("lake/orders", "").replace("table = \"orders\"", mixed));
    let c = db(&p);
    fill(&c, 2, 5, "first");
    let r = p.hw(&["ingest", "orders", "--json", "--now", NOW]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    for s in ["column `amount`", "no declared type", "CAST("] {
        assert!(r.stderr.contains(s), "wanted {s:?} in {}", r.stderr);
    }
    assert!(!p.exists("lake/orders/_delta_log"), "nothing committed");
}

/// Issue 46, item 6 (no dead end): after `highwater compact`, a recipe
/// change (a lookback from none to 10m) shows the compacted windows stale;
/// without --force the stale-window guard refuses (exit 2, nothing
/// touched), and with --force the period re-lands as one commit: the
/// compacted file removed whole (no copy on write once per window), every
/// window of the period added in the same commit; each row once, a window
/// after the period lands as usual, and `windows` shows every window
/// published under the new recipe.
#[test]
fn delta_recipe_change_after_compaction_relands_through_the_period() {
    let cfg = format!(
        "{}[sources.orders.compact]\ninto = \"1d\"\n",
        config("lake/orders", "")
    );
    let p = Project::new(&cfg);
    let c = db(&p);
    fill(&c, 26, 10, "first");
    let now = "2026-03-02T10:05:00Z";
    let r = ingest_at(&p, now, &[], &[], 0);
    assert_eq!(published(&r), 26, "{r}");
    let r = compact_at(&p, now, 0);
    assert_eq!(r["periods"][0]["status"], "compacted", "{r}");
    let period_windows = r["periods"][0]["windows"].as_u64().unwrap() as usize;
    let before = log_versions(&p);
    // The new recipe.
    p.write(
        "highwater.toml",
        &cfg.replace("settle = \"2m\"", "settle = \"2m\"\nlookback = \"10m\""),
    );
    let r = p.hw(&["ingest", "orders", "--json", "--now", now]);
    assert_eq!(r.code, 2, "the guard: {}", r.stderr);
    assert!(r.stderr.contains("--force"), "{}", r.stderr);
    fill(&c, 27, 10, "first");
    let r = ingest_at(&p, "2026-03-02T11:05:00Z", &[], &["--force"], 0);
    assert_eq!(published(&r), 27, "26 re-landed and one new: {r}");
    // The period's windows in one commit, its compacted file removed whole.
    let new: Vec<Vec<Value>> = log_versions(&p)
        .into_iter()
        .filter(|(v, _)| *v > before.last().unwrap().0)
        .map(|(_, actions)| actions)
        .collect();
    let group: Vec<&Vec<Value>> = new
        .iter()
        .filter(|c| c[0]["commitInfo"]["highwater"]["group"].is_array())
        .collect();
    assert_eq!(group.len(), 1, "one commit for the period: {new:?}");
    let g = group[0];
    let ws = g[0]["commitInfo"]["highwater"]["group"].as_array().unwrap();
    assert_eq!(ws.len(), period_windows, "every window of the period");
    let removed: Vec<&str> = g
        .iter()
        .filter_map(|a| a["remove"]["path"].as_str())
        .collect();
    assert!(
        removed.iter().any(|p| p.contains("/P")),
        "the compacted file removed: {removed:?}"
    );
    assert!(
        !g.iter()
            .any(|a| !a["add"]["tags"]["highwater.rewritten_from"].is_null()),
        "no copy on write when the whole period re-lands"
    );
    assert_eq!(
        new.len(),
        1 + (27 - period_windows),
        "the windows after the period commit alone"
    );
    let w = p.hw(&[
        "windows",
        "orders",
        "--json",
        "--now",
        "2026-03-02T11:05:00Z",
    ]);
    assert_eq!(w.code, 0, "{}", w.stderr);
    let grid: Value = serde_json::from_str(&w.stdout).unwrap();
    let stale = grid["windows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["status"] == "stale" || r["status"] == "failed")
        .count();
    assert_eq!(stale, 0, "windows tells the truth: {grid}");
    let shown = grid["windows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["status"] == "published")
        .count();
    assert!(shown >= 27, "every window published: {grid}");
    let t = read(p.path("lake/orders").to_str().unwrap(), &Value::Null);
    // With a 10-minute lookback, a row in a window's first 10 minutes is
    // also landed by the window before it (as the source asks): each
    // (row, window) once.
    let seen = row_windows(&t, "");
    let distinct: BTreeSet<i64> = seen.iter().map(|(id, _)| *id).collect();
    assert_eq!(distinct, (0..270).collect::<BTreeSet<_>>());
    assert_eq!(t["polars_rows"], t["rows"].as_array().unwrap().len());
}

/// Issue 46: a period re-land killed before its commit is put, or after it
/// is put but before the window records are written, settles on the next
/// run: the period's windows committed once, in one commit, each row once,
/// and `windows` shows every window published under the new recipe.
#[test]
fn delta_a_killed_period_reland_settles_in_one_commit() {
    for point in ["before-commit-put", "after-swap"] {
        let cfg = format!(
            "{}[sources.orders.compact]\ninto = \"1d\"\n",
            config("lake/orders", "")
        );
        let p = Project::new(&cfg);
        let c = db(&p);
        fill(&c, 26, 10, "first");
        let now = "2026-03-02T10:05:00Z";
        assert_eq!(published(&ingest_at(&p, now, &[], &[], 0)), 26);
        let r = compact_at(&p, now, 0);
        assert_eq!(r["periods"][0]["status"], "compacted", "{r}");
        p.write(
            "highwater.toml",
            &cfg.replace("settle = \"2m\"", "settle = \"2m\"\nlookback = \"10m\""),
        );
        let o = p
            .cmd(&["ingest", "orders", "--json", "--now", now, "--force"])
            .env("HIGHWATER_FAILPOINT", point)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), None, "{point}: killed by its failpoint");
        let r = ingest_at(&p, now, &[], &["--force"], 0);
        assert!(r["windows"].is_array(), "{point}: {r}");
        let groups: Vec<Vec<Value>> = log_versions(&p)
            .into_iter()
            .map(|(_, a)| a)
            .filter(|a| a[0]["commitInfo"]["highwater"]["group"].is_array())
            .collect();
        let starts: Vec<Vec<i64>> = groups
            .iter()
            .map(|a| {
                a[0]["commitInfo"]["highwater"]["group"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|w| w["window_start_us"].as_i64().unwrap())
                    .collect()
            })
            .collect();
        assert_eq!(
            groups.len(),
            1,
            "{point}: the period committed once: {starts:?}"
        );
        let w = p.hw(&["windows", "orders", "--json", "--now", now]);
        let grid: Value = serde_json::from_str(&w.stdout).unwrap();
        let rows = grid["windows"].as_array().unwrap();
        assert!(
            rows.iter()
                .all(|r| r["status"] != "stale" && r["status"] != "failed"),
            "{point}: {grid}"
        );
        let t = read(p.path("lake/orders").to_str().unwrap(), &Value::Null);
        let seen = row_windows(&t, point);
        // Against a full rebuild under the new recipe: the same (row,
        // window) pairs. (A re-land that died and was recovered as fresh
        // under the new recipe would keep the old, lookback-less pairs.)
        let fresh =
            Project::new(&cfg.replace("settle = \"2m\"", "settle = \"2m\"\nlookback = \"10m\""));
        fill(&db(&fresh), 26, 10, "first");
        ingest_at(&fresh, now, &[], &[], 0);
        let rebuilt = read(fresh.path("lake/orders").to_str().unwrap(), &Value::Null);
        let want = row_windows(&rebuilt, "the rebuild");
        assert!(want.len() > 260, "the lookback lands rows twice");
        assert_eq!(seen, want, "{point}: as a rebuild");
    }
}

/// Issue 46: `checks.schema = "warn"` means for a Delta table what it
/// means for folders, as far as the protocol lets it: a column the source
/// dropped stays in the table (new rows read it as null) with a warning,
/// where `fail` (the default) refuses; a changed type is refused either
/// way, since a Delta column has one type.
#[test]
fn delta_schema_warn_keeps_a_dropped_column_as_null() {
    let cfg = config("lake/orders", "").replace(
        "continuity = \"warn\"",
        "continuity = \"warn\"\nschema = \"warn\"",
    );
    assert!(cfg.contains("schema = \"warn\""), "{cfg}");
    let p = Project::new(&cfg);
    let c = db(&p);
    fill(&c, 24, 2, "first");
    let r = ingest(&p, &[], &[], 0);
    assert_eq!(published(&r), 24, "{r}");
    c.execute_batch("ALTER TABLE orders DROP COLUMN note;")
        .unwrap();
    c.execute(
        "INSERT INTO orders(id, amount, updated_at) VALUES (1000, 1.0, '2026-03-02T08:30:00Z')",
        [],
    )
    .unwrap();
    let r = ingest_at(&p, "2026-03-02T09:05:00Z", &[], &[], 0);
    assert_eq!(published(&r), 1, "{r}");
    assert!(
        r["warnings"].to_string().contains("`note`"),
        "the dropped column named: {r}"
    );
    let t = read(p.path("lake/orders").to_str().unwrap(), &Value::Null);
    let last = t["rows"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["id"], 1000);
    assert!(last["note"].is_null(), "{last}");
    assert_eq!(t["rows"][0]["note"], "first");
    // The default, `fail`: refused before any window, nothing committed.
    let p2 = Project::new(&config("lake/orders", ""));
    let c2 = db(&p2);
    fill(&c2, 24, 2, "first");
    ingest(&p2, &[], &[], 0);
    c2.execute_batch("ALTER TABLE orders DROP COLUMN note;")
        .unwrap();
    let r = p2.hw(&[
        "ingest",
        "orders",
        "--json",
        "--now",
        "2026-03-02T09:05:00Z",
    ]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("`note`"), "{}", r.stderr);
}
