//! Issue 11: object storage (S3 API, moto on loopback) as a place for file
//! stages' inputs and outputs, alone and with PostgreSQL state.

mod common;

use common::ingest::{pg_database, pg_serial};
use common::Project;
use highwater_objects::testing::Moto;
use highwater_objects::Objects;
use std::collections::BTreeMap;

const STORAGE: &str = r#"
[storage.lake]
kind = "s3"
bucket = "deliveries"
endpoint_env = "S3_ENDPOINT"
region = "us-east-1"
"#;

fn stage(output: &str) -> String {
    format!(
        r#"
[stages.upper]
inputs = ["lake:in/**/*.txt"]
output = "{output}"
command = ["sh", "up.sh", "{{input}}", "{{output}}"]
[stages.upper.recipe]
files = ["up.sh"]
"#
    )
}

struct Lake {
    moto: Moto,
    objects: Objects,
}

impl Lake {
    fn new() -> Lake {
        let moto = Moto::start();
        let objects = moto.client("deliveries");
        Lake { moto, objects }
    }

    fn put(&self, key: &str, body: &[u8]) -> String {
        match self.objects.put_if(key, body.to_vec(), None) {
            Ok(highwater_objects::Put::Done(e)) => e,
            _ => {
                let dir = tempfile::tempdir().unwrap();
                let f = dir.path().join("f");
                std::fs::write(&f, body).unwrap();
                self.objects.put_file(&f, key).unwrap()
            }
        }
    }

    fn tree(&self, prefix: &str) -> BTreeMap<String, Vec<u8>> {
        self.objects
            .list(prefix)
            .unwrap()
            .into_iter()
            .map(|o| {
                let (b, _) = self.objects.get(&o.key).unwrap().unwrap();
                (o.key, b.to_vec())
            })
            .collect()
    }

    fn run(&self, p: &Project, state_url: Option<&str>, code: i32) -> serde_json::Value {
        let mut c = p.cmd(&["run", "--json"]);
        for (k, v) in self.moto.env() {
            c.env(k, v);
        }
        // A temp folder of the project's own, so that what it leaves there
        // can be checked.
        std::fs::create_dir_all(p.path("tmp")).unwrap();
        c.env("TMPDIR", p.path("tmp"));
        if let Some(u) = state_url {
            c.env("HIGHWATER_STATE_URL", u);
        }
        let o = c.output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{stderr}");
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"))
    }
}

fn upper(b: &[u8]) -> Vec<u8> {
    b.to_ascii_uppercase()
}

#[test]
fn issue11_s3_inputs_are_seen_by_etag_and_judged_by_content() {
    let lake = Lake::new();
    let p = Project::new(&(STORAGE.to_string() + &stage("out/{relpath}.up")));
    lake.put("in/a.txt", b"alpha");
    lake.put("in/sub/b.txt", b"beta");
    lake.put("in/skip.csv", b"not matched");
    let r = lake.run(&p, None, 0);
    assert_eq!(r["stages"][0]["processed"], 2, "{r}");
    assert_eq!(p.read("out/a.txt.up"), "ALPHA");
    assert_eq!(p.read("out/sub/b.txt.up"), "BETA");
    // Nothing changed: the listing vouches for every object, nothing is read.
    let r = lake.run(&p, None, 0);
    assert_eq!(r["stages"][0]["unchanged"], 2, "{r}");
    // An edit that keeps the size is seen (another ETag), and redone.
    lake.put("in/a.txt", b"ALPHa");
    let r = lake.run(&p, None, 0);
    assert_eq!(r["stages"][0]["processed"], 1, "{r}");
    assert_eq!(r["stages"][0]["changes"][0]["input"], "lake:in/a.txt");
    assert_eq!(p.read("out/a.txt.up"), "ALPHA");
    // Identical bytes re-uploaded in parts: a new ETag, the same content;
    // under `hash` that is no change.
    let big: Vec<u8> = (0..(17u32 << 20)).map(|i| b'a' + (i % 26) as u8).collect();
    let e1 = lake.put("in/big.txt", &big);
    lake.run(&p, None, 0);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("big"), &big).unwrap();
    let e2 = lake
        .objects
        .put_file(&dir.path().join("big"), "in/big.txt")
        .unwrap();
    assert_ne!(e1, e2, "a multipart upload has another ETag");
    let r = lake.run(&p, None, 0);
    assert_eq!(r["stages"][0]["processed"], 0, "{r}");
    assert_eq!(r["stages"][0]["unchanged"], 3, "{r}");
    // A deleted object's output goes.
    lake.objects.delete("in/sub/b.txt").unwrap();
    let r = lake.run(&p, None, 0);
    assert_eq!(r["stages"][0]["deleted"], 1, "{r}");
    assert!(!p.exists("out/sub/b.txt.up"));
}

#[test]
fn issue11_s3_outputs_are_uploaded_then_recorded_and_removed_on_delete() {
    let lake = Lake::new();
    let p = Project::new(&(STORAGE.to_string() + &stage("lake:out/{relpath}.up")));
    lake.put("in/a.txt", b"alpha");
    lake.put("in/b.txt", b"beta");
    let r = lake.run(&p, None, 0);
    assert_eq!(r["stages"][0]["processed"], 2, "{r}");
    assert_eq!(
        lake.tree("out"),
        BTreeMap::from([
            ("out/a.txt.up".to_string(), b"ALPHA".to_vec()),
            ("out/b.txt.up".to_string(), b"BETA".to_vec()),
        ])
    );
    // A vanished output is noticed (one listing of the output root).
    lake.objects.delete("out/b.txt.up").unwrap();
    let r = lake.run(&p, None, 0);
    assert_eq!(r["stages"][0]["reasons"]["missing"], 1, "{r}");
    assert_eq!(lake.tree("out").len(), 2);
    lake.objects.delete("in/a.txt").unwrap();
    let r = lake.run(&p, None, 0);
    assert_eq!(r["stages"][0]["deleted"], 1, "{r}");
    assert_eq!(
        lake.tree("out").keys().collect::<Vec<_>>(),
        ["out/b.txt.up"]
    );
    // Scratch folders are gone.
    let left: Vec<_> = std::fs::read_dir(p.path("tmp"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn issue11_an_unknown_storage_name_is_refused_naming_it() {
    let p = Project::new(&(STORAGE.to_string() + &stage("laek:out/{relpath}.up")));
    let r = p.hw(&["run"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("laek") && r.stderr.contains("[storage.laek]"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("defined: lake"), "{}", r.stderr);
}

/// A small deterministic generator: the edit sequences are the same on
/// every run, and many differ from one another.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// The random edit sequence the SQLite store passes, here with PostgreSQL
/// state and S3 inputs and outputs: after every run, the outputs are what a
/// rebuild from the inputs would make.
#[test]
fn issue11_random_edits_on_postgres_state_and_s3_equal_a_rebuild() {
    let _pg = pg_serial();
    let (_db, url) = pg_database("s3edits");
    let lake = Lake::new();
    let cfg = format!(
        "[state]\nurl_env = \"HIGHWATER_STATE_URL\"\n{STORAGE}{}",
        stage("lake:out/{relpath}.up")
    );
    let p = Project::new(&cfg);
    let mut rng = Lcg(11);
    let mut inputs: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for round in 0..12 {
        for _ in 0..(1 + rng.next(6)) {
            let name = format!("in/d{}/f{}.txt", rng.next(3), rng.next(12));
            match rng.next(4) {
                0 if inputs.contains_key(&name) => {
                    lake.objects.delete(&name).unwrap();
                    inputs.remove(&name);
                }
                1 if inputs.contains_key(&name) => {
                    // Same size, other bytes.
                    let mut b = inputs[&name].clone();
                    b[0] = b"xyz"[rng.next(3) as usize];
                    lake.put(&name, &b);
                    inputs.insert(name, b);
                }
                _ => {
                    let b = format!(
                        "r{round} {} {}",
                        rng.next(1000),
                        "w".repeat(rng.next(9) as usize)
                    )
                    .into_bytes();
                    lake.put(&name, &b);
                    inputs.insert(name, b);
                }
            }
        }
        // The guard is about mass deletion, which this sequence is not.
        let mut c = p.cmd(&["run", "--json", "--force"]);
        for (k, v) in lake.moto.env() {
            c.env(k, v);
        }
        let o = c.env("HIGHWATER_STATE_URL", &url).output().unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "round {round}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let expected: BTreeMap<String, Vec<u8>> = inputs
            .iter()
            .map(|(k, v)| (format!("out/{}.up", &k[3..]), upper(v)))
            .collect();
        assert_eq!(lake.tree("out"), expected, "round {round}");
    }
}

/// Every row of one published version of the window, read the way a reader
/// reads: the manifest, then the files it names. Returns (version, notes).
fn read_window(o: &Objects, key: &str) -> Option<(String, Vec<String>, i64)> {
    use arrow_array::Array;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let (m, _) = o.get(&format!("{key}/_manifest.json")).unwrap()?;
    let m: serde_json::Value = serde_json::from_slice(&m).unwrap();
    let mut notes = Vec::new();
    for f in m["files"].as_array().unwrap() {
        let f = f.as_str().unwrap();
        let (bytes, _) = o
            .get(&format!("{key}/{f}"))
            .unwrap()
            .unwrap_or_else(|| panic!("{f}, named by the manifest, is gone"));
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .unwrap()
            .build()
            .unwrap();
        for b in reader {
            let b = b.unwrap();
            let col = common::ingest::str_column(&b, "note");
            notes.extend((0..col.len()).map(|i| col.value(i).to_string()));
        }
    }
    Some((
        m["version"].as_str().unwrap().to_string(),
        notes,
        m["rows"].as_i64().unwrap(),
    ))
}

#[test]
fn issue11_s3_window_publish_is_seen_whole_or_not_at_all() {
    let lake = Lake::new();
    let cfg = |retention: u64| {
        format!(
            "{STORAGE}{}",
            common::ingest::SQLITE_SOURCE
                .replace(
                    "output = \"raw/orders/ingest_date={date}/ingest_hour={hour}\"",
                    &format!("output = \"lake:raw/orders/ingest_date={{date}}/ingest_hour={{hour}}\"\nfile_rows_max = 40\nversion_retention_s = {retention}"),
                )
        )
    };
    let p = Project::new(&cfg(3600));
    let db = rusqlite::Connection::open(p.path("src.db")).unwrap();
    db.execute_batch(
        "PRAGMA journal_mode=WAL;
         CREATE TABLE orders(id INTEGER PRIMARY KEY, amount REAL, note TEXT, updated_at TEXT NOT NULL);",
    )
    .unwrap();
    let key = "raw/orders/ingest_date=2026-03-01/ingest_hour=08";
    let ingest = |extra: &[&str]| {
        let mut c = p.cmd(&[
            "ingest",
            "orders",
            "--json",
            "--now",
            "2026-03-01T09:30:00Z",
        ]);
        c.args(extra);
        for (k, v) in lake.moto.env() {
            c.env(k, v);
        }
        let o = c.output().unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let rewrite = |round: usize| {
        db.execute("DELETE FROM orders", []).unwrap();
        for i in 0..(100 + 13 * round) {
            db.execute(
                "INSERT INTO orders VALUES(?1, 1.0, ?2, ?3)",
                rusqlite::params![
                    i as i64,
                    format!("round {round}"),
                    format!("2026-03-01T08:{:02}:00Z", i % 60)
                ],
            )
            .unwrap();
        }
    };
    rewrite(0);
    let r = ingest(&[]);
    assert_eq!(r["windows"][0]["status"], "published", "{r}");
    assert_eq!(r["windows"][0]["path"], format!("lake:{key}"));
    // A reader reads the window over and over while it is republished.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let reads = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut reads = 0;
            let mut versions = std::collections::BTreeSet::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let (version, notes, rows) = read_window(&lake.objects, key).unwrap();
                // One version, whole: its rows all of one round, as many
                // as the manifest says.
                assert_eq!(notes.len() as i64, rows, "{version}");
                let first = notes[0].clone();
                assert!(notes.iter().all(|n| *n == first), "{version} mixes rounds");
                assert_eq!(notes.len(), 100 + 13 * first[6..].parse::<usize>().unwrap());
                versions.insert(version);
                reads += 1;
            }
            (reads, versions.len())
        });
        for round in 1..6 {
            rewrite(round);
            let r = ingest(&["--window", "2026-03-01T08:00:00Z/2026-03-01T09:00:00Z"]);
            assert_eq!(r["windows"][0]["status"], "published", "{r}");
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        reader.join().unwrap()
    });
    assert!(
        reads.0 > 5 && reads.1 > 1,
        "the reader saw several versions: {reads:?}"
    );
    let (_, notes, _) = read_window(&lake.objects, key).unwrap();
    assert_eq!(notes[0], "round 5");
    // Superseded versions stay readable for the retention period...
    let versions = |o: &Objects| {
        o.list(key)
            .unwrap()
            .into_iter()
            .filter_map(|i| {
                i.key[key.len() + 1..]
                    .split_once('/')
                    .map(|(v, _)| v.to_string())
            })
            .collect::<std::collections::BTreeSet<_>>()
    };
    assert_eq!(versions(&lake.objects).len(), 6);
    // ...and go at the first publish after it.
    p.write("highwater.toml", &cfg(0));
    ingest(&["--window", "2026-03-01T08:00:00Z/2026-03-01T09:00:00Z"]);
    assert_eq!(versions(&lake.objects).len(), 1);
    let (_, notes, rows) = read_window(&lake.objects, key).unwrap();
    assert_eq!((notes.len() as i64, notes[0].as_str()), (rows, "round 5"));
}
