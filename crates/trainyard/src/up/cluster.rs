//! `up --backend kubernetes`: connecting to a cluster, and the catalog a first start writes from its nodes.

use anyhow::Result;
use trainyard_kube::{KubeBackend, KubeConfig};

/// The Kubernetes backend of one kubeconfig context, its watches listed.
pub(super) async fn connect_kube(cfg: KubeConfig) -> Result<KubeBackend> {
    let kube = KubeBackend::connect(cfg).await.map_err(|e| anyhow::anyhow!("the Kubernetes backend: {e}"))?;
    if !kube.synced(std::time::Duration::from_secs(60)).await {
        anyhow::bail!("the Kubernetes backend: the watches did not list the cluster's objects within 60 s");
    }
    Ok(kube)
}

/// A first catalog for a cluster: its nodes as they are now, their pools, a CPU instance spec and one per GPU
/// model, and the default group's reserved quota over all of it.
pub(super) fn cluster_catalog(
    nodes: &std::collections::BTreeMap<String, trainyard_core::catalog::Node>,
) -> String {
    use std::collections::BTreeMap;
    let mut pools: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut specs = String::from("  cpu.small: {kind: CPU, vcpus: 1, memoryMib: 2048}\n");
    let mut gpu_models: BTreeMap<&str, (u32, u32, u64)> = BTreeMap::new();
    let mut vcpus = 0u32;
    let mut lines = String::new();
    for (name, n) in nodes {
        pools.entry(n.pool.as_str()).or_default();
        vcpus += n.vcpus;
        match &n.gpu_model {
            Some(model) => {
                let e = gpu_models.entry(model.as_str()).or_insert((0, u32::MAX, u64::MAX));
                e.0 += n.gpus;
                e.1 = e.1.min(n.vcpus / n.gpus.max(1));
                e.2 = e.2.min(n.memory_mib / u64::from(n.gpus.max(1)));
                lines.push_str(&format!(
                    "  {name}: {{pool: {}, gpuModel: {model}, gpus: {}, vcpus: {}, memoryMib: {}}}\n",
                    n.pool, n.gpus, n.vcpus, n.memory_mib
                ));
            }
            None => lines.push_str(&format!(
                "  {name}: {{pool: {}, vcpus: {}, memoryMib: {}}}\n",
                n.pool, n.vcpus, n.memory_mib
            )),
        }
    }
    if pools.is_empty() {
        pools.insert("default", Vec::new());
    }
    let mut all_specs = vec!["cpu.small".to_owned()];
    let mut quotas = String::new();
    for (model, (_, cpu, mem)) in &gpu_models {
        let spec =
            format!("gpu.{}.1", model.to_lowercase().replace(|c: char| !c.is_ascii_alphanumeric(), "-"));
        specs.push_str(&format!(
            "  {spec}: {{kind: GPU, gpuModel: {model}, gpus: 1, vcpus: {}, memoryMib: {}}}\n",
            (*cpu).max(1),
            mem.max(&1024)
        ));
        all_specs.push(spec);
    }
    for pool in pools.keys() {
        quotas.push_str(&format!(
            "  - {{group: default, resourceType: Reserved, pool: {pool}, spec: cpu.small, units: {}}}\n",
            vcpus.max(1)
        ));
        for (model, (count, _, _)) in &gpu_models {
            let spec =
                format!("gpu.{}.1", model.to_lowercase().replace(|c: char| !c.is_ascii_alphanumeric(), "-"));
            quotas.push_str(&format!(
                "  - {{group: default, resourceType: Reserved, pool: {pool}, spec: {spec}, units: {count}}}\n"
            ));
        }
    }
    let pools: String = pools
        .keys()
        .map(|p| format!("  {p}: {{cluster: kubernetes, instanceSpecs: [{}]}}\n", all_specs.join(", ")))
        .collect();
    format!(
        "# The cluster's nodes, as `trainyard up --backend kubernetes` found them on first start. It seeds the\n\
         # catalog in the store; change it later with `trainyard admin catalog set -f FILE`.\n\
         regions: {{kubernetes: {{displayName: Kubernetes}}}}\n\
         clusters: {{kubernetes: {{region: kubernetes}}}}\n\
         pools:\n{pools}\
         instanceSpecs:\n{specs}\
         nodes:\n{lines}\
         projectGroups: {{default: {{}}}}\n\
         images: {{}}\n\
         allowExternalImages: true\n\
         quotas:\n{quotas}"
    )
}
