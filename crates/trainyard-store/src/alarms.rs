//! Alarm deliveries: queued once per (task, attempt, event, url), tried until delivered or given up, and
//! kept as the task's delivery log.

use crate::model::AlarmDelivery;
use crate::rows::{DELIVERY_COLUMNS, delivery_from_row};
use crate::{Result, Store};

impl Store {
    /// Queues an alarm, once per (task, attempt, event, url): a repeated call changes nothing.
    pub async fn enqueue_alarm(
        &self,
        task_id: &str,
        attempt: i64,
        event: &str,
        url: &str,
        payload: &str,
        at_ms: i64,
    ) -> Result<()> {
        self.write(async |conn| {
            sqlx::query(
                "INSERT INTO alarm_deliveries (task_id, attempt, event, url, payload, state, tries, next_at_ms, last_error, created_at_ms, done_at_ms) \
                 VALUES ($1, $2, $3, $4, $5, 'pending', 0, $6, '', $6, 0) ON CONFLICT (task_id, attempt, event, url) DO NOTHING",
            )
            .bind(task_id)
            .bind(attempt)
            .bind(event)
            .bind(url)
            .bind(payload)
            .bind(at_ms)
            .execute(&mut *conn)
            .await?;
            Ok(())
        })
        .await
    }

    /// Pending deliveries due at `now_ms`, oldest first.
    pub async fn due_alarms(&self, now_ms: i64, limit: u32) -> Result<Vec<AlarmDelivery>> {
        let rows = sqlx::query(&format!(
            "SELECT {DELIVERY_COLUMNS} FROM alarm_deliveries WHERE state = 'pending' AND next_at_ms <= $1 ORDER BY next_at_ms, id LIMIT $2"
        ))
        .bind(now_ms)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(delivery_from_row).collect()
    }

    /// Records the outcome of one try.
    pub async fn record_delivery(
        &self,
        id: i64,
        state: &str,
        tries: i64,
        next_at_ms: i64,
        error: &str,
        at_ms: i64,
    ) -> Result<()> {
        self.write(async |conn| {
            let done = if state == "pending" { 0 } else { at_ms };
            sqlx::query("UPDATE alarm_deliveries SET state = $1, tries = $2, next_at_ms = $3, last_error = $4, done_at_ms = $5 WHERE id = $6")
                .bind(state)
                .bind(tries)
                .bind(next_at_ms)
                .bind(error)
                .bind(done)
                .bind(id)
                .execute(&mut *conn)
                .await?;
            Ok(())
        })
        .await
    }

    /// A task's delivery log.
    pub async fn task_alarms(&self, task_id: &str) -> Result<Vec<AlarmDelivery>> {
        let rows = sqlx::query(&format!(
            "SELECT {DELIVERY_COLUMNS} FROM alarm_deliveries WHERE task_id = $1 ORDER BY id"
        ))
        .bind(task_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(delivery_from_row).collect()
    }
}
