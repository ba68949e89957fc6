//! The store's edge with SQL: the column lists, rows read into the model's types, and values bound to
//! parameters.

use crate::model::{Accelerator, AlarmDelivery, Event, ReplicaShape, TaskDemand, TaskRecord, User};
use crate::{Result, StoreError};
use sqlx::Row;
use sqlx::any::AnyRow;
use trainyard_core::lifecycle::Status;

pub(crate) const TASK_COLUMNS: &str = "id, name, owner, project_group, task_type, status, public, labels, spec, attempt, \
                            version, created_at_ms, updated_at_ms, placement, retries, demand, accelerator, \
                            status_since_ms, run_started_at_ms";
/// What a read of a task selects: its columns and whether it was deleted.
pub(crate) const TASK_READ: &str = "id, name, owner, project_group, task_type, status, public, labels, spec, attempt, \
                            version, created_at_ms, updated_at_ms, placement, retries, demand, accelerator, \
                            status_since_ms, run_started_at_ms, deleted";

/// A demand as its two columns: `demand` (JSON: the options and each shape as `[replicas, gpus, vcpus,
/// memoryMib]`, short, as every list row carries it) and `accelerator`; both empty when unknown.
pub(crate) fn demand_columns(d: Option<&TaskDemand>) -> (String, &'static str) {
    let Some(d) = d else { return (String::new(), "") };
    let shapes: Vec<[u64; 4]> =
        d.shapes.iter().map(|s| [u64::from(s.replicas), s.gpus, s.vcpus, s.memory_mib]).collect();
    (serde_json::json!({"options": d.options, "shapes": shapes}).to_string(), d.accelerator.as_str())
}

/// The demand of a row, from its two columns.
fn demand_of(json: &str, accelerator: &str) -> Result<Option<TaskDemand>> {
    if json.is_empty() {
        return Ok(None);
    }
    let corrupt = || StoreError::Corrupt(format!("demand {json:?} ({accelerator:?})"));
    let v: serde_json::Value = serde_json::from_str(json).map_err(|_| corrupt())?;
    let options = v["options"].as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(corrupt)?;
    let mut shapes = Vec::new();
    for s in v["shapes"].as_array().ok_or_else(corrupt)? {
        let n = |i: usize| s.get(i).and_then(serde_json::Value::as_u64).ok_or_else(corrupt);
        let replicas = u32::try_from(n(0)?).map_err(|_| corrupt())?;
        shapes.push(ReplicaShape { replicas, gpus: n(1)?, vcpus: n(2)?, memory_mib: n(3)? });
    }
    let accelerator = Accelerator::from_name(accelerator).ok_or_else(corrupt)?;
    Ok(Some(TaskDemand { shapes, options, accelerator }))
}

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
        demand: demand_of(&r.try_get::<String, _>("demand")?, &r.try_get::<String, _>("accelerator")?)?,
        status_since_ms: r.try_get("status_since_ms")?,
        run_started_at_ms: Some(r.try_get::<i64, _>("run_started_at_ms")?).filter(|ms| *ms > 0),
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
