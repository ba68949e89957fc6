//! Launching an attempt: its directories and files (owned by the attempt's uid where the sandbox writes),
//! each replica's job for its supervisor, and the supervisors themselves.

use super::*;

/// The precheck program, written into every replica's runtime dir when the precheck is on.
pub const PRECHECK_PY: &str = include_str!("precheck.py");

impl LocalBackend {
    /// Where a volume, dataset or model lives: an admin's own path as the admin keeps it, or a dir Trainyard
    /// keeps under the data dir (`kind/name`), shared with the sandboxes at `mode`.
    pub(super) fn storage_home(
        &self,
        kind: &str,
        name: &str,
        path: Option<&String>,
        mode: u32,
    ) -> Result<PathBuf, String> {
        if let Some(p) = path {
            let _ = std::fs::create_dir_all(p);
            return Ok(PathBuf::from(p));
        }
        make_passage(&self.cfg.data_dir.join(kind))?;
        let dir = self.cfg.data_dir.join(kind).join(name);
        storage_dir(&dir, mode)?;
        Ok(dir)
    }

    /// Builds the attempt's directories, files and supervisor jobs.
    pub(super) fn prepare(
        &self,
        spec: &LaunchSpec,
        inner: &Inner,
        ray_base: Option<u16>,
    ) -> Result<(PathBuf, Launched, Vec<ReplicaJob>), String> {
        let task = &spec.task;
        let s = &task.spec;
        let catalog = &spec.catalog;
        let dir = attempt_dir(&self.cfg.runs_dir, &spec.key);
        for d in [&self.cfg.runs_dir, dir.parent().unwrap_or(&dir), &dir] {
            make_passage(d)?;
        }
        let ray = s.task_type == TaskType::RayJob;
        // A running attempt being resized keeps its uid and its replicas' places.
        let have: Vec<Replica> = inner.runs.get(&spec.key).map(|r| r.l.replicas.clone()).unwrap_or_default();
        // An attempt prepared before a restart but never started keeps the uid its dirs belong to.
        // (An attempt launched by a version without sandbox uids has none: its new replicas get one.)
        let uid = match inner.runs.get(&spec.key) {
            Some(run) if run.l.uid >= UID_BASE => run.l.uid,
            _ => UID_BASE + slots::claim(&dir)?,
        };
        let gid = SANDBOX_GID;

        // Replicas: names, GPUs.
        let mut used = Self::gpus_in_use(inner);
        let mut replicas = Vec::new();
        for p in &spec.replicas {
            let node = catalog.nodes.get(&p.node);
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
        // Places on the network: kept ones stay, new ones take the lowest free.
        let mut taken: BTreeSet<usize> = have.iter().map(|r| r.slot).collect();
        for r in replicas.iter_mut() {
            if !have.iter().any(|h| h.name == r.name) {
                let free = (0..).find(|i| !taken.contains(i)).unwrap_or(0);
                taken.insert(free);
                r.slot = free;
            }
        }
        let master = replicas.first().map(|r| r.name.clone()).unwrap_or_default();
        let autoscaling = s.ray.as_ref().and_then(|r| r.autoscaling.as_ref()).is_some_and(|a| a.enabled);
        let egress = self.cfg.egress.as_ref().filter(|_| self.cfg.ip.is_some());
        let networked = self.cfg.ip.is_some() && (replicas.len() > 1 || autoscaling || egress.is_some());
        let switch = netns::attempt_name(&spec.key.task_id, spec.key.attempt);
        let uplink = match egress {
            Some(e) => Some(
                netns::Uplink::for_slot(e, &self.cfg.network, &switch, uid.saturating_sub(UID_BASE))
                    .ok_or("every egress uplink is taken: too many attempts with egress run at once")?,
            ),
            None => None,
        };
        let address = |r: &Replica| -> Result<std::net::Ipv4Addr, String> {
            if !networked {
                return Ok(std::net::Ipv4Addr::LOCALHOST);
            }
            self.cfg.network.address(r.slot).ok_or_else(|| {
                format!("the replicas' network range holds {} replicas per task", self.cfg.network.capacity())
            })
        };
        if networked && let Some(ip) = &self.cfg.ip {
            netns::create_switch(ip, &switch, egress.zip(uplink.as_ref()))
                .map_err(|e| format!("cannot make the attempt's network: {e}"))?;
        }

        // Mounts.
        let mut mounts = Vec::new();
        for v in &s.environment.volumes {
            let path = catalog.volumes.get(&v.volume).and_then(|x| x.path.as_ref());
            let src = self.storage_home("volumes", &v.volume, path, 0o2770)?;
            mounts.push(Mount { src, dst: v.mount_path.clone().into(), read_only: v.read_only });
        }
        for d in &s.environment.datasets {
            let path = catalog.datasets.get(&d.dataset).and_then(|x| x.path.as_ref());
            let src = self.storage_home("datasets", &d.dataset, path, 0o2750)?;
            mounts.push(Mount { src, dst: d.mount_path.clone().into(), read_only: true });
        }
        for m in &s.environment.models {
            let path = catalog.models.get(&m.model).and_then(|x| x.path.as_ref());
            let src = self.storage_home("models", &m.model, path, 0o2750)?;
            mounts.push(Mount { src, dst: m.mount_path.clone().into(), read_only: true });
        }
        // RayJob shared storage: (its dir, removed when the attempt ends).
        let mut shared_dir = None;
        if let Some(sh) = s.ray.as_ref().and_then(|r| r.shared_storage.as_ref()) {
            let path = catalog.volumes.get(&sh.volume).and_then(|x| x.path.as_ref());
            let vol = self.storage_home("volumes", &sh.volume, path, 0o2770)?;
            // Inside a volume other tasks write to: made fresh, never a link someone planted.
            let src = vol.join(format!("ray-{}", spec.task_name));
            match std::fs::symlink_metadata(&src) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(format!("{} is not a directory", src.display())),
                Err(_) => {
                    std::fs::create_dir(&src).map_err(|e| format!("cannot create {}: {e}", src.display()))?
                }
            }
            own(&src, uid, gid, 0o2770)?;
            shared_dir = Some((src.clone(), sh.cleanup_on_exit));
            mounts.push(Mount { src, dst: "/tmp/ray".into(), read_only: false });
        }
        let mount_paths: Vec<String> = mounts.iter().map(|m| m.dst.display().to_string()).collect();
        // What the `host` view must not show besides the data dir: every volume, dataset and model an admin
        // keeps elsewhere (a task reaches those it may use at their mount paths, not through the host's tree).
        let mut hide = self.cfg.hide.clone();
        hide.extend(
            catalog
                .volumes
                .values()
                .filter_map(|v| v.path.as_ref())
                .chain(catalog.datasets.values().filter_map(|d| d.path.as_ref()))
                .chain(catalog.models.values().filter_map(|m| m.path.as_ref()))
                .map(PathBuf::from),
        );

        // The hosts file: every replica's name at its address (written in place: running replicas bind it).
        let mut hosts = String::from("127.0.0.1 localhost\n::1 localhost ip6-localhost\n");
        for r in &replicas {
            hosts.push_str(&format!("{} {}\n", address(r)?, r.name));
        }
        std::fs::write(dir.join("hosts"), hosts).map_err(|e| e.to_string())?;
        own(&dir.join("hosts"), 0, 0, 0o644)?;

        let ssh = s.advanced.passwordless_ssh;
        if ssh {
            make_keys(&dir.join("ssh"))?;
        }

        let precheck = s.advanced.precheck.as_ref().filter(|p| p.enabled && !ray);
        let checkpoint = s
            .advanced
            .exit_checkpoint
            .as_ref()
            .filter(|c| c.enabled && !ray)
            .map(|c| (u64::from(c.timeout_seconds.min(600)), signal_number(c.signal)));
        let image = s.environment.image.clone();
        let host_view = image == "host";
        let root = if host_view {
            Some(PathBuf::from("/"))
        } else {
            catalog.images.get(&image).and_then(|i| i.rootfs.as_ref()).map(PathBuf::from)
        };
        let master_port = MASTER_PORT;
        let autoscale = s.ray.as_ref().and_then(|r| r.autoscaling.as_ref()).filter(|a| a.enabled);
        let ray_base = match ray_base {
            Some(b) => b,
            None if ray => RAY_BASE_PORT,
            None => 0,
        };
        let ray_env = if ray { ray_job_config(s)? } else { None };
        let world = spec.replicas.len();
        let procs_per_node = s.pytorch.as_ref().and_then(|p| p.procs_per_node);
        // The sandbox's users: the image's, and the one replicas run as.
        let image_file =
            |name: &str| root.as_ref().and_then(|r| std::fs::read_to_string(r.join("etc").join(name)).ok());
        let (passwd, group) = (dir.join("passwd"), dir.join("group"));
        std::fs::write(&passwd, sandbox::identity_file(image_file("passwd").as_deref(), true))
            .map_err(|e| e.to_string())?;
        std::fs::write(&group, sandbox::identity_file(image_file("group").as_deref(), false))
            .map_err(|e| e.to_string())?;
        own(&passwd, 0, 0, 0o644)?;
        own(&group, 0, 0, 0o644)?;
        // With egress, names resolve through the host's upstream servers (a resolver on the host's loopback
        // is out of reach, as the host is).
        let resolv = if uplink.is_some() {
            let path = dir.join("resolv.conf");
            std::fs::write(&path, resolv_conf()).map_err(|e| e.to_string())?;
            own(&path, 0, 0, 0o644)?;
            Some(path)
        } else {
            None
        };
        let head_address =
            replicas.first().map(&address).transpose()?.unwrap_or(std::net::Ipv4Addr::LOCALHOST);

        let mut jobs = Vec::new();
        for (i, r) in replicas.iter().enumerate() {
            let rdir = dir.join(&r.name);
            let (scratch, runtime) = (rdir.join("scratch"), rdir.join("runtime"));
            let (tmp, home) = (scratch.join("tmp"), scratch.join("root"));
            // A replica that already runs (the attempt is being resized) has its dirs, and they are its own
            // now: nothing of the server's is written into them again.
            let fresh = !rdir.exists();
            if fresh {
                make_passage(&rdir)?;
                for d in [&scratch, &tmp, &home, &runtime] {
                    std::fs::create_dir(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
                }
                // Hostfiles list every replica with its slots.
                let slots = procs_per_node.unwrap_or(1).max(1);
                let hostfile: String =
                    replicas.iter().map(|r| format!("{} slots={slots}\n", r.name)).collect();
                let names: String = replicas.iter().map(|r| format!("{}\n", r.name)).collect();
                std::fs::write(home.join("hostfile"), hostfile).map_err(|e| e.to_string())?;
                std::fs::write(home.join("hostfile.hostname"), names).map_err(|e| e.to_string())?;
                if ssh {
                    ssh_material(&dir.join("ssh"), &home, &runtime, &replicas)?;
                }
                if precheck.is_some() {
                    std::fs::write(runtime.join("precheck.py"), PRECHECK_PY).map_err(|e| e.to_string())?;
                }
            }
            let resources = spec.replicas.get(i).map(|p| p.resources).unwrap_or_default();
            // Defaults first (the task may override them), then the task's own, then what the platform sets
            // (names the validator reserves: the last value of a name wins inside the sandbox).
            use trainyard_core::platform_env as pe;
            let path = if image == "host" {
                self.cfg.host_path.clone()
            } else {
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned()
            };
            let mut env: Vec<(String, String)> = vec![("PATH".into(), path)];
            env.extend(pe::DEFAULTS.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
            for e in &s.environment.env {
                env.push((e.name.clone(), e.value.clone()));
            }
            if let Some(p) = precheck {
                for e in &p.env {
                    env.push((e.name.clone(), e.value.clone()));
                }
            }
            let rank = spec.replicas.get(i).map_or(0, |p| p.rank);
            let platform: Vec<(&str, String)> = vec![
                (pe::HOSTNAME, r.name.clone()),
                (pe::X_USER_NAME, spec.owner.clone()),
                (pe::X_ORG_NAME, task.metadata.project_group.clone()),
                (pe::X_TENANT_ID, task.metadata.project_group.clone()),
                (pe::X_REGION, s.placement.region.clone()),
                (pe::X_CLUSTER, s.placement.cluster.clone()),
                (pe::TASK_UUID, spec.key.task_id.clone()),
                ("TRAINYARD_TASK_NAME", spec.task_name.clone()),
                ("TRAINYARD_REPLICA", r.name.clone()),
                ("TRAINYARD_ROLE", r.role.clone()),
                ("TRAINYARD_ATTEMPT", spec.key.attempt.to_string()),
                ("TRAINYARD_NODE", r.node.clone()),
                ("TRAINYARD_RUNTIME_DIR", RUNTIME_DIR.into()),
                (
                    pe::CUDA_VISIBLE_DEVICES,
                    r.devices.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
                ),
            ];
            env.extend(platform.into_iter().map(|(k, v)| (k.to_owned(), v)));
            if !ray {
                let nproc = procs_per_node.unwrap_or(resources.gpus.max(1) as u32).max(1);
                for (k, v) in [
                    (pe::MASTER_ADDR, master.clone()),
                    (pe::MASTER_PORT, master_port.to_string()),
                    (pe::WORLD_SIZE, world.to_string()),
                    (pe::RANK, rank.to_string()),
                    // torchrun reads its options from PET_* variables.
                    (pe::PET_MASTER_ADDR, master.clone()),
                    (pe::PET_MASTER_PORT, master_port.to_string()),
                    (pe::PET_NNODES, world.to_string()),
                    (pe::PET_NODE_RANK, rank.to_string()),
                    (pe::PET_NPROC_PER_NODE, nproc.to_string()),
                ] {
                    env.push((k.to_owned(), v));
                }
            } else {
                env.push((pe::RAY_ADDRESS.into(), format!("{head_address}:{}", ray_base + 1)));
                env.push(("TRAINYARD_ENTRYPOINT".into(), s.environment.cmd.clone()));
                if let Some(cfg) = &ray_env {
                    // The driver's job config, as Ray's own job submission hands it over: the runtime env.
                    env.push((pe::RAY_JOB_CONFIG_JSON_ENV_VAR.into(), cfg.clone()));
                }
                if r.role == "head" {
                    if fresh {
                        std::fs::write(runtime.join("ray_probe.py"), RAY_PROBE_PY)
                            .map_err(|e| e.to_string())?;
                    }
                    if autoscale.is_some() {
                        env.push(("TRAINYARD_RAY_AUTOSCALE".into(), "1".into()));
                    }
                }
            }
            let keep_s = s
                .ray
                .as_ref()
                .and_then(|r| r.debug.as_ref())
                .filter(|d| d.enabled)
                .map_or(0, |d| d.retention_seconds);
            if fresh {
                for d in [&scratch, &tmp, &home, &runtime] {
                    own(d, uid, gid, 0o700)?;
                }
                own_tree(&home, uid, gid)?;
                own_tree(&runtime, uid, gid)?;
            }
            let cmd = if ray {
                let at = RayAt { base: ray_base, me: address(r)?, head: head_address };
                ray_command(r, &resources, &at, replicas.len(), keep_s)
            } else {
                s.environment.cmd.clone()
            };
            let precheck_cmd = precheck.map(|p| {
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
            });
            jobs.push(ReplicaJob {
                name: r.name.clone(),
                bwrap: self.cfg.bwrap.clone(),
                sandbox: SandboxPlan {
                    // An image without a root file system here: its pull fails (and is retried) in `advance`.
                    root: root
                        .clone()
                        .unwrap_or_else(|| PathBuf::from(format!("/nonexistent/trainyard-image/{image}"))),
                    host_view,
                    hostname: r.name.clone(),
                    tmp,
                    home,
                    runtime,
                    hosts: dir.join("hosts"),
                    passwd: Some(passwd.clone()),
                    group: Some(group.clone()),
                    resolv: resolv.clone(),
                    hide: hide.clone(),
                    mounts: mounts.clone(),
                },
                uid,
                gid,
                net: networked.then(|| netns::ReplicaNet {
                    switch: switch.clone(),
                    name: format!("{switch}-{}", r.slot),
                    index: r.slot,
                    address: address(r).unwrap_or(std::net::Ipv4Addr::LOCALHOST),
                    prefix: self.cfg.network.prefix,
                    gateway: uplink.as_ref().map(|u| u.gateway),
                }),
                limits: self.cfg.limits,
                env,
                cmd,
                precheck: precheck_cmd,
                sshd: ssh,
                millicpu: resources.vcpus.max(1) * 1000,
                memory_mib: resources.memory_mib.max(64),
                monitor: metrics::MonitorJob {
                    endpoints: s
                        .advanced
                        .metrics
                        .as_ref()
                        .filter(|m| m.enabled)
                        .map(|m| m.endpoints.iter().map(|e| (e.port as u16, e.path.clone())).collect())
                        .unwrap_or_default(),
                    interval_s: s
                        .advanced
                        .metrics
                        .as_ref()
                        .filter(|m| m.enabled)
                        .map_or(PRESET_INTERVAL_S, |m| u64::from(m.interval_seconds)),
                    gpus: r.devices.clone(),
                },
            });
        }
        let l = Launched {
            task_id: spec.key.task_id.clone(),
            attempt: spec.key.attempt,
            uid,
            networked,
            task_type: s.task_type.to_string(),
            image,
            replicas,
            mount_paths,
            checkpoint,
            precheck: precheck.is_some(),
            pull_tolerance: s.advanced.image_pull_tolerance,
            ray_base,
            cleanup: shared_dir.filter(|(_, clean)| *clean).map(|(dir, _)| dir),
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
        };
        let bytes = serde_json::to_vec_pretty(&l).map_err(|e| e.to_string())?;
        write_atomic(&dir.join("launch.json"), &bytes).map_err(|e| e.to_string())?;
        // Recorded once the attempt counts as live (it has a launch.json), so that no start sweeps it away.
        if networked {
            switches::record(&switch, &dir);
        }
        Ok((dir, l, jobs))
    }

    pub(super) fn spawn(&self, dir: &Path, jobs: &[ReplicaJob]) -> Vec<std::process::Child> {
        let _ = std::fs::write(dir.join("spawned"), b"");
        let mut children = Vec::new();
        for job in jobs {
            let (exe, args) = &self.cfg.supervisor;
            let mut c = std::process::Command::new(exe);
            // A fixed environment: nothing of the server's (its token, a preload) reaches the supervisor.
            c.args(args)
                .arg(dir.join(&job.name))
                .env_clear()
                .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            std::os::unix::process::CommandExt::process_group(&mut c, 0);
            match c.spawn() {
                Ok(mut child) => {
                    if let Some(mut stdin) = child.stdin.take() {
                        let _ = std::io::Write::write_all(
                            &mut stdin,
                            &serde_json::to_vec(job).unwrap_or_default(),
                        );
                    }
                    children.push(child);
                }
                Err(e) => {
                    let rdir = dir.join(&job.name);
                    let _ = std::fs::write(rdir.join("log"), format!("cannot start the supervisor: {e}\n"));
                    ReplicaState::ended(supervisor::ExitRecord { code: Some(127), ..Default::default() })
                        .write(&rdir);
                }
            }
        }
        children
    }

    pub(super) fn available_images(spec: &LaunchSpec) -> String {
        let mut names: Vec<&str> = vec!["host"];
        names.extend(
            spec.catalog
                .images
                .iter()
                .filter(|(n, i)| *n != "host" && i.rootfs.is_some())
                .map(|(n, _)| n.as_str()),
        );
        names.join(", ")
    }

    /// The replicas of an attempt, by name and role (from its `launch.json`).
    pub fn replica_names(&self, key: &AttemptKey) -> Vec<(String, String)> {
        std::fs::read(attempt_dir(&self.cfg.runs_dir, key).join("launch.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Launched>(&b).ok())
            .map(|l| l.replicas.into_iter().map(|r| (r.name, r.role)).collect())
            .unwrap_or_default()
    }
}
