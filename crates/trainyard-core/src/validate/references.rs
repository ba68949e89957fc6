//! What the task names in the catalog: its region, cluster and pool (which decide where it runs), its
//! image, and the volumes, datasets and models it mounts. Each must exist, and be offered in the task's
//! cluster and to its project group.

use super::context::{Place, V, names};
use crate::catalog::ClusterScoped;
use crate::problem::{Code, field, index};
use crate::spec::{TaskType, TrainingTask};

/// A volume, dataset or model the task mounts, as declared (its catalog entry checked).
pub(super) struct Mount<'t> {
    /// The field path of the declaration, like `spec.environment.volumes[0]`.
    pub(super) path: String,
    /// `volume`, `dataset` or `model`.
    pub(super) what: &'static str,
    pub(super) name: &'t str,
    pub(super) mount_path: &'t str,
}

impl<'a> V<'a> {
    /// Checks the region, cluster and pool, and says what is known of where the task runs.
    pub(super) fn placement(&mut self, t: &'a TrainingTask) -> Place<'a> {
        let task_type = self.ok("spec.type").then_some(t.spec.task_type);
        let cluster = self.region_and_cluster(t);
        let pool = self.pool(t, cluster);
        let group = &t.metadata.project_group;
        let group_ok = self.ok("metadata.projectGroup") && self.cat.project_groups.contains_key(group);
        Place { task_type, cluster, pool, group: group_ok.then_some(group.as_str()) }
    }

    /// The cluster, when it and the region resolve and the cluster is in that region.
    fn region_and_cluster(&mut self, t: &'a TrainingTask) -> Option<&'a str> {
        let s = &t.spec;
        let (region, cluster) = (&s.placement.region, &s.placement.cluster);
        let region_ok = self.ok("spec.placement.region")
            && self.reference(
                "spec.placement.region",
                "region",
                region,
                self.cat.regions.contains_key(region),
                names(self.cat.regions.keys()),
            );
        let mut cluster_ok = self.ok("spec.placement.cluster")
            && self.reference(
                "spec.placement.cluster",
                "cluster",
                cluster,
                self.cat.clusters.contains_key(cluster),
                names(
                    self.cat
                        .clusters
                        .iter()
                        .filter(|(_, c)| !region_ok || &c.region == region)
                        .map(|(n, _)| n),
                ),
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
        cluster_ok.then_some(cluster.as_str())
    }

    /// The pool, when it resolves and belongs to the task's cluster.
    fn pool(&mut self, t: &'a TrainingTask, cluster: Option<&str>) -> Option<&'a str> {
        let pool = &t.spec.compute.pool;
        let mut pool_ok = self.ok("spec.compute.pool")
            && self.reference(
                "spec.compute.pool",
                "resource pool",
                pool,
                self.cat.pools.contains_key(pool),
                names(
                    self.cat
                        .pools
                        .iter()
                        .filter(|(_, p)| cluster.is_none_or(|c| p.cluster == c))
                        .map(|(n, _)| n),
                ),
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
        pool_ok.then_some(pool.as_str())
    }

    /// Reports an empty or unknown reference. Returns whether it resolved.
    pub(super) fn reference(
        &mut self,
        path: &str,
        what: &str,
        name: &str,
        exists: bool,
        known: String,
    ) -> bool {
        if name.is_empty() {
            self.report.error(path, Code::Empty, format!("choose a {what}"));
            false
        } else if !exists {
            self.report.error(
                path,
                Code::NotFound,
                format!("{what} \"{name}\" does not exist; choose one of: {known}"),
            );
            false
        } else {
            true
        }
    }

    /// Reports a catalog entry not offered in the task's cluster or to its project group. `exists` is the
    /// entry, if any. The host image's groups are not checked here: they say which members may use it at
    /// all (admins always may), which only the server knows.
    pub(super) fn offered<T: ClusterScoped>(
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
            // Only the groups the reader is in are named: another group's use of an entry is its own business.
            let groups = self.shown_groups(e.project_groups());
            let whose = match groups.is_empty() {
                true => String::new(),
                false => format!(
                    "is for project groups {} only, and ",
                    groups.iter().map(|g| g.as_str()).collect::<Vec<_>>().join(", ")
                ),
            };
            self.report.error(
                path,
                Code::NotInGroup,
                format!(
                    "{what} \"{name}\" {whose}is not offered to project group \"{g}\"; choose another {what}, or ask an admin to add the group to it in the catalog"
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

    pub(super) fn image(&mut self, t: &TrainingTask, place: &Place) {
        let path = "spec.environment.image";
        let name = &t.spec.environment.image;
        if name.is_empty() {
            self.report.error(
                path,
                Code::Empty,
                format!("choose an image; available: {}", names(self.shown().images.keys())),
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
                let parsed = crate::image_ref::ImageRef::parse(name);
                if let Err(why) = &parsed {
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
                            names(self.shown().images.keys())
                        ),
                    );
                } else if let Ok(r) = parsed.as_ref()
                    && !self.cat.registries.is_empty()
                    && !self.cat.registries.contains_key(&r.registry)
                {
                    self.report.error(
                        path,
                        Code::RegistryNotAllowed,
                        format!(
                            "image \"{name}\" comes from registry {}, which the catalog does not allow; allowed: {}",
                            r.registry,
                            names(self.cat.registries.keys())
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

    /// The volumes, datasets and models the task mounts, in the order they are declared, each checked against
    /// the catalog (and datasets and models for being mounted read-only).
    pub(super) fn mount_sources<'t>(&mut self, t: &'t TrainingTask, place: &Place) -> Vec<Mount<'t>> {
        let e = &t.spec.environment;
        let mut all = Vec::new();
        for (i, m) in e.volumes.iter().enumerate() {
            let p = index("spec.environment.volumes", i);
            let entry = self.cat.volumes.get(&m.volume);
            let known = names(self.shown().volumes.keys());
            if self.reference(&field(&p, "volume"), "volume", &m.volume, entry.is_some(), known) {
                self.offered(&field(&p, "volume"), "volume", &m.volume, entry, place);
            }
            all.push(Mount { path: p, what: "volume", name: &m.volume, mount_path: &m.mount_path });
        }
        for (i, m) in e.datasets.iter().enumerate() {
            let p = index("spec.environment.datasets", i);
            let entry = self.cat.datasets.get(&m.dataset);
            let known = names(self.shown().datasets.keys());
            if self.reference(&field(&p, "dataset"), "dataset", &m.dataset, entry.is_some(), known) {
                self.offered(&field(&p, "dataset"), "dataset", &m.dataset, entry, place);
            }
            if !m.read_only {
                self.report.error(
                    field(&p, "readOnly"),
                    Code::ReadOnly,
                    "datasets are mounted read-only; write outputs to a volume instead",
                );
            }
            all.push(Mount { path: p, what: "dataset", name: &m.dataset, mount_path: &m.mount_path });
        }
        for (i, m) in e.models.iter().enumerate() {
            let p = index("spec.environment.models", i);
            let entry = self.cat.models.get(&m.model);
            let known = names(self.shown().models.keys());
            if self.reference(&field(&p, "model"), "model", &m.model, entry.is_some(), known) {
                self.offered(&field(&p, "model"), "model", &m.model, entry, place);
            }
            if !m.read_only {
                self.report.error(
                    field(&p, "readOnly"),
                    Code::ReadOnly,
                    "models are mounted read-only; save fine-tuned weights to a volume instead",
                );
            }
            all.push(Mount { path: p, what: "model", name: &m.model, mount_path: &m.mount_path });
        }
        all
    }
}
