//! Issue 50: `osm tiles publish NAME --to STORAGE:prefix/NAME.pmtiles`
//! writes the tile dataset as a PMTiles v3 archive in a bucket (moto on
//! loopback, the S3 API as a CDN's origin would be) and keeps it current:
//! after a real diff is applied and drained, the next publish sends the
//! diff's tiles and copies the rest inside the bucket (counted from moto's
//! own request log, not our report); the `pmtiles` reader on PyPI reads
//! every tile back equal to the MBTiles file, and the header and metadata
//! as the spec gives them; a reader during publishes sees one version; a
//! publish killed at each step leaves the previous archive readable and
//! the next publish completes.
//!
//! Data: Monaco's extract at sequence 3047 and its diffs 3048..3076
//! (crates/highwater-osm/tests/data, see SOURCE.md there).

mod common;
use common::osm::{data, monaco_updates};
use common::*;
use highwater_objects::testing::{Moto, Options};
use highwater_objects::Objects;
use std::path::{Path, PathBuf};

/// moto's (and our) smallest part but the last. S3's is 5 MiB; Monaco's
/// archive is smaller than that, so the tests run the same rule at a
/// scale Monaco exercises (moto enforces it when an upload completes);
/// bench/osm_pmtiles.sh measures at S3's 5 MiB.
const PART_MIN_BYTES: u64 = 32 << 10;

fn config() -> String {
    format!(
        r#"
[osm]
store = ".highwater/osm"

[osm.tiles.base]
zooms = "14-17"
keys = ["building", "highway", "landuse", "name", "natural", "amenity"]
mbtiles = "tiles/base.mbtiles"
drain = "deferred"

[storage.maps]
kind = "s3"
bucket = "maps"
endpoint_env = "S3_ENDPOINT"
region = "us-east-1"
part_min_bytes = {PART_MIN_BYTES}
"#
    )
}

struct Bucket {
    moto: Moto,
    objects: Objects,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Bucket {
    fn new() -> Bucket {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("requests.jsonl");
        let moto = Moto::start_with(Options {
            request_log: Some(log.clone()),
            part_min_bytes: Some(PART_MIN_BYTES),
        });
        let objects = moto.client("maps");
        Bucket {
            moto,
            objects,
            log,
            _dir: dir,
        }
    }

    /// The requests moto logged since the last call (and forgets them).
    fn requests(&self) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        std::fs::write(&self.log, "").unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn hw(&self, p: &Project, args: &[&str]) -> Ran {
        let mut c = p.cmd(args);
        for (k, v) in self.moto.env() {
            c.env(k, v);
        }
        let o = c.output().unwrap();
        Ran {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    fn publish(&self, p: &Project) -> serde_json::Value {
        let r = self.hw(
            p,
            &[
                "osm",
                "tiles",
                "publish",
                "base",
                "--to",
                "maps:tiles/base.pmtiles",
                "--json",
            ],
        );
        assert_eq!(r.code, 0, "publish: {}\n{}", r.stdout, r.stderr);
        r.json()
    }

    /// Runs a publish with a failpoint that kills it.
    fn publish_killed_at(&self, p: &Project, failpoint: &str) {
        use std::os::unix::process::ExitStatusExt;
        let mut c = p.cmd(&[
            "osm",
            "tiles",
            "publish",
            "base",
            "--to",
            "maps:tiles/base.pmtiles",
        ]);
        for (k, v) in self.moto.env() {
            c.env(k, v);
        }
        let o = c
            .env("HIGHWATER_FAILPOINT", format!("{failpoint}:base"))
            .output()
            .unwrap();
        assert_eq!(o.status.signal(), Some(libc::SIGKILL), "{failpoint}: {o:?}");
    }

    /// The pointer, and the archive it names downloaded to `to`.
    fn current(&self, to: &Path) -> (serde_json::Value, PathBuf) {
        let (b, _) = self
            .objects
            .get("tiles/base.pmtiles.json")
            .unwrap()
            .expect("the pointer exists");
        let ptr: serde_json::Value = serde_json::from_slice(&b).unwrap();
        let name = ptr["pmtiles"].as_str().unwrap().to_string();
        let (a, _) = self
            .objects
            .get(&format!("tiles/{name}"))
            .unwrap()
            .unwrap_or_else(|| panic!("the pointer names {name}, which is not in the bucket"));
        let path = to.join(&name);
        std::fs::write(&path, &a).unwrap();
        (ptr, path)
    }
}

/// Monaco imported at 3047 and its tiles built; `seqs` copied into
/// `updates/` (not applied).
fn project(seqs: std::ops::RangeInclusive<i64>) -> Project {
    let p = Project::new(&config());
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    p.check(&["osm", "tiles", "build"], 0);
    monaco_updates(&p, seqs);
    p
}

/// Applies the diffs `seqs` (deferred) and drains the tiles. Of Monaco's
/// diffs, 3050 affects 11 tiles, 3051 and 3054 39 each, the others
/// under these keys none.
fn apply_and_drain(p: &Project, seqs: std::ops::RangeInclusive<i64>) {
    let files: Vec<String> = seqs
        .map(|q| {
            p.path(&format!("updates/000/003/{:03}.osc.gz", q % 1000))
                .display()
                .to_string()
        })
        .collect();
    let mut args = vec!["osm", "apply"];
    args.extend(files.iter().map(String::as_str));
    p.check(&args, 0);
    p.check(&["osm", "tiles", "drain"], 0);
}

/// What the `pmtiles` package (PyPI) reads of `archive`, compared with the
/// MBTiles file tile by tile (both decompressed): JSON with the header,
/// the metadata, the tile count and the differences.
const READ_BACK: &str = r#"
import gzip, json, sqlite3, sys
from pmtiles.reader import Reader, MmapSource, all_tiles
archive, mbtiles = sys.argv[1], sys.argv[2]
with open(archive, "rb") as f:
    src = MmapSource(f)
    r = Reader(src)
    header = r.header()
    metadata = r.metadata()
    ours = {}
    for (z, x, y), data in all_tiles(src):
        ours[(z, x, y)] = gzip.decompress(data)
    # Every tile also found by a point lookup (root, then leaf).
    looked = sum(1 for (z, x, y) in ours if r.get(z, x, y) is not None)
db = sqlite3.connect(mbtiles)
theirs = {}
for z, x, row, data in db.execute("SELECT zoom_level, tile_column, tile_row, tile_data FROM tiles"):
    theirs[(z, x, (1 << z) - 1 - row)] = gzip.decompress(data)
diff = [list(k) for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k)]
h = {k: (v.name if hasattr(v, "name") else v) for k, v in header.items()}
print(json.dumps({"header": h, "metadata": metadata, "tiles": len(ours),
                  "mbtiles_tiles": len(theirs), "looked_up": looked,
                  "differences": sorted(diff)[:10], "different": len(diff)}))
"#;

fn read_back(archive: &Path, mbtiles: &Path) -> serde_json::Value {
    let python = std::env::var("HIGHWATER_TEST_PYTHON")
        .expect("HIGHWATER_TEST_PYTHON: run the tests with scripts/test.sh (scripts/deps.sh installs the pmtiles package)");
    let o = std::process::Command::new(python)
        .args(["-c", READ_BACK])
        .arg(archive)
        .arg(mbtiles)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "the pmtiles reader failed on {}: {}",
        archive.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Every tile of `archive` equals the MBTiles file's, and the header and
/// metadata are as the spec asks.
fn assert_reads_as(archive: &Path, mbtiles: &Path) -> serde_json::Value {
    let r = read_back(archive, mbtiles);
    assert_eq!(r["different"], 0, "tiles differ: {r}");
    assert!(r["tiles"].as_u64().unwrap() > 100, "{r}");
    assert_eq!(r["tiles"], r["mbtiles_tiles"]);
    assert_eq!(r["looked_up"], r["tiles"], "point lookups: {r}");
    let h = &r["header"];
    assert_eq!(h["tile_type"], "MVT", "{h}");
    assert_eq!(h["tile_compression"], "GZIP", "{h}");
    assert_eq!(h["internal_compression"], "GZIP", "{h}");
    assert_eq!(h["min_zoom"], 14, "{h}");
    assert_eq!(h["max_zoom"], 17, "{h}");
    // Monaco: 7.4°E, 43.7°N, inside the bounds; the center inside too.
    let (w, s, e, n) = (
        h["min_lon_e7"].as_f64().unwrap() / 1e7,
        h["min_lat_e7"].as_f64().unwrap() / 1e7,
        h["max_lon_e7"].as_f64().unwrap() / 1e7,
        h["max_lat_e7"].as_f64().unwrap() / 1e7,
    );
    assert!(w < 7.42 && e > 7.42 && s < 43.73 && n > 43.73, "{h}");
    assert!(
        e - w < 1.0 && n - s < 1.0,
        "bounds are Monaco's, not the world's: {h}"
    );
    let (cx, cy) = (
        h["center_lon_e7"].as_f64().unwrap() / 1e7,
        h["center_lat_e7"].as_f64().unwrap() / 1e7,
    );
    assert!(w <= cx && cx <= e && s <= cy && cy <= n, "{h}");
    let m = &r["metadata"];
    assert!(
        m["attribution"]
            .as_str()
            .unwrap()
            .contains("© OpenStreetMap contributors"),
        "{m}"
    );
    assert_eq!(m["vector_layers"][0]["id"], "base", "{m}");
    r
}

/// Bytes sent to moto in request bodies, and the part copies among them.
fn sent(requests: &[serde_json::Value]) -> (u64, usize) {
    let bytes = requests
        .iter()
        .filter(|r| r["method"] == "PUT" || r["method"] == "POST")
        .map(|r| r["length"].as_u64().unwrap())
        .sum();
    let copies = requests
        .iter()
        .filter(|r| r["copy_source"].is_string())
        .count();
    (bytes, copies)
}

/// Issue 50: publish, apply a real diff, drain, publish again: the second
/// publish sends a small share of the archive (moto's request log), copies
/// the rest in the bucket, and the `pmtiles` reader reads every tile of
/// both versions equal to the MBTiles file they were published from.
#[test]
fn issue50_a_publish_after_a_diff_sends_the_diff_and_reads_back_equal() {
    let b = Bucket::new();
    let p = project(3048..=3051);
    let work = tempfile::tempdir().unwrap();
    b.requests();
    let first = b.publish(&p);
    assert!(first["full_reason"].is_string(), "{first}");
    let (sent1, _) = sent(&b.requests());
    let (ptr, a1) = b.current(work.path());
    assert_eq!(ptr["version"], 1);
    assert!(
        sent1 >= first["archive_bytes"].as_u64().unwrap(),
        "{sent1} {first}"
    );
    let r1 = assert_reads_as(&a1, &p.path("tiles/base.mbtiles"));
    assert_eq!(
        r1["header"]["clustered"], true,
        "a whole write is clustered"
    );

    apply_and_drain(&p, 3048..=3050);
    // The publish after a drain reflects the dataset's marker.
    let second = b.publish(&p);
    let reqs = b.requests();
    let (sent2, copies) = sent(&reqs);
    assert!(second["full_reason"].is_null(), "incremental: {second}");
    assert!(second["tiles_changed"].as_u64().unwrap() > 0, "{second}");
    assert_eq!(second["sequence"], 3050, "{second}");
    let (ptr, a2) = b.current(work.path());
    assert_eq!(ptr["version"], 2);
    let archive = second["archive_bytes"].as_u64().unwrap();
    assert!(copies >= 1, "no UploadPartCopy in {reqs:#?}");
    // What moto received, every body counted (parts, the completion's
    // XML, the pointer): a small share of the archive.
    assert!(
        sent2 * 4 < archive,
        "the second publish sent {sent2} bytes of a {archive}-byte archive: {second}"
    );
    assert!(sent2 >= second["uploaded_bytes"].as_u64().unwrap());
    let r2 = assert_reads_as(&a2, &p.path("tiles/base.mbtiles"));
    assert_eq!(r2["header"]["clustered"], false, "appended: not clustered");
    assert_eq!(r2["metadata"]["highwater_sequence"], 3050);

    // The status says which sequence each place reflects.
    let st = p.check(&["osm", "status", "--json"], 0).json();
    let d = st["datasets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "base")
        .unwrap();
    assert_eq!(d["pmtiles"][0]["target"], "maps:tiles/base.pmtiles", "{d}");
    assert_eq!(d["pmtiles"][0]["sequence"], 3050, "{d}");
    assert_eq!(d["pmtiles"][0]["version"], 2, "{d}");
    let text = p.check(&["osm", "status"], 0).stdout;
    assert!(
        text.contains("PMTiles maps:tiles/base.pmtiles: version 2, reflects sequence 3050"),
        "{text}"
    );

    // A publish with nothing drained since writes nothing.
    let third = b.publish(&p);
    assert_eq!(third["unchanged"], true, "{third}");
    let (sent3, _) = sent(&b.requests());
    assert_eq!(sent3, 0, "an unchanged publish sent {sent3} bytes");

    // Drains since are counted as waiting.
    apply_and_drain(&p, 3051..=3051);
    let st = p.check(&["osm", "status", "--json"], 0).json();
    let d = &st["datasets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "base")
        .unwrap()["pmtiles"][0];
    assert!(d["changed_since"].as_u64().unwrap() > 0, "{d}");
    b.publish(&p);
    let (_, a3) = b.current(work.path());
    assert_reads_as(&a3, &p.path("tiles/base.mbtiles"));
}

/// Issue 50: past `pmtiles_dead_share_max_pct` dead bytes the publish
/// rewrites the archive whole (clustered again), and a rebuilt MBTiles
/// file is published whole.
#[test]
fn issue50_dead_bytes_past_the_limit_and_a_rebuild_rewrite_the_archive_whole() {
    let b = Bucket::new();
    let p = project(3048..=3054);
    p.write(
        "highwater.toml",
        &config().replace(
            "drain = \"deferred\"",
            "drain = \"deferred\"\npmtiles_dead_share_max_pct = 0",
        ),
    );
    let work = tempfile::tempdir().unwrap();
    b.publish(&p);
    apply_and_drain(&p, 3048..=3050);
    let r = b.publish(&p);
    assert!(
        r["full_reason"]
            .as_str()
            .is_some_and(|s| s.contains("pmtiles_dead_share_max_pct")),
        "{r}"
    );
    assert_eq!(r["dead_bytes"], 0);
    let (_, a) = b.current(work.path());
    let rb = assert_reads_as(&a, &p.path("tiles/base.mbtiles"));
    assert_eq!(rb["header"]["clustered"], true);

    p.check(&["osm", "rebuild", "base"], 0);
    let r = b.publish(&p);
    assert!(
        r["full_reason"]
            .as_str()
            .is_some_and(|s| s.contains("rebuilt")),
        "{r}"
    );
    // Old versions beyond pmtiles_versions_kept (3) are gone.
    apply_and_drain(&p, 3051..=3051);
    let r = b.publish(&p);
    assert_eq!(r["version"], 4, "{r}");
    let names: Vec<String> = b
        .objects
        .list("tiles")
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(
        names,
        [
            "tiles/base.pmtiles.json",
            "tiles/base.v00000002.pmtiles",
            "tiles/base.v00000003.pmtiles",
            "tiles/base.v00000004.pmtiles"
        ]
    );
}

/// Issue 50: a publish killed before its upload completes, after it, and
/// after the pointer's swap leaves an archive the `pmtiles` reader reads
/// equal to the MBTiles file it was published from; the next publish
/// completes and reads back equal to the file as it is.
#[test]
fn issue50_a_killed_publish_leaves_the_previous_archive_readable() {
    let b = Bucket::new();
    let p = project(3048..=3054);
    let work = tempfile::tempdir().unwrap();
    b.publish(&p);
    let mut snapshot = work.path().join("v1.mbtiles");
    std::fs::copy(p.path("tiles/base.mbtiles"), &snapshot).unwrap();
    for (seqs, fp) in [
        (3048..=3050, "kill-pmtiles-after-upload"),
        (3051..=3051, "kill-pmtiles-after-swap"),
    ] {
        apply_and_drain(&p, seqs);
        b.publish_killed_at(&p, fp);
        let (ptr, a) = b.current(work.path());
        let now = p.path("tiles/base.mbtiles");
        // Before the swap the pointer is on the previous archive, equal to
        // the file as it was; after it, on the new one.
        let expect = if fp.ends_with("after-swap") {
            &now
        } else {
            &snapshot
        };
        assert_reads_as(&a, expect);
        assert!(ptr["version"].as_i64().unwrap() >= 1);
        let r = b.publish(&p);
        let (_, a) = b.current(work.path());
        assert_reads_as(&a, &now);
        assert!(r["version"].as_i64().unwrap() > ptr["version"].as_i64().unwrap());
        snapshot = work.path().join(format!("v{}.mbtiles", r["version"]));
        std::fs::copy(&now, &snapshot).unwrap();
    }
}

/// Issue 50: a reader that reads the pointer and then the archive in
/// several range requests, while publishes run, always reads one version:
/// the header it read first is the head of the archive it reads after,
/// and the archive's metadata names the version the pointer named.
///
/// First in a fixed order (no timing): a reader that read the pointer
/// and the archive's first 16 KiB (header and root directory, as a
/// latency-optimised client prefetches them) before a publish swaps the
/// pointer, and reads the rest after it, reads the version it started on,
/// whole, every tile equal to the MBTiles file as it was; a reader
/// starting after the swap reads the new version, equal to the file as it
/// is. Then a reader looping while publishes run.
#[test]
fn issue50_a_reader_during_publishes_sees_one_version() {
    let b = Bucket::new();
    let p = project(3048..=3054);
    b.publish(&p);
    let work = tempfile::tempdir().unwrap();
    let was = work.path().join("was.mbtiles");
    std::fs::copy(p.path("tiles/base.mbtiles"), &was).unwrap();
    let (ptr, _) = b.objects.get("tiles/base.pmtiles.json").unwrap().unwrap();
    let ptr: serde_json::Value = serde_json::from_slice(&ptr).unwrap();
    let key = format!("tiles/{}", ptr["pmtiles"].as_str().unwrap());
    let size = b.objects.get(&key).unwrap().unwrap().0.len() as u64;
    let prefetch = b.objects.get_range(&key, 0, size.min(16_384)).unwrap();
    apply_and_drain(&p, 3048..=3050);
    let swapped = b.publish(&p);
    assert_eq!(swapped["version"], 2, "{swapped}");
    let rest = b
        .objects
        .get_range(&key, prefetch.len() as u64, size - prefetch.len() as u64)
        .unwrap_or_else(|e| panic!("{key}, read before the swap, went after it: {e}"));
    let mut whole = prefetch.to_vec();
    whole.extend_from_slice(&rest);
    let started_on = work.path().join("started-on.pmtiles");
    std::fs::write(&started_on, &whole).unwrap();
    let r = assert_reads_as(&started_on, &was);
    assert_eq!(r["metadata"]["highwater_version"], 1, "{r}");
    let (now_ptr, now) = b.current(work.path());
    assert_eq!(now_ptr["version"], 2);
    let r = assert_reads_as(&now, &p.path("tiles/base.mbtiles"));
    assert_eq!(r["metadata"]["highwater_version"], 2, "{r}");
    // The two versions differ (the diff's tiles), so reading one for the
    // other would have been seen.
    assert_ne!(
        read_back(&started_on, &p.path("tiles/base.mbtiles"))["different"],
        0
    );

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        let objects = b.moto.client("maps");
        std::thread::spawn(move || {
            let mut reads = 0;
            let mut versions = std::collections::BTreeSet::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) || reads < 3 {
                let (ptr, _) = objects.get("tiles/base.pmtiles.json").unwrap().unwrap();
                let ptr: serde_json::Value = serde_json::from_slice(&ptr).unwrap();
                let key = format!("tiles/{}", ptr["pmtiles"].as_str().unwrap());
                let head = objects.get_range(&key, 0, 127).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(20));
                let (whole, _) = objects
                    .get(&key)
                    .unwrap()
                    .unwrap_or_else(|| panic!("{key} went while read"));
                assert_eq!(
                    &whole[..127],
                    &head[..],
                    "{key}: the head changed between reads"
                );
                // The metadata inside names the pointer's version.
                let off = u64::from_le_bytes(head[24..32].try_into().unwrap()) as usize;
                let len = u64::from_le_bytes(head[32..40].try_into().unwrap()) as usize;
                let meta = highwater_osm::tiles::fresh::gunzip(&whole[off..off + len]).unwrap();
                let meta: serde_json::Value = serde_json::from_slice(&meta).unwrap();
                assert_eq!(meta["highwater_version"], ptr["version"], "{key}");
                versions.insert(ptr["version"].as_i64().unwrap());
                reads += 1;
            }
            versions
        })
    };
    for seqs in [3051..=3051, 3052..=3054] {
        apply_and_drain(&p, seqs);
        b.publish(&p);
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let versions = reader.join().unwrap();
    assert!(!versions.is_empty());
}
