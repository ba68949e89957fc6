//! Lifecycle transitions committed to the store: each checked against the lifecycle first, alarms raised
//! for what they mean.

use crate::active::*;
use crate::error::CommandError;
use crate::policy::Step;
use crate::{Control, alarms};
use std::sync::Arc;
use trainyard_core::lifecycle::{Reason, transition};
use trainyard_core::spec::TrainingTask;
use trainyard_runtime::Backend;
use trainyard_store::{StoreError, TaskRecord, Transition};

impl<B: Backend> Control<B> {
    /// Applies one checked transition. `Ok(None)` when a concurrent change won (the next tick retries).
    pub(crate) async fn apply(
        &self,
        t: &TaskRecord,
        step: Step,
        now_ms: i64,
    ) -> Result<Option<TaskRecord>, StoreError> {
        let Step { to, reason, message, attempt, placement, retries } = step;
        let from = t.status;
        if let Err(e) = transition(from, to, reason) {
            // The control loop only asks for legal transitions; reaching this is a bug, recorded, not applied.
            self.store.append_event(&t.id, t.attempt, now_ms, Reason::InternalError, &e.to_string()).await?;
            return Ok(None);
        }
        let change = Transition {
            task_id: t.id.clone(),
            expected_version: t.version,
            status: to,
            attempt,
            at_ms: now_ms,
            reason,
            message,
            placement,
            retries,
        };
        let message = change.message.clone();
        match self.store.transition(&change).await {
            Ok(r) => {
                for &event in alarms::events_for(to, reason) {
                    self.raise(&r, event, &message, now_ms).await?;
                }
                Ok(Some(r))
            }
            Err(StoreError::VersionConflict { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Applies chains of checked transitions, several tasks at once, in one transaction: each task's steps
    /// in order. A task's answer is its record after its last step, or `None` when a concurrent change won
    /// (its steps then wrote nothing: the transaction runs them back to back on the row it locked).
    pub(crate) async fn apply_chains(
        &self,
        chains: &[(&TaskRecord, Vec<Step>)],
        now_ms: i64,
    ) -> Result<Vec<Option<TaskRecord>>, StoreError> {
        let mut changes = Vec::new();
        let mut spans = Vec::with_capacity(chains.len());
        for (t, steps) in chains {
            let mut from = t.status;
            let mut illegal = None;
            for step in steps {
                if let Err(e) = transition(from, step.to, step.reason) {
                    illegal = Some(e);
                    break;
                }
                from = step.to;
            }
            if let Some(e) = illegal {
                // The control loop only asks for legal transitions; reaching this is a bug, recorded.
                self.store
                    .append_event(&t.id, t.attempt, now_ms, Reason::InternalError, &e.to_string())
                    .await?;
                spans.push(None);
                continue;
            }
            let first = changes.len();
            for (k, step) in (0i64..).zip(steps) {
                changes.push(Transition {
                    task_id: t.id.clone(),
                    expected_version: t.version + k,
                    status: step.to,
                    attempt: step.attempt,
                    at_ms: now_ms,
                    reason: step.reason,
                    message: step.message.clone(),
                    placement: step.placement.clone(),
                    retries: step.retries,
                });
            }
            spans.push(Some(first..changes.len()));
        }
        let answers = self.store.transitions(&changes).await?;
        let mut out = Vec::with_capacity(chains.len());
        for ((_, steps), span) in chains.iter().zip(spans) {
            let Some(span) = span else {
                out.push(None);
                continue;
            };
            let mut last = None;
            for (step, answer) in steps.iter().zip(&answers[span]) {
                match answer {
                    Ok(r) => {
                        for &event in alarms::events_for(step.to, step.reason) {
                            self.raise(r, event, &step.message, now_ms).await?;
                        }
                        last = Some(r.clone());
                    }
                    Err(StoreError::VersionConflict { .. } | StoreError::NotFound(_)) => {
                        last = None;
                        break;
                    }
                    Err(e) => return Err(StoreError::Corrupt(e.to_string())),
                }
            }
            out.push(last);
        }
        Ok(out)
    }

    /// Queues an alarm event for the task's subscriptions.
    pub(crate) async fn raise(
        &self,
        t: &TaskRecord,
        event: trainyard_core::spec::AlarmEvent,
        message: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let Some(task) = self.spec_of(t).await? else { return Ok(()) };
        alarms::raise(&self.store, &task, t, event, message, now_ms).await
    }

    /// The task's spec: the working set's, else read from the store. `None` when it cannot be read.
    pub(crate) async fn spec_of(&self, t: &TaskRecord) -> Result<Option<Arc<TrainingTask>>, StoreError> {
        if let Some(task) = self.active.get(&active_key(t)).and_then(|e| e.spec.clone()) {
            return Ok(Some(task));
        }
        if !t.spec_json.is_empty() {
            return Ok(Self::parse(t).ok().map(Arc::new));
        }
        Ok(self.store.get_task(&t.id).await?.and_then(|full| Self::parse(&full).ok()).map(Arc::new))
    }

    pub(crate) fn parse(t: &TaskRecord) -> Result<TrainingTask, CommandError> {
        let (task, d) = trainyard_core::parse(t.spec_json.as_bytes());
        match task {
            Some(task) if d.report.is_ok() => Ok(task),
            _ => Err(CommandError::Corrupt(t.id.clone(), format!("{:?}", d.report.problems))),
        }
    }
}
