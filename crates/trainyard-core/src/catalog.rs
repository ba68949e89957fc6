//! The catalog: what an admin has described (regions, clusters, pools, instance specs, nodes, images,
//! storage, labels). Validation and demand read it; they never change it. Until the server exists the CLI
//! loads it from a YAML file.

use crate::kube_names;
use crate::string_enum;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

string_enum! {
    /// GPU or CPU instance.
    pub enum InstanceKind {
        Gpu = "GPU",
        Cpu = "CPU",
    }
}

/// A catalog view.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Catalog {
    #[serde(default)]
    pub regions: BTreeMap<String, Region>,
    #[serde(default)]
    pub clusters: BTreeMap<String, Cluster>,
    #[serde(default)]
    pub pools: BTreeMap<String, Pool>,
    #[serde(default)]
    pub instance_specs: BTreeMap<String, InstanceSpec>,
    /// Known nodes. When a pool has nodes here, validation refuses replicas that none of them could hold.
    #[serde(default)]
    pub nodes: BTreeMap<String, Node>,
    #[serde(default)]
    pub project_groups: BTreeMap<String, ProjectGroup>,
    #[serde(default)]
    pub images: BTreeMap<String, Image>,
    /// Whether an image reference outside the catalog may be used (the backend must be able to pull it).
    /// Closed unless the catalog says so: a catalog that leaves it out allows catalog images only.
    #[serde(default)]
    pub allow_external_images: bool,
    /// The registries such references may come from, by `host[:port]` (`docker.io` for Docker Hub). Empty:
    /// any registry.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub registries: BTreeMap<String, Registry>,
    #[serde(default)]
    pub volumes: BTreeMap<String, Volume>,
    #[serde(default)]
    pub datasets: BTreeMap<String, DataAsset>,
    #[serde(default)]
    pub models: BTreeMap<String, DataAsset>,
    #[serde(default)]
    pub labels: LabelPolicy,
    /// Quotas of project groups, in spec units.
    #[serde(default)]
    pub quotas: Vec<QuotaEntry>,
}

/// A project group's quota for one resource type, pool and instance spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QuotaEntry {
    pub group: String,
    pub resource_type: crate::spec::ResourceType,
    pub pool: String,
    pub spec: String,
    pub units: u64,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Region {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Cluster {
    pub region: String,
    /// The kubeconfig context that reaches this cluster (Kubernetes backend); none: the server's default one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
}

/// A registry that image references may come from, and how it is reached.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Registry {
    /// Mirrors (`host[:port]`) tried first, in order; the registry itself after them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mirrors: Vec<String>,
    /// Plain HTTP instead of TLS: only for a registry on a network the admin trusts.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
    /// A PEM file of certificate authorities trusted for it besides the system's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<String>,
}

/// A resource pool in one cluster, offering some instance specs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Pool {
    pub cluster: String,
    pub instance_specs: Vec<String>,
    /// What the pool's nodes' taints ask of a pod on Kubernetes (a GPU pool's `nvidia.com/gpu`, a dedicated
    /// pool's own): every pod of the pool tolerates these. The local backend has no taints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// On Kubernetes, the node labels every pod of the pool asks for (`nodeSelector`), so its pods land only on
    /// the pool's nodes whatever else the cluster runs. The local backend has no node labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
}

/// A Kubernetes toleration, as a pod spec writes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Toleration {
    /// The taint's key; empty with `Exists` tolerates every taint.
    #[serde(default)]
    pub key: String,
    /// `Equal` (the default: key and value match) or `Exists` (the key alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`; none: every effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<String>,
}

impl Toleration {
    /// What is wrong with it, as Kubernetes would refuse it.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let exists = match self.operator.as_deref() {
            None | Some("Equal") => false,
            Some("Exists") => true,
            Some(other) => {
                out.push(format!("operator {other:?} is not Equal or Exists"));
                false
            }
        };
        if exists && self.value.as_deref().is_some_and(|v| !v.is_empty()) {
            out.push("operator Exists takes no value".into());
        }
        if !exists && self.key.is_empty() {
            out.push("an empty key needs operator Exists".into());
        }
        if let Some(e) =
            self.effect.as_deref().filter(|e| !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(e))
        {
            out.push(format!("effect {e:?} is not NoSchedule, PreferNoSchedule or NoExecute"));
        }
        out
    }
}

/// A slice shape: GPUs of one model, vCPUs, memory. A replica takes `spec × countPerNode` on one node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstanceSpec {
    pub kind: InstanceKind,
    /// The GPU model, for GPU specs (`A100`, `H100`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    #[serde(default)]
    pub gpus: u32,
    pub vcpus: u32,
    pub memory_mib: u64,
    /// On Kubernetes, the extended resource a pod requests its GPUs as: `nvidia.com/gpu` when not given;
    /// `amd.com/gpu`, a MIG slice (`nvidia.com/mig-1g.10gb`) or another device plugin's name otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_resource: Option<String>,
    /// On Kubernetes, other extended resources each unit of the spec takes (`rdma/hca_shared_devices_a: 1`,
    /// `vpc.amazonaws.com/efa: 4`), requested with the GPUs: a replica of `countPerNode` units asks for as
    /// many times these.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra_resources: BTreeMap<String, u64>,
    /// On Kubernetes, node labels the spec's pods ask for beside their pool's (`nvidia.com/gpu.product`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// On Kubernetes, taints the spec's pods tolerate beside their pool's. A GPU spec's pods always tolerate
    /// its GPU resource's own taint (`nvidia.com/gpu` with any value, `NoSchedule`), as GPU node pools are
    /// tainted so.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
}

/// The GPU resource name a spec does not name.
pub const DEFAULT_GPU_RESOURCE: &str = "nvidia.com/gpu";

impl InstanceSpec {
    /// The extended resource its GPUs are requested as.
    pub fn gpu_resource(&self) -> &str {
        self.gpu_resource.as_deref().unwrap_or(DEFAULT_GPU_RESOURCE)
    }
}

/// A node's raw capacity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Node {
    pub pool: String,
    /// Healthy and not cordoned: takes new work.
    #[serde(default = "yes")]
    pub schedulable: bool,
    /// Marked failed by an admin (or found broken): gets no work, and what runs there is killed and goes
    /// through the fault-tolerance path.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub failed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    #[serde(default)]
    pub gpus: u32,
    /// The machine's GPU indices this node hands out (`CUDA_VISIBLE_DEVICES`); empty means `0..gpus`. Lets
    /// a config split one machine into several virtual nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_devices: Vec<u32>,
    pub vcpus: u32,
    pub memory_mib: u64,
}

impl Node {
    /// Takes new work: schedulable and not failed.
    pub fn takes_work(&self) -> bool {
        self.schedulable && !self.failed
    }

    /// The GPU indices of the machine this node hands out.
    pub fn devices(&self) -> Vec<u32> {
        if self.gpu_devices.is_empty() { (0..self.gpus).collect() } else { self.gpu_devices.clone() }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProjectGroup {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
}

/// An image: `host` (this machine's root) or a registered root file system or reference.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Image {
    /// Clusters that offer it; empty means every cluster.
    #[serde(default)]
    pub clusters: Vec<String>,
    /// Whether the image carries the Ray runtime (required by RayJob).
    #[serde(default)]
    pub ray: bool,
    /// Whether the image carries PyTorch (required by the resource precheck).
    #[serde(default)]
    pub torch: bool,
    /// The Ray version the image carries (`2.60.0`), where known: on Kubernetes KubeRay needs it to protect
    /// the task's Ray cluster with a token (Ray 2.52 or later); without it the cluster has no token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray_version: Option<String>,
    /// For the local backend: the directory holding the image's root file system. `host` needs none (it is
    /// this machine's root); any other image without one cannot be pulled here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<String>,
    /// The registry image this preset stands for (`registry/repository:tag` or `...@sha256:...`): what the
    /// local backend pulls and a cluster's pods run. Without it, a cluster runs the image by its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// On Kubernetes, the user id the image's programs run as (not root): its pods then run as that user with
    /// every capability dropped, which Pod Security's `restricted` level admits. Without it they run as the
    /// image says, as `baseline` admits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_user: Option<u32>,
    /// The group id with `runAsUser` (its files on volumes are the group's); the image's own when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_group: Option<u32>,
    /// Project groups that may use it; empty means every group. For [`HOST_IMAGE`] it is also who besides
    /// admins may use it at all (the server enforces that; empty means admins only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub project_groups: Vec<String>,
}

/// A Ray version (`2.60.0`, `2.52`) as (major, minor, patch); None when it is not one.
pub fn ray_version(v: &str) -> Option<(u32, u32, u32)> {
    let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
    let (major, minor) = (parts.next()??, parts.next()??);
    let patch = match parts.next() {
        Some(p) => p?,
        None => 0,
    };
    parts.next().is_none().then_some((major, minor, patch))
}

impl Image {
    /// Whether KubeRay can protect a Ray cluster of this image with a token (its Ray is 2.52 or later).
    pub fn ray_token_auth(&self) -> bool {
        self.ray && self.ray_version.as_deref().and_then(ray_version).is_some_and(|v| v >= (2, 52, 0))
    }
}

/// The image that is this machine's own system directories (the local backend). Members may use it only when
/// its catalog entry lists their task's project group; admins always may.
pub const HOST_IMAGE: &str = "host";

/// A storage volume.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Volume {
    #[serde(default)]
    pub clusters: Vec<String>,
    /// Whether several pods may mount it read-write at once (required for Ray shared storage).
    #[serde(default)]
    pub multi_pod_read_write: bool,
    /// For the local backend: the directory backing it (default: `volumes/NAME` in the data dir).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Project groups whose tasks may mount it; empty means every group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub project_groups: Vec<String>,
}

/// A dataset or a model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataAsset {
    #[serde(default)]
    pub clusters: Vec<String>,
    /// For the local backend: the directory holding it (default: `datasets/NAME` or `models/NAME` in the
    /// data dir).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Project groups whose tasks may mount it; empty means every group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub project_groups: Vec<String>,
}

/// The maintained labels, and whether tasks must use them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LabelPolicy {
    /// When on, every task label must be a maintained key with an allowed value.
    #[serde(default)]
    pub validation: bool,
    /// Maintained keys and their allowed values (empty: any value).
    #[serde(default)]
    pub maintained: BTreeMap<String, Vec<String>>,
}

/// Something offered in some clusters (empty: all of them).
/// A catalog entry offered in some clusters, to some project groups (empty lists: all of them).
pub trait ClusterScoped {
    fn clusters(&self) -> &[String];
    fn project_groups(&self) -> &[String];
    fn offered_in(&self, cluster: &str) -> bool {
        self.clusters().is_empty() || self.clusters().iter().any(|c| c == cluster)
    }
    fn offered_to(&self, group: &str) -> bool {
        self.project_groups().is_empty() || self.project_groups().iter().any(|g| g == group)
    }
}
impl ClusterScoped for Image {
    fn clusters(&self) -> &[String] {
        &self.clusters
    }
    fn project_groups(&self) -> &[String] {
        &self.project_groups
    }
}
impl ClusterScoped for Volume {
    fn clusters(&self) -> &[String] {
        &self.clusters
    }
    fn project_groups(&self) -> &[String] {
        &self.project_groups
    }
}
impl ClusterScoped for DataAsset {
    fn clusters(&self) -> &[String] {
        &self.clusters
    }
    fn project_groups(&self) -> &[String] {
        &self.project_groups
    }
}

/// A catalog file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("catalog is not valid YAML or does not match the catalog schema: {0}")]
    Parse(String),
    #[error("catalog is inconsistent:\n  {}", .0.join("\n  "))]
    Inconsistent(Vec<String>),
}

impl Catalog {
    /// Reads a catalog from YAML (or JSON) and checks that its references hold together.
    pub fn from_yaml(text: &str) -> Result<Catalog, CatalogError> {
        let catalog: Catalog =
            serde_saphyr::from_str(text).map_err(|e| CatalogError::Parse(e.to_string()))?;
        let problems = catalog.check();
        if problems.is_empty() { Ok(catalog) } else { Err(CatalogError::Inconsistent(problems)) }
    }

    /// Every dangling reference and impossible shape in the catalog itself.
    pub fn check(&self) -> Vec<String> {
        let mut out = Vec::new();
        let placement =
            self.pools.iter().map(|(n, p)| (format!("pool {n}"), &p.tolerations, &p.node_selector));
        let placement = placement.chain(
            self.instance_specs
                .iter()
                .map(|(n, s)| (format!("instance spec {n}"), &s.tolerations, &s.node_selector)),
        );
        for (what, tolerations, selector) in placement {
            for (i, t) in tolerations.iter().enumerate() {
                out.extend(t.problems().into_iter().map(|why| format!("{what}: tolerations[{i}]: {why}")));
            }
            for (k, v) in selector {
                if !kube_names::is_label_key(k) || !kube_names::is_label_value(v) {
                    out.push(format!("{what}: nodeSelector {k}={v:?} is not a valid Kubernetes label"));
                }
            }
        }
        for (name, i) in &self.images {
            if i.run_as_user == Some(0) {
                out.push(format!(
                    "image {name}: runAsUser 0 is root; leave it out for an image that runs as root"
                ));
            }
            if i.run_as_group.is_some() && i.run_as_user.is_none() {
                out.push(format!("image {name}: runAsGroup goes with runAsUser"));
            }
        }
        for (name, c) in &self.clusters {
            if !self.regions.contains_key(&c.region) {
                out.push(format!("cluster {name}: region {:?} does not exist", c.region));
            }
        }
        for (name, r) in &self.registries {
            for host in std::iter::once(name).chain(&r.mirrors) {
                if let Err(why) = crate::image_ref::check_registry(host) {
                    out.push(format!("registry {name}: {why}"));
                }
            }
            if matches!(name.as_str(), "index.docker.io" | "registry-1.docker.io") {
                out.push(format!(
                    "registry {name}: name Docker Hub docker.io (references to it are read so)"
                ));
            }
        }
        for (name, i) in &self.images {
            if let Some(v) = &i.ray_version {
                if !i.ray {
                    out.push(format!("image {name}: rayVersion {v:?} on an image without Ray (ray: false)"));
                } else if ray_version(v).is_none() {
                    out.push(format!("image {name}: rayVersion {v:?} is not a version like 2.60.0"));
                }
            }
            let Some(r) = &i.reference else { continue };
            match crate::image_ref::ImageRef::parse(r) {
                Err(why) => out.push(format!("image {name}: reference {r:?}: {why}")),
                Ok(p) if !self.registries.is_empty() && !self.registries.contains_key(&p.registry) => out.push(
                    format!("image {name}: reference {r:?} comes from registry {}, which registries does not list", p.registry),
                ),
                Ok(_) if i.rootfs.is_some() => {
                    out.push(format!("image {name}: give rootfs or reference, not both"))
                }
                Ok(_) => {}
            }
        }
        for (name, p) in &self.pools {
            if !self.clusters.contains_key(&p.cluster) {
                out.push(format!("pool {name}: cluster {:?} does not exist", p.cluster));
            }
            for s in &p.instance_specs {
                if !self.instance_specs.contains_key(s) {
                    out.push(format!("pool {name}: instance spec {s:?} does not exist"));
                }
            }
        }
        for (name, s) in &self.instance_specs {
            match (s.kind, s.gpus, &s.gpu_model) {
                (InstanceKind::Gpu, 0, _) => {
                    out.push(format!("instance spec {name}: a GPU spec needs gpus > 0"))
                }
                (InstanceKind::Gpu, _, None) => {
                    out.push(format!("instance spec {name}: a GPU spec needs gpuModel"))
                }
                (InstanceKind::Cpu, g, m) if g > 0 || m.is_some() => {
                    out.push(format!("instance spec {name}: a CPU spec has no GPUs"))
                }
                _ => {}
            }
            if s.vcpus == 0 || s.memory_mib == 0 {
                out.push(format!("instance spec {name}: vcpus and memoryMib must be positive"));
            }
            if let Some(r) = &s.gpu_resource {
                if s.gpus == 0 {
                    out.push(format!("instance spec {name}: gpuResource {r:?} on a spec without GPUs"));
                }
                if let Some(why) = kube_names::extended_resource_problem(r) {
                    out.push(format!("instance spec {name}: gpuResource: {why}"));
                }
            }
            for (r, n) in &s.extra_resources {
                if let Some(why) = kube_names::extended_resource_problem(r) {
                    out.push(format!("instance spec {name}: extraResources: {why}"));
                } else if r == s.gpu_resource() && s.gpus > 0 {
                    out.push(format!(
                        "instance spec {name}: extraResources: {r:?} is the spec's GPUs (gpus)"
                    ));
                }
                if *n == 0 {
                    out.push(format!("instance spec {name}: extraResources: {r:?} must be at least 1"));
                }
            }
        }
        for (name, n) in &self.nodes {
            if !self.pools.contains_key(&n.pool) {
                out.push(format!("node {name}: pool {:?} does not exist", n.pool));
            }
            if (n.gpus > 0) != n.gpu_model.is_some() {
                out.push(format!("node {name}: gpus and gpuModel go together"));
            }
        }
        for q in &self.quotas {
            if !self.project_groups.contains_key(&q.group) {
                out.push(format!("quota: project group {:?} does not exist", q.group));
            }
            match self.pools.get(&q.pool) {
                None => out.push(format!("quota: pool {:?} does not exist", q.pool)),
                Some(p) if !p.instance_specs.contains(&q.spec) => {
                    out.push(format!("quota: pool {:?} does not offer {:?}", q.pool, q.spec))
                }
                Some(_) => {}
            }
        }
        let scoped = self.images.iter().map(|(n, i)| ("image", n, i.clusters()));
        let scoped = scoped
            .chain(self.volumes.iter().map(|(n, v)| ("volume", n, v.clusters())))
            .chain(self.datasets.iter().map(|(n, v)| ("dataset", n, v.clusters())))
            .chain(self.models.iter().map(|(n, v)| ("model", n, v.clusters())));
        let grouped = self.images.iter().map(|(n, i)| ("image", n, i.project_groups()));
        let grouped = grouped
            .chain(self.volumes.iter().map(|(n, v)| ("volume", n, v.project_groups())))
            .chain(self.datasets.iter().map(|(n, v)| ("dataset", n, v.project_groups())))
            .chain(self.models.iter().map(|(n, v)| ("model", n, v.project_groups())));
        for (what, name, clusters) in scoped {
            for c in clusters {
                if !self.clusters.contains_key(c) {
                    out.push(format!("{what} {name}: cluster {c:?} does not exist"));
                }
            }
        }
        for (what, name, groups) in grouped {
            for g in groups {
                if !self.project_groups.contains_key(g) {
                    out.push(format!("{what} {name}: project group {g:?} does not exist"));
                }
            }
        }
        out
    }

    /// The catalog as a member of `groups` reads it: of the images, volumes, datasets and models only those
    /// offered to one of the groups (the [`HOST_IMAGE`] only when its entry lists one of them: for others it is
    /// an admin's), of the project groups and quota lines only theirs, and the rest (regions, clusters,
    /// pools, instance specs, nodes, registries, labels) whole. A kept entry's `projectGroups` keeps only
    /// `groups`' names, so that no other group's name shows and the view holds together by itself
    /// ([`Catalog::check`] finds nothing new in it). Admins read the catalog whole.
    pub fn seen_by(&self, groups: &[String]) -> Catalog {
        let mine = |g: &String| groups.contains(g);
        fn offered<T: ClusterScoped + Clone>(
            entries: &BTreeMap<String, T>,
            groups: &[String],
            listed: fn(&mut T) -> &mut Vec<String>,
            kept: impl Fn(&str, &T) -> bool,
        ) -> BTreeMap<String, T> {
            entries
                .iter()
                .filter(|(name, e)| groups.iter().any(|g| e.offered_to(g)) && kept(name, e))
                .map(|(name, e)| {
                    let mut e = e.clone();
                    listed(&mut e).retain(|g| groups.contains(g));
                    (name.clone(), e)
                })
                .collect()
        }
        let images = offered(
            &self.images,
            groups,
            |i| &mut i.project_groups,
            |name, i| name != HOST_IMAGE || i.project_groups.iter().any(|g| groups.contains(g)),
        );
        Catalog {
            project_groups: self
                .project_groups
                .iter()
                .filter(|(g, _)| mine(g))
                .map(|(g, p)| (g.clone(), p.clone()))
                .collect(),
            images,
            volumes: offered(&self.volumes, groups, |v| &mut v.project_groups, |_, _| true),
            datasets: offered(&self.datasets, groups, |d| &mut d.project_groups, |_, _| true),
            models: offered(&self.models, groups, |m| &mut m.project_groups, |_, _| true),
            quotas: self.quotas.iter().filter(|q| mine(&q.group)).cloned().collect(),
            ..self.clone()
        }
    }

    /// Nodes of a pool, in name order.
    pub fn pool_nodes<'a>(&'a self, pool: &'a str) -> impl Iterator<Item = (&'a String, &'a Node)> + 'a {
        self.nodes.iter().filter(move |(_, n)| n.pool == pool)
    }
}

impl InstanceSpec {
    /// Whether a node of this shape can ever take one unit of this spec: the GPU model matches (CPU specs
    /// go to CPU nodes), and the node is large enough. The scheduler uses the same rule with free capacity.
    pub fn matches_node(&self, node_gpu_model: Option<&str>) -> bool {
        self.gpu_model.as_deref() == node_gpu_model
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_catalog_leaves_out_is_empty_or_closed() {
        let empty = Catalog::from_yaml("{}").unwrap();
        assert!(!empty.allow_external_images, "external images are allowed only when the catalog says so");
        assert_eq!(empty, Catalog::default());
        assert!(Catalog::from_yaml("allowExternalImages: true").unwrap().allow_external_images);
    }

    #[test]
    fn a_pools_tolerations_are_checked_as_kubernetes_would() {
        let text = r#"
regions: {r: {}}
clusters: {c: {region: r}}
pools:
  gpu:
    cluster: c
    instanceSpecs: []
    tolerations:
      - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
      - {key: dedicated, value: ml}
      - {key: a, operator: Exists, value: x}
      - {operator: Equal}
      - {key: b, operator: Near, effect: Sometimes}
"#;
        let Err(CatalogError::Inconsistent(problems)) = Catalog::from_yaml(text) else { panic!("accepted") };
        assert_eq!(
            problems,
            [
                "pool gpu: tolerations[2]: operator Exists takes no value",
                "pool gpu: tolerations[3]: an empty key needs operator Exists",
                "pool gpu: tolerations[4]: operator \"Near\" is not Equal or Exists",
                "pool gpu: tolerations[4]: effect \"Sometimes\" is not NoSchedule, PreferNoSchedule or NoExecute",
            ]
        );
        let fine = text.split("      - {key: a,").next().unwrap();
        let c = Catalog::from_yaml(fine).unwrap();
        assert_eq!(c.pools["gpu"].tolerations.len(), 2);
    }

    #[test]
    fn image_references_and_registries_are_checked_together() {
        let text = r#"
registries: {registry.example: {mirrors: [mirror.example:5000]}, index.docker.io: {}}
images:
  ok: {reference: "registry.example/ml/torch:2.3"}
  elsewhere: {reference: "other.example/ml/torch:2.3"}
  broken: {reference: "Registry.Example/UPPER:"}
  both: {reference: "registry.example/x:1", rootfs: /images/x}
"#;
        let Err(CatalogError::Inconsistent(problems)) = Catalog::from_yaml(text) else { panic!("accepted") };
        let all = problems.join("\n");
        assert!(all.contains("registry index.docker.io: name Docker Hub docker.io"), "{all}");
        assert!(all.contains("image elsewhere") && all.contains("which registries does not list"), "{all}");
        assert!(all.contains("image broken: reference"), "{all}");
        assert!(all.contains("image both: give rootfs or reference, not both"), "{all}");
        assert!(!all.contains("image ok"), "{all}");
        assert_eq!(problems.len(), 4, "{all}");
    }

    #[test]
    fn an_images_ray_version_is_a_version_of_an_image_with_ray() {
        let text = r#"
images:
  new: {ray: true, rayVersion: "2.60.0"}
  old: {ray: true, rayVersion: "2.46"}
  unsaid: {ray: true}
  noray: {rayVersion: "2.60.0"}
  bad: {ray: true, rayVersion: "latest"}
"#;
        let Err(CatalogError::Inconsistent(problems)) = Catalog::from_yaml(text) else { panic!("accepted") };
        let all = problems.join("\n");
        assert!(all.contains("image noray: rayVersion \"2.60.0\" on an image without Ray"), "{all}");
        assert!(all.contains("image bad: rayVersion \"latest\" is not a version"), "{all}");
        assert_eq!(problems.len(), 2, "{all}");
        let ok = Catalog::from_yaml(
            &text.replace("  noray: {rayVersion: \"2.60.0\"}\n", "").replace("latest", "2.52.1"),
        )
        .unwrap();
        let token = |n: &str| ok.images[n].ray_token_auth();
        assert!(token("new") && token("bad") && !token("old") && !token("unsaid"));
        assert_eq!(ray_version("2.60.0.1"), None);
    }

    /// What a member of `groups` reads of a catalog with entries for groups a and b: (images, volumes,
    /// datasets, models, project groups, quota groups), each by name, and each kept entry's groups.
    fn check_seen_by(groups: &[&str], expected: [&[&str]; 6], trimmed: &[(&str, &[&str])]) {
        let text = r#"
regions: {r: {}}
clusters: {c: {region: r}}
pools: {p: {cluster: c, instanceSpecs: [s]}}
instanceSpecs: {s: {kind: CPU, vcpus: 1, memoryMib: 1}}
nodes: {n: {pool: p, vcpus: 1, memoryMib: 1}}
projectGroups: {a: {}, b: {}, c: {}}
registries: {reg.example: {}}
images:
  host: {projectGroups: [a]}
  all: {reference: "reg.example/all:1"}
  a-private: {reference: "reg.example/a/private:1", projectGroups: [a]}
  a-and-b: {reference: "reg.example/ab:1", projectGroups: [a, b]}
volumes: {v-a: {projectGroups: [a]}, v-all: {}}
datasets: {d-b: {projectGroups: [b]}}
models: {m-ab: {projectGroups: [a, b]}}
quotas:
  - {group: a, resourceType: Reserved, pool: p, spec: s, units: 1}
  - {group: b, resourceType: Reserved, pool: p, spec: s, units: 1}
"#;
        let catalog = Catalog::from_yaml(text).unwrap();
        let groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        let seen = catalog.seen_by(&groups);
        let names = |m: Vec<&String>| m.into_iter().cloned().collect::<Vec<_>>();
        let got = [
            names(seen.images.keys().collect()),
            names(seen.volumes.keys().collect()),
            names(seen.datasets.keys().collect()),
            names(seen.models.keys().collect()),
            names(seen.project_groups.keys().collect()),
            seen.quotas.iter().map(|q| q.group.clone()).collect(),
        ];
        assert_eq!(got, expected.map(|e| e.iter().map(|x| x.to_string()).collect::<Vec<_>>()), "{groups:?}");
        for (image, want) in trimmed {
            assert_eq!(seen.images[*image].project_groups, *want, "{groups:?}: image {image}");
        }
        assert_eq!(seen.check(), Vec::<String>::new(), "the view holds together");
        let whole = [
            seen.regions == catalog.regions,
            seen.nodes == catalog.nodes,
            seen.registries == catalog.registries,
        ];
        assert_eq!(whole, [true; 3], "what is not a group's stays whole");
    }

    #[test]
    fn a_member_reads_only_what_is_offered_to_their_groups() {
        check_seen_by(
            &["b"],
            [&["a-and-b", "all"], &["v-all"], &["d-b"], &["m-ab"], &["b"], &["b"]],
            &[("a-and-b", &["b"]), ("all", &[])],
        );
        check_seen_by(
            &["a"],
            [&["a-and-b", "a-private", "all", "host"], &["v-a", "v-all"], &[], &["m-ab"], &["a"], &["a"]],
            &[("a-and-b", &["a"]), ("host", &["a"])],
        );
        check_seen_by(
            &["a", "b"],
            [
                &["a-and-b", "a-private", "all", "host"],
                &["v-a", "v-all"],
                &["d-b"],
                &["m-ab"],
                &["a", "b"],
                &["a", "b"],
            ],
            &[("a-and-b", &["a", "b"])],
        );
        // A group with no entries of its own sees what is offered to all (not the host image: an admin's).
        check_seen_by(&["c"], [&["all"], &["v-all"], &[], &[], &["c"], &[]], &[]);
        check_seen_by(&[], [&[], &[], &[], &[], &[], &[]], &[]);
    }
}
