//! The control loop: commands in (submit, stop, delete, resubmit), the store updated, the scheduler run, its
//! plan committed, the backend driven, and what the backend reports turned into lifecycle transitions.
//!
//! Decide, then act: a plan is first committed to the store (each change a checked lifecycle transition with
//! its event), and only then are backends called, keyed by (task, attempt), so a crash between the two is
//! repaired by the next tick, which reconciles what the store says against what the backend runs.
//!
//! The store is the only truth. In memory the loop keeps a working set (`active`: the tasks it has work for,
//! their specs parsed once) brought up to date incrementally each tick, and advisory state rebuilt after a
//! restart (the last wait reason of each queued task, nominated nodes of preemptors, autoscaling wants); a
//! restarted loop reads the active tasks back and picks every one up where it was.
//!
//! Files: `submit` (the one way in), `active` (the working set, with what is not queued and what is not
//! read yet kept apart), `intern` (equal specs kept once) and `sync` (keeping it in step with the store),
//! `tick` (one round and its scheduling cycle) and `report` (what it did), `apply` (checked transitions),
//! `launch` (admissions and what a backend is given), `requests` (the backend asked, refusals retried),
//! `observe` (what a backend reports), `policy` (the pure decisions: observation to transition, retries,
//! waits after a refusal), `reconcile`, `autoscale`, `commands` (stop, delete, resubmit, carried out as
//! `rules`, pure, decides), `accounts` (a user's work when an admin disables, enables or deletes them: held,
//! stopped or kept), `handles` and `views` (what readers share), `writer` (the API's other writes), `clock`
//! and `ids` (where time and new ids come from: the system's, or a seeded run's), `error`, `place` (the
//! scheduler's snapshot and placements), `queue` (the waiting tasks between cycles, parked ones included, and
//! their places on the board), `alarms`, `secrets`.

#![forbid(unsafe_code)]

pub mod accounts;
mod active;
pub mod alarms;
mod apply;
mod autoscale;
mod clock;
mod commands;
mod error;
mod handles;
mod ids;
mod intern;
mod launch;
mod leadership;
mod observe;
mod place;
mod policy;
mod queue;
mod reconcile;
pub mod registry_logins;
mod report;
mod requests;
mod rules;
pub mod secrets;
mod submit;
mod sync;
mod tick;
mod views;
mod webhooks;
mod writer;

pub use accounts::{AccountChange, AccountsHandle, QueuedWork, RunningWork, WorkChoice};
pub use clock::{Clock, ManualClock, Sources, SystemClock};
pub use error::{CommandError, SubmitError};
pub use handles::{Arrivals, CatalogHandle, QueueBoard, QueueInfo, SnapshotBoard, StartBoard, StartWait};
pub use ids::Ids;
pub use report::{Phases, TickReport};
pub use submit::{Submitter, validate};
pub use views::{Holder, QuotaLine, SchedViews};
pub use writer::{CATALOG_SETTING, Writer};

use active::{ActiveKey, WorkingSet};
use intern::SpecInterner;
use place::OptionsCache;
use secrets::SecretBox;
use std::collections::BTreeMap;
use std::sync::Arc;
use trainyard_core::Catalog;
use trainyard_runtime::Backend;
use trainyard_sched::Config;
use trainyard_store::Store;

/// The full read of the active tasks' versions, running beside the loop.
type FullRead =
    tokio::task::JoinHandle<Result<Vec<trainyard_store::TaskVersion>, trainyard_store::StoreError>>;

/// The control loop over a store and a backend.
#[derive(Debug)]
pub struct Control<B> {
    /// The store the loop writes through: fenced by the term's token while it leads several servers.
    store: Store,
    /// The same store, unfenced.
    open_store: Store,
    /// The token of this server's term as leader, with several servers on the store (`leadership`).
    fence: Option<trainyard_store::Fence>,
    /// Whether the loop acts: always for a server alone on its store; while it leads, with several.
    leading: bool,
    backend: B,
    catalog: CatalogHandle,
    config: Config,
    secrets: SecretBox,
    /// The last wait of every queued task, shared with readers (the API) so they never wait for a tick.
    waits: QueueBoard,
    /// Starting tasks' waits, as their backends say them.
    starts: StartBoard,
    /// Tasks created by this process since the last tick.
    arrivals: Arrivals,
    /// The buffer [`Arrivals`] fills while the other is drained (see [`Arrivals::swap`]); empty between ticks.
    arrived: Vec<handles::Arrival>,
    specs: SpecInterner,
    options: OptionsCache,
    /// Something the plan reads changed since the last one (see `tick`).
    dirty: bool,
    /// ... and it was more than queued arrivals: the next plan is a cycle over the whole queue.
    full: bool,
    /// Queued tasks new to the working set (with their specs) since the last plan.
    fresh: Vec<ActiveKey>,
    /// Queued tasks that left the working set since the last plan.
    gone: Vec<Arc<str>>,
    /// Waiting tasks every plan looks at again: preemptors whose victims are leaving, each pool's starving
    /// task (see `queue`).
    unparked: Vec<ActiveKey>,
    /// Every waiting task in queue order, with its place on the board.
    queue: queue::Queue,
    /// Tests: every plan of arrivals is checked against a cycle over the whole queue.
    check_parking: bool,
    /// The catalog the last plan was made under.
    planned_for: Option<Arc<Catalog>>,
    /// Until when the clock alone leaves the last plan standing (starvation thresholds).
    quiet_until_ms: i64,
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
    active: WorkingSet,
    synced_to_ms: Option<i64>,
    wide_synced_ms: i64,
    full_synced_ms: i64,
    /// The full read of a deep working set, running beside the loop (see `sync`), and when it started.
    full_read: Option<(i64, FullRead)>,
    /// The scheduler's view at the last tick, for the quota figures.
    views: SchedViews,
    /// Refused backend requests and stop causes (see `requests`).
    requests: policy::Requests,
    /// The stored catalog's stamp the loop last took in (several servers: see `leadership::follow_catalog`).
    catalog_stamp: Option<(i64, i64)>,
    /// What the backend reported that a tick could not write (the store was away): handled first, in order,
    /// by the next tick. A backend says each thing once, so nothing it said is dropped.
    unobserved: std::collections::VecDeque<trainyard_runtime::Observation>,
    /// Disabled and deleted users: whose queued work the plans leave out (see `accounts`).
    accounts: AccountsHandle,
    /// Where the time (for measuring) and new ids come from.
    sources: Sources,
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
            open_store: store.clone(),
            store,
            fence: None,
            leading: true,
            backend,
            catalog,
            config,
            secrets,
            waits: QueueBoard::default(),
            starts: StartBoard::default(),
            arrivals: Arrivals::default(),
            arrived: Vec::new(),
            specs: SpecInterner::default(),
            options: OptionsCache::default(),
            dirty: true,
            full: true,
            fresh: Vec::new(),
            gone: Vec::new(),
            unparked: Vec::new(),
            queue: queue::Queue::default(),
            check_parking: false,
            planned_for: None,
            quiet_until_ms: 0,
            queue_alarms_at_ms: 0,
            nominated: BTreeMap::new(),
            scale_wants: BTreeMap::new(),
            excluded: BTreeMap::new(),
            unreadable: Default::default(),
            views,
            active: WorkingSet::default(),
            synced_to_ms: None,
            wide_synced_ms: 0,
            full_synced_ms: 0,
            full_read: None,
            requests: policy::Requests::default(),
            unobserved: Default::default(),
            catalog_stamp: None,
            accounts: AccountsHandle::default(),
            sources: Sources::default(),
        }
    }

    /// This loop with another clock and other ids (a seeded simulation's; the default is the system's clock
    /// and the process's ids). The submitters it hands out from here on draw from them.
    pub fn with_sources(mut self, sources: Sources) -> Self {
        self.sources = sources;
        self
    }

    /// The handle through which the API writes what is not a task's lifecycle or a submission.
    pub fn writer(&self) -> Writer {
        Writer::new(self.store.clone(), self.catalog.clone(), self.sources.clock.clone())
    }

    /// The clock and ids this loop uses, for the API to read its time from.
    pub fn sources(&self) -> &Sources {
        &self.sources
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

    /// A handle on what starting tasks wait for, as their backends say it.
    pub fn start_board(&self) -> StartBoard {
        self.starts.clone()
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The catalog handle (shared with the API).
    pub fn catalog(&self) -> &CatalogHandle {
        &self.catalog
    }

    /// The handle through which tasks are submitted (the API's and the tests' one way in).
    pub fn submitter(&self) -> Submitter {
        Submitter {
            store: self.store.clone(),
            secrets: self.secrets.clone(),
            digests: self.secrets.clone(),
            catalog: self.catalog.clone(),
            arrivals: self.arrivals.clone(),
            ids: self.sources.ids.clone(),
        }
    }

    /// Validates and queues a task, through [`Submitter`]. With an idempotency key, a retry returns the task
    /// the first call created.
    pub async fn submit(
        &self,
        owner: &str,
        body: &[u8],
        idempotency_key: Option<&str>,
        now_ms: i64,
    ) -> Result<trainyard_store::Created, SubmitError> {
        let submitter = self.submitter();
        let task = submitter.validate(body)?;
        submitter.submit(owner, &task, body, idempotency_key, now_ms).await
    }

    /// For tests: every plan that takes in only arrivals is first checked against a cycle over the whole
    /// queue (same admissions, preemptions and wait reasons, parked tasks included); a difference panics.
    #[doc(hidden)]
    pub fn check_parking(&mut self, on: bool) {
        self.check_parking = on;
    }

    /// Makes the next tick plan the whole queue, as after any change but a queued arrival (for tests that
    /// check an incremental plan against a whole one).
    #[doc(hidden)]
    pub fn plan_whole_next(&mut self) {
        self.changed();
    }

    /// The last wait of a queued task.
    pub fn queue_info(&self, task_id: &str) -> Option<QueueInfo> {
        self.waits.get(task_id)
    }
}
