//! The S3 client against a real S3-compatible server (moto on loopback).
//! Before anything relies on the emulator's conditional writes, they are
//! raced here.

use highwater_objects::testing::Moto;
use highwater_objects::{Objects, Put};
use std::sync::{Arc, Barrier};

fn open(m: &Moto, bucket: &str) -> Objects {
    m.client(bucket)
}

#[test]
fn of_two_racing_conditional_puts_exactly_one_wins() {
    let m = Moto::start();
    let o = Arc::new(open(&m, "race"));
    for round in 0..50 {
        let key = format!("m/{round}/_manifest.json");
        // First publication: both create.
        let b = Arc::new(Barrier::new(2));
        let results: Vec<Put> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|i| {
                    let (o, b, key) = (o.clone(), b.clone(), key.clone());
                    s.spawn(move || {
                        b.wait();
                        o.put_if(&key, format!("v1 by {i}").into_bytes(), None)
                            .unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let won: Vec<&Put> = results
            .iter()
            .filter(|r| matches!(r, Put::Done(_)))
            .collect();
        assert_eq!(won.len(), 1, "round {round}: {results:?}");
        let Put::Done(etag) = won[0].clone() else {
            unreachable!()
        };
        // Next publication: both update from the same ETag.
        let results: Vec<Put> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|i| {
                    let (o, b, key, etag) = (o.clone(), b.clone(), key.clone(), etag.clone());
                    s.spawn(move || {
                        b.wait();
                        o.put_if(&key, format!("v2 by {i}").into_bytes(), Some(&etag))
                            .unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let won = results.iter().filter(|r| matches!(r, Put::Done(_))).count();
        assert_eq!(won, 1, "round {round}: {results:?}");
        let (body, _) = o.get(&key).unwrap().unwrap();
        assert!(body.starts_with(b"v2 by "), "{body:?}");
    }
}

#[test]
fn files_round_trip_small_and_multipart_and_list_with_etags() {
    let m = Moto::start();
    let o = open(&m, "files");
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("small");
    std::fs::write(&small, b"hello").unwrap();
    let big = dir.path().join("big");
    let data: Vec<u8> = (0..(20u32 << 20)).map(|i| (i % 251) as u8).collect();
    std::fs::write(&big, &data).unwrap();
    let e1 = o.put_file(&small, "in/a.txt").unwrap();
    let e2 = o.put_file(&big, "in/sub/b.bin").unwrap();
    assert!(e2.contains('-'), "a multipart ETag: {e2}");
    let listed = o.list("in").unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|i| (i.key.as_str(), i.size, i.etag.as_str()))
            .collect::<Vec<_>>(),
        vec![
            ("in/a.txt", 5, e1.as_str()),
            ("in/sub/b.bin", data.len() as u64, e2.as_str())
        ]
    );
    let back = dir.path().join("back");
    assert_eq!(o.get_to("in/sub/b.bin", &back).unwrap(), e2);
    assert_eq!(std::fs::read(&back).unwrap(), data);
    // Same size, other bytes: another ETag.
    std::fs::write(&small, b"HELLO").unwrap();
    let e3 = o.put_file(&small, "in/a.txt").unwrap();
    assert_ne!(e1, e3);
    o.delete("in/a.txt").unwrap();
    o.delete("in/a.txt").unwrap();
    assert_eq!(o.list("in").unwrap().len(), 1);
    assert_eq!(o.get("in/a.txt").unwrap(), None);
}
