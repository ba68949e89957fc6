//! Seeded, virtual-time simulation of Trainyard's scheduler, and the workloads its benchmark uses.

pub mod rng;
pub mod sim;
pub mod workload;

pub use sim::{Sim, SimConfig, Stats, Submit};
