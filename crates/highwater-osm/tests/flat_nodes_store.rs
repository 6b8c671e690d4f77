//! Issue 25: flat nodes wired into the store (`[osm] flat_nodes`).
//! Monaco imported with flat nodes and without holds the same elements
//! and cuts the same tiles and search documents; the real Monaco diffs
//! applied with flat nodes leave tiles and search equal to a rebuild (and
//! the store equal to the one without flat nodes); the refusals name the
//! file and what to do; an apply killed after writing the flat file but
//! before its store commits is rolled back by the next writer.

use highwater_osm::model::{Action, Change, Element, Node};
use highwater_osm::ops::{self, OsmConfig};
use highwater_osm::store::{DrainOrder, Store};
use highwater_osm::{search, tiles};
use std::path::Path;

mod common;
use common::data;

const DATASETS: &str = r#"
[osm.tiles.sb]
schema = "shortbread"
mbtiles = "sb.mbtiles"
drain_rebuild_share = 1000

[osm.search.names]
index = "names"
"#;

fn config(dir: &Path, flat: bool) -> OsmConfig {
    let flat = if flat {
        std::fs::create_dir_all(dir.join("flat")).unwrap();
        "flat_nodes = \"flat/nodes.flat\"\n"
    } else {
        ""
    };
    let text = format!("[osm]\nstore = \"store\"\n{flat}{DATASETS}");
    let v: toml::Value = toml::from_str(&text).unwrap();
    OsmConfig::parse(v.get("osm"), &dir.join("highwater.toml"), dir).unwrap()
}

fn import(cfg: &OsmConfig, extract: &Path) -> Store {
    highwater_osm::import::import_into_with(
        &cfg.store,
        extract,
        false,
        false,
        0,
        &cfg.import,
        &highwater_osm::store_extension(),
    )
    .unwrap();
    let st = highwater_osm::open_store(&cfg.store).unwrap();
    ops::check_flat_nodes(cfg, &st).unwrap();
    st
}

fn elements(st: &Store) -> Vec<Element> {
    let mut v = Vec::new();
    st.export(|e| v.push(e)).unwrap();
    v
}

/// A tile's layers, decoded.
type Layers = Vec<(String, Vec<tiles::mvt::TileFeature>)>;

/// Every tile of the dataset's file, decoded.
fn tiles_of(cfg: &OsmConfig) -> Vec<(String, Layers)> {
    let d = cfg.of::<highwater_osm::tiles::TileDataset>()[0];
    let mb = tiles::Mbtiles::open(d.mbtiles.as_ref().unwrap())
        .unwrap()
        .unwrap();
    mb.tiles()
        .unwrap()
        .into_iter()
        .map(|t| {
            let b = mb.get(t).unwrap().unwrap();
            (t.to_zxy(), tiles::mvt::decode(&b).unwrap())
        })
        .collect()
}

fn build_all(st: &mut Store, cfg: &OsmConfig) {
    tiles::build(st, cfg.of::<highwater_osm::tiles::TileDataset>()[0]).unwrap();
    search::rebuild(st, cfg.of::<highwater_osm::search::SearchDataset>()[0]).unwrap();
}

fn store_bytes(cfg: &OsmConfig) -> u64 {
    std::fs::metadata(cfg.store.join("store.db")).unwrap().len()
}

#[test]
fn monaco_with_flat_nodes_and_without_holds_and_cuts_the_same() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (ca, cb) = (config(a.path(), true), config(b.path(), false));
    let pbf = data("monaco-3047-20210801.osm.pbf");
    let (mut sa, mut sb) = (import(&ca, &pbf), import(&cb, &pbf));
    assert_eq!(
        sa.flat_nodes(),
        Some(a.path().join("flat/nodes.flat").as_path())
    );
    assert_eq!(sb.flat_nodes(), None);
    assert!(!a.path().join("flat/nodes.flat.hw-import").exists());
    let (ea, eb) = (elements(&sa), elements(&sb));
    assert!(ea.len() > 30_000, "{}", ea.len());
    assert!(ea == eb, "the same elements with flat nodes and without");
    eprintln!(
        "store.db: {} bytes with flat nodes, {} without",
        store_bytes(&ca),
        store_bytes(&cb)
    );
    assert!(
        store_bytes(&ca) < store_bytes(&cb),
        "locations moved out of the store"
    );
    build_all(&mut sa, &ca);
    build_all(&mut sb, &cb);
    assert!(tiles_of(&ca) == tiles_of(&cb), "the same tiles");
    assert_eq!(
        search::all(ca.of::<highwater_osm::search::SearchDataset>()[0]).unwrap(),
        search::all(cb.of::<highwater_osm::search::SearchDataset>()[0]).unwrap(),
        "the same search documents"
    );
}

fn apply_and_drain(st: &mut Store, cfg: &OsmConfig, diff: ops::Diff) {
    ops::apply(st, cfg, &[diff], false).unwrap();
    let r = tiles::drain(
        st,
        cfg.of::<highwater_osm::tiles::TileDataset>()[0],
        usize::MAX,
        DrainOrder::LowZoomFirst,
    )
    .unwrap();
    assert_eq!(r.backlog, 0);
    search::drain(st, cfg.of::<highwater_osm::search::SearchDataset>()[0]).unwrap();
}

#[test]
fn monacos_real_diffs_with_flat_nodes_equal_a_rebuild_and_the_store_without() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (ca, cb) = (config(a.path(), true), config(b.path(), false));
    let pbf = data("monaco-3047-20210801.osm.pbf");
    let (mut sa, mut sb) = (import(&ca, &pbf), import(&cb, &pbf));
    build_all(&mut sa, &ca);
    build_all(&mut sb, &cb);
    let files = ops::pending(&sa, &data("monaco-updates")).unwrap();
    assert_eq!(files.len(), 29);
    for f in files {
        let d = ops::read_diffs(&[f]).unwrap().remove(0);
        apply_and_drain(&mut sa, &ca, d.clone());
        apply_and_drain(&mut sb, &cb, d);
    }
    assert_eq!(sa.meta("sequence").unwrap().as_deref(), Some("3076"));
    assert!(
        !a.path().join("flat/nodes.flat.undo").exists(),
        "every log settled"
    );
    assert!(
        elements(&sa) == elements(&sb),
        "the same store with flat nodes and without"
    );
    let v = tiles::verify(&sa, ca.of::<highwater_osm::tiles::TileDataset>()[0], None).unwrap();
    assert!(v.checked > 0 && v.differences.is_empty(), "{v:?}");
    let (checked, diffs) =
        search::verify(&sa, ca.of::<highwater_osm::search::SearchDataset>()[0]).unwrap();
    assert!(checked > 0 && diffs.is_empty(), "{diffs:?}");
    assert!(tiles_of(&ca) == tiles_of(&cb), "the same tiles");
}

#[test]
fn refusals_name_the_file_and_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    // The flat file's folder is missing.
    let text = "[osm]\nstore = \"store\"\nflat_nodes = \"nowhere/nodes.flat\"\n";
    let v: toml::Value = toml::from_str(text).unwrap();
    let e = OsmConfig::parse(v.get("osm"), &tmp.path().join("highwater.toml"), tmp.path())
        .unwrap_err()
        .to_string();
    assert!(e.contains("flat_nodes") && e.contains("nowhere"), "{e}");

    // A node id above node_id_max (2^36).
    let cfg = config(tmp.path(), true);
    let big = tmp.path().join("big.osm");
    std::fs::write(
        &big,
        format!(
            "<osm version=\"0.6\"><node id=\"1\" lat=\"1\" lon=\"1\"/><node id=\"{}\" lat=\"1\" lon=\"2\"/></osm>",
            (1i64 << 36) + 1
        ),
    )
    .unwrap();
    let e = highwater_osm::import::import_into_with(
        &cfg.store,
        &big,
        false,
        false,
        0,
        &cfg.import,
        &highwater_osm::store_extension(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("nodes.flat") && e.contains("node_id_max") && e.contains("without `flat_nodes`"),
        "{e}"
    );
    assert!(!cfg.store.join("store.db").exists(), "nothing published");

    // A store with flat nodes opened without the setting, and the reverse.
    let pbf = data("monaco-3047-20210801.osm.pbf");
    let st = import(&cfg, &pbf);
    let without = {
        let text = "[osm]\nstore = \"store\"\n";
        let v: toml::Value = toml::from_str(text).unwrap();
        OsmConfig::parse(v.get("osm"), &tmp.path().join("highwater.toml"), tmp.path()).unwrap()
    };
    let e = ops::check_flat_nodes(&without, &st)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("nodes.flat") && e.contains("add flat_nodes"),
        "{e}"
    );
    drop(st);
    let other = tempfile::tempdir().unwrap();
    let cb = config(other.path(), false);
    let sb = import(&cb, &pbf);
    let e = ops::check_flat_nodes(&config(other.path(), true), &sb)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("imported without flat nodes") && e.contains("remove the setting"),
        "{e}"
    );

    // The flat file replaced by another import's (another token in slot
    // 0; copying one would write its 70 GB of holes out): refused.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(tmp.path().join("flat/nodes.flat"))
            .unwrap();
        f.write_all_at(&12345u64.to_le_bytes(), 0).unwrap();
    }
    let e = highwater_osm::open_store(&cfg.store)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("nodes.flat") && e.contains("belongs to another store"),
        "{e}"
    );
}

/// An apply killed after it wrote the flat file, before its store
/// committed, leaves the new slot and the undo log under an epoch the
/// store never committed: the next writer rolls the slot back, so the
/// node reads as the store's committed state says (and a re-applied diff
/// derives from the true old location). A log of a committed epoch is
/// only dropped.
#[test]
fn a_flat_write_the_store_did_not_commit_is_rolled_back_by_the_next_writer() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path(), true);
    let pbf = data("monaco-3047-20210801.osm.pbf");
    let mut st = import(&cfg, &pbf);
    let n: Node = elements(&st)
        .into_iter()
        .find_map(|e| match e {
            Element::Node(n) if n.tags.is_empty() => Some(n),
            _ => None,
        })
        .unwrap();
    let flat = tmp.path().join("flat/nodes.flat");
    let undo = tmp.path().join("flat/nodes.flat.undo");
    let mut moved = n.clone();
    moved.lat_e7 = Some(n.lat_e7.unwrap() + 1000);
    let change = |n: &Node| Change {
        action: Action::Modify,
        element: Element::Node(n.clone()),
    };
    ops::apply(&mut st, &cfg, &[(vec![change(&moved)], None)], false).unwrap();
    assert_eq!(st.node(n.id).unwrap().unwrap(), moved);
    assert!(!undo.exists(), "settled once the store committed");
    let epoch: u64 = st
        .meta("flat_nodes_epoch")
        .unwrap()
        .unwrap()
        .parse()
        .unwrap();
    drop(st);
    // The killed apply's state: another location written into the slot,
    // and the log of what the slot held, under the next epoch.
    let at = (n.id as u64) * 8;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&flat)
        .unwrap();
    use std::os::unix::fs::FileExt;
    let mut committed = [0u8; 8];
    file.read_exact_at(&mut committed, at).unwrap();
    let log = |e: u64| {
        let mut l = b"hwundo01".to_vec();
        l.extend_from_slice(&e.to_le_bytes());
        l.extend_from_slice(&1u64.to_le_bytes());
        l.extend_from_slice(&n.id.to_le_bytes());
        l.extend_from_slice(&committed);
        l
    };
    file.write_all_at(&[7u8; 8], at).unwrap();
    std::fs::write(&undo, log(epoch + 1)).unwrap();
    let mut st = highwater_osm::open_store(&cfg.store).unwrap();
    st.lease_writer(false).unwrap();
    assert!(!undo.exists(), "the log settled when the lease was taken");
    assert_eq!(st.node(n.id).unwrap().unwrap(), moved, "rolled back");
    drop(st);
    // A log whose epoch the store committed: dropped, the slot kept.
    std::fs::write(&undo, log(epoch)).unwrap();
    let mut st = highwater_osm::open_store(&cfg.store).unwrap();
    st.lease_writer(false).unwrap();
    assert!(!undo.exists());
    assert_eq!(st.node(n.id).unwrap().unwrap(), moved);
}
