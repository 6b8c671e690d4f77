//! Leases on any SQLite database: a lock with an owner, an expiry and a
//! fencing token, shared by ingestion (in the state store) and by the OSM
//! store's single writer.
//!
//! The table is `leases(name, owner, host, pid, acquired_at_ns,
//! expires_at_ns, token)`. A takeover raises the token; every write made
//! under a lease checks, in its own transaction, that the token is still
//! current ([`holds`]), so a holder that lost its lease writes nothing.
//! [`take`] is the acquisition loop (wait, deadline, takeover of a dead
//! owner on this host); [`Heartbeat`] renews on its own connection.

use crate::{Fence, Lease, LeaseOutcome};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The table, for databases that keep leases beside their own data.
pub const LEASES_SQL: &str = "CREATE TABLE IF NOT EXISTS leases(
        name TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        acquired_at_ns INTEGER NOT NULL,
        expires_at_ns INTEGER NOT NULL,
        token INTEGER NOT NULL)";

/// How long a waiting process polls between attempts, in milliseconds.
pub const LEASE_POLL_MS: u64 = 200;

/// Wall-clock nanoseconds since the epoch.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// This machine's host name, as leases record it.
pub fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// The id a process of a fleet claims and leases under: host, pid and the
/// start instant, so that a restarted process with a recycled pid is
/// someone else.
pub fn owner_id() -> String {
    format!(
        "{}:{}:{:08x}",
        host(),
        std::process::id(),
        (now_ns() as u64 >> 10) & 0xffff_ffff
    )
}

/// Whether a process of this host with that pid exists.
pub fn process_alive(pid: i64) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 performs only the existence and permission
    // check; no signal is sent.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Takes the lease `name` if it is free, ours, or expired at `now_ns`.
pub fn acquire(
    conn: &mut Connection,
    name: &str,
    owner: &str,
    host: &str,
    pid: i64,
    now_ns: i64,
    duration_ns: i64,
) -> rusqlite::Result<LeaseOutcome> {
    assert!(duration_ns > 0);
    // A holder in the middle of a long write transaction keeps the write
    // lock: read first (a read needs no lock in WAL mode), so that a second
    // command is told who holds the lease instead of "database is locked".
    if let Some(c) = current(conn, name)? {
        if c.owner != owner && c.expires_at_ns > now_ns {
            return Ok(LeaseOutcome::Held(c));
        }
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let current = current(&tx, name)?;
    if let Some(c) = &current {
        if c.owner != owner && c.expires_at_ns > now_ns {
            return Ok(LeaseOutcome::Held(c.clone()));
        }
    }
    // A takeover (or a first acquisition) gets a new, larger token; a
    // renewal by the same owner keeps its token.
    let token = match &current {
        Some(c) if c.owner == owner => c.token,
        Some(c) => c.token + 1,
        None => 1,
    };
    let lease = Lease {
        name: name.to_string(),
        owner: owner.to_string(),
        host: host.to_string(),
        pid,
        acquired_at_ns: now_ns,
        expires_at_ns: now_ns.saturating_add(duration_ns),
        token,
    };
    tx.execute(
        "INSERT OR REPLACE INTO leases(name, owner, host, pid, acquired_at_ns, expires_at_ns, token)
         VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            lease.name,
            lease.owner,
            lease.host,
            lease.pid,
            lease.acquired_at_ns,
            lease.expires_at_ns,
            lease.token
        ],
    )?;
    tx.commit()?;
    Ok(LeaseOutcome::Acquired(lease))
}

/// The lease row, whoever holds it.
pub fn current(conn: &Connection, name: &str) -> rusqlite::Result<Option<Lease>> {
    conn.query_row(
        "SELECT owner, host, pid, acquired_at_ns, expires_at_ns, token FROM leases WHERE name = ?1",
        [name],
        |r| {
            Ok(Lease {
                name: name.to_string(),
                owner: r.get(0)?,
                host: r.get(1)?,
                pid: r.get(2)?,
                acquired_at_ns: r.get(3)?,
                expires_at_ns: r.get(4)?,
                token: r.get(5)?,
            })
        },
    )
    .optional()
}

/// Extends a lease we hold; false when it was taken over.
pub fn renew(
    conn: &Connection,
    fence: &Fence,
    now_ns: i64,
    duration_ns: i64,
) -> rusqlite::Result<bool> {
    let n = conn.execute(
        "UPDATE leases SET expires_at_ns = ?3 WHERE name = ?1 AND token = ?2",
        params![fence.name, fence.token, now_ns.saturating_add(duration_ns)],
    )?;
    Ok(n == 1)
}

/// Gives a lease up (only if still ours). Expires rather than deletes, so
/// that the token keeps growing.
pub fn release(conn: &Connection, fence: &Fence) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE leases SET expires_at_ns = 0 WHERE name = ?1 AND token = ?2",
        params![fence.name, fence.token],
    )?;
    Ok(())
}

/// Whether the fence still holds: called inside the write transaction it
/// guards, so the check and the write commit together.
pub fn holds(conn: &Connection, fence: &Fence) -> rusqlite::Result<bool> {
    let token: Option<i64> = conn
        .query_row(
            "SELECT token FROM leases WHERE name = ?1",
            [&fence.name],
            |r| r.get(0),
        )
        .optional()?;
    Ok(token == Some(fence.token))
}

/// The acquisition loop shared by every leased command: take the lease; take
/// over at once from an owner on this host whose process is gone; otherwise
/// wait (with `wait`, until `deadline`) or give back the holder.
///
/// `attempt(at_ns)` tries once as of `at_ns`. Returns `Ok(Err(holder))` when
/// the lease stays held.
pub fn take<E>(
    mut attempt: impl FnMut(i64) -> Result<LeaseOutcome, E>,
    wait: bool,
    deadline: Instant,
) -> Result<Result<Lease, Lease>, E> {
    let host = host();
    loop {
        match attempt(now_ns())? {
            LeaseOutcome::Acquired(l) => return Ok(Ok(l)),
            // An owner on this host whose process is gone holds nothing:
            // take its lease over now rather than after it expires. The
            // takeover raises the token like any other.
            LeaseOutcome::Held(h) if h.host == host && !process_alive(h.pid) => {
                if let LeaseOutcome::Acquired(l) = attempt(now_ns().max(h.expires_at_ns + 1))? {
                    return Ok(Ok(l));
                }
            }
            LeaseOutcome::Held(h) if !wait || Instant::now() > deadline => return Ok(Err(h)),
            LeaseOutcome::Held(_) => std::thread::sleep(Duration::from_millis(LEASE_POLL_MS)),
        }
    }
}

/// A thread that renews a lease on its own connection every third of its
/// duration. `lost()` turns true when a renewal finds another token:
/// another process took the lease over, and the holder must write nothing
/// more.
pub struct Heartbeat {
    stop: Arc<AtomicBool>,
    lost: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Heartbeat {
    /// Starts renewing `fence` in the state store at `loc`, on a connection
    /// of its own.
    pub fn start_in(loc: &crate::StateLocation, fence: Fence, duration_ns: i64) -> Heartbeat {
        match loc {
            crate::StateLocation::Sqlite(p) => Heartbeat::start(p.clone(), fence, duration_ns),
            crate::StateLocation::Postgres { .. } => match loc.open() {
                Ok(mut store) => Heartbeat::spawn(fence, duration_ns, move |f, now, d| {
                    store.renew_lease(f, now, d).map_err(|_| ())
                }),
                Err(_) => Heartbeat::lost_from_start(),
            },
        }
    }

    /// Starts renewing `fence` in the SQLite database at `path`.
    pub fn start(path: PathBuf, fence: Fence, duration_ns: i64) -> Heartbeat {
        let Ok(conn) = Connection::open(&path) else {
            return Heartbeat::lost_from_start();
        };
        let _ = conn.busy_timeout(Duration::from_secs(5));
        // Busy: the holder's own long write transaction has the database.
        // Nobody can take the lease over meanwhile (that needs the same
        // write lock); the next step tries again.
        Heartbeat::spawn(fence, duration_ns, move |f, now, d| {
            renew(&conn, f, now, d).map_err(|_| ())
        })
    }

    fn lost_from_start() -> Heartbeat {
        Heartbeat {
            stop: Arc::new(AtomicBool::new(false)),
            lost: Arc::new(AtomicBool::new(true)),
            thread: None,
        }
    }

    /// The renewal loop: `renew(fence, now_ns, duration_ns)` answers
    /// Ok(false) when another token holds the lease (lost for good) and
    /// Err when the store could not answer (tried again next step).
    fn spawn(
        fence: Fence,
        duration_ns: i64,
        mut renew: impl FnMut(&Fence, i64, i64) -> Result<bool, ()> + Send + 'static,
    ) -> Heartbeat {
        let lost = Arc::new(AtomicBool::new(false));
        let l = lost.clone();
        let step = Duration::from_nanos((duration_ns / 3).max(50_000_000) as u64);
        let (stop, thread) = tick(step, move || match renew(&fence, now_ns(), duration_ns) {
            Ok(true) | Err(()) => true,
            // Another owner's token: lost for good.
            Ok(false) => {
                l.store(true, Ordering::SeqCst);
                false
            }
        });
        let thread = thread.ok();
        if thread.is_none() {
            lost.store(true, Ordering::SeqCst);
        }
        Heartbeat { stop, lost, thread }
    }

    /// True once the lease was taken over (or could not be renewed).
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// The flag behind [`Heartbeat::lost`], for workers that check it.
    pub fn lost_flag(&self) -> &AtomicBool {
        &self.lost
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// Extends every work-queue claim of `owner` on a connection of its own,
/// every third of the claim's lease, until dropped. A process that dies or
/// freezes stops extending them, and they become claimable again.
pub struct ClaimHeartbeat {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ClaimHeartbeat {
    pub fn start(
        loc: &crate::StateLocation,
        owner: String,
        lease_ns: i64,
    ) -> Result<ClaimHeartbeat, crate::StoreError> {
        let mut store = loc.open()?;
        // A failed renewal is not fatal here: the claims then expire, and
        // the fence refuses our late results.
        let (stop, thread) = tick(
            Duration::from_nanos((lease_ns / 3).max(100_000_000) as u64),
            move || {
                if let Some(q) = store.as_queue() {
                    let _ = q.heartbeat(&owner, lease_ns);
                }
                true
            },
        );
        Ok(ClaimHeartbeat {
            stop,
            thread: Some(thread.map_err(|source| crate::StoreError::Io {
                path: PathBuf::from("claim-heartbeat thread"),
                source,
            })?),
        })
    }
}

impl Drop for ClaimHeartbeat {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// Calls `f` on a thread of its own every `step` until it returns false or
/// the returned flag is set (and the thread unparked, which stopping does:
/// it costs no wait).
fn tick(
    step: Duration,
    mut f: impl FnMut() -> bool + Send + 'static,
) -> (
    Arc<AtomicBool>,
    std::io::Result<std::thread::JoinHandle<()>>,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let thread = std::thread::Builder::new()
        .name("heartbeat".into())
        .spawn(move || {
            let mut last = Instant::now();
            loop {
                std::thread::park_timeout(step.saturating_sub(last.elapsed()));
                if s.load(Ordering::SeqCst) {
                    return;
                }
                if last.elapsed() < step {
                    continue;
                }
                last = Instant::now();
                if !f() {
                    return;
                }
            }
        });
    (stop, thread)
}
