//! `trainyard validate` as a user runs it: exit codes, the demand table, problems with paths, JSON output.

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn trainyard(args: &[&str], stdin: Option<&str>) -> Output {
    // No server: the example catalog built into the binary, whatever runs on this machine.
    trainyard_at("http://127.0.0.1:9", "", args, stdin)
}

/// The CLI against the server at `api` with `token` ("" for none), `stdin` on its standard input.
fn trainyard_at(api: &str, token: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_trainyard"));
    if !token.is_empty() {
        command.env("TRAINYARD_TOKEN", token);
    }
    let mut child = command
        .args(args)
        .current_dir(repo())
        .env_remove("TRAINYARD_CATALOG")
        .env("TRAINYARD_SERVER", api)
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

/// What a `trainyard up` with piped stdout prints up to its CLI line (the last of its start): its API address
/// (without `/api/v1`) and all of it. The rest is drained in the background.
fn up_output(child: &mut std::process::Child) -> (String, String) {
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout is piped")).lines();
    let mut printed = String::new();
    let mut api = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        printed.push_str(&line);
        printed.push('\n');
        if let Some(rest) = line.trim().strip_prefix("API:") {
            api = rest.split_whitespace().next().map(|u| u.trim_end_matches("/api/v1").to_owned());
        }
        if line.trim().starts_with("CLI:") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    (api.unwrap_or_else(|| panic!("no API address in:\n{printed}")), printed)
}

/// `trainyard up` on the fake backend (replicas "run" `run_ms`) in a fresh temp data dir named after `name`:
/// the server, its data dir, its API address, what it printed and the admin token.
fn fake_up(name: &str, run_ms: &str) -> (std::process::Child, PathBuf, String, String, String) {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut server = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["up", "--backend", "fake", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&dir)
        .env("TRAINYARD_FAKE_RUN_MS", run_ms)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let (api, printed) = up_output(&mut server);
    let token = std::fs::read_to_string(dir.join("admin.token")).unwrap().trim().to_owned();
    (server, dir, api, printed, token)
}

/// The CLI against the server at `api` with `token`, from the repository's root.
fn against(api: &str, token: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(args)
        .env("TRAINYARD_SERVER", api)
        .env("TRAINYARD_TOKEN", token)
        .current_dir(repo())
        .output()
        .unwrap()
}

/// What a run printed, standard output then standard error.
fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
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
    let (mut server, dir, api, printed, token) = fake_up("trainyard-up", "300");
    assert!(printed.contains(&token), "the token is printed once at bootstrap");
    // Listening elsewhere than the default address, `up` says how the CLI reaches it.
    let api_port = api.rsplit(':').next().unwrap().to_owned();
    assert!(
        printed.contains(&format!("trainyard --server http://127.0.0.1:{api_port} submit -f")),
        "{printed}"
    );
    // The catalog `up` wrote for this machine: cpu.large, when the machine has room for it, is larger than
    // cpu.small.
    let catalog =
        trainyard_core::Catalog::from_yaml(&std::fs::read_to_string(dir.join("catalog.yaml")).unwrap())
            .unwrap();
    let small = &catalog.instance_specs["cpu.small"];
    if let Some(large) = catalog.instance_specs.get("cpu.large") {
        assert!(large.vcpus > small.vcpus, "cpu.large {large:?} is not larger than cpu.small {small:?}");
    }
    let cli = |args: &[&str]| against(&api, &token, args);
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
    assert_eq!(bad.status.code(), Some(2), "a task the server finds invalid is a validation error");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("metadata.namePrefix"));
    let nobody = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["list"])
        .env("TRAINYARD_SERVER", &api)
        .env("TRAINYARD_TOKEN", "ty_wrong")
        .output()
        .unwrap();
    assert_eq!(nobody.status.code(), Some(4), "a token the server refuses");
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
    // Its columns line up: each header starts where its figures do (figures to the right).
    let qlines: Vec<&str> = quota_out.lines().collect();
    let end_of = |line: &str, col: usize| {
        let mut ends = Vec::new();
        let mut prev = ' ';
        for (i, c) in line.char_indices() {
            if c == ' ' && prev != ' ' {
                ends.push(i);
            }
            prev = c;
        }
        ends.push(line.len());
        ends[col]
    };
    for l in &qlines[1..] {
        assert_eq!(end_of(l, 8), end_of(qlines[0], 8), "UNRESERVED:\n{quota_out}");
        assert_eq!(end_of(l, 5), end_of(qlines[0], 5), "REMAINING:\n{quota_out}");
    }
    // The admin token is found in the data dir `up` keeps it in ($TRAINYARD_DATA_DIR), from anywhere.
    let found = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["whoami"])
        .env("TRAINYARD_SERVER", &api)
        .env_remove("TRAINYARD_TOKEN")
        .env("TRAINYARD_DATA_DIR", &dir)
        .env("HOME", &dir)
        .current_dir("/")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&found.stdout).trim(), "admin (admin), groups: default");
    // An empty TRAINYARD_TOKEN (and an empty TRAINYARD_SERVER) is unset: the next place is looked at.
    let empty = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["whoami", "--config"])
        .arg(&config)
        .env("TRAINYARD_SERVER", "")
        .env("TRAINYARD_TOKEN", "")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&empty.stdout).trim(),
        "admin (admin), groups: default",
        "{}",
        String::from_utf8_lossy(&empty.stderr)
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
    let cli = |args: &[&str]| against(&s.base, &s.token, args);
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
    assert_eq!(missing.status.code(), Some(3));
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
    assert_eq!(bad_replica.status.code(), Some(3));
    assert!(text(&bad_replica).contains("has no replica \"worker-7\""), "{}", text(&bad_replica));

    let running = cli(&["list", "--status", "succeeded", "-o", "json"]);
    let v: serde_json::Value =
        serde_json::from_slice(&running.stdout).unwrap_or_else(|_| panic!("{}", text(&running)));
    assert_eq!(v["items"][0]["id"], serde_json::json!(id));
    let bogus = cli(&["list", "--status", "bogus"]);
    assert_eq!(bogus.status.code(), Some(2));
    assert!(text(&bogus).contains("possible values"), "{}", text(&bogus));
    // This machine's catalog has no GPUs: the task is a CPU task.
    let ids = |accelerator: &str| -> Vec<String> {
        let o = cli(&["list", "--accelerator", accelerator, "-o", "json"]);
        let v: serde_json::Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
        v["items"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_owned()).collect()
    };
    assert!(ids("CPU").contains(&id), "--accelerator cpu lists the task");
    assert!(ids("gpu").is_empty(), "no GPU tasks");
    let bogus = cli(&["list", "--accelerator", "tpu"]);
    assert_eq!(bogus.status.code(), Some(2));
    assert!(text(&bogus).contains("possible values: gpu, cpu"), "{}", text(&bogus));

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

/// Every subcommand (each level, `admin catalog get` included) and every flag and argument says what it is
/// for in `-h`; the top-level help says what Trainyard is and lists the exit statuses.
#[test]
fn every_subcommand_and_flag_has_help() {
    fn walk(path: &mut Vec<String>, missing: &mut Vec<String>, seen: &mut usize) {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("-h");
        let o = trainyard(&args, None);
        let out = stdout(&o);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {out}");
        *seen += 1;
        let mut section = "";
        let mut commands = Vec::new();
        let lines: Vec<&str> = out.lines().collect();
        let indent = |l: &str| l.len() - l.trim_start().len();
        for (i, line) in lines.iter().enumerate() {
            if !line.starts_with(' ') {
                section = line.trim_end_matches(':');
                continue;
            }
            // An item's help on its own line (clap does that when lines get long) is not an item.
            let is_item = match section {
                "Commands" => indent(line) == 2,
                "Arguments" | "Options" => line.trim_start().starts_with(['-', '<', '[']),
                _ => false,
            };
            if !is_item {
                continue;
            }
            // `  SPEC  help`, the spec without a double space in it; or the help on the next line, deeper.
            let item = line.trim_start();
            let (spec, help) = item.split_once("  ").unwrap_or((item, ""));
            let help = match lines.get(i + 1) {
                Some(next) if help.trim().is_empty() && indent(next) > indent(line) + 2 => next.trim(),
                _ => help.trim(),
            };
            if help.is_empty() || help.starts_with('[') {
                missing.push(format!("trainyard {} {spec}", path.join(" ")));
            }
            if section == "Commands" && spec != "help" {
                commands.push(spec.to_owned());
            }
        }
        for c in commands {
            path.push(c);
            walk(path, missing, seen);
            path.pop();
        }
    }
    let (mut missing, mut seen) = (Vec::new(), 0);
    walk(&mut Vec::new(), &mut missing, &mut seen);
    assert!(missing.is_empty(), "without help:\n{}", missing.join("\n"));
    assert!(seen >= 25, "walked {seen} commands");
    let top = stdout(&trainyard(&["--help"], None));
    assert!(!top.contains("later"), "{top}");
    assert!(top.starts_with("Trainyard: "), "{top}");
    for code in
        ["0  success", "1  the task ended in failure", "2  usage", "3  not found", "4  refused", "5  server"]
    {
        assert!(top.contains(code), "no {code:?} in\n{top}");
    }
}

/// The exit statuses that need no server: usage errors (2), a server that does not answer (5), and no token
/// at all (2, with what to do instead of an HTTP error). The token's default is an absolute path.
#[test]
fn exit_statuses_without_a_server() {
    let home = std::env::temp_dir().join(format!("trainyard-cli-home-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let run = |args: &[&str], token: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainyard"));
        cmd.args(args)
            .env("TRAINYARD_SERVER", "http://127.0.0.1:9")
            .env("HOME", &home)
            .env_remove("TRAINYARD_CONFIG")
            .env_remove("TRAINYARD_DATA_DIR")
            .current_dir(&home);
        match token {
            Some(t) => cmd.env("TRAINYARD_TOKEN", t),
            None => cmd.env_remove("TRAINYARD_TOKEN"),
        };
        let o = cmd.output().unwrap();
        (
            o.status.code(),
            format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
        )
    };
    assert_eq!(run(&["get"], Some("ty_x")).0, Some(2), "a missing argument");
    assert_eq!(run(&["list", "--bogus"], Some("ty_x")).0, Some(2), "an unknown flag");
    assert_eq!(run(&["clone", "t", "--hidden", "novalue"], Some("ty_x")).0, Some(2));
    let (code, said) = run(&["list"], Some("ty_x"));
    assert_eq!(code, Some(5), "{said}");
    assert!(said.contains("cannot reach http://127.0.0.1:9"), "{said}");
    let (code, said) = run(&["get", "some-task"], None);
    assert_eq!(code, Some(2), "{said}");
    let expected = home.join(".trainyard/admin.token");
    assert!(
        said.contains(
            "no token: set TRAINYARD_TOKEN, pass --token, or put token: in ~/.config/trainyard/config.yaml"
        ) && said.contains(&*expected.to_string_lossy())
            && !said.contains("401"),
        "{said}"
    );
    // The help names the file it would read, as an absolute path.
    let (_, help) = run(&["--help"], None);
    assert!(help.contains(&format!("here {}", expected.display())), "{help}");
    let _ = std::fs::remove_dir_all(&home);
}

/// `up --nodes N` splits the machine into at most one node per vCPU (and per GPU): more is refused with the
/// limit and why, before anything is written; two nodes, where the machine has room, are two.
#[test]
fn up_refuses_more_nodes_than_the_machine_has() {
    let dir = std::env::temp_dir().join(format!("trainyard-up-nodes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let up = |nodes: &str| {
        Command::new(env!("CARGO_BIN_EXE_trainyard"))
            .args(["up", "--backend", "fake", "--listen", "127.0.0.1:0", "--nodes", nodes, "--data-dir"])
            .arg(&dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let o = up("100000").wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--nodes 100000: this machine splits into at most") && err.contains("of its own"),
        "{err}"
    );
    assert!(!dir.exists(), "nothing was written");
    let o = trainyard(&["up", "--nodes", "0"], None);
    assert_eq!(o.status.code(), Some(2));
    // Two nodes where there is room for two (a vCPU each, and a GPU each when there are GPUs).
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let gpus = Command::new("nvidia-smi")
        .args(["--query-gpu=name", "--format=csv,noheader"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().filter(|l| !l.trim().is_empty()).count());
    if cpus >= 2 && gpus.is_none_or(|g| g >= 2) {
        let mut server = up("2");
        let _ = up_output(&mut server);
        let text = std::fs::read_to_string(dir.join("catalog.yaml")).unwrap();
        server.kill().unwrap();
        let _ = server.wait();
        let catalog = trainyard_core::Catalog::from_yaml(&text).unwrap();
        assert_eq!(catalog.nodes.len(), 2, "{text}");
        let small = &catalog.instance_specs["cpu.small"];
        if let Some(large) = catalog.instance_specs.get("cpu.large") {
            assert!(large.vcpus > small.vcpus, "{text}");
            let node = catalog.nodes.values().next().unwrap();
            assert!(
                large.vcpus <= node.vcpus && large.memory_mib <= node.memory_mib,
                "it fits a node: {text}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The daily verbs on the fake backend, by name and by id: `get`/`list` with `-o wide` and `--watch`,
/// `stop --wait`, `resubmit --wait`, `clone` (with and without `--wait`, and a `--wait` that ends in
/// failure: exit 1), `share`, `metrics` with nothing sampled, and the exit statuses 3 and 4.
#[test]
fn watch_wait_wide_clone_and_share_on_the_fake_backend() {
    let (mut server, dir, api, _, token) = fake_up("trainyard-up-daily", "3000");
    let command = |token: &str, args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_trainyard"));
        c.args(args).env("TRAINYARD_SERVER", &api).env("TRAINYARD_TOKEN", token).current_dir(repo());
        c
    };
    let cli = |args: &[&str]| command(&token, args).output().unwrap();
    let submit = || {
        let o = cli(&["submit", "-f", "examples/local/hello.yaml", "-o", "json"]);
        let t: serde_json::Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
        (t["name"].as_str().unwrap().to_owned(), t["id"].as_str().unwrap().to_owned())
    };

    // get --watch: one JSON document per change, until the task ends.
    let (name, id) = submit();
    let watched = cli(&["get", &name, "--watch", "-o", "json"]);
    assert_eq!(watched.status.code(), Some(0), "{}", text(&watched));
    let docs: Vec<serde_json::Value> =
        stdout(&watched).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(docs.len() >= 2, "it changed while watched: {}", stdout(&watched));
    assert!(docs.windows(2).all(|w| w[0] != w[1]), "printed only on change");
    assert_eq!(docs.last().unwrap()["status"], "Succeeded");
    assert!(docs.iter().any(|d| d["status"] == "Running"), "{}", stdout(&watched));

    // -o wide: resource type, replicas, GPUs, run time, nodes.
    let wide = stdout(&cli(&["get", &id, "-o", "wide"]));
    let lines: Vec<&str> = wide.lines().collect();
    for col in ["RESOURCE", "REPLICAS", "GPUS", "AGE", "DURATION", "NODES"] {
        assert!(lines[0].contains(col), "{wide}");
    }
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        &row[..7],
        [name.as_str(), "PyTorchJob", "Succeeded", "default", "Reserved", "2", "0"],
        "{wide}"
    );
    assert!(lines[1].contains(" ran ") && lines[1].contains("local-"), "{wide}");
    let listed = stdout(&cli(&["list", "-o", "wide"]));
    assert!(listed.lines().any(|l| l.starts_with(&name) && l.contains("Reserved")), "{listed}");

    // list --watch: the list again when it changes (here: a new task), until stopped.
    let mut watching = command(&token, &["list", "-w", "-o", "json"]).stdout(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let (name2, id2) = submit();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    watching.kill().unwrap();
    let seen = String::from_utf8_lossy(&watching.wait_with_output().unwrap().stdout).to_string();
    let docs: Vec<serde_json::Value> = seen.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(docs.len() >= 2, "{seen}");
    assert!(
        !docs[0]["items"].as_array().unwrap().iter().any(|t| t["id"] == serde_json::json!(id2)),
        "{seen}"
    );
    assert!(
        docs.last().unwrap()["items"].as_array().unwrap().iter().any(|t| t["id"] == serde_json::json!(id2))
    );

    // stop --wait (by name) until it is stopped; resubmit --wait (by id) until it runs again.
    let stopped = cli(&["stop", &name2, "--wait"]);
    assert_eq!(stopped.status.code(), Some(0), "{}", text(&stopped));
    assert!(stdout(&stopped).ends_with(&format!("{name2} stopped\n")), "{}", text(&stopped));
    let again = cli(&["resubmit", &id2, "--wait"]);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again));
    let said = text(&again);
    assert!(
        said.contains(&format!("{name2} is running")) || said.contains(&format!("{name2} succeeded")),
        "{said}"
    );
    assert!(said.contains("Resubmitted"), "the events since the resubmission: {said}");
    // Stopping what has ended is refused by the server: 4.
    assert_eq!(cli(&["stop", &name, "--wait"]).status.code(), Some(4));

    // clone: a copy by id; by name with --wait to its end; a --wait whose task is stopped exits 1.
    let copy = cli(&["clone", &id, "-o", "json"]);
    let c: serde_json::Value =
        serde_json::from_slice(&copy.stdout).unwrap_or_else(|_| panic!("{}", text(&copy)));
    assert!(c["name"].as_str().unwrap().starts_with("hello-") && c["name"] != serde_json::json!(name), "{c}");
    let waited = cli(&["clone", &name, "--wait"]);
    assert_eq!(waited.status.code(), Some(0), "{}", text(&waited));
    assert!(
        stdout(&waited).contains("a copy of") && stdout(&waited).ends_with("succeeded\n"),
        "{}",
        text(&waited)
    );
    let mut doomed = command(&token, &["clone", &name, "--wait"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(doomed.stdout.as_mut().unwrap()), &mut first)
        .unwrap();
    let copy_name = first.split_whitespace().nth(1).unwrap().to_owned();
    assert_eq!(cli(&["stop", &copy_name]).status.code(), Some(0));
    let doomed = doomed.wait_with_output().unwrap();
    assert_eq!(doomed.status.code(), Some(1), "{}", text(&doomed));
    assert!(String::from_utf8_lossy(&doomed.stdout).ends_with(&format!("{copy_name} stopped\n")));

    // share: a user outside the group sees the task only once it is shared, and operates it only with
    // --operate.
    assert_eq!(cli(&["admin", "user", "sam"]).status.code(), Some(0));
    let sam = stdout(&cli(&["admin", "token", "sam"])).trim().to_owned();
    let as_sam = |args: &[&str]| command(&sam, args).output().unwrap();
    let hidden = as_sam(&["get", &name]);
    assert_eq!(hidden.status.code(), Some(3), "{}", text(&hidden));
    let shared = cli(&["share", &name, "--with", "sam"]);
    assert_eq!(shared.status.code(), Some(0), "{}", text(&shared));
    assert_eq!(stdout(&shared), format!("sam may now see {name}\n"));
    assert_eq!(as_sam(&["get", &name]).status.code(), Some(0));
    assert_eq!(as_sam(&["resubmit", &name]).status.code(), Some(4), "seeing is not operating");
    assert_eq!(cli(&["share", &id, "--with", "sam", "--operate"]).status.code(), Some(0));
    let resubmitted = as_sam(&["resubmit", &name]);
    assert_eq!(resubmitted.status.code(), Some(0), "{}", text(&resubmitted));
    assert_eq!(cli(&["share", &name, "--with", "nobody-here"]).status.code(), Some(2));
    // share --list, then --revoke: sam sees it no more; taking back what is not shared is a 3 (not found).
    let listed = cli(&["share", &name, "--list"]);
    assert_eq!(stdout(&listed), "USER  MAY\nsam   see and operate\n", "{}", text(&listed));
    let revoked = cli(&["share", &id, "--revoke", "sam"]);
    assert_eq!(stdout(&revoked), format!("{id} is no longer shared with sam\n"), "{}", text(&revoked));
    assert_eq!(as_sam(&["get", &name]).status.code(), Some(3));
    assert_eq!(stdout(&cli(&["share", &name, "--list"])), "not shared with anyone\n");
    assert_eq!(cli(&["share", &name, "--revoke", "sam"]).status.code(), Some(3));
    assert_eq!(cli(&["share", &name]).status.code(), Some(2), "one of --with, --list, --revoke");
    // clone --name-prefix: the copy's own name.
    let renamed = cli(&["clone", &name, "--name-prefix", "again", "-o", "json"]);
    let r: serde_json::Value =
        serde_json::from_slice(&renamed.stdout).unwrap_or_else(|_| panic!("{}", text(&renamed)));
    assert!(r["name"].as_str().unwrap().starts_with("again-"), "{r}");
    // Own tokens, listed as tables with their ages and which one this call came with.
    let tokens = stdout(&command(&sam, &["admin", "token", "sam", "--list"]).output().unwrap());
    let lines: Vec<&str> = tokens.lines().collect();
    assert!(lines[0].starts_with("ID") && lines[0].contains("LAST USED"), "{tokens}");
    assert!(lines.len() == 2 && lines[1].ends_with("this one"), "{tokens}");

    // metrics: the fake backend samples nothing; the table says so, JSON is the API's answer.
    let m = cli(&["metrics", &name]);
    assert_eq!(m.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&m.stderr).contains("no metrics of attempt"), "{}", text(&m));
    let m: serde_json::Value = serde_json::from_slice(&cli(&["metrics", &id, "-o", "json"]).stdout).unwrap();
    assert_eq!(m["series"], serde_json::json!([]));
    assert_eq!(cli(&["metrics", "no-such-task"]).status.code(), Some(3));

    server.kill().unwrap();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// On the local backend: `metrics` by name and by id (preset and custom series, in their units, per replica),
/// and `submit --wait` of a task that fails exits 1.
#[test]
fn metrics_and_a_failed_wait_on_the_local_backend() {
    let s = common::Server::start("cli-metrics", None);
    let cli = |args: &[&str]| against(&s.base, &s.token, args);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let cmd = format!(
        r#"python3 - <<'PY'
import http.server, threading, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'train_loss{{phase="train"}} 0.25\ntrain_step 1234\n'
        self.send_response(200); self.send_header("Content-Type", "text/plain"); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
srv = http.server.HTTPServer(("127.0.0.1", {port}), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
t0 = time.time()
while time.time() - t0 < 11.5:
    sum(i * i for i in range(20000))
PY"#
    );
    let mut task = common::pytorch("climetrics", 0, &cmd);
    task["spec"]["advanced"] = serde_json::json!({"metrics": {"enabled": true, "intervalSeconds": 5, "endpoints": [{"port": port, "path": "/metrics"}]}});
    let id = s.submit(&task);
    let name = s.wait_status(&id, "Succeeded", common::secs(90))["name"].as_str().unwrap().to_owned();
    let table = cli(&["metrics", &name]);
    let out = text(&table);
    assert_eq!(table.status.code(), Some(0), "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("REPLICA") && lines[0].contains("LATEST") && lines[0].contains("MAX"),
        "{out}"
    );
    let row = |metric: &str| {
        lines
            .iter()
            .find(|l| l.split_whitespace().nth(1) == Some(metric))
            .unwrap_or_else(|| panic!("{metric}: {out}"))
    };
    assert!(
        row("trainyard_cpu_cores").starts_with("master-0 ") && row("trainyard_cpu_cores").contains(" cores"),
        "{out}"
    );
    assert!(row("trainyard_memory_rss_bytes").contains(" MiB"), "{out}");
    assert!(row("train_loss").contains("phase=train") && row("train_loss").contains("0.25"), "{out}");
    assert!(row("train_step").contains("1234") && !out.contains("e+"), "{out}");
    // Preset series before the task's own.
    let at = |m: &str| lines.iter().position(|l| l.split_whitespace().nth(1) == Some(m)).unwrap();
    assert!(at("trainyard_cpu_cores") < at("train_loss"), "{out}");
    let json = cli(&["metrics", &id, "--replica", "master-0", "--attempt", "0", "-o", "json"]);
    let v: serde_json::Value =
        serde_json::from_slice(&json.stdout).unwrap_or_else(|_| panic!("{}", text(&json)));
    assert_eq!(v["attempt"], 0);
    assert!(
        v["series"].as_array().unwrap().iter().all(|s| s["replica"] == format!("{name}-master-0")),
        "{v}"
    );
    assert!(v["series"].as_array().unwrap().iter().any(|s| s["name"] == "train_step"), "{v}");
    let none = cli(&["metrics", &name, "--replica", "worker-3"]);
    assert_eq!(none.status.code(), Some(3), "{}", text(&none));

    // A task that fails: `submit --wait` says so and exits 1.
    let mut failing = common::pytorch("clifails", 0, "echo about to fail; exit 3");
    failing["spec"]["advanced"] = serde_json::json!({"faultTolerance": {"maxResubmissions": 0}});
    let file = s.dir.join("failing.json");
    std::fs::write(&file, failing.to_string()).unwrap();
    let failed = cli(&["submit", "-f", file.to_str().unwrap(), "--wait"]);
    assert_eq!(failed.status.code(), Some(1), "{}", text(&failed));
    assert!(String::from_utf8_lossy(&failed.stdout).trim_end().ends_with("failed"), "{}", text(&failed));
}

/// `admin catalog set` of a catalog that takes away what an active task uses is refused (exit 4) with each
/// conflict and the task named; `--force` replaces it anyway. Then `delete` by filter.
#[test]
fn a_catalog_taking_away_what_tasks_use_is_refused_unless_forced() {
    let (mut server, dir, api, _, token) = fake_up("trainyard-up-catalog", "600000");
    let cli = |args: &[&str]| against(&api, &token, args);
    let o = cli(&["submit", "-f", "examples/local/hello.yaml", "-o", "json"]);
    let t: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
    let name = t["name"].as_str().unwrap().to_owned();
    // The catalog in force with the task's project group renamed (its quotas follow).
    let o = cli(&["admin", "catalog", "get", "-o", "json"]);
    let mut catalog: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
    let groups = catalog["projectGroups"].as_object_mut().unwrap();
    let group = groups.remove("default").expect("up's catalog has the default group");
    groups.insert("renamed".into(), group);
    for q in catalog["quotas"].as_array_mut().unwrap() {
        q["group"] = "renamed".into();
    }
    let file = dir.join("renamed.json");
    std::fs::write(&file, catalog.to_string()).unwrap();
    let file = file.to_str().unwrap();

    let refused = cli(&["admin", "catalog", "set", "-f", file]);
    assert_eq!(refused.status.code(), Some(4), "{}", text(&refused));
    let said = text(&refused);
    assert!(
        said.contains("(409)") && said.contains("metadata.projectGroup") && said.contains(&name),
        "{said}"
    );
    let o = cli(&["admin", "catalog", "get", "-o", "json"]);
    let kept: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(kept["projectGroups"].get("default").is_some(), "nothing was replaced");

    let forced = cli(&["admin", "catalog", "set", "-f", file, "--force"]);
    assert_eq!(forced.status.code(), Some(0), "{}", text(&forced));
    assert!(stdout(&forced).starts_with("catalog replaced"), "{}", text(&forced));
    let o = cli(&["admin", "catalog", "get", "-o", "json"]);
    let now: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(now["projectGroups"].get("renamed").is_some(), "{now}");

    // Delete by filter: never without one; with one, every matching task, by pages until none is left.
    let bare = cli(&["delete"]);
    assert_eq!(bare.status.code(), Some(2), "{}", text(&bare));
    assert!(text(&bare).contains("--status"), "{}", text(&bare));
    let gone = cli(&["delete", "-q", &name, "-o", "json"]);
    assert_eq!(gone.status.code(), Some(0), "{}", text(&gone));
    let done: serde_json::Value =
        serde_json::from_slice(&gone.stdout).unwrap_or_else(|_| panic!("{}", text(&gone)));
    assert_eq!(done["deleted"], 1, "{done}");
    assert_eq!(done["ids"][0], t["id"], "{done}");
    let listed: serde_json::Value =
        serde_json::from_slice(&cli(&["list", "-q", &name, "-o", "json"]).stdout).unwrap();
    assert_eq!(listed["items"].as_array().map(Vec::len), Some(0), "{listed}");
    let again = cli(&["delete", "-q", &name]);
    assert_eq!(stdout(&again), "deleted 0 tasks\n", "{}", text(&again));
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `admin registry`: a login set with the password on standard input (never on the command line), listed
/// without it, removed; no password, or a host that is not one, is a clear error that stores nothing.
#[test]
fn registry_logins_through_the_cli() {
    let (mut server, dir, api, _, token) = fake_up("trainyard-registry-cli", "300");
    let cli = |args: &[&str], stdin: Option<&str>| trainyard_at(&api, &token, args, stdin);
    let login = ["admin", "registry", "login", "reg.example:5000", "-u", "ci", "--password-stdin"];
    let set = cli(&[&login[..], &["--group", "default"]].concat(), Some("pw-s3cret\n"));
    assert_eq!(set.status.code(), Some(0), "{}", text(&set));
    assert!(stdout(&set).contains("login for reg.example:5000 set (user ci)"), "{}", text(&set));

    let list = cli(&["admin", "registry", "list"], None);
    let shown = stdout(&list);
    assert!(
        shown.contains("REGISTRY") && shown.contains("reg.example:5000") && shown.contains("default"),
        "{shown}"
    );
    let json = cli(&["admin", "registry", "list", "-o", "json"], None);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["items"][0]["username"], "ci");
    for o in [&list, &json] {
        assert!(!text(o).contains("pw-s3cret"), "never the password: {}", text(o));
    }
    // No password: refused before anything is sent; a bad host: the server's problem, nothing stored.
    let empty = cli(&login, Some(""));
    assert_eq!(empty.status.code(), Some(2), "{}", text(&empty));
    assert!(text(&empty).contains("no password on standard input"), "{}", text(&empty));
    let bad = cli(&["admin", "registry", "login", "not a host", "-u", "ci", "--password-stdin"], Some("x\n"));
    assert_ne!(bad.status.code(), Some(0), "{}", text(&bad));
    assert!(text(&bad).contains("registry host"), "{}", text(&bad));
    let hosts = |o: &Output| -> Vec<String> {
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["items"].as_array().unwrap().iter().map(|r| r["host"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(hosts(&cli(&["admin", "registry", "list", "-o", "json"], None)), ["reg.example:5000"]);

    let out = cli(&["admin", "registry", "logout", "reg.example:5000"], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(hosts(&cli(&["admin", "registry", "list", "-o", "json"], None)).is_empty());
    let again = cli(&["admin", "registry", "logout", "reg.example:5000"], None);
    assert_ne!(again.status.code(), Some(0));
    assert!(text(&again).contains("has no login"), "{}", text(&again));
    server.kill().unwrap();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `logs -f` on a task that waits in the queue: it says where the task waits (on standard error), waits for it
/// to start, then follows its replica; it neither fails at once nor returns before the task left the queue.
#[test]
fn logs_follow_waits_for_a_queued_task_to_start() {
    let (mut server, dir, api, _, token) = fake_up("trainyard-up-logs-wait", "4000");
    let submit = || {
        let o = against(&api, &token, &["submit", "-f", "examples/local/hello.yaml", "-o", "json"]);
        let t: serde_json::Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
        (t["name"].as_str().unwrap().to_owned(), t["id"].as_str().unwrap().to_owned())
    };
    let status = |id: &str| {
        let o = against(&api, &token, &["get", id, "-o", "json"]);
        let t: serde_json::Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", text(&o)));
        t["status"].as_str().unwrap().to_owned()
    };
    // Tasks until one waits in the queue (the machine's quota holds a few).
    let mut queued = None;
    for _ in 0..40 {
        let (name, id) = submit();
        std::thread::sleep(std::time::Duration::from_millis(300));
        if status(&id) == "Queued" {
            queued = Some((name, id));
            break;
        }
    }
    let (name, id) = queued.expect("no task waited in the queue");
    let followed = against(&api, &token, &["logs", "-f", &name]);
    let err = String::from_utf8_lossy(&followed.stderr).to_string();
    assert_eq!(followed.status.code(), Some(0), "{}", text(&followed));
    assert!(err.contains(&format!("waiting for {name} to start: queued #")), "{err}");
    assert!(err.contains(&format!("{name} started")), "{err}");
    assert_ne!(status(&id), "Queued", "it returned while the task still waited");
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
