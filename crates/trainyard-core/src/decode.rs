//! A decoder from a parsed document tree (`serde_json::Value`) into typed spec structs that, unlike serde's
//! derive, keeps going after the first problem: every wrong type, unknown field and missing field is reported
//! with its path, and the field is replaced by its default so validation can still look at the rest.
//!
//! Paths that failed to decode are remembered as *tainted*; semantic checks skip problems at or under a
//! tainted path, so a user sees "`spec.compute.workers` must be an integer" once, not followed by a second,
//! confusing problem about the default that stood in for it.

use crate::problem::{Code, Report, field, index, key};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};

/// Collects problems and tainted paths while decoding.
#[derive(Debug, Default)]
pub struct Decoder {
    pub report: Report,
    pub tainted: BTreeSet<String>,
}

/// A type that can be decoded from a document value.
pub trait Decode: Sized + Default {
    /// Whether a missing field of this type is simply its default (lists, maps, options).
    const OPTIONAL: bool = false;

    /// Decodes `value` found at `path`. Returns `None` after recording a problem.
    fn decode(value: &Value, path: &str, d: &mut Decoder) -> Option<Self>;

    /// The JSON Schema of what `decode` accepts (structure and types; the rules are the validator's).
    fn schema() -> Value;
}

/// How a JSON value's type is named in messages.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a number",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

impl Decoder {
    pub fn wrong_type(&mut self, path: &str, expected: &str, got: &Value) {
        let hint = match (expected, got) {
            ("a string", Value::Number(_) | Value::Bool(_)) => {
                format!("; put it in quotes: \"{got}\"")
            }
            _ => String::new(),
        };
        self.report.error(
            path,
            Code::WrongType,
            format!("must be {expected}, found {}{hint}", type_name(got)),
        );
    }

    /// Checks that `value` is a mapping whose keys are all in `known`; unknown keys are reported with a
    /// suggestion when one is close.
    pub fn object<'v>(
        &mut self,
        value: &'v Value,
        path: &str,
        known: &[&str],
    ) -> Option<&'v Map<String, Value>> {
        let Value::Object(map) = value else {
            self.wrong_type(path, "a mapping", value);
            return None;
        };
        for k in map.keys() {
            if !known.contains(&k.as_str()) {
                let message = match suggest(k, known) {
                    Some(s) => format!("unknown field \"{k}\"; did you mean \"{s}\"?"),
                    None => format!("unknown field \"{k}\"; known fields are {}", known.join(", ")),
                };
                self.report.error(key(path, k), Code::UnknownField, message);
            }
        }
        Some(map)
    }

    /// Decodes field `name` of `map` at `path`. A missing (or null) field takes `default` when given, the
    /// type's default when it is optional, and is reported as required otherwise.
    pub fn field<T: Decode>(
        &mut self,
        map: &Map<String, Value>,
        path: &str,
        name: &str,
        default: Option<T>,
    ) -> T {
        // The field's path is made only for a field that is there or missing for good (most of a task's
        // fields are left out and take their defaults).
        match map.get(name) {
            None | Some(Value::Null) => match default {
                Some(v) => v,
                None if T::OPTIONAL => T::default(),
                None => {
                    let p = field(path, name);
                    // A misspelt key was already reported with "did you mean"; a second problem saying the
                    // field is missing would only repeat it.
                    let misspelt = map.keys().any(|k| k != name && suggest(k, &[name]).is_some());
                    if !misspelt {
                        self.report.error(&p, Code::Required, format!("\"{name}\" is required"));
                    }
                    self.tainted.insert(p);
                    T::default()
                }
            },
            Some(v) => {
                let p = field(path, name);
                match T::decode(v, &p, self) {
                    Some(x) => x,
                    None => {
                        self.tainted.insert(p);
                        T::default()
                    }
                }
            }
        }
    }

    /// True when `path` or a parent of it failed to decode.
    pub fn is_tainted(&self, path: &str) -> bool {
        self.tainted.iter().any(|t| crate::problem::is_under(path, t))
    }
}

/// The closest known name within a small edit distance, or a case-insensitive match.
pub fn suggest<'a>(word: &str, known: &[&'a str]) -> Option<&'a str> {
    if let Some(k) = known.iter().find(|k| k.eq_ignore_ascii_case(word)) {
        return Some(k);
    }
    let lower = word.to_ascii_lowercase();
    known
        .iter()
        .map(|k| (edit_distance(&lower, &k.to_ascii_lowercase()), *k))
        .filter(|(d, k)| *d <= 2.min(k.len() / 3 + 1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

impl Decode for String {
    fn schema() -> Value {
        serde_json::json!({"type": "string"})
    }
    fn decode(v: &Value, path: &str, d: &mut Decoder) -> Option<Self> {
        match v {
            Value::String(s) => Some(s.clone()),
            _ => {
                d.wrong_type(path, "a string", v);
                None
            }
        }
    }
}

impl Decode for bool {
    fn schema() -> Value {
        serde_json::json!({"type": "boolean"})
    }
    fn decode(v: &Value, path: &str, d: &mut Decoder) -> Option<Self> {
        match v {
            Value::Bool(b) => Some(*b),
            _ => {
                d.wrong_type(path, "true or false", v);
                None
            }
        }
    }
}

fn integer(v: &Value, path: &str, d: &mut Decoder, min: i64, max: i64) -> Option<i64> {
    let n = match v {
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i,
            (None, Some(big)) => {
                d.report.error(path, Code::OutOfRange, format!("{big} is too large; use {min} to {max}"));
                return None;
            }
            (None, None) => {
                d.wrong_type(path, "an integer", v);
                return None;
            }
        },
        _ => {
            d.wrong_type(path, "an integer", v);
            return None;
        }
    };
    if n < min || n > max {
        let message = match (n < min, min, max) {
            (true, 0, _) => format!("{n} is negative; use 0 or more"),
            (false, _, m) if m == i64::from(u32::MAX) => format!("{n} is too large"),
            _ => format!("{n} is out of range; use {min} to {max}"),
        };
        d.report.error(path, Code::OutOfRange, message);
        return None;
    }
    Some(n)
}

impl Decode for u32 {
    fn schema() -> Value {
        serde_json::json!({"type": "integer", "minimum": 0, "maximum": u32::MAX})
    }
    fn decode(v: &Value, path: &str, d: &mut Decoder) -> Option<Self> {
        integer(v, path, d, 0, i64::from(u32::MAX)).and_then(|n| u32::try_from(n).ok())
    }
}

impl Decode for i64 {
    fn schema() -> Value {
        serde_json::json!({"type": "integer"})
    }
    fn decode(v: &Value, path: &str, d: &mut Decoder) -> Option<Self> {
        integer(v, path, d, i64::MIN, i64::MAX)
    }
}

impl Decode for f64 {
    fn schema() -> Value {
        serde_json::json!({"type": "number"})
    }
    fn decode(v: &Value, path: &str, d: &mut Decoder) -> Option<Self> {
        match v.as_f64() {
            Some(x) if x.is_finite() => Some(x),
            _ => {
                d.wrong_type(path, "a number", v);
                None
            }
        }
    }
}

impl<T: Decode> Decode for Option<T> {
    const OPTIONAL: bool = true;
    fn schema() -> Value {
        T::schema()
    }
    fn decode(v: &Value, path: &str, d: &mut Decoder) -> Option<Self> {
        T::decode(v, path, d).map(Some)
    }
}

impl<T: Decode> Decode for Vec<T> {
    const OPTIONAL: bool = true;
    fn schema() -> Value {
        serde_json::json!({"type": "array", "items": T::schema()})
    }
    fn decode(v: &Value, path: &str, d: &mut Decoder) -> Option<Self> {
        let Value::Array(items) = v else {
            d.wrong_type(path, "a list", v);
            return None;
        };
        // Every element is decoded, so one bad element does not hide the problems of the others. A failed
        // element keeps its place (as a default) so that indexes in later problems stay true to the document.
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let p = index(path, i);
            match T::decode(item, &p, d) {
                Some(x) => out.push(x),
                None => {
                    d.tainted.insert(p);
                    out.push(T::default());
                }
            }
        }
        Some(out)
    }
}

impl<T: Decode> Decode for BTreeMap<String, T> {
    const OPTIONAL: bool = true;
    fn schema() -> Value {
        serde_json::json!({"type": "object", "additionalProperties": T::schema()})
    }
    fn decode(v: &Value, path: &str, d: &mut Decoder) -> Option<Self> {
        let Value::Object(map) = v else {
            d.wrong_type(path, "a mapping", v);
            return None;
        };
        let mut out = BTreeMap::new();
        for (k, item) in map {
            let p = key(path, k);
            match T::decode(item, &p, d) {
                Some(x) => {
                    out.insert(k.clone(), x);
                }
                None => {
                    d.tainted.insert(p);
                }
            }
        }
        Some(out)
    }
}

/// Declares an enum whose document form is a fixed set of strings, with serde and [`Decode`] support.
/// A value that differs only in case gets a "did you mean" hint.
#[macro_export]
#[doc(hidden)]
macro_rules! string_enum {
    ($(#[$meta:meta])* $vis:vis enum $ty:ident { $( $(#[$vmeta:meta])* $var:ident = $s:literal ),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default,
                 serde::Serialize, serde::Deserialize)]
        $vis enum $ty {
            #[default]
            $( $(#[$vmeta])* #[serde(rename = $s)] $var ),*
        }

        impl $ty {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$ty] = &[$($ty::$var),*];
            /// Every variant's document form, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$($s),*];

            /// The document form of the variant.
            pub fn as_str(self) -> &'static str {
                match self { $($ty::$var => $s),* }
            }

            /// Parses the exact document form.
            pub fn from_name(s: &str) -> Option<Self> {
                match s { $($s => Some($ty::$var),)* _ => None }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl $crate::decode::Decode for $ty {
            fn schema() -> serde_json::Value {
                serde_json::json!({"type": "string", "enum": Self::NAMES})
            }
            fn decode(v: &serde_json::Value, path: &str, d: &mut $crate::decode::Decoder) -> Option<Self> {
                let serde_json::Value::String(s) = v else {
                    d.wrong_type(path, &format!("one of {}", Self::NAMES.join(", ")), v);
                    return None;
                };
                if let Some(x) = Self::from_name(s) {
                    return Some(x);
                }
                let message = match $crate::decode::suggest(s, Self::NAMES) {
                    Some(hint) => format!("\"{s}\" is not allowed; did you mean \"{hint}\"?"),
                    None => format!("\"{s}\" is not allowed; use one of {}", Self::NAMES.join(", ")),
                };
                d.report.error(path, $crate::problem::Code::InvalidValue, message);
                None
            }
        }
    };
}

/// Implements [`Decode`] for a struct from its field list: `field: Type = "key"`, optionally followed by
/// `default EXPR`. Fields without a default are required unless their type is optional.
#[macro_export]
#[doc(hidden)]
macro_rules! decode_struct {
    ($ty:ident { $( $field:ident : $fty:ty = $key:literal $(default $def:expr)? ),* $(,)? }) => {
        impl $crate::decode::Decode for $ty {
            fn schema() -> serde_json::Value {
                let mut properties = serde_json::Map::new();
                let mut required: Vec<&str> = Vec::new();
                $(
                    #[allow(unused_mut, unused_assignments)]
                    let mut field = <$fty as $crate::decode::Decode>::schema();
                    #[allow(unused_mut, unused_assignments)]
                    let mut has_default = false;
                    $(
                        has_default = true;
                        let default: $fty = $def;
                        if let (Some(obj), Ok(v)) = (field.as_object_mut(), serde_json::to_value(&default)) {
                            obj.insert("default".to_owned(), v);
                        }
                    )?
                    if !has_default && !<$fty as $crate::decode::Decode>::OPTIONAL {
                        required.push($key);
                    }
                    properties.insert($key.to_owned(), field);
                )*
                serde_json::json!({
                    "type": "object",
                    "additionalProperties": false,
                    "properties": properties,
                    "required": required,
                })
            }
            fn decode(v: &serde_json::Value, path: &str, d: &mut $crate::decode::Decoder) -> Option<Self> {
                let map = d.object(v, path, &[$($key),*])?;
                Some(Self {
                    $( $field: d.field::<$fty>(map, path, $key, {
                        #[allow(unused_mut, unused_assignments)]
                        let mut default: Option<$fty> = None;
                        $( default = Some($def); )?
                        default
                    }), )*
                })
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_follows_the_decoder() {
        let s = crate::spec::TrainingTask::schema();
        assert_eq!(s["required"], serde_json::json!(["apiVersion", "kind", "metadata", "spec"]));
        let compute = &s["properties"]["spec"]["properties"]["compute"];
        assert_eq!(
            compute["properties"]["resourceType"]["enum"],
            serde_json::json!(["Reserved", "Ondemand", "Spot", "Idle"])
        );
        assert_eq!(compute["properties"]["priority"]["default"], 5);
        assert_eq!(compute["additionalProperties"], false);
        let env = &s["properties"]["spec"]["properties"]["environment"]["properties"]["env"];
        assert_eq!(env["items"]["required"], serde_json::json!(["name", "value"]));
    }

    #[test]
    fn suggestions() {
        assert_eq!(suggest("mountpath", &["mountPath", "volume"]), Some("mountPath"));
        assert_eq!(suggest("volum", &["mountPath", "volume"]), Some("volume"));
        assert_eq!(suggest("zzz", &["mountPath", "volume"]), None);
        assert_eq!(suggest("Reservd", &["Reserved", "Spot"]), Some("Reserved"));
    }

    #[test]
    fn vec_keeps_going_after_a_bad_element() {
        let mut d = Decoder::default();
        let v: Value = serde_json::json!(["a", 1, "c", true]);
        let out = Vec::<String>::decode(&v, "xs", &mut d).unwrap();
        assert_eq!(out, vec!["a", "", "c", ""]);
        let paths: Vec<_> = d.report.problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(paths, ["xs[1]", "xs[3]"]);
        assert!(d.is_tainted("xs[1]") && !d.is_tainted("xs[0]"));
    }

    #[test]
    fn integers_are_range_checked() {
        let mut d = Decoder::default();
        assert_eq!(u32::decode(&serde_json::json!(-1), "n", &mut d), None);
        assert_eq!(u32::decode(&serde_json::json!(1.5), "n", &mut d), None);
        assert_eq!(u32::decode(&serde_json::json!(u64::MAX), "n", &mut d), None);
        assert_eq!(u32::decode(&serde_json::json!(7), "n", &mut d), Some(7));
        let codes: Vec<_> = d.report.problems.iter().map(|p| p.code).collect();
        assert_eq!(codes, [Code::OutOfRange, Code::WrongType, Code::OutOfRange]);
    }
}
