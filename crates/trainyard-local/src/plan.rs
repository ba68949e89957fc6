//! An attempt's plan, decided before anything is written: which replicas it has (names, GPUs, places on the
//! network), what each one runs, with which env, devices and mounts, and what `launch.json` records. Pure:
//! `prepare.rs` resolves what the machine holds (the uid, the storage dirs, the image's files), hands
//! it in, and writes what comes out.

use super::config::{LocalConfig, MASTER_PORT, PRESET_INTERVAL_S};
use super::layout::AttemptLayout;
use super::metrics::MonitorJob;
use super::netns::{Range, ReplicaNet};
use super::procs;
use super::ray::{RayAt, RayNode, ray_command};
use super::sandbox::{Mount, RUNTIME_DIR, SandboxPlan, WORKSPACE};
use super::supervisor::ReplicaJob;
use crate::LaunchSpec;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use trainyard_core::spec::{Precheck, TaskSpec, TaskType};

/// One replica as launched (saved in `launch.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Replica {
    pub(super) name: String,
    pub(super) role: String,
    pub(super) node: String,
    /// GPU indices handed to it.
    pub(super) devices: Vec<u32>,
    /// Its place in the attempt's network range (its address); kept for its life.
    #[serde(default)]
    pub(super) slot: usize,
}

/// What was launched, without the env.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Launched {
    pub(super) task_id: String,
    pub(super) attempt: i64,
    /// The attempt's host uid (its replicas' processes and their own dirs).
    #[serde(default)]
    pub(super) uid: u32,
    /// The attempt has a network of its own (more than one replica, or autoscaling).
    #[serde(default)]
    pub(super) networked: bool,
    pub(super) task_type: String,
    pub(super) image: String,
    /// The digest of the image pulled for it (an image in use: the cache keeps it).
    #[serde(default)]
    pub(super) image_digest: Option<String>,
    pub(super) replicas: Vec<Replica>,
    pub(super) mount_paths: Vec<String>,
    pub(super) checkpoint: Option<(u64, i32)>,
    pub(super) precheck: bool,
    /// Image pull tolerance: -1 never trips, 0 fails at once, N retries.
    pub(super) pull_tolerance: i64,
    /// RayJob: the first of each node's ports (every node has a network namespace of its own).
    #[serde(default)]
    pub(super) ray_base: u16,
    /// RayJob shared storage dir, removed when the attempt ends if asked.
    #[serde(default)]
    pub(super) cleanup: Option<PathBuf>,
    /// RayJob autoscaling.
    #[serde(default)]
    pub(super) autoscale: Option<Autoscale>,
}

impl Launched {
    /// An attempt being prepared: its key and its replicas (their GPUs taken), nothing else yet.
    pub(super) fn preparing(key: &crate::AttemptKey, replicas: Vec<Replica>) -> Launched {
        Launched {
            task_id: key.task_id.clone(),
            attempt: key.attempt,
            uid: 0,
            networked: false,
            task_type: String::new(),
            image: String::new(),
            image_digest: None,
            replicas,
            mount_paths: Vec::new(),
            checkpoint: None,
            precheck: false,
            pull_tolerance: 0,
            ray_base: 0,
            cleanup: None,
            autoscale: None,
        }
    }
}

/// A RayJob's autoscaling, as the backend applies it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Autoscale {
    pub(super) idle_timeout_s: u64,
    /// Most workers asked for at once (Conservative: 1).
    pub(super) step: u32,
    /// vCPUs of one worker, to turn pending CPU demand into workers.
    pub(super) worker_vcpus: u64,
}

/// GPU indices in use per node by the attempts that hold them.
pub(super) fn gpus_in_use<'a>(
    attempts: impl Iterator<Item = &'a Launched>,
) -> BTreeMap<String, BTreeSet<u32>> {
    let mut used: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for l in attempts {
        for r in &l.replicas {
            used.entry(r.node.clone()).or_default().extend(r.devices.iter().copied());
        }
    }
    used
}

/// The attempt's replicas: names, free GPUs of their nodes, places on the network. A replica of a running
/// attempt being resized (`have`) keeps its place; a new one takes the lowest free.
pub(super) fn place_replicas(
    spec: &LaunchSpec,
    have: &[Replica],
    mut used: BTreeMap<String, BTreeSet<u32>>,
) -> Vec<Replica> {
    let mut replicas = Vec::new();
    for p in &spec.replicas {
        let node = spec.catalog.nodes.get(&p.node);
        let free: Vec<u32> = node
            .map(|n| n.devices())
            .unwrap_or_default()
            .into_iter()
            .filter(|d| !used.get(&p.node).is_some_and(|u| u.contains(d)))
            .collect();
        let devices: Vec<u32> = free.into_iter().take(p.resources.gpus as usize).collect();
        used.entry(p.node.clone()).or_default().extend(devices.iter().copied());
        let name = format!("{}-{}-{}", spec.task_name, p.role, p.index);
        let slot = have.iter().find(|r| r.name == name).map(|r| r.slot);
        replicas.push(Replica {
            name,
            role: p.role.clone(),
            node: p.node.clone(),
            devices,
            slot: slot.unwrap_or(0),
        });
    }
    let mut taken: BTreeSet<usize> = have.iter().map(|r| r.slot).collect();
    for r in replicas.iter_mut() {
        if !have.iter().any(|h| h.name == r.name) {
            let free = (0..).find(|i| !taken.contains(i)).unwrap_or(0);
            taken.insert(free);
            r.slot = free;
        }
    }
    replicas
}

/// Whether the task's RayJob autoscales.
pub(super) fn autoscaling(s: &TaskSpec) -> bool {
    s.ray.as_ref().and_then(|r| r.autoscaling.as_ref()).is_some_and(|a| a.enabled)
}

/// An attempt's network: a switch of its own when its replicas talk to each other (more than one, or
/// autoscaling) or reach out (egress); alone in an empty namespace otherwise.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Network {
    pub(super) networked: bool,
    pub(super) range: Range,
    /// The switch namespace's name.
    pub(super) switch: String,
    /// The replicas' default route (egress only).
    pub(super) gateway: Option<Ipv4Addr>,
}

impl Network {
    pub(super) fn wanted(has_ip: bool, replicas: usize, autoscaling: bool, egress: bool) -> bool {
        has_ip && (replicas > 1 || autoscaling || egress)
    }

    /// A replica's address: its slot in the range, or loopback without a network.
    pub(super) fn address(&self, r: &Replica) -> Result<Ipv4Addr, String> {
        if !self.networked {
            return Ok(Ipv4Addr::LOCALHOST);
        }
        self.range.address(r.slot).ok_or_else(|| {
            format!("the replicas' network range holds {} replicas per task", self.range.capacity())
        })
    }

    /// What the replica's supervisor sets up.
    pub(super) fn replica(&self, r: &Replica) -> Option<ReplicaNet> {
        self.networked.then(|| ReplicaNet {
            switch: self.switch.clone(),
            name: format!("{}-{}", self.switch, r.slot),
            address: self.address(r).unwrap_or(Ipv4Addr::LOCALHOST),
            prefix: self.range.prefix,
            gateway: self.gateway,
        })
    }
}

/// The attempt's hosts file: every replica's name at its address.
pub(super) fn hosts_file(replicas: &[Replica], net: &Network) -> Result<String, String> {
    let mut hosts = String::from("127.0.0.1 localhost\n::1 localhost ip6-localhost\n");
    for r in replicas {
        hosts.push_str(&format!("{} {}\n", net.address(r)?, r.name));
    }
    Ok(hosts)
}

/// MPI-style hostfiles in each replica's home: (with slots, names only).
pub(super) fn hostfiles(replicas: &[Replica], procs_per_node: Option<u32>) -> (String, String) {
    let slots = procs_per_node.unwrap_or(1).max(1);
    let hostfile = replicas.iter().map(|r| format!("{} slots={slots}\n", r.name)).collect();
    let names = replicas.iter().map(|r| format!("{}\n", r.name)).collect();
    (hostfile, names)
}

/// The precheck, unless it is off (a RayJob has none).
pub(super) fn precheck(s: &TaskSpec) -> Option<&Precheck> {
    s.advanced.precheck.as_ref().filter(|p| p.enabled && s.task_type != TaskType::RayJob)
}

/// The precheck's command line inside the sandbox.
pub(super) fn precheck_command(p: &Precheck) -> String {
    let mut c = format!(
        "python3 {RUNTIME_DIR}/precheck.py --out {RUNTIME_DIR}/precheck.json --timeout-s {}",
        p.timeout_seconds
    );
    if let Some(t) = p.min_gemm_tflops {
        c.push_str(&format!(" --min-gemm-gflops {}", t * 1000.0));
    }
    if let Some(g) = p.min_allreduce_gbps {
        c.push_str(&format!(" --min-allreduce-gbps {g}"));
    }
    c
}

/// The exit checkpoint: (timeout in s, at most 10 minutes; the signal's number). A RayJob has none.
pub(super) fn checkpoint(s: &TaskSpec) -> Option<(u64, i32)> {
    s.advanced
        .exit_checkpoint
        .as_ref()
        .filter(|c| c.enabled && s.task_type != TaskType::RayJob)
        .map(|c| (u64::from(c.timeout_seconds.min(600)), signal_number(c.signal)))
}

pub(super) fn signal_number(s: trainyard_core::spec::CheckpointSignal) -> i32 {
    use trainyard_core::spec::CheckpointSignal as S;
    match s {
        S::Sigusr1 => procs::SIGUSR1,
        S::Sigusr2 => procs::SIGUSR2,
        S::Sigterm => procs::SIGTERM,
        S::Sigint => procs::SIGINT,
    }
}

/// The image's root file system here: `/` for `host`, a registered one, or None (its pull fails).
/// Where a task's image comes from on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ImageSource {
    /// `host`, or a catalog image with a root file system an admin keeps here.
    Here,
    /// A registry image (a catalog image's `reference`, or an address the task names): pulled into the cache.
    Registry(String),
    /// A catalog image with neither: it cannot be had here.
    Missing,
}

pub(super) fn image_source(spec: &LaunchSpec) -> ImageSource {
    let name = &spec.task.spec.environment.image;
    if name == trainyard_core::catalog::HOST_IMAGE {
        return ImageSource::Here;
    }
    match spec.catalog.images.get(name) {
        Some(i) if i.rootfs.is_some() => ImageSource::Here,
        Some(i) => i.reference.clone().map_or(ImageSource::Missing, ImageSource::Registry),
        None if trainyard_core::image_ref::ImageRef::parse(name).is_ok() => {
            ImageSource::Registry(name.clone())
        }
        None => ImageSource::Missing,
    }
}

/// A pulled image, as an attempt runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Pulled {
    pub(super) image: trainyard_images::Image,
    /// Who its processes are (its config's `User`).
    pub(super) inner: super::sandbox::Inner,
}

pub(super) fn image_root(spec: &LaunchSpec) -> Option<PathBuf> {
    let image = &spec.task.spec.environment.image;
    if image == "host" {
        Some(PathBuf::from("/"))
    } else {
        spec.catalog.images.get(image).and_then(|i| i.rootfs.as_ref()).map(PathBuf::from)
    }
}

/// What the `host` view must not show besides the data dir: every volume, dataset and model an admin keeps
/// elsewhere (a task reaches those it may use at their mount paths, not through the host's tree).
pub(super) fn hidden(cfg: &LocalConfig, spec: &LaunchSpec) -> Vec<PathBuf> {
    let catalog = &spec.catalog;
    let mut hide = cfg.hide.clone();
    hide.extend(
        catalog
            .volumes
            .values()
            .filter_map(|v| v.path.as_ref())
            .chain(catalog.datasets.values().filter_map(|d| d.path.as_ref()))
            .chain(catalog.models.values().filter_map(|m| m.path.as_ref()))
            .map(PathBuf::from),
    );
    hide
}

/// How long a Ray cluster in debug mode is kept after its entrypoint ended.
fn ray_keep_s(s: &TaskSpec) -> u32 {
    s.ray.as_ref().and_then(|r| r.debug.as_ref()).filter(|d| d.enabled).map_or(0, |d| d.retention_seconds)
}

/// Everything a replica's job is made of, with what the machine holds already resolved.
#[derive(Debug)]
pub(super) struct Plan<'a> {
    pub(super) spec: &'a LaunchSpec,
    pub(super) cfg: &'a LocalConfig,
    pub(super) layout: &'a AttemptLayout,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) replicas: &'a [Replica],
    pub(super) net: &'a Network,
    /// The image's root (None: not here).
    pub(super) root: Option<PathBuf>,
    /// The image, when it was pulled from a registry.
    pub(super) pulled: Option<&'a Pulled>,
    pub(super) mounts: Vec<Mount>,
    pub(super) hide: Vec<PathBuf>,
    /// The attempt's `/etc/resolv.conf` (egress only).
    pub(super) resolv: Option<PathBuf>,
    /// RayJob: the first port of every node (0 otherwise).
    pub(super) ray_base: u16,
    /// RayJob: the driver's job config (its runtime env).
    pub(super) ray_env: Option<String>,
}

impl Plan<'_> {
    fn head_address(&self) -> Result<Ipv4Addr, String> {
        Ok(self.replicas.first().map(|r| self.net.address(r)).transpose()?.unwrap_or(Ipv4Addr::LOCALHOST))
    }

    /// Replica `i`'s env: defaults first (the task may override them), then the task's own, then what the
    /// platform sets (names the validator reserves: the last value of a name wins inside the sandbox).
    pub(super) fn env(&self, i: usize, r: &Replica) -> Result<Vec<(String, String)>, String> {
        use trainyard_core::platform_env as pe;
        let (spec, s) = (self.spec, &self.spec.task.spec);
        let ray = s.task_type == TaskType::RayJob;
        let path = if s.environment.image == "host" {
            self.cfg.host_path.clone()
        } else {
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned()
        };
        let mut env: Vec<(String, String)> = vec![("PATH".into(), path)];
        env.extend(pe::DEFAULTS.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        // The image's own env, under the task's.
        if let Some(p) = self.pulled {
            for kv in &p.image.config.env {
                if let Some((k, v)) = kv.split_once('=') {
                    env.push((k.to_owned(), v.to_owned()));
                }
            }
        }
        for e in &s.environment.env {
            env.push((e.name.clone(), e.value.clone()));
        }
        if let Some(p) = precheck(s) {
            for e in &p.env {
                env.push((e.name.clone(), e.value.clone()));
            }
        }
        let rank = spec.replicas.get(i).map_or(0, |p| p.rank);
        let meta = &spec.task.metadata;
        let platform: Vec<(&str, String)> = vec![
            (pe::HOSTNAME, r.name.clone()),
            (pe::X_USER_NAME, spec.owner.clone()),
            (pe::X_ORG_NAME, meta.project_group.clone()),
            (pe::X_TENANT_ID, meta.project_group.clone()),
            (pe::X_REGION, s.placement.region.clone()),
            (pe::X_CLUSTER, s.placement.cluster.clone()),
            (pe::TASK_UUID, spec.key.task_id.clone()),
            ("TRAINYARD_TASK_NAME", spec.task_name.clone()),
            ("TRAINYARD_REPLICA", r.name.clone()),
            ("TRAINYARD_ROLE", r.role.clone()),
            ("TRAINYARD_ATTEMPT", spec.key.attempt.to_string()),
            ("TRAINYARD_NODE", r.node.clone()),
            ("TRAINYARD_RUNTIME_DIR", RUNTIME_DIR.into()),
            (pe::CUDA_VISIBLE_DEVICES, r.devices.iter().map(u32::to_string).collect::<Vec<_>>().join(",")),
        ];
        env.extend(platform.into_iter().map(|(k, v)| (k.to_owned(), v)));
        if !ray {
            let master = self.replicas.first().map(|r| r.name.clone()).unwrap_or_default();
            let world = spec.replicas.len();
            let resources = spec.replicas.get(i).map(|p| p.resources).unwrap_or_default();
            let procs_per_node = s.pytorch.as_ref().and_then(|p| p.procs_per_node);
            let nproc = procs_per_node.unwrap_or(resources.gpus.max(1) as u32).max(1);
            for (k, v) in [
                (pe::MASTER_ADDR, master.clone()),
                (pe::MASTER_PORT, MASTER_PORT.to_string()),
                (pe::WORLD_SIZE, world.to_string()),
                (pe::RANK, rank.to_string()),
                // torchrun reads its options from PET_* variables.
                (pe::PET_MASTER_ADDR, master),
                (pe::PET_MASTER_PORT, MASTER_PORT.to_string()),
                (pe::PET_NNODES, world.to_string()),
                (pe::PET_NODE_RANK, rank.to_string()),
                (pe::PET_NPROC_PER_NODE, nproc.to_string()),
            ] {
                env.push((k.to_owned(), v));
            }
        } else {
            env.push((pe::RAY_ADDRESS.into(), format!("{}:{}", self.head_address()?, self.ray_base + 1)));
            env.push(("TRAINYARD_ENTRYPOINT".into(), s.environment.cmd.clone()));
            if let Some(cfg) = &self.ray_env {
                // The driver's job config, as Ray's own job submission hands it over: the runtime env.
                env.push((pe::RAY_JOB_CONFIG_JSON_ENV_VAR.into(), cfg.clone()));
            }
            if r.role == "head" && autoscaling(s) {
                env.push(("TRAINYARD_RAY_AUTOSCALE".into(), "1".into()));
            }
        }
        Ok(env)
    }

    /// Replica `i`'s job for its supervisor.
    pub(super) fn job(&self, i: usize, r: &Replica) -> Result<ReplicaJob, String> {
        let (spec, s) = (self.spec, &self.spec.task.spec);
        let resources = spec.replicas.get(i).map(|p| p.resources).unwrap_or_default();
        let cmd = if s.task_type == TaskType::RayJob {
            let at = RayAt { base: self.ray_base, me: self.net.address(r)?, head: self.head_address()? };
            ray_command(
                &RayNode { name: &r.name, role: &r.role },
                &resources,
                &at,
                self.replicas.len(),
                ray_keep_s(s),
            )
        } else {
            s.environment.cmd.clone()
        };
        let metrics = s.advanced.metrics.as_ref().filter(|m| m.enabled);
        let rl = self.layout.replica(&r.name);
        let image = &s.environment.image;
        Ok(ReplicaJob {
            name: r.name.clone(),
            bwrap: self.cfg.bwrap.clone(),
            sandbox: SandboxPlan {
                // An image without a root file system here: its pull fails (and is retried) in `advance`.
                root: self
                    .root
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(format!("/nonexistent/trainyard-image/{image}"))),
                // A registry image's root, mounted by the supervisor where this machine can.
                mount_root: self.pulled.is_some() && self.cfg.image_roots.is_ok(),
                host_view: image == "host",
                hostname: r.name.clone(),
                tmp: rl.tmp(),
                home: rl.home(),
                runtime: rl.runtime(),
                // The replica's copies, in its scratch (see `ReplicaLayout::etc`).
                hosts: rl.etc().join("hosts"),
                passwd: Some(rl.etc().join("passwd")),
                group: Some(rl.etc().join("group")),
                resolv: self.resolv.as_ref().map(|_| rl.etc().join("resolv.conf")),
                hide: self.hide.clone(),
                mounts: self.mounts.clone(),
                inner: self.pulled.map(|p| p.inner.clone()).unwrap_or_default(),
                // A task with a working directory starts in its copy; else where the image says.
                workdir: if s.environment.workdir.is_some() {
                    Some(WORKSPACE.to_owned())
                } else {
                    self.pulled.and_then(|p| p.image.config.working_dir.clone())
                },
                workspace: s.environment.workdir.as_ref().map(|_| rl.workspace()),
            },
            uid: self.uid,
            gid: self.gid,
            net: self.net.replica(r),
            limits: self.cfg.limits,
            env: self.env(i, r)?,
            cmd,
            precheck: precheck(s).map(precheck_command),
            sshd: s.advanced.passwordless_ssh,
            millicpu: resources.vcpus.max(1) * 1000,
            memory_mib: resources.memory_mib.max(64),
            monitor: MonitorJob {
                endpoints: metrics
                    .map(|m| m.endpoints.iter().map(|e| (e.port as u16, e.path.clone())).collect())
                    .unwrap_or_default(),
                interval_s: metrics.map_or(PRESET_INTERVAL_S, |m| u64::from(m.interval_seconds)),
                gpus: r.devices.clone(),
            },
        })
    }

    pub(super) fn jobs(&self) -> Result<Vec<ReplicaJob>, String> {
        self.replicas.iter().enumerate().map(|(i, r)| self.job(i, r)).collect()
    }

    /// What `launch.json` records; `cleanup`: the RayJob's shared storage dir, removed when it ends.
    pub(super) fn launched(&self, cleanup: Option<PathBuf>) -> Launched {
        let (spec, s) = (self.spec, &self.spec.task.spec);
        let autoscale = s.ray.as_ref().and_then(|r| r.autoscaling.as_ref()).filter(|a| a.enabled);
        Launched {
            task_id: spec.key.task_id.clone(),
            attempt: spec.key.attempt,
            uid: self.uid,
            networked: self.net.networked,
            task_type: s.task_type.to_string(),
            image: s.environment.image.clone(),
            image_digest: self.pulled.map(|p| p.image.digest.clone()),
            replicas: self.replicas.to_vec(),
            mount_paths: self.mounts.iter().map(|m| m.dst.display().to_string()).collect(),
            checkpoint: checkpoint(s),
            precheck: precheck(s).is_some(),
            pull_tolerance: s.advanced.image_pull_tolerance,
            ray_base: self.ray_base,
            cleanup,
            autoscale: autoscale.map(|a| Autoscale {
                idle_timeout_s: u64::from(a.idle_timeout_seconds),
                step: if a.mode == trainyard_core::spec::AutoscalingMode::Conservative {
                    1
                } else {
                    a.max_workers
                },
                worker_vcpus: spec
                    .replicas
                    .iter()
                    .find(|p| p.role == "worker")
                    .map_or(1, |p| p.resources.vcpus.max(1)),
            }),
        }
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
