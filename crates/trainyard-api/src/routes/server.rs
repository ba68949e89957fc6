//! The server's own routes: liveness, its metrics, and the OpenAPI document with a page that renders it.

use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ProblemBody};
use crate::openapi;
use crate::routes::NoParams;
use crate::state::AppState;
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
    let mut resp = state.metrics.render(&by_status).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    Ok(resp)
}

pub async fn openapi_document() -> Json<serde_json::Value> {
    Json(openapi::document())
}

pub async fn docs_page() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], openapi::DOCS_PAGE)
}
