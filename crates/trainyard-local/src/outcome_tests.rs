//! The verdicts of [`super::step`] and [`super::pull`], each from states written by hand: no files, no
//! processes.

use super::*;
use crate::supervisor::ExitRecord;

fn replica(name: &str, role: &str) -> Replica {
    Replica { name: name.into(), role: role.into(), node: "node-a".into(), devices: vec![], slot: 0 }
}

fn launched(task_type: &str, roles: &[(&str, &str)]) -> Launched {
    Launched {
        task_id: "t".into(),
        attempt: 0,
        uid: 0,
        networked: false,
        task_type: task_type.into(),
        image: "img".into(),
        image_digest: None,
        replicas: roles.iter().map(|(n, r)| replica(n, r)).collect(),
        mount_paths: vec![],
        checkpoint: None,
        precheck: false,
        pull_tolerance: 2,
        ray_base: 0,
        cleanup: None,
        autoscale: None,
    }
}

fn state(phase: Phase, exit: Option<ExitRecord>) -> ReplicaState {
    ReplicaState {
        supervisor_pid: 1,
        supervisor_ticks: 1,
        phase,
        sandbox_pid: None,
        started_ms: 0,
        exit,
        precheck: None,
    }
}

fn running() -> Option<ReplicaState> {
    Some(state(Phase::Running, None))
}

fn exited(code: i32, at_ms: u64) -> Option<ReplicaState> {
    Some(state(Phase::Exited, Some(ExitRecord { code: Some(code), at_ms, ..Default::default() })))
}

fn ended(e: ExitRecord) -> Option<ReplicaState> {
    Some(state(Phase::Exited, Some(e)))
}

fn seen(l: &Launched, states: Vec<Option<ReplicaState>>) -> Seen {
    Seen { states: l.replicas.iter().cloned().zip(states).collect(), ..Seen::default() }
}

/// Runs one step from `p` and returns (observations, step).
fn check(p: &mut Progress, l: &Launched, s: &Seen, now: u64) -> (Vec<Observation>, Step) {
    let mut out = Vec::new();
    let st = step(p, l, s, now, 10_000, &mut out);
    (out, st)
}

fn finished(o: &[Observation]) -> Option<(Reason, String)> {
    o.iter().rev().find_map(|o| match o {
        Observation::Finished { reason, message, .. } => Some((*reason, message.clone())),
        _ => None,
    })
}

const GANG: &[(&str, &str)] = &[("m", "master"), ("w", "worker")];

#[test]
fn started_once_every_replica_left_starting() {
    let l = launched("PyTorchJob", GANG);
    let mut p = Progress::default();
    let (out, st) = check(&mut p, &l, &seen(&l, vec![running(), None]), 1);
    assert!(out.is_empty() && st == Step::default());
    let (out, _) = check(&mut p, &l, &seen(&l, vec![running(), Some(state(Phase::Starting, None))]), 2);
    assert!(out.is_empty());
    let (out, _) = check(&mut p, &l, &seen(&l, vec![running(), running()]), 3);
    assert!(matches!(out[..], [Observation::Started { precheck: false, .. }]));
    let (out, _) = check(&mut p, &l, &seen(&l, vec![running(), running()]), 4);
    assert!(out.is_empty(), "said once");
}

#[test]
fn precheck_passes_when_every_replica_runs_its_command() {
    let mut l = launched("PyTorchJob", GANG);
    l.precheck = true;
    let mut p = Progress::default();
    let pre = Some(state(Phase::Prechecking, None));
    let (out, _) = check(&mut p, &l, &seen(&l, vec![pre.clone(), pre]), 1);
    assert!(matches!(out[..], [Observation::Started { precheck: true, .. }]));
    let mut fig = state(Phase::Running, None);
    fig.precheck = Some("gemm 10".into());
    let (out, _) = check(&mut p, &l, &seen(&l, vec![Some(fig), running()]), 2);
    assert!(
        matches!(&out[..], [Observation::PrecheckPassed { message, .. }] if message.ends_with("gemm 10")),
        "{out:?}"
    );
}

#[test]
fn the_master_decides_success_and_the_workers_get_a_moment() {
    let l = launched("PyTorchJob", GANG);
    let mut p = Progress { started: true, ..Progress::default() };
    let (out, st) = check(&mut p, &l, &seen(&l, vec![exited(0, 5), running()]), 100);
    assert!(out.is_empty() && !st.ended && !st.stop_all);
    assert_eq!(p.verdict.as_ref().map(|v| v.0), Some(Reason::Completed));
    assert_eq!(p.stop_others_at, Some(10_100));
    let (_, st) = check(&mut p, &l, &seen(&l, vec![exited(0, 5), running()]), 10_100);
    assert!(st.stop_all && !st.ended);
    let (out, st) = check(
        &mut p,
        &l,
        &seen(&l, vec![exited(0, 5), ended(ExitRecord { stopped: true, ..Default::default() })]),
        10_200,
    );
    assert!(st.ended && !st.stop_all, "stop asked once");
    assert_eq!(finished(&out).map(|f| f.0), Some(Reason::Completed));
}

#[test]
fn a_worker_that_succeeds_decides_nothing() {
    let l = launched("PyTorchJob", GANG);
    let mut p = Progress { started: true, ..Progress::default() };
    let (_, st) = check(&mut p, &l, &seen(&l, vec![running(), exited(0, 5)]), 100);
    assert!(p.verdict.is_none() && !st.stop_all);
}

#[test]
fn the_first_failure_decides_and_stops_the_rest() {
    let l = launched("PyTorchJob", &[("m", "master"), ("w0", "worker"), ("w1", "worker")]);
    let mut p = Progress { started: true, ..Progress::default() };
    let mut s = seen(&l, vec![running(), exited(2, 9), exited(1, 7)]);
    s.tails.insert("w1".into(), "Traceback\nValueError: bad".into());
    let (_, st) = check(&mut p, &l, &s, 50);
    assert!(st.stop_all);
    let (reason, message) = p.verdict.clone().unwrap();
    assert_eq!(reason, Reason::UserError);
    assert!(message.contains("w1"), "the earlier exit decides: {message}");
    assert_eq!(p.stop_others_at, Some(50));
}

#[test]
fn a_precheck_failure_suspects_the_node_unless_torch_is_missing() {
    let l = launched("PyTorchJob", GANG);
    for (code, suspect) in [(1, true), (3, false)] {
        let mut p = Progress { started: true, ..Progress::default() };
        let mut failed = state(
            Phase::Exited,
            Some(ExitRecord { code: Some(code), precheck_failed: true, ..Default::default() }),
        );
        failed.precheck = Some("gemm too slow".into());
        let (out, _) = check(&mut p, &l, &seen(&l, vec![Some(failed), running()]), 1);
        assert_eq!(p.verdict, Some((Reason::PrecheckFailed, "m: gemm too slow".into())));
        assert_eq!(out.iter().any(|o| matches!(o, Observation::NodeSuspect { .. })), suspect, "exit {code}");
    }
}

#[test]
fn a_sandbox_killed_from_outside_is_the_machines_failure() {
    let l = launched("PyTorchJob", GANG);
    let mut p = Progress { started: true, ..Progress::default() };
    let e = ExitRecord { signal: Some(9), killed_outside: true, ..Default::default() };
    check(&mut p, &l, &seen(&l, vec![running(), ended(e)]), 1);
    let (reason, message) = p.verdict.unwrap();
    assert_eq!(reason, Reason::NodeFailed);
    assert!(message.contains("killed from outside"), "{message}");
}

#[test]
fn an_eviction_is_the_tasks_failure() {
    let l = launched("PyTorchJob", GANG);
    let mut p = Progress { started: true, ..Progress::default() };
    let e = ExitRecord { evicted: Some("scratch 60 GiB over 50 GiB".into()), ..Default::default() };
    check(&mut p, &l, &seen(&l, vec![ended(e), running()]), 1);
    assert_eq!(p.verdict, Some((Reason::UserError, "m: scratch 60 GiB over 50 GiB".into())));
}

#[test]
fn an_out_of_memory_kill_is_classified() {
    let l = launched("PyTorchJob", GANG);
    let mut p = Progress { started: true, ..Progress::default() };
    let e = ExitRecord { signal: Some(9), oom_killed: true, ..Default::default() };
    check(&mut p, &l, &seen(&l, vec![ended(e), running()]), 1);
    assert_eq!(p.verdict.map(|v| v.0), Some(Reason::OutOfMemory));
}

#[test]
fn a_lost_supervisor_ends_the_attempt_as_node_failed() {
    let l = launched("PyTorchJob", GANG);
    let mut p = Progress { started: true, ..Progress::default() };
    let mut s = seen(&l, vec![running(), exited(0, 1)]);
    s.lost.insert("m".into());
    let (out, st) = check(&mut p, &l, &s, 1);
    assert!(st.ended && st.stop_all);
    let (reason, message) = finished(&out).unwrap();
    assert_eq!(reason, Reason::NodeFailed);
    assert!(message.contains("supervisor of m is gone"), "{message}");
}

#[test]
fn a_ray_worker_ending_first_fails_and_the_head_decides() {
    let l = launched("RayJob", &[("h", "head"), ("w", "worker")]);
    let mut p = Progress { started: true, ..Progress::default() };
    check(&mut p, &l, &seen(&l, vec![running(), exited(0, 1)]), 1);
    assert_eq!(p.verdict, Some((Reason::UserError, "w ended before the entrypoint did".into())));
    let mut p = Progress { started: true, ..Progress::default() };
    check(&mut p, &l, &seen(&l, vec![exited(0, 1), running()]), 7);
    assert_eq!(p.verdict.map(|v| v.0), Some(Reason::Completed));
    assert_eq!(p.stop_others_at, Some(7), "Ray's workers stop at once");
}

#[test]
fn stops_report_their_cause() {
    let l = launched("PyTorchJob", GANG);
    let stopped = || ended(ExitRecord { stopped: true, ..Default::default() });
    for (cause, want) in [
        (StopCause::UserStop, None),
        (StopCause::Preempted, None),
        (StopCause::NodeFailed, Some(Reason::NodeFailed)),
    ] {
        let mut p = Progress { started: true, stop: Some(cause), ..Progress::default() };
        let (out, st) = check(&mut p, &l, &seen(&l, vec![stopped(), stopped()]), 1);
        assert!(st.ended);
        match want {
            None => assert!(
                matches!(out.last(), Some(Observation::Stopped { cause: Some(c), .. }) if *c == cause)
            ),
            Some(r) => assert_eq!(finished(&out).map(|f| f.0), Some(r)),
        }
    }
}

#[test]
fn every_replica_ended_without_a_decision() {
    let l = launched("PyTorchJob", &[("w", "worker")]);
    let mut p = Progress { started: true, ..Progress::default() };
    let (out, _) = check(&mut p, &l, &seen(&l, vec![exited(0, 1)]), 1);
    assert_eq!(finished(&out).map(|f| f.0), Some(Reason::UserError));
}

#[test]
fn autoscaling_reports_demand_and_idle_workers() {
    let mut l = launched("RayJob", &[("h", "head"), ("w", "worker")]);
    l.autoscale = Some(Autoscale { idle_timeout_s: 60, step: 4, worker_vcpus: 2 });
    let mut p = Progress { started: true, ..Progress::default() };
    let mut s = seen(&l, vec![running(), running()]);
    s.ray_state = Some(serde_json::json!({
        "pending": [{"CPU": 3.0}, {"CPU": 2.0}],
        "nodes": [{"resources_total": {"TY:w": 1}, "idle_s": 61.0, "alive": true, "status": "IDLE"}]
    }));
    let (out, _) = check(&mut p, &l, &s, 10_000);
    assert!(
        matches!(out[..], [Observation::ScaleUp { workers: 3, .. }, Observation::ScaleDown { ref replica, .. }] if replica == "w"),
        "{out:?}"
    );
    let (out, _) = check(&mut p, &l, &s, 12_000);
    assert!(out.is_empty(), "demand is reported every 5 s, an idle worker once: {out:?}");
}

#[test]
fn pulls_back_off_then_give_up() {
    let l = launched("PyTorchJob", GANG);
    let mut pl = Pulling { tries: 0, next_at_ms: 0, available: "host".into() };
    let mut out = Vec::new();
    assert_eq!(pull(&mut pl, &l, false, 0, &mut out), Pull::BackOff);
    assert_eq!(pl.next_at_ms, 1000);
    assert_eq!(pull(&mut pl, &l, false, 500, &mut out), Pull::Wait);
    assert_eq!(pull(&mut pl, &l, false, 1000, &mut out), Pull::BackOff);
    assert_eq!(pl.next_at_ms, 3000);
    assert_eq!(pull(&mut pl, &l, false, 3000, &mut out), Pull::GaveUp);
    assert_eq!(finished(&out).map(|f| f.0), Some(Reason::ImagePullFailed));
    let mut pl = Pulling { tries: 1, next_at_ms: 0, available: String::new() };
    let mut out = Vec::new();
    assert_eq!(pull(&mut pl, &l, true, 0, &mut out), Pull::Start);
    assert!(matches!(&out[..], [Observation::Note { reason, .. }] if *reason == Reason::ImagePulled));
    let mut never = l.clone();
    never.pull_tolerance = 0;
    let mut pl = Pulling { tries: 0, next_at_ms: 0, available: String::new() };
    assert_eq!(pull(&mut pl, &never, false, 0, &mut Vec::new()), Pull::GaveUp);
}

#[test]
fn recorded_outcomes_are_said_again() {
    let key = AttemptKey { task_id: "t".into(), attempt: 1 };
    let stop =
        Observation::Stopped { key: key.clone(), cause: Some(StopCause::Preempted), message: "m".into() };
    assert_eq!(Recorded::from(&stop).observation(key.clone()), stop);
    let fin = Observation::Finished { key: key.clone(), reason: Reason::OutOfMemory, message: "x".into() };
    assert_eq!(Recorded::from(&fin).observation(key), fin);
}

fn failed(class: trainyard_images::FailureClass) -> trainyard_images::Look {
    trainyard_images::Look::Failed(trainyard_images::PullError::new(class, "pulling r: it failed"))
}

/// Runs the fetch decisions over `looks` (one per poll, 60 s apart so every backoff is over) and returns
/// the decisions and the reasons of what they said.
fn fetches(tolerance: i64, looks: Vec<trainyard_images::Look>) -> (Vec<Fetched>, Vec<Reason>) {
    let mut l = launched("PyTorchJob", &[("m", "master")]);
    l.pull_tolerance = tolerance;
    let mut f = Fetch::new("r".into());
    let (mut decisions, mut out) = (Vec::new(), Vec::new());
    for (i, look) in looks.into_iter().enumerate() {
        decisions.push(fetch(&mut f, &l, look, 1_000 + 60_000 * i as u64, &mut out));
    }
    let reasons = out
        .iter()
        .filter_map(|o| match o {
            Observation::Note { reason, .. } | Observation::Finished { reason, .. } => Some(*reason),
            // Each back-off is also the task's wait while it starts.
            Observation::Waiting { message, .. } => {
                assert!(message.contains("failed, next try in"), "{message}");
                None
            }
            other => panic!("{other:?}"),
        })
        .collect();
    (decisions, reasons)
}

#[test]
fn a_registry_pull_follows_the_image_pull_tolerance() {
    use trainyard_images::FailureClass::{NotFound, Unreachable};
    // 0: the first retryable failure ends the attempt.
    let (d, r) = fetches(0, vec![failed(Unreachable)]);
    assert_eq!(d, [Fetched::GaveUp]);
    assert_eq!(r, [Reason::ImagePullFailed]);
    // 2: two backoffs (each failure counted once, however many polls see it), then the third ends it.
    let looks = vec![
        failed(Unreachable),
        failed(Unreachable),
        failed(Unreachable),
        failed(Unreachable),
        failed(Unreachable),
    ];
    let (d, r) = fetches(2, looks);
    assert_eq!(d, [Fetched::Wait, Fetched::Retry, Fetched::Wait, Fetched::Retry, Fetched::GaveUp]);
    assert_eq!(r, [Reason::ImagePullBackOff, Reason::ImagePullBackOff, Reason::ImagePullFailed]);
    // -1: never spent.
    let (d, _) = fetches(-1, (0..40).map(|_| failed(Unreachable)).collect());
    assert!(!d.contains(&Fetched::GaveUp));
    // A failure another try cannot mend ends it at once, whatever the tolerance.
    let (d, r) = fetches(-1, vec![failed(NotFound)]);
    assert_eq!((d, r), (vec![Fetched::GaveUp], vec![Reason::ImagePullFailed]));
}

#[test]
fn pull_progress_is_said_now_and_then_and_the_ready_image_names_its_digest() {
    use trainyard_images::{Image, Look, Phase};
    let l = launched("PyTorchJob", &[("m", "master")]);
    let mut f = Fetch::new("reg/x:1".into());
    let mut out = Vec::new();
    let pulling = |done| Look::Pulling { phase: Phase::Downloading, done, total: 4 << 20 };
    for (t, done) in [(1_000, 0), (2_000, 1 << 20), (6_500, 2 << 20), (7_000, 3 << 20)] {
        assert_eq!(fetch(&mut f, &l, pulling(done), t, &mut out), Fetched::Wait);
    }
    let said = |kind: &str| -> Vec<String> {
        out.iter()
            .filter_map(|o| match (o, kind) {
                (Observation::Note { message, .. }, "note")
                | (Observation::Waiting { message, .. }, "wait") => Some(message.clone()),
                _ => None,
            })
            .collect()
    };
    // Not at the first look, then at most every 5 s; the task's wait while it starts says the same.
    assert_eq!(said("note"), ["pulling image reg/x:1: 2.0 MiB of 4.0 MiB of layers (50%)"]);
    assert_eq!(said("wait"), said("note"));
    let image = Image {
        digest: "sha256:ab".into(),
        reference: "reg/x:1".into(),
        rootfs: "/c".into(),
        config: Default::default(),
        accounts: Default::default(),
    };
    out.clear();
    assert_eq!(fetch(&mut f, &l, Look::Ready(image.clone()), 9_000, &mut out), Fetched::Ready(image));
    let Observation::Note { reason, message, .. } = &out[0] else { panic!() };
    assert_eq!(*reason, Reason::ImagePulled);
    assert!(message.contains("sha256:ab") && message.contains("ready in 8.0 s"), "{message}");
}
