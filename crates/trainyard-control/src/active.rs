//! The control loop's working set: the tasks it has work for, kept in step with the store incrementally,
//! with their specs read and parsed once and shared.

use std::collections::HashMap;
use std::sync::Arc;
use trainyard_core::lifecycle::Status;
use trainyard_core::spec::TrainingTask;
use trainyard_store::TaskRecord;

/// A task the loop has work for: its record (spec left out) and, once read, its slimmed spec (a stored spec
/// never changes, so it is read and parsed once).
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) id: Arc<str>,
    pub(crate) name: Arc<str>,
    pub(crate) record: Arc<TaskRecord>,
    pub(crate) spec: Option<Arc<TrainingTask>>,
}

/// Identical slimmed specs (tasks submitted from one template differ mostly in what slimming drops) are
/// kept once: with tens of thousands queued, specs are most of the loop's memory.
#[derive(Debug, Default)]
pub(crate) struct SpecInterner {
    by_json: HashMap<String, std::sync::Weak<TrainingTask>>,
    /// Entries at the last sweep of dead ones; the next sweep comes when the map has doubled.
    swept_at: usize,
}

impl SpecInterner {
    pub(crate) fn intern(&mut self, spec: Arc<TrainingTask>) -> Arc<TrainingTask> {
        let key = serde_json::to_string(&*spec).expect("a TrainingTask always serialises");
        if let Some(known) = self.by_json.get(&key).and_then(std::sync::Weak::upgrade) {
            return known;
        }
        if self.by_json.len() >= 2 * self.swept_at.max(512) {
            self.by_json.retain(|_, w| w.strong_count() > 0);
            self.swept_at = self.by_json.len();
        }
        self.by_json.insert(key, Arc::downgrade(&spec));
        spec
    }
}

/// Where a task sits in [`Control::active`]: queue order (submission time, then id).
impl Entry {
    /// The spec, for entries that have it (the loop passes on only those).
    pub(crate) fn spec(&self) -> &Arc<TrainingTask> {
        self.spec.as_ref().expect("only entries with a spec are planned")
    }
}

pub(crate) type ActiveKey = (i64, String);

/// The backend's key for a task's current attempt.
pub(crate) fn attempt_key(t: &TaskRecord) -> trainyard_runtime::AttemptKey {
    trainyard_runtime::AttemptKey { task_id: t.id.clone(), attempt: t.attempt }
}

pub(crate) fn active_key(t: &TaskRecord) -> ActiveKey {
    (t.created_at_ms, t.id.clone())
}

/// What the loop keeps of a task's spec between ticks: what scheduling, placement and alarms read. The
/// environment (env values, mounts, the command) and the Ray runtime env are dropped; a launch reads the full
/// spec from the store. With tens of thousands queued this is most of the loop's memory.
pub(crate) fn slim(mut task: TrainingTask) -> TrainingTask {
    let e = &mut task.spec.environment;
    e.env = Vec::new();
    e.volumes = Vec::new();
    e.datasets = Vec::new();
    e.models = Vec::new();
    e.cmd = String::new();
    task.metadata.labels.clear();
    task.metadata.description = None;
    if let Some(p) = task.spec.advanced.precheck.as_mut() {
        p.env = Vec::new();
    }
    if let Some(r) = task.spec.ray.as_mut() {
        r.runtime_env_yaml = None;
    }
    task
}

/// Changes committed up to this long before a sync are still picked up by it (commits land a little after
/// the time they record). Every tick looks back [`SYNC_SKEW_MS`]; at most every [`WIDE_SYNC_EVERY_MS`] a
/// sync looks back [`WIDE_SYNC_SKEW_MS`], for commits that took long (a stalled disk, another server on the
/// same database). Creates made by this process do not depend on either: they arrive by [`Arrivals`].
pub(crate) const SYNC_SKEW_MS: i64 = 250;
pub(crate) const WIDE_SYNC_SKEW_MS: i64 = 2_000;
pub(crate) const WIDE_SYNC_EVERY_MS: i64 = 1_000;
/// A full read of the active tasks at least this often, whatever the incremental syncs saw.
pub(crate) const FULL_SYNC_EVERY_MS: i64 = 10_000;
/// From this many tasks in the working set, the full read runs beside the loop instead of in a tick.
pub(crate) const FULL_READ_BESIDE_FROM: usize = 5_000;

/// Statuses that the control loop still has work for.
/// Whether the loop has work for a task: an active status, and for a deleted task only while it still holds
/// resources (its attempt stops through its checkpoint window; its capacity and quota are not free yet).
pub(crate) fn is_active(status: Status, deleted: bool) -> bool {
    ACTIVE.contains(&status) && (!deleted || status.holds_resources())
}

pub(crate) const ACTIVE: &[Status] = &[
    Status::Queued,
    Status::Admitted,
    Status::Starting,
    Status::Prechecking,
    Status::Running,
    Status::Stopping,
];
