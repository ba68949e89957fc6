//! A seeded, virtual-time simulation of the scheduler driving a fleet: arrivals, completions, preemptions
//! (with a checkpoint window before resources come free), node failures with node replacement, recoveries,
//! and bursts of high-priority work. Every cycle's snapshot and plan are checked with `check_snapshot` and
//! `check_plan`; at the end, with arrivals and failures stopped, every task must have run (liveness). Any
//! failure names the seed that replays it exactly.

use crate::rng::Rng;
use std::fmt::Write as _;
use trainyard_core::demand::Resources;
use trainyard_core::spec::ResourceType;
use trainyard_sched::*;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub seed: u64,
    /// (GPU model, number of 8-GPU nodes).
    pub models: Vec<(String, usize)>,
    pub groups: usize,
    /// Share of each spec's capacity handed out as Reserved quota, split across groups.
    pub reserved_fraction: f64,
    /// Tasks to submit, and the mean gap between two submissions.
    pub tasks: usize,
    pub mean_arrival_gap_ms: u64,
    pub max_replicas: u32,
    pub duration_ms: (u64, u64),
    /// Per cycle, the chance that one healthy node fails (and its tasks with it), and how long it stays down.
    pub node_failure_chance: f64,
    pub node_down_ms: u64,
    /// Every this often, a burst of high-priority Reserved tasks (a preemption storm).
    pub storm_every_ms: Option<u64>,
    pub checkpoint_ms: u64,
    pub step_ms: u64,
    pub sched: Config,
    /// A bound on the whole run, arrivals and drain, in cycles.
    pub max_steps: usize,
}

impl SimConfig {
    pub fn small(seed: u64) -> Self {
        SimConfig {
            seed,
            models: vec![("A100".into(), 6), ("H100".into(), 4), ("L40".into(), 3)],
            groups: 4,
            reserved_fraction: 0.6,
            tasks: 300,
            mean_arrival_gap_ms: 60_000,
            max_replicas: 8,
            duration_ms: (60_000, 1_800_000),
            node_failure_chance: 0.01,
            node_down_ms: 600_000,
            storm_every_ms: Some(3_600_000),
            checkpoint_ms: 30_000,
            step_ms: 10_000,
            sched: Config { starvation_after_ms: 900_000, preemption: true },
            max_steps: 200_000,
        }
    }
}

#[derive(Debug, Clone)]
struct SimNode {
    name: String,
    model: usize,
    down_until: Option<u64>,
}

#[derive(Debug, Clone)]
enum State {
    Queued,
    Running { ends: u64, started: u64, replicas: Vec<Replica>, units: Vec<UnitUse> },
    Stopping { until: u64, started: u64, replicas: Vec<Replica>, units: Vec<UnitUse> },
    Done,
}

#[derive(Debug, Clone)]
struct SimTask {
    name: String,
    group: usize,
    rtype: ResourceType,
    priority: u32,
    guarantee: bool,
    idle_supplement: bool,
    submitted: u64,
    /// Options: (spec index, count per node, replicas).
    options: Vec<(usize, u32, u32)>,
    duration: u64,
    attempt: u64,
    excluded: Vec<usize>,
    /// Nodes the scheduler chose while this task's victims stop.
    nominated: Vec<NodeIx>,
    state: State,
    first_admitted: Option<u64>,
    last_reason: String,
    /// Cycles in which this task, queued, preempted others since it last started. A preemptor should start
    /// once its victims are gone; preempting again and again without starting is churn.
    preempting_cycles: u32,
}

/// A preemptor that preempts in more cycles than this without starting is churning.
const MAX_PREEMPTING_CYCLES: u32 = 8;

/// A task submitted by hand (tests): options are (spec index, count per node, replicas).
#[derive(Debug, Clone)]
pub struct Submit {
    pub group: usize,
    pub rtype: ResourceType,
    pub priority: u32,
    pub guarantee: bool,
    pub idle_supplement: bool,
    pub options: Vec<(usize, u32, u32)>,
    pub duration_ms: u64,
}

/// What happened, for the tests and the report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub cycles: u64,
    pub admitted: u64,
    pub completed: u64,
    pub preempted: u64,
    pub node_failures: u64,
    pub requeued_after_failure: u64,
    pub max_wait_ms: u64,
    pub end_ms: u64,
}

const ATTEMPT_STRIDE: u64 = 1 << 24;
const GIB: u64 = 1024;

#[derive(Debug)]
pub struct Sim {
    cfg: SimConfig,
    rng: Rng,
    now: u64,
    nodes: Vec<SimNode>,
    /// (name, model index, per unit). One 1-GPU spec per model.
    specs: Vec<(String, usize, Resources)>,
    /// (group, spec, units) of Reserved quota.
    quotas: Vec<(usize, usize, u64)>,
    tasks: Vec<SimTask>,
    next_arrival: u64,
    next_storm: u64,
    pub stats: Stats,
}

impl Sim {
    pub fn new(cfg: SimConfig) -> Self {
        let mut rng = Rng::new(cfg.seed);
        let mut nodes = Vec::new();
        let mut specs = Vec::new();
        for (m, (model, n)) in cfg.models.iter().enumerate() {
            for i in 0..*n {
                nodes.push(SimNode {
                    name: format!("{}-{i}", model.to_lowercase()),
                    model: m,
                    down_until: None,
                });
            }
            let per_unit = Resources { gpus: 1, vcpus: 12, memory_mib: 100 * GIB };
            specs.push((format!("{}.1", model.to_lowercase()), m, per_unit));
        }
        let mut quotas = Vec::new();
        for (s, (_, n)) in cfg.models.iter().enumerate() {
            let reserved = (*n as f64 * 8.0 * cfg.reserved_fraction) as u64;
            for g in 0..cfg.groups {
                // Uneven shares, so some groups are short and borrow.
                let share = reserved * (g as u64 + 1) * 2 / (cfg.groups as u64 * (cfg.groups as u64 + 1));
                if share > 0 {
                    quotas.push((g, s, share));
                }
            }
        }
        let next_arrival = rng.below(cfg.mean_arrival_gap_ms.max(1));
        let next_storm = cfg.storm_every_ms.unwrap_or(u64::MAX);
        Sim {
            cfg,
            rng,
            now: 0,
            nodes,
            specs,
            quotas,
            tasks: Vec::new(),
            next_arrival,
            next_storm,
            stats: Stats::default(),
        }
    }

    fn fail(&self, what: &str) -> ! {
        panic!(
            "simulation seed {} failed at t={} ms: {what}\nreplay with SimConfig seed {}",
            self.cfg.seed, self.now, self.cfg.seed
        )
    }

    fn node_count(&self, model: usize) -> u64 {
        self.nodes.iter().filter(|n| n.model == model).count() as u64
    }

    fn quota(&self, group: usize, spec: usize) -> u64 {
        self.quotas.iter().filter(|q| q.0 == group && q.1 == spec).map(|q| q.2).sum()
    }

    fn reserved_total(&self, spec: usize) -> u64 {
        self.quotas.iter().filter(|q| q.1 == spec).map(|q| q.2).sum()
    }

    /// A task that can run on the empty, healthy fleet under its group's quota: the scheduler owes it a start.
    fn new_task(&mut self, storm: bool) -> Submit {
        let group = self.rng.below(self.cfg.groups as u64) as usize;
        let rtype =
            if storm { ResourceType::Reserved } else { *self.rng.pick(&crate::workload::RESOURCE_TYPE_MIX) };
        let mut specs: Vec<usize> = (0..self.specs.len()).collect();
        self.rng.shuffle(&mut specs);
        let n_options = self.rng.range(1, 3.min(specs.len() as u64)) as usize;
        let count = *self.rng.pick(&[1u32, 2, 4, 8]);
        let mut replicas = self.rng.range(1, u64::from(self.cfg.max_replicas)) as u32;
        let mut options = Vec::new();
        for &s in &specs[..n_options] {
            let model = self.specs[s].1;
            // Always leave one node of slack so that a single failed node cannot make it impossible.
            let fit = (self.node_count(model).saturating_sub(1)) * (8 / u64::from(count));
            let cap = match rtype {
                ResourceType::Reserved => self.quota(group, s) / u64::from(count),
                ResourceType::Ondemand => {
                    (self.node_count(model) * 8).saturating_sub(self.reserved_total(s)) / u64::from(count)
                }
                ResourceType::Idle => self.reserved_total(s) / u64::from(count),
                ResourceType::Spot => u64::MAX,
            };
            let most = fit.min(cap);
            if most == 0 {
                continue;
            }
            replicas = replicas.min(most as u32);
            options.push((s, count, replicas));
        }
        // Options share the replica count, clamped to the tightest one.
        for o in &mut options {
            o.2 = replicas;
        }
        let priority = if storm { 10 } else { self.rng.range(1, 9) as u32 };
        let guarantee =
            matches!(rtype, ResourceType::Reserved | ResourceType::Ondemand) && self.rng.chance(0.2);
        let idle_supplement = rtype == ResourceType::Reserved && !guarantee && self.rng.chance(0.3);
        let (lo, hi) = self.cfg.duration_ms;
        Submit {
            group,
            rtype,
            priority,
            guarantee,
            idle_supplement,
            options,
            duration_ms: self.rng.range(lo, hi),
        }
    }

    fn arrivals_done(&self) -> bool {
        self.tasks.len() >= self.cfg.tasks
    }

    /// One cycle: advance time, apply what happened, schedule, check, apply the plan.
    pub fn step(&mut self) {
        self.now += self.cfg.step_ms;
        let now = self.now;
        for t in &mut self.tasks {
            match &t.state {
                State::Running { ends, .. } if *ends <= now => {
                    t.state = State::Done;
                    self.stats.completed += 1;
                }
                State::Stopping { until, .. } if *until <= now => {
                    t.state = State::Queued;
                    t.attempt += 1;
                }
                _ => {}
            }
        }
        for n in &mut self.nodes {
            if n.down_until.is_some_and(|u| u <= now) {
                n.down_until = None;
            }
        }
        if !self.arrivals_done() && self.rng.chance(self.cfg.node_failure_chance) {
            let healthy: Vec<usize> =
                (0..self.nodes.len()).filter(|&i| self.nodes[i].down_until.is_none()).collect();
            if !healthy.is_empty() {
                let victim = *self.rng.pick(&healthy);
                self.nodes[victim].down_until = Some(now + self.cfg.node_down_ms);
                self.stats.node_failures += 1;
                for t in &mut self.tasks {
                    let on_it = match &t.state {
                        State::Running { replicas, .. } | State::Stopping { replicas, .. } => {
                            replicas.iter().any(|r| r.node.ix() == victim)
                        }
                        _ => false,
                    };
                    if on_it {
                        // A hardware-class failure: requeue without the node (node replacement).
                        t.state = State::Queued;
                        t.attempt += 1;
                        t.excluded = vec![victim];
                        self.stats.requeued_after_failure += 1;
                    }
                }
            }
        }
        while !self.arrivals_done() && self.next_arrival <= now {
            let t = self.new_task(false);
            if !t.options.is_empty() {
                self.submit(t);
            }
            self.next_arrival += 1 + self.rng.below(2 * self.cfg.mean_arrival_gap_ms);
        }
        if !self.arrivals_done() && self.next_storm <= now {
            for _ in 0..5 {
                let t = self.new_task(true);
                if !t.options.is_empty() {
                    self.submit(t);
                }
            }
            self.next_storm += self.cfg.storm_every_ms.unwrap_or(u64::MAX);
        }

        let snap = self.snapshot();
        if let Err(e) = check_snapshot(&snap) {
            self.fail(&format!("snapshot broken: {e:#?}"));
        }
        let plan = schedule(&snap, now, &self.cfg.sched);
        self.stats.cycles += 1;
        if let Err(e) = check_plan(&snap, &plan) {
            self.fail(&format!("plan breaks invariants: {e:#?}"));
        }
        self.apply(&snap, &plan);
    }

    fn snapshot(&self) -> Snapshot {
        let mut b = SnapshotBuilder::new();
        let mut spec_ix = Vec::new();
        for (name, model, per_unit) in &self.specs {
            spec_ix.push(b.spec(name, Some(&self.cfg.models[*model].0), *per_unit));
        }
        let pool = b.pool("p");
        let groups: Vec<GroupIx> = (0..self.cfg.groups).map(|g| b.group(&format!("g{g}"))).collect();
        for n in &self.nodes {
            let cap = Resources { gpus: 8, vcpus: 128, memory_mib: 1600 * GIB };
            b.node(&n.name, "p", Some(&self.cfg.models[n.model].0), cap, n.down_until.is_none());
        }
        for &(g, s, units) in &self.quotas {
            b.quota(&format!("g{g}"), ResourceType::Reserved, "p", spec_ix[s], units);
        }
        for (i, t) in self.tasks.iter().enumerate() {
            let id = AttemptId(i as u64 * ATTEMPT_STRIDE + t.attempt);
            match &t.state {
                State::Queued => b.pending(PendingAttempt {
                    id,
                    name: t.name.clone().into(),
                    group: groups[t.group],
                    pool,
                    resource_type: t.rtype,
                    guarantee: t.guarantee,
                    idle_supplement: t.idle_supplement,
                    priority: t.priority,
                    submitted_at_ms: t.submitted,
                    options: t
                        .options
                        .iter()
                        .map(|&(s, c, r)| GangOption {
                            roles: vec![Role { spec: spec_ix[s], count_per_node: c, replicas: r }],
                        })
                        .collect(),
                    excluded: t.excluded.iter().map(|&n| NodeIx(n as u32)).collect(),
                    nominated: t.nominated.clone(),
                }),
                State::Running { started, replicas, units, .. }
                | State::Stopping { started, replicas, units, .. } => b.running(RunningAttempt {
                    id,
                    name: t.name.clone(),
                    group: groups[t.group],
                    pool,
                    resource_type: t.rtype,
                    priority: t.priority,
                    started_at_ms: *started,
                    stopping: matches!(t.state, State::Stopping { .. }),
                    replicas: replicas.clone(),
                    units: units.clone(),
                }),
                State::Done => {}
            }
        }
        b.build()
    }

    fn apply(&mut self, snap: &Snapshot, plan: &Plan) {
        let now = self.now;
        let mut preemptors: Vec<AttemptId> = plan.preemptions().map(|p| p.preemptor).collect();
        preemptors.dedup();
        for id in preemptors {
            let t = &mut self.tasks[(id.0 / ATTEMPT_STRIDE) as usize];
            t.preempting_cycles += 1;
            if t.preempting_cycles > MAX_PREEMPTING_CYCLES {
                let name = t.name.clone();
                self.fail(&format!(
                    "{name} preempted others in {MAX_PREEMPTING_CYCLES}+ cycles without starting: churn"
                ));
            }
        }
        for d in &plan.decisions {
            match d {
                Decision::Admit(a) => {
                    let t = &mut self.tasks[(a.attempt.0 / ATTEMPT_STRIDE) as usize];
                    let replicas =
                        a.placements.iter().map(|p| Replica { node: p.node, need: p.need }).collect();
                    t.state = State::Running {
                        ends: now + t.duration,
                        started: now,
                        replicas,
                        units: a.units.clone(),
                    };
                    t.nominated.clear();
                    t.preempting_cycles = 0;
                    if t.first_admitted.is_none() {
                        t.first_admitted = Some(now);
                        self.stats.max_wait_ms = self.stats.max_wait_ms.max(now - t.submitted);
                    }
                    self.stats.admitted += 1;
                }
                Decision::Preempt(p) => {
                    let t = &mut self.tasks[(p.victim.0 / ATTEMPT_STRIDE) as usize];
                    if let State::Running { started, replicas, units, .. } = &t.state {
                        t.state = State::Stopping {
                            until: now + self.cfg.checkpoint_ms,
                            started: *started,
                            replicas: replicas.clone(),
                            units: units.clone(),
                        };
                        self.stats.preempted += 1;
                    } else {
                        let name = t.name.clone();
                        self.fail(&format!("preempted {name} which is not running"));
                    }
                }
                Decision::Wait(w) => {
                    let t = &mut self.tasks[(w.attempt.0 / ATTEMPT_STRIDE) as usize];
                    t.last_reason =
                        w.reason.describe(snap, snap.pending[w.pending_index].group, |id| format!("{id:?}"));
                    t.nominated = match &w.reason {
                        WaitReason::Preempting { nodes, .. } => nodes.clone(),
                        WaitReason::Blocked { .. } => Vec::new(),
                    };
                }
            }
        }
    }

    /// Submits a task now, outside the random arrivals. Returns its index.
    pub fn submit(&mut self, t: Submit) -> usize {
        self.tasks.push(SimTask {
            name: format!("t{}", self.tasks.len()),
            group: t.group,
            rtype: t.rtype,
            priority: t.priority,
            guarantee: t.guarantee,
            idle_supplement: t.idle_supplement,
            submitted: self.now,
            options: t.options,
            duration: t.duration_ms,
            attempt: 0,
            excluded: vec![],
            nominated: vec![],
            state: State::Queued,
            first_admitted: None,
            last_reason: String::new(),
            preempting_cycles: 0,
        });
        self.tasks.len() - 1
    }

    /// When task `i` first started, if it has.
    pub fn admitted_at(&self, i: usize) -> Option<u64> {
        self.tasks[i].first_admitted
    }

    pub fn now(&self) -> u64 {
        self.now
    }

    /// The Reserved quota of a group for a spec, in units.
    pub fn set_quota(&mut self, group: usize, spec: usize, units: u64) {
        self.quotas.retain(|q| !(q.0 == group && q.1 == spec));
        self.quotas.push((group, spec, units));
    }

    /// Runs arrivals to the end, then drains; checks that every task ran to completion.
    pub fn run(mut self) -> Stats {
        let mut steps = 0;
        while !(self.arrivals_done() && self.tasks.iter().all(|t| matches!(t.state, State::Done))) {
            if steps >= self.cfg.max_steps {
                let mut stuck = String::new();
                for t in self.tasks.iter().filter(|t| !matches!(t.state, State::Done)).take(10) {
                    let _ = writeln!(
                        stuck,
                        "  {} ({} {:?} options, queued since {} ms): {}",
                        t.name, t.rtype, t.options, t.submitted, t.last_reason
                    );
                }
                for t in self
                    .tasks
                    .iter()
                    .filter(|t| matches!(t.state, State::Running { .. } | State::Stopping { .. }))
                    .take(10)
                {
                    let _ = writeln!(stuck, "  holding: {} {} {:?}", t.name, t.rtype, t.state);
                }
                self.fail(&format!("liveness: tasks still not done after {steps} cycles:\n{stuck}"));
            }
            self.step();
            steps += 1;
        }
        self.stats.end_ms = self.now;
        self.stats
    }
}
