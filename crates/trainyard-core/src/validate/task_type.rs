//! The rules of each task type: settings that belong to the other type, and a PyTorchJob's processes per
//! replica. A RayJob's own settings are checked in `ray`.

use super::context::{Place, V};
use super::limits::*;
use crate::catalog::InstanceKind;
use crate::problem::Code;
use crate::spec::{TaskType, TrainingTask};

impl V<'_> {
    pub(super) fn type_specific(&mut self, t: &TrainingTask, place: &Place) {
        let Some(tt) = place.task_type else { return };
        let s = &t.spec;
        let a = &s.advanced;
        match tt {
            TaskType::PyTorchJob => {
                if s.ray.is_some() {
                    self.report.error(
                        "spec.ray",
                        Code::NotSupported,
                        "Ray settings apply to RayJob only; remove them or change spec.type to RayJob",
                    );
                }
                if let Some(n) = s.pytorch.as_ref().and_then(|p| p.procs_per_node) {
                    self.procs_per_node(t, n);
                }
            }
            TaskType::RayJob => {
                if s.pytorch.is_some() {
                    self.report.error(
                        "spec.pytorch",
                        Code::NotSupported,
                        "PyTorch settings apply to PyTorchJob only; remove them",
                    );
                }
                if a.precheck.is_some() {
                    self.report.error(
                        "spec.advanced.precheck",
                        Code::NotSupported,
                        "the resource precheck runs for PyTorchJob only; remove it",
                    );
                }
                if a.exit_checkpoint.is_some() {
                    self.report.error(
                        "spec.advanced.exitCheckpoint",
                        Code::NotSupported,
                        "exit checkpoint notification is for PyTorchJob only; save Ray checkpoints to shared storage instead",
                    );
                }
                if let Some(r) = &s.ray {
                    self.ray(t, r, place);
                }
            }
        }
    }

    fn procs_per_node(&mut self, t: &TrainingTask, n: u32) {
        let path = "spec.pytorch.procsPerNode";
        if n == 0 || n > PROCS_PER_NODE_MAX {
            self.report.error(
                path,
                Code::OutOfRange,
                format!("{n} is out of range; use 1 to {PROCS_PER_NODE_MAX}"),
            );
            return;
        }
        for choice in &t.spec.compute.instance_specs {
            if let Some(spec) = self.cat.instance_specs.get(&choice.spec) {
                let gpus = spec.gpus.saturating_mul(choice.count_per_node);
                if spec.kind == InstanceKind::Gpu && n > gpus {
                    self.report.warning(
                        path,
                        Code::Conflict,
                        format!("{n} processes per replica but \"{}\" × {} gives {gpus} GPUs; processes would share GPUs", choice.spec, choice.count_per_node),
                    );
                    return;
                }
            }
        }
    }
}
