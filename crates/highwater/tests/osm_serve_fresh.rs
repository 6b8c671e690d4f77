//! Issue 23: dirty tiles served fresh and re-cut by popularity. A deferred
//! diff leaves tiles dirty; `serve` (a reader) answers them cut from the
//! store as it is, equal to what the next drain writes and to a rebuild,
//! without touching the MBTiles file; a failed or slow cut serves the
//! stale tile with a header and a metric; requests are counted, and
//! `osm tiles drain --priority requested` (the default once requests were
//! seen) re-cuts the most requested dirty tiles first.
//!
//! Data: Monaco's extract at sequence 3047 and its minutely diffs
//! 3048..3076 (crates/highwater-osm/tests/data, see SOURCE.md there).

mod common;
use common::osm::{data, monaco_updates};
use common::serve::{http, serve, serve_cmd};
use common::*;
use highwater_core::tile::Tile;
use highwater_osm::store::DrainOrder;
use highwater_osm::tiles::{mvt, Mbtiles};
use std::collections::BTreeMap;

const CONFIG: &str = r#"
[osm]
store = ".highwater/osm"

[osm.tiles.base]
zooms = "12-14"
keys = ["building", "highway", "landuse"]
mbtiles = "tiles/base.mbtiles"
drain = "deferred"
"#;

/// Monaco imported at 3047, its tiles built, and `seqs` of its minutely
/// diffs copied into `updates/` (not applied).
fn project(seqs: std::ops::RangeInclusive<i64>) -> Project {
    let p = Project::new(CONFIG);
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    p.check(&["osm", "tiles", "build"], 0);
    monaco_updates(&p, seqs);
    p
}

/// One GET taking gzip: (status, headers lower-cased, body).
fn get(addr: &str, path: &str) -> (u16, BTreeMap<String, String>, Vec<u8>) {
    http(addr, "GET", path, &[("Accept-Encoding", "gzip")])
}

fn tile_url(t: Tile) -> String {
    format!("/tiles/base/{}/{}/{}.pbf", t.z, t.x, t.y)
}

/// A served tile's MVT bytes (it is sent gzipped, as stored); `None` for
/// an empty tile (204).
fn served(addr: &str, t: Tile) -> (Option<Vec<u8>>, BTreeMap<String, String>) {
    let (code, h, body) = get(addr, &tile_url(t));
    match code {
        200 => (Some(highwater_osm::tiles::fresh::gunzip(&body).unwrap()), h),
        204 => (None, h),
        other => panic!(
            "{}: {other} {}",
            tile_url(t),
            String::from_utf8_lossy(&body)
        ),
    }
}

fn dirty(p: &Project) -> Vec<Tile> {
    let st = highwater_osm::open_store(&p.path(".highwater/osm")).unwrap();
    st.dirty_tiles("base", DrainOrder::LowZoomFirst, usize::MAX)
        .unwrap()
}

fn stored(p: &Project, t: Tile) -> Option<Vec<u8>> {
    Mbtiles::open(&p.path("tiles/base.mbtiles"))
        .unwrap()
        .unwrap()
        .get(t)
        .unwrap()
}

/// Decoded, for comparisons that say which features differ.
fn decoded(b: &Option<Vec<u8>>) -> Option<Vec<(String, Vec<mvt::TileFeature>)>> {
    b.as_ref().map(|b| mvt::decode(b).unwrap())
}

fn cfg(p: &Project) -> highwater_osm::ops::OsmConfig {
    let text = p.read("highwater.toml");
    let v: toml::Value = toml::from_str(&text).unwrap();
    highwater_osm::ops::OsmConfig::parse(v.get("osm"), &p.path("highwater.toml"), p.dir.path())
        .unwrap()
}

fn status(p: &Project) -> serde_json::Value {
    let r = p.check(&["osm", "status", "--json"], 0);
    r.json()["datasets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "base")
        .unwrap()
        .clone()
}

/// Issue 23: the tile served for a dirty tile equals the tile after
/// `osm tiles drain` (decoded), differs from the stale one for some, and
/// the MBTiles file stays byte-identical while serve answers.
#[test]
fn a_dirty_tile_is_served_as_the_next_drain_cuts_it() {
    let p = project(3048..=3052);
    p.check(&["osm", "replicate", "--from", "updates"], 0);
    let dirty = dirty(&p);
    assert!(!dirty.is_empty(), "the deferred diffs left no dirty tile");
    let old: Vec<Option<Vec<u8>>> = dirty.iter().map(|t| stored(&p, *t)).collect();
    let file_before = std::fs::read(p.path("tiles/base.mbtiles")).unwrap();
    let mut s = serve(&p, &[]);
    let mut fresh = Vec::new();
    let mut etags = Vec::new();
    for t in &dirty {
        let (b, h) = served(&s.addr, *t);
        assert!(h.contains_key("x-highwater-fresh"), "{t:?}: {h:?}");
        assert!(!h.contains_key("x-highwater-stale"), "{t:?}: {h:?}");
        assert_eq!(h.get("cache-control").map(String::as_str), Some("no-cache"));
        etags.push(h.get("etag").cloned());
        fresh.push(b);
    }
    // A second round comes from memory, the same bytes.
    for (t, f) in dirty.iter().zip(&fresh) {
        assert_eq!(&served(&s.addr, *t).0, f, "{t:?}");
    }
    let m = get(&s.addr, "/metrics").2;
    let m = String::from_utf8(m).unwrap();
    let n = dirty.len() * 2;
    assert!(
        m.contains(&format!(
            "highwater_osm_dirty_tiles_served_total{{dataset=\"base\",how=\"fresh\"}} {n}"
        )),
        "{m}"
    );
    assert_eq!(s.terminate(std::time::Duration::from_secs(30)), Some(0));
    assert_eq!(
        std::fs::read(p.path("tiles/base.mbtiles")).unwrap(),
        file_before,
        "serve wrote the MBTiles file"
    );
    let st = status(&p);
    assert_eq!(st["requests"]["served_fresh"], n as u64, "{st}");
    assert_eq!(
        st["requests"]["dirty_requested"],
        dirty.len() as u64,
        "{st}"
    );
    p.check(&["osm", "tiles", "drain"], 0);
    let mut changed = 0;
    for ((t, f), o) in dirty.iter().zip(&fresh).zip(&old) {
        let drained = stored(&p, *t);
        assert_eq!(
            decoded(f),
            decoded(&drained),
            "{t:?}: served fresh vs drained"
        );
        assert_eq!(f, &drained, "{t:?}: bytes");
        changed += usize::from(f != o);
    }
    assert!(changed > 0, "no served tile differs from its stale copy");
    // Issue 50: the same bytes, the same ETag, cut fresh or drained: a
    // client holding the fresh tile revalidates the drained one with a 304.
    let s = serve(&p, &[]);
    for (t, etag) in dirty.iter().zip(&etags) {
        let (_, h) = served(&s.addr, *t);
        assert_eq!(h.get("etag"), etag.as_ref(), "{t:?}: fresh vs drained ETag");
        assert!(
            !h.contains_key("x-highwater-fresh"),
            "{t:?}: drained: {h:?}"
        );
        if let Some(e) = etag {
            let (code, h, _) = http(
                &s.addr,
                "GET",
                &tile_url(*t),
                &[("Accept-Encoding", "gzip"), ("If-None-Match", e)],
            );
            assert_eq!(code, 304, "{t:?}: {h:?}");
        }
    }
}

/// Issue 23: a cut that fails, or outlasts the time limit, serves the
/// stored tile with a header saying so, and the stale metric counts it;
/// never an error page for a tile that exists.
#[test]
fn a_failed_or_slow_cut_serves_the_stale_tile_saying_so() {
    let p = project(3048..=3050);
    p.check(&["osm", "replicate", "--from", "updates"], 0);
    let dirty = dirty(&p);
    let t = *dirty
        .iter()
        .find(|t| stored(&p, **t).is_some())
        .expect("a dirty tile the file has");
    let want = stored(&p, t);
    // (failpoint, extra serve arguments, what the header says)
    let cases: [(&str, &[&str], &str); 2] = [
        ("fail-fresh-cut:base", &[], "failed"),
        (
            "slow-fresh-cut:base",
            &["--fresh-cut-timeout-ms", "200"],
            "longer than 200 ms",
        ),
    ];
    for (fp, extra, says) in cases {
        let mut cmd = p.cmd(&[["serve", "--listen", "127.0.0.1:0"].as_slice(), extra].concat());
        cmd.env("HIGHWATER_FAILPOINT", fp);
        let mut s = serve_cmd(cmd);
        let (b, h) = served(&s.addr, t);
        assert_eq!(b, want, "{fp}: the stored tile");
        let stale = h
            .get("x-highwater-stale")
            .unwrap_or_else(|| panic!("{fp}: {h:?}"));
        assert!(stale.contains(says), "{fp}: {stale}");
        assert!(!h.contains_key("x-highwater-fresh"), "{fp}");
        let m = String::from_utf8(get(&s.addr, "/metrics").2).unwrap();
        assert!(
            m.contains("highwater_osm_dirty_tiles_served_total{dataset=\"base\",how=\"stale\"}"),
            "{m}"
        );
        assert_eq!(s.terminate(std::time::Duration::from_secs(30)), Some(0));
    }
    let st = status(&p);
    assert_eq!(st["requests"]["served_stale"], 2, "{st}");
    let text = p.check(&["osm", "status"], 0).stdout;
    assert!(text.contains("served fresh 0, stale 2"), "{text}");
}

/// Issue 23: two dirty tiles, one requested five times: `drain --max 1
/// --priority requested` re-cuts that one; then, with no --priority, the
/// drain ranks by requests too (the default once requests were seen).
#[test]
fn the_most_requested_dirty_tile_is_drained_first() {
    let p = project(3048..=3052);
    p.check(&["osm", "replicate", "--from", "updates"], 0);
    let d = dirty(&p);
    assert!(d.len() >= 3, "{d:?}");
    // The last two in low-zoom-first order: a drain by zoom takes d[0].
    let (a, b) = (d[d.len() - 2], d[d.len() - 1]);
    let mut s = serve(&p, &[]);
    for _ in 0..5 {
        served(&s.addr, b);
    }
    served(&s.addr, a);
    assert_eq!(s.terminate(std::time::Duration::from_secs(30)), Some(0));
    let st = status(&p);
    assert_eq!(st["requests"]["dirty_requested"], 2, "{st}");
    assert_eq!(st["requests"]["dirty_requests"], 6, "{st}");
    p.check(
        &[
            "osm",
            "tiles",
            "drain",
            "--max",
            "1",
            "--priority",
            "requested",
        ],
        0,
    );
    let now = dirty(&p);
    assert!(
        !now.contains(&b),
        "the tile asked for five times is still dirty"
    );
    assert!(now.contains(&a) && now.contains(&d[0]));
    p.check(&["osm", "tiles", "drain", "--max", "1"], 0);
    let now = dirty(&p);
    assert!(!now.contains(&a), "the default did not rank by requests");
    assert!(now.contains(&d[0]));
}

/// Issue 23, property: serving fresh never returns a tile that differs
/// from a rebuild at the store's current generation, over several
/// generations (batches of real diffs applied while serve runs).
#[test]
fn serving_fresh_equals_a_rebuild_at_every_generation() {
    let p = project(3048..=3076);
    let c = cfg(&p);
    let d = c.of::<highwater_osm::tiles::TileDataset>()[0];
    let s = serve(&p, &[]);
    // Batches of different sizes, each a new generation.
    let mut at = 3047;
    let mut checked = 0;
    for n in [1, 3, 2, 7, 5, 11] {
        let upto = at + n;
        let files: Vec<String> = (at + 1..=upto)
            .map(|q| {
                p.path(&format!("updates/000/003/{:03}.osc.gz", q - 3000))
                    .display()
                    .to_string()
            })
            .collect();
        let mut args = vec!["osm", "apply"];
        args.extend(files.iter().map(String::as_str));
        p.check(&args, 0);
        at = upto;
        let st = highwater_osm::open_store(&p.path(".highwater/osm")).unwrap();
        let view = highwater_osm::tiles::rebuild_view(&st, &d.layer).unwrap();
        let dirty = st
            .dirty_tiles("base", DrainOrder::LowZoomFirst, usize::MAX)
            .unwrap();
        checked += dirty.len();
        for t in dirty {
            let (b, h) = served(&s.addr, t);
            assert!(h.contains_key("x-highwater-fresh"), "{t:?} at {at}: {h:?}");
            assert_eq!(b, view.cut(t, d), "{t:?} at sequence {at}");
        }
    }
    assert!(checked > 0, "no diff left a dirty tile");
}

/// Issue 23: serve answers a clean tile on its event loop (no hand-off to
/// a blocking thread) once its fresh view and an MBTiles connection are
/// warm. A tile served clean that way is served fresh by the very next
/// request after a commit dirties it: the fast path looks, on every
/// request, whether the store moved (its WAL-index header, else its
/// version probe), it never trusts an earlier answer.
#[test]
fn a_tile_served_clean_is_served_fresh_right_after_the_commit_that_dirties_it() {
    clean_then_fresh_then_drained(None);
}

/// The same with the WAL-index header never mapped: the version probe
/// answers every request (the fallback when the header cannot be read).
#[test]
fn the_same_holds_when_the_probe_answers_every_request() {
    clean_then_fresh_then_drained(Some("no-wal-index"));
}

fn clean_then_fresh_then_drained(failpoint: Option<&str>) {
    // The tiles the diffs will dirty, learnt on a twin project.
    let twin = project(3048..=3076);
    twin.check(&["osm", "replicate", "--from", "updates"], 0);
    let will = dirty(&twin);
    assert!(!will.is_empty(), "the diffs dirty no tile");
    let p = project(3048..=3076);
    let c = cfg(&p);
    let mut cmd = p.cmd(&["serve", "--listen", "127.0.0.1:0"]);
    if let Some(f) = failpoint {
        cmd.env("HIGHWATER_FAILPOINT", f);
    }
    let s = serve_cmd(cmd);
    // Clean now: several rounds, so all but the first are on the warm path.
    for _ in 0..3 {
        for t in &will {
            let (b, h) = served(&s.addr, *t);
            assert!(!h.contains_key("x-highwater-fresh"), "{t:?}: {h:?}");
            assert_eq!(b, stored(&p, *t), "{t:?}");
        }
    }
    p.check(&["osm", "replicate", "--from", "updates"], 0);
    assert_eq!(dirty(&p), will, "the twin dirtied other tiles");
    let st = highwater_osm::open_store(&p.path(".highwater/osm")).unwrap();
    let view = highwater_osm::tiles::rebuild_view(
        &st,
        &c.of::<highwater_osm::tiles::TileDataset>()[0].layer,
    )
    .unwrap();
    let before: Vec<Option<Vec<u8>>> = will.iter().map(|t| stored(&p, *t)).collect();
    for t in &will {
        let (b, h) = served(&s.addr, *t);
        assert!(h.contains_key("x-highwater-fresh"), "{t:?}: {h:?}");
        assert_eq!(
            b,
            view.cut(*t, c.of::<highwater_osm::tiles::TileDataset>()[0]),
            "{t:?}"
        );
    }
    // Drained, the tiles are clean again with new stored bytes: the bytes
    // serve kept in memory from before the diff are never served again
    // (its clean-tile cache moves with every commit to the store).
    p.check(&["osm", "tiles", "drain"], 0);
    assert!(dirty(&p).is_empty());
    let after: Vec<Option<Vec<u8>>> = will.iter().map(|t| stored(&p, *t)).collect();
    assert!(
        before.iter().zip(&after).any(|(b, a)| b != a),
        "the drain changed no stored tile: the check below would prove nothing"
    );
    for _ in 0..3 {
        for (t, a) in will.iter().zip(&after) {
            let (b, h) = served(&s.addr, *t);
            assert!(!h.contains_key("x-highwater-fresh"), "{t:?}: {h:?}");
            assert_eq!(&b, a, "{t:?}: served after the drain vs stored");
        }
    }
}

/// Issue 23: the fresh view's per-request check, on a real store changed
/// by another process. While nobody commits, `state_now` answers from the
/// store's WAL-index header (SQLite is not asked); a commit (a diff
/// applied, a drain) moves the header, and the very next `state_now` says
/// the store moved, so serve reads it again; once read, the header answers
/// again. With the header not mapped (the fallback), the probe answers
/// every time and says the same.
#[test]
fn the_fresh_view_answers_from_the_wal_index_until_a_commit() {
    let p = project(3048..=3076);
    let dir = p.path(".highwater/osm");
    let twin = project(3048..=3076);
    twin.check(&["osm", "replicate", "--from", "updates"], 0);
    let will = dirty(&twin);
    let t = will[0];
    let mut v =
        highwater_osm::tiles::fresh::FreshView::open(&dir, &highwater_osm::store_extension())
            .unwrap();
    let (g0, d0) = v.state("base", t).unwrap();
    assert!(!d0, "{t:?} is dirty before the diffs");
    for _ in 0..3 {
        assert!(v.header_unmoved(), "no commit, yet the header moved");
        assert_eq!(v.state_now("base", t).unwrap(), Some((g0, false)));
    }
    // Another process commits (the diffs applied, deferred: tiles dirtied).
    p.check(&["osm", "replicate", "--from", "updates"], 0);
    assert!(!v.header_unmoved(), "a commit left the header as it was");
    assert_eq!(
        v.state_now("base", t).unwrap(),
        None,
        "the request after a commit was answered from the old view"
    );
    let (g1, d1) = v.state("base", t).unwrap();
    assert!(g1 > g0 && d1, "{t:?}: generation {g0} -> {g1}, dirty {d1}");
    assert!(v.header_unmoved());
    assert_eq!(v.state_now("base", t).unwrap(), Some((g1, true)));
    // A drain commits too: the tile is clean again at once.
    p.check(&["osm", "tiles", "drain"], 0);
    assert_eq!(v.state_now("base", t).unwrap(), None);
    let (g2, d2) = v.state("base", t).unwrap();
    assert!(!d2, "{t:?} dirty after the drain (generation {g2})");
    assert_eq!(v.state_now("base", t).unwrap(), Some((g2, false)));

    // The fallback: no header, the probe every time, the same answers.
    let q = project(3048..=3076);
    let mut w = highwater_osm::tiles::fresh::FreshView::open_probe_only(
        &q.path(".highwater/osm"),
        &highwater_osm::store_extension(),
    )
    .unwrap();
    let (h0, _) = w.state("base", t).unwrap();
    assert!(!w.header_unmoved(), "the header answers with no map");
    assert_eq!(w.state_now("base", t).unwrap(), Some((h0, false)));
    q.check(&["osm", "replicate", "--from", "updates"], 0);
    assert_eq!(w.state_now("base", t).unwrap(), None);
    assert!(w.state("base", t).unwrap().1);
}
