//! One round of the control loop: observations, the working set, a scheduling cycle when anything it reads
//! changed, its decisions committed, queued-too-long alarms, reconciliation.

use crate::accounts::AccountBook;
use crate::active::{ActiveKey, Entry, WorkingSet, active_key};
use crate::error::CommandError;
use crate::handles::*;
use crate::place::{Placement, snapshot_for};
use crate::policy::Step;
use crate::queue::Waiting;
use crate::report::TickReport;
use crate::{Control, alarms};
use std::collections::BTreeMap;
use std::sync::Arc;
use trainyard_core::Catalog;
use trainyard_core::lifecycle::{Reason, Status};
use trainyard_runtime::{Backend, StopCause};
use trainyard_sched::{Decision, WaitReason, schedule};
use trainyard_store::{StoreError, TaskRecord};

/// How often queued tasks are checked against queued-too-long alarms (their thresholds are in seconds).
const QUEUE_ALARM_EVERY_MS: i64 = 1_000;

impl<B: Backend> Control<B> {
    /// One round: what the backend reports, then scheduling, then the plan, then reconciling.
    pub async fn tick(&mut self, now_ms: i64) -> Result<TickReport, CommandError> {
        let mut report = TickReport::default();
        if !self.leading {
            // Another server leads (`leadership`): this one acts on nothing.
            return Ok(report);
        }
        let t0 = self.sources.clock.monotonic_us();
        // What an earlier tick could not write goes first, so each attempt's reports keep their order.
        let polled = self.backend.poll(now_ms.max(0) as u64).await;
        self.unobserved.extend(polled);
        while let Some(obs) = self.unobserved.pop_front() {
            report.observations += 1;
            match self.observe(&obs, now_ms).await {
                Ok(true) => {}
                Ok(false) => report.conflicts += 1,
                Err(e) => {
                    // The store is away (or this term ended): the report is kept for the next tick, which
                    // reads the task again (a report about a task that moved on since is stale, and ignored).
                    // A stored task that cannot be read is not retried forever: reported, and dropped.
                    if matches!(
                        e,
                        CommandError::Store(
                            StoreError::Db(_)
                                | StoreError::Sqlite(_)
                                | StoreError::DiskFull(_)
                                | StoreError::WriteFailed(_)
                                | StoreError::Fenced { .. }
                        )
                    ) {
                        self.unobserved.push_front(obs);
                    }
                    return Err(e);
                }
            }
        }

        report.phases.observe_us = self.sources.us_since(t0);
        let t0 = self.sources.clock.monotonic_us();
        let mut arrived = std::mem::take(&mut self.arrived);
        self.arrivals.swap(&mut arrived);
        for (t, spec) in arrived.drain(..) {
            self.absorb(t, Some(spec));
        }
        self.arrived = arrived;
        self.sync_active(now_ms).await?;
        self.follow_catalog().await?;
        // A stored task that cannot be read any more is left alone (and reported once); it must not stop the
        // loop for every other task.
        self.read_missing_specs(now_ms).await?;
        report.phases.sync_us = self.sources.us_since(t0);
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
        active: &WorkingSet,
        now_ms: i64,
        report: &mut TickReport,
    ) -> Result<(), CommandError> {
        // Every plannable entry (its spec read), in queue order: only for what looks at the whole queue.
        let all = || -> Vec<&Entry> { active.iter().map(|(_, e)| e).filter(|e| e.spec.is_some()).collect() };
        let holding: Vec<&Entry> = active.holding().filter(|e| e.spec.is_some()).collect();
        report.settling = holding
            .iter()
            .filter(|e| matches!(e.record.status, Status::Admitted | Status::Starting | Status::Stopping))
            .count() as u32;
        // The plan is a function of the active tasks, the catalog, the loop's own hints (nominated nodes,
        // excluded nodes, autoscaling wants) and, through starvation, the clock: while none of them changed, it
        // would come out the same, and the last one stands (a deep queue that nothing moves costs no cycle).
        let catalog = self.catalog.get();
        let same_catalog = self.planned_for.as_ref().is_some_and(|c| Arc::ptr_eq(c, &catalog));
        if self.dirty || !same_catalog || now_ms >= self.quiet_until_ms {
            // Only queued arrivals since the last plan: a cycle over them and what a cycle always looks at
            // again, the rest of the queue parked (see `queue`); anything else: the whole queue.
            let full = self.full || !same_catalog || now_ms >= self.quiet_until_ms;
            self.dirty = false;
            self.full = false;
            self.planned_for = Some(catalog.clone());
            let result = if full {
                self.fresh.clear();
                self.gone.clear();
                self.plan(&catalog, &all(), true, now_ms, report).await
            } else {
                let part = self.part(active, &holding);
                if self.check_parking {
                    self.same_as_whole(&catalog, &all(), &part, now_ms);
                }
                self.plan(&catalog, &part, false, now_ms, report).await
            };
            if let Err(e) = result {
                // A plan cut short is made again next tick, whole.
                self.changed();
                return Err(e);
            }
            report.planned = true;
            report.whole = full;
        }
        report.waiting = self.queue.len() as u32;
        // Queued longer than a subscription (the task's or its owner's) allows: raised once per attempt (the
        // store keeps it once).
        // Thresholds are in seconds: looked at about once a second, not on every tick.
        let t0 = self.sources.clock.monotonic_us();
        let mut owners_alarms: BTreeMap<String, Vec<trainyard_core::spec::AlarmSubscription>> =
            BTreeMap::new();
        let look =
            now_ms >= self.queue_alarms_at_ms || now_ms < self.queue_alarms_at_ms - QUEUE_ALARM_EVERY_MS;
        if look {
            self.queue_alarms_at_ms = now_ms + QUEUE_ALARM_EVERY_MS;
        }
        let queued = if look { all() } else { Vec::new() };
        for e in queued.iter().filter(|e| e.record.status == Status::Queued) {
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
        report.phases.alarms_us = self.sources.us_since(t0);
        let t0 = self.sources.clock.monotonic_us();
        let holding: Vec<&TaskRecord> = holding.iter().map(|e| &*e.record).collect();
        self.reconcile(&holding, now_ms).await?;
        report.phases.reconcile_us = self.sources.us_since(t0);
        Ok(())
    }

    /// What an incremental plan looks at: every task holding resources, the queued arrivals since the last
    /// plan, and the waiting tasks a cycle always looks at again; in queue order, as the working set.
    fn part<'a>(&mut self, active: &'a WorkingSet, holding: &[&'a Entry]) -> Vec<&'a Entry> {
        let mut keys = std::mem::take(&mut self.fresh);
        keys.extend(self.unparked.iter().cloned());
        keys.sort_unstable();
        keys.dedup();
        let mut part: Vec<&Entry> = holding.to_vec();
        part.extend(
            keys.iter()
                .filter_map(|k| active.get(k))
                .filter(|e| e.spec.is_some() && e.record.status == Status::Queued),
        );
        part.sort_unstable_by(|a, b| (a.record.created_at_ms, &*a.id).cmp(&(b.record.created_at_ms, &*b.id)));
        part
    }

    /// For tests (see [`Control::check_parking`]): a cycle over `part` decides what a cycle over the whole
    /// queue (`all`) decides (the same admissions and preemptions, the same wait reasons for what `part`
    /// holds), and, when it decides nothing, every parked task's reason on the board is the one the whole
    /// cycle gives it. Panics with the difference otherwise.
    fn same_as_whole(&self, catalog: &Arc<Catalog>, all: &[&Entry], part: &[&Entry], now_ms: i64) {
        let book = self.accounts.get();
        let (all, part) = (unheld(&book, all).0, unheld(&book, part).0);
        let ((all, n_all), (part, n_part)) =
            (self.admitted_elsewhere(catalog, all), self.admitted_elsewhere(catalog, part));
        let (all, part) = (&all[..n_all], &part[..n_part]);
        type Outcome = (BTreeMap<String, String>, Vec<String>, Vec<String>);
        let outcome = |entries: &[&Entry]| -> Outcome {
            let mut cache = crate::place::OptionsCache::default();
            let (snap, index) = snapshot_for(
                catalog,
                entries,
                &mut cache,
                &self.nominated,
                &self.scale_wants,
                &self.excluded,
            );
            let plan = schedule(&snap, now_ms.max(0) as u64, &self.config);
            let (mut waits, mut admitted, mut preempted) = (BTreeMap::new(), Vec::new(), Vec::new());
            for d in &plan.decisions {
                match d {
                    Decision::Admit(a) => admitted.push(index.name_of(entries, a.attempt)),
                    Decision::Preempt(p) => {
                        preempted.push(entries[index.running[p.running_index]].name.to_string())
                    }
                    Decision::Wait(w) => {
                        let p = &snap.pending[w.pending_index];
                        let why = w.reason.describe(&snap, p.group, |id| index.name_of(entries, id));
                        waits.insert(entries[index.pending[w.pending_index]].id.to_string(), why);
                    }
                }
            }
            admitted.sort();
            preempted.sort();
            (waits, admitted, preempted)
        };
        let (whole, some) = (outcome(all), outcome(part));
        assert_eq!(
            (&some.1, &some.2),
            (&whole.1, &whole.2),
            "admissions and preemptions, part against whole"
        );
        // After an admission or a preemption, parked tasks' figures (free capacity, quota left) are stale
        // until the next plan, which is whole: compared only when the cycle decided nothing.
        let decided = !whole.1.is_empty() || !whole.2.is_empty();
        for (id, why) in whole.0.iter().filter(|(id, _)| !decided || some.0.contains_key(*id)) {
            let (seen, how) = match some.0.get(id) {
                Some(w) => (w.clone(), "looked at again"),
                None => (
                    self.waits
                        .get(id)
                        .map_or_else(|| "not on the board".to_owned(), |q| q.reason.to_string()),
                    "parked",
                ),
            };
            assert_eq!(&seen, why, "the wait of {id} ({how}) against the whole cycle's");
        }
    }

    /// Builds the scheduler's snapshot, runs a cycle and commits its decisions: admissions (one transaction),
    /// preemptions, and the queue with its board's places and reasons. `full`: `entries` holds every active
    /// task; otherwise only what [`Self::part`] chose, and the parked rest of the queue keeps its waits.
    pub(crate) async fn plan(
        &mut self,
        catalog: &Arc<Catalog>,
        entries: &[&Entry],
        full: bool,
        now_ms: i64,
        report: &mut TickReport,
    ) -> Result<(), CommandError> {
        let t0 = self.sources.clock.monotonic_us();
        // Queued tasks whose owner's account holds them are left out of the cycle: they wait, with the
        // account's reason, in no place in line (see `accounts`).
        let book = self.accounts.get();
        let (kept, held) = unheld(&book, entries);
        // Tasks on a cluster that admits them itself (Kueue, Volcano) are not in the cycle: the queued ones
        // are handed over at once, unplaced, after the cycle's own (`entries[scheduled..]`).
        let (kept, scheduled) = self.admitted_elsewhere(catalog, kept);
        let entries = &*kept;
        for e in &held {
            if self.nominated.remove(&e.record.id).is_some() {
                self.changed();
            }
        }
        let held: Vec<(Arc<str>, QueueInfo)> = held
            .iter()
            .map(|e| {
                let state = book.state(&e.record.owner).unwrap_or_default();
                let reason: Arc<str> = crate::accounts::held_reason(state).into();
                (e.id.clone(), QueueInfo { position: 0, position_in_group: 0, reason })
            })
            .collect();
        let (snap, index) = snapshot_for(
            catalog,
            &entries[..scheduled],
            &mut self.options,
            &self.nominated,
            &self.scale_wants,
            &self.excluded,
        );
        report.phases.snapshot_us = self.sources.us_since(t0);
        let t0 = self.sources.clock.monotonic_us();
        let plan = schedule(&snap, now_ms.max(0) as u64, &self.config);
        report.phases.schedule_us = self.sources.us_since(t0);
        let t0 = self.sources.clock.monotonic_us();
        // Admissions are committed together after the other decisions: one transaction for all of them.
        let mut admits: Vec<(usize, Placement)> = Vec::new();
        let mut waiting: Vec<(String, Waiting)> =
            Vec::with_capacity(if full { snap.pending.len() } else { 0 });
        // Tasks behind a full quota mostly wait for the same reason: described once, shared.
        let mut described: Vec<(trainyard_sched::GroupIx, &WaitReason, Arc<str>)> = Vec::new();
        let mut unparked: Vec<ActiveKey> = Vec::new();
        for d in &plan.decisions {
            match d {
                Decision::Admit(a) if index.scale_ups.contains(&a.pending_index) => {
                    let i = index.pending[a.pending_index];
                    self.scale_wants.remove(&entries[i].record.id);
                    self.changed();
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
                        self.changed();
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
                    let preempting = match &w.reason {
                        WaitReason::Preempting { nodes, .. } => {
                            self.changed();
                            self.nominated.insert(
                                t.id.clone(),
                                nodes.iter().map(|n| snap.nodes[n.ix()].name.clone()).collect(),
                            );
                            unparked.push(active_key(t));
                            true
                        }
                        WaitReason::Blocked { .. } => {
                            if self.nominated.remove(&t.id).is_some() {
                                self.changed();
                            }
                            false
                        }
                    };
                    let w =
                        Waiting::new(entries[i].id.clone(), p.priority, t.created_at_ms, reason, preempting);
                    if full {
                        waiting.push((t.project_group.clone(), w));
                    } else {
                        self.queue.upsert(&t.project_group, w);
                    }
                }
            }
        }
        for (i, e) in entries.iter().enumerate().skip(scheduled) {
            if let Some(p) = Placement::unplaced(e.spec(), catalog) {
                admits.push((i, p));
            }
        }
        // Queued tasks this cycle admitted leave the queue and its board.
        let mut left: Vec<Arc<str>> = std::mem::take(&mut self.gone);
        if !full {
            if !left.is_empty() {
                let gone: std::collections::HashSet<&str> = left.iter().map(|id| &**id).collect();
                self.queue.remove_all(&gone);
            }
            for (i, _) in &admits {
                let (e, task) = (entries[*i], entries[*i].spec());
                let c = &task.spec.compute;
                self.queue.remove(&e.record.project_group, c.priority, e.record.created_at_ms, &e.id);
                left.push(e.id.clone());
            }
        }
        // Each pool's starving task (as the cycle picks it, `trainyard_sched::starving`) is looked at by every
        // cycle, parked or not. Queued tasks only: an autoscaling task's extra workers are passed over, so the
        // queued task that would starve next is looked at too.
        let threshold = self.config.starvation_after_ms;
        let starving = trainyard_sched::starving(&snap, now_ms.max(0) as u64, threshold, |k| {
            index.scale_ups.contains(&k)
        });
        unparked.extend(starving.values().map(|&k| active_key(&entries[index.pending[k]].record)));
        self.unparked = unparked;
        self.admit(entries, admits, now_ms, report).await?;
        // When the clock alone would change the plan: the next queued task to reach the starvation threshold
        // (parked tasks' thresholds were counted by the full plan that parked them).
        let next = trainyard_sched::next_starving_at_ms(&snap, now_ms, threshold);
        self.quiet_until_ms = if full { next } else { self.quiet_until_ms.min(next) };
        // Places on the board, by the fair order with this plan's shares; only what moved is written.
        let shares = trainyard_sched::dominant_shares(&snap, &plan);
        let share = |g: &str| snap.groups.iter().position(|x| x == g).map_or(0, |ix| shares[ix]);
        let old_board = if full {
            self.queue.rebuild(waiting);
            let mut waits = Waits::with_capacity_and_hasher(self.queue.len(), Default::default());
            self.queue.place(share, |id, info| {
                waits.insert(id.clone(), info);
            });
            waits.extend(held);
            Some(self.waits.replace(waits))
        } else {
            let mut moved = held;
            self.queue.place(share, |id, info| moved.push((id.clone(), info)));
            self.waits.update(moved, &left);
            None
        };
        // Kept (not copied) for the quota figures until the next plan.
        let old = (old_board, self.views.snapshot.set(Arc::new(snap)), plan, index);
        // The last cycle's board and snapshot and this cycle's decisions (each an entry per queued task) are
        // freed off the loop's path.
        if old.0.as_ref().is_some_and(|b| b.len() > 1_000) || old.1.pending.len() > 1_000 {
            tokio::task::spawn_blocking(move || drop(old));
        }
        report.phases.commit_us = self.sources.us_since(t0);
        Ok(())
    }
}

impl<B: Backend> Control<B> {
    /// `entries` without the tasks on a cluster that admits them itself ([`Backend::admits`]), then those of
    /// them still queued, and how many come first; with no such cluster (the usual case), `entries` as they
    /// are, not copied.
    fn admitted_elsewhere<'b, 'a>(
        &self,
        catalog: &Catalog,
        entries: std::borrow::Cow<'b, [&'a Entry]>,
    ) -> (std::borrow::Cow<'b, [&'a Entry]>, usize) {
        let theirs: Vec<&str> =
            catalog.clusters.keys().map(String::as_str).filter(|c| self.backend.admits(catalog, c)).collect();
        if theirs.is_empty() {
            let n = entries.len();
            return (entries, n);
        }
        let elsewhere =
            |e: &Entry| e.spec.as_ref().is_some_and(|s| theirs.contains(&s.spec.placement.cluster.as_str()));
        let (mut mine, handed): (Vec<&Entry>, Vec<&Entry>) = entries.iter().partition(|e| !elsewhere(e));
        let n = mine.len();
        mine.extend(handed.into_iter().filter(|e| e.record.status == Status::Queued));
        (std::borrow::Cow::Owned(mine), n)
    }
}

/// `entries` without the queued tasks whose owner's account holds them, and those tasks apart; with no
/// account holding anything (the usual case), `entries` as they are, not copied.
fn unheld<'b, 'a>(
    book: &AccountBook,
    entries: &'b [&'a Entry],
) -> (std::borrow::Cow<'b, [&'a Entry]>, Vec<&'a Entry>) {
    if book.holds_nothing() {
        return (std::borrow::Cow::Borrowed(entries), Vec::new());
    }
    let (kept, held): (Vec<&Entry>, Vec<&Entry>) =
        entries.iter().partition(|e| !(e.record.status == Status::Queued && book.holds(&e.record.owner)));
    (std::borrow::Cow::Owned(kept), held)
}
