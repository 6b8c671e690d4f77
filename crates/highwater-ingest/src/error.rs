//! The error type of ingestion. Every variant names the source, and the
//! window or file where there is one, and says what to do next.

use highwater_core::window::TimeError;
use highwater_store::StoreError;
use std::path::PathBuf;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum IngestError {
    #[error("{path}: [sources.{name}] {message}")]
    Config {
        path: PathBuf,
        name: String,
        message: String,
    },
    #[error("no source named `{name}`; the config has: {known}")]
    UnknownSource { name: String, known: String },
    #[error("source `{name}`: the environment variable {var} is not set; export the connection string in it (it is never logged)")]
    MissingEnv { name: String, var: String },
    #[error("source `{name}`: [sources.{name}.load] url_env names {var}, which is not set; export the warehouse's connection string in it (it is never logged). Nothing was touched")]
    LoadEnv { name: String, var: String },
    #[error("source `{name}`, window {window}: loading into {table}: {message}")]
    Load {
        name: String,
        window: String,
        table: String,
        message: String,
    },
    #[error("source `{name}`: cannot connect: {message}")]
    Connect { name: String, message: String },
    #[error("source `{name}`, window {window}: {message}")]
    Read {
        name: String,
        window: String,
        message: String,
    },
    #[error("source `{name}`: {message}")]
    Schema { name: String, message: String },
    #[error("source `{name}`, window {window}: object storage: {message}")]
    Storage {
        name: String,
        window: String,
        message: String,
    },
    #[error("source `{name}`: {message}")]
    RecipeChanged { name: String, message: String },
    #[error("source `{name}`: another ingest holds the lease (owner {owner}, host {host}, pid {pid}) until {expires}; wait for it, or re-run with --wait")]
    Held {
        name: String,
        owner: String,
        host: String,
        pid: i64,
        expires: String,
    },
    #[error(transparent)]
    Time(#[from] TimeError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{op} {path}: {err}")]
    Io {
        op: &'static str,
        path: PathBuf,
        err: std::io::Error,
    },
    #[error("writing Parquet {path}: {message}")]
    Parquet { path: PathBuf, message: String },
}

impl IngestError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, err: std::io::Error) -> Self {
        IngestError::Io {
            op,
            path: path.into(),
            err,
        }
    }
}

impl IngestError {
    /// A lease that stays held by another owner, named with its holder.
    pub(crate) fn held(name: &str, h: highwater_store::Lease) -> IngestError {
        IngestError::Held {
            name: name.to_string(),
            owner: h.owner,
            host: h.host,
            pid: h.pid,
            expires: highwater_core::window::format_rfc3339(h.expires_at_ns / 1000),
        }
    }
}
