//! From bytes to a task and its problems: size limit, YAML or JSON syntax, then the decoder and the
//! validator. Nothing here panics on any input, and time and memory are bounded by the size limit and the
//! YAML budget (no alias bombs, no deep nesting).

use crate::catalog::Catalog;
use crate::decode::{Decode, Decoder};
use crate::problem::{Code, Report};
use crate::spec::TrainingTask;
use crate::validate::validate_for;
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
    check_for(input, catalog, None)
}

/// [`check`] for a reader: `audience` is a member's project groups (None: an admin); see
/// [`crate::validate::validate_for`].
pub fn check_for(input: &[u8], catalog: &Catalog, audience: Option<&[String]>) -> Checked {
    let (task, d) = parse(input);
    let mut report = d.report;
    if let Some(t) = &task {
        report.problems.extend(validate_for(t, catalog, &d.tainted, audience).problems);
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

/// A YAML document as JSON, which [`parse`] reads into the same tree about ten times as fast (for clients
/// that send documents written as YAML: the server's parsing moves to them). `None` when there is nothing
/// to gain or the server should see the text itself: it is JSON already (or starts like it), it is not
/// UTF-8, empty or valid YAML, or it or its JSON is over the size limit; the server then says what is wrong.
pub fn yaml_as_json(input: &[u8]) -> Option<Vec<u8>> {
    if input.len() > MAX_DOCUMENT_BYTES {
        return None;
    }
    let text = std::str::from_utf8(input).ok()?;
    let text = text.strip_prefix('\u{FEFF}').unwrap_or(text);
    if text.trim_start().starts_with('{') {
        return None;
    }
    let value = yaml_to_value(text).ok().filter(|v| !v.is_null())?;
    let json = serde_json::to_vec(&value).ok()?;
    (json.len() <= MAX_DOCUMENT_BYTES).then_some(json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::disallowed_methods)] // A test reads the shipped examples.
    /// Every shipped example, and documents with awkward scalars, decode from their JSON form to the task
    /// and the problems their YAML gives.
    #[test]
    fn yaml_sent_as_json_decodes_to_the_same_task_and_problems() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let catalog =
            Catalog::from_yaml(&std::fs::read_to_string(root.join("catalog/catalog.yaml")).unwrap()).unwrap();
        let mut docs: Vec<Vec<u8>> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .map(|p| std::fs::read(p).unwrap())
            .collect();
        assert!(docs.len() >= 5, "the examples are found");
        // Scalars YAML reads its own way (numbers, booleans, nulls, quoted and not), a wrong type, a
        // tainted path, and a byte-order mark.
        docs.push(
            b"\xEF\xBB\xBFapiVersion: trainyard.dev/v1\nkind: TrainingTask\nmetadata: {namePrefix: x, projectGroup: nlp, \
              labels: {a: '1', b: yes}}\nspec:\n  type: PyTorchJob\n  environment: {image: pytorch-2.3-cuda12, cmd: ~, \
              env: [{name: A, value: 0x1F}, {name: B, value: 1e3}, {name: C, value: -0.0}]}\n  compute: \
              {resourceType: Reserved, pool: a100-pool, workers: two, instanceSpecs: [{spec: gpu.a100.1}]}\n"
                .to_vec(),
        );
        let mut reports = Vec::new();
        for yaml in docs {
            let json = yaml_as_json(&yaml).expect("a YAML document converts");
            let (a, b) = (check(&yaml, &catalog), check(&json, &catalog));
            assert_eq!(a.task, b.task, "{}", String::from_utf8_lossy(&yaml));
            assert_eq!(a.report, b.report, "{}", String::from_utf8_lossy(&yaml));
            reports.push(a.report);
        }
        // The awkward document's wrong type was reported (and so compared), not lost on both sides.
        let awkward = reports.last().unwrap();
        assert!(awkward.problems.iter().any(|p| p.path == "spec.compute.workers"), "{awkward:#?}");
    }

    #[test]
    fn what_the_server_should_see_itself_is_left_as_it_is() {
        for doc in [
            &b"{\"apiVersion\": \"trainyard.dev/v1\"}"[..],
            b"  {a: 1}",
            b"",
            b"# only a comment\n",
            b"a: [unclosed",
            b"\xff\xfe not utf-8",
        ] {
            assert_eq!(yaml_as_json(doc), None, "{}", String::from_utf8_lossy(doc));
        }
        let over = format!("a: \"{}\"\n", "x".repeat(MAX_DOCUMENT_BYTES));
        assert_eq!(yaml_as_json(over.as_bytes()), None);
        assert!(yaml_as_json(b"a: 1\n").is_some());
    }
}
