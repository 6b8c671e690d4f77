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

use super::{FailedItem, Observed, Pipeline, Progress, RunOptions, RunReport, Stage, StageReport};
use crate::error::FilesError;
use crate::now_ns;
use highwater_core::evidence::Digest;
use highwater_core::guard;
use highwater_core::plan::{self, Observation, Reason};
use highwater_core::{Stat, Status};
use highwater_store::lease::{host, owner_id, ClaimHeartbeat, LEASE_POLL_MS};
use highwater_store::{
    Batch, Claim, Fence, FleetProcess, LeaseOutcome, PgStore, StateStore, WindowCommit, WorkQueue,
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
        let mut report = RunReport::default();
        for st in selected {
            if st.template.is_aggregate() {
                if let Some(why) = self.upstream_failures(store.as_ref(), st)? {
                    report.stages.push(StageReport {
                        name: st.spec.name.clone(),
                        blocked: Some(why),
                        ..StageReport::default()
                    });
                    continue;
                }
            }
            let r = self.fleet_stage(store.as_mut(), st, &owner, lease_ns, opts, progress)?;
            report.stages.push(r);
        }
        queue(store.as_mut()).finish(&owner)?;
        Ok(report)
    }

    fn fleet_stage(
        &self,
        store: &mut dyn StateStore,
        st: &Stage,
        owner: &str,
        lease_ns: i64,
        opts: &RunOptions,
        progress: &dyn Progress,
    ) -> Result<StageReport, FilesError> {
        let started = Instant::now();
        let name = st.spec.name.clone();
        let run_id = store.begin_run(&name, now_ns())?;
        let mut report = StageReport {
            name: name.clone(),
            ..StageReport::default()
        };
        let mut fleet = FleetStage::default();
        let planned = self.plan_or_join(store, st, owner, lease_ns, opts, &mut report)?;
        fleet.planned = planned.is_some();
        progress.stage_start(&name, report.changed);
        let jobs = opts.jobs.clamp(1, super::JOBS_MAX);
        loop {
            let claims =
                queue(store).claim(&name, owner, self.fleet.claim_batch_max.max(jobs), lease_ns)?;
            if claims.is_empty() {
                if queue(store).pending(&name)?.open() == 0 {
                    break;
                }
                // Others hold live claims: wait for them to finish or
                // expire (then they are ours to take).
                std::thread::sleep(Duration::from_millis(LEASE_POLL_MS));
                continue;
            }
            fleet.claimed += claims.len();
            fleet.takeovers += claims.iter().filter(|c| c.takeover).count();
            self.work_claims(
                store,
                st,
                owner,
                lease_ns,
                &claims,
                jobs,
                &mut report,
                &mut fleet,
                progress,
            )?;
        }
        let retried = queue(store).pending(&name)?.retried;
        if let (Some(Some(dirs)), 0) = (planned, retried) {
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
        Ok(report)
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
            let result = self.plan_under_lease(store, st, &fence, lease_ns, opts, report);
            store.release_lease(&fence)?;
            match result? {
                Planned::Lapsed => continue,
                Planned::Joined => return Ok(None),
                Planned::Queued(dirs) => return Ok(Some(dirs)),
            }
        }
    }

    fn plan_under_lease(
        &self,
        store: &mut dyn StateStore,
        st: &Stage,
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
        let o: Observed = self.observe(st, opts.rehash, None)?;
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
                    .map_or(String::new(), |i| o.found[i].relpath.clone()),
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
        match queue(store).enqueue(&name, &batch, &items, fence)? {
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
    ) -> Result<(), FilesError> {
        let name = &st.spec.name;
        let var = self.state_url_env.as_deref().expect("shared store");
        let next = AtomicUsize::new(0);
        let jobs = jobs.min(claims.len()).max(1);
        // (claim index, outcome, ms); outcome None: fenced before publish.
        let (tx, rx) = mpsc::sync_channel::<(usize, Result<Option<()>, String>, u64)>(
            jobs * super::RESULTS_QUEUE_PER_WORKER,
        );
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
                        let r = self.make_claimed(st, c, fence_store.as_mut(), margin_ns);
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
            for (i, r, ms) in rx.iter() {
                let c = &claims[i];
                let payload: Payload = match serde_json::from_str(&c.payload) {
                    Ok(p) => p,
                    Err(e) => panic!("a payload this version queued does not parse: {e}"),
                };
                let obs = payload.observation(&c.item);
                let (status, error) = match &r {
                    Ok(Some(())) => (Status::Ok, None),
                    Ok(None) => {
                        refused += 1;
                        continue;
                    }
                    Err(e) => (Status::Failed, Some(e.clone())),
                };
                let entry = if st.template.is_aggregate() {
                    plan::aggregate_entry(&obs, &st.settings, status, error, now_ns(), ms)
                } else {
                    plan::entry_for(&obs, &st.settings, status, error, now_ns(), ms)
                };
                done.push((c.item.clone(), c.token, Some(entry)));
                outcomes.push(r);
            }
            fleet.fenced += refused as usize;
            let kept = queue(store).complete(name, owner, &done, refused)?;
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
    ) -> Result<Option<()>, String> {
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
        self.produce(
            st,
            &c.item,
            &payload.output,
            &payload.relpath,
            &payload.inputs,
            &mut still_ours,
            None,
        )
        // Observed dependencies are not recorded on a fleet yet (issue 24).
        .map(|o| o.map(|_| ()))
    }
}
