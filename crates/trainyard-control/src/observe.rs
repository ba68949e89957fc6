//! What the backend reports turned into lifecycle transitions, and the retry policy after a failure.

use crate::Control;
use crate::apply::*;
use crate::error::CommandError;
use trainyard_core::lifecycle::{FailureClass, Reason, Status, failure_class};
use trainyard_runtime::{Backend, Observation, StopCause};
use trainyard_store::TaskRecord;

impl<B: Backend> Control<B> {
    /// Turns one observation into transitions. Returns false when a concurrent change won.
    pub(crate) async fn observe(&mut self, obs: &Observation, now_ms: i64) -> Result<bool, CommandError> {
        let key = obs.key();
        let Some(t) = self.store.get_task(&key.task_id).await? else { return Ok(true) };
        if t.attempt != key.attempt {
            // A report about an older attempt: already handled.
            return Ok(true);
        }
        let status = Status::from_name(&t.status)
            .ok_or_else(|| CommandError::Corrupt(t.id.clone(), t.status.clone()))?;
        let done = match (obs, status) {
            (Observation::Started { precheck: true, .. }, Status::Starting) => {
                self.apply(
                    &t,
                    Step::new(
                        Status::Prechecking,
                        Reason::PrecheckStarted,
                        "running the resource precheck",
                        t.attempt,
                    ),
                    now_ms,
                )
                .await?
            }
            (Observation::Started { precheck: false, .. }, Status::Starting) => {
                self.apply(
                    &t,
                    Step::new(Status::Running, Reason::Started, "every replica started", t.attempt),
                    now_ms,
                )
                .await?
            }
            (Observation::PrecheckPassed { message, .. }, Status::Prechecking) => {
                self.apply(
                    &t,
                    Step::new(Status::Running, Reason::PrecheckPassed, message.clone(), t.attempt),
                    now_ms,
                )
                .await?
            }
            (Observation::Finished { reason: Reason::Completed, message, .. }, Status::Running) => {
                self.apply(
                    &t,
                    Step::new(Status::Succeeded, Reason::Completed, message.clone(), t.attempt),
                    now_ms,
                )
                .await?
            }
            (Observation::Finished { reason, message, .. }, s)
                if s.holds_resources() && s != Status::Stopping =>
            {
                let Some(failed) = self
                    .apply(
                        &t,
                        Step::new(Status::Failed, *reason, message.clone(), t.attempt).clear_placement(),
                        now_ms,
                    )
                    .await?
                else {
                    return Ok(false);
                };
                self.maybe_retry(&failed, *reason, now_ms).await?;
                Some(failed)
            }
            (Observation::Stopped { cause, message, .. }, Status::Stopping) => {
                // Preempted attempts go back to the queue without spending the retry budget, and so do those a
                // failed node took down. The backend says why it stopped; a stop recorded before backends kept
                // the cause is read from the attempt's events.
                let cause = match cause {
                    Some(c) => *c,
                    None => self.recorded_stop_cause(&t).await?,
                };
                if matches!(cause, StopCause::Preempted | StopCause::NodeFailed) {
                    self.apply(
                        &t,
                        Step::new(
                            Status::Queued,
                            Reason::Requeued,
                            format!("{message}; back in the queue"),
                            t.attempt + 1,
                        )
                        .clear_placement(),
                        now_ms,
                    )
                    .await?
                } else {
                    self.apply(
                        &t,
                        Step::new(Status::Stopped, Reason::Terminated, message.clone(), t.attempt)
                            .clear_placement(),
                        now_ms,
                    )
                    .await?
                }
            }
            (Observation::Note { reason, message, .. }, _) => {
                self.store.append_event(&t.id, t.attempt, now_ms, reason, message).await?;
                Some(t.clone())
            }
            (Observation::NodeSuspect { node, message, .. }, _) => {
                let task = Self::parse(&t)?;
                let replace = task.spec.advanced.fault_tolerance.as_ref().is_none_or(|f| f.node_replacement);
                let what = if replace {
                    // Kept in the store first, so a restarted loop still leaves the node out.
                    self.store.avoid_node(&t.id, node, now_ms).await?;
                    self.excluded.entry(t.id.clone()).or_default().insert(node.clone());
                    self.dirty = true;
                    format!("{message}; the next attempts of this task leave it out")
                } else {
                    format!("{message}; node replacement is off, so it may be used again")
                };
                self.store.append_event(&t.id, t.attempt, now_ms, "NodeSuspect", &what).await?;
                Some(t.clone())
            }
            (Observation::ScaleUp { workers, message, .. }, Status::Running) => {
                let (current, bounds) = self.workers_and_bounds(&t)?;
                if let Some((_, max)) = bounds {
                    let extra = (*workers).min(max.saturating_sub(current));
                    if extra > 0 && self.scale_wants.get(&t.id) != Some(&extra) {
                        let why = format!(
                            "{message}; asking for {extra} more workers ({current} of at most {max})"
                        );
                        self.store.append_event(&t.id, t.attempt, now_ms, "ScaleUpRequested", &why).await?;
                    }
                    if extra > 0 {
                        self.scale_wants.insert(t.id.clone(), extra);
                        self.dirty = true;
                    }
                }
                Some(t.clone())
            }
            (Observation::ScaleDown { replica, message, .. }, Status::Running) => {
                let (current, bounds) = self.workers_and_bounds(&t)?;
                match bounds {
                    Some((min, _)) if current > min => self.shrink(&t, replica, message, now_ms).await?,
                    _ => Some(t.clone()),
                }
            }
            // Anything else is stale (the task moved on); nothing to do.
            _ => Some(t.clone()),
        };
        Ok(done.is_some())
    }

    /// After a failure: requeue infrastructure failures within the task's budget, and raise the alarms.
    pub(crate) async fn maybe_retry(
        &self,
        t: &TaskRecord,
        reason: Reason,
        now_ms: i64,
    ) -> Result<(), CommandError> {
        use trainyard_core::spec::AlarmEvent;
        let task = Self::parse(t)?;
        let budget = task
            .spec
            .advanced
            .fault_tolerance
            .as_ref()
            .filter(|f| f.enabled)
            .map_or(0, |f| f.max_resubmissions);
        if reason == Reason::PrecheckFailed {
            self.raise(t, AlarmEvent::PrecheckFailed, "the resource precheck failed", now_ms).await?;
        }
        if failure_class(reason) == FailureClass::Infrastructure && t.retries < i64::from(budget) {
            let message = format!("automatic resubmission {} of {budget} after {reason}", t.retries + 1);
            let step = Step::new(Status::Queued, Reason::Requeued, message.clone(), t.attempt + 1)
                .retries(t.retries + 1);
            if let Some(requeued) = self.apply(t, step, now_ms).await? {
                self.raise(&requeued, AlarmEvent::Resubmitted, &message, now_ms).await?;
                if reason == Reason::NodeFailed {
                    self.raise(
                        &requeued,
                        AlarmEvent::NodeReplaced,
                        "the failed node is left out of the next attempt",
                        now_ms,
                    )
                    .await?;
                }
            }
        } else {
            if failure_class(reason) == FailureClass::Infrastructure {
                let why = format!("no automatic resubmission left ({budget} allowed)");
                self.store
                    .append_event(&t.id, t.attempt, now_ms, Reason::RetryBudgetSpent.as_str(), &why)
                    .await?;
            }
            self.raise(t, AlarmEvent::Failed, &format!("failed: {reason}"), now_ms).await?;
        }
        Ok(())
    }
}
