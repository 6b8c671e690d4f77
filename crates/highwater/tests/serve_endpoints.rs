//! Issue 12: `highwater serve` on a project with a file stage, a source and
//! an OSM tile dataset: the endpoints, the metrics format, tiles against the
//! MBTiles, nothing written, loopback only, and the pages in headless
//! Chromium (screenshots under target/tmp/issue12-serve/).

mod common;
use common::ingest::SQLITE_SOURCE;
use common::osm::{data, monaco_updates};
use common::serve::{browser, http, serve};
use common::*;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;

/// The page shows the newest week of windows by the clock, so the source's
/// grid starts a day before now (on the hour), and its rows fall in it.
fn start_hour() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    (now / 3600 - 24) * 3600
}

fn rfc3339(secs: i64) -> String {
    highwater_core::window::format_rfc3339(secs * 1_000_000)
}

fn config() -> String {
    let source = SQLITE_SOURCE.replace(
        "start = \"2026-03-01T08:00:00Z\"",
        &format!("start = \"{}\"", rfc3339(start_hour())),
    );
    assert_ne!(source, SQLITE_SOURCE);
    format!(
        r#"{}
{source}
[osm]
store = ".highwater/osm"

[osm.tiles.base]
zooms = "12-14"
keys = ["building", "highway", "landuse"]
mbtiles = "tiles/base.mbtiles"
drain = "deferred"
tiles_affected_max = 1000000
"#,
        upper_config("")
    )
}

/// The project: a stage run, a source ingested, Monaco imported, tiles
/// built and three diffs applied without draining (so some tiles are dirty).
fn project() -> Project {
    let p = Project::new(&config());
    p.write("data/a.txt", "hello\n");
    p.check(&["run"], 0);
    let c = rusqlite::Connection::open(p.path("src.db")).unwrap();
    c.execute_batch("CREATE TABLE orders(id INTEGER PRIMARY KEY, amount REAL, note TEXT, updated_at TEXT NOT NULL);")
        .unwrap();
    for (id, hours) in [(1, 1), (2, 2), (3, 5)] {
        c.execute(
            "INSERT INTO orders VALUES(?1, 1.5, 'n', ?2)",
            rusqlite::params![id, rfc3339(start_hour() + hours * 3600 + 120)],
        )
        .unwrap();
    }
    p.check(&["ingest", "orders"], 0);
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    p.check(&["osm", "tiles", "build"], 0);
    monaco_updates(&p, 48..=50);
    p.check(&["osm", "replicate", "--from", "updates"], 0);
    p
}

/// Every file of the project but SQLite's -wal and -shm, with its bytes
/// and mtime.
fn files(root: &Path) -> BTreeMap<String, (Vec<u8>, std::time::SystemTime)> {
    tree(root)
        .into_iter()
        .filter(|(k, _)| !k.ends_with("-wal") && !k.ends_with("-shm"))
        .collect()
}

#[test]
fn issue12_serve_endpoints_read_only_and_in_their_formats() {
    let p = project();
    let before = files(p.dir.path());
    let s = serve(&p, &[]);

    // /api/status: the data behind the page.
    let (code, h, body) = http(&s.addr, "GET", "/api/status", &[]);
    assert_eq!(code, 200);
    assert_eq!(h["content-type"], "application/json");
    let st: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(st["errors"], serde_json::json!([]), "{st}");
    assert_eq!(st["stages"][0]["name"], "upper");
    assert_eq!(st["sources"][0]["name"], "orders");
    assert_eq!(st["osm"]["sequence"], 3050);
    let dirty = st["osm"]["datasets"][0]["dirty"].as_i64().unwrap();
    // The tiles build counts as the last time the dataset caught up.
    assert!(st["osm"]["datasets"][0]["last_drain"].is_string(), "{st}");
    assert!(
        dirty > 0,
        "diffs applied without a drain leave dirty tiles: {st}"
    );

    // /metrics parses as Prometheus text, every sample under a TYPE.
    let (code, h, body) = http(&s.addr, "GET", "/metrics", &[]);
    assert_eq!(code, 200);
    assert!(h["content-type"].starts_with("text/plain; version=0.0.4"));
    let text = String::from_utf8(body).unwrap();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    let sample_lines = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count();
    assert_eq!(
        scrape.samples.len(),
        sample_lines,
        "every sample line parses:\n{text}"
    );
    for sm in &scrape.samples {
        assert!(sm.metric.starts_with("highwater_"), "{}", sm.metric);
        assert!(
            scrape.docs.contains_key(&sm.metric),
            "{} has HELP",
            sm.metric
        );
    }
    let get = |name: &str, label: (&str, &str)| {
        scrape
            .samples
            .iter()
            .find(|x| x.metric == name && x.labels.get(label.0) == Some(label.1))
            .map(|x| match x.value {
                prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            })
    };
    assert_eq!(
        get("highwater_osm_sequence", ("dataset", "base")),
        Some(3050.0)
    );
    assert_eq!(
        get("highwater_osm_dirty_items", ("dataset", "base")),
        Some(dirty as f64)
    );
    assert_eq!(get("highwater_stage_items", ("state", "ok")), Some(1.0));
    assert!(get("highwater_source_windows", ("status", "published")).unwrap() >= 3.0);
    assert!(
        text.contains("highwater_items_processed_total{stage=\"upper\",reason=\"new\"} 1"),
        "{text}"
    );

    // TileJSON, and a tile equal to the MBTiles row with the TMS flip.
    let (code, _, body) = http(&s.addr, "GET", "/tiles/base.json", &[]);
    assert_eq!(code, 200);
    let tj: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(tj["tilejson"], "3.0.0");
    // Absolute (TileJSON 3.0; issue 50), from the address listened on:
    // never built from the request's Host (issue 20).
    assert_eq!(
        tj["tiles"][0],
        format!("http://{}/tiles/base/{{z}}/{{x}}/{{y}}.pbf", s.addr)
    );
    assert_eq!(tj["vector_layers"][0]["id"], "base");
    let mb = rusqlite::Connection::open_with_flags(
        p.path("tiles/base.mbtiles"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let (x, row, stored): (u32, u32, Vec<u8>) = mb
        .query_row(
            "SELECT tile_column, tile_row, tile_data FROM tiles WHERE zoom_level = 14 LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    let y = (1 << 14) - 1 - row;
    let gz = [("Accept-Encoding", "gzip")];
    let (code, h, body) = http(&s.addr, "GET", &format!("/tiles/base/14/{x}/{y}.pbf"), &gz);
    assert_eq!(code, 200);
    assert_eq!(h["content-encoding"], "gzip");
    assert_eq!(body, stored, "the stored tile, as stored");
    let etag = h["etag"].clone();
    let (code, _, _) = http(
        &s.addr,
        "GET",
        &format!("/tiles/base/14/{x}/{y}.pbf"),
        &[("If-None-Match", &etag), gz[0]],
    );
    assert_eq!(code, 304);
    // The row itself (without the flip) is another tile, or none.
    if row != y {
        let (code, _, body) = http(
            &s.addr,
            "GET",
            &format!("/tiles/base/14/{x}/{row}.pbf"),
            &[],
        );
        assert!(code == 204 || body != stored);
    }
    let (code, _, _) = http(&s.addr, "GET", "/tiles/nope/1/0/0.pbf", &[]);
    assert_eq!(code, 404);
    let (code, _, body) = http(&s.addr, "GET", "/api/dirty/base.geojson", &[]);
    assert_eq!(code, 200);
    let gj: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(gj["features"].as_array().unwrap().len() as i64, dirty);

    // Nothing writes: other methods are refused, and no file changed.
    for (m, path) in [
        ("POST", "/"),
        ("PUT", "/api/status"),
        ("DELETE", "/tiles/base/14/0/0.pbf"),
    ] {
        assert_eq!(http(&s.addr, m, path, &[]).0, 405, "{m} {path}");
    }
    drop(s);
    let after = files(p.dir.path());
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>()
    );
    for (k, v) in &before {
        assert!(after[k] == *v, "{k} changed while serving");
    }
}

#[test]
fn issue12_serve_listens_on_loopback_unless_told_otherwise() {
    let p = Project::new(&config());
    let r = p.check(&["serve", "--listen", "0.0.0.0:0"], 2);
    assert!(r.stderr.contains("not a loopback address"), "{}", r.stderr);
    assert!(r.stderr.contains("--public"), "{}", r.stderr);
    let mut child = p
        .cmd(&["serve", "--listen", "0.0.0.0:0", "--public"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    err.read_line(&mut first).unwrap();
    assert!(first.contains("beyond this machine (--public)"), "{first}");
    // SAFETY: a signal to our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    assert_eq!(
        child.wait().unwrap().code(),
        Some(0),
        "SIGTERM stops serve cleanly"
    );
}

/// The page and the map in headless Chromium: the grid's cells say what
/// `windows --json` says, and the map canvas has drawn the tiles.
#[test]
fn issue12_pages_in_a_real_browser() {
    let p = project();
    let s = serve(&p, &[]);
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("issue12-serve");
    std::fs::create_dir_all(&shots).unwrap();
    let cells = browser(
        &format!("http://{}/", s.addr),
        &shots.join("index.png"),
        "document.querySelectorAll('table.grid span.cell').length > 0",
        "JSON.stringify([...document.querySelectorAll('table.grid span.cell')].map(c => [c.dataset.start, c.dataset.status]))",
    );
    let page: BTreeMap<String, String> = cells
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c[0].as_str().unwrap().to_string(),
                c[1].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let w = p.check(&["windows", "orders", "--json"], 0).json();
    let cli: BTreeMap<String, String> = w["windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["start"].as_str().unwrap().to_string(),
                c["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    // The same windows (the grid since the source's start, a day ago), in
    // the same states; a window may close between the two reads.
    let both: Vec<&String> = page.keys().filter(|k| cli.contains_key(*k)).collect();
    assert!(
        both.len() >= 20 && both.len() + 1 >= page.len().max(cli.len()),
        "{page:?} / {cli:?}"
    );
    for k in both {
        assert_eq!(page[k], cli[k], "window {k}");
    }
    assert!(
        page.values().filter(|v| *v == "published").count() >= 3,
        "{page:?}"
    );

    let drawn = browser(
        &format!("http://{}/map", s.addr),
        &shots.join("map.png"),
        "document.body.dataset.drawn || document.body.dataset.error",
        "JSON.stringify(document.body.dataset)",
    );
    assert!(drawn["error"].is_null(), "{drawn}");
    let n: u64 = drawn["drawn"].as_str().unwrap().parse().unwrap();
    let all: u64 = drawn["pixels"].as_str().unwrap().parse().unwrap();
    assert!(
        n > all / 100,
        "the canvas shows the tiles: {n} of {all} pixels are not background"
    );
}
