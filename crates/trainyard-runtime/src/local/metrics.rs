//! The metrics monitor, inside each replica's supervisor (so it outlives server restarts): every interval it
//! records the preset resource metrics of the replica's processes (CPU cores in use, resident memory, and GPU
//! utilisation and memory when it has GPUs) and scrapes the task's configured endpoints in the Prometheus
//! text format. Samples go to `metrics.jsonl` in the replica dir, one [`Point`] per line.

use super::procs;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// One sample as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Unix time, ms.
    pub t: u64,
    /// Metric name; preset ones start with `trainyard_`.
    pub n: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub l: BTreeMap<String, String>,
    pub v: f64,
}

/// What a replica's monitor watches.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MonitorJob {
    /// (port, path) on the replica, scraped over loopback.
    pub endpoints: Vec<(u16, String)>,
    pub interval_s: u64,
    /// GPU indices of the machine the replica holds.
    pub gpus: Vec<u32>,
}

/// Most bytes read from one endpoint.
const MAX_PAGE: u64 = 4 << 20;

/// The most samples kept from one scrape of one endpoint (a task can expose as many series as it likes).
pub const MAX_SAMPLES_PER_SCRAPE: usize = 2_000;

/// The most a replica's `metrics.jsonl` may hold on the host's disk; past it, no more points are kept.
pub const MAX_METRICS_FILE_BYTES: u64 = 64 << 20;

/// `GET http://127.0.0.1:PORT/PATH` with short timeouts; the body on a 200.
pub fn http_get(port: u16, path: &str) -> Result<String, String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s =
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(2))).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(Duration::from_secs(2))).map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nAccept: text/plain\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.take(MAX_PAGE).read_to_end(&mut buf).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no HTTP response")?;
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        return Err(format!("HTTP status {status}"));
    }
    Ok(body.to_owned())
}

/// One scrape of an endpoint as samples: the page's (finite ones, at most [`MAX_SAMPLES_PER_SCRAPE`]) when it
/// answered (`page`), and `trainyard_scrape_up` 1 or 0 for the endpoint either way.
pub fn scraped(t: u64, port: u16, path: &str, page: Option<&str>, out: &mut Vec<Point>) {
    if let Some(body) = page {
        let page = trainyard_core::promtext::parse(body);
        out.extend(
            page.samples
                .into_iter()
                .filter(|s| s.value.is_finite())
                .take(MAX_SAMPLES_PER_SCRAPE)
                .map(|s| Point { t, n: s.name, l: s.labels, v: s.value }),
        );
    }
    let l = BTreeMap::from([("endpoint".to_owned(), format!(":{port}{path}"))]);
    out.push(Point { t, n: "trainyard_scrape_up".into(), l, v: if page.is_some() { 1.0 } else { 0.0 } });
}

/// Appends samples to a metrics file, one JSON line each, unless that would take it past
/// [`MAX_METRICS_FILE_BYTES`] (the file is on the host's disk and the task decides how much it exposes).
pub fn append(file: &mut std::fs::File, points: &[Point]) {
    let mut buf = Vec::new();
    for p in points {
        if serde_json::to_writer(&mut buf, p).is_ok() {
            buf.push(b'\n');
        }
    }
    let kept = file.metadata().map_or(0, |m| m.len());
    if kept + buf.len() as u64 <= MAX_METRICS_FILE_BYTES {
        let _ = file.write_all(&buf);
    }
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
