//! The demand calculator against the reference page's arithmetic, case by case.

use trainyard_core::catalog::{InstanceKind, InstanceSpec};
use trainyard_core::demand::{DemandError, Resources, Role, demand, demand_options};
use trainyard_core::spec::{InstanceSpecChoice, RayHead, RaySettings, TaskSpec, TaskType};

fn specs(name: &str) -> Option<&'static InstanceSpec> {
    static SPECS: std::sync::LazyLock<[InstanceSpec; 2]> = std::sync::LazyLock::new(|| {
        [
            InstanceSpec {
                kind: InstanceKind::Gpu,
                gpus: 1,
                vcpus: 12,
                memory_mib: 100 * 1024,
                ..Default::default()
            },
            InstanceSpec { kind: InstanceKind::Cpu, vcpus: 16, memory_mib: 64 * 1024, ..Default::default() },
        ]
    });
    match name {
        "a100" => Some(&SPECS[0]),
        "cpu" => Some(&SPECS[1]),
        _ => None,
    }
}

fn task(kind: TaskType, workers: u32, choices: &[(&str, u32)], head: Option<(&str, u32)>) -> TaskSpec {
    let choice = |(s, n): (&str, u32)| InstanceSpecChoice { spec: s.into(), count_per_node: n };
    let mut t = TaskSpec { task_type: kind, ..Default::default() };
    t.compute.workers = workers;
    t.compute.instance_specs = choices.iter().copied().map(choice).collect();
    if kind == TaskType::RayJob {
        t.ray = Some(RaySettings { head: RayHead { instance_spec: head.map(choice) }, ..Default::default() });
    }
    t
}

fn res(gpus: u64, vcpus: u64, memory_gib: u64) -> Resources {
    Resources { gpus, vcpus, memory_mib: memory_gib * 1024 }
}

#[test]
fn pytorch_job_follows_the_reference_arithmetic() {
    // Total replicas = 1 + workers; units = replicas × countPerNode; GPUs = units × GPUs per spec.
    let cases: &[(u32, u32, u32, u64, Resources)] = &[
        // workers, countPerNode, replicas, units, total
        (0, 1, 1, 1, res(1, 12, 100)),
        (0, 8, 1, 8, res(8, 96, 800)),
        (3, 8, 4, 32, res(32, 384, 3200)),
        (1, 4, 2, 8, res(8, 96, 800)),
        (4095, 8, 4096, 32768, res(32768, 393216, 3276800)),
    ];
    for &(workers, count, replicas, units, total) in cases {
        let d = demand(&task(TaskType::PyTorchJob, workers, &[("a100", count)], None), 0, &specs).unwrap();
        assert_eq!(d.replicas, replicas, "workers {workers}");
        assert_eq!(d.total, total, "workers {workers} count {count}");
        assert_eq!(d.quota.len(), 1);
        assert_eq!(d.quota[0].units, units);
        assert_eq!(d.roles[0].role, Role::Master);
        assert_eq!(d.roles[0].replicas, 1);
        assert_eq!(
            d.roles[0].per_replica,
            res(u64::from(count), 12 * u64::from(count), 100 * u64::from(count))
        );
        assert_eq!(d.roles.len(), if workers == 0 { 1 } else { 2 });
    }
}

#[test]
fn every_option_in_priority_order() {
    let t = task(TaskType::PyTorchJob, 1, &[("a100", 2), ("cpu", 1)], None);
    let all = demand_options(&t, &specs).unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!((all[0].option, all[0].total), (0, res(4, 48, 400)));
    assert_eq!((all[1].option, all[1].total), (1, res(0, 32, 128)));
}

#[test]
fn ray_job_head_and_workers_apart_with_quota_per_spec() {
    // Head defaults to the workers' spec: quota is checked together for that spec.
    let d = demand(&task(TaskType::RayJob, 2, &[("a100", 2)], None), 0, &specs).unwrap();
    assert_eq!(
        d.roles.iter().map(|r| (r.role, r.replicas, r.units)).collect::<Vec<_>>(),
        [(Role::Head, 1, 2), (Role::Worker, 2, 4)]
    );
    assert_eq!(d.quota.len(), 1);
    assert_eq!((d.quota[0].spec.as_str(), d.quota[0].units), ("a100", 6));
    assert_eq!(d.total, res(6, 72, 600));

    // A head of its own spec: quota apart for each spec.
    let d = demand(&task(TaskType::RayJob, 3, &[("a100", 1)], Some(("cpu", 1))), 0, &specs).unwrap();
    assert_eq!(d.replicas, 4);
    let quota: Vec<(&str, u64)> = d.quota.iter().map(|q| (q.spec.as_str(), q.units)).collect();
    assert_eq!(quota, [("a100", 3), ("cpu", 1)]);
    assert_eq!(d.roles[0].per_replica, res(0, 16, 64));
    assert_eq!(d.total, res(3, 36 + 16, 300 + 64));

    // A Ray cluster of only a head.
    let d = demand(&task(TaskType::RayJob, 0, &[("a100", 1)], None), 0, &specs).unwrap();
    assert_eq!((d.replicas, d.roles.len()), (1, 1));
}

#[test]
fn refuses_what_it_cannot_compute() {
    let t = task(TaskType::PyTorchJob, 1, &[("nope", 1)], None);
    assert_eq!(demand(&t, 0, &specs), Err(DemandError::UnknownSpec("nope".into())));
    assert_eq!(demand(&t, 1, &specs), Err(DemandError::NoSuchOption(1)));
}
