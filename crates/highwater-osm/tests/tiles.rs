//! The vector-tile dataset kept current equals its rebuild, tile for tile
//! (decoded MVT): after random edits, along the real Monaco timelines, after
//! deferred drains, and across a recipe change; for two layers of tags as
//! they are and for the bundled Shortbread schema at z0-14.

use highwater_core::tile::Tile;
use highwater_osm::ops::{self, OsmConfig};
use highwater_osm::store::{DrainOrder, Store};
use highwater_osm::tiles::mvt;
use highwater_osm::tiles::TileDataset;
use highwater_osm::tiles::{self, Mbtiles};
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::path::Path;

mod common;
use common::*;

const DATASETS: &str = r#"
[osm.tiles.a]
zooms = "12-15"
keys = ["*"]
buffer = 0.1
diff_expire = true
mbtiles = "a.mbtiles"
drain_rebuild_share = 1000

[osm.tiles.b]
zooms = "13-16"
keys = ["highway", "building", "name", "landuse", "route"]
buffer = 0
mbtiles = "b.mbtiles"
drain_rebuild_share = 1000

[osm.tiles.sb]
schema = "shortbread"
mbtiles = "sb.mbtiles"
drain_rebuild_share = 1000
"#;

fn config(dir: &Path, tiles: &str) -> OsmConfig {
    let text = format!("[osm]\nstore = \"store\"\n{tiles}");
    let v: toml::Value = toml::from_str(&text).unwrap();
    OsmConfig::parse(v.get("osm"), &dir.join("highwater.toml"), dir).unwrap()
}

/// The one check of this file: the dataset's file and a rebuild from the
/// store hold the same tiles, and each decodes to the same features.
fn check(store: &Store, d: &TileDataset) {
    let view = tiles::rebuild_view(store, &d.layer).unwrap();
    let mb = Mbtiles::open(d.mbtiles.as_ref().unwrap()).unwrap().unwrap();
    let mut all: BTreeSet<Tile> = mb.tiles().unwrap().into_iter().collect();
    all.extend(view.by_tile.keys().copied());
    let mut shown = 0;
    for t in all {
        let have = mb.get(t).unwrap().map(|b| mvt::decode(&b).unwrap());
        let want = view.cut(t, d).map(|b| mvt::decode(&b).unwrap());
        assert_eq!(have, want, "{}: tile {}", d.name, t.to_zxy());
        shown += usize::from(have.is_some());
    }
    assert!(shown > 0, "{}: no tile at all", d.name);
}

fn apply_and_drain(store: &mut Store, cfg: &OsmConfig, diff: ops::Diff) {
    ops::apply(store, cfg, &[diff], false).unwrap();
    for d in cfg.of::<TileDataset>() {
        let r = tiles::drain(store, d, usize::MAX, DrainOrder::LowZoomFirst).unwrap();
        assert_eq!(r.backlog, 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn tiles_after_random_edits_equal_a_rebuild(steps in prop::collection::vec(prop::collection::vec(edit(), 1..5), 1..4)) {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = config(tmp.path(), DATASETS);
        let mut store = monaco(&tmp.path().join("store"));
        for d in cfg.of::<TileDataset>() {
            tiles::build(&mut store, d).unwrap();
        }
        let ids = ids(&store);
        let mut fresh = 1_i64 << 40;
        for step in &steps {
            let mut diff = Vec::new();
            for e in step {
                diff.extend(changes(&store, &ids, e, &mut fresh));
            }
            apply_and_drain(&mut store, &cfg, (diff, None));
            for d in cfg.of::<TileDataset>() {
                check(&store, d);
            }
        }
    }
}

#[test]
fn monaco_3047_to_3076_one_diff_at_a_time_equals_a_rebuild() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), DATASETS);
    let mut store = monaco(&tmp.path().join("store"));
    for d in cfg.of::<TileDataset>() {
        tiles::build(&mut store, d).unwrap();
    }
    let files = ops::pending(&store, &data("monaco-updates")).unwrap();
    assert_eq!(files.len(), 29);
    for f in files {
        let mut d = ops::read_diffs(&[f]).unwrap();
        apply_and_drain(&mut store, &cfg, d.remove(0));
    }
    assert_eq!(store.meta("sequence").unwrap().as_deref(), Some("3076"));
    for d in cfg.of::<TileDataset>() {
        check(&store, d);
        let v = tiles::verify(&store, d, None).unwrap();
        assert!(v.checked > 0 && v.differences.is_empty(), "{v:?}");
    }
}

/// Monaco 2787 → 2947 → 3047 through the derived diffs (months of edits
/// each): the tiles equal both a rebuild from the store and a build from
/// the real 3047 snapshot imported on its own.
#[test]
fn monaco_2787_to_3047_via_derived_diffs_equals_the_final_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let inc = tmp.path().join("inc");
    let cfg = config(&inc, DATASETS);
    let mut store = highwater_osm::create_store(&inc.join("store")).unwrap();
    highwater_osm::import::import(&mut store, &data("monaco-2787-20201109.osm.pbf")).unwrap();
    for d in cfg.of::<TileDataset>() {
        tiles::build(&mut store, d).unwrap();
    }
    for name in [
        "monaco-2787__to__2947.osc.gz",
        "monaco-2947__to__3047.osc.gz",
    ] {
        let mut d = ops::read_diffs(&[data(&format!("monaco-derived/{name}"))]).unwrap();
        apply_and_drain(&mut store, &cfg, d.remove(0));
    }
    let snap = tmp.path().join("snap");
    let snap_cfg = config(&snap, DATASETS);
    let mut fresh = highwater_osm::create_store(&snap.join("store")).unwrap();
    highwater_osm::import::import(&mut fresh, &data("monaco-3047-20210801.osm.pbf")).unwrap();
    for (d, s) in cfg
        .of::<TileDataset>()
        .into_iter()
        .zip(snap_cfg.of::<TileDataset>())
    {
        check(&store, d);
        tiles::build(&mut fresh, s).unwrap();
        let (a, b) = (
            Mbtiles::open(d.mbtiles.as_ref().unwrap()).unwrap().unwrap(),
            Mbtiles::open(s.mbtiles.as_ref().unwrap()).unwrap().unwrap(),
        );
        assert_eq!(a.tiles().unwrap(), b.tiles().unwrap(), "{}", d.name);
        for t in a.tiles().unwrap() {
            assert_eq!(a.get(t).unwrap(), b.get(t).unwrap(), "{}", t.to_zxy());
        }
    }
}

#[test]
fn a_deferred_drain_takes_coarse_tiles_first_and_reports_the_backlog() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(
        tmp.path(),
        r#"
[osm.tiles.d]
zooms = "12-16"
keys = ["*"]
mbtiles = "d.mbtiles"
drain = "deferred"
drain_rebuild_share = 1000
"#,
    );
    let d = cfg.of::<TileDataset>()[0];
    assert!(!d.drain_on_apply);
    let mut store = monaco(&tmp.path().join("store"));
    tiles::build(&mut store, d).unwrap();
    let files = ops::pending(&store, &data("monaco-updates")).unwrap();
    let diffs = ops::read_diffs(&files[..10]).unwrap();
    ops::apply(&mut store, &cfg, &diffs, false).unwrap();
    let dirty = store.dirty_count("d").unwrap();
    assert!(dirty > 5, "{dirty}");
    let first = store.dirty_tiles("d", DrainOrder::LowZoomFirst, 3).unwrap();
    assert!(
        first[0].z == 12 && first.windows(2).all(|w| w[0].z <= w[1].z),
        "{first:?}"
    );
    let r = tiles::drain(&mut store, d, 3, DrainOrder::LowZoomFirst).unwrap();
    assert_eq!((r.recut, r.backlog), (3, dirty - 3));
    // More diffs than the drain keeps up with: the next drain warns.
    let more = ops::read_diffs(&files[10..]).unwrap();
    ops::apply(&mut store, &cfg, &more, false).unwrap();
    let r = tiles::drain(&mut store, d, 1, DrainOrder::MostEdited).unwrap();
    assert_eq!(r.growing_from, Some(dirty - 3), "{r:?}");
    let r = tiles::drain(&mut store, d, usize::MAX, DrainOrder::MostEdited).unwrap();
    assert_eq!(r.backlog, 0);
    check(&store, d);
}

#[test]
fn a_recipe_change_rebuilds_the_file_and_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let tiles_cfg = |z: &str| {
        format!("[osm.tiles.r]\nzooms = \"{z}\"\nkeys = [\"*\"]\nmbtiles = \"r.mbtiles\"\n")
    };
    let old = config(tmp.path(), &tiles_cfg("12-14"));
    let mut store = monaco(&tmp.path().join("store"));
    tiles::build(&mut store, old.of::<TileDataset>()[0]).unwrap();
    let new = config(tmp.path(), &tiles_cfg("12-15"));
    let r = tiles::drain(
        &mut store,
        new.of::<TileDataset>()[0],
        usize::MAX,
        DrainOrder::LowZoomFirst,
    )
    .unwrap();
    let why = r
        .rebuilt
        .as_ref()
        .and_then(|b| b.reason.clone())
        .unwrap_or_default();
    assert!(why.contains("recipe changed"), "{r:?}");
    let mb = Mbtiles::open(new.of::<TileDataset>()[0].mbtiles.as_ref().unwrap())
        .unwrap()
        .unwrap();
    assert!(mb.tiles().unwrap().iter().any(|t| t.z == 15));
    assert_eq!(
        mb.metadata("highwater_recipe").unwrap(),
        Some(new.of::<TileDataset>()[0].recipe.clone())
    );
    check(&store, new.of::<TileDataset>()[0]);
}

/// A tile whose only feature goes away is deleted from the file, not left
/// holding an empty tile or the old one.
#[test]
fn a_tile_that_becomes_empty_is_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(
        tmp.path(),
        "[osm.tiles.e]\nzooms = \"14-15\"\nkeys = [\"*\"]\nmbtiles = \"e.mbtiles\"\ndrain_rebuild_share = 1000\n",
    );
    let mut store = highwater_osm::create_store(&tmp.path().join("store")).unwrap();
    let osm = tmp.path().join("one.osm");
    std::fs::write(
        &osm,
        r#"<osm version="0.6"><node id="1" lat="43.7350" lon="7.4246"><tag k="amenity" v="cafe"/></node></osm>"#,
    )
    .unwrap();
    highwater_osm::import::import(&mut store, &osm).unwrap();
    let d = cfg.of::<TileDataset>()[0];
    tiles::build(&mut store, d).unwrap();
    let mb = Mbtiles::open(d.mbtiles.as_ref().unwrap()).unwrap().unwrap();
    assert_eq!(mb.tiles().unwrap().len(), 2);
    let del = tmp.path().join("del.osc");
    std::fs::write(
        &del,
        r#"<osmChange><delete><node id="1"/></delete></osmChange>"#,
    )
    .unwrap();
    let diffs = ops::read_diffs(&[del]).unwrap();
    ops::apply(&mut store, &cfg, &diffs, false).unwrap();
    let r = tiles::drain(&mut store, d, usize::MAX, DrainOrder::LowZoomFirst).unwrap();
    assert_eq!((r.recut, r.deleted), (2, 2));
    assert!(mb.tiles().unwrap().is_empty());
}

/// The file is a standard MBTiles: TMS rows, gzip-compressed MVT, the
/// metadata a tile server reads.
#[test]
fn the_file_is_standard_mbtiles() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), DATASETS);
    let mut store = monaco(&tmp.path().join("store"));
    let d = cfg.of::<TileDataset>()[1];
    tiles::build(&mut store, d).unwrap();
    let conn = rusqlite::Connection::open(d.mbtiles.as_ref().unwrap()).unwrap();
    let meta = |k: &str| -> String {
        conn.query_row("SELECT value FROM metadata WHERE name = ?1", [k], |r| {
            r.get(0)
        })
        .unwrap()
    };
    assert_eq!(meta("format"), "pbf");
    assert_eq!(
        (meta("minzoom"), meta("maxzoom")),
        ("13".into(), "16".into())
    );
    let json: serde_json::Value = serde_json::from_str(&meta("json")).unwrap();
    assert_eq!(json["vector_layers"][0]["id"], "b");
    // Monaco's port at z16 is x 34118, y 23897 (XYZ): TMS row 65535 - y.
    let t = highwater_core::tile::tile_of(7.4246, 43.7350, 16);
    let data: Vec<u8> = conn
        .query_row(
            "SELECT tile_data FROM tiles WHERE zoom_level = 16 AND tile_column = ?1 AND tile_row = ?2",
            [t.x, (1 << 16) - 1 - t.y],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(&data[..2], &[0x1f, 0x8b], "gzip");
    let layers = mvt::decode(&tiles_gunzip(&data)).unwrap();
    assert_eq!(layers[0].0, "b");
    assert!(layers[0].1.iter().any(|f| f.tags.contains_key("highway")));
}

fn tiles_gunzip(b: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(b)
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// Beyond tiles_affected_max, expiry zooms out to coarse tiles, which stand
/// for their whole subtree: the drain rebuilds the file instead of
/// re-cutting only those, and says why.
#[test]
fn too_many_affected_tiles_rebuild_the_file_and_say_why() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(
        tmp.path(),
        "[osm.tiles.m]\nzooms = \"12-16\"\nkeys = [\"*\"]\nmbtiles = \"m.mbtiles\"\ntiles_affected_max = 2\n",
    );
    let d = cfg.of::<TileDataset>()[0];
    let mut store = monaco(&tmp.path().join("store"));
    tiles::build(&mut store, d).unwrap();
    let files = ops::pending(&store, &data("monaco-updates")).unwrap();
    let diffs = ops::read_diffs(&files).unwrap();
    let r = ops::apply(&mut store, &cfg, &diffs, false).unwrap();
    assert!(r.datasets[0].zoomed_out_to.is_some(), "{r:?}");
    let r = tiles::drain(&mut store, d, usize::MAX, DrainOrder::LowZoomFirst).unwrap();
    let why = r.rebuilt.and_then(|b| b.reason).unwrap_or_default();
    assert!(why.contains("tiles_affected_max"), "{why}");
    check(&store, d);
    // The next drain is an ordinary one again.
    let r = tiles::drain(&mut store, d, usize::MAX, DrainOrder::LowZoomFirst).unwrap();
    assert!(r.rebuilt.is_none());
}

/// A drain that finds more than drain_rebuild_share of the file's tiles
/// dirty rebuilds instead, and says why.
#[test]
fn a_large_backlog_is_rebuilt_instead_of_drained() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(
        tmp.path(),
        "[osm.tiles.s]\nzooms = \"12-16\"\nkeys = [\"*\"]\nmbtiles = \"s.mbtiles\"\ndrain = \"deferred\"\ndrain_rebuild_share = 0.1\n",
    );
    let d = cfg.of::<TileDataset>()[0];
    let mut store = monaco(&tmp.path().join("store"));
    tiles::build(&mut store, d).unwrap();
    let files = ops::pending(&store, &data("monaco-updates")).unwrap();
    ops::apply(&mut store, &cfg, &ops::read_diffs(&files).unwrap(), false).unwrap();
    let r = tiles::drain(&mut store, d, usize::MAX, DrainOrder::LowZoomFirst).unwrap();
    let why = r.rebuilt.and_then(|b| b.reason).unwrap_or_default();
    assert!(why.contains("drain_rebuild_share"), "{why}");
    assert_eq!(store.dirty_count("s").unwrap(), 0);
    check(&store, d);
}

/// A diff applied through a path that knows no tile dataset (here
/// `derive_and_apply`, whose low-zoom predicate is empty) leaves the
/// low-zoom index unmarked, so the next drain rebuilds it instead of
/// missing a motorway at z5-z9.
#[test]
fn a_low_zoom_index_written_for_other_datasets_is_rebuilt_not_trusted() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), DATASETS);
    let mut store = monaco(&tmp.path().join("store"));
    let sb = cfg
        .of::<TileDataset>()
        .into_iter()
        .find(|d| d.name == "sb")
        .unwrap();
    tiles::build(&mut store, sb).unwrap();
    let node = |id: i64, lat: f64, lon: f64| {
        modify(highwater_osm::Element::Node(highwater_osm::Node {
            id,
            lat_e7: Some((lat * 1e7) as i32),
            lon_e7: Some((lon * 1e7) as i32),
            tags: Default::default(),
        }))
    };
    let diff = vec![
        node(1 << 40, 43.70, 7.40),
        node((1 << 40) + 1, 43.75, 7.45),
        modify(highwater_osm::Element::Way(highwater_osm::Way {
            id: 1 << 40,
            refs: vec![1 << 40, (1 << 40) + 1],
            tags: [("highway".to_string(), "motorway".to_string())].into(),
        })),
    ];
    let (dirty, _) =
        highwater_osm::derive::derive_and_apply(&mut store, &[diff], &sb.layer).unwrap();
    assert!(dirty.iter().any(|t| t.z == 5), "the motorway shows from z5");
    store.write(|w| w.add_dirty(&sb.name, &dirty)).unwrap();
    let r = tiles::drain(&mut store, sb, usize::MAX, DrainOrder::LowZoomFirst).unwrap();
    assert!(r.rebuilt.is_none(), "{r:?}");
    check(&store, sb);
}
