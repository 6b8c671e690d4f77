//! Issue 25: a map a person would use, in headless Chromium over Monaco's
//! Shortbread tiles served by `highwater serve` on loopback.
//! - Labels: place, street and POI names drawn with glyphs the server
//!   itself hands out (`/glyphs/...`): pixels around a label's anchor, or
//!   along a street name's line, change when the symbol layers are hidden.
//! - The view opens where the data is, not on the bounds one long feature
//!   stretches; a URL hash (`#zoom/lat/lon`) opens a view and follows the map.

use std::path::{Path, PathBuf};

mod common;
use common::front::relay;
use common::osm::data;
use common::serve::{browser, serve};
use common::*;

const CONFIG: &str = r#"
[osm.tiles.base]
schema = "shortbread"
mbtiles = "tiles/base.mbtiles"
"#;

fn monaco() -> Project {
    let p = Project::new(CONFIG);
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    p.check(&["osm", "tiles", "build"], 0);
    p
}

fn shots(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("map-page");
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// The page's `body.dataset` once it has read what `?labels` or probes ask.
fn open(addr: &str, path_and_hash: &str, png: &str) -> serde_json::Value {
    let d = browser(
        &format!("http://{addr}{path_and_hash}"),
        &shots(png),
        "document.body.dataset.probed || document.body.dataset.error",
        "JSON.stringify(document.body.dataset)",
    );
    assert!(d["error"].is_null(), "the map reported an error: {d}");
    d
}

fn json_of(d: &serde_json::Value, key: &str) -> serde_json::Value {
    serde_json::from_str(d[key].as_str().unwrap_or_else(|| panic!("no {key}: {d}"))).unwrap()
}

/// (status line, headers and body) of a GET, as raw bytes.
fn get(addr: &str, path: &str) -> (String, String, Vec<u8>) {
    let raw = relay(&format!("http://{addr}"), path);
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status = head.lines().next().unwrap().to_string();
    (status, head, raw[split + 4..].to_vec())
}

#[test]
fn map_labels_are_drawn_with_the_servers_own_glyphs() {
    let p = monaco();
    let s = serve(&p, &[]);

    // The style asks for glyphs here and for nothing elsewhere.
    let (st, _, body) = get(&s.addr, "/tiles/base/style.json");
    assert!(st.contains(" 200"), "{st}");
    let style: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(style["glyphs"], "/glyphs/{fontstack}/{range}.pbf");
    // Nothing to load from elsewhere (the metadata's licence link is text).
    let mut loads = style.clone();
    loads.as_object_mut().unwrap().remove("metadata");
    assert!(!loads.to_string().contains("://"), "{loads}");
    // What the glyph route answers: (path, status, gzipped).
    let cases = [
        ("/glyphs/noto_sans_regular/0-255.pbf", " 200", true),
        ("/glyphs/noto_sans_bold/256-511.pbf", " 200", true),
        // A range not shipped: an empty, valid answer, not an error that
        // would stop the whole label.
        ("/glyphs/noto_sans_regular/8192-8447.pbf", " 200", false),
        ("/glyphs/Arial%20Regular/0-255.pbf", " 404", false),
        ("/glyphs/noto_sans_regular/0-300.pbf", " 404", false),
    ];
    for (path, want, gz) in cases {
        let (st, head, _) = get(&s.addr, path);
        assert!(st.contains(want), "{path}: {st}");
        assert_eq!(
            head.contains("content-encoding: gzip"),
            gz,
            "{path}: {head}"
        );
    }

    // Suburb names at z13.5 (the style fades them out from z14), POI names
    // at z18.5 (they grow from size 0 at z17), street names along their
    // lines at z17, in Monte-Carlo.
    let drew =
        |l: &&serde_json::Value| l["changed"].as_u64().unwrap() >= 30 && l["name"].is_string();
    let cases = [
        ("#13.5/43.7380/7.4230", "label-place-"),
        ("#18.5/43.73950/7.42750", "poi-"),
        ("#17/43.73950/7.42750", "label-street-"),
    ];
    for (i, (hash, layer)) in cases.into_iter().enumerate() {
        let d = open(
            &s.addr,
            &format!("/map?labels{hash}"),
            &format!("labels-{i}.png"),
        );
        let labels = json_of(&d, "labels");
        let labels = labels.as_array().unwrap();
        let drawn: Vec<&serde_json::Value> = labels
            .iter()
            .filter(drew)
            .filter(|l| l["layer"].as_str().unwrap().starts_with(layer))
            .collect();
        assert!(
            !drawn.is_empty(),
            "{hash}: a named {layer}* label drawn: {labels:?}"
        );
    }
    // The server was asked for glyphs, and for nothing it did not have.
    let log = s.log();
    assert!(!log.contains("panic"), "{log}");
}

#[test]
fn map_opens_on_the_data_and_shares_its_view_by_hash() {
    let p = monaco();
    let s = serve(&p, &[]);
    let (_, _, body) = get(&s.addr, "/tiles/base.json");
    let tj: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let f = |v: &serde_json::Value, i: usize| v[i].as_f64().unwrap();
    // The extract's bounds reach far south of Monaco (its maritime
    // boundary); the view the map opens on does not.
    let (bounds, view) = (&tj["bounds"], &tj["highwater_view"]);
    assert!(f(bounds, 1) < 43.6, "{bounds}");
    assert!(
        f(view, 1) > 43.70 && f(view, 3) < 43.77 && f(view, 0) > 7.39 && f(view, 2) < 7.46,
        "{view}"
    );

    // Without a hash: on the data, close enough to see streets, and the
    // hash then says where.
    let d = open(&s.addr, "/map", "opening-view.png");
    let v = json_of(&d, "view");
    let (zoom, lat, lon) = (
        v["zoom"].as_f64().unwrap(),
        v["lat"].as_f64().unwrap(),
        v["lon"].as_f64().unwrap(),
    );
    assert!(zoom >= 13.0, "{v}");
    assert!(
        (43.72..43.76).contains(&lat) && (7.40..7.45).contains(&lon),
        "{v}"
    );
    let hash = v["hash"].as_str().unwrap();
    let parts: Vec<f64> = hash
        .trim_start_matches('#')
        .split('/')
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!(parts.len(), 3, "{hash}");
    assert!((parts[0] - zoom).abs() < 0.01, "{hash} {v}");
    assert!(
        (parts[1] - lat).abs() < 1e-3 && (parts[2] - lon).abs() < 1e-3,
        "{hash} {v}"
    );

    // With a hash: that view, whatever the data's.
    let cases = [
        ("#17/43.7311/7.4197", 17.0, 43.7311, 7.4197),
        ("#15.5/43.7450/7.4300", 15.5, 43.745, 7.43),
    ];
    for (i, (hash, zoom, lat, lon)) in cases.into_iter().enumerate() {
        let d = open(&s.addr, &format!("/map{hash}"), &format!("hash-{i}.png"));
        let v = json_of(&d, "view");
        assert!(
            (v["zoom"].as_f64().unwrap() - zoom).abs() < 0.01,
            "{hash}: {v}"
        );
        assert!(
            (v["lat"].as_f64().unwrap() - lat).abs() < 1e-4,
            "{hash}: {v}"
        );
        assert!(
            (v["lon"].as_f64().unwrap() - lon).abs() < 1e-4,
            "{hash}: {v}"
        );
    }
}

/// The sea drawn as sea (issue 25): off Monte-Carlo and off Larvotto, in
/// the south-east corner of the extract's bounds (its PBF header's box,
/// 7.4092-7.4486 E, 43.7234-43.7517 N; the sea is closed along it), the
/// style's `water-ocean` fill
/// draws the `ocean` layer in its water colour; on land (the Casino) the
/// land is drawn over no sea.
#[test]
fn map_draws_the_sea_in_the_water_colour() {
    let p = monaco();
    let s = serve(&p, &[]);
    let style: serde_json::Value = serde_json::from_str(include_str!(
        "../../highwater-serve/assets/versatiles-colorful.json"
    ))
    .unwrap();
    let layers = style["layers"].as_array().unwrap();
    let at = |id: &str| layers.iter().position(|l| l["id"] == id).unwrap();
    // Beneath the land layers.
    assert!(at("water-ocean") < at("land-residential"));
    let water = layers[at("water-ocean")]["paint"]["fill-color"]
        .as_str()
        .unwrap()
        .to_string();
    let rgb: Vec<u8> = water
        .trim_start_matches("rgb(")
        .trim_end_matches(')')
        .split(',')
        .map(|v| v.trim().parse().unwrap())
        .collect();
    let places = [
        (7.4400, 43.7280, 15.0),
        (7.4470, 43.7250, 14.0),
        (7.4286, 43.7396, 15.0),
    ];
    let q: Vec<String> = places
        .iter()
        .map(|(a, b, z)| format!("{a},{b},{z}"))
        .collect();
    let d = open(&s.addr, &format!("/map?probe={}", q.join(";")), "sea.png");
    let probes: Vec<[u8; 3]> = serde_json::from_str(d["probes"].as_str().unwrap()).unwrap();
    let features = json_of(&d, "features");
    let near = |c: [u8; 3]| (0..3).all(|i| (c[i] as i32 - rgb[i] as i32).abs() <= 3);
    let drew = |i: usize, id: &str| features[i].as_array().unwrap().iter().any(|f| f[0] == id);
    for i in 0..2 {
        assert!(
            near(probes[i]) && drew(i, "water-ocean"),
            "{:?}: the sea in {water}, got {:?}, drawn {}",
            places[i],
            probes[i],
            features[i]
        );
    }
    assert!(
        !near(probes[2]) && !drew(2, "water-ocean"),
        "the Casino is land: {:?}, drawn {}",
        probes[2],
        features[2]
    );
}
