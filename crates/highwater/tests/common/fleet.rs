//! Processes of a fleet on one shared PostgreSQL state: spawned with the
//! state URL, finished into (exit code, JSON report, stderr).

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use super::Project;

pub fn spawn(p: &Project, url: &str, args: &[&str]) -> Child {
    p.cmd(args)
        .env("HIGHWATER_STATE_URL", url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

pub fn finish(c: Child) -> (i32, serde_json::Value, String) {
    let o = c.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    let json = serde_json::from_str(&stdout).unwrap_or(serde_json::Value::Null);
    (o.status.code().unwrap_or(-1), json, stderr)
}

/// Waits for `f`; two minutes at most, so that a hung test stops (a bound,
/// not a measure of speed).
pub fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "waited two minutes for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn count(db: &mut postgres::Client, sql: &str) -> i64 {
    db.query_one(sql, &[]).unwrap().get(0)
}
