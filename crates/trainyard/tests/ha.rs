//! Several servers on one store. A SQLite store serves one server: a second `trainyard up` on the same data
//! dir, or on the same database from another data dir, is refused with the first one's pid, and a server
//! killed with `kill -9` leaves nothing that refuses the next. On PostgreSQL (`scripts/with-postgres`, as
//! `scripts/test` runs them) any number serve the API and one leads: its `kill -9` under a stream of creates
//! loses no acknowledged create and admits nothing twice; a leader paused past its lease acts on nothing
//! when it resumes, and follows.

mod common;

use common::leaders::{status, wait_leader};
use common::{Options, Server, pg, pytorch, secs};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `trainyard up` with `args`, expected to refuse to start: what it printed.
fn refused(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .arg("up")
        .args(["--backend", "fake", "--listen", "127.0.0.1:0"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let printed = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "a second server started:\n{printed}");
    printed
}

#[test]
fn a_sqlite_store_serves_one_server_and_a_second_is_refused_with_the_first_ones_pid() {
    let mut first = Server::start_with(
        "ha-sqlite-one",
        Options { args: vec!["--backend".into(), "fake".into()], ..Options::default() },
    );
    let pid = first.pid().unwrap();
    let dir = first.dir.display().to_string();

    // The same data dir.
    let said = refused(&["--data-dir", &dir]);
    assert!(said.contains("another trainyard server") && said.contains(&format!("pid {pid}")), "{said}");

    // Another data dir, the same database file.
    let other = std::env::temp_dir().join(format!("ty-ha-sqlite-two-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&other);
    let url = format!("sqlite://{dir}/trainyard.db");
    let said = refused(&["--data-dir", other.to_str().unwrap(), "--database-url", &url]);
    assert!(
        said.contains("SQLite store") && said.contains("PostgreSQL") && said.contains(&format!("pid {pid}"))
    );

    // The first still serves, alone, and says so.
    let (status, body) = first.call("GET", "/api/v1/tasks", None);
    assert_eq!(status, 200, "{body}");
    let said = first.cli(&["admin", "server"]);
    assert!(
        said.contains("alone on its store") && said.contains("(answered)") && said.contains("leader"),
        "{said}"
    );

    // Killed, it holds nothing: the next start on the same data dir is taken.
    first.restart();
    let (status, body) = first.call("GET", "/api/v1/tasks", None);
    assert_eq!(status, 200, "{body}");
    let _ = std::fs::remove_dir_all(&other);
}

/// A fresh database on the test PostgreSQL server.
fn fresh_database(name: &str) -> String {
    pg::fresh_database("ha", name)
}

/// How long a lease runs in these tests.
const LEASE_MS: u64 = 1000;

/// Where the fake backends of the servers of test `name` keep their runs, as a cluster would
/// (`TRAINYARD_FAKE_CLUSTER`): a run the last leader launched goes on under the next.
fn fake_cluster(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("ty-fake-cluster-{name}-{}", std::process::id()))
}

/// `n` servers on one fresh PostgreSQL database, the fake backend running each attempt for `run_ms` in a
/// fake cluster they share.
fn servers(name: &str, n: usize, run_ms: u64) -> Vec<Server> {
    let url = fresh_database(name);
    let cluster = fake_cluster(name);
    let _ = std::fs::remove_dir_all(&cluster);
    let opts = |seed: Option<std::path::PathBuf>| Options {
        args: ["--backend", "fake", "--database-url", &url, "--leader-lease-ms", &LEASE_MS.to_string()]
            .map(str::to_owned)
            .to_vec(),
        env: vec![
            ("TRAINYARD_FAKE_RUN_MS".into(), run_ms.to_string()),
            ("TRAINYARD_FAKE_CLUSTER".into(), cluster.display().to_string()),
        ],
        own_catalog: seed.is_some(),
        seed,
        ..Options::default()
    };
    let first = Server::start_with(&format!("{name}-0"), opts(None));
    let mut all = vec![];
    let seed = first.dir.clone();
    all.push(first);
    for i in 1..n {
        all.push(Server::start_with(&format!("{name}-{i}"), opts(Some(seed.clone()))));
    }
    all
}

/// One create through `base`: `Ok(id)` when answered 200/201, `Err` when the server could not be reached
/// or answered otherwise (a 5xx, a refusal).
fn create(base: &str, token: &str, key: &str, body: &str) -> Result<String, String> {
    let mut resp = common::agent()
        .post(format!("{base}/api/v1/tasks"))
        .header("Authorization", &format!("Bearer {token}"))
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .send(body.as_bytes())
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    if status != 200 && status != 201 {
        return Err(format!("{status}: {text}"));
    }
    let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    Ok(v["id"].as_str().unwrap().to_owned())
}

/// Clients creating tasks through every server in turn, each create with an Idempotency-Key and, when its
/// server cannot be reached, retried with the same key through the next one, as a client with a list of
/// servers does. Acknowledged creates are recorded by key.
struct Load {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<BTreeMap<String, String>>>,
    /// Creates retried through another server after their first server failed them.
    retried: Arc<Mutex<u64>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(bases: Vec<String>, token: String, clients: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(BTreeMap::new()));
        let retried = Arc::new(Mutex::new(0));
        let threads = (0..clients)
            .map(|c| {
                let (stop, acked, retried, bases, token) =
                    (stop.clone(), acked.clone(), retried.clone(), bases.clone(), token.clone());
                std::thread::spawn(move || {
                    let body = pytorch("ha", 0, "true").to_string();
                    let mut n = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        let key = format!("c{c}-{n}");
                        let mut tries = 0usize;
                        loop {
                            let base = &bases[(c + n + tries) % bases.len()];
                            match create(base, &token, &key, &body) {
                                Ok(id) => {
                                    acked.lock().unwrap().insert(key.clone(), id);
                                    break;
                                }
                                Err(_) if tries < 600 => {
                                    tries += 1;
                                    *retried.lock().unwrap() += 1;
                                    std::thread::sleep(Duration::from_millis(25));
                                }
                                Err(e) => panic!("create {key} failed through every server for long: {e}"),
                            }
                        }
                        n += 1;
                        // About 10 creates a second from two clients: what the fake backend's runs on the
                        // test catalog drain, so the queue stays short and every task ends within the test.
                        std::thread::sleep(Duration::from_millis(200));
                    }
                })
            })
            .collect();
        Load { stop, acked, retried, threads }
    }

    fn finish(self) -> (BTreeMap<String, String>, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        let acked = self.acked.lock().unwrap().clone();
        let retried = *self.retried.lock().unwrap();
        (acked, retried)
    }
}

/// Every acknowledged task is stored, ends Succeeded, and was admitted once per attempt; in the fake cluster
/// of test `name`, each ran its first attempt to its end (a gang the leader's loss did not stop), launched once.
fn check_every_task(s: &Server, acked: &BTreeMap<String, String>, name: &str) {
    let ids: BTreeSet<&String> = acked.values().collect();
    assert_eq!(ids.len(), acked.len(), "two keys answered with one task");
    let t0 = Instant::now();
    for id in &ids {
        let left = secs(180).saturating_sub(t0.elapsed()).max(secs(5));
        s.wait_status(id, "Succeeded", left);
        let (_, body) = s.call("GET", &format!("/api/v1/tasks/{id}/events"), None);
        let v: Value = serde_json::from_str(&body).unwrap();
        let mut admitted: BTreeMap<i64, u32> = BTreeMap::new();
        for e in v["items"].as_array().unwrap() {
            // An admission is Queued -> Admitted; Admitted -> Starting carries the same reason ("starting
            // replicas") and happens once per admission as well.
            if e["reason"] == "Admitted" && e["message"] != "starting replicas" {
                *admitted.entry(e["attempt"].as_i64().unwrap()).or_default() += 1;
            }
        }
        assert!(
            !admitted.is_empty() && admitted.values().all(|&n| n == 1),
            "{id} admitted {admitted:?}:\n{body}"
        );
        assert_eq!(s.task(id)["attempt"], 0, "{id} was started again as a new attempt:\n{body}");
    }
    let cluster = fake_cluster(name);
    let runs: BTreeSet<String> = std::fs::read_dir(cluster.join("runs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".json"))
        .collect();
    for id in &ids {
        assert!(runs.contains(&format!("{id}.0.json")), "{id}'s attempt 0 was never launched: {runs:?}");
    }
    let again = std::fs::read_to_string(cluster.join("launched-again")).unwrap_or_default();
    assert!(again.is_empty(), "launched twice (task attempt):\n{again}");
    eprintln!("{} runs launched, each once", runs.len());
}

/// The leader killed with `kill -9` `kills` times in a row under a stream of creates; each time the killed
/// server is started again (a follower now). Returns the failover times: from the kill to a live server
/// leading.
fn kill_the_leader_again_and_again(name: &str, n: usize, kills: usize) {
    let mut all = servers(name, n, 300);
    let token = all[0].token.clone();
    let bases: Vec<String> = all.iter().map(|s| s.base.clone()).collect();
    wait_leader(&all, secs(10));
    let load = Load::start(bases, token, 2);
    let mut failovers = Vec::new();
    for _ in 0..kills {
        std::thread::sleep(Duration::from_millis(400));
        let l = wait_leader(&all, secs(15));
        all[l].kill();
        let t0 = Instant::now();
        let next = wait_leader(&all, secs(15));
        failovers.push(t0.elapsed());
        assert_ne!(next, l);
        all[l].restart();
    }
    std::thread::sleep(Duration::from_millis(500));
    let (acked, retried) = load.finish();
    failovers.sort();
    eprintln!(
        "{n} servers, {kills} kills: {} creates acknowledged ({retried} retries through another server); failover \
         p50 {:?}, max {:?}",
        acked.len(),
        failovers[failovers.len() / 2],
        failovers.last().unwrap()
    );
    assert!(acked.len() > 50, "the load made too few creates to show anything: {}", acked.len());
    let l = wait_leader(&all, secs(15));
    check_every_task(&all[l], &acked, name);
    // And the servers that were killed and started again serve: each sees every task.
    for s in &all {
        let (status, body) = s.call("GET", "/api/v1/tasks?limit=1", None);
        assert_eq!(status, 200, "{body}");
    }
}

#[test]
fn two_servers_the_leader_killed_20_times_under_creates_lose_nothing_and_admit_nothing_twice() {
    kill_the_leader_again_and_again("ha-two", 2, 20);
}

#[test]
fn three_servers_the_leader_killed_20_times_under_creates_lose_nothing_and_admit_nothing_twice() {
    kill_the_leader_again_and_again("ha-three", 3, 20);
}

/// A leader stopped (SIGSTOP) past its lease: another takes over and runs what is created meanwhile; resumed,
/// the old leader acts on nothing (its term is over by its own clock, and the store refuses its token) and
/// follows; nothing is admitted twice.
#[test]
fn a_leader_paused_past_its_lease_follows_when_it_resumes() {
    let all = servers("ha-pause", 2, 300);
    let l = wait_leader(&all, secs(10));
    let paused = &all[l];
    let other = &all[1 - l];
    let before = paused.submit(&pytorch("before", 0, "true"));
    paused.wait_status(&before, "Succeeded", secs(30));
    let pid = paused.pid().unwrap().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let t0 = Instant::now();
    let took_over = loop {
        if let Some(v) = status(other)
            && v["leader"]["live"] == true
            && v["leader"]["server"] == v["thisServer"]
        {
            break v;
        }
        assert!(t0.elapsed() < secs(15), "the other server did not take over");
        std::thread::sleep(Duration::from_millis(20));
    };
    let token = took_over["leader"]["fencingToken"].as_i64().unwrap();
    let during: Vec<String> =
        (0..5).map(|i| other.submit(&pytorch(&format!("during{i}"), 0, "true"))).collect();
    for id in &during {
        other.wait_status(id, "Succeeded", secs(30));
    }
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    // Resumed, it follows: its metrics say so, and the lease stays with the term that took over.
    let t0 = Instant::now();
    loop {
        let (_, metrics) = paused.call("GET", "/metrics", None);
        if metrics.contains("trainyard_leader 0") && metrics.contains("trainyard_leader_terms_lost_total 1") {
            break;
        }
        assert!(t0.elapsed() < secs(10), "the resumed server still leads:\n{metrics}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let v = status(paused).unwrap();
    assert_eq!(v["leader"]["fencingToken"].as_i64(), Some(token), "{v}");
    assert_ne!(v["leader"]["server"], v["thisServer"], "{v}");
    // Work created on the resumed server runs, through the leader.
    let after = paused.submit(&pytorch("after", 0, "true"));
    paused.wait_status(&after, "Succeeded", secs(30));
    let acked: BTreeMap<String, String> = std::iter::once(before)
        .chain(during)
        .chain(std::iter::once(after))
        .enumerate()
        .map(|(i, id)| (i.to_string(), id))
        .collect();
    check_every_task(other, &acked, "ha-pause");
}

/// A create retried with its Idempotency-Key through another server is the same request: the same task.
#[test]
fn an_idempotent_create_retried_through_another_server_returns_the_same_task() {
    let all = servers("ha-idem", 2, 300);
    let body = pytorch("idem", 0, "true").to_string();
    let first = create(&all[0].base, &all[0].token, "retry-me", &body).unwrap();
    let again = create(&all[1].base, &all[1].token, "retry-me", &body).unwrap();
    assert_eq!(first, again);
    let other = pytorch("idem-other", 0, "true").to_string();
    let e = create(&all[1].base, &all[1].token, "retry-me", &other).unwrap_err();
    assert!(e.starts_with("409"), "{e}");

    // `trainyard admin server` through either: the leader with its token, and both servers.
    let l = wait_leader(&all, secs(10));
    let said = all[1 - l].cli(&["admin", "server"]);
    assert!(said.contains("leader: ") && said.contains("fencing token"), "{said}");
    assert_eq!(said.matches(" leader ").count() + said.matches("follower").count(), 2, "{said}");
    assert!(
        said.contains(&all[0].base) && said.contains(&all[1].base) && said.contains("(answered)"),
        "{said}"
    );
}

/// A server started with another server key than those already on the store is refused: it would seal hidden
/// values the others cannot open.
#[test]
fn a_server_with_another_key_is_refused_on_a_shared_store() {
    let all = servers("ha-key", 1, 300);
    let url = all[0].args_value("--database-url");
    let dir = std::env::temp_dir().join(format!("ty-ha-other-key-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let said = refused(&["--data-dir", dir.to_str().unwrap(), "--database-url", &url]);
    assert!(said.contains("this server's key differs") && said.contains("server.key"), "{said}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stop asked of a follower is stored at once; the leader's reconciliation carries it out.
#[test]
fn a_stop_through_a_follower_stops_the_task_the_leader_runs() {
    let all = servers("ha-stop", 2, 30_000);
    let l = wait_leader(&all, secs(10));
    let follower = &all[1 - l];
    let id = all[l].submit(&pytorch("long", 0, "sleep 600"));
    all[l].wait_status(&id, "Running", secs(30));
    let (status, body) = follower.call("POST", &format!("/api/v1/tasks/{id}/stop"), None);
    assert_eq!(status, 200, "{body}");
    let t = all[l].wait_status(&id, "Stopped", secs(30));
    assert_eq!(t["status"], "Stopped");
}

/// A PostgreSQL server of this test's own (it is restarted), as `scripts/with-postgres` starts one.
struct OwnPostgres {
    dir: std::path::PathBuf,
    bin: std::path::PathBuf,
    port: u16,
}

impl OwnPostgres {
    fn start() -> OwnPostgres {
        let mut bins: Vec<std::path::PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL's server (apt-get install postgresql)")
            .flatten()
            .map(|e| e.path().join("bin"))
            .filter(|b| b.join("initdb").exists())
            .collect();
        bins.sort();
        let bin = bins.pop().expect("an initdb");
        let dir = std::env::temp_dir().join(format!("ty-ha-pg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        assert!(Command::new("chown").arg("postgres").arg(&dir).status().unwrap().success());
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let pg = OwnPostgres { dir, bin, port };
        pg.as_postgres("initdb", &["-D", "data", "-U", "trainyard", "--auth=trust", "--no-sync"]);
        pg.pg_ctl("start");
        pg
    }

    fn as_postgres(&self, tool: &str, args: &[&str]) {
        let out = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join(tool))
            .args(args)
            .current_dir(&self.dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{tool}: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn pg_ctl(&self, what: &str) {
        let opts = format!("-p {} -k {} -c listen_addresses=127.0.0.1", self.port, self.dir.display());
        let log = self.dir.join("log").display().to_string();
        self.as_postgres("pg_ctl", &["-D", "data", "-l", &log, "-w", "-m", "fast", "-o", &opts, what]);
    }

    fn url(&self) -> String {
        format!("postgres://trainyard@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .args(["-D", "data", "-m", "immediate", "stop"])
            .current_dir(&self.dir)
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// PostgreSQL restarted under a stream of creates through two servers: they reconnect, one takes the lease
/// again, every acknowledged create is there and was admitted once.
#[test]
fn postgres_restarted_under_creates_the_servers_reconnect_and_one_leads_again() {
    let pg = OwnPostgres::start();
    let url = pg.url();
    let name = "ha-pg-restart";
    let cluster = fake_cluster(name);
    let _ = std::fs::remove_dir_all(&cluster);
    let opts = |seed: Option<std::path::PathBuf>| Options {
        args: ["--backend", "fake", "--database-url", &url, "--leader-lease-ms", &LEASE_MS.to_string()]
            .map(str::to_owned)
            .to_vec(),
        env: vec![
            ("TRAINYARD_FAKE_RUN_MS".into(), "300".into()),
            ("TRAINYARD_FAKE_CLUSTER".into(), cluster.display().to_string()),
        ],
        own_catalog: seed.is_some(),
        seed,
        ..Options::default()
    };
    let a = Server::start_with("ha-pg-restart-0", opts(None));
    let b = Server::start_with("ha-pg-restart-1", opts(Some(a.dir.clone())));
    let all = vec![a, b];
    wait_leader(&all, secs(10));
    let load = Load::start(all.iter().map(|s| s.base.clone()).collect(), all[0].token.clone(), 2);
    std::thread::sleep(Duration::from_secs(2));
    pg.pg_ctl("restart");
    std::thread::sleep(Duration::from_secs(4));
    let (acked, retried) = load.finish();
    eprintln!("PostgreSQL restarted: {} creates acknowledged, {retried} retried", acked.len());
    let l = wait_leader(&all, secs(20));
    // Both agree on who leads.
    let seen: BTreeSet<String> = all
        .iter()
        .filter_map(status)
        .map(|v| v["leader"]["server"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(seen.len(), 1, "the servers disagree on the leader: {seen:?}");
    check_every_task(&all[l], &acked, name);
    // And after it, the stream goes on through both.
    let body = pytorch("after-restart", 0, "true").to_string();
    for (i, s) in all.iter().enumerate() {
        let id = create(&s.base, &s.token, &format!("after-{i}"), &body).unwrap();
        all[l].wait_status(&id, "Succeeded", secs(30));
    }
}

/// A queued task read through a follower says where it stands and why, as the leader's loop has it (the
/// follower asks the leader for its boards every second); the boards are refused without the servers' key.
#[test]
fn a_follower_shows_a_queued_tasks_place_and_reason_as_the_leader_has_them() {
    let all = servers("ha-boards", 2, 600_000);
    let l = wait_leader(&all, secs(10));
    let (leader, follower) = (&all[l], &all[1 - l]);
    // More than the quota holds: the rest wait, in line.
    let ids: Vec<String> = (0..12).map(|i| follower.submit(&pytorch(&format!("q{i}"), 0, "true"))).collect();
    let queued = loop {
        let waiting: Vec<&String> = ids.iter().filter(|id| leader.task(id)["status"] == "Queued").collect();
        if waiting.len() >= 2 && waiting.iter().all(|id| !leader.task(id)["queue"].is_null()) {
            break waiting.last().map(|id| id.to_string()).unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let want = leader.task(&queued)["queue"].clone();
    assert!(
        want["position"].as_u64().unwrap() >= 2 && !want["reason"].as_str().unwrap().is_empty(),
        "{want}"
    );
    let t0 = Instant::now();
    loop {
        let got = follower.task(&queued)["queue"].clone();
        if got == want {
            break;
        }
        assert!(t0.elapsed() < secs(10), "the follower shows {got}, the leader {want}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The quota figures too: the follower makes them from the store as the leader does from its working set.
    let t0 = Instant::now();
    loop {
        let (_, mine) = leader.call("GET", "/api/v1/quota", None);
        let (_, theirs) = follower.call("GET", "/api/v1/quota", None);
        let lines: Value = serde_json::from_str(&mine).unwrap();
        let used: u64 = lines["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["limit"].as_u64().unwrap() - l["remaining"].as_u64().unwrap())
            .sum();
        if mine == theirs && used > 0 {
            break;
        }
        assert!(t0.elapsed() < secs(10), "the follower's quota figures:\n{theirs}\nthe leader's:\n{mine}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // The boards answer another server's proof or an admin, nobody else; a follower has none to give.
    let (status, body) = leader.call("GET", "/api/v1/server/boards", None);
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(v["queued"].as_array().unwrap().iter().any(|q| q["taskId"] == queued.as_str()), "{body}");
    let (status, body) =
        leader.call("GET", &format!("/api/v1/server/boards?since={}", v["version"].as_str().unwrap()), None);
    assert_eq!(status, 200, "{body}");
    let unchanged: Value = serde_json::from_str(&body).unwrap();
    assert!(unchanged["unchanged"] == true || unchanged["version"] != v["version"], "{body}");
    let (status, body) = follower.call("GET", "/api/v1/server/boards", None);
    assert_eq!(status, 409, "{body}");
    let ask = |token: &str| {
        let resp = common::agent()
            .get(format!("{}/api/v1/server/boards", leader.base))
            .header("Authorization", &format!("Bearer {token}"))
            .call()
            .unwrap();
        resp.status().as_u16()
    };
    assert_eq!(ask("peer.0123456789abcdef"), 401, "a forged proof");
    let body = serde_json::json!({"name": "someone", "role": "member", "groups": ["default"]}).to_string();
    let (status, answer) = leader.call("POST", "/api/v1/admin/users", Some(&body));
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = leader.call("POST", "/api/v1/users/someone/tokens", Some("{}"));
    assert_eq!(status, 201, "{answer}");
    let token = serde_json::from_str::<Value>(&answer).unwrap()["token"].as_str().unwrap().to_owned();
    assert_eq!(ask(&token), 403, "a member");
}

/// A catalog change through a follower is in force at the leader for every task created after it returned:
/// the leader compares the stored catalog before each plan, after its read of the new tasks (the catalog
/// followers poll every second would leave a window in which a task is placed under the old one).
#[test]
fn a_catalog_changed_through_a_follower_holds_for_the_next_task_at_once() {
    // Runs that hold their quota for the whole test.
    let all = servers("ha-catalog", 2, 600_000);
    let l = wait_leader(&all, secs(10));
    let (leader, follower) = (&all[l], &all[1 - l]);
    // Admitted: its replicas start (60 s) and run.
    let admitted = |id: &str| {
        let t0 = Instant::now();
        while !["Starting", "Running"].contains(&leader.task(id)["status"].as_str().unwrap_or("")) {
            assert!(t0.elapsed() < secs(30), "{id} not admitted:\n{}", leader.events_text(id));
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let mut running = vec![follower.submit(&pytorch("first", 0, "true"))];
    admitted(&running[0]);
    for round in 0..4 {
        // The group's quota is what runs already (rounds 0 and 2: the next task must wait), or ample again
        // (rounds 1 and 3: the waiting one and the next run).
        let tight = round % 2 == 0;
        let (_, body) = follower.call("GET", "/api/v1/catalog", None);
        let mut catalog: Value = serde_json::from_str(&body).unwrap();
        let units = if tight { running.len() } else { 64 };
        for q in catalog["quotas"].as_array_mut().unwrap() {
            q["units"] = serde_json::json!(units);
        }
        let (status, body) = follower.call("PUT", "/api/v1/admin/catalog", Some(&catalog.to_string()));
        assert_eq!(status, 200, "{body}");
        let id = follower.submit(&pytorch(&format!("after{round}"), 0, "true"));
        if tight {
            std::thread::sleep(Duration::from_millis(1500));
            let t = leader.task(&id);
            assert_eq!(
                t["status"],
                "Queued",
                "admitted under the catalog before:\n{}",
                leader.events_text(&id)
            );
        }
        running.push(id);
        if !tight {
            for id in &running {
                admitted(id);
            }
        }
    }
}
