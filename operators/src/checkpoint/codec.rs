//! The state encoding: how operator state is written into checkpoints and
//! kept as bytes by the encoded and RocksDB backends.
//!
//! A compact, *self-describing* binary serde format: every value is a tag
//! byte and its payload, postcard's varints for integers and lengths, and
//! structs as their fields in order (no names). Self-describing means that a
//! type whose `Deserialize` asks the format what comes next
//! (`deserialize_any`: `rust_decimal::Decimal`, `serde_json::Value`,
//! untagged and internally tagged enums, `#[serde(flatten)]`, some chrono
//! formats) reads back what it wrote; postcard, which was the state encoding
//! until checkpoint format 5, cannot serve them, and their checkpoints did
//! not restore. Unlike MessagePack and CBOR, options are tagged on their
//! own (`Some(None)` and `Some(())` stay what they are), and 128-bit
//! integers are native. See the `state encoding` entry of the workspace's
//! Cargo.toml and BENCHMARKS.md for the choice and its cost.
//!
//! | tag | value | payload |
//! | --- | --- | --- |
//! | `00` | unit | |
//! | `01` `02` | `false` `true` | |
//! | `03` | `u8` | the byte |
//! | `04`–`07` | `u16` `u32` `u64` `u128` | LEB128 varint |
//! | `08` | `i8` | the byte |
//! | `09`–`0C` | `i16` `i32` `i64` `i128` | zigzag, then varint |
//! | `0D` `0E` | `f32` `f64` | little-endian bits |
//! | `0F` | `char` | its code point, varint |
//! | `10` `11` | string, bytes | length, then the bytes |
//! | `12` `13` | `None`, `Some` | (`Some`: the value) |
//! | `14` `15` | unit struct, newtype struct | (newtype: the value) |
//! | `16` `17` `18` | sequence, tuple, tuple struct | count, then the elements |
//! | `19` | map | count, then key and value per entry |
//! | `1A` | struct | count, then per field its name and value |
//! | `1B`–`1E` | unit, newtype, tuple, struct variant | variant index; then the value, or as a tuple or struct |
//! | `1F` `20` | sequence, map of unknown length | elements (entries), then `FF` |
//! | `21` `22` | struct, struct variant with skipped fields | as `1A`, `1E` |
//!
//! A field's name is written the first time a value holds it (`00`, its
//! length, its bytes), and after that as its place among the names written
//! before plus one: a struct of a struct's fields costs a byte a field more
//! than postcard's, a struct's first occurrence its names.
//!
//! Read by its own type, a struct's fields are read in order (a sequence,
//! what postcard gave); by `deserialize_any`, a struct is a map from its
//! field names and a variant a map of one entry (its index to its value),
//! the forms serde's buffered (untagged, internally tagged, flattened)
//! deserialization replays.
//!
//! ```
//! use highwater_operators::checkpoint::codec;
//! let price: rust_decimal::Decimal = "19.99".parse().unwrap();
//! let bytes = codec::to_vec(&(7u32, price)).unwrap();
//! assert_eq!(codec::from_slice::<(u32, rust_decimal::Decimal)>(&bytes).unwrap(), (7, price));
//! let json: serde_json::Value = serde_json::json!({"user": "u1", "n": [1, 2.5, null]});
//! assert_eq!(codec::from_slice::<serde_json::Value>(&codec::to_vec(&json).unwrap()).unwrap(), json);
//! ```

use serde::de::{self, Deserialize, DeserializeSeed, IntoDeserializer, Visitor};
use serde::ser::{self, Serialize};

/// A value that does not encode or decode in the state encoding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CodecError(pub String);

impl ser::Error for CodecError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        CodecError(msg.to_string())
    }
}

impl de::Error for CodecError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        CodecError(msg.to_string())
    }
}

type Result<T> = std::result::Result<T, CodecError>;

const UNIT: u8 = 0x00;
const FALSE: u8 = 0x01;
const TRUE: u8 = 0x02;
const U8: u8 = 0x03;
const U16: u8 = 0x04;
const U32: u8 = 0x05;
const U64: u8 = 0x06;
const U128: u8 = 0x07;
const I8: u8 = 0x08;
const I16: u8 = 0x09;
const I32: u8 = 0x0A;
const I64: u8 = 0x0B;
const I128: u8 = 0x0C;
const F32: u8 = 0x0D;
const F64: u8 = 0x0E;
const CHAR: u8 = 0x0F;
const STR: u8 = 0x10;
const BYTES: u8 = 0x11;
const NONE: u8 = 0x12;
const SOME: u8 = 0x13;
const UNIT_STRUCT: u8 = 0x14;
const NEWTYPE_STRUCT: u8 = 0x15;
const SEQ: u8 = 0x16;
const TUPLE: u8 = 0x17;
const TUPLE_STRUCT: u8 = 0x18;
const MAP: u8 = 0x19;
const STRUCT: u8 = 0x1A;
const UNIT_VARIANT: u8 = 0x1B;
const NEWTYPE_VARIANT: u8 = 0x1C;
const TUPLE_VARIANT: u8 = 0x1D;
const STRUCT_VARIANT: u8 = 0x1E;
const OPEN_SEQ: u8 = 0x1F;
const OPEN_MAP: u8 = 0x20;
const SPARSE_STRUCT: u8 = 0x21;
const SPARSE_STRUCT_VARIANT: u8 = 0x22;
const END: u8 = 0xFF;

/// `value` in the state encoding.
///
/// # Errors
/// When the value's `Serialize` fails, or says it has more or fewer
/// elements than it then writes.
pub fn to_vec<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(32);
    to_extend(value, &mut out)?;
    Ok(out)
}

/// Appends `value` in the state encoding to `out` (left as it was on an error).
///
/// # Errors
/// As [`to_vec`].
pub fn to_extend<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result<()> {
    let start = out.len();
    let result = value.serialize(&mut Encoder { out, names: Vec::new() });
    if result.is_err() {
        out.truncate(start);
    }
    result
}

/// The value that `bytes` encode, all of them.
///
/// # Errors
/// When the bytes are not one value of `T` in the state encoding.
pub fn from_slice<'de, T: de::Deserialize<'de>>(bytes: &'de [u8]) -> Result<T> {
    let (value, rest) = take_from_slice(bytes)?;
    if rest.is_empty() {
        Ok(value)
    } else {
        Err(CodecError(format!("{} bytes after the value", rest.len())))
    }
}

/// The first value that `bytes` encode, and the bytes after it.
///
/// # Errors
/// When the bytes do not begin with a value of `T` in the state encoding.
pub fn take_from_slice<'de, T: de::Deserialize<'de>>(bytes: &'de [u8]) -> Result<(T, &'de [u8])> {
    let mut decoder = Decoder::new(bytes);
    let value = T::deserialize(&mut decoder)?;
    Ok((value, decoder.input))
}

/// The encoder: appends to `out`.
struct Encoder<'a> {
    out: &'a mut Vec<u8>,
    /// The field names written so far (up to [`MAX_NAMES`]), referred to by
    /// their place after their first time.
    names: Vec<&'static str>,
}

/// How many field names a value's table of names holds.
const MAX_NAMES: usize = 64;

impl<'a> Encoder<'a> {
    fn varint(&mut self, mut n: u128) {
        while n >= 0x80 {
            self.out.push((n as u8) | 0x80);
            n >>= 7;
        }
        self.out.push(n as u8);
    }

    /// A field name: its place in the table of names plus one, or `0` and
    /// the name the first time.
    fn name(&mut self, name: &'static str) {
        match self.names.iter().position(|n| std::ptr::eq(*n, name)) {
            Some(i) => self.varint(i as u128 + 1),
            None => {
                self.varint(0);
                self.varint(name.len() as u128);
                self.out.extend_from_slice(name.as_bytes());
                if self.names.len() < MAX_NAMES {
                    self.names.push(name);
                }
            }
        }
    }

    fn tagged(&mut self, tag: u8, n: u128) {
        self.out.push(tag);
        self.varint(n);
    }

    fn zigzag(&mut self, tag: u8, n: i128) {
        self.tagged(tag, ((n << 1) ^ (n >> 127)) as u128);
    }

    fn compound<'e>(&'e mut self, tag: u8, open: u8, len: Option<usize>) -> Compound<'e, 'a> {
        let tag_at = self.out.len();
        match len {
            Some(len) => {
                self.tagged(tag, len as u128);
                Compound { encoder: self, left: Some(len), tag_at, sparse: 0 }
            }
            None => {
                self.out.push(open);
                Compound { encoder: self, left: None, tag_at, sparse: 0 }
            }
        }
    }

    /// A struct or struct variant: its fields, and the tag it takes if one
    /// is skipped.
    fn fields<'e>(&'e mut self, tag: u8, sparse: u8, index: Option<u32>, len: usize) -> Compound<'e, 'a> {
        let tag_at = self.out.len();
        self.out.push(tag);
        if let Some(index) = index {
            self.varint(index.into());
        }
        self.varint(len as u128);
        Compound { encoder: self, left: Some(len), tag_at, sparse }
    }
}

/// A sequence, map, tuple or struct being encoded: the elements still to
/// come (`None`: of unknown length, closed with `END`).
struct Compound<'e, 'a> {
    encoder: &'e mut Encoder<'a>,
    left: Option<usize>,
    /// Where its tag is.
    tag_at: usize,
    /// The tag of a struct with a skipped field (0: not a struct).
    sparse: u8,
}

impl Compound<'_, '_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        if let Some(left) = &mut self.left {
            *left = left.checked_sub(1).ok_or_else(|| CodecError("more elements than its length said".into()))?;
        }
        value.serialize(&mut *self.encoder)
    }

    /// A struct's field: its name, then its value.
    fn field<T: Serialize + ?Sized>(&mut self, name: &'static str, value: &T) -> Result<()> {
        if let Some(left) = &mut self.left {
            *left = left.checked_sub(1).ok_or_else(|| CodecError("more fields than its struct said".into()))?;
        }
        self.encoder.name(name);
        value.serialize(&mut *self.encoder)
    }

    /// A struct field its `Serialize` skipped (`skip_serializing_if`): the
    /// struct becomes sparse, read as a map of the fields present.
    fn skip(&mut self, name: &'static str) -> Result<()> {
        if self.sparse == 0 {
            return Err(CodecError("a skipped element outside a struct".into()));
        }
        // Its struct's length leaves it out already: the struct has fewer
        // fields than its type, so it is read by its fields' names.
        let _ = name;
        self.encoder.out[self.tag_at] = self.sparse;
        Ok(())
    }

    fn finish(self) -> Result<()> {
        match self.left {
            None => {
                self.encoder.out.push(END);
                Ok(())
            }
            Some(0) => Ok(()),
            Some(n) => Err(CodecError(format!("{n} elements fewer than its length said"))),
        }
    }
}

impl<'e, 'a> ser::Serializer for &'e mut Encoder<'a> {
    type Ok = ();
    type Error = CodecError;
    type SerializeSeq = Compound<'e, 'a>;
    type SerializeTuple = Compound<'e, 'a>;
    type SerializeTupleStruct = Compound<'e, 'a>;
    type SerializeTupleVariant = Compound<'e, 'a>;
    type SerializeMap = Compound<'e, 'a>;
    type SerializeStruct = Compound<'e, 'a>;
    type SerializeStructVariant = Compound<'e, 'a>;

    fn is_human_readable(&self) -> bool {
        false
    }

    fn serialize_bool(self, v: bool) -> Result<()> {
        self.out.push(if v { TRUE } else { FALSE });
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<()> {
        self.out.extend_from_slice(&[I8, v as u8]);
        Ok(())
    }
    fn serialize_i16(self, v: i16) -> Result<()> {
        self.zigzag(I16, v.into());
        Ok(())
    }
    fn serialize_i32(self, v: i32) -> Result<()> {
        self.zigzag(I32, v.into());
        Ok(())
    }
    fn serialize_i64(self, v: i64) -> Result<()> {
        self.zigzag(I64, v.into());
        Ok(())
    }
    fn serialize_i128(self, v: i128) -> Result<()> {
        self.zigzag(I128, v);
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> Result<()> {
        self.out.extend_from_slice(&[U8, v]);
        Ok(())
    }
    fn serialize_u16(self, v: u16) -> Result<()> {
        self.tagged(U16, v.into());
        Ok(())
    }
    fn serialize_u32(self, v: u32) -> Result<()> {
        self.tagged(U32, v.into());
        Ok(())
    }
    fn serialize_u64(self, v: u64) -> Result<()> {
        self.tagged(U64, v.into());
        Ok(())
    }
    fn serialize_u128(self, v: u128) -> Result<()> {
        self.tagged(U128, v);
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> Result<()> {
        self.out.push(F32);
        self.out.extend_from_slice(&v.to_le_bytes());
        Ok(())
    }
    fn serialize_f64(self, v: f64) -> Result<()> {
        self.out.push(F64);
        self.out.extend_from_slice(&v.to_le_bytes());
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<()> {
        self.tagged(CHAR, u32::from(v).into());
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<()> {
        self.tagged(STR, v.len() as u128);
        self.out.extend_from_slice(v.as_bytes());
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<()> {
        self.tagged(BYTES, v.len() as u128);
        self.out.extend_from_slice(v);
        Ok(())
    }
    fn serialize_none(self) -> Result<()> {
        self.out.push(NONE);
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<()> {
        self.out.push(SOME);
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<()> {
        self.out.push(UNIT);
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<()> {
        self.out.push(UNIT_STRUCT);
        Ok(())
    }
    fn serialize_unit_variant(self, _name: &'static str, index: u32, _variant: &'static str) -> Result<()> {
        self.tagged(UNIT_VARIANT, index.into());
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _name: &'static str, value: &T) -> Result<()> {
        self.out.push(NEWTYPE_STRUCT);
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        index: u32,
        _variant: &'static str,
        value: &T,
    ) -> Result<()> {
        self.tagged(NEWTYPE_VARIANT, index.into());
        value.serialize(self)
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Compound<'e, 'a>> {
        Ok(self.compound(SEQ, OPEN_SEQ, len))
    }
    fn serialize_tuple(self, len: usize) -> Result<Compound<'e, 'a>> {
        Ok(self.compound(TUPLE, OPEN_SEQ, Some(len)))
    }
    fn serialize_tuple_struct(self, _name: &'static str, len: usize) -> Result<Compound<'e, 'a>> {
        Ok(self.compound(TUPLE_STRUCT, OPEN_SEQ, Some(len)))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        index: u32,
        _variant: &'static str,
        len: usize,
    ) -> Result<Compound<'e, 'a>> {
        Ok(self.fields(TUPLE_VARIANT, 0, Some(index), len))
    }
    fn serialize_map(self, len: Option<usize>) -> Result<Compound<'e, 'a>> {
        // A map's count is of entries; `element` counts keys and values.
        let mut map = self.compound(MAP, OPEN_MAP, len);
        map.left = map.left.map(|n| n * 2);
        Ok(map)
    }
    fn serialize_struct(self, _name: &'static str, len: usize) -> Result<Compound<'e, 'a>> {
        Ok(self.fields(STRUCT, SPARSE_STRUCT, None, len))
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        index: u32,
        _variant: &'static str,
        len: usize,
    ) -> Result<Compound<'e, 'a>> {
        Ok(self.fields(STRUCT_VARIANT, SPARSE_STRUCT_VARIANT, Some(index), len))
    }
}

impl ser::SerializeSeq for Compound<'_, '_> {
    type Ok = ();
    type Error = CodecError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        self.element(value)
    }
    fn end(self) -> Result<()> {
        self.finish()
    }
}

impl ser::SerializeTuple for Compound<'_, '_> {
    type Ok = ();
    type Error = CodecError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        self.element(value)
    }
    fn end(self) -> Result<()> {
        self.finish()
    }
}

impl ser::SerializeTupleStruct for Compound<'_, '_> {
    type Ok = ();
    type Error = CodecError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        self.element(value)
    }
    fn end(self) -> Result<()> {
        self.finish()
    }
}

impl ser::SerializeTupleVariant for Compound<'_, '_> {
    type Ok = ();
    type Error = CodecError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        self.element(value)
    }
    fn end(self) -> Result<()> {
        self.finish()
    }
}

impl ser::SerializeMap for Compound<'_, '_> {
    type Ok = ();
    type Error = CodecError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<()> {
        self.element(key)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<()> {
        self.element(value)
    }
    fn end(self) -> Result<()> {
        self.finish()
    }
}

impl ser::SerializeStruct for Compound<'_, '_> {
    type Ok = ();
    type Error = CodecError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<()> {
        self.field(key, value)
    }
    fn skip_field(&mut self, key: &'static str) -> Result<()> {
        self.skip(key)
    }
    fn end(self) -> Result<()> {
        self.finish()
    }
}

impl ser::SerializeStructVariant for Compound<'_, '_> {
    type Ok = ();
    type Error = CodecError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<()> {
        self.field(key, value)
    }
    fn skip_field(&mut self, key: &'static str) -> Result<()> {
        self.skip(key)
    }
    fn end(self) -> Result<()> {
        self.finish()
    }
}

/// The decoder: reads from `input`.
struct Decoder<'de> {
    input: &'de [u8],
    /// The field names read so far (as the encoder's table).
    names: Vec<&'de str>,
}

impl<'de> Decoder<'de> {
    fn new(input: &'de [u8]) -> Self {
        Decoder { input, names: Vec::new() }
    }

    fn byte(&mut self) -> Result<u8> {
        let (&b, rest) = self.input.split_first().ok_or_else(|| CodecError("the value is cut short".into()))?;
        self.input = rest;
        Ok(b)
    }

    fn peek(&self) -> Result<u8> {
        self.input.first().copied().ok_or_else(|| CodecError("the value is cut short".into()))
    }

    fn varint(&mut self) -> Result<u128> {
        let mut n = 0u128;
        for shift in (0..128).step_by(7) {
            let b = self.byte()?;
            n |= u128::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(n);
            }
        }
        Err(CodecError("a varint longer than 128 bits".into()))
    }

    fn zigzag(&mut self) -> Result<i128> {
        let n = self.varint()?;
        Ok((n >> 1) as i128 ^ -((n & 1) as i128))
    }

    fn len(&mut self) -> Result<usize> {
        let n = self.varint()?;
        usize::try_from(n).map_err(|_| CodecError(format!("a length of {n}")))
    }

    fn take(&mut self, n: usize) -> Result<&'de [u8]> {
        if n > self.input.len() {
            return Err(CodecError(format!("{n} bytes announced, {} left", self.input.len())));
        }
        let (taken, rest) = self.input.split_at(n);
        self.input = rest;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    fn bytes(&mut self) -> Result<&'de [u8]> {
        let n = self.len()?;
        self.take(n)
    }

    fn str(&mut self) -> Result<&'de str> {
        std::str::from_utf8(self.bytes()?).map_err(|e| CodecError(format!("a string that is not UTF-8: {e}")))
    }

    /// A struct field's name (see `Encoder::name`).
    fn name(&mut self) -> Result<&'de str> {
        match self.len()? {
            0 => {
                let name = self.str()?;
                if self.names.len() < MAX_NAMES {
                    self.names.push(name);
                }
                Ok(name)
            }
            n => self.names.get(n - 1).copied().ok_or_else(|| CodecError(format!("field name {n} unknown"))),
        }
    }

    /// The elements of a sequence-like value whose tag was just read.
    fn elements(&mut self, tag: u8) -> Result<Elements<'_, 'de>> {
        let left = if tag == OPEN_SEQ || tag == OPEN_MAP { None } else { Some(self.len()?) };
        Ok(Elements { decoder: self, left, pairs: tag == MAP || tag == OPEN_MAP, named: false })
    }

    /// The fields of a struct (or struct variant) whose tag (and index)
    /// were just read, in order, their names passed over.
    fn fields_in_order(&mut self) -> Result<Elements<'_, 'de>> {
        let left = Some(self.len()?);
        Ok(Elements { decoder: self, left, pairs: false, named: true })
    }

    /// Visits a sequence-like value's elements; skips what the visitor left.
    fn visit_elements<V: Visitor<'de>>(mut elements: Elements<'_, 'de>, visitor: V) -> Result<V::Value> {
        let value =
            if elements.pairs { visitor.visit_map(&mut elements)? } else { visitor.visit_seq(&mut elements)? };
        elements.rest()?;
        Ok(value)
    }

    /// Visits the fields of a struct (whose tag and index were just read)
    /// as a map from their names to their values, leaving out the skipped.
    fn visit_named<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value> {
        let left = self.len()?;
        StructFields { decoder: self, left }.visit(visitor)
    }

    /// Visits the fields of a struct whose tag (and index) were just read:
    /// in order, as postcard gave them (any struct reader takes a
    /// sequence), names passed over, if there are as many as its type has
    /// (`fields`); else as a map by name (the missing take their defaults).
    fn visit_struct<V: Visitor<'de>>(&mut self, fields: &'static [&'static str], visitor: V) -> Result<V::Value> {
        let mut count = Decoder::new(self.input);
        if count.len()? == fields.len() {
            let elements = self.fields_in_order()?;
            Decoder::visit_elements(elements, visitor)
        } else {
            self.visit_named(visitor)
        }
    }

    /// Skips one value.
    fn skip(&mut self) -> Result<()> {
        de::IgnoredAny::deserialize(&mut *self).map(drop)
    }

    fn value<V: Visitor<'de>>(&mut self, tag: u8, visitor: V) -> Result<V::Value> {
        match tag {
            UNIT | UNIT_STRUCT => visitor.visit_unit(),
            FALSE => visitor.visit_bool(false),
            TRUE => visitor.visit_bool(true),
            U8 => visitor.visit_u8(self.byte()?),
            U16 => visitor.visit_u16(int(self.varint()?)?),
            U32 => visitor.visit_u32(int(self.varint()?)?),
            U64 => visitor.visit_u64(int(self.varint()?)?),
            // As 64 bits where they fit: serde's buffered readers (untagged
            // enums) have no 128-bit integers; a 128-bit reader takes both.
            U128 => match self.varint()? {
                n if n <= u128::from(u64::MAX) => visitor.visit_u64(n as u64),
                n => visitor.visit_u128(n),
            },
            I8 => visitor.visit_i8(self.byte()? as i8),
            I16 => visitor.visit_i16(int(self.zigzag()?)?),
            I32 => visitor.visit_i32(int(self.zigzag()?)?),
            I64 => visitor.visit_i64(int(self.zigzag()?)?),
            I128 => match self.zigzag()? {
                n if i64::try_from(n).is_ok() => visitor.visit_i64(n as i64),
                n => visitor.visit_i128(n),
            },
            F32 => visitor.visit_f32(f32::from_le_bytes(self.array()?)),
            F64 => visitor.visit_f64(f64::from_le_bytes(self.array()?)),
            CHAR => {
                let n: u32 = int(self.varint()?)?;
                visitor.visit_char(char::from_u32(n).ok_or_else(|| CodecError(format!("a char of {n:#x}")))?)
            }
            STR => visitor.visit_borrowed_str(self.str()?),
            BYTES => visitor.visit_borrowed_bytes(self.bytes()?),
            NONE => visitor.visit_none(),
            SOME => visitor.visit_some(self),
            NEWTYPE_STRUCT => visitor.visit_newtype_struct(self),
            SEQ | TUPLE | TUPLE_STRUCT | OPEN_SEQ | MAP | OPEN_MAP => {
                let elements = self.elements(tag)?;
                Self::visit_elements(elements, visitor)
            }
            // A struct as a map of its fields' names: what serde's buffered
            // (untagged, internally tagged, flattened) readers take.
            STRUCT | SPARSE_STRUCT => self.visit_named(visitor),
            UNIT_VARIANT | NEWTYPE_VARIANT | TUPLE_VARIANT | STRUCT_VARIANT | SPARSE_STRUCT_VARIANT => {
                // As a map of one entry, the variant's index to its value.
                let index: u32 = int(self.varint()?)?;
                visitor.visit_map(VariantAsMap { decoder: self, tag, index: Some(index) })
            }
            other => Err(CodecError(format!("a value of unknown kind {other:#04x}"))),
        }
    }
}

/// An integer of another width, if it fits.
fn int<T: TryFrom<N>, N: Copy + std::fmt::Display>(n: N) -> Result<T> {
    T::try_from(n).map_err(|_| CodecError(format!("integer {n} out of range")))
}

/// The elements of a sequence, the entries of a map, or the fields of a
/// struct in order, being decoded.
struct Elements<'a, 'de> {
    decoder: &'a mut Decoder<'de>,
    /// Elements (entries of a map) still to read; `None`: until `END`.
    left: Option<usize>,
    /// Whether the elements are a map's entries (a key and a value each).
    pairs: bool,
    /// Whether each element is a struct field's name and value.
    named: bool,
}

impl Elements<'_, '_> {
    /// Whether another element follows (consuming the `END` if not, and
    /// the field's name if named).
    fn more(&mut self) -> Result<bool> {
        let more = match &mut self.left {
            Some(0) => false,
            Some(n) => {
                *n -= 1;
                true
            }
            None => {
                if self.decoder.peek()? == END {
                    self.decoder.byte()?;
                    self.left = Some(0);
                    false
                } else {
                    true
                }
            }
        };
        if more && self.named {
            self.decoder.name()?;
        }
        Ok(more)
    }

    /// Skips the elements the visitor did not read (fields a newer program
    /// wrote that this one does not know).
    fn rest(&mut self) -> Result<()> {
        while self.more()? {
            self.decoder.skip()?;
            if self.pairs {
                self.decoder.skip()?;
            }
        }
        Ok(())
    }
}

impl<'de> de::SeqAccess<'de> for Elements<'_, 'de> {
    type Error = CodecError;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        if !self.more()? {
            return Ok(None);
        }
        seed.deserialize(&mut *self.decoder).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        // Each element takes a byte at least.
        self.left.map(|n| n.min(self.decoder.input.len()))
    }
}

impl<'de> de::MapAccess<'de> for Elements<'_, 'de> {
    type Error = CodecError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        if !self.more()? {
            return Ok(None);
        }
        seed.deserialize(&mut *self.decoder).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        seed.deserialize(&mut *self.decoder)
    }

    fn size_hint(&self) -> Option<usize> {
        self.left.map(|n| n.min(self.decoder.input.len() / 2))
    }
}

/// The fields of a struct read as a map from their names to their values
/// (a skipped field is not there: its reader takes its default).
struct StructFields<'a, 'de> {
    decoder: &'a mut Decoder<'de>,
    left: usize,
}

impl<'de> StructFields<'_, 'de> {
    fn visit<V: Visitor<'de>>(mut self, visitor: V) -> Result<V::Value> {
        let value = visitor.visit_map(&mut self)?;
        while self.left > 0 {
            self.left -= 1;
            self.decoder.name()?;
            self.decoder.skip()?;
        }
        Ok(value)
    }
}

impl<'de> de::MapAccess<'de> for &mut StructFields<'_, 'de> {
    type Error = CodecError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        let name = self.decoder.name()?;
        seed.deserialize(de::value::BorrowedStrDeserializer::<CodecError>::new(name)).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        seed.deserialize(&mut *self.decoder)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

/// A variant read by `deserialize_any`: a map of one entry.
struct VariantAsMap<'a, 'de> {
    decoder: &'a mut Decoder<'de>,
    tag: u8,
    index: Option<u32>,
}

impl<'de> de::MapAccess<'de> for VariantAsMap<'_, 'de> {
    type Error = CodecError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        match self.index.take() {
            // As a u64: serde's buffered identifiers are u8, u64 or names.
            Some(index) => seed.deserialize(u64::from(index).into_deserializer()).map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        match self.tag {
            UNIT_VARIANT => seed.deserialize(().into_deserializer()),
            NEWTYPE_VARIANT => seed.deserialize(&mut *self.decoder),
            tag => seed.deserialize(Fields { decoder: &mut *self.decoder, tag }),
        }
    }
}

/// The fields of a tuple variant (count, then the fields) or struct
/// variant (count, then names and fields), as a value of their own.
struct Fields<'a, 'de> {
    decoder: &'a mut Decoder<'de>,
    tag: u8,
}

impl<'de> de::Deserializer<'de> for Fields<'_, 'de> {
    type Error = CodecError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        if self.tag == TUPLE_VARIANT {
            let elements = self.decoder.elements(SEQ)?;
            Decoder::visit_elements(elements, visitor)
        } else {
            self.decoder.visit_named(visitor)
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

impl<'de> de::Deserializer<'de> for &mut Decoder<'de> {
    type Error = CodecError;

    fn is_human_readable(&self) -> bool {
        false
    }

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let tag = self.byte()?;
        self.value(tag, visitor)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        let tag = self.byte()?;
        match tag {
            STRUCT => self.visit_struct(fields, visitor),
            // With skipped fields: a map of the fields present, by name.
            other => self.value(other, visitor),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        let tag = self.byte()?;
        match tag {
            UNIT_VARIANT | NEWTYPE_VARIANT | TUPLE_VARIANT | STRUCT_VARIANT | SPARSE_STRUCT_VARIANT => {
                let index: u32 = int(self.varint()?)?;
                visitor.visit_enum(Variant { decoder: self, tag, index })
            }
            other => self.value(other, visitor),
        }
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        // A unit variant read as an identifier (an adjacently tagged enum's
        // tag): its index.
        if self.peek()? == UNIT_VARIANT {
            self.byte()?;
            let index: u32 = int(self.varint()?)?;
            return visitor.visit_u32(index);
        }
        de::Deserializer::deserialize_any(self, visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let tag = self.byte()?;
        match tag {
            UNIT | UNIT_STRUCT | FALSE | TRUE | NONE => {}
            U8 | I8 => {
                self.byte()?;
            }
            U16 | U32 | U64 | U128 | I16 | I32 | I64 | I128 | CHAR | UNIT_VARIANT => {
                self.varint()?;
            }
            F32 => {
                self.take(4)?;
            }
            F64 => {
                self.take(8)?;
            }
            STR | BYTES => {
                self.bytes()?;
            }
            SOME | NEWTYPE_STRUCT => self.skip()?,
            NEWTYPE_VARIANT => {
                self.varint()?;
                self.skip()?;
            }
            SEQ | TUPLE | TUPLE_STRUCT | OPEN_SEQ | MAP | OPEN_MAP => self.elements(tag)?.rest()?,
            TUPLE_VARIANT => {
                self.varint()?;
                self.elements(SEQ)?.rest()?;
            }
            STRUCT | SPARSE_STRUCT => self.fields_in_order()?.rest()?,
            STRUCT_VARIANT | SPARSE_STRUCT_VARIANT => {
                self.varint()?;
                self.fields_in_order()?.rest()?;
            }
            other => return Err(CodecError(format!("a value of unknown kind {other:#04x}"))),
        }
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map
    }
}

/// A variant read by `deserialize_enum`.
struct Variant<'a, 'de> {
    decoder: &'a mut Decoder<'de>,
    tag: u8,
    index: u32,
}

impl<'a, 'de> de::EnumAccess<'de> for Variant<'a, 'de> {
    type Error = CodecError;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self)> {
        let value = seed.deserialize(self.index.into_deserializer())?;
        Ok((value, self))
    }
}

impl<'de> de::VariantAccess<'de> for Variant<'_, 'de> {
    type Error = CodecError;

    fn unit_variant(self) -> Result<()> {
        match self.tag {
            UNIT_VARIANT => Ok(()),
            _ => Err(CodecError(format!("variant {} holds a value, a unit variant was expected", self.index))),
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value> {
        match self.tag {
            NEWTYPE_VARIANT => seed.deserialize(self.decoder),
            _ => Err(CodecError(format!("variant {} is not a newtype variant", self.index))),
        }
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value> {
        match self.tag {
            TUPLE_VARIANT => {
                let elements = self.decoder.elements(SEQ)?;
                Decoder::visit_elements(elements, visitor)
            }
            _ => Err(CodecError(format!("variant {} is not a tuple variant", self.index))),
        }
    }

    fn struct_variant<V: Visitor<'de>>(self, fields: &'static [&'static str], visitor: V) -> Result<V::Value> {
        match self.tag {
            STRUCT_VARIANT => self.decoder.visit_struct(fields, visitor),
            SPARSE_STRUCT_VARIANT => self.decoder.visit_named(visitor),
            _ => Err(CodecError(format!("variant {} is not a struct variant", self.index))),
        }
    }
}

/// Whether `tag` begins a sequence or tuple with a count (whose elements
/// follow [`skip_count`]).
pub(crate) fn is_sequence(tag: u8) -> bool {
    matches!(tag, SEQ | TUPLE | TUPLE_STRUCT)
}

/// The bytes after a count (a varint).
pub(crate) fn skip_count(bytes: &[u8]) -> Result<&[u8]> {
    let mut decoder = Decoder::new(bytes);
    decoder.len()?;
    Ok(decoder.input)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use proptest::prelude::*;
    use rust_decimal::Decimal;
    use serde::{Deserialize, Serialize};

    use super::*;

    fn round_trip<T: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug>(value: &T) {
        let bytes = to_vec(value).unwrap();
        let back: T = from_slice(&bytes).unwrap_or_else(|e| panic!("{value:?} does not decode: {e} ({bytes:02x?})"));
        assert_eq!(&back, value, "{bytes:02x?}");
        // Skipping it (as an unknown field is skipped) takes every byte.
        let mut decoder = Decoder::new(&bytes);
        decoder.skip().unwrap();
        assert!(decoder.input.is_empty(), "skipping {value:?} left {:?}", decoder.input);
    }

    #[derive(Serialize, Deserialize, PartialEq, Debug, Clone)]
    #[serde(untagged)]
    enum Untagged {
        Number(i64),
        Price { amount: Decimal, currency: String },
        Pair(u8, String),
        Text(String),
    }

    #[derive(Serialize, Deserialize, PartialEq, Debug, Clone)]
    #[serde(tag = "type")]
    enum Internal {
        Click { user: u32, at: Option<u64> },
        View(Inner),
        Quit,
    }

    #[derive(Serialize, Deserialize, PartialEq, Debug, Clone)]
    #[serde(tag = "t", content = "c")]
    enum Adjacent {
        A(u64),
        B { x: i32, y: Vec<u8> },
        C,
    }

    #[derive(Serialize, Deserialize, PartialEq, Debug, Clone)]
    struct Inner {
        id: u64,
        tags: Vec<String>,
    }

    #[derive(Serialize, Deserialize, PartialEq, Debug, Clone)]
    struct Flattened {
        name: String,
        #[serde(flatten)]
        inner: Inner,
        #[serde(flatten)]
        rest: BTreeMap<String, serde_json::Value>,
    }

    #[derive(Serialize, Deserialize, PartialEq, Debug, Clone)]
    struct Sparse {
        a: u32,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        b: Option<String>,
        #[serde(skip_serializing_if = "Vec::is_empty", default)]
        c: Vec<u8>,
        d: (),
    }

    #[derive(Serialize, Deserialize, PartialEq, Debug, Clone)]
    enum External {
        Unit,
        New(Decimal),
        Tuple(u8, i128),
        Struct { a: u128, b: Sparse },
    }

    #[test]
    fn types_that_need_a_self_describing_format_round_trip() {
        round_trip(&"19.99".parse::<Decimal>().unwrap());
        round_trip(&Decimal::MAX);
        round_trip(&serde_json::json!({"a": [1, -2, 3.5, null, true, "x"], "b": {"c": u64::MAX}}));
        round_trip(&Untagged::Number(-4));
        round_trip(&Untagged::Price { amount: "0.10".parse().unwrap(), currency: "EUR".into() });
        round_trip(&Untagged::Pair(7, "x".into()));
        round_trip(&Untagged::Text("t".into()));
        round_trip(&Internal::Click { user: 3, at: Some(9) });
        round_trip(&Internal::View(Inner { id: 1, tags: vec!["a".into()] }));
        round_trip(&Internal::Quit);
        round_trip(&Adjacent::A(5));
        round_trip(&Adjacent::B { x: -1, y: vec![1, 2] });
        round_trip(&Adjacent::C);
        let mut rest = BTreeMap::new();
        rest.insert("extra".to_owned(), serde_json::json!([1, "two"]));
        round_trip(&Flattened { name: "n".into(), inner: Inner { id: 2, tags: vec![] }, rest });
        round_trip(&Sparse { a: 1, b: None, c: vec![], d: () });
        round_trip(&Sparse { a: 1, b: Some("b".into()), c: vec![3], d: () });
        round_trip(&vec![Untagged::Price { amount: Decimal::ONE, currency: String::new() }]);
        round_trip(&(u128::MAX, i128::MIN, i128::MAX));
        round_trip(&External::Unit);
        round_trip(&External::New(Decimal::NEGATIVE_ONE));
        round_trip(&External::Tuple(1, -1));
        round_trip(&External::Struct { a: u128::MAX, b: Sparse { a: 0, b: None, c: vec![1], d: () } });
        // Inside an untagged enum (buffered by serde): variants and sparse structs.
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        #[serde(untagged)]
        enum Around {
            E(External),
            S(Sparse),
        }
        // (Not a u128 inside: serde's buffered readers have no 128-bit integers, in any format.)
        round_trip(&Around::E(External::New(Decimal::TEN)));
        round_trip(&Around::E(External::Unit));
        round_trip(&Around::S(Sparse { a: 0, b: Some("x".into()), c: vec![], d: () }));
        let keys: HashMap<(u32, bool), Vec<Option<Option<()>>>> =
            [((1, true), vec![None, Some(None), Some(Some(()))]), ((2, false), vec![])].into_iter().collect();
        round_trip(&keys);
        let by_decimal: BTreeMap<Decimal, serde_json::Value> =
            [(Decimal::ONE, serde_json::Value::Null), (Decimal::TEN, serde_json::json!({"k": 1}))]
                .into_iter()
                .collect();
        round_trip(&by_decimal);
        round_trip(&(f32::MIN_POSITIVE, f64::NAN.to_bits(), 'ü', "strings ✓".to_owned(), [0u8, 255]));
        round_trip(&std::time::Duration::from_nanos(1_500_000_001));
    }

    #[test]
    fn sequences_of_unknown_length_are_closed() {
        struct Unsized(Vec<u16>);
        impl Serialize for Unsized {
            fn serialize<S: ser::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
                s.collect_seq(self.0.iter().filter(|_| true))
            }
        }
        let bytes = to_vec(&Unsized(vec![1, 300, 7])).unwrap();
        assert_eq!(bytes[0], OPEN_SEQ);
        assert_eq!(from_slice::<Vec<u16>>(&bytes).unwrap(), vec![1, 300, 7]);
        assert_eq!(from_slice::<(Vec<u16>, u8)>(&[&[TUPLE, 2][..], &bytes, &[U8, 9]].concat()).unwrap().1, 9);
    }

    #[test]
    fn a_length_that_lies_is_an_error_not_a_wrong_value() {
        struct Liar;
        impl Serialize for Liar {
            fn serialize<S: ser::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
                use ser::SerializeSeq;
                let mut seq = s.serialize_seq(Some(3))?;
                seq.serialize_element(&1u8)?;
                seq.end()
            }
        }
        assert!(to_vec(&Liar).unwrap_err().0.contains("fewer"));
        let mut out = vec![9];
        assert!(to_extend(&Liar, &mut out).is_err());
        assert_eq!(out, vec![9], "left as it was");
    }

    #[test]
    fn fields_a_newer_program_added_are_skipped() {
        #[derive(Serialize)]
        struct New {
            a: u32,
            b: String,
            added: BTreeMap<u8, Vec<i64>>,
        }
        #[derive(Deserialize, PartialEq, Debug)]
        struct Old {
            a: u32,
            b: String,
        }
        let bytes = to_vec(&(New { a: 1, b: "x".into(), added: [(1, vec![-1])].into() }, 5u8)).unwrap();
        assert_eq!(from_slice::<(Old, u8)>(&bytes).unwrap(), (Old { a: 1, b: "x".into() }, 5));
    }

    #[test]
    fn damaged_bytes_are_errors() {
        for bytes in [&[][..], &[U64, 0x80], &[STR, 5, b'a'], &[0x7f], &[SEQ, 2, U8, 1], &[CHAR, 0x80, 0x80, 0x44]] {
            assert!(from_slice::<serde_json::Value>(bytes).is_err(), "{bytes:?}");
        }
        assert!(from_slice::<u8>(&[U16, 0x80, 0x02]).unwrap_err().0.contains("256"));
        assert!(from_slice::<u8>(&[U8, 1, 2]).unwrap_err().0.contains("after the value"));
    }

    fn json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<u64>().prop_map(serde_json::Value::from),
            (-1e9f64..1e9).prop_map(serde_json::Value::from),
            ".{0,8}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
                prop::collection::btree_map(".{0,4}", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn json_values_and_decimals_round_trip(
            value in json(),
            mantissa in any::<i64>(),
            scale in 0u32..20,
            big in any::<u128>(),
            small in any::<i128>(),
        ) {
            round_trip(&value);
            let amount = Decimal::new(mantissa, scale);
            round_trip(&Untagged::Price { amount, currency: "USD".into() });
            round_trip(&Internal::Click { user: mantissa as u32, at: Some(big as u64) });
            round_trip(&External::Struct { a: big, b: Sparse { a: scale, b: None, c: vec![], d: () } });
            round_trip(&External::Tuple(scale as u8, small));
        }

        /// Whatever bytes come, decoding ends in a value or an error.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = from_slice::<serde_json::Value>(&bytes);
            let _ = from_slice::<(Untagged, Internal, External)>(&bytes);
            let _ = from_slice::<Flattened>(&bytes);
        }
    }
}
