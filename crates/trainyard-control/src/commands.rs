//! Users' commands on a task: stop (and delete), resubmit.

use crate::Control;
use crate::error::CommandError;
use crate::policy::Step;
use trainyard_core::lifecycle::{Reason, Status};
use trainyard_runtime::{Backend, StopCause};
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
        let t =
            self.store.get_task(task_id).await?.ok_or_else(|| CommandError::NotFound(task_id.to_owned()))?;
        let status = t.status;
        let reason = if deleting { Reason::Deleted } else { Reason::StopRequested };
        let to = match status {
            Status::Queued => Status::Stopped,
            s if s.holds_resources() && s != Status::Stopping => Status::Stopping,
            s => {
                return Err(CommandError::WrongState {
                    name: t.name.clone(),
                    status: s.to_string(),
                    what: "there is nothing to stop",
                });
            }
        };
        let updated =
            self.apply(&t, Step::new(to, reason, message, t.attempt), now_ms).await?.ok_or_else(|| {
                CommandError::WrongState {
                    name: t.name.clone(),
                    status: t.status.to_string(),
                    what: "it changed meanwhile; try again",
                }
            })?;
        if to == Status::Stopping {
            let cause = if deleting { StopCause::Deleted } else { StopCause::UserStop };
            self.send_stop(&updated, cause, now_ms).await?;
        }
        Ok(updated)
    }

    /// Queues an ended task again as a new attempt (a manual resubmission does not spend the retry budget).
    pub async fn resubmit(&self, task_id: &str, now_ms: i64) -> Result<TaskRecord, CommandError> {
        let t =
            self.store.get_task(task_id).await?.ok_or_else(|| CommandError::NotFound(task_id.to_owned()))?;
        let status = t.status;
        // A deleted task is out of every list and view the loop keeps: queued again it would wait forever,
        // unseen. (A delete racing this call bumps the version, so the transition below then conflicts.)
        if self.store.is_deleted(&t.id).await? {
            return Err(CommandError::WrongState {
                name: t.name.clone(),
                status: "deleted".into(),
                what: "a deleted task cannot be resubmitted; clone it to run its spec again",
            });
        }
        if !status.is_terminal() {
            return Err(CommandError::WrongState {
                name: t.name.clone(),
                status: t.status.to_string(),
                what: "only an ended task can be resubmitted",
            });
        }
        self.apply(
            &t,
            Step::new(Status::Queued, Reason::Resubmitted, "resubmitted by a user", t.attempt + 1)
                .clear_placement(),
            now_ms,
        )
        .await?
        .ok_or_else(|| CommandError::WrongState {
            name: t.name.clone(),
            status: t.status.to_string(),
            what: "it changed meanwhile; try again",
        })
    }
}
