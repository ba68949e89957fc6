//! Group commit: concurrent creates are queued to one writer task, which writes them in one transaction
//! (as a few multi-row INSERTs when it can, else one by one with savepoints) and answers every caller after
//! the commit, so an acknowledged create is durable.

use crate::create::{create_in, is_unique_violation, new_record};
use crate::model::{Created, NewTask};
use crate::rows::{Arg, TASK_COLUMNS, bind_all};
use crate::{Result, Store, StoreError};
use sqlx::AnyPool;

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
            return Err(StoreError::Corrupt("the store's writer has stopped".into()));
        }
        answer.await.map_err(|_| StoreError::Corrupt("the store's writer has stopped".into()))?
    }
}

/// One queued create and where its answer goes.
pub(crate) type Job = (NewTask, tokio::sync::oneshot::Sender<Result<Created>>);

/// The most creates one group commit takes.
pub(crate) const GROUP_COMMIT_MAX: usize = 512;

/// Rows per multi-row INSERT: well under SQLite's oldest bound of 999 parameters at 10 per task row.
const ROWS_PER_INSERT: usize = 64;

/// Runs `head (...), (...) tail` over `rows` in chunks of [`ROWS_PER_INSERT`], binding each row's values in
/// order; returns the rows inserted. `group(n)` is one row's `VALUES` group with its parameters numbered from
/// `$n`.
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
            Arg::Text(t.status.as_str().to_owned()),
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
                Arg::Text(reason.as_str().to_owned()),
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
pub(crate) async fn writer(pool: AnyPool, mut jobs: tokio::sync::mpsc::Receiver<Job>) {
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
