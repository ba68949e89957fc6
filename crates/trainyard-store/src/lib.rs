//! Trainyard's store: tasks, their events, idempotency keys and shares, in SQLite (the embedded default: one
//! file in the data dir, WAL, synchronous commits) or PostgreSQL, behind one type.
//!
//! The SQL is written once, in the subset both databases share (`$N` parameters, BIGINT times in
//! milliseconds, TEXT JSON, 0/1 flags); only the DDL for generated keys differs. The same conformance suite
//! (`tests/conformance.rs`) runs against both.
//!
//! Durability: a call returns only after its transaction committed. SQLite runs with `synchronous=FULL` in
//! WAL mode, PostgreSQL with its default `synchronous_commit=on`, so an acknowledged write survives a
//! `kill -9` of the server at any moment.

#![forbid(unsafe_code)]

mod schema;

use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// Which database a store runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// A store failure. "Not found" is not an error (`Option`), and neither is "already exists" for an
/// idempotent create ([`Created::Existing`]).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the idempotency key was already used for a different request")]
    IdempotencyConflict,
    #[error("the task changed since it was read (version {expected} expected)")]
    VersionConflict { expected: i64 },
    #[error("task {0} does not exist")]
    NotFound(String),
    #[error("a task named {0} already exists")]
    NameTaken(String),
    #[error("unsupported database URL {0:?}: use sqlite://PATH or postgres://...")]
    BadUrl(String),
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// A task as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRecord {
    pub id: String,
    pub name: String,
    pub owner: String,
    pub project_group: String,
    pub task_type: String,
    pub status: String,
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

/// What [`Store::create_task`] stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTask {
    pub id: String,
    pub name: String,
    pub owner: String,
    pub project_group: String,
    pub task_type: String,
    pub status: String,
    pub public: bool,
    pub labels: BTreeMap<String, String>,
    pub spec_json: String,
    pub created_at_ms: i64,
    /// `(key, hash of the request body)`: a retried create with the same key and body returns the first task.
    pub idempotency: Option<(String, String)>,
    /// The first event, written in the same transaction.
    pub first_event: Option<(String, String)>,
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

/// Filters for [`Store::list_tasks`]; every set field must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFilter {
    pub visible_to: Option<Viewer>,
    pub owner: Option<String>,
    pub project_group: Option<String>,
    pub status: Option<String>,
    pub task_type: Option<String>,
    /// Substring of the name, or the exact id.
    pub search: Option<String>,
    /// `key=value` label selectors, all of which must hold.
    pub labels: Vec<(String, String)>,
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

    /// (column, ascending)
    fn key(self) -> (&'static str, bool) {
        match self {
            SortOrder::Newest => ("t.created_at_ms", false),
            SortOrder::Oldest => ("t.created_at_ms", true),
            SortOrder::Name => ("t.name", true),
            SortOrder::Updated => ("t.updated_at_ms", false),
        }
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
    pub status: String,
    pub attempt: i64,
    pub at_ms: i64,
    pub reason: String,
    pub message: String,
    /// The new placement (`Some("")` clears it); `None` keeps it.
    pub placement: Option<String>,
    /// The new count of automatic resubmissions; `None` keeps it.
    pub retries: Option<i64>,
}

/// The most rows one list call returns.
pub const MAX_PAGE: u32 = 500;

/// The store.
#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    dialect: Dialect,
    writer: tokio::sync::mpsc::Sender<Job>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").field("dialect", &self.dialect).finish()
    }
}

const TASK_COLUMNS: &str = "id, name, owner, project_group, task_type, status, public, labels, spec, attempt, \
                            version, created_at_ms, updated_at_ms, placement, retries";

/// A user from `SELECT name, role, groups`.
fn user_from_row(r: &AnyRow) -> Result<User> {
    let groups: String = r.try_get(2)?;
    Ok(User {
        name: r.try_get(0)?,
        role: r.try_get(1)?,
        groups: serde_json::from_str(&groups).map_err(|e| StoreError::Corrupt(format!("groups: {e}")))?,
    })
}

fn task_from_row(r: &AnyRow) -> Result<TaskRecord> {
    let labels: String = r.try_get("labels")?;
    Ok(TaskRecord {
        id: r.try_get("id")?,
        name: r.try_get("name")?,
        owner: r.try_get("owner")?,
        project_group: r.try_get("project_group")?,
        task_type: r.try_get("task_type")?,
        status: r.try_get("status")?,
        public: r.try_get::<i64, _>("public")? != 0,
        labels: serde_json::from_str(&labels).map_err(|e| StoreError::Corrupt(format!("labels: {e}")))?,
        spec_json: r.try_get("spec")?,
        attempt: r.try_get("attempt")?,
        version: r.try_get("version")?,
        created_at_ms: r.try_get("created_at_ms")?,
        updated_at_ms: r.try_get("updated_at_ms")?,
        placement: r.try_get("placement")?,
        retries: r.try_get("retries")?,
    })
}

fn event_from_row(r: &AnyRow) -> Result<Event> {
    Ok(Event {
        seq: r.try_get("seq")?,
        task_id: r.try_get("task_id")?,
        attempt: r.try_get("attempt")?,
        at_ms: r.try_get("at_ms")?,
        reason: r.try_get("reason")?,
        message: r.try_get("message")?,
    })
}

fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.is_unique_violation())
}

impl Store {
    /// Opens `sqlite://PATH` (created if missing) or `postgres://...`, and brings the schema up to date.
    pub async fn connect(url: &str) -> Result<Store> {
        sqlx::any::install_default_drivers();
        let dialect = if url.starts_with("sqlite:") {
            Dialect::Sqlite
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Dialect::Postgres
        } else {
            return Err(StoreError::BadUrl(url.to_owned()));
        };
        let options = AnyPoolOptions::new().acquire_timeout(Duration::from_secs(30));
        let pool = match dialect {
            Dialect::Sqlite => {
                let url = if url.contains('?') { url.to_owned() } else { format!("{url}?mode=rwc") };
                options
                    // SQLite has one writer; more connections only queue on its lock, and readers need no
                    // more than the cores they run on.
                    .max_connections(4)
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            sqlx::query("PRAGMA journal_mode=WAL").execute(&mut *conn).await?;
                            sqlx::query("PRAGMA synchronous=FULL").execute(&mut *conn).await?;
                            sqlx::query("PRAGMA busy_timeout=30000").execute(&mut *conn).await?;
                            sqlx::query("PRAGMA foreign_keys=ON").execute(&mut *conn).await?;
                            // 8 MiB of page cache per connection (the default is 2): the indexes new tasks
                            // go into stay in memory instead of being read back from the file.
                            sqlx::query("PRAGMA cache_size=-8192").execute(&mut *conn).await?;
                            // Checkpoint every 8,000 WAL pages (32 MiB; the default is 1,000): a page written
                            // by many commits in a row is copied into the database once, not each time.
                            sqlx::query("PRAGMA wal_autocheckpoint=8000").execute(&mut *conn).await?;
                            Ok(())
                        })
                    })
                    .connect(&url)
                    .await?
            }
            Dialect::Postgres => options.max_connections(32).connect(url).await?,
        };
        schema::migrate(&pool, dialect).await?;
        let (writer_tx, jobs) = tokio::sync::mpsc::channel(4 * GROUP_COMMIT_MAX);
        tokio::spawn(writer(pool.clone(), jobs));
        Ok(Store { pool, dialect, writer: writer_tx })
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Creates a task (and its first event) durably. With an idempotency key: a retry with the same key and
    /// body returns the task the first call created; the same key with another body is refused.
    ///
    /// Creates are group-committed: concurrent calls are written by one writer in one transaction (each in its
    /// own savepoint, so one failure does not affect the others) and all acknowledged after its commit. A call
    /// returns only once its task is committed.
    pub async fn create_task(&self, t: &NewTask) -> Result<Created> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        if self.writer.send((t.clone(), reply)).await.is_err() {
            return Err(StoreError::Corrupt("the store's writer has stopped".into()));
        }
        answer.await.map_err(|_| StoreError::Corrupt("the store's writer has stopped".into()))?
    }

    /// Stores many tasks in one transaction, without idempotency keys (imports, benchmarks, migrations from
    /// another system). All or nothing.
    pub async fn import_tasks(&self, tasks: &[NewTask]) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        for t in tasks {
            create_in(&mut tx, t).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// A task by id (deleted ones included: their history is kept).
    pub async fn get_task(&self, id: &str) -> Result<Option<TaskRecord>> {
        let row = sqlx::query(&format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(task_from_row).transpose()
    }

    /// Whether `viewer` may see the task: admin, owner, a member of its group when it is public, or shared.
    pub async fn visible(&self, task: &TaskRecord, viewer: &Viewer) -> Result<bool> {
        if viewer.admin
            || task.owner == viewer.user
            || (task.public && viewer.groups.contains(&task.project_group))
        {
            return Ok(true);
        }
        let row = sqlx::query("SELECT 1 FROM task_shares WHERE task_id = $1 AND user_name = $2")
            .bind(&task.id)
            .bind(&viewer.user)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    /// Shares a task with a user (`operate`: may also stop, resubmit and delete it).
    pub async fn share(&self, task_id: &str, user: &str, operate: bool) -> Result<()> {
        sqlx::query(
            "INSERT INTO task_shares (task_id, user_name, operate) VALUES ($1, $2, $3) \
             ON CONFLICT (task_id, user_name) DO UPDATE SET operate = $3",
        )
        .bind(task_id)
        .bind(user)
        .bind(i64::from(operate))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Whether `user` was given operate rights on the task.
    pub async fn may_operate(&self, task_id: &str, user: &str) -> Result<bool> {
        let row = sqlx::query("SELECT operate FROM task_shares WHERE task_id = $1 AND user_name = $2")
            .bind(task_id)
            .bind(user)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match row {
            Some(r) => r.try_get::<i64, _>(0)? != 0,
            None => false,
        })
    }

    /// Tasks matching `filter` in its order, `limit` (at most [`MAX_PAGE`]) at a time. Specs are left out
    /// (a list shows none; [`Store::get_task`] has it).
    ///
    /// A search that is exactly a task's id or name (what a user pastes) finds that task alone, through
    /// the unique indexes, instead of scanning every name for the text.
    pub async fn list_tasks(&self, filter: &TaskFilter, cursor: Option<&str>, limit: u32) -> Result<Page> {
        if let Some(s) = &filter.search
            && cursor.is_none()
        {
            let exact = self.list_page(filter, None, limit, Search::Exact(s)).await?;
            if !exact.items.is_empty() {
                return Ok(exact);
            }
        }
        let search = filter.search.as_deref().map_or(Search::None, Search::Substring);
        self.list_page(filter, cursor, limit, search).await
    }

    async fn list_page(
        &self,
        filter: &TaskFilter,
        cursor: Option<&str>,
        limit: u32,
        search: Search<'_>,
    ) -> Result<Page> {
        let limit = limit.clamp(1, MAX_PAGE);
        let columns = TASK_COLUMNS.replace("spec,", "'' AS spec,");
        let mut sql = format!("SELECT {columns} FROM tasks t WHERE deleted = 0");
        let mut args: Vec<Arg> = Vec::new();
        let mut push = |sql: &mut String, clause: &str, values: Vec<Arg>| {
            // Each `?` in `clause` becomes the next `$N`.
            let mut out = String::new();
            let mut vals = values.into_iter();
            for ch in clause.chars() {
                if ch == '?' {
                    args.push(vals.next().expect("one value per placeholder"));
                    out.push_str(&format!("${}", args.len()));
                } else {
                    out.push(ch);
                }
            }
            sql.push_str(" AND ");
            sql.push_str(&out);
        };
        if let Some(v) = &filter.visible_to
            && !v.admin
        {
            let mut clause = String::from("(t.owner = ?");
            let mut vals = vec![Arg::Text(v.user.clone())];
            if !v.groups.is_empty() {
                clause.push_str(" OR (t.public = 1 AND t.project_group IN (");
                clause.push_str(&vec!["?"; v.groups.len()].join(", "));
                clause.push_str("))");
                vals.extend(v.groups.iter().cloned().map(Arg::Text));
            }
            clause.push_str(
                " OR EXISTS (SELECT 1 FROM task_shares s WHERE s.task_id = t.id AND s.user_name = ?))",
            );
            vals.push(Arg::Text(v.user.clone()));
            push(&mut sql, &clause, vals);
        }
        for (col, val) in [
            ("t.owner", &filter.owner),
            ("t.project_group", &filter.project_group),
            ("t.status", &filter.status),
            ("t.task_type", &filter.task_type),
        ] {
            if let Some(v) = val {
                push(&mut sql, &format!("{col} = ?"), vec![Arg::Text(v.clone())]);
            }
        }
        match search {
            Search::None => {}
            Search::Exact(s) => {
                push(
                    &mut sql,
                    "(t.id = ? OR t.name = ?)",
                    vec![Arg::Text(s.to_owned()), Arg::Text(s.to_owned())],
                );
            }
            Search::Substring(s) => {
                let pattern =
                    format!("%{}%", s.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_"));
                push(
                    &mut sql,
                    "(t.id = ? OR t.name LIKE ? ESCAPE '\\')",
                    vec![Arg::Text(s.to_owned()), Arg::Text(pattern)],
                );
            }
        }
        for (k, v) in &filter.labels {
            push(
                &mut sql,
                "EXISTS (SELECT 1 FROM task_labels l WHERE l.task_id = t.id AND l.key = ? AND l.value = ?)",
                vec![Arg::Text(k.clone()), Arg::Text(v.clone())],
            );
        }
        // A cursor is `<sort key>.<id>` of the last item of the previous page (ids hold no dot).
        let (col, asc) = filter.sort.key();
        if let Some(c) = cursor {
            let (key, id) =
                c.rsplit_once('.').ok_or_else(|| StoreError::Corrupt(format!("bad cursor {c:?}")))?;
            let key = if filter.sort == SortOrder::Name {
                Arg::Text(key.to_owned())
            } else {
                Arg::Int(key.parse().map_err(|_| StoreError::Corrupt(format!("bad cursor {c:?}")))?)
            };
            let op = if asc { ">" } else { "<" };
            push(
                &mut sql,
                &format!("({col} {op} ? OR ({col} = ? AND t.id {op} ?))"),
                vec![key.clone(), key, Arg::Text(id.to_owned())],
            );
        }
        let dir = if asc { "ASC" } else { "DESC" };
        sql.push_str(&format!(" ORDER BY {col} {dir}, t.id {dir} LIMIT {}", limit + 1));
        let rows = bind_all(sqlx::query(&sql), &args).fetch_all(&self.pool).await?;
        let mut items = rows.iter().map(task_from_row).collect::<Result<Vec<_>>>()?;
        let next_cursor = if items.len() > limit as usize {
            items.truncate(limit as usize);
            items.last().map(|t| {
                let key = match filter.sort {
                    SortOrder::Newest | SortOrder::Oldest => t.created_at_ms.to_string(),
                    SortOrder::Updated => t.updated_at_ms.to_string(),
                    SortOrder::Name => t.name.clone(),
                };
                format!("{key}.{}", t.id)
            })
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }

    /// Applies a status change and its event in one transaction, if nobody changed the task meanwhile.
    pub async fn transition(&self, t: &Transition) -> Result<TaskRecord> {
        let mut all = self.transitions(std::slice::from_ref(t)).await?;
        all.pop().expect("one answer per transition")
    }

    /// Applies several status changes, each with its event, in one transaction (one commit): each applies
    /// if its task is at the version it expects when its turn comes, so a task can be taken through two
    /// steps by naming the version after the first. Each gets its own answer; a conflict writes nothing of
    /// that change and does not stop the others.
    pub async fn transitions(&self, changes: &[Transition]) -> Result<Vec<Result<TaskRecord>>> {
        let mut answers = Vec::with_capacity(changes.len());
        if changes.is_empty() {
            return Ok(answers);
        }
        let mut tx = self.pool.begin().await?;
        for t in changes {
            let changed = sqlx::query(
                "UPDATE tasks SET status = $1, attempt = $2, version = version + 1, updated_at_ms = $3, \
                 placement = COALESCE($4, placement), retries = COALESCE($5, retries) \
                 WHERE id = $6 AND version = $7",
            )
            .bind(&t.status)
            .bind(t.attempt)
            .bind(t.at_ms)
            .bind(t.placement.as_deref())
            .bind(t.retries)
            .bind(&t.task_id)
            .bind(t.expected_version)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if changed == 0 {
                let exists = sqlx::query("SELECT 1 FROM tasks WHERE id = $1")
                    .bind(&t.task_id)
                    .fetch_optional(&mut *tx)
                    .await?
                    .is_some();
                answers.push(Err(if exists {
                    StoreError::VersionConflict { expected: t.expected_version }
                } else {
                    StoreError::NotFound(t.task_id.clone())
                }));
                continue;
            }
            sqlx::query(
                "INSERT INTO task_events (task_id, attempt, at_ms, reason, message) VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(&t.task_id)
            .bind(t.attempt)
            .bind(t.at_ms)
            .bind(&t.reason)
            .bind(&t.message)
            .execute(&mut *tx)
            .await?;
            let row = sqlx::query(&format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = $1"))
                .bind(&t.task_id)
                .fetch_one(&mut *tx)
                .await?;
            answers.push(task_from_row(&row));
        }
        tx.commit().await?;
        Ok(answers)
    }

    /// Appends an event that changes no status (a figure, a warning, a step of a stop).
    pub async fn append_event(
        &self,
        task_id: &str,
        attempt: i64,
        at_ms: i64,
        reason: &str,
        message: &str,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO task_events (task_id, attempt, at_ms, reason, message) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(task_id)
        .bind(attempt)
        .bind(at_ms)
        .bind(reason)
        .bind(message)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// A task's events in order, after `after_seq`.
    pub async fn list_events(&self, task_id: &str, after_seq: i64, limit: u32) -> Result<Vec<Event>> {
        let rows = sqlx::query(
            "SELECT seq, task_id, attempt, at_ms, reason, message FROM task_events \
             WHERE task_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        )
        .bind(task_id)
        .bind(after_seq)
        .bind(i64::from(limit.clamp(1, 10 * MAX_PAGE)))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(event_from_row).collect()
    }

    /// Tasks (deleted ones included) whose stored spec contains `needle` (no `%` or `_` in it): a full
    /// scan, for one-time migrations of stored specs.
    pub async fn tasks_with_spec_containing(&self, needle: &str) -> Result<Vec<TaskRecord>> {
        let rows = sqlx::query(&format!("SELECT {TASK_COLUMNS} FROM tasks WHERE spec LIKE $1 ORDER BY id"))
            .bind(format!("%{needle}%"))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(task_from_row).collect()
    }

    /// Rewrites a task's stored spec (a migration of how it is stored, never a change of what it says:
    /// specs are otherwise immutable, and readers may keep them).
    pub async fn replace_spec(&self, id: &str, spec_json: &str) -> Result<()> {
        let changed = sqlx::query("UPDATE tasks SET spec = $1 WHERE id = $2")
            .bind(spec_json)
            .bind(id)
            .execute(&self.pool)
            .await?
            .rows_affected();
        if changed == 0 { Err(StoreError::NotFound(id.to_owned())) } else { Ok(()) }
    }

    /// Whether a task was deleted (false for one that does not exist).
    pub async fn is_deleted(&self, id: &str) -> Result<bool> {
        let row = sqlx::query("SELECT deleted FROM tasks WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.try_get::<i64, _>(0)).transpose()?.is_some_and(|d| d != 0))
    }

    /// Marks a task deleted: it leaves lists, its record and history stay.
    pub async fn delete_task(&self, id: &str, at_ms: i64) -> Result<()> {
        let changed = sqlx::query(
            "UPDATE tasks SET deleted = 1, version = version + 1, updated_at_ms = $1 WHERE id = $2",
        )
        .bind(at_ms)
        .bind(id)
        .execute(&self.pool)
        .await?
        .rows_affected();
        if changed == 0 { Err(StoreError::NotFound(id.to_owned())) } else { Ok(()) }
    }

    /// Like [`Store::tasks_in_status`], with `spec_json` left empty: for callers that keep specs (which never
    /// change) already, and fetch one with [`Store::get_task`] only for a task they have not seen.
    pub async fn tasks_in_status_without_spec(&self, statuses: &[&str]) -> Result<Vec<TaskRecord>> {
        self.tasks_where_status(statuses, &TASK_COLUMNS.replace("spec,", "'' AS spec,")).await
    }

    /// Tasks changed at or after `since_ms` (by `updated_at_ms`), specs left out, deleted ones included as
    /// their last state: what an incremental reader of the active set needs.
    pub async fn tasks_updated_since(&self, since_ms: i64) -> Result<Vec<TaskRecord>> {
        let columns = TASK_COLUMNS
            .replace("spec,", "'' AS spec,")
            .replace("status,", "CASE WHEN deleted = 1 THEN 'Deleted' ELSE status END AS status,");
        let rows = sqlx::query(&format!(
            "SELECT {columns} FROM tasks WHERE updated_at_ms >= $1 ORDER BY updated_at_ms, id"
        ))
        .bind(since_ms)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(task_from_row).collect()
    }

    /// Records that a task's next attempts leave `node` out (node replacement after a hardware error or a
    /// failed precheck). Recording it again changes nothing.
    pub async fn avoid_node(&self, task_id: &str, node: &str, at_ms: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO task_avoided_nodes (task_id, node, at_ms) VALUES ($1, $2, $3) \
             ON CONFLICT (task_id, node) DO NOTHING",
        )
        .bind(task_id)
        .bind(node)
        .bind(at_ms)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The nodes avoided by tasks (not deleted) whose status is one of `statuses`, as (task id, node).
    pub async fn avoided_nodes(&self, statuses: &[&str]) -> Result<Vec<(String, String)>> {
        if statuses.is_empty() {
            return Ok(Vec::new());
        }
        let marks = placeholders(statuses.len());
        let sql = format!(
            "SELECT a.task_id, a.node FROM task_avoided_nodes a JOIN tasks t ON t.id = a.task_id \
             WHERE t.deleted = 0 AND t.status IN ({}) ORDER BY a.task_id, a.node",
            marks
        );
        let mut q = sqlx::query(&sql);
        for s in statuses {
            q = q.bind(*s);
        }
        let rows = q.fetch_all(&self.pool).await?;
        rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
    }

    /// The stored specs of the tasks given (those that exist), by id: one query per few hundred ids.
    pub async fn specs_of(&self, ids: &[&str]) -> Result<BTreeMap<String, String>> {
        const IDS_PER_QUERY: usize = 500;
        let mut out = BTreeMap::new();
        for chunk in ids.chunks(IDS_PER_QUERY) {
            let marks = placeholders(chunk.len());
            let sql = format!("SELECT id, spec FROM tasks WHERE id IN ({})", marks);
            let mut q = sqlx::query(&sql);
            for id in chunk {
                q = q.bind(*id);
            }
            for row in q.fetch_all(&self.pool).await? {
                out.insert(row.try_get(0)?, row.try_get(1)?);
            }
        }
        Ok(out)
    }

    /// Tasks not deleted whose status is one of `statuses`: what the control loop rebuilds its state from.
    pub async fn tasks_in_status(&self, statuses: &[&str]) -> Result<Vec<TaskRecord>> {
        self.tasks_where_status(statuses, TASK_COLUMNS).await
    }

    async fn tasks_where_status(&self, statuses: &[&str], columns: &str) -> Result<Vec<TaskRecord>> {
        if statuses.is_empty() {
            return Ok(Vec::new());
        }
        let marks = placeholders(statuses.len());
        let sql = format!(
            "SELECT {columns} FROM tasks WHERE deleted = 0 AND status IN ({}) ORDER BY created_at_ms, id",
            marks
        );
        let mut q = sqlx::query(&sql);
        for s in statuses {
            q = q.bind(*s);
        }
        let rows = q.fetch_all(&self.pool).await?;
        rows.iter().map(task_from_row).collect()
    }

    /// Tasks (not deleted) per status.
    pub async fn count_by_status(&self) -> Result<BTreeMap<String, i64>> {
        let rows = sqlx::query("SELECT status, COUNT(*) FROM tasks WHERE deleted = 0 GROUP BY status")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
    }

    /// Number of stored tasks (deleted ones included).
    pub async fn count_tasks(&self) -> Result<i64> {
        Ok(sqlx::query("SELECT COUNT(*) FROM tasks").fetch_one(&self.pool).await?.try_get(0)?)
    }
}

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

fn delivery_from_row(r: &AnyRow) -> Result<AlarmDelivery> {
    Ok(AlarmDelivery {
        id: r.try_get("id")?,
        task_id: r.try_get("task_id")?,
        attempt: r.try_get("attempt")?,
        event: r.try_get("event")?,
        url: r.try_get("url")?,
        payload: r.try_get("payload")?,
        state: r.try_get("state")?,
        tries: r.try_get("tries")?,
        next_at_ms: r.try_get("next_at_ms")?,
        last_error: r.try_get("last_error")?,
        created_at_ms: r.try_get("created_at_ms")?,
        done_at_ms: r.try_get("done_at_ms")?,
    })
}

const DELIVERY_COLUMNS: &str = "id, task_id, attempt, event, url, payload, state, tries, next_at_ms, last_error, created_at_ms, done_at_ms";

impl Store {
    /// Queues an alarm, once per (task, attempt, event, url): a repeated call changes nothing.
    pub async fn enqueue_alarm(
        &self,
        task_id: &str,
        attempt: i64,
        event: &str,
        url: &str,
        payload: &str,
        at_ms: i64,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO alarm_deliveries (task_id, attempt, event, url, payload, state, tries, next_at_ms, last_error, created_at_ms, done_at_ms) \
             VALUES ($1, $2, $3, $4, $5, 'pending', 0, $6, '', $6, 0) ON CONFLICT (task_id, attempt, event, url) DO NOTHING",
        )
        .bind(task_id)
        .bind(attempt)
        .bind(event)
        .bind(url)
        .bind(payload)
        .bind(at_ms)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Pending deliveries due at `now_ms`, oldest first.
    pub async fn due_alarms(&self, now_ms: i64, limit: u32) -> Result<Vec<AlarmDelivery>> {
        let rows = sqlx::query(&format!(
            "SELECT {DELIVERY_COLUMNS} FROM alarm_deliveries WHERE state = 'pending' AND next_at_ms <= $1 ORDER BY next_at_ms, id LIMIT $2"
        ))
        .bind(now_ms)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(delivery_from_row).collect()
    }

    /// Records the outcome of one try.
    pub async fn record_delivery(
        &self,
        id: i64,
        state: &str,
        tries: i64,
        next_at_ms: i64,
        error: &str,
        at_ms: i64,
    ) -> Result<()> {
        let done = if state == "pending" { 0 } else { at_ms };
        sqlx::query("UPDATE alarm_deliveries SET state = $1, tries = $2, next_at_ms = $3, last_error = $4, done_at_ms = $5 WHERE id = $6")
            .bind(state)
            .bind(tries)
            .bind(next_at_ms)
            .bind(error)
            .bind(done)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// A task's delivery log.
    pub async fn task_alarms(&self, task_id: &str) -> Result<Vec<AlarmDelivery>> {
        let rows = sqlx::query(&format!(
            "SELECT {DELIVERY_COLUMNS} FROM alarm_deliveries WHERE task_id = $1 ORDER BY id"
        ))
        .bind(task_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(delivery_from_row).collect()
    }
}

impl Store {
    /// A named document, if set.
    pub async fn get_setting(&self, name: &str) -> Result<Option<String>> {
        let row = sqlx::query("SELECT value FROM settings WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| Ok(r.try_get(0)?)).transpose()
    }

    /// Sets a named document.
    pub async fn put_setting(&self, name: &str, value: &str, at_ms: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO settings (name, value, updated_at_ms) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO UPDATE SET value = $2, updated_at_ms = $3",
        )
        .bind(name)
        .bind(value)
        .bind(at_ms)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

/// One persistent env var of a user (its value sealed by the caller when hidden).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskEnvVar {
    pub name: String,
    pub value: String,
    pub hidden: bool,
}

impl Store {
    pub async fn put_task_env(&self, user: &str, var: &TaskEnvVar) -> Result<()> {
        sqlx::query(
            "INSERT INTO task_env (user_name, name, value, hidden) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (user_name, name) DO UPDATE SET value = $3, hidden = $4",
        )
        .bind(user)
        .bind(&var.name)
        .bind(&var.value)
        .bind(i64::from(var.hidden))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Removes one; returns whether it existed.
    pub async fn delete_task_env(&self, user: &str, name: &str) -> Result<bool> {
        let n = sqlx::query("DELETE FROM task_env WHERE user_name = $1 AND name = $2")
            .bind(user)
            .bind(name)
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok(n > 0)
    }

    /// Every hidden TaskEnv variable of every user (value as stored, sealed), for re-sealing at start-up.
    pub async fn hidden_task_env(&self) -> Result<Vec<(String, TaskEnvVar)>> {
        let rows = sqlx::query(
            "SELECT user_name, name, value FROM task_env WHERE hidden = 1 ORDER BY user_name, name",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((r.try_get(0)?, TaskEnvVar { name: r.try_get(1)?, value: r.try_get(2)?, hidden: true }))
            })
            .collect()
    }

    /// A user's persistent env vars, by name.
    pub async fn task_env(&self, user: &str) -> Result<Vec<TaskEnvVar>> {
        let rows = sqlx::query("SELECT name, value, hidden FROM task_env WHERE user_name = $1 ORDER BY name")
            .bind(user)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(TaskEnvVar {
                    name: r.try_get(0)?,
                    value: r.try_get(1)?,
                    hidden: r.try_get::<i64, _>(2)? != 0,
                })
            })
            .collect()
    }
}

/// How many hex characters of a token's hash name it (64 bits: ids of one user's tokens never collide in
/// practice, and they say nothing usable about the token).
pub const TOKEN_ID_LEN: usize = 16;

/// A token as it is listed: its id, label and creation time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    pub id: String,
    pub label: String,
    pub created_at_ms: i64,
}

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

impl Store {
    /// Creates a user, or updates the role and groups of an existing one.
    pub async fn put_user(&self, u: &User, at_ms: i64) -> Result<()> {
        let groups = serde_json::to_string(&u.groups).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        sqlx::query(
            "INSERT INTO users (name, role, groups, created_at_ms) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (name) DO UPDATE SET role = $2, groups = $3",
        )
        .bind(&u.name)
        .bind(&u.role)
        .bind(&groups)
        .bind(at_ms)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn get_user(&self, name: &str) -> Result<Option<User>> {
        let row = sqlx::query("SELECT name, role, groups FROM users WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(user_from_row).transpose()
    }

    pub async fn count_users(&self) -> Result<i64> {
        Ok(sqlx::query("SELECT COUNT(*) FROM users").fetch_one(&self.pool).await?.try_get(0)?)
    }

    /// Every user, by name (name, role and groups only: tokens are elsewhere, as hashes).
    pub async fn list_users(&self) -> Result<Vec<User>> {
        let rows =
            sqlx::query("SELECT name, role, groups FROM users ORDER BY name").fetch_all(&self.pool).await?;
        rows.iter().map(user_from_row).collect()
    }

    /// Records a token by its hash.
    pub async fn add_token(&self, hash: &str, user: &str, label: &str, at_ms: i64) -> Result<()> {
        sqlx::query("INSERT INTO tokens (hash, user_name, label, created_at_ms) VALUES ($1, $2, $3, $4)")
            .bind(hash)
            .bind(user)
            .bind(label)
            .bind(at_ms)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The user a token hash belongs to, and whether that user is disabled (one read: the API asks on every
    /// request its token cache cannot answer).
    pub async fn token_account(&self, hash: &str) -> Result<Option<(User, bool)>> {
        let row = sqlx::query(
            "SELECT u.name, u.role, u.groups, u.disabled FROM tokens t JOIN users u ON u.name = t.user_name \
             WHERE t.hash = $1",
        )
        .bind(hash)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| Ok((user_from_row(&r)?, r.try_get::<i64, _>(3)? != 0))).transpose()
    }

    /// Disables or enables a user; false when there is no such user.
    pub async fn set_user_disabled(&self, name: &str, disabled: bool) -> Result<bool> {
        let n = sqlx::query("UPDATE users SET disabled = $1 WHERE name = $2")
            .bind(i64::from(disabled))
            .bind(name)
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok(n > 0)
    }

    /// The names of disabled users.
    pub async fn disabled_users(&self) -> Result<std::collections::BTreeSet<String>> {
        let rows = sqlx::query("SELECT name FROM users WHERE disabled = 1").fetch_all(&self.pool).await?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }

    /// A user's tokens, oldest first: never the token or its full hash, only an id ([`TOKEN_ID_LEN`] hex
    /// characters of the hash) to revoke it by.
    pub async fn list_tokens(&self, user: &str) -> Result<Vec<TokenInfo>> {
        let rows = sqlx::query(
            "SELECT hash, label, created_at_ms FROM tokens WHERE user_name = $1 ORDER BY created_at_ms, hash",
        )
        .bind(user)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let hash: String = r.try_get(0)?;
                Ok(TokenInfo {
                    id: hash.chars().take(TOKEN_ID_LEN).collect(),
                    label: r.try_get(1)?,
                    created_at_ms: r.try_get(2)?,
                })
            })
            .collect()
    }

    /// Revokes (deletes) a user's token by its id; false when the user has no such token.
    pub async fn revoke_token(&self, user: &str, id: &str) -> Result<bool> {
        if id.len() != TOKEN_ID_LEN || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(false);
        }
        let sql = format!("DELETE FROM tokens WHERE user_name = $1 AND substr(hash, 1, {TOKEN_ID_LEN}) = $2");
        let n = sqlx::query(&sql)
            .bind(user)
            .bind(id.to_ascii_lowercase())
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok(n > 0)
    }

    /// The user a token hash belongs to.
    pub async fn user_for_token(&self, hash: &str) -> Result<Option<User>> {
        let row = sqlx::query("SELECT user_name FROM tokens WHERE hash = $1")
            .bind(hash)
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some(r) => self.get_user(&r.try_get::<String, _>(0)?).await,
            None => Ok(None),
        }
    }
}

/// One create inside the caller's transaction.
async fn create_in(conn: &mut sqlx::AnyConnection, t: &NewTask) -> Result<Created> {
    if let Some((key, hash)) = &t.idempotency {
        let inserted = sqlx::query(
            "INSERT INTO idempotency (owner, key, body_hash, task_id, created_at_ms) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (owner, key) DO NOTHING",
        )
        .bind(&t.owner)
        .bind(key)
        .bind(hash)
        .bind(&t.id)
        .bind(t.created_at_ms)
        .execute(&mut *conn)
        .await?
        .rows_affected();
        if inserted == 0 {
            let row = sqlx::query("SELECT body_hash, task_id FROM idempotency WHERE owner = $1 AND key = $2")
                .bind(&t.owner)
                .bind(key)
                .fetch_one(&mut *conn)
                .await?;
            let (seen_hash, task_id): (String, String) = (row.try_get(0)?, row.try_get(1)?);
            if &seen_hash != hash {
                return Err(StoreError::IdempotencyConflict);
            }
            let row = sqlx::query(&format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = $1"))
                .bind(&task_id)
                .fetch_optional(&mut *conn)
                .await?
                .ok_or_else(|| {
                    StoreError::Corrupt(format!("idempotency key points at missing task {task_id}"))
                })?;
            return Ok(Created::Existing(task_from_row(&row)?));
        }
    }
    let labels = serde_json::to_string(&t.labels).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let insert = sqlx::query(&format!(
        "INSERT INTO tasks ({TASK_COLUMNS}, deleted) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 0, 1, $10, $10, '', 0, 0)"
    ))
    .bind(&t.id)
    .bind(&t.name)
    .bind(&t.owner)
    .bind(&t.project_group)
    .bind(&t.task_type)
    .bind(&t.status)
    .bind(i64::from(t.public))
    .bind(&labels)
    .bind(&t.spec_json)
    .bind(t.created_at_ms)
    .execute(&mut *conn)
    .await;
    match insert {
        Err(e) if is_unique_violation(&e) => return Err(StoreError::NameTaken(t.name.clone())),
        other => {
            other?;
        }
    }
    for (k, v) in &t.labels {
        sqlx::query("INSERT INTO task_labels (task_id, key, value) VALUES ($1, $2, $3)")
            .bind(&t.id)
            .bind(k)
            .bind(v)
            .execute(&mut *conn)
            .await?;
    }
    if let Some((reason, message)) = &t.first_event {
        sqlx::query(
            "INSERT INTO task_events (task_id, attempt, at_ms, reason, message) VALUES ($1, 0, $2, $3, $4)",
        )
        .bind(&t.id)
        .bind(t.created_at_ms)
        .bind(reason)
        .bind(message)
        .execute(&mut *conn)
        .await?;
    }
    Ok(Created::New(new_record(t)))
}

/// The record a create writes.
fn new_record(t: &NewTask) -> TaskRecord {
    TaskRecord {
        id: t.id.clone(),
        name: t.name.clone(),
        owner: t.owner.clone(),
        project_group: t.project_group.clone(),
        task_type: t.task_type.clone(),
        status: t.status.clone(),
        public: t.public,
        labels: t.labels.clone(),
        spec_json: t.spec_json.clone(),
        attempt: 0,
        version: 1,
        created_at_ms: t.created_at_ms,
        updated_at_ms: t.created_at_ms,
        placement: String::new(),
        retries: 0,
    }
}

/// Rows per multi-row INSERT: well under SQLite's oldest bound of 999 parameters at 10 per task row.
const ROWS_PER_INSERT: usize = 64;

/// Runs `INSERT ... VALUES (...), (...) [tail]` over `rows` in chunks, each row `width` parameters filled in
/// by `row`; returns the rows inserted. `values` is one row's `VALUES` group with `{}` where its first
/// parameter number goes (the rest follow in order).
async fn insert_rows(
    conn: &mut sqlx::AnyConnection,
    head: &str,
    tail: &str,
    group: fn(usize) -> String,
    rows: &[Vec<Arg>],
) -> std::result::Result<u64, sqlx::Error> {
    let mut inserted = 0;
    for chunk in rows.chunks(ROWS_PER_INSERT) {
        let mut sql = String::with_capacity(head.len() + chunk.len() * 64);
        sql.push_str(head);
        let mut n = 1;
        for (i, r) in chunk.iter().enumerate() {
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push_str(&group(n));
            n += r.len();
        }
        sql.push_str(tail);
        inserted +=
            bind_all(sqlx::query(&sql), chunk.iter().flatten()).execute(&mut *conn).await?.rows_affected();
    }
    Ok(inserted)
}

/// The whole batch in a few multi-row statements. `Ok(false)` when it cannot be done that way (an
/// idempotency key already stored, or twice in the batch; a name taken): the caller rolls back.
async fn insert_many(conn: &mut sqlx::AnyConnection, batch: &[Job]) -> Result<bool> {
    let keyed: Vec<Vec<Arg>> = batch
        .iter()
        .filter_map(|(t, _)| {
            let (key, hash) = t.idempotency.as_ref()?;
            Some(vec![
                Arg::Text(t.owner.clone()),
                Arg::Text(key.clone()),
                Arg::Text(hash.clone()),
                Arg::Text(t.id.clone()),
                Arg::Int(t.created_at_ms),
            ])
        })
        .collect();
    if !keyed.is_empty() {
        let inserted = insert_rows(
            conn,
            "INSERT INTO idempotency (owner, key, body_hash, task_id, created_at_ms) VALUES ",
            " ON CONFLICT (owner, key) DO NOTHING",
            |n| format!("(${n}, ${}, ${}, ${}, ${})", n + 1, n + 2, n + 3, n + 4),
            &keyed,
        )
        .await?;
        if inserted != keyed.len() as u64 {
            return Ok(false);
        }
    }
    let mut tasks = Vec::with_capacity(batch.len());
    let mut labels = Vec::new();
    let mut events = Vec::new();
    for (t, _) in batch {
        let l = serde_json::to_string(&t.labels).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        tasks.push(vec![
            Arg::Text(t.id.clone()),
            Arg::Text(t.name.clone()),
            Arg::Text(t.owner.clone()),
            Arg::Text(t.project_group.clone()),
            Arg::Text(t.task_type.clone()),
            Arg::Text(t.status.clone()),
            Arg::Int(i64::from(t.public)),
            Arg::Text(l),
            Arg::Text(t.spec_json.clone()),
            Arg::Int(t.created_at_ms),
        ]);
        for (k, v) in &t.labels {
            labels.push(vec![Arg::Text(t.id.clone()), Arg::Text(k.clone()), Arg::Text(v.clone())]);
        }
        if let Some((reason, message)) = &t.first_event {
            events.push(vec![
                Arg::Text(t.id.clone()),
                Arg::Int(t.created_at_ms),
                Arg::Text(reason.clone()),
                Arg::Text(message.clone()),
            ]);
        }
    }
    let head = format!("INSERT INTO tasks ({TASK_COLUMNS}, deleted) VALUES ");
    let group = |n: usize| {
        let p: Vec<String> = (n..n + 9).map(|i| format!("${i}")).collect();
        format!("({}, 0, 1, ${}, ${}, '', 0, 0)", p.join(", "), n + 9, n + 9)
    };
    match insert_rows(conn, &head, "", group, &tasks).await {
        Err(e) if is_unique_violation(&e) => return Ok(false),
        other => {
            other?;
        }
    }
    if !labels.is_empty() {
        let head = "INSERT INTO task_labels (task_id, key, value) VALUES ";
        insert_rows(conn, head, "", |n| format!("(${n}, ${}, ${})", n + 1, n + 2), &labels).await?;
    }
    if !events.is_empty() {
        let head = "INSERT INTO task_events (task_id, attempt, at_ms, reason, message) VALUES ";
        let group = |n: usize| format!("(${n}, 0, ${}, ${}, ${})", n + 1, n + 2, n + 3);
        insert_rows(conn, head, "", group, &events).await?;
    }
    Ok(true)
}

type Job = (NewTask, tokio::sync::oneshot::Sender<Result<Created>>);

/// How a list matches its search text.
#[derive(Clone, Copy)]
enum Search<'a> {
    None,
    /// The task whose id or name this is.
    Exact(&'a str),
    /// Tasks whose name holds this (or whose id it is).
    Substring(&'a str),
}

/// The most creates one group commit takes.
const GROUP_COMMIT_MAX: usize = 512;

/// One batch of creates in one transaction. Without savepoints it stops at the first failure and rolls
/// everything back (the caller retries with them).
async fn write_batch(
    pool: &AnyPool,
    batch: &[Job],
    savepoints: bool,
    results: &mut Vec<Result<Created>>,
) -> Result<()> {
    let mut tx = pool.begin().await?;
    if !savepoints {
        // The common case, a batch of new tasks with fresh keys and free names: a few multi-row statements
        // for the whole batch instead of a few per create. Anything else (a key seen before, a name taken)
        // rolls back here and takes the one-by-one path below, which answers each create on its own.
        if insert_many(&mut tx, batch).await? {
            tx.commit().await?;
            results.extend(batch.iter().map(|(t, _)| Ok(Created::New(new_record(t)))));
            return Ok(());
        }
        tx.rollback().await?;
        tx = pool.begin().await?;
    }
    for (t, _) in batch {
        if savepoints {
            sqlx::query("SAVEPOINT one_create").execute(&mut *tx).await?;
        }
        let r = create_in(&mut tx, t).await;
        let failed = r.is_err();
        results.push(r);
        if savepoints {
            let undo =
                if failed { "ROLLBACK TO SAVEPOINT one_create" } else { "RELEASE SAVEPOINT one_create" };
            sqlx::query(undo).execute(&mut *tx).await?;
        } else if failed {
            tx.rollback().await?;
            return Ok(());
        }
    }
    tx.commit().await?;
    Ok(())
}

/// Writes queued creates in batches: one transaction, one commit, then every answer.
async fn writer(pool: AnyPool, mut jobs: tokio::sync::mpsc::Receiver<Job>) {
    let mut batch: Vec<Job> = Vec::with_capacity(GROUP_COMMIT_MAX);
    while let Some(first) = jobs.recv().await {
        batch.push(first);
        while batch.len() < GROUP_COMMIT_MAX {
            match jobs.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        // Optimistic first: the whole batch in one transaction. If any create fails (a taken name, a reused
        // key with another body), the batch runs again with a savepoint around each create, so that one failure
        // is undone alone.
        let mut results: Vec<Result<Created>> = Vec::with_capacity(batch.len());
        let mut committed = write_batch(&pool, &batch, false, &mut results).await;
        if committed.is_ok() && results.iter().any(|r| r.is_err()) {
            results.clear();
            committed = write_batch(&pool, &batch, true, &mut results).await;
        }
        match committed {
            Ok(()) => {
                for ((_, reply), r) in batch.drain(..).zip(results) {
                    let _ = reply.send(r);
                }
            }
            Err(e) => {
                // Nothing of the batch is committed: every caller hears so, and nothing was acknowledged.
                let message = e.to_string();
                for (_, reply) in batch.drain(..) {
                    let _ = reply.send(Err(StoreError::Corrupt(format!("commit failed: {message}"))));
                }
            }
        }
    }
}

#[derive(Clone)]
enum Arg {
    Text(String),
    Int(i64),
}

type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

/// Binds `args` in order to the query's `$1`, `$2`, ...
fn bind_all<'q>(mut q: AnyQuery<'q>, args: impl IntoIterator<Item = &'q Arg>) -> AnyQuery<'q> {
    for a in args {
        q = match a {
            Arg::Text(s) => q.bind(s.as_str()),
            Arg::Int(i) => q.bind(*i),
        };
    }
    q
}

/// `$1, $2, ..., $n`: the placeholders of an `IN (...)` list.
fn placeholders(n: usize) -> String {
    (1..=n).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
}
