//! The OSM store's writer lease (issue 9): one writer per store, fenced.
//! A second writer is refused naming the holder; a holder whose lease was
//! taken over (it paused past its expiry) writes nothing more; a dirty row
//! written after a rebuild's read survives the rebuild's clearing.

use highwater_core::tile::Tile;
use highwater_osm::store::{StoreError, WRITER_LEASE};
use std::collections::BTreeSet;

mod common;
use common::*;

/// What a holder paused past its lease (SIGSTOP) looks like to the others:
/// its lease's expiry has passed.
fn pause_past_expiry(dir: &std::path::Path) {
    rusqlite::Connection::open(dir.join("store.db"))
        .unwrap()
        .execute(
            "UPDATE leases SET expires_at_ns = 1 WHERE name = ?1",
            [WRITER_LEASE],
        )
        .unwrap();
}

#[test]
fn a_second_writer_is_refused_naming_the_holder() {
    let tmp = tempfile::tempdir().unwrap();
    let mut a = monaco(&tmp.path().join("s"));
    a.lease_writer(false).unwrap();
    let mut b = highwater_osm::open_store(&tmp.path().join("s")).unwrap();
    match b.write(|w| w.set_meta("x", "1")) {
        Err(StoreError::Held { pid, .. }) => assert_eq!(pid, std::process::id() as i64),
        other => panic!("{other:?}"),
    }
    a.write(|w| w.set_meta("x", "a")).unwrap();
    drop(a);
    // Released on drop: the next writer takes it with a larger token.
    b.write(|w| w.set_meta("x", "b")).unwrap();
    assert_eq!(b.meta("x").unwrap().as_deref(), Some("b"));
}

#[test]
fn a_holder_whose_lease_was_taken_over_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    let mut a = monaco(&dir);
    a.lease_writer(false).unwrap();
    a.write(|w| w.set_meta("x", "a")).unwrap();
    let token_a = a.writer_lease().unwrap().unwrap().token;
    pause_past_expiry(&dir);
    let mut b = highwater_osm::open_store(&dir).unwrap();
    b.write(|w| w.set_meta("x", "b")).unwrap();
    // A wakes up: fenced, and nothing it writes lands.
    match a.write(|w| w.set_meta("x", "late")) {
        Err(StoreError::Fenced { .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(b.meta("x").unwrap().as_deref(), Some("b"));
    let lease = b.writer_lease().unwrap().unwrap();
    assert_eq!(lease.token, token_a + 1, "the takeover raised the token");
}

#[test]
fn dirty_rows_newer_than_a_rebuilds_read_survive_it() {
    let tmp = tempfile::tempdir().unwrap();
    let mut s = monaco(&tmp.path().join("s"));
    let t = |x| Tile { z: 14, x, y: 5000 };
    s.write(|w| {
        w.bump_generation()?;
        w.add_dirty("d", &BTreeSet::from([t(1)]))
    })
    .unwrap();
    let read_at = s.generation().unwrap();
    // A diff lands after the rebuild read the store.
    s.write(|w| {
        w.bump_generation()?;
        w.add_dirty("d", &BTreeSet::from([t(1), t(2)]))
    })
    .unwrap();
    s.write(|w| w.clear_dirty("d", read_at)).unwrap();
    let left = s
        .dirty_tiles("d", highwater_osm::store::DrainOrder::LowZoomFirst, 10)
        .unwrap();
    assert_eq!(
        left,
        vec![t(1), t(2)],
        "both were dirtied again after the read"
    );
    s.write(|w| w.clean("d", &[t(1)], read_at + 1)).unwrap();
    let left = s
        .dirty_tiles("d", highwater_osm::store::DrainOrder::LowZoomFirst, 10)
        .unwrap();
    assert_eq!(left, vec![t(2)]);
}

/// The MBTiles file is fenced too: after a takeover, the old holder's
/// drain and build write nothing into it and swap nothing in.
#[test]
fn a_holder_that_lost_its_lease_writes_no_tile() {
    use highwater_osm::ops::OsmConfig;
    use highwater_osm::tiles::{self, Mbtiles, TilesError};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    let text = "[osm]\nstore = \"s\"\n[osm.tiles.t]\nzooms = \"13-14\"\nkeys = [\"building\"]\nmbtiles = \"t.mbtiles\"\ndrain_rebuild_share = 1000\n";
    let v: toml::Value = toml::from_str(text).unwrap();
    let cfg = OsmConfig::parse(v.get("osm"), &tmp.path().join("h.toml"), tmp.path()).unwrap();
    let d = cfg.of::<highwater_osm::tiles::TileDataset>()[0];
    let mut a = monaco(&dir);
    tiles::build(&mut a, d).unwrap();
    pause_past_expiry(&dir);
    let mut b = highwater_osm::open_store(&dir).unwrap();
    tiles::build(&mut b, d).unwrap();
    let file = d.mbtiles.as_ref().unwrap();
    let before: Vec<_> = Mbtiles::open(file).unwrap().unwrap().tiles().unwrap();
    let some = before[0];
    b.write(|w| {
        w.bump_generation()?;
        w.add_dirty("t", &BTreeSet::from([some]))
    })
    .unwrap();
    match tiles::drain(
        &mut a,
        d,
        usize::MAX,
        highwater_osm::store::DrainOrder::LowZoomFirst,
    ) {
        Err(TilesError::Fenced { .. }) => {}
        other => panic!("{other:?}"),
    }
    match tiles::build(&mut a, d) {
        Err(TilesError::Store(StoreError::Fenced { .. })) => {}
        other => panic!("{other:?}"),
    }
    // B, the holder, drains as usual; the tile stays dirty until it does.
    assert_eq!(b.dirty_count("t").unwrap(), 1);
    tiles::drain(
        &mut b,
        d,
        usize::MAX,
        highwater_osm::store::DrainOrder::LowZoomFirst,
    )
    .unwrap();
    assert_eq!(b.dirty_count("t").unwrap(), 0);
    assert!(tiles::verify(&b, d, None).unwrap().differences.is_empty());
}

/// A store just published by `osm import` is opened by several processes
/// at once (a `replicate --loop` and a `status`, say): every open succeeds.
/// The store is published in WAL mode, so none of them has to switch the
/// file's journal mode, the one step SQLite refuses at once, without
/// waiting, when another connection is doing the same (the
/// `replication_http` loop test failed on it now and then).
#[test]
fn a_freshly_imported_store_opens_from_many_readers_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    let pbf = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/monaco-3047-20210801.osm.pbf");
    highwater_osm::import::import_into(&dir, &pbf, false, false, &highwater_osm::store_extension())
        .unwrap();
    let header = std::fs::read(dir.join("store.db")).unwrap();
    // Bytes 18 and 19 of an SQLite file: 2 is WAL, 1 a rollback journal.
    assert_eq!((header[18], header[19]), (2, 2));
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(6));
    let opens: Vec<_> = (0..6)
        .map(|_| {
            let (dir, barrier) = (dir.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let st = highwater_osm::open_store(&dir).map_err(|e| e.to_string())?;
                st.meta("sequence").map_err(|e| e.to_string())
            })
        })
        .collect();
    for o in opens {
        assert_eq!(o.join().unwrap().unwrap().as_deref(), Some("3047"));
    }
}

/// A store made beside the writer (the drains after an apply, each on a
/// thread of its own) writes under the writer's lease, and nothing once
/// that lease is taken over or given back.
#[test]
fn a_store_beside_the_writer_writes_under_its_lease_and_no_longer() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    let mut a = monaco(&dir);
    a.lease_writer(false).unwrap();
    let mut beside = a.beside().unwrap();
    assert_eq!(beside.writer_token(), a.writer_token());
    // From another thread, while the writer keeps writing: SQLite
    // serialises the two's transactions.
    std::thread::scope(|s| {
        let t = s.spawn(|| {
            for i in 0..20 {
                beside
                    .write(|w| w.set_meta("beside", &i.to_string()))
                    .unwrap();
            }
        });
        for i in 0..20 {
            a.write(|w| w.set_meta("writer", &i.to_string())).unwrap();
        }
        t.join().unwrap();
    });
    assert_eq!(a.meta("beside").unwrap().as_deref(), Some("19"));
    assert_eq!(beside.meta("writer").unwrap().as_deref(), Some("19"));
    // Taken over: the store beside is fenced with its writer.
    pause_past_expiry(&dir);
    let mut b = highwater_osm::open_store(&dir).unwrap();
    b.write(|w| w.set_meta("x", "b")).unwrap();
    match beside.write(|w| w.set_meta("x", "late")) {
        Err(StoreError::Fenced { .. }) => {}
        other => panic!("{other:?}"),
    }
    drop(b);
    // Given back (the writer dropped): still nothing, and dropping the
    // store beside gives back nothing of its own.
    let mut a2 = highwater_osm::open_store(&dir).unwrap();
    a2.lease_writer(false).unwrap();
    let mut beside2 = a2.beside().unwrap();
    drop(a2);
    match beside2.write(|w| w.set_meta("x", "after")) {
        Err(StoreError::Fenced { .. }) => {}
        other => panic!("{other:?}"),
    }
    drop(beside2);
    let c = highwater_osm::open_store(&dir).unwrap();
    assert_eq!(c.meta("x").unwrap().as_deref(), Some("b"));
}

/// A commit that leaves the write-ahead log past
/// `CHECKPOINT_WAL_BYTES` is folded into the store file by a checkpoint
/// beside the writer (its own commits never checkpoint), while the
/// store stays open; what it committed reads back from a fresh
/// connection, and the next writes go on.
#[test]
fn a_large_commit_is_folded_into_the_file_beside_the_writer() {
    use highwater_osm::store::CHECKPOINT_WAL_BYTES;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    let mut a = monaco(&dir);
    a.checkpoint().unwrap();
    let db = dir.join("store.db");
    let before = std::fs::metadata(&db).unwrap().len();
    // Incompressible text, past the threshold.
    let mut x: u64 = 1;
    let big: String = (0..CHECKPOINT_WAL_BYTES as usize + (1 << 20))
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            char::from(b'a' + (x >> 59) as u8)
        })
        .collect();
    a.write(|w| w.set_meta("big", &big)).unwrap();
    // A write while the checkpoint may still run.
    a.write(|w| w.set_meta("small", "1")).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::fs::metadata(&db).unwrap().len() < before + CHECKPOINT_WAL_BYTES {
        assert!(
            std::time::Instant::now() < deadline,
            "the store file did not grow by the commit: no checkpoint folded it"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let fresh = rusqlite::Connection::open(&db).unwrap();
    let got: String = fresh
        .query_row("SELECT value FROM meta WHERE key = 'big'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(got, big);
    drop(fresh);
    a.write(|w| w.set_meta("small", "2")).unwrap();
    drop(a);
    let c = highwater_osm::open_store(&dir).unwrap();
    assert_eq!(c.meta("small").unwrap().as_deref(), Some("2"));
    assert_eq!(c.meta("big").unwrap().map(|v| v.len()), Some(big.len()));
}
