//! Issue 10: Shortbread tiles that real readers read.
//! - MapLibre GL JS (vendored) in headless Chromium draws Monaco's tiles
//!   with the style `@versatiles/style` generates (vendored; served by
//!   `highwater serve` from the MBTiles, on loopback), and the pixels at
//!   known places have the style's colours for water, a street and a
//!   building; after a diff that adds a building and `osm apply`, the pixel
//!   there turns to the building colour.
//! - GDAL's MBTiles driver lists every Shortbread layer.

use std::path::Path;

mod common;
use common::osm::data;
use common::serve::{browser, serve};
use common::*;

const CONFIG: &str = r#"
[osm.tiles.base]
schema = "shortbread"
mbtiles = "tiles/base.mbtiles"
"#;

fn project() -> Project {
    let p = Project::new(CONFIG);
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    p.check(&["osm", "tiles", "build"], 0);
    p
}

/// The colours at each (lon, lat, zoom), as MapLibre draws them.
fn probe(addr: &str, png: &Path, places: &[(f64, f64, f64)]) -> Vec<[u8; 3]> {
    let q: Vec<String> = places
        .iter()
        .map(|(a, b, z)| format!("{a},{b},{z}"))
        .collect();
    let d = browser(
        &format!("http://{addr}/map?probe={}", q.join(";")),
        png,
        "document.body.dataset.probed || document.body.dataset.error",
        "JSON.stringify(document.body.dataset)",
    );
    assert!(d["error"].is_null(), "the map reported an error: {d}");
    let probes: Vec<[u8; 3]> = serde_json::from_str(d["probes"].as_str().unwrap()).unwrap();
    assert_eq!(probes.len(), places.len());
    probes
}

/// A colour of the vendored style, by style layer id and paint property.
fn style_colour(id: &str) -> [u8; 3] {
    let text = include_str!("../../highwater-serve/assets/versatiles-colorful.json");
    let s: serde_json::Value = serde_json::from_str(text).unwrap();
    let l = s["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["id"] == id)
        .unwrap_or_else(|| panic!("no style layer {id}"));
    let c = ["fill-color", "line-color", "background-color"]
        .iter()
        .find_map(|k| l["paint"][*k].as_str())
        .unwrap();
    let v: Vec<u8> = c
        .trim_start_matches("rgb(")
        .trim_end_matches(')')
        .split(',')
        .map(|x| x.trim().parse().unwrap())
        .collect();
    [v[0], v[1], v[2]]
}

fn near(a: [u8; 3], b: [u8; 3]) -> bool {
    a.iter().zip(b).all(|(x, y)| x.abs_diff(y) <= 10)
}

// Known places in Monaco 3047 (OSM way ids in the comments), picked inside
// each feature, away from its edges.
/// Inside a pond (natural=water, way 156242256).
const WATER: (f64, f64, f64) = (7.430964, 43.742985, 17.0);
/// On a primary road's line (way 4098197).
const STREET: (f64, f64, f64) = (7.430105, 43.745933, 16.0);
/// Inside a building near the Avenue Princesse Grace (way 94452680).
const BUILDING: (f64, f64, f64) = (7.43015, 43.74243, 17.0);
/// In a park where no building stands; the diff below adds one.
const NEW_BUILDING: (f64, f64, f64) = (7.42632, 43.74065, 17.0);

#[test]
fn issue10_maplibre_draws_shortbread_with_the_styles_colours() {
    let p = project();
    let s = serve(&p, &[]);
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("issue10-shortbread");
    std::fs::create_dir_all(&shots).unwrap();
    let got = probe(
        &s.addr,
        &shots.join("before.png"),
        &[WATER, STREET, BUILDING, NEW_BUILDING],
    );
    let (water, street, building) = (
        style_colour("water-area"),
        style_colour("street-primary"),
        style_colour("building"),
    );
    assert!(
        near(got[0], water),
        "water: {:?}, the style's {water:?}",
        got[0]
    );
    assert!(
        near(got[1], street),
        "street: {:?}, the style's {street:?}",
        got[1]
    );
    assert!(
        near(got[2], building),
        "building: {:?}, the style's {building:?}",
        got[2]
    );
    assert!(!near(got[3], building), "no building yet: {:?}", got[3]);

    // A diff adds a square building of about 20 m around NEW_BUILDING.
    let (lon, lat, _) = NEW_BUILDING;
    let d = 0.0001;
    let corners = [(-d, -d), (d, -d), (d, d), (-d, d)];
    let mut osc = String::from("<osmChange version=\"0.6\"><create>\n");
    for (i, (dx, dy)) in corners.iter().enumerate() {
        osc += &format!(
            "<node id=\"{}\" version=\"1\" lat=\"{:.7}\" lon=\"{:.7}\"/>\n",
            900_000_000_001_i64 + i as i64,
            lat + dy,
            lon + dx
        );
    }
    osc += "<way id=\"900000000001\" version=\"1\">";
    for i in [0, 1, 2, 3, 0] {
        osc += &format!("<nd ref=\"{}\"/>", 900_000_000_001_i64 + i);
    }
    osc += "<tag k=\"building\" v=\"yes\"/></way>\n</create></osmChange>\n";
    p.write("new-building.osc", &osc);
    p.check(
        &["osm", "apply", p.path("new-building.osc").to_str().unwrap()],
        0,
    );
    let after = probe(&s.addr, &shots.join("after.png"), &[NEW_BUILDING, STREET]);
    assert!(
        near(after[0], building),
        "the new building: {:?}, the style's {building:?}",
        after[0]
    );
    assert_eq!(after[1], got[1], "the street elsewhere is as it was");
    // And the drained file equals a rebuild.
    let v = p
        .check(&["osm", "verify", "base", "--all", "--json"], 0)
        .json();
    assert!(v["verify"]["checked"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["verify"]["differences"], serde_json::json!([]), "{v}");
}

#[test]
fn issue10_gdal_lists_every_shortbread_layer() {
    let p = project();
    let out = std::process::Command::new("ogrinfo")
        .args(["-ro", "-q"])
        .arg(p.path("tiles/base.mbtiles"))
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "ogrinfo is needed for this check ({e}); install Debian's gdal-bin (.ci/run does)"
            )
        });
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let listed: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_once(": ").map(|(_, name)| name.trim()))
        .filter(|n| !n.contains('='))
        .collect();
    let want = [
        "water_polygons",
        "water_polygons_labels",
        "water_lines",
        "water_lines_labels",
        "dam_lines",
        "dam_polygons",
        "pier_lines",
        "pier_polygons",
        "boundaries",
        "boundary_labels",
        "place_labels",
        "land",
        "sites",
        "buildings",
        "streets",
        "street_polygons",
        "streets_polygons_labels",
        "street_labels",
        "street_labels_points",
        "aerialways",
        "public_transport",
        "bridges",
        "ferries",
        "pois",
        "addresses",
    ];
    for w in want {
        assert!(listed.contains(&w), "GDAL does not list {w}: {text}");
    }
    // And reads features with typed fields from one of them.
    let out = std::process::Command::new("ogrinfo")
        .args(["-ro", "-al", "-so", "-oo", "ZOOM_LEVEL=14"])
        .arg(p.path("tiles/base.mbtiles"))
        .arg("streets")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("kind: String"), "{text}");
    assert!(text.contains("bridge: Integer(Boolean)"), "{text}");
    let count: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("Feature Count: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(count > 1000, "{text}");
}
