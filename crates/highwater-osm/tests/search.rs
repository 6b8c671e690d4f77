//! The search index kept current equals its rebuild, document for document:
//! after random edits (boundary moves and renames included), along the
//! Monaco timelines; an edit to a city's name or shape reindexes exactly
//! the documents that embedded it.

use highwater_osm::ops::{self, OsmConfig};
use highwater_osm::search::{self, SearchDataset, SearchStore};
use highwater_osm::store::Store;
use highwater_osm::{Change, Element};
use proptest::prelude::*;
use std::path::Path;

mod common;
use common::*;

fn config(dir: &Path) -> OsmConfig {
    let text = "[osm]\nstore = \"store\"\n[osm.search.places]\nindex = \"search\"\nadmin_levels = [2, 8, 10]\n";
    let v: toml::Value = toml::from_str(text).unwrap();
    OsmConfig::parse(v.get("osm"), &dir.join("highwater.toml"), dir).unwrap()
}

/// The one check of this file: the index holds exactly a rebuild's
/// documents.
fn check(store: &Store, d: &SearchDataset) {
    let (n, diffs) = search::verify(store, d).unwrap();
    assert!(n > 0);
    // The count the drains keep (issue 25: never a count of the index).
    assert_eq!(
        search::documents(store, &d.name).unwrap(),
        store.search_count(&d.name).unwrap()
    );
    assert!(diffs.is_empty(), "{:?}", &diffs[..diffs.len().min(3)]);
}

fn apply(store: &mut Store, cfg: &OsmConfig, diff: Vec<Change>) -> search::SearchReport {
    ops::apply(store, cfg, &[(diff, None)], false).unwrap();
    search::drain(store, cfg.of::<highwater_osm::search::SearchDataset>()[0]).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn documents_after_random_edits_equal_a_rebuild(
        steps in prop::collection::vec(prop::collection::vec(edit(), 1..4), 1..4),
        moves in prop::collection::vec((any::<usize>(), -60i32..60, -60i32..60), 0..3),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = config(tmp.path());
        let d = cfg.of::<highwater_osm::search::SearchDataset>()[0];
        let mut store = monaco(&tmp.path().join("store"));
        search::rebuild(&mut store, d).unwrap();
        let ids = ids(&store);
        // Nodes of Monaco's quarter boundaries, to move.
        let mut bn = Vec::new();
        for r in [2220206, 2220207, 2221178] {
            for m in store.relation(r).unwrap().unwrap().members {
                if let Some(w) = store.way(m.id).unwrap() {
                    bn.extend(w.refs);
                }
            }
        }
        let mut fresh = 1_i64 << 40;
        for (i, step) in steps.iter().enumerate() {
            let mut diff = Vec::new();
            for e in step {
                diff.extend(changes(&store, &ids, e, &mut fresh));
            }
            if let Some((n, x, y)) = moves.get(i) {
                let mut node = store.node(bn[n % bn.len()]).unwrap().unwrap();
                node.lat_e7 = node.lat_e7.map(|v| v + y * 100);
                node.lon_e7 = node.lon_e7.map(|v| v + x * 100);
                diff.push(modify(Element::Node(node)));
            }
            apply(&mut store, &cfg, diff);
            check(&store, d);
        }
    }
}

#[test]
fn monaco_timelines_equal_rebuilds_and_the_final_snapshot() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(&tmp.path().join("inc"));
    let d = cfg.of::<highwater_osm::search::SearchDataset>()[0];
    let mut store = highwater_osm::create_store(&tmp.path().join("inc/store")).unwrap();
    highwater_osm::import::import(&mut store, &data("monaco-2787-20201109.osm.pbf")).unwrap();
    search::rebuild(&mut store, d).unwrap();
    for name in [
        "monaco-2787__to__2947.osc.gz",
        "monaco-2947__to__3047.osc.gz",
    ] {
        let mut diff = ops::read_diffs(&[data(&format!("monaco-derived/{name}"))]).unwrap();
        apply(&mut store, &cfg, diff.remove(0).0);
    }
    // The derived diffs carry no state file: the store follows no
    // sequence until told where they brought it.
    assert!(ops::pending(&store, &data("monaco-updates")).is_err());
    ops::declare_sequence(&mut store, 3047).unwrap();
    check(&store, d);
    // The real 3047 snapshot, rebuilt on its own, has the same documents.
    let snap_cfg = config(&tmp.path().join("snap"));
    let mut snap = monaco(&tmp.path().join("snap/store"));
    search::rebuild(
        &mut snap,
        snap_cfg.of::<highwater_osm::search::SearchDataset>()[0],
    )
    .unwrap();
    assert_eq!(
        search::all(d).unwrap(),
        search::all(snap_cfg.of::<highwater_osm::search::SearchDataset>()[0]).unwrap()
    );
    // Then the daily diffs 3048..3076, one at a time.
    for f in ops::pending(&store, &data("monaco-updates")).unwrap() {
        let mut diff = ops::read_diffs(&[f]).unwrap();
        apply(&mut store, &cfg, diff.remove(0).0);
    }
    check(&store, d);
}

/// The rebuild reads a page of tagged elements at a time (issue 25: a
/// planet's documents do not fit in memory): pages of any length give the
/// same index, equal to the documents of a pass that holds them all.
#[test]
fn a_rebuild_page_by_page_equals_one_that_holds_every_document() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    let d = cfg.of::<highwater_osm::search::SearchDataset>()[0];
    let mut store = monaco(&tmp.path().join("store"));
    let whole = search::rebuild(&mut store, d).unwrap();
    let docs = search::all(d).unwrap();
    check(&store, d);
    for page_len in [1, 97, 4096] {
        let r = search::rebuild_paged(&mut store, d, page_len).unwrap();
        assert_eq!(r.documents, whole.documents, "pages of {page_len}");
        assert_eq!(search::all(d).unwrap(), docs, "pages of {page_len}");
        check(&store, d);
    }
}

const CITY: &str = r#"<osm version="0.6">
  <node id="1" lat="43.70" lon="7.40"/><node id="2" lat="43.70" lon="7.46"/>
  <node id="3" lat="43.76" lon="7.46"/><node id="4" lat="43.76" lon="7.40"/>
  <way id="10"><nd ref="1"/><nd ref="2"/><nd ref="3"/><nd ref="4"/><nd ref="1"/>
    <tag k="place" v="city"/><tag k="name" v="Alpha"/></way>
  <node id="20" lat="43.73" lon="7.43"><tag k="amenity" v="cafe"/><tag k="name" v="Café Central"/>
    <tag k="addr:street" v="Rue Haute"/></node>
  <node id="21" lat="43.75" lon="7.45"><tag k="shop" v="bakery"/><tag k="name" v="Boulangerie"/></node>
  <node id="22" lat="43.80" lon="7.50"><tag k="name" v="Far Away"/></node>
</osm>"#;

fn city() -> (tempfile::TempDir, OsmConfig, Store) {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    let osm = tmp.path().join("city.osm");
    std::fs::write(&osm, CITY).unwrap();
    let mut store = highwater_osm::create_store(&tmp.path().join("store")).unwrap();
    highwater_osm::import::import(&mut store, &osm).unwrap();
    search::rebuild(
        &mut store,
        cfg.of::<highwater_osm::search::SearchDataset>()[0],
    )
    .unwrap();
    (tmp, cfg, store)
}

fn osc(tmp: &tempfile::TempDir, text: &str) -> Vec<Change> {
    let p = tmp.path().join("d.osc");
    std::fs::write(&p, text).unwrap();
    highwater_osm::read_changes(&p).unwrap()
}

/// A city renamed: its own document and the two inside it are reindexed,
/// and nothing else (the far node is not even recomputed).
#[test]
fn renaming_a_city_reindexes_exactly_the_documents_that_embedded_it() {
    let (tmp, cfg, mut store) = city();
    let d = cfg.of::<highwater_osm::search::SearchDataset>()[0];
    let cafe = &search::search(d, "Café", 5).unwrap()[0];
    assert_eq!(cafe.place.as_deref(), Some("Alpha"));
    assert_eq!(cafe.street.as_deref(), Some("Rue Haute"));
    let r = apply(
        &mut store,
        &cfg,
        osc(
            &tmp,
            r#"<osmChange><modify><way id="10"><nd ref="1"/><nd ref="2"/><nd ref="3"/><nd ref="4"/><nd ref="1"/>
               <tag k="place" v="city"/><tag k="name" v="Beta"/></way></modify></osmChange>"#,
        ),
    );
    assert_eq!(
        (r.recomputed, r.reindexed, r.areas_changed),
        (3, 3, 1),
        "{r:?}"
    );
    let hits = search::search(d, "Beta", 10).unwrap();
    let names: Vec<&str> = hits.iter().map(|h| h.name.as_str()).collect();
    assert!(
        names.contains(&"Café Central") && names.contains(&"Boulangerie"),
        "{names:?}"
    );
    assert_eq!(search::search(d, "\"Far Away\"", 1).unwrap()[0].place, None);
    check(&store, d);
}

/// The city's boundary moves so the bakery falls outside: its document
/// loses the city, the café's keeps it.
#[test]
fn a_city_boundary_moving_updates_the_documents_that_crossed_it() {
    let (tmp, cfg, mut store) = city();
    let d = cfg.of::<highwater_osm::search::SearchDataset>()[0];
    apply(
        &mut store,
        &cfg,
        osc(
            &tmp,
            r#"<osmChange><modify><node id="3" lat="43.74" lon="7.44"/></modify></osmChange>"#,
        ),
    );
    let bakery = &search::search(d, "Boulangerie", 1).unwrap()[0];
    assert_eq!(bakery.place, None);
    let cafe = &search::search(d, "Café", 1).unwrap()[0];
    assert_eq!(cafe.place.as_deref(), Some("Alpha"));
    check(&store, d);
}

/// A changed recipe (other admin levels) rebuilds the index, and says why.
#[test]
fn a_recipe_change_rebuilds_the_index_and_says_why() {
    let (_tmp, cfg, mut store) = city();
    let mut other = cfg.of::<highwater_osm::search::SearchDataset>()[0].clone();
    other.admin_levels = vec![2, 4];
    other.recipe.push_str("-levels");
    let r = search::drain(&mut store, &other).unwrap();
    assert!(r.rebuilt && r.reason.unwrap_or_default().contains("recipe changed"));
    let cafe = &search::search(&other, "Café", 1).unwrap()[0];
    assert_eq!(cafe.admin.keys().collect::<Vec<_>>(), ["2", "4"]);
    check(&store, &other);
}
