//! The Kubernetes backend's scale benchmark, against the test cluster `scripts/with-kube` starts (a real API
//! server, the real training operator, kube-scheduler, kwok's simulated nodes and pods):
//!
//! 1. N kwok nodes (16 vCPU, 64 GiB each) are made;
//! 2. **Trainyard:** a server in this process (SQLite, the Kubernetes backend) is sent T one-replica
//!    PyTorchJob tasks over HTTP (32 clients at once); measured: admissions per second from the first submit
//!    until every job object has its `Running` condition, the submit-to-Running latency per task, and the API
//!    requests Trainyard itself sent per admission (applies, deletions, reads; its watches and the log
//!    streams that follow the running pods counted apart);
//! 3. **Kueue** (when the stack runs it, as `scripts/with-kube` does unless `--without-kueue`): the same T jobs created directly,
//!    suspended under a LocalQueue whose ClusterQueue covers every node, admitted by Kueue and placed by
//!    kube-scheduler, on the same API server and nodes; measured the same way.
//!
//! Run: `scripts/with-kube cargo run --release -p trainyard-api --bin kube-bench` (defaults: 1,000
//! nodes, 10,000 tasks; `-- --nodes N --tasks T`, or `-- --quick` for 50 nodes and 300 tasks).
//! `--admission-only` measures admissions alone (each half ends when every job is admitted, not Running: the
//! pods' start is the training operator's and kube-scheduler's work, shared by both), and `--max-s S` (default
//! 1800) ends a half after S seconds, measuring over what it did by then.

// The benchmark's setup writes users, tokens and settings straight into the store before any server runs.
#![allow(clippy::disallowed_methods)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};
use trainyard_api::backends::AnyBackend;
use trainyard_api::{AppState, new_token, token_hash};
use trainyard_control::secrets::SecretBox;
use trainyard_core::Catalog;
use trainyard_kube::client::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use trainyard_kube::client::runtime::watcher;
use trainyard_kube::openapi::api::core::v1::{Namespace, Node};
use trainyard_kube::status::JobKind;
use trainyard_kube::views::job_resource;
use trainyard_kube::{KubeBackend, KubeConfig};
use trainyard_store::{Store, User};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

type Client = trainyard_kube::client::Client;

const NODE_CPUS: u32 = 16;
const NODE_MEMORY_GIB: u32 = 64;
const CLIENTS: usize = 32;

fn arg(args: &[String], name: &str) -> Option<usize> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok())
}

fn pct(v: &[Duration], p: f64) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v.get(((v.len().max(1) - 1) as f64 * p).round() as usize).copied().unwrap_or_default()
}

/// What a run waits for.
#[derive(Debug, Clone, Copy)]
struct Mode {
    admission_only: bool,
    max: Duration,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let mode = Mode {
        admission_only: args.iter().any(|a| a == "--admission-only"),
        max: Duration::from_secs(arg(&args, "--max-s").unwrap_or(1800) as u64),
    };
    let nodes = arg(&args, "--nodes").unwrap_or(if quick { 50 } else { 1_000 });
    let tasks = arg(&args, "--tasks").unwrap_or(if quick { 300 } else { 10_000 });
    if std::env::var_os("TRAINYARD_KUBE_STACK").is_none() {
        eprintln!("kube-bench needs the test cluster: run it under scripts/with-kube");
        std::process::exit(2);
    }
    assert!(
        nodes as u64 * u64::from(NODE_CPUS) >= tasks as u64,
        "{tasks} one-CPU tasks need more than {nodes} nodes"
    );
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let client: Client = rt.block_on(Client::try_default()).expect("a client from KUBECONFIG");
    println!("kube-bench: {nodes} kwok nodes, {tasks} one-replica PyTorchJobs, {CLIENTS} clients");

    let t = Instant::now();
    let names = rt.block_on(make_nodes(&client, nodes));
    println!("  nodes made and Ready in {:.1} s", t.elapsed().as_secs_f64());

    let ty = rt.block_on(trainyard(&client, &names, tasks, mode));
    let kueue = if rt.block_on(kueue_installed(&client)) {
        rt.block_on(drain(&client, "bench-ty-bench"));
        Some(rt.block_on(kueue_run(&client, nodes, tasks, mode)))
    } else {
        println!(
            "  Kueue is not running in this stack (scripts/with-kube --without-kueue): its half is skipped"
        );
        None
    };

    println!();
    println!("{:<58} {:>12} {:>12} {:>8}", "", "Trainyard", "Kueue", "ratio");
    let row = |what: &str, a: f64, b: Option<f64>, unit: &str| {
        let b_text = b.map_or("-".to_owned(), |b| format!("{b:.1}{unit}"));
        let ratio = b.filter(|b| *b > 0.0).map_or("-".to_owned(), |b| format!("{:.1}x", a / b));
        println!("{what:<58} {:>12} {b_text:>12} {ratio:>8}", format!("{a:.1}{unit}"));
    };
    row(
        "admissions/s (first submit until the last job admitted)",
        ty.admit_rate,
        kueue.as_ref().map(|k| k.admit_rate),
        "",
    );
    row("jobs admitted", ty.admitted as f64, kueue.as_ref().map(|k| k.admitted as f64), "");
    if !mode.admission_only {
        row(
            "jobs Running/s (first submit until every job Running)",
            ty.rate,
            kueue.as_ref().map(|k| k.rate),
            "",
        );
        row(
            "submit-to-Running latency p50 (s)",
            ty.p50.as_secs_f64(),
            kueue.as_ref().map(|k| k.p50.as_secs_f64()),
            "",
        );
        row(
            "submit-to-Running latency p99 (s)",
            ty.p99.as_secs_f64(),
            kueue.as_ref().map(|k| k.p99.as_secs_f64()),
            "",
        );
    }
    println!("{:<58} {:>12.2}", "Trainyard's API requests per admission", ty.requests_per_admission);
    println!(
        "(goal: at least 10x Kueue's admission rate; Kueue's published figure is about 51 admissions/s)"
    );
}

#[derive(Debug)]
struct Outcome {
    /// Jobs admitted (by the end of the run).
    admitted: usize,
    /// Jobs admitted per second, from the first submit until the last admission.
    admit_rate: f64,
    /// Jobs Running per second, from the first submit until the last is Running.
    rate: f64,
    p50: Duration,
    p99: Duration,
    requests_per_admission: f64,
}

/// `n` kwok nodes named `bench-<i>`, Ready (the node lifecycle controller has lifted their not-ready taint).
async fn make_nodes(client: &Client, n: usize) -> Vec<String> {
    let api: Api<Node> = Api::all(client.clone());
    let names: Vec<String> = (0..n).map(|i| format!("bench-{i}")).collect();
    futures_util::stream::iter(names.clone())
        .for_each_concurrent(64, |name| {
            let api = api.clone();
            async move {
                let body = json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {
                        "name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                        "labels": {"kubernetes.io/hostname": name, "type": "kwok", "trainyard.dev/pool": "default"},
                    },
                });
                api.patch(&name, &PatchParams::apply("kube-bench").force(), &Patch::Apply(&body)).await.unwrap();
                let r = json!({"cpu": NODE_CPUS.to_string(), "memory": format!("{NODE_MEMORY_GIB}Gi"), "pods": "1000"});
                let status = json!({"status": {"capacity": r, "allocatable": r}});
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
            }
        })
        .await;
    loop {
        let list = api.list(&Default::default()).await.unwrap();
        let ready = list
            .items
            .iter()
            .filter(|n| n.metadata.name.as_deref().is_some_and(|x| x.starts_with("bench-")))
            .filter(|n| trainyard_kube::views::node_down(n).is_none())
            .filter(|n| n.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| !c.is_empty()))
            .filter(|n| {
                n.spec.as_ref().and_then(|s| s.taints.as_ref()).is_none_or(|t| {
                    t.iter().all(|t| {
                        t.key != "node.kubernetes.io/not-ready" && t.key != "node.kubernetes.io/unreachable"
                    })
                })
            })
            .count();
        if ready == n {
            return names;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// When each job of a run was first seen admitted (it exists, not suspended: Trainyard created it, or Kueue
/// let it go) and first seen with its `Running` condition, by the job's `key` label.
#[derive(Debug, Default)]
struct Seen {
    admitted: HashMap<String, Instant>,
    running: HashMap<String, Instant>,
}

/// Watches the PyTorchJobs of `namespace`, noting what [`Seen`] holds.
fn watch_jobs(client: &Client, namespace: &str, key: &'static str) -> Arc<Mutex<Seen>> {
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &job_resource(JobKind::PyTorch));
    let out = seen.clone();
    tokio::spawn(async move {
        let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = stream.next().await {
            let objs = match ev {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => vec![o],
                _ => continue,
            };
            for o in objs {
                let running = o.data["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Running" && c["status"] == "True"));
                let admitted = o.data["spec"]["runPolicy"]["suspend"] != json!(true);
                let Some(id) = o.metadata.labels.as_ref().and_then(|l| l.get(key)).cloned() else { continue };
                let mut seen = out.lock().unwrap();
                if admitted {
                    seen.admitted.entry(id.clone()).or_insert_with(Instant::now);
                }
                if running {
                    seen.running.entry(id).or_insert_with(Instant::now);
                }
            }
        }
    });
    seen
}

/// Waits until every job is admitted (`--admission-only`) or Running, or the mode's time is up.
async fn wait_all(seen: &Mutex<Seen>, n: usize, what: &str, mode: Mode) {
    let t0 = Instant::now();
    let state = if mode.admission_only { "admitted" } else { "Running" };
    loop {
        let got = {
            let s = seen.lock().unwrap();
            if mode.admission_only { s.admitted.len() } else { s.running.len() }
        };
        if got >= n {
            return;
        }
        if t0.elapsed() >= mode.max {
            println!(
                "  {what}: {got} of {n} {state} after {:.0} s: measured over that",
                t0.elapsed().as_secs_f64()
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn outcome(submitted: &HashMap<String, Instant>, seen: &Seen, t0: Instant, requests: u64) -> Outcome {
    let running = &seen.running;
    let admitted_end = seen.admitted.values().max().copied().unwrap_or(t0);
    let end = running.values().max().copied().unwrap_or(t0);
    let lat: Vec<Duration> = running
        .iter()
        .filter_map(|(id, at)| submitted.get(id).map(|s| at.saturating_duration_since(*s)))
        .collect();
    Outcome {
        admitted: seen.admitted.len(),
        admit_rate: seen.admitted.len() as f64 / admitted_end.duration_since(t0).as_secs_f64().max(1e-9),
        rate: running.len() as f64 / end.duration_since(t0).as_secs_f64().max(1e-9),
        p50: pct(&lat, 0.5),
        p99: pct(&lat, 0.99),
        requests_per_admission: requests as f64 / seen.admitted.len().max(1) as f64,
    }
}

async fn trainyard(client: &Client, nodes: &[String], tasks: usize, mode: Mode) -> Outcome {
    let dir = std::env::temp_dir().join(format!("kube-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store = Store::connect(&format!("sqlite://{}", dir.join("trainyard.db").display())).await.unwrap();
    let node_lines: String = nodes
        .iter()
        .map(|n| {
            format!("  {n}: {{pool: default, vcpus: {NODE_CPUS}, memoryMib: {}}}\n", NODE_MEMORY_GIB * 1024)
        })
        .collect();
    let catalog = Catalog::from_yaml(&format!(
        "regions: {{kubernetes: {{}}}}\n\
         clusters: {{kubernetes: {{region: kubernetes}}}}\n\
         pools: {{default: {{cluster: kubernetes, instanceSpecs: [cpu.small]}}}}\n\
         instanceSpecs: {{cpu.small: {{kind: CPU, vcpus: 1, memoryMib: 1024}}}}\n\
         nodes:\n{node_lines}\
         projectGroups: {{bench: {{}}}}\n\
         images: {{bench: {{torch: true}}}}\n\
         quotas: [{{group: bench, resourceType: Reserved, pool: default, spec: cpu.small, units: {}}}]\n",
        nodes.len() as u32 * NODE_CPUS
    ))
    .unwrap();
    let cfg = KubeConfig {
        namespace: "bench-ty-{group}".into(),
        images: [("bench".to_owned(), "registry.invalid/bench:1".to_owned())].into(),
        data_dir: dir.join("kube"),
        ..KubeConfig::default()
    };
    let kube = KubeBackend::connect(cfg).await.unwrap();
    assert!(kube.synced(Duration::from_secs(60)).await);
    store
        .put_user(&User { name: "admin".into(), role: "admin".into(), groups: vec!["bench".into()] }, 0)
        .await
        .unwrap();
    let token = new_token().unwrap();
    store.add_token(&token_hash(&token), "admin", "bench", 0).await.unwrap();
    // Thousands of tasks queue at once, from one user: past the default cap on queued tasks.
    let unlimited = trainyard_api::settings::AdminSettings {
        max_queued_tasks_per_user: trainyard_api::settings::MAX_QUEUED_TASKS_CAP,
    };
    unlimited.save(&store, 0).await.unwrap();
    let secrets = SecretBox::generate().unwrap();
    let probe = store.clone();
    let state = AppState::new(
        store,
        catalog,
        AnyBackend::Kube(trainyard_kube::KubeFleet::single(kube.clone())),
        secrets,
        trainyard_sched::Config::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(trainyard_api::serve(listener, state));

    let running = watch_jobs(client, "bench-ty-bench", "trainyard.dev/task");
    let body = json!({
        "apiVersion": "trainyard.dev/v1", "kind": "TrainingTask",
        "metadata": {"namePrefix": "bench", "projectGroup": "bench"},
        "spec": {
            "type": "PyTorchJob",
            "placement": {"region": "kubernetes", "cluster": "kubernetes"},
            "environment": {"image": "bench", "cmd": "python3 train.py"},
            "compute": {"resourceType": "Reserved", "pool": "default", "workers": 0,
                        "instanceSpecs": [{"spec": "cpu.small"}]}
        }
    })
    .to_string();
    let submitted: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let requests_before = kube.requests();
    let t0 = Instant::now();
    let per_client = tasks.div_ceil(CLIENTS);
    let handles: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (base, token, body, submitted) =
                (base.clone(), token.clone(), body.clone(), submitted.clone());
            let n = per_client.min(tasks.saturating_sub(c * per_client));
            std::thread::spawn(move || {
                let agent: ureq::Agent =
                    ureq::Agent::config_builder().http_status_as_error(false).build().into();
                for i in 0..n {
                    let at = Instant::now();
                    let mut r = agent
                        .post(&format!("{base}/api/v1/tasks"))
                        .header("Authorization", &format!("Bearer {token}"))
                        .header("Idempotency-Key", &format!("bench-{c}-{i}"))
                        .send(body.as_bytes())
                        .unwrap();
                    let text = r.body_mut().read_to_string().unwrap();
                    assert_eq!(r.status().as_u16(), 201, "{text}");
                    let v: Value = serde_json::from_str(&text).unwrap();
                    submitted.lock().unwrap().insert(v["id"].as_str().unwrap().to_owned(), at);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    println!("  Trainyard: {tasks} submitted in {:.1} s", t0.elapsed().as_secs_f64());
    // When the scheduler had admitted every task (nothing left Queued), apart from the cluster's side.
    loop {
        let counts = probe.count_by_status().await.unwrap();
        if counts.get("Queued").copied().unwrap_or(0) == 0 && counts.values().sum::<i64>() >= tasks as i64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("  Trainyard: every task admitted by its scheduler after {:.2} s", t0.elapsed().as_secs_f64());
    wait_all(&running, tasks, "Trainyard", mode).await;
    let out =
        outcome(&submitted.lock().unwrap(), &running.lock().unwrap(), t0, kube.requests() - requests_before);
    println!("  Trainyard: done after {:.1} s", t0.elapsed().as_secs_f64());
    let streams = kube.telemetry().log_requests.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "  Trainyard: {streams} log streams opened besides ({:.2} per admission; at most {} open at once)",
        streams as f64 / tasks.max(1) as f64,
        trainyard_kube::capture::MAX_LOG_STREAMS
    );
    out
}

async fn kueue_installed(client: &Client) -> bool {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ClusterQueue", "clusterqueues"));
    api.list(&Default::default()).await.is_ok()
        && std::process::Command::new("pgrep")
            .args(["-f", "bin/kueue"])
            .output()
            .is_ok_and(|o| o.status.success())
}

fn kueue(kind: &str, plural: &str) -> trainyard_kube::client::api::ApiResource {
    trainyard_kube::client::api::ApiResource::from_gvk_with_plural(
        &trainyard_kube::client::api::GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta1", kind),
        plural,
    )
}

/// Deletes a namespace and waits until it (and its pods) are gone, so the next half starts on empty nodes.
async fn drain(client: &Client, ns: &str) {
    let t = Instant::now();
    let api: Api<Namespace> = Api::all(client.clone());
    let _ = api.delete(ns, &Default::default()).await;
    while api.get_opt(ns).await.unwrap().is_some() {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("  namespace {ns} and its pods gone in {:.1} s", t.elapsed().as_secs_f64());
}

async fn kueue_run(client: &Client, nodes: usize, tasks: usize, mode: Mode) -> Outcome {
    let ns = "bench-kueue";
    let pp = PatchParams::apply("kube-bench").force();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .patch(
            ns,
            &pp,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})),
        )
        .await
        .unwrap();
    let flavor = json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "bench"}});
    let rf: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ResourceFlavor", "resourceflavors"));
    rf.patch("bench", &pp, &Patch::Apply(&flavor)).await.unwrap();
    let cq = json!({
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": "bench"},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [{
                "coveredResources": ["cpu", "memory"],
                "flavors": [{"name": "bench", "resources": [
                    {"name": "cpu", "nominalQuota": (nodes as u32 * NODE_CPUS).to_string()},
                    {"name": "memory", "nominalQuota": format!("{}Gi", nodes as u32 * NODE_MEMORY_GIB)},
                ]}],
            }],
        },
    });
    let cqs: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ClusterQueue", "clusterqueues"));
    cqs.patch("bench", &pp, &Patch::Apply(&cq)).await.unwrap();
    let lq = json!({
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
        "metadata": {"name": "bench", "namespace": ns}, "spec": {"clusterQueue": "bench"},
    });
    let lqs: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &kueue("LocalQueue", "localqueues"));
    lqs.patch("bench", &pp, &Patch::Apply(&lq)).await.unwrap();

    let running = watch_jobs(client, ns, "bench/id");
    let jobs: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &job_resource(JobKind::PyTorch));
    let submitted: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let t0 = Instant::now();
    futures_util::stream::iter(0..tasks)
        .for_each_concurrent(CLIENTS, |i| {
            let (jobs, submitted) = (jobs.clone(), submitted.clone());
            async move {
                let id = format!("k{i}");
                let res = json!({"cpu": "1", "memory": "1Gi"});
                let job: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                    "metadata": {"name": format!("bench-{i}"), "namespace": ns,
                                 "labels": {"kueue.x-k8s.io/queue-name": "bench", "bench/id": id}},
                    "spec": {
                        "runPolicy": {"suspend": true, "backoffLimit": 0},
                        "pytorchReplicaSpecs": {"Master": {"replicas": 1, "restartPolicy": "Never", "template": {
                            "spec": {"containers": [{"name": "pytorch", "image": "registry.invalid/bench:1",
                                "command": ["bash", "-c", "python3 train.py"],
                                "resources": {"requests": res, "limits": res}}]},
                        }}},
                    },
                }))
                .unwrap();
                let at = Instant::now();
                jobs.create(&PostParams::default(), &job).await.unwrap();
                submitted.lock().unwrap().insert(id, at);
            }
        })
        .await;
    println!("  Kueue: {tasks} created in {:.1} s", t0.elapsed().as_secs_f64());
    wait_all(&running, tasks, "Kueue", mode).await;
    println!("  Kueue: done after {:.1} s", t0.elapsed().as_secs_f64());
    outcome(&submitted.lock().unwrap(), &running.lock().unwrap(), t0, 0)
}
