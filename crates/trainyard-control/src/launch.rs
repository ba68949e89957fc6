//! Admissions committed and launched: what a backend is given to run an attempt.

use crate::apply::*;
use crate::place::Placement;
use crate::report::TickReport;
use crate::{Control, secrets};
use std::sync::Arc;
use trainyard_core::lifecycle::{Reason, Status};
use trainyard_runtime::{AttemptKey, Backend, LaunchSpec};
use trainyard_store::{StoreError, TaskRecord};

impl<B: Backend> Control<B> {
    /// Commits this tick's admissions, each task taken to Admitted (with its placement) and on to Starting,
    /// all in one transaction, then launches them. A task changed meanwhile is left for the next tick.
    pub(crate) async fn admit(
        &mut self,
        tasks: &[Arc<TaskRecord>],
        admits: Vec<(usize, Placement)>,
        now_ms: i64,
        report: &mut TickReport,
    ) -> Result<(), StoreError> {
        if admits.is_empty() {
            return Ok(());
        }
        let chains: Vec<(&TaskRecord, Vec<Step>)> = admits
            .iter()
            .map(|(i, placement)| {
                let t = &*tasks[*i];
                let json = serde_json::to_string(placement).expect("a placement always serialises");
                let nodes: Vec<&str> = placement.replicas.iter().map(|r| r.node.as_str()).collect();
                let message = format!("on {} with {}", nodes.join(", "), placement.spec_summary());
                let steps = vec![
                    Step::new(Status::Admitted, Reason::Admitted, message, t.attempt).placement(json),
                    Step::new(Status::Starting, Reason::Admitted, "starting replicas", t.attempt),
                ];
                (t, steps)
            })
            .collect();
        let done = self.apply_chains(&chains, now_ms).await?;
        for ((_, placement), t) in admits.iter().zip(done) {
            let Some(t) = t else {
                // Its record here is behind the store's: planned again once it is read back.
                report.conflicts += 1;
                self.dirty = true;
                continue;
            };
            self.nominated.remove(&t.id);
            // Committed first; a failed launch is retried by reconciliation on the next tick.
            match self.launch_spec(&t, placement).await {
                Some(spec) => {
                    let _ = self.backend.launch(&spec).await;
                }
                None => {
                    let why = "a hidden value (the task's or the owner's TaskEnv) cannot be opened: it was sealed under another server key or for another record; set it again";
                    self.store.append_event(&t.id, t.attempt, now_ms, "InternalError", why).await?;
                }
            }
            report.admitted += 1;
        }
        Ok(())
    }
    /// What the backend gets: the task with its hidden values opened (only backends ever see them), and the
    /// owner's TaskEnv added under every name the task does not set itself (the task's own value wins).
    ///
    /// The loop's cache holds slimmed specs, so the full one is read from the store here (once per launch).
    pub(crate) async fn launch_spec(&self, t: &TaskRecord, placement: &Placement) -> Option<LaunchSpec> {
        let full = self.store.get_task(&t.id).await.ok()??;
        let mut task = Self::parse(&full).ok()?;
        self.secrets.open(&mut task, &t.id, &t.owner).ok()?;
        for var in self.store.task_env(&t.owner).await.ok()? {
            if task.spec.environment.env.iter().any(|e| e.name == var.name) {
                continue;
            }
            // Only a value stored as hidden is opened, and only if it was sealed for this user and name: a
            // plain value that looks sealed (copied from the database) stays the text it is.
            let value = if var.hidden {
                let binding = secrets::Binding::TaskEnv { user: &t.owner, name: &var.name };
                self.secrets.open_value(&var.value, &binding).ok()?
            } else {
                var.value
            };
            task.spec.environment.env.push(trainyard_core::spec::EnvVar {
                name: var.name,
                value,
                hidden: var.hidden,
            });
        }
        Some(LaunchSpec {
            key: AttemptKey { task_id: t.id.clone(), attempt: t.attempt },
            task_name: t.name.clone(),
            owner: t.owner.clone(),
            task,
            replicas: placement.replicas.clone(),
            catalog: self.catalog.get(),
        })
    }
}
