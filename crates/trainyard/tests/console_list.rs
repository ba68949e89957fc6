//! The console's task list in a real browser (Debian's headless chromium through chromedriver) against a real
//! `trainyard up` on the local backend: the tabs (everything the user may see, their own, their project
//! groups'), the accelerator filter, what each task asks for and how long it has waited or run, the Create
//! button, and the list at desktop and phone widths. Screenshots go to `target/console-screenshots/` (or
//! `TRAINYARD_SCREENSHOTS`).

mod common;

use common::console::{DESKTOP, PHONE, framed, in_frame, pick, shots, sign_in_as};
use common::webdriver::Browser;
use common::{Server, secs};
use serde_json::{Value, json};
use std::collections::BTreeSet;

/// WebDriver's codes for the keys a tablist answers.
const ARROW_RIGHT: &str = "\u{E014}";
const ARROW_LEFT: &str = "\u{E012}";
const HOME: &str = "\u{E011}";

/// The tests' catalog with a second project group (`vision`) and a GPU pool whose one node is cordoned at the
/// start, so GPU tasks wait in the queue (this machine runs no GPU work).
fn catalog() -> String {
    let mut c = common::CATALOG
        .replace("projectGroups: {default: {}}", "projectGroups: {default: {}, vision: {}}")
        // Members of vision run on the host image too (admins may anyway).
        .replace("  host: {torch: true, ray: true}", "  host: {torch: true, ray: true, projectGroups: [vision]}")
        .replace(
            "  default: {cluster: local, instanceSpecs: [cpu.small, cpu.large]}\n",
            "  default: {cluster: local, instanceSpecs: [cpu.small, cpu.large]}\n  gpu: {cluster: local, instanceSpecs: [gpu.one]}\n",
        )
        .replace(
            "instanceSpecs:\n  cpu.small:",
            "instanceSpecs:\n  gpu.one: {kind: GPU, gpus: 1, gpuModel: A100, vcpus: 2, memoryMib: 8192}\n  cpu.small:",
        )
        .replace("nodes:\n", "nodes:\n  gpu-a: {pool: gpu, gpus: 4, gpuModel: A100, vcpus: 8, memoryMib: 32768}\n");
    c.push_str("  - {group: default, resourceType: Reserved, pool: gpu, spec: gpu.one, units: 4}\n");
    c.push_str("  - {group: vision, resourceType: Reserved, pool: default, spec: cpu.small, units: 4}\n");
    c
}

/// A PyTorchJob of `group` on `spec` with `workers` workers running `cmd`, public to its group or not.
fn task(prefix: &str, group: &str, spec: &str, workers: u32, cmd: &str, public: bool) -> Value {
    let mut t = common::pytorch_on(spec, prefix, workers, cmd);
    t["metadata"]["projectGroup"] = json!(group);
    t["metadata"]["public"] = json!(public);
    if spec == "gpu.one" {
        t["spec"]["compute"]["pool"] = json!("gpu");
    }
    t
}

/// An HTTP call with another user's token.
fn call_as(s: &Server, token: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let agent = common::agent();
    let url = format!("{}{path}", s.base);
    let auth = format!("Bearer {token}");
    let resp = match method {
        "GET" => agent.get(&url).header("Authorization", &auth).call(),
        _ => agent.post(&url).header("Authorization", &auth).send(body.unwrap_or("").as_bytes()),
    };
    let mut r = resp.unwrap();
    (r.status().as_u16(), r.body_mut().read_to_string().unwrap_or_default())
}

/// The ids of the rows the list shows now.
fn rows(b: &Browser) -> BTreeSet<String> {
    let v = b
        .script("return [...document.querySelectorAll('#task-rows tr')].map((r) => r.dataset.id)", json!([]));
    v.as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_owned()).collect()
}

/// Waits until the list shows exactly `want`.
fn wait_rows(b: &Browser, what: &str, want: &[&String]) {
    let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
    let t0 = std::time::Instant::now();
    loop {
        let now = rows(b);
        if now == want {
            return;
        }
        assert!(t0.elapsed() < secs(30), "{what}: the list shows {now:?}, not {want:?}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The selected tab's id, and the id of the element that has the focus.
fn tab_state(b: &Browser) -> (String, String) {
    let v = b.script(
        "return [document.querySelector('[role=tab][aria-selected=true]')?.id || '', document.activeElement?.id || '']",
        json!([]),
    );
    (v[0].as_str().unwrap().to_owned(), v[1].as_str().unwrap().to_owned())
}

/// In the frame: [document scroll width, frame width, widest right edge of a tab, filter or card].
fn framed_widths(b: &Browser) -> Vec<i64> {
    let v = in_frame(
        b,
        "const right = Math.max(...[...d.querySelectorAll('[role=tab], .filters label, #task-rows tr')]
           .map((e) => Math.ceil(e.getBoundingClientRect().right)));
         return [d.documentElement.scrollWidth, d.documentElement.clientWidth, right];",
    );
    v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect()
}

/// A member (of `vision`) and an admin (of `default`) with tasks in both groups: each tab shows the right
/// rows for each, is kept in the URL across a reload and is chosen with the arrow keys; the accelerator filter
/// splits GPU from CPU tasks; the resource column shows a queued task's demand and a running task's
/// placement; the duration column says how long each has waited, run or ran; Create training opens the form;
/// the list at desktop and phone widths.
#[test]
fn the_task_list_tabs_filters_resources_and_durations() {
    let s = Server::start("console-list", None);
    let (status, body) = s.call("PUT", "/api/v1/admin/catalog", Some(&catalog()));
    assert_eq!(status, 200, "{body}");
    // The GPU node takes no work: GPU tasks stay queued with their demand.
    let (status, body) = s.call("PUT", "/api/v1/admin/nodes/gpu-a", Some(r#"{"schedulable": false}"#));
    assert_eq!(status, 204, "{body}");
    let admin = json!({"name": "admin", "role": "admin", "groups": ["default"]}).to_string();
    assert_eq!(s.call("POST", "/api/v1/admin/users", Some(&admin)).0, 200);
    let mia = json!({"name": "mia", "role": "member", "groups": ["vision"]}).to_string();
    assert_eq!(s.call("POST", "/api/v1/admin/users", Some(&mia)).0, 200);
    let (_, t) = s.call("POST", "/api/v1/users/mia/tokens", Some(r#"{"label": "browser"}"#));
    let mia_token = serde_json::from_str::<Value>(&t).unwrap()["token"].as_str().unwrap().to_owned();

    let quick = s.submit(&task("adm-quick", "default", "cpu.small", 0, "echo done", false));
    s.wait_status(&quick, "Succeeded", secs(60));
    let cpu = s.submit(&task("adm-cpu", "default", "cpu.small", 1, "sleep 600", false));
    let gpu = s.submit(&task("adm-gpu", "default", "gpu.one", 1, "sleep 600", false));
    let private = s.submit(&task("adm-private", "default", "cpu.small", 0, "sleep 600", false));
    let shown = s.submit(&task("adm-vision", "vision", "cpu.small", 0, "sleep 600", true));
    let (status, body) = call_as(
        &s,
        &mia_token,
        "POST",
        "/api/v1/tasks",
        Some(&task("mia-own", "vision", "cpu.small", 0, "sleep 600", false).to_string()),
    );
    assert_eq!(status, 201, "{body}");
    let own = serde_json::from_str::<Value>(&body).unwrap()["id"].as_str().unwrap().to_owned();
    s.wait_status(&cpu, "Running", secs(60));
    assert_eq!(s.task(&gpu)["status"], "Queued");

    let b = Browser::start();
    let list = format!("{}/#/tasks", s.base);

    // The member: everything she may see is her own and the public task of her group.
    sign_in_as(&b, &s, &mia_token, "mia");
    b.goto(&list);
    wait_rows(&b, "mia, all", &[&own, &shown]);
    assert_eq!(tab_state(&b).0, "tab-all");
    b.click(&b.find("#tab-mine"));
    wait_rows(&b, "mia, mine", &[&own]);
    assert!(b.url().contains("tab=mine"), "{}", b.url());
    assert!(b.try_find("#f-owner").is_none(), "no owner filter on Mine");
    // Kept across a reload, as a shared link would be.
    b.goto("about:blank");
    b.goto(&format!("{list}?tab=mine"));
    wait_rows(&b, "mia, mine after a reload", &[&own]);
    assert_eq!(tab_state(&b).0, "tab-mine");
    // The arrow keys move along the tabs, choose, and keep the focus on the tab chosen.
    b.type_into(&b.find("#tab-mine"), ARROW_RIGHT);
    b.wait("My project groups chosen with the keyboard", || {
        (tab_state(&b) == ("tab-groups".into(), "tab-groups".into())).then_some(())
    });
    wait_rows(&b, "mia, her groups", &[&own, &shown]);
    assert!(b.url().contains("tab=groups"), "{}", b.url());
    let groups =
        b.script("return [...document.querySelectorAll('#f-group option')].map((o) => o.value)", json!([]));
    assert_eq!(groups, json!(["", "vision"]), "the group filter offers her groups");
    b.type_into(&b.find("#tab-groups"), HOME);
    b.wait("All chosen with Home", || (tab_state(&b) == ("tab-all".into(), "tab-all".into())).then_some(()));
    b.type_into(&b.find("#tab-all"), ARROW_LEFT);
    b.wait("the last tab, wrapping round", || (tab_state(&b).0 == "tab-groups").then_some(()));
    let roving =
        b.script("return [...document.querySelectorAll('[role=tab]')].map((t) => t.tabIndex)", json!([]));
    assert_eq!(roving, json!([-1, -1, 0]), "only the selected tab is in the tab order");

    // The admin: all of it, their own, and their group's.
    sign_in_as(&b, &s, &s.token, "admin");
    b.goto(&list);
    let every = [&quick, &cpu, &gpu, &private, &shown, &own];
    wait_rows(&b, "admin, all", &every);
    b.goto(&format!("{list}?tab=mine"));
    wait_rows(&b, "admin, mine", &[&quick, &cpu, &gpu, &private, &shown]);
    b.goto(&format!("{list}?tab=groups"));
    wait_rows(&b, "admin, default's", &[&quick, &cpu, &gpu, &private]);

    // The accelerator filter, from the form, kept in the URL with the tab.
    pick(&b, "#f-accelerator", "gpu");
    b.click(&b.find("form.filters button[type=submit]"));
    wait_rows(&b, "GPU tasks of default", &[&gpu]);
    assert!(b.url().contains("tab=groups") && b.url().contains("accelerator=gpu"), "{}", b.url());
    b.goto(&format!("{list}?accelerator=cpu"));
    wait_rows(&b, "CPU-only tasks", &[&quick, &cpu, &private, &shown, &own]);
    let chosen = b.script("return document.getElementById('f-accelerator').value", json!([]));
    assert_eq!(chosen, json!("cpu"), "the filter shows what the URL says");
    let label = b.script("return document.querySelector('label:has(#f-accelerator)').textContent", json!([]));
    assert!(label.as_str().unwrap().starts_with("Accelerator"), "{label}");

    // What each asks for and how long: the queued GPU task's demand, the running task's placement, the
    // ended task's run.
    b.goto(&list);
    wait_rows(&b, "admin, all again", &every);
    let cell = |id: &str, class: &str| b.text_of(&format!("tr[data-id='{id}'] td.{class}"));
    let queued = cell(&gpu, "resources");
    assert!(queued.contains("2 × 1 GPU") && queued.contains("2 vCPU, 8 GiB each"), "{queued}");
    assert!(cell(&gpu, "duration").starts_with("queued "), "{}", cell(&gpu, "duration"));
    assert_eq!(cell(&cpu, "resources"), "2 × 1 vCPU, 1 GiB");
    assert!(cell(&cpu, "duration").starts_with("running "), "{}", cell(&cpu, "duration"));
    assert_eq!(cell(&quick, "resources"), "1 vCPU, 1 GiB");
    let ran = cell(&quick, "duration");
    assert!(ran.starts_with("ran ") && ran.contains("ended"), "{ran}");
    // Durations move on while the page is open (the list refreshes itself).
    let before = cell(&gpu, "duration");
    b.wait("the queued time growing", || (cell(&gpu, "duration") != before).then_some(()));
    let created = b.script(
        "const t = document.querySelector(`tr[data-id='${arguments[0]}'] td.created time`); return [t.textContent, t.getAttribute('datetime')]",
        json!([gpu]),
    );
    assert!(created[1].as_str().unwrap().ends_with('Z'), "an exact time in the markup: {created}");
    let headers =
        b.script("return [...document.querySelectorAll('table.tasks th')].map((t) => t.scope)", json!([]));
    assert!(headers.as_array().unwrap().iter().all(|s| s == "col"), "{headers}");

    // Create training goes to the form.
    b.click(&b.find("#create-training"));
    b.wait("the form", || b.try_find("[id='in-metadata.namePrefix']"));
    assert!(b.url().ends_with("#/create"), "{}", b.url());

    // The list at both widths: at a phone's, nothing runs off the side.
    let row = format!("tr[data-id='{gpu}']");
    // The filters are open at a desktop's width; a phone folds them away so the first task shows at once.
    let fold = |b: &Browser| {
        b.script(
            "const d = document.getElementById('frame').contentDocument;
             const box = d.querySelector('details.filter-box');
             return [box.open, box.querySelector('summary').textContent,
                     d.querySelector('#task-rows tr').getBoundingClientRect().top];",
            json!([]),
        )
    };
    framed(&b, &format!("{list}?accelerator=gpu"), DESKTOP, &row);
    let open = fold(&b);
    assert_eq!((&open[0], &open[1]), (&json!(true), &json!("Filters · 1 set")), "at a desktop's width");
    framed(&b, &list, DESKTOP, &row);
    std::thread::sleep(std::time::Duration::from_millis(300));
    b.screenshot(&shots().join("list-desktop.png"));
    framed(&b, &list, PHONE, &row);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let widths = framed_widths(&b);
    assert!(
        widths[0] <= widths[1] && widths[2] <= widths[1],
        "the list overflows at phone width: {widths:?}"
    );
    let folded = fold(&b);
    assert_eq!(folded[0], json!(false), "{folded}");
    assert!(
        folded[2].as_f64().unwrap() < f64::from(PHONE.1) / 2.0,
        "the first task in the top half: {folded}"
    );
    b.screenshot(&shots().join("list-phone.png"));

    for id in [&cpu, &gpu, &private, &shown, &own] {
        s.call("POST", &format!("/api/v1/tasks/{id}/stop"), None);
    }
}
