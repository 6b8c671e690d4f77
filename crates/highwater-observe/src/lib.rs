//! Runs a command observed and reports which files it depended on (issue 24:
//! the recipe is observed, not declared).
//!
//! On Linux x86_64 the command runs under ptrace with a seccomp BPF filter
//! installed just before its `execve`. The filter returns
//! `SECCOMP_RET_TRACE` only for the syscalls that open, look up, list,
//! execute or change files; every other syscall runs at full speed without
//! stopping the tracee. Forks, vforks, clones and execs are followed, and
//! `PTRACE_O_EXITKILL` kills the whole traced tree if highwater dies.
//!
//! What is recorded (paths absolute, resolved against the tracee's cwd or
//! dirfd through `/proc/TID/cwd` and `/proc/TID/fd/N`, lexically cleaned of
//! `.` and doubled slashes but with symlinks and `..` kept as the command
//! wrote them, so the path is the one it looked up; a path under /proc,
//! /dev or /sys alone is resolved as the tracee's open would, magic links
//! and `..` followed, since `/proc/self/cwd/x` is an ordinary file):
//! - `read`: files opened read-only, or looked up (stat, access) and found
//!   (Python stats a module's source and then opens only its cached
//!   bytecode: the source is what it depended on), and existing files
//!   opened for writing without `O_TRUNC` (`sqlite3.connect`, a memmap
//!   `r+`): they can be read through that descriptor, so they are reads
//!   unless the command really changed them (see `opened_rw`);
//! - `executed`: programs executed, and the interpreters behind a shebang,
//!   which the kernel opens itself and the filter never sees;
//! - `absent`: paths looked up (open, stat, access, readlink, exec, chdir)
//!   that did not exist (ENOENT / ENOTDIR);
//! - `listed`: directories whose entries were read (getdents), with the
//!   names the tracer read at the first listing (`listed_names`), so that a
//!   folder changed while the command ran on is told apart;
//! - `links`: symbolic links whose text was read (readlink);
//! - `written`: files created or truncated by an open, renamed (both
//!   names), linked, unlinked or made as folders by the traced tree, each
//!   only when the call *succeeded* (decided at the syscall's exit: a
//!   `mkdir -p` of an existing folder or an `rm -f` of a missing file
//!   changed nothing), and the `opened_rw` files the tree wrote through
//!   (a `write`, `pwrite`, truncation or shared writable `mmap` of its
//!   descriptor, seen at the call: evidence, not a changed stat, since
//!   another process may change the file meanwhile).
//!
//! The command's run ends when every process of its traced tree has
//! exited: a daemon it starts (`setsid … &`) holds the run, and its item,
//! until the daemon exits.
//!
//! [`Observation::finish`] then drops from `read`, `absent` and `executed`
//! whatever the tree wrote itself: a temp file made and removed, a
//! `__pycache__` it wrote, is not something it depended on.
//!
//! Why ptrace + seccomp rather than seccomp user notifications: the tracer
//! needs each syscall's *result* (was the lookup absent? which fd did the
//! open return?), and a user-notification supervisor only sees the call.
//! Why hand-built BPF over `seccompiler`/`libseccomp`/`nix`: the filter is
//! a dozen instructions and `libc` is already in the tree, so the crate
//! adds no dependency and no build time.
//!
//! Why ptrace rather than BPF programs in the kernel (issue 47, measured
//! with `bench/observe_bpf.sh`): BPF streams events without stopping the
//! command, but (1) what a lookup that *failed* named (the absent
//! dependencies: Python's probes, `cat opt.conf || echo defaults`) is seen
//! only at syscall entry, as a user pointer read without stopping the
//! thread, or at the exit of kernel-internal functions whose signatures
//! change between releases, with the relative path still to be resolved
//! against a cwd `bpf_d_path` may not read there; (2) it needs root (or
//! CAP_BPF, CAP_PERFMON, and CAP_MAC_ADMIN for LSM hooks) and "bpf" among
//! the active LSMs, where ptrace needs neither; (3) a BPF object is built
//! by clang or a nightly Rust with bpf-linker, or checked in prebuilt; (4)
//! measured by CPU time of commands plus observer, streaming the same
//! calls' paths from tracepoints through bpftrace's perf buffer cost
//! 1.5-2.1x plain, ptrace 1.65-1.9x: no clear win to pay (1)-(3) for. The
//! stop latency that made ptrace slow (a halted vCPU's wakeup, 43 us a
//! stop) is removed by the pin instead (`pin.rs`), now held while a tree's
//! tasks take turns.
//!
//! Refused, not let through unobserved: 32-bit (ia32, `int 0x80`) and x32
//! system calls, and `io_uring_setup` (a ring opens and reads files with no
//! system call the filter sees); and the calls after which a path the
//! tracee names would mean another file than the one highwater resolves
//! in its own root and mount namespace (issue 47): `chroot`, `pivot_root`,
//! `setns`, `unshare` or `clone` into a new mount namespace
//! (`CLONE_NEWNS`), and `open_by_handle_at`, which opens a file by a
//! handle with no path at all. (`clone3` passes its flags in memory the
//! filter cannot read: a tree that enters a new mount namespace that way is
//! not caught.) Each stops the tracee with its own
//! `SECCOMP_RET_TRACE` data; the tracer kills the whole tree and the
//! command fails with [`ObserveError::Refused`], naming the call.
//!
//! Not observed: files reached only through descriptors inherited from
//! highwater.
//!
//! Layout: this file holds the report ([`Observation`]), the filter and the
//! tracer loop (`linux`); `spawn` starts every command, observed or not,
//! with `clone(CLONE_VM | CLONE_VFORK)` so that highwater's pages are never
//! copy-on-write while a child waits for its tracer; `pin` keeps a young,
//! single-task command on its tracer's CPU, where a stop's round trip is a
//! context switch instead of the wakeup of another CPU.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsString;
use std::io::Read;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};

/// A shebang line is read up to this many bytes (Linux's own limit is 256).
pub const SHEBANG_MAX_BYTES: usize = 256;
/// Nested shebang scripts are followed this deep (Linux allows 4).
pub const SHEBANG_MAX_DEPTH: usize = 4;

/// Why a command could not be run observed.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    #[error(
        "cannot observe commands: ptrace is not permitted here ({source}). \
         In a container, allow it (docker: --cap-add SYS_PTRACE, or a seccomp \
         profile that permits ptrace); with Yama, set \
         /proc/sys/kernel/yama/ptrace_scope to 0 or 1; or set `observe = false` \
         on the stage and list what its command reads in `recipe.files`"
    )]
    PtraceDenied { source: std::io::Error },
    /// Issue 47: under `strace -f`, `gdb`, or as the command of an
    /// observed stage of another highwater, every child is traced already.
    #[error(
        "cannot observe commands: highwater is itself traced by `{tracer}` (pid {pid}), \
         which traces the commands it starts too, and a process has one tracer. \
         Run the tracer without following children (strace without -f), or set \
         `observe = false` on the stage; when this highwater is the command of \
         another highwater's stage, set `observe = false` on that outer stage (this \
         one observes its own commands)"
    )]
    AlreadyTraced { tracer: String, pid: i32 },
    #[error(
        "cannot observe commands: the kernel refused the seccomp filter ({source}). \
         Observation needs a kernel built with CONFIG_SECCOMP_FILTER, and a \
         container whose profile allows seccomp(2) and prctl(PR_SET_NO_NEW_PRIVS); or \
         set `observe = false` on the stage and list what its command reads in \
         `recipe.files`"
    )]
    SeccompUnavailable { source: std::io::Error },
    #[error(
        "cannot observe commands on this platform ({what}); set `observe = false` \
         on the stage and list what its command reads in `recipe.files`"
    )]
    Unsupported { what: &'static str },
    #[error("cannot start `{program}`: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("observing `{program}` failed: {message}")]
    Trace { program: String, message: String },
    #[error(
        "`{program}` made {what}, which highwater cannot observe: its command tree \
         was killed. Set `observe = false` on the stage and list what its command \
         reads in `recipe.files`, or run a build of the program without it"
    )]
    Refused { program: String, what: &'static str },
}

/// In [`Observation::read_ids`]: the path led to two files at two reads.
pub const READ_IDS_DIFFERED: (u64, u64) = (0, 0);

/// The files one observed command tree touched. See the module doc.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Observation {
    pub read: BTreeSet<PathBuf>,
    pub executed: BTreeSet<PathBuf>,
    pub absent: BTreeSet<PathBuf>,
    pub listed: BTreeSet<PathBuf>,
    pub written: BTreeSet<PathBuf>,
    /// Existing files opened for writing without `O_TRUNC`, with their
    /// stat at the first such open. [`Observation::finish`] moves those
    /// whose stat changed to `written`; the others stay reads.
    pub opened_rw: BTreeMap<PathBuf, Stamp>,
    /// When the command started, by the kernel's coarse clock (the one file
    /// timestamps come from): a dependency modified at or after this moment
    /// may have changed while the command ran (racy evidence).
    pub started_ns: i64,
    /// How many times the tree stopped for the tracer (seccomp stops): a
    /// measure of the observation's cost, not evidence.
    pub stops: u64,
    /// The names of each listed folder as the tracer read them when the
    /// command first listed it (issue 47): a folder that gains or loses a
    /// name while the command runs on is racy, like a file changed during
    /// the run, since the listing after the command is not what it saw.
    pub listed_names: BTreeMap<PathBuf, Vec<String>>,
    /// Symbolic links whose text the command read (`readlink`): the link
    /// itself, not followed; its target's content is in `read` as well.
    pub links: BTreeSet<PathBuf>,
    /// The identity (device, inode) each path in `read` led to when the
    /// command read it ([`READ_IDS_DIFFERED`] if two reads disagreed): a
    /// path that leads elsewhere by the record (a symbolic link re-pointed,
    /// a folder renamed over another, while the command ran) may not be
    /// what the command read, even though the file it leads to now is old.
    pub read_ids: BTreeMap<PathBuf, (u64, u64)>,
    /// Folders listed only by Python's import system (see `python.rs`),
    /// whose names count only where an import could match them. A folder
    /// the command also listed otherwise is in `listed` alone.
    pub import_listed: BTreeSet<PathBuf>,
}

impl Observation {
    /// Drops what the tree wrote from what it read, looked up or executed.
    pub fn finish(&mut self) {
        // Opened for writing: a write the tree made through the descriptor
        // (a `write`, `pwrite`, truncation or shared writable mapping, seen
        // at the call) already put it in `written`, the command's own state,
        // excluded like any write (a shared sqlite database several items
        // update must not re-run every item but the last). One the tree
        // never wrote stays a read, even if it changed: a change by anyone
        // else during the run makes it racy, never the command's (issue 47:
        // `sqlite3.connect` to read a table another process updates).
        // What Python reads of highwater's hook is not the command's.
        for set in [
            &mut self.read,
            &mut self.absent,
            &mut self.listed,
            &mut self.import_listed,
        ] {
            set.retain(|p| !python::is_hook_path(p));
        }
        let listed = &self.listed;
        self.import_listed.retain(|p| !listed.contains(p));
        let written = &self.written;
        self.read.retain(|p| !written.contains(p));
        self.absent.retain(|p| !written.contains(p));
        self.executed.retain(|p| !written.contains(p));
        // A path both read (it existed) and absent (at another moment) is
        // kept as read: its content is the stronger evidence.
        let read = &self.read;
        let executed = &self.executed;
        self.absent
            .retain(|p| !read.contains(p) && !executed.contains(p));
    }
}

/// The stat fields that say a file was changed in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub ino: u64,
    pub dev: u64,
}

impl Stamp {
    pub fn of(p: &Path) -> Option<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(p).ok()?;
        Some(Stamp {
            size: m.size(),
            mtime_ns: m.mtime().saturating_mul(1_000_000_000) + m.mtime_nsec(),
            ctime_ns: m.ctime().saturating_mul(1_000_000_000) + m.ctime_nsec(),
            ino: m.ino(),
            dev: m.dev(),
        })
    }
}

/// Now by `CLOCK_REALTIME_COARSE`, the clock the kernel stamps files with:
/// a file written after this moment never carries an earlier mtime.
pub fn coarse_now_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec.
    unsafe {
        libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts);
    }
    ts.tv_sec.saturating_mul(1_000_000_000) + ts.tv_nsec
}

/// Whether this platform can observe at all, checked by running `true`
/// observed (a real ptrace attach, so a container without ptrace says so).
pub fn probe() -> Result<(), ObserveError> {
    let mut cmd = Command::new("true");
    cmd.stdin(Stdio::null());
    output(&mut cmd).map(|_| ())
}

/// Runs `cmd` observed, collecting its stdout and stderr like
/// [`Command::output`]. Of `cmd`, its program, arguments, folder and
/// environment changes are honoured; stdin is `/dev/null`, and its own
/// stdio, `env_clear` and `pre_exec` hooks are not (see `spawn`). The
/// returned observation is already [`Observation::finish`]ed.
pub fn output(cmd: &mut Command) -> Result<(Output, Observation), ObserveError> {
    output_with(cmd, None)
}

/// Runs `cmd` unobserved, started as observed commands are (see `spawn`:
/// no `fork` of highwater's address space, the child dying with the
/// calling thread), collecting its stdout and stderr. An `observe = false`
/// stage runs its commands this way, so that observation's measured cost
/// is the tracer's alone.
pub fn output_unobserved(cmd: &mut Command) -> std::io::Result<Output> {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    {
        use std::os::unix::process::ExitStatusExt;
        let started = spawn::spawn(cmd, &mut || 0).map_err(|(e, pid)| {
            if let Some(pid) = pid {
                let _ = spawn::reap(pid);
            }
            e
        })?;
        let read = read_both(started.stdout, started.stderr);
        let status = spawn::reap(started.pid)?;
        let (stdout, stderr) = read?;
        Ok(Output {
            status: std::process::ExitStatus::from_raw(status),
            stdout,
            stderr,
        })
    }
    #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
    {
        cmd.output()
    }
}

/// Told each path the tree is about to write, at the moment it is seen.
pub type OnWrite = std::sync::Arc<dyn Fn(&Path) + Send + Sync>;

/// [`output`], calling `on_write` with each path the tree is about to
/// create, write, rename or remove, while the tracee is stopped before
/// doing so.
pub fn output_with(
    cmd: &mut Command,
    on_write: Option<OnWrite>,
) -> Result<(Output, Observation), ObserveError> {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    {
        linux::output(cmd, on_write)
    }
    #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
    {
        let _ = (cmd, on_write);
        Err(ObserveError::Unsupported {
            what: "only Linux on x86_64 is supported",
        })
    }
}

/// Joins `rel` onto `base` and removes `.` components and doubled slashes.
/// `..` is kept: with symlinks, resolving it lexically could name another
/// file than the one the command opened.
pub fn clean_join(base: &Path, rel: &Path) -> PathBuf {
    let joined = if rel.is_absolute() {
        rel.to_path_buf()
    } else {
        base.join(rel)
    };
    // Most paths a command names are clean already: keep them as they are
    // (the component walk below costs more than the rest of a stop's work
    // in user space).
    if is_clean(joined.as_os_str().as_bytes()) {
        return joined;
    }
    let mut out = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// Whether `components()` would give `p` back unchanged: no empty or `.`
/// component, no trailing slash (the root alone aside).
fn is_clean(p: &[u8]) -> bool {
    if p == b"/" {
        return true;
    }
    if p.is_empty() || p.ends_with(b"/") {
        return false;
    }
    let rest = p.strip_prefix(b"/").unwrap_or(p);
    rest.split(|&b| b == b'/')
        .all(|c| !c.is_empty() && c != b".")
}

/// The program the kernel loads itself to run `path`, which no filter
/// sees: the interpreter of a shebang line, or the ELF interpreter
/// (`PT_INTERP`, the dynamic loader) of a program (issue 47: a loader kept
/// in the project was no dependency).
pub fn interpreter(path: &Path) -> Option<PathBuf> {
    shebang_interpreter(path).or_else(|| elf_interpreter(path))
}

/// How many program headers are read looking for `PT_INTERP`, and the
/// longest interpreter path taken.
const ELF_PHDRS_MAX: usize = 64;
const ELF_INTERP_MAX_BYTES: usize = 4096;

/// The `PT_INTERP` path of a 64-bit little-endian ELF file.
pub fn elf_interpreter(path: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).ok()?;
    let mut h = [0u8; 64];
    f.read_exact_at(&mut h, 0).ok()?;
    // Magic, ELFCLASS64, ELFDATA2LSB.
    if h[..4] != *b"\x7fELF" || h[4] != 2 || h[5] != 1 {
        return None;
    }
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let (phoff, phentsize, phnum) = (u64_at(&h, 32), u16_at(&h, 54), u16_at(&h, 56));
    if phentsize < 56 || phnum == 0 {
        return None;
    }
    let mut ph = vec![0u8; phentsize * phnum.min(ELF_PHDRS_MAX)];
    f.read_exact_at(&mut ph, phoff).ok()?;
    let interp = ph
        .chunks_exact(phentsize)
        .find(|p| p[..4] == 3u32.to_le_bytes())?;
    let (off, size) = (u64_at(interp, 8), u64_at(interp, 32) as usize);
    let mut name = vec![0u8; size.min(ELF_INTERP_MAX_BYTES)];
    f.read_exact_at(&mut name, off).ok()?;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    name.truncate(end);
    let p = PathBuf::from(OsString::from_vec(name));
    p.is_absolute().then_some(p)
}

/// The interpreter named by a shebang line, if `path` starts with `#!`.
pub fn shebang_interpreter(path: &Path) -> Option<PathBuf> {
    let mut f = std::fs::File::open(path).ok()?;
    let mut buf = [0u8; SHEBANG_MAX_BYTES];
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(_) => return None,
        }
    }
    let line = buf[..n].strip_prefix(b"#!")?;
    let line = &line[..line.iter().position(|&b| b == b'\n').unwrap_or(line.len())];
    let start = line.iter().position(|&b| b != b' ' && b != b'\t')?;
    let rest = &line[start..];
    let end = rest
        .iter()
        .position(|&b| b == b' ' || b == b'\t')
        .unwrap_or(rest.len());
    let interp = PathBuf::from(OsString::from_vec(rest[..end].to_vec()));
    interp.is_absolute().then_some(interp)
}

/// Reads a child's stdout and stderr to their ends on this thread, as
/// std's `Command::output` does: one poll loop, not a thread per pipe (two
/// thread spawns per command were a measurable part of observing a 2 ms
/// `cp`).
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn read_both(out: std::fs::File, err: std::fs::File) -> std::io::Result<(Vec<u8>, Vec<u8>)> {
    use std::os::fd::AsRawFd;
    let mut open = [Some(out), Some(err)];
    let mut bufs = [Vec::new(), Vec::new()];
    for f in open.iter().flatten() {
        // SAFETY: fcntl on a descriptor we own.
        unsafe {
            let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
    }
    let mut chunk = [0u8; 16 * 1024];
    while open.iter().any(Option::is_some) {
        let mut fds = open.each_ref().map(|f| libc::pollfd {
            fd: f.as_ref().map_or(-1, |f| f.as_raw_fd()),
            events: libc::POLLIN,
            revents: 0,
        });
        // SAFETY: fds is a valid array of two pollfd; a negative fd is
        // ignored by poll.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        for i in 0..2 {
            if fds[i].revents == 0 {
                continue;
            }
            while let Some(f) = open[i].as_mut() {
                match f.read(&mut chunk) {
                    Ok(0) => open[i] = None,
                    Ok(n) => bufs[i].extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
    let [out, err] = bufs;
    Ok((out, err))
}

fn program_name(cmd: &Command) -> String {
    cmd.get_program().to_string_lossy().into_owned()
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod pin;
pub mod python;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod spawn;

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod linux {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::process::ExitStatusExt;

    /// The syscalls that stop the tracee. Everything else is allowed by the
    /// filter without a stop.
    pub(super) const TRACED: &[libc::c_long] = &[
        libc::SYS_open,
        libc::SYS_openat,
        libc::SYS_openat2,
        libc::SYS_creat,
        libc::SYS_execve,
        libc::SYS_execveat,
        libc::SYS_stat,
        libc::SYS_lstat,
        libc::SYS_newfstatat,
        libc::SYS_statx,
        libc::SYS_access,
        libc::SYS_faccessat,
        libc::SYS_faccessat2,
        libc::SYS_readlink,
        libc::SYS_readlinkat,
        libc::SYS_getdents,
        libc::SYS_getdents64,
        libc::SYS_unlink,
        libc::SYS_unlinkat,
        libc::SYS_rmdir,
        libc::SYS_rename,
        libc::SYS_renameat,
        libc::SYS_renameat2,
        libc::SYS_mkdir,
        libc::SYS_mkdirat,
        libc::SYS_link,
        libc::SYS_linkat,
        libc::SYS_symlink,
        libc::SYS_symlinkat,
        libc::SYS_truncate,
        // A `cd` into a folder that is absent is a lookup like any other
        // (`cd conf.d 2>/dev/null && cat *.conf || echo defaults`, issue
        // 47); into one that exists it names nothing read.
        libc::SYS_chdir,
        // Not files: a tree that asks which CPUs it may use, or sets them,
        // is unpinned first (see `pin`), so it never sizes a pool from the
        // pin nor has its own choice overridden.
        libc::SYS_sched_getaffinity,
        libc::SYS_sched_setaffinity,
        // Not files: a task that waits for a child is not running, so a
        // tree whose tasks take turns (a shell and the command it waits
        // for, pyenv's shim) stays on one CPU (see `pin`).
        libc::SYS_wait4,
        libc::SYS_waitid,
    ];

    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    /// `SECCOMP_RET_TRACE` data of the calls refused (0: an observed call).
    const REFUSE_IA32: u32 = 1;
    const REFUSE_X32: u32 = 2;
    const REFUSE_IO_URING: u32 = 3;
    const REFUSE_CHROOT: u32 = 4;
    const REFUSE_PIVOT_ROOT: u32 = 5;
    const REFUSE_SETNS: u32 = 6;
    const REFUSE_HANDLE: u32 = 7;
    const REFUSE_NEW_MOUNT_NS: u32 = 8;
    /// Not a filter's data: the tracer could not read what a call names.
    const REFUSE_UNREADABLE: u32 = 9;
    const REFUSE_USELIB: u32 = 10;
    const REFUSE_PIDFD_GETFD: u32 = 11;

    /// The calls refused whatever their arguments, with their data.
    pub(super) const REFUSED: &[(libc::c_long, u32)] = &[
        (libc::SYS_io_uring_setup, REFUSE_IO_URING),
        (libc::SYS_chroot, REFUSE_CHROOT),
        (libc::SYS_pivot_root, REFUSE_PIVOT_ROOT),
        (libc::SYS_setns, REFUSE_SETNS),
        (libc::SYS_open_by_handle_at, REFUSE_HANDLE),
        (libc::SYS_uselib, REFUSE_USELIB),
        (libc::SYS_pidfd_getfd, REFUSE_PIDFD_GETFD),
    ];

    /// The calls answered `ENOSYS` without running, so the C library falls
    /// back to one the filter can judge: `clone3` passes its flags in
    /// memory, out of a seccomp filter's reach (a new mount namespace
    /// would go unseen), and glibc retries as `clone`, whose flags are an
    /// argument (as Docker's default profile does).
    pub(super) const ENOSYS_CALLS: &[libc::c_long] = &[libc::SYS_clone3];

    /// The calls that write through a descriptor, with the argument that
    /// holds it: stopped for a descriptor above stderr (and `mmap` when
    /// shared, writable and of a file), so that a file opened read-write
    /// counts as the command's own write only with evidence that the
    /// command wrote it (issue 47). The cost is one stop per such call;
    /// the standard streams are highwater's pipes and never stop.
    pub(super) const WRITES: &[(libc::c_long, u32)] = &[
        (libc::SYS_write, 0),
        (libc::SYS_writev, 0),
        (libc::SYS_pwrite64, 0),
        (libc::SYS_pwritev, 0),
        (libc::SYS_pwritev2, 0),
        (libc::SYS_ftruncate, 0),
        (libc::SYS_fallocate, 0),
        (libc::SYS_sendfile, 0),
        (libc::SYS_copy_file_range, 2),
        (libc::SYS_splice, 2),
        (libc::SYS_mmap, 4),
        // Onto stdout or stderr (a shell's `>&4`, `cmd 1<>file`): what the
        // command then writes there goes to the file unstopped, so the
        // redirection itself is the evidence.
        (libc::SYS_dup2, 0),
        (libc::SYS_dup3, 0),
    ];

    /// The calls refused when their first argument (flags) asks for a new
    /// mount namespace.
    pub(super) const REFUSED_WITH_NEWNS: &[libc::c_long] = &[libc::SYS_unshare, libc::SYS_clone];

    /// What a refused call was, for the error.
    fn refused_what(data: u32) -> &'static str {
        match data {
            REFUSE_IA32 => "a 32-bit (ia32) system call",
            REFUSE_X32 => "an x32 system call",
            REFUSE_CHROOT => "a chroot call (its paths would name files under another root than the one highwater resolves them in)",
            REFUSE_PIVOT_ROOT => "a pivot_root call (its paths would name files under another root than the one highwater resolves them in)",
            REFUSE_SETNS => "a setns call (in another namespace its paths would name other files than the ones highwater resolves)",
            REFUSE_HANDLE => "an open_by_handle_at call (it opens a file by handle, with no path to record)",
            REFUSE_NEW_MOUNT_NS => "an unshare or clone into a new mount namespace (its mounts would make its paths name other files than the ones highwater resolves)",
            REFUSE_USELIB => "a uselib call (it maps a library by path, unseen)",
            REFUSE_PIDFD_GETFD => "a pidfd_getfd call (it takes a descriptor another process opened, so what it reads was never looked up in the tree)",
            REFUSE_UNREADABLE => "a file call whose path highwater was not allowed to read (the process made itself non-dumpable, as ssh does, or runs an execute-only program; run highwater as root, or give the program read permission)",
            _ => "an io_uring_setup call (a ring opens and reads files unseen)",
        }
    }

    /// The BPF program: stop foreign-arch (ia32) and x32 calls and
    /// `io_uring_setup` with their refusal data (see the module doc),
    /// allow `fstat` done as `newfstatat(fd, "", AT_EMPTY_PATH)` or
    /// `statx(fd, "", AT_EMPTY_PATH)` (glibc's fstat; it names no path, and
    /// it is the commonest of them all), trace the listed syscalls, allow
    /// the rest.
    ///
    /// The syscall number is found by a balanced search tree of compares,
    /// not a chain: installing a filter makes the kernel run it once per
    /// syscall number to build its allow cache, so its cost grows with the
    /// longest path (measured on its own: a 40-compare chain cost 90-125 us
    /// to install, a jump over the same 40 instructions nothing).
    pub(super) fn filter() -> Vec<libc::sock_filter> {
        use libc::{BPF_ABS, BPF_JEQ, BPF_JGE, BPF_JMP, BPF_JSET, BPF_K, BPF_LD, BPF_RET, BPF_W};
        const LD: u16 = (BPF_LD | BPF_W | BPF_ABS) as u16;
        const RET: u16 = (BPF_RET | BPF_K) as u16;
        const JEQ: u16 = (BPF_JMP | BPF_JEQ | BPF_K) as u16;
        const JGE: u16 = (BPF_JMP | BPF_JGE | BPF_K) as u16;
        const JSET: u16 = (BPF_JMP | BPF_JSET | BPF_K) as u16;
        // offsetof(struct seccomp_data, ...): nr 0, arch 4, args[i] 16 + 8i
        // (the low 32 bits on little-endian).
        let arg = |i: u32| 16 + 8 * i;
        /// Where a jump goes: the next instruction, or a labelled tail block.
        #[derive(Clone, Copy, PartialEq)]
        enum To {
            Next,
            Skip(u8),
            Trace,
            /// Refused, with this index into `REFUSED`.
            Refuse(usize),
            /// Refused when its flags ask for a new mount namespace.
            NewNs,
            /// Answered ENOSYS (see `ENOSYS_CALLS`).
            Enosys,
            /// A write through the descriptor in argument 0 or 2: stopped
            /// only for a descriptor above stderr (see `WRITES`).
            FdArg0,
            FdArg2,
            /// An `mmap`: stopped only when shared, writable and of a file.
            MmapShared,
            /// A `dup2`/`dup3`: stopped only onto stdout or stderr.
            DupOut,
            Fstatat,
            Statx,
        }
        struct Ins {
            code: u16,
            k: u32,
            jt: To,
            jf: To,
        }
        let ins = |code: u16, k: u32, jt: To, jf: To| Ins { code, k, jt, jf };
        let ret = |k: u32| ins(RET, k, To::Next, To::Next);
        let trace = libc::SECCOMP_RET_TRACE;
        let mut f = vec![
            ins(LD, 4, To::Next, To::Next),
            ins(JEQ, AUDIT_ARCH_X86_64, To::Skip(1), To::Next),
            ret(trace | REFUSE_IA32),
            ins(LD, 0, To::Next, To::Next),
            ins(JGE, X32_SYSCALL_BIT, To::Next, To::Skip(1)),
            ret(trace | REFUSE_X32),
        ];
        let mut calls: Vec<(u32, To)> = TRACED
            .iter()
            .map(|&n| {
                let to = match n {
                    libc::SYS_newfstatat => To::Fstatat,
                    libc::SYS_statx => To::Statx,
                    _ => To::Trace,
                };
                (n as u32, to)
            })
            .chain(
                REFUSED
                    .iter()
                    .enumerate()
                    .map(|(i, &(n, _))| (n as u32, To::Refuse(i))),
            )
            .chain(REFUSED_WITH_NEWNS.iter().map(|&n| (n as u32, To::NewNs)))
            .chain(ENOSYS_CALLS.iter().map(|&n| (n as u32, To::Enosys)))
            .chain(WRITES.iter().map(|&(n, fd_arg)| {
                let to = match (n, fd_arg) {
                    (libc::SYS_mmap, _) => To::MmapShared,
                    (libc::SYS_dup2 | libc::SYS_dup3, _) => To::DupOut,
                    (_, 0) => To::FdArg0,
                    _ => To::FdArg2,
                };
                (n as u32, to)
            }))
            .collect();
        calls.sort_unstable_by_key(|c| c.0);
        // A range of the sorted calls: split at the middle with JGE until
        // at most three are left, then compare each and allow the rest.
        fn tree(f: &mut Vec<Ins>, calls: &[(u32, To)]) {
            if calls.len() <= 3 {
                for &(nr, to) in calls {
                    f.push(Ins {
                        code: JEQ,
                        k: nr,
                        jt: to,
                        jf: To::Next,
                    });
                }
                f.push(Ins {
                    code: RET,
                    k: libc::SECCOMP_RET_ALLOW,
                    jt: To::Next,
                    jf: To::Next,
                });
                return;
            }
            let (low, high) = calls.split_at(calls.len() / 2);
            let at = f.len();
            f.push(Ins {
                code: JGE,
                k: high[0].0,
                jt: To::Next,
                jf: To::Next,
            });
            tree(f, low);
            let skip = f.len() - at - 1;
            f[at].jt = To::Skip(u8::try_from(skip).expect("a small filter"));
            tree(f, high);
        }
        tree(&mut f, &calls);
        let trace_at = f.len();
        f.push(ret(trace));
        let refuse_at = f.len();
        for &(_, data) in REFUSED {
            f.push(ret(trace | data));
        }
        let new_ns_at = f.len();
        f.push(ins(LD, arg(0), To::Next, To::Next));
        f.push(ins(JSET, libc::CLONE_NEWNS as u32, To::Next, To::Skip(1)));
        f.push(ret(trace | REFUSE_NEW_MOUNT_NS));
        f.push(ret(libc::SECCOMP_RET_ALLOW));
        let enosys_at = f.len();
        f.push(ret(libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32));
        let mut fd_at = [0; 2];
        for (b, fd_arg) in fd_at.iter_mut().zip([0, 2]) {
            *b = f.len();
            f.push(ins(LD, arg(fd_arg), To::Next, To::Next));
            f.push(ins(JGE, 3, To::Next, To::Skip(1)));
            f.push(ret(trace));
            f.push(ret(libc::SECCOMP_RET_ALLOW));
        }
        let mmap_at = f.len();
        f.push(ins(LD, arg(3), To::Next, To::Next));
        f.push(ins(JSET, libc::MAP_SHARED as u32, To::Next, To::Skip(4)));
        f.push(ins(JSET, libc::MAP_ANONYMOUS as u32, To::Skip(3), To::Next));
        f.push(ins(LD, arg(2), To::Next, To::Next));
        f.push(ins(JSET, libc::PROT_WRITE as u32, To::Next, To::Skip(1)));
        f.push(ret(trace));
        f.push(ret(libc::SECCOMP_RET_ALLOW));
        let mut blocks = [0; 2];
        for (b, flags_arg) in blocks.iter_mut().zip([3, 2]) {
            *b = f.len();
            f.push(ins(LD, arg(flags_arg), To::Next, To::Next));
            f.push(ins(JSET, libc::AT_EMPTY_PATH as u32, To::Next, To::Skip(1)));
            f.push(ret(libc::SECCOMP_RET_ALLOW));
            f.push(ret(trace));
        }
        let dup_out_at = f.len();
        f.push(ins(LD, arg(1), To::Next, To::Next));
        f.push(ins(JEQ, 1, To::Skip(1), To::Next));
        f.push(ins(JEQ, 2, To::Next, To::Skip(1)));
        f.push(ret(trace));
        f.push(ret(libc::SECCOMP_RET_ALLOW));
        let resolve = |from: usize, to: To| -> u8 {
            let abs = match to {
                To::Next => return 0,
                To::Skip(n) => return n,
                To::Trace => trace_at,
                To::Refuse(i) => refuse_at + i,
                To::NewNs => new_ns_at,
                To::Enosys => enosys_at,
                To::FdArg0 => fd_at[0],
                To::FdArg2 => fd_at[1],
                To::MmapShared => mmap_at,
                To::DupOut => dup_out_at,
                To::Fstatat => blocks[0],
                To::Statx => blocks[1],
            };
            u8::try_from(abs - (from + 1)).expect("a jump within a small filter")
        };
        f.iter()
            .enumerate()
            .map(|(i, x)| libc::sock_filter {
                code: x.code,
                jt: resolve(i, x.jt),
                jf: resolve(i, x.jf),
                k: x.k,
            })
            .collect()
    }

    /// What the tracer thread hands back.
    struct Traced {
        status: ExitStatus,
        obs: Observation,
    }

    type Job = Box<dyn FnOnce() -> Result<Traced, ObserveError> + Send>;

    /// The tracer thread of the calling thread, kept for its next command:
    /// a thread's start and end cost ~45 us here, a sixth of observation's
    /// fixed cost per command. It ends when the calling thread does (the
    /// jobs channel closes). One command at a time per calling thread, as
    /// `output` is synchronous.
    struct Tracer {
        /// The tracer thread's tid, for its pin.
        tid: i32,
        jobs: std::sync::mpsc::Sender<Job>,
        done: std::sync::mpsc::Receiver<Option<Result<Traced, ObserveError>>>,
    }

    thread_local! {
        static TRACER: std::cell::OnceCell<Tracer> = const { std::cell::OnceCell::new() };
    }

    impl Tracer {
        fn new() -> Tracer {
            let (jobs, rx) = std::sync::mpsc::channel::<Job>();
            let (tx, done) = std::sync::mpsc::channel();
            let (tid_tx, tid_rx) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name("highwater-tracer".into())
                .spawn(move || {
                    // SAFETY: gettid has no arguments.
                    let _ = tid_tx.send(unsafe { libc::gettid() });
                    for job in rx {
                        // A panic fails this command only; the thread
                        // (and its tracer role) carries on.
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).ok();
                        if tx.send(r).is_err() {
                            return;
                        }
                    }
                })
                .expect("a tracer thread (out of threads?)");
            let tid = tid_rx
                .recv()
                .expect("a new tracer thread says its tid first");
            Tracer { tid, jobs, done }
        }

        /// Starts `job` on the tracer thread.
        fn submit(&self, job: Job) {
            self.jobs
                .send(job)
                .expect("the tracer thread lives while its channel does");
        }

        /// The submitted job's result; `None` if it panicked. Every
        /// submit is joined before the next (see `output_on`).
        fn join(&self) -> Option<Result<Traced, ObserveError>> {
            self.done.recv().ok().flatten()
        }
    }

    pub(super) fn output(
        cmd: &mut Command,
        on_write: Option<OnWrite>,
    ) -> Result<(Output, Observation), ObserveError> {
        TRACER.with(|t| output_on(t.get_or_init(Tracer::new), cmd, on_write))
    }

    fn output_on(
        tracer: &Tracer,
        cmd: &mut Command,
        on_write: Option<OnWrite>,
    ) -> Result<(Output, Observation), ObserveError> {
        let program = program_name(cmd);
        let spawn_err = |source| ObserveError::Spawn {
            program: program.clone(),
            source,
        };
        // Above stdio, as the command's own pipes: the hook runs after the
        // child's dup2 of 0, 1 and 2.
        let (pid_r, pid_w) = crate::spawn::pipe().map_err(spawn_err)?;
        let (go_r, go_w) = crate::spawn::pipe().map_err(spawn_err)?;
        let prog = filter();
        let (pid_w_fd, go_r_fd) = (pid_w.as_raw_fd(), go_r.as_raw_fd());
        // Set by the child (it shares this memory until its exec: see
        // `spawn`) when the filter could not be installed, so that the
        // error says seccomp, not the command.
        let hook_failed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let hook_failed_in_child = hook_failed.clone();
        // Runs in the child just before its execve (see `spawn`): raw
        // system calls only, on memory prepared before the clone.
        let mut hook = move || -> libc::c_int {
            // SAFETY: plain system calls on descriptors and a filter
            // prepared before the clone.
            unsafe {
                // Tell the tracer who we are, then wait until it has
                // attached: the filter below would fail every traced
                // syscall with ENOSYS if no tracer were there yet.
                let pid = libc::getpid().to_ne_bytes();
                if libc::write(pid_w_fd, pid.as_ptr().cast(), pid.len()) != pid.len() as isize {
                    return libc::EIO;
                }
                let mut go = [0u8; 1];
                if libc::read(go_r_fd, go.as_mut_ptr().cast(), 1) != 1 || go[0] != b'y' {
                    return libc::EPERM;
                }
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    hook_failed_in_child.store(true, std::sync::atomic::Ordering::Relaxed);
                    return *libc::__errno_location();
                }
                let fprog = libc::sock_fprog {
                    len: prog.len() as u16,
                    filter: prog.as_ptr() as *mut libc::sock_filter,
                };
                if libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    0,
                    &fprog as *const libc::sock_fprog,
                ) != 0
                {
                    hook_failed_in_child.store(true, std::sync::atomic::Ordering::Relaxed);
                    return *libc::__errno_location();
                }
                0
            }
        };

        // The tracer is another thread (this one's, kept: see `Tracer`) so
        // that it can attach while this one is still inside `spawn` (which
        // returns only once the child has exec'd). This thread stays alive
        // until the child is gone: it is the child's parent, and
        // PR_SET_PDEATHSIG fires when the parent *thread* exits.
        let tracer_program = program.clone();
        // Before the start: the child takes this thread's mask (see pin.rs).
        let (pin, starting) = crate::pin::Pin::start(tracer.tid);
        tracer.submit(Box::new(move || -> Result<Traced, ObserveError> {
            let mut pid_buf = [0u8; 4];
            let mut pid_file = std::fs::File::from(pid_r);
            if pid_file.read_exact(&mut pid_buf).is_err() {
                // The child failed before our hook; spawn reports why.
                return Err(ObserveError::Trace {
                    program: tracer_program,
                    message: "the command did not start".into(),
                });
            }
            let pid = i32::from_ne_bytes(pid_buf);
            let go = std::fs::File::from(go_w);
            let opts = libc::PTRACE_O_TRACECLONE
                | libc::PTRACE_O_TRACEFORK
                | libc::PTRACE_O_TRACEVFORK
                | libc::PTRACE_O_TRACEEXEC
                | libc::PTRACE_O_TRACESECCOMP
                | libc::PTRACE_O_TRACESYSGOOD
                | libc::PTRACE_O_EXITKILL;
            // SAFETY: plain ptrace request on a pid we were just handed.
            let r = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0, opts as libc::c_long) };
            use std::io::Write;
            if r != 0 {
                let err = std::io::Error::last_os_error();
                let _ = (&go).write_all(b"n");
                return Err(match own_tracer() {
                    Some((tracer, pid)) => ObserveError::AlreadyTraced { tracer, pid },
                    None => ObserveError::PtraceDenied { source: err },
                });
            }
            let _ = (&go).write_all(b"y");
            drop(go);
            trace_loop(pid, &tracer_program, on_write, pin)
        }));
        let started_ns = crate::coarse_now_ns();
        // Python's import listings announce themselves (see `python.rs`).
        crate::python::prepare(cmd);
        let spawned = crate::spawn::spawn(cmd, &mut hook);
        // The command has exec'd (or failed to): this thread goes back to
        // its own mask; the command keeps the pin until its tracer lets go.
        drop(starting);
        // Our copies of the child's ends: the tracer must see EOF if the
        // child dies before writing its pid.
        drop(pid_w);
        drop(go_r);
        let child = match spawned {
            Ok(c) => c,
            Err((e, pid)) => {
                let why = match tracer.join() {
                    Some(Err(
                        denied @ (ObserveError::PtraceDenied { .. }
                        | ObserveError::AlreadyTraced { .. }),
                    )) => denied,
                    _ if hook_failed.load(std::sync::atomic::Ordering::Relaxed) => {
                        ObserveError::SeccompUnavailable { source: e }
                    }
                    _ => spawn_err(e),
                };
                // The tracer has let go of it (it peeks at an exit before
                // the command's exec, never reaps it): ours to reap.
                if let Some(pid) = pid {
                    let _ = crate::spawn::reap(pid);
                }
                return Err(why);
            }
        };
        let read = read_both(child.stdout, child.stderr);
        let traced = tracer.join().ok_or_else(|| ObserveError::Trace {
            program: program.clone(),
            message: "the tracer thread panicked".into(),
        })??;
        // The tracer reaped the child (it is in our thread group).
        let (stdout, stderr) = read.map_err(|e| ObserveError::Trace {
            program: program.clone(),
            message: format!("reading its output: {e}"),
        })?;
        let mut obs = traced.obs;
        obs.started_ns = started_ns;
        obs.finish();
        Ok((
            Output {
                status: traced.status,
                stdout,
                stderr,
            },
            obs,
        ))
    }

    /// Per traced thread: the program of an `execve` it is inside, recorded
    /// when its PTRACE_EVENT_EXEC says the exec succeeded.
    #[derive(Default)]
    struct Tracee {
        exec: Option<PathBuf>,
        /// Inside `wait4` or `waitid`: asleep until a child changes state,
        /// so not competing for a CPU (see `pin`).
        waiting: bool,
        /// What the call the tracee is inside writes, if it succeeds: told
        /// at its exit stop.
        pending: Vec<PathBuf>,
        /// Where a listing Python's import system announced stands.
        import_listing: ImportListing,
    }

    /// A listing announced by Python's import system (see `python.rs`):
    /// announced, then its folder opened, then read through one
    /// descriptor by one or more getdents. Anything else on the way (a
    /// user's announcement, another folder opened or read) ends it, so a
    /// listing counts as the import system's only while it is one.
    #[derive(Default, Clone, Copy, PartialEq, Eq)]
    enum ImportListing {
        #[default]
        None,
        /// Announced for the folder with this identity (device, inode).
        Announced((u64, u64)),
        /// Being read through this descriptor.
        Reading((u64, u64), i32),
    }

    /// The tree's tasks that are not asleep in a wait for a child.
    fn running(tracees: &HashMap<i32, Tracee>) -> usize {
        tracees.values().filter(|t| !t.waiting).count()
    }

    fn regs(tid: i32) -> Option<libc::user_regs_struct> {
        // SAFETY: user_regs_struct is plain data; PTRACE_GETREGS fills it.
        unsafe {
            let mut r: libc::user_regs_struct = std::mem::zeroed();
            (libc::ptrace(libc::PTRACE_GETREGS, tid, 0, &mut r as *mut _) == 0).then_some(r)
        }
    }

    /// `struct ptrace_syscall_info` (linux/ptrace.h) at a seccomp stop.
    #[repr(C)]
    #[derive(Default)]
    struct SyscallInfo {
        op: u8,
        pad: [u8; 3],
        arch: u32,
        instruction_pointer: u64,
        stack_pointer: u64,
        nr: u64,
        args: [u64; 6],
        ret_data: u32,
        pad2: u32,
    }

    const PTRACE_GET_SYSCALL_INFO: libc::c_uint = 0x420e;
    const PTRACE_SYSCALL_INFO_SECCOMP: u8 = 3;

    /// The call a tracee is stopped at by the filter: its number, its
    /// arguments and the filter's `SECCOMP_RET_DATA`, in one request (two
    /// before, GETEVENTMSG and GETREGS, at every one of a `cp`'s 51 stops).
    fn seccomp_call(tid: i32) -> Option<(libc::c_long, [u64; 6], u32)> {
        let mut i = SyscallInfo::default();
        // SAFETY: the kernel writes at most the size given into `i`.
        let n = unsafe {
            libc::ptrace(
                PTRACE_GET_SYSCALL_INFO,
                tid,
                std::mem::size_of::<SyscallInfo>(),
                &mut i as *mut SyscallInfo,
            )
        };
        (n > 0 && i.op == PTRACE_SYSCALL_INFO_SECCOMP).then_some((
            i.nr as libc::c_long,
            i.args,
            i.ret_data,
        ))
    }

    /// Reads a NUL-terminated string from the tracee, page by page so that
    /// a string ending just before an unmapped page still reads. Straight
    /// into the returned vector, a short first read: most paths are short,
    /// and this runs at nearly every stop.
    fn read_cstr(tid: i32, addr: u64) -> Option<Vec<u8>> {
        const PAGE: u64 = 4096;
        const FIRST: usize = 256;
        let max = libc::PATH_MAX as usize;
        let mut out: Vec<u8> = Vec::with_capacity(FIRST);
        let mut at = addr;
        while out.len() < max {
            let want = if out.is_empty() {
                FIRST
            } else {
                max - out.len()
            };
            let chunk = want.min((PAGE - at % PAGE) as usize);
            out.reserve(chunk);
            let local = libc::iovec {
                iov_base: out.spare_capacity_mut().as_mut_ptr().cast(),
                iov_len: chunk,
            };
            let remote = libc::iovec {
                iov_base: at as *mut libc::c_void,
                iov_len: chunk,
            };
            // SAFETY: the local iovec is `chunk` bytes of the vector's
            // reserved capacity; the kernel checks the remote range.
            let n = unsafe { libc::process_vm_readv(tid, &local, 1, &remote, 1, 0) };
            if n <= 0 {
                note_denied();
                return None;
            }
            let start = out.len();
            // SAFETY: the kernel wrote `n` bytes (at most `chunk`) there.
            unsafe { out.set_len(start + n as usize) };
            if let Some(z) = out[start..].iter().position(|&b| b == 0) {
                out.truncate(start + z);
                return Some(out);
            }
            at += n as u64;
        }
        None
    }

    fn read_u64(tid: i32, addr: u64) -> Option<u64> {
        let mut v = 0u64;
        let local = libc::iovec {
            iov_base: (&mut v as *mut u64).cast(),
            iov_len: 8,
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: 8,
        };
        // SAFETY: as in read_cstr.
        let n = unsafe { libc::process_vm_readv(tid, &local, 1, &remote, 1, 0) };
        if n != 8 {
            note_denied();
        }
        (n == 8).then_some(v)
    }

    fn proc_link(tid: i32, what: &str) -> Option<PathBuf> {
        match std::fs::read_link(format!("/proc/{tid}/{what}")) {
            Ok(p) => Some(p),
            Err(e) => {
                if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES)) {
                    DENIED.with(|d| d.set(true));
                }
                None
            }
        }
    }

    thread_local! {
        /// Set when the tracer was refused a look at the tracee (its
        /// memory, its `/proc/TID/fd`): the tracee made itself
        /// non-dumpable (`prctl(PR_SET_DUMPABLE, 0)`, as ssh does) or runs
        /// an execute-only program, and highwater is not root. The call it
        /// stopped at is then not let through unrecorded: the tree is
        /// killed (issue 47). A bad address (EFAULT) is no denial: the
        /// kernel fails that call too, and it reads nothing.
        static DENIED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// The program and pid tracing highwater itself, if any (`TracerPid`).
    fn own_tracer() -> Option<(String, i32)> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let pid: i32 = status
            .lines()
            .find_map(|l| l.strip_prefix("TracerPid:"))?
            .trim()
            .parse()
            .ok()?;
        if pid == 0 {
            return None;
        }
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|_| "another process".into());
        Some((comm, pid))
    }

    /// Notes a failed `process_vm_readv` that was a denial.
    fn note_denied() {
        let e = std::io::Error::last_os_error().raw_os_error();
        if matches!(e, Some(libc::EPERM | libc::EACCES)) {
            DENIED.with(|d| d.set(true));
        }
    }

    /// The path a `(dirfd, pathname)` pair names in the tracee.
    fn resolve(tid: i32, dirfd: i64, addr: u64) -> Option<PathBuf> {
        let raw = read_cstr(tid, addr)?;
        let rel = PathBuf::from(OsString::from_vec(raw));
        if rel.as_os_str().is_empty() {
            // AT_EMPTY_PATH: the dirfd itself.
            return proc_link(tid, &format!("fd/{dirfd}")).map(named);
        }
        if rel.is_absolute() {
            return Some(in_tracee_view(tid, clean_join(Path::new("/"), &rel)));
        }
        let base = named(if dirfd as i32 == libc::AT_FDCWD {
            proc_link(tid, "cwd")?
        } else {
            proc_link(tid, &format!("fd/{}", dirfd as i32))?
        });
        Some(in_tracee_view(tid, clean_join(&base, &rel)))
    }

    /// A path under /proc, /dev or /sys as the tracee's open would resolve
    /// it (issue 47): `/proc/self` is the tracee, not highwater, and its
    /// magic links (`/proc/self/cwd/lib.txt`, `/proc/self/root/...`,
    /// `/proc/self/fd/3`) and a `..` above those folders
    /// (`/dev/../home/u/p/lib.txt`) lead to ordinary files, which count as
    /// any other. Resolved while the tracee is stopped, so its /proc entry
    /// exists; what lies below the deepest existing folder is kept as
    /// named. Other paths are left as the tracee wrote them (lexically
    /// cleaned): resolving each would cost a walk per lookup.
    fn in_tracee_view(tid: i32, p: PathBuf) -> PathBuf {
        if !["/proc", "/dev", "/sys"].iter().any(|r| p.starts_with(r)) {
            return p;
        }
        let me = PathBuf::from(format!("/proc/{tid}"));
        let p = if let Ok(rest) = p.strip_prefix("/proc/self") {
            me.join(rest)
        } else if let Ok(rest) = p.strip_prefix("/proc/thread-self") {
            me.join(format!("task/{tid}")).join(rest)
        } else {
            p
        };
        canonical_existing(&p)
    }

    thread_local! {
        /// Real paths of folders the tree reached through a symbolic link,
        /// with the path it named (issue 47: `plugins -> /srv/plugins` in
        /// the project). The kernel gives a descriptor's and the working
        /// folder's path as the real one (`/proc/TID/fd/N`, `cwd`); what
        /// lies under them is recorded under the named path instead, so a
        /// listing of `plugins` or an absent `plugins/b.sh` stays the
        /// project's. Cleared at each command's start.
        static ALIASES: std::cell::RefCell<Vec<(PathBuf, PathBuf)>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }

    /// Notes that folder `real` was reached as `named`.
    fn alias(real: PathBuf, named: PathBuf) {
        if real == named {
            return;
        }
        ALIASES.with(|a| {
            let mut a = a.borrow_mut();
            if !a.iter().any(|(r, _)| *r == real) {
                a.push((real, named));
            }
        });
    }

    /// `p` (a real path from the kernel) under the name the tree reached
    /// it by, if it lies under a folder reached through a link.
    fn named(p: PathBuf) -> PathBuf {
        ALIASES.with(|a| {
            let a = a.borrow();
            for (real, named) in a.iter() {
                if let Ok(rest) = p.strip_prefix(real) {
                    return if rest.as_os_str().is_empty() {
                        named.clone()
                    } else {
                        named.join(rest)
                    };
                }
            }
            p
        })
    }

    /// The folder descriptor `fd` of `tid` lists, under the path the tree
    /// opened it by.
    fn listed_dir(tid: i32, fd: i32, seen: &Seen) -> Option<PathBuf> {
        use std::os::unix::fs::MetadataExt;
        let real = proc_link(tid, &format!("fd/{fd}"))?;
        let m = std::fs::metadata(format!("/proc/{tid}/fd/{fd}")).ok();
        match m.and_then(|m| seen.dirs.get(&(m.dev(), m.ino()))) {
            Some(opened_as) => {
                alias(real, opened_as.clone());
                Some(opened_as.clone())
            }
            None => Some(named(real)),
        }
    }

    /// The sorted names in folder `dir`, now.
    fn names_of(dir: &Path) -> Option<Vec<String>> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| highwater_core::spelling::spell(e.file_name().as_bytes()))
            .collect();
        names.sort_unstable();
        Some(names)
    }

    /// `p` with its deepest existing ancestor (or itself) canonicalized.
    fn canonical_existing(p: &Path) -> PathBuf {
        if let Ok(c) = std::fs::canonicalize(p) {
            return c;
        }
        match (p.parent(), p.file_name()) {
            (Some(parent), Some(name)) if parent != p => canonical_existing(parent).join(name),
            _ => p.to_path_buf(),
        }
    }

    /// How a lookup of `path` ends, seen by the tracer while the tracee is
    /// stopped at the call's entry: the same answer the kernel is about to
    /// give, so the call needs no second stop at its exit.
    enum Looked {
        Absent,
        /// A folder, with its identity (device, inode).
        Dir((u64, u64)),
        /// Anything else, with its identity (device, inode).
        Other((u64, u64)),
        Unknown,
    }

    fn look(path: &Path) -> Looked {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata(path) {
            Ok(m) if m.is_dir() => Looked::Dir((m.dev(), m.ino())),
            Ok(m) => Looked::Other((m.dev(), m.ino())),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
                Looked::Absent
            }
            Err(_) => Looked::Unknown,
        }
    }

    /// What most stops record, kept as lists while the tree runs and made
    /// sets once at its end: sorting a list by bytes costs less than a
    /// set's per-insert compare of path components.
    #[derive(Default)]
    struct Seen {
        /// With the identity (device, inode) the path led to then.
        read: Vec<(PathBuf, (u64, u64))>,
        absent: Vec<PathBuf>,
        /// Each folder looked up or opened, by identity, with the path the
        /// tree first named it by (see `ALIASES`).
        dirs: HashMap<(u64, u64), PathBuf>,
    }

    fn sorted_set(mut v: Vec<PathBuf>) -> BTreeSet<PathBuf> {
        v.sort_unstable_by(|a, b| a.as_os_str().as_bytes().cmp(b.as_os_str().as_bytes()));
        v.dedup();
        // Nearly in component order already: the set's own sort is a pass.
        v.into_iter().collect()
    }

    /// A stat of Python's announcement path (see `python.rs`): moves the
    /// task's `ImportListing` and ends the call's handling. `None` for any
    /// other call.
    fn announcement(tid: i32, nr: libc::c_long, a: &[u64; 6], t: &mut Tracee) -> Option<()> {
        let (dirfd, ptr) = match nr {
            libc::SYS_stat | libc::SYS_lstat => (libc::AT_FDCWD as i64, a[0]),
            libc::SYS_newfstatat | libc::SYS_statx => (a[0] as i64, a[1]),
            _ => return None,
        };
        // Absolute, as the hook names it: no folder to resolve against.
        if dirfd as i32 != libc::AT_FDCWD || python::hook_dir().is_none() {
            return None;
        }
        let raw = read_cstr(tid, ptr)?;
        match python::announced(&raw)? {
            python::Announced::Other => t.import_listing = ImportListing::None,
            python::Announced::Import(dir) => {
                use std::os::unix::fs::MetadataExt;
                t.import_listing = match std::fs::metadata(&dir) {
                    Ok(m) if m.is_dir() => ImportListing::Announced((m.dev(), m.ino())),
                    _ => ImportListing::None,
                };
            }
        }
        Some(())
    }

    /// At a getdents through `fd`: whether it reads the folder Python's
    /// import system announced (and moves the task's `ImportListing`).
    fn by_import_system(tid: i32, fd: i32, t: &mut Tracee) -> bool {
        use std::os::unix::fs::MetadataExt;
        let id = std::fs::metadata(format!("/proc/{tid}/fd/{fd}"))
            .ok()
            .map(|m| (m.dev(), m.ino()));
        let next = match (t.import_listing, id) {
            (ImportListing::Announced(want), Some(id)) if want == id => {
                ImportListing::Reading(id, fd)
            }
            (ImportListing::Reading(want, f), Some(id)) if want == id && f == fd => {
                ImportListing::Reading(id, fd)
            }
            _ => ImportListing::None,
        };
        t.import_listing = next;
        next != ImportListing::None
    }

    /// At the seccomp stop: records what the call `(nr, a)` names and how
    /// it will end.
    fn on_call(
        tid: i32,
        (nr, a): (libc::c_long, [u64; 6]),
        t: &mut Tracee,
        obs: &mut Observation,
        seen: &mut Seen,
        w: &mut Vec<PathBuf>,
    ) {
        let cwd = libc::AT_FDCWD as i64;
        let opened = |obs: &mut Observation,
                      seen: &mut Seen,
                      w: &mut Vec<PathBuf>,
                      il: &mut ImportListing,
                      path: Option<PathBuf>,
                      flags: u64| {
            let Some(path) = path else { return };
            let acc = flags & libc::O_ACCMODE as u64;
            if acc != libc::O_RDONLY as u64 || flags & (libc::O_CREAT | libc::O_TRUNC) as u64 != 0 {
                // An existing file kept (no O_TRUNC, no O_EXCL that would
                // fail) and opened readable can be read through the
                // descriptor: a read, and a write only with evidence (see
                // `finish`). Opened write-only (`touch`, `>>`), it cannot
                // be read through it: the command's own write, as before
                // issue 47 (a `touch` of an existing file writes only its
                // times, a call the filter lets run).
                let readable = acc != libc::O_WRONLY as u64;
                let keeps = readable && flags & (libc::O_TRUNC | libc::O_EXCL) as u64 == 0;
                if keeps && matches!(look(&path), Looked::Other(_)) {
                    if let Some(s) = crate::Stamp::of(&path) {
                        seen.read.push((path.clone(), (s.dev, s.ino)));
                        obs.opened_rw.entry(path).or_insert(s);
                        return;
                    }
                }
                w.push(path);
                return;
            }
            match look(&path) {
                Looked::Absent => {
                    seen.absent.push(path);
                }
                // A directory opened only to be listed or used as a dirfd is
                // not a read; a listing is recorded at getdents, under the
                // path it was opened by.
                Looked::Dir(id) => {
                    // Another folder opened ends an announced listing.
                    if *il != ImportListing::Announced(id) {
                        *il = ImportListing::None;
                    }
                    seen.dirs.entry(id).or_insert(path);
                }
                Looked::Unknown => {}
                Looked::Other(id) => {
                    seen.read.push((path, id));
                }
            }
        };
        // A file looked up without being opened still counts as read:
        // Python stats a module's source to validate its `__pycache__`
        // copy and then opens only the copy, so the source's content is
        // what the command depended on.
        let probed = |seen: &mut Seen, path: Option<PathBuf>| {
            if let Some(path) = path {
                match look(&path) {
                    Looked::Absent => {
                        seen.absent.push(path);
                    }
                    Looked::Other(id) => {
                        seen.read.push((path, id));
                    }
                    Looked::Dir(id) => {
                        seen.dirs.entry(id).or_insert(path);
                    }
                    Looked::Unknown => {}
                }
            }
        };
        if let Some(done) = announcement(tid, nr, &a, t) {
            return done;
        }
        match nr {
            libc::SYS_open => opened(
                obs,
                seen,
                w,
                &mut t.import_listing,
                resolve(tid, cwd, a[0]),
                a[1],
            ),
            libc::SYS_creat => w.extend(resolve(tid, cwd, a[0])),
            libc::SYS_openat => opened(
                obs,
                seen,
                w,
                &mut t.import_listing,
                resolve(tid, a[0] as i64, a[1]),
                a[2],
            ),
            // struct open_how { u64 flags; ... }
            libc::SYS_openat2 => opened(
                obs,
                seen,
                w,
                &mut t.import_listing,
                resolve(tid, a[0] as i64, a[1]),
                read_u64(tid, a[2]).unwrap_or(0),
            ),
            libc::SYS_execve | libc::SYS_execveat => {
                let path = if nr == libc::SYS_execve {
                    resolve(tid, cwd, a[0])
                } else {
                    resolve(tid, a[0] as i64, a[1])
                };
                if let Some(path) = path {
                    if let Looked::Absent = look(&path) {
                        seen.absent.push(path);
                        t.exec = None;
                    } else {
                        t.exec = Some(path);
                    }
                }
            }
            libc::SYS_stat | libc::SYS_lstat | libc::SYS_access => {
                probed(seen, resolve(tid, cwd, a[0]))
            }
            libc::SYS_chdir => {
                let path = resolve(tid, cwd, a[0]);
                // Later paths relative to the new folder come back from
                // the kernel under its real path: known by its name now.
                if let Some(p) = &path {
                    if let Ok(real) = std::fs::canonicalize(p) {
                        alias(real, p.clone());
                    }
                }
                probed(seen, path)
            }
            libc::SYS_readlink => {
                let path = resolve(tid, cwd, a[0]);
                obs.links.extend(path.clone());
                probed(seen, path)
            }
            libc::SYS_readlinkat => {
                let path = resolve(tid, a[0] as i64, a[1]);
                obs.links.extend(path.clone());
                probed(seen, path)
            }
            libc::SYS_newfstatat | libc::SYS_statx | libc::SYS_faccessat | libc::SYS_faccessat2 => {
                probed(seen, resolve(tid, a[0] as i64, a[1]))
            }
            libc::SYS_getdents | libc::SYS_getdents64 => {
                if let Some(dir) = listed_dir(tid, a[0] as i32, seen) {
                    if !obs.listed_names.contains_key(&dir) {
                        if let Some(names) = names_of(&dir) {
                            obs.listed_names.insert(dir.clone(), names);
                        }
                    }
                    if by_import_system(tid, a[0] as i32, t) {
                        obs.import_listed.insert(dir);
                    } else {
                        obs.listed.insert(dir);
                    }
                }
            }
            // Changes to the tree: told at the call's exit, if it succeeded.
            libc::SYS_unlink | libc::SYS_rmdir | libc::SYS_mkdir | libc::SYS_truncate => {
                w.extend(resolve(tid, cwd, a[0]))
            }
            libc::SYS_unlinkat | libc::SYS_mkdirat => w.extend(resolve(tid, a[0] as i64, a[1])),
            libc::SYS_rename | libc::SYS_link => {
                w.extend(resolve(tid, cwd, a[0]));
                w.extend(resolve(tid, cwd, a[1]));
            }
            libc::SYS_symlink => w.extend(resolve(tid, cwd, a[1])),
            libc::SYS_symlinkat => w.extend(resolve(tid, a[1] as i64, a[2])),
            libc::SYS_renameat | libc::SYS_renameat2 | libc::SYS_linkat => {
                w.extend(resolve(tid, a[0] as i64, a[1]));
                w.extend(resolve(tid, a[2] as i64, a[3]));
            }
            n => {
                if let Some(&(_, fd_arg)) = WRITES.iter().find(|(c, _)| *c == n) {
                    w.extend(opened_rw_at(tid, a[fd_arg as usize], obs));
                }
            }
        }
    }

    /// The file opened read-write (kept, not truncated) that descriptor
    /// `fd` of `tid` refers to, if any: a write through it is the
    /// command's evidence that it changed the file itself.
    fn opened_rw_at(tid: i32, fd: u64, obs: &Observation) -> Option<PathBuf> {
        if obs.opened_rw.is_empty() {
            return None;
        }
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(format!("/proc/{tid}/fd/{}", fd as i32)).ok()?;
        obs.opened_rw
            .iter()
            .find(|(_, s)| s.ino == m.ino() && s.dev == m.dev())
            .map(|(p, _)| p.clone())
    }

    fn record_exec(obs: &mut Observation, path: PathBuf) {
        let mut p = path;
        for _ in 0..SHEBANG_MAX_DEPTH {
            let next = interpreter(&p);
            obs.executed.insert(p);
            match next {
                Some(i) => p = i,
                None => return,
            }
        }
    }

    /// The message of the ptrace event `tid` is stopped at (a new task's
    /// pid at a fork or clone, the former tid at an exec).
    fn event_msg(tid: i32) -> libc::c_ulong {
        let mut m: libc::c_ulong = 0;
        // SAFETY: GETEVENTMSG writes one c_ulong.
        unsafe {
            libc::ptrace(libc::PTRACE_GETEVENTMSG, tid, 0, &mut m);
        }
        m
    }

    fn resume(req: libc::c_uint, tid: i32, sig: i32) {
        // SAFETY: plain ptrace request; a tracee that vanished gives ESRCH,
        // which its exit status will report.
        unsafe {
            libc::ptrace(req, tid, 0, sig as libc::c_long);
        }
    }

    fn trace_loop(
        main: i32,
        program: &str,
        on_write: Option<OnWrite>,
        mut pin: crate::pin::Pin,
    ) -> Result<Traced, ObserveError> {
        let mut obs = Observation::default();
        let mut seen = Seen::default();
        let mut fresh = Vec::new();
        let mut tracees: HashMap<i32, Tracee> = HashMap::new();
        tracees.insert(main, Tracee::default());
        let mut status_main: Option<ExitStatus> = None;
        // Until the command's own exec has succeeded, its exit means that
        // `spawn` failed (program not found, a hook failed), and `spawn`
        // reaps it itself: it must not be reaped here, so peek first.
        let mut main_execed = false;
        // A refused call was made: the tree is being killed.
        let mut refused: Option<u32> = None;
        let mut turns = crate::pin::Turns::default();
        ALIASES.with(|a| a.borrow_mut().clear());
        loop {
            let mut status = 0;
            if !main_execed {
                // SAFETY: siginfo_t is plain data; waitid fills it.
                let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
                let r = unsafe {
                    libc::waitid(
                        libc::P_PID,
                        main as libc::id_t,
                        &mut info,
                        libc::WEXITED | libc::WSTOPPED | libc::WNOWAIT | libc::__WALL,
                    )
                };
                if r != 0 {
                    let e = std::io::Error::last_os_error();
                    if e.raw_os_error() == Some(libc::EINTR) {
                        continue;
                    }
                    return Err(ObserveError::Trace {
                        program: program.into(),
                        message: format!("waitid: {e}"),
                    });
                }
                if info.si_code == libc::CLD_EXITED
                    || info.si_code == libc::CLD_KILLED
                    || info.si_code == libc::CLD_DUMPED
                {
                    return Err(ObserveError::Trace {
                        program: program.into(),
                        message: "the command did not start".into(),
                    });
                }
            }
            // __WNOTHREAD: only our own tracees, never another thread's
            // children (other items run concurrently in this process).
            // SAFETY: waitpid writes status.
            let who = if main_execed { -1 } else { main };
            let tid = unsafe { libc::waitpid(who, &mut status, libc::__WALL | libc::__WNOTHREAD) };
            if tid < 0 {
                let e = std::io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::ECHILD) => break,
                    _ => {
                        return Err(ObserveError::Trace {
                            program: program.into(),
                            message: format!("waitpid: {e}"),
                        })
                    }
                }
            }
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                tracees.remove(&tid);
                if tid == main {
                    status_main = Some(ExitStatus::from_raw(status));
                }
                continue;
            }
            if !libc::WIFSTOPPED(status) {
                continue;
            }
            if refused.is_some() {
                // Any stop of a tree being killed (a child forked just
                // before): killed too, never resumed into more work.
                // SAFETY: kill only sends a signal to our own tracee.
                unsafe { libc::kill(tid, libc::SIGKILL) };
                continue;
            }
            let t = tracees.entry(tid).or_default();
            let sig = libc::WSTOPSIG(status);
            let event = (status >> 16) & 0xffff;
            if sig == libc::SIGTRAP | 0x80 {
                // The exit stop of a call that changes the tree (a seccomp
                // stop resumed with PTRACE_SYSCALL stops next at the exit).
                // Said here, while the tracee is still stopped: a
                // concurrent item that lists the folder later already
                // knows the name is the run's own.
                t.waiting = false;
                let pending = std::mem::take(&mut t.pending);
                let ok = regs(tid).is_some_and(|r| (r.rax as i64) >= 0);
                if ok {
                    for p in pending {
                        if let Some(f) = &on_write {
                            f(&p);
                        }
                        obs.written.insert(p);
                    }
                }
                resume(libc::PTRACE_CONT, tid, 0);
                continue;
            }
            if sig == libc::SIGTRAP && event != 0 {
                match event {
                    libc::PTRACE_EVENT_SECCOMP => {
                        obs.stops += 1;
                        let call = seccomp_call(tid);
                        let data = call.map_or(0, |c| c.2);
                        if data != 0 {
                            // Refused: the whole tree goes, this call
                            // never runs (a SIGKILL ends a stopped tracee).
                            refused = Some(data);
                            for &other in tracees.keys() {
                                // SAFETY: signals only our own tracees.
                                unsafe { libc::kill(other, libc::SIGKILL) };
                            }
                            continue;
                        }
                        // None: the tracee is gone (killed); its exit
                        // reports next.
                        DENIED.with(|d| d.set(false));
                        let nr = call.map(|(nr, a, _)| {
                            on_call(tid, (nr, a), t, &mut obs, &mut seen, &mut fresh);
                            nr
                        });
                        if DENIED.with(|d| d.replace(false)) {
                            // What the call names could not be read: it
                            // is not let through unrecorded.
                            refused = Some(REFUSE_UNREADABLE);
                            for &other in tracees.keys() {
                                // SAFETY: signals only our own tracees.
                                unsafe { libc::kill(other, libc::SIGKILL) };
                            }
                            continue;
                        }
                        let waits = matches!(nr, Some(libc::SYS_wait4 | libc::SYS_waitid));
                        let req = if waits {
                            // Waiting until the call's exit stop.
                            t.waiting = true;
                            libc::PTRACE_SYSCALL
                        } else if fresh.is_empty() {
                            libc::PTRACE_CONT
                        } else {
                            // A change to the tree counts only if it
                            // succeeds: stop again at the call's exit.
                            t.pending.append(&mut fresh);
                            libc::PTRACE_SYSCALL
                        };
                        // Before the call runs: an affinity call sees
                        // (or sets) the mask the tree would have unobserved.
                        let affinity = matches!(
                            nr,
                            Some(libc::SYS_sched_getaffinity | libc::SYS_sched_setaffinity)
                        );
                        if pin.pinned()
                            && (pin.expired()
                                || affinity
                                || turns.parallel(running(&tracees), waits))
                        {
                            pin.release(tracees.keys().copied());
                        }
                        resume(req, tid, 0);
                    }
                    libc::PTRACE_EVENT_EXEC => {
                        if let Some(path) = t.exec.take() {
                            record_exec(&mut obs, path);
                        }
                        // A non-leader thread that exec'd took over the
                        // leader's pid; its old tid will not report again.
                        let former = event_msg(tid);
                        if former as i32 != tid {
                            tracees.remove(&(former as i32));
                        }
                        if tid == main {
                            main_execed = true;
                        }
                        resume(libc::PTRACE_CONT, tid, 0);
                    }
                    libc::PTRACE_EVENT_FORK
                    | libc::PTRACE_EVENT_VFORK
                    | libc::PTRACE_EVENT_CLONE => {
                        // Fork, vfork, clone: the new tracee reports itself.
                        // A thread, or a third task running beside two,
                        // means parallel work: the tree spreads as it
                        // would unobserved, the new one unpinned before it
                        // runs. A process forked by the only running task
                        // (a shell about to wait for it) keeps the pin
                        // while they take turns (see `pin`).
                        let thread = event == libc::PTRACE_EVENT_CLONE;
                        let new = event_msg(tid) as i32;
                        // The new task's own first stop may have come
                        // first: it is not one of those running before.
                        let before = running(&tracees)
                            - usize::from(tracees.get(&new).is_some_and(|t| !t.waiting));
                        if pin.pinned() && (thread || turns.forked(before)) {
                            pin.release(tracees.keys().copied().chain([new]));
                        }
                        // Counted from now, not from its first stop: the
                        // parent may fork again before that reports.
                        tracees.entry(new).or_default();
                        resume(libc::PTRACE_CONT, tid, 0);
                    }
                    _ => {
                        // A new tracee's first stop, or a group stop. Job
                        // control inside an observed command is not
                        // supported: resume.
                        resume(libc::PTRACE_CONT, tid, 0);
                    }
                }
                continue;
            }
            if event == libc::PTRACE_EVENT_STOP {
                // A new tracee's first stop, or a group stop. Job control
                // inside an observed command is not supported: resume.
                resume(libc::PTRACE_CONT, tid, 0);
                continue;
            }
            // A signal for the tracee: deliver it.
            resume(libc::PTRACE_CONT, tid, sig);
        }
        if let Some(data) = refused {
            return Err(ObserveError::Refused {
                program: program.into(),
                what: refused_what(data),
            });
        }
        let status = status_main.ok_or_else(|| ObserveError::Trace {
            program: program.into(),
            message: "the command's exit status was lost".into(),
        })?;
        for (p, id) in &seen.read {
            let first = obs.read_ids.entry(p.clone()).or_insert(*id);
            if first != id {
                *first = READ_IDS_DIFFERED;
            }
        }
        obs.read = sorted_set(seen.read.into_iter().map(|(p, _)| p).collect());
        obs.absent = sorted_set(seen.absent);
        Ok(Traced { status, obs })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the filter as the kernel would on one call: its action, and
    /// how many instructions it took.
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    fn run_filter(f: &[libc::sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> (u32, usize) {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_ne_bytes());
        data[4..8].copy_from_slice(&arch.to_ne_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
        }
        let (mut pc, mut acc, mut steps) = (0usize, 0u32, 0);
        loop {
            let x = f[pc];
            steps += 1;
            let code = x.code as u32;
            let jump = |taken: bool| pc + 1 + if taken { x.jt } else { x.jf } as usize;
            pc = match code {
                c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => {
                    let k = x.k as usize;
                    acc = u32::from_ne_bytes(data[k..k + 4].try_into().unwrap());
                    pc + 1
                }
                c if c == libc::BPF_RET | libc::BPF_K => return (x.k, steps),
                c if c == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K => jump(acc == x.k),
                c if c == libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K => jump(acc >= x.k),
                c if c == libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K => jump(acc & x.k != 0),
                c => panic!("unexpected instruction {c:#x} at {pc}"),
            };
        }
    }

    /// Every syscall number, native, x32 and ia32, with and without
    /// AT_EMPTY_PATH: the filter's action is the documented one, and no
    /// call walks a long path (the kernel runs the filter per number when
    /// it installs it).
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    #[test]
    fn the_filter_stops_exactly_the_listed_calls_in_a_few_steps() {
        let f = linux::filter();
        let trace = libc::SECCOMP_RET_TRACE;
        let (x86_64, i386) = (0xc000_003e_u32, 0x4000_0003_u32);
        let mut longest = 0;
        for nr in 0..600u32 {
            for empty in [false, true] {
                let flags = if empty { libc::AT_EMPTY_PATH as u64 } else { 0 };
                let fstat_like =
                    empty && (nr == libc::SYS_newfstatat as u32 || nr == libc::SYS_statx as u32);
                let refused = linux::REFUSED
                    .iter()
                    .find(|(n, _)| *n as u32 == nr)
                    .map(|(_, d)| *d);
                let want = if let Some(d) = refused {
                    trace | d
                } else if linux::REFUSED_WITH_NEWNS.contains(&(nr as libc::c_long)) {
                    // Without CLONE_NEWNS in its flags (args[0] = 0 here).
                    libc::SECCOMP_RET_ALLOW
                } else if linux::ENOSYS_CALLS.contains(&(nr as libc::c_long)) {
                    libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32
                } else if linux::WRITES
                    .iter()
                    .any(|&(n, fd_arg)| n as u32 == nr && fd_arg == 2 && empty)
                {
                    // Its descriptor argument holds the flags here (>= 3).
                    trace
                } else if linux::TRACED.contains(&(nr as libc::c_long)) && !fstat_like {
                    trace
                } else {
                    libc::SECCOMP_RET_ALLOW
                };
                // newfstatat's flags are its 4th argument, statx's its 3rd.
                let args = [0, 0, flags, flags, 0, 0];
                let (got, steps) = run_filter(&f, x86_64, nr, args);
                assert_eq!(got, want, "syscall {nr}, AT_EMPTY_PATH {empty}");
                longest = longest.max(steps);
                assert_eq!(run_filter(&f, x86_64, nr | 0x4000_0000, args).0, trace | 2);
                assert_eq!(run_filter(&f, i386, nr, args).0, trace | 1);
            }
        }
        assert!(longest <= 16, "the longest path is {longest} instructions");
        // Issue 47: unshare and clone into a new mount namespace are
        // refused; with other flags they run unstopped.
        for &nr in linux::REFUSED_WITH_NEWNS {
            let newns = [
                libc::CLONE_NEWNS as u64 | libc::CLONE_NEWUSER as u64,
                0,
                0,
                0,
                0,
                0,
            ];
            assert_eq!(run_filter(&f, x86_64, nr as u32, newns).0, trace | 8);
            let thread = [libc::CLONE_VM as u64 | libc::CLONE_FS as u64, 0, 0, 0, 0, 0];
            assert_eq!(
                run_filter(&f, x86_64, nr as u32, thread).0,
                libc::SECCOMP_RET_ALLOW
            );
        }
    }

    /// Issue 47: every system call of the kernel's x86_64 table is
    /// stopped, refused, answered ENOSYS, or let run for a stated reason
    /// (`syscalls_x86_64.tbl` says which and why): the filter does exactly
    /// what the table says, a call the table says reaches a file by name is
    /// never let through, and no number of the table is unclassed.
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    #[test]
    fn every_system_call_is_stopped_decided_or_refused() {
        let f = linux::filter();
        let trace = libc::SECCOMP_RET_TRACE;
        let x86_64 = 0xc000_003e_u32;
        let classes = [
            "traced",
            "refused",
            "refused-newns",
            "enosys",
            "write",
            "fd",
            "meta",
            "mount",
            "ipc",
            "rule",
            "none",
        ];
        let mut seen = std::collections::BTreeSet::new();
        let table = include_str!("syscalls_x86_64.tbl");
        for line in table
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let cols: Vec<&str> = line.split('\t').collect();
            let [nr, name, class] = cols[..] else {
                panic!("a row is number, name, class: {line:?}");
            };
            let nr: u32 = nr.parse().unwrap();
            assert!(classes.contains(&class), "{name}: unknown class {class}");
            assert!(seen.insert(nr), "{name}: number {nr} twice");
            let (got, _) = run_filter(&f, x86_64, nr, [0; 6]);
            let with_newns = [libc::CLONE_NEWNS as u64, 0, 0, 0, 0, 0];
            let (got_newns, _) = run_filter(&f, x86_64, nr, with_newns);
            match class {
                "traced" => assert_eq!(got, trace, "{name} is stopped"),
                "refused" => assert!(
                    got & libc::SECCOMP_RET_ACTION_FULL == trace && got & 0xffff != 0,
                    "{name} is refused: {got:#x}"
                ),
                "refused-newns" => {
                    assert_eq!(got, libc::SECCOMP_RET_ALLOW, "{name} without CLONE_NEWNS");
                    assert_eq!(got_newns, trace | 8, "{name} with CLONE_NEWNS");
                }
                "enosys" => assert_eq!(got, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
                "write" => {
                    assert_eq!(got, libc::SECCOMP_RET_ALLOW, "{name} to stdin runs");
                    let fd_arg = linux::WRITES.iter().find(|w| w.0 as u32 == nr).unwrap().1;
                    let mut args = [0u64; 6];
                    args[fd_arg as usize] = 5;
                    if name.starts_with("dup") {
                        assert_eq!(run_filter(&f, x86_64, nr, args).0, libc::SECCOMP_RET_ALLOW);
                        args[1] = 1;
                        assert_eq!(run_filter(&f, x86_64, nr, args).0, trace, "{name} onto 1");
                        args[1] = 2;
                    }
                    if name == "mmap" {
                        args[2] = libc::PROT_READ as u64;
                        args[3] = libc::MAP_SHARED as u64;
                        assert_eq!(run_filter(&f, x86_64, nr, args).0, libc::SECCOMP_RET_ALLOW);
                        args[2] |= libc::PROT_WRITE as u64;
                        args[3] |= libc::MAP_ANONYMOUS as u64;
                        assert_eq!(run_filter(&f, x86_64, nr, args).0, libc::SECCOMP_RET_ALLOW);
                        args[3] = libc::MAP_SHARED as u64;
                    }
                    assert_eq!(run_filter(&f, x86_64, nr, args).0, trace, "{name} to fd 5");
                }
                _ => assert_eq!(got, libc::SECCOMP_RET_ALLOW, "{name} ({class}) runs"),
            }
        }
        // Every number below the table's highest that the kernel has.
        let highest = *seen.iter().max().unwrap();
        let gaps: Vec<u32> = (0..=highest).filter(|n| !seen.contains(n)).collect();
        assert_eq!(
            gaps,
            (337..424).collect::<Vec<u32>>(),
            "only the unused range"
        );
        // Nothing traced or refused that the table does not know.
        for nr in 0..1024u32 {
            if !seen.contains(&nr) {
                let got = run_filter(&f, x86_64, nr, [0; 6]).0;
                assert!(
                    nr & 0x4000_0000 != 0 || got == libc::SECCOMP_RET_ALLOW,
                    "syscall {nr} is not in the table but the filter acts on it"
                );
            }
        }
    }

    #[test]
    fn clean_join_drops_dots_and_keeps_dotdot() {
        let cases = [
            ("/a/b", "c", "/a/b/c"),
            ("/a/b", "./c//d/.", "/a/b/c/d"),
            ("/a/b", "../c", "/a/b/../c"),
            ("/a/b", "/x/./y", "/x/y"),
            ("/a/b", "c/", "/a/b/c"),
            ("/", "x", "/x"),
            ("/a", ".", "/a"),
            ("/a/b", "/x//y", "/x/y"),
            ("/a/b", "c/d.e/..f", "/a/b/c/d.e/..f"),
        ];
        for (base, rel, want) in cases {
            assert_eq!(
                clean_join(Path::new(base), Path::new(rel)),
                PathBuf::from(want),
                "{base} + {rel}"
            );
        }
    }

    #[test]
    fn a_path_called_clean_is_what_its_components_give_back() {
        // Every string of up to 6 bytes over `/`, `.` and `a`.
        let mut all: Vec<Vec<u8>> = vec![vec![]];
        for len in 1..=6 {
            let mut next = Vec::new();
            for p in all.iter().filter(|p| p.len() == len - 1) {
                for b in [b'/', b'.', b'a'] {
                    let mut q = p.clone();
                    q.push(b);
                    next.push(q);
                }
            }
            all.extend(next);
        }
        for p in &all {
            let path = Path::new(std::ffi::OsStr::from_bytes(p));
            let walked: PathBuf = path
                .components()
                .filter(|c| !matches!(c, Component::CurDir))
                .collect();
            if super::is_clean(p) {
                assert_eq!(walked.as_os_str().as_bytes(), &p[..], "{path:?}");
            } else if !p.is_empty() {
                assert_ne!(walked.as_os_str().as_bytes(), &p[..], "{path:?}");
            }
        }
    }

    #[test]
    fn shebang_lines() {
        let t = tempfile::tempdir().unwrap();
        let cases: [(&str, Option<&str>); 5] = [
            ("#!/bin/sh\necho\n", Some("/bin/sh")),
            ("#! /usr/bin/env python3\n", Some("/usr/bin/env")),
            ("#!/usr/bin/python3 -u -B\n", Some("/usr/bin/python3")),
            ("#!relative\n", None),
            ("\x7fELF....", None),
        ];
        for (i, (text, want)) in cases.iter().enumerate() {
            let p = t.path().join(format!("s{i}"));
            std::fs::write(&p, text).unwrap();
            assert_eq!(shebang_interpreter(&p), want.map(PathBuf::from), "{text:?}");
        }
    }

    #[test]
    fn finish_drops_what_the_tree_wrote() {
        let p = |s: &str| PathBuf::from(s);
        let mut o = Observation {
            read: [p("/a"), p("/tmp/t")].into(),
            absent: [p("/tmp/t"), p("/gone"), p("/a")].into(),
            written: [p("/tmp/t")].into(),
            ..Observation::default()
        };
        o.finish();
        assert_eq!(o.read, [p("/a")].into());
        assert_eq!(o.absent, [p("/gone")].into());
    }
}
