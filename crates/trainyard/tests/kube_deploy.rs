//! Trainyard in the cluster: `deploy/kubernetes` applied for real on the test stack's real nodes
//! (`scripts/with-kube --real-nodes 2`), as an admin would with a kustomize overlay of their own (their image
//! references, the real nodes' taint tolerated, the task image mapped). The server's image is built here as
//! `deploy/kubernetes/Containerfile` makes it (this build's `trainyard`, Debian's `ca-certificates`,
//! `openssh-client` and `tini`, user 65532) and PostgreSQL's from Debian's `postgresql` with an entrypoint that
//! does what the official image's does with `POSTGRES_USER`, `POSTGRES_DB`, `POSTGRES_PASSWORD` and `PGDATA`.
//! PostgreSQL's claim is bound to a host-path volume on the first real node (the stack has no provisioner).
//!
//! Both replicas start in their pods and reach the API server as in-cluster clients do (their service account,
//! the `kubernetes` Service); one leads. The server takes the real nodes into its catalog, runs a task on real
//! pods, and survives the deletion of the leader's pod under it: the other replica takes over from the store
//! and the cluster, reattaches to the running task, and the task ends well with every line of its log kept,
//! read through both replicas (the Deployment's new pod included).

mod common;

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use trainyard_images::testing::{
    TAR_LAYER, debian_closure, dirs_layer, host_layer, owned_files_layer, push_to,
};

const NS: &str = "trainyard-system";
/// How the task pods reach the server (its Service), to fetch their working directory.
const WORKDIR_URL: &str = "http://trainyard.trainyard-system.svc.cluster.local:8080";

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| {
        panic!(
            "{k} is not set: this test needs the test cluster's real nodes (scripts/with-kube --real-nodes 2)"
        )
    })
}

fn kubectl(args: &[&str], stdin: Option<&str>) -> (bool, String) {
    use std::io::Write;
    let bin = PathBuf::from(env("TRAINYARD_KUBE_BIN")).join("kubectl");
    let mut child = Command::new(bin)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(text) = stdin {
        child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn kubectl_ok(args: &[&str], stdin: Option<&str>) -> String {
    let (ok, text) = kubectl(args, stdin);
    assert!(ok, "kubectl {args:?}: {text}");
    text
}

/// What the official PostgreSQL image's entrypoint does that the manifest relies on: a first start makes the
/// cluster in `PGDATA` with `POSTGRES_USER` and `POSTGRES_PASSWORD` (password logins over the network) and the
/// database `POSTGRES_DB`; every start then runs the server on every address.
const PG_ENTRYPOINT: &str = r#"#!/bin/bash
set -euo pipefail
: "${PGDATA:?}" "${POSTGRES_USER:?}" "${POSTGRES_PASSWORD:?}" "${POSTGRES_DB:=$POSTGRES_USER}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  mkdir -p "$PGDATA" && chmod 700 "$PGDATA"
  pw=$(mktemp)
  printf '%s' "$POSTGRES_PASSWORD" > "$pw"
  initdb -D "$PGDATA" --username="$POSTGRES_USER" --pwfile="$pw" --auth=scram-sha-256 -E UTF8 --locale=C >/dev/null
  rm -f "$pw"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
  PGPASSWORD=$POSTGRES_PASSWORD psql -v ON_ERROR_STOP=1 -h /var/run/postgresql -U "$POSTGRES_USER" -d postgres \
    -c "CREATE DATABASE \"$POSTGRES_DB\"" >/dev/null
  pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  echo "trainyard-pg: made the cluster in $PGDATA with database $POSTGRES_DB"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/var/run/postgresql
"#;

fn push_postgres_image(registry: &str) -> String {
    let bin = std::fs::read_dir("/usr/lib/postgresql")
        .unwrap()
        .flatten()
        .map(|e| e.path().join("bin"))
        .find(|b| b.join("initdb").exists())
        .expect("Debian's PostgreSQL (scripts/install-deps test installs it)");
    let version = bin.parent().unwrap().file_name().unwrap().to_string_lossy().into_owned();
    let files = debian_closure(&[
        &format!("postgresql-{version}"),
        &format!("postgresql-client-{version}"),
        "tzdata",
        "bash",
        "coreutils",
        // pg_ctl starts the server through /bin/sh.
        "dash",
    ]);
    let etc = owned_files_layer(&[
        (
            "etc/passwd",
            b"root:x:0:0:root:/root:/bin/sh\npostgres:x:999:999::/var/lib/postgresql:/bin/bash\n",
            0o644,
            0,
        ),
        ("etc/group", b"root:x:0:\npostgres:x:999:\n", 0o644, 0),
        ("etc/nsswitch.conf", b"passwd: files\ngroup: files\nhosts: files dns\n", 0o644, 0),
        ("usr/local/bin/trainyard-pg-entrypoint", PG_ENTRYPOINT.as_bytes(), 0o755, 0),
    ]);
    let dirs = dirs_layer(&[("tmp", 0o1777), ("var/run/postgresql", 0o2775), ("var/lib/postgresql", 0o755)]);
    let (repo, tag) = ("trainyard/postgres", version.as_str());
    push_to(
        registry,
        repo,
        tag,
        &[(TAR_LAYER, host_layer(&files)), (TAR_LAYER, etc), (TAR_LAYER, dirs)],
        json!({
            "Env": [format!("PATH={}:/usr/local/bin:/usr/bin:/bin", bin.display())],
            "Entrypoint": ["/usr/local/bin/trainyard-pg-entrypoint"],
            "StopSignal": "SIGINT",
        }),
    );
    format!("{registry}/{repo}:{tag}")
}

/// `to` relative to `from` (both absolute): kustomize takes a base only by a relative path.
fn relative(from: &Path, to: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for _ in from.components().skip(1) {
        out.push("..");
    }
    out.join(to.strip_prefix("/").unwrap())
}

/// A host-path volume on `node` for the claim `ns/claim`, in `dir` (made here, owned by `uid`).
fn volume(name: &str, claim: &str, size: &str, dir: &Path, uid: u32, node: &str) -> String {
    volume_shared(name, claim, size, dir, uid, &[node], "ReadWriteOnce")
}

/// A host-path volume as [`volume`], on any of `nodes` with `mode`: the stack's real nodes are kubelets on one
/// machine, so a directory of it is one volume for pods on every one of them (ReadWriteMany, as an NFS
/// share would be).
fn volume_shared(
    name: &str,
    claim: &str,
    size: &str,
    dir: &Path,
    uid: u32,
    nodes: &[&str],
    mode: &str,
) -> String {
    std::fs::create_dir_all(dir).unwrap();
    std::os::unix::fs::chown(dir, Some(uid), Some(uid)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    format!(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: {name}}}\nspec:\n  capacity: {{storage: {size}}}\n  \
         accessModes: [{mode}]\n  persistentVolumeReclaimPolicy: Retain\n  storageClassName: \"\"\n  \
         claimRef: {{namespace: {NS}, name: {claim}}}\n  hostPath: {{path: {}, type: Directory}}\n  nodeAffinity:\n    \
         required:\n      nodeSelectorTerms:\n      - matchExpressions:\n        - {{key: kubernetes.io/hostname, operator: In, values: [{}]}}\n---\n",
        dir.display(),
        nodes.join(", ")
    )
}

/// The running, ready pod of the Deployment: (name, address).
fn ready_pods(n: usize, timeout: Duration) -> Vec<(String, String)> {
    let t0 = Instant::now();
    loop {
        let (_, out) =
            kubectl(&["-n", NS, "get", "pods", "-l", "app.kubernetes.io/name=trainyard", "-o", "json"], None);
        let mut ready = Vec::new();
        if let Ok(v) = serde_json::from_str::<Value>(&out) {
            for p in v["items"].as_array().into_iter().flatten() {
                let is_ready = p["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
                if is_ready && p["metadata"]["deletionTimestamp"].is_null() {
                    ready.push((
                        p["metadata"]["name"].as_str().unwrap().to_owned(),
                        p["status"]["podIP"].as_str().unwrap().to_owned(),
                    ));
                }
            }
        }
        if ready.len() >= n {
            return ready;
        }
        if t0.elapsed() > timeout {
            let (_, pods) = kubectl(&["-n", NS, "get", "pods", "-o", "wide"], None);
            let (_, events) = kubectl(&["-n", NS, "get", "events", "--sort-by=.lastTimestamp"], None);
            let (_, log) =
                kubectl(&["-n", NS, "logs", "-l", "app.kubernetes.io/name=trainyard", "--tail=50"], None);
            let (_, pg) = kubectl(&["-n", NS, "logs", "trainyard-postgres-0", "--tail=30"], None);
            panic!(
                "not {n} ready Trainyard pods after {timeout:?}:\n{pods}\n{events}\nserver:\n{log}\npostgres:\n{pg}"
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The admin token the first start printed, from the replicas' logs.
fn admin_token() -> String {
    let (_, log) = kubectl(&["-n", NS, "logs", "-l", "app.kubernetes.io/name=trainyard", "--tail=-1"], None);
    let mut lines = log.lines();
    while let Some(l) = lines.next() {
        if l.contains("created user admin") {
            if let Some(token) = lines.map(str::trim).find(|t| !t.is_empty()) {
                return token.to_owned();
            }
            break;
        }
    }
    panic!("no admin token in the replicas' logs:\n{log}");
}

struct Api {
    base: String,
    token: String,
}

impl Api {
    fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let agent = common::agent();
        let url = format!("{}{path}", self.base);
        let auth = format!("Bearer {}", self.token);
        let r = match (method, body) {
            ("GET", _) => agent.get(&url).header("Authorization", &auth).call(),
            ("PUT", Some(b)) => agent.put(&url).header("Authorization", &auth).send(b),
            ("POST", Some(b)) => agent.post(&url).header("Authorization", &auth).send(b),
            _ => unreachable!(),
        };
        match r {
            Ok(mut r) => (r.status().as_u16(), r.body_mut().read_to_string().unwrap_or_default()),
            Err(e) => (0, e.to_string()),
        }
    }

    fn events(&self, id: &str) -> String {
        self.call("GET", &format!("/api/v1/tasks/{id}/events"), None).1
    }

    fn wait_status(&self, id: &str, want: &str, timeout: Duration) -> Value {
        let t0 = Instant::now();
        loop {
            let (status, body) = self.call("GET", &format!("/api/v1/tasks/{id}"), None);
            if status == 200 {
                let t: Value = serde_json::from_str(&body).unwrap();
                let now = t["status"].as_str().unwrap_or("").to_owned();
                if now == want {
                    return t;
                }
                assert!(
                    !["Succeeded", "Failed", "Stopped"].contains(&now.as_str()),
                    "{id} ended {now}, not {want}: {}",
                    self.events(id)
                );
            }
            assert!(
                t0.elapsed() < timeout,
                "{id} is not {want} after {timeout:?}: {body}\n{}",
                self.events(id)
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

#[test]
fn trainyard_runs_in_the_cluster_from_its_deploy_manifests() {
    let registry = env("TRAINYARD_KUBE_REGISTRY");
    let stack = PathBuf::from(env("TRAINYARD_KUBE_STACK"));
    let nodes: Vec<String> = env("TRAINYARD_KUBE_REAL_NODES").split(',').map(str::to_owned).collect();
    let base_image = env("TRAINYARD_KUBE_BASE_IMAGE");
    let t0 = Instant::now();
    let server_image = common::server_image::push(&registry);
    let pg_image = push_postgres_image(&registry);
    eprintln!("images pushed in {:.1} s: {server_image}, {pg_image}", t0.elapsed().as_secs_f64());

    // The admin's overlay: their images, the real nodes' taint tolerated and the server's pods kept to them (the
    // stack's simulated nodes would take them too, and run nothing), the task image mapped.
    let overlay = stack.join("deploy-overlay");
    std::fs::create_dir_all(&overlay).unwrap();
    let manifests =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes").canonicalize().unwrap();
    let (server_name, server_tag) = server_image.rsplit_once(':').unwrap();
    let (pg_name, pg_tag) = pg_image.rsplit_once(':').unwrap();
    let toleration = r#"[{key: trainyard.dev/real, operator: Equal, value: "true", effect: NoSchedule}]"#;
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\nimages:\n  \
             - {{name: ghcr.io/trainyard/trainyard, newName: {server_name}, newTag: \"{server_tag}\"}}\n  \
             - {{name: docker.io/library/postgres, newName: {pg_name}, newTag: \"{pg_tag}\"}}\npatches:\n  \
             - target: {{kind: Deployment, name: trainyard}}\n    patch: |-\n      \
             - {{op: add, path: /spec/template/spec/tolerations, value: {toleration}}}\n      \
             - {{op: add, path: /spec/template/spec/nodeSelector, value: {{trainyard.dev/real: \"true\"}}}}\n      \
             - {{op: add, path: /spec/template/spec/containers/0/args/-, value: --kube-image}}\n      \
             - {{op: add, path: /spec/template/spec/containers/0/args/-, value: \"base={base_image}\"}}\n      \
             - {{op: add, path: /spec/template/spec/containers/0/args/-, value: --kube-workdir-image}}\n      \
             - {{op: add, path: /spec/template/spec/containers/0/args/-, value: \"{server_image}\"}}\n      \
             - {{op: add, path: /spec/template/spec/containers/0/args/-, value: --kube-workdir-url}}\n      \
             - {{op: add, path: /spec/template/spec/containers/0/args/-, value: \"{WORKDIR_URL}\"}}\n      \
             - {{op: add, path: /spec/template/spec/containers/0/args/-, value: --workdir-dir}}\n      \
             - {{op: add, path: /spec/template/spec/containers/0/args/-, value: /var/lib/trainyard-workdirs}}\n      \
             - {{op: add, path: /spec/template/spec/containers/0/volumeMounts/-, value: {{name: workdirs, mountPath: /var/lib/trainyard-workdirs}}}}\n      \
             - {{op: add, path: /spec/template/spec/volumes/-, value: {{name: workdirs, persistentVolumeClaim: {{claimName: trainyard-workdirs}}}}}}\n  \
             - target: {{kind: StatefulSet, name: trainyard-postgres}}\n    patch: |-\n      \
             - {{op: add, path: /spec/template/spec/tolerations, value: {toleration}}}\n",
            relative(&overlay, &manifests).display()
        ),
    )
    .unwrap();
    // PostgreSQL's claim's volume on the first real node, owned by the user its manifest runs as.
    let pv = stack.join("deploy-volumes");
    let volumes = volume("trainyard-pg", "data-trainyard-postgres-0", "20Gi", &pv.join("pg"), 999, &nodes[0])
        // Working directories, on one volume both replicas mount (what --workdir-dir asks for).
        + &volume_shared(
            "trainyard-workdirs",
            "trainyard-workdirs",
            "1Gi",
            &pv.join("workdirs"),
            65532,
            &nodes.iter().map(String::as_str).collect::<Vec<_>>(),
            "ReadWriteMany",
        );
    kubectl_ok(&["apply", "-f", "-"], Some(&volumes));
    let overlay_dir = overlay.display().to_string();
    let _gone = Undeploy(overlay_dir.clone());
    kubectl_ok(&["apply", "-k", &overlay_dir], None);
    let claim = format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: trainyard-workdirs, namespace: {NS}}}\n\
         spec: {{accessModes: [ReadWriteMany], storageClassName: \"\", volumeName: trainyard-workdirs, \
         resources: {{requests: {{storage: 1Gi}}}}}}\n"
    );
    kubectl_ok(&["apply", "-f", "-"], Some(&claim));
    let password = format!("pg{}", std::process::id());
    let key = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"; // 32 bytes in hex
    kubectl_ok(
        &[
            "-n",
            NS,
            "create",
            "secret",
            "generic",
            "trainyard-postgres",
            &format!("--from-literal=password={password}"),
        ],
        None,
    );
    kubectl_ok(
        &[
            "-n",
            NS,
            "create",
            "secret",
            "generic",
            "trainyard-server-key",
            &format!("--from-literal=server-key={key}"),
        ],
        None,
    );

    let pods = ready_pods(2, Duration::from_secs(300));
    eprintln!("Trainyard's pods {pods:?} are ready {:.1} s after the apply", t0.elapsed().as_secs_f64());
    let api = Api { base: format!("http://{}:8080", pods[0].1), token: admin_token() };
    // One leads, and says where each replica answers (its pod's address).
    let (status, body) = api.call("GET", "/api/v1/server", None);
    assert_eq!(status, 200, "{body}");
    let servers: Value = serde_json::from_str(&body).unwrap();
    let addresses: Vec<&str> =
        servers["servers"].as_array().unwrap().iter().map(|s| s["address"].as_str().unwrap()).collect();
    for (_, ip) in &pods {
        assert!(addresses.contains(&format!("http://{ip}:8080").as_str()), "{ip} not in {body}");
    }

    // The catalog it took from the cluster's nodes has the real nodes.
    let (status, body) = api.call("GET", "/api/v1/catalog", None);
    assert_eq!(status, 200, "{body}");
    let catalog: Value = serde_json::from_str(&body).unwrap();
    for n in &nodes {
        assert!(
            catalog["nodes"].get(n).is_some(),
            "{n} is not in the catalog it took from the nodes: {body}"
        );
    }
    // The admin's catalog: the real nodes' pool with their taint tolerated. Trainyard does not yet count the
    // pods it did not make (its own and PostgreSQL's on the first node): that node is offered one CPU.
    let node_lines: String = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            format!("  {n}: {{pool: real, vcpus: {}, memoryMib: 4096}}\n", if i == 0 { 1 } else { 2 })
        })
        .collect();
    let mine = format!(
        "regions: {{kubernetes: {{}}}}\nclusters: {{kubernetes: {{region: kubernetes}}}}\n\
         pools: {{real: {{cluster: kubernetes, instanceSpecs: [cpu.small], tolerations: {toleration}}}}}\n\
         instanceSpecs: {{cpu.small: {{kind: CPU, vcpus: 1, memoryMib: 512}}}}\nnodes:\n{node_lines}\
         projectGroups: {{default: {{}}}}\nimages: {{base: {{}}}}\n\
         quotas: [{{group: default, resourceType: Reserved, pool: real, spec: cpu.small, units: 4}}]\n"
    );
    let (status, body) = api.call("PUT", "/api/v1/admin/catalog", Some(&mine));
    assert_eq!(status, 200, "{body}");

    // A task on real pods, long enough to outlive the server's pod, with a working directory: sent through
    // one replica, kept on the volume both mount, read back through the other, and fetched by the task's pods
    // through the Service (either replica answers).
    let project = stack.join("deploy-workdir");
    let _ = std::fs::remove_dir_all(&project);
    std::fs::create_dir_all(project.join("conf")).unwrap();
    std::fs::write(project.join("conf/greeting.txt"), "hello from the working directory\n").unwrap();
    let task = json!({
        "apiVersion": "trainyard.dev/v1", "kind": "TrainingTask",
        "metadata": {"namePrefix": "in-cluster", "projectGroup": "default"},
        "spec": {
            "type": "PyTorchJob",
            "placement": {"region": "kubernetes", "cluster": "kubernetes"},
            // The master ends last: the operator ends the job (and deletes what still runs) when the master ends,
            // and a worker may have started seconds after it.
            "environment": {"image": "base", "cmd": "cat conf/greeting.txt; for i in $(seq 1 45); do echo \"step $i of $RANK\"; sleep 1; done; if [ \"$RANK\" = 0 ]; then sleep 30; fi"},
            "compute": {"resourceType": "Reserved", "pool": "real", "workers": 1,
                        "instanceSpecs": [{"spec": "cpu.small"}]},
        }
    });
    let file = stack.join("deploy-task.json");
    std::fs::write(&file, task.to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["submit", "-f", file.to_str().unwrap(), "--workdir", project.to_str().unwrap(), "-o", "json"])
        .env("TRAINYARD_SERVER", &api.base)
        .env("TRAINYARD_TOKEN", &api.token)
        .env("TRAINYARD_CONFIG", "/dev/null")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let created: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = created["id"].as_str().unwrap().to_owned();
    let workdir = created["spec"]["spec"]["environment"]["workdir"].as_str().unwrap().to_owned();
    let other = Api { base: format!("http://{}:8080", pods[1].1), token: api.token.clone() };
    let (status, body) = other.call("GET", &format!("/api/v1/workdirs/{workdir}?projectGroup=default"), None);
    assert_eq!(status, 200, "the other replica reads the working directory from the shared volume: {body}");
    api.wait_status(&id, "Running", Duration::from_secs(300));

    // The leader's pod deleted: the other replica takes over from the store and the cluster.
    let (_, body) = api.call("GET", "/api/v1/server", None);
    let servers: Value = serde_json::from_str(&body).unwrap();
    let leader = servers["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["leading"] == true)
        .unwrap_or_else(|| panic!("no leader: {body}"))["address"]
        .as_str()
        .unwrap()
        .to_owned();
    let (gone, _) = pods.iter().find(|(_, ip)| leader == format!("http://{ip}:8080")).unwrap().clone();
    let (_, other_ip) = pods.iter().find(|(p, _)| *p != gone).unwrap().clone();
    kubectl_ok(&["-n", NS, "delete", "pod", &gone, "--wait=false"], None);
    let t1 = Instant::now();
    let api = Api { base: format!("http://{other_ip}:8080"), token: api.token };
    let t = api.wait_status(&id, "Succeeded", Duration::from_secs(300));
    assert_eq!(t["attempt"], 0, "the same attempt went on, not a resubmission: {}", api.events(&id));
    eprintln!(
        "the leader's pod {gone} deleted; the task ended well {:.1} s later",
        t1.elapsed().as_secs_f64()
    );
    let admitted = api.events(&id).matches("\"Admitted\"").count();
    assert_eq!(admitted, 2, "admitted once (and started once): {}", api.events(&id));
    // Every line through the replica that took over, and through the Deployment's new pod.
    let now = ready_pods(2, Duration::from_secs(300));
    let (_, new_ip) = now
        .iter()
        .find(|(p, _)| !pods.iter().any(|(q, _)| q == p))
        .unwrap_or_else(|| panic!("no new pod among {now:?} (before: {pods:?})"));
    let new = Api { base: format!("http://{new_ip}:8080"), token: api.token.clone() };
    for api in [&api, &new] {
        let (status, body) = api.call("GET", &format!("/api/v1/tasks/{id}/logs"), None);
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        let replicas: Vec<String> = v["items"][0]["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(replicas.len(), 2, "{body}");
        for r in &replicas {
            let (status, log) = api.call("GET", &format!("/api/v1/tasks/{id}/logs?replica={r}"), None);
            assert_eq!(status, 200, "{log}");
            assert!(
                log.contains(" O hello from the working directory"),
                "{r}: its copy at /workspace:\n{log}"
            );
            let steps = log.lines().filter(|l| l.contains(" O step ")).count();
            assert_eq!(
                steps, 45,
                "{r}: every line kept across the leader's loss, through {}:\n{log}",
                api.base
            );
        }
    }
    eprintln!("task {id}: Succeeded, 45 of 45 lines of each replica kept, read through both servers");
}

/// However the test ends, nothing of the deployment is left on the shared stack (its server and PostgreSQL
/// would hold the first node's CPU for the tests after it): the namespace (and so the server, PostgreSQL and
/// their claims), then the volumes.
struct Undeploy(String);

impl Drop for Undeploy {
    fn drop(&mut self) {
        let (ok, out) = kubectl(&["delete", "-k", &self.0, "--wait=true", "--timeout=120s"], None);
        if !ok {
            eprintln!("undeploying {}: {out}", self.0);
        }
        kubectl(&["delete", "pv", "trainyard-pg", "trainyard-workdirs", "--ignore-not-found"], None);
    }
}
