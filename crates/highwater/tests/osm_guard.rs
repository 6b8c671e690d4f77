//! Issue 23: the guard on the affected set. After Monaco's 29 real
//! minutely diffs (3048..3076), a diff moving every building is far
//! outside the tile dataset's recent affected sets: it still applies to
//! the primary store (which stands at its sequence), but the tile dataset
//! is held (marker stopped, drain refused with exit 2 naming the diff, the
//! size and the median) until `osm tiles drain --force` (or, for every
//! kind, `osm drain NAME --force`: issue 50), after which
//! `verify` equals a rebuild. Search is held by its own guard, aggregates
//! (guard off) go on: each dataset independently. A first diff, with no
//! history, is never held; the history survives restarts (every command
//! here is a process of its own). A diff that changes tags a dataset
//! reads yet derives nothing for it warns, naming the diff.
//!
//! Data: crates/highwater-osm/tests/data (SOURCE.md there).

mod common;
use common::osm::{data, monaco_updates};
use common::*;
use std::fmt::Write as _;

const CONFIG: &str = r#"
[osm]
store = ".highwater/osm"

[osm.tiles.base]
zooms = "12-14"
keys = ["building", "highway", "landuse"]
mbtiles = "tiles/base.mbtiles"
drain = "deferred"
# Monaco's pyramid at z12-14 is about 10 tiles, and its minutely diffs
# dirty a median of 0 (counted as 1): at the defaults (50 times, and
# never at most 1000 tiles) no diff could
# be held, since none can dirty more tiles than the pyramid has.
affected_guard = 5
affected_guard_min = 5

[osm.search.places]
index = "search/places"

[osm.aggregates.stats]
classes = ["building", "highway"]
affected_guard = 0
"#;

fn project() -> Project {
    let p = Project::new(CONFIG);
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    p.check(&["osm", "tiles", "build"], 0);
    p.check(&["osm", "rebuild", "places"], 0);
    p.check(&["osm", "rebuild", "stats"], 0);
    p
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A change file moving every node of every building way by `d_e7`
/// (degrees x 10^7) east, tags kept, as sequence `seq` (state file beside
/// it), written into the project's `updates/` folder.
fn move_every_building(p: &Project, seq: i64, d_e7: i32) -> String {
    let st = highwater_osm::open_store(&p.path(".highwater/osm")).unwrap();
    let mut nodes = std::collections::BTreeSet::new();
    for (kind, id) in st.tagged_like("\"building\"").unwrap() {
        if kind != highwater_osm::MemberKind::Way {
            continue;
        }
        let w = st.way(id).unwrap().unwrap();
        if w.tags.contains_key("building") {
            nodes.extend(w.refs.iter().copied());
        }
    }
    assert!(
        nodes.len() > 1000,
        "Monaco has {} building nodes",
        nodes.len()
    );
    let mut x = String::from("<?xml version=\"1.0\"?>\n<osmChange version=\"0.6\">\n<modify>\n");
    for id in &nodes {
        let n = st.node(*id).unwrap().unwrap();
        let (lat, lon) = (n.lat_e7.unwrap(), n.lon_e7.unwrap() + d_e7);
        let _ = write!(
            x,
            "<node id=\"{id}\" version=\"99\" lat=\"{:.7}\" lon=\"{:.7}\"",
            lat as f64 / 1e7,
            lon as f64 / 1e7
        );
        if n.tags.is_empty() {
            x.push_str("/>\n");
        } else {
            x.push('>');
            for (k, v) in &n.tags {
                let _ = write!(x, "<tag k=\"{}\" v=\"{}\"/>", xml_escape(k), xml_escape(v));
            }
            x.push_str("</node>\n");
        }
    }
    x.push_str("</modify>\n</osmChange>\n");
    let dir = p.path("updates/000/003");
    std::fs::create_dir_all(&dir).unwrap();
    let osc = dir.join(format!("{:03}.osc.gz", seq - 3000));
    let mut gz = flate2_free_gzip(&x);
    std::fs::write(&osc, std::mem::take(&mut gz)).unwrap();
    std::fs::write(
        dir.join(format!("{:03}.state.txt", seq - 3000)),
        format!("timestamp=2021-08-03T00\\:00\\:00Z\nsequenceNumber={seq}\n"),
    )
    .unwrap();
    osc.display().to_string()
}

/// A gzip member holding `text` uncompressed (stored deflate blocks): the
/// reader unpacks it like any other, with no compression crate needed.
fn flate2_free_gzip(text: &str) -> Vec<u8> {
    let data = text.as_bytes();
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    let mut chunks = data.chunks(65_535).peekable();
    if chunks.peek().is_none() {
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(c) = chunks.next() {
        let last = chunks.peek().is_none();
        out.push(u8::from(last));
        let n = c.len() as u16;
        out.extend_from_slice(&n.to_le_bytes());
        out.extend_from_slice(&(!n).to_le_bytes());
        out.extend_from_slice(c);
    }
    out.extend_from_slice(&crc32(data).to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

fn crc32(data: &[u8]) -> u32 {
    let mut c = 0xffff_ffffu32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}

fn datasets(p: &Project) -> serde_json::Value {
    p.check(&["osm", "status", "--json"], 0).json()
}

fn ds<'a>(s: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    s["datasets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .unwrap()
}

#[test]
fn a_mass_edit_after_real_diffs_holds_each_dataset_by_its_own_guard() {
    let p = project();
    monaco_updates(&p, 48..=76);
    let r = p.check(&["osm", "replicate", "--from", "updates"], 0);
    assert!(
        !r.stderr.contains("is held"),
        "a real diff was held: {}",
        r.stderr
    );
    let s = datasets(&p);
    assert_eq!(s["sequence"], 3076);
    for name in ["base", "places", "stats"] {
        assert!(ds(&s, name)["held"].is_null(), "{name}: {s}");
        assert_eq!(ds(&s, name)["marker"], 3076, "{name}: {s}");
    }
    let osc = move_every_building(&p, 3077, 20);
    // Applied to the primary store; a dataset held: finished, not all
    // done (exit 1).
    let r = p.check(&["osm", "apply", &osc], 1);
    assert!(r.stderr.contains("base is held"), "{}", r.stderr);
    assert!(r.stderr.contains("077.osc.gz"), "{}", r.stderr);
    let s = datasets(&p);
    assert_eq!(
        s["sequence"], 3077,
        "the primary store follows the sequence"
    );
    let base = ds(&s, "base");
    assert_eq!(
        base["marker"], 3076,
        "the held dataset's marker stopped: {base}"
    );
    assert!(
        base["held"]["diff"]
            .as_str()
            .unwrap()
            .contains("077.osc.gz"),
        "{base}"
    );
    let size = base["held"]["size"].as_u64().unwrap();
    let median = base["held"]["median"].as_f64().unwrap();
    let factor = base["held"]["factor"].as_f64().unwrap();
    assert_eq!(factor, 5.0);
    assert!(size as f64 > factor * median.max(1.0), "{base}");
    assert!(
        base["rebuild"].as_str().unwrap().contains("is held"),
        "{base}"
    );
    // Search, by its own guard: held too; aggregates (no guard) go on.
    assert!(ds(&s, "places")["held"].is_object(), "{s}");
    assert_eq!(ds(&s, "places")["marker"], 3076);
    assert!(ds(&s, "stats")["held"].is_null(), "{s}");
    assert_eq!(ds(&s, "stats")["marker"], 3077);
    assert_eq!(ds(&s, "stats")["dirty"], 0, "aggregates drained on apply");
    // The drain refuses, naming the diff, the size and the median.
    let r = p.check(&["osm", "tiles", "drain"], 2);
    for want in ["077.osc.gz", &size.to_string(), &format!("median {median}")] {
        assert!(r.stderr.contains(want), "{want:?} not in: {}", r.stderr);
    }
    let text = p.check(&["osm", "status"], 0).stdout;
    assert!(text.contains("HELD"), "{text}");
    // Serve shows it held.
    let mut srv = common::serve::serve(&p, &[]);
    let m = {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(&srv.addr).unwrap();
        write!(
            c,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut b = String::new();
        c.read_to_string(&mut b).unwrap();
        b
    };
    assert!(m.contains("highwater_osm_held{dataset=\"base\"} 1"), "{m}");
    assert!(m.contains("highwater_osm_held{dataset=\"stats\"} 0"), "{m}");
    assert_eq!(srv.terminate(std::time::Duration::from_secs(30)), Some(0));
    // --force drains it, ends the hold, and the tiles equal a rebuild.
    let r = p.check(&["osm", "tiles", "drain", "--force"], 0);
    assert!(r.stderr.contains("hold is ended"), "{}", r.stderr);
    let s = datasets(&p);
    assert!(ds(&s, "base")["held"].is_null(), "{s}");
    assert_eq!(ds(&s, "base")["marker"], 3077);
    assert_eq!(ds(&s, "base")["dirty"], 0);
    p.check(&["osm", "verify", "base", "--all"], 0);
    // Issue 50: the advice works for every kind. Search's names `osm
    // drain places --force`, which applies what is recorded and ends the
    // hold (`osm tiles drain --force` did nothing for it).
    let places = ds(&s, "places").clone();
    let advice = places["rebuild"].as_str().unwrap();
    assert!(
        advice.contains("highwater osm drain places --force"),
        "{places}"
    );
    let r = p.check(&["osm", "drain", "places"], 2);
    assert!(r.stderr.contains("places is held"), "{}", r.stderr);
    let r = p.check(&["osm", "drain", "places", "--force"], 0);
    assert!(r.stderr.contains("hold is ended"), "{}", r.stderr);
    let s = datasets(&p);
    assert!(ds(&s, "places")["held"].is_null(), "{s}");
    assert_eq!(ds(&s, "places")["marker"], 3077, "{s}");
    assert_eq!(ds(&s, "places")["dirty"], 0, "{s}");
    p.check(&["osm", "verify", "places"], 0);
}

#[test]
fn a_first_diff_with_no_history_is_never_held() {
    let p = project();
    let osc = move_every_building(&p, 3048, 20);
    let r = p.check(&["osm", "apply", &osc], 0);
    assert!(!r.stderr.contains("held"), "{}", r.stderr);
    let s = datasets(&p);
    for name in ["base", "places", "stats"] {
        assert!(ds(&s, name)["held"].is_null(), "{name}: {s}");
        assert_eq!(ds(&s, name)["marker"], 3048, "{name}");
    }
}

/// A change file re-tagging one building way (`building` becomes `house`,
/// a tag the tile dataset reads; nodes kept), as sequence `seq` (state
/// file beside it).
fn retag_one_building(p: &Project, seq: i64) -> String {
    let st = highwater_osm::open_store(&p.path(".highwater/osm")).unwrap();
    let w = st
        .tagged_like("\"building\"")
        .unwrap()
        .into_iter()
        .filter(|(k, _)| *k == highwater_osm::MemberKind::Way)
        .filter_map(|(_, id)| st.way(id).unwrap())
        .find(|w| w.tags.get("building").is_some_and(|v| v != "house"))
        .expect("Monaco has a building way");
    let mut x = format!(
        "<?xml version=\"1.0\"?>\n<osmChange version=\"0.6\">\n<modify>\n<way id=\"{}\" version=\"99\">",
        w.id
    );
    for r in &w.refs {
        let _ = write!(x, "<nd ref=\"{r}\"/>");
    }
    for (k, v) in &w.tags {
        let v = if k == "building" { "house" } else { v.as_str() };
        let _ = write!(x, "<tag k=\"{}\" v=\"{}\"/>", xml_escape(k), xml_escape(v));
    }
    x.push_str("</way>\n</modify>\n</osmChange>\n");
    let dir = p.path("updates/000/003");
    std::fs::create_dir_all(&dir).unwrap();
    let osc = dir.join(format!("{:03}.osc.gz", seq - 3000));
    std::fs::write(&osc, flate2_free_gzip(&x)).unwrap();
    std::fs::write(
        dir.join(format!("{:03}.state.txt", seq - 3000)),
        format!("timestamp=2021-08-02T00\\:00\\:00Z\nsequenceNumber={seq}\n"),
    )
    .unwrap();
    osc.display().to_string()
}

/// Issue 23: a diff that changes tags the tile dataset reads, yet dirties
/// no tile, is a derivation bug: `osm apply` says so on stderr, naming the
/// dataset and the diff. The bug is made by a failpoint that loses the
/// derived tiles; the same diff without it dirties tiles and says nothing.
#[test]
fn a_diff_that_changes_read_tags_yet_derives_no_tile_warns_naming_it() {
    // Failpoint in; warned, and how many tiles the diff dirtied, out.
    let check = |failpoint: Option<&str>, warned: bool, dirtied: bool| {
        let p = project();
        let osc = retag_one_building(&p, 3048);
        let mut c = p.cmd(&["osm", "apply", &osc]);
        if let Some(f) = failpoint {
            c.env("HIGHWATER_FAILPOINT", f);
        }
        let o = c.output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{failpoint:?}: {:?} {stderr}", o.status);
        let says = stderr.contains("base: diff")
            && stderr.contains("048.osc.gz (sequence 3048)")
            && stderr.contains("yet derived nothing");
        assert_eq!(says, warned, "{failpoint:?}: {stderr}");
        let st = highwater_osm::open_store(&p.path(".highwater/osm")).unwrap();
        let n = st.dirty_count("base").unwrap();
        assert_eq!(n > 0, dirtied, "{failpoint:?}: {n} dirty tiles; {stderr}");
    };
    check(Some("derive-nothing:base"), true, false);
    check(None, false, true);
}

/// Issue 50: `verify` of a search dataset whose keys are dirty (its drain
/// failed after Monaco's real diffs) counts the documents that differ only
/// by those keys as pending, apart from differences, and passes; after a
/// drain nothing is pending.
#[test]
fn verify_counts_a_search_datasets_pending_keys_apart_from_differences() {
    let p = project();
    monaco_updates(&p, 48..=76);
    let out = p
        .cmd(&["osm", "replicate", "--from", "updates"])
        .env("HIGHWATER_FAILPOINT", "fail-drain:places")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(ds(&datasets(&p), "places")["dirty"].as_u64().unwrap() > 0);
    let v = p.check(&["osm", "verify", "places", "--json"], 0).json();
    let v = &v["verify"];
    assert_eq!(v["differences"], serde_json::json!([]), "{v}");
    assert!(v["pending"].as_u64().unwrap() > 0, "{v}");
    let text = p.check(&["osm", "verify", "places"], 0).stdout;
    assert!(text.contains("dirty keys the next drain applies"), "{text}");
    p.check(&["osm", "drain", "places"], 0);
    let v = p.check(&["osm", "verify", "places", "--json"], 0).json();
    assert_eq!(v["verify"]["pending"], 0, "{v}");
    assert_eq!(v["verify"]["differences"], serde_json::json!([]), "{v}");
}

/// Issue 50: at the default guard (`affected_guard` 50, floor 1000), a
/// city's tile datasets are smaller than the floor: Monaco's building,
/// highway and landuse tiles are 10 at z12-14 and 58 at z10-16. The share rule holds the mass
/// edit (every building moved, dirtying most of each) on both, while the
/// 29 real minutely diffs before it pass.
const DEFAULTS: &str = r#"
[osm]
store = ".highwater/osm"

[osm.tiles.city]
zooms = "12-14"
keys = ["building", "highway", "landuse"]
mbtiles = "tiles/city.mbtiles"
drain = "deferred"

[osm.tiles.detail]
zooms = "10-16"
keys = ["building", "highway", "landuse"]
mbtiles = "tiles/detail.mbtiles"
drain = "deferred"
"#;

#[test]
fn a_mass_edit_on_a_city_is_held_at_the_default_guard_while_real_diffs_pass() {
    let p = Project::new(DEFAULTS);
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    p.check(&["osm", "tiles", "build"], 0);
    monaco_updates(&p, 48..=76);
    let r = p.check(&["osm", "replicate", "--from", "updates"], 0);
    assert!(
        !r.stderr.contains("is held"),
        "a real diff was held: {}",
        r.stderr
    );
    p.check(&["osm", "tiles", "drain"], 0);
    let osc = move_every_building(&p, 3077, 20);
    // Applied to the primary store; both datasets drain deferred, so the
    // apply itself is all done (exit 0) and says the holds.
    let r = p.check(&["osm", "apply", &osc], 0);
    let s = datasets(&p);
    assert_eq!(s["sequence"], 3077);
    for name in ["city", "detail"] {
        let d = ds(&s, name);
        assert!(d["held"].is_object(), "{name} not held: {d}\n{}", r.stderr);
        assert_eq!(d["marker"], 3076, "{d}");
        let h = &d["held"];
        let (size, total) = (h["size"].as_u64().unwrap(), h["total"].as_u64().unwrap());
        assert!(size < 1000, "below the floor: {h}");
        assert!(size * 2 >= total, "at least half its units: {h}");
        assert!(
            r.stderr.contains(&format!("{name} is held"))
                && r.stderr.contains(&format!("of its {total} units")),
            "{}",
            r.stderr
        );
    }
    // The drain refuses until forced, as for any hold.
    p.check(&["osm", "tiles", "drain"], 2);
    p.check(&["osm", "drain", "city", "--force"], 0);
    assert!(ds(&datasets(&p), "city")["held"].is_null());
}
