//! Node blocks (issue 10, import speed): nodes and the ways through them
//! kept in blocks of consecutive ids. Any sequence of edits (which grow,
//! split, shrink and empty blocks, and reference nodes the store does not
//! hold) leaves the store equal to a model and to a fresh import of the
//! model's state; a store in the earlier row-per-node form is migrated
//! whole on open.

use highwater_osm::model::{Element, Node, Tags, Way};
use highwater_osm::store::Store;
use highwater_osm::MemberKind;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Clone, Debug)]
enum Op {
    PutNode {
        id: i64,
        lat: i32,
        lon: i32,
        tagged: bool,
    },
    DeleteNode(i64),
    PutWay {
        id: i64,
        refs: Vec<i64>,
    },
    DeleteWay(i64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0i64..900, 0i32..1_000_000, 0i32..1_000_000, any::<bool>())
            .prop_map(|(id, lat, lon, tagged)| Op::PutNode { id, lat, lon, tagged }),
        2 => (0i64..900).prop_map(Op::DeleteNode),
        2 => (0i64..40, prop::collection::vec(0i64..900, 2..12))
            .prop_map(|(id, refs)| Op::PutWay { id, refs }),
        1 => (0i64..40).prop_map(Op::DeleteWay),
    ]
}

#[derive(Clone, Debug, Default)]
struct Model {
    nodes: BTreeMap<i64, (i32, i32, bool)>,
    ways: BTreeMap<i64, Vec<i64>>,
}

fn tags(tagged: bool) -> Tags {
    let mut t = Tags::new();
    if tagged {
        t.insert("amenity".into(), "cafe".into());
    }
    t
}

fn node(id: i64, (lat, lon, tagged): (i32, i32, bool)) -> Node {
    Node {
        id,
        lat_e7: Some(lat),
        lon_e7: Some(lon),
        tags: tags(tagged),
    }
}

impl Model {
    fn apply(&mut self, op: &Op) {
        match op {
            Op::PutNode {
                id,
                lat,
                lon,
                tagged,
            } => {
                self.nodes.insert(*id, (*lat, *lon, *tagged));
            }
            Op::DeleteNode(id) => {
                self.nodes.remove(id);
            }
            Op::PutWay { id, refs } => {
                self.ways.insert(*id, refs.clone());
            }
            Op::DeleteWay(id) => {
                self.ways.remove(id);
            }
        }
    }

    /// The model as an `.osm` file, for a fresh import.
    fn xml(&self) -> String {
        let deg = |v: i32| format!("{}.{:07}", v / 10_000_000, v % 10_000_000);
        let mut s = String::from("<osm version=\"0.6\">\n");
        for (id, (lat, lon, tagged)) in &self.nodes {
            s += &format!(
                "<node id=\"{id}\" lat=\"{}\" lon=\"{}\">",
                deg(*lat),
                deg(*lon)
            );
            if *tagged {
                s += "<tag k=\"amenity\" v=\"cafe\"/>";
            }
            s += "</node>\n";
        }
        for (id, refs) in &self.ways {
            s += &format!("<way id=\"{id}\">");
            for r in refs {
                s += &format!("<nd ref=\"{r}\"/>");
            }
            s += "</way>\n";
        }
        s + "</osm>\n"
    }
}

/// Every node and every node's ways, as the store reports them.
fn observe(store: &Store) -> (Vec<Option<Node>>, Vec<Vec<i64>>) {
    let ids = -3..903;
    let nodes = ids.clone().map(|id| store.node(id).unwrap()).collect();
    let ways = ids
        .map(|id| {
            let mut w = store.ways_of_node(id).unwrap();
            w.sort_unstable();
            w
        })
        .collect();
    (nodes, ways)
}

fn expected(m: &Model) -> (Vec<Option<Node>>, Vec<Vec<i64>>) {
    let ids = -3..903;
    let nodes = ids
        .clone()
        .map(|id| m.nodes.get(&id).map(|n| node(id, *n)))
        .collect();
    let ways = ids
        .map(|id| {
            m.ways
                .iter()
                .filter(|(_, refs)| refs.contains(&id))
                .map(|(w, _)| *w)
                .collect()
        })
        .collect();
    (nodes, ways)
}

fn import(dir: &Path, m: &Model) -> Store {
    std::fs::create_dir_all(dir).unwrap();
    let osm = dir.join("state.osm");
    std::fs::write(&osm, m.xml()).unwrap();
    let mut store = highwater_osm::create_store(&dir.join("store")).unwrap();
    highwater_osm::import::import(&mut store, &osm).unwrap();
    store
}

fn edit(
    w: &mut highwater_osm::store::Writer<'_>,
    model: &Model,
    op: &Op,
) -> Result<(), highwater_osm::store::StoreError> {
    match op {
        Op::PutNode { id, .. } => w.put(&Element::Node(node(*id, model.nodes[id]))),
        Op::DeleteNode(id) => w.delete(MemberKind::Node, *id),
        Op::PutWay { id, refs } => w.put(&Element::Way(Way {
            id: *id,
            refs: refs.clone(),
            tags: Tags::new(),
        })),
        Op::DeleteWay(id) => w.delete(MemberKind::Way, *id),
    }
}

/// The nodes an edit touches, and their neighbours in id order: what a
/// reader that kept the blocks from before the edit would see stale.
fn near(op: &Op) -> Vec<i64> {
    let ids = match op {
        Op::PutNode { id, .. } | Op::DeleteNode(id) => vec![*id],
        Op::PutWay { refs, .. } => refs.clone(),
        Op::DeleteWay(_) => vec![],
    };
    ids.into_iter().flat_map(|i| [i - 1, i, i + 1]).collect()
}

fn check(base: &Model, ops: &[Op]) {
    use highwater_osm::store::OsmRead;
    let tmp = tempfile::tempdir().unwrap();
    let mut store = import(&tmp.path().join("a"), base);
    let mut model = base.clone();
    // The first half one transaction per edit, the rest in one, read back
    // through the writer after each edit: its block cache must never
    // answer with a block from before an edit.
    let (each, together) = ops.split_at(ops.len() / 2);
    for op in each {
        model.apply(op);
        store.write(|w| edit(w, &model, op)).unwrap();
    }
    store
        .write(|w| {
            for op in together {
                model.apply(op);
                edit(w, &model, op)?;
                for id in near(op) {
                    let want = model.nodes.get(&id).map(|n| node(id, *n));
                    assert_eq!(OsmRead::node(&*w, id)?, want, "node {id} after {op:?}");
                    let mut ways = OsmRead::ways_of_node(&*w, id)?;
                    ways.sort_unstable();
                    let want: Vec<i64> = model
                        .ways
                        .iter()
                        .filter(|(_, refs)| refs.contains(&id))
                        .map(|(w, _)| *w)
                        .collect();
                    assert_eq!(ways, want, "ways of node {id} after {op:?}");
                }
            }
            Ok(())
        })
        .unwrap();
    // A snapshot reads through its block cache: the same answers.
    let cached = store.snapshot(|s| Ok(observe(s))).unwrap();
    assert_eq!(cached, observe(&store), "inside a snapshot and outside");
    let got = observe(&store);
    assert_eq!(got, expected(&model), "edited store against the model");
    if !model.nodes.is_empty() || !model.ways.is_empty() {
        let fresh = import(&tmp.path().join("b"), &model);
        assert_eq!(got, observe(&fresh), "edited store against a fresh import");
        let export = |s: &Store| {
            let mut v = Vec::new();
            s.export(|e| v.push(e)).unwrap();
            v
        };
        assert_eq!(export(&store), export(&fresh));
    }
}

fn base_model(n: usize) -> Model {
    let mut m = Model::default();
    for i in 0..n as i64 {
        m.nodes
            .insert(i * 2, ((i * 7) as i32, (i * 11) as i32, i % 5 == 0));
    }
    for w in 0..(n as i64 / 10) {
        m.ways.insert(w, vec![w * 20, w * 20 + 2, w * 20 + 4, 899]);
    }
    m
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn any_edits_leave_blocks_equal_to_the_model_and_to_a_fresh_import(
        n in 1usize..450,
        ops in prop::collection::vec(op(), 1..250),
    ) {
        check(&base_model(n), &ops);
    }
}

#[test]
fn a_block_grown_past_its_limit_splits_and_every_node_stays_found() {
    // 300 nodes put one by one into the gaps of one imported block.
    let ops: Vec<Op> = (0..300)
        .map(|i| Op::PutNode {
            id: 1 + 2 * i,
            lat: i as i32,
            lon: 0,
            tagged: i % 3 == 0,
        })
        .collect();
    check(&base_model(40), &ops);
}

#[test]
fn deleting_every_node_and_way_empties_the_blocks() {
    let base = base_model(100);
    let mut ops: Vec<Op> = base.nodes.keys().map(|&id| Op::DeleteNode(id)).collect();
    ops.extend(base.ways.keys().map(|&id| Op::DeleteWay(id)));
    let tmp = tempfile::tempdir().unwrap();
    check(&base, &ops);
    let mut store = import(tmp.path(), &base);
    store
        .write(|w| {
            for op in &ops {
                match op {
                    Op::DeleteNode(id) => w.delete(MemberKind::Node, *id)?,
                    Op::DeleteWay(id) => w.delete(MemberKind::Way, *id)?,
                    _ => unreachable!(),
                }
            }
            Ok(())
        })
        .unwrap();
    drop(store);
    let c = rusqlite::Connection::open(tmp.path().join("store/store.db")).unwrap();
    let blocks: i64 = c
        .query_row("SELECT count(*) FROM node_blocks", [], |r| r.get(0))
        .unwrap();
    assert_eq!(blocks, 0, "no block is left holding only void entries");
}

#[test]
fn a_store_with_a_row_per_node_is_migrated_on_open() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("old");
    let base = base_model(20);
    drop(import(tmp.path().join("x").as_path(), &base));
    // The earlier form: what a store made before node blocks holds.
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(tmp.path().join("x/store/store.db"), dir.join("store.db")).unwrap();
    {
        let c = rusqlite::Connection::open(dir.join("store.db")).unwrap();
        c.execute_batch(
            "DELETE FROM node_blocks; DELETE FROM node_tags;
             CREATE TABLE nodes(id INTEGER PRIMARY KEY, lat INTEGER NOT NULL, lon INTEGER NOT NULL, tags TEXT);
             CREATE TABLE node_ways(node INTEGER NOT NULL, way INTEGER NOT NULL, PRIMARY KEY(node, way)) WITHOUT ROWID;",
        )
        .unwrap();
        for (id, (lat, lon, tagged)) in &base.nodes {
            let t = tagged.then(|| serde_json::to_string(&tags(true)).unwrap());
            c.execute(
                "INSERT INTO nodes VALUES(?1, ?2, ?3, ?4)",
                rusqlite::params![id, lat, lon, t],
            )
            .unwrap();
        }
        for (w, refs) in &base.ways {
            for r in refs {
                c.execute(
                    "INSERT OR IGNORE INTO node_ways VALUES(?1, ?2)",
                    rusqlite::params![r, w],
                )
                .unwrap();
            }
        }
    }
    let store = highwater_osm::open_store(&dir).unwrap();
    assert_eq!(observe(&store), expected(&base));
    drop(store);
    let c = rusqlite::Connection::open(dir.join("store.db")).unwrap();
    let old: i64 = c
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name IN ('nodes', 'node_ways')",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(old, 0, "the row-per-node tables are gone once migrated");
}

/// Regression (found by issue12's loop test): the import's unseen file
/// lacked the columns that `Store::open` adds to older stores, so the
/// first two processes to open a fresh store raced to add them ("duplicate
/// column name: hits"). A published store is complete before anyone opens
/// it.
#[test]
fn issue10_a_fresh_import_has_every_column_before_its_first_open() {
    let tmp = tempfile::tempdir().unwrap();
    let osm = tmp.path().join("a.osm");
    std::fs::write(&osm, base_model(3).xml()).unwrap();
    let dir = tmp.path().join("store");
    highwater_osm::import::import_into(&dir, &osm, false, false, &highwater_osm::store_extension())
        .unwrap();
    let c = rusqlite::Connection::open(dir.join("store.db")).unwrap();
    for (table, column) in [("dirty", "hits"), ("dirty", "gen"), ("dirty_keys", "gen")] {
        let n: i64 = c
            .query_row(
                &format!("SELECT count(*) FROM pragma_table_info('{table}') WHERE name = ?1"),
                [column],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(n, 1, "{table}.{column}");
    }
}
