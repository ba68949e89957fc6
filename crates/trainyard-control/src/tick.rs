//! One round of the control loop: observations, the working set, a scheduling cycle when anything it reads
//! changed, its decisions committed, queued-too-long alarms, reconciliation.

use crate::error::CommandError;
use crate::handles::*;
use crate::place::{Placement, snapshot_for};
use crate::policy::Step;
use crate::report::TickReport;
use crate::{Control, alarms};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use trainyard_core::Catalog;
use trainyard_core::lifecycle::{Reason, Status};
use trainyard_core::spec::TrainingTask;
use trainyard_runtime::{Backend, StopCause};
use trainyard_sched::{Decision, WaitReason, schedule};
use trainyard_store::TaskRecord;

/// How often queued tasks are checked against queued-too-long alarms (their thresholds are in seconds).
const QUEUE_ALARM_EVERY_MS: i64 = 1_000;

impl<B: Backend> Control<B> {
    /// One round: what the backend reports, then scheduling, then the plan, then reconciling.
    pub async fn tick(&mut self, now_ms: i64) -> Result<TickReport, CommandError> {
        let mut report = TickReport::default();
        for obs in self.backend.poll(now_ms.max(0) as u64).await {
            report.observations += 1;
            if !self.observe(&obs, now_ms).await? {
                report.conflicts += 1;
            }
        }

        for (t, spec) in self.arrivals.take() {
            self.absorb(t, Some(spec));
        }
        self.sync_active(now_ms).await?;
        // A stored task that cannot be read any more is left alone (and reported once); it must not stop the
        // loop for every other task.
        self.read_missing_specs(now_ms).await?;
        let mut tasks: Vec<Arc<TaskRecord>> = Vec::with_capacity(self.active.len());
        let mut parsed: Vec<Arc<TrainingTask>> = Vec::with_capacity(self.active.len());
        let mut ids: Vec<Arc<str>> = Vec::with_capacity(self.active.len());
        let mut names: Vec<Arc<str>> = Vec::with_capacity(self.active.len());
        for e in self.active.values() {
            if let Some(spec) = &e.spec {
                tasks.push(e.record.clone());
                parsed.push(spec.clone());
                ids.push(e.id.clone());
                names.push(e.name.clone());
            }
        }
        report.settling = tasks
            .iter()
            .filter(|t| matches!(t.status.as_str(), "Admitted" | "Starting" | "Stopping"))
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
            if let Err(e) = self.plan(&catalog, &tasks, &parsed, &ids, &names, now_ms, &mut report).await {
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
        let mut owners_alarms: BTreeMap<String, Vec<trainyard_core::spec::AlarmSubscription>> =
            BTreeMap::new();
        let look =
            now_ms >= self.queue_alarms_at_ms || now_ms < self.queue_alarms_at_ms - QUEUE_ALARM_EVERY_MS;
        if look {
            self.queue_alarms_at_ms = now_ms + QUEUE_ALARM_EVERY_MS;
        }
        for (t, task) in tasks.iter().zip(&parsed).filter(|_| look) {
            if t.status != "Queued" {
                continue;
            }
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
        self.reconcile(&tasks, now_ms).await?;
        // What this tick admitted or preempted starts or stops next.
        report.settling += report.admitted + report.preempted;
        Ok(report)
    }

    /// Builds the scheduler's snapshot, runs a cycle and commits its decisions: admissions (one transaction),
    /// preemptions, and the queue board's places and reasons.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn plan(
        &mut self,
        catalog: &Arc<Catalog>,
        tasks: &[Arc<TaskRecord>],
        parsed: &[Arc<TrainingTask>],
        ids: &[Arc<str>],
        names: &[Arc<str>],
        now_ms: i64,
        report: &mut TickReport,
    ) -> Result<(), CommandError> {
        let (snap, index) = snapshot_for(
            catalog,
            tasks,
            parsed,
            names,
            &mut self.options,
            &self.nominated,
            &self.scale_wants,
            &self.excluded,
        );
        let plan = schedule(&snap, now_ms.max(0) as u64, &self.config);
        // Admissions are committed together after the other decisions: one transaction for all of them.
        let mut admits: Vec<(usize, Placement)> = Vec::new();
        let mut waits: HashMap<Arc<str>, QueueInfo> = HashMap::with_capacity(snap.pending.len());
        // Tasks behind a full quota mostly wait for the same reason: described once, shared.
        let mut described: Vec<(trainyard_sched::GroupIx, &WaitReason, Arc<str>)> = Vec::new();
        for d in &plan.decisions {
            match d {
                Decision::Admit(a) if index.scale_ups.contains(&a.pending_index) => {
                    let i = index.pending[a.pending_index];
                    self.scale_wants.remove(&tasks[i].id);
                    self.dirty = true;
                    self.grow(&tasks[i], &snap, a, now_ms).await?;
                    report.admitted += 1;
                }
                Decision::Wait(w) if index.scale_ups.contains(&w.pending_index) => {}
                Decision::Admit(a) => {
                    let i = index.pending[a.pending_index];
                    let placement = Placement::from_admission(&snap, &parsed[i], a);
                    admits.push((i, placement));
                }
                Decision::Preempt(p) => {
                    let i = index.running[p.running_index];
                    let t = &tasks[i];
                    let by = index.name_of(tasks, p.preemptor);
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
                    let t = &tasks[i];
                    let p = &snap.pending[w.pending_index];
                    let reason = match described.iter().find(|(g, r, _)| *g == p.group && **r == w.reason) {
                        Some((_, _, text)) => text.clone(),
                        None => {
                            let text: Arc<str> =
                                w.reason.describe(&snap, p.group, |id| index.name_of(tasks, id)).into();
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
                        ids[i].clone(),
                        QueueInfo { position: w.position, position_in_group: w.position_in_group, reason },
                    );
                    report.waiting += 1;
                }
            }
        }
        self.admit(tasks, admits, now_ms, report).await?;
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
        drop(self.waits.replace(waits));
        // Kept (not copied) for the quota figures until the next plan.
        self.views.snapshot.set(Arc::new(snap));
        Ok(())
    }
}
