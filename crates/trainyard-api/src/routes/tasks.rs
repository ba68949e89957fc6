//! Tasks: create, check without creating, list, read, stop, resubmit, delete, share and clone.

use crate::auth::{Caller, WithBody, may_use_group, operable_task, visible_task};
use crate::error::{ApiError, ApiResult, json_object};
use crate::routes::NoParams;
use crate::schema::{Optional, object_schema};
use crate::settings::check_queued_cap;
use crate::state::AppState;
use crate::submit::{Draft, Submitted, submit, webhook_problems};
use crate::views::{
    Admission, BulkDeleted, BulkFailure, FragmentationView, Spec, TaskPage, TaskView, Validation, task_view,
};
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::collections::BTreeMap;
use trainyard_core::lifecycle::Status;
use trainyard_core::spec::TaskType;
use trainyard_store::{Accelerator, Created, MAX_PAGE, StoreError, TaskFilter, TaskRecord, User};

/// Checks a task document without creating it: every problem, and the demand of each instance-spec option
/// when it is valid. The console calls it as the user types.
pub async fn validate_task(
    State(state): State<AppState>,
    _: Query<NoParams>,
    WithBody(Caller { user, .. }, body): WithBody<Caller>,
) -> ApiResult<Json<Validation>> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest(
            "send the task document (YAML or JSON) to check as the body; the body is empty".into(),
        ));
    }
    let catalog = state.catalog.get();
    let mut checked = trainyard_core::check_for(&body, &catalog, crate::auth::audience(&user));
    if let Some(task) = &checked.task {
        let found = webhook_problems(&state, "spec.advanced.alarms", &task.spec.advanced.alarms).await;
        checked.report.problems.extend(found.problems);
    }
    let demand = checked.valid_task().and_then(|task| {
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
            (Some(Admission { now: false, reason }), None)
        }
        Some(task) => {
            // A scheduling cycle over the last tick's view: CPU work that grows with the queue, so it runs off
            // the async workers, and without the control loop's lock.
            let (views, task) = (state.views.clone(), task.clone());
            let ((now, reason), frag) = tokio::task::spawn_blocking(move || {
                (views.would_admit(&task, state.now_ms().max(0) as u64), views.fragmentation(&task))
            })
            .await
            .map_err(|e| ApiError::Internal(format!("the admission check failed: {e}")))?;
            let frag = frag
                .into_iter()
                .map(|(spec, f)| FragmentationView {
                    spec,
                    replicas_fit: f.replicas_fit,
                    nodes_with_room: f.nodes_with_room,
                    free_units: f.free_units_histogram,
                })
                .collect();
            (Some(Admission { now, reason }), Some(frag))
        }
        None => (None, None),
    };
    // The document as the decoder read it (defaults filled in), as JSON for a form and as YAML for an editor.
    let yaml = checked.task.as_ref().map(|t| t.to_yaml());
    Ok(Json(Validation {
        valid: checked.report.is_ok(),
        problems: checked.report.problems,
        demand,
        admission,
        fragmentation,
        task: checked.task,
        yaml,
    }))
}

/// Creates a task from a YAML or JSON document: 201, or 200 with the first task when an `Idempotency-Key`
/// was used before with the same document.
pub async fn create_task(
    State(state): State<AppState>,
    headers: HeaderMap,
    _: Query<NoParams>,
    WithBody(Caller { user, .. }, body): WithBody<Caller>,
) -> ApiResult<Response> {
    let key = headers.get("idempotency-key").map(|v| v.to_str()).transpose();
    let key = key.map_err(|_| ApiError::BadRequest("Idempotency-Key must be ASCII".into()))?;
    let Submitted { created, task } =
        submit(&state, &user, Draft::Document { body: &body, idempotency_key: key }).await?;
    let (status, spec) = match &created {
        Created::New(_) => (StatusCode::CREATED, Spec::Submitted(&task)),
        Created::Existing(_) => (StatusCode::OK, Spec::Stored),
    };
    Ok((status, Json(task_view(&state, created.task(), spec))).into_response())
}

/// Tasks per page when `limit` is not given.
pub const DEFAULT_PAGE: u32 = 50;

/// The filters a list and a bulk delete share (every one given must hold).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Filters {
    /// A status, in any case.
    status: Option<String>,
    /// PyTorchJob or RayJob, in any case.
    #[serde(rename = "type")]
    task_type: Option<String>,
    /// `group[,group...]`: any of these.
    group: Option<String>,
    owner: Option<String>,
    q: Option<String>,
    /// `key=value[,key=value...]`
    labels: Option<String>,
    /// `gpu` or `cpu`, in any case.
    accelerator: Option<String>,
}

/// The most project groups one `group` filter names (a user's groups are far fewer).
pub const MAX_FILTER_GROUPS: usize = 64;

/// A name among an enum's names, in any case: its exact form, or a 400 that lists them.
fn any_case<T: Copy>(what: &str, given: &str, all: &[T], name: fn(T) -> &'static str) -> ApiResult<T> {
    all.iter().copied().find(|v| name(*v).eq_ignore_ascii_case(given)).ok_or_else(|| {
        let known = all.iter().map(|v| name(*v)).collect::<Vec<_>>().join(", ");
        ApiError::BadRequest(format!("{what} {given:?} is not one of {known} (any case)"))
    })
}

impl Filters {
    /// Whether any filter is given (an empty value is none).
    fn any(&self) -> bool {
        [&self.status, &self.task_type, &self.group, &self.owner, &self.q, &self.labels, &self.accelerator]
            .iter()
            .any(|f| f.as_deref().is_some_and(|v| !v.is_empty()))
    }

    /// The store's filter of the tasks `user` may see that match.
    fn to_filter(&self, user: &User) -> ApiResult<TaskFilter> {
        let mut labels = Vec::new();
        for pair in self.labels.iter().flat_map(|l| l.split(',')).filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some((k, v)) if !k.is_empty() => labels.push((k.to_owned(), v.to_owned())),
                _ => return Err(ApiError::BadRequest(format!("label selector {pair:?} must be key=value"))),
            }
        }
        let given = |v: &Option<String>| v.clone().filter(|v| !v.is_empty());
        let status = match given(&self.status) {
            None => None,
            Some(s) => Some(any_case("status", &s, Status::ALL, Status::as_str)?),
        };
        let task_type = match given(&self.task_type) {
            None => None,
            Some(t) => Some(any_case("type", &t, TaskType::ALL, TaskType::as_str)?.as_str().to_owned()),
        };
        let mut project_groups: Vec<String> = Vec::new();
        for g in self.group.iter().flat_map(|g| g.split(',')).filter(|g| !g.is_empty()) {
            if !project_groups.iter().any(|seen| seen == g) {
                project_groups.push(g.to_owned());
            }
        }
        if project_groups.len() > MAX_FILTER_GROUPS {
            return Err(ApiError::BadRequest(format!(
                "group names {} project groups; at most {MAX_FILTER_GROUPS} at once",
                project_groups.len()
            )));
        }
        let accelerator = match given(&self.accelerator) {
            None => None,
            Some(a) => Some(any_case("accelerator", &a, Accelerator::ALL, Accelerator::as_str)?),
        };
        Ok(TaskFilter {
            visible_to: Some(user.viewer()),
            owner: given(&self.owner),
            project_groups,
            status,
            task_type,
            search: given(&self.q),
            labels,
            accelerator,
            ..TaskFilter::default()
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    status: Option<String>,
    #[serde(rename = "type")]
    task_type: Option<String>,
    group: Option<String>,
    owner: Option<String>,
    q: Option<String>,
    labels: Option<String>,
    accelerator: Option<String>,
    cursor: Option<String>,
    limit: Option<u32>,
    /// newest (default), oldest, name, updated
    sort: Option<String>,
}

/// The tasks the caller may see, filtered and sorted, a page at a time.
pub async fn list_tasks(
    State(state): State<AppState>,
    Query(q): Query<ListQuery>,
    Caller { user, .. }: Caller,
) -> ApiResult<Json<TaskPage>> {
    let filters = Filters {
        status: q.status,
        task_type: q.task_type,
        group: q.group,
        owner: q.owner,
        q: q.q,
        labels: q.labels,
        accelerator: q.accelerator,
    };
    let mut filter = filters.to_filter(&user)?;
    filter.sort = match q.sort.as_deref() {
        None | Some("") => trainyard_store::SortOrder::Newest,
        Some(s) => trainyard_store::SortOrder::from_name(s).ok_or_else(|| {
            ApiError::BadRequest(format!("sort {s:?} is not one of newest, oldest, name, updated"))
        })?,
    };
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::BadRequest(format!("limit must be 1 to {MAX_PAGE} (got {limit})")));
    }
    let page = state.store.list_tasks(&filter, q.cursor.as_deref(), limit).await.map_err(
        // A cursor that does not decode is the caller's mistake, not the store's.
        |e| match e {
            StoreError::Corrupt(m) if m.starts_with("bad cursor") => ApiError::BadRequest(m),
            other => other.into(),
        },
    )?;
    let items = page.items.iter().map(|t| task_view(&state, t, Spec::Omit)).collect();
    Ok(Json(TaskPage { items, next_cursor: page.next_cursor }))
}

/// One task, deleted or not (`deleted` says which): a task deleted while it ran is followed to its end.
pub async fn get_task(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: Query<NoParams>,
    Caller { user, .. }: Caller,
) -> ApiResult<Json<TaskView>> {
    let t = visible_task(&state, &user, &id).await?;
    let mut view = task_view(&state, &t, Spec::Stored);
    if let Some(q) = &mut view.queue {
        let (shown, more) = crate::views::holders(&state, &t.name, &user).await?;
        q.holders = Some(shown);
        q.more_holders = Some(more);
    }
    Ok(Json(view))
}

pub async fn stop_task(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: Query<NoParams>,
    Caller { user, .. }: Caller,
) -> ApiResult<Json<TaskView>> {
    let t = operable_task(&state, &user, &id).await?;
    let updated = state.control.lock().await.stop(&t.id, false, state.now_ms()).await?;
    state.wake.notify_one();
    Ok(Json(task_view(&state, &updated, Spec::Stored)))
}

/// Queues an ended task again, within its owner's cap on queued tasks.
pub async fn resubmit_task(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: Query<NoParams>,
    Caller { user, .. }: Caller,
) -> ApiResult<Json<TaskView>> {
    let t = operable_task(&state, &user, &id).await?;
    // Only a task that may run again counts against the cap (a running or deleted one is refused below).
    let pass = match t.status.is_terminal() && !t.deleted {
        true => Some(check_queued_cap(&state.settings, &state.store, &t.owner, None).await?),
        false => None,
    };
    let updated = state.control.lock().await.resubmit(&t.id, state.now_ms()).await?;
    drop(pass);
    state.wake.notify_one();
    Ok(Json(task_view(&state, &updated, Spec::Stored)))
}

/// Deletes a task: whatever runs is stopped first (with the checkpoint notice), then it leaves lists; the
/// record and history stay, readable by id. Deleting a deleted task again changes nothing (204 again).
pub async fn delete_task(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: Query<NoParams>,
    Caller { user, .. }: Caller,
) -> ApiResult<StatusCode> {
    let t = operable_task(&state, &user, &id).await?;
    delete_one(&state, &t).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// One delete, as a single or a bulk delete does it (the control crate's [`trainyard_control::Control::delete`]:
/// stopped first when it runs, then marked deleted).
async fn delete_one(state: &AppState, t: &TaskRecord) -> ApiResult<()> {
    state.control.lock().await.delete(&t.id, state.now_ms()).await?;
    Ok(())
}

/// Deletes the tasks that match the filters (at least one) and that the caller may operate (admins: any;
/// others: their own and those shared with them with operate rights), at most a page's worth
/// ([`MAX_PAGE`]) at a time: `more` says whether the same request would delete more. Each is deleted as
/// `DELETE /tasks/{id}` does (stopped first when it runs).
pub async fn delete_tasks(
    State(state): State<AppState>,
    Query(q): Query<Filters>,
    Caller { user, .. }: Caller,
) -> ApiResult<Json<BulkDeleted>> {
    if !q.any() {
        return Err(ApiError::BadRequest(
            "say which tasks to delete with at least one of status, type, group, owner, q, labels and \
             accelerator; a bulk delete never means every task"
                .into(),
        ));
    }
    let mut filter = q.to_filter(&user)?;
    if user.role != "admin" {
        filter.operable_by = Some(user.name.clone());
    }
    let page = state.store.list_tasks(&filter, None, MAX_PAGE).await?;
    let mut done =
        BulkDeleted { deleted: 0, ids: Vec::new(), more: page.next_cursor.is_some(), failed: Vec::new() };
    for t in &page.items {
        match delete_one(&state, t).await {
            Ok(()) => {
                done.deleted += 1;
                done.ids.push(t.id.clone());
            }
            Err(e) => done.failed.push(BulkFailure { id: t.id.clone(), detail: e.problem().detail }),
        }
    }
    state.wake.notify_one();
    Ok(Json(done))
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CloneBody {
    /// The project group the copy goes to (default: the original's). It must be one of the caller's.
    project_group: Option<String>,
    /// The copy's name prefix (default: the original's), checked as a create checks it.
    name_prefix: Option<String>,
    /// Values for the original's hidden variables, by name (env and precheck env alike): a copy never
    /// carries them, so each must be given again.
    #[serde(default)]
    hidden_values: BTreeMap<String, String>,
}
object_schema!(
    /// Where the copy goes (default: the original's group), its name prefix (default: the original's) and
    /// the values of the original's hidden variables, by name (a copy never carries them). The body may be
    /// left out.
    closed CloneBody as "Clone" {
        "projectGroup": Optional<String>,
        "namePrefix": Optional<String>,
        "hiddenValues": Optional<BTreeMap<String, String>>,
    }
);

/// A new task from this one's spec (a new name, queued), owned by the caller. Whoever may operate the task
/// may clone it, into a project group they belong to (admins: any), as for a create. Hidden values are never
/// copied: each is the mask until the body's `hiddenValues` gives it, and a mask is refused (422,
/// `masked-value`, at the variable's path), so one user's secret never runs under another's name.
pub async fn clone_task(
    State(state): State<AppState>,
    Path(id): Path<String>,
    _: Query<NoParams>,
    WithBody(Caller { user, .. }, body): WithBody<Caller>,
) -> ApiResult<Response> {
    let t = operable_task(&state, &user, &id).await?;
    let body: CloneBody = if body.iter().all(u8::is_ascii_whitespace) {
        CloneBody::default()
    } else {
        json_object(
            &body,
            r#"{"projectGroup": GROUP, "namePrefix": PREFIX, "hiddenValues": {NAME: VALUE}} (all optional)"#,
        )?
    };
    let mut copy = trainyard_core::parse(t.spec_json.as_bytes())
        .0
        .ok_or_else(|| ApiError::Internal(format!("stored task {} is unreadable", t.id)))?;
    let mut hidden = copy.spec.environment.env.iter_mut().collect::<Vec<_>>();
    if let Some(p) = copy.spec.advanced.precheck.as_mut() {
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
        // Its working directory goes with it: the new group gets its own hold of the same files.
        if let Some(w) = copy.spec.environment.workdir.clone()
            && group != t.project_group
        {
            crate::auth::may_use_group(&user, &group)?;
            crate::routes::workdirs::copy_to_group(&state, &t.project_group, &group, &w).await?;
        }
        copy.metadata.project_group = group;
    }
    if let Some(prefix) = body.name_prefix {
        copy.metadata.name_prefix = prefix;
    }
    let Submitted { created, task } = submit(&state, &user, Draft::Copy(Box::new(copy))).await?;
    Ok((StatusCode::CREATED, Json(task_view(&state, created.task(), Spec::Submitted(&task)))).into_response())
}
