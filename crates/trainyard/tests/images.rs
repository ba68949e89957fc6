//! Registry images on the local backend, end to end: a real registry on 127.0.0.1, images these tests build
//! from this machine's Debian packages and push, and tasks that run from them through `trainyard up`.

mod common;

use common::*;
use serde_json::{Value, json};
use trainyard_images::testing::{
    FlakyProxy, GZIP_LAYER, TAR_LAYER, TestRegistry, debian_closure, digest_of, files_layer, gzip,
    host_layer, owned_files_layer,
};

/// [`CATALOG`] with registry images allowed from `registries` (host → settings).
fn catalog_with(registries: Value) -> String {
    let mut c: Value = serde_saphyr::from_str(CATALOG).unwrap();
    c["allowExternalImages"] = json!(true);
    c["registries"] = registries;
    serde_json::to_string(&c).unwrap()
}

fn use_catalog(s: &Server, catalog: &str) {
    let (status, body) = s.call("PUT", "/api/v1/admin/catalog", Some(catalog));
    assert_eq!(status, 200, "{body}");
}

/// A runnable base: bash, coreutils and the libraries they need, from this machine's packages.
fn base_layer() -> Vec<u8> {
    gzip(&host_layer(&debian_closure(&["bash", "coreutils"])))
}

const PASSWD: &[u8] = b"root:x:0:0:root:/root:/bin/bash\nalice:x:1001:1001:Alice:/home/alice:/bin/bash\n";
const GROUP: &[u8] = b"root:x:0:\nalice:x:1001:\n";

fn on_image(prefix: &str, image: &str, cmd: &str) -> Value {
    let mut t = pytorch(prefix, 0, cmd);
    t["spec"]["environment"]["image"] = json!(image);
    t
}

#[test]
fn a_task_runs_from_a_registry_image_with_its_config_and_every_attempt_runs_the_same_bytes() {
    let reg = TestRegistry::start("e2e", true, false);
    let base = base_layer();
    let base_digest = digest_of(&base);
    let v1 = owned_files_layer(&[
        ("etc/passwd", PASSWD, 0o644, 0),
        ("etc/group", GROUP, 0o644, 0),
        ("app/version", b"v1\n", 0o644, 0),
        // The image's user's own file: readable by the replica, which runs as that user.
        ("app/private", b"alice's own\n", 0o600, 1001),
        ("app/roots", b"root's own\n", 0o600, 0),
    ]);
    let config = json!({
        "Env": ["GREETING=from-image", "OVERRIDE=image", "PATH=/usr/local/bin:/usr/bin:/bin"],
        "WorkingDir": "/app",
        "User": "alice",
    });
    let v1_digest = digest_of(&v1);
    let d1 = reg.push("team/base", "stable", &[(GZIP_LAYER, base.clone()), (TAR_LAYER, v1)], config.clone());
    let s = Server::start("images-e2e", None);
    let ca = reg.ca.as_ref().unwrap().display().to_string();
    use_catalog(&s, &catalog_with(json!({ reg.host.clone(): {"caBundle": ca} })));

    let image = format!("{}/team/base:stable", reg.host);
    // Attempt 0 runs until its node is marked failed (after the test moved the tag); attempt 1, on another
    // node, must still run v1.
    let cmd = "echo \"$GREETING $OVERRIDE $(id -un) $(id -u) $(pwd) $(cat version) $(cat private)\"; \
               cat roots 2>/dev/null && echo LEAKED; if [ \"$TRAINYARD_ATTEMPT\" = 0 ]; then sleep 120; fi";
    let mut task = on_image("img", &image, cmd);
    task["spec"]["environment"]["env"] = json!([{"name": "OVERRIDE", "value": "task"}]);
    let id = s.submit(&task);
    let pulled = s.wait_event(&id, "ImagePulled", secs(120));
    assert!(pulled.contains(&d1), "the event names the digest: {pulled}");
    let t = s.wait_status(&id, "Running", secs(60));
    s.wait_log(&id, &format!("{}-master-0", t["name"].as_str().unwrap()), "from-image", secs(30));
    // The tag moves while attempt 0 runs; then its node fails.
    let v2 = files_layer(&[
        ("etc/passwd", PASSWD, 0o644),
        ("etc/group", GROUP, 0o644),
        ("app/version", b"v2\n", 0o644),
    ]);
    let d2 = reg.push("team/base", "stable", &[(GZIP_LAYER, base), (TAR_LAYER, v2)], config);
    assert_ne!(d1, d2);
    let node = t["placement"]["replicas"][0]["node"].as_str().unwrap_or_else(|| panic!("{t}")).to_owned();
    let (status, body) = s.call("PUT", &format!("/api/v1/admin/nodes/{node}"), Some(r#"{"failed": true}"#));
    assert_eq!(status, 204, "{body}");
    let t = s.wait_status(&id, "Succeeded", secs(120));
    let name = t["name"].as_str().unwrap();
    for attempt in [0, 1] {
        let log = s.log(&id, &format!("{name}-master-0"), Some(attempt));
        assert!(
            log.contains("from-image task alice 1001 /app v1 alice's own"),
            "attempt {attempt}: the image's env under the task's, its user, working dir and files:\n{log}"
        );
        assert!(!log.contains("LEAKED"), "root's private file stays private:\n{log}");
    }
    let events = s.events_text(&id);
    assert!(events.contains(&format!("{image}@{d1}")), "attempt 1 pulled the pinned digest:\n{events}");
    // Two attempts, each layer fetched once: the second attempt ran from the cache (the registry's own log).
    let served = reg.blobs_served();
    for layer in [base_digest, v1_digest] {
        assert_eq!(served.get(&layer), Some(&1), "layer {layer}: {served:?}");
    }
    assert!(!events.contains(&d2), "{events}");
    // The root file system is the cache's, read-only, and shared: the image is in the cache once.
    let (status, body) = s.call("GET", "/api/v1/admin/images", None);
    assert_eq!(status, 200, "{body}");
    let cached: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(cached["items"].as_array().unwrap().len(), 1, "{body}");
    assert_eq!(cached["items"][0]["digest"], json!(d1));
}

#[test]
fn image_pull_tolerance_against_a_registry_that_fails_its_first_pulls() {
    let reg = TestRegistry::start("tolerance", false, false);
    reg.push("t/ok", "1", &[(GZIP_LAYER, base_layer())], json!({}));
    let s = Server::start("images-tolerance", None);
    let flaky = |fail| FlakyProxy::start(&reg.host, fail);
    let (p0, pn, pinf) = (flaky(1000), flaky(1000), flaky(3));
    let mut regs = serde_json::Map::new();
    for p in [&p0, &pn, &pinf] {
        regs.insert(p.host.clone(), json!({"insecure": true}));
    }
    use_catalog(&s, &catalog_with(Value::Object(regs)));
    let submit = |p: &FlakyProxy, tolerance: i64| {
        let mut t = on_image("tol", &format!("{}/t/ok:1", p.host), "echo ran");
        t["spec"]["advanced"] = json!({"imagePullTolerance": tolerance});
        s.submit(&t)
    };
    let (none, two, forever) = (submit(&p0, 0), submit(&pn, 2), submit(&pinf, -1));
    std::thread::scope(|scope| {
        // While `forever` waits for its image, its view says so (`starting`), as a cluster's backend says a
        // pod's wait; watched from its submission.
        let watcher = scope.spawn(|| {
            let t0 = std::time::Instant::now();
            let mut waits: Vec<String> = Vec::new();
            loop {
                let t = s.task(&forever);
                if let Some(r) = t["starting"]["reason"].as_str()
                    && waits.last().is_none_or(|w| w != r)
                {
                    waits.push(r.to_owned());
                }
                if t["status"] == "Succeeded" {
                    assert!(t["starting"].is_null(), "{t}");
                    return waits;
                }
                assert!(t0.elapsed() < secs(120), "{t}\n{}", s.events_text(&forever));
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        });
        let t = s.wait_status(&none, "Failed", secs(60));
        assert!(
            t["statusReason"].as_str().unwrap_or("").contains("ImagePullFailed")
                || s.events_text(&none).contains("ImagePullFailed"),
            "{t}"
        );
        let ev = s.events_text(&none);
        assert!(ev.contains("registry-unreachable") && ev.contains("allows no retries"), "{ev}");
        assert!(!ev.contains("ImagePullBackOff"), "tolerance 0: one pull, no retry:\n{ev}");

        s.wait_status(&two, "Failed", secs(60));
        let ev = s.events_text(&two);
        assert_eq!(ev.matches("ImagePullBackOff").count(), 2, "{ev}");
        assert!(ev.contains("gave up after 3 pulls (2 retries allowed)"), "{ev}");

        let waits = watcher.join().unwrap();
        assert!(waits.iter().any(|w| w.contains("pull 1 failed, next try in")), "{waits:?}");
    });
    let ev = s.events_text(&forever);
    assert!(ev.contains("ImagePullBackOff") && ev.contains("ImagePulled"), "{ev}");
    assert!(
        pinf.failed.load(std::sync::atomic::Ordering::SeqCst) == 3,
        "the registry failed its first pulls"
    );
}

#[test]
fn a_missing_image_and_one_without_bash_fail_at_once_with_what_to_do() {
    let reg = TestRegistry::start("final", false, false);
    reg.push("t/nobash", "1", &[(TAR_LAYER, files_layer(&[("etc/hostname", b"x\n", 0o644)]))], json!({}));
    let s = Server::start("images-final", None);
    use_catalog(&s, &catalog_with(json!({ reg.host.clone(): {"insecure": true} })));
    let mut missing = on_image("miss", &format!("{}/t/missing:1", reg.host), "true");
    missing["spec"]["advanced"] = json!({"imagePullTolerance": -1});
    let missing = s.submit(&missing);
    let nobash = s.submit(&on_image("nobash", &format!("{}/t/nobash:1", reg.host), "true"));
    s.wait_status(&missing, "Failed", secs(60));
    let ev = s.events_text(&missing);
    assert!(ev.contains("not-found") && ev.contains("another try would fail the same way"), "{ev}");
    s.wait_status(&nobash, "Failed", secs(60));
    assert!(s.events_text(&nobash).contains("has no bash"), "{}", s.events_text(&nobash));
    // A registry the catalog does not allow is refused at submission, with the field's path.
    let (status, body) =
        s.call("POST", "/api/v1/tasks", Some(&on_image("x", "other.example/t/x:1", "true").to_string()));
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("registry-not-allowed") && body.contains("spec.environment.image"), "{body}");
}

/// Every file under `dir` (not following links).
fn files_under(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            files_under(&e.path(), out);
        } else if t.is_file() {
            out.push(e.path());
        }
    }
}

#[test]
fn a_private_registry_is_pulled_from_with_the_login_an_admin_set_and_its_password_stays_sealed() {
    let reg = TestRegistry::start("login", true, true);
    reg.push("private/app", "1", &[(GZIP_LAYER, base_layer())], json!({}));
    let s = Server::start("images-login", None);
    let ca = reg.ca.as_ref().unwrap().display().to_string();
    use_catalog(&s, &catalog_with(json!({ reg.host.clone(): {"caBundle": ca} })));
    let image = format!("{}/private/app:1", reg.host);

    let first = s.submit(&on_image("nologin", &image, "echo ran"));
    s.wait_status(&first, "Failed", secs(60));
    let ev = s.events_text(&first);
    assert!(
        ev.contains("unauthorized") && ev.contains("ask an admin to set this registry's credentials"),
        "{ev}"
    );

    let (user, password) = reg.user.clone().unwrap();
    let path = format!("/api/v1/admin/registries/{}/login", reg.host);
    let (status, body) = s.call("PUT", &path, Some(r#"{"username": "", "password": ""}"#));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("username") && body.contains("password"), "every problem at once: {body}");
    // The image is no catalog preset: the login serves it for the project groups it names.
    let login = |groups: Value| json!({"username": user, "password": password, "projectGroups": groups});
    let (status, body) = s.call("PUT", &path, Some(&login(json!(["nope"])).to_string()));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("nope") && body.contains("is not in the catalog"), "{body}");
    let (status, body) = s.call("PUT", &path, Some(&login(json!(["default"])).to_string()));
    assert_eq!(status, 204, "{body}");
    let (status, body) = s.call("GET", "/api/v1/admin/registries", None);
    assert_eq!(status, 200);
    assert!(body.contains(&reg.host) && body.contains(&user) && !body.contains(&password), "{body}");
    let listed: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(listed["items"][0]["projectGroups"], json!(["default"]), "{body}");

    let second = s.submit(&on_image("login", &image, "echo ran"));
    let t = s.wait_status(&second, "Succeeded", secs(120));
    assert!(s.log(&second, &format!("{}-master-0", t["name"].as_str().unwrap()), None).contains("ran"));

    // The password is nowhere under the data dir in the clear (the database, the runs, the cache).
    let mut files = Vec::new();
    files_under(&s.dir, &mut files);
    assert!(files.len() > 10);
    for f in files {
        let bytes = std::fs::read(&f).unwrap_or_default();
        assert!(
            !bytes.windows(password.len()).any(|w| w == password.as_bytes()),
            "{} holds the password",
            f.display()
        );
    }
    let (status, _) = s.call("DELETE", &path, None);
    assert_eq!(status, 204);
    let (status, _) = s.call("DELETE", &path, None);
    assert_eq!(status, 404);
}

/// A 1 + 1 torchrun job with a gloo all-reduce, from an image that carries Debian's `python3-torch` (the
/// package and everything it depends on, about 1 GiB): both replicas run from one read-only root in the cache.
#[test]
fn a_torchrun_gloo_job_runs_from_an_image_that_carries_python3_torch() {
    let reg = TestRegistry::start("torch", false, false);
    let layer = host_layer(&debian_closure(&["python3-torch", "bash", "coreutils"]));
    let digest = reg.push("ml/torch", "cpu", &[(TAR_LAYER, layer)], json!({"Env": ["PYTHONUNBUFFERED=1"]}));
    let s = Server::start("images-torch", None);
    use_catalog(&s, &catalog_with(json!({ reg.host.clone(): {"insecure": true} })));
    let cmd = TORCHRUN_ALL_REDUCE;
    let mut task = pytorch_on("cpu.large", "torchimg", 1, cmd);
    task["spec"]["environment"]["image"] = json!(format!("{}/ml/torch:cpu", reg.host));
    let id = s.submit(&task);
    let t = s.wait_status(&id, "Succeeded", secs(600));
    let events = s.events_text(&id);
    assert!(events.contains(&digest), "{events}");
    let master = format!("{}-master-0", t["name"].as_str().unwrap());
    let log = s.log(&id, &master, None);
    assert!(log.contains("all-reduce gave 3.0 over 2 ranks"), "{log}");
    // One image in the cache, pulled once for both replicas.
    let (_, body) = s.call("GET", "/api/v1/admin/images", None);
    let cached: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(cached["items"].as_array().unwrap().len(), 1, "{body}");
    assert!(cached["items"][0]["bytes"].as_u64().unwrap() > 500 << 20, "{body}");
}

/// With a cache limit of 0, every pull collects the cache down to the images in use: one a running task
/// runs stays, and goes once no task runs it.
#[test]
fn the_cache_never_removes_an_image_in_use() {
    let reg = TestRegistry::start("gc-e2e", false, false);
    let base = base_layer();
    let x = reg.push(
        "gc/x",
        "1",
        &[(GZIP_LAYER, base.clone()), (TAR_LAYER, files_layer(&[("x", b"x", 0o644)]))],
        json!({}),
    );
    let y = reg.push(
        "gc/y",
        "1",
        &[(GZIP_LAYER, base), (TAR_LAYER, files_layer(&[("y", b"y", 0o644)]))],
        json!({}),
    );
    let s = Server::start_with(
        "images-gc",
        Options { args: vec!["--image-cache-gib".into(), "0".into()], ..Options::default() },
    );
    use_catalog(&s, &catalog_with(json!({ reg.host.clone(): {"insecure": true} })));
    let cached = || -> Vec<String> {
        let (_, body) = s.call("GET", "/api/v1/admin/images", None);
        let v: Value = serde_json::from_str(&body).unwrap();
        v["items"].as_array().unwrap().iter().map(|i| i["digest"].as_str().unwrap().to_owned()).collect()
    };
    let long = s.submit(&on_image("gcx", &format!("{}/gc/x:1", reg.host), "sleep 600"));
    s.wait_status(&long, "Running", secs(60));
    let short = s.submit(&on_image("gcy", &format!("{}/gc/y:1", reg.host), "true"));
    s.wait_status(&short, "Succeeded", secs(60));
    // The collection after y's pull kept x (in use) and y (about to run).
    let now = cached();
    assert!(now.contains(&x) && now.contains(&y), "{now:?}");
    s.call("POST", &format!("/api/v1/tasks/{long}/stop"), None);
    s.wait_status(&long, "Stopped", secs(60));
    // The next pull's collection removes both: neither runs any more once it ended.
    let again = s.submit(&on_image("gcy2", &format!("{}/gc/y:1", reg.host), "true"));
    s.wait_status(&again, "Succeeded", secs(60));
    let t0 = std::time::Instant::now();
    while cached().contains(&x) {
        assert!(t0.elapsed() < secs(30), "x is still cached: {:?}", cached());
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // y was in use by the task that pulled it when that collection ran.
    assert_eq!(cached(), [y]);
}

/// A member's request as `token`: the status and the body.
fn call_as(s: &Server, token: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let url = format!("{}{path}", s.base);
    let req = match method {
        "GET" => agent().get(&url).force_send_body(),
        _ => agent().post(&url),
    };
    let mut r = req
        .header("Authorization", &format!("Bearer {token}"))
        .send(body.unwrap_or("").as_bytes())
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    (r.status().as_u16(), r.body_mut().read_to_string().unwrap_or_default())
}

/// A member of `group` with a token of their own.
fn member(s: &Server, name: &str, group: &str) -> String {
    let body = json!({"name": name, "role": "member", "groups": [group]}).to_string();
    let (status, answer) = s.call("POST", "/api/v1/admin/users", Some(&body));
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = s.call("POST", &format!("/api/v1/users/{name}/tokens"), Some("{}"));
    assert_eq!(status, 201, "{answer}");
    serde_json::from_str::<Value>(&answer).unwrap()["token"].as_str().unwrap().to_owned()
}

fn submit_as(s: &Server, token: &str, task: &Value) -> String {
    let (status, body) = call_as(s, token, "POST", "/api/v1/tasks", Some(&task.to_string()));
    assert_eq!(status, 201, "{body}");
    serde_json::from_str::<Value>(&body).unwrap()["id"].as_str().unwrap().to_owned()
}

/// Issue 29, finding High 2: an admin's registry login pulled group `default`'s private image for a member of
/// group `other` who typed its reference (which the catalog showed him), and went on pulling it for 30 s after
/// the login was deleted (a finished pull answered from memory). Now the login serves the catalog preset it
/// stands behind for the group the preset is offered to; `other`'s member gets the registry's refusal, and once
/// the login is deleted the next task of `default` asks the registry and is refused too, at once.
#[test]
fn a_registry_login_serves_only_the_groups_its_presets_are_offered_to_and_stops_when_deleted() {
    let reg = TestRegistry::start("login-groups", true, true);
    reg.push("group-a/private", "1", &[(GZIP_LAYER, base_layer())], json!({}));
    let s = Server::start("images-login-groups", None);
    let ca = reg.ca.as_ref().unwrap().display().to_string();
    let reference = format!("{}/group-a/private:1", reg.host);
    let mut catalog: Value =
        serde_json::from_str(&catalog_with(json!({ reg.host.clone(): {"caBundle": ca} }))).unwrap();
    catalog["projectGroups"]["other"] = json!({});
    catalog["images"]["a-private"] = json!({"reference": reference, "projectGroups": ["default"]});
    let quotas = catalog["quotas"].as_array_mut().unwrap();
    quotas.push(json!({"group": "other", "resourceType": "Reserved", "pool": "default", "spec": "cpu.small", "units": 6}));
    use_catalog(&s, &catalog.to_string());
    let (alice, bob) = (member(&s, "alice", "default"), member(&s, "bob", "other"));
    // The admin's login for the registry, serving the catalog's presets only.
    let (user, password) = reg.user.clone().unwrap();
    let path = format!("/api/v1/admin/registries/{}/login", reg.host);
    let (status, body) =
        s.call("PUT", &path, Some(&json!({"username": user, "password": password}).to_string()));
    assert_eq!(status, 204, "{body}");

    // The legitimate path: alice runs her group's preset with the login.
    let on = |prefix: &str, group: &str, image: &str| {
        let mut t = on_image(prefix, image, "echo ran-private");
        t["metadata"]["projectGroup"] = json!(group);
        t
    };
    let first = submit_as(&s, &alice, &on("a1", "default", "a-private"));
    s.wait_event(&first, "ImagePulled", secs(120));
    let pulled_at = std::time::Instant::now();
    let t = s.wait_status(&first, "Succeeded", secs(60));
    assert!(
        s.log(&first, &format!("{}-master-0", t["name"].as_str().unwrap()), None).contains("ran-private")
    );

    // The attack: bob types the reference, while alice's pull is fresh and the login is there.
    let stolen = submit_as(&s, &bob, &on("b1", "other", &reference));
    s.wait_status(&stolen, "Failed", secs(60));
    let ev = s.events_text(&stolen);
    assert!(
        ev.contains("unauthorized") && ev.contains("ask an admin") && !ev.contains("ImagePulled"),
        "another group's member must get the registry's refusal, not the image:\n{ev}"
    );
    assert!(!s.all_logs(&stolen).contains("ran-private"));

    // The login is deleted: alice's next task asks the registry at once instead of the 30 s-old answer.
    let (status, body) = s.call("DELETE", &path, None);
    assert_eq!(status, 204, "{body}");
    let after = submit_as(&s, &alice, &on("a2", "default", "a-private"));
    assert!(
        pulled_at.elapsed() < secs(25),
        "the test must reach this point while the first pull still answers from memory (30 s); it took {:?}",
        pulled_at.elapsed()
    );
    s.wait_status(&after, "Failed", secs(60));
    let ev = s.events_text(&after);
    assert!(ev.contains("unauthorized") && !ev.contains("ImagePulled"), "{ev}");

    // What each member reads of the catalog: bob neither sees alice's preset nor its reference.
    let (status, bobs) = call_as(&s, &bob, "GET", "/api/v1/catalog", None);
    assert_eq!(status, 200, "{bobs}");
    assert!(!bobs.contains("a-private") && !bobs.contains("group-a/private"), "{bobs}");
    let (_, alices) = call_as(&s, &alice, "GET", "/api/v1/catalog", None);
    assert!(alices.contains("a-private") && alices.contains(&reference), "{alices}");
}
