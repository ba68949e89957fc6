//! What a backend keeps of an attempt's replicas after they are gone, in the store, where every server on it
//! reads it: each replica's log (appended in chunks of whole lines, each with where the follower that wrote it
//! stands, in one commit, so a follower that takes over goes on exactly where the last one stopped), its
//! metrics samples, and whether its log is complete. Only the leader follows and scrapes: its writes are fenced
//! like its status changes (see `lease`), so a server paused past its term cannot append a line twice.

use crate::{Dialect, Result, Store};
use sqlx::{Connection, Row};

/// A replica with something kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeptReplica {
    pub replica: String,
    pub role: String,
    /// Its log is complete (its container ended and the log was read to its end).
    pub ended: bool,
    /// Where its follower stands (the follower's own format).
    pub cursor: String,
    /// The bytes of log kept.
    pub log_bytes: i64,
}

/// A part of a kept log, read from a byte offset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeptLog {
    /// Whole chunks from the one holding the offset, at most about `max` bytes past it.
    pub data: Vec<u8>,
    /// The byte offset `data` starts at (at or before the offset asked for).
    pub from: i64,
    pub log_bytes: i64,
    pub ended: bool,
    /// Nothing of this replica is kept.
    pub missing: bool,
}

fn replica_of(r: &sqlx::any::AnyRow) -> Result<KeptReplica> {
    Ok(KeptReplica {
        replica: r.try_get(0)?,
        role: r.try_get(1)?,
        ended: r.try_get::<i64, _>(2)? != 0,
        cursor: r.try_get(3)?,
        log_bytes: r.try_get(4)?,
    })
}

const REPLICA_READ: &str = "SELECT replica, role, ended, cursor, log_bytes FROM kept_replicas";

impl Store {
    /// Runs a fenced write: `body` inside a transaction that first checks the fence (see `lease`).
    async fn kept_write(&self, body: impl AsyncFnOnce(&mut sqlx::AnyConnection) -> Result<()>) -> Result<()> {
        self.write(async |conn| {
            let mut tx = conn.begin().await?;
            if let Err(e) = self.check_fence(&mut tx).await {
                tx.rollback().await?;
                return Err(e);
            }
            body(&mut tx).await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    /// Records a replica and its role, once (a replica already recorded keeps its record).
    pub async fn kept_add_replica(
        &self,
        task_id: &str,
        attempt: i64,
        replica: &str,
        role: &str,
    ) -> Result<()> {
        self.kept_write(async |conn| {
            sqlx::query(
                "INSERT INTO kept_replicas (task_id, attempt, replica, role, ended, cursor, log_bytes, \
                 metrics_bytes) VALUES ($1, $2, $3, $4, 0, '', 0, 0) ON CONFLICT DO NOTHING",
            )
            .bind(task_id)
            .bind(attempt)
            .bind(replica)
            .bind(role)
            .execute(&mut *conn)
            .await?;
            Ok(())
        })
        .await
    }

    /// The replicas of an attempt with something kept, by name.
    pub async fn kept_replicas(&self, task_id: &str, attempt: i64) -> Result<Vec<KeptReplica>> {
        let rows =
            sqlx::query(&format!("{REPLICA_READ} WHERE task_id = $1 AND attempt = $2 ORDER BY replica"))
                .bind(task_id)
                .bind(attempt)
                .fetch_all(&self.pool)
                .await?;
        rows.iter().map(replica_of).collect()
    }

    /// One replica's record, if anything of it is kept.
    pub async fn kept_replica(
        &self,
        task_id: &str,
        attempt: i64,
        replica: &str,
    ) -> Result<Option<KeptReplica>> {
        let row =
            sqlx::query(&format!("{REPLICA_READ} WHERE task_id = $1 AND attempt = $2 AND replica = $3"))
                .bind(task_id)
                .bind(attempt)
                .bind(replica)
                .fetch_optional(&self.pool)
                .await?;
        row.as_ref().map(replica_of).transpose()
    }

    /// Appends `data` (whole lines) to a recorded replica's log and saves its follower's `cursor`, in one
    /// commit. Appending nothing saves the cursor alone.
    pub async fn kept_append_log(
        &self,
        task_id: &str,
        attempt: i64,
        replica: &str,
        data: &str,
        cursor: &str,
    ) -> Result<()> {
        let lock = if self.dialect == Dialect::Postgres { " FOR UPDATE" } else { "" };
        self.kept_write(async |conn| {
            let row = sqlx::query(&format!(
                "SELECT log_bytes FROM kept_replicas WHERE task_id = $1 AND attempt = $2 AND replica = $3{lock}"
            ))
            .bind(task_id)
            .bind(attempt)
            .bind(replica)
            .fetch_optional(&mut *conn)
            .await?;
            let Some(row) = row else {
                return Err(crate::StoreError::NotFound(format!("{task_id} {attempt} {replica}")));
            };
            let from: i64 = row.try_get(0)?;
            let to = from + data.len() as i64;
            if !data.is_empty() {
                sqlx::query(
                    "INSERT INTO kept_log (task_id, attempt, replica, start_byte, end_byte, data) \
                     VALUES ($1, $2, $3, $4, $5, $6)",
                )
                .bind(task_id)
                .bind(attempt)
                .bind(replica)
                .bind(from)
                .bind(to)
                .bind(data)
                .execute(&mut *conn)
                .await?;
            }
            sqlx::query(
                "UPDATE kept_replicas SET log_bytes = $4, cursor = $5 \
                 WHERE task_id = $1 AND attempt = $2 AND replica = $3",
            )
            .bind(task_id)
            .bind(attempt)
            .bind(replica)
            .bind(to)
            .bind(cursor)
            .execute(&mut *conn)
            .await?;
            Ok(())
        })
        .await
    }

    /// Marks a replica's log complete.
    pub async fn kept_end(&self, task_id: &str, attempt: i64, replica: &str) -> Result<()> {
        self.kept_write(async |conn| {
            sqlx::query(
                "UPDATE kept_replicas SET ended = 1 WHERE task_id = $1 AND attempt = $2 AND replica = $3",
            )
            .bind(task_id)
            .bind(attempt)
            .bind(replica)
            .execute(&mut *conn)
            .await?;
            Ok(())
        })
        .await
    }

    /// A replica's kept log from the chunk holding byte `offset`, whole chunks up to about `max` bytes past
    /// it (the caller cuts at `offset` and at whole lines).
    pub async fn kept_read_log(
        &self,
        task_id: &str,
        attempt: i64,
        replica: &str,
        offset: i64,
        max: i64,
    ) -> Result<KeptLog> {
        let Some(r) = self.kept_replica(task_id, attempt, replica).await? else {
            return Ok(KeptLog { from: offset, missing: true, ..KeptLog::default() });
        };
        let rows = sqlx::query(
            "SELECT start_byte, data FROM kept_log WHERE task_id = $1 AND attempt = $2 AND replica = $3 \
             AND end_byte > $4 AND start_byte < $5 ORDER BY start_byte",
        )
        .bind(task_id)
        .bind(attempt)
        .bind(replica)
        .bind(offset)
        .bind(offset.saturating_add(max.max(1)))
        .fetch_all(&self.pool)
        .await?;
        let mut data = Vec::new();
        let mut from = offset.min(r.log_bytes);
        for (i, row) in rows.iter().enumerate() {
            if i == 0 {
                from = row.try_get(0)?;
            }
            let text: String = row.try_get(1)?;
            data.extend_from_slice(text.as_bytes());
        }
        Ok(KeptLog { data, from, log_bytes: r.log_bytes, ended: r.ended, missing: false })
    }

    /// Appends metrics samples of a recorded replica, each `(taken at, the sample in the backend's format)`,
    /// unless they would take its samples past `max_bytes`: then nothing is kept, and the answer is false.
    pub async fn kept_append_metrics(
        &self,
        task_id: &str,
        attempt: i64,
        replica: &str,
        samples: &[(i64, String)],
        max_bytes: i64,
    ) -> Result<bool> {
        if samples.is_empty() {
            return Ok(true);
        }
        let lock = if self.dialect == Dialect::Postgres { " FOR UPDATE" } else { "" };
        let bytes: i64 = samples.iter().map(|(_, s)| s.len() as i64).sum();
        let mut kept = false;
        self.kept_write(async |conn| {
            let row = sqlx::query(&format!(
                "SELECT metrics_bytes FROM kept_replicas WHERE task_id = $1 AND attempt = $2 AND replica = $3{lock}"
            ))
            .bind(task_id)
            .bind(attempt)
            .bind(replica)
            .fetch_optional(&mut *conn)
            .await?;
            let Some(row) = row else {
                return Err(crate::StoreError::NotFound(format!("{task_id} {attempt} {replica}")));
            };
            let before: i64 = row.try_get(0)?;
            if before + bytes > max_bytes {
                return Ok(());
            }
            for (at_ms, sample) in samples {
                sqlx::query(
                    "INSERT INTO kept_metrics (task_id, attempt, replica, at_ms, sample) VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(task_id)
                .bind(attempt)
                .bind(replica)
                .bind(*at_ms)
                .bind(sample.as_str())
                .execute(&mut *conn)
                .await?;
            }
            sqlx::query(
                "UPDATE kept_replicas SET metrics_bytes = $4 WHERE task_id = $1 AND attempt = $2 AND replica = $3",
            )
            .bind(task_id)
            .bind(attempt)
            .bind(replica)
            .bind(before + bytes)
            .execute(&mut *conn)
            .await?;
            kept = true;
            Ok(())
        })
        .await?;
        Ok(kept)
    }

    /// An attempt's metrics samples taken after `since_ms`, as `(replica, sample)`, oldest first per replica.
    pub async fn kept_read_metrics(
        &self,
        task_id: &str,
        attempt: i64,
        since_ms: i64,
    ) -> Result<Vec<(String, String)>> {
        let rows = sqlx::query(
            "SELECT replica, sample FROM kept_metrics WHERE task_id = $1 AND attempt = $2 AND at_ms > $3 \
             ORDER BY replica, at_ms, id",
        )
        .bind(task_id)
        .bind(attempt)
        .bind(since_ms)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
    }
}
