//! Kinds of item discovery besides the glob walk (issue 49).
//!
//! A stage over globs finds its items by walking folders; the engine does
//! that itself (`discover`). Any other kind of input is an [`ItemSource`]:
//! it lists the stage's items, sorted, each with the parts it covers and
//! their digests (its evidence) or why it is held back, and says what
//! `{files}` stands for when an item runs. The engine plans over what it
//! returns as over files, and records each item's parts with its output.
//!
//! One kind per file: [`windows`] (a source's landed windows). A third
//! kind is a file of its own implementing [`ItemSource`], a variant of
//! [`InputsSpec`] with its parser, and one line in [`open`].

pub mod windows;

use crate::error::FilesError;
use highwater_core::evidence::{Algo, Digest};
use highwater_core::template::Vars;
use highwater_store::StateStore;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// What a stage's `inputs` names when it is not a list of globs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InputsSpec {
    /// `{ source = "NAME", by = "window" | "day" | "month" }`.
    Windows(windows::WindowsSpec),
}

impl InputsSpec {
    /// Reads an `inputs` table; the error says what to write instead.
    pub fn parse(t: toml::Table) -> Result<InputsSpec, String> {
        if t.contains_key("source") {
            return windows::WindowsSpec::parse(t).map(InputsSpec::Windows);
        }
        Err(format!(
            "a table names another kind of input than globs, and {{ {} }} names none known; write {{ source = \"NAME\", by = \"day\" }} for a source's landed windows",
            t.keys().cloned().collect::<Vec<_>>().join(", ")
        ))
    }
}

impl InputsSpec {
    /// Reads `inputs` given as a JSON object (a Python declaration): its
    /// values are strings, as in the TOML table.
    pub fn from_json(v: &serde_json::Value) -> Result<InputsSpec, String> {
        let obj = v
            .as_object()
            .ok_or("inputs must be a list of globs or a table")?;
        let mut t = toml::Table::new();
        for (k, v) in obj {
            let s = v
                .as_str()
                .ok_or_else(|| format!("inputs: `{k}` must be a string"))?;
            t.insert(k.clone(), toml::Value::String(s.to_string()));
        }
        InputsSpec::parse(t)
    }
}

/// What the kinds of input read through: the program that opens a
/// pipeline gives them (the binary: the landed windows of `[sources]`
/// through `highwater-ingest`), so this crate depends on none of them.
#[derive(Clone, Default)]
pub struct Providers {
    pub landed: Option<Arc<dyn windows::Landed>>,
}

impl std::fmt::Debug for Providers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Providers")
            .field("landed", &self.landed.is_some())
            .finish()
    }
}

/// The registration of the kinds of input: one line per kind.
pub(crate) fn open(
    stage: &str,
    spec: &InputsSpec,
    providers: &Providers,
) -> Result<Box<dyn ItemSource>, FilesError> {
    match spec {
        InputsSpec::Windows(w) => Ok(Box::new(windows::Windows::open(stage, w, providers)?)),
    }
}

/// One part of an item, with the digest of its content: a window and the
/// order-free digest of its rows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    pub key: String,
    pub digest: String,
}

/// Why an item may not run now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    pub why: String,
    /// Only waiting for parts not produced yet (not a failure).
    pub waiting: bool,
}

/// One item an [`ItemSource`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Discovered {
    /// The item's name, unique in the stage; items come sorted by it.
    pub item: String,
    /// The end of `item` its templates render from.
    pub relpath: String,
    /// What it covers now, in a fixed order.
    pub parts: Vec<Part>,
    /// Set: the item is held, and `parts` are only those ready.
    pub hold: Option<Hold>,
}

/// One kind of input other than globs.
pub trait ItemSource: Send + Sync {
    /// The placeholders the stage's templates may use.
    fn vars(&self) -> Vars;

    /// Globs (relative to the config folder) of the files the items'
    /// commands read as their inputs: never recorded as dependencies, since
    /// the parts' digests are the evidence (a compaction rewrites the files
    /// and leaves the rows).
    fn input_globs(&self) -> Vec<String>;

    /// The stage's items now, sorted by item, read where they are
    /// recorded: `store` is the pipeline's state store, open (a plan reads
    /// its entries and the items through one connection, issue 49).
    fn discover(&self, store: &dyn StateStore) -> Result<Vec<Discovered>, FilesError>;

    /// Of `items` (found by the last `discover`), which a plan would run,
    /// the hold of each that may not run after all, in their order: checks
    /// too costly to make for every item at every plan (a window's files
    /// on disk) are made here, for the items that would run only. An item
    /// that will not run needs none: its output is already made from what
    /// its evidence says.
    fn confirm(&self, items: &[&Discovered]) -> Result<Vec<Option<Hold>>, FilesError>;

    /// What `{files}` stands for when the item with `relpath` runs.
    fn files(&self, relpath: &str) -> Result<Vec<String>, String>;

    /// What changed among an item's parts since its output was made
    /// (`recorded`), in words; `None` when nothing that can be named did.
    /// An item of one part keeps no record of it (its evidence names it):
    /// `recorded` is then empty, and the one part of `now` is what changed.
    fn explain(&self, recorded: &[Part], now: &[Part]) -> Option<String>;
}

/// The evidence of an item: BLAKE3 over its parts' keys and digests, in
/// their order. A set digest (`set1:`), as an aggregate's.
pub fn evidence(parts: &[Part]) -> Digest {
    // One buffer hashed at once: a `blake3::Hasher` per item cost more
    // than the hash of its few bytes (issue 49's 1,000-window plan).
    let len = parts.iter().map(|p| p.key.len() + p.digest.len() + 2).sum();
    let mut buf = Vec::with_capacity(len);
    for p in parts {
        buf.extend_from_slice(p.key.as_bytes());
        buf.push(b'\0');
        buf.extend_from_slice(p.digest.as_bytes());
        buf.push(b'\n');
    }
    Digest::new(Algo::Set1, &blake3::hash(&buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-shot hash is the digest states already hold: BLAKE3 fed
    /// each part's key, NUL, digest and newline in turn.
    #[test]
    fn evidence_is_the_incremental_hash_of_the_parts() {
        let parts: Vec<Part> = (0..40)
            .map(|i| Part {
                key: format!("orders@2026-01-01T{:02}:00:00Z", i % 24),
                digest: "rd1:3:".repeat(i % 7),
            })
            .collect();
        for n in [0, 1, 2, 24, 40] {
            let mut h = blake3::Hasher::new();
            for p in &parts[..n] {
                h.update(p.key.as_bytes());
                h.update(b"\0");
                h.update(p.digest.as_bytes());
                h.update(b"\n");
            }
            assert_eq!(
                evidence(&parts[..n]),
                Digest::new(Algo::Set1, &h.finalize()),
                "{n} parts"
            );
        }
    }
}
