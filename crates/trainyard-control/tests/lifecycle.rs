//! The control loop end to end over a real store (SQLite) and the fake backend, on a virtual clock:
//! submission, the lifecycle with its events in order, retries, stops, preemption, and a restart mid-run.

// Tests are the shell: they make temp dirs and time what they run.
#![allow(clippy::disallowed_methods)]

use trainyard_control::secrets::SecretBox;
use trainyard_control::{Control, SubmitError};
use trainyard_core::Catalog;
use trainyard_runtime::fake::{FakeBackend, Script};
use trainyard_sched::Config;
use trainyard_store::{Created, NewTask, Store};

const CATALOG: &str = r#"
regions: {local: {}}
clusters: {local: {region: local}}
pools: {default: {cluster: local, instanceSpecs: [cpu.small]}}
instanceSpecs: {cpu.small: {kind: CPU, vcpus: 2, memoryMib: 4096}}
nodes: {node-0: {pool: default, vcpus: 8, memoryMib: 16384}}
projectGroups: {nlp: {}, vision: {}}
images: {host: {torch: true, ray: true}}
quotas:
  - {group: nlp, resourceType: Reserved, pool: default, spec: cpu.small, units: 4}
"#;

fn task(name: &str, group: &str, rtype: &str, workers: u32, extra: &str) -> String {
    format!(
        r#"apiVersion: trainyard.dev/v1
kind: TrainingTask
metadata: {{namePrefix: {name}, projectGroup: {group}}}
spec:
  type: PyTorchJob
  placement: {{region: local, cluster: local}}
  environment: {{image: host, cmd: python3 train.py}}
  compute:
    resourceType: {rtype}
    pool: default
    workers: {workers}
    instanceSpecs: [{{spec: cpu.small, countPerNode: 1}}]
{extra}"#
    )
}

async fn control(backend: FakeBackend) -> (Control<FakeBackend>, String) {
    let dir = std::env::temp_dir().join(format!(
        "trainyard-control-{}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("t.db").display());
    let store = Store::connect(&url).await.unwrap();
    (
        Control::new(
            store,
            backend,
            Catalog::from_yaml(CATALOG).unwrap(),
            Config::default(),
            SecretBox::new([1; 32]),
        ),
        url,
    )
}

async fn status(c: &Control<FakeBackend>, id: &str) -> (String, i64) {
    let t = c.store().get_task(id).await.unwrap().unwrap();
    (t.status.to_string(), t.attempt)
}

async fn reasons(c: &Control<FakeBackend>, id: &str) -> Vec<String> {
    c.store().list_events(id, 0, 1000).await.unwrap().into_iter().map(|e| e.reason).collect()
}

async fn submit(c: &Control<FakeBackend>, body: &str, at: i64) -> String {
    c.submit("alice", body.as_bytes(), None, at).await.unwrap().task().id.clone()
}

#[tokio::test]
async fn a_task_goes_from_queued_to_succeeded_with_every_event_in_order() {
    let backend = FakeBackend::new(Script { start_ms: 1_000, run_ms: 10_000, ..Script::default() });
    let (mut c, _) = control(backend.clone()).await;
    let id = submit(&c, &task("smoke", "nlp", "Reserved", 1, ""), 0).await;
    let t = c.store().get_task(&id).await.unwrap().unwrap();
    assert!(t.name.starts_with("smoke-") && t.name.len() == "smoke-".len() + 5, "{}", t.name);
    assert_eq!(status(&c, &id).await, ("Queued".into(), 0));

    c.tick(0).await.unwrap();
    assert_eq!(status(&c, &id).await.0, "Starting");
    let placement: serde_json::Value =
        serde_json::from_str(&c.store().get_task(&id).await.unwrap().unwrap().placement).unwrap();
    assert_eq!(placement["replicas"][0]["role"], "master");
    assert_eq!(placement["replicas"][1]["role"], "worker");
    assert_eq!(placement["replicas"][1]["rank"], 1);
    c.tick(500).await.unwrap();
    assert_eq!(status(&c, &id).await.0, "Starting", "the image takes 1 s");
    c.tick(1_000).await.unwrap();
    assert_eq!(status(&c, &id).await.0, "Running");
    c.tick(11_000).await.unwrap();
    assert_eq!(status(&c, &id).await.0, "Succeeded");
    assert_eq!(reasons(&c, &id).await, ["Submitted", "Admitted", "Admitted", "Started", "Completed"]);
    assert_eq!(backend.launches(), 1);
    // Nothing left to do: further ticks change nothing.
    c.tick(20_000).await.unwrap();
    assert_eq!(reasons(&c, &id).await.len(), 5);
}

#[tokio::test]
async fn a_bad_task_is_refused_with_every_problem_and_nothing_stored() {
    let (c, _) = control(FakeBackend::default()).await;
    let bad = task("Bad_Name", "nlp", "Reserved", 9999, "  advanced: {imagePullTolerance: -5}\n");
    match c.submit("alice", bad.as_bytes(), None, 0).await {
        Err(SubmitError::Invalid(report)) => {
            let paths: Vec<&str> = report.errors().map(|p| p.path.as_str()).collect();
            assert_eq!(
                paths,
                ["metadata.namePrefix", "spec.compute.workers", "spec.advanced.imagePullTolerance"]
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(c.store().count_tasks().await.unwrap(), 0);
}

#[tokio::test]
async fn retried_submissions_with_one_key_create_one_task() {
    let (c, _) = control(FakeBackend::default()).await;
    let body = task("idem", "nlp", "Reserved", 0, "");
    let first = c.submit("alice", body.as_bytes(), Some("k1"), 0).await.unwrap();
    let again = c.submit("alice", body.as_bytes(), Some("k1"), 5).await.unwrap();
    assert!(matches!(first, Created::New(_)) && matches!(again, Created::Existing(_)));
    assert_eq!(first.task().id, again.task().id);
    let other = task("idem", "nlp", "Reserved", 1, "");
    assert!(matches!(
        c.submit("alice", other.as_bytes(), Some("k1"), 6).await,
        Err(SubmitError::Store(trainyard_store::StoreError::IdempotencyConflict))
    ));
    assert_eq!(c.store().count_tasks().await.unwrap(), 1);
}

#[tokio::test]
async fn names_count_up_and_a_run_of_taken_names_costs_one_retry() {
    let (c, _) = control(FakeBackend::default()).await;
    let body = task("clash", "nlp", "Reserved", 0, "");
    let first = submit(&c, &body, 0).await;
    let first = c.store().get_task(&first).await.unwrap().unwrap().name;
    // Base 36, most significant digit first, in ASCII order: the suffix of the next name sorts after.
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let value = |name: &str| {
        let suffix = name.strip_prefix("clash-").expect("the prefix, a dash and the suffix");
        assert_eq!(suffix.len(), 5, "{name}");
        suffix.bytes().fold(0u64, |n, c| n * 36 + DIGITS.iter().position(|&d| d == c).unwrap() as u64)
    };
    let encode = |mut n: u64| {
        let mut out = [0u8; 5];
        for c in out.iter_mut().rev() {
            *c = DIGITS[(n % 36) as usize];
            n /= 36;
        }
        format!("clash-{}", std::str::from_utf8(&out).unwrap())
    };
    let n = value(&first);
    // The next 300 names are taken (as a server that counted there before a restart leaves them). Other
    // tests of this binary take suffixes from the same count meanwhile, far fewer than 300.
    let spec_json = c
        .store()
        .get_task(&submit(&c, &task("other", "nlp", "Reserved", 0, ""), 1).await)
        .await
        .unwrap()
        .unwrap()
        .spec_json;
    let taken: Vec<NewTask> = (1..=300u64)
        .map(|k| NewTask {
            id: format!("taken{k:011}"),
            name: encode((n + k) % 36u64.pow(5)),
            owner: "bob".into(),
            project_group: "nlp".into(),
            task_type: "PyTorchJob".into(),
            status: trainyard_core::lifecycle::Status::Succeeded,
            public: false,
            labels: Default::default(),
            spec_json: spec_json.clone(),
            created_at_ms: 1,
            idempotency: None,
            first_event: None,
            demand: None,
        })
        .collect();
    c.store().import_tasks(&taken).await.unwrap();
    // The next create meets a taken name (the count is still inside the run), moves elsewhere and is stored;
    // walking the run one name a try would give up after a few.
    let next = submit(&c, &body, 2).await;
    let next = c.store().get_task(&next).await.unwrap().unwrap().name;
    let k = value(&next).wrapping_sub(n) % 36u64.pow(5);
    assert!(!(1..=300).contains(&k), "{next} is one of the taken names");
    // From there it counts up again.
    let after = submit(&c, &body, 3).await;
    let after = c.store().get_task(&after).await.unwrap().unwrap().name;
    assert!(value(&after) > value(&next) || value(&next) > 36u64.pow(5) - 1_000, "{next} then {after}");
}

#[tokio::test]
async fn infrastructure_failures_are_retried_within_the_budget_and_user_errors_are_not() {
    let backend = FakeBackend::new(Script { run_ms: 1_000, ..Script::default() });
    let (mut c, _) = control(backend.clone()).await;
    let retried = submit(
        &c,
        &task("flaky", "nlp", "Reserved", 0, "  advanced: {faultTolerance: {maxResubmissions: 1}}\n"),
        0,
    )
    .await;
    let broken = submit(
        &c,
        &task("broken", "nlp", "Reserved", 0, "  advanced: {faultTolerance: {maxResubmissions: 3}}\n"),
        1,
    )
    .await;
    let fail = |r| Script { run_ms: 1_000, outcome: r, ..Script::default() };
    backend.script(
        &retried,
        vec![
            fail(trainyard_core::lifecycle::Reason::NodeFailed),
            fail(trainyard_core::lifecycle::Reason::NodeFailed),
        ],
    );
    backend.script(&broken, vec![fail(trainyard_core::lifecycle::Reason::UserError)]);
    for now in [0, 1, 1_001, 1_002, 1_003, 2_003, 2_004] {
        c.tick(now).await.unwrap();
    }
    // One automatic resubmission, then the budget is spent.
    assert_eq!(status(&c, &retried).await, ("Failed".into(), 1));
    assert_eq!(
        reasons(&c, &retried).await,
        [
            "Submitted",
            "Admitted",
            "Admitted",
            "Started",
            "NodeFailed",
            "Requeued",
            "Admitted",
            "Admitted",
            "Started",
            "NodeFailed",
            "RetryBudgetSpent"
        ]
    );
    // A user error is not retried, whatever the budget.
    assert_eq!(status(&c, &broken).await, ("Failed".into(), 0));
    assert_eq!(reasons(&c, &broken).await.last().unwrap(), "UserError");
}

/// Issue 32: an attempt the backend's cluster preempted (Kueue evicting its job) goes the way of Trainyard's own
/// preemptions: Stopping, a stop, back in the queue, without spending the retry budget (here none at all).
#[tokio::test]
async fn a_preemption_by_the_cluster_requeues_the_task_without_spending_its_budget() {
    let backend = FakeBackend::new(Script { run_ms: 1_000, ..Script::default() });
    let (mut c, _) = control(backend.clone()).await;
    let id = submit(
        &c,
        &task("evicted", "nlp", "Reserved", 0, "  advanced: {faultTolerance: {maxResubmissions: 0}}\n"),
        0,
    )
    .await;
    let preempted =
        Script { run_ms: 1_000, outcome: trainyard_core::lifecycle::Reason::Preempted, ..Script::default() };
    backend.script(&id, vec![preempted]);
    for now in (0..12).map(|i| i * 500) {
        c.tick(now).await.unwrap();
    }
    assert_eq!(status(&c, &id).await, ("Succeeded".into(), 1), "{:?}", reasons(&c, &id).await);
    let seen = reasons(&c, &id).await;
    let at = seen.iter().position(|r| r == "Preempted").unwrap_or_else(|| panic!("{seen:?}"));
    assert_eq!(seen[at + 1], "Requeued", "{seen:?}");
    assert!(!seen.iter().any(|r| r == "RetryBudgetSpent"), "{seen:?}");
    assert_eq!(backend.launches(), 2);
}

#[tokio::test]
async fn a_refused_launch_is_asked_again_with_events_and_fails_the_attempt_after_five() {
    let backend = FakeBackend::new(Script { run_ms: 1_000, ..Script::default() });
    let (mut c, _) = control(backend.clone()).await;
    let recovers = submit(&c, &task("recovers", "nlp", "Reserved", 0, ""), 0).await;
    let refused = submit(
        &c,
        &task("refused", "nlp", "Reserved", 0, "  advanced: {faultTolerance: {maxResubmissions: 1}}\n"),
        1,
    )
    .await;
    backend.refuse_launches(&recovers, 2);
    backend.refuse_launches(&refused, 5);
    // Ticks every 100 ms for 40 s: the waits between tries (1, 2, 4, 8 s) hold the requests back.
    for now in (0..400).map(|k| 2 + k * 100) {
        c.tick(now).await.unwrap();
    }
    // Two refusals, then the launch went through: two events, no failure.
    let r = reasons(&c, &recovers).await;
    assert_eq!(r.iter().filter(|r| *r == "BackendError").count(), 2, "{r:?}");
    assert_eq!(status(&c, &recovers).await, ("Succeeded".into(), 0));
    // Five refusals in a row fail the attempt as LaunchFailed (told at the 1st, 2nd and 4th); the retry policy
    // queues a second attempt, which starts.
    let r = reasons(&c, &refused).await;
    assert_eq!(
        r,
        [
            "Submitted",
            "Admitted",
            "Admitted",
            "BackendError",
            "BackendError",
            "BackendError",
            "LaunchFailed",
            "Requeued",
            "Admitted",
            "Admitted",
            "Started",
            "Completed"
        ]
    );
    assert_eq!(status(&c, &refused).await, ("Succeeded".into(), 1));
    let events = c.store().list_events(&refused, 0, 100).await.unwrap();
    let failed = events.iter().find(|e| e.reason == "LaunchFailed").unwrap();
    assert!(failed.message.contains("5 times in a row"), "{}", failed.message);
    // The waits were kept: the five tries of the first attempt span 1 + 2 + 4 + 8 = 15 s.
    let first = events.iter().find(|e| e.reason == "BackendError").unwrap().at_ms;
    assert!(failed.at_ms - first >= 15_000, "{} .. {}", first, failed.at_ms);
}

#[tokio::test]
async fn a_node_marked_failed_stops_its_tasks_and_requeues_them() {
    let backend = FakeBackend::new(Script { run_ms: 100_000, stop_ms: 1_000, ..Script::default() });
    let (mut c, _) = control(backend.clone()).await;
    let id = submit(&c, &task("on-node", "nlp", "Reserved", 0, ""), 0).await;
    for now in [1, 2] {
        c.tick(now).await.unwrap();
    }
    assert_eq!(status(&c, &id).await, ("Running".into(), 0));
    let mut catalog = Catalog::from_yaml(CATALOG).unwrap();
    catalog.nodes.get_mut("node-0").unwrap().failed = true;
    c.catalog().set(catalog);
    c.tick(3).await.unwrap();
    // Stopping in the store first, so the end of the stop requeues it (it used to stay Running for ever).
    assert_eq!(status(&c, &id).await, ("Stopping".into(), 0));
    for now in [1_100, 1_200] {
        c.tick(now).await.unwrap();
    }
    assert_eq!(status(&c, &id).await, ("Queued".into(), 1));
    let r = reasons(&c, &id).await;
    assert_eq!(&r[r.len() - 2..], ["NodeFailed", "Requeued"], "{r:?}");
}

#[tokio::test]
async fn a_stop_whose_attempt_ended_meanwhile_ends_the_stop() {
    let backend = FakeBackend::new(Script { run_ms: 1_000, stop_ms: 60_000, ..Script::default() });
    let (mut c, _) = control(backend.clone()).await;
    let id = submit(&c, &task("ends", "nlp", "Reserved", 0, ""), 0).await;
    for now in [1, 2] {
        c.tick(now).await.unwrap();
    }
    // The stop request is lost (a backend that did not take it), and the attempt ends by itself.
    backend.lose_requests(1);
    c.stop(&id, false, 500).await.unwrap();
    assert_eq!(status(&c, &id).await, ("Stopping".into(), 0));
    for now in [1_100, 1_200] {
        c.tick(now).await.unwrap();
    }
    // Its end, seen while it was being stopped, ends the stop (it used to be dropped as stale).
    assert_eq!(status(&c, &id).await, ("Stopped".into(), 0));
    let r = reasons(&c, &id).await;
    assert!(r.contains(&"BackendError".to_owned()), "the lost request is an event: {r:?}");
    assert_eq!(r.last().map(String::as_str), Some("Terminated"), "{r:?}");
}

#[tokio::test]
async fn stopping_a_queued_and_a_running_task() {
    let backend = FakeBackend::new(Script { run_ms: 100_000, stop_ms: 2_000, ..Script::default() });
    let (mut c, _) = control(backend.clone()).await;
    // 4 units of quota: the first takes all of them, the second waits.
    let running = submit(&c, &task("long", "nlp", "Reserved", 3, ""), 0).await;
    let queued = submit(&c, &task("later", "nlp", "Reserved", 0, ""), 1).await;
    c.tick(0).await.unwrap();
    c.tick(1).await.unwrap();
    assert_eq!(status(&c, &running).await.0, "Running");
    let info = c.queue_info(&queued).unwrap();
    assert_eq!(&*info.reason, "needs 1 unit of cpu.small (Reserved); group nlp has 0 left");

    c.stop(&queued, false, 10).await.unwrap();
    assert_eq!(status(&c, &queued).await.0, "Stopped");
    c.stop(&running, false, 10).await.unwrap();
    assert_eq!(status(&c, &running).await.0, "Stopping");
    c.tick(11).await.unwrap();
    assert_eq!(status(&c, &running).await.0, "Stopping", "the checkpoint window is 2 s");
    c.tick(2_011).await.unwrap();
    assert_eq!(status(&c, &running).await.0, "Stopped");
    assert_eq!(
        reasons(&c, &running).await,
        ["Submitted", "Admitted", "Admitted", "Started", "StopRequested", "Terminated"]
    );
    assert!(c.stop(&running, false, 3_000).await.is_err(), "nothing left to stop");
    // A person can run it again: a new attempt.
    c.resubmit(&running, 3_000).await.unwrap();
    assert_eq!(status(&c, &running).await, ("Queued".into(), 1));
}

#[tokio::test]
async fn a_spot_task_is_preempted_for_reserved_work_and_requeued() {
    let backend = FakeBackend::new(Script { run_ms: 1_000_000, stop_ms: 1_000, ..Script::default() });
    let (mut c, _) = control(backend.clone()).await;
    // The Spot task takes the whole node (4 units of 2 vCPU).
    let spot = submit(&c, &task("cheap", "vision", "Spot", 3, ""), 0).await;
    c.tick(0).await.unwrap();
    c.tick(1).await.unwrap();
    assert_eq!(status(&c, &spot).await.0, "Running");
    let reserved = submit(&c, &task("owner", "nlp", "Reserved", 1, ""), 2).await;
    c.tick(2).await.unwrap();
    assert_eq!(status(&c, &spot).await.0, "Stopping");
    assert!(
        c.queue_info(&reserved).unwrap().reason.contains("waiting for preempted tasks"),
        "{:?}",
        c.queue_info(&reserved)
    );
    c.tick(1_002).await.unwrap();
    // In the same tick the victim is back in the queue as a new attempt, and the reserved task starts on
    // the room it left.
    assert_eq!(status(&c, &spot).await, ("Queued".into(), 1));
    assert_eq!(status(&c, &reserved).await.0, "Starting");
    let r = reasons(&c, &spot).await;
    assert_eq!(r[r.len() - 2..], ["Preempted", "Requeued"]);
}

#[tokio::test]
async fn a_restarted_control_loop_picks_up_where_it_was() {
    let backend = FakeBackend::new(Script { start_ms: 0, run_ms: 5_000, ..Script::default() });
    let (mut c, url) = control(backend.clone()).await;
    let a = submit(&c, &task("before", "nlp", "Reserved", 0, ""), 0).await;
    c.tick(0).await.unwrap();
    c.tick(1).await.unwrap();
    assert_eq!(status(&c, &a).await.0, "Running");
    drop(c);
    // A new process: a new store connection, the same backend (the replicas kept running).
    let store = Store::connect(&url).await.unwrap();
    let mut c = Control::new(
        store,
        backend.clone(),
        Catalog::from_yaml(CATALOG).unwrap(),
        Config::default(),
        SecretBox::new([1; 32]),
    );
    let b = submit(&c, &task("after", "nlp", "Reserved", 0, ""), 2).await;
    c.tick(2).await.unwrap();
    c.tick(5_001).await.unwrap();
    assert_eq!(status(&c, &a).await.0, "Succeeded");
    c.tick(5_002).await.unwrap();
    c.tick(10_003).await.unwrap();
    assert_eq!(status(&c, &b).await.0, "Succeeded");
    assert_eq!(backend.launches(), 2, "nothing was launched twice");
}

#[tokio::test]
async fn hidden_values_are_sealed_in_the_store_and_opened_for_the_backend() {
    let backend = FakeBackend::default();
    let (mut c, _) = control(backend.clone()).await;
    let body = task("secret", "nlp", "Reserved", 0, "").replace(
        "cmd: python3 train.py}",
        "cmd: python3 train.py, env: [{name: TOKEN, value: s3cr3t-42, hidden: true}, {name: LR, value: '1'}]}",
    );
    let id = submit(&c, &body, 0).await;
    let stored = c.store().get_task(&id).await.unwrap().unwrap();
    assert!(!stored.spec_json.contains("s3cr3t-42"), "{}", stored.spec_json);
    assert!(stored.spec_json.contains("sealed:v2:"));
    c.tick(0).await.unwrap();
    let launched = backend.launched();
    let env = &launched[0].task.spec.environment.env;
    assert_eq!((env[0].name.as_str(), env[0].value.as_str()), ("TOKEN", "s3cr3t-42"));
    assert_eq!(env[1].value, "1");
}

/// A real HTTP receiver: it fails the first delivery, accepts the next; the signature checks out, and the
/// delivery log says what happened.
#[tokio::test]
async fn alarms_are_delivered_by_signed_webhook_with_retries() {
    use std::io::{BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, String)>::new()));
    let got = received.clone();
    std::thread::spawn(move || {
        for (n, stream) in listener.incoming().enumerate() {
            let mut stream = stream.unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let (signature, body) = read_webhook(&mut reader);
            got.lock().unwrap().push((signature, body));
            let status = if n == 0 { "500 Internal Server Error" } else { "200 OK" };
            write!(stream, "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
        }
    });

    let backend = FakeBackend::new(Script { run_ms: 1_000, ..Script::default() });
    let (mut c, _) = control(backend).await;
    let alarms = format!(
        "  advanced:\n    alarms:\n      - {{events: [succeeded, failed], webhook: \"http://127.0.0.1:{port}/hook\"}}\n"
    );
    let id = submit(&c, &task("alarmed", "nlp", "Reserved", 0, &alarms), 0).await;
    for now in [0, 1, 1_001] {
        c.tick(now).await.unwrap();
    }
    assert_eq!(status(&c, &id).await.0, "Succeeded");
    let key = b"test-signing-key";
    // The receiver is on loopback, which takes an explicit allowance (as `up --webhook-allow-net` gives).
    let local = loopback_allowed(trainyard_control::alarms::Webhooks::system());
    // First try at once: refused. The retry is due after the backoff, not before.
    assert_eq!(trainyard_control::alarms::deliver_due_with(c.store(), &local, key, 1_001).await.unwrap(), 1);
    assert_eq!(trainyard_control::alarms::deliver_due_with(c.store(), &local, key, 1_500).await.unwrap(), 0);
    assert_eq!(trainyard_control::alarms::deliver_due_with(c.store(), &local, key, 2_001).await.unwrap(), 1);
    let log = c.store().task_alarms(&id).await.unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!((log[0].event.as_str(), log[0].state.as_str(), log[0].tries), ("succeeded", "delivered", 2));
    let received = received.lock().unwrap().clone();
    assert_eq!(received.len(), 2);
    for (signature, body) in &received {
        assert_eq!(
            signature,
            &trainyard_control::alarms::signature(key, body.as_bytes()),
            "signed with the key"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!((v["event"].as_str(), v["task"]["id"].as_str()), (Some("succeeded"), Some(id.as_str())));
    }
    // Nothing else is due: "failed" was not raised for a task that succeeded.
    assert_eq!(
        trainyard_control::alarms::deliver_due_with(c.store(), &local, key, 100_000).await.unwrap(),
        0
    );
}

/// A CA made for one test, and a server certificate it signed for 127.0.0.1 and localhost.
struct TestPki {
    ca_pem: String,
    server: rustls::ServerConfig,
}

fn test_pki() -> TestPki {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "Trainyard test CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let server_key = KeyPair::generate().unwrap();
    let mut leaf = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    leaf.distinguished_name.push(DnType::CommonName, "receiver");
    let leaf_cert = leaf.signed_by(&server_key, &issuer).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf_cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(server_key.serialize_der().into()),
        )
        .unwrap();
    TestPki { ca_pem: ca_cert.pem(), server }
}

/// What an https receiver saw on one connection.
#[derive(Debug)]
enum Seen {
    /// The TLS handshake failed (the client refused the certificate), with the server's side of the error.
    Refused(String),
    /// A request: its X-Trainyard-Signature and its body.
    Request(String, String),
}

/// An https receiver on 127.0.0.1 answering 200 to every request; what each connection brought is sent on.
fn https_receiver(config: rustls::ServerConfig) -> (u16, std::sync::mpsc::Receiver<Seen>) {
    use std::io::{BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let config = std::sync::Arc::new(config);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let mut tcp = stream.unwrap();
            let mut conn = rustls::ServerConnection::new(config.clone()).unwrap();
            let handshake = conn.complete_io(&mut tcp);
            if let Err(e) = handshake {
                let _ = tx.send(Seen::Refused(e.to_string()));
                continue;
            }
            let mut tls = rustls::StreamOwned::new(conn, tcp);
            let mut reader = BufReader::new(&mut tls);
            let (signature, body) = read_webhook(&mut reader);
            drop(reader);
            write!(tls, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
            tls.flush().unwrap();
            tls.conn.send_close_notify();
            let _ = tls.conn.complete_io(&mut tls.sock);
            let _ = tx.send(Seen::Request(signature, body));
        }
    });
    (port, rx)
}

/// A real https receiver whose certificate comes from a private CA: without that CA the delivery fails with
/// the certificate problem in the delivery log and nothing reaches the receiver; the retry, sent by a server
/// that trusts the CA (`--webhook-ca`), arrives signed.
#[tokio::test]
async fn https_alarms_verify_the_receiver_certificate_against_the_configured_ca() {
    use trainyard_control::alarms::{Webhooks, deliver_due_with, signature};
    let pki = test_pki();
    let (port, seen) = https_receiver(pki.server);
    let backend = FakeBackend::new(Script { run_ms: 1_000, ..Script::default() });
    let (mut c, _) = control(backend).await;
    let alarms = format!(
        "  advanced:\n    alarms:\n      - {{events: [succeeded], webhook: \"https://127.0.0.1:{port}/hook\"}}\n"
    );
    let id = submit(&c, &task("tls", "nlp", "Reserved", 0, &alarms), 0).await;
    for now in [0, 1, 1_001] {
        c.tick(now).await.unwrap();
    }
    assert_eq!(status(&c, &id).await.0, "Succeeded");
    let key = b"test-signing-key";
    let recv =
        || seen.recv_timeout(std::time::Duration::from_secs(60)).expect("the receiver saw a connection");

    // The system's trust alone: the private CA is not in it.
    let system_only = loopback_allowed(Webhooks::new(None).unwrap());
    assert_eq!(deliver_due_with(c.store(), &system_only, key, 1_001).await.unwrap(), 1);
    let log = c.store().task_alarms(&id).await.unwrap();
    assert_eq!((log[0].state.as_str(), log[0].tries, log[0].next_at_ms), ("pending", 1, 2_001), "{log:?}");
    assert!(
        log[0].last_error.contains("certificate was refused") && log[0].last_error.contains("UnknownIssuer"),
        "{}",
        log[0].last_error
    );
    match recv() {
        // The client hangs up mid-handshake (ureq does not send rustls' alert): no request gets through.
        Seen::Refused(_) => {}
        other => panic!("the receiver got a request without a verified certificate: {other:?}"),
    }

    // With the CA given: the retry (not before its backoff) is delivered.
    let dir = std::env::temp_dir().join(format!("trainyard-webhook-ca-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, &pki.ca_pem).unwrap();
    let with_ca = loopback_allowed(Webhooks::new(Some(&ca_file)).unwrap());
    assert!(with_ca.trust().contains("ca.pem (1 CA)"), "{}", with_ca.trust());
    assert_eq!(deliver_due_with(c.store(), &with_ca, key, 1_500).await.unwrap(), 0);
    assert_eq!(deliver_due_with(c.store(), &with_ca, key, 2_001).await.unwrap(), 1);
    let log = c.store().task_alarms(&id).await.unwrap();
    assert_eq!((log[0].state.as_str(), log[0].tries, log[0].last_error.as_str()), ("delivered", 2, ""));
    match recv() {
        Seen::Request(sig, body) => {
            assert_eq!(sig, signature(key, body.as_bytes()), "signed with the key");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(
                (v["event"].as_str(), v["task"]["id"].as_str()),
                (Some("succeeded"), Some(id.as_str()))
            );
        }
        Seen::Refused(e) => panic!("the handshake failed with the CA configured: {e}"),
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn task_env_is_added_under_names_the_task_does_not_set() {
    use trainyard_store::TaskEnvVar;
    let backend = FakeBackend::default();
    let (mut c, _) = control(backend.clone()).await;
    let secrets = SecretBox::new([1; 32]);
    let binding = trainyard_control::secrets::Binding::TaskEnv { user: "alice", name: "TOKEN" };
    let sealed = secrets.seal_value("tok-9", &binding).unwrap();
    c.store()
        .put_task_env("alice", &TaskEnvVar { name: "LR".into(), value: "from-env".into(), hidden: false })
        .await
        .unwrap();
    c.store()
        .put_task_env("alice", &TaskEnvVar { name: "TOKEN".into(), value: sealed, hidden: true })
        .await
        .unwrap();
    let body = task("te", "nlp", "Reserved", 0, "")
        .replace("cmd: python3 train.py}", "cmd: python3 train.py, env: [{name: LR, value: from-task}]}");
    submit(&c, &body, 0).await;
    c.tick(0).await.unwrap();
    let env = &backend.launched()[0].task.spec.environment.env;
    let pairs: Vec<(&str, &str)> = env.iter().map(|e| (e.name.as_str(), e.value.as_str())).collect();
    assert_eq!(
        pairs,
        [("LR", "from-task"), ("TOKEN", "tok-9")],
        "the task's own value wins; hidden ones are opened"
    );
}

/// A queue that nothing moves costs no scheduling cycle: the last plan (places and reasons) stands until a
/// task changes or arrives, or the clock reaches a starvation threshold; then the plan is made again.
#[tokio::test]
async fn an_unchanged_queue_is_not_planned_again() {
    let backend = FakeBackend::new(Script { run_ms: 100_000_000, stop_ms: 1_000, ..Script::default() });
    let (mut c, _) = control(backend.clone()).await;
    let running = submit(&c, &task("long", "nlp", "Reserved", 3, ""), 0).await;
    let mut queued = Vec::new();
    for i in 1..=3 {
        queued.push(submit(&c, &task("later", "nlp", "Reserved", 0, ""), i).await);
    }
    for now in 0..5 {
        c.tick(now).await.unwrap();
    }
    assert_eq!(status(&c, &running).await.0, "Running");

    let r = c.tick(10).await.unwrap();
    assert!(!r.planned, "nothing changed: {r:?}");
    assert_eq!(r.waiting, 3, "the last plan's waiting tasks are still reported");
    assert_eq!(c.queue_info(&queued[2]).unwrap().position, 3);

    // An arrival is news; then quiet again.
    let fourth = submit(&c, &task("later", "nlp", "Reserved", 0, ""), 11).await;
    assert!(c.tick(12).await.unwrap().planned);
    assert_eq!(c.queue_info(&fourth).unwrap().position, 4);
    assert!(!c.tick(13).await.unwrap().planned);

    // The clock alone: the first queued task reaches the starvation threshold.
    let starving_at = 1 + i64::try_from(Config::default().starvation_after_ms).unwrap();
    assert!(!c.tick(starving_at - 1).await.unwrap().planned);
    assert!(c.tick(starving_at).await.unwrap().planned);

    // A stop frees the quota (4 units): the four one-unit tasks run once the running one is gone.
    c.stop(&running, false, starving_at + 1).await.unwrap();
    queued.push(fourth);
    let mut now = starving_at + 2;
    for id in &queued {
        while status(&c, id).await.0 != "Running" {
            c.tick(now).await.unwrap();
            now += 500;
            assert!(now < starving_at + 60_000, "{id} never ran");
        }
        assert!(c.queue_info(id).is_none(), "{id} runs and has no place in the queue");
    }
}

/// Nodes a task's next attempts leave out (node replacement) are kept in the store: a restarted loop reads
/// them back and still leaves them out. Each task avoids a different node, so where each lands shows it.
#[tokio::test]
async fn avoided_nodes_are_still_avoided_after_a_restart() {
    let one = "nodes: {node-0: {pool: default, vcpus: 8, memoryMib: 16384}}";
    assert!(CATALOG.contains(one));
    let two = CATALOG.replace(
        one,
        "nodes: {node-0: {pool: default, vcpus: 8, memoryMib: 16384}, node-1: {pool: default, vcpus: 8, memoryMib: 16384}}",
    );
    let backend = FakeBackend::new(Script { run_ms: 1_000_000, ..Script::default() });
    let (c, url) = control(backend.clone()).await;
    let a = submit(&c, &task("avoids0", "nlp", "Reserved", 0, ""), 0).await;
    let b = submit(&c, &task("avoids1", "nlp", "Reserved", 0, ""), 1).await;
    // As a NodeSuspect of an earlier attempt records it.
    c.store().avoid_node(&a, "node-0", 1).await.unwrap();
    c.store().avoid_node(&b, "node-1", 1).await.unwrap();
    drop(c);

    let store = Store::connect(&url).await.unwrap();
    let mut c = Control::new(
        store.clone(),
        backend.clone(),
        Catalog::from_yaml(&two).unwrap(),
        Config::default(),
        SecretBox::new([1; 32]),
    );
    c.tick(2).await.unwrap();
    c.tick(3).await.unwrap();
    for (id, avoided, other) in [(&a, "node-0", "node-1"), (&b, "node-1", "node-0")] {
        let t = store.get_task(id).await.unwrap().unwrap();
        assert_eq!(t.status.as_str(), "Running");
        assert!(t.placement.contains(other) && !t.placement.contains(avoided), "{id}: {}", t.placement);
    }
}

/// Reads one webhook request from a test receiver's connection: its signature header and its body.
fn read_webhook(reader: &mut impl std::io::BufRead) -> (String, String) {
    let (mut length, mut signature) = (0usize, String::new());
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
        if lower.starts_with("x-trainyard-signature:") {
            signature = line.split_once(':').unwrap().1.trim().to_owned();
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    (signature, String::from_utf8(body).unwrap())
}

/// A value in the format of earlier versions (`sealed:v1:`, no binding), as they stored it.
fn legacy_sealed(key: [u8; 32], value: &str) -> String {
    use chacha20poly1305::aead::{Aead, KeyInit};
    let cipher = chacha20poly1305::ChaCha20Poly1305::new(chacha20poly1305::Key::from_slice(&key));
    let nonce = [9u8; 12];
    let ct = cipher.encrypt(chacha20poly1305::Nonce::from_slice(&nonce), value.as_bytes()).unwrap();
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!("sealed:v1:{}{}", hex(&nonce), hex(&ct))
}

/// A database from before bindings: hidden values sealed as `v1` are re-sealed in place once, bound to their
/// records, and still reach the backend; a plain TaskEnv value that looks sealed stays plain; the second run
/// finds nothing to do; an unbound `v1` value put in later is never opened.
#[tokio::test]
async fn values_sealed_by_an_earlier_version_are_resealed_once_and_bound() {
    use trainyard_control::secrets::{SecretBox, reseal_legacy};
    use trainyard_store::TaskEnvVar;
    let backend = FakeBackend::default();
    let (mut c, _) = control(backend.clone()).await;
    let key = [1; 32];
    let secrets = SecretBox::new(key);
    let old_task = legacy_sealed(key, "task-secret");
    let old_env = legacy_sealed(key, "env-secret");
    let body = task("old", "nlp", "Reserved", 0, "").replace(
        "cmd: python3 train.py}",
        "cmd: python3 train.py, env: [{name: TOKEN, value: placeholder, hidden: true}]}",
    );
    let id = submit(&c, &body, 0).await;
    let mut v: serde_json::Value =
        serde_json::from_str(&c.store().get_task(&id).await.unwrap().unwrap().spec_json).unwrap();
    v["spec"]["environment"]["env"][0]["value"] = serde_json::Value::String(old_task.clone());
    c.store().replace_spec(&id, &v.to_string()).await.unwrap();
    let put = |name: &str, value: &str, hidden| TaskEnvVar { name: name.into(), value: value.into(), hidden };
    c.store().put_task_env("alice", &put("OLD_HIDDEN", &old_env, true)).await.unwrap();
    c.store().put_task_env("alice", &put("LOOKS_SEALED", &old_env, false)).await.unwrap();

    let done = reseal_legacy(c.store(), &secrets, 0).await.unwrap();
    assert_eq!((done.tasks, done.task_env), (1, 1), "{done:?}");
    let stored = c.store().get_task(&id).await.unwrap().unwrap().spec_json;
    assert!(!stored.contains("sealed:v1:") && stored.contains("sealed:v2:"), "{stored}");
    let env = c.store().task_env("alice").await.unwrap();
    assert_eq!(env.iter().find(|v| v.name == "LOOKS_SEALED").unwrap().value, old_env, "plain stays plain");
    assert!(env.iter().find(|v| v.name == "OLD_HIDDEN").unwrap().value.starts_with("sealed:v2:"));
    assert_eq!(reseal_legacy(c.store(), &secrets, 1).await.unwrap(), Default::default(), "once");

    c.tick(0).await.unwrap();
    let launched = backend.launched();
    let env = &launched[0].task.spec.environment.env;
    let pairs: Vec<(&str, &str)> = env.iter().map(|e| (e.name.as_str(), e.value.as_str())).collect();
    assert_eq!(
        pairs,
        [("TOKEN", "task-secret"), ("LOOKS_SEALED", old_env.as_str()), ("OLD_HIDDEN", "env-secret")]
    );

    // After the migration, an unbound value planted as hidden is refused, not opened.
    c.store().put_task_env("alice", &put("PLANTED", &old_env, true)).await.unwrap();
    submit(&c, &task("later", "nlp", "Reserved", 0, ""), 10).await;
    c.tick(10).await.unwrap();
    assert_eq!(backend.launched().len(), 1, "nothing launched with a value that does not open");
}

/// The receivers of these tests listen on loopback: allowed explicitly, as an admin would.
fn loopback_allowed(w: trainyard_control::alarms::Webhooks) -> trainyard_control::alarms::Webhooks {
    w.allowing(vec![trainyard_control::alarms::Net::parse("127.0.0.0/8").unwrap()])
}

/// Finding 15: without an allowance, a webhook to loopback is never sent, whether the URL names the address or
/// a name that resolves to it at delivery (DNS rebinding: the name was checked, or looked public, when the
/// subscription was made). The delivery log says why; the receiver gets nothing. Allowed, it is delivered.
#[tokio::test]
async fn webhooks_to_loopback_are_refused_unless_the_network_is_allowed() {
    use trainyard_control::alarms::{Webhooks, deliver_due_with};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = hits.clone();
    std::thread::spawn(move || {
        use std::io::{BufReader, Write};
        for stream in listener.incoming() {
            let mut stream = stream.unwrap();
            read_webhook(&mut BufReader::new(stream.try_clone().unwrap()));
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = write!(stream, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    let backend = FakeBackend::new(Script { run_ms: 1_000, ..Script::default() });
    let (mut c, _) = control(backend).await;
    let mut ids = Vec::new();
    for host in ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]"] {
        let alarms = format!(
            "  advanced:\n    alarms:\n      - {{events: [succeeded], webhook: \"http://{host}:{port}/hook\"}}\n"
        );
        ids.push(submit(&c, &task("ssrf", "nlp", "Reserved", 0, &alarms), 0).await);
    }
    for now in [0, 1, 1_001] {
        c.tick(now).await.unwrap();
    }
    let key = b"k";
    let system = Webhooks::system();
    assert!(system.policy().allowed_nets.is_empty());
    assert_eq!(deliver_due_with(c.store(), &system, key, 2_000).await.unwrap(), 3);
    for id in &ids {
        let log = c.store().task_alarms(id).await.unwrap();
        assert_eq!(log[0].state, "pending", "{log:?}");
        assert!(
            log[0].last_error.contains("loopback address")
                && log[0].last_error.contains("--webhook-allow-net"),
            "{log:?}"
        );
    }
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 0, "nothing reached the receiver");
    // The legitimate path: the admin allowed loopback; every one is delivered at its retry.
    let allowed = loopback_allowed(Webhooks::system());
    assert_eq!(deliver_due_with(c.store(), &allowed, key, 100_000).await.unwrap(), 3);
    for id in &ids {
        assert_eq!(c.store().task_alarms(id).await.unwrap()[0].state, "delivered");
    }
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 3);
}

/// Issue 29, finding 6: an admin disables a user. By default their running task is stopped (through
/// Stopping, the checkpoint window) and their queued one held: it is not admitted when room frees up, and
/// says why; enabling the account releases it. A task of someone else is untouched.
#[tokio::test]
async fn a_disabled_owners_queued_work_is_held_and_running_work_stopped() {
    use trainyard_control::{AccountChange, QueuedWork, RunningWork, WorkChoice};
    let backend = FakeBackend::new(Script { run_ms: 100_000, stop_ms: 2_000, ..Script::default() });
    let (mut c, _) = control(backend.clone()).await;
    for name in ["alice", "bob"] {
        let u =
            trainyard_store::User { name: name.into(), role: "member".into(), groups: vec!["nlp".into()] };
        c.store().put_user(&u, 0).await.unwrap();
    }
    // 4 units of quota: bob's task takes 3, alice's running one 1, and alice's second waits.
    let bobs = c.submit("bob", task("bobs", "nlp", "Reserved", 2, "").as_bytes(), None, 0).await.unwrap();
    let bobs = bobs.task().id.clone();
    let running = submit(&c, &task("mine", "nlp", "Reserved", 0, ""), 1).await;
    let queued = submit(&c, &task("later", "nlp", "Reserved", 0, ""), 2).await;
    c.tick(10).await.unwrap();
    c.tick(11).await.unwrap();
    assert_eq!(status(&c, &running).await.0, "Running");
    assert!(c.queue_info(&queued).unwrap().reason.contains("group nlp has 0 left"));

    let outcome = c.change_account("alice", AccountChange::Disable(WorkChoice::default()), 20).await.unwrap();
    assert_eq!((outcome.stopped, outcome.held), (vec![running.clone()], vec![queued.clone()]));
    assert_eq!(status(&c, &running).await.0, "Stopping");
    let mut now = 21;
    while status(&c, &running).await.0 != "Stopped" {
        c.tick(now).await.unwrap();
        now += 500;
        assert!(now < 10_000, "the stop never ended");
    }
    // The unit alice's running task held is free now; her queued task still waits, held.
    for _ in 0..4 {
        c.tick(now).await.unwrap();
        now += 500;
    }
    assert_eq!(status(&c, &queued).await.0, "Queued", "admitted while its owner is disabled");
    let info = c.queue_info(&queued).unwrap();
    assert!(info.reason.contains("owner's account is disabled"), "{info:?}");
    assert_eq!(info.position, 0, "a held task is in no place in line");
    assert_eq!(status(&c, &bobs).await.0, "Running", "nobody else is touched");

    let outcome = c.change_account("alice", AccountChange::Enable, now).await.unwrap();
    assert!(outcome.stopped.is_empty() && outcome.held.is_empty());
    while status(&c, &queued).await.0 == "Queued" {
        c.tick(now).await.unwrap();
        now += 500;
        assert!(now < 30_000, "never admitted after the enable");
    }

    // Stop everything: the running one and a queued one. A deleted user is refused afterwards.
    let second = submit(&c, &task("again", "nlp", "Reserved", 0, ""), now).await;
    c.tick(now).await.unwrap();
    let all = WorkChoice { queued: QueuedWork::Stop, running: RunningWork::Stop };
    let outcome = c.change_account("alice", AccountChange::Delete(all), now + 1).await.unwrap();
    assert_eq!(outcome.stopped, vec![queued.clone(), second.clone()]);
    assert_eq!(status(&c, &second).await.0, "Stopped");
    assert_eq!(status(&c, &queued).await.0, "Stopping");
    let again = c.change_account("alice", AccountChange::Enable, now + 2).await;
    assert!(matches!(again, Err(trainyard_control::CommandError::UserDeleted(_))), "{again:?}");
    let ghost = c.change_account("ghost", AccountChange::Enable, now + 2).await;
    assert!(matches!(ghost, Err(trainyard_control::CommandError::NoSuchUser(_))), "{ghost:?}");
}

#[tokio::test]
async fn reports_the_store_could_not_take_are_written_by_the_next_tick_in_order() {
    // The backend says each thing once. A tick whose writes the store refuses (here: the term ended, so the
    // fenced store writes nothing; a database restart does the same) keeps what it was told, and the next
    // tick writes it: the start, then the end, never the end alone.
    let backend = FakeBackend::new(Script { start_ms: 1_000, run_ms: 1_000, ..Script::default() });
    let (mut c, _) = control(backend.clone()).await;
    let lease = c.store().claim_lease("one", 60_000).await.unwrap().expect("a free lease");
    let fence = trainyard_store::Fence::default();
    let far = std::time::Instant::now() + std::time::Duration::from_secs(3600);
    fence.set(lease.token, far);
    c.elected_by(fence.clone());
    c.lead();
    let id = submit(&c, &task("kept", "nlp", "Reserved", 0, ""), 0).await;
    for now in [1, 100, 200] {
        c.tick(now).await.unwrap();
    }
    assert_eq!(status(&c, &id).await, ("Starting".into(), 0));
    // The term ends by this process's clock: the start and, a second later, the end are polled, and refused.
    fence.clear();
    for now in [2_500, 4_000] {
        let refused = c.tick(now).await.expect_err("a fenced store writes nothing once the term ended");
        assert!(refused.to_string().contains("no longer leads"), "{refused}");
        assert_eq!(status(&c, &id).await, ("Starting".into(), 0));
    }
    // The term is held again: the next tick writes both, in order.
    fence.set(lease.token, far);
    c.tick(4_100).await.unwrap();
    assert_eq!(status(&c, &id).await, ("Succeeded".into(), 0), "{:?}", reasons(&c, &id).await);
    let seen = reasons(&c, &id).await;
    assert_eq!(seen, ["Submitted", "Admitted", "Admitted", "Started", "Completed"]);
}
