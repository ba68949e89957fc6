//! The cluster as the platform describes it: the catalog (read by all, each member the part offered to their
//! groups; replaced by admins), nodes cordoned or marked failed by admins, and quotas with what is left of them.

use crate::auth::{Admin, Caller, WithBody};
use crate::error::{ApiError, ApiResult, json_object};
use crate::routes::NoParams;
use crate::schema::{ApiSchema, Object, Optional, Schemas, named, object_schema, view};
use crate::settings::AdminSettings;
use crate::state::AppState;
use crate::views::Items;
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use trainyard_control::QuotaLine;
use trainyard_core::Catalog;

/// The store's name for the catalog document.
pub use trainyard_control::CATALOG_SETTING;

/// The catalog in force: whole for admins; for a member, what is offered to their project groups
/// ([`Catalog::seen_by`]), so no member learns another group's images (their references), volumes, datasets,
/// models or quotas.
pub async fn catalog(
    State(state): State<AppState>,
    _: Query<NoParams>,
    Caller { user, .. }: Caller,
) -> ApiResult<Json<Catalog>> {
    let catalog = state.catalog.get();
    if user.role == "admin" { Ok(Json((*catalog).clone())) } else { Ok(Json(catalog.seen_by(&user.groups))) }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogQuery {
    /// Replace the catalog even when it takes away what active tasks use.
    #[serde(default)]
    force: bool,
}

/// Replaces the catalog (YAML or JSON). It must be consistent in itself, and a field left out is empty or
/// closed (`allowExternalImages: false`). A catalog that takes away what active tasks use (their project
/// group, region, cluster, pool, instance spec, image, volumes, datasets, models, the quota they are
/// admitted under, the nodes their replicas run on) is refused with a 409 listing each conflict, unless
/// `force=true`: then tasks that no longer fit wait (queued) or are left to the backend (running).
pub async fn put_catalog(
    State(state): State<AppState>,
    Query(q): Query<CatalogQuery>,
    WithBody(Admin(_), body): WithBody<Admin>,
) -> ApiResult<Json<Catalog>> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest(
            "send the whole catalog (YAML or JSON) as the body; GET /api/v1/catalog answers the one in force"
                .into(),
        ));
    }
    let text = String::from_utf8(body.to_vec())
        .map_err(|_| ApiError::BadRequest("the catalog must be UTF-8".into()))?;
    let catalog = Catalog::from_yaml(&text).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    if !q.force {
        let conflicts = crate::catalog_guard::conflicts(&state, &state.catalog.get(), &catalog).await?;
        if !conflicts.is_empty() {
            return Err(ApiError::CatalogInUse(conflicts));
        }
    }
    state.writer.replace_catalog(catalog.clone()).await?;
    Ok(Json(catalog))
}

/// The API's settings (admin).
pub async fn get_settings(
    State(state): State<AppState>,
    _: Query<NoParams>,
    _: Admin,
) -> ApiResult<Json<AdminSettings>> {
    Ok(Json(AdminSettings::load(&state.store).await?))
}

/// Replaces the API's settings (admin); this server applies them at once, others sharing the store within
/// [`crate::settings::SETTINGS_CACHE_TTL`].
pub async fn put_settings(
    State(state): State<AppState>,
    _: Query<NoParams>,
    WithBody(Admin(_), body): WithBody<Admin>,
) -> ApiResult<Json<AdminSettings>> {
    let settings: AdminSettings = json_object(&body, r#"{"maxQueuedTasksPerUser": N}"#)?;
    if let Some(why) = settings.problems() {
        return Err(ApiError::BadRequest(why));
    }
    state.writer.put_setting(crate::settings::SETTINGS_SETTING, &settings.text()).await?;
    state.settings.set(settings.clone());
    Ok(Json(settings))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeStateBody {
    schedulable: Option<bool>,
    failed: Option<bool>,
}

/// Listed by hand rather than with `object_schema!` for `minProperties`: a body with neither field is refused.
impl ApiSchema for NodeStateBody {
    fn schema(schemas: &mut Schemas) -> serde_json::Value {
        named(schemas, "NodeState", |schemas| {
            let mut object = Object::default();
            object.field::<Optional<bool>>("schedulable", schemas);
            object.field::<Optional<bool>>("failed", schemas);
            let description = "A node's new state: `schedulable: false` cordons it, `failed: true` marks it \
                               failed (either or both).";
            let mut schema = object.finish(description, true);
            schema["minProperties"] = 1.into();
            schema
        })
    }
}

/// Cordons a node (`schedulable: false`: no new work; what runs there goes on) or marks it failed
/// (`failed: true`: no new work, and what runs there is killed and goes through fault tolerance).
pub async fn put_node(
    State(state): State<AppState>,
    _: Query<NoParams>,
    Path(name): Path<String>,
    WithBody(Admin(_), body): WithBody<Admin>,
) -> ApiResult<StatusCode> {
    let body: NodeStateBody =
        json_object(&body, r#"{"schedulable": BOOL, "failed": BOOL} (either or both)"#)?;
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
    state.writer.replace_catalog(catalog).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Quotas and capacity: the caller's groups (all for admins), from the scheduler's own view.
pub async fn quota(
    State(state): State<AppState>,
    _: Query<NoParams>,
    Caller { user, .. }: Caller,
) -> ApiResult<Json<Items<QuotaLine>>> {
    let groups = (user.role != "admin").then_some(user.groups.as_slice());
    Ok(Json(state.views.quota_report(groups).into()))
}

/// The registry images this server's machine keeps, most recently used first (admin). Only the local backend
/// keeps a cache; elsewhere the list is empty.
pub async fn list_images(
    State(state): State<AppState>,
    _: Query<NoParams>,
    _: Admin,
) -> ApiResult<Json<Items<trainyard_images::Cached>>> {
    let backend = state.backend.clone();
    let items = tokio::task::spawn_blocking(move || backend.cached_images())
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(Json(items.into()))
}

/// Removes every cached image that no task runs or is about to run (admin).
pub async fn prune_images(
    State(state): State<AppState>,
    _: Query<NoParams>,
    _: Admin,
) -> ApiResult<Json<trainyard_images::Collected>> {
    let backend = state.backend.clone();
    let done = tokio::task::spawn_blocking(move || backend.prune_images())
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(Json(done))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryLoginBody {
    username: String,
    password: String,
    #[serde(default, rename = "projectGroups")]
    project_groups: Vec<String>,
}
object_schema!(
    /// A registry's login: its user name and password (stored sealed; never answered with), and the project
    /// groups whose tasks may pull any image of the registry with it. Without groups it serves only the
    /// catalog's image presets of the registry, each for the groups it is offered to.
    closed RegistryLoginBody as "RegistryLogin" {
        "username": RegistryUsername,
        "password": RegistryPassword,
        "projectGroups": Optional<Vec<ProjectGroupName>>,
    }
);

/// The schema of a project group's name in a registry login (the server also refuses one the catalog lacks).
#[derive(Debug)]
pub struct ProjectGroupName;

impl ApiSchema for ProjectGroupName {
    fn schema(_: &mut Schemas) -> serde_json::Value {
        serde_json::json!({"type": "string", "minLength": 1})
    }
}

/// The longest registry user name, in characters.
const REGISTRY_USERNAME_MAX_CHARS: usize = 256;
/// The longest registry password, in characters.
const REGISTRY_PASSWORD_MAX_CHARS: usize = 4096;

/// The schema of a registry user name: it goes into `user:password` for basic auth, so no `:`, and on one line.
#[derive(Debug)]
pub struct RegistryUsername;

impl ApiSchema for RegistryUsername {
    fn schema(_: &mut Schemas) -> serde_json::Value {
        serde_json::json!({"type": "string", "minLength": 1, "maxLength": REGISTRY_USERNAME_MAX_CHARS,
                           "pattern": "^[^:\r\n]*$"})
    }
}

/// The schema of a registry password.
#[derive(Debug)]
pub struct RegistryPassword;

impl ApiSchema for RegistryPassword {
    fn schema(_: &mut Schemas) -> serde_json::Value {
        serde_json::json!({"type": "string", "minLength": 1, "maxLength": REGISTRY_PASSWORD_MAX_CHARS})
    }
}

view! {
    /// A registry host that has a login: its user name, when it was set, and the project groups it serves
    /// beyond the catalog's image presets (empty: the presets only).
    pub struct RegistryLoginEntry as "RegistryLoginEntry" {
        host: String,
        username: String,
        "updatedAtMs" updated_at_ms: i64,
        "projectGroups" project_groups: Vec<String>,
    }
}

/// The registries that have a login (admin; never the passwords).
pub async fn list_registry_logins(
    State(state): State<AppState>,
    _: Query<NoParams>,
    _: Admin,
) -> ApiResult<Json<Items<RegistryLoginEntry>>> {
    let all = trainyard_control::registry_logins::all(&state.store).await?;
    let items = all
        .into_iter()
        .map(|(host, s)| RegistryLoginEntry {
            host,
            username: s.username,
            updated_at_ms: s.updated_at_ms,
            project_groups: s.project_groups,
        })
        .collect::<Vec<_>>();
    Ok(Json(items.into()))
}

/// Sets the login Trainyard pulls images from a registry with (admin). The password is sealed under the
/// server key before it is stored and opened only for the launches it serves: tasks running a catalog image
/// preset of that registry offered to their group, and any task of a group the login names. It takes effect
/// at the next launch; a pull made with the old login answers no task that has the new one.
pub async fn put_registry_login(
    State(state): State<AppState>,
    _: Query<NoParams>,
    Path(host): Path<String>,
    WithBody(Admin(_), body): WithBody<Admin>,
) -> ApiResult<StatusCode> {
    let mut body: RegistryLoginBody =
        json_object(&body, r#"{"username": "...", "password": "...", "projectGroups": ["..."]}"#)?;
    let mut problems = Vec::new();
    if let Err(why) = trainyard_core::image_ref::check_registry(&host) {
        problems.push(format!("registry host {host:?}: {why}"));
    }
    // Counted in characters, as the messages and the document's maxLength say (not bytes).
    let (username_chars, password_chars) = (body.username.chars().count(), body.password.chars().count());
    if !(1..=REGISTRY_USERNAME_MAX_CHARS).contains(&username_chars)
        || body.username.contains([':', '\n', '\r'])
    {
        problems.push(format!(
            "username: 1 to {REGISTRY_USERNAME_MAX_CHARS} characters, without ':' or line breaks"
        ));
    }
    if !(1..=REGISTRY_PASSWORD_MAX_CHARS).contains(&password_chars) {
        problems.push(format!("password: 1 to {REGISTRY_PASSWORD_MAX_CHARS} characters"));
    }
    body.project_groups.sort();
    body.project_groups.dedup();
    let catalog = state.catalog.get();
    for g in body.project_groups.iter().filter(|g| !catalog.project_groups.contains_key(*g)) {
        problems.push(format!(
            "projectGroups: project group {g:?} is not in the catalog (its groups: {})",
            catalog.project_groups.keys().cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    if !problems.is_empty() {
        return Err(ApiError::BadRequest(problems.join("; ")));
    }
    let now = state.now_ms();
    let login = trainyard_control::registry_logins::seal(
        &state.secrets,
        &host,
        &body.username,
        &body.password,
        body.project_groups,
        now,
    )
    .map_err(|e| ApiError::Internal(e.to_string()))?;
    state.writer.put_registry_login(&host, login).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Removes a registry's login (admin).
pub async fn delete_registry_login(
    State(state): State<AppState>,
    _: Query<NoParams>,
    Path(host): Path<String>,
    _: Admin,
) -> ApiResult<StatusCode> {
    if state.writer.remove_registry_login(&host).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFoundWhat(format!("registry {host:?} has no login")))
    }
}
