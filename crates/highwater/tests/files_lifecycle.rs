//! Adopt, verify, upgrades, pipelines and aggregates.

mod common;
use common::*;

#[test]
fn adopt_records_existing_outputs_and_refuses_missing_ones() {
    let p = Project::new(&upper_config(""));
    for n in ["a", "b", "c"] {
        p.write(&format!("data/{n}.txt"), n);
    }
    // An existing pipeline made two of the three outputs before highwater.
    p.write("out/a.txt.upper", "A");
    p.write("out/b.txt.upper", "B");
    let before = p.tree("out");
    let r = p.check(&["adopt", "--json"], 1).json();
    assert_eq!(r["stages"][0]["adopted"], 2);
    assert_eq!(r["stages"][0]["refused"][0]["input"], "data/c.txt");
    assert_eq!(p.tree("out"), before, "adopt runs nothing");
    let plan = p.check(&["plan", "--json"], 0).json();
    let changed = plan["stages"][0]["changed"].as_array().unwrap();
    assert_eq!(changed.len(), 1);
    assert_eq!(changed[0]["input"], "data/c.txt");
    let r = p.run_json(&[], 0);
    assert_eq!(stage(&r, "upper")["processed"], 1);
    assert_eq!(p.tree("out")["a.txt.upper"], before["a.txt.upper"]);
}

#[test]
fn verify_finds_a_non_deterministic_transform() {
    let p = Project::new(&upper_config(""));
    p.write("data/a.txt", "a");
    p.write("data/b.txt", "b");
    p.run_json(&[], 0);
    let r = p.check(&["verify", "--json"], 0).json();
    assert_eq!(
        (r["checked"].as_u64(), r["differ"].as_u64()),
        (Some(2), Some(0))
    );
    // The script now stamps the time (and the recipe does not list it as a
    // file: exactly the kind of hidden dependency verify is for).
    let cfg = p.read("highwater.toml").replace("files = [\"up.sh\"]", "");
    p.write("highwater.toml", &cfg);
    p.check(&["adopt"], 0);
    p.write(
        "up.sh",
        "set -eu\n{ tr a-z A-Z < \"$1\"; date +%N; } > \"$2\"\n",
    );
    let r = p.check(&["verify", "--sample", "1", "--json"], 1).json();
    assert_eq!(r["checked"], 1);
    assert_eq!(r["items"][0]["result"], "differs");
    assert_eq!(r["items"][0]["first_difference_at"], 1);
    assert!(!p.exists(".highwater/verify"), "scratch is cleaned up");
}

#[test]
fn an_older_schema_migrates_and_nothing_looks_changed() {
    let p = Project::new(&upper_config(""));
    for i in 0..30 {
        p.write(&format!("data/{i}.txt"), "x");
    }
    p.run_json(&[], 0);
    // Turn the store back into what schema 1 (the first release) wrote.
    {
        let db = rusqlite::Connection::open(p.path(".highwater/state.db")).unwrap();
        db.execute_batch(
            "DROP TRIGGER entries_token_ins; DROP TRIGGER entries_token_upd; DROP TRIGGER entries_token_del; DROP TABLE manifest_tokens;
             DROP TABLE runs; DROP TABLE output_dirs; DROP TABLE bookmarks; DROP TABLE windows; DROP TABLE leases; DROP TABLE work; DROP TABLE processes; DROP TABLE dep_sets; DROP TABLE item_deps; DROP TABLE window_tokens; ALTER TABLE entries DROP COLUMN duration_ms;
             UPDATE meta SET value = '1' WHERE key = 'schema_version';",
        )
        .unwrap();
    }
    let r = p.run_json(&[], 0);
    assert_eq!(stage(&r, "upper")["unchanged"], 30);
    assert_eq!(stage(&r, "upper")["processed"], 0);
    assert_eq!(
        p.export()["schema_version"],
        highwater_store::sqlite::SCHEMA_VERSION
    );
}

const PIPELINE: &str = r#"
[stages.upper]
inputs = ["data/*.txt"]
output = "stage1/{name}"
command = ["sh", "up.sh", "{input}", "{output}"]
[stages.first_line]
inputs = ["stage1/*.txt"]
output = "stage2/{stem}.line"
command = ["sh", "-c", "head -n 1 \"$1\" > \"$2\"", "_", "{input}", "{output}"]
[stages.all]
inputs = ["stage2/*.line"]
output = "stage3/all.txt"
command = ["sh", "-c", "o=\"$1\"; shift; cat \"$@\" > \"$o\"", "_", "{output}", "{inputs}"]
"#;

#[test]
fn stages_run_in_dependency_order_and_unchanged_upstream_stops_work() {
    let p = Project::new(PIPELINE);
    p.write("data/a.txt", "one\ntwo\n");
    p.write("data/b.txt", "three\n");
    let r = p.run_json(&[], 0);
    let names: Vec<_> = r["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["upper", "first_line", "all"]);
    assert_eq!(p.read("stage3/all.txt"), "ONE\nTHREE\n");
    // A change below the first line: upper re-runs, its output changes, but
    // first_line's output is byte-identical, so `all` does nothing.
    p.write("data/a.txt", "one\nTWO and more\n");
    let r = p.run_json(&[], 0);
    assert_eq!(stage(&r, "upper")["processed"], 1);
    assert_eq!(stage(&r, "first_line")["processed"], 1);
    assert_eq!(stage(&r, "all")["processed"], 0, "{r}");
    // Adding an input re-runs the aggregate; removing one does too.
    p.write("data/c.txt", "four\n");
    let r = p.run_json(&[], 0);
    assert_eq!(stage(&r, "all")["processed"], 1);
    assert_eq!(p.read("stage3/all.txt"), "ONE\nTHREE\nFOUR\n");
    std::fs::remove_file(p.path("data/a.txt")).unwrap();
    let r = p.run_json(&[], 0);
    assert_eq!(stage(&r, "upper")["deleted"], 1);
    assert_eq!(stage(&r, "first_line")["deleted"], 1);
    assert_eq!(stage(&r, "all")["processed"], 1);
    assert_eq!(p.read("stage3/all.txt"), "THREE\nFOUR\n");
    let status = p.check(&["status"], 0).stdout;
    assert!(status.contains("all: 1 entries, 0 failed"), "{status}");
    p.check(&["run", "--stage", "all"], 0);
}

#[test]
fn a_recipe_changes_with_its_code_file_tool_and_config_but_not_with_the_folder() {
    let p = Project::new(&upper_config(""));
    p.write("data/a.txt", "a");
    p.run_json(&[], 0);
    // Moving the whole project leaves the recipe id alone: no absolute path
    // is part of it.
    let moved = tempfile::tempdir().unwrap();
    let status = |dir: &std::path::Path| {
        let out = std::process::Command::new(bin())
            .current_dir(dir)
            .args(["status", "--json"])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["stages"][0]["recipe"].as_str().unwrap().to_string()
    };
    let id = status(p.dir.path());
    for f in ["highwater.toml", "up.sh"] {
        std::fs::copy(p.path(f), moved.path().join(f)).unwrap();
    }
    assert_eq!(status(moved.path()), id);
    p.write("up.sh", "set -eu\ntr a-z A-Z < \"$1\" > \"$2\" # edited\n");
    assert_ne!(status(p.dir.path()), id, "code file");
    let r = p.run_json(&[], 0);
    assert_eq!(stage(&r, "upper")["reasons"]["recipe"], 1);
    let with_cfg = upper_config("").replace(
        "files = [\"up.sh\"]",
        "files = [\"up.sh\"]\nconfig = { crs = \"EPSG:3857\" }",
    );
    p.write("highwater.toml", &with_cfg);
    let a = status(p.dir.path());
    p.write("highwater.toml", &with_cfg.replace("3857", "4326"));
    assert_ne!(status(p.dir.path()), a, "config table");
}
