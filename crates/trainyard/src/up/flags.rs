//! `up`'s flags: which backend, and what the admin decides about the sandboxes, the HTTP side and the
//! Kubernetes backend.

use anyhow::Result;

/// Which backend `up` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    Auto,
    Local,
    Fake,
    /// One PyTorchJob or RayJob object per attempt on a Kubernetes cluster (`--kubeconfig`).
    Kubernetes,
}

#[derive(Debug)]
pub struct Options {
    pub backend: BackendChoice,
    /// Virtual nodes on first start (None: one, and no note when the catalog is already there).
    pub nodes: Option<u32>,
    /// A PEM bundle of CAs trusted for https alarm webhooks, beside the system's.
    pub webhook_ca: Option<std::path::PathBuf>,
    pub sandbox: SandboxFlags,
    pub server: ServerFlags,
    pub kube: KubeFlags,
}

/// Where the Kubernetes backend finds its cluster and how it lays out its objects.
#[derive(Debug, Clone, clap::Args)]
pub struct KubeFlags {
    /// The kubeconfig of the cluster (default: KUBECONFIG, ~/.kube/config, or the in-cluster service account).
    #[arg(long, env = "KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context to use (default: its current one).
    #[arg(long, value_name = "NAME")]
    pub kube_context: Option<String>,
    /// The namespace of a project group's tasks; `{group}` is replaced by the group's name.
    #[arg(long, default_value = "trainyard-{group}")]
    pub kube_namespace: String,
    /// A catalog image's reference in the cluster's registry, as NAME=REFERENCE (repeatable).
    #[arg(long, value_name = "NAME=REFERENCE")]
    pub kube_image: Vec<String>,
    /// This server's name on the cluster: it labels its objects (`app.kubernetes.io/instance`) and manages only
    /// those, so several Trainyard servers can share a cluster.
    #[arg(long, default_value = "trainyard")]
    pub kube_instance: String,
    /// Cluster-side gang admission: `off` (Trainyard admits and places), `volcano[:QUEUE]` or `kueue:LOCALQUEUE`
    /// (the cluster admits and places; Trainyard hands its tasks over at once and shows the cluster's wait).
    #[arg(long, default_value = "off")]
    pub kube_gang: String,
    /// Seconds a node may stay NotReady before the tasks on it fail as NodeFailed and are resubmitted (a
    /// deleted node fails them at once).
    #[arg(long, default_value_t = 60)]
    pub kube_node_grace_s: u64,
    /// Seconds a task's pods may take to be all running (scheduled, pulled, started) before the attempt ends
    /// with the cluster's reason and frees its quota: resubmitted where the cluster had no room, failed where
    /// its pods cannot be made as they are (a missing claim, Pod Security). 0: wait for ever.
    #[arg(long, default_value_t = 600)]
    pub kube_start_deadline_s: u64,
    /// Give pods the PriorityClass of their task's resource type (trainyard-reserved, -ondemand, -spot, -idle,
    /// made at the first launch; none preempts): the order in which the cluster takes them under pressure.
    /// `off`: pods without a class.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub kube_priority_classes: String,
    /// Give each attempt a NetworkPolicy that lets into its pods only its own pods and the peers
    /// `--kube-network-allow` names. `off`: no policy. Enforced by the cluster's CNI where it enforces them.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub kube_network_policy: String,
    /// Who else may connect to a task's pods under its NetworkPolicy: `namespace:NAME` (KubeRay's operator,
    /// which submits a RayJob's entrypoint to its head) or a CIDR (the API server's addresses, whose pod proxy
    /// the log and metrics followers use). Repeatable.
    #[arg(long, value_name = "namespace:NAME|CIDR")]
    pub kube_network_allow: Vec<String>,
    /// An image with the `trainyard` binary (the server's own) for the init container that makes each
    /// replica's copy of its task's working directory (`submit --workdir`, `run`). Without it and
    /// --kube-workdir-url, a task with a working directory is refused at submission.
    #[arg(long, env = "TRAINYARD_KUBE_WORKDIR_IMAGE", value_name = "REF", requires = "kube_workdir_url")]
    pub kube_workdir_image: Option<String>,
    /// This server's API as the cluster's pods reach it (a Service's address, `http://trainyard.NS.svc:8080`),
    /// from which their init container fetches the working directory with its attempt's token.
    #[arg(long, env = "TRAINYARD_KUBE_WORKDIR_URL", value_name = "URL", requires = "kube_workdir_image")]
    pub kube_workdir_url: Option<String>,
}

impl KubeFlags {
    pub(super) fn config(&self) -> Result<trainyard_kube::KubeConfig> {
        use trainyard_kube::objects::Gang;
        let gang = match self.kube_gang.split_once(':') {
            None if self.kube_gang == "off" => Gang::Off,
            None if self.kube_gang == "volcano" => Gang::Volcano { queue: None },
            Some(("volcano", q)) => Gang::Volcano { queue: Some(q.to_owned()) },
            Some(("kueue", q)) if !q.is_empty() => Gang::Kueue { local_queue: q.to_owned() },
            _ => anyhow::bail!(
                "--kube-gang: expected off, volcano[:QUEUE] or kueue:LOCALQUEUE, got {:?}",
                self.kube_gang
            ),
        };
        let images = self
            .kube_image
            .iter()
            .map(|i| match i.split_once('=') {
                Some((name, reference)) if !name.is_empty() && !reference.is_empty() => {
                    Ok((name.to_owned(), reference.to_owned()))
                }
                _ => anyhow::bail!("--kube-image: expected NAME=REFERENCE, got {i:?}"),
            })
            .collect::<Result<_>>()?;
        Ok(trainyard_kube::KubeConfig {
            kubeconfig: self.kubeconfig.clone(),
            context: self.kube_context.clone(),
            namespace: self.kube_namespace.clone(),
            instance: self.kube_instance.clone(),
            gang,
            images,
            node_grace_s: self.kube_node_grace_s,
            start_deadline_s: self.kube_start_deadline_s,
            priority_classes: self.kube_priority_classes == "on",
            network_policy: match self.kube_network_policy.as_str() {
                "off" => None,
                _ => Some(
                    self.kube_network_allow
                        .iter()
                        .map(|p| p.parse().map_err(|e| anyhow::anyhow!("--kube-network-allow: {e}")))
                        .collect::<Result<_>>()?,
                ),
            },
            workdir: match (&self.kube_workdir_image, &self.kube_workdir_url) {
                (Some(image), Some(url)) => {
                    if !url.starts_with("http://") && !url.starts_with("https://") {
                        anyhow::bail!(
                            "--kube-workdir-url: expected http://HOST[:PORT] or https://…, got {url:?}"
                        );
                    }
                    Some(trainyard_kube::objects::WorkdirFetch { image: image.clone(), server: url.clone() })
                }
                _ => None,
            },
            ..Default::default()
        })
    }
}

/// What the admin decides about the HTTP side: connection limits, a separate metrics address, and which
/// internal networks alarm webhooks may reach.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerFlags {
    /// With several servers on one PostgreSQL store: how long the leader's lease runs without renewal
    /// (milliseconds). A killed leader's successor takes over within about this long; it is renewed five
    /// times in that time.
    #[arg(long, env = "TRAINYARD_LEADER_LEASE_MS", value_name = "MS", default_value_t = 1500)]
    pub leader_lease_ms: u64,
    /// The address other servers on the store reach this one's API at (`http://HOST:PORT`), as `GET
    /// /api/v1/server` lists it; by default the address it listens on (a wildcard one names this machine's
    /// loopback, which only servers on this machine reach: in a pod, give the pod's IP).
    #[arg(long, env = "TRAINYARD_ADVERTISE_URL", value_name = "URL")]
    pub advertise_url: Option<String>,
    /// Serve `/metrics` without a token on this address too (for a Prometheus scraper, on a management
    /// interface). On the API's address `/metrics` always takes an admin token.
    #[arg(long, env = "TRAINYARD_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Where uploaded working directories are kept [default: DATA_DIR/workdirs]. With several servers on one
    /// store, a directory they all mount (a ReadWriteMany volume): each file is written aside and renamed in
    /// whole, so servers may take uploads at once, and any of them serves a replica's fetch.
    #[arg(long, env = "TRAINYARD_WORKDIR_DIR", value_name = "DIR")]
    pub workdir_dir: Option<std::path::PathBuf>,
    /// A network (CIDR) alarm webhooks may go to though it is loopback, link-local, private or otherwise
    /// internal (repeatable). Without it only public addresses are sent to.
    #[arg(long, value_name = "CIDR")]
    pub webhook_allow_net: Vec<String>,
    /// Seconds a client may take to send a request's headers (and the next request on a kept-alive
    /// connection).
    #[arg(long, default_value_t = trainyard_api::HEADER_READ_TIMEOUT.as_secs())]
    pub header_read_timeout_s: u64,
    /// Seconds a connection may sit with nothing read or written before it is closed.
    #[arg(long, default_value_t = trainyard_api::IDLE_TIMEOUT.as_secs())]
    pub idle_timeout_s: u64,
    /// Connections served at once; one more is answered 503 and closed.
    #[arg(long, default_value_t = trainyard_api::MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Start even though the check of the SQLite store at start finds it damaged (a WAL with frames SQLite
    /// would drop, pages `PRAGMA quick_check` finds inconsistent): SQLite then drops what it cannot read,
    /// committed writes among it. The damaged WAL is copied aside first. Restoring a backup loses less.
    #[arg(long)]
    pub accept_store_damage: bool,
}

/// What the admin decides about the local backend's sandboxes.
#[derive(Debug, Clone, clap::Args)]
pub struct SandboxFlags {
    /// The replicas' addresses: each task's replicas share a network segment of their own, unreachable from
    /// anything else (not routed, no egress), so every task uses the same range.
    #[arg(long, env = "TRAINYARD_SANDBOX_NETWORK", default_value = trainyard_local::netns::DEFAULT_RANGE)]
    pub sandbox_network: String,
    /// Let replicas reach beyond their task: the internet through this machine (masqueraded), never this
    /// machine itself, other tasks, or private, link-local and loopback ranges. Off by default. Needs
    /// nftables.
    #[arg(long, env = "TRAINYARD_SANDBOX_EGRESS")]
    pub sandbox_egress: bool,
    /// A network replicas with egress may reach although it is private (a package mirror on the LAN);
    /// repeatable.
    #[arg(long, value_name = "CIDR", requires = "sandbox_egress")]
    pub sandbox_egress_allow: Vec<String>,
    /// Where attempts with egress take their uplinks (a /30 each, routed on this machine only). A second
    /// server on the same machine needs a range of its own.
    #[arg(long, value_name = "CIDR", requires = "sandbox_egress", default_value = trainyard_local::netns::DEFAULT_UPLINKS)]
    pub sandbox_egress_uplinks: String,
    /// Processes and threads one replica may have (its cgroup's pids.max).
    #[arg(long, default_value_t = trainyard_local::supervisor::DEFAULT_PIDS_MAX)]
    pub replica_pids_max: u64,
    /// Scratch (/tmp and /root) one replica may fill, in MiB; over it the replica is ended.
    #[arg(long, default_value_t = trainyard_local::supervisor::DEFAULT_SCRATCH_MIB)]
    pub replica_scratch_mib: u64,
    /// Files, dirs and links one replica's scratch may hold (the data dir's inodes are every tenant's); over
    /// it the replica is ended.
    #[arg(long, default_value_t = trainyard_local::supervisor::DEFAULT_SCRATCH_INODES)]
    pub replica_scratch_inodes: u64,
    /// Size of one replica's log file in KiB before it rotates (the previous file is kept, older ones go).
    #[arg(long, default_value_t = trainyard_local::supervisor::DEFAULT_LOG_BYTES / 1024)]
    pub replica_log_kib: u64,
    /// The size the cache of registry images (under the data dir's `images/`) is kept under, in GiB; least
    /// recently used images that no task runs go first.
    #[arg(long, env = "TRAINYARD_IMAGE_CACHE_GIB", default_value_t = trainyard_local::IMAGE_CACHE_MAX_BYTES >> 30)]
    pub image_cache_gib: u64,
    /// The most one registry image may unpack to, in GiB (every layer's files); a pull past it fails at
    /// once as too-large. Never more than the cache's size.
    #[arg(long, env = "TRAINYARD_IMAGE_MAX_GIB", default_value_t = trainyard_images::unpack::Limits::default().image_bytes >> 30)]
    pub image_max_gib: u64,
    /// The most files, directories and links one registry image may hold.
    #[arg(long, env = "TRAINYARD_IMAGE_MAX_ENTRIES", default_value_t = trainyard_images::unpack::Limits::default().image_entries)]
    pub image_max_entries: u64,
    /// The most one layer of a registry image may unpack to, in GiB.
    #[arg(long, env = "TRAINYARD_IMAGE_LAYER_MAX_GIB", default_value_t = trainyard_images::unpack::Limits::default().layer_bytes >> 30)]
    pub image_layer_max_gib: u64,
    /// The most entries one layer may hold.
    #[arg(long, env = "TRAINYARD_IMAGE_LAYER_MAX_ENTRIES", default_value_t = trainyard_images::unpack::Limits::default().layer_entries)]
    pub image_layer_max_entries: u64,
    /// Space the image cache's file system keeps free, in MiB: an unpack that would leave less fails at once
    /// as disk-full (as does one that would leave fewer than 100,000 free inodes).
    #[arg(long, env = "TRAINYARD_IMAGE_RESERVE_MIB", default_value_t = trainyard_images::unpack::Limits::default().reserve_bytes >> 20)]
    pub image_reserve_mib: u64,
}
