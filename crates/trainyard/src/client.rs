//! The CLI verbs that talk to a Trainyard server over its HTTP API, kubectl-style (the connection, failures
//! and exit statuses are `conn`'s).

pub use crate::conn::*;
use crate::table::ListFormat;
use serde_json::Value;
use std::process::ExitCode;
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

/// Most bytes of files one upload request carries (a larger file goes alone).
const WORKDIR_BATCH_BYTES: u64 = 32 << 20;

/// Uploads `dir` as a working directory of `group`: its manifest checked first (every problem at once,
/// nothing sent), then only the files the server lacks, then the manifest kept. Says what it sent on
/// standard error; answers the working directory's id.
pub fn upload_workdir(c: &Conn, dir: &std::path::Path, group: &str) -> CallResult<String> {
    use trainyard_workdir::manifest::human;
    let packed = trainyard_workdir::pack::pack(dir, u64::MAX).map_err(|problems| {
        usage(format!(
            "--workdir {}: nothing was sent, {} to mend first:\n  {}",
            dir.display(),
            if problems.len() == 1 { "one thing".to_owned() } else { format!("{} things", problems.len()) },
            problems.join("\n  ")
        ))
    })?;
    let body = serde_json::to_vec(&serde_json::json!({"projectGroup": group, "manifest": packed.manifest}))
        .map_err(|e| usage(e.to_string()))?;
    let (_, check) = c.call("POST", "/api/v1/workdirs/check", Some(&body), None)?;
    let missing: Vec<String> = check["missing"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d.as_str().map(str::to_owned))
        .collect();
    let (mut files, mut bytes) = (0u64, 0u64);
    let path = format!("/api/v1/workdirs/blobs?projectGroup={}", encode(group));
    for batch in trainyard_workdir::pack::batches(&packed, &missing, WORKDIR_BATCH_BYTES) {
        let (tar, n) = batch.map_err(|e| usage(format!("--workdir {}: {e}", dir.display())))?;
        let (_, v) = c.call("POST", &path, Some(&tar), None).map_err(|mut f| {
            if f.message.contains("SHA-256 is another") {
                f.message =
                    format!("--workdir {}: a file changed while it was sent; submit again", dir.display());
            }
            f
        })?;
        files += n as u64;
        bytes += v["bytes"].as_u64().unwrap_or(0);
    }
    // A check that found every file kept it already.
    let info = match &check["workdir"] {
        Value::Object(_) if missing.is_empty() => check["workdir"].clone(),
        _ => c.call("POST", "/api/v1/workdirs", Some(&body), None)?.1,
    };
    let id = info["id"].as_str().unwrap_or_default().to_owned();
    let distinct = packed.sources.len() as u64;
    let had = distinct.saturating_sub(files);
    eprintln!(
        "trainyard: working directory {}: {} entries, {}; sent {files} file{} ({}){}",
        dir.display(),
        packed.manifest.entries.len(),
        human(packed.manifest.bytes()),
        if files == 1 { "" } else { "s" },
        human(bytes),
        if had > 0 { format!(", the server had the other {had}") } else { String::new() },
    );
    Ok(id)
}

/// The task document `body` (JSON) with `spec.environment.workdir` set to `dir` uploaded for its group.
fn with_workdir(c: &Conn, body: &[u8], dir: &std::path::Path) -> CallResult<Vec<u8>> {
    let mut doc: Value = serde_json::from_slice(body)
        .map_err(|e| usage(format!("--workdir needs a task file that parses (it names the group): {e}")))?;
    let group = doc["metadata"]["projectGroup"].as_str().map(str::to_owned).ok_or_else(|| {
        usage("--workdir: the task file names no metadata.projectGroup, whose working directories it would join")
    })?;
    let id = upload_workdir(c, dir, &group)?;
    match doc.pointer_mut("/spec/environment").and_then(Value::as_object_mut) {
        Some(env) => {
            env.insert("workdir".into(), Value::String(id));
        }
        None => return Err(usage("--workdir: the task file has no spec.environment")),
    }
    serde_json::to_vec(&doc).map_err(|e| usage(e.to_string()))
}

pub fn submit(
    c: &Conn,
    file: &std::path::Path,
    workdir: Option<&std::path::Path>,
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
    // YAML goes as the JSON the server would read it into: parsing YAML costs the server ten times as much
    // (a document it should see as written, a broken one say, goes as it is, for the server's problems).
    let body = trainyard_core::parse::yaml_as_json(&body).unwrap_or(body);
    let body = match workdir {
        Some(dir) => with_workdir(c, &body, dir)?,
        None => body,
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
    crate::wait::wait(c, &id, &name, crate::wait::Goal::Ended, 0, format)
}

/// `list`: the tasks the filters select, once or (`watch`) again whenever they change.
pub fn list(
    c: &Conn,
    filters: &[(&str, Option<String>)],
    format: ListFormat,
    watch: bool,
) -> CallResult<ExitCode> {
    let query: Vec<String> =
        filters.iter().filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", encode(v)))).collect();
    let path = format!("/api/v1/tasks?{}", query.join("&"));
    let fetch = || c.call("GET", &path, None, None).map(|(_, v)| v);
    let lines = |v: &Value| -> CallResult<Vec<String>> {
        let items = v["items"].as_array().cloned().unwrap_or_default();
        let wide = match format {
            ListFormat::Wide => Some(crate::table::wide(c, &items)?),
            _ => None,
        };
        Ok(crate::table::tasks(&items, wide.as_deref()))
    };
    if watch {
        return crate::watch::watch(fetch, |_| false, format, lines);
    }
    show(&fetch()?, format, lines)
}

/// `delete` without a task: every task the caller may operate that matches the filters, a page at a time
/// until none is left (or a page deleted nothing: what failed is said, and the exit status is 4).
pub fn delete_matching(c: &Conn, filters: &[(&str, Option<String>)], format: Format) -> CallResult<ExitCode> {
    let query: Vec<String> =
        filters.iter().filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", encode(v)))).collect();
    if query.is_empty() {
        return Err(usage(
            "say which task to delete, or which tasks with at least one of --status, --type, --group, --owner, -l \
             and -q",
        ));
    }
    let path = format!("/api/v1/tasks?{}", query.join("&"));
    let mut ids = Vec::new();
    let failed = loop {
        let (_, v) = c.call("DELETE", &path, None, None)?;
        let deleted = v["ids"].as_array().cloned().unwrap_or_default();
        ids.extend(deleted.iter().filter_map(|i| i.as_str().map(str::to_owned)));
        if !v["more"].as_bool().unwrap_or(false) || deleted.is_empty() {
            break v["failed"].as_array().cloned().unwrap_or_default();
        }
    };
    match format {
        Format::Table => {
            outln!("deleted {} task{}", ids.len(), if ids.len() == 1 { "" } else { "s" });
            for f in &failed {
                eprintln!(
                    "trainyard: not deleted: {}: {}",
                    f["id"].as_str().unwrap_or(""),
                    f["detail"].as_str().unwrap_or("")
                );
            }
        }
        _ => print(&serde_json::json!({"deleted": ids.len(), "ids": ids, "failed": failed}), format),
    }
    if failed.is_empty() { Ok(ExitCode::SUCCESS) } else { Ok(ExitCode::from(EXIT_REFUSED)) }
}

/// A document as `format` says: the table's lines, or the answer as JSON or YAML.
fn show(
    v: &Value,
    format: ListFormat,
    lines: impl Fn(&Value) -> CallResult<Vec<String>>,
) -> CallResult<ExitCode> {
    match format {
        ListFormat::Table | ListFormat::Wide => {
            for l in lines(v)? {
                outln!("{l}");
            }
        }
        ListFormat::Json => print(v, Format::Json),
        ListFormat::Yaml => print(v, Format::Yaml),
    }
    Ok(ExitCode::SUCCESS)
}

/// `get`: one task, once or (`watch`) again whenever it changes, until it ends.
pub fn get(c: &Conn, id: &str, format: ListFormat, watch: bool) -> CallResult<ExitCode> {
    let path = format!("/api/v1/tasks/{}", encode(id));
    let fetch = || c.call("GET", &path, None, None).map(|(_, v)| v);
    let lines = |t: &Value| -> CallResult<Vec<String>> {
        let items = std::slice::from_ref(t);
        let wide = match format {
            ListFormat::Wide => Some(crate::table::wide(c, items)?),
            _ => None,
        };
        Ok(crate::table::tasks(items, wide.as_deref()))
    };
    if watch {
        let ended = |t: &Value| matches!(t["status"].as_str(), Some("Succeeded" | "Failed" | "Stopped"));
        return crate::watch::watch(fetch, ended, format, lines);
    }
    show(&fetch()?, format, lines)
}

/// Events that end an attempt.
const ATTEMPT_ENDS: &[&str] = &[
    "Completed",
    "UserError",
    "OutOfMemory",
    "NodeFailed",
    "Preempted",
    "Terminated",
    "StartTimedOut",
    "Disrupted",
    "LaunchFailed",
    "PrecheckFailed",
    "ImagePullFailed",
];

pub fn describe(c: &Conn, id: &str, format: Format) -> CallResult<ExitCode> {
    use crate::table::{duration, utc};
    let (_, t) = c.call("GET", &format!("/api/v1/tasks/{}", encode(id)), None, None)?;
    let (_, ev) = c.call("GET", &format!("/api/v1/tasks/{}/events", encode(id)), None, None)?;
    if format != Format::Table {
        print(&serde_json::json!({"task": t, "events": ev["items"]}), format);
        return Ok(ExitCode::SUCCESS);
    }
    let events: Vec<&Value> = ev["items"].as_array().into_iter().flatten().collect();
    let spec = &t["spec"]["spec"];
    outln!("Name:       {}", t["name"].as_str().unwrap_or(""));
    outln!("ID:         {}", t["id"].as_str().unwrap_or(""));
    outln!("Type:       {}", t["type"].as_str().unwrap_or(""));
    outln!(
        "Status:     {} since {} (attempt {})",
        t["status"].as_str().unwrap_or(""),
        utc(t["statusSinceMs"].as_i64().unwrap_or(0)),
        t["attempt"]
    );
    outln!(
        "Owner:      {} / group {}",
        t["owner"].as_str().unwrap_or(""),
        t["projectGroup"].as_str().unwrap_or("")
    );
    outln!("Submitted:  {}", utc(t["createdAtMs"].as_i64().unwrap_or(0)));
    let env = &spec["environment"];
    // The image, and the digest it ran as where a pull said it.
    let digest = events
        .iter()
        .filter(|e| e["reason"] == "ImagePulled")
        .filter_map(|e| e["message"].as_str())
        .find_map(|m| m.split_whitespace().find(|w| w.starts_with("sha256:")))
        .map(|d| format!(" ({})", d.trim_end_matches([',', ';', ')', '.'])))
        .unwrap_or_default();
    outln!("Image:      {}{digest}", env["image"].as_str().unwrap_or(""));
    let cmd = env["cmd"].as_str().unwrap_or("").trim();
    let mut lines = cmd.lines();
    outln!("Command:    {}", lines.next().unwrap_or(""));
    for l in lines {
        outln!("            {l}");
    }
    if let Some(w) = env["workdir"].as_str() {
        let group = t["projectGroup"].as_str().unwrap_or("");
        let listed = c.call("GET", &format!("/api/v1/workdirs?projectGroup={}", encode(group)), None, None);
        let what = listed
            .ok()
            .and_then(|(_, v)| v["items"].as_array()?.iter().find(|i| i["id"] == w).cloned())
            .map(|i| {
                format!(
                    " ({} files, {})",
                    i["files"],
                    trainyard_workdir::manifest::human(i["bytes"].as_u64().unwrap_or(0))
                )
            })
            .unwrap_or_default();
        outln!("Workdir:    {}{what}, at /workspace", &w[..w.len().min(12)]);
    }
    if let Some(r) = t["queue"]["reason"].as_str() {
        outln!(
            "Queue:      #{} ({} in its group): {r}",
            t["queue"]["position"],
            t["queue"]["positionInGroup"]
        );
        // What holds the room it waits for (no task has a time limit, so when it frees is not known).
        for h in t["queue"]["holders"].as_array().into_iter().flatten() {
            let started = h["runningSinceMs"].as_i64().unwrap_or(0);
            outln!(
                "Held by:    {} ({}, group {}): {} units of {}, running {}{}{}",
                h["name"].as_str().unwrap_or(""),
                h["owner"].as_str().unwrap_or(""),
                h["projectGroup"].as_str().unwrap_or(""),
                h["units"],
                h["spec"].as_str().unwrap_or(""),
                crate::table::duration(crate::table::now_ms() - started),
                if h["spendsItsQuota"] == true { ", on the same quota" } else { "" },
                if h["stopping"] == true { ", stopping" } else { "" },
            );
        }
        if let Some(n) = t["queue"]["moreHolders"].as_u64().filter(|n| *n > 0) {
            outln!("Held by:    {n} more running tasks (you may not see them, or past the first few)");
        }
    }
    if let Some(r) = t["starting"]["reason"].as_str() {
        outln!("Waiting:    {r}");
    }
    for r in t["placement"]["replicas"].as_array().into_iter().flatten() {
        outln!(
            "Replica:    {}-{} rank {} on {}",
            r["role"].as_str().unwrap_or(""),
            r["index"],
            r["rank"],
            r["node"].as_str().unwrap_or("")
        );
    }
    // Each attempt: when it was admitted, started and ended, and how.
    let last = t["attempt"].as_i64().unwrap_or(0);
    for a in 0..=last {
        let of: Vec<&&Value> = events.iter().filter(|e| e["attempt"].as_i64() == Some(a)).collect();
        let at = |reasons: &[&str]| of.iter().find(|e| reasons.contains(&e["reason"].as_str().unwrap_or("")));
        let ms = |e: Option<&&&Value>| e.and_then(|e| e["atMs"].as_i64());
        let (admitted, started, ended) =
            (ms(at(&["Admitted"])), ms(at(&["Started"])), at(ATTEMPT_ENDS).map(|e| (***e).clone()));
        let mut line = format!("Attempt {a}:");
        if let Some(m) = admitted {
            line.push_str(&format!(" admitted {}", utc(m)));
        }
        if let Some(m) = started {
            line.push_str(&format!(", started {}", utc(m)));
            if let Some(adm) = admitted {
                line.push_str(&format!(" ({} after)", duration(m - adm)));
            }
        }
        if let Some(e) = &ended {
            let end = e["atMs"].as_i64().unwrap_or(0);
            line.push_str(&format!(", ended {} {}", utc(end), e["reason"].as_str().unwrap_or("")));
            if let Some(s) = started {
                line.push_str(&format!(" (ran {})", duration(end - s)));
            }
        }
        if admitted.is_none() && started.is_none() && ended.is_none() {
            line.push_str(" not admitted yet");
        }
        outln!("{line}");
        if let Some(e) = ended.filter(|e| e["reason"] != "Completed") {
            let message = e["message"].as_str().unwrap_or("");
            outln!("  Failure:  {}: {message}", e["reason"].as_str().unwrap_or(""));
        }
        let codes: Vec<String> = of
            .iter()
            .filter_map(|e| {
                let m = e["message"].as_str()?;
                let code = trainyard_core::failure::exit_code_in(m)?;
                Some(format!("{} {code}", m.split_whitespace().next().unwrap_or("")))
            })
            .collect();
        if !codes.is_empty() {
            outln!("  Exit:     {}", codes.join(", "));
        }
    }
    outln!("Events:");
    events_table(&events);
    Ok(ExitCode::SUCCESS)
}

fn events_table(items: &[&Value]) {
    for e in items {
        outln!(
            "  {:>5}  attempt {}  {:<16} {}",
            crate::table::ago(e["atMs"].as_i64().unwrap_or(0)),
            e["attempt"],
            e["reason"].as_str().unwrap_or(""),
            e["message"].as_str().unwrap_or("")
        );
    }
}

pub fn events(c: &Conn, id: &str, format: Format) -> CallResult<ExitCode> {
    let (_, ev) = c.call("GET", &format!("/api/v1/tasks/{}/events", encode(id)), None, None)?;
    if format != Format::Table {
        print(&ev, format);
        return Ok(ExitCode::SUCCESS);
    }
    events_table(&ev["items"].as_array().into_iter().flatten().collect::<Vec<_>>());
    Ok(ExitCode::SUCCESS)
}

/// `stop`, `delete` or `resubmit` on task `id`; with `wait` (stop and resubmit), followed until the task is
/// stopped, or runs again, or ends.
pub fn act(c: &Conn, id: &str, verb: &str, wait: bool, format: Format) -> CallResult<ExitCode> {
    let path = format!("/api/v1/tasks/{}", encode(id));
    let after = if wait { crate::wait::last_event(c, id)? } else { 0 };
    let (_, t) = match verb {
        "delete" => c.call("DELETE", &path, None, None)?,
        _ => c.call("POST", &format!("{path}/{verb}"), Some(b""), None)?,
    };
    let name = t["name"].as_str().unwrap_or(id).to_owned();
    if format != Format::Table {
        let shown = if verb == "delete" { serde_json::json!({"id": id, "deleted": true}) } else { t };
        print(&shown, format);
    } else {
        match verb {
            "delete" => outln!("deleted {id}"),
            _ => outln!("{name} is {}", t["status"].as_str().unwrap_or("?")),
        }
    }
    if !wait {
        return Ok(ExitCode::SUCCESS);
    }
    let goal = if verb == "stop" { crate::wait::Goal::Stopped } else { crate::wait::Goal::Running };
    crate::wait::wait(c, id, &name, goal, after, format)
}

/// `clone`: a new task from task `id`'s spec, queued under a new name (into `group` when given; hidden
/// variables take the `hidden` values, as a copy never carries them); with `wait`, followed to its end.
pub fn clone(
    c: &Conn,
    id: &str,
    to: CloneTo<'_>,
    hidden: &[(String, String)],
    wait: bool,
    format: Format,
) -> CallResult<ExitCode> {
    let mut body = serde_json::Map::new();
    if let Some(g) = to.group {
        body.insert("projectGroup".into(), g.into());
    }
    if let Some(p) = to.name_prefix {
        body.insert("namePrefix".into(), p.into());
    }
    if !hidden.is_empty() {
        let values: serde_json::Map<String, Value> =
            hidden.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
        body.insert("hiddenValues".into(), Value::Object(values));
    }
    let body = Value::Object(body).to_string();
    let (_, t) =
        c.call("POST", &format!("/api/v1/tasks/{}/clone", encode(id)), Some(body.as_bytes()), None)?;
    let name = t["name"].as_str().unwrap_or("").to_owned();
    let new_id = t["id"].as_str().unwrap_or("").to_owned();
    if format == Format::Table {
        outln!("created {name} (id {new_id}), a copy of {id}");
    } else {
        print(&t, format);
    }
    if !wait {
        return Ok(ExitCode::SUCCESS);
    }
    crate::wait::wait(c, &new_id, &name, crate::wait::Goal::Ended, 0, format)
}

/// Where a copy goes and what it is called (each: the original's when not given).
#[derive(Debug, Clone, Copy)]
pub struct CloneTo<'a> {
    pub group: Option<&'a str>,
    pub name_prefix: Option<&'a str>,
}

/// `share --list`: whom task `id` is shared with.
pub fn shares(c: &Conn, id: &str, format: Format) -> CallResult<ExitCode> {
    let (_, v) = c.call("GET", &format!("/api/v1/tasks/{}/shares", encode(id)), None, None)?;
    if format != Format::Table {
        print(&v, format);
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let may = if s["operate"].as_bool() == Some(true) { "see and operate" } else { "see" };
            vec![s["user"].as_str().unwrap_or("").to_owned(), may.to_owned()]
        })
        .collect();
    if rows.is_empty() {
        outln!("not shared with anyone");
        return Ok(ExitCode::SUCCESS);
    }
    for l in crate::table::render(&["USER", "MAY"], &rows, &[]) {
        outln!("{l}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `share --revoke USER`: take the share of `user` back.
pub fn unshare(c: &Conn, task: &str, id: &str, user: &str) -> CallResult<ExitCode> {
    c.call("DELETE", &format!("/api/v1/tasks/{}/shares/{}", encode(id), encode(user)), None, None)?;
    outln!("{task} is no longer shared with {user}");
    Ok(ExitCode::SUCCESS)
}

/// `share`: let `user` see task `id` (and, with `operate`, stop, resubmit, clone and delete it).
pub fn share(c: &Conn, task: &str, id: &str, user: &str, operate: bool) -> CallResult<ExitCode> {
    let body = serde_json::json!({"user": user, "operate": operate}).to_string();
    c.call("POST", &format!("/api/v1/tasks/{}/shares", encode(id)), Some(body.as_bytes()), None)?;
    let what = if operate { "see and operate" } else { "see" };
    outln!("{user} may now {what} {task}");
    Ok(ExitCode::SUCCESS)
}

/// `admin catalog set -f FILE`: replace the catalog.
pub fn admin_catalog_set(c: &Conn, file: &std::path::Path, force: bool) -> CallResult<ExitCode> {
    let body = std::fs::read(file).map_err(|e| usage(format!("cannot read {}: {e}", file.display())))?;
    let path = if force { "/api/v1/admin/catalog?force=true" } else { "/api/v1/admin/catalog" };
    let (_, v) = c.call("PUT", path, Some(&body), None)?;
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

/// `admin registry login HOST -u USER --password-stdin [--group G]...`: the password is standard input's first
/// line (a trailing newline is not part of it, as `docker login --password-stdin` reads it).
pub fn admin_registry_login(c: &Conn, host: &str, username: &str, groups: &[String]) -> CallResult<ExitCode> {
    use std::io::Read;
    let mut input = String::new();
    std::io::stdin()
        .take(64 << 10)
        .read_to_string(&mut input)
        .map_err(|e| usage(format!("cannot read the password from standard input: {e}")))?;
    let password = input.strip_suffix('\n').map(|p| p.strip_suffix('\r').unwrap_or(p)).unwrap_or(&input);
    if password.is_empty() {
        return Err(usage(
            "no password on standard input (echo \"$PASSWORD\" | trainyard admin registry login ...)",
        ));
    }
    let body =
        serde_json::json!({"username": username, "password": password, "projectGroups": groups}).to_string();
    c.call("PUT", &format!("/api/v1/admin/registries/{}/login", encode(host)), Some(body.as_bytes()), None)?;
    let serves = if groups.is_empty() {
        "the catalog's image presets of this registry".to_owned()
    } else {
        format!(
            "the catalog's image presets of this registry and any of its images for {}",
            groups.join(", ")
        )
    };
    outln!("login for {host} set (user {username}); it serves {serves}");
    Ok(ExitCode::SUCCESS)
}

/// `admin registry logout HOST`.
pub fn admin_registry_logout(c: &Conn, host: &str) -> CallResult<ExitCode> {
    c.call("DELETE", &format!("/api/v1/admin/registries/{}/login", encode(host)), None, None)?;
    outln!("login for {host} removed");
    Ok(ExitCode::SUCCESS)
}

/// `admin registry list`: the registries with a login, never a password.
pub fn admin_registry_list(c: &Conn, format: Format) -> CallResult<ExitCode> {
    let (_, v) = c.call("GET", "/api/v1/admin/registries", None, None)?;
    if format != Format::Table {
        print(&v, format);
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let groups: Vec<&str> =
                r["projectGroups"].as_array().into_iter().flatten().filter_map(|g| g.as_str()).collect();
            vec![
                r["host"].as_str().unwrap_or("").to_owned(),
                r["username"].as_str().unwrap_or("").to_owned(),
                if groups.is_empty() { "(presets only)".to_owned() } else { groups.join(",") },
                r["updatedAtMs"].as_i64().map_or_else(String::new, crate::table::ago),
            ]
        })
        .collect();
    for l in crate::table::render(&["REGISTRY", "USER", "GROUPS", "UPDATED"], &rows, &[]) {
        outln!("{l}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `admin server`: who leads the servers on this store, and every server seen lately.
pub fn admin_server(c: &Conn, format: Format) -> CallResult<ExitCode> {
    let (_, v) = c.call("GET", "/api/v1/server", None, None)?;
    if format != Format::Table {
        print(&v, format);
        return Ok(ExitCode::SUCCESS);
    }
    let leader = &v["leader"];
    match (v["elected"].as_bool(), leader["server"].as_str()) {
        (Some(false), _) => outln!("alone on its store (SQLite): this server leads, without a lease"),
        (_, Some(server)) if leader["live"] == true => outln!(
            "leader: {server}, fencing token {}, since {}",
            leader["fencingToken"],
            leader["sinceMs"].as_i64().map_or_else(String::new, crate::table::ago)
        ),
        (_, Some(server)) => outln!(
            "leader: none now ({server}'s lease, token {}, ran out {}; the next server to try takes it)",
            leader["fencingToken"],
            leader["expiresAtMs"].as_i64().map_or_else(String::new, crate::table::ago)
        ),
        _ => outln!("leader: none yet"),
    }
    let this = v["thisServer"].as_str().unwrap_or("");
    let rows: Vec<Vec<String>> = v["servers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let id = s["id"].as_str().unwrap_or("");
            vec![
                if id == this { format!("{id} (answered)") } else { id.to_owned() },
                if s["leading"] == true { "leader".to_owned() } else { "follower".to_owned() },
                s["address"].as_str().unwrap_or("").to_owned(),
                s["backend"].as_str().unwrap_or("").to_owned(),
                s["version"].as_str().unwrap_or("").to_owned(),
                s["startedAtMs"].as_i64().map_or_else(String::new, crate::table::ago),
                s["seenAtMs"].as_i64().map_or_else(String::new, crate::table::ago),
            ]
        })
        .collect();
    for l in crate::table::render(
        &["SERVER", "ROLE", "ADDRESS", "BACKEND", "VERSION", "STARTED", "SEEN"],
        &rows,
        &[],
    ) {
        outln!("{l}");
    }
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

/// `admin user NAME --disable|--delete [--queued hold|stop|keep] [--running stop|keep]`: `action` is
/// `disable` or `delete`; what becomes of their work is the API's default (hold queued, stop running) unless
/// chosen.
pub fn admin_user_off(
    c: &Conn,
    name: &str,
    action: &str,
    queued: Option<&str>,
    running: Option<&str>,
) -> CallResult<ExitCode> {
    let (queued, running) = (queued.unwrap_or("hold"), running.unwrap_or("stop"));
    let body = serde_json::json!({"queued": queued, "running": running}).to_string();
    c.call("POST", &format!("/api/v1/admin/users/{}/{action}", encode(name)), Some(body.as_bytes()), None)?;
    let tokens = match action {
        "delete" => "deleted: their tokens are gone and the name is retired; their tasks stay for the record",
        _ => "disabled: their tokens are refused (within seconds on every server)",
    };
    let queued = match queued {
        "hold" => "their queued tasks held",
        "stop" => "their queued tasks stopped",
        _ => "their queued tasks left queued",
    };
    let running = match running {
        "stop" => "their running ones stopped (after the exit checkpoint notice)",
        _ => "their running ones left running",
    };
    outln!("user {name} is {tokens}; {queued}, {running}");
    Ok(ExitCode::SUCCESS)
}

/// `admin user NAME --enable`.
pub fn admin_user_enable(c: &Conn, name: &str) -> CallResult<ExitCode> {
    c.call("POST", &format!("/api/v1/admin/users/{}/enable", encode(name)), None, None)?;
    outln!("user {name} is enabled: their held tasks are released");
    Ok(ExitCode::SUCCESS)
}

/// `admin token USER --list`: the user's tokens by id (never the tokens themselves), when each was made and
/// last used, and which one this call came with.
pub fn admin_token_list(c: &Conn, user: &str) -> CallResult<ExitCode> {
    let (_, v) = c.call("GET", &format!("/api/v1/users/{}/tokens", encode(user)), None, None)?;
    let rows: Vec<Vec<String>> = v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            let at = |k: &str| t[k].as_i64().map_or_else(|| "never".to_owned(), crate::table::ago);
            vec![
                t["id"].as_str().unwrap_or("").to_owned(),
                t["label"].as_str().unwrap_or("").to_owned(),
                at("createdAtMs"),
                at("lastUsedAtMs"),
                if t["current"].as_bool() == Some(true) { "this one".into() } else { String::new() },
            ]
        })
        .collect();
    for l in crate::table::render(&["ID", "LABEL", "CREATED", "LAST USED", ""], &rows, &[]) {
        outln!("{l}");
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
    let cell = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    };
    let rows: Vec<Vec<String>> = v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|q| {
            [
                "group",
                "resourceType",
                "pool",
                "spec",
                "limit",
                "remaining",
                "poolAvailable",
                "idle",
                "unreserved",
            ]
            .iter()
            .map(|k| cell(&q[*k]))
            .collect()
        })
        .collect();
    let header = ["GROUP", "TYPE", "POOL", "SPEC", "QUOTA", "REMAINING", "AVAILABLE", "IDLE", "UNRESERVED"];
    for l in crate::table::render(&header, &rows, &[4, 5, 6, 7, 8]) {
        outln!("{l}");
    }
    Ok(ExitCode::SUCCESS)
}
