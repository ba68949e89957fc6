//! Reading tasks and their events; and the writes to a task that are not status changes: deletion, a
//! migration of how its spec is stored, the nodes its next attempts avoid.

use crate::group_commit::Value;
use crate::model::{Event, MAX_PAGE, TaskRecord, TaskVersion};
use crate::rows::{TASK_READ, event_from_row, placeholders, status_of, task_from_row};
use crate::{Result, Store, StoreError};
use sqlx::Row;
use std::collections::BTreeMap;
use trainyard_core::lifecycle::Status;

impl Store {
    /// A task by id (deleted ones included: their history is kept).
    pub async fn get_task(&self, id: &str) -> Result<Option<TaskRecord>> {
        let row = sqlx::query(&format!("SELECT {TASK_READ} FROM tasks WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(task_from_row).transpose()
    }

    /// A task's events in order, after `after_seq`.
    pub async fn list_events(&self, task_id: &str, after_seq: i64, limit: u32) -> Result<Vec<Event>> {
        let rows = sqlx::query(
            "SELECT seq, task_id, attempt, at_ms, reason, message FROM task_events \
             WHERE task_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        )
        .bind(task_id)
        .bind(after_seq)
        .bind(i64::from(limit.clamp(1, 10 * MAX_PAGE)))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(event_from_row).collect()
    }

    /// Tasks (deleted ones included) whose stored spec contains `needle` (no `%` or `_` in it): a full
    /// scan, for one-time migrations of stored specs.
    pub async fn tasks_with_spec_containing(&self, needle: &str) -> Result<Vec<TaskRecord>> {
        let rows = sqlx::query(&format!("SELECT {TASK_READ} FROM tasks WHERE spec LIKE $1 ORDER BY id"))
            .bind(format!("%{needle}%"))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(task_from_row).collect()
    }

    /// Rewrites a task's stored spec (a migration of how it is stored, never a change of what it says:
    /// specs are otherwise immutable, and readers may keep them).
    pub async fn replace_spec(&self, id: &str, spec_json: &str) -> Result<()> {
        self.write(async |conn| {
            let changed = sqlx::query("UPDATE tasks SET spec = $1 WHERE id = $2")
                .bind(spec_json)
                .bind(id)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            if changed == 0 { Err(StoreError::NotFound(id.to_owned())) } else { Ok(()) }
        })
        .await
    }

    /// Whether a task was deleted (false for one that does not exist).
    pub async fn is_deleted(&self, id: &str) -> Result<bool> {
        let row = sqlx::query("SELECT deleted FROM tasks WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.try_get::<i64, _>(0)).transpose()?.is_some_and(|d| d != 0))
    }

    /// Marks a task deleted: it leaves lists, its record and history stay.
    pub async fn delete_task(&self, id: &str, at_ms: i64) -> Result<()> {
        self.write(async |conn| {
            let changed = sqlx::query(
                "UPDATE tasks SET deleted = 1, version = version + 1, updated_at_ms = $1 WHERE id = $2",
            )
            .bind(at_ms)
            .bind(id)
            .execute(&mut *conn)
            .await?
            .rows_affected();
            if changed == 0 { Err(StoreError::NotFound(id.to_owned())) } else { Ok(()) }
        })
        .await
    }

    /// Like [`Store::tasks_in_status`], deleted tasks included (a deleted task may still hold resources while
    /// its attempt stops), with `spec_json` left empty: for callers that keep specs (which never change)
    /// already, and fetch one with [`Store::get_task`] only for a task they have not seen.
    pub async fn tasks_in_status_without_spec(&self, statuses: &[Status]) -> Result<Vec<TaskRecord>> {
        self.tasks_where_status(statuses, &TASK_READ.replace("spec,", "'' AS spec,"), true).await
    }

    /// Tasks changed at or after `since_ms` (by `updated_at_ms`), specs left out, deleted ones included as
    /// their last state: what an incremental reader of the active set needs.
    pub async fn tasks_updated_since(&self, since_ms: i64) -> Result<Vec<TaskRecord>> {
        let columns = TASK_READ.replace("spec,", "'' AS spec,");
        let rows = sqlx::query(&format!(
            "SELECT {columns} FROM tasks WHERE updated_at_ms >= $1 ORDER BY updated_at_ms, id"
        ))
        .bind(since_ms)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(task_from_row).collect()
    }

    /// Which tasks changed at or after `since_ms` (deleted ones included): a light first read for an incremental reader, which then fetches with
    /// [`Store::tasks_without_spec`] only the records it does not have at that version.
    pub async fn versions_updated_since(&self, since_ms: i64) -> Result<Vec<TaskVersion>> {
        const SQL: &str =
            "SELECT id, created_at_ms, version, status, deleted FROM tasks WHERE updated_at_ms >= $1";
        if let Some(reader) = &self.reader {
            return reader.versions(SQL.into(), vec![Value::Int(since_ms)]).await;
        }
        let rows = sqlx::query(SQL).bind(since_ms).fetch_all(&self.pool).await?;
        rows.iter().map(version_from_row).collect()
    }

    /// The versions of the tasks (deleted ones included) whose status is one of `statuses`, as
    /// [`Store::versions_updated_since`] gives them.
    pub async fn versions_in_status(&self, statuses: &[Status]) -> Result<Vec<TaskVersion>> {
        if statuses.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT id, created_at_ms, version, status, deleted FROM tasks WHERE status IN ({})",
            placeholders(statuses.len())
        );
        if let Some(reader) = &self.reader {
            return reader.versions(sql, statuses.iter().map(|s| Value::Text(s.as_str())).collect()).await;
        }
        let mut q = sqlx::query(&sql);
        for s in statuses {
            q = q.bind(s.as_str());
        }
        let rows = q.fetch_all(&self.pool).await?;
        rows.iter().map(version_from_row).collect()
    }

    /// The records of these tasks (deleted ones included), specs left out; missing ids are left out.
    pub async fn tasks_without_spec(&self, ids: &[&str]) -> Result<Vec<TaskRecord>> {
        // Short lists: binding `$N` parameters costs time in the statement's length per parameter.
        const IDS_PER_QUERY: usize = 100;
        let columns = TASK_READ.replace("spec,", "'' AS spec,");
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(IDS_PER_QUERY) {
            let sql = format!("SELECT {columns} FROM tasks WHERE id IN ({})", placeholders(chunk.len()));
            let mut q = sqlx::query(&sql);
            for id in chunk {
                q = q.bind(*id);
            }
            for row in q.fetch_all(&self.pool).await? {
                out.push(task_from_row(&row)?);
            }
        }
        Ok(out)
    }

    /// Records that a task's next attempts leave `node` out (node replacement after a hardware error or a
    /// failed precheck). Recording it again changes nothing.
    pub async fn avoid_node(&self, task_id: &str, node: &str, at_ms: i64) -> Result<()> {
        self.write(async |conn| {
            sqlx::query(
                "INSERT INTO task_avoided_nodes (task_id, node, at_ms) VALUES ($1, $2, $3) \
                 ON CONFLICT (task_id, node) DO NOTHING",
            )
            .bind(task_id)
            .bind(node)
            .bind(at_ms)
            .execute(&mut *conn)
            .await?;
            Ok(())
        })
        .await
    }

    /// The nodes avoided by tasks (not deleted) whose status is one of `statuses`, as (task id, node).
    pub async fn avoided_nodes(&self, statuses: &[Status]) -> Result<Vec<(String, String)>> {
        if statuses.is_empty() {
            return Ok(Vec::new());
        }
        let marks = placeholders(statuses.len());
        // Driven from the avoided nodes (a few rows), each task looked up by id. As a join, SQLite's planner
        // (no statistics) walked every task in the statuses and looked for its avoided nodes: at 140,000
        // active tasks, 16 ms in the sqlite3 shell against 0.1 ms this way, on every full sync.
        let sql = format!(
            "SELECT a.task_id, a.node FROM task_avoided_nodes a WHERE EXISTS (SELECT 1 FROM tasks t \
             WHERE t.id = a.task_id AND t.deleted = 0 AND t.status IN ({})) ORDER BY a.task_id, a.node",
            marks
        );
        let mut q = sqlx::query(&sql);
        for s in statuses {
            q = q.bind(s.as_str());
        }
        let rows = q.fetch_all(&self.pool).await?;
        rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
    }

    /// The stored specs of the tasks given (those that exist), by id: one query per few hundred ids.
    pub async fn specs_of(&self, ids: &[&str]) -> Result<BTreeMap<String, String>> {
        // Short lists: binding `$N` parameters costs time in the statement's length per parameter.
        const IDS_PER_QUERY: usize = 100;
        let mut out = BTreeMap::new();
        for chunk in ids.chunks(IDS_PER_QUERY) {
            let marks = placeholders(chunk.len());
            let sql = format!("SELECT id, spec FROM tasks WHERE id IN ({})", marks);
            let mut q = sqlx::query(&sql);
            for id in chunk {
                q = q.bind(*id);
            }
            for row in q.fetch_all(&self.pool).await? {
                out.insert(row.try_get(0)?, row.try_get(1)?);
            }
        }
        Ok(out)
    }

    /// Tasks not deleted whose status is one of `statuses`: what the control loop rebuilds its state from.
    pub async fn tasks_in_status(&self, statuses: &[Status]) -> Result<Vec<TaskRecord>> {
        self.tasks_where_status(statuses, TASK_READ, false).await
    }

    /// `owner`'s tasks, not deleted, whose status is one of `statuses`, oldest first: what an admin's disabling
    /// or deleting of a user acts on.
    pub async fn owner_tasks_in_status(&self, owner: &str, statuses: &[Status]) -> Result<Vec<TaskRecord>> {
        if statuses.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT {TASK_READ} FROM tasks WHERE owner = $1 AND deleted = 0 AND status IN ({}) \
             ORDER BY created_at_ms, id",
            (2..statuses.len() + 2).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
        );
        let mut q = sqlx::query(&sql).bind(owner);
        for s in statuses {
            q = q.bind(s.as_str());
        }
        let rows = q.fetch_all(&self.pool).await?;
        rows.iter().map(task_from_row).collect()
    }

    async fn tasks_where_status(
        &self,
        statuses: &[Status],
        columns: &str,
        deleted_too: bool,
    ) -> Result<Vec<TaskRecord>> {
        if statuses.is_empty() {
            return Ok(Vec::new());
        }
        let marks = placeholders(statuses.len());
        let sql = format!(
            "SELECT {columns} FROM tasks WHERE {} status IN ({}) ORDER BY created_at_ms, id",
            if deleted_too { "" } else { "deleted = 0 AND" },
            marks
        );
        let mut q = sqlx::query(&sql);
        for s in statuses {
            q = q.bind(s.as_str());
        }
        let rows = q.fetch_all(&self.pool).await?;
        rows.iter().map(task_from_row).collect()
    }

    /// Tasks (not deleted) per status.
    pub async fn count_by_status(&self) -> Result<BTreeMap<String, i64>> {
        let rows = sqlx::query("SELECT status, COUNT(*) FROM tasks WHERE deleted = 0 GROUP BY status")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
    }

    /// How many queued tasks (not deleted) `owner` has, counting no further than `at_most`: what the per-user
    /// cap on queued tasks is checked against at every create, through an index of queued tasks only.
    pub async fn queued_count(&self, owner: &str, at_most: i64) -> Result<i64> {
        // The literals match the index's own condition, so both databases use it.
        let sql = format!(
            "SELECT COUNT(*) FROM (SELECT 1 FROM tasks WHERE owner = $1 AND status = '{}' AND deleted = 0 \
             LIMIT $2) q",
            Status::Queued.as_str()
        );
        let row = sqlx::query(&sql).bind(owner).bind(at_most.max(0)).fetch_one(&self.pool).await?;
        Ok(row.try_get(0)?)
    }

    /// Number of stored tasks (deleted ones included).
    pub async fn count_tasks(&self) -> Result<i64> {
        Ok(sqlx::query("SELECT COUNT(*) FROM tasks").fetch_one(&self.pool).await?.try_get(0)?)
    }
}

fn version_from_row(r: &sqlx::any::AnyRow) -> Result<TaskVersion> {
    Ok(TaskVersion {
        id: r.try_get(0)?,
        created_at_ms: r.try_get(1)?,
        version: r.try_get(2)?,
        status: status_of(&r.try_get::<String, _>(3)?)?,
        deleted: r.try_get::<i64, _>(4)? != 0,
    })
}
