//! From bytes to a task and its problems: size limit, YAML or JSON syntax, then the decoder and the
//! validator. Nothing here panics on any input, and time and memory are bounded by the size limit and the
//! YAML budget (no alias bombs, no deep nesting).

use crate::catalog::Catalog;
use crate::decode::{Decode, Decoder};
use crate::problem::{Code, Report};
use crate::spec::TrainingTask;
use crate::validate::validate_tainted;
use serde_json::Value;

pub use crate::yaml::{MAX_DOCUMENT_BYTES, yaml_to_value};

/// A document checked end to end.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The decoded task, when the document was a mapping. It may still have errors: see `report`.
    pub task: Option<TrainingTask>,
    /// Decoding and validation problems together, in document order.
    pub report: Report,
}

impl Checked {
    /// The task, only when it has no errors.
    pub fn valid_task(&self) -> Option<&TrainingTask> {
        self.task.as_ref().filter(|_| self.report.is_ok())
    }
}

/// Parses a document (JSON when it starts with `{`, YAML otherwise) and decodes it, collecting every
/// syntax, type and structure problem.
pub fn parse(input: &[u8]) -> (Option<TrainingTask>, Decoder) {
    let mut d = Decoder::default();
    if input.len() > MAX_DOCUMENT_BYTES {
        d.report.error(
            "",
            Code::TooLarge,
            format!("the document is {} bytes; the limit is {MAX_DOCUMENT_BYTES}; move large scripts and data to a volume", input.len()),
        );
        return (None, d);
    }
    let text = match std::str::from_utf8(input) {
        Ok(t) => t,
        Err(e) => {
            d.report.error(
                "",
                Code::Syntax,
                format!("the document is not UTF-8 text (invalid byte at offset {})", e.valid_up_to()),
            );
            return (None, d);
        }
    };
    let text = text.strip_prefix('\u{FEFF}').unwrap_or(text);
    let value = if text.trim_start().starts_with('{') {
        // JSON, most likely; a YAML flow mapping also starts with `{`, so YAML gets a second chance.
        serde_json::from_str::<Value>(text)
            .or_else(|json| yaml_to_value(text).map_err(|_| format!("invalid JSON: {json}")))
    } else {
        yaml_to_value(text).map_err(|e| format!("invalid YAML: {e}"))
    };
    let value = match value {
        Ok(Value::Null) => {
            d.report.error("", Code::Empty, "the document is empty; start from one of the examples");
            return (None, d);
        }
        Ok(v) => v,
        Err(e) => {
            d.report.error("", Code::Syntax, e);
            return (None, d);
        }
    };
    let task = TrainingTask::decode(&value, "", &mut d);
    (task, d)
}

/// Parses, decodes and validates a document against a catalog: every problem at once.
pub fn check(input: &[u8], catalog: &Catalog) -> Checked {
    let (task, d) = parse(input);
    let mut report = d.report;
    if let Some(t) = &task {
        report.problems.extend(validate_tainted(t, catalog, &d.tainted).problems);
    }
    Checked { task, report }
}

impl TrainingTask {
    /// The task as YAML, in the same shape it is read.
    pub fn to_yaml(&self) -> String {
        // Serialising plain data structs cannot fail: every field is a string, number, bool, list or map.
        serde_saphyr::to_string(self).expect("a TrainingTask always serialises")
    }

    /// The task as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a TrainingTask always serialises")
    }
}
