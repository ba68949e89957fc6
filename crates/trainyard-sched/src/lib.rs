//! Trainyard's scheduler: a pure function from a snapshot of the fleet and the queue to a plan.
//!
//! Architecture invariant: like `trainyard-core`, this crate does no IO, reads no clock (`now` is an
//! argument) and draws no random numbers; the same snapshot always gives the same plan.

#![forbid(unsafe_code)]

mod invariants;
mod order;
mod plan;
mod preempt;
mod quota;
mod schedule;
mod snapshot;
mod starving;
mod state;
pub mod views;

pub use invariants::{check_plan, check_snapshot};
pub use order::{GroupQueue, dominant_shares, fair_order};
pub use plan::*;
pub use schedule::{Config, schedule};
pub use snapshot::*;
pub use starving::{next_starving_at_ms, starving};
