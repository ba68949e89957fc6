//! What the backend reports, turned into lifecycle transitions and events by the rules in `policy`, and the
//! retry policy applied after a failure.

use crate::Control;
use crate::error::CommandError;
use crate::policy::{self, AfterFailure, Change, Step};
use trainyard_core::lifecycle::{Reason, Status};
use trainyard_runtime::{Backend, Observation};
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
        let status = t.status;
        match obs {
            Observation::Waiting { message, .. } => {
                if matches!(status, Status::Admitted | Status::Starting | Status::Prechecking) {
                    self.starts.set(&t.id, t.attempt, message, now_ms);
                }
                return Ok(true);
            }
            Observation::Started { .. } | Observation::Finished { .. } | Observation::Stopped { .. } => {
                self.starts.clear(&t.id);
            }
            _ => {}
        }
        let cause = if policy::needs_stop_cause(status, obs) {
            Some(self.recorded_stop_cause(&t).await?)
        } else {
            None
        };
        match policy::on_observation(status, t.attempt, obs, cause, t.deleted) {
            Change::Step { step, failed: Some(reason) } => {
                return Ok(self.fail(&t, step, reason, now_ms).await?.is_some());
            }
            Change::Step { step, failed: None } => {
                let Some(changed) = self.apply(&t, step, now_ms).await? else { return Ok(false) };
                // A completed attempt whose start is recorded only now: its end follows at once.
                if let (Observation::Finished { .. }, Status::Running) = (obs, changed.status)
                    && let Change::Step { step, failed: None } =
                        policy::on_observation(changed.status, changed.attempt, obs, None, changed.deleted)
                {
                    return Ok(self.apply(&changed, step, now_ms).await?.is_some());
                }
                return Ok(true);
            }
            Change::Stop { step, cause } => {
                let Some(changed) = self.apply(&t, step, now_ms).await? else { return Ok(false) };
                self.send_stop(&changed, cause, now_ms).await?;
                return Ok(true);
            }
            Change::None => {}
        }
        let done = match (obs, status) {
            (Observation::Note { reason, message, .. }, _) => {
                self.store.append_event(&t.id, t.attempt, now_ms, *reason, message).await?;
                Some(t.clone())
            }
            (Observation::NodeSuspect { node, message, .. }, _) => {
                let task = Self::parse(&t)?;
                let replace = task.spec.advanced.fault_tolerance.as_ref().is_none_or(|f| f.node_replacement);
                let what = if replace {
                    // Kept in the store first, so a restarted loop still leaves the node out.
                    self.store.avoid_node(&t.id, node, now_ms).await?;
                    self.excluded.entry(t.id.clone()).or_default().insert(node.clone());
                    self.changed();
                    format!("{message}; the next attempts of this task leave it out")
                } else {
                    format!("{message}; node replacement is off, so it may be used again")
                };
                self.store.append_event(&t.id, t.attempt, now_ms, Reason::NodeSuspect, &what).await?;
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
                        self.store
                            .append_event(&t.id, t.attempt, now_ms, Reason::ScaleUpRequested, &why)
                            .await?;
                    }
                    if extra > 0 {
                        self.scale_wants.insert(t.id.clone(), extra);
                        self.changed();
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

    /// Ends the attempt with `failed` (a step to Failed for `reason`), then the retry policy: an
    /// infrastructure failure within the task's budget is queued again as the next attempt in the same
    /// transaction (a crash or a lost store between the two cannot leave it Failed with a resubmission owed),
    /// and the alarms are raised. `Ok(None)` when a concurrent change won.
    pub(crate) async fn fail(
        &self,
        t: &TaskRecord,
        failed: Step,
        reason: Reason,
        now_ms: i64,
    ) -> Result<Option<TaskRecord>, CommandError> {
        use trainyard_core::spec::AlarmEvent;
        // A stored spec that cannot be read has no budget to spend: the attempt still ends.
        let budget = self.spec_of(t).await?.map_or(0, |task| {
            task.spec
                .advanced
                .fault_tolerance
                .as_ref()
                .filter(|f| f.enabled)
                .map_or(0, |f| f.max_resubmissions)
        });
        let after = policy::after_failure(reason, t.attempt, t.retries, budget);
        let ended = match &after {
            AfterFailure::Requeue(requeue) => {
                let chain = [(t, vec![failed, requeue.clone()])];
                self.apply_chains(&chain, now_ms).await?.pop().flatten()
            }
            _ => self.apply(t, failed, now_ms).await?,
        };
        let Some(ended) = ended else { return Ok(None) };
        if reason == Reason::PrecheckFailed {
            self.raise(&ended, AlarmEvent::PrecheckFailed, "the resource precheck failed", now_ms).await?;
        }
        match after {
            AfterFailure::Requeue(requeue) => {
                self.raise(&ended, AlarmEvent::Resubmitted, &requeue.message, now_ms).await?;
                if reason == Reason::NodeFailed {
                    self.raise(
                        &ended,
                        AlarmEvent::NodeReplaced,
                        "the failed node is left out of the next attempt",
                        now_ms,
                    )
                    .await?;
                }
            }
            end => {
                if let AfterFailure::BudgetSpent(why) = end {
                    let event =
                        self.store.append_event(&t.id, t.attempt, now_ms, Reason::RetryBudgetSpent, &why);
                    event.await?;
                }
                self.raise(&ended, AlarmEvent::Failed, &format!("failed: {reason}"), now_ms).await?;
            }
        }
        Ok(Some(ended))
    }
}
