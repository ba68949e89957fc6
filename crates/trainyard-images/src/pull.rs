//! One pull: the reference resolved to a manifest (through the registry's mirrors first), the missing layers
//! fetched and verified into the blob store, then unpacked in order into a new root file system and moved
//! into the cache whole.

use crate::error::{FailureClass, PullError, classify};
use crate::store::{Accounts, ImageConfig, Meta, Store, has_bash, no_bash, now_ms};
use crate::{Access, Image, Phase, Slot};
use futures_util::StreamExt;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::Digest;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use trainyard_core::image_ref::ImageRef;

/// Layers fetched at once.
const PARALLEL_LAYERS: usize = 3;

/// Layer media types this machine unpacks (tar, plain or gzip).
const LAYER_TYPES: &[&str] = &[
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
];

/// The registry client for these settings: TLS with the system's authorities plus the admin's bundles,
/// plain HTTP only for registries marked insecure; every connection through `guard` (a proxy URL) when
/// given (see [`crate::guard`]).
fn client(access: &Access, guard: Option<&str>) -> Result<Client, PullError> {
    let mut insecure = Vec::new();
    let mut roots = Vec::new();
    for (host, r) in &access.registries {
        if r.insecure {
            insecure.push(host.clone());
        }
        if let Some(path) = &r.ca_bundle {
            let data = std::fs::read(path).map_err(|e| {
                PullError::new(
                    FailureClass::Unreachable,
                    format!("the CA bundle {path} configured for registry {host} cannot be read: {e}"),
                )
            })?;
            roots.push(Certificate { encoding: CertificateEncoding::Pem, data });
        }
    }
    let config = ClientConfig {
        protocol: ClientProtocol::HttpsExcept(insecure),
        extra_root_certificates: roots,
        platform_resolver: Some(Box::new(oci_client::client::linux_amd64_resolver)),
        connect_timeout: Some(std::time::Duration::from_secs(10)),
        read_timeout: Some(std::time::Duration::from_secs(60)),
        user_agent: concat!("trainyard/", env!("CARGO_PKG_VERSION")),
        max_concurrent_download: PARALLEL_LAYERS,
        http_proxy: guard.map(str::to_owned),
        https_proxy: guard.map(str::to_owned),
        ..ClientConfig::default()
    };
    Ok(Client::new(config))
}

fn auth(access: &Access, host: &str) -> RegistryAuth {
    match access.credentials.get(host) {
        Some(c) => RegistryAuth::Basic(c.username.clone(), c.password.clone()),
        None => RegistryAuth::Anonymous,
    }
}

/// `r` at `host` (the registry itself or one of its mirrors).
fn at(r: &ImageRef, host: &str) -> Reference {
    match (&r.digest, &r.tag) {
        (Some(d), _) => Reference::with_digest(host.to_owned(), r.repository.clone(), d.clone()),
        (None, t) => Reference::with_tag(
            host.to_owned(),
            r.repository.clone(),
            t.clone().unwrap_or_else(|| trainyard_core::image_ref::DEFAULT_TAG.to_owned()),
        ),
    }
}

/// Pulls `reference` into the cache (or finds it there) and returns the image.
pub(crate) async fn pull(
    store: &Store,
    reference: &str,
    access: &Access,
    slot: &Slot,
) -> Result<Image, PullError> {
    let r = ImageRef::parse(reference)
        .map_err(|e| PullError::new(FailureClass::Invalid, format!("image reference {reference:?}: {e}")))?;
    let shown = r.to_string();
    let mut hosts: Vec<String> =
        access.registries.get(&r.registry).map(|x| x.mirrors.clone()).unwrap_or_default();
    hosts.push(r.registry.clone());
    // A registry the catalog does not list is reached on a member's behalf only at a public address: not this
    // machine, its networks or the cloud's metadata service (the webhooks' rules). Checked here for a clear
    // answer, and on every connection the pull makes (the guard: the name resolved again, a token realm, a
    // redirect).
    let listed = access.registries.contains_key(&r.registry);
    if !listed && let Some(why) = internal_host(&r.registry).await {
        return Err(PullError::new(
            FailureClass::Invalid,
            format!(
                "pulling {shown}: registry {} is {why}; registries on this machine or its networks are pulled \
                 from only when an admin lists them in the catalog's registries",
                r.registry
            ),
        ));
    }
    let guard = match listed {
        true => None,
        false => Some(crate::guard::Guard::start(crate::guard::public_only()).await.map_err(|e| {
            PullError::io(&format!("pulling {shown}: starting the pull's address guard"), &e)
        })?),
    };
    let client = client(access, guard.as_ref().map(|g| g.url.as_str()))?;
    let pulled = pull_from(store, &r, &shown, &hosts, access, &client, slot).await;
    // A connection the guard refused says why the pull failed better than the client's error does.
    match (pulled, guard.map(|g| g.refused()).unwrap_or_default().first()) {
        (Err(_), Some(why)) => Err(PullError::new(
            FailureClass::Invalid,
            format!(
                "pulling {shown}: the registry led the pull to {why}; registries on this machine or its networks \
                 are pulled from only when an admin lists them in the catalog's registries"
            ),
        )),
        (pulled, _) => pulled,
    }
}

/// The pull itself, from the first of `hosts` (mirrors, then the registry) that has the manifest.
async fn pull_from(
    store: &Store,
    r: &ImageRef,
    shown: &str,
    hosts: &[String],
    access: &Access,
    client: &Client,
    slot: &Slot,
) -> Result<Image, PullError> {
    let shown = shown.to_owned();
    // The manifest, from the first source that has it.
    let mut found = None;
    let mut last_err = None;
    for host in hosts {
        let reference = at(r, host);
        let auth = auth(access, host);
        match client.pull_manifest_and_config_and_list_digest(&reference, &auth).await {
            Ok(m) => {
                found = Some((reference, m));
                break;
            }
            Err(e) => last_err = Some(classify(&shown, &e)),
        }
    }
    let Some((source, (manifest, digest, config_text, list_digest))) = found else {
        return Err(
            last_err.unwrap_or_else(|| PullError::new(FailureClass::Invalid, "no registry to pull from"))
        );
    };
    if let Some(pinned) = &r.digest
        && *pinned != digest
        && list_digest.as_deref() != Some(pinned.as_str())
    {
        return Err(PullError::new(
            FailureClass::DigestMismatch,
            format!("pulling {shown}: the registry answered with manifest {digest}, not the pinned {pinned}"),
        ));
    }
    let config =
        ImageConfig::from_config_json(&config_text).map_err(|e| PullError::new(FailureClass::Invalid, e))?;
    if let Some(mut meta) = store.meta(&digest) {
        store.touch(&digest, Some(&shown));
        if !meta.bash {
            return Err(no_bash(&shown));
        }
        if meta.accounts.is_none() {
            // Unpacked before the accounts were kept: read them now, off this runtime's thread.
            let rootfs = store.rootfs(&digest);
            let read = tokio::task::spawn_blocking(move || Accounts::read(&rootfs)).await;
            let accounts = read.map_err(|e| e.to_string()).and_then(|r| r).map_err(|e| {
                PullError::new(FailureClass::Invalid, format!("image {shown} cannot run here: {e}"))
            })?;
            meta.accounts = Some(accounts);
        }
        return Ok(Image::of(store, meta, shown));
    }
    for l in &manifest.layers {
        if !LAYER_TYPES.contains(&l.media_type.as_str()) {
            let hint = if l.media_type.contains("zstd") { " (push it with gzip layers)" } else { "" };
            return Err(PullError::new(
                FailureClass::Invalid,
                format!(
                    "image {shown} has a layer of type {}, which this machine cannot unpack{hint}",
                    l.media_type
                ),
            ));
        }
    }
    // What the manifest says the layers weigh, checked before anything is fetched (and each layer's bytes
    // against its own figure as they arrive).
    let declared: u64 = manifest.layers.iter().map(|l| l.size.max(0) as u64).sum();
    if manifest.layers.iter().any(|l| l.size < 0) {
        return Err(PullError::new(
            FailureClass::Invalid,
            format!("image {shown}: a layer of negative size"),
        ));
    }
    if let Some(max) = store.unpack.cache_max_bytes
        && declared > max
    {
        return Err(PullError::new(
            FailureClass::TooLarge,
            format!(
                "image {shown}: its layers weigh {declared} bytes, more than the image cache holds ({max} bytes); \
                 ask an admin to raise the cache's size"
            ),
        ));
    }
    // The layers not in the blob store yet.
    let missing: Vec<OciDescriptor> = {
        let mut seen = std::collections::BTreeSet::new();
        manifest
            .layers
            .iter()
            .filter(|l| !store.blob(&l.digest).exists() && seen.insert(l.digest.clone()))
            .cloned()
            .collect()
    };
    let to_fetch: u64 = missing.iter().map(|l| l.size.max(0) as u64).sum();
    // The disk must hold what is fetched beside the room it keeps free (unpacking checks again as it goes).
    if let Ok(fs) = rustix::fs::statvfs(&store.dir) {
        let free = fs.f_bavail.saturating_mul(fs.f_frsize);
        let reserve = store.unpack.limits.reserve_bytes;
        if to_fetch.saturating_add(reserve) > free {
            return Err(PullError::new(
                FailureClass::DiskFull,
                format!(
                    "pulling {shown}: its layers weigh {to_fetch} bytes and the image cache's disk has {free} \
                     free, {reserve} of which this machine keeps free: {}",
                    crate::unpack::NO_SPACE
                ),
            ));
        }
    }
    slot.total.store(to_fetch, Ordering::Relaxed);
    slot.set_phase(Phase::Downloading);
    let fetches: Vec<_> =
        missing.into_iter().map(|l| fetch(client, store, &source, l, slot, &shown)).collect();
    let fetched: Vec<Result<(), PullError>> =
        futures_util::stream::iter(fetches).buffer_unordered(PARALLEL_LAYERS).collect().await;
    fetched.into_iter().collect::<Result<Vec<()>, PullError>>()?;
    slot.set_phase(Phase::Unpacking);
    let layers: Vec<String> = manifest.layers.iter().map(|l| l.digest.clone()).collect();
    let (store2, shown2, digest2) = (store.clone(), shown.clone(), digest.clone());
    let meta = tokio::task::spawn_blocking(move || unpack(&store2, &shown2, &digest2, layers, config))
        .await
        .map_err(|e| PullError::new(FailureClass::Invalid, format!("unpacking {shown}: {e}")))??;
    if !meta.bash {
        return Err(no_bash(&shown));
    }
    Ok(Image::of(store, meta, shown))
}

/// How long a registry host's name may take to resolve for the address check.
const HOST_LOOKUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Why a registry host (`name[:port]`, `[v6]:port`) is not reached on a member's behalf, if any of its
/// addresses is restricted or this machine's own. A name that does not resolve is left to the pull (which
/// fails as unreachable).
async fn internal_host(registry: &str) -> Option<String> {
    let (host, port) = match registry.strip_prefix('[') {
        Some(v6) => {
            let (h, rest) = v6.split_once(']')?;
            (h.to_owned(), rest.strip_prefix(':').and_then(|p| p.parse().ok()).unwrap_or(443))
        }
        None => match registry.rsplit_once(':') {
            Some((h, p)) if p.parse::<u16>().is_ok() => (h.to_owned(), p.parse().unwrap_or(443)),
            _ => (registry.to_owned(), 443),
        },
    };
    let addrs: Vec<std::net::IpAddr> = match host.parse() {
        Ok(ip) => vec![ip],
        Err(_) => {
            match tokio::time::timeout(HOST_LOOKUP_TIMEOUT, tokio::net::lookup_host((host.as_str(), port)))
                .await
            {
                Ok(Ok(found)) => found.map(|a| a.ip()).collect(),
                _ => return None,
            }
        }
    };
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let own =
        trainyard_core::netaddr::own_addresses(&read("/proc/net/fib_trie"), &read("/proc/net/if_inet6"));
    let canonical = trainyard_core::netaddr::canonical;
    addrs.into_iter().find_map(|ip| match trainyard_core::netaddr::restricted(ip) {
        Some(what) => Some(format!("at {ip}, a {what} address")),
        None if own.iter().any(|o| canonical(*o) == canonical(ip)) => {
            Some(format!("at {ip}, this machine's own address"))
        }
        None => None,
    })
}

/// Fetches one layer into the blob store: written under `tmp/`, hashed as it arrives, renamed into place
/// only when its bytes are the digest's.
async fn fetch(
    client: &Client,
    store: &Store,
    source: &Reference,
    layer: OciDescriptor,
    slot: &Slot,
    shown: &str,
) -> Result<(), PullError> {
    let work = store.scratch("blob")?;
    let tmp = work.join("data");
    let file = tokio::fs::File::create(&tmp).await.map_err(|e| PullError::io("writing a layer", &e))?;
    let declared = layer.size.max(0) as u64;
    let mut w = Hashing { inner: file, hash: sha2::Sha256::new(), slot, bytes: 0, max: declared };
    let got = client.pull_blob(source, &layer, &mut w).await;
    let result = match got {
        Err(_) if w.bytes > declared => Err(PullError::new(
            FailureClass::Invalid,
            format!(
                "pulling {shown}: layer {} is larger than the {declared} bytes its manifest says; the download \
                 was stopped",
                layer.digest
            ),
        )),
        Err(e) => Err(classify(shown, &e)),
        Ok(()) if w.bytes != declared => Err(PullError::new(
            FailureClass::Invalid,
            format!(
                "pulling {shown}: layer {} is {} bytes, not the {declared} its manifest says",
                layer.digest, w.bytes
            ),
        )),
        Ok(()) => {
            let actual = format!("sha256:{:x}", w.hash.clone().finalize());
            if actual != layer.digest {
                Err(PullError::new(
                    FailureClass::DigestMismatch,
                    format!(
                        "pulling {shown}: layer {} arrived as {actual} ({} bytes): the registry served bytes that \
                         are not the image's; the pull is retried as the image pull tolerance allows",
                        layer.digest, w.bytes
                    ),
                ))
            } else {
                // On disk before it is visible under its digest: a power cut leaves no short blob there.
                match w.inner.sync_all().await {
                    Err(e) => Err(PullError::io("storing a layer", &e)),
                    Ok(()) => std::fs::rename(&tmp, store.blob(&layer.digest))
                        .map_err(|e| PullError::io("storing a layer", &e)),
                }
            }
        }
    };
    let _ = std::fs::remove_dir_all(&work);
    result
}

/// Applies the layers in order into a new root file system and moves the image into the cache. The layers
/// are opened here; the unpacking itself runs as the cache's unpacking uid (see [`crate::unpack`]).
fn unpack(
    store: &Store,
    shown: &str,
    digest: &str,
    layers: Vec<String>,
    config: ImageConfig,
) -> Result<Meta, PullError> {
    let work = store.scratch("image")?;
    let run = || -> Result<Meta, PullError> {
        let rootfs = work.join("rootfs");
        std::fs::create_dir(&rootfs).map_err(|e| PullError::io("making the root file system", &e))?;
        std::fs::set_permissions(&rootfs, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(|e| PullError::io("making the root file system", &e))?;
        let as_id = store.unpack.as_id;
        if let Some(id) = as_id {
            let id = (rustix::fs::Uid::from_raw(id), rustix::fs::Gid::from_raw(id));
            rustix::fs::chown(&rootfs, Some(id.0), Some(id.1))
                .map_err(|e| PullError::io("handing the root file system to the unpacking uid", &e.into()))?;
        }
        // Opened here (the unpacking uid cannot pass through the cache's private dirs to reach it).
        let root_fd = rustix::fs::open(
            &rootfs,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| PullError::io("opening the root file system", &e.into()))?;
        let limits = store.unpack.limits;
        let files = layers
            .iter()
            .map(|l| std::fs::File::open(store.blob(l)).map_err(|e| PullError::io("reading a layer", &e)))
            .collect::<Result<Vec<_>, _>>()?;
        let n = layers.len();
        let applied = crate::unpack::unprivileged(as_id, || {
            let mut unpacker = crate::unpack::Unpacker::at(root_fd, limits);
            for (i, (f, l)) in files.into_iter().zip(&layers).enumerate() {
                if let Err(e) = unpacker.apply(f) {
                    let class = if e.starts_with(crate::unpack::NO_SPACE) {
                        FailureClass::DiskFull
                    } else if e.starts_with(crate::unpack::TOO_LARGE) {
                        FailureClass::TooLarge
                    } else {
                        FailureClass::Invalid
                    };
                    return Err(PullError::new(
                        class,
                        format!("unpacking layer {} of {n} of {shown} ({l}): {e}", i + 1),
                    ));
                }
            }
            Ok(unpacker.total())
        })
        .map_err(|e| PullError::new(FailureClass::Invalid, format!("unpacking {shown}: {e}")))??;
        let accounts = Accounts::read(&rootfs).map_err(|e| {
            PullError::new(FailureClass::Invalid, format!("image {shown} cannot run here: {e}"))
        })?;
        let meta = Meta {
            digest: digest.to_owned(),
            references: vec![shown.to_owned()],
            layers: layers.clone(),
            config: config.clone(),
            rootfs_bytes: applied.bytes,
            bash: has_bash(&rootfs),
            pulled_ms: now_ms(),
            accounts: Some(accounts),
        };
        store.commit(&work, &meta)?;
        Ok(meta)
    };
    let out = run();
    if work.exists() {
        let _ = std::fs::remove_dir_all(&work);
    }
    out
}

/// A file writer that hashes what it writes and counts it into the pull's progress.
struct Hashing<'a> {
    inner: tokio::fs::File,
    hash: sha2::Sha256,
    slot: &'a Slot,
    bytes: u64,
    /// The layer's size as its manifest says: a byte past it stops the download.
    max: u64,
}

impl tokio::io::AsyncWrite for Hashing<'_> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if this.bytes.saturating_add(buf.len() as u64) > this.max {
            this.bytes = this.bytes.saturating_add(buf.len() as u64);
            return Poll::Ready(Err(std::io::Error::other("the layer is larger than its manifest says")));
        }
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                this.hash.update(&buf[..n]);
                this.bytes += n as u64;
                this.slot.done.fetch_add(n as u64, Ordering::Relaxed);
                Poll::Ready(Ok(n))
            }
            other => other,
        }
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registries_at_internal_addresses_are_named_as_such() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let check = |r: &str| rt.block_on(internal_host(r));
        for (r, what) in [
            ("127.0.0.1:5000", "loopback"),
            ("[::1]:5000", "loopback"),
            ("169.254.169.254", "link-local"),
            ("[64:ff9b::a9fe:a9fe]", "link-local"),
            ("10.0.0.1:443", "private"),
            ("localhost:5000", "loopback"),
        ] {
            let why = check(r).unwrap_or_else(|| panic!("{r} passed"));
            assert!(why.contains(what), "{r}: {why}");
        }
        for r in ["8.8.8.8", "93.184.216.34:5000", "[2606:4700::1111]:443"] {
            assert_eq!(check(r), None, "{r}");
        }
        // This machine's own addresses, whatever their range.
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        for own in
            trainyard_core::netaddr::own_addresses(&read("/proc/net/fib_trie"), &read("/proc/net/if_inet6"))
        {
            let r = match own {
                std::net::IpAddr::V4(a) => a.to_string(),
                std::net::IpAddr::V6(a) => format!("[{a}]"),
            };
            assert!(check(&r).is_some(), "{r} is this machine's");
        }
    }

    /// Every connection of a pull from a registry the catalog does not list goes through the guard, which
    /// resolves each host once and connects to the address it checked: a name that resolves again to an
    /// internal address (DNS rebinding), a token realm or a blob redirect to one, never reaches it.
    #[test]
    fn a_guarded_pull_connects_only_where_the_policy_allows_over_http_and_tls() {
        use crate::guard::{Guard, Policy};
        use crate::testing::{GZIP_LAYER, TestRegistry, files_layer, gzip};
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        for tls in [false, true] {
            let reg = TestRegistry::start(if tls { "guard-tls" } else { "guard-http" }, tls, false);
            let layer = gzip(&files_layer(&[("bin/bash", b"#!", 0o755)]));
            reg.push("team/app", "1", &[(GZIP_LAYER, layer)], serde_json::json!({}));
            let reference = Reference::with_tag(reg.host.clone(), "team/app".into(), "1".into());
            // The registry's own address allowed (the test's stand-in for a public one), counted.
            let checked = Arc::new(AtomicUsize::new(0));
            let seen = checked.clone();
            let allow: Policy = Arc::new(move |ip| {
                seen.fetch_add(1, Ordering::SeqCst);
                (!ip.is_loopback()).then(|| "not the test registry".to_owned())
            });
            let (ok, refused) = rt.block_on(async {
                let guard = Guard::start(allow).await.unwrap();
                let c = client(&reg.access(), Some(&guard.url)).unwrap();
                let got = c.pull_manifest_and_config(&reference, &RegistryAuth::Anonymous).await;
                (got.map(|_| ()), guard.refused())
            });
            assert!(ok.is_ok(), "tls {tls}: {ok:?}");
            assert!(refused.is_empty(), "{refused:?}");
            assert!(checked.load(Ordering::SeqCst) > 0, "tls {tls}: the pull went through the guard");
            // The rules for registries the catalog does not list: the registry is loopback, and nothing reaches
            // it, whatever the client's own lookup would say.
            let gets = reg.log().matches("/v2/team/app").count();
            let (failed, refused) = rt.block_on(async {
                let guard = Guard::start(crate::guard::public_only()).await.unwrap();
                let c = client(&reg.access(), Some(&guard.url)).unwrap();
                let got = c.pull_manifest_and_config(&reference, &RegistryAuth::Anonymous).await;
                (got.is_err(), guard.refused())
            });
            assert!(failed, "tls {tls}");
            assert!(
                refused.iter().any(|r| r.contains("127.0.0.1 is at 127.0.0.1, a loopback address")),
                "tls {tls}: {refused:?}"
            );
            assert_eq!(reg.log().matches("/v2/team/app").count(), gets, "tls {tls}: no request reached it");
        }
    }

    #[test]
    fn the_guard_refuses_names_that_resolve_inside_and_is_no_proxy_for_anything_else() {
        use crate::guard::Guard;
        use std::io::{Read, Write};
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let guard = rt.block_on(Guard::start(crate::guard::public_only())).unwrap();
        let proxy = guard.url.trim_start_matches("http://").to_owned();
        // Asked from a blocking thread while the guard's runtime runs.
        let ask = |req: &str| {
            let (proxy, req) = (proxy.clone(), req.to_owned());
            rt.block_on(async move {
                tokio::task::spawn_blocking(move || {
                    let mut c = std::net::TcpStream::connect(&proxy).unwrap();
                    c.write_all(req.as_bytes()).unwrap();
                    let mut out = String::new();
                    let _ = c.read_to_string(&mut out);
                    out
                })
                .await
                .unwrap()
            })
        };
        // A listener on this machine that must see nothing.
        let inside = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = inside.local_addr().unwrap().port();
        inside.set_nonblocking(true).unwrap();
        for req in [
            format!("CONNECT localhost:{port} HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n"),
            format!("GET http://127.0.0.1:{port}/v2/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"),
            format!("GET http://[::ffff:127.0.0.1]:{port}/ HTTP/1.1\r\n\r\n"),
            "CONNECT 169.254.169.254:80 HTTP/1.1\r\n\r\n".to_owned(),
        ] {
            let out = ask(&req);
            assert!(out.starts_with("HTTP/1.1 403"), "{req}: {out}");
        }
        assert!(inside.accept().is_err(), "no connection reached the listener");
        let refused = guard.refused();
        assert!(
            refused.iter().any(|r| r.starts_with("localhost is at 127.0.0.1, a loopback")),
            "{refused:?}"
        );
        assert!(refused.iter().any(|r| r.contains("169.254.169.254, a link-local")), "{refused:?}");
        assert_eq!(refused.len(), 4, "{refused:?}");
        // Not a proxy for anything else: a request that is neither `CONNECT` nor absolute `http`.
        assert!(ask("GET /etc/passwd HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 400"));
    }
}
