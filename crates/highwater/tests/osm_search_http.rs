//! Issue 50: search over HTTP. `highwater serve` answers `GET /search?q=`
//! (and Photon's `/api?q=`) and `GET /reverse?lat=&lon=` in Photon's
//! GeoJSON shape, from one committed state of the search dataset whose
//! replication sequence it says. Checked on Monaco against the command
//! line (`osm search`) and against a nearest-point search computed here by
//! brute force over every document; after real minutely diffs; and while
//! diffs are applied and drained, with clients asking all the while: each
//! answer holds the document as it was before a drain or after it, with
//! the sequence of that state, never a mix and never an error.
//!
//! Data: crates/highwater-osm/tests/data (SOURCE.md there).

mod common;
use common::osm::data;
use common::serve::{http, serve, Served};
use common::*;
use serde_json::Value;
use std::fmt::Write as _;

const CONFIG: &str = r#"
[osm]
store = ".highwater/osm"

[osm.search.places]
index = "search/places"
"#;

fn imported() -> Project {
    let p = Project::new(CONFIG);
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    p.check(&["osm", "rebuild", "places"], 0);
    p
}

/// A GET: (status, headers, body as text).
fn get(s: &Served, path: &str) -> (u16, std::collections::BTreeMap<String, String>, String) {
    let (code, h, body) = http(&s.addr, "GET", path, &[]);
    (code, h, String::from_utf8(body).unwrap())
}

/// A 200 answer's collection, checked to be GeoJSON that says its
/// sequence in the body and in the header alike.
fn collection(s: &Served, path: &str) -> Value {
    let (code, h, body) = get(s, path);
    assert_eq!(code, 200, "{path}: {body}");
    assert_eq!(h["content-type"], "application/geo+json", "{path}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["type"], "FeatureCollection", "{path}");
    assert_eq!(
        h["x-highwater-sequence"],
        v["sequence"].to_string(),
        "{path}"
    );
    v
}

fn features(v: &Value) -> &Vec<Value> {
    v["features"].as_array().unwrap()
}

/// `q` as a URL query value.
fn enc(q: &str) -> String {
    let mut out = String::new();
    for b in q.bytes() {
        if b.is_ascii_alphanumeric() {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Photon's properties for a document as `osm search --json` prints it,
/// written out here from Photon's documentation (absent when null).
fn photon_properties(doc: &Value) -> Value {
    let mut p = serde_json::Map::new();
    let pairs = [
        ("name", &doc["name"]),
        ("street", &doc["street"]),
        ("housenumber", &doc["housenumber"]),
        ("postcode", &doc["postcode"]),
        ("city", &doc["place"]),
        ("country", &doc["admin"]["2"]),
        ("state", &doc["admin"]["4"]),
        ("county", &doc["admin"]["6"]),
        ("osm_key", &doc["osm_key"]),
        ("osm_value", &doc["osm_value"]),
        ("extent", &doc["extent"]),
    ];
    for (k, v) in pairs {
        if !v.is_null() {
            p.insert(k.into(), v.clone());
        }
    }
    p.insert(
        "osm_type".into(),
        doc["osm_type"].as_str().unwrap().to_uppercase().into(),
    );
    p.insert("osm_id".into(), doc["osm_id"].clone());
    p.insert("admin".into(), doc["admin"].clone());
    Value::Object(p)
}

/// A feature equals the document: its properties and its point.
fn assert_feature_is(f: &Value, doc: &Value, what: &str) {
    assert_eq!(f["type"], "Feature", "{what}");
    assert_eq!(f["properties"], photon_properties(doc), "{what}");
    let want = if doc["lon"].is_null() {
        Value::Null
    } else {
        serde_json::json!({"type": "Point", "coordinates": [doc["lon"], doc["lat"]]})
    };
    assert_eq!(f["geometry"], want, "{what}");
}

/// Great-circle metres, written here apart from the server's.
fn metres(a: (f64, f64), b: (f64, f64)) -> f64 {
    let r = 6_371_008.8_f64;
    let (la1, la2) = (a.1.to_radians(), b.1.to_radians());
    let dla = la2 - la1;
    let dlo = (b.0 - a.0).to_radians();
    let h = (dla / 2.0).sin().powi(2) + la1.cos() * la2.cos() * (dlo / 2.0).sin().powi(2);
    2.0 * r * h.sqrt().asin()
}

/// The `limit` documents nearest (lon, lat) within `radius_m`, by brute
/// force over all of them: (distance, key).
fn brute_nearest(all: &[Value], at: (f64, f64), radius_m: f64, limit: usize) -> Vec<(f64, String)> {
    let mut v: Vec<(f64, String)> = all
        .iter()
        .filter(|d| !d["lon"].is_null())
        .map(|d| {
            let p = (d["lon"].as_f64().unwrap(), d["lat"].as_f64().unwrap());
            (
                metres(at, p),
                format!("{}{}", d["osm_type"].as_str().unwrap(), d["osm_id"]),
            )
        })
        .filter(|(m, _)| *m <= radius_m)
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
    v.truncate(limit);
    v
}

fn key_of(f: &Value) -> String {
    format!(
        "{}{}",
        f["properties"]["osm_type"].as_str().unwrap().to_lowercase(),
        f["properties"]["osm_id"]
    )
}

/// `/reverse` at points on a grid over Monaco and at some documents' own
/// points answers the brute-force nearest, in order.
fn check_reverse(s: &Served, all: &[Value], sequence: i64) {
    let by_key: std::collections::BTreeMap<String, &Value> = all
        .iter()
        .map(|d| {
            (
                format!("{}{}", d["osm_type"].as_str().unwrap(), d["osm_id"]),
                d,
            )
        })
        .collect();
    let mut points: Vec<(f64, f64)> = Vec::new();
    for i in 0..5 {
        for j in 0..4 {
            points.push((7.405 + 0.008 * i as f64, 43.722 + 0.008 * j as f64));
        }
    }
    for d in all.iter().filter(|d| !d["lon"].is_null()).step_by(500) {
        points.push((d["lon"].as_f64().unwrap(), d["lat"].as_f64().unwrap()));
    }
    let mut answered = 0;
    for (lon, lat) in points {
        for (radius_km, limit) in [(1.0, 5), (0.2, 20)] {
            let v = collection(
                s,
                &format!("/reverse?lat={lat}&lon={lon}&radius={radius_km}&limit={limit}"),
            );
            assert_eq!(v["sequence"], sequence);
            let got: Vec<String> = features(&v).iter().map(key_of).collect();
            let want = brute_nearest(all, (lon, lat), radius_km * 1000.0, limit);
            // Equal in order, but for documents the same distance away
            // (within a millimetre), which may come in either order.
            assert_eq!(got.len(), want.len(), "({lon}, {lat}) {radius_km} km");
            for (i, (g, (m, w))) in got.iter().zip(&want).enumerate() {
                if g != w {
                    let gd = by_key[g];
                    let gm = metres(
                        (lon, lat),
                        (gd["lon"].as_f64().unwrap(), gd["lat"].as_f64().unwrap()),
                    );
                    assert!(
                        (gm - m).abs() < 1e-3,
                        "({lon}, {lat}) #{i}: {g} at {gm} m, brute force {w} at {m} m"
                    );
                }
            }
            for f in features(&v) {
                assert_feature_is(f, by_key[&key_of(f)], "reverse");
            }
            answered += got.len();
        }
    }
    assert!(answered > 100, "the grid found {answered} documents");
}

const QUERIES: [&str; 8] = [
    "Casino",
    "Fontvieille",
    "Grimaldi",
    "Monte Carlo",
    "Boulevard",
    "Hôtel",
    "\"Avenue de la Costa\"",
    "Port",
];

/// `/search` answers what `osm search` prints for the same queries, in
/// the same order, as Photon features.
fn check_search(p: &Project, s: &Served, sequence: i64) {
    for q in QUERIES {
        for limit in [1, 10] {
            let docs = p
                .check(
                    &["osm", "search", q, "--limit", &limit.to_string(), "--json"],
                    0,
                )
                .json();
            let docs = docs.as_array().unwrap();
            let v = collection(s, &format!("/search?q={}&limit={limit}", enc(q)));
            assert_eq!(v["sequence"], sequence, "{q}");
            assert_eq!(v["dataset"], "places");
            assert_eq!(features(&v).len(), docs.len(), "{q} limit {limit}");
            for (f, d) in features(&v).iter().zip(docs) {
                assert_feature_is(f, d, q);
            }
            // Photon's own path answers the same.
            let api = collection(s, &format!("/api?q={}&limit={limit}", enc(q)));
            assert_eq!(api, v, "{q}");
        }
    }
}

/// Every document as `osm search --all --json` prints it.
fn every_doc(p: &Project) -> Vec<Value> {
    let all = p.check(&["osm", "search", "--all", "--json"], 0).json();
    all.as_array().unwrap().clone()
}

#[test]
fn search_and_reverse_over_http_equal_the_command_and_a_brute_force_nearest() {
    let p = imported();
    let s = serve(&p, &[]);
    let all = every_doc(&p);
    let with_point = all.iter().filter(|d| !d["lon"].is_null()).count();
    assert!(
        with_point * 10 >= all.len() * 9,
        "{with_point} of {} documents have a point",
        all.len()
    );
    assert!(all
        .iter()
        .any(|d| !d["extent"].is_null() && d["osm_type"] == "w"));
    check_search(&p, &s, 3047);
    check_reverse(&s, &all, 3047);
    // Far from Monaco: nothing within the radius.
    let v = collection(&s, "/reverse?lat=0&lon=0");
    assert_eq!(features(&v).len(), 0);
    // Every refusal names its parameter.
    for (path, code, names) in [
        ("/search", 400, "q"),
        ("/search?q=", 400, "q"),
        ("/search?q=Casino&limit=0", 400, "limit"),
        ("/search?q=Casino&limit=51", 400, "limit"),
        ("/search?q=Casino&bbox=1,2,3,4", 400, "bbox"),
        ("/search?q=name%3A%28", 400, "q"),
        ("/search?q=Casino&dataset=nope", 404, "no [osm.search.nope]"),
        ("/reverse?lon=7.42", 400, "lat"),
        ("/reverse?lat=43.73&lon=200", 400, "lon"),
        ("/reverse?lat=43.73&lon=7.42&radius=-1", 400, "radius"),
        ("/reverse?lat=43.73&lon=7.42&limit=x", 400, "limit"),
    ] {
        let (c, _, body) = get(&s, path);
        assert_eq!(c, code, "{path}: {body}");
        assert!(body.starts_with(names), "{path}: {body}");
    }
}

#[test]
fn after_real_diffs_and_their_drain_the_http_answers_follow() {
    let p = imported();
    let s = serve(&p, &[]);
    let before = every_doc(&p);
    // Served once, so that what follows is the server noticing the change.
    check_search(&p, &s, 3047);
    let from = data().join("monaco-updates");
    p.check(&["osm", "replicate", "--from", from.to_str().unwrap()], 0);
    p.check(&["osm", "verify", "places"], 0);
    let after = every_doc(&p);
    let changed: Vec<&Value> = after.iter().filter(|d| !before.contains(d)).collect();
    assert!(!changed.is_empty(), "the diffs change some document");
    check_search(&p, &s, 3076);
    check_reverse(&s, &after, 3076);
    // Each changed document is found where it now is, as it now is.
    for d in changed.iter().filter(|d| !d["lon"].is_null()).take(20) {
        let v = collection(
            &s,
            &format!(
                "/reverse?lat={}&lon={}&radius=0.05&limit=50",
                d["lat"], d["lon"]
            ),
        );
        let f = features(&v)
            .iter()
            .find(|f| key_of(f) == format!("{}{}", d["osm_type"].as_str().unwrap(), d["osm_id"]))
            .unwrap_or_else(|| panic!("{d} not found at its point"));
        assert_feature_is(f, d, "changed");
    }
}

/// A change file setting node `id` (its other tags kept) to `name` and
/// `street` at (lon, lat).
fn set_node(
    p: &Project,
    file: &str,
    node: &highwater_osm::Node,
    name: &str,
    street: &str,
    at: (f64, f64),
) {
    let mut x = format!(
        "<?xml version=\"1.0\"?>\n<osmChange version=\"0.6\">\n<modify>\n<node id=\"{}\" version=\"99\" lat=\"{:.7}\" lon=\"{:.7}\">",
        node.id, at.1, at.0
    );
    let mut tags = node.tags.clone();
    tags.insert("name".into(), name.into());
    tags.insert("addr:street".into(), street.into());
    for (k, v) in &tags {
        let esc = |s: &str| {
            s.replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;")
                .replace('"', "&quot;")
        };
        let _ = write!(x, "<tag k=\"{}\" v=\"{}\"/>", esc(k), esc(v));
    }
    x.push_str("</node>\n</modify>\n</osmChange>\n");
    p.write(file, &x);
}

#[test]
fn a_client_during_a_drain_sees_the_old_or_the_new_document_never_a_mix() {
    let p = imported();
    let s = serve(&p, &[]);
    // A named node of Monaco's, set in turn to two states A and B that
    // differ in name, street and position (50 m apart).
    let all = every_doc(&p);
    let doc = all
        .iter()
        .find(|d| d["osm_type"] == "n" && !d["lon"].is_null())
        .expect("a named node");
    let id = doc["osm_id"].as_i64().unwrap();
    let node = highwater_osm::open_store(&p.path(".highwater/osm"))
        .unwrap()
        .node(id)
        .unwrap()
        .unwrap();
    let (lon, lat) = (doc["lon"].as_f64().unwrap(), doc["lat"].as_f64().unwrap());
    let a = (lon, lat);
    let b = (lon + 0.0006, lat);
    set_node(&p, "a.osc", &node, "Hwprobe Alpha", "Rue Alpha", a);
    set_node(&p, "b.osc", &node, "Hwprobe Beta", "Rue Beta", b);
    let mid = ((a.0 + b.0) / 2.0, a.1);
    let search_path = "/search?q=Hwprobe&limit=50".to_string();
    let reverse_path = format!("/reverse?lat={}&lon={}&radius=1&limit=50", mid.1, mid.0);
    // The node as each endpoint gives it, and its sequence.
    let probe = |path: &str| -> Option<(Value, i64)> {
        let (code, _, body) = get(&s, path);
        assert_eq!(code, 200, "{path}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        let seq = v["sequence"].as_i64().unwrap();
        let f = features(&v)
            .iter()
            .find(|f| f["properties"]["osm_id"] == id && f["properties"]["osm_type"] == "N")
            .cloned();
        f.map(|f| (f, seq))
    };
    // Each state once, quietly: what A and B look like.
    p.check(&["osm", "apply", "a.osc", "--sequence", "3048"], 0);
    let fa = probe(&search_path).unwrap();
    assert_eq!(fa.1, 3048);
    assert_eq!(probe(&reverse_path).unwrap().0, fa.0);
    p.check(&["osm", "apply", "b.osc", "--sequence", "3049"], 0);
    let fb = probe(&search_path).unwrap();
    assert_eq!(fb.1, 3049);
    assert_eq!(probe(&reverse_path).unwrap().0, fb.0);
    assert_eq!(fa.0["properties"]["name"], "Hwprobe Alpha");
    assert_eq!(fb.0["properties"]["street"], "Rue Beta");
    assert_eq!(
        fb.0["geometry"]["coordinates"],
        serde_json::json!([(b.0 * 1e7).round() / 1e7, b.1])
    );
    let (fa, fb) = (fa.0, fb.0);
    // Clients ask without pause while the diffs are applied and drained,
    // A at even sequences and B at odd ones.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let seen = std::sync::Mutex::new(std::collections::BTreeMap::<(String, i64), usize>::new());
    let last = 3060;
    std::thread::scope(|sc| {
        for path in [&search_path, &reverse_path, &search_path, &reverse_path] {
            let (stop, failed, seen, probe, fa, fb) = (&stop, &failed, &seen, &probe, &fa, &fb);
            sc.spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                        let (f, seq) =
                            probe(path).unwrap_or_else(|| panic!("{path}: the node is missing"));
                        let want = if seq % 2 == 0 { fa } else { fb };
                        assert_eq!(&f, want, "{path} at sequence {seq}: a mix");
                        *seen.lock().unwrap().entry((path.clone(), seq)).or_default() += 1;
                    }
                }));
                if let Err(e) = r {
                    // The applying loop stops waiting for this client.
                    failed.store(true, std::sync::atomic::Ordering::SeqCst);
                    std::panic::resume_unwind(e);
                }
            });
        }
        for seq in 3050..=last {
            let file = if seq % 2 == 0 { "a.osc" } else { "b.osc" };
            p.check(&["osm", "apply", file, "--sequence", &seq.to_string()], 0);
            // Each state is seen by both endpoints before the next.
            while !failed.load(std::sync::atomic::Ordering::SeqCst)
                && [&search_path, &reverse_path]
                    .iter()
                    .any(|path| !seen.lock().unwrap().contains_key(&((*path).clone(), seq)))
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    let seen = seen.into_inner().unwrap();
    let answers: usize = seen.values().sum();
    assert!(answers > 40, "{answers} answers: {seen:?}");
    p.check(&["osm", "verify", "places"], 0);
}
