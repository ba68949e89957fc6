//! An attempt's progress read from disk: each poll reads what its supervisors wrote (state, events, the
//! log's end of a replica that ended, Ray's view), hands it to [`super::outcome`] for the decisions, and
//! carries them out (supervisors started after the image pull, `stop.json` for the rest, the record and
//! the clean-up once it ended).

use super::*;

impl Run {
    pub(super) fn new(
        dir: PathBuf,
        l: Launched,
        stage: Stage,
        children: Vec<std::process::Child>,
        offsets: BTreeMap<String, u64>,
    ) -> Run {
        Run { dir, l, stage, pulled: None, children, p: Progress::default(), offsets }
    }

    pub(super) fn key(&self) -> AttemptKey {
        AttemptKey { task_id: self.l.task_id.clone(), attempt: self.l.attempt }
    }

    fn layout(&self) -> AttemptLayout {
        AttemptLayout::at(&self.dir)
    }

    /// Asks the chosen replicas' supervisors to stop (`stop.json`). Err names the requests that could not be
    /// written (those replicas go on): the caller reports it, and asking again writes what is missing.
    pub(super) fn stop_replicas(
        &self,
        which: impl Fn(&Replica) -> bool,
        req: &StopRequest,
    ) -> Result<(), String> {
        let mut failed = Vec::new();
        for r in self.l.replicas.iter().filter(|r| which(r)) {
            let path = self.layout().replica(&r.name).stop_json();
            if !path.exists()
                && let Err(e) = write_atomic(&path, &serde_json::to_vec(req).unwrap_or_default())
            {
                failed.push(format!("{}: {e}", path.display()));
            }
        }
        if failed.is_empty() { Ok(()) } else { Err(format!("cannot ask to stop: {}", failed.join("; "))) }
    }

    /// Collects new supervisor events as notes.
    pub(super) fn drain_events(&mut self, out: &mut Vec<Observation>) {
        let key = self.key();
        for r in &self.l.replicas {
            let rl = self.layout().replica(&r.name);
            let at = self.offsets.get(&r.name).copied().unwrap_or(0);
            let Ok(mut f) = std::fs::File::open(rl.events()) else { continue };
            if f.metadata().map_or(0, |m| m.len()) <= at || f.seek(std::io::SeekFrom::Start(at)).is_err() {
                continue;
            }
            let mut buf = Vec::new();
            let _ = f.read_to_end(&mut buf);
            let complete = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            for line in buf[..complete].split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                if let Ok(e) = serde_json::from_slice::<Event>(line) {
                    out.push(Observation::Note { key: key.clone(), reason: e.reason, message: e.message });
                }
            }
            let next = at + complete as u64;
            self.offsets.insert(r.name.clone(), next);
            let _ = std::fs::write(rl.events_offset(), next.to_string());
        }
    }

    /// What the supervisors wrote, read for [`outcome::step`].
    fn read(&self) -> Seen {
        let layout = self.layout();
        let states: Vec<(Replica, Option<ReplicaState>)> =
            self.l.replicas.iter().map(|r| (r.clone(), read_state(&layout.replica(&r.name).dir))).collect();
        // A supervisor that died without recording an exit (the machine restarted, someone killed it). Its
        // state is read again once it is found gone: a supervisor that recorded the exit and ended between the
        // first read and the look at its process is not lost (the next poll reads the exit).
        let lost = states
            .iter()
            .filter(|(r, s)| {
                s.as_ref().is_some_and(|s| {
                    s.phase != Phase::Exited
                        && s.supervisor_pid != 0
                        && !procs::alive(s.supervisor_pid, s.supervisor_ticks)
                }) && read_state(&layout.replica(&r.name).dir).is_none_or(|s| s.phase != Phase::Exited)
            })
            .map(|(r, _)| r.name.clone())
            .collect();
        let tails = if Seen::wants_tails(&self.p) {
            states
                .iter()
                .filter(|(_, s)| s.as_ref().is_some_and(|s| s.phase == Phase::Exited))
                .map(|(r, _)| (r.name.clone(), log_tail(&layout.replica(&r.name).dir, LOG_TAIL_BYTES)))
                .collect()
        } else {
            BTreeMap::new()
        };
        // Written by the replica: read through the runtime dir's descriptor, never following a link.
        let ray_state = match (&self.l.autoscale, self.l.replicas.iter().find(|r| r.role == "head")) {
            (Some(_), Some(head)) if self.p.stop.is_none() && self.p.verdict.is_none() => {
                // The supervisor's copy (root's, in the replica dir), at most what it copies.
                std::fs::File::open(layout.replica(&head.name).dir.join(runtime_dir::RAY_STATE))
                    .ok()
                    .and_then(|f| {
                        let mut b = Vec::new();
                        std::io::Read::read_to_end(
                            &mut std::io::Read::take(f, runtime_dir::RUNTIME_FILE_MAX_BYTES),
                            &mut b,
                        )
                        .ok()
                        .map(|_| b)
                    })
                    .and_then(|b| serde_json::from_slice(&b).ok())
            }
            _ => None,
        };
        Seen { states, lost, tails, ray_state }
    }
}

/// An ended replica's scratch, moved aside until it is deleted (and, before the runtime dir was in the
/// scratch, its runtime dir).
const SCRATCH_GONE: &str = "scratch.gone";
const RUNTIME_GONE: &str = "runtime.gone";

/// Deletes what is left of the scratch of an ended attempt's replicas (a server stopped before its release
/// thread was done, or before it moved the scratch aside). Never follows a link: a replica's dir is the
/// platform's, its scratch the task's.
pub(super) fn delete_scratch_left_in(attempt_dir: &Path) {
    let Ok(replicas) = std::fs::read_dir(attempt_dir) else { return };
    for r in replicas.flatten() {
        for gone in ["scratch", SCRATCH_GONE, RUNTIME_GONE] {
            let aside = r.path().join(gone);
            if std::fs::symlink_metadata(&aside).is_ok_and(|m| m.is_dir()) {
                let _ = std::fs::remove_dir_all(&aside);
            }
        }
        let image = r.path().join(super::scratch::SCRATCH_IMAGE);
        if std::fs::symlink_metadata(&image).is_ok_and(|m| m.is_file()) {
            let _ = std::fs::remove_file(image);
        }
        // The image root's mount point (empty on the host).
        let _ = std::fs::remove_dir(r.path().join(super::root_image::ROOT_MOUNT));
    }
}

impl LocalBackend {
    /// One attempt's progress: returns true when it ended (its outcome is in `out`).
    pub(super) fn advance(&self, run: &mut Run, now: u64, out: &mut Vec<Observation>) -> bool {
        if matches!(run.stage, Stage::Fetching(_)) {
            return self.fetching(run, now, out);
        }
        if matches!(run.stage, Stage::Preparing) {
            return false;
        }
        if let Stage::Pulling { pulling, jobs } = &mut run.stage {
            let here = jobs.first().is_some_and(|j| j.sandbox.root.is_dir());
            match outcome::pull(pulling, &run.l, here, now, out) {
                Pull::Wait | Pull::BackOff => return false,
                Pull::GaveUp => return true,
                Pull::Start => {
                    let jobs = std::mem::take(jobs);
                    run.children = self.spawn(&run.dir, &jobs);
                    run.stage = Stage::Running;
                    return false;
                }
            }
        }
        for c in &mut run.children {
            let _ = c.try_wait();
        }
        run.drain_events(out);
        let seen = run.read();
        let next = outcome::step(&mut run.p, &run.l, &seen, now, self.cfg.workers_after_master_ms, out);
        if next.stop_all {
            let req = StopRequest {
                checkpoint: false,
                checkpoint_timeout_s: 0,
                signal: procs::SIGTERM,
                grace_s: self.cfg.grace_s,
            };
            if let Err(why) = run.stop_replicas(|_| true, &req) {
                out.push(Observation::Note { key: run.key(), reason: Reason::BackendError, message: why });
            }
        }
        next.ended
    }

    /// An attempt waiting for its registry image: the pull looked at, and the attempt prepared once the image
    /// is here (or ended, as the image pull tolerance says). True when it ended.
    fn fetching(&self, run: &mut Run, now: u64, out: &mut Vec<Observation>) -> bool {
        let key = run.key();
        let (Some(images), Stage::Fetching(fx)) = (&self.cfg.images, &mut run.stage) else { return false };
        let look = images.look(&fx.f.reference, &fx.access);
        let image = match outcome::fetch(&mut fx.f, &run.l, look, now, out) {
            Fetched::Wait => return false,
            Fetched::GaveUp => return true,
            Fetched::Retry => {
                images.start(&fx.f.reference, &fx.access);
                return false;
            }
            Fetched::Ready(image) => image,
        };
        // The image's users as read when it was unpacked: nothing here reads the image's files (this runs
        // under the backend's lock).
        let user = image.config.user.as_deref();
        let accounts = &image.accounts;
        let inner =
            match sandbox::Inner::of_image(user, accounts.passwd.as_deref(), accounts.group.as_deref()) {
                Ok(inner) => inner,
                Err(why) => {
                    out.push(Observation::Finished {
                        key,
                        reason: Reason::ImagePullFailed,
                        message: format!("image {} cannot run here: {why}", fx.f.reference),
                    });
                    return true;
                }
            };
        pin_image(&self.cfg.runs_dir, &run.l.task_id, &fx.spec.task.spec.environment.image, &image);
        let Stage::Fetching(fx) = std::mem::replace(&mut run.stage, Stage::Preparing) else { return false };
        let pulled = plan::Pulled { image, inner };
        run.l.image_digest = Some(pulled.image.digest.clone());
        run.pulled = Some(pulled.clone());
        // The lock is held here: a preparation that finds no thread fails the attempt instead of running inline.
        if !self.start_preparing(fx.spec, fx.replicas, Some(pulled), false) {
            out.push(Observation::Finished {
                key: run.key(),
                reason: Reason::NodeFailed,
                message: "the attempt could not be prepared on this machine: no thread to prepare it on"
                    .into(),
            });
            return true;
        }
        false
    }

    /// Prepares an attempt on a thread of its own (the poll and the control loop's tick do not wait for it).
    /// With no thread to spare it is prepared here when `inline` (the caller holds no lock); false when it
    /// was not prepared at all.
    pub(super) fn start_preparing(
        &self,
        spec: LaunchSpec,
        replicas: Vec<Replica>,
        pulled: Option<plan::Pulled>,
        inline: bool,
    ) -> bool {
        let work = {
            let backend = self.clone();
            move || {
                let prepare = || backend.prepare(&spec, replicas.clone(), None, None, pulled.as_ref());
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(prepare))
                    .unwrap_or_else(|_| Err("its preparation panicked".into()));
                backend.prepared(&spec, result)
            }
        };
        if std::thread::Builder::new().name("prepare".into()).spawn(work.clone()).is_ok() {
            return true;
        }
        if inline {
            work();
        }
        inline
    }

    /// The digests of the images attempts here run or are about to (one whose pull is ready but that has not
    /// looked yet included).
    fn images_in_use(&self, inner: &Inner) -> BTreeSet<String> {
        let images = self.cfg.images.as_ref();
        inner
            .runs
            .values()
            .filter_map(|r| {
                let ready = match (&r.stage, images) {
                    (Stage::Fetching(fx), Some(images)) => match images.look(&fx.f.reference, &fx.access) {
                        trainyard_images::Look::Ready(i) => Some(i.digest),
                        _ => None,
                    },
                    _ => None,
                };
                r.l.image_digest
                    .clone()
                    .or_else(|| r.pulled.as_ref().map(|p| p.image.digest.clone()))
                    .or(ready)
            })
            .collect()
    }

    /// Brings the image cache under its size limit (on a thread of its own), keeping every image in use.
    pub(super) fn collect_images(&self, inner: &Inner) {
        let Some(images) = self.cfg.images.clone() else { return };
        let in_use = self.images_in_use(inner);
        let max = self.cfg.image_cache_max_bytes;
        let _ = std::thread::Builder::new().name("image-gc".into()).spawn(move || images.gc(max, &in_use));
    }

    /// The image cache's images, most recently used first.
    pub fn cached_images(&self) -> Vec<trainyard_images::Cached> {
        self.cfg.images.as_ref().map(|i| i.cached()).unwrap_or_default()
    }

    /// Removes every cached image no attempt here runs or is about to run.
    pub fn prune_images(&self) -> trainyard_images::Collected {
        let Some(images) = &self.cfg.images else { return Default::default() };
        let in_use = self.images_in_use(&self.lock());
        images.gc(0, &in_use)
    }

    pub(super) fn finish(&self, run: &Run, outcome: &Observation) {
        let layout = run.layout();
        if let Err(e) = write_atomic(
            &layout.outcome_json(),
            &serde_json::to_vec(&Recorded::from(outcome)).unwrap_or_default(),
        ) {
            // The outcome is reported all the same; a server restarted before it is on disk judges the attempt
            // again from its supervisors' records.
            eprintln!(
                "trainyard: cannot record {}'s outcome in {}: {e}",
                run.key().task_id,
                layout.outcome_json().display()
            );
        }
        // The container's local disk goes with the attempt (logs and events stay); so do its network, any
        // cgroup a killed supervisor left, and then its uid slot. All but one rename per replica happens on a
        // thread of its own: deleting what a task left in its scratch, unmounting and removing cgroups wait on
        // the disk and the kernel (tens of ms for a gang on a busy machine, far more for a full scratch), and
        // the poll that reports the end, with the control loop's tick, need not. The scratch is moved aside
        // here, so it is gone from its place once the end is reported; the slot goes last, so that no next
        // attempt gets its uplink while the old one is there.
        let mut gone = Vec::new();
        let mut images = Vec::new();
        // Where each replica's image root was mounted (in its supervisor's mount namespace, gone with it): an
        // empty dir here.
        let mut mount_points = Vec::new();
        for r in &run.l.replicas {
            let rl = layout.replica(&r.name);
            // The scratch's own file system went with the supervisor (it was mounted in the supervisor's own
            // mount namespace), the runtime dir in it with it: the replica wrote both, and its uid goes to a
            // later attempt. Its image, and what the server put in the scratch dir, go here.
            images.push(rl.scratch_image());
            mount_points.push(rl.dir.join(super::root_image::ROOT_MOUNT));
            let aside = rl.dir.join(SCRATCH_GONE);
            match std::fs::rename(rl.scratch(), &aside) {
                Ok(()) => gone.push(aside),
                Err(_) => {
                    let _ = std::fs::remove_dir_all(rl.scratch());
                }
            }
        }
        if let Some(dir) = &run.l.cleanup {
            let _ = std::fs::remove_dir_all(dir);
        }
        let replicas: Vec<PathBuf> = run.l.replicas.iter().map(|r| layout.replica(&r.name).dir).collect();
        let ip = self.cfg.ip.clone().filter(|_| run.l.networked);
        let (task_id, attempt, uid, dir) = (run.l.task_id.clone(), run.l.attempt, run.l.uid, run.dir.clone());
        let release = move || {
            for aside in &gone {
                let _ = std::fs::remove_dir_all(aside);
            }
            for image in &images {
                let _ = std::fs::remove_file(image);
            }
            for at in &mount_points {
                let _ = std::fs::remove_dir(at);
            }
            for r in &replicas {
                supervisor::remove_cgroups(r);
            }
            if let Some(ip) = &ip {
                let switch = netns::attempt_name(&task_id, attempt);
                netns::delete_switch(ip, &switch);
                switches::forget(&switch);
            }
            if uid >= UID_BASE {
                slots::release(uid - UID_BASE, &dir);
            }
        };
        if std::thread::Builder::new().name("release".into()).spawn(release.clone()).is_err() {
            release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_left_by_a_stopped_server_is_deleted_and_no_link_is_followed() {
        let root = std::env::temp_dir().join(format!("trainyard-scratch-gone-{}", std::process::id()));
        let attempt = root.join("runs/t/a0");
        let kept = root.join("outside");
        std::fs::create_dir_all(attempt.join("r0").join(SCRATCH_GONE).join("deep")).unwrap();
        std::fs::write(attempt.join("r0").join(SCRATCH_GONE).join("deep/f"), b"x").unwrap();
        std::fs::create_dir_all(attempt.join("r1")).unwrap();
        std::fs::create_dir_all(&kept).unwrap();
        std::fs::write(kept.join("f"), b"keep").unwrap();
        std::os::unix::fs::symlink(&kept, attempt.join("r1").join(SCRATCH_GONE)).unwrap();
        std::fs::write(attempt.join("r0/log"), b"kept too").unwrap();
        std::fs::create_dir(attempt.join("r0/rootfs")).unwrap();
        std::os::unix::fs::symlink(&kept, attempt.join("r1/rootfs")).unwrap();

        delete_scratch_left_in(&attempt);

        assert!(!attempt.join("r0").join(SCRATCH_GONE).exists(), "the scratch left aside is deleted");
        assert!(attempt.join("r0/log").exists(), "the rest of the replica's dir stays");
        assert!(kept.join("f").exists(), "a link in its place is not followed");
        assert!(!attempt.join("r0/rootfs").exists(), "the image root's mount point is removed");
        assert!(attempt.join("r1/rootfs").is_symlink() && kept.is_dir(), "a link there is not followed");
        let _ = std::fs::remove_dir_all(&root);
    }
}
