//! What a catalog replacement must not take away: whatever the active tasks (queued, or holding resources
//! from admission to stopping) use. Each such task is checked against the catalog in force and the new one:
//! a problem the new catalog gives it that the old one did not (its project group, region, cluster, pool,
//! instance spec, image, volume, dataset or model gone or no longer offered to it, a quota or a pool that it
//! could never again be admitted under) is a conflict; so is a node that runs replicas now and is gone from
//! the new catalog, moved to another pool, or smaller. `PUT /api/v1/admin/catalog` refuses a catalog with
//! conflicts (409, each listed) unless the admin says `?force=true`.

use crate::error::{ApiResult, CatalogConflict};
use crate::state::AppState;
use std::collections::{BTreeMap, BTreeSet};
use trainyard_core::lifecycle::Status;
use trainyard_core::{Catalog, Code, Severity, TrainingTask};

/// The statuses of an active task: queued, or holding resources.
pub const ACTIVE: &[Status] = &[
    Status::Queued,
    Status::Admitted,
    Status::Starting,
    Status::Prechecking,
    Status::Running,
    Status::Stopping,
];

/// How many task names one conflict lists (it counts them all).
const NAMED_TASKS: usize = 5;
/// Specs read and checked at a time.
const SPECS_PER_READ: usize = 100;

/// Conflicts gathered task by task, each counted once per task.
#[derive(Debug, Default)]
pub struct Conflicts {
    found: BTreeMap<(String, String, String), (u64, Vec<String>)>,
}

impl Conflicts {
    fn add(&mut self, code: &str, path: &str, message: String, task: &str) {
        let (n, names) = self.found.entry((code.to_owned(), path.to_owned(), message)).or_default();
        *n += 1;
        if names.len() < NAMED_TASKS {
            names.push(task.to_owned());
        }
    }

    /// The errors the new catalog gives this task that the old one did not (by path and code: a message may
    /// name catalog entries that changed while the problem stayed the same).
    pub fn check_task(&mut self, name: &str, task: &TrainingTask, old: &Catalog, new: &Catalog) {
        let errors = |c: &Catalog| {
            trainyard_core::validate(task, c).problems.into_iter().filter(|p| p.severity == Severity::Error)
        };
        let before: BTreeSet<(String, Code)> = errors(old).map(|p| (p.path, p.code)).collect();
        for p in errors(new) {
            if !before.contains(&(p.path.clone(), p.code)) {
                self.add(p.code.as_str(), &p.path, p.message, name);
            }
        }
    }

    /// The nodes this task's replicas run on (its stored placement) that the new catalog drops, moves to
    /// another pool or makes smaller.
    pub fn check_placement(&mut self, name: &str, placement: &str, old: &Catalog, new: &Catalog) {
        let Ok(placement) = serde_json::from_str::<serde_json::Value>(placement) else { return };
        let nodes: BTreeSet<&str> = placement["replicas"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["node"].as_str())
            .collect();
        for node in nodes {
            let Some(was) = old.nodes.get(node) else { continue };
            let why = match new.nodes.get(node) {
                None => "is not in the new catalog".to_owned(),
                Some(n) if n.pool != was.pool => format!("moves from pool {} to {}", was.pool, n.pool),
                Some(n) if n.gpu_model != was.gpu_model => "changes its GPU model".to_owned(),
                Some(n) if n.gpus < was.gpus || n.vcpus < was.vcpus || n.memory_mib < was.memory_mib => {
                    format!(
                        "shrinks from {} GPUs, {} vCPUs, {} MiB to {} GPUs, {} vCPUs, {} MiB",
                        was.gpus, was.vcpus, was.memory_mib, n.gpus, n.vcpus, n.memory_mib
                    )
                }
                Some(n) if !was.devices().iter().all(|d| n.devices().contains(d)) => {
                    "no longer hands out every GPU device it did".to_owned()
                }
                Some(_) => continue,
            };
            self.add("node-in-use", "placement", format!("node {node} runs replicas now and {why}"), name);
        }
    }

    /// The conflicts, most tasks first.
    pub fn finish(self) -> Vec<CatalogConflict> {
        let mut out: Vec<CatalogConflict> = self
            .found
            .into_iter()
            .map(|((code, path, message), (tasks, task_names))| CatalogConflict {
                code,
                path,
                message,
                tasks,
                task_names,
            })
            .collect();
        out.sort_by_key(|c| std::cmp::Reverse(c.tasks));
        out
    }
}

/// What replacing `old` with `new` would take away from the active tasks in the store. Tasks deleted while
/// they stop count for their nodes only (their spec will not run again).
pub async fn conflicts(state: &AppState, old: &Catalog, new: &Catalog) -> ApiResult<Vec<CatalogConflict>> {
    let records = state.store.tasks_in_status_without_spec(ACTIVE).await?;
    let mut found = Conflicts::default();
    for t in records.iter().filter(|t| t.status.holds_resources()) {
        found.check_placement(&t.name, &t.placement, old, new);
    }
    let names: BTreeMap<&str, &str> =
        records.iter().filter(|t| !t.deleted).map(|t| (t.id.as_str(), t.name.as_str())).collect();
    let ids: Vec<&str> = names.keys().copied().collect();
    let (old, new) = (std::sync::Arc::new(old.clone()), std::sync::Arc::new(new.clone()));
    for chunk in ids.chunks(SPECS_PER_READ) {
        let specs = state.store.specs_of(chunk).await?;
        let batch: Vec<(String, String)> =
            specs.into_iter().map(|(id, spec)| (names[id.as_str()].to_owned(), spec)).collect();
        // Validation is CPU work: off the async workers.
        let (old, new) = (old.clone(), new.clone());
        found = tokio::task::spawn_blocking(move || {
            for (name, spec) in batch {
                if let Some(task) = trainyard_core::parse(spec.as_bytes()).0 {
                    found.check_task(&name, &task, &old, &new);
                }
            }
            found
        })
        .await
        .map_err(|e| crate::error::ApiError::Internal(format!("checking the catalog: {e}")))?;
    }
    Ok(found.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CATALOG: &str = r#"
regions: {local: {}}
clusters: {local: {region: local}}
pools: {default: {cluster: local, instanceSpecs: [cpu.small]}}
instanceSpecs: {cpu.small: {kind: CPU, vcpus: 1, memoryMib: 1024}}
nodes: {node-0: {pool: default, vcpus: 16, memoryMib: 65536}, node-1: {pool: default, vcpus: 16, memoryMib: 65536}}
projectGroups: {nlp: {}, cv: {}}
images: {host: {torch: true, projectGroups: [nlp, cv]}}
volumes: {ckpt: {projectGroups: [nlp]}}
quotas:
  - {group: nlp, resourceType: Reserved, pool: default, spec: cpu.small, units: 8}
"#;

    const TASK: &str = r#"
apiVersion: trainyard.dev/v1
kind: TrainingTask
metadata: {namePrefix: t, projectGroup: nlp}
spec:
  type: PyTorchJob
  placement: {region: local, cluster: local}
  environment:
    image: host
    cmd: python3 train.py
    volumes: [{volume: ckpt, mountPath: /volume/ckpt}]
  compute: {resourceType: Reserved, pool: default, workers: 1, instanceSpecs: [{spec: cpu.small}]}
"#;

    fn catalog(edit: impl FnOnce(&mut Catalog)) -> Catalog {
        let mut c = Catalog::from_yaml(CATALOG).unwrap();
        edit(&mut c);
        c
    }

    fn task() -> TrainingTask {
        let checked = trainyard_core::check(TASK.as_bytes(), &catalog(|_| {}));
        assert!(checked.report.is_ok(), "{:?}", checked.report.problems);
        checked.task.unwrap()
    }

    fn codes(found: Conflicts) -> Vec<(String, String)> {
        found.finish().into_iter().map(|c| (c.code, c.path)).collect()
    }

    #[test]
    fn what_a_task_uses_may_not_be_taken_away() {
        let (old, t) = (catalog(|_| {}), task());
        let check = |new: Catalog| {
            let mut found = Conflicts::default();
            found.check_task("t-1", &t, &old, &new);
            codes(found)
        };
        let none: Vec<(String, String)> = Vec::new();
        // The same catalog, or one that adds: nothing.
        assert_eq!(check(old.clone()), none);
        assert_eq!(
            check(catalog(|c| drop(c.project_groups.insert("robotics".into(), Default::default())))),
            none
        );
        // Each thing the task uses, taken away.
        let gone = check(catalog(|c| drop(c.project_groups.remove("nlp"))));
        assert!(gone.contains(&("not-found".into(), "metadata.projectGroup".into())), "{gone:?}");
        let gone = check(catalog(|c| drop(c.volumes.remove("ckpt"))));
        assert_eq!(gone, [("not-found".to_owned(), "spec.environment.volumes[0].volume".to_owned())]);
        let narrowed =
            check(catalog(|c| c.volumes.get_mut("ckpt").unwrap().project_groups = vec!["cv".into()]));
        assert_eq!(narrowed, [("not-in-group".to_owned(), "spec.environment.volumes[0].volume".to_owned())]);
        let image = check(catalog(|c| drop(c.images.remove("host"))));
        assert_eq!(image, [("not-found".to_owned(), "spec.environment.image".to_owned())]);
        assert!(!check(catalog(|c| drop(c.pools.remove("default")))).is_empty());
        // No quota left for its group: it could never be admitted.
        let quota = check(catalog(|c| c.quotas.clear()));
        assert_eq!(quota, [("never-fits".to_owned(), "spec.compute.instanceSpecs".to_owned())]);
        // An empty catalog takes everything away.
        assert!(check(Catalog::default()).len() >= 3);
    }

    #[test]
    fn nodes_that_run_replicas_may_not_go_or_shrink() {
        let old = catalog(|_| {});
        let placement = r#"{"option": 0, "replicas": [
            {"role": "master", "index": 0, "rank": 0, "node": "node-0", "resources": {"gpus": 0, "vcpus": 1, "memoryMib": 1024}},
            {"role": "worker", "index": 0, "rank": 1, "node": "node-0", "resources": {"gpus": 0, "vcpus": 1, "memoryMib": 1024}}
        ], "units": []}"#;
        let check = |new: Catalog| {
            let mut found = Conflicts::default();
            found.check_placement("t-1", placement, &old, &new);
            found.check_placement("t-2", placement, &old, &new);
            found.finish()
        };
        assert!(check(old.clone()).is_empty());
        assert!(check(catalog(|c| drop(c.nodes.remove("node-1")))).is_empty(), "node-1 runs nothing");
        assert!(
            check(catalog(|c| c.nodes.get_mut("node-0").unwrap().schedulable = false)).is_empty(),
            "a cordon"
        );
        assert!(check(catalog(|c| c.nodes.get_mut("node-0").unwrap().vcpus = 32)).is_empty(), "it grows");
        let gone = check(catalog(|c| drop(c.nodes.remove("node-0"))));
        assert_eq!(gone.len(), 1, "one conflict for the node, however many replicas: {gone:?}");
        assert_eq!((gone[0].code.as_str(), gone[0].tasks), ("node-in-use", 2));
        assert_eq!(gone[0].task_names, ["t-1", "t-2"]);
        assert!(gone[0].message.contains("node node-0 runs replicas now and is not in the new catalog"));
        let shrunk = check(catalog(|c| c.nodes.get_mut("node-0").unwrap().memory_mib = 1024));
        assert!(shrunk[0].message.contains("shrinks"), "{shrunk:?}");
    }
}
