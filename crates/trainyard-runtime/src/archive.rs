//! Where a backend keeps what must outlive an attempt's replicas: each replica's log, its metrics samples,
//! and where its log's follower stands. A backend whose replicas' output is gone with them (Kubernetes: a pod's
//! log goes with the pod) keeps it here while they run, and reads it back for the API.
//!
//! Two kinds: files on the server's disk (one server alone on its store), and the store itself, which every
//! server on a shared store reads (the server assembles that one; see `trainyard-api`). Only the server that
//! leads writes: the store's kind refuses a server whose term has ended, as its status changes are refused.

use crate::{AttemptKey, LogChunk, MetricPoint, metrics::Point};
use std::future::Future;
use std::pin::Pin;

/// A boxed future, for the archive's methods (called through `dyn Archive`).
pub type Fut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A replica with something kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kept {
    pub role: String,
    /// Its log is complete: nothing more will be added.
    pub ended: bool,
    /// Where its follower stands, in the follower's own format ("" before it wrote anything).
    pub cursor: String,
    /// The bytes of its log kept so far.
    pub log_bytes: u64,
}

/// Keeps replicas' logs and metrics. Errors are said in words (what could not be kept, and why).
pub trait Archive: Send + Sync + std::fmt::Debug {
    /// Records a replica and its role before anything of it is kept (a replica recorded before keeps its
    /// record).
    fn add_replica<'a>(
        &'a self,
        key: &'a AttemptKey,
        replica: &'a str,
        role: &'a str,
    ) -> Fut<'a, Result<(), String>>;

    /// The replicas of an attempt with something kept, as (name, role), by name.
    fn replicas<'a>(&'a self, key: &'a AttemptKey) -> Fut<'a, Vec<(String, String)>>;

    /// A replica's record, if it has one.
    fn replica<'a>(&'a self, key: &'a AttemptKey, replica: &'a str) -> Fut<'a, Result<Option<Kept>, String>>;

    /// Appends whole lines to a recorded replica's log and saves where its follower stands, together: a
    /// follower that goes on from the cursor never keeps a line twice, nor skips one.
    fn append_log<'a>(
        &'a self,
        key: &'a AttemptKey,
        replica: &'a str,
        lines: &'a str,
        cursor: &'a str,
    ) -> Fut<'a, Result<(), String>>;

    /// Marks a replica's log complete.
    fn end<'a>(&'a self, key: &'a AttemptKey, replica: &'a str) -> Fut<'a, Result<(), String>>;

    /// A replica's log from byte `offset`, whole lines, at most `max` bytes (a longer first line is cut).
    fn read_log<'a>(
        &'a self,
        key: &'a AttemptKey,
        replica: &'a str,
        offset: u64,
        max: usize,
    ) -> Fut<'a, LogChunk>;

    /// Appends a recorded replica's samples, unless that takes them past
    /// [`crate::metrics::MAX_METRICS_FILE_BYTES`] (the task decides how much it exposes).
    fn append_metrics<'a>(
        &'a self,
        key: &'a AttemptKey,
        replica: &'a str,
        points: &'a [Point],
    ) -> Fut<'a, Result<(), String>>;

    /// The samples of an attempt's replicas taken after `since_ms`, oldest first per replica.
    fn read_metrics<'a>(&'a self, key: &'a AttemptKey, since_ms: u64) -> Fut<'a, Vec<MetricPoint>>;
}

/// `data` read from byte `from` of a log, cut to what a read from `offset` of at most `max` bytes answers:
/// from `offset`, whole lines (or the first line cut at `max` when it alone is longer).
pub fn cut_log(mut data: Vec<u8>, from: u64, offset: u64, max: usize) -> (Vec<u8>, u64) {
    let skip = (offset.saturating_sub(from) as usize).min(data.len());
    data.drain(..skip);
    let start = from + skip as u64;
    data.truncate(max);
    // No whole line within `max`: what there is (the first line, cut), so that a reader goes on.
    if let Some(i) = data.iter().rposition(|&b| b == b'\n') {
        data.truncate(i + 1);
    }
    let next = start + data.len() as u64;
    (data, next)
}

/// A sample as one line of the kept format (JSON).
pub fn sample_line(p: &Point) -> Option<String> {
    serde_json::to_string(p).ok()
}

/// A kept sample line back, as the API serves it.
pub fn sample_of(replica: &str, line: &str) -> Option<MetricPoint> {
    let p: Point = serde_json::from_str(line).ok()?;
    Some(MetricPoint { replica: replica.to_owned(), at_ms: p.t, name: p.n, labels: p.l, value: p.v })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_is_cut_at_its_offset_and_at_whole_lines() {
        let log = b"aa\nbbb\ncc".to_vec();
        assert_eq!(cut_log(log.clone(), 0, 0, 100), (b"aa\nbbb\n".to_vec(), 7));
        assert_eq!(cut_log(log.clone(), 0, 3, 100), (b"bbb\n".to_vec(), 7));
        assert_eq!(cut_log(log.clone(), 0, 0, 5), (b"aa\n".to_vec(), 3));
        // A chunk read from before the offset.
        assert_eq!(cut_log(b"bbb\ncc\n".to_vec(), 3, 7, 100), (b"cc\n".to_vec(), 10));
        // One line longer than the read: cut, so that the reader goes on.
        assert_eq!(cut_log(b"abcdef\n".to_vec(), 0, 0, 4), (b"abcd".to_vec(), 4));
        // Past the end: nothing.
        assert_eq!(cut_log(Vec::new(), 10, 10, 4), (Vec::new(), 10));
    }
}
