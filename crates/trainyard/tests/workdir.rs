//! Working directories through the real binary and a real `trainyard up` (local backend): the user's code goes
//! with the task, each replica works in a copy of its own, a tree the server holds is not sent again, and bad
//! trees and limits are refused before anything is sent.

mod common;

use common::{Server, secs};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The CLI against `s` as its admin, from `cwd`.
fn cli_in(s: &Server, cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(args)
        .env("TRAINYARD_SERVER", &s.base)
        .env("TRAINYARD_TOKEN", &s.token)
        .current_dir(cwd)
        .output()
        .unwrap()
}

/// A POST of raw bytes to `s` as its admin: (status, body).
fn post_bytes(s: &Server, path: &str, bytes: &[u8]) -> (u16, String) {
    let mut r = common::agent()
        .post(&format!("{}{path}", s.base))
        .header("Authorization", &format!("Bearer {}", s.token))
        .send(bytes)
        .unwrap();
    (r.status().as_u16(), r.body_mut().read_to_string().unwrap_or_default())
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A counter of the server's `/metrics`.
fn counter(s: &Server, name: &str) -> u64 {
    let (_, body) = s.call("GET", "/metrics", None);
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// A project: a package, a data file, a training script, a task file, and what git would leave out.
fn project(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ty-wdproj-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    write(
        &d,
        "mypkg/__init__.py",
        "from .numbers import total\nGREETING = 'hello from the working directory'\n",
    );
    write(
        &d,
        "mypkg/numbers.py",
        "def total(path):\n    return sum(int(x) for x in open(path).read().split())\n",
    );
    write(&d, "data/numbers.txt", "1 2 3 4 5 6 7 8 9 10\n");
    write(&d, ".gitignore", "*.ckpt\nsecret.txt\n");
    write(&d, "old.ckpt", "a checkpoint that stays home");
    write(&d, "secret.txt", "stays home");
    write(&d, ".git/HEAD", "ref: refs/heads/main\n");
    write(
        &d,
        "train.py",
        r#"import os, sys
import torch, torch.distributed as dist
import mypkg
dist.init_process_group("gloo")
rank, n = dist.get_rank(), dist.get_world_size()
assert os.getcwd() == "/workspace", os.getcwd()
for home in ("old.ckpt", "secret.txt", ".git"):
    assert not os.path.exists(home), home
# Each replica's copy is its own: what one writes, no other sees.
with open(f"out-{rank}.txt", "w") as f:
    f.write("mine")
with open("mypkg/numbers.py", "a") as f:
    f.write(f"\n# rank {rank} was here\n")
t = torch.tensor([float(mypkg.total("data/numbers.txt"))])
dist.all_reduce(t)
dist.barrier()
others = sorted(x for x in os.listdir(".") if x.startswith("out-") and x != f"out-{rank}.txt")
print(f"rank {rank} of {n}: {mypkg.GREETING}; all-reduce {t.item():.0f}; others' files {others}", flush=True)
dist.destroy_process_group()
"#,
    );
    write(
        &d,
        "task.yaml",
        "apiVersion: trainyard.dev/v1\nkind: TrainingTask\nmetadata: {namePrefix: wd, projectGroup: default}\nspec:\n  \
         type: PyTorchJob\n  placement: {region: local, cluster: local}\n  environment:\n    image: host\n    \
         cmd: torchrun --redirects 1 --tee 1 train.py\n  compute:\n    resourceType: Reserved\n    pool: default\n    \
         workers: 2\n    instanceSpecs: [{spec: cpu.small}]\n",
    );
    d
}

#[test]
fn a_working_directory_goes_with_a_torchrun_task_to_every_replica_and_is_sent_once() {
    let s = Server::start("workdir-run", None);
    let proj = project("run");
    let before = counter(&s, "trainyard_workdir_received_bytes_total");
    let out = cli_in(&s, &proj, &["submit", "-f", "task.yaml", "--workdir", ".", "-o", "json"]);
    assert!(out.status.success(), "{}", text(&out));
    let t: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = t["id"].as_str().unwrap().to_owned();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    // train.py, task.yaml, .gitignore, the package's two files and the data file; not the checkpoint, the
    // secret, .git.
    assert!(err.contains("sent 6 files"), "{err}");
    let sent = counter(&s, "trainyard_workdir_received_bytes_total") - before;
    let want: u64 =
        ["train.py", "task.yaml", ".gitignore", "mypkg/__init__.py", "mypkg/numbers.py", "data/numbers.txt"]
            .iter()
            .map(|f| std::fs::metadata(proj.join(f)).unwrap().len())
            .sum();
    assert_eq!(sent, want, "the server took in exactly the files git would keep");
    let done = s.wait_status(&id, "Succeeded", secs(240));
    assert_eq!(done["spec"]["spec"]["environment"]["workdir"].as_str().map(str::len), Some(64), "{done}");
    let logs = s.all_logs(&id);
    for rank in 0..3 {
        assert!(
            logs.contains(&format!(
                "rank {rank} of 3: hello from the working directory; all-reduce 165; others' files []"
            )),
            "rank {rank}:\n{logs}"
        );
    }
    let described = String::from_utf8_lossy(&cli_in(&s, &proj, &["describe", &id]).stdout).to_string();
    assert!(
        described.contains(&format!(
            "Workdir:    {} (6 files, ",
            &done["spec"]["spec"]["environment"]["workdir"].as_str().unwrap()[..12]
        )),
        "{described}"
    );
    assert!(described.contains("Completed (ran ") && described.contains("  Exit:     "), "{described}");
    // The same tree again: a check and a commit, no file; the task names the same working directory.
    let again = cli_in(&s, &proj, &["submit", "-f", "task.yaml", "--workdir", ".", "-o", "json"]);
    assert!(again.status.success(), "{}", text(&again));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("sent 0 files (0 B), the server had the other 6"),
        "{}",
        text(&again)
    );
    assert_eq!(counter(&s, "trainyard_workdir_received_bytes_total") - before, want, "nothing sent again");
    let t2: Value = serde_json::from_slice(&again.stdout).unwrap();
    let id2 = t2["id"].as_str().unwrap().to_owned();
    s.wait_status(&id2, "Succeeded", secs(240));
    let t2 = s.task(&id2);
    assert_eq!(t2["spec"]["spec"]["environment"]["workdir"], done["spec"]["spec"]["environment"]["workdir"]);
    // The replicas' writes stayed in their copies: the server's copy is as uploaded.
    let (code, list) = s.call("GET", "/api/v1/workdirs?projectGroup=default", None);
    assert_eq!(code, 200, "{list}");
    let list: Value = serde_json::from_str(&list).unwrap();
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{list}");
    assert_eq!(items[0]["files"], 6, "{list}");
    assert_eq!(items[0]["bytes"], want, "{list}");
    // A member makes a copy of it (what a Kubernetes replica's init container runs): every file as sent,
    // none of the replicas' writes, nothing git leaves out.
    let wd = items[0]["id"].as_str().unwrap().to_owned();
    let listed = text(&cli_in(&s, &proj, &["workdir", "list"]));
    assert!(listed.contains(&wd) && listed.contains("default"), "{listed}");
    let copy = std::env::temp_dir().join(format!("ty-wdcopy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&copy);
    let out =
        cli_in(&s, &proj, &["workdir", "fetch", &wd, "--group", "default", "--into", copy.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    for f in
        ["train.py", "task.yaml", ".gitignore", "mypkg/__init__.py", "mypkg/numbers.py", "data/numbers.txt"]
    {
        assert_eq!(std::fs::read(copy.join(f)).unwrap(), std::fs::read(proj.join(f)).unwrap(), "{f}");
    }
    for home in ["old.ckpt", "secret.txt", ".git"] {
        assert!(!copy.join(home).exists(), "{home}");
    }
    let again =
        cli_in(&s, &proj, &["workdir", "fetch", &wd, "--group", "default", "--into", copy.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(2), "{}", text(&again));
    assert!(text(&again).contains("not empty"), "{}", text(&again));
    // A token that looks like an attempt's but that no server made reads nothing.
    let forged = format!("tyw.{id}.1.{}", "0".repeat(64));
    let r = common::agent()
        .get(&format!("{}/api/v1/workdirs/{wd}?projectGroup=default", s.base))
        .header("Authorization", &format!("Bearer {forged}"))
        .call()
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let _ = std::fs::remove_dir_all(&copy);
    let _ = std::fs::remove_dir_all(&proj);
}

#[test]
fn bad_working_directories_and_limits_are_refused_before_anything_is_sent() {
    let s = Server::start("workdir-bad", None);
    let proj = project("bad");
    let sent = || counter(&s, "trainyard_workdir_received_files_total");
    // A link out of the directory, a FIFO and a name that is not UTF-8: all named at once, nothing sent.
    std::os::unix::fs::symlink("/etc/passwd", proj.join("passwords")).unwrap();
    let fifo = proj.join("pipe");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    use std::os::unix::ffi::OsStrExt;
    std::fs::write(proj.join(std::ffi::OsStr::from_bytes(b"caf\xe9.py")), "x").unwrap();
    let out = cli_in(&s, &proj, &["submit", "-f", "task.yaml", "--workdir", "."]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let said = text(&out);
    for want in [
        "nothing was sent, 3 things to mend first",
        "passwords: a link that links to \"/etc/passwd\", an absolute path",
        "pipe: a special file",
        "caf\u{fffd}.py: the name is not UTF-8",
    ] {
        assert!(said.contains(want), "{want} not in:\n{said}");
    }
    assert_eq!(sent(), 0);
    let (_, tasks) = s.call("GET", "/api/v1/tasks", None);
    assert_eq!(serde_json::from_str::<Value>(&tasks).unwrap()["items"].as_array().unwrap().len(), 0);
    for p in ["passwords", "pipe"] {
        std::fs::remove_file(proj.join(p)).unwrap();
    }
    std::fs::remove_file(proj.join(std::ffi::OsStr::from_bytes(b"caf\xe9.py"))).unwrap();

    // Over the admin's limit for one upload: the server's check refuses it before any file goes.
    let limits = |max: u64, group: u64| {
        let body = json!({"maxQueuedTasksPerUser": 1000, "workdirMaxBytes": max, "workdirGroupBytes": group});
        let (code, said) = s.call("PUT", "/api/v1/admin/settings", Some(&body.to_string()));
        assert_eq!(code, 200, "{said}");
    };
    limits(100, 1 << 30);
    let out = cli_in(&s, &proj, &["submit", "-f", "task.yaml", "--workdir", "."]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("over the 100 B an upload may hold"), "{}", text(&out));
    assert_eq!(sent(), 0);
    // Over the group's total: the first tree fits, a second one does not.
    limits(1 << 20, 2000);
    let out = cli_in(&s, &proj, &["submit", "-f", "task.yaml", "--workdir", "."]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(sent(), 6);
    write(&proj, "data/more.txt", &"9 ".repeat(700));
    let out = cli_in(&s, &proj, &["submit", "-f", "task.yaml", "--workdir", "."]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("a group may hold (an admin setting, workdirGroupBytes)"), "{}", text(&out));
    assert_eq!(sent(), 6);

    // A task naming a working directory its group does not hold.
    let mut task = common::pytorch("nowd", 0, "true");
    task["spec"]["environment"]["workdir"] = json!("0".repeat(64));
    let (code, said) = s.call("POST", "/api/v1/tasks", Some(&task.to_string()));
    assert_eq!(code, 422, "{said}");
    assert!(said.contains("spec.environment.workdir") && said.contains("has no working directory"), "{said}");

    // A file whose content is not its name is not kept; nor is a link, whatever its name.
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(4);
    h.set_entry_type(tar::EntryType::Regular);
    b.append_data(&mut h, "a".repeat(64), &b"evil"[..]).unwrap();
    let (code, said) =
        post_bytes(&s, "/api/v1/workdirs/blobs?projectGroup=default", &b.into_inner().unwrap());
    assert_eq!(code, 400, "{said}");
    assert!(said.contains("its content's SHA-256 is another"), "{said}");
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    b.append_link(&mut h, "b".repeat(64), "/etc/shadow").unwrap();
    let (code, said) =
        post_bytes(&s, "/api/v1/workdirs/blobs?projectGroup=default", &b.into_inner().unwrap());
    assert_eq!(code, 400, "{said}");
    assert_eq!(sent(), 6);
    // A manifest whose paths leave the directory is refused whole, each problem at its place.
    let m = json!({"projectGroup": "default", "manifest": {"entries": [
        {"path": "../escape.py", "kind": "file", "sha256": "c".repeat(64), "size": 1},
        {"path": "ok", "kind": "link", "target": "../../etc/shadow"},
    ]}});
    let (code, said) = s.call("POST", "/api/v1/workdirs", Some(&m.to_string()));
    assert_eq!(code, 422, "{said}");
    assert!(
        said.contains("manifest.entries[0].path") && said.contains("manifest.entries[1].target"),
        "{said}"
    );
    let _ = std::fs::remove_dir_all(&proj);
}

#[test]
fn trainyard_run_prints_what_the_command_prints_and_exits_as_it_did() {
    let s = Server::start("workdir-runcmd", None);
    let proj = project("runcmd");
    // The current directory goes with it: the command imports the project's package.
    let out =
        cli_in(&s, &proj, &["run", "--", "python3", "-c", "import mypkg; print(42); print(mypkg.GREETING)"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "42\nhello from the working directory\n",
        "{}",
        text(&out)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("PyTorchJob on cpu.small"), "{}", text(&out));
    // A failing command's exit status comes back, from every replica's output followed to the end.
    let out = cli_in(
        &s,
        &proj,
        &["run", "--no-workdir", "--workers", "1", "--", "sh", "-c", "echo rank $RANK; exit 3"],
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("-master-0] rank 0") && said.contains("-worker-0] rank 1"), "{}", text(&out));
    // describe says when each attempt ran, how it ended, with what exit codes, and what it ran.
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let name = err.split_whitespace().nth(1).unwrap().trim_end_matches(':').to_owned();
    let described = String::from_utf8_lossy(&cli_in(&s, &proj, &["describe", &name]).stdout).to_string();
    for want in [
        "Command:    sh -c 'echo rank $RANK; exit 3'",
        "Image:      host",
        "Submitted:  20",
        ", ended 20",
        "  Failure:  UserError: ",
        "-0 3",
    ] {
        assert!(described.contains(want), "{want:?} not in:\n{described}");
    }
    assert!(
        described.lines().any(|l| l.starts_with("Attempt 0: admitted 20") && l.contains(", started 20")),
        "{described}"
    );
    // Detached: the name, at once.
    let out = cli_in(&s, &proj, &["run", "-d", "--no-workdir", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let name = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(name.starts_with("run-"), "{}", text(&out));
    // Nothing to run is a usage error.
    let out = cli_in(&s, &proj, &["run", "--spec", "gpu.none", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("no quota that fits"), "{}", text(&out));
    let _ = std::fs::remove_dir_all(&proj);
}

/// `run --max-resubmissions`: an attempt that ends for the platform's reasons (its node marked failed by an
/// admin) is resubmitted, and `run` follows the next attempt's output to the end and exits as it does.
#[test]
fn trainyard_run_follows_a_resubmitted_attempt() {
    let s = Server::start("workdir-runagain", None);
    let dir = std::env::temp_dir();
    let child = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["run", "--no-workdir", "--max-resubmissions", "1", "--name-prefix", "again", "--"])
        .args(["sh", "-c", "echo attempt $TRAINYARD_ATTEMPT; [ $TRAINYARD_ATTEMPT = 1 ] || sleep 600"])
        .env("TRAINYARD_SERVER", &s.base)
        .env("TRAINYARD_TOKEN", &s.token)
        .current_dir(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The task `run` made, once its first attempt runs.
    let t0 = std::time::Instant::now();
    let (id, node) = loop {
        let (_, list) = s.call("GET", "/api/v1/tasks?q=again", None);
        let list: Value = serde_json::from_str(&list).unwrap();
        if let Some(t) = list["items"].as_array().and_then(|i| i.first())
            && t["status"] == "Running"
        {
            let id = t["id"].as_str().unwrap().to_owned();
            let t = s.task(&id);
            break (id, t["placement"]["replicas"][0]["node"].as_str().unwrap().to_owned());
        }
        assert!(t0.elapsed() < secs(60), "no running task: {list}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let master = format!("{}-master-0", s.task(&id)["name"].as_str().unwrap());
    s.wait_log(&id, &master, "attempt 0", secs(30));
    let (status, body) = s.call("PUT", &format!("/api/v1/admin/nodes/{node}"), Some(r#"{"failed": true}"#));
    assert_eq!(status, 204, "{body}");
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("attempt 0") && stdout.contains("attempt 1"), "{stdout}\n{stderr}");
    assert!(stderr.contains("attempt 0 ended and was resubmitted; following attempt 1"), "{stderr}");
    assert_eq!(s.task(&id)["status"], "Succeeded");
}
