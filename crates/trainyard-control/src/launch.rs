//! Admissions committed and launched: what a backend is given to run an attempt.

use crate::active::{Entry, attempt_key};
use crate::error::CommandError;
use crate::place::Placement;
use crate::policy::Step;
use crate::report::TickReport;
use crate::{Control, secrets};
use trainyard_core::lifecycle::{Reason, Status};
use trainyard_runtime::{Backend, LaunchSpec};
use trainyard_store::{StoreError, TaskRecord};

impl<B: Backend> Control<B> {
    /// Commits this tick's admissions, each task taken to Admitted (with its placement) and on to Starting,
    /// all in one transaction, then launches them. A task changed meanwhile is left for the next tick.
    pub(crate) async fn admit(
        &mut self,
        tasks: &[&Entry],
        admits: Vec<(usize, Placement)>,
        now_ms: i64,
        report: &mut TickReport,
    ) -> Result<(), CommandError> {
        if admits.is_empty() {
            return Ok(());
        }
        let chains: Vec<(&TaskRecord, Vec<Step>)> = admits
            .iter()
            .map(|(i, placement)| {
                let t = &*tasks[*i].record;
                let json = serde_json::to_string(placement).expect("a placement always serialises");
                let nodes: Vec<&str> = placement.replicas.iter().map(|r| r.node.as_str()).collect();
                let message = if placement.unplaced_replicas() {
                    let cluster = &tasks[*i].spec().spec.placement.cluster;
                    format!(
                        "handed to cluster {cluster}, which admits and places it itself, with {}",
                        placement.spec_summary()
                    )
                } else {
                    format!("on {} with {}", nodes.join(", "), placement.spec_summary())
                };
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
                self.changed();
                continue;
            };
            self.nominated.remove(&t.id);
            // An admission makes the next plan whole (parked tasks' figures are stale: see `queue`). Not left
            // to the sync reading the new version back: a task stopped or ended before that read is seen leaving
            // as the queued task its record here still says it is, which frees nothing, and the tasks parked
            // behind the quota or room it held would stay parked.
            self.changed();
            // Committed first; a refused launch is asked again by reconciliation after a wait.
            match self.launch_spec(&t, placement).await? {
                Ok(spec) => self.send_launch(&t, &spec, now_ms).await?,
                Err(why) => self.fail_launch(&t, &why, Reason::UserError, now_ms).await?,
            }
            report.admitted += 1;
        }
        Ok(())
    }

    /// What the backend gets: the task with its hidden values opened (only backends ever see them), and the
    /// owner's TaskEnv added under every name the task does not set itself (the task's own value wins).
    ///
    /// The loop's cache holds slimmed specs, so the full one is read from the store here (once per launch).
    /// `Ok(Err(why))` when the attempt cannot be started whatever the backend does (its stored spec or one of
    /// its hidden values cannot be read): starting it again would fail the same way.
    pub(crate) async fn launch_spec(
        &self,
        t: &TaskRecord,
        placement: &Placement,
    ) -> Result<Result<LaunchSpec, String>, StoreError> {
        const SEALED: &str = "a hidden value (the task's or the owner's TaskEnv) cannot be opened: it was sealed under another server key or for another record; set it again";
        let Some(full) = self.store.get_task(&t.id).await? else {
            return Ok(Err(format!("task {} is gone from the store", t.id)));
        };
        let mut task = match Self::parse(&full) {
            Ok(task) => task,
            Err(e) => return Ok(Err(e.to_string())),
        };
        if self.secrets.open(&mut task, &t.id, &t.owner).is_err() {
            return Ok(Err(SEALED.into()));
        }
        for var in self.store.task_env(&t.owner).await? {
            if task.spec.environment.env.iter().any(|e| e.name == var.name) {
                continue;
            }
            // Only a value stored as hidden is opened, and only if it was sealed for this user and name: a
            // plain value that looks sealed (copied from the database) stays the text it is.
            let value = if var.hidden {
                let binding = secrets::Binding::TaskEnv { user: &t.owner, name: &var.name };
                match self.secrets.open_value(&var.value, &binding) {
                    Ok(v) => v,
                    Err(_) => return Ok(Err(SEALED.into())),
                }
            } else {
                var.value
            };
            task.spec.environment.env.push(trainyard_core::spec::EnvVar {
                name: var.name,
                value,
                hidden: var.hidden,
            });
        }
        // The logins of the registries its image may come from that serve this task's group and image (as
        // the catalog in force says now), opened for this launch only.
        let catalog = self.catalog.get();
        let (image, group) = (&task.spec.environment.image, &task.metadata.project_group);
        let registry_logins =
            crate::registry_logins::for_task(&self.store, &self.secrets, &catalog, image, group).await?;
        let workdir_token = (task.spec.environment.workdir.as_ref())
            .map(|_| trainyard_runtime::Token(self.secrets.workdir_token(&t.id, attempt_key(t).attempt)));
        Ok(Ok(LaunchSpec {
            key: attempt_key(t),
            task_name: t.name.clone(),
            owner: t.owner.clone(),
            task,
            replicas: placement.replicas.clone(),
            option: placement.option,
            registry_logins: std::sync::Arc::new(registry_logins),
            workdir_token,
            catalog,
        }))
    }
}
