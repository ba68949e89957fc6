//! The pods of an attempt on Kubernetes: each role's pod template (the main container with its replicas'
//! env, mounts and resources, the precheck's init container, the `preStop` checkpoint hook) and the
//! precheck's Service. They are methods of the objects' builder ([`Ctx`]).

use super::names::{
    KF_JOB_NAME_LABEL, KF_REPLICA_INDEX_LABEL, KF_REPLICA_TYPE_LABEL, METRICS_ANNOTATION,
    METRICS_INTERVAL_ANNOTATION, ROLE_LABEL, VOLCANO_GROUP_ANNOTATION, is_label_key, is_label_value,
    reserved_label, shell_quote,
};
use super::objects::{
    Ctx, Gang, MASTER_PORT, RUNTIME_DIR, SSH_DIR, SSH_USER_DIR, WORKDIR_TOKEN_KEY, WORKSPACE, env_key,
    env_secret_name, pre_stop_script, precheck_key, precheck_service_name, pull_secret_name, ssh_secret_name,
};
use serde_json::{Value, json};

/// The pod's `/dev/shm` volume.
const SHM_VOLUME: &str = "trainyard-shm";
/// The replica's copy of its working directory.
const WORKSPACE_VOLUME: &str = "trainyard-workspace";
use std::collections::{BTreeMap, BTreeSet};
use trainyard_core::catalog::{DEFAULT_GPU_RESOURCE, Toleration};
use trainyard_core::platform_env as pe;
use trainyard_core::spec::{CheckpointSignal, TaskType};
use trainyard_runtime::ReplicaPlan;

/// Where one env variable's value comes from.
enum Source {
    Value(String),
    /// A key of the attempt's env Secret.
    Secret(String),
    /// A field of the pod (`metadata.name`, `spec.nodeName`, a label).
    Field(String),
}

/// An env list where the last value of a name wins (as inside the local sandbox), in first-seen order.
#[derive(Default)]
struct Env(Vec<(String, Source)>);

impl Env {
    fn set(&mut self, name: &str, src: Source) {
        self.0.retain(|(n, _)| n != name);
        self.0.push((name.to_owned(), src));
    }
    fn value(&mut self, name: &str, v: impl Into<String>) {
        self.set(name, Source::Value(v.into()));
    }
    fn render(&self, secret: &str) -> Value {
        Value::Array(
            self.0
                .iter()
                .map(|(n, src)| match src {
                    Source::Value(v) => json!({"name": n, "value": v}),
                    Source::Secret(key) => {
                        json!({"name": n, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
                    }
                    Source::Field(path) => json!({"name": n, "valueFrom": {"fieldRef": {"fieldPath": path}}}),
                })
                .collect(),
        )
    }
}

impl Ctx<'_> {
    /// The pod template of every replica of `role` (identical replicas share it).
    pub(super) fn pod_template(&self, role: &str, replicas: &[&ReplicaPlan]) -> Value {
        let task = self.task();
        let ray = task.task_type == TaskType::RayJob;
        let mut labels = self.labels();
        for (k, v) in &self.spec.task.metadata.labels {
            if is_label_key(k) && is_label_value(v) && !reserved_label(k) {
                labels.insert(k.clone(), v.clone().into());
            }
        }
        labels.insert(ROLE_LABEL.into(), role.into());
        let mut annotations = self.annotations();
        if let Some(m) = task.advanced.metrics.as_ref().filter(|m| m.enabled && !m.endpoints.is_empty()) {
            let eps: Vec<Value> =
                m.endpoints.iter().map(|e| json!({"port": e.port, "path": e.path})).collect();
            annotations.insert(METRICS_ANNOTATION.into(), Value::Array(eps).to_string().into());
            annotations.insert(METRICS_INTERVAL_ANNOTATION.into(), m.interval_seconds.to_string().into());
        }
        let mut pod = json!({
            "restartPolicy": "Never",
            "containers": [self.main_container(role, replicas)],
            "volumes": self.volumes(),
        });
        // Trainyard's scheduler chose the nodes: the pods of this role go to those and no others. Unplaced
        // replicas (the cluster admits: Kueue, Volcano) go where the cluster's scheduler puts them.
        let nodes: BTreeSet<&str> =
            replicas.iter().map(|r| r.node.as_str()).filter(|n| !n.is_empty()).collect();
        if !nodes.is_empty() {
            pod["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{
                    "key": "kubernetes.io/hostname", "operator": "In", "values": nodes.into_iter().collect::<Vec<_>>(),
                }]}],
            }}});
        }
        // The pool's and the instance spec's node labels and taints, as the catalog says.
        let (selector, tolerations) = self.placement_terms(replicas);
        if !selector.is_empty() {
            pod["nodeSelector"] = json!(selector);
        }
        if !tolerations.is_empty() {
            pod["tolerations"] = serde_json::to_value(tolerations).unwrap_or_default();
        }
        if self.s.priority_classes {
            pod["priorityClassName"] = super::objects::priority_class(self.task()).into();
        }
        pod["securityContext"] = self.pod_security_context();
        if !self.spec.registry_logins.is_empty() {
            pod["imagePullSecrets"] = json!([{"name": pull_secret_name(self.name)}]);
        }
        // A task's code has no business with the cluster's API: no service account token in its pods.
        pod["automountServiceAccountToken"] = false.into();
        let checkpoint = self.checkpoint();
        pod["terminationGracePeriodSeconds"] = (checkpoint.map_or(0, |c| c.0) + self.s.grace_s).into();
        // The working directory first: the precheck and the command both start in it.
        let inits: Vec<Value> = [self.workdir_container(replicas)]
            .into_iter()
            .chain([if ray { None } else { self.precheck_container(role, replicas) }])
            .flatten()
            .collect();
        if !inits.is_empty() {
            pod["initContainers"] = Value::Array(inits);
        }
        // /dev/shm: a container runtime's default is 64 MiB, too small for NCCL, DataLoader workers or Ray's
        // object store. A memory-backed emptyDir up to the replica's memory (what it writes there counts against
        // its memory limit, as on the local backend's tmpfs).
        let memory_mib = replicas.first().map_or(0, |r| r.resources.memory_mib);
        if memory_mib > 0 {
            let mut shm = json!({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}});
            shm["emptyDir"]["sizeLimit"] = format!("{memory_mib}Mi").into();
            pod["volumes"].as_array_mut().expect("volumes is a list").push(shm);
            let mount = json!({"name": SHM_VOLUME, "mountPath": "/dev/shm"});
            for list in ["containers", "initContainers"] {
                for c in pod.get_mut(list).and_then(Value::as_array_mut).into_iter().flatten() {
                    c["volumeMounts"].as_array_mut().expect("volumeMounts is a list").push(mount.clone());
                }
            }
        }
        if let Gang::Volcano { .. } = self.s.gang {
            pod["schedulerName"] = "volcano".into();
            annotations.insert(VOLCANO_GROUP_ANNOTATION.into(), self.name.into());
        }
        let mut md = json!({"labels": labels});
        if !annotations.is_empty() {
            md["annotations"] = Value::Object(annotations);
        }
        json!({"metadata": md, "spec": pod})
    }

    /// The exit checkpoint: (timeout in s, at most 10 minutes; signal). A RayJob has none (as locally).
    fn checkpoint(&self) -> Option<(u64, CheckpointSignal)> {
        let task = self.task();
        task.advanced
            .exit_checkpoint
            .as_ref()
            .filter(|c| c.enabled && task.task_type != TaskType::RayJob)
            .map(|c| (u64::from(c.timeout_seconds.min(600)), c.signal))
    }

    pub(super) fn precheck(&self) -> Option<&trainyard_core::spec::Precheck> {
        let task = self.task();
        task.advanced.precheck.as_ref().filter(|p| p.enabled && task.task_type != TaskType::RayJob)
    }

    /// The node selector and tolerations of the task's pods: its pool's and its instance spec's (the spec's
    /// win on a shared key), and for GPU replicas a toleration of their GPU resource's taint, as GPU node pools
    /// are tainted (what Kubernetes' `ExtendedResourceToleration` admission adds where it is on).
    fn placement_terms(&self, replicas: &[&ReplicaPlan]) -> (BTreeMap<String, String>, Vec<Toleration>) {
        let pool = self.spec.catalog.pools.get(&self.task().compute.pool);
        let spec = self.spec.instance_spec().map(|(s, _)| s);
        let mut selector = BTreeMap::new();
        let mut tolerations: Vec<Toleration> = Vec::new();
        for (sel, tol) in pool
            .map(|p| (&p.node_selector, &p.tolerations))
            .into_iter()
            .chain(spec.map(|s| (&s.node_selector, &s.tolerations)))
        {
            selector.extend(sel.iter().map(|(k, v)| (k.clone(), v.clone())));
            for t in tol {
                if !tolerations.contains(t) {
                    tolerations.push(t.clone());
                }
            }
        }
        if replicas.first().is_some_and(|r| r.resources.gpus > 0) {
            let gpu = Toleration {
                key: spec.map_or(DEFAULT_GPU_RESOURCE, |s| s.gpu_resource()).to_owned(),
                operator: Some("Exists".into()),
                value: None,
                effect: Some("NoSchedule".into()),
            };
            if !tolerations.contains(&gpu) {
                tolerations.push(gpu);
            }
        }
        (selector, tolerations)
    }

    /// The pod's requests and limits: its CPUs and memory, its GPUs as the instance spec's GPU resource, and
    /// the spec's extra resources for each unit the replica takes.
    fn resources(&self, replicas: &[&ReplicaPlan]) -> Value {
        let r = replicas.first().map(|r| r.resources).unwrap_or_default();
        // The same floors as the local backend's cgroups (one CPU, 64 MiB).
        let mut list =
            json!({"cpu": r.vcpus.max(1).to_string(), "memory": format!("{}Mi", r.memory_mib.max(64))});
        let spec = self.spec.instance_spec();
        if r.gpus > 0 {
            let name = spec.map_or(DEFAULT_GPU_RESOURCE, |(s, _)| s.gpu_resource());
            list[name] = r.gpus.to_string().into();
        }
        if let Some((s, units)) = spec {
            for (name, n) in &s.extra_resources {
                list[name.as_str()] = (n * u64::from(units)).to_string().into();
            }
        }
        json!({"requests": list.clone(), "limits": list})
    }

    /// The pod's securityContext: the `RuntimeDefault` seccomp profile always (Pod Security `baseline` admits
    /// it and `restricted` asks for it), and, for an image the catalog says runs as a user of its own, that user
    /// as a non-root user (with its group as the volumes' group), which `restricted` asks for. An image without
    /// one runs as it was built, which `baseline` admits: every pod Trainyard makes is `baseline` at least.
    fn pod_security_context(&self) -> Value {
        let mut sc = json!({"seccompProfile": {"type": "RuntimeDefault"}});
        if let Some(uid) = self.run_as_user() {
            sc["runAsNonRoot"] = true.into();
            sc["runAsUser"] = uid.into();
            if let Some(gid) = self.image_entry().and_then(|i| i.run_as_group) {
                sc["runAsGroup"] = gid.into();
                sc["fsGroup"] = gid.into();
            }
        }
        sc
    }

    /// A container's securityContext: no privilege escalation (no setuid program gains anything); for an image
    /// with a user of its own, every capability dropped as `restricted` asks.
    fn container_security_context(&self) -> Value {
        let mut sc = json!({"allowPrivilegeEscalation": false});
        if self.run_as_user().is_some() {
            sc["capabilities"] = json!({"drop": ["ALL"]});
        }
        sc
    }

    fn image_entry(&self) -> Option<&trainyard_core::catalog::Image> {
        self.spec.catalog.images.get(&self.task().environment.image)
    }

    /// The non-root user the catalog says the task's image runs as.
    pub(super) fn run_as_user(&self) -> Option<u32> {
        self.image_entry().and_then(|i| i.run_as_user).filter(|u| *u != 0)
    }

    /// Defaults, the task's env (hidden values from the Secret), then the platform's.
    fn env(&self, role: &str) -> Env {
        let (spec, task) = (self.spec, self.task());
        let mut env = Env::default();
        // An image that runs as a user of its own keeps that user's HOME (its passwd entry's, which ssh reads
        // too), not root's.
        let user = self.run_as_user().is_some();
        for (k, v) in pe::DEFAULTS.iter().filter(|(k, _)| !(user && *k == "HOME")) {
            env.value(k, *v);
        }
        for e in &task.environment.env {
            let src =
                if e.hidden { Source::Secret(env_key(&e.name)) } else { Source::Value(e.value.clone()) };
            env.set(&e.name, src);
        }
        let meta = &spec.task.metadata;
        env.value(pe::X_USER_NAME, &spec.owner);
        env.value(pe::X_ORG_NAME, &meta.project_group);
        env.value(pe::X_TENANT_ID, &meta.project_group);
        env.value(pe::X_REGION, &task.placement.region);
        env.value(pe::X_CLUSTER, &task.placement.cluster);
        env.value(pe::TASK_UUID, &spec.key.task_id);
        env.value("TRAINYARD_TASK_NAME", &spec.task_name);
        env.set("TRAINYARD_REPLICA", Source::Field("metadata.name".into()));
        env.value("TRAINYARD_ROLE", role);
        env.value("TRAINYARD_ATTEMPT", spec.key.attempt.to_string());
        env.set("TRAINYARD_NODE", Source::Field("spec.nodeName".into()));
        env.value("TRAINYARD_RUNTIME_DIR", RUNTIME_DIR);
        env
    }

    fn mounts(&self) -> Vec<Value> {
        let task = self.task();
        let env = &task.environment;
        let mut m = vec![json!({"name": "trainyard-runtime", "mountPath": RUNTIME_DIR})];
        if env.workdir.is_some() {
            m.push(json!({"name": WORKSPACE_VOLUME, "mountPath": WORKSPACE}));
        }
        for (i, v) in env.volumes.iter().enumerate() {
            m.push(
                json!({"name": format!("volume-{i}"), "mountPath": v.mount_path, "readOnly": v.read_only}),
            );
        }
        for (i, d) in env.datasets.iter().enumerate() {
            m.push(json!({"name": format!("dataset-{i}"), "mountPath": d.mount_path, "readOnly": true}));
        }
        for (i, d) in env.models.iter().enumerate() {
            m.push(json!({"name": format!("model-{i}"), "mountPath": d.mount_path, "readOnly": true}));
        }
        if task.task_type == TaskType::RayJob {
            let mut ray = json!({"name": "ray-tmp", "mountPath": "/tmp/ray"});
            if task.ray.as_ref().and_then(|r| r.shared_storage.as_ref()).is_some() {
                // The task's own directory in the shared volume, as on the local backend.
                ray["subPath"] = format!("ray-{}", self.spec.task_name).into();
            }
            m.push(ray);
        }
        if self.ssh {
            m.push(json!({"name": "trainyard-ssh", "mountPath": SSH_DIR, "readOnly": true}));
        }
        m
    }

    fn volumes(&self) -> Vec<Value> {
        let task = self.task();
        let env = &task.environment;
        let claim = |name: &str, claim: &str, ro: bool| json!({"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": ro}});
        let mut v = vec![json!({"name": "trainyard-runtime", "emptyDir": {}})];
        if env.workdir.is_some() {
            // The replica's own copy (replicas never share their writes), on the node's disk.
            v.push(json!({"name": WORKSPACE_VOLUME, "emptyDir": {}}));
        }
        for (i, m) in env.volumes.iter().enumerate() {
            v.push(claim(&format!("volume-{i}"), &m.volume, m.read_only));
        }
        for (i, m) in env.datasets.iter().enumerate() {
            v.push(claim(&format!("dataset-{i}"), &m.dataset, true));
        }
        for (i, m) in env.models.iter().enumerate() {
            v.push(claim(&format!("model-{i}"), &m.model, true));
        }
        if task.task_type == TaskType::RayJob {
            // Ray's sockets, logs and spilled objects: the task's shared volume when it has one, else the
            // pod's own disk (shared by its containers, as KubeRay's log collectors expect).
            match task.ray.as_ref().and_then(|r| r.shared_storage.as_ref()) {
                Some(sh) => v.push(claim("ray-tmp", &sh.volume, false)),
                None => v.push(json!({"name": "ray-tmp", "emptyDir": {}})),
            }
        }
        if self.ssh {
            // Root's alone, or readable by the image's own user (the only one in the pod) when it runs as one.
            let mode = if self.run_as_user().is_some() { 0o444 } else { 0o400 };
            v.push(json!({"name": "trainyard-ssh", "secret": {
                "secretName": ssh_secret_name(self.name), "defaultMode": mode,
            }}));
        }
        v
    }

    fn main_container(&self, role: &str, replicas: &[&ReplicaPlan]) -> Value {
        let task = self.task();
        let ray = task.task_type == TaskType::RayJob;
        let secret = env_secret_name(self.name);
        let mut c = json!({
            "name": if ray { format!("ray-{role}") } else { "pytorch".to_owned() },
            "image": self.image,
            "imagePullPolicy": "IfNotPresent",
            "env": self.env(role).render(&secret),
            "resources": self.resources(replicas),
            "volumeMounts": self.mounts(),
            "securityContext": self.container_security_context(),
        });
        if task.environment.workdir.is_some() {
            c["workingDir"] = WORKSPACE.into();
        }
        if ray {
            // KubeRay writes the container's command itself (`ray start` with the group's parameters).
            return c;
        }
        c["command"] = json!(["bash", "-c", self.wrapper(), "trainyard", task.environment.cmd]);
        c["ports"] = json!([{"name": "pytorchjob-port", "containerPort": MASTER_PORT, "protocol": "TCP"}]);
        if let Some((timeout_s, sig)) = self.checkpoint() {
            c["lifecycle"] =
                json!({"preStop": {"exec": {"command": ["bash", "-c", pre_stop_script(timeout_s, sig)]}}});
        }
        c
    }

    /// The shell that starts a PyTorchJob replica, then becomes `bash -c "$1"` (the task's cmd): the local
    /// sandbox's first shell, plus what the operators leave to us (hostfiles, sshd, `WORLD_SIZE`).
    fn wrapper(&self) -> String {
        let mut s = String::from(
            "# Catch the checkpoint signals until the command runs (a handler, not \"ignore\": exec resets it).\n\
             trap : USR1 USR2\n\
             # Files in shared volumes stay writable by the group's later attempts.\n\
             umask 0002\n",
        );
        // The operator's WORLD_SIZE is replicas x nprocPerNode; Trainyard's (the local backend's, the product's)
        // is the number of replicas, which the operator also sets as PET_NNODES.
        s.push_str("if [ -n \"${PET_NNODES:-}\" ]; then export WORLD_SIZE=\"$PET_NNODES\"; fi\n");
        // The replicas' home: root's, or for an image that runs as a user of its own, that user's (`HOME`, or
        // one in the runtime dir when the image gives it none it may write).
        if self.run_as_user().is_some() {
            s.push_str(&format!(
                "home=$(getent passwd \"$(id -u)\" 2>/dev/null | cut -d: -f6); home=${{home:-${{HOME:-/}}}}; export HOME=$home\n\
                 if ! {{ mkdir -p \"$home/.ssh\" && [ -w \"$home/.ssh\" ]; }} 2>/dev/null; then echo \"trainyard: the home $home is not the user's to write ($(ls -ld \"$home\" 2>&1)); using {RUNTIME_DIR}/home, where ssh finds no client config\" >&2; home={RUNTIME_DIR}/home; mkdir -p \"$home\"; export HOME=$home; fi\n"
            ));
        } else {
            s.push_str("home=/root\n");
        }
        let (hostfile, names) = self.hostfiles();
        s.push_str(&format!(
            // Quietly: an image without a writable home has no hostfiles (the redirection's own error, too).
            "{{ printf '%s\\n' {} > \"$home/hostfile\"; }} 2>/dev/null || true\n{{ printf '%s\\n' {} > \"$home/hostfile.hostname\"; }} 2>/dev/null || true\n",
            hostfile.iter().map(|l| shell_quote(l)).collect::<Vec<_>>().join(" "),
            names.join(" "),
        ));
        if self.ssh {
            s.push_str(
                "mkdir -p \"$home/.ssh\" && chmod 700 \"$home/.ssh\"\n\
                 for f in id_ed25519 id_ed25519.pub authorized_keys config; do cp SSH_DIR/$f \"$home/.ssh/$f\"; done\n\
                 chmod 600 \"$home/.ssh/id_ed25519\"\n"
                    .replace("SSH_DIR", SSH_DIR)
                    .as_str(),
            );
            if self.run_as_user().is_some() {
                // sshd as the user: its host key must be the user's own and not readable by others.
                s.push_str(&format!(
                    "mkdir -p -m 0700 {SSH_USER_DIR} && cp {SSH_DIR}/host_ed25519 {SSH_DIR}/authorized_keys {SSH_USER_DIR}/ && chmod 600 {SSH_USER_DIR}/host_ed25519\n"
                ));
            } else {
                s.push_str("mkdir -p -m 0755 /run/sshd\n");
            }
            s.push_str(&format!(
                "if [ -x /usr/sbin/sshd ]; then /usr/sbin/sshd -f {SSH_DIR}/sshd_config -E {RUNTIME_DIR}/sshd.log || {{ echo \"trainyard: sshd did not start: $(tail -n 3 {RUNTIME_DIR}/sshd.log 2>/dev/null)\" >&2; }}; else echo 'trainyard: passwordless SSH is on but the image has no /usr/sbin/sshd' >&2; fi\n"
            ));
        }
        s.push_str("exec bash -c \"$1\"\n");
        s
    }

    /// Pod DNS names of the job, as the operator names pods and their headless Services: (MPI-style
    /// hostfile lines with slots, names only).
    pub(super) fn hostfiles(&self) -> (Vec<String>, Vec<String>) {
        let mut names = Vec::new();
        for role in ["master", "worker"] {
            for r in self.by_role.get(role).map(Vec::as_slice).unwrap_or_default() {
                names.push(format!("{}-{role}-{}", self.name, r.index));
            }
        }
        let slots = self.task().pytorch.as_ref().and_then(|p| p.procs_per_node).unwrap_or(1).max(1);
        (names.iter().map(|n| format!("{n} slots={slots}")).collect(), names)
    }

    /// The precheck as an init container: the local backend's program (`precheck.py`, inline with
    /// `python3 -c`) and options. The operator sets the distributed variables only in regular containers, so
    /// they are set here: the rendezvous at [`precheck_service_name`] on `MASTER_PORT` (+1, by the program),
    /// `RANK` from the pod's replica index. It writes its JSON result to the termination message, where the
    /// watcher reads it (`status.initContainerStatuses[].state.terminated.message`); exit codes as locally.
    fn precheck_container(&self, role: &str, replicas: &[&ReplicaPlan]) -> Option<Value> {
        let p = self.precheck()?;
        let mut env = self.env(role);
        for e in &p.env {
            let src =
                if e.hidden { Source::Secret(precheck_key(&e.name)) } else { Source::Value(e.value.clone()) };
            env.set(&e.name, src);
        }
        env.value(pe::MASTER_ADDR, precheck_service_name(self.name));
        env.value(pe::MASTER_PORT, MASTER_PORT.to_string());
        env.value(pe::WORLD_SIZE, self.spec.replicas.len().to_string());
        env.set(
            "TRAINYARD_REPLICA_INDEX",
            Source::Field(format!("metadata.labels['{KF_REPLICA_INDEX_LABEL}']")),
        );
        let mut cmd = format!("--out /dev/termination-log --timeout-s {}", p.timeout_seconds);
        if let Some(t) = p.min_gemm_tflops {
            cmd.push_str(&format!(" --min-gemm-gflops {}", t * 1000.0));
        }
        if let Some(g) = p.min_allreduce_gbps {
            cmd.push_str(&format!(" --min-allreduce-gbps {g}"));
        }
        // RANK: 0 for the master, index + 1 for workers (as the operator numbers them).
        let offset = if role == "master" { 0 } else { 1 };
        let script =
            format!("export RANK=$((TRAINYARD_REPLICA_INDEX + {offset}))\nexec python3 -c \"$1\" {cmd}\n");
        Some(json!({
            "name": super::status::PRECHECK_CONTAINER,
            "image": self.image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["bash", "-c", script, "precheck", trainyard_runtime::replica::PRECHECK_PY],
            "env": env.render(&env_secret_name(self.name)),
            // Init containers' requests do not add to the pod's: the same GPUs serve the command after.
            "resources": self.resources(replicas),
            "volumeMounts": self.mounts(),
            "securityContext": self.container_security_context(),
        }))
    }

    /// The init container that makes the replica's copy of its working directory: `trainyard workdir fetch`
    /// (the server's image) with the attempt's token from its Secret, as the task's user where its image has
    /// one of its own (the copy is that user's to write), else as root, as the task runs. Its requests are the
    /// command's (init containers' do not add to the pod's). A failed fetch leaves its last output as the
    /// container's termination message, which the verdict reads (`status.rs`).
    fn workdir_container(&self, replicas: &[&ReplicaPlan]) -> Option<Value> {
        let id = self.task().environment.workdir.as_ref()?;
        let fetch = self.s.workdir.as_ref()?;
        let group = &self.spec.task.metadata.project_group;
        let mut sc = self.container_security_context();
        if self.run_as_user().is_none() {
            sc["runAsUser"] = 0.into();
        }
        Some(json!({
            "name": super::status::WORKDIR_CONTAINER,
            "image": fetch.image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["trainyard", "workdir", "fetch", id, "--group", group, "--into", WORKSPACE],
            "env": [
                {"name": "TRAINYARD_SERVER", "value": fetch.server},
                {"name": "TRAINYARD_TOKEN", "valueFrom": {"secretKeyRef": {
                    "name": env_secret_name(self.name), "key": WORKDIR_TOKEN_KEY,
                }}},
                // No config file of the image's is read.
                {"name": "TRAINYARD_CONFIG", "value": "/dev/null"},
                {"name": "HOME", "value": "/tmp"},
            ],
            "resources": self.resources(replicas),
            "volumeMounts": [{"name": WORKSPACE_VOLUME, "mountPath": WORKSPACE}],
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "securityContext": sc,
        }))
    }

    pub(super) fn precheck_service(&self) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": self.metadata(&precheck_service_name(self.name)),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": true,
                "selector": {KF_JOB_NAME_LABEL: self.name, KF_REPLICA_TYPE_LABEL: "master"},
                "ports": [{"name": "precheck", "port": MASTER_PORT + 1, "protocol": "TCP"}],
            }
        })
    }
}
