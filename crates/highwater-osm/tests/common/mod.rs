//! Shared by the OSM tests: Monaco 3047 in a fresh store, and random edits
//! against it (moves, deletes, renames, splits, reversals, relation member
//! changes, new points, new multipolygons and routes).

#![allow(dead_code)]

use highwater_osm::store::Store;
use highwater_osm::{Action, Change, Element, Member, MemberKind, Node, Relation, Way};
use proptest::prelude::*;
use std::path::Path;

/// One random edit, by kind and picks that are reduced modulo what exists.
#[derive(Clone, Debug)]
pub struct Edit {
    pub op: u8,
    pub pick: usize,
    pub other: usize,
    pub dx: i32,
    pub dy: i32,
}

pub fn edit() -> impl Strategy<Value = Edit> {
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

pub struct Ids {
    pub way_nodes: Vec<i64>,
    pub tagged_nodes: Vec<i64>,
    pub ways: Vec<i64>,
    pub relations: Vec<i64>,
}

pub fn ids(store: &Store) -> Ids {
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

pub fn modify(e: Element) -> Change {
    Change {
        action: Action::Modify,
        element: e,
    }
}

/// Turns an edit into changes against the store as it is.
pub fn changes(store: &Store, ids: &Ids, e: &Edit, fresh: &mut i64) -> Vec<Change> {
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
pub fn monaco(dir: &Path) -> Store {
    static TEMPLATE: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let template = TEMPLATE.get_or_init(|| {
        let pbf =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/monaco-3047-20210801.osm.pbf");
        let t = tempfile::tempdir().unwrap();
        let mut store = highwater_osm::create_store(t.path()).unwrap();
        highwater_osm::import::import(&mut store, &pbf).unwrap();
        // Closing checkpoints the write-ahead log into store.db.
        drop(store);
        t
    });
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(template.path().join("store.db"), dir.join("store.db")).unwrap();
    highwater_osm::open_store(dir).unwrap()
}

/// The path of a test data file.
pub fn data(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}
