//! The scheduler's input: an indexed, immutable picture of the fleet (nodes and what runs on them), the
//! quotas, and the queue. Names are interned once by [`SnapshotBuilder`], so a scheduling cycle works on dense
//! indexes and never hashes a string.

use trainyard_core::demand::Resources;
use trainyard_core::spec::ResourceType;

macro_rules! index_type {
    ($(#[$m:meta])* $name:ident($t:ty)) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
        pub struct $name(pub $t);
        impl $name {
            pub fn ix(self) -> usize {
                self.0 as usize
            }
        }
    };
}

index_type!(
    /// A node, by position in [`Snapshot::nodes`].
    NodeIx(u32)
);
index_type!(
    /// An instance spec, by position in [`Snapshot::specs`].
    SpecIx(u16)
);
index_type!(
    /// A resource pool.
    PoolIx(u16)
);
index_type!(
    /// A project group.
    GroupIx(u16)
);
index_type!(
    /// A GPU model.
    ModelIx(u16)
);

/// The control plane's key for one attempt of one task. Opaque to the scheduler; used to order ties.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct AttemptId(pub u64);

/// Resource types as an index, for the dense quota table.
pub fn rtype_ix(t: ResourceType) -> usize {
    match t {
        ResourceType::Reserved => 0,
        ResourceType::Ondemand => 1,
        ResourceType::Spot => 2,
        ResourceType::Idle => 3,
    }
}

/// An instance spec: what one unit holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecInfo {
    pub name: String,
    /// The GPU model this spec needs; `None` for CPU specs, which go to CPU nodes.
    pub model: Option<ModelIx>,
    pub per_unit: Resources,
}

/// A node: raw capacity, what is allocated on it now, and whether it takes new work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub pool: PoolIx,
    pub model: Option<ModelIx>,
    pub capacity: Resources,
    /// Sum of the running replicas placed here (stopping ones included: they hold resources until gone).
    pub used: Resources,
    /// Healthy and not cordoned.
    pub schedulable: bool,
}

/// One role of a gang for one instance-spec option: `replicas` replicas, each needing `spec × count_per_node`
/// on a single node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Role {
    pub spec: SpecIx,
    pub count_per_node: u32,
    pub replicas: u32,
}

/// The gang for one instance-spec option: PyTorchJob has master and workers on one spec; RayJob a head (its
/// own spec possibly) and workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GangOption {
    pub roles: Vec<Role>,
}

/// A queued attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingAttempt {
    pub id: AttemptId,
    /// For messages ("waiting behind llama-sft-x7k2p"); shared with the caller's copy of the name.
    pub name: std::sync::Arc<str>,
    pub group: GroupIx,
    pub pool: PoolIx,
    pub resource_type: ResourceType,
    pub guarantee: bool,
    pub idle_supplement: bool,
    pub priority: u32,
    /// When the task was submitted; preempted and retried attempts keep their task's time, so they do not
    /// lose their place.
    pub submitted_at_ms: u64,
    /// In the user's priority order; shared by the attempts of tasks that ask for the same.
    pub options: std::sync::Arc<[GangOption]>,
    /// Nodes this task must not use (after a hardware failure on them).
    pub excluded: Vec<NodeIx>,
    /// Nodes a previous cycle chose for it while its victims stop (from [`crate::WaitReason::Preempting`]).
    /// They are held for it from the start of the cycle, so the room its victims leave is not taken by
    /// anyone else. The control plane keeps them while the attempt waits on preemption and drops them
    /// otherwise.
    pub nominated: Vec<NodeIx>,
}

/// How a running attempt's spec units count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum UsageClass {
    /// Within the group's reserved quota. Not preemptible by other groups.
    Reserved,
    /// A Reserved task's units beyond its quota, on idle capacity (idle supplementation). Preemptible.
    Borrowed,
    Ondemand,
    Spot,
    Idle,
}

impl UsageClass {
    pub fn preemptible(self) -> bool {
        matches!(self, UsageClass::Borrowed | UsageClass::Spot | UsageClass::Idle)
    }
}

/// Units of one spec used by an attempt, and how they count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct UnitUse {
    pub spec: SpecIx,
    pub class: UsageClass,
    pub units: u64,
}

/// One placed replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Replica {
    pub node: NodeIx,
    pub need: Resources,
}

/// A running (or stopping) attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningAttempt {
    pub id: AttemptId,
    pub name: String,
    pub group: GroupIx,
    pub pool: PoolIx,
    pub resource_type: ResourceType,
    pub priority: u32,
    pub started_at_ms: u64,
    /// Already told to stop (preempted, stopped by a user): its resources are about to come free.
    pub stopping: bool,
    pub replicas: Vec<Replica>,
    pub units: Vec<UnitUse>,
}

impl RunningAttempt {
    /// Whether any part of it runs on preemptible capacity (then the whole gang goes when preempted).
    pub fn preemptible(&self) -> bool {
        self.units.iter().any(|u| u.class.preemptible())
    }
}

/// Quota limits per (group, resource type, pool, spec), in spec units. A missing Reserved entry is 0; a
/// missing entry for the other types means no cap.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QuotaTable {
    n_pools: usize,
    n_specs: usize,
    limits: Vec<Option<u64>>,
}

impl QuotaTable {
    pub fn new(n_groups: usize, n_pools: usize, n_specs: usize) -> Self {
        QuotaTable { n_pools, n_specs, limits: vec![None; n_groups * 4 * n_pools * n_specs] }
    }

    fn slot(&self, g: GroupIx, t: ResourceType, p: PoolIx, s: SpecIx) -> usize {
        ((g.ix() * 4 + rtype_ix(t)) * self.n_pools + p.ix()) * self.n_specs + s.ix()
    }

    pub fn set(&mut self, g: GroupIx, t: ResourceType, p: PoolIx, s: SpecIx, units: u64) {
        let i = self.slot(g, t, p, s);
        self.limits[i] = Some(units);
    }

    /// The limit, `None` meaning no cap (never for Reserved, whose missing entry is 0).
    pub fn limit(&self, g: GroupIx, t: ResourceType, p: PoolIx, s: SpecIx) -> Option<u64> {
        let v = self.limits.get(self.slot(g, t, p, s)).copied().flatten();
        match t {
            ResourceType::Reserved => Some(v.unwrap_or(0)),
            _ => v,
        }
    }
}

/// Everything one scheduling cycle looks at.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub models: Vec<String>,
    pub pools: Vec<String>,
    pub groups: Vec<String>,
    pub specs: Vec<SpecInfo>,
    pub nodes: Vec<NodeInfo>,
    pub quotas: QuotaTable,
    pub pending: Vec<PendingAttempt>,
    pub running: Vec<RunningAttempt>,
}

impl Snapshot {
    /// What one replica of `role` needs on its node.
    pub fn replica_need(&self, role: &Role) -> Resources {
        self.specs[role.spec.ix()].per_unit * u64::from(role.count_per_node)
    }
}

/// Builds a [`Snapshot`] from names, interning them, and computes each node's `used` from the running
/// attempts so the two can never disagree.
#[derive(Debug, Default, Clone)]
pub struct SnapshotBuilder {
    snap: Snapshot,
    quotas: Vec<(GroupIx, ResourceType, PoolIx, SpecIx, u64)>,
}

fn intern<T>(list: &mut Vec<T>, name: &str, make: impl FnOnce() -> T, get: impl Fn(&T) -> &str) -> usize {
    match list.iter().position(|x| get(x) == name) {
        Some(i) => i,
        None => {
            list.push(make());
            list.len() - 1
        }
    }
}

impl SnapshotBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn model(&mut self, name: &str) -> ModelIx {
        ModelIx(intern(&mut self.snap.models, name, || name.to_owned(), |s| s) as u16)
    }

    pub fn pool(&mut self, name: &str) -> PoolIx {
        PoolIx(intern(&mut self.snap.pools, name, || name.to_owned(), |s| s) as u16)
    }

    pub fn group(&mut self, name: &str) -> GroupIx {
        GroupIx(intern(&mut self.snap.groups, name, || name.to_owned(), |s| s) as u16)
    }

    /// Declares an instance spec (`model` None for CPU).
    pub fn spec(&mut self, name: &str, model: Option<&str>, per_unit: Resources) -> SpecIx {
        let model = model.map(|m| self.model(m));
        let i = intern(
            &mut self.snap.specs,
            name,
            || SpecInfo { name: name.to_owned(), model, per_unit },
            |s| &s.name,
        );
        SpecIx(i as u16)
    }

    /// Looks up a declared spec.
    pub fn spec_ix(&self, name: &str) -> Option<SpecIx> {
        self.snap.specs.iter().position(|s| s.name == name).map(|i| SpecIx(i as u16))
    }

    pub fn node(
        &mut self,
        name: &str,
        pool: &str,
        model: Option<&str>,
        capacity: Resources,
        schedulable: bool,
    ) -> NodeIx {
        let pool = self.pool(pool);
        let model = model.map(|m| self.model(m));
        self.snap.nodes.push(NodeInfo {
            name: name.to_owned(),
            pool,
            model,
            capacity,
            used: Resources::default(),
            schedulable,
        });
        NodeIx((self.snap.nodes.len() - 1) as u32)
    }

    pub fn quota(&mut self, group: &str, t: ResourceType, pool: &str, spec: SpecIx, units: u64) {
        let (g, p) = (self.group(group), self.pool(pool));
        self.quotas.push((g, t, p, spec, units));
    }

    pub fn pending(&mut self, a: PendingAttempt) {
        self.snap.pending.push(a);
    }

    pub fn running(&mut self, a: RunningAttempt) {
        self.snap.running.push(a);
    }

    pub fn build(mut self) -> Snapshot {
        let s = &mut self.snap;
        let mut q = QuotaTable::new(s.groups.len(), s.pools.len(), s.specs.len());
        for (g, t, p, spec, units) in self.quotas {
            q.set(g, t, p, spec, units);
        }
        s.quotas = q;
        for a in &s.running {
            for r in &a.replicas {
                let n = &mut s.nodes[r.node.ix()];
                n.used = n.used + r.need;
            }
        }
        self.snap
    }
}
