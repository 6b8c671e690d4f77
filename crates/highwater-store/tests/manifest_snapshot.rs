//! The manifest snapshot (issue 22: a no-change plan reads one stage's
//! manifest from one file instead of a SQLite row per item). A snapshot is a
//! cache: whatever was written, by us or by hand, and whatever happened to
//! the file, a load must equal a load from the rows.

use highwater_core::evidence::Digest;
use highwater_core::{Entry, EntryKind, Stat, Status};
use highwater_store::{snapshot, Batch, DirRecord, SqliteStore, StateStore};
use proptest::prelude::*;
use std::path::Path;

fn entry(kind: EntryKind, item: &str, v: u8) -> Entry {
    Entry {
        kind,
        item: item.to_string(),
        digest: (!v.is_multiple_of(3))
            .then(|| Digest::parse(&format!("b3:{}", format!("{v:02x}").repeat(32))).unwrap()),
        stat: Stat {
            size: v as u64,
            mtime_ns: 1_700_000_000_000_000_000 + v as i64,
            ctime_ns: -(v as i64),
            ino: u64::MAX - v as u64,
            dev: 7,
        },
        observed_at_ns: 99,
        recipe: format!("r1:{v}"),
        output: format!("out/{item}"),
        status: if v.is_multiple_of(5) {
            Status::Failed
        } else {
            Status::Ok
        },
        error: v.is_multiple_of(5).then(|| format!("failed: exit {v} ✗\n")),
        processed_at_ns: 100,
        duration_ms: v as u64,
    }
}

fn folder(name: &str, v: u8) -> DirRecord {
    DirRecord {
        dir: name.to_string(),
        mtime_ns: v as i64,
        ctime_ns: v as i64 + 1,
        ino: v as u64,
        observed_at_ns: 5,
    }
}

/// One write to the state, as any writer could make it.
#[derive(Clone, Debug)]
enum Op {
    Upsert {
        stage: u8,
        item: u8,
        v: u8,
        member: bool,
    },
    Delete {
        stage: u8,
        item: u8,
    },
    Dirs {
        stage: u8,
        n: u8,
        v: u8,
    },
    Deps {
        stage: u8,
        item: u8,
        set: Option<u8>,
    },
    /// A writer that is not this crate's `commit`: plain SQL on the file.
    RawUpdate {
        stage: u8,
    },
    RawSetBody {
        set: u8,
    },
    /// A stored set removed under the items that name it: the rows are
    /// corrupt, and a load must say so, not answer from the snapshot.
    RawDeleteSet {
        set: u8,
    },
    /// A load, which may write the snapshot.
    Load {
        stage: u8,
    },
}

const STAGES: [&str; 2] = ["tidy", "st/ü \"2\""];

fn apply(s: &mut SqliteStore, db: &Path, op: &Op) {
    let st = |i: &u8| STAGES[*i as usize % 2].to_string();
    let name = |i: &u8| format!("data/f{i}.txt");
    let mut b = Batch::default();
    match op {
        Op::Upsert {
            stage,
            item,
            v,
            member,
        } => {
            let kind = if *member {
                EntryKind::Member
            } else {
                EntryKind::Item
            };
            b.upserts.push((st(stage), entry(kind, &name(item), *v)));
        }
        Op::Delete { stage, item } => {
            b.deletes.push((st(stage), EntryKind::Item, name(item)));
        }
        Op::Dirs { stage, n, v } => {
            let dirs = (0..*n).map(|i| folder(&format!("out/d{i}"), *v)).collect();
            b.dirs.push((st(stage), dirs));
        }
        Op::Deps { stage, item, set } => {
            let id = set.map(|n| format!("set{n}"));
            if let Some(id) = &id {
                b.dep_sets.push((id.clone(), format!("[\"{id}\"]")));
            }
            b.deps.push((st(stage), name(item), id));
        }
        Op::RawUpdate { stage } => {
            let c = rusqlite::Connection::open(db).unwrap();
            c.execute(
                "UPDATE entries SET size = size + 1, recipe = recipe || 'x' WHERE stage = ?1",
                [st(stage)],
            )
            .unwrap();
        }
        Op::RawSetBody { set } => {
            let c = rusqlite::Connection::open(db).unwrap();
            c.execute(
                "UPDATE dep_sets SET body = body || ' ' WHERE id = ?1",
                [format!("set{set}")],
            )
            .unwrap();
        }
        Op::RawDeleteSet { set } => {
            let c = rusqlite::Connection::open(db).unwrap();
            c.execute("DELETE FROM dep_sets WHERE id = ?1", [format!("set{set}")])
                .unwrap();
        }
        Op::Load { stage } => {
            let _ = s.load(&st(stage));
        }
    }
    if !b.is_empty() {
        s.commit(&b).unwrap();
    }
}

/// After `ops`, each stage loads (twice: the second from the snapshot the
/// first left) exactly as its rows say.
fn check(ops: &[Op]) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let mut s = SqliteStore::open(&db).unwrap();
    for op in ops {
        apply(&mut s, &db, op);
        for stage in STAGES {
            // Taken before the loads: a snapshot read later, off the
            // connection, is the rows' or nothing (issue 49).
            let later = s.snapshot_later(stage).unwrap();
            for again in [false, true] {
                match (s.load(stage), s.load_rows(stage)) {
                    (Ok(a), Ok(b)) => assert_eq!(a, b, "after {op:?}, stage {stage}, {again}"),
                    (Err(_), Err(_)) => {}
                    (a, b) => panic!("after {op:?}, stage {stage}: {a:?} against the rows' {b:?}"),
                }
            }
            if let Some(entries) = later.and_then(|l| l.read()) {
                assert_eq!(Ok(entries), s.load_rows(stage).map_err(|e| e.to_string()));
            }
        }
    }
}

fn op() -> impl Strategy<Value = Op> {
    let small = 0u8..4;
    prop_oneof![
        (0u8..2, small.clone(), any::<u8>(), any::<bool>()).prop_map(|(stage, item, v, member)| {
            Op::Upsert {
                stage,
                item,
                v,
                member,
            }
        }),
        (0u8..2, small.clone()).prop_map(|(stage, item)| Op::Delete { stage, item }),
        (0u8..2, 0u8..3, any::<u8>()).prop_map(|(stage, n, v)| Op::Dirs { stage, n, v }),
        (0u8..2, small.clone(), proptest::option::of(0u8..3))
            .prop_map(|(stage, item, set)| Op::Deps { stage, item, set }),
        (0u8..2).prop_map(|stage| Op::RawUpdate { stage }),
        (0u8..3).prop_map(|set| Op::RawSetBody { set }),
        (0u8..3).prop_map(|set| Op::RawDeleteSet { set }),
        (0u8..2).prop_map(|stage| Op::Load { stage }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn a_load_always_equals_the_rows(ops in proptest::collection::vec(op(), 1..24)) {
        check(&ops);
    }
}

#[test]
fn every_kind_of_write_is_seen() {
    use Op::*;
    check(&[
        Upsert {
            stage: 0,
            item: 1,
            v: 1,
            member: false,
        },
        Upsert {
            stage: 0,
            item: 2,
            v: 5,
            member: false,
        },
        Upsert {
            stage: 0,
            item: 1,
            v: 2,
            member: true,
        },
        Deps {
            stage: 0,
            item: 1,
            set: Some(1),
        },
        Dirs {
            stage: 0,
            n: 2,
            v: 3,
        },
        Upsert {
            stage: 0,
            item: 1,
            v: 3,
            member: false,
        },
        RawUpdate { stage: 0 },
        RawSetBody { set: 1 },
        Load { stage: 0 },
        RawDeleteSet { set: 1 },
        Dirs {
            stage: 0,
            n: 1,
            v: 4,
        },
        Deps {
            stage: 0,
            item: 1,
            set: None,
        },
        Delete { stage: 0, item: 2 },
        Upsert {
            stage: 1,
            item: 0,
            v: 9,
            member: false,
        },
        Delete { stage: 0, item: 1 },
    ]);
}

fn store_with_a_stage(db: &Path) -> SqliteStore {
    let mut s = SqliteStore::open(db).unwrap();
    let mut b = Batch::default();
    for i in 0..50u8 {
        b.upserts.push((
            "tidy".into(),
            entry(EntryKind::Item, &format!("f{i:02}"), i),
        ));
    }
    b.dirs.push(("tidy".into(), vec![folder("out", 1)]));
    s.commit(&b).unwrap();
    s
}

fn token(db: &Path, stage: &str) -> i64 {
    rusqlite::Connection::open(db)
        .unwrap()
        .query_row(
            "SELECT token FROM manifest_tokens WHERE stage = ?1",
            [stage],
            |r| r.get(0),
        )
        .unwrap()
}

/// The snapshot at the stage's token is what a load returns (so the fast
/// path is taken), and from the next write on it is not.
#[test]
fn a_snapshot_is_used_only_at_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let mut s = store_with_a_stage(&db);
    let rows = s.load("tidy").unwrap();
    let path = snapshot::path_for(&db, "tidy");
    assert!(path.exists(), "a load from the rows leaves a snapshot");
    // Read later, off the connection, it is the same (issue 49)...
    let later = s.snapshot_later("tidy").unwrap().expect("a token");
    assert_eq!(later.read(), Some(rows.clone()));
    // A different manifest written at the current token is believed...
    let mut other = rows.clone();
    other.dirs.clear();
    snapshot::write(&path, token(&db, "tidy"), "tidy", &other).unwrap();
    assert_eq!(s.load("tidy").unwrap(), other);
    // ...until any write to the stage renews the token.
    let mut b = Batch::default();
    b.upserts
        .push(("tidy".into(), entry(EntryKind::Item, "f00", 0)));
    s.commit(&b).unwrap();
    assert_eq!(s.load("tidy").unwrap(), s.load_rows("tidy").unwrap());
    assert_eq!(s.load("tidy").unwrap().dirs, rows.dirs);
    // ...and one taken before the write reads nothing after it.
    assert_eq!(later.read(), None);
}

/// Whatever is in the file, a load equals the rows: junk of every kind, a
/// torn write, another stage's snapshot, and a store restored from a backup
/// older than the snapshot.
#[test]
fn a_snapshot_that_is_not_whole_and_current_is_never_used() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let s = store_with_a_stage(&db);
    let path = snapshot::path_for(&db, "tidy");
    s.load("tidy").unwrap();
    let good = std::fs::read(&path).unwrap();
    let rows = s.load_rows("tidy").unwrap();
    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 0x10;
    let mut other_stage = s.load_rows("tidy").unwrap();
    other_stage.items = Default::default();
    let junk: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("torn", good[..good.len() / 3].to_vec()),
        ("one byte short", good[..good.len() - 1].to_vec()),
        ("one bit flipped", flipped),
        (
            "text",
            b"not a snapshot at all, but long enough to have a tail".to_vec(),
        ),
        (
            "another stage's",
            snapshot::encode(token(&db, "tidy"), "other", &other_stage),
        ),
        (
            "another token's",
            snapshot::encode(token(&db, "tidy") ^ 1, "tidy", &other_stage),
        ),
    ];
    for (what, bytes) in junk {
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(s.load("tidy").unwrap(), rows, "{what}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            good,
            "{what}: rewritten whole"
        );
    }
    // A folder where the file should be: loads still work.
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    assert_eq!(s.load("tidy").unwrap(), rows);
    std::fs::remove_dir(&path).unwrap();

    // A backup taken now; then the stage changes and is snapshotted; then
    // the backup is put back. The snapshot is of a state the store no
    // longer holds.
    drop(s);
    let backup = dir.path().join("backup.db");
    {
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute("VACUUM INTO ?1", [backup.to_str().unwrap()])
            .unwrap();
    }
    let mut s = SqliteStore::open(&db).unwrap();
    let mut b = Batch::default();
    b.deletes
        .push(("tidy".into(), EntryKind::Item, "f07".into()));
    s.commit(&b).unwrap();
    let after = s.load("tidy").unwrap();
    assert_eq!(after.items.len(), 49);
    drop(s);
    for f in ["state.db-wal", "state.db-shm"] {
        let _ = std::fs::remove_file(dir.path().join(f));
    }
    std::fs::copy(&backup, &db).unwrap();
    let s = SqliteStore::open(&db).unwrap();
    assert_eq!(
        s.load("tidy").unwrap(),
        rows,
        "the restored state, not the snapshot"
    );
}

/// A store written by the highwater before snapshots (schema 6) gets
/// tokens for its stages on upgrade and loads the same.
#[test]
fn an_upgraded_store_loads_the_same_and_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let mut old = SqliteStore::open_at(&db, 6).unwrap();
    let mut b = Batch::default();
    b.upserts
        .push(("tidy".into(), entry(EntryKind::Item, "a", 1)));
    b.dirs.push(("only-dirs".into(), vec![folder("out", 1)]));
    old.commit(&b).unwrap();
    let before = old.load_rows("tidy").unwrap();
    drop(old);
    let s = SqliteStore::open(&db).unwrap();
    assert_eq!(s.load("tidy").unwrap(), before);
    assert!(snapshot::path_for(&db, "tidy").exists());
    assert_eq!(s.load("tidy").unwrap(), before);
    token(&db, "only-dirs");
}

/// The end of a run that changed its stage leaves the stage's snapshot
/// current, so the plan after a run does not load the rows; a run that
/// changed nothing leaves the file as it was.
#[test]
fn a_run_leaves_its_stage_snapshotted() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let mut s = store_with_a_stage(&db);
    let path = snapshot::path_for(&db, "tidy");
    let run = s.begin_run("tidy", 1).unwrap();
    let mut b = Batch::default();
    b.upserts
        .push(("tidy".into(), entry(EntryKind::Item, "new", 1)));
    s.commit(&b).unwrap();
    assert!(!snapshot::is_current(&path, token(&db, "tidy"), "tidy"));
    s.finish_run(run, 2, &serde_json::json!({}), 0).unwrap();
    assert!(snapshot::is_current(&path, token(&db, "tidy"), "tidy"));
    assert_eq!(
        snapshot::read(&path, token(&db, "tidy"), "tidy").unwrap(),
        s.load_rows("tidy").unwrap()
    );
    let written = std::fs::metadata(&path).unwrap().modified().unwrap();
    let run = s.begin_run("tidy", 3).unwrap();
    s.finish_run(run, 4, &serde_json::json!({}), 0).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().modified().unwrap(),
        written
    );
}
