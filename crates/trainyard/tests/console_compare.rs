//! The console's comparison of tasks in a real browser (Debian's headless chromium through chromedriver) against
//! a real `trainyard up` on the local backend: two tasks that serve metrics of their own, started seconds apart,
//! ticked on the task list and compared; a chart per metric with a line per task and replica on a time axis that
//! counts from each task's start, a legend naming each task, a readout; a metric only one task has, said so; a
//! name nobody can see, said so while the rest is drawn. Screenshots go to `target/console-screenshots/` (or
//! `TRAINYARD_SCREENSHOTS`).

mod common;

use common::console::{PHONE, framed, framed_widths, reload, shots, sign_in, sign_in_as};
use common::webdriver::Browser;
use common::{Server, secs};
use serde_json::{Value, json};
use std::collections::BTreeMap;

// WebDriver's code for the left arrow key (W3C WebDriver, "Keyboard actions").
const ARROW_LEFT: &str = "\u{E012}";

/// A replica that serves, in the Prometheus text format, a falling `train_loss` (from START) and, when EXTRA,
/// an `eval_accuracy_ratio` too, for about 16 s (three or four scrapes, at the shortest interval a task may ask).
const SERVE: &str = r#"python3 - <<'PY'
import http.server, threading, time
t0 = time.time()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        s = time.time() - t0
        body = 'train_loss %.4f\n' % (START / (1.0 + s))
        if EXTRA:
            body += 'eval_accuracy_ratio %.4f\n' % min(1.0, s / 10)
        self.send_response(200); self.send_header("Content-Type", "text/plain"); self.end_headers()
        self.wfile.write(body.encode())
    def log_message(self, *a): pass
srv = http.server.HTTPServer(("127.0.0.1", PORT), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
time.sleep(16)
PY"#;

/// A task of `workers` workers (and its master) running [`SERVE`], scraped every 5 s.
fn serving(prefix: &str, workers: u32, start: f64, extra: bool) -> Value {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let cmd = SERVE
        .replace("PORT", &port.to_string())
        .replace("START", &format!("{start:.1}"))
        .replace("EXTRA", if extra { "True" } else { "False" });
    let mut task = common::pytorch(prefix, workers, &cmd);
    task["spec"]["advanced"] = json!({"metrics": {"enabled": true, "intervalSeconds": 5, "endpoints": [{"port": port, "path": "/metrics"}]}});
    task
}

/// How many lines each task has on the chart of `metric` (by the task each line says it is of).
fn lines_by_task(b: &Browser, metric: &str) -> BTreeMap<String, u64> {
    let v = b.script(
        "return [...document.querySelectorAll(`.chart[data-metric='${arguments[0]}'] svg.chart-svg polyline`)]
           .map((l) => l.dataset.group)",
        json!([metric]),
    );
    let mut by = BTreeMap::new();
    for g in v.as_array().unwrap() {
        *by.entry(g.as_str().unwrap_or("(none)").to_owned()).or_insert(0) += 1;
    }
    by
}

/// Where each task's first sample is on the chart of `metric`, in seconds since its start, read off the drawing:
/// the first point of each task's first line, placed by two of the time axis's labelled ticks.
fn first_seconds(b: &Browser, metric: &str) -> BTreeMap<String, f64> {
    let v = b.script(
        "const c = document.querySelector(`.chart[data-metric='${arguments[0]}']`);
         const ticks = [...c.querySelectorAll('.x-tick')].map((t) => {
           const [m, s] = t.textContent.split(':').map(Number);
           return [Number(t.getAttribute('x')), m * 60 + s];
         });
         const firsts = {};
         for (const l of c.querySelectorAll('svg.chart-svg polyline')) {
           if (l.dataset.group in firsts) continue;
           firsts[l.dataset.group] = Number(l.getAttribute('points').split(' ')[0].split(',')[0]);
         }
         return [ticks, firsts];",
        json!([metric]),
    );
    let ticks = v[0].as_array().unwrap();
    assert!(ticks.len() >= 2, "two labelled ticks on the time axis: {v}");
    let at = |i: usize| (ticks[i][0].as_f64().unwrap(), ticks[i][1].as_f64().unwrap());
    let ((x0, s0), (x1, s1)) = (at(0), at(ticks.len() - 1));
    let per_second = (x1 - x0) / (s1 - s0);
    v[1].as_object()
        .unwrap()
        .iter()
        .map(|(k, x)| (k.clone(), s0 + (x.as_f64().unwrap() - x0) / per_second))
        .collect()
}

/// Two tasks started seconds apart, one with a worker, ticked on the list and compared: a chart with the lines of
/// both (each task's replicas), both named in the legend, each starting near zero on the shared time axis; the
/// readout follows the keyboard; a metric only one of them serves is in its own section, said so; an unknown
/// name gets its message while both are still drawn; a user who may see neither gets a message for each; the
/// page fits a phone.
#[test]
fn compare_two_tasks_metrics_on_one_chart() {
    let s = Server::start("console-compare", None);
    let first = s.submit(&serving("cmpfirst", 1, 1.0, false));
    s.wait_status(&first, "Running", secs(60));
    // The second starts well after the first, so only a time axis from each task's own start overlays them. The
    // wait asks the server something every 2 s: a pooled connection left idle for the server's 10 s header-read
    // timeout may be closed just as the next request goes out on it.
    let since = std::time::Instant::now();
    while since.elapsed() < secs(10) {
        s.task(&first);
        std::thread::sleep(secs(2));
    }
    let second = s.submit(&serving("cmpsecond", 0, 2.0, true));
    s.wait_status(&first, "Succeeded", secs(90));
    s.wait_status(&second, "Succeeded", secs(90));
    let (a, b_name) = (
        s.task(&first)["name"].as_str().unwrap().to_owned(),
        s.task(&second)["name"].as_str().unwrap().to_owned(),
    );
    let started = |id: &str| s.task(id)["runStartedAtMs"].as_i64().unwrap();
    assert!(started(&second) - started(&first) >= 9000, "the second started later");
    // Both served their metric (else the console has nothing to draw and the test would say nothing about it).
    for (id, want) in [(&first, "train_loss"), (&second, "eval_accuracy_ratio")] {
        let (_, m) = s.call("GET", &format!("/api/v1/tasks/{id}/metrics"), None);
        assert!(m.contains(&format!("\"name\":\"{want}\"")), "{want} sampled for {id}: {m}");
    }

    let b = Browser::start();
    sign_in(&b, &s);
    // Ticked on the task list, then Compare.
    b.goto(&format!("{}/#/tasks", s.base));
    let pick = |id: &str| b.find(&format!("tr[data-id='{id}'] .compare-pick"));
    pick(&first);
    pick(&second);
    let compare = b.find("#compare");
    assert_eq!(
        b.script("return arguments[0].disabled", json!([compare.reference()])),
        true,
        "not with no task"
    );
    b.click(&pick(&first));
    b.click(&pick(&second));
    assert_eq!(b.text_of("#compare"), "Compare (2)");
    b.click(&b.find("#compare"));
    let url = format!("{}/#/compare?tasks={a},{b_name}", s.base);
    b.wait("the comparison's address", || (b.url() == url).then_some(()));

    // One chart of train_loss with the lines of both: the first's master and worker, the second's master.
    b.wait("train_loss drawn for both tasks", || {
        let by = lines_by_task(&b, "train_loss");
        (by.get(&a) == Some(&2) && by.get(&b_name) == Some(&1)).then_some(())
    });
    assert!(b.try_find("#compare-shared .chart[data-metric='train_loss']").is_some(), "a metric both have");
    let legend = b.text_of(".chart[data-metric='train_loss'] .chart-legend");
    assert!(legend.contains(&a) && legend.contains(&b_name), "both named in the legend: {legend}");
    for (task, parts) in [(&a, vec!["master-0", "worker-0"]), (&b_name, vec!["master-0"])] {
        let item =
            b.text_of(&format!(".chart[data-metric='train_loss'] .chart-legend li[data-group='{task}']"));
        assert!(parts.iter().all(|p| item.contains(p)), "{task}'s replicas under its name: {item}");
    }
    // A task's lines share its colour, and the two tasks' colours differ.
    let colours = b.script(
        "const by = {};
         for (const l of document.querySelectorAll(`.chart[data-metric='train_loss'] svg.chart-svg polyline`))
           (by[l.dataset.group] ||= new Set()).add(l.getAttribute('stroke'));
         return Object.fromEntries(Object.entries(by).map(([k, v]) => [k, [...v]]));",
        json!([]),
    );
    assert_eq!(colours[&a].as_array().unwrap().len(), 1, "{colours}");
    assert_eq!(colours[&b_name].as_array().unwrap().len(), 1, "{colours}");
    assert_ne!(colours[&a][0], colours[&b_name][0], "{colours}");
    // The time axis counts from each task's start: both lines begin within a scrape interval of zero, though the
    // second started 10 s after the first.
    let x = b.script(
        "return [...document.querySelectorAll(`.chart[data-metric='train_loss'] .x-tick`)].map((t) => t.textContent)",
        json!([]),
    );
    assert!(
        x.as_array().unwrap().iter().all(|t| {
            let t = t.as_str().unwrap();
            t.split_once(':')
                .is_some_and(|(m, s)| m.parse::<u32>().is_ok() && s.len() == 2 && s.parse::<u32>().is_ok())
        }),
        "the axis counts minutes and seconds from the start: {x}"
    );
    let firsts = first_seconds(&b, "train_loss");
    for task in [&a, &b_name] {
        let at = firsts[task];
        assert!((-0.5..7.0).contains(&at), "{task}'s first sample {at:.1} s after its start: {firsts:?}");
    }
    // The summary for assistive technology names both; the readout follows the keyboard.
    let svg = b.find(".chart[data-metric='train_loss'] svg.chart-svg");
    let label = b.script("return arguments[0].getAttribute('aria-label')", json!([svg.reference()]));
    let label = label.as_str().unwrap();
    assert!(label.contains(&a) && label.contains(&b_name) && label.contains("since each start"), "{label}");
    b.type_into(&svg, ARROW_LEFT);
    let readout = b.text_of(".chart[data-metric='train_loss'] .chart-readout");
    assert!(
        readout.contains("since start") && (readout.contains(&a) || readout.contains(&b_name)),
        "{readout}"
    );
    // A metric only the second serves: apart, and said so.
    let only = b.text_of("#compare-partial .chart[data-metric='eval_accuracy_ratio'] .chart-only");
    assert!(
        only.starts_with(&format!("Only {b_name} reports")) && only.contains(&format!("{a} does not")),
        "{only}"
    );
    assert_eq!(lines_by_task(&b, "eval_accuracy_ratio").get(&b_name), Some(&1));
    b.screenshot(&shots().join("compare-desktop.png"));

    // An unknown name, in an address opened afresh: its message, and both tasks still drawn.
    let with_unknown = format!("{}/#/compare?tasks={a},no-such-task,{b_name}", s.base);
    reload(&b, &with_unknown);
    let missing = b.wait("the unknown name's message", || {
        let t = b.text_of("#compare-tasks li[data-task='no-such-task']");
        (!t.is_empty()).then_some(t)
    });
    assert!(missing.contains("no task of that name that you can see"), "{missing}");
    b.wait("both still drawn", || {
        let by = lines_by_task(&b, "train_loss");
        (by.get(&a) == Some(&2) && by.get(&b_name) == Some(&1)).then_some(())
    });
    for task in [&a, &b_name] {
        let item = b.text_of(&format!("#compare-tasks li[data-task='{task}']"));
        assert!(item.contains("Succeeded") && !item.contains("no task"), "{item}");
    }

    // The phone: nothing wider than the screen.
    framed(&b, &url, PHONE, ".chart svg");
    let (wide, frame) = framed_widths(&b);
    assert!(wide <= frame, "the comparison overflows at phone width: {wide} px in {frame}");
    b.screenshot(&shots().join("compare-phone.png"));

    // A member who may see neither task: a message for each, no chart.
    let (status, body) =
        s.call("POST", "/api/v1/admin/users", Some(r#"{"name": "sam", "role": "member", "groups": []}"#));
    assert_eq!(status, 200, "{body}");
    let (_, t) = s.call("POST", "/api/v1/users/sam/tokens", Some(r#"{"label": "test"}"#));
    let sam: Value = serde_json::from_str(&t).unwrap();
    sign_in_as(&b, &s, sam["token"].as_str().unwrap(), "sam");
    reload(&b, &url);
    for task in [&a, &b_name] {
        let item = b.wait("the hidden task's message", || {
            let t = b.text_of(&format!("#compare-tasks li[data-task='{task}']"));
            (!t.is_empty()).then_some(t)
        });
        assert!(item.contains("no task of that name that you can see"), "{item}");
    }
    assert!(b.try_find(".chart").is_none(), "nothing drawn of tasks sam may not see");
}
