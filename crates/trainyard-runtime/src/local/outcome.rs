//! An attempt's progress and outcome: what supervisors wrote, turned into observations (started, precheck
//! passed, the verdict as replicas end, autoscaling), and the record kept once it ended.

use super::*;

impl Run {
    pub(super) fn new(
        dir: PathBuf,
        l: Launched,
        stage: Stage,
        children: Vec<std::process::Child>,
        offsets: BTreeMap<String, u64>,
    ) -> Run {
        Run {
            dir,
            l,
            stage,
            children,
            started: false,
            prechecked: false,
            stop: None,
            verdict: None,
            stop_others_at: None,
            stopped_others: false,
            offsets,
            removed: BTreeSet::new(),
            demand_reported_ms: 0,
            idle_reported: BTreeSet::new(),
        }
    }

    pub(super) fn key(&self) -> AttemptKey {
        AttemptKey { task_id: self.l.task_id.clone(), attempt: self.l.attempt }
    }

    pub(super) fn stop_replicas(&self, which: impl Fn(&Replica) -> bool, req: &StopRequest) {
        for r in self.l.replicas.iter().filter(|r| which(r)) {
            let path = self.dir.join(&r.name).join("stop.json");
            if !path.exists() {
                let _ = write_atomic(&path, &serde_json::to_vec(req).unwrap_or_default());
            }
        }
    }

    /// Collects new supervisor events as notes.
    pub(super) fn drain_events(&mut self, out: &mut Vec<Observation>) {
        let key = self.key();
        for r in &self.l.replicas {
            let rdir = self.dir.join(&r.name);
            let at = self.offsets.get(&r.name).copied().unwrap_or(0);
            let Ok(mut f) = std::fs::File::open(rdir.join("events.jsonl")) else { continue };
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
            let _ = std::fs::write(rdir.join("events.offset"), next.to_string());
        }
    }
}

impl LocalBackend {
    /// One attempt's progress: returns true when it ended (its outcome is in `out`).
    pub(super) fn advance(&self, run: &mut Run, now: u64, out: &mut Vec<Observation>) -> bool {
        let key = run.key();
        if let Stage::Pulling { tries, next_at_ms, jobs, available } = &mut run.stage {
            if now < *next_at_ms {
                return false;
            }
            if jobs.first().is_some_and(|j| j.sandbox.root.is_dir()) {
                let jobs = std::mem::take(jobs);
                if *tries > 0 {
                    out.push(Observation::Note {
                        key: key.clone(),
                        reason: Reason::ImagePulled,
                        message: format!("image {} is here after {tries} failed pulls", run.l.image),
                    });
                }
                run.children = self.spawn(&run.dir, &jobs);
                run.stage = Stage::Running;
                return false;
            }
            *tries += 1;
            let tol = run.l.pull_tolerance;
            let why =
                format!("image {} is not available on this machine (available: {available})", run.l.image);
            if tol == 0 || (tol > 0 && i64::from(*tries) > tol) {
                let allowed =
                    if tol == 0 { "no retries allowed".to_owned() } else { format!("{tol} retries allowed") };
                out.push(Observation::Finished {
                    key,
                    reason: Reason::ImagePullFailed,
                    message: format!("{why}; gave up after {tries} pulls ({allowed})"),
                });
                return true;
            }
            let backoff = (1000u64 << (*tries - 1).min(5)).min(30_000);
            *next_at_ms = now + backoff;
            out.push(Observation::Note {
                key,
                reason: Reason::ImagePullBackOff,
                message: format!("{why}; pull {tries} failed, next try in {} s", backoff / 1000),
            });
            return false;
        }
        for c in &mut run.children {
            let _ = c.try_wait();
        }
        run.drain_events(out);
        let states: Vec<(Replica, Option<ReplicaState>)> =
            run.l.replicas.iter().map(|r| (r.clone(), read_state(&run.dir.join(&r.name)))).collect();
        // A supervisor that died without recording an exit (the machine restarted, someone killed it).
        let lost: Vec<&str> = states
            .iter()
            .filter(|(_, s)| match s {
                Some(s) => {
                    s.phase != Phase::Exited
                        && s.supervisor_pid != 0
                        && !procs::alive(s.supervisor_pid, s.supervisor_ticks)
                }
                None => false,
            })
            .map(|(r, _)| r.name.as_str())
            .collect();
        let trainers = |st: &[(Replica, Option<ReplicaState>)]| -> Vec<Option<Phase>> {
            st.iter()
                .filter(|(r, _)| r.role != "submitter")
                .map(|(_, s)| s.as_ref().map(|s| s.phase))
                .collect()
        };
        let phases = trainers(&states);
        if !run.started && phases.iter().all(|p| p.is_some_and(|p| p != Phase::Starting)) {
            run.started = true;
            out.push(Observation::Started { key: key.clone(), precheck: run.l.precheck });
        }
        if run.l.precheck
            && run.started
            && !run.prechecked
            && phases.iter().all(|p| matches!(p, Some(Phase::Running)))
        {
            run.prechecked = true;
            let figures: Vec<String> =
                states.iter().filter_map(|(_, s)| s.as_ref()?.precheck.clone()).collect();
            out.push(Observation::PrecheckPassed {
                key: key.clone(),
                message: format!("every replica passed the precheck: {}", figures.join("; ")),
            });
        }

        if run.started && run.stop.is_none() && run.verdict.is_none() {
            self.autoscale(run, now, out);
        }
        // Decide the outcome as replicas end.
        let ray = run.l.task_type == "RayJob";
        if run.verdict.is_none() && run.stop.is_none() {
            if let Some(name) = lost.first() {
                run.verdict = Some((
                    Reason::NodeFailed,
                    format!("the supervisor of {name} is gone without recording how the replica ended"),
                ));
            }
            let mut ended: Vec<&(Replica, Option<ReplicaState>)> =
                states.iter().filter(|(_, s)| s.as_ref().is_some_and(|s| s.phase == Phase::Exited)).collect();
            ended.sort_by_key(|(_, s)| s.as_ref().and_then(|s| s.exit.as_ref()).map_or(0, |e| e.at_ms));
            for (r, s) in ended {
                let Some(e) = s.as_ref().and_then(|s| s.exit.clone()) else { continue };
                if e.stopped || run.verdict.is_some() {
                    continue;
                }
                if e.precheck_failed {
                    let message = s.as_ref().and_then(|s| s.precheck.clone()).unwrap_or_default();
                    run.verdict = Some((Reason::PrecheckFailed, format!("{}: {message}", r.name)));
                    // Exit 3: the image has no torch, which is no fault of the node.
                    if e.code != Some(3) {
                        out.push(Observation::NodeSuspect {
                            key: key.clone(),
                            node: r.node.clone(),
                            message: format!("node {} failed the precheck of {}", r.node, r.name),
                        });
                    }
                    continue;
                }
                if e.killed_outside {
                    // Nothing in the sandbox can signal bubblewrap: the machine (or its admin) killed it.
                    run.verdict = Some((
                        Reason::NodeFailed,
                        format!(
                            "{}: its sandbox was killed from outside, by {}",
                            r.name,
                            trainyard_core::failure::signal_name(e.signal.unwrap_or(9))
                        ),
                    ));
                    continue;
                }
                if let Some(why) = &e.evicted {
                    run.verdict = Some((Reason::UserError, format!("{}: {why}", r.name)));
                    continue;
                }
                let exit = Exit { code: e.code, signal: e.signal, oom_killed: e.oom_killed };
                let paths: Vec<&str> = run.l.mount_paths.iter().map(String::as_str).collect();
                let (reason, message) =
                    classify(&r.name, &exit, &log_tail(&run.dir.join(&r.name), 16 * 1024), &paths);
                let decides = if ray { r.role == "head" } else { r.role == "master" };
                if reason == Reason::NodeFailed {
                    out.push(Observation::NodeSuspect {
                        key: key.clone(),
                        node: r.node.clone(),
                        message: format!("node {}: {message}", r.node),
                    });
                }
                if reason != Reason::Completed {
                    run.verdict = Some((reason, message));
                } else if decides {
                    run.verdict = Some((Reason::Completed, message));
                    // Ray's workers have nothing left to do once the head (and its entrypoint, and the debug
                    // retention) ended; a PyTorchJob's workers get a moment to end by themselves.
                    let wait = if ray { 0 } else { self.cfg.workers_after_master_ms };
                    run.stop_others_at = Some(now + wait);
                } else if ray {
                    run.verdict =
                        Some((Reason::UserError, format!("{} ended before the entrypoint did", r.name)));
                }
            }
            if let Some((reason, _)) = &run.verdict
                && *reason != Reason::Completed
            {
                run.stop_others_at = Some(now);
            }
        }
        if !run.stopped_others && run.stop_others_at.is_some_and(|at| now >= at) {
            run.stopped_others = true;
            let req = StopRequest {
                checkpoint: false,
                checkpoint_timeout_s: 0,
                signal: procs::SIGTERM,
                grace_s: self.cfg.grace_s,
            };
            run.stop_replicas(|_| true, &req);
        }
        let all_ended = states.iter().all(|(r, s)| {
            s.as_ref().is_some_and(|s| s.phase == Phase::Exited) || lost.contains(&r.name.as_str())
        });
        if !all_ended {
            return false;
        }
        let finished = match (run.stop, &run.verdict) {
            (Some(StopCause::NodeFailed), _) => Observation::Finished {
                key,
                reason: Reason::NodeFailed,
                message: "a node of this attempt failed; every replica was killed".into(),
            },
            (Some(cause), _) => {
                Observation::Stopped { key, cause: Some(cause), message: "every replica ended".into() }
            }
            (None, Some((reason, message))) => {
                Observation::Finished { key, reason: *reason, message: message.clone() }
            }
            (None, None) => Observation::Finished {
                key,
                reason: Reason::UserError,
                message: "every replica ended but none decided the outcome".into(),
            },
        };
        out.push(finished);
        true
    }

    /// Autoscaling: turns the head's view of Ray (pending demand, idle nodes) into scale requests; the
    /// control loop decides within the bounds, through the scheduler.
    pub(super) fn autoscale(&self, run: &mut Run, now: u64, out: &mut Vec<Observation>) {
        let Some(a) = run.l.autoscale.clone() else { return };
        let Some(head) = run.l.replicas.iter().find(|r| r.role == "head") else { return };
        // Written by the replica: read through the runtime dir's descriptor, never following a link.
        let Some(bytes) =
            runtime_dir::RuntimeDir::open(&run.dir.join(&head.name)).and_then(|rt| rt.read("ray-state.json"))
        else {
            return;
        };
        let Ok(state) = serde_json::from_slice::<serde_json::Value>(&bytes) else { return };
        let key = run.key();
        let pending = state["pending"].as_array().cloned().unwrap_or_default();
        if !pending.is_empty() && now >= run.demand_reported_ms + 5_000 {
            let cpus: f64 = pending.iter().map(|p| p["CPU"].as_f64().unwrap_or(0.0)).sum();
            let workers = ((cpus / a.worker_vcpus as f64).ceil() as u32).clamp(1, a.step.max(1));
            run.demand_reported_ms = now;
            out.push(Observation::ScaleUp {
                key: key.clone(),
                workers,
                message: format!("{} Ray tasks or actors are waiting for {cpus} CPUs in all", pending.len()),
            });
        }
        for node in state["nodes"].as_array().cloned().unwrap_or_default() {
            let Some(replica) = node["resources_total"]
                .as_object()
                .and_then(|r| r.keys().find_map(|k| k.strip_prefix("TY:").map(str::to_owned)))
            else {
                continue;
            };
            let idle_s = node["idle_s"].as_f64().unwrap_or(0.0);
            let idle = node["alive"].as_bool() == Some(true) && node["status"] == "IDLE";
            if !idle {
                run.idle_reported.remove(&replica);
            } else if idle_s >= a.idle_timeout_s as f64
                && !run.removed.contains(&replica)
                && run.idle_reported.insert(replica.clone())
            {
                out.push(Observation::ScaleDown {
                    key: key.clone(),
                    message: format!(
                        "{replica} has been idle for {idle_s:.0} s (idle timeout {} s)",
                        a.idle_timeout_s
                    ),
                    replica,
                });
            }
        }
    }

    pub(super) fn finish(&self, run: &Run, outcome: &Observation) {
        let _ = write_atomic(
            &run.dir.join("outcome.json"),
            &serde_json::to_vec(&Recorded::from(outcome)).unwrap_or_default(),
        );
        if run.l.uid >= UID_BASE {
            slots::release(run.l.uid - UID_BASE, &run.dir);
        }
        // The container's local disk goes with the attempt, and so do its network and any cgroup a killed
        // supervisor left; logs and events stay.
        for r in &run.l.replicas {
            let _ = std::fs::remove_dir_all(run.dir.join(&r.name).join("scratch"));
            supervisor::remove_cgroups(&run.dir.join(&r.name));
        }
        if run.l.networked
            && let Some(ip) = &self.cfg.ip
        {
            let switch = netns::attempt_name(&run.l.task_id, run.l.attempt);
            netns::delete_switch(ip, &switch);
            switches::forget(&switch);
        }
        if let Some(dir) = &run.l.cleanup {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// An outcome as kept in `outcome.json`, to be reported again after a restart.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Recorded {
    stopped: bool,
    /// Why it was stopped (absent in records written before causes were kept).
    #[serde(default)]
    cause: Option<StopCause>,
    reason: String,
    message: String,
}

impl Recorded {
    /// The observation that ended the attempt, said again.
    pub(super) fn observation(self, key: AttemptKey) -> Observation {
        if self.stopped {
            Observation::Stopped { key, cause: self.cause, message: self.message }
        } else {
            let reason = Reason::from_name(&self.reason).unwrap_or(Reason::UserError);
            Observation::Finished { key, reason, message: self.message }
        }
    }
}

impl From<&Observation> for Recorded {
    fn from(o: &Observation) -> Recorded {
        match o {
            Observation::Stopped { cause, message, .. } => {
                Recorded { stopped: true, cause: *cause, reason: String::new(), message: message.clone() }
            }
            Observation::Finished { reason, message, .. } => {
                Recorded { stopped: false, cause: None, reason: reason.to_string(), message: message.clone() }
            }
            _ => Recorded { stopped: false, cause: None, reason: String::new(), message: String::new() },
        }
    }
}
