//! The plan from a launch spec: names, GPUs, places, env and jobs, with no files and no root.

use super::*;
use std::path::Path;
use std::sync::Arc;
use trainyard_core::Catalog;
use trainyard_runtime::{AttemptKey, ReplicaPlan};

const CATALOG: &str = r#"
regions: {local: {}}
clusters: {local: {region: local}}
pools: {default: {cluster: local, instanceSpecs: [cpu.small]}}
instanceSpecs: {cpu.small: {kind: CPU, vcpus: 1, memoryMib: 512}}
nodes:
  node-a: {pool: default, vcpus: 4, memoryMib: 4096, gpus: 4, gpuModel: A100}
  node-b: {pool: default, vcpus: 4, memoryMib: 4096}
projectGroups: {default: {}}
images: {host: {}, cuda: {rootfs: /images/cuda}, ray: {rootfs: /images/ray, ray: true}}
quotas: [{group: default, resourceType: Reserved, pool: default, spec: cpu.small, units: 8}]
"#;

/// A launch spec of `workers` workers (replicas alternate between node-a and node-b), `extra` merged into
/// the task's spec; each replica asks for `gpus`.
fn spec(kind: &str, workers: u32, gpus: u64, extra: serde_json::Value) -> LaunchSpec {
    let catalog = Catalog::from_yaml(CATALOG).unwrap();
    let mut doc = serde_json::json!({
        "apiVersion": "trainyard.dev/v1", "kind": "TrainingTask",
        "metadata": {"namePrefix": "plan", "projectGroup": "default"},
        "spec": {
            "type": kind,
            "placement": {"region": "local", "cluster": "local"},
            "environment": {"image": "host", "cmd": "train", "env": [{"name": "LR", "value": "0.1"}]},
            "compute": {"resourceType": "Reserved", "pool": "default", "workers": workers,
                        "instanceSpecs": [{"spec": "cpu.small"}]},
        }
    });
    if kind == "RayJob" {
        doc["spec"]["environment"]["image"] = "ray".into();
    }
    for (k, v) in extra.as_object().unwrap() {
        doc["spec"][k] = v.clone();
    }
    let checked = trainyard_core::parse::check(doc.to_string().as_bytes(), &catalog);
    let task = checked.valid_task().unwrap_or_else(|| panic!("{:?}", checked.report)).clone();
    let lead = if kind == "RayJob" { "head" } else { "master" };
    let replicas = (0..=workers)
        .map(|i| ReplicaPlan {
            role: if i == 0 { lead.into() } else { "worker".into() },
            index: if i == 0 { 0 } else { i - 1 },
            rank: i,
            node: if i % 2 == 0 { "node-a".into() } else { "node-b".into() },
            resources: trainyard_core::demand::Resources { gpus, vcpus: 2, memory_mib: 32 },
        })
        .collect();
    LaunchSpec {
        key: AttemptKey { task_id: "t1".into(), attempt: 2 },
        task_name: "plan-abcde".into(),
        owner: "alice".into(),
        task,
        replicas,
        option: 0,
        catalog: Arc::new(catalog),
        registry_logins: Default::default(),
        workdir_token: None,
    }
}

fn net(networked: bool) -> Network {
    Network { networked, range: Range::default(), switch: "ty-sw".into(), gateway: None }
}

fn cfg() -> LocalConfig {
    let mut c =
        LocalConfig::new(Path::new("/data"), ("/bin/trainyard".into(), vec![]), "/usr/bin/bwrap".into());
    c.host_path = "/usr/bin:/bin".into();
    c
}

/// The plan's jobs for `spec`, networked as asked.
fn jobs(spec: &LaunchSpec, networked: bool) -> Vec<ReplicaJob> {
    let (cfg, layout, net) = (cfg(), AttemptLayout::new(Path::new("/data/runs"), &spec.key), net(networked));
    let replicas = place_replicas(spec, &[], BTreeMap::new());
    let plan = Plan {
        spec,
        cfg: &cfg,
        layout: &layout,
        uid: 1_900_000_005,
        gid: 1_900_000_000,
        replicas: &replicas,
        net: &net,
        root: image_root(spec),
        pulled: None,
        mounts: vec![],
        hide: hidden(&cfg, spec),
        resolv: None,
        ray_base: if spec.task.spec.task_type == TaskType::RayJob { 30_000 } else { 0 },
        ray_env: None,
    };
    plan.jobs().unwrap()
}

fn var<'a>(job: &'a ReplicaJob, name: &str) -> Option<&'a str> {
    job.env.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

#[test]
fn replicas_are_named_by_role_and_take_free_gpus() {
    let s = spec("PyTorchJob", 2, 2, serde_json::json!({}));
    let used = BTreeMap::from([("node-a".to_owned(), BTreeSet::from([0]))]);
    let r = place_replicas(&s, &[], used);
    let names: Vec<&str> = r.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["plan-abcde-master-0", "plan-abcde-worker-0", "plan-abcde-worker-1"]);
    assert_eq!(r[0].devices, [1, 2], "GPU 0 is someone else's");
    assert_eq!(r[1].devices, Vec::<u32>::new(), "node-b has none");
    assert_eq!(r[2].devices, [3], "what is left on node-a");
    assert_eq!(r.iter().map(|r| r.slot).collect::<Vec<_>>(), [0, 1, 2]);
}

#[test]
fn a_resized_attempt_keeps_its_replicas_places() {
    let s = spec("PyTorchJob", 2, 0, serde_json::json!({}));
    let have = vec![
        Replica {
            name: "plan-abcde-master-0".into(),
            role: "master".into(),
            node: "node-a".into(),
            devices: vec![],
            slot: 0,
        },
        Replica {
            name: "plan-abcde-worker-1".into(),
            role: "worker".into(),
            node: "node-a".into(),
            devices: vec![],
            slot: 1,
        },
    ];
    let r = place_replicas(&s, &have, BTreeMap::new());
    assert_eq!(
        r.iter().map(|r| r.slot).collect::<Vec<_>>(),
        [0, 2, 1],
        "the new worker takes the lowest free"
    );
}

#[test]
fn gpus_in_use_gathers_every_attempts_devices() {
    let mut l = launched_for_test();
    l.replicas[0].devices = vec![0, 2];
    let used = gpus_in_use([&l].into_iter());
    assert_eq!(used["node-a"], BTreeSet::from([0, 2]));
}

fn launched_for_test() -> Launched {
    let s = spec("PyTorchJob", 0, 0, serde_json::json!({}));
    let (cfg, layout, net) = (cfg(), AttemptLayout::new(Path::new("/r"), &s.key), net(false));
    let replicas = place_replicas(&s, &[], BTreeMap::new());
    Plan {
        spec: &s,
        cfg: &cfg,
        layout: &layout,
        uid: 7,
        gid: 8,
        replicas: &replicas,
        net: &net,
        root: None,
        pulled: None,
        mounts: vec![Mount { src: "/v".into(), dst: "/data".into(), read_only: true }],
        hide: vec![],
        resolv: None,
        ray_base: 0,
        ray_env: None,
    }
    .launched(None)
}

#[test]
fn what_launch_json_records() {
    let l = launched_for_test();
    assert_eq!((l.task_id.as_str(), l.attempt, l.uid, l.networked), ("t1", 2, 7, false));
    assert_eq!(l.mount_paths, ["/data"]);
    assert_eq!(
        (l.task_type.as_str(), l.image.as_str(), l.precheck, l.checkpoint),
        ("PyTorchJob", "host", false, None)
    );
}

#[test]
fn a_network_when_replicas_talk_or_reach_out() {
    assert!(!Network::wanted(true, 1, false, false), "one replica alone");
    assert!(Network::wanted(true, 2, false, false));
    assert!(Network::wanted(true, 1, true, false), "autoscaling adds replicas later");
    assert!(Network::wanted(true, 1, false, true), "egress");
    assert!(!Network::wanted(false, 8, true, true), "no iproute2");
    let r = Replica { name: "x".into(), role: "worker".into(), node: "n".into(), devices: vec![], slot: 3 };
    assert_eq!(net(true).address(&r).unwrap(), Ipv4Addr::new(10, 213, 0, 5));
    assert_eq!(net(false).address(&r).unwrap(), Ipv4Addr::LOCALHOST);
    assert_eq!(net(false).replica(&r), None);
    let rn = net(true).replica(&r).unwrap();
    assert_eq!((rn.name.as_str(), rn.address, rn.prefix), ("ty-sw-3", Ipv4Addr::new(10, 213, 0, 5), 16));
    let far = Replica { slot: 70_000, ..r };
    assert!(net(true).address(&far).is_err(), "past the range's end");
}

#[test]
fn hosts_and_hostfiles_list_every_replica() {
    let s = spec("PyTorchJob", 1, 0, serde_json::json!({}));
    let r = place_replicas(&s, &[], BTreeMap::new());
    assert_eq!(
        hosts_file(&r, &net(true)).unwrap(),
        "127.0.0.1 localhost\n::1 localhost ip6-localhost\n10.213.0.2 plan-abcde-master-0\n10.213.0.3 plan-abcde-worker-0\n"
    );
    let (hostfile, names) = hostfiles(&r, Some(4));
    assert_eq!(hostfile, "plan-abcde-master-0 slots=4\nplan-abcde-worker-0 slots=4\n");
    assert_eq!(names, "plan-abcde-master-0\nplan-abcde-worker-0\n");
}

#[test]
fn a_pytorch_replicas_env() {
    let s = spec("PyTorchJob", 1, 2, serde_json::json!({}));
    let j = jobs(&s, true);
    assert_eq!(j[0].env[0], ("PATH".to_owned(), "/usr/bin:/bin".to_owned()), "the host's PATH first");
    let at = |job: &ReplicaJob, k: &str| job.env.iter().position(|(n, _)| n == k).unwrap();
    assert!(at(&j[1], "LR") < at(&j[1], "RANK"), "the platform's names come after the task's");
    for (k, v) in [
        ("LR", "0.1"),
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "plan-abcde-master-0"),
        ("MASTER_PORT", "29500"),
        ("PET_NPROC_PER_NODE", "2"),
        ("HOSTNAME", "plan-abcde-worker-0"),
        ("TRAINYARD_ROLE", "worker"),
        ("TRAINYARD_ATTEMPT", "2"),
        ("X_USER_NAME", "alice"),
        ("TASK_UUID", "t1"),
        ("CUDA_VISIBLE_DEVICES", ""),
    ] {
        assert_eq!(var(&j[1], k), Some(v), "{k}");
    }
    assert_eq!(var(&j[0], "CUDA_VISIBLE_DEVICES"), Some("0,1"));
    assert_eq!(var(&j[0], "RAY_ADDRESS"), None);
}

#[test]
fn a_ray_replicas_env_and_command() {
    let s = spec("RayJob", 1, 0, serde_json::json!({}));
    let j = jobs(&s, true);
    assert_eq!(var(&j[1], "RAY_ADDRESS"), Some("10.213.0.2:30001"), "the head's GCS");
    assert_eq!(var(&j[0], "TRAINYARD_ENTRYPOINT"), Some("train"));
    assert_eq!(var(&j[0], "MASTER_ADDR"), None);
    assert!(j[0].cmd.contains("ray start --head"), "{}", j[0].cmd);
    assert!(j[1].cmd.contains("ray start --address=10.213.0.2:30001"), "{}", j[1].cmd);
}

#[test]
fn a_job_holds_the_attempts_paths_limits_and_network() {
    let s = spec("PyTorchJob", 1, 0, serde_json::json!({}));
    let j = jobs(&s, true);
    let sb = &j[1].sandbox;
    assert_eq!(sb.root, Path::new("/"));
    assert!(sb.host_view);
    assert_eq!(sb.tmp, Path::new("/data/runs/t1/a2/plan-abcde-worker-0/scratch/tmp"));
    assert_eq!(sb.runtime, Path::new("/data/runs/t1/a2/plan-abcde-worker-0/scratch/run"));
    // The replica's copy, in its scratch (its file system of its own names no host path in mountinfo).
    assert_eq!(sb.hosts, Path::new("/data/runs/t1/a2/plan-abcde-worker-0/scratch/etc/hosts"));
    assert_eq!(
        sb.passwd.as_deref(),
        Some(Path::new("/data/runs/t1/a2/plan-abcde-worker-0/scratch/etc/passwd"))
    );
    assert_eq!(sb.hide, [Path::new("/data")], "the data dir is hidden");
    assert_eq!((j[1].millicpu, j[1].memory_mib, j[1].uid), (2000, 64, 1_900_000_005), "at least 64 MiB");
    assert_eq!(j[1].net.as_ref().map(|n| n.address), Some(Ipv4Addr::new(10, 213, 0, 3)));
    assert_eq!(
        (j[1].monitor.interval_s, j[1].precheck.as_deref(), j[1].sshd),
        (PRESET_INTERVAL_S, None, false)
    );
    assert_eq!(j[1].cmd, "train");
}

#[test]
fn an_image_without_a_root_here_points_nowhere() {
    let s = spec("PyTorchJob", 0, 0, serde_json::json!({"environment": {"image": "cuda", "cmd": "x"}}));
    assert_eq!(image_root(&s), Some(PathBuf::from("/images/cuda")));
    let mut s = s;
    s.task.spec.environment.image = "gone".into();
    assert_eq!(image_root(&s), None);
    assert_eq!(jobs(&s, false)[0].sandbox.root, Path::new("/nonexistent/trainyard-image/gone"));
}

#[test]
fn precheck_and_checkpoint() {
    let s = spec(
        "PyTorchJob",
        0,
        0,
        serde_json::json!({"advanced": {
            "precheck": {"enabled": true, "timeoutSeconds": 30, "minGemmTflops": 1.5},
            "exitCheckpoint": {"enabled": true, "timeoutSeconds": 300, "signal": "SIGUSR2"}
        }}),
    );
    let p = precheck(&s.task.spec).unwrap();
    assert_eq!(
        precheck_command(p),
        format!(
            "python3 {RUNTIME_DIR}/precheck.py --out {RUNTIME_DIR}/precheck.json --timeout-s 30 --min-gemm-gflops 1500"
        )
    );
    assert_eq!(checkpoint(&s.task.spec), Some((300, procs::SIGUSR2)));
    let ray = spec("RayJob", 0, 0, serde_json::json!({}));
    assert_eq!((precheck(&ray.task.spec).is_some(), checkpoint(&ray.task.spec)), (false, None));
}
