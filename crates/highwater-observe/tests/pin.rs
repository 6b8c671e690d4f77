//! An observed command and its tracer share one CPU while the command is
//! young and alone, and the command can never tell (issue 24: a stop's
//! round trip across two CPUs cost a 2 ms `cp` more than the `cp` itself).
//! Whatever a command can ask about its CPUs (how many, which, from a
//! forked child, from a thread, after setting them itself, after the pin's
//! time limit) it is told what it would be told unobserved.

use highwater_observe::{output, output_unobserved};
use std::process::Command;
use std::sync::Mutex;

/// One at a time: pins are spread by how many are held, so a concurrent
/// case would move this one's CPU.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn run(argv: &[&str], observed: bool) -> String {
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..]);
    let out = if observed {
        output(&mut cmd).expect("observed run").0
    } else {
        output_unobserved(&mut cmd).expect("unobserved run")
    };
    assert!(
        out.status.success(),
        "{argv:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The command prints what it can learn of its CPUs: the same observed.
fn check(what: &str, argv: &[&str]) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let plain = run(argv, false);
    assert!(!plain.trim().is_empty(), "{what}: printed nothing");
    assert_eq!(run(argv, true), plain, "{what}: observed differs");
}

#[test]
fn a_command_is_told_the_cpus_it_would_have_unobserved() {
    check("nproc (sched_getaffinity)", &["nproc"]);
    check("a forked child", &["sh", "-c", "nproc; true"]);
    check(
        "a thread",
        &[
            "python3",
            "-c",
            "import threading\n\
             def f(): print(open('/proc/thread-self/status').read().split('Cpus_allowed_list:')[1].split()[0])\n\
             t = threading.Thread(target=f); t.start(); t.join()",
        ],
    );
    check(
        "after setting its own CPUs and outliving the pin",
        &[
            "python3",
            "-c",
            "import os, time\n\
             os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n\
             time.sleep(0.2)\n\
             open('/dev/null').close()\n\
             print(sorted(os.sched_getaffinity(0)))",
        ],
    );
    check(
        "single-threaded, after the pin's time limit",
        &[
            "python3",
            "-c",
            "import time\n\
             time.sleep(0.2)\n\
             print(open('/proc/self/status').read().split('Cpus_allowed_list:')[1].split()[0])",
        ],
    );
}

#[test]
fn a_young_lone_command_is_pinned_where_there_are_cpus_to_spare() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let argv = ["grep", "Cpus_allowed_list", "/proc/self/status"];
    // The CPUs this process may run on, as the pin counts them (not
    // `available_parallelism`, which also reads cgroup quotas).
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
    let cpus = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set),
            0
        );
        libc::CPU_COUNT(&set) as usize
    };
    let (plain, observed) = (run(&argv, false), run(&argv, true));
    if cpus >= 2 {
        // Read through /proc, which asks no affinity call: the pin shows.
        assert_ne!(observed, plain, "not pinned on {cpus} CPUs");
        let list = observed.split(':').nth(1).unwrap().trim();
        assert!(list.parse::<usize>().is_ok(), "pinned to one CPU: {list}");
    } else {
        assert_eq!(observed, plain, "one CPU: nothing to pin");
    }
}

/// The calling thread is pinned with the command while it starts it (the
/// child takes its mask at the clone), then given its own mask back, even
/// one narrower than the process's.
#[test]
fn the_starting_thread_gets_its_own_cpus_back() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: cpu_set_t is plain data; the affinity calls fill or read it.
    let mask = || unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set),
            0
        );
        set
    };
    let same = |a: &libc::cpu_set_t, b: &libc::cpu_set_t| {
        (0..libc::CPU_SETSIZE as usize)
            .all(|c| unsafe { libc::CPU_ISSET(c, a) == libc::CPU_ISSET(c, b) })
    };
    let argv = ["true"];
    std::thread::spawn(move || {
        let before = mask();
        run(&argv, true);
        assert!(same(&mask(), &before), "the whole mask, back");
        // A thread of its own narrower mask (the highest CPU alone).
        let high = (0..libc::CPU_SETSIZE as usize)
            .rev()
            .find(|&c| unsafe { libc::CPU_ISSET(c, &before) })
            .unwrap();
        let narrow = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(high, &mut set);
            assert_eq!(
                libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set),
                0
            );
            set
        };
        run(&argv, true);
        assert!(same(&mask(), &narrow), "the narrow mask, back");
        // Pinned, the command stays inside that mask.
        let out = run(&["grep", "Cpus_allowed_list", "/proc/self/status"], true);
        assert!(out.trim().ends_with(&format!("\t{high}")), "pinned: {out}");
        // And the command it starts inherits that narrow mask once unpinned
        // (here at its fork: `sh` runs `grep` as a child).
        let out = run(
            &["sh", "-c", "grep Cpus_allowed_list /proc/self/status; true"],
            true,
        );
        assert!(
            out.trim().ends_with(&format!("\t{high}")),
            "the command's mask: {out}"
        );
    })
    .join()
    .unwrap();
}

/// A tree whose tasks take turns keeps the pin (issue 47: pyenv's shim is
/// a shell that runs and waits for a dozen commands, 3,500 stops, each 7x
/// dearer unpinned); one whose tasks run at once is unpinned before the
/// second of them runs, so its parallelism is never taken away.
#[test]
fn a_shell_and_what_it_waits_for_keep_the_pin_and_parallel_work_spreads() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let status = "grep Cpus_allowed_list /proc/self/status";
    let plain = run(&["sh", "-c", status], false);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let turns = run(&["sh", "-c", &format!("{status}; true")], true);
    let parallel = run(&["sh", "-c", &format!("sleep 0.3 & {status}; wait")], true);
    if cpus >= 2 {
        let list = turns.split(':').nth(1).unwrap().trim();
        assert!(
            list.parse::<usize>().is_ok(),
            "a child the shell waits for is pinned with it: {list}"
        );
    } else {
        assert_eq!(turns, plain, "one CPU: nothing to pin");
    }
    assert_eq!(
        parallel, plain,
        "a child forked while another runs is told every CPU"
    );
}
