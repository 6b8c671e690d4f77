//! The OSM commands end to end on real data: import Monaco 3047, replicate
//! 3048..3076 from a local replication folder, markers, gaps, dry runs.

mod common;
use common::osm::*;
use common::*;

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
                "--geojson",
                "tiles.geojson",
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
    let g: serde_json::Value = serde_json::from_str(&p.read("tiles.geojson")).unwrap();
    assert_eq!(g["type"], "FeatureCollection");
    assert_eq!(g["features"].as_array().unwrap().len(), lines.len());
    let f = &g["features"][0];
    assert_eq!(f["geometry"]["type"], "Polygon");
    assert_eq!(
        format!(
            "{}/{}/{}",
            f["properties"]["z"], f["properties"]["x"], f["properties"]["y"]
        ),
        lines[0]
    );
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
    // The store is at 3047: 048 through 052 are its next five diffs.
    let diffs: Vec<String> = (48..=52)
        .map(|n| {
            data()
                .join(format!("monaco-updates/000/003/0{n}.osc.gz"))
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let mut args = vec!["osm", "apply"];
    args.extend(diffs.iter().map(String::as_str));
    let r = p
        .check(&[&args[..], &["--dry-run", "--json"]].concat(), 0)
        .json();
    assert_eq!(r["dry_run"], true);
    let s = p.check(&["osm", "status", "--json"], 0).json();
    assert_eq!(s["sequence"], 3047);
    assert_eq!(s["datasets"][0]["dirty"], 0);
    p.check(&args, 0);
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

/// Monaco 3047 plus 3048..3076 through `replicate` equals osmium's
/// apply-changes of the same files, element by element.
#[test]
fn replicated_store_equals_osmium_apply_changes() {
    let p = imported();
    let from = data().join("monaco-updates");
    p.check(&["osm", "replicate", "--from", from.to_str().unwrap()], 0);
    let theirs = osmium_applied(p.dir.path(), 3048..=3076);
    assert_same_elements(&store_canon(&p.path(".highwater/osm")), &theirs);
}

/// SIGKILL in the middle of a replicate (everything derived and written,
/// nothing committed): the store and the markers stay at 3047 together, and
/// the re-run dirties exactly the tiles a clean run does.
#[test]
fn a_killed_replicate_loses_no_affected_tile() {
    let from = data().join("monaco-updates");
    let clean = imported();
    clean.check(
        &[
            "osm",
            "replicate",
            "--from",
            from.to_str().unwrap(),
            "--expire-output",
            "e.txt",
        ],
        0,
    );
    let p = imported();
    let out = p
        .cmd(&["osm", "replicate", "--from", from.to_str().unwrap()])
        .env("HIGHWATER_FAILPOINT", "osm-before-commit")
        .output()
        .unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(9),
        "killed"
    );
    let s = p.check(&["osm", "status", "--json"], 0).json();
    assert_eq!(s["sequence"], 3047);
    assert!(s["datasets"][0]["marker"].is_null());
    assert_eq!(s["datasets"][0]["dirty"], 0);
    p.check(
        &[
            "osm",
            "replicate",
            "--from",
            from.to_str().unwrap(),
            "--expire-output",
            "e.txt",
        ],
        0,
    );
    assert_eq!(p.read("e.txt"), clean.read("e.txt"));
    let (a, b) = (
        p.check(&["osm", "status", "--json"], 0).json(),
        clean.check(&["osm", "status", "--json"], 0).json(),
    );
    assert_eq!(a, b);
}

const TWO_DATASETS: &str = r#"
[osm]
store = ".highwater/osm"

[osm.tiles.a]
zooms = "12-15"
keys = ["*"]
mbtiles = "a.mbtiles"
drain_rebuild_share = 1000

[osm.tiles.b]
zooms = "13-16"
keys = ["highway", "building"]
buffer = 0.1
diff_expire = true
mbtiles = "b.mbtiles"
drain_rebuild_share = 1000
"#;

fn built() -> Project {
    let p = Project::new(TWO_DATASETS);
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    let r = p.check(&["osm", "tiles", "build"], 0);
    assert!(
        r.stdout.contains("a: built") && r.stdout.contains("b: built"),
        "{}",
        r.stdout
    );
    p
}

fn dirty(p: &Project) -> (i64, i64) {
    let s = p.check(&["osm", "status", "--json"], 0).json();
    (
        s["datasets"][0]["dirty"].as_i64().unwrap(),
        s["datasets"][1]["dirty"].as_i64().unwrap(),
    )
}

/// One dataset failing to update does not stop the others: `a` fails (a
/// failpoint), `b` still re-cuts its tiles, the exit code says something
/// failed, and the next drain brings `a` level with a rebuild.
#[test]
fn one_dataset_failing_leaves_the_others_advancing() {
    let p = built();
    let from = data().join("monaco-updates");
    let out = p
        .cmd(&["osm", "replicate", "--from", from.to_str().unwrap()])
        .env("HIGHWATER_FAILPOINT", "fail-drain:a")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("a: dataset a: failed on purpose"), "{err}");
    let (a, b) = dirty(&p);
    assert!(a > 0, "a keeps its dirty tiles");
    assert_eq!(b, 0, "b advanced");
    p.check(&["osm", "verify", "b", "--all"], 0);
    // a is stale until drained; verify skips its dirty tiles and says so.
    let v = p
        .check(&["osm", "verify", "a", "--all", "--json"], 0)
        .json();
    assert_eq!(v["verify"]["dirty_skipped"], a);
    let r = p.check(&["osm", "tiles", "drain", "--dataset", "a"], 0);
    assert!(r.stdout.contains("backlog 0"), "{}", r.stdout);
    p.check(&["osm", "verify", "a", "--all"], 0);
}

/// SIGKILL in the middle of b's drain (a batch written to b's file, not yet
/// removed from b's dirty set), while a drains beside it: the store has the
/// diffs, whatever a finished agrees with its file, b's dirty set still has
/// the batch, and the next drain makes both equal to a rebuild.
#[test]
fn a_drain_killed_beside_another_loses_nothing_and_catches_up() {
    let p = built();
    let from = data().join("monaco-updates");
    let out = p
        .cmd(&["osm", "replicate", "--from", from.to_str().unwrap()])
        .env("HIGHWATER_FAILPOINT", "kill-drain-after-write:b")
        .output()
        .unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(9),
        "killed"
    );
    let s = p.check(&["osm", "status", "--json"], 0).json();
    assert_eq!(s["sequence"], 3076, "the store committed before draining");
    let (_, b) = dirty(&p);
    assert!(b > 0, "b's batch is still dirty");
    // Its clean tiles equal a rebuild's, however far its drain got.
    p.check(&["osm", "verify", "a", "--all"], 0);
    p.check(&["osm", "tiles", "drain"], 0);
    assert_eq!(dirty(&p), (0, 0));
    p.check(&["osm", "verify", "a", "--all"], 0);
    p.check(&["osm", "verify", "b", "--all"], 0);
}

/// `verify` finds a tile that was changed behind highwater's back, and
/// `rebuild` repairs it.
#[test]
fn verify_reports_a_tampered_tile_and_rebuild_repairs_it() {
    let p = built();
    let conn = rusqlite::Connection::open(p.path("b.mbtiles")).unwrap();
    let n = conn
        .execute(
            "UPDATE tiles SET tile_data = (SELECT tile_data FROM tiles ORDER BY zoom_level DESC, tile_column LIMIT 1)
             WHERE rowid = (SELECT rowid FROM tiles ORDER BY zoom_level, tile_column LIMIT 1)",
            [],
        )
        .unwrap();
    assert_eq!(n, 1);
    drop(conn);
    let v = p
        .check(&["osm", "verify", "b", "--all", "--json"], 1)
        .json();
    let diffs = v["verify"]["differences"].as_array().unwrap();
    assert_eq!(diffs.len(), 1, "{v}");
    assert!(diffs[0]["tile"].as_str().unwrap().starts_with("13/"));
    p.check(&["osm", "rebuild", "b"], 0);
    p.check(&["osm", "verify", "b", "--all"], 0);
}

const TILES_AND_AGGREGATES: &str = r#"
[osm]
store = ".highwater/osm"

[osm.tiles.t]
zooms = "13-15"
keys = ["*"]
mbtiles = "t.mbtiles"
drain_rebuild_share = 1000

[osm.aggregates.admin]
classes = ["building", "highway=*"]
admin_levels = [2, 8, 10]
"#;

/// `osm aggregates --json` rows have the documented shape; an aggregates
/// dataset failing leaves the tile dataset advancing, and catches up on the
/// next apply, equal to a rebuild.
#[test]
fn aggregates_rows_and_failure_isolation_across_kinds() {
    let p = Project::new(TILES_AND_AGGREGATES);
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    p.check(&["osm", "tiles", "build"], 0);
    p.check(&["osm", "rebuild", "admin"], 0);
    let rows = p.check(&["osm", "aggregates", "--json"], 0).json();
    let row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["area_osm_id"] == 2220206 && r["class"] == "building")
        .expect("Fontvieille's buildings");
    assert_eq!(row["area_osm_type"], "r");
    assert_eq!(row["area_name"], "Fontvieille");
    assert_eq!(row["admin_level"], 10);
    assert!(row["count"].as_i64().unwrap() > 10 && row["area_m2"].as_f64().unwrap() > 1000.0);
    assert!(row["length_m"].is_number());
    let from = data().join("monaco-updates");
    let out = p
        .cmd(&["osm", "replicate", "--from", from.to_str().unwrap()])
        .env("HIGHWATER_FAILPOINT", "fail-drain:admin")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let s = p.check(&["osm", "status", "--json"], 0).json();
    let by = |n: &str| {
        s["datasets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == n)
            .unwrap()
            .clone()
    };
    assert!(by("admin")["dirty"].as_i64().unwrap() > 0);
    assert_eq!(by("t")["dirty"], 0);
    p.check(&["osm", "verify", "t", "--all"], 0);
    // The next apply (an empty one is enough) brings admin current.
    p.write("empty.osc", "<osmChange version=\"0.6\"></osmChange>");
    p.check(&["osm", "apply", "empty.osc"], 0);
    p.check(&["osm", "verify", "admin"], 0);
}

/// `osm search QUERY --json` and `osm search --all --json` print documents
/// in the documented shape, context included, and stay equal to a rebuild
/// after the daily diffs.
#[test]
fn search_prints_documents_with_their_context() {
    let p = Project::new(
        r#"
[osm]
store = ".highwater/osm"

[osm.search.places]
index = "search"
"#,
    );
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    p.check(&["osm", "rebuild", "places"], 0);
    let hits = p
        .check(&["osm", "search", "Casino", "--limit", "3", "--json"], 0)
        .json();
    let hits = hits.as_array().unwrap();
    assert!(!hits.is_empty() && hits.len() <= 3);
    let h = &hits[0];
    for k in ["osm_type", "osm_id", "name", "street", "place", "admin"] {
        assert!(h.get(k).is_some(), "{k} in {h}");
    }
    assert!(["n", "w", "r"].contains(&h["osm_type"].as_str().unwrap()));
    let admin = h["admin"].as_object().unwrap();
    assert_eq!(admin.keys().collect::<Vec<_>>(), ["2", "4", "6", "8"]);
    let all = p.check(&["osm", "search", "--all", "--json"], 0).json();
    assert!(all.as_array().unwrap().len() > 2000);
    let from = data().join("monaco-updates");
    p.check(&["osm", "replicate", "--from", from.to_str().unwrap()], 0);
    p.check(&["osm", "verify", "places"], 0);
    // A query tantivy cannot parse is refused with the query named.
    let r = p.check(&["osm", "search", "name:(", "--json"], 2);
    assert!(r.stderr.contains("name:("), "{}", r.stderr);
}

/// An independent MBTiles and MVT reader, GDAL's (`ogrinfo`), reads the
/// file as it is: the layer, its fields, and a feature where it belongs.
#[test]
fn gdal_reads_the_mbtiles_file_as_is() {
    let p = built();
    let path = p.path("b.mbtiles");
    let ogr = |args: &[&str]| {
        let out = std::process::Command::new("ogrinfo")
            .args(["-ro"])
            .arg(&path)
            .args(args)
            .output()
            .unwrap_or_else(|e| {
                panic!("ogrinfo is needed for this check ({e}); install Debian's gdal-bin (.ci/run does)")
            });
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let info = ogr(&["-so", "-oo", "ZOOM_LEVEL=16", "b"]);
    assert!(info.contains("format=pbf"), "{info}");
    assert!(
        info.contains("highway: String") && info.contains("building: String"),
        "{info}"
    );
    let count: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("Feature Count: "))
        .and_then(|n| n.trim().parse().ok())
        .expect("a feature count");
    assert!(count > 1000, "{count}");
    // Boulevard Albert 1er, in Web Mercator metres: inside Monaco.
    let f = ogr(&["-oo", "ZOOM_LEVEL=16", "b", "-where", "highway = 'primary'"]);
    let line = f
        .lines()
        .find(|l| {
            l.trim_start().starts_with("LINESTRING")
                || l.trim_start().starts_with("MULTILINESTRING")
        })
        .expect("a primary road");
    let x: f64 = line
        .split(['(', ' ', ','])
        .filter_map(|t| t.parse().ok())
        .next()
        .unwrap();
    assert!((820_000.0..830_000.0).contains(&x), "{line}");
}

/// Issue 50: `osm apply FILE --sequence N` (a diff without a state file
/// whose result the operator vouches for) says the store is at N, and so
/// do status and every dataset's marker (no "gap 1": the sequence is
/// declared in the transaction that applies the diff); declaring a
/// sequence the store is already at applies nothing.
#[test]
fn apply_with_a_declared_sequence_reports_it_as_applied() {
    let p = imported();
    let osc = data().join("monaco-updates/000/003/048.osc.gz");
    std::fs::copy(&osc, p.path("048.osc.gz")).unwrap();
    let r = p.check(&["osm", "apply", "048.osc.gz", "--sequence", "3048"], 0);
    assert!(r.stdout.contains("now at sequence 3048"), "{}", r.stdout);
    let s = p.check(&["osm", "status", "--json"], 0).json();
    assert_eq!(s["sequence"], 3048, "{s}");
    assert!(s["unsequenced"].is_null(), "{s}");
    assert_eq!(s["datasets"][0]["marker"], 3048, "{s}");
    assert_eq!(s["datasets"][0]["gap"], 0, "{s}");
    let text = p.check(&["osm", "status"], 0).stdout;
    assert!(!text.contains("gap 1"), "{text}");
    // Declaring where the store already is: refused, nothing applied.
    p.write("empty.osc", "<osmChange version=\"0.6\"></osmChange>");
    let r = p.check(&["osm", "apply", "empty.osc", "--sequence", "3048"], 2);
    assert!(
        r.stderr.contains("already at sequence 3048"),
        "{}",
        r.stderr
    );
    let after = p.check(&["osm", "status", "--json"], 0).json();
    assert_eq!(after["sequence"], 3048);
    assert_eq!(after["datasets"][0]["marker"], 3048);
}

/// Issue 50: a drain that fails is shown on every surface (`osm status`,
/// `--json`, `/`, `/api/status`'s errors, `/metrics`) with its error until
/// a drain succeeds; then nowhere.
#[test]
fn a_failed_drain_is_shown_on_every_surface_until_one_succeeds() {
    let p = built();
    let from = data().join("monaco-updates");
    let out = p
        .cmd(&["osm", "replicate", "--from", from.to_str().unwrap()])
        .env("HIGHWATER_FAILPOINT", "fail-drain:a")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let failed = |p: &Project| {
        let s = p.check(&["osm", "status", "--json"], 0).json();
        let a = s["datasets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == "a")
            .unwrap()
            .clone();
        a["last_failed_drain"].clone()
    };
    let f = failed(&p);
    assert!(
        f["error"].as_str().unwrap().contains("failed on purpose"),
        "{f}"
    );
    assert!(f["at"].is_string(), "{f}");
    let text = p.check(&["osm", "status"], 0).stdout;
    assert!(
        text.contains("DRAIN FAILED") && text.contains("failed on purpose"),
        "{text}"
    );
    {
        let s = common::serve::serve(&p, &[]);
        let (_, _, body) = common::serve::http(&s.addr, "GET", "/api/status", &[]);
        let st: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let errors = st["errors"].to_string();
        assert!(
            errors.contains("osm dataset a: the last drain failed"),
            "{errors}"
        );
        let (_, _, page) = common::serve::http(&s.addr, "GET", "/", &[]);
        let page = String::from_utf8(page).unwrap();
        assert!(
            page.contains("drain-failed") && page.contains("failed on purpose"),
            "{page}"
        );
        let (_, _, m) = common::serve::http(&s.addr, "GET", "/metrics", &[]);
        let m = String::from_utf8(m).unwrap();
        assert!(
            m.contains("highwater_osm_drain_failed{dataset=\"a\"} 1"),
            "{m}"
        );
        assert!(
            m.contains("highwater_osm_drain_failed{dataset=\"b\"} 0"),
            "{m}"
        );
    }
    // A drain that succeeds ends it everywhere.
    p.check(&["osm", "tiles", "drain", "--dataset", "a"], 0);
    assert!(failed(&p).is_null());
    assert!(!p
        .check(&["osm", "status"], 0)
        .stdout
        .contains("DRAIN FAILED"));
    let s = common::serve::serve(&p, &[]);
    let (_, _, body) = common::serve::http(&s.addr, "GET", "/api/status", &[]);
    let st: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(st["errors"], serde_json::json!([]), "{st}");
    let (_, _, m) = common::serve::http(&s.addr, "GET", "/metrics", &[]);
    assert!(String::from_utf8(m)
        .unwrap()
        .contains("highwater_osm_drain_failed{dataset=\"a\"} 0"));
}

/// A JOSM-style change file: new objects with the editor's placeholder
/// ids (-1..-4), a way over three new nodes.
const JOSM: &str = r#"<?xml version="1.0"?>
<osmChange version="0.6" generator="JOSM"><create>
<node id="-1" version="0" lat="43.7301" lon="7.4201"/>
<node id="-2" version="0" lat="43.7302" lon="7.4202"/>
<node id="-3" version="0" lat="43.7303" lon="7.4203"><tag k="name" v="Placeholder"/></node>
<way id="-4" version="0"><nd ref="-1"/><nd ref="-2"/><nd ref="-3"/><tag k="highway" v="service"/></way>
</create></osmChange>
"#;

/// Issue 50: negative ids are refused everywhere (apply, on a store with
/// or without a flat node file, and import), naming the file and the first
/// id and saying what to do; nothing is applied.
#[test]
fn negative_ids_are_refused_naming_the_file_and_the_first_id() {
    let said = |stderr: &str, file: &str| {
        assert!(stderr.contains(file), "{stderr}");
        assert!(
            stderr.contains("n-1") && stderr.contains("id -1 is negative"),
            "{stderr}"
        );
        assert!(
            stderr.contains("JOSM") && stderr.contains("not a replication diff"),
            "{stderr}"
        );
    };
    let p = imported();
    p.write("josm.osc", JOSM);
    let r = p.check(&["osm", "apply", "josm.osc"], 2);
    said(&r.stderr, "josm.osc");
    let s = p.check(&["osm", "status", "--json"], 0).json();
    assert_eq!(s["sequence"], 3047, "{s}");
    assert!(s["unsequenced"].is_null(), "nothing applied: {s}");

    // A store with a flat node file: the same refusal, not another.
    let f = Project::new(
        r#"
[osm]
store = ".highwater/osm"
flat_nodes = "flat/nodes.flat"

[osm.tiles.base]
zooms = "12-14"
keys = ["highway"]
"#,
    );
    std::fs::create_dir_all(f.path("flat")).unwrap();
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    f.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    f.write("josm.osc", JOSM);
    let r = f.check(&["osm", "apply", "josm.osc"], 2);
    said(&r.stderr, "josm.osc");

    // An extract with them: refused at import, nothing created.
    let e = Project::new(CONFIG);
    e.write(
        "josm.osm",
        &JOSM
            .replace(
                "<osmChange version=\"0.6\" generator=\"JOSM\"><create>",
                "<osm version=\"0.6\" generator=\"JOSM\">",
            )
            .replace("</create></osmChange>", "</osm>"),
    );
    let r = e.check(&["osm", "import", "josm.osm"], 2);
    said(&r.stderr, "josm.osm");
    assert!(!e.path(".highwater/osm/store.db").exists());
}

/// Issue 50: `GET /api/aggregates/NAME` answers the rows `osm aggregates
/// --json` prints, from one committed state with the sequence it reflects,
/// filtered by `admin_level` and `class`; an unknown name is 404, a bad
/// filter 400.
#[test]
fn aggregates_over_http_equal_the_command_and_say_their_sequence() {
    let p = Project::new(TILES_AND_AGGREGATES);
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    p.check(&["osm", "tiles", "build"], 0);
    p.check(&["osm", "rebuild", "admin"], 0);
    let from = data().join("monaco-updates");
    p.check(&["osm", "replicate", "--from", from.to_str().unwrap()], 0);
    let rows = p
        .check(&["osm", "aggregates", "--dataset", "admin", "--json"], 0)
        .json();
    let s = common::serve::serve(&p, &[]);
    let get = |path: &str| {
        let (code, _, body) = common::serve::http(&s.addr, "GET", path, &[]);
        (code, body)
    };
    let (code, body) = get("/api/aggregates/admin");
    assert_eq!(code, 200);
    let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(doc["rows"], rows);
    assert_eq!(doc["sequence"], 3076, "{}", doc["sequence"]);
    assert_eq!(doc["dirty"], 0);
    assert!(rows.as_array().unwrap().len() > 10);
    // Filtered as asked: the same rows as filtering the command's.
    for (q, level, class) in [
        ("?admin_level=10&class=building", Some(10), Some("building")),
        (
            "?class=highway%3Dresidential",
            None,
            Some("highway=residential"),
        ),
        ("?admin_level=10", Some(10), None),
    ] {
        let (code, body) = get(&format!("/api/aggregates/admin{q}"));
        assert_eq!(code, 200, "{q}");
        let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let want: Vec<&serde_json::Value> = rows
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| level.is_none_or(|l| r["admin_level"] == l))
            .filter(|r| class.is_none_or(|c| r["class"] == c))
            .collect();
        assert!(!want.is_empty(), "{q}");
        assert_eq!(doc["rows"], serde_json::json!(want), "{q}");
    }
    // Monaco's areas are all admin_level 10: none at 2.
    let (code, body) = get("/api/aggregates/admin?admin_level=2");
    assert_eq!(code, 200);
    let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(doc["rows"], serde_json::json!([]));
    assert_eq!(get("/api/aggregates/nope").0, 404);
    assert_eq!(get("/api/aggregates/admin?admin_level=x").0, 400);
}

/// Issue 50: the sequence `/api/aggregates` says is the one its totals
/// reflect. After diffs whose aggregates drain failed, the marker stands at
/// the last diff (the dirty set records it) while the totals are still the
/// rebuild's: the answer says the rebuild's sequence, with the dirty keys,
/// until a drain brings both to the last diff.
#[test]
fn aggregates_over_http_say_the_sequence_their_totals_reflect_not_the_marker() {
    let p = Project::new(TILES_AND_AGGREGATES);
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    p.check(&["osm", "tiles", "build"], 0);
    p.check(&["osm", "rebuild", "admin"], 0);
    let from = data().join("monaco-updates");
    let out = p
        .cmd(&["osm", "replicate", "--from", from.to_str().unwrap()])
        .env("HIGHWATER_FAILPOINT", "fail-drain:admin")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let s = common::serve::serve(&p, &[]);
    let doc = |s: &common::serve::Served| -> serde_json::Value {
        let (code, _, body) = common::serve::http(&s.addr, "GET", "/api/aggregates/admin", &[]);
        assert_eq!(code, 200);
        serde_json::from_slice(&body).unwrap()
    };
    let before = doc(&s);
    assert!(before["dirty"].as_u64().unwrap() > 0, "{}", before["dirty"]);
    assert_eq!(before["sequence"], 3047, "the totals are the rebuild's");
    let rows = p
        .check(&["osm", "aggregates", "--dataset", "admin", "--json"], 0)
        .json();
    assert_eq!(before["rows"], rows);
    p.check(&["osm", "drain", "admin"], 0);
    let after = doc(&s);
    assert_eq!(after["sequence"], 3076);
    assert_eq!(after["dirty"], 0);
}
