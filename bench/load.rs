// The load generator of bench/serve_tiles.sh (issue 23): CLIENTS keep-alive
// HTTP/1.1 connections at once, one thread each, blocking sockets, the
// requests formatted before the clock starts, responses read by their
// Content-Length (or chunks). Light on the CPU it shares with the server
// (one write and one or two reads per request), so that the server, not
// the client, is what is measured. No dependencies: the bench compiles it
// with `rustc -O`.
//
//   load PORT PATH_TEMPLATE TILES_FILE N CLIENTS -> "tiles/s p50_ms p99_ms"
//
// PATH_TEMPLATE has {z}, {x}, {y}; TILES_FILE has "z x y" lines; request i
// is tile i mod (lines), client c sends requests c, c + CLIENTS, ... (the
// same list for every server). Every answer must be 200 or 204.
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Barrier};
use std::time::Instant;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 6 {
        eprintln!("usage: load PORT PATH_TEMPLATE TILES_FILE N CLIENTS");
        std::process::exit(2);
    }
    let port: u16 = a[1].parse().expect("PORT");
    let tmpl = a[2].clone();
    let tiles: Vec<(String, String, String)> = std::fs::read_to_string(&a[3])
        .expect("TILES_FILE")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Vec<&str> = l.split_whitespace().collect();
            (v[0].to_string(), v[1].to_string(), v[2].to_string())
        })
        .collect();
    assert!(!tiles.is_empty(), "no tiles in {}", a[3]);
    let n: usize = a[4].parse().expect("N");
    let conc: usize = a[5].parse().expect("CLIENTS");
    let start = Arc::new(Barrier::new(conc + 1));
    let mut handles = Vec::new();
    for c in 0..conc {
        let reqs: Vec<Vec<u8>> = (c..n)
            .step_by(conc)
            .map(|i| {
                let (z, x, y) = &tiles[i % tiles.len()];
                let path = tmpl.replace("{z}", z).replace("{x}", x).replace("{y}", y);
                format!(
                    "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept-Encoding: gzip\r\n\r\n"
                )
                .into_bytes()
            })
            .collect();
        let start = start.clone();
        handles.push(std::thread::spawn(move || {
            let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
            s.set_nodelay(true).expect("nodelay");
            let mut buf = vec![0u8; 1 << 20];
            let mut lat = Vec::with_capacity(reqs.len());
            start.wait();
            for r in &reqs {
                let t0 = Instant::now();
                s.write_all(r).expect("write");
                let status = read_response(&mut s, &mut buf);
                assert!(status == 200 || status == 204, "status {status}");
                lat.push(t0.elapsed().as_nanos() as u64);
            }
            lat
        }));
    }
    start.wait();
    let t0 = Instant::now();
    let mut lat: Vec<u64> = Vec::with_capacity(n);
    for h in handles {
        lat.extend(h.join().expect("client thread"));
    }
    let wall = t0.elapsed().as_secs_f64();
    lat.sort_unstable();
    let ms = |i: usize| lat[i.min(lat.len() - 1)] as f64 / 1e6;
    println!(
        "{:.0} {:.3} {:.3}",
        n as f64 / wall,
        ms(lat.len() / 2),
        ms(lat.len() * 99 / 100)
    );
}

/// Reads one response off `s`; its status. The connection is kept alive:
/// exactly the response's bytes are read (servers here send one response
/// per request, nothing ahead).
fn read_response(s: &mut TcpStream, buf: &mut [u8]) -> u16 {
    let mut have = 0;
    let head_end = loop {
        let k = s.read(&mut buf[have..]).expect("read");
        assert!(k > 0, "the server closed the connection");
        have += k;
        if let Some(p) = find(&buf[..have], b"\r\n\r\n") {
            break p + 4;
        }
        assert!(have < buf.len(), "a response head over {} bytes", buf.len());
    };
    let head = std::str::from_utf8(&buf[..head_end]).expect("an ASCII head");
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let mut length = None;
    let mut chunked = false;
    for line in head.split("\r\n").skip(1) {
        if let Some((k, v)) = line.split_once(':') {
            let v = v.trim();
            if k.eq_ignore_ascii_case("content-length") {
                length = Some(v.parse::<usize>().expect("a length"));
            } else if k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked") {
                chunked = true;
            }
        }
    }
    if status == 204 || status == 304 {
        return status;
    }
    if chunked {
        // Chunks: "SIZE\r\nDATA\r\n" ... "0\r\n\r\n"; the bytes past the head
        // are moved to the front and read on from there.
        buf.copy_within(head_end..have, 0);
        have -= head_end;
        let mut at = 0;
        loop {
            let line_end = loop {
                if let Some(p) = find(&buf[at..have], b"\r\n") {
                    break at + p;
                }
                have += fill(s, buf, have);
            };
            let size = usize::from_str_radix(
                std::str::from_utf8(&buf[at..line_end])
                    .expect("a chunk size")
                    .split(';')
                    .next()
                    .unwrap()
                    .trim(),
                16,
            )
            .expect("a chunk size");
            let need = line_end + 2 + size + 2;
            while have < need {
                have += fill(s, buf, have);
            }
            if size == 0 {
                return status;
            }
            at = need;
        }
    }
    let length = length.expect("a Content-Length or chunks");
    let mut body = have - head_end;
    while body < length {
        let want = (length - body).min(buf.len());
        let k = s.read(&mut buf[..want]).expect("read");
        assert!(k > 0, "the server closed the connection mid-body");
        body += k;
    }
    status
}

fn fill(s: &mut TcpStream, buf: &mut [u8], have: usize) -> usize {
    assert!(have < buf.len(), "a chunk over {} bytes", buf.len());
    let k = s.read(&mut buf[have..]).expect("read");
    assert!(k > 0, "the server closed the connection mid-body");
    k
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}
