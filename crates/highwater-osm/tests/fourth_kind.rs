//! Issue 25: "the trait names no dataset, and adding a fourth touches only
//! its own folder and one registration line." A fourth kind that only
//! this test knows, `counts`: its own config section (`[osm.counts.NAME]`,
//! read by the kind, unknown keys refused), and the registry's kinds plus
//! one entry. `ops` (parse, apply, status) and the drain and rebuild
//! bookkeeping take it with no change: they reach kinds only through
//! `Kind` and the `Dataset` trait.
//!
//! The registry's list is a constant of the crate, so a test cannot add
//! to it; it passes the registry's kinds plus its own to
//! `OsmConfig::parse_with`, the function `OsmConfig::parse` calls with
//! `registry::KINDS`. `layers.rs` checks the other half: `ops` and
//! `dataset` name no kind.

use highwater_osm::dataset::{
    self, section, Configured, Dataset, DatasetError, DrainLimits, Kind, Outcome,
};
use highwater_osm::model::{Action, Change, Element, Node, Tags};
use highwater_osm::ops::{self, OpsError, OsmConfig};
use highwater_osm::registry::KINDS;
use highwater_osm::store::{built_recipe_key, Store, StoreError};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

mod common;
use common::*;

/// The fourth kind: counts the elements the diffs touched.
struct Counts {
    name: String,
    key: String,
    recipe: String,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCounts {
    key: String,
    affected_guard: Option<f64>,
    affected_guard_min: Option<usize>,
}

fn configure(
    _root: &Path,
    sections: BTreeMap<String, toml::Value>,
) -> Result<Vec<Configured>, String> {
    let mut out = Vec::new();
    for (name, v) in sections {
        let r: RawCounts = section("counts", &name, v)?;
        out.push(Configured {
            dataset: Arc::new(Counts {
                recipe: format!("counts-1:{}", r.key),
                name,
                key: r.key,
            }),
            affected_guard: r.affected_guard,
            affected_guard_min: r.affected_guard_min,
        });
    }
    Ok(out)
}

const COUNTS: Kind = Kind {
    name: "counts",
    tables: &[],
    order: 0,
    configure,
};

/// The registry's kinds, and the one registration line of the fourth.
fn kinds() -> Vec<Kind> {
    let mut k = KINDS.to_vec();
    k.push(COUNTS);
    k
}

impl Dataset for Counts {
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> &'static str {
        COUNTS.name
    }
    fn recipe(&self) -> &str {
        &self.recipe
    }
    fn unit_key(&self) -> Option<&'static str> {
        Some("counted")
    }
    fn drain(&self, store: &mut Store, _: DrainLimits) -> Result<Outcome, DatasetError> {
        let t0 = std::time::Instant::now();
        let mut run = || -> Result<usize, StoreError> {
            let (n, generation) =
                store.snapshot(|s| Ok((s.dirty_keys(&self.name)?.len(), s.generation()?)))?;
            store.write(|w| w.clear_dirty_keys(&self.name, generation))?;
            Ok(n)
        };
        let n = run().map_err(|e| dataset::error_text(&e))?;
        Ok(Outcome::new(
            "counts",
            serde_json::json!({"dataset": self.name, "drained": n}),
            t0,
            |s| format!("{}: {n} drained in {s:.2} s", self.name),
        ))
    }
    fn rebuild(&self, store: &mut Store) -> Result<Outcome, DatasetError> {
        let t0 = std::time::Instant::now();
        store
            .write(|w| w.set_meta(&built_recipe_key(&self.name), &self.recipe))
            .map_err(|e| dataset::error_text(&e))?;
        Ok(Outcome::new(
            "counts",
            serde_json::json!({"dataset": self.name, "key": self.key, "rebuilt": true, "counted": 7}),
            t0,
            |s| format!("{}: rebuilt in {s:.2} s", self.name),
        ))
    }
    fn verify(&self, _: &Store, _: Option<usize>) -> Result<Outcome, DatasetError> {
        Ok(dataset::verified(
            &self.name,
            std::time::Instant::now(),
            0,
            Vec::new(),
        ))
    }
}

fn parse(dir: &Path, text: &str, kinds: &[Kind]) -> Result<OsmConfig, OpsError> {
    let v: toml::Value = toml::from_str(text).unwrap();
    OsmConfig::parse_with(v.get("osm"), &dir.join("highwater.toml"), dir, kinds)
}

fn refused(dir: &Path, text: &str, kinds: &[Kind]) -> String {
    match parse(dir, text, kinds) {
        Ok(_) => panic!("accepted: {text}"),
        Err(e) => e.to_string(),
    }
}

const CONFIG: &str = "[osm]\nstore = \"store\"\n[osm.tiles.t]\nzooms = \"13-14\"\nkeys = [\"building\"]\n[osm.counts.c]\nkey = \"name\"\naffected_guard = 0\n";

#[test]
fn a_fourth_kind_is_configured_applied_drained_rebuilt_and_shown_through_the_trait() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = parse(tmp.path(), CONFIG, &kinds()).unwrap();
    // Read by its kind, from its own section.
    let c = cfg.of::<Counts>();
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].name.as_str(), c[0].key.as_str()), ("c", "name"));
    assert_eq!(cfg.affected_guard.get("c"), Some(&(0.0, 1000)));
    // Visited by its kind's order: before the tiles.
    let order: Vec<_> = cfg
        .datasets()
        .iter()
        .map(|d| d.name().to_string())
        .collect();
    assert_eq!(order, ["c", "t"]);

    let mut store = monaco(&tmp.path().join("store"));
    let mut node = None;
    store
        .export(|e| {
            if let (None, Element::Node(n)) = (node, &e) {
                node = Some(n.id);
            }
        })
        .unwrap();
    let node = node.expect("Monaco has nodes");
    let diff = vec![Change {
        action: Action::Modify,
        element: Element::Node(Node {
            id: node,
            lat_e7: Some(437_300_000),
            lon_e7: Some(74_000_000),
            tags: Tags::new(),
        }),
    }];
    let r = ops::apply(&mut store, &cfg, &[(diff, None)], false).unwrap();
    // The apply report lists the datasets whose dirty sets are tiles.
    assert_eq!(
        r.datasets
            .iter()
            .map(|d| d.name.as_str())
            .collect::<Vec<_>>(),
        ["t"]
    );
    // The node, the ways through it and their relations.
    let dirty = store.dirty_keys("c").unwrap().len();
    assert!(dirty >= 1, "{dirty}");
    assert!(store
        .datasets()
        .unwrap()
        .iter()
        .any(|(name, _, recipe, _)| name == "c" && recipe == "counts-1:name"));

    let status = ops::status(&store, &cfg).unwrap();
    let mine = status["datasets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "c")
        .unwrap()
        .clone();
    assert_eq!(mine["kind"], "counts");
    assert_eq!(mine["dirty"], dirty);
    assert!(mine["rebuild"].as_str().unwrap().contains("never built"));

    let d = cfg.dataset("c").unwrap();
    let o = dataset::drain_recorded(d, &mut store, DrainLimits::default()).unwrap();
    assert_eq!(o.json["drained"], dirty);
    assert_eq!(store.dirty_keys("c").unwrap().len(), 0);
    dataset::rebuild_recorded(d, &mut store).unwrap();
    // The crossover counts a rebuild's units under the kind's own key.
    let costs = dataset::costs(&store, "c").unwrap();
    assert_eq!(costs.rebuilds.last().map(|r| r.units), Some(7));
    let status = ops::status(&store, &cfg).unwrap();
    let mine = status["datasets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "c")
        .unwrap()
        .clone();
    assert_eq!(mine["rebuild"], serde_json::Value::Null, "{mine}");
}

#[test]
fn a_fourth_kinds_config_is_refused_as_clearly_as_the_others() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // An unknown key in its section: named, with its section and the
    // keys it knows.
    let e = refused(
        dir,
        "[osm]\n[osm.counts.c]\nkey = \"name\"\nbogus = 1\n",
        &kinds(),
    );
    assert!(
        e.contains("[osm.counts.c]: unknown field `bogus`") && e.contains("`key`"),
        "{e}"
    );
    // An unknown section: named, with every kind among the known keys.
    let e = refused(dir, "[osm]\n[osm.nope.x]\nkey = 1\n", &kinds());
    assert!(e.contains("unknown field `nope`"), "{e}");
    for k in ["`store`", "`tiles`", "`search`", "`aggregates`", "`counts`"] {
        assert!(e.contains(k), "{k}: {e}");
    }
    // Not registered: its section is unknown.
    let e = refused(dir, "[osm]\n[osm.counts.c]\nkey = \"name\"\n", &KINDS);
    assert!(e.contains("unknown field `counts`"), "{e}");
    let listed = e.split("kind of dataset:").nth(1).unwrap_or_default();
    assert!(
        listed.contains("`tiles`") && !listed.contains("`counts`"),
        "{e}"
    );
    // Names are unique across kinds, its own included.
    let e = refused(
        dir,
        "[osm]\n[osm.tiles.c]\nzooms = \"13-14\"\n[osm.counts.c]\nkey = \"name\"\n",
        &kinds(),
    );
    assert!(
        e.contains("[osm.counts.c]") && e.contains("dataset names must be unique"),
        "{e}"
    );
    // The guard is checked alike for every kind.
    let e = refused(
        dir,
        "[osm]\n[osm.counts.c]\nkey = \"name\"\naffected_guard = 0.5\n",
        &kinds(),
    );
    assert!(
        e.contains("[osm.counts.c] affected_guard = 0.5: give a factor of 1 or more"),
        "{e}"
    );
}
