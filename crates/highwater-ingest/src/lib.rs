//! Windowed batch ingestion from SQL sources.
//!
//! A source (`[sources.NAME]`) is a table or query in PostgreSQL or SQLite.
//! `ingest` lands every closed window since the bookmark as Parquet under a
//! path that is a pure function of the window: staged, validated, then made
//! visible in one rename, and only then is the bookmark moved, by
//! compare-and-set, under a fenced lease.
//!
//! Layout: the engine, which names no table format, and the formats
//! behind one trait.
//! - [`config`]: `[sources.NAME]` into a [`SourceSpec`].
//! - [`source`]: reading a window from SQLite or PostgreSQL, streaming.
//! - [`sink`]: rows into Parquet record batches and files; the type mapping.
//! - [`copy`]: PostgreSQL's binary COPY stream decoded into the sink.
//! - [`digest`]: the order-free content digest of a window's rows.
//! - [`engine`]: which windows to run, reading them, leases, bookmarks, the
//!   grid; `checks`: the checks a window passes before it is published;
//!   `shared`: windows shared by many processes on PostgreSQL state.
//! - [`periods`]: `compact`: which periods, under the source lease.
//! - [`landed`]: what a downstream reader of the windows may ask (issue
//!   49): each window's standing and row digest, its current files.
//! - `warehouse`: the loads a run owes; [`load`]: the warehouse client,
//!   one transaction per window.
//! - `format`: the `TableFormat` trait and its registration, one line per
//!   format; `table`: the format context (paths, spec, object store).
//! - `folders`: Parquet window folders (local rename, or version prefix
//!   and conditional manifest in a bucket; compacted periods as folders).
//! - [`delta`]: `format = "delta"`: windows as commits of one Delta Lake
//!   table.
//! - [`publish`], [`compact`]: staging and the atomic swap; rows of many
//!   windows rolled into a few files (both formats use them).
//! - [`pg`]: a blocking PostgreSQL connection that drains COPY in one runtime entry.
//! - `failpoints`: where the crash tests kill or hold a run.
//! - [`error`]: the error type.

mod checks;
pub mod compact;
pub mod config;
pub mod copy;
pub mod delta;
pub mod digest;
pub mod engine;
pub mod error;
mod failpoints;
mod folders;
mod format;
pub mod landed;
pub mod load;
pub mod periods;
pub mod pg;
pub mod publish;
mod shared;
pub mod sink;
pub mod source;
mod table;
mod warehouse;

pub use config::SourceSpec;
pub use engine::{GridRow, IngestOptions, IngestReport, Ingestor, WindowOutcome};
pub use error::IngestError;
pub use periods::{CompactOptions, CompactReport};
