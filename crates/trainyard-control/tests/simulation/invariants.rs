//! What must hold after every tick, checked against the store and the backend with none of the control loop's
//! own structures: each check reads the records, the events and what the fake backend runs, and says what it
//! found wrong in a sentence.

use std::collections::{BTreeMap, BTreeSet};
use trainyard_core::Catalog;
use trainyard_core::demand::Resources;
use trainyard_core::lifecycle::{FailureClass, Reason, Status, failure_class, transition};
use trainyard_runtime::fake::FakeBackend;
use trainyard_runtime::{AttemptKey, Backend, ReplicaPlan};
use trainyard_store::{Store, TaskRecord};

/// How long a task may hold resources with nothing running for it before that is an invariant failure: a
/// refused launch is asked again after 1, 2, 4, 8 s and fails the attempt at the fifth refusal, so a lost
/// launch is repaired or given up within 15 s of virtual time; this is that and some room (a step moves the
/// clock by up to 4 s).
pub const STUCK_MS: i64 = 25_000;

/// Events the control loop appends without changing the status (reasons that are not lifecycle reasons are
/// such notes too: `InternalError`, `ScaledUp`, ...).
/// Reasons of events that change no status: those no transition of the lifecycle takes.
fn is_note(r: Reason) -> bool {
    !Status::ALL.iter().any(|&from| Status::ALL.iter().any(|&to| transition(from, to, r).is_ok()))
}

/// What the checker knows of one task from earlier checks.
#[derive(Debug)]
struct Seen {
    status: Status,
    attempt: i64,
    version: i64,
    /// The last event checked.
    seq: i64,
    /// Automatic resubmissions found in the history.
    requeues: i64,
    /// Since when checks have found it holding resources with nothing running.
    idle_since_ms: Option<i64>,
}

/// What the simulation submitted, as the checker needs it.
#[derive(Debug, Clone)]
pub struct Submitted {
    pub pool: String,
    pub budget: i64,
}

/// Where an attempt runs, as the control loop stores it with the task (only the fields checked here).
#[derive(Debug, serde::Deserialize)]
struct Placement {
    replicas: Vec<ReplicaPlan>,
    /// (spec, usage class, units).
    units: Vec<(String, String, u64)>,
}

/// Every this many checks, the checker reads every task, not only those changed since the last check.
const FULL_READ_EVERY: u32 = 25;

#[derive(Debug)]
pub struct Checker {
    /// The catalog whose quotas and capacities hold (the one the control loop was given).
    catalog: Catalog,
    pub submitted: BTreeMap<String, Submitted>,
    pub deleted: BTreeSet<String>,
    seen: BTreeMap<String, Seen>,
    /// Every task as last read (specs left out), kept up to date from the rows changed since the last check.
    records: BTreeMap<String, TaskRecord>,
    /// The clock of the last check: rows changed since are read at the next.
    read_to_ms: i64,
    checks: u32,
}

impl Checker {
    pub fn new(catalog: Catalog) -> Checker {
        Checker {
            catalog,
            submitted: BTreeMap::new(),
            deleted: BTreeSet::new(),
            seen: BTreeMap::new(),
            records: BTreeMap::new(),
            read_to_ms: i64::MIN,
            checks: 0,
        }
    }

    /// Every invariant, once, at `now_ms` (everything is written at the simulation's clock, so a row changed
    /// since the last check has an `updated_at_ms` at or after it). The answer lists everything found wrong
    /// (empty: all hold). `full` reads every task instead of the changed ones.
    pub async fn check(
        &mut self,
        store: &Store,
        backend: &FakeBackend,
        now_ms: i64,
        full: bool,
    ) -> Vec<String> {
        let mut wrong = Vec::new();
        self.checks += 1;
        let full = full || self.checks % FULL_READ_EVERY == 0;
        let since = if full { i64::MIN } else { self.read_to_ms };
        let changed = match self.read(store, since).await {
            Ok(r) => r,
            Err(e) => return vec![format!("the store cannot be read: {e}")],
        };
        self.read_to_ms = now_ms;
        if full {
            // No task lost: every task the simulation created is in the store (a deleted one keeps its record).
            let ids: BTreeSet<&str> = changed.iter().map(|t| t.id.as_str()).collect();
            for id in self.submitted.keys().filter(|id| !ids.contains(id.as_str())) {
                wrong.push(format!("task {id} was submitted and is not in the store"));
            }
            self.records.retain(|id, _| ids.contains(id.as_str()));
        }
        match store.count_tasks().await {
            Ok(n) if n as usize == self.submitted.len() => {}
            Ok(n) => {
                wrong.push(format!("the store holds {n} tasks; {} were submitted", self.submitted.len()))
            }
            Err(e) => wrong.push(format!("the store cannot count its tasks: {e}")),
        }
        for t in changed {
            if let Err(e) = self.history(store, &t, full, &mut wrong).await {
                wrong.push(format!("the events of {} cannot be read: {e}", t.id));
            }
            self.records.insert(t.id.clone(), t);
        }
        self.quota_and_capacity(&mut wrong);
        self.backend_agrees(backend, now_ms, &mut wrong).await;
        wrong
    }

    /// Whether any task holds resources, as of the last check.
    pub fn anything_holds(&self) -> bool {
        self.records.values().any(holds)
    }

    /// Tasks changed at or after `since_ms`, with their real status (a deleted one included).
    async fn read(
        &self,
        store: &Store,
        since_ms: i64,
    ) -> Result<Vec<TaskRecord>, trainyard_store::StoreError> {
        let mut out = Vec::new();
        for t in store.tasks_updated_since(since_ms).await? {
            let t = if self.deleted.contains(&t.id) {
                store.get_task(&t.id).await?.expect("a deleted task keeps its record")
            } else {
                t
            };
            out.push(t);
        }
        Ok(out)
    }

    /// The task's new events walk a legal path through the lifecycle from where it was to where the store says
    /// it is; attempts grow only with a requeue or a resubmission; automatic resubmissions follow only
    /// infrastructure failures, within the task's budget; nothing was recorded as an internal error.
    async fn history(
        &mut self,
        store: &Store,
        t: &TaskRecord,
        full: bool,
        wrong: &mut Vec<String>,
    ) -> Result<(), trainyard_store::StoreError> {
        let status = t.status;
        let budget = self.submitted.get(&t.id).map_or(0, |s| s.budget);
        let fresh = !self.seen.contains_key(&t.id);
        let seen = self.seen.entry(t.id.clone()).or_insert(Seen {
            status: Status::Queued,
            attempt: 0,
            version: -1,
            seq: 0,
            requeues: 0,
            idle_since_ms: None,
        });
        // Notes change no version: a full read looks for new ones on every task.
        if seen.version == t.version && !full {
            return Ok(());
        }
        let events = store.list_events(&t.id, seen.seq, 5_000).await?;
        let mut events = events.as_slice();
        if fresh {
            match events.first() {
                Some(e) if e.reason == "Submitted" && e.attempt == 0 => {
                    seen.seq = e.seq;
                    events = &events[1..];
                }
                other => wrong.push(format!("task {}: the first event is {other:?}, not Submitted", t.id)),
            }
        }
        // The paths the events allow so far, as (status, attempt): a reason may allow more than one target.
        let mut paths: BTreeSet<(Status, i64)> = BTreeSet::from([(seen.status, seen.attempt)]);
        let mut last_reason = String::new();
        for e in events {
            seen.seq = e.seq;
            if e.reason == "InternalError" {
                wrong.push(format!("task {}: InternalError recorded: {}", t.id, e.message));
            }
            let reason = Reason::from_name(&e.reason);
            let mut next = BTreeSet::new();
            for &(from, attempt) in &paths {
                if let Some(r) = reason {
                    let expected = if matches!(r, Reason::Requeued | Reason::Resubmitted) {
                        attempt + 1
                    } else {
                        attempt
                    };
                    for &to in Status::ALL {
                        if transition(from, to, r).is_ok() && e.attempt == expected {
                            next.insert((to, expected));
                        }
                    }
                }
                if reason.is_none_or(is_note) && e.attempt == attempt {
                    next.insert((from, attempt));
                }
            }
            if next.is_empty() {
                wrong.push(format!(
                    "task {}: event {} {} (attempt {}, {:?}) cannot follow {paths:?}",
                    t.id, e.seq, e.reason, e.attempt, e.message
                ));
                // Carry on from what the store says, so one wrong event is reported once.
                next.insert((status, t.attempt));
            }
            // (`NodeFailed` leads from Running to Failed or to Stopping: the control loop takes only the first.)
            let automatic =
                reason == Some(Reason::Requeued) && paths.iter().any(|(s, _)| *s == Status::Failed);
            if automatic {
                seen.requeues += 1;
                let class = Reason::from_name(&last_reason).map(failure_class);
                if class != Some(FailureClass::Infrastructure) {
                    wrong.push(format!("task {}: resubmitted automatically after {last_reason}", t.id));
                }
                if seen.requeues > budget {
                    wrong.push(format!(
                        "task {}: {} automatic resubmissions, over its budget of {budget}",
                        t.id, seen.requeues
                    ));
                }
            }
            last_reason.clone_from(&e.reason);
            paths = next;
        }
        if !paths.contains(&(status, t.attempt)) {
            wrong.push(format!(
                "task {} is {} at attempt {}, which its events do not lead to ({paths:?})",
                t.id, t.status, t.attempt
            ));
        }
        if t.retries != seen.requeues {
            wrong.push(format!(
                "task {} counts {} automatic resubmissions, its events {}",
                t.id, t.retries, seen.requeues
            ));
        }
        seen.status = status;
        seen.attempt = t.attempt;
        seen.version = t.version;
        Ok(())
    }

    /// Tasks holding resources (deleted ones too: their attempts run until stopped) stay within every quota
    /// of their group, and within every node's capacity.
    fn quota_and_capacity(&self, wrong: &mut Vec<String>) {
        let records = &self.records;
        let mut units: BTreeMap<(&str, String, &str, String), u64> = BTreeMap::new();
        let mut used: BTreeMap<String, Resources> = BTreeMap::new();
        for t in records.values().filter(|t| holds(t)) {
            let Ok(p) = serde_json::from_str::<Placement>(&t.placement) else {
                wrong.push(format!("task {} is {} without a readable placement", t.id, t.status));
                continue;
            };
            let pool = self.submitted.get(&t.id).map_or("?", |s| s.pool.as_str());
            for (spec, class, n) in p.units {
                *units.entry((&t.project_group, class, pool, spec)).or_default() += n;
            }
            for r in p.replicas {
                let u = used.entry(r.node).or_default();
                u.gpus += r.resources.gpus;
                u.vcpus += r.resources.vcpus;
                u.memory_mib += r.resources.memory_mib;
            }
        }
        for ((group, class, pool, spec), n) in units {
            if class == "Borrowed" {
                continue;
            }
            let entry = self.catalog.quotas.iter().find(|q| {
                q.group == group && q.resource_type.to_string() == class && q.pool == pool && q.spec == spec
            });
            // A Reserved quota the catalog does not list is zero; for the other types an entry is a cap.
            let limit = match entry {
                Some(q) => q.units,
                None if class == "Reserved" => 0,
                None => continue,
            };
            if n > limit {
                wrong.push(format!(
                    "group {group} holds {n} {class} units of {spec} in pool {pool}, over {limit}"
                ));
            }
        }
        for (node, u) in used {
            let Some(n) = self.catalog.nodes.get(&node) else {
                wrong.push(format!("a replica is placed on {node}, which is not in the catalog"));
                continue;
            };
            let cap = Resources { gpus: n.gpus.into(), vcpus: n.vcpus.into(), memory_mib: n.memory_mib };
            if !u.fits_in(&cap) {
                wrong.push(format!("node {node} holds {u:?}, over its capacity {cap:?}"));
            }
        }
    }

    /// What the backend runs is what the store says holds resources: at most one attempt per task, always
    /// the task's current one and only while it holds resources (an ended task never runs again), no
    /// attempt launched again while it runs; and a task holding resources has its attempt running, give or
    /// take [`STUCK_MS`] of repair.
    async fn backend_agrees(&mut self, backend: &FakeBackend, now_ms: i64, wrong: &mut Vec<String>) {
        let records = &self.records;
        let alive: BTreeSet<AttemptKey> = backend.alive().await.into_iter().collect();
        let mut per_task: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
        for k in &alive {
            per_task.entry(&k.task_id).or_default().push(k.attempt);
            match records.get(&k.task_id) {
                Some(t) if t.attempt == k.attempt && holds(t) => {}
                Some(t) => wrong.push(format!(
                    "attempt {} of {} runs while the task is {} at attempt {}",
                    k.attempt, k.task_id, t.status, t.attempt
                )),
                None => wrong.push(format!("attempt {} of {} runs for no stored task", k.attempt, k.task_id)),
            }
        }
        for (task, attempts) in per_task.into_iter().filter(|(_, a)| a.len() > 1) {
            wrong.push(format!("task {task} runs attempts {attempts:?} at once"));
        }
        for k in backend.launches_while_alive() {
            wrong.push(format!("attempt {} of {} was launched again while it ran", k.attempt, k.task_id));
        }
        for t in records.values() {
            let Some(seen) = self.seen.get_mut(&t.id) else { continue };
            let key = AttemptKey { task_id: t.id.clone(), attempt: t.attempt };
            if holds(t) && !alive.contains(&key) {
                let since = *seen.idle_since_ms.get_or_insert(now_ms);
                if now_ms - since > STUCK_MS {
                    wrong.push(format!(
                        "task {} has been {} for {} ms with nothing running for attempt {}",
                        t.id,
                        t.status,
                        now_ms - since,
                        t.attempt
                    ));
                }
            } else {
                seen.idle_since_ms = None;
            }
        }
    }
}

/// Whether a task holds resources by what the store says.
pub fn holds(t: &TaskRecord) -> bool {
    t.status.holds_resources()
}
