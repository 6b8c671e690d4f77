//! Commands started without `fork` (issue 24: observing a 2 ms `cp` cost
//! 1.6x because every page of highwater was copy-on-write while the child
//! waited for its tracer). Each case runs twice, observed and unobserved,
//! and must behave as `std::process::Command::output` would: the program
//! found on PATH, the folder, the environment, a script without a shebang,
//! the signals a command expects, and all of a large output.

use highwater_observe::{output, output_unobserved};
use std::process::{Command, Output};
use std::sync::Mutex;

/// The cases run one at a time: the last one asks whether any child of
/// this process is left, which another case's running child would answer.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// One case: a command in a folder, and what its run must give.
struct Case<'a> {
    argv: &'a [&'a str],
    env: &'a [(&'a str, Option<&'a str>)],
    code: i32,
    stdout: &'a str,
    stderr: &'a str,
}

fn both(dir: &std::path::Path, c: &Case<'_>) -> [Output; 2] {
    let make = || {
        let mut cmd = Command::new(c.argv[0]);
        cmd.args(&c.argv[1..]).current_dir(dir);
        for (k, v) in c.env {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        cmd
    };
    let observed = output(&mut make()).expect("observed run").0;
    let plain = output_unobserved(&mut make()).expect("unobserved run");
    [observed, plain]
}

fn check(dir: &std::path::Path, c: Case<'_>) {
    for (mode, out) in ["observed", "unobserved"].iter().zip(both(dir, &c)) {
        let got = (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        let want = (Some(c.code), c.stdout.to_string(), c.stderr.to_string());
        assert_eq!(got, want, "{mode} run of {:?}", c.argv);
    }
}

#[test]
fn commands_run_as_std_would_run_them() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    // A script with no shebang: execvp gives it to /bin/sh.
    std::fs::write(d.join("noshebang"), "echo from sh $1\n").unwrap();
    let bin = d.join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::write(bin.join("mytool"), "#!/bin/sh\necho mytool ran\n").unwrap();
    for f in [d.join("noshebang"), bin.join("mytool")] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let cases = [
        // Found on PATH, in the folder given.
        Case {
            argv: &["sh", "-c", "pwd -P; exit 4"],
            env: &[],
            code: 4,
            stdout: &format!("{}\n", d.canonicalize().unwrap().display()),
            stderr: "",
        },
        // A changed PATH is the one searched.
        Case {
            argv: &["mytool"],
            env: &[("PATH", Some(&path))],
            code: 0,
            stdout: "mytool ran\n",
            stderr: "",
        },
        // Set and removed variables.
        Case {
            argv: &["sh", "-c", "echo \"$HW_SET ${HOME-unset}\""],
            env: &[("HW_SET", Some("yes")), ("HOME", None)],
            code: 0,
            stdout: "yes unset\n",
            stderr: "",
        },
        Case {
            argv: &["./noshebang", "arg"],
            env: &[],
            code: 0,
            stdout: "from sh arg\n",
            stderr: "",
        },
        // SIGPIPE at its default (highwater ignores it): `yes` dies of it
        // quietly instead of printing a write error. And no signal blocked.
        Case {
            argv: &[
                "sh",
                "-c",
                "yes | head -c 2; grep -E '^SigBlk' /proc/self/status",
            ],
            env: &[],
            code: 0,
            stdout: "y\nSigBlk:\t0000000000000000\n",
            stderr: "",
        },
        // stdin is /dev/null.
        Case {
            argv: &["sh", "-c", "cat; echo eof"],
            env: &[],
            code: 0,
            stdout: "eof\n",
            stderr: "",
        },
    ];
    for c in cases {
        check(d, c);
    }
}

#[test]
fn a_large_output_on_both_pipes_comes_back_whole() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let t = tempfile::tempdir().unwrap();
    // 1 MiB on each pipe at once: neither may fill and stall the other.
    let script = "head -c 1048576 /dev/zero & head -c 1048576 /dev/zero >&2; wait";
    for out in both(
        t.path(),
        &Case {
            argv: &["sh", "-c", script],
            env: &[],
            code: 0,
            stdout: "",
            stderr: "",
        },
    ) {
        assert!(out.status.success());
        assert_eq!(out.stdout.len(), 1 << 20);
        assert_eq!(out.stderr.len(), 1 << 20);
    }
}

#[test]
fn a_program_that_cannot_start_says_why_and_leaves_no_child() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("not-executable"), "echo no\n").unwrap();
    for prog in ["no-such-program-hw", "./not-executable"] {
        let mut cmd = Command::new(prog);
        cmd.current_dir(t.path());
        let e = output(&mut cmd).expect_err("observed: refused");
        assert!(e.to_string().contains(prog), "{e}");
        let mut cmd = Command::new(prog);
        cmd.current_dir(t.path());
        let e = output_unobserved(&mut cmd).expect_err("unobserved: refused");
        let want = if prog.starts_with("./") {
            std::io::ErrorKind::PermissionDenied
        } else {
            std::io::ErrorKind::NotFound
        };
        assert_eq!(e.kind(), want, "{prog}: {e}");
    }
    // Every child was reaped: none is left for this process to wait for.
    // SAFETY: waitpid with WNOHANG on any child only reports.
    let r = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG | libc::__WALL) };
    assert_eq!(r, -1, "a child was left unreaped");
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ECHILD)
    );
}

/// Set in the copy of this test binary that runs with fds 0, 1 and 2
/// closed: the file where it writes what its commands printed.
const CLOSED_STDIO_REPORT: &str = "HW_TEST_CLOSED_STDIO_REPORT";

#[test]
fn commands_keep_their_pipes_when_highwater_runs_with_stdio_closed() {
    if let Ok(report) = std::env::var(CLOSED_STDIO_REPORT) {
        // The copy: every pipe and /dev/null it opens lands on 0, 1 or 2
        // unless the spawner moves it above them. (Closed here, not before
        // exec: Rust's runtime reopens closed stdio on /dev/null at start.)
        for fd in 0..3 {
            // SAFETY: closes this process's stdio; nothing else uses it.
            unsafe { libc::close(fd) };
        }
        let mut got = String::new();
        for (mode, out) in ["observed", "unobserved"].iter().zip(both(
            std::path::Path::new("/"),
            &Case {
                argv: &["sh", "-c", "echo out; echo err >&2; cat; echo eof"],
                env: &[],
                code: 0,
                stdout: "",
                stderr: "",
            },
        )) {
            got += &format!(
                "{mode}: {:?} {:?} {:?}\n",
                out.status.code(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::fs::write(report, got).unwrap();
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let t = tempfile::tempdir().unwrap();
    let report = t.path().join("report");
    let mut copy = Command::new(std::env::current_exe().unwrap());
    copy.args([
        "--exact",
        "commands_keep_their_pipes_when_highwater_runs_with_stdio_closed",
        "--test-threads=1",
    ])
    .env(CLOSED_STDIO_REPORT, &report);
    // The copy's own test harness may fail to print to a closed stdout:
    // its report file is the verdict.
    let _ = copy.status().unwrap();
    let got = std::fs::read_to_string(&report).expect("the copy wrote its report");
    let want = "observed: Some(0) \"out\\neof\\n\" \"err\\n\"\n\
                unobserved: Some(0) \"out\\neof\\n\" \"err\\n\"\n";
    assert_eq!(got, want);
}
