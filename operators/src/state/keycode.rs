//! An order-preserving encoding of keys, for the keys of a state in a
//! sorted store (RocksDB): keys that are close (consecutive ids, tuples that
//! share their first fields, strings that share a prefix) are close in the
//! store, so that what a stream writes at about the same time lands in a
//! narrow key range, a range of keys is a range of bytes, and the keys with
//! a string prefix are a prefix scan.
//!
//! The bytes of two values compare as the values do (`Ord` of the derived
//! kind: fields in order, variants by index), for every type made of
//! integers, `bool`, `char`, strings, byte strings, options, tuples,
//! structs, enums, sequences and maps; floats compare by their total order
//! (`f64::total_cmp`). The encoding is not self-describing: a key is decoded
//! as the type it was encoded from.
//!
//! | value | bytes |
//! | --- | --- |
//! | unsigned integer | big-endian, fixed width |
//! | signed integer | big-endian, fixed width, sign bit flipped |
//! | float | its bits, sign bit flipped (all bits if negative) |
//! | `bool`, `char` | one byte; the code point as `u32` |
//! | string, bytes | the bytes, `00` escaped as `00 FF`, then `00 00` |
//! | option | `00`, or `01` and the value |
//! | sequence, map | `01` and the element (key and value) per element, then `00` |
//! | tuple, struct | the fields in order |
//! | enum | the variant's index as `u32`, then its fields |

use serde::de::{self, DeserializeOwned, IntoDeserializer, Visitor};
use serde::ser::{self, Serialize};

/// A key that does not encode or decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct KeyCodeError(String);

impl ser::Error for KeyCodeError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        KeyCodeError(msg.to_string())
    }
}

impl de::Error for KeyCodeError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        KeyCodeError(msg.to_string())
    }
}

type Result<T> = std::result::Result<T, KeyCodeError>;

/// Appends the encoding of `key` to `out`.
///
/// # Errors
/// When the key's `Serialize` fails.
pub fn encode_into<K: Serialize + ?Sized>(key: &K, out: &mut Vec<u8>) -> Result<()> {
    let mut encoder = Encoder { out: std::mem::take(out) };
    let result = key.serialize(&mut encoder);
    *out = encoder.out;
    result
}

/// The encoding of `key`.
///
/// # Errors
/// When the key's `Serialize` fails.
pub fn encode<K: Serialize + ?Sized>(key: &K) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    encode_into(key, &mut out)?;
    Ok(out)
}

/// Decodes a key of type `K` from all of `bytes`.
///
/// # Errors
/// When the bytes are not the encoding of a `K` (bytes left over included).
pub fn decode<K: DeserializeOwned>(bytes: &[u8]) -> Result<K> {
    let mut decoder = Decoder { input: bytes };
    let key = K::deserialize(&mut decoder)?;
    if decoder.input.is_empty() {
        Ok(key)
    } else {
        Err(KeyCodeError(format!("{} bytes after the key", decoder.input.len())))
    }
}

#[derive(Debug)]
struct Encoder {
    out: Vec<u8>,
}

impl Encoder {
    fn escaped(&mut self, bytes: &[u8]) {
        for chunk in bytes.split_inclusive(|b| *b == 0) {
            self.out.extend_from_slice(chunk);
            if chunk.last() == Some(&0) {
                self.out.push(0xFF);
            }
        }
        self.out.extend_from_slice(&[0, 0]);
    }
}

macro_rules! unsigned {
    ($($method:ident $t:ty),*) => {$(
        fn $method(self, v: $t) -> Result<()> {
            self.out.extend_from_slice(&v.to_be_bytes());
            Ok(())
        }
    )*};
}

macro_rules! signed {
    ($($method:ident $t:ty),*) => {$(
        fn $method(self, v: $t) -> Result<()> {
            let mut bytes = v.to_be_bytes();
            bytes[0] ^= 0x80;
            self.out.extend_from_slice(&bytes);
            Ok(())
        }
    )*};
}

impl<'a> ser::Serializer for &'a mut Encoder {
    type Ok = ();
    type Error = KeyCodeError;
    type SerializeSeq = Elements<'a>;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Elements<'a>;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    unsigned!(serialize_u8 u8, serialize_u16 u16, serialize_u32 u32, serialize_u64 u64, serialize_u128 u128);
    signed!(serialize_i8 i8, serialize_i16 i16, serialize_i32 i32, serialize_i64 i64, serialize_i128 i128);

    fn serialize_bool(self, v: bool) -> Result<()> {
        self.out.push(u8::from(v));
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> Result<()> {
        let bits = v.to_bits();
        let bits = if bits >> 31 == 1 { !bits } else { bits ^ (1 << 31) };
        self.serialize_u32(bits)
    }
    fn serialize_f64(self, v: f64) -> Result<()> {
        let bits = v.to_bits();
        let bits = if bits >> 63 == 1 { !bits } else { bits ^ (1 << 63) };
        self.serialize_u64(bits)
    }
    fn serialize_char(self, v: char) -> Result<()> {
        self.serialize_u32(u32::from(v))
    }
    fn serialize_str(self, v: &str) -> Result<()> {
        self.escaped(v.as_bytes());
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<()> {
        self.escaped(v);
        Ok(())
    }
    fn serialize_none(self) -> Result<()> {
        self.out.push(0);
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<()> {
        self.out.push(1);
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<()> {
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<()> {
        Ok(())
    }
    fn serialize_unit_variant(self, _name: &'static str, index: u32, _variant: &'static str) -> Result<()> {
        self.serialize_u32(index)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _name: &'static str, value: &T) -> Result<()> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        index: u32,
        _variant: &'static str,
        value: &T,
    ) -> Result<()> {
        self.out.extend_from_slice(&index.to_be_bytes());
        value.serialize(self)
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Elements<'a>> {
        Ok(Elements { encoder: self })
    }
    fn serialize_tuple(self, _len: usize) -> Result<Self> {
        Ok(self)
    }
    fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> Result<Self> {
        Ok(self)
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self> {
        self.out.extend_from_slice(&index.to_be_bytes());
        Ok(self)
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Elements<'a>> {
        Ok(Elements { encoder: self })
    }
    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Self> {
        Ok(self)
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self> {
        self.out.extend_from_slice(&index.to_be_bytes());
        Ok(self)
    }
    fn is_human_readable(&self) -> bool {
        false
    }
}

/// The elements of a sequence or map: each after a `01`, a `00` at the end.
#[derive(Debug)]
pub struct Elements<'a> {
    encoder: &'a mut Encoder,
}

impl ser::SerializeSeq for Elements<'_> {
    type Ok = ();
    type Error = KeyCodeError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        self.encoder.out.push(1);
        value.serialize(&mut *self.encoder)
    }
    fn end(self) -> Result<()> {
        self.encoder.out.push(0);
        Ok(())
    }
}

impl ser::SerializeMap for Elements<'_> {
    type Ok = ();
    type Error = KeyCodeError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<()> {
        self.encoder.out.push(1);
        key.serialize(&mut *self.encoder)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        value.serialize(&mut *self.encoder)
    }
    fn end(self) -> Result<()> {
        self.encoder.out.push(0);
        Ok(())
    }
}

macro_rules! fields {
    ($($trait:ident $method:ident),*) => {$(
        impl ser::$trait for &mut Encoder {
            type Ok = ();
            type Error = KeyCodeError;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
                value.serialize(&mut **self)
            }
            fn end(self) -> Result<()> {
                Ok(())
            }
        }
    )*};
}

fields!(
    SerializeTuple serialize_element,
    SerializeTupleStruct serialize_field,
    SerializeTupleVariant serialize_field
);

macro_rules! named_fields {
    ($($trait:ident),*) => {$(
        impl ser::$trait for &mut Encoder {
            type Ok = ();
            type Error = KeyCodeError;
            fn serialize_field<T: Serialize + ?Sized>(&mut self, _key: &'static str, value: &T) -> Result<()> {
                value.serialize(&mut **self)
            }
            fn end(self) -> Result<()> {
                Ok(())
            }
        }
    )*};
}

named_fields!(SerializeStruct, SerializeStructVariant);

struct Decoder<'de> {
    input: &'de [u8],
}

impl<'de> Decoder<'de> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N]> {
        let Some((head, rest)) = self.input.split_first_chunk::<N>() else {
            return Err(KeyCodeError(format!("the key ends early: {N} bytes wanted, {} left", self.input.len())));
        };
        self.input = rest;
        Ok(*head)
    }

    fn byte(&mut self) -> Result<u8> {
        Ok(self.take::<1>()?[0])
    }

    /// Whether another element follows (`01`) or the elements end (`00`).
    fn more(&mut self) -> Result<bool> {
        match self.byte()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(KeyCodeError(format!("a marker byte {b:#04x} where 00 or 01 belongs"))),
        }
    }

    /// An escaped byte string, unescaped.
    fn escaped(&mut self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            let Some(zero) = self.input.iter().position(|b| *b == 0) else {
                return Err(KeyCodeError("a string of the key is not terminated".into()));
            };
            out.extend_from_slice(&self.input[..zero]);
            match self.input.get(zero + 1) {
                Some(0) => {
                    self.input = &self.input[zero + 2..];
                    return Ok(out);
                }
                Some(0xFF) => {
                    out.push(0);
                    self.input = &self.input[zero + 2..];
                }
                _ => return Err(KeyCodeError("a string of the key has a bad escape".into())),
            }
        }
    }
}

macro_rules! decode_unsigned {
    ($($method:ident $visit:ident $t:ty),*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
            visitor.$visit(<$t>::from_be_bytes(self.take()?))
        }
    )*};
}

macro_rules! decode_signed {
    ($($method:ident $visit:ident $t:ty),*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
            let mut bytes = self.take()?;
            bytes[0] ^= 0x80;
            visitor.$visit(<$t>::from_be_bytes(bytes))
        }
    )*};
}

impl<'de> de::Deserializer<'de> for &mut Decoder<'de> {
    type Error = KeyCodeError;

    decode_unsigned!(
        deserialize_u8 visit_u8 u8,
        deserialize_u16 visit_u16 u16,
        deserialize_u32 visit_u32 u32,
        deserialize_u64 visit_u64 u64,
        deserialize_u128 visit_u128 u128
    );
    decode_signed!(
        deserialize_i8 visit_i8 i8,
        deserialize_i16 visit_i16 i16,
        deserialize_i32 visit_i32 i32,
        deserialize_i64 visit_i64 i64,
        deserialize_i128 visit_i128 i128
    );

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value> {
        Err(KeyCodeError("keys are decoded as their own type: the encoding is not self-describing".into()))
    }
    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.byte()? {
            0 => visitor.visit_bool(false),
            1 => visitor.visit_bool(true),
            b => Err(KeyCodeError(format!("a bool of {b:#04x}"))),
        }
    }
    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let bits = u32::from_be_bytes(self.take()?);
        let bits = if bits >> 31 == 1 { bits ^ (1 << 31) } else { !bits };
        visitor.visit_f32(f32::from_bits(bits))
    }
    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let bits = u64::from_be_bytes(self.take()?);
        let bits = if bits >> 63 == 1 { bits ^ (1 << 63) } else { !bits };
        visitor.visit_f64(f64::from_bits(bits))
    }
    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let code = u32::from_be_bytes(self.take()?);
        let c = char::from_u32(code).ok_or_else(|| KeyCodeError(format!("{code:#x} is not a char")))?;
        visitor.visit_char(c)
    }
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let bytes = self.escaped()?;
        let s = String::from_utf8(bytes).map_err(|e| KeyCodeError(format!("a string of the key: {e}")))?;
        visitor.visit_string(s)
    }
    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.deserialize_str(visitor)
    }
    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_byte_buf(self.escaped()?)
    }
    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.deserialize_bytes(visitor)
    }
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        if self.more()? {
            visitor.visit_some(self)
        } else {
            visitor.visit_none()
        }
    }
    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_unit()
    }
    fn deserialize_unit_struct<V: Visitor<'de>>(self, _name: &'static str, visitor: V) -> Result<V::Value> {
        visitor.visit_unit()
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _name: &'static str, visitor: V) -> Result<V::Value> {
        visitor.visit_newtype_struct(self)
    }
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_seq(Marked { decoder: self })
    }
    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value> {
        visitor.visit_seq(Counted { decoder: self, left: len })
    }
    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value> {
        self.deserialize_tuple(len, visitor)
    }
    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_map(Marked { decoder: self })
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        self.deserialize_tuple(fields.len(), visitor)
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        visitor.visit_enum(self)
    }
    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.deserialize_u32(visitor)
    }
    fn deserialize_ignored_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value> {
        Err(KeyCodeError("keys are decoded as their own type: nothing in one can be skipped".into()))
    }
    fn is_human_readable(&self) -> bool {
        false
    }
}

/// Elements after marker bytes (sequences, maps).
struct Marked<'a, 'de> {
    decoder: &'a mut Decoder<'de>,
}

impl<'de> de::SeqAccess<'de> for Marked<'_, 'de> {
    type Error = KeyCodeError;
    fn next_element_seed<T: de::DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        if self.decoder.more()? {
            seed.deserialize(&mut *self.decoder).map(Some)
        } else {
            Ok(None)
        }
    }
}

impl<'de> de::MapAccess<'de> for Marked<'_, 'de> {
    type Error = KeyCodeError;
    fn next_key_seed<K: de::DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        if self.decoder.more()? {
            seed.deserialize(&mut *self.decoder).map(Some)
        } else {
            Ok(None)
        }
    }
    fn next_value_seed<V: de::DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        seed.deserialize(&mut *self.decoder)
    }
}

/// A known number of fields (tuples, structs, variants).
struct Counted<'a, 'de> {
    decoder: &'a mut Decoder<'de>,
    left: usize,
}

impl<'de> de::SeqAccess<'de> for Counted<'_, 'de> {
    type Error = KeyCodeError;
    fn next_element_seed<T: de::DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        seed.deserialize(&mut *self.decoder).map(Some)
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

impl<'de> de::EnumAccess<'de> for &mut Decoder<'de> {
    type Error = KeyCodeError;
    type Variant = Self;
    fn variant_seed<V: de::DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self)> {
        let index = u32::from_be_bytes(self.take()?);
        let variant = seed.deserialize(index.into_deserializer())?;
        Ok((variant, self))
    }
}

impl<'de> de::VariantAccess<'de> for &mut Decoder<'de> {
    type Error = KeyCodeError;
    fn unit_variant(self) -> Result<()> {
        Ok(())
    }
    fn newtype_variant_seed<T: de::DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value> {
        seed.deserialize(self)
    }
    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value> {
        de::Deserializer::deserialize_tuple(self, len, visitor)
    }
    fn struct_variant<V: Visitor<'de>>(self, fields: &'static [&'static str], visitor: V) -> Result<V::Value> {
        de::Deserializer::deserialize_tuple(self, fields.len(), visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
    enum Shape {
        Empty,
        One(i32),
        Pair(u8, String),
        Named { id: u64, tags: Vec<String> },
    }

    #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
    struct Composite {
        name: String,
        at: i64,
        maybe: Option<u16>,
        shape: Shape,
        bytes: Vec<u8>,
        flag: bool,
        c: char,
    }

    fn shape() -> impl Strategy<Value = Shape> {
        prop_oneof![
            Just(Shape::Empty),
            any::<i32>().prop_map(Shape::One),
            (any::<u8>(), "[a\\x00b]{0,4}").prop_map(|(a, b)| Shape::Pair(a, b)),
            (any::<u64>(), prop::collection::vec("[\\x00ab]{0,3}", 0..3))
                .prop_map(|(id, tags)| Shape::Named { id, tags }),
        ]
    }

    fn composite() -> impl Strategy<Value = Composite> {
        (
            "[\\x00a-c\u{e9}]{0,5}",
            any::<i64>(),
            any::<Option<u16>>(),
            shape(),
            prop::collection::vec(prop_oneof![Just(0u8), Just(1), Just(255), any::<u8>()], 0..5),
            any::<bool>(),
            any::<char>(),
        )
            .prop_map(|(name, at, maybe, shape, bytes, flag, c)| Composite {
                name,
                at,
                maybe,
                shape,
                bytes,
                flag,
                c,
            })
    }

    /// Checks that `a` and `b` round-trip and that their bytes compare as they do.
    fn agrees<T: Serialize + DeserializeOwned + Ord + std::fmt::Debug>(
        a: &T,
        b: &T,
    ) -> std::result::Result<(), TestCaseError> {
        let (ea, eb) = (encode(a).unwrap(), encode(b).unwrap());
        prop_assert_eq!(&decode::<T>(&ea).unwrap(), a);
        prop_assert_eq!(&decode::<T>(&eb).unwrap(), b);
        prop_assert_eq!(ea.cmp(&eb), a.cmp(b), "{:?} {:?}", a, b);
        Ok(())
    }

    proptest! {
        #[test]
        fn integers_order_as_bytes(a in any::<i64>(), b in any::<i64>(), c in any::<u32>(), d in any::<u32>()) {
            agrees(&a, &b)?;
            agrees(&c, &d)?;
            agrees(&(c, a), &(d, b))?;
        }

        #[test]
        fn strings_order_as_bytes(a in "[\\x00\\x01a\u{ff}]{0,6}", b in "[\\x00\\x01a\u{ff}]{0,6}") {
            agrees(&a, &b)?;
            agrees(&(a.clone(), 1u8), &(b.clone(), 0u8))?;
            agrees(&vec![a.clone(), b.clone()], &vec![b, a])?;
        }

        #[test]
        fn composites_order_as_bytes(a in composite(), b in composite()) {
            agrees(&a, &b)?;
        }

        #[test]
        fn floats_order_by_their_total_order(a in any::<f64>(), b in any::<f64>()) {
            let (ea, eb) = (encode(&a).unwrap(), encode(&b).unwrap());
            prop_assert_eq!(decode::<f64>(&ea).unwrap().to_bits(), a.to_bits());
            prop_assert_eq!(ea.cmp(&eb), a.total_cmp(&b));
        }

        #[test]
        fn a_string_prefix_is_a_byte_prefix(a in "[\\x00ab]{0,4}", b in "[\\x00ab]{0,4}") {
            let whole = encode(&format!("{a}{b}")).unwrap();
            let prefix = encode(&a).unwrap();
            // The prefix's bytes without its terminator begin the whole's.
            prop_assert!(whole.starts_with(&prefix[..prefix.len() - 2]));
        }

        #[test]
        fn damaged_keys_are_errors_not_panics(bytes in prop::collection::vec(any::<u8>(), 0..24)) {
            let _ = decode::<Composite>(&bytes);
            let _ = decode::<(u64, String)>(&bytes);
        }
    }

    #[test]
    fn consecutive_ids_are_adjacent_and_short_keys_fail_clearly() {
        assert_eq!(encode(&1000u64).unwrap(), [0, 0, 0, 0, 0, 0, 3, 0xE8]);
        assert_eq!(encode(&-1i8).unwrap(), [0x7F]);
        assert_eq!(encode("a\0").unwrap(), [b'a', 0, 0xFF, 0, 0]);
        assert!(decode::<u64>(&[1, 2]).unwrap_err().to_string().contains("ends early"));
        assert!(decode::<u8>(&[1, 2]).unwrap_err().to_string().contains("after the key"));
        assert!(decode::<String>(b"ab").unwrap_err().to_string().contains("not terminated"));
    }
}
