//! Users' commands on a task: stop, delete, resubmit. What each does to a task in each status is decided in
//! `rules` (pure); this file reads the task, asks, and carries the answer out.

use crate::Control;
use crate::error::CommandError;
use crate::policy::Step;
use crate::rules::{self, DeleteDecision, StopRequest};
use trainyard_core::lifecycle::{Reason, Status};
use trainyard_runtime::Backend;
use trainyard_store::TaskRecord;

impl<B: Backend> Control<B> {
    /// Stops a task: a queued one at once, a running one through Stopping (checkpoint window, then
    /// termination).
    pub async fn stop(&self, task_id: &str, deleting: bool, now_ms: i64) -> Result<TaskRecord, CommandError> {
        let message = if deleting { "deleted by a user" } else { "stopped by a user" };
        self.stop_with(task_id, deleting, message, now_ms).await
    }

    /// [`Self::stop`] with the event's message (`StopRequested` or `Deleted`; the exit checkpoint protocol
    /// runs either way).
    pub(crate) async fn stop_with(
        &self,
        task_id: &str,
        deleting: bool,
        message: &'static str,
        now_ms: i64,
    ) -> Result<TaskRecord, CommandError> {
        let t = self.task(task_id).await?;
        let request = if deleting { StopRequest::Delete } else { StopRequest::Stop };
        let stop = rules::on_stop(t.status, request).map_err(|what| CommandError::WrongState {
            name: t.name.clone(),
            status: t.status.to_string(),
            what,
        })?;
        self.carry_out_stop(&t, stop, message, now_ms).await
    }

    /// A stop decided: the transition committed, then, if something runs, the backend asked to stop it.
    async fn carry_out_stop(
        &self,
        t: &TaskRecord,
        stop: rules::StopDecision,
        message: &'static str,
        now_ms: i64,
    ) -> Result<TaskRecord, CommandError> {
        let updated = self
            .apply(t, Step::new(stop.to, stop.reason, message, t.attempt), now_ms)
            .await?
            .ok_or_else(|| changed_meanwhile(t))?;
        if let Some(cause) = stop.backend_stop {
            self.send_stop(&updated, cause, now_ms).await?;
        }
        Ok(updated)
    }

    /// Deletes a task: whatever runs is stopped first (with the checkpoint notice), then it leaves lists; the
    /// record and history stay, readable by id. Deleting a deleted task again changes nothing.
    pub async fn delete(&self, task_id: &str, now_ms: i64) -> Result<(), CommandError> {
        let t = self.task(task_id).await?;
        match rules::on_delete(t.status, t.deleted) {
            DeleteDecision::Nothing => return Ok(()),
            DeleteDecision::StopThenMark(stop) => {
                match self.carry_out_stop(&t, stop, "deleted by a user", now_ms).await {
                    // Moved on meanwhile (it ended, or another stop came first): deleted all the same.
                    Ok(_) | Err(CommandError::WrongState { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            DeleteDecision::Mark => {}
        }
        self.store.delete_task(&t.id, now_ms).await?;
        Ok(())
    }

    /// Queues an ended task again as a new attempt (a manual resubmission does not spend the retry budget).
    pub async fn resubmit(&self, task_id: &str, now_ms: i64) -> Result<TaskRecord, CommandError> {
        let t = self.task(task_id).await?;
        // (A delete racing this call bumps the version, so the transition below then conflicts.)
        let deleted = self.store.is_deleted(&t.id).await?;
        rules::on_resubmit(t.status, deleted).map_err(|r| CommandError::WrongState {
            name: t.name.clone(),
            status: r.state.map_or_else(|| t.status.to_string(), str::to_owned),
            what: r.what,
        })?;
        self.apply(
            &t,
            Step::new(Status::Queued, Reason::Resubmitted, "resubmitted by a user", t.attempt + 1)
                .clear_placement(),
            now_ms,
        )
        .await?
        .ok_or_else(|| changed_meanwhile(&t))
    }

    /// The task, or `NotFound`.
    async fn task(&self, task_id: &str) -> Result<TaskRecord, CommandError> {
        self.store.get_task(task_id).await?.ok_or_else(|| CommandError::NotFound(task_id.to_owned()))
    }
}

/// A transition that conflicted: the task changed between the read and the write.
fn changed_meanwhile(t: &TaskRecord) -> CommandError {
    CommandError::WrongState {
        name: t.name.clone(),
        status: t.status.to_string(),
        what: "it changed meanwhile; try again",
    }
}
