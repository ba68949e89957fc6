//! The Kubernetes backend's scale benchmark, against the test cluster `scripts/with-kube` starts (a real API
//! server, the real training operator, kube-scheduler, kwok's simulated nodes and pods):
//!
//! 1. N kwok nodes (16 vCPU, 64 GiB each) are made;
//! 2. **Trainyard:** a server (SQLite, the Kubernetes backend) is sent T one-replica PyTorchJob tasks over HTTP
//!    (32 clients at once), spread over G project groups with an equal share of the nodes as quota each;
//!    measured: admissions per second from the first submit until every job object has its `Running`
//!    condition, the submit-to-Running latency per task, and the API requests Trainyard itself sent per
//!    admission (applies, deletions, reads; its watches and the log streams that follow the running pods
//!    counted apart);
//! 3. **Kueue, as its own performance tests set it up** (when the stack runs it, as `scripts/with-kube` does
//!    unless `--without-kueue`): the same T jobs created directly, suspended, in G namespaces, each with a
//!    LocalQueue and a ClusterQueue of its own holding an equal share, all ClusterQueues in one cohort (so
//!    they borrow from each other), admitted by Kueue and placed by kube-scheduler, on the same API server and
//!    nodes; Kueue's client runs at QPS 200, burst 400 (its default is 50 and 100); measured the same way;
//! 4. **Kueue with one ClusterQueue** for all G namespaces (its worst case: one head per queue per cycle), the
//!    earlier form of this benchmark, kept as a second row.
//!
//! Each half runs in a process of its own (this binary with `--half`), so nothing of the one before runs
//! beside it: the machine is idle but for the cluster. Each admitter's API requests are counted from the API
//! server's audit log (`TRAINYARD_KUBE_AUDIT=1` turns it on in the stack) by its user agent (`trainyard/`,
//! `kueue/`), watches still open left out; Trainyard's also by its own client. Without the log, that row is
//! empty.
//!
//! Run: `TRAINYARD_KUBE_AUDIT=1 scripts/with-kube cargo run --release -p trainyard-api --bin kube-bench`
//! (defaults: 1,000 nodes, 10,000 tasks, 8 groups; `-- --nodes N --tasks T --groups G`, or `-- --quick` for
//! 50 nodes and 300 tasks). `--admission-only` measures admissions alone (each half ends when every job is
//! admitted, not Running: the pods' start is the training operator's and kube-scheduler's work, shared by
//! both), and `--max-s S` (default 1800) ends a half after S seconds, measuring over what it did by then.

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

fn flag_value<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).map(String::as_str)
}

/// The halves, each run by a process of its own: (the `--half` value, the row's name).
const HALVES: [(&str, &str); 3] = [
    ("trainyard", "Trainyard"),
    ("kueue", "Kueue, queues in a cohort"),
    ("kueue-one", "Kueue, one ClusterQueue"),
];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let mode = Mode {
        admission_only: args.iter().any(|a| a == "--admission-only"),
        max: Duration::from_secs(arg(&args, "--max-s").unwrap_or(1800) as u64),
    };
    let nodes = arg(&args, "--nodes").unwrap_or(if quick { 50 } else { 1_000 });
    let tasks = arg(&args, "--tasks").unwrap_or(if quick { 300 } else { 10_000 });
    let groups = arg(&args, "--groups").unwrap_or(8).max(1);
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
    let shape = Shape { nodes, tasks, groups };

    // A child: one half, its outcome on the last line.
    if let Some(half) = flag_value(&args, "--half") {
        let out = match half {
            "trainyard" => rt.block_on(trainyard(&client, shape, mode)),
            "kueue" => rt.block_on(kueue_run(&client, shape, mode, true)),
            "kueue-one" => rt.block_on(kueue_run(&client, shape, mode, false)),
            other => panic!("no half {other:?}"),
        };
        println!("RESULT {}", serde_json::to_string(&out).unwrap());
        return;
    }

    println!(
        "kube-bench: {nodes} kwok nodes, {tasks} one-replica PyTorchJobs over {groups} groups, {CLIENTS} clients"
    );
    if audit_mark().is_none() {
        println!("  (no audit log: Kueue's requests are not counted; TRAINYARD_KUBE_AUDIT=1 turns it on)");
    }
    let t = Instant::now();
    rt.block_on(make_nodes(&client, nodes));
    println!("  nodes made and Ready in {:.1} s", t.elapsed().as_secs_f64());
    let kueue_here = rt.block_on(kueue_installed(&client));
    let mut rows: Vec<(&str, Outcome)> = Vec::new();
    for (half, name) in HALVES {
        if half != "trainyard" && !kueue_here {
            println!(
                "  Kueue is not running in this stack (scripts/with-kube --without-kueue): {name} skipped"
            );
            continue;
        }
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args(&args[1..]).args([
            "--half",
            half,
            "--nodes",
            &nodes.to_string(),
            "--tasks",
            &tasks.to_string(),
        ]);
        cmd.args(["--groups", &groups.to_string()]);
        let out = cmd.stderr(std::process::Stdio::inherit()).output().expect("the half runs");
        let text = String::from_utf8_lossy(&out.stdout);
        for line in text.lines().filter(|l| !l.starts_with("RESULT ")) {
            println!("{line}");
        }
        assert!(out.status.success(), "{name}: {}", out.status);
        let result = text.lines().rev().find_map(|l| l.strip_prefix("RESULT ")).expect("the half's outcome");
        rows.push((name, serde_json::from_str(result).unwrap()));
        // The next half starts on empty nodes.
        rt.block_on(drain_prefix(&client, if half == "trainyard" { "bench-ty-" } else { "bench-kq-" }));
    }

    println!();
    print!("{:<56}", "");
    for (name, _) in &rows {
        print!(" {name:>26}");
    }
    println!();
    let row = |what: &str, f: &dyn Fn(&Outcome) -> Option<f64>| {
        print!("{what:<56}");
        for (_, o) in &rows {
            print!(" {:>26}", f(o).map_or("-".to_owned(), |v| format!("{v:.2}")));
        }
        println!();
    };
    row("admissions/s (first submit until the last admitted)", &|o| Some(o.admit_rate));
    row("jobs admitted", &|o| Some(o.admitted as f64));
    if !mode.admission_only {
        row("jobs Running/s (first submit until every job Running)", &|o| Some(o.rate));
        row("submit-to-Running latency p50 (s)", &|o| Some(o.p50_s));
        row("submit-to-Running latency p99 (s)", &|o| Some(o.p99_s));
    }
    row("the admitter's API requests per admission (audit log)", &|o| o.requests_per_admission);
    row("Trainyard's, as its own client counts them", &|o| o.self_counted);
    if let (Some(ty), Some(k)) = (rows.first(), rows.get(1)) {
        let requests = match (ty.1.requests_per_admission, k.1.requests_per_admission) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
            _ => "-".to_owned(),
        };
        println!(
            "Trainyard against Kueue in a cohort: admissions/s {:.2}x, requests per admission {requests}",
            ty.1.admit_rate / k.1.admit_rate.max(1e-9)
        );
    }
}

/// What a run is made of.
#[derive(Debug, Clone, Copy)]
struct Shape {
    nodes: usize,
    tasks: usize,
    groups: usize,
}

impl Shape {
    /// Each group's share of the nodes' CPUs (its quota), rounded up.
    fn share(&self) -> u32 {
        (self.nodes as u32 * NODE_CPUS).div_ceil(self.groups as u32)
    }
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Outcome {
    /// Jobs admitted (by the end of the run).
    admitted: usize,
    /// Jobs admitted per second, from the first submit until the last admission.
    admit_rate: f64,
    /// Jobs Running per second, from the first submit until the last is Running.
    rate: f64,
    p50_s: f64,
    p99_s: f64,
    /// The admitter's API requests per admission as the API server's audit log counts them (by its user
    /// agent; watches still open left out), where there is one.
    requests_per_admission: Option<f64>,
    /// Trainyard's as its own client counts them (every request it sends but its watches).
    self_counted: Option<f64>,
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

/// Watches the PyTorchJobs labelled `key` in every namespace, noting what [`Seen`] holds.
fn watch_jobs(client: &Client, key: &'static str) -> Arc<Mutex<Seen>> {
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &job_resource(JobKind::PyTorch));
    let out = seen.clone();
    tokio::spawn(async move {
        let mut stream = watcher::watcher(api, watcher::Config::default().labels(key)).boxed();
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

fn outcome(submitted: &HashMap<String, Instant>, seen: &Seen, t0: Instant, requests: Option<u64>) -> Outcome {
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
        p50_s: pct(&lat, 0.5).as_secs_f64(),
        p99_s: pct(&lat, 0.99).as_secs_f64(),
        requests_per_admission: requests.map(|r| r as f64 / seen.admitted.len().max(1) as f64),
        self_counted: None,
    }
}

/// The audit log's length now (None without one).
fn audit_mark() -> Option<u64> {
    let path = std::env::var("TRAINYARD_KUBE_AUDIT_LOG").ok()?;
    std::fs::metadata(path).ok().map(|m| m.len())
}

/// Requests completed since `from` whose user agent starts with `agent` (the API server's audit log, one line
/// per request once it completed; watches still open are not in it).
fn audit_count(from: u64, agent: &str) -> Option<u64> {
    use std::io::{BufRead, Seek};
    let path = std::env::var("TRAINYARD_KUBE_AUDIT_LOG").ok()?;
    let mut f = std::fs::File::open(path).ok()?;
    f.seek(std::io::SeekFrom::Start(from)).ok()?;
    let needle = format!("\"userAgent\":\"{agent}");
    Some(std::io::BufReader::new(f).lines().map_while(Result::ok).filter(|l| l.contains(&needle)).count()
        as u64)
}

async fn trainyard(client: &Client, shape: Shape, mode: Mode) -> Outcome {
    let (tasks, nodes) = (shape.tasks, (0..shape.nodes).map(|i| format!("bench-{i}")).collect::<Vec<_>>());
    let groups: Vec<String> = (0..shape.groups).map(|g| format!("g{g}")).collect();
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
         projectGroups: {{{}}}\n\
         images: {{bench: {{torch: true}}}}\n\
         quotas: [{}]\n",
        groups.iter().map(|g| format!("{g}: {{}}")).collect::<Vec<_>>().join(", "),
        groups
            .iter()
            .map(|g| format!(
                "{{group: {g}, resourceType: Reserved, pool: default, spec: cpu.small, units: {}}}",
                shape.share()
            ))
            .collect::<Vec<_>>()
            .join(", ")
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
        .put_user(&User { name: "admin".into(), role: "admin".into(), groups: groups.clone() }, 0)
        .await
        .unwrap();
    let token = new_token().unwrap();
    store.add_token(&token_hash(&token), "admin", "bench", 0).await.unwrap();
    // Thousands of tasks queue at once, from one user: past the default cap on queued tasks.
    let unlimited = trainyard_api::settings::AdminSettings {
        max_queued_tasks_per_user: trainyard_api::settings::MAX_QUEUED_TASKS_CAP,
        ..Default::default()
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

    let running = watch_jobs(client, "trainyard.dev/task");
    // One body per group; task i goes to group i mod G.
    let bodies: Arc<Vec<String>> = Arc::new(
        groups
            .iter()
            .map(|g| {
                json!({
                    "apiVersion": "trainyard.dev/v1", "kind": "TrainingTask",
                    "metadata": {"namePrefix": "bench", "projectGroup": g},
                    "spec": {
                        "type": "PyTorchJob",
                        "placement": {"region": "kubernetes", "cluster": "kubernetes"},
                        "environment": {"image": "bench", "cmd": "python3 train.py"},
                        "compute": {"resourceType": "Reserved", "pool": "default", "workers": 0,
                                    "instanceSpecs": [{"spec": "cpu.small"}]}
                    }
                })
                .to_string()
            })
            .collect(),
    );
    let submitted: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let requests_before = kube.requests();
    let audit_from = audit_mark();
    let t0 = Instant::now();
    let per_client = tasks.div_ceil(CLIENTS);
    let handles: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (base, token, bodies, submitted) =
                (base.clone(), token.clone(), bodies.clone(), submitted.clone());
            let n = per_client.min(tasks.saturating_sub(c * per_client));
            std::thread::spawn(move || {
                let agent: ureq::Agent =
                    ureq::Agent::config_builder().http_status_as_error(false).build().into();
                for i in 0..n {
                    let body = &bodies[(c * per_client + i) % bodies.len()];
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
    let own = kube.requests() - requests_before;
    // The audit log is written in batches at most a second apart.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let audited = audit_from.and_then(|from| audit_count(from, "trainyard/"));
    let mut out = outcome(&submitted.lock().unwrap(), &running.lock().unwrap(), t0, audited);
    out.self_counted = Some(own as f64 / out.admitted.max(1) as f64);
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

/// Deletes the namespaces named `prefix...` and waits until they (and their pods) are gone, so the next half
/// starts on empty nodes.
async fn drain_prefix(client: &Client, prefix: &str) {
    let t = Instant::now();
    let api: Api<Namespace> = Api::all(client.clone());
    let names = |list: Vec<Namespace>| -> Vec<String> {
        list.into_iter().filter_map(|n| n.metadata.name).filter(|n| n.starts_with(prefix)).collect()
    };
    let doomed = names(api.list(&Default::default()).await.unwrap().items);
    for ns in &doomed {
        let _ = api.delete(ns, &Default::default()).await;
    }
    while !names(api.list(&Default::default()).await.unwrap().items).is_empty() {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "  namespaces {prefix}* ({}) and their pods gone in {:.1} s",
        doomed.len(),
        t.elapsed().as_secs_f64()
    );
}

/// Kueue's half: G namespaces, each with a LocalQueue; `cohort`: a ClusterQueue per namespace with an equal
/// share, all in one cohort (as Kueue's own performance tests run it), else one ClusterQueue with everything
/// for every LocalQueue.
async fn kueue_run(client: &Client, shape: Shape, mode: Mode, cohort: bool) -> Outcome {
    let tasks = shape.tasks;
    let pp = PatchParams::apply("kube-bench").force();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let flavor = json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "bench"}});
    let rf: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ResourceFlavor", "resourceflavors"));
    rf.patch("bench", &pp, &Patch::Apply(&flavor)).await.unwrap();
    let cqs: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ClusterQueue", "clusterqueues"));
    let cluster_queue = |name: &str, cpus: u32, cohort: Option<&str>| {
        let mut cq = json!({
            "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": name},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [{
                    "coveredResources": ["cpu", "memory"],
                    "flavors": [{"name": "bench", "resources": [
                        {"name": "cpu", "nominalQuota": cpus.to_string()},
                        {"name": "memory", "nominalQuota": format!("{}Gi", cpus / NODE_CPUS * NODE_MEMORY_GIB + NODE_MEMORY_GIB)},
                    ]}],
                }],
            },
        });
        if let Some(c) = cohort {
            cq["spec"]["cohort"] = c.into();
        }
        cq
    };
    let all_cpus = shape.nodes as u32 * NODE_CPUS;
    let mut queues = Vec::new();
    for g in 0..shape.groups {
        let ns = format!("bench-kq-g{g}");
        let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        namespaces.patch(&ns, &pp, &Patch::Apply(body)).await.unwrap();
        let cq_name = if cohort { format!("bench-g{g}") } else { "bench-one".to_owned() };
        if cohort || g == 0 {
            let cq = if cohort {
                cluster_queue(&cq_name, shape.share(), Some("bench"))
            } else {
                cluster_queue(&cq_name, all_cpus, None)
            };
            cqs.patch(&cq_name, &pp, &Patch::Apply(&cq)).await.unwrap();
        }
        let lq = json!({
            "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
            "metadata": {"name": "bench", "namespace": ns}, "spec": {"clusterQueue": cq_name},
        });
        let lqs: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &ns, &kueue("LocalQueue", "localqueues"));
        lqs.patch("bench", &pp, &Patch::Apply(&lq)).await.unwrap();
        queues.push(ns);
    }
    let what = if cohort { "Kueue (cohort)" } else { "Kueue (one queue)" };
    let running = watch_jobs(client, "bench/id");
    let submitted: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let audit_from = audit_mark();
    let t0 = Instant::now();
    futures_util::stream::iter(0..tasks)
        .for_each_concurrent(CLIENTS, |i| {
            let submitted = submitted.clone();
            let ns = queues[i % queues.len()].clone();
            async move {
                let jobs: Api<DynamicObject> =
                    Api::namespaced_with(client.clone(), &ns, &job_resource(JobKind::PyTorch));
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
    println!("  {what}: {tasks} created in {:.1} s", t0.elapsed().as_secs_f64());
    wait_all(&running, tasks, what, mode).await;
    println!("  {what}: done after {:.1} s", t0.elapsed().as_secs_f64());
    // The audit log is written in batches at most a second apart.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let requests = audit_from.and_then(|from| audit_count(from, "kueue"));
    let out = outcome(&submitted.lock().unwrap(), &running.lock().unwrap(), t0, requests);
    for ns in &queues {
        let lqs: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), ns, &kueue("LocalQueue", "localqueues"));
        let _ = lqs.delete("bench", &Default::default()).await;
    }
    for g in 0..shape.groups {
        let name = if cohort { format!("bench-g{g}") } else { "bench-one".to_owned() };
        let _ = cqs.delete(&name, &Default::default()).await;
    }
    out
}
