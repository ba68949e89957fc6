//! The server's own routes: liveness, its metrics, and the OpenAPI document with a page that renders it.

use crate::auth::{Admin, Caller, PeerOrAdmin};
use crate::error::{ApiError, ApiResult, ProblemBody};
use crate::openapi;
use crate::routes::NoParams;
use crate::schema::view;
use crate::state::AppState;
use crate::views::Millis;
use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// `ok` while the store can write; a 503 problem saying why when it cannot (see
/// [`trainyard_store::Store::write_health`]: no I/O while writes succeed, as this is polled).
pub async fn healthz(State(state): State<AppState>, _: Query<NoParams>) -> Response {
    match state.store.write_health().await {
        Ok(()) => "ok".into_response(),
        Err(why) => {
            let mut resp = ProblemBody::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store-cannot-write",
                "The store cannot write",
                format!("the store cannot write: {why}"),
            )
            .into_response();
            let wait = HeaderValue::from(trainyard_store::PROBE_EVERY.as_secs().max(1));
            resp.headers_mut().insert(header::RETRY_AFTER, wait);
            resp
        }
    }
}

/// `/metrics` on the API's address: an admin's token (Prometheus: `authorization: {credentials_file: ...}`).
/// Tasks and members cannot read the platform's figures. For a scraper without a token, `trainyard up
/// --metrics-listen ADDR` serves the same text on an address of its own ([`open_metrics`]).
pub async fn metrics(
    State(state): State<AppState>,
    _: Query<NoParams>,
    Caller { user, .. }: Caller,
) -> ApiResult<Response> {
    if user.role != "admin" {
        return Err(ApiError::Forbidden(
            "/metrics takes an admin token here; scrapers without one use the address given to trainyard up \
             --metrics-listen"
                .into(),
        ));
    }
    open_metrics(State(state)).await
}

/// The metrics text, for the separate metrics address (no token: that address is for the scraper).
pub async fn open_metrics(State(state): State<AppState>) -> ApiResult<Response> {
    let by_status = state.store.count_by_status().await?;
    let mut resp = state.metrics.render(&by_status, &state.election).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    Ok(resp)
}

pub async fn openapi_document() -> Json<serde_json::Value> {
    Json(openapi::document())
}

pub async fn docs_page() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], openapi::DOCS_PAGE)
}

view! {
    /// The servers on this store: which one leads (runs the control loop, the scheduler and the backend),
    /// since when, with which fencing token, and every server seen lately. A server alone on a SQLite store
    /// leads without a lease (`elected` false).
    pub struct ServerStatus as "ServerStatus" {
        /// The server that answered.
        "thisServer" pub this_server: String,
        /// Whether servers on this store elect a leader (PostgreSQL) or one serves alone (SQLite).
        pub elected: bool,
        /// The lease's holder, or null before any server took it.
        pub leader: Option<LeaderView>,
        pub servers: Vec<ServerView>,
    }
}

view! {
    /// The leader's term.
    pub struct LeaderView as "Leader" {
        pub server: String,
        /// Each term has the next token; the leader's writes carry it and the store refuses an older one.
        "fencingToken" pub fencing_token: i64,
        /// When the term began, and when the lease runs out unless renewed (Unix ms, the database's clock).
        "sinceMs" pub since_ms: i64,
        "expiresAtMs" pub expires_at_ms: i64,
        /// Whether the lease runs now (false: it expired, and the next server to try takes it).
        pub live: bool,
    }
}

view! {
    /// A server seen lately.
    pub struct ServerView as "Server" {
        pub id: String,
        /// Where its API answers.
        pub address: String,
        pub host: String,
        pub backend: String,
        pub version: String,
        pub leading: bool,
        "startedAtMs" pub started_at_ms: i64,
        /// Its last sign of life (Unix ms, the database's clock).
        "seenAtMs" pub seen_at_ms: i64,
    }
}

/// `GET /api/v1/server` (admin): who leads, and every server seen within the last 30 s.
pub async fn server_status(
    State(state): State<AppState>,
    _: Query<NoParams>,
    _: Admin,
) -> ApiResult<Json<ServerStatus>> {
    let election = &state.election;
    let servers = if election.elected() {
        state.store.servers(crate::leader::SERVER_GONE_AFTER.as_millis() as i64).await?
    } else {
        // Alone on its store, this server wrote its row once, at its start.
        let mut all = state.store.servers(i64::MAX / 2).await?;
        all.retain(|s| s.id == election.id());
        all
    };
    let lease = state.store.lease().await?;
    let leader_id = if election.elected() {
        lease.held_by(&lease.holder).then(|| lease.holder.clone())
    } else {
        Some(election.id().to_owned())
    };
    let leader = if election.elected() {
        (!lease.holder.is_empty()).then(|| LeaderView {
            server: lease.holder.clone(),
            fencing_token: lease.token,
            since_ms: lease.acquired_at_ms,
            expires_at_ms: lease.expires_at_ms,
            live: lease.expires_at_ms >= lease.now_ms,
        })
    } else {
        let started = servers.iter().find(|s| s.id == election.id()).map_or(0, |s| s.started_at_ms);
        Some(LeaderView {
            server: election.id().to_owned(),
            fencing_token: 0,
            since_ms: started,
            expires_at_ms: 0,
            live: true,
        })
    };
    Ok(Json(ServerStatus {
        this_server: election.id().to_owned(),
        elected: election.elected(),
        leader,
        servers: servers
            .into_iter()
            .map(|s| ServerView {
                leading: leader_id.as_deref() == Some(s.id.as_str()),
                id: s.id,
                address: s.address,
                host: s.host,
                backend: s.backend,
                version: s.version,
                started_at_ms: s.started_at_ms,
                seen_at_ms: s.seen_at_ms,
            })
            .collect(),
    }))
}

view! {
    /// What the leader's control loop shows of waiting tasks (queue positions and reasons, starting tasks'
    /// waits), for the other servers on the store to show as well.
    pub struct ServerBoards as "ServerBoards" {
        /// Changes whenever either board does (and with each term).
        pub version: String,
        /// The boards are as of `since`, the version the caller has: the lists are empty.
        pub unchanged: bool,
        pub queued: Vec<BoardQueued>,
        pub starting: Vec<BoardStarting>,
    }
}

view! {
    /// A queued task's place in line and why it waits.
    pub struct BoardQueued as "BoardQueued" {
        "taskId" pub task_id: String,
        pub position: u32,
        "positionInGroup" pub position_in_group: u32,
        pub reason: String,
    }
}

view! {
    /// What a starting attempt waits for.
    pub struct BoardStarting as "BoardStarting" {
        "taskId" pub task_id: String,
        pub attempt: i64,
        pub reason: String,
        "sinceMs" pub since_ms: i64 => Millis,
    }
}

/// The query of `GET /api/v1/server/boards`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoardsQuery {
    since: Option<String>,
}

/// `GET /api/v1/server/boards` (the other servers on the store, or an admin): the leader's queue and start
/// boards. A server that does not lead answers 409 (its boards are another server's, or none).
pub async fn server_boards(
    State(state): State<AppState>,
    Query(q): Query<BoardsQuery>,
    _: PeerOrAdmin,
) -> ApiResult<Json<ServerBoards>> {
    let Some(term) = state.election.leading() else {
        return Err(ApiError::Conflict(
            "this server does not lead: the leader has the boards (GET /api/v1/server names it)".into(),
        ));
    };
    let (qv, queued) = state.queue.snapshot();
    let (sv, starting) = state.starts.snapshot();
    let version = format!("{term}.{qv}.{sv}");
    if q.since.as_deref() == Some(version.as_str()) {
        return Ok(Json(ServerBoards { version, unchanged: true, queued: Vec::new(), starting: Vec::new() }));
    }
    Ok(Json(ServerBoards {
        version,
        unchanged: false,
        queued: queued
            .into_iter()
            .map(|(id, q)| BoardQueued {
                task_id: id.to_string(),
                position: q.position,
                position_in_group: q.position_in_group,
                reason: q.reason.to_string(),
            })
            .collect(),
        starting: starting
            .into_iter()
            .map(|(id, w)| BoardStarting {
                task_id: id,
                attempt: w.attempt,
                reason: w.reason,
                since_ms: w.since_ms,
            })
            .collect(),
    }))
}
