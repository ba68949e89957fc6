//! End to end on real pods: `trainyard up --backend kubernetes` against the test cluster's real nodes
//! (`scripts/with-kube --real-nodes 2`: two kubelets with containerd and runc on this machine, CNI bridges
//! routed to each other, CoreDNS, kube-proxy, a registry on 127.0.0.1). The examples under
//! `examples/kubernetes/` that say they run there are submitted with the CLI as they are, and what their
//! containers print is checked through Trainyard's own logs API: a 1 + 2 torchrun all-reduce across pods on
//! both nodes, DDP training, the precheck's init container, SSH between pods, the exit checkpoint's `preStop`
//! hook on a stop, a metrics endpoint scraped.
//!
//! The task image is built here from this machine's Debian packages (`python3-torch`, OpenSSH, bash) and
//! pushed to the stack's registry; the nodes' containerd pulls it from there.

mod common;

use common::{Options, Server, secs};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use trainyard_images::testing::{
    TAR_LAYER, debian_closure, dirs_layer, host_layer, owned_files_layer, push_to,
};

/// The image's reference in the stack's registry.
const IMAGE: &str = "trainyard/torch:e2e-3";

/// The stack's registry and real nodes.
fn real_stack() -> (String, Vec<String>) {
    let need = |k: &str| {
        std::env::var(k).unwrap_or_else(|_| {
            panic!(
                "{k} is not set: these tests need the test cluster's real nodes; scripts/test starts them \
                 (or run `scripts/with-kube --real-nodes 2 cargo test --test kube_pods`)"
            )
        })
    };
    let nodes = need("TRAINYARD_KUBE_REAL_NODES").split(',').map(str::to_owned).collect();
    (need("TRAINYARD_KUBE_REGISTRY"), nodes)
}

/// Builds the task image and pushes it, unless the registry has it already (the stack's registry lives as
/// long as the stack: once per test run).
fn push_image(registry: &str) -> String {
    let reference = format!("{registry}/{IMAGE}");
    let (repo, tag) = IMAGE.split_once(':').unwrap();
    let url = format!("http://{registry}/v2/{repo}/manifests/{tag}");
    let have = common::agent()
        .head(&url)
        .header("Accept", "application/vnd.oci.image.manifest.v1+json")
        .call()
        .is_ok_and(|r| r.status() == 200);
    if have {
        return reference;
    }
    let t0 = Instant::now();
    let files = debian_closure(&[
        "python3-torch",
        "bash",
        "coreutils",
        "openssh-server",
        "openssh-client",
        "hostname",
    ]);
    // The users sshd needs (its privilege separation user) and root's home; the host's own files are not copied.
    let etc = owned_files_layer(&[
        (
            "etc/passwd",
            b"root:x:0:0:root:/root:/bin/bash\nsshd:x:100:65534::/run/sshd:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
            0o644,
            0,
        ),
        ("etc/group", b"root:x:0:\nnogroup:x:65534:\n", 0o644, 0),
        ("etc/nsswitch.conf", b"passwd: files\ngroup: files\nhosts: files dns\n", 0o644, 0),
    ]);
    let dirs = dirs_layer(&[("tmp", 0o1777), ("root", 0o700), ("run", 0o755), ("var/tmp", 0o1777)]);
    push_to(
        registry,
        repo,
        tag,
        &[(TAR_LAYER, host_layer(&files)), (TAR_LAYER, etc), (TAR_LAYER, dirs)],
        json!({"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONUNBUFFERED=1"]}),
    );
    eprintln!("pushed {reference} in {:.1} s", t0.elapsed().as_secs_f64());
    reference
}

/// The catalog: the stack's real nodes (pool `real`, as the stack labels them; their taint tolerated) and the
/// torch image.
fn catalog(nodes: &[String]) -> String {
    let nodes: String =
        nodes.iter().map(|n| format!("  {n}: {{pool: real, vcpus: 2, memoryMib: 4096}}\n")).collect();
    format!(
        "regions: {{kubernetes: {{}}}}\n\
         clusters: {{kubernetes: {{region: kubernetes}}}}\n\
         pools: {{real: {{cluster: kubernetes, instanceSpecs: [cpu.small], tolerations: \
           [{{key: trainyard.dev/real, operator: Equal, value: \"true\", effect: NoSchedule}}]}}}}\n\
         instanceSpecs: {{cpu.small: {{kind: CPU, vcpus: 1, memoryMib: 1024}}}}\n\
         nodes:\n{nodes}\
         projectGroups: {{default: {{}}}}\n\
         images: {{pytorch: {{torch: true}}}}\n\
         quotas: [{{group: default, resourceType: Reserved, pool: real, spec: cpu.small, units: 8}}]\n"
    )
}

/// Submits an example with the CLI; returns the task's id and name.
fn submit_example(s: &Server, file: &str) -> (String, String) {
    let printed = s.cli(&["submit", "-f", &format!("examples/kubernetes/{file}"), "-o", "json"]);
    let v: Value = serde_json::from_str(printed.trim()).unwrap_or_else(|e| panic!("{e}: {printed}"));
    (v["id"].as_str().unwrap().to_owned(), v["name"].as_str().unwrap().to_owned())
}

/// Waits for a terminal status and asserts it is `want`, with the events and logs when it is not.
fn ends(s: &Server, id: &str, want: &str, timeout: Duration) -> Value {
    let t0 = Instant::now();
    loop {
        let t = s.task(id);
        let status = t["status"].as_str().unwrap_or("").to_owned();
        if ["Succeeded", "Failed", "Stopped"].contains(&status.as_str()) {
            assert_eq!(status, want, "events:\n{}\nlogs:\n{}", s.events_text(id), s.all_logs(id));
            return t;
        }
        assert!(
            t0.elapsed() < timeout,
            "{id} is {status} after {timeout:?}; events:\n{}\nlogs:\n{}",
            s.events_text(id),
            s.all_logs(id)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The replicas' names of a task's latest attempt.
fn replicas(s: &Server, id: &str) -> Vec<String> {
    let (_, body) = s.call("GET", &format!("/api/v1/tasks/{id}/logs"), None);
    let v: Value = serde_json::from_str(&body).unwrap();
    let last = v["items"].as_array().unwrap().last().cloned().unwrap_or(Value::Null);
    last["replicas"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The replica of a task's latest attempt whose name ends so (the pods are named by the job, not the task).
fn replica(s: &Server, id: &str, suffix: &str) -> String {
    let names = replicas(s, id);
    names.iter().find(|r| r.ends_with(suffix)).cloned().unwrap_or_else(|| panic!("no {suffix} in {names:?}"))
}

/// The text lines (without the timestamp and stream) of a replica's log.
fn lines(s: &Server, id: &str, replica: &str) -> Vec<String> {
    s.log(id, replica, None).lines().filter_map(|l| l.split_once(" O ").map(|(_, t)| t.to_owned())).collect()
}

fn server(registry: &str, nodes: &[String]) -> Server {
    let image = push_image(registry);
    let namespace = format!("pods-{}-{{group}}", std::process::id());
    let s = Server::start_with(
        "kube-pods",
        Options {
            args: ["--backend", "kubernetes", "--kube-namespace", &namespace, "--kube-image"]
                .map(str::to_owned)
                .into_iter()
                .chain([format!("pytorch={image}")])
                .collect(),
            own_catalog: true,
            ..Options::default()
        },
    );
    let (status, body) = s.call("PUT", "/api/v1/admin/catalog", Some(&catalog(nodes)));
    assert_eq!(status, 200, "{body}");
    s
}

/// Whether to run an example: all of them, unless `TRAINYARD_KUBE_EXAMPLES` names some (comma-separated file
/// names), for work on one.
fn wanted(file: &str) -> bool {
    std::env::var("TRAINYARD_KUBE_EXAMPLES").map_or(true, |v| v.split(',').any(|f| f == file))
}

#[test]
fn the_examples_run_on_real_pods() {
    let (registry, nodes) = real_stack();
    let s = server(&registry, &nodes);
    if wanted("torchrun-gloo.yaml") {
        torchrun_gloo(&s, &nodes);
    }
    if wanted("ddp-train.yaml") {
        ddp_train(&s);
    }
    if wanted("precheck.yaml") {
        precheck(&s);
    }
    if wanted("ssh.yaml") {
        ssh(&s);
    }
    if wanted("checkpoint.yaml") {
        checkpoint(&s);
    }
    if wanted("metrics.yaml") {
        metrics(&s);
    }
}

/// Custom metrics: the pod's endpoint is scraped through the API server's pod proxy while it runs, and the
/// samples are served by Trainyard's metrics API after the pod is gone.
fn metrics(s: &Server) {
    let (id, _) = submit_example(s, "metrics.yaml");
    ends(s, &id, "Succeeded", secs(600));
    let (status, body) = s.call("GET", &format!("/api/v1/tasks/{id}/metrics"), None);
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let series = v["series"].as_array().unwrap();
    let find = |name: &str| {
        series.iter().find(|x| x["name"] == name).unwrap_or_else(|| panic!("no {name} in {body}"))
    };
    assert_eq!(find("train_loss")["labels"]["phase"], "train", "{body}");
    let steps: Vec<f64> =
        find("train_step")["points"].as_array().unwrap().iter().map(|p| p[1].as_f64().unwrap()).collect();
    assert!(steps.len() >= 2, "scraped every 5 s for about 25 s: {steps:?}");
    assert!(steps.windows(2).all(|w| w[0] <= w[1]) && steps.last() > steps.first(), "{steps:?}");
    eprintln!("metrics.yaml: train_step scraped {} times: {steps:?}", steps.len());
}

/// A 1 + 2 torchrun all-reduce: three pods on the two nodes, each rank's line in its own log.
fn torchrun_gloo(s: &Server, nodes: &[String]) {
    let (id, _) = submit_example(s, "torchrun-gloo.yaml");
    let t = ends(s, &id, "Succeeded", secs(600));
    let names = replicas(s, &id);
    assert_eq!(names.len(), 3, "{names:?}");
    let mut ranks = Vec::new();
    for r in &names {
        let got = lines(s, &id, r);
        let line =
            got.iter().find(|l| l.contains("all-reduce gave 6.0")).unwrap_or_else(|| panic!("{r}: {got:?}"));
        ranks.push(line.clone());
    }
    eprintln!("torchrun-gloo.yaml:\n  {}", ranks.join("\n  "));
    let placed = t["placement"].to_string();
    for n in nodes {
        assert!(placed.contains(n.as_str()), "the replicas are spread over both nodes: {placed}");
    }
}

/// DDP: the weights are the same on every rank at the end.
fn ddp_train(s: &Server) {
    let (id, _) = submit_example(s, "ddp-train.yaml");
    ends(s, &id, "Succeeded", secs(600));
    for r in replicas(s, &id) {
        let got = lines(s, &id, &r);
        assert!(got.iter().any(|l| l.contains("identical on all 2 ranks")), "{r}: {got:?}");
        eprintln!("ddp-train.yaml {r}: {}", got.last().unwrap());
    }
}

/// The precheck runs in each pod's init container before the command, and its result is an event.
fn precheck(s: &Server) {
    let (id, _) = submit_example(s, "precheck.yaml");
    ends(s, &id, "Succeeded", secs(600));
    let events = s.events_text(&id);
    assert!(events.contains("PrecheckPassed"), "{events}");
    for l in events.lines().filter(|l| l.contains("PrecheckPassed")) {
        eprintln!("precheck.yaml event: {}", l.trim());
    }
    for r in replicas(s, &id) {
        let got = lines(s, &id, &r);
        assert!(
            got.iter().any(|l| l.contains("starts after the precheck")),
            "{r}: {got:?}\nevents:\n{}",
            s.events_text(&id)
        );
    }
}

/// SSH from the master to the worker by its name.
fn ssh(s: &Server) {
    let (id, _) = submit_example(s, "ssh.yaml");
    ends(s, &id, "Succeeded", secs(600));
    let master = replica(s, &id, "-master-0");
    let got = lines(s, &id, &master);
    let worker = replica(s, &id, "-worker-0");
    let line = got.iter().find(|l| l.starts_with("ssh ")).unwrap_or_else(|| panic!("{got:?}"));
    assert!(line.ends_with(&format!("hostname: {worker}")), "{got:?}\n{}", s.all_logs(&id));
    eprintln!("ssh.yaml: {line}");
}

/// The exit checkpoint: a stop runs the pod's preStop hook, which signals the command; it saves and says so.
fn checkpoint(s: &Server) {
    let (id, _) = submit_example(s, "checkpoint.yaml");
    s.wait_status(&id, "Running", secs(600));
    let t0 = Instant::now();
    let master = loop {
        if let Some(m) = replicas(s, &id).into_iter().find(|r| r.ends_with("-master-0")) {
            break m;
        }
        assert!(t0.elapsed() < secs(120), "no master's log: {}", s.events_text(&id));
        std::thread::sleep(Duration::from_millis(250));
    };
    s.wait_log(&id, &master, "training", secs(600));
    s.cli(&["stop", &id]);
    ends(s, &id, "Stopped", secs(120));
    let got = lines(s, &id, &master);
    let saved = got.iter().find(|l| l.contains("(the platform asked)")).unwrap_or_else(|| panic!("{got:?}"));
    eprintln!("checkpoint.yaml: {saved}");
    // The hook's steps are the task's events, as on the local backend.
    let events = s.events_text(&id);
    assert!(events.contains("CheckpointRequested") && events.contains("CheckpointDone"), "{events}");
    for l in events.lines().filter(|l| l.contains("Checkpoint")) {
        eprintln!("checkpoint.yaml event: {}", l.trim());
    }
}
