//! A RayJob's Ray settings: the head's instance spec, the runtime env, shared storage, how long a finished
//! cluster is kept for debugging, and autoscaling.

use super::context::{Place, V, names};
use super::limits::*;
use crate::problem::{Code, field};
use crate::runtime_env;
use crate::spec::{Autoscaling, RaySettings, SharedStorage, TrainingTask};

impl V<'_> {
    pub(super) fn ray(&mut self, t: &TrainingTask, r: &RaySettings, place: &Place) {
        let base = "spec.ray";
        if let Some(h) = &r.head.instance_spec {
            self.instance_spec("spec.ray.head.instanceSpec", h, place);
        }
        if let Some(text) = &r.runtime_env_yaml {
            runtime_env::check(&mut self.report, &field(base, "runtimeEnvYaml"), text);
        }
        if let Some(ss) = &r.shared_storage {
            self.shared_storage(ss, place);
        }
        if let Some(d) = &r.debug
            && (d.retention_seconds == 0 || d.retention_seconds > RAY_RETENTION_MAX_S)
        {
            self.report.error(
                "spec.ray.debug.retentionSeconds",
                Code::OutOfRange,
                format!(
                    "{} is out of range; keep the cluster 1 to {RAY_RETENTION_MAX_S} seconds",
                    d.retention_seconds
                ),
            );
        }
        if let Some(a) = &r.autoscaling {
            self.autoscaling(t, a);
        }
    }

    /// The volume Ray's shared storage is on: it must exist, be offered, and take writes from many replicas.
    fn shared_storage(&mut self, ss: &SharedStorage, place: &Place) {
        let p = "spec.ray.sharedStorage.volume";
        let entry = self.cat.volumes.get(&ss.volume);
        let known = names(self.shown().volumes.keys());
        if self.reference(p, "volume", &ss.volume, entry.is_some(), known) {
            self.offered(p, "volume", &ss.volume, entry, place);
            if entry.is_some_and(|v| !v.multi_pod_read_write) {
                let ok: Vec<&String> =
                    self.cat.volumes.iter().filter(|(_, v)| v.multi_pod_read_write).map(|(n, _)| n).collect();
                self.report.error(
                    p,
                    Code::Incompatible,
                    format!(
                        "volume \"{}\" cannot be written by several replicas at once, which shared storage needs; choose one of: {}",
                        ss.volume,
                        names(ok.into_iter())
                    ),
                );
            }
        }
    }

    /// The autoscaling range: within bounds, min at most max, the starting workers inside it.
    fn autoscaling(&mut self, t: &TrainingTask, a: &Autoscaling) {
        let p = "spec.ray.autoscaling";
        let workers = t.spec.compute.workers;
        if a.max_workers == 0 || a.max_workers > WORKERS_MAX {
            self.report.error(
                field(p, "maxWorkers"),
                Code::OutOfRange,
                format!("{} is out of range; use 1 to {WORKERS_MAX}", a.max_workers),
            );
        }
        if a.min_workers > a.max_workers {
            self.report.error(
                field(p, "minWorkers"),
                Code::Conflict,
                format!(
                    "{} is above maxWorkers {}; the minimum cannot exceed the maximum",
                    a.min_workers, a.max_workers
                ),
            );
        } else if a.enabled
            && self.ok("spec.compute.workers")
            && !(a.min_workers..=a.max_workers).contains(&workers)
        {
            self.report.error(
                "spec.compute.workers",
                Code::Conflict,
                format!(
                    "{workers} workers is outside the autoscaling range {}..{}; start within it",
                    a.min_workers, a.max_workers
                ),
            );
        }
        if a.idle_timeout_seconds == 0 || a.idle_timeout_seconds > RAY_IDLE_TIMEOUT_MAX_S {
            self.report.error(
                field(p, "idleTimeoutSeconds"),
                Code::OutOfRange,
                format!("{} is out of range; use 1 to {RAY_IDLE_TIMEOUT_MAX_S}", a.idle_timeout_seconds),
            );
        }
    }
}
