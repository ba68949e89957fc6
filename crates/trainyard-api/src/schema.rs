//! JSON Schemas of the API's bodies, for the OpenAPI document. A body type implements [`ApiSchema`], most
//! through `object_schema!`, which lists the JSON fields beside the serde struct as `decode_struct!` does
//! for the task document; the OpenAPI test validates real answers against these schemas, so a field added
//! to a struct and not here (or the reverse) fails it.
//!
//! A field's type in the list is the type of its *schema*, which need not be its Rust type: a `String` field
//! that only ever holds a status is listed as [`Status`](trainyard_core::lifecycle::Status) so the document
//! names the values, and [`Optional`] marks a field serde leaves out when it is empty.

use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// The named schemas of a document (`components.schemas`), filled as types are described.
pub type Schemas = BTreeMap<String, Value>;

/// A type whose JSON form the OpenAPI document describes.
pub trait ApiSchema {
    /// The schema of this type's JSON. A named type defines itself once in `schemas` and answers a `$ref`.
    fn schema(schemas: &mut Schemas) -> Value;

    /// Whether an object field of this type is always present ([`Optional`] fields are not).
    const REQUIRED: bool = true;
}

/// The schema of `T`, as a plain function (the operation table holds these).
pub fn schema_of<T: ApiSchema>(schemas: &mut Schemas) -> Value {
    T::schema(schemas)
}

/// Defines `name` in `schemas` with the schema `build` makes (once), and answers a reference to it.
pub fn named(schemas: &mut Schemas, name: &str, build: impl FnOnce(&mut Schemas) -> Value) -> Value {
    if !schemas.contains_key(name) {
        // A placeholder first, so a type that refers to itself does not build forever.
        schemas.insert(name.to_owned(), Value::Null);
        let schema = build(schemas);
        schemas.insert(name.to_owned(), schema);
    }
    json!({"$ref": format!("#/components/schemas/{name}")})
}

/// A field serde leaves out when it has nothing (`skip_serializing_if`): not required, and when present
/// of `T`'s schema. Used only in schema lists, never as a value.
#[derive(Debug)]
pub struct Optional<T>(std::marker::PhantomData<T>);

impl<T: ApiSchema> ApiSchema for Optional<T> {
    const REQUIRED: bool = false;
    fn schema(schemas: &mut Schemas) -> Value {
        T::schema(schemas)
    }
}

/// Builds an object schema field by field.
#[derive(Debug, Default)]
pub struct Object {
    properties: Map<String, Value>,
    required: Vec<String>,
}

impl Object {
    pub fn field<T: ApiSchema>(&mut self, key: &str, schemas: &mut Schemas) {
        self.properties.insert(key.to_owned(), T::schema(schemas));
        if T::REQUIRED {
            self.required.push(key.to_owned());
        }
    }

    /// The schema; `closed` refuses fields not listed (answers are closed, so that drift is caught; request
    /// bodies are as strict as their parsers).
    pub fn finish(self, description: &str, closed: bool) -> Value {
        let mut schema = json!({"type": "object", "properties": self.properties, "required": self.required});
        if closed {
            schema["additionalProperties"] = Value::Bool(false);
        }
        if !description.is_empty() {
            schema["description"] = Value::String(description.to_owned());
        }
        schema
    }
}

/// Implements [`ApiSchema`] for a struct from its JSON fields: `"key": SchemaType`. `closed` objects refuse
/// other fields, `open` ones allow them. Doc comments on the invocation become the schema's description.
macro_rules! object_schema {
    ($(#[doc = $doc:literal])* $openness:ident $ty:ty as $name:literal { $( $key:literal : $fty:ty ),* $(,)? }) => {
        impl $crate::schema::ApiSchema for $ty {
            fn schema(schemas: &mut $crate::schema::Schemas) -> serde_json::Value {
                $crate::schema::named(schemas, $name, |schemas| {
                    #[allow(unused_mut)]
                    let mut object = $crate::schema::Object::default();
                    $( object.field::<$fty>($key, schemas); )*
                    let description: &[&str] = &[$($doc.trim()),*];
                    object.finish(&description.join(" "), $crate::schema::object_schema!(@closed $openness))
                })
            }
        }
    };
    (@closed closed) => { true };
    (@closed open) => { false };
}
pub(crate) use object_schema;

/// Implements [`ApiSchema`] for types whose schema is fixed JSON: `Type => json!(...)`.
macro_rules! fixed_schema {
    ($($ty:ty => $schema:expr),* $(,)?) => {
        $(impl ApiSchema for $ty {
            fn schema(_: &mut Schemas) -> Value {
                $schema
            }
        })*
    };
}

fixed_schema! {
    String => json!({"type": "string"}),
    str => json!({"type": "string"}),
    bool => json!({"type": "boolean"}),
    i64 => json!({"type": "integer"}),
    u16 => json!({"type": "integer", "minimum": 0, "maximum": u16::MAX}),
    u32 => json!({"type": "integer", "minimum": 0, "maximum": u32::MAX}),
    u64 => json!({"type": "integer", "minimum": 0}),
    usize => json!({"type": "integer", "minimum": 0}),
    f64 => json!({"type": "number"}),
}

impl<T: ApiSchema> ApiSchema for Option<T> {
    fn schema(schemas: &mut Schemas) -> Value {
        json!({"anyOf": [T::schema(schemas), {"type": "null"}]})
    }
}

impl<T: ApiSchema> ApiSchema for Vec<T> {
    fn schema(schemas: &mut Schemas) -> Value {
        json!({"type": "array", "items": T::schema(schemas)})
    }
}

/// Maps serialise as objects whatever their keys (numbers become strings).
impl<K, T: ApiSchema> ApiSchema for BTreeMap<K, T> {
    fn schema(schemas: &mut Schemas) -> Value {
        json!({"type": "object", "additionalProperties": T::schema(schemas)})
    }
}

/// A tuple serialises as an array of fixed length.
fn tuple(items: Vec<Value>) -> Value {
    let n = items.len();
    json!({"type": "array", "prefixItems": items, "items": false, "minItems": n, "maxItems": n})
}

impl<A: ApiSchema, B: ApiSchema> ApiSchema for (A, B) {
    fn schema(schemas: &mut Schemas) -> Value {
        tuple(vec![A::schema(schemas), B::schema(schemas)])
    }
}

impl<A: ApiSchema, B: ApiSchema, C: ApiSchema> ApiSchema for (A, B, C) {
    fn schema(schemas: &mut Schemas) -> Value {
        tuple(vec![A::schema(schemas), B::schema(schemas), C::schema(schemas)])
    }
}

/// Any JSON at all (only where the API passes on what another party wrote).
impl ApiSchema for Value {
    fn schema(_: &mut Schemas) -> Value {
        json!({})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stands for a serde struct: only its schema is looked at.
    struct Point;
    object_schema!(
        /// A point.
        closed Point as "Point" { "x": i64, "note": Optional<String> }
    );

    #[test]
    fn objects_are_named_once_and_optional_fields_are_not_required() {
        let mut schemas = Schemas::new();
        assert_eq!(Vec::<Point>::schema(&mut schemas)["items"]["$ref"], "#/components/schemas/Point");
        Point::schema(&mut schemas);
        assert_eq!(schemas.len(), 1);
        let point = &schemas["Point"];
        assert_eq!(point["required"], json!(["x"]));
        assert_eq!(point["additionalProperties"], false);
        assert_eq!(point["description"], "A point.");
        let _ = Point;
    }
}
