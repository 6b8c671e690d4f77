//! Issue 9: a fuzz test on stable Rust. It mutates real inputs (Monaco's
//! daily diffs as `.osc` and `.osc.gz`, and its `.osm.pbf` extract) by
//! truncation, bit flips, splices, and repeated and reordered blocks, with a
//! fixed seed and a bounded count. Every case must end in a clear error with
//! the store untouched, or in a correct result: the store took the diff and
//! the tiles kept current by it equal a rebuild. A panic fails the test with
//! the case's seed.
//!
//! CI runs `HIGHWATER_FUZZ_CASES` cases per input kind (default 40). A
//! longer run, as README.md gives it:
//! `HIGHWATER_FUZZ_CASES=5000 HIGHWATER_FUZZ_SEED=7 cargo test --release -p highwater-osm --test fuzz`

use highwater_osm::ops::{self, OsmConfig};
use highwater_osm::store::{DrainOrder, Store};
use highwater_osm::tiles;
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::path::Path;

mod common;
use common::*;

use highwater_core::mutate::{mutate, Rng};

fn cases() -> usize {
    std::env::var("HIGHWATER_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40)
}

fn seed() -> u64 {
    std::env::var("HIGHWATER_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x9e37_79b9_7f4a_7c15)
}

/// Blocks moved by a mutation, at most: a few XML elements or PBF bytes.
const BLOCK_MAX_BYTES: usize = 4096;

/// What "untouched" compares: every element, the sequence and the
/// generation (which every applied write moves).
fn digest(store: &Store) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    store.export(|e| format!("{e:?}").hash(&mut h)).unwrap();
    store.meta("sequence").unwrap().hash(&mut h);
    store.generation().unwrap().hash(&mut h);
    h.finish()
}

fn config(dir: &Path) -> OsmConfig {
    let text = "[osm]\nstore = \"store\"\n[osm.tiles.t]\nzooms = \"13-14\"\nkeys = [\"building\", \"highway\", \"name\"]\nmbtiles = \"t.mbtiles\"\ndrain_rebuild_share = 1000\n";
    let v: toml::Value = toml::from_str(text).unwrap();
    OsmConfig::parse(v.get("osm"), &dir.join("highwater.toml"), dir).unwrap()
}

fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(b)
        .read_to_end(&mut out)
        .unwrap();
    out
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

/// The outcome of one mutated diff: refused with the store untouched, or
/// applied with the tiles equal to a rebuild.
fn check_diff(store: &mut Store, cfg: &OsmConfig, file: &Path, what: &str) -> bool {
    let before = digest(store);
    let applied =
        ops::read_diffs(&[file.to_path_buf()]).and_then(|d| ops::apply(store, cfg, &d, false));
    match applied {
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&*file.to_string_lossy()),
                "{what}: the error names no file: {msg}"
            );
            assert_eq!(
                digest(store),
                before,
                "{what}: refused, yet the store moved"
            );
            false
        }
        Ok(_) => {
            let d = cfg.of::<highwater_osm::tiles::TileDataset>()[0];
            tiles::drain(store, d, usize::MAX, DrainOrder::LowZoomFirst).unwrap();
            let v = tiles::verify(store, d, None).unwrap();
            assert!(
                v.differences.is_empty(),
                "{what}: accepted, but the tiles differ from a rebuild: {:?}",
                v.differences
            );
            true
        }
    }
}

fn fuzz_diffs(gz: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    let mut store = monaco(&tmp.path().join("store"));
    tiles::build(&mut store, cfg.of::<highwater_osm::tiles::TileDataset>()[0]).unwrap();
    let bases: Vec<Vec<u8>> = (48..56)
        .map(|s| std::fs::read(data(&format!("monaco-updates/000/003/0{s}.osc.gz"))).unwrap())
        .collect();
    let mut rng = Rng(seed() ^ u64::from(gz));
    let (mut refused, mut accepted) = (0, 0);
    for case in 0..cases() {
        let base = &bases[rng.below(bases.len())];
        let (bytes, how, name) = if gz {
            // Half the cases damage the compressed bytes (the CRC's job),
            // half the XML inside a sound gzip stream.
            if case % 2 == 0 {
                let (b, how) = mutate(&mut rng, base, BLOCK_MAX_BYTES);
                (b, how, "case.osc.gz")
            } else {
                let (b, how) = mutate(&mut rng, &gunzip(base), BLOCK_MAX_BYTES);
                (gzip(&b), how, "case.osc.gz")
            }
        } else {
            let (b, how) = mutate(&mut rng, &gunzip(base), BLOCK_MAX_BYTES);
            (b, how, "case.osc")
        };
        let file = tmp.path().join(name);
        std::fs::write(&file, &bytes).unwrap();
        let what = format!("case {case} ({how}, seed {})", seed());
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            check_diff(&mut store, &cfg, &file, &what)
        }));
        match ok {
            Ok(true) => accepted += 1,
            Ok(false) => refused += 1,
            Err(p) => std::panic::resume_unwind(p),
        }
    }
    eprintln!(
        "{} diffs: {refused} refused, {accepted} applied",
        if gz { ".osc.gz" } else { ".osc" }
    );
    assert_eq!(refused + accepted, cases());
}

#[test]
fn fuzz_osc() {
    fuzz_diffs(false);
}

#[test]
fn fuzz_osc_gz() {
    fuzz_diffs(true);
}

#[test]
fn fuzz_pbf() {
    let base = std::fs::read(data("monaco-3047-20210801.osm.pbf")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = Rng(seed() ^ 2);
    let n = cases().div_ceil(4).max(1);
    let (mut refused, mut accepted) = (0, 0);
    for case in 0..n {
        let (bytes, how) = mutate(&mut rng, &base, BLOCK_MAX_BYTES);
        let file = tmp.path().join(format!("case{case}.osm.pbf"));
        std::fs::write(&file, &bytes).unwrap();
        let dir = tmp.path().join(format!("store{case}"));
        let what = format!("case {case} ({how}, seed {})", seed());
        match highwater_osm::import::import_into(
            &dir,
            &file,
            false,
            false,
            &highwater_osm::store_extension(),
        ) {
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    msg.contains(&*file.to_string_lossy()),
                    "{what}: the error names no file: {msg}"
                );
                // Untouched: whatever exists holds no element.
                if dir.join("store.db").exists() {
                    let s = highwater_osm::open_store(&dir).unwrap();
                    assert!(s.is_empty().unwrap(), "{what}: refused, yet data landed");
                }
                refused += 1;
            }
            Ok(stats) => {
                let s = highwater_osm::open_store(&dir).unwrap();
                let mut count = 0u64;
                s.export(|_| count += 1).unwrap();
                assert_eq!(count, stats.nodes + stats.ways + stats.relations, "{what}");
                assert!(count > 0, "{what}");
                accepted += 1;
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_file(&file);
    }
    eprintln!(".osm.pbf: {refused} refused, {accepted} imported");
}
