//! The local backend end to end: `trainyard up` runs replicas in bubblewrap sandboxes on this machine, and
//! these tests drive it through the HTTP API as a user would.

mod common;

use common::{Options, Server, TORCHRUN_ALL_REDUCE, pytorch, pytorch_on, secs};
use serde_json::json;

/// Rank 0 listens on MASTER_PORT, the others connect and send their rank, all agree on the sum; every
/// replica checks its hostname and context variables, reads the dataset, fails to write it, and writes its
/// result into the volume.
const RENDEZVOUS: &str = r#"python3 - <<'EOF'
import os, socket, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
assert socket.gethostname() == os.environ["TRAINYARD_REPLICA"], socket.gethostname()
for v in ["X_USER_NAME", "X_ORG_NAME", "X_TENANT_ID", "X_REGION", "X_CLUSTER", "TASK_UUID"]:
    assert os.environ.get(v), v
data = open("/mnt/data/input.txt").read().strip()
try:
    open("/mnt/data/written-by-a-replica", "w")
    raise SystemExit("the dataset is writable")
except OSError as e:
    print("dataset is read-only:", e.strerror)
if rank == 0:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen()
    conns = [s.accept()[0] for _ in range(world - 1)]
    total = sum(int(c.recv(64)) for c in conns)
    for c in conns:
        c.sendall(str(total).encode()); c.close()
else:
    for _ in range(600):
        try:
            c = socket.create_connection((addr, port)); break
        except OSError:
            time.sleep(0.1)
    c.sendall(str(rank).encode())
    total = int(c.recv(64))
assert total == world * (world - 1) // 2, total
open(f"/mnt/out/rank-{rank}.txt", "w").write(f"{data} {total} {os.environ['X_USER_NAME']}")
print("agreed on", total, "as rank", rank, "of", world)
EOF"#;

#[test]
fn a_pytorchjob_rendezvous_across_three_replicas_with_mounts() {
    let s = Server::start("rendezvous", None);
    std::fs::create_dir_all(s.dir.join("datasets/data")).unwrap();
    std::fs::write(s.dir.join("datasets/data/input.txt"), "hello-from-the-dataset\n").unwrap();
    // cpu.large takes a node of its own: the gang spreads over the three virtual nodes.
    let mut task = pytorch_on("cpu.large", "rdv", 2, RENDEZVOUS);
    task["spec"]["environment"]["datasets"] = json!([{"dataset": "data", "mountPath": "/mnt/data"}]);
    task["spec"]["environment"]["volumes"] = json!([{"volume": "out", "mountPath": "/mnt/out"}]);
    let id = s.submit(&task);
    let t = s.wait_status(&id, "Succeeded", secs(90));
    let name = t["name"].as_str().unwrap();
    let reasons: Vec<String> = s.events(&id).into_iter().map(|(r, _)| r).collect();
    let order = ["Submitted", "Admitted", "Started", "Completed"];
    let mut at = 0;
    for r in &reasons {
        if at < order.len() && r == order[at] {
            at += 1;
        }
    }
    assert_eq!(at, order.len(), "events in order: {reasons:?}");
    // The three replicas on three nodes, each with its own log.
    let nodes: std::collections::BTreeSet<&str> =
        t["placement"]["replicas"].as_array().unwrap().iter().map(|r| r["node"].as_str().unwrap()).collect();
    assert_eq!(nodes.len(), 3, "{}", t["placement"]);
    for (replica, rank) in [("master-0", 0), ("worker-0", 1), ("worker-1", 2)] {
        let log = s.log(&id, &format!("{name}-{replica}"), None);
        assert!(log.contains(&format!("agreed on 3 as rank {rank} of 3")), "{replica}: {log}");
        assert!(log.contains("dataset is read-only"), "{log}");
        // The volume kept what each replica wrote.
        let out = std::fs::read_to_string(s.dir.join(format!("volumes/out/rank-{rank}.txt"))).unwrap();
        assert_eq!(out, "hello-from-the-dataset 3 admin");
    }
    assert!(!s.dir.join("datasets/data/written-by-a-replica").exists());
    // The scratch dirs went with the attempt; the logs stay.
    let runs = s.dir.join("runs").join(&id).join("a0");
    assert!(!runs.join(format!("{name}-master-0/scratch")).exists());
    assert!(runs.join(format!("{name}-master-0/log")).exists());
}

#[test]
fn a_failing_command_is_classified_and_names_the_missing_path() {
    let s = Server::start("classify", None);
    let mut task = pytorch("bad", 0, "echo starting; cat /mnt/data/nope.csv; exit 4");
    task["spec"]["environment"]["datasets"] = json!([{"dataset": "data", "mountPath": "/mnt/data"}]);
    let id = s.submit(&task);
    s.wait_status(&id, "Failed", secs(60));
    let (reason, message) =
        s.events(&id).into_iter().find(|(r, _)| r == "UserError").expect("a UserError event");
    assert_eq!(reason, "UserError");
    assert!(message.contains("code 1") || message.contains("code 4"), "{message}");
    assert!(message.contains("/mnt/data") && message.contains("nope.csv"), "{message}");
    // A user error is not retried.
    assert!(!s.events(&id).iter().any(|(r, _)| r == "Requeued"));
}

/// The exit checkpoint: a script that saves on SIGUSR1 gets its checkpoint into the volume before it is
/// terminated, every step is an event, and nothing of it is left running.
#[test]
fn stop_runs_the_exit_checkpoint_protocol() {
    let s = Server::start("checkpoint", None);
    let marker = format!("ckpt-marker-{}", std::process::id());
    let cmd = format!(
        r#"python3 - {marker} <<'EOF'
import os, signal, sys, time
rt = os.environ["TRAINYARD_RUNTIME_DIR"]
def save(sig, frame):
    assert os.path.exists(rt + "/checkpoint-requested")
    time.sleep(0.5)
    open("/mnt/out/checkpoint.pt", "w").write("step 42")
    open(rt + "/checkpoint-done", "w").close()
    print("checkpoint saved", flush=True)
signal.signal(signal.SIGUSR1, save)
print("training", flush=True)
while True:
    time.sleep(0.1)
EOF"#
    );
    let mut task = pytorch("ckpt", 0, &cmd);
    task["spec"]["environment"]["volumes"] = json!([{"volume": "out", "mountPath": "/mnt/out"}]);
    task["spec"]["advanced"] = json!({"exitCheckpoint": {"enabled": true, "timeoutSeconds": 30}});
    let id = s.submit(&task);
    let t = s.wait_status(&id, "Running", secs(60));
    let master = format!("{}-master-0", t["name"].as_str().unwrap());
    s.wait_log(&id, &master, "training", secs(30));
    assert!(!Server::processes_with(&marker).is_empty(), "the training process runs");
    let (status, body) = s.call("POST", &format!("/api/v1/tasks/{id}/stop"), None);
    assert_eq!(status, 200, "{body}");
    s.wait_status(&id, "Stopped", secs(60));
    let events = s.events_text(&id);
    for step in ["StopRequested", "CheckpointRequested", "CheckpointDone", "Terminated"] {
        assert!(events.contains(step), "no {step} in:\n{events}");
    }
    let saved = std::fs::read_to_string(s.dir.join("volumes/out/checkpoint.pt"))
        .unwrap_or_else(|e| panic!("no checkpoint ({e}); events:\n{events}\nlogs:\n{}", s.all_logs(&id)));
    assert_eq!(saved, "step 42");
    assert!(s.log(&id, &master, None).contains("checkpoint saved"));
    assert!(Server::processes_with(&marker).is_empty(), "no process of the task survives the stop");
}

#[test]
fn an_image_that_is_not_here_fails_its_pull_after_the_tolerance() {
    let s = Server::start("pull", None);
    let mut task = pytorch("pull", 0, "true");
    task["spec"]["environment"]["image"] = json!("elsewhere");
    task["spec"]["advanced"] = json!({"imagePullTolerance": 1});
    let id = s.submit(&task);
    s.wait_status(&id, "Failed", secs(60));
    let events = s.events(&id);
    let backoff = events.iter().find(|(r, _)| r == "ImagePullBackOff").expect("one retry");
    assert!(backoff.1.contains("available: host"), "{}", backoff.1);
    let failed = events.iter().find(|(r, _)| r == "ImagePullFailed").expect("the pull failed");
    assert!(failed.1.contains("elsewhere") && failed.1.contains("1 retries allowed"), "{}", failed.1);
    // The resources are released: the task holds no placement, and the quota shows nothing in use.
    assert!(s.task(&id)["placement"].is_null() || s.task(&id)["placement"] == json!(""));
}

/// An admin marks the node of a running replica failed: its replicas are killed, the attempt fails as
/// NodeFailed, and fault tolerance resubmits it on another node.
#[test]
fn a_failed_node_is_replaced_and_the_task_resubmitted() {
    let s = Server::start("nodefail", None);
    let mut task = pytorch("nf", 0, "echo attempt $TRAINYARD_ATTEMPT on $TRAINYARD_NODE; sleep 600");
    task["spec"]["advanced"] =
        json!({"faultTolerance": {"enabled": true, "maxResubmissions": 2, "nodeReplacement": true}});
    let id = s.submit(&task);
    let t = s.wait_status(&id, "Running", secs(60));
    let node = t["placement"]["replicas"][0]["node"].as_str().unwrap().to_owned();
    let (status, body) = s.call("PUT", &format!("/api/v1/admin/nodes/{node}"), Some(r#"{"failed": true}"#));
    assert_eq!(status, 204, "{body}");
    s.wait_event(&id, "Requeued", secs(60));
    let t = s.wait_status(&id, "Running", secs(60));
    assert_eq!(t["attempt"], 1, "{t}");
    let now_on = t["placement"]["replicas"][0]["node"].as_str().unwrap();
    assert_ne!(now_on, node, "the failed node is left out");
    let events = s.events_text(&id);
    assert!(events.contains("NodeFailed"), "{events}");
    let master = format!("{}-master-0", t["name"].as_str().unwrap());
    s.wait_log(&id, &master, &format!("attempt 1 on {now_on}"), secs(30));
    // The first attempt's log is still there.
    assert!(s.log(&id, &master, Some(0)).contains(&format!("attempt 0 on {node}")));
    s.call("POST", &format!("/api/v1/tasks/{id}/stop"), None);
    s.wait_status(&id, "Stopped", secs(60));
}

/// The server is killed with SIGKILL while a task runs and started again: the training goes on under its
/// supervisor, the new server reattaches, and the task completes with its whole log.
#[test]
fn restarting_the_server_mid_run_loses_nothing() {
    let mut s = Server::start("restart", None);
    let task = pytorch("rs", 1, "echo begin $RANK; sleep 4; echo end $RANK");
    let id = s.submit(&task);
    let t = s.wait_status(&id, "Running", secs(60));
    let master = format!("{}-master-0", t["name"].as_str().unwrap());
    s.wait_log(&id, &master, "begin 0", secs(30));
    s.kill();
    std::thread::sleep(secs(1));
    s.restart();
    let t = s.wait_status(&id, "Succeeded", secs(60));
    assert_eq!(t["attempt"], 0, "the same attempt completed: {t}");
    let log = s.log(&id, &master, None);
    assert!(log.contains("begin 0") && log.contains("end 0"), "{log}");
    let reasons: Vec<String> = s.events(&id).into_iter().map(|(r, _)| r).collect();
    assert_eq!(reasons.iter().filter(|r| *r == "Completed").count(), 1, "{reasons:?}");
}

/// Logs follow over server-sent events until the replica ends.
#[test]
fn logs_follow_over_server_sent_events() {
    let s = Server::start("follow", None);
    let id = s.submit(&pytorch("sse", 0, "for i in 1 2 3; do echo line $i; sleep 0.3; done"));
    let t = s.wait_status(&id, "Running", secs(60));
    let master = format!("{}-master-0", t["name"].as_str().unwrap());
    let (status, body) =
        s.call("GET", &format!("/api/v1/tasks/{id}/logs?replica={master}&follow=true"), None);
    assert_eq!(status, 200);
    for i in 1..=3 {
        assert!(body.contains(&format!(" O line {i}")), "{body}");
    }
    assert!(body.contains("event: end"), "{body}");
    let (status, _) = s.call("GET", &format!("/api/v1/tasks/{id}/logs?replica=nope"), None);
    assert_eq!(status, 404);
}

/// Real `torchrun` with a gloo all-reduce over a master and a worker (Debian's CPU `python3-torch`), with
/// the resource precheck on: its figures are events, and the task succeeds. (`--redirects 1 --tee 1`: Debian's
/// torch 1.13 under Python 3.11 cannot parse torchrun's default `0` for these, an enum change in 3.11.)
#[test]
fn torchrun_gloo_all_reduce_with_the_precheck() {
    let s = Server::start("torchrun", None);
    let cmd = TORCHRUN_ALL_REDUCE;
    // 1 + 2 replicas, each in its own network namespace: gloo's rendezvous and all-reduce cross them.
    let mut task = pytorch_on("cpu.large", "torch", 2, cmd);
    task["spec"]["advanced"] = json!({"precheck": {"enabled": true, "timeoutSeconds": 120}});
    let id = s.submit(&task);
    let t = s.wait_status(&id, "Succeeded", secs(240));
    let events = s.events(&id);
    let figures: Vec<&String> =
        events.iter().filter(|(r, _)| r == "PrecheckResult").map(|(_, m)| m).collect();
    assert_eq!(figures.len(), 3, "one precheck result per replica: {events:?}");
    for m in &figures {
        assert!(m.contains("gloo init") && m.contains("GFLOP/s") && m.contains("GB/s"), "{m}");
    }
    assert!(events.iter().any(|(r, _)| r == "PrecheckPassed"), "{events:?}");
    let master = format!("{}-master-0", t["name"].as_str().unwrap());
    let log = s.log(&id, &master, None);
    assert!(log.contains("all-reduce gave 6.0 over 3 ranks"), "{log}");
}

/// The precheck needs torch: where `import torch` fails (here a dataset shadows it on PYTHONPATH, as an
/// image without torch would), the attempt fails before the command runs, with a message that says so.
#[test]
fn the_precheck_without_torch_fails_clearly() {
    let s = Server::start("notorch", None);
    std::fs::create_dir_all(s.dir.join("datasets/data")).unwrap();
    std::fs::write(s.dir.join("datasets/data/torch.py"), "raise ImportError(\"No module named 'torch'\")\n")
        .unwrap();
    let mut task = pytorch("nt", 0, "echo the command ran");
    task["spec"]["environment"]["datasets"] = json!([{"dataset": "data", "mountPath": "/mnt/shadow"}]);
    task["spec"]["environment"]["env"] = json!([{"name": "PYTHONPATH", "value": "/mnt/shadow"}]);
    task["spec"]["advanced"] = json!({"precheck": {"enabled": true, "timeoutSeconds": 30}});
    let id = s.submit(&task);
    let t = s.wait_status(&id, "Failed", secs(120));
    let events = s.events(&id);
    let failed = events.iter().find(|(r, _)| r == "PrecheckFailed").expect("PrecheckFailed");
    assert!(failed.1.contains("no usable torch"), "{}", failed.1);
    // The image's fault, not the node's: the node is not suspected.
    assert!(!events.iter().any(|(r, _)| r == "NodeSuspect"), "{events:?}");
    let master = format!("{}-master-0", t["name"].as_str().unwrap());
    assert!(!s.log(&id, &master, None).contains("the command ran"));
}

/// Passwordless SSH between replicas: a key pair per task, an ssh config naming every replica, hostfiles,
/// and the image's sshd (Debian's openssh-server) in every replica.
#[test]
fn passwordless_ssh_between_replicas() {
    let s = Server::start("ssh", None);
    let cmd = r#"cat /root/hostfile.hostname; grep -c slots /root/hostfile
if [ "$RANK" = 0 ]; then
  peer=$(sed -n 2p /root/hostfile.hostname)
  for i in $(seq 1 100); do ssh -o BatchMode=yes -o ConnectTimeout=2 "$peer" hostname > /tmp/peer 2>/tmp/err && break; sleep 0.2; done
  echo "peer says: $(cat /tmp/peer)"; cat /tmp/err
  test "$(cat /tmp/peer)" = "$peer"
  touch /mnt/out/ssh-done-$TASK_UUID
else
  while [ ! -e /mnt/out/ssh-done-$TASK_UUID ]; do sleep 0.2; done
fi"#;
    let mut task = pytorch("ssh", 1, cmd);
    task["spec"]["environment"]["volumes"] = json!([{"volume": "out", "mountPath": "/mnt/out"}]);
    task["spec"]["advanced"] = json!({"passwordlessSsh": true});
    let id = s.submit(&task);
    let t = s.wait_status(&id, "Succeeded", secs(120));
    let name = t["name"].as_str().unwrap();
    let log = s.log(&id, &format!("{name}-master-0"), None);
    assert!(log.contains(&format!("peer says: {name}-worker-0")), "{log}");
    assert!(log.contains(&format!("O {name}-master-0")) && log.contains(" O 2"), "hostfiles: {log}");
}

/// The metrics monitor scrapes the replica's endpoint and records the preset resource metrics; both are
/// served per task over the API.
#[test]
fn custom_and_preset_metrics_are_collected_and_served() {
    let s = Server::start("metrics", None);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let cmd = format!(
        r#"python3 - <<'PY'
import http.server, threading, time
step = [0]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ('# TYPE train_loss gauge\ntrain_loss{{phase="train"}} %f\ntrain_step %d\n' % (1.0 / (1 + step[0]), step[0])).encode()
        self.send_response(200); self.send_header("Content-Type", "text/plain"); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
srv = http.server.HTTPServer(("127.0.0.1", {port}), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
print("serving", flush=True)
t0 = time.time()
while time.time() - t0 < 11.5:
    step[0] += 1
    sum(i * i for i in range(20000))
PY"#
    );
    let mut task = pytorch("metrics", 0, &cmd);
    task["spec"]["advanced"] = json!({"metrics": {"enabled": true, "intervalSeconds": 5, "endpoints": [{"port": port, "path": "/metrics"}]}});
    let id = s.submit(&task);
    s.wait_status(&id, "Succeeded", secs(60));
    let (status, body) = s.call("GET", &format!("/api/v1/tasks/{id}/metrics"), None);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let series = v["series"].as_array().unwrap();
    let find = |name: &str| {
        series.iter().find(|s| s["name"] == name).unwrap_or_else(|| panic!("no {name} in {body}"))
    };
    let loss = find("train_loss");
    assert_eq!(loss["labels"]["phase"], "train");
    let points = loss["points"].as_array().unwrap();
    assert!(points.len() >= 2, "sampled every 5 s: {loss}");
    let steps: Vec<f64> =
        find("train_step")["points"].as_array().unwrap().iter().map(|p| p[1].as_f64().unwrap()).collect();
    assert!(steps.windows(2).all(|w| w[0] <= w[1]) && steps.last() > steps.first(), "{steps:?}");
    // Preset: the replica's CPU (it was busy) and resident memory.
    let cpu = find("trainyard_cpu_cores")["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[1].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!(cpu > 0.2, "a busy replica uses CPU: {cpu}");
    let rss = find("trainyard_memory_rss_bytes")["points"][0][1].as_f64().unwrap();
    assert!(rss > 1e6, "{rss}");
    let (_, only) = s.call("GET", &format!("/api/v1/tasks/{id}/metrics?name=train_step"), None);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&only).unwrap()["series"].as_array().unwrap().len(),
        1
    );
}

/// A stop that arrives while the sandbox is still being set up (before the command exists) still ends
/// every process: the command that appears afterwards is terminated too.
#[test]
fn a_stop_during_start_up_leaves_nothing_running() {
    let s = Server::start("earlystop", None);
    for round in 0..5 {
        let marker = format!("early-stop-{}-{round}", std::process::id());
        let id = s.submit(&pytorch("early", 3, &format!("exec sleep 600 # {marker}")));
        // As early as the API lets us: the moment the attempt is admitted.
        let t0 = std::time::Instant::now();
        while !["Starting", "Running"].contains(&s.task(&id)["status"].as_str().unwrap_or("")) {
            assert!(t0.elapsed() < secs(30));
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let (status, body) = s.call("POST", &format!("/api/v1/tasks/{id}/stop"), None);
        assert_eq!(status, 200, "{body}");
        s.wait_status(&id, "Stopped", secs(60));
        assert!(Server::processes_with(&marker).is_empty(), "round {round}: a process of the task survived");
    }
}

/// A sandbox slow to start (on a machine under load, bubblewrap made its namespaces 9 s after the launch) is
/// still stopped: its supervisor goes on looking for the sandbox's processes rather than giving up after a
/// few seconds and then signalling none of them (the task stayed Stopping for good, its replica running).
#[test]
fn a_sandbox_slow_to_start_is_still_stopped() {
    let bin = std::env::temp_dir().join(format!("ty-slow-bwrap-{}", std::process::id()));
    std::fs::create_dir_all(&bin).unwrap();
    let real = trainyard_local::find_bwrap().unwrap();
    let wrapper = bin.join("bwrap");
    std::fs::write(&wrapper, format!("#!/bin/sh\nsleep 7\nexec {} \"$@\"\n", real.display())).unwrap();
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let s = Server::start(
        "slowsandbox",
        Some(&format!("{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", bin.display())),
    );
    let marker = format!("slow-sandbox-{}", std::process::id());
    let id = s.submit(&pytorch("slow", 0, &format!("echo up; exec sleep 600 # {marker}")));
    let name = s.wait_status(&id, "Running", secs(60))["name"].as_str().unwrap().to_owned();
    s.wait_log(&id, &format!("{name}-master-0"), "up", secs(60));
    let (status, body) = s.call("POST", &format!("/api/v1/tasks/{id}/stop"), None);
    assert_eq!(status, 200, "{body}");
    s.wait_status(&id, "Stopped", secs(60));
    assert!(Server::processes_with(&marker).is_empty(), "a process of the task survived its stop");
    let _ = std::fs::remove_dir_all(&bin);
}

/// A PATH whose `ray` and `python3` are the Ray venv's (`.ci/run` makes it; `TRAINYARD_RAY_VENV` names it).
fn ray_path() -> String {
    let venv = std::env::var("TRAINYARD_RAY_VENV").unwrap_or_else(|_| "/opt/trainyard-ray".to_owned());
    assert!(
        std::path::Path::new(&venv).join("bin/ray").exists(),
        "Ray is not installed in {venv}; .ci/run installs it (python3 -m venv --system-site-packages {venv} && {venv}/bin/pip install 'ray[default]')"
    );
    format!("{venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
}

/// A RayJob on real Ray: a head and two workers, each its own sandbox and Ray node; the entrypoint spreads
/// tasks so every node runs some, with the runtime env passed to Ray, and shared storage at /tmp/ray.
#[test]
fn a_rayjob_runs_tasks_on_every_node() {
    let s = Server::start("ray", Some(&ray_path()));
    let entrypoint = r#"python3 - <<'PY'
import os, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init()
@ray.remote(num_cpus=1)
def where():
    return ray.get_runtime_context().get_node_id(), os.environ.get("FROM_RUNTIME_ENV")
alive = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
got = ray.get([where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote() for n in alive])
nodes = {n for n, _ in got}
print("ran on", len(nodes), "nodes; runtime env says", {e for _, e in got})
assert len(nodes) == 3 and nodes == set(alive), nodes
assert {e for _, e in got} == {"yes"}
assert os.path.isdir("/tmp/ray"), "shared storage"
PY"#;
    let task = common::rayjob(
        "ray",
        2,
        entrypoint,
        json!({
            "runtimeEnvYaml": "env_vars:\n  FROM_RUNTIME_ENV: \"yes\"\n",
            "sharedStorage": {"volume": "raytmp", "cleanupOnExit": true}
        }),
    );
    let id = s.submit(&task);
    let t = s.wait_status(&id, "Succeeded", secs(300));
    let name = t["name"].as_str().unwrap();
    let log = s.log(&id, &format!("{name}-head-0"), None);
    assert!(log.contains("the Ray cluster is up with 3 nodes"), "{log}");
    assert!(log.contains("ran on 3 nodes; runtime env says {'yes'}"), "{log}");
    // Shared storage was cleaned up on exit, as asked.
    assert!(!s.dir.join(format!("volumes/raytmp/ray-{name}")).exists());
    let nodes: std::collections::BTreeSet<&str> =
        t["placement"]["replicas"].as_array().unwrap().iter().map(|r| r["node"].as_str().unwrap()).collect();
    assert_eq!(nodes.len(), 3, "a Ray node per virtual node: {}", t["placement"]);
}

/// RayJob autoscaling: work that does not fit makes the platform add a worker (admitted by the scheduler
/// like any gang), and an idle worker goes away after the idle timeout, within min and max.
#[test]
fn a_rayjob_grows_under_load_and_shrinks_when_idle() {
    let s = Server::start("rayscale", Some(&ray_path()));
    let entrypoint = r#"python3 - <<'PY'
import time, ray
ray.init()
def alive():
    return sum(1 for n in ray.nodes() if n["Alive"])
print("start with", alive(), "nodes", flush=True)
@ray.remote(num_cpus=1)
def work():
    time.sleep(8)
    return 1
refs = [work.remote() for _ in range(8)]
t0 = time.time()
while alive() < 3:
    assert time.time() - t0 < 120, "never grew"
    time.sleep(0.5)
print("grew to", alive(), "nodes", flush=True)
assert sum(ray.get(refs)) == 8
t0 = time.time()
while alive() > 2:
    assert time.time() - t0 < 120, "never shrank"
    time.sleep(0.5)
print("shrank to", alive(), "nodes", flush=True)
PY"#;
    let task = common::rayjob(
        "rayscale",
        1,
        entrypoint,
        json!({"autoscaling": {"enabled": true, "minWorkers": 1, "maxWorkers": 2, "idleTimeoutSeconds": 5}}),
    );
    let id = s.submit(&task);
    let t = s.wait_status(&id, "Succeeded", secs(400));
    let name = t["name"].as_str().unwrap();
    let log = s.log(&id, &format!("{name}-head-0"), None);
    for line in ["start with 2 nodes", "grew to 3 nodes", "shrank to 2 nodes"] {
        assert!(log.contains(line), "no {line:?} in:\n{log}");
    }
    let events = s.events_text(&id);
    for reason in ["ScaleUpRequested", "ScaledUp", "ScaledDown"] {
        assert!(events.contains(reason), "no {reason} in:\n{events}");
    }
}

/// Memory limits through cgroups: a replica that uses more memory than its instance spec gives is killed by
/// the kernel and the task fails as OutOfMemory with a message that says what to change. Where the host
/// allows no cgroups, the task says so in an event instead.
#[test]
fn a_replica_over_its_memory_limit_fails_as_out_of_memory() {
    let s = Server::start("oom", None);
    // cpu.small gives 1 GiB; this touches 3 GiB.
    let id = s.submit(&pytorch("oom", 0, "python3 -c 'x = bytearray(3 * 1024**3); print(len(x))'"));
    let t0 = std::time::Instant::now();
    loop {
        let status = s.task(&id)["status"].as_str().unwrap_or("").to_owned();
        if ["Failed", "Succeeded"].contains(&status.as_str()) {
            break;
        }
        assert!(t0.elapsed() < secs(120), "still {status}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let events = s.events(&id);
    if let Some((_, why)) = events.iter().find(|(r, _)| r == "LimitsNotEnforced") {
        eprintln!("this host enforces no memory limit: {why}");
        return;
    }
    let (_, message) =
        events.iter().find(|(r, _)| r == "OutOfMemory").unwrap_or_else(|| panic!("{events:?}"));
    assert!(message.contains("larger instance spec"), "{message}");
}

/// A minimal root file system: bash and cat with the libraries they link, and a marker file.
fn tiny_rootfs(dir: &std::path::Path) {
    let mut files = vec!["/usr/bin/bash".to_owned(), "/usr/bin/cat".to_owned()];
    for bin in ["/usr/bin/bash", "/usr/bin/cat"] {
        let out = std::process::Command::new("ldd").arg(bin).output().unwrap();
        for word in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if word.starts_with('/') {
                files.push(word.to_owned());
            }
        }
    }
    for f in files {
        let real = std::fs::canonicalize(&f).unwrap();
        for p in [std::path::PathBuf::from(&f), real.clone()] {
            let to = dir.join(p.strip_prefix("/").unwrap());
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            let _ = std::fs::copy(&real, &to);
        }
    }
    // The merged-/usr layout the host has: /bin, /lib and /lib64 point into /usr.
    for (link, target) in [("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")] {
        if !dir.join(link).exists() {
            let _ = std::os::unix::fs::symlink(target, dir.join(link));
        }
    }
    std::fs::create_dir_all(dir.join("etc")).unwrap();
    std::fs::write(dir.join("etc/image-marker"), "tiny image\n").unwrap();
}

/// An admin-registered image: the replica runs on that root file system (read-only), not the host's.
#[test]
fn a_registered_image_is_the_replicas_root() {
    let s = Server::start("image", None);
    let root = s.dir.join("images/tiny");
    tiny_rootfs(&root);
    let (_, catalog) = s.call("GET", "/api/v1/catalog", None);
    let mut catalog: serde_json::Value = serde_json::from_str(&catalog).unwrap();
    catalog["images"]["tiny"] = json!({"rootfs": root.display().to_string()});
    let (status, body) = s.call("PUT", "/api/v1/admin/catalog", Some(&catalog.to_string()));
    assert_eq!(status, 200, "{body}");
    let mut task = pytorch(
        "img",
        0,
        "cat /etc/image-marker; test -e /usr/bin/python3 || echo no python here; echo x > /usr/x || echo read-only root",
    );
    task["spec"]["environment"]["image"] = json!("tiny");
    let id = s.submit(&task);
    let t = s.wait_status(&id, "Succeeded", secs(60));
    let log = s.log(&id, &format!("{}-master-0", t["name"].as_str().unwrap()), None);
    for line in ["O tiny image", "O no python here", "O read-only root"] {
        assert!(log.contains(line), "no {line:?} in:\n{log}");
    }
}

/// A hardware error in a replica's log fails the attempt as the node's fault: with fault tolerance the task
/// is resubmitted, and node replacement keeps the next attempt off that node.
#[test]
fn a_hardware_error_resubmits_on_another_node() {
    let s = Server::start("hwerror", None);
    let cmd = r#"if [ "$TRAINYARD_ATTEMPT" = 0 ]; then echo "NCCL error: unhandled system error"; exit 1; fi
echo "attempt $TRAINYARD_ATTEMPT on $TRAINYARD_NODE""#;
    let mut task = pytorch("hw", 0, cmd);
    task["spec"]["advanced"] =
        json!({"faultTolerance": {"enabled": true, "maxResubmissions": 1, "nodeReplacement": true}});
    let id = s.submit(&task);
    // Failed for a moment, then requeued: wait for the requeue before waiting for success.
    s.wait_event(&id, "Requeued", secs(60));
    let t = s.wait_status(&id, "Succeeded", secs(60));
    assert_eq!(t["attempt"], 1, "{t}");
    let events = s.events(&id);
    let suspect = events.iter().find(|(r, _)| r == "NodeSuspect").unwrap_or_else(|| panic!("{events:?}"));
    let bad = suspect.1.split_whitespace().nth(1).unwrap().trim_end_matches(':').to_owned();
    assert!(suspect.1.contains("leave it out"), "{}", suspect.1);
    assert!(events.iter().any(|(r, m)| r == "NodeFailed" && m.contains("hardware error")), "{events:?}");
    let log = s.log(&id, &format!("{}-master-0", t["name"].as_str().unwrap()), None);
    assert!(log.contains("attempt 1 on node-"), "{log}");
    assert!(!log.contains(&format!("on {bad}")), "the suspect node {bad} was used again: {log}");
}

/// What we ship runs as shipped: every task under `examples/local/` succeeds on a fresh `trainyard up` with
/// the catalog it writes for this machine.
#[test]
fn every_local_example_succeeds_on_a_fresh_up() {
    // The catalog `up` writes for this machine, with Ray on the server's PATH (the Ray example needs it).
    let s = Server::start_with(
        "examples",
        Options { own_catalog: true, path: Some(ray_path()), ..Options::default() },
    );
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/local");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
    files.sort();
    assert!(!files.is_empty());
    for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "yaml")) {
        let text = std::fs::read_to_string(f).unwrap();
        let (status, body) = s.call("POST", "/api/v1/tasks", Some(&text));
        assert!(status == 201 || status == 200, "{}: {status} {body}", f.display());
        let id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["id"].as_str().unwrap().to_owned();
        s.wait_status(&id, "Succeeded", secs(180));
        // What each one says when it did its work.
        let said = match f.file_name().and_then(|n| n.to_str()).unwrap_or("") {
            "hello.yaml" => "rank 1 of 2",
            "torchrun-gloo.yaml" => "all-reduce gave 3.0",
            "ddp-train.yaml" => "identical on all 2 ranks",
            "checkpoint.yaml" => "trained 20 steps",
            "ray.yaml" => "sum of squares over",
            other => panic!("{other}: say here what it prints when it works"),
        };
        let logs = s.all_logs(&id);
        assert!(logs.contains(said), "{}: no {said:?} in\n{logs}", f.display());
    }
    // The working-directory example, as its file says to submit it: with the CLI and --workdir.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["submit", "-f", "task.yaml", "--workdir", ".", "-o", "json"])
        .env("TRAINYARD_SERVER", &s.base)
        .env("TRAINYARD_TOKEN", &s.token)
        .current_dir(dir.join("workdir"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id =
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["id"].as_str().unwrap().to_owned();
    s.wait_status(&id, "Succeeded", secs(180));
    let logs = s.all_logs(&id);
    for rank in 0..2 {
        assert!(logs.contains(&format!("rank {rank} of 2: loss")), "workdir: rank {rank} in\n{logs}");
    }
    assert!(logs.contains("slope 3.00"), "workdir:\n{logs}");
}

/// A launch the machine cannot prepare (here a volume's dir is a file) ends the attempt with the reason, as
/// the machine's failure, instead of being tried again on every tick without a word.
#[test]
fn an_attempt_that_cannot_be_prepared_fails_with_its_reason() {
    let s = Server::start("unprepared", None);
    std::fs::create_dir_all(s.dir.join("volumes")).unwrap();
    std::fs::write(s.dir.join("volumes/out"), "a file where the volume's dir goes").unwrap();
    let mut task = pytorch("unprepared", 0, "echo never");
    task["spec"]["environment"]["volumes"] = json!([{"volume": "out", "mountPath": "/mnt/out"}]);
    task["spec"]["advanced"] = json!({"faultTolerance": {"maxResubmissions": 0}});
    let id = s.submit(&task);
    s.wait_status(&id, "Failed", secs(30));
    let events = s.events_text(&id);
    assert!(events.contains("could not be prepared") && events.contains("volumes/out"), "{events}");
}

/// A server that crashed for good (its supervisors lost too, its data dir deleted) leaves an attempt's network
/// behind; the next server to start on this machine removes it, since that attempt no longer runs.
#[test]
fn a_lost_attempts_network_is_removed_by_the_next_start() {
    let mut gone = Server::start("sweep-gone", None);
    let id = gone.submit(&pytorch("sweep", 1, "echo up; sleep 120"));
    let name = gone.wait_status(&id, "Running", secs(60))["name"].as_str().unwrap().to_owned();
    gone.wait_log(&id, &format!("{name}-master-0"), "up", secs(30));
    let switch = std::path::Path::new("/run/netns").join(trainyard_local::netns::attempt_name(&id, 0));
    assert!(switch.exists(), "the attempt's switch namespace is there while it runs");
    gone.kill();
    // Checked while the attempt's supervisors still run: once they are gone (the drop below kills them), any
    // server's start (another test's, running alongside) may sweep the namespace.
    assert!(switch.exists(), "nothing removed it yet");
    // Dropped, it removes its data dir (the runs the next start would otherwise find).
    let dir = gone.dir.clone();
    drop(gone);
    assert!(!dir.exists());
    let _next = Server::start("sweep-next", None);
    assert!(!switch.exists(), "the next start removed the lost attempt's network");
}

/// Replicas start on supervisors started ahead of need (the local backend's `pool`): the pool is there
/// before any task; a replica's supervisor is one of them, and its cgroups carry the replica's name and
/// limits; when the server ends, the idle ones exit and leave no cgroup behind.
#[test]
fn replicas_run_on_pooled_supervisors_in_cgroups_of_their_own() {
    let mut s = Server::start("pool", None);
    let marker = format!("{}/runs/-", s.dir.display());
    let deadline = std::time::Instant::now() + secs(30);
    while Server::processes_with(&marker).len() < 8 {
        assert!(std::time::Instant::now() < deadline, "the pool never filled");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let idle = Server::processes_with(&marker);
    // A server started from the root cgroup (as this test's is, unless a service manager runs the tests)
    // moves into a cgroup of its own weighing one busy process per CPU: it does not share one process's
    // weight with whatever else its session runs.
    let cpus = std::thread::available_parallelism().unwrap().get() as u64;
    let cpu_cgroup = |pid: &str| {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        let line = text
            .lines()
            .find(|l| l.split(':').nth(1).is_some_and(|c| c.split(',').any(|c| c == "cpu")))
            .or_else(|| text.lines().find(|l| l.starts_with("0::")))
            .map(str::to_owned);
        line.unwrap_or_else(|| panic!("no cpu cgroup in {text}"))
    };
    let ours = cpu_cgroup("self");
    if ours.ends_with(":/") {
        let server = cpu_cgroup(&s.pid().unwrap().to_string());
        assert!(server.ends_with(":/trainyard-server"), "the server's cgroup: {server}");
        let (file, weight) = if server.starts_with("0::") {
            ("/sys/fs/cgroup/trainyard-server/cpu.weight", (100 * cpus).min(10_000))
        } else {
            ("/sys/fs/cgroup/cpu/trainyard-server/cpu.shares", (1024 * cpus).min(262_144))
        };
        assert_eq!(std::fs::read_to_string(file).unwrap().trim(), weight.to_string(), "{file}");
    } else {
        eprintln!("this test runs in cgroup {ours}, not the root one: the server stays in it");
    }
    let id = s.submit(&pytorch("pooled", 1, "sleep 60"));
    s.wait_status(&id, "Running", secs(60));
    let attempt = s.dir.join("runs").join(&id).join("a0");
    let replicas: Vec<String> = std::fs::read_dir(&attempt)
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("state.json").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(replicas.len(), 2, "{replicas:?}");
    // Where each replica's cgroups are, relative to their hierarchy, and whether that is cgroup v2.
    let mut parents = Vec::new();
    for replica in &replicas {
        // The supervisor writes the sandbox's pid once bubblewrap reported it, which on a loaded machine may come
        // a moment after the task is Running.
        let t0 = std::time::Instant::now();
        let state = loop {
            let state = std::fs::read(attempt.join(replica).join("state.json")).unwrap();
            let state: serde_json::Value = serde_json::from_slice(&state).unwrap();
            if state["sandbox_pid"].as_u64().is_some() {
                break state;
            }
            assert!(t0.elapsed() < secs(30), "no sandbox pid: {state}");
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        let pid = state["supervisor_pid"].as_u64().unwrap() as u32;
        assert!(idle.contains(&pid), "{replica}'s supervisor {pid} is not one of the pool's {idle:?}");
        // The sandbox holds the replica's cgroups (the supervisor leaves them once it runs).
        let sandbox = state["sandbox_pid"].as_u64().unwrap() as u32;
        let cgroups = std::fs::read_to_string(format!("/proc/{sandbox}/cgroup")).unwrap();
        let line = cgroups
            .lines()
            .find(|l| l.split(':').nth(1).is_some_and(|c| c.split(',').any(|c| c == "memory")))
            .or_else(|| cgroups.lines().find(|l| l.starts_with("0::")))
            .unwrap_or_else(|| panic!("no memory cgroup in {cgroups}"));
        let v2 = line.starts_with("0::");
        let path = line.splitn(3, ':').nth(2).unwrap();
        assert!(path.ends_with(&format!("{id}-a0-{replica}")), "{replica}'s cgroup is {path}");
        let dir = if v2 { format!("/sys/fs/cgroup{path}") } else { format!("/sys/fs/cgroup/memory{path}") };
        let limit = std::fs::read_to_string(format!("{dir}/memory.limit_in_bytes"))
            .or_else(|_| std::fs::read_to_string(format!("{dir}/memory.max")))
            .unwrap();
        let limit: u64 = limit.trim().parse().unwrap_or(u64::MAX);
        assert!(limit < 1 << 40, "{replica}'s memory limit is {limit}");
        // Under contention replicas share CPU by size (cpu.small has 1 vCPU: one busy process's weight),
        // and all of them together weigh one busy process per CPU of the machine.
        let (weight, own, together) = if v2 {
            (format!("{dir}/cpu.weight"), 100, (100 * cpus).min(10_000))
        } else {
            let line = cpu_cgroup(&pid.to_string());
            let cpu_path = line.splitn(3, ':').nth(2).unwrap();
            (format!("/sys/fs/cgroup/cpu{cpu_path}/cpu.shares"), 1024, (1024 * cpus).min(262_144))
        };
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert_eq!(read(&weight).trim(), own.to_string(), "{replica}: {weight}");
        let parent = std::path::Path::new(&weight)
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .join(std::path::Path::new(&weight).file_name().unwrap());
        assert_eq!(read(parent.to_str().unwrap()).trim(), together.to_string(), "{}", parent.display());
        // The supervisor's allocator keeps to small pages; the task's processes may have huge pages.
        let thp = |pid: u64| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            status.lines().find_map(|l| l.strip_prefix("THP_enabled:").map(|v| v.trim().to_owned()))
        };
        let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        if mode.contains("[madvise]") {
            // Where only memory advised for huge pages gets them (the supervisor's allocator used to advise
            // its heap: 6 MiB of them in an idle pooled supervisor, each page zeroed when first touched).
            let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
            let huge = rollup.lines().find(|l| l.starts_with("AnonHugePages:")).unwrap_or("none");
            assert_eq!(huge.split_whitespace().nth(1), Some("0"), "{replica}'s supervisor: {huge}");
        }
        if thp(u64::from(std::process::id())).is_some() {
            // Running is recorded just before the sandbox starts.
            let deadline = std::time::Instant::now() + secs(20);
            let sandbox = loop {
                let state = std::fs::read(attempt.join(replica).join("state.json")).unwrap();
                let state: serde_json::Value = serde_json::from_slice(&state).unwrap_or_default();
                if let Some(pid) = state["sandbox_pid"].as_u64() {
                    break pid;
                }
                assert!(std::time::Instant::now() < deadline, "{replica}'s sandbox never started");
                std::thread::sleep(std::time::Duration::from_millis(50));
            };
            assert_eq!(thp(sandbox).as_deref(), Some("1"), "{replica}'s sandbox (bubblewrap)");
        }
        parents.push((v2, path.rsplit_once('/').unwrap().0.to_owned()));
    }
    let (status, body) = s.call("POST", &format!("/api/v1/tasks/{id}/stop"), None);
    assert!(status < 300, "{status} {body}");
    s.wait_status(&id, "Stopped", secs(60));
    s.kill();
    let deadline = std::time::Instant::now() + secs(20);
    while !Server::processes_with(&marker).is_empty() {
        assert!(std::time::Instant::now() < deadline, "idle pooled supervisors outlived their server");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let mut left = Vec::new();
    for (v2, parent) in &parents {
        let bases: Vec<String> = if *v2 {
            vec![format!("/sys/fs/cgroup{parent}")]
        } else {
            ["memory", "cpu", "pids"].iter().map(|c| format!("/sys/fs/cgroup/{c}{parent}")).collect()
        };
        for base in bases {
            let dirs = idle.iter().map(|pid| format!("{base}/pool-{pid}"));
            left.extend(dirs.filter(|d| std::path::Path::new(d).exists()));
        }
    }
    assert!(left.is_empty(), "cgroups of the pool left behind: {left:?}");
}
