//! Issue 12: OSM replication over HTTP against a loopback server the test
//! owns, serving the Monaco replication data with scripted faults.

mod common;
use common::http::{Fault, ReplicationServer};
use common::osm::*;
use common::*;
use std::time::Duration;

fn config(url: &str) -> String {
    format!(
        r#"
[osm]
store = ".highwater/osm"
replication_url = "{url}"
replication_retries_max = 3
replication_backoff_ms = 50
replication_timeout_s = 2

[osm.tiles.base]
zooms = "12-14"
keys = ["building", "highway"]
tiles_affected_max = 1000000
"#
    )
}

fn serve(top: i64, oldest: i64) -> ReplicationServer {
    ReplicationServer::start(data().join("monaco-updates"), top, oldest)
}

fn imported(url: &str) -> Project {
    let p = Project::new(&config(url));
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    p
}

fn status(p: &Project) -> serde_json::Value {
    p.check(&["osm", "status", "--json"], 0).json()
}

/// Every fault the issue names, on the way from 3047 to 3076: a 500 then
/// OK, a 404 inside the range, a truncated body, a body slower than the
/// timeout, a 429 with Retry-After, and a top state ahead of its diff. After
/// recovery the store equals `osmium apply-changes` of 3048..3076, element
/// by element, and every applied diff is recorded with its sha256.
#[test]
fn issue12_replicate_over_http_recovers_from_every_fault_class() {
    let s = serve(3076, 3000);
    s.fault("000/003/050.state.txt", &[Fault::Status(500)]);
    s.fault(
        "000/003/052.osc.gz",
        &[Fault::Status(503), Fault::TooMany(1)],
    );
    s.fault("000/003/055.osc.gz", &[Fault::Status(404)]);
    s.fault("000/003/060.osc.gz", &[Fault::Truncate]);
    s.fault("000/003/063.osc.gz", &[Fault::Garbage]);
    s.fault("000/003/065.osc.gz", &[Fault::Slow(Duration::from_secs(4))]);
    // The top state is published before its diff.
    s.fault(
        "000/003/076.osc.gz",
        &[Fault::Status(404), Fault::Status(404)],
    );
    let p = imported(&s.url);
    let r = p.check(&["osm", "replicate", "--json"], 0);
    assert!(r.stdout.contains("\"sequence\":3076"), "{}", r.stdout);
    for (path, n) in [
        ("000/003/050.state.txt", 2),
        ("000/003/052.osc.gz", 3),
        ("000/003/055.osc.gz", 2),
        ("000/003/060.osc.gz", 2),
        ("000/003/063.osc.gz", 2),
        ("000/003/065.osc.gz", 2),
        ("000/003/076.osc.gz", 3),
    ] {
        assert_eq!(s.requests(path), n, "{path}");
    }
    let st = status(&p);
    assert_eq!(st["sequence"], 3076);
    // The import recorded where the extract says its updates are; the
    // config's URL won over it.
    assert_eq!(
        st["replication_url_from_extract"],
        "http://download.geofabrik.de/europe/monaco-updates"
    );
    assert_eq!(st["server"]["url"], s.url.as_str());
    assert_eq!(st["server"]["sequence"], 3076, "{st}");
    assert_eq!(st["server"]["lag_s"], 0, "{st}");
    let log = st["replicated"].as_array().unwrap();
    assert_eq!(log.len(), 10);
    assert_eq!(log[0]["sequence"], 3076);
    assert_eq!(log[0]["url"], format!("{}/000/003/076.osc.gz", s.url));
    let sum = std::process::Command::new("sha256sum")
        .arg(data().join("monaco-updates/000/003/076.osc.gz"))
        .output()
        .unwrap();
    let sum = String::from_utf8_lossy(&sum.stdout);
    assert_eq!(
        log[0]["sha256"].as_str().unwrap(),
        sum.split(' ').next().unwrap()
    );
    assert!(
        !p.exists(".highwater/osm/.fetch"),
        "the fetch cache is emptied"
    );
    let theirs = osmium_applied(p.dir.path(), 3048..=3076);
    assert_same_elements(&store_canon(&p.path(".highwater/osm")), &theirs);
    // Nothing new: up to date, exit 0.
    let r = p.check(&["osm", "replicate"], 0);
    assert!(
        r.stdout.contains("up to date at sequence 3076"),
        "{}",
        r.stdout
    );
}

/// Faults that do not clear: each ends with the exit code of its class and
/// the store where the last good diff left it.
#[test]
fn issue12_persistent_faults_end_by_class_and_apply_nothing_bad() {
    // Transient: 5xx past the retries: exit 1, naming the last error.
    let s = serve(3050, 3000);
    s.fault("000/003/048.osc.gz", &[Fault::Status(502); 10]);
    let p = imported(&s.url);
    let r = p.check(&["osm", "replicate"], 1);
    assert!(
        r.stderr.contains("048.osc.gz: HTTP 502 (after 4 attempts)"),
        "{}",
        r.stderr
    );
    assert_eq!(status(&p)["sequence"], 3047);

    // Corrupt twice: refused, nothing applied.
    let s = serve(3050, 3000);
    s.fault("000/003/048.osc.gz", &[Fault::Truncate, Fault::Truncate]);
    let p = imported(&s.url);
    let r = p.check(&["osm", "replicate"], 1);
    assert!(
        r.stderr
            .contains("fetched twice and refused, nothing was applied"),
        "{}",
        r.stderr
    );
    assert_eq!(status(&p)["sequence"], 3047);

    // A 404 inside the range that does not clear: what came before it is
    // applied, then exit 1 naming the URL.
    let s = serve(3052, 3000);
    s.fault("000/003/050.osc.gz", &[Fault::Status(404); 10]);
    let p = imported(&s.url);
    let r = p.check(&["osm", "replicate"], 1);
    assert!(
        r.stderr
            .contains("000/003/050.osc.gz: not on the server (404)"),
        "{}",
        r.stderr
    );
    assert_eq!(status(&p)["sequence"], 3049);

    // The server no longer keeps the store's next sequence: exit 2.
    let s = serve(3076, 3060);
    let p = imported(&s.url);
    let r = p.check(&["osm", "replicate"], 2);
    assert!(
        r.stderr.contains("no longer keeps sequence 3048"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("osm import EXTRACT --replace"),
        "{}",
        r.stderr
    );

    // A state older than the one before it: refused, exit 2.
    let s = serve(3050, 3000);
    s.body(
        "000/003/049.state.txt",
        b"sequenceNumber=3049\ntimestamp=2021-07-01T20\\:21\\:40Z\n",
    );
    let p = imported(&s.url);
    let r = p.check(&["osm", "replicate"], 2);
    assert!(
        r.stderr.contains("the server went backwards"),
        "{}",
        r.stderr
    );
    assert_eq!(status(&p)["sequence"], 3048);

    // A server behind the store (another stream, an old backup): exit 2.
    let behind = serve(3076, 3000);
    behind.body(
        "state.txt",
        b"sequenceNumber=3040\ntimestamp=2021-07-25T20\\:21\\:40Z\n",
    );
    let q = imported(&behind.url);
    let r = q.check(&["osm", "replicate"], 2);
    assert!(
        r.stderr.contains("older than the store's 3047"),
        "{}",
        r.stderr
    );

    // Not a replication server at all: exit 2 at once.
    let r = p.check(&["osm", "replicate", "--url", "ftp://example.org/x"], 2);
    assert!(r.stderr.contains("http:// or https://"), "{}", r.stderr);
}

/// `--loop` applies a sequence published while it waits, and stops with 0
/// on SIGTERM.
#[test]
fn issue12_loop_follows_the_server_and_stops_on_sigterm() {
    let s = serve(3050, 3000);
    let p = imported(&s.url);
    let child = p
        .cmd(&["osm", "replicate", "--loop", "--interval", "1s"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let wait_for = |seq: i64| {
        for _ in 0..300 {
            if status(&p)["sequence"] == seq {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the loop did not reach {seq}");
    };
    wait_for(3050);
    s.top.store(3053, std::sync::atomic::Ordering::SeqCst);
    wait_for(3053);
    // SAFETY: a signal to our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The lease was released: another writer may go at once.
    p.check(&["osm", "replicate"], 0);
}

/// pyosmium's reference client, on the same server, reaches the same
/// sequence.
#[test]
fn issue12_pyosmium_agrees_on_the_sequence_reached() {
    let s = serve(3076, 3000);
    let p = imported(&s.url);
    p.check(&["osm", "replicate"], 0);
    let ours = status(&p)["sequence"].as_i64().unwrap();
    let tool = std::env::var("HIGHWATER_PYOSMIUM_GET_CHANGES").expect(
        "HIGHWATER_PYOSMIUM_GET_CHANGES is not set: run the tests with `bash scripts/test.sh`, which installs pyosmium",
    );
    let out = std::process::Command::new(tool)
        .args(["--server", &s.url, "-I", "3047", "-o"])
        .arg(p.path("pyosmium.osc.gz"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // It prints the sequence its output reaches.
    let reached: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_eq!(
        reached, ours,
        "pyosmium reached {reached}, highwater {ours}"
    );
    // And the changes it fetched, applied by osmium to 3047, are the store.
    let opl = p.path("pyosmium.opl");
    let o = std::process::Command::new("osmium")
        .arg("apply-changes")
        .arg(data().join("monaco-3047-20210801.osm.pbf"))
        .arg(p.path("pyosmium.osc.gz"))
        .args(["-f", "opl", "-O", "-o"])
        .arg(&opl)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let theirs: Vec<Canon> = std::fs::read_to_string(&opl)
        .unwrap()
        .lines()
        .map(canon_from_opl)
        .collect();
    assert_same_elements(&store_canon(&p.path(".highwater/osm")), &theirs);
}
