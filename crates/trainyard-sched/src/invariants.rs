//! `check_plan`: the rules every plan must keep, checked after every cycle by the tests and the simulator.
//! It recomputes everything from the snapshot and the plan with none of the scheduler's own structures, so a
//! bug in those cannot hide here.

use crate::plan::*;
use crate::snapshot::*;
use std::collections::BTreeMap;
use trainyard_core::demand::Resources;
use trainyard_core::spec::ResourceType;

/// Checks the snapshot on its own: every node's `used` is the sum of what runs there and within capacity.
pub fn check_snapshot(snap: &Snapshot) -> Result<(), Vec<String>> {
    let mut errors = Vec::new();
    let mut used = vec![Resources::default(); snap.nodes.len()];
    for a in &snap.running {
        for r in &a.replicas {
            used[r.node.ix()] = used[r.node.ix()] + r.need;
        }
    }
    for (i, n) in snap.nodes.iter().enumerate() {
        if used[i] != n.used {
            errors.push(format!("node {}: used {:?} but its replicas sum to {:?}", n.name, n.used, used[i]));
        }
        if !n.used.fits_in(&n.capacity) {
            errors.push(format!("node {} is over capacity: {:?} of {:?}", n.name, n.used, n.capacity));
        }
    }
    if errors.is_empty() { Ok(()) } else { Err(errors) }
}

/// Checks a plan against the snapshot it was made from.
pub fn check_plan(snap: &Snapshot, plan: &Plan) -> Result<(), Vec<String>> {
    let mut errors = Vec::new();
    let mut used: Vec<Resources> = snap.nodes.iter().map(|n| n.used).collect();
    let mut decided = vec![0u32; snap.pending.len()];
    // Units per (group, class, pool, spec) after the plan.
    let mut units: BTreeMap<(GroupIx, UsageClass, PoolIx, SpecIx), u64> = BTreeMap::new();
    for a in &snap.running {
        for u in &a.units {
            *units.entry((a.group, u.class, a.pool, u.spec)).or_default() += u.units;
        }
    }
    let mut preempted = vec![false; snap.running.len()];
    for d in &plan.decisions {
        match d {
            Decision::Admit(adm) => {
                let a = &snap.pending[adm.pending_index];
                decided[adm.pending_index] += 1;
                if a.id != adm.attempt {
                    errors.push(format!("admission of {:?} points at pending {:?}", adm.attempt, a.id));
                }
                let Some(option) = a.options.get(adm.option) else {
                    errors.push(format!("{:?}: option {} does not exist", a.id, adm.option));
                    continue;
                };
                // Gang: every replica of every role exactly once.
                let mut seen: Vec<Vec<bool>> =
                    option.roles.iter().map(|r| vec![false; r.replicas as usize]).collect();
                for p in &adm.placements {
                    let role = &option.roles[p.role];
                    let slot = &mut seen[p.role][p.replica as usize];
                    if *slot {
                        errors.push(format!("{:?}: replica {}/{} placed twice", a.id, p.role, p.replica));
                    }
                    *slot = true;
                    let node = &snap.nodes[p.node.ix()];
                    let spec = &snap.specs[role.spec.ix()];
                    if p.need != snap.replica_need(role) {
                        errors.push(format!("{:?}: replica need {:?} is not spec × count", a.id, p.need));
                    }
                    if node.pool != a.pool {
                        errors.push(format!("{:?}: placed on {} outside its pool", a.id, node.name));
                    }
                    if node.model != spec.model {
                        errors.push(format!(
                            "{:?}: {} placed on {} whose GPU model does not match",
                            a.id, spec.name, node.name
                        ));
                    }
                    if !node.schedulable {
                        errors.push(format!("{:?}: placed on unschedulable node {}", a.id, node.name));
                    }
                    if a.excluded.contains(&p.node) {
                        errors.push(format!("{:?}: placed on excluded node {}", a.id, node.name));
                    }
                    used[p.node.ix()] = used[p.node.ix()] + p.need;
                }
                if seen.iter().flatten().any(|s| !s) {
                    errors.push(format!("{:?}: gang admitted with replicas missing", a.id));
                }
                // Units as the option demands, classed as the resource type allows.
                let mut by_spec: BTreeMap<SpecIx, u64> = BTreeMap::new();
                for r in &option.roles {
                    *by_spec.entry(r.spec).or_default() +=
                        u64::from(r.replicas) * u64::from(r.count_per_node);
                }
                let mut got: BTreeMap<SpecIx, u64> = BTreeMap::new();
                for u in &adm.units {
                    *got.entry(u.spec).or_default() += u.units;
                    let allowed = match a.resource_type {
                        ResourceType::Reserved => {
                            u.class == UsageClass::Reserved
                                || (u.class == UsageClass::Borrowed && a.idle_supplement && !a.guarantee)
                        }
                        ResourceType::Ondemand => u.class == UsageClass::Ondemand,
                        ResourceType::Spot => u.class == UsageClass::Spot,
                        ResourceType::Idle => u.class == UsageClass::Idle,
                    };
                    if !allowed {
                        errors
                            .push(format!("{:?}: {:?} units for a {} task", a.id, u.class, a.resource_type));
                    }
                    *units.entry((a.group, u.class, a.pool, u.spec)).or_default() += u.units;
                }
                if got != by_spec {
                    errors.push(format!("{:?}: units {got:?} do not match the gang's {by_spec:?}", a.id));
                }
                let preemptible = adm.units.iter().any(|u| u.class.preemptible());
                if adm.preemptible != preemptible {
                    errors.push(format!("{:?}: preemptible flag disagrees with its units", a.id));
                }
                if a.guarantee && preemptible {
                    errors.push(format!("{:?}: guaranteed task admitted on preemptible capacity", a.id));
                }
            }
            Decision::Preempt(p) => {
                let Some(r) = snap.running.get(p.running_index) else {
                    errors.push(format!(
                        "preemption of a running index that does not exist: {}",
                        p.running_index
                    ));
                    continue;
                };
                if preempted[p.running_index] {
                    errors.push(format!("{:?} preempted twice", r.id));
                }
                preempted[p.running_index] = true;
                let Some(pre) = snap.pending.iter().find(|a| a.id == p.preemptor) else {
                    errors.push(format!("preemptor {:?} is not pending", p.preemptor));
                    continue;
                };
                let allowed = r.pool == pre.pool
                    && (r.preemptible()
                        || (pre.resource_type == ResourceType::Reserved
                            && r.resource_type == ResourceType::Reserved
                            && r.group == pre.group
                            && r.priority < pre.priority));
                if !allowed || r.stopping {
                    errors.push(format!("{:?} may not preempt {:?}", pre.id, r.id));
                }
            }
            Decision::Wait(w) => decided[w.pending_index] += 1,
        }
    }
    for (i, n) in decided.iter().enumerate() {
        if *n != 1 {
            errors.push(format!("{:?} got {n} decisions", snap.pending[i].id));
        }
    }
    // Preempted attempts still hold their resources until they are gone, so capacity counts them.
    for (i, n) in snap.nodes.iter().enumerate() {
        if !used[i].fits_in(&n.capacity) {
            errors.push(format!(
                "node {} over capacity after the plan: {:?} of {:?}",
                n.name, used[i], n.capacity
            ));
        }
    }
    // Quota: Reserved units within each group's quota; explicit caps for the other types. Units of attempts
    // being preempted still count, since they are still there.
    for (&(g, class, p, s), &u) in &units {
        let t = match class {
            UsageClass::Reserved => ResourceType::Reserved,
            UsageClass::Ondemand => ResourceType::Ondemand,
            UsageClass::Spot => ResourceType::Spot,
            UsageClass::Idle => ResourceType::Idle,
            UsageClass::Borrowed => continue,
        };
        if let Some(limit) = snap.quotas.limit(g, t, p, s) {
            // A preemptor may be admitted only once its victims are gone, so over-use here is a bug.
            if u > limit {
                errors.push(format!(
                    "group {} uses {u} {t} units of {} in pool {}, over its quota of {limit}",
                    snap.groups[g.ix()],
                    snap.specs[s.ix()].name,
                    snap.pools[p.ix()]
                ));
            }
        }
    }
    if errors.is_empty() { Ok(()) } else { Err(errors) }
}
