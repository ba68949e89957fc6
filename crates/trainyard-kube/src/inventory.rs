//! The cluster's nodes kept in the catalog (pure): what the node watch sees is merged into the catalog the
//! scheduler places on, so capacity, cordons, readiness and new or removed nodes reach it without an admin.
//!
//! - A node the catalog has takes the cluster's capacity, pool and GPU model.
//! - `schedulable` follows the cluster (cordoned or NotReady: false) when the cluster's state of the node
//!   changed since the last merge (on the first, only a cordon is carried over); an admin's cordon through
//!   Trainyard stays until then.
//! - A new node joins when its pool is in the catalog (a node of an unknown pool could never be used).
//! - A node gone from the cluster leaves the catalog. An admin's `failed` mark is never touched.
//! - With several clusters, each cluster's nodes touch only the pools it serves (`serves`).

use std::collections::BTreeMap;
use trainyard_core::Catalog;
use trainyard_core::catalog::Node;

/// Merges the cluster's nodes (`now`) into `catalog`; `before` is what the last merge saw (None on the first);
/// `serves` says which pools are this cluster's (a node in another's is left alone). Returns the new catalog
/// when anything changed, with what changed in words.
pub fn merge(
    catalog: &Catalog,
    before: Option<&BTreeMap<String, Node>>,
    now: &BTreeMap<String, Node>,
    serves: &dyn Fn(&str) -> bool,
) -> Option<(Catalog, Vec<String>)> {
    let mut next = catalog.clone();
    let mut said = Vec::new();
    for (name, seen) in now {
        let pool = next.nodes.get(name).map_or(&seen.pool, |n| &n.pool);
        if !serves(pool) || !serves(&seen.pool) {
            continue;
        }
        // On the first merge (a server start) only a cordon or a NotReady node is carried over, so an admin's
        // cordon through Trainyard survives a restart.
        let changed_in_cluster = match before {
            None => !seen.schedulable,
            Some(b) => b.get(name).is_none_or(|old| old.schedulable != seen.schedulable),
        };
        match next.nodes.get_mut(name) {
            Some(n) => {
                let shape = (&seen.pool, &seen.gpu_model, seen.gpus, seen.vcpus, seen.memory_mib);
                if (&n.pool, &n.gpu_model, n.gpus, n.vcpus, n.memory_mib) != shape
                    && next.pools.contains_key(&seen.pool)
                {
                    said.push(format!(
                        "node {name}: {} vCPU, {} MiB, {} GPU in pool {} (was {} vCPU, {} MiB, {} GPU in {})",
                        seen.vcpus,
                        seen.memory_mib,
                        seen.gpus,
                        seen.pool,
                        n.vcpus,
                        n.memory_mib,
                        n.gpus,
                        n.pool
                    ));
                    n.pool = seen.pool.clone();
                    n.gpu_model = seen.gpu_model.clone();
                    n.gpus = seen.gpus;
                    n.vcpus = seen.vcpus;
                    n.memory_mib = seen.memory_mib;
                }
                if changed_in_cluster && n.schedulable != seen.schedulable {
                    said.push(format!(
                        "node {name}: {}",
                        if seen.schedulable {
                            "takes work again"
                        } else {
                            "cordoned or not ready: no new work"
                        }
                    ));
                    n.schedulable = seen.schedulable;
                }
            }
            None if next.pools.contains_key(&seen.pool) => {
                said.push(format!("node {name} joined pool {}", seen.pool));
                next.nodes.insert(name.clone(), seen.clone());
            }
            None => {}
        }
    }
    // Only nodes the cluster had and lost leave: one an admin described that the cluster never showed stays.
    if let Some(before) = before {
        for name in before.keys().filter(|n| !now.contains_key(*n)) {
            if next.nodes.get(name).is_some_and(|n| serves(&n.pool)) && next.nodes.remove(name).is_some() {
                said.push(format!("node {name} left the cluster"));
            }
        }
    }
    (!said.is_empty()).then_some((next, said))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CATALOG: &str = r#"
regions: {k: {}}
clusters: {k: {region: k}}
pools: {default: {cluster: k, instanceSpecs: [cpu.small]}}
instanceSpecs: {cpu.small: {kind: CPU, vcpus: 1, memoryMib: 1024}}
nodes:
  a: {pool: default, vcpus: 4, memoryMib: 4096}
  manual: {pool: default, vcpus: 4, memoryMib: 4096}
projectGroups: {g: {}}
images: {}
quotas: []
"#;

    fn node(vcpus: u32, schedulable: bool, pool: &str) -> Node {
        Node {
            pool: pool.into(),
            schedulable,
            failed: false,
            gpu_model: None,
            gpus: 0,
            gpu_devices: Vec::new(),
            vcpus,
            memory_mib: 4096,
        }
    }

    #[test]
    fn capacity_cordons_joins_and_departures_reach_the_catalog() {
        let cat = Catalog::from_yaml(CATALOG).unwrap();
        let first: BTreeMap<String, Node> = [
            ("a".into(), node(8, true, "default")),
            ("b".into(), node(4, true, "default")),
            ("x".into(), node(4, true, "gpu")),
        ]
        .into();
        let (cat, said) = merge(&cat, None, &first, &|_| true).unwrap();
        assert_eq!(cat.nodes["a"].vcpus, 8, "{said:?}");
        assert!(cat.nodes.contains_key("b"), "joined");
        assert!(!cat.nodes.contains_key("x"), "its pool is not in the catalog");
        assert!(cat.nodes.contains_key("manual"), "a node the cluster never showed stays");
        assert_eq!(merge(&cat, Some(&first), &first, &|_| true), None, "nothing changed, nothing written");

        // An admin cordons b through Trainyard: the cluster's unchanged state does not undo it.
        let mut admin = cat.clone();
        admin.nodes.get_mut("b").unwrap().schedulable = false;
        admin.nodes.get_mut("b").unwrap().failed = true;
        assert_eq!(merge(&admin, Some(&first), &first, &|_| true), None);

        // The cluster cordons a and loses b.
        let second: BTreeMap<String, Node> = [("a".into(), node(8, false, "default"))].into();
        let (cat, said) = merge(&admin, Some(&first), &second, &|_| true).unwrap();
        assert!(!cat.nodes["a"].schedulable, "{said:?}");
        assert!(!cat.nodes.contains_key("b"), "{said:?}");
        assert!(said.iter().any(|s| s.contains("left the cluster")), "{said:?}");

        // Uncordoned in the cluster: it takes work again.
        let (cat, _) = merge(&cat, Some(&second), &first, &|_| true).unwrap();
        assert!(cat.nodes["a"].schedulable);

        // Another cluster's view: it serves no pool here, so its nodes (even one named like ours) change
        // nothing, and one it loses is not ours to remove.
        let other: BTreeMap<String, Node> =
            [("a".into(), node(2, false, "default")), ("c".into(), node(4, true, "default"))].into();
        assert_eq!(merge(&cat, Some(&other), &BTreeMap::new(), &|_| false), None);
        assert_eq!(merge(&cat, None, &other, &|p| p != "default"), None);
    }
}
