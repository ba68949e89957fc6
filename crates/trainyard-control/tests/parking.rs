//! Plans that take in only arrivals, with the rest of the queue parked (see the control crate's `queue`),
//! checked against plans of the whole queue: a mixed queue (three groups, two pools, every resource type,
//! priorities, gangs too large for the room left, preemptors, starving tasks) fed a seeded stream of
//! submissions while running tasks hold most of the quota.

// Tests are the shell: they make temp dirs and time what they run.
#![allow(clippy::disallowed_methods)]

use trainyard_control::Control;
use trainyard_control::secrets::SecretBox;
use trainyard_core::Catalog;
use trainyard_core::lifecycle::Status;
use trainyard_runtime::fake::{FakeBackend, Script};
use trainyard_sched::Config;
use trainyard_sim::rng::Rng;
use trainyard_store::Store;

const CATALOG: &str = r#"
regions: {local: {}}
clusters: {local: {region: local}}
pools:
  cpu: {cluster: local, instanceSpecs: [cpu.small, cpu.large]}
  gpu: {cluster: local, instanceSpecs: [gpu.one]}
instanceSpecs:
  cpu.small: {kind: CPU, vcpus: 2, memoryMib: 4096}
  cpu.large: {kind: CPU, vcpus: 8, memoryMib: 16384}
  gpu.one: {kind: GPU, gpuModel: A100, gpus: 1, vcpus: 4, memoryMib: 8192}
nodes:
  c0: {pool: cpu, vcpus: 16, memoryMib: 32768}
  c1: {pool: cpu, vcpus: 16, memoryMib: 32768}
  c2: {pool: cpu, vcpus: 8, memoryMib: 16384}
  g0: {pool: gpu, gpuModel: A100, gpus: 4, vcpus: 16, memoryMib: 32768}
  g1: {pool: gpu, gpuModel: A100, gpus: 4, vcpus: 16, memoryMib: 32768}
projectGroups: {nlp: {}, vision: {}, speech: {}}
images: {host: {torch: true, ray: true}}
quotas:
  - {group: nlp, resourceType: Reserved, pool: cpu, spec: cpu.small, units: 6}
  - {group: nlp, resourceType: Reserved, pool: cpu, spec: cpu.large, units: 1}
  - {group: vision, resourceType: Reserved, pool: gpu, spec: gpu.one, units: 4}
  - {group: speech, resourceType: Reserved, pool: cpu, spec: cpu.small, units: 2}
  - {group: speech, resourceType: Reserved, pool: gpu, spec: gpu.one, units: 2}
  - {group: vision, resourceType: Spot, pool: cpu, spec: cpu.small, units: 4}
"#;

fn task(rng: &mut Rng) -> String {
    let group = *rng.pick(&["nlp", "vision", "speech"]);
    let rtype = *rng.pick(&["Reserved", "Reserved", "Ondemand", "Spot", "Idle"]);
    let (pool, specs) = if rng.chance(0.5) {
        (
            "cpu",
            *rng.pick(&["[{spec: cpu.small}]", "[{spec: cpu.large}, {spec: cpu.small, countPerNode: 2}]"]),
        )
    } else {
        ("gpu", *rng.pick(&["[{spec: gpu.one}]", "[{spec: gpu.one, countPerNode: 2}, {spec: gpu.one}]"]))
    };
    let workers = *rng.pick(&[0, 0, 1, 2, 5]);
    let priority = *rng.pick(&[0, 0, 0, 3, 7]);
    format!(
        r#"apiVersion: trainyard.dev/v1
kind: TrainingTask
metadata: {{namePrefix: t, projectGroup: {group}}}
spec:
  type: PyTorchJob
  placement: {{region: local, cluster: local}}
  environment: {{image: host, cmd: python3 train.py}}
  compute: {{resourceType: {rtype}, pool: {pool}, workers: {workers}, priority: {priority}, instanceSpecs: {specs}}}
"#
    )
}

async fn board(c: &Control<FakeBackend>) -> Vec<(String, Option<trainyard_control::QueueInfo>)> {
    let queued = c.store().tasks_in_status_without_spec(&[Status::Queued]).await.unwrap();
    queued.iter().map(|t| (t.name.clone(), c.queue_info(&t.id))).collect()
}

#[tokio::test]
async fn plans_of_arrivals_decide_what_plans_of_the_whole_queue_decide() {
    let dir = std::env::temp_dir().join(format!("trainyard-parking-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = Store::connect(&format!("sqlite://{}", dir.join("t.db").display())).await.unwrap();
    // Tasks run long (the queue stays deep); preempted ones take 8 s to stop, while their preemptors wait.
    let backend =
        FakeBackend::new(Script { start_ms: 500, run_ms: 60_000, stop_ms: 8_000, ..Script::default() });
    let config = Config { starvation_after_ms: 20_000, ..Config::default() };
    let mut c =
        Control::new(store, backend, Catalog::from_yaml(CATALOG).unwrap(), config, SecretBox::new([1; 32]));
    c.check_parking(true);
    let mut rng = Rng::new(7);
    let (mut now, mut checked, mut checked_boards, mut submitted) = (0i64, 0u32, 0u32, 0u32);
    for _ in 0..1_200 {
        now += rng.range(50, 1_500) as i64;
        for _ in 0..rng.below(4) {
            match c.submit("alice", task(&mut rng).as_bytes(), None, now).await {
                Ok(_) => submitted += 1,
                // A gang no placement could ever admit is refused at submission.
                Err(trainyard_control::SubmitError::Invalid(_)) => {}
                Err(e) => panic!("{e}"),
            }
        }
        let r = c.tick(now).await.unwrap();
        if !r.planned || r.whole || r.conflicts > 0 {
            continue;
        }
        let decided = r.admitted + r.preempted > 0;
        let before = board(&c).await;
        c.plan_whole_next();
        let again = c.tick(now).await.unwrap();
        assert!(again.whole);
        if again.observations > 0 || again.conflicts > 0 {
            continue;
        }
        checked += 1;
        assert_eq!(again.admitted, 0, "a whole plan after {r:?} admitted more: {again:?}");
        if !decided {
            checked_boards += 1;
            assert_eq!(again.preempted, 0, "a whole plan after {r:?} preempted: {again:?}");
            assert_eq!(
                board(&c).await,
                before,
                "the board of a plan of arrivals differs from the whole queue's"
            );
        }
    }
    let queued = c.store().tasks_in_status_without_spec(&[Status::Queued]).await.unwrap().len();
    println!(
        "{submitted} submitted, {queued} queued at the end; {checked} plans of arrivals checked, {checked_boards} boards"
    );
    assert!(queued > 50, "the queue stays deep: {queued}");
    assert!(checked >= 40 && checked_boards >= 30, "{checked} plans checked, {checked_boards} boards");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A starving gang holds the nodes closest to fitting it; a plan of arrivals must look at it again (it is
/// never parked), or a small arrival would take what it holds.
#[tokio::test]
async fn a_starving_gang_keeps_its_nodes_in_plans_of_arrivals() {
    let dir = std::env::temp_dir().join(format!("trainyard-parking-starving-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = Store::connect(&format!("sqlite://{}", dir.join("t.db").display())).await.unwrap();
    let backend = FakeBackend::new(Script { run_ms: 3_600_000, ..Script::default() });
    let config = Config { starvation_after_ms: 20_000, ..Config::default() };
    let mut c =
        Control::new(store, backend, Catalog::from_yaml(CATALOG).unwrap(), config, SecretBox::new([1; 32]));
    c.check_parking(true);
    let gpu = |workers: u32, count: u32| {
        format!(
            r#"apiVersion: trainyard.dev/v1
kind: TrainingTask
metadata: {{namePrefix: g, projectGroup: nlp}}
spec:
  type: PyTorchJob
  placement: {{region: local, cluster: local}}
  environment: {{image: host, cmd: python3 train.py}}
  compute: {{resourceType: Spot, pool: gpu, workers: {workers}, instanceSpecs: [{{spec: gpu.one, countPerNode: {count}}}]}}
"#
        )
    };
    // One GPU busy on each node; then a gang of two 3-GPU replicas: it fits only once both drain.
    let small = c.submit("alice", gpu(1, 1).as_bytes(), None, 0).await.unwrap().task().id.clone();
    c.tick(0).await.unwrap();
    let gang = c.submit("alice", gpu(1, 3).as_bytes(), None, 1_000).await.unwrap().task().id.clone();
    c.tick(1_000).await.unwrap();
    assert!(c.queue_info(&gang).is_some(), "the gang waits");
    // Past the threshold (a whole plan): the gang starves and the nodes are held for it.
    c.tick(25_000).await.unwrap();
    // An arrival that would fit beside the small task: a plan of arrivals, which must keep the hold.
    let late = c.submit("alice", gpu(0, 1).as_bytes(), None, 26_000).await.unwrap().task().id.clone();
    let r = c.tick(26_000).await.unwrap();
    assert!(r.planned && !r.whole, "{r:?}");
    let why = c.queue_info(&late).expect("the arrival waits behind the starving gang").reason;
    assert!(why.contains("holds the nodes it needs"), "{why}");
    assert_eq!(c.store().get_task(&small).await.unwrap().unwrap().status, Status::Running);
    let _ = std::fs::remove_dir_all(&dir);
}
