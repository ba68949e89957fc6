//! Trainyard's pure core: the `TrainingTask` spec, its decoder and validator, the catalog view and the
//! demand calculator.
//!
//! Architecture invariant: this crate does no IO, reads no clock and draws no random numbers. Every
//! function here is a function of its arguments, and iteration that reaches an output is ordered.

#![forbid(unsafe_code)]

pub mod catalog;
pub mod decode;
pub mod demand;
pub mod failure;
mod grammar;
pub mod image_ref;
pub mod kube_names;
pub mod lifecycle;
pub mod netaddr;
pub mod parse;
pub mod platform_env;
pub mod problem;
pub mod promtext;
pub mod runtime_env;
pub mod spec;
pub mod validate;
mod yaml;

pub use catalog::Catalog;
pub use demand::{Demand, Resources, demand, demand_options};
pub use parse::{Checked, MAX_DOCUMENT_BYTES, check, check_for, parse};
pub use problem::{Code, Problem, Report, Severity};
pub use spec::TrainingTask;
pub use validate::validate;
