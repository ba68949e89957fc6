//! A validator for the part of JSON Schema (2020-12) the OpenAPI document uses: `$ref` into the document,
//! `type` (one or a list), `enum`, `properties`, `required`, `additionalProperties`, `items`, `prefixItems`,
//! `minItems`, `maxItems`, `minProperties`, `maxProperties`, `minimum`, `maximum`, `minLength`, `maxLength`,
//! `pattern` (the regular expressions of [`Regex`]), `anyOf`, `oneOf`. Any other keyword that is not an
//! annotation stops the test, so a schema cannot pass by using something this skips.

use serde_json::{Value, json};

/// Keywords that describe and never constrain.
const ANNOTATIONS: &[&str] = &["description", "default", "title"];

pub struct Validator<'d> {
    pub doc: &'d Value,
}

impl Validator<'_> {
    /// Every way `value` breaks `schema`, each with the path where it does.
    pub fn errors(&self, schema: &Value, value: &Value, path: &str) -> Vec<String> {
        let mut out = Vec::new();
        self.check(schema, value, path, &mut out);
        out
    }

    fn check(&self, schema: &Value, value: &Value, path: &str, out: &mut Vec<String>) {
        let schema = match schema {
            Value::Bool(true) => return,
            Value::Bool(false) => return out.push(format!("{path}: nothing is allowed here, found {value}")),
            Value::Object(s) => s,
            other => panic!("{path}: a schema must be an object or a boolean, not {other}"),
        };
        for (keyword, arg) in schema {
            match keyword.as_str() {
                "$ref" => {
                    let target = self.resolve(arg.as_str().expect("$ref is a string"));
                    self.check(target, value, path, out);
                }
                "type" => {
                    let types: Vec<&str> = match arg {
                        Value::String(t) => vec![t.as_str()],
                        Value::Array(ts) => ts.iter().map(|t| t.as_str().expect("a type name")).collect(),
                        other => panic!("{path}: bad type {other}"),
                    };
                    if !types.iter().any(|t| has_type(value, t)) {
                        out.push(format!("{path}: expected {}, found {value}", types.join(" or ")));
                    }
                }
                "enum" => {
                    if !arg.as_array().expect("enum is a list").contains(value) {
                        out.push(format!("{path}: {value} is not one of {arg}"));
                    }
                }
                "properties" => {
                    if let Value::Object(object) = value {
                        for (name, sub) in arg.as_object().expect("properties is an object") {
                            if let Some(v) = object.get(name) {
                                self.check(sub, v, &format!("{path}.{name}"), out);
                            }
                        }
                    }
                }
                "required" => {
                    if let Value::Object(object) = value {
                        for name in arg.as_array().expect("required is a list") {
                            let name = name.as_str().expect("a field name");
                            if !object.contains_key(name) {
                                out.push(format!("{path}: \"{name}\" is required"));
                            }
                        }
                    }
                }
                "additionalProperties" => {
                    if let Value::Object(object) = value {
                        let known = schema.get("properties").and_then(Value::as_object);
                        for (name, v) in object {
                            if !known.is_some_and(|k| k.contains_key(name)) {
                                let sub_path = format!("{path}.{name}");
                                if *arg == Value::Bool(false) {
                                    out.push(format!("{sub_path}: not in the schema"));
                                } else {
                                    self.check(arg, v, &sub_path, out);
                                }
                            }
                        }
                    }
                }
                "prefixItems" => {
                    if let Value::Array(items) = value {
                        for (i, (sub, v)) in arg.as_array().expect("a list").iter().zip(items).enumerate() {
                            self.check(sub, v, &format!("{path}[{i}]"), out);
                        }
                    }
                }
                "items" => {
                    // The elements that prefixItems does not cover.
                    let covered = schema.get("prefixItems").and_then(Value::as_array).map_or(0, Vec::len);
                    if let Value::Array(items) = value {
                        for (i, v) in items.iter().enumerate().skip(covered) {
                            self.check(arg, v, &format!("{path}[{i}]"), out);
                        }
                    }
                }
                "minItems" | "maxItems" => {
                    if let Value::Array(items) = value {
                        let bound = arg.as_u64().expect("a count") as usize;
                        let ok =
                            if keyword == "minItems" { items.len() >= bound } else { items.len() <= bound };
                        if !ok {
                            out.push(format!("{path}: {} items breaks {keyword} {bound}", items.len()));
                        }
                    }
                }
                "minProperties" | "maxProperties" => {
                    if let Value::Object(object) = value {
                        let bound = arg.as_u64().expect("a count") as usize;
                        let ok = if keyword == "minProperties" {
                            object.len() >= bound
                        } else {
                            object.len() <= bound
                        };
                        if !ok {
                            out.push(format!("{path}: {} fields break {keyword} {bound}", object.len()));
                        }
                    }
                }
                "minLength" | "maxLength" => {
                    if let Value::String(text) = value {
                        let bound = arg.as_u64().expect("a length") as usize;
                        let n = text.chars().count();
                        let ok = if keyword == "minLength" { n >= bound } else { n <= bound };
                        if !ok {
                            out.push(format!("{path}: {n} characters break {keyword} {bound}"));
                        }
                    }
                }
                "pattern" => {
                    if let Value::String(text) = value {
                        let pattern = arg.as_str().expect("a pattern is a string");
                        if !Regex::new(pattern).is_match(text) {
                            out.push(format!("{path}: {text:?} does not match {pattern}"));
                        }
                    }
                }
                "minimum" | "maximum" => {
                    // Integers exactly (u64::MAX and 2^64 are the same f64), other numbers as f64.
                    let ordering = match (exact_integer(value), exact_integer(arg)) {
                        (Some(n), Some(bound)) => Some(n.cmp(&bound)),
                        _ => value.as_f64().zip(arg.as_f64()).and_then(|(n, bound)| n.partial_cmp(&bound)),
                    };
                    if let Some(ordering) = ordering {
                        let ok = if keyword == "minimum" { ordering.is_ge() } else { ordering.is_le() };
                        if !ok {
                            out.push(format!("{path}: {value} breaks {keyword} {arg}"));
                        }
                    }
                }
                "anyOf" | "oneOf" => {
                    let branches = arg.as_array().expect("a list of schemas");
                    let passing: Vec<Vec<String>> =
                        branches.iter().map(|b| self.errors(b, value, path)).collect();
                    let n_ok = passing.iter().filter(|e| e.is_empty()).count();
                    let ok = if keyword == "anyOf" { n_ok >= 1 } else { n_ok == 1 };
                    if !ok {
                        let why: Vec<String> = passing.into_iter().flatten().collect();
                        out.push(format!("{path}: {n_ok} branches of {keyword} match ({})", why.join("; ")));
                    }
                }
                // Bytes (a tar stream): any string of them; no other format is written.
                "format" => assert_eq!(arg, "binary", "{path}: the validator knows format binary only"),
                k if ANNOTATIONS.contains(&k) => {}
                other => panic!("{path}: the validator does not know the keyword {other:?}; teach it first"),
            }
        }
    }

    fn resolve(&self, reference: &str) -> &Value {
        let pointer = reference.strip_prefix('#').unwrap_or_else(|| panic!("only local $refs: {reference}"));
        self.doc.pointer(pointer).unwrap_or_else(|| panic!("{reference} names nothing in the document"))
    }
}

/// The regular expressions the document's patterns use (ECMA 262's syntax, this much of it): literals and
/// `\\`-escapes, `.`, classes `[a-z_]` and `[^,]`, groups `(...)` and `(?:...)` with `|`, the quantifiers
/// `*`, `+`, `?`, `{n}`, `{n,}`, `{n,m}`, and the anchors `^` and `$`. Anything else panics, so a pattern this
/// cannot read is never passed by mistake. Matching searches, as JSON Schema's `pattern` does.
pub struct Regex(Vec<Vec<Node>>);

#[derive(Debug, Clone)]
enum Node {
    Start,
    End,
    /// A character in (or, negated, out of) these ranges.
    Class(bool, Vec<(char, char)>),
    Group(Vec<Vec<Node>>),
    Repeat(Box<Node>, usize, Option<usize>),
}

impl Regex {
    pub fn new(pattern: &str) -> Regex {
        let chars: Vec<char> = pattern.chars().collect();
        let mut at = 0;
        let alts = parse_alternatives(&chars, &mut at);
        assert!(at == chars.len(), "pattern {pattern:?}: unexpected {:?} at {at}", chars.get(at));
        Regex(alts)
    }

    pub fn is_match(&self, text: &str) -> bool {
        let s: Vec<char> = text.chars().collect();
        let whole = Node::Group(self.0.clone());
        (0..=s.len()).any(|start| matches(std::slice::from_ref(&whole), start, &s, &|_| true))
    }
}

fn parse_alternatives(p: &[char], at: &mut usize) -> Vec<Vec<Node>> {
    let mut alts = vec![Vec::new()];
    while *at < p.len() && p[*at] != ')' {
        let c = p[*at];
        *at += 1;
        let atom = match c {
            '|' => {
                alts.push(Vec::new());
                continue;
            }
            '^' => Node::Start,
            '$' => Node::End,
            '.' => Node::Class(true, vec![('\n', '\n')]),
            '(' => {
                if p.get(*at) == Some(&'?') {
                    assert_eq!(p.get(*at + 1), Some(&':'), "only (?:...) groups");
                    *at += 2;
                }
                let inner = parse_alternatives(p, at);
                assert_eq!(p.get(*at), Some(&')'), "an unclosed group");
                *at += 1;
                Node::Group(inner)
            }
            '[' => {
                let negated = p.get(*at) == Some(&'^');
                if negated {
                    *at += 1;
                }
                let mut ranges = Vec::new();
                while p[*at] != ']' {
                    let mut lo = p[*at];
                    if lo == '\\' {
                        *at += 1;
                        lo = p[*at];
                    }
                    *at += 1;
                    if p[*at] == '-' && p[*at + 1] != ']' {
                        ranges.push((lo, p[*at + 1]));
                        *at += 2;
                    } else {
                        ranges.push((lo, lo));
                    }
                }
                *at += 1;
                Node::Class(negated, ranges)
            }
            '\\' => {
                let e = p[*at];
                *at += 1;
                match e {
                    'd' => Node::Class(false, vec![('0', '9')]),
                    e if !e.is_ascii_alphanumeric() => Node::Class(false, vec![(e, e)]),
                    e => panic!("the escape \\{e} is not known here; teach it first"),
                }
            }
            '*' | '+' | '?' | '{' => panic!("a quantifier {c:?} with nothing before it"),
            c => Node::Class(false, vec![(c, c)]),
        };
        let atom = match p.get(*at) {
            Some('*') => Node::Repeat(Box::new(atom), 0, None),
            Some('+') => Node::Repeat(Box::new(atom), 1, None),
            Some('?') => Node::Repeat(Box::new(atom), 0, Some(1)),
            Some('{') => {
                let end = (*at..p.len()).find(|&i| p[i] == '}').expect("an unclosed {");
                let inside: String = p[*at + 1..end].iter().collect();
                let (min, max) = match inside.split_once(',') {
                    None => (inside.parse().unwrap(), Some(inside.parse().unwrap())),
                    Some((lo, "")) => (lo.parse().unwrap(), None),
                    Some((lo, hi)) => (lo.parse().unwrap(), Some(hi.parse().unwrap())),
                };
                *at = end;
                Node::Repeat(Box::new(atom), min, max)
            }
            _ => {
                alts.last_mut().unwrap().push(atom);
                continue;
            }
        };
        *at += 1;
        alts.last_mut().unwrap().push(atom);
    }
    alts
}

/// Whether `seq` matches `s` from `pos` so that `then` holds of where it ends (backtracking).
fn matches(seq: &[Node], pos: usize, s: &[char], then: &dyn Fn(usize) -> bool) -> bool {
    let Some((first, rest)) = seq.split_first() else { return then(pos) };
    let next = |p: usize| matches(rest, p, s, then);
    match first {
        Node::Start => pos == 0 && next(pos),
        Node::End => pos == s.len() && next(pos),
        Node::Class(negated, ranges) => {
            pos < s.len()
                && ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&s[pos])) != *negated
                && next(pos + 1)
        }
        Node::Group(alts) => alts.iter().any(|alt| matches(alt, pos, s, &next)),
        Node::Repeat(node, min, max) => repeat(node, *min, *max, 0, pos, s, &next),
    }
}

/// `node` repeated from `count` times on, greedily, then `then`.
fn repeat(
    node: &Node,
    min: usize,
    max: Option<usize>,
    count: usize,
    pos: usize,
    s: &[char],
    then: &dyn Fn(usize) -> bool,
) -> bool {
    let more = max.is_none_or(|m| count < m)
        && matches(std::slice::from_ref(node), pos, s, &|p| {
            p != pos && repeat(node, min, max, count + 1, p, s, then)
        });
    more || (count >= min && then(pos))
}

/// A JSON number that is an integer, exactly (a float with no fraction is one, as large as it is).
fn exact_integer(v: &Value) -> Option<i128> {
    if let Some(n) = v.as_u64() {
        return Some(n.into());
    }
    if let Some(n) = v.as_i64() {
        return Some(n.into());
    }
    let f = v.as_f64()?;
    // Every f64 this side of 2^100 with no fraction is an integer that i128 holds exactly.
    (f.fract() == 0.0 && f.abs() < 2f64.powi(100)).then_some(f as i128)
}

fn has_type(v: &Value, t: &str) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "string" => v.is_string(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        other => panic!("unknown type {other}"),
    }
}

#[test]
fn the_validator_catches_what_it_should() {
    let doc = json!({"components": {"schemas": {"P": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0}, "b": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
        "required": ["a"], "additionalProperties": false
    }}}});
    let v = Validator { doc: &doc };
    let p = json!({"$ref": "#/components/schemas/P"});
    assert!(v.errors(&p, &json!({"a": 1, "b": null}), "$").is_empty());
    assert_eq!(v.errors(&p, &json!({"b": "x"}), "$").len(), 1, "missing a");
    assert_eq!(v.errors(&p, &json!({"a": -1}), "$").len(), 1, "below the minimum");
    assert_eq!(v.errors(&p, &json!({"a": 1, "c": 1}), "$").len(), 1, "an unknown field");
    assert_eq!(v.errors(&p, &json!({"a": 1, "b": 2}), "$").len(), 1, "no branch matches");
    let pair = json!({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "number"}], "minItems": 2, "maxItems": 2});
    assert!(v.errors(&pair, &json!([1, 2.5]), "$").is_empty());
    assert!(!v.errors(&pair, &json!([1.5, 2]), "$").is_empty());
    assert!(!v.errors(&pair, &json!([1, 2, 3]), "$").is_empty());
    let e = json!({"type": "array", "items": {"enum": ["x"]}});
    assert!(!v.errors(&e, &json!(["y"]), "$").is_empty());
    let short = json!({"type": "string", "minLength": 1, "maxLength": 3});
    assert!(v.errors(&short, &json!("abc"), "$").is_empty());
    assert!(
        !v.errors(&short, &json!(""), "$").is_empty() && !v.errors(&short, &json!("abcd"), "$").is_empty()
    );
}

#[test]
fn patterns_match_as_json_schema_says() {
    let is = |p: &str, s: &str| Regex::new(p).is_match(s);
    assert!(is("^(?:[Rr][Uu][Nn])$", "rUn") && !is("^(?:[Rr][Uu][Nn])$", "runs"));
    assert!(is("^[0-9a-f]{4}$", "00af") && !is("^[0-9a-f]{4}$", "00afe") && !is("^[0-9a-f]{4}$", "00aG"));
    assert!(is("^ty_[0-9a-f]{2,}$", "ty_abc") && !is("^ty_[0-9a-f]{2,}$", "ty_a"));
    let labels = "^(?:[^,=]+=[^,]*)?(?:,(?:[^,=]+=[^,]*)?)*$";
    for ok in ["", "a=b", "a=b,c=", "a=b,,c=d=e"] {
        assert!(is(labels, ok), "{ok}");
    }
    for bad in ["a", "=b", "a=b,c"] {
        assert!(!is(labels, bad), "{bad}");
    }
    assert!(is("b", "abc"), "a pattern searches, unless anchored");
    assert!(is("^https://x\\.dev/[a-z]+(-[a-z]+)*$", "https://x.dev/not-found"));
    assert!(!is("^https://x\\.dev/[a-z]+(-[a-z]+)*$", "https://xydev/not-found"));
    assert!(is("^(?:a|bc)+$", "abca") && !is("^(?:a|bc)+$", "abcb"));
}
