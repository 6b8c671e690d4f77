//! Starts every command, observed or not, with `clone(CLONE_VM |
//! CLONE_VFORK)`, the way `posix_spawn` does, instead of std's `fork`.
//!
//! Why: an observed child must wait between its fork and its `execve` for
//! the tracer to attach (see `linux::output`). After a `fork`, every page
//! of highwater is shared copy-on-write for that whole wait, and each write
//! any of highwater's threads makes to one of them (the tracer thread's
//! own stack, the other workers, the committer) is a page fault that
//! flushes the TLB of every CPU by IPI. Measured in a `perf record` of
//! 5,000 observed `cp` items: that flush was the largest single cost of
//! observing, above the tracer's stops. A child sharing the address space
//! until its `execve` has no copy-on-write at all.
//!
//! The price: the child runs on our memory, so between `clone` and `execve`
//! it calls only raw system calls on data prepared before (no allocation,
//! no lock, no Rust runtime), and the calling thread is suspended by the
//! kernel until the child has exec'd or exited. The tracer is another
//! thread, so it can still attach.
//!
//! From a `Command` it honours the program (looked up on `PATH` as
//! `execvp` does, `/bin/sh` for a file that is not an executable format),
//! the arguments, the current folder and the environment changes. stdin is
//! `/dev/null`, stdout and stderr are pipes, the child dies with the
//! calling thread (`PR_SET_PDEATHSIG`). `Command::env_clear`, its stdio and
//! its `pre_exec` hooks cannot be read back from a `Command` and are not
//! honoured.

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::process::Command;

/// The child's stack: it makes a handful of system calls and no others.
const CHILD_STACK_BYTES: usize = 64 * 1024;

/// Everything the child needs, prepared before `clone`: it must not
/// allocate.
struct Prepared {
    /// Paths to try in order, as `execvp` would.
    candidates: Vec<CString>,
    argv: Vec<CString>,
    envp: Vec<CString>,
    cwd: Option<CString>,
}

/// What the child reads (fds, pointers) and writes (`errno`).
#[repr(C)]
struct ChildArgs {
    candidates: *const *const libc::c_char,
    n_candidates: usize,
    argv: *const *const libc::c_char,
    /// `/bin/sh`, then a slot for the candidate, then argv[1..], NULL.
    sh_argv: *mut *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    stdin: RawFd,
    stdout: RawFd,
    stderr: RawFd,
    parent: libc::pid_t,
    /// Run between the stdio set-up and the `execve` (the tracer's
    /// handshake and the seccomp filter); a nonzero return is an errno.
    hook: *mut libc::c_void,
    hook_fn: unsafe fn(*mut libc::c_void) -> libc::c_int,
    /// Set by the child when it could not exec.
    errno: libc::c_int,
}

fn cstring(s: &OsStr) -> std::io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} contains a NUL byte", s.to_string_lossy()),
        )
    })
}

fn prepare(cmd: &Command) -> std::io::Result<Prepared> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    for (k, v) in cmd.get_envs() {
        env.retain(|(ek, _)| ek != k);
        if let Some(v) = v {
            env.push((k.to_os_string(), v.to_os_string()));
        }
    }
    let program = cmd.get_program();
    let candidates = if program.as_bytes().contains(&b'/') {
        vec![cstring(program)?]
    } else {
        let path = env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| OsString::from("/usr/local/bin:/usr/bin:/bin"));
        let mut c = Vec::new();
        for dir in path.as_bytes().split(|&b| b == b':') {
            let mut p = if dir.is_empty() {
                b".".to_vec()
            } else {
                dir.to_vec()
            };
            p.push(b'/');
            p.extend_from_slice(program.as_bytes());
            c.push(cstring(&OsString::from_vec(p))?);
        }
        c
    };
    let mut argv = vec![cstring(program)?];
    for a in cmd.get_args() {
        argv.push(cstring(a)?);
    }
    let mut envp = Vec::with_capacity(env.len());
    for (k, v) in env {
        let mut kv = k.into_vec();
        kv.push(b'=');
        kv.extend_from_slice(v.as_bytes());
        envp.push(cstring(&OsString::from_vec(kv))?);
    }
    let cwd = cmd
        .get_current_dir()
        .map(|d| cstring(d.as_os_str()))
        .transpose()?;
    Ok(Prepared {
        candidates,
        argv,
        envp,
        cwd,
    })
}

/// A close-on-exec pipe whose two ends are above the stdio descriptors.
///
/// Why above: if highwater itself was started with fd 0, 1 or 2 closed,
/// `pipe2` hands those numbers out, and the child's dup2 of its stdin,
/// stdout and stderr (in that order) would overwrite a pipe end before it
/// was installed. std's `Command` guards against the same.
pub(crate) fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded; both are fresh descriptors we own.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((above_stdio(r)?, above_stdio(w)?))
}

/// `fd` itself if it is above 2, else a close-on-exec copy that is (the
/// low one is closed).
pub(crate) fn above_stdio(fd: OwnedFd) -> std::io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own returns a new one.
    let high = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if high < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fcntl succeeded; the copy is ours alone.
    Ok(unsafe { OwnedFd::from_raw_fd(high) })
}

/// Makes `from` the child's descriptor `to`, without close-on-exec.
///
/// # Safety
/// Called only in the child, between clone and exec.
unsafe fn install(from: RawFd, to: RawFd) -> bool {
    if from == to {
        libc::fcntl(to, libc::F_SETFD, 0) == 0
    } else {
        libc::dup2(from, to) == to
    }
}

fn errno() -> libc::c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// The child, between clone and exec. Only raw system calls on `ChildArgs`.
extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the ChildArgs the suspended parent keeps alive; every
    // pointer in it was prepared before clone and is not touched by anyone
    // until the child has exec'd or exited (CLONE_VFORK).
    unsafe {
        let a = &mut *(arg as *mut ChildArgs);
        let fail = |a: &mut ChildArgs, e: libc::c_int| -> ! {
            std::ptr::write_volatile(&mut a.errno, e);
            libc::_exit(127)
        };
        // A signal handler of highwater's must never run here, on its
        // memory: every caught signal goes back to its default, and only
        // then is the mask the parent blocked around clone lifted.
        for sig in 1..libc::SIGRTMAX() {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction != libc::SIG_DFL
                && (old.sa_sigaction != libc::SIG_IGN || sig == libc::SIGPIPE)
            {
                // SIGPIPE too: the Rust runtime ignores it, a command
                // expects its default (std's spawn does the same).
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            fail(a, errno());
        }
        // The parent thread may have gone before prctl took effect.
        if libc::getppid() != a.parent {
            libc::_exit(1);
        }
        if !install(a.stdin, 0) || !install(a.stdout, 1) || !install(a.stderr, 2) {
            fail(a, errno());
        }
        if !a.cwd.is_null() && libc::chdir(a.cwd) != 0 {
            fail(a, errno());
        }
        let e = (a.hook_fn)(a.hook);
        if e != 0 {
            fail(a, e);
        }
        let mut denied = false;
        let mut last = libc::ENOENT;
        for i in 0..a.n_candidates {
            let path = *a.candidates.add(i);
            libc::execve(path, a.argv, a.envp);
            let e = errno();
            match e {
                libc::ENOEXEC => {
                    // Not an executable format: run by the shell, as
                    // execvp does.
                    *a.sh_argv.add(1) = path;
                    libc::execve(*a.sh_argv, a.sh_argv, a.envp);
                    fail(a, errno());
                }
                libc::EACCES => denied = true,
                libc::ENOENT | libc::ENOTDIR => {}
                _ => fail(a, e),
            }
            last = e;
        }
        fail(a, if denied { libc::EACCES } else { last })
    }
}

/// A started child: its pid, and the parent's ends of its stdout and stderr.
pub(crate) struct Started {
    pub pid: libc::pid_t,
    pub stdout: std::fs::File,
    pub stderr: std::fs::File,
}

/// Starts `cmd` (see the module doc for what of it is honoured). `hook`
/// runs in the child just before its `execve`, with the same rules as the
/// child itself: raw system calls only; it returns 0 or an errno.
///
/// On an `Err` after the clone, the child has exited and is not reaped
/// here: `reap` it once nobody else waits for it.
pub(crate) fn spawn<H>(
    cmd: &Command,
    hook: &mut H,
) -> Result<Started, (std::io::Error, Option<libc::pid_t>)>
where
    H: FnMut() -> libc::c_int,
{
    unsafe fn call<H: FnMut() -> libc::c_int>(h: *mut libc::c_void) -> libc::c_int {
        (*(h as *mut H))()
    }
    let p = prepare(cmd).map_err(|e| (e, None))?;
    let (out_r, out_w) = pipe().map_err(|e| (e, None))?;
    let (err_r, err_w) = pipe().map_err(|e| (e, None))?;
    let devnull = std::fs::File::open("/dev/null")
        .map(OwnedFd::from)
        .and_then(above_stdio)
        .map_err(|e| (e, None))?;
    let ptrs = |v: &[CString]| -> Vec<*const libc::c_char> {
        v.iter()
            .map(|c| c.as_ptr())
            .chain([std::ptr::null()])
            .collect()
    };
    let candidates = ptrs(&p.candidates);
    let argv = ptrs(&p.argv);
    let envp = ptrs(&p.envp);
    let sh = c"/bin/sh";
    let mut sh_argv: Vec<*const libc::c_char> = [sh.as_ptr(), std::ptr::null()]
        .into_iter()
        .chain(argv[1..].iter().copied())
        .collect();
    let mut args = ChildArgs {
        candidates: candidates.as_ptr(),
        n_candidates: p.candidates.len(),
        argv: argv.as_ptr(),
        sh_argv: sh_argv.as_mut_ptr(),
        envp: envp.as_ptr(),
        cwd: p.cwd.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
        stdin: devnull.as_raw_fd(),
        stdout: out_w.as_raw_fd(),
        stderr: err_w.as_raw_fd(),
        // SAFETY: getpid has no preconditions.
        parent: unsafe { libc::getpid() },
        hook: (hook as *mut H).cast(),
        hook_fn: call::<H>,
        errno: 0,
    };
    let mut stack = vec![0u64; CHILD_STACK_BYTES / 8];
    // The stack grows down; its top, 16-aligned.
    let top = {
        let end = stack.as_mut_ptr_range().end as usize;
        (end & !15) as *mut libc::c_void
    };
    // SAFETY: all signals blocked around clone so that none is handled in
    // the child before it reset the handlers (it unblocks them itself);
    // the child only reads `args` and the buffers it points to, all alive
    // until clone returns, which CLONE_VFORK makes wait for its exec or
    // exit.
    let pid = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            child,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&mut args as *mut ChildArgs).cast(),
        );
        let e = std::io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            return Err((e, None));
        }
        pid
    };
    drop(stack);
    // SAFETY: the child has exec'd or exited; nobody writes `args` now.
    let child_errno = unsafe { std::ptr::read_volatile(&args.errno) };
    if child_errno != 0 {
        return Err((std::io::Error::from_raw_os_error(child_errno), Some(pid)));
    }
    Ok(Started {
        pid,
        stdout: std::fs::File::from(out_r),
        stderr: std::fs::File::from(err_r),
    })
}

/// Waits for a child of ours to end and returns its wait status (an
/// unobserved one, or an observed one that exited without exec'ing, which
/// its tracer let go of).
pub(crate) fn reap(pid: libc::pid_t) -> std::io::Result<libc::c_int> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid on our own child.
        if unsafe { libc::waitpid(pid, &mut status, libc::__WALL) } == pid {
            return Ok(status);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
