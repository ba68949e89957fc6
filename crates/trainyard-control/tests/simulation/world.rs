//! The simulated world: a small catalog (two pools, six nodes, three project groups with Reserved, Idle, Spot
//! and Ondemand quotas), task documents drawn from a seed, and the fake backend's scripts for their attempts.

use trainyard_core::lifecycle::Reason;
use trainyard_runtime::fake::Script;
use trainyard_sim::rng::Rng;

/// GPU capacity 12 units (three nodes of 4), 10 of them reserved, so Ondemand has 2 and Idle what the
/// owners leave; the CPU pool has 32 vCPUs, 26 of them reserved by cpu.small or cpu.large quotas.
pub const CATALOG: &str = r#"
regions: {r1: {}}
clusters: {c1: {region: r1}}
pools:
  cpu: {cluster: c1, instanceSpecs: [cpu.small, cpu.large]}
  gpu: {cluster: c1, instanceSpecs: [gpu.a100.1, cpu.large]}
instanceSpecs:
  cpu.small: {kind: CPU, vcpus: 2, memoryMib: 4096}
  cpu.large: {kind: CPU, vcpus: 8, memoryMib: 16384}
  gpu.a100.1: {kind: GPU, gpuModel: A100, gpus: 1, vcpus: 8, memoryMib: 65536}
nodes:
  cpu-0: {pool: cpu, vcpus: 16, memoryMib: 65536}
  cpu-1: {pool: cpu, vcpus: 16, memoryMib: 65536}
  gpu-0: {pool: gpu, gpuModel: A100, gpus: 4, vcpus: 32, memoryMib: 524288}
  gpu-1: {pool: gpu, gpuModel: A100, gpus: 4, vcpus: 32, memoryMib: 524288}
  gpu-2: {pool: gpu, gpuModel: A100, gpus: 4, vcpus: 32, memoryMib: 524288}
  head-0: {pool: gpu, vcpus: 32, memoryMib: 131072}
projectGroups: {nlp: {}, vision: {}, infra: {}}
images: {host: {torch: true, ray: true}}
quotas:
  - {group: nlp, resourceType: Reserved, pool: gpu, spec: gpu.a100.1, units: 5}
  - {group: vision, resourceType: Reserved, pool: gpu, spec: gpu.a100.1, units: 3}
  - {group: infra, resourceType: Reserved, pool: gpu, spec: gpu.a100.1, units: 2}
  - {group: nlp, resourceType: Reserved, pool: gpu, spec: cpu.large, units: 2}
  - {group: vision, resourceType: Reserved, pool: gpu, spec: cpu.large, units: 1}
  - {group: nlp, resourceType: Idle, pool: gpu, spec: gpu.a100.1, units: 3}
  - {group: infra, resourceType: Spot, pool: gpu, spec: gpu.a100.1, units: 4}
  - {group: infra, resourceType: Ondemand, pool: gpu, spec: cpu.large, units: 2}
  - {group: nlp, resourceType: Reserved, pool: cpu, spec: cpu.small, units: 4}
  - {group: vision, resourceType: Reserved, pool: cpu, spec: cpu.small, units: 3}
  - {group: infra, resourceType: Reserved, pool: cpu, spec: cpu.small, units: 2}
  - {group: vision, resourceType: Reserved, pool: cpu, spec: cpu.large, units: 1}
  - {group: infra, resourceType: Ondemand, pool: cpu, spec: cpu.large, units: 1}
"#;

pub const GROUPS: &[&str] = &["nlp", "vision", "infra"];
pub const NODES: &[&str] = &["cpu-0", "cpu-1", "gpu-0", "gpu-1", "gpu-2", "head-0"];
const RESOURCE_TYPES: &[&str] = &["Reserved", "Reserved", "Reserved", "Ondemand", "Spot", "Idle"];

/// One task document and what it was drawn as (for the log).
pub struct Drawn {
    pub body: String,
    pub summary: String,
    pub pool: &'static str,
    /// Automatic resubmissions allowed (`faultTolerance.maxResubmissions`; none without the block).
    pub budget: i64,
}

/// A task: PyTorchJob or RayJob, in either pool, of any resource type, priority and size; a few are too large
/// to ever fit (more replicas than the pool holds; validation refuses those, and tasks over their group's quota,
/// at submission), and `storm` ones are high-priority Reserved work.
pub fn task(rng: &mut Rng, storm_group: Option<&str>) -> Drawn {
    let group = storm_group.unwrap_or_else(|| *rng.pick(GROUPS));
    let ray = rng.chance(0.3);
    let gpu = rng.chance(0.6);
    let rtype = if storm_group.is_some() { "Reserved" } else { *rng.pick(RESOURCE_TYPES) };
    let priority = if storm_group.is_some() { 10 } else { rng.range(1, 9) };
    // About one task in twelve asks for more replicas than its pool has nodes and room for: it waits forever.
    let workers = if rng.chance(0.08) {
        rng.range(40, 60)
    } else if rng.chance(0.2) {
        3
    } else {
        rng.range(0, 2)
    };
    let per_node = if rng.chance(0.25) { 2 } else { 1 };
    let (pool, options) = if gpu {
        let mut o = format!("[{{spec: gpu.a100.1, countPerNode: {per_node}}}");
        if rng.chance(0.3) {
            o.push_str(", {spec: cpu.large, countPerNode: 1}");
        }
        ("gpu", o + "]")
    } else {
        let first = if rng.chance(0.7) { "cpu.small" } else { "cpu.large" };
        let mut o = format!("[{{spec: {first}, countPerNode: {per_node}}}");
        if first == "cpu.small" && rng.chance(0.3) {
            o.push_str(", {spec: cpu.large, countPerNode: 1}");
        }
        ("cpu", o + "]")
    };
    let mut compute = format!(
        "    resourceType: {rtype}\n    pool: {pool}\n    workers: {workers}\n    priority: {priority}\n    instanceSpecs: {options}\n"
    );
    if rtype == "Reserved" && rng.chance(0.2) {
        compute.push_str("    idleSupplement: true\n");
    }
    let mut advanced = String::new();
    let mut budget = 0;
    if rng.chance(0.5) {
        budget = rng.range(0, 2);
        advanced.push_str(&format!("    faultTolerance: {{maxResubmissions: {budget}}}\n"));
    }
    // The precheck is PyTorchJob's only.
    if !ray && rng.chance(0.2) {
        advanced.push_str("    precheck: {enabled: true}\n");
    }
    if !advanced.is_empty() {
        advanced = format!("  advanced:\n{advanced}");
    }
    let (kind, ray_part) = if ray {
        let head = if pool == "gpu" { "cpu.large" } else { "cpu.small" };
        ("RayJob", format!("  ray:\n    head:\n      instanceSpec: {{spec: {head}, countPerNode: 1}}\n"))
    } else {
        ("PyTorchJob", String::new())
    };
    let body = format!(
        "apiVersion: trainyard.dev/v1\nkind: TrainingTask\nmetadata: {{namePrefix: sim, projectGroup: {group}}}\n\
         spec:\n  type: {kind}\n  placement: {{region: r1, cluster: c1}}\n  environment: {{image: host, cmd: python3 train.py}}\n  compute:\n{compute}{advanced}{ray_part}"
    );
    let summary = format!("{kind} {group} {rtype} {pool} p{priority} w{workers} {options}");
    Drawn { body, summary, pool, budget: budget as i64 }
}

/// How a task's first attempts behave (later ones use the backend's default): most succeed, some fail as
/// the user's fault, some as the infrastructure's (retried within the task's budget).
pub fn scripts(rng: &mut Rng) -> Vec<Script> {
    const OUTCOMES: &[Reason] = &[
        Reason::Completed,
        Reason::Completed,
        Reason::Completed,
        Reason::Completed,
        Reason::Completed,
        Reason::UserError,
        Reason::OutOfMemory,
        Reason::NodeFailed,
        Reason::NodeFailed,
        Reason::ImagePullFailed,
        Reason::PrecheckFailed,
    ];
    (0..rng.range(1, 3))
        .map(|_| Script {
            start_ms: rng.range(0, 4_000),
            run_ms: rng.range(1_000, 60_000),
            outcome: *rng.pick(OUTCOMES),
            stop_ms: rng.range(0, 6_000),
        })
        .collect()
}

/// Attempts past their scripts: short and successful, so a drained world ends.
pub fn default_script() -> Script {
    Script { start_ms: 500, run_ms: 10_000, outcome: Reason::Completed, stop_ms: 1_000 }
}
