//! Sharing a task with other users: give a share (view, or view and operate), list them, take one back.
//! The owner and admins manage a task's shares; a user may also give back a share they were given.

use crate::auth::{Caller, WithBody, visible_task};
use crate::error::{ApiError, ApiResult, json_object};
use crate::routes::NoParams;
use crate::schema::{Optional, object_schema, view};
use crate::state::AppState;
use crate::views::Items;
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use trainyard_store::{TaskRecord, User};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShareBody {
    user: String,
    #[serde(default)]
    operate: bool,
}
object_schema!(
    /// Whom to share with, and whether they may operate the task too (stop, resubmit, delete, clone).
    closed ShareBody as "Share" { "user": String, "operate": Optional<bool> }
);

view! {
    /// A user the task is shared with, and whether they may operate it too (stop, resubmit, delete, clone).
    pub struct ShareEntry as "ShareEntry" {
        pub user: String,
        /// May also stop, resubmit, delete and clone it.
        pub operate: bool,
    }
}

/// The owner and admins manage a task's shares.
fn may_manage(user: &User, t: &TaskRecord, what: &str) -> ApiResult<()> {
    if user.role != "admin" && t.owner != user.name {
        return Err(ApiError::Forbidden(format!("only the owner of {} or an admin can {what}", t.name)));
    }
    Ok(())
}

/// Shares a task with a user (view, or view and operate). Owner and admins only.
pub async fn share_task(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: Query<NoParams>,
    WithBody(Caller { user, .. }, body): WithBody<Caller>,
) -> ApiResult<StatusCode> {
    let t = visible_task(&state, &user, &id).await?;
    let body: ShareBody = json_object(&body, r#"{"user": NAME, "operate": BOOL}"#)?;
    may_manage(&user, &t, "share it")?;
    if state.store.get_user(&body.user).await?.is_none() {
        return Err(ApiError::BadRequest(format!("there is no user {:?}", body.user)));
    }
    state.writer.share(&t.id, &body.user, body.operate).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The users a task is shared with. Owner and admins only.
pub async fn list_shares(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: Query<NoParams>,
    Caller { user, .. }: Caller,
) -> ApiResult<Json<Items<ShareEntry>>> {
    let t = visible_task(&state, &user, &id).await?;
    may_manage(&user, &t, "see whom it is shared with")?;
    let items = state.store.shares(&t.id).await?;
    Ok(Json(items.into_iter().map(|(user, operate)| ShareEntry { user, operate }).collect::<Vec<_>>().into()))
}

/// Takes a share back: the owner and admins, or the user it was given to (giving it back). From then on the
/// user sees the task only as anyone else would (a public task stays visible to its group's members).
pub async fn unshare_task(
    State(state): State<AppState>,
    Path((id, name)): Path<(String, String)>,
    _: Query<NoParams>,
    Caller { user, .. }: Caller,
) -> ApiResult<StatusCode> {
    let t = visible_task(&state, &user, &id).await?;
    if user.name != name {
        may_manage(&user, &t, "take its shares back")?;
    }
    if !state.writer.unshare(&t.id, &name).await? {
        return Err(ApiError::NotFoundWhat(format!(
            "{} is not shared with {name:?}; GET /api/v1/tasks/{}/shares lists whom it is",
            t.name, t.id
        )));
    }
    Ok(StatusCode::NO_CONTENT)
}
