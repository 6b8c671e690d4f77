//! A store made again (issue 20, item 8): `osm import --replace`, or a
//! fresh import where the store was deleted, beside an MBTiles file that an
//! older store's writers fenced with their lease token. The new store's
//! writers continue the token sequence, so the file never refuses them:
//! neither the next `osm rebuild` nor the first `osm replicate`.

mod common;
use common::osm::*;
use common::*;

const CONFIG: &str = r#"
[osm]
store = ".highwater/osm"

[osm.tiles.base]
zooms = "12-13"
keys = ["building", "highway"]
mbtiles = "base.mbtiles"
drain_rebuild_share = 1000
"#;

fn pbf() -> String {
    data()
        .join("monaco-3047-20210801.osm.pbf")
        .to_str()
        .unwrap()
        .to_string()
}

/// The writer token the MBTiles file records.
fn file_token(p: &Project) -> i64 {
    rusqlite::Connection::open(p.path("base.mbtiles"))
        .unwrap()
        .query_row(
            "SELECT value FROM metadata WHERE name = 'highwater_writer_token'",
            [],
            |r| r.get::<_, String>(0),
        )
        .unwrap()
        .parse()
        .unwrap()
}

/// How the store is made again, after the file reached a token above 1.
#[derive(Debug, Clone, Copy)]
enum Remake {
    /// `osm import --replace` over the old store.
    Replace,
    /// The store folder deleted, then a first import into the empty place.
    DeleteThenImport,
}

/// What runs first on the new store (then a rebuild); each must exit 0
/// and write the file.
#[derive(Debug, Clone, Copy)]
enum Then {
    Rebuild,
    Replicate,
}

/// Imports, rebuilds the tiles `rebuilds` times (each a new writer, so a
/// larger token), makes the store again, runs `then` and a rebuild: each
/// exits 0 and the file's token grows past the old store's.
fn check(remake: Remake, then: Then, rebuilds: usize) {
    let p = Project::new(CONFIG);
    p.check(&["osm", "import", &pbf()], 0);
    for _ in 0..rebuilds {
        p.check(&["osm", "rebuild", "base"], 0);
    }
    let before = file_token(&p);
    assert!(before >= rebuilds as i64, "{remake:?}: token {before}");
    match remake {
        Remake::Replace => {
            p.check(&["osm", "import", &pbf(), "--replace"], 0);
        }
        Remake::DeleteThenImport => {
            std::fs::remove_dir_all(p.path(".highwater/osm")).unwrap();
            p.check(&["osm", "import", &pbf()], 0);
        }
    }
    let from = data().join("monaco-updates");
    let mut last = before;
    for round in 0..2 {
        let r = match (then, round) {
            (Then::Replicate, 0) => p.hw(&["osm", "replicate", "--from", from.to_str().unwrap()]),
            _ => p.hw(&["osm", "rebuild", "base"]),
        };
        assert_eq!(
            r.code, 0,
            "{remake:?} then {then:?}, round {round}: exit {}\nstdout:\n{}\nstderr:\n{}",
            r.code, r.stdout, r.stderr
        );
        assert!(!r.stderr.contains("a newer writer"), "{}", r.stderr);
        let now = file_token(&p);
        assert!(
            now > last,
            "{remake:?} then {then:?}, round {round}: the file's token {now} did not pass {last}"
        );
        last = now;
    }
    let s = p.check(&["osm", "status", "--json"], 0).json();
    if let Then::Replicate = then {
        assert_eq!(s["sequence"], 3076, "{s}");
        assert_eq!(s["datasets"][0]["marker"], 3076, "{s}");
    }
    assert_eq!(s["datasets"][0]["dirty"], 0, "{s}");
    p.check(&["osm", "verify", "base", "--all"], 0);
}

#[test]
fn a_replaced_store_continues_the_writer_tokens_for_rebuilds() {
    check(Remake::Replace, Then::Rebuild, 4);
}

#[test]
fn a_replaced_store_continues_the_writer_tokens_for_its_first_replicate() {
    check(Remake::Replace, Then::Replicate, 3);
}

#[test]
fn a_store_imported_again_after_deletion_continues_past_the_files_token() {
    check(Remake::DeleteThenImport, Then::Rebuild, 3);
}

/// A replace killed after it retired the old store and before it swapped
/// the new one in: the old store, still in place, refuses writers naming
/// the fix (not "run it again", which would never succeed), and the next
/// `osm import --replace` completes.
#[test]
fn a_replace_killed_before_its_swap_is_named_and_the_next_replace_completes() {
    let p = Project::new(CONFIG);
    p.check(&["osm", "import", &pbf()], 0);
    p.check(&["osm", "rebuild", "base"], 0);
    p.killed_at(&["osm", "import", "--replace", &pbf()], "import-kill-swap");
    let r = p.hw(&["osm", "rebuild", "base"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("died before it swapped") && r.stderr.contains("osm import --replace"),
        "{}",
        r.stderr
    );
    p.check(&["osm", "import", "--replace", &pbf()], 0);
    p.check(&["osm", "rebuild", "base"], 0);
    p.check(&["osm", "verify", "base", "--all"], 0);
}
