//! The highwater command line.
//!
//! It parses arguments (clap), calls the engine, and prints: data to stdout
//! (human text, or JSON with `--json`), progress and logs to stderr. No colour
//! is ever printed, so `NO_COLOR` is respected by construction.
//!
//! Exit codes:
//! - 0: everything finished and nothing failed;
//! - 1: finished, but some items failed (run), differed (verify) or were
//!   refused (adopt);
//! - 2: refused or usage error: bad arguments, a bad config, the guard, a lock
//!   held by another run. Nothing was touched.
//!
//! A closed stdout (`highwater plan | head`) ends the program quietly with 0.

mod output;

use anyhow::Result;
use clap::{Parser, Subcommand};
use highwater_files::{Pipeline, RunOptions};
use std::io::Write;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "highwater",
    version,
    about = "Incremental batch pipelines that are never stale"
)]
struct Cli {
    /// The config file; paths in it are relative to its folder.
    #[arg(long, global = true, default_value = "highwater.toml")]
    config: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the items that changed, with their reasons. Changes nothing.
    Plan {
        #[arg(long)]
        stage: Option<String>,
        #[arg(long)]
        json: bool,
        /// Read every byte instead of trusting the stat cache.
        #[arg(long)]
        rehash: bool,
    },
    /// Process the changed items and record them.
    Run {
        #[arg(long)]
        stage: Option<String>,
        /// Worker threads (default: the number of cores).
        #[arg(long)]
        jobs: Option<usize>,
        /// Run even when the guard refuses a mass rebuild.
        #[arg(long)]
        force: bool,
        #[arg(long)]
        rehash: bool,
        #[arg(long)]
        json: bool,
    },
    /// Record the current inputs and existing outputs as done, running nothing.
    Adopt {
        #[arg(long)]
        stage: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Re-make a sample of unchanged items in a scratch folder and compare bytes.
    Verify {
        #[arg(long)]
        stage: Option<String>,
        /// How many items per stage; 0 means all.
        #[arg(long, default_value_t = 20)]
        sample: usize,
        #[arg(long)]
        json: bool,
    },
    /// Per stage: the last run, the counts, the failures.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// The state store.
    State {
        #[command(subcommand)]
        command: StateCommand,
    },
}

#[derive(Subcommand)]
enum StateCommand {
    /// Write the manifest as JSON (to stdout, or to --output).
    Export {
        #[arg(long)]
        output: Option<PathBuf>,
    },
}

/// Runs the command line and returns the exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            if is_broken_pipe(&e) {
                return 0;
            }
            let _ = writeln!(std::io::stderr(), "error: {e:#}");
            2
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn run(cli: Cli) -> Result<i32> {
    let pipeline = Pipeline::from_config(&cli.config)?;
    let mut out = std::io::stdout().lock();
    match cli.command {
        Command::Plan {
            stage,
            json,
            rehash,
        } => {
            let plans = pipeline.plan(stage.as_deref(), rehash)?;
            output::plan(&mut out, &plans, json)?;
            Ok(0)
        }
        Command::Run {
            stage,
            jobs,
            force,
            rehash,
            json,
        } => {
            let mut opts = RunOptions {
                stage,
                force,
                rehash,
                ..RunOptions::default()
            };
            if let Some(j) = jobs {
                anyhow::ensure!(j >= 1, "--jobs must be at least 1");
                opts.jobs = j;
            }
            let progress = output::Bars::new();
            let report = pipeline.run(&opts, &progress)?;
            drop(progress);
            output::run(&mut out, &report, json)?;
            Ok(if report.failed() > 0 { 1 } else { 0 })
        }
        Command::Adopt { stage, json } => {
            let report = pipeline.adopt(stage.as_deref())?;
            output::adopt(&mut out, &report, json)?;
            let refused: usize = report.stages.iter().map(|s| s.refused.len()).sum();
            Ok(if refused > 0 { 1 } else { 0 })
        }
        Command::Verify {
            stage,
            sample,
            json,
        } => {
            let items = pipeline.verify(stage.as_deref(), sample)?;
            let bad = output::verify(&mut out, &items, json)?;
            Ok(if bad > 0 { 1 } else { 0 })
        }
        Command::Status { json } => {
            let status = pipeline.status()?;
            output::status(&mut out, &status, json)?;
            Ok(0)
        }
        Command::State {
            command: StateCommand::Export { output },
        } => {
            let v = pipeline.export()?;
            let text = serde_json::to_string_pretty(&v)?;
            match output {
                Some(path) => {
                    // Written beside the target and renamed, so a crash never
                    // leaves half an export.
                    let tmp = path.with_extension("json.tmp");
                    std::fs::write(&tmp, text + "\n")?;
                    std::fs::rename(&tmp, &path)?;
                }
                None => writeln!(out, "{text}")?,
            }
            Ok(0)
        }
    }
}
