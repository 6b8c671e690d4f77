//! Issue 25: a map a person would use, in headless Chromium over Monaco's
//! Shortbread tiles served by `highwater serve` on loopback.
//! - Labels: place, street and POI names drawn with glyphs the server
//!   itself hands out (`/glyphs/...`): pixels around a label's anchor, or
//!   along a street name's line, change when the symbol layers are hidden.
//! - The view opens where the data is, not on the bounds one long feature
//!   stretches; a URL hash (`#zoom/lat/lon`) opens a view and follows the map.
//!
//! Issue 50: tiles any web map can use. A MapLibre page served from
//! another origin draws labelled tiles from serve, directly and through a
//! front at `--public-url`; every answer says who may read it (CORS), a
//! preflight is answered, TileJSON and the style carry absolute URLs and
//! the OSM attribution, and a client without gzip gets tiles inflated.

use std::path::{Path, PathBuf};

mod common;
use common::front::{relay, response, Front};
use common::osm::data;
use common::serve::{browser, http, serve};
use common::*;
use std::sync::{Arc, Mutex};

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
    let here = format!("http://{}", s.addr);
    assert_eq!(
        style["glyphs"],
        format!("{here}/glyphs/{{fontstack}}/{{range}}.pbf")
    );
    // Nothing to load from elsewhere (the metadata's licence link and the
    // attribution's are text): every URL is this server's.
    let mut loads = style.clone();
    loads.as_object_mut().unwrap().remove("metadata");
    for (_, src) in loads["sources"].as_object_mut().unwrap() {
        src.as_object_mut().unwrap().remove("attribution");
    }
    let text = loads.to_string();
    assert_eq!(
        text.matches("://").count(),
        text.matches(&format!("{here}/")).count(),
        "{text}"
    );
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

/// The page of another origin: serve's own `/map` page with its fetches
/// pointed at `base` (serve, or a front before it), and MapLibre's files
/// from this origin; the tiles, glyphs and TileJSON come from `base`.
fn other_origin(page: String) -> Front {
    let assets = Path::new(env!("CARGO_MANIFEST_DIR")).join("../highwater-serve/assets");
    Front::start(move |req| {
        let path = req.path.split(['?', '#']).next().unwrap_or("/");
        if path == "/map" {
            return response(
                "200 OK",
                &[("Content-Type", "text/html; charset=utf-8")],
                page.as_bytes(),
            );
        }
        let file = path.strip_prefix("/assets/").unwrap_or("");
        let kind = if file.ends_with(".mjs") {
            "text/javascript"
        } else {
            "text/css"
        };
        match std::fs::read(assets.join(file)) {
            Ok(b) if !file.is_empty() && !file.contains('/') => {
                response("200 OK", &[("Content-Type", kind)], &b)
            }
            _ => response("404 Not Found", &[], b"not here"),
        }
    })
}

/// Street, place and POI labels drawn on the page at `page_origin`, whose
/// map reads everything from `base`.
fn labels_drawn_across_origins(serve_addr: &str, base: &str, png: &str) {
    let (_, _, page) = get(serve_addr, "/map");
    let page = String::from_utf8(page)
        .unwrap()
        .replace("fetch(`/tiles/", &format!("fetch(`{base}/tiles/"))
        .replace("data: `/api/dirty/", &format!("data: `{base}/api/dirty/"));
    assert!(page.contains(&format!("fetch(`{base}/tiles/")), "{page}");
    let front = other_origin(page);
    assert_ne!(front.url, base);
    let drew =
        |l: &&serde_json::Value| l["changed"].as_u64().unwrap() >= 30 && l["name"].is_string();
    for (i, (hash, layer)) in [
        ("#17/43.73950/7.42750", "label-street-"),
        ("#13.5/43.7380/7.4230", "label-place-"),
    ]
    .into_iter()
    .enumerate()
    {
        let d = browser(
            &format!("{}/map?labels{hash}", front.url),
            &shots(&format!("{png}-{i}.png")),
            "document.body.dataset.probed || document.body.dataset.error",
            "JSON.stringify(document.body.dataset)",
        );
        assert!(
            d["error"].is_null(),
            "{png} {hash}: the map reported an error: {d}"
        );
        // Tiles drawn: most of the canvas is not the blank background.
        let drawn: f64 = d["drawn"].as_str().unwrap().parse().unwrap();
        let pixels: f64 = d["pixels"].as_str().unwrap().parse().unwrap();
        assert!(
            drawn > pixels / 2.0,
            "{png} {hash}: {drawn} of {pixels} drawn"
        );
        let labels = json_of(&d, "labels");
        let named: Vec<&serde_json::Value> = labels
            .as_array()
            .unwrap()
            .iter()
            .filter(drew)
            .filter(|l| l["layer"].as_str().unwrap().starts_with(layer))
            .collect();
        assert!(
            !named.is_empty(),
            "{png} {hash}: a named {layer}* label: {labels}"
        );
    }
    // The page's origin was asked for the page and MapLibre, nothing else.
    assert_eq!(front.requests(".pbf"), 0);
    assert_eq!(front.requests(".json"), 0);
}

/// Issue 50: a MapLibre page served from another origin draws labelled
/// tiles (pixels checked) from serve, with the URLs serve derives from
/// the address it listens on and, behind a front, from `--public-url`.
#[test]
fn a_map_on_another_origin_draws_labelled_tiles_from_serve() {
    let p = monaco();
    let s = serve(&p, &[]);
    labels_drawn_across_origins(&s.addr, &format!("http://{}", s.addr), "cross-origin");
    drop(s);

    // A front at /hw relays to serve: the page, the style's TileJSON and
    // every tile go through it, as `--public-url` names it.
    let behind: Arc<Mutex<String>> = Arc::default();
    let b = behind.clone();
    let front = Front::start(move |req| match req.path.strip_prefix("/hw/") {
        Some(rest) => relay(&b.lock().unwrap(), &format!("/{rest}")),
        None => response("404 Not Found", &[], b"not under /hw"),
    });
    let public = format!("{}/hw", front.url);
    let s = serve(&p, &["--public-url", &public]);
    *behind.lock().unwrap() = format!("http://{}", s.addr);
    let (_, _, tj) = get(&s.addr, "/tiles/base.json");
    let tj: serde_json::Value = serde_json::from_slice(&tj).unwrap();
    assert_eq!(
        tj["tiles"][0],
        format!("{public}/tiles/base/{{z}}/{{x}}/{{y}}.pbf")
    );
    labels_drawn_across_origins(&s.addr, &public, "public-url");
    assert!(front.requests(".pbf") > 0, "no tile went through the front");
    assert!(
        front.requests(".json") > 0,
        "no TileJSON went through the front"
    );
}

/// Issue 50: every answer says who may read it, `*` unless
/// `--cors-origin` names the origins; a preflight is answered, not 405;
/// TileJSON, the style and the MBTiles file carry the OSM attribution; a
/// client that takes gzip gets the tile as stored, one that does not gets
/// it inflated, each with its own ETag.
#[test]
fn tiles_are_readable_from_any_origin_with_attribution_in_either_encoding() {
    let p = monaco();
    let mb = rusqlite::Connection::open_with_flags(
        p.path("tiles/base.mbtiles"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let attribution: String = mb
        .query_row(
            "SELECT value FROM metadata WHERE name = 'attribution'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        attribution.contains("© OpenStreetMap contributors"),
        "{attribution}"
    );
    let (x, row, stored): (u32, u32, Vec<u8>) = mb
        .query_row(
            "SELECT tile_column, tile_row, tile_data FROM tiles WHERE zoom_level = 14 LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    let tile = format!("/tiles/base/14/{x}/{}.pbf", (1 << 14) - 1 - row);
    let s = serve(&p, &[]);
    let elsewhere = [("Origin", "http://elsewhere.example:8000")];
    for path in [
        "/",
        "/map",
        "/api/status",
        "/metrics",
        "/tiles/base.json",
        "/tiles/base/style.json",
        tile.as_str(),
        "/glyphs/noto_sans_regular/0-255.pbf",
        "/assets/maplibre-gl.mjs",
        "/api/dirty/base.geojson",
        "/tiles/nope.json",
    ] {
        let (code, h, _) = http(&s.addr, "GET", path, &elsewhere);
        assert!(code < 500, "{path}: {code}");
        assert_eq!(
            h.get("access-control-allow-origin").map(String::as_str),
            Some("*"),
            "{path}: {h:?}"
        );
    }
    // A preflight (a page sending If-None-Match), answered.
    let (code, h, _) = http(
        &s.addr,
        "OPTIONS",
        &tile,
        &[
            elsewhere[0],
            ("Access-Control-Request-Method", "GET"),
            ("Access-Control-Request-Headers", "if-none-match"),
        ],
    );
    assert_eq!(code, 204, "{h:?}");
    assert_eq!(h["access-control-allow-origin"], "*");
    assert!(h["access-control-allow-methods"].contains("GET"), "{h:?}");
    assert_eq!(h["access-control-allow-headers"], "if-none-match");
    assert_eq!(http(&s.addr, "POST", &tile, &elsewhere).0, 405);

    // The attribution, in TileJSON and in the style's source.
    let (_, _, tj) = http(&s.addr, "GET", "/tiles/base.json", &[]);
    let tj: serde_json::Value = serde_json::from_slice(&tj).unwrap();
    assert!(
        tj["attribution"]
            .as_str()
            .unwrap()
            .contains("© OpenStreetMap contributors"),
        "{tj}"
    );
    let (_, _, style) = http(&s.addr, "GET", "/tiles/base/style.json", &[]);
    let style: serde_json::Value = serde_json::from_slice(&style).unwrap();
    let src = &style["sources"]["versatiles-shortbread"];
    assert!(
        src["attribution"]
            .as_str()
            .unwrap()
            .contains("© OpenStreetMap contributors"),
        "{src}"
    );

    // Accept-Encoding, in; what is sent, out: (header, gzipped).
    let plain = highwater_osm::tiles::fresh::gunzip(&stored).unwrap();
    let mut tags = std::collections::BTreeMap::new();
    for (accept, gz) in [
        (Some("gzip"), true),
        (Some("gzip, deflate, br"), true),
        (Some("br;q=1.0, gzip;q=0.5"), true),
        (Some("*"), true),
        (None, false),
        (Some("identity"), false),
        (Some("gzip;q=0"), false),
        (Some("*, gzip;q=0"), false),
        (Some("br"), false),
    ] {
        let hs: Vec<(&str, &str)> = accept.iter().map(|a| ("Accept-Encoding", *a)).collect();
        let (code, h, body) = http(&s.addr, "GET", &tile, &hs);
        assert_eq!(code, 200, "{accept:?}");
        assert!(
            h["vary"].to_ascii_lowercase().contains("accept-encoding"),
            "{h:?}"
        );
        if gz {
            assert_eq!(h["content-encoding"], "gzip", "{accept:?}");
            assert_eq!(body, stored, "{accept:?}");
        } else {
            assert!(!h.contains_key("content-encoding"), "{accept:?}: {h:?}");
            assert_eq!(body, plain, "{accept:?}: inflated");
        }
        tags.entry(gz)
            .or_insert_with(Vec::new)
            .push(h["etag"].clone());
        // Each representation revalidates with its own ETag.
        let mut hs = hs.clone();
        hs.push(("If-None-Match", &h["etag"]));
        assert_eq!(http(&s.addr, "GET", &tile, &hs).0, 304, "{accept:?}");
    }
    for v in tags.values() {
        assert!(v.iter().all(|t| *t == v[0]), "{tags:?}");
    }
    assert_ne!(tags[&true][0], tags[&false][0]);
    drop(s);

    // --cors-origin: that origin, and no other, may read.
    let s = serve(&p, &["--cors-origin", "https://maps.example.org"]);
    let (_, h, _) = http(
        &s.addr,
        "GET",
        &tile,
        &[("Origin", "https://maps.example.org")],
    );
    assert_eq!(h["access-control-allow-origin"], "https://maps.example.org");
    assert!(h["vary"].contains("Origin"), "{h:?}");
    let (code, h, _) = http(&s.addr, "GET", &tile, &elsewhere);
    assert_eq!(code, 200);
    assert!(!h.contains_key("access-control-allow-origin"), "{h:?}");
    let (code, h, _) = http(&s.addr, "OPTIONS", "/tiles/base.json", &elsewhere);
    assert_eq!(code, 204);
    assert!(!h.contains_key("access-control-allow-origin"), "{h:?}");
    drop(s);
    let r = p.check(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--cors-origin",
            "https://x.example/app",
        ],
        2,
    );
    assert!(
        r.stderr.contains("--cors-origin https://x.example/app"),
        "{}",
        r.stderr
    );
}
