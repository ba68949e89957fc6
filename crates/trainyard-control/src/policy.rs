//! The control loop's decisions as pure functions: what an observation of an attempt does to its task's
//! status, what follows a failure (a retry within the budget or the end), and how a backend that refused a
//! request is asked again. No IO here: callers read what these need, call them, and write what they answer,
//! so every rule is tested alone (below) and the simulation checks them together.

use trainyard_core::lifecycle::{FailureClass, Reason, Status, failure_class};
use trainyard_runtime::{AttemptKey, Observation, StopCause};

/// One lifecycle transition to apply, with what changes along with the status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Step {
    pub(crate) to: Status,
    pub(crate) reason: Reason,
    pub(crate) message: String,
    pub(crate) attempt: i64,
    /// `Some("")` clears the placement; `None` keeps it.
    pub(crate) placement: Option<String>,
    pub(crate) retries: Option<i64>,
}

impl Step {
    /// A transition that changes only status, reason, message and attempt.
    pub(crate) fn new(to: Status, reason: Reason, message: impl Into<String>, attempt: i64) -> Step {
        Step { to, reason, message: message.into(), attempt, placement: None, retries: None }
    }

    pub(crate) fn placement(mut self, json: String) -> Step {
        self.placement = Some(json);
        self
    }

    /// The attempt no longer runs anywhere.
    pub(crate) fn clear_placement(mut self) -> Step {
        self.placement = Some(String::new());
        self
    }

    pub(crate) fn retries(mut self, n: i64) -> Step {
        self.retries = Some(n);
        self
    }
}

/// What an observation of the task's current attempt changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// A transition; `failed` when it ends the attempt in failure (the retry policy runs after it commits).
    Step { step: Step, failed: Option<Reason> },
    /// A transition to `Stopping`, then a stop of the attempt for `cause`: the backend's cluster preempted it
    /// (Kueue evicted its job), and it goes the way of Trainyard's own preemptions.
    Stop { step: Step, cause: StopCause },
    /// Nothing: the observation is informative, or stale (the task moved on).
    None,
}

/// The status change an observation of the current attempt leads to, from the task's status. `cause` is why
/// a stopping attempt was stopped when the observation does not say (read from its events by the caller);
/// a deleted task's stop ends it whatever the stop was for (a deleted task is never queued again).
pub(crate) fn on_observation(
    status: Status,
    attempt: i64,
    obs: &Observation,
    cause: Option<StopCause>,
    deleted: bool,
) -> Change {
    let step = |step: Step| Change::Step { step, failed: None };
    let deleted_or = |cause: Option<StopCause>| if deleted { Some(StopCause::Deleted) } else { cause };
    match (obs, status) {
        (Observation::Started { precheck: true, .. }, Status::Starting) => step(Step::new(
            Status::Prechecking,
            Reason::PrecheckStarted,
            "running the resource precheck",
            attempt,
        )),
        (Observation::Started { precheck: false, .. }, Status::Starting) => {
            step(Step::new(Status::Running, Reason::Started, "every replica started", attempt))
        }
        (Observation::PrecheckPassed { message, .. }, Status::Prechecking) => {
            step(Step::new(Status::Running, Reason::PrecheckPassed, message.clone(), attempt))
        }
        (Observation::Finished { reason: Reason::Completed, message, .. }, Status::Running) => {
            step(Step::new(Status::Succeeded, Reason::Completed, message.clone(), attempt))
        }
        // An attempt that completed was running: a start not seen before its end (a report the store could
        // not take, replicas quicker than a look) is recorded first, and the end follows (see `observe`).
        (Observation::Finished { reason: Reason::Completed, .. }, Status::Starting) => step(Step::new(
            Status::Running,
            Reason::Started,
            "every replica started (seen as the attempt ended)",
            attempt,
        )),
        (Observation::Finished { reason: Reason::Completed, .. }, Status::Prechecking) => step(Step::new(
            Status::Running,
            Reason::PrecheckPassed,
            "the resource precheck passed (seen as the attempt ended)",
            attempt,
        )),
        // Preempted by the cluster (Kueue's eviction): through Stopping, back to the queue, as a preemption
        // Trainyard decided, at no cost to the retry budget.
        (Observation::Finished { reason: Reason::Preempted, message, .. }, s)
            if s.holds_resources() && s != Status::Stopping =>
        {
            Change::Stop {
                step: Step::new(Status::Stopping, Reason::Preempted, message.clone(), attempt),
                cause: StopCause::Preempted,
            }
        }
        (Observation::Finished { reason, message, .. }, s)
            if s.holds_resources() && s != Status::Stopping =>
        {
            Change::Step {
                step: Step::new(Status::Failed, *reason, message.clone(), attempt).clear_placement(),
                failed: Some(*reason),
            }
        }
        (Observation::Stopped { cause: told, message, .. }, Status::Stopping) => {
            step(stop_ended(deleted_or(told.or(cause)), message, attempt))
        }
        // An attempt that ended by itself while it was being stopped is stopped all the same: the stop's cause
        // decides what follows.
        (Observation::Finished { message, .. }, Status::Stopping) => {
            step(stop_ended(deleted_or(cause), message, attempt))
        }
        _ => Change::None,
    }
}

/// The end of a stop: preempted attempts go back to the queue without spending the retry budget, and so do
/// those a failed node took down; the others end as Stopped.
pub(crate) fn stop_ended(cause: Option<StopCause>, message: &str, attempt: i64) -> Step {
    match cause {
        Some(StopCause::Preempted | StopCause::NodeFailed) => {
            Step::new(Status::Queued, Reason::Requeued, format!("{message}; back in the queue"), attempt + 1)
                .clear_placement()
        }
        _ => Step::new(Status::Stopped, Reason::Terminated, message, attempt).clear_placement(),
    }
}

/// Whether an observation needs the recorded stop cause to be decided (the end of a stop that does not say
/// why it was asked).
pub(crate) fn needs_stop_cause(status: Status, obs: &Observation) -> bool {
    matches!(
        (obs, status),
        (Observation::Stopped { cause: None, .. } | Observation::Finished { .. }, Status::Stopping)
    )
}

/// The stop cause an event records, if it is a stop request.
pub(crate) fn stop_cause_of(reason: &str) -> Option<StopCause> {
    match Reason::from_name(reason)? {
        Reason::Preempted => Some(StopCause::Preempted),
        Reason::StopRequested => Some(StopCause::UserStop),
        Reason::Deleted => Some(StopCause::Deleted),
        Reason::NodeFailed => Some(StopCause::NodeFailed),
        _ => None,
    }
}

/// What follows a failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AfterFailure {
    /// Queued again as the next attempt, spending one automatic resubmission.
    Requeue(Step),
    /// An infrastructure failure with no resubmission left: the task stays Failed, and says why.
    BudgetSpent(String),
    /// A failure of the task's own (its code, its memory): it stays Failed.
    Ends,
}

/// The retry policy: infrastructure failures are resubmitted while the task's budget lasts; user errors end.
pub(crate) fn after_failure(reason: Reason, attempt: i64, retries: i64, budget: u32) -> AfterFailure {
    if failure_class(reason) != FailureClass::Infrastructure {
        return AfterFailure::Ends;
    }
    if retries < i64::from(budget) {
        let message = format!("automatic resubmission {} of {budget} after {reason}", retries + 1);
        AfterFailure::Requeue(
            Step::new(Status::Queued, Reason::Requeued, message, attempt + 1).retries(retries + 1),
        )
    } else {
        AfterFailure::BudgetSpent(format!("no automatic resubmission left ({budget} allowed)"))
    }
}

/// Which request a backend refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Call {
    Launch,
    Stop,
    Scale,
}

impl Call {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Call::Launch => "start",
            Call::Stop => "stop",
            Call::Scale => "rescale",
        }
    }
}

/// Launch refusals an attempt survives; the next one fails it as `LaunchFailed` (an infrastructure failure,
/// so the retry policy may queue it again, elsewhere).
pub(crate) const LAUNCH_TRIES: u32 = 5;
/// The longest wait between two tries of one request.
const MAX_BACKOFF_MS: i64 = 60_000;

/// What to do after a backend refused a request for the `tries`-th time in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Ask again at this time; `tell` when this refusal is worth an event (the first, then each time the wait
    /// doubles: a backend that stays down writes a handful of events, not one a tick).
    At { at_ms: i64, tell: bool },
    /// Stop asking: the attempt fails.
    GiveUp,
}

pub(crate) fn after_refusal(call: Call, tries: u32, now_ms: i64) -> Retry {
    if call == Call::Launch && tries >= LAUNCH_TRIES {
        return Retry::GiveUp;
    }
    let wait = (1_000i64 << (tries.saturating_sub(1)).min(16)).min(MAX_BACKOFF_MS);
    Retry::At { at_ms: now_ms + wait, tell: tries.is_power_of_two() }
}

/// What the loop remembers of its requests to the backend: refusals (how many in a row, when to ask again)
/// and why each stopping attempt is being stopped (so a repeated stop says the same, and a stop's end is
/// judged without reading the task's events back). Memory only: after a restart the counts start again and
/// the causes are read back from the events, once per attempt.
#[derive(Debug, Default)]
pub(crate) struct Requests {
    refusals: std::sync::Mutex<std::collections::HashMap<(AttemptKey, Call), (u32, i64)>>,
    stop_causes: std::sync::Mutex<std::collections::HashMap<AttemptKey, StopCause>>,
}

impl Requests {
    /// Whether a request may be sent now (no refusal is making it wait).
    pub(crate) fn due(&self, key: &AttemptKey, call: Call, now_ms: i64) -> bool {
        let refusals = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        refusals.get(&(key.clone(), call)).is_none_or(|&(_, at)| now_ms >= at)
    }

    /// Records a refusal and says what to do next.
    pub(crate) fn refused(&self, key: &AttemptKey, call: Call, now_ms: i64) -> (u32, Retry) {
        let mut refusals = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        let entry = refusals.entry((key.clone(), call)).or_insert((0, now_ms));
        entry.0 += 1;
        let retry = after_refusal(call, entry.0, now_ms);
        match retry {
            Retry::At { at_ms, .. } => entry.1 = at_ms,
            Retry::GiveUp => {
                refusals.remove(&(key.clone(), call));
            }
        }
        (refusals.get(&(key.clone(), call)).map_or(LAUNCH_TRIES, |e| e.0), retry)
    }

    /// A request went through: its refusals are forgotten.
    pub(crate) fn accepted(&self, key: &AttemptKey, call: Call) {
        self.refusals.lock().unwrap_or_else(|e| e.into_inner()).remove(&(key.clone(), call));
    }

    pub(crate) fn stop_cause(&self, key: &AttemptKey) -> Option<StopCause> {
        self.stop_causes.lock().unwrap_or_else(|e| e.into_inner()).get(key).copied()
    }

    pub(crate) fn stopping(&self, key: &AttemptKey, cause: StopCause) {
        self.stop_causes.lock().unwrap_or_else(|e| e.into_inner()).insert(key.clone(), cause);
    }

    /// Drops everything kept about a task's attempts (it left the working set).
    pub(crate) fn forget(&self, task_id: &str) {
        self.refusals.lock().unwrap_or_else(|e| e.into_inner()).retain(|(k, _), _| k.task_id != task_id);
        self.stop_causes.lock().unwrap_or_else(|e| e.into_inner()).retain(|k, _| k.task_id != task_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_core::lifecycle::transition;

    fn key() -> AttemptKey {
        AttemptKey { task_id: "t".into(), attempt: 3 }
    }

    fn to(change: Change) -> Option<(Status, Reason, i64, Option<Reason>)> {
        match change {
            Change::Step { step, failed } => Some((step.to, step.reason, step.attempt, failed)),
            Change::Stop { step, .. } => Some((step.to, step.reason, step.attempt, None)),
            Change::None => None,
        }
    }

    #[test]
    fn observations_move_the_attempt_along_its_lifecycle() {
        let started = |precheck| Observation::Started { key: key(), precheck };
        assert_eq!(
            to(on_observation(Status::Starting, 3, &started(false), None, false)),
            Some((Status::Running, Reason::Started, 3, None))
        );
        assert_eq!(
            to(on_observation(Status::Starting, 3, &started(true), None, false)),
            Some((Status::Prechecking, Reason::PrecheckStarted, 3, None))
        );
        let passed = Observation::PrecheckPassed { key: key(), message: "ok".into() };
        assert_eq!(
            to(on_observation(Status::Prechecking, 3, &passed, None, false)),
            Some((Status::Running, Reason::PrecheckPassed, 3, None))
        );
        let done = Observation::Finished { key: key(), reason: Reason::Completed, message: "exit 0".into() };
        assert_eq!(
            to(on_observation(Status::Running, 3, &done, None, false)),
            Some((Status::Succeeded, Reason::Completed, 3, None))
        );
    }

    #[test]
    fn a_completion_seen_before_the_start_records_the_start_first() {
        // The start's report was lost with the store, or the replicas ended between two looks: the attempt
        // ran, so it goes through Running (the end is observed again from there), never Starting -> Failed.
        let done = Observation::Finished { key: key(), reason: Reason::Completed, message: "exit 0".into() };
        assert_eq!(
            to(on_observation(Status::Starting, 3, &done, None, false)),
            Some((Status::Running, Reason::Started, 3, None))
        );
        assert_eq!(
            to(on_observation(Status::Prechecking, 3, &done, None, false)),
            Some((Status::Running, Reason::PrecheckPassed, 3, None))
        );
        for from in [Status::Starting, Status::Prechecking] {
            let Change::Step { step, .. } = on_observation(from, 3, &done, None, false) else {
                panic!("{from}")
            };
            assert!(transition(from, step.to, step.reason).is_ok());
            assert!(transition(step.to, Status::Succeeded, Reason::Completed).is_ok());
        }
    }

    #[test]
    fn a_failure_ends_the_attempt_and_hands_over_to_the_retry_policy() {
        let oom = Observation::Finished { key: key(), reason: Reason::OutOfMemory, message: "oom".into() };
        for s in [Status::Admitted, Status::Starting, Status::Prechecking, Status::Running] {
            let Change::Step { step, failed } = on_observation(s, 3, &oom, None, false) else {
                panic!("{s}")
            };
            assert_eq!(
                (step.to, failed, step.placement.as_deref()),
                (Status::Failed, Some(Reason::OutOfMemory), Some(""))
            );
        }
        // A failure reported while the attempt is being stopped ends the stop, as its cause says.
        assert_eq!(
            to(on_observation(Status::Stopping, 3, &oom, None, false)),
            Some((Status::Stopped, Reason::Terminated, 3, None))
        );
        assert_eq!(
            to(on_observation(Status::Stopping, 3, &oom, Some(StopCause::Preempted), false)),
            Some((Status::Queued, Reason::Requeued, 4, None))
        );
        assert!(needs_stop_cause(Status::Stopping, &oom));
    }

    #[test]
    fn a_stop_requeues_preempted_and_node_failed_attempts_and_ends_the_others() {
        let stopped = |cause| Observation::Stopped { key: key(), cause, message: "stopped".into() };
        for (told, recorded, want) in [
            (Some(StopCause::Preempted), None, (Status::Queued, Reason::Requeued, 4)),
            (Some(StopCause::NodeFailed), None, (Status::Queued, Reason::Requeued, 4)),
            (Some(StopCause::UserStop), None, (Status::Stopped, Reason::Terminated, 3)),
            (Some(StopCause::Deleted), Some(StopCause::Preempted), (Status::Stopped, Reason::Terminated, 3)),
            (None, Some(StopCause::Preempted), (Status::Queued, Reason::Requeued, 4)),
            (None, None, (Status::Stopped, Reason::Terminated, 3)),
        ] {
            let got = to(on_observation(Status::Stopping, 3, &stopped(told), recorded, false));
            assert_eq!(got, Some((want.0, want.1, want.2, None)), "{told:?} {recorded:?}");
        }
        assert!(needs_stop_cause(Status::Stopping, &stopped(None)));
        assert!(!needs_stop_cause(Status::Stopping, &stopped(Some(StopCause::UserStop))));
        assert!(!needs_stop_cause(Status::Running, &stopped(None)));
        assert_eq!(stop_cause_of("Preempted"), Some(StopCause::Preempted));
        assert_eq!(stop_cause_of("Deleted"), Some(StopCause::Deleted));
        assert_eq!(stop_cause_of("Started"), None);
        assert_eq!(stop_cause_of("nonsense"), None);
    }

    #[test]
    fn stale_observations_change_nothing() {
        let started = Observation::Started { key: key(), precheck: false };
        for s in [Status::Queued, Status::Running, Status::Stopping, Status::Succeeded, Status::Failed] {
            assert_eq!(on_observation(s, 3, &started, None, false), Change::None, "{s}");
        }
        let stopped = Observation::Stopped { key: key(), cause: None, message: String::new() };
        assert_eq!(on_observation(Status::Running, 3, &stopped, None, false), Change::None);
    }

    #[test]
    fn a_deleted_task_s_stop_ends_it_whatever_the_stop_was_for() {
        let preempted =
            Observation::Stopped { key: key(), cause: Some(StopCause::Preempted), message: "gone".into() };
        assert_eq!(
            to(on_observation(Status::Stopping, 3, &preempted, None, true)),
            Some((Status::Stopped, Reason::Terminated, 3, None))
        );
        assert_eq!(
            to(on_observation(Status::Stopping, 3, &preempted, None, false)),
            Some((Status::Queued, Reason::Requeued, 4, None))
        );
    }

    #[test]
    fn every_change_the_policy_asks_for_is_legal() {
        let observations = [
            Observation::Started { key: key(), precheck: false },
            Observation::Started { key: key(), precheck: true },
            Observation::PrecheckPassed { key: key(), message: String::new() },
            Observation::Stopped { key: key(), cause: None, message: String::new() },
            Observation::Stopped { key: key(), cause: Some(StopCause::Preempted), message: String::new() },
        ];
        let finished = Reason::ALL.iter().map(|&reason| Observation::Finished {
            key: key(),
            reason,
            message: String::new(),
        });
        for obs in observations.into_iter().chain(finished) {
            for &s in Status::ALL {
                if let Change::Step { step, .. } | Change::Stop { step, .. } =
                    on_observation(s, 3, &obs, None, false)
                {
                    let legal = trainyard_core::lifecycle::transition(s, step.to, step.reason);
                    // A backend reporting a reason no failure may carry is the one way to ask for an illegal
                    // change; `apply` refuses it and records an InternalError.
                    let is_failure_reason = step.to == Status::Failed;
                    assert!(legal.is_ok() || is_failure_reason, "{s} -> {:?} on {obs:?}", step.to);
                }
            }
        }
    }

    /// Issue 32: the cluster's preemption (Kueue evicting a job it admitted) goes Trainyard's own preemption's
    /// way: Stopping, a stop for `Preempted`, and its end requeues the task without spending its budget.
    #[test]
    fn a_preemption_by_the_cluster_is_stopped_and_requeued_as_trainyard_s_own() {
        let evicted = Observation::Finished {
            key: key(),
            reason: Reason::Preempted,
            message: "Kueue evicted the job: Preempted".into(),
        };
        for s in [Status::Admitted, Status::Starting, Status::Prechecking, Status::Running] {
            match on_observation(s, 3, &evicted, None, false) {
                Change::Stop { step, cause } => {
                    assert_eq!(
                        (step.to, step.reason, step.attempt),
                        (Status::Stopping, Reason::Preempted, 3)
                    );
                    assert_eq!(cause, StopCause::Preempted);
                }
                other => panic!("{s}: {other:?}"),
            }
        }
        assert_eq!(on_observation(Status::Stopping, 3, &evicted, Some(StopCause::UserStop), false), {
            Change::Step {
                step: stop_ended(Some(StopCause::UserStop), "Kueue evicted the job: Preempted", 3),
                failed: None,
            }
        });
        let gone =
            Observation::Stopped { key: key(), cause: Some(StopCause::Preempted), message: "gone".into() };
        assert_eq!(
            to(on_observation(Status::Stopping, 3, &gone, None, false)),
            Some((Status::Queued, Reason::Requeued, 4, None))
        );
    }

    #[test]
    fn infrastructure_failures_are_retried_within_the_budget() {
        match after_failure(Reason::NodeFailed, 3, 1, 2) {
            AfterFailure::Requeue(step) => {
                assert_eq!(
                    (step.to, step.reason, step.attempt, step.retries),
                    (Status::Queued, Reason::Requeued, 4, Some(2))
                );
                assert_eq!(step.message, "automatic resubmission 2 of 2 after NodeFailed");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            after_failure(Reason::LaunchFailed, 3, 2, 2),
            AfterFailure::BudgetSpent("no automatic resubmission left (2 allowed)".into())
        );
        assert_eq!(after_failure(Reason::UserError, 3, 0, 5), AfterFailure::Ends);
        assert_eq!(after_failure(Reason::OutOfMemory, 3, 0, 5), AfterFailure::Ends);
    }

    #[test]
    fn refused_requests_are_asked_again_with_growing_waits_and_launches_give_up() {
        let waits: Vec<Retry> = (1..=LAUNCH_TRIES).map(|n| after_refusal(Call::Launch, n, 0)).collect();
        assert_eq!(
            waits,
            vec![
                Retry::At { at_ms: 1_000, tell: true },
                Retry::At { at_ms: 2_000, tell: true },
                Retry::At { at_ms: 4_000, tell: false },
                Retry::At { at_ms: 8_000, tell: true },
                Retry::GiveUp,
            ]
        );
        // Stops are never given up (the resources are held until the attempt is gone); waits stop growing.
        assert_eq!(after_refusal(Call::Stop, 64, 0), Retry::At { at_ms: 60_000, tell: true });
        assert_eq!(after_refusal(Call::Stop, 1_000, 5), Retry::At { at_ms: 60_005, tell: false });
    }

    #[test]
    fn requests_wait_after_a_refusal_and_are_due_again_after_the_wait() {
        let book = Requests::default();
        let k = key();
        assert!(book.due(&k, Call::Launch, 0));
        assert_eq!(book.refused(&k, Call::Launch, 0), (1, Retry::At { at_ms: 1_000, tell: true }));
        assert!(!book.due(&k, Call::Launch, 999));
        assert!(book.due(&k, Call::Stop, 999), "another request of the attempt is not held up");
        assert!(book.due(&k, Call::Launch, 1_000));
        for n in 2..LAUNCH_TRIES {
            assert_eq!(book.refused(&k, Call::Launch, 1_000).0, n);
        }
        assert_eq!(book.refused(&k, Call::Launch, 1_000), (LAUNCH_TRIES, Retry::GiveUp));
        assert!(book.due(&k, Call::Launch, 1_000), "given up: nothing held");
        book.refused(&k, Call::Stop, 0);
        book.accepted(&k, Call::Stop);
        assert!(book.due(&k, Call::Stop, 0));
        book.stopping(&k, StopCause::Preempted);
        assert_eq!(book.stop_cause(&k), Some(StopCause::Preempted));
        book.refused(&k, Call::Scale, 0);
        book.forget("t");
        assert_eq!(book.stop_cause(&k), None);
        assert!(book.due(&k, Call::Scale, 0));
    }
}
