//! An output folder that cannot be written (issue 20). The exit codes'
//! contract: 2 is "refused, nothing touched", 1 is "finished, something
//! failed". An output root the run cannot write is refused before any item
//! runs (exit 2, nothing touched); a folder below a writable root that
//! cannot be written fails its items, and the run does the rest (exit 1).

mod common;
use common::*;

/// Runs highwater as a user that permissions apply to: root writes into a
/// read-only folder anyway, so when the tests run as root the project is
/// handed to `nobody` and highwater runs as it.
fn hw_unprivileged(p: &Project, args: &[&str]) -> Ran {
    use std::os::unix::process::CommandExt;
    let mut c = p.cmd(args);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let s = std::process::Command::new("chown")
            .args(["-R", "65534:65534"])
            .arg(p.dir.path())
            .status()
            .unwrap();
        assert!(s.success());
        c.uid(65534).gid(65534);
    }
    let o = c.output().unwrap();
    Ran {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// One case: `read_only` is made read-only before a run with two new
/// inputs; the run exits `code`, says `wants`, makes `made` and not
/// `not_made`.
fn check(read_only: &str, code: i32, wants: &[&str], made: &[&str], not_made: &[&str]) {
    use std::os::unix::fs::PermissionsExt;
    let p = Project::new(&upper_config(""));
    p.write("data/a.txt", "a");
    p.write("data/sub/b.txt", "b");
    p.run_json(&[], 0);
    p.write("data/c.txt", "c");
    p.write("data/sub/d.txt", "d");
    let export = p.export();
    let before = p.tree("out");
    std::fs::set_permissions(p.path(read_only), std::fs::Permissions::from_mode(0o555)).unwrap();
    let r = hw_unprivileged(&p, &["run", "--json"]);
    std::fs::set_permissions(p.path(read_only), std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(r.code, code, "{read_only}: {}\n{}", r.stdout, r.stderr);
    let said = format!("{}{}", r.stdout, r.stderr);
    for w in wants {
        assert!(said.contains(w), "{read_only}: lacks {w:?}: {said}");
    }
    assert!(!said.contains("panicked"), "{said}");
    for m in made {
        assert!(p.exists(m), "{read_only}: {m} not made");
    }
    for m in not_made {
        assert!(!p.exists(m), "{read_only}: {m} made");
    }
    if code == 2 {
        assert_eq!(p.tree("out"), before, "outputs untouched");
        assert_eq!(p.export(), export, "manifest untouched");
    }
}

#[test]
fn an_unwritable_output_root_is_refused_and_an_unwritable_folder_below_it_fails_its_items() {
    check(
        "out",
        2,
        &[
            "stage `upper`",
            "/out",
            "cannot be written",
            "nothing was run",
        ],
        &[],
        &["out/c.txt.upper", "out/sub/d.txt.upper"],
    );
    check(
        "out/sub",
        1,
        &["data/sub/d.txt", "out/sub"],
        &["out/c.txt.upper"],
        &["out/sub/d.txt.upper"],
    );
}
