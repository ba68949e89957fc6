//! The scheduler's output: decisions, each about one attempt. "Cannot place this" is a decision with a
//! reason, never an error.

use crate::snapshot::*;
use std::fmt::Write as _;
use trainyard_core::demand::{Mib, Resources};
use trainyard_core::spec::ResourceType;

/// Every decision of one cycle: admissions and preemptions in the order they were made, then one wait per
/// attempt that stays queued, in queue order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub decisions: Vec<Decision>,
}

impl Plan {
    pub fn admissions(&self) -> impl Iterator<Item = &Admission> {
        self.decisions.iter().filter_map(|d| if let Decision::Admit(a) = d { Some(a) } else { None })
    }
    pub fn preemptions(&self) -> impl Iterator<Item = &Preemption> {
        self.decisions.iter().filter_map(|d| if let Decision::Preempt(p) = d { Some(p) } else { None })
    }
    pub fn waits(&self) -> impl Iterator<Item = &Wait> {
        self.decisions.iter().filter_map(|d| if let Decision::Wait(w) = d { Some(w) } else { None })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Admit(Admission),
    Preempt(Preemption),
    Wait(Wait),
}

/// Start this attempt with this option, every replica on the node given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    pub attempt: AttemptId,
    pub pending_index: usize,
    /// Index of the chosen instance-spec option.
    pub option: usize,
    pub placements: Vec<Placement>,
    /// How its units count against quota.
    pub units: Vec<UnitUse>,
    /// Runs (at least partly) on capacity that can be taken back.
    pub preemptible: bool,
}

/// One replica's node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Index into the option's roles.
    pub role: usize,
    /// Replica index within the role (0-based; RANK is derived by the backend).
    pub replica: u32,
    pub node: NodeIx,
    pub need: Resources,
}

/// Stop this running attempt (checkpoint window, then termination) to make room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preemption {
    pub victim: AttemptId,
    pub running_index: usize,
    pub preemptor: AttemptId,
}

/// Stay queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    pub attempt: AttemptId,
    pub pending_index: usize,
    pub reason: WaitReason,
    /// 1-based place in this cycle's global order.
    pub position: u32,
    /// 1-based place in its project group's queue.
    pub position_in_group: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitReason {
    /// Running attempts were told to stop for it; it starts when they are gone.
    Preempting {
        victims: Vec<AttemptId>,
        /// The nodes it will use; pass them back as [`PendingAttempt::nominated`] next cycle.
        nodes: Vec<NodeIx>,
    },
    /// Why each option could not be admitted.
    Blocked { options: Vec<OptionReason> },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionReason {
    pub option: usize,
    pub spec: SpecIx,
    pub block: OptionBlock,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionBlock {
    Quota(QuotaShort),
    /// No room for every replica now.
    NoFit {
        role: usize,
        need: Resources,
        replicas: u32,
        /// How many replicas of that size the free capacity holds now.
        fit_now: u64,
        /// The largest free block on a matching node.
        largest_free: Option<Resources>,
    },
    /// It would fit, but the nodes are held for an older or preempting task.
    Behind {
        holder: AttemptId,
        name: String,
    },
}

/// Which count is short, and by how much (in spec units).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaShort {
    /// The group's quota for this resource type.
    Quota { spec: SpecIx, resource_type: ResourceType, needs: u64, remaining: u64 },
    /// Unreserved pool capacity (Ondemand).
    Unreserved { spec: SpecIx, needs: u64, available: u64 },
    /// Reserved-but-unused capacity (Idle).
    Idle { spec: SpecIx, needs: u64, available: u64 },
}

impl QuotaShort {
    pub fn spec(&self) -> SpecIx {
        match *self {
            QuotaShort::Quota { spec, .. }
            | QuotaShort::Unreserved { spec, .. }
            | QuotaShort::Idle { spec, .. } => spec,
        }
    }
}

fn units(n: u64) -> String {
    format!("{n} unit{}", if n == 1 { "" } else { "s" })
}

fn describe(r: &Resources, model: Option<&str>) -> String {
    match model {
        Some(m) => format!("{} {m} GPU, {} vCPU, {}", r.gpus, r.vcpus, Mib(r.memory_mib)),
        None => format!("{} vCPU, {}", r.vcpus, Mib(r.memory_mib)),
    }
}

impl WaitReason {
    /// A sentence a person can act on, e.g. "needs 16 units of gpu.a100.1 (Reserved); group nlp has 8 left".
    pub fn describe(&self, snap: &Snapshot, group: GroupIx, names: impl Fn(AttemptId) -> String) -> String {
        match self {
            WaitReason::Preempting { victims, .. } => {
                let v: Vec<String> = victims.iter().map(|&id| names(id)).collect();
                format!("waiting for preempted tasks to release their resources: {}", v.join(", "))
            }
            WaitReason::Blocked { options } => {
                let mut out = String::new();
                for (k, r) in options.iter().enumerate() {
                    if k > 0 {
                        out.push_str("; ");
                    }
                    let spec = &snap.specs[r.spec.ix()];
                    if options.len() > 1 {
                        let _ = write!(out, "option {} ({}): ", r.option + 1, spec.name);
                    }
                    out.push_str(&r.block.describe(snap, group, r.spec));
                }
                out
            }
        }
    }
}

impl OptionBlock {
    pub fn describe(&self, snap: &Snapshot, group: GroupIx, spec: SpecIx) -> String {
        let spec_info = &snap.specs[spec.ix()];
        let model = spec_info.model.map(|m| snap.models[m.ix()].as_str());
        match self {
            OptionBlock::Quota(QuotaShort::Quota { resource_type, needs, remaining, .. }) => format!(
                "needs {} of {} ({resource_type}); group {} has {} left",
                units(*needs),
                spec_info.name,
                snap.groups[group.ix()],
                remaining
            ),
            OptionBlock::Quota(QuotaShort::Unreserved { needs, available, .. }) => format!(
                "needs {} of unreserved {} capacity (Ondemand); the pool has {available} unreserved left",
                units(*needs),
                spec_info.name
            ),
            OptionBlock::Quota(QuotaShort::Idle { needs, available, .. }) => {
                format!("needs {} of idle {} capacity; {available} idle now", units(*needs), spec_info.name)
            }
            OptionBlock::NoFit { need, replicas, fit_now, largest_free, .. } => {
                let what = describe(need, model);
                match largest_free {
                    None => format!("the pool has no schedulable {} nodes", model.unwrap_or("CPU")),
                    Some(l) => format!(
                        "needs {replicas} replica{} of {what} each; free capacity holds {fit_now} now, largest free block is {}",
                        if *replicas == 1 { "" } else { "s" },
                        describe(l, model)
                    ),
                }
            }
            OptionBlock::Behind { name, .. } => {
                format!("waiting behind {name}, which holds the nodes it needs")
            }
        }
    }
}
