//! The handlers, one file per family of routes (the router maps paths to them).

pub mod admin;
pub mod server;
pub mod tasks;
pub mod telemetry;
pub mod users;
