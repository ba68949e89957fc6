//! The console's task page in a real browser (Debian's headless chromium through chromedriver) against a real
//! `trainyard up` on the local backend: metrics as charts with units, the spec as YAML that reads back as the
//! same task, relative times and durations, and the log pane's search and height. Screenshots go to
//! `target/console-screenshots/` (or `TRAINYARD_SCREENSHOTS`).

// The awkward values of the YAML test are one `json!` literal, deeper than the default limit lets it expand.
#![recursion_limit = "256"]

mod common;

use common::console::{DESKTOP, PHONE, framed, framed_widths, scroll_to, shots, sign_in};
use common::webdriver::{Browser, El};
use common::{Server, secs};
use serde_json::{Value, json};

// WebDriver's codes for keys (W3C WebDriver, "Keyboard actions").
const ENTER: &str = "\u{E007}";
const SHIFT: &str = "\u{E008}";
const ARROW_DOWN: &str = "\u{E015}";
const ARROW_LEFT: &str = "\u{E012}";

/// A task that prints numbered steps (every fourth a "checkpoint" line) for about 24 s and serves metrics of its
/// own in the Prometheus text format: a plain gauge, a large counter, a byte counter and a time in seconds.
const TRAIN: &str = r#"python3 - <<'PY'
import http.server, threading, time
t0 = time.time()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        s = time.time() - t0
        body = ('train_loss{phase="train"} %.4f\ntrain_tokens_total %d\ndata_read_bytes_total %d\nstep_time_seconds %.3f\n'
                % (1.0 / (1.0 + s), int(s * 24860000), int(s * 3500000), 0.2 + s / 100)).encode()
        self.send_response(200); self.send_header("Content-Type", "text/plain"); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
srv = http.server.HTTPServer(("127.0.0.1", PORT), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
for i in range(96):
    print("step %d loss %.3f" % (i, 1.0 / (1 + i)), flush=True)
    if i % 4 == 0:
        print("Checkpoint saved at step %d" % i, flush=True)
    t = time.time()
    while time.time() - t < 0.25:
        sum(j * j for j in range(5000))
PY"#;

fn attr(b: &Browser, e: &El, js: &str) -> Value {
    b.script(&format!("const e = arguments[0]; return {js};"), json!([e.reference()]))
}

/// The texts of every element matching `css`.
fn texts(b: &Browser, css: &str) -> Vec<String> {
    let v = b.script(
        "return [...document.querySelectorAll(arguments[0])].map((e) => e.textContent)",
        json!([css]),
    );
    v.as_array().unwrap().iter().map(|x| x.as_str().unwrap_or("").to_owned()).collect()
}

fn log_height(b: &Browser) -> f64 {
    b.script("return document.getElementById('log').getBoundingClientRect().height", json!([]))
        .as_f64()
        .unwrap()
}

/// "3 of 12 matches" as (3, 12).
fn count(b: &Browser) -> Option<(u64, u64)> {
    let t = b.text_of("#log-count");
    let mut w = t.split_whitespace();
    let at = w.next()?.parse().ok()?;
    (w.next()? == "of").then_some(())?;
    Some((at, w.next()?.parse().ok()?))
}

/// A running task's page: the log searched while it follows live (matches highlighted and counted, next and
/// previous with Enter and Shift+Enter, filtered to matching lines), the pane resized by keyboard and by drag and
/// kept across a reload; once it ended, a chart per metric with time and value axes in units, a readout, the
/// spec as YAML that the server reads back as the same task (and as JSON), relative times and the attempts'
/// durations; screenshots at desktop and phone width.
#[test]
fn the_task_page_charts_logs_times_and_spec() {
    let s = Server::start("console-task", None);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut task = common::pytorch("pagetask", 1, &TRAIN.replace("PORT", &port.to_string()));
    task["spec"]["advanced"] = json!({"metrics": {"enabled": true, "intervalSeconds": 5, "endpoints": [{"port": port, "path": "/metrics"}]}});
    task["spec"]["environment"]["env"] = json!([{"name": "NOTE", "value": "a: b # not a comment"}]);
    let id = s.submit(&task);
    s.wait_status(&id, "Running", secs(60));
    let b = Browser::start();
    sign_in(&b, &s);
    let url = format!("{}/#/tasks/{id}", s.base);
    b.goto(&url);
    b.wait("the log", || b.text_of("#log").contains("step 2 ").then_some(()));

    // Search while the log follows: every match is a <mark>, counted, and the count grows as lines arrive.
    b.type_into(&b.find("#log-search"), "checkpoint");
    b.wait("a match count", || count(&b));
    // The count and the marks read at once (lines keep arriving).
    let seen = b.script(
        "return [document.getElementById('log-count').textContent,
                 [...document.querySelectorAll('#log mark')].map((m) => m.textContent)]",
        json!([]),
    );
    let said = seen[0].as_str().unwrap();
    let marks: Vec<&str> = seen[1].as_array().unwrap().iter().map(|m| m.as_str().unwrap()).collect();
    assert!(said.starts_with("1 of "), "the first match is the current one: {said}");
    let first = marks.len() as u64;
    assert_eq!(said, format!("1 of {first} {}", if first == 1 { "match" } else { "matches" }));
    assert!(marks.iter().all(|m| *m == "Checkpoint"), "matches keep the log's own case: {marks:?}");
    b.wait("more matches as the log grows", || count(&b).filter(|&(_, n)| n > first));
    let search = b.find("#log-search");
    b.type_into(&search, ENTER);
    assert_eq!(count(&b).map(|c| c.0), Some(2), "{}", b.text_of("#log-count"));
    assert_eq!(texts(&b, "#log mark.current").len(), 1);
    b.type_into(&search, &format!("{SHIFT}{ENTER}"));
    assert_eq!(count(&b).map(|c| c.0), Some(1), "{}", b.text_of("#log-count"));
    scroll_to(&b, "#log");
    b.screenshot(&shots().join("task-page-log-search.png"));
    // Only the matching lines.
    b.click(&b.find("#log-only"));
    let shown = b.script("return document.getElementById('log').textContent", json!([]));
    let lines: Vec<&str> = shown.as_str().unwrap().lines().collect();
    assert!(lines.len() >= 2 && lines.iter().all(|l| l.contains("Checkpoint saved")), "{lines:?}");
    b.click(&b.find("#log-only"));
    assert!(b.text_of("#log").contains("step 1 loss"), "every line again");
    b.clear(&search);
    b.type_into(&search, "no such line anywhere");
    b.wait("no matches", || (b.text_of("#log-count") == "No matches").then_some(()));

    // The pane's height: two arrow presses on its handle, then a drag; kept for the next visit.
    let before = log_height(&b);
    b.type_into(&b.find("#log-resize"), &format!("{ARROW_DOWN}{ARROW_DOWN}"));
    let keyed = log_height(&b);
    assert!((keyed - before - 80.0).abs() < 1.0, "{before} then {keyed}");
    b.script(
        "const h = document.getElementById('log-resize'); const r = h.getBoundingClientRect();
         const at = (type, y) => h.dispatchEvent(new PointerEvent(type, {bubbles: true, pointerId: 7, clientX: r.x + 5, clientY: y}));
         at('pointerdown', r.y + 5); at('pointermove', r.y + 60); at('pointerup', r.y + 105);",
        json!([]),
    );
    let dragged = log_height(&b);
    assert!((dragged - keyed - 100.0).abs() < 1.0, "{keyed} then {dragged}");
    let kept = b.script("return localStorage.getItem('trainyard.logHeight')", json!([]));
    assert_eq!(kept.as_str().and_then(|v| v.parse::<f64>().ok()), Some(dragged.round()));
    // Never past its bounds.
    b.script(
        "const h = document.getElementById('log-resize'); const r = h.getBoundingClientRect();
         const at = (type, y) => h.dispatchEvent(new PointerEvent(type, {bubbles: true, pointerId: 7, clientY: y}));
         at('pointerdown', r.y); at('pointerup', r.y - 5000);",
        json!([]),
    );
    assert!((log_height(&b) - 120.0).abs() < 1.0, "the least height: {}", log_height(&b));
    b.type_into(&b.find("#log-resize"), &ARROW_DOWN.repeat(4));
    let kept = log_height(&b);
    b.goto("about:blank");
    b.goto(&url);
    b.find("#log-resize");
    assert!((log_height(&b) - kept).abs() < 1.0, "kept across visits: {kept} then {}", log_height(&b));

    s.wait_status(&id, "Succeeded", secs(90));
    b.wait("success", || (b.text_of("h1 .badge") == "Succeeded").then_some(()));

    // One chart per metric, each with 4 to 6 value ticks in its unit and clock times below.
    let (_, m) = s.call("GET", &format!("/api/v1/tasks/{id}/metrics"), None);
    let m: Value = serde_json::from_str(&m).unwrap();
    let mut names: Vec<String> =
        m["series"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap().to_owned()).collect();
    names.sort();
    names.dedup();
    for want in ["trainyard_cpu_cores", "trainyard_memory_rss_bytes", "train_loss", "train_tokens_total"] {
        assert!(names.iter().any(|n| n == want), "{want} sampled: {names:?}");
    }
    b.wait("a chart per metric", || {
        let mut shown: Vec<String> = b
            .script("return [...document.querySelectorAll('.chart')].map((c) => c.dataset.metric)", json!([]))
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect();
        shown.sort();
        (shown == names && texts(&b, ".chart svg").len() == names.len()).then_some(())
    });
    let ticks = |metric: &str, axis: &str| texts(&b, &format!(".chart[data-metric='{metric}'] .{axis}-tick"));
    let in_unit = |metric: &str, units: &[&str]| {
        let t = ticks(metric, "y");
        assert!((4..=6).contains(&t.len()), "{metric}: {t:?}");
        let unit = units.iter().find(|u| t.iter().all(|l| l.ends_with(*u)));
        assert!(unit.is_some(), "{metric}: every tick in one of {units:?}: {t:?}");
    };
    in_unit("trainyard_memory_rss_bytes", &[" MiB"]);
    in_unit("trainyard_cpu_cores", &[" cores"]);
    in_unit("data_read_bytes_total", &[" MiB"]);
    in_unit("step_time_seconds", &[" ms", " s"]);
    let tokens = ticks("train_tokens_total", "y");
    assert!(
        (4..=6).contains(&tokens.len()) && tokens[0] == "0" && tokens[1..].iter().all(|t| t.ends_with('M')),
        "a plain number with an SI suffix: {tokens:?}"
    );
    // A plain number's ticks are plain, evenly spaced numbers.
    let loss: Vec<f64> = ticks("train_loss", "y").iter().map(|t| t.parse().unwrap_or(f64::NAN)).collect();
    let step = loss[1] - loss[0];
    assert!(
        (4..=6).contains(&loss.len())
            && step > 0.0
            && loss.windows(2).all(|w| (w[1] - w[0] - step).abs() < 1e-9),
        "{loss:?}"
    );
    let all_ticks = texts(&b, ".chart .tick").join(" ");
    assert!(!all_ticks.contains("e+") && !all_ticks.contains("e-"), "no exponents: {all_ticks}");
    let x = ticks("train_loss", "x");
    assert!(x.len() >= 2 && x.iter().all(|l| l.len() >= 5 && l.as_bytes()[2] == b':'), "clock times: {x:?}");
    // The summary and legend name the replica; the readout follows the keyboard.
    let svg = b.find(".chart[data-metric='trainyard_memory_rss_bytes'] svg");
    let label = attr(&b, &svg, "e.getAttribute('aria-label')").as_str().unwrap().to_owned();
    assert!(
        label.contains("master-0")
            && label.contains("min ")
            && label.contains("max ")
            && label.contains("MiB"),
        "{label}"
    );
    // A line per replica, each in the legend.
    assert_eq!(texts(&b, ".chart[data-metric='trainyard_memory_rss_bytes'] polyline").len(), 2);
    let legend = b.text_of(".chart[data-metric='train_loss'] .chart-legend");
    assert!(
        legend.contains("master-0 {phase=train}") && legend.contains("worker-0 {phase=train}"),
        "{legend}"
    );
    b.type_into(&svg, ARROW_LEFT);
    let readout = b.text_of(".chart[data-metric='trainyard_memory_rss_bytes'] .chart-readout");
    assert!(readout.contains("master-0") && readout.contains("MiB") && readout.contains(':'), "{readout}");
    scroll_to(&b, "#metrics");
    b.screenshot(&shots().join("task-page-chart-readout.png"));

    // Relative times and durations: created "… ago", the run's length, each attempt's wait and run.
    assert!(b.text_of(".overview [data-key='created']").ends_with("ago"), "{}", b.text_of(".overview"));
    let created = b.find(".overview [data-key='created'] time");
    assert!(!attr(&b, &created, "e.title").as_str().unwrap().is_empty(), "the exact time on hover");
    let ran = b.text_of(".overview [data-key='ran-for']");
    assert!(ran.ends_with(" s") || ran.contains(" min "), "ran for {ran}");
    let row = "#attempts tr[data-attempt='0']";
    let waited = b.text_of(&format!("{row} td.wait"));
    let run = b.text_of(&format!("{row} td.ran"));
    assert!(waited.ends_with(" ms") || waited.ends_with(" s"), "waited {waited}");
    let secs_ran: u64 = run.strip_suffix(" s").and_then(|n| n.parse().ok()).unwrap_or(90);
    assert!((22..90).contains(&secs_ran), "ran {run}");
    for e in texts(&b, "#events li time") {
        assert!(e == "just now" || e.ends_with(" ago"), "event time {e:?}");
    }
    let header = texts(&b, "table.attempts th");
    assert!(header.contains(&"Waited".to_owned()) && header.contains(&"Ran".to_owned()), "{header:?}");

    // The spec as YAML: the server reads it back as the same task, and so does a YAML parser.
    let api_spec = s.task(&id)["spec"].clone();
    b.click(&b.find("#spec-yaml"));
    let yaml = b.script("return document.getElementById('spec').textContent", json!([]));
    let yaml = yaml.as_str().unwrap();
    assert!(yaml.starts_with("apiVersion: trainyard.dev/v1\n"), "{yaml}");
    assert!(yaml.contains("value: 'a: b # not a comment'"), "{yaml}");
    let parsed: Value = serde_saphyr::from_str(yaml).unwrap_or_else(|e| panic!("{e}: {yaml}"));
    assert_eq!(parsed, api_spec, "{yaml}");
    let (status, v) = s.call("POST", "/api/v1/validate", Some(yaml));
    assert_eq!(status, 200, "{v}");
    let v: Value = serde_json::from_str(&v).unwrap();
    assert_eq!(v["task"], api_spec, "{v}");
    scroll_to(&b, "#spec");
    b.screenshot(&shots().join("task-page-spec-yaml.png"));
    b.click(&b.find("#spec-json"));
    let text = b.script("return document.getElementById('spec').textContent", json!([]));
    assert_eq!(serde_json::from_str::<Value>(text.as_str().unwrap()).unwrap(), api_spec);
    assert_eq!(attr(&b, &b.find("#spec-json"), "e.getAttribute('aria-pressed')"), "true");
    b.click(&b.find("#spec-copy"));
    b.wait("the copy said", || (!b.text_of("#spec-copied").is_empty()).then_some(()));
    b.click(&b.find("#spec-yaml"));

    // Desktop and phone: nothing wider than the screen; the charts at the phone's width.
    framed(&b, &url, DESKTOP, ".chart svg");
    b.screenshot(&shots().join("task-page-desktop.png"));
    framed_scroll(&b, "#metrics");
    b.screenshot(&shots().join("task-page-charts-desktop.png"));
    framed(&b, &url, PHONE, ".chart svg");
    let (wide, frame) = framed_widths(&b);
    assert!(wide <= frame, "the page overflows at phone width: {wide} px in {frame}");
    let chart_widths = b.script(
        "const d = document.getElementById('frame').contentDocument;
         return [...d.querySelectorAll('.chart svg')].map((s) => s.getBoundingClientRect().right);",
        json!([]),
    );
    for right in chart_widths.as_array().unwrap() {
        assert!(right.as_f64().unwrap() <= f64::from(PHONE.0), "a chart past the screen: {chart_widths}");
    }
    b.screenshot(&shots().join("task-page-phone.png"));
    framed_scroll(&b, "#attempts");
    b.screenshot(&shots().join("task-page-attempts-phone.png"));
    framed_scroll(&b, "#metrics");
    b.screenshot(&shots().join("task-page-charts-phone.png"));
    framed_scroll(&b, ".log-search");
    b.screenshot(&shots().join("task-page-logs-phone.png"));
}

/// The YAML emitter on values that need care (quoting, escapes, block scalars, empty collections, keys), read
/// back by the server's YAML parser as the same values.
#[test]
fn the_yaml_emitter_round_trips_awkward_values() {
    let s = Server::start("console-yaml", None);
    let b = Browser::start();
    b.goto(&format!("{}/", s.base));
    let value = json!({
        "empty": "", "lead": " x", "trail": "x ", "colon": "a: b", "colon-end": "x:", "hash": "# x", "mid-hash": "a #b",
        "dash": "- x", "dash-only": "-", "question": "?", "star": "*ref", "amp": "&anchor", "bang": "!tag",
        "pipe": "|", "gt": ">", "percent": "%x", "at": "@x", "tick": "`x", "quote": "'x'", "dquote": "\"x\"",
        "brace": "{a}", "bracket": "[a]", "comma": "a, b", "int": "123", "float": "1.5", "exp": "1e3", "hex": "0x1F",
        "octal": "0o17", "neg": "-1", "plus": "+1", "dot": ".5", "inf": ".inf", "nan": "NaN", "bare-inf": "inf",
        "bool": "true", "yes": "Yes", "off": "OFF", "y": "y", "null": "null", "tilde": "~", "date": "2026-12-02",
        "time": "12:30", "merge": "<<", "dots": "...", "dashes": "---",
        "one-line": "it's plain", "unicode": "日本語 ✓ 😀", "backslash": "a\\b",
        "nl": "line one\nline two", "nl-end": "line one\nline two\n", "nl-many": "x\n\n\n", "nl-lead": "\nx",
        "space-lead-line": "a\n  b\n c", "blank-space-line": "a\n \nb", "only-nl": "\n", "crlf": "a\r\nb",
        "tab": "a\tb", "bell": "a\u{7}b", "del": "a\u{7f}b", "nel": "a\u{85}b", "ls": "a\u{2028}b", "bom": "\u{feff}x",
        "numbers": [0, -3, 0.1, 1e21, 123456789012_i64, 2.5e-8], "bools": [true, false, null],
        "nested": [[1, [2, []]], {}, {"a": {"b": []}}, [{"k": "v", "l": ["x"]}]],
        "multiline-in-list": ["first\nsecond", "third"],
        "": "empty key", "key: colon": 1, "key #hash": 2, "- dash": 3, "123": 4, "true": 5, "multi\nline key": 6,
        "spaced key": 7
    });
    let yaml = b.script_async(
        "const done = arguments[arguments.length - 1];
         import('/console/yaml.js').then((m) => done(m.toYaml(arguments[0]))).catch((e) => done(String(e)));",
        json!([value]),
    );
    let yaml = yaml.as_str().unwrap();
    let parsed: Value = serde_saphyr::from_str(yaml).unwrap_or_else(|e| panic!("{e}:\n{yaml}"));
    assert_eq!(parsed, value, "{yaml}");
    // Written the way a person would write them: plain where plain reads back, a block for lines.
    for line in
        ["one-line: it's plain", "'true': 5", "nl: |-\n  line one\n  line two\n", "bools:\n  - true\n"]
    {
        assert!(yaml.contains(line), "{line:?} in:\n{yaml}");
    }
    for line in ["empty: ''", "int: '123'", "bool: 'true'", "numbers:\n  - 0\n", "nested:\n  - - 1\n"] {
        assert!(yaml.contains(line), "{line:?} in:\n{yaml}");
    }
    // And the server takes a task in it.
    let task = common::pytorch("yamlround", 0, "echo 'a: b' # and \"more\"\nprintf '%s\\n' done\n");
    let yaml = b.script_async(
        "const done = arguments[arguments.length - 1];
         import('/console/yaml.js').then((m) => done(m.toYaml(arguments[0])));",
        json!([task]),
    );
    let (status, v) = s.call("POST", "/api/v1/validate", Some(yaml.as_str().unwrap()));
    assert_eq!(status, 200, "{v}");
    let v: Value = serde_json::from_str(&v).unwrap();
    assert_eq!(v["valid"], true, "{v}");
    assert_eq!(v["task"]["spec"]["environment"]["cmd"], task["spec"]["environment"]["cmd"], "{yaml}");
}

/// The charts' scales on values the test task does not produce: each unit's ticks, round and in one suffix,
/// never in exponent notation; and the time since a start that a comparison of tasks counts in.
#[test]
fn chart_scales_are_round_and_in_units() {
    let s = Server::start("console-scales", None);
    let b = Browser::start();
    b.goto(&format!("{}/", s.base));
    let cases = json!([
        ["trainyard_gpu_memory_used_mib", 0, 40000],
        ["trainyard_gpu_utilization_percent", 0, 37],
        ["trainyard_memory_rss_bytes", 0, 3.5e9],
        ["step_time_seconds", 0.2, 0.45],
        ["wall_seconds_total", 0, 3000],
        ["tokens_total", 0, 2.486e8],
        ["steps", 1234, 1234],
        ["learning_rate", 0, 0.0003],
        ["delta", -5, 3],
        ["idle", 0, 0],
    ]);
    let v = b.script_async(
        "const done = arguments[arguments.length - 1];
         import('/console/charts.js').then((m) => done(arguments[0].map(([name, lo, hi]) =>
           m.valueTicks(m.unitOf(name), lo, hi).ticks.map((t) => t.label).join(' | '))))
         .catch((e) => done(String(e)));",
        json!([cases]),
    );
    let got: Vec<&str> =
        v.as_array().unwrap_or_else(|| panic!("{v}")).iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(
        got,
        [
            "0 GiB | 10 GiB | 20 GiB | 30 GiB | 40 GiB",
            "0 % | 20 % | 40 % | 60 % | 80 % | 100 %",
            "0 GiB | 1 GiB | 2 GiB | 3 GiB | 4 GiB",
            "0 ms | 100 ms | 200 ms | 300 ms | 400 ms | 500 ms",
            "0 min | 10 min | 20 min | 30 min | 40 min | 50 min",
            "0 | 50M | 100M | 150M | 200M | 250M",
            "0 | 250 | 500 | 750 | 1000 | 1250",
            "0 | 0.0001 | 0.0002 | 0.0003",
            "-6 | -4 | -2 | 0 | 2 | 4",
            "0 | 0.2 | 0.4 | 0.6 | 0.8 | 1",
        ]
    );
    let v = b.script_async(
        "const done = arguments[arguments.length - 1];
         import('/console/charts.js').then((m) => done([
           m.formatValue('mib', 20480), m.formatValue('cores', 1), m.formatValue('cores', 0.53), m.formatValue('plain', 248600000),
           m.formatValue('seconds', 0.25), m.formatValue('plain', 0.00001), m.formatValue('bytes', 123), m.formatValue('percent', 12.5),
         ]));",
        json!([]),
    );
    assert_eq!(
        v,
        json!(["20 GiB", "1 core", "0.53 cores", "248.6M", "250 ms", "0.00001", "123 B", "12.5 %"])
    );
    // A comparison's time axis: time since each task's start, as a stopwatch shows it, at round steps from 0.
    let v = b.script_async(
        "const done = arguments[arguments.length - 1];
         import('/console/charts.js').then((m) => done([
           [0, 7000, 59600, 750000, 3900000, -2000].map(m.elapsedText),
           m.elapsedTicks(0, 95000, 6).map((t) => t.label), m.elapsedTicks(0, 5400000, 5).map((t) => t.label),
         ]));",
        json!([]),
    );
    assert_eq!(
        v,
        json!([
            ["0:00", "0:07", "1:00", "12:30", "1:05:00", "-0:02"],
            ["0:00", "0:30", "1:00", "1:30"],
            ["0:00", "30:00", "1:00:00", "1:30:00"],
        ])
    );
}

/// Scrolls the framed page so the section holding `css` is at the top.
fn framed_scroll(b: &Browser, css: &str) {
    b.script(
        "document.getElementById('frame').contentDocument.querySelector(arguments[0]).closest('section').scrollIntoView({block: 'start'});",
        json!([css]),
    );
}
