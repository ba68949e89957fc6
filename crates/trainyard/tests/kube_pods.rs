//! End to end on real pods: `trainyard up --backend kubernetes` against the test cluster's real nodes
//! (`scripts/with-kube --real-nodes 2`: two kubelets with containerd and runc on this machine, CNI bridges
//! routed to each other, CoreDNS, kube-proxy, a registry on 127.0.0.1). The examples under
//! `examples/kubernetes/` that say they run there are submitted with the CLI as they are, and what their
//! containers print is checked through Trainyard's own logs API: a 1 + 2 torchrun all-reduce across pods on
//! both nodes, DDP training, the precheck's init container, SSH between pods, the exit checkpoint's `preStop`
//! hook on a stop, a metrics endpoint scraped, a RayJob with a real Ray head and two workers whose driver's
//! output is the task's log, an image from the stack's private registry pulled with the
//! admin's registry login as the pods' `imagePullSecrets` (and refused to another group's task).
//!
//! The task image is built here from this machine's Debian packages (`python3-torch`, OpenSSH, bash) and
//! pushed to the stack's registry; the nodes' containerd pulls it from there.

mod common;

use common::{Options, Server, secs};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use trainyard_images::testing::{
    TAR_LAYER, debian_closure, dirs_layer, host_layer, owned_dirs_layer, owned_files_layer, push_to,
    push_to_as,
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

/// Whether the registry has `repo:tag` (the stack's registry lives as long as the stack: an image is built
/// once per test run).
fn in_registry(registry: &str, repo: &str, tag: &str) -> bool {
    common::agent()
        .head(&format!("http://{registry}/v2/{repo}/manifests/{tag}"))
        .header("Accept", "application/vnd.oci.image.manifest.v1+json")
        .call()
        .is_ok_and(|r| r.status() == 200)
}

/// The torch image with a user of its own (`trainer`, uid 1000) on top: its catalog entry says `runAsUser`.
const USER_IMAGE: &str = "trainyard/torch-user:e2e-4";
const USER_UID: u32 = 1000;

/// Builds the task image and the same with a user of its own, and pushes them, unless the registry has them
/// already (the stack's registry lives as long as the stack: once per test run). Returns their references.
fn push_image(registry: &str) -> (String, String) {
    let reference = format!("{registry}/{IMAGE}");
    let user_reference = format!("{registry}/{USER_IMAGE}");
    let (repo, tag) = IMAGE.split_once(':').unwrap();
    let (user_repo, user_tag) = USER_IMAGE.split_once(':').unwrap();
    let have = (in_registry(registry, repo, tag), in_registry(registry, user_repo, user_tag));
    if have == (true, true) {
        return (reference, user_reference);
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
    let mut layers = vec![(TAR_LAYER, host_layer(&files)), (TAR_LAYER, etc), (TAR_LAYER, dirs)];
    let config = json!({"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONUNBUFFERED=1"]});
    if !have.0 {
        push_to(registry, repo, tag, &layers, config);
    }
    // The user's entry (sshd looks the login up there) and a home it may write, on top.
    let passwd = format!(
        "root:x:0:0:root:/root:/bin/bash\nsshd:x:100:65534::/run/sshd:/usr/sbin/nologin\n\
         trainer:x:{USER_UID}:{USER_UID}:trainer:/home/trainer:/bin/bash\n\
         nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    );
    let group = format!("root:x:0:\ntrainer:x:{USER_UID}:\nnogroup:x:65534:\n");
    layers.push((
        TAR_LAYER,
        owned_files_layer(&[
            ("etc/passwd", passwd.as_bytes(), 0o644, 0),
            ("etc/group", group.as_bytes(), 0o644, 0),
        ]),
    ));
    // Its home as `useradd -m` makes it: the user's own (the last layer with anything under it, as a layer's
    // implicit parent dirs would be root's).
    layers.push((
        TAR_LAYER,
        owned_dirs_layer(&[("home", 0o755, 0), ("home/trainer", 0o750, u64::from(USER_UID))]),
    ));
    if !have.1 {
        // As an image built `USER trainer` with its HOME set.
        let user_config = json!({
            "User": USER_UID.to_string(),
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONUNBUFFERED=1",
                    "HOME=/home/trainer"],
        });
        push_to(registry, user_repo, user_tag, &layers, user_config);
    }
    eprintln!("pushed {reference} and {user_reference} in {:.1} s", t0.elapsed().as_secs_f64());
    (reference, user_reference)
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
         instanceSpecs: {{cpu.small: {{kind: CPU, vcpus: 1, memoryMib: 2048}}}}\n\
         nodes:\n{nodes}\
         projectGroups: {{default: {{}}, strict: {{}}}}\n\
         images: {{pytorch: {{torch: true}}, ray: {{ray: true, rayVersion: \"2.60.0\"}}, \
           pytorch-user: {{torch: true, runAsUser: {USER_UID}, runAsGroup: {USER_UID}}}}}\n\
         quotas: [{{group: default, resourceType: Reserved, pool: real, spec: cpu.small, units: 8}}, \
           {{group: strict, resourceType: Reserved, pool: real, spec: cpu.small, units: 4}}]\n"
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
    let (image, user_image) = push_image(registry);
    let ray =
        if wanted("ray-job.yaml") { push_ray_image(registry) } else { format!("{registry}/{RAY_IMAGE}") };
    let namespace = format!("pods-{}-{{group}}", std::process::id());
    let instance = format!("pods-{}", std::process::id());
    // The replicas fetch their working directory from this server: it listens where pods reach the host (a
    // real node's address, its bridge's gateway), and the init container is the server's own image.
    let port = std::net::TcpListener::bind("0.0.0.0:0").unwrap().local_addr().unwrap().port();
    let node_ip = kubectl(&[
        "get",
        "node",
        &nodes[0],
        "-o",
        "jsonpath={.status.addresses[?(@.type==\"InternalIP\")].address}",
    ]);
    let server_image = common::server_image::push(registry);
    let s = Server::start_with(
        "kube-pods",
        Options {
            listen: Some(format!("0.0.0.0:{port}")),
            // An instance of its own, apart from other tests' servers on the same stack.
            args: ["--backend", "kubernetes", "--kube-namespace", &namespace, "--kube-instance", &instance]
                .map(str::to_owned)
                .into_iter()
                .chain(["--kube-image".to_owned(), format!("pytorch={image}")])
                .chain(["--kube-image".to_owned(), format!("ray={ray}")])
                .chain(["--kube-image".to_owned(), format!("pytorch-user={user_image}")])
                .chain(["--kube-workdir-image".to_owned(), server_image])
                .chain(["--kube-workdir-url".to_owned(), format!("http://{}:{port}", node_ip.trim())])
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
    if wanted("ray-job.yaml") {
        ray_job(&s);
    }
    if wanted("drain") {
        drain(&s, &nodes);
    }
    if wanted("network-policy") {
        network_policy(&s, &nodes);
    }
    if wanted("private-image.yaml") {
        private_image(&s, &nodes);
    }
    if wanted("restricted.yaml") {
        restricted(&s);
    }
    if wanted("workdir.yaml") {
        workdir(&s);
    }
}

/// Issue 34: the user's code goes with the task to real pods. The shipped example, sent with `--workdir`,
/// trains on a master and a worker that each import the `toy` package from their copy at /workspace. Then,
/// as an attacker who read a running attempt's token (from its Secret): it reads that task's working
/// directory and nothing else (another id, another group, the API), a token with its attempt changed is
/// refused, and once the attempt is over the token is worth nothing.
fn workdir(s: &Server) {
    let printed = s.cli(&[
        "submit",
        "-f",
        "examples/kubernetes/workdir.yaml",
        "--workdir",
        "examples/local/workdir",
        "-o",
        "json",
    ]);
    // Standard output (the task) comes first; what the upload says on standard error after it.
    let v: Value = serde_json::Deserializer::from_str(&printed)
        .into_iter::<Value>()
        .next()
        .and_then(Result::ok)
        .unwrap_or_else(|| panic!("no task in: {printed}"));
    let id = v["id"].as_str().unwrap().to_owned();
    ends(s, &id, "Succeeded", secs(600));
    let names = replicas(s, &id);
    assert_eq!(names.len(), 2, "{names:?}");
    for r in &names {
        let got = lines(s, &id, r);
        assert!(got.iter().any(|l| l.contains("(the data's is 3.00)")), "{r}: {got:?}");
        eprintln!("workdir.yaml {r}: {}", got.iter().rev().find(|l| l.contains("slope")).unwrap());
    }
    let wd = s.task(&id)["spec"]["spec"]["environment"]["workdir"].as_str().unwrap().to_owned();

    // A task that holds its pod a while, on the same working directory.
    let task = json!({
        "apiVersion": "trainyard.dev/v1", "kind": "TrainingTask",
        "metadata": {"namePrefix": "wd-hold", "projectGroup": "default"},
        "spec": {
            "type": "PyTorchJob",
            "placement": {"region": "kubernetes", "cluster": "kubernetes"},
            "environment": {"image": "pytorch", "workdir": wd, "cmd": "test -f /workspace/toy/model.py && sleep 120"},
            "compute": {"resourceType": "Reserved", "pool": "real", "workers": 0,
                        "instanceSpecs": [{"spec": "cpu.small"}]},
        }
    });
    let (status, body) = s.call("POST", "/api/v1/tasks", Some(&task.to_string()));
    assert_eq!(status, 201, "{body}");
    let hold = serde_json::from_str::<Value>(&body).unwrap()["id"].as_str().unwrap().to_owned();
    let t0 = Instant::now();
    while s.task(&hold)["status"] != "Running" {
        assert!(t0.elapsed() < secs(300), "{}", s.events_text(&hold));
        std::thread::sleep(Duration::from_millis(500));
    }
    let namespace = format!("pods-{}-default", std::process::id());
    let secrets: Value = serde_json::from_str(&kubectl(&[
        "get",
        "secrets",
        "-n",
        &namespace,
        "-l",
        &format!("trainyard.dev/task={hold}"),
        "-o",
        "json",
    ]))
    .unwrap();
    let token = secrets["items"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|sec| sec["data"]["workdir-token"].as_str())
        .map(|b| {
            use base64::Engine;
            String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b).unwrap()).unwrap()
        })
        .unwrap_or_else(|| panic!("no workdir-token in {secrets}"));
    let get = |path: &str, token: &str| {
        let r = common::agent()
            .get(&format!("{}{path}", s.base))
            .header("Authorization", &format!("Bearer {token}"))
            .call()
            .unwrap();
        r.status().as_u16()
    };
    let own = format!("/api/v1/workdirs/{wd}?projectGroup=default");
    assert_eq!(get(&own, &token), 200, "the attempt reads its own working directory");
    assert_eq!(get(&format!("/api/v1/workdirs/{wd}/files?projectGroup=default"), &token), 200);
    assert_eq!(get(&format!("/api/v1/workdirs/{}?projectGroup=default", "0".repeat(64)), &token), 404);
    assert_eq!(get(&format!("/api/v1/workdirs/{wd}?projectGroup=strict"), &token), 404, "another group's");
    assert_eq!(get("/api/v1/tasks", &token), 401, "it is no API token");
    assert_eq!(get("/api/v1/workdirs", &token), 401);
    // tyw.TASK.ATTEMPT.MAC: the next attempt's number on this attempt's MAC.
    let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
    let n = parts.len();
    parts[n - 2] = (parts[n - 2].parse::<u32>().unwrap() + 1).to_string();
    let forged = parts.join(".");
    assert_eq!(get(&own, &forged), 401, "its attempt changed");
    let (status, body) = s.call("POST", &format!("/api/v1/tasks/{hold}/stop"), None);
    assert!(status < 300, "{body}");
    ends(s, &hold, "Stopped", secs(120));
    assert_eq!(get(&own, &token), 401, "the attempt is over");
}

/// Issue 32: Pod Security `restricted` on a group's namespace. A task of an image that runs as a user of its
/// own (the catalog's `runAsUser`) runs there, as that user, SSH included; the same task of a root image is
/// refused by the namespace and ends at once as the task's to fix, in the cluster's words, not resubmitted.
fn restricted(s: &Server) {
    let ns = format!("pods-{}-strict", std::process::id());
    // Made here unless an earlier step's task made it (Trainyard makes a group's namespace at its first launch).
    if !kubectl_run(&["get", "namespace", &ns]).0 {
        kubectl(&["create", "namespace", &ns]);
    }
    kubectl(&["label", "namespace", &ns, "pod-security.kubernetes.io/enforce=restricted"]);

    // A root image: refused, at once (well within the 600 s start-up deadline).
    let example = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kubernetes/restricted.yaml"),
    )
    .unwrap();
    let root = example
        .replace("image: pytorch-user", "image: pytorch")
        .replace("  advanced:\n", "  advanced:\n    faultTolerance: {enabled: true, maxResubmissions: 2}\n");
    let file = std::env::temp_dir().join(format!("restricted-root-{}.yaml", std::process::id()));
    std::fs::write(&file, root).unwrap();
    let printed = s.cli(&["submit", "-f", file.to_str().unwrap(), "-o", "json"]);
    let _ = std::fs::remove_file(&file);
    let v: Value = serde_json::from_str(printed.trim()).unwrap_or_else(|e| panic!("{e}: {printed}"));
    let id = v["id"].as_str().unwrap().to_owned();
    let t0 = Instant::now();
    let t = ends(s, &id, "Failed", secs(300));
    let took = t0.elapsed();
    let events = s.events_text(&id);
    let failed = events.lines().find(|l| l.contains("UserError")).unwrap_or_else(|| panic!("{events}"));
    assert!(failed.contains("violates PodSecurity") && failed.contains("runAsUser"), "{events}");
    assert_eq!(t["attempt"], 0, "a user error is not resubmitted: {events}");
    eprintln!("restricted.yaml, root image: Failed after {:.1} s: {}", took.as_secs_f64(), failed.trim());

    // The image with a user of its own: admitted, run as that user, SSH as that user.
    let (id, _) = submit_example(s, "restricted.yaml");
    ends(s, &id, "Succeeded", secs(600));
    let master = replica(s, &id, "-master-0");
    let worker = replica(s, &id, "-worker-0");
    let got = lines(s, &id, &master);
    let all = s.all_logs(&id);
    assert!(
        got.iter().any(|l| l == &format!("rank 0 runs as trainer (uid {USER_UID}), HOME=/home/trainer")),
        "{all}"
    );
    let ssh = got.iter().find(|l| l.starts_with("ssh ")).unwrap_or_else(|| panic!("{all}"));
    assert!(ssh.ends_with(&format!(": trainer on {worker}")), "{all}");
    assert!(
        got.iter().any(|l| l.starts_with("torch ") && l.ends_with(&format!("as uid {USER_UID}"))),
        "{all}"
    );
    // What the namespace admitted: the pods as the objects say, checked by the API server's Pod Security.
    let pod = kubectl(&["get", "pod", "-n", &ns, &master, "-o", "jsonpath={.spec.securityContext}"]);
    assert!(
        pod.contains("\"runAsNonRoot\":true") && pod.contains(&format!("\"runAsUser\":{USER_UID}")),
        "{pod}"
    );
    eprintln!("restricted.yaml: {ssh} | {}", got.iter().find(|l| l.starts_with("torch ")).unwrap());
}

/// Issue 32: every attempt's NetworkPolicy, enforced. The stack's kube-router polices the pods of the first real
/// node: task A (group `default`) runs there, its master listening on a port, and its own worker reaches it;
/// task B, of another group, on the other node, is refused by the policy (its DNS works), and the same probe
/// gets in once A's NetworkPolicy is deleted (so the refusal was the policy's). A's two replicas are put on the policed node by taking the others out of Trainyard's catalog
/// meanwhile; B is placed once they are back.
fn network_policy(s: &Server, nodes: &[String]) {
    let policed = &nodes[0];
    let others = &nodes[1..];
    assert!(!others.is_empty(), "the check needs two real nodes: {nodes:?}");
    let schedulable = |node: &str, yes: bool| -> (u16, String) {
        s.call("PUT", &format!("/api/v1/admin/nodes/{node}"), Some(&format!("{{\"schedulable\": {yes}}}")))
    };
    // The nodes are given back however the step ends (without asserting: a panic in a drop aborts).
    struct Back<'a>(Vec<&'a str>, &'a dyn Fn(&str, bool) -> (u16, String));
    impl Drop for Back<'_> {
        fn drop(&mut self) {
            for n in &self.0 {
                let _ = (self.1)(n, true);
            }
        }
    }
    let back = Back(others.iter().map(String::as_str).collect(), &schedulable);
    for n in others {
        let (status, body) = schedulable(n, false);
        assert!((200..300).contains(&status), "{status} {body}");
    }
    let serve = "python3 - <<'EOF'\n\
        import os, socket, time\n\
        if os.environ['RANK'] == '0':\n\
        \x20   srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
        \x20   srv.bind(('', 9000)); srv.listen(16); print('listening on 9000', flush=True)\n\
        \x20   while True:\n\
        \x20       c, addr = srv.accept(); print('accepted', addr[0], flush=True); c.close()\n\
        else:\n\
        \x20   for i in range(60):\n\
        \x20       try:\n\
        \x20           socket.create_connection((os.environ['MASTER_ADDR'], 9000), timeout=2).close()\n\
        \x20           print('own worker reached the master', flush=True); break\n\
        \x20       except OSError as e:\n\
        \x20           print('not yet:', e, flush=True); time.sleep(1)\n\
        \x20   else:\n\
        \x20       raise SystemExit('never reached the master')\n\
        EOF\n";
    let task = |prefix: &str, group: &str, image: &str, workers: u32, cmd: &str| {
        json!({
            "apiVersion": "trainyard.dev/v1", "kind": "TrainingTask",
            "metadata": {"namePrefix": prefix, "projectGroup": group},
            "spec": {
                "type": "PyTorchJob",
                "placement": {"region": "kubernetes", "cluster": "kubernetes"},
                "environment": {"image": image, "cmd": cmd},
                "compute": {"resourceType": "Reserved", "pool": "real", "workers": workers,
                            "instanceSpecs": [{"spec": "cpu.small"}]},
            }
        })
    };
    let a = s.submit(&task("policed", "default", "pytorch", 1, serve));
    let t = s.wait_status(&a, "Running", secs(300));
    let placed = t["placement"].to_string();
    assert!(
        placed.contains(policed.as_str()) && others.iter().all(|n| !placed.contains(n.as_str())),
        "{placed}"
    );
    let master = replica(s, &a, "-master-0");
    let worker = replica(s, &a, "-worker-0");
    s.wait_log(&a, &worker, "own worker reached the master", secs(120));
    drop(back);

    // B, in group `strict`'s namespace, tries A's master by its Service's name.
    let target = format!("{master}.pods-{}-default.svc.cluster.local", std::process::id());
    let probe = format!(
        "python3 - <<'EOF'\n\
         import socket\n\
         ip = socket.gethostbyname('{target}'); print('resolved', ip, flush=True)\n\
         for i in range(5):\n\
         \x20   try:\n\
         \x20       socket.create_connection((ip, 9000), timeout=3).close(); print('REACHED', flush=True)\n\
         \x20   except OSError as e:\n\
         \x20       print('blocked:', e, flush=True)\n\
         EOF\n"
    );
    let b = s.submit(&task("intruder", "strict", "pytorch-user", 0, &probe));
    let t = ends(s, &b, "Succeeded", secs(300));
    let placed_b = t["placement"].to_string();
    let got = lines(s, &b, &replica(s, &b, "-master-0"));
    let all = s.all_logs(&b);
    assert!(got.iter().any(|l| l.starts_with("resolved 10.244.")), "{all}");
    assert_eq!(got.iter().filter(|l| l.starts_with("blocked:")).count(), 5, "{all}");
    assert!(!got.iter().any(|l| l == "REACHED"), "{all}");
    let served = lines(s, &a, &master);
    assert!(served.iter().any(|l| l.starts_with("accepted ")), "A's worker was let in: {served:?}");

    // The control: without A's NetworkPolicy, the same probe from the same group gets in.
    let ns = format!("pods-{}-default", std::process::id());
    let job = master.strip_suffix("-master-0").unwrap();
    kubectl(&["delete", "networkpolicy", "-n", &ns, job]);
    std::thread::sleep(Duration::from_secs(2));
    let b2 = s.submit(&task("intruder", "strict", "pytorch-user", 0, &probe));
    ends(s, &b2, "Succeeded", secs(300));
    let got2 = lines(s, &b2, &replica(s, &b2, "-master-0"));
    assert!(got2.iter().any(|l| l == "REACHED"), "without the policy: {}", s.all_logs(&b2));
    s.cli(&["stop", &a]);
    s.wait_status(&a, "Stopped", secs(120));
    eprintln!(
        "network-policy: A on {placed}: {:?}; B on {placed_b}: {:?}; without A's policy: {:?}",
        served.iter().filter(|l| l.starts_with("accepted")).collect::<Vec<_>>(),
        got,
        got2
    );
}

/// Uncordons a node however the test ends.
struct Uncordon(String);

impl Drop for Uncordon {
    fn drop(&mut self) {
        let _ = kubectl(&["uncordon", &self.0]);
    }
}

/// Runs the stack's kubectl: whether it succeeded, and what it printed.
fn kubectl_run(args: &[&str]) -> (bool, String) {
    let bin = std::path::PathBuf::from(std::env::var("TRAINYARD_KUBE_BIN").unwrap()).join("kubectl");
    let out = std::process::Command::new(bin).args(args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn kubectl(args: &[&str]) -> String {
    let (ok, text) = kubectl_run(args);
    assert!(ok, "kubectl {args:?}: {text}");
    text
}

/// Issue 32: `kubectl drain` of a node under a running task (its pods evicted) is the cluster's doing, not the
/// task's: the attempt ends as `Disrupted`, the task is resubmitted within its budget, and the next attempt
/// runs on the node left (the drained one is cordoned, so Trainyard's catalog leaves it out).
fn drain(s: &Server, nodes: &[String]) {
    let task = json!({
        "apiVersion": "trainyard.dev/v1", "kind": "TrainingTask",
        "metadata": {"namePrefix": "drained", "projectGroup": "default"},
        "spec": {
            "type": "PyTorchJob",
            "placement": {"region": "kubernetes", "cluster": "kubernetes"},
            "environment": {"image": "pytorch", "cmd": "for i in $(seq 1 20); do echo \"tick $i on $(hostname)\"; sleep 1; done"},
            "compute": {"resourceType": "Reserved", "pool": "real", "workers": 1, "instanceSpecs": [{"spec": "cpu.small"}]},
            "advanced": {"faultTolerance": {"enabled": true, "maxResubmissions": 2}},
        }
    });
    let id = s.submit(&task);
    let t = s.wait_status(&id, "Running", secs(300));
    let placed = t["placement"].to_string();
    let victim = nodes.iter().find(|n| placed.contains(n.as_str())).unwrap().clone();
    let _guard = Uncordon(victim.clone());
    let out = kubectl(&[
        "drain",
        &victim,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--force",
        "--grace-period=5",
        "--timeout=120s",
    ]);
    eprintln!("drain: {}", out.lines().last().unwrap_or(""));
    // Failed for a moment, then requeued: the requeue first, then the end.
    s.wait_event(&id, "Requeued", secs(300));
    let t = ends(s, &id, "Succeeded", secs(600));
    assert_eq!(t["attempt"], 1, "resubmitted once: {}", s.events_text(&id));
    let events = s.events_text(&id);
    let disrupted = events.lines().find(|l| l.contains("Disrupted")).unwrap_or_else(|| panic!("{events}"));
    assert!(disrupted.contains("taken away by the cluster") && disrupted.contains(&victim), "{events}");
    assert!(events.contains("automatic resubmission 1 of 2 after Disrupted"), "{events}");
    let again = t["placement"].to_string();
    assert!(!again.contains(victim.as_str()), "the next attempt left the drained {victim} out: {again}");
    eprintln!("drain: {} | then attempt 1 on {again}", disrupted.trim());
}

/// The Ray image's reference in the stack's registry.
const RAY_IMAGE: &str = "trainyard/ray:e2e-1";

/// Builds the Ray image (this machine's Ray venv, `TRAINYARD_RAY_VENV`, at the same path, with the Debian
/// packages it runs on: Python, the system modules the venv takes from them, and what KubeRay's probes run)
/// and pushes it, unless the registry has it already.
fn push_ray_image(registry: &str) -> String {
    let reference = format!("{registry}/{RAY_IMAGE}");
    let (repo, tag) = RAY_IMAGE.split_once(':').unwrap();
    if in_registry(registry, repo, tag) {
        return reference;
    }
    let t0 = Instant::now();
    let venv = std::path::PathBuf::from(
        std::env::var("TRAINYARD_RAY_VENV").unwrap_or_else(|_| "/opt/trainyard-ray".to_owned()),
    );
    assert!(
        venv.join("bin/ray").exists(),
        "no Ray venv at {} (scripts/install-deps makes it)",
        venv.display()
    );
    let mut files = debian_closure(&[
        "python3",
        "libstdc++6",
        "bash",
        // Ray's job supervisor runs the entrypoint with /bin/sh.
        "dash",
        "coreutils",
        "wget",
        "grep",
        "procps",
        "hostname",
        "libc-bin",
        // What the venv (made with --system-site-packages) takes from the system.
        "python3-attr",
        "python3-chardet",
        "python3-charset-normalizer",
        "python3-click",
        "python3-idna",
        "python3-six",
        "python3-urllib3",
        "python3-yaml",
    ]);
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                walk(&p, out);
            } else {
                out.push(p);
            }
        }
    }
    let mut venv_files = Vec::new();
    walk(&venv, &mut venv_files);
    venv_files.sort();
    files.sort();
    let etc = owned_files_layer(&[
        (
            "etc/passwd",
            b"root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
            0o644,
            0,
        ),
        ("etc/group", b"root:x:0:\nnogroup:x:65534:\n", 0o644, 0),
        ("etc/nsswitch.conf", b"passwd: files\ngroup: files\nhosts: files dns\n", 0o644, 0),
    ]);
    let dirs = dirs_layer(&[("tmp", 0o1777), ("root", 0o700), ("run", 0o755), ("var/tmp", 0o1777)]);
    let path =
        format!("PATH={}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", venv.display());
    push_to(
        registry,
        repo,
        tag,
        &[
            (TAR_LAYER, host_layer(&files)),
            (TAR_LAYER, host_layer(&venv_files)),
            (TAR_LAYER, etc),
            (TAR_LAYER, dirs),
        ],
        json!({"Env": [path, "HOME=/root", "PYTHONUNBUFFERED=1"]}),
    );
    eprintln!("pushed {reference} in {:.1} s", t0.elapsed().as_secs_f64());
    reference
}

/// A RayJob on real pods: a real Ray head and two workers, the entrypoint submitted by KubeRay to the head's job
/// API; the driver's output is the task's first log, through Trainyard's logs API and the CLI.
fn ray_job(s: &Server) {
    let (id, name) = submit_example(s, "ray-job.yaml");
    ends(s, &id, "Succeeded", secs(600));
    let names = replicas(s, &id);
    assert_eq!(names.len(), 4, "the driver, the head and two workers: {names:?}");
    assert!(names[0].ends_with("-driver"), "the driver's log first: {names:?}");
    let driver = lines(s, &id, &names[0]);
    for want in ["Ray nodes alive: 3", "sum of squares 0..29: 8555", "ran on 3 pods"] {
        assert!(
            driver.iter().any(|l| l == want),
            "{want:?} not in the driver's output: {driver:?}\n{}",
            s.all_logs(&id)
        );
    }
    // `trainyard logs NAME` shows the driver's output.
    let shown = s.cli(&["logs", &name]);
    assert!(shown.contains("sum of squares 0..29: 8555"), "{shown}");
    let said: Vec<&String> = driver.iter().rev().take(3).rev().collect();
    eprintln!("ray-job.yaml, the driver's last lines: {said:?}");
}

/// The private image's repository in the stack's private registry.
const PRIVATE_REPO: &str = "team/tools";

/// A small image (bash, coreutils, a marker file) pushed to the stack's registry that needs a login.
fn push_private_image() -> (String, (String, String)) {
    let registry = std::env::var("TRAINYARD_KUBE_PRIVATE_REGISTRY").expect("the stack's private registry");
    let login = std::env::var("TRAINYARD_KUBE_PRIVATE_LOGIN").expect("the private registry's login");
    let (user, password) = login.split_once(':').expect("USER:PASSWORD");
    let files = debian_closure(&["bash", "coreutils"]);
    let marker = owned_files_layer(&[("etc/trainyard-private", b"only with a login\n", 0o644, 0)]);
    push_to_as(
        &registry,
        Some((user, password)),
        PRIVATE_REPO,
        "1",
        &[(TAR_LAYER, host_layer(&files)), (TAR_LAYER, marker)],
        json!({"Env": ["PATH=/usr/bin:/bin"]}),
    );
    (format!("{registry}/{PRIVATE_REPO}:1"), (user.to_owned(), password.to_owned()))
}

/// An image from a registry that needs a login: the admin's login (set with the CLI, the password on standard
/// input) reaches the pods of the group the catalog preset is offered to as their `imagePullSecrets`, and the
/// image runs. Another group's member who types the reference gets no login, and the registry refuses the
/// node's pull: the task fails on the pull, saying so. Without the login the group's own task is refused too.
fn private_image(s: &Server, nodes: &[String]) {
    let (reference, (user, password)) = push_private_image();
    let host = reference.split('/').next().unwrap().to_owned();
    let catalog = catalog(nodes)
        .replace(
            "images: {pytorch: {torch: true},",
            &format!(
                "images: {{private-tools: {{reference: \"{reference}\", projectGroups: [default]}}, pytorch: {{torch: true}},"
            ),
        )
        .replace("projectGroups: {default: {},", "projectGroups: {default: {}, other: {},")
        + "allowExternalImages: true\n";
    let catalog = catalog.replace(
        "quotas: [",
        "quotas: [{group: other, resourceType: Reserved, pool: real, spec: cpu.small, units: 4}, ",
    );
    let (status, body) = s.call("PUT", "/api/v1/admin/catalog", Some(&catalog));
    assert_eq!(status, 200, "{body}");
    let set = s.cli_with_stdin(
        &["admin", "registry", "login", &host, "-u", &user, "--password-stdin"],
        &format!("{password}\n"),
    );
    assert!(set.contains(&format!("login for {host} set")), "{set}");

    // The legitimate path: the example, as it stands.
    let (id, _) = submit_example(s, "private-image.yaml");
    ends(s, &id, "Succeeded", secs(600));
    let master = replica(s, &id, "-master-0");
    let got = lines(s, &id, &master);
    assert!(got.iter().any(|l| l == "from the private image: only with a login"), "{got:?}");
    // An image without /root: the platform's wrapper says nothing of the hostfiles it cannot write.
    assert_eq!(got.len(), 1, "{got:?}");
    eprintln!("private-image.yaml: {}", got.join(" | "));

    // The attack: group `other`'s task names the very reference; its pods get no pull secret.
    let example = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/kubernetes/private-image.yaml"),
    )
    .unwrap();
    let stolen = format!(
        "{}  advanced: {{imagePullTolerance: 1}}\n",
        example
            .replace("projectGroup: default", "projectGroup: other")
            .replace("image: private-tools", &format!("image: \"{reference}\""))
    );
    let (status, body) = s.call("POST", "/api/v1/tasks", Some(&stolen));
    assert_eq!(status, 201, "{body}");
    let id = serde_json::from_str::<Value>(&body).unwrap()["id"].as_str().unwrap().to_owned();
    ends(s, &id, "Failed", secs(300));
    let events = s.events_text(&id);
    assert!(events.to_lowercase().contains("unauthorized") || events.contains("401"), "{events}");
    assert!(!s.all_logs(&id).contains("only with a login"));
    eprintln!(
        "private-image.yaml, group other: {}",
        events.lines().find(|l| l.contains("nauthorized") || l.contains("401")).unwrap_or("").trim()
    );
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
