//! Registry credentials: an admin sets a user name and password per registry host; the password is sealed
//! under the server key (bound to the host and user name, like hidden env values) before it is stored, and
//! opened only to hand a launch of a task whose image comes from that registry (or one of its mirrors) to
//! the backend. Nothing answers with a password.

use crate::secrets::{Binding, SecretBox};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use trainyard_runtime::RegistryLogin;
use trainyard_store::{Store, StoreError};

/// The setting holding every registry's login.
pub const SETTING: &str = "registry-logins";

/// One registry's login as stored: the password sealed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stored {
    pub username: String,
    pub password: String,
    pub updated_at_ms: i64,
}

/// Every registry's login, by host.
pub async fn all(store: &Store) -> Result<BTreeMap<String, Stored>, StoreError> {
    Ok(store.get_setting(SETTING).await?.and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default())
}

async fn save(store: &Store, all: &BTreeMap<String, Stored>, now_ms: i64) -> Result<(), StoreError> {
    let text = serde_json::to_string(all).expect("logins always serialise");
    store.put_setting(SETTING, &text, now_ms).await
}

/// A login with its password sealed, bound to its host and user name.
pub fn seal(
    secrets: &SecretBox,
    host: &str,
    username: &str,
    password: &str,
    now_ms: i64,
) -> std::io::Result<Stored> {
    let password = secrets.seal_value(password, &Binding::Registry { host, username })?;
    Ok(Stored { username: username.to_owned(), password, updated_at_ms: now_ms })
}

/// Sets a registry's login (sealed by [`seal`]).
pub async fn put(store: &Store, host: &str, login: Stored, now_ms: i64) -> Result<(), StoreError> {
    let mut logins = all(store).await?;
    logins.insert(host.to_owned(), login);
    save(store, &logins, now_ms).await
}

/// Removes a registry's login; false when it had none.
pub async fn remove(store: &Store, host: &str, now_ms: i64) -> Result<bool, StoreError> {
    let mut logins = all(store).await?;
    if logins.remove(host).is_none() {
        return Ok(false);
    }
    save(store, &logins, now_ms).await?;
    Ok(true)
}

/// The opened logins of `hosts` that have one. A password that does not open (another server key) is left
/// out: the pull then fails as unauthorized, which says what to do.
pub async fn open_for(
    store: &Store,
    secrets: &SecretBox,
    hosts: &[String],
) -> Result<BTreeMap<String, RegistryLogin>, StoreError> {
    if hosts.is_empty() {
        return Ok(BTreeMap::new());
    }
    let logins = all(store).await?;
    Ok(hosts
        .iter()
        .filter_map(|h| {
            let s = logins.get(h)?;
            let password = secrets
                .open_value(&s.password, &Binding::Registry { host: h, username: &s.username })
                .ok()?;
            Some((h.clone(), RegistryLogin { username: s.username.clone(), password }))
        })
        .collect())
}

/// The registry hosts a task's image may be pulled from: its registry and that registry's mirrors (none for
/// `host` and images with a root file system here).
pub fn hosts_of(image: &str, catalog: &trainyard_core::Catalog) -> Vec<String> {
    let reference = match catalog.images.get(image) {
        Some(i) if i.rootfs.is_some() => return Vec::new(),
        Some(i) => match &i.reference {
            Some(r) => r.as_str(),
            None => return Vec::new(),
        },
        None if image == trainyard_core::catalog::HOST_IMAGE => return Vec::new(),
        None => image,
    };
    let Ok(r) = trainyard_core::image_ref::ImageRef::parse(reference) else { return Vec::new() };
    let mut hosts: Vec<String> =
        catalog.registries.get(&r.registry).map(|x| x.mirrors.clone()).unwrap_or_default();
    hosts.push(r.registry);
    hosts
}
