//! OCI image references (`[registry[:port]/]repository[:tag][@algorithm:digest]`): parsed, normalised the way
//! the Docker and OCI tools read them, and printed in one canonical form, so that two spellings of one image
//! (`pytorch/pytorch`, `docker.io/pytorch/pytorch:latest`) are one image to the catalog's registry rules and to
//! an image cache.
//!
//! - No registry (the first component has no `.` or `:` and is not `localhost`): Docker Hub, `docker.io`
//!   (`index.docker.io` is the same registry); a one-component repository there is under `library/`.
//! - No tag and no digest: the tag `latest`. With a digest the tag only documents; the digest decides.

use crate::validate::limits::IMAGE_REF_MAX;
use std::fmt;

/// The registry of a reference that names none.
pub const DEFAULT_REGISTRY: &str = "docker.io";
/// The tag of a reference that names neither tag nor digest.
pub const DEFAULT_TAG: &str = "latest";

/// A parsed, normalised image reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ImageRef {
    /// `host[:port]`, lower case (`docker.io` for Docker Hub).
    pub registry: String,
    /// The path in the registry: `library/ubuntu`, `team/pytorch`.
    pub repository: String,
    /// The tag (`latest` when the reference has neither tag nor digest).
    pub tag: Option<String>,
    /// `algorithm:hex`, when pinned.
    pub digest: Option<String>,
}

impl ImageRef {
    /// Parses a reference; the error says what is wrong, for a person.
    pub fn parse(s: &str) -> Result<ImageRef, String> {
        if s.is_empty() {
            return Err("it is empty".to_owned());
        }
        if s.len() > IMAGE_REF_MAX {
            return Err(format!("it is {} characters; at most {IMAGE_REF_MAX}", s.len()));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => (r, Some(d)),
            None => (s, None),
        };
        if let Some(d) = digest {
            let ok = d.split_once(':').is_some_and(|(algo, hex)| {
                !algo.is_empty()
                    && algo.chars().all(|c| {
                        c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '+' | '.' | '_' | '-')
                    })
                    && hex.len() >= 32
                    && hex.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
            });
            if !ok {
                return Err("the digest after @ must look like sha256:<64 hex digits>".to_owned());
            }
            if let Some(hex) = d.strip_prefix("sha256:")
                && hex.len() != 64
            {
                return Err(format!("a sha256 digest has 64 hex digits, not {}", hex.len()));
            }
        }
        // A tag is after the last ':' that comes after the last '/'.
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
            None => (rest, None),
        };
        if let Some(t) = tag {
            let ok = !t.is_empty()
                && t.len() <= 128
                && t.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                && t.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
            if !ok {
                return Err(format!("tag \"{t}\" must be 1 to 128 letters, digits, _, . or -"));
            }
        }
        let mut parts: Vec<&str> = name.split('/').collect();
        let mut registry = None;
        if parts.len() > 1 && (parts[0].contains(['.', ':']) || parts[0] == "localhost") {
            let host = parts.remove(0);
            check_registry(host)?;
            registry = Some(host.to_ascii_lowercase());
        }
        for part in &parts {
            let ok = !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'))
                && part.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && part.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit());
            if !ok {
                return Err(format!(
                    "path component \"{part}\" must be lowercase letters and digits, separated by . _ or -"
                ));
            }
        }
        let registry = match registry.as_deref() {
            None | Some("index.docker.io" | "registry-1.docker.io") => DEFAULT_REGISTRY.to_owned(),
            Some(r) => r.to_owned(),
        };
        let mut repository = parts.join("/");
        if registry == DEFAULT_REGISTRY && parts.len() == 1 {
            repository = format!("library/{repository}");
        }
        let tag = match (tag, digest) {
            (Some(t), _) => Some(t.to_owned()),
            (None, None) => Some(DEFAULT_TAG.to_owned()),
            (None, Some(_)) => None,
        };
        Ok(ImageRef { registry, repository, tag, digest: digest.map(str::to_owned) })
    }

    /// The same image pinned to `digest` (what a pull resolved its tag to).
    pub fn pinned(&self, digest: &str) -> ImageRef {
        ImageRef { digest: Some(digest.to_owned()), ..self.clone() }
    }
}

/// The canonical form: `registry/repository[:tag][@digest]`, which parses back to the same reference.
impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// A registry as an admin names it in the catalog: `host[:port]`.
pub fn check_registry(host: &str) -> Result<(), String> {
    let (h, port) = host.split_once(':').map_or((host, None), |(h, p)| (h, Some(p)));
    if h.is_empty()
        || h.starts_with(['.', '-'])
        || h.ends_with(['.', '-'])
        || !h.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-'))
    {
        return Err(format!("registry host \"{host}\" is not a host name"));
    }
    if port.is_some_and(|p| p.parse::<u16>().map_or(true, |n| n == 0)) {
        return Err(format!("registry host \"{host}\" has a bad port"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn canon(s: &str) -> String {
        ImageRef::parse(s).unwrap().to_string()
    }

    #[test]
    fn docker_hub_defaults_are_filled_in() {
        assert_eq!(canon("ubuntu"), "docker.io/library/ubuntu:latest");
        assert_eq!(canon("pytorch/pytorch:2.3"), "docker.io/pytorch/pytorch:2.3");
        assert_eq!(canon("docker.io/ubuntu"), "docker.io/library/ubuntu:latest");
        assert_eq!(canon("index.docker.io/library/ubuntu:22.04"), "docker.io/library/ubuntu:22.04");
        assert_eq!(canon(&format!("ubuntu@{D}")), format!("docker.io/library/ubuntu@{D}"));
    }

    #[test]
    fn registries_ports_tags_and_digests() {
        let r = ImageRef::parse(&format!("Registry.Example:5000/team/pytorch:2.3-cuda12@{D}")).unwrap();
        assert_eq!(r.registry, "registry.example:5000");
        assert_eq!(r.repository, "team/pytorch");
        assert_eq!(r.tag.as_deref(), Some("2.3-cuda12"));
        assert_eq!(r.digest.as_deref(), Some(D));
        assert_eq!(canon("localhost/x"), "localhost/x:latest", "localhost is a registry, x no Hub image");
        assert_eq!(canon("127.0.0.1:5000/a/b"), "127.0.0.1:5000/a/b:latest");
        assert_eq!(
            ImageRef::parse("reg.example/a").unwrap().pinned(D).to_string(),
            format!("reg.example/a:latest@{D}")
        );
    }

    #[test]
    fn every_canonical_form_parses_back_to_itself() {
        for s in
            ["ubuntu", "a/b/c:1", "reg.example:443/x@sha256:", "localhost:5000/t:v1", "index.docker.io/x"]
        {
            let Ok(r) = ImageRef::parse(s) else { continue };
            assert_eq!(ImageRef::parse(&r.to_string()).unwrap(), r, "{s}");
        }
    }

    #[test]
    fn bad_references_say_what_is_wrong() {
        for (s, says) in [
            ("", "empty"),
            ("Ubuntu", "lowercase"),
            ("a//b", "path component"),
            ("reg.example:0/a", "bad port"),
            ("reg.example:99999/a", "bad port"),
            ("-reg.example/a", "not a host name"),
            ("a:", "tag"),
            ("a:-x", "tag"),
            ("a@sha256:abc", "digest"),
            ("a@sha256:0123456789abcdef0123456789abcdef", "64 hex digits"),
        ] {
            let e = ImageRef::parse(s).expect_err(s);
            assert!(e.contains(says), "{s}: {e}");
        }
        assert!(ImageRef::parse(&"a".repeat(IMAGE_REF_MAX + 1)).unwrap_err().contains("at most"));
    }
}
