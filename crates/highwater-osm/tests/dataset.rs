//! The `Dataset` trait's ordering contract (issue 10, structure), checked
//! with a fourth kind of dataset that only this test knows: plugged into
//! `ops::apply_to` beside nothing else, it sees the store before each diff
//! in `derive`, after it in `touched`, and `commit` once per batch.

use highwater_osm::dataset::DatasetReport;
use highwater_osm::dataset::{Dataset, DatasetError, DrainLimits, Outcome};
use highwater_osm::derive::Touched;
use highwater_osm::model::{Action, Change, Element, MemberKind, Node, Tags};
use highwater_osm::ops::{self, OsmConfig};
use highwater_osm::store::{Store, StoreError, Writer};
use std::sync::Mutex;

mod common;
use common::*;

/// Records what it is shown of one node, in order.
struct Probe {
    node: i64,
    log: Mutex<Vec<String>>,
}

impl Probe {
    fn say(&self, s: String) {
        self.log.lock().unwrap().push(s);
    }

    fn lat(&self, w: &Writer<'_>) -> Option<i32> {
        w.node(self.node).unwrap().and_then(|n| n.lat_e7)
    }
}

impl Dataset for Probe {
    fn name(&self) -> &str {
        "probe"
    }
    fn kind(&self) -> &'static str {
        "probe"
    }
    fn recipe(&self) -> &str {
        "probe-1"
    }
    fn derive(
        &self,
        w: &mut Writer<'_>,
        changes: &[Change],
        _r: &mut DatasetReport,
    ) -> Result<(), StoreError> {
        self.say(format!("derive {} {:?}", changes.len(), self.lat(w)));
        Ok(())
    }
    fn touched(
        &self,
        w: &mut Writer<'_>,
        t: &Touched,
        _report: &mut DatasetReport,
    ) -> Result<(), StoreError> {
        let has = t.all.contains(&(MemberKind::Node, self.node));
        self.say(format!("touched {has} {:?}", self.lat(w)));
        Ok(())
    }
    fn commit(
        &self,
        w: &mut Writer<'_>,
        sequence: Option<i64>,
        _r: &mut DatasetReport,
    ) -> Result<(), StoreError> {
        w.set_marker(self.name(), sequence, self.recipe())?;
        self.say(format!("commit {sequence:?} {:?}", self.lat(w)));
        Ok(())
    }
    fn drain(&self, _: &mut Store, _: DrainLimits) -> Result<Outcome, DatasetError> {
        Err("not drained here".into())
    }
    fn rebuild(&self, _: &mut Store) -> Result<Outcome, DatasetError> {
        Err("not rebuilt here".into())
    }
    fn verify(&self, _: &Store, _: Option<usize>) -> Result<Outcome, DatasetError> {
        Err("not verified here".into())
    }
}

fn moved(node: i64, lat_e7: i32) -> Vec<Change> {
    vec![Change {
        action: Action::Modify,
        element: Element::Node(Node {
            id: node,
            lat_e7: Some(lat_e7),
            lon_e7: Some(74_000_000),
            tags: Tags::new(),
        }),
    }]
}

#[test]
fn a_fourth_dataset_sees_the_store_before_and_after_each_diff_and_commits_once() {
    let tmp = tempfile::tempdir().unwrap();
    let mut store = monaco(tmp.path());
    let mut node = None;
    store
        .export(|e| {
            if let (None, Element::Node(n)) = (node, &e) {
                node = Some(n.id);
            }
        })
        .unwrap();
    let node = node.expect("Monaco has nodes");
    let before = store.node(node).unwrap().and_then(|n| n.lat_e7);
    let cfg = OsmConfig::parse(None, &tmp.path().join("highwater.toml"), tmp.path()).unwrap();
    let probe = Probe {
        node,
        log: Mutex::new(Vec::new()),
    };
    let diffs = vec![
        (moved(node, 437_300_000), None),
        (moved(node, 437_310_000), None),
    ];
    ops::apply_to(&mut store, &cfg, &[&probe], &diffs, false, &mut |_, _| {
        Ok(())
    })
    .unwrap();
    let log = probe.log.lock().unwrap().clone();
    assert_eq!(
        log,
        vec![
            format!("derive 1 {before:?}"),
            "touched true Some(437300000)".to_string(),
            "derive 1 Some(437300000)".to_string(),
            "touched true Some(437310000)".to_string(),
            // Unsequenced diffs leave the store at its sequence.
            "commit Some(3047) Some(437310000)".to_string(),
        ]
    );
    let marker = store.datasets().unwrap();
    assert!(marker
        .iter()
        .any(|(name, _, recipe, _)| name == "probe" && recipe == "probe-1"));
}
