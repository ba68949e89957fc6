//! Reconciliation: the backend made to match the store.

use crate::Control;
use crate::error::CommandError;
use crate::place::Placement;
use std::sync::Arc;
use trainyard_runtime::{AttemptKey, Backend, StopCause};
use trainyard_store::TaskRecord;

impl<B: Backend> Control<B> {
    pub(crate) async fn recorded_stop_cause(&self, t: &TaskRecord) -> Result<StopCause, CommandError> {
        let events = self.store.list_events(&t.id, 0, 10_000).await?;
        let cause =
            events.iter().rev().filter(|e| e.attempt == t.attempt).find_map(|e| match e.reason.as_str() {
                "Preempted" => Some(StopCause::Preempted),
                "StopRequested" => Some(StopCause::UserStop),
                "Deleted" => Some(StopCause::Deleted),
                "NodeFailed" => Some(StopCause::NodeFailed),
                _ => None,
            });
        Ok(cause.unwrap_or(StopCause::UserStop))
    }

    /// Makes the backend match the store: tasks holding resources are launched (again, idempotently), and
    /// stopping ones stopped; lost launches and lost stops are repaired here.
    /// Why the task's current attempt is being stopped, from its events (the last stop request of the
    /// attempt: preemption, a user's stop, deletion, a failed node); a user's stop when none is recorded.
    pub(crate) async fn reconcile(&self, tasks: &[Arc<TaskRecord>]) {
        let alive = self.backend.alive().await;
        let catalog = self.catalog.get();
        let failed: std::collections::BTreeSet<&str> =
            catalog.nodes.iter().filter(|(_, n)| n.failed).map(|(name, _)| name.as_str()).collect();
        for t in tasks {
            if t.status == "Queued" {
                continue;
            }
            let key = AttemptKey { task_id: t.id.clone(), attempt: t.attempt };
            // A node marked failed takes its replicas down with it: the attempt fails as NodeFailed and the
            // fault-tolerance path decides what comes next.
            if !failed.is_empty()
                && matches!(t.status.as_str(), "Starting" | "Prechecking" | "Running")
                && let Ok(p) = serde_json::from_str::<Placement>(&t.placement)
                && p.replicas.iter().any(|r| failed.contains(r.node.as_str()))
            {
                let _ = self.backend.stop(&key, StopCause::NodeFailed).await;
                continue;
            }
            match t.status.as_str() {
                "Starting" | "Prechecking" | "Running" if !alive.contains(&key) => {
                    if let Ok(p) = serde_json::from_str::<Placement>(&t.placement)
                        && let Some(spec) = self.launch_spec(t, &p).await
                    {
                        let _ = self.backend.launch(&spec).await;
                    }
                }
                "Stopping" => {
                    // Asked again with the cause it was stopped for (a restarted backend does not know it).
                    if let Ok(cause) = self.recorded_stop_cause(t).await {
                        let _ = self.backend.stop(&key, cause).await;
                    }
                }
                _ => {}
            }
        }
    }
}
