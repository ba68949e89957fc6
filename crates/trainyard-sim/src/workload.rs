//! Large synthetic fleets and queues for the scheduler benchmark: 8-GPU nodes of three models, project
//! groups with Reserved quotas over most of the fleet, and gangs of 1–64 replicas with a three-spec
//! fallback and a mix of resource types.

use crate::rng::Rng;
use trainyard_core::demand::Resources;
use trainyard_core::spec::ResourceType;
use trainyard_sched::*;

pub const MODELS: [&str; 3] = ["A100", "H100", "L40"];
const GIB: u64 = 1024;

/// A fleet and its quotas, with no work on it.
#[derive(Debug, Clone)]
pub struct Fleet {
    pub base: Snapshot,
    pub specs: Vec<SpecIx>,
    pub groups: Vec<GroupIx>,
    pub pool: PoolIx,
    /// Reserved units each group holds per spec.
    pub reserved_per_group: u64,
}

pub fn node_capacity() -> Resources {
    Resources { gpus: 8, vcpus: 128, memory_mib: 1600 * GIB }
}

/// `nodes` 8-GPU nodes split over three models, `groups` groups sharing Reserved quota over
/// `reserved_fraction` of each spec.
pub fn fleet(nodes: usize, groups: usize, reserved_fraction: f64) -> Fleet {
    let mut b = SnapshotBuilder::new();
    let per_unit = Resources { gpus: 1, vcpus: 12, memory_mib: 100 * GIB };
    let specs: Vec<SpecIx> =
        MODELS.iter().map(|m| b.spec(&format!("{}.1", m.to_lowercase()), Some(m), per_unit)).collect();
    let pool = b.pool("default");
    let group_ix: Vec<GroupIx> = (0..groups).map(|g| b.group(&format!("group-{g}"))).collect();
    let mut per_model = [0u64; 3];
    let mut reserved_per_group = u64::MAX;
    for i in 0..nodes {
        let m = i % MODELS.len();
        per_model[m] += 1;
        b.node(&format!("node-{i}"), "default", Some(MODELS[m]), node_capacity(), true);
    }
    for (m, &s) in specs.iter().enumerate() {
        let reserved = (per_model[m] as f64 * 8.0 * reserved_fraction) as u64;
        for g in 0..groups {
            b.quota(&format!("group-{g}"), ResourceType::Reserved, "default", s, reserved / groups as u64);
        }
        reserved_per_group = reserved_per_group.min(reserved / groups as u64);
    }
    Fleet { base: b.build(), specs, groups: group_ix, pool, reserved_per_group }
}

/// Replica counts from 1 to 64, small ones more common, as in real queues.
const REPLICAS: [u32; 12] = [1, 1, 1, 2, 2, 4, 4, 8, 8, 16, 32, 64];
const COUNTS: [u32; 4] = [1, 2, 4, 8];
/// The mix of resource types in generated queues: half Reserved, then Ondemand, Spot and Idle.
pub const RESOURCE_TYPE_MIX: [ResourceType; 10] = [
    ResourceType::Reserved,
    ResourceType::Reserved,
    ResourceType::Reserved,
    ResourceType::Reserved,
    ResourceType::Reserved,
    ResourceType::Ondemand,
    ResourceType::Ondemand,
    ResourceType::Spot,
    ResourceType::Spot,
    ResourceType::Idle,
];

/// A random gang: 1–64 replicas of one count per node, with every spec as a fallback in random order.
pub fn gang(rng: &mut Rng, fleet: &Fleet, id: u64, submitted_at_ms: u64) -> PendingAttempt {
    gang_of(rng, fleet, id, submitted_at_ms, &COUNTS)
}

/// Like [`gang`], with the count per node drawn from `counts`.
pub fn gang_of(
    rng: &mut Rng,
    fleet: &Fleet,
    id: u64,
    submitted_at_ms: u64,
    counts: &[u32],
) -> PendingAttempt {
    let replicas = *rng.pick(&REPLICAS);
    let count = *rng.pick(counts);
    let mut order = fleet.specs.clone();
    rng.shuffle(&mut order);
    let resource_type = *rng.pick(&RESOURCE_TYPE_MIX);
    // A Reserved gang larger than its group's quota could never start; real users get that refused up
    // front, so the queue holds only gangs that can.
    let replicas = match resource_type {
        ResourceType::Reserved => replicas.min((fleet.reserved_per_group / u64::from(count)).max(1) as u32),
        _ => replicas,
    };
    PendingAttempt {
        id: AttemptId(id),
        name: format!("gang-{id}").into(),
        group: *rng.pick(&fleet.groups),
        pool: fleet.pool,
        resource_type,
        guarantee: false,
        idle_supplement: resource_type == ResourceType::Reserved && rng.chance(0.3),
        priority: rng.range(1, 10) as u32,
        submitted_at_ms,
        options: order
            .into_iter()
            .map(|spec| GangOption { roles: vec![Role { spec, count_per_node: count, replicas }] })
            .collect(),
        excluded: vec![],
        nominated: vec![],
    }
}

/// Turns an admission into the running attempt it becomes.
pub fn running_from(a: &PendingAttempt, adm: &Admission, started_at_ms: u64) -> RunningAttempt {
    RunningAttempt {
        id: a.id,
        name: a.name.to_string(),
        group: a.group,
        pool: a.pool,
        resource_type: a.resource_type,
        priority: a.priority,
        started_at_ms,
        stopping: false,
        replicas: adm.placements.iter().map(|p| Replica { node: p.node, need: p.need }).collect(),
        units: adm.units.clone(),
    }
}

/// A snapshot of `fleet` with `running` on it and `pending` queued; node usage is recomputed.
pub fn snapshot(fleet: &Fleet, running: &[RunningAttempt], pending: &[PendingAttempt]) -> Snapshot {
    let mut s = fleet.base.clone();
    for n in &mut s.nodes {
        n.used = Resources::default();
    }
    for a in running {
        for r in &a.replicas {
            let n = &mut s.nodes[r.node.ix()];
            n.used = n.used + r.need;
        }
    }
    s.running = running.to_vec();
    s.pending = pending.to_vec();
    s
}

/// Fills the fleet with running work by scheduling random gangs (count per node from `counts`) until about
/// `target` of the GPUs are in use. Returns the running attempts.
pub fn fill(
    rng: &mut Rng,
    fleet: &Fleet,
    target: f64,
    types: &[ResourceType],
    counts: &[u32],
) -> Vec<RunningAttempt> {
    let total: u64 = fleet.base.nodes.iter().map(|n| n.capacity.gpus).sum();
    let mut running: Vec<RunningAttempt> = Vec::new();
    let mut used = 0u64;
    let mut id = 1u64 << 40;
    let mut misses = 0;
    while (used as f64) < target * total as f64 && misses < 50 {
        let batch: Vec<PendingAttempt> = (0..256)
            .map(|_| {
                id += 1;
                let mut g = gang_of(rng, fleet, id, 0, counts);
                g.resource_type = *rng.pick(types);
                g.idle_supplement = false;
                g
            })
            .collect();
        let snap = snapshot(fleet, &running, &batch);
        let plan = schedule(&snap, 0, &Config { preemption: false, ..Config::default() });
        let before = used;
        for adm in plan.admissions() {
            let a = &snap.pending[adm.pending_index];
            used += adm.placements.iter().map(|p| p.need.gpus).sum::<u64>();
            running.push(running_from(a, adm, 0));
            if used as f64 >= target * total as f64 {
                break;
            }
        }
        if used == before {
            misses += 1;
        }
    }
    running
}
