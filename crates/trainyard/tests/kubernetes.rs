//! End to end on Kubernetes, through Trainyard's own API and CLI: `trainyard up --backend kubernetes` against
//! the test cluster `scripts/with-kube` starts (a real API server, the real Kubeflow training operator and
//! KubeRay; kwok's simulated nodes and pods), the examples under `examples/kubernetes/` submitted with the CLI
//! and followed to Running and Succeeded, with their objects checked on the API server.

mod common;

use common::{Options, Server, secs};
use serde_json::Value;
use trainyard_kube::client::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use trainyard_kube::openapi::api::core::v1::Node;
use trainyard_kube::views::job_resource;

fn block<T>(f: impl std::future::Future<Output = T>) -> T {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| tokio::runtime::Runtime::new().unwrap()).block_on(f)
}

fn client() -> trainyard_kube::client::Client {
    assert!(
        std::env::var_os("TRAINYARD_KUBE_STACK").is_some(),
        "these tests need the test cluster: run them with scripts/test, which starts it through \
         scripts/with-kube (or run `scripts/with-kube cargo test --test kubernetes`)"
    );
    block(trainyard_kube::client::Client::try_default()).expect("a client from KUBECONFIG")
}

/// A kwok node of `pool` with 8 vCPUs and 16 GiB.
fn node(c: &trainyard_kube::client::Client, name: &str, pool: &str) {
    let nodes: Api<Node> = Api::all(c.clone());
    let body = serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {"kubernetes.io/hostname": name, "type": "kwok", "trainyard.dev/pool": pool},
        },
    });
    block(nodes.patch(name, &PatchParams::apply("e2e").force(), &Patch::Apply(&body))).unwrap();
    let r = serde_json::json!({"cpu": "8", "memory": "16Gi", "pods": "110"});
    let status = serde_json::json!({"status": {"capacity": r, "allocatable": r}});
    block(nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))).unwrap();
}

/// The catalog of the test: the kwok nodes this test made, and the examples' images.
fn catalog(nodes: &[String]) -> String {
    let nodes: String =
        nodes.iter().map(|n| format!("  {n}: {{pool: default, vcpus: 8, memoryMib: 16384}}\n")).collect();
    format!(
        "regions: {{kubernetes: {{}}}}\n\
         clusters: {{kubernetes: {{region: kubernetes}}}}\n\
         pools: {{default: {{cluster: kubernetes, instanceSpecs: [cpu.small]}}}}\n\
         instanceSpecs: {{cpu.small: {{kind: CPU, vcpus: 1, memoryMib: 2048}}}}\n\
         nodes:\n{nodes}\
         projectGroups: {{default: {{}}}}\n\
         images: {{pytorch: {{torch: true}}, ray: {{ray: true}}}}\n\
         quotas: [{{group: default, resourceType: Reserved, pool: default, spec: cpu.small, units: 16}}]\n"
    )
}

/// The id a `trainyard submit` printed.
/// `trainyard up --backend kubernetes` named `name`, its groups' namespaces `namespace` (with `{group}`), the
/// catalog the test's own, and `args` after those.
fn kube_server(name: &str, namespace: &str, args: &[&str]) -> Server {
    // An instance of its own: servers sharing one watch everyone's jobs, and act on what they see (a job another
    // server's Kueue holds suspended looks suspended by someone else to one without Kueue, which ends it).
    let instance = format!("{name}-{}", std::process::id());
    let first = ["--backend", "kubernetes", "--kube-namespace", namespace, "--kube-instance", &instance];
    let args = first.iter().chain(args).map(|a| (*a).to_owned()).collect();
    Server::start_with(name, Options { args, own_catalog: true, ..Options::default() })
}

fn submitted_id(s: &Server, printed: &str) -> String {
    let (_, body) = s.call("GET", "/api/v1/tasks?limit=50", None);
    let v: Value = serde_json::from_str(&body).unwrap();
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["id"].as_str())
        .find(|id| printed.contains(id))
        .unwrap_or_else(|| panic!("no submitted task id in {printed}"))
        .to_owned()
}

#[test]
fn the_examples_run_through_the_real_operators_from_the_cli() {
    let c = client();
    let pid = std::process::id();
    let nodes: Vec<String> = (1..=2).map(|i| format!("e2e-{pid}-{i}")).collect();
    for n in &nodes {
        node(&c, n, "default");
    }
    let namespace = format!("e2e-{pid}-{{group}}");
    let s = kube_server(
        "kube-e2e",
        &namespace,
        &[
            "--kube-image",
            "pytorch=docker.io/pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
            "--kube-image",
            "ray=docker.io/rayproject/ray:2.60.0",
        ],
    );
    let (status, body) = s.call("PUT", "/api/v1/admin/catalog", Some(&catalog(&nodes)));
    assert_eq!(status, 200, "{body}");

    let printed = s.cli(&["submit", "-f", "examples/kubernetes/pytorch-ddp.yaml"]);
    let id = submitted_id(&s, &printed);
    s.wait_status(&id, "Running", secs(120));
    // The attempt is one PyTorchJob in the group's namespace, labelled with its task and attempt, its pods
    // bound to the nodes Trainyard's scheduler chose.
    let ns = format!("e2e-{pid}-default");
    let jobs: Api<DynamicObject> =
        Api::namespaced_with(c.clone(), &ns, &job_resource(trainyard_kube::status::JobKind::PyTorch));
    let listed =
        block(jobs.list(&ListParams::default().labels(&format!("trainyard.dev/task={id}")))).unwrap();
    assert_eq!(listed.items.len(), 1, "one job object per attempt");
    let t = s.wait_status(&id, "Succeeded", secs(120));
    let events = s.events_text(&id);
    assert!(events.contains("Started"), "{events}");
    let placed = t["placement"].to_string();
    assert!(placed.contains(&nodes[0]) || placed.contains(&nodes[1]), "{placed}");
    // Each replica's log, followed through the API server while its pod ran, is served by Trainyard's own API
    // (kwok's simulated kubelet gives every container the same log).
    let (status, body) = s.call("GET", &format!("/api/v1/tasks/{id}/logs"), None);
    assert_eq!(status, 200, "{body}");
    let listed: Value = serde_json::from_str(&body).unwrap();
    let replicas: Vec<String> = listed["items"][0]["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(replicas.len() >= 2, "master and workers: {body}");
    for r in &replicas {
        let deadline = std::time::Instant::now() + secs(30);
        loop {
            let (status, log) = s.call("GET", &format!("/api/v1/tasks/{id}/logs?replica={r}"), None);
            assert_eq!(status, 200, "{log}");
            if log.contains("2026-01-01T00:00:01.000Z O simulated container: step 1 loss 0.50") {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{r}'s log: {log}");
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
    }

    let printed = s.cli(&["submit", "-f", "examples/kubernetes/ray.yaml"]);
    let id = submitted_id(&s, &printed);
    s.wait_status(&id, "Running", secs(120));
    s.wait_status(&id, "Succeeded", secs(180));

    // The catalog follows the cluster: a node that joins its pool is there within moments, a cordon in the
    // cluster stops new work on it, and a node that leaves the cluster leaves the catalog.
    let joined = format!("e2e-{pid}-3");
    node(&c, &joined, "default");
    let catalog_node = |name: &str| -> Value {
        let (_, body) = s.call("GET", "/api/v1/catalog", None);
        serde_json::from_str::<Value>(&body).unwrap()["nodes"][name].clone()
    };
    let until = |what: &str, ok: &dyn Fn() -> bool| {
        let t0 = std::time::Instant::now();
        while !ok() {
            assert!(t0.elapsed() < secs(30), "{what}: {}", catalog_node(&joined));
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    };
    until("the new node joins the catalog", &|| catalog_node(&joined)["vcpus"] == 8);
    let nodes_api: Api<Node> = Api::all(c.clone());
    let cordon = serde_json::json!({"spec": {"unschedulable": true}});
    block(nodes_api.patch(&joined, &PatchParams::default(), &Patch::Merge(&cordon))).unwrap();
    until("the cordon reaches the catalog", &|| catalog_node(&joined)["schedulable"] == false);
    block(nodes_api.delete(&joined, &Default::default())).unwrap();
    until("the node leaves the catalog", &|| catalog_node(&joined).is_null());
}

/// A second test cluster: `scripts/with-kube` run as a child process, its stack up until this is dropped.
struct SecondStack {
    child: std::process::Child,
    kubeconfig: std::path::PathBuf,
}

impl SecondStack {
    fn start(name: &str) -> SecondStack {
        let dir = std::env::temp_dir().join(format!("ty-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let kubeconfig = dir.join("kubeconfig");
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        let mut child = std::process::Command::new(format!("{root}/scripts/with-kube"))
            .args([
                "--without-kueue",
                "sh",
                "-c",
                r#"cp "$TRAINYARD_KUBE_STACK/kubeconfig" "$0.tmp" && mv "$0.tmp" "$0" && exec sleep 3600"#,
            ])
            .arg(&kubeconfig)
            .env_remove("KUBECONFIG")
            .env_remove("TRAINYARD_KUBE_STACK")
            .env_remove("TRAINYARD_KUBE_BIN")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        while !kubeconfig.exists() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("the second test cluster did not start: {status}");
            }
            assert!(t0.elapsed() < secs(300), "the second test cluster did not start within 300 s");
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        SecondStack { child, kubeconfig }
    }

    fn client(&self) -> trainyard_kube::client::Client {
        use trainyard_kube::client::config::{KubeConfigOptions, Kubeconfig};
        let file = Kubeconfig::read_from(&self.kubeconfig).unwrap();
        block(async {
            let config =
                trainyard_kube::client::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                    .await
                    .unwrap();
            // The client's buffer task runs on the tests' runtime.
            trainyard_kube::client::Client::try_from(config).unwrap()
        })
    }
}

impl Drop for SecondStack {
    fn drop(&mut self) {
        // TERM: with-kube stops its command, then the stack.
        let _ = std::process::Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }
}

/// The server, CA file and token of a `scripts/with-kube` kubeconfig.
fn kubeconfig_parts(path: &std::path::Path) -> (String, String, String) {
    let text = std::fs::read_to_string(path).unwrap();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .trim()
            .to_owned()
    };
    (field("server:"), field("certificate-authority:"), field("token:"))
}

/// One kubeconfig with a context per cluster: (context name, that cluster's kubeconfig).
fn merged_kubeconfig(parts: &[(&str, &std::path::Path)], out: &std::path::Path) {
    let mut clusters = String::new();
    let mut users = String::new();
    let mut contexts = String::new();
    for (name, path) in parts {
        let (server, ca, token) = kubeconfig_parts(path);
        clusters.push_str(&format!(
            "- name: {name}\n  cluster: {{server: {server}, certificate-authority: {ca}}}\n"
        ));
        users.push_str(&format!("- name: {name}\n  user: {{token: {token}}}\n"));
        contexts.push_str(&format!("- name: {name}\n  context: {{cluster: {name}, user: {name}}}\n"));
    }
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n{clusters}users:\n{users}contexts:\n{contexts}current-context: {}\n",
        parts[0].0
    );
    std::fs::write(out, text).unwrap();
}

/// Two clusters behind one server: each catalog cluster names the kubeconfig context that reaches it. A task
/// placed in a cluster runs there (its job object is on that cluster's API server, none on the other), each
/// cluster's nodes reach only its own pools in the catalog, and logs come back from either.
#[test]
fn each_catalog_cluster_runs_its_tasks_where_its_context_points() {
    let east = client();
    let west_stack = SecondStack::start("kube-west");
    let west = west_stack.client();
    let pid = std::process::id();
    let (east_node, west_node) = (format!("mc-{pid}-east"), format!("mc-{pid}-west"));
    node(&east, &east_node, "east-pool");
    node(&west, &west_node, "west-pool");
    let dir = std::env::temp_dir().join(format!("ty-kube-multi-cfg-{pid}"));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    let east_file = std::path::PathBuf::from(std::env::var("KUBECONFIG").unwrap());
    merged_kubeconfig(&[("east", &east_file), ("west", &west_stack.kubeconfig)], &kubeconfig);
    let namespace = format!("mc-{pid}-{{group}}");
    let mut s = kube_server(
        "kube-multi",
        &namespace,
        &[
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--kube-context",
            "east",
            "--kube-image",
            "pytorch=docker.io/pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
        ],
    );
    let catalog = format!(
        "regions: {{r: {{}}}}\n\
         clusters: {{gpu-east: {{region: r, context: east}}, gpu-west: {{region: r, context: west}}}}\n\
         pools: {{east-pool: {{cluster: gpu-east, instanceSpecs: [cpu.small]}}, \
                  west-pool: {{cluster: gpu-west, instanceSpecs: [cpu.small]}}}}\n\
         instanceSpecs: {{cpu.small: {{kind: CPU, vcpus: 1, memoryMib: 2048}}}}\n\
         nodes:\n  {east_node}: {{pool: east-pool, vcpus: 8, memoryMib: 16384}}\n\
         \x20 {west_node}: {{pool: west-pool, vcpus: 8, memoryMib: 16384}}\n\
         projectGroups: {{default: {{}}}}\n\
         images: {{pytorch: {{torch: true}}}}\n\
         quotas: [{{group: default, resourceType: Reserved, pool: east-pool, spec: cpu.small, units: 8}},\n\
         \x20        {{group: default, resourceType: Reserved, pool: west-pool, spec: cpu.small, units: 8}}]\n"
    );
    let (status, body) = s.call("PUT", "/api/v1/admin/catalog", Some(&catalog));
    assert_eq!(status, 200, "{body}");
    // Contexts are connected at start: the restart connects the west one the catalog now names.
    s.restart();

    let task = |cluster: &str, pool: &str| {
        serde_json::json!({
            "apiVersion": "trainyard.dev/v1", "kind": "TrainingTask",
            "metadata": {"namePrefix": format!("mc-{cluster}"), "projectGroup": "default",
                         "labels": {"sim.trainyard.dev/run-ms": "2000"}},
            "spec": {
                "type": "PyTorchJob",
                "placement": {"region": "r", "cluster": cluster},
                "environment": {"image": "pytorch", "cmd": "echo hello"},
                "compute": {"resourceType": "Reserved", "pool": pool, "workers": 1,
                            "instanceSpecs": [{"spec": "cpu.small"}]},
            }
        })
    };
    let ns = format!("mc-{pid}-default");
    let jobs_of = |c: &trainyard_kube::client::Client, id: &str| {
        let jobs: Api<DynamicObject> =
            Api::namespaced_with(c.clone(), &ns, &job_resource(trainyard_kube::status::JobKind::PyTorch));
        block(jobs.list(&ListParams::default().labels(&format!("trainyard.dev/task={id}"))))
            .map(|l| l.items.len())
            .unwrap_or(0)
    };
    for (cluster, pool, here, there) in
        [("gpu-west", "west-pool", &west, &east), ("gpu-east", "east-pool", &east, &west)]
    {
        let id = s.submit(&task(cluster, pool));
        s.wait_status(&id, "Running", secs(120));
        assert_eq!(jobs_of(here, &id), 1, "{cluster}'s task has its job on {cluster}'s API server");
        assert_eq!(jobs_of(there, &id), 0, "and none on the other");
        s.wait_status(&id, "Succeeded", secs(120));
        let (_, listed) = s.call("GET", &format!("/api/v1/tasks/{id}/logs"), None);
        let v: Value = serde_json::from_str(&listed).unwrap();
        let replica =
            v["items"][0]["replicas"][0]["name"].as_str().unwrap_or_else(|| panic!("{listed}")).to_owned();
        let t0 = std::time::Instant::now();
        loop {
            let (_, log) = s.call("GET", &format!("/api/v1/tasks/{id}/logs?replica={replica}"), None);
            if log.contains("simulated container: done") {
                break;
            }
            assert!(t0.elapsed() < secs(30), "{cluster}: {log}");
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
    }

    // A node that joins the west cluster reaches the west pool (and only the west cluster's nodes do).
    let joined = format!("mc-{pid}-west-2");
    node(&west, &joined, "west-pool");
    let stray = format!("mc-{pid}-east-in-west-pool");
    node(&east, &stray, "west-pool");
    let t0 = std::time::Instant::now();
    loop {
        let (_, body) = s.call("GET", "/api/v1/catalog", None);
        let nodes = serde_json::from_str::<Value>(&body).unwrap()["nodes"].clone();
        if nodes[&joined]["pool"] == "west-pool" {
            assert!(nodes[&stray].is_null(), "an east node labelled with a west pool stays out: {nodes}");
            break;
        }
        assert!(t0.elapsed() < secs(30), "the west node never joined: {nodes}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let nodes_api: Api<Node> = Api::all(east.clone());
    let _ = block(nodes_api.delete(&stray, &Default::default()));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 32: what a real GPU pool asks of a pod, on the test cluster's kwok nodes. The pool's nodes are tainted
/// (the GPU vendor's taint, a dedicated pool's own) and labelled, and offer AMD GPUs and RDMA devices as
/// extended resources: a task's pods tolerate both taints (the GPU one by default, the pool's from the
/// catalog), select the pool's and the spec's labels, request the spec's GPU resource and its extra resources
/// per unit, carry their resource type's PriorityClass and the `baseline` securityContext, and each attempt
/// has its NetworkPolicy; the scheduler binds them (a pod that asked for less or tolerated less would stay
/// Pending) and the task runs.
#[test]
fn a_tainted_gpu_pool_of_another_vendor_runs_its_tasks() {
    let c = client();
    let pid = std::process::id();
    let name = format!("e2e-{pid}-mi300x");
    let nodes: Api<Node> = Api::all(c.clone());
    let body = serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {"kubernetes.io/hostname": name, "type": "kwok", "trainyard.dev/pool": "mi300x",
                       "amd.com/gpu.product-name": "MI300X"},
        },
        "spec": {"taints": [
            {"key": "amd.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
        ]},
    });
    block(nodes.patch(&name, &PatchParams::apply("e2e").force(), &Patch::Apply(&body))).unwrap();
    let r = serde_json::json!({"cpu": "32", "memory": "128Gi", "pods": "110", "amd.com/gpu": "8", "rdma/hca": "8"});
    let status = serde_json::json!({"status": {"capacity": r, "allocatable": r}});
    block(nodes.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))).unwrap();

    let namespace = format!("e2e-gpu-{pid}-{{group}}");
    let s = kube_server("kube-gpu", &namespace, &["--kube-image", "pytorch=docker.io/pytorch/pytorch:2.5.1"]);
    let catalog = format!(
        "regions: {{kubernetes: {{}}}}\n\
         clusters: {{kubernetes: {{region: kubernetes}}}}\n\
         pools: {{mi300x: {{cluster: kubernetes, instanceSpecs: [mi300x.1], nodeSelector: {{trainyard.dev/pool: mi300x}}, \
           tolerations: [{{key: dedicated, value: ml, effect: NoSchedule}}]}}}}\n\
         instanceSpecs: {{mi300x.1: {{kind: GPU, gpuModel: MI300X, gpus: 1, vcpus: 4, memoryMib: 16384, \
           gpuResource: amd.com/gpu, extraResources: {{rdma/hca: 1}}, nodeSelector: {{amd.com/gpu.product-name: MI300X}}}}}}\n\
         nodes:\n  {name}: {{pool: mi300x, vcpus: 32, memoryMib: 131072, gpus: 8, gpuModel: MI300X}}\n\
         projectGroups: {{default: {{}}}}\n\
         images: {{pytorch: {{torch: true}}}}\n\
         quotas: [{{group: default, resourceType: Reserved, pool: mi300x, spec: mi300x.1, units: 8}}]\n"
    );
    // First the spec asks for a label the node does not have: the cluster's scheduler cannot place the pods,
    // and the task's wait while it starts says so, in the API, the CLI and the console's data.
    let wrong = catalog.replace(
        "nodeSelector: {amd.com/gpu.product-name: MI300X}",
        "nodeSelector: {amd.com/gpu.product-name: MI250X}",
    );
    let (status, body) = s.call("PUT", "/api/v1/admin/catalog", Some(&wrong));
    assert_eq!(status, 200, "{body}");
    let task = serde_json::json!({
        "apiVersion": "trainyard.dev/v1", "kind": "TrainingTask",
        "metadata": {"namePrefix": "mi300x", "projectGroup": "default"},
        "spec": {
            "type": "PyTorchJob",
            "placement": {"region": "kubernetes", "cluster": "kubernetes"},
            "environment": {"image": "pytorch", "cmd": "python3 train.py"},
            "compute": {"resourceType": "Reserved", "pool": "mi300x", "workers": 1,
                        "instanceSpecs": [{"spec": "mi300x.1", "countPerNode": 2}]},
        }
    });
    let stuck = s.submit(&task);
    s.wait_status(&stuck, "Starting", secs(60));
    let t0 = std::time::Instant::now();
    let wait = loop {
        let t = s.task(&stuck);
        if let Some(r) = t["starting"]["reason"].as_str().filter(|r| r.contains("Unschedulable")) {
            assert_eq!(t["status"], "Starting", "{t}");
            assert!(t["starting"]["sinceMs"].as_i64().unwrap() > 0, "{t}");
            break r.to_owned();
        }
        assert!(t0.elapsed() < secs(60), "no wait reason: {t}\n{}", s.events_text(&stuck));
        std::thread::sleep(std::time::Duration::from_millis(250));
    };
    // Either pod may be named first (both are Unschedulable); on a stack with more nodes, the others are
    // counted too.
    assert!(
        (wait.contains("-master-0 is Unschedulable") || wait.contains("-worker-0 is Unschedulable"))
            && wait.contains("node affinity/selector"),
        "{wait}"
    );
    let described = s.cli(&["describe", &stuck]);
    assert!(described.contains("Waiting:  ") && described.contains("Unschedulable"), "{described}");
    eprintln!("the wait while it starts: {wait}");
    s.cli(&["stop", &stuck]);
    s.wait_status(&stuck, "Stopped", secs(120));
    assert!(s.task(&stuck)["starting"].is_null(), "no wait once it stopped");

    let (status, body) = s.call("PUT", "/api/v1/admin/catalog", Some(&catalog));
    assert_eq!(status, 200, "{body}");
    let id = s.submit(&task);
    s.wait_status(&id, "Running", secs(120));
    assert!(s.task(&id)["starting"].is_null(), "no wait once it runs");

    let ns = format!("e2e-gpu-{pid}-default");
    let pods: Api<trainyard_kube::openapi::api::core::v1::Pod> = Api::namespaced(c.clone(), &ns);
    let listed =
        block(pods.list(&ListParams::default().labels(&format!("trainyard.dev/task={id}")))).unwrap();
    assert_eq!(listed.items.len(), 2, "master and worker");
    for p in &listed.items {
        let pod = serde_json::to_value(p).unwrap();
        let spec = &pod["spec"];
        assert_eq!(spec["nodeName"], name.as_str(), "{pod}");
        let requests = &spec["containers"][0]["resources"]["requests"];
        assert_eq!(requests["amd.com/gpu"], "2", "{requests}");
        assert_eq!(requests["rdma/hca"], "2", "{requests}");
        assert!(requests.get("nvidia.com/gpu").is_none(), "{requests}");
        assert_eq!(
            spec["nodeSelector"],
            serde_json::json!({"trainyard.dev/pool": "mi300x", "amd.com/gpu.product-name": "MI300X"})
        );
        let tolerations = spec["tolerations"].to_string();
        assert!(
            tolerations.contains("\"key\":\"dedicated\"") && tolerations.contains("\"key\":\"amd.com/gpu\""),
            "{tolerations}"
        );
        assert_eq!(spec["priorityClassName"], "trainyard-reserved");
        // Admission resolved the class to its value.
        assert_eq!(spec["priority"], 100_000);
        assert_eq!(spec["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
        assert_eq!(spec["containers"][0]["securityContext"]["allowPrivilegeEscalation"], false);
    }
    // The attempt's NetworkPolicy selects its pods and lets in only them.
    let policies: Api<DynamicObject> = Api::namespaced_with(
        c.clone(),
        &ns,
        &trainyard_kube::client::api::ApiResource::from_gvk_with_plural(
            &trainyard_kube::client::api::GroupVersionKind::gvk("networking.k8s.io", "v1", "NetworkPolicy"),
            "networkpolicies",
        ),
    );
    let listed_np =
        block(policies.list(&ListParams::default().labels(&format!("trainyard.dev/task={id}")))).unwrap();
    assert_eq!(listed_np.items.len(), 1, "one policy per attempt");
    let np = serde_json::to_value(&listed_np.items[0]).unwrap();
    let selector = np["spec"]["podSelector"]["matchLabels"].as_object().unwrap().clone();
    for p in &listed.items {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        for (k, v) in &selector {
            assert_eq!(labels.get(k).map(String::as_str), v.as_str(), "{k} on {:?}", p.metadata.name);
        }
    }
    assert_eq!(
        np["spec"]["ingress"][0]["from"],
        serde_json::json!([{"podSelector": np["spec"]["podSelector"]}])
    );
    // The PriorityClasses exist, none of them preempts.
    let classes: Api<trainyard_kube::openapi::api::scheduling::v1::PriorityClass> = Api::all(c.clone());
    for (class, value) in [("trainyard-reserved", 100_000), ("trainyard-idle", 10_000)] {
        let got = block(classes.get(class)).unwrap();
        assert_eq!((got.value, got.preemption_policy.as_deref()), (Some(value), Some("Never")), "{class}");
    }
    s.cli(&["stop", &id]);
    s.wait_status(&id, "Stopped", secs(120));
    block(nodes.delete(&name, &Default::default())).unwrap();
}

/// Issue 32: with Kueue admitting (`--kube-gang kueue:QUEUE`), Trainyard does not admit a second time. Two
/// tasks of two replicas each, against a Trainyard quota of two units (which would admit one and queue the
/// other), are both handed to the cluster at once, unplaced (no node affinity: kube-scheduler places the pods
/// Kueue lets go); while Kueue's ClusterQueue has no room, they are `Starting` with Kueue's wait as their
/// reason; once it has room for both, both run.
#[test]
fn with_kueue_trainyard_hands_admission_over_and_shows_its_wait() {
    let c = client();
    let pid = std::process::id();
    let pool = format!("kq-{pid}");
    let name = format!("e2e-{pid}-kq");
    node(&c, &name, &pool);
    let ns_template = format!("e2e-kq-{pid}-{{group}}");
    let ns = format!("e2e-kq-{pid}-default");
    let pp = PatchParams::apply("e2e").force();
    let namespaces: Api<trainyard_kube::openapi::api::core::v1::Namespace> = Api::all(c.clone());
    let body = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
    block(namespaces.patch(&ns, &pp, &Patch::Apply(&body))).unwrap();
    use common::kueue;
    let flavors: Api<DynamicObject> =
        Api::all_with(c.clone(), &kueue::resource("ResourceFlavor", "resourceflavors"));
    block(flavors.patch(&pool, &pp, &Patch::Apply(&kueue::flavor(&pool))))
        .unwrap_or_else(|e| panic!("{e} (is Kueue in the stack? scripts/with-kube starts it)"));
    let cqs: Api<DynamicObject> = Api::all_with(c.clone(), &kueue::resource("ClusterQueue", "clusterqueues"));
    let cluster_queue = |cpu: &str| kueue::cluster_queue(&pool, &pool, cpu);
    block(cqs.patch(&pool, &pp, &Patch::Apply(&cluster_queue("1")))).unwrap();
    let lqs: Api<DynamicObject> =
        Api::namespaced_with(c.clone(), &ns, &kueue::resource("LocalQueue", "localqueues"));
    block(lqs.patch("trainyard", &pp, &Patch::Apply(&kueue::local_queue("trainyard", &ns, &pool)))).unwrap();

    let s = kube_server(
        "kube-kueue",
        &ns_template,
        &["--kube-gang", "kueue:trainyard", "--kube-image", "pytorch=docker.io/pytorch/pytorch:2.5.1"],
    );
    let catalog = format!(
        "regions: {{kubernetes: {{}}}}\n\
         clusters: {{kubernetes: {{region: kubernetes}}}}\n\
         pools: {{{pool}: {{cluster: kubernetes, instanceSpecs: [cpu.small], nodeSelector: {{trainyard.dev/pool: {pool}}}}}}}\n\
         instanceSpecs: {{cpu.small: {{kind: CPU, vcpus: 1, memoryMib: 2048}}}}\n\
         nodes:\n  {name}: {{pool: {pool}, vcpus: 8, memoryMib: 16384}}\n\
         projectGroups: {{default: {{}}}}\n\
         images: {{pytorch: {{torch: true}}}}\n\
         quotas: [{{group: default, resourceType: Reserved, pool: {pool}, spec: cpu.small, units: 2}}]\n"
    );
    let (status, body) = s.call("PUT", "/api/v1/admin/catalog", Some(&catalog));
    assert_eq!(status, 200, "{body}");
    let task = serde_json::json!({
        "apiVersion": "trainyard.dev/v1", "kind": "TrainingTask",
        "metadata": {"namePrefix": "kueued", "projectGroup": "default"},
        "spec": {
            "type": "PyTorchJob",
            "placement": {"region": "kubernetes", "cluster": "kubernetes"},
            "environment": {"image": "pytorch", "cmd": "python3 train.py"},
            "compute": {"resourceType": "Reserved", "pool": pool, "workers": 1,
                        "instanceSpecs": [{"spec": "cpu.small"}]},
        }
    });
    let (id, other) = (s.submit(&task), s.submit(&task));
    // Both handed over at once, though Trainyard's own quota (2 units) would take one of them only.
    for t in [&id, &other] {
        s.wait_status(t, "Starting", secs(60));
        let events = s.events_text(t);
        assert!(
            events.contains("handed to cluster kubernetes, which admits and places it itself"),
            "{events}"
        );
    }
    // The wait is Kueue's, in its words (from the job's Workload).
    let t0 = std::time::Instant::now();
    let wait = loop {
        let t = s.task(&id);
        if let Some(r) = t["starting"]["reason"].as_str().filter(|r| r.contains("Workload/")) {
            assert_eq!(t["status"], "Starting", "{t}");
            break r.to_owned();
        }
        assert!(t0.elapsed() < secs(60), "Kueue's reason never came: {t}\n{}", s.events_text(&id));
        std::thread::sleep(std::time::Duration::from_millis(250));
    };
    assert!(wait.starts_with("Kueue has not admitted the job yet: Warning Workload/pytorchjob-"), "{wait}");
    assert!(wait.contains("insufficient") || wait.contains("couldn't assign"), "{wait}");
    eprintln!("waiting in Kueue: {wait}");

    // Room in the ClusterQueue: Kueue lets the job go, kube-scheduler places its pods (on the pool's node, by
    // its selector; Trainyard pinned none), and it runs.
    block(cqs.patch(&pool, &pp, &Patch::Apply(&cluster_queue("4")))).unwrap();
    let pods: Api<trainyard_kube::openapi::api::core::v1::Pod> = Api::namespaced(c.clone(), &ns);
    for t in [&id, &other] {
        s.wait_status(t, "Running", secs(120));
        let listed =
            block(pods.list(&ListParams::default().labels(&format!("trainyard.dev/task={t}")))).unwrap();
        assert_eq!(listed.items.len(), 2, "master and worker");
        for p in &listed.items {
            let spec = serde_json::to_value(p).unwrap()["spec"].clone();
            assert!(spec["affinity"]["nodeAffinity"].is_null(), "unpinned: {spec}");
            assert_eq!(spec["nodeName"], name.as_str());
        }
    }
    for t in [&id, &other] {
        s.cli(&["stop", t]);
        s.wait_status(t, "Stopped", secs(120));
    }
    let _ = block(lqs.delete("trainyard", &Default::default()));
    let _ = block(cqs.delete(&pool, &Default::default()));
    let _ = block(flavors.delete(&pool, &Default::default()));
}
