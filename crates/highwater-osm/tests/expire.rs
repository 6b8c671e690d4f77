//! Tile expiry, derived before apply: one `check` helper, a base extract and
//! a diff in, the affected tiles out.

use highwater_core::tile::{tile_of, Tile};
use highwater_osm::derive::{affected_tiles, derive_and_apply, TileLayer};
use highwater_osm::store::Store;
use highwater_osm::{read_changes, read_osm, Change};
use std::collections::BTreeSet;

struct World {
    _dir: tempfile::TempDir,
    store: Store,
    dir: std::path::PathBuf,
}

fn base(osm: &str) -> World {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("base.osm");
    std::fs::write(&path, osm).unwrap();
    let mut store = highwater_osm::create_store(&dir.path().join("store")).unwrap();
    let mut elements = Vec::new();
    read_osm(&path, |e| {
        elements.push(e);
        Ok(())
    })
    .unwrap();
    store
        .write(|w| {
            for e in &elements {
                w.put(e)?;
            }
            Ok(())
        })
        .unwrap();
    World {
        dir: dir.path().to_path_buf(),
        _dir: dir,
        store,
    }
}

fn diff(w: &World, name: &str, osc: &str) -> Vec<Change> {
    let p = w.dir.join(name);
    std::fs::write(&p, osc).unwrap();
    read_changes(&p).unwrap()
}

fn layer(keys: Option<&[&str]>) -> TileLayer {
    TileLayer {
        zoom_min: 10,
        zoom_max: 16,
        keys: keys.map(|k| k.iter().map(|s| s.to_string()).collect()),
        buffer: 0.0,
        diff_expire: false,
        schema: None,
    }
}

/// Derives the diff's tiles (before apply), applies it, returns the tiles.
fn check(w: &mut World, osc: &str, layer: &TileLayer) -> BTreeSet<Tile> {
    let changes = diff(w, "d.osc", osc);
    let (tiles, _) = derive_and_apply(&mut w.store, &[changes], layer).unwrap();
    tiles
}

fn at_every_zoom(t: &BTreeSet<Tile>, lon: f64, lat: f64) -> bool {
    (10..=16).all(|z| t.contains(&tile_of(lon, lat, z)))
}

const CAFE: &str = r#"<osm version="0.6">
  <node id="1" lat="43.7350" lon="7.4246"><tag k="amenity" v="cafe"/></node>
  <node id="2" lat="43.7300" lon="7.4200"/>
  <node id="3" lat="43.7310" lon="7.4300"/>
  <node id="4" lat="43.7320" lon="7.4400"/>
  <way id="10"><nd ref="2"/><nd ref="3"/><nd ref="4"/><tag k="highway" v="residential"/></way>
</osm>"#;

#[test]
fn a_node_moved_across_a_tile_boundary_expires_both_tiles_at_every_zoom() {
    let mut w = base(CAFE);
    // 0.05 degrees east: another zoom-16 tile (and zoom-10 stays one).
    let t = check(
        &mut w,
        r#"<osmChange><modify><node id="1" lat="43.7350" lon="7.4746"><tag k="amenity" v="cafe"/></node></modify></osmChange>"#,
        &layer(None),
    );
    assert!(at_every_zoom(&t, 7.4246, 43.7350), "old place");
    assert!(at_every_zoom(&t, 7.4746, 43.7350), "new place");
    assert_ne!(tile_of(7.4246, 43.735, 16), tile_of(7.4746, 43.735, 16));
    assert_eq!(t.iter().filter(|t| t.z == 16).count(), 2, "{t:?}");
}

/// Regression for the contract's order: the delete carries no coordinates,
/// and only the store, read before the delete lands, knows where it was.
#[test]
fn a_deleted_node_without_coordinates_expires_its_old_tile() {
    let mut w = base(CAFE);
    let t = check(
        &mut w,
        r#"<osmChange><delete><node id="1"/></delete></osmChange>"#,
        &layer(None),
    );
    assert!(at_every_zoom(&t, 7.4246, 43.7350), "{t:?}");
    assert!(w.store.node(1).unwrap().is_none(), "applied after deriving");
}

#[test]
fn a_way_whose_node_moved_expires_the_ways_tiles() {
    let mut w = base(CAFE);
    // Node 3 is untagged; only the way through it makes it matter.
    let t = check(
        &mut w,
        r#"<osmChange><modify><node id="3" lat="43.7500" lon="7.4300"/></modify></osmChange>"#,
        &layer(Some(&["highway"])),
    );
    for (lon, lat) in [(7.42, 43.73), (7.43, 43.731), (7.43, 43.75), (7.44, 43.732)] {
        assert!(
            at_every_zoom(&t, lon, lat),
            "({lon}, {lat}) of the old or new shape: {t:?}"
        );
    }
}

#[test]
fn a_tag_change_on_a_key_the_layer_never_reads_expires_nothing() {
    let mut w = base(CAFE);
    let changes = diff(
        &w,
        "t.osc",
        r#"<osmChange><modify><way id="10"><nd ref="2"/><nd ref="3"/><nd ref="4"/><tag k="highway" v="residential"/><tag k="surface" v="asphalt"/></way></modify></osmChange>"#,
    );
    let (t, stats) =
        affected_tiles(&w.store, &changes, &layer(Some(&["highway", "building"]))).unwrap();
    assert!(t.is_empty(), "{t:?}");
    assert_eq!((stats.changes, stats.filtered), (1, 1));
    // A layer reading every key does expire it.
    let (t, _) = affected_tiles(&w.store, &changes, &layer(None)).unwrap();
    assert!(!t.is_empty());
    let _ = &mut w;
}

#[test]
fn a_batch_equals_the_union_of_single_applies() {
    let diffs = [
        r#"<osmChange><modify><node id="1" lat="43.7400" lon="7.4300"><tag k="amenity" v="cafe"/></node></modify></osmChange>"#,
        r#"<osmChange><modify><node id="1" lat="43.7600" lon="7.4500"><tag k="amenity" v="cafe"/></node></modify>
           <delete><way id="10"/></delete></osmChange>"#,
        r#"<osmChange><create><node id="5" lat="43.7200" lon="7.4100"><tag k="shop" v="bakery"/></node></create></osmChange>"#,
    ];
    let mut one = base(CAFE);
    let mut union = BTreeSet::new();
    for (i, d) in diffs.iter().enumerate() {
        let c = diff(&one, &format!("{i}.osc"), d);
        union.extend(
            derive_and_apply(&mut one.store, &[c], &layer(None))
                .unwrap()
                .0,
        );
    }
    let mut batch = base(CAFE);
    let all: Vec<Vec<Change>> = diffs
        .iter()
        .enumerate()
        .map(|(i, d)| diff(&batch, &format!("b{i}.osc"), d))
        .collect();
    let (t, _) = derive_and_apply(&mut batch.store, &all, &layer(None)).unwrap();
    assert_eq!(t, union);
    // The intermediate place (43.74, 7.43) is in both.
    assert!(at_every_zoom(&t, 7.43, 43.74));
    // And the stores agree.
    let dump = |s: &Store| {
        let mut v = Vec::new();
        s.export(|e| v.push(e)).unwrap();
        v
    };
    assert_eq!(dump(&one.store), dump(&batch.store));
}

#[test]
fn an_area_expires_its_shape_not_its_bounding_box() {
    // A long thin diagonal building: its bounding box spans many zoom-16
    // tiles that the shape itself never touches.
    let mut w = base(
        r#"<osm>
  <node id="1" lat="43.7000" lon="7.4000"/><node id="2" lat="43.7600" lon="7.4800"/>
  <node id="3" lat="43.7601" lon="7.4790"/><node id="4" lat="43.7001" lon="7.3990"/>
  <way id="20"><nd ref="1"/><nd ref="2"/><nd ref="3"/><nd ref="4"/><nd ref="1"/><tag k="building" v="yes"/></way>
</osm>"#,
    );
    let t = check(
        &mut w,
        r#"<osmChange><delete><way id="20"/></delete></osmChange>"#,
        &layer(None),
    );
    let z16: Vec<_> = t.iter().filter(|t| t.z == 16).collect();
    let (a, b) = (tile_of(7.40, 43.70, 16), tile_of(7.48, 43.76, 16));
    let bbox = ((b.x - a.x + 1) * (a.y - b.y + 1)) as usize;
    assert!(
        z16.len() * 3 < bbox,
        "{} tiles of a {bbox}-tile bounding box",
        z16.len()
    );
}

/// A multipolygon whose tags sit on the relation and whose ring is two
/// untagged member ways: moving one corner expires the relation's whole
/// area, inside included, before and after.
#[test]
fn a_member_way_of_a_multipolygon_moving_expires_the_relations_area() {
    let mut w = base(
        r#"<osm>
  <node id="1" lat="43.70" lon="7.40"/><node id="2" lat="43.70" lon="7.46"/>
  <node id="3" lat="43.76" lon="7.46"/><node id="4" lat="43.76" lon="7.40"/>
  <way id="30"><nd ref="1"/><nd ref="2"/><nd ref="3"/></way>
  <way id="31"><nd ref="3"/><nd ref="4"/><nd ref="1"/></way>
  <relation id="40"><member type="way" ref="30" role="outer"/><member type="way" ref="31" role="outer"/>
    <tag k="type" v="multipolygon"/><tag k="landuse" v="forest"/></relation>
</osm>"#,
    );
    let t = check(
        &mut w,
        r#"<osmChange><modify><node id="3" lat="43.80" lon="7.50"/></modify></osmChange>"#,
        &layer(Some(&["landuse"])),
    );
    // The middle of the old square: only an area fill reaches it.
    assert!(at_every_zoom(&t, 7.43, 43.73), "inside the old area");
    // Inside the new shape only (beyond the old square's corner).
    assert!(at_every_zoom(&t, 7.47, 43.77), "inside the new area");
    // Far outside both.
    assert!(!t.contains(&tile_of(7.30, 43.60, 16)));
}

/// `diff_expire`: moving one corner of a big area (tags unchanged) expires
/// the tiles the boundary crossed and the sliver between the shapes, not
/// the untouched inside; without it, the whole inside.
#[test]
fn diff_expire_skips_the_unchanged_inside_of_an_area() {
    let osm = r#"<osm>
  <node id="1" lat="43.70" lon="7.40"/><node id="2" lat="43.70" lon="7.46"/>
  <node id="3" lat="43.76" lon="7.46"/><node id="4" lat="43.76" lon="7.40"/>
  <way id="50"><nd ref="1"/><nd ref="2"/><nd ref="3"/><nd ref="4"/><nd ref="1"/><tag k="landuse" v="forest"/></way>
</osm>"#;
    let osc = r#"<osmChange><modify><node id="3" lat="43.765" lon="7.465"/></modify></osmChange>"#;
    let mut full = base(osm);
    let all = check(&mut full, osc, &layer(Some(&["landuse"])));
    let mut diff = base(osm);
    let mut l = layer(Some(&["landuse"]));
    l.diff_expire = true;
    let some = check(&mut diff, osc, &l);
    assert!(some.is_subset(&all));
    assert!(
        some.len() * 2 < all.len(),
        "{} of {}",
        some.len(),
        all.len()
    );
    // The untouched middle is not expired at the top zoom; the moved corner
    // is, before and after.
    assert!(!some.contains(&tile_of(7.43, 43.73, 16)));
    assert!(at_every_zoom(&some, 7.46, 43.76) && at_every_zoom(&some, 7.465, 43.765));
    // A tag change is never a geometry-only change: the whole area expires.
    let mut tags = base(osm);
    let t = check(
        &mut tags,
        r#"<osmChange><modify><way id="50"><nd ref="1"/><nd ref="2"/><nd ref="3"/><nd ref="4"/><nd ref="1"/><tag k="landuse" v="meadow"/></way></modify></osmChange>"#,
        &l,
    );
    assert!(t.contains(&tile_of(7.43, 43.73, 16)));
}
