//! [`Writer`]: every write the API makes that is not a task's lifecycle (those are `Control`'s commands) or a
//! submission (`Submitter`): users and their tokens, TaskEnv, alarm subscriptions, shares, the catalog, the
//! API's settings and registry logins. The API reads the store directly and writes only through here, with
//! the time taken from the control plane's clock; its `clippy.toml` refuses the store's write methods.

use crate::clock::Clock;
use crate::handles::CatalogHandle;
use crate::registry_logins;
use crate::secrets::{Resealed, SecretBox};
use std::sync::Arc;
use trainyard_core::Catalog;
use trainyard_core::spec::AlarmSubscription;
use trainyard_store::{Store, StoreError, TaskEnvVar, User};

/// The name of the store setting that holds the catalog in force (JSON, every field spelled out).
pub const CATALOG_SETTING: &str = "catalog";

/// The API's writes. Cheap to clone; the API holds one.
#[derive(Debug, Clone)]
pub struct Writer {
    store: Store,
    catalog: CatalogHandle,
    clock: Arc<dyn Clock>,
}

type Result<T> = std::result::Result<T, StoreError>;

impl Writer {
    pub fn new(store: Store, catalog: CatalogHandle, clock: Arc<dyn Clock>) -> Writer {
        Writer { store, catalog, clock }
    }

    fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Creates or updates a user; false when the name belongs to a deleted user.
    pub async fn put_user(&self, user: &User) -> Result<bool> {
        self.store.put_user(user, self.now_ms()).await
    }

    /// Records a new token (its hash) for a user.
    pub async fn add_token(&self, hash: &str, user: &str, label: &str) -> Result<()> {
        self.store.add_token(hash, user, label, self.now_ms()).await
    }

    /// Records that a token was used now.
    pub async fn touch_token(&self, hash: &str) -> Result<()> {
        self.store.touch_token(hash, self.now_ms()).await
    }

    /// Revokes a user's token by its id; false when the user has no such token.
    pub async fn revoke_token(&self, user: &str, id: &str) -> Result<bool> {
        self.store.revoke_token(user, id).await
    }

    /// Sets one of a user's TaskEnv variables (a hidden value sealed by the caller, bound to the user).
    pub async fn put_task_env(&self, user: &str, var: &TaskEnvVar) -> Result<()> {
        self.store.put_task_env(user, var).await
    }

    /// Removes one of a user's TaskEnv variables; false when there was none.
    pub async fn delete_task_env(&self, user: &str, name: &str) -> Result<bool> {
        self.store.delete_task_env(user, name).await
    }

    /// Replaces a user's own alarm subscriptions (checked by the caller).
    pub async fn put_user_alarms(&self, user: &str, subscriptions: &[AlarmSubscription]) -> Result<()> {
        let text = serde_json::to_string(subscriptions).expect("alarm subscriptions always serialise");
        self.store.put_setting(&crate::alarms::user_setting(user), &text, self.now_ms()).await
    }

    /// Shares a task with a user (view, or view and operate).
    pub async fn share(&self, task_id: &str, user: &str, operate: bool) -> Result<()> {
        self.store.share(task_id, user, operate).await
    }

    /// Takes a share back; false when the task was not shared with the user.
    pub async fn unshare(&self, task_id: &str, user: &str) -> Result<bool> {
        self.store.unshare(task_id, user).await
    }

    /// Puts `catalog` in force: stored first (as read, every field spelled out: what is in force does not
    /// depend on defaults), then handed to the control loop and every reader.
    pub async fn replace_catalog(&self, catalog: Catalog) -> Result<()> {
        let text = serde_json::to_string(&catalog).expect("a catalog always serialises");
        self.store.put_setting(CATALOG_SETTING, &text, self.now_ms()).await?;
        self.catalog.set(catalog);
        Ok(())
    }

    /// Stores one of the API's own settings (a JSON document the caller made).
    pub async fn put_setting(&self, name: &str, text: &str) -> Result<()> {
        self.store.put_setting(name, text, self.now_ms()).await
    }

    /// Sets a registry's login (sealed by [`registry_logins::seal`]).
    pub async fn put_registry_login(&self, host: &str, login: registry_logins::Stored) -> Result<()> {
        registry_logins::put(&self.store, host, login, self.now_ms()).await
    }

    /// Removes a registry's login; false when it had none.
    pub async fn remove_registry_login(&self, host: &str) -> Result<bool> {
        registry_logins::remove(&self.store, host, self.now_ms()).await
    }

    /// Re-seals, bound to their records, the hidden values an earlier version sealed without a binding (see
    /// [`crate::secrets::reseal_legacy`]).
    pub async fn reseal_legacy(&self, secrets: &SecretBox) -> Result<Resealed> {
        crate::secrets::reseal_legacy(&self.store, secrets, self.now_ms()).await
    }
}
