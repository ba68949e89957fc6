//! Every rule a task must follow, as one pure function from (task, catalog) to a [`Report`] holding all
//! problems at once. Each rule has a field path, a stable [`Code`] and a message that says what to change.
//!
//! Checks that depend on another field (the task type, the cluster, the pool) are skipped when that field
//! could not be decoded, so one typo yields one problem.

use crate::catalog::{Catalog, ClusterScoped, InstanceKind, InstanceSpec};
use crate::demand::Resources;
pub use crate::grammar::check_env_name;
use crate::grammar::describe_bad_chars;
use crate::problem::{Code, Report, field, index, is_under, key};
use crate::runtime_env;
use crate::spec::{
    API_VERSION, AlarmEvent, EnvVar, HIDDEN_VALUE_MASK, InstanceSpecChoice, KIND, ResourceType, TaskType,
    TrainingTask,
};
use std::collections::{BTreeMap, BTreeSet};

/// Limits. Named so the docs, the console and the tests use the same figures.
pub mod limits {
    /// The final name is `prefix-xxxxx` and must fit a DNS-1123 label (63 characters).
    pub const NAME_SUFFIX_LEN: usize = 6;
    pub const DNS_LABEL_MAX: usize = 63;
    pub const NAME_PREFIX_MAX: usize = DNS_LABEL_MAX - NAME_SUFFIX_LEN;
    pub const LABELS_MAX: usize = 64;
    pub const LABEL_NAME_MAX: usize = 63;
    pub const LABEL_PREFIX_MAX: usize = 253;
    pub const DESCRIPTION_MAX: usize = 2048;
    pub const ENV_VARS_MAX: usize = 512;
    /// Linux refuses a single environment string longer than this (MAX_ARG_STRLEN).
    pub const ENV_VALUE_MAX_BYTES: usize = 128 * 1024 - 1;
    pub const MOUNTS_MAX: usize = 64;
    pub const MOUNT_PATH_MAX: usize = 1024;
    pub const CMD_MAX_BYTES: usize = 64 * 1024;
    pub const WORKERS_MAX: u32 = 4095;
    pub const INSTANCE_SPECS_MAX: usize = 8;
    pub const COUNT_PER_NODE_MAX: u32 = 64;
    pub const PRIORITY_MIN: u32 = 1;
    pub const PRIORITY_MAX: u32 = 10;
    pub const PRECHECK_TIMEOUT_MAX_S: u32 = 3600;
    pub const MAX_RESUBMISSIONS_MAX: u32 = 100;
    /// The reference page caps the exit checkpoint wait at 600 seconds.
    pub const EXIT_CHECKPOINT_TIMEOUT_MAX_S: u32 = 600;
    pub const METRICS_ENDPOINTS_MAX: usize = 16;
    pub const METRICS_PATH_MAX: usize = 256;
    pub const METRICS_INTERVAL_MIN_S: u32 = 5;
    pub const METRICS_INTERVAL_MAX_S: u32 = 3600;
    pub const IMAGE_PULL_TOLERANCE_MAX: i64 = 100;
    pub const ALARMS_MAX: usize = 16;
    pub const ALARM_QUEUED_THRESHOLD_MIN_S: u32 = 60;
    pub const URL_MAX: usize = 2048;
    pub const PROCS_PER_NODE_MAX: u32 = 256;
    pub const RAY_RETENTION_MAX_S: u32 = 86_400;
    pub const RAY_IDLE_TIMEOUT_MAX_S: u32 = 86_400;
    pub const IMAGE_REF_MAX: usize = 512;
}
use limits::*;

/// Directories of the image (or of the platform) that a mount must not cover.
pub const PROTECTED_PATHS: &[&str] = &[
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/opt",
    "/proc",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
    "/var",
    "/workspace",
];
/// Files the platform writes under `/root` for passwordless SSH.
pub const PLATFORM_ROOT_PATHS: &[&str] =
    &["/root", "/root/.ssh", "/root/hostfile", "/root/hostfile.hostname"];
/// Where mounts belong.
pub const RECOMMENDED_MOUNT_ROOTS: &[&str] = &["/volume", "/mnt"];
/// Ray's shared storage mount point.
pub const RAY_SHARED_PATH: &str = "/tmp/ray";

/// Variables the platform injects; a task may not set them (the one list is [`crate::platform_env`]).
pub use crate::platform_env::{RESERVED as RESERVED_ENV, RESERVED_PREFIX as RESERVED_ENV_PREFIX};

/// Validates a decoded task against a catalog.
pub fn validate(task: &TrainingTask, catalog: &Catalog) -> Report {
    validate_tainted(task, catalog, &BTreeSet::new())
}

/// Validates, skipping problems at or under paths that failed to decode (they were reported already).
pub fn validate_tainted(task: &TrainingTask, catalog: &Catalog, tainted: &BTreeSet<String>) -> Report {
    let mut v = V { cat: catalog, tainted, report: Report::default() };
    v.header(task);
    v.metadata(task);
    let place = v.placement(task);
    v.environment(task, &place);
    v.compute(task, &place);
    v.advanced(task);
    v.type_specific(task, &place);
    let V { mut report, tainted, .. } = v;
    report.problems.retain(|p| !tainted.iter().any(|t| is_under(&p.path, t)));
    report
}

/// What is known about where the task runs, for the checks that depend on it. `None` when the field is
/// missing, tainted or wrong (its own problem is reported once).
struct Place<'a> {
    task_type: Option<TaskType>,
    cluster: Option<&'a str>,
    pool: Option<&'a str>,
    /// The task's project group, when it is one the catalog knows.
    group: Option<&'a str>,
}

struct V<'a> {
    cat: &'a Catalog,
    tainted: &'a BTreeSet<String>,
    report: Report,
}

impl<'a> V<'a> {
    fn ok(&self, path: &str) -> bool {
        !self.tainted.iter().any(|t| is_under(path, t))
    }

    fn header(&mut self, t: &TrainingTask) {
        if t.api_version != API_VERSION {
            self.report.error(
                "apiVersion",
                Code::InvalidValue,
                format!("\"{}\" is not supported; use \"{API_VERSION}\"", t.api_version),
            );
        }
        if t.kind != KIND {
            self.report.error(
                "kind",
                Code::InvalidValue,
                format!("\"{}\" is not supported; use \"{KIND}\"", t.kind),
            );
        }
    }

    fn metadata(&mut self, t: &TrainingTask) {
        let m = &t.metadata;
        check_name_prefix(&mut self.report, "metadata.namePrefix", &m.name_prefix);
        if m.project_group.is_empty() {
            self.report.error(
                "metadata.projectGroup",
                Code::Empty,
                "choose the project group the task belongs to",
            );
        } else if !self.cat.project_groups.contains_key(&m.project_group) {
            let known = names(self.cat.project_groups.keys());
            self.report.error(
                "metadata.projectGroup",
                Code::NotFound,
                format!("project group \"{}\" does not exist; known groups: {known}", m.project_group),
            );
        }
        if let Some(d) = &m.description
            && d.chars().count() > DESCRIPTION_MAX
        {
            self.report.error(
                "metadata.description",
                Code::TooLong,
                format!("is {} characters; shorten it to {DESCRIPTION_MAX}", d.chars().count()),
            );
        }
        self.labels(&m.labels);
    }

    fn labels(&mut self, labels: &BTreeMap<String, String>) {
        let base = "metadata.labels";
        if labels.len() > LABELS_MAX {
            self.report.error(
                base,
                Code::TooLong,
                format!("has {} labels; at most {LABELS_MAX}", labels.len()),
            );
        }
        let policy = &self.cat.labels;
        for (k, value) in labels {
            let p = key(base, k);
            let key_ok = match check_label_key(k) {
                Ok(()) => true,
                Err(why) => {
                    self.report.error(&p, Code::InvalidName, format!("label key \"{k}\" {why}"));
                    false
                }
            };
            if let Err(why) = check_label_value(value) {
                self.report.error(&p, Code::InvalidValue, format!("label value \"{value}\" {why}"));
            }
            if policy.validation && key_ok {
                match policy.maintained.get(k) {
                    None => {
                        let known = names(policy.maintained.keys());
                        self.report.error(
                            &p,
                            Code::UnmaintainedLabel,
                            format!("label \"{k}\" is not maintained and label validation is on; use one of: {known}"),
                        );
                    }
                    Some(allowed) if !allowed.is_empty() && !allowed.contains(value) => {
                        self.report.error(
                            &p,
                            Code::UnmaintainedLabel,
                            format!(
                                "\"{value}\" is not an allowed value of label \"{k}\"; use one of: {}",
                                allowed.join(", ")
                            ),
                        );
                    }
                    Some(_) => {}
                }
            }
        }
    }

    fn placement(&mut self, t: &'a TrainingTask) -> Place<'a> {
        let s = &t.spec;
        let task_type = self.ok("spec.type").then_some(s.task_type);
        let (region, cluster) = (&s.placement.region, &s.placement.cluster);
        let region_ok = self.ok("spec.placement.region")
            && self.reference(
                "spec.placement.region",
                "region",
                region,
                self.cat.regions.contains_key(region),
                self.cat.regions.keys(),
            );
        let mut cluster_ok = self.ok("spec.placement.cluster")
            && self.reference(
                "spec.placement.cluster",
                "cluster",
                cluster,
                self.cat.clusters.contains_key(cluster),
                self.cat.clusters.iter().filter(|(_, c)| !region_ok || &c.region == region).map(|(n, _)| n),
            );
        if cluster_ok && region_ok && self.cat.clusters[cluster].region != *region {
            self.report.error(
                "spec.placement.cluster",
                Code::NotAvailable,
                format!(
                    "cluster \"{cluster}\" is in region \"{}\", not \"{region}\"",
                    self.cat.clusters[cluster].region
                ),
            );
            cluster_ok = false;
        }
        let cluster = cluster_ok.then_some(cluster.as_str());

        let pool = &s.compute.pool;
        let mut pool_ok = self.ok("spec.compute.pool")
            && self.reference(
                "spec.compute.pool",
                "resource pool",
                pool,
                self.cat.pools.contains_key(pool),
                self.cat.pools.iter().filter(|(_, p)| cluster.is_none_or(|c| p.cluster == c)).map(|(n, _)| n),
            );
        if let Some(c) = cluster
            && pool_ok
            && self.cat.pools[pool].cluster != c
        {
            self.report.error(
                "spec.compute.pool",
                Code::NotAvailable,
                format!(
                    "pool \"{pool}\" belongs to cluster \"{}\", not \"{c}\"",
                    self.cat.pools[pool].cluster
                ),
            );
            pool_ok = false;
        }
        let group = &t.metadata.project_group;
        let group_ok = self.ok("metadata.projectGroup") && self.cat.project_groups.contains_key(group);
        Place {
            task_type,
            cluster,
            pool: pool_ok.then_some(pool.as_str()),
            group: group_ok.then_some(group.as_str()),
        }
    }

    /// Reports an empty or unknown reference. Returns whether it resolved.
    fn reference<'n>(
        &mut self,
        path: &str,
        what: &str,
        name: &str,
        exists: bool,
        known: impl Iterator<Item = &'n String>,
    ) -> bool {
        if name.is_empty() {
            self.report.error(path, Code::Empty, format!("choose a {what}"));
            false
        } else if !exists {
            self.report.error(
                path,
                Code::NotFound,
                format!("{what} \"{name}\" does not exist; choose one of: {}", names(known)),
            );
            false
        } else {
            true
        }
    }

    /// Reports a catalog entry not offered in the task's cluster or to its project group. `exists` is the
    /// entry, if any. The host image's groups are not checked here: they say which members may use it at
    /// all (admins always may), which only the server knows.
    fn offered<T: ClusterScoped>(
        &mut self,
        path: &str,
        what: &str,
        name: &str,
        entry: Option<&T>,
        place: &Place,
    ) {
        if let (Some(e), Some(g)) = (entry, place.group)
            && !e.offered_to(g)
            && !(what == "image" && name == crate::catalog::HOST_IMAGE)
        {
            self.report.error(
                path,
                Code::NotInGroup,
                format!(
                    "{what} \"{name}\" is for project groups {} only, and this task is in \"{g}\"; choose another {what}, or ask an admin to add the group to it in the catalog",
                    e.project_groups().join(", ")
                ),
            );
        }
        if let (Some(e), Some(c)) = (entry, place.cluster)
            && !e.offered_in(c)
        {
            self.report.error(
                path,
                Code::NotAvailable,
                format!(
                    "{what} \"{name}\" is not offered in cluster \"{c}\"; it is offered in {}",
                    e.clusters().join(", ")
                ),
            );
        }
    }

    fn environment(&mut self, t: &TrainingTask, place: &Place) {
        let e = &t.spec.environment;
        self.image(t, place);
        check_env_list(&mut self.report, "spec.environment.env", &e.env);
        self.mounts(t, place);

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

    fn image(&mut self, t: &TrainingTask, place: &Place) {
        let path = "spec.environment.image";
        let name = &t.spec.environment.image;
        if name.is_empty() {
            self.report.error(
                path,
                Code::Empty,
                format!("choose an image; available: {}", names(self.cat.images.keys())),
            );
            return;
        }
        let needs_ray = place.task_type == Some(TaskType::RayJob);
        match self.cat.images.get(name) {
            Some(img) => {
                self.offered(path, "image", name, Some(img), place);
                if needs_ray && !img.ray {
                    self.report.error(
                        path,
                        Code::Incompatible,
                        format!("image \"{name}\" has no Ray runtime, which a RayJob needs; choose an image with Ray"),
                    );
                }
                let precheck_on = t.spec.advanced.precheck.as_ref().is_some_and(|p| p.enabled);
                if precheck_on && place.task_type == Some(TaskType::PyTorchJob) && !img.torch {
                    self.report.warning(
                        path,
                        Code::Incompatible,
                        format!(
                            "image \"{name}\" is not marked as having PyTorch; the resource precheck needs it"
                        ),
                    );
                }
            }
            None => {
                if let Err(why) = check_image_reference(name) {
                    self.report.error(
                        path,
                        Code::InvalidName,
                        format!("\"{name}\" is neither a catalog image nor a valid image reference: {why}"),
                    );
                } else if !self.cat.allow_external_images {
                    self.report.error(
                        path,
                        Code::NotFound,
                        format!(
                            "image \"{name}\" is not in the catalog; choose one of: {}",
                            names(self.cat.images.keys())
                        ),
                    );
                } else if needs_ray {
                    self.report.warning(
                        path,
                        Code::Incompatible,
                        format!("image \"{name}\" is not in the catalog, so Trainyard cannot check that it has Ray"),
                    );
                }
            }
        }
    }

    fn mounts(&mut self, t: &TrainingTask, place: &Place) {
        let e = &t.spec.environment;
        let is_ray = place.task_type == Some(TaskType::RayJob);
        // (field path of the mount, what, name, mount path) for the conflict checks below.
        let mut all: Vec<(String, &str, &str, &str)> = Vec::new();

        for (i, m) in e.volumes.iter().enumerate() {
            let p = index("spec.environment.volumes", i);
            let entry = self.cat.volumes.get(&m.volume);
            if self.reference(
                &field(&p, "volume"),
                "volume",
                &m.volume,
                entry.is_some(),
                self.cat.volumes.keys(),
            ) {
                self.offered(&field(&p, "volume"), "volume", &m.volume, entry, place);
            }
            all.push((p, "volume", &m.volume, &m.mount_path));
        }
        for (i, m) in e.datasets.iter().enumerate() {
            let p = index("spec.environment.datasets", i);
            let entry = self.cat.datasets.get(&m.dataset);
            if self.reference(
                &field(&p, "dataset"),
                "dataset",
                &m.dataset,
                entry.is_some(),
                self.cat.datasets.keys(),
            ) {
                self.offered(&field(&p, "dataset"), "dataset", &m.dataset, entry, place);
            }
            if !m.read_only {
                self.report.error(
                    field(&p, "readOnly"),
                    Code::ReadOnly,
                    "datasets are mounted read-only; write outputs to a volume instead",
                );
            }
            all.push((p, "dataset", &m.dataset, &m.mount_path));
        }
        for (i, m) in e.models.iter().enumerate() {
            let p = index("spec.environment.models", i);
            let entry = self.cat.models.get(&m.model);
            if self.reference(&field(&p, "model"), "model", &m.model, entry.is_some(), self.cat.models.keys())
            {
                self.offered(&field(&p, "model"), "model", &m.model, entry, place);
            }
            if !m.read_only {
                self.report.error(
                    field(&p, "readOnly"),
                    Code::ReadOnly,
                    "models are mounted read-only; save fine-tuned weights to a volume instead",
                );
            }
            all.push((p, "model", &m.model, &m.mount_path));
        }
        if all.len() > MOUNTS_MAX {
            self.report.error(
                "spec.environment",
                Code::TooLong,
                format!("has {} mounts in all; at most {MOUNTS_MAX}", all.len()),
            );
        }

        let mut valid = Vec::with_capacity(all.len());
        for (p, what, name, mount) in &all {
            let mp = field(p, "mountPath");
            if check_mount_path(&mut self.report, &mp, mount, is_ray) {
                valid.push((mp, *what, *name, *mount));
            }
        }
        // Ray's shared storage is one more mount, at a fixed path.
        if is_ray && let Some(ss) = t.spec.ray.as_ref().and_then(|r| r.shared_storage.as_ref()) {
            valid.push(("spec.ray.sharedStorage".to_owned(), "volume", &ss.volume, RAY_SHARED_PATH));
        }
        // Each mount is compared with those before it and reported once: against the first mount at the same
        // path, or else against the first mount it lies inside (or that lies inside it).
        for j in 0..valid.len() {
            let (pj, wj, nj, mj) = &valid[j];
            if let Some((pi, wi, ni, _)) = valid[..j].iter().find(|(_, _, _, mi)| mi == mj) {
                if wi == wj && ni == nj {
                    self.report.error(
                        pj,
                        Code::Duplicate,
                        format!("{wj} \"{nj}\" is already mounted at {mj} by {pi}; mount it once"),
                    );
                } else {
                    self.report.error(
                        pj,
                        Code::PathConflict,
                        format!("{mj} is already used by {pi} ({wi} \"{ni}\"); choose another path"),
                    );
                }
            } else if let Some((outer, inner, inner_path)) =
                valid[..j].iter().find_map(|(pi, _, _, mi)| nested(mi, mj, pi, pj))
            {
                self.report.warning(
                    inner_path,
                    Code::PathConflict,
                    format!("{inner} lies inside {outer}, which is mounted too; the inner mount hides part of the outer one"),
                );
            }
        }
    }

    fn compute(&mut self, t: &TrainingTask, place: &Place) {
        let c = &t.spec.compute;
        let base = "spec.compute";
        if c.workers > WORKERS_MAX {
            self.report.error(
                field(base, "workers"),
                Code::OutOfRange,
                format!("{} workers is too many; at most {WORKERS_MAX}", c.workers),
            );
        }
        if !(PRIORITY_MIN..=PRIORITY_MAX).contains(&c.priority) {
            self.report.error(
                field(base, "priority"),
                Code::OutOfRange,
                format!(
                    "{} is out of range; use {PRIORITY_MIN} (lowest) to {PRIORITY_MAX} (highest)",
                    c.priority
                ),
            );
        }
        let rt = self.ok("spec.compute.resourceType").then_some(c.resource_type);
        if c.guarantee && matches!(rt, Some(ResourceType::Spot | ResourceType::Idle)) {
            self.report.error(
                field(base, "guarantee"),
                Code::Conflict,
                format!("{} capacity can always be preempted, so it cannot be guaranteed; use Reserved or Ondemand, or turn guarantee off", c.resource_type),
            );
        }
        if c.idle_supplement {
            match rt {
                Some(ResourceType::Reserved) | None => {
                    if c.guarantee {
                        self.report.warning(
                            field(base, "idleSupplement"),
                            Code::Ignored,
                            "has no effect with guarantee on: a guaranteed task never runs on idle capacity",
                        );
                    }
                }
                Some(other) => self.report.error(
                    field(base, "idleSupplement"),
                    Code::NotSupported,
                    format!("idle supplementation extends Reserved quota; it does not apply to {other}"),
                ),
            }
        }

        let specs_path = field(base, "instanceSpecs");
        if c.instance_specs.is_empty() && self.ok(&specs_path) {
            let offered = place.pool.map(|p| self.cat.pools[p].instance_specs.join(", ")).unwrap_or_default();
            self.report.error(
                &specs_path,
                Code::Empty,
                format!(
                    "choose at least one instance spec{}",
                    if offered.is_empty() { String::new() } else { format!("; the pool offers {offered}") }
                ),
            );
        }
        if c.instance_specs.len() > INSTANCE_SPECS_MAX {
            self.report.error(
                &specs_path,
                Code::TooLong,
                format!("lists {} instance specs; at most {INSTANCE_SPECS_MAX}", c.instance_specs.len()),
            );
        }
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        let mut kinds = BTreeSet::new();
        for (i, choice) in c.instance_specs.iter().enumerate() {
            let p = index(&specs_path, i);
            if let Some(first) = seen.insert(&choice.spec, i) {
                self.report.error(
                    field(&p, "spec"),
                    Code::Duplicate,
                    format!("instance spec \"{}\" is already listed at {specs_path}[{first}]; list each spec once", choice.spec),
                );
                continue;
            }
            if let Some(s) = self.instance_spec(&p, choice, place) {
                kinds.insert(s.kind);
            }
        }
        if kinds.len() > 1 {
            self.report.warning(
                &specs_path,
                Code::Conflict,
                "mixes GPU and CPU instance specs; make sure the training code runs on both",
            );
        }
    }

    /// Checks one instance spec choice (a worker option or the Ray head). Returns the spec when it resolved.
    fn instance_spec(
        &mut self,
        p: &str,
        choice: &InstanceSpecChoice,
        place: &Place,
    ) -> Option<&'a InstanceSpec> {
        let cat = self.cat;
        let sp = field(p, "spec");
        let offered: Vec<&String> = match place.pool {
            Some(pool) => cat.pools[pool].instance_specs.iter().collect(),
            None => cat.instance_specs.keys().collect(),
        };
        if !self.reference(
            &sp,
            "instance spec",
            &choice.spec,
            cat.instance_specs.contains_key(&choice.spec),
            offered.iter().copied(),
        ) {
            return None;
        }
        let spec = &cat.instance_specs[&choice.spec];
        let cp = field(p, "countPerNode");
        if choice.count_per_node == 0 || choice.count_per_node > COUNT_PER_NODE_MAX {
            self.report.error(
                &cp,
                Code::OutOfRange,
                format!(
                    "{} is out of range; each replica takes 1 to {COUNT_PER_NODE_MAX} units of its spec",
                    choice.count_per_node
                ),
            );
        }
        if let Some(pool) = place.pool {
            if !offered.contains(&&choice.spec) {
                self.report.error(
                    &sp,
                    Code::NotAvailable,
                    format!(
                        "pool \"{pool}\" does not offer \"{}\"; it offers {}",
                        choice.spec,
                        names(offered.iter().copied())
                    ),
                );
                return Some(spec);
            }
            if (1..=COUNT_PER_NODE_MAX).contains(&choice.count_per_node) {
                self.never_fits(&cp, pool, &choice.spec, spec, choice.count_per_node);
            }
        }
        Some(spec)
    }

    /// A replica must fit on one node. When the catalog knows the pool's nodes, refuse a replica that no node
    /// could ever hold, rather than letting it wait forever.
    fn never_fits(&mut self, path: &str, pool: &str, name: &str, spec: &InstanceSpec, count: u32) {
        let need = Resources::of(spec) * u64::from(count);
        let mut any_node = false;
        let mut largest: Option<Resources> = None;
        for (_, n) in self.cat.pool_nodes(pool) {
            any_node = true;
            if !spec.matches_node(n.gpu_model.as_deref()) {
                continue;
            }
            let cap = Resources { gpus: n.gpus.into(), vcpus: n.vcpus.into(), memory_mib: n.memory_mib };
            if need.fits_in(&cap) {
                return;
            }
            if largest.is_none_or(|l| (cap.gpus, cap.vcpus, cap.memory_mib) > (l.gpus, l.vcpus, l.memory_mib))
            {
                largest = Some(cap);
            }
        }
        if !any_node {
            return;
        }
        let model = spec.gpu_model.as_deref().unwrap_or("CPU");
        let message = match largest {
            None => format!("pool \"{pool}\" has no {model} nodes, so \"{name}\" can never be placed there"),
            Some(l) => {
                let most = max_count(spec, &l);
                format!(
                    "one replica needs {need} ({count} × \"{name}\") on a single node, but the largest {model} node in pool \"{pool}\" has {l}; use countPerNode {most} or less and more workers"
                )
            }
        };
        self.report.error(path, Code::NeverFits, message);
    }

    fn advanced(&mut self, t: &TrainingTask) {
        let a = &t.spec.advanced;
        let base = "spec.advanced";
        if let Some(pc) = &a.precheck {
            let p = field(base, "precheck");
            check_env_list(&mut self.report, &field(&p, "env"), &pc.env);
            for (name, v) in
                [("minGemmTflops", pc.min_gemm_tflops), ("minAllreduceGbps", pc.min_allreduce_gbps)]
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

    fn metrics(&mut self, base: &str, m: &crate::spec::MetricsMonitor) {
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

    fn alarms(&mut self, base: &str, alarms: &[crate::spec::AlarmSubscription]) {
        check_alarms(&mut self.report, base, alarms);
    }

    fn type_specific(&mut self, t: &TrainingTask, place: &Place) {
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

    fn ray(&mut self, t: &TrainingTask, r: &crate::spec::RaySettings, place: &Place) {
        let base = "spec.ray";
        if let Some(h) = &r.head.instance_spec {
            self.instance_spec("spec.ray.head.instanceSpec", h, place);
        }
        if let Some(text) = &r.runtime_env_yaml {
            runtime_env::check(&mut self.report, &field(base, "runtimeEnvYaml"), text);
        }
        if let Some(ss) = &r.shared_storage {
            let p = "spec.ray.sharedStorage.volume";
            let entry = self.cat.volumes.get(&ss.volume);
            if self.reference(p, "volume", &ss.volume, entry.is_some(), self.cat.volumes.keys()) {
                self.offered(p, "volume", &ss.volume, entry, place);
                if entry.is_some_and(|v| !v.multi_pod_read_write) {
                    let ok: Vec<&String> = self
                        .cat
                        .volumes
                        .iter()
                        .filter(|(_, v)| v.multi_pod_read_write)
                        .map(|(n, _)| n)
                        .collect();
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
}

/// How many units of `spec` fit on a node of capacity `cap`.
fn max_count(spec: &InstanceSpec, cap: &Resources) -> u64 {
    let per = |have: u64, need: u64| have.checked_div(need).unwrap_or(u64::MAX);
    per(cap.gpus, spec.gpus.into())
        .min(per(cap.vcpus, spec.vcpus.into()))
        .min(per(cap.memory_mib, spec.memory_mib))
}

/// `a, b, c`, or `(none)`.
fn names<'n>(it: impl Iterator<Item = &'n String>) -> String {
    let v: Vec<&str> = it.map(String::as_str).collect();
    if v.is_empty() { "(none)".to_owned() } else { v.join(", ") }
}

/// When one mount path lies inside the other: (outer, inner, field path of the inner).
fn nested<'p>(a: &'p str, b: &'p str, pa: &'p str, pb: &'p str) -> Option<(&'p str, &'p str, &'p str)> {
    let under = |inner: &str, outer: &str| {
        inner.len() > outer.len() && inner.starts_with(outer) && inner.as_bytes()[outer.len()] == b'/'
    };
    if under(b, a) {
        Some((a, b, pb))
    } else if under(a, b) {
        Some((b, a, pa))
    } else {
        None
    }
}

/// Alarm subscriptions (a task's, or a user's own): events, webhook, the queuedTooLong threshold.
pub fn check_alarms(r: &mut Report, base: &str, alarms: &[crate::spec::AlarmSubscription]) {
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

/// The task name prefix: lowercase letters, digits and hyphens, starting and ending alphanumeric, short
/// enough that prefix + unique suffix is a DNS-1123 label.
pub fn check_name_prefix(r: &mut Report, path: &str, s: &str) {
    if s.is_empty() {
        r.error(path, Code::Empty, "give a name prefix, like llama-sft");
        return;
    }
    let n = s.chars().count();
    if n > NAME_PREFIX_MAX {
        r.error(
            path,
            Code::TooLong,
            format!("is {n} characters; at most {NAME_PREFIX_MAX}, so that the {NAME_SUFFIX_LEN}-character unique suffix still fits in {DNS_LABEL_MAX}"),
        );
    }
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    if s.chars().any(|c| !allowed(c)) {
        let mut what: Vec<String> = Vec::new();
        if s.chars().any(|c| c.is_ascii_uppercase()) {
            what.push("uppercase letters".to_owned());
        }
        what.extend(describe_bad_chars(s, |c| allowed(c) || c.is_ascii_uppercase()));
        let fixed: String =
            s.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
        let fixed = fixed.trim_matches('-');
        let hint = if !fixed.is_empty() && fixed.len() <= NAME_PREFIX_MAX {
            format!(" (try {fixed:?})")
        } else {
            String::new()
        };
        r.error(
            path,
            Code::InvalidName,
            format!(
                "{s:?} contains {}; use lowercase letters, digits and hyphens only{hint}",
                what.join(" and ")
            ),
        );
    } else if !s.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !s.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        r.error(path, Code::InvalidName, format!("{s:?} must start and end with a letter or digit"));
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

/// Checks a mount path; returns whether it is well-formed (so conflict checks can use it).
pub fn check_mount_path(r: &mut Report, path: &str, mount: &str, is_ray: bool) -> bool {
    if mount.is_empty() {
        r.error(path, Code::Empty, "give the path inside the container, like /mnt/data");
        return false;
    }
    if !mount.starts_with('/') {
        r.error(
            path,
            Code::InvalidPath,
            format!("\"{mount}\" is not absolute; start it with /, like /mnt/{mount}"),
        );
        return false;
    }
    if mount.len() > MOUNT_PATH_MAX {
        r.error(path, Code::TooLong, format!("is {} bytes; at most {MOUNT_PATH_MAX}", mount.len()));
        return false;
    }
    if let Some(bad) = describe_bad_chars(mount, |c| !(c.is_control() || matches!(c, ':' | ',' | '\\'))) {
        r.error(path, Code::InvalidPath, format!("{mount:?} contains {bad}; remove them"));
        return false;
    }
    if mount.contains("//") {
        r.error(
            path,
            Code::InvalidPath,
            format!("\"{mount}\" contains //; write {}", collapse_slashes(mount)),
        );
        return false;
    }
    if mount.len() > 1 && mount.ends_with('/') {
        r.error(
            path,
            Code::InvalidPath,
            format!("\"{mount}\" ends with /; write {}", mount.trim_end_matches('/')),
        );
        return false;
    }
    if mount.split('/').any(|seg| seg == "." || seg == "..") {
        r.error(
            path,
            Code::InvalidPath,
            format!("\"{mount}\" contains . or .. segments; write the plain absolute path"),
        );
        return false;
    }
    let under =
        |root: &str| mount == root || (mount.starts_with(root) && mount.as_bytes()[root.len()] == b'/');
    if mount == "/" {
        r.error(path, Code::ProtectedPath, "cannot mount over /; use a directory under /mnt or /volume");
        return false;
    }
    if let Some(root) = PROTECTED_PATHS.iter().find(|p| under(p)) {
        r.error(
            path,
            Code::ProtectedPath,
            if mount == *root {
                format!("{mount} is a directory the image needs; mount under /mnt or /volume instead")
            } else {
                format!(
                    "{mount} is inside {root}, which the image needs; mount under /mnt or /volume instead"
                )
            },
        );
        return false;
    }
    if PLATFORM_ROOT_PATHS.contains(&mount) || under("/root/.ssh") {
        r.error(
            path,
            Code::ProtectedPath,
            format!("{mount} is where the platform writes SSH keys and host files; choose another path"),
        );
        return false;
    }
    if is_ray && under(RAY_SHARED_PATH) {
        r.error(
            path,
            Code::ProtectedPath,
            format!(
                "{RAY_SHARED_PATH} is Ray's own directory (shared storage mounts there); choose another path"
            ),
        );
        return false;
    }
    if !RECOMMENDED_MOUNT_ROOTS.iter().any(|p| under(p) && mount != *p) {
        r.warning(
            path,
            Code::UnusualPath,
            if RECOMMENDED_MOUNT_ROOTS.contains(&mount) {
                format!("mount in a directory of its own under {mount}, like {mount}/data, so mounts cannot cover each other")
            } else {
                format!("{mount} is outside /mnt and /volume; a separate directory there cannot hide the image's own files")
            },
        );
    }
    true
}

fn collapse_slashes(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if !(c == '/' && out.ends_with('/')) {
            out.push(c);
        }
    }
    out
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63 characters.
pub fn check_label_key(k: &str) -> Result<(), String> {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix {
        if p.is_empty() || p.len() > LABEL_PREFIX_MAX {
            return Err(format!("has a prefix of {} characters; use 1 to {LABEL_PREFIX_MAX}", p.len()));
        }
        let ok = p.split('.').all(|seg| {
            !seg.is_empty()
                && seg.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !seg.starts_with('-')
                && !seg.ends_with('-')
        });
        if !ok {
            return Err("has a prefix that is not a lowercase DNS name, like example.com".to_owned());
        }
    }
    if name.is_empty() {
        return Err("has an empty name".to_owned());
    }
    check_label_value(name)
}

/// A label value: empty, or at most 63 characters of letters, digits, `-`, `_`, `.`, starting and ending
/// with a letter or digit.
pub fn check_label_value(v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Ok(());
    }
    if v.len() > LABEL_NAME_MAX {
        return Err(format!("is {} characters; at most {LABEL_NAME_MAX}", v.len()));
    }
    if let Some(bad) = describe_bad_chars(v, |c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
        return Err(format!("contains {bad}; use letters, digits, -, _ and . only"));
    }
    if !v.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !v.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return Err("must start and end with a letter or digit".to_owned());
    }
    Ok(())
}

/// An OCI image reference: `[host[:port]/]path[:tag][@algo:digest]`.
pub fn check_image_reference(s: &str) -> Result<(), String> {
    if s.len() > IMAGE_REF_MAX {
        return Err(format!("it is {} characters; at most {IMAGE_REF_MAX}", s.len()));
    }
    let (rest, digest) = match s.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (s, None),
    };
    if let Some(d) = digest {
        let ok = d.split_once(':').is_some_and(|(algo, hex)| {
            !algo.is_empty()
                && algo.chars().all(|c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '+' | '.' | '_' | '-')
                })
                && hex.len() >= 32
                && hex.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        });
        if !ok {
            return Err("the digest after @ must look like sha256:<64 hex digits>".to_owned());
        }
    }
    // A tag is after the last ':' that comes after the last '/'.
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(t) = tag {
        let ok = !t.is_empty()
            && t.len() <= 128
            && t.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            && t.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if !ok {
            return Err(format!("tag \"{t}\" must be 1 to 128 letters, digits, _, . or -"));
        }
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    if parts.len() > 1 && (parts[0].contains(['.', ':']) || parts[0] == "localhost") {
        let host = parts.remove(0);
        let (h, port) = host.split_once(':').map_or((host, None), |(h, p)| (h, Some(p)));
        if h.is_empty() || !h.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-')) {
            return Err(format!("registry host \"{host}\" is not a host name"));
        }
        if port.is_some_and(|p| p.parse::<u16>().is_err()) {
            return Err(format!("registry host \"{host}\" has a bad port"));
        }
    }
    for part in &parts {
        let ok = !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'))
            && part.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && part.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit());
        if !ok {
            return Err(format!(
                "path component \"{part}\" must be lowercase letters and digits, separated by . _ or -"
            ));
        }
    }
    Ok(())
}

/// An absolute http or https URL with a host.
pub fn check_url(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("give the webhook URL, like https://alerts.example.com/hook".to_owned());
    }
    if s.len() > URL_MAX {
        return Err(format!("is {} characters; at most {URL_MAX}", s.len()));
    }
    let rest = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
        .ok_or_else(|| format!("\"{s}\" must start with https:// or http://"))?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    if host.is_empty() || host.starts_with(':') {
        return Err(format!("\"{s}\" has no host"));
    }
    if let Some(bad) = describe_bad_chars(s, |c| !(c.is_whitespace() || c.is_control())) {
        return Err(format!("URL contains {bad}; percent-encode them"));
    }
    Ok(())
}
