//! Ingestion on shared state: several `highwater ingest` processes (on one
//! machine or many) land one source's windows together, each window once.
//!
//! 1. **Plan, or join a plan.** When the source has no open window in the
//!    work queue (stage `ingest:SOURCE`), one process takes the source's
//!    lease, settles what dead runs left (skipping windows another live
//!    process holds), decides the windows owed exactly as a single run
//!    would (with their id ranges, for `append_id`), and queues them under
//!    that lease's fence. Others wait for the lease and join.
//! 2. **Claim windows** with `FOR UPDATE SKIP LOCKED`; each claimed window
//!    runs under a lease of its own (`ingest:SOURCE@START`) with a
//!    heartbeat, which fences its record and bookmark commits as the source
//!    lease fences a single run's. The bookmark moves by compare-and-set
//!    over contiguous published windows, retried against the others.
//! 3. **Finish.** The planner waits for the queue to close, then under the
//!    source lease moves the horizon (`commit_order`) when every queued
//!    window is published, and checks continuity.
//!
//! Compaction takes the source lease and waits for every window lease of
//! the source to lapse; a window waits for the source lease to be free
//! before it starts: each side sees the other's lease, so a period is never
//! swapped under a window being published into it.

use crate::engine::{Ctx, IngestOptions, IngestReport, Ingestor, WindowOutcome, WindowPlan};
use crate::error::IngestError;
use crate::source;
use highwater_core::window::format_rfc3339;
use highwater_store::lease::{host, now_ns, owner_id, ClaimHeartbeat, Heartbeat, LEASE_POLL_MS};
use highwater_store::{Claim, Fence, FleetProcess, StateStore, WindowStatus, WorkQueue};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What the planner queues for a window.
#[derive(Serialize, Deserialize)]
struct Payload {
    k: i64,
    /// `append_id`: the id range given out at plan time.
    id_range: Option<(Option<i64>, i64)>,
}

fn queue(store: &mut dyn StateStore) -> &mut dyn WorkQueue {
    store
        .as_queue()
        .expect("shared ingestion opens a store with a work queue")
}

/// The planner's part, kept for the finish.
struct Planned {
    report: IngestReport,
    moved: BTreeMap<String, String>,
    horizon: Option<i64>,
    ks: Vec<i64>,
}

impl Ingestor {
    fn stage(&self) -> String {
        format!("ingest:{}", self.t.spec.name)
    }

    pub(crate) fn run_shared(&self, opts: &IngestOptions) -> Result<IngestReport, IngestError> {
        let stage = self.stage();
        let lease_ns = self.t.spec.lease_duration_s as i64 * 1_000_000_000;
        let owner = owner_id();
        let mut store = self.state.open()?;
        queue(store.as_mut()).register(&FleetProcess {
            owner: owner.clone(),
            host: host(),
            pid: std::process::id() as i64,
            command: format!("ingest {}", self.t.spec.name),
            ..FleetProcess::default()
        })?;
        let _claims = ClaimHeartbeat::start(&self.state, owner.clone(), lease_ns)?;
        let bookmark_before = store.bookmark(&self.t.spec.name)?;
        let (planned, plan_lost) = self.plan_or_join(opts, store.as_mut(), &stage)?;
        let mut outcomes = Vec::new();
        let mut claimed = 0usize;
        let mut takeovers = 0usize;
        loop {
            // Only windows queued under this process's recipe: a window
            // is never landed by a recipe other than its plan's.
            let claims = queue(store.as_mut()).claim_recipe(
                &stage,
                &owner,
                opts.max_parallel.clamp(1, 64),
                lease_ns,
                &self.t.recipe,
            )?;
            if claims.is_empty() {
                if queue(store.as_mut()).pending(&stage)?.open() == 0 {
                    break;
                }
                // Open windows of another recipe's plan: refused, naming
                // both (another deploy queued them meanwhile).
                self.check_queued_recipe(store.as_mut(), &stage)?;
                std::thread::sleep(Duration::from_millis(LEASE_POLL_MS));
                continue;
            }
            claimed += claims.len();
            takeovers += claims.iter().filter(|c| c.takeover).count();
            let done = self.run_claims(&claims, opts)?;
            let finished: Vec<(String, i64, Option<highwater_core::Entry>)> = claims
                .iter()
                .map(|c| (c.item.clone(), c.token, None))
                .collect();
            queue(store.as_mut()).complete(&stage, &owner, &finished, 0)?;
            outcomes.extend(done);
        }
        outcomes.sort_by(|a, b| a.start.cmp(&b.start));
        let mut report = match planned {
            Some(p) => self.finish_shared(p, &outcomes)?,
            None => IngestReport {
                source: self.t.spec.name.clone(),
                bookmark_before: bookmark_before.map(|b| format_rfc3339(b.last_end_us)),
                bookmark_after: None,
                windows: Vec::new(),
                warnings: Vec::new(),
                check_failures: 0,
                loads: Vec::new(),
            },
        };
        report.bookmark_after = store
            .bookmark(&self.t.spec.name)?
            .map(|b| format_rfc3339(b.last_end_us));
        report.windows = outcomes;
        if let Some(why) = plan_lost {
            // Nothing this run owed was queued: not done, so exit 1.
            report.check_failures += 1;
            report.warnings.push(format!(
                "planning stopped: {why} before its windows were queued; nothing was queued by this run. Run `highwater ingest {}` again",
                self.t.spec.name
            ));
        }
        report.warnings.push(format!(
            "shared state: this process landed {claimed} window(s) of the fleet's ({takeovers} taken over from an expired claim)"
        ));
        queue(store.as_mut()).finish(&owner)?;
        Ok(report)
    }

    fn plan_or_join(
        &self,
        opts: &IngestOptions,
        store: &mut dyn StateStore,
        stage: &str,
    ) -> Result<(Option<Planned>, Option<String>), IngestError> {
        if queue(store).pending(stage)?.open() > 0 {
            self.check_queued_recipe(store, stage)?;
            return Ok((None, None));
        }
        // Planners hold the source lease briefly; wait for it.
        self.leased(true, |locked, fence, _lost| {
            let mut s = locked.lock().unwrap_or_else(|e| e.into_inner());
            if queue(s.as_mut()).pending(stage)?.open() > 0 {
                self.check_queued_recipe(s.as_mut(), stage)?;
                return Ok((None, None));
            }
            drop(s);
            let plan: WindowPlan = self.plan_windows(opts, locked, fence)?;
            let items: Vec<(String, String)> = plan
                .ks
                .iter()
                .map(|&k| {
                    let p = Payload {
                        k,
                        id_range: plan.id_ranges.get(&k).copied(),
                    };
                    (
                        format!("{k:012}"),
                        serde_json::to_string(&p).expect("plain data"),
                    )
                })
                .collect();
            let mut s = locked.lock().unwrap_or_else(|e| e.into_inner());
            let recipe_plan = highwater_store::QueuePlan {
                recipe: self.t.recipe.clone(),
                owner: owner_id(),
                host: host(),
                pid: std::process::id() as i64,
                planned_at_ns: now_ns(),
                replaced: Vec::new(),
                holders: Vec::new(),
            };
            match queue(s.as_mut()).enqueue_plan(
                stage,
                &Default::default(),
                &items,
                fence,
                &recipe_plan,
            )? {
                highwater_store::WindowCommit::Done => Ok((
                    Some(Planned {
                        report: plan.report,
                        moved: plan.moved,
                        horizon: plan.horizon,
                        ks: plan.ks,
                    }),
                    None,
                )),
                // The source lease was lost while planning: nothing queued;
                // the next run plans again, and this one says so.
                _ => {
                    drop(s);
                    Ok((None, Some(self.lost_to(locked, fence))))
                }
            }
        })
    }

    /// Refuses to join a queue of open windows planned under another
    /// recipe (a rolling deploy: the old and the new config side by side),
    /// naming both recipes and the processes holding the windows.
    fn check_queued_recipe(
        &self,
        store: &mut dyn StateStore,
        stage: &str,
    ) -> Result<(), IngestError> {
        let Some(plan) = queue(store).queue_plan(stage)? else {
            return Ok(());
        };
        if plan.recipe == self.t.recipe || queue(store).pending(stage)?.open() == 0 {
            return Ok(());
        }
        Err(IngestError::RecipeChanged {
            name: self.t.spec.name.clone(),
            message: format!(
                "its open windows were queued under recipe {} (by {} pid {} at {}), and this process runs recipe {}: another deploy of the source's config is landing them. Nothing was landed by this process. Let the other deploy finish (held now by {}), or stop it and run this config again",
                plan.recipe,
                plan.host,
                plan.pid,
                format_rfc3339(plan.planned_at_ns / 1000),
                self.t.recipe,
                if plan.holders.is_empty() {
                    "no process".to_string()
                } else {
                    plan.holders.join(", ")
                }
            ),
        })
    }

    /// Lands claimed windows, one thread each, every window under its own
    /// lease and heartbeat.
    fn run_claims(
        &self,
        claims: &[Claim],
        opts: &IngestOptions,
    ) -> Result<Vec<WindowOutcome>, IngestError> {
        let next = AtomicUsize::new(0);
        let out = Mutex::new(Vec::new());
        let parallel = if self.t.spec.chunking.is_some() {
            1
        } else {
            claims.len().max(1)
        };
        std::thread::scope(|scope| -> Result<(), IngestError> {
            let mut handles = Vec::new();
            for _ in 0..parallel {
                handles.push(scope.spawn(|| -> Result<(), IngestError> {
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        let Some(c) = claims.get(i) else {
                            return Ok(());
                        };
                        let o = self.run_claimed(c, opts)?;
                        out.lock().unwrap_or_else(|e| e.into_inner()).push(o);
                    }
                }));
            }
            for h in handles {
                h.join().expect("window workers do not panic")?;
            }
            Ok(())
        })?;
        Ok(out.into_inner().unwrap_or_else(|e| e.into_inner()))
    }

    fn run_claimed(&self, c: &Claim, opts: &IngestOptions) -> Result<WindowOutcome, IngestError> {
        let p: Payload = serde_json::from_str(&c.payload)
            .unwrap_or_else(|e| panic!("a payload this version queued does not parse: {e}"));
        let w = self.t.spec.grid.window(p.k);
        let lease_ns = self.t.spec.lease_duration_s as i64 * 1_000_000_000;
        let store = Mutex::new(self.state.open()?);
        let name = self.window_lease(w.start_us);
        let deadline =
            Instant::now() + Duration::from_secs(self.t.spec.lease_duration_s.saturating_mul(4));
        let owner = owner_id();
        // The window's own lease: free, or expired with its claim.
        let lease = highwater_store::lease::take(
            |at| {
                store
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .acquire_lease(
                        &name,
                        &owner,
                        &host(),
                        std::process::id() as i64,
                        at,
                        lease_ns,
                    )
            },
            true,
            deadline,
        )?;
        let lease = match lease {
            Ok(l) => l,
            Err(h) => return Err(IngestError::held(&name, h)),
        };
        let fence = Fence {
            name,
            token: lease.token,
        };
        let heartbeat = Heartbeat::start_in(&self.state, fence.clone(), lease_ns);
        // Not while a compaction holds the source (see the module notes).
        let source_lease = format!("ingest:{}", self.t.spec.name);
        loop {
            let held = store
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .lease(&source_lease)?;
            if held.is_none_or(|l| l.expires_at_ns <= now_ns()) {
                break;
            }
            if Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(LEASE_POLL_MS));
        }
        let records = store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .windows(&self.t.spec.name)?
            .into_iter()
            .map(|r| (self.t.spec.grid.index_of(r.start_us), r))
            .collect();
        let mut reader = source::open(&self.t.spec)?;
        let ctx = Ctx {
            store: &store,
            fence: &fence,
            lost: heartbeat.lost_flag(),
            records,
            columns: reader.columns()?,
            id_ranges: p.id_range.map(|r| (p.k, r)).into_iter().collect(),
            chunk_parallel: opts.max_parallel,
        };
        let outcome = self.run_one(p.k, reader.as_mut(), &ctx);
        drop(heartbeat);
        let _ = store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .release_lease(&fence);
        outcome
    }

    /// The planner's finish, under the source lease once more.
    fn finish_shared(
        &self,
        p: Planned,
        own: &[WindowOutcome],
    ) -> Result<IngestReport, IngestError> {
        self.leased(true, |store, fence, lost| {
            // Every planned window's fate, whoever landed it.
            let records: BTreeMap<i64, _> = store
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .windows(&self.t.spec.name)?
                .into_iter()
                .map(|r| (r.start_us, r))
                .collect();
            let all: Vec<WindowOutcome> =
                p.ks.iter()
                    .map(|&k| {
                        let w = self.t.spec.grid.window(k);
                        let published = records
                            .get(&w.start_us)
                            .is_some_and(|r| r.status == WindowStatus::Published);
                        WindowOutcome {
                            start: format_rfc3339(w.start_us),
                            end: format_rfc3339(w.end_us),
                            path: self.t.window_path(&w).0,
                            status: if published { "published" } else { "failed" },
                            rows: 0,
                            duration_ms: 0,
                            warnings: Vec::new(),
                            error: None,
                        }
                    })
                    .collect();
            let mut r =
                self.finish_windows(p.report, all, &p.moved, p.horizon, store, fence, lost)?;
            r.windows = own.to_vec();
            self.load_owed(&mut r, store, fence)?;
            Ok(r)
        })
    }
}
