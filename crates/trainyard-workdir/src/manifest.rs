//! A working directory's manifest: every entry by its path relative to the directory, and the checks the
//! server makes before it keeps one (the client's own walk never makes a manifest they refuse).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};

/// Most entries one working directory may hold.
pub const MAX_ENTRIES: usize = 200_000;
/// Longest path of an entry, in bytes (Linux's `PATH_MAX` less room for `/workspace/`).
pub const MAX_PATH: usize = 4000;

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Dir,
    File,
    Link,
}

/// One entry: a directory, a file (its content's SHA-256 and size, and whether it is executable), or a
/// symbolic link to a relative path that stays inside the working directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// Relative, `/`-separated, with no empty, `.` or `..` part.
    pub path: String,
    pub kind: Kind,
    /// A file's content: 64 lowercase hex digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// A file's bytes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub size: u64,
    /// A file any may run (the owner's execute bit on the client).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub executable: bool,
    /// A link's target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A working directory: its entries, in path order once [`Manifest::canonical`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub entries: Vec<Entry>,
}

/// Whether `s` is a SHA-256 as manifests write it.
pub fn is_digest(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether `s` is a working directory's id (the digest of its canonical manifest).
pub fn is_id(s: &str) -> bool {
    is_digest(s)
}

/// A path's parts, or why it is not one a manifest may hold.
fn parts(path: &str) -> Result<Vec<&str>, String> {
    if path.is_empty() {
        return Err("is empty".into());
    }
    if path.len() > MAX_PATH {
        return Err(format!("is {} bytes long; at most {MAX_PATH}", path.len()));
    }
    if path.starts_with('/') {
        return Err("is absolute; paths are relative to the working directory".into());
    }
    if path.contains('\0') {
        return Err("holds a NUL byte".into());
    }
    let parts: Vec<&str> = path.split('/').collect();
    if let Some(bad) = parts.iter().find(|p| p.is_empty() || **p == "." || **p == "..") {
        return Err(format!("has a {bad:?} part; paths are plain, without empty, `.` or `..` parts"));
    }
    Ok(parts)
}

/// Where a link at `path` to `target` leads, lexically, as parts from the working directory's root; Err
/// when it leaves the directory (or is absolute).
pub fn link_inside(path: &str, target: &str) -> Result<Vec<String>, String> {
    if target.is_empty() {
        return Err("has an empty target".into());
    }
    if target.starts_with('/') {
        return Err(format!(
            "links to {target:?}, an absolute path; a link may lead only inside the directory"
        ));
    }
    let mut at: Vec<String> = path.split('/').map(str::to_owned).collect();
    at.pop();
    for p in target.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                if at.pop().is_none() {
                    return Err(format!("links to {target:?}, outside the directory"));
                }
            }
            p => at.push(p.to_owned()),
        }
    }
    Ok(at)
}

impl Manifest {
    /// The entries sorted by path (the form the id is the digest of).
    pub fn canonical(mut self) -> Manifest {
        self.entries.sort_by(|a, b| a.path.cmp(&b.path));
        self
    }

    /// The id: the SHA-256 of the canonical manifest's JSON.
    pub fn id(&self) -> String {
        let mut sorted: Vec<&Entry> = self.entries.iter().collect();
        sorted.sort_by(|a, b| a.path.cmp(&b.path));
        let bytes = serde_json::to_vec(&sorted).unwrap_or_default();
        hex(&Sha256::digest(&bytes))
    }

    /// Bytes of all files.
    pub fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.size).fold(0, u64::saturating_add)
    }

    /// Files' digests with their sizes.
    pub fn blobs(&self) -> BTreeMap<&str, u64> {
        self.entries.iter().filter_map(|e| Some((e.sha256.as_deref()?, e.size))).collect()
    }

    /// Every problem of the manifest, each as (the field's place, `entries[3].path`, and what is wrong);
    /// none when the server may keep it. `max_bytes`: most bytes its files may add up to.
    pub fn check(&self, max_bytes: u64) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        if self.entries.len() > MAX_ENTRIES {
            problems
                .push(("entries".into(), format!("{} entries; at most {MAX_ENTRIES}", self.entries.len())));
            return problems;
        }
        let mut seen: BTreeMap<&str, Kind> = BTreeMap::new();
        for (i, e) in self.entries.iter().enumerate() {
            let at = format!("entries[{i}]");
            if let Err(why) = parts(&e.path) {
                problems.push((format!("{at}.path"), format!("{:?} {why}", e.path)));
                continue;
            }
            if seen.insert(&e.path, e.kind).is_some() {
                problems.push((format!("{at}.path"), format!("{:?} is listed twice", e.path)));
            }
            match e.kind {
                Kind::File => match e.sha256.as_deref() {
                    Some(d) if is_digest(d) => {}
                    Some(d) => problems
                        .push((format!("{at}.sha256"), format!("{d:?} is not 64 lowercase hex digits"))),
                    None => {
                        problems.push((format!("{at}.sha256"), "a file needs its content's SHA-256".into()))
                    }
                },
                Kind::Dir | Kind::Link if e.sha256.is_some() || e.size != 0 || e.executable => {
                    problems.push((at.clone(), "only a file has sha256, size or executable".into()));
                }
                _ => {}
            }
            match (e.kind, e.target.as_deref()) {
                (Kind::Link, Some(t)) => {
                    if let Err(why) = link_inside(&e.path, t) {
                        problems.push((format!("{at}.target"), format!("{:?} {why}", e.path)));
                    }
                }
                (Kind::Link, None) => {
                    problems.push((format!("{at}.target"), "a link needs its target".into()))
                }
                (_, Some(_)) => problems.push((format!("{at}.target"), "only a link has a target".into())),
                (_, None) => {}
            }
        }
        // Nothing may sit under a file or a link (a link is made last, and nothing is ever written through
        // one).
        let leaves: BTreeSet<&str> = seen.iter().filter(|(_, k)| **k != Kind::Dir).map(|(p, _)| *p).collect();
        for (i, e) in self.entries.iter().enumerate() {
            let mut parent = e.path.as_str();
            while let Some((up, _)) = parent.rsplit_once('/') {
                if leaves.contains(up) {
                    problems.push((
                        format!("entries[{i}].path"),
                        format!("{:?} is under {up:?}, which is not a directory", e.path),
                    ));
                    break;
                }
                parent = up;
            }
        }
        let bytes = self.bytes();
        if bytes > max_bytes {
            problems.push((
                "entries".into(),
                format!(
                    "the files add up to {}, over the {} an upload may hold",
                    human(bytes),
                    human(max_bytes)
                ),
            ));
        }
        problems
    }
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Bytes as people read them (`1.5 MiB`).
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{bytes} B") } else { format!("{v:.1} {}", UNITS[u]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, size: u64) -> Entry {
        Entry {
            path: path.into(),
            kind: Kind::File,
            sha256: Some("a".repeat(64)),
            size,
            executable: false,
            target: None,
        }
    }

    fn link(path: &str, target: &str) -> Entry {
        Entry {
            path: path.into(),
            kind: Kind::Link,
            sha256: None,
            size: 0,
            executable: false,
            target: Some(target.into()),
        }
    }

    #[test]
    fn a_plain_tree_passes_and_its_id_ignores_order() {
        let m = Manifest { entries: vec![file("a/b.py", 3), file("c", 4), link("a/d", "../c")] };
        assert!(m.check(100).is_empty(), "{:?}", m.check(100));
        let mut r = m.clone();
        r.entries.reverse();
        assert_eq!(m.id(), r.id());
        assert_ne!(m.id(), Manifest { entries: vec![file("a/b.py", 3)] }.id());
        assert!(is_id(&m.id()));
    }

    #[test]
    fn every_problem_is_named_at_once() {
        let m = Manifest {
            entries: vec![
                file("/etc/passwd", 1),
                file("a/../b", 1),
                file("x", 1),
                file("x", 1),
                link("out", "../../etc"),
                link("abs", "/etc/shadow"),
                file("x/under", 1),
                file("big", 1000),
            ],
        };
        let p = m.check(500);
        let all = p.iter().map(|(at, what)| format!("{at}: {what}")).collect::<Vec<_>>().join("\n");
        for want in [
            "entries[0].path: \"/etc/passwd\" is absolute",
            "entries[1].path: \"a/../b\" has a \"..\" part",
            "entries[3].path: \"x\" is listed twice",
            "entries[4].target: \"out\" links to \"../../etc\", outside",
            "entries[5].target: \"abs\" links to \"/etc/shadow\", an absolute path",
            "entries[6].path: \"x/under\" is under \"x\"",
            "over the 500 B an upload may hold",
        ] {
            assert!(all.contains(want), "{want} not in:\n{all}");
        }
    }

    #[test]
    fn links_resolve_lexically() {
        assert_eq!(link_inside("a/b", "../c").unwrap(), vec!["c"]);
        assert_eq!(link_inside("a/b", "./d/e").unwrap(), vec!["a", "d", "e"]);
        assert!(link_inside("a", "../x").is_err());
        assert!(link_inside("a/b", "../../x").is_err());
    }
}
