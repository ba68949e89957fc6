//! Tables as the CLI prints them: columns as wide as their widest cell, and the task table of `list` and
//! `get` (`-o wide` adds the group's resource type, replicas, GPUs, nodes and how long it ran).

use crate::conn::{CallResult, Conn};
use serde_json::Value;

/// How `list` and `get` print tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ListFormat {
    /// One line per task: name, type, status, group, age, queue.
    Table,
    /// The table with the resource type, replicas, GPUs, nodes and run time too.
    Wide,
    /// The API's answer, as JSON.
    Json,
    /// The API's answer, as YAML.
    Yaml,
}

/// Rows under a header, each column as wide as its widest cell; the columns in `right` (figures) are aligned
/// to the right. Lines carry no trailing spaces.
pub fn render(header: &[&str], rows: &[Vec<String>], right: &[usize]) -> Vec<String> {
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.zip(&width).enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            let pad = " ".repeat(w.saturating_sub(cell.chars().count()));
            if right.contains(&i) {
                s.push_str(&pad);
                s.push_str(cell);
            } else {
                s.push_str(cell);
                s.push_str(&pad);
            }
        }
        s.trim_end().to_owned()
    };
    std::iter::once(line(&mut header.iter().copied()))
        .chain(rows.iter().map(|r| line(&mut r.iter().map(String::as_str))))
        .collect()
}

/// Now, in ms since 1970.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// How long ago `ms` was, in its largest unit (`5s`, `3m`, `2h`, `4d`).
pub fn ago(ms: i64) -> String {
    let s = (now_ms() - ms).max(0) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// `ms` since 1970 as UTC, to the second (`2026-12-06 12:46:36Z`).
pub fn utc(ms: i64) -> String {
    let stamp = trainyard_runtime::clock::rfc3339_ms(u64::try_from(ms).unwrap_or(0));
    format!("{} {}Z", &stamp[..10], &stamp[11..19])
}

/// A duration in two units at most (`42s`, `3m05s`, `2h07m`, `3d04h`).
pub fn duration(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// What `-o wide` shows of a task beyond the table: from its spec, its placement and its events.
#[derive(Debug, Clone, Default)]
pub struct Wide {
    pub resource_type: String,
    pub replicas: String,
    pub gpus: String,
    pub nodes: String,
    pub duration: String,
}

const ENDED: [&str; 3] = ["Succeeded", "Failed", "Stopped"];

/// The wide columns of each task in `items` (task views; those from a list have no spec, so each is asked
/// for, a few at a time, with the events of those that started).
pub fn wide(c: &Conn, items: &[Value]) -> CallResult<Vec<Wide>> {
    // The catalog gives the GPUs of a task that is not placed (yet); without it they are left blank.
    let catalog =
        crate::conn::server_catalog(c).and_then(|text| trainyard_core::Catalog::from_yaml(&text).ok());
    let mut out = Vec::with_capacity(items.len());
    for chunk in items.chunks(8) {
        let answers: Vec<CallResult<Wide>> = std::thread::scope(|scope| {
            let handles: Vec<_> =
                chunk.iter().map(|t| scope.spawn(|| wide_one(c, t, catalog.as_ref()))).collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(crate::conn::Failure {
                            message: "a worker failed".into(),
                            code: crate::conn::EXIT_SERVER,
                        })
                    })
                })
                .collect()
        });
        for a in answers {
            out.push(a?);
        }
    }
    Ok(out)
}

fn wide_one(c: &Conn, t: &Value, catalog: Option<&trainyard_core::Catalog>) -> CallResult<Wide> {
    let id = t["id"].as_str().unwrap_or("");
    let fetched;
    let t = if t["spec"].is_null() {
        fetched = c.call("GET", &format!("/api/v1/tasks/{id}"), None, None)?.1;
        &fetched
    } else {
        t
    };
    let status = t["status"].as_str().unwrap_or("");
    let compute = &t["spec"]["spec"]["compute"];
    let placed: Vec<&Value> = t["placement"]["replicas"].as_array().into_iter().flatten().collect();
    let replicas = if placed.is_empty() {
        compute["workers"].as_u64().map_or(String::new(), |w| (w + 1).to_string())
    } else {
        placed.len().to_string()
    };
    let gpus = if placed.is_empty() {
        // What the first instance-spec option would take.
        let spec = serde_json::to_vec(&t["spec"]).unwrap_or_default();
        match (catalog, trainyard_core::parse(&spec).0) {
            (Some(cat), Some(task)) => {
                trainyard_core::demand::demand(&task.spec, 0, &|s| cat.instance_specs.get(s))
                    .map_or(String::new(), |d| d.total.gpus.to_string())
            }
            _ => String::new(),
        }
    } else {
        placed.iter().map(|r| r["resources"]["gpus"].as_u64().unwrap_or(0)).sum::<u64>().to_string()
    };
    let mut nodes: Vec<&str> = placed.iter().filter_map(|r| r["node"].as_str()).collect();
    nodes.sort_unstable();
    nodes.dedup();
    // Run time: from the current attempt's start, until now or until it ended.
    let mut duration = String::new();
    if status != "Queued" {
        let (_, ev) = c.call("GET", &format!("/api/v1/tasks/{id}/events"), None, None)?;
        let started = ev["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["reason"] == "Started" && e["attempt"] == t["attempt"])
            .filter_map(|e| e["atMs"].as_i64())
            .next_back();
        if let Some(from) = started {
            let until =
                if ENDED.contains(&status) { t["updatedAtMs"].as_i64().unwrap_or(from) } else { now_ms() };
            duration = duration_text(until - from, ENDED.contains(&status));
        }
    }
    Ok(Wide {
        resource_type: compute["resourceType"].as_str().unwrap_or("").to_owned(),
        replicas,
        gpus,
        nodes: nodes.join(","),
        duration,
    })
}

fn duration_text(ms: i64, ended: bool) -> String {
    if ended { format!("ran {}", duration(ms)) } else { duration(ms) }
}

/// The task table: name, type, status, group, age and where it waits; with `wide`, its resource type,
/// replicas, GPUs, nodes and run time too.
pub fn tasks(items: &[Value], wide: Option<&[Wide]>) -> Vec<String> {
    let queue = |t: &Value| match t["queue"]["reason"].as_str() {
        Some(r) => format!("#{} {r}", t["queue"]["position"]),
        None => String::new(),
    };
    let s = |v: &Value| v.as_str().unwrap_or("").to_owned();
    match wide {
        None => {
            let rows: Vec<Vec<String>> = items
                .iter()
                .map(|t| {
                    vec![
                        s(&t["name"]),
                        s(&t["type"]),
                        s(&t["status"]),
                        s(&t["projectGroup"]),
                        ago(t["createdAtMs"].as_i64().unwrap_or(0)),
                        queue(t),
                    ]
                })
                .collect();
            render(&["NAME", "TYPE", "STATUS", "GROUP", "AGE", "QUEUE"], &rows, &[])
        }
        Some(wide) => {
            let rows: Vec<Vec<String>> = items
                .iter()
                .zip(wide)
                .map(|(t, w)| {
                    vec![
                        s(&t["name"]),
                        s(&t["type"]),
                        s(&t["status"]),
                        s(&t["projectGroup"]),
                        w.resource_type.clone(),
                        w.replicas.clone(),
                        w.gpus.clone(),
                        ago(t["createdAtMs"].as_i64().unwrap_or(0)),
                        w.duration.clone(),
                        w.nodes.clone(),
                        queue(t),
                    ]
                })
                .collect();
            let header = [
                "NAME", "TYPE", "STATUS", "GROUP", "RESOURCE", "REPLICAS", "GPUS", "AGE", "DURATION",
                "NODES", "QUEUE",
            ];
            render(&header, &rows, &[5, 6])
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_are_read_as_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00Z");
        assert_eq!(utc(1_796_560_029_077), "2026-12-06 12:27:09Z");
    }

    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let rows = vec![
            vec!["a".to_owned(), "1".to_owned(), "x".to_owned()],
            vec!["longer".to_owned(), "100".to_owned(), String::new()],
        ];
        assert_eq!(
            render(&["NAME", "N", "NOTE"], &rows, &[1]),
            vec!["NAME      N  NOTE", "a         1  x", "longer  100"]
        );
    }

    #[test]
    fn durations_in_two_units() {
        assert_eq!(duration(42_000), "42s");
        assert_eq!(duration(185_000), "3m05s");
        assert_eq!(duration(7_620_000), "2h07m");
        assert_eq!(duration(3 * 86_400_000 + 4 * 3_600_000), "3d04h");
        assert_eq!(duration_text(5_000, true), "ran 5s");
    }
}
