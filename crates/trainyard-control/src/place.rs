//! Between the store's tasks and the scheduler's snapshot: building the snapshot from the catalog and the
//! active tasks, and turning an admission into the placement stored with the task and handed to backends.

use crate::active::Entry;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use trainyard_core::Catalog;
use trainyard_core::demand::Resources;
use trainyard_core::lifecycle::Status;
use trainyard_core::spec::{TaskType, TrainingTask};
use trainyard_runtime::ReplicaPlan;
use trainyard_sched::*;

/// Where an attempt runs, stored with the task while it holds resources.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// Index of the chosen instance-spec option.
    pub option: usize,
    pub replicas: Vec<ReplicaPlan>,
    /// (spec, class, units) as counted against quota.
    pub units: Vec<(String, String, u64)>,
}

impl Placement {
    pub fn from_admission(snap: &Snapshot, task: &TrainingTask, a: &Admission) -> Placement {
        let ray = task.spec.task_type == TaskType::RayJob;
        let mut replicas: Vec<ReplicaPlan> = a
            .placements
            .iter()
            .map(|p| {
                // PyTorchJob: one role, replica 0 is the master. RayJob: role 0 is the head, role 1 the workers.
                let (role, index, rank) = match (ray, p.role) {
                    (false, _) if p.replica == 0 => ("master", 0, 0),
                    (false, _) => ("worker", p.replica - 1, p.replica),
                    (true, 0) => ("head", 0, 0),
                    (true, _) => ("worker", p.replica, p.replica + 1),
                };
                ReplicaPlan {
                    role: role.to_owned(),
                    index,
                    rank,
                    node: snap.nodes[p.node.ix()].name.clone(),
                    resources: p.need,
                }
            })
            .collect();
        replicas.sort_by_key(|r| r.rank);
        let units = a
            .units
            .iter()
            .map(|u| (snap.specs[u.spec.ix()].name.clone(), format!("{:?}", u.class), u.units))
            .collect();
        Placement { option: a.option, replicas, units }
    }

    /// The placement of a task whose cluster admits it itself ([`trainyard_runtime::Backend::admits`]): the
    /// replicas of its first instance-spec option on no node (the cluster's scheduler places them), and their
    /// units as its resource type's, for the views; they count against no quota of Trainyard's. None when the
    /// catalog lacks its spec (validation refused such a task at submission).
    pub fn unplaced(task: &TrainingTask, catalog: &Catalog) -> Option<Placement> {
        let d = trainyard_core::demand::demand(&task.spec, 0, &|n| catalog.instance_specs.get(n)).ok()?;
        let mut replicas = Vec::with_capacity(d.replicas as usize);
        for r in &d.roles {
            for index in 0..r.replicas {
                let rank = replicas.len() as u32;
                replicas.push(ReplicaPlan {
                    role: r.role.as_str().to_owned(),
                    index,
                    rank,
                    node: String::new(),
                    resources: r.per_replica,
                });
            }
        }
        let class = format!("{:?}", task.spec.compute.resource_type);
        let units = d.quota.iter().map(|q| (q.spec.clone(), class.clone(), q.units)).collect();
        Some(Placement { option: 0, replicas, units })
    }

    /// Whether the replicas are on no node: the cluster places them.
    pub fn unplaced_replicas(&self) -> bool {
        self.replicas.iter().all(|r| r.node.is_empty())
    }

    pub fn spec_summary(&self) -> String {
        let parts: Vec<String> = self.units.iter().map(|(s, c, u)| format!("{u} {c} units of {s}")).collect();
        parts.join(", ")
    }
}

fn class_of(name: &str) -> Option<UsageClass> {
    Some(match name {
        "Reserved" => UsageClass::Reserved,
        "Borrowed" => UsageClass::Borrowed,
        "Ondemand" => UsageClass::Ondemand,
        "Spot" => UsageClass::Spot,
        "Idle" => UsageClass::Idle,
        _ => return None,
    })
}

/// Maps snapshot positions back to the tasks they came from.
#[derive(Debug, Default)]
pub struct Index {
    pub pending: Vec<usize>,
    pub running: Vec<usize>,
    /// Pending positions that are autoscaling requests of running RayJobs (more workers), not queued tasks.
    pub scale_ups: std::collections::BTreeSet<usize>,
}

/// Attempt ids of autoscaling requests: the task's position with this bit set, so they never equal the
/// running attempt they grow.
pub const SCALE_UP_BIT: u64 = 1 << 40;

impl Index {
    pub fn name_of(&self, entries: &[&Entry], id: AttemptId) -> String {
        entries.get((id.0 & !SCALE_UP_BIT) as usize).map_or_else(|| format!("{id:?}"), |e| e.name.to_string())
    }
}

impl Placement {
    /// The placement grown by the replicas an autoscaling admission placed (`admission.placements`, all
    /// workers), with their units added.
    pub fn grown(&self, snap: &Snapshot, a: &Admission) -> Placement {
        let mut p = self.clone();
        let first_index =
            p.replicas.iter().filter(|r| r.role == "worker").map(|r| r.index + 1).max().unwrap_or(0);
        let first_rank = p.replicas.iter().map(|r| r.rank + 1).max().unwrap_or(0);
        for (k, pl) in (0u32..).zip(&a.placements) {
            p.replicas.push(ReplicaPlan {
                role: "worker".to_owned(),
                index: first_index + k,
                rank: first_rank + k,
                node: snap.nodes[pl.node.ix()].name.clone(),
                resources: pl.need,
            });
        }
        for u in &a.units {
            let (spec, class) = (snap.specs[u.spec.ix()].name.clone(), format!("{:?}", u.class));
            match p.units.iter_mut().find(|(s, c, _)| *s == spec && *c == class) {
                Some(entry) => entry.2 += u.units,
                None => p.units.push((spec, class, u.units)),
            }
        }
        p
    }

    /// The placement without one worker replica, its units taken back (borrowed or idle ones first).
    pub fn shrunk(&self, replica_index: u32, units_per_worker: u64, spec: &str) -> Placement {
        let mut p = self.clone();
        p.replicas.retain(|r| !(r.role == "worker" && r.index == replica_index));
        let mut left = units_per_worker;
        for class in ["Idle", "Spot", "Borrowed", "Ondemand", "Reserved"] {
            for u in p.units.iter_mut().filter(|(s, c, _)| s == spec && c == class) {
                let take = u.2.min(left);
                u.2 -= take;
                left -= take;
            }
        }
        p.units.retain(|u| u.2 > 0);
        p
    }
}

/// The gang options of each (interned) spec under one catalog, kept from tick to tick: tasks submitted from
/// one template share one spec and so one list of options, and a queued task's options are worked out once.
#[derive(Debug, Default)]
pub struct OptionsCache {
    catalog: Option<Arc<Catalog>>,
    /// By the spec's address; the spec is held so that the address is not reused while cached.
    by_spec: std::collections::HashMap<usize, (Arc<TrainingTask>, Arc<[GangOption]>)>,
    used: std::collections::HashMap<usize, (Arc<TrainingTask>, Arc<[GangOption]>)>,
}

impl OptionsCache {
    /// Starts a snapshot under `catalog`: what the last one used is kept, the rest dropped, and all of it
    /// when the catalog changed.
    fn start(&mut self, catalog: &Arc<Catalog>) {
        let same = self.catalog.as_ref().is_some_and(|c| Arc::ptr_eq(c, catalog));
        self.by_spec = std::mem::take(&mut self.used);
        if !same {
            self.by_spec.clear();
            self.catalog = Some(catalog.clone());
        }
    }

    fn get(&mut self, b: &SnapshotBuilder, task: &Arc<TrainingTask>) -> Option<Arc<[GangOption]>> {
        let key = Arc::as_ptr(task) as usize;
        // Tasks sharing a spec: the first of this snapshot moved it to `used`.
        if let Some((_, options)) = self.used.get(&key) {
            return Some(options.clone());
        }
        let entry = match self.by_spec.remove(&key) {
            Some(e) => e,
            None => (task.clone(), options(b, task)?.into()),
        };
        let options = entry.1.clone();
        self.used.insert(key, entry);
        Some(options)
    }
}

/// The scheduler's view of the catalog and the active tasks. A task whose pool or specs left the catalog is
/// left out (it stays queued).
#[allow(clippy::too_many_arguments)]
pub fn snapshot_for(
    catalog: &Arc<Catalog>,
    entries: &[&Entry],
    cache: &mut OptionsCache,
    nominated: &BTreeMap<String, Vec<String>>,
    scale_wants: &BTreeMap<String, u32>,
    excluded: &BTreeMap<String, std::collections::BTreeSet<String>>,
) -> (Snapshot, Index) {
    cache.start(catalog);
    let mut b = SnapshotBuilder::new();
    for (name, s) in &catalog.instance_specs {
        let per_unit = Resources { gpus: s.gpus.into(), vcpus: s.vcpus.into(), memory_mib: s.memory_mib };
        b.spec(name, s.gpu_model.as_deref(), per_unit);
    }
    for g in catalog.project_groups.keys() {
        b.group(g);
    }
    for p in catalog.pools.keys() {
        b.pool(p);
    }
    let mut node_ix = BTreeMap::new();
    for (name, n) in &catalog.nodes {
        let cap = Resources { gpus: n.gpus.into(), vcpus: n.vcpus.into(), memory_mib: n.memory_mib };
        node_ix.insert(name.clone(), b.node(name, &n.pool, n.gpu_model.as_deref(), cap, n.takes_work()));
    }
    for q in &catalog.quotas {
        if let Some(s) = b.spec_ix(&q.spec) {
            b.quota(&q.group, q.resource_type, &q.pool, s, q.units);
        }
    }
    let mut index = Index::default();
    for (i, e) in entries.iter().enumerate() {
        let (t, task) = (&*e.record, e.spec());
        let id = AttemptId(i as u64);
        let c = &task.spec.compute;
        if !catalog.pools.contains_key(&c.pool) || !catalog.project_groups.contains_key(&t.project_group) {
            continue;
        }
        let (group, pool) = (b.group(&t.project_group), b.pool(&c.pool));
        match t.status {
            Status::Queued => {
                let Some(options) = cache.get(&b, task) else { continue };
                b.pending(PendingAttempt {
                    id,
                    name: e.name.clone(),
                    group,
                    pool,
                    resource_type: c.resource_type,
                    guarantee: c.guarantee,
                    idle_supplement: c.idle_supplement,
                    priority: c.priority,
                    submitted_at_ms: t.created_at_ms.max(0) as u64,
                    options,
                    excluded: excluded
                        .get(&t.id)
                        .map(|ns| ns.iter().filter_map(|n| node_ix.get(n).copied()).collect())
                        .unwrap_or_default(),
                    nominated: nominated
                        .get(&t.id)
                        .map(|ns| ns.iter().filter_map(|n| node_ix.get(n).copied()).collect())
                        .unwrap_or_default(),
                });
                index.pending.push(i);
            }
            _ => {
                let Ok(p) = serde_json::from_str::<Placement>(&t.placement) else { continue };
                let replicas: Option<Vec<Replica>> = p
                    .replicas
                    .iter()
                    .map(|r| node_ix.get(&r.node).map(|&node| Replica { node, need: r.resources }))
                    .collect();
                let units: Option<Vec<UnitUse>> = p
                    .units
                    .iter()
                    .map(|(s, c, u)| Some(UnitUse { spec: b.spec_ix(s)?, class: class_of(c)?, units: *u }))
                    .collect();
                let (Some(replicas), Some(units)) = (replicas, units) else { continue };
                // An autoscaling RayJob that wants more workers: a gang of those workers, through the same
                // quota and placement rules as any task.
                if t.status == Status::Running
                    && let Some(&extra) = scale_wants.get(&t.id)
                    && let Some(choice) = c.instance_specs.get(p.option)
                    && let Some(worker) = b.spec_ix(&choice.spec)
                {
                    b.pending(PendingAttempt {
                        id: AttemptId(SCALE_UP_BIT | i as u64),
                        name: format!("{} (autoscaling)", t.name).into(),
                        group,
                        pool,
                        resource_type: c.resource_type,
                        guarantee: c.guarantee,
                        idle_supplement: c.idle_supplement,
                        priority: c.priority,
                        submitted_at_ms: t.updated_at_ms.max(0) as u64,
                        options: vec![GangOption {
                            roles: vec![Role {
                                spec: worker,
                                count_per_node: choice.count_per_node,
                                replicas: extra,
                            }],
                        }]
                        .into(),
                        excluded: vec![],
                        nominated: vec![],
                    });
                    index.scale_ups.insert(index.pending.len());
                    index.pending.push(i);
                }
                b.running(RunningAttempt {
                    id,
                    name: t.name.clone(),
                    group,
                    pool,
                    resource_type: c.resource_type,
                    priority: c.priority,
                    started_at_ms: t.updated_at_ms.max(0) as u64,
                    stopping: t.status == Status::Stopping,
                    replicas,
                    units,
                });
                index.running.push(i);
            }
        }
    }
    (b.build(), index)
}

/// The gang for each instance-spec option, or `None` if a spec is missing from the catalog.
fn options(b: &SnapshotBuilder, task: &TrainingTask) -> Option<Vec<GangOption>> {
    options_with(&|name| b.spec_ix(name), task)
}

fn options_with(spec_ix: &dyn Fn(&str) -> Option<SpecIx>, task: &TrainingTask) -> Option<Vec<GangOption>> {
    let c = &task.spec.compute;
    let role = |spec: &str, count: u32, replicas: u32| {
        Some(Role { spec: spec_ix(spec)?, count_per_node: count, replicas })
    };
    c.instance_specs
        .iter()
        .map(|choice| {
            let roles = match task.spec.task_type {
                TaskType::PyTorchJob => vec![role(&choice.spec, choice.count_per_node, 1 + c.workers)?],
                TaskType::RayJob => {
                    let head =
                        task.spec.ray.as_ref().and_then(|r| r.head.instance_spec.as_ref()).unwrap_or(choice);
                    let mut roles = vec![role(&head.spec, head.count_per_node, 1)?];
                    if c.workers > 0 {
                        roles.push(role(&choice.spec, choice.count_per_node, c.workers)?);
                    }
                    roles
                }
            };
            Some(GangOption { roles })
        })
        .collect()
}

/// A task not yet submitted as the scheduler would see it in `snap`, for "would it be admitted now?".
/// `None` when its group, pool or specs are not in the snapshot.
pub fn candidate(snap: &Snapshot, task: &TrainingTask, now_ms: u64) -> Option<PendingAttempt> {
    let c = &task.spec.compute;
    let group = snap.groups.iter().position(|g| *g == task.metadata.project_group)?;
    let pool = snap.pools.iter().position(|p| *p == c.pool)?;
    let spec_ix = |name: &str| snap.specs.iter().position(|s| s.name == name).map(|i| SpecIx(i as _));
    Some(PendingAttempt {
        id: AttemptId(u64::MAX),
        name: "this task".into(),
        group: GroupIx(group as _),
        pool: PoolIx(pool as _),
        resource_type: c.resource_type,
        guarantee: c.guarantee,
        idle_supplement: c.idle_supplement,
        priority: c.priority,
        submitted_at_ms: now_ms,
        options: options_with(&spec_ix, task)?.into(),
        excluded: vec![],
        nominated: vec![],
    })
}
