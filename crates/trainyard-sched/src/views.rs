//! The figures the console shows before submission, computed by the scheduler's own code so that what a user
//! sees is what the scheduler will decide: remaining quota, pool available, idle quantity, fragmentation, and
//! "would this task be admitted now, and if not, why".

use crate::plan::Decision;
use crate::schedule::{Config, schedule};
use crate::snapshot::*;
use crate::state::{State, units_in};
use serde::Serialize;
use std::collections::BTreeMap;
use trainyard_core::spec::ResourceType;

/// Units of `spec` the group may still use under its quota for this resource type; `None` when there is no
/// cap (Ondemand, Spot and Idle without an explicit quota).
pub fn remaining_quota(
    snap: &Snapshot,
    group: GroupIx,
    t: ResourceType,
    pool: PoolIx,
    spec: SpecIx,
) -> Option<u64> {
    let st = State::new(snap);
    let class = match t {
        ResourceType::Reserved => UsageClass::Reserved,
        ResourceType::Ondemand => UsageClass::Ondemand,
        ResourceType::Spot => UsageClass::Spot,
        ResourceType::Idle => UsageClass::Idle,
    };
    snap.quotas.limit(group, t, pool, spec).map(|l| l.saturating_sub(st.group_used(group, class, pool, spec)))
}

/// Units of `spec` that the pool's free capacity holds now, node by node. A reference value, not a
/// reservation.
pub fn pool_available(snap: &Snapshot, pool: PoolIx, spec: SpecIx) -> u64 {
    fragmentation(snap, pool, spec, 1).replicas_fit
}

/// Units of `spec` reserved by groups and not used now: what Idle tasks and idle supplementation may use.
pub fn idle_quantity(snap: &Snapshot, pool: PoolIx, spec: SpecIx) -> u64 {
    State::new(snap).idle_available(pool, spec)
}

/// Units of `spec` no group reserved that Ondemand tasks do not use yet.
pub fn unreserved_available(snap: &Snapshot, pool: PoolIx, spec: SpecIx) -> u64 {
    let mut st = State::new(snap);
    st.unreserved_units(pool, spec).saturating_sub(st.class_used(UsageClass::Ondemand, pool, spec))
}

/// How free capacity is spread for replicas of `spec × count_per_node`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Fragmentation {
    /// Replicas of that size that fit now, counting every node.
    pub replicas_fit: u64,
    /// Nodes with room for at least one.
    pub nodes_with_room: u64,
    /// Free blocks: how many nodes could take exactly N more units of the spec (N ≥ 1).
    pub free_units_histogram: BTreeMap<u64, u64>,
}

pub fn fragmentation(snap: &Snapshot, pool: PoolIx, spec: SpecIx, count_per_node: u32) -> Fragmentation {
    let st = State::new(snap);
    let info = &snap.specs[spec.ix()];
    let need = info.per_unit * u64::from(count_per_node.max(1));
    let mut f = Fragmentation { replicas_fit: 0, nodes_with_room: 0, free_units_histogram: BTreeMap::new() };
    if let Some(gi) = st.group_index(pool, info.model) {
        for bucket in &st.groups[gi].buckets {
            for &n in bucket {
                let free = st.free[n.ix()];
                let fit = units_in(free, need);
                if fit > 0 {
                    f.replicas_fit += fit;
                    f.nodes_with_room += 1;
                }
                let u = units_in(free, info.per_unit);
                if u > 0 {
                    *f.free_units_histogram.entry(u).or_default() += 1;
                }
            }
        }
    }
    f
}

/// What the scheduler would decide for `candidate` if it were queued now, behind everything already queued.
pub fn would_admit(snap: &Snapshot, candidate: PendingAttempt, now_ms: u64, config: &Config) -> Decision {
    let mut s = snap.clone();
    let id = candidate.id;
    s.pending.push(candidate);
    let plan = schedule(&s, now_ms, config);
    plan.decisions
        .into_iter()
        .find(|d| match d {
            Decision::Admit(a) => a.attempt == id,
            Decision::Wait(w) => w.attempt == id,
            Decision::Preempt(_) => false,
        })
        .expect("schedule decides every pending attempt")
}
