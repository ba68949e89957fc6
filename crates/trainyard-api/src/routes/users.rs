//! Users and what belongs to them: who the caller is, the users admins manage (disable, enable, delete, and
//! what becomes of their work), API tokens,
//! TaskEnv variables and alarm subscriptions.

use crate::auth::{Admin, Caller, WithBody, known_user, self_or_admin};
use crate::error::{ApiError, ApiResult, json_body, json_object};
use crate::routes::NoParams;
use crate::schema::{ApiSchema, Optional, Schemas, object_schema};
use crate::state::AppState;
use crate::submit::webhook_problems;
use crate::tokens::{new_token, token_hash};
use crate::views::{EnvEntry, Items, NewToken, RecentImage, Role, TokenEntry, UserEntry, UserView};
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::Value;
use trainyard_control::{AccountChange, QueuedWork, RunningWork, WorkChoice};
use trainyard_core::Report;
use trainyard_core::spec::AlarmSubscription;
use trainyard_store::User;

pub async fn whoami(_: Query<NoParams>, Caller { user, .. }: Caller) -> ApiResult<Json<UserView>> {
    Ok(Json(UserView { name: user.name, role: user.role, groups: user.groups }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserBody {
    name: String,
    role: String,
    #[serde(default)]
    groups: Vec<String>,
}
object_schema!(
    /// A user to create or update: name, role and project groups (each in the catalog).
    closed UserBody as "UserUpdate" { "name": UserName, "role": Role, "groups": Optional<Vec<String>> }
);

/// The schema of a new user's name: what [`put_user`] takes.
#[derive(Debug)]
pub struct UserName;

impl ApiSchema for UserName {
    fn schema(_: &mut Schemas) -> Value {
        serde_json::json!({"type": "string", "pattern": format!("^[A-Za-z0-9._-]{{1,{USER_NAME_MAX_BYTES}}}$")})
    }
}

/// Every user with their role, project groups and state (disabled, deleted, work held), deleted users
/// included (admin). Never a token or a hash: tokens are kept as hashes
/// in a table of their own and shown once, when made.
pub async fn list_users(
    State(state): State<AppState>,
    _: Query<NoParams>,
    _: Admin,
) -> ApiResult<Json<Items<UserEntry>>> {
    let states = state.store.account_states().await?;
    let items = state
        .store
        .list_users()
        .await?
        .into_iter()
        .map(|u| {
            let s = states.get(&u.name).copied().unwrap_or_default();
            let work_held = trainyard_control::accounts::holds(s);
            UserEntry {
                name: u.name,
                role: u.role,
                groups: u.groups,
                disabled: s.disabled,
                deleted: s.deleted,
                work_held,
            }
        })
        .collect::<Vec<_>>();
    Ok(Json(items.into()))
}

/// The longest user name (it is in every task record, event and share).
pub const USER_NAME_MAX_BYTES: usize = 64;

/// Creates or updates a user.
pub async fn put_user(
    State(state): State<AppState>,
    _: Query<NoParams>,
    WithBody(Admin(_), body): WithBody<Admin>,
) -> ApiResult<Json<UserView>> {
    let body: UserBody = json_object(&body, r#"{"name", "role", "groups"}"#)?;
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
    if !state.writer.put_user(&u).await? {
        return Err(ApiError::Conflict(format!(
            "user {:?} was deleted, and a deleted user's name is not used again (their tasks, shares and \
             events still name them); choose another name",
            u.name
        )));
    }
    // A new role or groups count from the next request here (elsewhere: within the cache's TTL).
    state.tokens.forget_user(&u.name);
    Ok(Json(UserView { name: u.name, role: u.role, groups: u.groups }))
}

/// What an admin chooses for a disabled or deleted user's work (the body of disable and delete, which may be
/// left out: queued work held, running work stopped).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkBody {
    #[serde(default)]
    queued: QueuedChoice,
    #[serde(default)]
    running: RunningChoice,
}
object_schema!(
    /// What becomes of the user's work. `queued`: `hold` (the default: not admitted until the user is
    /// enabled again; each says so as its wait reason), `stop` (stopped now; any queued later is held) or
    /// `keep` (admitted as before). `running` (admitted, starting or running tasks): `stop` (the default:
    /// stopped as a user's stop is, the exit checkpoint protocol included) or `keep` (they run to their end).
    closed WorkBody as "UserWork" { "queued": Optional<QueuedChoice>, "running": Optional<RunningChoice> }
);

/// `queued` of [`WorkBody`].
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueuedChoice {
    #[default]
    Hold,
    Stop,
    Keep,
}

/// `running` of [`WorkBody`].
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunningChoice {
    #[default]
    Stop,
    Keep,
}

impl ApiSchema for QueuedChoice {
    fn schema(_: &mut Schemas) -> Value {
        serde_json::json!({"type": "string", "enum": ["hold", "stop", "keep"]})
    }
}

impl ApiSchema for RunningChoice {
    fn schema(_: &mut Schemas) -> Value {
        serde_json::json!({"type": "string", "enum": ["stop", "keep"]})
    }
}

impl WorkBody {
    /// The body, or the defaults when there is none (the disable route took no body before).
    fn read(body: &Bytes) -> ApiResult<WorkChoice> {
        let b: WorkBody = if body.iter().all(u8::is_ascii_whitespace) {
            WorkBody::default()
        } else {
            json_object(
                body,
                r#"{"queued": "hold" | "stop" | "keep", "running": "stop" | "keep"} (or no body)"#,
            )?
        };
        Ok(WorkChoice {
            queued: match b.queued {
                QueuedChoice::Hold => QueuedWork::Hold,
                QueuedChoice::Stop => QueuedWork::Stop,
                QueuedChoice::Keep => QueuedWork::Keep,
            },
            running: match b.running {
                RunningChoice::Stop => RunningWork::Stop,
                RunningChoice::Keep => RunningWork::Keep,
            },
        })
    }
}

/// Disables a user (admins): every token of theirs is refused with a 403 that says so (within
/// [`crate::TOKEN_CACHE_TTL`] on other servers), and their work goes as the body says ([`WorkBody`]; by
/// default queued tasks held, running ones stopped). Admins cannot disable themselves (there would be no
/// one left to undo it, perhaps).
pub async fn disable_user(
    State(state): State<AppState>,
    Path(name): Path<String>,
    _: Query<NoParams>,
    WithBody(Admin(user), body): WithBody<Admin>,
) -> ApiResult<StatusCode> {
    let choice = WorkBody::read(&body)?;
    if name == user.name {
        return Err(ApiError::Conflict("you cannot disable yourself; ask another admin".into()));
    }
    change_account(&state, &name, AccountChange::Disable(choice)).await
}

/// Enables a disabled user again (admins): their tokens work again, and their held tasks are released.
pub async fn enable_user(
    State(state): State<AppState>,
    Path(name): Path<String>,
    _: Query<NoParams>,
    _: Admin,
) -> ApiResult<StatusCode> {
    change_account(&state, &name, AccountChange::Enable).await
}

/// Deletes a user (admins): every token of theirs is removed at once, so they can no longer sign in or call
/// the API (401); their work goes as for a disable ([`WorkBody`]); their tasks stay for the record, readable
/// by admins and by whoever could see them, the owner shown as deleted. The name is retired: a deleted user
/// cannot be enabled, and the name cannot be given to a new user (who would otherwise own the old tasks,
/// shares and TaskEnv). Admins cannot delete themselves.
pub async fn delete_user(
    State(state): State<AppState>,
    Path(name): Path<String>,
    _: Query<NoParams>,
    WithBody(Admin(user), body): WithBody<Admin>,
) -> ApiResult<StatusCode> {
    let choice = WorkBody::read(&body)?;
    if name == user.name {
        return Err(ApiError::Conflict("you cannot delete yourself; ask another admin".into()));
    }
    change_account(&state, &name, AccountChange::Delete(choice)).await
}

/// The change made through the control loop (the account written, then the work stopped as chosen), and
/// the user's tokens forgotten by this server's cache.
async fn change_account(state: &AppState, name: &str, change: AccountChange) -> ApiResult<StatusCode> {
    let result = state.control.lock().await.change_account(name, change, state.now_ms()).await;
    state.tokens.forget_user(name);
    result?;
    state.wake.notify_one();
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBody {
    #[serde(default)]
    label: String,
}
object_schema!(
    /// A label to tell the token by (the body may be left out).
    closed TokenBody as "TokenRequest" { "label": Optional<String> }
);

/// The longest token label (it is listed with every token).
pub const TOKEN_LABEL_MAX_BYTES: usize = 200;

/// A new token for a user, shown in this answer only.
pub async fn create_token(
    State(state): State<AppState>,
    _: Query<NoParams>,
    Path(name): Path<String>,
    WithBody(Caller { user, .. }, body): WithBody<Caller>,
) -> ApiResult<(StatusCode, Json<NewToken>)> {
    self_or_admin(&user, &name, "create tokens for other users")?;
    // No body at all is no label; anything else must be the object (an array, say, mints nothing).
    let label = if body.iter().all(u8::is_ascii_whitespace) {
        String::new()
    } else {
        json_object::<TokenBody>(&body, r#"{"label": TEXT} (or no body)"#)?.label
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
    state.writer.add_token(&hash, &name, &label).await?;
    let id = hash[..trainyard_store::TOKEN_ID_LEN].to_owned();
    Ok((StatusCode::CREATED, Json(NewToken { user: name, token, id, label })))
}

/// A user's tokens (admins, or the user themself): id, label, creation time, last use (to the minute) and
/// whether it is the one this request came with; never the token.
pub async fn list_tokens(
    State(state): State<AppState>,
    _: Query<NoParams>,
    Path(name): Path<String>,
    caller: Caller,
) -> ApiResult<Json<Items<TokenEntry>>> {
    caller.acting_on(&state, &name, "list other users' tokens").await?;
    let this = &caller.token_hash[..trainyard_store::TOKEN_ID_LEN];
    let items = state
        .store
        .list_tokens(&name)
        .await?
        .into_iter()
        .map(|t| TokenEntry {
            current: this == t.id,
            id: t.id,
            label: t.label,
            created_at_ms: t.created_at_ms,
            last_used_at_ms: t.last_used_at_ms,
        })
        .collect::<Vec<_>>();
    Ok(Json(items.into()))
}

/// Revokes one of a user's tokens by its id (admins, or the user themself). Refused from then on by this
/// server, and by others sharing the store within [`crate::TOKEN_CACHE_TTL`].
pub async fn revoke_token(
    State(state): State<AppState>,
    _: Query<NoParams>,
    Path((name, id)): Path<(String, String)>,
    caller: Caller,
) -> ApiResult<StatusCode> {
    caller.acting_on(&state, &name, "revoke other users' tokens").await?;
    if !state.writer.revoke_token(&name, &id).await? {
        return Err(ApiError::NotFoundWhat(format!(
            "user {name} has no token {id:?}; GET /api/v1/users/{name}/tokens lists their ids"
        )));
    }
    state.tokens.forget_user(&name);
    Ok(StatusCode::NO_CONTENT)
}

/// A user's TaskEnv, hidden values masked.
pub async fn list_task_env(
    State(state): State<AppState>,
    _: Query<NoParams>,
    Path(name): Path<String>,
    caller: Caller,
) -> ApiResult<Json<Items<EnvEntry>>> {
    caller.acting_on(&state, &name, "manage other users' TaskEnv").await?;
    let items = state
        .store
        .task_env(&name)
        .await?
        .into_iter()
        .map(|v| {
            let value = if v.hidden { trainyard_core::spec::HIDDEN_VALUE_MASK.to_owned() } else { v.value };
            EnvEntry { name: v.name, value, hidden: v.hidden }
        })
        .collect::<Vec<_>>();
    Ok(Json(items.into()))
}

/// The images a user's newest tasks ran, newest first, each once (at most 20, from the newest 200 tasks):
/// what the console offers beside the catalog's presets.
pub async fn list_recent_images(
    State(state): State<AppState>,
    _: Query<NoParams>,
    Path(name): Path<String>,
    caller: Caller,
) -> ApiResult<Json<Items<RecentImage>>> {
    caller.acting_on(&state, &name, "see other users' images").await?;
    let mut items: Vec<RecentImage> = Vec::new();
    for (spec, created_at_ms) in state.store.recent_specs(&name, 200).await? {
        let Ok(v) = serde_json::from_str::<Value>(&spec) else { continue };
        let Some(image) = v["spec"]["environment"]["image"].as_str() else { continue };
        if !image.is_empty() && !items.iter().any(|x| x.image == image) {
            items.push(RecentImage { image: image.to_owned(), last_used_ms: created_at_ms });
        }
        if items.len() == 20 {
            break;
        }
    }
    Ok(Json(items.into()))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskEnvBody {
    name: String,
    value: String,
    #[serde(default)]
    hidden: bool,
}
object_schema!(
    /// One TaskEnv variable; a hidden value is sealed at rest and never shown again.
    closed TaskEnvBody as "TaskEnvUpdate" { "name": EnvName, "value": EnvValue, "hidden": Optional<bool> }
);

/// The schema of a TaskEnv variable's name: a task's env rules (`check_env_name`); names the platform sets
/// are refused too (422 `reserved-name`).
#[derive(Debug)]
pub struct EnvName;

impl ApiSchema for EnvName {
    fn schema(_: &mut Schemas) -> Value {
        use trainyard_core::validate::{RESERVED_ENV, RESERVED_ENV_PREFIX};
        let description = format!(
            "ASCII letters, digits and _, not starting with a digit; not a name the platform sets ({}, or \
             starting with {RESERVED_ENV_PREFIX}): that is a 422 (reserved-name)",
            RESERVED_ENV.join(", ")
        );
        serde_json::json!({"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$", "description": description})
    }
}

/// The schema of a TaskEnv value: a task's env rules (not empty; no NUL; a byte limit that JSON Schema,
/// counting characters, cannot state; a hidden value is not the mask).
#[derive(Debug)]
pub struct EnvValue;

impl ApiSchema for EnvValue {
    fn schema(_: &mut Schemas) -> Value {
        use trainyard_core::spec::HIDDEN_VALUE_MASK;
        use trainyard_core::validate::limits::ENV_VALUE_MAX_BYTES;
        let description = format!(
            "not empty, no NUL character, at most {ENV_VALUE_MAX_BYTES} bytes, and a hidden one not the mask \
             {HIDDEN_VALUE_MASK}: each a 422"
        );
        serde_json::json!({"type": "string", "minLength": 1, "description": description})
    }
}

/// Sets one TaskEnv variable (names and values follow the task env rules).
pub async fn put_task_env(
    State(state): State<AppState>,
    _: Query<NoParams>,
    Path(name): Path<String>,
    WithBody(caller, body): WithBody<Caller>,
) -> ApiResult<StatusCode> {
    caller.acting_on(&state, &name, "manage other users' TaskEnv").await?;
    let body: TaskEnvBody = json_object(&body, r#"{"name", "value", "hidden"}"#)?;
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
    state.writer.put_task_env(&name, &stored).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn delete_task_env(
    State(state): State<AppState>,
    _: Query<NoParams>,
    Path((name, var)): Path<(String, String)>,
    caller: Caller,
) -> ApiResult<StatusCode> {
    caller.acting_on(&state, &name, "manage other users' TaskEnv").await?;
    if state.writer.delete_task_env(&name, &var).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFoundWhat(format!("{name} has no TaskEnv variable {var:?}")))
    }
}

/// A user's own alarm subscriptions: they apply to every task the user owns.
pub async fn get_user_alarms(
    State(state): State<AppState>,
    _: Query<NoParams>,
    Path(name): Path<String>,
    caller: Caller,
) -> ApiResult<Json<Items<AlarmSubscription>>> {
    caller.acting_on(&state, &name, "manage other users' alarm subscriptions").await?;
    let subs = trainyard_control::alarms::user_subscriptions(&state.store, &name).await?;
    Ok(Json(subs.into()))
}

/// Replaces a user's own alarm subscriptions (a JSON list, checked like a task's `advanced.alarms`).
pub async fn put_user_alarms(
    State(state): State<AppState>,
    _: Query<NoParams>,
    Path(name): Path<String>,
    WithBody(caller, body): WithBody<Caller>,
) -> ApiResult<StatusCode> {
    use trainyard_core::decode::{Decode, Decoder};
    caller.acting_on(&state, &name, "manage other users' alarm subscriptions").await?;
    let value: Value = json_body(&body, "a JSON list")?;
    let mut d = Decoder::default();
    let subs = Vec::<AlarmSubscription>::decode(&value, "alarms", &mut d).unwrap_or_default();
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
    state.writer.put_user_alarms(&name, &subs).await?;
    Ok(StatusCode::NO_CONTENT)
}
