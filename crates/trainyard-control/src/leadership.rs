//! Several servers on one store: the loop acts only while this server leads (see `trainyard-store`'s
//! `lease`). While it leads, the loop's writes carry the term's fencing token; while it stands by, the store
//! is unfenced for the API's commands (a user's stop is a version-checked write, whoever leads) and nothing
//! is asked of the backend: the leader's reconciliation carries the stop out.

use crate::Control;
use crate::active::WorkingSet;
use trainyard_runtime::Backend;
use trainyard_store::Fence;

impl<B: Backend> Control<B> {
    /// This loop as one of several servers on the store: it stands by until [`Control::lead`].
    pub fn elected_by(&mut self, fence: Fence) {
        self.fence = Some(fence);
        self.stand_by();
    }

    /// The backend this loop drives.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Whether this loop may act (always, for a server alone on its store).
    pub fn leads(&self) -> bool {
        self.leading
    }

    /// Whether the backend may be asked anything now: this loop leads and its term has not ended by this
    /// process's clock (a tick that outlives its term, or a process paused and resumed mid-tick, asks
    /// nothing more; the next leader's reconciliation does).
    pub(crate) fn may_act(&self) -> bool {
        self.leading && self.fence.as_ref().is_none_or(|f| f.token() != 0)
    }

    /// A new term as leader (the fence holds its token): everything in memory is read again from the store,
    /// as after a restart, and the loop's writes carry the token.
    pub fn lead(&mut self) {
        if let Some(fence) = &self.fence {
            self.store = self.open_store.fenced(fence.clone());
        }
        self.forget_all();
        self.leading = true;
    }

    /// No longer leading: the loop stops acting and its writes are unfenced (the API's commands).
    pub fn stand_by(&mut self) {
        self.store = self.open_store.clone();
        self.forget_all();
        self.leading = false;
    }

    /// While this server follows: the figures readers take from the scheduler's view (quota use, would-admit,
    /// fragmentation) made from the store, as the leader's are from its working set. The working set is kept
    /// in step with the store (incrementally, as the leader's), and the view put up; nothing is decided, asked
    /// or written.
    pub async fn refresh_views(&mut self, now_ms: i64) -> Result<(), crate::error::CommandError> {
        if self.leading {
            return Ok(());
        }
        self.drop_arrivals();
        self.sync_active(now_ms).await?;
        self.read_missing_specs(now_ms).await?;
        let catalog = self.catalog.get();
        let active = std::mem::take(&mut self.active);
        let entries: Vec<&crate::active::Entry> =
            active.iter().map(|(_, e)| e).filter(|e| e.spec.is_some()).collect();
        let (snap, _) = crate::place::snapshot_for(
            &catalog,
            &entries,
            &mut self.options,
            &self.nominated,
            &self.scale_wants,
            &self.excluded,
        );
        drop(entries);
        self.active = active;
        let old = self.views.snapshot.set(std::sync::Arc::new(snap));
        drop(old);
        Ok(())
    }

    /// Tasks this process created while it stands by: the leader reads them from the store.
    pub fn drop_arrivals(&mut self) {
        let mut arrived = std::mem::take(&mut self.arrived);
        self.arrivals.swap(&mut arrived);
        arrived.clear();
        self.arrived = arrived;
    }

    /// The loop's memory, as a fresh loop has it (the boards readers share are kept, and overwritten by the
    /// next tick).
    fn forget_all(&mut self) {
        self.drop_arrivals();
        self.dirty = true;
        self.full = true;
        self.fresh.clear();
        self.gone.clear();
        self.unparked.clear();
        self.queue = crate::queue::Queue::default();
        self.planned_for = None;
        self.quiet_until_ms = 0;
        self.queue_alarms_at_ms = 0;
        self.nominated.clear();
        self.excluded.clear();
        self.scale_wants.clear();
        self.unreadable.clear();
        self.active = WorkingSet::default();
        self.synced_to_ms = None;
        self.wide_synced_ms = 0;
        self.full_synced_ms = 0;
        if let Some((_, read)) = self.full_read.take() {
            read.abort();
        }
        self.requests = crate::policy::Requests::default();
        self.catalog_stamp = None;
    }

    /// With several servers on the store an admin changes the catalog through any of them. Before each plan
    /// the leader compares the stored catalog's stamp and takes a changed one in. Read after the tick's sync,
    /// it is in force for every task the sync found: a task created after a catalog change returned is never
    /// placed under the catalog before it.
    pub(crate) async fn follow_catalog(&mut self) -> Result<(), trainyard_store::StoreError> {
        if self.fence.is_none() {
            // Alone on its store: every change goes through this process's handle.
            return Ok(());
        }
        let stamp = self.store.setting_stamp(crate::CATALOG_SETTING).await?;
        if stamp.is_none() || stamp == self.catalog_stamp {
            return Ok(());
        }
        let Some(text) = self.store.get_setting(crate::CATALOG_SETTING).await? else { return Ok(()) };
        self.catalog_stamp = stamp;
        match trainyard_core::Catalog::from_yaml(&text) {
            Ok(catalog) => {
                if *self.catalog.get() != catalog {
                    self.catalog.set(catalog);
                }
            }
            Err(e) => eprintln!("trainyard: the stored catalog cannot be read: {e}"),
        }
        Ok(())
    }
}
