//! The `check` helper for end-to-end tests: a throw-away project folder and
//! the real `highwater` binary run in it.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::SystemTime;

pub struct Project {
    pub dir: tempfile::TempDir,
}

pub struct Ran {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }
}

/// The stdout/stderr of a finished process, as text.
fn ran(o: Output) -> Ran {
    Ran {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_highwater")
}

/// A config with one stage `upper` that upper-cases `data/**/*.txt` into
/// `out/{relpath}.upper` with `tr`, no shell string involved.
pub fn upper_config(extra: &str) -> String {
    format!(
        r#"
[stages.upper]
inputs = ["data/**/*.txt"]
output = "out/{{relpath}}.upper"
command = ["sh", "up.sh", "{{input}}", "{{output}}"]
{extra}
[stages.upper.recipe]
version = "1"
files = ["up.sh"]
"#
    )
}

impl Project {
    pub fn new(config: &str) -> Project {
        let p = Project {
            dir: tempfile::tempdir().unwrap(),
        };
        p.write("highwater.toml", config);
        p.write("up.sh", "set -eu\ntr 'a-z' 'A-Z' < \"$1\" > \"$2\"\n");
        p
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn write(&self, rel: &str, content: &str) {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
    }

    pub fn exists(&self, rel: &str) -> bool {
        self.path(rel).exists()
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.current_dir(self.dir.path())
            .args(args)
            .stdin(Stdio::null())
            .env_remove("RUST_BACKTRACE");
        c
    }

    /// Runs highwater with `args` and `HIGHWATER_FAILPOINT=failpoint`,
    /// asserting that it died by SIGKILL there (the crash tests).
    pub fn killed_at(&self, args: &[&str], failpoint: &str) {
        use std::os::unix::process::ExitStatusExt;
        let out = self
            .cmd(args)
            .env("HIGHWATER_FAILPOINT", failpoint)
            .output()
            .unwrap();
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGKILL),
            "{args:?} at {failpoint}: {out:?}"
        );
    }

    /// Runs highwater with `args` in the project and returns what it did.
    pub fn hw(&self, args: &[&str]) -> Ran {
        ran(self.cmd(args).output().unwrap())
    }

    /// `hw`, asserting the exit code.
    pub fn check(&self, args: &[&str], code: i32) -> Ran {
        let r = self.hw(args);
        assert_eq!(
            r.code, code,
            "highwater {args:?} exited {} (wanted {code})\nstdout:\n{}\nstderr:\n{}",
            r.code, r.stdout, r.stderr
        );
        r
    }

    /// `run --json`: the per-stage report.
    pub fn run_json(&self, extra: &[&str], code: i32) -> serde_json::Value {
        let mut args = vec!["run", "--json"];
        args.extend_from_slice(extra);
        self.check(&args, code).json()
    }

    /// Every file under `rel` with its bytes and mtime.
    pub fn tree(&self, rel: &str) -> BTreeMap<String, (Vec<u8>, SystemTime)> {
        tree(&self.path(rel))
    }

    pub fn export(&self) -> serde_json::Value {
        self.check(&["state", "export"], 0).json()
    }
}

pub fn tree(root: &Path) -> BTreeMap<String, (Vec<u8>, SystemTime)> {
    let mut out = BTreeMap::new();
    if !root.exists() {
        return out;
    }
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd {
            let Ok(e) = e else { continue };
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                // A file may vanish between listing and reading while a run
                // renames temp files into place; it is then not there.
                let (Ok(m), Ok(bytes)) = (std::fs::metadata(&p), std::fs::read(&p)) else {
                    continue;
                };
                out.insert(rel, (bytes, m.modified().unwrap()));
            }
        }
    }
    out
}

/// Only the bytes of a tree, for comparing with a rebuild.
pub fn contents(t: &BTreeMap<String, (Vec<u8>, SystemTime)>) -> BTreeMap<String, Vec<u8>> {
    t.iter().map(|(k, (b, _))| (k.clone(), b.clone())).collect()
}

/// Sets a file's mtime `secs` seconds into the past, so that its record is
/// not racy (the margin is one second).
pub fn age(path: &Path, secs: u64) {
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(SystemTime::now() - std::time::Duration::from_secs(secs))
        .unwrap();
}

pub fn stage<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no stage {name} in {report}"))
}
pub mod delta;
pub mod fleet;
pub mod front;
pub mod http;
pub mod ingest;
pub mod osm;
pub mod pgcluster;
pub mod serve;
