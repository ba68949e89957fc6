//! The CLI's side of the HTTP API: the connection (server, token, timeouts), a request and its refusal read
//! as a [`Failure`] with one of the exit statuses in [`EXIT_CODES`], a task's name or id resolved, output
//! lines that end quietly on a closed pipe ([`outln!`]), and a document printed as JSON or YAML.
//!
//! Server and token come from flags, then `TRAINYARD_SERVER` / `TRAINYARD_TOKEN`, then the config file, then
//! the defaults (`http://127.0.0.1:8080` and the admin token `trainyard up` saved in its data dir).

use serde_json::Value;
use std::process::ExitCode;
use std::time::Duration;

/// Writes one line to standard output. A reader that went away (`trainyard list | head`) ends the program
/// quietly, with status 0, as a pipeline expects.
pub fn write_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{args}").and_then(|()| out.flush()).is_err() {
        std::process::exit(0);
    }
}

/// `println!` through [`write_line`].
macro_rules! outln {
    () => { $crate::conn::write_line(format_args!("")) };
    ($($t:tt)*) => { $crate::conn::write_line(format_args!($($t)*)) };
}
pub(crate) use outln;

/// The exit statuses of the CLI verbs, as `trainyard --help` prints them.
pub const EXIT_CODES: &str = "\
Exit status:
  0  success
  1  the task ended in failure (submit, clone, stop and resubmit with --wait);
     `validate`: a file has errors
  2  usage or validation error: a bad flag, an unreadable file, no token, a request the server
     found invalid (400, 422)
  3  not found: no such task (by name or id) among those you can see, or no such replica
  4  refused by the server: a bad token (401), not allowed (403), not in a state for it (409), ...
  5  server or connection error: no answer, or the server failed (5xx)
`up` exits 2 when it cannot start (the reason is printed).";

/// The task ended in failure (a `--wait` verb), or `validate` found errors.
pub const EXIT_FAILED: u8 = 1;
/// Usage or validation error.
pub const EXIT_USAGE: u8 = 2;
/// No such task or replica.
pub const EXIT_NOT_FOUND: u8 = 3;
/// The server refused (4xx other than 400, 404 and 422).
pub const EXIT_REFUSED: u8 = 4;
/// No answer, or the server failed.
pub const EXIT_SERVER: u8 = 5;

#[derive(Debug, Clone)]
pub struct Conn {
    pub server: String,
    pub token: Option<String>,
    /// Where the default token was looked for (the admin token of `trainyard up`), for the message a
    /// missing token gets.
    pub token_file: Option<std::path::PathBuf>,
}

/// How a verb prints what the server answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// For people.
    Table,
    /// The API's answer, as JSON.
    Json,
    /// The API's answer, as YAML.
    Yaml,
}

/// A failed call: what to print and the exit status.
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub code: u8,
}

pub type CallResult<T> = Result<T, Failure>;

pub(crate) fn usage(message: impl Into<String>) -> Failure {
    Failure { message: message.into(), code: EXIT_USAGE }
}

pub(crate) fn not_found(message: impl Into<String>) -> Failure {
    Failure { message: message.into(), code: EXIT_NOT_FOUND }
}

impl Conn {
    /// An HTTP client for one request: every status is an answer, and it gives up after `timeout` (None:
    /// never, for a stream that may last).
    fn agent(timeout: Option<Duration>) -> ureq::Agent {
        ureq::Agent::config_builder().http_status_as_error(false).timeout_global(timeout).build().into()
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.trim_end_matches('/'))
    }

    /// The Authorization header, or what to do when there is no token at all.
    fn auth(&self) -> CallResult<String> {
        match self.token.as_deref() {
            Some(t) if !t.trim().is_empty() => Ok(format!("Bearer {}", t.trim())),
            _ => {
                let looked = self.token_file.as_ref().map_or(String::new(), |f| {
                    format!(" (nor is there an admin token of `trainyard up` at {})", f.display())
                });
                Err(usage(format!(
                    "no token: set TRAINYARD_TOKEN, pass --token, or put token: in ~/.config/trainyard/config.yaml{looked}"
                )))
            }
        }
    }

    fn unreachable(&self, e: ureq::Error) -> Failure {
        Failure {
            message: format!("cannot reach {}: {e} (is `trainyard up` running?)", self.server),
            code: EXIT_SERVER,
        }
    }

    /// `method` on `path`; the answer's JSON (a string when it is not JSON, null when empty), or the problem
    /// the server answered with.
    pub(crate) fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        key: Option<&str>,
    ) -> CallResult<(u16, Value)> {
        let agent = Self::agent(Some(Duration::from_secs(60)));
        let (url, auth) = (self.url(path), self.auth()?);
        let result = match method {
            "GET" => agent.get(&url).header("Authorization", &auth).call(),
            "DELETE" => agent.delete(&url).header("Authorization", &auth).call(),
            "PUT" => agent.put(&url).header("Authorization", &auth).send(body.unwrap_or_default()),
            _ => {
                let mut req = agent.post(&url).header("Authorization", &auth);
                if let Some(k) = key {
                    req = req.header("Idempotency-Key", k);
                }
                req.send(body.unwrap_or_default())
            }
        };
        let mut resp = result.map_err(|e| self.unreachable(e))?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        if status >= 400 {
            return Err(refusal(status, text));
        }
        let value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Ok((status, value))
    }

    /// A GET answered with success, or the problem the server answered with.
    fn get(&self, path: &str, timeout: Option<Duration>) -> CallResult<ureq::http::Response<ureq::Body>> {
        let mut resp = Self::agent(timeout)
            .get(&self.url(path))
            .header("Authorization", &self.auth()?)
            .call()
            .map_err(|e| self.unreachable(e))?;
        let status = resp.status().as_u16();
        if status >= 400 {
            return Err(refusal(status, resp.body_mut().read_to_string().unwrap_or_default()));
        }
        Ok(resp)
    }

    /// A GET whose answer is text: (the text, `X-Next-Offset`, `X-Log-Ended`).
    pub fn get_text(&self, path: &str) -> CallResult<(String, u64, bool)> {
        let mut resp = self.get(path, Some(Duration::from_secs(60)))?;
        let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let (next, ended) = (header("x-next-offset"), header("x-log-ended"));
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        Ok((text, next.and_then(|n| n.parse().ok()).unwrap_or(0), ended.as_deref() == Some("true")))
    }

    /// A GET answered with a stream of bytes that may take a while (a download).
    pub fn download(&self, path: &str) -> CallResult<impl std::io::Read + use<>> {
        Ok(self.get(path, None)?.into_body().into_reader())
    }

    /// A GET answered with a stream that may last (server-sent events): its body, line by line.
    pub fn stream(&self, path: &str) -> CallResult<impl std::io::BufRead + use<>> {
        let resp = self.get(path, None)?;
        Ok(std::io::BufReader::new(resp.into_body().into_reader()))
    }
}

/// A refusal's body (a problem document, or text) as a failure, its exit status from the HTTP status: a
/// request found invalid is a usage error, 404 is not found, another 4xx a refusal, a 5xx the server's.
fn refusal(status: u16, text: String) -> Failure {
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    let code = match status {
        400 | 422 => EXIT_USAGE,
        404 => EXIT_NOT_FOUND,
        400..500 => EXIT_REFUSED,
        _ => EXIT_SERVER,
    };
    Failure { message: problem_text(&v), code }
}

/// The server's catalog (its JSON text), when a server answers at `c` with a token within a few seconds.
pub fn server_catalog(c: &Conn) -> Option<String> {
    c.token.as_deref()?;
    let mut resp = c.get("/api/v1/catalog", Some(Duration::from_secs(3))).ok()?;
    resp.body_mut().read_to_string().ok()
}

/// The id of the task `task` names: its name or its id, among the tasks the caller can see.
pub fn resolve(c: &Conn, task: &str) -> CallResult<String> {
    let (_, v) = c.call("GET", &format!("/api/v1/tasks?q={}&limit=50", encode(task)), None, None)?;
    v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["id"].as_str() == Some(task) || t["name"].as_str() == Some(task))
        .and_then(|t| t["id"].as_str().map(str::to_owned))
        .ok_or_else(|| {
            not_found(format!(
                "no task named {task:?} (or with that id) among those you can see; `trainyard list` shows them"
            ))
        })
}

/// A problem document for people: the detail, then every problem with its path.
fn problem_text(v: &Value) -> String {
    let mut out = format!(
        "{} ({}): {}",
        v["title"].as_str().unwrap_or("error"),
        v["status"].as_u64().unwrap_or(0),
        v["detail"].as_str().unwrap_or(&v.to_string())
    );
    for p in v["problems"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\n  {}[{}] {}: {}",
            p["severity"].as_str().unwrap_or(""),
            p["code"].as_str().unwrap_or(""),
            p["path"].as_str().unwrap_or(""),
            p["message"].as_str().unwrap_or("")
        ));
    }
    // A refused catalog: what it would take away from active tasks, and from which.
    for c in v["conflicts"].as_array().into_iter().flatten() {
        let names: Vec<&str> =
            c["taskNames"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        out.push_str(&format!(
            "\n  [{}] {}: {} ({} active tasks: {})",
            c["code"].as_str().unwrap_or(""),
            c["path"].as_str().unwrap_or(""),
            c["message"].as_str().unwrap_or(""),
            c["tasks"].as_u64().unwrap_or(0),
            names.join(", ")
        ));
    }
    out
}

pub(crate) fn print(v: &Value, format: Format) {
    match format {
        Format::Json | Format::Table => outln!("{}", serde_json::to_string_pretty(v).unwrap_or_default()),
        Format::Yaml => outln!("{}", serde_saphyr::to_string(v).unwrap_or_default().trim_end()),
    }
}

pub fn finish(r: CallResult<ExitCode>) -> ExitCode {
    match r {
        Ok(c) => c,
        Err(f) => {
            eprintln!("trainyard: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

pub(crate) fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
