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

/// An OCI image reference: `[host[:port]/]path[:tag][@algo:digest]` (see [`crate::image_ref`]).
pub fn check_image_reference(s: &str) -> Result<(), String> {
    crate::image_ref::ImageRef::parse(s).map(|_| ())
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
