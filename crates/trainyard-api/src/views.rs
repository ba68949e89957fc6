//! What the API answers with: one serde type per JSON body, each declared with its schema for the OpenAPI
//! document (`view!`; the image cache's types, declared in their own crate, with `object_schema!`). Field
//! names and nesting are the API's contract with the CLI, the console and scripts.

use crate::schema::{ApiSchema, Schemas, object_schema, view};
use crate::state::AppState;
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use trainyard_core::Problem;
use trainyard_core::demand::{Demand, Resources};
use trainyard_core::lifecycle::Status;
use trainyard_core::spec::{TaskType, TrainingTask};
use trainyard_store::TaskRecord;

/// A list answer: `{"items": [...]}`.
#[derive(Debug, Serialize)]
pub struct Items<T> {
    pub items: Vec<T>,
}

impl<T: ApiSchema> ApiSchema for Items<T> {
    fn schema(schemas: &mut Schemas) -> Value {
        json!({
            "type": "object",
            "properties": {"items": Vec::<T>::schema(schemas)},
            "required": ["items"],
            "additionalProperties": false,
        })
    }
}

impl<T> From<Vec<T>> for Items<T> {
    fn from(items: Vec<T>) -> Self {
        Items { items }
    }
}

view! {
    /// A task: its record, where it runs (placement) or where it waits (queue), what it asks for (demand,
    /// null for tasks stored before it was kept), since when it is in its status and since when its attempt
    /// runs (statusSinceMs; runStartedAtMs, null until the attempt enters Running and again once it is
    /// queued), and its spec with hidden values masked (null in lists). `deleted` is true once it was
    /// deleted: lists leave it out and it cannot be resubmitted, but it is still read by id (a running one
    /// goes on to Stopped). `ownerDeleted` is true once an admin deleted the owner's account: the task is kept
    /// for the record.
    pub struct TaskView as "Task" {
        pub id: String,
        pub name: String,
        pub owner: String,
        /// The owner's account was deleted (the task is kept for the record).
        "ownerDeleted" pub owner_deleted: bool,
        "projectGroup" pub project_group: String,
        "type" pub task_type: String => TaskType,
        pub status: Status,
        pub public: bool,
        pub labels: BTreeMap<String, String>,
        pub attempt: i64 => Count,
        pub retries: i64 => Count,
        "createdAtMs" pub created_at_ms: i64 => Millis,
        "updatedAtMs" pub updated_at_ms: i64 => Millis,
        /// Deleted: out of lists, not to run again; its record and history stay readable by id.
        pub deleted: bool,
        pub placement: PlacementView,
        pub queue: Option<QueueView>,
        /// While its attempt is admitted and starting: what it waits for, in its backend's words (a cluster's
        /// scheduler finding no room, an image being pulled). Null otherwise, and until the backend says.
        pub starting: Option<StartingView>,
        /// Null for a task stored before demands were kept.
        pub demand: Option<DemandView>,
        "statusSinceMs" pub status_since_ms: i64 => Millis,
        "runStartedAtMs" pub run_started_at_ms: Option<i64> => Option<Millis>,
        /// Null in lists.
        pub spec: Option<SpecView>,
    }
}

/// A task's spec as a view shows it: hidden values masked. A task just created without hidden values is
/// shown as the text stored for it, which is its serialisation: written out again, not serialised twice.
#[derive(Debug)]
pub enum SpecView {
    Task(Box<TrainingTask>),
    Json(Box<serde_json::value::RawValue>),
}

impl Serialize for SpecView {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            SpecView::Task(t) => t.serialize(s),
            SpecView::Json(j) => j.serialize(s),
        }
    }
}

impl ApiSchema for SpecView {
    fn schema(schemas: &mut Schemas) -> Value {
        TrainingTask::schema(schemas)
    }
}

view! {
    /// What a task asks for with its first (preferred) instance-spec option, summed when it was created:
    /// its replicas grouped by what one takes on its node (the master or head first), how many options it
    /// lists (with more than one it may be placed on another), and whether it asks for GPUs in any option.
    pub struct DemandView as "TaskDemand" {
        pub shapes: Vec<ShapeView>,
        pub options: u32,
        pub accelerator: &'static str => AcceleratorName,
    }
}

view! {
    /// Replicas alike: how many, and the GPUs, vCPUs and memory one takes on its node.
    pub struct ShapeView as "ReplicaShape" {
        pub replicas: u32,
        pub gpus: u64,
        pub vcpus: u64,
        "memoryMib" pub memory_mib: u64,
    }
}

/// `gpu` or `cpu`, for the schema.
#[derive(Debug)]
pub struct AcceleratorName;

impl ApiSchema for AcceleratorName {
    fn schema(_: &mut Schemas) -> Value {
        let names: Vec<&str> = trainyard_store::Accelerator::ALL.iter().map(|a| a.as_str()).collect();
        json!({"type": "string", "enum": names})
    }
}

impl DemandView {
    fn of(d: &trainyard_store::TaskDemand) -> DemandView {
        let shape = |s: &trainyard_store::ReplicaShape| ShapeView {
            replicas: s.replicas,
            gpus: s.gpus,
            vcpus: s.vcpus,
            memory_mib: s.memory_mib,
        };
        DemandView {
            shapes: d.shapes.iter().map(shape).collect(),
            options: d.options,
            accelerator: d.accelerator.as_str(),
        }
    }
}

view! {
    /// Where a queued task stands as of the control loop's last tick, and why it waits. A task held because
    /// its owner's account is disabled or deleted is in no place in line: position 0, and the reason says so.
    pub struct QueueView as "QueuePosition" {
        pub position: u32,
        "positionInGroup" pub position_in_group: u32,
        pub reason: String,
        /// One task's view only (not lists): the running tasks that hold what it waits for, as far as the
        /// caller may see them, those spending its group's quota first.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub holders: Option<Vec<HolderView>>,
        /// Holders not listed: ones the caller may not see, and any beyond the first few.
        #[serde(skip_serializing_if = "Option::is_none")]
        "moreHolders" pub more_holders: Option<u32>,
    }
}

view! {
    /// A running task that holds capacity a queued task could use. No task has a time limit, so when it
    /// frees is not known: only how long it has run.
    pub struct HolderView as "QueueHolder" {
        pub id: String,
        pub name: String,
        pub owner: String,
        "projectGroup" pub project_group: String,
        /// Of the queued task's group and resource type: it spends the same quota.
        "spendsItsQuota" pub spends_its_quota: bool,
        /// Units it holds of the queued task's instance specs (`spec`, the first of them).
        pub units: u64,
        pub spec: String,
        "runningSinceMs" pub running_since_ms: u64 => Millis,
        /// Told to stop already: its resources are about to come free.
        pub stopping: bool,
    }
}

/// The most holders a task's view lists.
pub const HOLDERS_LISTED: usize = 8;

/// The holders of what a queued task waits for, as far as `user` may see them (see [`QueueView::holders`]).
pub(crate) async fn holders(
    state: &AppState,
    name: &str,
    user: &trainyard_store::User,
) -> crate::error::ApiResult<(Vec<HolderView>, u32)> {
    let Some(all) = state.views.holders(name) else { return Ok((Vec::new(), 0)) };
    let mut shown = Vec::new();
    for h in all.iter().take(HOLDERS_LISTED) {
        let filter = trainyard_store::TaskFilter {
            visible_to: Some(user.viewer()),
            search: Some(h.name.clone()),
            ..Default::default()
        };
        let page = state.store.list_tasks(&filter, None, 1).await?;
        if let Some(t) = page.items.iter().find(|t| t.name == h.name) {
            shown.push(HolderView {
                id: t.id.clone(),
                name: t.name.clone(),
                owner: t.owner.clone(),
                project_group: h.group.clone(),
                spends_its_quota: h.spends_its_quota,
                units: h.units,
                spec: h.spec.clone(),
                running_since_ms: h.started_at_ms,
                stopping: h.stopping,
            });
        }
    }
    let more = (all.len() - shown.len()) as u32;
    Ok((shown, more))
}

view! {
    /// What a starting task's attempt waits for, as its backend said it last, and since when.
    pub struct StartingView as "StartingWait" {
        pub reason: String,
        "sinceMs" pub since_ms: i64 => Millis,
    }
}

/// The placement the control loop stored with the task (null when there is none), passed on as
/// stored; its schema is written here, so a change of the stored form fails the OpenAPI test until the
/// document says so too.
#[derive(Debug, Serialize)]
#[serde(transparent)]
pub struct PlacementView(pub Value);

impl ApiSchema for PlacementView {
    fn schema(schemas: &mut Schemas) -> Value {
        let resources = Resources::schema(schemas);
        let placement = crate::schema::named(schemas, "Placement", |schemas| {
            json!({
                "type": "object",
                "description": "Where an attempt runs: the instance-spec option chosen, each replica's node and share, and the units counted against quota as [spec, class, units].",
                "properties": {
                    "option": usize::schema(schemas),
                    "replicas": {"type": "array", "items": {
                        "type": "object",
                        "properties": {
                            "role": {"type": "string", "enum": ["master", "worker", "head"]},
                            "index": u32::schema(schemas),
                            "rank": u32::schema(schemas),
                            "node": {"type": "string"},
                            "resources": resources,
                        },
                        "required": ["role", "index", "rank", "node", "resources"],
                        "additionalProperties": false,
                    }},
                    "units": Vec::<(String, String, u64)>::schema(schemas),
                },
                "required": ["option", "replicas", "units"],
                "additionalProperties": false,
            })
        });
        json!({"anyOf": [placement, {"type": "null"}]})
    }
}

/// Which spec a task view shows (always masked).
pub(crate) enum Spec<'a> {
    /// None: lists leave it out.
    Omit,
    /// The stored one.
    Stored,
    /// The one the task was just created from, at hand: the record's stored spec is its serialisation,
    /// sealed.
    Submitted(&'a TrainingTask),
}

/// The view of a task.
pub(crate) fn task_view(state: &AppState, t: &TaskRecord, spec: Spec) -> TaskView {
    let spec = match spec {
        Spec::Omit => None,
        // Without hidden values, sealing and masking change nothing: the stored text is the view's.
        Spec::Submitted(task) if !task.has_hidden_values() => {
            match serde_json::value::RawValue::from_string(t.spec_json.clone()) {
                Ok(json) => Some(SpecView::Json(json)),
                Err(_) => Some(SpecView::Task(Box::new(task.clone()))),
            }
        }
        Spec::Submitted(task) => Some(SpecView::Task(Box::new(task.masked()))),
        Spec::Stored => trainyard_core::parse(t.spec_json.as_bytes())
            .0
            .map(|task| SpecView::Task(Box::new(task.masked()))),
    };
    let queue = if t.status == Status::Queued {
        state.queue.get(&t.id).map(|q| QueueView {
            position: q.position,
            position_in_group: q.position_in_group,
            reason: q.reason.to_string(),
            holders: None,
            more_holders: None,
        })
    } else {
        None
    };
    let starting = if matches!(t.status, Status::Admitted | Status::Starting | Status::Prechecking) {
        state.starts.get(&t.id, t.attempt).map(|w| StartingView { reason: w.reason, since_ms: w.since_ms })
    } else {
        None
    };
    TaskView {
        id: t.id.clone(),
        name: t.name.clone(),
        owner: t.owner.clone(),
        owner_deleted: state.accounts.get().deleted(&t.owner),
        project_group: t.project_group.clone(),
        task_type: t.task_type.clone(),
        status: t.status,
        public: t.public,
        labels: t.labels.clone(),
        attempt: t.attempt,
        retries: t.retries,
        created_at_ms: t.created_at_ms,
        updated_at_ms: t.updated_at_ms,
        deleted: t.deleted,
        placement: PlacementView(serde_json::from_str(&t.placement).unwrap_or(Value::Null)),
        queue,
        starting,
        demand: t.demand.as_ref().map(DemandView::of),
        status_since_ms: t.status_since_ms,
        run_started_at_ms: t.run_started_at_ms,
        spec,
    }
}

view! {
    /// A page of tasks (specs left out); `nextCursor` is null on the last page.
    pub struct TaskPage as "TaskPage" {
        pub items: Vec<TaskView>,
        /// Where the next page starts; null on the last.
        "nextCursor" pub next_cursor: Option<String>,
    }
}

view! {
    /// An image a user's task ran, and when the newest such task was created.
    pub struct RecentImage as "RecentImage" {
        pub image: String,
        /// When the newest task that ran it was created.
        "lastUsedMs" pub last_used_ms: i64,
    }
}

object_schema!(
    /// A registry image in the local backend's cache: its digest, the references it was pulled by, the bytes
    /// it holds (its root file system and the layers only it uses), and when it was last used and pulled.
    closed trainyard_images::Cached as "CachedImage" {
        "digest": String,
        "references": Vec<String>,
        "bytes": u64,
        "lastUsedMs": u64,
        "pulledMs": u64,
    }
);

object_schema!(
    /// What pruning the image cache removed (digests), the bytes it freed and the bytes the cache holds now.
    closed trainyard_images::Collected as "ImagePrune" { "removed": Vec<String>, "freedBytes": u64, "bytes": u64 }
);

view! {
    /// One event of a task's history, with the attempt it belongs to and a stable reason code.
    pub struct EventView as "Event" {
        pub seq: i64 => Count,
        pub attempt: i64 => Count,
        "atMs" pub at_ms: i64 => Millis,
        pub reason: String,
        pub message: String,
    }
}

view! {
    /// The replicas one attempt had, newest attempt first in a list.
    pub struct AttemptReplicas as "AttemptReplicas" {
        pub attempt: i64,
        pub replicas: Vec<ReplicaName>,
    }
}

view! {
    /// A replica by name (for `logs?replica=NAME`), with its role.
    pub struct ReplicaName as "Replica" {
        pub name: String,
        pub role: String,
    }
}

view! {
    /// A task's metrics for one attempt.
    pub struct MetricsView as "TaskMetrics" {
        pub attempt: i64,
        pub series: Vec<Series>,
    }
}

view! {
    /// One metric of one replica with one label set, as `[atMs, value]` points.
    pub struct Series as "MetricSeries" {
        pub replica: String,
        pub name: String,
        pub labels: BTreeMap<String, String>,
        /// `[atMs, value]`, oldest first.
        pub points: Vec<(u64, f64)>,
    }
}

view! {
    /// A task document checked without creating it: every problem; when valid, the demand of each
    /// instance-spec option, whether it would be admitted now and how free capacity is spread; the document
    /// as decoded (JSON and YAML).
    pub struct Validation as "Validation" {
        pub valid: bool,
        pub problems: Vec<Problem>,
        /// The demand of each instance-spec option, when the document is valid.
        pub demand: Option<Vec<Demand>>,
        pub admission: Option<Admission>,
        pub fragmentation: Option<Vec<FragmentationView>>,
        /// The document as the decoder read it (defaults filled in).
        pub task: Option<TrainingTask>,
        /// The same, as YAML for an editor.
        pub yaml: Option<String>,
    }
}

view! {
    /// Whether the scheduler would admit the task now (over the last tick's view), and why not.
    pub struct Admission as "Admission" {
        pub now: bool,
        pub reason: String,
    }
}

view! {
    /// How free capacity is spread for one instance spec: replicas that fit, nodes with room, and how many
    /// nodes could take exactly N more units (by N).
    pub struct FragmentationView as "Fragmentation" {
        pub spec: String,
        "replicasFit" pub replicas_fit: u64,
        "nodesWithRoom" pub nodes_with_room: u64,
        /// How many nodes could take exactly N more units of the spec, by N.
        "freeUnits" pub free_units: BTreeMap<u64, u64>,
    }
}

view! {
    /// A user with their role and project groups.
    pub struct UserView as "User" {
        pub name: String,
        pub role: String => Role,
        pub groups: Vec<String>,
    }
}

view! {
    /// A user as admins list them (never a token or its hash): `disabled` (every token refused), `deleted`
    /// (tokens gone, the name kept for the record and not used again), `workHeld` (their queued tasks are
    /// not admitted until they are enabled again).
    pub struct UserEntry as "UserEntry" {
        pub name: String,
        pub role: String => Role,
        pub groups: Vec<String>,
        pub disabled: bool,
        pub deleted: bool,
        "workHeld" pub work_held: bool,
    }
}

/// A user's role, for the schema (the store keeps it as a string).
#[derive(Debug)]
pub struct Role;

impl ApiSchema for Role {
    fn schema(_: &mut Schemas) -> Value {
        json!({"type": "string", "enum": ["admin", "member"]})
    }
}

view! {
    /// A new API token, shown in this answer only; `id` names it for listing and revoking.
    pub struct NewToken as "NewToken" {
        pub user: String,
        pub token: String => TokenSecret,
        pub id: String => TokenId,
        pub label: String,
    }
}

/// A token itself, for the schema.
#[derive(Debug)]
pub struct TokenSecret;

impl ApiSchema for TokenSecret {
    fn schema(_: &mut Schemas) -> Value {
        json!({"type": "string", "pattern": "^ty_[0-9a-f]{48}$"})
    }
}

view! {
    /// What a bulk delete did: how many and which tasks it deleted (running ones are stopped first, with
    /// the checkpoint window), whether more match (send the same request again), and any it could not.
    pub struct BulkDeleted as "BulkDeleted" {
        /// How many tasks were deleted.
        pub deleted: u64,
        /// Their ids, in the list's order (newest first).
        pub ids: Vec<String>,
        /// Whether more tasks match: the same request deletes the next ones.
        pub more: bool,
        /// Tasks that matched but could not be deleted this time, and why.
        pub failed: Vec<BulkFailure>,
    }
}

view! {
    /// A task a bulk delete matched but could not delete, and why.
    pub struct BulkFailure as "BulkFailure" {
        pub id: String,
        pub detail: String,
    }
}

view! {
    /// A token as listed: its id, label, creation time, last use (to the minute; null: never) and whether the
    /// listing request came with it; never the token.
    pub struct TokenEntry as "TokenEntry" {
        pub id: String => TokenId,
        pub label: String,
        "createdAtMs" pub created_at_ms: i64 => Millis,
        /// When a request last came with it, to the minute; null when none has since it was recorded.
        "lastUsedAtMs" pub last_used_at_ms: Option<i64> => Option<Millis>,
        /// Whether it is the token the listing request came with.
        pub current: bool,
    }
}

/// A token's id, for the schema: the first hex characters of its hash.
#[derive(Debug)]
pub struct TokenId;

impl ApiSchema for TokenId {
    fn schema(_: &mut Schemas) -> Value {
        json!({"type": "string", "pattern": format!("^[0-9a-f]{{{}}}$", trainyard_store::TOKEN_ID_LEN)})
    }
}

/// A time as Unix milliseconds, for the schema (never before 1970).
#[derive(Debug)]
pub struct Millis;

impl ApiSchema for Millis {
    fn schema(_: &mut Schemas) -> Value {
        json!({"type": "integer", "minimum": 0})
    }
}

/// A count or a number that starts at 0 (attempts, retries), for the schema.
#[derive(Debug)]
pub struct Count;

impl ApiSchema for Count {
    fn schema(_: &mut Schemas) -> Value {
        json!({"type": "integer", "minimum": 0})
    }
}

view! {
    /// A TaskEnv variable; a hidden value is shown as its mask.
    pub struct EnvEntry as "TaskEnvVariable" {
        pub name: String,
        pub value: String,
        pub hidden: bool,
    }
}
