//! A real `trainyard up` on the local backend in a temp data dir, driven over its HTTP API, for the
//! end-to-end tests. Dropping a [`Server`] kills it and every supervisor and sandbox it started.

#![allow(dead_code)]

pub mod console;
pub mod kueue;
pub mod leaders;
pub mod pg;
pub mod server_image;
pub mod webdriver;

use serde_json::{Value, json};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Three 3-vCPU nodes (a `cpu.large` replica takes a node of its own) (declared, not real: the replicas are small), the `host` image with torch and Ray,
/// an image that is not here, a volume and a dataset.
pub const CATALOG: &str = r#"
regions: {local: {}}
clusters: {local: {region: local}}
pools:
  default: {cluster: local, instanceSpecs: [cpu.small, cpu.large]}
instanceSpecs:
  cpu.small: {kind: CPU, vcpus: 1, memoryMib: 1024}
  cpu.large: {kind: CPU, vcpus: 2, memoryMib: 4096}
nodes:
  node-a: {pool: default, vcpus: 3, memoryMib: 12288}
  node-b: {pool: default, vcpus: 3, memoryMib: 12288}
  node-c: {pool: default, vcpus: 3, memoryMib: 12288}
projectGroups: {default: {}}
images:
  host: {torch: true, ray: true}
  elsewhere: {}
allowExternalImages: false
volumes: {out: {multiPodReadWrite: true}, raytmp: {multiPodReadWrite: true}}
datasets: {data: {}}
quotas:
  - {group: default, resourceType: Reserved, pool: default, spec: cpu.small, units: 12}
  - {group: default, resourceType: Reserved, pool: default, spec: cpu.large, units: 6}
"#;

pub struct Server {
    pub dir: PathBuf,
    pub base: String,
    pub token: String,
    child: Option<Child>,
    agent: ureq::Agent,
    path: Option<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

/// How a test's server starts, beyond the defaults.
#[derive(Debug, Default, Clone)]
pub struct Options {
    /// The server's PATH (replicas of the `host` image see it).
    pub path: Option<String>,
    /// More arguments for `trainyard up`.
    pub args: Vec<String>,
    /// Where the data dir goes instead of the temp dir.
    pub parent: Option<PathBuf>,
    /// Keep the catalog `up` writes for this machine instead of [`CATALOG`].
    pub own_catalog: bool,
    /// Environment variables for `trainyard up`.
    pub env: Vec<(String, String)>,
    /// Another server's data dir whose admin token and server key this one starts with (a second server
    /// on a shared PostgreSQL store: the store has the admin, and hidden values are sealed under one key).
    pub seed: Option<PathBuf>,
    /// The address to listen on instead of `127.0.0.1:0`.
    pub listen: Option<String>,
}

/// An HTTP client that answers every status (errors are data) and gives up after 30 s.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

fn spawn(
    dir: &Path,
    listen: &str,
    path: Option<&str>,
    args: &[String],
    env: &[(String, String)],
) -> (Child, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainyard"));
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    cmd.arg("up");
    if !args.iter().any(|a| a == "--backend") {
        cmd.args(["--backend", "local"]);
    }
    cmd.args(["--listen", listen, "--data-dir"])
        .arg(dir)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(p) = path {
        cmd.env("PATH", p);
    }
    let mut child = cmd.spawn().expect("trainyard up starts");
    let (api, _) = api_address(&mut child);
    (child, api)
}

/// Reads what a `trainyard up` started with piped stdout prints until its API address: the address (without
/// `/api/v1`) and everything printed up to it. The rest of its output is drained in the background.
pub fn api_address(child: &mut Child) -> (String, String) {
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout is piped")).lines();
    let mut printed = String::new();
    let mut api = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        printed.push_str(&line);
        printed.push('\n');
        if let Some(rest) = line.trim().strip_prefix("API:") {
            api = rest.split_whitespace().next().map(|u| u.trim_end_matches("/api/v1").to_owned());
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    (api.unwrap_or_else(|| panic!("no API address in:\n{printed}")), printed)
}

impl Server {
    /// Starts a server on a fresh data dir with [`CATALOG`]. `path` is the server's PATH (replicas of the
    /// `host` image see it).
    pub fn start(name: &str, path: Option<&str>) -> Server {
        Server::start_with(name, Options { path: path.map(str::to_owned), ..Options::default() })
    }

    /// Starts a server as [`Server::start`] does, with more options.
    pub fn start_with(name: &str, opts: Options) -> Server {
        let parent = opts.parent.clone().unwrap_or_else(std::env::temp_dir);
        let dir = parent.join(format!("ty-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let dir = dir.canonicalize().unwrap();
        if let Some(seed) = &opts.seed {
            for file in ["admin.token", "server.key"] {
                std::fs::copy(seed.join(file), dir.join(file)).unwrap();
            }
        }
        let (child, base) = spawn(
            &dir,
            opts.listen.as_deref().unwrap_or("127.0.0.1:0"),
            opts.path.as_deref(),
            &opts.args,
            &opts.env,
        );
        let token = std::fs::read_to_string(dir.join("admin.token")).unwrap().trim().to_owned();
        let s = Server {
            dir,
            base,
            token,
            child: Some(child),
            agent: agent(),
            path: opts.path,
            args: opts.args,
            env: opts.env,
        };
        if !opts.own_catalog {
            let (status, body) = s.call("PUT", "/api/v1/admin/catalog", Some(CATALOG));
            assert_eq!(status, 200, "{body}");
        }
        s
    }

    /// The value given to `trainyard up` after `flag`.
    pub fn args_value(&self, flag: &str) -> String {
        let i = self
            .args
            .iter()
            .position(|a| a == flag)
            .unwrap_or_else(|| panic!("no {flag} in {:?}", self.args));
        self.args[i + 1].clone()
    }

    /// The server process's id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGKILL, as a crash: supervisors and training go on.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, as an admin (or systemd) stops it, and waits for it to end (SIGKILL after 30 s).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").args(["-TERM", &c.id().to_string()]).status();
            let t0 = std::time::Instant::now();
            while matches!(c.try_wait(), Ok(None)) && t0.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts again on the same data dir and address.
    pub fn restart(&mut self) {
        self.kill();
        let listen = self.base.trim_start_matches("http://").to_owned();
        let (child, _) = spawn(&self.dir, &listen, self.path.as_deref(), &self.args, &self.env);
        self.child = Some(child);
    }

    pub fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let url = format!("{}{path}", self.base);
        let auth = format!("Bearer {}", self.token);
        let resp = match (method, body) {
            ("GET", _) => self.agent.get(&url).header("Authorization", &auth).call(),
            ("DELETE", _) => self.agent.delete(&url).header("Authorization", &auth).call(),
            ("PUT", b) => {
                self.agent.put(&url).header("Authorization", &auth).send(b.unwrap_or("").as_bytes())
            }
            (_, b) => self.agent.post(&url).header("Authorization", &auth).send(b.unwrap_or("").as_bytes()),
        };
        let mut r = resp.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        (r.status().as_u16(), r.body_mut().read_to_string().unwrap_or_default())
    }

    pub fn submit(&self, task: &Value) -> String {
        let (status, body) = self.call("POST", "/api/v1/tasks", Some(&task.to_string()));
        assert!(status == 201 || status == 200, "{status}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        v["id"].as_str().unwrap().to_owned()
    }

    pub fn task(&self, id: &str) -> Value {
        let (status, body) = self.call("GET", &format!("/api/v1/tasks/{id}"), None);
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    pub fn events(&self, id: &str) -> Vec<(String, String)> {
        let (_, body) = self.call("GET", &format!("/api/v1/tasks/{id}/events"), None);
        let v: Value = serde_json::from_str(&body).unwrap();
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["reason"].as_str().unwrap().to_owned(), e["message"].as_str().unwrap().to_owned()))
            .collect()
    }

    /// The `trainyard` CLI against this server as its admin, run from the repository's root (so example paths
    /// work as written); what it printed, asserting that it succeeded.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_trainyard"))
            .args(args)
            .env("TRAINYARD_SERVER", &self.base)
            .env("TRAINYARD_TOKEN", &self.token)
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .output()
            .unwrap();
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "trainyard {args:?}: {text}");
        text
    }

    /// The CLI as [`Server::cli`] runs it, with `stdin` on its standard input.
    pub fn cli_with_stdin(&self, args: &[&str], stdin: &str) -> String {
        use std::io::Write;
        let mut child = Command::new(env!("CARGO_BIN_EXE_trainyard"))
            .args(args)
            .env("TRAINYARD_SERVER", &self.base)
            .env("TRAINYARD_TOKEN", &self.token)
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "trainyard {args:?}: {text}");
        text
    }

    pub fn events_text(&self, id: &str) -> String {
        self.events(id).iter().map(|(r, m)| format!("  {r}: {m}\n")).collect()
    }

    /// Waits until the task's status is `want`; panics with its events when it ends otherwise or times out.
    pub fn wait_status(&self, id: &str, want: &str, timeout: Duration) -> Value {
        let t0 = Instant::now();
        loop {
            let t = self.task(id);
            let status = t["status"].as_str().unwrap_or("").to_owned();
            if status == want {
                return t;
            }
            let terminal = ["Succeeded", "Failed", "Stopped"];
            if terminal.contains(&status.as_str()) && terminal.contains(&want) || t0.elapsed() > timeout {
                panic!(
                    "task {id} is {status}, not {want}, after {:?}; events:\n{}\nlogs:\n{}",
                    t0.elapsed(),
                    self.events_text(id),
                    self.all_logs(id)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until an event with `reason` appears.
    pub fn wait_event(&self, id: &str, reason: &str, timeout: Duration) -> String {
        let t0 = Instant::now();
        loop {
            if let Some((_, m)) = self.events(id).into_iter().find(|(r, _)| r == reason) {
                return m;
            }
            assert!(
                t0.elapsed() < timeout,
                "no {reason} event for {id} in {timeout:?}; events:\n{}\nlogs:\n{}",
                self.events_text(id),
                self.all_logs(id)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// One replica's log (latest attempt unless given).
    pub fn log(&self, id: &str, replica: &str, attempt: Option<i64>) -> String {
        let a = attempt.map_or(String::new(), |a| format!("&attempt={a}"));
        self.call("GET", &format!("/api/v1/tasks/{id}/logs?replica={replica}{a}"), None).1
    }

    /// Every replica's log of every attempt, for failure messages.
    pub fn all_logs(&self, id: &str) -> String {
        let (_, body) = self.call("GET", &format!("/api/v1/tasks/{id}/logs"), None);
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let mut out = String::new();
        for a in v["items"].as_array().cloned().unwrap_or_default() {
            for r in a["replicas"].as_array().cloned().unwrap_or_default() {
                let name = r["name"].as_str().unwrap_or("");
                out.push_str(&format!("--- attempt {} {name}\n", a["attempt"]));
                out.push_str(&self.log(id, name, a["attempt"].as_i64()));
            }
        }
        out
    }

    /// Waits until a replica's log contains `needle`.
    pub fn wait_log(&self, id: &str, replica: &str, needle: &str, timeout: Duration) {
        let t0 = Instant::now();
        while !self.log(id, replica, None).contains(needle) {
            assert!(
                t0.elapsed() < timeout,
                "{replica} never logged {needle:?}; events:\n{}\nlogs:\n{}",
                self.events_text(id),
                self.all_logs(id)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Processes on this machine whose command line contains `needle` (the test's own excepted).
    pub fn processes_with(needle: &str) -> Vec<u32> {
        let me = std::process::id();
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| pid != me)
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).replace('\0', " ").contains(needle))
            })
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        // Supervisors carry the data dir in their command line; their sandboxes die with them.
        let dir = self.dir.display().to_string();
        for pid in Server::processes_with(&dir) {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        // A passing test leaves nothing behind (a torch image's cache is gigabytes, and CI runs every test in
        // one disk); a failing one keeps its data dir to be read.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A PyTorchJob with `workers` workers running `cmd` on the `host` image.
pub fn pytorch(prefix: &str, workers: u32, cmd: &str) -> Value {
    pytorch_on("cpu.small", prefix, workers, cmd)
}

pub fn pytorch_on(spec: &str, prefix: &str, workers: u32, cmd: &str) -> Value {
    json!({
        "apiVersion": "trainyard.dev/v1", "kind": "TrainingTask",
        "metadata": {"namePrefix": prefix, "projectGroup": "default"},
        "spec": {
            "type": "PyTorchJob",
            "placement": {"region": "local", "cluster": "local"},
            "environment": {"image": "host", "cmd": cmd},
            "compute": {"resourceType": "Reserved", "pool": "default", "workers": workers,
                        "instanceSpecs": [{"spec": spec}]}
        }
    })
}

/// A RayJob with `workers` workers on `cpu.large` (a node each) running `entrypoint`, with these `ray`
/// settings.
pub fn rayjob(prefix: &str, workers: u32, entrypoint: &str, ray: Value) -> Value {
    let mut t = pytorch_on("cpu.large", prefix, workers, entrypoint);
    t["spec"]["type"] = json!("RayJob");
    t["spec"]["ray"] = ray;
    t
}

/// A torchrun job's command: a gloo all-reduce over every rank, checked, printed as
/// `all-reduce gave S over N ranks`. (`--redirects 1 --tee 1`: Debian's torch 1.13 under Python 3.11 cannot
/// parse torchrun's default `0` for these, an enum change in 3.11.)
pub const TORCHRUN_ALL_REDUCE: &str = r#"cat > /tmp/allreduce.py <<'PY'
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
n = dist.get_world_size()
assert t.item() == n * (n + 1) / 2, t
print("all-reduce gave", t.item(), "over", n, "ranks with torch", torch.__version__, flush=True)
dist.destroy_process_group()
PY
torchrun --redirects 1 --tee 1 /tmp/allreduce.py"#;

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}
