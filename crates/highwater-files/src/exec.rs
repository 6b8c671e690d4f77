//! Runs one item: the transform writes a temp path beside the final output;
//! on success the temp file is fsynced, renamed into place, and the folder
//! fsynced. Only then may the committer record the item.

use crate::discover::TEMP_MARK;
use crate::spec::{ItemContext, Transform};
use highwater_core::template::{ArgTemplate, ArgValues};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// A failed item's error keeps at most this many bytes of the command's
/// output (its tail, where the error usually is).
pub const ERROR_MESSAGE_MAX_BYTES: usize = 4096;

static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// A fresh temp path for `final_path`: a file with the same name inside a
/// private folder `.NAME.hw-tmp-PID-SEQ` beside it.
///
/// The folder matters for crashes: a command orphaned by a SIGKILLed run may
/// still be about to create its output. Once the next run has swept the
/// folder, that late create fails instead of leaving a stray file. Keeping
/// the final name also keeps the extension, which some tools read.
pub fn temp_path_for(final_path: &Path) -> PathBuf {
    let name = final_path.file_name().unwrap_or_default();
    let seq = TEMP_SEQ.fetch_add(1, Ordering::Relaxed);
    let dir = final_path.with_file_name(format!(
        ".{}{TEMP_MARK}{}-{seq}",
        name.to_string_lossy(),
        std::process::id()
    ));
    dir.join(name)
}

/// Removes the private folder of a temp path, whatever is left in it.
pub fn remove_temp(temp: &Path) {
    if let Some(dir) = temp.parent() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// What the transform of one item is given.
pub struct Job<'a> {
    pub root: &'a Path,
    pub transform: &'a Transform,
    pub args: &'a [ArgTemplate],
    /// Input relative to the config folder (`None` for an aggregate).
    pub input: Option<&'a str>,
    /// All inputs of an aggregate, relative to the config folder (for
    /// `{inputs}`); empty for a per-item job, whose `{inputs}` is its input.
    pub inputs: &'a [String],
    pub relpath: &'a str,
    /// Run the command observed (issue 24); closures never are.
    pub observe: bool,
    /// Told each path the observed command is about to write.
    pub on_write: Option<highwater_observe::OnWrite>,
    /// Keep what a closure reports it read (`StageSpec::reports_reads`).
    pub reports_reads: bool,
}

/// What an item's transform was seen to touch: `None` when it was not
/// observed (a closure, or `observe = false`).
pub type Seen = Option<highwater_observe::Observation>;

fn tail(bytes: &[u8]) -> String {
    let start = bytes.len().saturating_sub(ERROR_MESSAGE_MAX_BYTES);
    String::from_utf8_lossy(&bytes[start..]).trim().to_string()
}

/// A relative path that a program cannot take for an option.
fn arg_path(p: &str) -> String {
    if p.starts_with('-') {
        format!("./{p}")
    } else {
        p.to_string()
    }
}

/// Runs the transform so that it writes `out` (a temp path). Returns a
/// message on failure; the temp file is removed then. On success, what an
/// observed command touched.
pub fn run_transform(job: &Job<'_>, out: &Path) -> Result<Seen, String> {
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create output folder {}: {e}", parent.display()))?;
    }
    let result = run_transform_inner(job, out);
    if result.is_err() {
        remove_temp(out);
    }
    result
}

fn run_transform_inner(job: &Job<'_>, out: &Path) -> Result<Seen, String> {
    let mut seen = None;
    let result =
        match job.transform {
            Transform::Command(_) => run_command(job, out).map(|s| seen = s),
            Transform::Closure(f) => {
                let input_abs = job.input.map(|i| job.root.join(i));
                let inputs_abs: Vec<PathBuf> = match job.input {
                    Some(i) => vec![job.root.join(i)],
                    None => job.inputs.iter().map(|i| job.root.join(i)).collect(),
                };
                let reads = std::sync::Mutex::new(None);
                let ctx = ItemContext {
                    input: input_abs.as_deref(),
                    inputs: &inputs_abs,
                    output: out,
                    relpath: job.relpath,
                    reads: &reads,
                };
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&ctx))) {
                    Ok(r) => {
                        if job.reports_reads {
                            seen = reads.into_inner().unwrap_or_else(|p| p.into_inner()).map(
                                |mut o| {
                                    o.finish();
                                    o
                                },
                            );
                        }
                        r
                    }
                    Err(p) => Err(format!(
                        "the transform panicked: {}",
                        p.downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| p.downcast_ref::<String>().cloned())
                            .unwrap_or_default()
                    )),
                }
            }
        };
    let result = result.and_then(|()| match std::fs::symlink_metadata(out) {
        Ok(m) if m.is_file() => Ok(seen),
        Ok(_) => Err(format!(
            "the transform wrote something other than a regular file at {}",
            out.display()
        )),
        Err(_) => Err(format!(
            "the transform succeeded but wrote no output at {}; it must write to {{output}}",
            out.display()
        )),
    });
    result
}

fn run_command(job: &Job<'_>, out: &Path) -> Result<Seen, String> {
    let out_s = out.to_string_lossy();
    let input = job.input.map(arg_path).unwrap_or_default();
    let inputs: Vec<String> = match job.input {
        Some(_) => vec![input.clone()],
        None => job.inputs.iter().map(|i| arg_path(i)).collect(),
    };
    let values = ArgValues {
        input: &input,
        output: &out_s,
        inputs: &inputs,
        relpath: job.relpath,
    };
    let mut argv = Vec::new();
    for a in job.args {
        a.expand_into(&values, &mut argv);
    }
    let (program, args) = argv
        .split_first()
        .expect("command is non-empty (config check)");
    let mut cmd = Command::new(program);
    // Both spawners give the command /dev/null for stdin and make it die
    // with highwater: without that, a SIGKILLed run leaves its commands
    // running, and they go on writing temp files after the next run has
    // swept them (the crash test saw exactly that).
    cmd.args(args).current_dir(job.root);
    let (output, seen) = if job.observe {
        let (o, seen) = highwater_observe::output_with(&mut cmd, job.on_write.clone())
            .map_err(|e| e.to_string())?;
        (o, Some(seen))
    } else {
        let o = highwater_observe::output_unobserved(&mut cmd)
            .map_err(|e| format!("cannot start `{program}`: {e}"))?;
        (o, None)
    };
    if output.status.success() {
        return Ok(seen);
    }
    let mut msg = match output.status.code() {
        Some(c) => format!("`{program}` exited with status {c}"),
        None => format!("`{program}` was killed by a signal"),
    };
    let err = tail(&output.stderr);
    let so = tail(&output.stdout);
    if !err.is_empty() {
        msg.push_str(": ");
        msg.push_str(&err);
    } else if !so.is_empty() {
        msg.push_str(": ");
        msg.push_str(&so);
    }
    Err(msg)
}

/// Makes a finished temp output durable and visible: fsync the file, rename
/// it over the final path, fsync the folder.
pub fn publish(temp: &Path, final_path: &Path) -> std::io::Result<()> {
    File::open(temp)?.sync_all()?;
    std::fs::rename(temp, final_path)?;
    sync_parent(final_path)?;
    remove_temp(temp);
    Ok(())
}

/// fsyncs the folder that holds `path`, so that a rename or unlink in it is
/// durable.
pub fn sync_parent(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => File::open(p)?.sync_all(),
        _ => File::open(".")?.sync_all(),
    }
}

/// Looks a program up the way `Command` will: a name with a `/` relative to
/// `root`, a bare name on `PATH`.
pub fn find_program(root: &Path, program: &str) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let is_exe = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if program.contains('/') {
        let p = root.join(program);
        return if is_exe(&p) {
            Ok(p)
        } else {
            Err(p.display().to_string())
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let p = dir.join(program);
        if is_exe(&p) {
            return Ok(p);
        }
    }
    Err(format!("PATH={}", path.to_string_lossy()))
}

/// A private scratch folder under the system's temp folder for one item's
/// downloaded input and its output bound for object storage; removed with
/// everything in it when dropped.
pub struct Scratch(PathBuf);

/// How a scratch folder's name begins, under the system's temp folder: what
/// a command reads there is the item's own input, downloaded by highwater
/// and removed after it, never an observed dependency (`deps`).
pub const SCRATCH_PREFIX: &str = "highwater-scratch-";

impl Scratch {
    pub fn new() -> std::io::Result<Scratch> {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "{SCRATCH_PREFIX}{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(dir.join("in"))?;
        std::fs::create_dir_all(dir.join("out"))?;
        Ok(Scratch(dir))
    }

    /// Where a downloaded input goes: its file name kept, for commands
    /// that read the extension.
    pub fn file(&self, key: &str) -> PathBuf {
        self.0
            .join("in")
            .join(key.rsplit('/').next().unwrap_or("input"))
    }

    /// Where the output is written before its upload.
    pub fn output(&self, key: &str) -> PathBuf {
        self.0
            .join("out")
            .join(key.rsplit('/').next().unwrap_or("output"))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
