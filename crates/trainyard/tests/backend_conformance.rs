//! One behaviour suite for every backend: the same scenarios, through the `Backend` trait alone, against the
//! fake backend (`trainyard-runtime`: scripted, on a virtual clock), the local one (`trainyard-local`: real
//! sandboxed replicas, on the wall clock) and the Kubernetes one (`trainyard-kube`: the real API server and
//! operators of the test stack, `scripts/with-kube`, with kwok's pods, and again with real pods on the stack's
//! real nodes). A new backend implements [`Subject`] and runs the same scenarios.
//!
//! Each scenario says what the attempt should do ([`Behaviour`]); a subject makes its backend do that (the
//! fake by a script, the local backend and real pods by the command they run, kwok's pods by the labels its
//! stages follow), then the scenario checks the observations and what `alive` and the logs say.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use trainyard_core::Catalog;
use trainyard_core::lifecycle::Reason;
use trainyard_kube::{KubeBackend, KubeConfig};
use trainyard_local::{LocalBackend, LocalConfig};
use trainyard_runtime::fake::{FakeBackend, Script};
use trainyard_runtime::{AttemptKey, Backend, LaunchSpec, Observation, ReplicaPlan, StopCause};

const CATALOG: &str = r#"
regions: {local: {}}
clusters: {local: {region: local}}
pools: {default: {cluster: local, instanceSpecs: [cpu.small]}}
instanceSpecs: {cpu.small: {kind: CPU, vcpus: 1, memoryMib: 512}}
nodes:
  node-a: {pool: default, vcpus: 4, memoryMib: 4096}
  node-b: {pool: default, vcpus: 4, memoryMib: 4096}
projectGroups: {default: {}}
images: {host: {}}
quotas: [{group: default, resourceType: Reserved, pool: default, spec: cpu.small, units: 8}]
"#;

/// What a scenario wants the attempt to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Behaviour {
    /// Print `hello from RANK` and end well.
    Succeed,
    /// End with a non-zero exit of its own.
    Fail,
    /// Run until stopped, saving a checkpoint when told to.
    RunUntilStopped,
}

/// A backend under the suite, and the way to make it behave.
trait Subject {
    type B: Backend;
    fn backend(&self) -> &Self::B;
    /// The clock the control loop would pass to `poll`.
    fn now_ms(&self) -> u64;
    /// Lets time pass (virtual for the fake).
    fn pass(&self, ms: u64);
    /// The command and any arrangement for an attempt that should behave so.
    fn arrange(&self, key: &AttemptKey, behaviour: Behaviour) -> String;
    /// A new backend over the same state, as after a restart of the server.
    fn restarted(&self) -> Self;
    /// How long a scenario may take on this backend.
    fn patience(&self) -> Duration;
    /// Anything else the attempt needs to behave so (the Kubernetes subject labels it for its simulated
    /// kubelets).
    fn adjust(&self, _spec: &mut LaunchSpec, _behaviour: Behaviour) {}
    /// An attempt with `workers` workers that behaves so.
    fn spec_for(&self, key: &AttemptKey, workers: u32, behaviour: Behaviour) -> LaunchSpec {
        let cmd = self.arrange(key, behaviour);
        let mut sp = spec(key, workers, &cmd);
        self.adjust(&mut sp, behaviour);
        sp
    }
}

struct Fake {
    backend: FakeBackend,
    clock: Arc<std::sync::atomic::AtomicU64>,
}

impl Subject for Fake {
    type B = FakeBackend;
    fn backend(&self) -> &FakeBackend {
        &self.backend
    }
    fn now_ms(&self) -> u64 {
        self.clock.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn pass(&self, ms: u64) {
        self.clock.fetch_add(ms, std::sync::atomic::Ordering::Relaxed);
    }
    fn arrange(&self, key: &AttemptKey, behaviour: Behaviour) -> String {
        let script = match behaviour {
            Behaviour::Succeed => Script { start_ms: 100, run_ms: 1_000, ..Script::default() },
            Behaviour::Fail => {
                Script { start_ms: 100, run_ms: 500, outcome: Reason::UserError, ..Script::default() }
            }
            Behaviour::RunUntilStopped => {
                Script { start_ms: 100, run_ms: u64::MAX / 4, stop_ms: 500, ..Script::default() }
            }
        };
        self.backend.script(&key.task_id, vec![script]);
        "true".into()
    }
    fn restarted(&self) -> Fake {
        // The fake's state lives behind its handle, as a real backend's lives in its engine.
        Fake { backend: self.backend.clone(), clock: self.clock.clone() }
    }
    fn patience(&self) -> Duration {
        Duration::from_secs(5)
    }
}

/// The wall clock in milliseconds, as the server's control loop passes it to real backends.
fn wall_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

struct Local {
    backend: LocalBackend,
    cfg: LocalConfig,
}

impl Subject for Local {
    type B = LocalBackend;
    fn backend(&self) -> &LocalBackend {
        &self.backend
    }
    fn now_ms(&self) -> u64 {
        wall_ms()
    }
    fn pass(&self, ms: u64) {
        std::thread::sleep(Duration::from_millis(ms));
    }
    fn arrange(&self, _key: &AttemptKey, behaviour: Behaviour) -> String {
        command(behaviour)
    }
    fn restarted(&self) -> Local {
        Local { backend: LocalBackend::new(self.cfg.clone()).unwrap(), cfg: self.cfg.clone() }
    }
    fn patience(&self) -> Duration {
        Duration::from_secs(60)
    }
}

/// The command of an attempt that behaves so, on a backend that runs it.
fn command(behaviour: Behaviour) -> String {
    match behaviour {
        Behaviour::Succeed => "echo hello from $RANK".into(),
        Behaviour::Fail => "echo failing; exit 3".into(),
        Behaviour::RunUntilStopped => {
            "trap 'touch $TRAINYARD_RUNTIME_DIR/checkpoint-done' USR1; echo running; \
                                       while true; do sleep 0.1; done"
                .into()
        }
    }
}

/// The Kubernetes backend against the test cluster `scripts/with-kube` starts (a real API server, the real
/// training operator and KubeRay, kwok's simulated nodes): pods do what their `sim.trainyard.dev/*` labels say.
struct Kube {
    backend: KubeBackend,
    cfg: KubeConfig,
    /// The stack's real nodes (`--real-nodes 2`) instead of kwok's: the pods run their commands for real.
    real: Option<Vec<String>>,
}

impl Subject for Kube {
    type B = KubeBackend;
    fn backend(&self) -> &KubeBackend {
        &self.backend
    }
    fn now_ms(&self) -> u64 {
        wall_ms()
    }
    fn pass(&self, ms: u64) {
        std::thread::sleep(Duration::from_millis(ms));
    }
    fn arrange(&self, _key: &AttemptKey, behaviour: Behaviour) -> String {
        // What a real cluster would run; kwok runs nothing and follows the labels `adjust` sets.
        command(behaviour)
    }
    fn adjust(&self, spec: &mut LaunchSpec, behaviour: Behaviour) {
        if let Some(nodes) = &self.real {
            // On the real nodes, whose taint the pool tolerates; the commands run as they are.
            for r in spec.replicas.iter_mut() {
                r.node = nodes[r.rank as usize % nodes.len()].clone();
            }
            let tolerated = CATALOG.replace(
                "pools: {default: {cluster: local, instanceSpecs: [cpu.small]}}",
                "pools: {default: {cluster: local, instanceSpecs: [cpu.small], tolerations: \
                 [{key: trainyard.dev/real, operator: Equal, value: \"true\", effect: NoSchedule}]}}",
            );
            spec.catalog = Arc::new(Catalog::from_yaml(&tolerated).unwrap());
            return;
        }
        let labels = &mut spec.task.metadata.labels;
        match behaviour {
            Behaviour::Succeed => {
                labels.insert(SIM_RUN_MS.into(), "2000".into());
            }
            Behaviour::Fail => {
                labels.insert(SIM_RUN_MS.into(), "1000".into());
                labels.insert(SIM_EXIT_CODE.into(), "3".into());
            }
            Behaviour::RunUntilStopped => {}
        }
    }
    fn restarted(&self) -> Kube {
        let backend = block(KubeBackend::connect(self.cfg.clone())).unwrap();
        assert!(block(backend.synced(Duration::from_secs(30))), "the restarted backend's watches listed");
        Kube { backend, cfg: self.cfg.clone(), real: self.real.clone() }
    }
    fn patience(&self) -> Duration {
        // Real pods pull their image and start their containers on a loaded two-core machine.
        Duration::from_secs(if self.real.is_some() { 180 } else { 90 })
    }
}

const SIM_RUN_MS: &str = "sim.trainyard.dev/run-ms";
const SIM_EXIT_CODE: &str = "sim.trainyard.dev/exit-code";
const SIM_NOT_READY: &str = "sim.trainyard.dev/not-ready";

/// A kwok node of the test cluster (created or updated), with `labels`.
fn kwok_node(client: &trainyard_kube::client::Client, name: &str, labels: serde_json::Value) {
    use trainyard_kube::client::api::{Api, Patch, PatchParams};
    use trainyard_kube::openapi::api::core::v1::Node;
    let nodes: Api<Node> = Api::all(client.clone());
    // A pool of their own: a server under test elsewhere on the cluster (its catalog follows the cluster's
    // nodes in its pools) never places its tasks here.
    let mut all_labels = serde_json::json!({"kubernetes.io/hostname": name, "type": "kwok", "trainyard.dev/pool": "conformance"});
    for (k, v) in labels.as_object().unwrap() {
        all_labels[k] = v.clone();
    }
    let node = serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"}, "labels": all_labels},
    });
    block(nodes.patch(name, &PatchParams::apply("conformance").force(), &Patch::Apply(&node))).unwrap();
    let resources = serde_json::json!({"cpu": "4", "memory": "4Gi", "pods": "110"});
    let status = serde_json::json!({"status": {"capacity": resources, "allocatable": resources}});
    block(nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))).unwrap();
}

/// The settings of a Kubernetes subject named `name`, its `host` image pulled as `host_image`.
fn kube_config(name: &str, host_image: &str) -> KubeConfig {
    KubeConfig {
        namespace: format!("conf-{}-{name}-{{group}}", std::process::id()),
        // Each test is a server of its own on the shared cluster: it manages only its own objects.
        instance: format!("conf-{}-{name}", std::process::id()),
        images: [("host".to_owned(), host_image.to_owned())].into(),
        grace_s: 2,
        // A NotReady node fails its attempts after 2 s here (60 s by default).
        node_grace_s: 2,
        data_dir: std::env::temp_dir().join(format!("ty-conformance-kube-{name}-{}", std::process::id())),
        ..KubeConfig::default()
    }
}

/// A Kubernetes subject of its own: `name` keeps its namespace and objects apart from the other tests' (they run
/// side by side, as threads of one process or as processes, on one cluster).
fn kube(name: &str) -> Kube {
    assert!(
        std::env::var_os("TRAINYARD_KUBE_STACK").is_some(),
        "the Kubernetes backend's suite needs the test cluster: run the tests with scripts/test, which starts it \
         through scripts/with-kube (or run `scripts/with-kube cargo test ...`)"
    );
    let cfg = kube_config(name, "registry.invalid/trainyard/host:1");
    let backend = block(KubeBackend::connect(cfg.clone())).unwrap();
    for node in ["node-a", "node-b"] {
        kwok_node(&backend.client(), node, serde_json::json!({}));
    }
    assert!(block(backend.synced(Duration::from_secs(30))), "the watches listed");
    Kube { backend, cfg, real: None }
}

/// A Kubernetes subject on the stack's real nodes (`scripts/with-kube --real-nodes 2`): kubelets with
/// containerd, the `host` image mapped to the stack's base image (bash, coreutils), so each scenario's command
/// runs for real.
fn kube_real(name: &str) -> Kube {
    let real: Vec<String> = std::env::var("TRAINYARD_KUBE_REAL_NODES")
        .expect("the suite on real nodes needs scripts/with-kube --real-nodes 2 (scripts/test starts it)")
        .split(',')
        .map(str::to_owned)
        .collect();
    let base = std::env::var("TRAINYARD_KUBE_BASE_IMAGE").expect("the stack's base image");
    let cfg = kube_config(name, &base);
    let backend = block(KubeBackend::connect(cfg.clone())).unwrap();
    assert!(block(backend.synced(Duration::from_secs(30))), "the watches listed");
    Kube { backend, cfg, real: Some(real) }
}

fn local(name: &str) -> Local {
    let dir = std::env::temp_dir().join(format!("ty-conformance-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let bwrap = trainyard_local::find_bwrap().expect("bubblewrap is installed");
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_trainyard"));
    let mut cfg = LocalConfig::new(&dir, (exe, vec!["supervise".to_owned()]), bwrap);
    cfg.grace_s = 2;
    trainyard_local::make_passage(&dir).unwrap();
    Local { backend: LocalBackend::new(cfg.clone()).unwrap(), cfg }
}

fn fake() -> Fake {
    Fake { backend: FakeBackend::new(Script::default()), clock: Arc::new(1_000_000.into()) }
}

/// One runtime for the whole suite: the Kubernetes backend's watches and writes run on it between calls.
fn block<T>(f: impl std::future::Future<Output = T>) -> T {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
        })
        .block_on(f)
}

/// An attempt of a PyTorchJob running `cmd` with `workers` workers, its replicas spread over both nodes, with
/// the exit checkpoint on.
fn spec(key: &AttemptKey, workers: u32, cmd: &str) -> LaunchSpec {
    let catalog = Catalog::from_yaml(CATALOG).unwrap();
    let doc = serde_json::json!({
        "apiVersion": "trainyard.dev/v1", "kind": "TrainingTask",
        "metadata": {"namePrefix": "conf", "projectGroup": "default"},
        "spec": {
            "type": "PyTorchJob",
            "placement": {"region": "local", "cluster": "local"},
            "environment": {"image": "host", "cmd": cmd},
            "compute": {"resourceType": "Reserved", "pool": "default", "workers": workers,
                        "instanceSpecs": [{"spec": "cpu.small"}]},
            "advanced": {"exitCheckpoint": {"enabled": true, "timeoutSeconds": 10}}
        }
    });
    let checked = trainyard_core::parse::check(doc.to_string().as_bytes(), &catalog);
    let task = checked.valid_task().unwrap_or_else(|| panic!("{:?}", checked.report)).clone();
    let resources = trainyard_core::demand::Resources { gpus: 0, vcpus: 1, memory_mib: 512 };
    let replicas = (0..=workers)
        .map(|i| ReplicaPlan {
            role: if i == 0 { "master".into() } else { "worker".into() },
            index: if i == 0 { 0 } else { i - 1 },
            rank: i,
            node: if i % 2 == 0 { "node-a".into() } else { "node-b".into() },
            resources,
        })
        .collect();
    let name = format!("conf-{}", &key.task_id[key.task_id.len() - 5..]);
    LaunchSpec {
        key: key.clone(),
        task_name: name,
        owner: "alice".into(),
        task,
        replicas,
        option: 0,
        catalog: Arc::new(catalog),
        registry_logins: Default::default(),
        workdir_token: None,
    }
}

fn key(n: u32) -> AttemptKey {
    AttemptKey { task_id: format!("1a2b3c4d{:08x}", std::process::id() * 16 + n), attempt: 0 }
}

/// Polls until an observation for `key` satisfies `done`; returns every observation for it so far.
fn until<S: Subject>(s: &S, key: &AttemptKey, done: impl Fn(&Observation) -> bool) -> Vec<Observation> {
    let t0 = Instant::now();
    let mut seen = Vec::new();
    loop {
        for o in block(s.backend().poll(s.now_ms())) {
            if o.key() == key {
                seen.push(o);
            }
        }
        if seen.iter().any(&done) {
            return seen;
        }
        assert!(t0.elapsed() < s.patience(), "gave up waiting; saw {seen:?}");
        s.pass(50);
    }
}

fn finished(o: &Observation) -> Option<Reason> {
    match o {
        Observation::Finished { reason, .. } => Some(*reason),
        _ => None,
    }
}

/// Launch, start, success; `alive` holds the attempt until it ended; a second launch changes nothing.
fn launches_runs_and_succeeds<S: Subject>(s: &S) {
    let k = key(1);
    let sp = s.spec_for(&k, 1, Behaviour::Succeed);
    block(s.backend().launch(&sp)).unwrap();
    block(s.backend().launch(&sp)).unwrap();
    assert!(block(s.backend().alive()).contains(&k));
    let seen = until(s, &k, |o| finished(o).is_some());
    let started = seen.iter().position(|o| matches!(o, Observation::Started { .. })).expect("Started");
    let ended = seen.iter().position(|o| finished(o).is_some()).unwrap();
    assert!(started < ended, "{seen:?}");
    assert_eq!(finished(&seen[ended]), Some(Reason::Completed), "{seen:?}");
    assert_eq!(
        seen.iter().filter(|o| matches!(o, Observation::Started { .. })).count(),
        1,
        "one start: {seen:?}"
    );
    assert!(!block(s.backend().alive()).contains(&k));
}

/// A replica that fails ends the attempt with a classified failure.
fn a_failure_is_classified<S: Subject>(s: &S) {
    let k = key(2);
    block(s.backend().launch(&s.spec_for(&k, 0, Behaviour::Fail))).unwrap();
    let seen = until(s, &k, |o| finished(o).is_some());
    assert_eq!(seen.iter().find_map(finished), Some(Reason::UserError), "{seen:?}");
}

/// A stop of a running attempt ends in `Stopped` with the cause it was asked with.
fn a_stop_ends_in_stopped_with_its_cause<S: Subject>(s: &S) {
    for (n, cause) in [(3, StopCause::UserStop), (4, StopCause::Preempted)] {
        let k = key(n);
        block(s.backend().launch(&s.spec_for(&k, 1, Behaviour::RunUntilStopped))).unwrap();
        until(s, &k, |o| matches!(o, Observation::Started { .. }));
        block(s.backend().stop(&k, cause)).unwrap();
        block(s.backend().stop(&k, cause)).unwrap();
        let seen = until(s, &k, |o| matches!(o, Observation::Stopped { .. }));
        let got = seen.iter().find_map(|o| match o {
            Observation::Stopped { cause, .. } => Some(*cause),
            _ => None,
        });
        assert_eq!(got, Some(Some(cause)), "{seen:?}");
        assert!(seen.iter().all(|o| finished(o).is_none()), "a stop is not a failure: {seen:?}");
        assert!(!block(s.backend().alive()).contains(&k));
    }
}

/// A stop right after the launch, before anything started, still ends in `Stopped`.
fn a_stop_during_start_up_is_clean<S: Subject>(s: &S) {
    let k = key(5);
    block(s.backend().launch(&s.spec_for(&k, 0, Behaviour::RunUntilStopped))).unwrap();
    block(s.backend().stop(&k, StopCause::UserStop)).unwrap();
    until(s, &k, |o| matches!(o, Observation::Stopped { .. }));
    assert!(!block(s.backend().alive()).contains(&k));
}

/// After a restart, the backend still knows the running attempt, takes a second launch of it as a no-op, and
/// stops it.
fn a_restart_reattaches<S: Subject>(s: &S) {
    let k = key(6);
    let sp = s.spec_for(&k, 1, Behaviour::RunUntilStopped);
    block(s.backend().launch(&sp)).unwrap();
    until(s, &k, |o| matches!(o, Observation::Started { .. }));
    let again = s.restarted();
    assert!(block(again.backend().alive()).contains(&k), "the restarted backend knows the attempt");
    block(again.backend().launch(&sp)).unwrap();
    block(again.backend().stop(&k, StopCause::UserStop)).unwrap();
    until(&again, &k, |o| matches!(o, Observation::Stopped { .. }));
    assert!(!block(again.backend().alive()).contains(&k));
}

/// A failed node takes the attempt down without a checkpoint window.
fn a_node_failure_stops_at_once<S: Subject>(s: &S) {
    let k = key(7);
    block(s.backend().launch(&s.spec_for(&k, 1, Behaviour::RunUntilStopped))).unwrap();
    until(s, &k, |o| matches!(o, Observation::Started { .. }));
    block(s.backend().stop(&k, StopCause::NodeFailed)).unwrap();
    let seen = until(s, &k, |o| matches!(o, Observation::Stopped { .. } | Observation::Finished { .. }));
    let ended =
        seen.iter().rev().find(|o| matches!(o, Observation::Stopped { .. } | Observation::Finished { .. }));
    match ended {
        Some(Observation::Stopped { cause, .. }) => assert_eq!(*cause, Some(StopCause::NodeFailed)),
        Some(Observation::Finished { reason, .. }) => assert_eq!(*reason, Reason::NodeFailed),
        other => panic!("{other:?}"),
    }
}

/// A running attempt grows by a worker and shrinks again: the new replica is listed, and the one taken away
/// ends without failing the attempt.
fn scales_up_and_down<S: Subject>(s: &S) {
    let k = key(9);
    block(s.backend().launch(&s.spec_for(&k, 1, Behaviour::RunUntilStopped))).unwrap();
    until(s, &k, |o| matches!(o, Observation::Started { .. }));
    block(s.backend().scale(&s.spec_for(&k, 2, Behaviour::RunUntilStopped))).unwrap();
    let names =
        |s: &S| -> Vec<String> { block(s.backend().replicas(&k)).into_iter().map(|(n, _)| n).collect() };
    // Listed once the backend has it (at once where the backend starts it itself, after the operator made
    // the pod on Kubernetes).
    let t0 = Instant::now();
    while !names(s).iter().any(|n| n.ends_with("-worker-1")) {
        assert!(t0.elapsed() < s.patience(), "never grown: {:?}", names(s));
        for o in block(s.backend().poll(s.now_ms())) {
            assert!(o.key() != &k || finished(&o).is_none(), "growing is no failure: {o:?}");
        }
        s.pass(100);
    }
    s.pass(1_000);
    block(s.backend().scale(&s.spec_for(&k, 1, Behaviour::RunUntilStopped))).unwrap();
    // The removed replica ends (after its grace); the attempt does not.
    for _ in 0..50 {
        for o in block(s.backend().poll(s.now_ms())) {
            assert!(o.key() != &k || finished(&o).is_none(), "shrinking is no failure: {o:?}");
        }
        s.pass(100);
    }
    assert!(block(s.backend().alive()).contains(&k));
    block(s.backend().stop(&k, StopCause::UserStop)).unwrap();
    until(s, &k, |o| matches!(o, Observation::Stopped { .. }));
}

fn suite<S: Subject>(s: &S) {
    launches_runs_and_succeeds(s);
    a_failure_is_classified(s);
    a_stop_ends_in_stopped_with_its_cause(s);
    a_stop_during_start_up_is_clean(s);
    a_restart_reattaches(s);
    a_node_failure_stops_at_once(s);
    scales_up_and_down(s);
}

#[test]
fn the_fake_backend_conforms() {
    suite(&fake());
}

#[test]
fn the_local_backend_conforms() {
    let s = local("local");
    suite(&s);
    // The local backend's logs: every replica's own, whole lines with their stream.
    let k = key(8);
    block(s.backend().launch(&s.spec_for(&k, 1, Behaviour::Succeed))).unwrap();
    until(&s, &k, |o| finished(o).is_some());
    let replicas: BTreeMap<String, String> = block(s.backend().replicas(&k)).into_iter().collect();
    assert_eq!(replicas.len(), 2, "{replicas:?}");
    for (name, role) in &replicas {
        let chunk = block(s.backend().read_log(&k, name, 0, 1 << 20));
        let text = String::from_utf8_lossy(&chunk.data);
        let rank = if role == "master" { 0 } else { 1 };
        assert!(text.contains(&format!(" O hello from {rank}")), "{name}: {text}");
        assert!(chunk.ended, "{name} ended");
    }
    assert!(block(s.backend().read_log(&k, "no-such-replica", 0, 100)).missing);
    let _ = std::fs::remove_dir_all(&s.cfg.data_dir);
}

#[test]
fn the_kubernetes_backend_conforms() {
    let s = kube("suite");
    suite(&s);
    let _ = std::fs::remove_dir_all(&s.cfg.data_dir);
}

/// The same scenarios on real pods: the commands run in containers on the stack's two kubelets, the exit
/// checkpoint's `preStop` hook signals a real process, a stop waits out a real grace period, and a restarted
/// backend finds real pods. What the replicas printed is read back as on the local backend.
#[test]
fn the_kubernetes_backend_conforms_on_real_nodes() {
    let s = kube_real("real");
    suite(&s);
    let k = key(10);
    let mut sp = s.spec_for(&k, 1, Behaviour::Succeed);
    // The master stays a while: the training operator ends the job when the master ends, and a worker still
    // waiting in its init container for the master's name would never run.
    sp.task.spec.environment.cmd = "echo hello from $RANK; if [ \"$RANK\" = 0 ]; then sleep 20; fi".into();
    block(s.backend().launch(&sp)).unwrap();
    until(&s, &k, |o| finished(o).is_some());
    let t0 = Instant::now();
    for rank in 0..2 {
        loop {
            let replicas: BTreeMap<String, String> = block(s.backend().replicas(&k)).into_iter().collect();
            let text: String = replicas
                .keys()
                .map(|n| {
                    String::from_utf8_lossy(&block(s.backend().read_log(&k, n, 0, 1 << 20)).data).into_owned()
                })
                .collect();
            if text.contains(&format!(" O hello from {rank}")) {
                break;
            }
            assert!(t0.elapsed() < s.patience(), "no hello from rank {rank} in {replicas:?}: {text}");
            s.pass(200);
        }
    }
    let _ = std::fs::remove_dir_all(&s.cfg.data_dir);
}

/// On Kubernetes a replica's log and metrics outlive its pod: the log is followed through the API server
/// while the container runs (kwok's simulated kubelet serves the same fixed log for every container), and the
/// metrics endpoint is scraped through the API server's pod proxy (the simulated pod answers with its own
/// name). A restarted server follows the running pods again from where the last one stopped, keeping each
/// line once; once the attempt has been stopped and its pods deleted, both still read back, from this server
/// and from a restarted one.
#[test]
fn on_kubernetes_logs_and_metrics_are_kept_after_the_pods_are_gone() {
    use trainyard_kube::client::api::{Api, ListParams};
    use trainyard_kube::openapi::api::core::v1::Pod;
    let s = kube("telemetry");
    let k = key(25);
    let mut sp = s.spec_for(&k, 1, Behaviour::RunUntilStopped);
    sp.task.spec.advanced.metrics = Some(trainyard_core::spec::MetricsMonitor {
        enabled: true,
        endpoints: vec![trainyard_core::spec::MetricsEndpoint { port: 9100, path: "/metrics".into() }],
        interval_seconds: 1,
    });
    block(s.backend().launch(&sp)).unwrap();
    until(&s, &k, |o| matches!(o, Observation::Started { .. }));
    const LOG: &str = "2026-01-01T00:00:00.100Z O simulated container: started\n\
                       2026-01-01T00:00:00.200Z O simulated container: a line on stderr\n\
                       2026-01-01T00:00:01.000Z O simulated container: step 1 loss 0.50\n\
                       2026-01-01T00:00:01.000Z O simulated container: step 2 loss 0.25\n\
                       2026-01-01T00:00:02.500Z O simulated container: done\n";
    let read = |b: &KubeBackend, name: &str| block(b.read_log(&k, name, 0, 1 << 20));
    let replicas =
        |b: &KubeBackend| -> BTreeMap<String, String> { block(b.replicas(&k)).into_iter().collect() };
    let names: Vec<String> = replicas(&s.backend).into_keys().collect();
    assert_eq!(names.len(), 2, "{names:?}");
    // The whole log arrives while the pods run, and a second has passed for the cursor to be saved.
    let t0 = Instant::now();
    while !names.iter().all(|n| read(&s.backend, n).data == LOG.as_bytes()) {
        assert!(
            t0.elapsed() < s.patience(),
            "{:?}",
            String::from_utf8_lossy(&read(&s.backend, &names[0]).data)
        );
        s.pass(250);
    }
    s.pass(1_500);
    // A restart while the pods run: the new server follows them again (the old one is gone).
    let cfg = s.cfg.clone();
    drop(s);
    let s = Kube { backend: block(KubeBackend::connect(cfg.clone())).unwrap(), cfg, real: None };
    assert!(block(s.backend.synced(Duration::from_secs(30))));
    let t0 = Instant::now();
    while s.backend.telemetry().log_requests.load(Relaxed) < 2 {
        assert!(t0.elapsed() < s.patience(), "the restarted server follows the logs again");
        s.pass(250);
    }
    s.pass(2_000);
    block(s.backend().stop(&k, StopCause::UserStop)).unwrap();
    until(&s, &k, |o| matches!(o, Observation::Stopped { .. }));
    let t0 = Instant::now();
    while !names.iter().all(|n| read(&s.backend, n).ended) {
        assert!(t0.elapsed() < s.patience(), "the logs were never complete");
        s.pass(250);
    }
    let pods: Api<Pod> = Api::namespaced(s.backend.client(), &s.cfg.namespace_of("default"));
    let lp = ListParams::default().labels(&trainyard_kube::objects::instance_selector(&s.cfg.instance));
    let t0 = Instant::now();
    while !block(pods.list(&lp)).unwrap().items.is_empty() {
        assert!(t0.elapsed() < s.patience(), "the pods were never deleted");
        block(s.backend().poll(s.now_ms()));
        s.pass(250);
    }
    let check = |b: &KubeBackend, when: &str| {
        assert_eq!(replicas(b).values().collect::<Vec<_>>(), ["master", "worker"], "{when}");
        for name in &names {
            let chunk = read(b, name);
            assert_eq!(String::from_utf8_lossy(&chunk.data), LOG, "{when}: {name}'s log, each line once");
            assert!(chunk.ended && !chunk.missing, "{when}: {name}'s log is complete");
            // Read on from the middle: whole lines from there.
            let second = LOG.find('\n').unwrap() + 1;
            let rest = block(b.read_log(&k, name, second as u64, 1 << 20));
            assert_eq!(String::from_utf8_lossy(&rest.data), LOG[second..], "{when}");
        }
        let points = block(b.read_metrics(&k, 0));
        for name in &names {
            let mine: Vec<_> = points.iter().filter(|p| &p.replica == name).collect();
            assert!(
                mine.iter().any(|p| p.name == "sim_pod_up"
                    && p.labels.get("pod") == Some(name)
                    && p.labels.get("port").map(String::as_str) == Some("9100")
                    && p.value == 1.0),
                "{when}: {name} scraped through the pod proxy: {mine:?}"
            );
            assert!(
                mine.iter().any(|p| p.name == "trainyard_scrape_up" && p.value == 1.0),
                "{when}: {name}'s scrape is up: {mine:?}"
            );
        }
    };
    check(&s.backend, "once the pods are gone");
    let restarted = s.restarted();
    check(&restarted.backend, "after another restart");
    assert_eq!(restarted.backend.telemetry().log_requests.load(Relaxed), 0, "nothing is read again");
    let _ = std::fs::remove_dir_all(&s.cfg.data_dir);
}

/// A node that goes NotReady under a running attempt fails it as `NodeFailed` (retried elsewhere by the
/// control loop) and names the node as suspect; its pods are deleted without waiting for the dead node.
#[test]
fn on_kubernetes_a_node_going_not_ready_fails_its_attempt_as_node_failed() {
    let s = kube("notready");
    let node = format!("node-nr-{}", std::process::id());
    kwok_node(&s.backend.client(), &node, serde_json::json!({}));
    let k = key(20);
    let mut sp = s.spec_for(&k, 0, Behaviour::RunUntilStopped);
    sp.replicas[0].node = node.clone();
    block(s.backend().launch(&sp)).unwrap();
    until(&s, &k, |o| matches!(o, Observation::Started { .. }));
    kwok_node(&s.backend.client(), &node, serde_json::json!({SIM_NOT_READY: "true"}));
    let seen = until(&s, &k, |o| finished(o).is_some());
    assert_eq!(seen.iter().find_map(finished), Some(Reason::NodeFailed), "{seen:?}");
    assert!(
        seen.iter().any(|o| matches!(o, Observation::NodeSuspect { node: n, .. } if *n == node)),
        "{seen:?}"
    );
    assert!(!block(s.backend().alive()).contains(&k));
    // Its pods are deleted at once, without grace (a lost node's kubelet would never confirm a graceful end,
    // and they would stay Terminating for ever), by the attempt's selector.
    use trainyard_kube::client::api::{Api, ListParams};
    use trainyard_kube::openapi::api::core::v1::Pod;
    let pods: Api<Pod> = Api::all(s.backend.client());
    let selector = trainyard_kube::objects::attempt_selector(&k);
    let t0 = Instant::now();
    loop {
        let left = block(pods.list(&ListParams::default().labels(&selector))).unwrap().items;
        if left.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "pods left on the lost node: {:?}",
            left.iter().map(|p| &p.metadata.name).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An object the API server refuses (here: a Kueue queue name that is no valid label value, an admin's
/// mistake) ends the attempt at once with the server's own words, instead of retrying forever.
#[test]
fn on_kubernetes_an_object_the_api_server_refuses_fails_with_its_reason() {
    let mut s = kube("refused");
    s.cfg.gang = trainyard_kube::objects::Gang::Kueue { local_queue: "not a valid label!".into() };
    let s = s.restarted();
    let k = key(21);
    block(s.backend().launch(&s.spec_for(&k, 0, Behaviour::Succeed))).unwrap();
    let seen = until(&s, &k, |o| finished(o).is_some());
    let message = seen
        .iter()
        .find_map(|o| match o {
            Observation::Finished { reason: Reason::UserError, message, .. } => Some(message.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{seen:?}"));
    assert!(message.contains("422 Invalid") && message.contains("\"not a valid label!\""), "{message}");
}

/// Cluster-side gang admission with Kueue (`--kube-gang kueue:QUEUE`): the job is created suspended under the
/// queue, and Kueue lets it go only when its ClusterQueue can take every replica at once. With room for one of
/// the two replicas nothing starts (no pod at all); once the quota has room for both, both start together and
/// the attempt runs to success. A running job Kueue evicts is preempted.
#[test]
fn on_kubernetes_kueue_admits_the_whole_gang_or_nothing() {
    use trainyard_kube::client::api::{Api, DynamicObject, ListParams};
    use trainyard_kube::client::api::{Patch, PatchParams};
    use trainyard_kube::openapi::api::core::v1::{Namespace, Pod};
    let mut s = kube("kueue");
    let queue = format!("conf-{}", std::process::id());
    s.cfg.gang = trainyard_kube::objects::Gang::Kueue { local_queue: queue.clone() };
    let s = s.restarted();
    let client = s.backend.client();
    use common::kueue;
    let pp = PatchParams::apply("conformance").force();
    let ns = s.cfg.namespace_of("default");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let body = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
    block(namespaces.patch(&ns, &pp, &Patch::Apply(&body)))
        .unwrap_or_else(|e| panic!("{e} (is Kueue in the stack? scripts/with-kube starts it)"));
    let flavors: Api<DynamicObject> =
        Api::all_with(client.clone(), &kueue::resource("ResourceFlavor", "resourceflavors"));
    block(flavors.patch(&queue, &pp, &Patch::Apply(&kueue::flavor(&queue)))).unwrap();
    let cqs: Api<DynamicObject> =
        Api::all_with(client.clone(), &kueue::resource("ClusterQueue", "clusterqueues"));
    let cluster_queue = |cpu: &str| kueue::cluster_queue(&queue, &queue, cpu);
    block(cqs.patch(&queue, &pp, &Patch::Apply(&cluster_queue("1")))).unwrap();
    let lqs: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &kueue::resource("LocalQueue", "localqueues"));
    block(lqs.patch(&queue, &pp, &Patch::Apply(&kueue::local_queue(&queue, &ns, &queue)))).unwrap();

    // Two replicas of one CPU each against a quota of one CPU: Kueue holds the whole gang.
    let k = key(26);
    block(s.backend().launch(&s.spec_for(&k, 1, Behaviour::Succeed))).unwrap();
    let workloads: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &kueue::resource("Workload", "workloads"));
    let t0 = Instant::now();
    let workload = loop {
        if let Some(w) = block(workloads.list(&ListParams::default())).unwrap().items.into_iter().next() {
            break w;
        }
        assert!(t0.elapsed() < s.patience(), "Kueue made no Workload for the job");
        block(s.backend().poll(s.now_ms()));
        s.pass(250);
    };
    assert!(workload.data["status"]["admission"].is_null(), "not admitted: {:?}", workload.data["status"]);
    for _ in 0..12 {
        for o in block(s.backend().poll(s.now_ms())) {
            assert!(!matches!(o, Observation::Started { .. }) && finished(&o).is_none(), "held: {o:?}");
        }
        s.pass(250);
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    assert!(block(pods.list(&ListParams::default())).unwrap().items.is_empty(), "no replica runs alone");

    // Room for both: admitted together, started, done.
    block(cqs.patch(&queue, &pp, &Patch::Apply(&cluster_queue("4")))).unwrap();
    let seen = until(&s, &k, |o| finished(o).is_some());
    assert!(seen.iter().any(|o| matches!(o, Observation::Started { .. })), "{seen:?}");
    assert_eq!(seen.iter().find_map(finished), Some(Reason::Completed), "{seen:?}");
    let admitted = block(workloads.get(&workload.metadata.name.clone().unwrap())).unwrap();
    assert_eq!(
        admitted.data["status"]["admission"]["podSetAssignments"].as_array().map(Vec::len),
        Some(2),
        "both replica sets admitted in one admission: {:?}",
        admitted.data["status"]
    );

    // Kueue evicts a running job (here its Workload deactivated, Kueue's own eviction): the attempt ends as
    // preempted, and is kept until its stop, which ends in Stopped (the control loop then requeues it).
    let k = key(27);
    block(s.backend().launch(&s.spec_for(&k, 1, Behaviour::RunUntilStopped))).unwrap();
    until(&s, &k, |o| matches!(o, Observation::Started { .. }));
    let job = trainyard_kube::objects::job_name(&k);
    let mine = block(workloads.list(&ListParams::default()))
        .unwrap()
        .items
        .into_iter()
        .find(|w| w.metadata.owner_references.iter().flatten().any(|o| o.name == job))
        .unwrap_or_else(|| panic!("no Workload owned by {job}"));
    let off = serde_json::json!({"spec": {"active": false}});
    block(workloads.patch(
        &mine.metadata.name.clone().unwrap(),
        &PatchParams::default(),
        &Patch::Merge(&off),
    ))
    .unwrap();
    let seen = until(&s, &k, |o| finished(o).is_some());
    let message = seen
        .iter()
        .find_map(|o| match o {
            Observation::Finished { reason: Reason::Preempted, message, .. } => Some(message.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("not preempted: {seen:?}"));
    assert!(message.starts_with("Kueue evicted the job"), "{message}");
    assert!(block(s.backend().alive()).contains(&k), "kept until Trainyard stops it");
    block(s.backend().stop(&k, StopCause::Preempted)).unwrap();
    let seen = until(&s, &k, |o| matches!(o, Observation::Stopped { .. }));
    assert!(
        seen.iter().any(|o| matches!(o, Observation::Stopped { cause: Some(StopCause::Preempted), .. })),
        "{seen:?}"
    );
    eprintln!("Kueue's eviction: {message}");
    let _ = block(lqs.delete(&queue, &Default::default()));
    let _ = block(cqs.delete(&queue, &Default::default()));
    let _ = block(flavors.delete(&queue, &Default::default()));
}

/// What only a cluster shows: a container the kernel killed for memory is `OutOfMemory`, an image that cannot be
/// pulled fails past the tolerance as `ImagePullFailed` (the pulls counted from the pods' states), and a restarted
/// server reattaches by label to the one job an attempt has, creating no second one when the launch comes again.
#[test]
fn on_kubernetes_oom_pull_failures_and_reattaching_without_a_second_job() {
    use trainyard_kube::client::api::{Api, DynamicObject, ListParams};
    let s = kube("oom");
    let k = key(22);
    let mut sp = s.spec_for(&k, 0, Behaviour::RunUntilStopped);
    sp.task.metadata.labels.insert(SIM_RUN_MS.into(), "1000".into());
    sp.task.metadata.labels.insert("sim.trainyard.dev/oom".into(), "true".into());
    block(s.backend().launch(&sp)).unwrap();
    let seen = until(&s, &k, |o| finished(o).is_some());
    assert_eq!(seen.iter().find_map(finished), Some(Reason::OutOfMemory), "{seen:?}");

    let k = key(23);
    let mut sp = s.spec_for(&k, 0, Behaviour::RunUntilStopped);
    sp.task.metadata.labels.insert("sim.trainyard.dev/pull-error".into(), "true".into());
    sp.task.spec.advanced.image_pull_tolerance = 0;
    block(s.backend().launch(&sp)).unwrap();
    let seen = until(&s, &k, |o| finished(o).is_some());
    assert_eq!(seen.iter().find_map(finished), Some(Reason::ImagePullFailed), "{seen:?}");
    assert!(
        seen.iter().any(|o| matches!(o, Observation::Note { reason: Reason::ImagePullBackOff, .. })),
        "{seen:?}"
    );

    let k = key(24);
    let sp = s.spec_for(&k, 1, Behaviour::RunUntilStopped);
    block(s.backend().launch(&sp)).unwrap();
    until(&s, &k, |o| matches!(o, Observation::Started { .. }));
    let again = s.restarted();
    block(again.backend().launch(&sp)).unwrap();
    let seen = until(&again, &k, |o| matches!(o, Observation::Started { .. }));
    assert!(seen.iter().all(|o| finished(o).is_none()), "{seen:?}");
    let ns = s.cfg.namespace_of("default");
    let jobs: Api<DynamicObject> = Api::namespaced_with(
        s.backend.client(),
        &ns,
        &trainyard_kube::views::job_resource(trainyard_kube::status::JobKind::PyTorch),
    );
    let listed =
        block(jobs.list(&ListParams::default().labels(&format!("trainyard.dev/task={}", k.task_id))))
            .unwrap();
    assert_eq!(listed.items.len(), 1, "one job for the attempt, however often it is launched");
    block(again.backend().stop(&k, StopCause::UserStop)).unwrap();
    until(&again, &k, |o| matches!(o, Observation::Stopped { .. }));
}

/// Issue 32: a start that never comes ends by the start-up deadline (here 5 s) with the cluster's reason and
/// class, instead of holding its quota in `Starting` for ever: a claim that does not exist and a pod the
/// namespace's Pod Security refuses are spec errors (resubmitting meets them again); a node whose taint the
/// pods do not tolerate is an infrastructure failure (resubmitted elsewhere). The objects go at once.
#[test]
fn on_kubernetes_a_start_that_does_not_come_ends_by_its_deadline_with_the_clusters_reason() {
    use trainyard_kube::client::api::{Api, Patch, PatchParams};
    use trainyard_kube::openapi::api::core::v1::{Namespace, Node, Pod};
    let mut s = kube("deadline");
    s.cfg.start_deadline_s = 5;
    let s = s.restarted();
    let ended = |k: &AttemptKey| -> (Reason, String) {
        let seen = until(&s, k, |o| finished(o).is_some());
        seen.iter()
            .find_map(|o| match o {
                Observation::Finished { reason, message, .. } => Some((*reason, message.clone())),
                _ => None,
            })
            .unwrap()
    };
    let no_pods_left = |k: &AttemptKey| {
        let pods: Api<Pod> = Api::all(s.backend.client());
        let selector = trainyard_kube::objects::attempt_selector(k);
        let t0 = Instant::now();
        while !block(pods.list(&trainyard_kube::client::api::ListParams::default().labels(&selector)))
            .unwrap()
            .items
            .is_empty()
        {
            assert!(t0.elapsed() < Duration::from_secs(60), "the attempt's pods stay");
            std::thread::sleep(Duration::from_millis(200));
        }
    };

    // A claim that does not exist.
    let k = key(30);
    let mut sp = s.spec_for(&k, 0, Behaviour::RunUntilStopped);
    let catalog = CATALOG.replace("images: {host: {}}", "images: {host: {}}\nvolumes: {no-such-claim: {}}");
    sp.catalog = Arc::new(Catalog::from_yaml(&catalog).unwrap());
    sp.task.spec.environment.volumes.push(trainyard_core::spec::VolumeMount {
        volume: "no-such-claim".into(),
        mount_path: "/mnt/data".into(),
        read_only: false,
    });
    let t0 = Instant::now();
    block(s.backend().launch(&sp)).unwrap();
    let (reason, message) = ended(&k);
    assert_eq!(reason, Reason::UserError, "{message}");
    assert!(
        message.contains("start-up deadline (5 s)")
            && message.contains("persistentvolumeclaim \"no-such-claim\" not found"),
        "{message}"
    );
    eprintln!("missing claim, after {:.1} s: {reason}: {message}", t0.elapsed().as_secs_f64());
    no_pods_left(&k);
    assert!(!block(s.backend().alive()).contains(&k), "its quota is free: the attempt holds nothing");

    // A node whose taint the pods do not tolerate.
    let node = format!("node-tainted-{}", std::process::id());
    kwok_node(&s.backend.client(), &node, serde_json::json!({}));
    let nodes: Api<Node> = Api::all(s.backend.client());
    let taint = serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}});
    block(nodes.patch(&node, &PatchParams::apply("conformance-taint").force(), &Patch::Apply(&taint)))
        .unwrap();
    let k = key(31);
    let mut sp = s.spec_for(&k, 0, Behaviour::RunUntilStopped);
    sp.replicas[0].node = node.clone();
    block(s.backend().launch(&sp)).unwrap();
    let (reason, message) = ended(&k);
    assert_eq!(reason, Reason::StartTimedOut, "{message}");
    assert!(message.contains("Unschedulable") && message.contains("untolerated taint"), "{message}");
    eprintln!("untolerated taint: {reason}: {message}");
    no_pods_left(&k);
    block(nodes.delete(&node, &Default::default())).unwrap();

    // Pod Security `restricted` on the group's namespace: the operator cannot make the pods.
    let restricted = KubeConfig {
        namespace: format!("conf-{}-restricted-{{group}}", std::process::id()),
        ..s.cfg.clone()
    };
    let ns = restricted.namespace.replace("{group}", "default");
    let namespaces: Api<Namespace> = Api::all(s.backend.client());
    let labelled = serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": ns, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}});
    block(namespaces.patch(&ns, &PatchParams::apply("conformance-psa").force(), &Patch::Apply(&labelled)))
        .unwrap();
    let r = Kube {
        backend: block(KubeBackend::connect(restricted.clone())).unwrap(),
        cfg: restricted,
        real: None,
    };
    assert!(block(r.backend.synced(Duration::from_secs(30))));
    let k = key(32);
    block(r.backend().launch(&r.spec_for(&k, 1, Behaviour::RunUntilStopped))).unwrap();
    let seen = until(&r, &k, |o| finished(o).is_some());
    let (reason, message) = seen
        .iter()
        .find_map(|o| match o {
            Observation::Finished { reason, message, .. } => Some((*reason, message.clone())),
            _ => None,
        })
        .unwrap();
    assert_eq!(reason, Reason::UserError, "{message}");
    // Refused at once (no wait changes that), not at the deadline.
    assert!(message.contains("refuses to make its pods") && message.contains("PodSecurity"), "{message}");
    eprintln!("Pod Security restricted: {reason}: {message}");
    let _ = block(namespaces.delete(&ns, &Default::default()));
    let _ = std::fs::remove_dir_all(&s.cfg.data_dir);
}

/// Issue 32: what a node offers Trainyard is its allocatable less what pods Trainyard did not make request
/// there (a DaemonSet's agent, another workload), followed as they come and go: a full-node replica is never
/// placed beside them where the cluster has no room.
#[test]
fn on_kubernetes_other_pods_requests_shrink_a_nodes_room_in_the_catalog() {
    use trainyard_kube::client::api::{Api, PostParams};
    use trainyard_kube::openapi::api::core::v1::Pod;
    let s = kube("room");
    let node = format!("node-room-{}", std::process::id());
    kwok_node(&s.backend.client(), &node, serde_json::json!({}));
    let room = |want: (u32, u64)| {
        let t0 = Instant::now();
        loop {
            let now = s.backend.inventory_since(None).and_then(|(_, inv)| inv.get(&node).cloned());
            if now.as_ref().is_some_and(|n| (n.vcpus, n.memory_mib) == want) {
                return;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "{node}: {now:?}, not {want:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    room((4, 4096));
    // An agent bound to the node, as a DaemonSet's pod is: 1500m and 1 GiB.
    let ns = format!("room-{}", std::process::id());
    let namespaces: Api<trainyard_kube::openapi::api::core::v1::Namespace> = Api::all(s.backend.client());
    let nsobj = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
    block(namespaces.create(&PostParams::default(), &nsobj)).unwrap();
    let pods: Api<Pod> = Api::namespaced(s.backend.client(), &ns);
    let agent: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "agent"},
        "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "registry.invalid/agent:1",
            "resources": {"requests": {"cpu": "1500m", "memory": "1Gi"}}}]},
    }))
    .unwrap();
    block(pods.create(&PostParams::default(), &agent)).unwrap();
    room((2, 3072));
    block(pods.delete("agent", &Default::default())).unwrap();
    room((4, 4096));
    let _ = block(namespaces.delete(&ns, &Default::default()));
    let _ = std::fs::remove_dir_all(&s.cfg.data_dir);
}
