//! One case per rule: a valid base task, one change, and exactly the problems (path, code) it must cause.
//! The message text is checked where it carries the fix a person needs.

use trainyard_core::spec::*;
use trainyard_core::{Catalog, Code, Severity, TrainingTask, check, validate};

const CATALOG: &str = include_str!("../../../examples/catalog/catalog.yaml");

const PYTORCH: &str = r#"
apiVersion: trainyard.dev/v1
kind: TrainingTask
metadata: {namePrefix: base, projectGroup: nlp, labels: {team: nlp}}
spec:
  type: PyTorchJob
  placement: {region: us-east, cluster: gpu-east-1}
  environment:
    image: pytorch-2.3-cuda12
    env: [{name: LR, value: "3e-4"}]
    volumes: [{volume: ckpt, mountPath: /volume/ckpt}]
    datasets: [{dataset: alpaca, mountPath: /mnt/data}]
    cmd: torchrun train.py
  compute:
    resourceType: Reserved
    pool: a100-pool
    workers: 1
    instanceSpecs: [{spec: gpu.a100.1, countPerNode: 8}]
"#;

const RAY: &str = r#"
apiVersion: trainyard.dev/v1
kind: TrainingTask
metadata: {namePrefix: base-ray, projectGroup: nlp}
spec:
  type: RayJob
  placement: {region: us-east, cluster: gpu-east-1}
  environment: {image: ray-2.9-py311, cmd: python main.py}
  compute:
    resourceType: Ondemand
    pool: a100-pool
    workers: 2
    instanceSpecs: [{spec: gpu.a100.1, countPerNode: 1}]
  ray: {}
"#;

fn catalog() -> Catalog {
    Catalog::from_yaml(CATALOG).unwrap()
}

fn base(text: &str) -> TrainingTask {
    let checked = check(text.as_bytes(), &catalog());
    assert!(checked.report.problems.is_empty(), "base is not clean: {:#?}", checked.report.problems);
    checked.task.unwrap()
}

/// Applies `change` to the base task and checks that validation reports exactly `expected`.
#[track_caller]
fn case(text: &str, change: impl FnOnce(&mut TrainingTask), expected: &[(&str, Code)]) -> Vec<String> {
    let mut t = base(text);
    change(&mut t);
    let report = validate(&t, &catalog());
    let got: Vec<(&str, Code)> = report.problems.iter().map(|p| (p.path.as_str(), p.code)).collect();
    assert_eq!(got, expected, "{:#?}", report.problems);
    report.problems.iter().map(|p| p.message.clone()).collect()
}

/// Like `case`, for changes made to the document text (types, structure).
#[track_caller]
fn text_case(text: &str, expected: &[(&str, Code)]) -> Vec<String> {
    let checked = check(text.as_bytes(), &catalog());
    let got: Vec<(&str, Code)> = checked.report.problems.iter().map(|p| (p.path.as_str(), p.code)).collect();
    assert_eq!(got, expected, "{:#?}", checked.report.problems);
    checked.report.problems.iter().map(|p| p.message.clone()).collect()
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar { name: name.into(), value: value.into(), hidden: false }
}

const ENV0: &str = "spec.environment.env[0].name";

#[test]
fn name_prefix() {
    let p = "metadata.namePrefix";
    for good in ["a", "llama-sft", "x1-2-3", &"a".repeat(57)] {
        case(PYTORCH, |t| t.metadata.name_prefix = good.into(), &[]);
    }
    case(PYTORCH, |t| t.metadata.name_prefix = String::new(), &[(p, Code::Empty)]);
    case(PYTORCH, |t| t.metadata.name_prefix = "a".repeat(58), &[(p, Code::TooLong)]);
    let m = case(PYTORCH, |t| t.metadata.name_prefix = "Llama".into(), &[(p, Code::InvalidName)]);
    assert!(m[0].contains("try \"llama\""), "{m:?}");
    case(PYTORCH, |t| t.metadata.name_prefix = "llama_sft".into(), &[(p, Code::InvalidName)]);
    case(PYTORCH, |t| t.metadata.name_prefix = "-llama".into(), &[(p, Code::InvalidName)]);
    case(PYTORCH, |t| t.metadata.name_prefix = "llama-".into(), &[(p, Code::InvalidName)]);
    case(PYTORCH, |t| t.metadata.name_prefix = "lläma".into(), &[(p, Code::InvalidName)]);
}

#[test]
fn env_names() {
    for good in ["A", "_", "_X1", "lower_case", "X_9"] {
        case(PYTORCH, |t| t.spec.environment.env = vec![env(good, "1")], &[]);
    }
    let bad = [
        ("LR RATE", "a space"),
        ("1ST", "starts with a digit"),
        ("A=B", "'='"),
        ("A-B", "'-'"),
        ("A\nB", "a line break"),
        ("A\tB", "a tab"),
        ("学习率", "Chinese characters"),
        ("ＬＲ", "full-width characters"),
        ("LR\u{200B}", "zero-width characters (U+200B)"),
        ("LR\u{FEFF}", "zero-width characters (U+FEFF)"),
        ("CAFÉ", "non-ASCII characters ('É')"),
        ("A\u{7}", "control characters (U+0007)"),
        ("", "is empty"),
    ];
    for (name, why) in bad {
        let m =
            case(PYTORCH, |t| t.spec.environment.env = vec![env(name, "1")], &[(ENV0, Code::InvalidName)]);
        assert!(m[0].contains(why), "{name:?}: {m:?}");
    }
    let m =
        case(PYTORCH, |t| t.spec.environment.env = vec![env("LR RATE", "1")], &[(ENV0, Code::InvalidName)]);
    assert_eq!(
        m[0], "\"LR RATE\" contains a space; use ASCII letters, digits and _ only",
        "the message a person acts on"
    );
}

#[test]
fn env_duplicates_reserved_and_values() {
    case(
        PYTORCH,
        |t| t.spec.environment.env = vec![env("A", "1"), env("B", "2"), env("A", "3")],
        &[("spec.environment.env[2].name", Code::Duplicate)],
    );
    // Names are case-sensitive, as in the shell.
    case(PYTORCH, |t| t.spec.environment.env = vec![env("a", "1"), env("A", "2")], &[]);
    // Every name the platform sets is reserved, torchrun's PET_* options and Ray's job config among them.
    for name in trainyard_core::platform_env::RESERVED.iter().copied().chain(["TRAINYARD_FOO"]) {
        case(PYTORCH, |t| t.spec.environment.env = vec![env(name, "1")], &[(ENV0, Code::ReservedName)]);
    }
    case(PYTORCH, |t| t.spec.environment.env = vec![env("A", "0")], &[]);
    case(PYTORCH, |t| t.spec.environment.env = vec![env("A", " ")], &[]);
    case(
        PYTORCH,
        |t| t.spec.environment.env = vec![env("A", "")],
        &[("spec.environment.env[0].value", Code::Empty)],
    );
    case(
        PYTORCH,
        |t| t.spec.environment.env = vec![env("A", "a\0b")],
        &[("spec.environment.env[0].value", Code::InvalidEnvValue)],
    );
    case(
        PYTORCH,
        |t| t.spec.environment.env = vec![env("A", &"x".repeat(200_000))],
        &[("spec.environment.env[0].value", Code::TooLong)],
    );
    // Precheck variables follow the same rules.
    case(
        PYTORCH,
        |t| {
            t.spec.advanced.precheck = Some(Precheck {
                enabled: true,
                env: vec![env("A B", "1")],
                timeout_seconds: 60,
                ..Default::default()
            })
        },
        &[("spec.advanced.precheck.env[0].name", Code::InvalidName)],
    );
}

#[test]
fn hidden_values_never_appear_in_messages() {
    let secret = "s3cr3t-value";
    let mut t = base(PYTORCH);
    t.spec.environment.env = vec![
        EnvVar { name: "BAD NAME".into(), value: secret.into(), hidden: true },
        EnvVar { name: "NUL".into(), value: format!("{secret}\0"), hidden: true },
    ];
    let report = validate(&t, &catalog());
    assert_eq!(report.problems.len(), 2);
    for p in &report.problems {
        assert!(!p.message.contains(secret), "{p}");
    }
    let masked = t.masked();
    assert!(masked.spec.environment.env.iter().all(|v| v.value == HIDDEN_VALUE_MASK));
    assert!(!masked.to_json().contains(secret));
}

#[test]
fn values_must_be_strings() {
    let m = text_case(
        &PYTORCH.replace(r#"value: "3e-4""#, "value: 3e-4"),
        &[("spec.environment.env[0].value", Code::WrongType)],
    );
    assert!(m[0].contains("put it in quotes"), "{m:?}");
    text_case(
        &PYTORCH.replace(r#"value: "3e-4""#, "value: 0"),
        &[("spec.environment.env[0].value", Code::WrongType)],
    );
    text_case(
        &PYTORCH.replace(r#"value: "3e-4""#, "value: true"),
        &[("spec.environment.env[0].value", Code::WrongType)],
    );
}

fn mount(path: &str) -> VolumeMount {
    VolumeMount { volume: "ckpt".into(), mount_path: path.into(), read_only: false }
}

#[test]
fn mount_paths() {
    let mp = "spec.environment.volumes[0].mountPath";
    for good in ["/volume/x", "/mnt/a/b-c_d.e", "/volume/ckpt2"] {
        case(PYTORCH, |t| t.spec.environment.volumes = vec![mount(good)], &[]);
    }
    for bad in ["rel/path", "/mnt/../etc", "/mnt/./x", "/mnt//x", "/mnt/x/", "/mnt/a:b", "/mnt/a\nb"] {
        case(PYTORCH, |t| t.spec.environment.volumes = vec![mount(bad)], &[(mp, Code::InvalidPath)]);
    }
    case(PYTORCH, |t| t.spec.environment.volumes = vec![mount("")], &[(mp, Code::Empty)]);
    for protected in [
        "/",
        "/opt",
        "/opt/x",
        "/usr",
        "/usr/local/lib",
        "/workspace",
        "/etc",
        "/proc",
        "/sys",
        "/dev",
        "/bin",
        "/lib",
    ] {
        case(PYTORCH, |t| t.spec.environment.volumes = vec![mount(protected)], &[(mp, Code::ProtectedPath)]);
    }
    for platform in ["/root", "/root/.ssh", "/root/.ssh/keys", "/root/hostfile"] {
        case(PYTORCH, |t| t.spec.environment.volumes = vec![mount(platform)], &[(mp, Code::ProtectedPath)]);
    }
    // Allowed, but outside the recommended trees: a warning, not an error.
    for unusual in ["/data", "/home/me/ckpt", "/volume", "/optional", "/tmp/ray"] {
        let got =
            case(PYTORCH, |t| t.spec.environment.volumes = vec![mount(unusual)], &[(mp, Code::UnusualPath)]);
        assert_eq!(got.len(), 1);
    }
    let mut t = base(PYTORCH);
    t.spec.environment.volumes = vec![mount("/data")];
    assert!(validate(&t, &catalog()).is_ok(), "an unusual path is only a warning");
    assert_eq!(validate(&t, &catalog()).warnings().next().unwrap().severity, Severity::Warning);
}

#[test]
fn mount_conflicts() {
    case(
        PYTORCH,
        |t| t.spec.environment.volumes = vec![mount("/volume/a"), mount("/volume/a")],
        &[("spec.environment.volumes[1].mountPath", Code::Duplicate)],
    );
    // The same volume at two paths is fine.
    case(PYTORCH, |t| t.spec.environment.volumes = vec![mount("/volume/a"), mount("/volume/b")], &[]);
    // Two different mounts at one path.
    case(
        PYTORCH,
        |t| t.spec.environment.volumes = vec![mount("/mnt/data")],
        &[("spec.environment.datasets[0].mountPath", Code::PathConflict)],
    );
    // Nested mounts: a warning on the inner one.
    let got = case(
        PYTORCH,
        |t| t.spec.environment.volumes = vec![mount("/mnt/data/out")],
        &[("spec.environment.volumes[0].mountPath", Code::PathConflict)],
    );
    assert!(got[0].contains("lies inside"));
    case(
        PYTORCH,
        |t| t.spec.environment.datasets[0].read_only = false,
        &[("spec.environment.datasets[0].readOnly", Code::ReadOnly)],
    );
    case(
        PYTORCH,
        |t| {
            t.spec.environment.models =
                vec![ModelMount { model: "llama-7b".into(), mount_path: "/mnt/m".into(), read_only: false }]
        },
        &[("spec.environment.models[0].readOnly", Code::ReadOnly)],
    );
    case(
        PYTORCH,
        |t| t.spec.environment.volumes = (0..65).map(|i| mount(&format!("/volume/v{i}"))).collect(),
        &[("spec.environment", Code::TooLong)],
    );
}

#[test]
fn catalog_references() {
    case(PYTORCH, |t| t.spec.placement.region = "mars".into(), &[("spec.placement.region", Code::NotFound)]);
    case(
        PYTORCH,
        |t| t.spec.placement.region = "local".into(),
        &[("spec.placement.cluster", Code::NotAvailable)],
    );
    case(
        PYTORCH,
        |t| t.spec.placement.cluster = "nope".into(),
        &[("spec.placement.cluster", Code::NotFound)],
    );
    case(PYTORCH, |t| t.spec.compute.pool = "default".into(), &[("spec.compute.pool", Code::NotAvailable)]);
    case(PYTORCH, |t| t.spec.compute.pool = "nope".into(), &[("spec.compute.pool", Code::NotFound)]);
    case(PYTORCH, |t| t.spec.compute.pool = String::new(), &[("spec.compute.pool", Code::Empty)]);
    case(PYTORCH, |t| t.metadata.project_group = "nope".into(), &[("metadata.projectGroup", Code::NotFound)]);
    case(
        PYTORCH,
        |t| t.spec.environment.volumes[0].volume = "nope".into(),
        &[("spec.environment.volumes[0].volume", Code::NotFound)],
    );
    case(
        PYTORCH,
        |t| t.spec.environment.datasets[0].dataset = "nope".into(),
        &[("spec.environment.datasets[0].dataset", Code::NotFound)],
    );
    case(
        PYTORCH,
        |t| {
            t.spec.environment.models =
                vec![ModelMount { model: "gpt".into(), mount_path: "/mnt/m".into(), read_only: true }]
        },
        &[("spec.environment.models[0].model", Code::NotFound)],
    );
}

#[test]
fn images() {
    let p = "spec.environment.image";
    case(PYTORCH, |t| t.spec.environment.image = "host".into(), &[]);
    case(PYTORCH, |t| t.spec.environment.image = "ghcr.io/org/train:1.2".into(), &[]);
    case(
        PYTORCH,
        |t| t.spec.environment.image = "localhost:5000/x@sha256:".to_owned() + &"a".repeat(64),
        &[],
    );
    case(PYTORCH, |t| t.spec.environment.image = String::new(), &[(p, Code::Empty)]);
    for bad in ["UPPER/case", "x::y", "x:", "reg.io/a b", "a/-b"] {
        case(PYTORCH, |t| t.spec.environment.image = bad.into(), &[(p, Code::InvalidName)]);
    }
    let mut closed = catalog();
    closed.allow_external_images = false;
    let mut t = base(PYTORCH);
    t.spec.environment.image = "ghcr.io/org/train:1.2".into();
    let r = validate(&t, &closed);
    assert_eq!(
        r.problems.iter().map(|p| (p.path.as_str(), p.code)).collect::<Vec<_>>(),
        [(p, Code::NotFound)]
    );
    // With registries listed, a reference must come from one of them (Docker Hub's short names are docker.io).
    let mut listed = catalog();
    listed.registries.insert("ghcr.io".into(), Default::default());
    listed.registries.insert("docker.io".into(), Default::default());
    for (image, want) in [
        ("ghcr.io/org/train:1.2", vec![]),
        ("pytorch/pytorch:2.3", vec![]),
        ("ubuntu", vec![]),
        ("registry.example:5000/team/x:1", vec![(p, Code::RegistryNotAllowed)]),
        ("GHCR.io/org/train", vec![]),
    ] {
        let mut t = base(PYTORCH);
        t.spec.environment.image = image.into();
        let r = validate(&t, &listed);
        assert_eq!(r.problems.iter().map(|p| (p.path.as_str(), p.code)).collect::<Vec<_>>(), want, "{image}");
    }
    let mut t = base(PYTORCH);
    t.spec.environment.image = "registry.example:5000/team/x:1".into();
    let m = &validate(&t, &listed).problems[0].message;
    assert!(m.contains("registry.example:5000") && m.contains("allowed: docker.io, ghcr.io"), "{m}");
    // A RayJob needs an image with Ray.
    case(RAY, |t| t.spec.environment.image = "pytorch-2.3-cuda12".into(), &[(p, Code::Incompatible)]);
    let w = case(RAY, |t| t.spec.environment.image = "ghcr.io/x/y:1".into(), &[(p, Code::Incompatible)]);
    assert!(w[0].contains("cannot check"), "an unknown image is only a warning for RayJob: {w:?}");
}

#[test]
fn labels() {
    case(
        PYTORCH,
        |t| t.metadata.labels.insert("experiment".into(), "anything-1".into()).map(drop).unwrap_or(()),
        &[],
    );
    case(
        PYTORCH,
        |t| {
            t.metadata.labels.insert("owner".into(), "alice".into());
        },
        &[("metadata.labels.owner", Code::UnmaintainedLabel)],
    );
    case(
        PYTORCH,
        |t| {
            t.metadata.labels.insert("team".into(), "robotics".into());
        },
        &[("metadata.labels.team", Code::UnmaintainedLabel)],
    );
    let mut open = catalog();
    open.labels.validation = false;
    let mut t = base(PYTORCH);
    t.metadata.labels.insert("owner".into(), "alice".into());
    t.metadata.labels.insert("example.com/tier".into(), "gold".into());
    assert!(validate(&t, &open).problems.is_empty());
    t.metadata.labels.insert("bad key".into(), "x".into());
    t.metadata.labels.insert("k".into(), "-bad-".into());
    t.metadata.labels.insert("Upper.COM/x".into(), "x".into());
    let got: Vec<_> = validate(&t, &open).problems.into_iter().map(|p| (p.path, p.code)).collect();
    assert_eq!(
        got,
        [
            (r#"metadata.labels["Upper.COM/x"]"#.to_owned(), Code::InvalidName),
            (r#"metadata.labels["bad key"]"#.to_owned(), Code::InvalidName),
            ("metadata.labels.k".to_owned(), Code::InvalidValue),
        ]
    );
}

fn spec(name: &str, count: u32) -> InstanceSpecChoice {
    InstanceSpecChoice { spec: name.into(), count_per_node: count }
}

/// A task valid in every field that no placement could ever admit under the catalog (its quota, its pool's
/// nodes) is refused with each option's reason, rather than left to wait forever; one that fits with any option
/// is not.
#[test]
fn admission_that_can_never_happen() {
    // nlp's Reserved quota in a100-pool: 24 units of gpu.a100.1, 8 of gpu.h100.1; the pool has five 8-GPU A100
    // nodes and one 8-GPU H100 node.
    case(PYTORCH, |t| t.spec.compute.workers = 2, &[]);
    let m = case(PYTORCH, |t| t.spec.compute.workers = 8, &[("spec.compute.instanceSpecs", Code::NeverFits)]);
    assert!(
        m[0].contains("it needs 72 units of gpu.a100.1 and group \"nlp\"'s Reserved quota there is 24"),
        "{m:?}"
    );
    // Beyond quota, lent by idle supplementation, but six replicas of 5 GPUs need six nodes (a node holds one)
    // and the pool has five; the H100 fallback has one node: both reasons are given.
    let m = case(
        PYTORCH,
        |t| {
            t.spec.compute.workers = 5;
            t.spec.compute.idle_supplement = true;
            t.spec.compute.instance_specs = vec![spec("gpu.a100.1", 5), spec("gpu.h100.1", 5)];
        },
        &[("spec.compute.instanceSpecs", Code::NeverFits)],
    );
    assert!(m[0].contains("option 1 (gpu.a100.1): its 6 replicas of gpu.a100.1 need"), "{m:?}");
    assert!(m[0].contains("the pool's nodes hold 5 such replicas even when empty"), "{m:?}");
    assert!(m[0].contains("option 2 (gpu.h100.1): its 6 replicas of gpu.h100.1 need"), "{m:?}");
    // Ondemand runs only on what no group reserved: 16 of the pool's 40 A100s.
    let ondemand = |t: &mut TrainingTask, workers| {
        t.spec.compute.resource_type = ResourceType::Ondemand;
        t.spec.compute.workers = workers;
        t.spec.compute.instance_specs = vec![spec("gpu.a100.1", 4)];
    };
    case(PYTORCH, |t| ondemand(t, 3), &[]);
    let m = case(PYTORCH, |t| ondemand(t, 4), &[("spec.compute.instanceSpecs", Code::NeverFits)]);
    assert!(
        m[0].contains("it needs 20 units of gpu.a100.1 no group reserved, and the pool's nodes hold 40 units of it of which the groups' Reserved quotas take 24"),
        "{m:?}"
    );
    // Idle supplementation may lend what is over the quota: only capacity is claimed then (4 A100 replicas fit).
    case(
        PYTORCH,
        |t| {
            t.spec.compute.workers = 3;
            t.spec.compute.instance_specs = vec![spec("gpu.a100.1", 8)];
            t.spec.compute.idle_supplement = true;
        },
        &[],
    );
    // Spot without a Spot limit: quota says nothing; the capacity still does (six 8-GPU replicas, five nodes).
    case(
        PYTORCH,
        |t| {
            t.spec.compute.resource_type = trainyard_core::spec::ResourceType::Spot;
            t.spec.compute.workers = 5;
        },
        &[("spec.compute.instanceSpecs", Code::NeverFits)],
    );
}

#[test]
fn compute() {
    // In range, but no quota or pool could ever hold 4,096 eight-GPU replicas.
    case(PYTORCH, |t| t.spec.compute.workers = 4095, &[("spec.compute.instanceSpecs", Code::NeverFits)]);
    case(PYTORCH, |t| t.spec.compute.workers = 4096, &[("spec.compute.workers", Code::OutOfRange)]);
    case(PYTORCH, |t| t.spec.compute.priority = 0, &[("spec.compute.priority", Code::OutOfRange)]);
    case(PYTORCH, |t| t.spec.compute.priority = 10, &[]);
    case(PYTORCH, |t| t.spec.compute.instance_specs.clear(), &[("spec.compute.instanceSpecs", Code::Empty)]);
    case(
        PYTORCH,
        |t| t.spec.compute.instance_specs = vec![spec("gpu.a100.1", 1), spec("gpu.a100.1", 2)],
        &[("spec.compute.instanceSpecs[1].spec", Code::Duplicate)],
    );
    case(
        PYTORCH,
        |t| t.spec.compute.instance_specs = vec![spec("gpu.a100.1", 0)],
        &[("spec.compute.instanceSpecs[0].countPerNode", Code::OutOfRange)],
    );
    let m = case(
        PYTORCH,
        |t| t.spec.compute.instance_specs = vec![spec("gpu.a100.1", 9)],
        &[("spec.compute.instanceSpecs[0].countPerNode", Code::NeverFits)],
    );
    assert!(m[0].contains("use countPerNode 8 or less"), "{m:?}");
    case(
        PYTORCH,
        |t| t.spec.compute.instance_specs = (0..9).map(|i| spec(&format!("s{i}"), 1)).collect(),
        &[
            ("spec.compute.instanceSpecs", Code::TooLong),
            ("spec.compute.instanceSpecs[0].spec", Code::NotFound),
            ("spec.compute.instanceSpecs[1].spec", Code::NotFound),
            ("spec.compute.instanceSpecs[2].spec", Code::NotFound),
            ("spec.compute.instanceSpecs[3].spec", Code::NotFound),
            ("spec.compute.instanceSpecs[4].spec", Code::NotFound),
            ("spec.compute.instanceSpecs[5].spec", Code::NotFound),
            ("spec.compute.instanceSpecs[6].spec", Code::NotFound),
            ("spec.compute.instanceSpecs[7].spec", Code::NotFound),
            ("spec.compute.instanceSpecs[8].spec", Code::NotFound),
        ],
    );
    case(
        PYTORCH,
        |t| t.spec.compute.instance_specs = vec![spec("cpu.small", 1)],
        &[("spec.compute.instanceSpecs[0].spec", Code::NotAvailable)],
    );
    case(
        PYTORCH,
        |t| t.spec.compute.instance_specs.push(spec("cpu.large", 1)),
        &[("spec.compute.instanceSpecs", Code::Conflict)],
    );
}

#[test]
fn resource_types_guarantee_and_idle_supplement() {
    use ResourceType::*;
    for rt in [Reserved, Ondemand] {
        case(
            PYTORCH,
            |t| {
                t.spec.compute.resource_type = rt;
                t.spec.compute.guarantee = true
            },
            &[],
        );
    }
    for rt in [Spot, Idle] {
        case(PYTORCH, |t| t.spec.compute.resource_type = rt, &[]);
        case(
            PYTORCH,
            |t| {
                t.spec.compute.resource_type = rt;
                t.spec.compute.guarantee = true
            },
            &[("spec.compute.guarantee", Code::Conflict)],
        );
    }
    case(PYTORCH, |t| t.spec.compute.idle_supplement = true, &[]);
    case(
        PYTORCH,
        |t| {
            t.spec.compute.idle_supplement = true;
            t.spec.compute.guarantee = true
        },
        &[("spec.compute.idleSupplement", Code::Ignored)],
    );
    for rt in [Ondemand, Spot, Idle] {
        case(
            PYTORCH,
            |t| {
                t.spec.compute.resource_type = rt;
                t.spec.compute.idle_supplement = true
            },
            &[("spec.compute.idleSupplement", Code::NotSupported)],
        );
    }
}

#[test]
fn advanced_options() {
    let a = |f: fn(&mut Advanced)| move |t: &mut TrainingTask| f(&mut t.spec.advanced);
    case(PYTORCH, a(|a| a.image_pull_tolerance = -1), &[]);
    case(PYTORCH, a(|a| a.image_pull_tolerance = 0), &[]);
    case(PYTORCH, a(|a| a.image_pull_tolerance = 100), &[]);
    case(
        PYTORCH,
        a(|a| a.image_pull_tolerance = -2),
        &[("spec.advanced.imagePullTolerance", Code::OutOfRange)],
    );
    case(
        PYTORCH,
        a(|a| a.image_pull_tolerance = 101),
        &[("spec.advanced.imagePullTolerance", Code::OutOfRange)],
    );
    let ec = |s| {
        move |a: &mut Advanced| {
            a.exit_checkpoint =
                Some(ExitCheckpoint { enabled: true, timeout_seconds: s, signal: CheckpointSignal::Sigusr1 })
        }
    };
    for ok in [1, 600] {
        let f = ec(ok);
        case(PYTORCH, move |t| f(&mut t.spec.advanced), &[]);
    }
    for bad in [0, 601] {
        let f = ec(bad);
        case(
            PYTORCH,
            move |t| f(&mut t.spec.advanced),
            &[("spec.advanced.exitCheckpoint.timeoutSeconds", Code::OutOfRange)],
        );
    }
    case(
        PYTORCH,
        a(|a| {
            a.fault_tolerance =
                Some(FaultTolerance { enabled: true, max_resubmissions: 0, node_replacement: true })
        }),
        &[],
    );
    case(
        PYTORCH,
        a(|a| {
            a.fault_tolerance =
                Some(FaultTolerance { enabled: true, max_resubmissions: 101, node_replacement: true })
        }),
        &[("spec.advanced.faultTolerance.maxResubmissions", Code::OutOfRange)],
    );
    let ep = |port, path: &str| MetricsEndpoint { port, path: path.into() };
    let metrics = |eps: Vec<MetricsEndpoint>| {
        Some(MetricsMonitor { enabled: true, endpoints: eps, interval_seconds: 15 })
    };
    case(
        PYTORCH,
        |t| {
            t.spec.advanced.metrics =
                metrics(vec![ep(9100, "/metrics"), ep(9100, "/m2"), ep(9101, "/metrics")])
        },
        &[],
    );
    case(
        PYTORCH,
        |t| t.spec.advanced.metrics = metrics(vec![]),
        &[("spec.advanced.metrics.endpoints", Code::Empty)],
    );
    case(
        PYTORCH,
        |t| {
            t.spec.advanced.metrics = metrics(vec![
                ep(0, "/m"),
                ep(65536, "/m"),
                ep(1, "m"),
                ep(2, "/a b"),
                ep(9, "/x"),
                ep(9, "/x"),
            ])
        },
        &[
            ("spec.advanced.metrics.endpoints[0].port", Code::OutOfRange),
            ("spec.advanced.metrics.endpoints[1].port", Code::OutOfRange),
            ("spec.advanced.metrics.endpoints[2].path", Code::InvalidPath),
            ("spec.advanced.metrics.endpoints[3].path", Code::InvalidPath),
            ("spec.advanced.metrics.endpoints[5]", Code::Duplicate),
        ],
    );
    let alarm = |events: Vec<AlarmEvent>, url: &str, th: Option<u32>| AlarmSubscription {
        events,
        webhook: url.into(),
        queued_threshold_seconds: th,
    };
    case(
        PYTORCH,
        |t| t.spec.advanced.alarms = vec![alarm(vec![AlarmEvent::Failed], "http://127.0.0.1:9/x", None)],
        &[],
    );
    case(
        PYTORCH,
        |t| t.spec.advanced.alarms = vec![alarm(vec![AlarmEvent::QueuedTooLong], "https://h/x", Some(60))],
        &[],
    );
    case(
        PYTORCH,
        |t| t.spec.advanced.alarms = vec![alarm(vec![AlarmEvent::QueuedTooLong], "https://h/x", Some(59))],
        &[("spec.advanced.alarms[0].queuedThresholdSeconds", Code::OutOfRange)],
    );
    for bad in ["", "h/x", "ftp://h", "https://", "https://h/a b"] {
        case(
            PYTORCH,
            |t| t.spec.advanced.alarms = vec![alarm(vec![AlarmEvent::Failed], bad, None)],
            &[("spec.advanced.alarms[0].webhook", Code::InvalidUrl)],
        );
    }
}

#[test]
fn type_specific_settings() {
    case(PYTORCH, |t| t.spec.ray = Some(RaySettings::default()), &[("spec.ray", Code::NotSupported)]);
    case(
        RAY,
        |t| t.spec.pytorch = Some(PyTorchSettings { procs_per_node: Some(1) }),
        &[("spec.pytorch", Code::NotSupported)],
    );
    case(
        RAY,
        |t| {
            t.spec.advanced.precheck =
                Some(Precheck { enabled: true, timeout_seconds: 60, ..Default::default() })
        },
        &[("spec.advanced.precheck", Code::NotSupported)],
    );
    case(
        RAY,
        |t| {
            t.spec.advanced.exit_checkpoint =
                Some(ExitCheckpoint { enabled: true, timeout_seconds: 60, signal: CheckpointSignal::Sigusr2 })
        },
        &[("spec.advanced.exitCheckpoint", Code::NotSupported)],
    );
    case(PYTORCH, |t| t.spec.pytorch = Some(PyTorchSettings { procs_per_node: Some(8) }), &[]);
    case(
        PYTORCH,
        |t| t.spec.pytorch = Some(PyTorchSettings { procs_per_node: Some(9) }),
        &[("spec.pytorch.procsPerNode", Code::Conflict)],
    );
    case(
        PYTORCH,
        |t| t.spec.pytorch = Some(PyTorchSettings { procs_per_node: Some(0) }),
        &[("spec.pytorch.procsPerNode", Code::OutOfRange)],
    );
}

fn ray(t: &mut TrainingTask) -> &mut RaySettings {
    t.spec.ray.get_or_insert_with(Default::default)
}

#[test]
fn ray_settings() {
    case(RAY, |t| ray(t).head.instance_spec = Some(spec("cpu.large", 1)), &[]);
    case(
        RAY,
        |t| ray(t).head.instance_spec = Some(spec("cpu.small", 1)),
        &[("spec.ray.head.instanceSpec.spec", Code::NotAvailable)],
    );
    case(
        RAY,
        |t| ray(t).head.instance_spec = Some(spec("cpu.large", 5)),
        &[("spec.ray.head.instanceSpec.countPerNode", Code::NeverFits)],
    );
    case(
        RAY,
        |t| {
            ray(t).shared_storage = Some(SharedStorage { volume: "ray-shared".into(), cleanup_on_exit: true })
        },
        &[],
    );
    case(
        RAY,
        |t| {
            ray(t).shared_storage =
                Some(SharedStorage { volume: "scratch-disk".into(), cleanup_on_exit: false })
        },
        &[("spec.ray.sharedStorage.volume", Code::Incompatible)],
    );
    case(
        RAY,
        |t| {
            ray(t).shared_storage =
                Some(SharedStorage { volume: "ray-shared".into(), cleanup_on_exit: false });
            t.spec.environment.volumes = vec![mount("/tmp/ray")];
        },
        &[("spec.environment.volumes[0].mountPath", Code::ProtectedPath)],
    );
    case(RAY, |t| ray(t).debug = Some(RayDebug { enabled: true, retention_seconds: 600 }), &[]);
    case(
        RAY,
        |t| ray(t).debug = Some(RayDebug { enabled: true, retention_seconds: 0 }),
        &[("spec.ray.debug.retentionSeconds", Code::OutOfRange)],
    );
    let auto = |min, max| Autoscaling {
        enabled: true,
        min_workers: min,
        max_workers: max,
        idle_timeout_seconds: 60,
        mode: AutoscalingMode::Aggressive,
    };
    case(RAY, |t| ray(t).autoscaling = Some(auto(0, 2)), &[]);
    case(RAY, |t| ray(t).autoscaling = Some(auto(2, 2)), &[]);
    case(
        RAY,
        |t| ray(t).autoscaling = Some(auto(3, 2)),
        &[("spec.ray.autoscaling.minWorkers", Code::Conflict)],
    );
    case(RAY, |t| ray(t).autoscaling = Some(auto(3, 5)), &[("spec.compute.workers", Code::Conflict)]);
    case(RAY, |t| ray(t).autoscaling = Some(auto(0, 1)), &[("spec.compute.workers", Code::Conflict)]);
    case(
        RAY,
        |t| ray(t).autoscaling = Some(auto(0, 0)),
        &[("spec.ray.autoscaling.maxWorkers", Code::OutOfRange), ("spec.compute.workers", Code::Conflict)],
    );
    case(
        RAY,
        |t| ray(t).runtime_env_yaml = Some("pip: [a]\nconda: b\n".into()),
        &[("spec.ray.runtimeEnvYaml.conda", Code::Conflict)],
    );
    case(RAY, |t| ray(t).runtime_env_yaml = Some("  \n".into()), &[]);
}

#[test]
fn structure_problems_are_all_reported_with_paths() {
    let text = PYTORCH
        .replace("workers: 1", "workers: one")
        .replace("resourceType: Reserved", "resourceType: reserved")
        .replace("countPerNode: 8", "countPerNode: 8, count: 2")
        .replace("namePrefix: base", "nameprefix: base");
    let m = text_case(
        &text,
        &[
            ("metadata.nameprefix", Code::UnknownField),
            ("spec.compute.resourceType", Code::InvalidValue),
            ("spec.compute.workers", Code::WrongType),
            ("spec.compute.instanceSpecs[0].count", Code::UnknownField),
        ],
    );
    assert!(m[0].contains("did you mean \"namePrefix\""), "{m:?}");
    assert!(m[1].contains("did you mean \"Reserved\""), "{m:?}");
    // A missing required field, and nothing else about it.
    text_case(
        &PYTORCH.replace("    cmd: torchrun train.py\n", ""),
        &[("spec.environment.cmd", Code::Required)],
    );
    // Broken syntax is one problem at the document.
    text_case("spec: [", &[("", Code::Syntax)]);
    text_case("", &[("", Code::Empty)]);
    text_case("[1, 2]", &[("", Code::WrongType)]);
    text_case(
        "{\"apiVersion\": 1}",
        &[
            ("apiVersion", Code::WrongType),
            ("kind", Code::Required),
            ("metadata", Code::Required),
            ("spec", Code::Required),
        ],
    );
    // Duplicate keys are refused rather than one silently winning.
    text_case(
        &PYTORCH.replace("  type: PyTorchJob\n", "  type: PyTorchJob\n  type: RayJob\n"),
        &[("", Code::Syntax)],
    );
}

#[test]
fn a_bad_field_does_not_cause_follow_on_problems() {
    // The task type is unreadable: no type-specific problem may be guessed from a default.
    let text = RAY.replace("type: RayJob", "type: Ray");
    text_case(&text, &[("spec.type", Code::InvalidValue)]);
    // The cluster is unknown: pools, images and storage are not also reported as unavailable there.
    text_case(
        &PYTORCH.replace("cluster: gpu-east-1", "cluster: gpu-west"),
        &[("spec.placement.cluster", Code::NotFound)],
    );
}

#[test]
fn json_and_yaml_read_the_same() {
    let t = base(PYTORCH);
    let json = t.to_json();
    let checked = check(json.as_bytes(), &catalog());
    assert!(checked.report.problems.is_empty());
    assert_eq!(checked.task.unwrap(), t);
}

/// Catalog entries with project groups are refused to tasks of other groups, naming the groups they are for;
/// entries without groups, and listed groups, pass. The host image's groups are the server's to enforce.
#[test]
fn catalog_entries_for_other_groups() {
    let mut cat = catalog();
    let other = cat.project_groups.keys().find(|g| *g != "nlp").unwrap().clone();
    cat.volumes.get_mut("ckpt").unwrap().project_groups = vec![other.clone()];
    cat.datasets.get_mut("alpaca").unwrap().project_groups = vec!["nlp".into(), other.clone()];
    cat.images.get_mut("pytorch-2.3-cuda12").unwrap().project_groups = vec![other.clone()];
    let report = validate(&base(PYTORCH), &cat);
    let got: Vec<(&str, Code)> = report.problems.iter().map(|p| (p.path.as_str(), p.code)).collect();
    assert_eq!(
        got,
        [
            ("spec.environment.image", Code::NotInGroup),
            ("spec.environment.volumes[0].volume", Code::NotInGroup)
        ]
    );
    assert!(report.problems[1].message.contains(&format!("for project groups {other} only")), "{report:?}");
    assert!(cat.check().is_empty());
    cat.models.entry("m".into()).or_default().project_groups = vec!["nope".into()];
    assert_eq!(cat.check(), ["model m: project group \"nope\" does not exist"]);
}

/// A hidden value that is only asterisks is the mask the API shows, never a value.
#[test]
fn masked_hidden_values() {
    let hidden = |v: &str| EnvVar { name: "K".into(), value: v.into(), hidden: true };
    for mask in ["******", "*"] {
        case(PYTORCH, |t| t.spec.environment.env = vec![hidden(mask)], &[(ENV0_VALUE, Code::MaskedValue)]);
    }
    case(PYTORCH, |t| t.spec.environment.env = vec![hidden("**x")], &[]);
    case(PYTORCH, |t| t.spec.environment.env = vec![env("K", "***")], &[]);
}

const ENV0_VALUE: &str = "spec.environment.env[0].value";
