//! Replication faults each classified by what they are (issue 20, items 17
//! and 18), against loopback servers the test owns: a `state.txt` naming a
//! far-future sequence the server does not serve (not "gone"), redirects
//! (followed only to http(s), `file://` refused at once by name, loops
//! bounded), and a diff that inflates without bound (refused at
//! `--max-diff-mb` while unpacking, naming the file, nothing applied).

mod common;
use common::front::{response, Front};
use common::http::ReplicationServer;
use common::osm::*;
use common::*;
use std::io::Write;
use std::process::Stdio;

fn config(url: &str) -> String {
    format!(
        r#"
[osm]
store = ".highwater/osm"
replication_url = "{url}"
replication_retries_max = 2
replication_backoff_ms = 20
replication_timeout_s = 5

[osm.tiles.base]
zooms = "12-13"
keys = ["building", "highway"]
tiles_affected_max = 1000000
"#
    )
}

fn imported(url: &str) -> Project {
    let p = Project::new(&config(url));
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    p
}

fn sequence(p: &Project) -> serde_json::Value {
    p.check(&["osm", "status", "--json"], 0).json()["sequence"].clone()
}

/// What one case expects: the exit code, words that must and must not be
/// in stderr, and the store's sequence afterwards.
struct Want {
    code: i32,
    says: &'static [&'static str],
    never: &'static [&'static str],
    sequence: i64,
}

/// Runs `osm replicate ARGS` in `p` and checks its exit and stderr
/// against `want`.
fn replicate(case: &str, p: &Project, args: &[&str], want: &Want) -> Ran {
    let mut a = vec!["osm", "replicate"];
    a.extend_from_slice(args);
    let r = p.hw(&a);
    assert_eq!(
        r.code, want.code,
        "{case}: exit {}\nstdout:\n{}\nstderr:\n{}",
        r.code, r.stdout, r.stderr
    );
    for w in want.says {
        assert!(r.stderr.contains(w), "{case}: {w:?} not in:\n{}", r.stderr);
    }
    for w in want.never {
        assert!(!r.stderr.contains(w), "{case}: {w:?} in:\n{}", r.stderr);
    }
    r
}

/// [`replicate`], then the store's sequence against `want`.
fn check(case: &str, p: &Project, args: &[&str], want: &Want) {
    replicate(case, p, args, want);
    assert_eq!(sequence(p), want.sequence, "{case}");
}

/// A `state.txt` that names sequence 900000000 is only "gone" when the
/// server really serves that sequence and not the store's. Served neither:
/// exit 1 (the next run tries again), never the advice to re-import.
#[test]
fn a_far_future_state_whose_diffs_all_404_is_not_read_as_gone() {
    let far = b"sequenceNumber=900000000\ntimestamp=2031-08-30T20\\:21\\:43Z\n";
    let cases: [(&str, i64, i64, bool, Want); 3] = [
        (
            "far-future state.txt, neither it nor the store's sequence served",
            3076,
            3060,
            true,
            Want {
                code: 1,
                says: &[
                    "names sequence 900000000",
                    "neither it nor the store's next, 3048",
                    "nothing was applied",
                ],
                never: &["no longer keeps", "--replace"],
                sequence: 3047,
            },
        ),
        (
            "far-future state.txt over a server that has the store's range",
            3076,
            3000,
            true,
            Want {
                code: 1,
                says: &["000/003/077.state.txt: not on the server (404)"],
                never: &["no longer keeps"],
                sequence: 3076,
            },
        ),
        (
            "the server really dropped the store's next sequence: gone",
            3076,
            3060,
            false,
            Want {
                code: 2,
                says: &["no longer keeps sequence 3048", "--replace"],
                never: &["neither"],
                sequence: 3047,
            },
        ),
    ];
    for (case, top, oldest, far_state, want) in cases {
        let s = ReplicationServer::start(data().join("monaco-updates"), top, oldest);
        if far_state {
            s.body("state.txt", far);
        }
        let p = imported(&s.url);
        check(case, &p, &[], &want);
    }
}

/// Redirects: to http(s) followed (a mirror that moved); to `file://` or
/// any other scheme refused at once, naming it, after one request and no
/// retry; a loop ends after a bounded number.
#[test]
fn redirects_are_followed_only_to_http_and_a_file_url_is_refused_at_once() {
    let upstream = ReplicationServer::start(data().join("monaco-updates"), 3076, 3000);
    let up = upstream.url.clone();
    type Rule = Box<dyn Fn(&str, &str) -> Vec<u8> + Send + Sync>;
    let cases: Vec<(&str, Rule, Want, usize)> = vec![
        (
            "to the mirror over http: followed",
            Box::new(move |_, path| {
                let to = format!("{}{}", up.trim_end_matches("/replication"), path);
                response("301 Moved Permanently", &[("Location", &to)], b"")
            }),
            Want {
                code: 0,
                says: &[],
                never: &["redirect"],
                sequence: 3076,
            },
            29,
        ),
        (
            "to file://",
            Box::new(|_, _| response("302 Found", &[("Location", "file:///etc/passwd")], b"")),
            Want {
                code: 2,
                says: &[
                    "state.txt",
                    "redirects to file:///etc/passwd (file:)",
                    "only http:// and https:// redirects are followed",
                ],
                never: &["not on the server", "attempts"],
                sequence: 3047,
            },
            1,
        ),
        (
            "to ftp://",
            Box::new(|_, _| {
                response(
                    "307 Temporary Redirect",
                    &[("Location", "ftp://mirror.example/x")],
                    b"",
                )
            }),
            Want {
                code: 2,
                says: &[
                    "redirects to ftp://mirror.example/x (ftp:)",
                    "only http:// and https://",
                ],
                never: &["attempts"],
                sequence: 3047,
            },
            1,
        ),
        (
            "a loop",
            Box::new(|front, path| {
                let to = format!("{front}{path}");
                response("302 Found", &[("Location", &to)], b"")
            }),
            Want {
                code: 2,
                says: &["more than 5 redirects"],
                never: &["attempts"],
                sequence: 3047,
            },
            6,
        ),
    ];
    for (case, rule, want, state_requests) in cases {
        // The front learns its own URL once started, for the loop.
        let own = std::sync::Arc::new(std::sync::OnceLock::<String>::new());
        let me = own.clone();
        let front = Front::start(move |req| rule(me.get().unwrap(), &req.path));
        own.set(front.url.clone()).unwrap();
        let p = imported(&format!("{}/replication", front.url));
        replicate(case, &p, &[], &want);
        // Refused: the top state.txt asked once (a loop: once per hop),
        // never retried. Followed: every diff fetched once.
        if want.code == 0 {
            assert_eq!(front.requests(".osc.gz"), state_requests, "{case}");
        } else {
            let asked = front.requests("/replication/state.txt");
            assert_eq!(asked, state_requests, "{case}: requests of state.txt");
        }
        assert_eq!(sequence(&p), want.sequence, "{case}");
    }
}

/// `gzip -c` of `body`: a few KB that unpack to `body`'s size.
fn gzip(body: &[u8]) -> Vec<u8> {
    let mut c = std::process::Command::new("gzip")
        .arg("-c")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("gzip runs");
    let mut input = c.stdin.take().unwrap();
    let body = body.to_vec();
    let feeder = std::thread::spawn(move || input.write_all(&body).unwrap());
    let out = c.wait_with_output().unwrap();
    feeder.join().unwrap();
    assert!(out.status.success());
    out.stdout
}

/// A well-formed osmChange that unpacks to about `mb` MB: `filler` bytes
/// (whitespace, or a comment) inside a modify block, then one real change.
/// Well-formed on purpose: the parser alone would accept it, so only the
/// unpacked-size limit can stop it.
fn bomb(mb: usize, comment: bool) -> Vec<u8> {
    let mut x =
        b"<?xml version='1.0' encoding='UTF-8'?>\n<osmChange version=\"0.6\">\n<modify>\n".to_vec();
    if comment {
        x.extend_from_slice(b"<!--");
        x.extend(vec![b'A'; mb << 20]);
        x.extend_from_slice(b"-->\n");
    } else {
        x.extend(vec![b' '; mb << 20]);
    }
    x.extend_from_slice(
        b"<node id=\"1\" version=\"99\" lat=\"43.73\" lon=\"7.42\"/>\n</modify>\n</osmChange>\n",
    );
    let gz = gzip(&x);
    assert!(
        gz.len() < (mb << 20) / 100,
        "a bomb: {} bytes packed",
        gz.len()
    );
    gz
}

/// A diff that unpacks to 24 MB from a few KB, with `--max-diff-mb 2`: over
/// HTTP and from a local folder, refused at the limit naming the file, with
/// nothing applied (and over HTTP not fetched a second time: a bomb is not
/// a transient fault). A real diff under the limit still applies.
#[test]
fn a_diff_that_inflates_past_max_diff_mb_is_refused_naming_it() {
    let limit = ["--max-diff-mb", "2"];
    for comment in [false, true] {
        let case = if comment {
            "HTTP, a giant comment"
        } else {
            "HTTP, whitespace"
        };
        let s = ReplicationServer::start(data().join("monaco-updates"), 3050, 3000);
        s.body("000/003/049.osc.gz", &bomb(24, comment));
        let p = imported(&s.url);
        check(
            case,
            &p,
            &limit,
            &Want {
                code: 2,
                says: &[
                    "000/003/049.osc.gz",
                    "unpacks to more than --max-diff-mb = 2 MB",
                    "nothing of it was applied",
                ],
                never: &["fetched twice"],
                // 3048 before it is applied; nothing of the bomb is.
                sequence: 3048,
            },
        );
        assert_eq!(s.requests("000/003/049.osc.gz"), 1, "{case}");
        assert!(!p.exists(".highwater/osm/.fetch"), "{case}: cache emptied");
    }

    // A local replication folder: the same limit, the file named.
    let s = ReplicationServer::start(data().join("monaco-updates"), 3050, 3000);
    let p = imported(&s.url);
    let src = data().join("monaco-updates/000/003");
    std::fs::create_dir_all(p.path("updates/000/003")).unwrap();
    for f in ["048.osc.gz", "048.state.txt", "049.state.txt"] {
        std::fs::copy(src.join(f), p.path(&format!("updates/000/003/{f}"))).unwrap();
    }
    std::fs::write(p.path("updates/000/003/049.osc.gz"), bomb(24, false)).unwrap();
    check(
        "a local folder",
        &p,
        &["--from", "updates", "--max-diff-mb", "2"],
        &Want {
            code: 2,
            says: &[
                "updates/000/003/049.osc.gz",
                "unpacks to more than 2 MB",
                "--max-diff-mb",
            ],
            never: &[],
            // Read before anything applies: the whole folder is refused.
            sequence: 3047,
        },
    );

    // Real diffs, all under the limit: applied.
    let s = ReplicationServer::start(data().join("monaco-updates"), 3076, 3000);
    let p = imported(&s.url);
    check(
        "real diffs under the limit",
        &p,
        &limit,
        &Want {
            code: 0,
            says: &[],
            never: &[],
            sequence: 3076,
        },
    );
}
