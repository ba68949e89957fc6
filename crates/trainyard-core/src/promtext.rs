//! The Prometheus text exposition format, as the metrics monitor reads a replica's endpoint: one sample per
//! line, `name{label="value",...} value [timestamp]`, with `#` comments (HELP, TYPE) skipped. A line that
//! cannot be read is counted and skipped; the rest of the page still counts.

use std::collections::BTreeMap;

/// One sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// The samples of a page, and how many lines could not be read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Page {
    pub samples: Vec<Sample>,
    pub bad_lines: usize,
}

/// Most samples kept from one page (a runaway exporter must not flood the store).
pub const MAX_SAMPLES: usize = 10_000;

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}

fn parse_line(line: &str) -> Option<Sample> {
    let mut chars = line.char_indices().peekable();
    let (_, first) = *chars.peek()?;
    if !is_name_start(first) {
        return None;
    }
    let mut end = line.len();
    for (i, c) in chars.by_ref() {
        if !is_name_char(c) {
            end = i;
            break;
        }
    }
    let name = &line[..end];
    let mut rest = &line[end..];
    let mut labels = BTreeMap::new();
    if let Some(body) = rest.strip_prefix('{') {
        // label="value" pairs, values with \\, \" and \n escapes.
        let mut s = body;
        loop {
            s = s.trim_start();
            if let Some(after) = s.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = s.find('=')?;
            let key = s[..eq].trim();
            if key.is_empty() || !key.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') {
                return None;
            }
            s = s[eq + 1..].trim_start().strip_prefix('"')?;
            let mut value = String::new();
            let mut it = s.char_indices();
            let close = loop {
                let (i, c) = it.next()?;
                match c {
                    '\\' => match it.next()?.1 {
                        'n' => value.push('\n'),
                        other => value.push(other),
                    },
                    '"' => break i,
                    other => value.push(other),
                }
            };
            labels.insert(key.to_owned(), value);
            s = s[close + 1..].trim_start();
            s = s.strip_prefix(',').unwrap_or(s);
        }
    }
    let mut fields = rest.split_whitespace();
    let value = parse_value(fields.next()?)?;
    if let Some(ts) = fields.next() {
        ts.parse::<i64>().ok()?;
    }
    if fields.next().is_some() {
        return None;
    }
    Some(Sample { name: name.to_owned(), labels, value })
}

/// Reads a page. Never panics; keeps at most [`MAX_SAMPLES`].
pub fn parse(text: &str) -> Page {
    let mut page = Page::default();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match parse_line(line) {
            Some(s) if page.samples.len() < MAX_SAMPLES => page.samples.push(s),
            Some(_) => {}
            None => page.bad_lines += 1,
        }
    }
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_samples_labels_and_special_values() {
        let page = parse(
            "# HELP loss training loss\n# TYPE loss gauge\nloss 0.25\n\
             tokens_total{rank=\"0\",phase=\"train\"} 1.5e6 1700000000000\n\
             weird{msg=\"a \\\"quoted\\\" \\\\ value\\nnext\"} +Inf\n\
             nan_metric NaN\n\
             not a sample\n{x=\"1\"} 2\n",
        );
        assert_eq!(page.bad_lines, 2);
        assert_eq!(page.samples.len(), 4);
        assert_eq!(page.samples[0], Sample { name: "loss".into(), labels: BTreeMap::new(), value: 0.25 });
        assert_eq!(page.samples[1].labels["phase"], "train");
        assert_eq!(page.samples[1].value, 1.5e6);
        assert_eq!(page.samples[2].labels["msg"], "a \"quoted\" \\ value\nnext");
        assert!(page.samples[2].value.is_infinite());
        assert!(page.samples[3].value.is_nan());
    }

    #[test]
    fn never_panics_on_odd_input() {
        for s in [
            "{",
            "a{",
            "a{b",
            "a{b=",
            "a{b=\"",
            "a{b=\"\\",
            "a{b=\"c\"",
            "a{b=\"c\"}",
            "a 1 2 3",
            "é 1",
            "a{=\"1\"} 1",
        ] {
            let p = parse(s);
            assert!(p.samples.is_empty(), "{s}: {p:?}");
        }
    }
}
