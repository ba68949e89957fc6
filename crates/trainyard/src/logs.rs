//! `trainyard logs TASK`: a replica's log (the master's or the head's unless `--replica` or `--all` says
//! otherwise), of the latest attempt unless `--attempt`, whole or its last `--tail` lines, and with `-f`
//! followed until the replica ends (a task with no replicas yet is waited for, where it waits said on standard
//! error). Lines are the task's own output; `--timestamps` puts the time each was written before it.

use crate::conn::{CallResult, Conn, EXIT_SERVER, Failure, not_found, outln, resolve};
use std::io::BufRead;
use std::process::ExitCode;

/// What `logs` was asked for.
#[derive(Debug, Clone, Default)]
pub struct LogOpts {
    pub follow: bool,
    pub tail: Option<usize>,
    pub replica: Option<String>,
    pub all: bool,
    pub attempt: Option<i64>,
    pub timestamps: bool,
}

/// A stored log line (`TIME STREAM TEXT`) as shown.
fn shown(line: &str, timestamps: bool, prefix: &str) -> String {
    let mut parts = line.splitn(3, ' ');
    let (time, _stream, text) = (parts.next().unwrap_or(""), parts.next(), parts.next());
    match (text, timestamps) {
        (Some(text), true) => format!("{prefix}{time} {text}"),
        (Some(text), false) => format!("{prefix}{text}"),
        // Not in the stored form: as it is.
        (None, _) => format!("{prefix}{line}"),
    }
}

/// How often `logs -f` looks at a task that has no replicas yet.
const START_LOOK: std::time::Duration = std::time::Duration::from_secs(1);

/// `logs -f` on a task whose current attempt has no replicas yet (queued, starting): waits until it has,
/// saying on standard error where it waits each time that changes. A task that ends first is left to what
/// `logs` says of it.
fn wait_for_replicas(c: &Conn, id: &str, task: &str) -> CallResult<()> {
    wait_for_attempt(c, id, task, None).map(|_| ())
}

/// Waits until attempt `which` (None: the task's current one) has replicas, saying where the task waits
/// while it does: true. False when it never will: the task ended first, or went on to a later attempt.
pub fn wait_for_attempt(c: &Conn, id: &str, task: &str, which: Option<i64>) -> CallResult<bool> {
    let mut said = String::new();
    loop {
        let (_, t) = c.call("GET", &format!("/api/v1/tasks/{id}"), None, None)?;
        let status = t["status"].as_str().unwrap_or("");
        let current = t["attempt"].as_i64().unwrap_or(0);
        let want = which.unwrap_or(current);
        let (_, v) = c.call("GET", &format!("/api/v1/tasks/{id}/logs"), None, None)?;
        let started = v["items"].as_array().into_iter().flatten().any(|a| {
            a["attempt"].as_i64() == Some(want) && a["replicas"].as_array().is_some_and(|r| !r.is_empty())
        });
        if started {
            if !said.is_empty() {
                eprintln!("trainyard: {task} started");
            }
            return Ok(true);
        }
        if ["Succeeded", "Failed", "Stopped"].contains(&status) || current > want {
            return Ok(false);
        }
        let line = crate::wait::status_line(task, &t).trim().to_owned();
        if line != said {
            let wait = line.strip_prefix(&format!("{task}: ")).unwrap_or(&line);
            eprintln!("trainyard: waiting for {task} to start: {wait}");
            said = line;
        }
        std::thread::sleep(START_LOOK);
    }
}

pub fn logs(c: &Conn, task: &str, o: &LogOpts) -> CallResult<ExitCode> {
    let id = resolve(c, task)?;
    if o.follow && o.attempt.is_none() {
        wait_for_replicas(c, &id, task)?;
    }
    let (_, v) = c.call("GET", &format!("/api/v1/tasks/{id}/logs"), None, None)?;
    let attempts = v["items"].as_array().cloned().unwrap_or_default();
    let chosen = match o.attempt {
        Some(a) => attempts.iter().find(|x| x["attempt"].as_i64() == Some(a)),
        None => attempts.first(),
    };
    let Some(chosen) = chosen else {
        let which = o.attempt.map_or_else(|| "yet".to_owned(), |a| format!("in attempt {a}"));
        return Err(not_found(format!(
            "{task} has no replicas {which} (queued or starting?); `trainyard describe {task}` says where it is"
        )));
    };
    let attempt = chosen["attempt"].as_i64().unwrap_or(0);
    let names: Vec<String> = chosen["replicas"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["name"].as_str().map(str::to_owned))
        .collect();
    let picked: Vec<String> = match (&o.replica, o.all) {
        (_, true) => names.clone(),
        (Some(r), false) => {
            let found: Vec<String> =
                names.iter().filter(|n| *n == r || n.ends_with(&format!("-{r}"))).cloned().collect();
            if found.is_empty() {
                return Err(not_found(format!(
                    "attempt {attempt} of {task} has no replica {r:?}; it has {}",
                    names.join(", ")
                )));
            }
            found
        }
        (None, false) => names.iter().take(1).cloned().collect(),
    };
    let many = picked.len() > 1;
    let prefix = |r: &str| if many { format!("[{r}] ") } else { String::new() };
    // What is there now (its last `tail` lines), and where it ends.
    let mut ends = Vec::new();
    for r in &picked {
        let (mut text, mut at) = (String::new(), 0u64);
        loop {
            let (chunk, next, _) =
                c.get_text(&format!("/api/v1/tasks/{id}/logs?replica={r}&attempt={attempt}&offset={at}"))?;
            if chunk.is_empty() || next <= at {
                break;
            }
            text.push_str(&chunk);
            at = next;
        }
        let lines: Vec<&str> = text.lines().collect();
        let from = o.tail.map_or(0, |n| lines.len().saturating_sub(n));
        for l in &lines[from..] {
            outln!("{}", shown(l, o.timestamps, &prefix(r)));
        }
        ends.push((r.clone(), at));
    }
    if !o.follow {
        return Ok(ExitCode::SUCCESS);
    }
    // Followed from there, each replica on a thread of its own, until each ends.
    let threads: Vec<_> = ends
        .into_iter()
        .map(|(r, at)| {
            let (c, id, ts, prefix) = (c.clone(), id.clone(), o.timestamps, prefix(&r));
            std::thread::spawn(move || -> CallResult<()> {
                let path =
                    format!("/api/v1/tasks/{id}/logs?replica={r}&attempt={attempt}&offset={at}&follow=true");
                let mut ended = false;
                for line in c.stream(&path)?.lines() {
                    let Ok(line) = line else { break };
                    if line.starts_with("event: end") {
                        ended = true;
                    } else if let Some(data) =
                        line.strip_prefix("data: ").or_else(|| line.strip_prefix("data:"))
                    {
                        if ended {
                            break;
                        }
                        outln!("{}", shown(data, ts, &prefix));
                    }
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| Failure { message: "a log follower failed".into(), code: EXIT_SERVER })??;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::shown;

    #[test]
    fn stored_lines_are_shown_with_or_without_their_time() {
        let l = "2026-12-02T00:44:38.995Z O loss 0.25 at step 3";
        assert_eq!(shown(l, false, ""), "loss 0.25 at step 3");
        assert_eq!(shown(l, true, "[w-0] "), "[w-0] 2026-12-02T00:44:38.995Z loss 0.25 at step 3");
        assert_eq!(shown("odd", false, ""), "odd");
    }
}
