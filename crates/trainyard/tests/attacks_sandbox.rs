//! The sandbox, attacked the way a hostile member's task would: each test runs a task that tries one thing
//! it must not be able to do, reports what it got, and checks both that the attack failed and that the
//! legitimate path next to it still works. Each was written against the sandbox as it was (host root, the
//! host's network) and failed there.

mod common;

use common::{Options, Server, pytorch, secs};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The first of the attempts' host uids (`trainyard_local::UID_BASE`).
const UID_BASE: u32 = 1_900_000_001;
const SANDBOX_GID: u32 = 1_900_000_000;

/// A task's JSON line `REPORT {...}` from its master's log.
fn report(s: &Server, id: &str) -> Value {
    let name = s.task(id)["name"].as_str().unwrap().to_owned();
    let log = s.log(id, &format!("{name}-master-0"), None);
    let line = log
        .lines()
        .find_map(|l| l.split_once("REPORT ").map(|(_, r)| r.to_owned()))
        .unwrap_or_else(|| panic!("no report in the log:\n{log}\nevents:\n{}", s.events_text(id)));
    serde_json::from_str(&line).unwrap()
}

/// A scratch dir on the host, outside anything a sandbox binds.
fn host_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(format!("/var/tmp/ty-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    d
}

/// The Uid line of a process (real uid).
fn uid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_whitespace().next()?.parse().ok()
}

fn pid_ns(pid: u32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()
}

/// Finding 1: the sandbox was host root with every capability. Now: an unprivileged uid on the host, no
/// capabilities, no_new_privs, a seccomp filter that refuses file handles, keyrings, BPF and new user
/// namespaces, a read-only dataset that stays read-only, /proc/sys read-only, and a cgroup it cannot leave.
#[test]
#[cfg(target_arch = "x86_64")] // the task names system calls by their x86_64 numbers
fn a_task_is_an_unprivileged_user_without_capabilities() {
    let s = Server::start("attack-root", None);
    std::fs::create_dir_all(s.dir.join("datasets/data")).unwrap();
    let marker = format!("uid-probe-{}", std::process::id());
    let cmd = format!(
        r#"python3 - {marker} <<'EOF'
import ctypes, json, os, subprocess, time
libc = ctypes.CDLL(None, use_errno=True)
def sc(nr, *a):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(x) for x in a])
    return 0 if r != -1 else ctypes.get_errno()
st = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
out = {{
    "uid": os.getuid(),
    "cap_eff": st["CapEff"].strip(),
    "no_new_privs": st["NoNewPrivs"].strip(),
    "seccomp": st["Seccomp"].strip(),
    "open_by_handle_at": sc(304, 0, 0, 0),
    "keyctl": sc(250, 0, 0, 0),
    "bpf": sc(321, 0, 0, 0),
    "unshare_user": sc(272, 0x10000000),
    "no_aslr": sc(135, 0x0040000),
    "vsock": sc(41, 40, 1, 0),
    "uevent": sc(41, 16, 3, 15),
    "memfd_secret": sc(447, 0),
    "netlink_route": 0 if sc(41, 16, 3, 0) == 0 else "refused",
    "remount": subprocess.run(["mount", "-o", "remount,rw", "/mnt/data"], capture_output=True).returncode,
    "cgroup": open("/proc/self/cgroup").read().strip().splitlines(),
}}
def attempt(what, f):
    try:
        f(); out[what] = "done"
    except OSError as e:
        out[what] = e.errno
attempt("dataset_write", lambda: open("/mnt/data/planted", "w").write("x"))
core = open("/proc/sys/kernel/core_pattern").read()
attempt("sysctl_write", lambda: open("/proc/sys/kernel/core_pattern", "w").write(core))
procs = [p for p in ["/sys/fs/cgroup/memory/cgroup.procs", "/sys/fs/cgroup/cgroup.procs"] if os.path.exists(p)]
attempt("cgroup_escape", lambda: open((procs or ["/sys/fs/cgroup/none"])[0], "w").write(str(os.getpid())))
open("/mnt/out/legit", "w").write("written by a replica")
print("REPORT " + json.dumps(out), flush=True)
time.sleep(3)
EOF"#
    );
    let mut task = pytorch("root", 0, &cmd);
    task["spec"]["environment"]["datasets"] = json!([{"dataset": "data", "mountPath": "/mnt/data"}]);
    task["spec"]["environment"]["volumes"] = json!([{"volume": "out", "mountPath": "/mnt/out"}]);
    let id = s.submit(&task);
    let name = s.wait_status(&id, "Running", secs(60))["name"].as_str().unwrap().to_owned();
    s.wait_log(&id, &format!("{name}-master-0"), "REPORT", secs(30));
    // On the host, the replica's processes belong to an unprivileged uid of the attempt's own.
    let pids = Server::processes_with(&marker);
    assert!(!pids.is_empty(), "the task's process is there");
    for pid in pids {
        let uid = uid_of(pid).unwrap();
        assert!(uid >= UID_BASE, "process {pid} of the task runs as host uid {uid}");
    }
    s.wait_status(&id, "Succeeded", secs(60));
    let r = report(&s, &id);
    assert_eq!(r["uid"], 1000, "{r}");
    assert_eq!(r["cap_eff"], "0000000000000000", "{r}");
    assert_eq!(r["no_new_privs"], "1", "{r}");
    assert_eq!(r["seccomp"], "2", "{r}");
    for call in
        ["open_by_handle_at", "keyctl", "bpf", "unshare_user", "no_aslr", "vsock", "uevent", "memfd_secret"]
    {
        assert_eq!(r[call], 1, "{call} must fail with EPERM: {r}");
    }
    assert_eq!(
        r["netlink_route"], 0,
        "a route netlink socket (what `ip` and getaddrinfo use) still opens: {r}"
    );
    assert_ne!(r["remount"], 0, "{r}");
    assert_ne!(r["dataset_write"], "done", "{r}");
    assert_ne!(r["sysctl_write"], "done", "{r}");
    assert_ne!(r["cgroup_escape"], "done", "{r}");
    // Its own cgroup namespace: every hierarchy shows it at its root.
    assert!(r["cgroup"].as_array().unwrap().iter().all(|l| l.as_str().unwrap().ends_with(":/")), "{r}");
    assert!(!s.dir.join("datasets/data/planted").exists());
    // The legitimate path: the volume took the replica's write.
    assert_eq!(std::fs::read_to_string(s.dir.join("volumes/out/legit")).unwrap(), "written by a replica");
}

/// Finding 2: the task's env was bubblewrap's own environment on the host (a preload or a debug output
/// there ran as host root before any namespace existed). Now no host-side process carries it: a hidden
/// value is in the environ of the sandbox's processes only, and ld.so's debug output never reaches the host.
#[test]
fn the_tasks_env_never_reaches_a_host_side_process() {
    let s = Server::start("attack-env", None);
    let out = host_dir("ld-debug");
    let secret = format!("s3cr3t-{}", std::process::id());
    let mut task = pytorch("env", 0, "echo started; sleep 3; test -n \"$SECRET_TOKEN\" && echo has-secret");
    task["spec"]["environment"]["env"] = json!([
        {"name": "LD_DEBUG", "value": "files"},
        {"name": "LD_DEBUG_OUTPUT", "value": out.join("ld").display().to_string()},
        {"name": "SECRET_TOKEN", "value": secret, "hidden": true},
    ]);
    let id = s.submit(&task);
    let name = s.wait_status(&id, "Running", secs(60))["name"].as_str().unwrap().to_owned();
    s.wait_log(&id, &format!("{name}-master-0"), "started", secs(30));
    let mine = pid_ns(std::process::id());
    let mut inside = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        if String::from_utf8_lossy(&environ).contains(&secret) {
            assert_ne!(pid_ns(pid), mine, "host-side process {pid} carries the task's hidden value");
            inside += 1;
        }
    }
    assert!(inside > 0, "the sandbox's processes have the value");
    s.wait_status(&id, "Succeeded", secs(60));
    assert!(s.log(&id, &format!("{name}-master-0"), None).contains("has-secret"));
    let written: Vec<_> = std::fs::read_dir(&out).unwrap().flatten().map(|e| e.path()).collect();
    assert!(written.is_empty(), "ld.so wrote on the host: {written:?}");
    let _ = std::fs::remove_dir_all(&out);
}

/// Runs `task` with the exit checkpoint on until its master logs `ready`, then stops it and waits until it is
/// Stopped; returns its id and name.
fn stopped_with_a_checkpoint(s: &Server, mut task: Value, ready: &str) -> (String, String) {
    task["spec"]["advanced"] = json!({"exitCheckpoint": {"enabled": true, "timeoutSeconds": 20}});
    let id = s.submit(&task);
    let name = s.wait_status(&id, "Running", secs(60))["name"].as_str().unwrap().to_owned();
    s.wait_log(&id, &format!("{name}-master-0"), ready, secs(30));
    let (status, body) = s.call("POST", &format!("/api/v1/tasks/{id}/stop"), None);
    assert_eq!(status, 200, "{body}");
    s.wait_status(&id, "Stopped", secs(60));
    (id, name)
}

/// Finding 3: the supervisor followed links the task planted in its runtime dir, and overwrote a host file
/// at stop. Now the notice replaces whatever is there with a fresh file; the host file is untouched.
#[test]
fn the_supervisor_never_follows_a_link_the_task_planted() {
    let s = Server::start("attack-link", None);
    let victim_dir = host_dir("victim");
    let victim = victim_dir.join("victim");
    std::fs::write(&victim, "original").unwrap();
    let cmd = format!(
        r#"rt=$TRAINYARD_RUNTIME_DIR
ln -s {victim} $rt/checkpoint-requested
ln -s {victim} $rt/checkpoint-done.tmp
trap 'if [ -f $rt/checkpoint-requested ] && [ ! -L $rt/checkpoint-requested ]; then echo notice-is-a-file; fi; touch $rt/checkpoint-done' USR1
echo planted
while true; do sleep 0.2; done"#,
        victim = victim.display()
    );
    let (id, name) = stopped_with_a_checkpoint(&s, pytorch("link", 0, &cmd), "planted");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "original", "the host file was overwritten");
    assert!(s.log(&id, &format!("{name}-master-0"), None).contains("notice-is-a-file"));
    assert!(s.events_text(&id).contains("checkpoint reported done"), "{}", s.events_text(&id));
    let _ = std::fs::remove_dir_all(&victim_dir);
}

/// Finding 4: the `host` image showed the whole host to uid 0: shadow files, SSH host keys, and the data dir
/// (server key, admin token, database) when it lived under a bound path. Now the view is system dirs only.
#[test]
fn the_host_image_shows_no_secrets_of_the_host() {
    // A data dir under /opt, which the `host` view shows.
    let s = Server::start_with("attack-view", Options { parent: Some("/opt".into()), ..Options::default() });
    let data = s.dir.display().to_string();
    // A volume an admin keeps under /opt, open to everyone on the host: a task that does not mount it must
    // not reach it through the host's tree.
    let admin_vol = PathBuf::from(format!("/opt/ty-admin-volume-{}", std::process::id()));
    std::fs::create_dir_all(&admin_vol).unwrap();
    std::fs::write(admin_vol.join("secret"), "another group's data").unwrap();
    std::fs::set_permissions(&admin_vol, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let (_, catalog) = s.call("GET", "/api/v1/catalog", None);
    let mut catalog: Value = serde_json::from_str(&catalog).unwrap();
    catalog["volumes"]["elsewhere"] = json!({"path": admin_vol.display().to_string()});
    let (status, body) = s.call("PUT", "/api/v1/admin/catalog", Some(&catalog.to_string()));
    assert_eq!(status, 200, "{body}");
    let cmd = format!(
        r#"for f in /etc/shadow /etc/gshadow /etc/ssh/ssh_host_ed25519_key /etc/ssh/ssh_host_rsa_key {data}/admin.token {data}/server.key {data}/trainyard.db; do
  if [ -s "$f" ] && head -c1 "$f" >/dev/null 2>&1; then echo "READ $f"; fi
done
ls /home >/dev/null 2>&1 && echo "SEE /home"
ls {data} 2>/dev/null | grep -q . && echo "SEE the data dir"
cat {vol}/secret 2>/dev/null && echo "READ the admin's volume"
test -x /usr/bin/python3 && echo "system dirs are there"
echo checked"#,
        vol = admin_vol.display()
    );
    let id = s.submit(&pytorch("view", 0, &cmd));
    let t = s.wait_status(&id, "Succeeded", secs(60));
    let log = s.log(&id, &format!("{}-master-0", t["name"].as_str().unwrap()), None);
    assert!(log.contains("checked") && log.contains("system dirs are there"), "{log}");
    assert!(!log.contains("READ") && !log.contains("SEE"), "{log}");
    let dir = s.dir.clone();
    drop(s);
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(admin_vol);
}

/// Issue 29, item 11: inside a sandbox the host's network interfaces were listed in `/sys/class/net`, and
/// pid 1's command line (bubblewrap's, readable by every process inside) named the data dir and the task's
/// paths. Now both show nothing of the host; the replica's own interfaces are still there (netlink).
#[test]
fn a_sandbox_lists_no_host_interface_and_no_host_path_in_its_command_lines() {
    let s = Server::start("attack-names", None);
    let data = s.dir.display().to_string();
    let cmd = r#"echo "NET[$(ls /sys/class/net /sys/devices/virtual/net 2>&1 | tr '\n' ' ')]"
for p in /proc/[0-9]*; do echo "CMDLINE $(tr '\0' ' ' < $p/cmdline 2>/dev/null)"; done
echo "OWN[$(cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' ' | sort | tr '\n' ' ')]"
echo checked"#;
    let id = s.submit(&pytorch("names", 0, cmd));
    let t = s.wait_status(&id, "Succeeded", secs(60));
    let log = s.log(&id, &format!("{}-master-0", t["name"].as_str().unwrap()), None);
    assert!(log.contains("checked"), "{log}");
    let host: Vec<String> = std::fs::read_dir("/sys/class/net")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    // Each log line is "TIME STREAM TEXT".
    let out: Vec<&str> = log.lines().filter_map(|l| l.split_once(" O ").map(|(_, text)| text)).collect();
    let net = out.iter().find_map(|l| l.strip_prefix("NET[")).unwrap();
    for i in host.iter().filter(|i| *i != "lo") {
        assert!(!net.contains(i.as_str()), "the host's {i} is listed: {net}");
    }
    let cmdlines: Vec<&&str> = out.iter().filter(|l| l.starts_with("CMDLINE")).collect();
    assert!(cmdlines.iter().any(|l| l.contains("bwrap --args")), "pid 1 is bubblewrap's: {cmdlines:?}");
    for l in &cmdlines {
        assert!(!l.contains(&data) && !l.contains("--ro-bind"), "a command line names the host: {l}");
    }
    // The replica's own interfaces (its namespace's, read from /proc: a single replica has loopback only)
    // are there.
    let own = out.iter().find_map(|l| l.strip_prefix("OWN[")).unwrap();
    assert_eq!(own, "lo ]", "{log}");
}

/// Finding 18 (part): the data dir, database and logs were world-readable. Now the data dir is passable by
/// the sandboxes' group only and everything the server keeps is its own.
#[test]
fn the_data_dir_is_the_servers_own() {
    use std::os::unix::fs::MetadataExt;
    let s = Server::start("attack-modes", None);
    let id = s.submit(&pytorch("modes", 0, "echo hello"));
    let t = s.wait_status(&id, "Succeeded", secs(60));
    let meta = std::fs::metadata(&s.dir).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o710, "data dir");
    assert_eq!(meta.gid(), SANDBOX_GID);
    let log = s.dir.join(format!("runs/{id}/a0/{}-master-0/log", t["name"].as_str().unwrap()));
    for f in [s.dir.join("trainyard.db"), s.dir.join("admin.token"), s.dir.join("server.key"), log] {
        let mode = std::fs::metadata(&f).unwrap().mode() & 0o777;
        assert_eq!(mode & 0o077, 0, "{} is mode {mode:o}", f.display());
    }
}

/// Finding 5: every task shared the host's network (other tenants' servers on 127.0.0.1, the API, every
/// listener in /proc/net/tcp). Now a replica reaches its own task's replicas and nothing else.
#[test]
fn replicas_reach_their_own_task_and_nothing_else() {
    let s = Server::start("attack-net", None);
    // Something of the host's, on every address.
    let host = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let host_port = host.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in host.incoming().flatten() {
            let _ = std::io::Write::write_all(&mut &c, b"host-secret");
        }
    });
    let api_port: u16 = s.base.rsplit(':').next().unwrap().parse().unwrap();
    let host_ip = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .ok()
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            text.split_whitespace()
                .skip_while(|w| *w != "inet")
                .nth(1)
                .map(|a| a.split('/').next().unwrap().to_owned())
        })
        .unwrap_or_else(|| "127.0.0.1".into());
    // Another tenant's server.
    let other_port = 20_000 + (std::process::id() % 10_000) as u16;
    let other = s.submit(&pytorch(
        "other",
        0,
        &format!("echo serving; exec python3 -m http.server {other_port} --bind 0.0.0.0 --directory /tmp"),
    ));
    let other_name = s.wait_status(&other, "Running", secs(60))["name"].as_str().unwrap().to_owned();
    s.wait_log(&other, &format!("{other_name}-master-0"), "serving", secs(30));
    std::thread::sleep(Duration::from_millis(500));
    let probe = format!(
        r#"python3 - <<'EOF'
import json, os, socket, time
def reach(host, port):
    try:
        socket.create_connection((host, port), 2).close(); return True
    except OSError:
        return False
def own_loopback_v6():
    try:
        l = socket.socket(socket.AF_INET6); l.bind(("::1", 0)); l.listen()
        socket.create_connection(("::1", l.getsockname()[1]), 2).close(); return True
    except OSError:
        return False
if os.environ["RANK"] != "0":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 9000)); s.listen(); s.settimeout(60)
    s.accept()[0].close()
    raise SystemExit(0)
sibling = False
for _ in range(100):
    if reach(os.environ["MASTER_ADDR"].replace("master-0", "worker-0"), 9000):
        sibling = True; break
    time.sleep(0.2)
tcp = open("/proc/net/tcp").read() + open("/proc/net/tcp6").read()
out = {{
    "sibling": sibling,
    "own_loopback_v6": own_loopback_v6(),
    "host_loopback": reach("127.0.0.1", {host_port}),
    "host_address": reach("{host_ip}", {host_port}),
    "api": reach("127.0.0.1", {api_port}),
    "other_tenant": reach("127.0.0.1", {other_port}),
    "listeners_seen": ":%04X" % {host_port} in tcp or ":%04X" % {api_port} in tcp,
}}
print("REPORT " + json.dumps(out), flush=True)
EOF"#
    );
    let id = s.submit(&pytorch("net", 1, &probe));
    s.wait_status(&id, "Succeeded", secs(90));
    let r = report(&s, &id);
    assert_eq!(r["sibling"], true, "the task's own replicas reach each other: {r}");
    // The replica's links have no IPv6 (see netns.rs); its loopback keeps it, for programs that listen on it.
    assert_eq!(r["own_loopback_v6"], true, "{r}");
    for what in ["host_loopback", "host_address", "api", "other_tenant", "listeners_seen"] {
        assert_eq!(r[what], false, "{what}: {r}");
    }
    let (status, body) = s.call("POST", &format!("/api/v1/tasks/{other}/stop"), None);
    assert_eq!(status, 200, "{body}");
}

/// Finding 9: a `trap ... USR1` in the user's command never fired (the signal arrived ignored). Now the
/// user's shell catches it and the checkpoint lands.
#[test]
fn a_trap_in_the_users_shell_receives_the_checkpoint_signal() {
    let s = Server::start("attack-trap", None);
    let cmd = r#"trap 'echo saving; echo step-7 > /mnt/out/ckpt; touch $TRAINYARD_RUNTIME_DIR/checkpoint-done' USR1
echo ready
while true; do sleep 0.2; done"#;
    let mut task = pytorch("trap", 0, cmd);
    task["spec"]["environment"]["volumes"] = json!([{"volume": "out", "mountPath": "/mnt/out"}]);
    let (id, _) = stopped_with_a_checkpoint(&s, task, "ready");
    assert_eq!(std::fs::read_to_string(s.dir.join("volumes/out/ckpt")).unwrap(), "step-7\n");
    assert!(s.events_text(&id).contains("checkpoint reported done"), "{}", s.events_text(&id));
}

/// Finding 17: no limit on processes, log size or scratch (a fork bomb took the host). Now each replica has
/// a pids limit, a log that rotates with an event, and scratch over its limit ends the replica with a reason.
#[test]
fn processes_logs_and_scratch_are_limited() {
    let opts = Options {
        args: ["--replica-pids-max", "64", "--replica-log-kib", "256", "--replica-scratch-mib", "16"]
            .map(str::to_owned)
            .to_vec(),
        ..Options::default()
    };
    let s = Server::start_with("attack-limits", opts);
    let fork = s.submit(&pytorch(
        "fork",
        0,
        r#"python3 - <<'EOF'
import os, time
n = 0
try:
    for _ in range(400):
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        n += 1
    print("forked", n, flush=True)
except OSError as e:
    print("fork refused after", n, "errno", e.errno, flush=True)
EOF"#,
    ));
    let flood = s.submit(&pytorch(
        "flood",
        0,
        "python3 -c \"import sys; [print('line', i, 'x' * 100) for i in range(20000)]\"; echo last-line",
    ));
    let fill =
        s.submit(&pytorch("fill", 0, "dd if=/dev/zero of=/tmp/fill bs=1M count=64 status=none; sleep 60"));

    let t = s.wait_status(&fork, "Succeeded", secs(60));
    let log = s.log(&fork, &format!("{}-master-0", t["name"].as_str().unwrap()), None);
    let refused_after: u32 = log
        .split("fork refused after ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("the fork bomb was not stopped: {log}"));
    assert!(refused_after < 64, "{log}");

    let t = s.wait_status(&flood, "Succeeded", secs(60));
    let rdir = s.dir.join(format!("runs/{flood}/a0/{}-master-0", t["name"].as_str().unwrap()));
    let on_disk: u64 =
        ["log", "log.1"].iter().map(|f| std::fs::metadata(rdir.join(f)).map_or(0, |m| m.len())).sum();
    assert!(on_disk <= 2 * 256 * 1024 + 4096, "{on_disk} bytes of log kept");
    s.wait_event(&flood, "LogRotated", secs(10));
    let tail = s.log(&flood, &format!("{}-master-0", t["name"].as_str().unwrap()), None);
    assert!(tail.contains("last-line"), "the newest lines are served");

    let t0 = Instant::now();
    s.wait_status(&fill, "Failed", secs(60));
    assert!(t0.elapsed() < secs(40), "ended long before its sleep");
    let events = s.events_text(&fill);
    assert!(events.contains("Evicted") && events.contains("scratch"), "{events}");
}

/// The parent of a process.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// The sandbox of the process whose command line holds `marker`: (bubblewrap, the sandbox's init), as host
/// pids. The init is the process that is pid 1 in the sandbox's namespace; bubblewrap is its parent.
fn sandbox_of(marker: &str) -> (u32, u32) {
    let t0 = std::time::Instant::now();
    loop {
        for p in Server::processes_with(marker) {
            let mut at = p;
            while let Some(up) = parent_of(at) {
                if pid_ns(up) == pid_ns(std::process::id()) {
                    if up != 1 && pid_ns(at) != pid_ns(up) {
                        return (up, at);
                    }
                    break;
                }
                at = up;
            }
        }
        assert!(t0.elapsed() < secs(30), "no sandbox runs {marker}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

fn killed_from_outside(attack: &str, kill_init: bool) {
    let s = Server::start(attack, None);
    let marker = format!("ty-{attack}-{}", std::process::id());
    let mut task = pytorch(
        "kill",
        0,
        &format!(
            "if [ \"$TRAINYARD_ATTEMPT\" = 0 ]; then echo first; (exec -a {marker} sleep 60); fi; echo second attempt"
        ),
    );
    task["spec"]["advanced"] = json!({"faultTolerance": {"maxResubmissions": 1}});
    let id = s.submit(&task);
    let (bwrap, init) = sandbox_of(&marker);
    let victim = if kill_init { init } else { bwrap };
    let _ = std::process::Command::new("kill").args(["-9", &victim.to_string()]).status();
    s.wait_status(&id, "Succeeded", secs(90));
    let events = s.events_text(&id);
    assert!(events.contains("NodeFailed") && events.contains("killed from outside, by SIGKILL"), "{events}");
    assert!(!events.contains("UserError"), "{events}");
}

/// Finding 18 (part): a sandbox killed from outside was classed as the user's error. Now it is the
/// machine's (NodeFailed), and the task is resubmitted within its budget.
#[test]
fn a_sandbox_killed_from_outside_is_an_infrastructure_failure() {
    killed_from_outside("attack-kill", false);
}

/// Issue 29, item 14: a SIGKILL of the sandbox's init (pid 1 inside, bubblewrap's child) reached the
/// supervisor as exit code 137 and was classed as the user's error. Now it is the machine's too; the same
/// SIGKILL sent by the task's own code to itself stays the user's.
#[test]
fn a_sandbox_whose_init_is_killed_from_outside_is_an_infrastructure_failure_and_a_self_kill_is_not() {
    killed_from_outside("attack-kill-init", true);
    let s = Server::start("attack-self-kill", None);
    let mut task = pytorch("selfkill", 0, "echo before; sleep 1; kill -9 $$");
    task["spec"]["advanced"] = json!({"faultTolerance": {"maxResubmissions": 1}});
    let id = s.submit(&task);
    s.wait_status(&id, "Failed", secs(90));
    let events = s.events_text(&id);
    assert!(events.contains("UserError") && events.contains("code 137 (killed by SIGKILL)"), "{events}");
    assert!(!events.contains("NodeFailed"), "{events}");
}

/// Finding 18 (part): a killed supervisor left its cgroups behind. Now they go with the attempt.
#[test]
fn a_killed_supervisor_leaves_no_cgroup_behind() {
    let s = Server::start("attack-cgroup", None);
    let mut task = pytorch("cg", 0, "echo up; sleep 60");
    task["spec"]["advanced"] = json!({"faultTolerance": {"maxResubmissions": 0}});
    let id = s.submit(&task);
    let name = s.wait_status(&id, "Running", secs(60))["name"].as_str().unwrap().to_owned();
    s.wait_log(&id, &format!("{name}-master-0"), "up", secs(30));
    let found = || cgroups_named(Path::new("/sys/fs/cgroup"), &id, 0);
    assert!(!found().is_empty(), "the replica has cgroups while it runs");
    let rdir = s.dir.join(format!("runs/{id}/a0/{name}-master-0"));
    let state: Value = serde_json::from_slice(&std::fs::read(rdir.join("state.json")).unwrap()).unwrap();
    let sup = state["supervisor_pid"].as_u64().unwrap();
    let _ = std::process::Command::new("kill").args(["-9", &sup.to_string()]).status();
    s.wait_status(&id, "Failed", secs(60));
    let t0 = Instant::now();
    while !found().is_empty() && t0.elapsed() < secs(20) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(found(), Vec::<PathBuf>::new(), "cgroups left behind");
}

/// Cgroup dirs whose name contains `needle`, below `dir` (a few levels deep).
fn cgroups_named(dir: &Path, needle: &str, depth: usize) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if depth > 8 {
        return out;
    }
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if p.file_name().is_some_and(|n| n.to_string_lossy().contains(needle)) {
            out.push(p);
        } else {
            out.extend(cgroups_named(&p, needle, depth + 1));
        }
    }
    out
}

/// A network beyond this machine, for egress: a namespace behind a veth on this machine (198.51.100.0/24,
/// directly connected: this machine's LAN) that routes to 203.0.113.1 (documentation ranges both), where a TCP
/// server answers `outside`. The replicas reach it as they would the internet: through a gateway.
struct Outside {
    ns: String,
    server: std::process::Child,
}

impl Outside {
    const ADDR: &'static str = "203.0.113.1";
    const PORT: u16 = 8080;

    fn new() -> Outside {
        let ns = format!("ty-out-{}", std::process::id());
        let host_if = format!("tyo{}", std::process::id() % 100_000);
        let ip = |args: &str| {
            let ok =
                std::process::Command::new("ip").args(args.split_whitespace()).status().unwrap().success();
            assert!(ok, "ip {args}");
        };
        if Path::new("/run/netns").join(&ns).exists() {
            let _ = std::process::Command::new("ip").args(["netns", "delete", &ns]).status();
        }
        ip(&format!("netns add {ns}"));
        ip(&format!("link add {host_if} type veth peer name eth0 netns {ns}"));
        ip(&format!("addr add 198.51.100.2/24 dev {host_if}"));
        ip(&format!("link set {host_if} up"));
        ip(&format!("-n {ns} addr add 198.51.100.1/24 dev eth0"));
        ip(&format!("-n {ns} addr add {}/32 dev lo", Outside::ADDR));
        ip(&format!("-n {ns} link set eth0 up"));
        ip(&format!("-n {ns} link set lo up"));
        ip("route replace 203.0.113.0/24 via 198.51.100.1");
        let server = std::process::Command::new("ip")
            .args(["netns", "exec", &ns, "python3", "-c"])
            .arg(format!(
                "import socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
                 s.bind(('0.0.0.0', {})); s.listen()\nwhile True:\n    c = s.accept()[0]; c.sendall(b'outside'); c.close()\n",
                Outside::PORT
            ))
            .spawn()
            .unwrap();
        Outside { ns, server }
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = std::process::Command::new("ip").args(["netns", "delete", &self.ns]).status();
    }
}

/// The probe an egress test runs: what a replica reaches, as a JSON report.
fn egress_probe(host_port: u16) -> String {
    format!(
        r#"python3 - <<'EOF'
import json, socket
def get(host, port):
    try:
        c = socket.create_connection((host, port), 3); data = c.recv(64); c.close(); return data.decode() or "connected"
    except OSError as e:
        return "refused" if isinstance(e, ConnectionRefusedError) else "unreachable"
out = {{"outside": get("{outside}", {outside_port}), "host_link": get("198.51.100.2", {host_port}),
       "lan": get("198.51.100.1", {outside_port}),
       "host_loopback": get("127.0.0.1", {host_port}), "metadata": get("169.254.169.254", 80),
       "private": get("10.1.2.3", 80)}}
import os
for i, a in enumerate(os.environ.get("HOST_ADDRS", "").split()):
    out["host_%d" % i] = get(a, {host_port})
print("REPORT " + json.dumps(out), flush=True)
EOF"#,
        outside = Outside::ADDR,
        outside_port = Outside::PORT,
    )
}

/// Egress is the admin's to turn on. Off (the default), a replica reaches nothing beyond its task; on, it
/// reaches a server beyond this machine through it, and still not this machine (any of its addresses), its
/// loopback, cloud metadata, or private ranges.
#[test]
fn egress_reaches_beyond_the_machine_only_when_the_admin_allows_it() {
    let outside = Outside::new();
    let host = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let host_port = host.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in host.incoming().flatten() {
            let _ = std::io::Write::write_all(&mut &c, b"host-secret");
        }
    });
    let addrs = std::process::Command::new("ip").args(["-4", "-o", "addr", "show"]).output().unwrap();
    let host_addrs: Vec<String> = String::from_utf8_lossy(&addrs.stdout)
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .skip_while(|w| *w != "inet")
                .nth(1)
                .map(|a| a.split('/').next().unwrap().to_owned())
        })
        .filter(|a| !a.starts_with("127."))
        .collect();
    let probe = |s: &Server, prefix: &str| -> Value {
        let mut task = pytorch(prefix, 0, &egress_probe(host_port));
        task["spec"]["environment"]["env"] = json!([{"name": "HOST_ADDRS", "value": host_addrs.join(" ")}]);
        let id = s.submit(&task);
        s.wait_status(&id, "Succeeded", secs(60));
        report(s, &id)
    };

    let closed = Server::start("attack-egress-off", None);
    let r = probe(&closed, "closed");
    assert_eq!(r["outside"], "unreachable", "no egress by default: {r}");
    drop(closed);

    let open = Server::start_with(
        "attack-egress-on",
        // An uplink range of its own: the test beside it runs servers with egress at the same time.
        Options {
            args: ["--sandbox-egress", "--sandbox-egress-uplinks", "198.19.128.0/17"]
                .map(String::from)
                .to_vec(),
            ..Options::default()
        },
    );
    let r = probe(&open, "open");
    assert_eq!(r["outside"], "outside", "egress reaches beyond the machine: {r}");
    for (k, v) in r.as_object().unwrap() {
        if k != "outside" {
            assert!(v == "unreachable" || v == "refused", "{k}: {r}");
        }
    }
    drop(outside);
}

/// In the spirit of finding 17: a task decides how many series its metrics endpoint exposes, and every point
/// lands on the host's disk; each scrape keeps at most a bounded number of them (and the file has a cap).
#[test]
fn a_metrics_flood_is_bounded() {
    let s = Server::start("attack-metrics", None);
    let cmd = r#"python3 - <<'EOF'
import http.server, threading, time
page = "".join(f"flood_series{{i=\"{i}\"}} {i}\n" for i in range(10000)).encode()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(page)
    def log_message(self, *a): pass
threading.Thread(target=http.server.HTTPServer(("127.0.0.1", 9400), H).serve_forever, daemon=True).start()
print("serving", flush=True)
time.sleep(7)
EOF"#;
    let mut task = pytorch("flood", 0, cmd);
    task["spec"]["advanced"] = json!({"metrics": {"enabled": true, "intervalSeconds": 5, "endpoints": [{"port": 9400, "path": "/metrics"}]}});
    let id = s.submit(&task);
    let t = s.wait_status(&id, "Succeeded", secs(60));
    let file = s.dir.join(format!("runs/{id}/a0/{}-master-0/metrics.jsonl", t["name"].as_str().unwrap()));
    let text = std::fs::read_to_string(&file).unwrap();
    let mut per_scrape: std::collections::BTreeMap<u64, usize> = std::collections::BTreeMap::new();
    for line in text.lines() {
        let p: Value = serde_json::from_str(line).unwrap();
        if p["n"] == "flood_series" {
            *per_scrape.entry(p["t"].as_u64().unwrap()).or_default() += 1;
        }
    }
    assert!(!per_scrape.is_empty(), "the endpoint was scraped");
    assert!(per_scrape.values().all(|&n| n <= 2_000), "points kept per scrape: {per_scrape:?}");
}

/// Issue 29, item 7: one endless output line (1.5 GiB without a newline, in a replica whose memory limit is
/// 1 GiB) grew the supervisor, which read whole lines, until the OOM killer took it. Lines are now logged in
/// pieces of at most 64 KiB: the task ends as it would, and its last words reach the log.
#[test]
fn an_endless_output_line_cannot_swell_the_supervisor() {
    let s = Server::start("endless-line", None);
    let id = s.submit(&pytorch("line", 0, "head -c 1536M /dev/zero | tr '\\0' x; echo; echo last-words"));
    let t = s.wait_status(&id, "Succeeded", secs(300));
    let master = format!("{}-master-0", t["name"].as_str().unwrap());
    // The log file's end (it rotated at its limit on the way): the last words are there.
    let log = std::fs::read(s.dir.join(format!("runs/{id}/a0/{master}/log"))).unwrap();
    let tail = String::from_utf8_lossy(&log[log.len().saturating_sub(300)..]).into_owned();
    assert!(tail.contains("last-words"), "{tail}");
    let events = s.events_text(&id);
    assert!(!events.contains("OutOfMemory") && !events.contains("NodeFailed"), "{events}");
}

/// The memory cgroup of a process (cgroup v1's `memory` line, or v2's single one).
fn memory_cgroup(pid: u32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let line = |pred: &dyn Fn(&str) -> bool| text.lines().find(|l| pred(l)).map(str::to_owned);
    line(&|l| l.split(':').nth(1).is_some_and(|c| c.split(',').any(|c| c == "memory")))
        .or_else(|| line(&|l| l.starts_with("0::")))
        .unwrap_or_default()
}

/// Issue 29, item 7: the supervisor stayed in its replica's memory cgroup, so a replica at its limit could
/// have the OOM killer take its supervisor (recorded as a node failure, cgroups left behind). The supervisor
/// now leaves the replica's limits once its sandbox runs; a second sandbox (the run after the precheck)
/// starts inside them again.
#[test]
fn the_supervisor_leaves_its_replicas_memory_limit_and_each_sandbox_starts_inside_it() {
    let s = Server::start("sup-cgroup", None);
    let marker = format!("ty-sup-cgroup-{}", std::process::id());
    let mut task = pytorch("supcg", 0, &format!("(exec -a {marker} sleep 60)"));
    task["spec"]["advanced"] = json!({"precheck": {"enabled": true}});
    let id = s.submit(&task);
    let (bwrap, init) = sandbox_of(&marker);
    let sup = parent_of(bwrap).unwrap();
    let replica = memory_cgroup(init);
    assert!(replica.contains("/trainyard/"), "the sandbox is in the replica's cgroup: {replica}");
    assert_eq!(memory_cgroup(bwrap), replica);
    let t0 = std::time::Instant::now();
    while !memory_cgroup(sup).ends_with("/trainyard/supervisors") {
        assert!(t0.elapsed() < secs(10), "the supervisor is still in {}", memory_cgroup(sup));
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let events = s.events_text(&id);
    assert!(
        events.contains("PrecheckResult") || events.contains("precheck"),
        "the precheck ran first: {events}"
    );
    let (status, body) = s.call("POST", &format!("/api/v1/tasks/{id}/stop"), Some("{}"));
    assert!(status < 300, "{body}");
    s.wait_status(&id, "Stopped", secs(60));
}

/// Issue 29, item 14: the exit checkpoint's signal went only to the processes there at the stop; a process
/// that started (or installed its handler) during the checkpoint window, as torchrun's workers do in the
/// seconds after a start, never heard of it. It is now sent to them as they appear.
#[test]
fn the_checkpoint_signal_reaches_processes_that_start_during_the_window() {
    let s = Server::start("late-ckpt", None);
    let cmd = r#"echo started; sleep 4; python3 - <<'EOF'
import os, signal, time
rt = os.environ["TRAINYARD_RUNTIME_DIR"]
def save(sig, frame):
    open(rt + "/checkpoint-done", "w").close()
    print("late checkpoint saved", flush=True)
signal.signal(signal.SIGUSR1, save)
print("late worker up", flush=True)
while True:
    time.sleep(0.1)
EOF"#;
    let mut task = pytorch("lateckpt", 0, cmd);
    task["spec"]["advanced"] = json!({"exitCheckpoint": {"enabled": true, "timeoutSeconds": 40}});
    let id = s.submit(&task);
    let t = s.wait_status(&id, "Running", secs(60));
    let master = format!("{}-master-0", t["name"].as_str().unwrap());
    s.wait_log(&id, &master, "started", secs(30));
    // The stop comes before the worker (and its handler) exists.
    let (status, body) = s.call("POST", &format!("/api/v1/tasks/{id}/stop"), None);
    assert_eq!(status, 200, "{body}");
    s.wait_status(&id, "Stopped", secs(90));
    let events = s.events_text(&id);
    assert!(events.contains("CheckpointDone") && !events.contains("CheckpointTimedOut"), "{events}");
    assert!(s.log(&id, &master, None).contains("late checkpoint saved"), "{}", s.all_logs(&id));
}

/// Issue 29, item 4: the runtime dir was not counted (400 MiB in `/run/trainyard` under a 16 MiB limit) and
/// stayed after the attempt (for a later attempt to find under the same uid), and empty files were not
/// counted at all (200,000 of them used up the data dir's inodes). Both count now, and the runtime dir goes
/// with the attempt.
#[test]
fn the_runtime_dir_and_empty_files_count_against_the_scratch_limit() {
    let s = Server::start_with(
        "scratch-gaps",
        Options {
            args: ["--replica-scratch-mib", "16", "--replica-scratch-inodes", "2000"]
                .map(String::from)
                .to_vec(),
            ..Options::default()
        },
    );
    let runtime = s.submit(&pytorch(
        "rtfill",
        0,
        "dd if=/dev/zero of=/run/trainyard/fill bs=1M count=64 status=none; echo filled; sleep 60",
    ));
    let inodes = s.submit(&pytorch(
        "inodes",
        0,
        "mkdir -p /tmp/many && cd /tmp/many && seq 1 5000 | xargs touch; echo touched; sleep 60",
    ));
    // The legitimate path beside them: a replica within both limits ends by itself.
    let fine = s.submit(&pytorch("fine", 0, "seq 1 100 | xargs -I{} touch /tmp/{}; echo fine"));
    for (id, what) in
        [(&runtime, "MiB, over its limit of 16 MiB"), (&inodes, "files and dirs, over its limit of 2000")]
    {
        let t = s.wait_status(id, "Failed", secs(90));
        let events = s.events_text(id);
        assert!(events.contains("Evicted") && events.contains(what), "{events}");
        let rdir = s.dir.join(format!("runs/{id}/a0/{}-master-0", t["name"].as_str().unwrap()));
        // Gone with the attempt: the scratch's file system unmounted at once, what is left deleted on a thread
        // of its own, with the file system's image.
        let mounted = |d: &std::path::Path| {
            std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .lines()
                .any(|l| l.split_whitespace().nth(4) == Some(&*d.to_string_lossy()))
        };
        let t0 = Instant::now();
        while mounted(&rdir.join("scratch"))
            || rdir.join("scratch").exists()
            || rdir.join("scratch.gone").exists()
            || rdir.join("scratch.img").exists()
        {
            assert!(t0.elapsed() < Duration::from_secs(30), "{} stays after the attempt", rdir.display());
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    s.wait_status(&fine, "Succeeded", secs(60));
}

/// Issue 29, item 4 (the hard half): a scratch limit checked every 5 s let a fast writer put gigabytes on the
/// data dir's disk (or use its inodes) before the check. Each replica's scratch (its /tmp, /root and runtime
/// dir) is now a file system of its own sized to its limits: however fast it writes, it stops there, and
/// the data dir never sees it. Its mounts name no host path.
#[test]
fn a_replicas_scratch_is_a_file_system_of_its_own_that_no_writer_overflows() {
    let s = Server::start_with(
        "scratch-fs",
        Options {
            args: ["--replica-scratch-mib", "16", "--replica-scratch-inodes", "2000"]
                .map(String::from)
                .to_vec(),
            ..Options::default()
        },
    );
    let before = free_bytes(&s.dir);
    let cmd = r#"dd if=/dev/zero of=/tmp/big bs=1M count=2048 status=none 2>/dev/null
echo "BIG $(stat -c %s /tmp/big)"
mkdir /root/many && cd /root/many && seq 1 20000 | xargs touch 2>/dev/null
echo "FILES $(ls | wc -l)"
grep -E ' /(tmp|root|run/trainyard|etc/hosts|etc/passwd|etc/group) ' /proc/self/mountinfo | sed 's/^/MOUNT /'
getent hosts "$(hostname)" | sed 's/^/HOST /'
echo checked; sleep 30"#;
    let id = s.submit(&pytorch("fill", 0, cmd));
    let name = s.wait_status(&id, "Running", secs(60))["name"].as_str().unwrap().to_owned();
    s.wait_log(&id, &format!("{name}-master-0"), "checked", secs(60));
    let log = s.log(&id, &format!("{name}-master-0"), None);
    let out: Vec<&str> = log.lines().filter_map(|l| l.split_once(" O ").map(|(_, text)| text)).collect();
    let num = |key: &str| -> u64 {
        out.iter().find_map(|l| l.strip_prefix(key)?.trim().parse().ok()).unwrap_or_else(|| panic!("{log}"))
    };
    assert!(num("BIG ") < 32 << 20, "2 GiB asked for, at most the scratch's size written: {log}");
    assert!(num("FILES ") < 2400, "20,000 files asked for, at most the scratch's inodes made: {log}");
    assert!(before.saturating_sub(free_bytes(&s.dir)) < 256 << 20, "the data dir's disk did not fill");
    let mounts: Vec<&&str> = out.iter().filter(|l| l.starts_with("MOUNT")).collect();
    // The scratch's three dirs, and the attempt's files the sandbox binds at /etc (its copies in the scratch).
    assert_eq!(mounts.len(), 6, "{log}");
    assert!(out.iter().any(|l| l.starts_with("HOST ") && l.contains("-master-0")), "/etc/hosts works: {log}");
    for m in mounts {
        assert!(m.contains(" - ext4 /dev/loop"), "a file system of its own: {m}");
        assert!(!m.contains(&*s.dir.to_string_lossy()) && !m.contains("/runs/"), "names no host path: {m}");
    }
    // Over its limits, it is evicted as before.
    s.wait_status(&id, "Failed", secs(60));
    let events = s.events_text(&id);
    assert!(events.contains("Evicted") && events.contains("over its limit"), "{events}");
    assert!(!events.contains("LimitsNotEnforced"), "{events}");
}

/// Issue 29, item 11 (its last part): a registry image's root was bound entry by entry from its dir in the
/// image cache, so every line of the sandbox's `/proc/self/mountinfo` for `/usr`, `/etc` and the rest named
/// that dir's path under the data dir (a bind mount's root field is its path inside its file system). The
/// root is now a file system of its own (an overlay of it whose layers are named by descriptor, mounted by
/// the supervisor where only its sandbox sees it): `/usr` is `/usr` of that mount, and no line names the data
/// dir or the cache. Nor
/// does `/sys`, where each loop device's `backing_file` named its file (every replica's scratch image, under
/// the data dir, by task and replica). The image still runs: a program from it, a file read from it, and
/// nothing written into it.
#[test]
fn a_registry_images_root_is_a_file_system_of_its_own_whose_mounts_name_no_host_path() {
    use trainyard_images::testing::{
        GZIP_LAYER, TAR_LAYER, TestRegistry, debian_closure, files_layer, gzip, host_layer,
    };
    let reg = TestRegistry::start("attack-own-root", false, false);
    let base = gzip(&host_layer(&debian_closure(&["bash", "coreutils"])));
    let app = files_layer(&[("app/version", b"v1\n", 0o644)]);
    let digest = reg.push("team/app", "1", &[(GZIP_LAYER, base), (TAR_LAYER, app)], json!({}));
    let s = Server::start("attack-own-root", None);
    let mut catalog: Value = serde_saphyr::from_str(common::CATALOG).unwrap();
    catalog["allowExternalImages"] = json!(true);
    catalog["registries"] = json!({ reg.host.clone(): {"insecure": true} });
    let (status, body) = s.call("PUT", "/api/v1/admin/catalog", Some(&catalog.to_string()));
    assert_eq!(status, 200, "{body}");
    let cmd = r#"while IFS= read -r l; do echo "MOUNT $l"; done < /proc/self/mountinfo
for f in /sys/block/*/loop/backing_file /sys/dev/block/*/loop/backing_file; do
  [ -e "$f" ] && echo "BACKING $f $(cat "$f")"
done
echo "READ $(cat /app/version)"
echo "RAN $(/usr/bin/ls /app)"
touch /usr/planted 2>/dev/null && echo WROTE || echo REFUSED
echo checked"#;
    let mut task = pytorch("ownroot", 0, cmd);
    task["spec"]["environment"]["image"] = json!(format!("{}/team/app:1", reg.host));
    let id = s.submit(&task);
    let t = s.wait_status(&id, "Succeeded", secs(180));
    let log = s.log(&id, &format!("{}-master-0", t["name"].as_str().unwrap()), None);
    let out: Vec<&str> = log.lines().filter_map(|l| l.split_once(" O ").map(|(_, text)| text)).collect();
    assert!(out.contains(&"checked"), "{log}");
    // The image runs: its own program, its own file, and a root nobody writes.
    assert!(out.contains(&"READ v1") && out.contains(&"RAN version"), "{log}");
    assert!(out.contains(&"REFUSED") && !out.contains(&"WROTE"), "{log}");
    // Its mounts name neither the data dir nor the image cache (its dir is named by the digest).
    let mounts: Vec<&str> = out.iter().filter_map(|l| l.strip_prefix("MOUNT ")).collect();
    let hex = digest.trim_start_matches("sha256:");
    for m in &mounts {
        assert!(!m.contains(&*s.dir.to_string_lossy()), "names the data dir: {m}");
        assert!(!m.contains(hex) && !m.contains("/images/") && !m.contains("rootfs"), "names the cache: {m}");
    }
    // Each of the image's entries is bound from a file system of the image's own, at its own path there.
    let at = |inside: &str| -> Vec<&str> {
        // ID PARENT MAJ:MIN ROOT MOUNT-POINT OPTIONS ... - FSTYPE SOURCE SUPER-OPTIONS
        mounts.iter().copied().filter(|m| m.split(' ').nth(4) == Some(inside)).collect()
    };
    for inside in ["/usr", "/app"] {
        let lines = at(inside);
        assert_eq!(lines.len(), 1, "{inside}: {mounts:#?}");
        let f: Vec<&str> = lines[0].split(' ').collect();
        assert_eq!(f[3], inside, "its root in its file system: {}", lines[0]);
        let (_, fs) = lines[0].split_once(" - ").unwrap();
        assert!(
            fs.starts_with("overlay trainyard-image ro,lowerdir=/proc/self/fd/"),
            "a file system of its own, its layers named by descriptor: {}",
            lines[0]
        );
        assert!(f[5].starts_with("ro,nosuid,nodev"), "{}", lines[0]);
    }
    // Nor does /sys: loop devices (every replica's scratch is one) name their files under the data dir.
    let backing: Vec<&&str> = out.iter().filter(|l| l.starts_with("BACKING")).collect();
    assert!(backing.is_empty(), "{backing:#?}");
    assert!(!s.events_text(&id).contains("LimitsNotEnforced"), "{}", s.events_text(&id));
}

/// Free bytes on the file system holding `dir`.
fn free_bytes(dir: &std::path::Path) -> u64 {
    let out = std::process::Command::new("df").args(["-B1", "--output=avail"]).arg(dir).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().nth(1).and_then(|l| l.trim().parse().ok()).unwrap()
}

/// Issue 29, item 5: two servers on one machine shared one nftables table, the last started replaced the
/// other's egress policy, and the table (with forwarding on) stayed after both stopped. Each server now has
/// a table of its own, named by its data dir, removed when it stops with nothing left running.
#[test]
fn two_servers_on_one_machine_keep_their_own_egress_tables_and_remove_them_at_stop() {
    use trainyard_local::netns::{link_group, table_name};
    let tables = || {
        let out = std::process::Command::new("nft").args(["list", "tables"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let with_egress = |name: &str, allow: &str, uplinks: &str| {
        Server::start_with(
            name,
            Options {
                args: [
                    "--sandbox-egress",
                    "--sandbox-egress-allow",
                    allow,
                    "--sandbox-egress-uplinks",
                    uplinks,
                ]
                .map(String::from)
                .to_vec(),
                ..Options::default()
            },
        )
    };
    let mut a = with_egress("egress-table-a", "10.77.0.0/16", "198.18.0.0/16");
    let mut b = with_egress("egress-table-b", "10.88.0.0/16", "198.19.0.0/17");
    let (ta, tb) = (table_name(&a.dir), table_name(&b.dir));
    let (ga, gb) = (link_group(&a.dir), link_group(&b.dir));
    assert_ne!(ta, tb);
    assert_ne!(ga, gb);
    let listed = tables();
    assert!(
        listed.contains(&format!("table inet {ta}")) && listed.contains(&format!("table inet {tb}")),
        "{listed}"
    );
    // B's start left A's policy as A set it.
    let rules = |t: &str| {
        let out = std::process::Command::new("nft").args(["list", "table", "inet", t]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(rules(&ta).contains("10.77.0.0/16") && !rules(&ta).contains("10.88.0.0/16"), "{}", rules(&ta));
    assert!(rules(&tb).contains("10.88.0.0/16"), "{}", rules(&tb));
    // Each table matches its own server's uplinks (by interface group), never the other's: with a task
    // running on each, each uplink is in its server's group.
    let (ra, rb) = (rules(&ta), rules(&tb));
    assert!(ra.contains(&format!("iifgroup {ga}")) && !ra.contains(&format!("iifgroup {gb}")), "{ra}");
    assert!(rb.contains(&format!("iifgroup {gb}")) && !rb.contains(&format!("iifgroup {ga}")), "{rb}");
    let ia = a.submit(&pytorch("upa", 0, "echo up; sleep 60"));
    let ib = b.submit(&pytorch("upb", 0, "echo up; sleep 60"));
    a.wait_status(&ia, "Running", secs(60));
    b.wait_status(&ib, "Running", secs(60));
    let groups = || -> Vec<(String, u32)> {
        let t0 = std::time::Instant::now();
        loop {
            let found: Vec<(String, u32)> = std::fs::read_dir("/sys/class/net")
                .unwrap()
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let g =
                        std::fs::read_to_string(e.path().join("netdev_group")).ok()?.trim().parse().ok()?;
                    (name.starts_with("tyu") && (g == ga || g == gb)).then_some((name, g))
                })
                .collect();
            if found.len() >= 2 || t0.elapsed() > secs(30) {
                return found;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    let found = groups();
    assert!(found.iter().any(|(_, g)| *g == ga) && found.iter().any(|(_, g)| *g == gb), "{found:?}");
    // A third server in A's uplink range while A's uplink is up would take its addresses: it refuses to start.
    let c = std::process::Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["up", "--backend", "local", "--listen", "127.0.0.1:0", "--sandbox-egress", "--data-dir"])
        .arg(std::env::temp_dir().join(format!("ty-egress-table-c-{}", std::process::id())))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&c.stderr);
    assert!(!c.status.success() && said.contains("--sandbox-egress-uplinks"), "{said}");
    for (s, id) in [(&a, &ia), (&b, &ib)] {
        let (status, body) = s.call("POST", &format!("/api/v1/tasks/{id}/stop"), Some("{}"));
        assert!(status < 300, "{body}");
        s.wait_status(id, "Stopped", secs(60));
    }
    b.stop();
    let listed = tables();
    assert!(!listed.contains(&format!("table inet {tb}")), "B's table stays after its stop:\n{listed}");
    assert!(listed.contains(&format!("table inet {ta}")), "B's stop took A's table:\n{listed}");
    a.stop();
    assert!(!tables().contains(&format!("table inet {ta}")), "{}", tables());
}
