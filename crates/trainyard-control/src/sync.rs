//! Keeping the working set in step with the store: this process's arrivals, the rows changed since the last
//! sync, a full read now and then as a safety net, and the specs of tasks first seen read and parsed once.

use crate::Control;
use crate::active::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use trainyard_core::lifecycle::{Reason, Status};
use trainyard_core::spec::TrainingTask;
use trainyard_runtime::Backend;
use trainyard_store::{StoreError, TaskRecord, TaskVersion};

impl<B: Backend> Control<B> {
    /// Brings `active` up to date with the store.
    pub(crate) async fn sync_active(&mut self, now_ms: i64) -> Result<(), StoreError> {
        let due = self.synced_to_ms.is_some() && now_ms - self.full_synced_ms >= FULL_SYNC_EVERY_MS;
        let versions = if due { self.full_read(now_ms).await? } else { None };
        match (self.synced_to_ms, versions) {
            (Some(_), Some((read_at_ms, versions))) => {
                // The safety net, also light: every active task's version, set against the working set in
                // queue order; records are read only for tasks new to it, changed, or gone from the store's
                // active set. (Tasks changed since the versions were read are read again, harmlessly.)
                // Tasks created since shortly before the read began may have been committed after it: their
                // absence from it says nothing (the next full read looks at them), so they are not read
                // again. Under a stream of creates they are thousands.
                let recent_from_ms = read_at_ms - WIDE_SYNC_SKEW_MS;
                let mut fetch: Vec<&str> = Vec::new();
                // Working-set entries read again (changed, or no longer active in the store).
                let mut again: Vec<&ActiveKey> = Vec::new();
                let mut stored = versions.iter().peekable();
                for (key, e) in self.active.iter() {
                    let (created, id) = key;
                    while let Some(v) =
                        stored.next_if(|v| (v.created_at_ms, v.id.as_str()) < (*created, id.as_str()))
                    {
                        fetch.push(&v.id);
                    }
                    match stored.next_if(|v| v.created_at_ms == *created && v.id == *id) {
                        Some(v) if v.version == e.record.version => {}
                        None if *created >= recent_from_ms => {}
                        _ => {
                            fetch.push(id);
                            again.push(key);
                        }
                    }
                }
                fetch.extend(stored.map(|v| v.id.as_str()));
                let fetched = self.store.tasks_without_spec(&fetch).await?;
                let found: std::collections::HashSet<&str> = fetched.iter().map(|t| t.id.as_str()).collect();
                // Gone from the store altogether: dropped.
                let vanished: Vec<ActiveKey> =
                    again.into_iter().filter(|(_, id)| !found.contains(id.as_str())).cloned().collect();
                drop(found);
                for t in fetched {
                    self.absorb(t, None);
                }
                for key in vanished {
                    if let Some(gone) = self.active.remove(&key) {
                        self.forget(&gone);
                    }
                }
                self.refresh_excluded().await?;
                self.refresh_accounts().await?;
                self.full_synced_ms = now_ms;
                self.wide_synced_ms = now_ms;
            }
            (Some(since), None) => {
                let skew = if now_ms - self.wide_synced_ms >= WIDE_SYNC_EVERY_MS {
                    self.wide_synced_ms = now_ms;
                    WIDE_SYNC_SKEW_MS
                } else {
                    SYNC_SKEW_MS
                };
                // Versions first (a light read): records only for what is news to the working set. Most rows
                // of a look-back are known already (this process's arrivals, the last ticks' changes).
                let changed = self.store.versions_updated_since(since - skew).await?;
                let news: Vec<&str> = changed
                    .iter()
                    .filter(|v| match self.active.get(&(v.created_at_ms, v.id.clone())) {
                        Some(known) => known.record.version < v.version,
                        None => is_active(v.status, v.deleted),
                    })
                    .map(|v| v.id.as_str())
                    .collect();
                if !news.is_empty() {
                    for t in self.store.tasks_without_spec(&news).await? {
                        self.absorb(t, None);
                    }
                }
            }
            (None, _) => {
                let all = self.store.tasks_in_status_without_spec(ACTIVE).await?;
                // Specs already read are kept: they never change.
                let mut old = std::mem::take(&mut self.active);
                for t in all.into_iter().filter(|t| is_active(t.status, t.deleted)) {
                    let key = active_key(&t);
                    let entry = match old.remove(&key) {
                        Some(e) if e.record.version == t.version => e,
                        Some(e) => {
                            self.changed();
                            Entry { record: Arc::new(t), ..e }
                        }
                        None => {
                            // Planned once its spec is read (see `read_missing_specs`).
                            self.dirty = true;
                            if t.status != Status::Queued {
                                self.changed();
                            }
                            let (id, name) = (Arc::from(t.id.as_str()), Arc::from(t.name.as_str()));
                            Entry { id, name, record: Arc::new(t), spec: None }
                        }
                    };
                    self.active.insert(key, entry);
                }
                for (_, gone) in old.into_entries() {
                    self.forget(&gone);
                }
                self.refresh_excluded().await?;
                self.refresh_accounts().await?;
                self.full_synced_ms = now_ms;
                self.wide_synced_ms = now_ms;
            }
        }
        self.synced_to_ms = Some(now_ms);
        Ok(())
    }

    /// Every active task's version, in queue order, for the safety net: read here when the working set is
    /// small; for a deep one the read (hundreds of milliseconds at 50,000 tasks) runs beside the loop, and
    /// the first sync after it is done uses it. `None` while it runs.
    async fn full_read(&mut self, now_ms: i64) -> Result<Option<(i64, Vec<TaskVersion>)>, StoreError> {
        async fn read(store: trainyard_store::Store) -> Result<Vec<TaskVersion>, StoreError> {
            let mut versions = store.versions_in_status(ACTIVE).await?;
            versions.retain(|v| is_active(v.status, v.deleted));
            versions.sort_unstable_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
            Ok(versions)
        }
        if self.active.len() < FULL_READ_BESIDE_FROM && self.full_read.is_none() {
            return read(self.store.clone()).await.map(|v| Some((now_ms, v)));
        }
        match self.full_read.take() {
            None => {
                self.full_read = Some((now_ms, tokio::spawn(read(self.store.clone()))));
                Ok(None)
            }
            Some((at_ms, h)) if h.is_finished() => match h.await {
                Ok(versions) => versions.map(|v| Some((at_ms, v))),
                Err(e) => Err(StoreError::Corrupt(format!("the full read of the active tasks failed: {e}"))),
            },
            Some(h) => {
                self.full_read = Some(h);
                Ok(None)
            }
        }
    }

    /// Nodes the active tasks leave out, as recorded (after a restart, the only copy).
    async fn refresh_excluded(&mut self) -> Result<(), StoreError> {
        let mut excluded: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
        for (task, node) in self.store.avoided_nodes(ACTIVE).await? {
            excluded.entry(task).or_default().insert(node);
        }
        if excluded != self.excluded {
            self.excluded = excluded;
            self.changed();
        }
        Ok(())
    }

    /// Takes a newer version of a task into `active` (or drops it when the loop has nothing left to do).
    pub(crate) fn absorb(&mut self, mut t: TaskRecord, spec: Option<Arc<TrainingTask>>) {
        let key = active_key(&t);
        let spec = spec.map(|s| self.specs.intern(s));
        let keep = is_active(t.status, t.deleted);
        let known = self.active.get(&key).map(|e| (e.record.version, e.spec.is_some(), e.record.status));
        match known {
            // Known already at this version: only a spec it lacked is news.
            Some((version, had_spec, status)) if version >= t.version && !had_spec && spec.is_some() => {
                if let Some(mut e) = self.active.get_mut(&key) {
                    e.spec = spec;
                }
                self.arrived(key, status == Status::Queued);
            }
            Some((version, ..)) if version >= t.version => {}
            Some(_) if keep => {
                t.spec_json = String::new();
                if let Some(mut e) = self.active.get_mut(&key) {
                    e.record = Arc::new(t);
                    e.spec = e.spec.take().or(spec);
                }
                self.changed();
            }
            Some(_) => {
                if let Some(gone) = self.active.remove(&key) {
                    self.forget(&gone);
                }
            }
            None if keep => {
                t.spec_json = String::new();
                let (id, name) = (Arc::from(t.id.as_str()), Arc::from(t.name.as_str()));
                let (queued, planned) = (t.status == Status::Queued, spec.is_some());
                self.active.insert(key.clone(), Entry { id, name, record: Arc::new(t), spec });
                if planned {
                    self.arrived(key, queued);
                } else if !queued {
                    self.changed();
                }
            }
            None => {}
        }
    }

    /// Something other than a queued arrival changed what the plan reads: the next plan looks at the whole
    /// queue.
    pub(crate) fn changed(&mut self) {
        self.dirty = true;
        self.full = true;
    }

    /// A task of the working set can now be planned (it is new, or its spec was just read): a queued one is
    /// an arrival, which the next plan takes in without looking at the parked queue again (see `queue`).
    fn arrived(&mut self, key: ActiveKey, queued: bool) {
        self.dirty = true;
        if queued {
            self.fresh.push(key);
        } else {
            self.full = true;
        }
    }

    /// Drops what the loop kept about a task that has left the active set. A queued task leaving frees
    /// nothing: it only leaves the queue.
    pub(crate) fn forget(&mut self, gone: &Entry) {
        let id = &*gone.id;
        if gone.record.status == Status::Queued {
            self.dirty = true;
            self.gone.push(gone.id.clone());
        } else {
            self.changed();
        }
        self.nominated.remove(id);
        self.scale_wants.remove(id);
        self.excluded.remove(id);
        self.requests.forget(id);
    }

    /// Reads and parses, in bulk, the specs of active tasks not yet known (those created by another process,
    /// or read back after a restart). A spec that cannot be parsed is reported once and its task left out.
    pub(crate) async fn read_missing_specs(&mut self, now_ms: i64) -> Result<(), StoreError> {
        let missing: Vec<&str> = self
            .active
            .unread_keys()
            .map(|(_, id)| id.as_str())
            .filter(|id| !self.unreadable.contains(*id))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let mut specs = self.store.specs_of(&missing).await?;
        let mut unreadable = Vec::new();
        // Tasks submitted from one document store the same text: it is parsed once (a restart with a deep
        // queue of a sweep's tasks reads them all).
        let mut parsed: HashMap<String, Arc<TrainingTask>> = HashMap::new();
        let mut read: Vec<(ActiveKey, bool)> = Vec::new();
        let interner = &mut self.specs;
        self.active.read_specs(|key, e| {
            let json = specs.remove(&*e.id)?;
            let spec = match parsed.get(&json) {
                Some(spec) => spec.clone(),
                None => {
                    let t = TaskRecord { spec_json: json, ..(*e.record).clone() };
                    match Self::parse(&t) {
                        Ok(task) => {
                            let spec = interner.intern(Arc::new(slim(task)));
                            parsed.insert(t.spec_json, spec.clone());
                            spec
                        }
                        Err(err) => {
                            unreadable.push((e.record.clone(), err));
                            return None;
                        }
                    }
                }
            };
            read.push((key.clone(), e.record.status == Status::Queued));
            Some(spec)
        });
        for (key, queued) in read {
            self.arrived(key, queued);
        }
        for (t, err) in unreadable {
            // Said once, by the server that leads (a follower reads the same store).
            if self.unreadable.insert(t.id.clone()) && self.leading {
                self.store
                    .append_event(&t.id, t.attempt, now_ms, Reason::InternalError, &err.to_string())
                    .await?;
            }
        }
        Ok(())
    }
}
