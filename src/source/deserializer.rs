//! A serde `Deserializer` on the [`Scanner`]: the fast path of
//! [`JsonDecoder`](super::JsonDecoder) for any serde type.
//!
//! It reads the JSON that the scanner reads — objects, arrays, strings
//! without escapes, `true`, `false`, `null`, and numbers the scanner computes
//! to the bit as `serde_json` does — and calls the same `visit_*` methods
//! `serde_json` would (a string is `visit_borrowed_str`, an integer
//! `visit_u64` or `visit_i64`, `-0` and any fraction or exponent
//! `visit_f64`), so a type's `Deserialize` sees the same calls. On anything
//! else, and on any error the type reports, it gives up ([`GiveUp`]) and the
//! decoder asks `serde_json`, which decides and explains every line the fast
//! path does not take. What it accepts, `serde_json` accepts as the same
//! value (property test below; the `json_lines` fuzz target).

use serde::de::{self, DeserializeSeed, Visitor};
use serde::Deserialize;

use super::scan::{Number, Scanner};

/// The fast path does not take this text (the reason does not matter:
/// `serde_json` gives it).
#[derive(Debug)]
pub(crate) struct GiveUp;

impl std::fmt::Display for GiveUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("not on the fast path")
    }
}

impl std::error::Error for GiveUp {}

impl de::Error for GiveUp {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        GiveUp
    }
}

/// How deep arrays and objects may nest on the fast path (`serde_json`
/// stops at 128).
const MAX_DEPTH: usize = 100;

/// `bytes` as a `T`, if the fast path takes it.
#[inline]
pub(crate) fn from_slice<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Option<T> {
    let mut de = Fast { s: Scanner::new(bytes), depth: 0 };
    let value = T::deserialize(&mut de).ok()?;
    de.s.end()?;
    Some(value)
}

struct Fast<'a> {
    s: Scanner<'a>,
    depth: usize,
}

impl<'a> Fast<'a> {
    fn nest(&mut self) -> Result<(), GiveUp> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(GiveUp);
        }
        Ok(())
    }
}

/// `Option` to the fast path's `Result`.
#[inline]
fn ok<T>(value: Option<T>) -> Result<T, GiveUp> {
    value.ok_or(GiveUp)
}

impl<'de> de::Deserializer<'de> for &mut Fast<'de> {
    type Error = GiveUp;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GiveUp> {
        match ok(self.s.peek())? {
            b'"' => visitor.visit_borrowed_str(ok(self.s.string())?),
            b'{' => {
                ok(self.s.punct(b'{'))?;
                self.nest()?;
                let value = visitor.visit_map(Items::<b'}'> { de: &mut *self, first: true })?;
                self.depth -= 1;
                ok(self.s.punct(b'}'))?;
                Ok(value)
            }
            b'[' => {
                ok(self.s.punct(b'['))?;
                self.nest()?;
                let value = visitor.visit_seq(Items::<b']'> { de: &mut *self, first: true })?;
                self.depth -= 1;
                ok(self.s.punct(b']'))?;
                Ok(value)
            }
            b't' => {
                ok(self.s.literal(b"true"))?;
                visitor.visit_bool(true)
            }
            b'f' => {
                ok(self.s.literal(b"false"))?;
                visitor.visit_bool(false)
            }
            b'n' => {
                ok(self.s.literal(b"null"))?;
                visitor.visit_unit()
            }
            _ => match ok(self.s.number())? {
                Number::U64(n) => visitor.visit_u64(n),
                Number::I64(n) => visitor.visit_i64(n),
                Number::F64(n) => visitor.visit_f64(n),
            },
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GiveUp> {
        if self.s.peek() == Some(b'n') {
            ok(self.s.literal(b"null"))?;
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, GiveUp> {
        // serde_json's RawValue is a newtype with a private name: not here.
        if name.starts_with("$serde_json") {
            return Err(GiveUp);
        }
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, GiveUp> {
        // A unit variant as a string; the other forms go to serde_json.
        if self.s.peek() != Some(b'"') {
            return Err(GiveUp);
        }
        let variant = ok(self.s.string())?;
        visitor.visit_enum(de::value::BorrowedStrDeserializer::<GiveUp>::new(variant))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, GiveUp> {
        // serde_json also reads a struct from an array: not here.
        if self.s.peek() != Some(b'{') {
            return Err(GiveUp);
        }
        self.deserialize_any(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GiveUp> {
        if self.s.peek() != Some(b'{') {
            return Err(GiveUp);
        }
        self.deserialize_any(visitor)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GiveUp> {
        if self.s.peek() != Some(b'[') {
            return Err(GiveUp);
        }
        self.deserialize_any(visitor)
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, GiveUp> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, GiveUp> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, _name: &'static str, visitor: V) -> Result<V::Value, GiveUp> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GiveUp> {
        ok(self.s.literal(b"null"))?;
        visitor.visit_unit()
    }

    // Bytes from strings or arrays, and 128-bit integers, are serde_json's.
    fn deserialize_bytes<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, GiveUp> {
        Err(GiveUp)
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, GiveUp> {
        Err(GiveUp)
    }

    fn deserialize_i128<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, GiveUp> {
        Err(GiveUp)
    }

    fn deserialize_u128<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, GiveUp> {
        Err(GiveUp)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 u8 u16 u32 u64 f32 f64 char str string identifier ignored_any
    }
}

/// The members of an object (`CLOSE` is `}`) or the elements of an array
/// (`]`), one after the other.
struct Items<'d, 'a, const CLOSE: u8> {
    de: &'d mut Fast<'a>,
    first: bool,
}

impl<const CLOSE: u8> Items<'_, '_, CLOSE> {
    /// Whether another item follows (its `,` read), or the closing byte
    /// (left for the caller to read).
    fn another(&mut self) -> Result<bool, GiveUp> {
        if std::mem::replace(&mut self.first, false) {
            return Ok(self.de.s.peek() != Some(CLOSE));
        }
        match ok(self.de.s.peek())? {
            b',' => ok(self.de.s.punct(b',')).map(|()| true),
            b if b == CLOSE => Ok(false),
            _ => Err(GiveUp),
        }
    }
}

impl<'de> de::MapAccess<'de> for Items<'_, 'de, b'}'> {
    type Error = GiveUp;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, GiveUp> {
        if !self.another()? {
            return Ok(None);
        }
        let key = ok(self.de.s.key_text())?;
        seed.deserialize(Key(key)).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, GiveUp> {
        seed.deserialize(&mut *self.de)
    }
}

impl<'de> de::SeqAccess<'de> for Items<'_, 'de, b']'> {
    type Error = GiveUp;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, GiveUp> {
        if !self.another()? {
            return Ok(None);
        }
        seed.deserialize(&mut *self.de).map(Some)
    }
}

/// An object's key: a string to whatever asks for a string (`serde_json`
/// reads keys as numbers or booleans for types that ask: not here).
struct Key<'a>(&'a str);

impl<'de> de::Deserializer<'de> for Key<'de> {
    type Error = GiveUp;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GiveUp> {
        visitor.visit_borrowed_str(self.0)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GiveUp> {
        visitor.visit_borrowed_str(self.0)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GiveUp> {
        visitor.visit_borrowed_str(self.0)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GiveUp> {
        visitor.visit_borrowed_str(self.0)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, GiveUp> {
        visitor.visit_unit()
    }

    fn deserialize_bool<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, GiveUp> {
        Err(GiveUp)
    }

    fn deserialize_i8<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, GiveUp> {
        Err(GiveUp)
    }

    fn deserialize_i16<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, GiveUp> {
        Err(GiveUp)
    }

    fn deserialize_i32<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, GiveUp> {
        Err(GiveUp)
    }

    fn deserialize_i64<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, GiveUp> {
        Err(GiveUp)
    }

    fn deserialize_u8<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, GiveUp> {
        Err(GiveUp)
    }

    fn deserialize_u16<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, GiveUp> {
        Err(GiveUp)
    }

    fn deserialize_u32<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, GiveUp> {
        Err(GiveUp)
    }

    fn deserialize_u64<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, GiveUp> {
        Err(GiveUp)
    }

    fn deserialize_f32<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, GiveUp> {
        Err(GiveUp)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, GiveUp> {
        Err(GiveUp)
    }

    fn deserialize_char<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, GiveUp> {
        Err(GiveUp)
    }

    fn deserialize_option<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, GiveUp> {
        Err(GiveUp)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, _visitor: V) -> Result<V::Value, GiveUp> {
        Err(GiveUp)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, GiveUp> {
        Err(GiveUp)
    }

    serde::forward_to_deserialize_any! {
        i128 u128 bytes byte_buf unit unit_struct seq tuple tuple_struct map struct
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use serde::de::DeserializeOwned;

    use super::*;
    use crate::source::{Decode, JsonDecoder};

    #[derive(Debug, PartialEq, Deserialize)]
    struct Inner {
        a: u8,
        #[serde(default)]
        b: Option<String>,
    }

    #[derive(Debug, PartialEq, Deserialize)]
    enum Kind {
        A,
        B(u8),
    }

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(untagged)]
    enum Either {
        N(u64),
        S(String),
    }

    #[derive(Debug, PartialEq, Deserialize)]
    struct Rec {
        id: u64,
        n: i32,
        x: f64,
        name: String,
        tags: Vec<String>,
        o: Option<i64>,
        nested: Inner,
        kind: Kind,
        flag: bool,
        map: BTreeMap<String, u8>,
        either: Either,
        c: char,
    }

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Strict {
        id: u64,
        x: f32,
    }

    fn number() -> impl Strategy<Value = String> {
        prop_oneof![
            3 => any::<u32>().prop_map(|n| n.to_string()),
            2 => any::<i64>().prop_map(|n| n.to_string()),
            2 => (any::<i32>(), 0u32..7, -30i32..30).prop_map(|(m, f, e)| format!("{m}.{}e{e}", 10u32.pow(f))),
            2 => any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| f.to_string()),
            3 => prop::sample::select(vec![
                "0", "-0", "-0.0", "1.5", "-2.25e3", "1e22", "1e23", "1e-22", "1e-23", "123456789012345678",
                "1234567890123456789", "18446744073709551615", "18446744073709551616", "0.1", "3.141592653589793",
                "1E-5", "01", "1.", ".5", "-", "1e", "2.5E+2", "9007199254740993", "4.9e-324",
                "1.7976931348623157e308", "1e400", "255", "256", "-129", "2147483648",
            ])
            .prop_map(str::to_owned),
        ]
    }

    fn string() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            20 => "[a-zA-Z0-9 :/.?=-]{0,12}",
            1 => prop::sample::select(vec!["\\\"", "\\\\", "\\n", "\\u00e9", "\t", "\u{1}", "é", "😀", "\"", "x"])
                .prop_map(str::to_owned),
        ];
        prop::collection::vec(piece, 0..3).prop_map(|p| format!("\"{}\"", p.concat()))
    }

    /// Any JSON-ish value, nested a little.
    fn value() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            number(),
            string(),
            prop::sample::select(vec!["true", "false", "null", "nul", "tru", "\"A\"", "\"B\""]).prop_map(str::to_owned),
        ];
        leaf.prop_recursive(3, 24, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec((string(), inner), 0..5).prop_map(|m| {
                    let members: Vec<String> = m.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
                    format!("{{{}}}", members.join(" , "))
                }),
            ]
        })
    }

    /// A `Rec`, mostly well formed: its fields in any order, some values
    /// replaced by anything.
    fn record() -> impl Strategy<Value = String> {
        /// Mostly a value of the field's type, sometimes any number.
        fn typed<S: Strategy<Value = String> + 'static>(good: S) -> BoxedStrategy<String> {
            prop_oneof![9 => good, 1 => number()].boxed()
        }
        let fields = (
            typed(any::<u32>().prop_map(|n| n.to_string())),
            typed(any::<i16>().prop_map(|n| n.to_string())),
            typed((any::<i32>(), -9i32..9).prop_map(|(m, e)| format!("{m}.25e{e}"))),
            string(),
            prop::collection::vec(string(), 0..3),
            prop_oneof![typed(any::<i32>().prop_map(|n| n.to_string())), Just("null".to_owned())],
            (typed(any::<u8>().prop_map(|n| n.to_string())), prop::option::of(string())),
            prop::sample::select(vec!["\"A\"", "\"A\"", "\"A\"", "{\"B\":3}", "\"C\"", "\"B\""]),
            prop::sample::select(vec!["true", "false", "true", "1"]),
            prop::collection::vec((string(), typed(any::<u8>().prop_map(|n| n.to_string()))), 0..3),
            prop_oneof![number(), string()],
            prop::sample::select(vec!["\"c\"", "\"é\"", "\"c\"", "\"cd\"", "\"\""]),
        );
        (
            fields,
            prop::option::weighted(0.2, (0usize..12, value())),
            Just((0..12).collect::<Vec<usize>>()).prop_shuffle(),
        )
            .prop_map(|((id, n, x, name, tags, o, (a, b), kind, flag, map, either, c), replace, order)| {
                let tags = format!("[{}]", tags.join(","));
                let nested = match b {
                    Some(b) => format!("{{\"a\":{a},\"b\":{b}}}"),
                    None => format!("{{\"a\":{a}}}"),
                };
                let map: Vec<String> = map.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
                let map = format!("{{{}}}", map.join(","));
                let mut members = [
                    ("id", id),
                    ("n", n),
                    ("x", x),
                    ("name", name),
                    ("tags", tags),
                    ("o", o),
                    ("nested", nested),
                    ("kind", kind.to_owned()),
                    ("flag", flag.to_owned()),
                    ("map", map),
                    ("either", either),
                    ("c", c.to_owned()),
                ];
                if let Some((i, v)) = replace {
                    members[i].1 = v;
                }
                let body: Vec<String> =
                    order.iter().map(|&i| format!("\"{}\": {}", members[i].0, members[i].1)).collect();
                format!("{{{}}}", body.join(","))
            })
    }

    /// `base`'s texts with up to three edits (a character deleted, one of
    /// JSON's significant characters inserted or put in place of one):
    /// missing and doubled separators, brackets that do not match, keys
    /// without their colon, cut literals and numbers.
    fn edited(base: impl Strategy<Value = String>) -> impl Strategy<Value = String> {
        let significant = vec![',', ':', '{', '}', '[', ']', '"', ' ', '0', '1', '-', '.', 'e', 'n', '\\'];
        let edit = (0u8..3, any::<prop::sample::Index>(), prop::sample::select(significant));
        (base, prop::collection::vec(edit, 1..4)).prop_map(|(text, edits)| {
            let mut chars: Vec<char> = text.chars().collect();
            for (kind, at, c) in edits {
                let n = chars.len();
                match kind {
                    0 if n > 0 => {
                        chars.remove(at.index(n));
                    }
                    1 if n > 0 => chars[at.index(n)] = c,
                    _ => chars.insert(at.index(n + 1), c),
                }
            }
            chars.into_iter().collect()
        })
    }

    /// Whatever the fast path takes, serde_json reads as the same value;
    /// and the decoder gives exactly serde_json's answer.
    fn agrees<T: DeserializeOwned + PartialEq + std::fmt::Debug + 'static>(text: &str) -> Result<bool, TestCaseError> {
        let reference = serde_json::from_str::<T>(text).map_err(|e| DecodeError(e.to_string()));
        let fast = from_slice::<T>(text.as_bytes());
        if let Some(value) = &fast {
            prop_assert_eq!(reference.as_ref().ok(), Some(value), "{}", text);
        }
        prop_assert_eq!(JsonDecoder::<T>::new().decode(text.as_bytes()), reference, "{}", text);
        Ok(fast.is_some())
    }

    use crate::source::DecodeError;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 10_000, ..ProptestConfig::default() })]

        #[test]
        fn values_agree_with_serde_json(text in value()) {
            agrees::<serde_json::Value>(&text)?;
            agrees::<Vec<f64>>(&text)?;
            agrees::<BTreeMap<String, i64>>(&text)?;
            // Numbers to the bit: -0, and every float the fast path computes.
            if let (Some(fast), Ok(slow)) = (from_slice::<f64>(text.as_bytes()), serde_json::from_str::<f64>(&text)) {
                prop_assert_eq!(fast.to_bits(), slow.to_bits(), "{}", text);
            }
        }

        #[test]
        fn edited_values_agree_with_serde_json(text in edited(value())) {
            agrees::<serde_json::Value>(&text)?;
            agrees::<Vec<f64>>(&text)?;
            agrees::<BTreeMap<String, i64>>(&text)?;
        }

        #[test]
        fn edited_records_agree_with_serde_json(text in edited(record())) {
            agrees::<Rec>(&text)?;
            agrees::<Strict>(&text)?;
        }

        #[test]
        fn records_agree_with_serde_json(text in record()) {
            agrees::<Rec>(&text)?;
            agrees::<Strict>(&text)?;
            if let (Some(fast), Ok(slow)) = (from_slice::<Rec>(text.as_bytes()), serde_json::from_str::<Rec>(&text)) {
                prop_assert_eq!(fast.x.to_bits(), slow.x.to_bits(), "{}", text);
            }
        }
    }

    #[test]
    fn plain_records_take_the_fast_path() {
        let line = r#"{"id":7,"n":-3,"x":-0.5e1,"name":"a b","tags":["x",""],"o":null,"nested":{"a":1},
            "kind":"A","flag":true,"map":{"k":2},"either":"s","c":"é"}"#;
        let rec: Rec = from_slice(line.as_bytes()).expect("the fast path");
        assert_eq!(rec.x, -5.0);
        assert_eq!(rec.either, Either::S("s".into()));
        assert_eq!(from_slice::<f64>(b"-0").map(f64::to_bits), Some((-0.0f64).to_bits()));
        assert_eq!(from_slice::<serde_json::Value>(b"[1,-1,1.0]"), serde_json::from_slice(b"[1,-1,1.0]").ok());
        // An escape, a newtype variant, a long number: serde_json's.
        assert!(from_slice::<Rec>(line.replace("a b", "a\\nb").as_bytes()).is_none());
        assert!(from_slice::<Rec>(line.replace("\"A\"", "{\"B\":1}").as_bytes()).is_none());
        assert!(from_slice::<u64>(b"18446744073709551615").is_none());
        assert_eq!(JsonDecoder::<u64>::new().decode(b"18446744073709551615"), Ok(u64::MAX));
        let mut sample = proptest::test_runner::TestRunner::deterministic();
        let strategy = record();
        let (mut taken, mut valid) = (0, 0);
        for _ in 0..2_000 {
            use proptest::strategy::ValueTree;
            let text = strategy.new_tree(&mut sample).unwrap().current();
            if !text.contains('\\') && serde_json::from_str::<Rec>(&text).is_ok() {
                valid += 1;
                taken += usize::from(from_slice::<Rec>(text.as_bytes()).is_some());
            }
        }
        // Without escapes, only numbers of more than 18 digits and the
        // newtype variant go to serde_json.
        assert!(valid > 50 && taken * 10 > valid * 6, "{taken} of {valid} valid random records took the fast path");
    }
}
