//! Aggregates kept current equal their rebuild, row for row: after random
//! edits (including boundary moves and renames), along the Monaco
//! timelines, and a boundary move recounts only the features near it.

use highwater_osm::aggregates::{self, AggDataset, Row};
use highwater_osm::ops::{self, OsmConfig};
use highwater_osm::store::Store;
use highwater_osm::{Change, Element, MemberKind};
use proptest::prelude::*;
use std::path::Path;

mod common;
use common::*;

const AGG: &str = r#"
[osm.aggregates.admin]
classes = ["building", "highway=*", "amenity"]
admin_levels = [2, 8, 10]
"#;

fn config(dir: &Path) -> OsmConfig {
    let text = format!("[osm]\nstore = \"store\"\n{AGG}");
    let v: toml::Value = toml::from_str(&text).unwrap();
    OsmConfig::parse(v.get("osm"), &dir.join("highwater.toml"), dir).unwrap()
}

fn rebuild_rows(store: &Store, d: &AggDataset) -> Vec<Row> {
    let (areas, contrib) = aggregates::rebuild_contributions(store, d).unwrap();
    aggregates::totals(&areas.list, &contrib)
}

/// The one check of this file: stored totals equal a rebuild's, exactly.
fn check(store: &Store, d: &AggDataset) -> Vec<Row> {
    let have = aggregates::stored_totals(store, d).unwrap();
    let want = rebuild_rows(store, d);
    assert_eq!(have, want);
    assert!(!have.is_empty());
    have
}

fn apply(store: &mut Store, cfg: &OsmConfig, diff: Vec<Change>) -> aggregates::AggReport {
    ops::apply(store, cfg, &[(diff, None)], false).unwrap();
    aggregates::drain(store, cfg.of::<highwater_osm::aggregates::AggDataset>()[0]).unwrap()
}

/// The nodes of the admin boundaries' member ways, for edits that move a
/// boundary.
fn boundary_nodes(store: &Store) -> Vec<i64> {
    let mut out = Vec::new();
    for r in [2220206, 2220207, 2221178, 5986438] {
        let rel = store.relation(r).unwrap().unwrap();
        for m in rel.members.iter().filter(|m| m.kind == MemberKind::Way) {
            if let Some(w) = store.way(m.id).unwrap() {
                out.extend(w.refs);
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[derive(Clone, Debug)]
enum Step {
    Random(Edit),
    /// Move a boundary node by (dx, dy) × 10⁻⁵ degrees.
    MoveBoundary(usize, i32, i32),
    /// Rename an admin area (a city's name).
    Rename(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => edit().prop_map(Step::Random),
        2 => (any::<usize>(), -60i32..60, -60i32..60).prop_map(|(i, x, y)| Step::MoveBoundary(i, x, y)),
        1 => any::<usize>().prop_map(Step::Rename),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn aggregates_after_random_edits_equal_a_rebuild(steps in prop::collection::vec(prop::collection::vec(step(), 1..4), 1..4)) {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = config(tmp.path());
        let d = cfg.of::<highwater_osm::aggregates::AggDataset>()[0];
        let mut store = monaco(&tmp.path().join("store"));
        aggregates::rebuild(&mut store, d).unwrap();
        let ids = ids(&store);
        let bn = boundary_nodes(&store);
        let mut fresh = 1_i64 << 40;
        for s in &steps {
            let mut diff = Vec::new();
            for e in s {
                match e {
                    Step::Random(e) => diff.extend(changes(&store, &ids, e, &mut fresh)),
                    Step::MoveBoundary(i, x, y) => {
                        let mut n = store.node(bn[i % bn.len()]).unwrap().unwrap();
                        n.lat_e7 = n.lat_e7.map(|v| v + y * 100);
                        n.lon_e7 = n.lon_e7.map(|v| v + x * 100);
                        diff.push(modify(Element::Node(n)));
                    }
                    Step::Rename(i) => {
                        let ids = [2220206, 2220207, 2221178, 2220322];
                        let mut r = store.relation(ids[i % ids.len()]).unwrap().unwrap();
                        r.tags.insert("name".into(), format!("Renamed {i}"));
                        diff.push(modify(Element::Relation(r)));
                    }
                }
            }
            apply(&mut store, &cfg, diff);
            check(&store, d);
        }
    }
}

#[test]
fn monaco_timelines_equal_rebuilds_and_the_final_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    let d = cfg.of::<highwater_osm::aggregates::AggDataset>()[0];
    // Daily diffs 3048..3076, one at a time.
    let mut store = monaco(&tmp.path().join("daily"));
    aggregates::rebuild(&mut store, d).unwrap();
    for f in ops::pending(&store, &data("monaco-updates")).unwrap() {
        let mut diff = ops::read_diffs(&[f]).unwrap();
        apply(&mut store, &cfg, diff.remove(0).0);
    }
    check(&store, d);
    // 2787 -> 2947 -> 3047 through the derived diffs, against a rebuild
    // from the real 3047 snapshot.
    let mut inc = highwater_osm::create_store(&tmp.path().join("inc")).unwrap();
    highwater_osm::import::import(&mut inc, &data("monaco-2787-20201109.osm.pbf")).unwrap();
    aggregates::rebuild(&mut inc, d).unwrap();
    for name in [
        "monaco-2787__to__2947.osc.gz",
        "monaco-2947__to__3047.osc.gz",
    ] {
        let mut diff = ops::read_diffs(&[data(&format!("monaco-derived/{name}"))]).unwrap();
        apply(&mut inc, &cfg, diff.remove(0).0);
    }
    let have = check(&inc, d);
    let snap = monaco(&tmp.path().join("snap"));
    assert_eq!(have, rebuild_rows(&snap, d));
}

/// Moving one node of Fontvieille's boundary recomputes only the features
/// near the moved stretch, and the totals of both quarters it separates
/// stay equal to a rebuild.
#[test]
fn a_boundary_move_recounts_only_the_features_near_it() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    let d = cfg.of::<highwater_osm::aggregates::AggDataset>()[0];
    let mut store = monaco(&tmp.path().join("store"));
    let full = aggregates::rebuild(&mut store, d).unwrap();
    // A node shared by Fontvieille's boundary and another quarter's.
    let rel = store.relation(2220206).unwrap().unwrap();
    let way = rel
        .members
        .iter()
        .find_map(|m| store.way(m.id).unwrap())
        .unwrap();
    let mut n = store.node(way.refs[way.refs.len() / 2]).unwrap().unwrap();
    n.lat_e7 = n.lat_e7.map(|v| v + 3000);
    let r = apply(&mut store, &cfg, vec![modify(Element::Node(n))]);
    assert!(r.areas_changed >= 1, "{r:?}");
    assert!(
        r.recomputed * 10 < full.recomputed,
        "recomputed {} of {}",
        r.recomputed,
        full.recomputed
    );
    check(&store, d);
}

/// Renaming an admin area changes its rows' name and recomputes no
/// feature. (Monaco's city relation lacks three member ways in the extract,
/// so it is no area here; its quarter Fontvieille is.)
#[test]
fn renaming_an_admin_area_recomputes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    let d = cfg.of::<highwater_osm::aggregates::AggDataset>()[0];
    let mut store = monaco(&tmp.path().join("store"));
    aggregates::rebuild(&mut store, d).unwrap();
    let mut r = store.relation(2220206).unwrap().unwrap();
    r.tags.insert("name".into(), "Fontvieille-Neuf".into());
    let rep = apply(&mut store, &cfg, vec![modify(Element::Relation(r))]);
    // The relation itself is the one feature recomputed (it has no class).
    assert_eq!(
        (rep.areas_changed, rep.recomputed, rep.changed),
        (1, 1, 0),
        "{rep:?}"
    );
    let rows = check(&store, d);
    assert!(rows
        .iter()
        .any(|r| r.area_osm_id == 2220206 && r.area_name.as_deref() == Some("Fontvieille-Neuf")));
}

/// A changed recipe (another class list) rebuilds instead of mixing old
/// totals with new, and says why.
#[test]
fn a_recipe_change_rebuilds_and_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    let mut store = monaco(&tmp.path().join("store"));
    aggregates::rebuild(
        &mut store,
        cfg.of::<highwater_osm::aggregates::AggDataset>()[0],
    )
    .unwrap();
    let mut other = cfg.of::<highwater_osm::aggregates::AggDataset>()[0].clone();
    other
        .classes
        .push(aggregates::ClassSpec::parse("shop").unwrap());
    other.recipe.push_str("-shop");
    let r = aggregates::drain(&mut store, &other).unwrap();
    assert!(r.rebuilt, "{r:?}");
    assert!(r.reason.unwrap_or_default().contains("recipe changed"));
    let rows = check(&store, &other);
    assert!(rows.iter().any(|r| r.class == "shop"));
}
