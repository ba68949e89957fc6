use super::*;

fn pod(name: &str, role: &str, phase: &str, containers: Vec<ContainerState>) -> PodView {
    PodView {
        name: name.to_owned(),
        role: role.to_owned(),
        node: format!("node-{name}"),
        phase: phase.to_owned(),
        init: Vec::new(),
        containers: containers.into_iter().map(|s| ("trainer".to_owned(), s)).collect(),
        deleting: false,
        unschedulable: None,
        disrupted: None,
    }
}

fn ended(code: i32, reason: &str) -> ContainerState {
    ContainerState::Terminated {
        exit_code: code,
        signal: None,
        reason: reason.to_owned(),
        message: String::new(),
    }
}

fn waiting(reason: &str) -> ContainerState {
    ContainerState::Waiting { reason: reason.to_owned(), message: format!("{reason}: pulling nope:1") }
}

fn job(conditions: &[&str]) -> JobView {
    JobView {
        conditions: conditions.iter().map(|c| ((*c).to_owned(), format!("{c} says so"))).collect(),
        ..JobView::default()
    }
}

#[test]
fn pending_pods_have_not_started_and_running_ones_have() {
    let pending = [pod("m-0", "master", "Pending", vec![waiting("ContainerCreating")])];
    let a = assess(JobKind::PyTorch, &job(&["Created"]), &pending, false, &[], false);
    assert_eq!(a, Assessment::default());
    let running = [pod("m-0", "master", "Running", vec![ContainerState::Running])];
    let a = assess(JobKind::PyTorch, &job(&["Created", "Running"]), &running, false, &[], false);
    assert!(a.started && a.ended.is_none(), "{a:?}");
}

#[test]
fn a_succeeded_pytorchjob_completes() {
    let pods = [pod("m-0", "master", "Succeeded", vec![ended(0, "Completed")])];
    let a = assess(JobKind::PyTorch, &job(&["Created", "Succeeded"]), &pods, false, &[], false);
    assert_eq!(a.ended.map(|e| e.0), Some(Reason::Completed));
    assert!(a.started);
}

#[test]
fn a_failed_pytorchjob_is_classified_by_its_first_failed_pod_master_first() {
    let pods = [
        pod("j-worker-0", "worker", "Failed", vec![ended(2, "Error")]),
        pod("j-master-0", "master", "Failed", vec![ended(3, "Error")]),
    ];
    let (reason, message) =
        assess(JobKind::PyTorch, &job(&["Failed"]), &pods, false, &[], false).ended.unwrap();
    assert_eq!(reason, Reason::UserError);
    assert!(message.contains("j-master-0") && message.contains("code 3"), "{message}");

    let oom = [pod("j-worker-0", "worker", "Failed", vec![ended(137, "OOMKilled")])];
    let (reason, message) =
        assess(JobKind::PyTorch, &job(&["Failed"]), &oom, false, &[], false).ended.unwrap();
    assert_eq!(reason, Reason::OutOfMemory, "{message}");

    // The operator failed the job but no pod says why (deleted pods, a backoff limit): its message.
    let (reason, message) =
        assess(JobKind::PyTorch, &job(&["Failed"]), &[], false, &[], false).ended.unwrap();
    assert_eq!(reason, Reason::UserError);
    assert!(message.contains("Failed says so"), "{message}");
}

#[test]
fn the_precheck_passes_or_fails_with_a_suspect_node() {
    let mut p = pod("m-0", "master", "Pending", vec![waiting("PodInitializing")]);
    p.init = vec![(PRECHECK_CONTAINER.to_owned(), ContainerState::Running)];
    let a = assess(JobKind::PyTorch, &job(&["Created"]), std::slice::from_ref(&p), true, &[], false);
    assert!(a.started && !a.precheck_passed && a.ended.is_none(), "{a:?}");

    p.init[0].1 = ended(0, "Completed");
    let a = assess(JobKind::PyTorch, &job(&["Created"]), std::slice::from_ref(&p), true, &[], false);
    assert!(a.precheck_passed, "{a:?}");

    p.init[0].1 = ContainerState::Terminated {
        exit_code: 2,
        signal: None,
        reason: "Error".into(),
        message: "GPU 0 failed its check".into(),
    };
    let a = assess(JobKind::PyTorch, &job(&["Created"]), std::slice::from_ref(&p), true, &[], false);
    let (reason, message) = a.ended.unwrap();
    assert_eq!(reason, Reason::PrecheckFailed);
    assert!(message.contains("GPU 0 failed its check"), "{message}");
    assert_eq!(
        a.suspects,
        vec![("node-m-0".to_owned(), "node node-m-0 failed the precheck of m-0".to_owned())]
    );

    // No torch in the image: the precheck fails, but the node is not to blame.
    p.init[0].1 = ended(PRECHECK_NO_TORCH, "Error");
    let a = assess(JobKind::PyTorch, &job(&["Created"]), std::slice::from_ref(&p), true, &[], false);
    assert_eq!(a.ended.map(|e| e.0), Some(Reason::PrecheckFailed));
    assert!(a.suspects.is_empty());
}

#[test]
fn rayjobs_end_by_their_job_status() {
    let head = [pod("r-head", "head", "Running", vec![ContainerState::Running])];
    let mut j = JobView { ray_job_status: Some("RUNNING".into()), ..JobView::default() };
    assert_eq!(assess(JobKind::Ray, &j, &head, false, &[], false).ended, None);
    j.ray_job_status = Some("SUCCEEDED".into());
    assert_eq!(
        assess(JobKind::Ray, &j, &head, false, &[], false).ended.map(|e| e.0),
        Some(Reason::Completed)
    );
    j.ray_job_status = Some("FAILED".into());
    j.message = Some("entrypoint exited with 1".into());
    let (reason, message) = assess(JobKind::Ray, &j, &head, false, &[], false).ended.unwrap();
    assert_eq!(reason, Reason::UserError);
    assert!(message.contains("entrypoint exited with 1"), "{message}");
    // A spec KubeRay refuses never becomes a Ray cluster: the attempt ends with KubeRay's words, not a wait.
    let j = JobView {
        ray_deployment_status: Some("ValidationFailed".into()),
        message: Some(
            "The RayJob spec is invalid: authOptions.mode is 'token' but RayVersion was not specified".into(),
        ),
        ..JobView::default()
    };
    let (reason, message) = assess(JobKind::Ray, &j, &[], false, &[], false).ended.unwrap();
    assert_eq!(reason, Reason::UserError);
    assert!(message.starts_with("KubeRay refused the RayJob: The RayJob spec is invalid"), "{message}");
    assert!(!j.ended(), "KubeRay leaves it: Trainyard deletes it");
}

#[test]
fn pull_trouble_is_seen_on_init_and_main_containers() {
    let p = pod("m-0", "master", "Pending", vec![waiting("ImagePullBackOff")]);
    assert_eq!(p.pull_trouble().map(|t| t.0), Some("ImagePullBackOff"));
    let p = pod("m-0", "master", "Pending", vec![waiting("ContainerCreating")]);
    assert_eq!(p.pull_trouble(), None);
}

/// A start that did not come by the deadline: the cluster's reason, as a spec error where resubmitting would
/// meet it again, else as an infrastructure failure that is resubmitted elsewhere.
#[test]
fn a_start_past_its_deadline_says_why_in_the_clusters_words() {
    let job = JobView { expected_pods: 2, created_ms: Some(1), ..JobView::default() };
    let pending = |name: &str, role: &str, why: Option<&str>| PodView {
        unschedulable: why.map(str::to_owned),
        ..pod(name, role, "Pending", vec![])
    };
    let running = pod("w-0", "worker", "Running", vec![ContainerState::Running]);
    assert!(!all_started(&job, std::slice::from_ref(&running)), "one of two");
    assert!(all_started(
        &job,
        &[running.clone(), pod("m-0", "master", "Running", vec![ContainerState::Running])]
    ));

    let pvc = pending(
        "m-0",
        "master",
        Some("0/3 nodes are available: persistentvolumeclaim \"imagenet\" not found."),
    );
    let (reason, message) = not_started(&job, &[running.clone(), pvc], None, 30);
    assert_eq!(reason, Reason::UserError);
    assert!(
        message.contains("start-up deadline (30 s)") && message.contains("m-0 is Unschedulable: 0/3 nodes"),
        "{message}"
    );
    assert!(message.contains("persistentvolumeclaim \"imagenet\" not found"), "{message}");

    let taint = pending(
        "m-0",
        "master",
        Some("0/3 nodes are available: 3 node(s) had untolerated taint {gpu: true}."),
    );
    let (reason, message) = not_started(&job, &[running.clone(), taint], None, 30);
    assert_eq!(reason, Reason::StartTimedOut);
    assert!(message.contains("untolerated taint {gpu: true}"), "{message}");
    assert_eq!(
        trainyard_core::lifecycle::failure_class(reason),
        trainyard_core::lifecycle::FailureClass::Infrastructure
    );

    let config = pod(
        "m-0",
        "master",
        "Pending",
        vec![ContainerState::Waiting {
            reason: "CreateContainerConfigError".into(),
            message: "secret \"x\" not found".into(),
        }],
    );
    let (reason, message) = not_started(&job, &[running.clone(), config], None, 30);
    assert_eq!(reason, Reason::UserError);
    assert!(
        message.contains("(trainer) is waiting on CreateContainerConfigError: secret \"x\" not found"),
        "{message}"
    );
    let slow = pod("m-0", "master", "Pending", vec![waiting("ContainerCreating")]);
    assert_eq!(not_started(&job, &[running.clone(), slow], None, 30).0, Reason::StartTimedOut);

    // Pods never made: the operator's warning says why.
    let forbidden = "Warning PyTorchJob/j: FailedCreatePod Error creating: pods \"j-master-0\" is forbidden: violates PodSecurity \"restricted:latest\": runAsNonRoot != true";
    let (reason, message) = not_started(&job, &[], Some(forbidden), 30);
    assert_eq!(reason, Reason::UserError);
    assert!(
        message.contains("2 of 2 pods were never made: Warning PyTorchJob/j: FailedCreatePod"),
        "{message}"
    );
    let (reason, message) = not_started(&job, &[], None, 30);
    assert_eq!(reason, Reason::StartTimedOut);
    assert!(message.contains("the cluster said nothing about it"), "{message}");
}

/// A pod the cluster took away (a drain's eviction) fails its job with the exit code of a kill; the attempt
/// ends as `Disrupted`, an infrastructure failure, not as the task's own error.
#[test]
fn a_pod_the_cluster_took_away_is_a_disruption_not_the_tasks_failure() {
    let job =
        JobView { conditions: vec![("Failed".into(), "PyTorchJob failed".into())], ..JobView::default() };
    let master = pod("m-0", "master", "Failed", vec![ended(137, "Error")]);
    let evicted = PodView {
        disrupted: Some("EvictionByEvictionAPI: Eviction API: evicting".into()),
        ..pod("w-0", "worker", "Failed", vec![ended(143, "Error")])
    };
    let (reason, message) =
        assess(JobKind::PyTorch, &job, &[master.clone(), evicted], false, &[], false).ended.unwrap();
    assert_eq!(reason, Reason::Disrupted);
    assert_eq!(
        message,
        "w-0 on node-w-0 was taken away by the cluster: EvictionByEvictionAPI: Eviction API: evicting"
    );
    assert_eq!(
        trainyard_core::lifecycle::failure_class(reason),
        trainyard_core::lifecycle::FailureClass::Infrastructure
    );
    // Without it, the same exit is the task's.
    let plain = pod("w-0", "worker", "Failed", vec![ended(143, "Error")]);
    let (reason, _) = assess(JobKind::PyTorch, &job, &[master, plain], false, &[], false).ended.unwrap();
    assert_ne!(reason, Reason::Disrupted);
}

/// Issue 32: Trainyard never suspends a job, so a suspended one was suspended by someone else, or (with Kueue
/// admitting) evicted by Kueue once it had run. The first is an infrastructure failure, resubmitted; the second
/// Kueue's preemption; never the task's own. A job Kueue has not admitted yet is suspended as it should be: it
/// waits.
#[test]
fn a_job_suspended_by_someone_else_or_evicted_by_kueue_is_a_disruption() {
    let running = [pod("m-0", "master", "Running", vec![ContainerState::Running])];
    let pending: [PodView; 0] = [];
    let a = assess(JobKind::PyTorch, &job(&["Created", "Suspended"]), &running, false, &[], false);
    let (reason, message) = a.ended.unwrap();
    assert_eq!(reason, Reason::Disrupted);
    assert!(message.contains("suspended by someone other than Trainyard: Suspended says so"), "{message}");
    // Suspended before it ever ran, without Kueue: still someone else's doing.
    let a = assess(JobKind::PyTorch, &job(&["Created", "Suspended"]), &pending, false, &[], false);
    assert_eq!(a.ended.map(|e| e.0), Some(Reason::Disrupted));
    // With Kueue: waiting for admission, then an eviction once it ran.
    let a = assess(JobKind::PyTorch, &job(&["Created", "Suspended"]), &pending, false, &[], true);
    assert_eq!(a.ended, None, "waits for Kueue");
    let a = assess(JobKind::PyTorch, &job(&["Created", "Suspended"]), &running, false, &[], true);
    let (reason, message) = a.ended.unwrap();
    assert_eq!(reason, Reason::Preempted, "Kueue's eviction is its preemption");
    assert!(message.starts_with("Kueue evicted the job"), "{message}");
    // A RayJob's deployment status says it.
    let ray = JobView { ray_deployment_status: Some("Suspended".into()), ..JobView::default() };
    let head = [pod("h-0", "head", "Running", vec![ContainerState::Running])];
    let a = assess(JobKind::Ray, &ray, &head, false, &[], false);
    assert_eq!(a.ended.map(|e| e.0), Some(Reason::Disrupted));
    // A job that ended well is not a disruption, whatever else it says.
    let a = assess(JobKind::PyTorch, &job(&["Succeeded", "Suspended"]), &running, false, &[], false);
    assert_eq!(a.ended.map(|e| e.0), Some(Reason::Completed));
}

#[test]
fn a_failed_working_directory_fetch_ends_the_attempt_with_its_words() {
    let mut p = pod("m-0", "master", "Failed", vec![waiting("PodInitializing")]);
    let gone = "trainyard: Not found (404): no such working directory in this project group";
    p.init = vec![(
        WORKDIR_CONTAINER.to_owned(),
        ContainerState::Terminated {
            exit_code: 3,
            signal: None,
            reason: "Error".into(),
            message: gone.into(),
        },
    )];
    let a =
        assess(JobKind::PyTorch, &job(&["Created", "Failed"]), std::slice::from_ref(&p), false, &[], false);
    let (reason, message) = a.ended.unwrap();
    assert_eq!(reason, Reason::UserError, "collected: the task's to send again");
    assert!(
        message.contains("fetching its working directory failed") && message.contains("404"),
        "{message}"
    );

    p.init[0].1 = ContainerState::Terminated {
        exit_code: 5,
        signal: None,
        reason: "Error".into(),
        message: "trainyard: cannot reach http://trainyard:8080".into(),
    };
    let a =
        assess(JobKind::PyTorch, &job(&["Created", "Failed"]), std::slice::from_ref(&p), false, &[], false);
    assert_eq!(
        a.ended.unwrap().0,
        Reason::StartTimedOut,
        "the server out of reach: the start's, resubmitted"
    );

    p.init[0].1 = ended(0, "Completed");
    p.phase = "Running".into();
    p.containers[0].1 = ContainerState::Running;
    let a =
        assess(JobKind::PyTorch, &job(&["Created", "Running"]), std::slice::from_ref(&p), false, &[], false);
    assert!(a.started && a.ended.is_none(), "{a:?}");
}
