//! A validator for the part of JSON Schema (2020-12) the OpenAPI document uses: `$ref` into the document,
//! `type` (one or a list), `enum`, `properties`, `required`, `additionalProperties`, `items`, `prefixItems`,
//! `minItems`, `maxItems`, `minimum`, `maximum`, `anyOf`, `oneOf`. Any other keyword that is not an
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
                "minimum" | "maximum" => {
                    if let (Some(n), Some(bound)) = (value.as_f64(), arg.as_f64()) {
                        let ok = if keyword == "minimum" { n >= bound } else { n <= bound };
                        if !ok {
                            out.push(format!("{path}: {n} breaks {keyword} {bound}"));
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
    let pair = json!({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "number"}], "items": false, "minItems": 2, "maxItems": 2});
    assert!(v.errors(&pair, &json!([1, 2.5]), "$").is_empty());
    assert!(!v.errors(&pair, &json!([1.5, 2]), "$").is_empty());
    assert!(!v.errors(&pair, &json!([1, 2, 3]), "$").is_empty());
    let e = json!({"type": "array", "items": {"enum": ["x"]}});
    assert!(!v.errors(&e, &json!(["y"]), "$").is_empty());
}
