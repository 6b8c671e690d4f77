//! Issue 20: `highwater serve` against hostile clients and faults around
//! it, over loopback with raw TCP sockets: idle and half-sent connections
//! past the descriptor limit, a replication server that hangs, impossible
//! tile coordinates, a forged Host header, `If-None-Match` lists and `*`,
//! and a missing OSM store.

mod common;
use common::http::{Fault, ReplicationServer};
use common::osm::data;
use common::serve::{serve, serve_cmd, Served};
use common::*;
use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

/// How long a test waits on one socket before calling it stuck: a bound
/// on a hang, not a measure of speed.
const STUCK: Duration = Duration::from_secs(120);

struct Reply {
    code: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

/// One request on a fresh connection (`Connection: close`), with `Host:
/// host` and the extra headers.
fn get(addr: &str, path: &str, host: &str, headers: &[(&str, &str)]) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(STUCK)).unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    parse(&raw)
}

fn parse(raw: &[u8]) -> Reply {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let code = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let mut headers = BTreeMap::new();
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let body = String::from_utf8_lossy(&raw[split + 4..]).into_owned();
    Reply {
        code,
        headers,
        body,
    }
}

fn ok(addr: &str, path: &str) -> String {
    let r = get(addr, path, "127.0.0.1", &[]);
    assert_eq!(r.code, 200, "GET {path}: {}", r.body);
    r.body
}

/// `serve` under `ulimit -n nofile`, with the extra flags.
fn serve_limited(p: &Project, nofile: u32, extra: &[&str]) -> Served {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(format!("ulimit -n {nofile} && exec \"$0\" \"$@\""))
        .arg(bin())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(extra)
        .current_dir(p.dir.path())
        .stdin(Stdio::null());
    serve_cmd(c)
}

/// Whether the server closed `s` (EOF or reset) before `STUCK`.
fn closed(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(STUCK)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            // A response (a 408 or the like) before the close is fine.
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// Whether the server has closed `s` already (no waiting).
fn closed_now(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    let r = (&*s).read(&mut b);
    s.set_nonblocking(false).unwrap();
    !matches!(r, Err(ref e) if e.kind() == ErrorKind::WouldBlock)
}

/// A connection that sends nothing, and one that sends half a head.
fn idle(addr: &str) -> TcpStream {
    TcpStream::connect(addr).unwrap()
}

fn half_sent(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /api/status HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .unwrap();
    s
}

/// More idle and half-sent connections than the process has descriptors:
/// a normal request still answers (the longest-waiting connection makes
/// room), and the limit, derived from RLIMIT_NOFILE, is logged. The
/// timeouts are long here, so only the limit can have made the room.
#[test]
fn serve_answers_past_more_idle_and_half_sent_connections_than_descriptors() {
    let p = Project::new(&upper_config(""));
    let s = serve_limited(
        &p,
        256,
        &["--idle-timeout-s", "600", "--header-read-timeout-s", "600"],
    );
    let mut hostile: Vec<TcpStream> = (0..200).map(|_| idle(&s.addr)).collect();
    hostile.extend((0..100).map(|_| half_sent(&s.addr)));
    let body = ok(&s.addr, "/api/status");
    let st: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(st["stages"], serde_json::json!([]), "{st}");
    // And again, with the hostile ones still open (those not closed).
    assert!(ok(&s.addr, "/metrics").contains("highwater_build_info"));
    let log = s.log();
    assert!(
        log.contains("RLIMIT_NOFILE 256") && log.contains("the connection limit is reached"),
        "{log}"
    );
    // The limit closed some of them to make room.
    let gone = hostile.iter_mut().filter(|h| closed_now(h)).count();
    assert!(gone > 0, "none of the hostile connections was closed");
}

/// Each timeout closes what it is for: an idle connection (before a
/// request, and after one on keep-alive) after the idle timeout, a
/// half-sent head after the header-read timeout.
#[test]
fn serve_closes_idle_and_half_sent_connections_after_their_timeouts() {
    let p = Project::new(&upper_config(""));
    // Idle: short; heads: long. Idle connections, and one that asked once.
    let s = serve(
        &p,
        &["--idle-timeout-s", "1", "--header-read-timeout-s", "600"],
    );
    let mut conns: Vec<TcpStream> = (0..20).map(|_| idle(&s.addr)).collect();
    let mut kept = TcpStream::connect(&s.addr).unwrap();
    kept.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    conns.push(kept);
    for (i, c) in conns.iter_mut().enumerate() {
        assert!(closed(c), "idle connection {i} is still open");
    }
    drop(s);
    // Heads: short; idle: long.
    let s = serve(
        &p,
        &["--idle-timeout-s", "600", "--header-read-timeout-s", "1"],
    );
    let mut conns: Vec<TcpStream> = (0..20).map(|_| half_sent(&s.addr)).collect();
    for (i, c) in conns.iter_mut().enumerate() {
        assert!(closed(c), "half-sent connection {i} is still open");
    }
    // The server still answers.
    ok(&s.addr, "/");
}

/// SIGTERM stops serve cleanly while idle and half-sent connections are
/// open: they hold no request, so they do not hold the stop until their
/// (here long) timeouts.
#[test]
fn serve_stops_on_sigterm_past_idle_and_half_sent_connections() {
    let p = Project::new(&upper_config(""));
    let mut s = serve(
        &p,
        &[
            "--idle-timeout-s",
            "3600",
            "--header-read-timeout-s",
            "3600",
        ],
    );
    let mut conns: Vec<TcpStream> = (0..10).map(|_| idle(&s.addr)).collect();
    conns.extend((0..10).map(|_| half_sent(&s.addr)));
    ok(&s.addr, "/");
    assert_eq!(s.terminate(STUCK), Some(0), "{}", s.log());
    for (i, c) in conns.iter_mut().enumerate() {
        assert!(closed(c), "connection {i} is still open");
    }
}

/// Out-of-range limits are refused before serving.
#[test]
fn serve_refuses_limits_that_do_not_fit() {
    let p = Project::new(&upper_config(""));
    for (args, says) in [
        (vec!["--idle-timeout-s", "0"], "--idle-timeout-s 0"),
        (vec!["--header-read-timeout-s", "99999"], "give 1 to 3600"),
        (vec!["--connections-max", "1000000"], "raise `ulimit -n`"),
        (vec!["--public-url", "https://u:p@example.org"], "user info"),
    ] {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg("ulimit -n 1024 && exec \"$0\" \"$@\"")
            .arg(bin())
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(&args)
            .current_dir(p.dir.path())
            .stdin(Stdio::null());
        let out = c.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

fn osm_config(extra: &str) -> String {
    format!(
        r#"
[osm]
store = ".highwater/osm"
{extra}

[osm.tiles.base]
schema = "shortbread"
zooms = "12-14"
mbtiles = "tiles/base.mbtiles"
"#
    )
}

/// The status pages while the replication server hangs: they answer, from
/// the background check's cache with its age, and scrapes send nothing
/// upstream.
#[test]
fn serve_status_pages_never_wait_on_a_hanging_replication_server() {
    let rs = ReplicationServer::start(data().join("monaco-updates"), 3050, 3000);
    rs.fault("state.txt", &[Fault::Hang(Duration::from_secs(3600))]);
    let p = Project::new(&osm_config(&format!(
        "replication_url = \"{}\"\nreplication_timeout_s = 10",
        rs.url
    )));
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    let s = serve(&p, &["--refresh-s", "3600"]);
    // The background check has asked, and hangs.
    while rs.requests("state.txt") == 0 {
        std::thread::sleep(Duration::from_millis(20));
    }
    let first: serde_json::Value = serde_json::from_str(&ok(&s.addr, "/api/status")).unwrap();
    assert_eq!(first["osm"]["sequence"], 3047, "{first}");
    assert_eq!(first["osm"]["server"]["url"], rs.url.as_str(), "{first}");
    assert!(first["osm"]["server"]["checked_at"].is_null(), "{first}");
    assert!(ok(&s.addr, "/").contains("the first check is under way"));
    for _ in 0..5 {
        for path in ["/", "/metrics", "/api/status"] {
            ok(&s.addr, path);
        }
    }
    // Once the check times out, the pages say so, and how old it is.
    let st = loop {
        let st: serde_json::Value = serde_json::from_str(&ok(&s.addr, "/api/status")).unwrap();
        if !st["osm"]["server"]["checked_at"].is_null() {
            break st;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let sv = &st["osm"]["server"];
    assert!(sv["error"].is_string(), "{st}");
    assert!(sv["age_s"].is_i64(), "{st}");
    let page = ok(&s.addr, "/");
    assert!(
        page.contains("unreachable") && page.contains("s ago"),
        "{page}"
    );
    let metrics = ok(&s.addr, "/metrics");
    assert!(metrics.contains("highwater_osm_server_up 0"), "{metrics}");
    assert!(
        metrics.contains("highwater_osm_server_check_age_seconds "),
        "{metrics}"
    );
    assert!(metrics.contains("highwater_osm_store_up 1"), "{metrics}");
    assert_eq!(
        rs.requests("state.txt"),
        1,
        "every scrape answered from the cache: one upstream request in all"
    );
}

/// The tile endpoints: impossible coordinates are 404 (or 400 when they do
/// not parse), TileJSON and the style carry no Host, and `If-None-Match`
/// takes `*` and lists with weak tags.
#[test]
fn serve_tiles_refuse_impossible_coordinates_forged_hosts_and_honour_etag_lists() {
    let p = Project::new(&osm_config(""));
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    p.check(&["osm", "tiles", "build"], 0);
    let mb = rusqlite::Connection::open_with_flags(
        p.path("tiles/base.mbtiles"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let (x, row): (u32, u32) = mb
        .query_row(
            "SELECT tile_column, tile_row FROM tiles WHERE zoom_level = 14 LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    let y = (1 << 14) - 1 - row;
    let s = serve(&p, &[]);
    let there = format!("/tiles/base/14/{x}/{y}.pbf");

    // Coordinates, in; status, out.
    for (path, want) in [
        (there.as_str(), 200),
        ("/tiles/base/14/0/0.pbf", 204),
        ("/tiles/base/99/0/0.pbf", 404),
        ("/tiles/base/21/0/0.pbf", 404),
        ("/tiles/base/2/4/0.pbf", 404),
        ("/tiles/base/2/0/4.pbf", 404),
        ("/tiles/base/14/16384/0.pbf", 404),
        ("/tiles/base/3/0/0.pbf", 404),
        ("/tiles/base/15/0/0.pbf", 404),
        ("/tiles/base/300/0/0.pbf", 400),
        ("/tiles/base/1/0/99999999999.pbf", 404),
    ] {
        let r = get(&s.addr, path, "127.0.0.1", &[]);
        assert_eq!(r.code, want, "GET {path}: {}", r.body);
    }

    // A forged Host is never copied into what a shared cache would keep.
    let evil = "evil.example:666";
    for path in ["/tiles/base.json", "/tiles/base/style.json"] {
        let r = get(&s.addr, path, evil, &[]);
        assert_eq!(r.code, 200, "{path}: {}", r.body);
        assert!(!r.body.contains("evil.example"), "{path}: {}", r.body);
    }
    // Without --public-url, absolute URLs from the address listened on
    // (issue 50).
    let tj: serde_json::Value =
        serde_json::from_str(&get(&s.addr, "/tiles/base.json", evil, &[]).body).unwrap();
    assert_eq!(
        tj["tiles"][0],
        format!("http://{}/tiles/base/{{z}}/{{x}}/{{y}}.pbf", s.addr)
    );
    let style: serde_json::Value =
        serde_json::from_str(&get(&s.addr, "/tiles/base/style.json", evil, &[]).body).unwrap();
    assert_eq!(
        style["sources"]["versatiles-shortbread"]["url"],
        format!("http://{}/tiles/base.json", s.addr)
    );

    // If-None-Match, in; status, out.
    let etag = get(&s.addr, &there, "127.0.0.1", &[]).headers["etag"].clone();
    let weak = format!("W/{etag}");
    let list = format!("\"nope\", {etag}");
    let weak_list = format!("\"nope\",{weak} , \"other\"");
    for (field, want) in [
        (etag.as_str(), 304),
        ("*", 304),
        (weak.as_str(), 304),
        (list.as_str(), 304),
        (weak_list.as_str(), 304),
        ("\"nope\", \"other\"", 200),
        ("W/\"nope\"", 200),
    ] {
        let r = get(&s.addr, &there, "127.0.0.1", &[("If-None-Match", field)]);
        assert_eq!(r.code, want, "If-None-Match: {field}");
        if want == 304 {
            assert_eq!(r.headers["etag"], etag, "a 304 carries the ETag");
        }
    }
    drop(s);

    // With a public URL, absolute URLs under it; still never the Host.
    let s = serve(&p, &["--public-url", "https://maps.example.org/hw/"]);
    let tj: serde_json::Value =
        serde_json::from_str(&get(&s.addr, "/tiles/base.json", evil, &[]).body).unwrap();
    assert_eq!(
        tj["tiles"][0],
        "https://maps.example.org/hw/tiles/base/{z}/{x}/{y}.pbf"
    );
    let style = get(&s.addr, "/tiles/base/style.json", evil, &[]).body;
    assert!(
        style.contains("\"https://maps.example.org/hw/tiles/base.json\""),
        "{style}"
    );
    let m = ok(&s.addr, "/metrics");
    assert!(m.contains("highwater_osm_store_up 1"), "{m}");
}

/// A configured OSM store that is missing is named, with the fix, on every
/// surface: the startup log, `/`, `/map`, `/api/status` and `/metrics`.
#[test]
fn serve_names_a_missing_osm_store_and_its_fix_everywhere() {
    let p = Project::new(&osm_config(""));
    let s = serve(&p, &[]);
    let store = p.path(".highwater/osm").display().to_string();
    let fix = "highwater osm import";
    let st: serde_json::Value = serde_json::from_str(&ok(&s.addr, "/api/status")).unwrap();
    let err = st["osm"]["error"]
        .as_str()
        .unwrap_or_else(|| panic!("{st}"));
    assert!(err.contains(&store) && err.contains(fix), "{st}");
    assert!(
        st["errors"].as_array().unwrap().iter().any(|e| e == err),
        "{st}"
    );
    // Surface, in; what it must say, out.
    for (surface, text) in [
        ("the startup log", s.log()),
        ("/", ok(&s.addr, "/")),
        ("/map", ok(&s.addr, "/map")),
    ] {
        assert!(
            text.contains(&store) && text.contains(fix),
            "{surface}: {text}"
        );
    }
    let map = ok(&s.addr, "/map");
    assert!(map.contains("osm tiles build"), "{map}");
    let m = ok(&s.addr, "/metrics");
    assert!(m.contains("highwater_osm_store_up 0"), "{m}");
    let scrape = prometheus_parse::Scrape::parse(m.lines().map(|l| Ok(l.to_string()))).unwrap();
    assert!(scrape.docs.contains_key("highwater_osm_store_up"));
}

/// Issue 50: a store that took a diff without a state file follows no
/// replication sequence: `/` says so and what to do, its lag against the
/// server is "unknown" (not a green "0 s", though the timestamps agree),
/// and /metrics counts the unsequenced diffs.
#[test]
fn an_unsequenced_store_is_said_and_explained_not_shown_as_lag_0() {
    // The server's newest is the store's own sequence: lag 0 by timestamp.
    let rs = ReplicationServer::start(data().join("monaco-updates"), 3047, 3000);
    let p = Project::new(&osm_config(&format!(
        "replication_url = \"{}\"\nreplication_timeout_s = 10",
        rs.url
    )));
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    p.check(&["osm", "tiles", "build"], 0);
    p.write("empty.osc", "<osmChange version=\"0.6\"></osmChange>");
    p.check(&["osm", "apply", "empty.osc"], 0);
    let s = serve(&p, &[]);
    let st = loop {
        let st: serde_json::Value = serde_json::from_str(&ok(&s.addr, "/api/status")).unwrap();
        if !st["osm"]["server"]["checked_at"].is_null() {
            break st;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(st["osm"]["unsequenced"], 1, "{st}");
    assert_eq!(st["osm"]["server"]["sequence"], 3047, "{st}");
    assert!(st["osm"]["server"]["lag_s"].is_null(), "{st}");
    let page = ok(&s.addr, "/");
    assert!(page.contains("lag-unknown"), "{page}");
    assert!(!page.contains(">0 s<"), "{page}");
    assert!(
        page.contains("osm-unsequenced")
            && page.contains("no longer follows a replication sequence")
            && page.contains("--replace"),
        "{page}"
    );
    let m = ok(&s.addr, "/metrics");
    assert!(m.contains("highwater_osm_unsequenced_diffs 1"), "{m}");
}
