//! Submit to the first line of every replica, for a 1 + 2 PyTorchJob on real pods: through Trainyard
//! (`trainyard up --backend kubernetes`, its API, its log capture), against the same job created directly
//! (the training operator and kube-scheduler alone, the pods' logs read from the API server) and the same job
//! admitted by Kueue (suspended under a LocalQueue whose ClusterQueue covers the real nodes). The three
//! alternate run by run, after one warm-up run each (the image is on both nodes before any timed run).
//!
//!   scripts/with-kube --real-nodes 2 cargo run --release -p trainyard --bin kube-pods-bench [-- --runs N]
//!
//! Each replica runs the stack's small base image (bash) with `echo "first line from $HOSTNAME"; sleep 15`, one
//! CPU each (the real nodes have two each: the three pods fill three of four). Every client polls every 50 ms:
//! Trainyard's logs API, or the pods and their logs on the API server.

use serde_json::{Value, json};
use std::time::{Duration, Instant};
use trainyard_kube::client::api::{
    Api, DeleteParams, DynamicObject, ListParams, LogParams, Patch, PatchParams,
};
use trainyard_kube::client::{Client, api::ApiResource, api::GroupVersionKind};
use trainyard_kube::openapi::api::core::v1::{Namespace, Pod};
use trainyard_kube::status::JobKind;
use trainyard_kube::views::job_resource;

#[path = "shared/up.rs"]
mod up;

/// The master stays long enough for the workers to start: a PyTorchJob ends with its master, and its workers
/// wait in the operator's init container until the master's name resolves.
const CMD: &str = "echo \"first line from $HOSTNAME\"; sleep 15";
const POLL: Duration = Duration::from_millis(50);
const TOLERATION: &str =
    r#"{"key": "trainyard.dev/real", "operator": "Equal", "value": "true", "effect": "NoSchedule"}"#;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Trainyard,
    Direct,
    Kueue,
}

fn need(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set: run under scripts/with-kube --real-nodes 2"))
}

fn kueue(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta1", kind), plural)
}

fn catalog(nodes: &[String]) -> String {
    let nodes: String =
        nodes.iter().map(|n| format!("  {n}: {{pool: real, vcpus: 2, memoryMib: 4096}}\n")).collect();
    format!(
        "regions: {{kubernetes: {{}}}}\nclusters: {{kubernetes: {{region: kubernetes}}}}\n\
         pools: {{real: {{cluster: kubernetes, instanceSpecs: [cpu.tiny], tolerations: [{TOLERATION}]}}}}\n\
         instanceSpecs: {{cpu.tiny: {{kind: CPU, vcpus: 1, memoryMib: 256}}}}\nnodes:\n{nodes}\
         projectGroups: {{default: {{}}}}\nimages: {{base: {{}}}}\n\
         quotas: [{{group: default, resourceType: Reserved, pool: real, spec: cpu.tiny, units: 8}}]\n"
    )
}

/// The job as a user would write it for the operator: the same pods Trainyard makes, less its extras.
fn job(name: &str, ns: &str, image: &str, queued: bool) -> Value {
    let template = json!({"spec": {
        "containers": [{
            "name": "pytorch", "image": image, "imagePullPolicy": "IfNotPresent",
            "command": ["bash", "-c", CMD],
            "resources": {"requests": {"cpu": "1", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}},
        }],
        "nodeSelector": {"trainyard.dev/real": "true"},
        "tolerations": [serde_json::from_str::<Value>(TOLERATION).unwrap()],
    }});
    let mut labels = json!({"bench": "kube-pods"});
    if queued {
        labels["kueue.x-k8s.io/queue-name"] = "bench".into();
    }
    json!({
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "runPolicy": {"cleanPodPolicy": "None", "suspend": queued},
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "restartPolicy": "Never", "template": template},
                "Worker": {"replicas": 2, "restartPolicy": "Never", "template": template},
            },
        },
    })
}

/// Creates the job on the API server and waits for the first line of its three pods; then until they end.
async fn direct(client: &Client, ns: &str, name: &str, image: &str, queued: bool) -> Duration {
    let jobs: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &job_resource(JobKind::PyTorch));
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let body: DynamicObject = serde_json::from_value(job(name, ns, image, queued)).unwrap();
    let t0 = Instant::now();
    jobs.create(&Default::default(), &body).await.unwrap();
    let selector = ListParams::default().labels(&format!("training.kubeflow.org/job-name={name}"));
    let mut seen = std::collections::BTreeSet::new();
    let took = loop {
        for p in pods.list(&selector).await.unwrap().items {
            let pod = p.metadata.name.clone().unwrap_or_default();
            let phase = p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
            if seen.contains(&pod) || !["Running", "Succeeded"].contains(&phase.as_str()) {
                continue;
            }
            if pods.logs(&pod, &LogParams::default()).await.is_ok_and(|l| l.contains("first line")) {
                seen.insert(pod);
            }
        }
        if seen.len() == 3 {
            break t0.elapsed();
        }
        assert!(t0.elapsed() < Duration::from_secs(300), "{name}: first lines of {seen:?} only");
        tokio::time::sleep(POLL).await;
    };
    // Until every pod has ended, then the job goes (and its pods with it).
    loop {
        let items = pods.list(&selector).await.unwrap().items;
        let ended = items.iter().all(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|ph| ph == "Succeeded" || ph == "Failed")
        });
        if ended {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    jobs.delete(name, &DeleteParams::background()).await.unwrap();
    while !pods.list(&selector).await.unwrap().items.is_empty() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    took
}

/// Submits the task to Trainyard and waits for the first line of its three replicas in Trainyard's logs; then
/// until it has succeeded.
fn trainyard(api: &up::Api, run: usize) -> Duration {
    let task = json!({
        "apiVersion": "trainyard.dev/v1", "kind": "TrainingTask",
        "metadata": {"namePrefix": format!("bench-{run}"), "projectGroup": "default"},
        "spec": {
            "type": "PyTorchJob",
            "placement": {"region": "kubernetes", "cluster": "kubernetes"},
            "environment": {"image": "base", "cmd": CMD},
            "compute": {"resourceType": "Reserved", "pool": "real", "workers": 2, "instanceSpecs": [{"spec": "cpu.tiny"}]},
        },
    });
    let t0 = Instant::now();
    let (status, body) = api.call("POST", "/api/v1/tasks", Some(&task.to_string()));
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_str().unwrap().to_owned();
    let mut seen = std::collections::BTreeSet::new();
    let took = loop {
        let (_, logs) = api.call("GET", &format!("/api/v1/tasks/{id}/logs"), None);
        let replicas: Vec<String> = logs["items"]
            .as_array()
            .and_then(|a| a.last())
            .and_then(|a| a["replicas"].as_array())
            .map(|r| r.iter().filter_map(|x| x["name"].as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        for r in replicas.iter() {
            if seen.contains(r) {
                continue;
            }
            let url = format!("{}/api/v1/tasks/{id}/logs?replica={r}", api.base);
            let text = api
                .agent
                .get(&url)
                .header("Authorization", &api.auth)
                .call()
                .ok()
                .and_then(|mut r| r.body_mut().read_to_string().ok())
                .unwrap_or_default();
            if text.contains("first line") {
                seen.insert(r.clone());
            }
        }
        if seen.len() == 3 {
            break t0.elapsed();
        }
        assert!(t0.elapsed() < Duration::from_secs(300), "{id}: first lines of {seen:?} only");
        std::thread::sleep(POLL);
    };
    let t = Instant::now();
    while api.status(&id) != "Succeeded" {
        assert!(t.elapsed() < Duration::from_secs(120), "{id} is {}", api.status(&id));
        std::thread::sleep(Duration::from_millis(200));
    }
    took
}

fn median(v: &[f64]) -> (f64, f64, f64) {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let runs: usize =
        std::env::args().skip_while(|a| a != "--runs").nth(1).and_then(|n| n.parse().ok()).unwrap_or(10);
    let image = need("TRAINYARD_KUBE_BASE_IMAGE");
    let nodes: Vec<String> = need("TRAINYARD_KUBE_REAL_NODES").split(',').map(str::to_owned).collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt.block_on(Client::try_default()).expect("a client from KUBECONFIG");

    let dir = std::env::temp_dir().join(format!("ty-kube-pods-bench-{}", std::process::id()));
    let (server, api) = up::start_with(
        &dir,
        &catalog(&nodes),
        &[
            "--backend",
            "kubernetes",
            "--kube-namespace",
            "bench-ty-{group}",
            "--kube-image",
            &format!("base={image}"),
        ],
    );
    // The server and its data dir go however this ends (a failed run panics).
    let _server = Stopped(server, dir);

    let pp = PatchParams::apply("kube-pods-bench").force();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let kueue_on = rt.block_on(async {
        for ns in ["bench-direct", "bench-kueue"] {
            let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            namespaces.patch(ns, &pp, &Patch::Apply(&body)).await.unwrap();
        }
        let rf: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ResourceFlavor", "resourceflavors"));
        let flavor = json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "bench-pods"}});
        if rf.patch("bench-pods", &pp, &Patch::Apply(&flavor)).await.is_err() {
            return false;
        }
        // Kueue's own quota for the real nodes' room (4 CPUs), one queue for the namespace.
        let cq = json!({
            "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": "bench-pods"},
            "spec": {"namespaceSelector": {}, "resourceGroups": [{
                "coveredResources": ["cpu", "memory"],
                "flavors": [{"name": "bench-pods", "resources": [
                    {"name": "cpu", "nominalQuota": "4"}, {"name": "memory", "nominalQuota": "4Gi"},
                ]}],
            }]},
        });
        let cqs: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ClusterQueue", "clusterqueues"));
        cqs.patch("bench-pods", &pp, &Patch::Apply(&cq)).await.unwrap();
        let lq = json!({
            "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
            "metadata": {"name": "bench", "namespace": "bench-kueue"}, "spec": {"clusterQueue": "bench-pods"},
        });
        let lqs: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), "bench-kueue", &kueue("LocalQueue", "localqueues"));
        lqs.patch("bench", &pp, &Patch::Apply(&lq)).await.unwrap();
        true
    });
    let modes: Vec<Mode> = if kueue_on {
        vec![Mode::Trainyard, Mode::Direct, Mode::Kueue]
    } else {
        println!("Kueue is not installed in this cluster: its column is left out");
        vec![Mode::Trainyard, Mode::Direct]
    };
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); 3];
    for run in 0..=runs {
        for &mode in &modes {
            let took = match mode {
                Mode::Trainyard => trainyard(&api, run),
                Mode::Direct => {
                    rt.block_on(direct(&client, "bench-direct", &format!("d-{run}"), &image, false))
                }
                Mode::Kueue => rt.block_on(direct(&client, "bench-kueue", &format!("k-{run}"), &image, true)),
            };
            // Run 0 is the warm-up.
            if run > 0 {
                times[mode as usize].push(took.as_secs_f64() * 1000.0);
            }
        }
    }
    println!("1 + 2 PyTorchJob on 2 real nodes, submit until every replica's first line, {runs} runs each:");
    println!("{:<44}{:>9}{:>9}{:>9}", "", "p50 ms", "min ms", "max ms");
    let names = [
        "Trainyard (its API and log capture)",
        "training operator alone (kubectl create)",
        "Kueue, then the training operator",
    ];
    for &mode in &modes {
        let (p50, lo, hi) = median(&times[mode as usize]);
        println!("{:<44}{p50:>9.0}{lo:>9.0}{hi:>9.0}", names[mode as usize]);
    }
}

/// A server stopped, and its data dir removed, when dropped.
struct Stopped(std::process::Child, std::path::PathBuf);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}
