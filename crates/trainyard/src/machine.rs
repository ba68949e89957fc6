//! This machine as `trainyard up` first describes it: what it has (vCPUs, memory, GPUs, torch and Ray), and
//! the one-pool catalog of virtual nodes it is split into.

use anyhow::Result;

/// What this machine has, for the first catalog.
#[derive(Debug)]
pub(crate) struct Machine {
    pub(crate) vcpus: u32,
    pub(crate) memory_mib: u64,
    /// (model, count, memory per GPU in MiB)
    pub(crate) gpus: Option<(String, u32)>,
    pub(crate) torch: bool,
    pub(crate) ray: bool,
}

pub(crate) fn detect() -> Machine {
    let vcpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let memory_mib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(1024, |kib| kib / 1024);
    let gpus = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=name", "--format=csv,noheader"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            let names: Vec<String> = String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(|l| l.trim().to_owned())
                .filter(|l| !l.is_empty())
                .collect();
            let first = names.first()?.clone();
            // "NVIDIA H200" -> "H200": the model name specs and nodes match on.
            let model = first.split_whitespace().last().unwrap_or(&first).to_owned();
            Some((model, names.len() as u32))
        });
    // What a `host` replica sees: this PATH less what the sandbox hides.
    let path = trainyard_local::sandbox_path(&std::env::var_os("PATH").unwrap_or_default());
    let has = |module: &str| {
        std::process::Command::new("python3")
            .env("PATH", &path)
            .args([
                "-c",
                &format!(
                    "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('{module}') else 1)"
                ),
            ])
            .status()
            .is_ok_and(|s| s.success())
    };
    // Replicas of the `host` image see this machine's PATH, so Ray counts when `ray` is on it.
    let ray = has("ray") && std::env::split_paths(&path).any(|d| d.join("ray").is_file());
    Machine { vcpus, memory_mib, gpus, torch: has("torch"), ray }
}

/// The most virtual nodes this machine splits into: each needs a vCPU of its own (and, when there are GPUs,
/// a GPU of its own: every node then is a GPU node).
fn max_nodes(m: &Machine) -> u32 {
    let cpus = m.vcpus.max(1);
    m.gpus.as_ref().map_or(cpus, |(_, count)| cpus.min((*count).max(1)))
}

/// A catalog describing this machine: region `local`, cluster `local`, pool `default`, `n` nodes, a few specs
/// and quotas for the `default` group so a first task can be submitted at once. More nodes than
/// [`max_nodes`] are refused, with why.
pub(crate) fn local_catalog(m: &Machine, n: u32) -> Result<String> {
    let limit = max_nodes(m);
    if n > limit {
        let why = match &m.gpus {
            Some((model, count)) if *count < m.vcpus => {
                format!("it has {count} × {model} GPU and each virtual node needs a GPU of its own")
            }
            _ => format!("it has {} vCPU and each virtual node needs a vCPU of its own", m.vcpus),
        };
        anyhow::bail!("--nodes {n}: this machine splits into at most {limit} virtual node(s): {why}");
    }
    let n = n.max(1);
    let mem_per_cpu = (m.memory_mib / u64::from(m.vcpus.max(1))).clamp(512, 4096);
    let (node_vcpus, node_mib) = (m.vcpus / n, m.memory_mib / u64::from(n));
    let mut specs = format!("  cpu.small: {{kind: CPU, vcpus: 1, memoryMib: {mem_per_cpu}}}\n");
    let mut pool_specs = vec!["cpu.small".to_owned()];
    let mut quotas = format!(
        "  - {{group: default, resourceType: Reserved, pool: default, spec: cpu.small, units: {}}}\n",
        m.vcpus
    );
    // cpu.large: half a node, and at least 2 vCPUs, so it is never cpu.small again; a node of one vCPU
    // has none.
    if node_vcpus >= 2 {
        let large = (node_vcpus / 2).max(2);
        let large_mib = (mem_per_cpu * u64::from(large)).min(node_mib);
        specs.push_str(&format!("  cpu.large: {{kind: CPU, vcpus: {large}, memoryMib: {large_mib}}}\n"));
        pool_specs.push("cpu.large".to_owned());
        quotas.push_str(&format!(
            "  - {{group: default, resourceType: Reserved, pool: default, spec: cpu.large, units: {}}}\n",
            n * (node_vcpus / large)
        ));
    }
    let node_name = |i: u32| if n == 1 { "local-cpu".to_owned() } else { format!("local-{}", i + 1) };
    let mut nodes: String = (0..n)
        .map(|i| {
            format!("  {}: {{pool: default, vcpus: {node_vcpus}, memoryMib: {node_mib}}}\n", node_name(i))
        })
        .collect();
    if let Some((model, count)) = &m.gpus {
        let spec = format!("gpu.{}.1", model.to_lowercase());
        let (cpu_per_gpu, mem_per_gpu) = ((m.vcpus / count).max(1), m.memory_mib / u64::from(*count));
        specs.push_str(&format!("  {spec}: {{kind: GPU, gpuModel: {model}, gpus: 1, vcpus: {cpu_per_gpu}, memoryMib: {mem_per_gpu}}}\n"));
        let per = (count / n).max(1);
        nodes = (0..n)
            .map(|i| {
                let devices: Vec<String> = (i * per..(i + 1) * per).map(|d| d.to_string()).collect();
                let name = if n == 1 { "local-gpu".to_owned() } else { format!("local-gpu-{}", i + 1) };
                format!(
                    "  {name}: {{pool: default, gpuModel: {model}, gpus: {per}, gpuDevices: [{}], vcpus: {node_vcpus}, memoryMib: {node_mib}}}\n",
                    devices.join(", "),
                )
            })
            .collect();
        quotas.push_str(&format!(
            "  - {{group: default, resourceType: Reserved, pool: default, spec: {spec}, units: {count}}}\n"
        ));
        pool_specs.push(spec);
    }
    Ok(format!(
        "# This machine, as `trainyard up` found it on first start. It seeds the catalog in the store; change\n\
         # it later with `trainyard admin catalog set -f FILE`.\n\
         regions: {{local: {{displayName: This machine}}}}\n\
         clusters: {{local: {{region: local}}}}\n\
         pools:\n  default: {{cluster: local, instanceSpecs: [{}]}}\n\
         instanceSpecs:\n{specs}\
         nodes:\n{nodes}\
         projectGroups: {{default: {{}}}}\n\
         images:\n  host: {{torch: {}, ray: {}}}\n\
         allowExternalImages: false\n\
         quotas:\n{quotas}",
        pool_specs.join(", "),
        m.torch,
        m.ray
    ))
}

#[cfg(test)]
mod tests {
    use super::{Machine, local_catalog};
    use trainyard_core::Catalog;

    fn machine(vcpus: u32, memory_mib: u64, gpus: Option<u32>) -> Machine {
        Machine { vcpus, memory_mib, gpus: gpus.map(|n| ("H200".to_owned(), n)), torch: true, ray: false }
    }

    fn catalog(m: &Machine, n: u32) -> Catalog {
        Catalog::from_yaml(&local_catalog(m, n).unwrap()).unwrap()
    }

    #[test]
    fn nodes_past_one_per_vcpu_or_gpu_are_refused_with_why() {
        let e = local_catalog(&machine(2, 8192, None), 3).unwrap_err().to_string();
        assert_eq!(
            e,
            "--nodes 3: this machine splits into at most 2 virtual node(s): it has 2 vCPU and each virtual node \
             needs a vCPU of its own"
        );
        let e = local_catalog(&machine(16, 131072, Some(1)), 2).unwrap_err().to_string();
        assert!(e.contains("at most 1 virtual node(s): it has 1 × H200 GPU"), "{e}");
        assert_eq!(catalog(&machine(2, 8192, None), 2).nodes.len(), 2);
        assert_eq!(catalog(&machine(16, 131072, Some(8)), 8).nodes.len(), 8);
    }

    #[test]
    fn cpu_large_is_larger_than_cpu_small_and_fits_a_node() {
        for (m, n) in [
            (machine(2, 8192, None), 1),
            (machine(4, 16384, None), 2),
            (machine(16, 65536, None), 4),
            (machine(16, 131072, Some(1)), 1),
            (machine(64, 1 << 20, Some(8)), 4),
        ] {
            let c = catalog(&m, n);
            let (small, large) = (&c.instance_specs["cpu.small"], &c.instance_specs["cpu.large"]);
            assert!(large.vcpus >= 2 && large.vcpus > small.vcpus, "{m:?} / {n}: {large:?}");
            let node = c.nodes.values().next().unwrap();
            assert!(large.vcpus <= node.vcpus && large.memory_mib <= node.memory_mib, "{m:?} / {n}");
            // Its quota lets a task of one cpu.large replica in.
            assert!(c.quotas.iter().any(|q| q.spec == "cpu.large" && q.units >= 1), "{m:?} / {n}");
            assert!(c.check().is_empty(), "{:?}", c.check());
        }
        // Nodes of one vCPU have no room for it.
        let c = catalog(&machine(2, 8192, None), 2);
        assert!(
            !c.instance_specs.contains_key("cpu.large") && c.check().is_empty(),
            "{:?}",
            c.instance_specs
        );
    }
}
