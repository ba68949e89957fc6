//! Reconciliation: the backend made to match the store.

use crate::Control;
use crate::active::attempt_key;
use crate::error::CommandError;
use crate::place::Placement;
use crate::policy::{self, Call, Step, stop_cause_of};
use trainyard_core::lifecycle::{Reason, Status};
use trainyard_runtime::{Backend, StopCause};
use trainyard_store::TaskRecord;

impl<B: Backend> Control<B> {
    /// Why the task's current attempt is being stopped: as this process asked, or else from the attempt's
    /// events (the last stop request: preemption, a user's stop, deletion, a failed node), read once; a
    /// user's stop when none is recorded.
    pub(crate) async fn recorded_stop_cause(&self, t: &TaskRecord) -> Result<StopCause, CommandError> {
        let key = attempt_key(t);
        if let Some(cause) = self.requests.stop_cause(&key) {
            return Ok(cause);
        }
        let events = self.store.list_events(&t.id, 0, 10_000).await?;
        let cause =
            events.iter().rev().filter(|e| e.attempt == t.attempt).find_map(|e| stop_cause_of(&e.reason));
        let cause = cause.unwrap_or(StopCause::UserStop);
        self.requests.stopping(&key, cause);
        Ok(cause)
    }

    /// Makes the backend match the store: tasks holding resources are launched (again, idempotently), and
    /// stopping ones stopped; lost launches and lost stops are repaired here. A request the backend refused
    /// waits its turn (see `requests`).
    pub(crate) async fn reconcile(&self, tasks: &[&TaskRecord], now_ms: i64) -> Result<(), CommandError> {
        let alive = self.backend.alive().await;
        let catalog = self.catalog.get();
        let failed: std::collections::BTreeSet<&str> =
            catalog.nodes.iter().filter(|(_, n)| n.failed).map(|(name, _)| name.as_str()).collect();
        for &t in tasks {
            let key = attempt_key(t);
            // A node marked failed takes its replicas down with it: the attempt is stopped for NodeFailed (first
            // in the store, so its end requeues it, as for a preemption), then on the backend.
            if !failed.is_empty()
                && matches!(
                    t.status,
                    Status::Admitted | Status::Starting | Status::Prechecking | Status::Running
                )
                && let Ok(p) = serde_json::from_str::<Placement>(&t.placement)
                && let Some(node) = p.replicas.iter().find(|r| failed.contains(r.node.as_str()))
            {
                let why = format!("node {} is marked failed; its replicas are stopped", node.node);
                let step = Step::new(Status::Stopping, Reason::NodeFailed, why, t.attempt);
                if let Some(stopping) = self.apply(t, step, now_ms).await? {
                    self.send_stop(&stopping, StopCause::NodeFailed, now_ms).await?;
                }
                continue;
            }
            match t.status {
                Status::Starting | Status::Prechecking | Status::Running
                    if !alive.contains(&key) && self.due(t, Call::Launch, now_ms) =>
                {
                    if let Ok(p) = serde_json::from_str::<Placement>(&t.placement) {
                        match self.launch_spec(t, &p).await? {
                            Ok(spec) => self.send_launch(t, &spec, now_ms).await?,
                            Err(why) => self.fail_launch(t, &why, Reason::UserError, now_ms).await?,
                        }
                    }
                }
                // Its processes are gone but no end was seen (its launch was lost, or its end was polled by a
                // server that stopped before recording it): the stop is over, and ends as its cause says.
                Status::Stopping if !alive.contains(&key) => {
                    let cause =
                        if t.deleted { StopCause::Deleted } else { self.recorded_stop_cause(t).await? };
                    let step = policy::stop_ended(Some(cause), "its processes are gone", t.attempt);
                    self.apply(t, step, now_ms).await?;
                }
                Status::Stopping if self.due(t, Call::Stop, now_ms) => {
                    // Asked again with the cause it was stopped for (a restarted backend does not know it).
                    let cause = self.recorded_stop_cause(t).await?;
                    self.send_stop(t, cause, now_ms).await?;
                }
                _ => {}
            }
        }
        Ok(())
    }
}
