//! The advanced settings: the resource precheck, fault tolerance, the exit checkpoint, the metrics monitor,
//! image pull tolerance, and alarm subscriptions (also a user's own, through [`check_alarms`]).

use super::context::V;
use super::environment::check_env_list;
use super::formats::check_url;
use super::limits::*;
use crate::problem::{Code, Report, field, index};
use crate::spec::{AlarmEvent, AlarmSubscription, MetricsMonitor, Precheck, TrainingTask};
use std::collections::{BTreeMap, BTreeSet};

impl V<'_> {
    pub(super) fn advanced(&mut self, t: &TrainingTask) {
        let a = &t.spec.advanced;
        let base = "spec.advanced";
        if let Some(pc) = &a.precheck {
            self.precheck(pc);
        }
        if let Some(ft) = &a.fault_tolerance
            && ft.max_resubmissions > MAX_RESUBMISSIONS_MAX
        {
            self.report.error(
                field(base, "faultTolerance.maxResubmissions"),
                Code::OutOfRange,
                format!(
                    "{} is out of range; use 0 (no automatic resubmission) to {MAX_RESUBMISSIONS_MAX}",
                    ft.max_resubmissions
                ),
            );
        }
        if let Some(ec) = &a.exit_checkpoint
            && (ec.timeout_seconds == 0 || ec.timeout_seconds > EXIT_CHECKPOINT_TIMEOUT_MAX_S)
        {
            self.report.error(
                field(base, "exitCheckpoint.timeoutSeconds"),
                Code::OutOfRange,
                format!("{} is out of range; the platform waits 1 to {EXIT_CHECKPOINT_TIMEOUT_MAX_S} seconds for a checkpoint", ec.timeout_seconds),
            );
        }
        if let Some(m) = &a.metrics {
            self.metrics(&field(base, "metrics"), m);
        }
        let tol = a.image_pull_tolerance;
        if !(-1..=IMAGE_PULL_TOLERANCE_MAX).contains(&tol) {
            self.report.error(
                field(base, "imagePullTolerance"),
                Code::OutOfRange,
                format!("{tol} is out of range; use -1 (never give up), 0 (fail on the first failed pull) or up to {IMAGE_PULL_TOLERANCE_MAX} retries"),
            );
        }
        self.alarms(&field(base, "alarms"), &a.alarms);
    }

    /// The resource precheck: its env vars, its thresholds (above 0 when given) and its timeout.
    fn precheck(&mut self, pc: &Precheck) {
        let p = field("spec.advanced", "precheck");
        check_env_list(&mut self.report, &field(&p, "env"), &pc.env);
        for (name, v) in [("minGemmTflops", pc.min_gemm_tflops), ("minAllreduceGbps", pc.min_allreduce_gbps)]
        {
            if let Some(x) = v
                && x <= 0.0
            {
                self.report.error(
                    field(&p, name),
                    Code::OutOfRange,
                    format!("{x} must be above 0; leave it out to use the platform's threshold"),
                );
            }
        }
        if pc.timeout_seconds == 0 || pc.timeout_seconds > PRECHECK_TIMEOUT_MAX_S {
            self.report.error(
                field(&p, "timeoutSeconds"),
                Code::OutOfRange,
                format!("{} is out of range; use 1 to {PRECHECK_TIMEOUT_MAX_S}", pc.timeout_seconds),
            );
        }
    }

    fn metrics(&mut self, base: &str, m: &MetricsMonitor) {
        let ep = field(base, "endpoints");
        if m.enabled && m.endpoints.is_empty() && self.ok(&ep) {
            self.report.error(
                &ep,
                Code::Empty,
                "add at least one endpoint (port and path), or turn the metrics monitor off",
            );
        }
        if m.endpoints.len() > METRICS_ENDPOINTS_MAX {
            self.report.error(
                &ep,
                Code::TooLong,
                format!("has {} endpoints; at most {METRICS_ENDPOINTS_MAX}", m.endpoints.len()),
            );
        }
        let mut seen: BTreeMap<(u32, &str), usize> = BTreeMap::new();
        for (i, e) in m.endpoints.iter().enumerate() {
            let p = index(&ep, i);
            if e.port == 0 || e.port > 65535 {
                self.report.error(
                    field(&p, "port"),
                    Code::OutOfRange,
                    format!("{} is not a TCP port; use 1 to 65535", e.port),
                );
            }
            let pp = field(&p, "path");
            if !e.path.starts_with('/') {
                self.report.error(
                    &pp,
                    Code::InvalidPath,
                    format!("\"{}\" must start with /, like /metrics", e.path),
                );
            } else if e.path.chars().any(|c| c.is_whitespace() || c.is_control() || c == '#') {
                self.report.error(
                    &pp,
                    Code::InvalidPath,
                    format!("{:?} contains a space, control character or #", e.path),
                );
            } else if e.path.len() > METRICS_PATH_MAX {
                self.report.error(
                    &pp,
                    Code::TooLong,
                    format!("is {} bytes; at most {METRICS_PATH_MAX}", e.path.len()),
                );
            }
            if let Some(first) = seen.insert((e.port, &e.path), i) {
                self.report.error(
                    &p,
                    Code::Duplicate,
                    format!(
                        "port {} with path {} is already listed at {ep}[{first}]; each endpoint once",
                        e.port, e.path
                    ),
                );
            }
        }
        if !(METRICS_INTERVAL_MIN_S..=METRICS_INTERVAL_MAX_S).contains(&m.interval_seconds) {
            self.report.error(
                field(base, "intervalSeconds"),
                Code::OutOfRange,
                format!("{} is out of range; scrape every {METRICS_INTERVAL_MIN_S} to {METRICS_INTERVAL_MAX_S} seconds", m.interval_seconds),
            );
        }
    }

    fn alarms(&mut self, base: &str, alarms: &[AlarmSubscription]) {
        check_alarms(&mut self.report, base, alarms);
    }
}

/// Alarm subscriptions (a task's, or a user's own): events, webhook, the queuedTooLong threshold.
pub fn check_alarms(r: &mut Report, base: &str, alarms: &[AlarmSubscription]) {
    if alarms.len() > ALARMS_MAX {
        r.error(base, Code::TooLong, format!("has {} subscriptions; at most {ALARMS_MAX}", alarms.len()));
    }
    for (i, a) in alarms.iter().enumerate() {
        let p = index(base, i);
        let ev = field(&p, "events");
        if a.events.is_empty() {
            r.error(&ev, Code::Empty, format!("choose at least one event: {}", AlarmEvent::NAMES.join(", ")));
        }
        let mut seen = BTreeSet::new();
        for (j, e) in a.events.iter().enumerate() {
            if !seen.insert(*e) {
                r.error(index(&ev, j), Code::Duplicate, format!("\"{e}\" is listed twice; list it once"));
            }
        }
        if let Err(why) = check_url(&a.webhook) {
            r.error(field(&p, "webhook"), Code::InvalidUrl, why);
        }
        let th = field(&p, "queuedThresholdSeconds");
        match (seen.contains(&AlarmEvent::QueuedTooLong), a.queued_threshold_seconds) {
            (true, None) => r.error(
                &th,
                Code::Required,
                "say how long a task may wait in the queue before queuedTooLong fires",
            ),
            (true, Some(s)) if s < ALARM_QUEUED_THRESHOLD_MIN_S => r.error(
                &th,
                Code::OutOfRange,
                format!("{s} is too short; use at least {ALARM_QUEUED_THRESHOLD_MIN_S} seconds"),
            ),
            (false, Some(_)) => r.warning(
                &th,
                Code::Ignored,
                "only applies to the queuedTooLong event, which is not subscribed",
            ),
            _ => {}
        }
    }
}
