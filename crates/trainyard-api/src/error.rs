//! Every error answer is an RFC 9457 problem document: [`ApiError`] is the one place handlers' errors (and
//! the store's, the control loop's and a refused submission's) become an HTTP status and a problem, and
//! [`problems_for_every_error`] rewrites the router's and axum's extractors' own error answers the same way.

use crate::schema::{ApiSchema, Schemas, view};
use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use trainyard_control::{CommandError, SubmitError};
use trainyard_core::{MAX_DOCUMENT_BYTES, Problem, Report};
use trainyard_store::StoreError;

/// What a 429 for the per-user cap on queued tasks tells the client to wait before trying again, in seconds.
pub const QUEUED_CAP_RETRY_AFTER_S: u32 = 30;

view! {
    /// Something a refused catalog would take away from active tasks: where they use it, what they would be
    /// told, how many they are and some of their names.
    #[derive(Clone, PartialEq, Eq)]
    pub struct CatalogConflict as "CatalogConflict" {
        /// The validator's code for what the tasks would get (`not-found`, `not-in-group`, `never-fits`,
        /// ...), or `node-in-use` for a node that runs their replicas.
        pub code: String,
        /// Where in the tasks the thing is used (`spec.compute.pool`, ...), or `placement` for a node.
        pub path: String,
        /// What is wrong, as the tasks would be told.
        pub message: String,
        /// How many active tasks it concerns.
        pub tasks: u64,
        /// Some of them, by name.
        "taskNames" pub task_names: Vec<String>,
    }
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
    /// The caller has as many queued tasks as one user may (an admin setting): 429 with `Retry-After`.
    TooManyQueued {
        limit: u64,
        queued: u64,
    },
    /// A catalog replacement would take away what active tasks use: 409, each conflict listed.
    CatalogInUse(Vec<CatalogConflict>),
    /// The store's disk is full ([`StoreError::DiskFull`]): 507, saying what to free.
    InsufficientStorage(String),
    Internal(String),
}

pub type ApiResult<T> = Result<T, ApiError>;

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
            full @ StoreError::DiskFull(_) => ApiError::InsufficientStorage(full.to_string()),
            fenced @ StoreError::Fenced { .. } => ApiError::Conflict(format!(
                "this server's term as leader ended while it carried the request out ({fenced}); try again"
            )),
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
            CommandError::NoSuchUser(_) => ApiError::NotFoundWhat(e.to_string()),
            CommandError::UserDeleted(_) => ApiError::Conflict(e.to_string()),
        }
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::Invalid(report) => ApiError::Invalid(report),
            SubmitError::Store(s) => s.into(),
        }
    }
}

view! {
    /// An error, as an RFC 9457 problem document. `type` ends in a stable code; `problems` (422
    /// `invalid-task`), `conflicts` (409 `catalog-in-use`), `limit` and `queued` (429 `too-many-queued`) are
    /// there with those codes only.
    pub struct ProblemBody as "Problem" {
        /// `https://trainyard.dev/problems/CODE`: the stable part clients match on.
        "type" pub problem_type: String => ProblemType,
        pub title: String,
        pub status: u16 => ErrorStatus,
        pub detail: String,
        /// A refused task document's problems (422 `invalid-task`), each with its path.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub problems: Option<Vec<Problem>>,
        /// What active tasks use that a refused catalog would take away (409 `catalog-in-use`).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub conflicts: Option<Vec<CatalogConflict>>,
        /// The cap on a user's queued tasks (429 `too-many-queued`).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub limit: Option<u64>,
        /// The caller's queued tasks (429 `too-many-queued`).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub queued: Option<u64>,
    }
}

/// The schema of a problem's `type`: a URI under `https://trainyard.dev/problems/` ending in a stable code.
#[derive(Debug)]
pub struct ProblemType;

impl ApiSchema for ProblemType {
    fn schema(_: &mut Schemas) -> serde_json::Value {
        serde_json::json!({"type": "string", "pattern": "^https://trainyard\\.dev/problems/[a-z]+(-[a-z]+)*$"})
    }
}

/// The schema of a problem's `status`: an HTTP error status.
#[derive(Debug)]
pub struct ErrorStatus;

impl ApiSchema for ErrorStatus {
    fn schema(_: &mut Schemas) -> serde_json::Value {
        serde_json::json!({"type": "integer", "minimum": 400, "maximum": 599})
    }
}

impl ProblemBody {
    pub fn new(status: StatusCode, code: &str, title: &str, detail: String) -> Self {
        ProblemBody {
            problem_type: format!("https://trainyard.dev/problems/{code}"),
            title: title.to_owned(),
            status: status.as_u16(),
            detail,
            problems: None,
            conflicts: None,
            limit: None,
            queued: None,
        }
    }

    /// The answer: this document with its status and the problem content type.
    pub fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (status, Json(self)).into_response();
        resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        resp
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.problem();
        let too_many = body.status == StatusCode::TOO_MANY_REQUESTS.as_u16();
        let mut resp = body.into_response();
        if too_many {
            let wait = HeaderValue::from(QUEUED_CAP_RETRY_AFTER_S);
            resp.headers_mut().insert(header::RETRY_AFTER, wait);
        }
        resp
    }
}

impl ApiError {
    /// The problem document this error answers with.
    pub fn problem(self) -> ProblemBody {
        let (status, code, title, detail) = match self {
            ApiError::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "Missing or unknown token",
                "send `Authorization: Bearer <token>`".to_owned(),
            ),
            ApiError::Disabled(name) => (
                StatusCode::FORBIDDEN,
                "account-disabled",
                "Account disabled",
                format!("user {name} is disabled, and so are its tokens; an admin can enable it again"),
            ),
            ApiError::NotFound => (
                StatusCode::NOT_FOUND,
                "not-found",
                "Not found",
                "no such task, or it is not visible to you".to_owned(),
            ),
            ApiError::NotFoundWhat(detail) => (StatusCode::NOT_FOUND, "not-found", "Not found", detail),
            ApiError::Forbidden(d) => (StatusCode::FORBIDDEN, "forbidden", "Not allowed", d),
            ApiError::Invalid(report) => {
                let n = report.errors().count();
                let mut body = ProblemBody::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid-task",
                    "The task has problems",
                    format!("{n} problem(s) to fix; each has a path, a code and what to change"),
                );
                body.problems = Some(report.problems);
                return body;
            }
            ApiError::Conflict(d) => (StatusCode::CONFLICT, "conflict", "Conflict", d),
            ApiError::BadRequest(d) => (StatusCode::BAD_REQUEST, "bad-request", "Bad request", d),
            ApiError::TooManyQueued { limit, queued } => {
                let mut body = ProblemBody::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too-many-queued",
                    "Too many queued tasks",
                    format!(
                        "you have {queued} queued tasks and one user may have at most {limit} (an admin's \
                         setting, maxQueuedTasksPerUser); wait for some to start, or stop some, then try again"
                    ),
                );
                (body.limit, body.queued) = (Some(limit), Some(queued));
                return body;
            }
            ApiError::CatalogInUse(conflicts) => {
                let first = conflicts.iter().take(3).map(|c| c.message.as_str()).collect::<Vec<_>>();
                let mut body = ProblemBody::new(
                    StatusCode::CONFLICT,
                    "catalog-in-use",
                    "The catalog takes away what active tasks use",
                    format!(
                        "{} conflict(s) with active tasks, each listed in conflicts with the tasks it concerns: \
                         {}{}; keep what they use until they end, or replace the catalog anyway with ?force=true",
                        conflicts.len(),
                        first.join("; "),
                        if conflicts.len() > first.len() { "; ..." } else { "" }
                    ),
                );
                body.conflicts = Some(conflicts);
                return body;
            }
            ApiError::InsufficientStorage(d) => {
                (StatusCode::INSUFFICIENT_STORAGE, "insufficient-storage", "The server's disk is full", d)
            }
            ApiError::Internal(d) => (StatusCode::INTERNAL_SERVER_ERROR, "internal", "Internal error", d),
        };
        ProblemBody::new(status, code, title, detail)
    }
}

/// Parses a JSON request body; `shape` tells the caller what was expected.
pub fn json_body<T: serde::de::DeserializeOwned>(body: &[u8], shape: &str) -> ApiResult<T> {
    serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("the body must be {shape}: {e}")))
}

/// Parses a JSON object body into `T`. serde reads a struct from an array too (its fields in order), so
/// the body's top level is checked to be an object first: `["x"]` is refused, never taken as `{"label": "x"}`.
pub fn json_object<T: serde::de::DeserializeOwned>(body: &[u8], shape: &str) -> ApiResult<T> {
    let value: serde_json::Value = json_body(body, shape)?;
    if !value.is_object() {
        let found = match value {
            serde_json::Value::Array(_) => "an array",
            serde_json::Value::String(_) => "a string",
            serde_json::Value::Number(_) => "a number",
            serde_json::Value::Bool(_) => "a boolean",
            _ => "null",
        };
        return Err(ApiError::BadRequest(format!("the body must be a JSON object, {shape}; it is {found}")));
    }
    serde_json::from_value(value).map_err(|e| ApiError::BadRequest(format!("the body must be {shape}: {e}")))
}

/// The longest request target (path and query) served; longer is a 414 problem. (hyper itself answers a
/// target over 64 KiB, before any of this code runs, with a bare 414.)
pub const MAX_URI_BYTES: usize = 8 * 1024;
/// How much of an error body from axum's own extractors is kept as a problem's detail.
const ERROR_BODY_MAX_BYTES: usize = 16 * 1024;

/// Every error answer is a problem document: the ones handlers make already are; the ones the router and
/// axum's extractors make (unknown route, wrong method, body too large, a query that does not parse) are
/// rewritten here, keeping their status, their headers (`Allow`) and what they said.
pub async fn problems_for_every_error(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let target_len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if target_len > MAX_URI_BYTES {
        return ProblemBody::new(
            StatusCode::URI_TOO_LONG,
            "uri-too-long",
            "Request target too long",
            format!("the path and query are {target_len} bytes; at most {MAX_URI_BYTES}"),
        )
        .into_response();
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
    let mut resp = ProblemBody::new(status, code, title, detail).into_response();
    for (name, value) in
        parts.headers.iter().filter(|(n, _)| *n != header::CONTENT_TYPE && *n != header::CONTENT_LENGTH)
    {
        resp.headers_mut().insert(name.clone(), value.clone());
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full disk under the store is a 507 that says so and what to do, never an internal error or
    /// "corrupt"; other database failures stay 500.
    #[test]
    fn a_full_disk_is_insufficient_storage() {
        let full = ApiError::from(StoreError::DiskFull("database or disk is full".into())).problem();
        assert_eq!(full.status, 507);
        assert_eq!(full.problem_type, "https://trainyard.dev/problems/insufficient-storage");
        assert!(full.detail.contains("free space") && !full.detail.contains("corrupt"), "{}", full.detail);
        let failed = ApiError::from(StoreError::WriteFailed("the writer stopped".into())).problem();
        assert_eq!(failed.status, 500);
    }
}
