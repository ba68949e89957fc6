//! The one way a task enters the system through the API: create and clone both go through [`submit`], which
//! checks the document, the caller's membership of its project group, catalog entries kept from members
//! (the `host` image), its webhooks and the caller's cap on queued tasks, then stores it through the control
//! crate and hands it to the loop.

use crate::auth::{audience, may_use_catalog, may_use_group};
use crate::error::{ApiError, ApiResult};
use crate::settings::check_queued_cap;
use crate::state::AppState;
use std::borrow::Cow;
use trainyard_core::spec::AlarmSubscription;
use trainyard_core::{Report, TrainingTask};
use trainyard_store::{Created, User};

/// The longest `Idempotency-Key` accepted.
pub const IDEMPOTENCY_KEY_MAX_BYTES: usize = 255;

/// What a caller asks to create.
#[derive(Debug)]
pub enum Draft<'a> {
    /// A document as the caller sent it (YAML or JSON), with the `Idempotency-Key` if any.
    Document { body: &'a [u8], idempotency_key: Option<&'a str> },
    /// A copy of a stored task, already given its project group and the caller's hidden values.
    Copy(Box<TrainingTask>),
}

/// A task stored by [`submit`], with the checked document it was made from.
#[derive(Debug)]
pub struct Submitted {
    pub created: Created,
    pub task: TrainingTask,
}

/// Checks a draft and stores it as the caller's task. Every check a submission needs is here, in this
/// order: membership (first for a copy, whose group is known before its document is checked, so a copy into
/// another group is refused as such rather than for the hidden values it would have to be given), the
/// document against the catalog, membership of the checked document's group, the catalog's own limits,
/// the webhooks, the caller's queued tasks against their cap; then the store, and the control loop is told.
pub async fn submit(state: &AppState, user: &User, draft: Draft<'_>) -> ApiResult<Submitted> {
    let (body, idempotency_key) = match &draft {
        Draft::Document { body, idempotency_key } => {
            if let Some(key) = idempotency_key {
                check_idempotency_key(key)?;
            }
            if body.iter().all(u8::is_ascii_whitespace) {
                return Err(ApiError::BadRequest(
                    "send the task document (YAML or JSON) as the body; the body is empty".into(),
                ));
            }
            (Cow::Borrowed(*body), *idempotency_key)
        }
        Draft::Copy(task) => {
            may_use_group(user, &task.metadata.project_group)?;
            (Cow::Owned(task.to_json().into_bytes()), None)
        }
    };
    let task = state.submitter.validate_for(&body, audience(user))?;
    may_use_group(user, &task.metadata.project_group)?;
    may_use_catalog(state, user, &task)?;
    if let Some(w) = &task.spec.environment.workdir {
        crate::routes::workdirs::use_workdir(state, &task.metadata.project_group, w).await?;
    }
    let webhooks = webhook_problems(state, "spec.advanced.alarms", &task.spec.advanced.alarms).await;
    if !webhooks.is_ok() {
        return Err(ApiError::Invalid(webhooks));
    }
    // Held until the task is stored: near the cap, the caller's creates take turns.
    let pass = check_queued_cap(&state.settings, &state.store, &user.name, idempotency_key).await?;
    let created = state.submitter.submit(&user.name, &task, &body, idempotency_key, state.now_ms()).await?;
    drop(pass);
    state.wake.notify_one();
    Ok(Submitted { created, task })
}

/// An empty key would make every keyless retry of a client "the same request".
fn check_idempotency_key(key: &str) -> ApiResult<()> {
    if key.trim().is_empty() || key.len() > IDEMPOTENCY_KEY_MAX_BYTES {
        return Err(ApiError::BadRequest(format!(
            "Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_MAX_BYTES} visible characters (a UUID is usual), or left out"
        )));
    }
    Ok(())
}

/// Webhook destinations the server will not send to (loopback, private, ... unless allowed), as problems at
/// `base[i].webhook`. For a task's alarms here, and for a user's own subscriptions and `/validate`.
pub async fn webhook_problems(state: &AppState, base: &str, subs: &[AlarmSubscription]) -> Report {
    let mut report = Report::default();
    for (i, sub) in subs.iter().enumerate() {
        if let Err(why) = state.webhooks.policy().check_url(&sub.webhook).await {
            report.error(format!("{base}[{i}].webhook"), trainyard_core::Code::RestrictedAddress, why);
        }
    }
    report
}
