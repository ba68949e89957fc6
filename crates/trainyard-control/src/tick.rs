//! One round of the control loop: observations, the working set, a scheduling cycle when anything it reads
//! changed, its decisions committed, queued-too-long alarms, reconciliation.

use crate::active::{ActiveKey, Entry};
use crate::error::CommandError;
use crate::handles::*;
use crate::place::{Placement, snapshot_for};
use crate::policy::Step;
use crate::report::{TickReport, us_since};
use crate::{Control, alarms};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;
use trainyard_core::Catalog;
use trainyard_core::lifecycle::{Reason, Status};
use trainyard_runtime::{Backend, StopCause};
use trainyard_sched::{Decision, WaitReason, schedule};
use trainyard_store::TaskRecord;

/// How often queued tasks are checked against queued-too-long alarms (their thresholds are in seconds).
const QUEUE_ALARM_EVERY_MS: i64 = 1_000;

impl<B: Backend> Control<B> {
    /// One round: what the backend reports, then scheduling, then the plan, then reconciling.
    pub async fn tick(&mut self, now_ms: i64) -> Result<TickReport, CommandError> {
        let mut report = TickReport::default();
        let t0 = Instant::now();
        for obs in self.backend.poll(now_ms.max(0) as u64).await {
            report.observations += 1;
            if !self.observe(&obs, now_ms).await? {
                report.conflicts += 1;
            }
        }

        report.phases.observe_us = us_since(t0);
        let t0 = Instant::now();
        for (t, spec) in self.arrivals.take() {
            self.absorb(t, Some(spec));
        }
        self.sync_active(now_ms).await?;
        // A stored task that cannot be read any more is left alone (and reported once); it must not stop the
        // loop for every other task.
        self.read_missing_specs(now_ms).await?;
        report.phases.sync_us = us_since(t0);
        // The working set is lent to this tick's readers as it is (no copies of its records): taken out for
        // the tick, and put back whatever happens.
        let active = std::mem::take(&mut self.active);
        let result = self.tick_over(&active, now_ms, &mut report).await;
        self.active = active;
        result?;
        // What this tick admitted or preempted starts or stops next.
        report.settling += report.admitted + report.preempted;
        Ok(report)
    }

    /// The rest of a tick, over the working set: the plan, queued-too-long alarms, reconciliation.
    async fn tick_over(
        &mut self,
        active: &BTreeMap<ActiveKey, Entry>,
        now_ms: i64,
        report: &mut TickReport,
    ) -> Result<(), CommandError> {
        let entries: Vec<&Entry> = active.values().filter(|e| e.spec.is_some()).collect();
        let holding: Vec<&TaskRecord> =
            entries.iter().map(|e| &*e.record).filter(|t| t.status != Status::Queued).collect();
        report.settling = holding
            .iter()
            .filter(|t| matches!(t.status, Status::Admitted | Status::Starting | Status::Stopping))
            .count() as u32;
        // The plan is a function of the active tasks, the catalog, the loop's own hints (nominated nodes,
        // excluded nodes, autoscaling wants) and, through starvation, the clock: while none of them changed, it
        // would come out the same, and the last one stands (a deep queue that nothing moves costs no cycle).
        let catalog = self.catalog.get();
        let unchanged = !self.dirty
            && self.planned_for.as_ref().is_some_and(|c| Arc::ptr_eq(c, &catalog))
            && now_ms < self.quiet_until_ms;
        if unchanged {
            report.waiting = self.last_waiting;
        } else {
            self.dirty = false;
            self.planned_for = Some(catalog.clone());
            if let Err(e) = self.plan(&catalog, &entries, now_ms, report).await {
                // A plan cut short is made again next tick.
                self.dirty = true;
                return Err(e);
            }
            report.planned = true;
            self.last_waiting = report.waiting;
        }
        // Queued longer than a subscription (the task's or its owner's) allows: raised once per attempt (the
        // store keeps it once).
        // Thresholds are in seconds: looked at about once a second, not on every tick.
        let t0 = Instant::now();
        let mut owners_alarms: BTreeMap<String, Vec<trainyard_core::spec::AlarmSubscription>> =
            BTreeMap::new();
        let look =
            now_ms >= self.queue_alarms_at_ms || now_ms < self.queue_alarms_at_ms - QUEUE_ALARM_EVERY_MS;
        if look {
            self.queue_alarms_at_ms = now_ms + QUEUE_ALARM_EVERY_MS;
        }
        for e in entries.iter().filter(|e| look && e.record.status == Status::Queued) {
            let (t, task) = (&e.record, e.spec());
            if !owners_alarms.contains_key(&t.owner) {
                let mine = alarms::user_subscriptions(&self.store, &t.owner).await?;
                owners_alarms.insert(t.owner.clone(), mine);
            }
            for a in task.spec.advanced.alarms.iter().chain(owners_alarms[&t.owner].iter()) {
                if let Some(limit_s) = a.queued_threshold_seconds
                    && a.events.contains(&trainyard_core::spec::AlarmEvent::QueuedTooLong)
                    && now_ms - t.updated_at_ms >= i64::from(limit_s) * 1000
                {
                    let why = self.waits.get(&t.id).map_or_else(String::new, |q| q.reason.to_string());
                    let message = format!("queued for more than {limit_s} s: {why}");
                    let event = trainyard_core::spec::AlarmEvent::QueuedTooLong;
                    alarms::enqueue(&self.store, a, t, event, &message, now_ms).await?;
                }
            }
        }
        report.phases.alarms_us = us_since(t0);
        let t0 = Instant::now();
        self.reconcile(&holding, now_ms).await?;
        report.phases.reconcile_us = us_since(t0);
        Ok(())
    }

    /// Builds the scheduler's snapshot, runs a cycle and commits its decisions: admissions (one transaction),
    /// preemptions, and the queue board's places and reasons.
    pub(crate) async fn plan(
        &mut self,
        catalog: &Arc<Catalog>,
        entries: &[&Entry],
        now_ms: i64,
        report: &mut TickReport,
    ) -> Result<(), CommandError> {
        let t0 = Instant::now();
        let (snap, index) = snapshot_for(
            catalog,
            entries,
            &mut self.options,
            &self.nominated,
            &self.scale_wants,
            &self.excluded,
        );
        report.phases.snapshot_us = us_since(t0);
        let t0 = Instant::now();
        let plan = schedule(&snap, now_ms.max(0) as u64, &self.config);
        report.phases.schedule_us = us_since(t0);
        let t0 = Instant::now();
        // Admissions are committed together after the other decisions: one transaction for all of them.
        let mut admits: Vec<(usize, Placement)> = Vec::new();
        let mut waits = Waits::with_capacity_and_hasher(snap.pending.len(), Default::default());
        // Tasks behind a full quota mostly wait for the same reason: described once, shared.
        let mut described: Vec<(trainyard_sched::GroupIx, &WaitReason, Arc<str>)> = Vec::new();
        for d in &plan.decisions {
            match d {
                Decision::Admit(a) if index.scale_ups.contains(&a.pending_index) => {
                    let i = index.pending[a.pending_index];
                    self.scale_wants.remove(&entries[i].record.id);
                    self.dirty = true;
                    self.grow(&entries[i].record, &snap, a, now_ms).await?;
                    report.admitted += 1;
                }
                Decision::Wait(w) if index.scale_ups.contains(&w.pending_index) => {}
                Decision::Admit(a) => {
                    let i = index.pending[a.pending_index];
                    let placement = Placement::from_admission(&snap, entries[i].spec(), a);
                    admits.push((i, placement));
                }
                Decision::Preempt(p) => {
                    let i = index.running[p.running_index];
                    let t = &entries[i].record;
                    let by = index.name_of(entries, p.preemptor);
                    let Some(t) = self
                        .apply(
                            t,
                            Step::new(
                                Status::Stopping,
                                Reason::Preempted,
                                format!("preempted for {by}"),
                                t.attempt,
                            ),
                            now_ms,
                        )
                        .await?
                    else {
                        report.conflicts += 1;
                        self.dirty = true;
                        continue;
                    };
                    self.send_stop(&t, StopCause::Preempted, now_ms).await?;
                    report.preempted += 1;
                }
                Decision::Wait(w) => {
                    let i = index.pending[w.pending_index];
                    let t = &entries[i].record;
                    let p = &snap.pending[w.pending_index];
                    let reason = match described.iter().find(|(g, r, _)| *g == p.group && **r == w.reason) {
                        Some((_, _, text)) => text.clone(),
                        None => {
                            let text: Arc<str> =
                                w.reason.describe(&snap, p.group, |id| index.name_of(entries, id)).into();
                            // A handful of distinct reasons at a time; a preemptor's (naming its victims) is
                            // its own.
                            if described.len() == 8 {
                                described.remove(0);
                            }
                            described.push((p.group, &w.reason, text.clone()));
                            text
                        }
                    };
                    match &w.reason {
                        WaitReason::Preempting { nodes, .. } => {
                            self.dirty = true;
                            self.nominated.insert(
                                t.id.clone(),
                                nodes.iter().map(|n| snap.nodes[n.ix()].name.clone()).collect(),
                            );
                        }
                        WaitReason::Blocked { .. } => {
                            if self.nominated.remove(&t.id).is_some() {
                                self.dirty = true;
                            }
                        }
                    }
                    waits.insert(
                        entries[i].id.clone(),
                        QueueInfo { position: w.position, position_in_group: w.position_in_group, reason },
                    );
                    report.waiting += 1;
                }
            }
        }
        self.admit(entries, admits, now_ms, report).await?;
        // When the clock alone would change the plan: the next queued task to reach the starvation threshold.
        let threshold = self.config.starvation_after_ms;
        self.quiet_until_ms = snap
            .pending
            .iter()
            .filter(|a| a.nominated.is_empty())
            .map(|a| a.submitted_at_ms.saturating_add(threshold).min(i64::MAX as u64) as i64)
            .filter(|&at| at > now_ms)
            .min()
            .unwrap_or(i64::MAX);
        // Kept (not copied) for the quota figures until the next plan.
        let old = (self.waits.replace(waits), self.views.snapshot.set(Arc::new(snap)), plan, index);
        // The last cycle's board and snapshot and this cycle's decisions (each an entry per queued task) are
        // freed off the loop's path.
        if old.0.len() > 1_000 {
            tokio::task::spawn_blocking(move || drop(old));
        }
        report.phases.commit_us = us_since(t0);
        Ok(())
    }
}
