//! Observed dependencies on a fleet (issue 24): each item is observed where
//! it runs, its dependency set recorded with its entry; and two machines
//! that see different files at one path outside the project (another
//! Python) never take turns re-running the items.
//!
//! Two machines are made on this one: each process runs in its own mount
//! and UTS namespace (`unshare -m -u`), with its own host name and its own
//! tool bind-mounted at one path outside the project, on PATH. The project
//! and the PostgreSQL state are shared, as on a real fleet.

mod common;

use common::fleet::count;
use common::ingest::{pg_database, pg_serial};
use common::Project;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const CONFIG: &str = r#"
[state]
url_env = "HIGHWATER_STATE_URL"
lease_duration_s = 5

[stages.t]
inputs = ["data/*.txt"]
output = "out/{relpath}.up"
command = ["tool", "{input}", "{output}"]
"#;

/// The fleet's two machines and what each sees outside the project.
struct Machines {
    _tools: tempfile::TempDir,
    /// Where each machine's tool lies, by machine name.
    own: BTreeMap<&'static str, PathBuf>,
    /// The one path both see their own tool at (on PATH).
    shared: PathBuf,
    url: String,
}

const A: &str = "hw-machine-a";
const B: &str = "hw-machine-b";

impl Machines {
    fn new(url: String) -> Machines {
        let tools = tempfile::tempdir().unwrap();
        let base = tools.path().canonicalize().unwrap();
        let shared = base.join("opt");
        std::fs::create_dir_all(&shared).unwrap();
        let mut own = BTreeMap::new();
        for m in [A, B] {
            let dir = base.join(m);
            std::fs::create_dir_all(&dir).unwrap();
            own.insert(m, dir);
        }
        let ms = Machines {
            _tools: tools,
            own,
            shared,
            url,
        };
        // Another Python on each machine: different bytes, same behaviour.
        ms.install(A, "python 3.11");
        ms.install(B, "python 3.12");
        ms
    }

    /// Writes machine `m`'s tool, which reads the project's shared table.
    fn install(&self, m: &str, version: &str) {
        self.install_with(m, version, "");
    }

    /// `install`, the tool doing `extra` first.
    fn install_with(&self, m: &str, version: &str, extra: &str) {
        let path = self.own[m].join("tool");
        std::fs::write(
            &path,
            format!("#!/bin/sh\n# {version}\n{extra}cat lib/table.txt > /dev/null\ntr a-z A-Z < \"$1\" > \"$2\"\n"),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// The tool's path as every machine records it.
    fn tool(&self) -> String {
        self.shared.join("tool").to_string_lossy().into_owned()
    }

    /// `highwater ARGS` on machine `m`: its own host name, its own tool
    /// at the shared path; the project and the state are the fleet's.
    fn command(&self, p: &Project, m: &str, args: &[&str]) -> Command {
        let inner = p.cmd(args);
        let mut c = Command::new("unshare");
        c.args(["-m", "-u", "--propagation", "private", "sh", "-c"])
            .arg(r#"set -e; hostname "$1"; mount --bind "$2" "$3"; shift 3; exec "$@""#)
            .arg("sh")
            .arg(m)
            .arg(&self.own[m])
            .arg(&self.shared)
            .arg(inner.get_program())
            .args(inner.get_args())
            .current_dir(inner.get_current_dir().unwrap())
            .env("HIGHWATER_STATE_URL", &self.url)
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    self.shared.display(),
                    std::env::var("PATH").unwrap()
                ),
            )
            .env_remove("RUST_BACKTRACE")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// `command`, run to its end: (exit code, stdout, stderr).
    fn raw(&self, p: &Project, m: &str, args: &[&str]) -> (i32, String, String) {
        let o = self
            .command(p, m, args)
            .spawn()
            .expect("unshare (util-linux) is needed by these tests")
            .wait_with_output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(
            !stderr.contains("declared only"),
            "observed on a fleet, the recipe is not declared only: {stderr}"
        );
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr,
        )
    }

    /// `raw`, asserting the exit code; the JSON it printed.
    fn hw(&self, p: &Project, m: &str, args: &[&str], code: i32) -> serde_json::Value {
        let (got, stdout, stderr) = self.raw(p, m, args);
        assert_eq!(
            got, code,
            "highwater {args:?} on {m}\nstdout:\n{stdout}\nstderr:\n{stderr}"
        );
        serde_json::from_str(&stdout).unwrap_or(serde_json::Value::Null)
    }

    /// What a run on `m` processed.
    fn run(&self, p: &Project, m: &str, extra: &[&str]) -> u64 {
        let mut args = vec!["run", "--json"];
        args.extend_from_slice(extra);
        let r = self.hw(p, m, &args, 0);
        r["stages"][0]["processed"].as_u64().unwrap()
    }

    /// A plan on `m`: item -> dependency named.
    fn plan(&self, p: &Project, m: &str) -> BTreeMap<String, Option<String>> {
        let v = self.hw(p, m, &["plan", "--json"], 0);
        v["stages"][0]["changed"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["input"].as_str().unwrap().to_string(),
                    c["dependency"].as_str().map(str::to_string),
                )
            })
            .collect()
    }
}

fn items(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("data/f{i:02}.txt")).collect()
}

fn made_on(db: &mut postgres::Client, m: &str) -> i64 {
    count(
        db,
        &format!(
            "SELECT count(*) FROM item_deps d JOIN dep_sets s ON s.id = d.set_id
             WHERE s.body LIKE '%\"host\":\"{m}\"%'"
        ),
    )
}

fn outputs_upper(p: &Project, all: &[String]) {
    for i in all {
        let name = Path::new(i).file_name().unwrap().to_string_lossy();
        let out = p.read(&format!("out/{name}.up"));
        assert_eq!(out, p.read(i).to_uppercase(), "{i}");
    }
}

/// Items made on two machines whose tools differ at one path: every plan,
/// on either machine, leaves them alone (no ping-pong); an upgrade on one
/// machine re-runs exactly what was made there, named, when that machine
/// plans, and the guard stops it like any mass re-run; an edit inside the
/// project, which the fleet shares, re-runs every item from either plan.
#[test]
fn two_machines_with_different_tools_never_take_turns() {
    let _g = pg_serial();
    let (mut db, url) = pg_database("fleetdeps");
    let ms = Machines::new(url);
    let p = Project::new(CONFIG);
    p.write("lib/table.txt", "v1\n");
    for i in items(0..20) {
        p.write(&i, &format!("item {i}\n"));
    }
    // Machine a makes 20 items, machine b the 10 delivered after.
    assert_eq!(ms.run(&p, A, &[]), 20);
    assert_eq!(count(&mut db, "SELECT count(*) FROM item_deps"), 20);
    for i in items(20..30) {
        p.write(&i, &format!("item {i}\n"));
    }
    assert_eq!(ms.run(&p, B, &[]), 10);
    assert_eq!(count(&mut db, "SELECT count(*) FROM item_deps"), 30);
    assert_eq!((made_on(&mut db, A), made_on(&mut db, B)), (20, 10));
    outputs_upper(&p, &items(0..30));

    // Alternating plans and runs: nothing to do, on either machine.
    for _ in 0..2 {
        for m in [A, B] {
            assert_eq!(ms.plan(&p, m), BTreeMap::new(), "plan on {m}");
            assert_eq!(ms.run(&p, m, &[]), 0, "run on {m}");
        }
    }
    // `deps` on b says where a's tool was recorded, and that it is not
    // checked here; the shared table is.
    let d = ms.hw(&p, B, &["deps", "t", "data/f00.txt", "--json"], 0);
    let rows = d["items"][0]["deps"].as_array().unwrap().clone();
    let tool = ms.tool();
    let row = |path: &str| {
        rows.iter()
            .find(|r| r["path"] == path)
            .unwrap_or_else(|| panic!("no {path} in {rows:?}"))
            .clone()
    };
    assert_eq!(row(&tool)["recorded_on"], A, "{rows:?}");
    assert!(
        row("lib/table.txt").get("recorded_on").is_none(),
        "{rows:?}"
    );

    // Machine a upgrades its tool. b's plans cannot see it; a's plan
    // re-runs exactly a's 20 items, naming the tool, and the guard stops
    // that mass re-run with the reason named.
    ms.install(A, "python 3.13");
    assert_eq!(ms.plan(&p, B), BTreeMap::new());
    let want: BTreeMap<String, Option<String>> = items(0..20)
        .into_iter()
        .map(|i| (i, Some(tool.clone())))
        .collect();
    assert_eq!(ms.plan(&p, A), want);
    let (code, _, stderr) = ms.raw(&p, A, &["run"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains(&format!("dependency {tool}")), "{stderr}");
    assert_eq!(ms.run(&p, A, &["--force"]), 20);
    for m in [B, A, B, A] {
        assert_eq!(ms.run(&p, m, &[]), 0, "run on {m}");
    }

    // The project's files are the fleet's: a table edit re-runs every
    // item, wherever it was made, from either machine's plan.
    p.write("lib/table.txt", "v2\n");
    let every: BTreeMap<String, Option<String>> = items(0..30)
        .into_iter()
        .map(|i| (i, Some("lib/table.txt".to_string())))
        .collect();
    assert_eq!(ms.plan(&p, A), every);
    assert_eq!(ms.plan(&p, B), every);
    assert_eq!(ms.run(&p, B, &["--force"]), 30);
    assert_eq!((made_on(&mut db, A), made_on(&mut db, B)), (0, 30));
    for m in [A, B, A] {
        assert_eq!(ms.run(&p, m, &[]), 0, "run on {m}");
    }
    outputs_upper(&p, &items(0..30));
    // The sets the re-runs replaced were pruned by the planners.
    assert_eq!(
        count(&mut db, "SELECT count(*) FROM dep_sets"),
        count(&mut db, "SELECT count(DISTINCT set_id) FROM item_deps")
    );
}

/// Both machines at once on one plan, each item recorded where it ran: then
/// no plan on either machine re-runs anything. Machine a's first item waits
/// until machine b has started one (a marker outside the project), so the
/// items are split between them whatever the scheduling.
#[test]
fn one_plan_run_by_two_machines_at_once_settles() {
    let _g = pg_serial();
    let (mut db, url) = pg_database("fleetsplit");
    let ms = Machines::new(url);
    let marker = ms.shared.parent().unwrap().join("b-started");
    let m = marker.display();
    // The marker is the test's, not the recipe's: ignored, so that b's
    // write of it is nobody's dependency.
    let p = Project::new(&format!(
        "{}observe_ignore = [\"{m}\"]\n",
        CONFIG.replace(
            "lease_duration_s = 5",
            "lease_duration_s = 5\nclaim_batch_max = 2"
        )
    ));
    // Two minutes at most, so that a broken run ends (a bound, not a
    // measure of speed); the assertions below say whether b took part.
    ms.install_with(
        A,
        "python 3.11",
        &format!("n=0; while [ ! -e {m} ] && [ $n -lt 1200 ]; do sleep 0.1; n=$((n+1)); done\n"),
    );
    ms.install_with(B, "python 3.12", &format!(": > {m}\n"));
    p.write("lib/table.txt", "v1\n");
    for i in items(0..24) {
        p.write(&i, &format!("item {i}\n"));
    }
    let a = ms.command(&p, A, &["run", "--json"]).spawn().unwrap();
    // b starts once a has queued the plan: it joins rather than plans.
    // (The table is made by a's first open of the store.)
    common::fleet::wait_for("a's plan", || {
        db.query_one("SELECT count(*) FROM work", &[])
            .is_ok_and(|r| r.get::<_, i64>(0) > 0)
    });
    let b = ms.command(&p, B, &["run", "--json"]).spawn().unwrap();
    let mut processed = BTreeMap::new();
    for (m, child) in [(A, a), (B, b)] {
        let o = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{m}: {stderr}");
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        processed.insert(m, v["stages"][0]["processed"].as_u64().unwrap());
    }
    assert_eq!(processed[A] + processed[B], 24, "{processed:?}");
    assert!(processed[A] > 0 && processed[B] > 0, "{processed:?}");
    assert_eq!(count(&mut db, "SELECT count(*) FROM item_deps"), 24);
    assert_eq!(
        (made_on(&mut db, A), made_on(&mut db, B)),
        (processed[A] as i64, processed[B] as i64)
    );
    outputs_upper(&p, &items(0..24));
    for m in [A, B, A, B] {
        assert_eq!(ms.plan(&p, m), BTreeMap::new(), "plan on {m}");
        assert_eq!(ms.run(&p, m, &[]), 0, "run on {m}");
    }
}
