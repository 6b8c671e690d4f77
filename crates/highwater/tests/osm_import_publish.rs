//! Issue 10, import on the operator's path: the store is built unseen and
//! published whole.
//! - An import killed after building, before publishing, leaves no store;
//!   the next import succeeds and removes the dead one's hidden file.
//! - Two first imports into one place: one store, the other refused.

use std::process::Stdio;

mod common;
use common::osm::data;
use common::*;

const CONFIG: &str = "[osm]\nstore = \"store\"\n";

fn hidden_builds(p: &Project) -> Vec<String> {
    std::fs::read_dir(p.path("store"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains("hw-new"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn issue10_a_killed_import_leaves_no_store_and_the_next_one_succeeds() {
    let p = Project::new(CONFIG);
    let pbf = data().join("monaco-3047-20210801.osm.pbf");
    let r = p
        .cmd(&["osm", "import", pbf.to_str().unwrap()])
        .env("HIGHWATER_FAILPOINT", "import-kill")
        .output()
        .unwrap();
    assert!(r.status.code().is_none(), "killed by its signal: {r:?}");
    assert!(!p.exists("store/store.db"), "nothing published");
    assert_eq!(
        hidden_builds(&p).len(),
        1,
        "the killed build's file is left"
    );
    // Commands on the store see no store, by name.
    let s = p.hw(&["osm", "status"]);
    assert_eq!(s.code, 2, "{}", s.stderr);
    assert!(s.stderr.contains("no OSM store"), "{}", s.stderr);
    p.check(&["osm", "import", pbf.to_str().unwrap()], 0);
    assert!(hidden_builds(&p).is_empty(), "{:?}", hidden_builds(&p));
    let st = p.check(&["osm", "status", "--json"], 0).json();
    assert_eq!(st["sequence"], 3047);
}

#[test]
fn issue10_two_first_imports_make_one_store_and_refuse_the_other() {
    let p = Project::new(CONFIG);
    let first = data().join("monaco-2787-20201109.osm.pbf");
    let second = data().join("monaco-3047-20210801.osm.pbf");
    let gate = p.path("gate");
    std::fs::write(&gate, "").unwrap();
    // The first builds, then waits at the gate before publishing.
    let held = p
        .cmd(&["osm", "import", first.to_str().unwrap()])
        .env("HIGHWATER_FAILPOINT", "import-gate")
        .env("HIGHWATER_FAILPOINT_GATE", &gate)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until it has built (its hidden file is there and it waits).
    let t0 = std::time::Instant::now();
    while hidden_builds(&p).is_empty() && t0.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        !hidden_builds(&p).is_empty(),
        "the first import never built"
    );
    // The second runs whole meanwhile and publishes its store.
    p.check(&["osm", "import", second.to_str().unwrap()], 0);
    std::fs::remove_file(&gate).unwrap();
    let out = held.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("another import made a store here"),
        "{stderr}"
    );
    // The published store is the second's, untouched.
    assert_eq!(
        p.check(&["osm", "status", "--json"], 0).json()["sequence"],
        3047
    );
    assert!(hidden_builds(&p).is_empty(), "{:?}", hidden_builds(&p));
}
