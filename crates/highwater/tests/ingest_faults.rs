//! Ingestion faults an operator meets (issue 20), against a real
//! PostgreSQL: a column's type changed by `ALTER TABLE` between windows, a
//! renamed table, a wrong password (on a private cluster that really
//! checks passwords), a compaction that cannot do what it was asked, a
//! `chunk_by` column that cannot be chunked on, a published window's
//! folder deleted out of band, and an ingest or compaction whose lease is
//! taken over mid-run.

mod common;
use arrow_array::Array;
use common::ingest::*;
use common::pgcluster::PgCluster;
use common::*;
use std::collections::BTreeMap;
use std::path::Path;

/// An hourly source over `orders`; days are periods when compacted.
fn source(extra: &str) -> String {
    format!(
        r#"
[sources.orders]
kind = "postgres"
url_env = "ORDERS_DATABASE_URL"
table = "orders"
key = ["id"]
mode = "updated_at"
cursor = "updated_at"
interval = "1h"
start = "2026-03-01T00:00:00Z"
settle = "1m"
output = "raw/orders/date={{date}}/hour={{hour}}"
{extra}
"#
    )
}

const COMPACT: &str = "[sources.orders.compact]\ninto = \"1d\"\n";

/// Runs highwater with the source's URL in the environment.
fn hw(p: &Project, url: &str, args: &[&str], code: i32) -> Ran {
    let o = p
        .cmd(args)
        .env("ORDERS_DATABASE_URL", url)
        .output()
        .unwrap();
    let r = Ran {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    };
    assert_eq!(
        r.code, code,
        "highwater {args:?} exited {} (wanted {code})\nstdout:\n{}\nstderr:\n{}",
        r.code, r.stdout, r.stderr
    );
    r
}

fn ingest(p: &Project, url: &str, now: &str, code: i32) -> serde_json::Value {
    hw(p, url, &["ingest", "orders", "--json", "--now", now], code).json()
}

/// `ingest orders` of one window asked for by name (`START/END`).
fn ingest_window(p: &Project, url: &str, now: &str, window: &str, code: i32) -> serde_json::Value {
    let args = [
        "ingest", "orders", "--json", "--now", now, "--window", window,
    ];
    hw(p, url, &args, code).json()
}

/// `HH:MM status` of each window a run reports.
fn statuses(r: &serde_json::Value) -> Vec<String> {
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

/// The Arrow type of `column` in every Parquet file under `dir`, by file.
fn types(dir: &Path, column: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else if name.ends_with(".parquet") {
                let f = std::fs::File::open(&p).unwrap();
                let b = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
                    .unwrap();
                let t = b
                    .schema()
                    .field_with_name(column)
                    .unwrap()
                    .data_type()
                    .to_string();
                out.insert(p.strip_prefix(dir).unwrap().display().to_string(), t);
            }
        }
    }
    out
}

/// Every landed row as (id, updated_at µs), wherever it lives.
fn rows(root: &Path) -> Vec<(i64, i64)> {
    let mut v: Vec<(i64, i64)> = landed_pg(root)
        .into_iter()
        .map(|(_, id, t)| (id, t))
        .collect();
    v.sort();
    v
}

fn insert(c: &mut postgres::Client, id: i64, amount: &str, at: &str) {
    c.batch_execute(&format!(
        "INSERT INTO orders(id, amount, updated_at) VALUES ({id}, {amount}, '{at}')"
    ))
    .unwrap();
}

/// The source table most cases use: `rows` of (id, updated_at), each of
/// amount 7.
fn orders_with(c: &mut postgres::Client, rows: &[(i64, &str)]) {
    c.batch_execute(
        "CREATE TABLE orders(id int8 PRIMARY KEY, amount int4, updated_at timestamptz NOT NULL)",
    )
    .unwrap();
    for (id, at) in rows {
        insert(c, *id, "7", at);
    }
}

/// One step of a drift scenario: a change at the source, the policy the
/// config sets, and what the run must do with the window it owes.
struct Step {
    alter: Option<&'static str>,
    row: (i64, &'static str, &'static str),
    policy: Option<&'static str>,
    now: &'static str,
    code: i32,
    window: &'static str,
    says: &'static [&'static str],
}

/// Issue 20, item 3, and issue 21's schema rule: int4 → numeric → float8
/// between windows. A change that does not widen is refused by default
/// before any window lands (exit 2), naming the column and both types and
/// what to do; `schema = "warn"` publishes it with the warning; each
/// window's manifest records the schema it was written in.
#[test]
fn schema_drift_that_does_not_widen_fails_the_window_and_names_the_column() {
    let _serial = pg_serial();
    let (mut c, url) = pg_database("drift");
    c.batch_execute(
        "CREATE TABLE orders(id int8 PRIMARY KEY, amount int4, updated_at timestamptz NOT NULL)",
    )
    .unwrap();
    let steps = [
        Step {
            alter: None,
            row: (1, "10", "2026-03-01T00:10:00Z"),
            policy: None,
            now: "2026-03-01T01:02:00Z",
            code: 0,
            window: "00:00 published",
            says: &[],
        },
        Step {
            alter: Some("ALTER TABLE orders ALTER amount TYPE numeric(12, 3)"),
            row: (2, "2.5", "2026-03-01T01:10:00Z"),
            policy: None,
            now: "2026-03-01T02:02:00Z",
            code: 2,
            window: "",
            says: &[
                "column `amount` changed from int4 (int32) to numeric(12,3) (utf8), which does not widen",
                "the newest published window [2026-03-01T00:00:00Z, 2026-03-01T01:00:00Z)",
                "Nothing was landed",
                "`[sources.orders.checks] schema = \"warn\"`",
                "cast the column back in a `query`",
            ],
        },
        // The operator accepts it: the same window publishes, warned.
        Step {
            alter: None,
            row: (3, "3.25", "2026-03-01T01:20:00Z"),
            policy: Some("warn"),
            now: "2026-03-01T02:02:00Z",
            code: 0,
            window: "01:00 published",
            says: &["column `amount` changed from int4 (int32) to numeric(12,3) (utf8)"],
        },
        Step {
            alter: Some("ALTER TABLE orders ALTER amount TYPE float8"),
            row: (4, "4.5", "2026-03-01T02:10:00Z"),
            policy: Some("fail"),
            now: "2026-03-01T03:02:00Z",
            code: 2,
            window: "",
            says: &[
                "column `amount` changed from numeric(12,3) (utf8) to float8 (float64), which does not widen",
                "the newest published window [2026-03-01T01:00:00Z, 2026-03-01T02:00:00Z)",
            ],
        },
    ];
    let p = Project::new(&source(""));
    for (i, s) in steps.iter().enumerate() {
        if let Some(sql) = s.alter {
            c.batch_execute(sql).unwrap();
        }
        insert(&mut c, s.row.0, s.row.1, s.row.2);
        let checks = s.policy.map_or(String::new(), |v| {
            format!("[sources.orders.checks]\nschema = \"{v}\"\n")
        });
        p.write("highwater.toml", &source(&checks));
        if s.code == 2 {
            // Refused before any window ran: said on stderr, nothing landed.
            let args = ["ingest", "orders", "--json", "--now", s.now];
            let r = hw(&p, &url, &args, 2);
            for want in s.says {
                assert!(
                    r.stderr.contains(want),
                    "step {i}: wanted {want:?} in {}",
                    r.stderr
                );
            }
            continue;
        }
        let r = ingest(&p, &url, s.now, s.code);
        assert_eq!(statuses(&r), [s.window], "step {i}: {r}");
        let w = &r["windows"][0];
        let warnings: Vec<&str> = w["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let said = format!(
            "{} {}",
            w["error"].as_str().unwrap_or(""),
            warnings.join(" ")
        );
        for want in s.says {
            assert!(said.contains(want), "step {i}: wanted {want:?} in {said}");
        }
        if s.says.is_empty() {
            assert_eq!(w["warnings"], serde_json::json!([]), "step {i}: {r}");
        }
    }
    // What is published: int32, then the numeric's text; the refused
    // float8 window published nothing.
    let root = p.path("raw/orders/date=2026-03-01");
    let t = types(&root, "amount");
    assert_eq!(
        t.into_iter()
            .map(|(f, t)| (f[..7].to_string(), t))
            .collect::<Vec<_>>(),
        [
            ("hour=00".to_string(), "Int32".to_string()),
            ("hour=01".into(), "Utf8".into())
        ]
    );
    // Each manifest records the schema it was written in.
    for (hour, ty, src) in [("00", "int32", "int4"), ("01", "utf8", "numeric(12,3)")] {
        let m: serde_json::Value = serde_json::from_str(&p.read(&format!(
            "raw/orders/date=2026-03-01/hour={hour}/_manifest.json"
        )))
        .unwrap();
        let amount = m["schema"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "amount")
            .unwrap_or_else(|| panic!("no schema in {m}"));
        assert_eq!(amount["type"], ty, "{m}");
        assert_eq!(amount["source_type"], src, "{m}");
    }
}

/// Issue 20, item 3: int4 → int8 (and real → double precision) widens:
/// it passes by default with a word, and compaction writes the period in
/// the wider types with every value as it was.
#[test]
fn schema_widening_passes_and_compaction_widens_the_older_windows() {
    let _serial = pg_serial();
    let (mut c, url) = pg_database("widen");
    c.batch_execute(
        "CREATE TABLE orders(id int8 PRIMARY KEY, amount int4, ratio real, updated_at timestamptz NOT NULL);
         INSERT INTO orders VALUES (1, 2000000000, 0.5, '2026-03-01T00:10:00Z'), (2, NULL, NULL, '2026-03-01T00:20:00Z')",
    )
    .unwrap();
    let p = Project::new(&source(COMPACT));
    let r = ingest(&p, &url, "2026-03-01T01:02:00Z", 0);
    assert_eq!(statuses(&r), ["00:00 published"]);
    c.batch_execute(
        "ALTER TABLE orders ALTER amount TYPE int8, ALTER ratio TYPE float8;
         INSERT INTO orders VALUES (3, 9000000000, 0.25, '2026-03-01T05:10:00Z')",
    )
    .unwrap();
    let r = ingest(&p, &url, "2026-03-02T00:30:00Z", 0);
    let w = r["windows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["start"] == "2026-03-01T05:00:00Z")
        .unwrap();
    assert_eq!(w["status"], "published", "{r}");
    let warned = w["warnings"].to_string();
    for want in [
        "column `amount` changed from int4 (int32) to int8 (int64), which widens",
        "column `ratio` changed from float4 (float32) to float8 (float64), which widens",
    ] {
        assert!(warned.contains(want), "wanted {want:?} in {warned}");
    }
    let root = p.path("raw/orders/date=2026-03-01");
    let before = types(&root, "amount");
    assert!(before.values().any(|t| t == "Int32") && before.values().any(|t| t == "Int64"));
    let r = hw(
        &p,
        &url,
        &[
            "compact",
            "orders",
            "--now",
            "2026-03-02T00:30:00Z",
            "--json",
        ],
        0,
    )
    .json();
    assert_eq!(r["periods"][0]["status"], "compacted", "{r}");
    assert_eq!(r["periods"][0]["rows"], 3, "{r}");
    let after = types(&root, "amount");
    assert!(after.values().all(|t| t == "Int64"), "{after:?}");
    assert!(types(&root, "ratio").values().all(|t| t == "Float64"));
    let mut rows = BTreeMap::new();
    each_batch(&root, |_, b| {
        let ids = i64_column(b, "id");
        let amount = i64_column(b, "amount");
        let ratio = b
            .column_by_name("ratio")
            .unwrap()
            .as_any()
            .downcast_ref::<arrow_array::Float64Array>()
            .unwrap();
        for i in 0..b.num_rows() {
            rows.insert(
                ids.value(i),
                (
                    (!amount.is_null(i)).then(|| amount.value(i)),
                    (!ratio.is_null(i)).then(|| ratio.value(i)),
                ),
            );
        }
    });
    assert_eq!(
        rows,
        BTreeMap::from([
            (1, (Some(2_000_000_000), Some(0.5))),
            (2, (None, None)),
            (3, (Some(9_000_000_000), Some(0.25))),
        ])
    );
    // The period stays re-ingestable: a window landed into it again.
    let r = ingest_window(
        &p,
        &url,
        "2026-03-02T00:30:00Z",
        "2026-03-01T00:00:00Z/2026-03-01T01:00:00Z",
        0,
    );
    assert_eq!(statuses(&r), ["00:00 published"], "{r}");
}

/// Issue 21's schema rule for window folders: a column added at the
/// source evolves the output (the window publishes with a word, a
/// compaction fills the older rows with nulls); a dropped column is
/// refused before any window lands, exit 2, naming it.
#[test]
fn an_added_column_evolves_the_folders_and_a_dropped_one_is_refused() {
    let _serial = pg_serial();
    let (mut c, url) = pg_database("evolve");
    c.batch_execute(
        "CREATE TABLE orders(id int8 PRIMARY KEY, amount int4, updated_at timestamptz NOT NULL);
         INSERT INTO orders VALUES (1, 5, '2026-03-01T00:10:00Z')",
    )
    .unwrap();
    let p = Project::new(&source(COMPACT));
    let r = ingest(&p, &url, "2026-03-01T01:02:00Z", 0);
    assert_eq!(statuses(&r), ["00:00 published"]);
    c.batch_execute(
        "ALTER TABLE orders ADD COLUMN qty int8;
         INSERT INTO orders VALUES (2, 6, '2026-03-01T01:10:00Z', 40)",
    )
    .unwrap();
    let r = ingest(&p, &url, "2026-03-02T00:30:00Z", 0);
    let w = r["windows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["start"] == "2026-03-01T01:00:00Z")
        .unwrap();
    assert_eq!(w["status"], "published", "{r}");
    let warned = w["warnings"].to_string();
    assert!(
        warned.contains("column `qty` (int8, int64) is new (older windows read it as null)"),
        "{warned}"
    );
    let r = hw(
        &p,
        &url,
        &[
            "compact",
            "orders",
            "--now",
            "2026-03-02T00:30:00Z",
            "--json",
        ],
        0,
    )
    .json();
    assert_eq!(r["periods"][0]["status"], "compacted", "{r}");
    assert_eq!(r["periods"][0]["rows"], 2, "{r}");
    let root = p.path("raw/orders/date=2026-03-01");
    let mut rows = BTreeMap::new();
    each_batch(&root, |_, b| {
        let ids = i64_column(b, "id");
        let qty = i64_column(b, "qty");
        for i in 0..b.num_rows() {
            rows.insert(ids.value(i), (!qty.is_null(i)).then(|| qty.value(i)));
        }
    });
    assert_eq!(rows, BTreeMap::from([(1, None), (2, Some(40))]));
    // A dropped column: refused before anything lands.
    c.batch_execute(
        "ALTER TABLE orders DROP COLUMN amount;
         INSERT INTO orders VALUES (3, '2026-03-02T00:10:00Z', 1)",
    )
    .unwrap();
    let listing = || {
        let mut out = Vec::new();
        let mut stack = vec![p.path("raw")];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let m = e.metadata().unwrap();
                if m.is_dir() {
                    stack.push(e.path());
                } else {
                    out.push((e.path(), m.len()));
                }
            }
        }
        out.sort();
        out
    };
    let before = listing();
    let r = hw(
        &p,
        &url,
        &[
            "ingest",
            "orders",
            "--json",
            "--now",
            "2026-03-02T01:02:00Z",
        ],
        2,
    );
    for want in [
        "column `amount` (int4, int32) is gone",
        "Nothing was landed",
    ] {
        assert!(r.stderr.contains(want), "wanted {want:?} in {}", r.stderr);
    }
    assert_eq!(listing(), before, "nothing was landed");
}

/// Issue 20, item 3: windows published with `schema = "warn"` across a
/// change that does not widen make a period compaction cannot write in
/// one schema: it names the two windows and the column, exits 1, and the
/// way out it gives (re-ingest the older windows) works.
#[test]
fn compaction_of_windows_with_differing_schemas_names_the_windows() {
    let _serial = pg_serial();
    let (mut c, url) = pg_database("mixed");
    c.batch_execute(
        "CREATE TABLE orders(id int8 PRIMARY KEY, amount int4, updated_at timestamptz NOT NULL);
         INSERT INTO orders VALUES (1, 7, '2026-03-01T00:10:00Z')",
    )
    .unwrap();
    let p = Project::new(&source(&format!(
        "[sources.orders.checks]\nschema = \"warn\"\n{COMPACT}"
    )));
    ingest(&p, &url, "2026-03-01T01:02:00Z", 0);
    c.batch_execute(
        "ALTER TABLE orders ALTER amount TYPE numeric;
         INSERT INTO orders VALUES (2, 8.5, '2026-03-01T03:10:00Z')",
    )
    .unwrap();
    ingest(&p, &url, "2026-03-02T00:30:00Z", 0);
    let args = [
        "compact",
        "orders",
        "--now",
        "2026-03-02T00:30:00Z",
        "--json",
    ];
    let r = hw(&p, &url, &args, 1).json();
    let period = &r["periods"][0];
    assert_eq!(period["status"], "failed", "{r}");
    let reason = period["reason"].as_str().unwrap();
    for want in [
        "window [2026-03-01T00:00:00Z, 2026-03-01T01:00:00Z) against window [2026-03-01T23:00:00Z, 2026-03-02T00:00:00Z)",
        "column `amount` is Int32 in its files where the period's is Utf8",
        "highwater ingest orders --from 2026-03-01T00:00:00Z --to 2026-03-01T23:00:00Z",
    ] {
        assert!(reason.contains(want), "wanted {want:?} in {reason}");
    }
    // Nothing was swapped: the windows are as they were.
    assert!(!p.path("raw/orders/date=2026-03-01/_manifest.json").exists());
    assert_eq!(
        types(&p.path("raw/orders/date=2026-03-01/hour=00"), "amount")
            .into_values()
            .collect::<Vec<_>>(),
        ["Int32"]
    );
    // The way out it names.
    hw(
        &p,
        &url,
        &[
            "ingest",
            "orders",
            "--now",
            "2026-03-02T00:30:00Z",
            "--from",
            "2026-03-01T00:00:00Z",
            "--to",
            "2026-03-01T23:00:00Z",
        ],
        0,
    );
    let r = hw(&p, &url, &args, 0).json();
    assert_eq!(r["periods"][0]["status"], "compacted", "{r}");
    assert_eq!(r["periods"][0]["rows"], 2, "{r}");
    // Back to int4 at the source, still under "warn": a window re-landed
    // into the compacted (numeric) period cannot join it. That window
    // fails, named, and the period keeps its rows.
    c.batch_execute("ALTER TABLE orders ALTER amount TYPE int4 USING round(amount)::int4")
        .unwrap();
    let before = types(&p.path("raw/orders/date=2026-03-01"), "amount");
    let r = ingest_window(
        &p,
        &url,
        "2026-03-02T00:30:00Z",
        "2026-03-01T00:00:00Z/2026-03-01T01:00:00Z",
        1,
    );
    assert_eq!(statuses(&r), ["00:00 failed"], "{r}");
    let error = r["windows"][0]["error"].as_str().unwrap();
    assert!(
        error.contains("cannot be written into its compacted period")
            && error.contains("column `amount` is"),
        "{error}"
    );
    assert_eq!(
        types(&p.path("raw/orders/date=2026-03-01"), "amount"),
        before
    );
    let w = hw(
        &p,
        &url,
        &[
            "windows",
            "orders",
            "--now",
            "2026-03-02T00:30:00Z",
            "--json",
        ],
        0,
    )
    .json();
    assert!(
        w["windows"]
            .as_array()
            .unwrap()
            .iter()
            .all(|w| w["status"] == "published"),
        "the published version stays: {w}"
    );
}

/// Issue 20, item 4: the server's own reason is passed on, the variable
/// holding the URL is named, and the password is never printed: a table
/// renamed at the source, and a wrong password on a cluster that checks.
#[test]
fn source_errors_pass_on_the_servers_reason_and_name_the_variable() {
    let p = Project::new(&source(""));
    // A renamed table, on the shared cluster.
    {
        let _serial = pg_serial();
        let (mut c, url) = pg_database("renamed");
        c.batch_execute(
            "CREATE TABLE orders(id int8 PRIMARY KEY, amount int4, updated_at timestamptz NOT NULL);
             INSERT INTO orders VALUES (1, 1, '2026-03-01T00:10:00Z')",
        )
        .unwrap();
        ingest(&p, &url, "2026-03-01T01:02:00Z", 0);
        c.batch_execute("ALTER TABLE orders RENAME TO orders_v2")
            .unwrap();
        let r = hw(
            &p,
            &url,
            &["ingest", "orders", "--now", "2026-03-01T02:02:00Z"],
            2,
        );
        for want in [
            "cannot read the columns of table `orders`: relation \"orders\" does not exist",
            "was it renamed or dropped?",
        ] {
            assert!(r.stderr.contains(want), "wanted {want:?} in {}", r.stderr);
        }
        assert!(!r.stderr.contains("db error"), "{}", r.stderr);
    }
    // A wrong password, on a cluster that checks passwords.
    let cluster = PgCluster::start_with_password("super-Secret-1");
    let mut admin = postgres::Client::connect(
        &cluster.url_as("postgres", "super-Secret-1"),
        postgres::NoTls,
    )
    .unwrap();
    admin
        .batch_execute(
            "CREATE ROLE hw_reader LOGIN PASSWORD 'right-Secret-2';
             CREATE TABLE orders(id int8 PRIMARY KEY, amount int4, updated_at timestamptz NOT NULL);
             GRANT SELECT ON orders TO hw_reader",
        )
        .unwrap();
    // The right password works (so the refusal below is the password's).
    let q = Project::new(&source(""));
    ingest(
        &q,
        &cluster.url_as("hw_reader", "right-Secret-2"),
        "2026-03-01T01:02:00Z",
        0,
    );
    let wrong = "wrong-Secret-3";
    let r = hw(
        &q,
        &cluster.url_as("hw_reader", wrong),
        &["ingest", "orders", "--now", "2026-03-01T02:02:00Z"],
        2,
    );
    for want in [
        "source `orders`: cannot connect: password authentication failed for user \"hw_reader\"",
        "ORDERS_DATABASE_URL",
    ] {
        assert!(r.stderr.contains(want), "wanted {want:?} in {}", r.stderr);
    }
    for secret in [wrong, "right-Secret-2", "super-Secret-1"] {
        assert!(
            !r.stderr.contains(secret) && !r.stdout.contains(secret),
            "{}",
            r.stderr
        );
    }
}

/// Issue 20, item 5: a compaction that skips the period it was asked for
/// (a failed window inside) did not do what was asked: exit 1, with the
/// failed window and its reason.
#[test]
fn compaction_that_skips_every_period_asked_for_exits_1() {
    let _serial = pg_serial();
    let (mut c, url) = pg_database("skip");
    // No primary key: a duplicate key fails its window (unique_key).
    c.batch_execute(
        "CREATE TABLE orders(id int8, amount int4, updated_at timestamptz NOT NULL);
         INSERT INTO orders VALUES (1, 1, '2026-03-01T01:10:00Z'),
           (2, 2, '2026-03-01T05:10:00Z'), (2, 3, '2026-03-01T05:20:00Z')",
    )
    .unwrap();
    let p = Project::new(&source(COMPACT));
    let r = ingest(&p, &url, "2026-03-02T00:30:00Z", 1);
    assert_eq!(
        statuses(&r)
            .iter()
            .filter(|s| s.ends_with("failed"))
            .collect::<Vec<_>>(),
        ["05:00 failed"]
    );
    let r = hw(
        &p,
        &url,
        &["compact", "orders", "--now", "2026-03-02T00:30:00Z"],
        1,
    );
    for want in [
        "skipped",
        "1 of its windows are not published under the current recipe (first: [2026-03-01T05:00:00Z, 2026-03-01T06:00:00Z), failed: not published: 1 keys occur more than once",
        "highwater ingest orders",
    ] {
        assert!(r.stdout.contains(want), "wanted {want:?} in {}", r.stdout);
    }
    // Once the window is fixed and landed, the same compaction exits 0.
    c.batch_execute("DELETE FROM orders WHERE amount = 3")
        .unwrap();
    ingest(&p, &url, "2026-03-02T00:30:00Z", 0);
    let r = hw(
        &p,
        &url,
        &[
            "compact",
            "orders",
            "--now",
            "2026-03-02T00:30:00Z",
            "--json",
        ],
        0,
    )
    .json();
    assert_eq!(r["periods"][0]["status"], "compacted", "{r}");
    // Days past the newest window ingested are not asked for by default:
    // nothing there to skip.
    let r = hw(
        &p,
        &url,
        &[
            "compact",
            "orders",
            "--now",
            "2026-03-05T00:30:00Z",
            "--json",
        ],
        0,
    )
    .json();
    assert_eq!(r["periods"].as_array().unwrap().len(), 1, "{r}");
    assert_eq!(r["periods"][0]["status"], "already", "{r}");
    // Asked for by name, a day never ingested is skipped: exit 1.
    let r = hw(
        &p,
        &url,
        &[
            "compact",
            "orders",
            "--now",
            "2026-03-05T00:30:00Z",
            "--from",
            "2026-03-02T00:00:00Z",
            "--to",
            "2026-03-03T00:00:00Z",
        ],
        1,
    );
    assert!(
        r.stdout.contains("skipped") && r.stdout.contains("never ingested"),
        "{}",
        r.stdout
    );
}

fn chunked(by: &str) -> String {
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
chunk_by = "{by}"
chunk_rows = 1000
"#
    )
}

/// Issue 20, item 6: a text `chunk_by` column is refused before any
/// window runs (exit 2, nothing recorded); one without an index warns
/// once per run, however many windows it lands; an indexed one says
/// nothing.
#[test]
fn chunk_by_text_is_refused_before_any_window_and_unindexed_warns_once() {
    let _serial = pg_serial();
    let (mut c, url) = pg_database("chunkby");
    c.batch_execute(
        "CREATE TABLE orders(id int8 PRIMARY KEY, v int8, note text, updated_at timestamptz NOT NULL);
         INSERT INTO orders SELECT g, g % 97, md5(g::text), timestamptz '2026-03-01' + (g % 172000) * interval '1 s'
           FROM generate_series(1, 5000) g;
         ANALYZE orders",
    )
    .unwrap();
    const NOW: &str = "2026-03-03T01:00:00Z";
    let p = Project::new(&chunked("note"));
    let r = hw(&p, &url, &["ingest", "orders", "--now", NOW], 2);
    assert!(
        r.stderr
            .contains("`chunk_by` column `note` is text, not an integer"),
        "{}",
        r.stderr
    );
    let w = hw(&p, &url, &["windows", "orders", "--now", NOW, "--json"], 0).json();
    assert!(
        w["windows"]
            .as_array()
            .unwrap()
            .iter()
            .all(|w| w["status"] == "missing"),
        "no window was recorded: {w}"
    );
    assert!(!p.path("raw").exists());
    // (chunk_by, warnings that name the missing index)
    for (by, warned) in [("v", 1), ("id", 0)] {
        let p = Project::new(&chunked(by));
        let r = ingest(&p, &url, NOW, 0);
        assert_eq!(statuses(&r), ["00:00 published", "00:00 published"], "{r}");
        let all = r.to_string();
        assert_eq!(
            all.matches("leads no index").count(),
            warned,
            "chunk_by {by}: {r}"
        );
        if warned > 0 {
            assert!(
                all.contains("CREATE INDEX ON \\\"orders\\\" (\\\"v\\\")"),
                "{r}"
            );
        }
    }
}

/// Issue 20, item 7: a published window's folder deleted out of band is
/// shown missing by `windows` (with why), and the next `ingest` lands it
/// again, rows as they were; the same for a compacted period's folder.
#[test]
fn a_deleted_window_folder_shows_missing_and_is_landed_again() {
    let _serial = pg_serial();
    let (mut c, url) = pg_database("gone");
    c.batch_execute(
        "CREATE TABLE orders(id int8 PRIMARY KEY, amount int4, updated_at timestamptz NOT NULL);
         INSERT INTO orders SELECT g, g, timestamptz '2026-03-01' + g * interval '1 min' FROM generate_series(1, 170) g",
    )
    .unwrap();
    let p = Project::new(&source(COMPACT));
    const NOW: &str = "2026-03-01T03:02:00Z";
    ingest(&p, &url, NOW, 0);
    let root = p.path("raw/orders");
    let before = rows(&root);
    assert_eq!(before.len(), 170);
    std::fs::remove_dir_all(p.path("raw/orders/date=2026-03-01/hour=01")).unwrap();
    let w = hw(&p, &url, &["windows", "orders", "--now", NOW, "--json"], 0).json();
    let cells: Vec<(&str, &str)> = w["windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                &w["start"].as_str().unwrap()[11..16],
                w["status"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        cells,
        [
            ("00:00", "published"),
            ("01:00", "missing"),
            ("02:00", "published")
        ]
    );
    let note = w["windows"][1]["note"].as_str().unwrap();
    assert!(
        note.contains("raw/orders/date=2026-03-01/hour=01 is gone")
            && note.contains("highwater ingest orders"),
        "{note}"
    );
    let text = hw(&p, &url, &["windows", "orders", "--now", NOW], 0).stdout;
    assert!(text.contains("2026-03-01 #.#"), "{text}");
    assert!(
        text.contains("2026-03-01T01:00:00Z missing: published at"),
        "{text}"
    );
    let r = ingest(&p, &url, NOW, 0);
    assert_eq!(statuses(&r), ["01:00 published"], "{r}");
    assert!(
        r["warnings"]
            .to_string()
            .contains("1 published window(s) are gone from disk"),
        "{r}"
    );
    assert_eq!(rows(&root), before);
    let r = ingest(&p, &url, NOW, 0);
    assert!(statuses(&r).is_empty(), "{r}");
    // A compacted period's folder deleted: all its windows land again.
    c.batch_execute(
        "INSERT INTO orders SELECT g, g, timestamptz '2026-03-01' + g * interval '1 min' FROM generate_series(180, 1439) g",
    )
    .unwrap();
    const LATER: &str = "2026-03-02T00:30:00Z";
    ingest(&p, &url, LATER, 0);
    hw(&p, &url, &["compact", "orders", "--now", LATER], 0);
    let before = rows(&root);
    assert_eq!(before.len(), 170 + 1260);
    std::fs::remove_dir_all(p.path("raw/orders/date=2026-03-01")).unwrap();
    let w = hw(
        &p,
        &url,
        &["windows", "orders", "--now", LATER, "--json"],
        0,
    )
    .json();
    assert!(
        w["windows"]
            .as_array()
            .unwrap()
            .iter()
            .all(|w| w["status"] == "missing"),
        "{w}"
    );
    let r = ingest(&p, &url, LATER, 0);
    assert_eq!(statuses(&r).len(), 24, "{r}");
    assert!(statuses(&r).iter().all(|s| s.ends_with("published")), "{r}");
    assert_eq!(rows(&root), before);
}

/// Each window's digest and where its rows live, from `windows --json`.
fn layout(p: &Project, url: &str, now: &str) -> Vec<(String, String, String)> {
    let w = hw(p, url, &["windows", "orders", "--now", now, "--json"], 0).json();
    w["windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["start"].as_str().unwrap().to_string(),
                w["digest"].to_string(),
                w["compacted"].to_string(),
            )
        })
        .collect()
}

/// Runs highwater `args` with failpoint `failpoint` (a gate after each
/// period or window); at the first gate, another owner ("other:4242" on
/// "elsewhere") takes the source's lease over as if it had expired, the
/// way `lease::take` does. Returns what the run did and the new token.
fn taken_over_at_the_gate(
    p: &Project,
    url: &str,
    args: &[&str],
    failpoint: &str,
) -> (std::process::Output, i64) {
    use highwater_store::{LeaseOutcome, SqliteStore, StateStore};
    let gate = p.path("gate");
    std::fs::write(&gate, b"").unwrap();
    let reached = p.path("gate.reached");
    let _ = std::fs::remove_file(&reached);
    let child = p
        .cmd(args)
        .env("ORDERS_DATABASE_URL", url)
        .env("HIGHWATER_FAILPOINT", failpoint)
        .env("HIGHWATER_FAILPOINT_GATE", &gate)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Waits for the first gate (bounded, so that a run that never gets
    // there fails the test instead of hanging it).
    for _ in 0..3000 {
        if reached.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        reached.exists(),
        "{failpoint}: the run reached its first gate"
    );
    let mut s = SqliteStore::open(&p.path(".highwater/state.db")).unwrap();
    let held = s.lease("ingest:orders").unwrap().expect("the run holds it");
    let LeaseOutcome::Acquired(other) = s
        .acquire_lease(
            "ingest:orders",
            "other:4242",
            "elsewhere",
            4242,
            held.expires_at_ns + 1,
            3_600_000_000_000,
        )
        .unwrap()
    else {
        panic!("an expired lease is taken over")
    };
    std::fs::remove_file(&gate).unwrap();
    (child.wait_with_output().unwrap(), other.token)
}

/// The other owner is done: it gives the lease up.
fn release(p: &Project, token: i64) {
    use highwater_store::{Fence, SqliteStore, StateStore};
    let mut s = SqliteStore::open(&p.path(".highwater/state.db")).unwrap();
    s.release_lease(&Fence {
        name: "ingest:orders".into(),
        token,
    })
    .unwrap();
}

/// Issue 20: an ingest whose lease is taken over after its first window
/// exits 1 and lists every window it did not run as failed, naming the
/// owner it lost the lease to and what to do; the next ingest lands them.
#[test]
fn ingest_that_loses_its_lease_mid_run_lists_the_windows_not_run_and_exits_1() {
    let _serial = pg_serial();
    let (mut c, url) = pg_database("ilease");
    orders_with(
        &mut c,
        &[
            (1, "2026-03-01T00:10:00Z"),
            (2, "2026-03-01T01:10:00Z"),
            (3, "2026-03-01T02:10:00Z"),
            (4, "2026-03-01T03:10:00Z"),
        ],
    );
    let now = "2026-03-01T04:30:00Z";
    let p = Project::new(&source(""));
    let args = [
        "ingest",
        "orders",
        "--json",
        "--now",
        now,
        "--max-parallel",
        "1",
    ];
    let (o, other) = taken_over_at_the_gate(&p, &url, &args, "ingest-gate");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(1),
        "exit 1: not every window owed was landed\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        statuses(&r),
        [
            "00:00 published",
            "01:00 failed",
            "02:00 failed",
            "03:00 failed"
        ],
        "{r}"
    );
    for w in &r["windows"].as_array().unwrap()[1..] {
        let why = w["error"].as_str().unwrap();
        for says in [
            "not run: the lease `ingest:orders` was lost mid-run to other:4242 (host elsewhere, pid 4242)",
            "run `highwater ingest orders` again",
        ] {
            assert!(why.contains(says), "wanted {says:?} in {why}");
        }
    }
    release(&p, other);
    let r = ingest(&p, &url, now, 0);
    assert_eq!(
        statuses(&r),
        ["01:00 published", "02:00 published", "03:00 published"],
        "{r}"
    );
    assert_eq!(
        rows(&p.path("raw")).iter().map(|r| r.0).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
}

/// Issue 20: a compaction whose lease is taken over mid-run (here after
/// its first period, by another owner taking the expired lease the way
/// `lease::take` does) exits 1, naming each period not compacted, the
/// owner it lost the lease to, and what to do; the next `compact`
/// finishes with exit 0, and the result is that of a clean compaction.
#[test]
fn compaction_that_loses_its_lease_mid_run_exits_1_and_the_next_finishes() {
    let _serial = pg_serial();
    let (mut c, url) = pg_database("lease");
    orders_with(
        &mut c,
        &[
            (1, "2026-03-01T01:10:00Z"),
            (2, "2026-03-01T13:10:00Z"),
            (3, "2026-03-02T02:10:00Z"),
            (4, "2026-03-03T04:10:00Z"),
            (5, "2026-03-03T22:10:00Z"),
        ],
    );
    let now = "2026-03-04T00:30:00Z";
    let compact = ["compact", "orders", "--now", now, "--json"];
    // The clean compaction to compare with, in a project of its own.
    let clean = Project::new(&source(COMPACT));
    ingest(&clean, &url, now, 0);
    hw(&clean, &url, &compact, 0);

    let p = Project::new(&source(COMPACT));
    ingest(&p, &url, now, 0);
    let (o, other) = taken_over_at_the_gate(&p, &url, &compact, "compact-gate");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(1),
        "exit 1: not every period was compacted\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let got: Vec<(String, String)> = r["periods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["start"].as_str().unwrap()[..10].to_string(),
                p["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want = [
        ("2026-03-01", "compacted"),
        ("2026-03-02", "failed"),
        ("2026-03-03", "failed"),
    ]
    .map(|(a, b)| (a.to_string(), b.to_string()));
    assert_eq!(got, want, "{r}");
    for period in &r["periods"].as_array().unwrap()[1..] {
        let why = period["reason"].as_str().unwrap();
        for says in [
            "not compacted: the lease `ingest:orders` was lost mid-run to other:4242 (host elsewhere, pid 4242)",
            "nothing of it was touched",
            "Run `highwater compact orders` again",
        ] {
            assert!(why.contains(says), "wanted {says:?} in {why}");
        }
    }
    // The other owner is done; the next compaction finishes the rest.
    release(&p, other);
    let r = hw(&p, &url, &compact, 0).json();
    let statuses: Vec<&str> = r["periods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["already", "compacted", "compacted"], "{r}");
    assert_eq!(
        layout(&p, &url, now),
        layout(&clean, &url, now),
        "the same windows, digests and periods as a clean compaction"
    );
    assert_eq!(rows(&p.path("raw")), rows(&clean.path("raw")));
    assert_eq!(rows(&p.path("raw")).len(), 5);
}
