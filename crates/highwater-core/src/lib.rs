//! The pure core of highwater.
//!
//! Everything in this crate is a function of its arguments: it reads no file,
//! runs no command, asks no clock and talks to no database. Readers (in
//! `highwater-files`) observe the world and hand their observations here; the
//! planner turns `(manifest entries, observations, recipe id)` into a plan
//! where every changed item carries a reason; the committer (again outside
//! this crate) carries the plan out.
//!
//! Layout:
//! - [`evidence`]: stats, digests, change signals and the racy stat-cache rule.
//! - [`entry`]: the manifest entry, i.e. what is recorded for a finished item.
//! - [`plan`]: the planner and its reasons.
//! - [`guard`]: the refusal of suspicious mass rebuilds.
//! - [`mutate`]: seeded damage to inputs, for the fuzz tests.
//! - [`recipe`]: the recipe id, a hash of everything but the input.
//! - [`spelling`]: file names as lossless, printable text.
//! - [`template`]: output path templates and their escape checks.
//! - [`tile`]: Web Mercator tiles and the tiles a point, line or area covers.
//! - [`time`]: formatting of UTC timestamps without a clock.
//! - [`window`]: durations, RFC 3339, half-open windows and their grid.

pub mod entry;
pub mod evidence;
pub mod guard;
pub mod mutate;
pub mod plan;
pub mod recipe;
pub mod spelling;
pub mod template;
pub mod tile;
pub mod time;
pub mod window;

pub use entry::{Entries, Entry, EntryKind, Status};
pub use evidence::{Digest, Signal, Stat};
pub use plan::{Change, Observation, Reason, StagePlan};
