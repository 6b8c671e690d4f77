//! Issue 25: diffs on planet-like synthetic stores (highwater-osmgen). The
//! same diff on a small store and on a store 10x larger (the small world
//! is the larger one's shared region) expires the same tiles at every
//! zoom; after diffs at every zoom, `osm verify --all` equals a rebuild.

mod common;
use common::*;
use std::path::Path;

const SEED: u64 = 25;

/// Tiles at every zoom, of every key.
const CONFIG: &str = r#"
[osm]
store = ".highwater/osm"

[osm.tiles.t]
zooms = "0-14"
keys = ["*"]
mbtiles = "t.mbtiles"
drain_rebuild_share = 1000
tiles_affected_max = 1000000
"#;

fn write(path: &Path, f: impl FnOnce(&mut std::io::BufWriter<std::fs::File>)) {
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    f(&mut w);
    std::io::Write::flush(&mut w).unwrap();
}

/// A project with a world of `cities` imported.
fn world(cities: u64, config: &str) -> Project {
    let p = Project::new(config);
    let osm = p.path("world.osm");
    write(&osm, |w| {
        highwater_osmgen::World { seed: SEED, cities }
            .write_extract(w)
            .unwrap()
    });
    p.check(&["osm", "import", osm.to_str().unwrap()], 0);
    p
}

/// Writes the diff `diff_seed` of `changes` to the world of `cities` into
/// `name` in the project.
fn diff(p: &Project, cities: u64, changes: usize, diff_seed: u64, name: &str) -> String {
    let path = p.path(name);
    write(&path, |w| {
        highwater_osmgen::World { seed: SEED, cities }
            .diff(changes, diff_seed)
            .write(w)
            .unwrap()
    });
    path.to_string_lossy().into_owned()
}

/// Applies `osc` and returns the expired tiles, one `z/x/y` a line.
fn expired(p: &Project, osc: &str) -> Vec<String> {
    p.check(&["osm", "apply", osc, "--expire-output", "expire.txt"], 0);
    p.read("expire.txt").lines().map(str::to_string).collect()
}

#[test]
fn the_same_diff_on_a_small_and_a_10x_store_expires_the_same_tiles() {
    // No MBTiles: only the affected sets are compared.
    let config = CONFIG.replace("mbtiles = \"t.mbtiles\"\n", "");
    let small = world(3, &config);
    let large = world(30, &config);
    let a = expired(&small, &diff(&small, 3, 400, 1, "d.osc"));
    let b = expired(&large, &diff(&large, 3, 400, 1, "d.osc"));
    assert_eq!(a, b, "the same tiles, at every zoom");
    for z in 0..=14 {
        assert!(
            a.iter().any(|t| t.starts_with(&format!("{z}/"))),
            "zoom {z} is affected: {a:?}"
        );
    }
}

#[test]
fn verify_all_equals_a_rebuild_after_diffs_at_every_zoom() {
    let p = world(3, CONFIG);
    p.check(&["osm", "tiles", "build"], 0);
    for seed in 1..=3 {
        let osc = diff(&p, 3, 300, seed, &format!("d{seed}.osc"));
        let tiles = expired(&p, &osc);
        assert!(tiles.iter().any(|t| t.starts_with("0/")), "z0 affected");
    }
    let s = p.check(&["osm", "status", "--json"], 0).json();
    assert_eq!(s["datasets"][0]["dirty"], 0, "drained on apply: {s}");
    let v = p
        .check(&["osm", "verify", "t", "--all", "--json"], 0)
        .json();
    assert!(v["verify"]["checked"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["verify"]["differences"], serde_json::json!([]), "{v}");
}
