//! The planner: `(manifest entries, observations, recipe id) -> plan`.
//!
//! The planner is pure. The reader decides, through [`digest_needed`], which
//! files it must read, fills in the digests, and hands the observations here.

use crate::entry::{Entries, Entry, EntryKind, Status};
use crate::evidence::{compare_digests, is_racy, Algo, Digest, Sameness, Signal, Stat};
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};

/// Why an item is in the plan. The order of the variants is the order in
/// which they are checked: the first that applies is the reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Reason {
    /// No manifest entry: never processed (or the manifest was lost).
    New,
    /// The last attempt failed; it is retried.
    Failed,
    /// The recipe id differs: code, config or tools changed.
    Recipe,
    /// The recorded output is gone, so the item must be made again.
    Missing,
    /// The size differs: certainly changed, nothing read.
    Size,
    /// The digest differs.
    Content,
    /// The mtime differs (under the `mtime` signal), or the record was racy.
    Mtime,
    /// A file the item's command was observed to read, execute, look up or
    /// list changed (issue 24); [`Change::dependency`] names it.
    Dependency,
    /// The input is gone; its output is removed (or kept) and its entry pruned.
    Deleted,
}

impl Reason {
    pub const ALL: [Reason; 9] = [
        Reason::New,
        Reason::Failed,
        Reason::Recipe,
        Reason::Missing,
        Reason::Size,
        Reason::Content,
        Reason::Mtime,
        Reason::Dependency,
        Reason::Deleted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::New => "new",
            Reason::Failed => "failed",
            Reason::Recipe => "recipe",
            Reason::Missing => "missing",
            Reason::Size => "size",
            Reason::Content => "content",
            Reason::Mtime => "mtime",
            Reason::Dependency => "dependency",
            Reason::Deleted => "deleted",
        }
    }
}

/// An observation's digests: nearly always one, kept inline (a plan makes
/// one observation per item, and a list on the heap each was a tenth of a
/// no-change plan's time, issue 24).
pub type Digests = smallvec::SmallVec<[Digest; 1]>;

/// What a reader saw of one input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    pub item: String,
    pub stat: Stat,
    /// The digests the reader computed or reused, at most one per format.
    pub digests: Digests,
    /// Wall clock just before the stat and the read.
    pub observed_at_ns: i64,
    /// The rendered output path.
    pub output: String,
    pub output_exists: bool,
}

impl Observation {
    pub fn digest(&self, algo: Algo) -> Option<&Digest> {
        self.digests.iter().find(|d| d.algo() == algo)
    }
}

/// The settings of one stage that the planner needs.
#[derive(Clone, Debug)]
pub struct PlanSettings {
    pub signal: Signal,
    pub recipe: String,
    /// Timestamps closer than this to the moment of observation are not
    /// trusted (racy records); also the mtime signal's margin.
    pub granularity_ns: i64,
    /// Ignore the stat cache and read every byte.
    pub rehash: bool,
}

/// Which digest formats the reader must compute for an input, given its
/// previous entry and its current stat. Empty when the stat cache answers or
/// the signal reads no bytes.
pub fn digest_needed(prev: Option<&Entry>, stat: &Stat, s: &PlanSettings) -> Vec<Algo> {
    let Some(want) = s.signal.algo() else {
        return Vec::new();
    };
    let prev_algo = prev
        .and_then(|e| e.digest.as_ref())
        .map(Digest::algo)
        .filter(|a| matches!(a, Algo::Blake3 | Algo::Fingerprint1 | Algo::Data1));
    let cache_hit = match prev {
        Some(e) => {
            !s.rehash
                && e.digest.is_some()
                && e.stat == *stat
                && !is_racy(e.stat.mtime_ns, e.observed_at_ns, s.granularity_ns)
        }
        None => false,
    };
    let mut algos = Vec::new();
    match prev_algo {
        // The recorded format can be compared; reuse or recompute it.
        Some(a) if !cache_hit => algos.push(a),
        _ => {}
    }
    // The format the signal records now, when it is not the one on record.
    // A data digest carries the byte hash, so it stands for BLAKE3; whether
    // an item is compared as data is the reader's call (issue 49).
    let satisfied =
        prev_algo == Some(want) || (want == Algo::Blake3 && prev_algo == Some(Algo::Data1));
    if !satisfied && !algos.contains(&want) {
        algos.push(want);
    }
    algos
}

/// Carries the stat cache: when [`digest_needed`] asked for nothing, the
/// recorded digest stands for the content.
///
/// A recorded digest is not carried when the reader computed another one
/// over the same bytes (a BLAKE3 and a data digest, issue 49): the two are
/// compared by their byte halves, and a stale copy of the recorded one
/// would vouch for bytes that changed.
pub fn reuse_cached_digest(prev: Option<&Entry>, obs: &mut Observation) {
    if let Some(d) = prev.and_then(|e| e.digest.as_ref()) {
        let covered =
            d.byte_half().is_some() && obs.digests.iter().any(|o| o.byte_half().is_some());
        if obs.digest(d.algo()).is_none() && !covered {
            obs.digests.push(*d);
        }
    }
}

/// One item in a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub item: String,
    pub reason: Reason,
    pub output: String,
    /// `None` for a deleted item.
    pub observation: Option<Observation>,
    /// Under [`Reason::Dependency`]: the dependency that changed (relative
    /// to the project root when inside it, else absolute).
    pub dependency: Option<String>,
}

/// The plan of one stage.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StagePlan {
    pub stage: String,
    /// Items observed now (deleted ones are not counted).
    pub total: usize,
    pub unchanged: usize,
    /// Sorted by item, so the order is deterministic.
    pub changed: Vec<Change>,
    /// Entries of unchanged items whose evidence must be re-recorded (a new
    /// stat after a `touch`, a racy record re-read, a new digest format).
    pub refresh: Vec<Entry>,
    /// Member entries of an aggregate that disappeared.
    pub prune_members: Vec<String>,
    /// Said once per stage with the plan, e.g. that its recipe is declared
    /// only (`observe = false`).
    pub notes: Vec<String>,
    /// Items that may not run now, since part of what they cover is not
    /// ready (a stage over landed windows, issue 49: a window missing,
    /// failed or stale). Neither changed nor unchanged; counted in `total`.
    pub held: Vec<Held>,
    /// What changed inside a changed item, beyond its reason, by item (a
    /// window re-landed with other rows, issue 49).
    pub details: BTreeMap<String, String>,
    /// Unchanged items (or an aggregate's members) whose bytes changed but
    /// whose data, compared as data, did not (issue 49): a `VACUUM`, a
    /// re-export, a new gzip header. Counted in `unchanged`; their new byte
    /// hash is in `refresh`.
    pub layout: Vec<String>,
}

/// An item held back from running (issue 49).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Held {
    pub item: String,
    pub output: String,
    /// Why, naming the first part that is not ready and how many are not.
    pub why: String,
    /// Only waiting for parts not produced yet (windows after the newest
    /// landed one): normal at the frontier, not a failure.
    pub waiting: bool,
}

impl StagePlan {
    pub fn counts(&self) -> BTreeMap<Reason, usize> {
        let mut m = BTreeMap::new();
        for c in &self.changed {
            *m.entry(c.reason).or_insert(0) += 1;
        }
        m
    }

    pub fn count(&self, r: Reason) -> usize {
        self.changed.iter().filter(|c| c.reason == r).count()
    }
}

fn classify(prev: Option<&Entry>, obs: &Observation, s: &PlanSettings) -> Option<Reason> {
    let Some(prev) = prev else {
        return Some(Reason::New);
    };
    if prev.status == Status::Failed {
        return Some(Reason::Failed);
    }
    if prev.recipe != s.recipe {
        return Some(Reason::Recipe);
    }
    if !obs.output_exists {
        return Some(Reason::Missing);
    }
    evidence_changed(prev, obs, s)
}

/// Compares evidence only (no recipe, output or status), so that aggregate
/// members can use it too.
fn evidence_changed(prev: &Entry, obs: &Observation, s: &PlanSettings) -> Option<Reason> {
    match s.signal {
        Signal::Exists => None,
        Signal::Mtime => {
            if prev.stat.size != obs.stat.size {
                Some(Reason::Size)
            } else if prev.stat.mtime_ns != obs.stat.mtime_ns
                || is_racy(prev.stat.mtime_ns, prev.observed_at_ns, s.granularity_ns)
            {
                Some(Reason::Mtime)
            } else {
                None
            }
        }
        Signal::Hash | Signal::Fingerprint => {
            // Compared as data, a new size proves nothing (issue 49).
            let as_data = |d: &Digest| d.algo() == Algo::Data1;
            let data = prev.digest.as_ref().is_some_and(as_data) || obs.digests.iter().any(as_data);
            if prev.stat.size != obs.stat.size && !data {
                return Some(Reason::Size);
            }
            let Some(recorded) = prev.digest.as_ref() else {
                // Recorded under a signal that read no bytes: there is no
                // evidence of sameness, so the safe answer is "changed".
                return Some(Reason::Content);
            };
            match compare_digests(recorded, &obs.digests) {
                Sameness::Same | Sameness::Layout => None,
                Sameness::Changed => Some(Reason::Content),
                Sameness::Unknown => {
                    debug_assert!(false, "reader did not supply {:?}", recorded.algo());
                    Some(Reason::Content)
                }
            }
        }
    }
}

/// Whether an unchanged item's bytes changed while its data did not.
fn is_layout(prev: &Entry, obs: &Observation) -> bool {
    prev.digest
        .as_ref()
        .is_some_and(|d| compare_digests(d, &obs.digests) == Sameness::Layout)
}

/// The digest a new entry records: the signal's current format if computed,
/// else whatever the observation carries. A data digest is computed only for
/// an item compared as data, and it stands for BLAKE3 (issue 49).
fn recorded_digest(obs: &Observation, s: &PlanSettings) -> Option<Digest> {
    let want = s.signal.algo()?;
    let data = (want == Algo::Blake3)
        .then(|| obs.digest(Algo::Data1))
        .flatten();
    data.or(obs.digest(want)).or(obs.digests.first()).cloned()
}

/// Builds the manifest entry of an item from its observation. Used by the
/// committer for finished items and by the planner for refreshes.
pub fn entry_for(
    obs: &Observation,
    s: &PlanSettings,
    status: Status,
    error: Option<String>,
    processed_at_ns: i64,
    duration_ms: u64,
) -> Entry {
    Entry {
        kind: EntryKind::Item,
        item: obs.item.clone(),
        digest: recorded_digest(obs, s),
        stat: obs.stat,
        observed_at_ns: obs.observed_at_ns,
        recipe: s.recipe.clone(),
        output: obs.output.clone(),
        status,
        error,
        processed_at_ns,
        duration_ms,
    }
}

fn needs_refresh(prev: &Entry, obs: &Observation, s: &PlanSettings) -> bool {
    prev.stat != obs.stat
        || is_racy(prev.stat.mtime_ns, prev.observed_at_ns, s.granularity_ns)
        || recorded_digest(obs, s) != prev.digest
}

/// Plans a stage of per-input items.
pub fn plan_items(
    stage: &str,
    prev: &Entries,
    observations: Vec<Observation>,
    s: &PlanSettings,
) -> StagePlan {
    plan_items_with_deps(stage, prev, observations, s, &|_| None)
}

/// [`plan_items`], where `dep(item)` names a changed dependency of an item
/// whose own evidence is unchanged (issue 24); such an item is planned with
/// [`Reason::Dependency`].
pub fn plan_items_with_deps(
    stage: &str,
    prev: &Entries,
    mut observations: Vec<Observation>,
    s: &PlanSettings,
    dep: &dyn Fn(&str) -> Option<String>,
) -> StagePlan {
    let mut plan = StagePlan {
        stage: stage.to_string(),
        total: observations.len(),
        ..StagePlan::default()
    };
    // Observations and entries are both sorted by item, so one merge pass
    // pairs them and finds deletions without a hash set.
    observations.sort_unstable_by(|a, b| a.item.cmp(&b.item));
    let mut prev_iter = prev.iter().peekable();
    let deleted = |plan: &mut StagePlan, item: &String, e: &Entry| {
        plan.changed.push(Change {
            item: item.clone(),
            reason: Reason::Deleted,
            output: e.output.clone(),
            observation: None,
            dependency: None,
        })
    };
    for obs in observations {
        while let Some((item, e)) = prev_iter.next_if(|(k, _)| k.as_str() < obs.item.as_str()) {
            deleted(&mut plan, item, e);
        }
        let p = prev_iter
            .next_if(|(k, _)| k.as_str() == obs.item.as_str())
            .map(|(_, e)| e);
        debug_assert!(p.is_none_or(|e| e.kind == EntryKind::Item));
        match classify(p, &obs, s) {
            Some(reason) => plan.changed.push(Change {
                item: obs.item.clone(),
                reason,
                output: obs.output.clone(),
                observation: Some(obs),
                dependency: None,
            }),
            None if dep(&obs.item).is_some() => plan.changed.push(Change {
                item: obs.item.clone(),
                reason: Reason::Dependency,
                output: obs.output.clone(),
                dependency: dep(&obs.item),
                observation: Some(obs),
            }),
            None => {
                plan.unchanged += 1;
                let p = p.expect("unchanged implies a previous entry");
                if is_layout(p, &obs) {
                    plan.layout.push(obs.item.clone());
                }
                if needs_refresh(p, &obs, s) {
                    let mut e = p.clone();
                    e.stat = obs.stat;
                    e.observed_at_ns = obs.observed_at_ns;
                    e.digest = recorded_digest(&obs, s).or(e.digest);
                    plan.refresh.push(e);
                }
            }
        }
    }
    for (item, e) in prev_iter {
        deleted(&mut plan, item, e);
    }
    plan.changed.sort_by(|a, b| a.item.cmp(&b.item));
    plan
}

/// The item name of an aggregate stage's single item.
pub const AGGREGATE_ITEM: &str = "<all inputs>";

/// The member evidence that goes into an aggregate's set digest.
fn member_evidence(obs: &Observation, s: &PlanSettings) -> String {
    match s.signal {
        Signal::Exists => String::new(),
        Signal::Mtime => format!("{}:{}", obs.stat.size, obs.stat.mtime_ns),
        // Compared as data, only the data half: a layout change of a
        // member leaves the aggregate as it was (issue 49).
        Signal::Hash | Signal::Fingerprint => match recorded_digest(obs, s) {
            Some(d) => match d.data_half() {
                Some(half) => half.iter().fold(String::from("data1:"), |mut s, b| {
                    s.push_str(&format!("{b:02x}"));
                    s
                }),
                None => d.to_string(),
            },
            None => String::new(),
        },
    }
}

/// Plans an aggregate stage: one item whose evidence is the whole set of its
/// inputs. An added, changed or removed input re-runs it.
pub fn plan_aggregate(
    stage: &str,
    prev_item: Option<&Entry>,
    prev_members: &Entries,
    members: Vec<Observation>,
    output: &str,
    output_exists: bool,
    s: &PlanSettings,
) -> StagePlan {
    plan_aggregate_with_deps(
        stage,
        prev_item,
        prev_members,
        members,
        output,
        output_exists,
        s,
        &|_| None,
    )
}

/// [`plan_aggregate`] with a dependency check, as [`plan_items_with_deps`].
#[allow(clippy::too_many_arguments)]
pub fn plan_aggregate_with_deps(
    stage: &str,
    prev_item: Option<&Entry>,
    prev_members: &Entries,
    mut members: Vec<Observation>,
    output: &str,
    output_exists: bool,
    s: &PlanSettings,
    dep: &dyn Fn(&str) -> Option<String>,
) -> StagePlan {
    members.sort_by(|a, b| a.item.cmp(&b.item));
    let mut plan = StagePlan {
        stage: stage.to_string(),
        ..StagePlan::default()
    };
    let mut h = blake3::Hasher::new();
    let mut max_observed = 0i64;
    for m in &members {
        h.update(m.item.as_bytes());
        h.update(b"\0");
        h.update(member_evidence(m, s).as_bytes());
        h.update(b"\n");
        max_observed = max_observed.max(m.observed_at_ns);
        let p = prev_members.get(&m.item);
        let refresh = match p {
            None => true,
            Some(p) => needs_refresh(p, m, s) || evidence_changed(p, m, s).is_some(),
        };
        if p.is_some_and(|p| evidence_changed(p, m, s).is_none() && is_layout(p, m)) {
            plan.layout.push(m.item.clone());
        }
        if refresh {
            let mut e = entry_for(m, s, Status::Ok, None, 0, 0);
            e.kind = EntryKind::Member;
            e.recipe = String::new();
            e.output = String::new();
            plan.refresh.push(e);
        }
    }
    let seen: HashSet<&str> = members.iter().map(|m| m.item.as_str()).collect();
    plan.prune_members = prev_members
        .keys()
        .filter(|k| !seen.contains(k.as_str()))
        .cloned()
        .collect();
    if members.is_empty() {
        if let Some(p) = prev_item {
            plan.changed.push(Change {
                item: AGGREGATE_ITEM.to_string(),
                reason: Reason::Deleted,
                output: p.output.clone(),
                observation: None,
                dependency: None,
            });
        }
        return plan;
    }
    plan.total = 1;
    let obs = Observation {
        item: AGGREGATE_ITEM.to_string(),
        stat: Stat {
            size: members.len() as u64,
            ..Stat::default()
        },
        digests: smallvec::smallvec![Digest::new(Algo::Set1, &h.finalize())],
        observed_at_ns: max_observed,
        output: output.to_string(),
        output_exists,
    };
    // The set digest is the authority for an aggregate, whatever the signal
    // its members are judged by.
    let reason = match prev_item {
        None => Some(Reason::New),
        Some(p) if p.status == Status::Failed => Some(Reason::Failed),
        Some(p) if p.recipe != s.recipe => Some(Reason::Recipe),
        Some(_) if !output_exists => Some(Reason::Missing),
        Some(p) if p.digest.as_ref() != obs.digests.first() => Some(Reason::Content),
        Some(_) => None,
    };
    let dependency = if reason.is_none() {
        dep(AGGREGATE_ITEM)
    } else {
        None
    };
    let reason = reason.or(dependency.as_ref().map(|_| Reason::Dependency));
    match reason {
        Some(reason) => plan.changed.push(Change {
            item: obs.item.clone(),
            reason,
            output: obs.output.clone(),
            observation: Some(obs),
            dependency,
        }),
        None => plan.unchanged = 1,
    }
    plan
}

/// The entry an aggregate item records once its output is durable.
pub fn aggregate_entry(
    obs: &Observation,
    s: &PlanSettings,
    status: Status,
    error: Option<String>,
    processed_at_ns: i64,
    duration_ms: u64,
) -> Entry {
    Entry {
        kind: EntryKind::Item,
        item: obs.item.clone(),
        digest: obs.digests.first().cloned(),
        stat: obs.stat,
        observed_at_ns: obs.observed_at_ns,
        recipe: s.recipe.clone(),
        output: obs.output.clone(),
        status,
        error,
        processed_at_ns,
        duration_ms,
    }
}
