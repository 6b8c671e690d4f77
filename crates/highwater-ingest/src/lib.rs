//! Windowed batch ingestion from SQL sources.
//!
//! A source (`[sources.NAME]`) is a table or query in PostgreSQL or SQLite.
//! `ingest` lands every closed window since the bookmark as Parquet under a
//! path that is a pure function of the window: staged, validated, then made
//! visible in one rename, and only then is the bookmark moved, by
//! compare-and-set, under a fenced lease.
//!
//! Layout:
//! - [`config`]: `[sources.NAME]` into a [`SourceSpec`].
//! - [`source`]: reading a window from SQLite or PostgreSQL, streaming.
//! - [`sink`]: rows into Parquet record batches and files; the type mapping.
//! - [`copy`]: PostgreSQL's binary COPY stream decoded into the sink.
//! - [`digest`]: the order-free content digest of a window's rows.
//! - [`publish`]: staging, `_manifest.json`, the atomic swap.
//! - [`compact`]: windows of a period rolled up into a few files, swapped as one folder.
//! - [`delta`]: `format = "delta"`: windows as commits of one Delta Lake table; the schema rule.
//! - [`engine`]: which windows to run, checks, leases, bookmarks, the grid.
//! - [`pg`]: a blocking PostgreSQL connection that drains COPY in one runtime entry.
//! - [`periods`]: `compact`, and ingestion into compacted periods.
//! - [`load`]: published windows loaded into a warehouse table, one transaction each.
//! - [`error`]: the error type.

pub mod compact;
pub mod config;
pub mod copy;
pub mod delta;
pub mod digest;
pub mod engine;
pub mod error;
pub mod load;
mod objects;
pub mod periods;
pub mod pg;
pub mod publish;
mod shared;
pub mod sink;
pub mod source;

pub use config::SourceSpec;
pub use engine::{GridRow, IngestOptions, IngestReport, Ingestor, WindowOutcome};
pub use error::IngestError;
pub use periods::{CompactOptions, CompactReport};
