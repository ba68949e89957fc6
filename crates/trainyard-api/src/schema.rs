//! JSON Schemas of the API's bodies, for the OpenAPI document. A body type implements [`ApiSchema`]. The
//! API's own answers are declared with `view!`, which makes the serde struct and its schema from one field
//! list, so what is sent and what the document says cannot part. Types of other crates, and request bodies
//! (parsed by serde, as strict as the schema says), list their JSON fields beside the type with
//! `object_schema!`; the OpenAPI test validates real answers and requests against these schemas, so a field
//! added to such a type and not to its list (or the reverse) fails it.
//!
//! A field's schema need not be its Rust type's: a `String` field that only ever holds a status has the
//! schema of [`Status`](trainyard_core::lifecycle::Status) so the document names the values, and
//! [`Optional`] marks a field serde leaves out when it is empty.

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

/// The type an `Option` holds: the schema of a field serde leaves out when it is `None` is that of what it
/// holds when present (not `null`).
pub trait SkipNone {
    type Inner;
}

impl<T> SkipNone for Option<T> {
    type Inner = T;
}

/// Declares an answer: the struct (`Debug` and `Serialize`, and any other derives listed) and its
/// [`ApiSchema`], a closed object named in the document's components, from one list of fields. The doc
/// comments on the struct are its doc and the schema's description; a field's doc is the field's only.
///
/// Each field is `"jsonKey" pub rust_name: RustType => SchemaType`, where the key may be left out when it
/// is the field's name, and `=> SchemaType` when the schema is the Rust type's. The key is serde's
/// (`rename`) and the schema's alike, and a field marked `#[serde(skip_serializing_if = "Option::is_none")]`
/// is left out of the JSON when `None` and out of the schema's `required`; so the keys an answer has are
/// the properties its schema lists. Struct-level `#[serde(IDENT)]` (`deny_unknown_fields`) and field-level
/// `#[serde(deserialize_with = "PATH")]` pass through for a view that is also read (with `Deserialize`
/// among the derives), and read under the same keys.
///
/// ```text
/// view! {
///     /// A task's place in line.
///     pub struct QueueView as "QueuePosition" {
///         pub position: u32,
///         "positionInGroup" pub position_in_group: u32,
///         "createdAtMs" pub created_at_ms: i64 => Millis,
///         #[serde(skip_serializing_if = "Option::is_none")]
///         pub reason: Option<String>,
///     }
/// }
/// ```
macro_rules! view {
    (
        $(#[doc = $doc:literal])*
        $(#[derive($($derive:path),* $(,)?)])?
        $(#[serde($container:ident)])?
        $vis:vis struct $name:ident as $schema_name:literal {
            $(
                $(#[doc = $fdoc:literal])*
                $(#[serde(skip_serializing_if = $skip:literal)])?
                $(#[serde(deserialize_with = $with:literal)])?
                $(#[serde(default = $default:literal)])?
                $($key:literal)? $fvis:vis $field:ident : $rty:ty $(=> $sty:ty)?
            ),* $(,)?
        }
    ) => {
        $(#[doc = $doc])*
        #[derive(Debug, serde::Serialize $($(, $derive)*)?)]
        $(#[serde($container)])?
        $vis struct $name {
            $(
                $(#[doc = $fdoc])*
                $(#[serde(skip_serializing_if = $skip)])?
                $(#[serde(deserialize_with = $with)])?
                $(#[serde(default = $default)])?
                $(#[serde(rename = $key)])?
                $fvis $field: $rty,
            )*
        }

        impl $crate::schema::ApiSchema for $name {
            fn schema(schemas: &mut $crate::schema::Schemas) -> serde_json::Value {
                $crate::schema::named(schemas, $schema_name, |schemas| {
                    let mut object = $crate::schema::Object::default();
                    $(object.field::<$crate::schema::view!(@schema $rty; $($sty)?; $($skip)?)>(
                        $crate::schema::view!(@key $field $($key)?),
                        schemas,
                    );)*
                    let description: &[&str] = &[$($doc.trim()),*];
                    object.finish(&description.join(" "), true)
                })
            }
        }
    };
    (@key $field:ident) => { stringify!($field) };
    (@key $field:ident $key:literal) => { $key };
    (@schema $rty:ty; ; ) => { $rty };
    (@schema $rty:ty; $sty:ty; ) => { $sty };
    (@schema $rty:ty; ; $skip:literal) => {
        $crate::schema::Optional<<$rty as $crate::schema::SkipNone>::Inner>
    };
    (@schema $rty:ty; $sty:ty; $skip:literal) => { $crate::schema::Optional<$sty> };
}
pub(crate) use view;

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

/// A tuple serialises as an array of fixed length: an element's schema by its place (`prefixItems`), the
/// length by `minItems` and `maxItems`. No `"items": false` for "nothing after them": `maxItems` already says
/// it, and client generators that read schemas as objects (openapi-python-client) refuse a boolean there.
fn tuple(items: Vec<Value>) -> Value {
    let n = items.len();
    json!({"type": "array", "prefixItems": items, "minItems": n, "maxItems": n})
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

    /// A tuple by its elements' places and its length, with no boolean schema in it.
    #[test]
    fn a_tuple_is_a_fixed_length_array() {
        let mut schemas = Schemas::new();
        assert_eq!(
            <(i64, String)>::schema(&mut schemas),
            json!({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "minItems": 2, "maxItems": 2})
        );
    }

    /// A schema type other than the field's own.
    struct Small;
    impl ApiSchema for Small {
        fn schema(_: &mut Schemas) -> Value {
            json!({"type": "integer", "maximum": 9})
        }
    }

    view! {
        /// A sample
        /// view.
        pub struct Sample as "Sample" {
            pub name: String,
            "createdAtMs" pub created_at_ms: i64 => Small,
            #[serde(skip_serializing_if = "Option::is_none")]
            "whenThere" pub when_there: Option<Vec<u32>>,
            pub always: Option<String>,
        }
    }

    /// The keys of a view's JSON are its schema's properties, those always there are the required ones, and
    /// each field has its schema.
    #[test]
    fn a_view_sends_what_its_schema_says() {
        let mut schemas = Schemas::new();
        assert_eq!(Sample::schema(&mut schemas), json!({"$ref": "#/components/schemas/Sample"}));
        let schema = &schemas["Sample"];
        let keys = |v: Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        let mut properties = keys(schema["properties"].clone());
        properties.sort();
        let full = Sample { name: "a".into(), created_at_ms: 1, when_there: Some(vec![1]), always: None };
        let mut sent = keys(serde_json::to_value(&full).unwrap());
        sent.sort();
        assert_eq!(sent, properties);
        let bare = Sample { when_there: None, ..full };
        assert_eq!(keys(serde_json::to_value(&bare).unwrap()), ["always", "createdAtMs", "name"]);
        assert_eq!(schema["required"], json!(["name", "createdAtMs", "always"]));
        assert_eq!(schema["properties"]["createdAtMs"], json!({"type": "integer", "maximum": 9}));
        assert_eq!(
            schema["properties"]["whenThere"],
            json!({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": u32::MAX}})
        );
        assert_eq!(schema["properties"]["always"], json!({"anyOf": [{"type": "string"}, {"type": "null"}]}));
        assert_eq!(
            (&schema["description"], &schema["additionalProperties"]),
            (&json!("A sample view."), &json!(false))
        );
    }
}
