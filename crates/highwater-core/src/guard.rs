//! The guard against suspicious mass rebuilds.
//!
//! A sudden full rebuild is usually a bug in change detection (a lost
//! manifest, a recipe id with a timestamp in it) rather than a real change.
//! When more than a threshold share of a stage's items look changed while
//! outputs already exist, the run is refused until the user says `--force`.

use crate::plan::{Reason, StagePlan};
use std::collections::BTreeMap;
use std::fmt;

/// Why a stage was refused.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    pub stage: String,
    pub changed: usize,
    pub total: usize,
    pub share: f64,
    pub threshold: f64,
    pub counts: BTreeMap<Reason, usize>,
    /// The dependency most of the changed items share (issue 24), named in
    /// the message: an interpreter upgrade says which interpreter.
    pub dependency: Option<String>,
}

impl Refusal {
    /// The most likely cause, named from the dominant reason.
    pub fn likely_cause(&self) -> &'static str {
        let top = self
            .counts
            .iter()
            .max_by_key(|(r, n)| (**n, std::cmp::Reverse(**r)))
            .map(|(r, _)| *r);
        match top {
            Some(Reason::Recipe) => {
                "the recipe was bumped (version, config, code files or tool versions changed)"
            }
            Some(Reason::New) => {
                "the manifest was lost or the state store moved, while outputs already exist"
            }
            Some(Reason::Missing) => "the outputs were deleted or moved",
            Some(Reason::Deleted) => {
                "most inputs disappeared (an empty or unmounted input folder?)"
            }
            Some(Reason::Failed) => "most items failed last time",
            Some(Reason::Dependency) => {
                "a file the commands were observed to read changed (an interpreter, a library or a shared script; `highwater plan` names it)"
            }
            Some(Reason::Size | Reason::Content | Reason::Mtime) | None => {
                "a mass re-delivery of the inputs (or a copy that changed every mtime)"
            }
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let counts: Vec<String> = self
            .counts
            .iter()
            .map(|(r, n)| format!("{} {}", r.as_str(), n))
            .collect();
        write!(
            f,
            "stage `{}`: {}/{} items ({:.0}%) look changed, above the guard of {:.0}% ({}). \
             Likely cause: {}. Nothing was touched. Check the manifest and the recipe, \
             then re-run with --force if this really is a full rebuild.",
            self.stage,
            self.changed,
            self.total,
            self.share * 100.0,
            self.threshold * 100.0,
            counts.join(", "),
            match &self.dependency {
                Some(d) => format!("{} (dependency {d})", self.likely_cause()),
                None => self.likely_cause().to_string(),
            }
        )
    }
}

/// Checks a stage plan against the guard. `outputs_exist` is whether the
/// output root already holds any file: a genuine first run into an empty
/// output location always proceeds.
///
/// Only changes that would redo or remove an existing output count: a
/// changed item whose output exists, and a deleted input. New items with no
/// output yet (a fresh delivery, or the rest of a run that crashed) are new
/// work, not a rebuild, and never trip the guard. Fewer than `items_min`
/// redone items never trip it either: one edited file in a stage of two is
/// not a suspicious mass rebuild; but every input gone always does.
pub fn check(
    plan: &StagePlan,
    threshold: f64,
    items_min: usize,
    outputs_exist: bool,
    force: bool,
) -> Result<(), Refusal> {
    let deleted = plan.count(Reason::Deleted);
    let total = plan.total + deleted;
    // A deleted input had a recorded output: deletions mean outputs exist,
    // even when the output folders are no longer listed (no input renders
    // to them). Every input vanishing is the likeliest sign of an empty or
    // unmounted input folder, refused however few the items.
    let outputs_exist = outputs_exist || deleted > 0;
    let items_min = if deleted > 0 && plan.total == 0 {
        1
    } else {
        items_min
    };
    let redo: Vec<_> = plan
        .changed
        .iter()
        .filter(|c| match &c.observation {
            None => true,
            Some(o) => o.output_exists,
        })
        .collect();
    if force || !outputs_exist || total == 0 || redo.is_empty() || redo.len() < items_min {
        return Ok(());
    }
    let share = redo.len() as f64 / total as f64;
    if share > threshold {
        let mut counts = BTreeMap::new();
        let mut deps: BTreeMap<&str, usize> = BTreeMap::new();
        for c in &redo {
            *counts.entry(c.reason).or_insert(0) += 1;
            if let Some(d) = &c.dependency {
                *deps.entry(d.as_str()).or_insert(0) += 1;
            }
        }
        let dependency = deps
            .into_iter()
            .max_by_key(|(d, n)| (*n, std::cmp::Reverse(*d)))
            .map(|(d, _)| d.to_string());
        return Err(Refusal {
            stage: plan.stage.clone(),
            changed: redo.len(),
            total,
            share,
            threshold,
            counts,
            dependency,
        });
    }
    Ok(())
}
