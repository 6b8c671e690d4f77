//! Faults on a fleet sharing PostgreSQL state (issue 20): a rolling deploy
//! that runs two recipes of one stage side by side, and the state store
//! stopping in the middle of a run.

mod common;

use common::fleet::{count, finish, spawn, wait_for};
use common::ingest::{pg_database, pg_serial};
use common::pgcluster::PgCluster;
use common::{contents, Project};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

fn lines(p: &Project, rel: &str) -> Vec<String> {
    std::fs::read_to_string(p.path(rel))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Temp outputs left under `dir` (a run's private `.NAME.hw-tmp-*` folders).
fn temps(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let path = e.path();
            if e.file_name().to_string_lossy().contains(".hw-tmp-") {
                out.push(path);
            } else if path.is_dir() {
                out.extend(temps(&path));
            }
        }
    }
    out
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string()
}

// ---------------------------------------------------------------------
// Rolling deploy.

const ITEMS: usize = 200;

/// A config of the deploy `tag`: the configs differ only in the command's
/// first argument, which the script writes into each output and whose log
/// (`made.TAG`) records every item it made.
fn deploy_config(tag: &str) -> String {
    format!(
        r#"
[state]
url_env = "HIGHWATER_STATE_URL"
lease_duration_s = 5
claim_batch_max = 4

[stages.upper]
inputs = ["data/*.txt"]
output = "out/{{relpath}}.up"
command = ["sh", "work.sh", "{tag}", "{{input}}", "{{output}}"]
# A deploy changes the recipe of every item: let it through the guard.
guard = 1.0
[stages.upper.recipe]
files = ["work.sh"]
"#
    )
}

fn deploy_project() -> Project {
    let p = Project::new(&deploy_config("old"));
    p.write("old.toml", &deploy_config("old"));
    p.write("new.toml", &deploy_config("new"));
    p.write(
        "work.sh",
        "set -eu\nsleep 0.01\nprintf '%s %s\\n' \"$1\" \"$(cat \"$2\")\" > \"$3\"\necho \"$2\" >> \"made.$1\"\n",
    );
    for i in 0..ITEMS {
        p.write(&format!("data/{i:04}.txt"), &format!("item {i} v1"));
    }
    p
}

fn recipe_of(p: &Project, url: &str, tag: &str) -> String {
    let cfg = format!("{tag}.toml");
    let (code, json, stderr) = finish(spawn(p, url, &["--config", &cfg, "status", "--json"]));
    assert_eq!(code, 0, "{stderr}");
    json["stages"][0]["recipe"].as_str().unwrap().to_string()
}

/// Every output's first word: the deploy that made it.
fn output_tags(p: &Project) -> BTreeMap<String, usize> {
    let mut tags = BTreeMap::new();
    for (_, bytes) in contents(&p.tree("out")) {
        let text = String::from_utf8(bytes).unwrap();
        *tags
            .entry(text.split(' ').next().unwrap().to_string())
            .or_insert(0) += 1;
    }
    tags
}

#[derive(Debug, Clone, Copy)]
enum Start {
    /// The new deploy starts; the old one while the new one's items run.
    NewFirst,
    /// The old deploy starts; the new one while the old one's items run.
    OldFirst,
    /// Both at once.
    Together,
}

/// Old and new configs over one stage of 200 changed items: no mix of the
/// two recipes is ever reported as success, and a final run converges.
fn check_rolling_deploy(start: Start) {
    let (mut db, url) = pg_database("deploy");
    let p = deploy_project();
    let recipe = BTreeMap::from([
        ("old", recipe_of(&p, &url, "old")),
        ("new", recipe_of(&p, &url, "new")),
    ]);
    assert_ne!(recipe["old"], recipe["new"]);
    // Before the deploy, the old config ran alone.
    let (code, _, stderr) = finish(spawn(&p, &url, &["--config", "old.toml", "run", "--json"]));
    assert_eq!(code, 0, "{stderr}");
    // Observed on the fleet too (issue 24): each item's dependency set is
    // recorded with its entry.
    assert!(!stderr.contains("declared only"), "{stderr}");
    assert_eq!(
        count(&mut db, "SELECT count(*) FROM item_deps"),
        ITEMS as i64
    );
    assert_eq!(
        output_tags(&p),
        BTreeMap::from([("old".to_string(), ITEMS)])
    );
    // New deliveries: both deploys have all 200 items to do.
    for i in 0..ITEMS {
        p.write(&format!("data/{i:04}.txt"), &format!("item {i} v2"));
    }
    for tag in ["old", "new"] {
        let _ = std::fs::remove_file(p.path(&format!("made.{tag}")));
    }
    let run = |tag: &str| {
        let cfg = format!("{tag}.toml");
        spawn(
            &p,
            &url,
            &["--config", &cfg, "run", "--json", "--jobs", "2"],
        )
    };
    let started = |tag: &str| !lines(&p, &format!("made.{tag}")).is_empty();
    let (old, new) = match start {
        Start::NewFirst => {
            let new = run("new");
            wait_for("the new deploy's first items", || started("new"));
            (run("old"), new)
        }
        Start::OldFirst => {
            let old = run("old");
            wait_for("the old deploy's first items", || started("old"));
            (old, run("new"))
        }
        Start::Together => {
            let old = run("old");
            (old, run("new"))
        }
    };
    let results = [("old", finish(old)), ("new", finish(new))];
    let host = hostname();
    let mut succeeded = Vec::new();
    for (tag, (code, json, stderr)) in &results {
        let made: std::collections::BTreeSet<String> =
            lines(&p, &format!("made.{tag}")).into_iter().collect();
        match code {
            0 => {
                let processed = json["stages"][0]["processed"].as_u64().unwrap() as usize;
                // A deploy that reports success did all it planned or
                // joined, and only with its own command: never a share of
                // the other deploy's items.
                assert!(
                    processed == 0 || processed == ITEMS,
                    "{start:?}: the {tag} deploy reported {processed} of {ITEMS} items ok: a mix"
                );
                assert_eq!(made.len(), processed, "{start:?}: {tag}: {json}");
                if processed > 0 {
                    succeeded.push(*tag);
                }
            }
            2 => {
                // Refused: names both recipes and where the other runs, and
                // ran nothing.
                for r in recipe.values() {
                    assert!(stderr.contains(r.as_str()), "{start:?}: {tag}: {stderr}");
                }
                assert!(stderr.contains(&host), "{start:?}: {tag}: {stderr}");
                assert!(
                    made.is_empty(),
                    "{start:?}: the refused {tag} deploy ran {made:?}"
                );
            }
            _ => panic!("{start:?}: the {tag} deploy exited {code}: {stderr}"),
        }
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    assert!(!succeeded.is_empty(), "{start:?}: {results:?}");
    // Settled: every entry ok under one recipe, every output made by it.
    let last = *succeeded.last().unwrap();
    let tags = output_tags(&p);
    assert_eq!(
        tags.len(),
        1,
        "{start:?}: outputs of both deploys: {tags:?}"
    );
    let tag = tags.keys().next().unwrap().clone();
    assert!(
        succeeded.contains(&tag.as_str()),
        "{start:?}: {tag} {succeeded:?}"
    );
    if succeeded.len() == 1 {
        assert_eq!(tag, last);
    }
    let recipes: Vec<(String, i64)> = db
        .query(
            "SELECT recipe, count(*) FROM entries WHERE stage = 'upper' AND status = 'ok' GROUP BY recipe",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(recipes, vec![(recipe[tag.as_str()].clone(), ITEMS as i64)]);
    match start {
        Start::NewFirst => assert_eq!(succeeded, ["new"], "{results:?}"),
        Start::OldFirst => assert_eq!(succeeded[0], "old", "{results:?}"),
        Start::Together => {}
    }
    // The deploy finishes: the new config converges, exit 0.
    let (code, json, stderr) = finish(spawn(&p, &url, &["--config", "new.toml", "run", "--json"]));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json["stages"][0]["failed"], serde_json::json!([]));
    assert_eq!(
        output_tags(&p),
        BTreeMap::from([("new".to_string(), ITEMS)])
    );
    for (_, bytes) in contents(&p.tree("out")) {
        assert!(String::from_utf8(bytes).unwrap().ends_with(" v2\n"));
    }
    // A host still on the old config is refused and changes nothing: no
    // ping-pong between the deploys.
    let before = p.tree("out");
    let (code, _, stderr) = finish(spawn(&p, &url, &["--config", "old.toml", "run"]));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&recipe["old"]) && stderr.contains(&recipe["new"]),
        "{stderr}"
    );
    assert!(stderr.contains("--force"), "{stderr}");
    assert_eq!(p.tree("out"), before);
    let (code, json, stderr) = finish(spawn(&p, &url, &["--config", "new.toml", "run", "--json"]));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json["stages"][0]["processed"], 0);
    assert_eq!(json["stages"][0]["unchanged"], ITEMS);
    assert_eq!(
        count(
            &mut db,
            &format!(
                "SELECT count(*) FROM entries WHERE stage = 'upper' AND recipe = '{}'",
                recipe["new"]
            )
        ),
        ITEMS as i64
    );
}

#[test]
fn a_rolling_deploy_never_reports_a_mix_of_recipes_as_success() {
    let _pg = pg_serial();
    for start in [Start::NewFirst, Start::OldFirst, Start::Together] {
        check_rolling_deploy(start);
    }
}

// ---------------------------------------------------------------------
// The state store stops mid-run.

fn store_config() -> String {
    r#"
[state]
url_env = "HIGHWATER_STATE_URL"
lease_duration_s = 2
claim_batch_max = 4

[stages.upper]
inputs = ["data/*.txt"]
output = "out/{relpath}.up"
command = ["sh", "work.sh", "{input}", "{output}"]
[stages.upper.recipe]
files = ["work.sh"]
"#
    .to_string()
}

/// The outputs a single process makes with the embedded SQLite state.
fn rebuild(items: usize) -> BTreeMap<String, Vec<u8>> {
    let p = Project::new(&common::upper_config(""));
    for i in 0..items {
        p.write(&format!("data/{i:04}.txt"), &format!("item {i}\n"));
    }
    p.run_json(&[], 0);
    contents(&p.tree("out"))
        .into_iter()
        .map(|(k, v)| (k.replace(".txt.upper", ".txt.up"), v))
        .collect()
}

#[test]
fn a_state_store_stopping_mid_run_ends_each_process_with_exit_1_and_recovers() {
    const N: usize = 300;
    let pg = PgCluster::start();
    let url = pg.url();
    let p = Project::new(&store_config());
    p.write(
        "work.sh",
        "set -eu\nmkdir -p started\ntouch \"started/$(basename \"$1\")\"\nsleep 0.02\ntr 'a-z' 'A-Z' < \"$1\" > \"$2\"\n",
    );
    for i in 0..N {
        p.write(&format!("data/{i:04}.txt"), &format!("item {i}\n"));
    }
    let procs: Vec<Child> = (0..3)
        .map(|_| spawn(&p, &url, &["run", "--json", "--jobs", "2"]))
        .collect();
    wait_for("90 items to start", || {
        std::fs::read_dir(p.path("started")).map_or(0, |d| d.count()) >= 90
    });
    pg.stop_immediate();
    for c in procs {
        let (code, _, stderr) = finish(c);
        // Finished with work undone: 1, never 0 (nothing said) or 2
        // ("refused, nothing touched").
        assert_eq!(code, 1, "{stderr}");
        assert!(
            stderr.contains("PostgreSQL state store (HIGHWATER_STATE_URL)"),
            "{stderr}"
        );
        assert!(stderr.contains("unfinished"), "{stderr}");
        assert!(stderr.contains("stage `upper`"), "{stderr}");
        assert!(stderr.contains("run again"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    // Each process removed its temp outputs on the way out.
    assert_eq!(temps(&p.path("out")), Vec::<PathBuf>::new());
    let started = std::fs::read_dir(p.path("started")).unwrap().count();
    assert!(
        started < N,
        "the stop came with work left ({started} started)"
    );

    // The server is back: a run finishes what is left, each item once.
    pg.start_again();
    let mut db = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let done_before = count(&mut db, "SELECT count(*) FROM work WHERE state = 'done'");
    assert!(done_before < N as i64, "{done_before}");
    // After the lost processes' claims expire, they are taken over.
    std::thread::sleep(Duration::from_millis(2_100));
    let procs: Vec<Child> = (0..3)
        .map(|_| spawn(&p, &url, &["run", "--json", "--jobs", "2"]))
        .collect();
    let mut processed = 0;
    for c in procs {
        let (code, json, stderr) = finish(c);
        assert_eq!(code, 0, "{json}\n{stderr}");
        processed += json["stages"][0]["processed"].as_i64().unwrap();
    }
    assert_eq!(processed + done_before, N as i64);
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM entries WHERE stage = 'upper' AND status = 'ok'"
        ),
        N as i64
    );
    assert_eq!(
        count(&mut db, "SELECT count(*) FROM work WHERE state = 'done'"),
        N as i64
    );
    // Exactly once: one recorded completion per item over every process,
    // before the stop and after.
    assert_eq!(
        count(&mut db, "SELECT sum(done)::bigint FROM processes"),
        N as i64
    );
    assert_eq!(contents(&p.tree("out")), rebuild(N));
    assert_eq!(temps(&p.path("out")), Vec::<PathBuf>::new());
    let (code, json, stderr) = finish(spawn(&p, &url, &["run", "--json"]));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json["stages"][0]["unchanged"], N);
    assert_eq!(json["stages"][0]["processed"], 0);
}

// ---------------------------------------------------------------------
// Two stages onto one output path, seen only after upstream work.

/// Issue 20: on shared state, the check that no two stages render onto one
/// output path is made again before each stage plans, with the inputs an
/// upstream stage has just made. Here `up` makes `mid/*.txt`, the inputs of
/// `left` and `right`, which both render onto `out/{relpath}.x`: before
/// `up` runs there is nothing to collide. The collision is refused naming
/// both stages and the path, no output is overwritten, nothing of the two
/// is recorded ok, and the run ends with exit 1 (work was done).
#[test]
fn a_collision_made_by_an_upstream_stage_is_refused_before_the_downstream_stages() {
    let _serial = pg_serial();
    let (mut db, url) = pg_database("collide");
    let p = Project::new(
        r#"
[state]
url_env = "HIGHWATER_STATE_URL"
lease_duration_s = 5

[stages.up]
inputs = ["data/*.txt"]
output = "mid/{relpath}"
command = ["cp", "{input}", "{output}"]

[stages.left]
inputs = ["mid/*.txt"]
output = "out/{relpath}.x"
command = ["sh", "-c", "echo left > \"$1\"", "sh", "{output}"]

[stages.right]
inputs = ["mid/*.txt"]
output = "out/{relpath}.x"
command = ["sh", "-c", "echo right > \"$1\"", "sh", "{output}"]
"#,
    );
    for i in 0..3 {
        p.write(&format!("data/{i}.txt"), &format!("item {i}"));
    }
    // A file already in place where both would write: it must survive.
    p.write("out/keep.x", "kept");
    let (code, _, stderr) = finish(spawn(&p, &url, &["run", "--json"]));
    assert_eq!(code, 1, "{stderr}");
    for w in ["`left`", "`right`", "out/0.txt.x", "both write"] {
        assert!(stderr.contains(w), "stderr lacks {w:?}:\n{stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(p.read("mid/0.txt"), "item 0", "the upstream ran");
    assert_eq!(
        contents(&p.tree("out")),
        BTreeMap::from([("keep.x".to_string(), b"kept".to_vec())]),
        "no output of the colliding stages was written"
    );
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM entries WHERE stage = 'up' AND status = 'ok'"
        ),
        3
    );
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM entries WHERE stage IN ('left', 'right')"
        ),
        0,
        "nothing recorded for the colliding stages"
    );
    assert_eq!(
        count(
            &mut db,
            "SELECT count(*) FROM work WHERE stage IN ('left', 'right')"
        ),
        0,
        "nothing queued for the colliding stages"
    );
}
