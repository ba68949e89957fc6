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
//!
//! The files, each one job: `model` (the types callers see), `rows` (SQL rows to those types, and values to
//! parameters: the store's edge), `tasks` (reading tasks and their events; deletion, spec migrations and
//! avoided nodes), `list` (the list query: visibility, filters, search, order and cursor), `shares`,
//! `transitions` (status changes with their events, and events alone), `create` (one create in a transaction, and imports), `group_commit`
//! (the writer that batches concurrent creates into one commit; PostgreSQL's), `sqlite_writer` (SQLite's, on
//! a thread of its own), `sqlite_reader` (SQLite's reader for the control loop's light reads), `keys` (SQLite's
//! index of idempotency keys, in memory), `accounts` (users and tokens), `alarms`
//! (alarm deliveries), `env` (users' persistent env vars), `settings`, and `schema` (the migrations). This
//! file holds the [`Store`] itself, how it connects, and its errors.

#![forbid(unsafe_code)]

mod accounts;
mod alarms;
mod create;
mod env;
mod group_commit;
mod health;
mod kept;
mod keys;
mod lease;
mod list;
mod model;
mod rows;
mod schema;
mod settings;
mod shares;
mod sqlite_reader;
mod sqlite_writer;
mod tasks;
mod transitions;
mod wal_check;

pub use health::{PROBE_EVERY, PROBE_TIMEOUT};
pub use kept::{KeptLog, KeptReplica};
pub use lease::{Fence, Lease, ServerRecord};
pub use model::{
    Accelerator, AccountState, AlarmDelivery, Created, Event, MAX_PAGE, NewTask, Page, ReplicaShape,
    SortOrder, TOKEN_ID_LEN, TOKEN_USE_RESOLUTION_MS, TaskDemand, TaskEnvVar, TaskFilter, TaskRecord,
    TaskVersion, TokenInfo, Transition, User, Viewer,
};

use group_commit::{GROUP_COMMIT_MAX, Job, writer};
use sqlx::AnyPool;
use sqlx::any::AnyPoolOptions;
use std::fmt;
use std::sync::Arc;
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
    /// A fenced store's write after this server's term as leader ended (`lease`): nothing was written.
    #[error(
        "this server no longer leads (its fencing token {held}, the store's {current}): nothing was written"
    )]
    Fenced { held: i64, current: i64 },
    #[error("task {0} does not exist")]
    NotFound(String),
    #[error("a task named {0} already exists")]
    NameTaken(String),
    #[error("unsupported database URL {0:?}: use sqlite://PATH (a file) or postgres://...")]
    BadUrl(String),
    #[error("database error: {0}")]
    Db(sqlx::Error),
    /// From SQLite's create writer, which has a connection of its own (`sqlite_writer`).
    #[error("database error: {0}")]
    Sqlite(rusqlite::Error),
    /// The database could not write for want of space: SQLite's `SQLITE_FULL`, an `ENOSPC` from the
    /// system, PostgreSQL's `disk_full` (SQLSTATE 53100). Nothing of the write was stored, and the store
    /// needs no restart once there is space again. The text is the database's own.
    #[error(
        "the disk holding the store's database is full ({0}): nothing of this request was stored; free space \
         on that disk (or give it more), then try again; the server needs no restart"
    )]
    DiskFull(String),
    /// A write that failed for a reason of the database's (a batch of creates that could not be committed,
    /// the create writer gone), not because of what was asked.
    #[error("the store could not write: {0}")]
    WriteFailed(String),
    /// The database's files are damaged ([`wal_check`]): opening them would lose committed writes.
    #[error("{0}")]
    Damaged(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        let full = match &e {
            // SQLite's extended result code (`SQLITE_FULL` has no extended variants), PostgreSQL's SQLSTATE.
            sqlx::Error::Database(d) => matches!(d.code().as_deref(), Some("13" | "53100")),
            sqlx::Error::Io(io) => is_enospc(io),
            _ => false,
        };
        if full { StoreError::DiskFull(e.to_string()) } else { StoreError::Db(e) }
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        match &e {
            rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DiskFull => {
                StoreError::DiskFull(e.to_string())
            }
            _ => StoreError::Sqlite(e),
        }
    }
}

fn is_enospc(e: &std::io::Error) -> bool {
    /// Linux's `ENOSPC`.
    const ENOSPC: i32 = 28;
    e.kind() == std::io::ErrorKind::StorageFull || e.raw_os_error() == Some(ENOSPC)
}

impl StoreError {
    /// Whether the database failed (its disk, its I/O, its locks, the connection to it), rather than refused
    /// what was asked (a conflict, a constraint, a row that is not there). A write that fails so marks the
    /// store unhealthy until a write succeeds again (`health.rs`), and the connection it used is closed.
    pub fn is_database_failure(&self) -> bool {
        use sqlx::error::ErrorKind;
        match self {
            StoreError::DiskFull(_) | StoreError::WriteFailed(_) | StoreError::Damaged(_) => true,
            StoreError::Db(sqlx::Error::Database(d)) => matches!(d.kind(), ErrorKind::Other),
            StoreError::Db(e) => matches!(
                e,
                sqlx::Error::Io(_)
                    | sqlx::Error::Tls(_)
                    | sqlx::Error::Protocol(_)
                    | sqlx::Error::PoolTimedOut
                    | sqlx::Error::PoolClosed
                    | sqlx::Error::WorkerCrashed
                    | sqlx::Error::BeginFailed
            ),
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(f, _)) => {
                f.code != rusqlite::ErrorCode::ConstraintViolation
            }
            StoreError::Sqlite(_) => false,
            StoreError::IdempotencyConflict
            | StoreError::VersionConflict { .. }
            | StoreError::NotFound(_)
            | StoreError::NameTaken(_)
            | StoreError::Fenced { .. }
            | StoreError::BadUrl(_)
            | StoreError::Corrupt(_) => false,
        }
    }

    /// The same failure, for each create of a batch that failed as a whole (errors do not clone).
    pub(crate) fn for_each_of_a_batch(&self) -> StoreError {
        match self {
            StoreError::DiskFull(m) => StoreError::DiskFull(m.clone()),
            other => StoreError::WriteFailed(format!("the commit of a batch of creates failed: {other}")),
        }
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// Every SQLite connection's settings: the pool's and the create writer's.
pub(crate) const PRAGMAS: &[&str] = &[
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    // A write waits up to 30 s for another connection's.
    "PRAGMA busy_timeout=30000",
    "PRAGMA foreign_keys=ON",
    // 8 MiB of page cache per connection (the default is 2): the indexes new tasks go into stay in memory
    // instead of being read back from the file.
    "PRAGMA cache_size=-8192",
    // Checkpoint every 8,000 WAL pages (32 MiB; the default is 1,000): a page written by many commits in a
    // row is copied into the database once, not each time.
    "PRAGMA wal_autocheckpoint=8000",
    // Statement journals (kept while a multi-row INSERT runs, to undo it alone if it fails) in memory rather
    // than in a temporary file written and closed for every batch of creates; the database and its WAL are
    // untouched by this.
    "PRAGMA temp_store=MEMORY",
];

/// The store.
#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    dialect: Dialect,
    writer: tokio::sync::mpsc::Sender<Job>,
    /// SQLite's write transactions take turns here (see [`Store::write_turn`]); `None` on PostgreSQL.
    turns: Option<WriteTurns>,
    /// SQLite's reader for the control loop's light reads (`sqlite_reader`); `None` on PostgreSQL.
    reader: Option<Arc<sqlite_reader::Reader>>,
    /// SQLite's index of idempotency keys (`keys`); `None` on PostgreSQL, whose table has a unique index.
    keys: Option<Arc<keys::KeyIndex>>,
    /// Whether the last write succeeded (`health`).
    health: Arc<health::WriteHealth>,
    /// What the check of the database's files found, when it was opened anyway.
    damage: Option<Arc<str>>,
    /// The leader's token its status changes carry (`lease`); `None`: unfenced (the API's writes).
    fence: Option<lease::Fence>,
}

/// Choices for opening a database ([`Store::connect_with`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Open {
    /// Open a SQLite database even when the check of its files finds damage: its WAL holds frames SQLite
    /// would drop (`wal_check`), or `PRAGMA quick_check` finds its pages inconsistent. Without it such a
    /// database is refused with [`StoreError::Damaged`], before anything writes to it. With it, the WAL is
    /// first copied aside (`PATH-wal.damaged-MILLIS`, for whoever tries to recover from it) and SQLite
    /// drops what it cannot replay; `PRAGMA quick_check` is not run.
    pub accept_damage: bool,
}

/// What to do about a damaged database, for the error that refuses it.
const DAMAGE_ADVICE: &str = "Stop anything else that uses it, keep a copy of its files (the database, \
    PATH-wal and PATH-shm) and restore the database from a backup; or, to start on what SQLite can still \
    read and lose the rest, start anyway (`trainyard up --accept-store-damage`, which copies the WAL aside \
    first)";

/// Checks a SQLite database's WAL before anything opens the database ([`wal_check`]): `Ok(None)` when it
/// is sound or missing, `Ok(Some(finding))` when damage was found and accepted (the WAL copied aside),
/// else [`StoreError::Damaged`].
async fn check_files(path: &std::path::Path, open: Open) -> Result<Option<Arc<str>>> {
    let finding = match wal_check::check(path) {
        Ok(()) => return Ok(None),
        // Read again after a moment: another process writing the database may have restarted its WAL while
        // it was being read. Damage stays; a race does not.
        Err(_) => {
            tokio::time::sleep(Duration::from_millis(100)).await;
            match wal_check::check(path) {
                Ok(()) => return Ok(None),
                Err(finding) => finding,
            }
        }
    };
    let wal = wal_check::wal_path(path);
    let what =
        format!("the store's database {} is damaged: its WAL ({}): {finding}", path.display(), wal.display());
    if !open.accept_damage {
        return Err(StoreError::Damaged(format!(
            "{what}. {}",
            DAMAGE_ADVICE.replace("PATH", &path.display().to_string())
        )));
    }
    let millis =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let mut aside = wal.clone().into_os_string();
    aside.push(format!(".damaged-{millis}"));
    std::fs::copy(&wal, &aside).map_err(|e| {
        StoreError::Damaged(format!(
            "{what}; the WAL could not be copied aside to {}: {e}",
            std::path::Path::new(&aside).display()
        ))
    })?;
    Ok(Some(
        format!("{what}; opened anyway, the WAL copied to {}", std::path::Path::new(&aside).display()).into(),
    ))
}

/// `PRAGMA quick_check` of a SQLite database, just opened (its WAL replayed): the structure of every page,
/// in a read of the whole file.
async fn quick_check(pool: &AnyPool, path: &std::path::Path) -> Result<()> {
    use sqlx::Row;
    let path = path.display().to_string();
    let rows = match sqlx::query("PRAGMA quick_check(20)").fetch_all(pool).await {
        Ok(rows) => rows,
        Err(e) => {
            return Err(StoreError::Damaged(format!(
                "the store's database {path} could not be checked (PRAGMA quick_check: {e}). {}",
                DAMAGE_ADVICE.replace("PATH", &path)
            )));
        }
    };
    let said: Vec<String> =
        rows.iter().map(|r| r.try_get::<String, _>(0)).collect::<std::result::Result<_, _>>()?;
    if said == ["ok"] {
        return Ok(());
    }
    Err(StoreError::Damaged(format!(
        "the store's database {path} is damaged: PRAGMA quick_check says: {}. {}",
        said.join("; "),
        DAMAGE_ADVICE.replace("PATH", &path)
    )))
}

/// The FIFO queue for SQLite's one write lock, shared by the create writer and every other write of this
/// process.
pub(crate) type WriteTurns = Arc<tokio::sync::Mutex<()>>;

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").field("dialect", &self.dialect).finish()
    }
}

impl Store {
    /// Opens `sqlite://PATH` (created if missing) or `postgres://...`, and brings the schema up to date.
    /// A SQLite database whose files are damaged ([`Open::accept_damage`]) is refused.
    pub async fn connect(url: &str) -> Result<Store> {
        Store::connect_with(url, Open::default()).await
    }

    /// [`Store::connect`], with choices for opening a SQLite database.
    pub async fn connect_with(url: &str, open: Open) -> Result<Store> {
        sqlx::any::install_default_drivers();
        let dialect = if url.starts_with("sqlite:") {
            Dialect::Sqlite
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Dialect::Postgres
        } else {
            return Err(StoreError::BadUrl(url.to_owned()));
        };
        // Every connection (the pool's five and the create writer's) must open the same database: a file.
        // An in-memory one would be a database per connection, and creates would vanish into the writer's.
        if dialect == Dialect::Sqlite && (url.contains(":memory:") || url.contains("mode=memory")) {
            return Err(StoreError::BadUrl(url.to_owned()));
        }
        let sqlite_path = match dialect {
            Dialect::Sqlite => {
                Some(url.parse::<sqlx::sqlite::SqliteConnectOptions>()?.get_filename().to_owned())
            }
            Dialect::Postgres => None,
        };
        // Before anything opens the database, and so replays its WAL (`wal_check`).
        let damage = match &sqlite_path {
            Some(path) => check_files(path, open).await?,
            None => None,
        };
        let options = AnyPoolOptions::new().acquire_timeout(Duration::from_secs(30));
        let pool = match dialect {
            Dialect::Sqlite => {
                let url = if url.contains('?') { url.to_owned() } else { format!("{url}?mode=rwc") };
                options
                    // SQLite has one writer; more connections only queue on its lock, and readers need no
                    // more than the cores they run on. The create writer has a connection of its own.
                    .max_connections(5)
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            for pragma in PRAGMAS {
                                sqlx::query(pragma).execute(&mut *conn).await?;
                            }
                            Ok(())
                        })
                    })
                    .connect(&url)
                    .await?
            }
            Dialect::Postgres => options.max_connections(32).connect(url).await?,
        };
        if let Some(path) = sqlite_path.as_deref()
            && !open.accept_damage
        {
            quick_check(&pool, path).await?;
        }
        schema::migrate(&pool, dialect).await?;
        let (writer_tx, jobs) = tokio::sync::mpsc::channel(4 * GROUP_COMMIT_MAX);
        let health = Arc::new(health::WriteHealth::default());
        let (turns, reader, keys) = match dialect {
            Dialect::Sqlite => {
                let turns = WriteTurns::default();
                let options: sqlx::sqlite::SqliteConnectOptions = url.parse()?;
                let path = options.get_filename().to_owned();
                let keys = Arc::new(keys::KeyIndex::default());
                sqlite_writer::spawn(path.clone(), jobs, turns.clone(), keys.clone(), health.clone())
                    .map_err(sqlx::Error::Io)?;
                (Some(turns), Some(sqlite_reader::Reader::new(path)), Some(keys))
            }
            Dialect::Postgres => {
                tokio::spawn(writer(pool.clone(), dialect, jobs, health.clone()));
                (None, None, None)
            }
        };
        Ok(Store { pool, dialect, writer: writer_tx, turns, reader, keys, health, damage, fence: None })
    }

    /// What the check of a SQLite database's files found when [`Open::accept_damage`] opened it anyway.
    pub fn opened_despite(&self) -> Option<&str> {
        self.damage.as_deref()
    }

    /// Waits for this process's turn to write, on SQLite (held until dropped; nothing on PostgreSQL).
    ///
    /// SQLite lets one connection write at a time, and one that finds the lock taken polls for it, asleep
    /// for up to 100 ms between tries. Under a stream of creates the create writer takes the lock again the
    /// moment it commits, so a poller could wait seconds (the control loop's admissions did). Taken in
    /// turns, in order of arrival, a write waits at most for the batch being written.
    pub(crate) async fn write_turn(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match &self.turns {
            Some(turns) => Some(turns.lock().await),
            None => None,
        }
    }

    /// Runs one write on a pool connection, in this process's turn ([`Store::write_turn`]), and records its
    /// outcome for [`Store::write_health`]. The connection goes back to the pool only if the write succeeded
    /// or was refused for what it asked (a conflict, a constraint); after a database failure, or when the
    /// write is dropped half-way, it is closed, which ends any transaction it had open. Every write through
    /// the pool goes through here: no transaction outlives its error.
    pub(crate) async fn write<T>(
        &self,
        body: impl AsyncFnOnce(&mut sqlx::AnyConnection) -> Result<T>,
    ) -> Result<T> {
        let _turn = self.write_turn().await;
        let r = match self.pool.acquire().await {
            Ok(conn) => {
                let mut lent = health::Lent::new(conn);
                let r = body(lent.conn()).await;
                if !r.as_ref().is_err_and(health::may_leave_a_transaction) {
                    lent.give_back();
                }
                r
            }
            Err(e) => Err(e.into()),
        };
        self.health.note(&r);
        r
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }
}
