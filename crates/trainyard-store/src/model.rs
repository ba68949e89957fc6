//! The types the store's callers see: tasks as stored and as created, events, status changes, list
//! filters and pages, users and tokens, alarm deliveries, persistent env vars. Plain data: how they are
//! read from and written to rows is in `rows` and the files that run the queries.

use std::collections::BTreeMap;
use trainyard_core::demand::Demand;
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
    /// What it asks for, as summed at create; `None` for a task stored before the store kept it.
    pub demand: Option<TaskDemand>,
    /// When it entered its current status (a change to the same status keeps it).
    pub status_since_ms: i64,
    /// When its current attempt entered Running; `None` while it has not (queued again, it has not).
    pub run_started_at_ms: Option<i64>,
}

/// Whether a task asks for GPUs: what a list's accelerator filter matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accelerator {
    /// At least one of its instance-spec options has GPUs.
    Gpu,
    /// None of them has.
    Cpu,
}

impl Accelerator {
    pub const ALL: &[Accelerator] = &[Accelerator::Gpu, Accelerator::Cpu];

    /// The name in the store and in the API's filter.
    pub fn as_str(self) -> &'static str {
        match self {
            Accelerator::Gpu => "gpu",
            Accelerator::Cpu => "cpu",
        }
    }

    pub fn from_name(s: &str) -> Option<Accelerator> {
        Accelerator::ALL.iter().copied().find(|a| a.as_str() == s)
    }
}

/// Replicas alike: how many, and what one of them takes on its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaShape {
    pub replicas: u32,
    pub gpus: u64,
    pub vcpus: u64,
    pub memory_mib: u64,
}

/// What a task asks for, summed once at create from its validated spec and the catalog of the day, so that
/// a list shows it (and filters on it) without reading a spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskDemand {
    /// The replicas of its first (preferred) instance-spec option, one entry per shape in role order (the
    /// master or head first; a role of the shape before it is counted with it).
    pub shapes: Vec<ReplicaShape>,
    /// How many instance-spec options it lists: with more than one, the scheduler may take another.
    pub options: u32,
    pub accelerator: Accelerator,
}

impl TaskDemand {
    /// The summary of a task's demand per instance-spec option (in the user's order); `None` without one.
    pub fn of(options: &[Demand]) -> Option<TaskDemand> {
        let first = options.first()?;
        let mut shapes: Vec<ReplicaShape> = Vec::new();
        for role in &first.roles {
            let r = role.per_replica;
            match shapes.last_mut() {
                Some(s) if (s.gpus, s.vcpus, s.memory_mib) == (r.gpus, r.vcpus, r.memory_mib) => {
                    s.replicas = s.replicas.saturating_add(role.replicas)
                }
                _ => shapes.push(ReplicaShape {
                    replicas: role.replicas,
                    gpus: r.gpus,
                    vcpus: r.vcpus,
                    memory_mib: r.memory_mib,
                }),
            }
        }
        let gpu = options.iter().any(|d| d.total.gpus > 0);
        Some(TaskDemand {
            shapes,
            options: u32::try_from(options.len()).unwrap_or(u32::MAX),
            accelerator: if gpu { Accelerator::Gpu } else { Accelerator::Cpu },
        })
    }
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
    /// What it asks for ([`TaskDemand::of`] its validated spec); `None` when it cannot be worked out.
    pub demand: Option<TaskDemand>,
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
    /// Any of these project groups (none: every group).
    pub project_groups: Vec<String>,
    pub status: Option<Status>,
    pub task_type: Option<String>,
    /// Substring of the name, or the exact id.
    pub search: Option<String>,
    /// `key=value` label selectors, all of which must hold.
    pub labels: Vec<(String, String)>,
    /// Only tasks that ask for GPUs, or only those that ask for none (a task stored before the store kept
    /// its demand matches neither).
    pub accelerator: Option<Accelerator>,
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

/// What an admin made of a user beyond their role: disabled (every token refused), deleted (tokens gone,
/// name retired), and whether their queued work is held (not admitted while they are disabled or deleted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AccountState {
    pub disabled: bool,
    pub deleted: bool,
    pub hold_work: bool,
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

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_core::demand::{Resources, Role, RoleDemand};

    fn role(role: Role, replicas: u32, gpus: u64, vcpus: u64) -> RoleDemand {
        let per_replica = Resources { gpus, vcpus, memory_mib: vcpus * 4096 };
        RoleDemand {
            role,
            replicas,
            spec: format!("{gpus}g{vcpus}c"),
            count_per_node: 1,
            per_replica,
            units: u64::from(replicas),
            total: per_replica * u64::from(replicas),
        }
    }

    fn option(roles: Vec<RoleDemand>) -> Demand {
        let total = roles.iter().fold(Resources::default(), |acc, r| acc + r.total);
        Demand { option: 0, replicas: roles.iter().map(|r| r.replicas).sum(), quota: vec![], total, roles }
    }

    fn shape(replicas: u32, gpus: u64, vcpus: u64) -> ReplicaShape {
        ReplicaShape { replicas, gpus, vcpus, memory_mib: vcpus * 4096 }
    }

    #[test]
    fn a_demand_is_summed_by_shape_from_the_first_option() {
        let check = |options: Vec<Demand>, shapes: Vec<ReplicaShape>, accelerator: Accelerator| {
            let n = options.len() as u32;
            assert_eq!(TaskDemand::of(&options), Some(TaskDemand { shapes, options: n, accelerator }));
        };
        // A master and three workers of one spec are four replicas alike.
        check(
            vec![option(vec![role(Role::Master, 1, 1, 8), role(Role::Worker, 3, 1, 8)])],
            vec![shape(4, 1, 8)],
            Accelerator::Gpu,
        );
        // A Ray head of its own CPU spec stays apart from its GPU workers.
        check(
            vec![option(vec![role(Role::Head, 1, 0, 4), role(Role::Worker, 2, 2, 16)])],
            vec![shape(1, 0, 4), shape(2, 2, 16)],
            Accelerator::Gpu,
        );
        check(vec![option(vec![role(Role::Master, 1, 0, 4)])], vec![shape(1, 0, 4)], Accelerator::Cpu);
        // A CPU first choice with a GPU fallback is a GPU task: it may get GPUs.
        check(
            vec![option(vec![role(Role::Master, 1, 0, 4)]), option(vec![role(Role::Master, 1, 1, 8)])],
            vec![shape(1, 0, 4)],
            Accelerator::Gpu,
        );
        assert_eq!(TaskDemand::of(&[]), None);
    }
}
