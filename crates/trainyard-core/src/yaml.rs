//! YAML text to a document tree, within a budget: a size limit, and limits on events, nodes, aliases, anchors
//! and depth, so that no document (an alias bomb, deep nesting) costs more than its size allows.

use serde_json::Value;

/// The largest task document accepted, in bytes. A real task is a few KiB; this leaves room for long
/// commands and runtime envs while bounding parse time and memory.
pub const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;

/// YAML limits beyond the byte size: aliases and anchors can expand a small document into a huge tree.
fn yaml_options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_events = 200_000;
    budget.max_nodes = 100_000;
    budget.max_aliases = 1_000;
    budget.max_anchors = 1_000;
    budget.max_recorded_anchor_events = 20_000;
    budget.max_recorded_anchor_bytes = MAX_DOCUMENT_BYTES;
    budget.max_total_scalar_bytes = 4 * MAX_DOCUMENT_BYTES;
    budget.max_depth = 48;
    budget.max_documents = 1;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

/// Parses YAML text into a document tree, within the budget.
pub fn yaml_to_value(text: &str) -> Result<Value, String> {
    serde_saphyr::from_str_with_options::<Value>(text, yaml_options()).map_err(|e| one_line(&e.to_string()))
}

/// Parser messages can span lines (with a snippet of the input); problems are one line each.
fn one_line(s: &str) -> String {
    let mut out = String::new();
    for line in s.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if !out.is_empty() {
            out.push_str("; ");
        }
        out.push_str(line);
        if out.len() > 400 {
            break;
        }
    }
    out
}
