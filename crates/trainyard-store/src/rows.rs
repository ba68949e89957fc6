//! The store's edge with SQL: the column lists, rows read into the model's types, and values bound to
//! parameters.

use crate::model::{AlarmDelivery, Event, TaskRecord, User};
use crate::{Result, StoreError};
use sqlx::Row;
use sqlx::any::AnyRow;
use trainyard_core::lifecycle::Status;

pub(crate) const TASK_COLUMNS: &str = "id, name, owner, project_group, task_type, status, public, labels, spec, attempt, \
                            version, created_at_ms, updated_at_ms, placement, retries";
/// What a read of a task selects: its columns and whether it was deleted.
pub(crate) const TASK_READ: &str = "id, name, owner, project_group, task_type, status, public, labels, spec, attempt, \
                            version, created_at_ms, updated_at_ms, placement, retries, deleted";

/// A stored status, read at the store's edge: anything else in the column is corruption, said as such.
pub(crate) fn status_of(s: &str) -> Result<Status> {
    Status::from_name(s).ok_or_else(|| StoreError::Corrupt(format!("task status {s:?}")))
}

/// A user from `SELECT name, role, groups`.
pub(crate) fn user_from_row(r: &AnyRow) -> Result<User> {
    let groups: String = r.try_get(2)?;
    Ok(User {
        name: r.try_get(0)?,
        role: r.try_get(1)?,
        groups: serde_json::from_str(&groups).map_err(|e| StoreError::Corrupt(format!("groups: {e}")))?,
    })
}

pub(crate) fn task_from_row(r: &AnyRow) -> Result<TaskRecord> {
    let labels: String = r.try_get("labels")?;
    Ok(TaskRecord {
        id: r.try_get("id")?,
        name: r.try_get("name")?,
        owner: r.try_get("owner")?,
        project_group: r.try_get("project_group")?,
        task_type: r.try_get("task_type")?,
        status: status_of(&r.try_get::<String, _>("status")?)?,
        deleted: r.try_get::<i64, _>("deleted")? != 0,
        public: r.try_get::<i64, _>("public")? != 0,
        labels: serde_json::from_str(&labels).map_err(|e| StoreError::Corrupt(format!("labels: {e}")))?,
        spec_json: r.try_get("spec")?,
        attempt: r.try_get("attempt")?,
        version: r.try_get("version")?,
        created_at_ms: r.try_get("created_at_ms")?,
        updated_at_ms: r.try_get("updated_at_ms")?,
        placement: r.try_get("placement")?,
        retries: r.try_get("retries")?,
    })
}

pub(crate) fn event_from_row(r: &AnyRow) -> Result<Event> {
    Ok(Event {
        seq: r.try_get("seq")?,
        task_id: r.try_get("task_id")?,
        attempt: r.try_get("attempt")?,
        at_ms: r.try_get("at_ms")?,
        reason: r.try_get("reason")?,
        message: r.try_get("message")?,
    })
}

pub(crate) const DELIVERY_COLUMNS: &str = "id, task_id, attempt, event, url, payload, state, tries, next_at_ms, last_error, created_at_ms, done_at_ms";

pub(crate) fn delivery_from_row(r: &AnyRow) -> Result<AlarmDelivery> {
    Ok(AlarmDelivery {
        id: r.try_get("id")?,
        task_id: r.try_get("task_id")?,
        attempt: r.try_get("attempt")?,
        event: r.try_get("event")?,
        url: r.try_get("url")?,
        payload: r.try_get("payload")?,
        state: r.try_get("state")?,
        tries: r.try_get("tries")?,
        next_at_ms: r.try_get("next_at_ms")?,
        last_error: r.try_get("last_error")?,
        created_at_ms: r.try_get("created_at_ms")?,
        done_at_ms: r.try_get("done_at_ms")?,
    })
}

#[derive(Clone)]
pub(crate) enum Arg {
    Text(String),
    Int(i64),
}

pub(crate) type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

/// Binds `args` in order to the query's `$1`, `$2`, ...
pub(crate) fn bind_all<'q>(mut q: AnyQuery<'q>, args: impl IntoIterator<Item = &'q Arg>) -> AnyQuery<'q> {
    for a in args {
        q = match a {
            Arg::Text(s) => q.bind(s.as_str()),
            Arg::Int(i) => q.bind(*i),
        };
    }
    q
}

/// `$1, $2, ..., $n`: the placeholders of an `IN (...)` list.
pub(crate) fn placeholders(n: usize) -> String {
    (1..=n).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
}
