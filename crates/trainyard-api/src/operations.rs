//! The table of every operation the router serves, as the OpenAPI document describes it: path, summary,
//! parameters, request body, success answer and the error statuses it answers with. The router and the
//! table are checked against each other by tests, and so are the answers and their schemas.

use crate::error::ProblemBody;
use crate::routes::admin::{NodeStateBody, RegistryLoginBody, RegistryLoginEntry};
use crate::routes::tasks::{CloneBody, ShareBody};
use crate::routes::users::{TaskEnvBody, TokenBody, UserBody};
use crate::schema::{Schemas, schema_of};
use crate::views::{
    AttemptReplicas, EnvEntry, EventView, Items, MetricsView, NewToken, RecentImage, TaskPage, TaskView,
    TokenEntry, UserEntry, UserView, Validation,
};
use serde_json::{Value, json};
use trainyard_control::QuotaLine;
use trainyard_core::Catalog;
use trainyard_core::spec::AlarmSubscription;

/// A body's or an answer's schema, made on demand (named types are defined in the document's components).
pub type SchemaFn = fn(&mut Schemas) -> Value;

/// One operation.
#[derive(Debug)]
pub struct Operation {
    pub method: &'static str,
    pub path: &'static str,
    pub summary: &'static str,
    pub query: &'static [Param],
    pub body: Body,
    /// The success status.
    pub ok: u16,
    /// What a success answers with.
    pub answer: Answer,
    /// Other success statuses with the same answer (a create replayed with its `Idempotency-Key`: 200).
    pub also_ok: &'static [u16],
    /// The error statuses the operation itself answers with, each a problem document. Routes under
    /// `/api/v1` (and `/metrics`) may also answer 401 and 403 (no token, a disabled account); operations
    /// with a body 413, with a JSON body or query parameters 400; any 414 and 500 (`default`).
    pub errors: &'static [u16],
}

/// A query parameter: name, JSON type, what it does.
pub type Param = (&'static str, &'static str, &'static str);

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
    /// The logs: JSON of this schema (the replicas), a replica's log as plain text, or its stream as
    /// server-sent events.
    Logs(SchemaFn),
}

/// The catalog as a request: the shape `GET /api/v1/catalog` answers with, but left-out fields take their
/// defaults (and YAML is fine), so the request schema is loose and the parser says what is wrong.
fn catalog_request(schemas: &mut Schemas) -> Value {
    let reference = schema_of::<Catalog>(schemas);
    json!({"type": "object", "description": format!("A catalog as {} describes it; left-out fields take their defaults", reference["$ref"].as_str().unwrap_or("the Catalog schema"))})
}

/// The problem schema, for the document builder.
pub fn problem_schema(schemas: &mut Schemas) -> Value {
    schema_of::<ProblemBody>(schemas)
}

/// Every operation the router serves (a test checks the router against this table).
pub const OPERATIONS: &[Operation] = &[
    Operation {
        method: "get",
        path: "/api/v1/whoami",
        summary: "The caller: name, role, groups",
        query: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<UserView>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        method: "get",
        path: "/api/v1/catalog",
        summary: "The catalog tasks are checked against",
        query: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<Catalog>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        method: "post",
        path: "/api/v1/tasks",
        summary: "Submit a task (YAML or JSON). Send Idempotency-Key to make retries safe: the same key and body return the first task (200), another body is a 409",
        query: &[],
        body: Body::Document(schema_of::<trainyard_core::TrainingTask>),
        ok: 201,
        answer: Answer::Json(schema_of::<TaskView>),
        also_ok: &[200],
        errors: &[400, 403, 409, 422],
    },
    Operation {
        method: "get",
        path: "/api/v1/tasks",
        summary: "Tasks visible to the caller (newest first unless sort says otherwise), a page at a time",
        query: &[
            ("status", "string", "only tasks in this status"),
            ("type", "string", "only PyTorchJob or RayJob tasks"),
            ("group", "string", "only this project group's"),
            ("owner", "string", "only this user's"),
            ("q", "string", "a name or id, or part of one"),
            ("labels", "string", "key=value[,key=value...]"),
            ("sort", "string", "newest (default), oldest, name or updated"),
            ("cursor", "string", "where the page starts: the previous page's nextCursor"),
            ("limit", "integer", "tasks per page (default 50, at most 500)"),
        ],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<TaskPage>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        method: "get",
        path: "/api/v1/tasks/{id}",
        summary: "One task: spec (hidden values masked), placement, queue position and reason",
        query: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<TaskView>),
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        method: "delete",
        path: "/api/v1/tasks/{id}",
        summary: "Stop (with the checkpoint window) and delete; the history is kept",
        query: &[],
        body: Body::None,
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[404, 409],
    },
    Operation {
        method: "get",
        path: "/api/v1/tasks/{id}/events",
        summary: "Every event of the task, in order (at most 1,000 an answer)",
        query: &[("after", "integer", "only events after this sequence number")],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<Items<EventView>>),
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        method: "get",
        path: "/api/v1/tasks/{id}/logs",
        summary: "Without replica: the replicas of each attempt (JSON). With replica: its log as text from offset (X-Next-Offset says where to go on, X-Log-Ended whether it ended); follow=true streams server-sent events, one line each, until it ends",
        query: &[
            ("replica", "string", "the replica whose log to read"),
            ("attempt", "integer", "which attempt (default: the latest)"),
            ("offset", "integer", "where to start, in bytes"),
            ("follow", "boolean", "stream as server-sent events until the replica ends"),
        ],
        body: Body::None,
        ok: 200,
        answer: Answer::Logs(schema_of::<Items<AttemptReplicas>>),
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        method: "get",
        path: "/api/v1/tasks/{id}/metrics",
        summary: "Preset (trainyard_*) and scraped metrics per replica as series of [atMs, value]",
        query: &[
            ("attempt", "integer", "which attempt (default: the latest)"),
            ("since", "integer", "only samples after this Unix time in ms"),
            ("name", "string", "only this metric"),
        ],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<MetricsView>),
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        method: "post",
        path: "/api/v1/validate",
        summary: "Check a task document without creating it: every problem, and the demand of each instance-spec option",
        query: &[],
        body: Body::Document(schema_of::<trainyard_core::TrainingTask>),
        ok: 200,
        answer: Answer::Json(schema_of::<Validation>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        method: "post",
        path: "/api/v1/tasks/{id}/stop",
        summary: "Stop: a queued task at once, a running one through Stopping",
        query: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<TaskView>),
        also_ok: &[],
        errors: &[404, 409],
    },
    Operation {
        method: "post",
        path: "/api/v1/tasks/{id}/resubmit",
        summary: "Run an ended task again as a new attempt",
        query: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<TaskView>),
        also_ok: &[],
        errors: &[404, 409],
    },
    Operation {
        method: "post",
        path: "/api/v1/tasks/{id}/clone",
        summary: "A new task from this one's spec, owned by the caller, in one of the caller's project groups (admins: any). Hidden values are never copied: give each in hiddenValues, or the answer is a 422 (masked-value) naming the variable",
        query: &[],
        body: Body::OptionalJson(schema_of::<CloneBody>),
        ok: 201,
        answer: Answer::Json(schema_of::<TaskView>),
        also_ok: &[],
        errors: &[404, 422],
    },
    Operation {
        method: "post",
        path: "/api/v1/tasks/{id}/shares",
        summary: "Share with a user: view, or view and operate (owner or admin)",
        query: &[],
        body: Body::Json(schema_of::<ShareBody>),
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        method: "get",
        path: "/api/v1/quota",
        summary: "Quota and usage per project group, resource type, pool and instance spec (members see their groups)",
        query: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<Items<QuotaLine>>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        method: "put",
        path: "/api/v1/admin/catalog",
        summary: "Replace the catalog (YAML or JSON; admin)",
        query: &[],
        body: Body::Document(catalog_request),
        ok: 200,
        answer: Answer::Json(schema_of::<Catalog>),
        also_ok: &[],
        errors: &[400],
    },
    Operation {
        method: "put",
        path: "/api/v1/admin/nodes/{name}",
        summary: "Cordon or uncordon a node (schedulable), or mark it failed: its replicas are killed and fault tolerance takes over (admin)",
        query: &[],
        body: Body::Json(schema_of::<NodeStateBody>),
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        method: "get",
        path: "/api/v1/admin/images",
        summary: "The registry images the local backend keeps: digest, references, bytes, last use (admin)",
        query: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<Items<trainyard_images::Cached>>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        method: "post",
        path: "/api/v1/admin/images/prune",
        summary: "Remove every cached registry image that no task runs or is about to run (admin)",
        query: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<trainyard_images::Collected>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        method: "get",
        path: "/api/v1/admin/registries",
        summary: "The registries that have a login: host, user name, when set (admin; never the passwords)",
        query: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<Items<RegistryLoginEntry>>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        method: "put",
        path: "/api/v1/admin/registries/{host}/login",
        summary: "Set the login images are pulled from a registry with; the password is stored sealed (admin)",
        query: &[],
        body: Body::Json(schema_of::<RegistryLoginBody>),
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[],
    },
    Operation {
        method: "delete",
        path: "/api/v1/admin/registries/{host}/login",
        summary: "Remove a registry's login (admin)",
        query: &[],
        body: Body::None,
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        method: "get",
        path: "/api/v1/admin/users",
        summary: "Every user: name, role and project groups, by name (admin; never tokens)",
        query: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<Items<UserEntry>>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        method: "post",
        path: "/api/v1/admin/users",
        summary: "Create or update a user (admin)",
        query: &[],
        body: Body::Json(schema_of::<UserBody>),
        ok: 200,
        answer: Answer::Json(schema_of::<UserView>),
        also_ok: &[],
        errors: &[],
    },
    Operation {
        method: "post",
        path: "/api/v1/users/{name}/tokens",
        summary: "A new API token for the user (shown once; the user or an admin)",
        query: &[],
        body: Body::OptionalJson(schema_of::<TokenBody>),
        ok: 201,
        answer: Answer::Json(schema_of::<NewToken>),
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        method: "get",
        path: "/api/v1/users/{name}/tokens",
        summary: "The user's tokens: id, label and creation time, never the token (the user or an admin)",
        query: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<Items<TokenEntry>>),
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        method: "delete",
        path: "/api/v1/users/{name}/tokens/{token}",
        summary: "Revoke a token by its id (the user or an admin); refused from then on (other servers: within the token cache's 5 s)",
        query: &[],
        body: Body::None,
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        method: "post",
        path: "/api/v1/admin/users/{name}/disable",
        summary: "Disable a user: every token of theirs is refused with a 403 (account-disabled); tasks stay (admin)",
        query: &[],
        body: Body::None,
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[404, 409],
    },
    Operation {
        method: "post",
        path: "/api/v1/admin/users/{name}/enable",
        summary: "Enable a disabled user again (admin)",
        query: &[],
        body: Body::None,
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        method: "get",
        path: "/api/v1/users/{name}/images",
        summary: "The images the user's newest tasks ran, newest first, each once (at most 20)",
        query: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<Items<RecentImage>>),
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        method: "get",
        path: "/api/v1/users/{name}/env",
        summary: "The user's TaskEnv (hidden values masked)",
        query: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<Items<EnvEntry>>),
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        method: "put",
        path: "/api/v1/users/{name}/env",
        summary: "Set a TaskEnv variable (a task's own variable of the same name wins)",
        query: &[],
        body: Body::Json(schema_of::<TaskEnvBody>),
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[404, 422],
    },
    Operation {
        method: "delete",
        path: "/api/v1/users/{name}/env/{var}",
        summary: "Remove a TaskEnv variable",
        query: &[],
        body: Body::None,
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        method: "get",
        path: "/api/v1/users/{name}/alarms",
        summary: "The user's alarm subscriptions (for every task they own)",
        query: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Json(schema_of::<Items<AlarmSubscription>>),
        also_ok: &[],
        errors: &[404],
    },
    Operation {
        method: "put",
        path: "/api/v1/users/{name}/alarms",
        summary: "Replace the user's alarm subscriptions (checked like a task's advanced.alarms)",
        query: &[],
        body: Body::Json(schema_of::<Vec<AlarmSubscription>>),
        ok: 204,
        answer: Answer::Empty,
        also_ok: &[],
        errors: &[404, 422],
    },
    Operation {
        method: "get",
        path: "/metrics",
        summary: "Prometheus metrics of the server (an admin's token; `trainyard up --metrics-listen` serves them without one on an address of their own)",
        query: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Text,
        also_ok: &[],
        errors: &[],
    },
    Operation {
        method: "get",
        path: "/healthz",
        summary: "Liveness",
        query: &[],
        body: Body::None,
        ok: 200,
        answer: Answer::Text,
        also_ok: &[],
        errors: &[],
    },
];

/// What a path parameter is.
pub fn path_parameter(name: &str) -> &'static str {
    match name {
        "id" => "the task's id",
        "name" => "a user's name (for /admin/nodes: a node's)",
        "token" => "a token's id, as listed",
        "var" => "a TaskEnv variable's name",
        "host" => "a registry's host[:port], as image references name it",
        _ => "",
    }
}
