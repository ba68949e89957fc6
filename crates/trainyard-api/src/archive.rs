//! The store as the place where a backend keeps its replicas' logs and metrics (`trainyard_runtime::archive`):
//! with several servers on one store, what the leader keeps every server reads, and the next leader goes on
//! from where the last one stood. Its writes go through the leader's fence: a server that does not lead, or
//! whose term has ended, keeps nothing.
//!
//! What a server kept on its own disk before it shared a store (files, `trainyard_kube::capture::FileArchive`)
//! is still read, for the attempts the store has nothing of.

use std::sync::Arc;
use trainyard_runtime::archive::{Archive, Fut, Kept, cut_log, sample_line, sample_of};
use trainyard_runtime::metrics::{MAX_METRICS_FILE_BYTES, Point};
use trainyard_runtime::{AttemptKey, LogChunk, MetricPoint};
use trainyard_store::Store;

/// See the module's documentation.
#[derive(Debug, Clone)]
pub struct StoreArchive {
    store: Store,
    /// What was kept on this server's disk before.
    before: Option<Arc<dyn Archive>>,
}

impl StoreArchive {
    /// Keeps in `store` (fenced by the leader's term where several servers share it), reading what `before`
    /// holds for what the store has nothing of.
    pub fn new(store: Store, before: Option<Arc<dyn Archive>>) -> StoreArchive {
        StoreArchive { store, before }
    }
}

fn said(e: trainyard_store::StoreError) -> String {
    e.to_string()
}

impl Archive for StoreArchive {
    fn add_replica<'a>(
        &'a self,
        key: &'a AttemptKey,
        replica: &'a str,
        role: &'a str,
    ) -> Fut<'a, Result<(), String>> {
        Box::pin(async move {
            self.store.kept_add_replica(&key.task_id, key.attempt, replica, role).await.map_err(said)
        })
    }

    fn replicas<'a>(&'a self, key: &'a AttemptKey) -> Fut<'a, Vec<(String, String)>> {
        Box::pin(async move {
            let kept = self.store.kept_replicas(&key.task_id, key.attempt).await.unwrap_or_default();
            if kept.is_empty()
                && let Some(before) = &self.before
            {
                return before.replicas(key).await;
            }
            kept.into_iter().map(|r| (r.replica, r.role)).collect()
        })
    }

    fn replica<'a>(&'a self, key: &'a AttemptKey, replica: &'a str) -> Fut<'a, Result<Option<Kept>, String>> {
        Box::pin(async move {
            let r = self.store.kept_replica(&key.task_id, key.attempt, replica).await.map_err(said)?;
            Ok(r.map(|r| Kept {
                role: r.role,
                ended: r.ended,
                cursor: r.cursor,
                log_bytes: r.log_bytes.max(0) as u64,
            }))
        })
    }

    fn append_log<'a>(
        &'a self,
        key: &'a AttemptKey,
        replica: &'a str,
        lines: &'a str,
        cursor: &'a str,
    ) -> Fut<'a, Result<(), String>> {
        Box::pin(async move {
            self.store.kept_append_log(&key.task_id, key.attempt, replica, lines, cursor).await.map_err(said)
        })
    }

    fn end<'a>(&'a self, key: &'a AttemptKey, replica: &'a str) -> Fut<'a, Result<(), String>> {
        Box::pin(async move { self.store.kept_end(&key.task_id, key.attempt, replica).await.map_err(said) })
    }

    fn read_log<'a>(
        &'a self,
        key: &'a AttemptKey,
        replica: &'a str,
        offset: u64,
        max: usize,
    ) -> Fut<'a, LogChunk> {
        Box::pin(async move {
            let offset_i = i64::try_from(offset).unwrap_or(i64::MAX);
            let max_i = i64::try_from(max).unwrap_or(i64::MAX);
            let kept =
                match self.store.kept_read_log(&key.task_id, key.attempt, replica, offset_i, max_i).await {
                    Ok(k) => k,
                    // The store is away: nothing now, the reader asks again.
                    Err(_) => return LogChunk { next: offset, ..LogChunk::default() },
                };
            if kept.missing {
                if let Some(before) = &self.before {
                    return before.read_log(key, replica, offset, max).await;
                }
                return LogChunk { next: offset, missing: true, ..LogChunk::default() };
            }
            let (data, next) =
                cut_log(kept.data, kept.from.max(0) as u64, offset.min(kept.log_bytes.max(0) as u64), max);
            LogChunk { data, next, ended: kept.ended && next >= kept.log_bytes.max(0) as u64, missing: false }
        })
    }

    fn append_metrics<'a>(
        &'a self,
        key: &'a AttemptKey,
        replica: &'a str,
        points: &'a [Point],
    ) -> Fut<'a, Result<(), String>> {
        Box::pin(async move {
            let samples: Vec<(i64, String)> =
                points.iter().filter_map(|p| Some((p.t as i64, sample_line(p)?))).collect();
            let cap = MAX_METRICS_FILE_BYTES as i64;
            self.store
                .kept_append_metrics(&key.task_id, key.attempt, replica, &samples, cap)
                .await
                .map_err(said)?;
            Ok(())
        })
    }

    fn read_metrics<'a>(&'a self, key: &'a AttemptKey, since_ms: u64) -> Fut<'a, Vec<MetricPoint>> {
        Box::pin(async move {
            let since = i64::try_from(since_ms).unwrap_or(i64::MAX);
            let kept =
                self.store.kept_read_metrics(&key.task_id, key.attempt, since).await.unwrap_or_default();
            if kept.is_empty()
                && let Some(before) = &self.before
            {
                return before.read_metrics(key, since_ms).await;
            }
            kept.iter().filter_map(|(replica, line)| sample_of(replica, line)).collect()
        })
    }
}
