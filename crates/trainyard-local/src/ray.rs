//! RayJobs on the local backend: the head's and the workers' commands, their ports, and the driver's
//! runtime env.

use super::sandbox::RUNTIME_DIR;

/// Reads a Ray cluster's nodes and pending demand from its GCS (the head waits on it; autoscaling reads it).
pub const RAY_PROBE_PY: &str = include_str!("ray_probe.py");

/// The first of a Ray node's ports (GCS, client server, raylet, agents, workers up to +99). Every node has a
/// network namespace of its own, so every node of every cluster uses the same ones.
pub(super) const RAY_BASE_PORT: u16 = 30_000;

/// The runtime env of a RayJob as Ray's driver reads it from `RAY_JOB_CONFIG_JSON_ENV_VAR`.
pub(super) fn ray_job_config(s: &trainyard_core::spec::TaskSpec) -> Result<Option<String>, String> {
    let Some(text) =
        s.ray.as_ref().and_then(|r| r.runtime_env_yaml.as_ref()).filter(|t| !t.trim().is_empty())
    else {
        return Ok(None);
    };
    let env = trainyard_core::parse::yaml_to_value(text).map_err(|e| format!("the Ray runtime env: {e}"))?;
    Ok(Some(serde_json::json!({ "runtime_env": env }).to_string()))
}

/// Ports of a Ray node whose ports start at `base`: (node manager, object manager, metrics,
/// dashboard agent HTTP, dashboard agent gRPC, runtime env agent, first and last worker port).
pub(super) fn ray_node_ports(base: u16) -> String {
    let o = base;
    format!(
        "--node-manager-port={} --object-manager-port={} --metrics-export-port={} --dashboard-agent-listen-port={} --dashboard-agent-grpc-port={} --runtime-env-agent-port={} --min-worker-port={} --max-worker-port={}",
        o + 10,
        o + 11,
        o + 12,
        o + 13,
        o + 14,
        o + 15,
        o + 20,
        o + 99
    )
}

/// The replica a Ray node runs in: its name and role (`head` or `worker`).
pub(super) struct RayNode<'a> {
    pub(super) name: &'a str,
    pub(super) role: &'a str,
}

/// Where a Ray node is: its cluster's first port, its own address and the head's.
pub(super) struct RayAt {
    pub(super) base: u16,
    pub(super) me: std::net::Ipv4Addr,
    pub(super) head: std::net::Ipv4Addr,
}

/// A RayJob replica's command. The head starts Ray, waits for every worker, then runs the entrypoint in its
/// own sandbox (a driver must see its node's raylet): the entrypoint's output is the head's log and its exit
/// status the task's. Workers join the head and run until stopped.
pub(super) fn ray_command(
    r: &RayNode,
    res: &trainyard_core::Resources,
    at: &RayAt,
    nodes: usize,
    keep_s: u32,
) -> String {
    let (base, me, head) = (at.base, at.me, at.head);
    let gcs = base + 1;
    let common = format!(
        "--block --disable-usage-stats --node-ip-address={me} --temp-dir=/tmp/ray/{} --num-cpus={} --num-gpus={} --memory={} {}",
        short(r.name),
        res.vcpus.max(1),
        res.gpus,
        res.memory_mib * 1024 * 1024,
        ray_node_ports(base)
    );
    if r.role != "head" {
        // A custom resource names the replica, so idle Ray nodes can be matched to replicas.
        return format!(
            "until python3 -c 'import socket; socket.create_connection((\"{head}\", {gcs}), 1)' 2>/dev/null; do sleep 0.2; done\nexec ray start --address={head}:{gcs} --resources='{{\"TY:{}\": 1}}' {common}",
            r.name
        );
    }
    let keep = if keep_s > 0 {
        format!("echo \"trainyard: debug mode keeps the Ray cluster for {keep_s} s\"\nsleep {keep_s}\n")
    } else {
        String::new()
    };
    format!(
        r#"ray start --head --port={gcs} --ray-client-server-port={client} --include-dashboard=false {common} > {RUNTIME_DIR}/ray-head.log 2>&1 &
ray_pid=$!
python3 - {RUNTIME_DIR} {head}:{gcs} {nodes} $ray_pid <<'PY' || {{ tail -20 {RUNTIME_DIR}/ray-head.log >&2; exit 1; }}
import os, sys, time
sys.path.insert(0, sys.argv[1])
import ray_probe
addr, need, head, t0 = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), time.time()
while time.time() - t0 < 600:
    try:
        os.kill(head, 0)
    except ProcessLookupError:
        sys.exit("trainyard: the Ray head did not start; the end of its log follows")
    try:
        n = sum(1 for x in ray_probe.probe(addr, 2.0, 10)["nodes"] if x["alive"])
    except Exception:
        n = 0
    if n >= need:
        print(f"trainyard: the Ray cluster is up with {{n}} nodes after {{time.time() - t0:.1f}} s", flush=True)
        sys.exit(0)
    time.sleep(0.3)
sys.exit("trainyard: the Ray cluster did not come up within 600 s")
PY
if [ -n "${{TRAINYARD_RAY_AUTOSCALE:-}}" ]; then
python3 - {RUNTIME_DIR} {head}:{gcs} <<'PY' &
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import ray_probe
out = os.path.join(sys.argv[1], "ray-state.json")
while True:
    try:
        state = ray_probe.probe(sys.argv[2], 2.0, 1000)
        with open(out + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(out + ".tmp", out)
    except Exception as e:
        print("trainyard: the Ray probe failed:", e, file=sys.stderr, flush=True)
    time.sleep(2)
PY
fi
bash -c "$TRAINYARD_ENTRYPOINT"
code=$?
echo "trainyard: the entrypoint exited with code $code"
{keep}kill -TERM $ray_pid 2>/dev/null
for _ in $(seq 1 100); do kill -0 $ray_pid 2>/dev/null || break; sleep 0.1; done
exit $code
"#,
        client = base + 2,
    )
}

/// Ray puts Unix sockets under its temp dir; keep the path short.
pub(super) fn short(name: &str) -> String {
    let h = name.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3));
    format!("{:x}", h & 0xffff_ffff)
}
