//! A small W3C WebDriver client over HTTP for the console tests: Debian's `chromedriver` driving headless
//! `chromium`. Just what the tests use: navigate, find, click, type, read, run a script, take a screenshot.
//! `src/bin/console-bench.rs` uses it too (included by path), so it needs only the crate's own dependencies.

#![allow(dead_code)]

use serde_json::{Value, json};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    agent: ureq::Agent,
    /// The driver's and the browser's TMPDIR (profiles, shared-memory files), removed with the browser.
    tmp: std::path::PathBuf,
}

/// A found element's WebDriver reference.
#[derive(Debug, Clone)]
pub struct El(String);

impl El {
    /// The element as a script argument.
    pub fn reference(&self) -> Value {
        json!({ ELEMENT: self.0 })
    }
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

fn which(names: &[&str]) -> Option<String> {
    for n in names {
        for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
            if dir.join(n).is_file() {
                return Some(dir.join(n).display().to_string());
            }
        }
    }
    None
}

fn find_program(names: &[&str]) -> String {
    which(names).unwrap_or_else(|| {
        panic!("none of {names:?} is installed; .ci/run installs Debian's chromium and chromium-driver")
    })
}

const CHROMIUM: &[&str] = &["chromium", "chromium-browser", "google-chrome"];

impl Browser {
    /// Whether chromedriver and a chromium are on PATH.
    pub fn installed() -> bool {
        which(&["chromedriver"]).is_some() && which(CHROMIUM).is_some()
    }

    pub fn start() -> Browser {
        let chromedriver = find_program(&["chromedriver"]);
        let chromium = find_program(CHROMIUM);
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        // Everything the browser leaves in its temp dir (a profile per session, shared-memory files) goes
        // into one of ours, removed on drop, so runs leave nothing behind in /tmp.
        let tmp = std::env::temp_dir().join(format!("trainyard-browser-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let driver = Command::new(chromedriver)
            .env("TMPDIR", &tmp)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        let base = format!("http://127.0.0.1:{port}");
        let t0 = Instant::now();
        while agent.get(&format!("{base}/status")).call().is_err() {
            assert!(t0.elapsed() < Duration::from_secs(20), "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "unhandledPromptBehavior": "accept",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"]
            }
        }}});
        let mut b = Browser { driver, base, session: String::new(), agent, tmp };
        let v = b.post("/session", caps);
        b.session = v["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {v}")).to_owned();
        b
    }

    fn post(&self, path: &str, body: Value) -> Value {
        let url = format!("{}{path}", self.base);
        let mut r = self.agent.post(&url).send(body.to_string().as_bytes()).expect("chromedriver answers");
        let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
        v["value"].clone()
    }

    fn get(&self, path: &str) -> Value {
        let url = format!("{}{path}", self.base);
        let mut r = self.agent.get(&url).call().expect("chromedriver answers");
        let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
        v["value"].clone()
    }

    fn s(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    pub fn goto(&self, url: &str) {
        self.post(&self.s("/url"), json!({"url": url}));
    }

    /// The first element matching a CSS selector, if any now.
    pub fn try_find(&self, css: &str) -> Option<El> {
        let v = self.post(&self.s("/element"), json!({"using": "css selector", "value": css}));
        v[ELEMENT].as_str().map(|id| El(id.to_owned()))
    }

    /// Waits for an element to appear.
    pub fn find(&self, css: &str) -> El {
        self.wait(&format!("an element {css}"), || self.try_find(css))
    }

    pub fn wait<T>(&self, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let t0 = Instant::now();
        loop {
            if let Some(v) = f() {
                return v;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "waited 60 s for {what}; the page says:\n{}",
                self.text_of("body")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn click(&self, e: &El) {
        self.post(&self.s(&format!("/element/{}/click", e.0)), json!({}));
    }

    pub fn type_into(&self, e: &El, text: &str) {
        self.post(&self.s(&format!("/element/{}/value", e.0)), json!({"text": text}));
    }

    pub fn clear(&self, e: &El) {
        self.post(&self.s(&format!("/element/{}/clear", e.0)), json!({}));
    }

    pub fn text(&self, e: &El) -> String {
        self.get(&self.s(&format!("/element/{}/text", e.0))).as_str().unwrap_or("").to_owned()
    }

    /// The visible text of the first element matching `css` ("" when there is none).
    pub fn text_of(&self, css: &str) -> String {
        self.try_find(css).map(|e| self.text(&e)).unwrap_or_default()
    }

    pub fn script(&self, js: &str, args: Value) -> Value {
        self.post(&self.s("/execute/sync"), json!({"script": js, "args": args}))
    }

    /// Runs an asynchronous script: it ends by calling its last argument with the result.
    pub fn script_async(&self, js: &str, args: Value) -> Value {
        self.post(&self.s("/execute/async"), json!({"script": js, "args": args}))
    }

    /// The id of the task whose page is shown (its address names it by name; the page shows its id).
    #[allow(dead_code)] // not every browser test opens a task's page
    pub fn task_id_on_page(&self) -> String {
        self.wait("a task's page with its id", || {
            let id = self.try_find(".task-head .mono").map(|e| self.text(&e)).unwrap_or_default();
            (self.url().contains("#/tasks/") && !id.is_empty()).then_some(id)
        })
    }

    pub fn url(&self) -> String {
        self.get(&self.s("/url")).as_str().unwrap_or("").to_owned()
    }

    /// A PNG of the viewport.
    pub fn screenshot(&self, path: &std::path::Path) {
        use base64::Engine;
        let v = self.get(&self.s("/screenshot"));
        let png =
            base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap_or("")).unwrap_or_default();
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.agent.delete(&format!("{}{}", self.base, self.s(""))).call();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}
