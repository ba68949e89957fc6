//! The table of every operation the router serves, as the OpenAPI document describes it: path, summary,
//! parameters, request body, success answer and the error statuses it answers with. The router and the
//! table are checked against each other by tests, and so are the answers and their schemas.

use crate::error::ProblemBody;
use crate::routes::admin::{NodeStateBody, RegistryLoginBody, RegistryLoginEntry};
use crate::routes::server::{ServerBoards, ServerStatus};
use crate::routes::shares::{ShareBody, ShareEntry};
use crate::routes::tasks::CloneBody;
use crate::routes::users::{TaskEnvBody, TokenBody, UserBody, WorkBody};
use crate::routes::workdirs::{WorkdirBlobs, WorkdirBody, WorkdirCheck, WorkdirContent};
use crate::schema::{Schemas, schema_of};
use crate::settings::AdminSettings;
use crate::views::{
    AttemptReplicas, BulkDeleted, EnvEntry, EventView, Items, MetricsView, NewToken, RecentImage, TaskPage,
    TaskView, TokenEntry, UserEntry, UserView, Validation,
};
use serde_json::{Value, json};
use trainyard_control::QuotaLine;
use trainyard_core::Catalog;
use trainyard_core::lifecycle::Status;
use trainyard_core::spec::{AlarmSubscription, TaskType};
use trainyard_store::MAX_PAGE;

/// A body's or an answer's schema, made on demand (named types are defined in the document's components).
pub type SchemaFn = fn(&mut Schemas) -> Value;

/// One operation.
#[derive(Debug)]
pub struct Operation {
    /// The `operationId`: unique, camelCase, what generated clients name the call.
    pub id: &'static str,
    pub method: &'static str,
    pub path: &'static str,
    pub summary: &'static str,
    /// Every query parameter the handler reads (it refuses any other with a 400).
    pub query: &'static [Param],
    /// The request headers the operation reads besides `Authorization`.
    pub headers: &'static [Param],
    pub body: Body,
    /// The success status.
    pub ok: u16,
    /// What a success answers with.
    pub answer: Answer,
    /// Other success statuses with the same answer (a create replayed with its `Idempotency-Key`: 200).
    pub also_ok: &'static [u16],
    /// The error statuses the operation itself answers with, each a problem document. Every operation may
    /// also answer 400 (a query parameter it does not take, or one that does not parse); routes under
    /// `/api/v1` (and `/metrics`) 401 and 403 (no token, a disabled account); operations with a body 413;
    /// all but reads (`get`) 507 (the store's disk is full); any 414, 500 and 503 (see
    /// `openapi::error_statuses`).
    pub errors: &'static [u16],
}

/// A query parameter or a header: its name, its schema, what it does.
#[derive(Debug)]
pub struct Param {
    pub name: &'static str,
    pub schema: SchemaFn,
    pub description: &'static str,
}

const fn param(name: &'static str, schema: SchemaFn, description: &'static str) -> Param {
    Param { name, schema, description }
}

/// A pattern that matches any of `names` in any case (`[Qq][Uu]...`), for a parameter the server reads so.
fn any_case_pattern(names: &[&str]) -> String {
    let each = names.iter().map(|n| {
        n.chars()
            .map(|c| match (c.to_ascii_uppercase(), c.to_ascii_lowercase()) {
                (u, l) if u != l => format!("[{u}{l}]"),
                _ => c.to_string(),
            })
            .collect::<String>()
    });
    format!("^(?:{})$", each.collect::<Vec<_>>().join("|"))
}

/// One of `names`, in any case: the names themselves for tools that list choices, and the pattern that
/// says any case is read as its name.
fn any_case_enum(names: &[&str], what: &str) -> Value {
    json!({
        "type": "string",
        "anyOf": [{"enum": names}, {"pattern": any_case_pattern(names)}],
        "description": format!("{what}: one of {}, in any case", names.join(", ")),
    })
}

fn string(_: &mut Schemas) -> Value {
    json!({"type": "string"})
}

fn non_empty_string(_: &mut Schemas) -> Value {
    json!({"type": "string", "minLength": 1})
}

fn boolean(_: &mut Schemas) -> Value {
    json!({"type": "boolean"})
}

/// A number the handler reads as a `u64` (a larger one does not parse: 400).
fn non_negative(_: &mut Schemas) -> Value {
    json!({"type": "integer", "minimum": 0, "maximum": u64::MAX})
}

/// An attempt's number, which the handler reads as a `u32`.
fn attempt_number(_: &mut Schemas) -> Value {
    json!({"type": "integer", "minimum": 0, "maximum": u32::MAX})
}

fn status_filter(_: &mut Schemas) -> Value {
    any_case_enum(Status::NAMES, "a status")
}

fn type_filter(_: &mut Schemas) -> Value {
    any_case_enum(TaskType::NAMES, "a task type")
}

fn accelerator_filter(_: &mut Schemas) -> Value {
    let names: Vec<&str> = trainyard_store::Accelerator::ALL.iter().map(|a| a.as_str()).collect();
    any_case_enum(&names, "gpu or cpu")
}

fn sort_order(_: &mut Schemas) -> Value {
    json!({"type": "string", "enum": ["newest", "oldest", "name", "updated"], "default": "newest"})
}

fn page_limit(_: &mut Schemas) -> Value {
    json!({"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": crate::routes::tasks::DEFAULT_PAGE})
}

fn label_selector(_: &mut Schemas) -> Value {
    json!({"type": "string", "pattern": "^(?:[^,=]+=[^,]*)?(?:,(?:[^,=]+=[^,]*)?)*$"})
}

fn idempotency_key(_: &mut Schemas) -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": crate::IDEMPOTENCY_KEY_MAX_BYTES})
}

/// The filters a list and a bulk delete share.
const STATUS: Param =
    param("status", status_filter, "only tasks in this status (any case: running is Running)");
const TYPE: Param = param("type", type_filter, "only PyTorchJob or RayJob tasks (any case)");
const GROUP: Param =
    param("group", string, "only these project groups' (one, or several as group,group,...: any of them)");
const OWNER: Param = param("owner", string, "only this user's");
const SEARCH: Param = param("q", string, "a task's whole name or id (that task alone), else part of a name");
const LABELS: Param = param(
    "labels",
    label_selector,
    "key=value[,key=value...]: every one of these labels (empty pairs are skipped)",
);
const ACCELERATOR: Param = param(
    "accelerator",
    accelerator_filter,
    "gpu: only tasks that ask for GPUs (in any of their instance-spec options); cpu: only tasks that ask for none",
);

/// What an operation takes.
#[derive(Debug)]
pub enum Body {
    None,
    /// A document in YAML or JSON, of this schema.
    Document(SchemaFn),
    /// JSON of this schema.
    Json(SchemaFn),
    /// JSON of this schema, or nothing at all.
    OptionalJson(SchemaFn),
    /// A tar stream, sent as `application/octet-stream`.
    Tar,
}

/// What a success answers with.
#[derive(Debug)]
pub enum Answer {
    /// No body (204).
    Empty,
    /// JSON of this schema.
    Json(SchemaFn),
    /// Plain text.
    Text,
    /// A tar stream.
    Tar,
    /// The logs: JSON of this schema (the replicas), a replica's log as plain text, or its stream as
    /// server-sent events.
    Logs(SchemaFn),
}

/// The catalog as a request: the shape `GET /api/v1/catalog` answers with, but left-out fields are empty or
/// closed (and YAML is fine), so the request schema is loose and the parser says what is wrong.
fn catalog_request(schemas: &mut Schemas) -> Value {
    let reference = schema_of::<Catalog>(schemas);
    json!({"type": "object", "description": format!("A catalog as {} describes it; a field left out is empty, or closed (allowExternalImages: false)", reference["$ref"].as_str().unwrap_or("the Catalog schema"))})
}

/// A document to check: the validator answers anything, a document that is not a task or not YAML at all
/// included, with its problems (200, `valid: false`), so the request takes any body but an empty one.
fn document_to_check(schemas: &mut Schemas) -> Value {
    let reference = schema_of::<trainyard_core::TrainingTask>(schemas);
    let task = reference["$ref"].as_str().unwrap_or("the TrainingTask schema").to_owned();
    json!({"description": format!("A task document as {task} describes it; anything else is answered with its problems")})
}

/// The problem schema, for the document builder.
pub fn problem_schema(schemas: &mut Schemas) -> Value {
    schema_of::<ProblemBody>(schemas)
}

/// Every operation the router serves (a test checks the router against this table).
pub const OPERATIONS: &[Operation] = &[
    Operation {
        id: "whoami",
        method: "get",
        path: "/api/v1/whoami",
        summary: "The caller: name, role, groups",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<UserView>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        id: "listWorkdirs",
        method: "get",
        path: "/api/v1/workdirs",
        summary: "The working directories the caller's project groups hold (an admin: every group's), the last used first; projectGroup: one group's",
        query: &[param("projectGroup", non_empty_string, "only this project group's (one of the caller's)")],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<Items<trainyard_workdir::store::Info>>),
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        id: "checkWorkdir",
        method: "post",
        path: "/api/v1/workdirs/check",
        summary: "Check a working directory's manifest for a project group (every problem at once, the size limits: workdirMaxBytes, workdirGroupBytes) and answer its id and the files (by SHA-256) the group does not hold yet; when it holds them all, the working directory is kept at once (workdir)",
        query: &[],
        headers: &[],
        body: Body::Json(schema_of::<WorkdirBody>),
        ok: 200,
        answer: Answer::Json(schema_of::<WorkdirCheck>),
        also_ok: &[],
        errors: &[404, 422],
    },
    Operation {
        id: "putWorkdirFiles",
        method: "post",
        path: "/api/v1/workdirs/blobs",
        summary: "Send a project group's working-directory files: a tar stream whose entries are regular files named by their content's SHA-256. Each is kept only once its content matched its name; one that does not stops the stream (400)",
        query: &[param(
            "projectGroup",
            non_empty_string,
            "the project group the files are for (one of the caller's)",
        )],
        headers: &[],
        body: Body::Tar,
        ok: 200,
        answer: Answer::Json(schema_of::<WorkdirBlobs>),
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        id: "commitWorkdir",
        method: "post",
        path: "/api/v1/workdirs",
        summary: "Keep a working directory for a project group once every file it names was sent (409 lists what is missing); a task names it by id in spec.environment.workdir, and each replica starts in a read-write copy at /workspace",
        query: &[],
        headers: &[],
        body: Body::Json(schema_of::<WorkdirBody>),
        ok: 200,
        answer: Answer::Json(schema_of::<trainyard_workdir::store::Info>),
        also_ok: &[],
        errors: &[404, 409, 422],
    },
    Operation {
        id: "getWorkdir",
        method: "get",
        path: "/api/v1/workdirs/{workdir}",
        summary: "One working directory of a project group and its manifest, for a member of the group (or an admin), or for the replicas of a running attempt of a task naming it, with that attempt's token",
        query: &[param("projectGroup", non_empty_string, "the project group that holds it")],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<WorkdirContent>),
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        id: "getWorkdirFiles",
        method: "get",
        path: "/api/v1/workdirs/{workdir}/files",
        summary: "One working directory's files as a tar stream, each content once, named by its SHA-256 (as uploads send them), for the same callers as getWorkdir: a fetch checks each file against its name and the manifest before it makes the tree",
        query: &[param("projectGroup", non_empty_string, "the project group that holds it")],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Tar,
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        id: "getCatalog",
        method: "get",
        path: "/api/v1/catalog",
        summary: "The catalog tasks are checked against (a member reads what is offered to their groups)",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<Catalog>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        id: "createTask",
        method: "post",
        path: "/api/v1/tasks",
        summary: "Submit a task (YAML or JSON). Send Idempotency-Key to make retries safe: the same key and body return the first task (200), another body is a 409. A user with as many queued tasks as the cap allows (maxQueuedTasksPerUser, an admin setting; default 1,000) gets a 429 with Retry-After",
        query: &[],
        headers: &[param(
            "Idempotency-Key",
            idempotency_key,
            "makes retries safe: the same key and body answer the first task (200), another body a 409; 1 to 255 characters, a UUID is usual",
        )],
        body: Body::Document(schema_of::<trainyard_core::TrainingTask>),
        ok: 201,
        answer: Answer::Json(schema_of::<TaskView>),
        also_ok: &[200],
        errors: &[403, 409, 422, 429],
    },
    Operation {
        id: "deleteTasks",
        method: "delete",
        path: "/api/v1/tasks",
        summary: "Delete the tasks that match every filter given (at least one) and that the caller may operate (admins: any; others: their own and those shared with them with operate rights), up to 500 at a time (more: true says to send it again). Each is deleted as DELETE /api/v1/tasks/{id} does: a running one is stopped first, with its checkpoint window",
        query: &[STATUS, TYPE, GROUP, OWNER, SEARCH, LABELS, ACCELERATOR],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<BulkDeleted>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        id: "listTasks",
        method: "get",
        path: "/api/v1/tasks",
        summary: "Tasks visible to the caller (newest first unless sort says otherwise), a page at a time",
        query: &[
            STATUS,
            TYPE,
            GROUP,
            OWNER,
            SEARCH,
            LABELS,
            ACCELERATOR,
            param("sort", sort_order, "newest (default), oldest, name or updated"),
            param("cursor", non_empty_string, "where the page starts: the previous page's nextCursor"),
            param("limit", page_limit, "tasks per page (default 50, 1 to 500)"),
        ],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<TaskPage>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        id: "getTask",
        method: "get",
        path: "/api/v1/tasks/{id}",
        summary: "One task: spec (hidden values masked), placement, queue position and reason",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<TaskView>),
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        id: "deleteTask",
        method: "delete",
        path: "/api/v1/tasks/{id}",
        summary: "Stop (with the checkpoint window) and delete: the task leaves lists and never runs again; its record (deleted: true) and history stay readable by id. Deleting a deleted task again is a 204 that changes nothing",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[404, 409],
    },
    Operation {
        id: "listTaskEvents",
        method: "get",
        path: "/api/v1/tasks/{id}/events",
        summary: "Every event of the task, in order (at most 1,000 an answer)",
        query: &[param("after", non_negative, "only events after this sequence number (default 0)")],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<Items<EventView>>),
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        id: "getTaskLogs",
        method: "get",
        path: "/api/v1/tasks/{id}/logs",
        summary: "Without replica: the replicas of each attempt (JSON). With replica: its log as text from offset (X-Next-Offset says where to go on, X-Log-Ended whether it ended); follow=true streams server-sent events, one line each, until it ends",
        query: &[
            param(
                "replica",
                string,
                "the replica whose log to read (without it: the replicas of each attempt)",
            ),
            param("attempt", attempt_number, "which attempt (default: the latest)"),
            param("offset", non_negative, "where to start, in bytes (default 0)"),
            param("follow", boolean, "stream as server-sent events until the replica ends (default false)"),
        ],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Logs(schema_of::<Items<AttemptReplicas>>),
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        id: "getTaskMetrics",
        method: "get",
        path: "/api/v1/tasks/{id}/metrics",
        summary: "Preset (trainyard_*) and scraped metrics per replica as series of [atMs, value]",
        query: &[
            param("attempt", attempt_number, "which attempt (default: the latest)"),
            param("since", non_negative, "only samples after this Unix time in ms (default 0)"),
            param("name", string, "only this metric"),
        ],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<MetricsView>),
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        id: "validateTask",
        method: "post",
        path: "/api/v1/validate",
        summary: "Check a task document without creating it: every problem, and the demand of each instance-spec option",
        query: &[],
        headers: &[],
        body: Body::Document(document_to_check),
        ok: 200,
        answer: Answer::Json(schema_of::<Validation>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        id: "stopTask",
        method: "post",
        path: "/api/v1/tasks/{id}/stop",
        summary: "Stop: a queued task at once, a running one through Stopping",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<TaskView>),
        also_ok: &[],
        errors: &[404, 409],
    },
    Operation {
        id: "resubmitTask",
        method: "post",
        path: "/api/v1/tasks/{id}/resubmit",
        summary: "Run an ended task again as a new attempt (not a deleted one: clone it); within its owner's cap on queued tasks (429 over it)",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<TaskView>),
        also_ok: &[],
        errors: &[404, 409, 429],
    },
    Operation {
        id: "cloneTask",
        method: "post",
        path: "/api/v1/tasks/{id}/clone",
        summary: "A new task from this one's spec, owned by the caller, in one of the caller's project groups (admins: any). Hidden values are never copied: give each in hiddenValues, or the answer is a 422 (masked-value) naming the variable",
        query: &[],
        headers: &[],
        body: Body::OptionalJson(schema_of::<CloneBody>),
        ok: 201,
        answer: Answer::Json(schema_of::<TaskView>),
        also_ok: &[],
        errors: &[404, 422, 429],
    },
    Operation {
        id: "shareTask",
        method: "post",
        path: "/api/v1/tasks/{id}/shares",
        summary: "Share with a user: view, or view and operate (owner or admin)",
        query: &[],
        headers: &[],
        body: Body::Json(schema_of::<ShareBody>),
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        id: "listShares",
        method: "get",
        path: "/api/v1/tasks/{id}/shares",
        summary: "Whom the task is shared with, and whether each may operate it (owner or admin)",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<Items<ShareEntry>>),
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        id: "unshareTask",
        method: "delete",
        path: "/api/v1/tasks/{id}/shares/{user}",
        summary: "Take a share back (owner or admin), or give back one given to the caller; 404 when the task is not shared with that user",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        id: "getQuota",
        method: "get",
        path: "/api/v1/quota",
        summary: "Quota and usage per project group, resource type, pool and instance spec (members see their groups)",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<Items<QuotaLine>>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        id: "replaceCatalog",
        method: "put",
        path: "/api/v1/admin/catalog",
        summary: "Replace the catalog (YAML or JSON; admin). A field left out is empty, or closed (allowExternalImages: false). A catalog that takes away what active tasks (queued to stopping) use is a 409 listing each conflict: their project group, region, cluster, pool, instance spec, image, volumes, datasets, models, the quota they are admitted under, the nodes their replicas run on (gone, moved or smaller); force=true replaces it anyway",
        query: &[param(
            "force",
            boolean,
            "replace the catalog even when it takes away what active tasks use (default false): queued tasks that no longer fit wait, running ones go on",
        )],
        headers: &[],
        body: Body::Document(catalog_request),
        ok: 200,
        answer: Answer::Json(schema_of::<Catalog>),
        also_ok: &[],
        errors: &[409],
    },
    Operation {
        id: "getServerStatus",
        method: "get",
        path: "/api/v1/server",
        summary: "The servers on this store (admin): which one leads (runs the control loop, the scheduler and the backend), since when and with which fencing token, and every server seen within 30 s",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<ServerStatus>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        id: "getServerBoards",
        method: "get",
        path: "/api/v1/server/boards",
        summary: "The leader's queue positions, wait reasons and starting tasks' waits, for the other servers on the store (the proof of their shared key as the token) or an admin; since=VERSION answers unchanged, with empty lists, while the boards are as of that version. A server that does not lead answers 409",
        query: &[param("since", string, "the version the caller has (the last answer's)")],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<ServerBoards>),
        also_ok: &[],
        errors: &[409],
    },
    Operation {
        id: "getSettings",
        method: "get",
        path: "/api/v1/admin/settings",
        summary: "The API's settings: the most queued tasks one user may have (admin)",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<AdminSettings>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        id: "updateSettings",
        method: "put",
        path: "/api/v1/admin/settings",
        summary: "Replace the API's settings (admin): this server applies them at once, others sharing the store within 5 s",
        query: &[],
        headers: &[],
        body: Body::Json(schema_of::<AdminSettings>),
        ok: 200,
        answer: Answer::Json(schema_of::<AdminSettings>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        id: "updateNode",
        method: "put",
        path: "/api/v1/admin/nodes/{node}",
        summary: "Cordon or uncordon a node (schedulable), or mark it failed: its replicas are killed and fault tolerance takes over (admin)",
        query: &[],
        headers: &[],
        body: Body::Json(schema_of::<NodeStateBody>),
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        id: "listCachedImages",
        method: "get",
        path: "/api/v1/admin/images",
        summary: "The registry images the local backend keeps: digest, references, bytes, last use (admin)",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<Items<trainyard_images::Cached>>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        id: "pruneCachedImages",
        method: "post",
        path: "/api/v1/admin/images/prune",
        summary: "Remove every cached registry image that no task runs or is about to run (admin)",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<trainyard_images::Collected>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        id: "listRegistryLogins",
        method: "get",
        path: "/api/v1/admin/registries",
        summary: "The registries that have a login: host, user name, when set, the groups it serves (admin; never the passwords)",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<Items<RegistryLoginEntry>>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        id: "setRegistryLogin",
        method: "put",
        path: "/api/v1/admin/registries/{host}/login",
        summary: "Set the login images are pulled from a registry with, for the catalog's presets and the groups it names; the password is stored sealed (admin)",
        query: &[],
        headers: &[],
        body: Body::Json(schema_of::<RegistryLoginBody>),
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[],
    },
    Operation {
        id: "deleteRegistryLogin",
        method: "delete",
        path: "/api/v1/admin/registries/{host}/login",
        summary: "Remove a registry's login (admin)",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        id: "listUsers",
        method: "get",
        path: "/api/v1/admin/users",
        summary: "Every user: name, role and project groups, by name (admin; never tokens)",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<Items<UserEntry>>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        id: "saveUser",
        method: "post",
        path: "/api/v1/admin/users",
        summary: "Create or update a user (admin); 409 for a deleted user's name, which is not used again",
        query: &[],
        headers: &[],
        body: Body::Json(schema_of::<UserBody>),
        ok: 200,
        answer: Answer::Json(schema_of::<UserView>),
        also_ok: &[],
        errors: &[409],
    },
    Operation {
        id: "createToken",
        method: "post",
        path: "/api/v1/users/{name}/tokens",
        summary: "A new API token for the user (shown once; the user or an admin)",
        query: &[],
        headers: &[],
        body: Body::OptionalJson(schema_of::<TokenBody>),
        ok: 201,
        answer: Answer::Json(schema_of::<NewToken>),
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        id: "listTokens",
        method: "get",
        path: "/api/v1/users/{name}/tokens",
        summary: "The user's tokens: id, label, creation time, last use (to the minute) and which one the request came with; never the token (the user themself, or an admin)",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<Items<TokenEntry>>),
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        id: "revokeToken",
        method: "delete",
        path: "/api/v1/users/{name}/tokens/{token}",
        summary: "Revoke a token by its id (the user or an admin); refused from then on (other servers: within the token cache's 5 s)",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        id: "disableUser",
        method: "post",
        path: "/api/v1/admin/users/{name}/disable",
        summary: "Disable a user: every token of theirs is refused with a 403 (account-disabled); their work goes as the body says (no body: queued tasks held, not admitted until the user is enabled again; running ones stopped with the exit checkpoint); tasks stay (admin)",
        query: &[],
        headers: &[],
        body: Body::OptionalJson(schema_of::<WorkBody>),
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[404, 409],
    },
    Operation {
        id: "enableUser",
        method: "post",
        path: "/api/v1/admin/users/{name}/enable",
        summary: "Enable a disabled user again: their tokens work and their held tasks are released (admin; 409 for a deleted user)",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[404, 409],
    },
    Operation {
        id: "deleteUser",
        method: "post",
        path: "/api/v1/admin/users/{name}/delete",
        summary: "Delete a user: every token of theirs removed at once (401 from then on), their work as for a disable, their tasks kept for the record (ownerDeleted); the name is not used again (admin)",
        query: &[],
        headers: &[],
        body: Body::OptionalJson(schema_of::<WorkBody>),
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[404, 409],
    },
    Operation {
        id: "listRecentImages",
        method: "get",
        path: "/api/v1/users/{name}/images",
        summary: "The images the user's newest tasks ran, newest first, each once (at most 20)",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<Items<RecentImage>>),
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        id: "listTaskEnv",
        method: "get",
        path: "/api/v1/users/{name}/env",
        summary: "The user's TaskEnv (hidden values masked)",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<Items<EnvEntry>>),
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        id: "setTaskEnv",
        method: "put",
        path: "/api/v1/users/{name}/env",
        summary: "Set a TaskEnv variable (a task's own variable of the same name wins)",
        query: &[],
        headers: &[],
        body: Body::Json(schema_of::<TaskEnvBody>),
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[404, 422],
    },
    Operation {
        id: "deleteTaskEnv",
        method: "delete",
        path: "/api/v1/users/{name}/env/{var}",
        summary: "Remove a TaskEnv variable",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        id: "getUserAlarms",
        method: "get",
        path: "/api/v1/users/{name}/alarms",
        summary: "The user's alarm subscriptions (for every task they own)",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<Items<AlarmSubscription>>),
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        id: "replaceUserAlarms",
        method: "put",
        path: "/api/v1/users/{name}/alarms",
        summary: "Replace the user's alarm subscriptions (checked like a task's advanced.alarms)",
        query: &[],
        headers: &[],
        body: Body::Json(schema_of::<Vec<AlarmSubscription>>),
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[404, 422],
    },
    Operation {
        id: "getMetrics",
        method: "get",
        path: "/metrics",
        summary: "Prometheus metrics of the server (an admin's token; `trainyard up --metrics-listen` serves them without one on an address of their own)",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Text,
        also_ok: &[],
        errors: &[],
    },
    Operation {
        id: "healthz",
        method: "get",
        path: "/healthz",
        summary: "Health: `ok`, or 503 when the store cannot write (its last write failed, and so does a write tried now: a full disk, a lock never released), with the reason",
        query: &[],
        headers: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Text,
        also_ok: &[],
        errors: &[],
    },
];

/// A registry's `host[:port]` as `image_ref::check_registry` takes it: letters, digits, `.` and `-`, neither
/// first nor last, and a port that parses as 1 to 65535 (Rust's integer parsing: a `+` and leading zeros too).
fn registry_host() -> Value {
    let host = "[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?";
    let port =
        r"\+?0*(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])";
    json!({"type": "string", "pattern": format!("^{host}(?::{port})?$")})
}

/// What a path parameter is, and its schema; `None` for a name no path uses (a test holds every path to it).
pub fn path_parameter(name: &str) -> Option<(&'static str, Value)> {
    let any = json!({"type": "string", "minLength": 1});
    Some(match name {
        "id" => ("the task's id", any),
        "name" => ("a user's name", any),
        "user" => ("the name of the user the task is shared with", any),
        "node" => ("a node's name, as the catalog lists it", any),
        "token" => (
            "a token's id, as listed",
            json!({"type": "string", "pattern": format!("^[0-9a-fA-F]{{{}}}$", trainyard_store::TOKEN_ID_LEN)}),
        ),
        "var" => ("a TaskEnv variable's name", any),
        "workdir" => (
            "a working directory's id (the SHA-256 of its manifest, as its check answered)",
            json!({"type": "string", "pattern": "^[0-9a-f]{64}$"}),
        ),
        "host" => ("a registry's host[:port], as image references name it", registry_host()),
        _ => return None,
    })
}
