//! Questions the API asks of the scheduler's last view (would it be admitted, how fragmented is the pool,
//! the quota figures), answered without the control loop's lock.

use crate::handles::*;
use crate::place::{self};
use trainyard_core::spec::TrainingTask;
use trainyard_sched::{Config, Decision};

/// Questions answered from the scheduler's view at the last tick, by the scheduler's own code, without the
/// control loop's lock: the API asks them while the user types, whatever the loop is doing.
#[derive(Debug, Clone)]
pub struct SchedViews {
    pub(crate) snapshot: SnapshotBoard,
    pub(crate) config: Config,
    pub(crate) catalog: CatalogHandle,
}

impl SchedViews {
    /// Whether a task would be admitted now, and if not why, from the scheduler's own code over its view at
    /// the last tick (every queued task included: a task behind others waits).
    pub fn would_admit(&self, task: &TrainingTask, now_ms: u64) -> (bool, String) {
        let snap = &*self.snapshot.get();
        let Some(candidate) = place::candidate(snap, task, now_ms) else {
            return (
                false,
                "its project group, pool or instance specs are not in the scheduler's view yet".into(),
            );
        };
        let group = candidate.group;
        match trainyard_sched::views::would_admit(snap, candidate, now_ms, &self.config) {
            Decision::Admit(a) => {
                let nodes: Vec<&str> =
                    a.placements.iter().map(|p| snap.nodes[p.node.ix()].name.as_str()).collect();
                (true, format!("would be admitted now with option {} on {}", a.option + 1, nodes.join(", ")))
            }
            Decision::Wait(w) => {
                let name_of = |id: trainyard_sched::AttemptId| {
                    let pending = snap.pending.iter().find(|p| p.id == id).map(|p| p.name.to_string());
                    pending
                        .or_else(|| snap.running.iter().find(|r| r.id == id).map(|r| r.name.clone()))
                        .unwrap_or_else(|| "another task".to_owned())
                };
                (false, w.reason.describe(snap, group, name_of))
            }
            Decision::Preempt(_) => (false, "would wait".into()),
        }
    }

    /// How fragmented the task's pool is for each of its instance-spec options, from the last tick's view:
    /// how many replicas of that size fit now, on how many nodes, and the free blocks.
    pub fn fragmentation(&self, task: &TrainingTask) -> Vec<(String, trainyard_sched::views::Fragmentation)> {
        let snap = &*self.snapshot.get();
        let Some(pool) = snap.pools.iter().position(|p| *p == task.spec.compute.pool) else {
            return Vec::new();
        };
        task.spec
            .compute
            .instance_specs
            .iter()
            .filter_map(|c| {
                let spec = snap.specs.iter().position(|s| s.name == c.spec)?;
                let f = trainyard_sched::views::fragmentation(
                    snap,
                    trainyard_sched::PoolIx(pool as u16),
                    trainyard_sched::SpecIx(spec as u16),
                    c.count_per_node,
                );
                Some((c.spec.clone(), f))
            })
            .collect()
    }

    /// The running tasks that hold what the queued task `name` waits for, from the last tick's view: those of
    /// its pool that use one of its instance specs, the ones of its own group and resource type first (they
    /// spend its quota), then the others on the pool's nodes, each longest-running first. None when the task
    /// is not queued in that view.
    pub fn holders(&self, name: &str) -> Option<Vec<Holder>> {
        let snap = &*self.snapshot.get();
        let p = snap.pending.iter().find(|p| &*p.name == name)?;
        let specs: std::collections::BTreeSet<_> =
            p.options.iter().flat_map(|o| o.roles.iter().map(|r| r.spec)).collect();
        let mut out: Vec<Holder> = snap
            .running
            .iter()
            .filter(|r| r.pool == p.pool)
            .filter_map(|r| {
                let (units, spec) = r
                    .units
                    .iter()
                    .filter(|u| specs.contains(&u.spec))
                    .fold((0, None), |(n, _), u| (n + u.units, Some(u.spec)));
                Some(Holder {
                    name: r.name.clone(),
                    group: snap.groups[r.group.ix()].clone(),
                    spends_its_quota: r.group == p.group && r.resource_type == p.resource_type,
                    units,
                    spec: snap.specs[spec?.ix()].name.clone(),
                    started_at_ms: r.started_at_ms,
                    stopping: r.stopping,
                })
            })
            .collect();
        out.sort_by_key(|h| (!h.spends_its_quota, h.started_at_ms, h.name.clone()));
        Some(out)
    }

    /// Quota and capacity figures from the scheduler's own view at the last tick, for the groups given (all
    /// when `None`).
    pub fn quota_report(&self, groups: Option<&[String]>) -> Vec<QuotaLine> {
        use trainyard_sched::views;
        let snap = &*self.snapshot.get();
        let catalog = self.catalog.get();
        let ix = |list: &[String], name: &str| list.iter().position(|x| x == name);
        let mut out = Vec::new();
        for q in &catalog.quotas {
            if groups.is_some_and(|g| !g.contains(&q.group)) {
                continue;
            }
            let (Some(g), Some(p), Some(s)) = (
                ix(&snap.groups, &q.group),
                ix(&snap.pools, &q.pool),
                snap.specs.iter().position(|x| x.name == q.spec),
            ) else {
                continue;
            };
            let (g, p, s) = (
                trainyard_sched::GroupIx(g as u16),
                trainyard_sched::PoolIx(p as u16),
                trainyard_sched::SpecIx(s as u16),
            );
            let remaining = views::remaining_quota(snap, g, q.resource_type, p, s);
            out.push(QuotaLine {
                group: q.group.clone(),
                resource_type: q.resource_type.to_string(),
                pool: q.pool.clone(),
                spec: q.spec.clone(),
                limit: q.units,
                remaining: remaining.unwrap_or(q.units),
                pool_available: views::pool_available(snap, p, s),
                idle: views::idle_quantity(snap, p, s),
                unreserved: views::unreserved_available(snap, p, s),
            });
        }
        out
    }
}

/// A running task that holds capacity a queued one could use ([`SchedViews::holders`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub name: String,
    pub group: String,
    /// Of the queued task's group and resource type: its units count against the same quota.
    pub spends_its_quota: bool,
    /// Units of the queued task's instance specs it holds, and the first such spec.
    pub units: u64,
    pub spec: String,
    pub started_at_ms: u64,
    /// Told to stop already: its resources are about to come free.
    pub stopping: bool,
}

/// One quota and the capacity figures of its pool and spec, in spec units.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuotaLine {
    pub group: String,
    pub resource_type: String,
    pub pool: String,
    pub spec: String,
    pub limit: u64,
    pub remaining: u64,
    /// Units the pool's free capacity holds now (a reference, not a reservation).
    pub pool_available: u64,
    /// Reserved by groups and unused now (what Idle tasks may use).
    pub idle: u64,
    /// Not reserved by anyone and not used by Ondemand tasks.
    pub unreserved: u64,
}
