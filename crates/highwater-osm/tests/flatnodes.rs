//! The flat node file (planet-scale node storage) with synthetic sparse
//! ids: locations at ids spread up to the planet's range (about 1.3e10)
//! read back exactly, ids never written read as absent, (0, 0) is a place
//! and not an absence, deletions forget, and the file stays sparse: its
//! logical size is set by the largest id, its disk use by the ids written.

use highwater_osm::flatnodes::{FlatNodes, FlatNodesError, NODE_ID_MAX};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;

#[derive(Clone, Debug)]
enum Op {
    Set(i64, i32, i32),
    Delete(i64),
}

/// Ids in clusters far apart, as the planet's are: a few low ones, some
/// around a billion, some near today's top.
fn id() -> impl Strategy<Value = i64> {
    prop_oneof![
        1i64..1_000,
        1_000_000_000i64..1_000_001_000,
        12_999_999_000i64..13_000_000_000,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (id(), -900_000_000i32..=900_000_000, -1_800_000_000i32..=1_800_000_000)
            .prop_map(|(i, a, b)| Op::Set(i, a, b)),
        1 => id().prop_map(Op::Delete),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn sparse_ids_read_back_as_a_map_would(ops in prop::collection::vec(op(), 1..200), probes in prop::collection::vec(id(), 20)) {
        let tmp = tempfile::tempdir().unwrap();
        let f = FlatNodes::open(&tmp.path().join("nodes.flat")).unwrap();
        let mut model: BTreeMap<i64, (i32, i32)> = BTreeMap::new();
        for op in &ops {
            match *op {
                Op::Set(i, a, b) => {
                    f.set(i, a, b).unwrap();
                    model.insert(i, (a, b));
                }
                Op::Delete(i) => {
                    f.delete(i).unwrap();
                    model.remove(&i);
                }
            }
        }
        for i in model.keys().chain(&probes) {
            prop_assert_eq!(f.get(*i).unwrap(), model.get(i).copied(), "id {}", i);
        }
        // Sparse: at most a few blocks per id written, whatever the largest.
        let m = std::fs::metadata(tmp.path().join("nodes.flat")).unwrap();
        prop_assert!(m.blocks() * 512 <= (ops.len() as u64 + 1) * 64 * 1024, "{} bytes on disk", m.blocks() * 512);
    }
}

#[test]
fn null_island_is_a_place_and_a_hole_is_not() {
    let tmp = tempfile::tempdir().unwrap();
    let f = FlatNodes::open(&tmp.path().join("n")).unwrap();
    f.set(5, 0, 0).unwrap();
    f.set(13_000_000_000, -900_000_000, 1_800_000_000).unwrap();
    assert_eq!(f.get(5).unwrap(), Some((0, 0)));
    assert_eq!(f.get(4).unwrap(), None, "a hole before a written id");
    assert_eq!(f.get(13_000_000_001).unwrap(), None, "past the end");
    assert_eq!(
        f.get(13_000_000_000).unwrap(),
        Some((-900_000_000, 1_800_000_000))
    );
    let m = std::fs::metadata(tmp.path().join("n")).unwrap();
    assert_eq!(m.len(), 13_000_000_001 * 8, "logical size: the largest id");
    assert!(
        m.blocks() * 512 < 1 << 20,
        "{} bytes on disk",
        m.blocks() * 512
    );
    f.sync().unwrap();
    // Reopened, the same.
    drop(f);
    let f = FlatNodes::open(&tmp.path().join("n")).unwrap();
    assert_eq!(f.get(5).unwrap(), Some((0, 0)));
}

#[test]
fn an_id_out_of_range_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let f = FlatNodes::open(&tmp.path().join("n")).unwrap();
    for id in [0, -3, NODE_ID_MAX + 1] {
        let e = f.set(id, 1, 1).unwrap_err();
        assert!(matches!(e, FlatNodesError::IdOutOfRange { .. }), "{e}");
        assert!(e.to_string().contains(&id.to_string()), "{e}");
    }
    assert_eq!(std::fs::metadata(tmp.path().join("n")).unwrap().len(), 0);
}
