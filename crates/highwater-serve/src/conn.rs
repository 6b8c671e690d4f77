//! The connections `serve` accepts, each with a deadline, and a limit on
//! how many are open (issue 20).
//!
//! hyper's own `header_read_timeout` starts when the server begins to wait
//! for a request, so it cannot tell an idle keep-alive connection from a
//! half-sent request. Each connection here is in one of three phases, and
//! its deadline follows from the phase:
//! - idle (nothing of a next request read yet; the response before it
//!   counts as activity while it is being written): closed after
//!   `idle_timeout_s` without a byte either way;
//! - head (a request's first bytes are in, its head is not complete):
//!   closed `header_read_timeout_s` after its first byte;
//! - handling (the router has the request): no deadline, as the handlers
//!   read only local files, each bounded.
//!
//! A pipelined request whose bytes arrive while the one before it is
//! handled is timed as idle, not as a head: still bounded.
//!
//! A phase change wakes nobody (a wake per request was a cost of every
//! tile): the connection's task looks at its deadline at most
//! `header_read_timeout_s` apart, which is soon enough for the only
//! change that brings a deadline closer (idle to head: the head's
//! deadline is `header_read_timeout_s` after its first byte, so after the
//! next look).
//!
//! The limit keeps descriptors free for the files the handlers open: it is
//! derived from `RLIMIT_NOFILE`. At the limit, the connection that has
//! waited longest without a complete request is closed to make room (a
//! normal request answers even while hostile clients hold every other
//! slot), and a line is logged, at most once a minute.

use std::collections::HashMap;
use std::io::Write;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

/// Descriptors kept for everything but connections and handler reads:
/// stdio, the listener, the event loop's epoll and eventfd, the signal
/// pipe, and the background refresh (its SQLite files and one socket).
pub const FDS_RESERVED: u64 = 64;
/// Handler reads (SQLite, files) running at once; more wait their turn.
pub const BLOCKING_READS_MAX: usize = 8;
/// Descriptors one handler read may hold: a few SQLite databases (a state
/// store and a source), each with its -wal and -shm.
pub const FDS_PER_READ: u64 = 8;
/// Below this many connections the server is not worth starting.
pub const CONNECTIONS_MIN: u64 = 16;
/// The limit when RLIMIT_NOFILE is unlimited.
pub const CONNECTIONS_UNLIMITED_MAX: u64 = 10_000;

/// Descriptors the limit leaves aside.
pub fn fds_reserved() -> u64 {
    FDS_RESERVED + BLOCKING_READS_MAX as u64 * FDS_PER_READ
}

/// The process's soft RLIMIT_NOFILE; `None` when unlimited.
pub fn nofile() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0
        || r.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    Some(r.rlim_cur)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    Head,
    Handling,
}

struct State {
    phase: Phase,
    since: Instant,
}

/// One open connection, as the accept loop and its own task see it.
pub struct Conn {
    state: Mutex<State>,
    /// Close now (evicted at the limit).
    pub kill: Notify,
}

#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub header_read: Duration,
    pub idle: Duration,
}

impl Conn {
    fn new() -> Conn {
        Conn {
            state: Mutex::new(State {
                phase: Phase::Idle,
                since: Instant::now(),
            }),
            kill: Notify::new(),
        }
    }

    fn set(&self, phase: Phase) {
        let mut s = self.state.lock().expect("not poisoned");
        s.phase = phase;
        s.since = Instant::now();
    }

    /// The router has the request.
    pub fn handling(&self) {
        self.set(Phase::Handling);
    }

    /// The router answered: the response is written, then the connection
    /// waits for the next request.
    pub fn answered(&self) {
        self.set(Phase::Idle);
    }

    fn read(&self) {
        let mut s = self.state.lock().expect("not poisoned");
        if s.phase == Phase::Idle {
            s.phase = Phase::Head;
            s.since = Instant::now();
        }
    }

    fn wrote(&self) {
        let mut s = self.state.lock().expect("not poisoned");
        if s.phase == Phase::Idle {
            s.since = Instant::now();
        }
    }

    /// When the connection is to be closed, as things stand.
    pub fn deadline(&self, t: Timeouts) -> Option<Instant> {
        self.deadline_at(t, None)
    }

    /// When its task is to look again: the deadline, and at most
    /// `t.header_read` after `now` (a phase change wakes nobody).
    pub fn next_look(&self, t: Timeouts, now: Instant) -> Instant {
        self.deadline_at(t, Some(now + t.header_read))
            .expect("bounded by the look")
    }

    fn deadline_at(&self, t: Timeouts, look: Option<Instant>) -> Option<Instant> {
        let s = self.state.lock().expect("not poisoned");
        let d = match s.phase {
            Phase::Idle => Some(s.since + t.idle),
            Phase::Head => Some(s.since + t.header_read),
            Phase::Handling => None,
        };
        match (d, look) {
            (Some(d), Some(l)) => Some(d.min(l)),
            (d, l) => d.or(l),
        }
    }

    /// Whether part of a request head is in, and not all of it.
    pub fn mid_head(&self) -> bool {
        self.state.lock().expect("not poisoned").phase == Phase::Head
    }

    /// Since when it has waited without a complete request; `None` while
    /// the router has one.
    fn waiting_since(&self) -> Option<Instant> {
        let s = self.state.lock().expect("not poisoned");
        (s.phase != Phase::Handling).then_some(s.since)
    }
}

/// The socket, telling its connection when bytes come and go.
pub struct Watched<T> {
    pub inner: T,
    pub conn: Arc<Conn>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.conn.read();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.conn.wrote();
        }
        r
    }

    // Vectored as the socket is: hyper then sends a head and a tile body
    // in one call without first copying the body behind the head.
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.conn.wrote();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The open connections.
pub struct Conns {
    open: Mutex<HashMap<u64, Arc<Conn>>>,
    next: AtomicU64,
    /// A connection closed: there may be room.
    pub freed: Notify,
    pub max: usize,
    /// Where the limit comes from, for the log line.
    pub why: String,
    logged: Mutex<(Option<Instant>, u64)>,
}

/// Removes its connection from the open ones when the task ends.
pub struct Slot {
    conns: Arc<Conns>,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.conns
            .open
            .lock()
            .expect("not poisoned")
            .remove(&self.id);
        self.conns.freed.notify_one();
    }
}

/// The limit line is logged at most this often.
const LIMIT_LOG_EVERY: Duration = Duration::from_secs(60);

impl Conns {
    pub fn new(max: usize, why: String) -> Arc<Conns> {
        Arc::new(Conns {
            open: Mutex::default(),
            next: AtomicU64::new(0),
            freed: Notify::new(),
            max,
            why,
            logged: Mutex::new((None, 0)),
        })
    }

    pub fn len(&self) -> usize {
        self.open.lock().expect("not poisoned").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn open(self: &Arc<Self>) -> (Arc<Conn>, Slot) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let c = Arc::new(Conn::new());
        self.open
            .lock()
            .expect("not poisoned")
            .insert(id, c.clone());
        (
            c,
            Slot {
                conns: self.clone(),
                id,
            },
        )
    }

    /// At the limit: closes the connection that has waited longest without
    /// a complete request, and says so (at most once a minute, with how
    /// often it happened since). False when every connection is handling a
    /// request: then the caller waits for one to end.
    pub fn evict(&self) -> bool {
        let victim = {
            let open = self.open.lock().expect("not poisoned");
            open.values()
                .filter_map(|c| c.waiting_since().map(|t| (t, c.clone())))
                .min_by_key(|(t, _)| *t)
                .map(|(_, c)| c)
        };
        let mut l = self.logged.lock().expect("not poisoned");
        l.1 += 1;
        if l.0.is_none_or(|t| t.elapsed() >= LIMIT_LOG_EVERY) {
            log(&format!(
                "serve: the connection limit is reached: {} open, at most {} ({}); {}{}. Raise `ulimit -n` (or --connections-max) if these are real clients",
                self.len(),
                self.max,
                self.why,
                if victim.is_some() {
                    "closing the one that has waited longest without a complete request"
                } else {
                    "every one is being answered, so new ones wait"
                },
                match l.0 {
                    Some(_) => format!("; reached {} time(s) since the last such line", l.1),
                    None => String::new(),
                }
            ));
            *l = (Some(Instant::now()), 0);
        }
        drop(l);
        match victim {
            Some(c) => {
                c.kill.notify_one();
                true
            }
            None => false,
        }
    }
}

/// One line to stderr; a closed stderr is no reason to stop serving.
pub fn log(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}
