//! The Kubernetes backend: each attempt is one PyTorchJob (Kubeflow training operator) or RayJob (KubeRay)
//! object, written with server-side apply, and read back through watches, never polling loops.
//!
//! - `launch` records the attempt and returns; its objects are applied off the caller's path (a bounded
//!   number at once), retried with backoff when the API server is unavailable, and an attempt whose objects
//!   the server refuses (its CRD validation, a missing CRD) ends as a failure that names the server's reason.
//! - Watches on the jobs, their pods and the nodes keep [`State`]; `poll` reads the attempts they touched.
//! - Stateless: every object is named from its attempt and labelled, so a restarted server lists them and
//!   reattaches, and a repeated apply changes nothing.

use super::capture::{self, PodNow, Target, Telemetry};
use super::objects::{self, AttemptObjects, KubeSettings};
use super::state::{self, Attempt, Cleanup, State};
use super::status::JobKind;
use super::views::{self, JobSettings};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use trainyard_core::lifecycle::Reason;
use trainyard_runtime::archive::Archive;
use trainyard_runtime::{
    AttemptKey, Backend, BackendError, LaunchSpec, LogChunk, MetricPoint, Observation, StopCause,
};

/// The field manager of every apply.
pub const FIELD_MANAGER: &str = "trainyard";
/// Writes in flight at once (launches, stops, deletions): the API server's own limit is a few hundred.
const MAX_WRITES: usize = 64;
/// Tries of one launch before it fails as `LaunchFailed` (the control loop then retries the task).
const LAUNCH_TRIES: u32 = 5;

/// How the backend reaches its cluster and lays out its objects (`trainyard up --backend kubernetes`).
#[derive(Debug, Clone)]
pub struct KubeConfig {
    /// A kubeconfig file; None: `KUBECONFIG`, `~/.kube/config`, or the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (the catalog cluster's); None: the file's current one.
    pub context: Option<String>,
    /// The namespace of a project group's attempts; `{group}` is replaced by the group's name.
    pub namespace: String,
    /// This server's name among the Trainyard servers using the cluster: it labels its objects and watches
    /// only those.
    pub instance: String,
    /// Cluster-side gang admission (Volcano or Kueue), off by default: Trainyard admits.
    pub gang: objects::Gang,
    /// Catalog image name -> the OCI reference the cluster pulls; a name not listed is pulled as it is.
    pub images: BTreeMap<String, String>,
    /// Seconds between SIGTERM and SIGKILL at a stop (after the exit checkpoint, when there is one).
    pub grace_s: u64,
    /// Seconds a node may stay NotReady before the attempts on it fail as `NodeFailed` (a deleted node fails
    /// them at once). The node was already silent for the cluster's own grace before it was called NotReady.
    pub node_grace_s: u64,
    /// Seconds an attempt's pods may take, from its job's creation, to be all running (as Kueue's
    /// `waitForPodsReady`); past it the attempt ends with the cluster's reason (unschedulable, a claim that does
    /// not exist, Pod Security, a container that cannot be made), its quota freed. 0: no deadline.
    pub start_deadline_s: u64,
    /// Pods get the PriorityClass of their resource type (`objects::priority_class`); the classes are made at
    /// the first launch.
    pub priority_classes: bool,
    /// Each attempt's NetworkPolicy lets in only its own pods and these peers; None: no policy.
    pub network_policy: Option<Vec<objects::Peer>>,
    /// Where the attempts' logs and metrics are kept (they outlive the pods): files under `DATA_DIR/attempts`
    /// unless `archive` says otherwise.
    pub data_dir: PathBuf,
    /// Another place for the attempts' logs and metrics: the store, where several servers share them.
    pub archive: Option<Arc<dyn Archive>>,
    /// How pods fetch their task's working directory; None: a task with one is refused at submission.
    pub workdir: Option<objects::WorkdirFetch>,
}

impl Default for KubeConfig {
    fn default() -> Self {
        KubeConfig {
            kubeconfig: None,
            context: None,
            namespace: "trainyard-{group}".to_owned(),
            instance: "trainyard".to_owned(),
            gang: objects::Gang::Off,
            images: BTreeMap::new(),
            grace_s: 5,
            node_grace_s: 60,
            start_deadline_s: 600,
            priority_classes: true,
            network_policy: Some(Vec::new()),
            data_dir: std::env::temp_dir().join("trainyard-kube"),
            archive: None,
            workdir: None,
        }
    }
}

impl KubeConfig {
    /// How the objects of an attempt of `group` are laid out.
    fn settings(&self, group: &str) -> KubeSettings {
        KubeSettings {
            namespace: self.namespace_of(group),
            instance: self.instance.clone(),
            gang: self.gang.clone(),
            images: self.images.clone(),
            grace_s: self.grace_s,
            priority_classes: self.priority_classes,
            network_policy: self.network_policy.clone(),
            workdir: self.workdir.clone(),
            ..KubeSettings::default()
        }
    }

    /// The namespace of a group: lower case, `-` for anything a namespace name cannot hold.
    pub fn namespace_of(&self, group: &str) -> String {
        let g: String = group
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
            .collect();
        let ns = self.namespace.replace("{group}", g.trim_matches('-'));
        ns.chars().take(63).collect::<String>().trim_end_matches('-').to_owned()
    }
}

struct Inner {
    client: kube::Client,
    cfg: KubeConfig,
    state: Mutex<State>,
    /// The job kinds whose CRDs the cluster has.
    kinds: Vec<JobKind>,
    /// Namespaces known to exist.
    namespaces: Mutex<HashSet<String>>,
    /// The PriorityClasses exist (made at the first launch that needs them).
    priority_classes_made: std::sync::atomic::AtomicBool,
    writes: tokio::sync::Semaphore,
    watches: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Requests sent to the API server outside the watches (applies, deletions, reads).
    requests: std::sync::atomic::AtomicU64,
    /// The kept logs and metrics, and the followers and scrapers at work (by pod, and whether it scrapes).
    archive: Arc<dyn Archive>,
    /// Whether this server follows and scrapes (it leads; see [`KubeBackend::capture`]).
    capturing: std::sync::atomic::AtomicBool,
    captures: Mutex<HashMap<(Target, bool), tokio::task::JoinHandle<()>>>,
    telemetry: Arc<Telemetry>,
    log_streams: Arc<tokio::sync::Semaphore>,
    capture_calls: std::sync::atomic::AtomicU64,
    /// Told each time the node watch changes the inventory (see [`KubeBackend::inventory_changed`]).
    inventory_changed: Arc<tokio::sync::Notify>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for w in self.watches.get_mut().map(std::mem::take).unwrap_or_default() {
            w.abort();
        }
        for (_, c) in self.captures.get_mut().map(std::mem::take).unwrap_or_default() {
            c.abort();
        }
    }
}

/// See the module documentation.
#[derive(Clone)]
pub struct KubeBackend {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for KubeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeBackend").field("cfg", &self.inner.cfg).field("kinds", &self.inner.kinds).finish()
    }
}

/// Says what an API error was, for events and errors.
fn api_error(what: &str, e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => {
            format!("{what}: the API server answered {} {}: {}", s.code, s.reason, s.message)
        }
        other => format!("{what}: {other}"),
    }
}

/// An error that asking again will not fix: the object is refused as it is.
fn is_permanent(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if matches!(s.code, 400 | 403 | 404 | 405 | 413 | 415 | 422))
}

impl KubeBackend {
    /// Whether pods fetch their task's working directory (`KubeConfig::workdir`).
    pub fn fetches_workdirs(&self) -> bool {
        self.inner.cfg.workdir.is_some()
    }

    /// Whether this server follows the pods' logs and scrapes their metrics into the archive. With several
    /// servers on one store only the leader does (a follower reads what the leader keeps there): off, every
    /// follower and scraper stops; on again, every started pod the watches know gets its follower, which goes
    /// on from where the archive says its log stands.
    pub fn capture(&self, on: bool) {
        use std::sync::atomic::Ordering;
        self.inner.capturing.store(on, Ordering::SeqCst);
        let mut captures = self.inner.captures.lock().unwrap_or_else(|e| e.into_inner());
        if !on {
            for (_, c) in captures.drain() {
                c.abort();
            }
            return;
        }
        // Those that ended for good (a log kept to its end) or gave up are looked at again.
        captures.retain(|_, h| !h.is_finished());
        drop(captures);
        let pods: Vec<_> = {
            let s = self.inner.lock();
            s.attempts
                .iter()
                .flat_map(|(k, a)| {
                    a.pods.values().map(|p| (k.clone(), a.namespace.clone(), p.clone(), a.scrape.clone()))
                })
                .collect()
        };
        for (key, ns, pod, scrape) in pods {
            watches::capture_pod(&self.inner, &key, &ns, &pod, scrape);
        }
    }

    /// Connects, checks which job CRDs the cluster serves, and starts the watches on the current Tokio
    /// runtime.
    pub async fn connect(cfg: KubeConfig) -> Result<KubeBackend, BackendError> {
        let options = kube::config::KubeConfigOptions { context: cfg.context.clone(), ..Default::default() };
        let config = match &cfg.kubeconfig {
            Some(path) => {
                let file = kube::config::Kubeconfig::read_from(path)
                    .map_err(|e| BackendError(format!("reading the kubeconfig {}: {e}", path.display())))?;
                kube::Config::from_custom_kubeconfig(file, &options).await
            }
            None => kube::Config::infer()
                .await
                .map_err(|e| kube::config::KubeconfigError::LoadContext(e.to_string())),
        }
        .map_err(|e| BackendError(format!("the Kubernetes client configuration: {e}")))?;
        let mut config = config;
        // Named in the API server's audit log and metrics as Trainyard (kube's client sends no user agent).
        config.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_static(concat!("trainyard/", env!("CARGO_PKG_VERSION"))),
        ));
        let client =
            kube::Client::try_from(config).map_err(|e| BackendError(format!("a Kubernetes client: {e}")))?;
        let mut kinds = Vec::new();
        for kind in [JobKind::PyTorch, JobKind::Ray] {
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &views::job_resource(kind));
            match api.list(&ListParams::default().limit(1)).await {
                Ok(_) => kinds.push(kind),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(BackendError(api_error("listing jobs", &e))),
            }
        }
        let (node_grace_s, start_deadline_s) = (cfg.node_grace_s, cfg.start_deadline_s);
        let kueue = matches!(cfg.gang, objects::Gang::Kueue { .. });
        let archive: Arc<dyn Archive> = match &cfg.archive {
            Some(a) => a.clone(),
            None => Arc::new(capture::FileArchive::new(cfg.data_dir.join("attempts"))),
        };
        let inner = Arc::new(Inner {
            client,
            cfg,
            state: Mutex::new(State {
                node_grace_ms: node_grace_s * 1000,
                start_deadline_ms: start_deadline_s.saturating_mul(1000),
                kueue,
                ..State::default()
            }),
            kinds,
            namespaces: Mutex::new(HashSet::new()),
            priority_classes_made: std::sync::atomic::AtomicBool::new(false),
            writes: tokio::sync::Semaphore::new(MAX_WRITES),
            watches: Mutex::new(Vec::new()),
            requests: std::sync::atomic::AtomicU64::new(0),
            archive,
            capturing: std::sync::atomic::AtomicBool::new(true),
            captures: Mutex::new(HashMap::new()),
            telemetry: Arc::new(Telemetry::default()),
            log_streams: Arc::new(tokio::sync::Semaphore::new(capture::MAX_LOG_STREAMS)),
            capture_calls: std::sync::atomic::AtomicU64::new(0),
            inventory_changed: Arc::new(tokio::sync::Notify::new()),
        });
        let mut watches = Vec::new();
        for &kind in &inner.kinds {
            watches.push(tokio::spawn(watches::watch_jobs(Arc::downgrade(&inner), kind)));
        }
        if inner.kinds.is_empty() {
            inner.lock().synced_jobs = true;
        }
        watches.push(tokio::spawn(watches::watch_pods(Arc::downgrade(&inner))));
        watches.push(tokio::spawn(watches::watch_nodes(Arc::downgrade(&inner))));
        watches.push(tokio::spawn(watches::watch_foreign_pods(Arc::downgrade(&inner))));
        watches.push(tokio::spawn(watches::watch_events(Arc::downgrade(&inner))));
        *inner.watches.lock().unwrap_or_else(|e| e.into_inner()) = watches;
        Ok(KubeBackend { inner })
    }

    /// The job kinds the cluster serves.
    pub fn kinds(&self) -> &[JobKind] {
        &self.inner.kinds
    }

    /// Waits until the watches have listed everything once (what `alive` says is complete from then on).
    pub async fn synced(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            {
                let s = self.inner.lock();
                if s.synced_jobs && s.synced_pods {
                    return true;
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The cluster's nodes as catalog nodes (pool and GPU model from their labels, allocatable as capacity).
    pub async fn inventory(&self) -> Result<BTreeMap<String, trainyard_core::catalog::Node>, BackendError> {
        let nodes: Api<Node> = Api::all(self.inner.client.clone());
        self.inner.sent();
        let list = nodes
            .list(&ListParams::default())
            .await
            .map_err(|e| BackendError(api_error("listing nodes", &e)))?;
        Ok(list.items.iter().filter_map(views::catalog_node).collect())
    }

    /// The cluster's nodes as catalog nodes, with a number that grows with every change, when they changed
    /// since `seen` (that number, from an earlier call); None until the node watch has listed them.
    pub fn inventory_since(
        &self,
        seen: Option<u64>,
    ) -> Option<(u64, BTreeMap<String, trainyard_core::catalog::Node>)> {
        let s = self.inner.lock();
        if seen == Some(s.inventory_version) {
            return None;
        }
        s.inventory.clone().map(|inv| (s.inventory_version, inv))
    }

    /// Notified when the cluster's nodes change (a cordon, a node that comes or goes), so that the catalog
    /// follows at once rather than at the next periodic look: a drain cordons its node seconds before the
    /// evicted attempt ends, and its resubmission must already see the node out.
    pub fn inventory_changed(&self) -> Arc<tokio::sync::Notify> {
        self.inner.inventory_changed.clone()
    }

    /// Requests this backend sent to the API server outside its watches (each apply, deletion and read).
    pub fn requests(&self) -> u64 {
        self.inner.requests.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether this backend knows an attempt (launched it, or its watches saw its objects).
    pub fn knows(&self, key: &AttemptKey) -> bool {
        self.inner.lock().attempts.contains_key(key)
    }

    /// The kubeconfig context it uses (None: the file's current one, or in-cluster).
    pub fn context(&self) -> Option<&str> {
        self.inner.cfg.context.as_deref()
    }

    /// What the log followers and metrics scrapers sent.
    pub fn telemetry(&self) -> &Telemetry {
        &self.inner.telemetry
    }

    pub fn client(&self) -> kube::Client {
        self.inner.client.clone()
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The wall clock in milliseconds (the control loop's clock, which `poll` is given).
fn wall_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The annotations a restarted server reads its settings back from, added to the job.
fn annotate(job: &mut Value, key: &AttemptKey, s: &JobSettings) {
    let meta = &mut job["metadata"];
    if !meta["annotations"].is_object() {
        meta["annotations"] = json!({});
    }
    let a = &mut meta["annotations"];
    a[objects::TASK_ID_ANNOTATION] = json!(key.task_id);
    a[views::ANN_PRECHECK] = json!(s.precheck.to_string());
    a[views::ANN_MOUNTS] = json!(serde_json::to_string(&s.mount_paths).unwrap_or_default());
    a[views::ANN_RETAIN] = json!(s.retain.to_string());
    if let Some(scrape) = &s.scrape {
        a[views::ANN_METRICS] = json!(serde_json::to_string(scrape).unwrap_or_default());
    }
}

fn settings_of(spec: &LaunchSpec) -> JobSettings {
    let s = &spec.task.spec;
    let e = &s.environment;
    let mut mount_paths: Vec<String> = e.volumes.iter().map(|v| v.mount_path.clone()).collect();
    mount_paths.extend(e.datasets.iter().map(|d| d.mount_path.clone()));
    mount_paths.extend(e.models.iter().map(|m| m.mount_path.clone()));
    JobSettings {
        precheck: kind_of_spec(spec) == JobKind::PyTorch
            && s.advanced.precheck.as_ref().is_some_and(|p| p.enabled),
        pull_tolerance: s.advanced.image_pull_tolerance,
        mount_paths,
        // Debug retention keeps a RayJob's cluster after its entrypoint: the operator's TTL removes it.
        retain: s.ray.as_ref().and_then(|r| r.debug.as_ref()).is_some_and(|d| d.enabled),
        scrape: s.advanced.metrics.as_ref().filter(|m| m.enabled && !m.endpoints.is_empty()).map(|m| {
            capture::Scrape {
                endpoints: m.endpoints.iter().map(|e| (e.port as u16, e.path.clone())).collect(),
                interval_s: u64::from(m.interval_seconds),
            }
        }),
    }
}

/// A fresh key pair and host key for an attempt that asks for passwordless SSH (the same `ssh-keygen` keys
/// as on the local backend), read into memory; the files are removed at once.
fn ssh_keys(key: &AttemptKey) -> Result<objects::SshKeys, String> {
    let dir = std::env::temp_dir().join(format!(
        "trainyard-ssh-{}-{}-{}",
        std::process::id(),
        key.task_id,
        key.attempt
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let made = trainyard_runtime::ssh::make_keys(&dir).and_then(|()| {
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).map_err(|e| format!("{name}: {e}"));
        Ok(objects::SshKeys {
            private_key: read("id_ed25519")?,
            public_key: read("id_ed25519.pub")?,
            host_key: read("host_ed25519")?,
        })
    });
    let _ = std::fs::remove_dir_all(&dir);
    made
}

fn kind_of_spec(spec: &LaunchSpec) -> JobKind {
    match spec.task.spec.task_type {
        trainyard_core::spec::TaskType::RayJob => JobKind::Ray,
        _ => JobKind::PyTorch,
    }
}

impl Backend for KubeBackend {
    async fn launch(&self, spec: &LaunchSpec) -> Result<(), BackendError> {
        let kind = kind_of_spec(spec);
        let ns = self.inner.cfg.namespace_of(&spec.task.metadata.project_group);
        let job_name = objects::job_name(&spec.key);
        {
            let s = self.inner.lock();
            if s.attempts.get(&spec.key).is_some_and(|a| a.launched || a.job.is_some() || a.sent.finished) {
                return Ok(());
            }
        }
        let settings = settings_of(spec);
        let ssh = if spec.task.spec.advanced.passwordless_ssh {
            ssh_keys(&spec.key).map(Some).map_err(|e| vec![format!("passwordless SSH: {e}")])
        } else {
            Ok(None)
        };
        let objs = if !self.inner.kinds.contains(&kind) {
            Err(vec![format!(
                "the cluster serves no {} (install {})",
                views::job_resource(kind).kind,
                match kind {
                    JobKind::PyTorch => "the Kubeflow training operator",
                    JobKind::Ray => "the KubeRay operator",
                }
            )])
        } else {
            ssh.clone().and_then(|ssh| {
                let settings = self.inner.cfg.settings(&spec.task.metadata.project_group);
                objects::attempt_objects(spec, &settings, ssh.as_ref())
            })
        };
        let mut s = self.inner.lock();
        let a: &mut Attempt = s.attempt(&spec.key, &ns, &job_name);
        a.kind = Some(kind);
        a.precheck = settings.precheck;
        a.pull_tolerance = settings.pull_tolerance;
        a.mount_paths = settings.mount_paths.clone();
        a.retain = settings.retain;
        a.scrape = settings.scrape.clone();
        a.launched = true;
        a.ssh = ssh.ok().flatten();
        match objs {
            Ok(mut objs) => {
                annotate(&mut objs.job, &spec.key, &settings);
                drop(s);
                tokio::spawn(writes::launch_in_background(self.inner.clone(), spec.key.clone(), ns, objs));
            }
            Err(problems) => {
                drop(s);
                writes::end_launch(
                    &self.inner,
                    &spec.key,
                    Reason::UserError,
                    format!("the attempt cannot run on Kubernetes: {}", problems.join("; ")),
                );
            }
        }
        Ok(())
    }

    async fn scale(&self, spec: &LaunchSpec) -> Result<(), BackendError> {
        // The objects are applied again with the replicas of `spec` (the node affinity and the SSH hostfiles
        // change with them); the operator adds or removes pods.
        let ns = self.inner.cfg.namespace_of(&spec.task.metadata.project_group);
        let ssh = if spec.task.spec.advanced.passwordless_ssh {
            let kept = self.inner.lock().attempts.get(&spec.key).and_then(|a| a.ssh.clone());
            match kept {
                Some(k) => Some(k),
                None => Some(self.inner.read_ssh_keys(&ns, &objects::job_name(&spec.key)).await?),
            }
        } else {
            None
        };
        let ks = self.inner.cfg.settings(&spec.task.metadata.project_group);
        let mut objs =
            objects::attempt_objects(spec, &ks, ssh.as_ref()).map_err(|p| BackendError(p.join("; ")))?;
        annotate(&mut objs.job, &spec.key, &settings_of(spec));
        if spec.task.spec.task_type == trainyard_core::spec::TaskType::PyTorchJob {
            let workers = spec.replicas.iter().filter(|r| r.role == "worker").count() as u32;
            let mut s = self.inner.lock();
            if let Some(a) = s.attempts.get_mut(&spec.key) {
                // A later scale replaces a shrink still held.
                a.held_shrink = None;
                let waiting = state::held_until(a, workers);
                if state::removes_a_worker(a, workers) && !waiting.is_empty() {
                    a.held_shrink = Some(state::HeldShrink { objs, workers });
                    let message = format!(
                        "the shrink to {workers} worker(s) waits until {} run(s): the training operator \
                         fails the job when a worker it removes ends while one that stays is not running",
                        waiting.join(", ")
                    );
                    s.dirty.insert(spec.key.clone());
                    s.out.push(Observation::Note {
                        key: spec.key.clone(),
                        reason: Reason::ScaledDown,
                        message,
                    });
                    return Ok(());
                }
            }
        }
        self.inner.apply(&ns, &objs, true).await.map_err(|e| BackendError(api_error("scaling", &e)))
    }

    async fn stop(&self, key: &AttemptKey, cause: StopCause) -> Result<(), BackendError> {
        let cleanup = {
            let mut s = self.inner.lock();
            let Some(a) = s.attempts.get_mut(key) else { return Ok(()) };
            a.stop = Some(cause);
            let cleanup = a.kind.map(|kind| Cleanup {
                key: key.clone(),
                namespace: a.namespace.clone(),
                job_name: a.job_name.clone(),
                kind,
                now: cause == StopCause::NodeFailed,
            });
            s.dirty.insert(key.clone());
            cleanup
        };
        if let Some(c) = cleanup {
            self.inner.delete(&c).await.map_err(|e| BackendError(api_error("deleting the job", &e)))?;
        }
        Ok(())
    }

    async fn poll(&self, now_ms: u64) -> Vec<Observation> {
        let (out, cleanups, shrinks) = {
            let mut s = self.inner.lock();
            let out = s.poll(now_ms);
            (out, std::mem::take(&mut s.cleanups), std::mem::take(&mut s.shrinks))
        };
        for (key, ns, shrink) in shrinks {
            let inner = self.inner.clone();
            tokio::spawn(async move {
                if let Err(e) = inner.apply(&ns, &shrink.objs, true).await {
                    eprintln!("trainyard: {}", api_error(&format!("shrinking {}", key.task_id), &e));
                    // Tried again at the attempt's next change.
                    if let Some(a) = inner.lock().attempts.get_mut(&key) {
                        a.held_shrink.get_or_insert(shrink);
                    }
                }
            });
        }
        for c in cleanups {
            let inner = self.inner.clone();
            tokio::spawn(async move {
                if let Err(e) = inner.delete(&c).await {
                    eprintln!(
                        "trainyard: {}",
                        api_error(&format!("deleting job {}/{}", c.namespace, c.job_name), &e)
                    );
                    inner.lock().cleanups.push(c);
                }
            });
        }
        out
    }

    /// With cluster-side gang admission (Kueue, Volcano) the cluster admits: Trainyard does not a second time.
    fn admits(&self, _catalog: &trainyard_core::Catalog, _cluster: &str) -> bool {
        !matches!(self.inner.cfg.gang, objects::Gang::Off)
    }

    async fn alive(&self) -> Vec<AttemptKey> {
        self.inner.lock().alive()
    }

    /// The attempt's replicas, the one whose log says most first (`trainyard logs` shows the first): a RayJob's
    /// driver (its entrypoint's output), then the master or head, then the workers, each by name.
    async fn replicas(&self, key: &AttemptKey) -> Vec<(String, String)> {
        let mut out: BTreeMap<String, String> = self.inner.archive.replicas(key).await.into_iter().collect();
        if let Some(a) = self.inner.lock().attempts.get(key) {
            out.extend(a.pods.values().map(|p| (p.name.clone(), p.role.clone())));
        }
        let mut out: Vec<(String, String)> = out.into_iter().collect();
        let rank = |role: &str| match role {
            "driver" => 0,
            "master" | "head" => 1,
            _ => 2,
        };
        out.sort_by(|a, b| (rank(&a.1), &a.0).cmp(&(rank(&b.1), &b.0)));
        out
    }

    async fn read_log(&self, key: &AttemptKey, replica: &str, offset: u64, max: usize) -> LogChunk {
        let chunk = self.inner.archive.read_log(key, replica, offset, max).await;
        if chunk.missing && self.inner.lock().attempts.get(key).is_some_and(|a| a.pods.contains_key(replica))
        {
            // A pod whose container has not started yet: its log is empty so far.
            return LogChunk { next: offset, ..LogChunk::default() };
        }
        chunk
    }

    async fn read_metrics(&self, key: &AttemptKey, since_ms: u64) -> Vec<MetricPoint> {
        self.inner.archive.read_metrics(key, since_ms).await
    }
}

#[path = "watches.rs"]
mod watches;
#[path = "writes.rs"]
mod writes;
