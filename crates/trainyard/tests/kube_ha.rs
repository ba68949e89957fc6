//! Two servers on one PostgreSQL store, driving the test cluster's real nodes (`scripts/with-kube --real-nodes
//! 2` under `scripts/with-postgres`, as `scripts/test` runs them). The leader is killed with `kill -9` while a
//! 1 + 1 PyTorchJob runs on real pods: the other server takes over and reattaches to the job (the same attempt,
//! the same job object, never made twice), and goes on following the pods' logs from where the dead leader's
//! last commit left them, in the store. Through either server, the killed one started again included, every
//! line of every replica is there once, in order; while the task ran, the follower served the lines the leader
//! kept.

mod common;

use common::leaders::wait_leader;
use common::{Options, Server, pg, secs};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Lines each replica prints, one a second.
const STEPS: usize = 40;

fn need(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| {
        panic!(
            "{k} is not set: this test needs the test cluster's real nodes and PostgreSQL; scripts/test starts \
             them (or run `scripts/with-postgres scripts/with-kube --real-nodes 2 cargo test --test kube_ha`)"
        )
    })
}

fn kubectl(args: &[&str]) -> String {
    let bin = std::path::PathBuf::from(need("TRAINYARD_KUBE_BIN")).join("kubectl");
    let out = std::process::Command::new(bin).args(args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "kubectl {args:?}: {text}");
    text
}

/// The uids of the PyTorchJobs in `ns`.
fn job_uids(ns: &str) -> BTreeSet<String> {
    let out = kubectl(&["get", "pytorchjobs", "-n", ns, "-o", "json"]);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    v["items"].as_array().unwrap().iter().map(|j| j["metadata"]["uid"].as_str().unwrap().to_owned()).collect()
}

/// The step lines of a replica's log, as a server serves it.
fn steps(s: &Server, id: &str, replica: &str) -> Vec<String> {
    s.log(id, replica, Some(0))
        .lines()
        .filter_map(|l| l.split_once(" O ").map(|(_, t)| t.to_owned()))
        .filter(|t| t.starts_with("step "))
        .collect()
}

/// The replicas of attempt 0, as a server lists them.
fn replicas(s: &Server, id: &str) -> Vec<String> {
    let (_, body) = s.call("GET", &format!("/api/v1/tasks/{id}/logs"), None);
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let first = v["items"].as_array().and_then(|a| a.first()).cloned().unwrap_or(Value::Null);
    first["replicas"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_leader_killed_mid_run_leaves_the_job_running_and_its_logs_whole_on_every_server() {
    let nodes: Vec<String> = need("TRAINYARD_KUBE_REAL_NODES").split(',').map(str::to_owned).collect();
    let base = need("TRAINYARD_KUBE_BASE_IMAGE");
    let url = pg::fresh_database("kube_ha", "two");
    let pid = std::process::id();
    let ns = format!("ha-{pid}-default");
    let args: Vec<String> = [
        "--backend",
        "kubernetes",
        "--database-url",
        &url,
        "--leader-lease-ms",
        "1500",
        "--kube-namespace",
        &format!("ha-{pid}-{{group}}"),
        "--kube-instance",
        &format!("ha-{pid}"),
        "--kube-image",
        &format!("base={base}"),
    ]
    .map(str::to_owned)
    .to_vec();
    let first = Server::start_with(
        "kube-ha-0",
        Options { args: args.clone(), own_catalog: true, ..Options::default() },
    );
    let seed = Some(first.dir.clone());
    let second =
        Server::start_with("kube-ha-1", Options { args, own_catalog: true, seed, ..Options::default() });
    let mut all = vec![first, second];
    let l = wait_leader(&all, secs(30));
    let node_lines: String =
        nodes.iter().map(|n| format!("  {n}: {{pool: real, vcpus: 2, memoryMib: 4096}}\n")).collect();
    let catalog = format!(
        "regions: {{kubernetes: {{}}}}\nclusters: {{kubernetes: {{region: kubernetes}}}}\n\
         pools: {{real: {{cluster: kubernetes, instanceSpecs: [cpu.small], tolerations: \
           [{{key: trainyard.dev/real, operator: Equal, value: \"true\", effect: NoSchedule}}]}}}}\n\
         instanceSpecs: {{cpu.small: {{kind: CPU, vcpus: 1, memoryMib: 512}}}}\nnodes:\n{node_lines}\
         projectGroups: {{default: {{}}}}\nimages: {{base: {{}}}}\n\
         quotas: [{{group: default, resourceType: Reserved, pool: real, spec: cpu.small, units: 4}}]\n"
    );
    let (status, body) = all[l].call("PUT", "/api/v1/admin/catalog", Some(&catalog));
    assert_eq!(status, 200, "{body}");

    // Submitted through the follower; the master ends last (the operator ends the job when the master ends).
    let follower = 1 - l;
    let task = json!({
        "apiVersion": "trainyard.dev/v1", "kind": "TrainingTask",
        "metadata": {"namePrefix": "ha", "projectGroup": "default"},
        "spec": {
            "type": "PyTorchJob",
            "placement": {"region": "kubernetes", "cluster": "kubernetes"},
            "environment": {"image": "base", "cmd": format!(
                "for i in $(seq 1 {STEPS}); do echo \"step $i of $RANK\"; sleep 1; done; \
                 if [ \"$RANK\" = 0 ]; then sleep 5; fi"
            )},
            "compute": {"resourceType": "Reserved", "pool": "real", "workers": 1,
                        "instanceSpecs": [{"spec": "cpu.small"}]},
        }
    });
    let id = all[follower].submit(&task);
    // The follower serves the lines the leader keeps while the task runs.
    let t0 = Instant::now();
    let master = loop {
        let names = replicas(&all[follower], &id);
        if let Some(m) = names.iter().find(|r| r.contains("master"))
            && steps(&all[follower], &id, m).len() >= 10
        {
            break m.clone();
        }
        assert!(
            t0.elapsed() < secs(300),
            "no 10 lines of the master through the follower after 300 s: {}\n{}",
            all[follower].events_text(&id),
            all[follower].all_logs(&id)
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let uids = job_uids(&ns);
    assert_eq!(uids.len(), 1, "one job: {uids:?}");

    // The leader killed mid-run: the other leads, and the job runs on.
    all[l].kill();
    let killed_at = Instant::now();
    let next = wait_leader(&all, secs(30));
    assert_eq!(next, follower);
    eprintln!("{} took over {:.2} s after the kill", all[next].base, killed_at.elapsed().as_secs_f64());
    all[l].restart();
    let t0 = Instant::now();
    let mut seen = uids.clone();
    loop {
        let t = all[next].task(&id);
        if ["Succeeded", "Failed", "Stopped"].contains(&t["status"].as_str().unwrap_or("")) {
            assert_eq!(
                (t["status"].as_str(), t["attempt"].as_i64()),
                (Some("Succeeded"), Some(0)),
                "the same attempt ends well: {}\n{}",
                all[next].events_text(&id),
                all[next].all_logs(&id)
            );
            break;
        }
        seen.extend(job_uids(&ns));
        assert!(t0.elapsed() < secs(300), "{id} did not end: {}", all[next].events_text(&id));
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(seen, uids, "the job was never made again");
    let admitted =
        all[next].events(&id).iter().filter(|(r, m)| r == "Admitted" && m != "starting replicas").count();
    assert_eq!(admitted, 1, "{}", all[next].events_text(&id));

    // Every line once, in order, through both servers (the one killed and started again follows now).
    let names = replicas(&all[next], &id);
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names.contains(&master));
    for s in &all {
        for name in &names {
            let rank = if name.contains("master") { 0 } else { 1 };
            let want: Vec<String> = (1..=STEPS).map(|i| format!("step {i} of {rank}")).collect();
            let t0 = Instant::now();
            // The last lines reach the store within a second of their pod's end.
            let got = loop {
                let got = steps(s, &id, name);
                if got.len() >= STEPS || t0.elapsed() > secs(30) {
                    break got;
                }
                std::thread::sleep(Duration::from_millis(500));
            };
            assert_eq!(got, want, "{name} through {}", s.base);
        }
    }
}
