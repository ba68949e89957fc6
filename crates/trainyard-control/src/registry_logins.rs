//! Registry credentials: an admin sets a user name and password per registry host; the password is sealed
//! under the server key (bound to the host and user name, like hidden env values) before it is stored, and
//! opened only to hand a launch of a task whose image comes from that registry (or one of its mirrors) to
//! the backend. Nothing answers with a password.
//!
//! A login serves only the references its admin allows ([`granted`]): the catalog's image presets offered to
//! the task's project group, and any image of its registry for the project groups the login itself names.
//! Any other task pulls anonymously, so a member who types another group's private reference is refused by
//! the registry.

use crate::secrets::{Binding, SecretBox};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use trainyard_core::Catalog;
use trainyard_core::catalog::ClusterScoped;
use trainyard_core::image_ref::ImageRef;
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
    /// Project groups whose tasks may pull any image of this registry with it; empty: only the catalog's
    /// image presets of this registry, for the groups each is offered to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub project_groups: Vec<String>,
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
    project_groups: Vec<String>,
    now_ms: i64,
) -> std::io::Result<Stored> {
    let password = secrets.seal_value(password, &Binding::Registry { host, username })?;
    Ok(Stored { username: username.to_owned(), password, updated_at_ms: now_ms, project_groups })
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

/// The opened logins a task of project group `group` running `image` may pull with ([`granted`]). A password
/// that does not open (another server key) is left out: the pull then fails as unauthorized, which says what
/// to do.
pub async fn for_task(
    store: &Store,
    secrets: &SecretBox,
    catalog: &Catalog,
    image: &str,
    group: &str,
) -> Result<BTreeMap<String, RegistryLogin>, StoreError> {
    if hosts_of(image, catalog).is_empty() {
        return Ok(BTreeMap::new());
    }
    let logins = all(store).await?;
    Ok(granted(image, group, catalog, &logins)
        .into_iter()
        .filter_map(|h| {
            let s = &logins[&h];
            let password = secrets
                .open_value(&s.password, &Binding::Registry { host: &h, username: &s.username })
                .ok()?;
            Some((h, RegistryLogin { username: s.username.clone(), password }))
        })
        .collect())
}

/// The hosts whose login a task of project group `group` running `image` gets: of the registry hosts its image
/// may come from ([`hosts_of`]), each that has a login, when the image is a catalog image preset offered to
/// the group ([`offered_preset`]) or the login names the group. Everything else pulls anonymously.
pub fn granted(
    image: &str,
    group: &str,
    catalog: &Catalog,
    logins: &BTreeMap<String, Stored>,
) -> Vec<String> {
    let preset = offered_preset(image, group, catalog);
    hosts_of(image, catalog)
        .into_iter()
        .filter(|h| logins.get(h).is_some_and(|l| preset || l.project_groups.iter().any(|g| g == group)))
        .collect()
}

/// Whether `image` is a catalog image preset with a registry reference that is offered to `group`: named by
/// the preset's name, or by the very reference of such a preset (the same canonical form). A preset named
/// but not offered to the group is not one, whatever other presets share its reference.
fn offered_preset(image: &str, group: &str, catalog: &Catalog) -> bool {
    if let Some(i) = catalog.images.get(image) {
        return i.reference.is_some() && i.offered_to(group);
    }
    let canonical = |r: &str| ImageRef::parse(r).ok().map(|r| r.to_string());
    let Some(wanted) = canonical(image) else { return false };
    catalog.images.values().any(|i| {
        i.rootfs.is_none()
            && i.offered_to(group)
            && i.reference.as_deref().and_then(canonical).is_some_and(|r| r == wanted)
    })
}

/// The registry hosts a task's image may be pulled from: its registry and that registry's mirrors (none for
/// `host` and images with a root file system here).
pub fn hosts_of(image: &str, catalog: &Catalog) -> Vec<String> {
    let reference = match catalog.images.get(image) {
        Some(i) if i.rootfs.is_some() => return Vec::new(),
        Some(i) => match &i.reference {
            Some(r) => r.as_str(),
            None => return Vec::new(),
        },
        None if image == trainyard_core::catalog::HOST_IMAGE => return Vec::new(),
        None => image,
    };
    let Ok(r) = ImageRef::parse(reference) else { return Vec::new() };
    let mut hosts: Vec<String> =
        catalog.registries.get(&r.registry).map(|x| x.mirrors.clone()).unwrap_or_default();
    hosts.push(r.registry);
    hosts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Group a's private preset and a preset for every group on `reg.example` (mirrored by
    /// `mirror.example`), b's preset on `other.example`, and logins for each of those hosts: `reg.example`'s
    /// and `mirror.example`'s for presets only, `other.example`'s naming group b.
    fn catalog_and_logins() -> (Catalog, BTreeMap<String, Stored>) {
        let catalog = Catalog::from_yaml(
            r#"
projectGroups: {a: {}, b: {}, c: {}}
allowExternalImages: true
registries: {reg.example: {mirrors: [mirror.example]}, other.example: {}, free.example: {}}
images:
  host: {projectGroups: [a, b]}
  a-private: {reference: "reg.example/a/private:1", projectGroups: [a]}
  everyone: {reference: "reg.example/shared/base"}
  b-tools: {reference: "other.example/b/tools:2", projectGroups: [b]}
  local: {rootfs: /srv/images/local}
"#,
        )
        .unwrap();
        let login = |groups: &[&str]| Stored {
            username: "ci".into(),
            password: "sealed".into(),
            updated_at_ms: 0,
            project_groups: groups.iter().map(|g| g.to_string()).collect(),
        };
        let logins = BTreeMap::from([
            ("reg.example".to_owned(), login(&[])),
            ("mirror.example".to_owned(), login(&[])),
            ("other.example".to_owned(), login(&["b"])),
        ]);
        (catalog, logins)
    }

    fn check(image: &str, group: &str, expected: &[&str]) {
        let (catalog, logins) = catalog_and_logins();
        assert_eq!(granted(image, group, &catalog, &logins), expected, "{image} for group {group}");
    }

    #[test]
    fn a_login_serves_the_presets_offered_to_the_group_and_the_groups_it_names() {
        // The preset, by its name or its very reference, for the group it is offered to: the registry's and
        // its mirror's logins.
        check("a-private", "a", &["mirror.example", "reg.example"]);
        check("reg.example/a/private:1", "a", &["mirror.example", "reg.example"]);
        check("everyone", "c", &["mirror.example", "reg.example"]);
        check("reg.example/shared/base:latest", "c", &["mirror.example", "reg.example"]);
        // The attack: another group's preset, by name or by typing its reference, gets no login.
        check("a-private", "b", &[]);
        check("reg.example/a/private:1", "b", &[]);
        // Another image of the same registry (another tag, a pinned digest, another repository): no preset.
        check("reg.example/a/private:2", "a", &[]);
        check(
            "reg.example/a/private:1@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "a",
            &[],
        );
        check("reg.example/a/other:1", "a", &[]);
        // A login that names a group serves any image of its registry for that group, and no other group.
        check("other.example/b/anything:9", "b", &["other.example"]);
        check("b-tools", "b", &["other.example"]);
        check("other.example/b/anything:9", "a", &[]);
        check("b-tools", "a", &[]);
        check("other.example/b/tools:2", "a", &[]);
        // No login for the registry, or nothing to pull.
        check("free.example/x:1", "a", &[]);
        check("host", "a", &[]);
        check("local", "a", &[]);
        check("not a reference", "a", &[]);
    }

    #[test]
    fn stored_logins_without_groups_read_as_before() {
        let old = r#"{"reg.example": {"username": "ci", "password": "x", "updatedAtMs": 5}}"#;
        let logins: BTreeMap<String, Stored> = serde_json::from_str(old).unwrap();
        assert!(logins["reg.example"].project_groups.is_empty());
        let text = serde_json::to_string(&logins).unwrap();
        assert!(!text.contains("projectGroups"), "{text}");
    }
}
