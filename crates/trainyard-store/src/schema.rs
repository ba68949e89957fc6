//! Schema migrations, applied in order at start, each once, each in a transaction. A migration is never
//! edited after release; a change is a new one.

use crate::{Dialect, Result};
use sqlx::{AnyPool, Row};

/// `(version, statements)`. `{ID}` is the dialect's auto-incrementing primary key; a statement that starts
/// with [`SQLITE_ONLY`] runs on SQLite alone.
const MIGRATIONS: &[(i64, &[&str])] = &[
    (
        1,
        &[
            "CREATE TABLE tasks (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            owner TEXT NOT NULL,
            project_group TEXT NOT NULL,
            task_type TEXT NOT NULL,
            status TEXT NOT NULL,
            public BIGINT NOT NULL,
            labels TEXT NOT NULL,
            spec TEXT NOT NULL,
            attempt BIGINT NOT NULL,
            version BIGINT NOT NULL,
            created_at_ms BIGINT NOT NULL,
            updated_at_ms BIGINT NOT NULL,
            deleted BIGINT NOT NULL
        )",
            "CREATE INDEX tasks_by_time ON tasks (created_at_ms DESC, id DESC)",
            "CREATE INDEX tasks_by_owner ON tasks (owner, created_at_ms DESC)",
            "CREATE INDEX tasks_by_group ON tasks (project_group, created_at_ms DESC)",
            "CREATE INDEX tasks_by_status ON tasks (status, created_at_ms DESC)",
            "CREATE TABLE task_labels (
            task_id TEXT NOT NULL REFERENCES tasks (id),
            key TEXT NOT NULL,
            value TEXT NOT NULL,
            PRIMARY KEY (task_id, key)
        )",
            "CREATE INDEX task_labels_by_pair ON task_labels (key, value)",
            "CREATE TABLE task_shares (
            task_id TEXT NOT NULL REFERENCES tasks (id),
            user_name TEXT NOT NULL,
            operate BIGINT NOT NULL,
            PRIMARY KEY (task_id, user_name)
        )",
            "CREATE TABLE idempotency (
            owner TEXT NOT NULL,
            key TEXT NOT NULL,
            body_hash TEXT NOT NULL,
            task_id TEXT NOT NULL,
            created_at_ms BIGINT NOT NULL,
            PRIMARY KEY (owner, key)
        )",
            "CREATE TABLE task_events (
            seq {ID},
            task_id TEXT NOT NULL REFERENCES tasks (id),
            attempt BIGINT NOT NULL,
            at_ms BIGINT NOT NULL,
            reason TEXT NOT NULL,
            message TEXT NOT NULL
        )",
            "CREATE INDEX task_events_by_task ON task_events (task_id, seq)",
        ],
    ),
    (
        2,
        &[
            // Where the current attempt's replicas run (JSON), for rebuilding the scheduler's view at start.
            "ALTER TABLE tasks ADD COLUMN placement TEXT NOT NULL DEFAULT ''",
            // Automatic resubmissions spent (preemption requeues do not count).
            "ALTER TABLE tasks ADD COLUMN retries BIGINT NOT NULL DEFAULT 0",
        ],
    ),
    (
        3,
        &[
            "CREATE TABLE users (
                name TEXT PRIMARY KEY,
                role TEXT NOT NULL,
                groups TEXT NOT NULL,
                created_at_ms BIGINT NOT NULL
            )",
            // Tokens are stored as SHA-256 hashes: the token itself is shown once and never kept.
            "CREATE TABLE tokens (
                hash TEXT PRIMARY KEY,
                user_name TEXT NOT NULL REFERENCES users (name),
                label TEXT NOT NULL,
                created_at_ms BIGINT NOT NULL
            )",
        ],
    ),
    (
        4,
        &[
            // Filtered lists page by (created_at_ms, id) like the unfiltered one: the indexes carry id too, so
            // a page is read in index order and never sorted.
            "DROP INDEX tasks_by_owner",
            "DROP INDEX tasks_by_group",
            "DROP INDEX tasks_by_status",
            "CREATE INDEX tasks_by_owner ON tasks (owner, created_at_ms DESC, id DESC)",
            "CREATE INDEX tasks_by_group ON tasks (project_group, created_at_ms DESC, id DESC)",
            "CREATE INDEX tasks_by_status ON tasks (status, created_at_ms DESC, id DESC)",
        ],
    ),
    (
        5,
        &[
            // Alarm deliveries: one row per (task, attempt, event, receiver), which is also the delivery log.
            "CREATE TABLE alarm_deliveries (
                id {ID},
                task_id TEXT NOT NULL,
                attempt BIGINT NOT NULL,
                event TEXT NOT NULL,
                url TEXT NOT NULL,
                payload TEXT NOT NULL,
                state TEXT NOT NULL,
                tries BIGINT NOT NULL,
                next_at_ms BIGINT NOT NULL,
                last_error TEXT NOT NULL,
                created_at_ms BIGINT NOT NULL,
                done_at_ms BIGINT NOT NULL
            )",
            "CREATE UNIQUE INDEX alarm_once ON alarm_deliveries (task_id, attempt, event, url)",
            "CREATE INDEX alarm_due ON alarm_deliveries (state, next_at_ms)",
        ],
    ),
    (
        6,
        &[
            // Named documents the server keeps (the catalog, as YAML).
            "CREATE TABLE settings (name TEXT PRIMARY KEY, value TEXT NOT NULL, updated_at_ms BIGINT NOT NULL)",
        ],
    ),
    (
        7,
        &[
            // TaskEnv: a user's persistent env vars, added to each of their tasks unless the task sets the name.
            "CREATE TABLE task_env (
                user_name TEXT NOT NULL,
                name TEXT NOT NULL,
                value TEXT NOT NULL,
                hidden BIGINT NOT NULL,
                PRIMARY KEY (user_name, name)
            )",
        ],
    ),
    (
        8,
        &[
            // The control loop reads what changed since its last look.
            "CREATE INDEX tasks_by_update ON tasks (updated_at_ms)",
        ],
    ),
    (
        9,
        &[
            // The newest-first index also holds what a list filters on before it reads a row (deleted, the
            // name a search looks into), so a search for a rare part of a name reads index entries, not
            // whole rows with their specs.
            "DROP INDEX tasks_by_time",
            "CREATE INDEX tasks_by_time ON tasks (created_at_ms DESC, id DESC, deleted, name)",
        ],
    ),
    (
        10,
        &[
            // Nodes a task's next attempts leave out (node replacement), kept across restarts.
            "CREATE TABLE task_avoided_nodes (
            task_id TEXT NOT NULL REFERENCES tasks (id),
            node TEXT NOT NULL,
            at_ms BIGINT NOT NULL,
            PRIMARY KEY (task_id, node)
        )",
        ],
    ),
    (
        11,
        &[
            // A disabled user's tokens are refused (the user and their tasks stay).
            "ALTER TABLE users ADD COLUMN disabled BIGINT NOT NULL DEFAULT 0",
        ],
    ),
    (
        12,
        &[
            // When a token was last used (0: never, or before this column), to the minute.
            "ALTER TABLE tokens ADD COLUMN last_used_at_ms BIGINT NOT NULL DEFAULT 0",
            // A user's queued tasks, for the per-user cap checked at every create: only queued tasks are in
            // it, so it stays small, and a count reads at most the cap's worth of its entries (status and
            // deleted are columns too, so SQLite counts from the index alone).
            "CREATE INDEX tasks_queued_by_owner ON tasks (owner, status, deleted) WHERE status = 'Queued' AND deleted = 0",
        ],
    ),
    (
        13,
        &[
            // What a task asks for, summed at create (JSON, '' for tasks stored before), and whether it asks
            // for GPUs ('gpu', 'cpu', ''): a list shows and filters on them without reading specs.
            "ALTER TABLE tasks ADD COLUMN demand TEXT NOT NULL DEFAULT ''",
            "ALTER TABLE tasks ADD COLUMN accelerator TEXT NOT NULL DEFAULT ''",
            "CREATE INDEX tasks_by_accelerator ON tasks (accelerator, created_at_ms DESC, id DESC)",
            // When a task entered its status, and when its attempt entered Running (0: it has not), for the
            // durations a list shows. Before this, the last change is the best known start of either.
            "ALTER TABLE tasks ADD COLUMN status_since_ms BIGINT NOT NULL DEFAULT 0",
            "ALTER TABLE tasks ADD COLUMN run_started_at_ms BIGINT NOT NULL DEFAULT 0",
            "UPDATE tasks SET status_since_ms = updated_at_ms",
            "UPDATE tasks SET run_started_at_ms = updated_at_ms WHERE status = 'Running'",
        ],
    ),
    (
        14,
        &[
            // The control loop's reads of versions (what changed lately; every active task's, now and then)
            // answered from the index alone: under a stream of creates the look-back holds thousands of
            // rows, and reading each from its table row (a page of its own, specs are ~1 KB) cost ~14 µs.
            "DROP INDEX tasks_by_update",
            "CREATE INDEX tasks_by_update ON tasks (updated_at_ms, created_at_ms, id, version, status, deleted)",
            "DROP INDEX tasks_by_status",
            "CREATE INDEX tasks_by_status ON tasks (status, created_at_ms DESC, id DESC, version, deleted)",
        ],
    ),
    (
        15,
        &[
            // The indexes by creation in ascending order. Both databases read an index backwards as readily
            // as forwards, so every list (newest or oldest first) is still read in index order; but a new
            // task's entry now goes at the end of its range instead of at its start, and SQLite splits a
            // page filled at its end more cheaply than one filled at its start (fewer neighbouring pages
            // rewritten). In a SQLite test of the tasks table with these indexes, 20 inserts per commit: 30
            // pages written per commit instead of 38.
            "DROP INDEX tasks_by_time",
            "CREATE INDEX tasks_by_time ON tasks (created_at_ms, id, deleted, name)",
            "DROP INDEX tasks_by_owner",
            "CREATE INDEX tasks_by_owner ON tasks (owner, created_at_ms, id)",
            "DROP INDEX tasks_by_group",
            "CREATE INDEX tasks_by_group ON tasks (project_group, created_at_ms, id)",
            "DROP INDEX tasks_by_status",
            "CREATE INDEX tasks_by_status ON tasks (status, created_at_ms, id, version, deleted)",
            "DROP INDEX tasks_by_accelerator",
            "CREATE INDEX tasks_by_accelerator ON tasks (accelerator, created_at_ms, id)",
        ],
    ),
    (
        16,
        &[
            // SQLite: idempotency keys in order of arrival, with no index on (owner, key); the store keeps
            // that index in memory (`keys.rs`). Random keys went into the B-tree index at random places, a
            // page of it written per create: a third of the WAL's frames. PostgreSQL keeps its unique
            // index, since several servers may write to it.
            "-- sqlite only\n\
             CREATE TABLE idempotency_by_arrival (
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                owner TEXT NOT NULL,
                key TEXT NOT NULL,
                body_hash TEXT NOT NULL,
                task_id TEXT NOT NULL,
                created_at_ms BIGINT NOT NULL
            )",
            "-- sqlite only\n\
             INSERT INTO idempotency_by_arrival (owner, key, body_hash, task_id, created_at_ms) \
             SELECT owner, key, body_hash, task_id, created_at_ms FROM idempotency ORDER BY rowid",
            "-- sqlite only\nDROP TABLE idempotency",
            "-- sqlite only\nALTER TABLE idempotency_by_arrival RENAME TO idempotency",
        ],
    ),
    (
        17,
        &[
            // Whether a disabled or deleted user's queued work is held (not admitted until they are enabled
            // again), and when the user was deleted (0: not deleted). A deleted user's row stays as the
            // record of the name: names are not reused (their tasks, shares and events name them).
            "ALTER TABLE users ADD COLUMN hold_work BIGINT NOT NULL DEFAULT 0",
            "ALTER TABLE users ADD COLUMN deleted_at_ms BIGINT NOT NULL DEFAULT 0",
            // Users disabled before this get what disabling does by default now: their queued work held.
            "UPDATE users SET hold_work = 1 WHERE disabled <> 0",
        ],
    ),
    (
        18,
        &[
            // Who leads the servers on this store (runs the control loop), and the fencing token of that term:
            // one row, taken when free or expired (the database's clock), renewed by its holder (`lease`).
            "CREATE TABLE leader_lease (
            id BIGINT PRIMARY KEY,
            holder TEXT NOT NULL,
            token BIGINT NOT NULL,
            acquired_at_ms BIGINT NOT NULL,
            renewed_at_ms BIGINT NOT NULL,
            expires_at_ms BIGINT NOT NULL
        )",
            "INSERT INTO leader_lease (id, holder, token, acquired_at_ms, renewed_at_ms, expires_at_ms) \
             VALUES (1, '', 0, 0, 0, 0)",
            // Every server on this store, as it last said (`GET /api/v1/server`).
            "CREATE TABLE servers (
            id TEXT PRIMARY KEY,
            address TEXT NOT NULL,
            host TEXT NOT NULL,
            backend TEXT NOT NULL,
            version TEXT NOT NULL,
            started_at_ms BIGINT NOT NULL,
            seen_at_ms BIGINT NOT NULL
        )",
        ],
    ),
    (
        19,
        &[
            // What a backend keeps of an attempt's replicas where every server on the store reads it (`kept`):
            // each replica with its role, whether its log is complete, its follower's cursor and the bytes kept;
            // its log in chunks of whole lines by byte range; its metrics samples.
            "CREATE TABLE kept_replicas (
            task_id TEXT NOT NULL,
            attempt BIGINT NOT NULL,
            replica TEXT NOT NULL,
            role TEXT NOT NULL,
            ended BIGINT NOT NULL,
            cursor TEXT NOT NULL,
            log_bytes BIGINT NOT NULL,
            metrics_bytes BIGINT NOT NULL,
            PRIMARY KEY (task_id, attempt, replica)
        )",
            "CREATE TABLE kept_log (
            task_id TEXT NOT NULL,
            attempt BIGINT NOT NULL,
            replica TEXT NOT NULL,
            start_byte BIGINT NOT NULL,
            end_byte BIGINT NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (task_id, attempt, replica, start_byte)
        )",
            "CREATE TABLE kept_metrics (
            id {ID},
            task_id TEXT NOT NULL,
            attempt BIGINT NOT NULL,
            replica TEXT NOT NULL,
            at_ms BIGINT NOT NULL,
            sample TEXT NOT NULL
        )",
            "CREATE INDEX kept_metrics_by_attempt ON kept_metrics (task_id, attempt, at_ms)",
        ],
    ),
];

/// What starts a migration's statement that runs on SQLite alone.
const SQLITE_ONLY: &str = "-- sqlite only\n";

pub(crate) async fn migrate(pool: &AnyPool, dialect: Dialect) -> Result<()> {
    migrate_up_to(pool, dialect, i64::MAX).await
}

/// The migrations up to `last` (the schema an older version left, for tests of the ones after it).
async fn migrate_up_to(pool: &AnyPool, dialect: Dialect, last: i64) -> Result<()> {
    let id = match dialect {
        Dialect::Sqlite => "INTEGER PRIMARY KEY AUTOINCREMENT",
        Dialect::Postgres => "BIGSERIAL PRIMARY KEY",
    };
    sqlx::query("CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY)")
        .execute(pool)
        .await?;
    for (version, statements) in MIGRATIONS.iter().filter(|(v, _)| *v <= last) {
        let mut tx = pool.begin().await?;
        // Two servers starting at once: the second waits on the first's row, then sees it applied.
        let claimed =
            sqlx::query("INSERT INTO schema_migrations (version) VALUES ($1) ON CONFLICT DO NOTHING")
                .bind(*version)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        if claimed == 0 {
            tx.rollback().await?;
            continue;
        }
        for s in *statements {
            let s = match (s.strip_prefix(SQLITE_ONLY), dialect) {
                (Some(_), Dialect::Postgres) => continue,
                (Some(only), Dialect::Sqlite) => only,
                (None, _) => s,
            };
            sqlx::query(&s.replace("{ID}", id)).execute(&mut *tx).await?;
        }
        tx.commit().await?;
    }
    let applied: i64 =
        sqlx::query("SELECT COUNT(*) FROM schema_migrations").fetch_one(pool).await?.try_get(0)?;
    debug_assert!(last < i64::MAX || applied as usize >= MIGRATIONS.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Created, NewTask, Store};

    /// Keys stored before migration 16 (under the unique index) are kept, in their order, and still
    /// answer retries afterwards.
    #[tokio::test]
    async fn keys_stored_before_the_keys_left_their_index_still_answer() {
        sqlx::any::install_default_drivers();
        let dir = std::env::temp_dir().join(format!("trainyard-schema-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("old.db");
        let _ = std::fs::remove_file(&path);
        let url = format!("sqlite://{}?mode=rwc", path.display());
        let pool = sqlx::AnyPool::connect(&url).await.unwrap();
        migrate_up_to(&pool, Dialect::Sqlite, 15).await.unwrap();
        for i in 0..3 {
            sqlx::query(
                "INSERT INTO tasks (id, name, owner, project_group, task_type, status, public, labels, spec, \
                 attempt, version, created_at_ms, updated_at_ms, deleted) \
                 VALUES ($1, $2, 'alice', 'nlp', 'PyTorchJob', 'Queued', 0, '{}', '{}', 0, 1, 5, 5, 0)",
            )
            .bind(format!("t{i}"))
            .bind(format!("n{i}"))
            .execute(&pool)
            .await
            .unwrap();
            sqlx::query(
                "INSERT INTO idempotency (owner, key, body_hash, task_id, created_at_ms) \
                 VALUES ('alice', $1, 'h', $2, 5)",
            )
            .bind(format!("key-{}", 2 - i))
            .bind(format!("t{i}"))
            .execute(&pool)
            .await
            .unwrap();
        }
        pool.close().await;

        let store = Store::connect(&url).await.unwrap();
        let order: Vec<(i64, String)> = sqlx::query_as("SELECT seq, task_id FROM idempotency ORDER BY seq")
            .fetch_all(&store.pool)
            .await
            .unwrap();
        assert_eq!(order, [(1, "t0".into()), (2, "t1".into()), (3, "t2".into())], "in the order stored");
        for i in 0..3 {
            let retry = NewTask {
                id: format!("new{i}"),
                name: format!("new{i}"),
                owner: "alice".into(),
                project_group: "nlp".into(),
                task_type: "PyTorchJob".into(),
                status: trainyard_core::lifecycle::Status::Queued,
                public: false,
                labels: Default::default(),
                spec_json: "{}".into(),
                created_at_ms: 6,
                idempotency: Some((format!("key-{}", 2 - i), "h".into())),
                first_event: None,
                demand: None,
            };
            match store.create_task(&retry).await.unwrap() {
                Created::Existing(t) => assert_eq!(t.id, format!("t{i}")),
                c => panic!("{c:?}"),
            }
        }
        assert!(store.idempotency_key_used("alice", "key-0").await.unwrap());
        assert!(!store.idempotency_key_used("alice", "key-3").await.unwrap());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
