//! Real commands, observed (issue 24): what each is seen to read, execute,
//! look up, list and write.

use highwater_observe::{output, Observation};
use std::path::{Path, PathBuf};
use std::process::Command;

fn run(dir: &Path, argv: &[&str]) -> Observation {
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..]).current_dir(dir);
    let (out, obs) = output(&mut cmd).expect("observed run");
    assert!(
        out.status.success(),
        "{argv:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    obs
}

fn canon(p: &Path) -> PathBuf {
    p.canonicalize().unwrap()
}

fn which(prog: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap();
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{prog} not on PATH"))
}

#[test]
fn cat_reads_a_relative_file_and_sh_writes_its_redirect() {
    let t = tempfile::tempdir().unwrap();
    let d = canon(t.path());
    std::fs::write(d.join("in.txt"), "hello\n").unwrap();
    let obs = run(&d, &["sh", "-c", "cat in.txt > out.txt"]);
    assert!(obs.read.contains(&d.join("in.txt")), "{obs:#?}");
    assert!(obs.written.contains(&d.join("out.txt")), "{obs:#?}");
    assert!(!obs.read.contains(&d.join("out.txt")));
    // sh ran cat: both are executed programs.
    assert!(obs.executed.iter().any(|p| p.ends_with("cat")), "{obs:#?}");
    assert!(obs.executed.iter().any(|p| p.ends_with("sh")), "{obs:#?}");
    assert_eq!(
        std::fs::read_to_string(d.join("out.txt")).unwrap(),
        "hello\n"
    );
}

#[test]
fn stdout_stderr_and_exit_status_come_back() {
    let t = tempfile::tempdir().unwrap();
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "echo out; echo err >&2; exit 3"])
        .current_dir(t.path());
    let (out, _) = output(&mut cmd).unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(out.stdout, b"out\n");
    assert_eq!(out.stderr, b"err\n");
}

#[test]
fn a_missing_program_is_a_spawn_error_not_a_panic() {
    let t = tempfile::tempdir().unwrap();
    let mut cmd = Command::new("no-such-program-hw24");
    cmd.current_dir(t.path());
    let err = output(&mut cmd).unwrap_err();
    assert!(
        matches!(err, highwater_observe::ObserveError::Spawn { .. }),
        "{err}"
    );
}

#[test]
fn python_imports_a_helper_and_looks_up_a_missing_module() {
    let t = tempfile::tempdir().unwrap();
    let d = canon(t.path());
    std::fs::create_dir(d.join("lib")).unwrap();
    std::fs::write(d.join("lib/helpers.py"), "def f():\n    return 1\n").unwrap();
    std::fs::write(
        d.join("main.py"),
        "import sys\nsys.path.insert(0, 'lib')\nimport helpers\n\
         try:\n    import nosuchmod_hw24\nexcept ImportError:\n    pass\n\
         print(helpers.f())\n",
    )
    .unwrap();
    let obs = run(&d, &["python3", "-B", "main.py"]);
    assert!(obs.read.contains(&d.join("main.py")), "{obs:#?}");
    assert!(obs.read.contains(&d.join("lib/helpers.py")), "{obs:#?}");
    // Python lists each sys.path folder and looks names up in the listing,
    // and says the listing is its import system's (issue 47).
    assert!(obs.import_listed.contains(&d.join("lib")), "{obs:#?}");
    assert!(!obs.listed.contains(&d.join("lib")), "{obs:#?}");
    // highwater's own hook is nobody's dependency.
    assert!(
        !obs.read.iter().any(|p| p.ends_with("sitecustomize.py")),
        "{obs:#?}"
    );
    // -B: no __pycache__ written.
    assert!(!obs.written.iter().any(|p| p.starts_with(&d)), "{obs:#?}");
    assert!(obs.executed.iter().any(|p| p.ends_with("python3")));
}

#[test]
fn pycache_written_by_the_command_is_not_a_dependency() {
    let t = tempfile::tempdir().unwrap();
    let d = canon(t.path());
    std::fs::write(d.join("helper.py"), "X = 1\n").unwrap();
    std::fs::write(d.join("main.py"), "import helper\nprint(helper.X)\n").unwrap();
    // The environment may forbid bytecode; this test needs it written.
    let mut cmd = Command::new("python3");
    cmd.arg("main.py")
        .current_dir(&d)
        .env_remove("PYTHONDONTWRITEBYTECODE");
    let (out, obs) = output(&mut cmd).unwrap();
    assert!(out.status.success());
    assert!(obs.read.contains(&d.join("helper.py")), "{obs:#?}");
    let cache = d.join("__pycache__");
    assert!(
        obs.written.iter().any(|p| p.starts_with(&cache)),
        "{obs:#?}"
    );
    assert!(!obs.read.iter().any(|p| p.starts_with(&cache)), "{obs:#?}");
    assert!(
        !obs.absent.iter().any(|p| p.starts_with(&cache)),
        "{obs:#?}"
    );
}

#[test]
fn a_shebang_script_records_its_interpreter() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let d = canon(t.path());
    let sh = which("sh");
    let script = d.join("run.sh");
    std::fs::write(
        &script,
        format!("#!{} -e\ncat data.txt >/dev/null\n", sh.display()),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(d.join("data.txt"), "x").unwrap();
    let obs = run(&d, &["./run.sh"]);
    assert!(obs.executed.contains(&script), "{obs:#?}");
    assert!(obs.executed.contains(&sh), "{obs:#?}");
    assert!(obs.read.contains(&d.join("data.txt")), "{obs:#?}");
    // /dev/null was opened for writing.
    assert!(obs.written.contains(Path::new("/dev/null")), "{obs:#?}");
}

#[test]
fn temp_files_made_and_removed_are_excluded() {
    let t = tempfile::tempdir().unwrap();
    let d = canon(t.path());
    let obs = run(
        &d,
        &[
            "sh",
            "-c",
            "test -e tmp.x; echo a > tmp.x; cat tmp.x > /dev/null; rm tmp.x",
        ],
    );
    let tmp = d.join("tmp.x");
    assert!(obs.written.contains(&tmp), "{obs:#?}");
    assert!(!obs.read.contains(&tmp), "{obs:#?}");
    assert!(!obs.absent.contains(&tmp), "{obs:#?}");
}

#[test]
fn absent_lookups_and_listings_are_recorded() {
    let t = tempfile::tempdir().unwrap();
    let d = canon(t.path());
    std::fs::create_dir(d.join("sub")).unwrap();
    std::fs::write(d.join("sub/a"), "").unwrap();
    let obs = run(&d, &["sh", "-c", "test -e nothere; ls sub > /dev/null"]);
    assert!(obs.absent.contains(&d.join("nothere")), "{obs:#?}");
    assert!(obs.listed.contains(&d.join("sub")), "{obs:#?}");
}

#[test]
fn forked_children_and_threads_are_followed() {
    let t = tempfile::tempdir().unwrap();
    let d = canon(t.path());
    for i in 0..4 {
        std::fs::write(d.join(format!("f{i}")), "x").unwrap();
    }
    // Background subshells: forks of forks.
    let obs = run(
        &d,
        &[
            "sh",
            "-c",
            "(cat f0 >/dev/null &) ; (cat f1 > /dev/null) & cat f2 > /dev/null; wait",
        ],
    );
    for i in 0..3 {
        assert!(obs.read.contains(&d.join(format!("f{i}"))), "{obs:#?}");
    }
    // Threads: python reading from a worker thread.
    let obs = run(
        &d,
        &[
            "python3",
            "-c",
            "import threading\nt=threading.Thread(target=lambda: open('f3').read())\nt.start(); t.join()",
        ],
    );
    assert!(obs.read.contains(&d.join("f3")), "{obs:#?}");
}

#[test]
fn concurrent_observed_runs_do_not_mix() {
    let t = tempfile::tempdir().unwrap();
    let d = canon(t.path());
    let handles: Vec<_> = (0..6)
        .map(|i| {
            let d = d.clone();
            std::fs::write(d.join(format!("in{i}")), "x").unwrap();
            std::thread::spawn(move || {
                let name = format!("in{i}");
                let obs = run(&d, &["cat", &name]);
                (i, obs)
            })
        })
        .collect();
    for h in handles {
        let (i, obs) = h.join().unwrap();
        let mine: Vec<_> = obs.read.iter().filter(|p| p.starts_with(&d)).collect();
        assert_eq!(mine, vec![&d.join(format!("in{i}"))], "{obs:#?}");
    }
}

/// The filter stops the tracee only for file syscalls: 40,000 reads and
/// writes of one byte make a handful of stops, not 40,000.
#[test]
fn other_syscalls_never_stop_the_tracee() {
    let t = tempfile::tempdir().unwrap();
    let obs = run(
        t.path(),
        &["dd", "if=/dev/zero", "of=/dev/null", "bs=1", "count=20000"],
    );
    assert!(obs.stops > 0, "{obs:#?}");
    assert!(obs.stops < 500, "{} stops", obs.stops);
}

/// Issue 24: only a change that happened counts as a write. A `mkdir -p` of
/// an existing folder, an `rm -f` of a missing file and a failed rename are
/// decided at the syscall's exit and change nothing; the successful ones
/// are written.
#[test]
fn failed_changes_are_not_writes() {
    let t = tempfile::tempdir().unwrap();
    let d = canon(t.path());
    std::fs::create_dir(d.join("cache")).unwrap();
    let obs = run(
        &d,
        &[
            "sh",
            "-c",
            "mkdir -p cache; rm -f missing.txt; mv nothere gone 2>/dev/null; \
             mkdir made; echo x > new.txt; mv new.txt moved.txt",
        ],
    );
    let cases = [
        ("cache", false),
        ("missing.txt", false),
        ("nothere", false),
        ("gone", false),
        ("made", true),
        ("new.txt", true),
        ("moved.txt", true),
    ];
    for (name, want) in cases {
        assert_eq!(
            obs.written.contains(&d.join(name)),
            want,
            "{name}: {obs:#?}"
        );
    }
}

/// Issue 24: an existing file opened read-write without O_TRUNC (how
/// sqlite opens its database) is a read; it is a write only when the
/// command really changed it.
#[test]
fn a_read_write_open_is_a_read_unless_the_file_changed() {
    let t = tempfile::tempdir().unwrap();
    let d = canon(t.path());
    std::fs::write(d.join("kept.db"), "lookup\n").unwrap();
    std::fs::write(d.join("changed.db"), "before\n").unwrap();
    // `<>` opens O_RDWR|O_CREAT; `cat <&3` reads through that descriptor,
    // never opening the file itself.
    let obs = run(
        &d,
        &[
            "sh",
            "-c",
            "exec 3<>kept.db; cat <&3 >/dev/null; exec 4<>changed.db; echo more >&4",
        ],
    );
    assert!(obs.read.contains(&d.join("kept.db")), "{obs:#?}");
    assert!(!obs.written.contains(&d.join("kept.db")), "{obs:#?}");
    assert!(obs.written.contains(&d.join("changed.db")), "{obs:#?}");
    assert!(!obs.read.contains(&d.join("changed.db")), "{obs:#?}");
}

/// A Python script that makes one kind of system call the filter cannot
/// follow (or none), then writes `after`.
const UNFOLLOWABLE: &str = r#"
import ctypes, mmap, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
what = sys.argv[1]
if what == "io_uring":
    params = ctypes.create_string_buffer(120)
    libc.syscall(425, 1, params)
elif what == "x32":
    libc.syscall(0x40000000 | 39)
elif what == "chroot":
    libc.syscall(161, b"/")
elif what == "pivot_root":
    libc.syscall(155, b"/", b"/")
elif what == "setns":
    libc.syscall(308, os.open("/proc/self/ns/mnt", os.O_RDONLY), 0)
elif what == "open_by_handle_at":
    libc.syscall(304, 0, 0, 0)
elif what == "unshare":
    libc.syscall(272, 0x00020000)  # CLONE_NEWNS
elif what == "unshare-fs":
    libc.syscall(272, 0x00000200)  # CLONE_FS: no new namespace, runs on
elif what == "ia32":
    # mov eax, 20 (getpid); int 0x80; ret
    m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    m.write(b"\xb8\x14\x00\x00\x00\xcd\x80\xc3")
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    ctypes.CFUNCTYPE(ctypes.c_long)(addr)()
open("after", "w").write(what)
"#;

/// Calls that would let a command read files unseen (32-bit and x32
/// system calls, an io_uring) are refused, not let through (issue 24):
/// the tree is killed before the call runs on, and the error names it.
/// Without one, the same script runs to its end.
#[test]
fn unfollowable_calls_kill_the_command_and_name_the_call() {
    let t = tempfile::tempdir().unwrap();
    let d = canon(t.path());
    std::fs::write(d.join("s.py"), UNFOLLOWABLE).unwrap();
    let cases = [
        ("none", None),
        ("io_uring", Some("io_uring_setup")),
        ("x32", Some("an x32 system call")),
        ("ia32", Some("a 32-bit (ia32) system call")),
        // Issue 47: paths after these would name other files than the
        // ones highwater resolves in its own root and mount namespace.
        ("chroot", Some("a chroot call")),
        ("pivot_root", Some("a pivot_root call")),
        ("setns", Some("a setns call")),
        ("open_by_handle_at", Some("an open_by_handle_at call")),
        ("unshare", Some("a new mount namespace")),
        ("unshare-fs", None),
    ];
    for (what, refused) in cases {
        let _ = std::fs::remove_file(d.join("after"));
        let mut cmd = Command::new("python3");
        cmd.args(["s.py", what]).current_dir(&d);
        let got = output(&mut cmd);
        match refused {
            None => {
                let (out, _) = got.expect("observed run");
                assert!(out.status.success(), "{what}: {out:?}");
                assert!(d.join("after").exists(), "{what}");
            }
            Some(words) => {
                let e = got.expect_err(what).to_string();
                assert!(
                    e.contains(words) && e.contains("observe = false"),
                    "{what}: {e}"
                );
                assert!(!d.join("after").exists(), "{what}: the tree ran on");
            }
        }
    }
}
