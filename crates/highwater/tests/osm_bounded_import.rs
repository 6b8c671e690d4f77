//! Issue 25: an import of a planet-like synthetic extract (ids in runs up
//! to 13 billion, beyond 2^33) in bounded memory equals `osmium cat`
//! element by element; a SIGKILL in the middle of one leaves nothing the
//! next import trips on; an unsorted extract is still imported (in memory).

mod common;
use common::osm::*;
use common::*;
use std::path::Path;
use std::process::Command;

/// The smallest cache an import takes: its reference budget (8 MiB, about
/// 520k references) then forces sorted runs on disk for this world.
const CONFIG: &str = r#"
[osm]
store = ".highwater/osm"
cache_mb = 32
"#;

/// 170 cities: about 590k nodes, 68k ways, 700k way references.
const CITIES: u64 = 170;

fn osmium(args: &[&str]) {
    let out = Command::new("osmium")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("osmium is needed ({e}); install Debian's osmium-tool (scripts/deps.sh does)")
        });
    assert!(
        out.status.success(),
        "osmium {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The synthetic world as PBF (through `osmium cat`), in `dir`.
fn world_pbf(dir: &Path) -> std::path::PathBuf {
    let osm = dir.join("world.osm");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&osm).unwrap());
    highwater_osmgen::World {
        seed: 25,
        cities: CITIES,
    }
    .write_extract(&mut f)
    .unwrap();
    drop(f);
    let pbf = dir.join("world.osm.pbf");
    osmium(&[
        "cat",
        osm.to_str().unwrap(),
        "-o",
        pbf.to_str().unwrap(),
        "-O",
    ]);
    pbf
}

/// What `osmium cat` reads from `file`, in canonical form, sorted by type
/// then id as the store exports.
fn osmium_canon(file: &Path, work: &Path) -> Vec<Canon> {
    let opl = work.join("osmium.opl");
    osmium(&[
        "sort",
        file.to_str().unwrap(),
        "-f",
        "opl",
        "-O",
        "-o",
        opl.to_str().unwrap(),
    ]);
    std::fs::read_to_string(&opl)
        .unwrap()
        .lines()
        .map(canon_from_opl)
        .collect()
}

fn check(p: &Project, extract: &Path) {
    let r = p.check(&["osm", "import", extract.to_str().unwrap()], 0);
    assert!(r.stdout.contains("imported"), "{}", r.stdout);
    let theirs = osmium_canon(extract, p.dir.path());
    let ours = store_canon(&p.path(".highwater/osm"));
    assert_same_elements(&ours, &theirs);
}

#[test]
fn a_synthetic_extract_with_ids_beyond_2_pow_33_imports_equal_to_osmium_cat() {
    let p = Project::new(CONFIG);
    let pbf = world_pbf(p.dir.path());
    check(&p, &pbf);
    let ours = store_canon(&p.path(".highwater/osm"));
    let top = ours
        .iter()
        .filter_map(|c| c.0.strip_prefix('n')?.parse::<i64>().ok())
        .max()
        .unwrap();
    assert!(top > 1 << 33, "node ids reach {top}");
    assert!(ours.len() > 500_000, "{} elements", ours.len());
}

#[test]
fn an_unsorted_extract_is_imported_in_memory_and_equal_too() {
    let p = Project::new(CONFIG);
    // Ways before nodes, ids descending: no order a stream can use.
    p.write(
        "unsorted.osm",
        r#"<?xml version="1.0"?>
<osm version="0.6">
 <way id="9000000001"><nd ref="8600000002"/><nd ref="8600000001"/><tag k="highway" v="path"/></way>
 <node id="8600000002" lat="1.5" lon="2.5"><tag k="amenity" v="bench"/></node>
 <node id="8600000001" lat="1.0" lon="2.0"/>
 <relation id="5"><member type="way" ref="9000000001" role="x"/><tag k="type" v="route"/></relation>
</osm>
"#,
    );
    check(&p, &p.path("unsorted.osm"));
}

#[test]
fn a_sigkill_in_the_middle_of_an_import_and_the_next_import_completes() {
    let p = Project::new(CONFIG);
    let pbf = world_pbf(p.dir.path());
    // Killed with every row written and the scratch files full, while
    // the node blocks are being merged: the most an import leaves behind.
    p.killed_at(
        &["osm", "import", pbf.to_str().unwrap()],
        "import-kill-blocks",
    );
    let leftovers = |p: &Project| -> Vec<String> {
        std::fs::read_dir(p.path(".highwater/osm"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    let left = leftovers(&p);
    assert!(
        left.iter().any(|n| n.ends_with(".spill")),
        "scratch left: {left:?}"
    );
    assert!(!p.exists(".highwater/osm/store.db"), "nothing published");
    check(&p, &pbf);
    assert_eq!(
        leftovers(&p),
        vec!["store.db".to_string()],
        "the dead import's files are swept"
    );
}

#[test]
fn a_cache_outside_its_limits_is_refused_naming_the_key() {
    for (mb, code) in [("1", 2), ("2000000", 2)] {
        let p = Project::new(&CONFIG.replace("cache_mb = 32", &format!("cache_mb = {mb}")));
        let pbf = data().join("monaco-3047-20210801.osm.pbf");
        let r = p.check(&["osm", "import", pbf.to_str().unwrap()], code);
        assert!(
            r.stderr.contains(&format!("cache_mb = {mb}")),
            "{}",
            r.stderr
        );
        assert!(!p.exists(".highwater/osm/store.db"), "nothing touched");
    }
}
