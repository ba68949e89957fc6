//! Identical slimmed specs kept once. Tasks submitted from one template differ mostly in what slimming drops,
//! and with tens of thousands queued, specs are most of the loop's memory. A spec is found by a hash of its
//! serde form and told apart from others of the same hash by comparing them whole. The form is walked into
//! bytes (every field as it is, with its structure: no text formatted, nothing escaped) hashed once at the
//! end; a keyed hash fed the many small pieces one by one costs as much as writing JSON.

use serde::Serialize;
use serde::ser;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Weak};
use trainyard_core::spec::TrainingTask;

#[derive(Debug, Default)]
pub(crate) struct SpecInterner {
    by_hash: HashMap<u64, Vec<Weak<TrainingTask>>>,
    /// Keyed per process: specs are the users' to choose, and a bucket of many is compared one by one.
    keys: RandomState,
    /// The walk's buffer, kept between specs.
    buf: Vec<u8>,
    /// Specs held (live or dead) at the last sweep of dead ones; the next sweep comes when they doubled.
    swept_at: usize,
    held: usize,
}

impl SpecInterner {
    /// The spec kept for one equal to `spec`, or `spec`, kept from now on.
    pub(crate) fn intern(&mut self, spec: Arc<TrainingTask>) -> Arc<TrainingTask> {
        let hash = hash_of(&self.keys, &mut self.buf, &*spec);
        if let Some(known) =
            self.by_hash.get(&hash).into_iter().flatten().filter_map(Weak::upgrade).find(|k| **k == *spec)
        {
            return known;
        }
        if self.held >= 2 * self.swept_at.max(512) {
            self.by_hash.retain(|_, specs| {
                specs.retain(|w| w.strong_count() > 0);
                !specs.is_empty()
            });
            self.held = self.by_hash.values().map(Vec::len).sum();
            self.swept_at = self.held;
        }
        self.by_hash.entry(hash).or_default().push(Arc::downgrade(&spec));
        self.held += 1;
        spec
    }

    #[cfg(test)]
    fn held(&self) -> usize {
        self.held
    }
}

/// A hash of everything `value` serialises, structure included (lengths, variants, which fields are there),
/// walked into `buf`.
fn hash_of<T: Serialize + ?Sized>(keys: &RandomState, buf: &mut Vec<u8>, value: &T) -> u64 {
    buf.clear();
    let mut walk = HashSer(std::mem::take(buf));
    let ok = value.serialize(&mut walk).is_ok();
    *buf = walk.0;
    // A value serde cannot serialise (none of the spec's) goes in one bucket, told apart by equality.
    if ok { keys.hash_one(&buf[..]) } else { 0 }
}

/// A serde serializer that writes what it is given, with its structure, as bytes to be hashed.
struct HashSer(Vec<u8>);

/// What the walk writes, in order.
impl HashSer {
    fn write(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
    fn write_u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn write_u64(&mut self, v: u64) {
        self.write(&v.to_le_bytes());
    }
    /// A string or byte string: its length first, so that where one ends is part of what is hashed.
    fn bytes(&mut self, b: &[u8]) {
        self.write_u64(b.len() as u64);
        self.write(b);
    }
}

#[derive(Debug)]
struct Unhashable;

impl std::fmt::Display for Unhashable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a value that cannot be hashed")
    }
}

impl std::error::Error for Unhashable {}

impl ser::Error for Unhashable {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        Unhashable
    }
}

/// Tags that keep apart values a plain walk would run together (`None` and `Some(())`, `[[1], [2]]` and
/// `[[1, 2]]`).
mod tag {
    pub const NONE: u8 = 0;
    pub const SOME: u8 = 1;
    pub const UNIT: u8 = 2;
    pub const SEQ: u8 = 3;
    pub const MAP: u8 = 4;
    pub const STRUCT: u8 = 5;
    pub const VARIANT: u8 = 6;
    pub const END: u8 = 7;
}

/// Integers, each written as the widest of its kind (its value, not its width, is what is hashed).
macro_rules! widened {
    ($($($method:ident($ty:ty)),* as $wide:ty;)*) => {
        $($(fn $method(self, v: $ty) -> Result<(), Unhashable> {
            self.write(&<$wide>::from(v).to_le_bytes());
            Ok(())
        })*)*
    };
}

impl ser::Serializer for &mut HashSer {
    type Ok = ();
    type Error = Unhashable;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    fn serialize_bool(self, v: bool) -> Result<(), Unhashable> {
        self.write_u8(v as u8);
        Ok(())
    }
    widened! {
        serialize_i8(i8), serialize_i16(i16), serialize_i32(i32), serialize_i64(i64) as i64;
        serialize_u8(u8), serialize_u16(u16), serialize_u32(u32), serialize_u64(u64) as u64;
    }
    fn serialize_f32(self, v: f32) -> Result<(), Unhashable> {
        self.serialize_f64(v.into())
    }
    fn serialize_f64(self, v: f64) -> Result<(), Unhashable> {
        self.write_u64(v.to_bits());
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), Unhashable> {
        self.write_u64(u32::from(v).into());
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), Unhashable> {
        self.bytes(v.as_bytes());
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Unhashable> {
        self.bytes(v);
        Ok(())
    }
    fn serialize_none(self) -> Result<(), Unhashable> {
        self.write_u8(tag::NONE);
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Unhashable> {
        self.write_u8(tag::SOME);
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Unhashable> {
        self.write_u8(tag::UNIT);
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), Unhashable> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(self, _: &'static str, i: u32, _: &'static str) -> Result<(), Unhashable> {
        self.write_u8(tag::VARIANT);
        self.write_u64(i.into());
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        v: &T,
    ) -> Result<(), Unhashable> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        i: u32,
        _: &'static str,
        v: &T,
    ) -> Result<(), Unhashable> {
        self.serialize_unit_variant("", i, "")?;
        v.serialize(self)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self, Unhashable> {
        self.write_u8(tag::SEQ);
        Ok(self)
    }
    fn serialize_tuple(self, len: usize) -> Result<Self, Unhashable> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<Self, Unhashable> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        i: u32,
        _: &'static str,
        len: usize,
    ) -> Result<Self, Unhashable> {
        self.serialize_unit_variant("", i, "")?;
        self.serialize_seq(Some(len))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self, Unhashable> {
        self.write_u8(tag::MAP);
        Ok(self)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, Unhashable> {
        self.write_u8(tag::STRUCT);
        Ok(self)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        i: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self, Unhashable> {
        self.serialize_unit_variant("", i, "")?;
        self.write_u8(tag::STRUCT);
        Ok(self)
    }
}

/// Every compound value: its elements in turn, then an end mark.
macro_rules! compound {
    ($($trait:ident { $($method:ident),* }),* $(,)?) => {
        $(impl ser::$trait for &mut HashSer {
            type Ok = ();
            type Error = Unhashable;
            $(fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Unhashable> {
                value.serialize(&mut **self)
            })*
            fn end(self) -> Result<(), Unhashable> {
                self.write_u8(tag::END);
                Ok(())
            }
        })*
    };
}

compound! {
    SerializeSeq { serialize_element },
    SerializeTuple { serialize_element },
    SerializeTupleStruct { serialize_field },
    SerializeTupleVariant { serialize_field },
    SerializeMap { serialize_key, serialize_value },
}

impl ser::SerializeStruct for &mut HashSer {
    type Ok = ();
    type Error = Unhashable;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Unhashable> {
        self.bytes(key.as_bytes());
        value.serialize(&mut **self)
    }
    fn skip_field(&mut self, key: &'static str) -> Result<(), Unhashable> {
        // A field left out (serde's skip_serializing_if) is not the same as one present.
        self.write_u8(tag::NONE);
        self.bytes(key.as_bytes());
        Ok(())
    }
    fn end(self) -> Result<(), Unhashable> {
        self.write_u8(tag::END);
        Ok(())
    }
}

impl ser::SerializeStructVariant for &mut HashSer {
    type Ok = ();
    type Error = Unhashable;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Unhashable> {
        ser::SerializeStruct::serialize_field(self, key, value)
    }
    fn end(self) -> Result<(), Unhashable> {
        self.write_u8(tag::END);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_core::spec::EnvVar;

    fn task(prefix: &str) -> TrainingTask {
        let mut t = TrainingTask::default();
        t.metadata.name_prefix = prefix.into();
        t
    }

    #[test]
    fn equal_specs_are_kept_once_and_different_ones_apart() {
        let mut i = SpecInterner::default();
        let a = i.intern(Arc::new(task("a")));
        let a2 = i.intern(Arc::new(task("a")));
        let b = i.intern(Arc::new(task("b")));
        assert!(Arc::ptr_eq(&a, &a2));
        assert!(!Arc::ptr_eq(&a, &b));
        assert_eq!(b.metadata.name_prefix, "b");
    }

    /// What the walk hashes.
    fn walked<T: Serialize>(value: &T) -> Vec<u8> {
        let mut walk = HashSer(Vec::new());
        value.serialize(&mut walk).unwrap();
        walk.0
    }

    #[test]
    fn structure_is_hashed_not_only_the_text() {
        // The same characters split differently between fields, or between elements, are walked apart.
        let (mut x, mut y) = (task("ab"), task("a"));
        x.metadata.description = Some(String::new());
        y.metadata.description = Some("b".into());
        assert_ne!(walked(&x), walked(&y));
        let env = |pairs: &[(&str, &str)]| -> Vec<EnvVar> {
            pairs
                .iter()
                .map(|(n, v)| EnvVar { name: (*n).into(), value: (*v).into(), hidden: false })
                .collect()
        };
        assert_ne!(walked(&env(&[("a", "b")])), walked(&env(&[("ab", "")])));
        assert_ne!(walked(&Some(())), walked(&Option::<()>::None));
        assert_ne!(walked(&vec![vec![1], vec![2]]), walked(&vec![vec![1, 2]]));
        assert_eq!(walked(&task("a")), walked(&task("a")));
        let (keys, mut buf) = (RandomState::new(), Vec::new());
        assert_eq!(hash_of(&keys, &mut buf, &task("a")), hash_of(&keys, &mut Vec::new(), &task("a")));
        assert_ne!(hash_of(&keys, &mut buf, &task("a")), hash_of(&keys, &mut buf, &task("b")));
    }

    #[test]
    fn specs_sharing_a_hash_are_told_apart_by_equality() {
        let mut i = SpecInterner::default();
        let (a, b) = (Arc::new(task("a")), Arc::new(task("b")));
        // `a` put in the bucket of `b`'s hash, as a collision would.
        let hash = hash_of(&i.keys, &mut Vec::new(), &*b);
        i.by_hash.entry(hash).or_default().push(Arc::downgrade(&a));
        let got = i.intern(b.clone());
        assert!(Arc::ptr_eq(&got, &b), "a spec is never swapped for a different one of the same hash");
    }

    #[test]
    fn dead_specs_are_swept_as_the_map_grows() {
        let mut i = SpecInterner::default();
        for n in 0..5_000 {
            drop(i.intern(Arc::new(task(&format!("t{n}")))));
        }
        assert!(i.held() < 1_100, "dead specs are swept: {} held", i.held());
        let kept = i.intern(Arc::new(task("kept")));
        for n in 0..5_000 {
            drop(i.intern(Arc::new(task(&format!("u{n}")))));
        }
        assert!(Arc::ptr_eq(&kept, &i.intern(Arc::new(task("kept")))), "a live spec survives sweeps");
    }
}
