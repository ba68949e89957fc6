//! Autoscaling RayJobs: workers added when the scheduler admits them, idle ones removed.

use crate::Control;
use crate::error::CommandError;
use crate::place::Placement;
use trainyard_core::lifecycle::Reason;
use trainyard_runtime::Backend;
use trainyard_store::{StoreError, TaskRecord};

impl<B: Backend> Control<B> {
    /// A running task's worker count and, for an autoscaling RayJob, its (min, max) workers.
    pub(crate) fn workers_and_bounds(
        &self,
        t: &TaskRecord,
    ) -> Result<(u32, Option<(u32, u32)>), CommandError> {
        let task = Self::parse(t)?;
        let bounds = task
            .spec
            .ray
            .as_ref()
            .and_then(|r| r.autoscaling.as_ref())
            .filter(|a| a.enabled)
            .map(|a| (a.min_workers, a.max_workers));
        let current = serde_json::from_str::<Placement>(&t.placement)
            .map_or(0, |p| p.replicas.iter().filter(|r| r.role == "worker").count() as u32);
        Ok((current, bounds))
    }

    /// Autoscaling admitted more workers: the placement grows and the backend starts them.
    pub(crate) async fn grow(
        &self,
        t: &TaskRecord,
        snap: &trainyard_sched::Snapshot,
        a: &trainyard_sched::Admission,
        now_ms: i64,
    ) -> Result<(), CommandError> {
        let Ok(p) = serde_json::from_str::<Placement>(&t.placement) else { return Ok(()) };
        let grown = p.grown(snap, a);
        let nodes: Vec<&str> = grown.replicas[p.replicas.len()..].iter().map(|r| r.node.as_str()).collect();
        let message = format!("{} more workers on {}", nodes.len(), nodes.join(", "));
        self.rescale(t, &grown, Reason::ScaledUp, message, now_ms).await
    }

    /// Autoscaling takes an idle worker away: the placement shrinks (its resources are free at once) and the
    /// backend stops it.
    pub(crate) async fn shrink(
        &self,
        t: &TaskRecord,
        replica: &str,
        why: &str,
        now_ms: i64,
    ) -> Result<Option<TaskRecord>, CommandError> {
        let Ok(p) = serde_json::from_str::<Placement>(&t.placement) else { return Ok(Some(t.clone())) };
        let Some(index) = replica.rsplit('-').next().and_then(|i| i.parse::<u32>().ok()) else {
            return Ok(Some(t.clone()));
        };
        let task = Self::parse(t)?;
        let Some(choice) = task.spec.compute.instance_specs.get(p.option) else { return Ok(Some(t.clone())) };
        let Some(worker) = p.replicas.iter().find(|r| r.role == "worker" && r.index == index) else {
            return Ok(Some(t.clone()));
        };
        let spec = self.catalog.get().instance_specs.get(&choice.spec).cloned();
        let units = spec.map_or(u64::from(choice.count_per_node), |s| {
            let per = if s.gpus > 0 { u64::from(s.gpus) } else { u64::from(s.vcpus.max(1)) };
            let need = if s.gpus > 0 { worker.resources.gpus } else { worker.resources.vcpus };
            need.div_ceil(per).max(1)
        });
        let shrunk = p.shrunk(index, units, &choice.spec);
        self.rescale(t, &shrunk, Reason::ScaledDown, format!("{why}; {replica} removed"), now_ms).await?;
        Ok(Some(t.clone()))
    }

    pub(crate) async fn rescale(
        &self,
        t: &TaskRecord,
        placement: &Placement,
        reason: Reason,
        message: String,
        now_ms: i64,
    ) -> Result<(), CommandError> {
        let json = serde_json::to_string(placement).expect("a placement always serialises");
        let change = trainyard_store::Transition {
            task_id: t.id.clone(),
            expected_version: t.version,
            status: t.status,
            attempt: t.attempt,
            at_ms: now_ms,
            reason,
            message,
            placement: Some(json),
            retries: None,
        };
        match self.store.transition(&change).await {
            Ok(updated) => {
                match self.launch_spec(&updated, placement).await? {
                    Ok(spec) => self.send_scale(&updated, &spec, now_ms).await?,
                    Err(why) => {
                        let why = format!("the new workers cannot be started: {why}");
                        self.store
                            .append_event(&t.id, t.attempt, now_ms, Reason::InternalError, &why)
                            .await?;
                    }
                }
                Ok(())
            }
            Err(StoreError::VersionConflict { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
