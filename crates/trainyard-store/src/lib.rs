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
mod keys;
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

pub use model::{
    Accelerator, AlarmDelivery, Created, Event, MAX_PAGE, NewTask, Page, ReplicaShape, SortOrder,
    TOKEN_ID_LEN, TOKEN_USE_RESOLUTION_MS, TaskDemand, TaskEnvVar, TaskFilter, TaskRecord, TaskVersion,
    TokenInfo, Transition, User, Viewer,
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
    #[error("task {0} does not exist")]
    NotFound(String),
    #[error("a task named {0} already exists")]
    NameTaken(String),
    #[error("unsupported database URL {0:?}: use sqlite://PATH (a file) or postgres://...")]
    BadUrl(String),
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    /// From SQLite's create writer, which has a connection of its own (`sqlite_writer`).
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
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
    pub async fn connect(url: &str) -> Result<Store> {
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
        schema::migrate(&pool, dialect).await?;
        let (writer_tx, jobs) = tokio::sync::mpsc::channel(4 * GROUP_COMMIT_MAX);
        let (turns, reader, keys) = match dialect {
            Dialect::Sqlite => {
                let turns = WriteTurns::default();
                let options: sqlx::sqlite::SqliteConnectOptions = url.parse()?;
                let path = options.get_filename().to_owned();
                let keys = Arc::new(keys::KeyIndex::default());
                sqlite_writer::spawn(path.clone(), jobs, turns.clone(), keys.clone())
                    .map_err(sqlx::Error::Io)?;
                (Some(turns), Some(sqlite_reader::Reader::new(path)), Some(keys))
            }
            Dialect::Postgres => {
                tokio::spawn(writer(pool.clone(), dialect, jobs));
                (None, None, None)
            }
        };
        Ok(Store { pool, dialect, writer: writer_tx, turns, reader, keys })
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

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }
}
