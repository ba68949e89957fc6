//! Every operation of the OpenAPI document, called for real on a server with realistic data (tasks of both
//! types queued, running, ended and deleted, events, replicas, users, tokens, TaskEnv, alarms, quota, the
//! catalog): each answer's body must validate against the schema the document gives for its status and
//! content type, and every operation must have been answered with its success status and an error.
//!
//! The validator (`json_schema`) covers the part of JSON Schema the document uses, and refuses any keyword it
//! does not know, so a schema cannot pass by using something it skips.

// Tests set up the store directly (users, tokens, tasks in given states) before asking the API.
#![allow(clippy::disallowed_methods)]

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use trainyard_api::backends::AnyBackend;
use trainyard_api::openapi::OPERATIONS;
use trainyard_api::{AppState, new_token, token_hash};
use trainyard_control::secrets::SecretBox;
use trainyard_core::Catalog;
use trainyard_runtime::fake::{FakeBackend, Script};
use trainyard_sched::Config;
use trainyard_store::{Store, User};

const CATALOG: &str = r#"
regions: {local: {displayName: Local}}
clusters: {local: {region: local, context: local-admin}}
pools: {default: {cluster: local, instanceSpecs: [cpu.small]}}
instanceSpecs: {cpu.small: {kind: CPU, vcpus: 1, memoryMib: 1024}}
nodes: {node-0: {pool: default, vcpus: 16, memoryMib: 65536}}
projectGroups: {nlp: {displayName: Language}, cv: {}}
images: {host: {torch: true, ray: true, projectGroups: [nlp, cv]}, cv-only: {projectGroups: [cv]}}
registries: {ghcr.io: {mirrors: ["mirror.example:5000"], caBundle: /etc/trainyard/ca.pem}, "localhost:5000": {insecure: true}}
volumes: {ckpt: {projectGroups: [nlp]}, shared: {multiPodReadWrite: true}}
datasets: {alpaca: {projectGroups: [cv]}}
models: {llama: {path: /srv/models/llama}}
labels: {validation: false, maintained: {team: [search, vision]}}
quotas:
  - {group: nlp, resourceType: Reserved, pool: default, spec: cpu.small, units: 8}
  - {group: cv, resourceType: Reserved, pool: default, spec: cpu.small, units: 8}
"#;

mod json_schema;
use json_schema::Validator;

// ---------------------------------------------------------------------------------------------------------
// The server and the calls.

struct Server {
    base: String,
    fake: FakeBackend,
    tokens: BTreeMap<&'static str, String>,
    _rt: tokio::runtime::Runtime,
}

fn server() -> Server {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = std::env::temp_dir().join(format!(
        "trainyard-openapi-{}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("t.db").display());
    // Tasks run for a minute unless scripted otherwise, so some are seen running, with a placement.
    let fake = FakeBackend::new(Script { start_ms: 50, run_ms: 60_000, ..Script::default() });
    let (base, tokens) = rt.block_on(async {
        let store = Store::connect(&url).await.unwrap();
        let mut tokens = BTreeMap::new();
        for (name, role, groups) in [
            ("alice", "member", vec!["nlp"]),
            ("bob", "member", vec!["nlp"]),
            ("carol", "member", vec!["cv"]),
            ("root", "admin", vec![]),
        ] {
            let groups = groups.iter().map(|g| g.to_string()).collect();
            store.put_user(&User { name: name.into(), role: role.into(), groups }, 0).await.unwrap();
            let token = new_token().unwrap();
            store.add_token(&token_hash(&token), name, "test", 0).await.unwrap();
            tokens.insert(name, token);
        }
        let catalog = Catalog::from_yaml(CATALOG).unwrap();
        let secrets = SecretBox::generate().unwrap();
        let mut state =
            AppState::new(store, catalog, AnyBackend::Fake(fake.clone()), secrets, Config::default());
        state.workdirs = Some(trainyard_workdir::store::Store::new(dir.join("workdirs")));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(trainyard_api::serve(listener, state));
        (base, tokens)
    });
    Server { base, fake, tokens, _rt: rt }
}

/// One answer as it came.
struct Answer {
    status: u16,
    content_type: String,
    text: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }
}

/// Calls the server and checks every answer against the document.
struct Checker {
    server: Server,
    doc: Value,
    agent: ureq::Agent,
    /// (method, path template) -> statuses seen.
    seen: BTreeMap<(String, String), BTreeSet<u16>>,
}

impl Checker {
    fn new() -> Checker {
        let server = server();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into();
        let text = agent
            .get(&format!("{}/api/openapi.json", server.base))
            .call()
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap();
        let doc: Value = serde_json::from_str(&text).unwrap();
        Checker { server, doc, agent, seen: BTreeMap::new() }
    }

    fn raw(&self, method: &str, who: &str, path: &str, body: Option<&str>, key: Option<&str>) -> Answer {
        let url = format!("{}{path}", self.server.base);
        let token = self.server.tokens.get(who).map_or(who, |t| t.as_str());
        let auth = format!("Bearer {token}");
        let a = &self.agent;
        let mut resp = match (method, body) {
            ("get", _) => a.get(&url).header("Authorization", &auth).call(),
            ("delete", _) => a.delete(&url).header("Authorization", &auth).call(),
            ("put", b) => a.put(&url).header("Authorization", &auth).send(b.unwrap_or("").as_bytes()),
            ("post", None) => a.post(&url).header("Authorization", &auth).send_empty(),
            (_, b) => {
                let mut req = a.post(&url).header("Authorization", &auth);
                if let Some(k) = key {
                    req = req.header("Idempotency-Key", k);
                }
                req.send(b.unwrap_or("").as_bytes())
            }
        }
        .unwrap();
        let status = resp.status().as_u16();
        let content_type =
            resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
        Answer { status, content_type, text: resp.body_mut().read_to_string().unwrap() }
    }

    /// Calls `op` (`"get /api/v1/tasks/{id}"`) on `path` as `who`, checks the answer against the document
    /// (its status must be documented, its body valid for the content type) and returns it.
    fn call(&mut self, op: &str, path: &str, who: &str, body: Option<&str>) -> Answer {
        self.call_keyed(op, path, who, body, None)
    }

    fn call_keyed(
        &mut self,
        op: &str,
        path: &str,
        who: &str,
        body: Option<&str>,
        key: Option<&str>,
    ) -> Answer {
        let (method, template) = op.split_once(' ').unwrap();
        let answer = self.raw(method, who, path, body, key);
        let documented = &self.doc["paths"][template][method];
        assert!(documented.is_object(), "{op} is not in the document");
        let response = &documented["responses"][answer.status.to_string()];
        assert!(
            response.is_object(),
            "{op} answered {} ({}), which the document does not list: {}",
            answer.status,
            path,
            answer.text
        );
        let media = answer.content_type.split(';').next().unwrap_or("").trim().to_owned();
        match response.get("content") {
            None => assert!(
                answer.text.is_empty(),
                "{op} {}: the document says no body: {}",
                answer.status,
                answer.text
            ),
            Some(content) => {
                let schema = &content[&media]["schema"];
                assert!(
                    schema.is_object(),
                    "{op} {}: content type {media:?} is not documented",
                    answer.status
                );
                let value =
                    if media.ends_with("json") { answer.json() } else { Value::String(answer.text.clone()) };
                let errors = Validator { doc: &self.doc }.errors(schema, &value, "$");
                assert!(
                    errors.is_empty(),
                    "{op} {} ({path}): the body breaks its schema:\n{}\n{value:#}",
                    answer.status,
                    errors.join("\n")
                );
            }
        }
        self.seen.entry((method.to_owned(), template.to_owned())).or_default().insert(answer.status);
        answer
    }

    /// Calls until `done` holds of the answer (the control loop moves things on its own time).
    fn until(&mut self, op: &str, path: &str, who: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let v = self.call(op, path, who, None).json();
            if done(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "{op} {path} never got there: {v}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn task(prefix: &str, group: &str, kind: &str, extra_env: &str) -> String {
    format!(
        r#"apiVersion: trainyard.dev/v1
kind: TrainingTask
metadata: {{namePrefix: {prefix}, projectGroup: {group}, public: true, labels: {{team: search}}, description: "a test"}}
spec:
  type: {kind}
  placement: {{region: local, cluster: local}}
  environment:
    image: host
    cmd: python3 train.py
    env: [{{name: LR, value: "3e-4"}}{extra_env}]
  compute: {{resourceType: Reserved, pool: default, workers: 1, instanceSpecs: [{{spec: cpu.small}}]}}
  advanced:
    faultTolerance: {{enabled: true, maxResubmissions: 1}}
    alarms: [{{events: [failed], webhook: "https://93.184.215.14/hook"}}]
"#
    )
}

fn id(v: &Value) -> String {
    v["id"].as_str().unwrap().to_owned()
}

const TASKS: &str = "post /api/v1/tasks";
const TASK: &str = "get /api/v1/tasks/{id}";

#[test]
fn every_answer_matches_its_documented_schema() {
    let mut c = Checker::new();
    let hidden = r#", {name: API_KEY, value: "alice-secret", hidden: true}"#;

    // The cluster first: a cordoned node keeps new tasks queued, with a position and a reason.
    c.call("get /api/v1/catalog", "/api/v1/catalog", "alice", None);
    let node = "put /api/v1/admin/nodes/{node}";
    assert_eq!(
        c.call(node, "/api/v1/admin/nodes/node-0", "root", Some(r#"{"schedulable": false}"#)).status,
        204
    );
    assert_eq!(
        c.call(node, "/api/v1/admin/nodes/nope", "root", Some(r#"{"schedulable": true}"#)).status,
        404
    );
    assert_eq!(c.call(node, "/api/v1/admin/nodes/node-0", "root", Some("{}")).status, 400);
    assert_eq!(c.call(node, "/api/v1/admin/nodes/node-0", "alice", Some("{}")).status, 403);

    // The images a user's tasks ran (none yet), and another user's (refused).
    let recent = "get /api/v1/users/{name}/images";
    assert_eq!(c.call(recent, "/api/v1/users/alice/images", "alice", None).status, 200);
    assert_eq!(c.call(recent, "/api/v1/users/nobody-here/images", "root", None).status, 404);

    // The image cache (this backend keeps none) and registry logins.
    let images = "get /api/v1/admin/images";
    assert_eq!(c.call(images, "/api/v1/admin/images", "root", None).status, 200);
    assert_eq!(c.call(images, "/api/v1/admin/images", "alice", None).status, 403);
    let prune = "post /api/v1/admin/images/prune";
    assert_eq!(c.call(prune, "/api/v1/admin/images/prune", "root", None).status, 200);
    assert_eq!(c.call(prune, "/api/v1/admin/images/prune", "alice", None).status, 403);
    let login = "put /api/v1/admin/registries/{host}/login";
    let at = "/api/v1/admin/registries/registry.example:5000/login";
    assert_eq!(c.call(login, at, "root", Some(r#"{"username": "ci", "password": "s3cret"}"#)).status, 204);
    let with_groups = r#"{"username": "ci", "password": "s3cret", "projectGroups": ["nlp"]}"#;
    assert_eq!(c.call(login, at, "root", Some(with_groups)).status, 204);
    let unknown_group = r#"{"username": "ci", "password": "s3cret", "projectGroups": ["nope"]}"#;
    assert_eq!(c.call(login, at, "root", Some(unknown_group)).status, 400);
    assert_eq!(c.call(login, at, "root", Some(r#"{"username": "", "password": ""}"#)).status, 400);
    assert_eq!(c.call(login, at, "alice", Some(r#"{"username": "a", "password": "b"}"#)).status, 403);
    let logins = "get /api/v1/admin/registries";
    let listed = c.call(logins, "/api/v1/admin/registries", "root", None);
    assert_eq!(listed.status, 200);
    assert!(
        listed.text.contains("registry.example:5000") && !listed.text.contains("s3cret"),
        "{}",
        listed.text
    );
    assert_eq!(listed.json()["items"][0]["projectGroups"], serde_json::json!(["nlp"]), "{}", listed.text);
    assert_eq!(c.call(logins, "/api/v1/admin/registries", "alice", None).status, 403);
    let unset = "delete /api/v1/admin/registries/{host}/login";
    assert_eq!(c.call(unset, at, "root", None).status, 204);
    assert_eq!(c.call(unset, at, "root", None).status, 404);

    // Tasks of both types, a replayed create, and refusals.
    let body = task("torch", "nlp", "PyTorchJob", hidden);
    let torch = c.call_keyed(TASKS, "/api/v1/tasks", "alice", Some(&body), Some("k-1"));
    assert_eq!(torch.status, 201, "{}", torch.text);
    let torch = id(&torch.json());
    assert_eq!(c.call_keyed(TASKS, "/api/v1/tasks", "alice", Some(&body), Some("k-1")).status, 200);
    assert_eq!(
        c.call_keyed(TASKS, "/api/v1/tasks", "alice", Some(&task("x", "nlp", "PyTorchJob", "")), Some("k-1"))
            .status,
        409
    );
    assert_eq!(c.call_keyed(TASKS, "/api/v1/tasks", "alice", Some(&body), Some(" ")).status, 400);
    assert_eq!(c.call(TASKS, "/api/v1/tasks", "alice", Some("spec: {}")).status, 422);
    assert_eq!(c.call(TASKS, "/api/v1/tasks", "carol", Some(&body)).status, 403);
    let ray = c.call(TASKS, "/api/v1/tasks", "alice", Some(&task("ray", "nlp", "RayJob", "")));
    assert_eq!(ray.status, 201, "{}", ray.text);
    let ray = id(&ray.json());
    let short =
        id(&c.call(TASKS, "/api/v1/tasks", "bob", Some(&task("short", "nlp", "PyTorchJob", ""))).json());
    let doomed =
        id(&c.call(TASKS, "/api/v1/tasks", "carol", Some(&task("doomed", "cv", "RayJob", ""))).json());
    c.server.fake.script(&short, vec![Script { start_ms: 0, run_ms: 50, ..Script::default() }]);
    let queued = c.until(TASK, &format!("/api/v1/tasks/{torch}"), "alice", |t| t["queue"].is_object());
    assert!(queued["queue"]["reason"].as_str().unwrap().contains("no schedulable"), "{queued}");

    // The API's settings: alice, with her two queued tasks, is at a cap of 2 (a 429 that says so).
    // The servers on the store: alone on SQLite, this one leads without a lease; admins only.
    let get_server = "get /api/v1/server";
    let servers = c.call(get_server, "/api/v1/server", "root", None).json();
    assert_eq!(servers["elected"], false, "{servers}");
    assert_eq!(servers["leader"]["server"], servers["thisServer"], "{servers}");
    assert_eq!(c.call(get_server, "/api/v1/server", "alice", None).status, 403);
    // Its boards (what followers copy): the queued task's place is on them; asked again as of their version,
    // unchanged; members are refused.
    let get_boards = "get /api/v1/server/boards";
    let boards = c.call(get_boards, "/api/v1/server/boards", "root", None).json();
    assert!(boards["queued"].as_array().unwrap().iter().any(|q| q["taskId"] == torch.as_str()), "{boards}");
    let since = format!("/api/v1/server/boards?since={}", boards["version"].as_str().unwrap());
    let again = c.call(get_boards, &since, "root", None).json();
    assert!(again["unchanged"] == true || again["version"] != boards["version"], "{again}");
    assert_eq!(c.call(get_boards, "/api/v1/server/boards", "alice", None).status, 403);
    let get_settings = "get /api/v1/admin/settings";
    let put_settings = "put /api/v1/admin/settings";
    let settings = c.call(get_settings, "/api/v1/admin/settings", "root", None).json();
    assert_eq!(settings["maxQueuedTasksPerUser"], 1000, "{settings}");
    assert_eq!(c.call(get_settings, "/api/v1/admin/settings", "alice", None).status, 403);
    let cap = |n: u64| format!(r#"{{"maxQueuedTasksPerUser": {n}}}"#);
    assert_eq!(c.call(put_settings, "/api/v1/admin/settings", "root", Some(&cap(2))).status, 200);
    assert_eq!(c.call(put_settings, "/api/v1/admin/settings", "root", Some(&cap(0))).status, 400);
    assert_eq!(c.call(put_settings, "/api/v1/admin/settings", "alice", Some(&cap(9))).status, 403);
    let over = c.call(TASKS, "/api/v1/tasks", "alice", Some(&task("over", "nlp", "PyTorchJob", "")));
    assert_eq!(over.status, 429, "{}", over.text);
    assert_eq!((over.json()["limit"].as_u64(), over.json()["queued"].as_u64()), (Some(2), Some(2)));
    assert_eq!(c.call(put_settings, "/api/v1/admin/settings", "root", Some(&cap(1000))).status, 200);

    // Checked without creating: valid (demand, admission, fragmentation), and not.
    let validate = "post /api/v1/validate";
    let v = c.call(validate, "/api/v1/validate", "alice", Some(&task("v", "nlp", "RayJob", ""))).json();
    assert!(v["valid"] == true && v["demand"].is_array() && v["fragmentation"].is_array(), "{v}");
    let v = c.call(validate, "/api/v1/validate", "alice", Some(&task("v", "cv", "PyTorchJob", ""))).json();
    assert_eq!(v["admission"]["now"], false, "{v}");
    let v = c.call(validate, "/api/v1/validate", "alice", Some("kind: [")).json();
    assert!(v["valid"] == false && v["task"].is_null(), "{v}");
    assert_eq!(c.call(validate, "/api/v1/validate", "nobody", Some("{}")).status, 401);
    assert_eq!(c.call(validate, "/api/v1/validate", "alice", None).status, 400, "no document");

    // Uncordoned: they run (placement), one ends, and the ended one is resubmitted.
    c.call(node, "/api/v1/admin/nodes/node-0", "root", Some(r#"{"schedulable": true}"#));
    let running = c.until(TASK, &format!("/api/v1/tasks/{ray}"), "alice", |t| t["status"] == "Running");
    assert!(running["placement"]["replicas"].is_array(), "{running}");
    c.until(TASK, &format!("/api/v1/tasks/{torch}"), "alice", |t| t["status"] == "Running");
    c.until(TASK, &format!("/api/v1/tasks/{short}"), "bob", |t| t["status"] == "Succeeded");
    assert_eq!(c.call(TASK, "/api/v1/tasks/nope", "alice", None).status, 404);
    assert_eq!(c.call(TASK, &format!("/api/v1/tasks/{torch}"), "nobody", None).status, 401);
    let resubmit = "post /api/v1/tasks/{id}/resubmit";
    assert_eq!(c.call(resubmit, &format!("/api/v1/tasks/{short}/resubmit"), "bob", None).status, 200);
    assert_eq!(c.call(resubmit, &format!("/api/v1/tasks/{ray}/resubmit"), "alice", None).status, 409);
    assert_eq!(c.call(resubmit, &format!("/api/v1/tasks/{ray}/resubmit"), "carol", None).status, 404);

    // Lists and what a task tells.
    let list = "get /api/v1/tasks";
    c.call(list, "/api/v1/tasks?sort=name", "alice", None);
    let page = c.call(list, "/api/v1/tasks?limit=2", "alice", None).json();
    let cursor = page["nextCursor"].as_str().expect("more than one page").to_owned();
    c.call(list, &format!("/api/v1/tasks?cursor={cursor}"), "alice", None);
    c.call(list, "/api/v1/tasks?status=Running&type=RayJob&labels=team=search&q=ray", "root", None);
    let any_case = c.call(list, "/api/v1/tasks?status=rUnNiNg&type=rayjob", "root", None).json();
    assert!(!any_case["items"].as_array().unwrap().is_empty(), "{any_case}");
    let cpu = c.call(list, "/api/v1/tasks?accelerator=CPU&group=nlp,cv", "root", None).json();
    assert!(!cpu["items"].as_array().unwrap().is_empty(), "{cpu}");
    assert_eq!(c.call(list, "/api/v1/tasks?accelerator=tpu", "alice", None).status, 400);
    assert_eq!(c.call(list, "/api/v1/tasks?status=sideways", "alice", None).status, 400);
    assert_eq!(c.call(list, "/api/v1/tasks?limit=501", "alice", None).status, 400);
    assert_eq!(c.call(list, "/api/v1/tasks?sort=sideways", "alice", None).status, 400);
    assert_eq!(c.call(list, "/api/v1/tasks?limit=many", "alice", None).status, 400);
    let events = "get /api/v1/tasks/{id}/events";
    let ev = c.call(events, &format!("/api/v1/tasks/{short}/events"), "bob", None).json();
    assert!(ev["items"].as_array().unwrap().len() >= 4, "{ev}");
    c.call(events, &format!("/api/v1/tasks/{short}/events?after=2"), "bob", None);
    assert_eq!(c.call(events, "/api/v1/tasks/nope/events", "bob", None).status, 404);
    assert_eq!(c.call(events, &format!("/api/v1/tasks/{short}/events?after=soon"), "bob", None).status, 400);
    let logs = "get /api/v1/tasks/{id}/logs";
    let replicas = c.call(logs, &format!("/api/v1/tasks/{ray}/logs"), "alice", None).json();
    let replica =
        replicas["items"][0]["replicas"][0]["name"].as_str().expect("the ray task's replicas").to_owned();
    // A fake replica runs no process: its log is there and empty; a replica the task lacks is a 404.
    let empty = c.call(logs, &format!("/api/v1/tasks/{ray}/logs?replica={replica}"), "alice", None);
    assert_eq!(empty.status, 200);
    let missing = c.call(logs, &format!("/api/v1/tasks/{ray}/logs?replica={replica}x"), "alice", None);
    assert_eq!(missing.status, 404);
    assert_eq!(c.call(logs, &format!("/api/v1/tasks/{ray}/logs?offset=x"), "alice", None).status, 400);
    // Working directories: checked, their files sent, kept, listed; each refusal as documented.
    let (check, blobs, commit, list) = (
        "post /api/v1/workdirs/check",
        "post /api/v1/workdirs/blobs",
        "post /api/v1/workdirs",
        "get /api/v1/workdirs",
    );
    let content = "print('hi')\n";
    let digest = {
        use sha2::Digest;
        trainyard_workdir::manifest::hex(&sha2::Sha256::digest(content.as_bytes()))
    };
    let upload = |group: &str| {
        serde_json::json!({"projectGroup": group, "manifest": {"entries": [
            {"path": "pkg", "kind": "dir"},
            {"path": "pkg/main.py", "kind": "file", "sha256": digest, "size": content.len()},
            {"path": "main.py", "kind": "link", "target": "pkg/main.py"},
        ]}})
        .to_string()
    };
    let missing = c.call(check, "/api/v1/workdirs/check", "alice", Some(&upload("nlp"))).json();
    assert_eq!(missing["missing"], serde_json::json!([digest]), "{missing}");
    assert_eq!(c.call(check, "/api/v1/workdirs/check", "carol", Some(&upload("nlp"))).status, 403);
    let escape = r#"{"projectGroup": "nlp", "manifest": {"entries": [{"path": "../x", "kind": "dir"}]}}"#;
    assert_eq!(c.call(check, "/api/v1/workdirs/check", "alice", Some(escape)).status, 422);
    assert_eq!(c.call(commit, "/api/v1/workdirs", "alice", Some(&upload("nlp"))).status, 409);
    let tar = {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(content.len() as u64);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, &digest, content.as_bytes()).unwrap();
        String::from_utf8(b.into_inner().unwrap()).unwrap()
    };
    let sent = c.call(blobs, "/api/v1/workdirs/blobs?projectGroup=nlp", "alice", Some(&tar)).json();
    assert_eq!(sent["files"], 1, "{sent}");
    assert_eq!(
        c.call(blobs, "/api/v1/workdirs/blobs?projectGroup=nlp", "alice", Some("not a tar")).status,
        400
    );
    assert_eq!(c.call(blobs, "/api/v1/workdirs/blobs?projectGroup=nlp", "carol", Some(&tar)).status, 403);
    let kept = c.call(commit, "/api/v1/workdirs", "alice", Some(&upload("nlp"))).json();
    assert_eq!((kept["files"].as_u64(), kept["entries"].as_u64()), (Some(1), Some(3)), "{kept}");
    assert_eq!(c.call(commit, "/api/v1/workdirs", "alice", Some(escape)).status, 422);
    let listed = c.call(list, "/api/v1/workdirs", "alice", None).json();
    assert_eq!(listed["items"][0]["id"], kept["id"], "{listed}");
    assert_eq!(c.call(list, "/api/v1/workdirs?projectGroup=nlp", "carol", None).status, 403);
    assert_eq!(c.call(list, "/api/v1/workdirs", "carol", None).json()["items"], serde_json::json!([]));
    // Read back by a member: the manifest, then the files as a tar stream; another group's member, an id that
    // is not one, a token no server made: refused as documented.
    let (one, files) = ("get /api/v1/workdirs/{workdir}", "get /api/v1/workdirs/{workdir}/files");
    let id = kept["id"].as_str().unwrap().to_owned();
    let got = c.call(one, &format!("/api/v1/workdirs/{id}?projectGroup=nlp"), "alice", None).json();
    assert_eq!(got["manifest"]["entries"].as_array().map(Vec::len), Some(3), "{got}");
    let stream = c.call(files, &format!("/api/v1/workdirs/{id}/files?projectGroup=nlp"), "alice", None);
    assert_eq!(stream.status, 200);
    assert!(stream.text.contains(&digest) && stream.text.contains("print('hi')"), "{}", stream.text);
    assert_eq!(c.call(one, &format!("/api/v1/workdirs/{id}?projectGroup=nlp"), "carol", None).status, 403);
    assert_eq!(
        c.call(files, &format!("/api/v1/workdirs/{id}/files?projectGroup=nlp"), "carol", None).status,
        403
    );
    assert_eq!(c.call(one, "/api/v1/workdirs/nope?projectGroup=nlp", "alice", None).status, 404);
    assert_eq!(c.call(one, &format!("/api/v1/workdirs/{id}"), "alice", None).status, 400);
    assert_eq!(
        c.call(files, &format!("/api/v1/workdirs/{}/files?projectGroup=nlp", "0".repeat(64)), "alice", None)
            .status,
        404
    );
    let metrics = "get /api/v1/tasks/{id}/metrics";
    c.call(metrics, &format!("/api/v1/tasks/{ray}/metrics?since=0&name=trainyard_cpu"), "alice", None);
    assert_eq!(c.call(metrics, "/api/v1/tasks/nope/metrics", "alice", None).status, 404);

    // Sharing and cloning (the hidden value must be given again).
    let shares = "post /api/v1/tasks/{id}/shares";
    let share = |user: &str, operate: bool| format!(r#"{{"user": "{user}", "operate": {operate}}}"#);
    assert_eq!(
        c.call(shares, &format!("/api/v1/tasks/{torch}/shares"), "alice", Some(&share("carol", true))).status,
        204
    );
    assert_eq!(
        c.call(shares, &format!("/api/v1/tasks/{torch}/shares"), "alice", Some(r#"{"operate": 1}"#)).status,
        400
    );
    assert_eq!(
        c.call(shares, &format!("/api/v1/tasks/{torch}/shares"), "bob", Some(&share("carol", false))).status,
        403
    );
    // Listed, and a share given then taken back (bob's; carol's stays for the clone below).
    let listed = "get /api/v1/tasks/{id}/shares";
    let on_torch = format!("/api/v1/tasks/{torch}/shares");
    assert_eq!(c.call(shares, &on_torch, "alice", Some(&share("bob", false))).status, 204);
    let entries = c.call(listed, &on_torch, "alice", None).json();
    assert_eq!(entries["items"].as_array().map(Vec::len), Some(2), "{entries}");
    assert_eq!(c.call(listed, "/api/v1/tasks/nope/shares", "alice", None).status, 404);
    let unshare = "delete /api/v1/tasks/{id}/shares/{user}";
    assert_eq!(c.call(unshare, &format!("{on_torch}/bob"), "alice", None).status, 204);
    assert_eq!(c.call(unshare, &format!("{on_torch}/bob"), "alice", None).status, 404, "taken back already");
    let clone = "post /api/v1/tasks/{id}/clone";
    let path = format!("/api/v1/tasks/{torch}/clone");
    assert_eq!(c.call(clone, &path, "carol", None).status, 403, "into nlp, not hers");
    assert_eq!(c.call(clone, &path, "carol", Some(r#"{"projectGroup": "cv"}"#)).status, 422);
    let copy =
        c.call(clone, &path, "carol", Some(r#"{"projectGroup": "cv", "hiddenValues": {"API_KEY": "c"}}"#));
    assert_eq!(copy.status, 201, "{}", copy.text);
    assert_eq!(c.call(clone, "/api/v1/tasks/nope/clone", "carol", None).status, 404);

    // Stop and delete.
    let stop = "post /api/v1/tasks/{id}/stop";
    assert_eq!(c.call(stop, &format!("/api/v1/tasks/{torch}/stop"), "alice", None).status, 200);
    c.until(TASK, &format!("/api/v1/tasks/{torch}"), "alice", |t| t["status"] == "Stopped");
    assert_eq!(c.call(stop, &format!("/api/v1/tasks/{torch}/stop"), "alice", None).status, 409);
    assert_eq!(c.call(stop, &format!("/api/v1/tasks/{ray}/stop"), "bob", None).status, 403);
    let delete = "delete /api/v1/tasks/{id}";
    assert_eq!(c.call(delete, &format!("/api/v1/tasks/{doomed}"), "carol", None).status, 204);
    assert_eq!(c.call(delete, &format!("/api/v1/tasks/{doomed}"), "carol", None).status, 204, "again");
    let gone = c.call(TASK, &format!("/api/v1/tasks/{doomed}"), "carol", None).json();
    assert_eq!(gone["deleted"], true, "{gone}");
    assert_eq!(c.call(delete, "/api/v1/tasks/nope", "carol", None).status, 404);
    let bulk = "delete /api/v1/tasks";
    let done = c.call(bulk, "/api/v1/tasks?q=torch&status=stopped", "alice", None).json();
    assert_eq!(
        (done["deleted"].as_u64(), done["ids"][0].as_str()),
        (Some(1), Some(torch.as_str())),
        "{done}"
    );
    assert_eq!(c.call(bulk, "/api/v1/tasks", "alice", None).status, 400, "no filter");
    assert_eq!(c.call(bulk, "/api/v1/tasks?status=Lost", "alice", None).status, 400);
    assert_eq!(c.call(delete, &format!("/api/v1/tasks/{ray}"), "carol", None).status, 404, "not hers to see");

    // Quota, the catalog replaced.
    let quota = c.call("get /api/v1/quota", "/api/v1/quota", "root", None).json();
    assert_eq!(quota["items"].as_array().unwrap().len(), 2, "{quota}");
    c.call("get /api/v1/quota", "/api/v1/quota", "alice", None);
    assert_eq!(c.call("get /api/v1/quota", "/api/v1/quota", "nobody", None).status, 401);
    let put_catalog = "put /api/v1/admin/catalog";
    let refused = c.call(put_catalog, "/api/v1/admin/catalog?force=false", "root", Some("{}"));
    assert_eq!(refused.status, 409, "the ray task runs: {}", refused.text);
    assert!(!refused.json()["conflicts"].as_array().unwrap().is_empty(), "{}", refused.text);
    assert_eq!(c.call(put_catalog, "/api/v1/admin/catalog", "root", Some(CATALOG)).status, 200);
    assert_eq!(c.call(put_catalog, "/api/v1/admin/catalog", "root", Some("regions: 3")).status, 400);
    assert_eq!(c.call(put_catalog, "/api/v1/admin/catalog", "alice", Some(CATALOG)).status, 403);
    c.call("get /api/v1/catalog", "/api/v1/catalog", "nobody", None);

    // Users, tokens, accounts.
    c.call("get /api/v1/whoami", "/api/v1/whoami", "alice", None);
    c.call("get /api/v1/whoami", "/api/v1/whoami", "nobody", None);
    let users = "post /api/v1/admin/users";
    let erin = r#"{"name": "erin", "role": "member", "groups": ["cv"]}"#;
    assert_eq!(c.call(users, "/api/v1/admin/users", "root", Some(erin)).status, 200);
    assert_eq!(
        c.call(users, "/api/v1/admin/users", "root", Some(r#"{"name": "x", "role": "boss"}"#)).status,
        400
    );
    assert_eq!(c.call(users, "/api/v1/admin/users", "alice", Some(erin)).status, 403);
    c.call("get /api/v1/admin/users", "/api/v1/admin/users", "root", None);
    c.call("get /api/v1/admin/users", "/api/v1/admin/users", "alice", None);
    let tokens = "post /api/v1/users/{name}/tokens";
    let made = c.call(tokens, "/api/v1/users/erin/tokens", "root", Some(r#"{"label": "laptop"}"#));
    assert_eq!(made.status, 201);
    let token_id = made.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(c.call(tokens, "/api/v1/users/alice/tokens", "alice", None).status, 201, "no body: no label");
    assert_eq!(c.call(tokens, "/api/v1/users/ghost/tokens", "root", None).status, 404);
    assert_eq!(c.call(tokens, "/api/v1/users/erin/tokens", "alice", None).status, 403);
    let list_tokens = "get /api/v1/users/{name}/tokens";
    c.call(list_tokens, "/api/v1/users/erin/tokens", "root", None);
    assert_eq!(c.call(list_tokens, "/api/v1/users/ghost/tokens", "root", None).status, 404);
    let revoke = "delete /api/v1/users/{name}/tokens/{token}";
    assert_eq!(c.call(revoke, &format!("/api/v1/users/erin/tokens/{token_id}"), "root", None).status, 204);
    assert_eq!(c.call(revoke, &format!("/api/v1/users/erin/tokens/{token_id}"), "root", None).status, 404);
    let disable = "post /api/v1/admin/users/{name}/disable";
    let enable = "post /api/v1/admin/users/{name}/enable";
    // bob's work goes on (his task is read later); with no body, queued work would be held and running work
    // stopped.
    let keep = Some(r#"{"queued": "keep", "running": "keep"}"#);
    assert_eq!(c.call(disable, "/api/v1/admin/users/bob/disable", "root", keep).status, 204);
    assert_eq!(c.call("get /api/v1/whoami", "/api/v1/whoami", "bob", None).status, 403, "disabled");
    assert_eq!(c.call(disable, "/api/v1/admin/users/root/disable", "root", None).status, 409);
    assert_eq!(c.call(disable, "/api/v1/admin/users/ghost/disable", "root", None).status, 404);
    assert_eq!(
        c.call(disable, "/api/v1/admin/users/bob/disable", "root", Some(r#"{"queued": "later"}"#)).status,
        400
    );
    assert_eq!(c.call(disable, "/api/v1/admin/users/bob/disable", "alice", None).status, 403);
    let listed = c.call("get /api/v1/admin/users", "/api/v1/admin/users", "root", None).json();
    let bob = listed["items"].as_array().unwrap().iter().find(|u| u["name"] == "bob").unwrap().clone();
    assert_eq!(
        (&bob["disabled"], &bob["deleted"], &bob["workHeld"]),
        (&Value::Bool(true), &false.into(), &false.into())
    );
    assert_eq!(c.call(enable, "/api/v1/admin/users/bob/enable", "root", None).status, 204);
    assert_eq!(c.call(enable, "/api/v1/admin/users/ghost/enable", "root", None).status, 404);
    // A user with no work, deleted: tokens gone (401), the name retired.
    let delete = "post /api/v1/admin/users/{name}/delete";
    assert_eq!(c.call(delete, "/api/v1/admin/users/erin/delete", "alice", None).status, 403);
    assert_eq!(c.call(delete, "/api/v1/admin/users/root/delete", "root", None).status, 409);
    assert_eq!(
        c.call(delete, "/api/v1/admin/users/erin/delete", "root", Some(r#"{"queued": "stop"}"#)).status,
        204
    );
    assert_eq!(
        c.call(delete, "/api/v1/admin/users/erin/delete", "root", None).status,
        409,
        "deleted already"
    );
    assert_eq!(c.call(delete, "/api/v1/admin/users/ghost/delete", "root", None).status, 404);
    assert_eq!(c.call(enable, "/api/v1/admin/users/erin/enable", "root", None).status, 409);
    assert_eq!(
        c.call(users, "/api/v1/admin/users", "root", Some(erin)).status,
        409,
        "the name is not reused"
    );
    assert_eq!(c.call(tokens, "/api/v1/users/erin/tokens", "root", None).status, 404);
    let listed = c.call("get /api/v1/admin/users", "/api/v1/admin/users", "root", None).json();
    let erin = listed["items"].as_array().unwrap().iter().find(|u| u["name"] == "erin").unwrap().clone();
    assert_eq!((&erin["deleted"], &erin["workHeld"]), (&Value::Bool(true), &true.into()));

    // TaskEnv and alarms.
    let put_env = "put /api/v1/users/{name}/env";
    assert_eq!(
        c.call(
            put_env,
            "/api/v1/users/alice/env",
            "alice",
            Some(r#"{"name": "WANDB", "value": "k", "hidden": true}"#)
        )
        .status,
        204
    );
    assert_eq!(
        c.call(
            put_env,
            "/api/v1/users/alice/env",
            "alice",
            Some(r#"{"name": "HF_HOME", "value": "/mnt/hf"}"#)
        )
        .status,
        204
    );
    assert_eq!(
        c.call(put_env, "/api/v1/users/alice/env", "alice", Some(r#"{"name": "BAD NAME", "value": "x"}"#))
            .status,
        422
    );
    assert_eq!(c.call(put_env, "/api/v1/users/alice/env", "alice", Some(r#"{"value": "x"}"#)).status, 400);
    assert_eq!(
        c.call(put_env, "/api/v1/users/ghost/env", "root", Some(r#"{"name": "X", "value": "x"}"#)).status,
        404
    );
    let env = c.call("get /api/v1/users/{name}/env", "/api/v1/users/alice/env", "alice", None).json();
    assert_eq!(env["items"].as_array().unwrap().len(), 2, "{env}");
    assert_eq!(c.call("get /api/v1/users/{name}/env", "/api/v1/users/alice/env", "bob", None).status, 403);
    let del_env = "delete /api/v1/users/{name}/env/{var}";
    assert_eq!(c.call(del_env, "/api/v1/users/alice/env/HF_HOME", "alice", None).status, 204);
    assert_eq!(c.call(del_env, "/api/v1/users/alice/env/HF_HOME", "alice", None).status, 404);
    let put_alarms = "put /api/v1/users/{name}/alarms";
    let subs = r#"[{"events": ["succeeded", "queuedTooLong"], "webhook": "https://93.184.215.14/h", "queuedThresholdSeconds": 60}, {"events": ["failed"], "webhook": "https://93.184.215.14/f"}]"#;
    assert_eq!(c.call(put_alarms, "/api/v1/users/alice/alarms", "alice", Some(subs)).status, 204);
    assert_eq!(
        c.call(
            put_alarms,
            "/api/v1/users/alice/alarms",
            "alice",
            Some(r#"[{"events": ["failed"], "webhook": "ftp://x"}]"#)
        )
        .status,
        422
    );
    assert_eq!(c.call(put_alarms, "/api/v1/users/alice/alarms", "alice", Some("{")).status, 400);
    let alarms =
        c.call("get /api/v1/users/{name}/alarms", "/api/v1/users/alice/alarms", "alice", None).json();
    assert_eq!(alarms["items"].as_array().unwrap().len(), 2, "{alarms}");
    assert_eq!(
        c.call("get /api/v1/users/{name}/alarms", "/api/v1/users/ghost/alarms", "root", None).status,
        404
    );

    // A request target over the limit is a 414 that the operation documents (it was a `default` answer,
    // which made every status look documented).
    let long = format!("/api/v1/tasks?q={}", "x".repeat(trainyard_api::MAX_URI_BYTES));
    assert_eq!(c.call(list, &long, "alice", None).status, 414);

    // The server's own.
    assert_eq!(c.call("get /metrics", "/metrics", "root", None).status, 200);
    assert_eq!(c.call("get /metrics", "/metrics", "alice", None).status, 403);
    assert_eq!(c.call("get /healthz", "/healthz", "nobody", None).status, 200);

    // Every operation answered with its success status, and every one but /healthz with an error too.
    let mut missing = Vec::new();
    for op in OPERATIONS {
        let seen = c.seen.get(&(op.method.to_owned(), op.path.to_owned())).cloned().unwrap_or_default();
        if !seen.contains(&op.ok) {
            missing.push(format!("{} {} never answered {}", op.method, op.path, op.ok));
        }
        if op.path != "/healthz" && !seen.iter().any(|s| *s >= 400) {
            missing.push(format!("{} {} never answered an error", op.method, op.path));
        }
    }
    assert!(missing.is_empty(), "not exercised:\n{}", missing.join("\n"));
}

/// The names a refusal of an unknown query parameter lists as those the handler takes ("unknown field `x`,
/// expected one of `a`, `b`", "expected `a`", "there are no fields"), as serde says them.
fn accepted_parameters(detail: &str) -> BTreeSet<String> {
    let Some((_, listed)) = detail.split_once("expected ") else {
        assert!(detail.contains("there are no fields"), "not a refusal of an unknown parameter: {detail}");
        return BTreeSet::new();
    };
    listed.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

/// The document against the router, parameter by parameter: every operation has an operationId of its own;
/// every path parameter is declared (and nothing else is in the path); and the query parameters the
/// document lists are exactly those the handler reads. Each operation is called with a parameter nobody
/// takes: it must be refused (400), and the refusal names what the handler does take, which must be what
/// the document lists. So a parameter a handler reads but the document leaves out (or the reverse) fails
/// here, as does an operation that silently ignores what it does not know.
#[test]
fn every_parameter_is_declared_and_every_operation_named() {
    let mut c = Checker::new();
    let doc = c.doc.clone();
    let mut ids = BTreeSet::new();
    let mut problems = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let name = format!("{method} {path}");
            match op["operationId"].as_str() {
                Some(id) if !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric()) => {
                    if !ids.insert(id.to_owned()) {
                        problems.push(format!("{name}: operationId {id} is not unique"));
                    }
                }
                other => problems.push(format!("{name}: no operationId of letters and digits ({other:?})")),
            }
            let params = op["parameters"].as_array().cloned().unwrap_or_default();
            let of = |place: &str| -> BTreeSet<String> {
                params
                    .iter()
                    .filter(|p| p["in"] == place)
                    .map(|p| p["name"].as_str().unwrap().to_owned())
                    .collect()
            };
            for p in &params {
                let described = p["description"].as_str().is_some_and(|d| !d.is_empty());
                if !described || !p["schema"].is_object() {
                    problems.push(format!("{name}: parameter {} has no description or schema", p["name"]));
                }
                if p["in"] == "path" && p["required"] != true {
                    problems.push(format!("{name}: path parameter {} is not required", p["name"]));
                }
            }
            let in_path: BTreeSet<String> = path
                .split('/')
                .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
                .map(str::to_owned)
                .collect();
            if of("path") != in_path {
                problems.push(format!("{name}: path parameters {:?}, the path has {in_path:?}", of("path")));
            }
            // The handler's own list, as its refusal of an unknown parameter gives it.
            let concrete = path
                .replace("{id}", "no-such-task")
                .replace("{name}", "root")
                .replace("{node}", "node-0")
                .replace("{token}", "0000000000000000")
                .replace("{var}", "NOPE")
                .replace("{host}", "registry.example:5000");
            let probe = c.call(&name, &format!("{concrete}?zz-probe=1"), "root", Some("{}"));
            let detail = probe.json()["detail"].as_str().unwrap_or("").to_owned();
            if probe.status != 400 || !detail.contains("zz-probe") {
                problems
                    .push(format!("{name}: a parameter it does not take was not refused: {}", probe.text));
                continue;
            }
            let accepted = accepted_parameters(&detail);
            if accepted != of("query") {
                problems.push(format!(
                    "{name}: the handler takes {accepted:?}, the document lists {:?}",
                    of("query")
                ));
            }
        }
    }
    assert!(ids.contains("createTask") && ids.contains("deleteTasks"), "{ids:?}");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Values the server reads as documented are valid against the parameters' own schemas, and others are
/// not: a status in any case, a label selector, a page size.
#[test]
fn parameter_schemas_say_what_the_server_accepts() {
    let doc = trainyard_api::openapi::document();
    let v = Validator { doc: &doc };
    let param = |method: &str, path: &str, name: &str| -> Value {
        doc["paths"][path][method]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("{method} {path} has no parameter {name}"))["schema"]
            .clone()
    };
    let valid = |schema: &Value, value: Value| v.errors(schema, &value, "$").is_empty();
    for (method, path) in [("get", "/api/v1/tasks"), ("delete", "/api/v1/tasks")] {
        let status = param(method, path, "status");
        for ok in ["Running", "running", "rUnNiNg", "QUEUED", "Stopped"] {
            assert!(valid(&status, Value::from(ok)), "{method} {path} status {ok}");
        }
        for bad in ["run", "Runnings", "", "deleted"] {
            assert!(!valid(&status, Value::from(bad)), "{method} {path} status {bad}");
        }
        assert!(valid(&param(method, path, "type"), Value::from("rayjob")));
        assert!(!valid(&param(method, path, "type"), Value::from("TFJob")));
        assert!(valid(&param(method, path, "labels"), Value::from("team=search,exp=e1")));
        assert!(!valid(&param(method, path, "labels"), Value::from("team")));
    }
    let limit = param("get", "/api/v1/tasks", "limit");
    assert!(valid(&limit, Value::from(1)) && valid(&limit, Value::from(500)));
    assert!(!valid(&limit, Value::from(0)) && !valid(&limit, Value::from(501)));
    let key = param("post", "/api/v1/tasks", "Idempotency-Key");
    assert!(valid(&key, Value::from("k-1")) && !valid(&key, Value::from("")));
    assert!(!valid(&key, Value::from("k".repeat(trainyard_api::IDEMPOTENCY_KEY_MAX_BYTES + 1))));
    let header = &doc["paths"]["/api/v1/tasks"]["post"]["parameters"][0];
    assert_eq!((header["in"].as_str(), header["name"].as_str()), (Some("header"), Some("Idempotency-Key")));
}

/// The fake backend keeps no metrics, so a series is checked as the handler builds it, against the same
/// document.
#[test]
fn a_metric_series_matches_its_schema() {
    use trainyard_api::views::{MetricsView, Series};
    let doc = trainyard_api::openapi::document();
    let view = MetricsView {
        attempt: 1,
        series: vec![Series {
            replica: "t-master-0".into(),
            name: "trainyard_cpu_percent".into(),
            labels: [("gpu".to_owned(), "0".to_owned())].into(),
            points: vec![(1_700_000_000_000, 12.5), (1_700_000_001_000, 3.0)],
        }],
    };
    let value = serde_json::to_value(&view).unwrap();
    let schema = &doc["paths"]["/api/v1/tasks/{id}/metrics"]["get"]["responses"]["200"]["content"]["application/json"]
        ["schema"];
    let errors = Validator { doc: &doc }.errors(schema, &value, "$");
    assert!(errors.is_empty(), "{errors:?}\n{value:#}");
}

/// Every subschema is an object, but for `additionalProperties: false`: JSON Schema allows `true` and `false`
/// anywhere a schema goes, but client generators that model schemas as objects (openapi-python-client) refuse
/// the document over one (`"items": false` in tuples was such a case; scripts/test-openapi-clients runs them).
#[test]
fn subschemas_are_objects_for_client_generators() {
    /// A schema and the subschemas in it, by the keywords the document uses.
    fn walk(schema: &Value, path: &str, out: &mut Vec<String>) {
        let Value::Object(schema) = schema else { return out.push(format!("{path}: {schema}")) };
        for (keyword, arg) in schema {
            let subs: Vec<(String, &Value)> = match (keyword.as_str(), arg) {
                ("additionalProperties", Value::Bool(false)) => continue,
                ("items" | "not" | "additionalProperties", sub) => vec![(String::new(), sub)],
                ("prefixItems" | "anyOf" | "oneOf" | "allOf", Value::Array(subs)) => {
                    subs.iter().enumerate().map(|(i, s)| (format!("/{i}"), s)).collect()
                }
                ("properties", Value::Object(subs)) => {
                    subs.iter().map(|(k, s)| (format!("/{k}"), s)).collect()
                }
                _ => continue,
            };
            for (at, sub) in subs {
                walk(sub, &format!("{path}/{keyword}{at}"), out);
            }
        }
    }
    /// The schemas of the document: the named ones and each `schema` of a body, parameter or header.
    fn schemas_in(v: &Value, path: &str, out: &mut Vec<String>) {
        let children: Vec<(String, &Value)> = match v {
            Value::Object(map) => map.iter().map(|(k, s)| (k.clone(), s)).collect(),
            Value::Array(items) => items.iter().enumerate().map(|(i, s)| (i.to_string(), s)).collect(),
            _ => return,
        };
        for (key, sub) in children {
            let at = format!("{path}/{key}");
            if key == "schema" || path == "#/components/schemas" {
                walk(sub, &at, out);
            } else {
                schemas_in(sub, &at, out);
            }
        }
    }
    let doc = trainyard_api::openapi::document();
    let mut booleans = Vec::new();
    schemas_in(&doc, "#", &mut booleans);
    assert!(booleans.is_empty(), "boolean subschemas: {booleans:?}");
}

/// The document's links: each names an operation of the document and fills exactly that operation's path
/// parameters, each from a field the linking answer always has (a required property of its schema). A
/// created task links to its reads and changes, a new token to its revocation; every operation lists its
/// statuses (no `default` answer, under which any status would pass as documented).
#[test]
fn links_fill_path_parameters_from_fields_every_answer_has() {
    let doc = trainyard_api::openapi::document();
    let mut by_id = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for op in item.as_object().unwrap().values() {
            by_id.insert(op["operationId"].as_str().unwrap().to_owned(), path.clone());
        }
    }
    let resolve = |schema: &Value| -> Value {
        match schema["$ref"].as_str() {
            Some(r) => doc.pointer(r.trim_start_matches('#')).unwrap_or_else(|| panic!("no {r}")).clone(),
            None => schema.clone(),
        }
    };
    let mut problems = Vec::new();
    let mut links_of = BTreeMap::<String, BTreeSet<String>>::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let responses = op["responses"].as_object().unwrap();
            if responses.contains_key("default") {
                problems.push(format!("{method} {path}: a default answer"));
            }
            for (status, response) in responses {
                let Some(links) = response.get("links").and_then(Value::as_object) else { continue };
                let schema = resolve(&response["content"]["application/json"]["schema"]);
                let required: BTreeSet<&str> =
                    schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
                for (name, link) in links {
                    let at = format!("{method} {path} {status} link {name}");
                    let target = link["operationId"].as_str().unwrap_or_default();
                    let Some(target_path) = by_id.get(target) else {
                        problems.push(format!("{at}: no operation {target:?}"));
                        continue;
                    };
                    let wanted: BTreeSet<&str> =
                        trainyard_api::openapi::path_parameters(target_path).collect();
                    let parameters = link["parameters"].as_object().cloned().unwrap_or_default();
                    let filled: BTreeSet<&str> = parameters.keys().map(String::as_str).collect();
                    if filled != wanted {
                        problems.push(format!("{at}: fills {filled:?}, {target_path} takes {wanted:?}"));
                    }
                    for expression in parameters.values() {
                        let field = expression.as_str().and_then(|e| e.strip_prefix("$response.body#/"));
                        if !field.is_some_and(|f| required.contains(f)) {
                            problems.push(format!("{at}: {expression} is not a field the answer always has"));
                        }
                    }
                    links_of
                        .entry(op["operationId"].as_str().unwrap().to_owned())
                        .or_default()
                        .insert(target.to_owned());
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let created = &links_of["createTask"];
    for op in
        ["getTask", "stopTask", "deleteTask", "resubmitTask", "cloneTask", "listTaskEvents", "getTaskLogs"]
    {
        assert!(created.contains(op), "createTask does not link to {op}: {created:?}");
    }
    assert!(links_of["createToken"].contains("revokeToken"), "{links_of:?}");
}

/// Request bodies and path parameters whose rules the document states, sample by sample: the server refuses
/// (400, or 422 for a TaskEnv variable) exactly the samples their schema refuses, so a client or a fuzzer
/// that follows the document is not refused as malformed, and what the document calls wrong is refused.
#[test]
fn request_schemas_refuse_what_the_server_refuses() {
    use serde_json::json;
    let mut c = Checker::new();
    let doc = c.doc.clone();
    let v = Validator { doc: &doc };
    let body_schema = |op: &str| {
        let (method, template) = op.split_once(' ').unwrap();
        doc["paths"][template][method]["requestBody"]["content"]["application/json"]["schema"].clone()
    };
    let node = "put /api/v1/admin/nodes/{node}";
    let login = "put /api/v1/admin/registries/{host}/login";
    let users = "post /api/v1/admin/users";
    let env = "put /api/v1/users/{name}/env";
    let (disable, at_disable) =
        ("post /api/v1/admin/users/{name}/disable", "/api/v1/admin/users/alice/disable");
    let at_node = "/api/v1/admin/nodes/node-0";
    let at_login = "/api/v1/admin/registries/registry.example:5000/login";
    let (at_users, at_env) = ("/api/v1/admin/users", "/api/v1/users/root/env");
    let creds = |username: String, password: String| json!({"username": username, "password": password});
    let user = |name: String| json!({"name": name, "role": "member"});
    let var = |name: &str, value: &str| json!({"name": name, "value": value});
    let cases = [
        (node, at_node, json!({}), false),
        (node, at_node, json!({"failed": false}), true),
        (node, at_node, json!({"schedulable": true, "failed": false}), true),
        (login, at_login, creds("ci".into(), "p".into()), true),
        (login, at_login, creds("a:b".into(), "p".into()), false),
        (login, at_login, creds("a\nb".into(), "p".into()), false),
        (login, at_login, creds(String::new(), "p".into()), false),
        // Counted in characters, as the document's maxLength counts them (256 of these are 512 bytes).
        (login, at_login, creds("é".repeat(256), "p".into()), true),
        (login, at_login, creds("é".repeat(257), "p".into()), false),
        (login, at_login, creds("ci".into(), "ü".repeat(4096)), true),
        (login, at_login, creds("ci".into(), "p".repeat(4097)), false),
        (login, at_login, json!({"username": "ci", "password": "p", "projectGroups": ["nlp", "cv"]}), true),
        (login, at_login, json!({"username": "ci", "password": "p", "projectGroups": []}), true),
        (login, at_login, json!({"username": "ci", "password": "p", "projectGroups": "nlp"}), false),
        (login, at_login, json!({"username": "ci", "password": "p", "projectGroups": [""]}), false),
        (login, at_login, json!({"username": "ci", "password": "p", "projectGroups": [1]}), false),
        (users, at_users, user("erin.b-2_x".into()), true),
        (users, at_users, user("a".repeat(64)), true),
        (users, at_users, user("a".repeat(65)), false),
        (users, at_users, user("x y".into()), false),
        (users, at_users, user(String::new()), false),
        (disable, at_disable, json!({}), true),
        (disable, at_disable, json!({"queued": "keep", "running": "keep"}), true),
        (disable, at_disable, json!({"queued": "stop"}), true),
        (disable, at_disable, json!({"queued": "pause"}), false),
        (disable, at_disable, json!({"running": "hold"}), false),
        (disable, at_disable, json!({"queued": null}), false),
        (disable, at_disable, json!({"work": "hold"}), false),
        (disable, at_disable, json!(["hold"]), false),
        (env, at_env, var("_X1", "v"), true),
        (env, at_env, var("1X", "v"), false),
        (env, at_env, var("BAD NAME", "v"), false),
        (env, at_env, var("X", ""), false),
        // A whole number written with a fraction is an integer to JSON Schema, and to the server (it was a 400).
        (
            "put /api/v1/admin/settings",
            "/api/v1/admin/settings",
            json!({"maxQueuedTasksPerUser": 900.0}),
            true,
        ),
        (
            "put /api/v1/admin/settings",
            "/api/v1/admin/settings",
            json!({"maxQueuedTasksPerUser": 900.5}),
            false,
        ),
        ("put /api/v1/admin/settings", "/api/v1/admin/settings", json!({"maxQueuedTasksPerUser": 0}), false),
        // The validator answers anything with its problems (it was documented as taking a TrainingTask only).
        ("post /api/v1/validate", "/api/v1/validate", json!([null, null]), true),
        ("post /api/v1/validate", "/api/v1/validate", json!({"kind": 3}), true),
    ];
    let mut wrong = Vec::new();
    for (op, path, body, valid) in cases {
        let by_schema = v.errors(&body_schema(op), &body, "$").is_empty();
        let answer = c.call(op, path, "root", Some(&body.to_string()));
        let refused = matches!(answer.status, 400 | 422);
        if by_schema != valid || refused == valid {
            wrong.push(format!("{op} {body}: the schema says {by_schema}, the server {}", answer.status));
        }
    }
    let host_schema =
        doc["paths"]["/api/v1/admin/registries/{host}/login"]["put"]["parameters"][0]["schema"].clone();
    let hosts = [
        ("registry.example:5000", true),
        ("localhost", true),
        ("a", true),
        ("x:+0080", true),
        ("x:65535", true),
        ("-x", false),
        ("x.", false),
        ("a_b", false),
        ("x:0", false),
        ("x:65536", false),
        ("x:", false),
        ("x:1:2", false),
    ];
    for (host, valid) in hosts {
        let by_schema = v.errors(&host_schema, &json!(host), "$").is_empty();
        let body = creds("ci".into(), "p".into()).to_string();
        let answer = c.call(login, &format!("/api/v1/admin/registries/{host}/login"), "root", Some(&body));
        if by_schema != valid || (answer.status == 400) == valid {
            wrong.push(format!("host {host}: the schema says {by_schema}, the server {}", answer.status));
        }
    }
    // Numbers in queries, as far as the handler's integer types go (past them they do not parse: 400). On no
    // task, so a query that parses answers 404.
    let numbers = [
        ("get /api/v1/tasks/{id}/logs", "offset", u64::MAX.to_string(), true),
        ("get /api/v1/tasks/{id}/logs", "offset", "18446744073709551616".to_owned(), false),
        ("get /api/v1/tasks/{id}/logs", "attempt", u32::MAX.to_string(), true),
        ("get /api/v1/tasks/{id}/logs", "attempt", (u64::from(u32::MAX) + 1).to_string(), false),
        ("get /api/v1/tasks/{id}/metrics", "attempt", (u64::from(u32::MAX) + 1).to_string(), false),
        ("get /api/v1/tasks/{id}/metrics", "since", "18446744073709551616".to_owned(), false),
        ("get /api/v1/tasks/{id}/events", "after", u64::MAX.to_string(), true),
        ("get /api/v1/tasks/{id}/events", "after", "18446744073709551616".to_owned(), false),
    ];
    for (op, name, value, valid) in numbers {
        let (method, template) = op.split_once(' ').unwrap();
        let params = doc["paths"][template][method]["parameters"].as_array().unwrap();
        let schema = &params.iter().find(|p| p["name"] == name).unwrap()["schema"];
        let number: Value = serde_json::from_str(&value).unwrap();
        let by_schema = v.errors(schema, &number, "$").is_empty();
        let path = format!("{}?{name}={value}", template.replace("{id}", "no-such-task"));
        let answer = c.call(op, &path, "root", None);
        if by_schema != valid || (answer.status == 400) == valid {
            wrong.push(format!(
                "{op} {name}={value}: the schema says {by_schema}, the server {}",
                answer.status
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
