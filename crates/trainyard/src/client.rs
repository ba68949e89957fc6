//! The CLI verbs that talk to a Trainyard server over its HTTP API, kubectl-style.
//!
//! Server and token come from flags, then `TRAINYARD_SERVER` / `TRAINYARD_TOKEN`, then the defaults
//! (`http://127.0.0.1:8080` and the token `trainyard up` saved in `.trainyard/admin.token`).
//! Exit status: 0 done; 1 the server refused (the problem is printed); 2 usage or connection error;
//! `submit --wait`: 1 when the task ends Failed or Stopped.

use serde_json::Value;
use std::process::ExitCode;
use std::time::{Duration, Instant};

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
    () => { $crate::client::write_line(format_args!("")) };
    ($($t:tt)*) => { $crate::client::write_line(format_args!($($t)*)) };
}
pub(crate) use outln;

#[derive(Debug, Clone)]
pub struct Conn {
    pub server: String,
    pub token: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
    Yaml,
}

/// A failed call: what to print and the exit status.
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub code: u8,
}

pub type CallResult<T> = Result<T, Failure>;

fn usage(message: impl Into<String>) -> Failure {
    Failure { message: message.into(), code: 2 }
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

    fn auth(&self) -> String {
        format!("Bearer {}", self.token.as_deref().unwrap_or(""))
    }

    fn unreachable(&self, e: ureq::Error) -> Failure {
        usage(format!("cannot reach {}: {e} (is `trainyard up` running?)", self.server))
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
        let (url, auth) = (self.url(path), self.auth());
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
            return Err(refusal(text));
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
            .header("Authorization", &self.auth())
            .call()
            .map_err(|e| self.unreachable(e))?;
        if resp.status().as_u16() >= 400 {
            return Err(refusal(resp.body_mut().read_to_string().unwrap_or_default()));
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

    /// A GET answered with a stream that may last (server-sent events): its body, line by line.
    pub fn stream(&self, path: &str) -> CallResult<impl std::io::BufRead + use<>> {
        let resp = self.get(path, None)?;
        Ok(std::io::BufReader::new(resp.into_body().into_reader()))
    }
}

/// A refusal's body (a problem document, or text) as a failure with status 1.
fn refusal(text: String) -> Failure {
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Failure { message: problem_text(&v), code: 1 }
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
        .ok_or_else(|| Failure {
            message: format!("no task named {task:?} (or with that id) among those you can see; `trainyard list` shows them"),
            code: 1,
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
    out
}

fn print(v: &Value, format: Format) {
    match format {
        Format::Json | Format::Table => outln!("{}", serde_json::to_string_pretty(v).unwrap_or_default()),
        Format::Yaml => outln!("{}", serde_saphyr::to_string(v).unwrap_or_default().trim_end()),
    }
}

fn ago(ms: i64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let s = (now - ms).max(0) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

fn table(items: &[Value]) {
    let rows: Vec<[String; 6]> = items
        .iter()
        .map(|t| {
            let note = match t["queue"]["reason"].as_str() {
                Some(r) => format!("#{} {r}", t["queue"]["position"]),
                None => String::new(),
            };
            [
                t["name"].as_str().unwrap_or("").to_owned(),
                t["type"].as_str().unwrap_or("").to_owned(),
                t["status"].as_str().unwrap_or("").to_owned(),
                t["projectGroup"].as_str().unwrap_or("").to_owned(),
                ago(t["createdAtMs"].as_i64().unwrap_or(0)),
                note,
            ]
        })
        .collect();
    let header = ["NAME", "TYPE", "STATUS", "GROUP", "AGE", "QUEUE"];
    let mut w = header.map(str::len);
    for r in &rows {
        for (i, c) in r.iter().enumerate().take(5) {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |c: [&str; 6]| {
        outln!(
            "{:<a$}  {:<b$}  {:<c$}  {:<d$}  {:<e$}  {}",
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            c[5],
            a = w[0],
            b = w[1],
            c = w[2],
            d = w[3],
            e = w[4]
        );
    };
    line(header);
    for r in &rows {
        line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5]]);
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

pub fn whoami(c: &Conn) -> CallResult<ExitCode> {
    let (_, v) = c.call("GET", "/api/v1/whoami", None, None)?;
    let groups: Vec<&str> = v["groups"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    outln!(
        "{} ({}), groups: {}",
        v["name"].as_str().unwrap_or(""),
        v["role"].as_str().unwrap_or(""),
        groups.join(", ")
    );
    Ok(ExitCode::SUCCESS)
}

pub fn submit(
    c: &Conn,
    file: &std::path::Path,
    key: Option<&str>,
    wait: bool,
    format: Format,
) -> CallResult<ExitCode> {
    let body = if file.as_os_str() == "-" {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut b)
            .map_err(|e| usage(format!("cannot read stdin: {e}")))?;
        b
    } else {
        std::fs::read(file).map_err(|e| usage(format!("cannot read {}: {e}", file.display())))?
    };
    let (status, t) = c.call("POST", "/api/v1/tasks", Some(&body), key)?;
    let name = t["name"].as_str().unwrap_or("").to_owned();
    let id = t["id"].as_str().unwrap_or("").to_owned();
    if format == Format::Table {
        outln!("{} {name} (id {id})", if status == 201 { "created" } else { "already created" });
    } else {
        print(&t, format);
    }
    if !wait {
        return Ok(ExitCode::SUCCESS);
    }
    wait_until_done(c, &id, &name)
}

/// Follows a task until it ends: each new event, and while it is queued its place and the scheduler's reason
/// whenever they change, on standard error; then how it ended. Exit status 0 only when it succeeded.
pub fn wait_until_done(c: &Conn, id: &str, name: &str) -> CallResult<ExitCode> {
    const WAIT_LIMIT: Duration = Duration::from_secs(24 * 3600);
    let start = Instant::now();
    let mut after = 0i64;
    let mut last_queue = String::new();
    loop {
        let (_, ev) = c.call("GET", &format!("/api/v1/tasks/{id}/events?after={after}"), None, None)?;
        for e in ev["items"].as_array().into_iter().flatten() {
            after = after.max(e["seq"].as_i64().unwrap_or(after));
            eprintln!("  {:<16} {}", e["reason"].as_str().unwrap_or(""), e["message"].as_str().unwrap_or(""));
        }
        let (_, t) = c.call("GET", &format!("/api/v1/tasks/{id}"), None, None)?;
        if let Some(reason) = t["queue"]["reason"].as_str() {
            let line = format!(
                "queued #{} ({} in its group): {reason}",
                t["queue"]["position"], t["queue"]["positionInGroup"]
            );
            if line != last_queue {
                eprintln!("  {line}");
                last_queue = line;
            }
        }
        match t["status"].as_str().unwrap_or("") {
            "Succeeded" => {
                outln!("{name} succeeded");
                return Ok(ExitCode::SUCCESS);
            }
            s @ ("Failed" | "Stopped") => {
                outln!("{name} {}", s.to_lowercase());
                return Ok(ExitCode::from(1));
            }
            _ => {}
        }
        if start.elapsed() > WAIT_LIMIT {
            return Err(usage("gave up waiting after 24 hours"));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

pub fn list(c: &Conn, filters: &[(&str, Option<String>)], format: Format) -> CallResult<ExitCode> {
    let query: Vec<String> =
        filters.iter().filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", encode(v)))).collect();
    let (_, v) = c.call("GET", &format!("/api/v1/tasks?{}", query.join("&")), None, None)?;
    let items = v["items"].as_array().cloned().unwrap_or_default();
    match format {
        Format::Table => table(&items),
        _ => print(&v, format),
    }
    Ok(ExitCode::SUCCESS)
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub fn get(c: &Conn, id: &str, format: Format) -> CallResult<ExitCode> {
    let (_, t) = c.call("GET", &format!("/api/v1/tasks/{}", encode(id)), None, None)?;
    match format {
        Format::Table => table(&[t]),
        _ => print(&t, format),
    }
    Ok(ExitCode::SUCCESS)
}

pub fn describe(c: &Conn, id: &str, format: Format) -> CallResult<ExitCode> {
    let (_, t) = c.call("GET", &format!("/api/v1/tasks/{}", encode(id)), None, None)?;
    if format != Format::Table {
        let (_, ev) = c.call("GET", &format!("/api/v1/tasks/{}/events", encode(id)), None, None)?;
        print(&serde_json::json!({"task": t, "events": ev["items"]}), format);
        return Ok(ExitCode::SUCCESS);
    }
    outln!("Name:     {}", t["name"].as_str().unwrap_or(""));
    outln!("ID:       {}", t["id"].as_str().unwrap_or(""));
    outln!("Type:     {}", t["type"].as_str().unwrap_or(""));
    outln!("Status:   {} (attempt {})", t["status"].as_str().unwrap_or(""), t["attempt"]);
    outln!(
        "Owner:    {} / group {}",
        t["owner"].as_str().unwrap_or(""),
        t["projectGroup"].as_str().unwrap_or("")
    );
    if let Some(r) = t["queue"]["reason"].as_str() {
        outln!("Queue:    #{} ({} in its group): {r}", t["queue"]["position"], t["queue"]["positionInGroup"]);
    }
    for r in t["placement"]["replicas"].as_array().into_iter().flatten() {
        outln!(
            "Replica:  {}-{} rank {} on {}",
            r["role"].as_str().unwrap_or(""),
            r["index"],
            r["rank"],
            r["node"].as_str().unwrap_or("")
        );
    }
    outln!("Events:");
    events(c, id, format)
}

pub fn events(c: &Conn, id: &str, format: Format) -> CallResult<ExitCode> {
    let (_, ev) = c.call("GET", &format!("/api/v1/tasks/{}/events", encode(id)), None, None)?;
    if format != Format::Table {
        print(&ev, format);
        return Ok(ExitCode::SUCCESS);
    }
    for e in ev["items"].as_array().into_iter().flatten() {
        outln!(
            "  {:>5}  attempt {}  {:<16} {}",
            ago(e["atMs"].as_i64().unwrap_or(0)),
            e["attempt"],
            e["reason"].as_str().unwrap_or(""),
            e["message"].as_str().unwrap_or("")
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub fn act(c: &Conn, id: &str, verb: &str, format: Format) -> CallResult<ExitCode> {
    let path = format!("/api/v1/tasks/{}", encode(id));
    let (_, t) = match verb {
        "delete" => c.call("DELETE", &path, None, None)?,
        _ => c.call("POST", &format!("{path}/{verb}"), Some(b""), None)?,
    };
    if format != Format::Table {
        let shown = if verb == "delete" { serde_json::json!({"id": id, "deleted": true}) } else { t };
        print(&shown, format);
        return Ok(ExitCode::SUCCESS);
    }
    match verb {
        "delete" => outln!("deleted {id}"),
        _ => outln!("{} is {}", t["name"].as_str().unwrap_or(id), t["status"].as_str().unwrap_or("?")),
    }
    Ok(ExitCode::SUCCESS)
}

/// `admin catalog set -f FILE`: replace the catalog.
pub fn admin_catalog_set(c: &Conn, file: &std::path::Path) -> CallResult<ExitCode> {
    let body = std::fs::read(file).map_err(|e| usage(format!("cannot read {}: {e}", file.display())))?;
    let (_, v) = c.call("PUT", "/api/v1/admin/catalog", Some(&body), None)?;
    let count = |k: &str| v[k].as_object().map_or(0, |m| m.len());
    outln!(
        "catalog replaced: {} regions, {} clusters, {} pools, {} instance specs, {} nodes, {} project groups",
        count("regions"),
        count("clusters"),
        count("pools"),
        count("instanceSpecs"),
        count("nodes"),
        count("projectGroups")
    );
    Ok(ExitCode::SUCCESS)
}

/// `admin catalog get`: the catalog in force.
pub fn admin_catalog_get(c: &Conn, format: Format) -> CallResult<ExitCode> {
    let (_, v) = c.call("GET", "/api/v1/catalog", None, None)?;
    print(&v, if format == Format::Table { Format::Yaml } else { format });
    Ok(ExitCode::SUCCESS)
}

/// `admin user add`: create or update a user.
pub fn admin_user(c: &Conn, name: &str, role: &str, groups: &[String]) -> CallResult<ExitCode> {
    let body = serde_json::json!({"name": name, "role": role, "groups": groups}).to_string();
    c.call("POST", "/api/v1/admin/users", Some(body.as_bytes()), None)?;
    outln!("user {name}: {role}, groups {}", groups.join(", "));
    Ok(ExitCode::SUCCESS)
}

/// `admin token create USER`: a new token, printed once.
pub fn admin_token(c: &Conn, user: &str, label: &str) -> CallResult<ExitCode> {
    let body = serde_json::json!({"label": label}).to_string();
    let (_, v) =
        c.call("POST", &format!("/api/v1/users/{}/tokens", encode(user)), Some(body.as_bytes()), None)?;
    outln!("{}", v["token"].as_str().unwrap_or(""));
    eprintln!("token for {user} (shown once; store it now)");
    Ok(ExitCode::SUCCESS)
}

/// `admin user NAME --disable|--enable`.
pub fn admin_user_disabled(c: &Conn, name: &str, disabled: bool) -> CallResult<ExitCode> {
    let action = if disabled { "disable" } else { "enable" };
    c.call("POST", &format!("/api/v1/admin/users/{}/{action}", encode(name)), None, None)?;
    if disabled {
        outln!("user {name} is disabled: their tokens are refused (within seconds on every server)");
    } else {
        outln!("user {name} is enabled");
    }
    Ok(ExitCode::SUCCESS)
}

/// `admin token USER --list`: the user's tokens by id (never the tokens themselves).
pub fn admin_token_list(c: &Conn, user: &str) -> CallResult<ExitCode> {
    let (_, v) = c.call("GET", &format!("/api/v1/users/{}/tokens", encode(user)), None, None)?;
    outln!("{:<18} {:<24} CREATED (ms since 1970)", "ID", "LABEL");
    for t in v["items"].as_array().into_iter().flatten() {
        outln!(
            "{:<18} {:<24} {}",
            t["id"].as_str().unwrap_or(""),
            t["label"].as_str().unwrap_or(""),
            t["createdAtMs"]
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `admin token USER --revoke ID`.
pub fn admin_token_revoke(c: &Conn, user: &str, id: &str) -> CallResult<ExitCode> {
    c.call("DELETE", &format!("/api/v1/users/{}/tokens/{}", encode(user), encode(id)), None, None)?;
    outln!("token {id} of {user} is revoked");
    Ok(ExitCode::SUCCESS)
}

/// `admin node NAME --cordon|--uncordon`.
pub fn admin_node(c: &Conn, name: &str, body: &serde_json::Value) -> CallResult<ExitCode> {
    let body_text = body.to_string();
    c.call("PUT", &format!("/api/v1/admin/nodes/{}", encode(name)), Some(body_text.as_bytes()), None)?;
    let what = match (
        body.get("schedulable").and_then(|v| v.as_bool()),
        body.get("failed").and_then(|v| v.as_bool()),
    ) {
        (Some(true), _) => "takes new work",
        (Some(false), _) => "takes no new work (cordoned)",
        (_, Some(true)) => "is marked failed: its replicas are killed and fault tolerance takes over",
        _ => "is repaired",
    };
    outln!("node {name} {what}");
    Ok(ExitCode::SUCCESS)
}

/// `quota`: quotas and capacity, from the scheduler's own view.
pub fn quota(c: &Conn, format: Format) -> CallResult<ExitCode> {
    let (_, v) = c.call("GET", "/api/v1/quota", None, None)?;
    if format != Format::Table {
        print(&v, format);
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "{:<14} {:<9} {:<12} {:<14} {:>6} {:>9} {:>10} {:>6} {:>10}",
        "GROUP",
        "TYPE",
        "POOL",
        "SPEC",
        "QUOTA",
        "REMAINING",
        "AVAILABLE",
        "IDLE",
        "UNRESERVED"
    );
    for q in v["items"].as_array().into_iter().flatten() {
        outln!(
            "{:<14} {:<9} {:<12} {:<14} {:>6} {:>9} {:>10} {:>6} {:>10}",
            q["group"].as_str().unwrap_or(""),
            q["resourceType"].as_str().unwrap_or(""),
            q["pool"].as_str().unwrap_or(""),
            q["spec"].as_str().unwrap_or(""),
            q["limit"],
            q["remaining"],
            q["poolAvailable"],
            q["idle"],
            q["unreserved"]
        );
    }
    Ok(ExitCode::SUCCESS)
}
