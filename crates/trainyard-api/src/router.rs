//! The API's routes: which handler answers each path and method, and the layers around them (request
//! metrics, the body limit, problem documents for every error).

use crate::console;
use crate::error::problems_for_every_error;
use crate::routes::{admin, server, shares, tasks, telemetry, users, workdirs};
use crate::state::AppState;
use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::Response;
use axum::routing::{delete, get, post, put};
use trainyard_core::MAX_DOCUMENT_BYTES;

/// The API's routes. The OpenAPI document's operation table lists each (but the document itself, its page
/// and the console), and tests check that each listed operation is routed and answers as documented.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(server::healthz))
        .route("/metrics", get(server::metrics))
        .route("/api/openapi.json", get(server::openapi_document))
        .route("/api/docs", get(server::docs_page))
        .route("/api/v1/whoami", get(users::whoami))
        .route("/api/v1/server", get(server::server_status))
        .route("/api/v1/server/boards", get(server::server_boards))
        .route("/api/v1/validate", post(tasks::validate_task))
        .route("/api/v1/tasks", post(tasks::create_task).get(tasks::list_tasks).delete(tasks::delete_tasks))
        .route("/api/v1/tasks/{id}", get(tasks::get_task).delete(tasks::delete_task))
        .route("/api/v1/tasks/{id}/stop", post(tasks::stop_task))
        .route("/api/v1/tasks/{id}/resubmit", post(tasks::resubmit_task))
        .route("/api/v1/tasks/{id}/clone", post(tasks::clone_task))
        .route("/api/v1/tasks/{id}/shares", post(shares::share_task).get(shares::list_shares))
        .route("/api/v1/tasks/{id}/shares/{user}", delete(shares::unshare_task))
        .route("/api/v1/tasks/{id}/events", get(telemetry::task_events))
        .route("/api/v1/tasks/{id}/logs", get(telemetry::task_logs))
        .route("/api/v1/tasks/{id}/metrics", get(telemetry::task_metrics))
        // A manifest may be larger than a task document (an entry per file).
        .route(
            "/api/v1/workdirs",
            get(workdirs::list_workdirs)
                .post(workdirs::commit_workdir)
                .layer(DefaultBodyLimit::max(workdirs::MANIFEST_MAX_BYTES)),
        )
        .route(
            "/api/v1/workdirs/check",
            post(workdirs::check_workdir).layer(DefaultBodyLimit::max(workdirs::MANIFEST_MAX_BYTES)),
        )
        .route("/api/v1/workdirs/blobs", post(workdirs::put_workdir_blobs))
        .route("/api/v1/workdirs/{workdir}", get(workdirs::get_workdir))
        .route("/api/v1/workdirs/{workdir}/files", get(workdirs::get_workdir_files))
        .route("/api/v1/catalog", get(admin::catalog))
        .route("/api/v1/quota", get(admin::quota))
        .route("/api/v1/admin/catalog", put(admin::put_catalog))
        .route("/api/v1/admin/nodes/{node}", put(admin::put_node))
        .route("/api/v1/admin/settings", get(admin::get_settings).put(admin::put_settings))
        .route("/api/v1/admin/images", get(admin::list_images))
        .route("/api/v1/admin/images/prune", post(admin::prune_images))
        .route("/api/v1/admin/registries", get(admin::list_registry_logins))
        .route(
            "/api/v1/admin/registries/{host}/login",
            put(admin::put_registry_login).delete(admin::delete_registry_login),
        )
        .route("/api/v1/admin/users", post(users::put_user).get(users::list_users))
        .route("/api/v1/admin/users/{name}/disable", post(users::disable_user))
        .route("/api/v1/admin/users/{name}/enable", post(users::enable_user))
        .route("/api/v1/admin/users/{name}/delete", post(users::delete_user))
        .route("/api/v1/users/{name}/tokens", post(users::create_token).get(users::list_tokens))
        .route("/api/v1/users/{name}/tokens/{token}", delete(users::revoke_token))
        .route("/api/v1/users/{name}/env", get(users::list_task_env).put(users::put_task_env))
        .route("/api/v1/users/{name}/images", get(users::list_recent_images))
        .route("/api/v1/users/{name}/env/{var}", delete(users::delete_task_env))
        .route("/api/v1/users/{name}/alarms", get(users::get_user_alarms).put(users::put_user_alarms))
        .merge(console::routes())
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), count_requests))
        // A task document is at most MAX_DOCUMENT_BYTES; a little more is read so the validator can say so.
        .layer(DefaultBodyLimit::max(MAX_DOCUMENT_BYTES + 1024))
        .layer(axum::middleware::from_fn(problems_for_every_error))
        .with_state(state)
}

/// The routes of the separate metrics address: `/metrics` without a token, nothing else.
pub fn metrics_router(state: AppState) -> Router {
    Router::new().route("/metrics", get(server::open_metrics)).with_state(state)
}

/// Counts every request by its route pattern (not its path, so ids do not explode the series).
async fn count_requests(
    State(state): State<AppState>,
    matched: Option<axum::extract::MatchedPath>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let method = req.method().clone();
    let started = std::time::Instant::now();
    let resp = next.run(req).await;
    let route = matched.as_ref().map_or("unmatched", |m| m.as_str());
    state.metrics.request(method.as_str(), route, resp.status().as_u16(), started.elapsed());
    resp
}
