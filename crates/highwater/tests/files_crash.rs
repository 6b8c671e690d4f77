//! Crash safety: SIGKILL the real process mid-run, run again, and the
//! outputs equal a clean full rebuild. No item whose output is missing or
//! stale is skipped, and no temp file is left behind.

mod common;
use common::*;
use std::time::{Duration, Instant};

const FILES: usize = 150;

fn slow_project() -> Project {
    let p = Project::new(&upper_config("guard = 0.95"));
    // Slow enough that a kill lands mid-run, with several items in flight.
    p.write(
        "up.sh",
        "set -eu\nsleep 0.02\ntr a-z A-Z < \"$1\" > \"$2\"\n",
    );
    p
}

fn outputs_matching(p: &Project, needle: &str) -> usize {
    p.tree("out")
        .values()
        .filter(|(b, _)| String::from_utf8_lossy(b).contains(needle))
        .count()
}

/// Starts `run`, waits until `ready` says enough work is done, then SIGKILLs it.
fn kill_mid_run(p: &Project, ready: impl Fn() -> bool) {
    let mut child = p
        .cmd(&["run", "--jobs", "3"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ready() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run finished before the kill"
        );
        assert!(Instant::now() < deadline, "the run made no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL on Unix
    child.wait().unwrap();
}

/// The outputs a clean project with the same inputs makes from scratch.
fn rebuild(p: &Project) -> std::collections::BTreeMap<String, Vec<u8>> {
    let clean = Project::new(&upper_config(""));
    for (rel, (bytes, _)) in p.tree("data") {
        clean.write(&format!("data/{rel}"), std::str::from_utf8(&bytes).unwrap());
    }
    clean.run_json(&["--jobs", "4"], 0);
    contents(&clean.tree("out"))
}

fn no_temps(p: &Project) {
    let temps: Vec<_> = p
        .tree("out")
        .into_keys()
        .filter(|k| k.contains(".hw-tmp-"))
        .collect();
    assert!(temps.is_empty(), "{temps:?}");
}

#[test]
fn sigkill_during_a_first_run() {
    let p = slow_project();
    for i in 0..FILES {
        p.write(&format!("data/{}/f{i}.txt", i % 5), &format!("old {i}\n"));
    }
    kill_mid_run(&p, || outputs_matching(&p, "OLD") >= 20);
    let done_before = outputs_matching(&p, "OLD");
    assert!(done_before < FILES, "killed mid-run");
    p.run_json(&[], 0);
    no_temps(&p);
    assert_eq!(contents(&p.tree("out")), rebuild(&p));
    // And the state agrees: nothing left to do.
    let r = p.run_json(&[], 0);
    assert_eq!(stage(&r, "upper")["processed"], 0);
}

#[test]
fn sigkill_during_an_update_run_twice() {
    let p = slow_project();
    for i in 0..FILES {
        p.write(&format!("data/{}/f{i}.txt", i % 5), &format!("old {i}\n"));
    }
    p.run_json(&["--jobs", "4"], 0);
    // Most inputs change (same size, so only the hash tells), a few go away.
    for i in 0..FILES {
        match i % 10 {
            0 => std::fs::remove_file(p.path(&format!("data/{}/f{i}.txt", i % 5))).unwrap(),
            1..=7 => p.write(&format!("data/{}/f{i}.txt", i % 5), &format!("new {i}\n")),
            _ => {}
        }
    }
    kill_mid_run(&p, || outputs_matching(&p, "NEW") >= 15);
    let first = outputs_matching(&p, "NEW");
    kill_mid_run(&p, || outputs_matching(&p, "NEW") >= first + 15);
    assert!(
        outputs_matching(&p, "NEW") < FILES * 7 / 10,
        "still mid-way"
    );
    p.run_json(&[], 0);
    no_temps(&p);
    assert_eq!(contents(&p.tree("out")), rebuild(&p));
    let r = p.run_json(&[], 0);
    assert_eq!(stage(&r, "upper")["processed"], 0);
    let status = p.check(&["status", "--json"], 0).json();
    assert_eq!(status["stages"][0]["entries"], FILES - FILES / 10);
}
