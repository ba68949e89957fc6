//! The leaf grammars the validator and the runtime env checker share: environment variable names, and the
//! description of characters a name may not hold (grouped by kind, for messages).

/// The kind of a character that is not allowed in a name, for messages.
fn char_class(c: char) -> &'static str {
    match c {
        ' ' => "a space",
        '\t' => "a tab",
        '\n' | '\r' => "a line break",
        '\u{200B}'..='\u{200D}' | '\u{2060}' | '\u{FEFF}' | '\u{180E}' => "zero-width characters",
        '\u{3000}' | '\u{FF01}'..='\u{FF60}' | '\u{FFE0}'..='\u{FFEE}' => "full-width characters",
        '\u{3400}'..='\u{4DBF}'
        | '\u{4E00}'..='\u{9FFF}'
        | '\u{F900}'..='\u{FAFF}'
        | '\u{3001}'..='\u{303F}' => "Chinese characters",
        c if c.is_control() => "control characters",
        c if !c.is_ascii() => "non-ASCII characters",
        _ => "punctuation",
    }
}

/// Describes the characters of `s` that `allowed` refuses, grouped by kind, for messages:
/// `a space and Chinese characters ('学', '习')`.
pub(crate) fn describe_bad_chars(s: &str, allowed: impl Fn(char) -> bool) -> Option<String> {
    let mut groups: Vec<(&'static str, Vec<char>)> = Vec::new();
    for c in s.chars().filter(|c| !allowed(*c)) {
        let class = char_class(c);
        match groups.iter_mut().find(|(k, _)| *k == class) {
            Some((_, cs)) if cs.contains(&c) => {}
            Some((_, cs)) => cs.push(c),
            None => groups.push((class, vec![c])),
        }
    }
    if groups.is_empty() {
        return None;
    }
    let parts: Vec<String> = groups
        .into_iter()
        .map(|(class, cs)| match class {
            "a space" | "a tab" | "a line break" => class.to_owned(),
            "zero-width characters" | "control characters" => {
                let codes: Vec<String> = cs.iter().map(|c| format!("U+{:04X}", *c as u32)).collect();
                format!("{class} ({})", codes.join(", "))
            }
            _ => {
                let shown: Vec<String> = cs.iter().map(|c| format!("'{c}'")).collect();
                format!("{class} ({})", shown.join(", "))
            }
        })
        .collect();
    Some(parts.join(" and "))
}

/// An environment variable name: ASCII letters, digits and `_`, not starting with a digit.
pub fn check_env_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is empty; give the variable a name".to_owned());
    }
    let shown = format!("{name:?}");
    if let Some(bad) = describe_bad_chars(name, |c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("{shown} contains {bad}; use ASCII letters, digits and _ only"));
    }
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(format!("{shown} starts with a digit; start with a letter or _"));
    }
    Ok(())
}
