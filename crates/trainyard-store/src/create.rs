//! One create inside the caller's transaction (its idempotency key, the row, labels and first event), and
//! imports of many tasks in one transaction. Concurrent creates reach it through `group_commit`.

use crate::model::{Created, NewTask, TaskRecord};
use crate::rows::{TASK_COLUMNS, TASK_READ, demand_columns, task_from_row};
use crate::{Result, Store, StoreError};
use sqlx::Connection;
use sqlx::Row;

impl Store {
    /// Stores many tasks in one transaction, without idempotency keys (imports, benchmarks, migrations from
    /// another system). All or nothing.
    pub async fn import_tasks(&self, tasks: &[NewTask]) -> Result<()> {
        if let Some(t) = tasks.iter().find(|t| t.idempotency.is_some()) {
            return Err(StoreError::Corrupt(format!("task {} is imported with an idempotency key", t.id)));
        }
        self.write(async |conn| {
            let mut tx = conn.begin().await?;
            for t in tasks {
                create_in(&mut tx, t).await?;
            }
            tx.commit().await?;
            Ok(())
        })
        .await
    }
}

impl Store {
    /// Whether `owner` already created a task with this idempotency key (a retry of it answers that task,
    /// or a conflict for another body, and creates nothing).
    pub async fn idempotency_key_used(&self, owner: &str, key: &str) -> Result<bool> {
        if let (Some(keys), Some(reader)) = (&self.keys, &self.reader) {
            let (keys, owner, key) = (keys.clone(), owner.to_owned(), key.to_owned());
            return reader
                .run(move |conn| {
                    let mut index = keys.lock();
                    index.catch_up(conn)?;
                    Ok(index.find(conn, &owner, &key)?.is_some())
                })
                .await;
        }
        let row = sqlx::query("SELECT 1 FROM idempotency WHERE owner = $1 AND key = $2")
            .bind(owner)
            .bind(key)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }
}

pub(crate) fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.is_unique_violation())
}

/// One create inside the caller's transaction.
pub(crate) async fn create_in(conn: &mut sqlx::AnyConnection, t: &NewTask) -> Result<Created> {
    if let Some((key, hash)) = &t.idempotency {
        let inserted = sqlx::query(
            "INSERT INTO idempotency (owner, key, body_hash, task_id, created_at_ms) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (owner, key) DO NOTHING",
        )
        .bind(&t.owner)
        .bind(key)
        .bind(hash)
        .bind(&t.id)
        .bind(t.created_at_ms)
        .execute(&mut *conn)
        .await?
        .rows_affected();
        if inserted == 0 {
            let row = sqlx::query("SELECT body_hash, task_id FROM idempotency WHERE owner = $1 AND key = $2")
                .bind(&t.owner)
                .bind(key)
                .fetch_one(&mut *conn)
                .await?;
            let (seen_hash, task_id): (String, String) = (row.try_get(0)?, row.try_get(1)?);
            if &seen_hash != hash {
                return Err(StoreError::IdempotencyConflict);
            }
            let row = sqlx::query(&format!("SELECT {TASK_READ} FROM tasks WHERE id = $1"))
                .bind(&task_id)
                .fetch_optional(&mut *conn)
                .await?
                .ok_or_else(|| {
                    StoreError::Corrupt(format!("idempotency key points at missing task {task_id}"))
                })?;
            return Ok(Created::Existing(task_from_row(&row)?));
        }
    }
    let labels = serde_json::to_string(&t.labels).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let (demand, accelerator) = demand_columns(t.demand.as_ref());
    let insert = sqlx::query(&format!(
        "INSERT INTO tasks ({TASK_COLUMNS}, deleted) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 0, 1, $10, $10, '', 0, $11, $12, $10, 0, 0)"
    ))
    .bind(&t.id)
    .bind(&t.name)
    .bind(&t.owner)
    .bind(&t.project_group)
    .bind(&t.task_type)
    .bind(t.status.as_str())
    .bind(i64::from(t.public))
    .bind(&labels)
    .bind(&t.spec_json)
    .bind(t.created_at_ms)
    .bind(&demand)
    .bind(accelerator)
    .execute(&mut *conn)
    .await;
    match insert {
        Err(e) if is_unique_violation(&e) => return Err(StoreError::NameTaken(t.name.clone())),
        other => {
            other?;
        }
    }
    for (k, v) in &t.labels {
        sqlx::query("INSERT INTO task_labels (task_id, key, value) VALUES ($1, $2, $3)")
            .bind(&t.id)
            .bind(k)
            .bind(v)
            .execute(&mut *conn)
            .await?;
    }
    if let Some((reason, message)) = &t.first_event {
        sqlx::query(
            "INSERT INTO task_events (task_id, attempt, at_ms, reason, message) VALUES ($1, 0, $2, $3, $4)",
        )
        .bind(&t.id)
        .bind(t.created_at_ms)
        .bind(reason.as_str())
        .bind(message)
        .execute(&mut *conn)
        .await?;
    }
    Ok(Created::New(new_record(t)))
}

/// The record a create writes.
pub(crate) fn new_record(t: &NewTask) -> TaskRecord {
    TaskRecord {
        id: t.id.clone(),
        name: t.name.clone(),
        owner: t.owner.clone(),
        project_group: t.project_group.clone(),
        task_type: t.task_type.clone(),
        status: t.status,
        deleted: false,
        public: t.public,
        labels: t.labels.clone(),
        spec_json: t.spec_json.clone(),
        attempt: 0,
        version: 1,
        created_at_ms: t.created_at_ms,
        updated_at_ms: t.created_at_ms,
        placement: String::new(),
        retries: 0,
        demand: t.demand.clone(),
        status_since_ms: t.created_at_ms,
        run_started_at_ms: None,
    }
}
