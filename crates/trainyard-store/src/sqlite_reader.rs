//! SQLite's reader for the control loop's light reads (every active task's version, the rows changed since a
//! time) and for idempotency keys (`keys.rs`): a few connections of its own, each query run whole on a
//! blocking thread.
//!
//! Through the pool, SQLite's driver hands a query's rows over one at a time from its worker thread, each
//! hand-over a wake-up, and converts every value on the way. The loop's look-back reads thousands of rows
//! a tick under a stream of creates (every create is a changed row), and those hand-overs were most of the
//! tick's sync (`tick-bench --rate 10000`: 20-35 ms of it a tick through the pool, 4-5 ms here). Here the
//! rows are read where the query runs and come back as one vector.

use crate::group_commit::Value;
use crate::model::TaskVersion;
use crate::rows::status_of;
use crate::sqlite_writer::{bind, close, open};
use crate::{Result, StoreError};
use rusqlite::Connection;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Idle connections kept for the next read; a read that finds none opens one.
const KEEP: usize = 2;

/// SQLite's reader (see the file's header).
#[derive(Debug)]
pub(crate) struct Reader {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl Reader {
    pub(crate) fn new(path: PathBuf) -> Arc<Reader> {
        Arc::new(Reader { path, idle: Mutex::new(Vec::new()) })
    }

    /// The versions of the tasks `sql` selects (`id, created_at_ms, version, status, deleted`, in that
    /// order), with `params` bound in order.
    pub(crate) async fn versions(
        self: &Arc<Self>,
        sql: String,
        params: Vec<Value<'static>>,
    ) -> Result<Vec<TaskVersion>> {
        self.run(move |conn| read_versions(conn, &sql, &params)).await
    }

    /// Runs `read` on one of the reader's connections, on a blocking thread.
    pub(crate) async fn run<T: Send + 'static>(
        self: &Arc<Self>,
        read: impl FnOnce(&Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            let conn = match me.idle.lock().unwrap_or_else(|e| e.into_inner()).pop() {
                Some(c) => c,
                None => open(&me.path)?,
            };
            let read = read(&conn);
            // A connection a read failed on is not kept, nor one a read left inside a transaction (none
            // begins one; one left open would pin the WAL at its snapshot): closed, which ends it.
            if read.is_ok() && conn.is_autocommit() {
                let mut idle = me.idle.lock().unwrap_or_else(|e| e.into_inner());
                if idle.len() < KEEP {
                    idle.push(conn);
                }
            } else {
                close(conn);
            }
            read
        })
        .await
        .map_err(|e| StoreError::Corrupt(format!("a read stopped: {e}")))?
    }
}

fn read_versions(conn: &Connection, sql: &str, params: &[Value<'_>]) -> Result<Vec<TaskVersion>> {
    let mut statement = conn.prepare_cached(sql)?;
    bind(&mut statement, params)?;
    let mut rows = statement.raw_query();
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        let status = r.get_ref(3)?.as_str().map_err(|e| StoreError::Corrupt(format!("task status: {e}")))?;
        out.push(TaskVersion {
            id: r.get(0)?,
            created_at_ms: r.get(1)?,
            version: r.get(2)?,
            status: status_of(status)?,
            deleted: r.get::<_, i64>(4)? != 0,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_core::lifecycle::Status;

    /// Reads at once each get the whole answer; no more than [`KEEP`] connections stay open after them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_at_once_each_get_the_whole_answer_and_few_connections_stay() {
        let dir = std::env::temp_dir().join(format!("trainyard-reader-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE tasks (id TEXT, created_at_ms INTEGER, version INTEGER, status TEXT, deleted INTEGER);",
        )
        .unwrap();
        for i in 0..2_000 {
            let status = if i % 2 == 0 { "Queued" } else { "Running" };
            conn.execute("INSERT INTO tasks VALUES (?1, ?2, 1, ?3, 0)", (format!("t{i:05}"), i, status))
                .unwrap();
        }
        drop(conn);
        let reader = Reader::new(path);
        let reads: Vec<_> = (0..8)
            .map(|i| {
                let reader = reader.clone();
                tokio::spawn(async move {
                    let sql = "SELECT id, created_at_ms, version, status, deleted FROM tasks \
                               WHERE status = $1 AND created_at_ms >= $2 ORDER BY id";
                    let status = if i % 2 == 0 { "Queued" } else { "Running" };
                    (
                        i,
                        reader
                            .versions(sql.into(), vec![Value::Text(status), Value::Int(1_000)])
                            .await
                            .unwrap(),
                    )
                })
            })
            .collect();
        for r in reads {
            let (i, versions) = r.await.unwrap();
            assert_eq!(versions.len(), 500, "read {i}");
            let want = if i % 2 == 0 { Status::Queued } else { Status::Running };
            assert!(
                versions.iter().all(|v| v.status == want && v.created_at_ms >= 1_000 && !v.deleted),
                "read {i}"
            );
        }
        assert!(reader.idle.lock().unwrap().len() <= KEEP);
        // A status the store does not know is an error, not a guess.
        let conn = Connection::open(dir.join("t.db")).unwrap();
        conn.execute("INSERT INTO tasks VALUES ('bad', 5000, 1, 'Sleeping', 0)", ()).unwrap();
        let bad = reader
            .versions("SELECT id, created_at_ms, version, status, deleted FROM tasks".into(), vec![])
            .await;
        assert!(matches!(bad, Err(StoreError::Corrupt(_))), "{bad:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
