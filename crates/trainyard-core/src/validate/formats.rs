//! The shapes of strings the rules check: label keys and values, OCI image references and webhook URLs.
//! Each says why a string is wrong, in words for a message; the caller knows where it is.

use super::limits::*;
use crate::grammar::describe_bad_chars;

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63 characters.
pub fn check_label_key(k: &str) -> Result<(), String> {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix {
        if p.is_empty() || p.len() > LABEL_PREFIX_MAX {
            return Err(format!("has a prefix of {} characters; use 1 to {LABEL_PREFIX_MAX}", p.len()));
        }
        let ok = p.split('.').all(|seg| {
            !seg.is_empty()
                && seg.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !seg.starts_with('-')
                && !seg.ends_with('-')
        });
        if !ok {
            return Err("has a prefix that is not a lowercase DNS name, like example.com".to_owned());
        }
    }
    if name.is_empty() {
        return Err("has an empty name".to_owned());
    }
    check_label_value(name)
}

/// A label value: empty, or at most 63 characters of letters, digits, `-`, `_`, `.`, starting and ending
/// with a letter or digit.
pub fn check_label_value(v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Ok(());
    }
    if v.len() > LABEL_NAME_MAX {
        return Err(format!("is {} characters; at most {LABEL_NAME_MAX}", v.len()));
    }
    if let Some(bad) = describe_bad_chars(v, |c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
        return Err(format!("contains {bad}; use letters, digits, -, _ and . only"));
    }
    if !v.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !v.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return Err("must start and end with a letter or digit".to_owned());
    }
    Ok(())
}

/// An OCI image reference: `[host[:port]/]path[:tag][@algo:digest]`.
pub fn check_image_reference(s: &str) -> Result<(), String> {
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
    if parts.len() > 1 && (parts[0].contains(['.', ':']) || parts[0] == "localhost") {
        let host = parts.remove(0);
        let (h, port) = host.split_once(':').map_or((host, None), |(h, p)| (h, Some(p)));
        if h.is_empty() || !h.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-')) {
            return Err(format!("registry host \"{host}\" is not a host name"));
        }
        if port.is_some_and(|p| p.parse::<u16>().is_err()) {
            return Err(format!("registry host \"{host}\" has a bad port"));
        }
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
    Ok(())
}

/// An absolute http or https URL with a host.
pub fn check_url(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("give the webhook URL, like https://alerts.example.com/hook".to_owned());
    }
    if s.len() > URL_MAX {
        return Err(format!("is {} characters; at most {URL_MAX}", s.len()));
    }
    let rest = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
        .ok_or_else(|| format!("\"{s}\" must start with https:// or http://"))?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    if host.is_empty() || host.starts_with(':') {
        return Err(format!("\"{s}\" has no host"));
    }
    if let Some(bad) = describe_bad_chars(s, |c| !(c.is_whitespace() || c.is_control())) {
        return Err(format!("URL contains {bad}; percent-encode them"));
    }
    Ok(())
}
