//! Expiry is sound: after random edits to a real extract (Monaco 3047),
//! every tile whose content changed, as a full rebuild of every feature's
//! per-tile content sees it, is in the affected set derived before apply.
//! Checked for a layer reading every key with `diff_expire`, one reading a
//! few keys with a buffer, one without `diff_expire`, and the bundled
//! Shortbread schema at z0-14 (its per-zoom simplified, thinned shapes).

use highwater_core::tile::Tile;
use highwater_osm::derive::{affected_tiles, derive_and_apply, TileLayer};
use highwater_osm::features::{self, signatures};
use highwater_osm::store::Store;
use highwater_osm::{Element, Member, MemberKind, Node, Relation, Way};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

mod common;
use common::*;

fn layers() -> Vec<TileLayer> {
    let keys = |k: &[&str]| Some(k.iter().map(|s| s.to_string()).collect());
    vec![
        TileLayer {
            zoom_min: 12,
            zoom_max: 16,
            keys: None,
            buffer: 0.0,
            diff_expire: true,
            schema: None,
        },
        TileLayer {
            zoom_min: 13,
            zoom_max: 17,
            keys: keys(&["highway", "building", "name", "landuse", "route"]),
            buffer: 0.2,
            diff_expire: true,
            schema: None,
        },
        TileLayer {
            zoom_min: 14,
            zoom_max: 15,
            keys: None,
            buffer: 0.05,
            diff_expire: false,
            schema: None,
        },
        shortbread(),
    ]
}

fn shortbread() -> TileLayer {
    TileLayer::from_schema(highwater_osm::tiles::schema::Schema::bundled("shortbread").unwrap())
}

type Contents = BTreeMap<Tile, BTreeSet<(MemberKind, i64, u64)>>;

/// The rebuild: every feature's content signature in every tile: its
/// shape's segments and area there, with its tags, or (with a schema) what
/// each of its placements shows there.
fn contents(store: &Store, layer: &TileLayer) -> Contents {
    let mut out = Contents::new();
    for (key, f) in features::all(store, layer).unwrap() {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        f.tags.hash(&mut h);
        let tags = h.finish();
        let placements = layer.place(&f);
        for z in layer.zoom_min..=layer.zoom_max {
            // A schema's signatures carry each placement's attributes: a
            // tag it does not show (a building's name) changes no tile.
            let sigs = match &layer.schema {
                Some(_) => layer.signatures(&placements, z),
                None => signatures(&f.shape, z, layer.buffer)
                    .into_iter()
                    .map(|(c, s)| (c, s ^ tags))
                    .collect(),
            };
            for ((x, y), sig) in sigs {
                out.entry(Tile { z, x, y })
                    .or_default()
                    .insert((key.0, key.1, sig));
            }
        }
    }
    out
}

fn changed(a: &Contents, b: &Contents) -> BTreeSet<Tile> {
    a.keys()
        .chain(b.keys())
        .filter(|t| a.get(t) != b.get(t))
        .copied()
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn every_changed_tile_is_expired(steps in prop::collection::vec(prop::collection::vec(edit(), 1..4), 1..4)) {
        let tmp = tempfile::tempdir().unwrap();
        let mut store = monaco(&tmp.path().join("store"));
        let ids = ids(&store);
        let layers = layers();
        let mut fresh = 1_i64 << 40;
        for step in &steps {
            let mut diff = Vec::new();
            for e in step {
                diff.extend(changes(&store, &ids, e, &mut fresh));
            }
            let before: Vec<Contents> = layers.iter().map(|l| contents(&store, l)).collect();
            let mut expired: Vec<BTreeSet<Tile>> = layers[1..]
                .iter()
                .map(|l| affected_tiles(&store, &diff, l).unwrap().0)
                .collect();
            expired.insert(0, derive_and_apply(&mut store, &[diff.clone()], &layers[0]).unwrap().0);
            for (i, l) in layers.iter().enumerate() {
                let after = contents(&store, l);
                let stale: Vec<_> = changed(&before[i], &after).difference(&expired[i]).copied().collect();
                prop_assert!(stale.is_empty(), "layer {i}: changed but not expired: {stale:?} after {step:?}");
            }
        }
    }
}

/// Route relations are features: a member way of a route moving expires
/// the route's tiles even when the way itself carries no tags.
#[test]
fn a_route_relations_untagged_member_moving_expires_the_route() {
    let tmp = tempfile::tempdir().unwrap();
    let mut store = highwater_osm::create_store(&tmp.path().join("s")).unwrap();
    let node = |id, lat: f64, lon: f64| {
        Element::Node(Node {
            id,
            lat_e7: Some((lat * 1e7) as i32),
            lon_e7: Some((lon * 1e7) as i32),
            tags: Default::default(),
        })
    };
    store
        .write(|w| {
            w.put(&node(1, 43.70, 7.40))?;
            w.put(&node(2, 43.70, 7.46))?;
            w.put(&Element::Way(Way {
                id: 5,
                refs: vec![1, 2],
                tags: Default::default(),
            }))?;
            w.put(&Element::Relation(Relation {
                id: 9,
                members: vec![Member {
                    kind: MemberKind::Way,
                    id: 5,
                    role: String::new(),
                }],
                tags: [("type", "route"), ("route", "bus")]
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            }))
        })
        .unwrap();
    let l = &layers()[0];
    let before = contents(&store, l);
    let (t, _) = derive_and_apply(&mut store, &[vec![modify(node(2, 43.72, 7.46))]], l).unwrap();
    let after = contents(&store, l);
    let want = changed(&before, &after);
    assert!(!want.is_empty());
    assert!(want.is_subset(&t), "{:?}", want.difference(&t));
}
