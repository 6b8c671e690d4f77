//! Failpoints for the crash and lease tests: named points where a test
//! (through `HIGHWATER_FAILPOINT` and `HIGHWATER_FAILPOINT_GATE`) kills the
//! process or holds it, the way a real crash or a slow run would.

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Whether `HIGHWATER_FAILPOINT` names failpoint `name`.
pub(crate) fn failpoint(name: &str) -> bool {
    std::env::var_os("HIGHWATER_FAILPOINT").is_some_and(|v| v == name)
}

/// SIGKILL to ourselves: the crash tests' failpoints die the way a killed
/// process dies, with no unwinding and no cleanup.
pub(crate) fn kill_self() -> ! {
    // SAFETY: sending a signal to our own pid has no memory effects.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    unreachable!("SIGKILL cannot be caught")
}

/// For the lease tests (failpoints `compact-gate`, `ingest-gate`): after
/// each period or window, says so by creating `GATE.reached`, then waits
/// while the file `HIGHWATER_FAILPOINT_GATE` names exists (at most a
/// minute). A gate, not a sleep: the test does its part (takes the lease
/// over) while the run waits, however fast or loaded the machine.
pub(crate) fn gate() {
    let Some(gate) = std::env::var_os("HIGHWATER_FAILPOINT_GATE") else {
        return;
    };
    let gate = PathBuf::from(gate);
    let mut reached = gate.clone().into_os_string();
    reached.push(".reached");
    let _ = std::fs::write(&reached, b"");
    let t0 = Instant::now();
    while gate.exists() && t0.elapsed().as_secs() < 60 {
        std::thread::sleep(Duration::from_millis(20));
    }
}
