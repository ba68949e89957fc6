//! Users' commands decided, pure: what a stop, a delete and a resubmit do to a task in each status.
//! `commands` reads the task, asks these, and carries the answer out (the transition committed first, then the
//! backend asked); so every rule is tested here alone, and the simulation checks them with the rest.

use trainyard_core::lifecycle::{Reason, Status};
use trainyard_runtime::StopCause;

/// Who asks for a stop: a user's stop, or a delete (which stops what runs first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopRequest {
    Stop,
    Delete,
}

/// What a stop does: the transition's status and reason, and, when something runs, why the backend is asked to
/// stop it (after the transition commits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StopDecision {
    pub(crate) to: Status,
    pub(crate) reason: Reason,
    /// `Some`: the attempt runs, and goes through Stopping (the checkpoint window, then termination).
    pub(crate) backend_stop: Option<StopCause>,
}

/// Why a command is refused for a task in its status: what the user reads after "task NAME is STATUS; ".
pub(crate) type Refusal = &'static str;

/// What stopping a task in `status` does: a queued task ends at once (nothing runs); a task holding
/// resources goes through Stopping; anything else (already stopping, or ended) has nothing to stop.
pub(crate) fn on_stop(status: Status, request: StopRequest) -> Result<StopDecision, Refusal> {
    let (reason, cause) = match request {
        StopRequest::Stop => (Reason::StopRequested, StopCause::UserStop),
        StopRequest::Delete => (Reason::Deleted, StopCause::Deleted),
    };
    match status {
        Status::Queued => Ok(StopDecision { to: Status::Stopped, reason, backend_stop: None }),
        s if s.holds_resources() && s != Status::Stopping => {
            Ok(StopDecision { to: Status::Stopping, reason, backend_stop: Some(cause) })
        }
        _ => Err("there is nothing to stop"),
    }
}

/// What deleting a task does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeleteDecision {
    /// Deleted already: nothing changes (a delete is idempotent).
    Nothing,
    /// Stopped first as [`on_stop`] says (the exit checkpoint protocol runs), then marked deleted. A stop
    /// refused by then (the task moved on meanwhile) does not stop the delete.
    StopThenMark(StopDecision),
    /// Nothing to stop (ended, or already stopping): marked deleted; a stopping task stays in the loop's
    /// working set until its attempt is gone.
    Mark,
}

/// What deleting a task in `status` (`deleted`: deleted already) does.
pub(crate) fn on_delete(status: Status, deleted: bool) -> DeleteDecision {
    if deleted {
        return DeleteDecision::Nothing;
    }
    match on_stop(status, StopRequest::Delete) {
        Ok(stop) => DeleteDecision::StopThenMark(stop),
        Err(_) => DeleteDecision::Mark,
    }
}

/// Why a resubmission is refused: the status the user is told the task is in, and what to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResubmitRefusal {
    /// `None`: the task's status; `Some`: a state the status does not show ("deleted").
    pub(crate) state: Option<&'static str>,
    pub(crate) what: Refusal,
}

/// Whether a task in `status` (`deleted`: deleted) may be queued again as a new attempt: only an ended task
/// that is not deleted. A deleted task is out of every list and view the loop keeps: queued again it would
/// wait for ever, unseen.
pub(crate) fn on_resubmit(status: Status, deleted: bool) -> Result<(), ResubmitRefusal> {
    if deleted {
        return Err(ResubmitRefusal {
            state: Some("deleted"),
            what: "a deleted task cannot be resubmitted; clone it to run its spec again",
        });
    }
    if !status.is_terminal() {
        return Err(ResubmitRefusal { state: None, what: "only an ended task can be resubmitted" });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use Status::*;

    const ALL: [Status; 9] =
        [Queued, Admitted, Starting, Prechecking, Running, Stopping, Succeeded, Failed, Stopped];

    /// Every status's answer to a request, as one line each: `Status -> To (cause)` or `Status: refusal`.
    fn check<T: std::fmt::Debug>(decide: impl Fn(Status) -> T, expected: &[&str]) {
        let got: Vec<String> = ALL.iter().map(|&s| format!("{s}: {:?}", decide(s))).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn a_stop_ends_a_queued_task_and_stops_a_running_one() {
        let stop = |s| on_stop(s, StopRequest::Stop).map(|d| (d.to, d.reason, d.backend_stop));
        check(
            stop,
            &[
                "Queued: Ok((Stopped, StopRequested, None))",
                "Admitted: Ok((Stopping, StopRequested, Some(UserStop)))",
                "Starting: Ok((Stopping, StopRequested, Some(UserStop)))",
                "Prechecking: Ok((Stopping, StopRequested, Some(UserStop)))",
                "Running: Ok((Stopping, StopRequested, Some(UserStop)))",
                "Stopping: Err(\"there is nothing to stop\")",
                "Succeeded: Err(\"there is nothing to stop\")",
                "Failed: Err(\"there is nothing to stop\")",
                "Stopped: Err(\"there is nothing to stop\")",
            ],
        );
    }

    #[test]
    fn a_delete_stops_what_runs_then_marks_and_is_idempotent() {
        check(
            |s| on_delete(s, false),
            &[
                "Queued: StopThenMark(StopDecision { to: Stopped, reason: Deleted, backend_stop: None })",
                "Admitted: StopThenMark(StopDecision { to: Stopping, reason: Deleted, backend_stop: Some(Deleted) })",
                "Starting: StopThenMark(StopDecision { to: Stopping, reason: Deleted, backend_stop: Some(Deleted) })",
                "Prechecking: StopThenMark(StopDecision { to: Stopping, reason: Deleted, backend_stop: Some(Deleted) })",
                "Running: StopThenMark(StopDecision { to: Stopping, reason: Deleted, backend_stop: Some(Deleted) })",
                "Stopping: Mark",
                "Succeeded: Mark",
                "Failed: Mark",
                "Stopped: Mark",
            ],
        );
        for s in ALL {
            assert_eq!(on_delete(s, true), DeleteDecision::Nothing, "{s}, deleted already");
        }
    }

    #[test]
    fn only_an_ended_task_not_deleted_is_resubmitted() {
        let running = "Err(ResubmitRefusal { state: None, what: \"only an ended task can be resubmitted\" })";
        let lines: Vec<String> = ["Queued", "Admitted", "Starting", "Prechecking", "Running", "Stopping"]
            .iter()
            .map(|s| format!("{s}: {running}"))
            .chain(["Succeeded: Ok(())".into(), "Failed: Ok(())".into(), "Stopped: Ok(())".into()])
            .collect();
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        check(|s| on_resubmit(s, false), &lines);
        for s in ALL {
            assert_eq!(on_resubmit(s, true).map_err(|r| r.state), Err(Some("deleted")), "{s}, deleted");
        }
    }
}
