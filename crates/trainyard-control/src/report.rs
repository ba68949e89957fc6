//! What one tick did.

/// What one tick did, for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TickReport {
    pub admitted: u32,
    pub preempted: u32,
    pub waiting: u32,
    pub observations: u32,
    /// Transitions lost to a concurrent change (retried next tick).
    pub conflicts: u32,
    /// Attempts about to change status soon by themselves (admitted, starting, stopping): the loop looks
    /// again sooner while there are any, so a task shows Running within milliseconds of its processes.
    pub settling: u32,
    /// Whether this tick ran a scheduling cycle (false: nothing the plan reads had changed, the last one
    /// stands).
    pub planned: bool,
    /// Whether that cycle looked at the whole queue (false: only what arrived since the last plan and what a
    /// cycle always looks at again; the parked rest kept its waits).
    pub whole: bool,
    /// Where the tick's time went.
    pub phases: Phases,
}

/// Wall time of each part of a tick, in microseconds (for the loop's metrics and `tick-bench`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Phases {
    /// The backend's observations turned into transitions.
    pub observe_us: u32,
    /// The working set brought up to date (arrivals, the store's changes, new specs).
    pub sync_us: u32,
    /// The scheduler's snapshot built from the working set.
    pub snapshot_us: u32,
    /// The scheduling cycle.
    pub schedule_us: u32,
    /// Its decisions committed: admissions, preemptions, the queue board.
    pub commit_us: u32,
    /// Queued-too-long alarms.
    pub alarms_us: u32,
    /// The backend made to match the store.
    pub reconcile_us: u32,
}
