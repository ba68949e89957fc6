//! The types the store's callers see: tasks as stored and as created, events, status changes, list
//! filters and pages, users and tokens, alarm deliveries, persistent env vars. Plain data: how they are
//! read from and written to rows is in `rows` and the files that run the queries.

use std::collections::BTreeMap;
use trainyard_core::lifecycle::{Reason, Status};

/// A task as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRecord {
    pub id: String,
    pub name: String,
    pub owner: String,
    pub project_group: String,
    pub task_type: String,
    pub status: Status,
    /// Deleted: out of lists and of the control loop's work, history kept.
    pub deleted: bool,
    pub public: bool,
    pub labels: BTreeMap<String, String>,
    /// The task document as JSON (hidden values encrypted by the caller).
    pub spec_json: String,
    pub attempt: i64,
    /// Bumped by every change; updates name the version they read.
    pub version: i64,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// Where the current attempt runs (JSON, owned by the control loop); empty while queued.
    pub placement: String,
    /// Automatic resubmissions spent.
    pub retries: i64,
}

/// What [`Store::create_task`](crate::Store::create_task) stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTask {
    pub id: String,
    pub name: String,
    pub owner: String,
    pub project_group: String,
    pub task_type: String,
    pub status: Status,
    pub public: bool,
    pub labels: BTreeMap<String, String>,
    pub spec_json: String,
    pub created_at_ms: i64,
    /// `(key, hash of the request body)`: a retried create with the same key and body returns the first task.
    pub idempotency: Option<(String, String)>,
    /// The first event, written in the same transaction.
    pub first_event: Option<(Reason, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    New(TaskRecord),
    /// The same idempotency key and body were seen before: this is the task they created.
    Existing(TaskRecord),
}

impl Created {
    pub fn task(&self) -> &TaskRecord {
        match self {
            Created::New(t) | Created::Existing(t) => t,
        }
    }
}

/// Who is looking: visibility is decided in the query, so a list never leaks what the viewer may not see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Viewer {
    pub user: String,
    pub groups: Vec<String>,
    pub admin: bool,
}

/// Filters for [`Store::list_tasks`](crate::Store::list_tasks); every set field must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFilter {
    pub visible_to: Option<Viewer>,
    pub owner: Option<String>,
    pub project_group: Option<String>,
    pub status: Option<Status>,
    pub task_type: Option<String>,
    /// Substring of the name, or the exact id.
    pub search: Option<String>,
    /// `key=value` label selectors, all of which must hold.
    pub labels: Vec<(String, String)>,
    /// Only tasks this user may operate: their own, and those shared with them with operate rights (for
    /// an admin, leave it out).
    pub operable_by: Option<String>,
    pub sort: SortOrder,
}

/// The order of a list. Newest and oldest first use the index the list is built on; by name and by last
/// change sort the matching rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SortOrder {
    #[default]
    Newest,
    Oldest,
    Name,
    Updated,
}

impl SortOrder {
    pub fn from_name(s: &str) -> Option<SortOrder> {
        Some(match s {
            "newest" => SortOrder::Newest,
            "oldest" => SortOrder::Oldest,
            "name" => SortOrder::Name,
            "updated" => SortOrder::Updated,
            _ => return None,
        })
    }
}

/// One page of a list, newest first, and the cursor of the next page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub items: Vec<TaskRecord>,
    pub next_cursor: Option<String>,
}

/// An event in a task's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub seq: i64,
    pub task_id: String,
    pub attempt: i64,
    pub at_ms: i64,
    /// A stable reason code (`Queued`, `Admitted`, `Preempted`, ...).
    pub reason: String,
    pub message: String,
}

/// A change of status, applied only if the task is still at `expected_version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub task_id: String,
    pub expected_version: i64,
    pub status: Status,
    pub attempt: i64,
    pub at_ms: i64,
    pub reason: Reason,
    pub message: String,
    /// The new placement (`Some("")` clears it); `None` keeps it.
    pub placement: Option<String>,
    /// The new count of automatic resubmissions; `None` keeps it.
    pub retries: Option<i64>,
}

/// The most rows one list call returns.
pub const MAX_PAGE: u32 = 500;

/// One alarm to deliver (or delivered): also the delivery log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlarmDelivery {
    pub id: i64,
    pub task_id: String,
    pub attempt: i64,
    pub event: String,
    pub url: String,
    pub payload: String,
    /// `pending`, `delivered` or `failed` (gave up).
    pub state: String,
    pub tries: i64,
    pub next_at_ms: i64,
    pub last_error: String,
    pub created_at_ms: i64,
    pub done_at_ms: i64,
}

/// One persistent env var of a user (its value sealed by the caller when hidden).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskEnvVar {
    pub name: String,
    pub value: String,
    pub hidden: bool,
}

/// How many hex characters of a token's hash name it (64 bits: ids of one user's tokens never collide in
/// practice, and they say nothing usable about the token).
pub const TOKEN_ID_LEN: usize = 16;

/// A token as it is listed: its id, label, creation time and when it was last used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    pub id: String,
    pub label: String,
    pub created_at_ms: i64,
    /// When a request last authenticated with it, to within [`TOKEN_USE_RESOLUTION_MS`]; `None`: never
    /// (or not since this was recorded).
    pub last_used_at_ms: Option<i64>,
}

/// How finely a token's last use is recorded: a use within this long of the recorded one writes nothing.
pub const TOKEN_USE_RESOLUTION_MS: i64 = 60_000;

/// A user of the platform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    /// `admin` or `member`.
    pub role: String,
    pub groups: Vec<String>,
}

impl User {
    pub fn viewer(&self) -> Viewer {
        Viewer { user: self.name.clone(), groups: self.groups.clone(), admin: self.role == "admin" }
    }
}

/// Where a task is, without its record: what an incremental reader compares against what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskVersion {
    pub id: String,
    pub created_at_ms: i64,
    pub version: i64,
    pub status: Status,
    pub deleted: bool,
}
