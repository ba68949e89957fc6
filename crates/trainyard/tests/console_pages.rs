//! Every page of the console at desktop and phone width, in a real browser against a real `trainyard up`:
//! a screenshot of each (into `target/console-screenshots/pages/`, or `TRAINYARD_SCREENSHOTS/pages`) and an
//! audit of what a person using a keyboard, a screen reader or a phone meets: nothing wider than the screen,
//! every control with a name, text contrast of at least 4.5:1 (3:1 for large text), one `h1`, column headers
//! with a scope, no positive tabindex, and graphics that are either named or hidden from assistive technology.

mod common;

use common::console::{DESKTOP, PHONE, in_frame, sign_in, sign_in_as};
use common::webdriver::Browser;
use common::{Server, secs};
use serde_json::{Value, json};

/// Where this file's screenshots go: `pages/` under the console's.
fn shots() -> std::path::PathBuf {
    common::console::shots().join("pages")
}

/// [`common::console::framed`], then a moment for what the page fetches after its first paint (a task's logs
/// and metrics, the admin page's lists).
fn framed(b: &Browser, url: &str, size: (u32, u32), css: &str) {
    common::console::framed(b, url, size, css);
    std::thread::sleep(std::time::Duration::from_millis(1500));
}

/// The audit, run in the framed page's document; it answers a list of findings, each a short sentence that
/// names the element.
const AUDIT: &str = r#"
const d = document.getElementById('frame').contentDocument;
const w = d.defaultView;
const out = [];
const name = (e) => {
  const id = e.id ? `#${e.id}` : '';
  const cls = e.className && typeof e.className === 'string' ? `.${e.className.trim().split(/\s+/).join('.')}` : '';
  return `<${e.tagName.toLowerCase()}${id}${cls}> "${(e.textContent || e.value || '').trim().slice(0, 40)}"`;
};
const shown = (e) => {
  if (e.closest('[hidden], [aria-hidden="true"]')) return false;
  const s = w.getComputedStyle(e);
  if (s.display === 'none' || s.visibility === 'hidden') return false;
  const r = e.getBoundingClientRect();
  return r.width > 0 && r.height > 0;
};
const de = d.documentElement;
if (de.scrollWidth > de.clientWidth + 1) {
  const wide = [...d.querySelectorAll('main *, header *')].filter((e) => shown(e) && !e.closest('.table-wrap, pre, [data-scrolls]') && e.getBoundingClientRect().right > de.clientWidth + 1);
  out.push(`the page is ${de.scrollWidth}px wide in ${de.clientWidth}px: ${wide.slice(0, 3).map(name).join(', ')}`);
}
// Every control has an accessible name.
for (const e of d.querySelectorAll('input, select, textarea, button')) {
  if (e.type === 'hidden' || !shown(e)) continue;
  const named = (e.labels && e.labels.length) || e.getAttribute('aria-label') || e.getAttribute('aria-labelledby') || e.title
    || (e.tagName === 'BUTTON' && e.textContent.trim());
  if (!named) out.push(`no name: ${name(e)}`);
}
// Links say where they go.
for (const e of d.querySelectorAll('a')) {
  if (!shown(e)) continue;
  if (!e.getAttribute('href')) out.push(`a link without href: ${name(e)}`);
  else if (!e.textContent.trim() && !e.getAttribute('aria-label')) out.push(`a link without text: ${name(e)}`);
}
for (const e of d.querySelectorAll('[tabindex]')) if (Number(e.getAttribute('tabindex')) > 0) out.push(`positive tabindex: ${name(e)}`);
for (const e of d.querySelectorAll('svg, img, canvas')) {
  if (!shown(e) || e.closest('svg') !== e && e.tagName !== 'IMG' && e.tagName !== 'CANVAS') continue;
  const named = e.getAttribute('aria-label') || e.getAttribute('aria-labelledby') || e.getAttribute('alt') !== null && e.tagName === 'IMG' || e.querySelector?.('title');
  if (!named && e.getAttribute('aria-hidden') !== 'true' && e.getAttribute('role') !== 'presentation') out.push(`a graphic without a name: ${name(e)}`);
}
for (const th of d.querySelectorAll('thead th')) if (!th.getAttribute('scope')) out.push(`a column header without scope: ${name(th)}`);
const h1s = [...d.querySelectorAll('h1')].filter(shown);
if (h1s.length !== 1) out.push(`${h1s.length} h1 elements`);
// Contrast of every piece of text against what is behind it.
const rgb = (c) => { const m = c.match(/rgba?\(([^)]+)\)/); if (!m) return null; const p = m[1].split(',').map(Number); return { r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1 }; };
const lum = ({ r, g, b }) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; }; return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b); };
const behind = (e) => {
  const layers = [];
  for (let x = e; x; x = x.parentElement) {
    const c = rgb(w.getComputedStyle(x).backgroundColor);
    if (c && c.a > 0) { layers.push(c); if (c.a >= 1) break; }
  }
  let acc = { r: 255, g: 255, b: 255 };
  for (const c of layers.reverse()) acc = { r: c.r * c.a + acc.r * (1 - c.a), g: c.g * c.a + acc.g * (1 - c.a), b: c.b * c.a + acc.b * (1 - c.a) };
  return acc;
};
const seen = new Set();
const walker = d.createTreeWalker(d.body, NodeFilter.SHOW_TEXT);
for (let t = walker.nextNode(); t; t = walker.nextNode()) {
  const e = t.parentElement;
  if (!t.textContent.trim() || !e || seen.has(e) || !shown(e) || e.closest('svg')) continue;
  seen.add(e);
  const s = w.getComputedStyle(e);
  const fg = rgb(s.color);
  if (!fg) continue;
  const bg = behind(e);
  const ink = { r: fg.r * fg.a + bg.r * (1 - fg.a), g: fg.g * fg.a + bg.g * (1 - fg.a), b: fg.b * fg.a + bg.b * (1 - fg.a) };
  let ratio = (Math.max(lum(ink), lum(bg)) + 0.05) / (Math.min(lum(ink), lum(bg)) + 0.05);
  // Disabled controls are exempt from the contrast rule.
  if (e.closest(':disabled')) continue;
  const px = parseFloat(s.fontSize);
  const large = px >= 24 || (px >= 18.66 && Number(s.fontWeight) >= 700);
  if (ratio < (large ? 3 : 4.5)) out.push(`contrast ${ratio.toFixed(2)}:1 for ${name(e)} (${s.color} on rgb(${Math.round(bg.r)}, ${Math.round(bg.g)}, ${Math.round(bg.b)}))`);
}
return out;
"#;

/// Every page, at both widths: a screenshot and the audit's findings, all of them reported at once.
#[test]
fn every_page_fits_a_phone_and_passes_the_audit() {
    let s = Server::start("console-pages", None);
    // A task that ran (logs, metrics, events, attempts) and one that waits in the queue.
    let cmd = "for i in 1 2 3 4 5 6; do echo step $i loss 0.$((9-i)); sleep 0.5; done";
    let ran = s.submit(&common::pytorch("audited", 1, cmd));
    s.wait_status(&ran, "Succeeded", secs(120));
    let ran_name = s.task(&ran)["name"].as_str().unwrap().to_owned();
    let b = Browser::start();
    sign_in(&b, &s);

    let pages: &[(&str, &str, &str)] = &[
        ("tasks", "#/tasks", &format!("tr[data-id='{ran}']")),
        ("task", &format!("#/tasks/{ran}"), "#events li"),
        // With a name nobody has, so the page's message is audited too.
        ("compare", &format!("#/compare?tasks={ran_name},no-such-task"), ".chart svg"),
        ("create", "#/create", "#summary h2"),
        ("new", "#/new", "#doc"),
        ("admin", "#/admin", "#nodes tr"),
        ("account", "#/account", "main h1"),
    ];
    let mut findings = Vec::new();
    for &(page, hash, css) in pages {
        for (width, size) in [("desktop", DESKTOP), ("phone", PHONE)] {
            let url = format!("{}/{hash}", s.base);
            framed(&b, &url, size, css);
            b.screenshot(&shots().join(format!("{page}-{width}.png")));
            let found: Value = b.script(AUDIT, json!([]));
            for f in found.as_array().unwrap() {
                findings.push(format!("{page} at {width}: {}", f.as_str().unwrap()));
            }
        }
    }
    // Signed out: the sign-in page.
    b.script("localStorage.clear()", json!([]));
    for (width, size) in [("desktop", DESKTOP), ("phone", PHONE)] {
        framed(&b, &format!("{}/#/signin", s.base), size, "#token");
        b.screenshot(&shots().join(format!("signin-{width}.png")));
        let found: Value = b.script(AUDIT, json!([]));
        for f in found.as_array().unwrap() {
            findings.push(format!("signin at {width}: {}", f.as_str().unwrap()));
        }
    }
    assert!(findings.is_empty(), "{} findings:\n{}", findings.len(), findings.join("\n"));
}

/// The form has controls for the precheck's own environment variables (issue 14, point 9): one added there
/// is sent in `spec.advanced.precheck.env`, a hidden one masked when the task is read back.
#[test]
fn precheck_environment_variables_from_the_form() {
    let s = Server::start("console-precheck-env", None);
    let b = Browser::start();
    sign_in(&b, &s);
    let field = |path: &str| format!("[id='in-{path}']");
    b.goto(&format!("{}/#/create", s.base));
    b.type_into(&b.find(&field("metadata.namePrefix")), "prechecked");
    b.type_into(&b.find(&field("spec.environment.cmd")), "echo checked");
    b.click(&b.find(&field("spec.advanced.precheck.enabled")));
    for (i, (name, value)) in [("NCCL_DEBUG", "INFO"), ("PROBE_KEY", "s3cret")].into_iter().enumerate() {
        b.click(&b.find("[id='add-spec.advanced.precheck.env']"));
        b.type_into(&b.find(&field(&format!("spec.advanced.precheck.env.{i}.name"))), name);
        b.type_into(&b.find(&field(&format!("spec.advanced.precheck.env.{i}.value"))), value);
    }
    b.click(&b.find(&field("spec.advanced.precheck.env.1.hidden")));
    b.wait("no problems", || {
        (b.try_find(".field-problem").is_none() && b.text_of("#summary").contains("replica")).then_some(())
    });
    b.click(&b.find("#create-submit"));
    b.wait("the task page", || b.url().contains("#/tasks/").then_some(()));
    let id = b.task_id_on_page();
    let env = &s.task(&id)["spec"]["spec"]["advanced"]["precheck"]["env"];
    assert_eq!(env[0], json!({"name": "NCCL_DEBUG", "value": "INFO", "hidden": false}), "{env}");
    assert_eq!(env[1]["name"], "PROBE_KEY", "{env}");
    assert_eq!(env[1]["hidden"], true, "{env}");
    assert_ne!(env[1]["value"], "s3cret", "a hidden value is never read back: {env}");
    s.call("POST", &format!("/api/v1/tasks/{id}/stop"), None);
}

/// The task page's Sharing section: the owner shares with a user by name (see, or see and operate), the list
/// shows it, and Take back ends it; the user's own view follows. A user the task is shared with does not see
/// the section (only the owner and admins manage shares).
#[test]
fn sharing_from_the_task_page() {
    let s = Server::start("console-sharing", None);
    let id = s.submit(&common::pytorch("sharedpage", 0, "echo shared"));
    s.wait_status(&id, "Succeeded", secs(60));
    let (status, body) =
        s.call("POST", "/api/v1/admin/users", Some(r#"{"name": "sam", "role": "member", "groups": []}"#));
    assert_eq!(status, 200, "{body}");
    let (_, t) = s.call("POST", "/api/v1/users/sam/tokens", Some(r#"{"label": "test"}"#));
    let sam: Value = serde_json::from_str(&t).unwrap();
    let sam = sam["token"].as_str().unwrap().to_owned();
    let as_sam = |path: &str| {
        common::agent()
            .get(&format!("{}{path}", s.base))
            .header("Authorization", &format!("Bearer {sam}"))
            .call()
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(as_sam(&format!("/api/v1/tasks/{id}")), 404);

    let b = Browser::start();
    sign_in(&b, &s);
    b.goto(&format!("{}/#/tasks/{id}", s.base));
    b.wait("the sharing section", || b.text_of("#shares").contains("Shared with no one").then_some(()));
    b.click(&b.find("#act-share"));
    b.type_into(&b.find("#share-user"), "sam");
    b.click(&b.find("#share-operate"));
    b.click(&b.find("#share-submit"));
    b.wait("sam listed", || b.try_find("#shares tr[data-user='sam']"));
    assert!(b.text_of("#shares tr[data-user='sam']").contains("see and operate"));
    assert!(b.text_of("#share-msg").contains("shared with sam"), "{}", b.text_of("#share-msg"));
    assert_eq!(as_sam(&format!("/api/v1/tasks/{id}")), 200);
    // Nobody called that: the server's refusal, said where the user looks.
    b.type_into(&b.find("#share-user"), "nobody-here");
    b.click(&b.find("#share-submit"));
    b.wait("the refusal", || b.text_of("#share-msg").contains("nobody-here").then_some(()));
    b.script("window.confirm = () => true", json!([]));
    b.click(&b.find("#shares tr[data-user='sam'] button"));
    b.wait("sam gone", || b.text_of("#shares").contains("Shared with no one").then_some(()));
    assert_eq!(as_sam(&format!("/api/v1/tasks/{id}")), 404);

    // Sam, shared with again (see only), sees the task but not its Sharing section nor the Share button.
    s.call("POST", &format!("/api/v1/tasks/{id}/shares"), Some(r#"{"user": "sam"}"#));
    sign_in_as(&b, &s, &sam, "sam");
    b.goto(&format!("{}/#/tasks/{id}", s.base));
    b.wait("the task", || b.text_of("h1").contains("sharedpage").then_some(()));
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let hidden = b.script(
        "return [document.getElementById('sharing').hidden, document.getElementById('act-share').hidden]",
        json!([]),
    );
    assert_eq!(hidden, json!([true, true]));
}

/// Where the create page's "Demand and quota" panel lies in the framed page, measured in it: the window's width
/// and height, the page's width (and what sticks out, if anything), the panel's left and right edges, the quota table's last column header (after the box that
/// scrolls the table, if one does, is scrolled to its end) against the window and that box, the spec name cell's
/// text against its cell, and the panel's last line and the problems list's end once each is scrolled into view.
const QUOTA_PANEL: &str = r#"
const w = d.defaultView;
const vw = d.documentElement.clientWidth, vh = w.innerHeight;
const panel = d.getElementById('summary').getBoundingClientRect();
const table = d.getElementById('quota');
let scroller = null;
for (let e = table.parentElement; e && e !== d.body; e = e.parentElement) {
  const x = w.getComputedStyle(e).overflowX;
  if ((x === 'auto' || x === 'scroll') && e.scrollWidth > e.clientWidth) { scroller = e; break; }
}
if (scroller) scroller.scrollLeft = scroller.scrollWidth;
const last = [...table.querySelectorAll('thead th')].pop();
const th = last.getBoundingClientRect();
const box = scroller ? scroller.getBoundingClientRect() : { left: 0, right: vw };
const spec = table.querySelector('tbody td');
const ends = [d.getElementById('summary').lastElementChild, d.getElementById('problems')].map((e) => {
  e.scrollIntoView({ block: 'end' });
  const r = e.getBoundingClientRect();
  return [Math.round(r.top), Math.round(r.bottom)];
});
// What sticks out past the window's right edge (outside boxes that scroll), to say where the page is too wide.
const wide = [...d.querySelectorAll('main *')].filter((e) => !e.closest('.table-wrap') && e.getBoundingClientRect().right > vw + 1)
  .slice(0, 4).map((e) => `<${e.tagName.toLowerCase()} id=${e.id} class=${e.className}> ${Math.round(e.getBoundingClientRect().right)}`);
return {
  vw, vh, page: d.documentElement.scrollWidth, wide, panel: [Math.round(panel.left), Math.round(panel.right)], scroller: scroller ? (scroller.id || scroller.className) : null,
  last: [last.textContent, Math.round(th.left), Math.round(th.right), Math.round(box.left), Math.round(box.right)],
  spec: [spec.textContent, spec.scrollWidth, spec.clientWidth], ends,
};
"#;

/// The create page's "Demand and quota" panel with a spec name too long for its column, at a phone's narrow
/// width and beside the form in a short desktop window: the panel stays inside the window, its quota table
/// scrolls in a box of its own so that the last column can be brought into view, the spec name wraps in its
/// cell rather than being cut, and the panel's end (and the problems list below it) can be scrolled into view
/// (a sticky panel taller than the window would keep its bottom out of reach).
#[test]
fn the_demand_and_quota_panel_fits_narrow_and_short_windows() {
    let s = Server::start("console-quota-panel", None);
    let long = "cpu.small-general-purpose-burstable-instance-v2";
    let (status, body) =
        s.call("PUT", "/api/v1/admin/catalog", Some(&common::CATALOG.replace("cpu.small", long)));
    assert_eq!(status, 200, "{body}");
    let b = Browser::start();
    sign_in(&b, &s);
    let url = format!("{}/#/create", s.base);
    for (name, size) in [("narrow", (360, 640)), ("short", (1280, 360))] {
        common::console::framed(&b, &url, size, "#quota td");
        let v = in_frame(&b, QUOTA_PANEL);
        // The panel's end in view, its table scrolled to the last column.
        b.screenshot(&shots().join(format!("create-quota-{name}.png")));
        let n = |x: &Value| x.as_i64().unwrap();
        let (vw, vh) = (n(&v["vw"]), n(&v["vh"]));
        assert!(n(&v["page"]) <= vw, "{name}: the page is wider than the window: {v}");
        let (left, right) = (n(&v["panel"][0]), n(&v["panel"][1]));
        assert!(left >= 0 && right <= vw, "{name}: the panel is cut at the side: {v}");
        let last = &v["last"];
        assert_eq!(last[0], "Unreserved", "{name}: {v}");
        let (th_left, th_right, box_left, box_right) = (n(&last[1]), n(&last[2]), n(&last[3]), n(&last[4]));
        assert!(
            th_left >= box_left - 1 && th_right <= box_right + 1 && th_right <= vw,
            "{name}: the last column cannot be brought into view: {v}"
        );
        if v["scroller"] != Value::Null {
            assert_eq!(
                v["scroller"], "quota-wrap",
                "{name}: the table scrolls in its own box, not the panel: {v}"
            );
        }
        assert_eq!(v["spec"][0], long, "{name}: {v}");
        assert!(n(&v["spec"][1]) <= n(&v["spec"][2]), "{name}: the spec name is cut: {v}");
        for end in v["ends"].as_array().unwrap() {
            // A pixel's leeway: the page scrolls by whole pixels, the panel's edges may fall between them.
            assert!(n(&end[0]) >= -1 && n(&end[1]) <= vh + 1, "{name}: the panel's end is out of reach: {v}");
        }
    }
}
