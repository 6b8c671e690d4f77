//! File stages: the part of highwater that turns files into outputs, and only
//! the files whose evidence says they changed.
//!
//! A [`Pipeline`] is a set of stages (read from `highwater.toml` by
//! [`config`], or declared from Rust with [`StageSpec`] and a closure). Each
//! run goes through the same named stages:
//!
//! ```text
//! discover (walk + stat) -> evidence (hash on N threads) -> plan (pure, in highwater-core)
//!   -> workers (N threads, write temp, fsync, rename) -> committer (one thread, batched transactions)
//! ```
//!
//! Layout:
//! - [`config`]: `highwater.toml` into [`PipelineSpec`], with errors that name the file.
//! - [`spec`]: the declarations: stages, transforms, recipes.
//! - [`declared`]: stages a Python pipeline declared, as it recorded them
//!   beside the state for the CLI (issue 48).
//! - [`discover`]: glob walking and stat, and the output-root listing.
//! - [`inputs`]: the other kinds of item discovery behind one trait, one
//!   file per kind (`windows`: a source's landed windows, issue 49).
//! - [`hash`]: BLAKE3 digests and fingerprints of files.
//! - [`compare`]: containers compared as data (issue 49), one module per
//!   format behind the [`compare::DataDigest`] trait.
//! - [`stat`]: many stats, fast, one open folder at a time (`fstatat`).
//! - [`recipe`]: gathers recipe parts (code files, tool versions).
//! - [`exec`]: runs one item into a temp file and publishes it atomically,
//!   observed (issue 24) unless the stage says `observe = false`.
//! - [`deps`]: observed dependencies: recorded after an item, checked at plan.
//! - [`engine`]: plan, run, adopt, verify, export, status.
//! - [`error`]: the error type.

pub mod compare;
pub mod config;
pub mod declared;
pub mod deps;
pub mod discover;
pub mod engine;
pub mod error;
pub mod exec;
pub mod hash;
pub mod inputs;
pub mod recipe;
pub mod spec;
pub mod stat;

pub use engine::{
    AdoptReport, NoProgress, Pipeline, Progress, RunOptions, RunReport, StageReport, VerifyItem,
    VerifyOutcome,
};
pub use error::FilesError;
pub use spec::{ItemContext, OnDelete, PipelineSpec, RecipeSpec, StageSpec, Transform};

/// Nanoseconds since the Unix epoch, from the wall clock. The only clock read
/// in the file stages; the planner receives instants, never reads them.
pub fn now_ns() -> i64 {
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_nanos().min(i64::MAX as u128) as i64,
        Err(_) => 0,
    }
}
