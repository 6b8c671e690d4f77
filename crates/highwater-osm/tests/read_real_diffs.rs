//! The real Monaco replication diffs parse, with their sequence numbers.

use highwater_osm::read_changes;
use std::path::Path;

#[test]
fn monaco_3047_to_3076_parse() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/monaco-updates/000/003");
    let mut total = 0;
    for seq in 47..=76 {
        let changes =
            read_changes(&dir.join(format!("{seq:03}.osc.gz"))).unwrap_or_else(|e| panic!("{e}"));
        total += changes.len();
        let state = std::fs::read_to_string(dir.join(format!("{seq:03}.state.txt"))).unwrap();
        assert!(
            state.contains(&format!("sequenceNumber=3{seq:03}")),
            "{state}"
        );
    }
    // The shared data's SOURCE.md counts 28 object changes over the month.
    assert_eq!(total, 28);
}
