//! Leadership among the servers on one store: a lease row with a fencing token, and the servers' registry.
//!
//! The lease is taken when free or expired and renewed by its holder, all by the database's clock (the
//! servers' clocks never compare). Each new term gets the next token. A store made [`Store::fenced`] checks
//! the token in every status change it commits, inside the same transaction and holding a share lock on the
//! lease row (PostgreSQL): a takeover waits for the old leader's write in flight, and after it commits no
//! write of the old term can. A leader paused past its lease and resumed therefore cannot admit, launch or
//! end anything; its writes fail with [`StoreError::Fenced`].

use crate::{Dialect, Result, Store, StoreError};
use sqlx::Row;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The lease as the store has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The server holding it ("" before anyone took it).
    pub holder: String,
    /// The fencing token of its term; each new term has the next one.
    pub token: i64,
    /// When this term began, and until when it runs unless renewed (the database's clock, ms).
    pub acquired_at_ms: i64,
    pub renewed_at_ms: i64,
    pub expires_at_ms: i64,
    /// The database's clock when this was read.
    pub now_ms: i64,
}

impl Lease {
    /// Whether `server` holds it now.
    pub fn held_by(&self, server: &str) -> bool {
        self.holder == server && self.expires_at_ms >= self.now_ms
    }
}

/// A server as the registry has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerRecord {
    pub id: String,
    /// Where its API answers.
    pub address: String,
    pub host: String,
    pub backend: String,
    pub version: String,
    pub started_at_ms: i64,
    /// When it last said it is alive (the database's clock).
    pub seen_at_ms: i64,
}

/// The token a fenced store's writes carry: the term this server leads, until when by this process's
/// monotonic clock (a term's end is known here without asking the store: a process paused past it and resumed
/// finds its token gone before it writes), or none.
#[derive(Debug, Clone, Default)]
pub struct Fence(Arc<Mutex<(i64, Option<Instant>)>>);

impl Fence {
    fn lock(&self) -> std::sync::MutexGuard<'_, (i64, Option<Instant>)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The term `token`, held until `until`.
    pub fn set(&self, token: i64, until: Instant) {
        *self.lock() = (token, Some(until));
    }

    pub fn clear(&self) {
        *self.lock() = (0, None);
    }

    /// The token of the term held now; 0 when none is (never held, given up, or past its end).
    pub fn token(&self) -> i64 {
        match *self.lock() {
            (token, Some(until)) if Instant::now() < until => token,
            _ => 0,
        }
    }

    /// The token last set, whether or not its term has ended (0 once cleared).
    pub fn last_token(&self) -> i64 {
        self.lock().0
    }
}

/// How long a silent server stays in the registry.
const SERVER_FORGOTTEN_MS: i64 = 24 * 3600 * 1000;

/// The database's clock, in Unix milliseconds.
fn db_now(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
        Dialect::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
    }
}

fn lease_from_row(row: &sqlx::any::AnyRow) -> Result<Lease> {
    Ok(Lease {
        holder: row.try_get(0)?,
        token: row.try_get(1)?,
        acquired_at_ms: row.try_get(2)?,
        renewed_at_ms: row.try_get(3)?,
        expires_at_ms: row.try_get(4)?,
        now_ms: row.try_get(5)?,
    })
}

impl Store {
    /// This store, its status changes fenced by `fence`: each commits only while the lease's token is the
    /// fence's (see the module's comment); with no token set, none commits.
    pub fn fenced(&self, fence: Fence) -> Store {
        Store { fence: Some(fence), ..self.clone() }
    }

    /// The fencing check of a fenced store, inside the write's transaction.
    pub(crate) async fn check_fence(&self, conn: &mut sqlx::AnyConnection) -> Result<()> {
        let Some(fence) = &self.fence else { return Ok(()) };
        let held = fence.token();
        let lock = if self.dialect == Dialect::Postgres { " FOR SHARE" } else { "" };
        let current: i64 = sqlx::query(&format!("SELECT token FROM leader_lease WHERE id = 1{lock}"))
            .fetch_one(&mut *conn)
            .await?
            .try_get(0)?;
        if held == 0 || held != current {
            return Err(StoreError::Fenced { held, current });
        }
        Ok(())
    }

    /// Takes the lease for `server` if it is free, expired or already `server`'s, for `ttl_ms` from now
    /// (the database's clock): a new term (the next token) unless `server` held it unexpired. `None` when
    /// another server holds it.
    pub async fn claim_lease(&self, server: &str, ttl_ms: i64) -> Result<Option<Lease>> {
        let now = db_now(self.dialect);
        self.write(async |conn| {
            let row = sqlx::query(&format!(
                "UPDATE leader_lease SET \
                 token = CASE WHEN holder = $1 AND expires_at_ms >= {now} THEN token ELSE token + 1 END, \
                 acquired_at_ms = CASE WHEN holder = $1 AND expires_at_ms >= {now} THEN acquired_at_ms \
                 ELSE {now} END, \
                 holder = $1, renewed_at_ms = {now}, expires_at_ms = {now} + $2 \
                 WHERE id = 1 AND (holder = $1 OR expires_at_ms < {now}) \
                 RETURNING holder, token, acquired_at_ms, renewed_at_ms, expires_at_ms, {now}"
            ))
            .bind(server)
            .bind(ttl_ms)
            .fetch_optional(&mut *conn)
            .await?;
            row.as_ref().map(lease_from_row).transpose()
        })
        .await
    }

    /// Gives the lease up at once (a server stopping), if `server` holds it with `token`: the next server
    /// takes it without waiting for it to expire.
    pub async fn release_lease(&self, server: &str, token: i64) -> Result<bool> {
        let now = db_now(self.dialect);
        self.write(async |conn| {
            let done = sqlx::query(&format!(
                "UPDATE leader_lease SET expires_at_ms = {now} - 1 WHERE id = 1 AND holder = $1 AND token = $2"
            ))
            .bind(server)
            .bind(token)
            .execute(&mut *conn)
            .await?
            .rows_affected();
            Ok(done == 1)
        })
        .await
    }

    /// The lease as it stands.
    pub async fn lease(&self) -> Result<Lease> {
        let row = sqlx::query(&format!(
            "SELECT holder, token, acquired_at_ms, renewed_at_ms, expires_at_ms, {} FROM leader_lease WHERE id = 1",
            db_now(self.dialect)
        ))
        .fetch_one(&self.pool)
        .await?;
        lease_from_row(&row)
    }

    /// Records that `server` is alive (the database's clock), with what it says of itself.
    pub async fn server_seen(&self, s: &ServerRecord) -> Result<()> {
        let now = db_now(self.dialect);
        self.write(async |conn| {
            sqlx::query(&format!(
                "INSERT INTO servers (id, address, host, backend, version, started_at_ms, seen_at_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6, {now}) ON CONFLICT (id) DO UPDATE SET \
                 address = $2, host = $3, backend = $4, version = $5, seen_at_ms = {now}"
            ))
            .bind(&s.id)
            .bind(&s.address)
            .bind(&s.host)
            .bind(&s.backend)
            .bind(&s.version)
            .bind(s.started_at_ms)
            .execute(&mut *conn)
            .await?;
            // Servers silent for a day are forgotten (each start is a new server).
            sqlx::query(&format!("DELETE FROM servers WHERE seen_at_ms < {now} - {SERVER_FORGOTTEN_MS}"))
                .execute(&mut *conn)
                .await?;
            Ok(())
        })
        .await
    }

    /// Every server seen within `within_ms` (the database's clock), oldest first.
    pub async fn servers(&self, within_ms: i64) -> Result<Vec<ServerRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT id, address, host, backend, version, started_at_ms, seen_at_ms FROM servers \
             WHERE seen_at_ms >= {} - $1 ORDER BY started_at_ms, id",
            db_now(self.dialect)
        ))
        .bind(within_ms)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(ServerRecord {
                    id: r.try_get(0)?,
                    address: r.try_get(1)?,
                    host: r.try_get(2)?,
                    backend: r.try_get(3)?,
                    version: r.try_get(4)?,
                    started_at_ms: r.try_get(5)?,
                    seen_at_ms: r.try_get(6)?,
                })
            })
            .collect()
    }

    /// The setting `name`, set to `value` if it has none yet: every server on the store then reads the
    /// same one (key material the servers share, such as the idempotency keys' digest key).
    pub async fn setting_once(&self, name: &str, value: &str, at_ms: i64) -> Result<String> {
        self.write(async |conn| {
            sqlx::query(
                "INSERT INTO settings (name, value, updated_at_ms) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING",
            )
            .bind(name)
            .bind(value)
            .bind(at_ms)
            .execute(&mut *conn)
            .await?;
            Ok(())
        })
        .await?;
        self.get_setting(name).await?.ok_or_else(|| StoreError::Corrupt(format!("setting {name} vanished")))
    }
}
