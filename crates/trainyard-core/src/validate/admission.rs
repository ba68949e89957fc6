//! Whether a task that is valid in every field could ever be admitted under today's catalog: each instance
//! spec option is tried against the pool's nodes (all of them, empty) and the group's quota. Only what holds
//! whatever else runs is claimed, so a task refused here would wait forever, never merely for a while:
//!
//! - **Quota**: a Reserved gang needs more units of a spec than the group's Reserved quota in the pool (unless
//!   idle supplementation may lend the rest); any other resource type, more than a limit the group has.
//! - **Capacity**: the replicas of one shape (a role's) need more nodes than the pool has that could hold one
//!   (each node holds as many as its GPUs, vCPUs and memory allow, counted exactly); or the gang needs more
//!   GPUs, vCPUs or memory than the matching nodes have in all.

use super::context::{Place, V};
use crate::catalog::Catalog;
use crate::demand::{Demand, Resources, demand_options};
use crate::problem::Code;
use crate::spec::{ResourceType, TrainingTask};

impl V<'_> {
    /// Refuses a task no placement could ever admit (every option short of something that does not change
    /// while the catalog stays as it is), with each option's reason.
    pub(super) fn admission(&mut self, t: &TrainingTask, place: &Place) {
        let (Some(pool), Some(group)) = (place.pool, place.group) else { return };
        if !self.report.is_ok() {
            return;
        }
        let cat = self.cat;
        let Ok(options) = demand_options(&t.spec, &|s| cat.instance_specs.get(s)) else { return };
        let mut reasons = Vec::new();
        for d in &options {
            match never(cat, t, pool, group, d) {
                Some(why) => reasons.push(format!(
                    "option {} ({}): {why}",
                    d.option + 1,
                    t.spec.compute.instance_specs.get(d.option).map_or("", |c| c.spec.as_str())
                )),
                None => return,
            }
        }
        if reasons.is_empty() {
            return;
        }
        let message = format!(
            "this task can never be admitted in pool \"{pool}\" as the catalog stands (it would wait forever): {}",
            reasons.join("; ")
        );
        self.report.error("spec.compute.instanceSpecs", Code::NeverFits, message);
    }
}

/// The pool's units of `spec` when empty (each catalog node's, as many as its GPUs, vCPUs and memory hold)
/// and the units every group's Reserved quota takes of them; None when the catalog lists no node there.
fn unreserved(cat: &Catalog, pool: &str, spec_name: &str) -> Option<(u64, u64)> {
    let spec = cat.instance_specs.get(spec_name)?;
    let per = (u64::from(spec.gpus), u64::from(spec.vcpus), spec.memory_mib);
    let each = |have: u64, need: u64| have.checked_div(need).unwrap_or(u64::MAX);
    let mut nodes =
        cat.pool_nodes(pool).filter(|(_, n)| spec.matches_node(n.gpu_model.as_deref())).peekable();
    nodes.peek()?;
    let capacity = nodes
        .map(|(_, n)| {
            each(n.gpus.into(), per.0).min(each(n.vcpus.into(), per.1)).min(each(n.memory_mib, per.2))
        })
        .fold(0u64, u64::saturating_add);
    let reserved = cat
        .quotas
        .iter()
        .filter(|l| l.resource_type == ResourceType::Reserved && l.pool == pool && l.spec == spec_name)
        .map(|l| l.units)
        .fold(0u64, u64::saturating_add);
    Some((capacity, reserved))
}

/// Why option `d` can never be admitted, if it cannot.
fn never(cat: &Catalog, t: &TrainingTask, pool: &str, group: &str, d: &Demand) -> Option<String> {
    let c = &t.spec.compute;
    for q in &d.quota {
        let limit = |rt: ResourceType| -> Option<u64> {
            let lines: Vec<u64> = cat
                .quotas
                .iter()
                .filter(|l| l.group == group && l.resource_type == rt && l.pool == pool && l.spec == q.spec)
                .map(|l| l.units)
                .collect();
            (!lines.is_empty()).then(|| lines.iter().sum())
        };
        let rt = c.resource_type;
        let binding = match rt {
            ResourceType::Reserved if c.idle_supplement && !c.guarantee => None,
            ResourceType::Reserved => Some(limit(rt).unwrap_or(0)),
            _ => limit(rt),
        };
        if let Some(l) = binding.filter(|l| q.units > *l) {
            return Some(format!(
                "it needs {} units of {} and group \"{group}\"'s {rt} quota there is {l}",
                q.units, q.spec
            ));
        }
        // Ondemand runs only where no group reserved: the pool's units of the spec less every group's
        // Reserved quota of it (as the scheduler counts them).
        if rt == ResourceType::Ondemand
            && let Some((capacity, reserved)) = unreserved(cat, pool, &q.spec)
            && q.units > capacity.saturating_sub(reserved)
        {
            return Some(format!(
                "it needs {} units of {} no group reserved, and the pool's nodes hold {capacity} units of it of \
                 which the groups' Reserved quotas take {reserved}; choose another resource type (Reserved with \
                 quota, Spot or Idle)",
                q.units, q.spec
            ));
        }
    }
    // Capacity: each role's replicas (one shape) on the nodes that match its spec, counted exactly; then the
    // whole gang against the matching nodes' total.
    let mut total_need = Resources::default();
    let mut total_have = Resources::default();
    let mut counted = std::collections::BTreeSet::new();
    // Replicas of one shape (the master and the workers of a PyTorchJob are one), counted together.
    let mut shapes: Vec<(&str, Resources, u64)> = Vec::new();
    for r in &d.roles {
        total_need = total_need + r.total;
        match shapes.iter_mut().find(|(s, per, _)| *s == r.spec && *per == r.per_replica) {
            Some((_, _, n)) => *n += u64::from(r.replicas),
            None => shapes.push((&r.spec, r.per_replica, u64::from(r.replicas))),
        }
    }
    for (spec_name, per, replicas) in shapes {
        let spec = cat.instance_specs.get(spec_name)?;
        let mut fit = 0u64;
        let mut matching = 0;
        for (name, n) in cat.pool_nodes(pool).filter(|(_, n)| spec.matches_node(n.gpu_model.as_deref())) {
            matching += 1;
            let cap = Resources { gpus: n.gpus.into(), vcpus: n.vcpus.into(), memory_mib: n.memory_mib };
            let each = |have: u64, need: u64| have.checked_div(need).unwrap_or(u64::MAX);
            fit = fit.saturating_add(
                each(cap.gpus, per.gpus)
                    .min(each(cap.vcpus, per.vcpus))
                    .min(each(cap.memory_mib, per.memory_mib)),
            );
            if counted.insert(name.clone()) {
                total_have = total_have + cap;
            }
        }
        if matching == 0 {
            // No node of this kind at all: the per-replica check says so at the spec.
            return None;
        }
        if fit < replicas {
            return Some(format!(
                "its {replicas} replicas of {spec_name} need {per} each, and the pool's nodes hold {fit} such replicas even when empty"
            ));
        }
    }
    if !total_need.fits_in(&total_have) {
        return Some(format!(
            "the gang needs {total_need} at once, more than the pool's matching nodes have in all ({total_have})"
        ));
    }
    None
}
