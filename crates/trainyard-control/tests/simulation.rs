//! A seeded simulation of the control loop: a `Control` over the fake backend and a real SQLite store, on a
//! virtual clock, with everything a seed draws happening between ticks: submissions (PyTorchJob and RayJob,
//! every resource type, priorities, sizes, some too large ever to fit), preemption storms (bursts of
//! high-priority Reserved work), users stopping, deleting and resubmitting tasks, scripted successes and
//! failures, machines lost (`fail_node`), nodes an admin marks failed in the catalog and back, lost backend
//! requests (a crash between a commit and the call it decides), and crashes: the `Control` dropped and a new
//! one built over the same store and backend, sometimes after it polled and before it recorded what it saw
//! (then the backend restarts too and reports again, as the local one does from its files). After every
//! tick, `invariants::Checker` checks the store and the backend: no task lost, every event chain a legal
//! path through `trainyard_core::lifecycle`, no attempt running twice or after its task ended, quotas and
//! node capacities held, nothing left holding resources with nothing running; after a drain with the faults
//! stopped, nothing holds resources and every queued task has a wait reason.
//!
//! CI runs `SEEDS` seeds. A failure names its seed and step (one tick per step), the actions before it and
//! the events of the tasks it names. To replay one seed:
//!
//! ```text
//! TRAINYARD_SIM_SEED=<n> cargo test -p trainyard-control --test simulation
//! ```
//!
//! Every draw comes from the seed, the clock is virtual (a `ManualClock`) and the loop's ids are the seed's
//! (`Sources::seeded`), so a replay takes the same steps with the same ids, names, timestamps and reports:
//! `a_seed_replays_exactly` runs seeds twice and compares everything the store and the log hold, byte for
//! byte. (Hidden values would be the exception, sealed with random nonces; the simulation draws none.)
//! `TRAINYARD_SIM_STEPS=<n>` runs longer (or shorter) than the default.
//!
//! Every scenario below is on; each has a switch (a constant below) for bisecting a failure. The simulation
//! found four bugs, each fixed with the scenario that showed it:
//!
//! - Deleting a running task dropped it from the loop's working set at once while its attempt still ran
//!   through its checkpoint window, so its capacity and quota went to others (seed 13, step 5: gpu-0 held 6
//!   GPUs of 4). Now a deleted task stays in the working set while it holds resources (`active::is_active`).
//! - A node an admin marks failed left its tasks Running for ever: the loop stopped them on the backend but
//!   not in the store, so the `Stopped` that followed was stale. Now they go to Stopping (`NodeFailed`)
//!   first, and their end requeues them (`reconcile`).
//! - A Stopping task whose attempt no longer ran (its launch or stop lost, its end polled by a server that
//!   died) stayed Stopping for ever. Now `reconcile` ends such a stop as its cause says, and a `Finished`
//!   seen while Stopping ends the stop (`policy::on_observation`).
//! - The scheduler held nodes for a starving task that its quota refused, or that no empty pool could take,
//!   for ever, and everything needing those nodes waited behind it (seed 1, step 301). Now it holds only for
//!   an option the quota allows and the pool could fit (`trainyard_sched::schedule`).

// Tests are the shell: the simulation's store lives in a temp dir it makes and removes.
#![allow(clippy::disallowed_methods)]

// The crate root of a test sits beside its modules' folder, so their paths are named.
#[path = "simulation/invariants.rs"]
mod invariants;
#[path = "simulation/replay.rs"]
mod replay;
#[path = "simulation/world.rs"]
mod world;

use invariants::{Checker, Submitted};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use trainyard_control::secrets::SecretBox;
use trainyard_control::{CatalogHandle, CommandError, Control, ManualClock, Sources, SubmitError};
use trainyard_core::Catalog;
use trainyard_core::lifecycle::Status;
use trainyard_runtime::Backend;
use trainyard_runtime::fake::FakeBackend;
use trainyard_sched::Config;
use trainyard_sim::rng::Rng;
use trainyard_store::{Created, Store};

/// The seeds CI runs, and the steps of each (a step: what the seed draws, then one tick and the checks).
const SEEDS: u64 = 16;
const STEPS: u32 = 300;
/// Ticks at most, once the faults stop, for what runs to end.
const DRAIN_TICKS: u32 = 400;
/// The most backend requests lost in a row (see `FakeBackend::lose_requests`).
pub const MAX_LOST_REQUESTS: u32 = 3;
/// Lines of the action log shown with a failure.
const LOG_LINES: usize = 60;

/// Deleting a task that holds resources (Starting, Running, Stopping, ...).
const DELETE_HOLDING: bool = true;
/// Tasks waiting past the starvation threshold get nodes held for them.
const STARVATION_HOLDS: bool = true;
/// Nodes an admin marks failed in the catalog (`reconcile` stops what runs there as `NodeFailed`).
const CATALOG_NODE_FAILURES: bool = true;
/// Backend requests lost (a crash between a commit and the request it decided).
const LOST_REQUESTS: bool = true;
/// Attempts whose end was polled by a server that crashed, stopped before the end is reported again: a
/// crash after a poll while a task is Stopping (its `Stopped` is lost), and a user's stop of a task whose
/// `Finished` was lost (before the restarted loop's relaunch has it reported again).
const STOPS_OF_UNOBSERVED_ENDS: bool = true;

/// One simulated world for one seed.
struct Sim {
    seed: u64,
    rng: Rng,
    step: u32,
    now_ms: i64,
    url: String,
    dir: std::path::PathBuf,
    backend: FakeBackend,
    catalog: CatalogHandle,
    control: Option<Control<FakeBackend>>,
    checker: Checker,
    ids: Vec<String>,
    /// Nodes marked failed in the catalog, and when they come back.
    failed_until: BTreeMap<String, i64>,
    log: VecDeque<String>,
    /// Every line of the log, for comparing two runs of a seed.
    trace: String,
    /// The virtual clock and the seed's ids, kept across crashes (a restarted loop draws on).
    clock: Arc<ManualClock>,
    sources: Sources,
    crashes: u32,
    /// Plans that took in only arrivals, each checked against a plan of the whole queue.
    incremental_plans: u32,
}

impl Sim {
    async fn new(seed: u64) -> Sim {
        // In memory where the machine offers it: the store commits with fsync, and the simulation commits
        // thousands of times.
        let shm = std::path::Path::new("/dev/shm");
        let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
        let dir = base.join(format!("trainyard-sim-{}-{seed}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("the temp dir is writable");
        let url = format!("sqlite://{}", dir.join("sim.db").display());
        let catalog = Catalog::from_yaml(world::CATALOG).expect("the simulation's catalog is valid");
        let backend = FakeBackend::new(world::default_script());
        let clock = Arc::new(ManualClock::new(1_000));
        let sources = Sources::seeded(seed, clock.clone());
        let mut sim = Sim {
            seed,
            rng: Rng::new(seed),
            step: 0,
            now_ms: 1_000,
            url,
            dir,
            backend,
            catalog: CatalogHandle::new(catalog.clone()),
            control: None,
            checker: Checker::new(catalog),
            ids: Vec::new(),
            failed_until: BTreeMap::new(),
            log: VecDeque::new(),
            trace: String::new(),
            clock,
            sources,
            crashes: 0,
            incremental_plans: 0,
        };
        sim.start().await;
        sim
    }

    /// A control loop that knows nothing but the store, the backend and the catalog.
    async fn start(&mut self) {
        let store = Store::connect(&self.url).await.expect("the simulation's store opens");
        let mut control = Control::new(
            store,
            self.backend.clone(),
            self.catalog.clone(),
            sched_config(),
            SecretBox::new([7; 32]),
        )
        .with_sources(self.sources.clone());
        control.check_parking(true);
        self.control = Some(control);
    }

    fn control(&mut self) -> &mut Control<FakeBackend> {
        self.control.as_mut().expect("a control loop runs between steps")
    }

    fn note(&mut self, line: String) {
        if self.log.len() == LOG_LINES {
            self.log.pop_front();
        }
        let line = format!("step {} t={}: {line}", self.step, self.now_ms);
        self.trace.push_str(&line);
        self.trace.push('\n');
        self.log.push_back(line);
    }

    /// Time passes on the virtual clock.
    fn advance(&mut self, by_ms: i64) {
        self.now_ms += by_ms;
        self.clock.set(self.now_ms);
    }

    /// What went wrong, with where, how to replay it, what led there and the history of the tasks named.
    async fn failure(&mut self, what: &str) -> String {
        let mut s = format!(
            "seed {} step {} (t={} ms): {what}\nreplay: TRAINYARD_SIM_SEED={} cargo test -p trainyard-control --test simulation\nlast actions:\n",
            self.seed, self.step, self.now_ms, self.seed
        );
        for l in &self.log {
            s.push_str("  ");
            s.push_str(l);
            s.push('\n');
        }
        let named: std::collections::BTreeSet<String> =
            self.ids.iter().filter(|id| what.contains(id.as_str())).cloned().collect();
        let store = self.control().store().clone();
        for id in named {
            s.push_str(&format!("events of {id}:\n"));
            for e in store.list_events(&id, 0, 1_000).await.unwrap_or_default() {
                s.push_str(&format!("  t={} attempt {} {}: {}\n", e.at_ms, e.attempt, e.reason, e.message));
            }
        }
        s
    }

    fn pick_task(&mut self) -> Option<String> {
        if self.ids.is_empty() {
            return None;
        }
        // Recent tasks are the ones still doing something: drawn more often.
        let recent = self.ids.len().saturating_sub(30);
        let from = if self.rng.chance(0.7) { recent } else { 0 };
        let i = from + self.rng.below((self.ids.len() - from) as u64) as usize;
        Some(self.ids[i].clone())
    }

    async fn submit(&mut self, storm: Option<&str>) -> Result<(), String> {
        let drawn = world::task(&mut self.rng, storm);
        let scripts = world::scripts(&mut self.rng);
        let now = self.now_ms;
        let created = self.control().submit("sim", drawn.body.as_bytes(), None, now).await;
        let t = match created {
            Ok(Created::New(t)) => t,
            Ok(Created::Existing(t)) => return Err(format!("a create without a key found {}", t.id)),
            // A task no placement could ever admit (the drawn giants, or more than its group's quota) is
            // refused at submission now, instead of waiting forever: what the world expects of it.
            Err(SubmitError::Invalid(r))
                if r.errors().all(|p| {
                    p.code == trainyard_core::Code::NeverFits && p.path == "spec.compute.instanceSpecs"
                }) =>
            {
                return Ok(());
            }
            Err(SubmitError::Invalid(r)) => {
                return Err(format!("the simulation drew an invalid task: {:?}\n{}", r.problems, drawn.body));
            }
            Err(e) => return Err(format!("submit failed: {e}")),
        };
        let submitted = Submitted { pool: drawn.pool.to_owned(), budget: drawn.budget };
        self.checker.submitted.insert(t.id.clone(), submitted);
        self.note(format!("submit #{} {} {} scripts {scripts:?}", self.ids.len(), t.id, drawn.summary));
        self.backend.script(&t.id, scripts);
        self.ids.push(t.id);
        Ok(())
    }

    /// A command's answer: done, or refused because of the task's state (both fine); anything else fails.
    fn commanded(&mut self, what: &str, id: &str, r: Result<(), CommandError>) -> Result<(), String> {
        match r {
            Ok(()) => self.note(format!("{what} {id}")),
            Err(e @ CommandError::WrongState { .. }) => self.note(format!("{what} {id} refused: {e}")),
            Err(e) => return Err(format!("{what} {id} failed: {e}")),
        }
        Ok(())
    }

    /// One step's draws: what users, machines and admins do before the next tick.
    async fn act(&mut self) -> Result<(), String> {
        let now = self.now_ms;
        for _ in 0..self.rng.below(3) {
            if self.rng.chance(0.45) {
                self.submit(None).await?;
            }
        }
        if self.rng.chance(0.02) {
            let group = *self.rng.pick(&["nlp", "vision"]);
            let n = self.rng.range(3, 6);
            self.note(format!("preemption storm: {n} tasks of {group}"));
            for _ in 0..n {
                self.submit(Some(group)).await?;
            }
        }
        if self.rng.chance(0.12)
            && let Some(id) = self.pick_task()
            && !self.checker.deleted.contains(&id)
            && (STOPS_OF_UNOBSERVED_ENDS || !self.ended_unobserved(&id).await?)
        {
            let r = self.control().stop(&id, false, now).await.map(drop);
            self.commanded("stop", &id, r)?;
        }
        if self.rng.chance(0.04)
            && let Some(id) = self.pick_task()
            && !self.checker.deleted.contains(&id)
            && (DELETE_HOLDING || !self.holds(&id).await?)
        {
            // As the API deletes: whatever runs is stopped first, then the record leaves the lists.
            let r = self.control().delete(&id, now).await;
            self.commanded("delete", &id, r)?;
            self.checker.deleted.insert(id);
        }
        if self.rng.chance(0.1)
            && let Some(id) = self.pick_task()
        {
            let deleted = self.checker.deleted.contains(&id);
            let r = self.control().resubmit(&id, now).await.map(drop);
            if deleted && r.is_ok() {
                return Err(format!("deleted task {id} was resubmitted"));
            }
            self.commanded("resubmit", &id, r)?;
        }
        if self.rng.chance(0.03) {
            let node = *self.rng.pick(world::NODES);
            self.note(format!("machine {node} lost: what runs there fails"));
            self.backend.fail_node(node);
        }
        if CATALOG_NODE_FAILURES && self.rng.chance(0.02) {
            let node = (*self.rng.pick(world::NODES)).to_owned();
            let until = now + self.rng.range(5_000, 60_000) as i64;
            self.note(format!("admin marks {node} failed until t={until}"));
            self.failed_until.insert(node.clone(), until);
            self.mark(&node, true);
        }
        let back: Vec<String> =
            self.failed_until.iter().filter(|(_, until)| **until <= now).map(|(n, _)| n.clone()).collect();
        for node in back {
            self.note(format!("admin marks {node} healthy"));
            self.failed_until.remove(&node);
            self.mark(&node, false);
        }
        if LOST_REQUESTS && self.rng.chance(0.05) {
            let n = self.rng.range(1, u64::from(MAX_LOST_REQUESTS)) as u32;
            self.note(format!("the next {n} backend requests are lost"));
            self.backend.lose_requests(n);
        }
        if self.rng.chance(0.03) {
            self.crash().await;
        }
        Ok(())
    }

    /// The faults stop: no request is lost any more, and every failed node comes back.
    fn calm(&mut self) {
        self.backend.lose_requests(0);
        for node in std::mem::take(&mut self.failed_until).into_keys() {
            self.note(format!("admin marks {node} healthy (drain)"));
            self.mark(&node, false);
        }
    }

    /// Whether any task (deleted ones too) is Stopping: only those can have a `Stopped` to report.
    async fn anything_stopping(&mut self) -> bool {
        let store = self.control().store().clone();
        let stopping =
            store.tasks_in_status_without_spec(&[Status::Stopping]).await.map_or(true, |s| !s.is_empty());
        let mut deleted_stopping = false;
        for id in &self.checker.deleted {
            let t = store.get_task(id).await.ok().flatten();
            deleted_stopping |= t.is_some_and(|t| t.status == Status::Stopping);
        }
        stopping || deleted_stopping
    }

    /// Whether the store says the task holds resources while the backend does not run its attempt (it ended,
    /// and the crashed server that polled its end took that with it; or its launch was lost).
    async fn ended_unobserved(&mut self, id: &str) -> Result<bool, String> {
        let Some(t) = self.control().store().get_task(id).await.map_err(|e| e.to_string())? else {
            return Ok(false);
        };
        let key = trainyard_runtime::AttemptKey { task_id: t.id.clone(), attempt: t.attempt };
        Ok(invariants::holds(&t) && !self.backend.alive().await.contains(&key))
    }

    async fn holds(&mut self, id: &str) -> Result<bool, String> {
        let t = self.control().store().get_task(id).await.map_err(|e| e.to_string())?;
        Ok(t.is_some_and(|t| invariants::holds(&t)))
    }

    fn mark(&self, node: &str, failed: bool) {
        let mut c = (*self.catalog.get()).clone();
        if let Some(n) = c.nodes.get_mut(node) {
            n.failed = failed;
        }
        self.catalog.set(c);
    }

    /// The server dies: the control loop and everything it kept in memory are gone. Sometimes it had just
    /// polled the backend (what it saw is lost with it, and the backend restarts too).
    async fn crash(&mut self) {
        self.crashes += 1;
        if self.rng.chance(0.5) && (STOPS_OF_UNOBSERVED_ENDS || !self.anything_stopping().await) {
            let seen = self.backend.poll(self.now_ms.max(0) as u64).await;
            self.note(format!("crash after a poll, {} observations lost; the backend restarts", seen.len()));
            self.backend.restart();
        } else {
            self.note("crash between ticks".into());
        }
        drop(self.control.take());
        self.start().await;
    }

    async fn tick_and_check(&mut self, full: bool) -> Result<(), String> {
        let now = self.now_ms;
        let report = self.control().tick(now).await.map_err(|e| format!("tick failed: {e}"))?;
        if report.admitted + report.preempted > 0 {
            self.note(format!("tick: {report:?}"));
        }
        if report.planned && !report.whole && report.conflicts == 0 {
            let decided = report.admitted + report.preempted > 0;
            self.same_as_whole(now, decided).await?;
        }
        let store = self.control().store().clone();
        let wrong = self.checker.check(&store, &self.backend, now, full).await;
        if wrong.is_empty() { Ok(()) } else { Err(wrong.join("\n")) }
    }

    /// A plan that took in only arrivals (the parked queue left as it was) must be the plan a cycle over the
    /// whole queue makes: planning the whole queue again at the same time admits nothing more, and when the
    /// plan decided nothing, preempts nothing either and leaves every queued task's place and reason as they
    /// were. (After an admission a parked task's figures are stale until the next plan, which is whole, and
    /// a parked preemptor may now find the admitted task a victim, as it would after a whole plan.)
    async fn same_as_whole(&mut self, now: i64, decided: bool) -> Result<(), String> {
        self.incremental_plans += 1;
        let store = self.control().store().clone();
        let queued =
            store.tasks_in_status_without_spec(&[Status::Queued]).await.map_err(|e| e.to_string())?;
        let board = |c: &Control<FakeBackend>| -> Vec<_> {
            queued.iter().map(|t| (&t.name, c.queue_info(&t.id))).collect()
        };
        let before = board(self.control());
        self.control().plan_whole_next();
        let again = self.control().tick(now).await.map_err(|e| format!("tick failed: {e}"))?;
        if again.observations > 0 || again.conflicts > 0 {
            return Ok(());
        }
        if again.admitted > 0 || (!decided && again.preempted > 0) {
            return Err(format!("the whole queue planned after an incremental plan decided more: {again:?}"));
        }
        if decided {
            return Ok(());
        }
        let after = board(self.control());
        for (b, a) in before.iter().zip(&after) {
            if b != a {
                return Err(format!(
                    "an incremental plan's board differs from the whole queue's: {b:?} against {a:?}"
                ));
            }
        }
        Ok(())
    }

    async fn run(&mut self, steps: u32) -> Result<String, String> {
        match self.steps(steps).await {
            Ok(()) => {}
            Err(e) => return Err(self.failure(&e).await),
        }
        let counts = self.control().store().count_by_status().await.map_err(|e| e.to_string())?;
        Ok(format!(
            "seed {}: {} tasks, {} launches, {} crashes, {} incremental plans checked, {counts:?}",
            self.seed,
            self.ids.len(),
            self.backend.launches(),
            self.crashes,
            self.incremental_plans
        ))
    }

    /// The steps with faults, then the drain with none, then the checks of a quiet world.
    async fn steps(&mut self, steps: u32) -> Result<(), String> {
        for _ in 0..steps {
            self.step += 1;
            let by = self.rng.range(100, 4_000) as i64;
            self.advance(by);
            self.act().await?;
            self.tick_and_check(false).await?;
        }
        self.calm();
        for _ in 0..DRAIN_TICKS {
            self.step += 1;
            self.advance(5_000);
            self.tick_and_check(false).await?;
            if !self.checker.anything_holds() && self.backend.alive().await.is_empty() {
                // Once more reading everything, then what a quiet world must show.
                self.tick_and_check(true).await?;
                return self.queued_have_reasons().await;
            }
        }
        Err("the drain did not end: tasks still hold resources or run".into())
    }

    /// Once all is quiet, every task still queued is one the loop still considers: it has a wait reason.
    async fn queued_have_reasons(&mut self) -> Result<(), String> {
        let store = self.control().store().clone();
        let queued =
            store.tasks_in_status_without_spec(&[Status::Queued]).await.map_err(|e| e.to_string())?;
        for t in queued {
            if t.deleted {
                return Err(format!("task {} was deleted and is queued again", t.id));
            }
            let Some(q) = self.control().queue_info(&t.id) else {
                return Err(format!("task {} is queued after the drain with no wait reason", t.id));
            };
            // Nothing runs: a node held for another queued task is held for one that cannot start on an empty
            // fleet either, and whoever waits behind it waits for ever. (The reason is the sentence users
            // read; `WaitReason::describe` words a hold this way.)
            if q.reason.contains("holds the nodes it needs") {
                return Err(format!(
                    "task {} ({}) waits for ever on an idle fleet: {}",
                    t.id, t.name, q.reason
                ));
            }
        }
        Ok(())
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        drop(self.control.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The scheduler's settings. Starvation holds are off (the threshold is past any run): see "Bug 4".
fn sched_config() -> Config {
    let starvation_after_ms =
        if STARVATION_HOLDS { Config::default().starvation_after_ms } else { u64::MAX / 4 };
    Config { starvation_after_ms, ..Config::default() }
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(v.trim().parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number")))
}

/// One seed, on a runtime of its own: a seed's run depends on nothing another seed does.
fn run_seed(seed: u64, steps: u32) -> Result<String, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime starts");
    rt.block_on(async {
        let mut sim = Sim::new(seed).await;
        sim.run(steps).await
    })
}

#[test]
fn the_control_loop_keeps_its_invariants_under_faults() {
    let seeds: Vec<u64> = match env_u64("TRAINYARD_SIM_SEED") {
        Some(seed) => vec![seed],
        None => (1..=SEEDS).collect(),
    };
    let steps = env_u64("TRAINYARD_SIM_STEPS").map_or(STEPS, |s| s as u32);
    // Seeds run side by side on the cores there are (a few: each also keeps SQLite's threads busy).
    const MAX_THREADS: usize = 4;
    let threads = std::thread::available_parallelism().map_or(1, usize::from).clamp(1, MAX_THREADS);
    let queue = std::sync::Mutex::new(seeds.into_iter());
    let next = || queue.lock().unwrap_or_else(|e| e.into_inner()).next();
    let mut results: Vec<(u64, Result<String, String>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    while let Some(seed) = next() {
                        done.push((seed, run_seed(seed, steps)));
                    }
                    done
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("a simulation thread panicked")).collect()
    });
    results.sort_by_key(|(seed, _)| *seed);
    let mut failures = Vec::new();
    for (_, result) in results {
        match result {
            Ok(summary) => println!("{summary}"),
            Err(failure) => {
                eprintln!("{failure}");
                failures.push(failure);
            }
        }
    }
    assert!(failures.is_empty(), "{} seed(s) failed; the first:\n{}", failures.len(), failures[0]);
}
