//! The manifest entry: the recorded evidence and recipe of a finished item.

use crate::evidence::{Digest, Stat};
use serde::{Deserialize, Serialize};

/// Whether an item finished. A failed item keeps its error and is retried on
/// the next run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Failed => "failed",
        }
    }
}

/// What an entry records. `Item` is a unit of work with an output; `Member`
/// is an input of an aggregate item, kept only as a stat cache so that an
/// unchanged aggregate does not re-read its inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    Item,
    Member,
}

impl EntryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::Item => "item",
            EntryKind::Member => "member",
        }
    }
}

/// One manifest entry. `item` is the input's path relative to the config
/// file's folder, with `/` separators.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub kind: EntryKind,
    pub item: String,
    /// `None` under signals that read no bytes (`mtime`, `exists`).
    pub digest: Option<Digest>,
    #[serde(flatten)]
    pub stat: Stat,
    /// Wall clock when the evidence was taken, for the racy rule.
    pub observed_at_ns: i64,
    pub recipe: String,
    pub output: String,
    pub status: Status,
    pub error: Option<String>,
    pub processed_at_ns: i64,
    pub duration_ms: u64,
}
