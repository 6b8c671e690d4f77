//! A traced command and its tracer share one CPU while the command is young
//! and alone (issue 24: observation's cost).
//!
//! Why: each seccomp stop is a round trip, tracee → tracer → tracee. When the
//! two run on different CPUs, every leg wakes the other CPU, and a halted
//! vCPU takes tens of microseconds to wake. On one CPU the wakeup is a plain
//! context switch. Measured on this kind of machine (2 vCPUs) with
//! `observe_bench`: a Python loop of 20,000 failing `stat`s costs 43 us per
//! stop unpinned and 5.7 us pinned; a lone `cp` (51 stops) 4.4 ms observed
//! unpinned, 1.9-2.0 ms pinned, 1.1-1.3 ms unobserved.
//!
//! The policy, so that pinning never costs a command its parallelism:
//! - Items are spread: each pin takes a CPU of the starting thread's mask
//!   with the fewest pins held now, the one that thread runs on if it is
//!   among them (`--jobs 2` on two CPUs puts one item on each). The pin is
//!   taken before the command starts, so its first wakeup of the tracer is
//!   a local one; the starting thread gets its own mask back once the
//!   command has exec'd.
//! - A tree whose tasks take turns keeps the pin (issue 47: pyenv's shim,
//!   a shell script and the commands it waits for; 3,500 stops a start,
//!   each 7x dearer unpinned). A task asleep in `wait4` or `waitid` is not
//!   running; the tree's running tasks are counted at each stop
//!   ([`Turns`]). The whole tree is unpinned, the new task included,
//!   before it runs, at: a thread clone; a fork or vfork while two tasks
//!   already run; a task starting to wait while two others run; two tasks
//!   found running at stops [`TURNS_OVERLAP_MAX_MS`] apart. So a pool of
//!   workers, a `make -j` or a pipeline spreads as if it were never
//!   observed, at its second fork; a parent computing beside one child, at
//!   most 50 ms late.
//! - A tree that asks which CPUs it may use (`sched_getaffinity`: `nproc`,
//!   `os.sched_getaffinity`, rayon's and OpenBLAS's pool sizes) or sets them
//!   is unpinned before the call runs: it is told, and keeps, what it would
//!   have unobserved.
//! - A tree pinned for [`PIN_DURATION_MAX_MS`] is unpinned at its next stop,
//!   so a long command can migrate off a CPU that other work has made busy.
//!   The limit is long because unpinning makes every later stop 7x dearer,
//!   and a single-threaded command uses one CPU either way; one that makes
//!   no traced call after the limit stays where it is until it does.
//! - Nothing is pinned when the process may use only one CPU, and a failed
//!   `sched_setaffinity` just leaves the tree unpinned.
//! - Only tasks still traced are touched: a tracee is reaped by its tracer
//!   alone, so its tid cannot be reused while the tracer holds it.

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a tree stays pinned at most (checked at its stops; see the
/// module doc for why so long).
pub const PIN_DURATION_MAX_MS: u64 = 10_000;

/// How long two tasks of a pinned tree may be seen running at once before
/// the tree is unpinned. A shell runs on a little between its fork and its
/// wait, but on its one CPU the child may run first, and a busy machine
/// may hold both off the CPU for milliseconds: 5 ms unpinned pyenv's shim
/// under load. Parallel work shows sooner by its forks and waits (a second
/// child forked, a parent waiting beside two), so the clock is the last
/// resort, for a parent that computes beside its one child.
pub const TURNS_OVERLAP_MAX_MS: u64 = 50;

/// Whether a pinned tree's tasks take turns or run in parallel, judged at
/// its stops from the count of its running tasks (those not asleep in a
/// wait for a child).
#[derive(Default)]
pub(crate) struct Turns {
    /// Since when two or more tasks have been seen running.
    overlap_since: Option<Instant>,
}

impl Turns {
    /// At a fork or vfork by a task of a tree where `running` tasks run
    /// (the new one not counted): whether that makes it parallel.
    pub(crate) fn forked(&mut self, running: usize) -> bool {
        if running >= 2 {
            return true;
        }
        self.overlap_since.get_or_insert_with(Instant::now);
        false
    }

    /// At any other stop, with `running` tasks running now; `waits`: the
    /// stopped task is starting to wait (and is not counted).
    pub(crate) fn parallel(&mut self, running: usize, waits: bool) -> bool {
        if running < 2 {
            self.overlap_since = None;
            return false;
        }
        if waits {
            // It sleeps while two others run: they run in parallel.
            return true;
        }
        let since = *self.overlap_since.get_or_insert_with(Instant::now);
        since.elapsed() >= Duration::from_millis(TURNS_OVERLAP_MAX_MS)
    }
}

/// The CPUs this process may use, as first seen, and how many pins each
/// holds now.
struct Cpus {
    wide: libc::cpu_set_t,
    ids: Vec<usize>,
    pins: Mutex<Vec<u32>>,
}

fn cpus() -> Option<&'static Cpus> {
    static CPUS: OnceLock<Option<Cpus>> = OnceLock::new();
    CPUS.get_or_init(|| {
        // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
        let mut wide: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&wide), &mut wide) };
        if r != 0 {
            return None;
        }
        let ids: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            // SAFETY: reads a bit of a set we own.
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &wide) })
            .collect();
        (ids.len() >= 2).then(|| Cpus {
            wide,
            pins: Mutex::new(vec![0; ids.len()]),
            ids,
        })
    })
    .as_ref()
}

fn set(tid: i32, mask: &libc::cpu_set_t) -> bool {
    // SAFETY: sched_setaffinity reads the set; a tid that is gone gives
    // ESRCH, which is harmless here.
    unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(mask), mask) == 0 }
}

/// One tree's pin, held by its tracer thread.
pub(crate) struct Pin {
    /// The index into `Cpus::ids` of the CPU held, while pinned.
    slot: Option<usize>,
    since: Instant,
    /// The starting thread's own mask: the one the tree would have had
    /// unobserved, given back to it at release.
    unpinned: libc::cpu_set_t,
}

/// The starting thread's pin while it starts the command: the child takes
/// its mask from it at the clone. Dropped once the command has exec'd.
pub(crate) struct Starting {
    restore: Option<libc::cpu_set_t>,
}

impl Drop for Starting {
    fn drop(&mut self) {
        if let Some(m) = &self.restore {
            set(0, m);
        }
    }
}

impl Pin {
    /// Pins the calling thread, which is about to start the command, and
    /// its tracer thread `tracer` (asleep) to one CPU of the caller's mask:
    /// the one it runs on if that holds no more pins than any other, else
    /// the least used.
    ///
    /// Before the start, not after the tracer attaches: the command's
    /// first act is to tell the tracer its pid, and that wakeup is cheap
    /// only if the tracer sleeps on the CPU the command runs on (a halted
    /// vCPU takes ~50 us to wake; measured on a static binary, observation's
    /// fixed cost went 0.22 -> 0.15 ms).
    pub(crate) fn start(tracer: i32) -> (Pin, Starting) {
        // SAFETY: cpu_set_t is plain data.
        let zero: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let mut pin = Pin {
            slot: None,
            since: Instant::now(),
            unpinned: zero,
        };
        let mut starting = Starting { restore: None };
        let Some(c) = cpus() else {
            return (pin, starting);
        };
        let mut mine = zero;
        // SAFETY: sched_getaffinity fills the set.
        if unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&mine), &mut mine) } != 0 {
            return (pin, starting);
        }
        // SAFETY: sched_getcpu has no arguments; -1 on failure.
        let here = unsafe { libc::sched_getcpu() };
        // Only CPUs the starting thread may use itself: a thread of a
        // narrower mask starts its command inside that mask.
        // SAFETY: reads bits of a set we own.
        let allowed = |s: &usize| unsafe { libc::CPU_ISSET(c.ids[*s], &mine) };
        let slot = {
            let mut pins = c.pins.lock().unwrap_or_else(|e| e.into_inner());
            // Fewest pins first; among those, the CPU this thread is on.
            let elsewhere = |s: usize| here < 0 || c.ids[s] != here as usize;
            let Some(slot) = (0..c.ids.len())
                .filter(allowed)
                .min_by_key(|&s| (pins[s], elsewhere(s)))
            else {
                return (pin, starting);
            };
            pins[slot] += 1;
            slot
        };
        pin.slot = Some(slot);
        pin.unpinned = mine;
        let mut one = zero;
        // SAFETY: sets a bit of a set we own.
        unsafe { libc::CPU_SET(c.ids[slot], &mut one) };
        if set(tracer, &one) && set(0, &one) {
            starting.restore = Some(mine);
        } else {
            set(0, &mine);
            set(tracer, &c.wide);
            let mut pins = c.pins.lock().unwrap_or_else(|e| e.into_inner());
            pins[slot] -= 1;
            pin.slot = None;
        }
        (pin, starting)
    }

    /// Whether the tree has been pinned for longer than the limit.
    pub(crate) fn expired(&self) -> bool {
        self.slot.is_some() && self.since.elapsed() > Duration::from_millis(PIN_DURATION_MAX_MS)
    }

    /// Unpins the tracer (the calling thread) and every task in `tids`
    /// (all of the tree that is still traced). Idempotent.
    pub(crate) fn release(&mut self, tids: impl IntoIterator<Item = i32>) {
        let Some(slot) = self.slot.take() else { return };
        let c = cpus().expect("pinned, so the CPUs were read");
        for tid in tids {
            set(tid, &self.unpinned);
        }
        set(0, &c.wide);
        let mut pins = c.pins.lock().unwrap_or_else(|e| e.into_inner());
        pins[slot] -= 1;
    }

    /// Whether the tree is pinned now.
    pub(crate) fn pinned(&self) -> bool {
        self.slot.is_some()
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        // The tree is gone; only the count and the tracer are left.
        self.release([]);
    }
}
