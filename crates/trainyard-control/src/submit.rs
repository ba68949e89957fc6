//! The one way a task enters the store: validated against the catalog, its hidden values sealed, a unique
//! name chosen, and handed to the control loop.

use crate::error::SubmitError;
use crate::handles::Arrivals;
use crate::handles::CatalogHandle;
use crate::ids::Ids;
use crate::secrets::SecretBox;
use trainyard_core::Catalog;
use trainyard_core::lifecycle::{Reason, Status};
use trainyard_core::spec::TrainingTask;
use trainyard_store::{Created, NewTask, Store, StoreError, TaskDemand};

/// The task a body describes, if it has no errors against the catalog.
pub fn validate(catalog: &Catalog, body: &[u8]) -> Result<TrainingTask, SubmitError> {
    validate_for(catalog, body, None)
}

/// [`validate`] for a reader: `audience` is a member's project groups (None: an admin), so that the choices
/// an error offers are only what that member may see of the catalog (see [`trainyard_core::check_for`]).
pub fn validate_for(
    catalog: &Catalog,
    body: &[u8],
    audience: Option<&[String]>,
) -> Result<TrainingTask, SubmitError> {
    let checked = trainyard_core::check_for(body, catalog, audience);
    // Moved out rather than cloned from `valid_task`: the same test, one copy of the whole spec fewer.
    match checked.task {
        Some(t) if checked.report.is_ok() => Ok(t),
        _ => Err(SubmitError::Invalid(checked.report)),
    }
}

/// Queues a validated task: its hidden values sealed, a unique name, an idempotency key when given, and
/// what it asks for under `catalog` kept beside it for lists. Returns with it the sealed copy of the task
/// that was stored.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn store_task(
    store: &Store,
    ids: &Ids,
    secrets: &SecretBox,
    digests: &SecretBox,
    catalog: &Catalog,
    owner: &str,
    task: &TrainingTask,
    body: &[u8],
    idempotency_key: Option<&str>,
    now_ms: i64,
) -> Result<(Created, TrainingTask), SubmitError> {
    // The id is chosen before sealing: hidden values are bound to it (and to the owner), so they cannot be
    // replayed into another task's record.
    let id = ids.task_id(now_ms);
    let mut sealed = task.clone();
    secrets
        .seal(&mut sealed, &id, owner)
        .map_err(|e| SubmitError::Store(StoreError::Corrupt(format!("cannot seal hidden values: {e}"))))?;
    let spec_json = serde_json::to_string(&sealed).expect("a TrainingTask always serialises");
    let lookup = |name: &str| catalog.instance_specs.get(name);
    let demand = trainyard_core::demand_options(&task.spec, &lookup).ok().and_then(|d| TaskDemand::of(&d));
    // A name taken gets another suffix, counted from elsewhere; the bound keeps a broken store from looping.
    const NAME_TRIES: usize = 8;
    let mut last = None;
    for _ in 0..NAME_TRIES {
        let new = NewTask {
            id: id.clone(),
            name: format!("{}-{}", task.metadata.name_prefix, ids.name_suffix()),
            owner: owner.to_owned(),
            project_group: task.metadata.project_group.clone(),
            task_type: task.spec.task_type.to_string(),
            status: Status::Queued,
            public: task.metadata.public,
            labels: task.metadata.labels.clone(),
            spec_json: spec_json.clone(),
            created_at_ms: now_ms,
            idempotency: idempotency_key.map(|k| (k.to_owned(), digests.digest(body))),
            first_event: Some((Reason::Submitted, format!("submitted by {owner}"))),
            demand: demand.clone(),
        };
        match store.create_task(&new).await {
            Err(StoreError::NameTaken(n)) => {
                ids.name_taken();
                last = Some(StoreError::NameTaken(n));
            }
            other => return Ok((other?, sealed)),
        }
    }
    Err(SubmitError::Store(last.expect("the loop ran at least once")))
}

/// The one way into the store for every submission (a new task or a clone): the checks the caller owns
/// (membership, catalog access, webhooks) are done; this seals, stores and hands the task to the control
/// loop. Cheap to clone; the API holds one.
#[derive(Debug, Clone)]
pub struct Submitter {
    pub(crate) store: Store,
    pub(crate) secrets: SecretBox,
    /// The key idempotency keys' request digests are made with: with several servers on a store, the
    /// store's own (so a retry through another server is the same request); else the server key.
    pub(crate) digests: SecretBox,
    pub(crate) catalog: CatalogHandle,
    pub(crate) arrivals: Arrivals,
    pub(crate) ids: std::sync::Arc<Ids>,
}

impl Submitter {
    /// This submitter, its idempotency digests made with `key` (key material every server on the store
    /// shares).
    pub fn digesting_with(mut self, key: SecretBox) -> Self {
        self.digests = key;
        self
    }

    /// The task a body describes, checked against the catalog in force.
    pub fn validate(&self, body: &[u8]) -> Result<TrainingTask, SubmitError> {
        validate(&self.catalog.get(), body)
    }

    /// [`Submitter::validate`] for a reader (see [`validate_for`]).
    pub fn validate_for(
        &self,
        body: &[u8],
        audience: Option<&[String]>,
    ) -> Result<TrainingTask, SubmitError> {
        validate_for(&self.catalog.get(), body, audience)
    }

    /// Queues a validated task (see [`store_task`]); a new one is handed to the control loop at once.
    pub async fn submit(
        &self,
        owner: &str,
        task: &TrainingTask,
        body: &[u8],
        idempotency_key: Option<&str>,
        now_ms: i64,
    ) -> Result<Created, SubmitError> {
        let (created, sealed) = store_task(
            &self.store,
            &self.ids,
            &self.secrets,
            &self.digests,
            &self.catalog.get(),
            owner,
            task,
            body,
            idempotency_key,
            now_ms,
        )
        .await?;
        if let Created::New(t) = &created {
            // The sealed copy differs from the task only in hidden values, which the loop's copy leaves out.
            self.arrivals.push(t, sealed);
        }
        Ok(created)
    }
}
