//! The server's own figures (requests by route and status, their latency, control-loop ticks, admissions,
//! preemptions, queue depth), rendered in Prometheus text format for `/metrics`.

use std::collections::BTreeMap;
use std::time::Duration;

/// The server's own figures, served in Prometheus text format at `/metrics`.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: std::sync::Mutex<MetricsInner>,
}

#[derive(Debug, Default)]
struct MetricsInner {
    /// method -> route -> status -> count (nested, so a request already counted is looked up without
    /// allocating its key)
    requests: BTreeMap<String, BTreeMap<String, BTreeMap<u16, u64>>>,
    /// Request durations: counts per bucket upper bound (seconds), then sum and count.
    duration_buckets: [u64; LATENCY_BUCKETS.len()],
    duration_sum_s: f64,
    duration_count: u64,
    ticks: u64,
    tick_sum_s: f64,
    admitted: u64,
    preempted: u64,
    queued: u64,
    /// Working-directory files taken in, and their bytes.
    workdir_files: u64,
    workdir_bytes: u64,
    workdir_sent_bytes: u64,
}

const LATENCY_BUCKETS: [f64; 10] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, MetricsInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn request(&self, method: &str, route: &str, status: u16, took: Duration) {
        let mut m = self.lock();
        if !m.requests.contains_key(method) {
            m.requests.insert(method.to_owned(), BTreeMap::new());
        }
        let routes = m.requests.get_mut(method).expect("inserted above");
        if !routes.contains_key(route) {
            routes.insert(route.to_owned(), BTreeMap::new());
        }
        *routes.get_mut(route).expect("inserted above").entry(status).or_default() += 1;
        let s = took.as_secs_f64();
        for (i, b) in LATENCY_BUCKETS.iter().enumerate() {
            if s <= *b {
                m.duration_buckets[i] += 1;
            }
        }
        m.duration_sum_s += s;
        m.duration_count += 1;
    }

    /// Records working-directory files taken in.
    pub(crate) fn workdir_files(&self, files: u64, bytes: u64) {
        let mut m = self.lock();
        m.workdir_files += files;
        m.workdir_bytes += bytes;
    }

    /// Records working-directory files sent (to a replica's fetch, or a member's).
    pub(crate) fn workdir_sent(&self, bytes: u64) {
        self.lock().workdir_sent_bytes += bytes;
    }

    /// Records one control-loop tick.
    pub fn tick(&self, report: &trainyard_control::TickReport, took: Duration) {
        let mut m = self.lock();
        m.ticks += 1;
        m.tick_sum_s += took.as_secs_f64();
        m.admitted += u64::from(report.admitted);
        m.preempted += u64::from(report.preempted);
        m.queued = u64::from(report.waiting);
    }

    pub(crate) fn render(
        &self,
        by_status: &BTreeMap<String, i64>,
        election: &crate::leader::Election,
    ) -> String {
        use std::fmt::Write as _;
        let m = self.lock();
        let mut out = String::new();
        let (won, lost) = election.terms();
        let _ = writeln!(
            out,
            "# HELP trainyard_leader Whether this server leads (runs the control loop, the scheduler and the backend).\n# TYPE trainyard_leader gauge\ntrainyard_leader {}",
            u8::from(election.leading().is_some())
        );
        let _ = writeln!(
            out,
            "# HELP trainyard_leader_terms_won_total Terms as leader this server began (a failover to it, or its first).\n# TYPE trainyard_leader_terms_won_total counter\ntrainyard_leader_terms_won_total {won}"
        );
        let _ = writeln!(
            out,
            "# HELP trainyard_leader_terms_lost_total Terms as leader this server lost (the lease not renewed in time, or taken by another).\n# TYPE trainyard_leader_terms_lost_total counter\ntrainyard_leader_terms_lost_total {lost}"
        );
        let _ = writeln!(
            out,
            "# HELP trainyard_tasks Tasks by status (deleted ones excluded).\n# TYPE trainyard_tasks gauge"
        );
        for (status, n) in by_status {
            let _ = writeln!(out, "trainyard_tasks{{status=\"{status}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP trainyard_queue_depth Tasks waiting in the queue at the last tick.\n# TYPE trainyard_queue_depth gauge\ntrainyard_queue_depth {}",
            m.queued
        );
        let _ = writeln!(
            out,
            "# HELP trainyard_admissions_total Attempts admitted.\n# TYPE trainyard_admissions_total counter\ntrainyard_admissions_total {}",
            m.admitted
        );
        let _ = writeln!(
            out,
            "# HELP trainyard_preemptions_total Attempts preempted.\n# TYPE trainyard_preemptions_total counter\ntrainyard_preemptions_total {}",
            m.preempted
        );
        let _ = writeln!(
            out,
            "# HELP trainyard_workdir_received_files_total Working-directory files taken in (new to their group).\n# TYPE trainyard_workdir_received_files_total counter\ntrainyard_workdir_received_files_total {}",
            m.workdir_files
        );
        let _ = writeln!(
            out,
            "# HELP trainyard_workdir_received_bytes_total Bytes of the working-directory files taken in.\n# TYPE trainyard_workdir_received_bytes_total counter\ntrainyard_workdir_received_bytes_total {}",
            m.workdir_bytes
        );
        let _ = writeln!(
            out,
            "# HELP trainyard_workdir_sent_bytes_total Bytes of working-directory files sent to fetches.\n# TYPE trainyard_workdir_sent_bytes_total counter\ntrainyard_workdir_sent_bytes_total {}",
            m.workdir_sent_bytes
        );
        let _ = writeln!(
            out,
            "# HELP trainyard_control_tick_seconds Time spent in control-loop ticks.\n# TYPE trainyard_control_tick_seconds summary\ntrainyard_control_tick_seconds_sum {}\ntrainyard_control_tick_seconds_count {}",
            m.tick_sum_s, m.ticks
        );
        let _ = writeln!(
            out,
            "# HELP trainyard_api_requests_total API requests by route and status.\n# TYPE trainyard_api_requests_total counter"
        );
        let counts = m.requests.iter().flat_map(|(method, routes)| {
            routes
                .iter()
                .flat_map(move |(route, by)| by.iter().map(move |(status, n)| (method, route, status, n)))
        });
        for (method, route, status, n) in counts {
            let _ = writeln!(
                out,
                "trainyard_api_requests_total{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP trainyard_api_request_duration_seconds API request latency.\n# TYPE trainyard_api_request_duration_seconds histogram"
        );
        for (b, n) in LATENCY_BUCKETS.iter().zip(m.duration_buckets) {
            let _ = writeln!(out, "trainyard_api_request_duration_seconds_bucket{{le=\"{b}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "trainyard_api_request_duration_seconds_bucket{{le=\"+Inf\"}} {}",
            m.duration_count
        );
        let _ = writeln!(
            out,
            "trainyard_api_request_duration_seconds_sum {}\ntrainyard_api_request_duration_seconds_count {}",
            m.duration_sum_s, m.duration_count
        );
        out
    }
}
