//! The demand calculator: what a task needs for one choice of instance spec.
//!
//! PyTorchJob: replicas = 1 master + workers, all of one spec; spec units = replicas × countPerNode; GPUs,
//! vCPUs and memory = units × the spec's figures. RayJob: the head and the workers are computed apart (the
//! head may use its own spec), and quota is summed per spec, so a head and workers of one spec are checked
//! together and different specs apart.

use crate::catalog::InstanceSpec;
use crate::spec::{InstanceSpecChoice, TaskSpec, TaskType};
use serde::Serialize;
use std::ops::{Add, Mul};

/// GPUs, vCPUs and memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    pub gpus: u64,
    pub vcpus: u64,
    pub memory_mib: u64,
}

impl Resources {
    pub fn of(spec: &InstanceSpec) -> Resources {
        Resources { gpus: spec.gpus.into(), vcpus: spec.vcpus.into(), memory_mib: spec.memory_mib }
    }

    /// Whether `self` fits within `capacity` in every dimension.
    pub fn fits_in(&self, capacity: &Resources) -> bool {
        self.gpus <= capacity.gpus && self.vcpus <= capacity.vcpus && self.memory_mib <= capacity.memory_mib
    }
}

impl Add for Resources {
    type Output = Resources;
    fn add(self, o: Resources) -> Resources {
        Resources {
            gpus: self.gpus.saturating_add(o.gpus),
            vcpus: self.vcpus.saturating_add(o.vcpus),
            memory_mib: self.memory_mib.saturating_add(o.memory_mib),
        }
    }
}

impl Mul<u64> for Resources {
    type Output = Resources;
    fn mul(self, n: u64) -> Resources {
        Resources {
            gpus: self.gpus.saturating_mul(n),
            vcpus: self.vcpus.saturating_mul(n),
            memory_mib: self.memory_mib.saturating_mul(n),
        }
    }
}

/// A replica's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Master,
    Worker,
    Head,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Master => "master",
            Role::Worker => "worker",
            Role::Head => "head",
        }
    }
}

/// The demand of one role (master, workers or head).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RoleDemand {
    pub role: Role,
    pub replicas: u32,
    pub spec: String,
    pub count_per_node: u32,
    /// What one replica needs on one node: the spec × countPerNode.
    pub per_replica: Resources,
    /// Spec units for the whole role: replicas × countPerNode.
    pub units: u64,
    pub total: Resources,
}

/// Spec units counted against quota for one instance spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QuotaDemand {
    pub spec: String,
    pub units: u64,
}

/// What the task needs when its `option`-th instance spec is chosen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Demand {
    /// Index into `spec.compute.instanceSpecs`.
    pub option: usize,
    pub roles: Vec<RoleDemand>,
    /// All replicas that must be placed at once (the gang).
    pub replicas: u32,
    /// Units per spec, in spec-name order; what quota is checked against.
    pub quota: Vec<QuotaDemand>,
    pub total: Resources,
}

/// Why a demand cannot be computed. Validation reports these as problems first; the calculator refuses
/// instead of guessing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DemandError {
    #[error("instance spec option {0} does not exist")]
    NoSuchOption(usize),
    #[error("instance spec {0:?} is not in the catalog")]
    UnknownSpec(String),
}

fn role<'a>(
    role: Role,
    replicas: u32,
    choice: &InstanceSpecChoice,
    lookup: &dyn Fn(&str) -> Option<&'a InstanceSpec>,
) -> Result<RoleDemand, DemandError> {
    let spec = lookup(&choice.spec).ok_or_else(|| DemandError::UnknownSpec(choice.spec.clone()))?;
    let per_replica = Resources::of(spec) * u64::from(choice.count_per_node);
    let units = u64::from(replicas) * u64::from(choice.count_per_node);
    Ok(RoleDemand {
        role,
        replicas,
        spec: choice.spec.clone(),
        count_per_node: choice.count_per_node,
        per_replica,
        units,
        total: per_replica * u64::from(replicas),
    })
}

/// The demand of `task` with its `option`-th instance spec, looking specs up with `lookup`.
pub fn demand<'a>(
    task: &TaskSpec,
    option: usize,
    lookup: &dyn Fn(&str) -> Option<&'a InstanceSpec>,
) -> Result<Demand, DemandError> {
    let choice = task.compute.instance_specs.get(option).ok_or(DemandError::NoSuchOption(option))?;
    let workers = task.compute.workers;
    let mut roles = Vec::with_capacity(2);
    match task.task_type {
        TaskType::PyTorchJob => {
            roles.push(role(Role::Master, 1, choice, lookup)?);
            if workers > 0 {
                roles.push(role(Role::Worker, workers, choice, lookup)?);
            }
        }
        TaskType::RayJob => {
            let head = task.ray.as_ref().and_then(|r| r.head.instance_spec.as_ref()).unwrap_or(choice);
            roles.push(role(Role::Head, 1, head, lookup)?);
            if workers > 0 {
                roles.push(role(Role::Worker, workers, choice, lookup)?);
            }
        }
    }
    let mut quota: Vec<QuotaDemand> = Vec::new();
    for r in &roles {
        match quota.iter_mut().find(|q| q.spec == r.spec) {
            Some(q) => q.units += r.units,
            None => quota.push(QuotaDemand { spec: r.spec.clone(), units: r.units }),
        }
    }
    quota.sort_by(|a, b| a.spec.cmp(&b.spec));
    Ok(Demand {
        option,
        replicas: roles.iter().map(|r| r.replicas).sum(),
        total: roles.iter().fold(Resources::default(), |acc, r| acc + r.total),
        roles,
        quota,
    })
}

/// The demand for every instance spec option, in the user's priority order.
pub fn demand_options<'a>(
    task: &TaskSpec,
    lookup: &dyn Fn(&str) -> Option<&'a InstanceSpec>,
) -> Result<Vec<Demand>, DemandError> {
    (0..task.compute.instance_specs.len()).map(|i| demand(task, i, lookup)).collect()
}

impl std::fmt::Display for Resources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.gpus > 0 {
            write!(f, "{} GPU, ", self.gpus)?;
        }
        write!(f, "{} vCPU, {}", self.vcpus, Mib(self.memory_mib))
    }
}

/// Memory for people: whole GiB when exact, MiB otherwise.
#[derive(Debug, Clone, Copy)]
pub struct Mib(pub u64);

impl std::fmt::Display for Mib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0 % 1024 == 0 { write!(f, "{} GiB", self.0 / 1024) } else { write!(f, "{} MiB", self.0) }
    }
}
