//! The replica contract: what every backend gives a replica, whatever runs it (a sandbox on this machine, a
//! pod): where its runtime dir is, the port its rendezvous listens on, the precheck program it runs first,
//! and the signals a stop or an exit checkpoint sends. The platform's environment variables are in
//! `trainyard_core::platform_env`; the failure classes of an ended replica in `trainyard_core::failure`.

/// Where the runtime dir appears inside every replica (`TRAINYARD_RUNTIME_DIR`): what the platform and the
/// replica tell each other (the precheck's result, the exit checkpoint's acknowledgement, custom metrics).
pub const RUNTIME_DIR: &str = "/run/trainyard";

/// The master's rendezvous port (`MASTER_PORT`).
pub const MASTER_PORT: u16 = 29_500;

/// The precheck program, run in each replica before its command when the precheck is on.
pub const PRECHECK_PY: &str = include_str!("precheck.py");

/// Signal numbers (Linux) the platform sends to a replica's processes.
pub const SIGINT: i32 = 2;
pub const SIGKILL: i32 = 9;
pub const SIGUSR1: i32 = 10;
pub const SIGUSR2: i32 = 12;
pub const SIGTERM: i32 = 15;
