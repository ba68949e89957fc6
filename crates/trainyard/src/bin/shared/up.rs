//! For the benchmark binaries: a `trainyard up` (the binary next to them; the local backend unless told) on a
//! data dir, and its HTTP API as a client uses it.

use serde_json::Value;
use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A server's API, as an admin.
pub struct Api {
    pub base: String,
    pub auth: String,
    pub agent: ureq::Agent,
}

impl Api {
    /// `method` on `path` (GET, PUT, anything else is POST); the status and the body as JSON (null if not).
    pub fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let r = match method {
            "GET" => self.agent.get(&url).header("Authorization", &self.auth).call(),
            "PUT" => {
                self.agent.put(&url).header("Authorization", &self.auth).send(body.unwrap_or("").as_bytes())
            }
            _ => {
                self.agent.post(&url).header("Authorization", &self.auth).send(body.unwrap_or("").as_bytes())
            }
        };
        let mut r = r.expect("the server answers");
        let text = r.body_mut().read_to_string().unwrap_or_default();
        (r.status().as_u16(), serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// A task's status now.
    #[allow(dead_code)] // not every benchmark binary asks
    pub fn status(&self, id: &str) -> String {
        self.call("GET", &format!("/api/v1/tasks/{id}"), None).1["status"].as_str().unwrap_or("").to_owned()
    }
}

/// Starts `trainyard up --backend local` on `dir` (made if missing) with `catalog`; the process and its API.
#[allow(dead_code)] // each benchmark binary uses one of the two
pub fn start(dir: &Path, catalog: &str) -> (Child, Api) {
    start_with(dir, catalog, &["--backend", "local"])
}

/// Starts `trainyard up ARGS` on `dir` (made if missing) with `catalog`; the process and its API.
pub fn start_with(dir: &Path, catalog: &str, args: &[&str]) -> (Child, Api) {
    start_env(dir, catalog, args, &[])
}

/// [`start_with`], with environment variables for the server.
pub fn start_env(dir: &Path, catalog: &str, args: &[&str], env: &[(&str, &str)]) -> (Child, Api) {
    let exe = std::env::current_exe().unwrap().with_file_name("trainyard");
    std::fs::create_dir_all(dir).unwrap();
    let mut server = Command::new(&exe)
        .envs(env.iter().copied())
        .arg("up")
        .args(args)
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("trainyard up starts (build it first: cargo build --release -p trainyard)");
    let mut lines = std::io::BufReader::new(server.stdout.take().unwrap()).lines();
    let base = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| {
            l.trim()
                .strip_prefix("API:")
                .map(|r| r.split_whitespace().next().unwrap().trim_end_matches("/api/v1").to_owned())
        })
        .expect("the API address");
    std::thread::spawn(move || for _ in lines {});
    let token = std::fs::read_to_string(dir.join("admin.token")).unwrap().trim().to_owned();
    let api = Api {
        base,
        auth: format!("Bearer {token}"),
        agent: ureq::Agent::config_builder().http_status_as_error(false).build().into(),
    };
    let (status, body) = api.call("PUT", "/api/v1/admin/catalog", Some(catalog));
    assert_eq!(status, 200, "{body}");
    (server, api)
}
