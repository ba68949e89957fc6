//! The task lifecycle as a state machine: which status may follow which, and why. Every change of status is
//! an event with a stable [`Reason`]; a change the table does not allow is refused, so an illegal history
//! cannot be written.
//!
//! ```text
//! Queued → Admitted → Starting → [Prechecking →] Running → Succeeded | Failed
//!    ↑          └──────────┴──────────────┴─────────┴→ Stopping → Stopped | Queued (requeue: retry, preemption)
//!    └──────────────────── Failed (retryable, budget left) ──────────┘
//! ```
//!
//! A retry or a preemption starts a new attempt that goes back to `Queued`; the attempt number only grows.

use crate::string_enum;

string_enum! {
    /// Where a task is in its life.
    pub enum Status {
        Queued = "Queued",
        Admitted = "Admitted",
        Starting = "Starting",
        Prechecking = "Prechecking",
        Running = "Running",
        Stopping = "Stopping",
        Succeeded = "Succeeded",
        Failed = "Failed",
        Stopped = "Stopped",
    }
}

impl Status {
    /// Done for good: nothing more happens unless a person resubmits.
    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Succeeded | Status::Failed | Status::Stopped)
    }

    /// Holds resources on machines (from admission until stopped or done).
    pub fn holds_resources(self) -> bool {
        matches!(
            self,
            Status::Admitted | Status::Starting | Status::Prechecking | Status::Running | Status::Stopping
        )
    }
}

string_enum! {
    /// Why a status changed: stable codes the API, alarms and the console match on.
    pub enum Reason {
        Submitted = "Submitted",
        Admitted = "Admitted",
        ImagePulled = "ImagePulled",
        ImagePullFailed = "ImagePullFailed",
        PrecheckStarted = "PrecheckStarted",
        PrecheckPassed = "PrecheckPassed",
        PrecheckFailed = "PrecheckFailed",
        Started = "Started",
        Completed = "Completed",
        UserError = "UserError",
        OutOfMemory = "OutOfMemory",
        NodeFailed = "NodeFailed",
        Preempted = "Preempted",
        StopRequested = "StopRequested",
        Deleted = "Deleted",
        CheckpointRequested = "CheckpointRequested",
        Terminated = "Terminated",
        Resubmitted = "Resubmitted",
        Requeued = "Requeued",
        RetryBudgetSpent = "RetryBudgetSpent",
        /// A backend refused to start the attempt again and again (see the events before it).
        LaunchFailed = "LaunchFailed",
        /// Not every replica was running within the cluster's start-up deadline (unschedulable, stuck
        /// creating): the cluster's reason is in the message.
        StartTimedOut = "StartTimedOut",
        /// The cluster took a replica away (a drain's eviction, a node under pressure, another scheduler's
        /// preemption, a node's taint): not the task's doing.
        Disrupted = "Disrupted",
        // Events that change no status: what happened along the way.
        /// A backend refused a request (launch, stop, scale); it is asked again after a wait.
        BackendError = "BackendError",
        /// The platform could not do what the task needs (a stored spec it cannot read, a hidden value it
        /// cannot open, an illegal transition asked for by mistake).
        InternalError = "InternalError",
        /// A node looks broken for this task; with node replacement on, the next attempts leave it out.
        NodeSuspect = "NodeSuspect",
        ScaleUpRequested = "ScaleUpRequested",
        ScaledUp = "ScaledUp",
        ScaledDown = "ScaledDown",
        ImagePullBackOff = "ImagePullBackOff",
        /// An image is being pulled from its registry: how far.
        ImagePulling = "ImagePulling",
        PrecheckResult = "PrecheckResult",
        CheckpointDone = "CheckpointDone",
        CheckpointTimedOut = "CheckpointTimedOut",
        /// A replica was ended for going over a limit (its scratch space).
        Evicted = "Evicted",
        /// A replica's processes were killed at the end of a stop.
        Killed = "Killed",
        LimitsNotEnforced = "LimitsNotEnforced",
        NetworkNotReady = "NetworkNotReady",
        /// A replica's log reached its cap and its oldest part was dropped.
        LogRotated = "LogRotated",
        /// The cluster said something about the attempt's job or pods (a Kubernetes event: scheduling,
        /// pulls, the operator's steps), in its own words.
        ClusterEvent = "ClusterEvent",
    }
}

/// A transition the table does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a task cannot go from {from} to {to} ({reason})")]
pub struct IllegalTransition {
    pub from: Status,
    pub to: Status,
    pub reason: Reason,
}

/// Checks one transition, with the reason that drives it.
pub fn transition(from: Status, to: Status, reason: Reason) -> Result<(), IllegalTransition> {
    use Reason as R;
    use Status::*;
    let ok = match (from, to) {
        (Queued, Admitted) => reason == R::Admitted,
        (Admitted, Starting) => reason == R::Admitted,
        (Starting, Prechecking) => reason == R::PrecheckStarted,
        (Starting, Running) => reason == R::Started,
        (Prechecking, Running) => reason == R::PrecheckPassed,
        (Running, Succeeded) => reason == R::Completed,
        // Failures end the attempt; whether the task is retried is decided next (Failed -> Queued).
        (Admitted | Starting | Prechecking | Running, Failed) => {
            matches!(
                reason,
                R::ImagePullFailed
                    | R::PrecheckFailed
                    | R::UserError
                    | R::OutOfMemory
                    | R::NodeFailed
                    | R::LaunchFailed
                    | R::StartTimedOut
                    | R::Disrupted
            )
        }
        (Failed, Queued) => matches!(reason, R::Requeued | R::Resubmitted),
        // Every stop path goes through Stopping (checkpoint window, then termination).
        (Admitted | Starting | Prechecking | Running, Stopping) => {
            matches!(reason, R::Preempted | R::StopRequested | R::Deleted | R::NodeFailed)
        }
        (Stopping, Stopped) => matches!(reason, R::Terminated | R::StopRequested | R::Deleted),
        (Stopping, Queued) => matches!(reason, R::Requeued),
        // A queued task can be stopped before it ever ran.
        (Queued, Stopped) => matches!(reason, R::StopRequested | R::Deleted),
        // A person may resubmit a task that ended.
        (Succeeded | Stopped, Queued) => reason == R::Resubmitted,
        _ => false,
    };
    if ok { Ok(()) } else { Err(IllegalTransition { from, to, reason }) }
}

/// What a failure means for retrying: infrastructure failures are retried within the budget; user errors are
/// not, and the message says what to change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureClass {
    Infrastructure,
    User,
}

pub fn failure_class(reason: Reason) -> FailureClass {
    match reason {
        Reason::ImagePullFailed
        | Reason::PrecheckFailed
        | Reason::NodeFailed
        | Reason::Preempted
        | Reason::LaunchFailed
        | Reason::StartTimedOut
        | Reason::Disrupted => FailureClass::Infrastructure,
        _ => FailureClass::User,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Reason as R;
    use Status::*;

    #[test]
    fn the_happy_paths_are_legal() {
        let paths: &[&[(Status, Reason)]] = &[
            &[
                (Admitted, R::Admitted),
                (Starting, R::Admitted),
                (Running, R::Started),
                (Succeeded, R::Completed),
            ],
            &[
                (Admitted, R::Admitted),
                (Starting, R::Admitted),
                (Prechecking, R::PrecheckStarted),
                (Running, R::PrecheckPassed),
                (Stopping, R::StopRequested),
                (Stopped, R::Terminated),
            ],
            &[
                (Admitted, R::Admitted),
                (Starting, R::Admitted),
                (Running, R::Started),
                (Stopping, R::Preempted),
                (Queued, R::Requeued),
            ],
            &[
                (Admitted, R::Admitted),
                (Starting, R::Admitted),
                (Failed, R::ImagePullFailed),
                (Queued, R::Requeued),
            ],
            &[(Stopped, R::StopRequested), (Queued, R::Resubmitted)],
        ];
        for path in paths {
            let mut at = Queued;
            for &(to, reason) in *path {
                transition(at, to, reason).unwrap();
                at = to;
            }
        }
    }

    #[test]
    fn everything_else_is_refused() {
        let legal: usize = Status::ALL
            .iter()
            .flat_map(|&f| Status::ALL.iter().map(move |&t| (f, t)))
            .flat_map(|(f, t)| Reason::ALL.iter().map(move |&r| (f, t, r)))
            .filter(|&(f, t, r)| transition(f, t, r).is_ok())
            .count();
        // The table above, counted by hand (1+1+1+1+1+1 along the happy path, 4×8 failures, 2 requeues of a
        // failure, 4×4 stops, 3+1 ends of a stop, 2 stops before start, 2 resubmissions): a change here must be
        // deliberate.
        assert_eq!(legal, 64);
        for (from, to, reason) in [
            (Queued, Running, R::Started),
            (Succeeded, Running, R::Started),
            (Running, Queued, R::Requeued),
            (Stopped, Running, R::Started),
            (Running, Succeeded, R::Started),
            (Failed, Succeeded, R::Completed),
        ] {
            assert!(transition(from, to, reason).is_err(), "{from} -> {to} ({reason})");
        }
        assert!(Succeeded.is_terminal() && !Running.is_terminal());
        assert!(Stopping.holds_resources() && !Queued.holds_resources());
        assert_eq!(failure_class(R::NodeFailed), FailureClass::Infrastructure);
        // A cluster's own doing (issue 32): a start that never came, a pod taken away by a drain.
        for r in [R::StartTimedOut, R::Disrupted] {
            assert_eq!(failure_class(r), FailureClass::Infrastructure);
            for from in [Starting, Prechecking, Running] {
                assert!(transition(from, Failed, r).is_ok(), "{from} -> Failed ({r})");
            }
        }
        assert_eq!(failure_class(R::UserError), FailureClass::User);
    }
}
