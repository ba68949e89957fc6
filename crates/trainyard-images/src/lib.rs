//! OCI images on one machine, for the local backend.
//!
//! [`Images`] pulls images by reference from the registries an admin allows (mirrors first, TLS with the
//! system's authorities plus the admin's bundle, plain HTTP only where marked insecure, basic credentials),
//! keeps their layers content-addressed and verified, and unpacks each image once into a read-only root file
//! system shared by every task that runs it ([`store`], [`unpack`]). Pulls of one reference with the same
//! credentials at once share one download; progress and failures (in [`FailureClass`]es) are read with
//! [`Images::look`]. [`Images::gc`]
//! keeps the cache under a size limit, least recently used first, never removing an image in use.
//!
//! Pulls run on a thread of their own with a small async runtime (the registry client is async); unpacking
//! runs on its blocking pool. Callers never block on a pull.

pub mod error;
mod guard;
mod pull;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
pub mod unpack;

pub use error::{FailureClass, PullError};
pub use store::{Accounts, Cached, ImageConfig, Meta, Store, Unpack};

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use trainyard_core::catalog::Registry;

/// Basic credentials for one registry (opened from their sealed form just for the pull).
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credential({}, ****)", self.username)
    }
}

/// How to reach registries: the catalog's settings, and credentials by registry host.
#[derive(Debug, Clone, Default)]
pub struct Access {
    pub registries: BTreeMap<String, Registry>,
    pub credentials: BTreeMap<String, Credential>,
}

impl Access {
    /// Who asks, as far as a registry can tell: a SHA-256 over every credential (host, user name, password),
    /// the same for no credentials at all. A pull is shared, and its result answers from memory, only among
    /// requests with the same identity: one made with a login never answers a request without it (or with
    /// another), which must ask the registry itself.
    fn identity(&self) -> String {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        for (host, c) in &self.credentials {
            for part in [host, &c.username, &c.password] {
                h.update((part.len() as u64).to_le_bytes());
                h.update(part.as_bytes());
            }
        }
        format!("{:x}", h.finalize())
    }
}

/// An image ready to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The manifest's digest.
    pub digest: String,
    /// The reference it was asked for, canonical.
    pub reference: String,
    /// Its root file system (read-only to replicas).
    pub rootfs: PathBuf,
    pub config: ImageConfig,
    /// Its `/etc/passwd` and `/etc/group`, as read when it was unpacked.
    pub accounts: Accounts,
}

impl Image {
    fn of(store: &Store, meta: Meta, reference: String) -> Image {
        Image {
            rootfs: store.rootfs(&meta.digest),
            digest: meta.digest,
            reference,
            config: meta.config,
            accounts: meta.accounts.unwrap_or_default(),
        }
    }

    /// `repository@digest` of the reference asked for: what later attempts of the same task pull.
    pub fn pinned(&self) -> String {
        match trainyard_core::image_ref::ImageRef::parse(&self.reference) {
            Ok(r) => r.pinned(&self.digest).to_string(),
            Err(_) => self.reference.clone(),
        }
    }
}

/// Where a pull is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    Resolving = 0,
    Downloading = 1,
    Unpacking = 2,
}

/// What a look at a pull finds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Look {
    /// Never asked for (or forgotten).
    Unknown,
    Pulling {
        phase: Phase,
        done: u64,
        total: u64,
    },
    Ready(Image),
    Failed(PullError),
}

#[derive(Debug)]
enum State {
    Pulling,
    Ready(Image, std::time::Instant),
    Failed(PullError, std::time::Instant),
}

/// One pull in flight (or its result), shared by everyone who asked for the reference with the same access.
#[derive(Debug)]
pub(crate) struct Slot {
    state: Mutex<State>,
    phase: AtomicU8,
    pub(crate) done: AtomicU64,
    pub(crate) total: AtomicU64,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            state: Mutex::new(State::Pulling),
            phase: AtomicU8::new(Phase::Resolving as u8),
            done: AtomicU64::new(0),
            total: AtomicU64::new(0),
        }
    }
    pub(crate) fn set_phase(&self, p: Phase) {
        self.phase.store(p as u8, Ordering::Relaxed);
    }
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn look(&self) -> Look {
        match &*self.state() {
            State::Pulling => Look::Pulling {
                phase: match self.phase.load(Ordering::Relaxed) {
                    0 => Phase::Resolving,
                    1 => Phase::Downloading,
                    _ => Phase::Unpacking,
                },
                done: self.done.load(Ordering::Relaxed),
                total: self.total.load(Ordering::Relaxed),
            },
            State::Ready(i, _) => Look::Ready(i.clone()),
            State::Failed(e, _) => Look::Failed(e.clone()),
        }
    }
}

/// How long a finished pull answers for its reference and access before the next request asks the registry
/// again (a tag may move; a digest found in the cache costs one manifest request). Only requests with the
/// same credentials are answered so ([`Access::identity`]): a changed or removed login asks at once.
const READY_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// How long a failed pull's answer is kept for [`Images::look`] when nobody starts it again (a task that
/// ended, a reference typed once): the map of pulls holds what is in flight and recent, not every reference
/// ever asked for.
const FAILED_FOR: std::time::Duration = std::time::Duration::from_secs(600);

/// Drops the pulls whose answers no longer serve: finished ones past [`READY_FOR`] (the next start asks the
/// registry anyway) and failed ones past [`FAILED_FOR`].
fn forget_old(pulls: &mut HashMap<String, Arc<Slot>>) {
    pulls.retain(|_, s| match &*s.state() {
        State::Pulling => true,
        State::Ready(_, at) => at.elapsed() < READY_FOR,
        State::Failed(_, at) => at.elapsed() < FAILED_FOR,
    });
}

type Job = Box<dyn FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send>;

/// The image cache and its pulls.
#[derive(Debug, Clone)]
pub struct Images {
    store: Store,
    pulls: Arc<Mutex<HashMap<String, Arc<Slot>>>>,
    jobs: tokio::sync::mpsc::UnboundedSender<Job>,
}

/// What a collection did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Collected {
    /// Digests of the images removed.
    pub removed: Vec<String>,
    pub freed_bytes: u64,
    /// What the cache holds after it.
    pub bytes: u64,
}

impl Images {
    /// Opens the cache under `dir`; `passage_gid`: the group of the sandboxes' users, who must reach the root
    /// file systems.
    pub fn open(dir: &Path, passage_gid: Option<u32>) -> std::io::Result<Images> {
        Images::open_with(dir, passage_gid, Unpack::default())
    }

    /// [`Images::open`], unpacking as `unpack` says (the uid, the bounds).
    pub fn open_with(dir: &Path, passage_gid: Option<u32>, unpack: Unpack) -> std::io::Result<Images> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut store = Store::open(dir, passage_gid)?;
        store.unpack = unpack;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Job>();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        std::thread::Builder::new().name("image-pulls".into()).spawn(move || {
            rt.block_on(async move {
                while let Some(job) = rx.recv().await {
                    tokio::spawn(job());
                }
            })
        })?;
        Ok(Images { store, pulls: Arc::new(Mutex::new(HashMap::new())), jobs: tx })
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    fn pulls(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        self.pulls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The key a reference's pull goes by: its canonical form (the text itself when it does not parse, so that
    /// the pull fails with the parser's words) and the identity of the access it is pulled with.
    fn key(reference: &str, access: &Access) -> String {
        let reference = trainyard_core::image_ref::ImageRef::parse(reference)
            .map_or_else(|_| reference.to_owned(), |r| r.to_string());
        format!("{reference} {}", access.identity())
    }

    /// Starts pulling `reference` with `access`, or joins the pull of it with the same credentials under way.
    /// A failed pull is started again; a finished one answers for a while ([`READY_FOR`]), then the registry is
    /// asked again. The image cache on disk answers only after the registry gave this access the manifest.
    pub fn start(&self, reference: &str, access: &Access) {
        let key = Self::key(reference, access);
        let mut pulls = self.pulls();
        forget_old(&mut pulls);
        if let Some(s) = pulls.get(&key) {
            match &*s.state() {
                State::Pulling => return,
                State::Ready(_, at) if at.elapsed() < READY_FOR => return,
                _ => {}
            }
        }
        let slot = Arc::new(Slot::new());
        pulls.insert(key.clone(), slot.clone());
        drop(pulls);
        let (store, reference, access) = (self.store.clone(), reference.to_owned(), access.clone());
        let job: Job = Box::new(move || {
            Box::pin(async move {
                let result = pull::pull(&store, &reference, &access, &slot).await;
                *slot.state() = match result {
                    Ok(image) => State::Ready(image, std::time::Instant::now()),
                    Err(e) => State::Failed(e, std::time::Instant::now()),
                };
            })
        });
        if let Err(e) = self.jobs.send(job) {
            // The pull thread is gone (it never ends while the cache is open): the job fails here instead.
            let _ = e;
            if let Some(s) = self.pulls().get(&key) {
                *s.state() = State::Failed(
                    PullError::new(FailureClass::Invalid, "the image pull thread stopped"),
                    std::time::Instant::now(),
                );
            }
        }
    }

    /// Where the pull of `reference` with `access` is (the access [`Images::start`] was given).
    pub fn look(&self, reference: &str, access: &Access) -> Look {
        self.pulls().get(&Self::key(reference, access)).map_or(Look::Unknown, |s| s.look())
    }

    /// The images in the cache, most recently used first.
    pub fn cached(&self) -> Vec<Cached> {
        let all = self.store.all();
        let mut users: HashMap<&str, usize> = HashMap::new();
        for m in &all {
            for l in &m.layers {
                *users.entry(l.as_str()).or_default() += 1;
            }
        }
        let mut out: Vec<Cached> = all
            .iter()
            .map(|m| Cached {
                digest: m.digest.clone(),
                references: m.references.clone(),
                bytes: m.rootfs_bytes
                    + m.layers
                        .iter()
                        .filter(|l| users.get(l.as_str()) == Some(&1))
                        .map(|l| self.store.blob_bytes(l))
                        .sum::<u64>(),
                last_used_ms: self.store.last_used_ms(&m.digest),
                pulled_ms: m.pulled_ms,
            })
            .collect();
        out.sort_by_key(|c| std::cmp::Reverse(c.last_used_ms));
        out
    }

    /// Bytes the cache holds: root file systems and blobs.
    pub fn bytes(&self) -> u64 {
        let roots: u64 = self.store.all().iter().map(|m| m.rootfs_bytes).sum();
        roots + self.store.blobs().iter().map(|b| self.store.blob_bytes(b)).sum::<u64>()
    }

    /// Removes least recently used images until the cache holds at most `max_bytes`, never one whose digest is
    /// in `in_use` or whose pull is under way; then the blobs no remaining image has. `max_bytes` 0 prunes
    /// everything not in use.
    pub fn gc(&self, max_bytes: u64, in_use: &BTreeSet<String>) -> Collected {
        // While a pull is under way its fetched layers are not yet any image's: loose blobs stay then.
        let busy: bool = self.pulls().values().any(|s| matches!(&*s.state(), State::Pulling));
        let mut all = self.store.all();
        all.sort_by_key(|m| self.store.last_used_ms(&m.digest));
        let mut users: HashMap<String, usize> = HashMap::new();
        for m in &all {
            for l in m.layers.iter().collect::<BTreeSet<_>>() {
                *users.entry(l.clone()).or_default() += 1;
            }
        }
        let mut out = Collected::default();
        let mut bytes = self.bytes();
        if !busy {
            for b in self.store.blobs() {
                if !users.contains_key(&b) {
                    let n = self.store.blob_bytes(&b);
                    if std::fs::remove_file(self.store.blob(&b)).is_ok() {
                        out.freed_bytes += n;
                        bytes = bytes.saturating_sub(n);
                    }
                }
            }
        }
        for m in &all {
            if bytes <= max_bytes {
                break;
            }
            if in_use.contains(&m.digest) || self.store.remove_image(&m.digest).is_err() {
                continue;
            }
            out.removed.push(m.digest.clone());
            let mut freed = m.rootfs_bytes;
            for l in m.layers.iter().collect::<BTreeSet<_>>() {
                let n = users.get_mut(l.as_str()).map(|n| {
                    *n -= 1;
                    *n
                });
                if n == Some(0) {
                    let b = self.store.blob_bytes(l);
                    if std::fs::remove_file(self.store.blob(l)).is_ok() {
                        freed += b;
                    }
                }
            }
            out.freed_bytes += freed;
            bytes = bytes.saturating_sub(freed);
        }
        // Pulls that answered with a removed image ask again.
        self.pulls()
            .retain(|_, s| !matches!(&*s.state(), State::Ready(i, _) if out.removed.contains(&i.digest)));
        out.bytes = self.bytes();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn the_pulls_map_keeps_what_is_in_flight_and_recent_only() {
        let slot = |state: State| {
            let s = Arc::new(Slot::new());
            *s.state() = state;
            s
        };
        let ago = |secs: u64| Instant::now().checked_sub(Duration::from_secs(secs)).unwrap();
        let failed = |at| State::Failed(PullError::new(FailureClass::NotFound, "no such image"), at);
        let mut pulls: HashMap<String, Arc<Slot>> = HashMap::new();
        pulls.insert("pulling".into(), slot(State::Pulling));
        pulls.insert("failed-now".into(), slot(failed(Instant::now())));
        pulls.insert("failed-long-ago".into(), slot(failed(ago(FAILED_FOR.as_secs() + 1))));
        // Thousands of references typed once and failed: gone once old.
        for i in 0..5000 {
            pulls.insert(format!("typo-{i}"), slot(failed(ago(FAILED_FOR.as_secs() + 5))));
        }
        forget_old(&mut pulls);
        let mut left: Vec<&String> = pulls.keys().collect();
        left.sort();
        assert_eq!(left, ["failed-now", "pulling"]);
    }
}
