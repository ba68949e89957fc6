//! The web console in a real browser (Debian's headless chromium through chromedriver), against a real
//! `trainyard up` on the local backend. Screenshots go to `target/console-screenshots/` (or
//! `TRAINYARD_SCREENSHOTS`).

mod common;

use common::console::{DESKTOP, PHONE, framed, in_frame, pick, reload, scroll_to, shots};
use common::webdriver::Browser;
use common::{Server, secs};
use serde_json::json;

fn sign_in(b: &Browser, s: &Server) {
    common::console::sign_in(b, s);
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
    let id = b.task_id_on_page();
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
    let id = b.task_id_on_page();
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
    // Users and project groups: the admin is listed; a user saved from the form appears in both lists.
    b.wait("the users", || b.text_of("#users tr[data-user='admin']").contains("admin").then_some(()));
    b.type_into(&b.find("#user-name"), "erin");
    b.type_into(&b.find("#user-groups"), "default");
    b.click(&b.find("#save-user"));
    b.wait("erin in the users and in the group", || {
        let row = b.text_of("#users tr[data-user='erin']");
        let members = b.text_of("#project-groups tr[data-group='default'] .members");
        (row.contains("member") && row.contains("default") && members.contains("erin")).then_some(())
    });
    scroll_to(&b, "#users");
    b.screenshot(&shots().join("admin-users-and-groups.png"));
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
    let new_node = t["placement"]["replicas"][0]["node"].as_str().unwrap().to_owned();
    assert_ne!(new_node, node);
    // The attempts table: the first ended on the failed node and was requeued, the second runs elsewhere.
    b.wait("both attempts in the table", || {
        let first = b.text_of("#attempts tr[data-attempt='0']");
        let second = b.text_of("#attempts tr[data-attempt='1']");
        (first.contains("Requeued") && first.contains("NodeFailed") && second.contains("Running"))
            .then_some(())
    });
    assert_eq!(b.text_of("#attempts tr[data-attempt='0'] .nodes"), node);
    assert_eq!(b.text_of("#attempts tr[data-attempt='1'] .nodes"), new_node);
    scroll_to(&b, "#attempts");
    b.screenshot(&shots().join("attempts-after-node-failure.png"));
    s.call("POST", &format!("/api/v1/tasks/{id}/stop"), None);
}

/// The group's quota is full with a first task, so a second waits: the list shows it Queued with its place and
/// the scheduler's reason; when the first is stopped the second runs (Running in the list) and, told to finish,
/// succeeds, in the list and on its page, whose attempts table shows the one attempt and how it ended.
#[test]
fn a_queued_task_shows_its_place_and_reason_then_runs_and_succeeds() {
    let s = Server::start("console-queue", None);
    let one_unit = common::CATALOG.replace("spec: cpu.small, units: 12", "spec: cpu.small, units: 1");
    let (status, body) = s.call("PUT", "/api/v1/admin/catalog", Some(&one_unit));
    assert_eq!(status, 200, "{body}");
    let first = s.submit(&common::pytorch("hog", 0, "echo holding; sleep 600"));
    s.wait_status(&first, "Running", secs(60));
    // The second runs until the test lets it finish (a file in the shared volume): no timing involved.
    let mut waiter = common::pytorch(
        "waiter",
        0,
        "echo waiting; while [ ! -e /mnt/out/go-waiter ]; do sleep 0.1; done; echo went",
    );
    waiter["spec"]["environment"]["volumes"] = json!([{"volume": "out", "mountPath": "/mnt/out"}]);
    let second = s.submit(&waiter);

    let b = Browser::start();
    sign_in(&b, &s);
    b.goto(&format!("{}/#/tasks", s.base));
    let row = format!("tr[data-id='{second}']");
    let queue = b.wait("the second task queued with its place and reason", || {
        let status = b.text_of(&format!("{row} [data-status]"));
        let queue = b.text_of(&format!("{row} td.queue"));
        (status == "Queued" && queue.contains("#1") && queue.contains("has 0 left")).then_some(queue)
    });
    assert!(queue.contains("in group"), "{queue}");
    assert_eq!(b.text_of(&format!("tr[data-id='{first}'] [data-status]")), "Running");
    b.screenshot(&shots().join("task-list-queued.png"));
    // Its page by name (the list links by name): no log yet, and the pane says where it waits.
    let second_name = s.task(&second)["name"].as_str().unwrap().to_owned();
    let href = b
        .script("return arguments[0].getAttribute('href')", json!([b.find(&format!("{row} a")).reference()]));
    assert_eq!(href, json!(format!("#/tasks/{second_name}")));
    b.goto(&format!("{}/#/tasks/{second_name}", s.base));
    let waiting = b.wait("the queued task's log pane says it waits to start", || {
        let w = b.text_of("#log-waiting");
        (w.starts_with("Waiting to start: queued #1") && w.contains("has 0 left")).then_some(w)
    });
    assert!(b.text_of("h1").contains(&second_name), "{waiting}");
    // What holds its room: the first task, a link to its page, on the same quota.
    let first_name = s.task(&first)["name"].as_str().unwrap().to_owned();
    let held = b.wait("the queued task's overview names the task that holds its room", || {
        let held = b.text_of("[data-key='holders']");
        held.contains(&first_name).then_some(held)
    });
    assert!(held.contains("1 units of cpu.small, running") && held.contains("on the same quota"), "{held}");
    let link = b.script(
        "return arguments[0].getAttribute('href')",
        json!([b.find("[data-key='holders'] a").reference()]),
    );
    assert_eq!(link, json!(format!("#/tasks/{first_name}")));
    b.goto(&format!("{}/#/tasks", s.base));

    s.call("POST", &format!("/api/v1/tasks/{first}/stop"), None);
    b.wait("the second task running in the list, its queue cell empty", || {
        b.click(&b.find("#refresh"));
        let running = b.text_of(&format!("{row} [data-status]")) == "Running";
        (running && b.text_of(&format!("{row} td.queue")).is_empty()).then_some(())
    });
    assert_eq!(b.text_of(&format!("tr[data-id='{first}'] [data-status]")), "Stopped");
    b.screenshot(&shots().join("task-list-running.png"));

    let master = format!("{}-master-0", s.task(&second)["name"].as_str().unwrap());
    s.wait_log(&second, &master, "waiting", secs(30));
    let volume = s.dir.join("volumes/out");
    std::fs::create_dir_all(&volume).unwrap();
    std::fs::write(volume.join("go-waiter"), "").unwrap();
    b.wait("the second task succeeded in the list", || {
        b.click(&b.find("#refresh"));
        (b.text_of(&format!("{row} [data-status]")) == "Succeeded").then_some(())
    });
    b.click(&b.find(&format!("{row} a")));
    b.wait("its page, succeeded", || (b.text_of("h1 .badge") == "Succeeded").then_some(()));
    let attempt = b.text_of("#attempts tr[data-attempt='0']");
    assert!(attempt.contains("Succeeded") && attempt.contains("Completed"), "{attempt}");
    assert!(b.try_find("#attempts tr[data-attempt='1']").is_none(), "one attempt");
    assert!(!b.text_of("#attempts tr[data-attempt='0'] .nodes").starts_with('—'), "{attempt}");
    let events = b.text_of("#events");
    for reason in ["Submitted", "Admitted", "Started", "Completed"] {
        assert!(events.contains(reason), "{reason} not in {events}");
    }
    scroll_to(&b, "#attempts");
    b.screenshot(&shots().join("attempts.png"));
}

/// The labels editor offers the catalog's maintained keys; a key with allowed values offers them as choices
/// (label validation on: a select), and the validator's problem for a wrong label shows at its row.
#[test]
fn maintained_labels_are_offered_with_their_values() {
    let s = Server::start("console-labels", None);
    let catalog = format!(
        "{}labels:\n  validation: true\n  maintained: {{team: [nlp, vision], note: []}}\n",
        common::CATALOG
    );
    let (status, body) = s.call("PUT", "/api/v1/admin/catalog", Some(&catalog));
    assert_eq!(status, 200, "{body}");
    let b = Browser::start();
    sign_in(&b, &s);
    b.goto(&format!("{}/#/create", s.base));
    let add = b.find("#add-label");
    let keys = b.script(
        "return [...document.querySelectorAll('#maintained-labels option')].map(o => o.value)",
        json!([]),
    );
    assert_eq!(keys, json!(["note", "team"]), "the maintained keys are offered");
    // The first maintained key not in use comes with a new row: note, which takes any value (a text input).
    b.click(&add);
    let value = b.find("#label-value-0");
    assert_eq!(b.script("return arguments[0].tagName", json!([value.reference()])), "INPUT");
    b.type_into(&value, "first-run\u{E004}");
    // Then team, whose values are choices; with no value chosen yet the validator says so at the row.
    b.click(&b.find("#add-label"));
    let choices = b.script(
        "return [...document.querySelectorAll('#label-value-1 option')].map(o => o.value)",
        json!([]),
    );
    assert_eq!(choices, json!(["", "nlp", "vision"]), "the allowed values are the choices");
    let problem = b.find("[data-key='team'] .field-problem");
    assert!(b.text(&problem).contains("not an allowed value"), "{}", b.text(&problem));
    pick(&b, "#label-value-1", "vision");
    b.wait("the team problem to go", || {
        b.try_find("[data-key='team'] .field-problem").is_none().then_some(())
    });
    // A key that is not maintained: the problem shows at its row, naming the maintained ones.
    // Clearing the key is a change too (the row is drawn again), so the input is found again to type.
    b.clear(&b.find("#label-key-0"));
    b.type_into(&b.find("#label-key-0"), "colour\u{E004}");
    let problem = b.find("[data-key='colour'] .field-problem");
    assert!(b.text(&problem).contains("not maintained"), "{}", b.text(&problem));
    scroll_to(&b, "#labels");
    b.screenshot(&shots().join("create-form-labels.png"));
    b.clear(&b.find("#label-key-0"));
    b.type_into(&b.find("#label-key-0"), "note\u{E004}");
    b.wait("no label problem", || b.try_find("#labels .field-problem").is_none().then_some(()));
    let labels = b.script(
        "return [...document.querySelectorAll('#labels .label-row')].map(r => r.dataset.key)",
        json!([]),
    );
    assert_eq!(labels, json!(["note", "team"]));
}

/// Findings 10 and 11 in the console: Clone does not pre-fill a hidden value with the mask but leaves it
/// empty and asks for it (the form refuses to create until it is given), and what runs has the value typed;
/// on the admin page a user is disabled and enabled again, and a token of theirs revoked.
#[test]
fn clone_asks_for_hidden_values_and_admins_disable_users_and_revoke_tokens() {
    let s = Server::start("console-clone", None);
    let mut task = common::pytorch("secretive", 0, "echo token=$TOKEN");
    task["spec"]["environment"]["env"] = json!([{"name": "TOKEN", "value": "the-original", "hidden": true}]);
    let id = s.submit(&task);
    let b = Browser::start();
    sign_in(&b, &s);
    b.goto(&format!("{}/#/create?from={id}", s.base));
    let value = input_id("spec.environment.env.0.value");
    b.wait("the form, pre-filled", || b.try_find(&value));
    let v = b
        .script("return [arguments[0].value, arguments[0].placeholder]", json!([b.find(&value).reference()]));
    assert_eq!(v[0], "", "the hidden value is not carried: {v}");
    assert!(v[1].as_str().unwrap().contains("enter the value"), "{v}");
    assert!(b.text_of("#clone-note").contains("enter TOKEN again"), "{}", b.text_of("#clone-note"));
    b.wait("the problem at the field", || {
        b.try_find("[data-path='spec.environment.env.0.value'] .field-problem").map(|_| ())
    });
    b.type_into(&b.find(&value), "typed-again");
    b.wait("no problem", || b.try_find(".field-problem").is_none().then_some(()));
    b.click(&b.find("#create-submit"));
    b.wait("the clone's page", || (b.url().contains("#/tasks/") && !b.url().ends_with(&id)).then_some(()));
    let clone = b.task_id_on_page();
    let t = s.wait_status(&clone, "Succeeded", secs(60));
    let log = s.log(&clone, &format!("{}-master-0", t["name"].as_str().unwrap()), None);
    assert!(log.contains("token=typed-again") && !log.contains("the-original"), "{log}");

    // The admin page: disable erin (her token is refused), enable her, revoke her token.
    let body = json!({"name": "erin", "role": "member", "groups": ["default"]}).to_string();
    assert_eq!(s.call("POST", "/api/v1/admin/users", Some(&body)).0, 200);
    let (_, t) = s.call("POST", "/api/v1/users/erin/tokens", Some(r#"{"label": "laptop"}"#));
    let token: serde_json::Value = serde_json::from_str(&t).unwrap();
    let (erin, token_id) =
        (token["token"].as_str().unwrap().to_owned(), token["id"].as_str().unwrap().to_owned());
    let whoami = |tok: &str| {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .new_agent()
            .get(&format!("{}/api/v1/whoami", s.base))
            .header("Authorization", &format!("Bearer {tok}"))
            .call()
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(whoami(&erin), 200);
    b.goto(&format!("{}/#/admin", s.base));
    b.wait("erin", || b.try_find("#users tr[data-user='erin'] [data-action='disable']"));
    b.click(&b.find("#users tr[data-user='erin'] [data-action='disable']"));
    // The admin chooses what becomes of her work (the defaults: queued held, running stopped).
    b.wait("the choice", || b.try_find("#users tr[data-choice-for='erin'] [data-action='confirm-disable']"));
    let value = |css: &str| b.script("return document.querySelector(arguments[0]).value", json!([css]));
    assert_eq!(value("#users tr[data-choice-for='erin'] select[name='queued']"), "hold");
    assert_eq!(value("#users tr[data-choice-for='erin'] select[name='running']"), "stop");
    b.click(&b.find("#users tr[data-choice-for='erin'] [data-action='confirm-disable']"));
    b.wait("erin disabled", || b.try_find("#users tr[data-user='erin'][data-disabled='true']").map(|_| ()));
    assert_eq!(whoami(&erin), 403);
    scroll_to(&b, "#users");
    b.screenshot(&shots().join("admin-user-disabled.png"));
    b.click(&b.find("#users tr[data-user='erin'] [data-action='enable']"));
    b.wait("erin enabled", || b.try_find("#users tr[data-user='erin'][data-disabled='false']").map(|_| ()));
    assert_eq!(whoami(&erin), 200);
    b.click(&b.find("#users tr[data-user='erin'] [aria-label='tokens of erin']"));
    let row = format!("#tokens tr[data-token='{token_id}']");
    b.wait("erin's token", || b.try_find(&row));
    assert!(b.text_of(&row).contains("laptop"));
    b.click(&b.find(&format!("{row} button")));
    b.wait("the token gone", || b.try_find(&row).is_none().then_some(()));
    assert_eq!(whoami(&erin), 401);
    // Deleted, with running tasks left running: the row says the name is retired.
    b.click(&b.find("#users tr[data-user='erin'] [data-action='delete']"));
    let form = "#users tr[data-choice-for='erin']";
    b.wait("the delete choice", || b.try_find(&format!("{form} [data-action='confirm-delete']")));
    b.script(
        "const s = document.querySelector(arguments[0]); s.value = 'keep'; s.dispatchEvent(new Event('change'));",
        json!([format!("{form} select[name='running']")]),
    );
    b.click(&b.find(&format!("{form} [data-action='confirm-delete']")));
    b.wait("erin deleted", || {
        b.text_of("#users tr[data-user='erin']").contains("name retired").then_some(())
    });
    assert!(b.text_of("#admin-msg").contains("running tasks: keep"), "{}", b.text_of("#admin-msg"));
    let (_, users) = s.call("GET", "/api/v1/admin/users", None);
    let users: serde_json::Value = serde_json::from_str(&users).unwrap();
    let erin_row = users["items"].as_array().unwrap().iter().find(|u| u["name"] == "erin").unwrap().clone();
    assert_eq!(erin_row["deleted"], json!(true), "{erin_row}");
    // Who may use what: the catalog's entries with their groups.
    assert!(b.text_of("#catalog-groups tr[data-entry='image/host']").contains("admins only"));
}

/// Registry images in the console: the picker offers the catalog's presets (one stands for a registry image),
/// an address is checked as it is typed (syntax, then its registry), the task runs from it, and the next form
/// offers it as recently used; the admin page shows the cache, sets a registry login (never shown again) and
/// prunes what no task runs.
#[test]
fn registry_images_in_the_form_and_on_the_admin_page() {
    use trainyard_images::testing::{GZIP_LAYER, TestRegistry, debian_closure, gzip, host_layer};
    let reg = TestRegistry::start("console", false, false);
    let base = gzip(&host_layer(&debian_closure(&["bash", "coreutils"])));
    let digest = reg.push("team/tools", "1", &[(GZIP_LAYER, base)], json!({"Env": ["TOOL=registry"]}));
    let s = Server::start("console-images", None);
    let mut catalog: serde_json::Value = serde_saphyr::from_str(common::CATALOG).unwrap();
    catalog["allowExternalImages"] = json!(true);
    catalog["registries"] = json!({ reg.host.clone(): {"insecure": true} });
    catalog["images"]["tools"] = json!({"reference": format!("{}/team/tools:1", reg.host)});
    let (status, body) = s.call("PUT", "/api/v1/admin/catalog", Some(&catalog.to_string()));
    assert_eq!(status, 200, "{body}");
    let b = Browser::start();
    sign_in(&b, &s);
    b.goto(&format!("{}/#/create", s.base));
    let image = b.find(&input_id("spec.environment.image"));
    let options = b.script(
        "return [...document.querySelectorAll('#image-choices option')].map(o => o.value + '=' + o.dataset.kind)",
        json!([]),
    );
    let options = options.to_string();
    assert!(options.contains("host=preset") && options.contains("tools=preset"), "{options}");
    assert!(b.text_of("#image-picker").contains(&reg.host), "{}", b.text_of("#image-picker"));
    let prefix = b.find(&input_id("metadata.namePrefix"));
    b.type_into(&prefix, "fromreg");
    b.type_into(&b.find(&input_id("spec.environment.cmd")), "echo tool is $TOOL");
    let problem =
        |b: &Browser| b.try_find("[data-path='spec.environment.image'] .field-problem").map(|e| b.text(&e));
    b.clear(&image);
    b.type_into(&image, "Team/Tools:1");
    b.wait("the address's syntax refused", || problem(&b).filter(|p| !p.is_empty()));
    b.clear(&image);
    b.type_into(&image, "other.example/team/tools:1");
    b.wait("a registry the catalog does not allow", || problem(&b).filter(|p| p.contains(&reg.host)));
    b.screenshot(&shots().join("create-form-image-registry-not-allowed.png"));
    let address = format!("{}/team/tools:1", reg.host);
    b.clear(&image);
    b.type_into(&image, &address);
    b.wait("no problem", || problem(&b).is_none().then_some(()));
    b.screenshot(&shots().join("create-form-image-address.png"));
    b.click(&b.find("#create-submit"));
    b.wait("the task page", || b.url().contains("#/tasks/").then_some(()));
    b.wait("success", || (b.text_of("h1 .badge") == "Succeeded").then_some(()));
    b.wait("the pull in the events", || b.text_of("#events").contains(&digest).then_some(()));
    b.wait("the image's env in the log", || b.text_of("#log").contains("tool is registry").then_some(()));

    // The next form offers it as recently used.
    b.goto(&format!("{}/#/create", s.base));
    b.wait("the recent image", || {
        let v = b.script(
            "return [...document.querySelectorAll('#image-choices option[data-kind=recent]')].map(o => o.value)",
            json!([]),
        );
        v.to_string().contains(&address).then_some(())
    });

    // The admin page: the cache, a login, a prune.
    b.goto(&format!("{}/#/admin", s.base));
    b.wait("the cached image", || {
        b.text_of(&format!("#cached-images tr[data-digest='{digest}']")).contains(&address).then_some(())
    });
    b.type_into(&b.find("#login-host"), &reg.host);
    b.type_into(&b.find("#login-user"), "ci-bot");
    b.type_into(&b.find("#login-password"), "never-shown-again");
    b.click(&b.find("#set-login"));
    b.wait("the login listed", || {
        b.text_of(&format!("#registry-logins tr[data-host='{}']", reg.host)).contains("ci-bot").then_some(())
    });
    assert!(!b.script("return document.body.innerText", json!([])).to_string().contains("never-shown-again"));
    scroll_to(&b, "#cached-images");
    b.screenshot(&shots().join("admin-image-cache.png"));
    b.click(&b.find("#prune-images"));
    b.wait("the cache emptied", || b.text_of("#cached-images").contains("No registry images").then_some(()));
    assert!(b.text_of("#admin-msg").contains("pruned 1 image,"), "{}", b.text_of("#admin-msg"));
}

/// How wide the framed page's header and document are, against the frame's width: [header scroll width,
/// header client width, document scroll width, frame width].
fn framed_widths(b: &Browser) -> Vec<i64> {
    let v = in_frame(
        b,
        "const hd = d.querySelector('header');
         return [hd.scrollWidth, hd.clientWidth, d.documentElement.scrollWidth, d.documentElement.clientWidth];",
    );
    v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect()
}

/// Issue 14, point 9: switching the form to RayJob hides the precheck and exit-checkpoint controls, and what
/// they held is not sent, so Create is not blocked by a problem the user has no control for.
#[test]
fn controls_the_form_hides_are_not_sent() {
    let s = Server::start("console-hidden", None);
    let b = Browser::start();
    sign_in(&b, &s);
    b.goto(&format!("{}/#/create", s.base));
    b.type_into(&b.find(&input_id("metadata.namePrefix")), "rayhidden");
    b.type_into(&b.find(&input_id("spec.environment.cmd")), "echo hi");
    b.click(&b.find(&input_id("spec.advanced.precheck.enabled")));
    b.find(&input_id("spec.advanced.precheck.timeoutSeconds"));
    b.click(&b.find(&input_id("spec.advanced.exitCheckpoint.enabled")));
    b.find(&input_id("spec.advanced.exitCheckpoint.timeoutSeconds"));
    pick(&b, &input_id("spec.type"), "RayJob");
    b.find(&input_id("spec.ray.head.instanceSpec.spec"));
    assert!(b.try_find(&input_id("spec.advanced.precheck.enabled")).is_none(), "no precheck for RayJob");
    assert!(b.try_find(&input_id("spec.advanced.exitCheckpoint.enabled")).is_none(), "no exit checkpoint");
    b.wait("the RayJob demand", || b.text_of("#summary").contains("head 1 ×").then_some(()));
    b.click(&b.find("#create-submit"));
    b.wait("the RayJob's page", || b.text_of(".overview").contains("RayJob").then_some(()));
    let id = b.task_id_on_page();
    let advanced = &s.task(&id)["spec"]["spec"]["advanced"];
    assert!(advanced.get("precheck").is_none() && advanced.get("exitCheckpoint").is_none(), "{advanced}");
    s.call("POST", &format!("/api/v1/tasks/{id}/stop"), None);
}

/// Issue 14, point 9: an untouched form shows no problems (the validator still answers: the demand panel and
/// a count of what is left); a field shows its problem once typed in, the rest once Create is pressed.
#[test]
fn a_pristine_form_shows_no_problems_until_touched_or_created() {
    let s = Server::start("console-pristine", None);
    let b = Browser::start();
    sign_in(&b, &s);
    b.goto(&format!("{}/#/create", s.base));
    b.wait("the validator's answer", || b.text_of("#summary").contains("Demand and quota").then_some(()));
    assert!(b.try_find(".field-problem").is_none(), "a problem shown on a pristine form");
    assert!(b.text_of("#problems-pending").contains("2 problems left"), "{}", b.text_of("#problems"));
    let url = format!("{}/#/create", s.base);
    framed(&b, &url, DESKTOP, "#summary h2");
    b.screenshot(&shots().join("create-form-pristine-desktop.png"));
    framed(&b, &url, PHONE, "#summary h2");
    let widths = framed_widths(&b);
    assert!(
        widths[0] <= widths[1] && widths[2] <= widths[3],
        "the form overflows at phone width: {widths:?}"
    );
    b.screenshot(&shots().join("create-form-pristine-phone.png"));

    reload(&b, &url);
    b.type_into(&b.find(&input_id("metadata.namePrefix")), "Bad Name");
    b.find("[data-path='metadata.namePrefix'] .field-problem");
    assert!(b.try_find("[data-path='spec.environment.cmd'] .field-problem").is_none(), "cmd not touched yet");
    b.click(&b.find("#create-submit"));
    b.find("[data-path='spec.environment.cmd'] .field-problem");
    assert!(b.url().ends_with("#/create"), "nothing created: {}", b.url());
}

/// Issue 14, point 9: a volume's mount path starts as /volume/NAME (one slash) and follows the volume chosen;
/// with no volumes, datasets or models in the catalog each picker says so and who adds them.
#[test]
fn mount_paths_are_clean_and_empty_pickers_say_so() {
    let s = Server::start("console-pickers", None);
    let b = Browser::start();
    sign_in(&b, &s);
    b.goto(&format!("{}/#/create", s.base));
    b.click(&b.find("[id='add-spec.environment.volumes']"));
    let mount = input_id("spec.environment.volumes.0.mountPath");
    let value = |b: &Browser| b.script("return arguments[0].value", json!([b.find(&mount).reference()]));
    assert_eq!(value(&b), "/volume/out");
    pick(&b, &input_id("spec.environment.volumes.0.volume"), "raytmp");
    assert_eq!(value(&b), "/volume/raytmp");

    let bare = common::CATALOG
        .replace("volumes: {out: {multiPodReadWrite: true}, raytmp: {multiPodReadWrite: true}}\n", "")
        .replace("datasets: {data: {}}\n", "");
    let (status, body) = s.call("PUT", "/api/v1/admin/catalog", Some(&bare));
    assert_eq!(status, 200, "{body}");
    reload(&b, &format!("{}/#/create", s.base));
    b.find("[data-empty='spec.environment.volumes']");
    for (path, kind) in [("volumes", "volumes"), ("datasets", "datasets"), ("models", "models")] {
        let said = b.text_of(&format!("[data-empty='spec.environment.{path}']"));
        assert!(
            said.contains(&format!("No {kind} in the catalog")) && said.contains("admin"),
            "{path}: {said}"
        );
        assert!(b.try_find(&format!("[id='add-spec.environment.{path}']")).is_none(), "nothing to add");
    }
    scroll_to(&b, "[data-empty='spec.environment.volumes']");
    b.screenshot(&shots().join("create-form-empty-pickers.png"));
}

/// Issue 14, point 9: an empty task list says there are no tasks and links to the form; the header fits a
/// phone's width.
#[test]
fn the_empty_task_list_says_so_and_the_header_fits_a_phone() {
    let s = Server::start("console-empty", None);
    let b = Browser::start();
    sign_in(&b, &s);
    b.goto(&format!("{}/#/tasks", s.base));
    let empty = b.find("#tasks-empty");
    assert!(b.text(&empty).contains("no tasks"), "{}", b.text(&empty));
    let url = format!("{}/#/tasks", s.base);
    framed(&b, &url, DESKTOP, "#tasks-empty");
    b.screenshot(&shots().join("task-list-empty-desktop.png"));
    framed(&b, &url, PHONE, "#tasks-empty");
    let widths = framed_widths(&b);
    assert!(widths[0] <= widths[1] && widths[2] <= widths[3], "overflows at phone width: {widths:?}");
    b.screenshot(&shots().join("task-list-empty-phone.png"));

    reload(&b, &format!("{}/#/tasks?q=nothing-like-this", s.base));
    b.wait("no match", || b.text_of("#tasks-empty").contains("No tasks match").then_some(()));
    reload(&b, &url);
    b.click(&b.find("#tasks-empty-create"));
    b.wait("the form", || b.try_find(&input_id("metadata.namePrefix")));

    // With a task in it, at both widths.
    let id = s.submit(&common::pytorch("listed", 0, "echo listed"));
    s.wait_status(&id, "Succeeded", secs(60));
    let row = format!("tr[data-id='{id}']");
    framed(&b, &url, DESKTOP, &row);
    b.screenshot(&shots().join("task-list-desktop.png"));
    framed(&b, &url, PHONE, &row);
    let widths = framed_widths(&b);
    assert!(widths[0] <= widths[1] && widths[2] <= widths[3], "overflows at phone width: {widths:?}");
    b.screenshot(&shots().join("task-list-phone.png"));
}
