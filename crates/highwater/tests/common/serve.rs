//! `highwater serve` and a real browser for end-to-end tests: the server on
//! 127.0.0.1 (stopped when dropped), and headless Chromium driven over the
//! DevTools protocol (`tests/browser/cdp.py`).

#![allow(dead_code)]

use super::Project;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

pub struct Served {
    child: Child,
    pub addr: String,
    /// Everything serve wrote to stderr, read as it comes (a pipe left
    /// unread would stop it once full).
    log: Arc<Mutex<String>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Served {
    /// What serve has logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// SIGTERM, and its exit code; `None` if it is still running after
    /// `bound` (a hang, not a measure of speed).
    pub fn terminate(&mut self, bound: std::time::Duration) -> Option<i32> {
        // SAFETY: a signal to our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let until = std::time::Instant::now() + bound;
        while std::time::Instant::now() < until {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.code();
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        None
    }
}

/// Starts `highwater serve` on a free loopback port.
pub fn serve(p: &Project, extra: &[&str]) -> Served {
    let mut args = vec!["serve", "--listen", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    serve_cmd(p.cmd(&args))
}

/// Starts a prepared `highwater serve` command (which must listen on a
/// loopback port) and waits for its "listening on" line.
pub fn serve_cmd(mut cmd: Command) -> Served {
    let mut child = cmd.stderr(Stdio::piped()).spawn().unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let log = Arc::new(Mutex::new(String::new()));
    let addr = loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            let _ = child.kill();
            panic!("serve ended before listening: {}", log.lock().unwrap());
        }
        log.lock().unwrap().push_str(&line);
        if let Some(a) = line.trim().strip_prefix("listening on http://") {
            break a.trim_end_matches('/').to_string();
        }
    };
    let l = log.clone();
    std::thread::spawn(move || {
        let mut line = String::new();
        while err.read_line(&mut line).is_ok_and(|n| n > 0) {
            l.lock().unwrap().push_str(&line);
            line.clear();
        }
    });
    Served { child, addr, log }
}

/// Opens `url` in headless Chromium, waits until `wait` (JS) is truthy,
/// saves a screenshot to `png`, and returns the JSON value of `result`.
pub fn browser(url: &str, png: &Path, wait: &str, result: &str) -> serde_json::Value {
    let python = std::env::var("HIGHWATER_TEST_PYTHON").expect(
        "HIGHWATER_TEST_PYTHON is not set: run the tests with `bash scripts/test.sh`, which installs Chromium and the DevTools client",
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/cdp.py");
    let out = std::process::Command::new(python)
        .arg(script)
        .args([url, png.to_str().unwrap(), wait, result, "90"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the browser run failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    match v {
        serde_json::Value::String(s) => serde_json::from_str(&s).unwrap(),
        other => other,
    }
}

/// One HTTP/1.1 request: (status, headers lower-cased, body, de-chunked).
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, std::collections::BTreeMap<String, String>, Vec<u8>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("Content-Length: 0\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let mut h = std::collections::BTreeMap::new();
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            h.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let mut body = raw[split + 4..].to_vec();
    if h.get("transfer-encoding").is_some_and(|t| t == "chunked") {
        body = dechunk(&body);
    }
    (status, h, body)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let i = b.windows(2).position(|w| w == b"\r\n").unwrap();
        let n = usize::from_str_radix(std::str::from_utf8(&b[..i]).unwrap().trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&b[i + 2..i + 2 + n]);
        b = &b[i + 2 + n + 2..];
    }
}
