//! `trainyard up`: one command, no setup. Opens (or creates) the data dir with its SQLite store, describes
//! this machine as a one-node catalog on first start, creates an admin and prints its token once, and serves
//! the API with the control loop running.

mod cluster;
mod fake_cluster;
mod flags;
mod lock;

use cluster::{cluster_catalog, connect_kube};
pub use flags::{BackendChoice, KubeFlags, Options, SandboxFlags, ServerFlags};

use crate::machine::{detect, local_catalog};
use anyhow::{Context, Result};
use std::path::Path;
use trainyard_api::backends::AnyBackend;
use trainyard_api::{AppState, new_token, now_ms, token_hash};
use trainyard_control::secrets::SecretBox;
use trainyard_core::Catalog;
use trainyard_kube::{KubeConfig, KubeFleet};
use trainyard_local::{self as local, LocalBackend, LocalConfig, find_bwrap};
use trainyard_runtime::fake::{FakeBackend, Script};
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
    // One server per data dir (its runs, sandboxes' network and image cache are that server's), and one per
    // SQLite database: a second is refused here, before it writes anything, instead of running every task
    // again. Several servers share a PostgreSQL database, each with a data dir of its own.
    let _data_dir_lock = lock::take(
        &data_dir.join("server.lock"),
        &format!("the data dir {}", data_dir.display()),
        "stop it first, or give this one another --data-dir",
    )?;
    let db_path = data_dir.join("trainyard.db");
    let url = database_url.map_or_else(|| format!("sqlite://{}", db_path.display()), str::to_owned);
    let _sqlite_lock = match lock::sqlite_lock_path(&url) {
        Some(path) => Some(lock::take(
            &path,
            &format!("the SQLite store {}", path.display().to_string().trim_end_matches(".server-lock")),
            "a SQLite store serves one server; to run several servers on one store, give them a PostgreSQL \
             database (--database-url postgres://...)",
        )?),
        None => None,
    };
    let catalog_path = data_dir.join("catalog.yaml");
    let open = trainyard_store::Open { accept_damage: opts.server.accept_store_damage };
    let store =
        Store::connect_with(&url, open).await.with_context(|| format!("cannot open the store at {url}"))?;
    if let Some(damage) = store.opened_despite() {
        eprintln!("trainyard: WARNING: {damage}");
    }
    // Several servers may share a PostgreSQL store: this one leads (runs the control loop, the scheduler and
    // the backend) only while it holds the store's lease, and its loop's writes are fenced.
    let several = store.dialect() == trainyard_store::Dialect::Postgres;
    let election = several.then(|| {
        trainyard_api::leader::Election::on_lease(std::time::Duration::from_millis(
            opts.server.leader_lease_ms,
        ))
    });
    let kube_cfg = if opts.backend == BackendChoice::Kubernetes {
        let kube_dir = data_dir.join("kube");
        // The pods' logs and metrics: on this server's disk when it is alone on its store; in the store,
        // through the leader's fence, where every server reads them, when several may share it (what this
        // server kept on its disk before is still read).
        let archive = election.as_ref().map(|e| {
            let files: std::sync::Arc<dyn trainyard_runtime::archive::Archive> =
                std::sync::Arc::new(trainyard_kube::capture::FileArchive::new(kube_dir.join("attempts")));
            let archive = trainyard_api::archive::StoreArchive::new(store.fenced(e.fence()), Some(files));
            std::sync::Arc::new(archive) as std::sync::Arc<dyn trainyard_runtime::archive::Archive>
        });
        Some(KubeConfig { data_dir: kube_dir, archive, ..opts.kube.config()? })
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
        (BackendChoice::Fake, _) => fake_backend()?,
        (BackendChoice::Local | BackendChoice::Auto, Ok(bwrap)) => {
            let exe = std::env::current_exe().context("cannot find this program (the supervisor is it)")?;
            let mut cfg = LocalConfig::new(data_dir, (exe, vec!["supervise".to_owned()]), bwrap);
            cfg.workdirs = workdir_dir(data_dir, opts);
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
            // Each image's root is mounted as a file system of its own in its sandboxes, where it can be.
            cfg.image_roots = local::root_image::probe(data_dir);
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
            fake_backend()?
        }
    };
    let secrets = server_key(data_dir)?;
    // Receivers of alarm webhooks check X-Trainyard-Signature (HMAC-SHA256 of the body) with this key.
    let webhook_key_file = data_dir.join("webhook.key");
    write_private(&webhook_key_file, &String::from_utf8_lossy(&trainyard_api::webhook_key(&secrets)))?;
    if several && matches!(backend, AnyBackend::Local(_)) {
        refuse_a_second_local_server(&store).await?;
    }
    let mut state =
        AppState::new(store.clone(), catalog, backend.clone(), secrets.clone(), Config::default());
    state.workdirs = Some(trainyard_workdir::store::Store::new(workdir_dir(data_dir, opts)));
    if let Some(election) = election {
        state.control.try_lock().expect("nothing runs the loop yet").elected_by(election.fence());
        // Every server on the store seals and opens hidden values with one key: a server started with another
        // is refused here, before it stores values the others cannot open (the store keeps a digest of the
        // first server's key, which tells nothing of the key).
        let check = secrets.digest(b"trainyard server key check");
        if store.setting_once(KEY_CHECK_SETTING, &check, now_ms()).await? != check {
            anyhow::bail!(
                "this server's key differs from the key of the servers already on this store: start it with the \
                 same key as theirs (copy their data dir's server.key into {}, or set TRAINYARD_SERVER_KEY)",
                data_dir.display()
            );
        }
        // A retry of an idempotent create through another server is the same request: the digests are made
        // with key material the store holds (derived once from the first server's key, never that key).
        let material = store
            .setting_once(
                IDEMPOTENCY_KEY_SETTING,
                &secrets.digest(b"trainyard idempotency digests"),
                now_ms(),
            )
            .await?;
        let digests = SecretBox::from_hex(&material)
            .with_context(|| format!("the store's setting {IDEMPOTENCY_KEY_SETTING} is damaged"))?;
        state.submitter = state.submitter.clone().digesting_with(digests);
        println!(
            "  servers: this one ({}) serves the API; it runs tasks while it leads (lease {} ms)",
            election.id(),
            opts.server.leader_lease_ms
        );
        state.election = election;
    }
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
        advertise_url: opts.server.advertise_url.clone(),
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
    let election = (state.election.clone(), state.store.clone());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot watch for SIGTERM")?;
    tokio::select! {
        r = trainyard_api::serve_with(listener, state, serve_options) => r.context("the server stopped")?,
        _ = tokio::signal::ctrl_c() => println!("stopping"),
        _ = term.recv() => println!("stopping (SIGTERM)"),
    }
    // The next leader takes over at once rather than when the lease runs out.
    election.0.resign(&election.1).await;
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

/// The store's setting holding a digest of its servers' key (see `run`).
const KEY_CHECK_SETTING: &str = "server.key_check";

/// The store's setting holding the key material of idempotency digests, shared by its servers.
const IDEMPOTENCY_KEY_SETTING: &str = "server.idempotency_digest_key";

/// The local backend runs replicas on its server's machine, under that server's data dir: another server
/// could not take them over, so a second server on the local backend is refused while one is alive.
async fn refuse_a_second_local_server(store: &Store) -> Result<()> {
    let recent = 2 * trainyard_api::leader::LEASE.as_millis() as i64;
    let others = store.servers(recent).await?;
    if let Some(other) = others.iter().find(|s| s.backend == "local") {
        anyhow::bail!(
            "another server ({} on {}, {}) runs tasks on the local backend on this store: the local backend \
             runs replicas on its own server's machine and another server cannot take them over; run one server \
             on the local backend, or several on the kubernetes backend (a server that just stopped is forgotten \
             {} s after its last sign of life)",
            other.id,
            other.host,
            other.address,
            recent / 1000 + 1
        );
    }
    Ok(())
}

/// The fake backend's scripted run time; TRAINYARD_FAKE_RUN_MS shortens it for tests and demos.
/// TRAINYARD_FAKE_CLUSTER names a directory the fake backends of several servers on this machine share (see
/// `fake_cluster`).
fn fake_backend() -> Result<AnyBackend> {
    let run_ms = std::env::var("TRAINYARD_FAKE_RUN_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let script = Script { start_ms: run_ms / 10, run_ms, ..Script::default() };
    Ok(AnyBackend::Fake(match std::env::var_os("TRAINYARD_FAKE_CLUSTER") {
        Some(dir) => {
            let runs = fake_cluster::DirRuns::open(dir.into()).context("TRAINYARD_FAKE_CLUSTER")?;
            FakeBackend::shared(script, std::sync::Arc::new(runs))
        }
        None => FakeBackend::new(script),
    }))
}

/// The key hidden env values are sealed with: `TRAINYARD_SERVER_KEY` (64 hex characters), else
/// `server.key` in the data dir, created on first start. Losing it makes stored hidden values unreadable.
/// Where uploaded working directories are kept (`--workdir-dir`, else the data dir's).
fn workdir_dir(data_dir: &Path, opts: &Options) -> std::path::PathBuf {
    opts.server.workdir_dir.clone().unwrap_or_else(|| data_dir.join("workdirs"))
}

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
