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
}
