//! The web console in a real browser (Debian's headless chromium through chromedriver), against a real
//! `trainyard up` on the local backend. Screenshots go to `target/console-screenshots/` (or
//! `TRAINYARD_SCREENSHOTS`).

mod common;

use common::webdriver::Browser;
use common::{Server, secs};
use serde_json::json;

fn shots() -> std::path::PathBuf {
    std::env::var_os("TRAINYARD_SCREENSHOTS").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/console-screenshots"),
        std::path::PathBuf::from,
    )
}

fn sign_in(b: &Browser, s: &Server) {
    b.goto(&format!("{}/", s.base));
    let token = b.find("#token");
    b.type_into(&token, &s.token);
    b.click(&b.find("#signin"));
    b.wait("the user's name", || (b.text_of("#who-name") == "admin").then_some(()));
    assert!(b.text_of("#who").contains("admin"), "role shown: {}", b.text_of("#who"));
}

const DOC: &str = r#"apiVersion: trainyard.dev/v1
kind: TrainingTask
metadata: {namePrefix: webui, projectGroup: default}
spec:
  type: PyTorchJob
  placement: {region: local, cluster: local}
  environment:
    image: host
    env: [{name: "LR RATE", value: "0.1"}]
    cmd: echo hello from $RANK; sleep 1
  compute:
    resourceType: Reserved
    pool: default
    workers: 1
    instanceSpecs: [{spec: cpu.small}]
"#;

/// Sign in; write a task with a mistake and see the problem at its field; fix it and see the demand; submit
/// twice fast and get one task; watch it run to success on its page (events, log) and in the list.
#[test]
fn submit_a_task_from_the_console_and_watch_it_run() {
    let s = Server::start("console", None);
    let b = Browser::start();
    sign_in(&b, &s);

    b.goto(&format!("{}/#/new", s.base));
    let doc = b.find("#doc");
    b.type_into(&doc, DOC);
    let problem = b.find("#problems li[data-path='spec.environment.env[0].name']");
    assert!(b.text(&problem).contains("space"), "{}", b.text(&problem));
    b.screenshot(&shots().join("new-task-with-a-problem.png"));
    // Fix the name: set the whole document again, without the space.
    b.clear(&doc);
    b.type_into(&doc, &DOC.replace("LR RATE", "LR_RATE"));
    b.wait("the problem to go and the demand to show", || {
        let clean = b.try_find("#problems li").is_none();
        let demand = b.text_of("#demand");
        (clean && demand.contains("2 replicas")).then_some(())
    });
    // Two clicks in a row: one task.
    let submit = b.find("#submit");
    b.script("arguments[0].click(); arguments[0].click();", json!([submit.reference()]));
    b.wait("the task page", || b.url().contains("#/tasks/").then_some(()));
    let id = b.url().rsplit('/').next().unwrap().to_owned();
    b.wait("success", || (b.text_of("h1 .badge") == "Succeeded").then_some(()));
    let events = b.text_of("#events");
    for reason in ["Submitted", "Admitted", "Started", "Completed"] {
        assert!(events.contains(reason), "{reason} not in {events}");
    }
    b.wait("the log", || b.text_of("#log").contains("hello from").then_some(()));
    b.screenshot(&shots().join("task-details.png"));

    let (_, list) = s.call("GET", "/api/v1/tasks?q=webui", None);
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), 1, "one task for two clicks: {list}");
    assert_eq!(list["items"][0]["id"], id);

    b.goto(&format!("{}/#/tasks?q=webui", s.base));
    let row = b.find(&format!("tr[data-id='{id}'] [data-status]"));
    assert_eq!(b.text(&row), "Succeeded");
    b.screenshot(&shots().join("task-list.png"));
}

/// Stop a running task from its page (the confirmation accepted): the checkpoint steps show up as events.
#[test]
fn stop_a_running_task_from_its_page() {
    let s = Server::start("console-stop", None);
    let cmd = "python3 -c \"import os,signal,time\nrt=os.environ['TRAINYARD_RUNTIME_DIR']\ndef save(*a):\n    open(rt+'/checkpoint-done','w').close()\nsignal.signal(signal.SIGUSR1, save)\nprint('training', flush=True)\nwhile True: time.sleep(0.1)\"";
    let mut task = common::pytorch("uistop", 0, cmd);
    task["spec"]["advanced"] = json!({"exitCheckpoint": {"enabled": true, "timeoutSeconds": 30}});
    let id = s.submit(&task);
    s.wait_status(&id, "Running", secs(60));
    let b = Browser::start();
    sign_in(&b, &s);
    b.goto(&format!("{}/#/tasks/{id}", s.base));
    b.wait("the log", || b.text_of("#log").contains("training").then_some(()));
    b.click(&b.find("#act-stop"));
    b.wait("stopped", || (b.text_of("h1 .badge") == "Stopped").then_some(()));
    let events = b.text_of("#events");
    for reason in ["StopRequested", "CheckpointRequested", "CheckpointDone"] {
        assert!(events.contains(reason), "{reason} not in {events}");
    }
}

/// Chooses an option of a select by value, as a user picking it would (a change event).
fn pick(b: &Browser, css: &str, value: &str) {
    let el = b.find(css);
    b.script(
        "arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('change', {bubbles: true}));",
        json!([el.reference(), value]),
    );
}

fn input_id(path: &str) -> String {
    format!("[id='in-{path}']")
}

/// The sectioned Create Training form: a mistake shows at its field, the fix brings the demand and the
/// scheduler's answer, Create twice makes one task, which runs; choosing RayJob shows the Ray part.
#[test]
fn the_create_training_form() {
    let s = Server::start("console-form", None);
    let b = Browser::start();
    sign_in(&b, &s);
    // A TaskEnv variable of the user's shows in the form as inherited.
    let (status, body) =
        s.call("PUT", "/api/v1/users/admin/env", Some(r#"{"name": "WANDB_PROJECT", "value": "demo"}"#));
    assert_eq!(status, 204, "{body}");
    b.goto(&format!("{}/#/create", s.base));
    b.find("#inherited-env [data-name='WANDB_PROJECT']");
    let prefix = b.find(&input_id("metadata.namePrefix"));
    b.type_into(&prefix, "Bad Name");
    let problem = b.find("[data-path='metadata.namePrefix'] .field-problem");
    assert!(!b.text(&problem).is_empty());
    let cmd = b.find(&input_id("spec.environment.cmd"));
    b.type_into(&cmd, "echo formed $RANK of $WORLD_SIZE");
    pick(&b, &input_id("spec.compute.instanceSpecs.0.spec"), "cpu.small");
    b.screenshot(&shots().join("create-form-with-a-problem.png"));
    b.clear(&prefix);
    b.type_into(&prefix, "formed");
    b.wait("no problem, the demand and the admission answer", || {
        let clean = b.try_find(".field-problem").is_none();
        let admission = b.text_of("#admission");
        (clean && b.text_of("#summary").contains("1 replica,") && admission.contains("would be admitted now"))
            .then_some(())
    });
    b.screenshot(&shots().join("create-form.png"));
    let create = b.find("#create-submit");
    b.script("arguments[0].click(); arguments[0].click();", json!([create.reference()]));
    b.wait("the task page", || b.url().contains("#/tasks/").then_some(()));
    b.wait("success", || (b.text_of("h1 .badge") == "Succeeded").then_some(()));
    let (_, list) = s.call("GET", "/api/v1/tasks?q=formed", None);
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), 1, "{list}");

    // Clone pre-fills the form from the task; switch it to a RayJob.
    b.click(&b.find("#act-clone"));
    b.wait("the form, pre-filled", || {
        b.try_find(&input_id("metadata.namePrefix")).and_then(|e| {
            (b.script("return arguments[0].value", json!([e.reference()])) == "formed").then_some(())
        })
    });
    pick(&b, &input_id("spec.type"), "RayJob");
    b.find(&input_id("spec.ray.head.instanceSpec.spec"));
    assert!(b.try_find(&input_id("spec.advanced.precheck.enabled")).is_none(), "no precheck for RayJob");
    b.wait("the RayJob demand", || b.text_of("#summary").contains("head 1 ×").then_some(()));

    // To YAML and back, then create the RayJob.
    b.click(&b.find("#as-yaml"));
    b.wait("the YAML editor", || {
        b.try_find("#doc").and_then(|e| {
            let v = b.script("return arguments[0].value", json!([e.reference()]));
            v.as_str().is_some_and(|t| t.contains("type: RayJob")).then_some(())
        })
    });
    b.click(&b.find("#to-form"));
    b.find(&input_id("spec.ray.head.instanceSpec.spec"));
    let prefix = b.find(&input_id("metadata.namePrefix"));
    b.clear(&prefix);
    b.type_into(&prefix, "formray");
    b.wait("a valid RayJob", || b.text_of("#summary").contains("head 1 ×").then_some(()));
    b.click(&b.find("#create-submit"));
    b.wait("the RayJob's page", || b.text_of(".overview").contains("RayJob").then_some(()));
    let id = b.url().rsplit('/').next().unwrap().to_owned();
    assert_eq!(s.task(&id)["type"], "RayJob");
    s.call("POST", &format!("/api/v1/tasks/{id}/stop"), None);
}

/// The admin page marks the node of a running task failed (confirmation accepted); the task's page shows the
/// node failure and the resubmission on another node.
#[test]
fn admin_marks_a_node_failed_and_the_task_is_replaced() {
    let s = Server::start("console-admin", None);
    let mut task = common::pytorch("uinode", 0, "echo on $TRAINYARD_NODE; sleep 600");
    task["spec"]["advanced"] = json!({"faultTolerance": {"enabled": true, "maxResubmissions": 1}});
    let id = s.submit(&task);
    let t = s.wait_status(&id, "Running", secs(60));
    let node = t["placement"]["replicas"][0]["node"].as_str().unwrap().to_owned();
    let b = Browser::start();
    sign_in(&b, &s);
    b.goto(&format!("{}/#/admin", s.base));
    b.click(&b.find(&format!("tr[data-node='{node}'] [data-action='fail']")));
    b.wait("the node shown failed", || {
        (b.text_of(&format!("tr[data-node='{node}'] [data-state]")) == "failed").then_some(())
    });
    b.screenshot(&shots().join("admin.png"));
    b.goto(&format!("{}/#/tasks/{id}", s.base));
    b.wait("the replacement in the events", || {
        let events = b.text_of("#events");
        (events.contains("NodeFailed") && events.contains("Requeued") && b.text_of("h1 .badge") == "Running")
            .then_some(())
    });
    let t = s.task(&id);
    assert_ne!(t["placement"]["replicas"][0]["node"].as_str().unwrap(), node);
    s.call("POST", &format!("/api/v1/tasks/{id}/stop"), None);
}
