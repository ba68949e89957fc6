//! Handles shared between the control loop and its readers (the API): the catalog in force, the queue
//! board, the scheduler's last snapshot and the hand-off of this process's new tasks.

use crate::active::*;
use std::collections::HashMap;
use std::sync::Arc;
use trainyard_core::Catalog;
use trainyard_core::spec::TrainingTask;
use trainyard_store::TaskRecord;

/// Where a queued task stands, as of the last tick. A task its owner's account holds (see `accounts`) is in
/// no place in line: position 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueInfo {
    pub position: u32,
    pub position_in_group: u32,
    /// Shared by the tasks that wait for the same reason.
    pub reason: Arc<str>,
}

impl From<Catalog> for CatalogHandle {
    fn from(c: Catalog) -> Self {
        CatalogHandle::new(c)
    }
}

/// The catalog in force, replaceable while the server runs (an admin edits it); readers take a snapshot.
#[derive(Debug, Clone)]
pub struct CatalogHandle(std::sync::Arc<std::sync::RwLock<std::sync::Arc<Catalog>>>);

impl CatalogHandle {
    pub fn new(catalog: Catalog) -> Self {
        CatalogHandle(std::sync::Arc::new(std::sync::RwLock::new(std::sync::Arc::new(catalog))))
    }

    pub fn get(&self) -> std::sync::Arc<Catalog> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn set(&self, catalog: Catalog) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = std::sync::Arc::new(catalog);
    }
}

/// Queue positions and wait reasons as of the last tick, readable from anywhere without the control loop.
#[derive(Debug, Clone, Default)]
pub struct QueueBoard(Arc<std::sync::RwLock<Waits>>, Arc<std::sync::atomic::AtomicU64>);

/// Every queued task's wait, by task id. Rebuilt by a full scheduling cycle with an entry per queued task
/// (and updated in place by the others), so its hashing is the cheap kind: task ids are platform-made (not chosen by users), so a hash that is fast
/// but not collision-resistant cannot be steered.
pub(crate) type Waits = HashMap<Arc<str>, QueueInfo, std::hash::BuildHasherDefault<IdHasher>>;

/// A fast hasher for task ids: eight bytes at a time, multiplied and rotated.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.mix(u64::from_le_bytes(c.try_into().expect("eight bytes")));
        }
        let mut tail = [0u8; 8];
        tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
        self.mix(u64::from_le_bytes(tail) ^ (bytes.len() as u64) << 56);
    }

    fn write_u8(&mut self, b: u8) {
        self.mix(u64::from(b));
    }

    fn finish(&self) -> u64 {
        // The multiply leaves the low bits (the table's index) a function of the input's low bits only, and
        // ids made in one millisecond differ in their last characters: mixed down so every bit counts.
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h
    }
}

impl IdHasher {
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// What each starting task waits for, in its backend's words (a cluster's scheduler with no room, a pull):
/// the backend's [`trainyard_runtime::Observation::Waiting`], kept while the attempt it was said of starts.
#[derive(Debug, Clone, Default)]
pub struct StartBoard(Arc<std::sync::RwLock<HashMap<String, StartWait>>>, Arc<std::sync::atomic::AtomicU64>);

/// One starting attempt's wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartWait {
    pub attempt: i64,
    pub reason: String,
    /// When the backend first said this reason (the control loop's clock, ms).
    pub since_ms: i64,
}

impl StartBoard {
    /// The wait of `task_id`'s attempt `attempt`, if it has one.
    pub fn get(&self, task_id: &str, attempt: i64) -> Option<StartWait> {
        let board = self.0.read().unwrap_or_else(|e| e.into_inner());
        board.get(task_id).filter(|w| w.attempt == attempt).cloned()
    }

    pub(crate) fn set(&self, task_id: &str, attempt: i64, reason: &str, now_ms: i64) {
        let mut board = self.0.write().unwrap_or_else(|e| e.into_inner());
        match board.get_mut(task_id) {
            Some(w) if w.attempt == attempt && w.reason == reason => {}
            _ => {
                board.insert(
                    task_id.to_owned(),
                    StartWait { attempt, reason: reason.to_owned(), since_ms: now_ms },
                );
                self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// The attempt started or ended: it waits no more.
    pub(crate) fn clear(&self, task_id: &str) {
        let mut board = self.0.write().unwrap_or_else(|e| e.into_inner());
        if board.remove(task_id).is_some() {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Every wait on the board, with the board's version (it changes with every change).
    pub fn snapshot(&self) -> (u64, Vec<(String, StartWait)>) {
        let board = self.0.read().unwrap_or_else(|e| e.into_inner());
        let version = self.1.load(std::sync::atomic::Ordering::Relaxed);
        (version, board.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
    }

    /// Puts up another server's board (a follower shows the leader's).
    pub fn install(&self, waits: Vec<(String, StartWait)>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = waits.into_iter().collect();
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl QueueBoard {
    pub fn get(&self, task_id: &str) -> Option<QueueInfo> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).get(task_id).cloned()
    }

    /// Puts this tick's waits up and hands back the last tick's, for the caller to drop outside the lock.
    pub(crate) fn replace(&self, waits: Waits) -> Waits {
        let old = std::mem::replace(&mut *self.0.write().unwrap_or_else(|e| e.into_inner()), waits);
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        old
    }

    /// Every wait on the board, with the board's version (it changes with every change).
    pub fn snapshot(&self) -> (u64, Vec<(Arc<str>, QueueInfo)>) {
        let board = self.0.read().unwrap_or_else(|e| e.into_inner());
        let version = self.1.load(std::sync::atomic::Ordering::Relaxed);
        (version, board.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
    }

    /// Puts up another server's board (a follower shows the leader's).
    pub fn install(&self, waits: Vec<(Arc<str>, QueueInfo)>) {
        let old = self.replace(waits.into_iter().collect());
        drop(old);
    }

    /// Updates the board in place: the waits that moved (or are new) and the tasks no longer waiting.
    pub(crate) fn update(&self, moved: Vec<(Arc<str>, QueueInfo)>, left: &[Arc<str>]) {
        if moved.is_empty() && left.is_empty() {
            return;
        }
        let mut board = self.0.write().unwrap_or_else(|e| e.into_inner());
        for id in left {
            board.remove(id);
        }
        board.extend(moved);
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Tasks this process has just created, handed to the control loop with their parsed specs, so that it
/// neither waits for its next read of the store to see them nor reads and parses their specs again.
#[derive(Debug, Clone, Default)]
pub struct Arrivals(Arc<std::sync::Mutex<Vec<Arrival>>>);

/// A created task's record and its slimmed spec.
pub(crate) type Arrival = (TaskRecord, Arc<TrainingTask>);

impl Arrivals {
    /// A task just committed to the store, and its spec as validated (or as stored: the loop's copy is
    /// slimmed, and leaves out the env, which is all that sealing changes).
    pub fn push(&self, record: &TaskRecord, task: TrainingTask) {
        let spec = Arc::new(slim(task));
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push((without_spec(record), spec));
    }

    /// Swaps the arrivals so far for `spare`, which the caller has emptied: the two buffers take turns, so
    /// that thousands of arrivals a tick are not pushed into a new buffer grown from nothing each time
    /// (fresh pages, zeroed by the kernel, and copies at every doubling).
    pub(crate) fn swap(&self, spare: &mut Vec<Arrival>) {
        debug_assert!(spare.is_empty());
        std::mem::swap(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()), spare);
    }
}

/// A copy of a record without its spec's text, which the loop never reads (it has the parsed spec).
fn without_spec(r: &TaskRecord) -> TaskRecord {
    TaskRecord {
        id: r.id.clone(),
        name: r.name.clone(),
        owner: r.owner.clone(),
        project_group: r.project_group.clone(),
        task_type: r.task_type.clone(),
        status: r.status,
        deleted: r.deleted,
        public: r.public,
        labels: r.labels.clone(),
        spec_json: String::new(),
        attempt: r.attempt,
        version: r.version,
        created_at_ms: r.created_at_ms,
        updated_at_ms: r.updated_at_ms,
        placement: r.placement.clone(),
        retries: r.retries,
        demand: r.demand.clone(),
        status_since_ms: r.status_since_ms,
        run_started_at_ms: r.run_started_at_ms,
    }
}

/// The scheduler's snapshot as of the last tick, shared with readers.
#[derive(Debug, Clone, Default)]
pub struct SnapshotBoard(Arc<std::sync::RwLock<Arc<trainyard_sched::Snapshot>>>);

impl SnapshotBoard {
    pub fn get(&self) -> Arc<trainyard_sched::Snapshot> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts up a new snapshot and hands back the last one, for the caller to drop outside the lock.
    pub(crate) fn set(&self, snap: Arc<trainyard_sched::Snapshot>) -> Arc<trainyard_sched::Snapshot> {
        std::mem::replace(&mut *self.0.write().unwrap_or_else(|e| e.into_inner()), snap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, BuildHasherDefault};

    #[test]
    fn ids_made_in_one_millisecond_spread_over_the_table() {
        // Ids of one millisecond share their first 11 characters; the table indexes by the hash's low bits.
        let build = BuildHasherDefault::<IdHasher>::default();
        let ids = (0..10_000u64).map(|n| format!("{:016x}", (1_764_000_000_000u64 << 20) | n));
        let low: std::collections::HashSet<u64> =
            ids.map(|id| build.hash_one(id.as_str()) & 0xffff).collect();
        // 10,000 draws into 65,536 buckets give about 9,270 distinct ones.
        assert!(low.len() > 9_000, "{} distinct low-bit values of 10,000", low.len());
    }
}
