use super::super::status::ContainerState;
use super::*;

fn key() -> AttemptKey {
    AttemptKey { task_id: "t-1".into(), attempt: 1 }
}

const NOW: u64 = 1_000_000;

fn synced() -> State {
    State { synced_jobs: true, synced_pods: true, node_grace_ms: 60_000, ..State::default() }
}

fn pod(name: &str, node: &str, state: ContainerState) -> PodView {
    PodView {
        name: name.into(),
        role: "master".into(),
        node: node.into(),
        phase: match state {
            ContainerState::Running => "Running".into(),
            _ => "Pending".into(),
        },
        init: Vec::new(),
        containers: vec![("trainer".into(), state)],
        deleting: false,
        unschedulable: None,
        disrupted: None,
    }
}

fn launched(s: &mut State) {
    let a = s.attempt(&key(), "ns", "job");
    a.kind = Some(JobKind::PyTorch);
    a.launched = true;
}

fn reasons(out: &[Observation]) -> Vec<String> {
    out.iter()
        .map(|o| match o {
            Observation::Started { .. } => "Started".to_owned(),
            Observation::Finished { reason, .. } => format!("Finished {reason}"),
            Observation::Stopped { cause, .. } => format!("Stopped {cause:?}"),
            Observation::Note { reason, .. } => format!("Note {reason}"),
            Observation::NodeSuspect { node, .. } => format!("Suspect {node}"),
            Observation::Waiting { message, .. } => format!("Waiting: {message}"),
            other => format!("{other:?}"),
        })
        .collect()
}

/// An attempt whose one pod runs on node n1, its start reported.
fn running_on_n1() -> State {
    let mut s = synced();
    launched(&mut s);
    let a = s.attempt(&key(), "ns", "job");
    a.job = Some(JobView::default());
    a.pods.insert("p".into(), pod("p", "n1", ContainerState::Running));
    assert_eq!(reasons(&s.poll(NOW)), ["Started"]);
    s
}

#[test]
fn a_launch_is_alive_before_the_watch_sees_it_and_reports_each_step_once() {
    let mut s = synced();
    launched(&mut s);
    assert_eq!(s.alive(), vec![key()]);
    assert!(s.poll(NOW).is_empty());
    let a = s.attempt(&key(), "ns", "job");
    a.job = Some(JobView { conditions: vec![("Running".into(), String::new())], ..JobView::default() });
    a.pods.insert("job-master-0".into(), pod("job-master-0", "n1", ContainerState::Running));
    assert_eq!(reasons(&s.poll(NOW)), ["Started"]);
    s.dirty.insert(key());
    assert!(s.poll(NOW).is_empty(), "nothing new is reported twice");
    s.attempt(&key(), "ns", "job").job.as_mut().unwrap().conditions.push(("Succeeded".into(), "done".into()));
    assert_eq!(reasons(&s.poll(NOW)), ["Finished Completed"]);
    assert!(s.alive().is_empty(), "an ended attempt is not alive");
    assert!(s.cleanups.is_empty(), "a job its operator ended is left to its TTL (its logs stay readable)");
}

#[test]
fn a_stop_ends_when_the_job_and_its_pods_are_gone() {
    let mut s = synced();
    launched(&mut s);
    let a = s.attempt(&key(), "ns", "job");
    a.launched = false;
    a.job = Some(JobView::default());
    a.pods.insert("p".into(), pod("p", "n1", ContainerState::Running));
    a.stop = Some(StopCause::Preempted);
    assert!(s.poll(NOW).is_empty());
    s.attempt(&key(), "ns", "job").job = None;
    assert!(s.poll(NOW).is_empty(), "a pod is still terminating");
    assert_eq!(s.alive(), vec![key()]);
    s.attempt(&key(), "ns", "job").pods.clear();
    assert_eq!(reasons(&s.poll(NOW)), ["Stopped Some(Preempted)"]);
    assert!(s.attempts.is_empty() && s.alive().is_empty());
}

#[test]
fn nothing_is_called_gone_before_the_watches_have_listed_once() {
    let mut s = State::default();
    let a = s.attempt(&key(), "ns", "job");
    a.kind = Some(JobKind::PyTorch);
    a.stop = Some(StopCause::UserStop);
    assert!(s.poll(NOW).is_empty());
    s.synced_jobs = true;
    s.synced_pods = true;
    s.dirty.insert(key());
    assert_eq!(reasons(&s.poll(NOW)), ["Stopped Some(UserStop)"]);
}

#[test]
fn a_node_going_down_fails_its_attempt_as_node_failed_and_suspects_it() {
    let mut s = running_on_n1();
    s.node("n2", Some("is NotReady".into()), false, NOW);
    s.node("n2", None, false, NOW);
    s.node("n1", Some("is NotReady".into()), false, NOW);
    assert!(s.poll(NOW + 59_000).is_empty(), "within its grace a NotReady node takes nothing down");
    s.node("n1", None, false, NOW + 59_000);
    assert!(s.poll(NOW + 120_000).is_empty(), "it came back in time");
    s.node("n1", Some("is NotReady".into()), false, NOW + 120_000);
    s.node("n1", Some("is NotReady (still)".into()), false, NOW + 150_000);
    assert!(s.poll(NOW + 179_000).is_empty(), "the grace counts from when it went down");
    assert_eq!(reasons(&s.poll(NOW + 180_000)), ["Suspect n1", "Finished NodeFailed"]);
    assert!(s.cleanups[0].now, "its pods are deleted at once");
}

#[test]
fn a_deleted_node_fails_its_attempts_at_once() {
    let mut s = running_on_n1();
    s.node("n1", Some("was deleted".into()), true, NOW);
    assert_eq!(reasons(&s.poll(NOW)), ["Suspect n1", "Finished NodeFailed"]);
}

#[test]
fn failed_pulls_are_counted_per_new_pull_and_fail_past_the_tolerance() {
    let mut s = synced();
    launched(&mut s);
    let a = s.attempt(&key(), "ns", "job");
    a.pull_tolerance = 1;
    a.job = Some(JobView::default());
    let waiting = |r: &str| ContainerState::Waiting { reason: r.into(), message: "nope:1 not found".into() };
    let mut steps = Vec::new();
    for r in ["ErrImagePull", "ImagePullBackOff", "ImagePullBackOff", "ErrImagePull"] {
        s.attempt(&key(), "ns", "job").pods.insert("p".into(), pod("p", "n1", waiting(r)));
        steps.push(reasons(&s.poll(NOW)));
    }
    // The task's wait follows the pod's: said again when it changes, not when it stays.
    assert_eq!(
        steps[0],
        ["Note ImagePullBackOff", "Waiting: p (trainer) is waiting on ErrImagePull: nope:1 not found"]
    );
    assert_eq!(steps[1], ["Waiting: p (trainer) is waiting on ImagePullBackOff: nope:1 not found"]);
    assert!(steps[2].is_empty());
    assert_eq!(steps[3], ["Note ImagePullBackOff", "Finished ImagePullFailed"]);
    assert_eq!(
        s.cleanups.len(),
        1,
        "a job Trainyard gave up on is deleted: its pods still wait for the image"
    );
}

#[test]
fn a_job_that_disappears_without_a_stop_ended_unseen() {
    let mut s = synced();
    launched(&mut s);
    let a = s.attempt(&key(), "ns", "job");
    a.launched = false;
    a.job = Some(JobView::default());
    assert_eq!(reasons(&s.poll(NOW)), ["Waiting: its pods are starting"]);
    s.attempt(&key(), "ns", "job").job = None;
    assert_eq!(reasons(&s.poll(NOW)), ["Finished NodeFailed"]);
}

#[test]
fn cluster_events_about_a_job_or_its_pods_reach_their_attempt_and_no_other() {
    let mut s = synced();
    launched(&mut s);
    s.pod(&key(), "ns", pod("job-master-0", "n1", ContainerState::Running));
    s.cluster_event("ns", "job", "Normal PyTorchJob/job: SuccessfulCreatePod created".into());
    s.cluster_event("ns", "job-master-0", "Normal Pod/job-master-0: Scheduled assigned to n1".into());
    s.cluster_event("other", "job", "about another namespace's job".into());
    s.cluster_event("ns", "unrelated-pod", "about a pod that is not ours".into());
    let out = s.poll(NOW);
    let notes: Vec<&str> = out
        .iter()
        .filter_map(|o| match o {
            Observation::Note { reason: Reason::ClusterEvent, message, .. } => Some(message.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(notes.len(), 2, "{out:?}");
    assert!(notes[1].contains("Scheduled assigned to n1"));
    // Once the attempt is forgotten, so are its objects.
    s.attempt(&key(), "ns", "job").stop = Some(StopCause::UserStop);
    s.attempt(&key(), "ns", "job").launched = false;
    s.pod_gone(&key(), "ns", "job-master-0");
    assert_eq!(reasons(&s.poll(NOW)), ["Stopped Some(UserStop)"]);
    assert!(s.by_object.is_empty(), "{:?}", s.by_object);
}

/// The exit checkpoint's steps come from the pod's preStop hook lines, and only during a stop Trainyard asked
/// for; a container that ends while the checkpoint is awaited ends it (the hook dies with it), once.
#[test]
fn the_exit_checkpoint_is_reported_from_the_hook_and_the_containers_end_once() {
    let mut s = running_on_n1();
    let said = |s: &mut State, reason: Reason| s.hook_said(&key(), "p", reason, format!("p: {reason}"));
    // A program printing the hook's words before any stop is not the hook.
    said(&mut s, Reason::CheckpointRequested);
    assert!(s.out.is_empty());
    s.attempt(&key(), "ns", "job").stop = Some(StopCause::UserStop);
    said(&mut s, Reason::CheckpointRequested);
    let ended = ContainerState::Terminated {
        exit_code: 0,
        signal: None,
        reason: String::new(),
        message: String::new(),
    };
    s.pod(&key(), "ns", pod("p", "n1", ended.clone()));
    s.pod(&key(), "ns", pod("p", "n1", ended));
    // The hook's own "done" line, read after the container's end, says nothing new.
    said(&mut s, Reason::CheckpointDone);
    let notes: Vec<String> = s
        .out
        .iter()
        .map(|o| match o {
            Observation::Note { reason, message, .. } => format!("{reason}: {message}"),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        notes,
        [
            "CheckpointRequested: p: CheckpointRequested",
            "CheckpointDone: p: exited (code 0) after the checkpoint notice"
        ]
    );
}

/// A launched attempt whose job (two pods, made at `NOW`) has no pod yet, under a start-up deadline, polled once
/// at `NOW + 1 s`: it waits for its pods, saying so.
fn job_without_pods(deadline_ms: u64) -> (State, JobView) {
    let mut s = State { start_deadline_ms: deadline_ms, ..synced() };
    launched(&mut s);
    let job = JobView { expected_pods: 2, created_ms: Some(NOW), ..JobView::default() };
    s.attempt(&key(), "ns", "job").job = Some(job.clone());
    s.by_object.insert(("ns".into(), "job".into()), key());
    s.dirty.insert(key());
    assert_eq!(reasons(&s.poll(NOW + 1_000)), ["Waiting: 2 of 2 pods are not made yet"]);
    (s, job)
}

/// The start-up deadline counts from the job's creation: an attempt whose pods are not all running by then ends
/// with the cluster's reason (the last warning about it when its pods were never made), once, and its objects
/// are deleted at once; one whose pods all ran once is past it for good.
#[test]
fn an_attempt_not_running_by_its_start_up_deadline_ends_with_the_clusters_reason() {
    let (mut s, job) = job_without_pods(30_000);
    s.cluster_event(
        "ns",
        "job",
        "Warning PyTorchJob/job: FailedCreatePod pods is forbidden: exceeded quota: compute-resources".into(),
    );
    assert_eq!(
        reasons(&s.poll(NOW + 2_000)),
        [
            "Note ClusterEvent",
            "Waiting: 2 of 2 pods are not made yet: Warning PyTorchJob/job: FailedCreatePod pods is forbidden: \
             exceeded quota: compute-resources"
        ],
        "a quota may free: it waits, saying why"
    );
    // Nothing changed, but the deadline passed: read again, and ended.
    let out = s.poll(NOW + 31_000);
    assert_eq!(reasons(&out), ["Finished UserError"], "{out:?}");
    let Some(Observation::Finished { message, .. }) =
        out.iter().find(|o| matches!(o, Observation::Finished { .. }))
    else {
        unreachable!()
    };
    assert!(message.contains("exceeded quota"), "{message}");
    assert_eq!(s.cleanups.len(), 1);
    assert!(s.cleanups[0].now, "pending pods go at once");
    assert!(reasons(&s.poll(NOW + 40_000)).is_empty(), "once");

    // All running once, then a pod goes pending again: no deadline any more.
    let mut s = State { start_deadline_ms: 30_000, ..synced() };
    launched(&mut s);
    let a = s.attempt(&key(), "ns", "job");
    a.job = Some(job);
    a.pods.insert("m".into(), pod("m", "node-a", ContainerState::Running));
    a.pods.insert("w".into(), pod("w", "node-b", ContainerState::Running));
    s.dirty.insert(key());
    assert_eq!(reasons(&s.poll(NOW + 1_000)), ["Started"]);
    s.attempt(&key(), "ns", "job").pods.insert(
        "w".into(),
        pod("w", "", ContainerState::Waiting { reason: "ContainerCreating".into(), message: String::new() }),
    );
    s.dirty.insert(key());
    assert!(reasons(&s.poll(NOW + 60_000)).is_empty());
}

/// A node's catalog entry is its allocatable less what pods Trainyard did not make request there (rounded down
/// to whole CPUs and MiB); their coming, moving and going is followed.
#[test]
fn other_pods_requests_shrink_a_nodes_room() {
    let mut s = synced();
    let node = trainyard_core::catalog::Node {
        pool: "default".into(),
        vcpus: 4,
        memory_mib: 4096,
        ..Default::default()
    };
    s.raw_nodes.insert("n1".into(), (node.clone(), (4000, 4096 << 20)));
    s.raw_nodes.insert("n2".into(), (node.clone(), (4000, 4096 << 20)));
    s.inventory = Some([("n1".to_owned(), node.clone()), ("n2".to_owned(), node.clone())].into());
    // A DaemonSet's 500m / 256 MiB on each node, listed.
    let ds = |n: &str| (n.to_owned(), 500, 256 << 20);
    assert!(s.foreign_pods([("a".to_owned(), ds("n1")), ("b".to_owned(), ds("n2"))].into()));
    let inv = |s: &State, n: &str| {
        let x = &s.inventory.as_ref().unwrap()[n];
        (x.vcpus, x.memory_mib)
    };
    assert_eq!(inv(&s, "n1"), (3, 3840));
    // Another workload's 1 CPU and 1 GiB on n1, then gone; an update that changes nothing changes nothing.
    let v = s.inventory_version;
    assert!(s.foreign_pod("c", Some(("n1".into(), 1000, 1 << 30))));
    assert_eq!((inv(&s, "n1"), inv(&s, "n2")), ((2, 2816), (3, 3840)));
    assert!(s.inventory_version > v);
    assert!(!s.foreign_pod("c", Some(("n1".into(), 1000, 1 << 30))));
    assert!(s.foreign_pod("c", None));
    assert_eq!(inv(&s, "n1"), (3, 3840));
    // More than the node has: nothing left, not an underflow.
    assert!(s.foreign_pod("d", Some(("n2".into(), 9000, 9 << 30))));
    assert_eq!(inv(&s, "n2"), (0, 0));
}

/// Issue 32: pods the namespace's Pod Security refuses are never made, whatever the wait: the attempt ends at
/// once as the task's to fix (its image's catalog entry, or the namespace), with the cluster's words and how a
/// `restricted` namespace is passed, and its objects go.
#[test]
fn pods_refused_by_pod_security_end_the_attempt_at_once() {
    let (mut s, _) = job_without_pods(600_000);
    s.cluster_event(
        "ns",
        "job",
        "Warning PyTorchJob/job: FailedCreatePod Error creating: pods \"job-master-0\" is forbidden: violates \
         PodSecurity \"restricted:latest\": runAsNonRoot != true"
            .into(),
    );
    let out = s.poll(NOW + 2_000);
    assert_eq!(reasons(&out), ["Note ClusterEvent", "Finished UserError"], "{out:?}");
    let Some(Observation::Finished { message, .. }) =
        out.iter().find(|o| matches!(o, Observation::Finished { .. }))
    else {
        unreachable!()
    };
    assert!(message.contains("runAsNonRoot != true") && message.contains("runAsUser"), "{message}");
    assert!(s.cleanups.len() == 1 && s.cleanups[0].now);
    assert!(reasons(&s.poll(NOW + 3_000)).is_empty(), "once");
}

/// A PyTorchJob's shrink waits while a worker that stays is not running (the training operator would count the
/// removed worker's end as a failed replica and fail the job), goes once they all run, and is dropped by a stop.
#[test]
fn a_shrink_waits_until_the_pods_that_stay_run() {
    let mut s = synced();
    launched(&mut s);
    let a = s.attempt(&key(), "ns", "job");
    a.job = Some(JobView::default());
    let worker =
        |name: &str, state: ContainerState| PodView { role: "worker".into(), ..pod(name, "n1", state) };
    a.pods.insert("job-master-0".into(), pod("job-master-0", "n1", ContainerState::Running));
    a.pods.insert(
        "job-worker-0".into(),
        worker(
            "job-worker-0",
            ContainerState::Waiting { reason: "PodInitializing".into(), message: String::new() },
        ),
    );
    a.pods.insert("job-worker-1".into(), worker("job-worker-1", ContainerState::Running));
    assert!(removes_a_worker(a, 1) && !removes_a_worker(a, 2));
    assert_eq!(held_until(a, 1), ["job-worker-0"]);
    assert_eq!(held_until(a, 3), ["job-worker-0", "job-worker-2"], "a worker not made yet is waited for too");
    let objs = crate::objects::AttemptObjects {
        job: serde_json::json!({"kind": "PyTorchJob"}),
        secret: None,
        ssh_secret: None,
        pull_secret: None,
        pod_group: None,
        precheck_service: None,
        network_policy: None,
    };
    a.held_shrink = Some(HeldShrink { objs, workers: 1 });
    s.poll(NOW);
    assert!(s.shrinks.is_empty(), "held while worker-0 starts");
    s.pod(&key(), "ns", worker("job-worker-0", ContainerState::Running));
    s.poll(NOW + 1);
    assert_eq!(s.shrinks.len(), 1, "applied once every pod that stays runs");
    assert_eq!(s.shrinks[0].2.workers, 1);
    assert!(s.attempts[&key()].held_shrink.is_none());

    // A stop drops a shrink still held.
    let shrink = s.shrinks.remove(0).2;
    let a = s.attempts.get_mut(&key()).unwrap();
    a.pods.get_mut("job-worker-0").unwrap().phase = "Pending".into();
    a.held_shrink = Some(shrink);
    a.stop = Some(StopCause::UserStop);
    s.dirty.insert(key());
    s.poll(NOW + 2);
    assert!(s.shrinks.is_empty() && s.attempts.get(&key()).is_none_or(|a| a.held_shrink.is_none()));
}

/// Issue 32: a job Kueue evicts once it ran ends its attempt as preempted. The attempt is kept, its job not
/// deleted, until Trainyard stops it (as it stops an attempt it preempts itself): the stop ends in `Stopped`
/// with its cause, even after the job and its pods are gone.
#[test]
fn kueue_s_eviction_is_a_preemption_that_waits_for_trainyard_s_stop() {
    let mut s = running_on_n1();
    s.kueue = true;
    let suspended = JobView {
        conditions: vec![("Suspended".into(), "Preempted to make room".into())],
        ..JobView::default()
    };
    s.attempt(&key(), "ns", "job").job = Some(suspended);
    let out = s.poll(NOW + 1);
    assert_eq!(reasons(&out), ["Finished Preempted"]);
    assert!(s.cleanups.is_empty(), "the job goes with Trainyard's stop");
    assert_eq!(s.alive(), [key()], "alive while its job is there");
    // Its job and pods go (the operator deletes the pods of a suspended job): kept all the same.
    let a = s.attempts.get_mut(&key()).unwrap();
    a.job = None;
    a.pods.clear();
    a.launched = false;
    s.dirty.insert(key());
    assert!(s.poll(NOW + 2).is_empty());
    assert!(s.attempts.contains_key(&key()), "kept until it is stopped");
    // Trainyard's stop (what `KubeBackend::stop` records) then ends it.
    s.attempts.get_mut(&key()).unwrap().stop = Some(StopCause::Preempted);
    s.dirty.insert(key());
    assert_eq!(reasons(&s.poll(NOW + 3)), ["Stopped Some(Preempted)"]);
    assert!(!s.attempts.contains_key(&key()));
}

/// With Kueue admitting, the wait in Kueue's queue is the task's queue wait: the start-up deadline counts from
/// when Kueue let the job go, not from its creation.
#[test]
fn with_kueue_the_start_up_deadline_counts_from_its_admission() {
    let mut s = State { start_deadline_ms: 30_000, kueue: true, ..synced() };
    launched(&mut s);
    let held = JobView {
        expected_pods: 1,
        created_ms: Some(NOW),
        conditions: vec![("Suspended".into(), "waiting for Kueue".into())],
        ..JobView::default()
    };
    s.attempt(&key(), "ns", "job").job = Some(held.clone());
    let out = s.poll(NOW + 1_000);
    assert!(reasons(&out)[0].starts_with("Waiting: Kueue has not admitted the job yet"), "{out:?}");
    s.dirty.insert(key());
    assert!(s.poll(NOW + 600_000).is_empty(), "ten minutes in Kueue's queue: still waiting");
    // Let go at NOW + 600 s: its pods have 30 s from there.
    s.attempt(&key(), "ns", "job").job = Some(JobView { conditions: Vec::new(), ..held });
    s.poll(NOW + 600_500);
    s.dirty.insert(key());
    assert!(!reasons(&s.poll(NOW + 620_000)).iter().any(|r| r.starts_with("Finished")));
    let out = s.poll(NOW + 631_000);
    assert!(reasons(&out).iter().any(|r| r.starts_with("Finished")), "{out:?}");
}
