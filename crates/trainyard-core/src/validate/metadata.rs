//! The document's header and its metadata: apiVersion and kind, the name prefix, the project group, the
//! description, and the labels with the catalog's label policy.

use super::context::{V, names};
use super::formats::{check_label_key, check_label_value};
use super::limits::*;
use crate::grammar::describe_bad_chars;
use crate::problem::{Code, Report, key};
use crate::spec::{API_VERSION, KIND, TrainingTask};
use std::collections::BTreeMap;

impl V<'_> {
    pub(super) fn header(&mut self, t: &TrainingTask) {
        if t.api_version != API_VERSION {
            self.report.error(
                "apiVersion",
                Code::InvalidValue,
                format!("\"{}\" is not supported; use \"{API_VERSION}\"", t.api_version),
            );
        }
        if t.kind != KIND {
            self.report.error(
                "kind",
                Code::InvalidValue,
                format!("\"{}\" is not supported; use \"{KIND}\"", t.kind),
            );
        }
    }

    pub(super) fn metadata(&mut self, t: &TrainingTask) {
        let m = &t.metadata;
        check_name_prefix(&mut self.report, "metadata.namePrefix", &m.name_prefix);
        if m.project_group.is_empty() {
            self.report.error(
                "metadata.projectGroup",
                Code::Empty,
                "choose the project group the task belongs to",
            );
        } else if !self.cat.project_groups.contains_key(&m.project_group) {
            let known = names(self.shown().project_groups.keys());
            self.report.error(
                "metadata.projectGroup",
                Code::NotFound,
                format!("project group \"{}\" does not exist; known groups: {known}", m.project_group),
            );
        }
        if let Some(d) = &m.description
            && d.chars().count() > DESCRIPTION_MAX
        {
            self.report.error(
                "metadata.description",
                Code::TooLong,
                format!("is {} characters; shorten it to {DESCRIPTION_MAX}", d.chars().count()),
            );
        }
        self.labels(&m.labels);
    }

    fn labels(&mut self, labels: &BTreeMap<String, String>) {
        let base = "metadata.labels";
        if labels.len() > LABELS_MAX {
            self.report.error(
                base,
                Code::TooLong,
                format!("has {} labels; at most {LABELS_MAX}", labels.len()),
            );
        }
        let policy = &self.cat.labels;
        for (k, value) in labels {
            let p = key(base, k);
            let key_ok = match check_label_key(k) {
                Ok(()) => true,
                Err(why) => {
                    self.report.error(&p, Code::InvalidName, format!("label key \"{k}\" {why}"));
                    false
                }
            };
            if let Err(why) = check_label_value(value) {
                self.report.error(&p, Code::InvalidValue, format!("label value \"{value}\" {why}"));
            }
            if policy.validation && key_ok {
                match policy.maintained.get(k) {
                    None => {
                        let known = names(policy.maintained.keys());
                        self.report.error(
                            &p,
                            Code::UnmaintainedLabel,
                            format!("label \"{k}\" is not maintained and label validation is on; use one of: {known}"),
                        );
                    }
                    Some(allowed) if !allowed.is_empty() && !allowed.contains(value) => {
                        self.report.error(
                            &p,
                            Code::UnmaintainedLabel,
                            format!(
                                "\"{value}\" is not an allowed value of label \"{k}\"; use one of: {}",
                                allowed.join(", ")
                            ),
                        );
                    }
                    Some(_) => {}
                }
            }
        }
    }
}

/// The task name prefix: lowercase letters, digits and hyphens, starting and ending alphanumeric, short
/// enough that prefix + unique suffix is a DNS-1123 label.
pub fn check_name_prefix(r: &mut Report, path: &str, s: &str) {
    if s.is_empty() {
        r.error(path, Code::Empty, "give a name prefix, like llama-sft");
        return;
    }
    let n = s.chars().count();
    if n > NAME_PREFIX_MAX {
        r.error(
            path,
            Code::TooLong,
            format!("is {n} characters; at most {NAME_PREFIX_MAX}, so that the {NAME_SUFFIX_LEN}-character unique suffix still fits in {DNS_LABEL_MAX}"),
        );
    }
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    if s.chars().any(|c| !allowed(c)) {
        let mut what: Vec<String> = Vec::new();
        if s.chars().any(|c| c.is_ascii_uppercase()) {
            what.push("uppercase letters".to_owned());
        }
        what.extend(describe_bad_chars(s, |c| allowed(c) || c.is_ascii_uppercase()));
        let fixed: String =
            s.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
        let fixed = fixed.trim_matches('-');
        let hint = if !fixed.is_empty() && fixed.len() <= NAME_PREFIX_MAX {
            format!(" (try {fixed:?})")
        } else {
            String::new()
        };
        r.error(
            path,
            Code::InvalidName,
            format!(
                "{s:?} contains {}; use lowercase letters, digits and hyphens only{hint}",
                what.join(" and ")
            ),
        );
    } else if !s.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !s.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        r.error(path, Code::InvalidName, format!("{s:?} must start and end with a letter or digit"));
    }
}
