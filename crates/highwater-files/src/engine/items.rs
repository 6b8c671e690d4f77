//! Planning a stage whose items come from an [`ItemSource`] rather than
//! globs (issue 49): the same plan as over files, with each item's
//! evidence the digest of its parts, held items kept out of the plan, and
//! each changed item's parts compared with those its output was made from.
//!
//! What an output is made from is kept as one member entry per part
//! (`kind = member`, the part's key, the BLAKE3 of its digest, `output`
//! naming the item), refreshed with the plan that runs the item: a run
//! makes each item from the parts its plan saw, as it records the item's
//! evidence from that plan. They are read only for a changed item, so a
//! no-change plan pays one load of small rows for them, and they stay out
//! of the dependency sets, which the items of a stage share.

use super::{Names, Observed, Pipeline, Stage};
use crate::discover::{self, Found, OutputScan};
use crate::error::FilesError;
use crate::inputs::{self, Discovered, ItemSource, Part};
use crate::now_ns;
use highwater_core::evidence::{Algo, Digest};
use highwater_core::plan::{plan_items_with_deps, Held, Observation, Reason, StagePlan};
use highwater_core::{Entries, Entry, EntryKind, Stat, Status};
use highwater_store::{StageEntries, StateStore};
use rayon::prelude::*;
use std::collections::HashMap;

impl Pipeline {
    /// Discovery, evidence and the plan of a stage over an item source.
    /// Reads the source's records; writes nothing.
    pub(super) fn observe_items(
        &self,
        st: &Stage,
        src: &dyn ItemSource,
        rehash: bool,
        prev: Option<StageEntries>,
        open: Option<&dyn StateStore>,
    ) -> Result<Observed, FilesError> {
        let name = &st.spec.name;
        // One connection, in turn (the caller's when it holds one open):
        // the items' records live beside the entries, and two connections
        // opened at once waited on each other longer than the two reads
        // take (issue 49).
        let opened;
        let store = match open {
            Some(s) => s,
            None => {
                opened = self.open_store()?;
                opened.as_ref()
            }
        };
        let mut settings = st.settings.clone();
        settings.rehash |= rehash;
        let deps_of = |entries: &StageEntries| self.changed_deps(st, entries, &settings);
        let at = now_ns();
        let ((prev, changed_deps), mut found) = match prev {
            Some(p) => {
                let deps = deps_of(&p)?;
                ((p, deps), src.discover(store)?)
            }
            None => self.load_beside(store, name, deps_of, || src.discover(store))?,
        };
        let dep = |item: &str| changed_deps.get(item).cloned();
        // Rendered and hashed on every thread: a no-change plan over 1,000
        // windows reads no file per item, so these are most of its work.
        let outputs = found
            .par_iter()
            .map(|d| self.render_item(st, &d.relpath))
            .collect::<Result<Vec<_>, _>>()?;
        let evidence: Vec<Digest> = found
            .par_iter()
            .map(|d| inputs::evidence(&d.parts))
            .collect();
        check_distinct(name, &found, &outputs)?;
        let (listing, output_dirs) = self.scan_item_outputs(st, &prev, &outputs, &settings)?;
        let rendered = outputs
            .iter()
            .zip(&found)
            .map(|(o, d)| (o.clone(), d.item.clone()))
            .collect();
        let plan_now = |found: &[Discovered]| {
            let (observations, held) =
                observations(found, &outputs, &evidence, &prev, &listing, at);
            let entries = without_held(&prev.items, &held);
            let plan = plan_items_with_deps(
                name,
                entries.as_ref().unwrap_or(&prev.items),
                observations,
                &settings,
                &dep,
            );
            (plan, held)
        };
        let (mut plan, mut held) = plan_now(&found);
        // What is too costly to check for every item at every plan (a
        // window's files on disk) is checked for the items this plan would
        // run only; one that fails is held, and the stage planned again.
        if self.confirm_to_run(src, &plan, &mut found)? {
            (plan, held) = plan_now(&found);
        }
        // The parts of the items that run (a no-change plan has none).
        let parts: HashMap<&str, &[Part]> = if plan.changed.is_empty() {
            HashMap::new()
        } else {
            found
                .iter()
                .filter(|d| d.hold.is_none())
                .map(|d| (d.item.as_str(), d.parts.as_slice()))
                .collect()
        };
        for c in plan.changed.iter().filter(|c| c.reason == Reason::Content) {
            let now: Vec<Part> = parts
                .get(c.item.as_str())
                .copied()
                .unwrap_or_default()
                .iter()
                .map(hashed)
                .collect();
            if let Some(why) = src.explain(&recorded_parts(&prev.members, &c.item), &now) {
                plan.details.insert(c.item.clone(), why);
            }
        }
        record_parts(&mut plan, &prev.members, &parts, &found, &held, at);
        plan.total += held.len();
        plan.held = held;
        let found_items: Vec<Found> = found
            .iter()
            .map(|d| Found::new(d.item.clone(), &d.relpath))
            .collect();
        Ok(Observed {
            plan,
            listing,
            output_dirs,
            prev,
            found: found_items,
            inputs: Vec::new(),
            rendered,
        })
    }

    /// The stage's entries with what `after` makes of them (which of the
    /// items' dependencies changed), and what `read` returns, at once: the
    /// entries' snapshot is decoded, and `after` run, on a pool thread
    /// while `read` uses the connection on this one (a no-change plan over
    /// 1,000 windows did one and then the other, issue 49). Without a
    /// current snapshot, the entries are loaded after `read`.
    fn load_beside<D: Send, T>(
        &self,
        store: &dyn StateStore,
        name: &str,
        after: impl Fn(&StageEntries) -> Result<D, FilesError> + Sync,
        read: impl FnOnce() -> Result<T, FilesError>,
    ) -> Result<((StageEntries, D), T), FilesError> {
        let loaded = |e: StageEntries| -> Result<(StageEntries, D), FilesError> {
            let d = after(&e)?;
            Ok((e, d))
        };
        let Some(later) = store.snapshot_later(name)? else {
            let entries = loaded(store.load(name)?)?;
            return Ok((entries, read()?));
        };
        let mut beside = None;
        let got = rayon::in_place_scope(|s| {
            s.spawn(|_| beside = later.read().map(&loaded));
            read()
        })?;
        let entries = match beside {
            Some(done) => done?,
            None => loaded(store.load(name)?)?,
        };
        Ok((entries, got))
    }

    /// Asks `src` to confirm the found items `plan` would run (not those
    /// deleted or unchanged) and holds those it refuses; true when any was.
    fn confirm_to_run(
        &self,
        src: &dyn ItemSource,
        plan: &StagePlan,
        found: &mut [Discovered],
    ) -> Result<bool, FilesError> {
        if plan.changed.iter().all(|c| c.reason == Reason::Deleted) {
            return Ok(false);
        }
        let index: HashMap<&str, usize> = found
            .iter()
            .enumerate()
            .map(|(i, d)| (d.item.as_str(), i))
            .collect();
        let to_run: Vec<usize> = plan
            .changed
            .iter()
            .filter(|c| c.reason != Reason::Deleted)
            .filter_map(|c| index.get(c.item.as_str()).copied())
            .collect();
        let asked: Vec<&Discovered> = to_run.iter().map(|&i| &found[i]).collect();
        let holds = src.confirm(&asked)?;
        let mut any = false;
        for (i, h) in to_run.into_iter().zip(holds) {
            if let Some(h) = h {
                found[i].hold = Some(h);
                any = true;
            }
        }
        Ok(any)
    }

    /// Every output the stage renders now, with its item.
    pub(super) fn rendered_items(
        &self,
        st: &Stage,
        src: &dyn ItemSource,
    ) -> Result<Vec<(String, String)>, FilesError> {
        src.discover(self.open_store()?.as_ref())?
            .into_iter()
            .map(|d| Ok((self.render_item(st, &d.relpath)?, d.item)))
            .collect()
    }

    fn render_item(&self, st: &Stage, relpath: &str) -> Result<String, FilesError> {
        let out = st
            .template
            .render(relpath)
            .map_err(|source| FilesError::Template {
                stage: st.spec.name.clone(),
                source,
            })?;
        Ok(match &st.output_place {
            Some(p) => format!("{p}:{out}"),
            None => out,
        })
    }

    /// The stage's outputs as they are: one listing of the template's
    /// root in object storage, else the output-folder cache.
    fn scan_item_outputs(
        &self,
        st: &Stage,
        prev: &StageEntries,
        outputs: &[String],
        settings: &highwater_core::plan::PlanSettings,
    ) -> Result<(OutputScan, Vec<String>), FilesError> {
        let name = &st.spec.name;
        match &st.output_place {
            Some(p) => Ok((
                discover::scan_objects(&*self.objects(name, p)?, p, name, st.template.root())?,
                Vec::new(),
            )),
            None => {
                let dirs = discover::output_dirs(outputs.iter().map(String::as_str));
                Ok((
                    discover::scan_output_dirs(
                        &self.root,
                        &dirs,
                        &prev.dirs,
                        settings.granularity_ns,
                    )?,
                    dirs,
                ))
            }
        }
    }
}

/// The observations of the found items that are not held, and the held
/// ones apart (sorted by item, as `found` is).
fn observations(
    found: &[Discovered],
    outputs: &[String],
    evidence: &[Digest],
    prev: &StageEntries,
    listing: &OutputScan,
    at: i64,
) -> (Vec<Observation>, Vec<Held>) {
    let mut held = Vec::new();
    let mut observations = Vec::with_capacity(found.len());
    for ((d, out), ev) in found.iter().zip(outputs).zip(evidence) {
        // A held item is neither run nor deleted: it leaves the plan, its
        // entry (if any) with it, and is reported apart.
        if let Some(h) = &d.hold {
            held.push(Held {
                item: d.item.clone(),
                output: out.clone(),
                why: h.why.clone(),
                waiting: h.waiting,
            });
            continue;
        }
        let recorded = prev.items.get(&d.item).is_some_and(|e| &e.output == out);
        observations.push(Observation {
            item: d.item.clone(),
            stat: Stat::default(),
            digests: std::iter::once(*ev).collect(),
            observed_at_ns: at,
            output_exists: listing.exists(out, recorded),
            output: out.clone(),
        });
    }
    (observations, held)
}

/// Two items rendering to one output would overwrite each other.
fn check_distinct(stage: &str, found: &[Discovered], outputs: &[String]) -> Result<(), FilesError> {
    let names = Names(outputs, |o: &String| o.as_str());
    if names.strictly_rising() {
        return Ok(());
    }
    let mut order: Vec<usize> = (0..outputs.len()).collect();
    order.sort_unstable_by(|&a, &b| outputs[a].cmp(&outputs[b]));
    match order.windows(2).find(|w| outputs[w[0]] == outputs[w[1]]) {
        Some(w) => Err(FilesError::OutputCollision {
            stage: stage.to_string(),
            output: outputs[w[0]].clone(),
            first: found[w[0].min(w[1])].item.clone(),
            second: found[w[0].max(w[1])].item.clone(),
        }),
        None => Ok(()),
    }
}

/// The entries without those of held items, when any held item has one.
fn without_held(items: &Entries, held: &[Held]) -> Option<Entries> {
    if !held.iter().any(|h| items.contains_key(&h.item)) {
        return None;
    }
    let keep: Vec<Entry> = items
        .values()
        .filter(|e| held.binary_search_by(|h| h.item.cmp(&e.item)).is_err())
        .cloned()
        .collect();
    Some(Entries::from_sorted(keep))
}

/// A part as its member entry keeps it: the BLAKE3 of its digest.
fn hashed(p: &Part) -> Part {
    Part {
        key: p.key.clone(),
        digest: member_digest(p).to_string(),
    }
}

fn member_digest(p: &Part) -> Digest {
    Digest::new(Algo::Set1, &blake3::hash(p.digest.as_bytes()))
}

/// The parts `item`'s output was made from, as its member entries say.
fn recorded_parts(members: &Entries, item: &str) -> Vec<Part> {
    members
        .values()
        .filter(|m| m.output == item)
        .filter_map(|m| {
            Some(Part {
                key: m.item.clone(),
                digest: m.digest?.to_string(),
            })
        })
        .collect()
}

/// Adds to the plan's own writes the member entries of the parts each
/// changed item is made from (those that differ from the record), and
/// prunes those of items no longer found.
///
/// An item of one part keeps none: its evidence already names its one
/// part and that part's digest, so a change of it is a change of that part
/// ([`ItemSource::explain`] is told so by an empty record). A stage over
/// windows by window kept a member per item, which doubled what every
/// plan loaded (issue 49); a store that has them prunes them.
fn record_parts(
    plan: &mut StagePlan,
    members: &Entries,
    parts: &HashMap<&str, &[Part]>,
    found: &[Discovered],
    held: &[Held],
    at: i64,
) {
    for c in plan.changed.iter().filter(|c| c.reason != Reason::Deleted) {
        let item_parts = parts.get(c.item.as_str()).copied().unwrap_or_default();
        if item_parts.len() == 1 {
            continue;
        }
        for p in item_parts {
            let digest = member_digest(p);
            let recorded = members.get(&p.key);
            if recorded.is_some_and(|m| m.digest == Some(digest) && m.output == c.item) {
                continue;
            }
            plan.refresh.push(Entry {
                kind: EntryKind::Member,
                item: p.key.clone(),
                digest: Some(digest),
                stat: Stat::default(),
                observed_at_ns: at,
                recipe: String::new(),
                output: c.item.clone(),
                status: Status::Ok,
                error: None,
                processed_at_ns: 0,
                duration_ms: 0,
            });
        }
    }
    if members.is_empty() {
        return;
    }
    // Searched, not hashed: items come sorted, and a set of every item
    // was a third of this at every plan. `None`: held, kept whatever it
    // covers (its entry stays as it was).
    let mut live: Vec<(&str, Option<usize>)> = found
        .iter()
        .filter(|d| d.hold.is_none())
        .map(|d| (d.item.as_str(), Some(d.parts.len())))
        .chain(held.iter().map(|h| (h.item.as_str(), None)))
        .collect();
    if !live.is_sorted_by(|a, b| a.0 <= b.0) {
        live.sort_unstable_by(|a, b| a.0.cmp(b.0));
    }
    let kept = |output: &str| match live.binary_search_by(|l| l.0.cmp(output)) {
        Ok(i) => live[i].1 != Some(1),
        Err(_) => false,
    };
    plan.prune_members = members
        .values()
        .filter(|m| !kept(m.output.as_str()))
        .map(|m| m.item.clone())
        .collect();
}
