//! Group commit: concurrent creates are queued to one writer, which writes them in one transaction (as a few
//! multi-row INSERTs when it can, else one by one with savepoints) and answers every caller after the
//! commit, so an acknowledged create is durable.
//!
//! This file holds what both writers share (the queue, the statements, a batch's rows) and PostgreSQL's
//! writer, a task on the server's runtime; SQLite's runs on a thread of its own (`sqlite_writer.rs`).

use crate::create::{create_in, is_unique_violation, new_record};
use crate::health::WriteHealth;
use crate::model::{Created, NewTask};
use crate::rows::{TASK_COLUMNS, demand_columns};
use crate::{Dialect, Result, Store, StoreError};
use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyPool, Connection};
use std::sync::Arc;

impl Store {
    /// Creates a task (and its first event) durably. With an idempotency key: a retry with the same key and
    /// body returns the task the first call created; the same key with another body is refused.
    ///
    /// Creates are group-committed: concurrent calls are written by one writer in one transaction (each in its
    /// own savepoint, so one failure does not affect the others) and all acknowledged after its commit. A call
    /// returns only once its task is committed.
    pub async fn create_task(&self, t: &NewTask) -> Result<Created> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        if self.writer.send((t.clone(), reply)).await.is_err() {
            return Err(StoreError::WriteFailed("the store's create writer has stopped".into()));
        }
        let stopped = |_| StoreError::WriteFailed("the store's create writer has stopped".into());
        match answer.await.map_err(stopped)?? {
            Written::Created(c) => Ok(c),
            Written::KeyUsed { task_id } => match self.get_task(&task_id).await? {
                Some(task) => Ok(Created::Existing(task)),
                None => Err(StoreError::Corrupt(format!("idempotency key points at missing task {task_id}"))),
            },
        }
    }
}

/// What the writer did with one create.
#[derive(Debug)]
#[allow(clippy::large_enum_variant, reason = "moved once, through a channel; the large one is the usual one")]
pub(crate) enum Written {
    Created(Created),
    /// The idempotency key was used before, with the same body, for this task (read after the commit).
    KeyUsed {
        task_id: String,
    },
}

/// One queued create and where its answer goes.
pub(crate) type Job = (NewTask, tokio::sync::oneshot::Sender<Result<Written>>);

/// The most creates one group commit takes.
pub(crate) const GROUP_COMMIT_MAX: usize = 512;

/// Rows per multi-row INSERT at most: under SQLite's oldest bound of 999 parameters at 14 per task row.
const ROWS_PER_INSERT: usize = 64;

/// The tables a batch goes into, each with its multi-row INSERT.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Table {
    Idempotency,
    Tasks,
    Labels,
    Events,
}

impl Table {
    pub(crate) const ALL: [Table; 4] = [Table::Idempotency, Table::Tasks, Table::Labels, Table::Events];

    /// What comes before the rows, one row's `VALUES` group with `?` for each parameter, and what follows.
    fn shape(self, dialect: Dialect) -> (String, &'static str, &'static str) {
        match self {
            Table::Idempotency => (
                "INSERT INTO idempotency (owner, key, body_hash, task_id, created_at_ms) VALUES ".into(),
                "(?, ?, ?, ?, ?)",
                match dialect {
                    // A key used before is skipped, and counted out of the rows inserted.
                    Dialect::Postgres => " ON CONFLICT (owner, key) DO NOTHING",
                    // No index on the keys (`keys.rs`): the writer looks each up before it inserts.
                    Dialect::Sqlite => "",
                },
            ),
            // A new task: attempt 0, version 1, updated and in its status since it was created (the time is
            // bound three times), no placement, no retries, not run, not deleted.
            Table::Tasks => (
                format!("INSERT INTO tasks ({TASK_COLUMNS}, deleted) VALUES "),
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 1, ?, ?, '', 0, ?, ?, ?, 0, 0)",
                "",
            ),
            Table::Labels => {
                ("INSERT INTO task_labels (task_id, key, value) VALUES ".into(), "(?, ?, ?)", "")
            }
            Table::Events => (
                "INSERT INTO task_events (task_id, attempt, at_ms, reason, message) VALUES ".into(),
                "(?, 0, ?, ?, ?)",
                "",
            ),
        }
    }
}

/// The texts of the writer's multi-row INSERTs, made once. A batch is cut into chunks of the lengths in
/// [`CHUNK_LENGTHS`], so a few dozen texts cover every batch and each is prepared once per connection and
/// then found in its statement cache (which holds 100), where a text per batch length up to 64 would not
/// fit and be prepared again and again (the SQL compiler's cost grows with the rows). Lengths up to 16
/// are exact, as batches under load are mostly of a few dozen: on PostgreSQL each chunk is a round trip to
/// the server.
pub(crate) struct Statements {
    /// Per [`Undo`] and table, the text for `CHUNK_LENGTHS[i]` rows at `[i]`.
    texts: [Vec<Vec<String>>; 2],
}

/// What a row of a multi-row INSERT that fails (a taken name, say) undoes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Undo {
    /// The statement alone. SQLite does it by copying every page the statement is about to change (a
    /// statement journal, in memory here): for a batch's INSERT into the tasks table and its nine indexes,
    /// ~60 pages of 4 KiB, a tenth of the writer's time.
    Statement,
    /// The whole transaction (SQLite's `INSERT OR ROLLBACK`, which needs no statement journal; PostgreSQL
    /// aborts the transaction on any error anyway): for a whole batch, which is written again create by
    /// create in savepoints when any of it fails.
    Transaction,
}

/// The chunk lengths a batch is cut into, ascending; the last is [`ROWS_PER_INSERT`].
const CHUNK_LENGTHS: [usize; 18] =
    [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 32, ROWS_PER_INSERT];

impl Statements {
    pub(crate) fn new(dialect: Dialect) -> Self {
        let texts = [Undo::Statement, Undo::Transaction].map(|undo| {
            Table::ALL
                .iter()
                .map(|t| CHUNK_LENGTHS.iter().map(|n| Self::text(dialect, undo, *t, *n)).collect())
                .collect()
        });
        Statements { texts }
    }

    /// The INSERT of `rows` rows into `table`. SQLite gets anonymous `?` parameters, bound in order: with
    /// numbered ones its driver looks each number up in a list as long as the statement's parameters, which
    /// for 64 rows costs more than binding them. PostgreSQL numbers them `$1`, `$2`, ... in the same order.
    fn text(dialect: Dialect, undo: Undo, table: Table, rows: usize) -> String {
        let (head, row, tail) = table.shape(dialect);
        let head = match (dialect, undo) {
            (Dialect::Sqlite, Undo::Transaction) => {
                head.replacen("INSERT INTO", "INSERT OR ROLLBACK INTO", 1)
            }
            _ => head,
        };
        let mut sql = String::with_capacity(head.len() + rows * (row.len() * 2 + 2) + tail.len());
        sql.push_str(&head);
        let mut n = 0;
        for i in 0..rows {
            if i > 0 {
                sql.push_str(", ");
            }
            for c in row.chars() {
                match (c, dialect) {
                    ('?', Dialect::Postgres) => {
                        n += 1;
                        sql.push('$');
                        sql.push_str(&n.to_string());
                    }
                    _ => sql.push(c),
                }
            }
        }
        sql.push_str(tail);
        sql
    }

    /// The longest chunk to take from `rows` rows (at least one), and its INSERT into `table`.
    fn next_chunk(&self, undo: Undo, table: Table, rows: usize) -> (usize, &str) {
        let i = CHUNK_LENGTHS.iter().rposition(|n| *n <= rows).unwrap_or(0);
        (CHUNK_LENGTHS[i], &self.texts[undo as usize][table as usize][i])
    }

    /// `rows` cut into the longest chunks there are texts for (100 rows go as 64 + 32 + 4, 29 as 16 + 13),
    /// each with its INSERT into `table`: what both writers run.
    pub(crate) fn chunks<'s, 'r, T>(
        &'s self,
        undo: Undo,
        table: Table,
        rows: &'r [T],
    ) -> impl Iterator<Item = (&'s str, &'r [T])> {
        let mut rest = rows;
        std::iter::from_fn(move || {
            if rest.is_empty() {
                return None;
            }
            let (n, text) = self.next_chunk(undo, table, rest.len());
            let (chunk, after) = rest.split_at(n);
            rest = after;
            Some((text, chunk))
        })
    }
}

/// A value bound to a parameter, borrowed from the batch.
#[derive(Clone, Copy)]
pub(crate) enum Value<'a> {
    Text(&'a str),
    Int(i64),
}

/// Inserts `rows` (each one row's values, in its `VALUES` group's order) into `table`, chunk by chunk
/// ([`Statements::chunks`]); returns the rows inserted.
async fn insert_rows(
    conn: &mut sqlx::AnyConnection,
    statements: &Statements,
    table: Table,
    rows: &[Vec<Value<'_>>],
) -> std::result::Result<u64, sqlx::Error> {
    let mut inserted = 0;
    for (text, chunk) in statements.chunks(Undo::Statement, table, rows) {
        let mut q = sqlx::query(text);
        for v in chunk.iter().flatten() {
            q = match *v {
                Value::Text(s) => q.bind(s),
                Value::Int(i) => q.bind(i),
            };
        }
        inserted += q.execute(&mut *conn).await?.rows_affected();
    }
    Ok(inserted)
}

/// What a batch's rows hold beyond the jobs themselves: the labels as JSON and the demand columns.
pub(crate) struct Derived {
    labels_json: Vec<String>,
    demands: Vec<(String, &'static str)>,
}

impl Derived {
    pub(crate) fn of(batch: &[Job]) -> Result<Derived> {
        let labels_json = batch
            .iter()
            .map(|(t, _)| serde_json::to_string(&t.labels).map_err(|e| StoreError::Corrupt(e.to_string())))
            .collect::<Result<_>>()?;
        let demands = batch.iter().map(|(t, _)| demand_columns(t.demand.as_ref())).collect();
        Ok(Derived { labels_json, demands })
    }
}

/// A batch's rows, per table in [`Table::ALL`]'s order, each row its `VALUES` group's parameters in order.
pub(crate) fn batch_rows<'a>(batch: &'a [Job], derived: &'a Derived) -> [Vec<Vec<Value<'a>>>; 4] {
    let keyed: Vec<Vec<Value>> = batch
        .iter()
        .filter_map(|(t, _)| {
            let (key, hash) = t.idempotency.as_ref()?;
            Some(vec![
                Value::Text(&t.owner),
                Value::Text(key),
                Value::Text(hash),
                Value::Text(&t.id),
                Value::Int(t.created_at_ms),
            ])
        })
        .collect();
    let mut tasks = Vec::with_capacity(batch.len());
    let mut labels = Vec::new();
    let mut events = Vec::with_capacity(batch.len());
    for (((t, _), l), (demand, accelerator)) in batch.iter().zip(&derived.labels_json).zip(&derived.demands) {
        tasks.push(vec![
            Value::Text(&t.id),
            Value::Text(&t.name),
            Value::Text(&t.owner),
            Value::Text(&t.project_group),
            Value::Text(&t.task_type),
            Value::Text(t.status.as_str()),
            Value::Int(i64::from(t.public)),
            Value::Text(l),
            Value::Text(&t.spec_json),
            Value::Int(t.created_at_ms),
            Value::Int(t.created_at_ms),
            Value::Text(demand),
            Value::Text(accelerator),
            Value::Int(t.created_at_ms),
        ]);
        for (k, v) in &t.labels {
            labels.push(vec![Value::Text(&t.id), Value::Text(k), Value::Text(v)]);
        }
        if let Some((reason, message)) = &t.first_event {
            events.push(vec![
                Value::Text(&t.id),
                Value::Int(t.created_at_ms),
                Value::Text(reason.as_str()),
                Value::Text(message),
            ]);
        }
    }
    [keyed, tasks, labels, events]
}

/// The whole batch in a few multi-row statements. `Ok(false)` when it cannot be done that way (an
/// idempotency key already stored, or twice in the batch; a name taken): the caller rolls back.
async fn insert_many(conn: &mut sqlx::AnyConnection, statements: &Statements, batch: &[Job]) -> Result<bool> {
    let derived = Derived::of(batch)?;
    let [keyed, tasks, labels, events] = batch_rows(batch, &derived);
    if !keyed.is_empty() {
        let inserted = insert_rows(conn, statements, Table::Idempotency, &keyed).await?;
        if inserted != keyed.len() as u64 {
            return Ok(false);
        }
    }
    match insert_rows(conn, statements, Table::Tasks, &tasks).await {
        Err(e) if is_unique_violation(&e) => return Ok(false),
        other => {
            other?;
        }
    }
    if !labels.is_empty() {
        insert_rows(conn, statements, Table::Labels, &labels).await?;
    }
    if !events.is_empty() {
        insert_rows(conn, statements, Table::Events, &events).await?;
    }
    Ok(true)
}

/// One batch of creates in one transaction. Without savepoints it stops at the first failure and rolls
/// everything back (the caller retries with them).
async fn write_batch(
    conn: &mut sqlx::AnyConnection,
    statements: &Statements,
    batch: &[Job],
    savepoints: bool,
    results: &mut Vec<Result<Written>>,
) -> Result<()> {
    let mut tx = conn.begin().await?;
    if !savepoints {
        // The common case, a batch of new tasks with fresh keys and free names: a few multi-row statements
        // for the whole batch instead of a few per create. Anything else (a key seen before, a name taken)
        // rolls back here and takes the one-by-one path below, which answers each create on its own.
        if insert_many(&mut tx, statements, batch).await? {
            tx.commit().await?;
            results.extend(batch.iter().map(|(t, _)| Ok(Written::Created(Created::New(new_record(t))))));
            return Ok(());
        }
        tx.rollback().await?;
        tx = conn.begin().await?;
    }
    for (t, _) in batch {
        if savepoints {
            sqlx::query("SAVEPOINT one_create").execute(&mut *tx).await?;
        }
        let r = create_in(&mut tx, t).await.map(Written::Created);
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

/// Optimistic first: the whole batch in one transaction. If any create fails (a taken name, a reused key
/// with another body), the batch runs again with a savepoint around each create, so that one failure is
/// undone alone.
async fn write(
    conn: &mut sqlx::AnyConnection,
    statements: &Statements,
    batch: &[Job],
) -> Result<Vec<Result<Written>>> {
    let mut results: Vec<Result<Written>> = Vec::with_capacity(batch.len());
    write_batch(conn, statements, batch, false, &mut results).await?;
    if results.iter().any(|r| r.is_err()) {
        results.clear();
        write_batch(conn, statements, batch, true, &mut results).await?;
    }
    Ok(results)
}

/// The next batch: the create that woke the writer, then whatever else is queued, up to [`GROUP_COMMIT_MAX`].
pub(crate) fn fill(first: Job, jobs: &mut tokio::sync::mpsc::Receiver<Job>, batch: &mut Vec<Job>) {
    batch.push(first);
    while batch.len() < GROUP_COMMIT_MAX {
        match jobs.try_recv() {
            Ok(j) => batch.push(j),
            Err(_) => break,
        }
    }
}

/// Answers every create of a batch: each its own result, or all the batch's failure (nothing of it was
/// committed, and nothing acknowledged).
pub(crate) fn answer(batch: &mut Vec<Job>, written: Result<Vec<Result<Written>>>, health: &WriteHealth) {
    health.note(&written);
    match written {
        Ok(results) => {
            for ((_, reply), r) in batch.drain(..).zip(results) {
                let _ = reply.send(r);
            }
        }
        Err(e) => {
            for (_, reply) in batch.drain(..) {
                let _ = reply.send(Err(e.for_each_of_a_batch()));
            }
        }
    }
}

/// PostgreSQL's writer: queued creates in batches, one transaction, one commit, then every answer.
///
/// The writer keeps one connection of the pool for itself while it works: its statement cache keeps the
/// INSERTs prepared, and (on SQLite) its page cache keeps the pages new tasks go into, which a connection
/// taken in turn with readers would have to read again after another connection's commit. A connection
/// that fails is closed and another taken from the pool.
pub(crate) async fn writer(
    pool: AnyPool,
    dialect: Dialect,
    mut jobs: tokio::sync::mpsc::Receiver<Job>,
    health: Arc<WriteHealth>,
) {
    let statements = Statements::new(dialect);
    let mut held: Option<PoolConnection<Any>> = None;
    let mut batch: Vec<Job> = Vec::with_capacity(GROUP_COMMIT_MAX);
    while let Some(first) = jobs.recv().await {
        fill(first, &mut jobs, &mut batch);
        // The held connection is checked as the pool checks one before handing it out, so a connection
        // lost meanwhile (a PostgreSQL restart) costs no batch: another is taken instead.
        let conn = match held.take() {
            Some(mut c) => match c.ping().await {
                Ok(()) => Ok(c),
                Err(_) => {
                    c.close_on_drop();
                    drop(c);
                    pool.acquire().await.map_err(StoreError::from)
                }
            },
            None => pool.acquire().await.map_err(StoreError::from),
        };
        let written = match conn {
            Ok(mut c) => {
                let r = write(&mut c, &statements, &batch).await;
                match r {
                    Ok(_) => held = Some(c),
                    // A connection a batch failed on is not trusted with the next one.
                    Err(_) => c.close_on_drop(),
                }
                r
            }
            Err(e) => Err(e),
        };
        answer(&mut batch, written, &health);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_batch_length_with_few_statements() {
        let statements = Statements::new(Dialect::Sqlite);
        let chunks = |rows: usize| {
            let all = vec![(); rows];
            statements.chunks(Undo::Statement, Table::Tasks, &all).map(|(_, c)| c.len()).collect::<Vec<_>>()
        };
        for (rows, expected) in
            [(1, vec![1]), (16, vec![16]), (29, vec![16, 13]), (100, vec![64, 32, 4]), (512, vec![64; 8])]
        {
            assert_eq!(chunks(rows), expected, "{rows} rows");
        }
        for rows in 1..=GROUP_COMMIT_MAX {
            assert!(chunks(rows).len() <= 3 + rows / ROWS_PER_INSERT, "{rows} rows");
        }
    }

    #[test]
    fn texts_number_parameters_as_each_dialect_binds_them() {
        let check = |dialect, undo, rows, has: &str, lacks: &str| {
            let text = Statements::text(dialect, undo, Table::Tasks, rows);
            assert!(text.contains(has) && !text.contains(lacks), "{text}");
            assert_eq!(text.matches(", 0, 0)").count(), rows, "{text}");
        };
        // 14 parameters a task row: two rows end at $28 on PostgreSQL; SQLite binds `?` in order.
        check(Dialect::Postgres, Undo::Statement, 2, "$28, 0, 0)", "$29");
        check(Dialect::Sqlite, Undo::Statement, 2, "?, ?, ?, 0, 0), (?", "$");
        // A whole batch's rows undo the transaction on SQLite; PostgreSQL has no such clause (nor needs it).
        check(Dialect::Sqlite, Undo::Transaction, 2, "INSERT OR ROLLBACK INTO tasks", "$");
        check(Dialect::Sqlite, Undo::Statement, 1, "INSERT INTO tasks", "OR ROLLBACK");
        check(Dialect::Postgres, Undo::Transaction, 2, "INSERT INTO tasks", "OR ROLLBACK");
    }
}
