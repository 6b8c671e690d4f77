//! A replication server the tests own: HTTP/1.1 on 127.0.0.1, serving a
//! replication folder, with a scripted fault for chosen paths. It stops when
//! dropped.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the server does instead of answering, once per scripted use.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// Answer with this status and no body.
    Status(u16),
    /// 429 with `Retry-After: secs`.
    TooMany(u64),
    /// Promise the whole body, send half, close.
    Truncate,
    /// Send a body that is not gzip at all.
    Garbage,
    /// Wait this long before sending the body.
    Slow(Duration),
    /// Send nothing at all for this long, then close (a server that hangs).
    Hang(Duration),
}

pub struct ReplicationServer {
    pub url: String,
    /// The newest sequence `state.txt` offers.
    pub top: Arc<AtomicI64>,
    /// The oldest sequence served (older ones are 404, as on a server that
    /// dropped them).
    pub oldest: Arc<AtomicI64>,
    faults: Arc<Mutex<BTreeMap<String, Vec<Fault>>>>,
    /// Overrides for a path's body.
    bodies: Arc<Mutex<BTreeMap<String, Vec<u8>>>>,
    /// Requests per path, in order.
    pub log: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    addr: std::net::SocketAddr,
}

impl ReplicationServer {
    /// Serves `dir` (AAA/BBB/CCC.osc.gz and .state.txt), with `state.txt`
    /// made from the state of sequence `top`.
    pub fn start(dir: PathBuf, top: i64, oldest: i64) -> ReplicationServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let s = ReplicationServer {
            url: format!("http://{addr}/replication"),
            top: Arc::new(AtomicI64::new(top)),
            oldest: Arc::new(AtomicI64::new(oldest)),
            faults: Arc::default(),
            bodies: Arc::default(),
            log: Arc::default(),
            stop: Arc::new(AtomicBool::new(false)),
            addr,
        };
        let (top, oldest, faults, bodies, log, stop) = (
            s.top.clone(),
            s.oldest.clone(),
            s.faults.clone(),
            s.bodies.clone(),
            s.log.clone(),
            s.stop.clone(),
        );
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (dir, top, oldest, faults, bodies, log) = (
                    dir.clone(),
                    top.clone(),
                    oldest.clone(),
                    faults.clone(),
                    bodies.clone(),
                    log.clone(),
                );
                std::thread::spawn(move || {
                    let _ = serve(conn, &dir, &top, &oldest, &faults, &bodies, &log);
                });
            }
        });
        s
    }

    /// Scripts faults for the path (relative, e.g. `000/003/050.osc.gz`),
    /// used one per request, in order.
    pub fn fault(&self, path: &str, faults: &[Fault]) {
        self.faults
            .lock()
            .unwrap()
            .entry(path.to_string())
            .or_default()
            .extend(faults.iter().cloned());
    }

    /// Serves `body` for `path` instead of the file.
    pub fn body(&self, path: &str, body: &[u8]) {
        self.bodies
            .lock()
            .unwrap()
            .insert(path.to_string(), body.to_vec());
    }

    pub fn requests(&self, path: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|p| *p == path)
            .count()
    }
}

impl Drop for ReplicationServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn sequence_of(path: &str) -> Option<i64> {
    let p: Vec<&str> = path.split('/').collect();
    if p.len() != 3 {
        return None;
    }
    let c = p[2].split('.').next()?;
    format!("{}{}{c}", p[0], p[1]).parse().ok()
}

fn serve(
    conn: TcpStream,
    dir: &std::path::Path,
    top: &AtomicI64,
    oldest: &AtomicI64,
    faults: &Mutex<BTreeMap<String, Vec<Fault>>>,
    bodies: &Mutex<BTreeMap<String, Vec<u8>>>,
    log: &Mutex<Vec<String>>,
) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
    }
    let target = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let path = target
        .strip_prefix("/replication/")
        .unwrap_or("")
        .to_string();
    log.lock().unwrap().push(path.clone());
    let mut out = conn;
    let reply = |out: &mut TcpStream, status: &str, extra: &str, body: &[u8]| {
        write!(
            out,
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n",
            body.len()
        )?;
        out.write_all(body)
    };
    let fault = {
        let mut f = faults.lock().unwrap();
        f.get_mut(&path)
            .and_then(|v| (!v.is_empty()).then(|| v.remove(0)))
    };
    let body: Option<Vec<u8>> = if let Some(b) = bodies.lock().unwrap().get(&path) {
        Some(b.clone())
    } else if path == "state.txt" {
        let t = top.load(Ordering::SeqCst);
        let s = format!("{t:09}");
        std::fs::read(dir.join(format!("{}/{}/{}.state.txt", &s[0..3], &s[3..6], &s[6..9]))).ok()
    } else {
        match sequence_of(&path) {
            Some(seq)
                if seq >= oldest.load(Ordering::SeqCst) && seq <= top.load(Ordering::SeqCst) =>
            {
                std::fs::read(dir.join(&path)).ok()
            }
            _ => None,
        }
    };
    match (fault, body) {
        (Some(Fault::Hang(d)), _) => {
            std::thread::sleep(d);
            Ok(())
        }
        (Some(Fault::Status(code)), _) => reply(&mut out, &format!("{code} Fault"), "", b""),
        (Some(Fault::TooMany(secs)), _) => reply(
            &mut out,
            "429 Too Many Requests",
            &format!("Retry-After: {secs}\r\n"),
            b"",
        ),
        (Some(Fault::Truncate), Some(b)) => {
            write!(
                out,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                b.len()
            )?;
            out.write_all(&b[..b.len() / 2])?;
            out.flush()
        }
        (Some(Fault::Garbage), Some(_)) => reply(&mut out, "200 OK", "", b"this is not gzip"),
        (Some(Fault::Slow(d)), Some(b)) => {
            write!(
                out,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                b.len()
            )?;
            out.write_all(&b[..10.min(b.len())])?;
            out.flush()?;
            std::thread::sleep(d);
            out.write_all(&b[10.min(b.len())..])
        }
        (_, Some(b)) => reply(&mut out, "200 OK", "", &b),
        (_, None) => reply(&mut out, "404 Not Found", "", b"not found"),
    }
}
