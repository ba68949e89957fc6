//! `--wait` on `submit`, `clone`, `stop` and `resubmit`: the task followed until it reaches what the verb aims
//! at. On standard error, each new event as a line, and a status line (the status, and while queued the
//! place in the queue and the scheduler's reason) that is rewritten in place on a terminal and otherwise
//! printed once per change; then how it went, on standard output.

use crate::conn::{CallResult, Conn, EXIT_FAILED, EXIT_SERVER, Failure, Format, outln};
use serde_json::Value;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// What a `--wait` waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Goal {
    /// The task's end (`submit`, `clone`): 0 when it succeeded, 1 when it failed or was stopped.
    Ended,
    /// The task no longer running (`stop`): 0 when it is stopped (or succeeded first), 1 when it failed.
    Stopped,
    /// The task running again or ended (`resubmit`): 0 when it runs or succeeded, 1 when it failed or was
    /// stopped.
    Running,
}

/// The newest event's sequence number, so a wait after an action shows only what follows it.
pub fn last_event(c: &Conn, id: &str) -> CallResult<i64> {
    let (_, ev) = c.call("GET", &format!("/api/v1/tasks/{id}/events"), None, None)?;
    Ok(ev["items"].as_array().into_iter().flatten().filter_map(|e| e["seq"].as_i64()).max().unwrap_or(0))
}

/// The status line on standard error: rewritten in place on a terminal, a line per change otherwise.
struct StatusLine {
    tty: bool,
    shown: String,
}

impl StatusLine {
    fn width() -> usize {
        std::env::var("COLUMNS").ok().and_then(|c| c.parse::<usize>().ok()).filter(|w| *w > 20).unwrap_or(80)
    }

    fn clear(&self) {
        if self.tty && !self.shown.is_empty() {
            eprint!("\r\x1b[2K");
        }
    }

    /// A line that stays (an event), above the status line.
    fn note(&self, text: &str) {
        self.clear();
        eprintln!("{text}");
        if self.tty && !self.shown.is_empty() {
            eprint!("{}", self.shown);
            let _ = std::io::stderr().flush();
        }
    }

    fn set(&mut self, line: String) {
        if self.tty {
            // One screen line, so the carriage return finds its start.
            let line: String = line.chars().take(Self::width() - 1).collect();
            if line != self.shown {
                self.clear();
                eprint!("{line}");
                let _ = std::io::stderr().flush();
                self.shown = line;
            }
        } else if line != self.shown {
            eprintln!("{line}");
            self.shown = line;
        }
    }

    /// Gone from a terminal (the outcome that follows says where the task got); kept in a log.
    fn done(&mut self) {
        self.clear();
        let _ = std::io::stderr().flush();
        self.shown.clear();
    }
}

/// What the status line says of task `t`.
pub(crate) fn status_line(name: &str, t: &Value) -> String {
    let status = t["status"].as_str().unwrap_or("?").to_lowercase();
    if let Some(reason) = t["queue"]["reason"].as_str() {
        return format!(
            "  {name}: queued #{} ({} in its group): {reason}",
            t["queue"]["position"], t["queue"]["positionInGroup"]
        );
    }
    match t["starting"]["reason"].as_str() {
        Some(reason) => format!("  {name}: {status}: {reason}"),
        None => format!("  {name}: {status}"),
    }
}

/// Follows task `id` from event `after` on until it reaches `goal` (see [`Goal`] for the exit status). The
/// last line, how it went, is printed on standard output for tables and on standard error beside JSON or
/// YAML (which stay one document).
pub fn wait(c: &Conn, id: &str, name: &str, goal: Goal, after: i64, format: Format) -> CallResult<ExitCode> {
    const WAIT_LIMIT: Duration = Duration::from_secs(24 * 3600);
    let start = Instant::now();
    let mut after = after;
    let mut line = StatusLine { tty: std::io::stderr().is_terminal(), shown: String::new() };
    loop {
        let (_, ev) = c.call("GET", &format!("/api/v1/tasks/{id}/events?after={after}"), None, None)?;
        for e in ev["items"].as_array().into_iter().flatten() {
            after = after.max(e["seq"].as_i64().unwrap_or(after));
            line.note(&format!(
                "  {:<16} {}",
                e["reason"].as_str().unwrap_or(""),
                e["message"].as_str().unwrap_or("")
            ));
        }
        let (_, t) = c.call("GET", &format!("/api/v1/tasks/{id}"), None, None)?;
        let status = t["status"].as_str().unwrap_or("");
        let outcome = match (goal, status) {
            (_, "Succeeded") => Some((format!("{name} succeeded"), true)),
            (Goal::Stopped, "Stopped") => Some((format!("{name} stopped"), true)),
            (_, "Failed" | "Stopped") => Some((format!("{name} {}", status.to_lowercase()), false)),
            (Goal::Running, "Running") => Some((format!("{name} is running"), true)),
            _ => None,
        };
        if let Some((said, ok)) = outcome {
            line.done();
            if format == Format::Table {
                outln!("{said}");
            } else {
                eprintln!("{said}");
            }
            return Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(EXIT_FAILED) });
        }
        line.set(status_line(name, &t));
        if start.elapsed() > WAIT_LIMIT {
            line.done();
            return Err(Failure { message: "gave up waiting after 24 hours".into(), code: EXIT_SERVER });
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[cfg(test)]
mod tests {
    use super::status_line;
    use serde_json::json;

    #[test]
    fn the_status_line_says_where_a_queued_task_waits() {
        let t =
            json!({"status": "Queued", "queue": {"position": 3, "positionInGroup": 1, "reason": "no room"}});
        assert_eq!(status_line("a", &t), "  a: queued #3 (1 in its group): no room");
        assert_eq!(status_line("a", &json!({"status": "Stopping", "queue": null})), "  a: stopping");
        let starting = json!({"status": "Starting", "queue": null,
                              "starting": {"reason": "a-master-0 is Unschedulable: 0/2 nodes", "sinceMs": 1}});
        assert_eq!(status_line("a", &starting), "  a: starting: a-master-0 is Unschedulable: 0/2 nodes");
    }
}
