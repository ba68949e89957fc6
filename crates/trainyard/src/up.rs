//! `trainyard up`: one command, no setup. Opens (or creates) the data dir with its SQLite store, describes
//! this machine as a one-node catalog on first start, creates an admin and prints its token once, and serves
//! the API with the control loop running.

use crate::machine::{detect, local_catalog};
use anyhow::{Context, Result};
use std::path::Path;
use trainyard_api::backends::AnyBackend;
use trainyard_api::{AppState, new_token, now_ms, token_hash};
use trainyard_control::secrets::SecretBox;
use trainyard_core::Catalog;
use trainyard_kube::{KubeBackend, KubeConfig, KubeFleet};
use trainyard_local::{self as local, LocalBackend, LocalConfig, find_bwrap};
use trainyard_runtime::fake::{FakeBackend, Script};

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
    /// Cluster-side gang admission: `off` (Trainyard admits), `volcano[:QUEUE]` or `kueue:LOCALQUEUE`.
    #[arg(long, default_value = "off")]
    pub kube_gang: String,
    /// Seconds a node may stay NotReady before the tasks on it fail as NodeFailed and are resubmitted (a
    /// deleted node fails them at once).
    #[arg(long, default_value_t = 60)]
    pub kube_node_grace_s: u64,
}

impl KubeFlags {
    fn config(&self) -> Result<trainyard_kube::KubeConfig> {
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
            ..Default::default()
        })
    }
}

/// The Kubernetes backend of one kubeconfig context, its watches listed.
async fn connect_kube(cfg: KubeConfig) -> Result<KubeBackend> {
    let kube = KubeBackend::connect(cfg).await.map_err(|e| anyhow::anyhow!("the Kubernetes backend: {e}"))?;
    if !kube.synced(std::time::Duration::from_secs(60)).await {
        anyhow::bail!("the Kubernetes backend: the watches did not list the cluster's objects within 60 s");
    }
    Ok(kube)
}

/// A first catalog for a cluster: its nodes as they are now, their pools, a CPU instance spec and one per GPU
/// model, and the default group's reserved quota over all of it.
fn cluster_catalog(nodes: &std::collections::BTreeMap<String, trainyard_core::catalog::Node>) -> String {
    use std::collections::BTreeMap;
    let mut pools: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut specs = String::from("  cpu.small: {kind: CPU, vcpus: 1, memoryMib: 2048}\n");
    let mut gpu_models: BTreeMap<&str, (u32, u32, u64)> = BTreeMap::new();
    let mut vcpus = 0u32;
    let mut lines = String::new();
    for (name, n) in nodes {
        pools.entry(n.pool.as_str()).or_default();
        vcpus += n.vcpus;
        match &n.gpu_model {
            Some(model) => {
                let e = gpu_models.entry(model.as_str()).or_insert((0, u32::MAX, u64::MAX));
                e.0 += n.gpus;
                e.1 = e.1.min(n.vcpus / n.gpus.max(1));
                e.2 = e.2.min(n.memory_mib / u64::from(n.gpus.max(1)));
                lines.push_str(&format!(
                    "  {name}: {{pool: {}, gpuModel: {model}, gpus: {}, vcpus: {}, memoryMib: {}}}\n",
                    n.pool, n.gpus, n.vcpus, n.memory_mib
                ));
            }
            None => lines.push_str(&format!(
                "  {name}: {{pool: {}, vcpus: {}, memoryMib: {}}}\n",
                n.pool, n.vcpus, n.memory_mib
            )),
        }
    }
    if pools.is_empty() {
        pools.insert("default", Vec::new());
    }
    let mut all_specs = vec!["cpu.small".to_owned()];
    let mut quotas = String::new();
    for (model, (_, cpu, mem)) in &gpu_models {
        let spec =
            format!("gpu.{}.1", model.to_lowercase().replace(|c: char| !c.is_ascii_alphanumeric(), "-"));
        specs.push_str(&format!(
            "  {spec}: {{kind: GPU, gpuModel: {model}, gpus: 1, vcpus: {}, memoryMib: {}}}\n",
            (*cpu).max(1),
            mem.max(&1024)
        ));
        all_specs.push(spec);
    }
    for pool in pools.keys() {
        quotas.push_str(&format!(
            "  - {{group: default, resourceType: Reserved, pool: {pool}, spec: cpu.small, units: {}}}\n",
            vcpus.max(1)
        ));
        for (model, (count, _, _)) in &gpu_models {
            let spec =
                format!("gpu.{}.1", model.to_lowercase().replace(|c: char| !c.is_ascii_alphanumeric(), "-"));
            quotas.push_str(&format!(
                "  - {{group: default, resourceType: Reserved, pool: {pool}, spec: {spec}, units: {count}}}\n"
            ));
        }
    }
    let pools: String = pools
        .keys()
        .map(|p| format!("  {p}: {{cluster: kubernetes, instanceSpecs: [{}]}}\n", all_specs.join(", ")))
        .collect();
    format!(
        "# The cluster's nodes, as `trainyard up --backend kubernetes` found them on first start. It seeds the\n\
         # catalog in the store; change it later with `trainyard admin catalog set -f FILE`.\n\
         regions: {{kubernetes: {{displayName: Kubernetes}}}}\n\
         clusters: {{kubernetes: {{region: kubernetes}}}}\n\
         pools:\n{pools}\
         instanceSpecs:\n{specs}\
         nodes:\n{lines}\
         projectGroups: {{default: {{}}}}\n\
         images: {{}}\n\
         allowExternalImages: true\n\
         quotas:\n{quotas}"
    )
}

/// What the admin decides about the HTTP side: connection limits, a separate metrics address, and which
/// internal networks alarm webhooks may reach.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerFlags {
    /// Serve `/metrics` without a token on this address too (for a Prometheus scraper, on a management
    /// interface). On the API's address `/metrics` always takes an admin token.
    #[arg(long, env = "TRAINYARD_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<String>,
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
use trainyard_sched::Config;
use trainyard_store::{Store, User};

pub async fn run(data_dir: &Path, listen: &str, database_url: Option<&str>, opts: &Options) -> Result<()> {
    // Checked before anything is written, so a bad CA file stops the start with its reason.
    let webhooks = trainyard_control::alarms::Webhooks::new(opts.webhook_ca.as_deref())
        .context("the CAs trusted for https alarm webhooks (--webhook-ca)")?;
    let webhook_trust = webhooks.trust().to_owned();
    // A first start on this machine describes it (and refuses a --nodes it cannot give) before anything is
    // written; a later one keeps its catalog, whatever --nodes says.
    let first_local = opts.backend != BackendChoice::Kubernetes && !data_dir.join("catalog.yaml").exists();
    let described = if first_local {
        let machine = detect();
        let text = local_catalog(&machine, opts.nodes.unwrap_or(1))?;
        Some((machine, text))
    } else {
        None
    };
    if let (Some(n), None) = (opts.nodes, &described) {
        println!(
            "note: --nodes {n} is not used: it splits this machine on a first start only (the catalog of {} is kept; \
             `trainyard admin catalog set` changes its nodes)",
            data_dir.display()
        );
    }
    // The store, keys, tokens and logs are the server's alone.
    local::private_umask();
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create data dir {}", data_dir.display()))?;
    // Supervisors and sandboxes get absolute paths: they outlive this process and its working dir.
    let data_dir =
        &data_dir.canonicalize().with_context(|| format!("cannot resolve {}", data_dir.display()))?;
    let catalog_path = data_dir.join("catalog.yaml");
    let kube_cfg = if opts.backend == BackendChoice::Kubernetes {
        Some(KubeConfig { data_dir: data_dir.join("kube"), ..opts.kube.config()? })
    } else {
        None
    };
    let kube = if let Some(cfg) = kube_cfg.clone() {
        let kube = connect_kube(cfg).await?;
        if !catalog_path.exists() {
            let nodes = kube.inventory().await.map_err(|e| anyhow::anyhow!("the Kubernetes backend: {e}"))?;
            std::fs::write(&catalog_path, cluster_catalog(&nodes)).context("cannot write the catalog")?;
            println!("described the cluster's {} node(s) in {}", nodes.len(), catalog_path.display());
        }
        Some(kube)
    } else {
        None
    };
    if let Some((machine, text)) = described.filter(|_| !catalog_path.exists()) {
        std::fs::write(&catalog_path, text).context("cannot write the catalog")?;
        println!(
            "described this machine in {}: {} vCPU, {} MiB{}",
            catalog_path.display(),
            machine.vcpus,
            machine.memory_mib,
            machine.gpus.as_ref().map_or(String::new(), |(m, n)| format!(", {n} × {m}"))
        );
    }
    let db_path = data_dir.join("trainyard.db");
    let url = database_url.map_or_else(|| format!("sqlite://{}", db_path.display()), str::to_owned);
    let open = trainyard_store::Open { accept_damage: opts.server.accept_store_damage };
    let store =
        Store::connect_with(&url, open).await.with_context(|| format!("cannot open the store at {url}"))?;
    if let Some(damage) = store.opened_despite() {
        eprintln!("trainyard: WARNING: {damage}");
    }
    // The catalog lives in the store once an admin may have edited it; the file seeds it on first start.
    let catalog_text = match store.get_setting(trainyard_api::CATALOG_SETTING).await? {
        Some(text) => text,
        None => {
            let text = std::fs::read_to_string(&catalog_path)?;
            store.put_setting(trainyard_api::CATALOG_SETTING, &text, now_ms()).await?;
            text
        }
    };
    let catalog = Catalog::from_yaml(&catalog_text).map_err(|e| anyhow::anyhow!("the catalog: {e}"))?;

    if store.count_users().await? == 0 {
        let groups: Vec<String> = catalog.project_groups.keys().cloned().collect();
        store.put_user(&User { name: "admin".into(), role: "admin".into(), groups }, now_ms()).await?;
        let token = new_token()?;
        store.add_token(&token_hash(&token), "admin", "bootstrap", now_ms()).await?;
        let token_file = data_dir.join("admin.token");
        write_private(&token_file, &token)?;
        println!(
            "created user admin; its token (shown once, also saved to {}):\n\n    {token}\n",
            token_file.display()
        );
    }

    let mut isolation = Vec::new();
    // This server's egress table, once installed (removed at stop when nothing of this server runs), with
    // whether forwarding was off before.
    let mut host_rules: Option<(local::netns::Egress, bool)> = None;
    let mut local_handle: Option<LocalBackend> = None;
    let backend = match (opts.backend, find_bwrap().and_then(|b| local::isolation_ready().map(|()| b))) {
        (BackendChoice::Kubernetes, _) => {
            // The default context's cluster, and one backend per other context the catalog's clusters name.
            let (default, cfg) = kube.zip(kube_cfg).expect("connected above");
            let mut others = Vec::new();
            for context in KubeFleet::other_contexts(&catalog, cfg.context.as_deref()) {
                let member = KubeConfig { context: Some(context.clone()), ..cfg.clone() };
                others.push(
                    connect_kube(member)
                        .await
                        .with_context(|| format!("the kubeconfig context {context}"))?,
                );
            }
            AnyBackend::Kube(KubeFleet::new(default, others))
        }
        (BackendChoice::Fake, _) => fake_backend(),
        (BackendChoice::Local | BackendChoice::Auto, Ok(bwrap)) => {
            let exe = std::env::current_exe().context("cannot find this program (the supervisor is it)")?;
            let mut cfg = LocalConfig::new(data_dir, (exe, vec!["supervise".to_owned()]), bwrap);
            let f = &opts.sandbox;
            cfg.network = local::netns::Range::parse(&f.sandbox_network)
                .map_err(|e| anyhow::anyhow!("--sandbox-network: {e}"))?;
            if f.sandbox_egress {
                let allow = f
                    .sandbox_egress_allow
                    .iter()
                    .map(|c| {
                        local::netns::Range::parse(c)
                            .map_err(|e| anyhow::anyhow!("--sandbox-egress-allow: {e}"))
                    })
                    .collect::<Result<Vec<_>>>()?;
                let nft = local::netns::find_nft().map_err(|e| anyhow::anyhow!("--sandbox-egress: {e}"))?;
                let egress = local::netns::Egress {
                    uplinks: local::netns::Range::parse(&f.sandbox_egress_uplinks)
                        .map_err(|e| anyhow::anyhow!("--sandbox-egress-uplinks: {e}"))?,
                    allow,
                    nft,
                    table: local::netns::table_name(data_dir),
                    group: local::netns::link_group(data_dir),
                };
                if egress.uplinks.prefix > 30 {
                    anyhow::bail!(
                        "--sandbox-egress-uplinks: {} has no room for one /30",
                        f.sandbox_egress_uplinks
                    );
                }
                if let Some(iface) = local::netns::uplinks_of_others(&egress) {
                    anyhow::bail!(
                        "--sandbox-egress: another server on this machine has uplinks in {} ({iface}); give this \
                         one a range of its own with --sandbox-egress-uplinks CIDR",
                        f.sandbox_egress_uplinks
                    );
                }
                let was_off = local::netns::install_host_rules(&egress)
                    .map_err(|e| anyhow::anyhow!("--sandbox-egress: {e}"))?;
                println!(
                    "egress: nftables table inet {} (removed at stop once no attempt runs)",
                    egress.table
                );
                host_rules = Some((egress.clone(), was_off));
                cfg.egress = Some(egress);
            }
            cfg.limits = local::supervisor::Limits {
                pids_max: f.replica_pids_max.max(16),
                scratch_mib: f.replica_scratch_mib.max(1),
                scratch_inodes: f.replica_scratch_inodes.max(64),
                log_bytes: f.replica_log_kib.max(4) * 1024,
            };
            // The way from the data dir to each replica's own dirs: passable by the sandboxes, listable by
            // nobody; everything else the server writes is its own (mode 0600/0700).
            local::make_passage(data_dir).map_err(|e| anyhow::anyhow!("the data dir: {e}"))?;
            // Registry images: pulled into a cache whose root file systems the sandboxes may reach.
            // Registry images are unpacked as a uid of their own (never root), within the admin's bounds.
            cfg.image_cache_max_bytes = f.image_cache_gib.saturating_mul(1 << 30);
            let gib = |n: u64| n.saturating_mul(1 << 30);
            // A cache size of 0 keeps nothing that no task runs; it bounds no single image.
            let cache_max = Some(cfg.image_cache_max_bytes).filter(|&b| b > 0);
            let unpack = trainyard_images::Unpack {
                as_id: Some(local::IMAGE_UNPACK_ID),
                limits: trainyard_images::unpack::Limits {
                    layer_bytes: gib(f.image_layer_max_gib),
                    layer_entries: f.image_layer_max_entries,
                    image_bytes: gib(f.image_max_gib).min(cache_max.unwrap_or(u64::MAX)),
                    image_entries: f.image_max_entries,
                    reserve_bytes: f.image_reserve_mib.saturating_mul(1 << 20),
                    ..Default::default()
                },
                cache_max_bytes: cache_max,
            };
            cfg.images = Some(
                trainyard_images::Images::open_with(
                    &data_dir.join("images"),
                    Some(local::SANDBOX_GID),
                    unpack,
                )
                .context("cannot open the image cache")?,
            );
            isolation = local::describe_isolation(&cfg);
            let local = LocalBackend::new(cfg).context("cannot open the runs dir")?;
            local_handle = Some(local.clone());
            AnyBackend::Local(local)
        }
        (BackendChoice::Local, Err(why)) => anyhow::bail!("{why}"),
        (BackendChoice::Auto, Err(why)) => {
            println!("note: {why}; until then tasks run on the fake backend (nothing is executed)");
            fake_backend()
        }
    };
    let secrets = server_key(data_dir)?;
    // Receivers of alarm webhooks check X-Trainyard-Signature (HMAC-SHA256 of the body) with this key.
    let webhook_key_file = data_dir.join("webhook.key");
    write_private(&webhook_key_file, &String::from_utf8_lossy(&trainyard_api::webhook_key(&secrets)))?;
    let mut state = AppState::new(store, catalog, backend.clone(), secrets, Config::default());
    // What the alarm delivery started by `serve` sends with.
    let allowed_nets = opts
        .server
        .webhook_allow_net
        .iter()
        .map(|n| trainyard_control::alarms::Net::parse(n))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("--webhook-allow-net: {e}"))?;
    let webhook_nets = allowed_nets.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
    state.webhooks = webhooks.allowing(allowed_nets);
    let metrics_listener = match &opts.server.metrics_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (--metrics-listen)"))?,
        ),
        None => None,
    };
    let metrics_line = match &metrics_listener {
        Some(l) => {
            format!("http://{}/metrics (no token; keep this address for the scraper)", l.local_addr()?)
        }
        None => {
            "on the API's address with an admin token (or --metrics-listen ADDR for a scraper)".to_owned()
        }
    };
    let serve_options = trainyard_api::ServeOptions {
        limits: trainyard_api::HttpLimits {
            header_read_timeout: std::time::Duration::from_secs(opts.server.header_read_timeout_s.max(1)),
            idle_timeout: std::time::Duration::from_secs(opts.server.idle_timeout_s.max(1)),
            max_connections: opts.server.max_connections.max(1),
        },
        metrics_listener,
    };
    let listener =
        tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener.local_addr()?;
    println!("trainyard is up");
    println!("  console: http://{addr}/ (sign in with the admin token)");
    println!("  API:     http://{addr}/api/v1 (health: http://{addr}/healthz)");
    println!("  store:   {url}");
    println!("  alarms:  https webhooks are checked against {webhook_trust}");
    if webhook_nets.is_empty() {
        println!(
            "  alarms:  webhooks go to public addresses only (--webhook-allow-net CIDR for internal ones)"
        );
    } else {
        println!("  alarms:  webhooks may also go to {webhook_nets}");
    }
    println!("  metrics: {metrics_line}");
    match &backend {
        AnyBackend::Local(_) => {
            println!(
                "  backend: local — every replica runs in a bubblewrap sandbox on this machine; runs and logs in {}",
                data_dir.join("runs").display()
            );
            for line in &isolation {
                println!("  sandbox: {line}");
            }
        }
        AnyBackend::Fake(_) => println!(
            "  backend: fake — tasks are scheduled and go through their whole lifecycle, but nothing is executed"
        ),
        AnyBackend::Kube(fleet) => {
            for k in fleet.members() {
                println!(
                    "  backend: kubernetes — one PyTorchJob or RayJob per attempt (context {}: serves {:?})",
                    k.context().unwrap_or("(default)"),
                    k.kinds()
                );
            }
        }
    }
    // The CLI finds a server on the default address by itself; any other it is told.
    let reach = match addr.ip() {
        ip if ip.is_unspecified() => std::net::SocketAddr::new(
            if ip.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            },
            addr.port(),
        ),
        _ => addr,
    };
    let server_flag = if reach.to_string() == crate::DEFAULT_LISTEN {
        String::new()
    } else {
        format!(" --server http://{reach}")
    };
    println!(
        "  CLI:     export TRAINYARD_TOKEN=$(cat {}) ; trainyard{server_flag} submit -f examples/local/hello.yaml --wait",
        data_dir.join("admin.token").display()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot watch for SIGTERM")?;
    tokio::select! {
        r = trainyard_api::serve_with(listener, state, serve_options) => r.context("the server stopped")?,
        _ = tokio::signal::ctrl_c() => println!("stopping"),
        _ = term.recv() => println!("stopping (SIGTERM)"),
    }
    if let Some((egress, was_off)) = host_rules {
        if local_handle.as_ref().is_some_and(LocalBackend::attempts_live) {
            println!(
                "egress: table inet {} kept: attempts of this server still run (their replicas outlive it); the \
                 next start takes it over",
                egress.table
            );
        } else if let Err(e) = local::netns::remove_host_rules(&egress, was_off) {
            eprintln!("egress: cannot remove table inet {}: {e}", egress.table);
        } else {
            println!("egress: table inet {} removed", egress.table);
        }
    }
    Ok(())
}

/// The fake backend's scripted run time; TRAINYARD_FAKE_RUN_MS shortens it for tests and demos.
fn fake_backend() -> AnyBackend {
    let run_ms = std::env::var("TRAINYARD_FAKE_RUN_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    AnyBackend::Fake(FakeBackend::new(Script { start_ms: run_ms / 10, run_ms, ..Script::default() }))
}

/// The key hidden env values are sealed with: `TRAINYARD_SERVER_KEY` (64 hex characters), else
/// `server.key` in the data dir, created on first start. Losing it makes stored hidden values unreadable.
fn server_key(data_dir: &Path) -> Result<SecretBox> {
    if let Ok(hex) = std::env::var("TRAINYARD_SERVER_KEY") {
        return SecretBox::from_hex(&hex).context("TRAINYARD_SERVER_KEY must be 64 hex characters");
    }
    let path = data_dir.join("server.key");
    if let Ok(hex) = std::fs::read_to_string(&path) {
        return SecretBox::from_hex(&hex).with_context(|| format!("{} is damaged", path.display()));
    }
    let key = SecretBox::generate()?;
    write_private(&path, &key.to_hex())?;
    Ok(key)
}

fn write_private(path: &Path, contents: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    writeln!(f, "{contents}")?;
    Ok(())
}
