//! The control loop: commands in (submit, stop, delete, resubmit), the store updated, the scheduler run, its
//! plan committed, the backend driven, and what the backend reports turned into lifecycle transitions.
//!
//! Decide, then act: a plan is first committed to the store (each change a checked lifecycle transition with
//! its event), and only then are backends called, keyed by (task, attempt), so a crash between the two is
//! repaired by the next tick, which reconciles what the store says against what the backend runs.
//!
//! Everything is rebuilt from the store on every tick: a restarted control loop picks up every queued and
//! running task where it was. The only state kept in memory is advisory (the last wait reason of each
//! queued task, and nominated nodes of preemptors).

#![forbid(unsafe_code)]

pub mod alarms;
mod place;
pub mod secrets;

use place::{OptionsCache, Placement, snapshot_for};
use secrets::SecretBox;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use trainyard_core::lifecycle::{FailureClass, Reason, Status, failure_class, transition};
use trainyard_core::spec::TrainingTask;
use trainyard_core::{Catalog, Report, check};
use trainyard_runtime::{AttemptKey, Backend, LaunchSpec, Observation, StopCause};
use trainyard_sched::{Config, Decision, WaitReason, schedule};
use trainyard_store::{Created, NewTask, Store, StoreError, TaskRecord, Transition};

/// A submission refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the task has {} problem(s)", .0.errors().count())]
    Invalid(Report),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A command on a task refused.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("task {0} does not exist")]
    NotFound(String),
    #[error("task {name} is {status}; {what}")]
    WrongState { name: String, status: String, what: &'static str },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("stored task {0} is unreadable: {1}")]
    Corrupt(String, String),
}

/// Where a queued task stands, as of the last tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueInfo {
    pub position: u32,
    pub position_in_group: u32,
    /// Shared by the tasks that wait for the same reason.
    pub reason: Arc<str>,
}

impl From<Catalog> for CatalogHandle {
    fn from(c: Catalog) -> Self {
        CatalogHandle::new(c)
    }
}

/// The catalog in force, replaceable while the server runs (an admin edits it); readers take a snapshot.
#[derive(Debug, Clone)]
pub struct CatalogHandle(std::sync::Arc<std::sync::RwLock<std::sync::Arc<Catalog>>>);

impl CatalogHandle {
    pub fn new(catalog: Catalog) -> Self {
        CatalogHandle(std::sync::Arc::new(std::sync::RwLock::new(std::sync::Arc::new(catalog))))
    }

    pub fn get(&self) -> std::sync::Arc<Catalog> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn set(&self, catalog: Catalog) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = std::sync::Arc::new(catalog);
    }
}

/// Queue positions and wait reasons as of the last tick, readable from anywhere without the control loop.
#[derive(Debug, Clone, Default)]
pub struct QueueBoard(Arc<std::sync::RwLock<HashMap<Arc<str>, QueueInfo>>>);

impl QueueBoard {
    pub fn get(&self, task_id: &str) -> Option<QueueInfo> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).get(task_id).cloned()
    }

    /// Puts this tick's waits up and hands back the last tick's, for the caller to drop outside the lock.
    fn replace(&self, waits: HashMap<Arc<str>, QueueInfo>) -> HashMap<Arc<str>, QueueInfo> {
        std::mem::replace(&mut *self.0.write().unwrap_or_else(|e| e.into_inner()), waits)
    }
}

/// Tasks this process has just created, handed to the control loop with their parsed specs, so that it
/// neither waits for its next read of the store to see them nor reads and parses their specs again.
#[derive(Debug, Clone, Default)]
pub struct Arrivals(Arc<std::sync::Mutex<Vec<Arrival>>>);

/// A created task's record and its slimmed spec.
type Arrival = (TaskRecord, Arc<TrainingTask>);

impl Arrivals {
    /// A task just committed to the store, and its spec as validated.
    pub fn push(&self, record: &TaskRecord, task: &TrainingTask) {
        let mut record = record.clone();
        record.spec_json = String::new();
        let spec = Arc::new(slim(task.clone()));
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push((record, spec));
    }

    fn take(&self) -> Vec<Arrival> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// A task the loop has work for: its record (spec left out) and, once read, its slimmed spec (a stored spec
/// never changes, so it is read and parsed once).
#[derive(Debug)]
struct Entry {
    id: Arc<str>,
    name: Arc<str>,
    record: Arc<TaskRecord>,
    spec: Option<Arc<TrainingTask>>,
}

/// Identical slimmed specs (tasks submitted from one template differ mostly in what slimming drops) are
/// kept once: with tens of thousands queued, specs are most of the loop's memory.
#[derive(Debug, Default)]
struct SpecInterner {
    by_json: HashMap<String, std::sync::Weak<TrainingTask>>,
    /// Entries at the last sweep of dead ones; the next sweep comes when the map has doubled.
    swept_at: usize,
}

impl SpecInterner {
    fn intern(&mut self, spec: Arc<TrainingTask>) -> Arc<TrainingTask> {
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
type ActiveKey = (i64, String);

fn active_key(t: &TaskRecord) -> ActiveKey {
    (t.created_at_ms, t.id.clone())
}

/// The scheduler's snapshot as of the last tick, shared with readers.
#[derive(Debug, Clone, Default)]
pub struct SnapshotBoard(Arc<std::sync::RwLock<Arc<trainyard_sched::Snapshot>>>);

impl SnapshotBoard {
    pub fn get(&self) -> Arc<trainyard_sched::Snapshot> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, snap: Arc<trainyard_sched::Snapshot>) {
        // The old snapshot is dropped after the lock is released.
        let old = std::mem::replace(&mut *self.0.write().unwrap_or_else(|e| e.into_inner()), snap);
        drop(old);
    }
}

/// Questions answered from the scheduler's view at the last tick, by the scheduler's own code, without the
/// control loop's lock: the API asks them while the user types, whatever the loop is doing.
#[derive(Debug, Clone)]
pub struct SchedViews {
    snapshot: SnapshotBoard,
    config: Config,
    catalog: CatalogHandle,
}

impl SchedViews {
    /// Whether a task would be admitted now, and if not why, from the scheduler's own code over its view at
    /// the last tick (every queued task included: a task behind others waits).
    pub fn would_admit(&self, task: &TrainingTask, now_ms: u64) -> (bool, String) {
        let snap = &*self.snapshot.get();
        let Some(candidate) = place::candidate(snap, task, now_ms) else {
            return (
                false,
                "its project group, pool or instance specs are not in the scheduler's view yet".into(),
            );
        };
        let group = candidate.group;
        match trainyard_sched::views::would_admit(snap, candidate, now_ms, &self.config) {
            Decision::Admit(a) => {
                let nodes: Vec<&str> =
                    a.placements.iter().map(|p| snap.nodes[p.node.ix()].name.as_str()).collect();
                (true, format!("would be admitted now with option {} on {}", a.option + 1, nodes.join(", ")))
            }
            Decision::Wait(w) => {
                let name_of = |id: trainyard_sched::AttemptId| {
                    let pending = snap.pending.iter().find(|p| p.id == id).map(|p| p.name.to_string());
                    pending
                        .or_else(|| snap.running.iter().find(|r| r.id == id).map(|r| r.name.clone()))
                        .unwrap_or_else(|| "another task".to_owned())
                };
                (false, w.reason.describe(snap, group, name_of))
            }
            Decision::Preempt(_) => (false, "would wait".into()),
        }
    }

    /// How fragmented the task's pool is for each of its instance-spec options, from the last tick's view:
    /// how many replicas of that size fit now, on how many nodes, and the free blocks.
    pub fn fragmentation(&self, task: &TrainingTask) -> Vec<(String, trainyard_sched::views::Fragmentation)> {
        let snap = &*self.snapshot.get();
        let Some(pool) = snap.pools.iter().position(|p| *p == task.spec.compute.pool) else {
            return Vec::new();
        };
        task.spec
            .compute
            .instance_specs
            .iter()
            .filter_map(|c| {
                let spec = snap.specs.iter().position(|s| s.name == c.spec)?;
                let f = trainyard_sched::views::fragmentation(
                    snap,
                    trainyard_sched::PoolIx(pool as u16),
                    trainyard_sched::SpecIx(spec as u16),
                    c.count_per_node,
                );
                Some((c.spec.clone(), f))
            })
            .collect()
    }

    /// Quota and capacity figures from the scheduler's own view at the last tick, for the groups given (all
    /// when `None`).
    pub fn quota_report(&self, groups: Option<&[String]>) -> Vec<QuotaLine> {
        use trainyard_sched::views;
        let snap = &*self.snapshot.get();
        let catalog = self.catalog.get();
        let ix = |list: &[String], name: &str| list.iter().position(|x| x == name);
        let mut out = Vec::new();
        for q in &catalog.quotas {
            if groups.is_some_and(|g| !g.contains(&q.group)) {
                continue;
            }
            let (Some(g), Some(p), Some(s)) = (
                ix(&snap.groups, &q.group),
                ix(&snap.pools, &q.pool),
                snap.specs.iter().position(|x| x.name == q.spec),
            ) else {
                continue;
            };
            let (g, p, s) = (
                trainyard_sched::GroupIx(g as u16),
                trainyard_sched::PoolIx(p as u16),
                trainyard_sched::SpecIx(s as u16),
            );
            let remaining = views::remaining_quota(snap, g, q.resource_type, p, s);
            out.push(QuotaLine {
                group: q.group.clone(),
                resource_type: q.resource_type.to_string(),
                pool: q.pool.clone(),
                spec: q.spec.clone(),
                limit: q.units,
                remaining: remaining.unwrap_or(q.units),
                pool_available: views::pool_available(snap, p, s),
                idle: views::idle_quantity(snap, p, s),
                unreserved: views::unreserved_available(snap, p, s),
            });
        }
        out
    }
}

/// One quota and the capacity figures of its pool and spec, in spec units.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuotaLine {
    pub group: String,
    pub resource_type: String,
    pub pool: String,
    pub spec: String,
    pub limit: u64,
    pub remaining: u64,
    /// Units the pool's free capacity holds now (a reference, not a reservation).
    pub pool_available: u64,
    /// Reserved by groups and unused now (what Idle tasks may use).
    pub idle: u64,
    /// Not reserved by anyone and not used by Ondemand tasks.
    pub unreserved: u64,
}

/// What one tick did, for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TickReport {
    pub admitted: u32,
    pub preempted: u32,
    pub waiting: u32,
    pub observations: u32,
    /// Transitions lost to a concurrent change (retried next tick).
    pub conflicts: u32,
    /// Attempts about to change status soon by themselves (admitted, starting, stopping): the loop looks
    /// again sooner while there are any, so a task shows Running within milliseconds of its processes.
    pub settling: u32,
    /// Whether this tick ran a scheduling cycle (false: nothing the plan reads had changed, the last one
    /// stands).
    pub planned: bool,
}

/// What the loop keeps of a task's spec between ticks: what scheduling, placement and alarms read. The
/// environment (env values, mounts, the command) and the Ray runtime env are dropped; a launch reads the full
/// spec from the store. With tens of thousands queued this is most of the loop's memory.
fn slim(mut task: TrainingTask) -> TrainingTask {
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
const SYNC_SKEW_MS: i64 = 250;
const WIDE_SYNC_SKEW_MS: i64 = 2_000;
const WIDE_SYNC_EVERY_MS: i64 = 1_000;
/// A full read of the active tasks at least this often, whatever the incremental syncs saw.
const FULL_SYNC_EVERY_MS: i64 = 10_000;

/// How often queued tasks are checked against queued-too-long alarms (their thresholds are in seconds).
const QUEUE_ALARM_EVERY_MS: i64 = 1_000;

/// Statuses that the control loop still has work for.
const ACTIVE: &[&str] = &["Queued", "Admitted", "Starting", "Prechecking", "Running", "Stopping"];

/// Random enough for ids and name suffixes: the standard library's per-process random hash keys.
fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64),
    );
    h.finish()
}

/// A new task id: 16 hex digits, the submission time in milliseconds (44 bits) then a per-process counter
/// (20 bits) that starts at a random value. Ids of one process never repeat (up to a million a
/// millisecond), two servers on one database almost never collide (a collision is retried like a taken
/// name), and ids grow with time, so the store's indexes on them take new tasks at their end instead of
/// at random places (fewer pages written per commit).
fn task_id(now_ms: i64) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let start = *START.get_or_init(random_u64);
    let n = start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) & 0xF_FFFF;
    let ms = (now_ms.max(0) as u64) & ((1 << 44) - 1);
    format!("{:016x}", (ms << 20) | n)
}

fn suffix(n: u64) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut n = n;
    (0..5)
        .map(|_| {
            let c = ALPHABET[(n % 36) as usize] as char;
            n /= 36;
            c
        })
        .collect()
}

/// One lifecycle transition to apply, with what changes along with the status.
#[derive(Debug)]
struct Step {
    to: Status,
    reason: Reason,
    message: String,
    attempt: i64,
    /// `Some("")` clears the placement; `None` keeps it.
    placement: Option<String>,
    retries: Option<i64>,
}

/// Validates and queues a task (see [`Control::submit`]). Needs only the store and the catalog, so the API
/// can take submissions without waiting for the control loop.
pub async fn submit(
    store: &Store,
    catalog: &Catalog,
    secrets: &SecretBox,
    owner: &str,
    body: &[u8],
    idempotency_key: Option<&str>,
    now_ms: i64,
) -> Result<Created, SubmitError> {
    let task = validate(catalog, body)?;
    store_task(store, secrets, owner, &task, body, idempotency_key, now_ms).await
}

/// The task a body describes, if it has no errors against the catalog.
pub fn validate(catalog: &Catalog, body: &[u8]) -> Result<TrainingTask, SubmitError> {
    let checked = check(body, catalog);
    match checked.valid_task() {
        Some(t) => Ok(t.clone()),
        None => Err(SubmitError::Invalid(checked.report)),
    }
}

/// Queues a validated task: its hidden values sealed, a unique name, an idempotency key when given.
pub async fn store_task(
    store: &Store,
    secrets: &SecretBox,
    owner: &str,
    task: &TrainingTask,
    body: &[u8],
    idempotency_key: Option<&str>,
    now_ms: i64,
) -> Result<Created, SubmitError> {
    // The id is chosen before sealing: hidden values are bound to it (and to the owner), so they cannot be
    // replayed into another task's record.
    let id = task_id(now_ms);
    let mut sealed = task.clone();
    secrets
        .seal(&mut sealed, &id, owner)
        .map_err(|e| SubmitError::Store(StoreError::Corrupt(format!("cannot seal hidden values: {e}"))))?;
    let spec_json = serde_json::to_string(&sealed).expect("a TrainingTask always serialises");
    // A name taken by chance gets another suffix; the bound keeps a broken store from looping.
    const NAME_TRIES: usize = 8;
    let mut last = None;
    for _ in 0..NAME_TRIES {
        let r = random_u64();
        let new = NewTask {
            id: id.clone(),
            name: format!("{}-{}", task.metadata.name_prefix, suffix(r.rotate_left(17))),
            owner: owner.to_owned(),
            project_group: task.metadata.project_group.clone(),
            task_type: task.spec.task_type.to_string(),
            status: Status::Queued.to_string(),
            public: task.metadata.public,
            labels: task.metadata.labels.clone(),
            spec_json: spec_json.clone(),
            created_at_ms: now_ms,
            idempotency: idempotency_key.map(|k| (k.to_owned(), secrets.digest(body))),
            first_event: Some((Reason::Submitted.to_string(), format!("submitted by {owner}"))),
        };
        match store.create_task(&new).await {
            Err(StoreError::NameTaken(n)) => last = Some(StoreError::NameTaken(n)),
            other => return Ok(other?),
        }
    }
    Err(SubmitError::Store(last.expect("the loop ran at least once")))
}

impl Step {
    /// A transition that changes only status, reason, message and attempt.
    fn new(to: Status, reason: Reason, message: impl Into<String>, attempt: i64) -> Step {
        Step { to, reason, message: message.into(), attempt, placement: None, retries: None }
    }

    fn placement(mut self, json: String) -> Step {
        self.placement = Some(json);
        self
    }

    /// The attempt no longer runs anywhere.
    fn clear_placement(mut self) -> Step {
        self.placement = Some(String::new());
        self
    }

    fn retries(mut self, n: i64) -> Step {
        self.retries = Some(n);
        self
    }
}

/// The control loop over a store and a backend.
#[derive(Debug)]
pub struct Control<B> {
    store: Store,
    backend: B,
    catalog: CatalogHandle,
    config: Config,
    secrets: SecretBox,
    /// The last wait of every queued task, shared with readers (the API) so they never wait for a tick.
    waits: QueueBoard,
    /// Tasks created by this process since the last tick.
    arrivals: Arrivals,
    specs: SpecInterner,
    options: OptionsCache,
    /// Something the plan reads changed since the last one (see `tick`).
    dirty: bool,
    /// The catalog the last plan was made under.
    planned_for: Option<Arc<Catalog>>,
    /// Until when the clock alone leaves the last plan standing (starvation thresholds).
    quiet_until_ms: i64,
    /// Tasks waiting in the last plan.
    last_waiting: u32,
    /// When queued tasks are next checked against their queued-too-long alarms.
    queue_alarms_at_ms: i64,
    nominated: BTreeMap<String, Vec<String>>,
    /// Nodes each task's next attempts avoid (node replacement), from the backend's suspicions.
    excluded: BTreeMap<String, std::collections::BTreeSet<String>>,
    /// Autoscaling RayJobs that want more workers, and how many (within their bounds).
    scale_wants: BTreeMap<String, u32>,
    /// Tasks already reported as unreadable.
    unreadable: std::collections::BTreeSet<String>,
    /// The tasks the loop has work for, in queue order, kept up to date incrementally: this process's
    /// arrivals, rows changed since the last sync, and a full read every [`FULL_SYNC_EVERY_MS`] as a safety
    /// net. Records are shared with the tick that reads them, not copied.
    active: BTreeMap<ActiveKey, Entry>,
    synced_to_ms: Option<i64>,
    wide_synced_ms: i64,
    full_synced_ms: i64,
    /// The scheduler's view at the last tick, for the quota figures.
    views: SchedViews,
}

impl<B: Backend> Control<B> {
    pub fn new(
        store: Store,
        backend: B,
        catalog: impl Into<CatalogHandle>,
        config: Config,
        secrets: SecretBox,
    ) -> Self {
        let catalog: CatalogHandle = catalog.into();
        let views = SchedViews {
            snapshot: SnapshotBoard::default(),
            config: config.clone(),
            catalog: catalog.clone(),
        };
        Control {
            store,
            backend,
            catalog,
            config,
            secrets,
            waits: QueueBoard::default(),
            arrivals: Arrivals::default(),
            specs: SpecInterner::default(),
            options: OptionsCache::default(),
            dirty: true,
            planned_for: None,
            quiet_until_ms: 0,
            last_waiting: 0,
            queue_alarms_at_ms: 0,
            nominated: BTreeMap::new(),
            scale_wants: BTreeMap::new(),
            excluded: BTreeMap::new(),
            unreadable: Default::default(),
            views,
            active: BTreeMap::new(),
            synced_to_ms: None,
            wide_synced_ms: 0,
            full_synced_ms: 0,
        }
    }

    /// Brings `active` up to date with the store.
    async fn sync_active(&mut self, now_ms: i64) -> Result<(), StoreError> {
        match self.synced_to_ms {
            Some(since) if now_ms - self.full_synced_ms < FULL_SYNC_EVERY_MS => {
                let skew = if now_ms - self.wide_synced_ms >= WIDE_SYNC_EVERY_MS {
                    self.wide_synced_ms = now_ms;
                    WIDE_SYNC_SKEW_MS
                } else {
                    SYNC_SKEW_MS
                };
                for t in self.store.tasks_updated_since(since - skew).await? {
                    self.absorb(t, None);
                }
            }
            _ => {
                let all = self.store.tasks_in_status_without_spec(ACTIVE).await?;
                // Specs already read are kept: they never change.
                let mut old = std::mem::take(&mut self.active);
                for t in all {
                    let key = active_key(&t);
                    let entry = match old.remove(&key) {
                        Some(e) if e.record.version == t.version => e,
                        Some(e) => {
                            self.dirty = true;
                            Entry { record: Arc::new(t), ..e }
                        }
                        None => {
                            self.dirty = true;
                            let (id, name) = (Arc::from(t.id.as_str()), Arc::from(t.name.as_str()));
                            Entry { id, name, record: Arc::new(t), spec: None }
                        }
                    };
                    self.active.insert(key, entry);
                }
                for (_, gone) in old {
                    self.forget(&gone.id);
                }
                // Nodes the active tasks leave out, as recorded (after a restart, the only copy).
                let mut excluded: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
                for (task, node) in self.store.avoided_nodes(ACTIVE).await? {
                    excluded.entry(task).or_default().insert(node);
                }
                if excluded != self.excluded {
                    self.excluded = excluded;
                    self.dirty = true;
                }
                self.full_synced_ms = now_ms;
                self.wide_synced_ms = now_ms;
            }
        }
        self.synced_to_ms = Some(now_ms);
        Ok(())
    }

    /// Takes a newer version of a task into `active` (or drops it when the loop has nothing left to do).
    fn absorb(&mut self, mut t: TaskRecord, spec: Option<Arc<TrainingTask>>) {
        let key = active_key(&t);
        let spec = spec.map(|s| self.specs.intern(s));
        let keep = ACTIVE.contains(&t.status.as_str());
        match self.active.get_mut(&key) {
            // Known already at this version: only a spec it lacked is news.
            Some(known) if known.record.version >= t.version && known.spec.is_none() && spec.is_some() => {
                known.spec = spec;
                self.dirty = true;
            }
            Some(known) if known.record.version >= t.version => {}
            Some(known) if keep => {
                t.spec_json = String::new();
                known.record = Arc::new(t);
                known.spec = known.spec.take().or(spec);
                self.dirty = true;
            }
            Some(_) => {
                self.active.remove(&key);
                self.forget(&t.id);
            }
            None if keep => {
                t.spec_json = String::new();
                let (id, name) = (Arc::from(t.id.as_str()), Arc::from(t.name.as_str()));
                self.active.insert(key, Entry { id, name, record: Arc::new(t), spec });
                self.dirty = true;
            }
            None => {}
        }
    }

    /// Drops what the loop kept about a task that has left the active set.
    fn forget(&mut self, id: &str) {
        self.dirty = true;
        self.nominated.remove(id);
        self.scale_wants.remove(id);
        self.excluded.remove(id);
    }

    /// Reads and parses, in bulk, the specs of active tasks not yet known (those created by another process,
    /// or read back after a restart). A spec that cannot be parsed is reported once and its task left out.
    async fn read_missing_specs(&mut self, now_ms: i64) -> Result<(), StoreError> {
        let missing: Vec<&str> = self
            .active
            .values()
            .filter(|e| e.spec.is_none() && !self.unreadable.contains(&*e.id))
            .map(|e| &*e.id)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let mut specs = self.store.specs_of(&missing).await?;
        let mut unreadable = Vec::new();
        // Tasks submitted from one document store the same text: it is parsed once (a restart with a deep
        // queue of a sweep's tasks reads them all).
        let mut parsed: HashMap<String, Arc<TrainingTask>> = HashMap::new();
        for e in self.active.values_mut().filter(|e| e.spec.is_none()) {
            let Some(json) = specs.remove(&*e.id) else { continue };
            if let Some(spec) = parsed.get(&json) {
                e.spec = Some(spec.clone());
                self.dirty = true;
                continue;
            }
            let t = TaskRecord { spec_json: json, ..(*e.record).clone() };
            match Self::parse(&t) {
                Ok(task) => {
                    let spec = self.specs.intern(Arc::new(slim(task)));
                    parsed.insert(t.spec_json, spec.clone());
                    e.spec = Some(spec);
                    self.dirty = true;
                }
                Err(err) => unreadable.push((e.record.clone(), err)),
            }
        }
        for (t, err) in unreadable {
            if self.unreadable.insert(t.id.clone()) {
                self.store.append_event(&t.id, t.attempt, now_ms, "InternalError", &err.to_string()).await?;
            }
        }
        Ok(())
    }

    /// The handle through which this process's API hands new tasks to the loop.
    pub fn arrivals(&self) -> Arrivals {
        self.arrivals.clone()
    }

    /// The scheduler's view at the last tick, for readers that must not wait for the loop (would-admit,
    /// fragmentation, quota figures).
    pub fn views(&self) -> SchedViews {
        self.views.clone()
    }

    /// A handle on the queue positions and wait reasons, for readers that must not wait for the loop.
    pub fn queue_board(&self) -> QueueBoard {
        self.waits.clone()
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The catalog handle (shared with the API).
    pub fn catalog(&self) -> &CatalogHandle {
        &self.catalog
    }

    /// The last wait of a queued task.
    pub fn queue_info(&self, task_id: &str) -> Option<QueueInfo> {
        self.waits.get(task_id)
    }

    /// Validates and queues a task. With an idempotency key, a retry returns the task the first call created.
    pub async fn submit(
        &self,
        owner: &str,
        body: &[u8],
        idempotency_key: Option<&str>,
        now_ms: i64,
    ) -> Result<Created, SubmitError> {
        let catalog = self.catalog.get();
        let task = validate(&catalog, body)?;
        let created =
            store_task(&self.store, &self.secrets, owner, &task, body, idempotency_key, now_ms).await?;
        if let Created::New(t) = &created {
            self.arrivals.push(t, &task);
        }
        Ok(created)
    }

    /// Applies one checked transition. `Ok(None)` when a concurrent change won (the next tick retries).
    async fn apply(&self, t: &TaskRecord, step: Step, now_ms: i64) -> Result<Option<TaskRecord>, StoreError> {
        let Step { to, reason, message, attempt, placement, retries } = step;
        let from = Status::from_name(&t.status)
            .ok_or_else(|| StoreError::Corrupt(format!("status {:?}", t.status)))?;
        if let Err(e) = transition(from, to, reason) {
            // The control loop only asks for legal transitions; reaching this is a bug, recorded, not applied.
            self.store.append_event(&t.id, t.attempt, now_ms, "InternalError", &e.to_string()).await?;
            return Ok(None);
        }
        let change = Transition {
            task_id: t.id.clone(),
            expected_version: t.version,
            status: to.to_string(),
            attempt,
            at_ms: now_ms,
            reason: reason.to_string(),
            message,
            placement,
            retries,
        };
        let message = change.message.clone();
        match self.store.transition(&change).await {
            Ok(r) => {
                for &event in alarms::events_for(to, reason) {
                    self.raise(&r, event, &message, now_ms).await?;
                }
                Ok(Some(r))
            }
            Err(StoreError::VersionConflict { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Commits this tick's admissions, each task taken to Admitted (with its placement) and on to Starting,
    /// all in one transaction, then launches them. A task changed meanwhile is left for the next tick.
    async fn admit(
        &mut self,
        tasks: &[Arc<TaskRecord>],
        admits: Vec<(usize, Placement)>,
        now_ms: i64,
        report: &mut TickReport,
    ) -> Result<(), StoreError> {
        if admits.is_empty() {
            return Ok(());
        }
        let chains: Vec<(&TaskRecord, Vec<Step>)> = admits
            .iter()
            .map(|(i, placement)| {
                let t = &*tasks[*i];
                let json = serde_json::to_string(placement).expect("a placement always serialises");
                let nodes: Vec<&str> = placement.replicas.iter().map(|r| r.node.as_str()).collect();
                let message = format!("on {} with {}", nodes.join(", "), placement.spec_summary());
                let steps = vec![
                    Step::new(Status::Admitted, Reason::Admitted, message, t.attempt).placement(json),
                    Step::new(Status::Starting, Reason::Admitted, "starting replicas", t.attempt),
                ];
                (t, steps)
            })
            .collect();
        let done = self.apply_chains(&chains, now_ms).await?;
        for ((_, placement), t) in admits.iter().zip(done) {
            let Some(t) = t else {
                // Its record here is behind the store's: planned again once it is read back.
                report.conflicts += 1;
                self.dirty = true;
                continue;
            };
            self.nominated.remove(&t.id);
            // Committed first; a failed launch is retried by reconciliation on the next tick.
            match self.launch_spec(&t, placement).await {
                Some(spec) => {
                    let _ = self.backend.launch(&spec).await;
                }
                None => {
                    let why = "a hidden value (the task's or the owner's TaskEnv) cannot be opened: it was sealed under another server key or for another record; set it again";
                    self.store.append_event(&t.id, t.attempt, now_ms, "InternalError", why).await?;
                }
            }
            report.admitted += 1;
        }
        Ok(())
    }

    /// Applies chains of checked transitions, several tasks at once, in one transaction: each task's steps
    /// in order. A task's answer is its record after its last step, or `None` when a concurrent change won
    /// (its steps then wrote nothing: the transaction runs them back to back on the row it locked).
    async fn apply_chains(
        &self,
        chains: &[(&TaskRecord, Vec<Step>)],
        now_ms: i64,
    ) -> Result<Vec<Option<TaskRecord>>, StoreError> {
        let mut changes = Vec::new();
        let mut spans = Vec::with_capacity(chains.len());
        for (t, steps) in chains {
            let mut from = Status::from_name(&t.status)
                .ok_or_else(|| StoreError::Corrupt(format!("status {:?}", t.status)))?;
            let mut illegal = None;
            for step in steps {
                if let Err(e) = transition(from, step.to, step.reason) {
                    illegal = Some(e);
                    break;
                }
                from = step.to;
            }
            if let Some(e) = illegal {
                // The control loop only asks for legal transitions; reaching this is a bug, recorded.
                self.store.append_event(&t.id, t.attempt, now_ms, "InternalError", &e.to_string()).await?;
                spans.push(None);
                continue;
            }
            let first = changes.len();
            for (k, step) in (0i64..).zip(steps) {
                changes.push(Transition {
                    task_id: t.id.clone(),
                    expected_version: t.version + k,
                    status: step.to.to_string(),
                    attempt: step.attempt,
                    at_ms: now_ms,
                    reason: step.reason.to_string(),
                    message: step.message.clone(),
                    placement: step.placement.clone(),
                    retries: step.retries,
                });
            }
            spans.push(Some(first..changes.len()));
        }
        let answers = self.store.transitions(&changes).await?;
        let mut out = Vec::with_capacity(chains.len());
        for ((_, steps), span) in chains.iter().zip(spans) {
            let Some(span) = span else {
                out.push(None);
                continue;
            };
            let mut last = None;
            for (step, answer) in steps.iter().zip(&answers[span]) {
                match answer {
                    Ok(r) => {
                        for &event in alarms::events_for(step.to, step.reason) {
                            self.raise(r, event, &step.message, now_ms).await?;
                        }
                        last = Some(r.clone());
                    }
                    Err(StoreError::VersionConflict { .. } | StoreError::NotFound(_)) => {
                        last = None;
                        break;
                    }
                    Err(e) => return Err(StoreError::Corrupt(e.to_string())),
                }
            }
            out.push(last);
        }
        Ok(out)
    }

    /// Queues an alarm event for the task's subscriptions.
    async fn raise(
        &self,
        t: &TaskRecord,
        event: trainyard_core::spec::AlarmEvent,
        message: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let task = match self.active.get(&active_key(t)).and_then(|e| e.spec.clone()) {
            Some(task) => task,
            None => match self.store.get_task(&t.id).await?.map(|full| Self::parse(&full)) {
                Some(Ok(task)) => Arc::new(task),
                _ => return Ok(()),
            },
        };
        alarms::raise(&self.store, &task, t, event, message, now_ms).await
    }

    fn parse(t: &TaskRecord) -> Result<TrainingTask, CommandError> {
        let (task, d) = trainyard_core::parse(t.spec_json.as_bytes());
        match task {
            Some(task) if d.report.is_ok() => Ok(task),
            _ => Err(CommandError::Corrupt(t.id.clone(), format!("{:?}", d.report.problems))),
        }
    }

    /// What the backend gets: the task with its hidden values opened (only backends ever see them), and the
    /// owner's TaskEnv added under every name the task does not set itself (the task's own value wins).
    ///
    /// The loop's cache holds slimmed specs, so the full one is read from the store here (once per launch).
    async fn launch_spec(&self, t: &TaskRecord, placement: &Placement) -> Option<LaunchSpec> {
        let full = self.store.get_task(&t.id).await.ok()??;
        let mut task = Self::parse(&full).ok()?;
        self.secrets.open(&mut task, &t.id, &t.owner).ok()?;
        for var in self.store.task_env(&t.owner).await.ok()? {
            if task.spec.environment.env.iter().any(|e| e.name == var.name) {
                continue;
            }
            // Only a value stored as hidden is opened, and only if it was sealed for this user and name: a
            // plain value that looks sealed (copied from the database) stays the text it is.
            let value = if var.hidden {
                let binding = secrets::Binding::TaskEnv { user: &t.owner, name: &var.name };
                self.secrets.open_value(&var.value, &binding).ok()?
            } else {
                var.value
            };
            task.spec.environment.env.push(trainyard_core::spec::EnvVar {
                name: var.name,
                value,
                hidden: var.hidden,
            });
        }
        Some(LaunchSpec {
            key: AttemptKey { task_id: t.id.clone(), attempt: t.attempt },
            task_name: t.name.clone(),
            owner: t.owner.clone(),
            task,
            replicas: placement.replicas.clone(),
            catalog: self.catalog.get(),
        })
    }

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
        self.reconcile(&tasks).await;
        // What this tick admitted or preempted starts or stops next.
        report.settling += report.admitted + report.preempted;
        Ok(report)
    }

    /// Builds the scheduler's snapshot, runs a cycle and commits its decisions: admissions (one transaction),
    /// preemptions, and the queue board's places and reasons.
    #[allow(clippy::too_many_arguments)]
    async fn plan(
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
                    let _ = self
                        .backend
                        .stop(&AttemptKey { task_id: t.id.clone(), attempt: t.attempt }, StopCause::Preempted)
                        .await;
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

    /// Makes the backend match the store: tasks holding resources are launched (again, idempotently), and
    /// stopping ones stopped; lost launches and lost stops are repaired here.
    /// Why the task's current attempt is being stopped, from its events (the last stop request of the
    /// attempt: preemption, a user's stop, deletion, a failed node); a user's stop when none is recorded.
    async fn recorded_stop_cause(&self, t: &TaskRecord) -> Result<StopCause, CommandError> {
        let events = self.store.list_events(&t.id, 0, 10_000).await?;
        let cause =
            events.iter().rev().filter(|e| e.attempt == t.attempt).find_map(|e| match e.reason.as_str() {
                "Preempted" => Some(StopCause::Preempted),
                "StopRequested" => Some(StopCause::UserStop),
                "Deleted" => Some(StopCause::Deleted),
                "NodeFailed" => Some(StopCause::NodeFailed),
                _ => None,
            });
        Ok(cause.unwrap_or(StopCause::UserStop))
    }

    async fn reconcile(&self, tasks: &[Arc<TaskRecord>]) {
        let alive = self.backend.alive().await;
        let catalog = self.catalog.get();
        let failed: std::collections::BTreeSet<&str> =
            catalog.nodes.iter().filter(|(_, n)| n.failed).map(|(name, _)| name.as_str()).collect();
        for t in tasks {
            if t.status == "Queued" {
                continue;
            }
            let key = AttemptKey { task_id: t.id.clone(), attempt: t.attempt };
            // A node marked failed takes its replicas down with it: the attempt fails as NodeFailed and the
            // fault-tolerance path decides what comes next.
            if !failed.is_empty()
                && matches!(t.status.as_str(), "Starting" | "Prechecking" | "Running")
                && let Ok(p) = serde_json::from_str::<Placement>(&t.placement)
                && p.replicas.iter().any(|r| failed.contains(r.node.as_str()))
            {
                let _ = self.backend.stop(&key, StopCause::NodeFailed).await;
                continue;
            }
            match t.status.as_str() {
                "Starting" | "Prechecking" | "Running" if !alive.contains(&key) => {
                    if let Ok(p) = serde_json::from_str::<Placement>(&t.placement)
                        && let Some(spec) = self.launch_spec(t, &p).await
                    {
                        let _ = self.backend.launch(&spec).await;
                    }
                }
                "Stopping" => {
                    // Asked again with the cause it was stopped for (a restarted backend does not know it).
                    if let Ok(cause) = self.recorded_stop_cause(t).await {
                        let _ = self.backend.stop(&key, cause).await;
                    }
                }
                _ => {}
            }
        }
    }

    /// Turns one observation into transitions. Returns false when a concurrent change won.
    async fn observe(&mut self, obs: &Observation, now_ms: i64) -> Result<bool, CommandError> {
        let key = obs.key();
        let Some(t) = self.store.get_task(&key.task_id).await? else { return Ok(true) };
        if t.attempt != key.attempt {
            // A report about an older attempt: already handled.
            return Ok(true);
        }
        let status = Status::from_name(&t.status)
            .ok_or_else(|| CommandError::Corrupt(t.id.clone(), t.status.clone()))?;
        let done = match (obs, status) {
            (Observation::Started { precheck: true, .. }, Status::Starting) => {
                self.apply(
                    &t,
                    Step::new(
                        Status::Prechecking,
                        Reason::PrecheckStarted,
                        "running the resource precheck",
                        t.attempt,
                    ),
                    now_ms,
                )
                .await?
            }
            (Observation::Started { precheck: false, .. }, Status::Starting) => {
                self.apply(
                    &t,
                    Step::new(Status::Running, Reason::Started, "every replica started", t.attempt),
                    now_ms,
                )
                .await?
            }
            (Observation::PrecheckPassed { message, .. }, Status::Prechecking) => {
                self.apply(
                    &t,
                    Step::new(Status::Running, Reason::PrecheckPassed, message.clone(), t.attempt),
                    now_ms,
                )
                .await?
            }
            (Observation::Finished { reason: Reason::Completed, message, .. }, Status::Running) => {
                self.apply(
                    &t,
                    Step::new(Status::Succeeded, Reason::Completed, message.clone(), t.attempt),
                    now_ms,
                )
                .await?
            }
            (Observation::Finished { reason, message, .. }, s)
                if s.holds_resources() && s != Status::Stopping =>
            {
                let Some(failed) = self
                    .apply(
                        &t,
                        Step::new(Status::Failed, *reason, message.clone(), t.attempt).clear_placement(),
                        now_ms,
                    )
                    .await?
                else {
                    return Ok(false);
                };
                self.maybe_retry(&failed, *reason, now_ms).await?;
                Some(failed)
            }
            (Observation::Stopped { cause, message, .. }, Status::Stopping) => {
                // Preempted attempts go back to the queue without spending the retry budget, and so do those a
                // failed node took down. The backend says why it stopped; a stop recorded before backends kept
                // the cause is read from the attempt's events.
                let cause = match cause {
                    Some(c) => *c,
                    None => self.recorded_stop_cause(&t).await?,
                };
                if matches!(cause, StopCause::Preempted | StopCause::NodeFailed) {
                    self.apply(
                        &t,
                        Step::new(
                            Status::Queued,
                            Reason::Requeued,
                            format!("{message}; back in the queue"),
                            t.attempt + 1,
                        )
                        .clear_placement(),
                        now_ms,
                    )
                    .await?
                } else {
                    self.apply(
                        &t,
                        Step::new(Status::Stopped, Reason::Terminated, message.clone(), t.attempt)
                            .clear_placement(),
                        now_ms,
                    )
                    .await?
                }
            }
            (Observation::Note { reason, message, .. }, _) => {
                self.store.append_event(&t.id, t.attempt, now_ms, reason, message).await?;
                Some(t.clone())
            }
            (Observation::NodeSuspect { node, message, .. }, _) => {
                let task = Self::parse(&t)?;
                let replace = task.spec.advanced.fault_tolerance.as_ref().is_none_or(|f| f.node_replacement);
                let what = if replace {
                    // Kept in the store first, so a restarted loop still leaves the node out.
                    self.store.avoid_node(&t.id, node, now_ms).await?;
                    self.excluded.entry(t.id.clone()).or_default().insert(node.clone());
                    self.dirty = true;
                    format!("{message}; the next attempts of this task leave it out")
                } else {
                    format!("{message}; node replacement is off, so it may be used again")
                };
                self.store.append_event(&t.id, t.attempt, now_ms, "NodeSuspect", &what).await?;
                Some(t.clone())
            }
            (Observation::ScaleUp { workers, message, .. }, Status::Running) => {
                let (current, bounds) = self.workers_and_bounds(&t)?;
                if let Some((_, max)) = bounds {
                    let extra = (*workers).min(max.saturating_sub(current));
                    if extra > 0 && self.scale_wants.get(&t.id) != Some(&extra) {
                        let why = format!(
                            "{message}; asking for {extra} more workers ({current} of at most {max})"
                        );
                        self.store.append_event(&t.id, t.attempt, now_ms, "ScaleUpRequested", &why).await?;
                    }
                    if extra > 0 {
                        self.scale_wants.insert(t.id.clone(), extra);
                        self.dirty = true;
                    }
                }
                Some(t.clone())
            }
            (Observation::ScaleDown { replica, message, .. }, Status::Running) => {
                let (current, bounds) = self.workers_and_bounds(&t)?;
                match bounds {
                    Some((min, _)) if current > min => self.shrink(&t, replica, message, now_ms).await?,
                    _ => Some(t.clone()),
                }
            }
            // Anything else is stale (the task moved on); nothing to do.
            _ => Some(t.clone()),
        };
        Ok(done.is_some())
    }

    /// A running task's worker count and, for an autoscaling RayJob, its (min, max) workers.
    fn workers_and_bounds(&self, t: &TaskRecord) -> Result<(u32, Option<(u32, u32)>), CommandError> {
        let task = Self::parse(t)?;
        let bounds = task
            .spec
            .ray
            .as_ref()
            .and_then(|r| r.autoscaling.as_ref())
            .filter(|a| a.enabled)
            .map(|a| (a.min_workers, a.max_workers));
        let current = serde_json::from_str::<Placement>(&t.placement)
            .map_or(0, |p| p.replicas.iter().filter(|r| r.role == "worker").count() as u32);
        Ok((current, bounds))
    }

    /// Autoscaling admitted more workers: the placement grows and the backend starts them.
    async fn grow(
        &self,
        t: &TaskRecord,
        snap: &trainyard_sched::Snapshot,
        a: &trainyard_sched::Admission,
        now_ms: i64,
    ) -> Result<(), CommandError> {
        let Ok(p) = serde_json::from_str::<Placement>(&t.placement) else { return Ok(()) };
        let grown = p.grown(snap, a);
        let nodes: Vec<&str> = grown.replicas[p.replicas.len()..].iter().map(|r| r.node.as_str()).collect();
        let message = format!("{} more workers on {}", nodes.len(), nodes.join(", "));
        self.rescale(t, &grown, "ScaledUp", message, now_ms).await
    }

    /// Autoscaling takes an idle worker away: the placement shrinks (its resources are free at once) and the
    /// backend stops it.
    async fn shrink(
        &self,
        t: &TaskRecord,
        replica: &str,
        why: &str,
        now_ms: i64,
    ) -> Result<Option<TaskRecord>, CommandError> {
        let Ok(p) = serde_json::from_str::<Placement>(&t.placement) else { return Ok(Some(t.clone())) };
        let Some(index) = replica.rsplit('-').next().and_then(|i| i.parse::<u32>().ok()) else {
            return Ok(Some(t.clone()));
        };
        let task = Self::parse(t)?;
        let Some(choice) = task.spec.compute.instance_specs.get(p.option) else { return Ok(Some(t.clone())) };
        let Some(worker) = p.replicas.iter().find(|r| r.role == "worker" && r.index == index) else {
            return Ok(Some(t.clone()));
        };
        let spec = self.catalog.get().instance_specs.get(&choice.spec).cloned();
        let units = spec.map_or(u64::from(choice.count_per_node), |s| {
            let per = if s.gpus > 0 { u64::from(s.gpus) } else { u64::from(s.vcpus.max(1)) };
            let need = if s.gpus > 0 { worker.resources.gpus } else { worker.resources.vcpus };
            need.div_ceil(per).max(1)
        });
        let shrunk = p.shrunk(index, units, &choice.spec);
        self.rescale(t, &shrunk, "ScaledDown", format!("{why}; {replica} removed"), now_ms).await?;
        Ok(Some(t.clone()))
    }

    async fn rescale(
        &self,
        t: &TaskRecord,
        placement: &Placement,
        reason: &str,
        message: String,
        now_ms: i64,
    ) -> Result<(), CommandError> {
        let json = serde_json::to_string(placement).expect("a placement always serialises");
        let change = trainyard_store::Transition {
            task_id: t.id.clone(),
            expected_version: t.version,
            status: t.status.clone(),
            attempt: t.attempt,
            at_ms: now_ms,
            reason: reason.to_owned(),
            message,
            placement: Some(json),
            retries: None,
        };
        match self.store.transition(&change).await {
            Ok(updated) => {
                if let Some(spec) = self.launch_spec(&updated, placement).await {
                    let _ = self.backend.scale(&spec).await;
                }
                Ok(())
            }
            Err(StoreError::VersionConflict { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// After a failure: requeue infrastructure failures within the task's budget, and raise the alarms.
    async fn maybe_retry(&self, t: &TaskRecord, reason: Reason, now_ms: i64) -> Result<(), CommandError> {
        use trainyard_core::spec::AlarmEvent;
        let task = Self::parse(t)?;
        let budget = task
            .spec
            .advanced
            .fault_tolerance
            .as_ref()
            .filter(|f| f.enabled)
            .map_or(0, |f| f.max_resubmissions);
        if reason == Reason::PrecheckFailed {
            self.raise(t, AlarmEvent::PrecheckFailed, "the resource precheck failed", now_ms).await?;
        }
        if failure_class(reason) == FailureClass::Infrastructure && t.retries < i64::from(budget) {
            let message = format!("automatic resubmission {} of {budget} after {reason}", t.retries + 1);
            let step = Step::new(Status::Queued, Reason::Requeued, message.clone(), t.attempt + 1)
                .retries(t.retries + 1);
            if let Some(requeued) = self.apply(t, step, now_ms).await? {
                self.raise(&requeued, AlarmEvent::Resubmitted, &message, now_ms).await?;
                if reason == Reason::NodeFailed {
                    self.raise(
                        &requeued,
                        AlarmEvent::NodeReplaced,
                        "the failed node is left out of the next attempt",
                        now_ms,
                    )
                    .await?;
                }
            }
        } else {
            if failure_class(reason) == FailureClass::Infrastructure {
                let why = format!("no automatic resubmission left ({budget} allowed)");
                self.store
                    .append_event(&t.id, t.attempt, now_ms, Reason::RetryBudgetSpent.as_str(), &why)
                    .await?;
            }
            self.raise(t, AlarmEvent::Failed, &format!("failed: {reason}"), now_ms).await?;
        }
        Ok(())
    }

    /// Stops a task: a queued one at once, a running one through Stopping (checkpoint window, then
    /// termination).
    pub async fn stop(&self, task_id: &str, deleting: bool, now_ms: i64) -> Result<TaskRecord, CommandError> {
        let t =
            self.store.get_task(task_id).await?.ok_or_else(|| CommandError::NotFound(task_id.to_owned()))?;
        let status = Status::from_name(&t.status)
            .ok_or_else(|| CommandError::Corrupt(t.id.clone(), t.status.clone()))?;
        let reason = if deleting { Reason::Deleted } else { Reason::StopRequested };
        let to = match status {
            Status::Queued => Status::Stopped,
            s if s.holds_resources() && s != Status::Stopping => Status::Stopping,
            s => {
                return Err(CommandError::WrongState {
                    name: t.name.clone(),
                    status: s.to_string(),
                    what: "there is nothing to stop",
                });
            }
        };
        let message = if deleting { "deleted by a user" } else { "stopped by a user" };
        let updated =
            self.apply(&t, Step::new(to, reason, message, t.attempt), now_ms).await?.ok_or_else(|| {
                CommandError::WrongState {
                    name: t.name.clone(),
                    status: t.status.clone(),
                    what: "it changed meanwhile; try again",
                }
            })?;
        if to == Status::Stopping {
            let cause = if deleting { StopCause::Deleted } else { StopCause::UserStop };
            let _ = self.backend.stop(&AttemptKey { task_id: t.id.clone(), attempt: t.attempt }, cause).await;
        }
        Ok(updated)
    }

    /// Queues an ended task again as a new attempt (a manual resubmission does not spend the retry budget).
    pub async fn resubmit(&self, task_id: &str, now_ms: i64) -> Result<TaskRecord, CommandError> {
        let t =
            self.store.get_task(task_id).await?.ok_or_else(|| CommandError::NotFound(task_id.to_owned()))?;
        let status = Status::from_name(&t.status)
            .ok_or_else(|| CommandError::Corrupt(t.id.clone(), t.status.clone()))?;
        // A deleted task is out of every list and view the loop keeps: queued again it would wait forever,
        // unseen. (A delete racing this call bumps the version, so the transition below then conflicts.)
        if self.store.is_deleted(&t.id).await? {
            return Err(CommandError::WrongState {
                name: t.name.clone(),
                status: "deleted".into(),
                what: "a deleted task cannot be resubmitted; clone it to run its spec again",
            });
        }
        if !status.is_terminal() {
            return Err(CommandError::WrongState {
                name: t.name.clone(),
                status: t.status.clone(),
                what: "only an ended task can be resubmitted",
            });
        }
        self.apply(
            &t,
            Step::new(Status::Queued, Reason::Resubmitted, "resubmitted by a user", t.attempt + 1)
                .clear_placement(),
            now_ms,
        )
        .await?
        .ok_or_else(|| CommandError::WrongState {
            name: t.name.clone(),
            status: t.status.clone(),
            what: "it changed meanwhile; try again",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_are_unique_and_grow_with_time() {
        let same_ms: std::collections::BTreeSet<String> =
            (0..100_000).map(|_| task_id(1_764_000_000_000)).collect();
        assert_eq!(same_ms.len(), 100_000, "no repeats within one millisecond");
        assert!(same_ms.iter().all(|id| id.len() == 16 && id.chars().all(|c| c.is_ascii_hexdigit())));
        let (earlier, later) = (task_id(1_764_000_000_000), task_id(1_764_000_000_001));
        assert!(earlier < later, "{earlier} < {later}: a later millisecond sorts after");
    }
}
