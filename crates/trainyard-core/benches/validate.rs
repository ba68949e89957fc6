//! How long parsing and validating a task takes: every shipped example, as YAML and as JSON, and a synthetic
//! task at the validator's limits (512 env vars, 64 mounts, 16 metrics endpoints, 16 alarms).
//!
//! Run: `cargo bench -p trainyard-core --bench validate`. Prints, per document, the median and p99 time of
//! one `check` (parse + decode + validate) and of `validate` alone, and the ratio to the 1 ms target.

// A benchmark is the shell: it reads the shipped examples and times runs.
#![allow(clippy::disallowed_methods)]

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};
use trainyard_core::parse::yaml_as_json;
use trainyard_core::{Catalog, check, validate};

const TARGET: Duration = Duration::from_millis(1);
const SAMPLES: usize = 200;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let catalog =
        Catalog::from_yaml(&std::fs::read_to_string(root.join("catalog/catalog.yaml")).unwrap()).unwrap();
    let mut docs: Vec<(String, Vec<u8>)> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    docs.sort();
    // Each also as the JSON the CLI sends for it (`yaml_as_json`), the form programs send.
    let as_json: Vec<(String, Vec<u8>)> = docs
        .iter()
        .map(|(name, bytes)| {
            let json = yaml_as_json(bytes).expect("examples convert");
            (format!("{} (json)", name.trim_end_matches(".yaml")), json)
        })
        .collect();
    let shipped = docs.len();
    docs.extend(as_json);
    docs.push(("synthetic-at-limits (yaml)".to_owned(), synthetic().into_bytes()));
    let json = check(&docs.last().unwrap().1, &catalog).task.unwrap().to_json();
    docs.push(("synthetic-at-limits (json)".to_owned(), json.into_bytes()));

    println!(
        "{:<30} {:>8} {:>12} {:>12} {:>14} {:>10}",
        "document", "bytes", "check p50", "check p99", "validate p50", "p99/target"
    );
    let mut largest = (0, Duration::ZERO, String::new());
    for (i, (name, bytes)) in docs.iter().enumerate() {
        let checked = check(bytes, &catalog);
        let task = checked.task.expect("benchmark documents decode");
        let errors = checked.report.errors().count();
        assert_eq!(errors, 0, "{name} must be valid for the benchmark: {:#?}", checked.report.problems);
        let c = measure(|| {
            black_box(check(black_box(bytes), &catalog));
        });
        let v = measure(|| {
            black_box(validate(black_box(&task), &catalog));
        });
        if i < shipped && bytes.len() > largest.0 {
            largest = (bytes.len(), c.1, name.clone());
        }
        println!(
            "{:<30} {:>8} {:>12} {:>12} {:>14} {:>10.3}",
            name,
            bytes.len(),
            fmt(c.0),
            fmt(c.1),
            fmt(v.0),
            c.1.as_secs_f64() / TARGET.as_secs_f64()
        );
    }
    println!(
        "largest example ({}, {} bytes): check p99 {}; target under {}; ratio {:.3}",
        largest.2,
        largest.0,
        fmt(largest.1),
        fmt(TARGET),
        largest.1.as_secs_f64() / TARGET.as_secs_f64()
    );
}

/// (median, p99) of one call, each sample timing a small batch to stay above timer resolution.
fn measure(mut f: impl FnMut()) -> (Duration, Duration) {
    const BATCH: u32 = 20;
    for _ in 0..BATCH * 5 {
        f();
    }
    let mut samples: Vec<Duration> = (0..SAMPLES)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..BATCH {
                f();
            }
            start.elapsed() / BATCH
        })
        .collect();
    samples.sort();
    (samples[SAMPLES / 2], samples[SAMPLES * 99 / 100])
}

fn fmt(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

/// A valid task with every list at its limit.
fn synthetic() -> String {
    let mut s = String::from(
        "apiVersion: trainyard.dev/v1\nkind: TrainingTask\nmetadata:\n  namePrefix: at-limits\n  projectGroup: nlp\n  labels: {team: nlp, experiment: limits}\nspec:\n  type: PyTorchJob\n  placement: {region: us-east, cluster: gpu-east-1}\n  environment:\n    image: pytorch-2.3-cuda12\n    env:\n",
    );
    for i in 0..512 {
        s.push_str(&format!("      - {{name: VAR_{i}, value: \"value-{i}-{}\"}}\n", "x".repeat(40)));
    }
    s.push_str("    volumes:\n");
    for i in 0..40 {
        s.push_str(&format!("      - {{volume: ckpt, mountPath: /volume/v{i}}}\n"));
    }
    s.push_str("    datasets:\n");
    for i in 0..12 {
        s.push_str(&format!("      - {{dataset: imagenet, mountPath: /mnt/d{i}}}\n"));
    }
    s.push_str("    models:\n");
    for i in 0..12 {
        s.push_str(&format!("      - {{model: llama-7b, mountPath: /mnt/m{i}}}\n"));
    }
    s.push_str(&format!("    cmd: \"{}\"\n", "torchrun train.py --flag value ".repeat(100)));
    s.push_str(
        "  compute:\n    resourceType: Reserved\n    pool: a100-pool\n    workers: 3\n    instanceSpecs:\n",
    );
    s.push_str("      - {spec: gpu.a100.1, countPerNode: 8}\n      - {spec: gpu.h100.1, countPerNode: 8}\n");
    s.push_str("  advanced:\n    precheck: {env: [{name: NCCL_DEBUG, value: INFO}], minGemmTflops: 100}\n");
    s.push_str("    faultTolerance: {maxResubmissions: 5}\n    exitCheckpoint: {timeoutSeconds: 600}\n    metrics:\n      endpoints:\n");
    for i in 0..16 {
        s.push_str(&format!("        - {{port: {}, path: /metrics/{i}}}\n", 9000 + i));
    }
    s.push_str("    alarms:\n");
    for i in 0..16 {
        s.push_str(&format!("      - {{events: [failed, succeeded, preempted], webhook: \"https://alerts.example.com/{i}\"}}\n"));
    }
    s.push_str("  pytorch: {procsPerNode: 8}\n");
    s
}
