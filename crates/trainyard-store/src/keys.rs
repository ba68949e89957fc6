//! SQLite's index of idempotency keys, kept in memory over a table written in order of arrival.
//!
//! Clients send random keys (the console sends UUIDs), and a B-tree on (owner, key) takes each new key at a
//! random place: every create dirtied a page of that index of its own, a third of the WAL's frames per commit,
//! and once the index outgrew the page cache each also cost a read. On SQLite the `idempotency` table has
//! no index on the keys (migration 16); its rows are numbered in order of arrival (`seq`, with
//! `AUTOINCREMENT`, so a number once committed is never given again), so new rows go at its end, and this
//! map from a hash of (owner, key) to the `seq` of its row answers lookups.
//!
//! The map follows the table: before a lookup it reads the rows past the last `seq` it has seen (one seek
//! to the table's end), so it holds whatever was committed by anyone (another process on the same file
//! included), and at start it reads the whole table once. Rows are only ever added, and a transaction that
//! adds some holds SQLite's one write lock until it ends, so rows become visible in `seq` order. The
//! create writer catches up inside its write transaction before it inserts anything, which makes its check
//! and its insert one atomic step. PostgreSQL keeps its unique index: several servers may write to it.
//!
//! The map keeps every key stored (18–36 bytes each), and the first lookup after a start reads the whole
//! table.
//!
//! The hash is keyed per process (the standard library's random keys), so nobody can choose keys that
//! collide; collisions by chance are told apart by reading the candidate rows.

use crate::{Result, StoreError};
use rusqlite::Connection;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::sync::{Mutex, MutexGuard};

/// The keys' index (see the file's header). One per `Store` on SQLite.
#[derive(Debug, Default)]
pub(crate) struct KeyIndex {
    inner: Mutex<Keys>,
}

impl KeyIndex {
    /// The index, to catch up and look keys up while held.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Keys> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A stored key's row: the hash of the body it came with, and the task it created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyRow {
    pub(crate) body_hash: String,
    pub(crate) task_id: String,
}

/// The map itself.
#[derive(Debug, Default)]
pub(crate) struct Keys {
    hasher: RandomState,
    /// Hash of (owner, key) → `seq` of the first row seen with it.
    first: HashMap<u64, i64, BuildHasherDefault<AlreadyHashed>>,
    /// Later rows whose hash equals an earlier one's (another owner and key, by chance).
    more: HashMap<u64, Vec<i64>>,
    /// The highest `seq` read.
    seen: i64,
}

impl Keys {
    fn hash(&self, owner: &str, key: &str) -> u64 {
        self.hasher.hash_one((owner, key))
    }

    /// Reads the rows added since the last call (all of them the first time). `conn` must not hold rows of
    /// its own transaction that may yet be rolled back: the map would keep them, and miss the rows that
    /// later reuse their numbers.
    pub(crate) fn catch_up(&mut self, conn: &Connection) -> Result<()> {
        let mut statement =
            conn.prepare_cached("SELECT seq, owner, key FROM idempotency WHERE seq > ?1 ORDER BY seq")?;
        let mut rows = statement.query([self.seen])?;
        while let Some(row) = rows.next()? {
            let seq: i64 = row.get(0)?;
            let (owner, key) = (row.get_ref(1)?.as_str(), row.get_ref(2)?.as_str());
            let (owner, key) = owner
                .and_then(|o| key.map(|k| (o, k)))
                .map_err(|e| StoreError::Corrupt(format!("idempotency row {seq}: {e}")))?;
            let h = self.hash(owner, key);
            match self.first.entry(h) {
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(seq);
                }
                std::collections::hash_map::Entry::Occupied(_) => self.more.entry(h).or_default().push(seq),
            }
            self.seen = self.seen.max(seq);
        }
        Ok(())
    }

    /// The row `owner` stored with `key`, among those read so far ([`Keys::catch_up`] first).
    pub(crate) fn find(&self, conn: &Connection, owner: &str, key: &str) -> Result<Option<KeyRow>> {
        let h = self.hash(owner, key);
        let Some(first) = self.first.get(&h) else {
            return Ok(None);
        };
        let more = self.more.get(&h).map(Vec::as_slice).unwrap_or_default();
        let mut statement =
            conn.prepare_cached("SELECT owner, key, body_hash, task_id FROM idempotency WHERE seq = ?1")?;
        for seq in std::iter::once(first).chain(more) {
            let row = statement.query_row([seq], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get(2)?, r.get(3)?))
            });
            match row {
                Ok((o, k, body_hash, task_id)) if o == owner && k == key => {
                    return Ok(Some(KeyRow { body_hash, task_id }));
                }
                Ok(_) => {}
                Err(rusqlite::Error::QueryReturnedNoRows) => {
                    return Err(StoreError::Corrupt(format!("idempotency row {seq} is gone")));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(None)
    }

    /// How many rows the map holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.first.len() + self.more.values().map(Vec::len).sum::<usize>()
    }
}

/// The map's keys are hashes already: used as they are.
#[derive(Debug, Default)]
pub(crate) struct AlreadyHashed(u64);

impl Hasher for AlreadyHashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64`s are hashed here; anything else is folded in all the same.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE idempotency (seq INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL,
                 key TEXT NOT NULL, body_hash TEXT NOT NULL, task_id TEXT NOT NULL, created_at_ms BIGINT NOT NULL)",
        )
        .unwrap();
        conn
    }

    fn add(conn: &Connection, owner: &str, key: &str, task: &str) {
        conn.execute(
            "INSERT INTO idempotency (owner, key, body_hash, task_id, created_at_ms) VALUES (?1, ?2, 'h', ?3, 0)",
            (owner, key, task),
        )
        .unwrap();
    }

    #[test]
    fn finds_what_was_committed_by_anyone_once_caught_up() {
        let conn = table();
        let mut keys = Keys::default();
        add(&conn, "alice", "k1", "t1");
        keys.catch_up(&conn).unwrap();
        assert_eq!(keys.find(&conn, "alice", "k1").unwrap().unwrap().task_id, "t1");
        assert_eq!(keys.find(&conn, "bob", "k1").unwrap(), None, "keys are per owner");
        // A row written since (by this process or another) is found after the next catch-up.
        add(&conn, "bob", "k1", "t2");
        assert_eq!(keys.find(&conn, "bob", "k1").unwrap(), None);
        keys.catch_up(&conn).unwrap();
        assert_eq!(keys.find(&conn, "bob", "k1").unwrap().unwrap().task_id, "t2");
        assert_eq!(keys.len(), 2);
        keys.catch_up(&conn).unwrap();
        assert_eq!(keys.len(), 2, "a catch-up reads each row once");
    }

    #[test]
    fn owner_and_key_are_told_apart_where_they_meet() {
        let conn = table();
        let mut keys = Keys::default();
        add(&conn, "ab", "c", "t1");
        keys.catch_up(&conn).unwrap();
        assert_eq!(keys.find(&conn, "a", "bc").unwrap(), None);
        assert!(keys.find(&conn, "ab", "c").unwrap().is_some());
    }

    /// With every hash the same (a hasher that ignores its input), every lookup meets every row: each is
    /// still found by its own owner and key, and a key never stored is not.
    #[test]
    fn colliding_hashes_are_told_apart_by_their_rows() {
        let conn = table();
        for i in 0..50 {
            add(&conn, &format!("user{}", i % 3), &format!("key{i}"), &format!("t{i}"));
        }
        let mut keys = Keys::default();
        keys.catch_up(&conn).unwrap();
        // Force every row under one hash, as if all had collided.
        let all: Vec<i64> = keys.first.values().chain(keys.more.values().flatten()).copied().collect();
        keys.first.clear();
        keys.more.clear();
        let (h, rest) = all.split_first().unwrap();
        for owner in ["user0", "user1", "user2"] {
            for i in 0..50 {
                let key = format!("key{i}");
                let hash = keys.hash(owner, &key);
                keys.first.insert(hash, *h);
                keys.more.insert(hash, rest.to_vec());
            }
        }
        for i in 0..50 {
            let owner = format!("user{}", i % 3);
            let found = keys.find(&conn, &owner, &format!("key{i}")).unwrap().unwrap();
            assert_eq!(found.task_id, format!("t{i}"));
            let other = format!("user{}", (i + 1) % 3);
            assert_eq!(keys.find(&conn, &other, &format!("key{i}")).unwrap(), None);
        }
    }

    /// Rows of a transaction that rolled back were never read (the writer catches up before it inserts),
    /// and the row that reuses their number is read in its place.
    #[test]
    fn a_rolled_back_row_leaves_nothing_and_its_number_is_read_when_reused() {
        let conn = table();
        let mut keys = Keys::default();
        add(&conn, "alice", "k0", "t0");
        conn.execute_batch("BEGIN").unwrap();
        keys.catch_up(&conn).unwrap();
        add(&conn, "alice", "k1", "t1");
        conn.execute_batch("ROLLBACK").unwrap();
        add(&conn, "alice", "k2", "t2");
        keys.catch_up(&conn).unwrap();
        assert_eq!(keys.find(&conn, "alice", "k1").unwrap(), None);
        assert_eq!(keys.find(&conn, "alice", "k2").unwrap().unwrap().task_id, "t2");
    }
}
