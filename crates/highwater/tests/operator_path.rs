//! Issue 9: every ordinary operator mistake and cron overlap that used to
//! lose outputs or leave data stale with exit 0 is refused or handled. One
//! test per numbered failure of the issue, named after it; each failed on
//! main at 3c2b27a.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Stdio;

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../highwater-osm/tests/data")
}

fn updates(seq: u32) -> PathBuf {
    data().join(format!("monaco-updates/000/003/{:03}.osc.gz", seq - 3000))
}

const OSM: &str = r#"
[osm]
store = ".highwater/osm"

[osm.tiles.base]
zooms = "12-15"
keys = ["building", "highway"]
mbtiles = "base.mbtiles"
drain_rebuild_share = 1000

[osm.search.places]
index = "search-index"
"#;

/// Monaco 3047 imported, tiles built and the search index rebuilt.
fn osm_project() -> Project {
    let p = Project::new(OSM);
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    p.check(&["osm", "tiles", "build"], 0);
    p.check(&["osm", "rebuild", "places"], 0);
    p
}

fn status(p: &Project) -> serde_json::Value {
    p.check(&["osm", "status", "--json"], 0).json()
}

/// Every dataset equals its rebuild.
fn all_verified(p: &Project) {
    p.check(&["osm", "verify", "base", "--all"], 0);
    p.check(&["osm", "verify", "places"], 0);
}

fn refused(r: &Ran, words: &[&str]) {
    assert_eq!(r.code, 2, "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    for w in words {
        assert!(r.stderr.contains(w), "{w:?} not in:\n{}", r.stderr);
    }
}

fn write_state(dir: &Path, rel: &str, seq: i64) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(
        p,
        format!("sequenceNumber={seq}\ntimestamp=2021-08-02T20\\:21\\:02Z\n"),
    )
    .unwrap();
}

// 1. An input folder that comes back empty deletes every output.
#[test]
fn issue9_1_an_empty_input_folder_is_refused_and_no_output_deleted() {
    let p = Project::new(&upper_config(""));
    for i in 0..20 {
        p.write(&format!("data/f{i}.txt"), &format!("file {i}"));
    }
    p.check(&["run"], 0);
    let before = p.tree("out");
    assert_eq!(before.len(), 20);
    std::fs::remove_dir_all(p.path("data")).unwrap();
    std::fs::create_dir(p.path("data")).unwrap();
    let r = p.hw(&["run"]);
    refused(&r, &["deleted 20", "unmounted"]);
    assert_eq!(p.tree("out"), before, "no output was deleted");
    // A single-input stage losing its input is refused too.
    let q = Project::new(&upper_config(""));
    q.write("data/only.txt", "x");
    q.check(&["run"], 0);
    std::fs::remove_file(q.path("data/only.txt")).unwrap();
    refused(&q.hw(&["run"]), &["unmounted"]);
    assert!(q.exists("out/only.txt.upper"));
    // --force says it is real.
    q.check(&["run", "--force"], 0);
    assert!(!q.exists("out/only.txt.upper"));
}

// 2. A rebuild or tiles build while replicate applies diffs lost the dirty
//    set; two replicates both applied the same diffs.
#[test]
fn issue9_2_overlapping_writers_are_fenced_and_every_dataset_stays_current() {
    let p = osm_project();
    let from = data().join("monaco-updates");
    // The replicate holds its lease while this gate exists: the refusals
    // below never race its finishing.
    let gate = p.path("hold-the-lease");
    std::fs::write(&gate, "").unwrap();
    let slow = p
        .cmd(&["osm", "replicate", "--from", from.to_str().unwrap()])
        .env("HIGHWATER_FAILPOINT", "osm-slow-commit")
        .env("HIGHWATER_FAILPOINT_GATE", &gate)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the slow replicate holds the lease.
    let t0 = std::time::Instant::now();
    loop {
        let s = status(&p);
        if s["writer"].is_object() {
            break;
        }
        assert!(
            t0.elapsed().as_secs() < 60,
            "the replicate never took the lease"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for args in [
        vec!["osm", "rebuild", "base"],
        vec!["osm", "tiles", "build"],
        vec!["osm", "tiles", "drain"],
        vec!["osm", "rebuild", "places"],
        vec!["osm", "replicate", "--from", from.to_str().unwrap()],
    ] {
        let r = p.hw(&args);
        refused(&r, &["another process writes it", "pid"]);
    }
    std::fs::remove_file(&gate).unwrap();
    // With --wait, a rebuild runs after the replicate, on its result.
    p.check(&["osm", "rebuild", "base", "--wait"], 0);
    let out = slow.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = status(&p);
    assert_eq!(s["sequence"], 3076);
    assert!(s["writer"].is_null(), "the lease is released");
    all_verified(&p);
    // A second replicate finds nothing left to apply.
    let r = p.check(
        &[
            "osm",
            "replicate",
            "--from",
            from.to_str().unwrap(),
            "--json",
        ],
        0,
    );
    let first: serde_json::Value = serde_json::from_str(r.stdout.lines().next().unwrap()).unwrap();
    assert_eq!(first["diffs"], 0);
}

// 3. `osm apply` took a diff whose sequence is not the store's next.
#[test]
fn issue9_3_a_diff_out_of_sequence_is_refused() {
    let p = osm_project();
    let ahead = updates(3052);
    refused(
        &p.hw(&["osm", "apply", ahead.to_str().unwrap()]),
        &["3052", "3048..3051 are missing"],
    );
    assert_eq!(status(&p)["sequence"], 3047);
    for s in 3048..=3052 {
        p.check(&["osm", "apply", updates(s).to_str().unwrap()], 0);
    }
    refused(
        &p.hw(&["osm", "apply", updates(3050).to_str().unwrap()]),
        &["already at 3052"],
    );
    assert_eq!(status(&p)["sequence"], 3052);
    // A diff without a state file is applied, and recorded as such.
    let tmp = tempfile::tempdir().unwrap();
    let bare = tmp.path().join("edit.osc.gz");
    std::fs::copy(updates(3053), &bare).unwrap();
    p.check(&["osm", "apply", bare.to_str().unwrap()], 0);
    let s = status(&p);
    assert_eq!(s["unsequenced"], 1);
    let text = p.check(&["osm", "status"], 0).stdout;
    assert!(
        text.contains("no longer follows a replication sequence"),
        "{text}"
    );
    refused(
        &p.hw(&["osm", "apply", updates(3054).to_str().unwrap()]),
        &["no longer follows a replication sequence"],
    );
    all_verified(&p);
}

// 4. A missing --config, a missing or empty store, an ignored --store.
#[test]
fn issue9_4_nothing_is_created_by_accident() {
    let p = osm_project();
    refused(
        &p.hw(&["--config", "typo.toml", "osm", "status"]),
        &["typo.toml", "does not exist"],
    );
    refused(
        &p.hw(&["osm", "status", "--store", "typo"]),
        &["no OSM store at typo", "osm import"],
    );
    assert!(!p.exists("typo"), "nothing was created");
    refused(
        &p.hw(&["osm", "rebuild", "places", "--store", "typo"]),
        &["no OSM store"],
    );
    // The search index was not rebuilt from an empty store.
    let all = p.check(&["osm", "search", "--all", "--json"], 0).json();
    let n = all
        .as_array()
        .or_else(|| all["hits"].as_array())
        .map_or(0, Vec::len);
    assert!(n > 100, "{n} documents");
    // `osm search` reads no store: --store is not a flag of it.
    assert_eq!(p.hw(&["osm", "search", "x", "--store", "s"]).code, 2);
    // A zero-byte store is not recreated.
    let q = Project::new(OSM);
    q.write(".highwater/osm/store.db", "");
    refused(&q.hw(&["osm", "status"]), &["empty (0 bytes)"]);
    refused(&q.hw(&["osm", "tiles", "build"]), &["empty (0 bytes)"]);
    assert_eq!(
        std::fs::metadata(q.path(".highwater/osm/store.db"))
            .unwrap()
            .len(),
        0
    );
}

// 5. An unwritable --expire-output failed after the diffs were committed.
#[test]
fn issue9_5_the_expire_list_is_durable_before_the_store_commits() {
    let p = osm_project();
    let from = data().join("monaco-updates");
    let r = p.hw(&[
        "osm",
        "replicate",
        "--from",
        from.to_str().unwrap(),
        "--expire-output",
        "missing-dir/expire.txt",
    ]);
    refused(&r, &["missing-dir/expire.txt", "nothing was applied"]);
    assert_eq!(status(&p)["sequence"], 3047, "nothing was applied");
    p.check(
        &[
            "osm",
            "replicate",
            "--from",
            from.to_str().unwrap(),
            "--expire-output",
            "expire.txt",
        ],
        0,
    );
    assert!(p.read("expire.txt").lines().count() > 0);
    assert_eq!(status(&p)["sequence"], 3076);
}

// 6. Paths that collide destroy data.
#[test]
fn issue9_6_colliding_places_are_refused_at_config_load() {
    let cases: &[(&str, &[&str])] = &[
        (
            "[osm]\nstore = \"s\"\n[osm.tiles.t]\nzooms = \"12-14\"\nmbtiles = \"s/store.db\"\n",
            &["the OSM store", "[osm.tiles.t] mbtiles"],
        ),
        (
            "[osm]\nstore = \"s\"\n[osm.search.q]\nindex = \"s\"\n",
            &["the OSM store", "[osm.search.q] index"],
        ),
        (
            "[osm]\n[osm.tiles.t]\nzooms = \"12-14\"\nmbtiles = \"highwater.toml\"\n",
            &["the config file", "mbtiles"],
        ),
        (
            "[osm]\nstore = \".highwater\"\n",
            &["the state store", "the OSM store"],
        ),
    ];
    for (config, words) in cases {
        let p = Project::new(config);
        p.write("s/store.db", "not to be touched");
        let r = p.hw(&["osm", "tiles", "build"]);
        refused(&r, words);
        assert_eq!(p.read("s/store.db"), "not to be touched");
        assert!(p.read("highwater.toml").starts_with("[osm]"));
    }
    // A stage whose output renders onto its own input.
    let p = Project::new(
        "[stages.s]\ninputs = [\"data/*.txt\"]\noutput = \"data/{name}\"\ncommand = [\"sh\", \"up.sh\", \"{input}\", \"{output}\"]\n",
    );
    p.write("data/a.txt", "keep me");
    refused(&p.hw(&["run"]), &["data/a.txt", "overwrite the input"]);
    assert_eq!(p.read("data/a.txt"), "keep me");
    // A stage whose inputs include its own outputs.
    let p = Project::new(
        "[stages.s]\ninputs = [\"**\"]\noutput = \"out/{relpath}\"\ncommand = [\"sh\", \"up.sh\", \"{input}\", \"{output}\"]\n",
    );
    p.write("a.txt", "a");
    p.check(&["run", "--force"], 0);
    refused(&p.hw(&["run"]), &["one of the stage's own outputs"]);
    assert!(!p.exists("out/out"), "no out/out/... grew");
}

// 7. `osm import` merged into a non-empty store; importing an .osc.
#[test]
fn issue9_7_import_only_into_an_empty_place_or_with_replace() {
    let p = osm_project();
    let older = data().join("monaco-2787-20201109.osm.pbf");
    refused(
        &p.hw(&["osm", "import", older.to_str().unwrap()]),
        &["already holds data", "--replace"],
    );
    assert_eq!(status(&p)["sequence"], 3047);
    refused(
        &p.hw(&["osm", "import", updates(3048).to_str().unwrap()]),
        &["change file"],
    );
    p.check(&["osm", "import", older.to_str().unwrap(), "--replace"], 0);
    let s = status(&p);
    assert_eq!(s["sequence"], 2787);
    // The replaced store holds exactly the older snapshot: the datasets
    // are rebuilt from it and verify.
    p.check(&["osm", "tiles", "build"], 0);
    p.check(&["osm", "rebuild", "places"], 0);
    all_verified(&p);
    let leftovers: Vec<_> = std::fs::read_dir(p.path(".highwater"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("hw-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

// 8. Replication stalled or jumped silently.
#[test]
fn issue9_8_replication_never_jumps_or_stalls_silently() {
    let p = osm_project();
    // A state file whose sequence disagrees with its path.
    let bad = tempfile::tempdir().unwrap();
    let dir = bad.path().join("000/003");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(updates(3048), dir.join("048.osc.gz")).unwrap();
    write_state(bad.path(), "000/003/048.state.txt", 3060);
    refused(
        &p.hw(&["osm", "replicate", "--from", bad.path().to_str().unwrap()]),
        &["sequenceNumber=3060", "says 3048"],
    );
    assert_eq!(status(&p)["sequence"], 3047);
    // A gap across a folder boundary.
    let gap = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(gap.path().join("000/003")).unwrap();
    std::fs::create_dir_all(gap.path().join("000/004")).unwrap();
    std::fs::copy(updates(3048), gap.path().join("000/003/048.osc.gz")).unwrap();
    write_state(gap.path(), "000/003/048.state.txt", 3048);
    std::fs::copy(updates(3049), gap.path().join("000/004/000.osc.gz")).unwrap();
    write_state(gap.path(), "000/004/000.state.txt", 4000);
    refused(
        &p.hw(&["osm", "replicate", "--from", gap.path().to_str().unwrap()]),
        &["gap", "3049", "4000"],
    );
    assert_eq!(status(&p)["sequence"], 3047, "nothing applied");
    // A --from folder that does not exist.
    refused(
        &p.hw(&["osm", "replicate", "--from", "no/such/folder"]),
        &["no/such/folder", "does not exist"],
    );
}

// 9. Smaller holes that still left data wrong.
#[test]
fn issue9_9_an_idle_replicate_keeps_the_markers() {
    let p = osm_project();
    let from = data().join("monaco-updates");
    p.check(&["osm", "replicate", "--from", from.to_str().unwrap()], 0);
    p.check(&["osm", "replicate", "--from", from.to_str().unwrap()], 0);
    let s = status(&p);
    for d in s["datasets"].as_array().unwrap() {
        assert_eq!(d["marker"], 3076, "{d}");
    }
}

#[test]
fn issue9_9_a_closed_stdout_still_drains_every_dataset() {
    let p = osm_project();
    let from = data().join("monaco-updates");
    let mut child = p
        .cmd(&["osm", "replicate", "--from", from.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The reader goes away before anything is printed, as `| head -0`.
    drop(child.stdout.take());
    let st = child.wait().unwrap();
    assert!(st.success(), "{st:?}");
    let s = status(&p);
    for d in s["datasets"].as_array().unwrap() {
        assert_eq!(d["dirty"], 0, "{d}");
    }
    all_verified(&p);
}

#[test]
fn issue9_9_empty_extracts_and_huge_ids_are_refused() {
    let p = Project::new(OSM);
    p.write("empty.osm.pbf", "");
    refused(
        &p.hw(&["osm", "import", "empty.osm.pbf"]),
        &["empty.osm.pbf", "empty (0 bytes)"],
    );
    assert!(!p.exists(".highwater/osm/store.db"));
    p.write(
        "huge.osm",
        &format!(
            "<osm version=\"0.6\">\n<node id=\"{}\" lat=\"43.7\" lon=\"7.4\"><tag k=\"name\" v=\"x\"/></node>\n</osm>\n",
            i64::MAX - 3
        ),
    );
    refused(
        &p.hw(&["osm", "import", "huge.osm"]),
        &["huge.osm:2", "2^60"],
    );
    let q = osm_project();
    q.write(
        "huge.osc",
        &format!(
            "<osmChange version=\"0.6\">\n<create>\n<node id=\"{}\" lat=\"43.73\" lon=\"7.42\"><tag k=\"building\" v=\"yes\"/></node>\n</create>\n</osmChange>\n",
            i64::MAX - 3
        ),
    );
    refused(
        &q.hw(&["osm", "apply", "huge.osc"]),
        &["huge.osc:3", "2^60"],
    );
    // An extract given as a diff names what it is.
    let pbf_as_osm = q.path("extract.osm");
    std::fs::write(
        &pbf_as_osm,
        "<osm version=\"0.6\">\n<node id=\"1\" lat=\"1\" lon=\"1\"/>\n</osm>\n",
    )
    .unwrap();
    refused(
        &q.hw(&["osm", "apply", "extract.osm"]),
        &["extract.osm:1", "osm import"],
    );
}

#[test]
fn issue9_9_temp_files_of_killed_builds_are_swept() {
    let p = osm_project();
    p.write(".base.mbtiles.hw-tmp-999999", "left by a killed build");
    p.write(".search-index.hw-tmp-999999/x", "left by a killed rebuild");
    p.check(&["osm", "tiles", "build"], 0);
    p.check(&["osm", "rebuild", "places"], 0);
    assert!(!p.exists(".base.mbtiles.hw-tmp-999999"));
    assert!(!p.exists(".search-index.hw-tmp-999999"));
}

#[test]
fn issue9_9_an_aggregate_waits_while_an_upstream_item_fails() {
    let p = Project::new(
        r#"
[stages.up]
inputs = ["data/*.txt"]
output = "out/{name}"
command = ["sh", "up.sh", "{input}", "{output}"]

[stages.sum]
inputs = ["out/*"]
output = "sum/all.txt"
command = ["sh", "-c", "cat \"$@\" > \"$0\"", "{output}", "{inputs}"]
"#,
    );
    p.write(
        "up.sh",
        "set -eu\nif grep -q FAIL \"$1\"; then exit 3; fi\ntr 'a-z' 'A-Z' < \"$1\" > \"$2\"\n",
    );
    p.write("data/a.txt", "a\n");
    p.write("data/b.txt", "FAIL\n");
    let r = p.run_json(&[], 1);
    assert!(stage(&r, "sum")["blocked"]
        .as_str()
        .unwrap()
        .contains("`up`"));
    assert!(
        !p.exists("sum/all.txt"),
        "no aggregate from part of its inputs"
    );
    p.write("data/b.txt", "b\n");
    p.run_json(&[], 0);
    assert_eq!(p.read("sum/all.txt"), "A\nB\n");
}

// 11. Messages that mislead.
#[test]
fn issue9_11_messages_name_their_path_and_say_what_to_do() {
    let p = Project::new(&upper_config(""));
    p.write("data/a.txt", "a");
    p.check(&["run"], 0);
    refused(
        &p.hw(&["state", "export", "--output", "missing/x.json"]),
        &["missing/x.json"],
    );
    // A corrupt state database names the way out.
    std::fs::write(p.path(".highwater/state.db"), vec![7u8; 8192]).unwrap();
    let _ = std::fs::remove_file(p.path(".highwater/state.db-wal"));
    let r = p.hw(&["status"]);
    refused(&r, &["restore it", "adopt"]);
    // A template error is said once.
    let q = Project::new(
        "[stages.s]\ninputs = [\"data/*\"]\noutput = \"out/{nope}\"\ncommand = [\"sh\", \"up.sh\", \"{input}\", \"{output}\"]\n",
    );
    let r = q.hw(&["plan"]);
    refused(&r, &["{nope}"]);
    assert_eq!(
        r.stderr.matches("unknown placeholder").count(),
        1,
        "{}",
        r.stderr
    );
    // An output root that is the project folder is named as `.`.
    let q = Project::new(
        "[stages.s]\ninputs = [\"data/*\"]\noutput = \".\"\ncommand = [\"sh\", \"up.sh\", \"{input}\", \"{output}\"]\n",
    );
    refused(&q.hw(&["plan"]), &["output root `.`"]);
    // Search and aggregates datasets have dirty keys, not tiles.
    let o = osm_project();
    let text = o.check(&["osm", "status"], 0).stdout;
    let places = text.lines().find(|l| l.contains("places:")).unwrap();
    assert!(places.contains("dirty keys"), "{text}");
    // --limit 0 is refused; so is --from after --to.
    assert_eq!(o.hw(&["osm", "search", "x", "--limit", "0"]).code, 2);
    let i = Project::new(
        "[sources.s]\nkind = \"sqlite\"\npath = \"db.sqlite\"\ntable = \"t\"\nkey = [\"id\"]\nmode = \"updated_at\"\ninterval = \"1h\"\nstart = \"2026-01-01T00:00:00Z\"\ncursor = \"ts\"\noutput = \"land/s/{date}/{hour}\"\n",
    );
    let r = i.hw(&[
        "ingest",
        "s",
        "--from",
        "2026-01-02T00:00:00Z",
        "--to",
        "2026-01-01T00:00:00Z",
    ]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("is not before --to"), "{}", r.stderr);
    // Every flag has help text.
    for args in [
        vec!["osm", "apply", "--help"],
        vec!["osm", "replicate", "--help"],
        vec!["osm", "tiles", "drain", "--help"],
        vec!["run", "--help"],
        vec!["ingest", "--help"],
    ] {
        let h = p.check(&args, 0).stdout;
        let lines: Vec<&str> = h.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let t = line.trim_start();
            if !(t.starts_with("--") || t.starts_with("-h")) {
                continue;
            }
            // Text on the flag's line (after two spaces), or on the next.
            let same = t
                .split_once("  ")
                .is_some_and(|(_, rest)| !rest.trim().is_empty());
            let next = lines.get(i + 1).is_some_and(|n| {
                let n = n.trim_start();
                !n.is_empty() && !n.starts_with('-')
            });
            assert!(same || next, "{args:?}: {line:?} has no help text");
        }
    }
}

// 2, again: rounds of replicate, rebuilds, builds and drains started at
// once (as overlapping cron jobs), each waiting for the writer lease. Every
// command succeeds, and every dataset then equals its rebuild.
#[test]
fn issue9_2_overlapping_cron_jobs_end_current() {
    let p = osm_project();
    let mirror = tempfile::tempdir().unwrap();
    let dir = mirror.path().join("000/003");
    std::fs::create_dir_all(&dir).unwrap();
    let from = mirror.path().to_str().unwrap().to_string();
    let mut next = 3048;
    for round in 0..4 {
        // The mirror grows by a few diffs, as a replication folder does.
        for _ in 0..4 {
            let src = updates(next);
            std::fs::copy(&src, dir.join(src.file_name().unwrap())).unwrap();
            let st = src.with_file_name(format!("{:03}.state.txt", next - 3000));
            std::fs::copy(&st, dir.join(st.file_name().unwrap())).unwrap();
            next += 1;
        }
        let jobs: Vec<Vec<&str>> = vec![
            vec!["osm", "replicate", "--from", &from, "--wait"],
            vec!["osm", "rebuild", "base", "--wait"],
            vec!["osm", "tiles", "drain", "--wait"],
            vec!["osm", "rebuild", "places", "--wait"],
            vec!["osm", "replicate", "--from", &from, "--wait"],
            vec!["osm", "tiles", "build", "--wait"],
        ];
        // Each round starts the jobs in another order.
        let mut order: Vec<usize> = (0..jobs.len()).collect();
        order.rotate_left(round);
        let children: Vec<_> = order
            .iter()
            .map(|&i| {
                let c = p
                    .cmd(&jobs[i])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap();
                (i, c)
            })
            .collect();
        for (i, c) in children {
            let out = c.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "round {round}: {:?}: {}",
                jobs[i],
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let s = status(&p);
        assert_eq!(s["sequence"], next - 1, "round {round}");
        all_verified(&p);
    }
}
