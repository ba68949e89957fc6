//! `trainyard workdir`: the working directories a member's groups hold, and fetching one into a directory
//! (what a Kubernetes replica's init container runs, with its attempt's token, before the task's command).

use crate::client::{Format, outln, print};
use crate::conn::{CallResult, Conn, encode, usage};
use serde_json::Value;
use std::path::Path;
use std::process::ExitCode;
use trainyard_workdir::manifest::{Manifest, human};

pub fn list(c: &Conn, group: Option<&str>, format: Format) -> CallResult<ExitCode> {
    let path = match group {
        Some(g) => format!("/api/v1/workdirs?projectGroup={}", encode(g)),
        None => "/api/v1/workdirs".to_owned(),
    };
    let (_, v) = c.call("GET", &path, None, None)?;
    if format != Format::Table {
        print(&v, format);
        return Ok(ExitCode::SUCCESS);
    }
    let when = |ms: &Value| trainyard_runtime::clock::rfc3339_ms(ms.as_u64().unwrap_or(0));
    let rows: Vec<Vec<String>> = v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            vec![
                w["id"].as_str().unwrap_or("").to_owned(),
                w["projectGroup"].as_str().unwrap_or("").to_owned(),
                w["files"].to_string(),
                human(w["bytes"].as_u64().unwrap_or(0)),
                when(&w["lastUsedMs"]),
            ]
        })
        .collect();
    for l in crate::table::render(&["ID", "GROUP", "FILES", "SIZE", "LAST USED"], &rows, &[2, 3]) {
        outln!("{l}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Makes working directory `id` of `group` in `into`: its manifest, then its files as one tar stream, each
/// checked against its digest and the manifest's rules before the tree is made (see
/// `trainyard_workdir::store::unpack`).
pub fn fetch(c: &Conn, id: &str, group: &str, into: &Path) -> CallResult<ExitCode> {
    if !trainyard_workdir::manifest::is_id(id) {
        return Err(usage(format!("{id:?} is not a working directory's id (64 hex digits)")));
    }
    if std::fs::read_dir(into).is_ok_and(|mut d| d.next().is_some()) {
        return Err(usage(format!("--into {}: not empty (a fetch makes the whole tree)", into.display())));
    }
    let t0 = std::time::Instant::now();
    let query = format!("projectGroup={}", encode(group));
    let (_, v) = c.call("GET", &format!("/api/v1/workdirs/{id}?{query}"), None, None)?;
    let manifest: Manifest = serde_json::from_value(v["manifest"].clone())
        .map_err(|e| usage(format!("the server's answer has no manifest this client reads: {e}")))?;
    let files = c.download(&format!("/api/v1/workdirs/{id}/files?{query}"))?;
    let (entries, n) = (manifest.entries.len(), manifest.blobs().len());
    let bytes = trainyard_workdir::store::unpack(manifest, id, files, into)
        .map_err(|e| usage(format!("working directory {id}: {e}")))?;
    eprintln!(
        "trainyard: working directory {} made at {}: {entries} entries, {n} distinct files, {} in {:.1} s",
        &id[..12],
        into.display(),
        human(bytes),
        t0.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}
