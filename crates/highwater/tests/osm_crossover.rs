//! Issue 23: the rebuild crossover, measured. Every drain and rebuild
//! records its duration and size; `osm status` predicts the backlog's
//! drain time from the measured cost per dirty tile against the last
//! rebuild's time, and advises a rebuild once the backlog costs more; the
//! same numbers are on `/metrics`. The backlog is made larger than a
//! rebuild by a long new road (thousands of tiles outside Monaco's file).
//!
//! Data: crates/highwater-osm/tests/data (SOURCE.md there).

mod common;
use common::osm::{data, monaco_updates};
use common::*;
use std::io::{Read, Write};

const CONFIG: &str = r#"
[osm]
store = ".highwater/osm"

[osm.tiles.base]
zooms = "12-14"
keys = ["building", "highway", "landuse"]
mbtiles = "tiles/base.mbtiles"
drain = "deferred"
affected_guard = 0
"#;

fn base(p: &Project) -> serde_json::Value {
    let s = p.check(&["osm", "status", "--json"], 0).json();
    s["datasets"][0].clone()
}

/// A plain change file (not gzipped) with a new road from Monaco 40
/// degrees east: it dirties thousands of tiles at z12-14.
fn long_road(p: &Project) -> String {
    let f = p.path("road.osc");
    std::fs::write(
        &f,
        r#"<?xml version="1.0"?>
<osmChange version="0.6"><create>
<node id="90000000001" version="1" lat="43.7300000" lon="7.4200000"/>
<node id="90000000002" version="1" lat="43.7300000" lon="47.4200000"/>
<way id="90000000003" version="1"><nd ref="90000000001"/><nd ref="90000000002"/><tag k="highway" v="primary"/></way>
</create></osmChange>
"#,
    )
    .unwrap();
    f.display().to_string()
}

#[test]
fn a_backlog_larger_than_a_rebuild_flips_the_advice() {
    let p = Project::new(CONFIG);
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    p.check(&["osm", "tiles", "build"], 0);
    let upd = monaco_updates(&p, 48..=51);
    let one = |q: i64| upd.join(format!("{q:03}.osc.gz")).display().to_string();
    // Measured: a rebuild (the build), then a drain of three diffs.
    p.check(&["osm", "apply", &one(48), &one(49), &one(50)], 0);
    p.check(&["osm", "tiles", "drain"], 0);
    let c = &base(&p)["crossover"];
    assert!(c["last_rebuild_s"].as_f64().unwrap() > 0.0, "{c}");
    assert!(c["drain_s_per_unit"].as_f64().unwrap() > 0.0, "{c}");
    // (what makes the backlog, the advice then)
    let steps: [(&str, String, &str); 2] = [
        ("one minutely diff", one(51), "drain"),
        ("a road across 40 degrees", long_road(&p), "rebuild"),
    ];
    for (what, diff, want) in steps {
        p.check(&["osm", "apply", &diff], 0);
        let d = base(&p);
        let c = &d["crossover"];
        let (pred, rebuild) = (
            c["backlog_predicted_s"].as_f64().unwrap(),
            c["last_rebuild_s"].as_f64().unwrap(),
        );
        assert_eq!(c["advice"], want, "{what}: {d}");
        // The advice follows from the measured numbers status shows.
        assert_eq!(pred > rebuild, want == "rebuild", "{what}: {c}");
        let per = c["drain_s_per_unit"].as_f64().unwrap();
        let dirty = d["dirty"].as_f64().unwrap();
        assert!(
            (pred - per * dirty).abs() < 1e-9 * (1.0 + pred),
            "{what}: {c}"
        );
        if want == "rebuild" {
            assert!(d["rebuild"].as_str().unwrap().contains("predicted"), "{d}");
            let text = p.check(&["osm", "status"], 0).stdout;
            assert!(text.contains(": rebuild"), "{text}");
        }
    }
    // The same numbers on /metrics.
    let mut s = common::serve::serve(&p, &[]);
    let mut c = std::net::TcpStream::connect(&s.addr).unwrap();
    write!(
        c,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut m = String::new();
    c.read_to_string(&mut m).unwrap();
    for name in [
        "highwater_osm_drain_seconds",
        "highwater_osm_rebuild_seconds",
        "highwater_osm_backlog_predicted_seconds",
    ] {
        assert!(
            m.contains(&format!("{name}{{dataset=\"base\"}} ")),
            "{name}: {m}"
        );
    }
    assert_eq!(s.terminate(std::time::Duration::from_secs(30)), Some(0));
}

/// Issue 50: a drain that cleared too few units predicts nothing: status
/// (`--json`, text and `/`) says there is no prediction and why, and
/// advises no rebuild from it.
#[test]
fn a_prediction_needs_enough_measured_work_and_says_so() {
    let p = Project::new(&CONFIG.replace("zooms = \"12-14\"", "zooms = \"10-16\""));
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    p.check(&["osm", "tiles", "build"], 0);
    // The build makes 58 tiles at z10-16, so a prediction needs drains
    // that cleared 15; diffs 3048..3050 dirty 9.
    let upd = monaco_updates(&p, 48..=51);
    let one = |q: i64| upd.join(format!("{q:03}.osc.gz")).display().to_string();
    p.check(&["osm", "apply", &one(48), &one(49), &one(50)], 0);
    p.check(&["osm", "tiles", "drain"], 0);
    p.check(&["osm", "apply", &one(51)], 0);
    let d = base(&p);
    let c = &d["crossover"];
    assert!(c["last_rebuild_s"].as_f64().unwrap() > 0.0, "{c}");
    assert!(c["backlog_predicted_s"].is_null(), "{c}");
    assert!(c["advice"].is_null(), "{c}");
    let note = c["prediction_note"]
        .as_str()
        .unwrap_or_else(|| panic!("no note: {c}"));
    assert!(
        note.contains("not predicted") && note.contains("needs"),
        "{c}"
    );
    assert!(d["rebuild"].is_null(), "{d}");
    let text = p.check(&["osm", "status"], 0).stdout;
    assert!(text.contains("backlog not predicted"), "{text}");
    let s = common::serve::serve(&p, &[]);
    let (_, _, page) = common::serve::http(&s.addr, "GET", "/", &[]);
    assert!(String::from_utf8(page).unwrap().contains("prediction-note"));
}
