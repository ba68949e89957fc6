//! SQLite's create writer: a thread of its own with a connection of its own, writing each batch of creates
//! synchronously, start to commit.
//!
//! Every create passes through the writer in turn, so its time per batch bounds the creates per second. As
//! a task on the server's runtime speaking to a pool connection, each batch went back and forth between
//! threads once per statement (begin, a few multi-row INSERTs, commit), and at each step waited behind the
//! requests queued on the runtime; here a batch is one thread's work from `BEGIN` to `COMMIT`.
//!
//! The SQL is the same as PostgreSQL's writer runs (`group_commit::Statements`, the rows from
//! `group_commit::batch_rows`), and so is the order of the work: the whole batch in multi-row INSERTs, and
//! only when that fails on a taken name or a used idempotency key, each create alone in a savepoint. The
//! keys are looked up in the store's index in memory (`keys.rs`) before anything is inserted, since the
//! table has no index on them to refuse a second one.

use crate::create::new_record;
use crate::group_commit::{
    Derived, GROUP_COMMIT_MAX, Job, Statements, Table, Undo, Value, Written, answer, batch_rows, fill,
};
use crate::health::WriteHealth;
use crate::keys::{KeyIndex, KeyRow, Keys};
use crate::model::{Created, NewTask};
use crate::{Dialect, PRAGMAS, Result, StoreError, WriteTurns};
use rusqlite::{Connection, TransactionBehavior};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Starts the writer for the database at `path`. It ends when `jobs` has no sender left (the last `Store`
/// is dropped).
pub(crate) fn spawn(
    path: PathBuf,
    mut jobs: tokio::sync::mpsc::Receiver<Job>,
    turns: WriteTurns,
    keys: Arc<KeyIndex>,
    health: Arc<WriteHealth>,
) -> std::io::Result<()> {
    std::thread::Builder::new().name("store-writer".into()).spawn(move || {
        let statements = Statements::new(Dialect::Sqlite);
        // Kept between batches (its statement cache keeps the INSERTs prepared, its page cache the pages
        // new tasks go into). A connection a batch failed on is not trusted with the next one: it is
        // closed, which rolls back a transaction the failure left open (SQLite leaves one open after some,
        // `SQLITE_FULL` among them, and it would hold the database's write lock).
        let mut held: Option<Connection> = None;
        let mut batch: Vec<Job> = Vec::with_capacity(GROUP_COMMIT_MAX);
        while let Some(first) = jobs.blocking_recv() {
            fill(first, &mut jobs, &mut batch);
            // In turn with this process's other writes (see `Store::write_turn`).
            let turn = turns.blocking_lock();
            let written = match held.take() {
                Some(c) => Ok(c),
                None => open(&path),
            }
            .and_then(|mut conn| {
                let r = write(&mut conn, &statements, &keys, &batch);
                if r.is_ok() && conn.is_autocommit() {
                    held = Some(conn);
                } else {
                    close(conn);
                }
                r
            });
            drop(turn);
            answer(&mut batch, written, &health);
        }
    })?;
    Ok(())
}

/// Closes a connection a write failed on, ending whatever transaction it had open: rolled back first (so
/// the write lock is released even if the close is put off), then closed (which rolls back too).
pub(crate) fn close(conn: Connection) {
    if !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    // A close that fails (a statement still open: none is, every one is reset when its use ends) leaves
    // the connection to be closed when dropped.
    let _ = conn.close();
}

/// The writer's connection, set up as the pool's are.
pub(crate) fn open(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path)?;
    for pragma in PRAGMAS {
        // Some pragmas answer with a row (the value set); it is read and dropped.
        let mut statement = conn.prepare(pragma)?;
        let mut rows = statement.raw_query();
        while rows.next()?.is_some() {}
    }
    // Every text `Statements` holds, and a few more.
    conn.set_prepared_statement_cache_capacity(2 * Table::ALL.len() * 20 + 8);
    Ok(conn)
}

/// One batch in one transaction: a result per create, or the batch's failure (nothing committed).
fn write(
    conn: &mut Connection,
    statements: &Statements,
    keys: &KeyIndex,
    batch: &[Job],
) -> Result<Vec<Result<Written>>> {
    let derived = Derived::of(batch)?;
    {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        // Caught up under the write lock and before any insert: what the index holds is all that is
        // committed, and stays so until this transaction ends.
        let fresh = {
            let mut index = keys.lock();
            index.catch_up(&tx)?;
            all_fresh(&tx, &index, batch)?
        };
        if fresh && insert_many(&tx, statements, batch, &derived)? {
            tx.commit()?;
            return Ok(batch
                .iter()
                .map(|(t, _)| Ok(Written::Created(Created::New(new_record(t)))))
                .collect());
        }
        // Dropped: rolled back.
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    keys.lock().catch_up(&tx)?;
    // The keys this transaction stored so far, for a key sent twice in one batch.
    let mut stored_here: HashMap<(&str, &str), KeyRow> = HashMap::new();
    let mut results = Vec::with_capacity(batch.len());
    for job in batch {
        tx.execute_batch("SAVEPOINT one_create")?;
        let r = create_one(&tx, statements, keys, &stored_here, job);
        let undo = match r {
            Ok(_) => "RELEASE SAVEPOINT one_create",
            Err(_) => "ROLLBACK TO SAVEPOINT one_create; RELEASE SAVEPOINT one_create",
        };
        tx.execute_batch(undo)?;
        let t = &job.0;
        if let (Ok(Written::Created(_)), Some((key, hash))) = (&r, &t.idempotency) {
            stored_here.insert((&t.owner, key), KeyRow { body_hash: hash.clone(), task_id: t.id.clone() });
        }
        results.push(r);
    }
    tx.commit()?;
    Ok(results)
}

/// Whether no key of the batch is stored already (in `index`, caught up) or sent twice in it.
fn all_fresh(conn: &Connection, index: &Keys, batch: &[Job]) -> Result<bool> {
    let mut in_batch = std::collections::HashSet::new();
    for (t, _) in batch {
        if let Some((key, _)) = &t.idempotency
            && (!in_batch.insert((&t.owner, key)) || index.find(conn, &t.owner, key)?.is_some())
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The whole batch in a few multi-row statements, its keys all fresh ([`all_fresh`]). `Ok(false)` when it
/// cannot be done that way (a name taken): the caller rolls back.
///
/// A failing row undoes the whole transaction ([`Undo::Transaction`]): no statement journal is kept.
fn insert_many(conn: &Connection, statements: &Statements, batch: &[Job], derived: &Derived) -> Result<bool> {
    let undo = Undo::Transaction;
    let [keyed, tasks, labels, events] = batch_rows(batch, derived);
    if !keyed.is_empty() {
        insert_rows(conn, statements, undo, Table::Idempotency, &keyed)?;
    }
    match insert_rows(conn, statements, undo, Table::Tasks, &tasks) {
        Err(e) if is_unique_violation(&e) => return Ok(false),
        other => {
            other?;
        }
    }
    insert_rows(conn, statements, undo, Table::Labels, &labels)?;
    insert_rows(conn, statements, undo, Table::Events, &events)?;
    Ok(true)
}

/// One create, alone: a used key answers the task it made (or a conflict for another body), a taken name
/// is [`StoreError::NameTaken`]. `stored_here`: the keys stored earlier in this transaction, which the
/// index (caught up before it began) does not hold.
fn create_one(
    conn: &Connection,
    statements: &Statements,
    keys: &KeyIndex,
    stored_here: &HashMap<(&str, &str), KeyRow>,
    job: &Job,
) -> Result<Written> {
    let t: &NewTask = &job.0;
    if let Some((key, hash)) = &t.idempotency {
        let seen = match stored_here.get(&(t.owner.as_str(), key.as_str())) {
            Some(row) => Some(row.clone()),
            None => keys.lock().find(conn, &t.owner, key)?,
        };
        if let Some(KeyRow { body_hash, task_id }) = seen {
            if &body_hash != hash {
                return Err(StoreError::IdempotencyConflict);
            }
            return Ok(Written::KeyUsed { task_id });
        }
    }
    let one = std::slice::from_ref(job);
    let derived = Derived::of(one)?;
    let [keyed, tasks, labels, events] = batch_rows(one, &derived);
    // Within the batch's savepoints: a failing row undoes its statement alone.
    let undo = Undo::Statement;
    match insert_rows(conn, statements, undo, Table::Tasks, &tasks) {
        Err(e) if is_unique_violation(&e) => return Err(StoreError::NameTaken(t.name.clone())),
        other => {
            other?;
        }
    }
    insert_rows(conn, statements, undo, Table::Idempotency, &keyed)?;
    insert_rows(conn, statements, undo, Table::Labels, &labels)?;
    insert_rows(conn, statements, undo, Table::Events, &events)?;
    Ok(Written::Created(Created::New(new_record(t))))
}

/// Inserts `rows` into `table` chunk by chunk ([`Statements::chunks`]); returns the rows inserted.
fn insert_rows(
    conn: &Connection,
    statements: &Statements,
    undo: Undo,
    table: Table,
    rows: &[Vec<Value<'_>>],
) -> rusqlite::Result<usize> {
    let mut inserted = 0;
    for (text, chunk) in statements.chunks(undo, table, rows) {
        let mut statement = conn.prepare_cached(text)?;
        bind(&mut statement, chunk.iter().flatten())?;
        inserted += statement.raw_execute()?;
    }
    Ok(inserted)
}

/// Binds `values` to a statement's parameters, in order (the writer's INSERTs, the reader's queries).
pub(crate) fn bind<'v>(
    statement: &mut rusqlite::Statement<'_>,
    values: impl IntoIterator<Item = &'v Value<'v>>,
) -> rusqlite::Result<()> {
    for (i, v) in values.into_iter().enumerate() {
        match *v {
            Value::Text(s) => statement.raw_bind_parameter(i + 1, s)?,
            Value::Int(n) => statement.raw_bind_parameter(i + 1, n)?,
        }
    }
    Ok(())
}

fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(
                f.extended_code,
                rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE | rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
            )
    )
}
