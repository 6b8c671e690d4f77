//! A scripted HTTP front on 127.0.0.1 for the replication tests (issue
//! 20): every request is recorded and answered by the test's handler,
//! which may redirect, refuse, or relay to a [`super::http::ReplicationServer`]
//! behind it (e.g. only with the right credentials). It stops when dropped.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request as the front saw it: the path (with any query) and the
/// headers, names lower-cased.
#[derive(Clone, Debug)]
pub struct Request {
    pub path: String,
    pub headers: BTreeMap<String, String>,
}

type Handler = dyn Fn(&Request) -> Vec<u8> + Send + Sync;

pub struct Front {
    /// `http://127.0.0.1:PORT`, no trailing slash.
    pub url: String,
    pub seen: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    addr: SocketAddr,
}

impl Front {
    /// Answers every request with `handler`'s raw HTTP response.
    pub fn start(handler: impl Fn(&Request) -> Vec<u8> + Send + Sync + 'static) -> Front {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let f = Front {
            url: format!("http://{addr}"),
            seen: Arc::default(),
            stop: Arc::new(AtomicBool::new(false)),
            addr,
        };
        let (seen, stop) = (f.seen.clone(), f.stop.clone());
        let handler: Arc<Handler> = Arc::new(handler);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (seen, handler) = (seen.clone(), handler.clone());
                std::thread::spawn(move || {
                    let _ = answer(conn, &seen, &*handler);
                });
            }
        });
        f
    }

    /// The requests whose path ends with `suffix`.
    pub fn requests(&self, suffix: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path.ends_with(suffix))
            .count()
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn answer(conn: TcpStream, seen: &Mutex<Vec<Request>>, handler: &Handler) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let req = Request {
        path: line.split_whitespace().nth(1).unwrap_or("/").to_string(),
        headers,
    };
    seen.lock().unwrap().push(req.clone());
    let mut out = conn;
    out.write_all(&handler(&req))?;
    out.flush()
}

/// A whole response with `Connection: close`.
pub fn response(status: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("\r\n");
    let mut r = r.into_bytes();
    r.extend_from_slice(body);
    r
}

/// GETs `path` from the server at `base` (`http://host:port...`) and
/// returns its raw response, to relay as it is.
pub fn relay(base: &str, path: &str) -> Vec<u8> {
    let hostport = base
        .strip_prefix("http://")
        .unwrap()
        .split('/')
        .next()
        .unwrap();
    let mut s = TcpStream::connect(hostport).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    raw
}
