//! The attack suite's control-plane half: each test is one finding of issue 11 tried as a tenant would,
//! against a real `trainyard up` (local backend, the shared harness), asserting that the attack fails *and*
//! that the legitimate path next to it still works. Written so each fails on the code before the fix.
//!
//! Two project groups: `default` (alice, mallory) and `other` (bob); the harness's token is the admin's.

mod common;

use common::{Options, Server, agent, secs};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// The harness's catalog with a second project group, the host image for both groups, and a volume and a
/// dataset that belong to `default` only.
fn catalog() -> String {
    common::CATALOG
        .replace("projectGroups: {default: {}}", "projectGroups: {default: {}, other: {}}")
        .replace(
            "host: {torch: true, ray: true}",
            "host: {torch: true, ray: true, projectGroups: [default, other]}",
        )
        .replace(
            "volumes: {out: {multiPodReadWrite: true}",
            "volumes: {out: {multiPodReadWrite: true, projectGroups: [default]}",
        )
        .replace("datasets: {data: {}}", "datasets: {data: {projectGroups: [default]}}")
        + "  - {group: other, resourceType: Reserved, pool: default, spec: cpu.small, units: 6}\n"
}

/// A server with [`catalog`] and the users, each with a token of their own.
struct Tenants {
    s: Server,
    alice: String,
    mallory: String,
    bob: String,
}

fn tenants(name: &str, args: &[&str]) -> Tenants {
    let s = Server::start_with(
        name,
        Options { args: args.iter().map(|a| a.to_string()).collect(), ..Options::default() },
    );
    let (code, body) = s.call("PUT", "/api/v1/admin/catalog", Some(&catalog()));
    assert_eq!(code, 200, "{body}");
    let token = |user: &str, group: &str| {
        let body = json!({"name": user, "role": "member", "groups": [group]}).to_string();
        assert_eq!(s.call("POST", "/api/v1/admin/users", Some(&body)).0, 200);
        let (code, t) = s.call("POST", &format!("/api/v1/users/{user}/tokens"), Some("{}"));
        assert_eq!(code, 201, "{t}");
        serde_json::from_str::<Value>(&t).unwrap()["token"].as_str().unwrap().to_owned()
    };
    let (alice, mallory, bob) =
        (token("alice", "default"), token("mallory", "default"), token("bob", "other"));
    Tenants { s, alice, mallory, bob }
}

/// One request with a token (or none), any method and headers: the status and the body as JSON (or text).
fn call(
    s: &Server,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> (u16, Value) {
    let url = format!("{}{path}", s.base);
    let a = agent();
    let mut req = match method {
        "GET" => a.get(&url).force_send_body(),
        "DELETE" => a.delete(&url).force_send_body(),
        "PUT" => a.put(&url),
        _ => a.post(&url),
    };
    if let Some(t) = token {
        req = req.header("Authorization", &format!("Bearer {t}"));
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut resp = req.send(body.unwrap_or("").as_bytes()).unwrap();
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// A one-replica PyTorchJob of `group` on the host image running `cmd`, with these env vars.
fn job(prefix: &str, group: &str, cmd: &str, env: Value) -> Value {
    let mut t = common::pytorch(prefix, 0, cmd);
    t["metadata"]["projectGroup"] = json!(group);
    t["spec"]["environment"]["env"] = env;
    t
}

fn submit(s: &Server, token: &str, task: &Value) -> String {
    let (code, v) = call(s, Some(token), "POST", "/api/v1/tasks", Some(&task.to_string()), &[]);
    assert_eq!(code, 201, "{v}");
    v["id"].as_str().unwrap().to_owned()
}

/// The master's log once the task ended.
fn output(s: &Server, id: &str) -> String {
    let t = s.wait_status(id, "Succeeded", secs(90));
    s.log(id, &format!("{}-master-0", t["name"].as_str().unwrap()), None)
}

/// A request over a raw connection, for bodies the server refuses before reading them (a client library
/// may fail on the closed pipe before it reads the answer): the status line and the body.
fn raw(s: &Server, token: &str, head: &str, body: &[u8]) -> (u16, Value) {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(s.base.trim_start_matches("http://")).unwrap();
    c.set_read_timeout(Some(secs(10))).unwrap();
    let head = format!(
        "{head}\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    let _ = c.write_all(body);
    let mut got = Vec::new();
    let _ = c.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got).into_owned();
    let status = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(body).unwrap_or(Value::String(text.clone())))
}

/// Finding 7: a plain TaskEnv value that looks sealed, copied from the database, is passed as the text it
/// is; it is never opened to the secret it was sealed from. The owner still gets her own secret.
#[test]
fn f07_task_env_is_not_a_decryption_oracle() {
    let t = tenants("attack-oracle", &[]);
    let secret = "alice-wandb-0123456789";
    let body = json!({"name": "WANDB_API_KEY", "value": secret, "hidden": true}).to_string();
    assert_eq!(call(&t.s, Some(&t.alice), "PUT", "/api/v1/users/alice/env", Some(&body), &[]).0, 204);
    // mallory has a copy of the database.
    let sealed = read_store(&t.s, async |st| st.task_env("alice").await.unwrap()[0].value.clone());
    assert!(!sealed.contains(secret));
    let body = json!({"name": "STOLEN", "value": sealed}).to_string();
    assert_eq!(call(&t.s, Some(&t.mallory), "PUT", "/api/v1/users/mallory/env", Some(&body), &[]).0, 204);
    let id = submit(&t.s, &t.mallory, &job("oracle", "default", "echo \"stolen=$STOLEN\"", json!([])));
    let log = output(&t.s, &id);
    assert!(!log.contains(secret), "the sealed value was opened for mallory:\n{log}");
    assert!(log.contains(&format!("stolen={sealed}")), "{log}");
    let id = submit(&t.s, &t.alice, &job("mine", "default", "echo \"key=$WANDB_API_KEY\"", json!([])));
    assert!(output(&t.s, &id).contains(&format!("key={secret}")), "the owner's own value still arrives");
}

/// Runs `f` on a connection of its own to the server's SQLite database.
fn read_store<T>(s: &Server, f: impl AsyncFnOnce(trainyard_store::Store) -> T) -> T {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let url = format!("sqlite://{}", s.dir.join("trainyard.db").display());
        f(trainyard_store::Store::connect(&url).await.unwrap()).await
    })
}

/// Findings 6 and 10: bob, with an operate share on alice's task, cannot clone it into her group, and a clone
/// into his own group carries none of her hidden values (the mask is refused); what runs has his value.
#[test]
fn f06_f10_clone_stays_in_the_cloners_group_without_hidden_values() {
    let t = tenants("attack-clone", &[]);
    let secret = "alice-token-9876";
    let env = json!([{"name": "TOKEN", "value": secret, "hidden": true}]);
    let id = submit(&t.s, &t.alice, &job("src", "default", "echo \"token=$TOKEN\"", env));
    let share = json!({"user": "bob", "operate": true}).to_string();
    assert_eq!(
        call(&t.s, Some(&t.alice), "POST", &format!("/api/v1/tasks/{id}/shares"), Some(&share), &[]).0,
        204
    );
    let clone =
        |body: &str| call(&t.s, Some(&t.bob), "POST", &format!("/api/v1/tasks/{id}/clone"), Some(body), &[]);
    let (code, p) = clone("");
    assert_eq!(code, 403, "into a group bob is not in: {p}");
    let (code, p) = clone(r#"{"projectGroup": "other"}"#);
    assert_eq!(code, 422, "{p}");
    assert_eq!(
        (p["problems"][0]["path"].as_str(), p["problems"][0]["code"].as_str()),
        (Some("spec.environment.env[0].value"), Some("masked-value")),
        "{p}"
    );
    // The console's old clone sent the mask back as the value: refused too.
    let mut copy = job(
        "copy",
        "other",
        "echo \"token=$TOKEN\"",
        json!([{"name": "TOKEN", "value": "******", "hidden": true}]),
    );
    let (code, p) = call(&t.s, Some(&t.bob), "POST", "/api/v1/tasks", Some(&copy.to_string()), &[]);
    assert_eq!((code, p["problems"][0]["code"].as_str()), (422, Some("masked-value")), "{p}");
    // His own value: created in his group, and that is what runs.
    let (code, c) = clone(r#"{"projectGroup": "other", "hiddenValues": {"TOKEN": "bobs-own"}}"#);
    assert_eq!(code, 201, "{c}");
    let log = output(&t.s, c["id"].as_str().unwrap());
    assert!(log.contains("token=bobs-own") && !log.contains(secret), "{log}");
    copy["spec"]["environment"]["env"][0]["value"] = json!("typed-again");
    assert_eq!(call(&t.s, Some(&t.bob), "POST", "/api/v1/tasks", Some(&copy.to_string()), &[]).0, 201);
    assert!(output(&t.s, &id).contains(&format!("token={secret}")), "alice's own task still has it");
}

/// Finding 8: a volume or dataset of another group cannot be mounted (the problem names the groups it is
/// for); the owning group mounts it and writes to it. The host image is for the groups its entry lists.
#[test]
fn f08_storage_belongs_to_its_groups() {
    let t = tenants("attack-storage", &[]);
    let mounted = |group: &str| {
        let mut task = job("vol", group, "echo written > /volume/out/f && cat /volume/out/f", json!([]));
        task["spec"]["environment"]["volumes"] = json!([{"volume": "out", "mountPath": "/volume/out"}]);
        task
    };
    let (code, p) =
        call(&t.s, Some(&t.bob), "POST", "/api/v1/tasks", Some(&mounted("other").to_string()), &[]);
    assert_eq!(code, 422, "{p}");
    assert_eq!(p["problems"][0]["code"], "not-in-group", "{p}");
    let message = p["problems"][0]["message"].as_str().unwrap();
    assert!(message.contains("is not offered to project group \"other\""), "{p}");
    assert!(!message.contains("default"), "another group's use of it is not bob's business: {p}");
    let mut data = job("data", "other", "ls /mnt/data", json!([]));
    data["spec"]["environment"]["datasets"] = json!([{"dataset": "data", "mountPath": "/mnt/data"}]);
    let (code, p) = call(&t.s, Some(&t.bob), "POST", "/api/v1/tasks", Some(&data.to_string()), &[]);
    assert_eq!((code, p["problems"][0]["code"].as_str()), (422, Some("not-in-group")), "{p}");
    let id = submit(&t.s, &t.alice, &mounted("default"));
    assert!(output(&t.s, &id).contains("written"));
    // host: taken off the list for `other`, bob may no longer use it; the admin always may.
    let narrowed = catalog().replace("projectGroups: [default, other]}", "projectGroups: [default]}");
    assert_eq!(t.s.call("PUT", "/api/v1/admin/catalog", Some(&narrowed)).0, 200);
    let (code, p) = call(
        &t.s,
        Some(&t.bob),
        "POST",
        "/api/v1/tasks",
        Some(&job("h", "other", "true", json!([])).to_string()),
        &[],
    );
    assert_eq!(code, 403, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("images.host.projectGroups: default"), "{p}");
    t.s.submit(&job("h", "other", "true", json!([])));
}

/// Issue 29 (a helper's leftover from High 2): an error listed the choices from the whole catalog, so a
/// member learnt the names of other groups' images, volumes, datasets and groups from a typo. The verdict is
/// the same for everyone; the choices a member is offered are their groups' part of the catalog, as
/// `GET /catalog` shows them. The admin still sees every choice.
#[test]
fn i29_a_members_errors_offer_only_their_groups_choices() {
    let t = tenants("attack-hints", &[]);
    let mut task = job("typo", "other", "true", json!([]));
    task["spec"]["environment"]["datasets"] = json!([{"dataset": "dta", "mountPath": "/mnt/data"}]);
    task["spec"]["environment"]["volumes"] = json!([{"volume": "ot", "mountPath": "/mnt/out"}]);
    let problems = |token: Option<&str>, task: &Value| -> String {
        let (code, v) = match token {
            Some(tok) => call(&t.s, Some(tok), "POST", "/api/v1/validate", Some(&task.to_string()), &[]),
            None => {
                let (code, text) = t.s.call("POST", "/api/v1/validate", Some(&task.to_string()));
                (code, serde_json::from_str(&text).unwrap())
            }
        };
        assert_eq!(code, 200, "{v}");
        v["problems"].to_string()
    };
    let bob = problems(Some(&t.bob), &task);
    assert!(bob.contains("dataset \\\"dta\\\" does not exist; choose one of: (none)"), "{bob}");
    // `raytmp` is offered to every group; `out` to default only.
    assert!(bob.contains("volume \\\"ot\\\" does not exist; choose one of: raytmp\""), "{bob}");
    let admin = problems(None, &task);
    assert!(admin.contains("choose one of: data") && admin.contains("choose one of: out, raytmp"), "{admin}");
    // A group that does not exist: bob is offered his own.
    let mut lost = job("typo", "nosuch", "true", json!([]));
    lost["metadata"]["projectGroup"] = json!("nosuch");
    let bob = problems(Some(&t.bob), &lost);
    assert!(bob.contains("known groups: other") && !bob.contains("default"), "{bob}");
    // The same task is refused alike for both (the verdict does not depend on who asks).
    let admin = problems(None, &lost);
    assert!(admin.contains("known groups: default, other"), "{admin}");
}

/// Finding 11, through the CLI: an admin lists and revokes a token and disables a user; each takes effect
/// within the token cache's TTL (here: at once, the change being made on this server).
#[test]
fn f11_tokens_are_revoked_and_users_disabled() {
    let t = tenants("attack-accounts", &[]);
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_trainyard"))
            .args(args)
            .env("TRAINYARD_SERVER", &t.s.base)
            .env("TRAINYARD_TOKEN", &t.s.token)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let whoami = |token: &str| call(&t.s, Some(token), "GET", "/api/v1/whoami", None, &[]);
    assert_eq!(whoami(&t.alice).0, 200);
    let listed = cli(&["admin", "token", "alice", "--list"]);
    let id = listed.lines().nth(1).and_then(|l| l.split_whitespace().next()).unwrap().to_owned();
    assert!(!listed.contains(&t.alice), "{listed}");
    cli(&["admin", "token", "alice", "--revoke", &id]);
    let (code, p) = whoami(&t.alice);
    assert_eq!((code, p["type"].as_str()), (401, Some("https://trainyard.dev/problems/unauthorized")), "{p}");

    assert_eq!(whoami(&t.bob).0, 200);
    cli(&["admin", "user", "bob", "--disable"]);
    let (code, p) = whoami(&t.bob);
    assert_eq!(code, 403, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("user bob is disabled"), "{p}");
    let deadline = Instant::now() + trainyard_api::TOKEN_CACHE_TTL + secs(2);
    while Instant::now() < deadline {
        assert_ne!(whoami(&t.bob).0, 200, "bob's token came back");
        std::thread::sleep(Duration::from_millis(500));
    }
    cli(&["admin", "user", "bob", "--enable"]);
    assert_eq!(whoami(&t.bob).0, 200, "enabled again");
    assert_eq!(whoami(&t.mallory).0, 200, "nobody else is touched");

    // Deleted, with the admin's choice for their work: the running task goes on (as the admin chose), the
    // tokens are gone, the name is retired.
    let id = submit(&t.s, &t.mallory, &job("keep", "default", "sleep 600", json!([])));
    t.s.wait_status(&id, "Running", secs(60));
    let said = cli(&["admin", "user", "mallory", "--delete", "--queued", "stop", "--running", "keep"]);
    assert!(said.contains("their queued tasks stopped, their running ones left running"), "{said}");
    assert_eq!(whoami(&t.mallory).0, 401);
    std::thread::sleep(Duration::from_secs(3));
    let (_, task) = t.s.call("GET", &format!("/api/v1/tasks/{id}"), None);
    let task: Value = serde_json::from_str(&task).unwrap();
    assert_eq!((&task["status"], &task["ownerDeleted"]), (&json!("Running"), &json!(true)), "{task}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["admin", "user", "mallory", "--enable"])
        .env("TRAINYARD_SERVER", &t.s.base)
        .env("TRAINYARD_TOKEN", &t.s.token)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a deleted name stays retired");
    // Options that only go with a disable or a delete are refused without one.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["admin", "user", "bob", "--running", "keep"])
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--disable|--delete"));
    t.s.call("POST", &format!("/api/v1/tasks/{id}/stop"), None);
}

/// Finding 12: slow headers are cut off after the header-read timeout, and connections beyond the cap are
/// answered 503 with a problem at once; served connections still work.
#[test]
fn f12_slow_and_surplus_connections_are_cut_off() {
    use std::io::{Read, Write};
    let t = tenants("attack-conns", &["--header-read-timeout-s", "2", "--max-connections", "6"]);
    let addr = t.s.base.trim_start_matches("http://").to_owned();
    let connect = || {
        let c = std::net::TcpStream::connect(&addr).unwrap();
        c.set_read_timeout(Some(secs(10))).unwrap();
        c
    };
    let read_all = |mut c: std::net::TcpStream| {
        let t0 = Instant::now();
        let mut got = Vec::new();
        match c.read_to_end(&mut got) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("the connection was never closed: {e}"),
        }
        (t0.elapsed(), String::from_utf8_lossy(&got).into_owned())
    };
    let mut slow = connect();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ").unwrap();
    let (took, _) = read_all(slow);
    assert!(took < secs(5), "slow headers held the connection {took:?}");
    // Each held connection is served one request and then kept open, idle (keep-alive): once its answer is
    // read the server has accepted it and counts it, and the idle timeout (60 s) is far away, so the cap is
    // reached for sure however slow the machine is, and the header-read timeout does not free a seat.
    let held: Vec<_> = (0..6)
        .map(|i| {
            let mut c = connect();
            c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            while !String::from_utf8_lossy(&got).contains("\r\n\r\n") {
                let n = c.read(&mut buf).unwrap();
                assert!(n > 0, "held connection {i} was closed before its answer");
                got.extend_from_slice(&buf[..n]);
            }
            assert!(
                got.starts_with(b"HTTP/1.1 200"),
                "held connection {i}: {}",
                String::from_utf8_lossy(&got)
            );
            c
        })
        .collect();
    let (_, refused) = read_all(connect());
    assert!(refused.starts_with("HTTP/1.1 503"), "the seventh connection got {refused:?}");
    assert!(refused.contains("too-many-connections"), "{refused}");
    drop(held);
    // The server frees the seats when it sees the closes; a request is served again within moments.
    let deadline = Instant::now() + secs(10);
    loop {
        let code = call(&t.s, Some(&t.alice), "GET", "/api/v1/whoami", None, &[]).0;
        if code == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the freed seats were never reused: {code}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Finding 13: `/metrics` on the API's address needs an admin's token; `--metrics-listen` serves it without
/// one on an address of its own, and only it.
#[test]
fn f13_metrics_need_an_admin_token_or_their_own_address() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let t = tenants("attack-metrics", &["--metrics-listen", &free.to_string()]);
    let (code, p) = call(&t.s, None, "GET", "/metrics", None, &[]);
    assert_eq!((code, p["status"].as_u64()), (401, Some(401)), "{p}");
    assert_eq!(call(&t.s, Some(&t.alice), "GET", "/metrics", None, &[]).0, 403);
    let (code, text) = call(&t.s, Some(&t.s.token), "GET", "/metrics", None, &[]);
    assert!(code == 200 && text.as_str().unwrap().contains("trainyard_queue_depth"), "{text}");
    let mut r = agent().get(&format!("http://{free}/metrics")).call().unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.body_mut().read_to_string().unwrap().contains("trainyard_tasks"));
    assert_eq!(agent().get(&format!("http://{free}/api/v1/tasks")).call().unwrap().status().as_u16(), 404);
}

/// Finding 14: `/validate` for another group's task tells nothing of that group's quota; for one's own it
/// does.
#[test]
fn f14_validate_shows_only_the_callers_groups() {
    let t = tenants("attack-validate", &[]);
    // `other` runs a 2-unit task, so 4 of its 6 units are left; a 6-unit task fits its quota but waits now.
    let mut running = job("run", "other", "sleep 600", json!([]));
    running["spec"]["compute"]["workers"] = json!(1);
    let run = t.s.submit(&running);
    t.s.wait_status(&run, "Running", secs(60));
    let big = |group: &str| {
        let mut task = job("big", group, "true", json!([]));
        task["spec"]["compute"]["workers"] = json!(5);
        task.to_string()
    };
    let deadline = Instant::now() + secs(20);
    let own = loop {
        let (_, v) = call(&t.s, Some(&t.bob), "POST", "/api/v1/validate", Some(&big("other")), &[]);
        let reason = v["admission"]["reason"].as_str().unwrap_or("").to_owned();
        if reason.contains("left") || Instant::now() > deadline {
            break reason;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(own.contains("other") && own.contains('4'), "bob sees his group's figures: {own}");
    let (_, v) = call(&t.s, Some(&t.alice), "POST", "/api/v1/validate", Some(&big("other")), &[]);
    let text = v["admission"].to_string();
    assert!(!text.contains('4') && !text.contains("left"), "alice learns other's usage: {text}");
}

/// Finding 15: an alarm webhook to loopback is refused when subscribed (and never sent); with the network
/// allowed by the admin (`--webhook-allow-net`), a local receiver gets the signed alarm.
#[test]
fn f15_webhooks_to_internal_addresses_need_the_admins_allowance() {
    let receiver = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = receiver.local_addr().unwrap().port();
    let hook = json!([{"events": ["succeeded"], "webhook": format!("http://127.0.0.1:{port}/hook")}]);
    let with_alarm = |prefix: &str| {
        let mut task = job(prefix, "default", "true", json!([]));
        task["spec"]["advanced"] = json!({"alarms": hook});
        task.to_string()
    };
    {
        let t = tenants("attack-ssrf", &[]);
        let (code, p) = call(&t.s, Some(&t.alice), "POST", "/api/v1/tasks", Some(&with_alarm("ssrf")), &[]);
        assert_eq!((code, p["problems"][0]["code"].as_str()), (422, Some("restricted-address")), "{p}");
        let (code, _) =
            call(&t.s, Some(&t.alice), "PUT", "/api/v1/users/alice/alarms", Some(&hook.to_string()), &[]);
        assert_eq!(code, 422);
    }
    let t = tenants("attack-ssrf-allowed", &["--webhook-allow-net", "127.0.0.0/8"]);
    let id = submit(&t.s, &t.alice, &serde_json::from_str(&with_alarm("allowed")).unwrap());
    t.s.wait_status(&id, "Succeeded", secs(90));
    receiver.set_nonblocking(false).unwrap();
    let (mut conn, _) = receiver.accept().unwrap();
    conn.set_read_timeout(Some(secs(20))).unwrap();
    let mut head = [0u8; 2048];
    let n = std::io::Read::read(&mut conn, &mut head).unwrap();
    let text = String::from_utf8_lossy(&head[..n]).to_ascii_lowercase();
    assert!(text.starts_with("post /hook") && text.contains("x-trainyard-signature: sha256="), "{text}");
    let _ = std::io::Write::write_all(&mut conn, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
}

/// Finding 16: a deleted task cannot be resubmitted (it would wait forever, in no list); an ended one can.
#[test]
fn f16_a_deleted_task_cannot_be_resubmitted() {
    let t = tenants("attack-deleted", &[]);
    let id = submit(&t.s, &t.alice, &job("gone", "default", "true", json!([])));
    t.s.wait_status(&id, "Succeeded", secs(90));
    assert_eq!(call(&t.s, Some(&t.alice), "POST", &format!("/api/v1/tasks/{id}/resubmit"), None, &[]).0, 200);
    t.s.wait_status(&id, "Succeeded", secs(90));
    assert_eq!(call(&t.s, Some(&t.alice), "DELETE", &format!("/api/v1/tasks/{id}"), None, &[]).0, 204);
    let (code, p) = call(&t.s, Some(&t.alice), "POST", &format!("/api/v1/tasks/{id}/resubmit"), None, &[]);
    assert_eq!(code, 409, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("deleted"), "{p}");
    assert_eq!(t.s.task(&id)["status"], "Succeeded", "nothing was queued");
}

/// Finding 18, the control plane's part: every 4xx is a problem document; unknown things are named; an empty
/// Idempotency-Key and a 500 KB user name are refused.
#[test]
fn f18_every_refusal_is_a_problem_that_says_what() {
    let t = tenants("attack-problems", &[]);
    let is_problem = |(code, v): (u16, Value), want: u16| {
        assert_eq!(code, want, "{v}");
        assert!(v["type"].as_str().is_some_and(|t| t.starts_with("https://trainyard.dev/problems/")), "{v}");
        assert_eq!(v["status"].as_u64(), Some(u64::from(want)), "{v}");
        v
    };
    let a = Some(t.alice.as_str());
    is_problem(call(&t.s, a, "GET", "/api/v1/nothing-here", None, &[]), 404);
    is_problem(call(&t.s, a, "PUT", "/api/v1/whoami", None, &[]), 405);
    is_problem(call(&t.s, a, "GET", "/api/v1/tasks?limit=-1", None, &[]), 400);
    is_problem(raw(&t.s, &t.alice, "POST /api/v1/tasks HTTP/1.1", &vec![b'x'; 2 << 20]), 413);
    is_problem(call(&t.s, a, "GET", &format!("/api/v1/tasks?q={}", "x".repeat(20_000)), None, &[]), 414);
    let v = is_problem(
        call(&t.s, Some(&t.s.token), "PUT", "/api/v1/admin/nodes/ghost", Some(r#"{"failed": true}"#), &[]),
        404,
    );
    assert!(v["detail"].as_str().unwrap().contains("no such node"), "{v}");
    let v = is_problem(call(&t.s, Some(&t.s.token), "GET", "/api/v1/users/ghost/env", None, &[]), 404);
    assert!(v["detail"].as_str().unwrap().contains("no such user"), "{v}");
    let v = is_problem(call(&t.s, a, "DELETE", "/api/v1/users/alice/env/GHOST", None, &[]), 404);
    assert!(v["detail"].as_str().unwrap().contains("no TaskEnv variable"), "{v}");
    let task = job("idem", "default", "true", json!([])).to_string();
    is_problem(call(&t.s, a, "POST", "/api/v1/tasks", Some(&task), &[("Idempotency-Key", "")]), 400);
    assert_eq!(call(&t.s, a, "POST", "/api/v1/tasks", Some(&task), &[("Idempotency-Key", "k1")]).0, 201);
    let huge = json!({"name": "u".repeat(500_000), "role": "member", "groups": ["default"]}).to_string();
    is_problem(call(&t.s, Some(&t.s.token), "POST", "/api/v1/admin/users", Some(&huge), &[]), 400);
}

/// Issue 29, finding 6 ("a disabled user's work goes on"): bob's task waits for `other`'s quota, which an
/// admin's task holds; the admin disables bob (no body: queued work held, running work stopped) and then
/// frees the quota. Bob's task stays queued, saying why, for many ticks (before the fix it was admitted
/// within a tick of the quota freeing); enabled again, bob's task runs.
#[test]
fn i29_f06_a_disabled_users_queued_task_is_not_admitted_until_enabled() {
    let t = tenants("attack-disabled-queue", &[]);
    let one_unit = catalog().replace("spec: cpu.small, units: 6", "spec: cpu.small, units: 1");
    let (code, body) = t.s.call("PUT", "/api/v1/admin/catalog", Some(&one_unit));
    assert_eq!(code, 200, "{body}");
    let blocker = t.s.submit(&job("blocker", "other", "sleep 600", json!([])));
    t.s.wait_status(&blocker, "Running", secs(60));
    let bobs = submit(&t.s, &t.bob, &job("bobs", "other", "echo ran", json!([])));
    let reason = |id: &str| t.s.task(id)["queue"]["reason"].as_str().unwrap_or("").to_owned();
    let t0 = Instant::now();
    while !reason(&bobs).contains("left") {
        assert!(t0.elapsed() < secs(30), "bob's task never waited for the quota: {}", t.s.task(&bobs));
        std::thread::sleep(Duration::from_millis(100));
    }

    let (code, body) = t.s.call("POST", "/api/v1/admin/users/bob/disable", None);
    assert_eq!(code, 204, "{body}");
    let (code, body) = t.s.call("POST", &format!("/api/v1/tasks/{blocker}/stop"), None);
    assert_eq!(code, 200, "{body}");
    t.s.wait_status(&blocker, "Stopped", secs(60));
    // The quota is free now: a task of an enabled user would be admitted within a tick (a second at most).
    let t0 = Instant::now();
    while t0.elapsed() < secs(6) {
        let task = t.s.task(&bobs);
        assert_eq!(
            task["status"],
            "Queued",
            "admitted while its owner is disabled:\n{}",
            t.s.events_text(&bobs)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let why = reason(&bobs);
    assert!(why.contains("owner's account is disabled"), "{why}");
    assert_eq!(t.s.task(&bobs)["queue"]["position"], 0, "a held task is in no place in line");
    let (code, seen) = call(&t.s, Some(&t.bob), "GET", &format!("/api/v1/tasks/{bobs}"), None, &[]);
    assert_eq!(code, 403, "bob himself is refused: {seen}");

    let (code, body) = t.s.call("POST", "/api/v1/admin/users/bob/enable", None);
    assert_eq!(code, 204, "{body}");
    assert!(output(&t.s, &bobs).contains("ran"), "released by the enable");
}

/// Issue 29, finding 6: an admin disables mallory choosing to stop her running work; her running task is
/// stopped through the usual stop, so its exit checkpoint is saved, and the events say why.
#[test]
fn i29_f06_stopping_a_disabled_users_work_keeps_its_checkpoint() {
    let t = tenants("attack-disabled-stop", &[]);
    let cmd = r#"python3 - <<'EOF'
import os, signal, time
rt = os.environ["TRAINYARD_RUNTIME_DIR"]
def save(sig, frame):
    open("/mnt/out/disabled-checkpoint.pt", "w").write("step 7")
    open(rt + "/checkpoint-done", "w").close()
    print("checkpoint saved", flush=True)
signal.signal(signal.SIGUSR1, save)
print("training", flush=True)
while True:
    time.sleep(0.1)
EOF"#;
    let mut task = job("ckpt", "default", cmd, json!([]));
    task["spec"]["environment"]["volumes"] = json!([{"volume": "out", "mountPath": "/mnt/out"}]);
    task["spec"]["advanced"] = json!({"exitCheckpoint": {"enabled": true, "timeoutSeconds": 30}});
    let id = submit(&t.s, &t.mallory, &task);
    let running = t.s.wait_status(&id, "Running", secs(60));
    let master = format!("{}-master-0", running["name"].as_str().unwrap());
    t.s.wait_log(&id, &master, "training", secs(30));

    let body = json!({"queued": "hold", "running": "stop"}).to_string();
    let (code, answer) = t.s.call("POST", "/api/v1/admin/users/mallory/disable", Some(&body));
    assert_eq!(code, 204, "{answer}");
    t.s.wait_status(&id, "Stopped", secs(60));
    let events = t.s.events(&id);
    for step in ["StopRequested", "CheckpointRequested", "CheckpointDone", "Terminated"] {
        assert!(events.iter().any(|(r, _)| r == step), "no {step} in:\n{}", t.s.events_text(&id));
    }
    let (_, why) = events.iter().find(|(r, _)| r == "StopRequested").unwrap();
    assert!(why.contains("owner's account was disabled"), "{why}");
    let saved =
        std::fs::read_to_string(t.s.dir.join("volumes/out/disabled-checkpoint.pt")).unwrap_or_default();
    assert_eq!(saved, "step 7", "events:\n{}", t.s.events_text(&id));
    assert_eq!(call(&t.s, Some(&t.alice), "GET", "/api/v1/whoami", None, &[]).0, 200, "nobody else touched");
}

/// Issue 29, finding 6: a deleted user's token answers 401 at once; their running task is stopped and kept
/// for the record: an admin, and a member it was shared with, still read it, the owner shown as deleted.
/// The name is not given out again.
#[test]
fn i29_f06_a_deleted_users_tokens_die_and_their_tasks_stay() {
    let t = tenants("attack-deleted-user", &[]);
    let id = submit(&t.s, &t.alice, &job("kept", "default", "sleep 600", json!([])));
    t.s.wait_status(&id, "Running", secs(60));
    let share = json!({"user": "mallory", "operate": false}).to_string();
    let (code, v) =
        call(&t.s, Some(&t.alice), "POST", &format!("/api/v1/tasks/{id}/shares"), Some(&share), &[]);
    assert_eq!(code, 204, "{v}");

    let (code, body) = t.s.call("POST", "/api/v1/admin/users/alice/delete", None);
    assert_eq!(code, 204, "{body}");
    let (code, p) = call(&t.s, Some(&t.alice), "GET", "/api/v1/whoami", None, &[]);
    assert_eq!((code, p["type"].as_str()), (401, Some("https://trainyard.dev/problems/unauthorized")), "{p}");
    let (code, _) = call(&t.s, Some(&t.alice), "GET", &format!("/api/v1/tasks/{id}"), None, &[]);
    assert_eq!(code, 401);
    let stopped = t.s.wait_status(&id, "Stopped", secs(60));
    assert_eq!((&stopped["owner"], &stopped["ownerDeleted"]), (&json!("alice"), &json!(true)), "{stopped}");
    let (code, listed) = t.s.call("GET", "/api/v1/tasks?owner=alice", None);
    assert_eq!(code, 200);
    assert!(listed.contains(&id), "still listed for admins: {listed}");
    let (code, seen) = call(&t.s, Some(&t.mallory), "GET", &format!("/api/v1/tasks/{id}"), None, &[]);
    assert_eq!((code, &seen["ownerDeleted"]), (200, &json!(true)), "the share still reads it: {seen}");

    // The name is retired: not made again (a new alice would own the old tasks), not enabled.
    let again = json!({"name": "alice", "role": "member", "groups": ["default"]}).to_string();
    assert_eq!(t.s.call("POST", "/api/v1/admin/users", Some(&again)).0, 409);
    assert_eq!(t.s.call("POST", "/api/v1/admin/users/alice/enable", None).0, 409);
    assert_eq!(t.s.call("POST", "/api/v1/users/alice/tokens", Some("{}")).0, 404);
    assert_eq!(call(&t.s, Some(&t.alice), "GET", "/api/v1/whoami", None, &[]).0, 401, "still");
}

/// Issue 34: a queued task says what holds the room it waits for, as far as its owner may see: the group's
/// quota is held by two tasks of the admin's, a private one (bob sees that one more task holds it, not its
/// name) and a public one (named, with its units and that it spends the same quota). The admin sees both.
#[test]
fn a_queued_task_names_what_holds_its_room_as_far_as_its_owner_may_see() {
    let t = tenants("attack-holders", &[]);
    let two_units = catalog().replace("spec: cpu.small, units: 6", "spec: cpu.small, units: 2");
    let (code, body) = t.s.call("PUT", "/api/v1/admin/catalog", Some(&two_units));
    assert_eq!(code, 200, "{body}");
    let private = t.s.submit(&job("private-holder", "other", "sleep 600", json!([])));
    let mut public = job("public-holder", "other", "sleep 600", json!([]));
    public["metadata"]["public"] = json!(true);
    let public = t.s.submit(&public);
    t.s.wait_status(&private, "Running", secs(60));
    t.s.wait_status(&public, "Running", secs(60));
    let bobs = submit(&t.s, &t.bob, &job("bobs-wait", "other", "echo ran", json!([])));
    let t0 = Instant::now();
    let seen = loop {
        let (code, v) = call(&t.s, Some(&t.bob), "GET", &format!("/api/v1/tasks/{bobs}"), None, &[]);
        assert_eq!(code, 200, "{v}");
        if v["queue"]["holders"].as_array().is_some_and(|h| !h.is_empty()) {
            break v;
        }
        assert!(t0.elapsed() < secs(30), "no holders named: {v}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let holders = seen["queue"]["holders"].as_array().unwrap();
    let names: Vec<&str> = holders.iter().map(|h| h["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 1, "bob sees the public one only: {seen}");
    assert!(names[0].starts_with("public-holder"), "{names:?}");
    assert_eq!(holders[0]["spendsItsQuota"], true);
    assert_eq!(holders[0]["units"], 1);
    assert_eq!(holders[0]["spec"], "cpu.small");
    assert_eq!(seen["queue"]["moreHolders"], 1, "the private one is counted, not named: {seen}");
    assert!(!seen.to_string().contains("private-holder"), "{seen}");
    // The list stays as it was (holders are one task's view).
    let (_, list) = call(&t.s, Some(&t.bob), "GET", "/api/v1/tasks?group=other", None, &[]);
    assert!(!list.to_string().contains("holders"), "{list}");
    // The admin sees both, by name, and the CLI says so.
    let admin = t.s.task(&bobs);
    let names: Vec<&str> =
        admin["queue"]["holders"].as_array().unwrap().iter().map(|h| h["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 2, "{admin}");
    assert_eq!(admin["queue"]["moreHolders"], 0);
    let described = t.s.cli(&["describe", &bobs]);
    assert!(
        described.matches("Held by:").count() == 2 && described.contains("1 units of cpu.small, running"),
        "{described}"
    );
    for id in [&private, &public, &bobs] {
        t.s.call("POST", &format!("/api/v1/tasks/{id}/stop"), None);
    }
}

/// Issue 34: a task cloned into another group takes its working directory along (the new group gets its
/// own hold of the files, counted against its limit), and runs there with it; a member who may not use the
/// other group cannot clone into it, and nothing of the working directory reaches that group.
#[test]
fn a_clone_into_another_group_takes_its_working_directory_along() {
    let t = tenants("attack-clone-workdir", &[]);
    let file = std::env::temp_dir().join(format!("ty-clone-wd-{}.json", std::process::id()));
    let task =
        job("wd-src", "default", "python3 -c 'import toy; print(\"toy from\", toy.__file__)'", json!([]));
    std::fs::write(&file, task.to_string()).unwrap();
    let printed = t.s.cli(&[
        "submit",
        "-f",
        file.to_str().unwrap(),
        "--workdir",
        "examples/local/workdir",
        "-o",
        "json",
    ]);
    let src: Value =
        serde_json::Deserializer::from_str(&printed).into_iter::<Value>().next().unwrap().unwrap();
    let src = src["id"].as_str().unwrap().to_owned();
    assert!(output(&t.s, &src).contains("toy from /workspace/toy/__init__.py"));
    let in_other = || {
        let (_, v) = call(&t.s, Some(&t.s.token), "GET", "/api/v1/workdirs?projectGroup=other", None, &[]);
        v["items"].as_array().unwrap().len()
    };
    // Alice may operate her own clone source only; share it with her to try: she is not in `other`.
    let (code, v) = call(
        &t.s,
        Some(&t.s.token),
        "POST",
        &format!("/api/v1/tasks/{src}/shares"),
        Some(r#"{"user": "alice", "operate": true}"#),
        &[],
    );
    assert!(code < 300, "{v}");
    let (code, v) = call(
        &t.s,
        Some(&t.alice),
        "POST",
        &format!("/api/v1/tasks/{src}/clone"),
        Some(r#"{"projectGroup": "other"}"#),
        &[],
    );
    assert_eq!(code, 403, "{v}");
    assert_eq!(in_other(), 0, "nothing reached the group she may not use");
    // The admin clones it into `other`: it runs there with the same working directory.
    let (code, v) = call(
        &t.s,
        Some(&t.s.token),
        "POST",
        &format!("/api/v1/tasks/{src}/clone"),
        Some(r#"{"projectGroup": "other"}"#),
        &[],
    );
    assert_eq!(code, 201, "{v}");
    let clone = v["id"].as_str().unwrap().to_owned();
    assert!(output(&t.s, &clone).contains("toy from /workspace/toy/__init__.py"));
    assert_eq!(in_other(), 1);
    let _ = std::fs::remove_file(file);
}
