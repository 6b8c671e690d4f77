//! Bad input and refusals: each gets a clear error naming what is wrong and
//! exit 2, and the manifest and outputs stay as they were. Found only after
//! work was recorded, the same fault ends with exit 1 (issue 20).

mod common;
use common::*;

/// A project with one successful run behind it, and what it looked like.
fn settled() -> (Project, serde_json::Value) {
    let p = Project::new(&upper_config(""));
    p.write("data/a.txt", "a");
    p.write("data/b.txt", "b");
    p.run_json(&[], 0);
    let export = p.export();
    (p, export)
}

fn refused(p: &Project, export: &serde_json::Value, wants: &[&str]) {
    let outs = p.tree("out");
    let r = p.check(&["run"], 2);
    for w in wants {
        assert!(r.stderr.contains(w), "stderr lacks {w:?}:\n{}", r.stderr);
    }
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    assert_eq!(p.tree("out"), outs, "outputs untouched");
    // The export needs a loadable config; restore a good one to read it.
    p.write("highwater.toml", &upper_config(""));
    assert_eq!(&p.export(), export, "manifest untouched");
}

#[test]
fn malformed_toml_names_the_file_and_line() {
    let (p, export) = settled();
    p.write(
        "highwater.toml",
        "[stages.upper]\ninputs = [\"data/*.txt\"\noutput = 3\n",
    );
    refused(&p, &export, &["highwater.toml", "line 3"]);
}

#[test]
fn unknown_keys_are_refused() {
    let (p, export) = settled();
    p.write("highwater.toml", &upper_config("on_delet = \"keep\""));
    refused(&p, &export, &["highwater.toml", "on_delet"]);
}

#[test]
fn a_missing_command_is_named() {
    let (p, export) = settled();
    let cfg = upper_config("").replace("[\"sh\", \"up.sh\"", "[\"no-such-tool-xyz\", \"up.sh\"");
    p.write("highwater.toml", &cfg);
    refused(
        &p,
        &export,
        &["command `no-such-tool-xyz` was not found", "stage `upper`"],
    );
}

#[test]
fn an_unreadable_input_is_named() {
    let (p, export) = settled();
    // A dangling symlink: the glob matches it, but it cannot be read (a
    // chmod 000 file would not do, since the tests may run as root).
    std::os::unix::fs::symlink(p.path("nowhere"), p.path("data/dangling.txt")).unwrap();
    refused(&p, &export, &["data/dangling.txt", "cannot be read"]);
}

#[test]
fn a_template_escaping_the_output_root_is_refused() {
    let (p, export) = settled();
    let cfg = upper_config("").replace("out/{relpath}.upper", "out/{stem}/../../../escaped/{name}");
    p.write("highwater.toml", &cfg);
    refused(&p, &export, &["escapes the output root `out`"]);
    assert!(!p.path("../escaped").exists());
}

#[test]
fn outputs_colliding_are_refused() {
    let (p, export) = settled();
    p.write("data/a/b.txt", "x");
    let cfg = upper_config("").replace("out/{relpath}.upper", "out/{name}");
    p.write("data/b.txt", "b");
    p.write("highwater.toml", &cfg);
    refused(&p, &export, &["both render to output `out/b.txt`"]);
}

#[test]
fn the_state_store_inside_an_output_root_is_refused() {
    let p = Project::new(&format!(
        "[state]\nstore = \"sqlite:out/state.db\"\n{}",
        upper_config("")
    ));
    p.write("data/a.txt", "a");
    let r = p.check(&["run"], 2);
    assert!(
        r.stderr.contains("inside the output root `out`"),
        "{}",
        r.stderr
    );
    assert!(!p.exists("out"));
}

#[test]
fn a_second_run_is_refused_while_one_holds_the_lock() {
    let (p, _) = settled();
    let lock = std::fs::File::options()
        .write(true)
        .open(p.path(".highwater/lock"))
        .unwrap();
    lock.try_lock().unwrap();
    let r = p.check(&["run"], 2);
    assert!(
        r.stderr.contains("another highwater run holds the lock"),
        "{}",
        r.stderr
    );
    drop(lock);
    p.check(&["run"], 0);
}

#[test]
fn a_lost_manifest_trips_the_guard_and_a_first_run_does_not() {
    let p = Project::new(&upper_config(""));
    for i in 0..20 {
        p.write(&format!("data/{i}.txt"), "x");
    }
    p.run_json(&[], 0);
    std::fs::remove_dir_all(p.path(".highwater")).unwrap();
    let r = p.check(&["run"], 2);
    assert!(r.stderr.contains("manifest was lost"), "{}", r.stderr);
    assert!(r.stderr.contains("new 20"), "{}", r.stderr);
    p.check(&["run", "--force"], 0);
}

#[test]
fn usage_errors_exit_2_and_unknown_stages_are_named() {
    let (p, _) = settled();
    assert_eq!(p.hw(&["run", "--no-such-flag"]).code, 2);
    assert_eq!(p.hw(&["run", "--jobs", "0"]).code, 2);
    let r = p.check(&["plan", "--stage", "nope"], 2);
    assert!(
        r.stderr
            .contains("no stage named `nope`; the config has: upper"),
        "{}",
        r.stderr
    );
    let r = p.check(&["--config", "missing.toml", "plan"], 2);
    assert!(r.stderr.contains("missing.toml"), "{}", r.stderr);
}

#[test]
fn stage_cycles_are_refused() {
    let p = Project::new(
        r#"
[stages.a]
inputs = ["x/*.txt"]
output = "y/{name}"
command = ["cp", "{input}", "{output}"]
[stages.b]
inputs = ["y/*.txt"]
output = "x/{name}"
command = ["cp", "{input}", "{output}"]
"#,
    );
    let r = p.check(&["plan"], 2);
    assert!(r.stderr.contains("cycle"), "{}", r.stderr);
}

#[test]
fn a_closed_stdout_ends_quietly() {
    let p = Project::new(&upper_config(""));
    for i in 0..3000 {
        p.write(&format!("data/{i}.txt"), "x");
    }
    let out = std::process::Command::new("bash")
        .current_dir(p.dir.path())
        .args([
            "-c",
            &format!("set -o pipefail; '{}' plan | head -n 1 >/dev/null", bin()),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Issue 20: two stages rendering onto one output path would overwrite each
/// other, both recorded as done; refused by `plan` and `run` before any
/// work, naming both stages and the path.
#[test]
fn two_stages_writing_one_output_are_refused_naming_both() {
    let (p, export) = settled();
    p.write("more/a.txt", "m");
    let cfg = format!(
        "{}\n[stages.copy]\ninputs = [\"more/*.txt\"]\noutput = \"out/{{relpath}}.upper\"\ncommand = [\"cp\", \"{{input}}\", \"{{output}}\"]\n",
        upper_config("")
    );
    p.write("highwater.toml", &cfg);
    let wants = ["`upper`", "`copy`", "out/a.txt.upper"];
    let r = p.check(&["plan"], 2);
    for w in wants {
        assert!(r.stderr.contains(w), "{}", r.stderr);
    }
    p.write("highwater.toml", &cfg);
    refused(&p, &export, &wants);
}

/// Three stages: `up` copies `data/` into `mid/`, and `left` and `right`
/// both render `mid/*.txt` onto `out/{relpath}.x`. With `mid/` empty, no
/// collision can be seen before `up` runs.
const DOWNSTREAM_COLLIDE: &str = r#"
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
"#;

/// Issue 20: a collision found only after an upstream stage ran is refused
/// before the colliding stages run, but the run did work: exit 1 (not 2,
/// "refused, nothing touched"), naming what was done, with the upstream's
/// outputs recorded. Found before any work (the next run), it is exit 2
/// with nothing touched.
#[test]
fn a_collision_after_upstream_work_exits_1_and_before_any_work_exits_2() {
    let p = Project::new(DOWNSTREAM_COLLIDE);
    p.write("data/a.txt", "a");
    let wants = ["`left`", "`right`", "out/a.txt.x"];
    let r = p.check(&["run"], 1);
    for w in wants
        .iter()
        .chain(&["work unfinished", "stage `up` made 1 output(s)"])
    {
        assert!(r.stderr.contains(w), "stderr lacks {w:?}:\n{}", r.stderr);
    }
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    assert_eq!(p.read("mid/a.txt"), "a", "the upstream's output is made");
    assert!(p.tree("out").is_empty(), "neither colliding stage wrote");
    let entries = p.export()["entries"].as_array().unwrap().clone();
    let recorded: Vec<_> = entries
        .iter()
        .map(|e| (e["stage"].as_str().unwrap(), e["status"].as_str().unwrap()))
        .collect();
    assert_eq!(recorded, [("up", "ok")], "{entries:?}");
    // The next run sees the collision before any work.
    let export = p.export();
    let r = p.check(&["run"], 2);
    for w in wants {
        assert!(r.stderr.contains(w), "stderr lacks {w:?}:\n{}", r.stderr);
    }
    assert!(!r.stderr.contains("work unfinished"), "{}", r.stderr);
    assert!(p.tree("out").is_empty());
    assert_eq!(p.export(), export, "manifest untouched");
}
