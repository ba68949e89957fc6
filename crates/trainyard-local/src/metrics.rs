//! The metrics monitor, inside each replica's supervisor (so it outlives server restarts): every interval it
//! records the preset resource metrics of the replica's processes (CPU cores in use, resident memory, and GPU
//! utilisation and memory when it has GPUs) and scrapes the task's configured endpoints in the Prometheus
//! text format. Samples go to `metrics.jsonl` in the replica dir, one [`Point`] per line.

use super::procs;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use trainyard_runtime::metrics::*;

/// What a replica's monitor watches.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MonitorJob {
    /// (port, path) on the replica, scraped over loopback.
    pub endpoints: Vec<(u16, String)>,
    pub interval_s: u64,
    /// GPU indices of the machine the replica holds.
    pub gpus: Vec<u32>,
}

/// CPU seconds (user + system) and resident bytes of a process.
fn usage(pid: u32) -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3, utime 14, stime 15, rss 24 (1-based in proc(5)).
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    let rss_pages: u64 = f.get(21)?.parse().ok()?;
    Some((ticks / 100.0, rss_pages * 4096))
}

fn gpu_points(gpus: &[u32], t: u64, out: &mut Vec<Point>) {
    if gpus.is_empty() {
        return;
    }
    let ids: Vec<String> = gpus.iter().map(u32::to_string).collect();
    let mut c = std::process::Command::new("nvidia-smi");
    c.args([
        "--query-gpu=index,utilization.gpu,memory.used",
        "--format=csv,noheader,nounits",
        "-i",
        &ids.join(","),
    ])
    .env_clear()
    .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::null());
    let Ok(o) = super::spawn::spawn_helper(&mut c) else {
        return;
    };
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if let [index, util, mem] = f[..] {
            let l = BTreeMap::from([("gpu".to_owned(), index.to_owned())]);
            if let Ok(v) = util.parse() {
                out.push(Point { t, n: "trainyard_gpu_utilization_percent".into(), l: l.clone(), v });
            }
            if let Ok(v) = mem.parse() {
                out.push(Point { t, n: "trainyard_gpu_memory_used_mib".into(), l, v });
            }
        }
    }
}

/// Runs until `stop`: samples every `interval_s` (at least 1 s) into `dir/metrics.jsonl`.
pub fn monitor(dir: &Path, job: &MonitorJob, sandbox: &Arc<AtomicU32>, stop: &Arc<AtomicBool>) {
    let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("metrics.jsonl"))
    else {
        return;
    };
    let interval = Duration::from_secs(job.interval_s.max(1));
    let mut last_cpu: Option<(Instant, f64)> = None;
    let mut next = Instant::now() + Duration::from_millis(500);
    // The sandbox whose network namespace this thread is in: custom metrics are served on its loopback.
    let mut entered = 0u32;
    while !stop.load(Ordering::Relaxed) {
        if Instant::now() < next {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        next += interval;
        let t = super::clock::now_ms();
        let mut points = Vec::new();
        let pid = sandbox.load(Ordering::Relaxed);
        if pid != 0 {
            let (mut cpu, mut rss) = (0.0, 0u64);
            for (p, inner) in procs::sandbox_processes(pid) {
                if inner == 1 {
                    continue;
                }
                if let Some((c, r)) = usage(p) {
                    cpu += c;
                    rss += r;
                }
            }
            let now = Instant::now();
            if let Some((then, before)) = last_cpu {
                let cores = ((cpu - before) / now.duration_since(then).as_secs_f64()).max(0.0);
                points.push(Point { t, n: "trainyard_cpu_cores".into(), l: BTreeMap::new(), v: cores });
            }
            last_cpu = Some((now, cpu));
            points.push(Point {
                t,
                n: "trainyard_memory_rss_bytes".into(),
                l: BTreeMap::new(),
                v: rss as f64,
            });
        }
        gpu_points(&job.gpus, t, &mut points);
        if pid != 0 && pid != entered && !job.endpoints.is_empty() {
            let init = procs::sandbox_processes(pid).first().map(|&(p, _)| p);
            if init.and_then(|p| procs::enter_netns_of(p).ok()).is_some() {
                entered = pid;
            }
        }
        for (port, path) in &job.endpoints {
            scraped(t, *port, path, http_get(*port, path).ok().as_deref(), &mut points);
        }
        append(&mut file, &points);
    }
}
