//! The task's environment: its image (a catalog reference, checked in `references`), its env vars, its
//! mounts (`references` for what, `mounts` for where) and its command.

use super::context::{Place, V};
use super::limits::*;
use crate::grammar::check_env_name;
use crate::problem::{Code, Report, field, index};
use crate::spec::{EnvVar, HIDDEN_VALUE_MASK, TaskType, TrainingTask};
use std::collections::BTreeMap;

impl V<'_> {
    /// The image, env vars, mounts and command, in that order.
    pub(super) fn environment(&mut self, t: &TrainingTask, place: &Place) {
        let e = &t.spec.environment;
        self.image(t, place);
        check_env_list(&mut self.report, "spec.environment.env", &e.env);
        let mounts = self.mount_sources(t, place);
        self.mounts(t, place, &mounts);
        self.command(t, place);
        self.workdir(t);
    }

    /// The working directory's id, as an upload answers it: 64 lowercase hex digits (whether the group holds
    /// it is the server's to say).
    fn workdir(&mut self, t: &TrainingTask) {
        let Some(w) = &t.spec.environment.workdir else { return };
        if w.len() != 64 || !w.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            self.report.error(
                "spec.environment.workdir",
                Code::InvalidValue,
                "is not a working directory's id (64 lowercase hex digits); `trainyard submit --workdir DIR` \
                 uploads DIR and sets it",
            );
        }
    }

    /// The command: present, without NUL, and short enough to pass as an argument.
    fn command(&mut self, t: &TrainingTask, place: &Place) {
        let e = &t.spec.environment;
        let cmd = "spec.environment.cmd";
        if e.cmd.trim().is_empty() {
            let example = match place.task_type {
                Some(TaskType::RayJob) => "python main.py",
                _ => "torchrun --nnodes \"$WORLD_SIZE\" --node_rank \"$RANK\" train.py",
            };
            self.report.error(cmd, Code::Empty, format!("give the command to run, for example `{example}`"));
        } else if e.cmd.contains('\0') {
            self.report.error(cmd, Code::InvalidValue, "contains a NUL character; remove it");
        } else if e.cmd.len() > CMD_MAX_BYTES {
            self.report.error(
                cmd,
                Code::TooLong,
                format!(
                    "is {} bytes; keep it under {CMD_MAX_BYTES} and move long scripts to a file on a volume",
                    e.cmd.len()
                ),
            );
        }
    }
}

/// Whether a value is a mask (only asterisks), as the API and the console show hidden values.
pub fn is_mask(value: &str) -> bool {
    !value.is_empty() && value.bytes().all(|b| b == b'*')
}

/// A list of env vars: every name and value, duplicates, and names the platform reserves.
pub fn check_env_list(r: &mut Report, base: &str, vars: &[EnvVar]) {
    if vars.len() > ENV_VARS_MAX {
        r.error(base, Code::TooLong, format!("has {} variables; at most {ENV_VARS_MAX}", vars.len()));
    }
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, v) in vars.iter().enumerate() {
        let p = index(base, i);
        let np = field(&p, "name");
        match check_env_name(&v.name) {
            Err(why) => r.error(&np, Code::InvalidName, why),
            Ok(()) => {
                if let Some(first) = seen.insert(&v.name, i) {
                    r.error(
                        &np,
                        Code::Duplicate,
                        format!("{} is already set at {base}[{first}]; set each variable once", v.name),
                    );
                } else if crate::platform_env::is_reserved(&v.name) {
                    r.error(
                        &np,
                        Code::ReservedName,
                        format!("{} is set by the platform; choose another name", v.name),
                    );
                }
            }
        }
        let vp = field(&p, "value");
        if v.hidden && is_mask(&v.value) {
            r.error(
                &vp,
                Code::MaskedValue,
                format!(
                    "is the mask {HIDDEN_VALUE_MASK} that stands in for a hidden value, not the value itself: copies of a task never carry hidden values; enter the value of {} again",
                    v.name
                ),
            );
        } else if v.value.is_empty() {
            r.error(&vp, Code::Empty, "is empty; give a value (\"0\" is fine) or remove the variable");
        } else if v.value.contains('\0') {
            r.error(
                &vp,
                Code::InvalidEnvValue,
                "contains a NUL character, which environment values cannot hold",
            );
        } else if v.value.len() > ENV_VALUE_MAX_BYTES {
            r.error(
                &vp,
                Code::TooLong,
                format!("is {} bytes; the limit for one variable is {ENV_VALUE_MAX_BYTES}; put large values in a file on a volume", v.value.len()),
            );
        }
    }
}
