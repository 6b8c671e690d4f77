//! Expiry is sound: after random edits to a real extract (Monaco 3047),
//! every tile whose content changed, as a full rebuild of every feature's
//! per-tile content sees it, is in the affected set derived before apply.
//! Checked for a layer reading every key with `diff_expire`, one reading a
//! few keys with a buffer, and one without `diff_expire`.

use highwater_core::tile::Tile;
use highwater_osm::derive::{affected_tiles, derive_and_apply, TileLayer};
use highwater_osm::features::{self, signatures};
use highwater_osm::store::Store;
use highwater_osm::{Action, Change, Element, Member, MemberKind, Node, Relation, Way};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::path::Path;

fn layers() -> Vec<TileLayer> {
    let keys = |k: &[&str]| Some(k.iter().map(|s| s.to_string()).collect());
    vec![
        TileLayer {
            zoom_min: 12,
            zoom_max: 16,
            keys: None,
            buffer: 0.0,
            diff_expire: true,
        },
        TileLayer {
            zoom_min: 13,
            zoom_max: 17,
            keys: keys(&["highway", "building", "name", "landuse", "route"]),
            buffer: 0.2,
            diff_expire: true,
        },
        TileLayer {
            zoom_min: 14,
            zoom_max: 15,
            keys: None,
            buffer: 0.05,
            diff_expire: false,
        },
    ]
}

type Contents = BTreeMap<Tile, BTreeSet<(MemberKind, i64, u64)>>;

/// The rebuild: every feature's content signature in every tile.
fn contents(store: &Store, layer: &TileLayer) -> Contents {
    let mut out = Contents::new();
    for (key, f) in features::all(store, layer).unwrap() {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        f.tags.hash(&mut h);
        let tags = h.finish();
        for z in layer.zoom_min..=layer.zoom_max {
            for ((x, y), sig) in signatures(&f.shape, z, layer.buffer) {
                out.entry(Tile { z, x, y })
                    .or_default()
                    .insert((key.0, key.1, sig ^ tags));
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

/// One random edit, by kind and picks that are reduced modulo what exists.
#[derive(Clone, Debug)]
struct Edit {
    op: u8,
    pick: usize,
    other: usize,
    dx: i32,
    dy: i32,
}

fn edit() -> impl Strategy<Value = Edit> {
    (
        0u8..12,
        any::<usize>(),
        any::<usize>(),
        -300i32..300,
        -300i32..300,
    )
        .prop_map(|(op, pick, other, dx, dy)| Edit {
            op,
            pick,
            other,
            dx,
            dy,
        })
}

struct Ids {
    way_nodes: Vec<i64>,
    tagged_nodes: Vec<i64>,
    ways: Vec<i64>,
    relations: Vec<i64>,
}

fn ids(store: &Store) -> Ids {
    let mut ids = Ids {
        way_nodes: Vec::new(),
        tagged_nodes: Vec::new(),
        ways: Vec::new(),
        relations: Vec::new(),
    };
    store
        .export(|e| match e {
            Element::Node(n) if !n.tags.is_empty() => ids.tagged_nodes.push(n.id),
            Element::Way(w) => {
                ids.way_nodes.extend(w.refs.iter().step_by(7));
                ids.ways.push(w.id);
            }
            Element::Relation(r) => ids.relations.push(r.id),
            _ => {}
        })
        .unwrap();
    ids
}

fn modify(e: Element) -> Change {
    Change {
        action: Action::Modify,
        element: e,
    }
}

/// Turns an edit into changes against the store as it is.
fn changes(store: &Store, ids: &Ids, e: &Edit, fresh: &mut i64) -> Vec<Change> {
    let pick = |v: &Vec<i64>| v[e.pick % v.len()];
    // Offsets up to 0.003 degrees: a few zoom-16 tiles.
    let moved = |mut n: Node| {
        n.lat_e7 = n.lat_e7.map(|v| v + e.dy * 100);
        n.lon_e7 = n.lon_e7.map(|v| v + e.dx * 100);
        n
    };
    match e.op {
        0 | 1 => {
            let list = if e.op == 0 {
                &ids.way_nodes
            } else {
                &ids.tagged_nodes
            };
            match store.node(pick(list)).unwrap() {
                Some(n) => vec![modify(Element::Node(moved(n)))],
                None => vec![],
            }
        }
        2 => vec![Change {
            action: Action::Delete,
            element: Element::Node(Node {
                id: pick(&ids.way_nodes),
                lat_e7: None,
                lon_e7: None,
                tags: Default::default(),
            }),
        }],
        3..=7 => {
            let Some(mut w) = store.way(pick(&ids.ways)).unwrap() else {
                return vec![];
            };
            match e.op {
                3 => {
                    w.tags.insert("name".into(), format!("Rue {}", e.other % 5));
                    vec![modify(Element::Way(w))]
                }
                4 => vec![Change {
                    action: Action::Delete,
                    element: Element::Way(w),
                }],
                5 if w.refs.len() >= 3 => {
                    // Split: the old way keeps the head, a new way the tail.
                    let at = 1 + e.other % (w.refs.len() - 2);
                    *fresh += 1;
                    let tail = Way {
                        id: *fresh,
                        refs: w.refs[at..].to_vec(),
                        tags: w.tags.clone(),
                    };
                    w.refs.truncate(at + 1);
                    vec![
                        modify(Element::Way(w)),
                        Change {
                            action: Action::Create,
                            element: Element::Way(tail),
                        },
                    ]
                }
                6 => {
                    w.refs.reverse();
                    vec![modify(Element::Way(w))]
                }
                _ => {
                    // A node of another way joins this one (the shape changes).
                    let n = pick(&ids.way_nodes);
                    let at = e.other % (w.refs.len() + 1);
                    w.refs.insert(at.min(w.refs.len()), n);
                    vec![modify(Element::Way(w))]
                }
            }
        }
        8 | 9 => {
            if ids.relations.is_empty() {
                return vec![];
            }
            let Some(mut r) = store.relation(pick(&ids.relations)).unwrap() else {
                return vec![];
            };
            if e.op == 8 {
                // Drop a member, or rename.
                if r.members.len() > 1 && e.other.is_multiple_of(2) {
                    let at = e.other % r.members.len();
                    r.members.remove(at);
                } else {
                    r.tags
                        .insert("name".into(), format!("Zone {}", e.other % 3));
                }
            } else {
                r.members.push(Member {
                    kind: MemberKind::Way,
                    id: pick(&ids.ways),
                    role: "outer".into(),
                });
            }
            vec![modify(Element::Relation(r))]
        }
        10 => {
            *fresh += 1;
            let lat = 437_300_000 + e.dy * 1000;
            let lon = 74_200_000 + e.dx * 1000;
            vec![Change {
                action: Action::Create,
                element: Element::Node(Node {
                    id: *fresh,
                    lat_e7: Some(lat),
                    lon_e7: Some(lon),
                    tags: [("amenity".to_string(), "cafe".to_string())].into(),
                }),
            }]
        }
        _ => {
            // A new multipolygon from two existing ways, or a new route.
            *fresh += 1;
            let tags = if e.other.is_multiple_of(2) {
                [("type", "multipolygon"), ("landuse", "grass")]
            } else {
                [("type", "route"), ("route", "bus")]
            };
            vec![Change {
                action: Action::Create,
                element: Element::Relation(Relation {
                    id: *fresh,
                    members: [pick(&ids.ways), ids.ways[e.other % ids.ways.len()]]
                        .into_iter()
                        .map(|id| Member {
                            kind: MemberKind::Way,
                            id,
                            role: "outer".into(),
                        })
                        .collect(),
                    tags: tags
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                }),
            }]
        }
    }
}

/// A fresh copy of a store with Monaco 3047 imported (once per process).
fn monaco(dir: &Path) -> Store {
    static TEMPLATE: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let template = TEMPLATE.get_or_init(|| {
        let pbf =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/monaco-3047-20210801.osm.pbf");
        let t = tempfile::tempdir().unwrap();
        let mut store = Store::open(t.path()).unwrap();
        highwater_osm::import::import(&mut store, &pbf).unwrap();
        // Closing checkpoints the write-ahead log into store.db.
        drop(store);
        t
    });
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(template.path().join("store.db"), dir.join("store.db")).unwrap();
    Store::open(dir).unwrap()
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
    let mut store = Store::open(&tmp.path().join("s")).unwrap();
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
