//! The local backend's benchmark: submit-to-running latency of a trivial 1-replica task and of an
//! 8-replica gang with free capacity (until the API says Running, asked every 0.5 ms; until the server's
//! `Started` event, with the task asked every 20 ms only, so that the figure leaves out the load a
//! fast-polling client puts on the machine; and until every replica's command printed its first line: the
//! whole sandbox start, its user namespace, seccomp filter and network included), and the platform's CPU and
//! memory overhead per running replica (the supervisor and the sandbox's own processes, not the user's
//! command; and the server's share).
//!
//!   cargo run --release -p trainyard --bin local-bench [-- --runs N] [--timeline]
//!
//! It starts `trainyard up --backend local` (the binary next to this one) on a temp data dir, and drives it
//! over HTTP as a client would, polling the task until it is Running.

use serde_json::json;
use std::time::{Duration, Instant};

const CATALOG: &str = r#"
regions: {local: {}}
clusters: {local: {region: local}}
pools: {default: {cluster: local, instanceSpecs: [cpu.tiny]}}
instanceSpecs: {cpu.tiny: {kind: CPU, vcpus: 1, memoryMib: 256}}
nodes:
  node-a: {pool: default, vcpus: 16, memoryMib: 8192}
  node-b: {pool: default, vcpus: 16, memoryMib: 8192}
projectGroups: {default: {}}
images: {host: {}}
quotas: [{group: default, resourceType: Reserved, pool: default, spec: cpu.tiny, units: 32}]
"#;

#[path = "shared/up.rs"]
mod up;
use up::Api;

trait Wait {
    fn wait(&self, id: &str, want: &str) -> Duration {
        self.wait_every(id, want, Duration::from_micros(500))
    }
    fn wait_every(&self, id: &str, want: &str, every: Duration) -> Duration;
    fn wait_output(&self, id: &str, replicas: &[String], line: &str);
}

impl Wait for Api {
    fn wait_every(&self, id: &str, want: &str, every: Duration) -> Duration {
        let t0 = Instant::now();
        loop {
            let s = self.status(id);
            if s == want {
                return t0.elapsed();
            }
            assert!(
                !["Failed", "Succeeded", "Stopped"].contains(&s.as_str()) || s == want,
                "task {id} is {s}"
            );
            assert!(t0.elapsed() < Duration::from_secs(60), "task {id} stuck in {s}");
            std::thread::sleep(every);
        }
    }

    /// Waits until every replica's log holds `line`.
    fn wait_output(&self, id: &str, replicas: &[String], line: &str) {
        let t0 = Instant::now();
        let mut left: Vec<&String> = replicas.iter().collect();
        while !left.is_empty() {
            left.retain(|r| {
                let url = format!("{}/api/v1/tasks/{id}/logs?replica={r}", self.base);
                let text = self
                    .agent
                    .get(&url)
                    .header("Authorization", &self.auth)
                    .call()
                    .ok()
                    .and_then(|mut resp| resp.body_mut().read_to_string().ok())
                    .unwrap_or_default();
                !text.contains(line)
            });
            assert!(t0.elapsed() < Duration::from_secs(60), "task {id}: no {line:?} from {left:?}");
            std::thread::sleep(Duration::from_micros(500));
        }
    }
}

fn task(workers: u32) -> String {
    json!({
        "apiVersion": "trainyard.dev/v1", "kind": "TrainingTask",
        "metadata": {"namePrefix": "bench", "projectGroup": "default"},
        "spec": {"type": "PyTorchJob", "placement": {"region": "local", "cluster": "local"},
                 "environment": {"image": "host", "cmd": "echo ready; exec sleep 1000"},
                 "compute": {"resourceType": "Reserved", "pool": "default", "workers": workers,
                             "instanceSpecs": [{"spec": "cpu.tiny"}]}}
    })
    .to_string()
}

#[path = "shared/stats.rs"]
mod stats;
use stats::percentile;

/// (cpu seconds, rss bytes) of a process.
fn usage(pid: u32) -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    let cpu = (f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / 100.0;
    Some((cpu, f.get(21)?.parse::<u64>().ok()? * 4096))
}

/// The platform's processes for running replicas: supervisors and bubblewrap (outer and the sandbox's init).
/// bubblewrap reads its options from a descriptor, so it is found as the supervisors' child and grandchild.
fn platform_pids(data_dir: &str) -> Vec<u32> {
    // Children of every thread: a supervisor starts bubblewrap from a thread of its own.
    let children = |pid: u32| -> Vec<u32> {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
        tasks
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
            .flat_map(|c| c.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<u32>>())
            .collect()
    };
    let bwrap =
        |pid: &u32| std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| e.ends_with("bwrap"));
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        // A pooled supervisor (`supervise RUNS_DIR/-`) counts once it runs a replica (it has a child).
        if !(cmd.contains(" supervise ") && cmd.contains(data_dir)) {
            continue;
        }
        let outer: Vec<u32> = children(pid).into_iter().filter(bwrap).collect();
        if cmd.ends_with("/- ") && outer.is_empty() {
            continue;
        }
        out.push(pid);
        for b in outer {
            out.push(b);
            out.extend(children(b).into_iter().filter(bwrap));
        }
    }
    out
}

/// What a run measures, from the submission.
#[derive(Clone, Copy, PartialEq)]
enum Until {
    /// The API shows Running (asked every 0.5 ms).
    Running,
    /// Every replica's log holds its first line.
    Lines,
    /// The server's `Started` event, by the server's clock, with the task asked after every 20 ms only: the
    /// latency without the load a fast-polling client adds to a 2-core machine.
    Started,
}

/// A task's events, oldest first.
fn events(api: &Api, id: &str) -> Vec<serde_json::Value> {
    let (_, events) = api.call("GET", &format!("/api/v1/tasks/{id}/events"), None);
    events["items"].as_array().cloned().unwrap_or_default()
}

/// Milliseconds from a task's first event (`Submitted`) to its `Started`, by the server's clock.
fn started_after(api: &Api, id: &str) -> f64 {
    let events = events(api, id);
    let at = |reason: &str| events.iter().find(|e| e["reason"] == reason).and_then(|e| e["atMs"].as_i64());
    match (at("Submitted"), at("Started")) {
        (Some(a), Some(b)) => (b - a) as f64,
        other => panic!("task {id}: no Submitted and Started events ({other:?})"),
    }
}

/// The events of a task up to its first Running, in ms after its submission (the server's clock).
fn print_timeline(api: &Api, id: &str) {
    let events = events(api, id);
    let Some(t0) = events.first().and_then(|e| e["atMs"].as_i64()) else { return };
    println!("    task {id}:");
    for e in &events {
        let reason = e["reason"].as_str().unwrap_or("?");
        println!(
            "    {:>6} ms  {reason}: {}",
            e["atMs"].as_i64().unwrap_or(t0) - t0,
            e["message"].as_str().unwrap_or("")
        );
        if reason == "Started" {
            break;
        }
    }
}

fn main() {
    // `--timeline`: the events of each measure's slowest run, and the data dir kept to look into.
    let timeline = std::env::args().any(|a| a == "--timeline");
    let runs: usize =
        std::env::args().skip_while(|a| a != "--runs").nth(1).and_then(|n| n.parse().ok()).unwrap_or(40);
    let dir = std::env::temp_dir().join(format!("ty-local-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let dir = dir.canonicalize().unwrap();
    let (mut server, api) = up::start(&dir, CATALOG);

    println!("local backend, {runs} runs each, submit until the API shows Running (free capacity):");
    println!("{:<26} {:>9} {:>9} {:>9}   target", "", "p50 ms", "p99 ms", "max ms");
    let none = (f64::NAN, f64::NAN);
    for (label, workers, until, target) in [
        ("1 replica", 0u32, Until::Running, (30.0, 200.0)),
        ("1 replica, by its events", 0, Until::Started, none),
        ("1 replica, first line", 0, Until::Lines, none),
        ("8-replica gang", 7, Until::Running, (100.0, 200.0)),
        ("8-replica gang, by events", 7, Until::Started, none),
        ("8-replica gang, all lines", 7, Until::Lines, none),
    ] {
        let body = task(workers);
        let mut ms = Vec::new();
        let mut slowest: Option<(f64, String)> = None;
        for _ in 0..runs {
            let t0 = Instant::now();
            let (status, v) = api.call("POST", "/api/v1/tasks", Some(&body));
            assert_eq!(status, 201, "{v}");
            let id = v["id"].as_str().unwrap().to_owned();
            if until == Until::Lines {
                let name = v["name"].as_str().unwrap().to_owned();
                let replicas: Vec<String> = std::iter::once(format!("{name}-master-0"))
                    .chain((0..workers).map(|i| format!("{name}-worker-{i}")))
                    .collect();
                api.wait_output(&id, &replicas, "ready");
            } else if until == Until::Started {
                api.wait_every(&id, "Running", Duration::from_millis(20));
            } else {
                api.wait(&id, "Running");
            }
            let took = if until == Until::Started {
                started_after(&api, &id)
            } else {
                t0.elapsed().as_secs_f64() * 1000.0
            };
            ms.push(took);
            if slowest.as_ref().is_none_or(|(s, _)| took > *s) {
                slowest = Some((took, id.clone()));
            }
            api.call("POST", &format!("/api/v1/tasks/{id}/stop"), None);
            api.wait(&id, "Stopped");
        }
        ms.sort_by(f64::total_cmp);
        let (p50, p99) = (percentile(&ms, 0.5), percentile(&ms, 0.99));
        let t = if target.0.is_nan() {
            "(none set)".to_owned()
        } else {
            format!(
                "p50 ≤ {} ms ({:.2}×), p99 ≤ {} ms ({:.2}×)",
                target.0,
                p50 / target.0,
                target.1,
                p99 / target.1
            )
        };
        println!("{label:<26} {p50:>9.1} {p99:>9.1} {:>9.1}   {t}", ms[ms.len() - 1]);
        if timeline && let Some((_, id)) = &slowest {
            print_timeline(&api, id);
        }
    }

    // Overhead: 16 replicas running `sleep`, measured over 10 s.
    let gangs: Vec<String> = (0..2)
        .map(|_| {
            let (_, v) = api.call("POST", "/api/v1/tasks", Some(&task(7)));
            let id = v["id"].as_str().unwrap().to_owned();
            api.wait(&id, "Running");
            id
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let d = dir.display().to_string();
    let pids = platform_pids(&d);
    let before: Vec<(f64, u64)> = pids.iter().filter_map(|&p| usage(p)).collect();
    let server_before = usage(server.id()).unwrap();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(10));
    let secs = t0.elapsed().as_secs_f64();
    let after: Vec<(f64, u64)> = pids.iter().filter_map(|&p| usage(p)).collect();
    let server_after = usage(server.id()).unwrap();
    let replicas = 16.0;
    let cpu: f64 = after.iter().map(|a| a.0).sum::<f64>() - before.iter().map(|b| b.0).sum::<f64>();
    let rss: u64 = after.iter().map(|a| a.1).sum();
    println!(
        "\noverhead with 16 replicas running ({} platform processes: supervisors and bubblewrap):",
        pids.len()
    );
    println!(
        "  per replica: {:.2} MiB resident, {:.3} % of a core (supervisor + sandbox)",
        rss as f64 / replicas / 1048576.0,
        cpu / secs / replicas * 100.0
    );
    println!(
        "  server: {:.1} MiB resident, {:.2} % of a core in all ({:.3} % per replica)",
        server_after.1 as f64 / 1048576.0,
        (server_after.0 - server_before.0) / secs * 100.0,
        (server_after.0 - server_before.0) / secs / replicas * 100.0
    );
    for id in gangs {
        api.call("POST", &format!("/api/v1/tasks/{id}/stop"), None);
        api.wait(&id, "Stopped");
    }
    let _ = server.kill();
    let _ = server.wait();
    if timeline {
        println!("(the data dir is kept with --timeline: {})", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
}
