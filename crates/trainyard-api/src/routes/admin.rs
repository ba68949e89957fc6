//! The cluster as the platform describes it: the catalog (read by all, replaced by admins), nodes cordoned or
//! marked failed by admins, and quotas with what is left of them.

use crate::auth::{admin_only, caller};
use crate::error::{ApiError, ApiResult, json_body};
use crate::schema::{Optional, object_schema};
use crate::state::{AppState, now_ms};
use crate::views::Items;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use trainyard_control::QuotaLine;
use trainyard_core::Catalog;

/// The store's name for the catalog document.
pub const CATALOG_SETTING: &str = "catalog";

pub async fn catalog(State(state): State<AppState>, headers: HeaderMap) -> ApiResult<Json<Catalog>> {
    caller(&state, &headers).await?;
    Ok(Json((*state.catalog.get()).clone()))
}

/// Replaces the catalog (YAML or JSON). It must be consistent in itself; tasks already queued are checked
/// against it at their next scheduling (a task whose pool or specs are gone stays queued).
pub async fn put_catalog(
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
object_schema!(
    /// A node's new state: `schedulable: false` cordons it, `failed: true` marks it failed (either or both).
    open NodeStateBody as "NodeState" { "schedulable": Optional<bool>, "failed": Optional<bool> }
);

/// Cordons a node (`schedulable: false`: no new work; what runs there goes on) or marks it failed
/// (`failed: true`: no new work, and what runs there is killed and goes through fault tolerance).
pub async fn put_node(
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

/// Quotas and capacity: the caller's groups (all for admins), from the scheduler's own view.
pub async fn quota(State(state): State<AppState>, headers: HeaderMap) -> ApiResult<Json<Items<QuotaLine>>> {
    let user = caller(&state, &headers).await?;
    let groups = (user.role != "admin").then_some(user.groups.as_slice());
    Ok(Json(state.views.quota_report(groups).into()))
}

/// The registry images this server's machine keeps, most recently used first (admin). Only the local backend
/// keeps a cache; elsewhere the list is empty.
pub async fn list_images(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> ApiResult<Json<Items<trainyard_images::Cached>>> {
    let user = caller(&state, &headers).await?;
    admin_only(&user)?;
    let backend = state.backend.clone();
    let items = tokio::task::spawn_blocking(move || backend.cached_images())
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(Json(items.into()))
}

/// Removes every cached image that no task runs or is about to run (admin).
pub async fn prune_images(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> ApiResult<Json<trainyard_images::Collected>> {
    let user = caller(&state, &headers).await?;
    admin_only(&user)?;
    let backend = state.backend.clone();
    let done = tokio::task::spawn_blocking(move || backend.prune_images())
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(Json(done))
}
