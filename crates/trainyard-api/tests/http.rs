//! The API end to end through real HTTP on loopback: a server on an ephemeral port with SQLite and the fake
//! backend, driven by a plain HTTP client.

// Tests set up the store directly (users, tokens, tasks in given states) before asking the API.
#![allow(clippy::disallowed_methods)]

use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use trainyard_api::backends::AnyBackend;
use trainyard_api::{AppState, new_token, token_hash};
use trainyard_control::secrets::SecretBox;
use trainyard_core::Catalog;
use trainyard_runtime::fake::{FakeBackend, Script};
use trainyard_sched::Config;
use trainyard_store::{Store, User};

const CATALOG: &str = r#"
regions: {local: {}}
clusters: {local: {region: local}}
pools: {default: {cluster: local, instanceSpecs: [cpu.small]}}
instanceSpecs: {cpu.small: {kind: CPU, vcpus: 1, memoryMib: 1024}}
nodes: {node-0: {pool: default, vcpus: 16, memoryMib: 65536}}
projectGroups: {nlp: {}, cv: {}}
images: {host: {torch: true, ray: true, projectGroups: [nlp, cv]}, cv-only: {projectGroups: [cv]}}
volumes: {ckpt: {projectGroups: [nlp]}, shared: {}}
datasets: {alpaca: {projectGroups: [cv]}}
models: {llama: {projectGroups: [nlp, cv]}}
quotas:
  - {group: nlp, resourceType: Reserved, pool: default, spec: cpu.small, units: 8}
  - {group: cv, resourceType: Reserved, pool: default, spec: cpu.small, units: 8}
"#;

struct Server {
    base: String,
    /// The server's backend: what it was asked to launch, with hidden values opened.
    fake: FakeBackend,
    tokens: std::collections::BTreeMap<&'static str, String>,
    db: std::path::PathBuf,
    _rt: tokio::runtime::Runtime,
}

fn server() -> Server {
    server_allowing(&[])
}

/// A server whose alarm webhooks may also go to these networks (as `up --webhook-allow-net`).
fn server_allowing(webhook_nets: &[&str]) -> Server {
    server_with(webhook_nets, trainyard_api::HttpLimits::default(), false, 300).0
}

/// A server with these webhook networks allowed, these connection limits, and when `metrics_address` a
/// separate metrics address (returned); its fake tasks run `run_ms` once started.
fn server_with(
    webhook_nets: &[&str],
    limits: trainyard_api::HttpLimits,
    metrics_address: bool,
    run_ms: u64,
) -> (Server, Option<String>) {
    let dir = std::env::temp_dir().join(format!(
        "trainyard-api-{}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
    ));
    server_at(&dir, webhook_nets, limits, metrics_address, run_ms)
}

/// [`server_with`], its database in `dir`.
fn server_at(
    dir: &std::path::Path,
    webhook_nets: &[&str],
    limits: trainyard_api::HttpLimits,
    metrics_address: bool,
    run_ms: u64,
) -> (Server, Option<String>) {
    let webhook_nets: Vec<trainyard_control::alarms::Net> =
        webhook_nets.iter().map(|n| trainyard_control::alarms::Net::parse(n).unwrap()).collect();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let db = dir.join("t.db");
    let url = format!("sqlite://{}", db.display());
    let fake = FakeBackend::new(Script { start_ms: 100, run_ms, ..Script::default() });
    let base = rt.block_on(async {
        let store = Store::connect(&url).await.unwrap();
        let mut tokens = std::collections::BTreeMap::new();
        for (name, role, groups) in [
            ("alice", "member", vec!["nlp"]),
            ("bob", "member", vec!["nlp"]),
            ("carol", "member", vec!["cv"]),
            ("dave", "member", vec!["cv"]),
            ("root", "admin", vec![]),
        ] {
            let user = User {
                name: name.into(),
                role: role.into(),
                groups: groups.iter().map(|g| g.to_string()).collect(),
            };
            store.put_user(&user, 0).await.unwrap();
            let token = new_token().unwrap();
            store.add_token(&token_hash(&token), name, "test", 0).await.unwrap();
            tokens.insert(name, token);
        }
        let catalog = Catalog::from_yaml(CATALOG).unwrap();
        let backend = AnyBackend::Fake(fake.clone());
        let secrets = SecretBox::generate().unwrap();
        let mut state = AppState::new(store, catalog, backend, secrets, Config::default());
        state.webhooks = state.webhooks.clone().allowing(webhook_nets);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let metrics_listener = match metrics_address {
            true => Some(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap()),
            false => None,
        };
        let metrics = metrics_listener.as_ref().map(|l| format!("http://{}", l.local_addr().unwrap()));
        let options = trainyard_api::ServeOptions { limits, metrics_listener, ..Default::default() };
        tokio::spawn(trainyard_api::serve_with(listener, state, options));
        (base, tokens, metrics)
    });
    let (base, tokens, metrics) = (base.0, base.1, base.2);
    (Server { base, fake, tokens, db, _rt: rt }, metrics)
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

impl Server {
    fn call(
        &self,
        method: &str,
        who: &str,
        path: &str,
        body: Option<&str>,
        key: Option<&str>,
    ) -> (u16, Value) {
        self.call_as(method, self.tokens.get(who).map_or("nope", |t| t.as_str()), path, body, key)
    }

    fn call_as(
        &self,
        method: &str,
        token: &str,
        path: &str,
        body: Option<&str>,
        key: Option<&str>,
    ) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let auth = format!("Bearer {token}");
        let a = agent();
        let mut resp = match method {
            "GET" => a.get(&url).header("Authorization", &auth).call(),
            "DELETE" => a.delete(&url).header("Authorization", &auth).call(),
            "PUT" => a.put(&url).header("Authorization", &auth).send(body.unwrap_or("").as_bytes()),
            _ => {
                let mut req = a.post(&url).header("Authorization", &auth);
                if let Some(k) = key {
                    req = req.header("Idempotency-Key", k);
                }
                req.send(body.unwrap_or("").as_bytes())
            }
        }
        .unwrap();
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    fn wait_status(&self, id: &str, want: &str) -> Value {
        self.wait_status_as("alice", id, want)
    }

    fn wait_status_as(&self, who: &str, id: &str, want: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (_, t) = self.call("GET", who, &format!("/api/v1/tasks/{id}"), None, None);
            if t["status"] == want {
                return t;
            }
            assert!(Instant::now() < deadline, "task {id} never reached {want}: {t}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn task(prefix: &str, group: &str, public: bool, extra_env: &str) -> String {
    format!(
        r#"apiVersion: trainyard.dev/v1
kind: TrainingTask
metadata: {{namePrefix: {prefix}, projectGroup: {group}, public: {public}}}
spec:
  type: PyTorchJob
  placement: {{region: local, cluster: local}}
  environment:
    image: host
    cmd: python3 train.py
    env: [{{name: LR, value: "3e-4"}}{extra_env}]
  compute: {{resourceType: Reserved, pool: default, workers: 1, instanceSpecs: [{{spec: cpu.small}}]}}
"#
    )
}

#[test]
fn create_runs_to_success_with_events_in_order() {
    let s = server();
    let (code, t) = s.call("POST", "alice", "/api/v1/tasks", Some(&task("e2e", "nlp", false, "")), None);
    assert_eq!(code, 201, "{t}");
    assert_eq!(t["status"], "Queued");
    let id = t["id"].as_str().unwrap().to_owned();
    let done = s.wait_status(&id, "Succeeded");
    assert_eq!(done["placement"]["replicas"][0]["role"], "master");
    let (_, ev) = s.call("GET", "alice", &format!("/api/v1/tasks/{id}/events"), None, None);
    let reasons: Vec<&str> =
        ev["items"].as_array().unwrap().iter().map(|e| e["reason"].as_str().unwrap()).collect();
    assert_eq!(reasons, ["Submitted", "Admitted", "Admitted", "Started", "Completed"]);
    let (code, list) = s.call("GET", "alice", "/api/v1/tasks?status=Succeeded", None, None);
    assert_eq!(code, 200);
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    // A status in any case is that status (as the CLI reads it); one that is none is a mistake said as such.
    for any_case in ["succeeded", "SUCCEEDED", "sUcCeEdEd"] {
        let (code, list) = s.call("GET", "alice", &format!("/api/v1/tasks?status={any_case}"), None, None);
        assert_eq!((code, list["items"].as_array().map(Vec::len)), (200, Some(1)), "{any_case}: {list}");
    }
    let (code, p) = s.call("GET", "alice", "/api/v1/tasks?status=done", None, None);
    assert_eq!(code, 400, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("is not one of Queued, Admitted"), "{p}");
    // So is a parameter the list does not take (it used to be ignored: every task listed).
    let (code, p) = s.call("GET", "alice", "/api/v1/tasks?stauts=Running", None, None);
    assert_eq!(code, 400, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("unknown field `stauts`"), "{p}");
}

#[test]
fn a_bad_task_gets_422_with_every_problem_and_no_token_gets_401() {
    let s = server();
    let bad = task("Bad_Prefix", "nlp", false, r#", {name: "1X", value: ""}"#);
    let (code, p) = s.call("POST", "alice", "/api/v1/tasks", Some(&bad), None);
    assert_eq!(code, 422, "{p}");
    assert_eq!(p["type"], "https://trainyard.dev/problems/invalid-task");
    let paths: Vec<&str> =
        p["problems"].as_array().unwrap().iter().map(|x| x["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        ["metadata.namePrefix", "spec.environment.env[1].name", "spec.environment.env[1].value"]
    );
    let (code, p) = s.call("GET", "nobody", "/api/v1/tasks", None, None);
    assert_eq!((code, p["status"].as_u64()), (401, Some(401)));
    // Not a member of the task's group.
    let (code, p) = s.call("POST", "carol", "/api/v1/tasks", Some(&task("x", "nlp", false, "")), None);
    assert_eq!(code, 403, "{p}");
}

#[test]
fn concurrent_retries_with_one_idempotency_key_create_one_task() {
    let s = Arc::new(server());
    let body = task("idem", "nlp", false, "");
    let handles: Vec<_> = (0..16)
        .map(|_| {
            let (s, body) = (s.clone(), body.clone());
            std::thread::spawn(move || {
                s.call("POST", "alice", "/api/v1/tasks", Some(&body), Some("same-key"))
            })
        })
        .collect();
    let results: Vec<(u16, Value)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let ids: std::collections::BTreeSet<&str> =
        results.iter().map(|(_, t)| t["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 1, "{results:?}");
    assert_eq!(results.iter().filter(|(c, _)| *c == 201).count(), 1);
    assert!(results.iter().all(|(c, _)| *c == 201 || *c == 200));
    let (code, _) =
        s.call("POST", "alice", "/api/v1/tasks", Some(&task("idem", "nlp", true, "")), Some("same-key"));
    assert_eq!(code, 409, "same key, different body");
}

#[test]
fn visibility_matrix_with_404_for_what_a_user_may_not_see() {
    let s = server();
    let (_, private) =
        s.call("POST", "alice", "/api/v1/tasks", Some(&task("private", "nlp", false, "")), None);
    let (_, public) = s.call("POST", "alice", "/api/v1/tasks", Some(&task("public", "nlp", true, "")), None);
    let (p, q) = (private["id"].as_str().unwrap().to_owned(), public["id"].as_str().unwrap().to_owned());
    let sees = |who: &str, id: &str| s.call("GET", who, &format!("/api/v1/tasks/{id}"), None, None).0;
    // owner, group member, other group, admin
    assert_eq!((sees("alice", &p), sees("alice", &q)), (200, 200));
    assert_eq!((sees("bob", &p), sees("bob", &q)), (404, 200));
    assert_eq!((sees("carol", &p), sees("carol", &q)), (404, 404));
    assert_eq!((sees("root", &p), sees("root", &q)), (200, 200));
    assert_eq!(sees("alice", "does-not-exist"), 404);
    // A member may see a public task but not stop it.
    let (code, _) = s.call("POST", "bob", &format!("/api/v1/tasks/{q}/stop"), None, None);
    assert_eq!(code, 403);
    let (code, _) = s.call("POST", "carol", &format!("/api/v1/tasks/{p}/stop"), None, None);
    assert_eq!(code, 404, "cannot even learn that it exists");
    let (_, list) = s.call("GET", "bob", "/api/v1/tasks", None, None);
    let names: Vec<&str> =
        list["items"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(names, [q.as_str()]);
}

/// A create answers with the spec the task was stored with, as a read of it shows it afterwards (without
/// hidden values the answer is the stored text itself; with them, the spec masked).
#[test]
fn a_create_answers_with_the_spec_a_read_shows() {
    let s = server();
    for extra in ["", r#", {name: API_KEY, value: "sk-1", hidden: true}"#] {
        let body = task("same", "nlp", true, extra);
        let (code, created) = s.call("POST", "alice", "/api/v1/tasks", Some(&body), None);
        assert_eq!(code, 201, "{created}");
        let id = created["id"].as_str().unwrap();
        let (code, read) = s.call("GET", "alice", &format!("/api/v1/tasks/{id}"), None, None);
        assert_eq!(code, 200, "{read}");
        assert!(created["spec"].is_object(), "{created}");
        assert_eq!(created["spec"], read["spec"], "with {extra:?}");
    }
}

#[test]
fn hidden_values_never_come_back() {
    let s = server();
    let secret = "sk-very-secret-value-123";
    let body =
        task("secret", "nlp", true, &format!(r#", {{name: API_KEY, value: "{secret}", hidden: true}}"#));
    let (code, t) = s.call("POST", "alice", "/api/v1/tasks", Some(&body), None);
    assert_eq!(code, 201, "{t}");
    let created = t.to_string();
    assert!(!created.contains(secret) && created.contains("******"), "the create answer masks it: {created}");
    let id = t["id"].as_str().unwrap().to_owned();
    s.wait_status(&id, "Succeeded");
    for (who, path) in [
        ("alice", format!("/api/v1/tasks/{id}")),
        ("bob", format!("/api/v1/tasks/{id}")),
        ("alice", "/api/v1/tasks".to_owned()),
        ("alice", format!("/api/v1/tasks/{id}/events")),
    ] {
        let (_, v) = s.call("GET", who, &path, None, None);
        let text = v.to_string();
        assert!(!text.contains(secret), "{path} leaks the hidden value");
        if path.ends_with(&id) {
            assert!(text.contains("******"), "{text}");
        }
    }
    // At rest: neither the database nor its write-ahead log holds the value in clear.
    for file in [s.db.clone(), s.db.with_extension("db-wal")] {
        if let Ok(bytes) = std::fs::read(&file) {
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "{} holds the secret",
                file.display()
            );
        }
    }
    assert!(std::fs::metadata(&s.db).unwrap().len() > 0);
}

#[test]
fn stop_resubmit_and_delete() {
    let s = server();
    let (_, t) = s.call("POST", "alice", "/api/v1/tasks", Some(&task("ops", "nlp", false, "")), None);
    let id = t["id"].as_str().unwrap().to_owned();
    s.wait_status(&id, "Succeeded");
    let (code, t) = s.call("POST", "alice", &format!("/api/v1/tasks/{id}/resubmit"), None, None);
    assert_eq!((code, t["attempt"].as_i64()), (200, Some(1)), "{t}");
    s.wait_status(&id, "Succeeded");
    let (code, p) = s.call("POST", "alice", &format!("/api/v1/tasks/{id}/stop"), None, None);
    assert_eq!(code, 409, "nothing to stop: {p}");
    let (code, _) = s.call("DELETE", "alice", &format!("/api/v1/tasks/{id}"), None, None);
    assert_eq!(code, 204);
    let (_, list) = s.call("GET", "alice", "/api/v1/tasks", None, None);
    assert!(list["items"].as_array().unwrap().is_empty());
}

#[test]
fn sharing_cloning_and_metrics() {
    let s = server();
    let (_, t) = s.call("POST", "alice", "/api/v1/tasks", Some(&task("shared", "nlp", false, "")), None);
    let id = t["id"].as_str().unwrap().to_owned();
    // carol (another group) cannot see it, until alice shares it; then she can see but not stop it.
    assert_eq!(s.call("GET", "carol", &format!("/api/v1/tasks/{id}"), None, None).0, 404);
    let (code, _) =
        s.call("POST", "bob", &format!("/api/v1/tasks/{id}/shares"), Some(r#"{"user": "carol"}"#), None);
    assert_eq!(code, 404, "bob cannot see it, so cannot share it");
    let (code, _) =
        s.call("POST", "alice", &format!("/api/v1/tasks/{id}/shares"), Some(r#"{"user": "carol"}"#), None);
    assert_eq!(code, 204);
    assert_eq!(s.call("GET", "carol", &format!("/api/v1/tasks/{id}"), None, None).0, 200);
    assert_eq!(s.call("POST", "carol", &format!("/api/v1/tasks/{id}/clone"), None, None).0, 403);
    s.call(
        "POST",
        "alice",
        &format!("/api/v1/tasks/{id}/shares"),
        Some(r#"{"user": "carol", "operate": true}"#),
        None,
    );
    let into_cv = Some(r#"{"projectGroup": "cv"}"#);
    let (code, clone) = s.call("POST", "carol", &format!("/api/v1/tasks/{id}/clone"), into_cv, None);
    assert_eq!(code, 201, "{clone}");
    assert_ne!(clone["id"], t["id"]);
    assert_eq!(clone["owner"], "carol");
    assert!(clone["name"].as_str().unwrap().starts_with("shared-"));
    let (code, _) =
        s.call("POST", "alice", &format!("/api/v1/tasks/{id}/shares"), Some(r#"{"user": "nobody"}"#), None);
    assert_eq!(code, 400);

    // Whom it is shared with: the owner and admins may ask; carol (who has it shared) may not.
    let shares = format!("/api/v1/tasks/{id}/shares");
    let (code, list) = s.call("GET", "alice", &shares, None, None);
    assert_eq!((code, &list["items"]), (200, &json!([{"user": "carol", "operate": true}])), "{list}");
    assert_eq!(s.call("GET", "root", &shares, None, None).0, 200);
    assert_eq!(s.call("GET", "carol", &shares, None, None).0, 403);
    // Taken back: carol sees it no more; a second take-back is a 404 that says so.
    assert_eq!(s.call("DELETE", "alice", &format!("{shares}/carol"), None, None).0, 204);
    assert_eq!(s.call("GET", "carol", &format!("/api/v1/tasks/{id}"), None, None).0, 404);
    let (code, p) = s.call("DELETE", "alice", &format!("{shares}/carol"), None, None);
    assert_eq!(code, 404, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("not shared with \"carol\""), "{p}");
    // A user may give back a share given to them, but not take back another's.
    s.call("POST", "alice", &shares, Some(r#"{"user": "carol"}"#), None);
    s.call("POST", "alice", &shares, Some(r#"{"user": "bob"}"#), None);
    assert_eq!(s.call("DELETE", "carol", &format!("{shares}/bob"), None, None).0, 403);
    assert_eq!(s.call("DELETE", "carol", &format!("{shares}/carol"), None, None).0, 204);
    let (_, list) = s.call("GET", "alice", &shares, None, None);
    assert_eq!(list["items"], json!([{"user": "bob", "operate": false}]), "{list}");

    // /metrics on the API's address takes an admin's token (finding 13): none is a 401, a member's a 403.
    let url = format!("{}/metrics", s.base);
    let (code, p) = s.call("GET", "nobody", "/metrics", None, None);
    assert_eq!((code, p["status"].as_u64()), (401, Some(401)), "{p}");
    let (code, p) = s.call("GET", "alice", "/metrics", None, None);
    assert_eq!(code, 403, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("--metrics-listen"), "{p}");
    let auth = format!("Bearer {}", s.tokens["root"]);
    let text =
        agent().get(&url).header("Authorization", &auth).call().unwrap().body_mut().read_to_string().unwrap();
    assert!(
        text.contains("trainyard_tasks{status=\"Queued\"}")
            || text.contains("trainyard_tasks{status=\"Running\"}")
            || text.contains("trainyard_tasks{status="),
        "{text}"
    );
    assert!(text.contains("route=\"/api/v1/tasks/{id}/clone\",status=\"201\"} 1"), "{text}");
    assert!(text.contains("trainyard_api_request_duration_seconds_count"), "{text}");

    // A clone under a name prefix of its own; a bad prefix is a 422 at its path, and nothing is made.
    let clone_url = format!("/api/v1/tasks/{id}/clone");
    let (code, c) = s.call("POST", "alice", &clone_url, Some(r#"{"namePrefix": "again"}"#), None);
    assert_eq!(code, 201, "{c}");
    assert!(c["name"].as_str().unwrap().starts_with("again-"), "{c}");
    let (code, p) = s.call("POST", "alice", &clone_url, Some(r#"{"namePrefix": "Not Valid"}"#), None);
    assert_eq!(code, 422, "{p}");
    assert!(p["problems"].as_array().unwrap().iter().any(|x| x["path"] == "metadata.namePrefix"), "{p}");
}

/// Every operation the OpenAPI document lists is served, and the document holds the task's schema.
#[test]
fn the_openapi_document_matches_the_router() {
    let s = server();
    let (code, doc) = s.call("GET", "alice", "/api/openapi.json", None, None);
    assert_eq!(code, 200);
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(
        doc["components"]["schemas"]["TrainingTask"]["required"],
        serde_json::json!(["apiVersion", "kind", "metadata", "spec"])
    );
    let a = agent();
    for op in trainyard_api::openapi::OPERATIONS {
        let path = op
            .path
            .replace("{id}", "no-such-task")
            .replace("{name}", "nobody")
            .replace("{var}", "NOPE")
            .replace("{node}", "nope");
        let url = format!("{}{path}", s.base);
        let auth = format!("Bearer {}", s.tokens["alice"]);
        let mut resp = match op.method {
            "get" => a.get(&url).header("Authorization", &auth).call(),
            "delete" => a.delete(&url).header("Authorization", &auth).call(),
            "put" => a.put(&url).header("Authorization", &auth).send(&b"{}"[..]),
            _ => a.post(&url).header("Authorization", &auth).send(&b"{}"[..]),
        }
        .unwrap_or_else(|e| panic!("{} {}: {e}", op.method, op.path));
        let status = resp.status().as_u16();
        let body = resp.body_mut().read_to_string().unwrap();
        // The router's own answers are no-such-route (404) and method-not-allowed (405) problems; a handler's
        // 404 is a not-found one.
        assert_ne!(status, 405, "{} {} is not routed", op.method, op.path);
        assert!(!body.contains("no-such-route"), "{} {} is not routed: {body}", op.method, op.path);
    }
    let page = a.get(&format!("{}/api/docs", s.base)).call().unwrap().body_mut().read_to_string().unwrap();
    assert!(page.contains("/api/openapi.json") && !page.contains("https://"), "the docs page works offline");
}

/// Admins list the users with their roles and groups (never a token or its hash); members get 403, as on
/// every admin route, and no token gets 401.
#[test]
fn admins_list_users_and_members_may_not() {
    let s = server();
    let (code, p) = s.call("GET", "alice", "/api/v1/admin/users", None, None);
    assert_eq!(code, 403, "{p}");
    assert_eq!(p["type"], "https://trainyard.dev/problems/forbidden", "{p}");
    assert_eq!(s.call_as("GET", "nope", "/api/v1/admin/users", None, None).0, 401);
    // A token made for a user changes nothing in the list but is never in it.
    let (code, t) = s.call("POST", "root", "/api/v1/users/alice/tokens", Some(r#"{"label": "ci"}"#), None);
    assert_eq!(code, 201, "{t}");
    let token = t["token"].as_str().unwrap().to_owned();
    let (code, list) = s.call("GET", "root", "/api/v1/admin/users", None, None);
    assert_eq!(code, 200, "{list}");
    let items = list["items"].as_array().unwrap();
    let names: Vec<&str> = items.iter().map(|u| u["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["alice", "bob", "carol", "dave", "root"], "by name: {list}");
    assert_eq!(
        items[0],
        serde_json::json!({"name": "alice", "role": "member", "groups": ["nlp"], "disabled": false, "deleted": false, "workHeld": false})
    );
    assert_eq!(
        items[4],
        serde_json::json!({"name": "root", "role": "admin", "groups": [], "disabled": false, "deleted": false, "workHeld": false})
    );
    let text = list.to_string();
    for secret in
        [token.as_str(), &token_hash(&token), s.tokens["alice"].as_str(), &token_hash(&s.tokens["root"])]
    {
        assert!(!text.contains(secret), "a token or hash leaked: {text}");
    }
    // A user saved by an admin shows at once, with the groups given.
    let (code, _) = s.call(
        "POST",
        "root",
        "/api/v1/admin/users",
        Some(r#"{"name": "erin", "role": "member", "groups": ["cv", "nlp"]}"#),
        None,
    );
    assert_eq!(code, 200);
    let (_, list) = s.call("GET", "root", "/api/v1/admin/users", None, None);
    let erin = list["items"].as_array().unwrap().iter().find(|u| u["name"] == "erin").cloned();
    assert_eq!(
        erin,
        Some(
            serde_json::json!({"name": "erin", "role": "member", "groups": ["cv", "nlp"], "disabled": false, "deleted": false, "workHeld": false})
        )
    );
}

#[test]
fn admins_manage_users_tokens_nodes_and_the_catalog() {
    let s = server();
    // Members may not.
    let (code, _) =
        s.call("POST", "alice", "/api/v1/admin/users", Some(r#"{"name": "erin", "role": "member"}"#), None);
    assert_eq!(code, 403);
    let (code, _) = s.call("PUT", "alice", "/api/v1/admin/catalog", Some(CATALOG), None);
    assert_eq!(code, 403);
    // A new user in a group that does not exist yet is refused; add the group to the catalog, then the user.
    let (code, p) = s.call(
        "POST",
        "root",
        "/api/v1/admin/users",
        Some(r#"{"name": "erin", "role": "member", "groups": ["robotics"]}"#),
        None,
    );
    assert_eq!(code, 400, "{p}");
    let (code, p) = s.call(
        "PUT",
        "root",
        "/api/v1/admin/catalog",
        Some("regions: {local: {}}\nclusters: {local: {region: nowhere}}\n"),
        None,
    );
    assert_eq!(code, 400, "an inconsistent catalog is refused: {p}");
    let extended = format!(
        "{CATALOG}  - {{group: robotics, resourceType: Reserved, pool: default, spec: cpu.small, units: 2}}\n"
    )
    .replace("projectGroups: {nlp: {}, cv: {}}", "projectGroups: {nlp: {}, cv: {}, robotics: {}}")
    .replace("projectGroups: [nlp, cv]}, cv-only", "projectGroups: [nlp, cv, robotics]}, cv-only");
    let (code, c) = s.call("PUT", "root", "/api/v1/admin/catalog", Some(&extended), None);
    assert_eq!(code, 200, "{c}");
    let (code, _) = s.call(
        "POST",
        "root",
        "/api/v1/admin/users",
        Some(r#"{"name": "erin", "role": "member", "groups": ["robotics"]}"#),
        None,
    );
    assert_eq!(code, 200);
    let (code, t) = s.call("POST", "root", "/api/v1/users/erin/tokens", Some(r#"{"label": "laptop"}"#), None);
    assert_eq!(code, 201, "{t}");
    let erin = t["token"].as_str().unwrap().to_owned();
    let (_, who) = s.call_as("GET", &erin, "/api/v1/whoami", None, None);
    assert_eq!(who["name"], "erin");
    // The new group is usable at once: erin's task is accepted and runs.
    let (code, task_v) =
        s.call_as("POST", &erin, "/api/v1/tasks", Some(&task("robot", "robotics", false, "")), None);
    assert_eq!(code, 201, "{task_v}");
    // Cordoning the only node: new work waits, with the reason.
    let (code, _) =
        s.call("PUT", "root", "/api/v1/admin/nodes/node-0", Some(r#"{"schedulable": false}"#), None);
    assert_eq!(code, 204);
    let (_, cat) = s.call("GET", "alice", "/api/v1/catalog", None, None);
    assert_eq!(cat["nodes"]["node-0"]["schedulable"], false);
    let (_, queued) =
        s.call("POST", "alice", "/api/v1/tasks", Some(&task("blocked", "nlp", false, "")), None);
    let id = queued["id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, t) = s.call("GET", "alice", &format!("/api/v1/tasks/{id}"), None, None);
        if let Some(reason) = t["queue"]["reason"].as_str() {
            assert!(reason.contains("no schedulable"), "{reason}");
            break;
        }
        assert!(Instant::now() < deadline, "no wait reason: {t}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, _) =
        s.call("PUT", "root", "/api/v1/admin/nodes/node-0", Some(r#"{"schedulable": true}"#), None);
    assert_eq!(code, 204);
    s.wait_status(&id, "Succeeded");
    assert_eq!(
        s.call("PUT", "root", "/api/v1/admin/nodes/nope", Some(r#"{"schedulable": true}"#), None).0,
        404
    );
}

#[test]
fn task_env_is_per_user_and_masked() {
    let s = server();
    let put = |who: &str, user: &str, body: &str| {
        s.call("PUT", who, &format!("/api/v1/users/{user}/env"), Some(body), None).0
    };
    assert_eq!(put("alice", "alice", r#"{"name": "WANDB_API_KEY", "value": "k-123", "hidden": true}"#), 204);
    assert_eq!(put("alice", "alice", r#"{"name": "HF_HOME", "value": "/mnt/hf"}"#), 204);
    assert_eq!(put("alice", "alice", r#"{"name": "BAD NAME", "value": "x"}"#), 422);
    assert_eq!(put("alice", "alice", r#"{"name": "MASTER_PORT", "value": "1"}"#), 422);
    assert_eq!(put("bob", "alice", r#"{"name": "X", "value": "1"}"#), 403);
    assert_eq!(put("root", "alice", r#"{"name": "FROM_ADMIN", "value": "1"}"#), 204);
    let (code, v) = s.call("GET", "alice", "/api/v1/users/alice/env", None, None);
    assert_eq!(code, 200);
    let text = v.to_string();
    assert!(!text.contains("k-123") && text.contains("/mnt/hf") && text.contains("******"), "{text}");
    assert_eq!(s.call("DELETE", "alice", "/api/v1/users/alice/env/HF_HOME", None, None).0, 204);
    assert_eq!(s.call("DELETE", "alice", "/api/v1/users/alice/env/HF_HOME", None, None).0, 404);
    let bytes = std::fs::read(&s.db).unwrap_or_default();
    assert!(!bytes.windows(5).any(|w| w == b"k-123"), "hidden TaskEnv values are sealed at rest");
}

#[test]
fn quota_shows_what_is_left() {
    let s = server();
    let (_, t) = s.call("POST", "alice", "/api/v1/tasks", Some(&task("q", "nlp", false, "")), None);
    let id = t["id"].as_str().unwrap().to_owned();
    s.wait_status(&id, "Running");
    // Give the loop a tick with the task running.
    std::thread::sleep(Duration::from_millis(250));
    let (code, q) = s.call("GET", "alice", "/api/v1/quota", None, None);
    assert_eq!(code, 200, "{q}");
    let items = q["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "alice sees her group's quota only: {q}");
    assert_eq!((items[0]["group"].as_str(), items[0]["limit"].as_u64()), (Some("nlp"), Some(8)));
    // 1 master + 1 worker of cpu.small while it runs (6 after it ends).
    let remaining = items[0]["remaining"].as_u64().unwrap();
    assert!(remaining == 6 || remaining == 8, "{q}");
    let (_, all) = s.call("GET", "root", "/api/v1/quota", None, None);
    assert_eq!(all["items"].as_array().unwrap().len(), 2);
}

#[test]
fn users_subscribe_to_alarms_for_all_their_tasks() {
    // The receiver is on loopback: allowed explicitly, as an admin would with `up --webhook-allow-net`.
    let s = server_allowing(&["127.0.0.0/8"]);
    let bad = r#"[{"events": ["queuedTooLong"], "webhook": "ftp://x"}]"#;
    let (code, p) = s.call("PUT", "alice", "/api/v1/users/alice/alarms", Some(bad), None);
    assert_eq!(code, 422, "{p}");
    let paths: Vec<&str> =
        p["problems"].as_array().unwrap().iter().map(|x| x["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["alarms[0].webhook", "alarms[0].queuedThresholdSeconds"]);
    let good = r#"[{"events": ["succeeded"], "webhook": "http://127.0.0.1:9/hook"}]"#;
    assert_eq!(s.call("PUT", "alice", "/api/v1/users/alice/alarms", Some(good), None).0, 204);
    assert_eq!(s.call("PUT", "bob", "/api/v1/users/alice/alarms", Some(good), None).0, 403);
    let (_, v) = s.call("GET", "alice", "/api/v1/users/alice/alarms", None, None);
    assert_eq!(v["items"][0]["webhook"], "http://127.0.0.1:9/hook");
    // alice's task (which subscribes to nothing itself) raises her alarm when it succeeds.
    let (_, t) = s.call("POST", "alice", "/api/v1/tasks", Some(&task("sub", "nlp", false, "")), None);
    let id = t["id"].as_str().unwrap().to_owned();
    s.wait_status(&id, "Succeeded");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let log = rt.block_on(async {
        let store = Store::connect(&format!("sqlite://{}", s.db.display())).await.unwrap();
        store.task_alarms(&id).await.unwrap()
    });
    assert_eq!(log.iter().map(|d| d.event.as_str()).collect::<Vec<_>>(), ["succeeded"]);
    assert_eq!(log[0].url, "http://127.0.0.1:9/hook");
}

impl Server {
    /// The env the backend was given for a task's latest launch (hidden values opened), once launched.
    fn launched_env(&self, id: &str) -> Vec<(String, String)> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(spec) = self.fake.launched().into_iter().rev().find(|l| l.key.task_id == id) {
                let env = &spec.task.spec.environment.env;
                return env.iter().map(|e| (e.name.clone(), e.value.clone())).collect();
            }
            assert!(Instant::now() < deadline, "task {id} was never launched");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `f` on a second connection to the server's database (what someone with a copy of it sees).
    fn with_store<T>(&self, f: impl AsyncFnOnce(Store) -> T) -> T {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let store = Store::connect(&format!("sqlite://{}", self.db.display())).await.unwrap();
            f(store).await
        })
    }
}

fn value_of<'a>(env: &'a [(String, String)], name: &str) -> Option<&'a str> {
    env.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

/// Finding 7: TaskEnv is not a decryption oracle. bob copies alice's sealed TaskEnv value out of the database
/// into his own TaskEnv, as a plain value, as a hidden one (through the API) and straight into the database
/// as a hidden row; none of them opens to alice's secret at his launch. alice's own value still opens.
#[test]
fn a_sealed_value_copied_into_another_record_never_opens() {
    let s = server();
    let secret = "alice-wandb-secret";
    let put =
        |who: &str, body: &str| s.call("PUT", who, &format!("/api/v1/users/{who}/env"), Some(body), None);
    let (code, p) =
        put("alice", &format!(r#"{{"name": "WANDB_API_KEY", "value": "{secret}", "hidden": true}}"#));
    assert_eq!(code, 204, "{p}");
    let sealed = s.with_store(async |st| st.task_env("alice").await.unwrap()[0].value.clone());
    assert!(sealed.starts_with("sealed:v2:") && !sealed.contains(secret), "{sealed}");
    assert_eq!(put("bob", &format!(r#"{{"name": "STOLEN_PLAIN", "value": "{sealed}"}}"#)).0, 204);
    assert_eq!(
        put("bob", &format!(r#"{{"name": "STOLEN_HIDDEN", "value": "{sealed}", "hidden": true}}"#)).0,
        204
    );
    let (_, t) = s.call("POST", "bob", "/api/v1/tasks", Some(&task("bob", "nlp", false, "")), None);
    let env = s.launched_env(t["id"].as_str().unwrap());
    assert_eq!(value_of(&env, "STOLEN_PLAIN"), Some(sealed.as_str()), "a plain value stays plain text");
    assert_eq!(value_of(&env, "STOLEN_HIDDEN"), Some(sealed.as_str()), "opened once: back to what bob typed");
    assert!(!format!("{env:?}").contains(secret), "{env:?}");

    // Someone who can write the database puts alice's sealed value into bob's TaskEnv as a hidden row: it is
    // bound to alice, so bob's launch is refused (an event says why) instead of opening it.
    s.with_store(async |st| {
        let row =
            trainyard_store::TaskEnvVar { name: "REPLAYED".into(), value: sealed.clone(), hidden: true };
        st.put_task_env("bob", &row).await.unwrap();
    });
    let (_, t) = s.call("POST", "bob", "/api/v1/tasks", Some(&task("replay", "nlp", false, "")), None);
    let id = t["id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, ev) = s.call("GET", "bob", &format!("/api/v1/tasks/{id}/events"), None, None);
        if ev.to_string().contains("cannot be opened") {
            break;
        }
        assert!(Instant::now() < deadline, "no refusal: {ev}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!s.fake.launched().iter().any(|l| l.key.task_id == id), "the replayed value was never launched");

    // The legitimate path: alice's own task gets her value.
    let (_, t) = s.call("POST", "alice", "/api/v1/tasks", Some(&task("mine", "nlp", false, "")), None);
    assert_eq!(value_of(&s.launched_env(t["id"].as_str().unwrap()), "WANDB_API_KEY"), Some(secret));
}

/// Finding 7, for a task's own hidden values: one copied from another task's stored spec does not open.
#[test]
fn a_hidden_value_copied_between_tasks_does_not_open() {
    let s = server();
    let env = r#", {name: API_KEY, value: "alice-task-secret", hidden: true}"#;
    let (_, a) = s.call("POST", "alice", "/api/v1/tasks", Some(&task("a", "nlp", false, env)), None);
    let a = a["id"].as_str().unwrap().to_owned();
    assert_eq!(value_of(&s.launched_env(&a), "API_KEY"), Some("alice-task-secret"), "the owner's launch");
    // bob's task, with its stored hidden value replaced by alice's sealed one (a database write).
    let bob_env = r#", {name: API_KEY, value: "bobs-own", hidden: true}"#;
    s.call("PUT", "root", "/api/v1/admin/nodes/node-0", Some(r#"{"schedulable": false}"#), None);
    let (_, b) = s.call("POST", "bob", "/api/v1/tasks", Some(&task("b", "nlp", false, bob_env)), None);
    let b = b["id"].as_str().unwrap().to_owned();
    s.with_store(async |st| {
        let alice_spec = st.get_task(&a).await.unwrap().unwrap().spec_json;
        let sealed: Value = serde_json::from_str(&alice_spec).unwrap();
        let sealed = sealed["spec"]["environment"]["env"][1]["value"].as_str().unwrap().to_owned();
        let bob_spec = st.get_task(&b).await.unwrap().unwrap().spec_json;
        let mut v: Value = serde_json::from_str(&bob_spec).unwrap();
        v["spec"]["environment"]["env"][1]["value"] = Value::String(sealed);
        st.replace_spec(&b, &v.to_string()).await.unwrap();
    });
    s.call("PUT", "root", "/api/v1/admin/nodes/node-0", Some(r#"{"schedulable": true}"#), None);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, ev) = s.call("GET", "bob", &format!("/api/v1/tasks/{b}/events"), None, None);
        if ev.to_string().contains("cannot be opened") {
            break;
        }
        assert!(Instant::now() < deadline, "no refusal: {ev}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let launched = s.fake.launched();
    assert!(!launched.iter().any(|l| l.key.task_id == b), "bob's task never ran with alice's value");
}

/// Findings 6 and 10: a clone by another user goes only to a group the cloner belongs to, and never carries
/// hidden values; a mask (`******`, or any run of asterisks) as a hidden value is a 422 at its field.
#[test]
fn clones_stay_in_the_cloners_groups_and_never_carry_hidden_values() {
    let s = server();
    let env = r#", {name: API_KEY, value: "alice-only", hidden: true}"#;
    let (_, t) = s.call("POST", "alice", "/api/v1/tasks", Some(&task("src", "nlp", false, env)), None);
    let id = t["id"].as_str().unwrap().to_owned();
    let share = |user: &str| {
        let body = format!(r#"{{"user": "{user}", "operate": true}}"#);
        assert_eq!(s.call("POST", "alice", &format!("/api/v1/tasks/{id}/shares"), Some(&body), None).0, 204);
    };
    share("carol");
    share("bob");
    let clone =
        |who: &str, body: &str| s.call("POST", who, &format!("/api/v1/tasks/{id}/clone"), Some(body), None);
    // carol (cv) may not put a copy into nlp, where she could not create a task either.
    let (code, p) = clone("carol", "");
    assert_eq!(code, 403, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("not a member of project group nlp"), "{p}");
    let (code, p) = clone("carol", r#"{"projectGroup": "nlp"}"#);
    assert_eq!(code, 403, "{p}");
    // Into her own group: the hidden value is not carried; the 422 names the field and says what to do.
    let (code, p) = clone("carol", r#"{"projectGroup": "cv"}"#);
    assert_eq!(code, 422, "{p}");
    assert_eq!(p["problems"][0]["path"], "spec.environment.env[1].value", "{p}");
    assert_eq!(p["problems"][0]["code"], "masked-value", "{p}");
    assert!(
        p["problems"][0]["message"].as_str().unwrap().contains("enter the value of API_KEY again"),
        "{p}"
    );
    // bob (nlp, the same group) gets no secret either.
    assert_eq!(clone("bob", "").0, 422);
    // With her own value: created in cv, and her value is what runs.
    let (code, c) = clone("carol", r#"{"projectGroup": "cv", "hiddenValues": {"API_KEY": "carols-own"}}"#);
    assert_eq!(code, 201, "{c}");
    assert_eq!((c["owner"].as_str(), c["projectGroup"].as_str()), (Some("carol"), Some("cv")));
    assert_eq!(value_of(&s.launched_env(c["id"].as_str().unwrap()), "API_KEY"), Some("carols-own"));
    assert!(
        !s.fake
            .launched()
            .iter()
            .any(|l| l.owner != "alice" && format!("{:?}", l.task).contains("alice-only"))
    );
    // The mask itself is refused on create, whatever its length; an admin clones into any group.
    for mask in ["******", "***", "*"] {
        let body = task("masked", "nlp", false, &format!(r#", {{name: K, value: "{mask}", hidden: true}}"#));
        let (code, p) = s.call("POST", "alice", "/api/v1/tasks", Some(&body), None);
        assert_eq!((code, p["problems"][0]["code"].as_str()), (422, Some("masked-value")), "{p}");
    }
    let plain = task("stars", "nlp", false, r#", {name: K, value: "***"}"#);
    assert_eq!(
        s.call("POST", "alice", "/api/v1/tasks", Some(&plain), None).0,
        201,
        "a plain value may be stars"
    );
    let (code, c) = clone("root", r#"{"projectGroup": "cv", "hiddenValues": {"API_KEY": "x"}}"#);
    assert_eq!(code, 201, "{c}");
    // Unknown fields in the clone body are refused, not ignored.
    assert_eq!(clone("alice", r#"{"group": "cv"}"#).0, 400);
}

/// Finding 11: a token can be revoked (by its user or an admin) and a user disabled (by an admin); both are
/// refused at once on this server, and within the token cache's TTL when the change comes from elsewhere
/// (another server sharing the store). The refusal is a problem that says what happened.
#[test]
fn tokens_are_revoked_and_users_disabled() {
    let s = server();
    let (code, t) = s.call("POST", "alice", "/api/v1/users/alice/tokens", Some(r#"{"label": "ci"}"#), None);
    assert_eq!(code, 201, "{t}");
    let (ci, ci_id) = (t["token"].as_str().unwrap().to_owned(), t["id"].as_str().unwrap().to_owned());
    assert_eq!(s.call_as("GET", &ci, "/api/v1/whoami", None, None).0, 200);
    let (code, list) = s.call("GET", "alice", "/api/v1/users/alice/tokens", None, None);
    assert_eq!(code, 200, "{list}");
    let ids: Vec<&str> =
        list["items"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert!(ids.contains(&ci_id.as_str()) && ids.len() == 2, "{list}");
    assert!(!list.to_string().contains(&ci) && !list.to_string().contains(&token_hash(&ci)), "{list}");
    // bob may neither list nor revoke alice's tokens.
    assert_eq!(s.call("GET", "bob", "/api/v1/users/alice/tokens", None, None).0, 403);
    assert_eq!(s.call("DELETE", "bob", &format!("/api/v1/users/alice/tokens/{ci_id}"), None, None).0, 403);
    let (code, p) = s.call("DELETE", "alice", "/api/v1/users/alice/tokens/0000000000000000", None, None);
    assert_eq!(code, 404, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("has no token"), "{p}");
    // Revoked: refused at once, though it was just used (and cached).
    assert_eq!(s.call("DELETE", "alice", &format!("/api/v1/users/alice/tokens/{ci_id}"), None, None).0, 204);
    let (code, p) = s.call_as("GET", &ci, "/api/v1/whoami", None, None);
    assert_eq!((code, p["type"].as_str()), (401, Some("https://trainyard.dev/problems/unauthorized")), "{p}");
    assert_eq!(s.call("GET", "alice", "/api/v1/whoami", None, None).0, 200, "her other token still works");

    // Disabled by an admin: every token of bob's answers 403 with a problem saying so; members may not.
    assert_eq!(s.call("POST", "alice", "/api/v1/admin/users/bob/disable", None, None).0, 403);
    assert_eq!(s.call("GET", "bob", "/api/v1/whoami", None, None).0, 200);
    assert_eq!(s.call("POST", "root", "/api/v1/admin/users/bob/disable", None, None).0, 204);
    let (code, p) = s.call("GET", "bob", "/api/v1/tasks", None, None);
    assert_eq!(code, 403, "{p}");
    assert_eq!(p["type"], "https://trainyard.dev/problems/account-disabled", "{p}");
    assert!(p["detail"].as_str().unwrap().contains("user bob is disabled"), "{p}");
    let (_, users) = s.call("GET", "root", "/api/v1/admin/users", None, None);
    assert_eq!(users["items"][1]["disabled"], true, "{users}");
    assert_eq!(s.call("POST", "root", "/api/v1/admin/users/bob/enable", None, None).0, 204);
    assert_eq!(s.call("GET", "bob", "/api/v1/whoami", None, None).0, 200);
    let (code, p) = s.call("POST", "root", "/api/v1/admin/users/nobody/disable", None, None);
    assert_eq!((code, p["detail"].as_str()), (404, Some("no such user \"nobody\"")), "{p}");
    assert_eq!(s.call("POST", "root", "/api/v1/admin/users/root/disable", None, None).0, 409, "not yourself");

    // Groups changed by an admin count at once on this server: dave (cv) moved to nlp may create there.
    assert_eq!(s.call("GET", "dave", "/api/v1/whoami", None, None).0, 200);
    let moved = r#"{"name": "dave", "role": "member", "groups": ["nlp"]}"#;
    assert_eq!(s.call("POST", "root", "/api/v1/admin/users", Some(moved), None).0, 200);
    let (_, who) = s.call("GET", "dave", "/api/v1/whoami", None, None);
    assert_eq!(who["groups"], serde_json::json!(["nlp"]), "{who}");
    // A change made elsewhere (another server on this store) takes effect within the cache's TTL.
    assert_eq!(s.call("GET", "carol", "/api/v1/whoami", None, None).0, 200);
    s.with_store(async |st| assert!(st.set_user_disabled("carol", true, true).await.unwrap()));
    let deadline = Instant::now() + trainyard_api::TOKEN_CACHE_TTL + Duration::from_secs(2);
    while s.call("GET", "carol", "/api/v1/whoami", None, None).0 != 403 {
        assert!(Instant::now() < deadline, "carol's token still works after the cache TTL");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Finding 16: a deleted task cannot be resubmitted (it would sit queued forever, in no list): 409, and it
/// stays as it was; an ended task that was not deleted still can be.
#[test]
fn a_deleted_task_cannot_be_resubmitted() {
    let s = server();
    let (_, t) = s.call("POST", "alice", "/api/v1/tasks", Some(&task("gone", "nlp", false, "")), None);
    let id = t["id"].as_str().unwrap().to_owned();
    s.wait_status(&id, "Succeeded");
    assert_eq!(s.call("DELETE", "alice", &format!("/api/v1/tasks/{id}"), None, None).0, 204);
    let (code, p) = s.call("POST", "alice", &format!("/api/v1/tasks/{id}/resubmit"), None, None);
    assert_eq!(code, 409, "{p}");
    assert_eq!(p["type"], "https://trainyard.dev/problems/conflict", "{p}");
    assert!(p["detail"].as_str().unwrap().contains("a deleted task cannot be resubmitted"), "{p}");
    let (_, after) = s.call("GET", "alice", &format!("/api/v1/tasks/{id}"), None, None);
    assert_eq!(
        (after["status"].as_str(), after["attempt"].as_i64()),
        (Some("Succeeded"), Some(0)),
        "{after}"
    );
    // The legitimate path: an ended task that is not deleted runs again.
    let (_, t) = s.call("POST", "alice", "/api/v1/tasks", Some(&task("again", "nlp", false, "")), None);
    let id = t["id"].as_str().unwrap().to_owned();
    s.wait_status(&id, "Succeeded");
    assert_eq!(s.call("POST", "alice", &format!("/api/v1/tasks/{id}/resubmit"), None, None).0, 200);
}

/// Finding 14: `/validate` never tells a member what another group has left (or waits behind); for the
/// caller's own group it still does.
#[test]
fn validate_shows_only_the_callers_groups_quota() {
    // Tasks run for ten minutes: carol's 4-unit task holds half of cv's 8 units while the test asks.
    let (s, _) = server_with(&[], trainyard_api::HttpLimits::default(), false, 600_000);
    let (code, v) = s.call(
        "POST",
        "carol",
        "/api/v1/tasks",
        Some(&task("hold", "cv", false, "").replace("workers: 1", "workers: 3")),
        None,
    );
    assert_eq!(code, 201, "{v}");
    let held = v["id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.call("GET", "carol", &format!("/api/v1/tasks/{held}"), None, None).1["status"] != "Running" {
        assert!(Instant::now() < deadline, "the holding task never ran");
        std::thread::sleep(Duration::from_millis(50));
    }
    // 6 replicas of cpu.small: within the group's 8 units, but 4 are left, so the answer says so.
    let big = |group: &str| task("big", group, false, "").replace("workers: 1", "workers: 5");
    // The answer comes from the last tick's view: wait for one that has the holding task.
    let deadline = Instant::now() + Duration::from_secs(10);
    let own = loop {
        let (code, v) = s.call("POST", "carol", "/api/v1/validate", Some(&big("cv")), None);
        assert_eq!(code, 200, "{v}");
        let reason = v["admission"]["reason"].as_str().unwrap().to_owned();
        if reason.contains("left") {
            break reason;
        }
        assert!(Instant::now() < deadline, "{v}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(own.contains("cv") && own.contains('4'), "a member sees her group's figures: {own}");
    let (code, v) = s.call("POST", "alice", "/api/v1/validate", Some(&big("cv")), None);
    assert_eq!(code, 200, "{v}");
    let text = v["admission"].to_string();
    assert!(!text.contains('4') && !text.contains("left"), "{text}");
    assert!(text.contains("not a member of project group cv"), "{text}");
    assert!(v["fragmentation"].is_null(), "{v}");
    // An admin sees every group's.
    let (_, v) = s.call("POST", "root", "/api/v1/validate", Some(&big("cv")), None);
    assert!(v["admission"]["reason"].as_str().unwrap().contains('4'), "{v}");
}

/// Finding 15, at subscription time: a webhook to a loopback, link-local, private, unspecified or multicast
/// destination (an address, or a name that resolves to one) is a 422 at its field, for a task's alarms, a
/// user's own subscriptions and `/validate`, unless the admin allowed that network; public ones pass.
#[test]
fn webhooks_to_internal_addresses_are_refused_at_subscription() {
    let s = server();
    let alarm = |url: &str| {
        format!(
            "{}  advanced:\n    alarms:\n      - {{events: [failed], webhook: \"{url}\"}}\n",
            task("hook", "nlp", false, "")
        )
    };
    for url in [
        "http://127.0.0.1:9/hook",
        "http://localhost:9/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://10.0.0.1/x",
        "http://[::1]:9/x",
        "http://[::ffff:192.168.0.1]/x",
        "http://0.0.0.0:80/",
        "http://224.0.0.1/",
    ] {
        let (code, p) = s.call("POST", "alice", "/api/v1/tasks", Some(&alarm(url)), None);
        assert_eq!(code, 422, "{url}: {p}");
        assert_eq!(p["problems"][0]["path"], "spec.advanced.alarms[0].webhook", "{p}");
        assert_eq!(p["problems"][0]["code"], "restricted-address", "{p}");
        let (_, v) = s.call("POST", "alice", "/api/v1/validate", Some(&alarm(url)), None);
        assert_eq!(v["problems"][0]["code"], "restricted-address", "{v}");
        let subs = format!(r#"[{{"events": ["failed"], "webhook": "{url}"}}]"#);
        let (code, p) = s.call("PUT", "alice", "/api/v1/users/alice/alarms", Some(&subs), None);
        assert_eq!((code, p["problems"][0]["path"].as_str()), (422, Some("alarms[0].webhook")), "{p}");
    }
    let (code, p) =
        s.call("POST", "alice", "/api/v1/tasks", Some(&alarm("https://93.184.215.14/hook")), None);
    assert_eq!(code, 201, "a public address is fine: {p}");
    // With the network allowed, the same receiver is accepted.
    let allowed = server_allowing(&["127.0.0.0/8"]);
    let (code, p) =
        allowed.call("POST", "alice", "/api/v1/tasks", Some(&alarm("http://127.0.0.1:9/hook")), None);
    assert_eq!(code, 201, "{p}");
}

/// Finding 13, the separate address: `/metrics` served there without a token (for a scraper on a management
/// network) and nothing else; on the API's address only with an admin token.
#[test]
fn metrics_on_a_separate_address_need_no_token_and_serve_nothing_else() {
    let (s, metrics) = server_with(&[], trainyard_api::HttpLimits::default(), true, 300);
    let metrics = metrics.unwrap();
    let mut r = agent().get(&format!("{metrics}/metrics")).call().unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.body_mut().read_to_string().unwrap().contains("trainyard_queue_depth"));
    let r = agent().get(&format!("{metrics}/api/v1/tasks")).call().unwrap();
    assert_eq!(r.status().as_u16(), 404, "only /metrics there");
    assert_eq!(s.call("GET", "bob", "/metrics", None, None).0, 403);
}

/// Finding 12: a client that never finishes its headers is cut off after the header-read timeout; one that
/// stops sending a body after the idle timeout; past the connection cap a connection gets a 503 problem at
/// once, and once connections are freed new ones are served.
#[test]
fn slow_and_surplus_connections_are_cut_off() {
    use std::io::{Read, Write};
    let limits = trainyard_api::HttpLimits {
        header_read_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(2),
        max_connections: 4,
    };
    let (s, _) = server_with(&[], limits, false, 300);
    let addr = s.base.trim_start_matches("http://").to_owned();
    let connect = || {
        let c = std::net::TcpStream::connect(&addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
        c
    };
    /// Reads until the server closes; how long that took (a read timeout is a failure: it never closed).
    fn closed_after(mut c: std::net::TcpStream) -> (Duration, String) {
        let t0 = Instant::now();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match c.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("the server kept the connection open: {e}"),
            }
        }
        (t0.elapsed(), String::from_utf8_lossy(&got).into_owned())
    }
    // Slow headers (slowloris): closed after about a second.
    let mut slow = connect();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").unwrap();
    let (took, _) = closed_after(slow);
    assert!(took < Duration::from_secs(4), "{took:?}");
    // A body that never comes: closed after the idle timeout.
    let mut stalled = connect();
    let auth = format!("Authorization: Bearer {}\r\n", s.tokens["alice"]);
    write!(stalled, "POST /api/v1/validate HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 1000\r\n\r\n{{")
        .unwrap();
    let (took, _) = closed_after(stalled);
    assert!(took < Duration::from_secs(6), "{took:?}");
    // The cap: four connections held, the fifth refused with a problem document.
    let held: Vec<_> = (0..4).map(|_| connect()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let (_, answer) = closed_after(connect());
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.contains("application/problem+json") && answer.contains("too-many-connections"),
        "{answer}"
    );
    assert!(answer.contains("limit of 4 connections"), "{answer}");
    // The held ones send nothing, so the header-read timeout frees them; then a request is served.
    for c in held {
        closed_after(c);
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(s.call("GET", "alice", "/api/v1/whoami", None, None).0, 200);
}

/// Which check answers first when a request fails more than one, as the handlers always had it: the query
/// (400) before the token (401, 403), and a body too large to read (413) before either; a member on an
/// admin route is told so in the same words everywhere.
#[test]
fn the_query_and_an_oversized_body_answer_before_the_token() {
    let s = server();
    let big = "a".repeat(trainyard_core::MAX_DOCUMENT_BYTES + 4096);
    let answers = |method: &str, who: &str, path: &str, body: Option<&str>, code: u16, kind: &str| {
        let (got, p) = s.call(method, who, path, body, None);
        let problem = format!("https://trainyard.dev/problems/{kind}");
        assert_eq!((got, p["type"].as_str()), (code, Some(problem.as_str())), "{method} {path} as {who}");
    };
    answers("GET", "nope", "/api/v1/whoami?x=1", None, 400, "bad-request");
    answers("GET", "nope", "/api/v1/admin/users?x=1", None, 400, "bad-request");
    answers("GET", "alice", "/api/v1/admin/users?x=1", None, 400, "bad-request");
    answers("POST", "nope", "/api/v1/tasks", Some(&big), 413, "too-large");
    answers("PUT", "alice", "/api/v1/admin/settings", Some(&big), 413, "too-large");
    answers("POST", "nope", "/api/v1/tasks", Some("{}"), 401, "unauthorized");
    answers("PUT", "alice", "/api/v1/admin/settings", Some("{}"), 403, "forbidden");
    answers("GET", "alice", "/api/v1/admin/settings", None, 403, "forbidden");
    answers("PUT", "root", "/api/v1/admin/settings", Some("[]"), 400, "bad-request");
    for (method, path, body) in [
        ("GET", "/api/v1/admin/users", None),
        ("POST", "/api/v1/admin/users", Some(r#"{"name": "x", "role": "member"}"#)),
        ("PUT", "/api/v1/admin/catalog", Some("{}")),
        ("GET", "/api/v1/admin/images", None),
        ("POST", "/api/v1/admin/users/bob/enable", None),
    ] {
        let (code, p) = s.call(method, "alice", path, body, None);
        assert_eq!((code, p["detail"].as_str()), (403, Some("only admins may do this")), "{method} {path}");
    }
}

/// Finding 18 (the API's part): every 4xx is an RFC 9457 problem (unknown route, wrong method, body too
/// large, target too long, a query that does not parse); unknown nodes, users and variables say what is
/// missing; an empty Idempotency-Key and an oversized user name are refused.
#[test]
fn every_error_is_a_problem_that_names_what_is_wrong() {
    let s = server();
    let a = agent();
    let auth = format!("Bearer {}", s.tokens["root"]);
    let problem = |resp: &mut ureq::http::Response<ureq::Body>| -> Value {
        let ct =
            resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
        let body = resp.body_mut().read_to_string().unwrap();
        assert_eq!(ct, "application/problem+json", "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert!(v["type"].as_str().unwrap().starts_with("https://trainyard.dev/problems/"), "{v}");
        assert!(v["title"].is_string() && v["detail"].is_string(), "{v}");
        v
    };
    let mut r = a.get(&format!("{}/api/v1/nope", s.base)).header("Authorization", &auth).call().unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert_eq!(problem(&mut r)["type"], "https://trainyard.dev/problems/no-such-route");
    let mut r = a.delete(&format!("{}/api/v1/whoami", s.base)).header("Authorization", &auth).call().unwrap();
    assert_eq!(r.status().as_u16(), 405);
    assert!(r.headers().get("allow").is_some(), "the Allow header stays");
    assert!(problem(&mut r)["detail"].as_str().unwrap().contains("does not take DELETE"));
    let big = vec![b'a'; trainyard_core::MAX_DOCUMENT_BYTES + 4096];
    let mut r =
        a.post(&format!("{}/api/v1/tasks", s.base)).header("Authorization", &auth).send(&big[..]).unwrap();
    assert_eq!(r.status().as_u16(), 413);
    problem(&mut r);
    let long = format!("{}/api/v1/tasks?q={}", s.base, "x".repeat(trainyard_api::MAX_URI_BYTES));
    let mut r = a.get(&long).header("Authorization", &auth).call().unwrap();
    assert_eq!(r.status().as_u16(), 414);
    problem(&mut r);
    let mut r =
        a.get(&format!("{}/api/v1/tasks?limit=many", s.base)).header("Authorization", &auth).call().unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert!(problem(&mut r)["detail"].as_str().unwrap().contains("limit"), "the detail names the parameter");
    let mut r = a
        .get(&format!("{}/api/v1/tasks/x/events?after=soon", s.base))
        .header("Authorization", &auth)
        .call()
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    problem(&mut r);

    // What is missing is named.
    let (code, p) = s.call("PUT", "root", "/api/v1/admin/nodes/nope", Some(r#"{"schedulable": true}"#), None);
    assert_eq!(
        (code, p["detail"].as_str()),
        (404, Some("no such node \"nope\"; GET /api/v1/catalog lists them"))
    );
    for (method, path) in [
        ("POST", "/api/v1/users/ghost/tokens"),
        ("GET", "/api/v1/users/ghost/env"),
        ("GET", "/api/v1/users/ghost/alarms"),
        ("DELETE", "/api/v1/users/ghost/env/X"),
    ] {
        let (code, p) = s.call(method, "root", path, Some("{}"), None);
        assert_eq!((code, p["detail"].as_str()), (404, Some("no such user \"ghost\"")), "{method} {path}");
    }
    let (code, p) = s.call("DELETE", "alice", "/api/v1/users/alice/env/NOPE", None, None);
    assert_eq!((code, p["detail"].as_str()), (404, Some("alice has no TaskEnv variable \"NOPE\"")));
    let (code, p) = s.call("GET", "alice", "/api/v1/tasks/nope", None, None);
    assert_eq!((code, p["detail"].as_str()), (404, Some("no such task, or it is not visible to you")));

    // An empty Idempotency-Key is refused, not taken as a key; a real one works.
    let body = task("idem", "nlp", false, "");
    for bad in ["", " "] {
        let (code, p) = s.call("POST", "alice", "/api/v1/tasks", Some(&body), Some(bad));
        assert_eq!(code, 400, "{bad:?}: {p}");
        assert!(p["detail"].as_str().unwrap().contains("Idempotency-Key"), "{p}");
    }
    assert_eq!(s.call("POST", "alice", "/api/v1/tasks", Some(&body), Some("k-1")).0, 201);
    // A user name over the limit is refused; one at the limit is fine.
    let user = |name: &str| format!(r#"{{"name": "{name}", "role": "member", "groups": ["nlp"]}}"#);
    let long = "u".repeat(trainyard_api::USER_NAME_MAX_BYTES + 1);
    let (code, p) = s.call("POST", "root", "/api/v1/admin/users", Some(&user(&long)), None);
    assert_eq!(code, 400, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("1 to 64"), "{p}");
    let (code, p) = s.call("POST", "root", "/api/v1/admin/users", Some(&user(&"u".repeat(500_000))), None);
    assert_eq!(code, 400, "{p}");
    let ok = "u".repeat(trainyard_api::USER_NAME_MAX_BYTES);
    assert_eq!(s.call("POST", "root", "/api/v1/admin/users", Some(&user(&ok)), None).0, 200);
    let label = format!(r#"{{"label": "{}"}}"#, "l".repeat(trainyard_api::TOKEN_LABEL_MAX_BYTES + 1));
    assert_eq!(s.call("POST", "alice", "/api/v1/users/alice/tokens", Some(&label), None).0, 400);
}

/// Finding 8: volumes, datasets, models and images carry the project groups that may use them; a use from
/// another group is refused with a stable code and the allowed groups named; entries without groups stay
/// open to all. The host image is for admins and the groups its entry lists.
#[test]
fn catalog_entries_are_used_only_by_their_groups() {
    let s = server();
    let with = |group: &str, extra: &str| {
        task("own", group, false, "")
            .replace("    cmd: python3 train.py\n", &format!("    cmd: python3 train.py\n{extra}"))
    };
    // carol (cv) may not mount nlp's volume read-write, nor take the cv image into nlp, etc.
    let (code, p) = s.call(
        "POST",
        "carol",
        "/api/v1/tasks",
        Some(&with("cv", "    volumes: [{volume: ckpt, mountPath: /volume/ckpt}]\n")),
        None,
    );
    assert_eq!(code, 422, "{p}");
    assert_eq!(p["problems"][0]["path"], "spec.environment.volumes[0].volume", "{p}");
    assert_eq!(p["problems"][0]["code"], "not-in-group", "{p}");
    // A member is told it is not offered to their group, not which other groups it is for.
    let message = p["problems"][0]["message"].as_str().unwrap();
    assert!(message.contains("is not offered to project group \"cv\"") && !message.contains("nlp"), "{p}");
    let (code, p) = s.call(
        "POST",
        "alice",
        "/api/v1/tasks",
        Some(&with("nlp", "    datasets: [{dataset: alpaca, mountPath: /mnt/data}]\n")),
        None,
    );
    assert_eq!((code, p["problems"][0]["code"].as_str()), (422, Some("not-in-group")), "{p}");
    let (_, v) = s.call(
        "POST",
        "alice",
        "/api/v1/validate",
        Some(&with("nlp", "    datasets: [{dataset: alpaca, mountPath: /mnt/data}]\n")),
        None,
    );
    assert_eq!(v["problems"][0]["code"], "not-in-group", "{v}");
    let (code, p) = s.call(
        "POST",
        "alice",
        "/api/v1/tasks",
        Some(&with("nlp", "").replace("image: host", "image: cv-only")),
        None,
    );
    assert_eq!((code, p["problems"][0]["path"].as_str()), (422, Some("spec.environment.image")), "{p}");
    // The legitimate paths: the owning group, a listed group, an entry open to all.
    let mounts = "    volumes: [{volume: ckpt, mountPath: /volume/ckpt}, {volume: shared, mountPath: /volume/s}]\n    models: [{model: llama, mountPath: /mnt/model}]\n";
    let (code, mounted) = s.call("POST", "alice", "/api/v1/tasks", Some(&with("nlp", mounts)), None);
    assert_eq!(code, 201, "{mounted}");
    let (code, p) = s.call(
        "POST",
        "carol",
        "/api/v1/tasks",
        Some(&with("cv", "    datasets: [{dataset: alpaca, mountPath: /mnt/data}]\n")),
        None,
    );
    assert_eq!(code, 201, "{p}");
    // What follows takes entries away from nlp: only once no active task of nlp uses them (while one does,
    // the catalog is refused; see catalog_replacement_keeps_what_active_tasks_use).
    s.wait_status_as("root", mounted["id"].as_str().unwrap(), "Succeeded");
    s.wait_status_as("root", p["id"].as_str().unwrap(), "Succeeded");

    // host: listed groups only for members; an admin always. Taking nlp off the list refuses alice.
    let (_, cat) = s.call("GET", "root", "/api/v1/catalog", None, None);
    let mut cat = cat;
    cat["images"]["host"]["projectGroups"] = serde_json::json!(["cv"]);
    assert_eq!(s.call("PUT", "root", "/api/v1/admin/catalog", Some(&cat.to_string()), None).0, 200);
    let (code, p) = s.call("POST", "alice", "/api/v1/tasks", Some(&task("h", "nlp", false, "")), None);
    assert_eq!(code, 403, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("images.host.projectGroups: cv"), "{p}");
    assert_eq!(s.call("POST", "carol", "/api/v1/tasks", Some(&task("h", "cv", false, "")), None).0, 201);
    assert_eq!(s.call("POST", "root", "/api/v1/tasks", Some(&task("h", "nlp", false, "")), None).0, 201);
    cat["images"]["host"]["projectGroups"] = serde_json::json!([]);
    assert_eq!(s.call("PUT", "root", "/api/v1/admin/catalog", Some(&cat.to_string()), None).0, 200);
    let (code, p) = s.call("POST", "carol", "/api/v1/tasks", Some(&task("h", "cv", false, "")), None);
    assert_eq!(code, 403, "empty: admins only: {p}");
    assert!(p["detail"].as_str().unwrap().contains("none: admins only"), "{p}");
    // A catalog naming a group that does not exist is refused.
    cat["volumes"]["ckpt"]["projectGroups"] = serde_json::json!(["robotics"]);
    let (code, p) = s.call("PUT", "root", "/api/v1/admin/catalog", Some(&cat.to_string()), None);
    assert_eq!(code, 400, "{p}");
    assert!(
        p["detail"].as_str().unwrap().contains("volume ckpt: project group \"robotics\" does not exist"),
        "{p}"
    );
}

/// A task of `task`'s shape with more under `spec.environment` (after its command).
fn task_with(prefix: &str, group: &str, environment: &str) -> String {
    task(prefix, group, false, "")
        .replace("    cmd: python3 train.py\n", &format!("    cmd: python3 train.py\n{environment}"))
}

/// Issue 14, point 8: a catalog replacement never takes away what active tasks use. `{}` (which used to be
/// accepted and empty every node, quota and group under running tasks) is a 409 that lists each thing; so is
/// dropping one volume a running task mounts, or shrinking the node it runs on. What no active task uses may
/// go, a cordon is fine, `force=true` replaces it anyway; and a field left out is closed.
#[test]
fn catalog_replacement_keeps_what_active_tasks_use() {
    // Tasks run for ten minutes, so the one below runs while the catalog is replaced.
    let (s, _) = server_with(&[], trainyard_api::HttpLimits::default(), false, 600_000);
    let busy = task_with("busy", "nlp", "    volumes: [{volume: ckpt, mountPath: /volume/ckpt}]\n");
    let (code, t) = s.call("POST", "alice", "/api/v1/tasks", Some(&busy), None);
    assert_eq!(code, 201, "{t}");
    let (id, name) = (t["id"].as_str().unwrap().to_owned(), t["name"].as_str().unwrap().to_owned());
    s.wait_status(&id, "Running");
    let (_, before) = s.call("GET", "root", "/api/v1/catalog", None, None);

    let (code, p) = s.call("PUT", "root", "/api/v1/admin/catalog", Some("{}"), None);
    assert_eq!(code, 409, "{p}");
    assert_eq!(p["type"], "https://trainyard.dev/problems/catalog-in-use", "{p}");
    assert!(p["detail"].as_str().unwrap().contains("?force=true"), "{p}");
    let conflicts = p["conflicts"].as_array().unwrap();
    let at =
        |path: &str| conflicts.iter().find(|c| c["path"] == path).unwrap_or_else(|| panic!("{path}: {p}"));
    for path in [
        "metadata.projectGroup",
        "spec.placement.region",
        "spec.compute.pool",
        "spec.environment.image",
        "spec.environment.volumes[0].volume",
        "placement",
    ] {
        assert_eq!(
            (at(path)["tasks"].as_u64(), &at(path)["taskNames"]),
            (Some(1), &serde_json::json!([name]))
        );
    }
    assert_eq!(at("placement")["code"], "node-in-use");
    assert!(at("placement")["message"].as_str().unwrap().contains("node node-0 runs replicas now"), "{p}");
    assert_eq!(s.call("GET", "root", "/api/v1/catalog", None, None).1, before, "nothing changed");

    // One thing at a time: the volume it mounts; the node it runs on, smaller.
    let mut cat = before.clone();
    cat["volumes"].as_object_mut().unwrap().remove("ckpt");
    let (code, p) = s.call("PUT", "root", "/api/v1/admin/catalog", Some(&cat.to_string()), None);
    assert_eq!(code, 409, "{p}");
    let paths: Vec<&str> =
        p["conflicts"].as_array().unwrap().iter().map(|c| c["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["spec.environment.volumes[0].volume"], "{p}");
    let mut cat = before.clone();
    cat["nodes"]["node-0"]["vcpus"] = serde_json::json!(1);
    let (code, p) = s.call("PUT", "root", "/api/v1/admin/catalog", Some(&cat.to_string()), None);
    assert_eq!(code, 409, "{p}");
    let node = p["conflicts"].as_array().unwrap().iter().find(|c| c["code"] == "node-in-use").cloned();
    assert!(
        node.is_some_and(|c| c["message"].as_str().unwrap().contains("shrinks from 0 GPUs, 16 vCPUs")),
        "{p}"
    );
    // The quota its group is admitted under, gone: it could never be admitted again.
    let mut cat = before.clone();
    cat["quotas"] = serde_json::json!([]);
    let (code, p) = s.call("PUT", "root", "/api/v1/admin/catalog", Some(&cat.to_string()), None);
    assert_eq!((code, p["conflicts"][0]["code"].as_str()), (409, Some("never-fits")), "{p}");

    // What no active task uses may go; a cordon and a larger node are fine.
    let mut cat = before.clone();
    cat["datasets"].as_object_mut().unwrap().remove("alpaca");
    cat["nodes"]["node-0"]["schedulable"] = serde_json::json!(false);
    cat["nodes"]["node-0"]["vcpus"] = serde_json::json!(32);
    let (code, c) = s.call("PUT", "root", "/api/v1/admin/catalog", Some(&cat.to_string()), None);
    assert_eq!(code, 200, "{c}");
    assert!(c["datasets"].as_object().unwrap().is_empty() && c["nodes"]["node-0"]["vcpus"] == 32, "{c}");

    // Left out, external images are closed; said, open.
    assert_eq!(c["allowExternalImages"], false, "{c}");
    let external = task("ext", "nlp", false, "").replace("image: host", "image: ghcr.io/team/train:1");
    let (_, v) = s.call("POST", "alice", "/api/v1/validate", Some(&external), None);
    assert_eq!(
        (v["valid"].as_bool(), v["problems"][0]["path"].as_str()),
        (Some(false), Some("spec.environment.image"))
    );
    cat["allowExternalImages"] = serde_json::json!(true);
    assert_eq!(s.call("PUT", "root", "/api/v1/admin/catalog", Some(&cat.to_string()), None).0, 200);
    let (_, v) = s.call("POST", "alice", "/api/v1/validate", Some(&external), None);
    assert_eq!(v["valid"], true, "{v}");

    // force=true: the admin means it; the running task goes on.
    let mut cat = cat.clone();
    cat["volumes"].as_object_mut().unwrap().remove("ckpt");
    let (code, c) = s.call("PUT", "root", "/api/v1/admin/catalog?force=true", Some(&cat.to_string()), None);
    assert_eq!(code, 200, "{c}");
    assert!(c["volumes"].get("ckpt").is_none(), "{c}");
    assert_eq!(s.call("GET", "alice", &format!("/api/v1/tasks/{id}"), None, None).1["status"], "Running");
    // No body at all is not a catalog; members may not, forced or not.
    let (code, p) = s.call("PUT", "root", "/api/v1/admin/catalog", Some(""), None);
    assert_eq!((code, p["type"].as_str()), (400, Some("https://trainyard.dev/problems/bad-request")), "{p}");
    assert_eq!(s.call("PUT", "alice", "/api/v1/admin/catalog?force=true", Some("{}"), None).0, 403);
    assert_eq!(s.call("PUT", "root", "/api/v1/admin/catalog?forse=true", Some("{}"), None).0, 400);
}

/// A create as `who` with an Idempotency-Key, with its answer's Retry-After header.
fn create_keyed(s: &Server, who: &str, body: &str, key: &str) -> (u16, Value, Option<String>) {
    let mut r = agent()
        .post(&format!("{}/api/v1/tasks", s.base))
        .header("Authorization", &format!("Bearer {}", s.tokens[who]))
        .header("Idempotency-Key", key)
        .send(body.as_bytes())
        .unwrap();
    let retry = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
    let text = r.body_mut().read_to_string().unwrap();
    (r.status().as_u16(), serde_json::from_str(&text).unwrap_or(Value::String(text)), retry)
}

/// Issue 14, point 8: a loop made 446 queued tasks from one clone. A user's queued tasks are capped (an
/// admin setting, 1,000 by default): a create, clone or resubmit past it is a 429 problem naming the cap and
/// the count, with Retry-After; other users are not affected; a retry of a create that was made is still
/// answered; concurrent creates do not pass the cap together; an admin can raise it.
#[test]
fn a_users_queued_tasks_are_capped_with_a_429() {
    let s = Arc::new(server());
    // Nothing runs: every task stays queued.
    s.call("PUT", "root", "/api/v1/admin/nodes/node-0", Some(r#"{"schedulable": false}"#), None);
    let (code, v) = s.call("GET", "root", "/api/v1/admin/settings", None, None);
    let defaults = serde_json::json!({"maxQueuedTasksPerUser": 1000, "workdirMaxBytes": 1u64 << 30,
                                      "workdirGroupBytes": 20u64 << 30, "workdirKeepDays": 7});
    assert_eq!((code, v), (200, defaults));
    let cap = |n: i64| format!(r#"{{"maxQueuedTasksPerUser": {n}}}"#);
    assert_eq!(s.call("GET", "alice", "/api/v1/admin/settings", None, None).0, 403);
    assert_eq!(s.call("PUT", "alice", "/api/v1/admin/settings", Some(&cap(5000)), None).0, 403);
    let bad_workdir = [
        r#"{"maxQueuedTasksPerUser": 5, "workdirMaxBytes": 0}"#.to_owned(),
        r#"{"maxQueuedTasksPerUser": 5, "workdirKeepDays": 0}"#.to_owned(),
        r#"{"maxQueuedTasksPerUser": 5, "workdirGroupBytes": -1}"#.to_owned(),
    ];
    let bad_cap = [cap(0), cap(-1), cap(20_000_000), r#"{"maxQueued": 3}"#.into(), "[3]".into(), "".into()];
    for bad in bad_cap.into_iter().chain(bad_workdir) {
        let (code, p) = s.call("PUT", "root", "/api/v1/admin/settings", Some(&bad), None);
        assert_eq!(code, 400, "{bad}: {p}");
    }
    let (code, v) = s.call("PUT", "root", "/api/v1/admin/settings", Some(&cap(3)), None);
    assert_eq!((code, v["maxQueuedTasksPerUser"].as_u64()), (200, Some(3)));

    // A loop over the cap.
    let body = |i: usize| task(&format!("loop{i}"), "nlp", false, "");
    let mut made = Vec::new();
    for i in 0..6 {
        let (code, t, retry) = create_keyed(&s, "alice", &body(i), &format!("k-{i}"));
        if i < 3 {
            assert_eq!(code, 201, "{t}");
            made.push(t["id"].as_str().unwrap().to_owned());
            continue;
        }
        assert_eq!(code, 429, "{t}");
        assert_eq!(t["type"], "https://trainyard.dev/problems/too-many-queued", "{t}");
        assert_eq!((t["limit"].as_u64(), t["queued"].as_u64()), (Some(3), Some(3)), "{t}");
        let detail = t["detail"].as_str().unwrap();
        assert!(detail.contains("you have 3 queued tasks") && detail.contains("at most 3"), "{t}");
        assert_eq!(retry.as_deref(), Some("30"), "Retry-After");
    }
    // A retry of a create that was made is answered with its task, not refused.
    let (code, t, _) = create_keyed(&s, "alice", &body(0), "k-0");
    assert_eq!((code, t["id"].as_str()), (200, Some(made[0].as_str())), "{t}");
    // Others are not affected.
    let (code, t) = s.call("POST", "bob", "/api/v1/tasks", Some(&task("bobs", "nlp", false, "")), None);
    assert_eq!(code, 201, "{t}");
    // A clone, and a resubmit of an ended task, count too.
    let (code, p) = s.call("POST", "alice", &format!("/api/v1/tasks/{}/clone", made[0]), None, None);
    assert_eq!((code, p["limit"].as_u64()), (429, Some(3)), "{p}");
    assert_eq!(s.call("POST", "alice", &format!("/api/v1/tasks/{}/stop", made[0]), None, None).0, 200);
    let (code, t, _) = create_keyed(&s, "alice", &body(9), "k-9");
    assert_eq!(code, 201, "a stopped task frees a place: {t}");
    let (code, p) = s.call("POST", "alice", &format!("/api/v1/tasks/{}/resubmit", made[0]), None, None);
    assert_eq!((code, p["queued"].as_u64()), (429, Some(3)), "{p}");
    // An admin raises the cap: the same requests go through.
    assert_eq!(s.call("PUT", "root", "/api/v1/admin/settings", Some(&cap(5)), None).0, 200);
    assert_eq!(s.call("POST", "alice", &format!("/api/v1/tasks/{}/resubmit", made[0]), None, None).0, 200);
    assert_eq!(s.call("POST", "alice", &format!("/api/v1/tasks/{}/clone", made[1]), None, None).0, 201);

    // Sixteen at once, with room for five: five are made, never more.
    let handles: Vec<_> = (0..16)
        .map(|i| {
            let s = s.clone();
            std::thread::spawn(move || {
                create_keyed(&s, "carol", &task(&format!("c{i}"), "cv", false, ""), &format!("c-{i}")).0
            })
        })
        .collect();
    let codes: Vec<u16> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(codes.iter().filter(|c| **c == 201).count(), 5, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 429).count(), 11, "{codes:?}");
    let (_, list) = s.call("GET", "carol", "/api/v1/tasks?owner=carol&status=Queued", None, None);
    assert_eq!(list["items"].as_array().unwrap().len(), 5, "{list}");
}

/// Issue 14, point 8: bulk delete by filter. At least one filter (a 400 without, or with a parameter the
/// operation does not take); a member deletes only what they may operate (their own, and tasks shared with
/// them with operate rights), an admin any; running tasks are stopped first, as a single delete does; the
/// answer counts and names what was deleted.
#[test]
fn bulk_delete_by_filter() {
    let (s, _) = server_with(&[], trainyard_api::HttpLimits::default(), false, 600_000);
    let create = |who: &str, prefix: &str, group: &str, public: bool| -> String {
        let (code, t) = s.call("POST", who, "/api/v1/tasks", Some(&task(prefix, group, public, "")), None);
        assert_eq!(code, 201, "{t}");
        t["id"].as_str().unwrap().to_owned()
    };
    let mine = [create("alice", "sweep-a", "nlp", false), create("alice", "sweep-b", "nlp", false)];
    let kept = create("alice", "keep", "nlp", false);
    let shared = create("bob", "sweep-shared", "nlp", false);
    let viewed = create("bob", "sweep-viewed", "nlp", true);
    let bobs = create("bob", "sweep-bob", "nlp", false);
    let carols = create("carol", "sweep-carol", "cv", false);
    let share = |id: &str, operate: bool| {
        let body = format!(r#"{{"user": "alice", "operate": {operate}}}"#);
        assert_eq!(s.call("POST", "bob", &format!("/api/v1/tasks/{id}/shares"), Some(&body), None).0, 204);
    };
    share(&shared, true);
    share(&viewed, false);
    s.wait_status(&mine[0], "Running");

    for refused in
        ["/api/v1/tasks", "/api/v1/tasks?status=", "/api/v1/tasks?limit=5", "/api/v1/tasks?status=gone"]
    {
        let (code, p) = s.call("DELETE", "alice", refused, None, None);
        assert_eq!((code, p["status"].as_u64()), (400, Some(400)), "{refused}: {p}");
    }
    let (_, p) = s.call("DELETE", "alice", "/api/v1/tasks", None, None);
    assert!(p["detail"].as_str().unwrap().contains("at least one of"), "{p}");

    let (code, done) = s.call("DELETE", "alice", "/api/v1/tasks?q=sweep", None, None);
    assert_eq!(code, 200, "{done}");
    let mut ids: Vec<&str> = done["ids"].as_array().unwrap().iter().map(|i| i.as_str().unwrap()).collect();
    ids.sort();
    let mut want = vec![mine[0].as_str(), mine[1].as_str(), shared.as_str()];
    want.sort();
    assert_eq!(
        (done["deleted"].as_u64(), ids, &done["more"], &done["failed"]),
        (Some(3), want, &Value::Bool(false), &serde_json::json!([]))
    );
    // Running ones were stopped first, and end Stopped; each reads as deleted and has left the list.
    for id in [&mine[0], &mine[1], &shared] {
        let t = s.wait_status_as("root", id, "Stopped");
        assert_eq!(t["deleted"], true, "{t}");
    }
    let (_, ev) = s.call("GET", "alice", &format!("/api/v1/tasks/{}/events", mine[0]), None, None);
    assert!(ev.to_string().contains("\"Deleted\""), "{ev}");
    let (_, list) = s.call("GET", "alice", "/api/v1/tasks?q=sweep", None, None);
    let listed: Vec<&str> =
        list["items"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(listed, [viewed.as_str()], "what alice may only see stays: {list}");
    for (who, id) in [("alice", &kept), ("bob", &bobs), ("carol", &carols), ("bob", &viewed)] {
        assert_eq!(
            s.call("GET", who, &format!("/api/v1/tasks/{id}"), None, None).1["deleted"],
            false,
            "{id}"
        );
    }
    // Nothing left of hers to delete; an admin deletes anyone's.
    let (_, again) = s.call("DELETE", "alice", "/api/v1/tasks?q=sweep", None, None);
    assert_eq!((again["deleted"].as_u64(), again["ids"].as_array().map(Vec::len)), (Some(0), Some(0)));
    let (code, done) =
        s.call("DELETE", "root", "/api/v1/tasks?owner=bob&q=sweep&type=pytorchjob", None, None);
    assert_eq!((code, done["deleted"].as_u64()), (200, Some(2)), "{done}");
    assert_eq!(s.call("GET", "carol", &format!("/api/v1/tasks/{carols}"), None, None).1["deleted"], false);
}

/// Issue 14, point 8: a body that is not what an operation takes is a 400 problem and changes nothing: a
/// token is never minted from an array (serde reads a struct from one), `/validate` and a create need a
/// document, and every JSON body is an object with known fields.
#[test]
fn bodies_of_the_wrong_shape_are_refused_and_change_nothing() {
    let s = server();
    let tokens = || {
        s.call("GET", "alice", "/api/v1/users/alice/tokens", None, None).1["items"].as_array().unwrap().len()
    };
    let before = tokens();
    for body in ["[]", r#"["x"]"#, r#""x""#, "3", "null", "true", r#"{"label": 3}"#, r#"{"lable": "x"}"#, "{"]
    {
        let (code, p) = s.call("POST", "alice", "/api/v1/users/alice/tokens", Some(body), None);
        assert_eq!(
            (code, p["type"].as_str()),
            (400, Some("https://trainyard.dev/problems/bad-request")),
            "{body}: {p}"
        );
        assert!(p.get("token").is_none(), "{p}");
    }
    let (_, p) = s.call("POST", "alice", "/api/v1/users/alice/tokens", Some(r#"["x"]"#), None);
    assert!(p["detail"].as_str().unwrap().contains("it is an array"), "{p}");
    assert_eq!(tokens(), before, "no token was minted");
    assert_eq!(
        s.call("POST", "alice", "/api/v1/users/alice/tokens", Some(r#"{"label": "ok"}"#), None).0,
        201
    );
    assert_eq!(tokens(), before + 1);

    for (method, path) in [("POST", "/api/v1/validate"), ("POST", "/api/v1/tasks")] {
        for empty in ["", "  \n"] {
            let (code, p) = s.call(method, "alice", path, Some(empty), None);
            assert_eq!(code, 400, "{path} {empty:?}: {p}");
            assert!(p["detail"].as_str().unwrap().contains("the body is empty"), "{p}");
        }
    }
    let (code, v) = s.call("POST", "alice", "/api/v1/validate", Some(&task("v", "nlp", false, "")), None);
    assert_eq!((code, v["valid"].as_bool()), (200, Some(true)), "{v}");

    let (_, t) = s.call("POST", "alice", "/api/v1/tasks", Some(&task("shape", "nlp", false, "")), None);
    let id = t["id"].as_str().unwrap();
    for (who, method, path, body) in [
        ("alice", "POST", format!("/api/v1/tasks/{id}/shares"), r#"["carol", true]"#),
        ("alice", "POST", format!("/api/v1/tasks/{id}/shares"), r#"{"user": "carol", "operete": true}"#),
        ("alice", "POST", format!("/api/v1/tasks/{id}/clone"), r#"["cv"]"#),
        ("root", "POST", "/api/v1/admin/users".to_owned(), r#"["erin", "member"]"#),
        ("alice", "PUT", "/api/v1/users/alice/env".to_owned(), r#"["X", "1"]"#),
        ("root", "PUT", "/api/v1/admin/nodes/node-0".to_owned(), r#"[false]"#),
        ("root", "PUT", "/api/v1/admin/nodes/node-0".to_owned(), r#"{"schedulable": true, "drain": true}"#),
        ("root", "PUT", "/api/v1/admin/registries/r.example/login".to_owned(), r#"["u", "p"]"#),
    ] {
        let (code, p) = s.call(method, who, &path, Some(body), None);
        assert_eq!(code, 400, "{method} {path} {body}: {p}");
    }
    let (_, users) = s.call("GET", "root", "/api/v1/admin/users", None, None);
    assert!(!users.to_string().contains("erin"), "{users}");
    // PUT .../alarms answers as documented: 204, no body.
    let subs = r#"[{"events": ["failed"], "webhook": "https://93.184.215.14/h"}]"#;
    let (code, body) = s.call("PUT", "alice", "/api/v1/users/alice/alarms", Some(subs), None);
    assert_eq!((code, body), (204, Value::String(String::new())));
}

/// Issue 14, point 8: a deleted task read by id says it was deleted (it stays readable, so a task deleted
/// while it runs can be followed to its end, as the CLI and the Python client do); a second delete is a 204
/// that changes nothing; one the caller may not see is a 404 as before.
#[test]
fn a_deleted_task_reads_as_deleted_and_deleting_it_again_changes_nothing() {
    let s = server();
    let (_, t) = s.call("POST", "alice", "/api/v1/tasks", Some(&task("gone", "nlp", false, "")), None);
    let id = t["id"].as_str().unwrap().to_owned();
    assert_eq!(t["deleted"], false, "{t}");
    s.wait_status(&id, "Succeeded");
    assert_eq!(s.call("DELETE", "alice", &format!("/api/v1/tasks/{id}"), None, None).0, 204);
    let (code, first) = s.call("GET", "alice", &format!("/api/v1/tasks/{id}"), None, None);
    assert_eq!(
        (code, &first["deleted"], &first["status"]),
        (200, &Value::Bool(true), &Value::from("Succeeded"))
    );
    let (_, events) = s.call("GET", "alice", &format!("/api/v1/tasks/{id}/events"), None, None);
    assert_eq!(s.call("DELETE", "alice", &format!("/api/v1/tasks/{id}"), None, None).0, 204, "again");
    assert_eq!(s.call("GET", "alice", &format!("/api/v1/tasks/{id}"), None, None).1, first, "unchanged");
    assert_eq!(s.call("GET", "alice", &format!("/api/v1/tasks/{id}/events"), None, None).1, events);
    assert_eq!(s.call("DELETE", "carol", &format!("/api/v1/tasks/{id}"), None, None).0, 404);
    let (_, list) = s.call("GET", "alice", "/api/v1/tasks", None, None);
    assert!(list["items"].as_array().unwrap().is_empty(), "{list}");
}

/// Issue 14, point 8: users list their own tokens (id, label, created, last used, which one they came
/// with; never a token or its hash) and revoke them; other members may do neither.
#[test]
fn users_list_and_revoke_their_own_tokens() {
    let s = server();
    let (code, made) =
        s.call("POST", "alice", "/api/v1/users/alice/tokens", Some(r#"{"label": "laptop"}"#), None);
    assert_eq!(code, 201, "{made}");
    let (laptop, laptop_id) =
        (made["token"].as_str().unwrap().to_owned(), made["id"].as_str().unwrap().to_owned());
    let (_, unused) =
        s.call("POST", "alice", "/api/v1/users/alice/tokens", Some(r#"{"label": "spare"}"#), None);
    assert_eq!(s.call_as("GET", &laptop, "/api/v1/whoami", None, None).0, 200);
    // The use is recorded off the request's path: look until it shows.
    let deadline = Instant::now() + Duration::from_secs(10);
    let list = loop {
        let (code, list) = s.call("GET", "alice", "/api/v1/users/alice/tokens", None, None);
        assert_eq!(code, 200, "{list}");
        let entry = list["items"].as_array().unwrap().iter().find(|t| t["id"] == laptop_id.as_str()).cloned();
        if entry.is_some_and(|e| e["lastUsedAtMs"].is_i64()) {
            break list;
        }
        assert!(Instant::now() < deadline, "the laptop token's use never showed: {list}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 3, "{list}");
    let by_label = |label: &str| items.iter().find(|t| t["label"] == label).unwrap();
    assert_eq!(
        (&by_label("test")["current"], &by_label("laptop")["current"]),
        (&Value::Bool(true), &Value::Bool(false))
    );
    assert!(by_label("test")["lastUsedAtMs"].is_i64(), "the token this listing came with was used: {list}");
    assert!(by_label("spare")["lastUsedAtMs"].is_null(), "never used: {list}");
    let text = list.to_string();
    for secret in
        [laptop.as_str(), &token_hash(&laptop), s.tokens["alice"].as_str(), unused["token"].as_str().unwrap()]
    {
        assert!(!text.contains(secret), "{text}");
    }
    let (_, from_laptop) = s.call_as("GET", &laptop, "/api/v1/users/alice/tokens", None, None);
    let current: Vec<&Value> =
        from_laptop["items"].as_array().unwrap().iter().filter(|t| t["current"] == true).collect();
    assert_eq!(current.len(), 1);
    assert_eq!(current[0]["id"], laptop_id.as_str());
    // bob may not; alice revokes her own, with another of hers.
    assert_eq!(s.call("GET", "bob", "/api/v1/users/alice/tokens", None, None).0, 403);
    assert_eq!(
        s.call("DELETE", "bob", &format!("/api/v1/users/alice/tokens/{laptop_id}"), None, None).0,
        403
    );
    assert_eq!(
        s.call("DELETE", "alice", &format!("/api/v1/users/alice/tokens/{laptop_id}"), None, None).0,
        204
    );
    assert_eq!(s.call_as("GET", &laptop, "/api/v1/whoami", None, None).0, 401);
    let (_, after) = s.call("GET", "alice", "/api/v1/users/alice/tokens", None, None);
    assert_eq!(after["items"].as_array().unwrap().len(), 2, "{after}");
}

/// A list shows what each task asks for and since when it is in its status, filters GPU tasks from CPU-only
/// ones (`accelerator`, any case; anything else a 400), and takes several project groups at once.
#[test]
fn lists_show_demand_and_filter_by_accelerator_and_groups() {
    let (s, _) = server_with(&[], trainyard_api::HttpLimits::default(), false, 600_000);
    let with_gpus = CATALOG
        .replace("instanceSpecs: [cpu.small]}}", "instanceSpecs: [cpu.small]}, gpu: {cluster: local, instanceSpecs: [gpu.a]}}")
        .replace("instanceSpecs: {cpu.small:", "instanceSpecs: {gpu.a: {kind: GPU, gpus: 1, gpuModel: A100, vcpus: 4, memoryMib: 8192}, cpu.small:")
        .replace("nodes: {", "nodes: {gpu-0: {pool: gpu, gpus: 8, gpuModel: A100, vcpus: 64, memoryMib: 524288}, ")
        .replace("quotas:\n", "quotas:\n  - {group: nlp, resourceType: Reserved, pool: gpu, spec: gpu.a, units: 8}\n");
    let (code, c) = s.call("PUT", "root", "/api/v1/admin/catalog", Some(&with_gpus), None);
    assert_eq!(code, 200, "{c}");
    let create = |who: &str, body: &str| -> String {
        let (code, t) = s.call("POST", who, "/api/v1/tasks", Some(body), None);
        assert_eq!(code, 201, "{t}");
        t["id"].as_str().unwrap().to_owned()
    };
    let gpu_body = task("gpu", "nlp", false, "").replace(
        "pool: default, workers: 1, instanceSpecs: [{spec: cpu.small}]",
        "pool: gpu, workers: 2, instanceSpecs: [{spec: gpu.a}]",
    );
    let gpu = create("alice", &gpu_body);
    let cpu = create("alice", &task("cpu", "nlp", false, ""));
    let cv = create("carol", &task("cv", "cv", false, ""));
    let ids = |who: &str, query: &str| -> Vec<String> {
        let (code, page) = s.call("GET", who, &format!("/api/v1/tasks?sort=oldest&{query}"), None, None);
        assert_eq!(code, 200, "{query}: {page}");
        page["items"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(ids("root", "accelerator=gpu"), [gpu.as_str()]);
    assert_eq!(ids("root", "accelerator=CPU"), [cpu.as_str(), cv.as_str()]);
    assert_eq!(ids("root", "accelerator=cpu&group=cv"), [cv.as_str()]);
    assert_eq!(ids("root", "group=nlp,cv"), [gpu.as_str(), cpu.as_str(), cv.as_str()]);
    assert_eq!(ids("root", "group=cv,,nope"), [cv.as_str()]);
    assert_eq!(ids("alice", "group=nlp,cv"), [gpu.as_str(), cpu.as_str()], "carol's task is private to her");
    let (code, p) = s.call("GET", "root", "/api/v1/tasks?accelerator=tpu", None, None);
    assert_eq!(code, 400, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("gpu, cpu"), "{p}");
    let many = (0..65).map(|i| format!("g{i}")).collect::<Vec<_>>().join(",");
    assert_eq!(s.call("GET", "root", &format!("/api/v1/tasks?group={many}"), None, None).0, 400);
    // The demand of the first option, by shape: a master and two workers of one GPU each.
    let (_, page) = s.call("GET", "root", "/api/v1/tasks?sort=oldest", None, None);
    let items = page["items"].as_array().unwrap();
    assert_eq!(
        items[0]["demand"],
        serde_json::json!({"shapes": [{"replicas": 3, "gpus": 1, "vcpus": 4, "memoryMib": 8192}], "options": 1, "accelerator": "gpu"})
    );
    assert_eq!(
        items[1]["demand"]["shapes"],
        serde_json::json!([{"replicas": 2, "gpus": 0, "vcpus": 1, "memoryMib": 1024}])
    );
    assert!(items.iter().all(|t| t["statusSinceMs"].as_i64() >= t["createdAtMs"].as_i64()), "{page}");
    // Once running, since when it runs.
    let running = s.wait_status(&gpu, "Running");
    assert!(
        running["runStartedAtMs"].as_i64().unwrap() >= running["createdAtMs"].as_i64().unwrap(),
        "{running}"
    );
    assert_eq!(running["runStartedAtMs"], running["statusSinceMs"], "{running}");
    // A bulk delete takes the filter too.
    let (code, d) = s.call("DELETE", "root", "/api/v1/tasks?accelerator=cpu&group=cv", None, None);
    assert_eq!(code, 200, "{d}");
    assert_eq!(ids("root", ""), [gpu, cpu]);
}

/// Issue 29, finding High 2, at the API and the launch: a registry login is handed to a launch only for the
/// catalog presets offered to the task's group and the groups the login names; a member reads only the
/// catalog entries offered to their groups (an admin reads it whole).
#[test]
fn a_registry_login_goes_only_to_the_tasks_it_serves_and_members_read_their_part_of_the_catalog() {
    let s = server();
    let catalog = CATALOG.replace(
        "images: {host: {torch: true, ray: true, projectGroups: [nlp, cv]}, cv-only: {projectGroups: [cv]}}",
        "images: {host: {torch: true, ray: true, projectGroups: [nlp, cv]}, cv-only: {projectGroups: [cv]}, \
         nlp-private: {reference: \"reg.example/nlp/private:1\", projectGroups: [nlp]}}\n\
         allowExternalImages: true\nregistries: {reg.example: {}, other.example: {}}",
    );
    let (code, body) = s.call("PUT", "root", "/api/v1/admin/catalog", Some(&catalog), None);
    assert_eq!(code, 200, "{body}");
    for (host, login) in [
        ("reg.example", json!({"username": "ci", "password": "reg-secret"})),
        ("other.example", json!({"username": "cv-bot", "password": "other-secret", "projectGroups": ["cv"]})),
    ] {
        let path = format!("/api/v1/admin/registries/{host}/login");
        let (code, body) = s.call("PUT", "root", &path, Some(&login.to_string()), None);
        assert_eq!(code, 204, "{body}");
    }
    let launch = |who: &str, group: &str, image: &str| -> Vec<(String, String)> {
        let body = task("reg", group, false, "").replace("image: host", &format!("image: \"{image}\""));
        let (code, t) = s.call("POST", who, "/api/v1/tasks", Some(&body), None);
        assert_eq!(code, 201, "{t}");
        let id = t["id"].as_str().unwrap().to_owned();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(l) = s.fake.launched().into_iter().find(|l| l.key.task_id == id) {
                return l.registry_logins.iter().map(|(h, l)| (h.clone(), l.password.clone())).collect();
            }
            assert!(Instant::now() < deadline, "{image} of {group} was never launched");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let reg = vec![("reg.example".to_owned(), "reg-secret".to_owned())];
    let other = vec![("other.example".to_owned(), "other-secret".to_owned())];
    // The preset, for the group it is offered to, by its name or its reference.
    assert_eq!(launch("alice", "nlp", "nlp-private"), reg);
    assert_eq!(launch("alice", "nlp", "reg.example/nlp/private:1"), reg);
    // Another group typing the preset's reference, or another image of that registry: no login.
    assert_eq!(launch("carol", "cv", "reg.example/nlp/private:1"), []);
    assert_eq!(launch("alice", "nlp", "reg.example/nlp/other:1"), []);
    // A login that names a group serves any image of its registry for that group only.
    assert_eq!(launch("carol", "cv", "other.example/cv/tools:2"), other);
    assert_eq!(launch("alice", "nlp", "other.example/cv/tools:2"), []);

    // The catalog: carol reads cv's part, alice nlp's, root everything.
    let read = |who: &str| s.call("GET", who, "/api/v1/catalog", None, None).1;
    let names = |v: &Value, what: &str| v[what].as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    let carols = read("carol");
    assert_eq!(names(&carols, "images"), ["cv-only", "host"], "{carols}");
    assert_eq!(carols["images"]["host"]["projectGroups"], json!(["cv"]), "no other group's name: {carols}");
    assert_eq!(names(&carols, "volumes"), ["shared"]);
    assert_eq!(names(&carols, "datasets"), ["alpaca"]);
    assert_eq!(names(&carols, "models"), ["llama"]);
    assert_eq!(names(&carols, "projectGroups"), ["cv"]);
    assert_eq!(carols["quotas"].as_array().unwrap().len(), 1, "{carols}");
    assert!(!carols.to_string().contains("nlp"), "{carols}");
    let alices = read("alice");
    assert_eq!(names(&alices, "images"), ["host", "nlp-private"], "{alices}");
    assert_eq!(names(&alices, "volumes"), ["ckpt", "shared"]);
    let roots = read("root");
    assert_eq!(names(&roots, "images"), ["cv-only", "host", "nlp-private"], "{roots}");
    assert_eq!(names(&roots, "projectGroups"), ["cv", "nlp"]);
}

/// A full disk under the store, for real (a small tmpfs; mounting one needs root, and without it the test
/// says so and does nothing): a create answers 507 saying the disk is full and what to do (it answered a
/// 500 "stored data is corrupt"), `/healthz` answers 503 with the reason (it answered 200), and once space
/// is freed the same server creates again and is healthy, with no restart.
#[test]
fn a_full_disk_answers_507_and_fails_the_health_check_until_space_is_freed() {
    let dir = std::env::temp_dir().join(format!("trainyard-api-full-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(&dir)
        .output();
    if !mounted.as_ref().is_ok_and(|o| o.status.success()) {
        eprintln!(
            "SKIPPED: filling a disk for real needs a small tmpfs, and mounting one needs root ({mounted:?})"
        );
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(dir.clone());
    let (s, _) = server_at(&dir, &[], trainyard_api::HttpLimits::default(), false, 60_000);
    let (code, body) = s.call("GET", "alice", "/healthz", None, None);
    assert_eq!((code, body), (200, Value::String("ok".into())));
    let (code, t) = s.call("POST", "alice", "/api/v1/tasks", Some(&task("before", "nlp", false, "")), None);
    assert_eq!(code, 201, "{t}");

    let mut filler = std::fs::File::create(dir.join("filler")).unwrap();
    for chunk in [64 * 1024, 4096, 512, 1] {
        let bytes = vec![7u8; chunk];
        while std::io::Write::write_all(&mut filler, &bytes).is_ok() {}
    }
    drop(filler);
    // A task with a large env value, so its create needs pages the full disk cannot give.
    let big = format!(r#", {{name: PAD, value: "{}"}}"#, "x".repeat(30_000));
    let mut refused = None;
    for i in 0..4 {
        let (code, p) = s.call(
            "POST",
            "alice",
            "/api/v1/tasks",
            Some(&task(&format!("full{i}"), "nlp", false, &big)),
            None,
        );
        if code != 201 {
            refused = Some((code, p));
            break;
        }
    }
    let (code, p) = refused.expect("a create on a full disk fails");
    assert_eq!(code, 507, "{p}");
    assert_eq!(p["type"], "https://trainyard.dev/problems/insufficient-storage", "{p}");
    let detail = p["detail"].as_str().unwrap();
    assert!(detail.contains("full") && detail.contains("free space") && !detail.contains("corrupt"), "{p}");
    let (code, h) = s.call("GET", "alice", "/healthz", None, None);
    assert_eq!(code, 503, "{h}");
    assert!(h["detail"].as_str().unwrap().contains("full"), "{h}");

    std::fs::remove_file(dir.join("filler")).unwrap();
    let (code, t) = s.call("POST", "alice", "/api/v1/tasks", Some(&task("after", "nlp", false, &big)), None);
    assert_eq!(code, 201, "a create once space is freed: {t}");
    let (code, body) = s.call("GET", "alice", "/healthz", None, None);
    assert_eq!((code, body), (200, Value::String("ok".into())));
}
