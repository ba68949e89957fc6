//! The admin page's catalog editor and the account page's tokens, in a real browser (Debian's headless
//! chromium through chromedriver) against a real `trainyard up` on the local backend. Screenshots go to
//! `target/console-screenshots/` (or `TRAINYARD_SCREENSHOTS`).

mod common;

use common::console::{DESKTOP, PHONE, framed, framed_widths, in_frame, pick, reload, shots, sign_in_as};
use common::webdriver::Browser;
use common::{Server, secs};
use serde_json::{Value, json};

/// Replaces what an input holds, as typing would.
fn retype(b: &Browser, css: &str, text: &str) {
    let el = b.find(css);
    b.clear(&el);
    b.type_into(&el, text);
}

fn catalog(s: &Server) -> Value {
    let (status, body) = s.call("GET", "/api/v1/catalog", None);
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Status of `GET /api/v1/whoami` with `token`, and the name it answers.
fn whoami(s: &Server, token: &str) -> (u16, String) {
    let mut r = common::agent()
        .get(&format!("{}/api/v1/whoami", s.base))
        .header("Authorization", &format!("Bearer {token}"))
        .call()
        .unwrap();
    let body: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap_or(Value::Null);
    (r.status().as_u16(), body["name"].as_str().unwrap_or("").to_owned())
}

/// The page's controls that have no accessible name (no label, aria-label or text), as HTML excerpts.
fn unlabelled(b: &Browser) -> Value {
    b.script(
        "const named = (e) => e.labels?.length || e.getAttribute('aria-label') || e.getAttribute('aria-labelledby')
           || (e.tagName === 'BUTTON' && e.textContent.trim());
         return [...document.querySelectorAll('main input, main select, main textarea, main button')]
           .filter((e) => !named(e)).map((e) => e.outerHTML.slice(0, 160));",
        json!([]),
    )
}

/// A GPU node whose device list the form does not show: it must come back from a form save unchanged.
const GPU_NODE: &str =
    "  gpu-0: {pool: default, gpuModel: A100, gpus: 2, gpuDevices: [0, 1], vcpus: 8, memoryMib: 65536}\n";

/// An admin adds an instance spec, offers it in a pool, adds a node and a quota line through the catalog
/// form, and saves: GET /api/v1/catalog has them, and the node's GPU devices (not in the form) are kept. A
/// region that a cluster still names is refused with the server's reason at the cluster. Removing the node
/// a running task uses is refused with the conflict shown, then saved anyway.
#[test]
fn admin_edits_the_catalog_through_its_form() {
    let s = Server::start("console-catalog", None);
    let with_gpu = common::CATALOG.replace("nodes:\n", &format!("nodes:\n{GPU_NODE}"));
    let (status, body) = s.call("PUT", "/api/v1/admin/catalog", Some(&with_gpu));
    assert_eq!(status, 200, "{body}");
    let id = s.submit(&common::pytorch("holder", 0, "echo holding; sleep 600"));
    let t = s.wait_status(&id, "Running", secs(60));
    let (task, node) = (
        t["name"].as_str().unwrap().to_owned(),
        t["placement"]["replicas"][0]["node"].as_str().unwrap().to_owned(),
    );

    let b = Browser::start();
    sign_in_as(&b, &s, &s.token, "admin");
    b.goto(&format!("{}/#/admin", s.base));
    b.find("[data-entry='regions/local']");
    b.script(
        "document.querySelectorAll('#catalog-form details').forEach((d) => { d.open = true; })",
        json!([]),
    );
    b.find("[data-entry='projectGroups/default'] .quota-line");
    assert_eq!(unlabelled(&b), json!([]), "every control of the admin page has a name");
    b.script(
        "document.querySelectorAll('#catalog-form details').forEach((d) => { d.open = d.dataset.kind === 'regions'; })",
        json!([]),
    );

    // A new instance spec, 1 vCPU and 512 MiB.
    b.click(&b.find("#catalog-instanceSpecs"));
    b.type_into(&b.find("#add-instanceSpecs-name"), "cpu.tiny");
    b.click(&b.find("#add-instanceSpecs"));
    let tiny = "[data-entry='instanceSpecs/cpu.tiny']";
    retype(&b, &format!("{tiny} [data-field='memoryMib']"), "512");
    // Offered in the default pool.
    b.click(&b.find("#catalog-pools"));
    b.click(&b.find("[data-entry='pools/default'] input[value='cpu.tiny']"));
    // A node.
    b.click(&b.find("#catalog-nodes"));
    // By keyboard: Enter in the name adds it.
    b.type_into(&b.find("#add-nodes-name"), "node-d\u{E007}");
    retype(&b, "[data-entry='nodes/node-d'] [data-field='vcpus']", "2");
    retype(&b, "[data-entry='nodes/node-d'] [data-field='memoryMib']", "2048");
    assert!(b.text_of("[data-entry='nodes/gpu-0']").contains("GPU devices 0, 1"));
    // A quota line of the default group: Ondemand, 4 units of the new spec.
    b.click(&b.find("#catalog-projectGroups"));
    b.click(&b.find("[data-entry='projectGroups/default'] .quotas > button.add"));
    let line = "[data-entry='projectGroups/default'] .quota-line[data-index='2']";
    pick(&b, &format!("{line} [data-field='resourceType']"), "Ondemand");
    pick(&b, &format!("{line} [data-field='spec']"), "cpu.tiny");
    retype(&b, &format!("{line} [data-field='units']"), "4");
    // A number that is not one is refused at its field before anything is sent.
    retype(&b, "[data-entry='nodes/node-d'] [data-field='vcpus']", "-1");
    b.wait("the problem at vCPUs", || {
        b.text_of("[data-entry='nodes/node-d'] .field-problem").contains("whole number").then_some(())
    });
    b.click(&b.find("#save-catalog"));
    b.wait("the save refused in the page", || b.text_of("#catalog-problems").contains("vCPUs").then_some(()));
    assert!(catalog(&s)["nodes"].get("node-d").is_none(), "nothing was sent");
    retype(&b, "[data-entry='nodes/node-d'] [data-field='vcpus']", "2");
    // A line whose units were refused, then removed: it no longer holds the save back.
    b.click(&b.find("[data-entry='projectGroups/default'] .quotas > button.add"));
    let extra = "[data-entry='projectGroups/default'] .quota-line[data-index='3']";
    retype(&b, &format!("{extra} [data-field='units']"), "-5");
    b.find(&format!("{extra} .field-problem"));
    b.click(&b.find(&format!("{extra} [data-action='remove-quota']")));
    let pending = b.text_of("#catalog-changes");
    for change in ["instance spec cpu.tiny added", "pool default changed", "node node-d added", "quota line"]
    {
        assert!(pending.contains(change), "{change} not in {pending:?}");
    }
    b.script("document.getElementById('nodes-title').scrollIntoView()", json!([]));
    b.screenshot(&shots().join("admin-catalog-form.png"));
    b.click(&b.find("#save-catalog"));
    b.wait("saved", || b.text_of("#admin-msg").contains("catalog saved").then_some(()));

    let c = catalog(&s);
    assert_eq!(
        c["instanceSpecs"]["cpu.tiny"],
        json!({"kind": "CPU", "gpus": 0, "vcpus": 1, "memoryMib": 512})
    );
    assert_eq!(c["pools"]["default"]["instanceSpecs"], json!(["cpu.small", "cpu.large", "cpu.tiny"]));
    assert_eq!(
        c["nodes"]["node-d"],
        json!({"pool": "default", "schedulable": true, "gpus": 0, "vcpus": 2, "memoryMib": 2048})
    );
    let quota = json!({"group": "default", "resourceType": "Ondemand", "pool": "default", "spec": "cpu.tiny", "units": 4});
    assert!(c["quotas"].as_array().unwrap().contains(&quota), "{}", c["quotas"]);
    assert_eq!(c["quotas"].as_array().unwrap().len(), 3, "the removed line is not there: {}", c["quotas"]);
    assert_eq!(c["nodes"]["gpu-0"]["gpuDevices"], json!([0, 1]), "the field the form does not show is kept");
    b.wait("the quota table shows the new line", || {
        b.text_of("#quota-lines").contains("Ondemand").then_some(())
    });
    assert_eq!(b.text_of("#catalog-changes"), "No unsaved changes.");

    // The raw text, one toggle away: it holds what the form saved; an edit there is saved and shows in the form.
    b.click(&b.find("#catalog-as-text"));
    let text = b.find("#catalog");
    let raw = b.script("return arguments[0].value", json!([text.reference()]));
    assert!(raw.as_str().unwrap().contains("cpu.tiny"), "{raw}");
    b.script(
        "const t = arguments[0], c = JSON.parse(t.value); c.regions.local.displayName = 'This machine';
         t.value = JSON.stringify(c, null, 2); t.dispatchEvent(new Event('input'));",
        json!([text.reference()]),
    );
    b.click(&b.find("#save-catalog"));
    // Each browser command answers the page's confirmations (the session accepts them): one per round.
    b.wait("the text saved", || {
        b.text_of("#admin-msg");
        (catalog(&s)["regions"]["local"]["displayName"] == "This machine").then_some(())
    });
    b.click(&b.find("#catalog-as-text"));
    let name = b.find("[data-entry='regions/local'] [data-field='displayName']");
    assert_eq!(b.script("return arguments[0].value", json!([name.reference()])), "This machine");

    // A region a cluster still names: the server's reason shows at the cluster; nothing changes.
    b.click(&b.find("[data-entry='regions/local'] [data-action='remove']"));
    b.click(&b.find("#save-catalog"));
    let problem = b.wait("the problem at the cluster", || {
        Some(b.text_of("[data-entry='clusters/local'] .server-problem")).filter(|t| !t.is_empty())
    });
    assert!(problem.contains("region \"local\" does not exist"), "{problem}");
    assert!(b.text_of("#catalog-problems").contains("cluster local"), "{}", b.text_of("#catalog-problems"));
    assert!(catalog(&s)["regions"].get("local").is_some());
    b.click(&b.find("#discard-catalog"));
    b.find("[data-entry='regions/local']");

    // The node the running task is on: refused, the conflict named with the task, then saved anyway.
    b.click(&b.find(&format!("[data-entry='nodes/{node}'] [data-action='remove']")));
    b.click(&b.find("#save-catalog"));
    let conflict = b.wait("the conflict", || {
        Some(b.text_of("#catalog-conflicts li[data-code='node-in-use']")).filter(|t| !t.is_empty())
    });
    assert!(
        conflict.contains(&format!("node {node} runs replicas now")) && conflict.contains(&task),
        "{conflict}"
    );
    assert!(catalog(&s)["nodes"].get(&node).is_some(), "refused: the node is still there");
    b.script("document.getElementById('catalog-conflicts').scrollIntoView({block: 'center'})", json!([]));
    b.screenshot(&shots().join("admin-catalog-conflict.png"));
    b.click(&b.find("#save-anyway"));
    b.wait("saved anyway", || b.text_of("#admin-msg").contains("catalog saved anyway").then_some(()));
    assert!(catalog(&s)["nodes"].get(&node).is_none(), "forced: the node is gone");
    assert!(b.try_find("#save-anyway").is_none());

    // The admin's own tokens: this session's marked, with when it was made and last used.
    b.click(&b.find("#users tr[data-user='admin'] [aria-label='tokens of admin']"));
    let mine = "#tokens tr[data-current='true']";
    b.wait("this session's token", || b.text_of(mine).contains("this session").then_some(()));
    assert!(b.try_find(&format!("{mine} td:nth-child(3) time")).is_some(), "created as a time");

    let url = format!("{}/#/admin", s.base);
    let open_catalog =
        "for (const k of ['nodes', 'projectGroups']) d.querySelector(`details[data-kind=${k}]`).open = true;
         d.getElementById('catalog-title').scrollIntoView();";
    framed(&b, &url, DESKTOP, "[data-entry='regions/local']");
    in_frame(&b, open_catalog);
    b.screenshot(&shots().join("admin-desktop.png"));
    in_frame(
        &b,
        "const i = d.querySelector('details[data-kind=images]'); i.open = true; i.scrollIntoView();",
    );
    b.screenshot(&shots().join("admin-desktop-images.png"));
    framed(&b, &url, PHONE, "[data-entry='regions/local']");
    in_frame(&b, open_catalog);
    let (page, frame) = framed_widths(&b);
    assert!(page <= frame, "the admin page overflows at phone width: {page} > {frame}");
    b.screenshot(&shots().join("admin-phone.png"));
    in_frame(&b, "d.querySelector('details[data-kind=projectGroups]').scrollIntoView();");
    b.screenshot(&shots().join("admin-phone-quotas.png"));
    in_frame(&b, "d.defaultView.scrollTo(0, 0);");
    b.screenshot(&shots().join("admin-phone-top.png"));
    s.call("POST", &format!("/api/v1/tasks/{id}/stop"), None);
}

/// A member opens Account: makes a token (shown once, with a copy button), which works on the API; revokes it
/// (refused from then on); then revokes the token this browser is signed in with and lands on sign-in.
#[test]
fn a_member_manages_their_own_tokens() {
    let s = Server::start("console-account", None);
    let body = json!({"name": "mia", "role": "member", "groups": ["default"]}).to_string();
    assert_eq!(s.call("POST", "/api/v1/admin/users", Some(&body)).0, 200);
    let (status, made) = s.call("POST", "/api/v1/users/mia/tokens", Some(r#"{"label": "browser"}"#));
    assert_eq!(status, 201, "{made}");
    let session = serde_json::from_str::<Value>(&made).unwrap()["token"].as_str().unwrap().to_owned();

    let b = Browser::start();
    sign_in_as(&b, &s, &session, "mia");
    assert!(b.try_find("#nav-admin").is_some_and(|e| !b.text(&e).contains("Admin")), "no admin link");
    b.goto(&format!("{}/#/admin", s.base));
    b.wait("the admin page refused", || b.text_of("main").contains("for admins").then_some(()));
    b.click(&b.find("#nav-account"));
    b.wait("the account page", || b.url().ends_with("#/account").then_some(()));
    let current = "#tokens tr[data-current='true']";
    b.wait("this session's token", || b.text_of(current).contains("browser").then_some(()));
    assert_eq!(unlabelled(&b), json!([]), "every control of the account page has a name");

    b.type_into(&b.find("#token-label"), "script");
    b.click(&b.find("#create-token"));
    let value = b.find("#new-token-value");
    let token =
        b.script("return arguments[0].value", json!([value.reference()])).as_str().unwrap().to_owned();
    assert!(token.starts_with("ty_"), "{token}");
    let note = b.text_of("#new-token");
    assert!(note.contains("not shown again") && note.contains("script"), "{note}");
    assert!(b.try_find("#copy-token").is_some());
    let id = b.script("return document.querySelector('#new-token [data-token]').dataset.token", json!([]));
    let id = id.as_str().unwrap().to_owned();
    let row = format!("#tokens tr[data-token='{id}']");
    b.wait("the new token listed", || b.text_of(&row).contains("script").then_some(()));
    assert_eq!(whoami(&s, &token), (200, "mia".to_owned()), "the new token works");
    b.screenshot(&shots().join("account-new-token.png"));

    let url = format!("{}/#/account", s.base);
    framed(&b, &url, DESKTOP, &row);
    b.screenshot(&shots().join("account-desktop.png"));
    framed(&b, &url, PHONE, &row);
    let (page, frame) = framed_widths(&b);
    assert!(page <= frame, "the account page overflows at phone width: {page} > {frame}");
    b.screenshot(&shots().join("account-phone.png"));

    reload(&b, &url);
    b.click(&b.find(&format!("{row} [data-action='revoke']")));
    b.wait("the token gone from the list", || b.try_find(&row).is_none().then_some(()));
    assert_eq!(whoami(&s, &token).0, 401, "a revoked token is refused");
    assert_eq!(whoami(&s, &session).0, 200, "the session's token still works");

    b.click(&b.find(&format!("{current} [data-action='revoke']")));
    b.wait("the sign-in page", || {
        (b.url().ends_with("#/signin") && b.try_find("#token").is_some()).then_some(())
    });
    assert_eq!(b.script("return localStorage.getItem('trainyard.token')", json!([])), Value::Null);
    assert_eq!(b.script("return document.getElementById('nav').hidden", json!([])), json!(true));
    assert_eq!(b.text_of("#who"), "", "the header forgets who was signed in");
    assert_eq!(whoami(&s, &session).0, 401, "the session's token is refused");
}
