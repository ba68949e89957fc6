//! Problems found in a document: a field path, a stable code, a severity and a message that says what to
//! change. Validation never stops at the first problem; it returns a [`Report`] with all of them.

use serde::Serialize;
use std::fmt;

/// Whether a problem blocks submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The task is refused until this is fixed.
    Error,
    /// The task is accepted, but the user probably wants to change something.
    Warning,
}

macro_rules! codes {
    ($( $(#[$doc:meta])* $var:ident = $s:literal, )*) => {
        /// A stable, machine-readable problem code. The strings never change meaning once released; the API,
        /// the console and scripts match on them.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
        pub enum Code {
            $( $(#[$doc])* #[serde(rename = $s)] $var, )*
        }

        impl Code {
            /// Every code, in declaration order.
            pub const ALL: &'static [Code] = &[$(Code::$var),*];

            /// The stable string form of the code.
            pub fn as_str(self) -> &'static str {
                match self { $(Code::$var => $s,)* }
            }
        }
    };
}

codes! {
    /// The document is not well-formed YAML or JSON.
    Syntax = "syntax",
    /// The document is larger than the platform accepts.
    TooLarge = "too-large",
    /// A value has the wrong type (a number where a string belongs, ...).
    WrongType = "wrong-type",
    /// A field the schema does not know; usually a typo.
    UnknownField = "unknown-field",
    /// A required field is missing.
    Required = "required",
    /// A value is not one of the allowed choices.
    InvalidValue = "invalid-value",
    /// A number is outside its allowed range.
    OutOfRange = "out-of-range",
    /// A string or list is longer than allowed.
    TooLong = "too-long",
    /// A string or list that must not be empty is empty.
    Empty = "empty",
    /// A name does not follow its syntax rules.
    InvalidName = "invalid-name",
    /// An environment variable value is not allowed (NUL byte, ...).
    InvalidEnvValue = "invalid-env-value",
    /// The same thing appears twice where it must be unique.
    Duplicate = "duplicate",
    /// A name the platform sets itself.
    ReservedName = "reserved-name",
    /// A mount path that is not absolute and normalised.
    InvalidPath = "invalid-path",
    /// A mount path over a directory the image or the platform needs.
    ProtectedPath = "protected-path",
    /// A mount path outside the recommended /volume and /mnt trees.
    UnusualPath = "unusual-path",
    /// Two mounts at one path, or a mount inside another one.
    PathConflict = "path-conflict",
    /// A data mount (dataset, model) asked to be writable.
    ReadOnly = "read-only",
    /// A catalog reference (region, pool, image, volume, ...) that does not exist.
    NotFound = "not-found",
    /// A catalog entry that exists but is not offered where the task runs.
    NotAvailable = "not-available",
    /// A catalog entry that exists but lacks what the setting needs (a volume without multi-pod write, an
    /// image without Ray).
    Incompatible = "incompatible",
    /// A setting that is not supported for this task type or combination.
    NotSupported = "not-supported",
    /// Two settings that contradict each other.
    Conflict = "conflict",
    /// A setting that has no effect as configured.
    Ignored = "ignored",
    /// A label that is not in the maintained set while label validation is on.
    UnmaintainedLabel = "unmaintained-label",
    /// A replica that no node of the pool could ever hold.
    NeverFits = "never-fits",
    /// A field in the Ray runtime env that Ray does not know.
    UnknownRuntimeEnvField = "unknown-runtime-env-field",
    /// A URL that is not an absolute http(s) URL.
    InvalidUrl = "invalid-url",
    /// A hidden env value that is the mask shown in its place (`******`), not a value: copies of a task
    /// (clone, the console's form) never carry hidden values, so they must be entered again.
    MaskedValue = "masked-value",
    /// A catalog entry (image, volume, dataset, model) that exists but is not offered to the task's
    /// project group.
    NotInGroup = "not-in-group",
    /// A webhook whose destination is a loopback, link-local, private, unspecified or multicast address
    /// the server's admin has not allowed.
    RestrictedAddress = "restricted-address",
    /// An image reference to a registry the catalog does not list among its registries.
    RegistryNotAllowed = "registry-not-allowed",
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One problem at one field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// Where, as a field path from the document root: `spec.environment.env[2].name`. Empty for the document.
    pub path: String,
    pub code: Code,
    pub severity: Severity,
    /// What is wrong and how to fix it, for a person. Never contains a hidden env value.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() { "(document)" } else { &self.path };
        let severity = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{severity}[{}] {path}: {}", self.code, self.message)
    }
}

/// All problems found in one document, in document order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    pub problems: Vec<Problem>,
}

impl Report {
    pub fn error(&mut self, path: impl Into<String>, code: Code, message: impl Into<String>) {
        self.push(path.into(), code, Severity::Error, message.into());
    }

    pub fn warning(&mut self, path: impl Into<String>, code: Code, message: impl Into<String>) {
        self.push(path.into(), code, Severity::Warning, message.into());
    }

    fn push(&mut self, path: String, code: Code, severity: Severity, message: String) {
        self.problems.push(Problem { path, code, severity, message });
    }

    /// True when nothing blocks submission (warnings are allowed).
    pub fn is_ok(&self) -> bool {
        self.errors().next().is_none()
    }

    pub fn errors(&self) -> impl Iterator<Item = &Problem> {
        self.problems.iter().filter(|p| p.severity == Severity::Error)
    }

    pub fn warnings(&self) -> impl Iterator<Item = &Problem> {
        self.problems.iter().filter(|p| p.severity == Severity::Warning)
    }
}

/// Builds field paths: `spec.environment`, `env[2]`, `labels["example.com/team"]`.
pub(crate) fn field(base: &str, name: &str) -> String {
    if base.is_empty() {
        return name.to_owned();
    }
    // Built by hand: the decoder makes one for every field a document has, and `format!` costs more.
    let mut p = String::with_capacity(base.len() + 1 + name.len());
    p.push_str(base);
    p.push('.');
    p.push_str(name);
    p
}

pub(crate) fn index(base: &str, i: usize) -> String {
    format!("{base}[{i}]")
}

/// A map key: plain when it is an identifier, quoted otherwise.
pub(crate) fn key(base: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !key.starts_with(|c: char| c.is_ascii_digit());
    if plain { field(base, key) } else { format!("{base}[{key:?}]") }
}

/// True when `path` is `prefix` or lies under it (`a.b` is under `a`, `a[1]` is under `a`, `ab` is not).
pub(crate) fn is_under(path: &str, prefix: &str) -> bool {
    path == prefix
        || (path.starts_with(prefix) && matches!(path.as_bytes().get(prefix.len()), Some(b'.') | Some(b'[')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(field("", "spec"), "spec");
        assert_eq!(field("spec", "compute"), "spec.compute");
        assert_eq!(index("spec.env", 2), "spec.env[2]");
        assert_eq!(key("metadata.labels", "team"), "metadata.labels.team");
        assert_eq!(key("metadata.labels", "example.com/team"), r#"metadata.labels["example.com/team"]"#);
        assert_eq!(key("m", "1a"), r#"m["1a"]"#);
        assert!(is_under("spec.compute.pool", "spec.compute"));
        assert!(is_under("spec.env[1].name", "spec.env"));
        assert!(is_under("spec.env", "spec.env"));
        assert!(!is_under("spec.environment", "spec.env"));
    }

    #[test]
    fn codes_are_unique() {
        let mut seen = std::collections::BTreeSet::new();
        for c in Code::ALL {
            assert!(seen.insert(c.as_str()), "duplicate code string {c}");
        }
    }
}
