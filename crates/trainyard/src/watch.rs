//! `--watch` on `get` and `list`: the view asked for once a second and printed again whenever it changed,
//! until Ctrl-C (or, for `get`, until the task ended). On a terminal the table is redrawn in place; into a
//! pipe each new table follows the last after a blank line; `-o json` prints one document per line and
//! `-o yaml` one document per change, each after `---`.

use crate::conn::{CallResult, outln};
use crate::table::ListFormat;
use serde_json::Value;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

/// How often the view is asked for.
const POLL: Duration = Duration::from_secs(1);

/// Asks `fetch` once a second and prints its answer (as `lines` renders it for the tables) whenever it is not
/// the last one printed; returns once `ended` says so of an answer.
pub fn watch(
    fetch: impl Fn() -> CallResult<Value>,
    ended: impl Fn(&Value) -> bool,
    format: ListFormat,
    lines: impl Fn(&Value) -> CallResult<Vec<String>>,
) -> CallResult<ExitCode> {
    let tty = std::io::stdout().is_terminal();
    let mut last: Option<Value> = None;
    loop {
        let v = fetch()?;
        if last.as_ref() != Some(&v) {
            match format {
                ListFormat::Json => outln!("{}", serde_json::to_string(&v).unwrap_or_default()),
                ListFormat::Yaml => {
                    outln!("---");
                    outln!("{}", serde_saphyr::to_string(&v).unwrap_or_default().trim_end());
                }
                ListFormat::Table | ListFormat::Wide => {
                    let text = lines(&v)?;
                    if tty {
                        // Home and clear, then the table: redrawn in place, as `watch` does.
                        outln!("\x1b[H\x1b[2J{}", text.join("\n"));
                    } else {
                        if last.is_some() {
                            outln!();
                        }
                        for l in text {
                            outln!("{l}");
                        }
                    }
                }
            }
        }
        if ended(&v) {
            return Ok(ExitCode::SUCCESS);
        }
        last = Some(v);
        std::thread::sleep(POLL);
    }
}
