//! Who the caller is (their bearer token) and what they may do: see a task, operate it, use a project
//! group, use a catalog entry beyond the validator's group rules, act as admin or on their own account.
//!
//! Handlers name who may call them in their arguments: [`Caller`] (any enabled user with a known token) or
//! [`Admin`], and [`WithBody`] around either when they read the request's body.

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::tokens::token_hash;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use trainyard_core::TrainingTask;
use trainyard_store::{TaskRecord, User};

/// The hash of the request's bearer token, if it has one.
fn bearer_hash(headers: &HeaderMap) -> Option<String> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))?;
    Some(token_hash(token.trim()))
}

/// The caller, from `Authorization: Bearer TOKEN`: 401 without a known token, 403 when the user is disabled.
/// A token looked up in the store (not in the cache: at most every few seconds per token) has its last use
/// recorded, off the request's path.
async fn caller(state: &AppState, headers: &HeaderMap) -> ApiResult<Caller> {
    let hash = bearer_hash(headers).ok_or(ApiError::Unauthorized)?;
    let (user, disabled) = match state.tokens.get(&hash) {
        Some(found) => found,
        None => {
            let found = state.store.token_account(&hash).await?.ok_or(ApiError::Unauthorized)?;
            let (writer, used) = (state.writer.clone(), hash.clone());
            tokio::spawn(async move {
                if let Err(e) = writer.touch_token(&used).await {
                    eprintln!("trainyard: recording a token's use: {e}");
                }
            });
            state.tokens.put(hash.clone(), found.clone());
            found
        }
    };
    if disabled {
        return Err(ApiError::Disabled(user.name));
    }
    Ok(Caller { user, token_hash: hash })
}

/// The caller, as an extractor: any user with a known token whose account is enabled (401 without a known
/// token, 403 `account-disabled` for a disabled user; a deleted user has no tokens left).
#[derive(Debug)]
pub struct Caller {
    pub user: User,
    /// The hash of the token the request came with (a token's id is its first characters).
    pub token_hash: String,
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> ApiResult<Caller> {
        caller(state, &parts.headers).await
    }
}

/// An admin caller, as an extractor: as [`Caller`], and a member is refused (403 `forbidden`).
#[derive(Debug)]
pub struct Admin(pub User);

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> ApiResult<Admin> {
        let Caller { user, .. } = caller(state, &parts.headers).await?;
        admin_only(&user)?;
        Ok(Admin(user))
    }
}

/// The proof one server on a store gives another (a follower asking the leader what only the leader knows):
/// a digest of the key every server on the store shares, sent as its bearer token.
pub fn peer_proof(secrets: &trainyard_control::secrets::SecretBox) -> String {
    format!("peer.{}", secrets.digest(b"trainyard peer server"))
}

/// Another server on the store ([`peer_proof`]), or an admin.
#[derive(Debug)]
pub struct PeerOrAdmin;

impl FromRequestParts<AppState> for PeerOrAdmin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> ApiResult<PeerOrAdmin> {
        let sent = parts.headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        if let Some(token) = sent.and_then(|v| v.strip_prefix("Bearer ")).map(str::trim)
            && token.starts_with("peer.")
        {
            // Compared as digests of each, so the time taken says nothing of the proof.
            if token_hash(token) == token_hash(&peer_proof(&state.secrets)) {
                return Ok(PeerOrAdmin);
            }
            return Err(ApiError::Unauthorized);
        }
        Admin::from_request_parts(parts, state).await.map(|_| PeerOrAdmin)
    }
}

/// Who calls ([`Caller`] or [`Admin`]) and the request's body, for handlers that read one. A body the
/// server refuses to read (over the body limit: 413) is answered before whatever the caller check said,
/// whoever sends it: the handlers read their body before they looked at the token, and answer as they did.
#[derive(Debug)]
pub struct WithBody<C>(pub C, pub Bytes);

impl<C> FromRequest<AppState> for WithBody<C>
where
    C: FromRequestParts<AppState, Rejection = ApiError> + Send,
{
    type Rejection = Response;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Response> {
        let (mut parts, body) = req.into_parts();
        let who = C::from_request_parts(&mut parts, state).await;
        let body = Bytes::from_request(Request::from_parts(parts, body), state)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(WithBody(who.map_err(IntoResponse::into_response)?, body))
    }
}

/// Whose view of the catalog a message may draw on: a member's groups, or None for an admin (the whole).
pub fn audience(user: &User) -> Option<&[String]> {
    (!is_admin(user)).then_some(user.groups.as_slice())
}

fn is_admin(user: &User) -> bool {
    user.role == "admin"
}

/// The task, if the caller may see it; 404 otherwise.
pub async fn visible_task(state: &AppState, user: &User, id: &str) -> ApiResult<TaskRecord> {
    let t = state.store.get_task(id).await?.ok_or(ApiError::NotFound)?;
    if state.store.visible(&t, &user.viewer()).await? { Ok(t) } else { Err(ApiError::NotFound) }
}

/// The task, if the caller may operate it: owner, admin or shared with operate rights.
pub async fn operable_task(state: &AppState, user: &User, id: &str) -> ApiResult<TaskRecord> {
    let t = visible_task(state, user, id).await?;
    if is_admin(user) || t.owner == user.name || state.store.may_operate(&t.id, &user.name).await? {
        Ok(t)
    } else {
        Err(ApiError::Forbidden(format!(
            "you may see {} but not operate it; ask its owner to share it with operate rights",
            t.name
        )))
    }
}

/// Membership: a task goes to one of the caller's groups (admins may use any). The one check for every
/// submission, create and clone alike (see `submit`).
pub fn may_use_group(user: &User, group: &str) -> ApiResult<()> {
    if is_admin(user) || user.groups.iter().any(|g| g == group) {
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
pub fn may_use_catalog(state: &AppState, user: &User, task: &TrainingTask) -> ApiResult<()> {
    use trainyard_core::catalog::HOST_IMAGE;
    if is_admin(user) || task.spec.environment.image != HOST_IMAGE {
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

/// Admins only.
pub fn admin_only(user: &User) -> ApiResult<()> {
    if is_admin(user) { Ok(()) } else { Err(ApiError::Forbidden("only admins may do this".into())) }
}

/// Admins, or the user themself; `what` names what is refused to others ("manage other users' TaskEnv").
pub fn self_or_admin(user: &User, name: &str, what: &str) -> ApiResult<()> {
    if is_admin(user) || user.name == name {
        Ok(())
    } else {
        Err(ApiError::Forbidden(format!("only admins may {what}")))
    }
}

impl Caller {
    /// The caller acting on a user's own things (tokens, TaskEnv, alarm subscriptions): the user themself or
    /// an admin (`what` says what others may not do), and a user that exists.
    pub async fn acting_on(&self, state: &AppState, name: &str, what: &str) -> ApiResult<()> {
        self_or_admin(&self.user, name, what)?;
        known_user(state, name).await?;
        Ok(())
    }
}

/// The user, or a 404 that says there is no such user.
pub async fn known_user(state: &AppState, name: &str) -> ApiResult<User> {
    state.store.get_user(name).await?.ok_or_else(|| ApiError::NotFoundWhat(format!("no such user {name:?}")))
}
