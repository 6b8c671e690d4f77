//! Issue 25: the sea drawn as sea. Monaco's coastline ways make
//! Shortbread's `ocean` layer (one polygon, closed along the extract's
//! bounds, `coast.rs`): present in a tile out at sea, absent from one on
//! land, at every zoom; and a diff that moves a coastline node re-cuts the
//! tiles whose sea changed, so the file still equals a rebuild.

use highwater_core::tile::{tile_of, Tile};
use highwater_osm::model::{Action, Change, Element};
use highwater_osm::ops::{self, OsmConfig};
use highwater_osm::store::{DrainOrder, OsmRead, Store};
use highwater_osm::tiles::TileDataset;
use highwater_osm::tiles::{self, mvt, Mbtiles};
use std::path::Path;

mod common;
use common::*;

fn config(dir: &Path) -> OsmConfig {
    let text = "[osm]\nstore = \"store\"\n[osm.tiles.sb]\nschema = \"shortbread\"\nmbtiles = \"sb.mbtiles\"\ndrain_rebuild_share = 1000\n";
    let v: toml::Value = toml::from_str(text).unwrap();
    OsmConfig::parse(v.get("osm"), &dir.join("highwater.toml"), dir).unwrap()
}

/// The features of layer `name` in tile `t` of the dataset's file.
fn layer_in(d: &TileDataset, t: Tile, name: &str) -> Vec<mvt::TileFeature> {
    let mb = Mbtiles::open(d.mbtiles.as_ref().unwrap()).unwrap().unwrap();
    let Some(b) = mb.get(t).unwrap() else {
        return Vec::new();
    };
    mvt::decode(&b)
        .unwrap()
        .into_iter()
        .filter(|(n, _)| n == name)
        .flat_map(|(_, f)| f)
        .collect()
}

/// Off Monte-Carlo, and Beausoleil (France) up the hill.
const SEA: (f64, f64) = (7.440, 43.728);
const LAND: (f64, f64) = (7.425, 43.745);

#[test]
fn the_ocean_layer_is_in_a_sea_tile_at_every_zoom_and_not_in_a_land_tile() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    let mut store = monaco(&tmp.path().join("store"));
    let d = cfg.of::<highwater_osm::tiles::TileDataset>()[0];
    tiles::build(&mut store, d).unwrap();
    // The layer is placed from z0, as the spec gives it; below some zoom
    // Monaco's sea (about 0.1 degrees across) is smaller than a tile's
    // grid cell and shows nothing, like any small polygon.
    let shown: Vec<u8> = (0..=14)
        .filter(|&z| {
            let t = tile_of(SEA.0, SEA.1, z);
            let sea = layer_in(d, t, "ocean");
            assert!(sea.len() <= 1, "one sea feature in {}", t.to_zxy());
            assert!(
                sea.iter().all(|f| f.id == 2),
                "the sea's feature id (relation 0)"
            );
            !sea.is_empty()
        })
        .collect();
    eprintln!("the sea shows at z{shown:?}");
    assert_eq!(
        shown,
        (shown[0]..=14).collect::<Vec<_>>(),
        "every zoom from the first"
    );
    assert!(shown[0] <= 4, "from a low zoom on: {shown:?}");
    let json = Mbtiles::open(d.mbtiles.as_ref().unwrap())
        .unwrap()
        .unwrap()
        .metadata("json")
        .unwrap()
        .unwrap();
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    let ocean = json["vector_layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["id"] == "ocean")
        .expect("an ocean layer in the metadata");
    assert_eq!(
        (ocean["minzoom"].as_u64(), ocean["maxzoom"].as_u64()),
        (Some(0), Some(14))
    );
    let land = tile_of(LAND.0, LAND.1, 14);
    assert!(
        layer_in(d, land, "ocean").is_empty(),
        "no sea in the land tile {}",
        land.to_zxy()
    );
    // The land tile has land-side features: it is not empty for other reasons.
    let mb = Mbtiles::open(d.mbtiles.as_ref().unwrap()).unwrap().unwrap();
    assert!(
        mb.get(land).unwrap().is_some(),
        "{} has features",
        land.to_zxy()
    );
    let v = tiles::verify(&store, d, None).unwrap();
    assert!(v.differences.is_empty(), "{v:?}");
}

/// A coastline node of Monaco inside the bounds, with its way.
fn coast_node(store: &Store) -> (i64, highwater_osm::model::Node) {
    let b = highwater_osm::coast::bounds_of(store.meta("bounds").unwrap().as_deref())
        .expect("the import recorded the extract's bounds");
    let ways = OsmRead::coastline_ways(store).unwrap();
    assert_eq!(ways.len(), 20, "Monaco's 20 coastline ways");
    for w in ways {
        let w = store.way(w).unwrap().unwrap();
        for r in &w.refs[1..w.refs.len() - 1] {
            if let Some(n) = store.node(*r).unwrap() {
                let (lon, lat) = n.lonlat().unwrap();
                let p = highwater_core::tile::world(lon, lat);
                let margin = 0.2 * (b.max_x - b.min_x);
                if p.0 > b.min_x + margin
                    && p.0 < b.max_x - margin
                    && p.1 > b.min_y
                    && p.1 < b.max_y
                {
                    return (w.id, n);
                }
            }
        }
    }
    panic!("no coastline node well inside Monaco's bounds");
}

#[test]
fn a_moved_coastline_node_recuts_the_sea_and_the_file_equals_a_rebuild() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    let mut store = monaco(&tmp.path().join("store"));
    let d = cfg.of::<highwater_osm::tiles::TileDataset>()[0];
    tiles::build(&mut store, d).unwrap();
    let (_, mut n) = coast_node(&store);
    let (lon, lat) = n.lonlat().unwrap();
    let z14 = tile_of(lon, lat, 14);
    let before = layer_in(d, z14, "ocean");
    // 150 m south, out to sea.
    n.lat_e7 = Some(n.lat_e7.unwrap() - 13_500);
    let diff = vec![Change {
        action: Action::Modify,
        element: Element::Node(n),
    }];
    let r = ops::apply(&mut store, &cfg, &[(diff, None)], false).unwrap();
    let dirty = r.datasets.iter().find(|x| x.name == "sb").unwrap().tiles;
    assert!(dirty > 0, "the moved coastline affected tiles: {r:?}");
    let drained = tiles::drain(&mut store, d, usize::MAX, DrainOrder::LowZoomFirst).unwrap();
    assert_eq!(drained.backlog, 0);
    let after = layer_in(d, z14, "ocean");
    assert_ne!(before, after, "the sea in {} changed", z14.to_zxy());
    let v = tiles::verify(&store, d, None).unwrap();
    assert!(v.checked > 0 && v.differences.is_empty(), "{v:?}");

    // Retag every coastline way: no sea; the file still equals a rebuild,
    // and the sea tile has no ocean any more.
    let mut diff = Vec::new();
    for w in OsmRead::coastline_ways(&store).unwrap() {
        let mut w = store.way(w).unwrap().unwrap();
        w.tags.insert("natural".into(), "cliff".into());
        diff.push(Change {
            action: Action::Modify,
            element: Element::Way(w),
        });
    }
    ops::apply(&mut store, &cfg, &[(diff, None)], false).unwrap();
    tiles::drain(&mut store, d, usize::MAX, DrainOrder::LowZoomFirst).unwrap();
    let sea = tile_of(SEA.0, SEA.1, 14);
    assert!(layer_in(d, sea, "ocean").is_empty(), "no coastline, no sea");
    let v = tiles::verify(&store, d, None).unwrap();
    assert!(v.differences.is_empty(), "{v:?}");
}
