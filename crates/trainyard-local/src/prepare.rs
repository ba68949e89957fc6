//! Launching an attempt: what the machine holds (its uid slot, the network, storage dirs, the image's users)
//! resolved and handed to [`super::plan`], then the attempt's directories and files written (owned by the
//! attempt's uid where the sandbox writes) and the supervisors started.

use super::*;
use plan::{Network, Plan};
use pool::SupervisorPool;
use std::io::Write;
use supervisor::PooledJob;

pub use trainyard_runtime::replica::PRECHECK_PY;

/// The task's mounts, and Ray's shared storage dir with whether it goes when the attempt ends.
type Mounts = (Vec<Mount>, Option<(PathBuf, bool)>);

/// An attempt ready to start: its dir, what `launch.json` says, each replica's job.
pub(super) type Prepared = (PathBuf, Launched, Vec<ReplicaJob>);

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

    /// The task's volumes, datasets, models and Ray's shared storage, in that order, with their dirs made;
    /// and the shared storage's dir with whether it goes when the attempt ends.
    fn mounts(&self, spec: &LaunchSpec, uid: u32) -> Result<Mounts, String> {
        let (s, catalog) = (&spec.task.spec, &spec.catalog);
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
            own(&src, uid, SANDBOX_GID, 0o2770)?;
            shared_dir = Some((src.clone(), sh.cleanup_on_exit));
            mounts.push(Mount { src, dst: "/tmp/ray".into(), read_only: false });
        }
        Ok((mounts, shared_dir))
    }

    /// Builds the attempt's directories, files and supervisor jobs for `replicas` (placed by the caller);
    /// `uid`: the one a running attempt being resized has, None to claim one.
    pub(super) fn prepare(
        &self,
        spec: &LaunchSpec,
        replicas: Vec<Replica>,
        uid: Option<u32>,
        ray_base: Option<u16>,
        pulled: Option<&plan::Pulled>,
    ) -> Result<Prepared, String> {
        let s = &spec.task.spec;
        let layout = AttemptLayout::new(&self.cfg.runs_dir, &spec.key);
        let dir = layout.dir.clone();
        for d in [&self.cfg.runs_dir, dir.parent().unwrap_or(&dir), &dir] {
            make_passage(d)?;
        }
        let ray = s.task_type == TaskType::RayJob;
        // An attempt prepared before a restart but never started keeps the uid its dirs belong to (the
        // claim names its dir). An attempt launched by a version without sandbox uids has none: its new
        // replicas get one.
        let uid = match uid {
            Some(uid) => uid,
            None => UID_BASE + slots::claim(&dir)?,
        };
        let gid = SANDBOX_GID;

        let egress = self.cfg.egress.as_ref().filter(|_| self.cfg.ip.is_some());
        let switch = netns::attempt_name(&spec.key.task_id, spec.key.attempt);
        let uplink = match egress {
            Some(e) => Some(
                netns::Uplink::for_slot(e, &self.cfg.network, &switch, uid.saturating_sub(UID_BASE))
                    .ok_or("every egress uplink is taken: too many attempts with egress run at once")?,
            ),
            None => None,
        };
        let net = Network {
            networked: Network::wanted(
                self.cfg.ip.is_some(),
                replicas.len(),
                plan::autoscaling(s),
                egress.is_some(),
            ),
            range: self.cfg.network,
            switch,
            gateway: uplink.as_ref().map(|u| u.gateway),
        };
        if net.networked
            && let Some(ip) = &self.cfg.ip
        {
            netns::create_switch(ip, &net.switch, egress.zip(uplink.as_ref()))
                .map_err(|e| format!("cannot make the attempt's network: {e}"))?;
        }
        let (mounts, shared_dir) = self.mounts(spec, uid)?;

        // The hosts file: every replica's name at its address (written in place: running replicas bind it).
        std::fs::write(layout.hosts(), plan::hosts_file(&replicas, &net)?).map_err(|e| e.to_string())?;
        own(&layout.hosts(), 0, 0, 0o644)?;
        let ssh = s.advanced.passwordless_ssh;
        if ssh {
            make_keys(&layout.ssh())?;
        }
        let root = match pulled {
            Some(p) => Some(p.image.rootfs.clone()),
            None => plan::image_root(spec),
        };
        // The sandbox's users: the image's (a registry image's as read when it was unpacked; an admin's root
        // file system's read inside it, regular files only, bounded), and the one replicas run as.
        let image_file = |name: &str| -> Result<Option<String>, String> {
            if let Some(p) = pulled {
                let a = &p.image.accounts;
                return Ok(if name == "passwd" { a.passwd.clone() } else { a.group.clone() });
            }
            let Some(r) = root.as_ref() else { return Ok(None) };
            let bytes = trainyard_images::unpack::read_in_root(
                r,
                &format!("etc/{name}"),
                trainyard_images::Accounts::MAX_BYTES,
            )
            .map_err(|e| format!("the image's {e}"))?;
            Ok(bytes.map(|b| String::from_utf8_lossy(&b).into_owned()))
        };
        let (passwd, group) = (layout.passwd(), layout.group());
        let inner = pulled.map(|p| p.inner.clone()).unwrap_or_default();
        std::fs::write(&passwd, sandbox::identity_file(image_file("passwd")?.as_deref(), true, &inner))
            .map_err(|e| e.to_string())?;
        std::fs::write(&group, sandbox::identity_file(image_file("group")?.as_deref(), false, &inner))
            .map_err(|e| e.to_string())?;
        own(&passwd, 0, 0, 0o644)?;
        own(&group, 0, 0, 0o644)?;
        // With egress, names resolve through the host's upstream servers (a resolver on the host's loopback
        // is out of reach, as the host is).
        let resolv = if uplink.is_some() {
            std::fs::write(layout.resolv(), resolv_conf()).map_err(|e| e.to_string())?;
            own(&layout.resolv(), 0, 0, 0o644)?;
            Some(layout.resolv())
        } else {
            None
        };
        let plan = Plan {
            spec,
            cfg: &self.cfg,
            layout: &layout,
            uid,
            gid,
            replicas: &replicas,
            net: &net,
            root,
            pulled,
            mounts,
            hide: plan::hidden(&self.cfg, spec),
            resolv,
            ray_base: match ray_base {
                Some(b) => b,
                None if ray => RAY_BASE_PORT,
                None => 0,
            },
            ray_env: if ray { ray_job_config(s)? } else { None },
        };
        let jobs = plan.jobs()?;
        let procs_per_node = s.pytorch.as_ref().and_then(|p| p.procs_per_node);
        let (hostfile, names) = plan::hostfiles(&replicas, procs_per_node);
        for r in &replicas {
            let rl = layout.replica(&r.name);
            // A replica that already runs (the attempt is being resized) has its dirs, and they are its own
            // now: nothing of the server's is written into them again.
            if rl.dir.exists() {
                continue;
            }
            let (scratch, tmp, home, runtime) = (rl.scratch(), rl.tmp(), rl.home(), rl.runtime());
            make_passage(&rl.dir)?;
            for d in [&scratch, &tmp, &home, &runtime, &rl.etc()] {
                std::fs::create_dir(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
            }
            // The attempt's files the sandbox binds at `/etc`, copied into the replica's scratch (the platform's,
            // read-only to the replica); its supervisor copies `hosts` again when a resize rewrites it.
            own(&rl.etc(), 0, 0, 0o755)?;
            let etc_files =
                [Some(layout.hosts()), Some(passwd.clone()), Some(group.clone()), plan.resolv.clone()];
            for src in etc_files.into_iter().flatten() {
                let dst = rl.etc().join(src.file_name().unwrap_or_default());
                std::fs::copy(&src, &dst).map_err(|e| format!("cannot copy {}: {e}", src.display()))?;
                own(&dst, 0, 0, 0o644)?;
            }
            std::fs::write(home.join("hostfile"), &hostfile).map_err(|e| e.to_string())?;
            std::fs::write(home.join("hostfile.hostname"), &names).map_err(|e| e.to_string())?;
            if ssh {
                ssh_material(&layout.ssh(), &home, &runtime, &replicas, &inner.name)?;
            }
            if plan::precheck(s).is_some() {
                std::fs::write(runtime.join("precheck.py"), PRECHECK_PY).map_err(|e| e.to_string())?;
            }
            if ray && r.role == "head" {
                std::fs::write(runtime.join("ray_probe.py"), RAY_PROBE_PY).map_err(|e| e.to_string())?;
            }
            // The scratch dir is the platform's (the sandbox passes through it to its dirs, and it becomes the
            // root of the replica's scratch file system); what is in it is the replica's.
            own(&scratch, 0, 0, 0o711)?;
            for d in [&tmp, &home, &runtime] {
                own(d, uid, gid, 0o700)?;
            }
            own_tree(&home, uid, gid)?;
            own_tree(&runtime, uid, gid)?;
            // The task's working directory: a copy of its own, the attempt's uid's (the scratch holds it, so
            // it counts against nothing of the replica's and goes with it).
            if let Some(w) = &s.environment.workdir {
                trainyard_workdir::store::Store::new(&self.cfg.workdirs)
                    .materialize(&spec.task.metadata.project_group, w, &rl.workspace(), Some((uid, gid)))
                    .map_err(|e| format!("the working directory: {e}"))?;
            }
        }
        let l = plan.launched(shared_dir.filter(|(_, clean)| *clean).map(|(dir, _)| dir));
        let bytes = serde_json::to_vec_pretty(&l).map_err(|e| e.to_string())?;
        write_atomic(&layout.launch_json(), &bytes).map_err(|e| e.to_string())?;
        // Recorded once the attempt counts as live (it has a launch.json), so that no start sweeps it away.
        if net.networked {
            switches::record(&net.switch, &dir);
        }
        Ok((dir, l, jobs))
    }

    /// Takes a preparation's outcome into the attempt's run: its supervisors start (or it waits for its
    /// image), nothing starts when it was stopped meanwhile, and one that could not be prepared ends as the
    /// machine's failure, with its reason, recorded: not tried again on every tick without a word (the
    /// fault-tolerance budget decides whether another attempt follows).
    pub(super) fn prepared(&self, spec: &LaunchSpec, result: Result<Prepared, String>) {
        let mut inner = self.lock();
        let key = &spec.key;
        let Some(run) = inner.runs.get_mut(key) else { return };
        let (dir, l, jobs) = match result {
            Ok(prepared) => prepared,
            Err(why) => {
                let obs = Observation::Finished {
                    key: key.clone(),
                    reason: Reason::NodeFailed,
                    message: format!("the attempt could not be prepared on this machine: {why}"),
                };
                let recorded = AttemptLayout::at(&run.dir).outcome_json();
                if let Err(e) =
                    write_atomic(&recorded, &serde_json::to_vec(&Recorded::from(&obs)).unwrap_or_default())
                {
                    eprintln!(
                        "trainyard: cannot record {}'s outcome in {}: {e}",
                        key.task_id,
                        recorded.display()
                    );
                }
                if let Some(ip) = &self.cfg.ip {
                    let switch = netns::attempt_name(&key.task_id, key.attempt);
                    netns::delete_switch(ip, &switch);
                    switches::forget(&switch);
                }
                inner.runs.remove(key);
                inner.replay.push(obs);
                return;
            }
        };
        run.offsets = l.replicas.iter().map(|r| (r.name.clone(), 0)).collect();
        run.l = l;
        if run.p.stop.is_some() {
            // Stopped while it was prepared: nothing starts, and the next poll reports it stopped.
            for r in &run.l.replicas {
                ReplicaState::ended(supervisor::ExitRecord { stopped: true, ..Default::default() })
                    .write(&AttemptLayout::at(&dir).replica(&r.name).dir);
            }
            run.stage = Stage::Running;
            return;
        }
        // The pull: `host` and registered root file systems are here at once; anything else is retried (or
        // fails) as the image pull tolerance says, on the next polls.
        if !jobs.first().is_some_and(|j| j.sandbox.root.is_dir()) {
            let pulling = Pulling { tries: 0, next_at_ms: 0, available: Self::available_images(spec) };
            run.stage = Stage::Pulling { pulling, jobs };
            return;
        }
        // Started without the lock, so that polls meanwhile do not wait for them. A stop meanwhile finds the
        // attempt running and writes its `stop.json`, which each supervisor follows once it runs.
        run.stage = Stage::Running;
        drop(inner);
        let children = self.spawn(&dir, &jobs);
        match self.lock().runs.get_mut(key) {
            Some(run) => run.children.extend(children),
            // Ended already (no supervisor could start): reaped here instead.
            None => {
                std::thread::spawn(move || children.into_iter().for_each(|mut c| drop(c.wait())));
            }
        }
    }

    pub(super) fn spawn(&self, dir: &Path, jobs: &[ReplicaJob]) -> Vec<std::process::Child> {
        let layout = AttemptLayout::at(dir);
        let _ = std::fs::write(layout.spawned(), b"");
        let mut children = Vec::new();
        for job in jobs {
            let replica_dir = layout.replica(&job.name).dir;
            // An idle pooled supervisor when there is one (see `pool`), else one started now.
            let pooled = self.pool.take().and_then(|mut child| {
                let sent = PooledJob { dir: replica_dir.clone(), job: job.clone() };
                let given = child.stdin.take().is_some_and(|mut stdin| {
                    stdin.write_all(&serde_json::to_vec(&sent).unwrap_or_default()).is_ok()
                });
                if given {
                    return Some(child);
                }
                let _ = child.kill();
                std::thread::spawn(move || drop(child.wait()));
                None
            });
            if let Some(child) = pooled {
                children.push(child);
                continue;
            }
            let (exe, args) = &self.cfg.supervisor;
            match SupervisorPool::command(exe, args, &replica_dir).spawn() {
                Ok(mut child) => {
                    if let Some(mut stdin) = child.stdin.take() {
                        let _ = stdin.write_all(&serde_json::to_vec(job).unwrap_or_default());
                    }
                    children.push(child);
                }
                Err(e) => {
                    let rl = layout.replica(&job.name);
                    let _ = std::fs::write(rl.log(), format!("cannot start the supervisor: {e}\n"));
                    ReplicaState::ended(supervisor::ExitRecord { code: Some(127), ..Default::default() })
                        .write(&rl.dir);
                }
            }
        }
        self.pool.fill();
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
        std::fs::read(AttemptLayout::new(&self.cfg.runs_dir, key).launch_json())
            .ok()
            .and_then(|b| serde_json::from_slice::<Launched>(&b).ok())
            .map(|l| l.replicas.into_iter().map(|r| (r.name, r.role)).collect())
            .unwrap_or_default()
    }
}
