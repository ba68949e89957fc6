//! Requests to the backend (launch, stop, rescale) and what a refusal leads to: an event, a wait before the
//! next try (the rules are in `policy`), and for a launch refused too often the attempt's failure, which the
//! retry policy then handles like any infrastructure failure. No refusal is dropped.

use crate::Control;
use crate::active::attempt_key;
use crate::error::CommandError;
use crate::policy::{Call, Retry, Step};
use trainyard_core::lifecycle::{Reason, Status};
use trainyard_runtime::{Backend, BackendError, LaunchSpec, StopCause};
use trainyard_store::TaskRecord;

impl<B: Backend> Control<B> {
    /// Whether a request for the task's current attempt may be sent now.
    pub(crate) fn due(&self, t: &TaskRecord, call: Call, now_ms: i64) -> bool {
        self.requests.due(&attempt_key(t), call, now_ms)
    }

    /// Starts (or starts again) the task's current attempt.
    pub(crate) async fn send_launch(
        &self,
        t: &TaskRecord,
        spec: &LaunchSpec,
        now_ms: i64,
    ) -> Result<(), CommandError> {
        if !self.may_act() {
            return Ok(());
        }
        let result = self.backend.launch(spec).await;
        self.answered(t, Call::Launch, result, now_ms).await
    }

    /// Asks the backend to stop the task's current attempt, for `cause` (kept, so the stop's end is judged by
    /// it and a repeated request says the same).
    pub(crate) async fn send_stop(
        &self,
        t: &TaskRecord,
        cause: StopCause,
        now_ms: i64,
    ) -> Result<(), CommandError> {
        if !self.may_act() {
            // A command on a server that does not lead (or whose term just ended): the stop is stored; the
            // leader's reconciliation asks its backend.
            return Ok(());
        }
        let key = attempt_key(t);
        self.requests.stopping(&key, cause);
        let result = self.backend.stop(&key, cause).await;
        self.answered(t, Call::Stop, result, now_ms).await
    }

    /// Gives the backend the task's new placement (workers added or removed).
    pub(crate) async fn send_scale(
        &self,
        t: &TaskRecord,
        spec: &LaunchSpec,
        now_ms: i64,
    ) -> Result<(), CommandError> {
        if !self.may_act() {
            return Ok(());
        }
        let result = self.backend.scale(spec).await;
        self.answered(t, Call::Scale, result, now_ms).await
    }

    async fn answered(
        &self,
        t: &TaskRecord,
        call: Call,
        result: Result<(), BackendError>,
        now_ms: i64,
    ) -> Result<(), CommandError> {
        let key = attempt_key(t);
        let Err(err) = result else {
            self.requests.accepted(&key, call);
            return Ok(());
        };
        let what = call.as_str();
        match self.requests.refused(&key, call, now_ms) {
            (n, Retry::At { at_ms, tell }) => {
                if tell {
                    let wait_s = (at_ms - now_ms).max(0) as f64 / 1000.0;
                    let why = format!(
                        "the backend refused to {what} attempt {} ({n} in a row): {err}; asking again in {wait_s} s",
                        t.attempt
                    );
                    self.store.append_event(&t.id, t.attempt, now_ms, Reason::BackendError, &why).await?;
                }
                Ok(())
            }
            (n, Retry::GiveUp) => {
                let why = format!(
                    "the backend refused to start attempt {} {n} times in a row; the last time: {err}",
                    t.attempt
                );
                self.fail_launch(t, &why, Reason::LaunchFailed, now_ms).await
            }
        }
    }

    /// Ends an attempt that cannot be started: Failed with `reason`, then the retry policy. Whatever the
    /// backend set up for it is asked to go.
    pub(crate) async fn fail_launch(
        &self,
        t: &TaskRecord,
        why: &str,
        reason: Reason,
        now_ms: i64,
    ) -> Result<(), CommandError> {
        let step = Step::new(Status::Failed, reason, why, t.attempt).clear_placement();
        if self.fail(t, step, reason, now_ms).await?.is_some()
            && self.may_act()
            && let Err(e) = self.backend.stop(&attempt_key(t), StopCause::NodeFailed).await
        {
            let why = format!("could not clear what the backend set up for attempt {}: {e}", t.attempt);
            self.store.append_event(&t.id, t.attempt, now_ms, Reason::BackendError, &why).await?;
        }
        Ok(())
    }
}
