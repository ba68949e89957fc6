//! Several servers on one PostgreSQL store (issue 33), measured side by side in one run:
//!
//! (a) creates/s through 1 server, then through 2 servers on the same database (clients spread over them),
//!     each on a fresh database, the same clients and the same length of time;
//! (b) failover: the leader `kill -9`'d `--kills` times (default 20); each time a task is created through the
//!     surviving server at once, and the figure is the time from the kill to that task's admission (its
//!     status leaves Queued), asked every 5 ms; the killed server is started again (a follower) before the
//!     next kill. p50, p99 and max, with the lease the servers ship with (`--lease-ms`, default 1500).
//!
//!   scripts/with-postgres cargo run --release -p trainyard --bin ha-bench [-- --kills N --seconds S --clients N]
//!
//! The servers are `trainyard up --backend fake` (the binary next to this one: `cargo build --release -p
//! trainyard` first), each with a data dir of its own, the first one's admin token and server key copied to
//! the second. Figures are this machine's: servers, clients and PostgreSQL share its cores.

#[path = "../../tests/common/pg.rs"]
mod pg;
#[path = "shared/stats.rs"]
mod stats;
#[path = "shared/up.rs"]
mod up;

use serde_json::{Value, json};
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use up::Api;

const CATALOG: &str = r#"
regions: {local: {}}
clusters: {local: {region: local}}
pools: {default: {cluster: local, instanceSpecs: [cpu.tiny]}}
instanceSpecs: {cpu.tiny: {kind: CPU, vcpus: 1, memoryMib: 256}}
nodes:
  node-a: {pool: default, vcpus: 64, memoryMib: 65536}
  node-b: {pool: default, vcpus: 64, memoryMib: 65536}
projectGroups: {default: {}}
images: {host: {}}
quotas: [{group: default, resourceType: Reserved, pool: default, spec: cpu.tiny, units: 128}]
"#;

fn task(prefix: &str) -> String {
    json!({
        "apiVersion": "trainyard.dev/v1", "kind": "TrainingTask",
        "metadata": {"namePrefix": prefix, "projectGroup": "default"},
        "spec": {
            "type": "PyTorchJob",
            "placement": {"region": "local", "cluster": "local"},
            "environment": {"image": "host", "cmd": "true"},
            "compute": {"resourceType": "Reserved", "pool": "default", "workers": 0,
                        "instanceSpecs": [{"spec": "cpu.tiny"}]}
        }
    })
    .to_string()
}

struct Opts {
    kills: usize,
    seconds: u64,
    clients: usize,
    lease_ms: u64,
}

fn opts() -> Opts {
    let mut o = Opts { kills: 20, seconds: 10, clients: 8, lease_ms: 1500 };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let value = || pair.get(1).and_then(|v| v.parse::<u64>().ok()).expect("a number after each flag");
        match pair[0].as_str() {
            "--kills" => o.kills = value() as usize,
            "--seconds" => o.seconds = value(),
            "--clients" => o.clients = value() as usize,
            "--lease-ms" => o.lease_ms = value(),
            other => panic!("unknown flag {other}: --kills N --seconds S --clients N --lease-ms MS"),
        }
    }
    o
}

/// A fresh database on the test PostgreSQL server.
fn fresh_database(name: &str) -> String {
    pg::fresh_database("ha_bench", name)
}

/// A server of the group: its process and API.
struct Member {
    child: Child,
    api: Api,
}

struct Group {
    url: String,
    lease: String,
    root: std::path::PathBuf,
    members: Vec<Member>,
}

impl Group {
    fn start(name: &str, n: usize, lease_ms: u64, run_ms: u64) -> Group {
        let root = std::env::temp_dir().join(format!("ty-ha-bench-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let mut g =
            Group { url: fresh_database(name), lease: lease_ms.to_string(), root, members: Vec::new() };
        for i in 0..n {
            let m = g.spawn(i, run_ms);
            g.members.push(m);
        }
        let admin = &g.members[0].api;
        let (status, body) =
            admin.call("PUT", "/api/v1/admin/settings", Some(r#"{"maxQueuedTasksPerUser": 1000000}"#));
        assert_eq!(status, 200, "{body}");
        g
    }

    fn spawn(&self, i: usize, run_ms: u64) -> Member {
        let dir = self.root.join(format!("s{i}"));
        if i > 0 || dir.exists() {
            std::fs::create_dir_all(&dir).unwrap();
            for f in ["admin.token", "server.key"] {
                let from = self.root.join("s0").join(f);
                if !dir.join(f).exists() && from.exists() {
                    std::fs::copy(from, dir.join(f)).unwrap();
                }
            }
        }
        let run = run_ms.to_string();
        let args = ["--backend", "fake", "--database-url", &self.url, "--leader-lease-ms", &self.lease];
        let (child, api) = up::start_env(&dir, CATALOG, &args, &[("TRAINYARD_FAKE_RUN_MS", &run)]);
        Member { child, api }
    }

    /// The index of the member that leads, as the live ones see it.
    fn leader(&self, skip: Option<usize>) -> Option<usize> {
        for (i, m) in self.members.iter().enumerate().filter(|(i, _)| Some(*i) != skip) {
            let Ok(mut r) = m
                .api
                .agent
                .get(format!("{}/api/v1/server", m.api.base))
                .header("Authorization", &m.api.auth)
                .call()
            else {
                continue;
            };
            let v: Value =
                serde_json::from_str(&r.body_mut().read_to_string().unwrap_or_default()).unwrap_or_default();
            if v["leader"]["live"] != true {
                return None;
            }
            let id = v["leader"]["server"].as_str()?;
            if v["thisServer"] == id {
                return Some(i);
            }
            let address = v["servers"].as_array()?.iter().find(|s| s["id"] == id)?["address"].as_str()?;
            return self.members.iter().position(|m| m.api.base == address).filter(|&j| Some(j) != skip);
        }
        None
    }

    fn wait_leader(&self, skip: Option<usize>) -> usize {
        let t0 = Instant::now();
        loop {
            if let Some(i) = self.leader(skip) {
                return i;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "no server leads after 60 s");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for m in &mut self.members {
            let _ = m.child.kill();
            let _ = m.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Creates/s through `n` servers on a fresh database: `clients` threads for `seconds`, each sending its
/// creates to the servers in turn.
fn creates_per_second(n: usize, o: &Opts) -> f64 {
    let g = Group::start(&format!("creates{n}"), n, o.lease_ms, 60_000);
    g.wait_leader(None);
    let bases: Vec<(String, String)> =
        g.members.iter().map(|m| (m.api.base.clone(), m.api.auth.clone())).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let body = task("bench");
    let threads: Vec<_> = (0..o.clients)
        .map(|c| {
            let (stop, done, bases, body) = (stop.clone(), done.clone(), bases.clone(), body.clone());
            std::thread::spawn(move || {
                let agent: ureq::Agent =
                    ureq::Agent::config_builder().http_status_as_error(false).build().into();
                let mut k = c;
                while !stop.load(Ordering::Relaxed) {
                    let (base, auth) = &bases[k % bases.len()];
                    k += 1;
                    let r = agent
                        .post(format!("{base}/api/v1/tasks"))
                        .header("Authorization", auth)
                        .send(body.as_bytes());
                    if r.is_ok_and(|r| r.status() == 201) {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(o.seconds));
    stop.store(true, Ordering::Relaxed);
    let took = t0.elapsed().as_secs_f64();
    for t in threads {
        t.join().unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / took
}

/// Failover times: from the leader's kill to the admission of a task created at once through the other
/// server, `kills` times.
fn failovers(o: &Opts) -> Vec<f64> {
    let mut g = Group::start("failover", 2, o.lease_ms, 200);
    let mut times = Vec::new();
    let body = task("probe");
    for k in 0..o.kills {
        let l = g.wait_leader(None);
        // The follower is up and sees the leader: the probe's server.
        let f = 1 - l;
        let _ = g.members[l].child.kill();
        let t0 = Instant::now();
        let _ = g.members[l].child.wait();
        let (status, v) = g.members[f].api.call("POST", "/api/v1/tasks", Some(&body));
        assert_eq!(status, 201, "{v}");
        let id = v["id"].as_str().unwrap().to_owned();
        loop {
            let s = g.members[f].api.status(&id);
            if !s.is_empty() && s != "Queued" {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "the probe was not admitted within 60 s");
            std::thread::sleep(Duration::from_millis(5));
        }
        let took = t0.elapsed().as_secs_f64();
        times.push(took);
        eprintln!("kill {}: admitted {:.3} s after the leader's death", k + 1, took);
        // The killed server again, as a follower; the next kill waits until it sees the leader.
        let restarted = g.spawn(l, 200);
        g.members[l] = restarted;
        g.wait_leader(None);
    }
    times
}

fn main() {
    let o = opts();
    println!(
        "ha-bench: {} clients for {} s per figure; {} kills; lease {} ms",
        o.clients, o.seconds, o.kills, o.lease_ms
    );
    let one = creates_per_second(1, &o);
    let two = creates_per_second(2, &o);
    println!("creates/s, 1 server:   {one:.0}");
    println!("creates/s, 2 servers:  {two:.0}   (ratio {:.2}x, same database, same clients)", two / one);
    let mut times = failovers(&o);
    times.sort_by(f64::total_cmp);
    println!(
        "failover (leader kill -9 to the next admission), {} kills: p50 {:.2} s, p99 {:.2} s, max {:.2} s (goal: p50 <= 2 s, p99 <= 5 s)",
        times.len(),
        stats::percentile(&times, 0.5),
        stats::percentile(&times, 0.99),
        times.last().copied().unwrap_or(0.0)
    );
}
