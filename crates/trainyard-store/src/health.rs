//! Whether the store can write, for `/healthz`: every write (the pool's through [`Store::write`], the create
//! writers' batches) reports its outcome here. A write that fails for a reason of the database's
//! ([`StoreError::is_database_failure`]: a full disk, an I/O error, a lock never released) marks the store
//! failing, and any write that succeeds clears the mark. While it is marked, [`Store::write_health`] tries a
//! small write of its own (at most every [`PROBE_EVERY`], given [`PROBE_TIMEOUT`]), so the health clears once
//! the disk has space again even when nothing else writes. A healthy store answers from the mark alone: no
//! I/O, as `/healthz` is polled.
//!
//! What it cannot see: a disk that fills while nothing writes is found by the next write, not before.

use crate::{Result, Store, StoreError};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often a failing store tries a write of its own, at most.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How long that write may take (waiting for its turn and the lock included) before it counts as failed.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// The setting the probe writes (its time only).
const PROBE_SETTING: &str = "store-write-probe";

/// The last write's outcome (see the file's header).
#[derive(Debug, Default)]
pub(crate) struct WriteHealth {
    /// Whether `failure` holds something: what a successful write reads, without the lock.
    failing: AtomicBool,
    /// Why the last failing write failed.
    failure: Mutex<Option<String>>,
    /// When the last probe ran; held while one runs, so concurrent health checks share it.
    probed: tokio::sync::Mutex<Option<Instant>>,
}

impl WriteHealth {
    /// Records a write's outcome.
    pub(crate) fn note<T>(&self, r: &Result<T>) {
        match r {
            Ok(_) => {
                if self.failing.load(Ordering::Acquire) {
                    *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    self.failing.store(false, Ordering::Release);
                }
            }
            Err(StoreError::DiskFull(said)) => self.fail(format!(
                "the disk holding its database is full ({said}); free space on it, no restart is needed"
            )),
            Err(e) if e.is_database_failure() => self.fail(e.to_string()),
            Err(_) => {}
        }
    }

    fn fail(&self, why: String) {
        *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
        self.failing.store(true, Ordering::Release);
    }

    fn failure(&self) -> Option<String> {
        if !self.failing.load(Ordering::Acquire) {
            return None;
        }
        self.failure.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Store {
    /// Whether the store can write: `Err` says why not (the last failed write's error). Cheap while writes
    /// succeed; while they fail, a small write is tried at most every [`PROBE_EVERY`] to see whether they
    /// would succeed now.
    pub async fn write_health(&self) -> std::result::Result<(), String> {
        if self.health.failure().is_none() {
            return Ok(());
        }
        let mut probed = self.health.probed.lock().await;
        // Another check's probe (or a write) may have settled it while this one waited.
        let Some(why) = self.health.failure() else { return Ok(()) };
        if probed.is_some_and(|at| at.elapsed() < PROBE_EVERY) {
            return Err(why);
        }
        *probed = Some(Instant::now());
        match tokio::time::timeout(PROBE_TIMEOUT, self.probe_write()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => {
                let why = format!(
                    "a write did not finish within {} s (the database may be locked by a transaction that \
                     was never ended); the last failed write said: {why}",
                    PROBE_TIMEOUT.as_secs()
                );
                self.health.fail(why.clone());
                Err(why)
            }
        }
    }

    /// One small write, which notes its outcome as every write does.
    async fn probe_write(&self) -> Result<()> {
        let at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        self.write(async |conn| {
            sqlx::query(
                "INSERT INTO settings (name, value, updated_at_ms) VALUES ($1, '', $2) \
                 ON CONFLICT (name) DO UPDATE SET updated_at_ms = $2",
            )
            .bind(PROBE_SETTING)
            .bind(at_ms)
            .execute(&mut *conn)
            .await?;
            Ok(())
        })
        .await
    }
}

/// A pool connection lent to one write: closed when the write fails or is dropped half-way, so that no
/// connection goes back to the pool inside a transaction a failure left open (SQLite keeps a transaction
/// open after some failures, `SQLITE_FULL` among them, and a connection holding one holds the database's
/// write lock: every later write waits on it and fails).
pub(crate) struct Lent(Option<sqlx::pool::PoolConnection<sqlx::Any>>);

impl Lent {
    pub(crate) fn new(conn: sqlx::pool::PoolConnection<sqlx::Any>) -> Lent {
        Lent(Some(conn))
    }

    pub(crate) fn conn(&mut self) -> &mut sqlx::AnyConnection {
        self.0.as_mut().expect("a lent connection is there until it is given back")
    }

    /// Back to the pool: the write succeeded, or failed in a way that left no transaction open.
    pub(crate) fn give_back(mut self) {
        drop(self.0.take());
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(mut conn) = self.0.take() {
            // Closing a SQLite connection rolls back whatever it had open.
            conn.close_on_drop();
        }
    }
}

/// Whether a failed write may have left its connection inside a transaction (then it is closed).
pub(crate) fn may_leave_a_transaction(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Db(_) | StoreError::Sqlite(_) | StoreError::DiskFull(_) | StoreError::WriteFailed(_)
    )
}
