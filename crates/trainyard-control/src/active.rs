//! The control loop's working set: the tasks it has work for, kept in step with the store incrementally,
//! with their specs read and parsed once and shared.

use std::collections::{BTreeMap, BTreeSet};
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

/// The working set, in queue order, with what a tick reads of it besides the queue kept apart: the entries
/// not queued (they hold or are about to hold resources: every plan and reconciliation looks at them) and
/// the entries whose spec is not read yet. A tick under a stream of creates, with tens of thousands queued,
/// looks at what changed and at these few, not at the whole queue.
#[derive(Debug, Default)]
pub(crate) struct WorkingSet {
    entries: BTreeMap<ActiveKey, Entry>,
    apart: Apart,
}

/// The keys of the entries a [`WorkingSet`] keeps apart.
#[derive(Debug, Default)]
struct Apart {
    /// Not queued.
    holding: BTreeSet<ActiveKey>,
    /// Without their spec.
    unread: BTreeSet<ActiveKey>,
}

impl Apart {
    /// Puts `key` in or out of each set, as its entry now is.
    fn index(&mut self, key: &ActiveKey, e: &Entry) {
        fn mark(set: &mut BTreeSet<ActiveKey>, key: &ActiveKey, member: bool) {
            if !member {
                set.remove(key);
            } else if !set.contains(key) {
                set.insert(key.clone());
            }
        }
        mark(&mut self.holding, key, e.record.status != Status::Queued);
        mark(&mut self.unread, key, e.spec.is_none());
    }

    fn remove(&mut self, key: &ActiveKey) {
        self.holding.remove(key);
        self.unread.remove(key);
    }
}

impl WorkingSet {
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn get(&self, key: &ActiveKey) -> Option<&Entry> {
        self.entries.get(key)
    }

    /// The entry at `key`, to change: the sets kept apart follow when the handle is dropped.
    pub(crate) fn get_mut(&mut self, key: &ActiveKey) -> Option<EntryMut<'_>> {
        self.entries.contains_key(key).then(|| EntryMut { set: self, key: key.clone() })
    }

    pub(crate) fn insert(&mut self, key: ActiveKey, entry: Entry) {
        self.apart.index(&key, &entry);
        self.entries.insert(key, entry);
    }

    pub(crate) fn remove(&mut self, key: &ActiveKey) -> Option<Entry> {
        self.apart.remove(key);
        self.entries.remove(key)
    }

    /// Every entry, in queue order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&ActiveKey, &Entry)> {
        self.entries.iter()
    }

    /// Every entry, in queue order, the set given up.
    pub(crate) fn into_entries(self) -> impl Iterator<Item = (ActiveKey, Entry)> {
        self.entries.into_iter()
    }

    /// The entries not queued, in queue order.
    pub(crate) fn holding(&self) -> impl Iterator<Item = &Entry> {
        self.apart.holding.iter().map(|k| &self.entries[k])
    }

    /// The keys of the entries without their spec, in queue order.
    pub(crate) fn unread_keys(&self) -> impl Iterator<Item = &ActiveKey> {
        self.apart.unread.iter()
    }

    /// Gives the entries without their spec the one `read` returns, if any (in queue order, each once).
    pub(crate) fn read_specs(
        &mut self,
        mut read: impl FnMut(&ActiveKey, &Entry) -> Option<Arc<TrainingTask>>,
    ) {
        let WorkingSet { entries, apart } = self;
        apart.unread.retain(|key| {
            let e = entries.get_mut(key).expect("a key kept apart has its entry");
            e.spec = read(key, e);
            e.spec.is_none()
        });
    }
}

/// An entry of the working set being changed (see [`WorkingSet::get_mut`]).
pub(crate) struct EntryMut<'a> {
    set: &'a mut WorkingSet,
    key: ActiveKey,
}

impl std::ops::Deref for EntryMut<'_> {
    type Target = Entry;
    fn deref(&self) -> &Entry {
        &self.set.entries[&self.key]
    }
}

impl std::ops::DerefMut for EntryMut<'_> {
    fn deref_mut(&mut self) -> &mut Entry {
        self.set.entries.get_mut(&self.key).expect("the entry is there while its handle lives")
    }
}

impl Drop for EntryMut<'_> {
    fn drop(&mut self) {
        let WorkingSet { entries, apart } = &mut *self.set;
        apart.index(&self.key, &entries[&self.key]);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: i64, status: Status, spec: bool) -> (ActiveKey, Entry) {
        let id = format!("t{n}");
        let record = TaskRecord {
            id: id.clone(),
            name: id.clone(),
            owner: "u".into(),
            project_group: "g".into(),
            task_type: "PyTorchJob".into(),
            status,
            deleted: false,
            public: false,
            labels: Default::default(),
            spec_json: String::new(),
            attempt: 0,
            version: 1,
            created_at_ms: n,
            updated_at_ms: n,
            placement: String::new(),
            retries: 0,
            demand: None,
            status_since_ms: n,
            run_started_at_ms: None,
        };
        let spec = spec.then(|| Arc::new(TrainingTask::default()));
        let e = Entry { id: id.as_str().into(), name: id.as_str().into(), record: Arc::new(record), spec };
        ((n, id), e)
    }

    /// The sets kept apart, against what a walk over every entry finds.
    fn check(set: &WorkingSet) {
        let walk = |f: &dyn Fn(&Entry) -> bool| -> Vec<String> {
            set.iter().filter(|(_, e)| f(e)).map(|(_, e)| e.id.to_string()).collect()
        };
        let holding: Vec<String> = set.holding().map(|e| e.id.to_string()).collect();
        let unread: Vec<String> = set.unread_keys().map(|(_, id)| id.clone()).collect();
        assert_eq!(holding, walk(&|e| e.record.status != Status::Queued), "not queued");
        assert_eq!(unread, walk(&|e| e.spec.is_none()), "without a spec");
    }

    #[test]
    fn what_is_kept_apart_follows_every_change() {
        let mut set = WorkingSet::default();
        for (n, status, spec) in [
            (3, Status::Queued, true),
            (1, Status::Running, true),
            (2, Status::Queued, false),
            (4, Status::Admitted, false),
        ] {
            let (k, e) = entry(n, status, spec);
            set.insert(k, e);
            check(&set);
        }
        assert_eq!(set.holding().map(|e| &*e.id).collect::<Vec<_>>(), ["t1", "t4"], "in queue order");
        // Admitted, its spec read, requeued, dropped: each change is seen.
        let key = (2, "t2".to_owned());
        {
            let mut e = set.get_mut(&key).unwrap();
            e.spec = Some(Arc::new(TrainingTask::default()));
            e.record = Arc::new(TaskRecord { status: Status::Admitted, ..(*e.record).clone() });
        }
        check(&set);
        let key1 = (1, "t1".to_owned());
        set.get_mut(&key1).unwrap().record = Arc::new(TaskRecord {
            status: Status::Queued,
            ..(*entry(1, Status::Queued, true).1.record).clone()
        });
        check(&set);
        assert!(set.remove(&key).is_some());
        check(&set);
        // Inserting over an entry re-files it.
        let (k, e) = entry(3, Status::Running, false);
        set.insert(k, e);
        check(&set);
        assert_eq!(set.len(), 3);
        assert!(set.get_mut(&(9, "t9".to_owned())).is_none());
        // Specs read in bulk: those given leave the unread, the others stay.
        let mut asked = Vec::new();
        set.read_specs(|(n, id), _| {
            asked.push(id.clone());
            (*n == 3).then(|| Arc::new(TrainingTask::default()))
        });
        assert_eq!(asked, ["t3", "t4"]);
        check(&set);
        assert_eq!(set.unread_keys().map(|(_, id)| id.as_str()).collect::<Vec<_>>(), ["t4"]);
        let ids: Vec<String> = set.into_entries().map(|(_, e)| e.id.to_string()).collect();
        assert_eq!(ids, ["t1", "t3", "t4"]);
    }
}
