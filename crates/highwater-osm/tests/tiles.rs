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
use highwater_osm::{features, MemberKind};
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
    // The count every write keeps (issue 25: a drain never counts the file).
    assert_eq!(
        mb.count().unwrap(),
        mb.tiles().unwrap().len() as i64,
        "{}",
        d.name
    );
}

/// Applies a diff and drains every tile dataset; returns the tiles re-cut
/// and, of those, the tiles patched (issue 25).
fn apply_and_drain(store: &mut Store, cfg: &OsmConfig, diff: ops::Diff) -> (usize, usize) {
    ops::apply(store, cfg, &[diff], false).unwrap();
    let (mut recut, mut patched) = (0, 0);
    for d in cfg.of::<TileDataset>() {
        let r = tiles::drain(store, d, usize::MAX, DrainOrder::LowZoomFirst).unwrap();
        assert_eq!(r.backlog, 0);
        assert!(r.patched <= r.recut, "{r:?}");
        recut += r.recut;
        patched += r.patched;
    }
    (recut, patched)
}

/// Monaco with every tile dataset of [`DATASETS`] built, in `dir`.
fn built_monaco(dir: &Path) -> (OsmConfig, Store) {
    let cfg = config(dir, DATASETS);
    let mut store = monaco(&dir.join("store"));
    for d in cfg.of::<TileDataset>() {
        tiles::build(&mut store, d).unwrap();
    }
    (cfg, store)
}

/// Each step's edits as one diff, made against the store as it is when
/// the step comes.
fn step_diff(
    store: &Store,
    ids: &Ids,
    step: &[Edit],
    fresh: &mut i64,
) -> Vec<highwater_osm::Change> {
    step.iter()
        .flat_map(|e| changes(store, ids, e, fresh))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn tiles_after_random_edits_equal_a_rebuild(steps in prop::collection::vec(prop::collection::vec(edit(), 1..5), 1..4)) {
        let tmp = tempfile::tempdir().unwrap();
        let (cfg, mut store) = built_monaco(tmp.path());
        let ids = ids(&store);
        let mut fresh = 1_i64 << 40;
        for step in &steps {
            let diff = step_diff(&store, &ids, step, &mut fresh);
            apply_and_drain(&mut store, &cfg, (diff, None));
            for d in cfg.of::<TileDataset>() {
                check(&store, d);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, failure_persistence: None, ..ProptestConfig::default() })]

    /// Issue 25: with a live shapes index, apply derives the features
    /// before a diff from the index and those after it from the index the
    /// apply rewrote. Its affected set, tile by tile with the features
    /// touched in each, equals the one assembled from nodes on both sides
    /// (before the diff, over an overlay of it): exact, not merely sound.
    #[test]
    fn the_affected_set_read_from_the_shapes_index_equals_the_assembled_one(steps in prop::collection::vec(prop::collection::vec(edit(), 1..6), 1..4)) {
        let tmp = tempfile::tempdir().unwrap();
        let (cfg, mut store) = built_monaco(tmp.path());
        prop_assert!(store.meta("shapes").unwrap().is_some(), "a build leaves the index live");
        let ids = ids(&store);
        let mut fresh = 1_i64 << 40;
        for step in &steps {
            let diff = step_diff(&store, &ids, step, &mut fresh);
            let assembled: Vec<_> = cfg
                .of::<TileDataset>()
                .into_iter()
                .map(|d| highwater_osm::derive::affected_tiles_touched(&store, &diff, &d.layer).unwrap())
                .collect();
            let r = ops::apply(&mut store, &cfg, &[(diff, None)], false).unwrap();
            for ((d, (tiles, stats, _)), got) in cfg.of::<TileDataset>().into_iter().zip(assembled).zip(&r.datasets) {
                prop_assert_eq!(&got.name, &d.name);
                prop_assert_eq!(got.zoomed_out_to, None);
                prop_assert_eq!(&got.dirty, &tiles.keys().copied().collect::<BTreeSet<_>>(), "{}", d.name);
                let touched: std::collections::BTreeMap<_, _> =
                    tiles.into_iter().map(|(t, k)| (t, Some(k))).collect();
                prop_assert_eq!(&got.touched, &touched, "{}", d.name);
                prop_assert_eq!((got.changes, got.filtered), (stats.changes, stats.filtered), "{}", d.name);
            }
            // The rows the apply rewrote, some by replacing the moved
            // points in a way's or route's old row rather than assembling
            // it (`derive::moved`): each equals the feature assembled from
            // nodes, bit for bit.
            let view = features::Current::new(&store);
            let every = features::TileLayer::every_key();
            for (kind, list) in [(MemberKind::Way, &ids.ways), (MemberKind::Relation, &ids.relations)] {
                for &id in list {
                    let row = features::indexed(&store, kind, id).unwrap();
                    let want = features::feature(&view, kind, id, &every).unwrap();
                    prop_assert_eq!(row, want, "the shapes index row of {:?} {}", kind, id);
                }
            }
            for d in cfg.of::<TileDataset>() {
                tiles::drain(&mut store, d, usize::MAX, DrainOrder::LowZoomFirst).unwrap();
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
    let (mut recut, mut patched) = (0, 0);
    for f in files {
        let mut d = ops::read_diffs(&[f]).unwrap();
        let (r, p) = apply_and_drain(&mut store, &cfg, d.remove(0));
        recut += r;
        patched += p;
    }
    assert_eq!(store.meta("sequence").unwrap().as_deref(), Some("3076"));
    // Minutely diffs touch a few features per tile: the drains patch the
    // tiles (each checked against a rebuild below) rather than re-cut them.
    assert!(patched * 2 > recut, "{patched} of {recut} tiles patched");
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

/// Issue 25: a tile's cut reads only the shapes some dataset shows at its
/// zoom (each shape keeps its lowest zoom in the shapes index). So the
/// index must follow every change of that zoom, or a re-cut tile loses a
/// feature a rebuild shows. Each step is applied and drained, and every
/// tile is compared with a rebuild: a building (z14 only) retagged as a
/// forest (from z7), a node moved under a motorway (from z5), a forest
/// retagged back to a building (gone from the low zooms), a deletion, and
/// an untagged node tagged as a café (z14).
#[test]
fn issue25_a_shapes_lowest_zoom_follows_its_tags_and_nodes() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(
        tmp.path(),
        "[osm.tiles.sb]\nschema = \"shortbread\"\nmbtiles = \"sb.mbtiles\"\ndrain_rebuild_share = 1000\n",
    );
    let mut store = highwater_osm::create_store(&tmp.path().join("store")).unwrap();
    // A 5 km square (building, then forest), a motorway, a residential
    // street, and a forest; all near Monaco.
    let node =
        |id: i64, lat: f64, lon: f64| format!(r#"<node id="{id}" lat="{lat}" lon="{lon}"/>"#);
    let mut osm = String::from(r#"<osm version="0.6">"#);
    for (id, lat, lon) in [
        (1, 43.70, 7.40),
        (2, 43.70, 7.46),
        (3, 43.745, 7.46),
        (4, 43.745, 7.40),
        (6, 43.72, 7.30),
        (7, 43.73, 7.50),
        (8, 43.74, 7.70),
        (11, 43.731, 7.421),
        (12, 43.732, 7.424),
        (13, 43.733, 7.428),
        (21, 43.60, 7.10),
        (22, 43.60, 7.25),
        (23, 43.68, 7.25),
        (24, 43.68, 7.10),
        (30, 43.7355, 7.4251),
    ] {
        osm.push_str(&node(id, lat, lon));
    }
    osm.push_str(
        r#"<way id="100"><nd ref="1"/><nd ref="2"/><nd ref="3"/><nd ref="4"/><nd ref="1"/><tag k="building" v="yes"/></way>
<way id="200"><nd ref="6"/><nd ref="7"/><nd ref="8"/><tag k="highway" v="motorway"/></way>
<way id="300"><nd ref="11"/><nd ref="12"/><nd ref="13"/><tag k="highway" v="residential"/></way>
<way id="400"><nd ref="21"/><nd ref="22"/><nd ref="23"/><nd ref="24"/><nd ref="21"/><tag k="landuse" v="forest"/></way>
</osm>"#,
    );
    let path = tmp.path().join("world.osm");
    std::fs::write(&path, osm).unwrap();
    highwater_osm::import::import(&mut store, &path).unwrap();
    let d = cfg.of::<TileDataset>()[0];
    tiles::build(&mut store, d).unwrap();
    check(&store, d);
    let mb = Mbtiles::open(d.mbtiles.as_ref().unwrap()).unwrap().unwrap();
    // Whether the tile of zoom z over (lat, lon) shows the element.
    let shows = |z: u8, lat: f64, lon: f64, id: u64| {
        let (x, y) = highwater_core::tile::world(lon, lat);
        let n = f64::from(1u32 << z);
        let t = Tile {
            z,
            x: (x * n) as u32,
            y: (y * n) as u32,
        };
        mb.get(t)
            .unwrap()
            .map(|b| mvt::decode(&b).unwrap())
            .is_some_and(|layers| layers.iter().any(|(_, fs)| fs.iter().any(|f| f.id == id)))
    };
    let way = |id: u64| id << 2 | 1;
    assert!(
        !shows(8, 43.72, 7.43, way(100)),
        "a building shows at z14 only"
    );
    assert!(shows(8, 43.64, 7.17, way(400)));
    let steps = [
        // The building becomes a forest: it shows from z7 on.
        r#"<modify><way id="100" version="2"><nd ref="1"/><nd ref="2"/><nd ref="3"/><nd ref="4"/><nd ref="1"/><tag k="landuse" v="forest"/></way></modify>"#,
        // The motorway's middle node moves far north.
        r#"<modify><node id="7" version="2" lat="44.10" lon="7.50"/></modify>"#,
        // The forest becomes a building again: gone below z14.
        r#"<modify><way id="100" version="3"><nd ref="1"/><nd ref="2"/><nd ref="3"/><nd ref="4"/><nd ref="1"/><tag k="building" v="yes"/></way></modify>"#,
        // The other forest is deleted; a street's node moves.
        r#"<delete><way id="400" version="2"/></delete><modify><node id="12" version="2" lat="43.7325" lon="7.4245"/></modify>"#,
        // An untagged node becomes a café.
        r#"<modify><node id="13" version="2" lat="43.733" lon="7.428"><tag k="amenity" v="cafe"/></node></modify>"#,
    ];
    for (i, body) in steps.iter().enumerate() {
        let osc = tmp.path().join(format!("{i}.osc"));
        std::fs::write(&osc, format!("<osmChange>{body}</osmChange>")).unwrap();
        let diffs = ops::read_diffs(&[osc]).unwrap();
        ops::apply(&mut store, &cfg, &diffs, false).unwrap();
        let r = tiles::drain(&mut store, d, usize::MAX, DrainOrder::LowZoomFirst).unwrap();
        assert!(r.rebuilt.is_none(), "step {i}: drained, not rebuilt");
        check(&store, d);
        match i {
            0 => assert!(shows(8, 43.72, 7.43, way(100)), "the new forest at z8"),
            1 => assert!(shows(7, 44.10, 7.50, way(200)), "the moved motorway at z7"),
            2 => {
                assert!(!shows(8, 43.72, 7.43, way(100)), "no building at z8");
                assert!(shows(14, 43.72, 7.43, way(100)), "the building at z14");
            }
            3 => assert!(!shows(8, 43.64, 7.17, way(400)), "the deleted forest"),
            _ => assert!(shows(14, 43.733, 7.428, 13 << 2), "the café at z14"),
        }
    }
}

/// The shapes index answers a tile's zoom with only what shows there: a
/// building (z14) is no candidate of a z13 tile, a forest is; without a
/// zoom (search, aggregates) both are found.
#[test]
fn issue25_a_tiles_candidates_are_what_shows_at_its_zoom() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(
        tmp.path(),
        "[osm.tiles.sb]\nschema = \"shortbread\"\nmbtiles = \"sb.mbtiles\"\ndrain_rebuild_share = 1000\n",
    );
    let mut store = highwater_osm::create_store(&tmp.path().join("store")).unwrap();
    let path = tmp.path().join("world.osm");
    std::fs::write(
        &path,
        r#"<osm version="0.6">
<node id="1" lat="43.73" lon="7.42"/><node id="2" lat="43.73" lon="7.43"/><node id="3" lat="43.74" lon="7.43"/><node id="4" lat="43.74" lon="7.42"/>
<way id="100"><nd ref="1"/><nd ref="2"/><nd ref="3"/><nd ref="4"/><nd ref="1"/><tag k="building" v="yes"/></way>
<way id="200"><nd ref="1"/><nd ref="2"/><nd ref="3"/><nd ref="4"/><nd ref="1"/><tag k="landuse" v="forest"/></way>
<way id="300"><nd ref="1"/><nd ref="3"/><tag k="survey" v="yes"/></way>
</osm>"#,
    )
    .unwrap();
    highwater_osm::import::import(&mut store, &path).unwrap();
    let d = cfg.of::<TileDataset>()[0];
    tiles::build(&mut store, d).unwrap();
    let b = (0.0, 0.0, 1.0, 1.0);
    let found = |z: Option<u8>| -> Vec<i64> {
        store
            .shapes_in(b, z)
            .unwrap()
            .into_iter()
            .map(|(_, id)| id)
            .collect()
    };
    assert_eq!(found(Some(14)), vec![100, 200]);
    assert_eq!(found(Some(13)), vec![200]);
    assert_eq!(found(Some(7)), vec![200], "the low-zoom index");
    assert_eq!(found(Some(6)), Vec::<i64>::new());
    // The way no layer shows is still indexed, for search and aggregates.
    assert_eq!(found(None), vec![100, 200, 300]);
}

/// A sampled verify (issue 25) rebuilds only the sampled tiles, from one
/// pass over the store that keeps what they show (the whole view held
/// every feature: out of 24 GB on the 100M-node world). It agrees with the
/// full verify: no difference on a built file, and a tile changed in the
/// file found, named as the full verify names it.
#[test]
fn a_sampled_verify_rebuilds_only_its_tiles_and_finds_what_the_full_one_finds() {
    let tmp = tempfile::tempdir().unwrap();
    let (cfg, store) = built_monaco(tmp.path());
    let d = cfg.of::<TileDataset>()[0];
    let mb = Mbtiles::open(d.mbtiles.as_ref().unwrap()).unwrap().unwrap();
    let file = mb.tiles().unwrap();
    assert!(file.len() > 40, "{} tiles", file.len());
    let v = tiles::verify(&store, d, Some(20)).unwrap();
    assert_eq!((v.checked, v.differences.len()), (20, 0), "{v:?}");
    // The sample is every k-th tile of the file from the first: give the
    // first the bytes of another tile that shows something else.
    let (first, other) = (file[0], file[file.len() / 2]);
    let path = d.mbtiles.as_ref().unwrap();
    let c = rusqlite::Connection::open(path).unwrap();
    let row = |t: highwater_core::tile::Tile| (1u32 << t.z) - 1 - t.y;
    c.execute(
        "UPDATE tiles SET tile_data = (SELECT tile_data FROM tiles WHERE zoom_level = ?4 AND tile_column = ?5 AND tile_row = ?6)
         WHERE zoom_level = ?1 AND tile_column = ?2 AND tile_row = ?3",
        rusqlite::params![first.z, first.x, row(first), other.z, other.x, row(other)],
    )
    .unwrap();
    drop(c);
    let sampled = tiles::verify(&store, d, Some(20)).unwrap();
    let full = tiles::verify(&store, d, None).unwrap();
    let named = |v: &tiles::VerifyReport| -> Vec<String> {
        v.differences.iter().map(|x| x.tile.clone()).collect()
    };
    assert_eq!(named(&sampled), vec![first.to_zxy()], "{sampled:?}");
    assert_eq!(named(&full), vec![first.to_zxy()], "{full:?}");
    assert_eq!(
        serde_json::to_value(&sampled.differences).unwrap(),
        serde_json::to_value(&full.differences).unwrap()
    );
}
