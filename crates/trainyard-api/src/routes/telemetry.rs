//! What a task tells while and after it runs: its events, its replicas' logs (a read, or a stream) and
//! their metrics.

use crate::auth::{Caller, visible_task};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::views::{AttemptReplicas, EventView, Items, MetricsView, ReplicaName, Series};
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;
use trainyard_runtime::{AttemptKey, Backend, LogChunk};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    after: Option<u64>,
}

/// Most events one answer holds (`after=SEQ` goes on from the last).
const EVENTS_PAGE: u32 = 1000;

pub async fn task_events(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<EventsQuery>,
    Caller { user, .. }: Caller,
) -> ApiResult<Json<Items<EventView>>> {
    let t = visible_task(&state, &user, &id).await?;
    let events = state
        .store
        .list_events(&t.id, i64::try_from(q.after.unwrap_or(0)).unwrap_or(i64::MAX), EVENTS_PAGE)
        .await?;
    let items = events
        .into_iter()
        .map(|e| EventView {
            seq: e.seq,
            attempt: e.attempt,
            at_ms: e.at_ms,
            reason: e.reason,
            message: e.message,
        })
        .collect::<Vec<_>>();
    Ok(Json(items.into()))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogsQuery {
    replica: Option<String>,
    attempt: Option<u32>,
    #[serde(default)]
    offset: u64,
    #[serde(default)]
    follow: bool,
}

/// Most bytes of log one plain read returns (the response says where to go on).
const LOG_READ_MAX: usize = 4 << 20;
/// Most bytes of log one step of a followed stream reads.
const LOG_FOLLOW_READ_MAX: usize = 256 << 10;
/// How long a followed stream waits before looking for more of a quiet log.
const LOG_FOLLOW_POLL: Duration = Duration::from_millis(100);

/// Without `replica`: the replicas of each attempt. With it: that replica's log (`attempt` defaults to the
/// latest), as plain text from `offset` (`X-Next-Offset` says where to go on), or with `follow=true` as
/// server-sent events, one `data:` per line, until the replica ends.
pub async fn task_logs(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<LogsQuery>,
    Caller { user, .. }: Caller,
) -> ApiResult<Response> {
    let t = visible_task(&state, &user, &id).await?;
    let Some(replica) = q.replica else {
        let mut attempts = Vec::new();
        for attempt in (0..=t.attempt).rev() {
            let key = AttemptKey { task_id: t.id.clone(), attempt };
            let replicas: Vec<ReplicaName> = state
                .backend
                .replicas(&key)
                .await
                .into_iter()
                .map(|(name, role)| ReplicaName { name, role })
                .collect();
            if !replicas.is_empty() {
                attempts.push(AttemptReplicas { attempt, replicas });
            }
        }
        return Ok(Json(Items::from(attempts)).into_response());
    };
    let key = AttemptKey { task_id: t.id.clone(), attempt: q.attempt.map_or(t.attempt, i64::from) };
    let first = state.backend.read_log(&key, &replica, q.offset, LOG_READ_MAX).await;
    if first.missing {
        return Err(ApiError::NotFoundWhat(format!(
            "{} has no replica {replica} in attempt {}; GET /api/v1/tasks/{}/logs lists them",
            t.name, key.attempt, t.id
        )));
    }
    if !q.follow {
        let mut r = first.data.into_response();
        let h = r.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        h.insert("x-next-offset", HeaderValue::from(first.next));
        h.insert("x-log-ended", HeaderValue::from_static(if first.ended { "true" } else { "false" }));
        return Ok(r);
    }
    use axum::response::sse::{Event, KeepAlive, Sse};
    let backend = state.backend.clone();
    let stream = futures_util::stream::unfold(Some(first), move |chunk| {
        let (backend, key, replica) = (backend.clone(), key.clone(), replica.clone());
        async move {
            let mut chunk = chunk?;
            while chunk.data.is_empty() && !chunk.ended {
                tokio::time::sleep(LOG_FOLLOW_POLL).await;
                chunk = backend.read_log(&key, &replica, chunk.next, LOG_FOLLOW_READ_MAX).await;
            }
            if chunk.data.is_empty() {
                let end = Event::default().event("end").data("the replica ended");
                return Some((vec![Ok::<_, std::convert::Infallible>(end)], None));
            }
            let events: Vec<_> =
                String::from_utf8_lossy(&chunk.data).lines().map(|l| Ok(Event::default().data(l))).collect();
            let next = LogChunk { data: Vec::new(), next: chunk.next, ended: false, missing: false };
            Some((events, Some(next)))
        }
    });
    use futures_util::StreamExt;
    let flat = stream.flat_map(futures_util::stream::iter);
    Ok(Sse::new(flat).keep_alive(KeepAlive::default()).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsQuery {
    attempt: Option<u32>,
    /// Only samples after this Unix time (ms).
    #[serde(default)]
    since: u64,
    /// Only this metric.
    name: Option<String>,
}

/// The task's metrics (latest attempt unless `attempt`): one series per replica, metric and label set, each
/// with its `[atMs, value]` points. Preset resource metrics are named `trainyard_*`.
pub async fn task_metrics(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<MetricsQuery>,
    Caller { user, .. }: Caller,
) -> ApiResult<Json<MetricsView>> {
    let t = visible_task(&state, &user, &id).await?;
    let key = AttemptKey { task_id: t.id.clone(), attempt: q.attempt.map_or(t.attempt, i64::from) };
    let mut series: BTreeMap<(String, String, String), Series> = BTreeMap::new();
    for p in state.backend.read_metrics(&key, q.since).await {
        if q.name.as_ref().is_some_and(|n| *n != p.name) {
            continue;
        }
        let labels = serde_json::to_string(&p.labels).unwrap_or_default();
        let entry = series.entry((p.replica.clone(), p.name.clone(), labels)).or_insert_with(|| Series {
            replica: p.replica,
            name: p.name,
            labels: p.labels,
            points: Vec::new(),
        });
        entry.points.push((p.at_ms, p.value));
    }
    Ok(Json(MetricsView { attempt: key.attempt, series: series.into_values().collect() }))
}
