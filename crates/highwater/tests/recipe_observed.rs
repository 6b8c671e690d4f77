//! The recipe is observed, not declared (issue 24): every file a stage's
//! command reads, executes, looks up absent or lists becomes evidence of
//! the item, so editing any code re-runs exactly the items that touched it.

mod common;
use common::ingest::{pg_database, pg_serial};
use common::*;
use highwater_store::{Batch, StateStore};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs highwater with bytecode allowed: this machine's environment sets
/// PYTHONDONTWRITEBYTECODE, and the `__pycache__` cases need it written.
fn hw(p: &Project, args: &[&str], code: i32) -> Ran {
    hw_env(p, args, code, &[])
}

fn hw_env(p: &Project, args: &[&str], code: i32, env: &[(&str, &str)]) -> Ran {
    let mut c = p.cmd(args);
    c.env_remove("PYTHONDONTWRITEBYTECODE");
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    let r = Ran {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    };
    assert_eq!(
        r.code, code,
        "highwater {args:?} exited {} (wanted {code})\nstdout:\n{}\nstderr:\n{}",
        r.code, r.stdout, r.stderr
    );
    r
}

/// The plan of one stage as (item -> (reason, dependency)).
fn plan_of(p: &Project, stage_name: &str) -> BTreeMap<String, (String, Option<String>)> {
    plan_env(p, stage_name, &[])
}

fn plan_env(
    p: &Project,
    stage_name: &str,
    env: &[(&str, &str)],
) -> BTreeMap<String, (String, Option<String>)> {
    let v = hw_env(p, &["plan", "--json"], 0, env).json();
    let st = v["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == stage_name)
        .unwrap_or_else(|| panic!("no stage {stage_name} in {v}"))
        .clone();
    st["changed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["input"].as_str().unwrap().to_string(),
                (
                    c["reason"].as_str().unwrap().to_string(),
                    c["dependency"].as_str().map(str::to_string),
                ),
            )
        })
        .collect()
}

fn run_counts(p: &Project, extra: &[&str]) -> (u64, u64) {
    let mut args = vec!["run", "--json"];
    args.extend_from_slice(extra);
    let r = hw(p, &args, 0).json();
    let s = stage(&r, "t");
    (
        s["processed"].as_u64().unwrap(),
        s["unchanged"].as_u64().unwrap(),
    )
}

/// The interpreter itself, past any shim (pyenv's is a bash script that
/// reads half of ~/.pyenv on every start).
fn python() -> String {
    let o = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 is needed by these tests");
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}

fn config(command: &str, extra: &str) -> String {
    format!(
        r#"
[stages.t]
inputs = ["data/*.txt"]
output = "out/{{relpath}}.out"
command = {command}
{extra}
"#
    )
}

fn all(
    items: impl IntoIterator<Item = String>,
    reason: &str,
    dep: &str,
) -> BTreeMap<String, (String, Option<String>)> {
    items
        .into_iter()
        .map(|i| (i, (reason.to_string(), Some(dep.to_string()))))
        .collect()
}

/// The seed's case: the transform's script is not declared anywhere; it is
/// rewritten from upper-casing to a no-op, and every item re-runs, naming it.
#[test]
fn an_undeclared_script_rewritten_reruns_every_item_naming_it() {
    let p = Project::new(&config(r#"["sh", "up.sh", "{input}", "{output}"]"#, ""));
    let items: Vec<String> = (0..3).map(|i| format!("data/f{i}.txt")).collect();
    for i in &items {
        p.write(i, "hello\n");
    }
    assert_eq!(run_counts(&p, &[]), (3, 0));
    assert_eq!(p.read("out/f0.txt.out"), "HELLO\n");
    assert!(plan_of(&p, "t").is_empty());

    p.write("up.sh", "set -eu\ncat \"$1\" > \"$2\"\n");
    assert_eq!(plan_of(&p, "t"), all(items.clone(), "dependency", "up.sh"));
    let human = hw(&p, &["plan"], 0).stdout;
    assert!(human.contains("dependency up.sh: 3"), "{human}");
    assert!(human.contains("reasons: dependency 3"), "{human}");
    assert_eq!(run_counts(&p, &[]), (3, 0));
    assert_eq!(p.read("out/f0.txt.out"), "hello\n");
    assert!(plan_of(&p, "t").is_empty());

    // Asked which files an item depends on, highwater names them.
    let deps = hw(&p, &["deps", "t", "data/f0.txt", "--json"], 0).json();
    let paths: Vec<&str> = deps["items"][0]["deps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap())
        .collect();
    assert!(paths.contains(&"up.sh"), "{deps}");
    // Issue 47: `deps --summary`: each distinct dependency once, with how
    // many items read it; the script is read by all three.
    let sum = hw(&p, &["deps", "t", "--summary", "--json"], 0).json();
    assert_eq!(sum["items"], 3, "{sum}");
    let up = sum["deps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["path"] == "up.sh")
        .unwrap_or_else(|| panic!("up.sh in {sum}"));
    assert_eq!(
        (up["items"].as_u64(), up["changed_items"].as_u64()),
        (Some(3), Some(0)),
        "{sum}"
    );
    let text = hw(&p, &["deps", "t", "--summary"], 0).stdout;
    assert!(text.starts_with("t: 3 items, "), "{text}");
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("3 ") && l.ends_with(" up.sh")),
        "{text}"
    );
    p.write("up.sh", "set -eu\ncat \"$1\" > \"$2\" # again\n");
    let changed = hw(&p, &["deps", "t", "--summary", "--changed", "--json"], 0).json();
    let paths: Vec<&str> = changed["deps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["up.sh"], "only what changed: {changed}");
    assert_eq!(changed["deps"][0]["changed_items"], 3, "{changed}");
    // Never: its own input and output, /proc, /dev, the state folder.
    for never in ["data/f0.txt", "out/f0.txt.out"] {
        assert!(!paths.contains(&never), "{never} in {deps}");
    }
    assert!(
        !paths.iter().any(|p| p.starts_with("/proc")
            || p.starts_with("/dev")
            || p.starts_with(".highwater")),
        "{deps}"
    );
}

fn python_project(items: usize) -> (Project, Vec<String>) {
    let py = python();
    let p = Project::new(&config(
        &format!(r#"["{py}", "t.py", "{{input}}", "{{output}}"]"#),
        "",
    ));
    p.write(
        "t.py",
        "import sys\nsys.path.insert(0, 'lib')\nimport helpers, table\n\
         src = open(sys.argv[1]).read()\n\
         open(sys.argv[2], 'w').write(helpers.f(src) + table.SUFFIX)\n",
    );
    p.write("lib/helpers.py", "def f(s):\n    return s.upper()\n");
    p.write("table.py", "SUFFIX = '!'\n");
    p.write("notes.txt", "nobody reads this\n");
    let names: Vec<String> = (0..items).map(|i| format!("data/f{i}.txt")).collect();
    for n in &names {
        p.write(n, "abc");
    }
    (p, names)
}

/// A Python transform importing an in-project helper: editing the helper
/// re-runs every item, editing a file nobody reads re-runs nothing, and a
/// new module that shadows an imported one re-runs every item.
#[test]
fn a_python_helper_edit_reruns_every_item_and_a_shadowing_module_too() {
    let (p, items) = python_project(6);
    assert_eq!(run_counts(&p, &["--jobs", "3"]), (6, 0));
    assert_eq!(p.read("out/f0.txt.out"), "ABC!");
    assert!(plan_of(&p, "t").is_empty(), "first run's own writes count");

    p.write("notes.txt", "still nobody\n");
    assert!(plan_of(&p, "t").is_empty());

    // A different size: Python trusts its bytecode while the source's size
    // and mtime in whole seconds match, so a same-size edit within the
    // second would re-run every item and still get the old bytecode.
    p.write(
        "lib/helpers.py",
        "def f(s):\n    return s.lower()  # edited\n",
    );
    assert_eq!(
        plan_of(&p, "t"),
        all(items.clone(), "dependency", "lib/helpers.py")
    );
    assert_eq!(run_counts(&p, &[]), (6, 0));
    assert_eq!(p.read("out/f0.txt.out"), "abc!");
    assert!(plan_of(&p, "t").is_empty());

    // `lib` comes first on sys.path: a table.py there shadows the one in
    // the root. Python sees it through its listing of `lib`.
    p.write("lib/table.py", "SUFFIX = '?'\n");
    let plan = plan_of(&p, "t");
    assert_eq!(plan.keys().cloned().collect::<Vec<_>>(), items);
    for (reason, dep) in plan.values() {
        assert_eq!(reason, "dependency");
        assert!(dep.as_deref().unwrap().starts_with("lib"), "{plan:?}");
    }
    assert_eq!(run_counts(&p, &[]), (6, 0));
    assert_eq!(p.read("out/f0.txt.out"), "abc?");
    assert!(plan_of(&p, "t").is_empty());
}

/// Issue 47, item 7: Python's bytecode cache never stands in for a changed
/// source. A helper edited to the same size, its mtime put back within the
/// same second (a formatter right after a save, a `git checkout` of a
/// same-size version): highwater sees the change by its digest and re-runs
/// the items, and they run the new code, not `__pycache__`'s old bytecode,
/// which Python would trust (it checks only the size and the whole-second
/// mtime). The same with PYTHONPYCACHEPREFIX set.
#[test]
fn python_bytecode_never_stands_in_for_a_changed_source() {
    for prefix in [false, true] {
        let (p, items) = python_project(3);
        let cache = p.path("pycache-prefix");
        let cache = cache.to_str().unwrap();
        let env: Vec<(&str, &str)> = if prefix {
            vec![("PYTHONPYCACHEPREFIX", cache)]
        } else {
            Vec::new()
        };
        hw_env(&p, &["run", "--json"], 0, &env);
        assert_eq!(p.read("out/f0.txt.out"), "ABC!");
        let pyc_dir = if prefix {
            let lib = p.path("lib").canonicalize().unwrap();
            std::path::Path::new(cache).join(lib.strip_prefix("/").unwrap())
        } else {
            p.path("lib/__pycache__")
        };
        let cached = std::fs::read_dir(&pyc_dir)
            .map(|rd| rd.flatten().count())
            .unwrap_or(0);
        assert!(cached > 0, "Python wrote its bytecode to {pyc_dir:?}");
        let helper = p.path("lib/helpers.py");
        let before = std::fs::metadata(&helper).unwrap().modified().unwrap();
        let old = std::fs::read_to_string(&helper).unwrap();
        let new = old.replace("s.upper()", "s.lower()");
        assert_eq!(new.len(), old.len(), "the same size");
        std::fs::write(&helper, &new).unwrap();
        // The same whole second as before, another nanosecond.
        let secs = before
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let nanos = before
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let again = std::time::UNIX_EPOCH + Duration::new(secs, if nanos == 7 { 8 } else { 7 });
        std::fs::File::options()
            .write(true)
            .open(&helper)
            .unwrap()
            .set_modified(again)
            .unwrap();
        assert_eq!(
            plan_env(&p, "t", &env),
            all(items.clone(), "dependency", "lib/helpers.py"),
            "prefix {prefix}"
        );
        hw_env(&p, &["run", "--json"], 0, &env);
        assert_eq!(
            p.read("out/f0.txt.out"),
            "abc!",
            "the new code ran (prefix {prefix})"
        );
        assert!(plan_env(&p, "t", &env).is_empty());
    }
}

/// Issue 47 (noise): editor and OS droppings beside the sources (a vim
/// swap file, an emacs backup and lock, `.DS_Store`) re-run nothing,
/// although Python lists the folders they appear in; the loader's cache
/// `/etc/ld.so.cache` (rewritten by every `ldconfig`) is no dependency,
/// while the libraries it indexes are. `observe_ignore_defaults = false`
/// counts them again.
#[test]
fn droppings_and_the_loader_cache_rebuild_nothing_by_default() {
    let (p, items) = python_project(3);
    assert_eq!(run_counts(&p, &[]), (3, 0));
    let deps = hw(&p, &["deps", "t", "data/f0.txt", "--json"], 0).stdout;
    assert!(deps.contains("lib/helpers.py"), "{deps}");
    assert!(!deps.contains("ld.so.cache"), "{deps}");
    for n in [
        ".t.py.swp",
        "lib/.helpers.py.swp",
        "lib/helpers.py~",
        ".#t.py",
        ".DS_Store",
    ] {
        p.write(n, "x");
    }
    assert!(plan_of(&p, "t").is_empty(), "droppings re-run nothing");
    // A new module beside them still counts: Python may import it.
    p.write("lib/extra.py", "X = 1\n");
    let plan = plan_of(&p, "t");
    assert_eq!(plan.keys().cloned().collect::<Vec<_>>(), items);
    // The plan names the name that appeared.
    for (reason, dep) in plan.values() {
        assert_eq!(reason, "dependency");
        assert_eq!(dep.as_deref(), Some("lib (+extra.py)"), "{plan:?}");
    }
    let text = hw(&p, &["plan"], 0).stdout;
    assert!(text.contains("lib (+extra.py)"), "{text}");

    // The defaults off: the loader's cache is a dependency again, and so
    // is a dropping in a listed folder.
    let (q, _) = python_project(2);
    let cfg = std::fs::read_to_string(q.path("highwater.toml")).unwrap();
    q.write(
        "highwater.toml",
        &cfg.replace("command =", "observe_ignore_defaults = false\ncommand ="),
    );
    assert_eq!(run_counts(&q, &[]), (2, 0));
    let deps = hw(&q, &["deps", "t", "data/f0.txt", "--json"], 0).stdout;
    let ld_cache = std::path::Path::new("/etc/ld.so.cache").exists();
    assert_eq!(deps.contains("ld.so.cache"), ld_cache, "{deps}");
    // vim's probe name: no dot, so an import could match it (a package
    // folder named `4913`), and it counts when the defaults are off.
    q.write("lib/4913", "x");
    assert_eq!(plan_of(&q, "t").len(), 2, "counted with the defaults off");
}

/// Issue 47, item 1: a command that makes itself non-dumpable (as ssh
/// does) hides its memory and `/proc/PID/fd` from a tracer that is not
/// root; its reads were let through unrecorded, so an edit of what it read
/// re-ran nothing. Now the item fails, naming the cause and the fix. Run as
/// `nobody` (through `setpriv` when the test runs as root, as CI does);
/// as root the same command is observed in full.
#[test]
fn a_read_the_tracer_may_not_see_fails_the_item() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("data")).unwrap();
    std::fs::write(
        d.join("highwater.toml"),
        config(r#"["/usr/bin/python3", "t.py", "{input}", "{output}"]"#, ""),
    )
    .unwrap();
    std::fs::write(
        d.join("t.py"),
        "import ctypes, sys\n\
         ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0\n\
         extra = open('lib.txt').read()\n\
         open(sys.argv[2], 'w').write(open(sys.argv[1]).read() + extra)\n",
    )
    .unwrap();
    std::fs::write(d.join("lib.txt"), "lib\n").unwrap();
    std::fs::write(d.join("data/a.txt"), "a\n").unwrap();
    // The binary beside the project: the checkout may lie where `nobody`
    // cannot reach.
    let hw_bin = d.join("highwater");
    std::fs::copy(env!("CARGO_BIN_EXE_highwater"), &hw_bin).unwrap();
    let status = Command::new("chmod")
        .args(["-R", "a+rwX"])
        .arg(d)
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let run = |as_root: bool| {
        let root = unsafe { libc::geteuid() } == 0;
        let mut c = if root && !as_root {
            let mut c = Command::new("setpriv");
            c.args([
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                "--",
            ])
            .arg(&hw_bin);
            c
        } else {
            Command::new(&hw_bin)
        };
        c.args(["run", "--json"])
            .current_dir(d)
            .env("HOME", d)
            .env("NO_COLOR", "1")
            .output()
            .unwrap()
    };
    let o = run(false);
    let err = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "the item failed: {err}");
    assert!(
        err.contains("not allowed to read") && err.contains("non-dumpable"),
        "{err}"
    );
    assert!(!d.join("out/a.txt.out").exists(), "nothing published");
    if unsafe { libc::geteuid() } == 0 {
        let _ = std::fs::remove_dir_all(d.join(".highwater"));
        let o = run(true);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let deps = Command::new(&hw_bin)
            .args(["deps", "t"])
            .current_dir(d)
            .output()
            .unwrap();
        assert!(String::from_utf8_lossy(&deps.stdout).contains("lib.txt"));
    }
}

/// Issue 47, item 2: paths through magic links and `..` above /proc and
/// /dev name ordinary project files, and count as such: `cat
/// /proc/self/cwd/lib.txt` (the command's folder, not highwater's) and
/// `/dev/../PROJECT/other.txt` were dropped as /proc and /dev paths, so
/// editing either re-ran nothing.
#[test]
fn paths_through_proc_and_dev_count_as_the_files_they_reach() {
    let p = Project::new(&config(r#"["sh", "r.sh", "{input}", "{output}"]"#, ""));
    p.write(
        "r.sh",
        "set -eu\ncat /proc/self/cwd/lib.txt \"/dev/..$(pwd)/other.txt\" /proc/thread-self/cwd/third.txt > \"$2\"\n",
    );
    p.write("lib.txt", "lib\n");
    p.write("other.txt", "other\n");
    p.write("third.txt", "third\n");
    let items: Vec<String> = (0..2).map(|i| format!("data/f{i}.txt")).collect();
    for i in &items {
        p.write(i, "x\n");
    }
    assert_eq!(run_counts(&p, &[]), (2, 0));
    assert_eq!(p.read("out/f0.txt.out"), "lib\nother\nthird\n");
    assert!(plan_of(&p, "t").is_empty());
    for (file, text) in [
        ("lib.txt", "LIB\n"),
        ("other.txt", "OTHER\n"),
        ("third.txt", "THIRD\n"),
    ] {
        p.write(file, text);
        assert_eq!(
            plan_of(&p, "t"),
            all(items.clone(), "dependency", file),
            "{file}"
        );
        assert_eq!(run_counts(&p, &[]), (2, 0));
    }
    assert_eq!(p.read("out/f1.txt.out"), "LIB\nOTHER\nTHIRD\n");
}

/// Per-item lookups: each input names the table it reads; editing one
/// table re-runs exactly its 10 readers of 40.
#[test]
fn a_lookup_table_edit_reruns_exactly_its_readers() {
    let p = Project::new(&config(r#"["sh", "look.sh", "{input}", "{output}"]"#, ""));
    p.write(
        "look.sh",
        "set -eu\nt=$(cat \"$1\")\ncat \"tables/$t\" > \"$2\"\n",
    );
    for k in 0..4 {
        p.write(&format!("tables/t{k}.csv"), &format!("table {k}\n"));
    }
    for i in 0..40 {
        p.write(&format!("data/i{i:02}.txt"), &format!("t{}.csv", i % 4));
    }
    assert_eq!(run_counts(&p, &["--jobs", "4"]), (40, 0));
    // Stored once per distinct set: 40 items, four tables, four sets.
    assert_eq!(dep_sets(&p), 4);
    p.write("tables/t2.csv", "table two, edited\n");
    let readers: Vec<String> = (0..40)
        .filter(|i| i % 4 == 2)
        .map(|i| format!("data/i{i:02}.txt"))
        .collect();
    assert_eq!(
        plan_of(&p, "t"),
        all(readers, "dependency", "tables/t2.csv")
    );
    assert_eq!(run_counts(&p, &[]), (10, 30));
    assert_eq!(p.read("out/i02.txt.out"), "table two, edited\n");
    assert_eq!(p.read("out/i01.txt.out"), "table 1\n");
    // The 10 re-run items share one new set; the old one went unnamed and
    // was pruned.
    assert_eq!(dep_sets(&p), 4);
}

fn dep_sets(p: &Project) -> i64 {
    let db = rusqlite::Connection::open(p.path(".highwater/state.db")).unwrap();
    db.query_row("SELECT count(*) FROM dep_sets", [], |r| r.get(0))
        .unwrap()
}

/// Temp files made and removed, and `__pycache__` written by the first
/// items and read by the others: a second run processes nothing.
#[test]
fn temp_files_and_pycache_are_never_dependencies() {
    let (p, _) = python_project(8);
    p.write(
        "t.py",
        "import sys, os, tempfile\nsys.path.insert(0, 'lib')\nimport helpers, table\n\
         fd, tmp = tempfile.mkstemp(dir='.')\nos.write(fd, b'scratch'); os.close(fd)\n\
         open(tmp).read(); os.unlink(tmp)\n\
         src = open(sys.argv[1]).read()\n\
         open(sys.argv[2], 'w').write(helpers.f(src) + table.SUFFIX)\n",
    );
    assert_eq!(run_counts(&p, &["--jobs", "4"]), (8, 0));
    assert!(p.exists("lib/__pycache__"), "bytecode was written");
    // An item that started within the filesystem's timestamp tick of a
    // write it then read (the bytecode another item just wrote, or the
    // code this test wrote just before the run) recorded that file racy
    // (git's rule: it may have been read before the change), so the plan
    // may name it once, as a dependency on a file that exists: never the
    // temp file. One more run settles it (seen once in CI under load, not
    // in 70 runs here).
    let left = plan_of(&p, "t");
    for (item, (why, path)) in &left {
        assert_eq!(why, "dependency", "{item}");
        let path = path.as_deref().unwrap_or_else(|| panic!("{item}: no path"));
        assert!(
            p.exists(path),
            "{item}: {path} is not a file the items read"
        );
    }
    let n = left.len() as u64;
    assert_eq!(run_counts(&p, &["--jobs", "4"]), (n, 8 - n));
    assert_eq!(run_counts(&p, &["--jobs", "4"]), (0, 8));
    assert!(plan_of(&p, "t").is_empty());
    // And the bytecode stands for its source: editing the source still
    // re-runs every item, the ones that read only the bytecode included.
    p.write("lib/helpers.py", "def f(s):\n    return s + s\n");
    assert_eq!(plan_of(&p, "t").len(), 8);
}

/// A stand-in interpreter upgrade: a wrapper on PATH, outside the project,
/// whose bytes change. Every item re-runs, and the guard stops the mass
/// re-run naming the wrapper.
#[test]
fn an_interpreter_upgrade_is_named_by_the_guard() {
    use std::os::unix::fs::PermissionsExt;
    let tools = tempfile::tempdir().unwrap();
    let wrapper = tools.path().canonicalize().unwrap().join("mytool");
    let write_wrapper = |body: &str| {
        std::fs::write(
            &wrapper,
            format!("#!/bin/sh\n{body}\ntr a-z A-Z < \"$1\" > \"$2\"\n"),
        )
        .unwrap();
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    write_wrapper("# version 1");
    let path = format!(
        "{}:{}",
        wrapper.parent().unwrap().display(),
        std::env::var("PATH").unwrap()
    );
    let env = [("PATH", path.as_str())];
    let p = Project::new(&config(r#"["mytool", "{input}", "{output}"]"#, ""));
    for i in 0..20 {
        p.write(&format!("data/f{i:02}.txt"), "x\n");
    }
    hw_env(&p, &["run"], 0, &env);
    assert!(plan_env(&p, "t", &env).is_empty());

    write_wrapper("# version 2");
    let w = wrapper.to_string_lossy().into_owned();
    let plan = plan_env(&p, "t", &env);
    assert_eq!(plan.len(), 20);
    assert!(
        plan.values()
            .all(|(r, d)| r == "dependency" && d.as_deref() == Some(w.as_str())),
        "{plan:?}"
    );
    let refused = hw_env(&p, &["run"], 2, &env);
    assert!(
        refused.stderr.contains(&format!("dependency {w}")),
        "{}",
        refused.stderr
    );
    hw_env(&p, &["run", "--force"], 0, &env);
    assert!(plan_env(&p, "t", &env).is_empty());
}

/// `observe = false`: the recipe is declared only, the plan says so once,
/// and an undeclared script's edit goes unseen, as documented.
#[test]
fn observe_false_is_declared_only_and_says_so() {
    let p = Project::new(&config(
        r#"["sh", "up.sh", "{input}", "{output}"]"#,
        "observe = false",
    ));
    p.write("data/a.txt", "a\n");
    hw(&p, &["run"], 0);
    p.write("up.sh", "cat \"$1\" > \"$2\"\n");
    let plan = hw(&p, &["plan"], 0).stdout;
    assert_eq!(plan.matches("declared only").count(), 1, "{plan}");
    assert!(plan.contains("0 changed"), "{plan}");
}

/// SIGKILL during an observed run: the state stays consistent (no item is
/// recorded without its dependency set, no traced command outlives the
/// run), and the next run completes; then nothing is left to do.
#[test]
fn sigkill_during_an_observed_run_leaves_consistent_state() {
    let p = Project::new(&config(
        r#"["sh", "slow.sh", "{input}", "{output}"]"#,
        "guard = 0.95",
    ));
    p.write(
        "slow.sh",
        "set -eu\nsleep 0.05\ncat lib.txt \"$1\" > \"$2\"\n",
    );
    p.write("lib.txt", "L:");
    for i in 0..60 {
        p.write(&format!("data/f{i:02}.txt"), &format!("{i}\n"));
    }
    let mut child = p
        .cmd(&["run", "--jobs", "3"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let done = || match std::fs::read_dir(p.path("out")) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .filter(|e| !e.file_name().to_string_lossy().contains(".hw-tmp-"))
            .count(),
        Err(_) => 0,
    };
    while done() < 10 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "finished before the kill"
        );
        assert!(Instant::now() < deadline, "the run made no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    let pid = child.id();
    child.kill().unwrap();
    child.wait().unwrap();
    // EXITKILL and PDEATHSIG: no command of the killed run survives it.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let survivors: Vec<String> = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok())
            .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
            .filter(|s| {
                // field 4 is the parent pid
                s.rsplit(')').next().unwrap_or("").split_whitespace().nth(1)
                    == Some(&pid.to_string())
            })
            .collect();
        if survivors.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "children outlived the run: {survivors:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Every recorded item has its dependency set: the items the plan does
    // not call new are exactly those with one.
    let plan = plan_of(&p, "t");
    let recorded: BTreeSet<String> = (0..60)
        .map(|i| format!("data/f{i:02}.txt"))
        .filter(|i| plan.get(i).is_none_or(|(r, _)| r != "new"))
        .collect();
    let deps = hw(&p, &["deps", "t", "--json"], 0).json();
    let with_deps: BTreeSet<String> = deps["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| !i["deps"].as_array().unwrap().is_empty())
        .map(|i| i["item"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(recorded, with_deps);
    assert!(
        !with_deps.is_empty(),
        "some items were committed before the kill"
    );
    assert!(with_deps.len() < 60, "killed mid-run");

    hw(&p, &["run", "--jobs", "3"], 0);
    for i in 0..60 {
        assert_eq!(p.read(&format!("out/f{i:02}.txt.out")), format!("L:{i}\n"));
    }
    assert!(plan_of(&p, "t").is_empty());
    p.write("lib.txt", "M:");
    assert_eq!(plan_of(&p, "t").len(), 60);
}

const ITEMS: usize = 8;
const TABLES: usize = 4;

fn expected(readers: &[Vec<usize>], tables: &[String]) -> BTreeMap<String, Vec<u8>> {
    readers
        .iter()
        .enumerate()
        .map(|(i, ts)| {
            let body: String = ts.iter().map(|&t| tables[t].clone()).collect();
            (format!("i{i}.txt.out"), body.into_bytes())
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// Random edits to random dependency files, then a plan: exactly the
    /// items that read an edited file re-run, and after the run the
    /// outputs equal a rebuild.
    #[test]
    fn exactly_the_readers_of_edited_files_rerun(
        readers in proptest::collection::vec(proptest::collection::btree_set(0..TABLES, 0..=TABLES), ITEMS),
        edits in proptest::collection::vec((0..TABLES, "[a-z]{1,4}"), 1..4),
    ) {
        let readers: Vec<Vec<usize>> = readers.into_iter().map(|s| s.into_iter().collect()).collect();
        let p = Project::new(&config(r#"["sh", "cat.sh", "{input}", "{output}"]"#, ""));
        // Reads the tables its input names, in order; none at all is fine.
        p.write("cat.sh", "set -eu\n: > \"$2\"\nfor t in $(cat \"$1\"); do cat \"tables/$t\" >> \"$2\"; done\n");
        let mut tables: Vec<String> = (0..TABLES).map(|t| format!("t{t};")).collect();
        for (t, body) in tables.iter().enumerate() {
            p.write(&format!("tables/t{t}"), body);
        }
        for (i, ts) in readers.iter().enumerate() {
            let names: Vec<String> = ts.iter().map(|t| format!("t{t}")).collect();
            p.write(&format!("data/i{i}.txt"), &names.join(" "));
        }
        hw(&p, &["run", "--jobs", "3"], 0);
        prop_assert_eq!(contents(&p.tree("out")), expected(&readers, &tables));

        let mut edited = BTreeSet::new();
        for (t, add) in &edits {
            tables[*t].push_str(add);
            p.write(&format!("tables/t{t}"), &tables[*t]);
            edited.insert(*t);
        }
        let want: BTreeSet<String> = readers
            .iter()
            .enumerate()
            .filter(|(_, ts)| ts.iter().any(|t| edited.contains(t)))
            .map(|(i, _)| format!("data/i{i}.txt"))
            .collect();
        let plan = plan_of(&p, "t");
        prop_assert_eq!(plan.keys().cloned().collect::<BTreeSet<_>>(), want.clone());
        for (reason, dep) in plan.values() {
            prop_assert_eq!(reason.as_str(), "dependency");
            let dep = dep.clone().unwrap();
            prop_assert!(edited.iter().any(|t| dep == format!("tables/t{t}")), "{}", dep);
        }
        hw(&p, &["run", "--jobs", "3"], 0);
        prop_assert_eq!(contents(&p.tree("out")), expected(&readers, &tables));
        prop_assert!(plan_of(&p, "t").is_empty());
    }
}

/// The dependency tables exist in PostgreSQL too (the same migration 5 ->
/// 6): `state migrate` copies them, checked like every table, and the
/// PostgreSQL store commits, loads and clears an item's set.
#[test]
fn dependency_sets_migrate_to_postgres_and_round_trip_there() {
    let _g = pg_serial();
    let (_client, url) = pg_database("deps");
    let p = Project::new(&config(r#"["sh", "up.sh", "{input}", "{output}"]"#, ""));
    for i in 0..3 {
        p.write(&format!("data/f{i}.txt"), "x\n");
    }
    hw(&p, &["run"], 0);
    let migrated = hw_env(
        &p,
        &["state", "migrate", "--to-env", "HW_DEPS_PG", "--json"],
        0,
        &[("HW_DEPS_PG", url.as_str())],
    )
    .json();
    let rows: BTreeMap<String, u64> = migrated["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["table"].as_str().unwrap().to_string(),
                t["rows"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(rows["item_deps"], 3, "{migrated}");
    assert_eq!(
        rows["dep_sets"], 1,
        "three items, one shared set: {migrated}"
    );

    let mut pg = highwater_store::PgStore::open(&url, "HW_DEPS_PG").unwrap();
    assert_eq!(
        pg.schema_version().unwrap(),
        highwater_store::pg::SCHEMA_VERSION
    );
    let loaded = pg.load("t").unwrap();
    let linked: Vec<(&str, &str)> = loaded
        .item_deps()
        .map(|(e, (_, body))| (e.item.as_str(), body.as_str()))
        .collect();
    assert_eq!(linked.len(), 3, "{linked:?}");
    assert_eq!(loaded.dep_sets.len(), 1, "one shared set: {linked:?}");
    let (item, body) = linked[0];
    assert_eq!(item, "data/f0.txt");
    assert!(body.contains("up.sh"), "{body}");
    pg.commit(&Batch {
        deps: vec![("t".into(), "data/f0.txt".into(), None)],
        deletes: vec![(
            "t".into(),
            highwater_core::EntryKind::Item,
            "data/f1.txt".into(),
        )],
        ..Batch::default()
    })
    .unwrap();
    let loaded = pg.load("t").unwrap();
    let left: Vec<&str> = loaded.item_deps().map(|(e, _)| e.item.as_str()).collect();
    assert_eq!(left, vec!["data/f2.txt"]);
}

/// Starts highwater under a seccomp filter that fails `ptrace` with EPERM,
/// as a container without SYS_PTRACE does.
fn without_ptrace(p: &Project, args: &[&str]) -> Ran {
    const DENY_PTRACE: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
class F(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]
class P(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(F))]
# load nr; if nr == ptrace (101): return ERRNO(EPERM); else allow
prog = (F * 4)(F(0x20, 0, 0, 0), F(0x15, 0, 1, 101), F(0x06, 0, 0, 0x00050001), F(0x06, 0, 0, 0x7fff0000))
fp = P(4, prog)
assert libc.prctl(38, 1, 0, 0, 0) == 0
assert libc.prctl(22, 2, ctypes.byref(fp), 0, 0) == 0
os.execv(sys.argv[1], sys.argv[1:])
"#;
    let o = Command::new(python())
        .arg("-c")
        .arg(DENY_PTRACE)
        .arg(bin())
        .args(args)
        .current_dir(p.path(""))
        .output()
        .unwrap();
    Ran {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// Where ptrace is not allowed, `run` refuses (exit 2) with the fix and
/// touches nothing; it never runs unobserved quietly. With
/// `observe = false` the same machine runs the stage.
#[test]
fn without_ptrace_run_refuses_with_the_fix() {
    let p = Project::new(&config(r#"["sh", "up.sh", "{input}", "{output}"]"#, ""));
    p.write("data/a.txt", "a\n");
    let r = without_ptrace(&p, &["run"]);
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("ptrace is not permitted"), "{}", r.stderr);
    assert!(r.stderr.contains("observe = false"), "{}", r.stderr);
    assert!(!p.exists("out"), "nothing touched");
    // A plan needs no ptrace.
    assert_eq!(without_ptrace(&p, &["plan"]).code, 0);

    p.write(
        "highwater.toml",
        &config(
            r#"["sh", "up.sh", "{input}", "{output}"]"#,
            "observe = false",
        ),
    );
    let r = without_ptrace(&p, &["run"]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert_eq!(p.read("out/a.txt.out"), "A\n");
}

/// The items of stage `t` as (item -> (reason, dependency)), all with one
/// reason and each with its own dependency.
fn each(cases: &[(&str, &str)], reason: &str) -> BTreeMap<String, (String, Option<String>)> {
    cases
        .iter()
        .map(|(i, d)| (i.to_string(), (reason.to_string(), Some(d.to_string()))))
        .collect()
}

/// Issue 24: a folder above an output (here `data/`, above `data/out/`)
/// is not something the run wrote: the tables beside the output folder are
/// still dependencies. Only the folders the run created count, each one
/// itself, not what lies inside.
#[test]
fn a_folder_above_an_output_hides_nothing_inside_it() {
    let p = Project::new(
        r#"
[stages.t]
inputs = ["data/in/*.txt"]
output = "data/out/{relpath}.out"
command = ["sh", "look.sh", "{input}", "{output}"]
"#,
    );
    p.write(
        "look.sh",
        "set -eu\ncat data/tables/t.csv \"$1\" > \"$2\"\n",
    );
    p.write("data/tables/t.csv", "T:");
    let items: Vec<String> = (0..3).map(|i| format!("data/in/f{i}.txt")).collect();
    for i in &items {
        p.write(i, "x\n");
    }
    assert_eq!(run_counts(&p, &[]), (3, 0));
    assert_eq!(p.read("data/out/f0.txt.out"), "T:x\n");
    assert!(plan_of(&p, "t").is_empty(), "the run's own folders count");
    p.write("data/tables/t.csv", "T2:");
    assert_eq!(
        plan_of(&p, "t"),
        all(items, "dependency", "data/tables/t.csv")
    );
    assert_eq!(run_counts(&p, &[]), (3, 0));
    assert_eq!(p.read("data/out/f0.txt.out"), "T2:x\n");
    assert!(plan_of(&p, "t").is_empty());
}

/// Issue 24: another stage's output, read undeclared under a folder that
/// also holds this stage's outputs (`out/`), is a dependency: re-made
/// upstream, it re-runs its readers downstream.
#[test]
fn another_stages_output_read_undeclared_is_a_dependency() {
    let p = Project::new(
        r#"
[stages.a]
inputs = ["data/*.txt"]
output = "out/a/{relpath}.out"
command = ["sh", "up.sh", "{input}", "{output}"]

[stages.b]
inputs = ["data/*.txt"]
output = "out/b/{relpath}.b"
command = ["sh", "-c", "cat out/a/f0.txt.out \"$1\" > \"$2\"", "b", "{input}", "{output}"]
"#,
    );
    let items: Vec<String> = (0..3).map(|i| format!("data/f{i}.txt")).collect();
    for i in &items {
        p.write(i, "x\n");
    }
    hw(&p, &["run"], 0);
    assert_eq!(p.read("out/b/f1.txt.b"), "X\nx\n");
    settle_racy(&p, "b", "out/a/f0.txt.out");
    assert_eq!(p.read("out/b/f1.txt.b"), "X\nx\n");
    p.write("data/f0.txt", "y\n");
    hw(&p, &["run"], 0);
    assert_eq!(p.read("out/a/f0.txt.out"), "Y\n");
    assert_eq!(p.read("out/b/f1.txt.b"), "Y\nx\n", "b's readers re-ran");
    assert_eq!(plan_of(&p, "a"), BTreeMap::new());
    settle_racy(&p, "b", "out/a/f0.txt.out");
    assert_eq!(p.read("out/b/f1.txt.b"), "Y\nx\n");
}

/// b's items that started within the filesystem's timestamp tick of a's
/// write recorded `path` racy (git's rule: it may have been read before
/// the change), so the plan may name them once more, for that file and
/// nothing else; one more run settles it (seen in CI under load).
fn settle_racy(p: &Project, stage_name: &str, path: &str) {
    let left = plan_of(p, stage_name);
    for (item, why) in &left {
        assert_eq!(
            why,
            &("dependency".to_string(), Some(path.to_string())),
            "{item}"
        );
    }
    if !left.is_empty() {
        hw(p, &["run"], 0);
    }
    assert_eq!(plan_of(p, stage_name), BTreeMap::new());
}

/// Issue 24: a change that failed is no write. `mkdir -p` of an existing
/// folder does not make it the run's own, so the command's listing of it
/// is still a dependency: a new table there re-runs every item.
#[test]
fn a_mkdir_p_of_an_existing_folder_keeps_its_listing_a_dependency() {
    let p = Project::new(&config(r#"["sh", "ls.sh", "{input}", "{output}"]"#, ""));
    p.write(
        "ls.sh",
        "set -eu\nmkdir -p tables\nrm -f tables/missing.csv\nls tables > \"$2\"\n",
    );
    p.write("tables/a.csv", "a\n");
    let items: Vec<String> = (0..3).map(|i| format!("data/f{i}.txt")).collect();
    for i in &items {
        p.write(i, "x\n");
    }
    assert_eq!(run_counts(&p, &[]), (3, 0));
    assert_eq!(p.read("out/f0.txt.out"), "a.csv\n");
    assert!(plan_of(&p, "t").is_empty());
    p.write("tables/b.csv", "b\n");
    assert_eq!(
        plan_of(&p, "t"),
        all(items, "dependency", "tables (+b.csv)")
    );
    assert_eq!(run_counts(&p, &[]), (3, 0));
    assert_eq!(p.read("out/f0.txt.out"), "a.csv\nb.csv\n");
    assert!(plan_of(&p, "t").is_empty());
}

/// Issue 24: sqlite opens its database read-write (O_RDWR|O_CREAT, no
/// O_TRUNC) even to read it. That open is a read: editing the database
/// re-runs every item; reading it does not make the next plan re-run.
#[test]
fn a_database_opened_read_write_to_be_read_is_a_dependency() {
    let py = python();
    let p = Project::new(&config(
        &format!(r#"["{py}", "q.py", "{{input}}", "{{output}}"]"#),
        "",
    ));
    p.write(
        "q.py",
        "import sqlite3, sys\n\
         v = sqlite3.connect('lookup.db').execute('select v from t').fetchone()[0]\n\
         open(sys.argv[2], 'w').write(open(sys.argv[1]).read() + v)\n",
    );
    let set = |v: &str| {
        let db = rusqlite::Connection::open(p.path("lookup.db")).unwrap();
        db.execute_batch("CREATE TABLE IF NOT EXISTS t (v TEXT); DELETE FROM t;")
            .unwrap();
        db.execute("INSERT INTO t VALUES (?1)", [v]).unwrap();
    };
    set("one");
    let items: Vec<String> = (0..3).map(|i| format!("data/f{i}.txt")).collect();
    for i in &items {
        p.write(i, "x:");
    }
    assert_eq!(run_counts(&p, &[]), (3, 0));
    assert_eq!(p.read("out/f0.txt.out"), "x:one");
    assert!(plan_of(&p, "t").is_empty());
    set("two");
    assert_eq!(plan_of(&p, "t"), all(items, "dependency", "lookup.db"));
    assert_eq!(run_counts(&p, &[]), (3, 0));
    assert_eq!(p.read("out/f0.txt.out"), "x:two");
    assert!(plan_of(&p, "t").is_empty());
}

/// Opens the FIFO `path` for writing, which returns once the command has
/// opened it to wait (so it has done its reads), runs `act`, and lets the
/// command go on. Gives up after two minutes rather than hang the suite.
fn while_waiting(path: std::path::PathBuf, act: impl FnOnce()) {
    let (tx, rx) = std::sync::mpsc::channel();
    let opener = path.clone();
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::OpenOptions::new().write(true).open(opener));
    });
    let mut f = rx
        .recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| panic!("the command never waited on {}", path.display()))
        .unwrap();
    act();
    use std::io::Write;
    f.write_all(b"go\n").unwrap();
}

/// Issue 47 (lesser): a link whose text a command reads (`readlink`) is a
/// dependency as a link: re-pointing it re-runs the item even when the new
/// target's content equals the old one's. Only the target's content was
/// recorded, so the output kept naming the old target.
#[test]
fn a_repointed_link_reruns_the_command_that_read_it() {
    let p = Project::new(&config(
        r#"["sh", "-c", "readlink current > \"$1\"", "sh", "{output}"]"#,
        "",
    ));
    p.write("releases/v1.txt", "same\n");
    p.write("releases/v2.txt", "same\n");
    std::os::unix::fs::symlink("releases/v1.txt", p.path("current")).unwrap();
    p.write("data/f0.txt", "x\n");
    assert_eq!(run_counts(&p, &[]), (1, 0));
    assert_eq!(p.read("out/f0.txt.out"), "releases/v1.txt\n");
    assert!(plan_of(&p, "t").is_empty());
    std::fs::remove_file(p.path("current")).unwrap();
    std::os::unix::fs::symlink("releases/v2.txt", p.path("current")).unwrap();
    assert_eq!(
        plan_of(&p, "t"),
        all(["data/f0.txt".to_string()], "dependency", "current")
    );
    assert_eq!(run_counts(&p, &[]), (1, 0));
    assert_eq!(p.read("out/f0.txt.out"), "releases/v2.txt\n");
    assert!(plan_of(&p, "t").is_empty());
}

/// Issue 47 (lesser): `cd` into a folder that does not exist is a lookup:
/// creating the folder (with a file the command then reads) re-runs the
/// item. It was not traced, so the item kept its defaults.
#[test]
fn a_cd_into_an_absent_folder_is_a_dependency() {
    let p = Project::new(&config(
        r#"["sh", "-c", "out=$1; if cd conf.d 2>/dev/null; then cat *.conf > \"$out\"; else echo defaults > \"$out\"; fi", "sh", "{output}"]"#,
        "",
    ));
    p.write("data/f0.txt", "x\n");
    assert_eq!(run_counts(&p, &[]), (1, 0));
    assert_eq!(p.read("out/f0.txt.out"), "defaults\n");
    assert!(plan_of(&p, "t").is_empty());
    p.write("conf.d/a.conf", "a=1\n");
    assert_eq!(
        plan_of(&p, "t"),
        all(["data/f0.txt".to_string()], "dependency", "conf.d")
    );
    assert_eq!(run_counts(&p, &[]), (1, 0));
    assert_eq!(p.read("out/f0.txt.out"), "a=1\n");
}

/// Issue 47 (lesser): a file in /dev/shm (a shared-memory filesystem of
/// ordinary files) that another process wrote is a dependency like any
/// other: editing it re-runs its readers. It was dropped with /dev.
#[test]
fn a_file_in_dev_shm_is_a_dependency() {
    let shm = std::path::Path::new("/dev/shm");
    assert!(shm.is_dir(), "/dev/shm is needed by this test");
    let name = format!(
        "highwater-test-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    )
    .replace(['(', ')'], "");
    let file = shm.join(&name);
    std::fs::write(&file, "one\n").unwrap();
    let p = Project::new(&config(
        &format!(
            r#"["sh", "-c", "cat {} > \"$1\"", "sh", "{{output}}"]"#,
            file.display()
        ),
        "",
    ));
    p.write("data/f0.txt", "x\n");
    assert_eq!(run_counts(&p, &[]), (1, 0));
    assert!(plan_of(&p, "t").is_empty());
    std::fs::write(&file, "two\n").unwrap();
    let plan = plan_of(&p, "t");
    let _ = std::fs::remove_file(&file);
    assert_eq!(
        plan,
        all(
            ["data/f0.txt".to_string()],
            "dependency",
            &file.to_string_lossy()
        )
    );
}

/// Issue 47 (lesser): a dependency whose mtime lies in the future (a
/// tarball's date, a skewed clock) was recorded racy at every run, so its
/// items re-ran at every plan forever. It is recorded (its ctime shows it
/// was not changed during the run) and plans re-hash it: nothing re-runs
/// until its content changes.
#[test]
fn a_dependency_dated_in_the_future_reruns_nothing_until_it_changes() {
    let p = Project::new(&config(
        r#"["sh", "-c", "cat lib.txt > \"$1\"", "sh", "{output}"]"#,
        "",
    ));
    p.write("lib.txt", "lib\n");
    let future = std::time::SystemTime::now() + Duration::from_secs(86_400);
    std::fs::File::options()
        .write(true)
        .open(p.path("lib.txt"))
        .unwrap()
        .set_modified(future)
        .unwrap();
    // The ctime that set_modified moved must lie before the run.
    std::thread::sleep(Duration::from_millis(20));
    let items: Vec<String> = (0..2).map(|i| format!("data/f{i}.txt")).collect();
    for i in &items {
        p.write(i, "x\n");
    }
    assert_eq!(run_counts(&p, &[]), (2, 0));
    assert!(plan_of(&p, "t").is_empty(), "no re-run for a future date");
    assert!(plan_of(&p, "t").is_empty());
    p.write("lib.txt", "LIB\n");
    assert_eq!(plan_of(&p, "t"), all(items, "dependency", "lib.txt"));
    assert_eq!(run_counts(&p, &[]), (2, 0));
    assert_eq!(p.read("out/f0.txt.out"), "LIB\n");
}

/// Issue 47, item 6: a folder the command listed that gains a name while
/// the command runs on is racy, like a file changed meanwhile: the listing
/// taken after the command is not what it saw, so the next plan re-runs
/// the item, and the output then holds the new name.
#[test]
fn a_listed_folder_that_changes_during_the_run_reruns_its_item() {
    let p = Project::new(&config(r#"["sh", "ls.sh", "{input}", "{output}"]"#, ""));
    let sync = tempfile::tempdir().unwrap();
    p.write(
        "ls.sh",
        "set -eu\nls plugins > \"$2\"\nread _ < \"$SYNC/go\"\n",
    );
    p.write("plugins/a.sh", "a\n");
    p.write("data/f0.txt", "x\n");
    assert!(Command::new("mkfifo")
        .arg(sync.path().join("go"))
        .status()
        .unwrap()
        .success());
    let child = p
        .cmd(&["run"])
        .env("SYNC", sync.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    while_waiting(sync.path().join("go"), || p.write("plugins/b.sh", "b\n"));
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        p.read("out/f0.txt.out"),
        "a.sh\n",
        "listed before b.sh came"
    );
    let plan = plan_of(&p, "t");
    assert_eq!(
        plan.keys().cloned().collect::<Vec<_>>(),
        vec!["data/f0.txt"]
    );
    assert_eq!(plan["data/f0.txt"].0, "dependency");
    assert!(
        plan["data/f0.txt"]
            .1
            .as_deref()
            .unwrap()
            .starts_with("plugins"),
        "{plan:?}"
    );
    // The re-run (the fifo answered at once this time) sees b.sh.
    let feeder = {
        let fifo = sync.path().join("go");
        std::thread::spawn(move || {
            let _ = std::fs::write(fifo, "go\n");
        })
    };
    let sync_dir = sync.path().to_str().unwrap().to_string();
    let r = hw_env(&p, &["run", "--json"], 0, &[("SYNC", sync_dir.as_str())]).json();
    assert_eq!(stage(&r, "t")["processed"], 1, "{r}");
    feeder.join().unwrap();
    assert_eq!(p.read("out/f0.txt.out"), "a.sh\nb.sh\n");
    assert!(plan_of(&p, "t").is_empty());
}

/// Issue 24: evidence is taken after the command exits, so git's racy rule
/// keeps it honest. A table edited while the command ran, one read and
/// then deleted, and one looked up absent that appeared meanwhile: each
/// makes the next plan re-run its reader, naming it.
#[test]
fn a_dependency_changed_while_its_command_ran_reruns_it() {
    // No stat margin: the racy record alone must carry the edit, however
    // long before the record it was made (with the default margin, an
    // edit this recent would be re-hashed anyway).
    let p = Project::new(&config(
        r#"["sh", "race.sh", "{input}", "{output}"]"#,
        "mtime_margin_ms = 0",
    ));
    let sync = tempfile::tempdir().unwrap();
    p.write(
        "race.sh",
        "set -eu\nt=$(cat \"$1\")\n\
         if [ -e \"tables/$t\" ]; then cat \"tables/$t\"; fi > \"$2\"\n\
         read _ < \"$SYNC/$t\"\n",
    );
    for t in ["a.csv", "b.csv", "c.csv"] {
        p.write(&format!("data/{t}.txt"), t);
        let fifo = sync.path().join(t);
        assert!(Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
    }
    p.write("tables/a.csv", "a1\n");
    p.write("tables/b.csv", "b1\n");
    let child = p
        .cmd(&["run", "--jobs", "3"])
        .env("SYNC", sync.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    while_waiting(sync.path().join("a.csv"), || {
        p.write("tables/a.csv", "a2\n")
    });
    while_waiting(sync.path().join("b.csv"), || {
        std::fs::remove_file(p.path("tables/b.csv")).unwrap()
    });
    while_waiting(sync.path().join("c.csv"), || {
        p.write("tables/c.csv", "c2\n")
    });
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(p.read("out/a.csv.txt.out"), "a1\n");
    assert_eq!(p.read("out/c.csv.txt.out"), "");
    // Deleted, then back with other bytes: the record must not have
    // quietly dropped it.
    p.write("tables/b.csv", "b2\n");
    let want = each(
        &[
            ("data/a.csv.txt", "tables/a.csv"),
            ("data/b.csv.txt", "tables/b.csv"),
            ("data/c.csv.txt", "tables/c.csv"),
        ],
        "dependency",
    );
    assert_eq!(plan_of(&p, "t"), want);
    // The re-run records what it read, and is then trusted.
    let r = p
        .cmd(&["run", "--json"])
        .env("SYNC", sync.path())
        .spawn()
        .unwrap();
    for t in ["a.csv", "b.csv", "c.csv"] {
        while_waiting(sync.path().join(t), || {});
    }
    assert!(r.wait_with_output().unwrap().status.success());
    assert_eq!(p.read("out/a.csv.txt.out"), "a2\n");
    assert_eq!(p.read("out/b.csv.txt.out"), "b2\n");
    assert_eq!(p.read("out/c.csv.txt.out"), "c2\n");
    assert!(plan_of(&p, "t").is_empty());
}

/// Issue 24: a dangling symlink inside the project is absent to the
/// tracer, to the record and to the plan alike (followed, as the command's
/// open follows it), so it does not re-run every plan; `.git` is never a
/// dependency, so a `git add` after a run that read the index re-runs
/// nothing.
#[test]
fn a_dangling_symlink_and_git_index_do_not_rerun_every_plan() {
    let p = Project::new(&config(r#"["sh", "dangle.sh", "{input}", "{output}"]"#, ""));
    p.write(
        "dangle.sh",
        "set -eu\ngit ls-files >/dev/null\n\
         if [ -e tables/link.csv ]; then cat tables/link.csv; fi > \"$2\"\n",
    );
    p.write("tables/keep.csv", "k\n");
    p.write("notes.txt", "n\n");
    std::os::unix::fs::symlink("missing.csv", p.path("tables/link.csv")).unwrap();
    let git = |args: &[&str]| {
        let s = Command::new("git")
            .args(args)
            .current_dir(p.path(""))
            .stdout(std::process::Stdio::null())
            .status()
            .expect("git is needed by this test");
        assert!(s.success(), "git {args:?}");
    };
    git(&["init", "-q"]);
    git(&["add", "dangle.sh"]);
    let items: Vec<String> = (0..3).map(|i| format!("data/f{i}.txt")).collect();
    for i in &items {
        p.write(i, "x\n");
    }
    assert_eq!(run_counts(&p, &[]), (3, 0));
    let deps = hw(&p, &["deps", "t", "data/f0.txt", "--json"], 0).json();
    let paths: Vec<&str> = deps["items"][0]["deps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap())
        .collect();
    assert!(paths.contains(&"tables/link.csv"), "{deps}");
    assert!(!paths.iter().any(|p| p.starts_with(".git")), "{deps}");
    assert!(plan_of(&p, "t").is_empty(), "a dangling link re-runs");
    git(&["add", "notes.txt"]);
    assert!(plan_of(&p, "t").is_empty(), "git's index re-runs");
    // The link's target appears: now the command would read it.
    p.write("tables/missing.csv", "m\n");
    assert_eq!(
        plan_of(&p, "t"),
        all(items, "dependency", "tables/link.csv")
    );
    assert_eq!(run_counts(&p, &[]), (3, 0));
    assert_eq!(p.read("out/f0.txt.out"), "m\n");
    assert!(plan_of(&p, "t").is_empty());
}

const MANY_ITEMS: usize = 16;
const SLOTS: usize = 8;

/// What each item's output is from the tables as they are: each table it
/// names, or `no tN;` for one that does not exist, then, for a lister, the
/// folder's names.
/// Whether `dep` is the listing of `tables` naming exactly the slots that
/// appeared (+) or went (-) between `before` and `after` (issue 47: the
/// plan says which names), or as many of them as a plan shows.
fn listing_names(dep: &str, before: &[Option<String>], after: &[Option<String>]) -> bool {
    let mut names: Vec<String> = (0..before.len())
        .filter(|&s| before[s].is_none() && after[s].is_some())
        .map(|s| format!("+t{s}"))
        .chain(
            (0..before.len())
                .filter(|&s| before[s].is_some() && after[s].is_none())
                .map(|s| format!("-t{s}")),
        )
        .collect();
    let more = names.len().saturating_sub(3);
    names.truncate(3);
    if more > 0 {
        names.push(format!("{more} more"));
    }
    dep == format!("tables ({})", names.join(", "))
}

fn rebuilt(readers: &[(Vec<usize>, bool)], slots: &[Option<String>]) -> BTreeMap<String, Vec<u8>> {
    let mut names: Vec<String> = vec![".".into(), "..".into()];
    names.extend(
        (0..SLOTS)
            .filter(|&s| slots[s].is_some())
            .map(|s| format!("t{s}")),
    );
    names.sort();
    readers
        .iter()
        .enumerate()
        .map(|(i, (ts, lists))| {
            let mut body: String = ts
                .iter()
                .map(|&t| slots[t].clone().unwrap_or_else(|| format!("no t{t};\n")))
                .collect();
            if *lists {
                for n in &names {
                    body.push_str(n);
                    body.push('\n');
                }
            }
            (format!("i{i:02}.txt.out"), body.into_bytes())
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Random creates, edits and deletes of dependency files, some of them
    /// absent when read and some items listing their folder: exactly the
    /// items whose recorded view changed re-run (a table it read edited or
    /// gone, one it found absent created, a name added to or removed from a
    /// folder it listed), each naming what changed; after the run the
    /// outputs equal a rebuild, and the next plan is empty.
    #[test]
    fn creates_edits_and_deletes_rerun_exactly_the_items_that_saw_them(
        readers in proptest::collection::vec(
            (proptest::collection::btree_set(0..SLOTS, 0..=3), proptest::bool::weighted(0.25)),
            MANY_ITEMS,
        ),
        initial in proptest::collection::vec(proptest::option::weighted(0.6, "[a-z]{1,3}"), SLOTS),
        // (slot, Some(text): write it, creating or editing; None: delete)
        ops in proptest::collection::vec((0..SLOTS, proptest::option::weighted(0.6, "[a-z]{1,3}")), 1..6),
    ) {
        let readers: Vec<(Vec<usize>, bool)> =
            readers.into_iter().map(|(s, l)| (s.into_iter().collect(), l)).collect();
        // Most items may read an edited table: the guard is not under test.
        let p = Project::new(&config(r#"["sh", "cat.sh", "{input}", "{output}"]"#, "guard = 1.0"));
        // Tables its input names, each read or found absent; `ls` for a
        // lister (`-f`: the names only, no stat of each).
        p.write(
            "cat.sh",
            concat!(
                "set -eu\nout=\"$2\"\n: > \"$out\"\n",
                "for t in $(cat \"$1\"); do\n",
                "  case $t in ls) ls -f tables | sort >> \"$out\" ;;\n",
                "  *) if [ -e \"tables/$t\" ]; then cat \"tables/$t\" >> \"$out\"; else echo \"no $t;\" >> \"$out\"; fi ;;\n",
                "  esac\ndone\n",
            ),
        );
        std::fs::create_dir_all(p.path("tables")).unwrap();
        let slot_text = |s: &str| format!("{s};\n");
        let mut slots: Vec<Option<String>> = initial.iter().map(|o| o.as_deref().map(slot_text)).collect();
        for (s, body) in slots.iter().enumerate() {
            if let Some(b) = body {
                p.write(&format!("tables/t{s}"), b);
            }
        }
        for (i, (ts, lists)) in readers.iter().enumerate() {
            let mut words: Vec<String> = ts.iter().map(|t| format!("t{t}")).collect();
            if *lists {
                words.push("ls".into());
            }
            p.write(&format!("data/i{i:02}.txt"), &words.join(" "));
        }
        hw(&p, &["run", "--jobs", "3"], 0);
        prop_assert_eq!(contents(&p.tree("out")), rebuilt(&readers, &slots));
        prop_assert!(plan_of(&p, "t").is_empty());

        let before = slots.clone();
        for (s, op) in &ops {
            let path = p.path(&format!("tables/t{s}"));
            match op {
                Some(text) => {
                    // Appended to an existing table: an edit always changes it.
                    let body = format!("{}{}", slots[*s].clone().unwrap_or_default(), slot_text(text));
                    std::fs::write(&path, &body).unwrap();
                    slots[*s] = Some(body);
                }
                None => {
                    let _ = std::fs::remove_file(&path);
                    slots[*s] = None;
                }
            }
        }
        let changed: BTreeSet<usize> = (0..SLOTS).filter(|&s| before[s] != slots[s]).collect();
        let names_changed = (0..SLOTS).any(|s| before[s].is_some() != slots[s].is_some());
        let want: BTreeSet<String> = readers
            .iter()
            .enumerate()
            .filter(|(_, (ts, lists))| ts.iter().any(|t| changed.contains(t)) || (*lists && names_changed))
            .map(|(i, _)| format!("data/i{i:02}.txt"))
            .collect();
        let plan = plan_of(&p, "t");
        prop_assert_eq!(plan.keys().cloned().collect::<BTreeSet<_>>(), want);
        for (reason, dep) in plan.values() {
            prop_assert_eq!(reason.as_str(), "dependency");
            let dep = dep.clone().unwrap();
            prop_assert!(
                changed.iter().any(|s| dep == format!("tables/t{s}"))
                    || (names_changed && listing_names(&dep, &before, &slots)),
                "{}", dep
            );
        }
        hw(&p, &["run", "--jobs", "3"], 0);
        prop_assert_eq!(contents(&p.tree("out")), rebuilt(&readers, &slots));
        prop_assert!(plan_of(&p, "t").is_empty());
    }
}

/// Issue 47, item 5: a database the command opens read-write only to read
/// it (`sqlite3.connect`), updated by another process while the command
/// runs. The output holds the old value, so the database must count as
/// changed during the run: the next plan re-runs the item, naming it, and
/// a later edit re-runs it too. Before, the changed stat of a read-write
/// file was blamed on the command: the database was dropped from the
/// dependencies and every later plan was empty.
#[test]
fn a_read_write_database_changed_by_another_process_during_the_run_reruns() {
    let py = python();
    let p = Project::new(&config(
        &format!(r#"["{py}", "q.py", "{{input}}", "{{output}}"]"#),
        "",
    ));
    p.write(
        "q.py",
        "import os, sqlite3, sys\n\
         v = sqlite3.connect('ref.db').execute('select v from t').fetchone()[0]\n\
         open(os.environ['SYNC'] + '/go').read()\n\
         open(sys.argv[2], 'w').write(open(sys.argv[1]).read() + v)\n",
    );
    let set = |v: &str| {
        let db = rusqlite::Connection::open(p.path("ref.db")).unwrap();
        db.execute_batch("CREATE TABLE IF NOT EXISTS t (v TEXT); DELETE FROM t;")
            .unwrap();
        db.execute("INSERT INTO t VALUES (?1)", [v]).unwrap();
    };
    set("old");
    p.write("data/f0.txt", "x:");
    let sync = tempfile::tempdir().unwrap();
    assert!(Command::new("mkfifo")
        .arg(sync.path().join("go"))
        .status()
        .unwrap()
        .success());
    let child = p
        .cmd(&["run"])
        .env("SYNC", sync.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    while_waiting(sync.path().join("go"), || set("new"));
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(p.read("out/f0.txt.out"), "x:old", "read before the update");
    assert_eq!(
        plan_of(&p, "t"),
        all(vec!["data/f0.txt".to_string()], "dependency", "ref.db")
    );
    let feeder = {
        let fifo = sync.path().join("go");
        std::thread::spawn(move || {
            let _ = std::fs::write(fifo, "go\n");
        })
    };
    let sync_dir = sync.path().to_str().unwrap().to_string();
    hw_env(&p, &["run"], 0, &[("SYNC", sync_dir.as_str())]);
    feeder.join().unwrap();
    assert_eq!(p.read("out/f0.txt.out"), "x:new");
    assert!(plan_of(&p, "t").is_empty());
    // Still a dependency: a later edit re-runs the item.
    set("newer");
    assert_eq!(
        plan_of(&p, "t"),
        all(vec!["data/f0.txt".to_string()], "dependency", "ref.db")
    );
}

/// Issue 47, item 5, the other side: a command that writes the database
/// it opened read-write is the one that changed it (its `pwrite`s are the
/// evidence), so the next plan is empty, run after run.
#[test]
fn a_database_the_command_writes_is_its_own_and_reruns_nothing() {
    let py = python();
    let p = Project::new(&config(
        &format!(r#"["{py}", "w.py", "{{input}}", "{{output}}"]"#),
        "",
    ));
    p.write(
        "w.py",
        "import sqlite3, sys\n\
         db = sqlite3.connect('log.db')\n\
         db.execute('create table if not exists runs (item text)')\n\
         db.execute('insert into runs values (?)', (sys.argv[1],))\n\
         db.commit()\n\
         open(sys.argv[2], 'w').write('ok')\n",
    );
    {
        let db = rusqlite::Connection::open(p.path("log.db")).unwrap();
        db.execute_batch("CREATE TABLE runs (item TEXT);").unwrap();
    }
    let items: Vec<String> = (0..3).map(|i| format!("data/f{i}.txt")).collect();
    for i in &items {
        p.write(i, "x");
    }
    assert_eq!(run_counts(&p, &[]), (3, 0));
    assert!(plan_of(&p, "t").is_empty());
    assert_eq!(run_counts(&p, &[]), (0, 3), "nothing re-runs");
}

/// Issue 47, item 4: a project folder that is a symbolic link to a folder
/// outside the project (`plugins -> /srv/plugins`). The kernel names a
/// listed folder and the working folder by their real paths, so the
/// listing was stored under the outside path and dropped, and so were
/// lookups after a `cd` into it: adding `plugins/b.sh` or `plugins/opt.conf`
/// re-ran nothing. They count under the project's name now.
#[test]
fn a_folder_linked_from_outside_the_project_counts_as_the_projects() {
    let outside = tempfile::tempdir().unwrap();
    let srv = outside.path().join("plugins");
    std::fs::create_dir(&srv).unwrap();
    std::fs::write(srv.join("a.sh"), "echo a\n").unwrap();
    let p = Project::new(&config(r#"["sh", "run.sh", "{input}", "{output}"]"#, ""));
    std::os::unix::fs::symlink(&srv, p.path("plugins")).unwrap();
    p.write(
        "run.sh",
        "set -eu\nout=\"$2\"\nfor f in plugins/*.sh; do sh \"$f\"; done > \"$out\"\n\
         cd plugins\ncat opt.conf >> \"$out\" 2>/dev/null || echo defaults >> \"$out\"\n",
    );
    p.write("data/f0.txt", "x\n");
    let item = vec!["data/f0.txt".to_string()];
    assert_eq!(run_counts(&p, &[]), (1, 0));
    assert_eq!(p.read("out/f0.txt.out"), "a\ndefaults\n");
    assert!(plan_of(&p, "t").is_empty());
    std::fs::write(srv.join("b.sh"), "echo b\n").unwrap();
    assert_eq!(
        plan_of(&p, "t"),
        all(item.clone(), "dependency", "plugins (+b.sh)")
    );
    assert_eq!(run_counts(&p, &[]), (1, 0));
    assert_eq!(p.read("out/f0.txt.out"), "a\nb\ndefaults\n");
    assert!(plan_of(&p, "t").is_empty());
    // Looked up absent after the `cd`: creating it re-runs the item (the
    // listing names it too; either reason is the truth).
    std::fs::write(srv.join("opt.conf"), "conf\n").unwrap();
    let plan = plan_of(&p, "t");
    assert_eq!(plan.keys().cloned().collect::<Vec<_>>(), item);
    assert_eq!(plan["data/f0.txt"].0, "dependency");
    assert!(
        plan["data/f0.txt"]
            .1
            .as_deref()
            .unwrap()
            .starts_with("plugins"),
        "{plan:?}"
    );
    assert_eq!(run_counts(&p, &[]), (1, 0));
    assert_eq!(p.read("out/f0.txt.out"), "a\nb\nconf\n");
    assert!(plan_of(&p, "t").is_empty());
}

/// Issue 47 (lesser): file names that are not UTF-8 are recorded exactly
/// (as `\xHH` in their spelling). Before, both became U+FFFD: reading
/// `lib\xff.txt` re-ran its item at every plan (the recorded name named no
/// file), and creating an absent `opt\xfe.conf` re-ran nothing.
#[test]
fn names_that_are_not_utf8_are_recorded_exactly() {
    use std::os::unix::ffi::OsStrExt;
    let p = Project::new(&config(r#"["sh", "run.sh", "{input}", "{output}"]"#, ""));
    p.write(
        "run.sh",
        "set -eu\nlib=$(printf 'lib\\377.txt')\nopt=$(printf 'opt\\376.conf')\n\
         { cat \"$lib\"; cat \"$opt\" 2>/dev/null || echo defaults; } > \"$2\"\n",
    );
    let name = |b: &[u8]| p.path("").join(std::ffi::OsStr::from_bytes(b));
    std::fs::write(name(b"lib\xff.txt"), "lib\n").unwrap();
    p.write("data/f0.txt", "x\n");
    assert_eq!(run_counts(&p, &[]), (1, 0));
    assert_eq!(p.read("out/f0.txt.out"), "lib\ndefaults\n");
    assert!(plan_of(&p, "t").is_empty(), "a read name re-runs nothing");
    std::fs::write(name(b"opt\xfe.conf"), "conf\n").unwrap();
    assert_eq!(
        plan_of(&p, "t"),
        all(vec!["data/f0.txt".into()], "dependency", "opt\\xfe.conf")
    );
    assert_eq!(run_counts(&p, &[]), (1, 0));
    assert_eq!(p.read("out/f0.txt.out"), "lib\nconf\n");
    std::fs::write(name(b"lib\xff.txt"), "lib2\n").unwrap();
    assert_eq!(
        plan_of(&p, "t"),
        all(vec!["data/f0.txt".into()], "dependency", "lib\\xff.txt")
    );
}

/// Issue 47 (lesser): the ELF interpreter of a program (`PT_INTERP`, the
/// dynamic loader the kernel maps itself, unseen by any filter) is a
/// dependency like a shebang's interpreter: a loader kept in the project
/// and updated re-runs the items of the programs it loads.
#[test]
fn a_programs_elf_interpreter_in_the_project_is_a_dependency() {
    let p = Project::new(&config(r#"["tools/copy", "{input}", "{output}"]"#, ""));
    std::fs::create_dir_all(p.path("tools")).unwrap();
    std::fs::copy("/lib64/ld-linux-x86-64.so.2", p.path("tools/ld.so")).unwrap();
    let src = tempfile::tempdir().unwrap();
    std::fs::write(
        src.path().join("copy.c"),
        "#include <stdio.h>\nint main(int c, char **v) {\n  FILE *i = fopen(v[1], \"r\"), *o = fopen(v[2], \"w\");\n  int ch;\n  while ((ch = fgetc(i)) != EOF) fputc(ch, o);\n  return 0;\n}\n",
    )
    .unwrap();
    let loader = format!("-Wl,--dynamic-linker={}", p.path("tools/ld.so").display());
    let cc = Command::new("cc")
        .arg(src.path().join("copy.c"))
        .args(["-o", p.path("tools/copy").to_str().unwrap(), &loader])
        .output()
        .unwrap();
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    p.write("data/f0.txt", "x\n");
    assert_eq!(run_counts(&p, &[]), (1, 0));
    assert_eq!(p.read("out/f0.txt.out"), "x\n");
    assert!(plan_of(&p, "t").is_empty());
    // A loader with a byte appended still loads; its content changed.
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(p.path("tools/ld.so"))
        .unwrap()
        .write_all(b"\0")
        .unwrap();
    assert_eq!(
        plan_of(&p, "t"),
        all(vec!["data/f0.txt".into()], "dependency", "tools/ld.so")
    );
    assert_eq!(run_counts(&p, &[]), (1, 0));
    assert!(plan_of(&p, "t").is_empty());
}

/// Issue 47 (lesser): highwater run as the command of another highwater's
/// observed stage (or under `strace -f`) finds its commands traced
/// already. It said ptrace was not permitted and blamed containers and
/// Yama; now it names the tracer and the fix, and touches nothing.
#[test]
fn a_nested_highwater_names_its_tracer_and_the_fix() {
    let inner = Project::new(&config(r#"["sh", "up.sh", "{input}", "{output}"]"#, ""));
    inner.write("data/a.txt", "a\n");
    let hw_bin = bin();
    let outer = Project::new(&format!(
        "[stages.nest]\ninputs = [\"data/*.txt\"]\noutput = \"out/{{relpath}}.log\"\n\
         command = [\"sh\", \"-c\", \"cd '{}' && '{}' run > \\\"$1\\\" 2>&1; echo \\\"exit $?\\\" >> \\\"$1\\\"\", \"sh\", \"{{output}}\"]\n",
        inner.path("").display(),
        hw_bin,
    ));
    outer.write("data/x.txt", "x\n");
    hw(&outer, &["run"], 0);
    let log = outer.read("out/x.txt.log");
    assert!(log.contains("is itself traced by"), "{log}");
    assert!(
        log.contains("set `observe = false` on that outer stage"),
        "{log}"
    );
    assert!(log.ends_with("exit 2\n"), "{log}");
    assert!(!inner.exists("out"), "the inner run touched nothing");
}

/// Issue 47 (lesser): where the kernel refuses the seccomp filter, `run`
/// says so with the fix (exit 2, nothing touched). It said "cannot start
/// `true`: Invalid argument".
#[test]
fn without_seccomp_run_names_it_and_the_fix() {
    const DENY_SECCOMP: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
class F(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]
class P(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(F))]
# load nr; if nr == seccomp (317): return ERRNO(EINVAL); else allow
prog = (F * 4)(F(0x20, 0, 0, 0), F(0x15, 0, 1, 317), F(0x06, 0, 0, 0x00050016), F(0x06, 0, 0, 0x7fff0000))
fp = P(4, prog)
assert libc.prctl(38, 1, 0, 0, 0) == 0
assert libc.prctl(22, 2, ctypes.byref(fp), 0, 0) == 0
os.execv(sys.argv[1], sys.argv[1:])
"#;
    let p = Project::new(&config(r#"["sh", "up.sh", "{input}", "{output}"]"#, ""));
    p.write("data/a.txt", "a\n");
    let o = Command::new(python())
        .arg("-c")
        .arg(DENY_SECCOMP)
        .arg(bin())
        .arg("run")
        .current_dir(p.path(""))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("refused the seccomp filter"), "{stderr}");
    assert!(stderr.contains("observe = false"), "{stderr}");
    assert!(!p.exists("out"), "nothing touched");
}

/// A slot of the renames-and-links property test: absent, a file with its
/// text, or a symbolic link to another slot (`tN`, relative).
#[derive(Clone, Debug, PartialEq)]
enum Slot {
    Absent,
    File(String),
    Link(usize),
}

/// What reading slot `s` gives: a file's text, through any chain of links
/// (a loop or a dangling end reads as absent, as `[ -e ]` says).
fn slot_view(slots: &[Slot], mut s: usize) -> Option<String> {
    for _ in 0..=slots.len() {
        match &slots[s] {
            Slot::File(t) => return Some(t.clone()),
            Slot::Link(u) => s = *u,
            Slot::Absent => return None,
        }
    }
    None
}

/// Each item's output from the slots as they are (see `cat.sh` below).
fn rebuilt_links(readers: &[(Vec<usize>, bool)], slots: &[Slot]) -> BTreeMap<String, Vec<u8>> {
    let mut names: Vec<String> = vec![".".into(), "..".into()];
    names.extend(
        (0..slots.len())
            .filter(|&s| slots[s] != Slot::Absent)
            .map(|s| format!("t{s}")),
    );
    names.sort();
    readers
        .iter()
        .enumerate()
        .map(|(i, (ts, lists))| {
            let mut body: String = ts
                .iter()
                .map(|&t| slot_view(slots, t).unwrap_or_else(|| format!("no t{t};\n")))
                .collect();
            if *lists {
                for n in &names {
                    body.push_str(n);
                    body.push('\n');
                }
            }
            (format!("i{i:02}.txt.out"), body.into_bytes())
        })
        .collect()
}

/// One move of the other actor on the slots' folder.
#[derive(Clone, Debug)]
enum Move {
    Write(usize, String),
    Delete(usize),
    Rename(usize, usize),
    Link(usize, usize),
}

fn a_move() -> impl Strategy<Value = Move> {
    prop_oneof![
        (0..LINK_SLOTS, "[a-z]{1,3}").prop_map(|(s, t)| Move::Write(s, format!("{t};\n"))),
        (0..LINK_SLOTS).prop_map(Move::Delete),
        (0..LINK_SLOTS, 0..LINK_SLOTS).prop_map(|(a, b)| Move::Rename(a, b)),
        (0..LINK_SLOTS, 0..LINK_SLOTS).prop_map(|(a, b)| Move::Link(a, b)),
    ]
}

const LINK_SLOTS: usize = 6;

/// Makes `m` in the folder and in the model.
fn make_move(dir: &std::path::Path, slots: &mut [Slot], m: &Move) {
    let path = |s: usize| dir.join(format!("t{s}"));
    match m {
        Move::Write(s, text) => {
            let _ = std::fs::remove_file(path(*s));
            std::fs::write(path(*s), text).unwrap();
            slots[*s] = Slot::File(text.clone());
        }
        Move::Delete(s) => {
            let _ = std::fs::remove_file(path(*s));
            slots[*s] = Slot::Absent;
        }
        Move::Rename(a, b) => {
            if a != b && slots[*a] != Slot::Absent {
                std::fs::rename(path(*a), path(*b)).unwrap();
                slots[*b] = std::mem::replace(&mut slots[*a], Slot::Absent);
            }
        }
        Move::Link(a, b) => {
            if a != b {
                let _ = std::fs::remove_file(path(*a));
                std::os::unix::fs::symlink(format!("t{b}"), path(*a)).unwrap();
                slots[*a] = Slot::Link(*b);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, ..ProptestConfig::default() })]

    /// Issue 47: random writes, deletes, renames and symbolic links among
    /// dependency files, made by another process between runs and while
    /// the commands run. Between runs, exactly the items whose view
    /// changed re-run; after changes during a run, the next plan and run
    /// make every output equal a rebuild's, and the plan after that is
    /// empty.
    #[test]
    fn renames_links_and_edits_during_runs_leave_outputs_equal_to_a_rebuild(
        readers in proptest::collection::vec(
            (proptest::collection::btree_set(0..LINK_SLOTS, 0..=3), proptest::bool::weighted(0.25)),
            12,
        ),
        initial in proptest::collection::vec(proptest::option::weighted(0.7, "[a-z]{1,3}"), LINK_SLOTS),
        between in proptest::collection::vec(a_move(), 1..5),
        during in proptest::collection::vec((a_move(), 0u64..120), 1..5),
    ) {
        let readers: Vec<(Vec<usize>, bool)> =
            readers.into_iter().map(|(s, l)| (s.into_iter().collect(), l)).collect();
        let p = Project::new(&config(r#"["sh", "cat.sh", "{input}", "{output}"]"#, "guard = 1.0"));
        // As the other property test's, with a pause before the output is
        // complete, so that moves land while commands run.
        p.write(
            "cat.sh",
            concat!(
                "set -eu\nout=\"$2\"\n: > \"$out\"\n",
                "for t in $(cat \"$1\"); do\n",
                "  case $t in ls) ls -f tables | sort >> \"$out\" ;;\n",
                // One open: a table removed between a test and a read
                // would fail the item, which is the moves' doing, not ours.
                "  *) cat \"tables/$t\" 2>/dev/null >> \"$out\" || echo \"no $t;\" >> \"$out\" ;;\n",
                "  esac\ndone\nsleep 0.05\n",
            ),
        );
        let dir = p.path("tables");
        std::fs::create_dir_all(&dir).unwrap();
        let mut slots: Vec<Slot> = vec![Slot::Absent; LINK_SLOTS];
        for (s, t) in initial.iter().enumerate() {
            if let Some(t) = t {
                make_move(&dir, &mut slots, &Move::Write(s, format!("{t};\n")));
            }
        }
        for (i, (ts, lists)) in readers.iter().enumerate() {
            let mut words: Vec<String> = ts.iter().map(|t| format!("t{t}")).collect();
            if *lists {
                words.push("ls".into());
            }
            p.write(&format!("data/i{i:02}.txt"), &words.join(" "));
        }
        hw(&p, &["run", "--jobs", "3"], 0);
        prop_assert_eq!(contents(&p.tree("out")), rebuilt_links(&readers, &slots));
        prop_assert!(plan_of(&p, "t").is_empty());

        // Between runs: exactly the items whose view changed.
        let before = rebuilt_links(&readers, &slots);
        for m in &between {
            make_move(&dir, &mut slots, m);
        }
        let after = rebuilt_links(&readers, &slots);
        let want: BTreeSet<String> = after
            .iter()
            .filter(|(k, v)| before.get(*k) != Some(*v))
            .map(|(k, _)| format!("data/{}", k.trim_end_matches(".out")))
            .collect();
        prop_assert_eq!(plan_of(&p, "t").keys().cloned().collect::<BTreeSet<_>>(), want);
        hw(&p, &["run", "--jobs", "3"], 0);
        prop_assert_eq!(contents(&p.tree("out")), after);

        // During a run: moves land while the commands read and write.
        std::fs::write(p.path("data/i00.txt"), format!("{} ", p.read("data/i00.txt"))).unwrap();
        let child = p
            .cmd(&["run", "--jobs", "3"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        for (m, delay_ms) in &during {
            std::thread::sleep(Duration::from_millis(*delay_ms));
            make_move(&dir, &mut slots, m);
        }
        let out = child.wait_with_output().unwrap();
        prop_assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        hw(&p, &["run", "--jobs", "3"], 0);
        prop_assert_eq!(contents(&p.tree("out")), rebuilt_links(&readers, &slots));
        prop_assert!(plan_of(&p, "t").is_empty());
    }
}

/// Two Python stages beside each other: `t` imports an optional module,
/// `u` also lists its folder itself.
fn import_listing_project() -> Project {
    let py = python();
    let p = Project::new(&format!(
        r#"
[stages.t]
inputs = ["data/*.txt"]
output = "out/{{relpath}}.out"
command = ["{py}", "t.py", "{{input}}", "{{output}}"]

[stages.u]
inputs = ["data/*.txt"]
output = "out/lists/{{relpath}}.out"
command = ["{py}", "u.py", "{{input}}", "{{output}}"]
"#
    ));
    p.write(
        "t.py",
        "import sys\ntry:\n    import extra\n    S = extra.S\nexcept ImportError:\n    S = ''\n\
         open(sys.argv[2], 'w').write(open(sys.argv[1]).read() + S)\n",
    );
    p.write(
        "u.py",
        "import os, sys\nnames = sorted(n for n in os.listdir('.') if not n.startswith('.'))\n\
         open(sys.argv[2], 'w').write(open(sys.argv[1]).read() + ' '.join(names))\n",
    );
    for i in 0..3 {
        p.write(&format!("data/f{i}.txt"), "abc");
    }
    p
}

/// Issue 47: a folder listed by Python's import system counts only the
/// names an import could match (`NAME`, `NAME.py`, `NAME.pyc`, `NAME.so`,
/// `NAME.TAG.so`). A new `report.csv` beside the script re-runs nothing of
/// the stage that only imports, but re-runs the stage whose code lists the
/// folder itself, naming the name; a new `extra.py` that an `import extra`
/// inside `try` now finds re-runs every item, naming it.
#[test]
fn a_name_no_import_can_match_reruns_nothing_and_a_new_module_does() {
    let p = import_listing_project();
    hw(&p, &["run"], 0);
    assert!(plan_of(&p, "t").is_empty());
    assert!(plan_of(&p, "u").is_empty());

    p.write("report.csv", "a,b\n");
    let items: Vec<String> = (0..3).map(|i| format!("data/f{i}.txt")).collect();
    assert!(plan_of(&p, "t").is_empty(), "a name no import can match");
    assert_eq!(
        plan_of(&p, "u"),
        all(items.clone(), "dependency", ". (+report.csv)")
    );
    hw(&p, &["run"], 0);
    assert!(p.read("out/lists/f0.txt.out").contains("report.csv"));

    p.write("extra.py", "S = '+extra'\n");
    assert_eq!(
        plan_of(&p, "t"),
        all(items.clone(), "dependency", ". (+extra.py)")
    );
    hw(&p, &["run"], 0);
    assert_eq!(p.read("out/f0.txt.out"), "abc+extra");
    assert!(plan_of(&p, "t").is_empty());
    assert!(plan_of(&p, "u").is_empty());

    // The recorded listing says whose it is (`highwater deps`: `imports .`).
    let deps = hw(&p, &["deps", "t", "data/f0.txt", "--json"], 0).json();
    let listing = deps["items"][0]["deps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["path"] == ".")
        .unwrap_or_else(|| panic!("no listing of . in {deps}"))
        .clone();
    assert_eq!(listing["kind"], "imports", "{listing}");
}

/// A pool of names in the folder the generated Python items import from:
/// modules, names no import can match, and a name with no dot (a possible
/// package folder, so it counts).
const POOL: &[&str] = &["a.py", "b.py", "c.py", "notes.txt", "data.csv", "README"];

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, ..ProptestConfig::default() })]

    /// Issue 47: the import rule is never less safe than the whole
    /// listing. Random creates, edits and deletes in a folder that Python
    /// items import from (`try: import a except ImportError`), some of the
    /// items also listing it themselves: after each plan and run every
    /// output equals a rebuild's, and exactly the items re-run whose view
    /// changed (a module they import edited, created or gone; an
    /// importable name come or gone; for a lister, any name).
    #[test]
    fn the_import_rule_is_never_less_safe_than_the_whole_listing(
        readers in proptest::collection::vec(
            (proptest::collection::btree_set(0..3usize, 0..=2), proptest::bool::weighted(0.3)),
            6,
        ),
        initial in proptest::collection::vec(proptest::option::weighted(0.5, "[a-z]{1,3}"), POOL.len()),
        rounds in proptest::collection::vec(
            proptest::collection::vec((0..POOL.len(), proptest::option::weighted(0.6, "[a-z]{1,4}")), 1..4),
            1..4,
        ),
    ) {
        let py = python();
        let p = Project::new(&config(
            &format!(r#"["{py}", "r.py", "{{input}}", "{{output}}"]"#),
            "guard = 1.0",
        ));
        p.write(
            "r.py",
            "import os, sys\nsys.path.insert(0, 'mods')\nwords = open(sys.argv[1]).read().split()\n\
             out = []\nfor w in words:\n    if w == 'ls':\n        out.append(' '.join(sorted(n for n in os.listdir('mods') if n != '__pycache__')))\n\
             \x20   else:\n        try:\n            out.append(__import__(w).V)\n        except ImportError:\n            out.append('no ' + w)\n\
             open(sys.argv[2], 'w').write(';'.join(out))\n",
        );
        std::fs::create_dir_all(p.path("mods")).unwrap();
        let mut files: Vec<Option<String>> = vec![None; POOL.len()];
        let put = |files: &mut Vec<Option<String>>, slot: usize, text: &Option<String>| {
            let path = p.path(&format!("mods/{}", POOL[slot]));
            match text {
                Some(t) => std::fs::write(&path, format!("V = '{t}'\n")).unwrap(),
                None => { let _ = std::fs::remove_file(&path); }
            }
            files[slot] = text.clone();
        };
        for (s, t) in initial.iter().enumerate() {
            put(&mut files, s, t);
        }
        let modules = ["a", "b", "c"];
        for (i, (ms, lists)) in readers.iter().enumerate() {
            let mut words: Vec<&str> = ms.iter().map(|&m| modules[m]).collect();
            if *lists {
                words.push("ls");
            }
            p.write(&format!("data/i{i}.txt"), &words.join(" "));
        }
        // What an item's output is, rebuilt from the folder as it is.
        let rebuild = |files: &[Option<String>]| -> BTreeMap<String, Vec<u8>> {
            readers.iter().enumerate().map(|(i, (ms, lists))| {
                let mut out: Vec<String> = ms.iter().map(|&m| match &files[m] {
                    Some(t) => t.clone(),
                    None => format!("no {}", modules[m]),
                }).collect();
                if *lists {
                    let mut names: Vec<&str> = (0..POOL.len()).filter(|&s| files[s].is_some()).map(|s| POOL[s]).collect();
                    names.sort_unstable();
                    out.push(names.join(" "));
                }
                (format!("i{i}.txt.out"), out.join(";").into_bytes())
            }).collect()
        };
        // The names an import can match, and those that exist.
        let importable = |files: &[Option<String>]| -> Vec<usize> {
            (0..POOL.len()).filter(|&s| files[s].is_some() && !POOL[s].contains(".txt") && !POOL[s].contains(".csv")).collect()
        };
        std::thread::sleep(Duration::from_millis(30));
        hw(&p, &["run", "--jobs", "2"], 0);
        prop_assert_eq!(contents(&p.tree("out")), rebuild(&files));
        for round in &rounds {
            let before = files.clone();
            for (s, t) in round {
                put(&mut files, *s, t);
            }
            // Exactly the items whose view changed (an item importing
            // nothing never lists the folder).
            let names_moved = importable(&before) != importable(&files);
            let any_moved = (0..POOL.len()).any(|s| before[s].is_some() != files[s].is_some());
            let want: BTreeSet<String> = readers.iter().enumerate().filter(|(_, (ms, lists))| {
                (names_moved && !ms.is_empty())
                    || (*lists && any_moved)
                    || ms.iter().any(|&m| before[m] != files[m])
            }).map(|(i, _)| format!("data/i{i}.txt")).collect();
            // Past the clock tick of the edits, so that the run's record of
            // them is never racy (which would re-run more, never fewer).
            std::thread::sleep(Duration::from_millis(30));
            let plan = plan_of(&p, "t");
            prop_assert_eq!(plan.keys().cloned().collect::<BTreeSet<_>>(), want, "{:?}", plan);
            hw(&p, &["run", "--jobs", "2"], 0);
            prop_assert_eq!(contents(&p.tree("out")), rebuild(&files));
            let plan = plan_of(&p, "t");
            prop_assert!(plan.is_empty(), "{:?}", plan);
        }
    }
}

/// Issue 47, found by the fleet's takeover test: a `touch` of a file that
/// already exists opens it write-only and changes only its times (a call
/// the filter lets run). It cannot be read through that descriptor, so it
/// is the command's own write, never a read that changed during the run
/// (which re-ran its item at every plan, forever).
#[test]
fn a_touch_of_an_existing_file_is_the_commands_own_write() {
    let p = Project::new(&config(r#"["sh", "t.sh", "{input}", "{output}"]"#, ""));
    p.write(
        "t.sh",
        "set -eu\ntouch stamp.txt\necho x >> log.txt\ncat \"$1\" > \"$2\"\n",
    );
    p.write("stamp.txt", "");
    p.write("log.txt", "");
    for i in 0..3 {
        p.write(&format!("data/f{i}.txt"), "abc");
    }
    std::thread::sleep(Duration::from_millis(30));
    hw(&p, &["run"], 0);
    assert!(plan_of(&p, "t").is_empty());
    p.write("data/f0.txt", "abcd");
    hw(&p, &["run"], 0);
    assert!(
        plan_of(&p, "t").is_empty(),
        "the second touch is no racy read"
    );
}
