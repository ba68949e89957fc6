//! The control plane's load benchmark, against a real server on loopback with SQLite (the embedded default):
//!
//! 1. durable creates per second with 64 concurrent HTTP clients, and the create latency p50/p99;
//! 2. list latency for a page of 50 among 1,000,000 stored tasks (newest first; for an admin, for a member who
//!    sees part of them, with a status filter), p50/p99;
//! 3. the server's resident memory with 1,000,000 tasks stored (the server runs in a process of its own, on
//!    the same database file, so the load generator's memory is not counted).
//!
//! Run: `cargo run --release -p trainyard-api --bin api-bench` (`-- --quick` for a small smoke run,
//! `-- --creates-only` for the creates alone).

// The benchmark's setup writes users, tokens and settings straight into the store before any server runs.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;

/// The allocator the server binary uses (see `crates/trainyard/src/main.rs`), so the figures are its.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use trainyard_api::backends::AnyBackend;
use trainyard_api::settings::AdminSettings;
use trainyard_api::{AppState, new_token, token_hash};
use trainyard_control::secrets::SecretBox;
use trainyard_core::Catalog;
use trainyard_runtime::fake::{FakeBackend, Script};
use trainyard_sched::Config;
use trainyard_store::{NewTask, Store, User};

const CATALOG: &str = r#"
regions: {local: {}}
clusters: {local: {region: local}}
pools: {default: {cluster: local, instanceSpecs: [cpu.small]}}
instanceSpecs: {cpu.small: {kind: CPU, vcpus: 1, memoryMib: 1024}}
nodes: {node-0: {pool: default, vcpus: 64, memoryMib: 262144}}
projectGroups: {nlp: {}, cv: {}}
images: {host: {torch: true, ray: true}}
quotas:
  - {group: nlp, resourceType: Reserved, pool: default, spec: cpu.small, units: 32}
"#;

const TASK: &str = r#"apiVersion: trainyard.dev/v1
kind: TrainingTask
metadata: {namePrefix: bench, projectGroup: nlp, public: true, labels: {}}
spec:
  type: PyTorchJob
  placement: {region: local, cluster: local}
  environment: {image: host, cmd: python3 train.py, env: [{name: LR, value: "3e-4"}]}
  compute: {resourceType: Reserved, pool: default, workers: 1, instanceSpecs: [{spec: cpu.small}]}
"#;

/// One keep-alive connection speaking just enough HTTP/1.1 for the benchmark's requests.
struct RawClient {
    reader: std::io::BufReader<std::net::TcpStream>,
    writer: std::net::TcpStream,
    host: String,
}

impl RawClient {
    fn connect(addr: &str) -> Self {
        let stream = std::net::TcpStream::connect(addr).unwrap();
        stream.set_nodelay(true).unwrap();
        RawClient {
            reader: std::io::BufReader::new(stream.try_clone().unwrap()),
            writer: stream,
            host: addr.to_owned(),
        }
    }

    /// Sends one POST and reads the whole answer; returns its status.
    fn post(&mut self, path: &str, token: &str, key: &str, body: &[u8]) -> u16 {
        use std::io::{BufRead, Read, Write};
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {token}\r\nIdempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        let mut request = head.into_bytes();
        request.extend_from_slice(body);
        self.writer.write_all(&request).unwrap();
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        let status: u16 = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let mut length = 0usize;
        loop {
            line.clear();
            self.reader.read_line(&mut line).unwrap();
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut answer = vec![0u8; length];
        self.reader.read_exact(&mut answer).unwrap();
        status
    }
}

fn pct(mut v: Vec<Duration>, p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn row(what: &str, result: String, target: &str, ratio: f64) {
    println!("{what:<62} {result:>12} {target:>12} {ratio:>7.2}");
}

/// `--serve URL`: the server alone, in its own process, so its memory can be measured apart from the load
/// generator. Prints `LISTENING <base>` when ready, then serves until killed.
fn serve_mode(url: &str) {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let store = Store::connect(url).await.unwrap();
        // The benchmark queues tens of thousands of tasks as one user: past the default cap on queued tasks.
        let unlimited = AdminSettings {
            max_queued_tasks_per_user: trainyard_api::settings::MAX_QUEUED_TASKS_CAP,
            ..AdminSettings::default()
        };
        unlimited.save(&store, 0).await.unwrap();
        let catalog = Catalog::from_yaml(CATALOG).unwrap();
        let backend = AnyBackend::Fake(FakeBackend::new(Script::default()));
        let secrets = SecretBox::generate().unwrap();
        let state = AppState::new(store.clone(), catalog, backend, secrets, Config::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("LISTENING http://{}", listener.local_addr().unwrap());
        trainyard_api::serve(listener, state).await.unwrap();
    });
}

/// CPU time another process has used (user + system), in seconds.
fn cpu_of_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces) start at its closing parenthesis.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    // utime and stime are fields 14 and 15 of the line; `f` starts at field 4 (the state letter is skipped).
    f.get(10).zip(f.get(11)).map_or(0.0, |(u, s)| (u + s) / 100.0)
}

/// The control loop's tick count and time spent in ticks (seconds), from the server's `/metrics` (which
/// takes an admin's token).
fn control_ticks(base: &str, admin: &str) -> (f64, f64) {
    let text = ureq::get(&format!("{base}/metrics"))
        .header("Authorization", &format!("Bearer {admin}"))
        .call()
        .ok()
        .and_then(|mut r| r.body_mut().read_to_string().ok())
        .unwrap_or_default();
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (value("trainyard_control_tick_seconds_count"), value("trainyard_control_tick_seconds_sum"))
}

/// Resident memory of another process, in MB.
fn rss_of_mb(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--serve") {
        return serve_mode(&args[i + 1]);
    }
    let quick = args.iter().any(|a| a == "--quick");
    let creates_only = args.iter().any(|a| a == "--creates-only");
    let (create_secs, stored) = if quick { (3, 20_000) } else { (10, 1_000_000) };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let dir = std::env::temp_dir().join(format!("trainyard-api-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("bench.db").display());
    let (admin, member, store) = rt.block_on(async {
        let store = Store::connect(&url).await.unwrap();
        let mut tokens = Vec::new();
        for (name, role) in [("admin", "admin"), ("member", "member")] {
            store
                .put_user(&User { name: name.into(), role: role.into(), groups: vec!["nlp".into()] }, 0)
                .await
                .unwrap();
            let token = new_token().unwrap();
            store.add_token(&token_hash(&token), name, "bench", 0).await.unwrap();
            tokens.push(token);
        }
        (tokens[0].clone(), tokens[1].clone(), store)
    });
    // The server in a process of its own, on the same database file.
    let mut server = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--serve", &url])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let base = {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(server.stdout.take().unwrap()).read_line(&mut line).unwrap();
        line.trim().strip_prefix("LISTENING ").expect("the server says where it listens").to_owned()
    };
    println!(
        "trainyard control-plane benchmark{} (SQLite, synchronous commits)",
        if quick { " (quick)" } else { "" }
    );
    println!("{:<62} {:>12} {:>12} {:>7}", "measure", "result", "target", "ratio");

    // 1. Creates from 64 clients, sending JSON as programs do (the CLI sends a file's YAML as it is).
    let json_task = {
        let (task, _) = trainyard_core::parse(TASK.as_bytes());
        Arc::new(serde_json::to_string(&task.expect("the benchmark task parses")).unwrap())
    };
    let stop = Arc::new(AtomicBool::new(false));
    let cpu_before = cpu_of_s(server.id());
    let ticks_before = control_ticks(&base, &admin);
    let clients: Vec<_> = (0..64)
        .map(|c| {
            let (base, token, stop, body) = (base.clone(), admin.clone(), stop.clone(), json_task.clone());
            std::thread::spawn(move || {
                // A minimal keep-alive HTTP/1.1 client: on a 2-core machine the load generator shares the CPU
                // with the server, so it must cost little per request to measure the server, not itself.
                let addr = base.trim_start_matches("http://").to_owned();
                let mut conn = RawClient::connect(&addr);
                let mut lat = Vec::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let status = conn.post("/api/v1/tasks", &token, &format!("c{c}-{n}"), body.as_bytes());
                    assert_eq!(status, 201);
                    lat.push(t.elapsed());
                    n += 1;
                }
                lat
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(create_secs));
    stop.store(true, Ordering::Relaxed);
    let lat: Vec<Duration> = clients.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let server_cpu = cpu_of_s(server.id()) - cpu_before;
    let ticks = {
        let (n1, s1) = control_ticks(&base, &admin);
        (n1 - ticks_before.0, s1 - ticks_before.1)
    };
    let rate = lat.len() as f64 / create_secs as f64;
    row(
        "creates/s, 64 concurrent clients, durable (acknowledged = committed)",
        format!("{rate:.0}"),
        "≥ 5000",
        rate / 5000.0,
    );
    row("create latency p50 ms", format!("{:.2}", ms(pct(lat.clone(), 0.5))), "", 0.0);
    row("create latency p99 ms", format!("{:.2}", ms(pct(lat.clone(), 0.99))), "", 0.0);
    // The server's own CPU per create: what the rate costs, less sensitive than the rate itself to whatever
    // else this machine runs meanwhile.
    row(
        "server CPU per create, µs (all threads: HTTP, validation, store, control loop)",
        format!("{:.0}", server_cpu * 1e6 / lat.len() as f64),
        "",
        0.0,
    );
    println!(
        "    control loop meanwhile: {:.0} ticks, {:.2} ms each on average, {:.0}% of one core",
        ticks.0,
        ticks.1 * 1e3 / ticks.0.max(1.0),
        ticks.1 * 100.0 / create_secs as f64
    );

    if creates_only {
        println!("    server resident memory {:.0} MB", rss_of_mb(server.id()));
        let _ = server.kill();
        let _ = server.wait();
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }

    // 2. Fill to the stored count, then list.
    let have = rt.block_on(store.count_tasks()).unwrap() as usize;
    let t0 = Instant::now();
    let spec_json = {
        let (task, _) = trainyard_core::parse(TASK.as_bytes());
        serde_json::to_string(&task.expect("the benchmark task parses")).unwrap()
    };
    const BATCH: usize = 10_000;
    let mut i = have;
    while i < stored {
        let batch: Vec<NewTask> = (i..(i + BATCH).min(stored))
            .map(|k| NewTask {
                id: format!("{k:016x}"),
                name: format!("bulk-{k}"),
                owner: if k % 2 == 0 { "admin".into() } else { "someone".into() },
                project_group: if k % 4 < 2 { "nlp".into() } else { "cv".into() },
                task_type: "PyTorchJob".into(),
                // Ended tasks: the control loop has no work for them, as with most of a long history.
                status: if k % 10 == 0 {
                    trainyard_core::lifecycle::Status::Failed
                } else {
                    trainyard_core::lifecycle::Status::Succeeded
                },
                public: k % 3 == 0,
                labels: Default::default(),
                spec_json: spec_json.clone(),
                created_at_ms: 1_000_000 + k as i64,
                idempotency: None,
                first_event: None,
                demand: None,
            })
            .collect();
        rt.block_on(store.import_tasks(&batch)).unwrap();
        i += BATCH;
    }
    println!(
        "    stored {} tasks in {:.1} s (bulk import, not measured)",
        rt.block_on(store.count_tasks()).unwrap(),
        t0.elapsed().as_secs_f64()
    );
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let list = |who: &str, token: &str, query: &str| {
        let mut times = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..200 {
            let url = match &cursor {
                Some(c) => format!("{base}/api/v1/tasks?limit=50&{query}&cursor={c}"),
                None => format!("{base}/api/v1/tasks?limit=50&{query}"),
            };
            let t = Instant::now();
            let mut resp =
                agent.get(&url).header("Authorization", &format!("Bearer {token}")).call().unwrap();
            let body = resp.body_mut().read_to_string().unwrap();
            times.push(t.elapsed());
            assert_eq!(resp.status().as_u16(), 200, "{body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert!(v["items"].as_array().unwrap().len() <= 50, "{who} {query}");
            cursor = v["nextCursor"].as_str().map(str::to_owned);
            if cursor.is_none() {
                cursor = None;
            }
        }
        let p99 = pct(times.clone(), 0.99);
        row(
            &format!(
                "list 50 of {stored}: {who}{} p50/p99 ms",
                if query.is_empty() { String::new() } else { format!(", {query}") }
            ),
            format!("{:.2}/{:.2}", ms(pct(times, 0.5)), ms(p99)),
            "p99 ≤ 20",
            ms(p99) / 20.0,
        );
    };
    list("admin", &admin, "");
    list("member", &member, "");
    list("admin", &admin, "status=Failed");
    let server_rss = rss_of_mb(server.id());
    row(
        &format!("server resident memory with {stored} tasks stored, MB"),
        format!("{server_rss:.0}"),
        "≤ 300",
        server_rss / 300.0,
    );
    let queued = rt.block_on(store.count_by_status()).unwrap().get("Queued").copied().unwrap_or(0);
    println!(
        "    ({queued} of them queued from the create phase; the load generator's own memory is not counted)"
    );
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
