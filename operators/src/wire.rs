//! What crosses a process boundary: records that an exchange sends to a
//! worker of another process are serialized by timely with bincode, which
//! is not self-describing. A type whose `Deserialize` asks the format what
//! comes next (`deserialize_any`: `rust_decimal::Decimal`,
//! `serde_json::Value`, untagged and internally tagged enums,
//! `#[serde(flatten)]`) cannot be read back on the other side: timely would
//! panic on the first such record. [`wire_check`] finds such a type before
//! any record is sent, by walking its `Deserialize` over a probe (every
//! variant of every enum, options and sequences one level deep each), and
//! the exchange refuses it when the dataflow is built, naming the type.
//!
//! ```
//! use highwater_operators::wire::wire_check;
//! assert!(wire_check::<(u64, String, Option<Vec<i32>>)>().is_ok());
//! let refused = wire_check::<(u64, rust_decimal::Decimal)>().unwrap_err();
//! assert!(refused.to_string().contains("Decimal"), "{refused}");
//! ```

use std::cell::Cell;

use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, Visitor};

/// A record type that cannot cross a process boundary.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "records of type `{record}` cannot be sent to another process: timely serializes them with bincode, \
     which cannot read {part} (its Deserialize asks the format what comes next, deserialize_any); run the \
     job in one process (-n 1), or carry the value in a form bincode reads (a `Decimal` as its string or \
     mantissa and scale, a `serde_json::Value` as its text)"
)]
pub struct NotExchangeable {
    /// The record type.
    pub record: String,
    /// What in it bincode cannot read (as its `Deserialize` describes it).
    pub part: String,
}

/// How deep the probe goes into options, sequences and maps (recursive
/// types end there).
const DEPTH: usize = 24;
/// How many passes: in pass `p` each enum takes its variant `p` (or its last).
const PASSES: usize = 64;

/// Whether records of type `T` can cross a process boundary (bincode
/// reads what it writes): an error naming what in `T` asks for
/// `deserialize_any`. Types whose `Deserialize` rejects the probe's
/// made-up values (zeros, empty strings) are let through as far as the
/// probe got.
///
/// # Errors
/// [`NotExchangeable`], naming `T` and the part of it.
pub fn wire_check<T: DeserializeOwned>() -> Result<(), NotExchangeable> {
    let found: Cell<Option<String>> = Cell::new(None);
    let variants = Cell::new(1usize);
    let mut pass = 0;
    while pass < variants.get().min(PASSES) {
        let probe = Probe { depth: 0, pass, found: &found, variants: &variants };
        let _ = T::deserialize(probe);
        if let Some(part) = found.take() {
            return Err(NotExchangeable { record: std::any::type_name::<T>().to_owned(), part });
        }
        pass += 1;
    }
    Ok(())
}

/// The probe's error: whatever a visitor says, or the walk stopped.
#[derive(Debug)]
struct Stop;

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("probe stopped")
    }
}

impl std::error::Error for Stop {}

impl de::Error for Stop {
    fn custom<M: std::fmt::Display>(_: M) -> Self {
        Stop
    }
}

/// A deserializer that makes up a value of whatever is asked, and notes
/// the first request bincode cannot serve.
#[derive(Clone, Copy)]
struct Probe<'a> {
    depth: usize,
    pass: usize,
    found: &'a Cell<Option<String>>,
    /// The most variants of an enum seen (passes to make).
    variants: &'a Cell<usize>,
}

/// What a visitor expects, as its `expecting` says.
struct Expecting<'v, V>(&'v V);

impl<'de, V: Visitor<'de>> std::fmt::Display for Expecting<'_, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.expecting(f)
    }
}

impl<'a> Probe<'a> {
    fn deeper(self) -> Option<Probe<'a>> {
        (self.depth < DEPTH).then_some(Probe { depth: self.depth + 1, ..self })
    }

    fn refuse<'de, V: Visitor<'de>>(self, visitor: &V) -> Result<V::Value, Stop> {
        let found = self.found.take();
        self.found.set(Some(found.unwrap_or_else(|| Expecting(visitor).to_string())));
        Err(Stop)
    }
}

impl<'de, 'a> de::Deserializer<'de> for Probe<'a> {
    type Error = Stop;

    fn is_human_readable(&self) -> bool {
        false
    }

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        self.refuse(&visitor)
    }
    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        self.refuse(&visitor)
    }
    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        self.refuse(&visitor)
    }
    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_bool(false)
    }
    fn deserialize_i8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_i8(0)
    }
    fn deserialize_i16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_i16(0)
    }
    fn deserialize_i32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_i32(0)
    }
    fn deserialize_i64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_i64(0)
    }
    fn deserialize_i128<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_i128(0)
    }
    fn deserialize_u8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_u8(0)
    }
    fn deserialize_u16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_u16(0)
    }
    fn deserialize_u32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_u32(0)
    }
    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_u64(0)
    }
    fn deserialize_u128<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_u128(0)
    }
    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_f32(0.0)
    }
    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_f64(0.0)
    }
    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_char('a')
    }
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_borrowed_str("")
    }
    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_string(String::new())
    }
    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_borrowed_bytes(&[])
    }
    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_byte_buf(Vec::new())
    }
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        match self.deeper() {
            Some(inner) => visitor.visit_some(inner),
            None => visitor.visit_none(),
        }
    }
    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_unit()
    }
    fn deserialize_unit_struct<V: Visitor<'de>>(self, _name: &'static str, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_unit()
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _name: &'static str, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_newtype_struct(self)
    }
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        let n = usize::from(self.depth < DEPTH);
        visitor.visit_seq(Items { probe: self.deeper().unwrap_or(self), left: n, pairs: false })
    }
    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_seq(Items { probe: self, left: len, pairs: false })
    }
    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, Stop> {
        visitor.visit_seq(Items { probe: self, left: len, pairs: false })
    }
    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        let n = usize::from(self.depth < DEPTH);
        visitor.visit_map(Items { probe: self.deeper().unwrap_or(self), left: n, pairs: true })
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Stop> {
        visitor.visit_seq(Items { probe: self, left: fields.len(), pairs: false })
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Stop> {
        self.variants.set(self.variants.get().max(variants.len()));
        let index = self.pass.min(variants.len().saturating_sub(1)) as u32;
        visitor.visit_enum(Variant { probe: self, index })
    }
}

/// Made-up elements of a sequence, tuple or struct, or entries of a map.
struct Items<'a> {
    probe: Probe<'a>,
    left: usize,
    pairs: bool,
}

impl<'de> de::SeqAccess<'de> for Items<'_> {
    type Error = Stop;
    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Stop> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        seed.deserialize(self.probe).map(Some)
    }
}

impl<'de> de::MapAccess<'de> for Items<'_> {
    type Error = Stop;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Stop> {
        if self.left == 0 || !self.pairs {
            return Ok(None);
        }
        self.left -= 1;
        seed.deserialize(self.probe).map(Some)
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Stop> {
        seed.deserialize(self.probe)
    }
}

/// The variant a pass takes.
struct Variant<'a> {
    probe: Probe<'a>,
    index: u32,
}

impl<'de, 'a> de::EnumAccess<'de> for Variant<'a> {
    type Error = Stop;
    type Variant = Self;
    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), Stop> {
        let value = seed.deserialize(self.index.into_deserializer())?;
        Ok((value, self))
    }
}

impl<'de> de::VariantAccess<'de> for Variant<'_> {
    type Error = Stop;
    fn unit_variant(self) -> Result<(), Stop> {
        Ok(())
    }
    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Stop> {
        seed.deserialize(self.probe)
    }
    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_seq(Items { probe: self.probe, left: len, pairs: false })
    }
    fn struct_variant<V: Visitor<'de>>(self, fields: &'static [&'static str], visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_seq(Items { probe: self.probe, left: fields.len(), pairs: false })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use serde::Deserialize;

    use super::*;

    #[derive(Deserialize)]
    #[allow(dead_code)]
    enum Event {
        Click { user: u32, at: u64 },
        Buy(Order),
        Quit,
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Order {
        id: u64,
        lines: Vec<(String, Option<rust_decimal::Decimal>)>,
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    #[serde(untagged)]
    enum Loose {
        A(u8),
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct List {
        next: Option<Box<List>>,
        value: u8,
    }

    #[test]
    fn types_bincode_reads_pass() {
        assert!(wire_check::<(u64, String, Vec<(i32, bool)>, HashMap<u8, BTreeMap<String, f64>>)>().is_ok());
        assert!(wire_check::<List>().is_ok(), "a recursive type ends");
        assert!(wire_check::<(Option<char>, [u8; 4], std::time::Duration, ())>().is_ok());
    }

    #[test]
    fn types_that_ask_for_deserialize_any_are_found_anywhere() {
        let error = wire_check::<Event>().unwrap_err();
        assert!(error.record.contains("Event"), "{error}");
        assert!(error.part.contains("Decimal"), "in the second variant, an option, a sequence: {error}");
        assert!(wire_check::<serde_json::Value>().is_err());
        assert!(wire_check::<(u8, Loose)>().is_err());
        assert!(wire_check::<Vec<Option<rust_decimal::Decimal>>>().is_err());
    }
}
