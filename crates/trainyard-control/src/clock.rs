//! Where the control plane reads the time: [`Clock`], the system's by default, or a [`ManualClock`] that
//! moves only when told, so a seeded simulation replays with the same timestamps and the same figures.
//! [`Sources`] carries a clock and the ids (`ids::Ids`) together; `Control::with_sources` takes them, and
//! the API reads its time from the same clock.

use crate::ids::Ids;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// The time, as the control plane reads it.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now, as Unix time in milliseconds.
    fn now_ms(&self) -> i64;
    /// A reading for measuring how long something took, in microseconds from an arbitrary start; it never
    /// goes back.
    fn monotonic_us(&self) -> u64;
}

/// The system's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

#[allow(clippy::disallowed_methods)] // The one place the control plane reads the system's clock.
impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
    }

    fn monotonic_us(&self) -> u64 {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        START.get_or_init(std::time::Instant::now).elapsed().as_micros() as u64
    }
}

/// Virtual time: it stands still until [`ManualClock::set`] or [`ManualClock::advance`] moves it, and a
/// duration measured on it is the virtual time that passed (none while the clock is not moved).
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ms: AtomicI64,
}

impl ManualClock {
    pub fn new(now_ms: i64) -> ManualClock {
        ManualClock { now_ms: AtomicI64::new(now_ms) }
    }

    pub fn set(&self, now_ms: i64) {
        self.now_ms.store(now_ms, Ordering::Relaxed);
    }

    pub fn advance(&self, by_ms: i64) {
        self.now_ms.fetch_add(by_ms, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now_ms.load(Ordering::Relaxed)
    }

    fn monotonic_us(&self) -> u64 {
        self.now_ms().max(0) as u64 * 1_000
    }
}

/// The clock and the ids a control loop and its API use: the system's clock and the process's ids by
/// default; a [`ManualClock`] and `Ids::seeded` for a run that must replay exactly.
#[derive(Debug, Clone)]
pub struct Sources {
    pub clock: Arc<dyn Clock>,
    pub ids: Arc<Ids>,
}

impl Default for Sources {
    fn default() -> Self {
        Sources { clock: Arc::new(SystemClock), ids: Arc::new(Ids::process()) }
    }
}

impl Sources {
    /// The sources of a seeded run: `clock` (moved by the caller) and the seed's ids.
    pub fn seeded(seed: u64, clock: Arc<dyn Clock>) -> Sources {
        Sources { clock, ids: Arc::new(Ids::seeded(seed)) }
    }

    /// Microseconds since `t0` (a [`Clock::monotonic_us`] reading), saturated to fit a report's field.
    pub(crate) fn us_since(&self, t0: u64) -> u32 {
        self.clock.monotonic_us().saturating_sub(t0).min(u64::from(u32::MAX)) as u32
    }
}
