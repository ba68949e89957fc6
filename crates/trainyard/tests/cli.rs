//! `trainyard validate` as a user runs it: exit codes, the demand table, problems with paths, JSON output.

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn trainyard(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(args)
        .current_dir(repo())
        .env_remove("TRAINYARD_CATALOG")
        // No server: the example catalog built into the binary, whatever runs on this machine.
        .env("TRAINYARD_SERVER", "http://127.0.0.1:9")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    }
    drop(child.stdin.take());
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[test]
fn valid_files_print_the_demand_table_and_exit_0() {
    let o = trainyard(&["validate", "examples/pytorch-ddp.yaml", "examples/ray-autoscaling.yaml"], None);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("examples/pytorch-ddp.yaml: valid"), "{out}");
    // 1 master + 3 workers, 8 A100 each: 32 units, 32 GPUs; then the H100 fallback.
    assert!(out.contains("demand with option 1 of 2 (gpu.a100.1 × 8 per replica)"), "{out}");
    assert!(out.contains("quota checked: 32 units of gpu.a100.1"), "{out}");
    assert!(out.contains("demand with option 2 of 2 (gpu.h100.1 × 8 per replica)"), "{out}");
    // RayJob: the head on its own spec, quota per spec.
    assert!(out.contains("quota checked: 1 unit of cpu.large, 4 units of gpu.a100.1"), "{out}");
}

#[test]
fn invalid_files_print_every_problem_with_its_path_and_exit_1() {
    let o = trainyard(&["validate", "examples/pytorch-single.yaml", "examples/invalid/bad-env.yaml"], None);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("examples/invalid/bad-env.yaml: 12 errors, 0 warnings"), "{out}");
    assert!(
        out.contains(
            "error[invalid-name] spec.environment.env[0].name: \"LR RATE\" contains a space; use ASCII letters, digits and _ only"
        ),
        "{out}"
    );
}

#[test]
fn json_output_is_machine_readable() {
    let o = trainyard(
        &["validate", "-o", "json", "examples/invalid/bad-compute.yaml", "examples/pytorch-spot.yaml"],
        None,
    );
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let files = v.as_array().unwrap();
    assert_eq!(files.len(), 2);
    assert_eq!(files[0]["valid"], false);
    assert_eq!(files[0]["problems"][0]["path"], "spec.compute.workers");
    assert_eq!(files[0]["problems"][0]["code"], "out-of-range");
    assert_eq!(files[0]["problems"][0]["severity"], "error");
    assert_eq!(files[1]["valid"], true);
    assert_eq!(files[1]["demand"][0]["total"]["gpus"], 2);
    assert_eq!(files[1]["demand"][1]["quota"][0]["spec"], "gpu.a100.1");
}

#[test]
fn reads_standard_input_and_a_catalog_file() {
    let task = std::fs::read_to_string(repo().join("examples/pytorch-single.yaml")).unwrap();
    let o = trainyard(&["validate", "--catalog", "examples/catalog/catalog.yaml", "-"], Some(&task));
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("-: valid"));
}

#[test]
fn completion_scripts_for_each_shell() {
    for (shell, mark) in
        [("bash", "complete -F"), ("zsh", "#compdef trainyard"), ("fish", "complete -c trainyard")]
    {
        let o = trainyard(&["completion", shell], None);
        let out = stdout(&o);
        assert_eq!(o.status.code(), Some(0), "{shell}: {out}");
        assert!(out.contains(mark) && out.contains("logs") && out.contains("tail"), "{shell}: {out}");
    }
    assert_eq!(trainyard(&["completion", "tcsh"], None).status.code(), Some(2));
}

#[test]
fn unreadable_inputs_exit_2() {
    let o = trainyard(&["validate", "does/not/exist.yaml"], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot read does/not/exist.yaml"));
    let o = trainyard(
        &["validate", "--catalog", "examples/pytorch-single.yaml", "examples/pytorch-single.yaml"],
        None,
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("catalog"));
}

#[test]
fn an_oversized_document_is_refused_with_a_clear_problem() {
    let huge = format!("# {}\n", "x".repeat(trainyard_core::MAX_DOCUMENT_BYTES + 10));
    let o = trainyard(&["validate", "-"], Some(&huge));
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("error[too-large]"), "{}", stdout(&o));
}

/// A webhook CA file `up` cannot use stops it at start-up with the file and the reason, before the data dir is
/// made: from the flag (a missing file) and from TRAINYARD_WEBHOOK_CA (a file with no certificate in it).
#[test]
fn up_refuses_a_webhook_ca_file_it_cannot_use() {
    let dir = std::env::temp_dir().join(format!("trainyard-up-ca-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let missing = dir.with_extension("missing.pem");
    let not_pem = dir.with_extension("txt");
    std::fs::write(&not_pem, "not a certificate\n").unwrap();
    let up = |ca_flag: Option<&PathBuf>, ca_env: Option<&PathBuf>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainyard"));
        cmd.args(["up", "--backend", "fake", "--listen", "127.0.0.1:0", "--data-dir"]).arg(&dir);
        cmd.env_remove("TRAINYARD_WEBHOOK_CA");
        if let Some(f) = ca_flag {
            cmd.arg("--webhook-ca").arg(f);
        }
        if let Some(f) = ca_env {
            cmd.env("TRAINYARD_WEBHOOK_CA", f);
        }
        let o = cmd.output().unwrap();
        (o.status.code(), String::from_utf8_lossy(&o.stderr).to_string())
    };
    let (code, err) = up(Some(&missing), None);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--webhook-ca") && err.contains(&*missing.to_string_lossy()), "{err}");
    assert!(err.contains("cannot read the CA bundle") && !err.contains("panicked"), "{err}");
    let (code, err) = up(None, Some(&not_pem));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(&*not_pem.to_string_lossy()) && err.contains("holds no certificates"), "{err}");
    assert!(!dir.exists(), "nothing was written");
    std::fs::remove_file(&not_pem).unwrap();
}

/// `trainyard up` on an empty data dir, then the CLI against it: whoami, submit --wait, list, describe.
#[test]
fn up_then_submit_and_wait() {
    let dir = std::env::temp_dir().join(format!("trainyard-up-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut server = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["up", "--backend", "fake", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&dir)
        .env("TRAINYARD_FAKE_RUN_MS", "300")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let (api, printed) = common::api_address(&mut server);
    let token = std::fs::read_to_string(dir.join("admin.token")).unwrap().trim().to_owned();
    assert!(printed.contains(&token), "the token is printed once at bootstrap");
    let cli = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_trainyard"))
            .args(args)
            .env("TRAINYARD_SERVER", &api)
            .env("TRAINYARD_TOKEN", &token)
            .current_dir(repo())
            .output()
            .unwrap()
    };
    let who = cli(&["whoami"]);
    assert_eq!(String::from_utf8_lossy(&who.stdout).trim(), "admin (admin), groups: default");
    let run = cli(&["submit", "-f", "examples/local/hello.yaml", "--wait"]);
    let out = String::from_utf8_lossy(&run.stdout).to_string();
    assert_eq!(run.status.code(), Some(0), "{out}{}", String::from_utf8_lossy(&run.stderr));
    assert!(out.contains("succeeded"), "{out}");
    let list = cli(&["list", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(v["items"][0]["status"], "Succeeded");
    // While it waits in the queue, `--wait` says where and why.
    let catalog: serde_json::Value =
        serde_json::from_slice(&cli(&["admin", "catalog", "get", "-o", "json"]).stdout).unwrap();
    let nodes: Vec<String> = catalog["nodes"].as_object().unwrap().keys().cloned().collect();
    for n in &nodes {
        assert_eq!(cli(&["admin", "node", n, "--cordon"]).status.code(), Some(0));
    }
    let waiting = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["submit", "-f", "examples/local/hello.yaml", "--wait"])
        .env("TRAINYARD_SERVER", &api)
        .env("TRAINYARD_TOKEN", &token)
        .current_dir(repo())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    for n in &nodes {
        assert_eq!(cli(&["admin", "node", n, "--uncordon"]).status.code(), Some(0));
    }
    let waited = waiting.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&waited.stderr).to_string();
    assert_eq!(waited.status.code(), Some(0), "{said}");
    assert!(said.contains("queued #1 (1 in its group): "), "{said}");
    let bad = cli(&["submit", "-f", "examples/invalid/bad-name.yaml"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("metadata.namePrefix"));
    let nobody = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["list"])
        .env("TRAINYARD_SERVER", &api)
        .env("TRAINYARD_TOKEN", "ty_wrong")
        .output()
        .unwrap();
    assert_eq!(nobody.status.code(), Some(1));
    // Quota from the CLI, with the server and token from a config file instead of the environment.
    let config = dir.join("cli.yaml");
    std::fs::write(&config, format!("server: {api}\ntoken: {token}\n")).unwrap();
    let quota = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["quota", "--config"])
        .arg(&config)
        .env_remove("TRAINYARD_SERVER")
        .env_remove("TRAINYARD_TOKEN")
        .output()
        .unwrap();
    let quota_out = String::from_utf8_lossy(&quota.stdout).to_string();
    assert_eq!(quota.status.code(), Some(0), "{quota_out}{}", String::from_utf8_lossy(&quota.stderr));
    assert!(
        quota_out.contains("default") && quota_out.contains("cpu.small") && quota_out.contains("REMAINING"),
        "{quota_out}"
    );
    // Administration from the CLI: a user, a token for them, and the catalog.
    assert_eq!(cli(&["admin", "user", "erin", "--group", "default"]).status.code(), Some(0));
    let token_out = cli(&["admin", "token", "erin", "--label", "test"]);
    let erin = String::from_utf8_lossy(&token_out.stdout).trim().to_owned();
    assert!(erin.starts_with("ty_"), "{erin}");
    let who = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["whoami"])
        .env("TRAINYARD_SERVER", &api)
        .env("TRAINYARD_TOKEN", &erin)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&who.stdout).trim(), "erin (member), groups: default");
    let catalog = cli(&["admin", "catalog", "get", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&catalog.stdout).unwrap();
    assert_eq!(v["regions"]["local"]["displayName"], "This machine");
    let node = v["nodes"].as_object().unwrap().keys().next().unwrap().clone();
    assert_eq!(cli(&["admin", "node", &node, "--cordon"]).status.code(), Some(0));
    assert_eq!(cli(&["admin", "node", &node, "--uncordon"]).status.code(), Some(0));
    server.kill().unwrap();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The daily verbs by name, through the real binary on the local backend: `get`, `describe` and `events`
/// take a name; `logs` shows the master's log, a replica's last lines, every replica with timestamps, and
/// follows a running one to its end; `list --status` takes any case and refuses what is not a status; a
/// pipe closed early (`| head`) ends the CLI quietly with status 0.
#[test]
fn logs_and_names_through_the_real_binary() {
    let s = common::Server::start("cli-logs", None);
    let cli = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_trainyard"))
            .args(args)
            .env("TRAINYARD_SERVER", &s.base)
            .env("TRAINYARD_TOKEN", &s.token)
            .output()
            .unwrap()
    };
    let text =
        |o: &Output| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let cmd = "for i in 1 2 3 4 5; do echo \"$TRAINYARD_ROLE says $i\"; sleep 0.3; done; seq 1 200000 > /tmp/big; \
               if [ \"$TRAINYARD_ROLE\" = master ]; then cat /tmp/big; fi; echo \"$TRAINYARD_ROLE done\"";
    let id = s.submit(&common::pytorch("clilogs", 1, cmd));
    let t = s.wait_status(&id, "Running", common::secs(60));
    let name = t["name"].as_str().unwrap().to_owned();

    // Followed while it runs, to its end.
    let follow = cli(&["logs", &name, "-f", "--replica", "worker-0"]);
    let out = text(&follow);
    assert_eq!(follow.status.code(), Some(0), "{out}");
    assert!(out.contains("worker says 1") && out.ends_with("worker done\n"), "{out}");
    s.wait_status(&id, "Succeeded", common::secs(60));

    let get = cli(&["get", &name, "-o", "json"]);
    let v: serde_json::Value =
        serde_json::from_slice(&get.stdout).unwrap_or_else(|_| panic!("{}", text(&get)));
    assert_eq!(v["id"], serde_json::json!(id));
    assert!(text(&cli(&["describe", &name])).contains(&id));
    assert!(text(&cli(&["events", &name])).contains("Completed"));
    // Every read verb prints JSON or YAML when asked.
    let d: serde_json::Value =
        serde_json::from_slice(&cli(&["describe", &name, "-o", "json"]).stdout).unwrap();
    assert_eq!(d["task"]["id"], serde_json::json!(id));
    assert!(d["events"].as_array().is_some_and(|e| e.iter().any(|e| e["reason"] == "Completed")), "{d}");
    let ev = String::from_utf8_lossy(&cli(&["events", &name, "-o", "yaml"]).stdout).to_string();
    assert!(ev.contains("reason: Completed"), "{ev}");
    let one: serde_json::Value =
        serde_json::from_slice(&cli(&["list", "--limit", "1", "-o", "json"]).stdout).unwrap();
    assert_eq!(one["items"].as_array().map(Vec::len), Some(1), "{one}");
    assert_eq!(cli(&["list", "--limit", "0"]).status.code(), Some(2));
    let missing = cli(&["get", "no-such-task"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(text(&missing).contains("no task named \"no-such-task\""), "{}", text(&missing));

    let master = cli(&["logs", &name, "--tail", "3"]);
    assert_eq!(text(&master), "199999\n200000\nmaster done\n");
    let worker = cli(&["logs", &id, "--replica", "worker-0", "--tail", "2"]);
    assert_eq!(text(&worker), "worker says 5\nworker done\n");
    let all = text(&cli(&["logs", &name, "--all", "--timestamps", "--tail", "1"]));
    let lines: Vec<&str> = all.lines().collect();
    assert_eq!(lines.len(), 2, "{all}");
    assert!(
        lines[0].starts_with(&format!("[{name}-master-0] 20")) && lines[0].ends_with("Z master done"),
        "{all}"
    );
    assert!(
        lines[1].starts_with(&format!("[{name}-worker-0] 20")) && lines[1].ends_with("Z worker done"),
        "{all}"
    );
    let bad_replica = cli(&["logs", &name, "--replica", "worker-7"]);
    assert_eq!(bad_replica.status.code(), Some(1));
    assert!(text(&bad_replica).contains("has no replica \"worker-7\""), "{}", text(&bad_replica));

    let running = cli(&["list", "--status", "succeeded", "-o", "json"]);
    let v: serde_json::Value =
        serde_json::from_slice(&running.stdout).unwrap_or_else(|_| panic!("{}", text(&running)));
    assert_eq!(v["items"][0]["id"], serde_json::json!(id));
    let bogus = cli(&["list", "--status", "bogus"]);
    assert_eq!(bogus.status.code(), Some(2));
    assert!(text(&bogus).contains("possible values"), "{}", text(&bogus));

    // 1.3 MB of log into `head -1`: the CLI meets a closed pipe and ends quietly.
    let piped = Command::new("bash")
        .args(["-c", &format!("\"$0\" logs {name} | head -1; echo \"status ${{PIPESTATUS[0]}}\"")])
        .arg(env!("CARGO_BIN_EXE_trainyard"))
        .env("TRAINYARD_SERVER", &s.base)
        .env("TRAINYARD_TOKEN", &s.token)
        .output()
        .unwrap();
    assert_eq!(text(&piped), "master says 1\nstatus 0\n");

    // `validate` checks against the server's catalog when one answers, and says which catalog it used.
    let hello = repo().join("examples/local/hello.yaml");
    let hello = hello.to_str().unwrap();
    let online = cli(&["validate", hello]);
    assert_eq!(online.status.code(), Some(0), "{}", text(&online));
    assert!(
        String::from_utf8_lossy(&online.stderr)
            .contains(&format!("checked against the catalog of {}", s.base))
    );
    let offline = cli(&["validate", "--offline", hello]);
    assert_eq!(
        offline.status.code(),
        Some(1),
        "the example catalog has no group default: {}",
        text(&offline)
    );
    assert!(String::from_utf8_lossy(&offline.stderr).contains("the example catalog built into this binary"));
}
