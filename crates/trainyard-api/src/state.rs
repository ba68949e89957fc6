//! What every handler shares ([`AppState`]), wired together, and the server's clock.

use crate::backends::AnyBackend;
use crate::metrics::Metrics;
use crate::tokens::TokenCache;
use std::sync::Arc;
use tokio::sync::Mutex;
use trainyard_control::secrets::SecretBox;
use trainyard_control::{CatalogHandle, Control, QueueBoard};
use trainyard_core::Catalog;
use trainyard_store::Store;

/// What every handler shares, behind one `Arc`: axum clones the state for every request (the route's
/// service, the metrics layer, the handler's extractor), and a clone of the fields themselves is a dozen
/// reference counts and some allocations (the webhook settings, the scheduler's config) each time.
///
/// Fields are read through `Deref`; setting one while wiring (`state.webhooks = ...`) goes through
/// `DerefMut`, which copies the fields first if a clone of this state is already out.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

/// The fields of an [`AppState`].
#[derive(Clone)]
pub struct Shared {
    pub store: Store,
    /// The catalog in force; admins replace it through the API.
    pub catalog: CatalogHandle,
    pub secrets: Arc<SecretBox>,
    /// Queue positions and wait reasons, readable without waiting for the control loop.
    pub queue: QueueBoard,
    /// What starting tasks wait for, as their backends say it.
    pub starts: trainyard_control::StartBoard,
    /// Disabled and deleted users as the control loop last read them (a task view shows a deleted owner).
    pub accounts: trainyard_control::AccountsHandle,
    pub tokens: TokenCache,
    pub metrics: Arc<Metrics>,
    pub control: Arc<Mutex<Control<AnyBackend>>>,
    /// For reading logs (the control loop owns the rest of the backend's conversation).
    pub backend: AnyBackend,
    /// Wakes the control loop at once (a task was created, stopped or resubmitted).
    pub wake: Arc<tokio::sync::Notify>,
    /// The one way tasks enter the store: sealed, stored and handed to the control loop (with their parsed
    /// specs) without a store read.
    pub submitter: trainyard_control::Submitter,
    /// How alarm webhooks are sent (whom https receivers' certificates are checked against).
    pub webhooks: trainyard_control::alarms::Webhooks,
    /// The scheduler's view at the last tick (would-admit, fragmentation, quota), without the loop's lock.
    pub views: trainyard_control::SchedViews,
    /// Admins' settings of the API (the per-user cap on queued tasks), as last read.
    pub settings: crate::settings::SettingsCache,
    /// The one way the API writes what is not a submission or a task's lifecycle (`store` is for reads).
    pub writer: trainyard_control::Writer,
    /// The control plane's clock (the system's, unless the loop was given another): what handlers call now.
    pub clock: Arc<dyn trainyard_control::Clock>,
    /// This server's part among the servers on its store: the control loop runs while it leads.
    pub election: crate::leader::Election,
    /// Where uploaded working directories are kept (the server's data dir); None: none are taken.
    pub workdirs: Option<trainyard_workdir::store::Store>,
}

impl Shared {
    /// Now, as Unix time in milliseconds, on the control plane's clock.
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }
}

impl AppState {
    /// Everything the server needs, wired together: the control loop over `store` and `backend`, sharing
    /// the catalog, the queue board and the secrets with the API.
    pub fn new(
        store: Store,
        catalog: Catalog,
        backend: AnyBackend,
        secrets: SecretBox,
        config: trainyard_sched::Config,
    ) -> Self {
        let handle = CatalogHandle::new(catalog);
        let control = Control::new(store.clone(), backend.clone(), handle.clone(), config, secrets.clone());
        AppState(Arc::new(Shared {
            store,
            catalog: handle,
            secrets: Arc::new(secrets),
            queue: control.queue_board(),
            starts: control.start_board(),
            accounts: control.accounts(),
            submitter: control.submitter(),
            views: control.views(),
            writer: control.writer(),
            clock: control.sources().clock.clone(),
            webhooks: trainyard_control::alarms::Webhooks::system(),
            tokens: Default::default(),
            settings: Default::default(),
            metrics: Default::default(),
            control: Arc::new(Mutex::new(control)),
            backend,
            wake: Arc::default(),
            election: crate::leader::Election::alone(),
            workdirs: None,
        }))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl std::ops::DerefMut for AppState {
    fn deref_mut(&mut self) -> &mut Shared {
        Arc::make_mut(&mut self.0)
    }
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

/// Now, as Unix time in milliseconds, on the system's clock: for what runs before an [`AppState`] exists (a
/// handler reads [`Shared::now_ms`]).
pub fn now_ms() -> i64 {
    trainyard_control::Clock::now_ms(&trainyard_control::SystemClock)
}
