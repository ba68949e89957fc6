//! The state every rule shares: the catalog, the paths that failed to decode, the report being filled, and
//! what is known about where the task runs. Each rule file adds the checks of its part of the task to
//! [`V`] as methods.

use crate::catalog::Catalog;
use crate::problem::{Report, is_under};
use crate::spec::TaskType;
use std::collections::BTreeSet;

/// What is known about where the task runs, for the checks that depend on it. `None` when the field is
/// missing, tainted or wrong (its own problem is reported once).
pub(super) struct Place<'a> {
    pub(super) task_type: Option<TaskType>,
    pub(super) cluster: Option<&'a str>,
    pub(super) pool: Option<&'a str>,
    /// The task's project group, when it is one the catalog knows.
    pub(super) group: Option<&'a str>,
}

/// The validator: the catalog it checks against, the paths whose problems were reported by the decoder,
/// and the report it fills.
pub(super) struct V<'a> {
    pub(super) cat: &'a Catalog,
    pub(super) tainted: &'a BTreeSet<String>,
    pub(super) report: Report,
    /// A member's project groups (None: an admin), for the choices messages name.
    pub(super) audience: Option<&'a [String]>,
    /// The member's view of the catalog, made the first time a message needs it.
    pub(super) seen: std::cell::OnceCell<Catalog>,
}

impl V<'_> {
    /// The catalog as the reader sees it: whole for an admin, a member's groups' part otherwise. Only for the
    /// names a message offers; every check reads [`V::cat`].
    pub(super) fn shown(&self) -> &Catalog {
        match self.audience {
            None => self.cat,
            Some(groups) => self.seen.get_or_init(|| self.cat.seen_by(groups)),
        }
    }

    /// The groups of `listed` (an entry's `projectGroups`) the reader may read of.
    pub(super) fn shown_groups<'g>(&self, listed: &'g [String]) -> Vec<&'g String> {
        listed.iter().filter(|g| self.audience.is_none_or(|a| a.contains(g))).collect()
    }

    /// Whether `path` decoded; a check that reads a field that did not is skipped (its problem is reported).
    pub(super) fn ok(&self, path: &str) -> bool {
        !self.tainted.iter().any(|t| is_under(path, t))
    }
}

/// `a, b, c`, or `(none)`.
pub(super) fn names<'n>(it: impl Iterator<Item = &'n String>) -> String {
    let v: Vec<&str> = it.map(String::as_str).collect();
    if v.is_empty() { "(none)".to_owned() } else { v.join(", ") }
}
