//! A run on shared state: many `highwater run` processes, one PostgreSQL
//! store, each changed item processed once.
//!
//! Per stage, in stage order, every process:
//! 1. **plans, or joins a plan.** When the stage has no open item, one
//!    process takes the stage's plan lease (`plan:STAGE`), observes and plans
//!    as a single run would, applies the guard, removes deleted items'
//!    outputs, and in one fenced transaction commits the plan's own batch and
//!    queues the changed items. The others wait for the lease and then join
//!    the queued items.
//! 2. **claims batches** (`FOR UPDATE SKIP LOCKED`, each claim with a new
//!    token and an expiry on the server's clock) and runs them on `jobs`
//!    workers. A heartbeat thread on its own connection extends the claims
//!    every third of `lease_duration_s`; a process that dies or freezes
//!    stops extending them, and they become claimable again.
//! 3. **publishes only under a live claim.** Just before its output is
//!    renamed into place, a worker asks whether its token is still current
//!    with at least a third of the lease to run; if not, the output is
//!    discarded and counted as fenced.
//! 4. **completes under the fence.** The committer marks items done and
//!    writes their manifest entries in one transaction, each only if its
//!    token is still current, so a result from a claim that was taken over
//!    is never recorded.
//! 5. **waits for the stage to close** (no item todo or claimed) before the
//!    next stage, whose inputs may be this stage's outputs. The planner then
//!    records the output folders for the next plan's folder cache.
//!
//! **One recipe at a time** (issue 20: a rolling deploy runs two configs of
//! a stage side by side). The plan records its recipe with the queue, and a
//! claim takes items only while the stage's plan has the claimer's recipe.
//! A process whose recipe differs from the queued plan's is refused (exit
//! 2, naming both recipes and the hosts holding the items); a process whose
//! recipe a later plan replaced runs an older config and is refused too,
//! unless `--force` asks for a rollback. So no item is made by one recipe
//! and recorded under another, and two deploys never take turns remaking
//! every item.
//!
//! **A store lost mid-run** ends the process with exit 1 (`Unfinished`),
//! naming the store and what this process leaves unfinished. Its claims
//! expire and are taken over by the next run; nothing recorded is lost.

use super::{FailedItem, Observed, Pipeline, Progress, RunOptions, RunReport, Stage, StageReport};
use crate::deps::{self, DigestCache, RunWritten, Scope};
use crate::error::FilesError;
use crate::now_ns;
use highwater_core::evidence::Digest;
use highwater_core::guard;
use highwater_core::plan::{self, Observation, Reason};
use highwater_core::{Stat, Status};
use highwater_store::lease::{host, owner_id, ClaimHeartbeat, LEASE_POLL_MS};
use highwater_store::{
    Batch, Claim, DoneDeps, Fence, FleetProcess, LeaseOutcome, PgStore, QueuePlan, StateStore,
    WindowCommit, WorkQueue,
};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What the planner queues for a worker: everything needed to run the item
/// and to write its entry, so that workers never observe on their own.
#[derive(Serialize, Deserialize)]
struct Payload {
    output: String,
    relpath: String,
    stat: Stat,
    digests: Vec<String>,
    observed_at_ns: i64,
    output_exists: bool,
    reason: String,
    /// An aggregate's inputs (empty for a per-item stage).
    #[serde(default)]
    inputs: Vec<String>,
}

impl Payload {
    fn observation(&self, item: &str) -> Observation {
        Observation {
            item: item.to_string(),
            stat: self.stat,
            digests: self
                .digests
                .iter()
                .filter_map(|d| Digest::parse(d))
                .collect(),
            observed_at_ns: self.observed_at_ns,
            output: self.output.clone(),
            output_exists: self.output_exists,
        }
    }
}

/// What one process did in one stage of a shared run.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct FleetStage {
    /// This process planned the stage (others joined its plan).
    pub planned: bool,
    pub claimed: usize,
    /// Claims taken over from a process whose claim expired.
    pub takeovers: usize,
    /// Results refused by the fence: the claim had been taken over.
    pub fenced: usize,
}

/// Recipes a plan remembers as replaced, at most (a limit on everything).
const REPLACED_RECIPES_MAX: usize = 16;

/// Where a process of the fleet got to in a stage, for the message when it
/// stops unfinished.
#[derive(Default)]
struct Reached {
    /// Items claimed and not yet recorded done.
    in_hand: usize,
}

/// What planning under the lease came to.
enum Planned {
    /// Another process queued the stage first: join its items.
    Joined,
    /// Queued; these are the output folders to record once all are done
    /// (`None`: do not record them, a young temp output was kept).
    Queued(Option<Vec<String>>),
    /// The lease lapsed while planning (a very slow observe): nothing was
    /// queued; plan again.
    Lapsed,
}

fn queue(store: &mut dyn StateStore) -> &mut dyn WorkQueue {
    store
        .as_queue()
        .expect("a shared run opens a store with a work queue")
}

impl Pipeline {
    /// Runs every (or one) stage on shared state, with any number of other
    /// processes doing the same.
    pub(super) fn run_fleet(
        &self,
        opts: &RunOptions,
        progress: &dyn Progress,
    ) -> Result<RunReport, FilesError> {
        let mut store = self.open_store()?;
        let owner = owner_id();
        let lease_ns = (self.fleet.lease_duration_s as i64).saturating_mul(1_000_000_000);
        queue(store.as_mut()).register(&FleetProcess {
            owner: owner.clone(),
            host: host(),
            pid: std::process::id() as i64,
            command: "run".into(),
            ..FleetProcess::default()
        })?;
        let _heartbeat = ClaimHeartbeat::start(&self.state_location(), owner.clone(), lease_ns)?;
        let selected = self.select(opts.stage.as_deref())?;
        // Before any work: each stage's recipe against the fleet's plans,
        // two stages writing one path, output roots that cannot be written.
        for st in &selected {
            self.check_recipe(store.as_mut(), st, opts.force)?;
        }
        if self.stages.len() > 1 {
            let rendered = selected
                .iter()
                .map(|st| Ok((st.spec.name.as_str(), self.rendered_outputs(st)?)))
                .collect::<Result<Vec<_>, FilesError>>()?;
            self.check_against_all(
                &rendered
                    .iter()
                    .map(|(n, r)| (*n, r.as_slice()))
                    .collect::<Vec<_>>(),
            )?;
        }
        for st in &selected {
            self.check_writable(st)?;
        }
        // A process that cannot observe would make items whose recipe goes
        // unrecorded: refused before it plans or claims anything.
        for st in selected.iter().filter(|st| st.observes()) {
            super::observe_available(&st.spec.name)?;
        }
        let mut report = RunReport::default();
        for (i, st) in selected.iter().enumerate() {
            let mut r = StageReport {
                name: st.spec.name.clone(),
                ..StageReport::default()
            };
            let mut reached = Reached::default();
            let result = (|| -> Result<(), FilesError> {
                if st.template.is_aggregate() {
                    if let Some(why) = self.upstream_failures(store.as_ref(), st)? {
                        r.blocked = Some(why);
                        return Ok(());
                    }
                }
                self.fleet_stage(
                    store.as_mut(),
                    st,
                    &owner,
                    lease_ns,
                    opts,
                    progress,
                    &mut r,
                    &mut reached,
                )
            })();
            if let Err(e) = result {
                return Err(self.unfinished(e, &report, &r, &reached, &selected[i + 1..]));
            }
            report.stages.push(r);
        }
        queue(store.as_mut()).finish(&owner).map_err(|e| {
            self.unfinished(
                e.into(),
                &report,
                &StageReport::default(),
                &Reached::default(),
                &[],
            )
        })?;
        Ok(report)
    }

    /// The error a shared run ends with when it stops part way: a lost
    /// store, or any error after this process planned or claimed, is
    /// `Unfinished` (exit 1), naming what it did and what it leaves; any
    /// other error is a refusal with nothing touched (exit 2).
    fn unfinished(
        &self,
        e: FilesError,
        done: &RunReport,
        stage: &StageReport,
        reached: &Reached,
        later: &[&Stage],
    ) -> FilesError {
        let fleet = stage.fleet.clone().unwrap_or_default();
        let touched = fleet.planned
            || fleet.claimed > 0
            || stage.deleted > 0
            || done
                .stages
                .iter()
                .any(|s| s.fleet.as_ref().is_some_and(|f| f.planned || f.claimed > 0));
        let store_lost = matches!(e, FilesError::Store(_));
        if !store_lost && !touched {
            return e;
        }
        let mut parts = Vec::new();
        let earlier: usize = done.stages.iter().map(|s| s.processed).sum();
        parts.push(format!(
            "this process made and recorded {} item(s) of stage `{}`{}",
            stage.processed,
            stage.name,
            if done.stages.is_empty() {
                String::new()
            } else {
                format!(" (and {earlier} in the stages before)")
            }
        ));
        if reached.in_hand > 0 {
            parts.push(format!(
                "{} item(s) it had claimed are not recorded and become claimable again when their claims expire (lease_duration_s = {})",
                reached.in_hand, self.fleet.lease_duration_s
            ));
        }
        parts.push(format!(
            "the items of stage `{}` still queued are not done",
            stage.name
        ));
        let advice = if store_lost {
            "Nothing recorded is lost: once the state store answers again, run again; each item is still recorded once, and the outputs of unrecorded claims are made again"
        } else {
            "Fix the cause above, then run again; what was recorded stays"
        };
        super::unfinished(e, &stage.name, parts, later, advice)
    }

    /// Refuses to run stage `st` under a recipe other than the one of the
    /// stage's open plan, or under a recipe a later plan replaced (unless
    /// `force`: a rollback on purpose).
    fn check_recipe(
        &self,
        store: &mut dyn StateStore,
        st: &Stage,
        force: bool,
    ) -> Result<(), FilesError> {
        let name = &st.spec.name;
        let ours = &st.settings.recipe;
        let Some(plan) = queue(store).queue_plan(name)? else {
            return Ok(());
        };
        if &plan.recipe == ours {
            return Ok(());
        }
        let planned_by = format!(
            "{} pid {} at {}",
            plan.host,
            plan.pid,
            highwater_core::time::rfc3339_utc(plan.planned_at_ns)
        );
        if queue(store).pending(name)?.open() > 0 {
            return Err(FilesError::RecipeQueued {
                stage: name.clone(),
                ours: ours.clone(),
                theirs: plan.recipe.clone(),
                planned_by,
                holders: if plan.holders.is_empty() {
                    "no process at this moment".into()
                } else {
                    plan.holders.join(", ")
                },
            });
        }
        if plan.replaced.contains(ours) && !force {
            return Err(FilesError::RecipeReplaced {
                stage: name.clone(),
                ours: ours.clone(),
                theirs: plan.recipe.clone(),
                planned_by,
            });
        }
        Ok(())
    }

    /// One stage of a shared run. `report` is filled in as it goes, so
    /// that a run that stops part way can say what it did.
    #[allow(clippy::too_many_arguments)]
    fn fleet_stage(
        &self,
        store: &mut dyn StateStore,
        st: &Stage,
        owner: &str,
        lease_ns: i64,
        opts: &RunOptions,
        progress: &dyn Progress,
        report: &mut StageReport,
        reached: &mut Reached,
    ) -> Result<(), FilesError> {
        let started = Instant::now();
        let name = st.spec.name.clone();
        let recipe = st.settings.recipe.as_str();
        let run_id = store.begin_run(&name, now_ns())?;
        report.fleet = Some(FleetStage::default());
        let planned = self.plan_or_join(store, st, owner, lease_ns, opts, report)?;
        report.fleet = Some(FleetStage {
            planned: planned.is_some(),
            ..FleetStage::default()
        });
        let mut fleet = report.fleet.clone().unwrap_or_default();
        progress.stage_start(&name, report.changed);
        let jobs = opts.jobs.clamp(1, super::JOBS_MAX);
        let mut foreign = false;
        // Observed dependencies are recorded where each item runs (issue
        // 24), with what this process wrote in this stage kept out of them.
        // Another process's writes are not known here: an item that reads
        // one records it like any file, and its next plan settles it.
        let seeing = Seeing {
            scope: self.scope(st),
            written: RunWritten::default(),
            digests: DigestCache::default(),
        };
        loop {
            let claims = queue(store).claim_recipe(
                &name,
                owner,
                self.fleet.claim_batch_max.max(jobs),
                lease_ns,
                recipe,
            )?;
            if claims.is_empty() {
                if queue(store).pending(&name)?.open() == 0 {
                    break;
                }
                // Open items of another recipe's plan: that plan was queued
                // after ours closed, so all of ours are done; its items are
                // its processes' to do.
                if queue(store)
                    .queue_plan(&name)?
                    .is_some_and(|p| p.recipe != recipe)
                {
                    foreign = true;
                    break;
                }
                // Others hold live claims: wait for them to finish or
                // expire (then they are ours to take).
                std::thread::sleep(Duration::from_millis(LEASE_POLL_MS));
                continue;
            }
            fleet.claimed += claims.len();
            fleet.takeovers += claims.iter().filter(|c| c.takeover).count();
            report.fleet = Some(fleet.clone());
            reached.in_hand = claims.len();
            self.work_claims(
                store, st, owner, lease_ns, &claims, jobs, report, &mut fleet, progress, &seeing,
            )?;
            reached.in_hand = 0;
            report.fleet = Some(fleet.clone());
        }
        let retried = queue(store).pending(&name)?.retried;
        let i_planned = planned.is_some();
        if let (Some(Some(dirs)), 0, false) = (planned, retried, foreign) {
            // Every queued item is done: the folders are final for now. Not
            // recorded when a claim was taken over or a young temp output
            // was kept: the folders may hold a temp output of a process
            // that died, and must be listed (and swept) next time.
            store.commit(&Batch {
                dirs: vec![(
                    name.clone(),
                    crate::discover::record_output_dirs(&self.root, &dirs),
                )],
                ..Batch::default()
            })?;
        }
        if i_planned && st.observes() {
            // The sets that re-run items no longer name: pruned by the
            // planner once its plan closed (a limit on what the fleet keeps).
            queue(store).prune_dep_sets()?;
        }
        progress.stage_done(&name);
        report.duration_ms = started.elapsed().as_millis() as u64;
        report.failed.sort_by(|a, b| a.input.cmp(&b.input));
        let summary = serde_json::json!({
            "discovered": report.discovered,
            "changed": report.changed,
            "processed": report.processed,
            "deleted": report.deleted,
            "failed": report.failed.len(),
            "fleet": fleet,
        });
        let exit = if report.failed.is_empty() { 0 } else { 1 };
        store.finish_run(run_id, now_ns(), &summary, exit)?;
        report.fleet = Some(fleet);
        Ok(())
    }

    /// Plans the stage under its plan lease when nothing of it is open, or
    /// joins the plan another process made. `Some` when this process
    /// planned, with the output folders to record once all is done.
    fn plan_or_join(
        &self,
        store: &mut dyn StateStore,
        st: &Stage,
        owner: &str,
        lease_ns: i64,
        opts: &RunOptions,
        report: &mut StageReport,
    ) -> Result<Option<Option<Vec<String>>>, FilesError> {
        let name = &st.spec.name;
        let lease_name = format!("plan:{name}");
        loop {
            if queue(store).pending(name)?.open() > 0 {
                // Joined only under our own recipe.
                self.check_recipe(store, st, opts.force)?;
                return Ok(None);
            }
            let lease = match store.acquire_lease(
                &lease_name,
                owner,
                &host(),
                std::process::id() as i64,
                now_ns(),
                lease_ns,
            )? {
                LeaseOutcome::Acquired(l) => l,
                LeaseOutcome::Held(_) => {
                    std::thread::sleep(Duration::from_millis(LEASE_POLL_MS));
                    continue;
                }
            };
            let fence = Fence {
                name: lease_name.clone(),
                token: lease.token,
            };
            let result = self.plan_under_lease(store, st, owner, &fence, lease_ns, opts, report);
            store.release_lease(&fence)?;
            match result? {
                // Looked at again, recipe included, at the loop's top.
                Planned::Lapsed | Planned::Joined => continue,
                Planned::Queued(dirs) => return Ok(Some(dirs)),
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn plan_under_lease(
        &self,
        store: &mut dyn StateStore,
        st: &Stage,
        owner: &str,
        fence: &Fence,
        lease_ns: i64,
        opts: &RunOptions,
        report: &mut StageReport,
    ) -> Result<Planned, FilesError> {
        let name = st.spec.name.clone();
        // Checked again under the lease: another planner may have queued
        // between our look and our acquisition.
        if queue(store).pending(&name)?.open() > 0 {
            return Ok(Planned::Joined);
        }
        // Under the lease, the stage's plan cannot change: a recipe a later
        // plan replaced is refused here for good.
        self.check_recipe(store, st, opts.force)?;
        let before = queue(store).queue_plan(&name)?;
        let o: Observed = self.observe(st, opts.rehash, None)?;
        // Two stages onto one output path, checked again with the inputs
        // as they are now (issue 20): an upstream stage of this run, or
        // another process, may have made inputs since the check before any
        // stage. Refused before anything of this stage is queued or
        // touched.
        self.check_against_all(&[(name.as_str(), o.rendered.as_slice())])?;
        if let Err(r) = guard::check(
            &o.plan,
            st.spec.guard,
            st.spec.guard_items_min,
            o.listing.any(),
            opts.force,
        ) {
            return Err(FilesError::Guard { refusals: vec![r] });
        }
        *report = StageReport::from_plan(&o.plan);
        // Temp outputs younger than a claim may belong to a live process of
        // the fleet; older ones are a dead run's and are swept.
        let now = std::time::SystemTime::now();
        let mut kept_temp = false;
        for t in &o.listing.temps {
            let old = std::fs::symlink_metadata(t)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .is_some_and(|age| age.as_nanos() as i64 > lease_ns);
            kept_temp |= !old;
            if old && std::fs::remove_dir_all(t).is_err() {
                let _ = std::fs::remove_file(t);
            }
        }
        let batch = self.plan_batch(st, &o.plan, report);
        let mut items = Vec::new();
        for c in &o.plan.changed {
            if c.reason == Reason::Deleted {
                continue;
            }
            let obs = c
                .observation
                .as_ref()
                .expect("only deletions lack an observation");
            let payload = Payload {
                output: c.output.clone(),
                relpath: o
                    .found
                    .binary_search_by(|f| f.item.as_str().cmp(&c.item))
                    .map_or(String::new(), |i| o.found[i].relpath().to_string()),
                stat: obs.stat,
                digests: obs.digests.iter().map(|d| d.to_string()).collect(),
                observed_at_ns: obs.observed_at_ns,
                output_exists: obs.output_exists,
                reason: c.reason.as_str().to_string(),
                inputs: if st.template.is_aggregate() {
                    o.inputs.clone()
                } else {
                    Vec::new()
                },
            };
            let text = serde_json::to_string(&payload).expect("a payload is plain data");
            items.push((c.item.clone(), text));
        }
        // What this plan's recipe replaces: the previous plan's recipe and
        // every other recipe the stage's entries were made by.
        let ours = &st.settings.recipe;
        let mut replaced: Vec<String> = before
            .map(|p| {
                let mut r = p.replaced;
                r.push(p.recipe);
                r
            })
            .unwrap_or_default();
        replaced.extend(o.prev.items.values().map(|e| e.recipe.clone()));
        replaced.retain(|r| r != ours && !r.is_empty());
        let mut seen = std::collections::HashSet::new();
        // Newest last; the oldest are dropped first past the limit.
        replaced.reverse();
        replaced.retain(|r| seen.insert(r.clone()));
        replaced.truncate(REPLACED_RECIPES_MAX);
        replaced.reverse();
        let plan = QueuePlan {
            recipe: ours.clone(),
            owner: owner.to_string(),
            host: host(),
            pid: std::process::id() as i64,
            planned_at_ns: now_ns(),
            replaced,
            holders: Vec::new(),
        };
        match queue(store).enqueue_plan(&name, &batch, &items, fence, &plan)? {
            WindowCommit::Done if kept_temp => Ok(Planned::Queued(None)),
            WindowCommit::Done => Ok(Planned::Queued(Some(o.output_dirs))),
            _ => Ok(Planned::Lapsed),
        }
    }

    /// Runs one batch of claims on `jobs` workers; the calling thread
    /// completes them under the fence.
    #[allow(clippy::too_many_arguments)]
    fn work_claims(
        &self,
        store: &mut dyn StateStore,
        st: &Stage,
        owner: &str,
        lease_ns: i64,
        claims: &[Claim],
        jobs: usize,
        report: &mut StageReport,
        fleet: &mut FleetStage,
        progress: &dyn Progress,
        seeing: &Seeing,
    ) -> Result<(), FilesError> {
        let name = &st.spec.name;
        let var = self.state_url_env.as_deref().expect("shared store");
        let observes = st.observes();
        if observes && st.output_place.is_none() {
            let outputs: Vec<String> = claims
                .iter()
                .filter_map(|c| serde_json::from_str::<Payload>(&c.payload).ok())
                .map(|p| p.output)
                .collect();
            self.note_outputs(outputs.iter().map(String::as_str), &seeing.written);
        }
        let next = AtomicUsize::new(0);
        let jobs = jobs.min(claims.len()).max(1);
        // (claim index, outcome, ms); outcome None: fenced before publish,
        // Some(set): published, with its dependency set (id, body) if seen.
        type Made = Result<Option<Option<(String, String)>>, String>;
        let (tx, rx) =
            mpsc::sync_channel::<(usize, Made, u64)>(jobs * super::RESULTS_QUEUE_PER_WORKER);
        let margin_ns = lease_ns / 3;
        std::thread::scope(|scope| -> Result<(), FilesError> {
            for _ in 0..jobs {
                let tx = tx.clone();
                let next = &next;
                scope.spawn(move || {
                    // Each worker asks the fence on its own connection.
                    let mut fence_store = PgStore::open_env(var).ok();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(c) = claims.get(i) else { break };
                        let t0 = Instant::now();
                        let r = self.make_claimed(st, c, fence_store.as_mut(), margin_ns, seeing);
                        let ms = t0.elapsed().as_millis() as u64;
                        if tx.send((i, r, ms)).is_err() {
                            break;
                        }
                    }
                });
            }
            drop(tx);
            let mut done = Vec::new();
            let mut outcomes = Vec::new();
            let mut refused = 0;
            let mut dd = DoneDeps::default();
            let mut bodies = std::collections::HashSet::new();
            for (i, r, ms) in rx.iter() {
                let c = &claims[i];
                let payload: Payload = match serde_json::from_str(&c.payload) {
                    Ok(p) => p,
                    Err(e) => panic!("a payload this version queued does not parse: {e}"),
                };
                let obs = payload.observation(&c.item);
                let (status, error) = match &r {
                    Ok(Some(_)) => (Status::Ok, None),
                    Ok(None) => {
                        refused += 1;
                        continue;
                    }
                    Err(e) => (Status::Failed, Some(e.clone())),
                };
                // As in a local run: the set, or none (failed, or not
                // observed), replaces the item's old one with its entry.
                dd.sets.push(match &r {
                    Ok(Some(Some((id, body)))) => {
                        if bodies.insert(id.clone()) {
                            dd.bodies.push((id.clone(), body.clone()));
                        }
                        Some(id.clone())
                    }
                    _ => None,
                });
                let entry = if st.template.is_aggregate() {
                    plan::aggregate_entry(&obs, &st.settings, status, error, now_ns(), ms)
                } else {
                    plan::entry_for(&obs, &st.settings, status, error, now_ns(), ms)
                };
                done.push((c.item.clone(), c.token, Some(entry)));
                outcomes.push(r);
            }
            fleet.fenced += refused as usize;
            let kept = queue(store).complete_observed(name, owner, &done, Some(&dd), refused)?;
            for (((item, _, _), r), kept) in done.iter().zip(outcomes).zip(kept) {
                if !kept {
                    fleet.fenced += 1;
                    continue;
                }
                progress.item_done(name, item, r.is_ok());
                match r {
                    Ok(_) => report.processed += 1,
                    Err(error) => report.failed.push(FailedItem {
                        input: item.clone(),
                        error,
                    }),
                }
            }
            Ok(())
        })
    }

    /// Makes one claimed item's output, and publishes it only if the claim
    /// is still ours with `margin_ns` to run. `Ok(None)`: fenced.
    fn make_claimed(
        &self,
        st: &Stage,
        c: &Claim,
        fence_store: Option<&mut PgStore>,
        margin_ns: i64,
        seeing: &Seeing,
    ) -> Result<Option<Option<(String, String)>>, String> {
        let payload: Payload =
            serde_json::from_str(&c.payload).map_err(|e| format!("queued payload: {e}"))?;
        let mut fence_store = fence_store;
        let mut still_ours = || -> Result<bool, String> {
            match fence_store.as_deref_mut() {
                Some(s) => s
                    .holds(&st.spec.name, &c.item, c.token, margin_ns)
                    .map_err(|e| e.to_string()),
                None => Ok(false),
            }
        };
        let sink = seeing.written.sink(seeing.scope.keyer());
        let made = self.produce(
            st,
            &c.item,
            &payload.output,
            &payload.relpath,
            &payload.inputs,
            &mut still_ours,
            Some(sink),
        )?;
        Ok(made.map(|seen| {
            seen.map(|seen| {
                let scope = &seeing.scope;
                seeing
                    .written
                    .add(seen.written.iter().map(|p| scope.key(p)));
                let mut own: Vec<String> = if st.template.is_aggregate() {
                    payload.inputs.clone()
                } else {
                    vec![c.item.clone()]
                };
                own.push(payload.output.clone());
                deps::encode(&deps::record(
                    scope,
                    &seen,
                    &own,
                    &seeing.written,
                    &seeing.digests,
                ))
            })
        }))
    }
}

/// What a process of the fleet needs to record its items' observed
/// dependencies in one stage.
struct Seeing {
    scope: Scope,
    written: RunWritten,
    digests: DigestCache,
}
