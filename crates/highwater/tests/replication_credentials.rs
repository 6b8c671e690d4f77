//! Credentials in a replication URL (`http://user:secret@host/`, issue 20
//! item 9): used for every request (the server behind the test's front
//! answers 401 without them), and never shown or stored: not by `osm
//! status` or `--json`, not in an error, not in what `serve` sends for
//! `/api/status`, `/` and `/metrics`, and in no byte of any file the commands write
//! (the store's SQLite file and its -wal included). A store written before
//! this, with the secret in its rows, is scrubbed when opened.

mod common;
use common::front::{relay, response, Front};
use common::http::ReplicationServer;
use common::osm::*;
use common::*;
use std::io::{Read, Write};

const SECRET: &str = "s3cr3t-Pa55";

/// `Basic base64("mapper:s3cr3t-Pa55")`.
const AUTH: &str = "Basic bWFwcGVyOnMzY3IzdC1QYTU1";

/// The variable the env case names in `replication_url_env`; set in this
/// process so that every command (and `serve`) inherits it.
const VAR: &str = "HW_TEST_ISSUE20_REPLICATION_URL";

/// The Monaco replication server behind a front that wants the
/// credentials: 401 without them.
fn guarded() -> (ReplicationServer, Front) {
    let upstream = ReplicationServer::start(data().join("monaco-updates"), 3076, 3000);
    let up = upstream.url.clone();
    let front = Front::start(move |req| {
        if req.headers.get("authorization").map(String::as_str) == Some(AUTH) {
            relay(&up, &req.path)
        } else {
            response(
                "401 Unauthorized",
                &[("WWW-Authenticate", "Basic realm=\"osm\"")],
                b"",
            )
        }
    });
    (upstream, front)
}

const TILES: &str = r#"
[osm.tiles.base]
zooms = "12-13"
keys = ["building", "highway"]
mbtiles = "base.mbtiles"
tiles_affected_max = 1000000
"#;

fn config(server: &str) -> String {
    format!(
        r#"
[osm]
store = ".highwater/osm"
{server}
replication_retries_max = 1
replication_backoff_ms = 20
replication_timeout_s = 5
{TILES}"#
    )
}

/// Everything said must not hold `secret`.
fn clean(what: &str, text: &str, secret: &str) {
    assert!(
        !text.contains(secret),
        "{what} shows the secret {secret:?}:\n{text}"
    );
}

/// No byte of any file under the project but the config holds `secret`:
/// the store, its -wal and -shm, the MBTiles, the fetch cache.
fn no_file_holds(p: &Project, secret: &str) -> usize {
    let mut files = 0;
    for (rel, (bytes, _)) in p.tree("") {
        if rel == "highwater.toml" {
            continue;
        }
        files += 1;
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{rel} holds the secret {secret:?}"
        );
    }
    files
}

/// One GET against `serve`: the body.
fn get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    assert!(text.starts_with("HTTP/1.1 200"), "{path}: {text}");
    text
}

/// How the credentials are given: `[osm] replication_url`, or the variable
/// `replication_url_env` names.
fn check(case: &str, server_line: &str) {
    let (upstream, front) = guarded();
    let hostport = front.url.strip_prefix("http://").unwrap().to_string();
    let url = format!("http://mapper:{SECRET}@{hostport}/replication");
    if server_line.contains(VAR) {
        // Only this case sets it: tests run in parallel threads.
        std::env::set_var(VAR, &url);
    }
    let p = Project::new(&config(&server_line.replace("@URL@", &url)));
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    let mut said = Vec::new();

    // Every request carried the credentials: the guarded server served all.
    let r = p.check(&["osm", "replicate", "--json"], 0);
    assert!(
        r.stdout.contains("\"sequence\":3076"),
        "{case}: {}",
        r.stdout
    );
    assert_eq!(upstream.requests("000/003/076.osc.gz"), 1, "{case}");
    let refused = front
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter(|q| q.headers.get("authorization").map(String::as_str) != Some(AUTH))
        .count();
    assert_eq!(refused, 0, "{case}: requests without the credentials");
    said.push(("replicate", r.stdout + &r.stderr));
    let r = p.check(&["osm", "replicate", "--json"], 0);
    assert!(r.stdout.contains("***@"), "{case}: {}", r.stdout);
    said.push(("replicate, up to date", r.stdout + &r.stderr));

    // Status, text and JSON: the server asked with the credentials, its URL
    // shown redacted; the applied diffs' URLs too.
    let shown = format!("http://***@{hostport}/replication");
    let r = p.check(&["osm", "status", "--json"], 0);
    let v = r.json();
    assert_eq!(v["server"]["url"], shown.as_str(), "{case}: {v}");
    assert_eq!(v["server"]["sequence"], 3076, "{case}: {v}");
    assert_eq!(
        v["replicated"][0]["url"],
        format!("{shown}/000/003/076.osc.gz"),
        "{case}"
    );
    said.push(("status --json", r.stdout + &r.stderr));
    let r = p.check(&["osm", "status"], 0);
    assert!(r.stdout.contains(&shown), "{case}: {}", r.stdout);
    said.push(("status", r.stdout + &r.stderr));

    // Errors: a server that cannot be reached, a URL that is not http(s),
    // a password the server refuses; each names the URL, redacted.
    for (what, args, code, words) in [
        (
            "unreachable",
            vec![
                "osm".to_string(),
                "replicate".into(),
                "--url".into(),
                format!("http://mapper:{SECRET}@127.0.0.1:9/replication"),
            ],
            1,
            vec!["http://***@127.0.0.1:9/replication/state.txt".to_string()],
        ),
        (
            "not http",
            vec![
                "osm".into(),
                "replicate".into(),
                "--url".into(),
                format!("ftp://mapper:{SECRET}@{hostport}/replication"),
            ],
            2,
            vec![format!("ftp://***@{hostport}/replication")],
        ),
        (
            "refused password",
            vec![
                "osm".into(),
                "replicate".into(),
                "--url".into(),
                format!("http://mapper:wr0ng-{SECRET}@{hostport}/replication"),
            ],
            2,
            vec!["HTTP 401".to_string(), shown.clone()],
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = p.check(&args, code);
        for w in &words {
            assert!(
                r.stderr.contains(w),
                "{case}, {what}: {w:?} not in {}",
                r.stderr
            );
        }
        said.push((what, r.stdout + &r.stderr));
    }

    // What serve sends for the status pages.
    {
        let served = common::serve::serve(&p, &[]);
        let api = get(&served.addr, "/api/status");
        assert!(api.contains(&shown), "{case}: {api}");
        said.push(("/api/status", api));
        said.push(("/", get(&served.addr, "/")));
        said.push(("/metrics", get(&served.addr, "/metrics")));
    }

    for (what, text) in &said {
        clean(&format!("{case}: {what}"), text, SECRET);
    }
    assert!(
        no_file_holds(&p, SECRET) > 0,
        "{case}: the store was scanned"
    );
    assert!(p.exists(".highwater/osm/store.db"), "{case}");
}

#[test]
fn credentials_in_the_config_url_are_used_and_never_shown_or_stored() {
    check("[osm] replication_url", "replication_url = \"@URL@\"");
}

#[test]
fn credentials_in_the_named_variable_are_used_and_never_shown_or_stored() {
    check(
        "[osm] replication_url_env",
        &format!("replication_url_env = \"{VAR}\""),
    );
}

/// A store written before URLs were redacted holds the secret in its
/// replication log and its extract's URL: opened once, no row, no byte
/// of the file or its -wal holds it, and status never showed it.
#[test]
fn a_store_that_holds_a_secret_from_before_is_scrubbed_when_opened() {
    let old = "0ld-St0red-S3cret";
    let p = Project::new(&config(""));
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    {
        let c = rusqlite::Connection::open(p.path(".highwater/osm/store.db")).unwrap();
        for seq in 3048..3077 {
            c.execute(
                "INSERT INTO replication_log(sequence, url, sha256, timestamp, applied_at_ns) VALUES(?1, ?2, 'x', '2021-08-01T00:00:00Z', 1)",
                rusqlite::params![seq, format!("http://mapper:{old}@127.0.0.1:9/replication/000/003/{:03}.osc.gz", seq - 3000)],
            )
            .unwrap();
        }
        c.execute(
            "UPDATE meta SET value = ?1 WHERE key = 'replication_url'",
            [format!(
                "https://mapper:{old}@download.example/monaco-updates"
            )],
        )
        .unwrap();
    }
    let r = p.check(&["osm", "status", "--json"], 0);
    clean("status --json", &(r.stdout.clone() + &r.stderr), old);
    let v = r.json();
    assert_eq!(
        v["replication_url_from_extract"],
        "https://***@download.example/monaco-updates"
    );
    assert_eq!(
        v["replicated"][0]["url"],
        "http://***@127.0.0.1:9/replication/000/003/076.osc.gz"
    );
    let c = rusqlite::Connection::open(p.path(".highwater/osm/store.db")).unwrap();
    let left: i64 = c
        .query_row(
            "SELECT count(*) FROM replication_log WHERE url LIKE ?1",
            [format!("%{old}%")],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(left, 0);
    drop(c);
    no_file_holds(&p, old);
}
