//! What one control-loop tick costs with a deep queue: the store is SQLite, the backend the fake one, and the
//! queue `--queued N` tasks (default 40,000) that one project group's quota cannot all admit, as after a
//! burst of submissions. It prints the first tick (which reads and parses every spec), steady ticks with
//! nothing new (the last plan stands: no scheduling cycle), and ticks that each take in a batch of new
//! arrivals (a full cycle over the whole queue), as p50/max over several ticks; then the loop under a steady
//! stream of 1,000 arrivals a second (`--rate N`), each handed over as the API hands a create (stored, then
//! pushed to the loop's arrivals), ticking back to back as the server's loop does while there is news: p50,
//! p99 and max of the ticks (target: p99 ≤ 50 ms at 40,000 queued).
//!
//! Every task is stored from one document (a sweep of one template): the best case for the loop's spec
//! sharing; tasks whose documents differ are each read and parsed once.
//!
//! Run: `cargo run --release -p trainyard-control --example tick-bench [-- --queued N]`.

// A benchmark is the shell: it times ticks on the system's clock.
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};
use trainyard_control::Control;
use trainyard_control::secrets::SecretBox;
use trainyard_core::Catalog;
use trainyard_runtime::fake::{FakeBackend, Script};
use trainyard_sched::Config;
use trainyard_store::{NewTask, Store};

/// The server binary's allocator, so the loop is measured as it runs there.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CATALOG: &str = r#"
regions: {local: {}}
clusters: {local: {region: local}}
pools: {default: {cluster: local, instanceSpecs: [cpu.small]}}
instanceSpecs: {cpu.small: {kind: CPU, vcpus: 1, memoryMib: 1024}}
nodes: {node-0: {pool: default, vcpus: 64, memoryMib: 262144}}
projectGroups: {nlp: {}}
images: {host: {}}
quotas:
  - {group: nlp, resourceType: Reserved, pool: default, spec: cpu.small, units: 32}
"#;

const TASK: &str = r#"apiVersion: trainyard.dev/v1
kind: TrainingTask
metadata: {namePrefix: bench, projectGroup: nlp}
spec:
  type: PyTorchJob
  placement: {region: local, cluster: local}
  environment: {image: host, cmd: python3 train.py}
  compute: {resourceType: Reserved, pool: default, workers: 1, instanceSpecs: [{spec: cpu.small}]}
"#;

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

fn queued(spec_json: &str, k: usize, at_ms: i64) -> NewTask {
    NewTask {
        id: format!("{k:016x}"),
        name: format!("bench-{k}"),
        owner: "alice".into(),
        project_group: "nlp".into(),
        task_type: "PyTorchJob".into(),
        status: trainyard_core::lifecycle::Status::Queued,
        public: false,
        labels: Default::default(),
        spec_json: spec_json.to_owned(),
        created_at_ms: at_ms,
        idempotency: None,
        first_event: None,
        demand: None,
    }
}

/// Where one tick's time went, in ms.
fn phases_ms(p: &trainyard_control::Phases) -> String {
    let ms = |us: u32| f64::from(us) / 1e3;
    format!(
        "observe {:.2} ms, sync {:.2}, snapshot {:.2}, schedule {:.2}, commit {:.2}, alarms {:.2}, reconcile {:.2}",
        ms(p.observe_us),
        ms(p.sync_us),
        ms(p.snapshot_us),
        ms(p.schedule_us),
        ms(p.commit_us),
        ms(p.alarms_us),
        ms(p.reconcile_us),
    )
}

fn summary(mut v: Vec<Duration>) -> String {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!("p50 {:>8.2} ms   max {:>8.2} ms   ({} ticks)", ms(v[v.len() / 2]), ms(v[v.len() - 1]), v.len())
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args
        .iter()
        .position(|a| a == "--queued")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(40_000);
    let rate: f64 = args
        .iter()
        .position(|a| a == "--rate")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(1_000.0);
    let dir = std::env::temp_dir().join(format!("trainyard-tick-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = Store::connect(&format!("sqlite://{}", dir.join("db").display())).await.unwrap();
    let spec_json = {
        let (task, _) = trainyard_core::parse(TASK.as_bytes());
        serde_json::to_string(&task.expect("the bench task parses")).unwrap()
    };
    let start = now_ms() - 60_000;
    let batch: Vec<NewTask> = (0..n).map(|k| queued(&spec_json, k, start + (k / 100) as i64)).collect();
    for chunk in batch.chunks(10_000) {
        store.import_tasks(chunk).await.unwrap();
    }
    let catalog = Catalog::from_yaml(CATALOG).unwrap();
    let backend = FakeBackend::new(Script { start_ms: 0, run_ms: 3_600_000, ..Script::default() });
    let mut control =
        Control::new(store.clone(), backend, catalog, Config::default(), SecretBox::generate().unwrap());

    println!("control-loop tick, {n} queued tasks (32 admitted by quota), SQLite, fake backend");
    let t = Instant::now();
    let first = control.tick(now_ms()).await.unwrap().phases;
    println!("first tick (reads every spec)          {:>8.2} ms", t.elapsed().as_secs_f64() * 1e3);
    println!("    {}", phases_ms(&first));
    let mut steady = Vec::new();
    let mut planned = 0;
    for _ in 0..20 {
        let t = Instant::now();
        planned += u32::from(control.tick(now_ms()).await.unwrap().planned);
        steady.push(t.elapsed());
    }
    println!("steady, nothing new                    {}, {planned} of them planned", summary(steady));
    let mut arrivals = Vec::new();
    let mut k = n;
    for _ in 0..10 {
        let at = now_ms();
        let fresh: Vec<NewTask> = (k..k + 500).map(|k| queued(&spec_json, k, at)).collect();
        k += 500;
        store.import_tasks(&fresh).await.unwrap();
        let t = Instant::now();
        assert!(control.tick(now_ms()).await.unwrap().planned, "arrivals are news");
        arrivals.push(t.elapsed());
    }
    println!("500 new arrivals before each tick      {}", summary(arrivals));
    // A steady stream: every tick takes in what arrived while the last one ran (at `rate` a second).
    let task = {
        let (task, _) = trainyard_core::parse(TASK.as_bytes());
        task.expect("the bench task parses")
    };
    let arrivals_handle = control.arrivals();
    let mut stream = Vec::new();
    let mut phases: Vec<trainyard_control::Phases> = Vec::new();
    let mut owed = 0.0;
    let mut last = Instant::now();
    let run_for = Duration::from_secs(10);
    let began = Instant::now();
    while began.elapsed() < run_for {
        owed += last.elapsed().as_secs_f64() * rate;
        last = Instant::now();
        let due = owed.floor() as usize;
        owed -= due as f64;
        let at = now_ms();
        let fresh: Vec<NewTask> = (k..k + due).map(|k| queued(&spec_json, k, at)).collect();
        k += due;
        store.import_tasks(&fresh).await.unwrap();
        // Read back in one query (the loop keeps no spec text anyway): at high rates a read per task made
        // the generator, not the loop, what the figures measured.
        let ids: Vec<&str> = fresh.iter().map(|t| t.id.as_str()).collect();
        for record in store.tasks_without_spec(&ids).await.unwrap() {
            arrivals_handle.push(&record, task.clone());
        }
        let t = Instant::now();
        let r = control.tick(now_ms()).await.unwrap();
        stream.push(t.elapsed());
        phases.push(r.phases);
    }
    let mut sorted = stream.clone();
    sorted.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{rate:.0} arrivals/s, back-to-back ticks    p50 {:>8.2} ms   p99 {:>8.2} ms   max {:>8.2} ms   ({} ticks, {} queued at the end; target p99 <= 50 ms)",
        ms(sorted[sorted.len() / 2]),
        ms(sorted[(sorted.len() * 99 / 100).min(sorted.len() - 1)]),
        ms(sorted[sorted.len() - 1]),
        sorted.len(),
        k,
    );
    let mean = |f: fn(&trainyard_control::Phases) -> u32| {
        phases.iter().map(|p| f64::from(f(p))).sum::<f64>() / phases.len() as f64 / 1e3
    };
    println!(
        "    mean per tick: observe {:.2} ms, sync {:.2}, snapshot {:.2}, schedule {:.2}, commit {:.2}, alarms {:.2}, reconcile {:.2}",
        mean(|p| p.observe_us),
        mean(|p| p.sync_us),
        mean(|p| p.snapshot_us),
        mean(|p| p.schedule_us),
        mean(|p| p.commit_us),
        mean(|p| p.alarms_us),
        mean(|p| p.reconcile_us),
    );
    // The slowest ticks (those at and above p99), phase by phase: what makes the tail.
    let mut by_time: Vec<usize> = (0..stream.len()).collect();
    by_time.sort_by_key(|&i| std::cmp::Reverse(stream[i]));
    for &i in by_time.iter().take((stream.len() / 100).max(1) + 1) {
        println!("    slow tick {:>7.2} ms: {}", ms(stream[i]), phases_ms(&phases[i]));
    }
    let info = control.queue_info(&format!("{:016x}", k - 1));
    println!("    (the last arrival waits at {:?})", info.map(|q| (q.position, q.reason)));
    let _ = std::fs::remove_dir_all(&dir);
}
