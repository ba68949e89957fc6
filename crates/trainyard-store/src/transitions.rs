//! Status changes: each applied only if its task is still at the version it expects, with its event, in one
//! commit; and events that change no status.

use crate::model::{TaskRecord, Transition};
use crate::rows::{TASK_READ, task_from_row};
use crate::{Result, Store, StoreError};
use sqlx::Connection;
use trainyard_core::lifecycle::{Reason, Status};

impl Store {
    /// Applies a status change and its event in one transaction, if nobody changed the task meanwhile.
    pub async fn transition(&self, t: &Transition) -> Result<TaskRecord> {
        let mut all = self.transitions(std::slice::from_ref(t)).await?;
        all.pop().expect("one answer per transition")
    }

    /// Applies several status changes, each with its event, in one transaction (one commit): each applies
    /// if its task is at the version it expects when its turn comes, so a task can be taken through two
    /// steps by naming the version after the first. Each gets its own answer; a conflict writes nothing of
    /// that change and does not stop the others.
    pub async fn transitions(&self, changes: &[Transition]) -> Result<Vec<Result<TaskRecord>>> {
        if changes.is_empty() {
            return Ok(Vec::new());
        }
        self.write(async |conn| {
            let mut answers = Vec::with_capacity(changes.len());
            let mut tx = conn.begin().await?;
            if let Err(e) = self.check_fence(&mut tx).await {
                tx.rollback().await?;
                return Err(e);
            }
            for t in changes {
                // `status` on the right is the row's old one: a change to the same status keeps its time, and an
                // attempt's run starts when it first enters Running (queued again, it has not run).
                let changed = sqlx::query(
                    "UPDATE tasks SET status = $1, attempt = $2, version = version + 1, updated_at_ms = $3, \
                     placement = COALESCE($4, placement), retries = COALESCE($5, retries), \
                     status_since_ms = CASE WHEN status = $1 THEN status_since_ms ELSE $3 END, \
                     run_started_at_ms = CASE WHEN $8 = 1 AND status <> $1 THEN $3 \
                     WHEN $9 = 1 THEN 0 ELSE run_started_at_ms END \
                     WHERE id = $6 AND version = $7",
                )
                .bind(t.status.as_str())
                .bind(t.attempt)
                .bind(t.at_ms)
                .bind(t.placement.as_deref())
                .bind(t.retries)
                .bind(&t.task_id)
                .bind(t.expected_version)
                .bind(i64::from(t.status == Status::Running))
                .bind(i64::from(t.status == Status::Queued))
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if changed == 0 {
                    let exists = sqlx::query("SELECT 1 FROM tasks WHERE id = $1")
                        .bind(&t.task_id)
                        .fetch_optional(&mut *tx)
                        .await?
                        .is_some();
                    answers.push(Err(if exists {
                        StoreError::VersionConflict { expected: t.expected_version }
                    } else {
                        StoreError::NotFound(t.task_id.clone())
                    }));
                    continue;
                }
                sqlx::query(
                    "INSERT INTO task_events (task_id, attempt, at_ms, reason, message) VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(&t.task_id)
                .bind(t.attempt)
                .bind(t.at_ms)
                .bind(t.reason.as_str())
                .bind(&t.message)
                .execute(&mut *tx)
                .await?;
                let row = sqlx::query(&format!("SELECT {TASK_READ} FROM tasks WHERE id = $1"))
                    .bind(&t.task_id)
                    .fetch_one(&mut *tx)
                    .await?;
                answers.push(task_from_row(&row));
            }
            tx.commit().await?;
            Ok(answers)
        })
        .await
    }

    /// Appends an event that changes no status (a figure, a warning, a step of a stop).
    pub async fn append_event(
        &self,
        task_id: &str,
        attempt: i64,
        at_ms: i64,
        reason: Reason,
        message: &str,
    ) -> Result<()> {
        let insert = sqlx::query(
            "INSERT INTO task_events (task_id, attempt, at_ms, reason, message) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(task_id)
        .bind(attempt)
        .bind(at_ms)
        .bind(reason.as_str())
        .bind(message);
        self.write(async |conn| {
            if self.fence.is_none() {
                insert.execute(&mut *conn).await?;
                return Ok(());
            }
            // Fenced: the check and the insert in one transaction (see `lease`).
            let mut tx = conn.begin().await?;
            if let Err(e) = self.check_fence(&mut tx).await {
                tx.rollback().await?;
                return Err(e);
            }
            insert.execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }
}
