//! The handlers, one file per family of routes (the router maps paths to them).

pub mod admin;
pub mod server;
pub mod shares;
pub mod tasks;
pub mod telemetry;
pub mod users;
pub mod workdirs;

/// The query of an operation that takes no parameters: any parameter is refused (400, naming it), so a
/// misspelt or misplaced one is never silently ignored. Every query of the API refuses unknown parameters.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}
