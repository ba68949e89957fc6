//! How much the task asks for, and of what: workers, priority, the kind of capacity (resource type,
//! guarantee, idle supplementation) and the instance specs a replica takes, down to whether a replica could
//! ever fit on one of the pool's nodes.

use super::context::{Place, V, names};
use super::limits::*;
use crate::catalog::InstanceSpec;
use crate::demand::Resources;
use crate::problem::{Code, field, index};
use crate::spec::{Compute, InstanceSpecChoice, ResourceType, TrainingTask};
use std::collections::{BTreeMap, BTreeSet};

impl<'a> V<'a> {
    pub(super) fn compute(&mut self, t: &TrainingTask, place: &Place) {
        let c = &t.spec.compute;
        let base = "spec.compute";
        if c.workers > WORKERS_MAX {
            self.report.error(
                field(base, "workers"),
                Code::OutOfRange,
                format!("{} workers is too many; at most {WORKERS_MAX}", c.workers),
            );
        }
        if !(PRIORITY_MIN..=PRIORITY_MAX).contains(&c.priority) {
            self.report.error(
                field(base, "priority"),
                Code::OutOfRange,
                format!(
                    "{} is out of range; use {PRIORITY_MIN} (lowest) to {PRIORITY_MAX} (highest)",
                    c.priority
                ),
            );
        }
        self.capacity(c);
        self.instance_specs(c, place);
    }

    /// The kind of capacity: a guarantee needs capacity that is never preempted, and idle supplementation
    /// extends Reserved quota only.
    fn capacity(&mut self, c: &Compute) {
        let base = "spec.compute";
        let rt = self.ok("spec.compute.resourceType").then_some(c.resource_type);
        if c.guarantee && matches!(rt, Some(ResourceType::Spot | ResourceType::Idle)) {
            self.report.error(
                field(base, "guarantee"),
                Code::Conflict,
                format!("{} capacity can always be preempted, so it cannot be guaranteed; use Reserved or Ondemand, or turn guarantee off", c.resource_type),
            );
        }
        if c.idle_supplement {
            match rt {
                Some(ResourceType::Reserved) | None => {
                    if c.guarantee {
                        self.report.warning(
                            field(base, "idleSupplement"),
                            Code::Ignored,
                            "has no effect with guarantee on: a guaranteed task never runs on idle capacity",
                        );
                    }
                }
                Some(other) => self.report.error(
                    field(base, "idleSupplement"),
                    Code::NotSupported,
                    format!("idle supplementation extends Reserved quota; it does not apply to {other}"),
                ),
            }
        }
    }

    /// The instance specs a replica may take: at least one, each listed once, each resolved.
    fn instance_specs(&mut self, c: &Compute, place: &Place) {
        let base = "spec.compute";
        let specs_path = field(base, "instanceSpecs");
        if c.instance_specs.is_empty() && self.ok(&specs_path) {
            let offered = place.pool.map(|p| self.cat.pools[p].instance_specs.join(", ")).unwrap_or_default();
            self.report.error(
                &specs_path,
                Code::Empty,
                format!(
                    "choose at least one instance spec{}",
                    if offered.is_empty() { String::new() } else { format!("; the pool offers {offered}") }
                ),
            );
        }
        if c.instance_specs.len() > INSTANCE_SPECS_MAX {
            self.report.error(
                &specs_path,
                Code::TooLong,
                format!("lists {} instance specs; at most {INSTANCE_SPECS_MAX}", c.instance_specs.len()),
            );
        }
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        let mut kinds = BTreeSet::new();
        for (i, choice) in c.instance_specs.iter().enumerate() {
            let p = index(&specs_path, i);
            if let Some(first) = seen.insert(&choice.spec, i) {
                self.report.error(
                    field(&p, "spec"),
                    Code::Duplicate,
                    format!("instance spec \"{}\" is already listed at {specs_path}[{first}]; list each spec once", choice.spec),
                );
                continue;
            }
            if let Some(s) = self.instance_spec(&p, choice, place) {
                kinds.insert(s.kind);
            }
        }
        if kinds.len() > 1 {
            self.report.warning(
                &specs_path,
                Code::Conflict,
                "mixes GPU and CPU instance specs; make sure the training code runs on both",
            );
        }
    }

    /// Checks one instance spec choice (a worker option or the Ray head). Returns the spec when it resolved.
    pub(super) fn instance_spec(
        &mut self,
        p: &str,
        choice: &InstanceSpecChoice,
        place: &Place,
    ) -> Option<&'a InstanceSpec> {
        let cat = self.cat;
        let sp = field(p, "spec");
        let offered: Vec<&String> = match place.pool {
            Some(pool) => cat.pools[pool].instance_specs.iter().collect(),
            None => cat.instance_specs.keys().collect(),
        };
        if !self.reference(
            &sp,
            "instance spec",
            &choice.spec,
            cat.instance_specs.contains_key(&choice.spec),
            names(offered.iter().copied()),
        ) {
            return None;
        }
        let spec = &cat.instance_specs[&choice.spec];
        let cp = field(p, "countPerNode");
        if choice.count_per_node == 0 || choice.count_per_node > COUNT_PER_NODE_MAX {
            self.report.error(
                &cp,
                Code::OutOfRange,
                format!(
                    "{} is out of range; each replica takes 1 to {COUNT_PER_NODE_MAX} units of its spec",
                    choice.count_per_node
                ),
            );
        }
        if let Some(pool) = place.pool {
            if !offered.contains(&&choice.spec) {
                self.report.error(
                    &sp,
                    Code::NotAvailable,
                    format!(
                        "pool \"{pool}\" does not offer \"{}\"; it offers {}",
                        choice.spec,
                        names(offered.iter().copied())
                    ),
                );
                return Some(spec);
            }
            if (1..=COUNT_PER_NODE_MAX).contains(&choice.count_per_node) {
                self.never_fits(&cp, pool, &choice.spec, spec, choice.count_per_node);
            }
        }
        Some(spec)
    }

    /// A replica must fit on one node. When the catalog knows the pool's nodes, refuse a replica that no node
    /// could ever hold, rather than letting it wait forever.
    fn never_fits(&mut self, path: &str, pool: &str, name: &str, spec: &InstanceSpec, count: u32) {
        let need = Resources::of(spec) * u64::from(count);
        let mut any_node = false;
        let mut largest: Option<Resources> = None;
        for (_, n) in self.cat.pool_nodes(pool) {
            any_node = true;
            if !spec.matches_node(n.gpu_model.as_deref()) {
                continue;
            }
            let cap = Resources { gpus: n.gpus.into(), vcpus: n.vcpus.into(), memory_mib: n.memory_mib };
            if need.fits_in(&cap) {
                return;
            }
            if largest.is_none_or(|l| (cap.gpus, cap.vcpus, cap.memory_mib) > (l.gpus, l.vcpus, l.memory_mib))
            {
                largest = Some(cap);
            }
        }
        if !any_node {
            return;
        }
        let model = spec.gpu_model.as_deref().unwrap_or("CPU");
        let message = match largest {
            None => format!("pool \"{pool}\" has no {model} nodes, so \"{name}\" can never be placed there"),
            Some(l) => {
                let most = max_count(spec, &l);
                format!(
                    "one replica needs {need} ({count} × \"{name}\") on a single node, but the largest {model} node in pool \"{pool}\" has {l}; use countPerNode {most} or less and more workers"
                )
            }
        };
        self.report.error(path, Code::NeverFits, message);
    }
}

/// How many units of `spec` fit on a node of capacity `cap`.
fn max_count(spec: &InstanceSpec, cap: &Resources) -> u64 {
    let per = |have: u64, need: u64| have.checked_div(need).unwrap_or(u64::MAX);
    per(cap.gpus, spec.gpus.into())
        .min(per(cap.vcpus, spec.vcpus.into()))
        .min(per(cap.memory_mib, spec.memory_mib))
}
