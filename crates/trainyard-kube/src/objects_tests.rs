//! The objects of an attempt: what each field says, and that every custom object passes the real CRDs'
//! schemas (the operators' own, copied into `tests/crds/`).

use super::*;
use crate::names::reserved_label;
use std::sync::Arc;
use trainyard_core::Catalog;
use trainyard_core::demand::Resources;
use trainyard_runtime::{AttemptKey, LaunchSpec, ReplicaPlan};

const CATALOG: &str = r#"
regions: {r1: {}}
clusters: {c1: {region: r1}}
pools: {gpu: {cluster: c1, instanceSpecs: [a100.1]}}
instanceSpecs: {a100.1: {kind: GPU, gpuModel: A100, gpus: 1, vcpus: 8, memoryMib: 65536}}
nodes:
  node-a: {pool: gpu, vcpus: 64, memoryMib: 524288, gpus: 8, gpuModel: A100}
  node-b: {pool: gpu, vcpus: 64, memoryMib: 524288, gpus: 8, gpuModel: A100}
projectGroups: {vision: {}}
images: {cuda: {torch: true}, ray: {ray: true}}
volumes: {ckpt: {multiPodReadWrite: true}}
datasets: {imagenet: {}}
models: {llama-7b: {}}
quotas: [{group: vision, resourceType: Reserved, pool: gpu, spec: a100.1, units: 64}]
"#;

/// A launch spec of `kind` with `workers` workers; `extra` merged into the task's spec. The lead replica and
/// the first worker go to node-a, the other workers to node-b; each replica takes 2 × a100.1.
fn spec(kind: &str, workers: u32, extra: serde_json::Value) -> LaunchSpec {
    let catalog = Catalog::from_yaml(CATALOG).unwrap();
    let mut doc = json!({
        "apiVersion": "trainyard.dev/v1", "kind": "TrainingTask",
        "metadata": {"namePrefix": "bert", "projectGroup": "vision",
                     "labels": {"team": "nlp", "sim.trainyard.dev/run-ms": "1500"}},
        "spec": {
            "type": kind,
            "placement": {"region": "r1", "cluster": "c1"},
            "environment": {
                "image": if kind == "RayJob" { "ray" } else { "cuda" },
                "cmd": "torchrun train.py --lr 'a b'",
                "env": [{"name": "LR", "value": "0.1"}, {"name": "HF_TOKEN", "value": "s3cret-token", "hidden": true}],
                "volumes": [{"volume": "ckpt", "mountPath": "/volume/ckpt"}],
                "datasets": [{"dataset": "imagenet", "mountPath": "/mnt/data"}],
                "models": [{"model": "llama-7b", "mountPath": "/mnt/model"}],
            },
            "compute": {"resourceType": "Reserved", "pool": "gpu", "workers": workers,
                        "instanceSpecs": [{"spec": "a100.1", "countPerNode": 2}]},
        }
    });
    for (k, v) in extra.as_object().unwrap() {
        doc["spec"][k] = v.clone();
    }
    let checked = trainyard_core::parse::check(doc.to_string().as_bytes(), &catalog);
    let mut task = checked.valid_task().unwrap_or_else(|| panic!("{:?}", checked.report)).clone();
    // Labels Kubernetes would refuse (stored before validation knew better): left off the pods.
    task.metadata.labels.insert("bad key!".into(), "x".into());
    task.metadata.labels.insert("long".into(), "v".repeat(70));
    task.metadata.labels.insert("trainyard.dev/task".into(), "spoofed".into());
    let lead = if kind == "RayJob" { "head" } else { "master" };
    let replicas = (0..=workers)
        .map(|i| ReplicaPlan {
            role: if i == 0 { lead.into() } else { "worker".into() },
            index: if i == 0 { 0 } else { i - 1 },
            rank: i,
            node: if i <= 1 { "node-a".into() } else { "node-b".into() },
            resources: Resources { gpus: 2, vcpus: 16, memory_mib: 131072 },
        })
        .collect();
    LaunchSpec {
        key: AttemptKey { task_id: "0190a5b2c3d4e5f6".into(), attempt: 2 },
        task_name: "bert-x1y2z".into(),
        owner: "alice".into(),
        task,
        replicas,
        option: 0,
        catalog: Arc::new(catalog),
        registry_logins: Default::default(),
        workdir_token: None,
    }
}

fn settings() -> KubeSettings {
    KubeSettings {
        namespace: "ty-vision".into(),
        images: [("cuda".to_owned(), "nvcr.io/nvidia/pytorch:24.05-py3".to_owned())]
            .into_iter()
            .chain([("ray".to_owned(), "rayproject/ray:2.46.0-gpu".to_owned())])
            .collect(),
        ..KubeSettings::default()
    }
}

fn keys() -> SshKeys {
    SshKeys {
        private_key: "-----BEGIN OPENSSH PRIVATE KEY-----\nid\n-----END OPENSSH PRIVATE KEY-----\n".into(),
        public_key: "ssh-ed25519 AAAAC3 trainyard".into(),
        host_key: "-----BEGIN OPENSSH PRIVATE KEY-----\nhost\n-----END OPENSSH PRIVATE KEY-----\n".into(),
    }
}

/// The full-featured PyTorchJob: precheck, exit checkpoint, metrics, SSH, procs per node.
fn pytorch_spec() -> LaunchSpec {
    spec(
        "PyTorchJob",
        2,
        json!({
            "advanced": {
                "precheck": {"enabled": true, "minGemmTflops": 100, "timeoutSeconds": 120,
                             "env": [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "PRE_KEY", "value": "pk", "hidden": true}]},
                "exitCheckpoint": {"enabled": true, "timeoutSeconds": 120, "signal": "SIGUSR1"},
                "metrics": {"enabled": true, "endpoints": [{"port": 8000, "path": "/metrics"}], "intervalSeconds": 30},
                "imagePullTolerance": 2,
                "passwordlessSsh": true,
            },
            "pytorch": {"procsPerNode": 2},
        }),
    )
}

fn env_of(c: &Value) -> BTreeMap<String, Value> {
    c["env"].as_array().unwrap().iter().map(|e| (e["name"].as_str().unwrap().to_owned(), e.clone())).collect()
}

fn template<'a>(job: &'a Value, kind: &str) -> &'a Value {
    &job["spec"]["pytorchReplicaSpecs"][kind]["template"]
}

/// The first pod template of a PyTorchJob or a RayJob.
fn template_any(job: &Value) -> &Value {
    if job["kind"] == "RayJob" {
        &job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
    } else {
        template(job, "Master")
    }
}

/// `spec("PyTorchJob", 1, {})` against another catalog.
fn spec_with_catalog(catalog: Catalog) -> LaunchSpec {
    LaunchSpec { catalog: Arc::new(catalog), ..spec("PyTorchJob", 1, json!({})) }
}

/// Asserts that a job passes its operator's CRD schema (`pytorchjob` or `rayjob`).
fn validate(kind: &str, job: &Value) {
    let file = if kind == "rayjob" { "ray.io_rayjobs.yaml" } else { "kubeflow.org_pytorchjobs.yaml" };
    let problems = crd(file).problems(job);
    assert!(problems.is_empty(), "{problems:#?}");
}

/// Standard base64, back to bytes.
fn decode64(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.bytes().filter(|c| *c != b'=') {
        acc = acc << 6 | ALPHABET.iter().position(|a| *a == c).expect("a base64 character") as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

fn affinity_nodes(t: &Value) -> Vec<&str> {
    let e = &t["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        [0]["matchExpressions"][0];
    assert_eq!(e["key"], "kubernetes.io/hostname");
    assert_eq!(e["operator"], "In");
    e["values"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect()
}

#[test]
fn pytorchjob_of_a_master_and_two_workers_on_two_nodes() {
    let spec = pytorch_spec();
    let o = attempt_objects(&spec, &settings(), Some(&keys())).unwrap();
    let job = &o.job;
    let name = "ty-0190a5b2c3d4e5f6-a2";
    assert_eq!(job_name(&spec.key), name);
    assert_eq!(job["apiVersion"], "kubeflow.org/v1");
    assert_eq!(job["kind"], "PyTorchJob");
    assert_eq!(job["metadata"]["name"], name);
    assert_eq!(job["metadata"]["namespace"], "ty-vision");
    let want_labels = json!({
        "app.kubernetes.io/managed-by": "trainyard", "app.kubernetes.io/instance": "trainyard",
        "trainyard.dev/task": "0190a5b2c3d4e5f6", "trainyard.dev/attempt": "2", "trainyard.dev/group": "vision",
    });
    assert_eq!(job["metadata"]["labels"], want_labels);
    assert_eq!(job["metadata"]["annotations"]["trainyard.dev/image-pull-tolerance"], "2");
    let specs = &job["spec"]["pytorchReplicaSpecs"];
    assert_eq!(specs["Master"]["replicas"], 1);
    assert_eq!(specs["Worker"]["replicas"], 2);
    assert_eq!(specs["Worker"]["restartPolicy"], "Never");
    assert_eq!(job["spec"]["nprocPerNode"], "2");
    assert_eq!(
        job["spec"]["runPolicy"],
        json!({"cleanPodPolicy": "Running", "ttlSecondsAfterFinished": 600, "backoffLimit": 0})
    );

    // Placement: each role on the nodes Trainyard chose for it.
    assert_eq!(affinity_nodes(template(job, "Master")), ["node-a"]);
    assert_eq!(affinity_nodes(template(job, "Worker")), ["node-a", "node-b"]);

    for (kind, role) in [("Master", "master"), ("Worker", "worker")] {
        let t = template(job, kind);
        let labels = &t["metadata"]["labels"];
        for (k, v) in want_labels.as_object().unwrap() {
            assert_eq!(&labels[k], v, "{kind} {k}");
        }
        assert_eq!(labels["trainyard.dev/role"], role);
        // The task's labels reach the pods where Kubernetes takes them; the others are left out.
        assert_eq!(labels["team"], "nlp");
        assert_eq!(labels["sim.trainyard.dev/run-ms"], "1500");
        assert!(labels.get("bad key!").is_none() && labels.get("long").is_none());
        assert_eq!(
            t["metadata"]["annotations"]["trainyard.dev/metrics-endpoints"],
            r#"[{"path":"/metrics","port":8000}]"#
        );
        assert_eq!(t["metadata"]["annotations"]["trainyard.dev/metrics-interval-s"], "30");

        let pod = &t["spec"];
        let c = &pod["containers"][0];
        assert_eq!(c["name"], "pytorch");
        assert_eq!(c["image"], "nvcr.io/nvidia/pytorch:24.05-py3");
        assert_eq!(c["imagePullPolicy"], "IfNotPresent");
        assert_eq!(c["command"][0], "bash");
        assert_eq!(c["command"][1], "-c");
        assert_eq!(c["command"][4], "torchrun train.py --lr 'a b'");
        assert!(c["command"][2].as_str().unwrap().ends_with("exec bash -c \"$1\"\n"));
        assert_eq!(
            c["ports"][0],
            json!({"name": "pytorchjob-port", "containerPort": 29500, "protocol": "TCP"})
        );
        let res = json!({"cpu": "16", "memory": "131072Mi", "nvidia.com/gpu": "2"});
        assert_eq!(c["resources"], json!({"requests": res, "limits": res}));

        // Env: the hidden value only through the Secret; no variable the operator sets.
        let env = env_of(c);
        assert_eq!(env["LR"]["value"], "0.1");
        assert_eq!(
            env["HF_TOKEN"]["valueFrom"]["secretKeyRef"],
            json!({"name": format!("{name}-env"), "key": "env.HF_TOKEN"})
        );
        assert!(env["HF_TOKEN"].get("value").is_none());
        assert_eq!(env["TASK_UUID"]["value"], "0190a5b2c3d4e5f6");
        assert_eq!(env["X_USER_NAME"]["value"], "alice");
        assert_eq!(env["X_ORG_NAME"]["value"], "vision");
        assert_eq!(env["X_REGION"]["value"], "r1");
        assert_eq!(env["X_CLUSTER"]["value"], "c1");
        assert_eq!(env["TRAINYARD_ROLE"]["value"], role);
        assert_eq!(env["TRAINYARD_REPLICA"]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name");
        assert_eq!(env["HOME"]["value"], "/root");
        for operator_sets in [
            "MASTER_ADDR",
            "MASTER_PORT",
            "WORLD_SIZE",
            "RANK",
            "PET_NNODES",
            "PET_NODE_RANK",
            "PET_NPROC_PER_NODE",
            "PET_MASTER_ADDR",
            "PET_MASTER_PORT",
            "CUDA_VISIBLE_DEVICES",
            "HOSTNAME",
        ] {
            assert!(!env.contains_key(operator_sets), "{kind} sets {operator_sets}");
        }
        // The precheck's own variables stay in the precheck.
        assert!(!env.contains_key("NCCL_DEBUG"));

        // Volumes: PVCs named as the catalog entries, datasets and models read-only.
        let mounts: BTreeMap<&str, &Value> = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["mountPath"].as_str().unwrap(), m))
            .collect();
        assert_eq!(mounts["/volume/ckpt"]["readOnly"], false);
        assert_eq!(mounts["/mnt/data"]["readOnly"], true);
        assert_eq!(mounts["/mnt/model"]["readOnly"], true);
        assert_eq!(mounts["/run/trainyard"]["name"], "trainyard-runtime");
        assert_eq!(mounts["/etc/trainyard/ssh"]["readOnly"], true);
        let vols: BTreeMap<&str, &Value> =
            pod["volumes"].as_array().unwrap().iter().map(|v| (v["name"].as_str().unwrap(), v)).collect();
        assert_eq!(
            vols[mounts["/volume/ckpt"]["name"].as_str().unwrap()]["persistentVolumeClaim"],
            json!({"claimName": "ckpt", "readOnly": false})
        );
        assert_eq!(
            vols[mounts["/mnt/data"]["name"].as_str().unwrap()]["persistentVolumeClaim"],
            json!({"claimName": "imagenet", "readOnly": true})
        );
        assert_eq!(
            vols[mounts["/mnt/model"]["name"].as_str().unwrap()]["persistentVolumeClaim"],
            json!({"claimName": "llama-7b", "readOnly": true})
        );
        assert_eq!(vols["trainyard-ssh"]["secret"]["secretName"], format!("{name}-ssh"));

        // Exit checkpoint: the hook, and time for it plus the grace period.
        let hook = c["lifecycle"]["preStop"]["exec"]["command"][2].as_str().unwrap();
        assert!(
            hook.contains("checkpoint-requested")
                && hook.contains("checkpoint-done")
                && hook.contains("kill -s USR1")
        );
        assert!(hook.contains("sig=10; timeout=120"), "{hook}");
        assert_eq!(pod["terminationGracePeriodSeconds"], 125);

        // The precheck: the local program, with the distributed variables the operator leaves out of init
        // containers, its rank from the replica index.
        let init = &pod["initContainers"][0];
        assert_eq!(init["name"], "trainyard-precheck");
        assert_eq!(init["image"], c["image"]);
        assert_eq!(init["resources"], c["resources"]);
        assert_eq!(init["command"][4], trainyard_runtime::replica::PRECHECK_PY);
        let script = init["command"][2].as_str().unwrap();
        assert!(
            script.contains("--out /dev/termination-log --timeout-s 120 --min-gemm-gflops 100000"),
            "{script}"
        );
        let offset = if role == "master" { 0 } else { 1 };
        assert!(script.contains(&format!("RANK=$((TRAINYARD_REPLICA_INDEX + {offset}))")), "{script}");
        let ienv = env_of(init);
        assert_eq!(ienv["MASTER_ADDR"]["value"], format!("{name}-precheck"));
        assert_eq!(ienv["MASTER_PORT"]["value"], "29500");
        assert_eq!(ienv["WORLD_SIZE"]["value"], "3");
        assert_eq!(ienv["NCCL_DEBUG"]["value"], "INFO");
        assert_eq!(ienv["PRE_KEY"]["valueFrom"]["secretKeyRef"]["key"], "precheck.PRE_KEY");
        assert_eq!(
            ienv["TRAINYARD_REPLICA_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.labels['training.kubeflow.org/replica-index']"
        );
    }

    // The Secret holds the hidden values, base64 as Kubernetes keeps them; no object shows them in clear.
    let secret = o.secret.as_ref().unwrap();
    assert_eq!(secret["metadata"]["name"], format!("{name}-env"));
    assert_eq!(secret["metadata"]["labels"], want_labels);
    assert_eq!(secret["data"]["env.HF_TOKEN"], base64(b"s3cret-token"));
    assert_eq!(secret["data"]["precheck.PRE_KEY"], base64(b"pk"));
    for obj in [&o.job, o.ssh_secret.as_ref().unwrap(), o.precheck_service.as_ref().unwrap()] {
        assert!(!obj.to_string().contains("s3cret-token"));
    }

    // The precheck's Service publishes the master before it is ready.
    let svc = o.precheck_service.as_ref().unwrap();
    assert_eq!(svc["metadata"]["name"], format!("{name}-precheck"));
    assert_eq!(svc["spec"]["publishNotReadyAddresses"], true);
    assert_eq!(
        svc["spec"]["selector"],
        json!({"training.kubeflow.org/job-name": name, "training.kubeflow.org/replica-type": "master"})
    );

    // SSH: the keys, and the hostfiles naming the operator's pods.
    let ssh = o.ssh_secret.as_ref().unwrap();
    assert_eq!(ssh["data"]["authorized_keys"], base64(b"ssh-ed25519 AAAAC3 trainyard\n"));
    assert_eq!(ssh["data"]["host_ed25519"], base64(keys().host_key.as_bytes()));
    let wrapper = template(job, "Worker")["spec"]["containers"][0]["command"][2].as_str().unwrap();
    assert!(wrapper.contains(&format!(
        "printf '%s\\n' '{name}-master-0 slots=2' '{name}-worker-0 slots=2' '{name}-worker-1 slots=2' > \"$home/hostfile\""
    )), "{wrapper}");
    assert!(wrapper.contains("home=/root\n"), "{wrapper}");
    assert!(
        wrapper.contains(&format!(
            "{name}-master-0 {name}-worker-0 {name}-worker-1 > \"$home/hostfile.hostname\""
        ))
    );
    assert!(wrapper.contains("/usr/sbin/sshd -f /etc/trainyard/ssh/sshd_config"));
    assert!(o.pod_group.is_none());
}

#[test]
fn a_plain_pytorchjob_has_no_extras() {
    let mut spec = spec("PyTorchJob", 0, json!({}));
    spec.task.spec.environment.env.retain(|e| !e.hidden);
    let o = attempt_objects(&spec, &settings(), None).unwrap();
    assert!(o.secret.is_none() && o.ssh_secret.is_none() && o.precheck_service.is_none());
    assert!(o.job["spec"]["pytorchReplicaSpecs"].get("Worker").is_none());
    let pod = &template(&o.job, "Master")["spec"];
    assert!(pod.get("initContainers").is_none());
    assert!(pod["containers"][0].get("lifecycle").is_none());
    assert_eq!(pod["terminationGracePeriodSeconds"], 5);
    assert!(!pod["containers"][0]["command"][2].as_str().unwrap().contains("sshd"));
    // One process per replica of 2 GPUs unless the task says otherwise: the GPU count.
    assert_eq!(o.job["spec"]["nprocPerNode"], "2");
    // The job and its NetworkPolicy, nothing else.
    assert_eq!(o.all().len(), 2);
    assert!(o.network_policy.is_some());
}

#[test]
fn rayjob_with_workers_runtime_env_and_tmp_ray() {
    let spec = spec(
        "RayJob",
        3,
        json!({"ray": {"runtimeEnvYaml": "pip: [emoji]\nenv_vars: {A: b}\n", "debug": {"enabled": true, "retentionSeconds": 900}}}),
    );
    let o = attempt_objects(&spec, &settings(), None).unwrap();
    let job = &o.job;
    assert_eq!(job["apiVersion"], "ray.io/v1");
    assert_eq!(job["kind"], "RayJob");
    let s = &job["spec"];
    assert_eq!(s["entrypoint"], r#"bash -c 'torchrun train.py --lr '\''a b'\'''"#);
    assert_eq!(s["runtimeEnvYAML"], "pip: [emoji]\nenv_vars: {A: b}\n");
    assert_eq!(s["shutdownAfterJobFinishes"], true);
    assert_eq!(s["ttlSecondsAfterFinished"], 900);
    assert_eq!(s["submissionMode"], "HTTPMode");
    // The driver's submission id is the job's name: its output is read by that name.
    assert_eq!(s["jobId"], job_name(&spec.key));
    assert!(s.get("submitterPodTemplate").is_none(), "no pod beyond the ones Trainyard placed");
    let cluster = &s["rayClusterSpec"];
    // The catalog does not say which Ray the image has: no token (KubeRay would refuse it without the version).
    assert!(cluster.get("authOptions").is_none() && cluster.get("rayVersion").is_none());
    let mut with_version = spec.clone();
    let mut catalog = (*with_version.catalog).clone();
    catalog.images.get_mut("ray").unwrap().ray_version = Some("2.60.0".into());
    with_version.catalog = Arc::new(catalog.clone());
    let o2 = attempt_objects(&with_version, &settings(), None).unwrap();
    let c2 = &o2.job["spec"]["rayClusterSpec"];
    assert_eq!(c2["authOptions"], json!({"mode": "token"}), "no pod but the cluster's own reaches it");
    assert_eq!(c2["rayVersion"], "2.60.0");
    catalog.images.get_mut("ray").unwrap().ray_version = Some("2.46.0".into());
    with_version.catalog = Arc::new(catalog);
    let o3 = attempt_objects(&with_version, &settings(), None).unwrap();
    assert!(
        o3.job["spec"]["rayClusterSpec"].get("authOptions").is_none(),
        "Ray before 2.52 has no token auth"
    );
    assert_eq!(cluster["enableInTreeAutoscaling"], false);
    let wg = &cluster["workerGroupSpecs"][0];
    assert_eq!(
        (wg["replicas"].as_u64(), wg["minReplicas"].as_u64(), wg["maxReplicas"].as_u64()),
        (Some(3), Some(3), Some(3))
    );
    let head = &cluster["headGroupSpec"]["template"];
    let worker = &wg["template"];
    assert_eq!(affinity_nodes(head), ["node-a"]);
    assert_eq!(affinity_nodes(worker), ["node-a", "node-b"]);
    for (t, role) in [(head, "head"), (worker, "worker")] {
        let c = &t["spec"]["containers"][0];
        assert_eq!(c["name"], format!("ray-{role}"));
        assert_eq!(c["image"], "rayproject/ray:2.46.0-gpu");
        assert!(c.get("command").is_none(), "KubeRay writes the command");
        let tmp =
            c["volumeMounts"].as_array().unwrap().iter().find(|m| m["mountPath"] == "/tmp/ray").unwrap();
        let vol = t["spec"]["volumes"].as_array().unwrap().iter().find(|v| v["name"] == tmp["name"]).unwrap();
        assert_eq!(vol["emptyDir"], json!({}));
        let env = env_of(c);
        assert!(!env.contains_key("RAY_ADDRESS") && !env.contains_key("RAY_JOB_CONFIG_JSON_ENV_VAR"));
        assert_eq!(env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["key"], "env.HF_TOKEN");
        assert!(t["spec"].get("initContainers").is_none(), "a RayJob has no precheck");
        assert_eq!(t["metadata"]["labels"]["sim.trainyard.dev/run-ms"], "1500");
    }

    // Without debug retention the Ray cluster stays just long enough for the driver's last output.
    let plain = attempt_objects(&spec_with_shared_storage(), &settings(), None).unwrap();
    assert_eq!(plain.job["spec"]["ttlSecondsAfterFinished"], DRIVER_DRAIN_S);

    // Shared storage: the volume's claim at /tmp/ray, in the task's own directory.
    let shared = spec_with_shared_storage();
    let o = attempt_objects(&shared, &settings(), None).unwrap();
    let head = &o.job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"];
    let tmp = head["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/tmp/ray")
        .unwrap();
    assert_eq!(tmp["subPath"], "ray-bert-x1y2z");
    let vol = head["volumes"].as_array().unwrap().iter().find(|v| v["name"] == tmp["name"]).unwrap();
    assert_eq!(vol["persistentVolumeClaim"]["claimName"], "ckpt");
}

fn spec_with_shared_storage() -> LaunchSpec {
    spec("RayJob", 1, json!({"ray": {"sharedStorage": {"volume": "ckpt"}}}))
}

#[test]
fn gang_admission_on_the_cluster_side() {
    let spec = pytorch_spec();
    let volcano = KubeSettings { gang: Gang::Volcano { queue: Some("research".into()) }, ..settings() };
    let o = attempt_objects(&spec, &volcano, Some(&keys())).unwrap();
    let pg = o.pod_group.as_ref().unwrap();
    assert_eq!(pg["apiVersion"], "scheduling.volcano.sh/v1beta1");
    assert_eq!(pg["metadata"]["name"], "ty-0190a5b2c3d4e5f6-a2");
    assert_eq!(pg["spec"], json!({"minMember": 3, "queue": "research"}));
    for kind in ["Master", "Worker"] {
        let t = template(&o.job, kind);
        assert_eq!(t["spec"]["schedulerName"], "volcano");
        assert_eq!(t["metadata"]["annotations"]["scheduling.k8s.io/group-name"], "ty-0190a5b2c3d4e5f6-a2");
    }
    assert!(o.job["spec"]["runPolicy"].get("suspend").is_none());

    let kueue = KubeSettings { gang: Gang::Kueue { local_queue: "team-a".into() }, ..settings() };
    let o = attempt_objects(&spec, &kueue, Some(&keys())).unwrap();
    assert!(o.pod_group.is_none());
    assert_eq!(o.job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "team-a");
    assert_eq!(o.job["spec"]["runPolicy"]["suspend"], true);
    let ray = attempt_objects(&self::spec("RayJob", 1, json!({})), &kueue, None).unwrap();
    assert_eq!(ray.job["spec"]["suspend"], true);
    assert_eq!(ray.job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "team-a");
}

#[test]
fn what_cannot_be_mapped_is_refused_with_every_reason() {
    let mut spec = pytorch_spec();
    spec.task.spec.environment.image = "host".into();
    spec.task.spec.environment.volumes[0].volume = "Bad_Name".into();
    let errs = attempt_objects(&spec, &settings(), None).unwrap_err();
    assert_eq!(errs.len(), 3, "{errs:?}");
    assert!(errs[0].contains("`host` image"), "{errs:?}");
    assert!(errs.iter().any(|e| e.contains("SSH keys")));
    assert!(errs.iter().any(|e| e.contains("\"Bad_Name\"")));

    let mut spec = pytorch_spec();
    spec.task.spec.environment.image = "cuda".into();
    let errs = attempt_objects(&spec, &KubeSettings::default(), Some(&keys())).unwrap_err();
    assert!(errs[0].contains("\"cuda\" has no image reference"), "{errs:?}");
    // A catalog image's own reference.
    let mut catalog = (*spec.catalog).clone();
    catalog.images.get_mut("cuda").unwrap().reference = Some("registry.example/ml/cuda:12".into());
    spec.catalog = Arc::new(catalog);
    let o = attempt_objects(&spec, &KubeSettings::default(), Some(&keys())).unwrap();
    assert_eq!(template(&o.job, "Master")["spec"]["containers"][0]["image"], "registry.example/ml/cuda:12");
    // An image outside the catalog is a reference already.
    spec.task.spec.environment.image = "ghcr.io/me/train:1".into();
    let o = attempt_objects(&spec, &KubeSettings::default(), Some(&keys())).unwrap();
    assert_eq!(template(&o.job, "Master")["spec"]["containers"][0]["image"], "ghcr.io/me/train:1");
}

#[test]
fn job_names_fit_every_derived_name() {
    let check = |id: &str, attempt: i64| {
        let key = AttemptKey { task_id: id.into(), attempt };
        let name = job_name(&key);
        assert!(name.len() <= JOB_NAME_MAX, "{name}");
        assert!(
            name.starts_with("ty-")
                && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        );
        assert!(!name.ends_with('-') && !name.contains("--"), "{name}");
        // The operators' names: PyTorchJob pods and Services, KubeRay's cluster, head Service and pods.
        for derived in [
            format!("{name}-worker-{}", trainyard_core::validate::limits::WORKERS_MAX - 1),
            format!("{name}-precheck"),
            format!("{name}-abcde-head-svc"),
        ] {
            assert!(derived.len() <= 63, "{derived} is {} characters", derived.len());
        }
        assert_eq!(job_name(&key), name, "deterministic");
        name
    };
    assert_eq!(check("0190a5b2c3d4e5f6", 1), "ty-0190a5b2c3d4e5f6-a1");
    let long = check(&"A_b".repeat(100), i64::MAX);
    let other = check(&format!("{}c", "A_b".repeat(100)), i64::MAX);
    assert_ne!(long, other, "a hash of the whole id keeps shortened names apart");
    check("UPPER", 3);
    check("!!!", 0);
    assert_ne!(check("t.1", 1), check("t-1", 1));

    let key = AttemptKey { task_id: "0190a5b2c3d4e5f6".into(), attempt: 4 };
    assert_eq!(
        attempt_selector(&key),
        "app.kubernetes.io/managed-by=trainyard,trainyard.dev/task=0190a5b2c3d4e5f6,trainyard.dev/attempt=4"
    );
    assert!(attempt_selector(&key).starts_with(MANAGED_SELECTOR));
}

#[test]
fn label_values_and_keys() {
    assert_eq!(label_value("vision"), "vision");
    let v = label_value("Vision Team/α");
    assert!(is_label_value(&v) && v.starts_with("Vision-Team"), "{v}");
    assert!(is_label_value(&label_value(&"x".repeat(100))));
    assert!(is_label_key("sim.trainyard.dev/run-ms") && is_label_key("team"));
    assert!(
        reserved_label(INSTANCE_LABEL) && reserved_label(MANAGED_BY_LABEL),
        "a task cannot hand its pods over"
    );
    assert!(reserved_label("node-role.kubernetes.io/x") && reserved_label("k8s.io/x"));
    assert!(!reserved_label("team") && !reserved_label("sim.trainyard.dev/run-ms"));
    assert!(!is_label_key("bad key!") && !is_label_key("UPPER.dev/x") && !is_label_key("/x"));
    // A raw id that had to change is kept in an annotation.
    let mut spec = pytorch_spec();
    spec.key.task_id = "Task 7".into();
    spec.task.metadata.project_group = "vision".into();
    let o = attempt_objects(&spec, &settings(), Some(&keys())).unwrap();
    assert_eq!(o.job["metadata"]["annotations"]["trainyard.dev/task-id"], "Task 7");
    assert!(is_label_value(o.job["metadata"]["labels"]["trainyard.dev/task"].as_str().unwrap()));
}

#[test]
fn base64_matches_the_standard_alphabet() {
    assert_eq!(base64(b""), "");
    assert_eq!(base64(b"f"), "Zg==");
    assert_eq!(base64(b"fo"), "Zm8=");
    assert_eq!(base64(b"foo"), "Zm9v");
    assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    assert_eq!(base64(&[0xff, 0xfe, 0x00]), "//4A");
}

// ---- the CRD schemas ----------------------------------------------------------------------------------

/// A CRD's `openAPIV3Schema` for one version.
struct Crd {
    group: String,
    kind: String,
    versions: BTreeMap<String, Value>,
}

fn crd(file: &str) -> Crd {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/crds").join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let doc: Value = serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let spec = &doc["spec"];
    Crd {
        group: spec["group"].as_str().unwrap().to_owned(),
        kind: spec["names"]["kind"].as_str().unwrap().to_owned(),
        versions: spec["versions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["served"] == true)
            .map(|v| (v["name"].as_str().unwrap().to_owned(), v["schema"]["openAPIV3Schema"].clone()))
            .collect(),
    }
}

impl Crd {
    /// Every way `obj` breaks the schema of its version, with field paths.
    fn problems(&self, obj: &Value) -> Vec<String> {
        let (group, version) = obj["apiVersion"].as_str().unwrap_or("").split_once('/').unwrap_or(("", ""));
        if group != self.group || obj["kind"] != self.kind.as_str() {
            return vec![format!(
                "{} {} is not a {}/{}",
                obj["apiVersion"], obj["kind"], self.group, self.kind
            )];
        }
        let Some(schema) = self.versions.get(version) else {
            return vec![format!("version {version} is not served")];
        };
        let mut out = Vec::new();
        // The API server checks an object's own metadata itself (name, labels): not the CRD's schema.
        let mut body = obj.clone();
        body.as_object_mut().unwrap().remove("metadata");
        check_schema(schema, &body, "", &mut out);
        out
    }
}

/// A structural check as the API server applies a CRD's schema: types, `required`, `enum`, maps,
/// int-or-string; and a field the schema does not name is refused (the server would silently drop it)
/// unless the schema keeps unknown fields.
fn check_schema(schema: &Value, v: &Value, path: &str, out: &mut Vec<String>) {
    let at = if path.is_empty() { "." } else { path };
    if v.is_null() {
        if schema["nullable"] != true {
            out.push(format!("{at}: null"));
        }
        return;
    }
    if schema["x-kubernetes-int-or-string"] == true {
        if !(v.is_i64() || v.is_u64() || v.is_string()) {
            out.push(format!("{at}: {v} is neither an integer nor a string"));
        }
        return;
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(v)
    {
        out.push(format!("{at}: {v} is not one of {}", Value::Array(allowed.clone())));
    }
    let preserve = schema["x-kubernetes-preserve-unknown-fields"] == true;
    match schema["type"].as_str() {
        Some("object") => {
            let Some(map) = v.as_object() else { return out.push(format!("{at}: {v} is not an object")) };
            for r in schema["required"].as_array().into_iter().flatten() {
                if !map.contains_key(r.as_str().unwrap_or("")) {
                    out.push(format!("{at}: {r} is required"));
                }
            }
            for (k, item) in map {
                let p = format!("{path}.{k}");
                if let Some(s) = schema["properties"].get(k) {
                    check_schema(s, item, &p, out);
                } else if let Some(s) = schema.get("additionalProperties").filter(|s| s.is_object()) {
                    check_schema(s, item, &p, out);
                } else if !preserve {
                    out.push(format!("{p}: unknown field"));
                }
            }
        }
        Some("array") => {
            let Some(items) = v.as_array() else { return out.push(format!("{at}: {v} is not an array")) };
            for (i, item) in items.iter().enumerate() {
                check_schema(&schema["items"], item, &format!("{path}[{i}]"), out);
            }
        }
        Some("string") if !v.is_string() => out.push(format!("{at}: {v} is not a string")),
        Some("integer") if !(v.is_i64() || v.is_u64()) => out.push(format!("{at}: {v} is not an integer")),
        Some("number") if !v.is_number() => out.push(format!("{at}: {v} is not a number")),
        Some("boolean") if !v.is_boolean() => out.push(format!("{at}: {v} is not a boolean")),
        _ => {}
    }
}

#[test]
fn every_object_passes_the_operators_crds() {
    let (pytorch, ray, podgroup) = (
        crd("kubeflow.org_pytorchjobs.yaml"),
        crd("ray.io_rayjobs.yaml"),
        crd("scheduling.volcano.sh_podgroups.yaml"),
    );
    let gangs = [
        Gang::Off,
        Gang::Volcano { queue: Some("q".into()) },
        Gang::Volcano { queue: None },
        Gang::Kueue { local_queue: "lq".into() },
    ];
    let specs = [
        pytorch_spec(),
        spec("PyTorchJob", 0, json!({})),
        spec("RayJob", 3, json!({"ray": {"runtimeEnvYaml": "pip: [emoji]"}})),
        spec("RayJob", 0, json!({})),
        spec_with_shared_storage(),
    ];
    let mut checked = 0;
    for gang in gangs {
        let s = KubeSettings { gang, ..settings() };
        for spec in &specs {
            let o = attempt_objects(spec, &s, Some(&keys())).unwrap();
            let crd = if o.job["kind"] == "RayJob" { &ray } else { &pytorch };
            assert_eq!(crd.problems(&o.job), Vec::<String>::new(), "{}", o.job);
            checked += 1;
            if let Some(pg) = &o.pod_group {
                assert_eq!(podgroup.problems(pg), Vec::<String>::new());
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 4 * 5 + 2 * 5);
}

#[test]
fn the_schema_check_catches_broken_objects() {
    let pytorch = crd("kubeflow.org_pytorchjobs.yaml");
    let good = attempt_objects(&pytorch_spec(), &settings(), Some(&keys())).unwrap().job;
    assert!(pytorch.problems(&good).is_empty());

    let mut bad = good.clone();
    bad["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "two".into();
    assert_eq!(
        pytorch.problems(&bad),
        [r#".spec.pytorchReplicaSpecs.Worker.replicas: "two" is not an integer"#]
    );

    let mut bad = good.clone();
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["terminationGracePeriodSeconds"] =
        "125".into();
    bad["spec"]["runPolicy"]["cleanUpEverything"] = true.into();
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("name");
    let p = pytorch.problems(&bad);
    assert_eq!(p.len(), 3, "{p:?}");
    assert!(p.contains(&r#".spec.pytorchReplicaSpecs.Master.template.spec.terminationGracePeriodSeconds: "125" is not an integer"#.to_owned()), "{p:?}");
    assert!(p.contains(&".spec.runPolicy.cleanUpEverything: unknown field".to_owned()), "{p:?}");
    assert!(
        p.contains(
            &".spec.pytorchReplicaSpecs.Master.template.spec.containers[0]: \"name\" is required".to_owned()
        ),
        "{p:?}"
    );

    let ray = crd("ray.io_rayjobs.yaml");
    let mut bad = attempt_objects(&spec("RayJob", 1, json!({})), &settings(), None).unwrap().job;
    assert!(ray.problems(&bad).is_empty());
    bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "two".into();
    assert_eq!(
        ray.problems(&bad),
        [r#".spec.rayClusterSpec.workerGroupSpecs[0].replicas: "two" is not an integer"#]
    );
    assert_eq!(ray.problems(&good).len(), 1, "a PyTorchJob is no RayJob");
}

#[test]
fn the_generated_shell_scripts_parse() {
    let o = attempt_objects(&pytorch_spec(), &settings(), Some(&keys())).unwrap();
    let pod = &template(&o.job, "Worker")["spec"];
    // And the wrapper of an image that runs as a user of its own.
    let mut user = pytorch_spec();
    let mut catalog = (*user.catalog).clone();
    catalog.images.get_mut("cuda").unwrap().run_as_user = Some(1000);
    user.catalog = Arc::new(catalog);
    let u = attempt_objects(&user, &settings(), Some(&keys())).unwrap();
    let scripts = [
        &pod["containers"][0]["command"][2],
        &pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][2],
        &pod["initContainers"][0]["command"][2],
        &template(&u.job, "Worker")["spec"]["containers"][0]["command"][2],
    ];
    for script in scripts {
        let script = script.as_str().unwrap();
        // `bash -n`: read and parse only, nothing runs.
        let out = std::process::Command::new("bash").args(["-n", "-c", script]).output().unwrap();
        assert!(out.status.success(), "{script}\n{}", String::from_utf8_lossy(&out.stderr));
    }
    // The entrypoint of a RayJob runs the cmd as one word, whatever quotes it holds.
    let ray = attempt_objects(&spec("RayJob", 0, json!({})), &settings(), None).unwrap();
    let entry = ray.job["spec"]["entrypoint"].as_str().unwrap();
    let out = std::process::Command::new("bash")
        .args(["-c", &entry.replacen("bash -c", "printf %s", 1)])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "torchrun train.py --lr 'a b'");
}

/// The hook's `say` lines, as its script words them, are the local supervisor's checkpoint events; anything
/// else a program prints is not.
#[test]
fn the_pre_stop_hooks_lines_are_the_checkpoint_events() {
    use trainyard_core::lifecycle::Reason;
    let script = pre_stop_script(30, CheckpointSignal::Sigusr1);
    // What `say` prints for each step, with the script's own words (a change of wording must change both).
    let said = |what: &str| format!("trainyard: pod-a: {what}");
    let sent = "sent SIGUSR1 to 2 process(es) that handle it and wrote /run/trainyard/checkpoint-requested; waiting up to 30 s";
    assert!(
        script.contains(
            "say \"sent SIGUSR1 to $told process(es) that handle it and wrote $rt/checkpoint-requested"
        ),
        "{script}"
    );
    assert!(
        script.contains("say \"checkpoint reported done after ")
            && script.contains("say \"no checkpoint-done within "),
        "{script}"
    );
    assert_eq!(hook_line(&said(sent)).map(|(r, _)| r), Some(Reason::CheckpointRequested));
    assert_eq!(
        hook_line(&said("checkpoint reported done after 3 s")),
        Some((Reason::CheckpointDone, "pod-a: checkpoint reported done after 3 s".to_owned()))
    );
    assert_eq!(
        hook_line(&said("no checkpoint-done within 30 s; terminating")).map(|(r, _)| r),
        Some(Reason::CheckpointTimedOut)
    );
    for other in ["sent SIGUSR1 to everyone", "trainyard: sshd did not start: x", "epoch 3 loss 0.2", ""] {
        assert_eq!(hook_line(other), None, "{other}");
    }
}

/// A pool's tolerations (its nodes' taints, as the catalog says) are on every pod of the pool; a GPU pod
/// tolerates its GPU resource's taint whatever the catalog says (GPU node pools are tainted so), once.
#[test]
fn a_pools_tolerations_are_on_each_of_its_pods() {
    let mut spec = spec("PyTorchJob", 1, json!({}));
    let gpu_taint = json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"});
    let o = attempt_objects(&spec, &settings(), Some(&keys())).unwrap();
    assert_eq!(template(&o.job, "Master")["spec"]["tolerations"], json!([gpu_taint]));
    assert!(template(&o.job, "Master")["spec"].get("nodeSelector").is_none());
    let mut catalog = (*spec.catalog).clone();
    catalog.pools.get_mut("gpu").unwrap().tolerations = serde_json::from_value(json!([
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "value": "ml"},
    ]))
    .unwrap();
    assert!(catalog.check().is_empty(), "{:?}", catalog.check());
    spec.catalog = Arc::new(catalog);
    let o = attempt_objects(&spec, &settings(), Some(&keys())).unwrap();
    let want = json!([gpu_taint, {"key": "dedicated", "value": "ml"}]);
    for role in ["Master", "Worker"] {
        assert_eq!(template(&o.job, role)["spec"]["tolerations"], want, "{role}");
    }
}

/// Issue 32: a spec's GPU resource name (AMD, a MIG slice), its extra resources per unit (RDMA, EFA), and the
/// node selectors and tolerations of its pool and of itself, on every pod; a CPU pod tolerates no GPU taint.
#[test]
fn a_specs_gpu_resource_extra_resources_and_node_terms_are_on_its_pods() {
    let mut spec = pytorch_spec();
    let mut catalog = (*spec.catalog).clone();
    let pool = catalog.pools.get_mut("gpu").unwrap();
    pool.node_selector = [("trainyard.dev/pool".to_owned(), "gpu".to_owned())].into();
    pool.tolerations = serde_json::from_value(json!([{"key": "dedicated", "value": "ml"}])).unwrap();
    let a100 = catalog.instance_specs.get_mut("a100.1").unwrap();
    a100.gpu_resource = Some("amd.com/gpu".into());
    a100.extra_resources =
        [("rdma/hca_shared_devices_a".to_owned(), 1), ("vpc.amazonaws.com/efa".to_owned(), 2)].into();
    a100.node_selector = [("amd.com/gpu.product".to_owned(), "MI300X".to_owned())].into();
    a100.tolerations = serde_json::from_value(json!([{"key": "amd.com/gpu", "operator": "Exists"}])).unwrap();
    assert!(catalog.check().is_empty(), "{:?}", catalog.check());
    spec.catalog = Arc::new(catalog);
    let o = attempt_objects(&spec, &settings(), Some(&keys())).unwrap();
    for role in ["Master", "Worker"] {
        let pod = &template(&o.job, role)["spec"];
        let main = &pod["containers"][0];
        // countPerNode 2: two units, so twice the extra resources; the GPUs are the plan's.
        let want = json!({"cpu": "16", "memory": "131072Mi", "amd.com/gpu": "2",
                          "rdma/hca_shared_devices_a": "2", "vpc.amazonaws.com/efa": "4"});
        assert_eq!(main["resources"]["requests"], want, "{role}");
        assert_eq!(main["resources"]["limits"], want, "{role}");
        assert!(main["resources"]["requests"].get("nvidia.com/gpu").is_none());
        assert_eq!(
            pod["nodeSelector"],
            json!({"trainyard.dev/pool": "gpu", "amd.com/gpu.product": "MI300X"})
        );
        assert_eq!(
            pod["tolerations"],
            json!([
                {"key": "dedicated", "value": "ml"},
                {"key": "amd.com/gpu", "operator": "Exists"},
                {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            ]),
            "{role}"
        );
        // The precheck's init container asks for the same devices (it runs on them).
        assert_eq!(pod["initContainers"][0]["resources"]["requests"], want, "{role}");
    }
    validate("pytorchjob", &o.job);

    // A CPU spec: no GPU resource, no GPU toleration.
    let cpu = Catalog::from_yaml(&CATALOG.replace(
        "a100.1: {kind: GPU, gpuModel: A100, gpus: 1, vcpus: 8, memoryMib: 65536}",
        "a100.1: {kind: CPU, vcpus: 8, memoryMib: 65536}",
    ))
    .unwrap();
    let mut spec = spec_with_catalog(cpu);
    for r in &mut spec.replicas {
        r.resources.gpus = 0;
    }
    let o = attempt_objects(&spec, &settings(), Some(&keys())).unwrap();
    let pod = &template(&o.job, "Master")["spec"];
    assert!(pod.get("tolerations").is_none(), "{pod}");
    assert_eq!(pod["containers"][0]["resources"]["requests"], json!({"cpu": "16", "memory": "131072Mi"}));
}

/// What the catalog refuses of the Kubernetes fields: a GPU resource on a CPU spec or in Kubernetes' own
/// domain, an unqualified extra resource, a zero count, a selector that is not a label, a root runAsUser.
#[test]
fn the_catalog_refuses_what_a_cluster_would() {
    let bad = CATALOG
        .replace(
            "a100.1: {kind: GPU, gpuModel: A100, gpus: 1, vcpus: 8, memoryMib: 65536}",
            "a100.1: {kind: GPU, gpuModel: A100, gpus: 1, vcpus: 8, memoryMib: 65536, gpuResource: kubernetes.io/gpu, \
             extraResources: {efa: 1, rdma/hca: 0, nvidia.com/gpu: 1}, nodeSelector: {\"bad key!\": x}}, \
             cpu.1: {kind: CPU, vcpus: 1, memoryMib: 1024, gpuResource: amd.com/gpu}",
        )
        .replace("images: {cuda: {torch: true}", "images: {cuda: {torch: true, runAsUser: 0}, plain: {runAsGroup: 5}");
    let Err(trainyard_core::catalog::CatalogError::Inconsistent(problems)) = Catalog::from_yaml(&bad) else {
        panic!("accepted: {bad}")
    };
    let text = problems.join("\n");
    for want in [
        "instance spec a100.1: gpuResource: \"kubernetes.io/gpu\" is in a domain Kubernetes keeps",
        "instance spec a100.1: extraResources: \"efa\" is not an extended resource",
        "instance spec a100.1: extraResources: \"rdma/hca\" must be at least 1",
        "instance spec a100.1: nodeSelector bad key!=\"x\" is not a valid Kubernetes label",
        "instance spec cpu.1: gpuResource \"amd.com/gpu\" on a spec without GPUs",
        "image cuda: runAsUser 0 is root",
        "image plain: runAsGroup goes with runAsUser",
    ] {
        assert!(text.contains(want), "{want}\nin:\n{text}");
    }
    // nvidia.com/gpu is not the spec's GPU resource here (kubernetes.io/gpu is), so it may be an extra one.
    assert!(!text.contains("is the spec's GPUs"), "{text}");
}

/// Issue 32: every pod passes Pod Security `baseline` (no privilege, no host namespaces or paths, the runtime's
/// seccomp profile); an image the catalog gives a user of its own passes `restricted` too: non-root, every
/// capability dropped, no privilege escalation, and SSH as that user on a port it may bind.
#[test]
fn pods_pass_pod_security_baseline_and_restricted_where_the_image_has_a_user() {
    /// What Pod Security's levels check of a pod spec, as far as Trainyard's pods could break them.
    fn violations(pod: &Value, restricted: bool) -> Vec<String> {
        let mut out = Vec::new();
        for k in ["hostNetwork", "hostPID", "hostIPC"] {
            if pod[k] == true {
                out.push(k.to_owned());
            }
        }
        for v in pod["volumes"].as_array().unwrap() {
            let kind = v.as_object().unwrap().keys().find(|k| *k != "name").unwrap().clone();
            if kind == "hostPath"
                || (restricted
                    && ![
                        "emptyDir",
                        "persistentVolumeClaim",
                        "secret",
                        "configMap",
                        "projected",
                        "downwardAPI",
                        "csi",
                        "ephemeral",
                    ]
                    .contains(&kind.as_str()))
            {
                out.push(format!("volume {kind}"));
            }
        }
        let pod_sc = &pod["securityContext"];
        if pod_sc["seccompProfile"]["type"] != "RuntimeDefault" {
            out.push("seccompProfile".into());
        }
        let containers = pod["containers"]
            .as_array()
            .unwrap()
            .iter()
            .chain(pod["initContainers"].as_array().into_iter().flatten());
        for c in containers {
            let sc = &c["securityContext"];
            if sc["privileged"] == true {
                out.push("privileged".into());
            }
            if c.get("ports")
                .into_iter()
                .flat_map(|p| p.as_array().unwrap())
                .any(|p| p.get("hostPort").is_some())
            {
                out.push("hostPort".into());
            }
            if let Some(add) = sc["capabilities"]["add"].as_array() {
                out.push(format!("capabilities add {add:?}"));
            }
            if restricted {
                if sc["allowPrivilegeEscalation"] != false {
                    out.push(format!("{}: allowPrivilegeEscalation", c["name"]));
                }
                if sc["capabilities"]["drop"] != json!(["ALL"]) {
                    out.push(format!("{}: capabilities drop ALL", c["name"]));
                }
                if pod_sc["runAsNonRoot"] != true && sc["runAsNonRoot"] != true {
                    out.push(format!("{}: runAsNonRoot", c["name"]));
                }
                if pod_sc["runAsUser"] == 0 || sc["runAsUser"] == 0 {
                    out.push(format!("{}: runAsUser 0", c["name"]));
                }
            }
        }
        out
    }
    let root = pytorch_spec();
    let o = attempt_objects(&root, &settings(), Some(&keys())).unwrap();
    for role in ["Master", "Worker"] {
        let pod = &template(&o.job, role)["spec"];
        assert_eq!(violations(pod, false), Vec::<String>::new(), "baseline {role}: {pod}");
        assert!(!violations(pod, true).is_empty(), "a root image is not restricted");
        assert_eq!(pod["containers"][0]["securityContext"], json!({"allowPrivilegeEscalation": false}));
    }

    let mut user = pytorch_spec();
    let mut catalog = (*user.catalog).clone();
    let cuda = catalog.images.get_mut("cuda").unwrap();
    cuda.run_as_user = Some(1000);
    cuda.run_as_group = Some(1000);
    user.catalog = Arc::new(catalog);
    let o = attempt_objects(&user, &settings(), Some(&keys())).unwrap();
    for role in ["Master", "Worker"] {
        let pod = &template(&o.job, role)["spec"];
        assert_eq!(violations(pod, true), Vec::<String>::new(), "restricted {role}: {pod}");
        assert_eq!(pod["securityContext"]["runAsUser"], 1000);
        assert_eq!(pod["securityContext"]["fsGroup"], 1000);
        let wrapper = pod["containers"][0]["command"][2].as_str().unwrap();
        assert!(!wrapper.contains("/root/.ssh") && wrapper.contains("\"$home/.ssh\""), "{wrapper}");
        assert!(wrapper.contains(SSH_USER_DIR) && !wrapper.contains("/run/sshd"), "{wrapper}");
        let ssh = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "trainyard-ssh").unwrap();
        assert_eq!(ssh["secret"]["defaultMode"], 0o444, "readable by the image's user");
    }
    validate("pytorchjob", &o.job);
    let secret = o.ssh_secret.unwrap();
    let text = |k: &str| String::from_utf8(decode64(secret["data"][k].as_str().unwrap())).unwrap();
    assert!(text("sshd_config").contains(&format!("Port {SSH_USER_PORT}\n")), "{}", text("sshd_config"));
    assert!(text("sshd_config").contains(&format!("HostKey {SSH_USER_DIR}/host_ed25519")));
    assert!(
        text("config").contains(&format!("Port {SSH_USER_PORT}")) && !text("config").contains("User root")
    );
    // As root: port 22, root's keys.
    let root_secret = attempt_objects(&root, &settings(), Some(&keys())).unwrap().ssh_secret.unwrap();
    let sshd = String::from_utf8(decode64(root_secret["data"]["sshd_config"].as_str().unwrap())).unwrap();
    assert!(sshd.contains("Port 22\n") && sshd.contains("/root/.ssh/authorized_keys"), "{sshd}");

    // A RayJob of a user image: KubeRay's containers get the same contexts.
    let mut ray = spec("RayJob", 1, json!({}));
    let mut catalog = (*ray.catalog).clone();
    catalog.images.get_mut("ray").unwrap().run_as_user = Some(1000);
    ray.catalog = Arc::new(catalog);
    let o = attempt_objects(&ray, &settings(), None).unwrap();
    let head = &o.job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"];
    assert_eq!(violations(head, true), Vec::<String>::new(), "{head}");
}

/// Issue 32: pods name the PriorityClass of their resource type, which never preempts; the classes' order is
/// what the cluster should take first.
#[test]
fn pods_get_the_priority_class_of_their_resource_type() {
    let classes = priority_class_objects();
    assert_eq!(classes.len(), 4);
    for c in &classes {
        assert_eq!(c["preemptionPolicy"], "Never", "{c}");
        assert_eq!(c["globalDefault"], false, "{c}");
    }
    let value = |name: &str| {
        classes.iter().find(|c| c["metadata"]["name"] == name).unwrap()["value"].as_i64().unwrap()
    };
    assert!(value("trainyard-reserved") > value("trainyard-ondemand"));
    assert!(value("trainyard-ondemand") > value("trainyard-spot"));
    assert!(value("trainyard-spot") > value("trainyard-idle") && value("trainyard-idle") > 0);
    assert!(value("trainyard-reserved") < 1_000_000_000, "below the system classes");

    let o = attempt_objects(&spec("PyTorchJob", 1, json!({})), &settings(), Some(&keys())).unwrap();
    assert_eq!(template(&o.job, "Worker")["spec"]["priorityClassName"], "trainyard-reserved");
    let mut spot = spec("RayJob", 1, json!({}));
    spot.task.spec.compute.resource_type = ResourceType::Spot;
    let o = attempt_objects(&spot, &settings(), None).unwrap();
    assert_eq!(
        o.job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["priorityClassName"],
        "trainyard-spot"
    );
    let off = KubeSettings { priority_classes: false, ..settings() };
    let o = attempt_objects(&spec("PyTorchJob", 1, json!({})), &off, Some(&keys())).unwrap();
    assert!(template(&o.job, "Master")["spec"].get("priorityClassName").is_none());
}

/// Issue 32: each attempt's NetworkPolicy selects exactly its own pods (the selector matches the labels of
/// every pod template, and not another attempt's) and lets in only those and the configured peers.
#[test]
fn an_attempts_network_policy_lets_in_its_own_pods_and_the_named_peers_only() {
    fn matches(selector: &Value, labels: &Value) -> bool {
        selector["matchLabels"].as_object().unwrap().iter().all(|(k, v)| labels.get(k) == Some(v))
    }
    let peers = vec!["namespace:ray-system".parse().unwrap(), "10.0.0.0/24".parse::<Peer>().unwrap()];
    let s = KubeSettings { network_policy: Some(peers), ..settings() };
    for (kind, spec) in [("pytorchjob", pytorch_spec()), ("rayjob", spec("RayJob", 2, json!({})))] {
        let o = attempt_objects(&spec, &s, Some(&keys())).unwrap();
        let np = o.network_policy.clone().unwrap();
        assert_eq!(np["kind"], "NetworkPolicy");
        assert_eq!(np["metadata"]["namespace"], "ty-vision");
        assert_eq!(np["spec"]["policyTypes"], json!(["Ingress"]), "egress is left to the cluster");
        let own = &np["spec"]["podSelector"];
        let templates: Vec<&Value> = if kind == "rayjob" {
            let rc = &o.job["spec"]["rayClusterSpec"];
            vec![&rc["headGroupSpec"]["template"], &rc["workerGroupSpecs"][0]["template"]]
        } else {
            vec![template(&o.job, "Master"), template(&o.job, "Worker")]
        };
        for t in templates {
            assert!(
                matches(own, &t["metadata"]["labels"]),
                "{kind}: {own} does not select {}",
                t["metadata"]
            );
        }
        let from = np["spec"]["ingress"][0]["from"].as_array().unwrap();
        assert_eq!(from[0], json!({"podSelector": own}));
        assert_eq!(
            from[1],
            json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ray-system"}}})
        );
        assert_eq!(from[2], json!({"ipBlock": {"cidr": "10.0.0.0/24"}}));
        assert_eq!(np["spec"]["ingress"].as_array().unwrap().len(), 1);
        // Another attempt of the same task, or another task of the group, is not selected.
        let mut next = spec.clone();
        next.key.attempt += 1;
        let other = attempt_objects(&next, &s, Some(&keys())).unwrap();
        let other_labels = &template_any(&other.job)["metadata"]["labels"];
        assert!(!matches(own, other_labels), "{kind}: the next attempt's pods are not this one's");
        assert_eq!(o.all().first().copied(), Some(&np), "the policy is applied before the pods exist");
    }
    let off = KubeSettings { network_policy: None, ..settings() };
    assert!(attempt_objects(&pytorch_spec(), &off, Some(&keys())).unwrap().network_policy.is_none());
    assert!("namespace:Bad_NS".parse::<Peer>().is_err() && "10.0.0.0/33".parse::<Peer>().is_err());
    assert!("fd00::/8".parse::<Peer>().is_ok() && "everyone".parse::<Peer>().is_err());
}

/// The registry logins a launch carries become the attempt's `kubernetes.io/dockerconfigjson` Secret, named by
/// every pod of both kinds as `imagePullSecrets`; no other object shows the password. Without logins there is
/// no such Secret and no reference to one. No pod gets a service account token.
#[test]
fn registry_logins_are_the_pods_image_pull_secret() {
    use trainyard_runtime::RegistryLogin;
    let logins = std::collections::BTreeMap::from([
        (
            "reg.example:5000".to_owned(),
            RegistryLogin { username: "ci".into(), password: "pw-s3cret".into() },
        ),
        ("mirror.example".to_owned(), RegistryLogin { username: "bot".into(), password: "mirror-pw".into() }),
    ]);
    for kind in ["PyTorchJob", "RayJob"] {
        let mut spec = spec(kind, 2, json!({}));
        let plain = attempt_objects(&spec, &settings(), None).unwrap();
        assert!(plain.pull_secret.is_none());
        assert!(!plain.job.to_string().contains("imagePullSecrets"), "{kind}");

        spec.registry_logins = Arc::new(logins.clone());
        let o = attempt_objects(&spec, &settings(), None).unwrap();
        let name = job_name(&spec.key);
        let secret = o.pull_secret.as_ref().unwrap();
        assert_eq!(secret["type"], "kubernetes.io/dockerconfigjson");
        assert_eq!(secret["metadata"]["name"], format!("{name}-pull"));
        assert_eq!(secret["metadata"]["namespace"], "ty-vision");
        let data = secret["data"][".dockerconfigjson"].as_str().unwrap();
        let config: Value = serde_json::from_slice(&unbase64(data)).unwrap();
        assert_eq!(config["auths"]["reg.example:5000"]["username"], "ci");
        assert_eq!(config["auths"]["reg.example:5000"]["password"], "pw-s3cret");
        assert_eq!(config["auths"]["reg.example:5000"]["auth"], base64(b"ci:pw-s3cret"));
        assert_eq!(config["auths"]["mirror.example"]["auth"], base64(b"bot:mirror-pw"));
        assert!(o.all().iter().any(|x| std::ptr::eq(*x, secret)), "applied with the rest");
        let templates: Vec<&Value> = if kind == "RayJob" {
            let rc = &o.job["spec"]["rayClusterSpec"];
            vec![&rc["headGroupSpec"]["template"], &rc["workerGroupSpecs"][0]["template"]]
        } else {
            vec![template(&o.job, "Master"), template(&o.job, "Worker")]
        };
        for t in templates {
            assert_eq!(t["spec"]["imagePullSecrets"], json!([{"name": format!("{name}-pull")}]), "{kind}");
            assert_eq!(t["spec"]["automountServiceAccountToken"], false, "{kind}");
        }
        for obj in o.all().into_iter().filter(|x| !std::ptr::eq(*x, secret)) {
            assert!(!obj.to_string().contains("pw-s3cret"), "{kind}: {obj}");
        }
    }
}

/// Standard base64 (padded) decoded, for reading back what [`base64`] wrote.
fn unbase64(s: &str) -> Vec<u8> {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let vals: Vec<u32> =
        s.bytes().filter(|&b| b != b'=').map(|b| A.iter().position(|&a| a == b).unwrap() as u32).collect();
    let mut out = Vec::new();
    for chunk in vals.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, v)| acc | (v << (18 - 6 * i)));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

/// Every pod gets a memory-backed `/dev/shm` as large as its replica's memory (the runtime's 64 MiB default is
/// too small for NCCL and Ray), in its command's container and its precheck's.
#[test]
fn pods_get_a_dev_shm_as_large_as_their_memory() {
    let o = attempt_objects(&pytorch_spec(), &settings(), Some(&keys())).unwrap();
    let ray = attempt_objects(&spec("RayJob", 1, json!({})), &settings(), None).unwrap();
    let rc = &ray.job["spec"]["rayClusterSpec"];
    for t in [template(&o.job, "Master"), template(&o.job, "Worker"), &rc["headGroupSpec"]["template"]] {
        let vol =
            t["spec"]["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "trainyard-shm").unwrap();
        assert_eq!(vol["emptyDir"], json!({"medium": "Memory", "sizeLimit": "131072Mi"}));
        let mut containers = t["spec"]["containers"].as_array().unwrap().clone();
        containers.extend(t["spec"]["initContainers"].as_array().cloned().unwrap_or_default());
        for c in containers {
            let m = c["volumeMounts"].as_array().unwrap().iter().find(|m| m["mountPath"] == "/dev/shm");
            assert_eq!(m.unwrap()["name"], "trainyard-shm", "{}", c["name"]);
        }
    }
}

/// A task with a working directory: each replica's pod makes its copy in an init container (the server's
/// image, the attempt's token from its Secret, before the precheck) and starts its command there; a server
/// that was not told how pods fetch one refuses the launch with the reason.
#[test]
fn a_working_directory_is_fetched_by_an_init_container() {
    let id = "ab".repeat(32);
    let with_workdir = |kind: &str| {
        let extra =
            if kind == "RayJob" { json!({}) } else { json!({"advanced": {"precheck": {"enabled": true}}}) };
        let mut s = spec(kind, 1, extra);
        s.task.spec.environment.workdir = Some(id.clone());
        s.workdir_token = Some(trainyard_runtime::Token("tyw.0190a5b2c3d4e5f6.2.mac".into()));
        s
    };
    let fetch = WorkdirFetch {
        image: "reg/trainyard/server:1".into(),
        server: "http://trainyard.sys.svc:8080".into(),
    };
    let settings = KubeSettings { workdir: Some(fetch.clone()), ..settings() };

    let o = attempt_objects(&with_workdir("PyTorchJob"), &settings, None).unwrap();
    validate("pytorchjob", &o.job);
    let secret = o.secret.as_ref().unwrap();
    assert_eq!(decode64(secret["data"][WORKDIR_TOKEN_KEY].as_str().unwrap()), b"tyw.0190a5b2c3d4e5f6.2.mac");
    for kind in ["Master", "Worker"] {
        let pod = &template(&o.job, kind)["spec"];
        let inits = pod["initContainers"].as_array().unwrap();
        let names: Vec<&str> = inits.iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            ["trainyard-workdir", "trainyard-precheck"],
            "{kind}: the copy before the precheck"
        );
        let fetch_c = &inits[0];
        assert_eq!(fetch_c["image"], "reg/trainyard/server:1");
        assert_eq!(
            fetch_c["command"],
            json!(["trainyard", "workdir", "fetch", id, "--group", "vision", "--into", "/workspace"])
        );
        let env = env_of(fetch_c);
        assert_eq!(env["TRAINYARD_SERVER"]["value"], "http://trainyard.sys.svc:8080");
        assert_eq!(env["TRAINYARD_TOKEN"]["valueFrom"]["secretKeyRef"]["key"], WORKDIR_TOKEN_KEY);
        assert_eq!(fetch_c["securityContext"]["runAsUser"], 0, "as the root image's command runs");
        assert_eq!(fetch_c["securityContext"]["allowPrivilegeEscalation"], false);
        let main = &pod["containers"][0];
        assert_eq!(main["workingDir"], "/workspace");
        for c in [main, &inits[0], &inits[1]] {
            let mounts = c["volumeMounts"].as_array().unwrap();
            assert!(mounts.iter().any(|m| m["mountPath"] == "/workspace"), "{}: {mounts:?}", c["name"]);
        }
        let vol = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "trainyard-workspace");
        assert_eq!(vol.unwrap()["emptyDir"], json!({}), "each replica's own copy");
        assert!(!env_of(main).contains_key("TRAINYARD_TOKEN"), "the task's command never sees the token");
    }

    let o = attempt_objects(&with_workdir("RayJob"), &settings, None).unwrap();
    validate("rayjob", &o.job);
    assert!(o.job["spec"]["entrypoint"].as_str().unwrap().starts_with("bash -c 'cd /workspace || exit 1"));
    let head = &o.job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"];
    assert_eq!(head["initContainers"][0]["name"], "trainyard-workdir");
    assert_eq!(head["containers"][0]["workingDir"], "/workspace");

    let err = attempt_objects(&with_workdir("PyTorchJob"), &self::settings(), None).unwrap_err();
    assert!(err.iter().any(|e| e.contains("--kube-workdir-image")), "{err:?}");
    let mut tokenless = with_workdir("PyTorchJob");
    tokenless.workdir_token = None;
    assert!(attempt_objects(&tokenless, &settings, None).is_err());
    let plain = attempt_objects(&spec("PyTorchJob", 1, json!({})), &settings, None).unwrap();
    assert!(!plain.job.to_string().contains("/workspace"), "no working directory, no copy");
}
