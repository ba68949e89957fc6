//! The HTTP API: JSON over HTTP, bearer tokens, visibility decided by the store, errors as RFC 9457 problem
//! details (mapped from typed errors in one place, [`ApiError`]), and the control loop ticking in the
//! background.
//!
//! Routes (all under `/api/v1` but `/healthz`, `/metrics`, `/api/openapi.json` and `/api/docs`; the OpenAPI
//! document lists them all, from [`openapi::OPERATIONS`]):
//! - `GET /whoami`
//! - `POST /tasks` (YAML or JSON body; `Idempotency-Key` header), `GET /tasks` (filters, cursor paging)
//! - `GET /tasks/{id}`, `GET /tasks/{id}/events`, `POST /tasks/{id}/stop`, `POST /tasks/{id}/resubmit`,
//!   `DELETE /tasks/{id}`
//! - `GET /catalog`
//! - admin: `PUT /admin/catalog`, `PUT /admin/nodes/{name}`, `GET`/`POST /admin/users`
//!
//! A task the caller may not see answers 404, exactly like one that does not exist, so names do not leak.

#![forbid(unsafe_code)]

pub mod console;
pub mod openapi;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::Mutex;
use trainyard_control::secrets::SecretBox;
use trainyard_control::{CatalogHandle, CommandError, Control, QueueBoard, SubmitError};
use trainyard_core::{Catalog, MAX_DOCUMENT_BYTES, Report};
use trainyard_runtime::{AnyBackend, LogChunk};
use trainyard_store::{Created, Store, StoreError, TaskFilter, TaskRecord, User};

/// The server's own figures, served in Prometheus text format at `/metrics`.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: std::sync::Mutex<MetricsInner>,
}

#[derive(Debug, Default)]
struct MetricsInner {
    /// (method, route, status) -> count
    requests: BTreeMap<(String, String, u16), u64>,
    /// Request durations: counts per bucket upper bound (seconds), then sum and count.
    duration_buckets: [u64; LATENCY_BUCKETS.len()],
    duration_sum_s: f64,
    duration_count: u64,
    ticks: u64,
    tick_sum_s: f64,
    admitted: u64,
    preempted: u64,
    queued: u64,
}

const LATENCY_BUCKETS: [f64; 10] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, MetricsInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn request(&self, method: &str, route: &str, status: u16, took: Duration) {
        let mut m = self.lock();
        *m.requests.entry((method.to_owned(), route.to_owned(), status)).or_default() += 1;
        let s = took.as_secs_f64();
        for (i, b) in LATENCY_BUCKETS.iter().enumerate() {
            if s <= *b {
                m.duration_buckets[i] += 1;
            }
        }
        m.duration_sum_s += s;
        m.duration_count += 1;
    }

    /// Records one control-loop tick.
    pub fn tick(&self, report: &trainyard_control::TickReport, took: Duration) {
        let mut m = self.lock();
        m.ticks += 1;
        m.tick_sum_s += took.as_secs_f64();
        m.admitted += u64::from(report.admitted);
        m.preempted += u64::from(report.preempted);
        m.queued = u64::from(report.waiting);
    }

    fn render(&self, by_status: &BTreeMap<String, i64>) -> String {
        use std::fmt::Write as _;
        let m = self.lock();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP trainyard_tasks Tasks by status (deleted ones excluded).\n# TYPE trainyard_tasks gauge"
        );
        for (status, n) in by_status {
            let _ = writeln!(out, "trainyard_tasks{{status=\"{status}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP trainyard_queue_depth Tasks waiting in the queue at the last tick.\n# TYPE trainyard_queue_depth gauge\ntrainyard_queue_depth {}",
            m.queued
        );
        let _ = writeln!(
            out,
            "# HELP trainyard_admissions_total Attempts admitted.\n# TYPE trainyard_admissions_total counter\ntrainyard_admissions_total {}",
            m.admitted
        );
        let _ = writeln!(
            out,
            "# HELP trainyard_preemptions_total Attempts preempted.\n# TYPE trainyard_preemptions_total counter\ntrainyard_preemptions_total {}",
            m.preempted
        );
        let _ = writeln!(
            out,
            "# HELP trainyard_control_tick_seconds Time spent in control-loop ticks.\n# TYPE trainyard_control_tick_seconds summary\ntrainyard_control_tick_seconds_sum {}\ntrainyard_control_tick_seconds_count {}",
            m.tick_sum_s, m.ticks
        );
        let _ = writeln!(
            out,
            "# HELP trainyard_api_requests_total API requests by route and status.\n# TYPE trainyard_api_requests_total counter"
        );
        for ((method, route, status), n) in &m.requests {
            let _ = writeln!(
                out,
                "trainyard_api_requests_total{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP trainyard_api_request_duration_seconds API request latency.\n# TYPE trainyard_api_request_duration_seconds histogram"
        );
        for (b, n) in LATENCY_BUCKETS.iter().zip(m.duration_buckets) {
            let _ = writeln!(out, "trainyard_api_request_duration_seconds_bucket{{le=\"{b}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "trainyard_api_request_duration_seconds_bucket{{le=\"+Inf\"}} {}",
            m.duration_count
        );
        let _ = writeln!(
            out,
            "trainyard_api_request_duration_seconds_sum {}\ntrainyard_api_request_duration_seconds_count {}",
            m.duration_sum_s, m.duration_count
        );
        out
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    /// The catalog in force; admins replace it through the API.
    pub catalog: CatalogHandle,
    pub secrets: Arc<SecretBox>,
    /// Queue positions and wait reasons, readable without waiting for the control loop.
    pub queue: QueueBoard,
    pub tokens: TokenCache,
    pub metrics: Arc<Metrics>,
    pub control: Arc<Mutex<Control<AnyBackend>>>,
    /// For reading logs (the control loop owns the rest of the backend's conversation).
    pub backend: AnyBackend,
    /// Wakes the control loop at once (a task was created, stopped or resubmitted).
    pub wake: Arc<tokio::sync::Notify>,
    /// Hands created tasks to the control loop (with their parsed specs) without a store read.
    pub arrivals: trainyard_control::Arrivals,
    /// How alarm webhooks are sent (whom https receivers' certificates are checked against).
    pub webhooks: trainyard_control::alarms::Webhooks,
    /// The scheduler's view at the last tick (would-admit, fragmentation, quota), without the loop's lock.
    pub views: trainyard_control::SchedViews,
}

impl AppState {
    /// Everything the server needs, wired together: the control loop over `store` and `backend`, sharing
    /// the catalog, the queue board and the secrets with the API.
    pub fn new(
        store: Store,
        catalog: Catalog,
        backend: AnyBackend,
        secrets: SecretBox,
        config: trainyard_sched::Config,
    ) -> Self {
        let handle = CatalogHandle::new(catalog);
        let control = Control::new(store.clone(), backend.clone(), handle.clone(), config, secrets.clone());
        AppState {
            store,
            catalog: handle,
            secrets: Arc::new(secrets),
            queue: control.queue_board(),
            arrivals: control.arrivals(),
            views: control.views(),
            webhooks: trainyard_control::alarms::Webhooks::system(),
            tokens: Default::default(),
            metrics: Default::default(),
            control: Arc::new(Mutex::new(control)),
            backend,
            wake: Arc::default(),
        }
    }
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").finish_non_exhaustive()
    }
}

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// The hash under which a token is stored.
pub fn token_hash(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new random token, from the operating system's generator.
pub fn new_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut buf = [0u8; 24];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(format!("ty_{}", buf.iter().map(|b| format!("{b:02x}")).collect::<String>()))
}

/// Every error a handler returns, mapped to an HTTP status and a problem document here and nowhere else.
#[derive(Debug)]
pub enum ApiError {
    Unauthorized,
    /// The token is good but its user is disabled.
    Disabled(String),
    NotFound,
    /// Not found, with a detail that leaks nothing (the task itself is visible).
    NotFoundWhat(String),
    Forbidden(String),
    Invalid(Report),
    Conflict(String),
    BadRequest(String),
    Internal(String),
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::IdempotencyConflict => {
                ApiError::Conflict("this Idempotency-Key was used for a different request".into())
            }
            StoreError::NotFound(_) => ApiError::NotFound,
            StoreError::VersionConflict { .. } => {
                ApiError::Conflict("the task changed meanwhile; try again".into())
            }
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl From<CommandError> for ApiError {
    fn from(e: CommandError) -> Self {
        match e {
            CommandError::NotFound(_) => ApiError::NotFound,
            CommandError::WrongState { .. } => ApiError::Conflict(e.to_string()),
            CommandError::Store(s) => s.into(),
            CommandError::Corrupt(..) => ApiError::Internal(e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code, title, detail, extra) = match self {
            ApiError::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "Missing or unknown token",
                "send `Authorization: Bearer <token>`".to_owned(),
                Value::Null,
            ),
            ApiError::Disabled(name) => (
                StatusCode::FORBIDDEN,
                "account-disabled",
                "Account disabled",
                format!("user {name} is disabled, and so are its tokens; an admin can enable it again"),
                Value::Null,
            ),
            ApiError::NotFound => (
                StatusCode::NOT_FOUND,
                "not-found",
                "Not found",
                "no such task, or it is not visible to you".to_owned(),
                Value::Null,
            ),
            ApiError::NotFoundWhat(detail) => {
                (StatusCode::NOT_FOUND, "not-found", "Not found", detail, Value::Null)
            }
            ApiError::Forbidden(d) => (StatusCode::FORBIDDEN, "forbidden", "Not allowed", d, Value::Null),
            ApiError::Invalid(report) => {
                let n = report.errors().count();
                let problems = serde_json::to_value(&report.problems).unwrap_or(Value::Null);
                (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid-task",
                    "The task has problems",
                    format!("{n} problem(s) to fix; each has a path, a code and what to change"),
                    json!({ "problems": problems }),
                )
            }
            ApiError::Conflict(d) => (StatusCode::CONFLICT, "conflict", "Conflict", d, Value::Null),
            ApiError::BadRequest(d) => {
                (StatusCode::BAD_REQUEST, "bad-request", "Bad request", d, Value::Null)
            }
            ApiError::Internal(d) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "internal", "Internal error", d, Value::Null)
            }
        };
        let mut body = json!({
            "type": format!("https://trainyard.dev/problems/{code}"),
            "title": title,
            "status": status.as_u16(),
            "detail": detail,
        });
        if let (Value::Object(b), Value::Object(e)) = (&mut body, extra) {
            b.extend(e);
        }
        let mut resp = (status, Json(body)).into_response();
        resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        resp
    }
}

type ApiResult<T> = Result<T, ApiError>;

async fn caller(state: &AppState, headers: &HeaderMap) -> ApiResult<User> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or(ApiError::Unauthorized)?;
    let hash = token_hash(token.trim());
    let (user, disabled) = match state.tokens.get(&hash) {
        Some(found) => found,
        None => {
            let found = state.store.token_account(&hash).await?.ok_or(ApiError::Unauthorized)?;
            state.tokens.put(hash, found.clone());
            found
        }
    };
    if disabled {
        return Err(ApiError::Disabled(user.name));
    }
    Ok(user)
}

/// Recently seen tokens and their users (and whether the user is disabled), so a request costs no store
/// lookup to authenticate. An entry lives [`TOKEN_CACHE_TTL`]: a revoked token, a disabled user or a changed
/// role takes effect within that time on every server sharing the store, and at once on the server that
/// made the change ([`TokenCache::forget_user`]).
#[derive(Debug, Clone, Default)]
pub struct TokenCache(Arc<std::sync::RwLock<BTreeMap<String, (Account, std::time::Instant)>>>);

/// A token's user and whether that user is disabled.
type Account = (User, bool);

/// How long an authenticated token is trusted without asking the store again.
pub const TOKEN_CACHE_TTL: Duration = Duration::from_secs(5);
/// Cached tokens at most (a bound on memory; the cache is cleared when full).
const TOKEN_CACHE_MAX: usize = 10_000;

impl TokenCache {
    fn get(&self, hash: &str) -> Option<Account> {
        let map = self.0.read().unwrap_or_else(|e| e.into_inner());
        map.get(hash).filter(|(_, at)| at.elapsed() < TOKEN_CACHE_TTL).map(|(u, _)| u.clone())
    }

    /// Drops every cached token of a user (their tokens or their account changed).
    pub fn forget_user(&self, name: &str) {
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, ((u, _), _)| u.name != name);
    }

    fn put(&self, hash: String, user: Account) {
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        if map.len() >= TOKEN_CACHE_MAX {
            map.clear();
        }
        map.insert(hash, (user, std::time::Instant::now()));
    }
}

/// A task as the API shows it: the spec with hidden values masked, its queue position while queued.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskView {
    pub id: String,
    pub name: String,
    pub owner: String,
    pub project_group: String,
    #[serde(rename = "type")]
    pub task_type: String,
    pub status: String,
    pub public: bool,
    pub labels: BTreeMap<String, String>,
    pub attempt: i64,
    pub retries: i64,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub placement: Value,
    pub queue: Option<QueueView>,
    pub spec: Value,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueView {
    pub position: u32,
    pub position_in_group: u32,
    pub reason: String,
}

/// Which spec a view shows (always masked).
enum Spec<'a> {
    /// None: lists leave it out.
    Omit,
    /// The stored one.
    Stored,
    /// This one, already at hand.
    This(&'a trainyard_core::TrainingTask),
}

/// The view of a task.
fn view(state: &AppState, t: &TaskRecord, spec: Spec) -> TaskView {
    let masked =
        |task: &trainyard_core::TrainingTask| serde_json::to_value(task.masked()).unwrap_or(Value::Null);
    let spec = match spec {
        Spec::Omit => Value::Null,
        Spec::This(task) => masked(task),
        Spec::Stored => trainyard_core::parse(t.spec_json.as_bytes()).0.as_ref().map_or(Value::Null, masked),
    };
    let queue = if t.status == "Queued" {
        state.queue.get(&t.id).map(|q| QueueView {
            position: q.position,
            position_in_group: q.position_in_group,
            reason: q.reason.to_string(),
        })
    } else {
        None
    };
    TaskView {
        id: t.id.clone(),
        name: t.name.clone(),
        owner: t.owner.clone(),
        project_group: t.project_group.clone(),
        task_type: t.task_type.clone(),
        status: t.status.clone(),
        public: t.public,
        labels: t.labels.clone(),
        attempt: t.attempt,
        retries: t.retries,
        created_at_ms: t.created_at_ms,
        updated_at_ms: t.updated_at_ms,
        placement: serde_json::from_str(&t.placement).unwrap_or(Value::Null),
        queue,
        spec,
    }
}

/// The task, if the caller may see it; 404 otherwise.
async fn visible_task(state: &AppState, user: &User, id: &str) -> ApiResult<TaskRecord> {
    let t = state.store.get_task(id).await?.ok_or(ApiError::NotFound)?;
    if state.store.visible(&t, &user.viewer()).await? { Ok(t) } else { Err(ApiError::NotFound) }
}

/// The task, if the caller may operate it: owner, admin or shared with operate rights.
async fn operable_task(state: &AppState, user: &User, id: &str) -> ApiResult<TaskRecord> {
    let t = visible_task(state, user, id).await?;
    if user.role == "admin" || t.owner == user.name || state.store.may_operate(&t.id, &user.name).await? {
        Ok(t)
    } else {
        Err(ApiError::Forbidden(format!(
            "you may see {} but not operate it; ask its owner to share it with operate rights",
            t.name
        )))
    }
}

async fn whoami(State(state): State<AppState>, headers: HeaderMap) -> ApiResult<Json<Value>> {
    let u = caller(&state, &headers).await?;
    Ok(Json(json!({ "name": u.name, "role": u.role, "groups": u.groups })))
}

/// Checks a task document without creating it: every problem, and the demand of each instance-spec option
/// when it is valid. The console calls it as the user types.
async fn validate_task(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<Value>> {
    let user = caller(&state, &headers).await?;
    let catalog = state.catalog.get();
    let mut checked = trainyard_core::check(&body, &catalog);
    if let Some(task) = &checked.task {
        let found = webhook_problems(&state, "spec.advanced.alarms", &task.spec.advanced.alarms).await;
        checked.report.problems.extend(found.problems);
    }
    let demand = checked.valid_task().map(|task| {
        let lookup = |name: &str| catalog.instance_specs.get(name);
        trainyard_core::demand_options(&task.spec, &lookup).ok()
    });
    // The admission answer speaks of the task's group (what it has left, what it waits behind): only for a
    // group the caller belongs to, as a create would be refused anyway.
    let foreign = checked.valid_task().and_then(|t| may_use_group(&user, &t.metadata.project_group).err());
    let (admission, fragmentation) = match checked.valid_task() {
        Some(task) if foreign.is_some() => {
            let reason = format!(
                "you are not a member of project group {}; a task can go to {}",
                task.metadata.project_group,
                if user.groups.is_empty() { "none of the groups".to_owned() } else { user.groups.join(", ") }
            );
            (json!({"now": false, "reason": reason}), Value::Null)
        }
        Some(task) => {
            // A scheduling cycle over the last tick's view: CPU work that grows with the queue, so it runs off
            // the async workers, and without the control loop's lock.
            let (views, task) = (state.views.clone(), task.clone());
            let ((now, why), frag) = tokio::task::spawn_blocking(move || {
                (views.would_admit(&task, now_ms().max(0) as u64), views.fragmentation(&task))
            })
            .await
            .map_err(|e| ApiError::Internal(format!("the admission check failed: {e}")))?;
            let frag: Vec<Value> = frag
                .into_iter()
                .map(|(spec, f)| json!({"spec": spec, "replicasFit": f.replicas_fit, "nodesWithRoom": f.nodes_with_room, "freeUnits": f.free_units_histogram}))
                .collect();
            (json!({"now": now, "reason": why}), Value::Array(frag))
        }
        None => (Value::Null, Value::Null),
    };
    // The document as the decoder read it (defaults filled in), as JSON for a form and as YAML for an editor.
    let (task, yaml) = match &checked.task {
        Some(t) => (serde_json::to_value(t).unwrap_or(Value::Null), Value::String(t.to_yaml())),
        None => (Value::Null, Value::Null),
    };
    Ok(Json(json!({
        "valid": checked.report.is_ok(),
        "problems": checked.report.problems,
        "demand": demand.flatten(),
        "admission": admission,
        "fragmentation": fragmentation,
        "task": task,
        "yaml": yaml,
    })))
}

/// Webhook destinations the server will not send to (loopback, private, ... unless allowed), as problems at
/// `base[i].webhook`.
async fn webhook_problems(
    state: &AppState,
    base: &str,
    subs: &[trainyard_core::spec::AlarmSubscription],
) -> Report {
    let mut report = Report::default();
    for (i, sub) in subs.iter().enumerate() {
        if let Err(why) = state.webhooks.policy().check_url(&sub.webhook).await {
            report.error(format!("{base}[{i}].webhook"), trainyard_core::Code::RestrictedAddress, why);
        }
    }
    report
}

/// [`webhook_problems`] for a task's own alarms, as a refusal.
async fn check_task_webhooks(state: &AppState, task: &trainyard_core::TrainingTask) -> ApiResult<()> {
    let report = webhook_problems(state, "spec.advanced.alarms", &task.spec.advanced.alarms).await;
    if report.is_ok() { Ok(()) } else { Err(ApiError::Invalid(report)) }
}

/// Membership: a task goes to one of the caller's groups (admins may use any). The one check for create and
/// clone.
fn may_use_group(user: &User, group: &str) -> ApiResult<()> {
    if user.role == "admin" || user.groups.iter().any(|g| g == group) {
        return Ok(());
    }
    let yours = if user.groups.is_empty() { "none".to_owned() } else { user.groups.join(", ") };
    Err(ApiError::Forbidden(format!(
        "you are not a member of project group {group}; your groups: {yours} (a clone goes to one of them: \
         POST .../clone with {{\"projectGroup\": GROUP}})"
    )))
}

/// What the catalog keeps from some users beyond the validator's group rules: the `host` image (this
/// machine's own system directories) is for admins, and for members only when its catalog entry lists the
/// task's project group.
fn may_use_catalog(state: &AppState, user: &User, task: &trainyard_core::TrainingTask) -> ApiResult<()> {
    use trainyard_core::catalog::HOST_IMAGE;
    if user.role == "admin" || task.spec.environment.image != HOST_IMAGE {
        return Ok(());
    }
    let catalog = state.catalog.get();
    let groups = catalog.images.get(HOST_IMAGE).map(|i| i.project_groups.clone()).unwrap_or_default();
    if groups.contains(&task.metadata.project_group) {
        return Ok(());
    }
    let listed = if groups.is_empty() { "none: admins only".to_owned() } else { groups.join(", ") };
    Err(ApiError::Forbidden(format!(
        "image {HOST_IMAGE} is this machine's own system directories, for admins and the project groups its \
         catalog entry lists (images.{HOST_IMAGE}.projectGroups: {listed}), and project group {} is not one of \
         them; choose another image, or ask an admin",
        task.metadata.project_group
    )))
}

/// The longest `Idempotency-Key` accepted.
pub const IDEMPOTENCY_KEY_MAX_BYTES: usize = 255;

async fn create_task(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> ApiResult<Response> {
    let user = caller(&state, &headers).await?;
    let key = headers.get("idempotency-key").map(|v| v.to_str().map(str::to_owned)).transpose();
    let key = key.map_err(|_| ApiError::BadRequest("Idempotency-Key must be ASCII".into()))?;
    if let Some(k) = &key {
        // An empty key would make every keyless retry of a client "the same request".
        if k.trim().is_empty() || k.len() > IDEMPOTENCY_KEY_MAX_BYTES {
            return Err(ApiError::BadRequest(format!(
                "Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_MAX_BYTES} visible characters (a UUID is usual), or left out"
            )));
        }
    }
    let refused = |e| match e {
        SubmitError::Invalid(r) => ApiError::Invalid(r),
        SubmitError::Store(s) => s.into(),
    };
    let task = trainyard_control::validate(&state.catalog.get(), &body).map_err(refused)?;
    may_use_group(&user, &task.metadata.project_group)?;
    may_use_catalog(&state, &user, &task)?;
    check_task_webhooks(&state, &task).await?;
    let created = trainyard_control::store_task(
        &state.store,
        &state.secrets,
        &user.name,
        &task,
        &body,
        key.as_deref(),
        now_ms(),
    )
    .await
    .map_err(refused)?;
    if let Created::New(t) = &created {
        state.arrivals.push(t, &task);
    }
    state.wake.notify_one();
    let (status, spec) = match &created {
        Created::New(_) => (StatusCode::CREATED, Spec::This(&task)),
        Created::Existing(_) => (StatusCode::OK, Spec::Stored),
    };
    Ok((status, Json(view(&state, created.task(), spec))).into_response())
}

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    status: Option<String>,
    #[serde(rename = "type")]
    task_type: Option<String>,
    group: Option<String>,
    owner: Option<String>,
    q: Option<String>,
    /// `key=value[,key=value...]`
    labels: Option<String>,
    cursor: Option<String>,
    limit: Option<u32>,
    /// newest (default), oldest, name, updated
    sort: Option<String>,
}

async fn list_tasks(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Value>> {
    let user = caller(&state, &headers).await?;
    let mut labels = Vec::new();
    for pair in q.labels.iter().flat_map(|l| l.split(',')).filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| ApiError::BadRequest(format!("label selector {pair:?} must be key=value")))?;
        labels.push((k.to_owned(), v.to_owned()));
    }
    let sort = match q.sort.as_deref() {
        None | Some("") => trainyard_store::SortOrder::Newest,
        Some(s) => trainyard_store::SortOrder::from_name(s).ok_or_else(|| {
            ApiError::BadRequest(format!("sort {s:?} is not one of newest, oldest, name, updated"))
        })?,
    };
    let filter = TaskFilter {
        sort,
        visible_to: Some(user.viewer()),
        owner: q.owner,
        project_group: q.group,
        status: q.status,
        task_type: q.task_type,
        search: q.q,
        labels,
    };
    let page = state.store.list_tasks(&filter, q.cursor.as_deref(), q.limit.unwrap_or(50)).await.map_err(
        |e| match e {
            StoreError::Corrupt(m) if m.starts_with("bad cursor") => ApiError::BadRequest(m),
            other => other.into(),
        },
    )?;
    let mut items = Vec::with_capacity(page.items.len());
    for t in &page.items {
        items.push(view(&state, t, Spec::Omit));
    }
    Ok(Json(json!({ "items": items, "nextCursor": page.next_cursor })))
}

async fn get_task(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<TaskView>> {
    let user = caller(&state, &headers).await?;
    let t = visible_task(&state, &user, &id).await?;
    Ok(Json(view(&state, &t, Spec::Stored)))
}

#[derive(Debug, Deserialize)]
pub struct EventsQuery {
    after: Option<i64>,
}

async fn task_events(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<EventsQuery>,
) -> ApiResult<Json<Value>> {
    let user = caller(&state, &headers).await?;
    let t = visible_task(&state, &user, &id).await?;
    let events = state.store.list_events(&t.id, q.after.unwrap_or(0), 1000).await?;
    let items: Vec<Value> = events
        .iter()
        .map(|e| json!({ "seq": e.seq, "attempt": e.attempt, "atMs": e.at_ms, "reason": e.reason, "message": e.message }))
        .collect();
    Ok(Json(json!({ "items": items })))
}

#[derive(Debug, Deserialize)]
pub struct LogsQuery {
    replica: Option<String>,
    attempt: Option<i64>,
    #[serde(default)]
    offset: u64,
    #[serde(default)]
    follow: bool,
}

/// Most bytes of log one plain read returns (the response says where to go on).
const LOG_READ_MAX: usize = 4 << 20;

/// Without `replica`: the replicas of each attempt. With it: that replica's log (`attempt` defaults to the
/// latest), as plain text from `offset` (`X-Next-Offset` says where to go on), or with `follow=true` as
/// server-sent events, one `data:` per line, until the replica ends.
async fn task_logs(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<LogsQuery>,
) -> ApiResult<Response> {
    use trainyard_runtime::{AttemptKey, Backend};
    let user = caller(&state, &headers).await?;
    let t = visible_task(&state, &user, &id).await?;
    let Some(replica) = q.replica else {
        let mut attempts = Vec::new();
        for attempt in (0..=t.attempt).rev() {
            let key = AttemptKey { task_id: t.id.clone(), attempt };
            let replicas: Vec<Value> = state
                .backend
                .replicas(&key)
                .await
                .into_iter()
                .map(|(name, role)| json!({"name": name, "role": role}))
                .collect();
            if !replicas.is_empty() {
                attempts.push(json!({"attempt": attempt, "replicas": replicas}));
            }
        }
        return Ok(Json(json!({"items": attempts})).into_response());
    };
    let key = AttemptKey { task_id: t.id.clone(), attempt: q.attempt.unwrap_or(t.attempt) };
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
                tokio::time::sleep(Duration::from_millis(100)).await;
                chunk = backend.read_log(&key, &replica, chunk.next, 256 << 10).await;
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
pub struct MetricsQuery {
    attempt: Option<i64>,
    /// Only samples after this Unix time (ms).
    #[serde(default)]
    since: u64,
    /// Only this metric.
    name: Option<String>,
}

/// The task's metrics (latest attempt unless `attempt`): one series per replica, metric and label set, each
/// with its `[atMs, value]` points. Preset resource metrics are named `trainyard_*`.
async fn task_metrics(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<MetricsQuery>,
) -> ApiResult<Json<Value>> {
    use trainyard_runtime::{AttemptKey, Backend};
    let user = caller(&state, &headers).await?;
    let t = visible_task(&state, &user, &id).await?;
    let key = AttemptKey { task_id: t.id.clone(), attempt: q.attempt.unwrap_or(t.attempt) };
    let mut series: BTreeMap<(String, String, String), (Value, Vec<Value>)> = BTreeMap::new();
    for p in state.backend.read_metrics(&key, q.since).await {
        if q.name.as_ref().is_some_and(|n| *n != p.name) {
            continue;
        }
        let labels = serde_json::to_string(&p.labels).unwrap_or_default();
        let entry = series.entry((p.replica.clone(), p.name.clone(), labels)).or_insert_with(|| {
            (json!({"replica": p.replica, "name": p.name, "labels": p.labels}), Vec::new())
        });
        entry.1.push(json!([p.at_ms, p.value]));
    }
    let items: Vec<Value> = series
        .into_values()
        .map(|(mut head, points)| {
            head["points"] = Value::Array(points);
            head
        })
        .collect();
    Ok(Json(json!({"attempt": key.attempt, "series": items})))
}

async fn stop_task(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<TaskView>> {
    let user = caller(&state, &headers).await?;
    let t = operable_task(&state, &user, &id).await?;
    let updated = state.control.lock().await.stop(&t.id, false, now_ms()).await?;
    state.wake.notify_one();
    Ok(Json(view(&state, &updated, Spec::Stored)))
}

async fn resubmit_task(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<TaskView>> {
    let user = caller(&state, &headers).await?;
    let t = operable_task(&state, &user, &id).await?;
    let updated = state.control.lock().await.resubmit(&t.id, now_ms()).await?;
    state.wake.notify_one();
    Ok(Json(view(&state, &updated, Spec::Stored)))
}

async fn delete_task(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let user = caller(&state, &headers).await?;
    let t = operable_task(&state, &user, &id).await?;
    let control = state.control.lock().await;
    // Whatever runs is stopped first (with the checkpoint notice); the record and history stay.
    match control.stop(&t.id, true, now_ms()).await {
        Ok(_) | Err(CommandError::WrongState { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    state.store.delete_task(&t.id, now_ms()).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn catalog(State(state): State<AppState>, headers: HeaderMap) -> ApiResult<Json<Catalog>> {
    caller(&state, &headers).await?;
    Ok(Json((*state.catalog.get()).clone()))
}

fn admin_only(user: &User) -> ApiResult<()> {
    if user.role == "admin" { Ok(()) } else { Err(ApiError::Forbidden("only admins may do this".into())) }
}

/// The store's name for the catalog document.
pub const CATALOG_SETTING: &str = "catalog";

/// Replaces the catalog (YAML or JSON). It must be consistent in itself; tasks already queued are checked
/// against it at their next scheduling (a task whose pool or specs are gone stays queued).
async fn put_catalog(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Json<Catalog>> {
    let user = caller(&state, &headers).await?;
    admin_only(&user)?;
    let text = String::from_utf8(body.to_vec())
        .map_err(|_| ApiError::BadRequest("the catalog must be UTF-8".into()))?;
    let catalog = Catalog::from_yaml(&text).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    state.store.put_setting(CATALOG_SETTING, &text, now_ms()).await?;
    state.catalog.set(catalog.clone());
    Ok(Json(catalog))
}

#[derive(Debug, Deserialize)]
pub struct NodeStateBody {
    schedulable: Option<bool>,
    failed: Option<bool>,
}

/// Cordons a node (`schedulable: false`: no new work; what runs there goes on) or marks it failed
/// (`failed: true`: no new work, and what runs there is killed and goes through fault tolerance).
async fn put_node(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let user = caller(&state, &headers).await?;
    admin_only(&user)?;
    let body: NodeStateBody = json_body(&body, r#"{"schedulable": BOOL, "failed": BOOL} (either or both)"#)?;
    if body.schedulable.is_none() && body.failed.is_none() {
        return Err(ApiError::BadRequest("give \"schedulable\", \"failed\" or both".into()));
    }
    let mut catalog = (*state.catalog.get()).clone();
    let node = catalog.nodes.get_mut(&name).ok_or_else(|| {
        ApiError::NotFoundWhat(format!("no such node {name:?}; GET /api/v1/catalog lists them"))
    })?;
    if let Some(v) = body.schedulable {
        node.schedulable = v;
    }
    if let Some(v) = body.failed {
        node.failed = v;
    }
    let text = serde_json::to_string(&catalog).map_err(|e| ApiError::Internal(e.to_string()))?;
    state.store.put_setting(CATALOG_SETTING, &text, now_ms()).await?;
    state.catalog.set(catalog);
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
pub struct UserBody {
    name: String,
    role: String,
    #[serde(default)]
    groups: Vec<String>,
}

/// Every user with their role and project groups (admin). Never a token or a hash: tokens are kept as hashes
/// in a table of their own and shown once, when made.
async fn list_users(State(state): State<AppState>, headers: HeaderMap) -> ApiResult<Json<Value>> {
    let user = caller(&state, &headers).await?;
    admin_only(&user)?;
    let disabled = state.store.disabled_users().await?;
    let items: Vec<Value> = state
        .store
        .list_users()
        .await?
        .into_iter()
        .map(|u| {
            let off = disabled.contains(&u.name);
            json!({ "name": u.name, "role": u.role, "groups": u.groups, "disabled": off })
        })
        .collect();
    Ok(Json(json!({ "items": items })))
}

/// The longest user name (it is in every task record, event and share).
pub const USER_NAME_MAX_BYTES: usize = 64;

/// Creates or updates a user.
async fn put_user(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> ApiResult<Json<Value>> {
    let user = caller(&state, &headers).await?;
    admin_only(&user)?;
    let body: UserBody = json_body(&body, r#"{"name", "role", "groups"}"#)?;
    if !matches!(body.role.as_str(), "admin" | "member") {
        return Err(ApiError::BadRequest(format!(
            "role {:?} does not exist; use admin or member",
            body.role
        )));
    }
    let catalog = state.catalog.get();
    if let Some(g) = body.groups.iter().find(|g| !catalog.project_groups.contains_key(*g)) {
        return Err(ApiError::BadRequest(format!("project group {g:?} is not in the catalog")));
    }
    let name_ok = !body.name.is_empty()
        && body.name.len() <= USER_NAME_MAX_BYTES
        && body.name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !name_ok {
        return Err(ApiError::BadRequest(format!(
            "a user name is 1 to {USER_NAME_MAX_BYTES} letters, digits, -, _ and . (got {} bytes)",
            body.name.len()
        )));
    }
    let u = User { name: body.name, role: body.role, groups: body.groups };
    state.store.put_user(&u, now_ms()).await?;
    // A new role or groups count from the next request here (elsewhere: within the cache's TTL).
    state.tokens.forget_user(&u.name);
    Ok(Json(json!({ "name": u.name, "role": u.role, "groups": u.groups })))
}

#[derive(Debug, Deserialize)]
pub struct TokenBody {
    #[serde(default)]
    label: String,
}

/// The longest token label (it is listed with every token).
pub const TOKEN_LABEL_MAX_BYTES: usize = 200;

/// A new token for a user, shown in this answer only.
async fn create_token(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let user = caller(&state, &headers).await?;
    if user.role != "admin" && user.name != name {
        return Err(ApiError::Forbidden("only admins may create tokens for other users".into()));
    }
    let label = if body.is_empty() {
        String::new()
    } else {
        serde_json::from_slice::<TokenBody>(&body).map_err(|e| ApiError::BadRequest(e.to_string()))?.label
    };
    if label.len() > TOKEN_LABEL_MAX_BYTES {
        return Err(ApiError::BadRequest(format!(
            "a token's label is at most {TOKEN_LABEL_MAX_BYTES} bytes (got {})",
            label.len()
        )));
    }
    known_user(&state, &name).await?;
    let token = new_token().map_err(|e| ApiError::Internal(e.to_string()))?;
    let hash = token_hash(&token);
    state.store.add_token(&hash, &name, &label, now_ms()).await?;
    let id = &hash[..trainyard_store::TOKEN_ID_LEN];
    Ok((StatusCode::CREATED, Json(json!({ "user": name, "token": token, "id": id, "label": label }))))
}

/// The user, or a 404 that says there is no such user.
async fn known_user(state: &AppState, name: &str) -> ApiResult<User> {
    state.store.get_user(name).await?.ok_or_else(|| ApiError::NotFoundWhat(format!("no such user {name:?}")))
}

/// A user's tokens (admins, or the user themself): id, label and creation time, never the token.
async fn list_tokens(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    let user = caller(&state, &headers).await?;
    if user.role != "admin" && user.name != name {
        return Err(ApiError::Forbidden("only admins may list other users' tokens".into()));
    }
    known_user(&state, &name).await?;
    let items: Vec<Value> = state
        .store
        .list_tokens(&name)
        .await?
        .into_iter()
        .map(|t| json!({ "id": t.id, "label": t.label, "createdAtMs": t.created_at_ms }))
        .collect();
    Ok(Json(json!({ "items": items })))
}

/// Revokes one of a user's tokens by its id (admins, or the user themself). Refused from then on by this
/// server, and by others sharing the store within [`TOKEN_CACHE_TTL`].
async fn revoke_token(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((name, id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let user = caller(&state, &headers).await?;
    if user.role != "admin" && user.name != name {
        return Err(ApiError::Forbidden("only admins may revoke other users' tokens".into()));
    }
    known_user(&state, &name).await?;
    if !state.store.revoke_token(&name, &id).await? {
        return Err(ApiError::NotFoundWhat(format!(
            "user {name} has no token {id:?}; GET /api/v1/users/{name}/tokens lists their ids"
        )));
    }
    state.tokens.forget_user(&name);
    Ok(StatusCode::NO_CONTENT)
}

/// Disables (`disable`) or enables (`enable`) a user (admins): a disabled user's every token is refused
/// with a 403 that says so, within [`TOKEN_CACHE_TTL`]; their tasks and data stay. Admins cannot disable
/// themselves (there would be no one left to undo it, perhaps).
async fn set_user_disabled(
    state: AppState,
    headers: HeaderMap,
    name: String,
    disabled: bool,
) -> ApiResult<StatusCode> {
    let user = caller(&state, &headers).await?;
    admin_only(&user)?;
    if disabled && name == user.name {
        return Err(ApiError::Conflict("you cannot disable yourself; ask another admin".into()));
    }
    if !state.store.set_user_disabled(&name, disabled).await? {
        return Err(ApiError::NotFoundWhat(format!("no such user {name:?}")));
    }
    state.tokens.forget_user(&name);
    Ok(StatusCode::NO_CONTENT)
}

/// Admins, or the user themself.
fn self_or_admin(user: &User, name: &str) -> ApiResult<()> {
    if user.role == "admin" || user.name == name {
        Ok(())
    } else {
        Err(ApiError::Forbidden("only admins may manage other users' TaskEnv".into()))
    }
}

/// A user's TaskEnv, hidden values masked.
async fn list_task_env(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    let user = caller(&state, &headers).await?;
    self_or_admin(&user, &name)?;
    known_user(&state, &name).await?;
    let vars = state.store.task_env(&name).await?;
    let items: Vec<Value> = vars
        .iter()
        .map(|v| {
            let value = if v.hidden { trainyard_core::spec::HIDDEN_VALUE_MASK } else { v.value.as_str() };
            json!({ "name": v.name, "value": value, "hidden": v.hidden })
        })
        .collect();
    Ok(Json(json!({ "items": items })))
}

#[derive(Debug, Deserialize)]
pub struct TaskEnvBody {
    name: String,
    value: String,
    #[serde(default)]
    hidden: bool,
}

/// Parses a JSON request body; `shape` tells the caller what was expected.
fn json_body<T: serde::de::DeserializeOwned>(body: &[u8], shape: &str) -> ApiResult<T> {
    serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("the body must be {shape}: {e}")))
}

/// Sets one TaskEnv variable (names and values follow the task env rules).
async fn put_task_env(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let user = caller(&state, &headers).await?;
    self_or_admin(&user, &name)?;
    known_user(&state, &name).await?;
    let body: TaskEnvBody = json_body(&body, r#"{"name", "value", "hidden"}"#)?;
    let var = trainyard_core::spec::EnvVar { name: body.name, value: body.value, hidden: body.hidden };
    let mut report = Report::default();
    trainyard_core::validate::check_env_list(&mut report, "env", std::slice::from_ref(&var));
    if !report.is_ok() {
        return Err(ApiError::Invalid(report));
    }
    let value = if var.hidden {
        // Bound to this user and name: copied into another user's TaskEnv or a task, it does not open.
        let binding = trainyard_control::secrets::Binding::TaskEnv { user: &name, name: &var.name };
        state.secrets.seal_value(&var.value, &binding).map_err(|e| ApiError::Internal(e.to_string()))?
    } else {
        var.value
    };
    let stored = trainyard_store::TaskEnvVar { name: var.name, value, hidden: var.hidden };
    state.store.put_task_env(&name, &stored).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn delete_task_env(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((name, var)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let user = caller(&state, &headers).await?;
    self_or_admin(&user, &name)?;
    known_user(&state, &name).await?;
    if state.store.delete_task_env(&name, &var).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFoundWhat(format!("{name} has no TaskEnv variable {var:?}")))
    }
}

/// Quotas and capacity: the caller's groups (all for admins), from the scheduler's own view.
async fn quota(State(state): State<AppState>, headers: HeaderMap) -> ApiResult<Json<Value>> {
    let user = caller(&state, &headers).await?;
    let groups = (user.role != "admin").then_some(user.groups.as_slice());
    let lines = state.views.quota_report(groups);
    Ok(Json(json!({ "items": lines })))
}

/// A user's own alarm subscriptions: they apply to every task the user owns.
async fn get_user_alarms(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    let user = caller(&state, &headers).await?;
    self_or_admin(&user, &name)?;
    known_user(&state, &name).await?;
    let subs = trainyard_control::alarms::user_subscriptions(&state.store, &name).await?;
    Ok(Json(json!({ "items": subs })))
}

/// Replaces a user's own alarm subscriptions (a JSON list, checked like a task's `advanced.alarms`).
async fn put_user_alarms(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    use trainyard_core::decode::{Decode, Decoder};
    let user = caller(&state, &headers).await?;
    self_or_admin(&user, &name)?;
    known_user(&state, &name).await?;
    let value: Value = json_body(&body, "a JSON list")?;
    let mut d = Decoder::default();
    let subs =
        Vec::<trainyard_core::spec::AlarmSubscription>::decode(&value, "alarms", &mut d).unwrap_or_default();
    let mut report = d.report;
    if report.is_ok() {
        trainyard_core::validate::check_alarms(&mut report, "alarms", &subs);
    }
    if report.is_ok() {
        report = webhook_problems(&state, "alarms", &subs).await;
    }
    if !report.is_ok() {
        return Err(ApiError::Invalid(report));
    }
    let text = serde_json::to_string(&subs).map_err(|e| ApiError::Internal(e.to_string()))?;
    state.store.put_setting(&trainyard_control::alarms::user_setting(&name), &text, now_ms()).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn healthz() -> &'static str {
    "ok"
}

/// `/metrics` on the API's address: an admin's token (Prometheus: `authorization: {credentials_file: ...}`).
/// Tasks and members cannot read the platform's figures. For a scraper without a token, `trainyard up
/// --metrics-listen ADDR` serves the same text on an address of its own ([`open_metrics`]).
async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> ApiResult<Response> {
    let user = caller(&state, &headers).await?;
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
async fn open_metrics(State(state): State<AppState>) -> ApiResult<Response> {
    let by_status = state.store.count_by_status().await?;
    let mut resp = state.metrics.render(&by_status).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    Ok(resp)
}

/// Counts every request by its route pattern (not its path, so ids do not explode the series).
async fn count_requests(
    State(state): State<AppState>,
    matched: Option<axum::extract::MatchedPath>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let method = req.method().to_string();
    let route = matched.map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let started = std::time::Instant::now();
    let resp = next.run(req).await;
    state.metrics.request(&method, &route, resp.status().as_u16(), started.elapsed());
    resp
}

#[derive(Debug, Deserialize)]
pub struct ShareBody {
    user: String,
    #[serde(default)]
    operate: bool,
}

/// Shares a task with a user (view, or view and operate). Owner and admins only.
async fn share_task(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let user = caller(&state, &headers).await?;
    let t = visible_task(&state, &user, &id).await?;
    let body: ShareBody = json_body(&body, r#"{"user": NAME, "operate": BOOL}"#)?;
    if user.role != "admin" && t.owner != user.name {
        return Err(ApiError::Forbidden(format!("only the owner of {} or an admin can share it", t.name)));
    }
    if state.store.get_user(&body.user).await?.is_none() {
        return Err(ApiError::BadRequest(format!("there is no user {:?}", body.user)));
    }
    state.store.share(&t.id, &body.user, body.operate).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CloneBody {
    /// The project group the copy goes to (default: the original's). It must be one of the caller's.
    project_group: Option<String>,
    /// Values for the original's hidden variables, by name (env and precheck env alike): a copy never
    /// carries them, so each must be given again.
    #[serde(default)]
    hidden_values: BTreeMap<String, String>,
}

/// A new task from this one's spec (a new name, queued), owned by the caller. Whoever may operate the task
/// may clone it, into a project group they belong to (admins: any), as for a create. Hidden values are never
/// copied: each is the mask until the body's `hiddenValues` gives it, and a mask is refused (422,
/// `masked-value`, at the variable's path), so one user's secret never runs under another's name.
async fn clone_task(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    let user = caller(&state, &headers).await?;
    let t = operable_task(&state, &user, &id).await?;
    let body: CloneBody = if body.iter().all(u8::is_ascii_whitespace) {
        CloneBody::default()
    } else {
        json_body(&body, r#"{"projectGroup": GROUP, "hiddenValues": {NAME: VALUE}} (both optional)"#)?
    };
    let mut task = trainyard_core::parse(t.spec_json.as_bytes())
        .0
        .ok_or_else(|| ApiError::Internal(format!("stored task {} is unreadable", t.id)))?;
    let mut hidden = task.spec.environment.env.iter_mut().collect::<Vec<_>>();
    if let Some(p) = task.spec.advanced.precheck.as_mut() {
        hidden.extend(p.env.iter_mut());
    }
    for v in hidden.into_iter().filter(|v| v.hidden) {
        v.value = body
            .hidden_values
            .get(&v.name)
            .cloned()
            .unwrap_or_else(|| trainyard_core::spec::HIDDEN_VALUE_MASK.to_owned());
    }
    if let Some(group) = body.project_group {
        task.metadata.project_group = group;
    }
    may_use_group(&user, &task.metadata.project_group)?;
    let body = task.to_json();
    let refused = |e| match e {
        SubmitError::Invalid(r) => ApiError::Invalid(r),
        SubmitError::Store(s) => s.into(),
    };
    let task = trainyard_control::validate(&state.catalog.get(), body.as_bytes()).map_err(refused)?;
    may_use_catalog(&state, &user, &task)?;
    check_task_webhooks(&state, &task).await?;
    let created = trainyard_control::store_task(
        &state.store,
        &state.secrets,
        &user.name,
        &task,
        body.as_bytes(),
        None,
        now_ms(),
    )
    .await
    .map_err(refused)?;
    state.arrivals.push(created.task(), &task);
    state.wake.notify_one();
    Ok((StatusCode::CREATED, Json(view(&state, created.task(), Spec::This(&task)))).into_response())
}

/// The longest request target (path and query) served; longer is a 414 problem. (hyper itself answers a
/// target over 64 KiB, before any of this code runs, with a bare 414.)
pub const MAX_URI_BYTES: usize = 8 * 1024;
/// How much of an error body from axum's own extractors is kept as a problem's detail.
const ERROR_BODY_MAX_BYTES: usize = 16 * 1024;

/// A problem document response (RFC 9457).
fn problem(status: StatusCode, code: &str, title: &str, detail: String) -> Response {
    let body = json!({
        "type": format!("https://trainyard.dev/problems/{code}"),
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut resp = (status, Json(body)).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    resp
}

/// Every error answer is a problem document: the ones handlers make already are; the ones the router and
/// axum's extractors make (unknown route, wrong method, body too large, a query that does not parse) are
/// rewritten here, keeping their status, their headers (`Allow`) and what they said.
async fn problems_for_every_error(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let target_len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if target_len > MAX_URI_BYTES {
        return problem(
            StatusCode::URI_TOO_LONG,
            "uri-too-long",
            "Request target too long",
            format!("the path and query are {target_len} bytes; at most {MAX_URI_BYTES}"),
        );
    }
    let resp = next.run(req).await;
    let status = resp.status();
    let is_problem = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let said = axum::body::to_bytes(body, ERROR_BODY_MAX_BYTES).await.unwrap_or_default();
    let said = String::from_utf8_lossy(&said).trim().to_owned();
    let (code, title, detail) = match status {
        StatusCode::NOT_FOUND => (
            "no-such-route",
            "No such route",
            format!("nothing is served at {method} {path}; the API's routes are listed at /api/openapi.json"),
        ),
        StatusCode::METHOD_NOT_ALLOWED => {
            let allow = parts.headers.get(header::ALLOW).and_then(|v| v.to_str().ok()).unwrap_or("");
            (
                "method-not-allowed",
                "Method not allowed",
                format!("{path} does not take {method}; it takes {allow}"),
            )
        }
        StatusCode::PAYLOAD_TOO_LARGE => (
            "too-large",
            "Body too large",
            format!(
                "the body is over {} bytes; a task document is at most {MAX_DOCUMENT_BYTES}",
                MAX_DOCUMENT_BYTES + 1024
            ),
        ),
        StatusCode::BAD_REQUEST => ("bad-request", "Bad request", said),
        s if s.is_client_error() => ("bad-request", s.canonical_reason().unwrap_or("Client error"), said),
        s => ("internal", s.canonical_reason().unwrap_or("Server error"), said),
    };
    let mut resp = problem(status, code, title, detail);
    for (name, value) in
        parts.headers.iter().filter(|(n, _)| *n != header::CONTENT_TYPE && *n != header::CONTENT_LENGTH)
    {
        resp.headers_mut().insert(name.clone(), value.clone());
    }
    resp
}

/// The API's routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/api/v1/whoami", get(whoami))
        .route("/api/v1/catalog", get(catalog))
        .route("/api/v1/tasks", post(create_task).get(list_tasks))
        .route("/api/v1/validate", post(validate_task))
        .route("/api/v1/tasks/{id}", get(get_task).delete(delete_task))
        .route("/api/v1/tasks/{id}/events", get(task_events))
        .route("/api/v1/tasks/{id}/logs", get(task_logs))
        .route("/api/v1/tasks/{id}/metrics", get(task_metrics))
        .route("/api/v1/tasks/{id}/stop", post(stop_task))
        .route("/api/v1/tasks/{id}/resubmit", post(resubmit_task))
        .route("/api/v1/tasks/{id}/clone", post(clone_task))
        .route("/api/v1/tasks/{id}/shares", post(share_task))
        .route("/api/v1/admin/catalog", axum::routing::put(put_catalog))
        .route("/api/v1/admin/nodes/{name}", axum::routing::put(put_node))
        .route("/api/v1/admin/users", post(put_user).get(list_users))
        .route("/api/v1/users/{name}/tokens", post(create_token).get(list_tokens))
        .route("/api/v1/users/{name}/tokens/{token}", axum::routing::delete(revoke_token))
        .route(
            "/api/v1/admin/users/{name}/disable",
            post(|State(s), h, Path(name)| set_user_disabled(s, h, name, true)),
        )
        .route(
            "/api/v1/admin/users/{name}/enable",
            post(|State(s), h, Path(name)| set_user_disabled(s, h, name, false)),
        )
        .route("/api/v1/users/{name}/env", get(list_task_env).put(put_task_env))
        .route("/api/v1/users/{name}/alarms", get(get_user_alarms).put(put_user_alarms))
        .route("/api/v1/users/{name}/env/{var}", axum::routing::delete(delete_task_env))
        .route("/api/v1/quota", get(quota))
        .route("/metrics", get(metrics))
        .route("/api/openapi.json", get(|| async { Json(openapi::document()) }))
        .route(
            "/api/docs",
            get(|| async { ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], openapi::DOCS_PAGE) }),
        )
        .merge(console::routes())
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), count_requests))
        // A task document is at most MAX_DOCUMENT_BYTES; a little more is read so the validator can say so.
        .layer(DefaultBodyLimit::max(MAX_DOCUMENT_BYTES + 1024))
        .layer(axum::middleware::from_fn(problems_for_every_error))
        .with_state(state)
}

/// How often the control loop runs without being asked.
pub const TICK_INTERVAL: Duration = Duration::from_millis(100);

/// After a tick, the loop rests at least this many times as long as the tick took.
pub const TICK_REST: u32 = 4;

/// Between ticks while an attempt is starting or stopping, or after a wake-up.
pub const SETTLING_INTERVAL: Duration = Duration::from_millis(5);

/// Runs the control loop until the process ends: every [`TICK_INTERVAL`], sooner when woken (a task was
/// created or stopped) or while attempts are starting or stopping ([`SETTLING_INTERVAL`]); when a tick takes
/// long (a deep queue), never sooner than [`TICK_REST`] times its length after it, so that under a stream of
/// submissions the loop takes at most about a fifth of a core from the API and batches what arrived
/// meanwhile into its next tick.
pub fn spawn_control_loop(
    control: Arc<Mutex<Control<AnyBackend>>>,
    metrics: Arc<Metrics>,
    wake: Arc<tokio::sync::Notify>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let started = std::time::Instant::now();
            let result = control.lock().await.tick(now_ms()).await;
            let took = started.elapsed();
            let settling = match result {
                Ok(report) => {
                    metrics.tick(&report, took);
                    report.settling > 0
                }
                Err(e) => {
                    eprintln!("trainyard: control loop: {e}");
                    false
                }
            };
            let floor = TICK_REST * took;
            if settling {
                tokio::time::sleep(SETTLING_INTERVAL.max(floor)).await;
                continue;
            }
            tokio::time::sleep(floor).await;
            let _ = tokio::time::timeout(TICK_INTERVAL.saturating_sub(took + floor), wake.notified()).await;
        }
    })
}

/// How often queued alarm deliveries are looked at.
pub const ALARM_INTERVAL: Duration = Duration::from_millis(500);

/// The key alarm webhooks are signed with: derived from the server key, so it survives restarts with it.
pub fn webhook_key(secrets: &SecretBox) -> Vec<u8> {
    secrets.digest(b"trainyard webhook signing key").into_bytes()
}

/// Delivers queued alarms until the process ends.
pub fn spawn_alarm_delivery(
    store: Store,
    webhooks: trainyard_control::alarms::Webhooks,
    key: Vec<u8>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            if let Err(e) =
                trainyard_control::alarms::deliver_due_with(&store, &webhooks, &key, now_ms()).await
            {
                eprintln!("trainyard: alarm delivery: {e}");
            }
            tokio::time::sleep(ALARM_INTERVAL).await;
        }
    })
}

/// How long a client may take to send a request's headers (the start line included), and to send the next
/// request on a kept-alive connection: slow or silent clients do not hold connections.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection on which nothing was read or written for this long is closed (a request body or a response
/// the client stopped moving). Streams (log follow) send a keep-alive well within it.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections served at once; one more is answered 503 (a problem document) and closed.
pub const MAX_CONNECTIONS: usize = 4096;

/// Limits on HTTP connections (`trainyard up --header-read-timeout-s`, `--idle-timeout-s`,
/// `--max-connections`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_read_timeout: HEADER_READ_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
        }
    }
}

/// How `serve_with` serves, beyond the API itself.
#[derive(Debug, Default)]
pub struct ServeOptions {
    pub limits: HttpLimits,
    /// Where `/metrics` is served without a token (`trainyard up --metrics-listen`): an address for the
    /// scraper only, such as a management interface. On the API's own address `/metrics` takes an admin token.
    pub metrics_listener: Option<tokio::net::TcpListener>,
}

/// Serves the API on `listener` with the control loop and alarm delivery running, with the default
/// [`HttpLimits`] and no separate metrics address.
pub async fn serve(listener: tokio::net::TcpListener, state: AppState) -> std::io::Result<()> {
    serve_with(listener, state, ServeOptions::default()).await
}

/// Serves the API on `listener` with the control loop and alarm delivery running. First, once per store,
/// hidden values sealed by an earlier version without a binding are re-sealed bound to their records
/// ([`trainyard_control::secrets::reseal_legacy`]).
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    state: AppState,
    options: ServeOptions,
) -> std::io::Result<()> {
    let resealed = trainyard_control::secrets::reseal_legacy(&state.store, &state.secrets, now_ms())
        .await
        .map_err(|e| std::io::Error::other(format!("re-sealing hidden values: {e}")))?;
    if resealed != Default::default() {
        eprintln!(
            "trainyard: re-sealed the hidden values of {} task(s) and {} TaskEnv variable(s), bound to their records",
            resealed.tasks, resealed.task_env
        );
    }
    let limits = options.limits;
    let metrics_server = options.metrics_listener.map(|l| {
        let app = Router::new().route("/metrics", get(open_metrics)).with_state(state.clone());
        tokio::spawn(serve_connections(l, app, limits))
    });
    let ticker = spawn_control_loop(state.control.clone(), state.metrics.clone(), state.wake.clone());
    let alarms =
        spawn_alarm_delivery(state.store.clone(), state.webhooks.clone(), webhook_key(&state.secrets));
    let result = serve_connections(listener, router(state), limits).await;
    ticker.abort();
    alarms.abort();
    if let Some(m) = metrics_server {
        m.abort();
    }
    result
}

/// Accepts connections and serves each with hyper (HTTP/1.1): headers within the header-read timeout, no
/// idle connection beyond the idle timeout, and at most `max_connections` at once; the next one is answered
/// with a 503 problem and closed, so a client that holds many connections (or forgets to close them) cannot
/// starve the others or the server's file descriptors.
async fn serve_connections(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: HttpLimits,
) -> std::io::Result<()> {
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, or a connection reset before it was accepted: the listener is
                // fine; wait a little rather than spin.
                eprintln!("trainyard: accepting a connection: {e}");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tokio::spawn(refuse_connection(stream, limits.max_connections));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(IdleTimeout::new(stream, limits.idle_timeout));
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .serve_connection(io, service)
                .with_upgrades();
            let _ = conn.await;
            drop(permit);
        });
    }
}

/// How long the accept loop waits after an error accepting a connection.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);
/// How long a refused connection is given to take its 503.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Answers a connection over the cap: a 503 problem document, `Connection: close`.
async fn refuse_connection(mut stream: tokio::net::TcpStream, max: usize) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = json!({
        "type": "https://trainyard.dev/problems/too-many-connections",
        "title": "Too many connections",
        "status": 503,
        "detail": format!("the server already serves its limit of {max} connections; retry in a moment, and reuse connections"),
    })
    .to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await?;
        // Read what the client sent before closing, so the close is not a reset that loses the answer.
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}

/// A connection that fails with `TimedOut` when nothing was read or written on it for `timeout` while
/// hyper waited on it.
struct IdleTimeout<T> {
    inner: T,
    timeout: Duration,
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl<T> IdleTimeout<T> {
    fn new(inner: T, timeout: Duration) -> Self {
        IdleTimeout { inner, timeout, sleep: Box::pin(tokio::time::sleep(timeout)) }
    }

    /// Something moved: the idle clock starts again.
    fn moved(&mut self) {
        self.sleep.as_mut().reset(tokio::time::Instant::now() + self.timeout);
    }

    /// The inner call is pending: has the connection been idle too long?
    fn idle(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Error> {
        self.sleep
            .as_mut()
            .poll(cx)
            .map(|()| std::io::Error::new(std::io::ErrorKind::TimedOut, "the connection was idle too long"))
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for IdleTimeout<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        match std::pin::Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                self.moved();
                Poll::Ready(r)
            }
            Poll::Pending => self.idle(cx).map(Err),
        }
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for IdleTimeout<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        use std::task::Poll;
        match std::pin::Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(r) => {
                self.moved();
                Poll::Ready(r)
            }
            Poll::Pending => self.idle(cx).map(Err),
        }
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
