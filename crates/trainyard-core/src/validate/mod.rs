//! Every rule a task must follow, as one pure function from (task, catalog) to a [`Report`] holding all
//! problems at once. Each rule has a field path, a stable [`Code`](crate::Code) and a message that says what
//! to change.
//!
//! Checks that depend on another field (the task type, the cluster, the pool) are skipped when that field
//! could not be decoded, so one typo yields one problem.
//!
//! The rules live by the part of the task they read: `metadata` (the header, name prefix, project group and
//! labels), `references` (what the task names in the catalog: region, cluster, pool, image, volumes,
//! datasets, models), `environment` (env vars and the command) and `mounts` (mount paths and their
//! conflicts), `compute` (workers, priority, capacity and instance specs), `advanced`, and the rules of each
//! task type (`task_type`, with RayJob's settings in `ray`). `context` is the state they share, `formats`
//! the shapes of strings (label keys and values, image references, URLs), and [`limits`] names every bound.
//! [`validate_tainted`] runs the groups one after the other: its order is the order of problems in a report.

mod admission;
mod advanced;
mod compute;
mod context;
mod environment;
mod formats;
pub mod limits;
mod metadata;
mod mounts;
mod ray;
mod references;
mod task_type;

use crate::catalog::Catalog;
use crate::problem::{Report, is_under};
use crate::spec::TrainingTask;
use context::V;
use std::collections::BTreeSet;

pub use crate::grammar::check_env_name;
pub use advanced::check_alarms;
pub use environment::{check_env_list, is_mask};
pub use formats::{check_image_reference, check_label_key, check_label_value, check_url};
pub use metadata::check_name_prefix;
pub use mounts::{
    PLATFORM_ROOT_PATHS, PROTECTED_PATHS, RAY_SHARED_PATH, RECOMMENDED_MOUNT_ROOTS, check_mount_path,
};

/// Variables the platform injects; a task may not set them (the one list is [`crate::platform_env`]).
pub use crate::platform_env::{RESERVED as RESERVED_ENV, RESERVED_PREFIX as RESERVED_ENV_PREFIX};

/// Validates a decoded task against a catalog.
pub fn validate(task: &TrainingTask, catalog: &Catalog) -> Report {
    validate_tainted(task, catalog, &BTreeSet::new())
}

/// Validates, skipping problems at or under paths that failed to decode (they were reported already).
pub fn validate_tainted(task: &TrainingTask, catalog: &Catalog, tainted: &BTreeSet<String>) -> Report {
    validate_for(task, catalog, tainted, None)
}

/// Validates for a reader: `audience` is the project groups of a member (None: an admin). The verdict is the
/// same whoever asks; the names a message offers as choices are those the reader's view of the catalog
/// holds ([`Catalog::seen_by`]), so that no member learns another group's images, volumes, datasets, models
/// or groups from an error.
pub fn validate_for(
    task: &TrainingTask,
    catalog: &Catalog,
    tainted: &BTreeSet<String>,
    audience: Option<&[String]>,
) -> Report {
    let mut v = V { cat: catalog, tainted, report: Report::default(), audience, seen: Default::default() };
    v.header(task);
    v.metadata(task);
    let place = v.placement(task);
    v.environment(task, &place);
    v.compute(task, &place);
    v.advanced(task);
    v.type_specific(task, &place);
    v.admission(task, &place);
    let V { mut report, tainted, .. } = v;
    report.problems.retain(|p| !tainted.iter().any(|t| is_under(&p.path, t)));
    report
}
