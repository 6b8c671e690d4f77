//! The OSM commands end to end on real data: import Monaco 3047, replicate
//! 3048..3076 from a local replication folder, markers, gaps, dry runs.

mod common;
use common::*;
use std::path::{Path, PathBuf};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../highwater-osm/tests/data")
}

const CONFIG: &str = r#"
[osm]
store = ".highwater/osm"

[osm.tiles.base]
zooms = "10-16"
keys = ["building", "highway", "landuse"]
buffer = 0.1
tiles_affected_max = 1000000
"#;

fn imported() -> Project {
    let p = Project::new(CONFIG);
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    let r = p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    assert!(r.stdout.contains("sequence 3047"), "{}", r.stdout);
    p
}

#[test]
fn replicate_monaco_3048_to_3076_moves_the_store_and_the_marker() {
    let p = imported();
    let from = data().join("monaco-updates");
    let r = p
        .check(
            &[
                "osm",
                "replicate",
                "--from",
                from.to_str().unwrap(),
                "--expire-output",
                "expire.txt",
                "--json",
            ],
            0,
        )
        .json();
    assert_eq!(r["diffs"], 29);
    assert_eq!(r["sequence"], 3076);
    let expire = p.read("expire.txt");
    let lines: Vec<&str> = expire.lines().collect();
    let mut sorted = lines.clone();
    sorted.sort_by_key(|l| {
        let v: Vec<u32> = l.split('/').map(|x| x.parse().unwrap()).collect();
        (v[0], v[1], v[2])
    });
    sorted.dedup();
    assert_eq!(lines, sorted, "sorted and unique");
    for z in 10..=16 {
        assert!(
            lines.iter().any(|l| l.starts_with(&format!("{z}/"))),
            "zoom {z} present: {expire}"
        );
    }
    let s = p.check(&["osm", "status", "--json"], 0).json();
    assert_eq!(s["sequence"], 3076);
    assert_eq!(s["timestamp"], "2021-08-30T20:21:43Z");
    assert_eq!(s["datasets"][0]["marker"], 3076);
    assert_eq!(s["datasets"][0]["gap"], 0);
    assert_eq!(s["datasets"][0]["dirty"], lines.len());
    // Nothing new: a second replicate applies nothing.
    let r = p
        .check(
            &[
                "osm",
                "replicate",
                "--from",
                from.to_str().unwrap(),
                "--json",
            ],
            0,
        )
        .json();
    assert_eq!(r["diffs"], 0);
}

#[test]
fn a_gap_in_the_replication_folder_is_refused() {
    let p = imported();
    let from = p.path("repl/000/003");
    std::fs::create_dir_all(&from).unwrap();
    for seq in [48, 50] {
        for ext in ["osc.gz", "state.txt"] {
            std::fs::copy(
                data().join(format!("monaco-updates/000/003/{seq:03}.{ext}")),
                from.join(format!("{seq:03}.{ext}")),
            )
            .unwrap();
        }
    }
    let r = p.check(
        &[
            "osm",
            "replicate",
            "--from",
            p.path("repl").to_str().unwrap(),
        ],
        2,
    );
    assert!(
        r.stderr.contains("gap") && r.stderr.contains("3049"),
        "{}",
        r.stderr
    );
    let s = p.check(&["osm", "status", "--json"], 0).json();
    assert_eq!(s["sequence"], 3047, "nothing applied");
}

#[test]
fn a_dry_run_changes_nothing_and_a_recipe_change_asks_for_a_rebuild() {
    let p = imported();
    let diff = data().join("monaco-updates/000/003/052.osc.gz");
    let r = p
        .check(
            &[
                "osm",
                "apply",
                diff.to_str().unwrap(),
                "--dry-run",
                "--json",
            ],
            0,
        )
        .json();
    assert_eq!(r["dry_run"], true);
    let s = p.check(&["osm", "status", "--json"], 0).json();
    assert_eq!(s["sequence"], 3047);
    assert_eq!(s["datasets"][0]["dirty"], 0);
    p.check(&["osm", "apply", diff.to_str().unwrap()], 0);
    let s = p.check(&["osm", "status", "--json"], 0).json();
    assert_eq!(
        s["sequence"], 3052,
        "the state file beside the diff names its sequence"
    );
    assert!(s["datasets"][0]["rebuild"].is_null());
    p.write(
        "highwater.toml",
        &CONFIG.replace("zooms = \"10-16\"", "zooms = \"10-17\""),
    );
    let s = p.check(&["osm", "status"], 0).stdout;
    assert!(s.contains("rebuild recommended: its recipe changed"), "{s}");
}

#[test]
fn a_malformed_diff_is_refused_and_the_store_untouched() {
    let p = imported();
    p.write(
        "bad.osc",
        "<osmChange>\n<modify>\n<node id=\"1\" lat=\"x\" lon=\"7\"/>\n</modify></osmChange>",
    );
    let r = p.check(&["osm", "apply", "bad.osc"], 2);
    assert!(r.stderr.contains("bad.osc:3: n1"), "{}", r.stderr);
    let s = p.check(&["osm", "status", "--json"], 0).json();
    assert_eq!(s["sequence"], 3047);
}
