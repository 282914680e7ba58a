//! A forward-only JSON scanner for decoders that know their record's shape.
//!
//! The fast path of a decoder: it reads exactly the JSON it is asked for —
//! a punctuation byte, a key, a string, a non-negative integer — skipping
//! JSON whitespace, and answers `None` for anything else: a string with an
//! escape, a number that is not a plain integer of at most 18 digits, an
//! unexpected byte. The caller then decodes the record with `serde_json`,
//! which decides (and explains) every case the scanner gives up on. So a fast
//! path built on it never changes which records are accepted nor the reasons
//! given for the rejected ones, as long as what it accepts `serde_json`
//! accepts as the same value (for the Nexmark decoder: a property test in
//! `nexmark::json` and the `nexmark_fast` fuzz target).
//!
//! Strings are found with `memchr` (SIMD) and checked in one pass that the
//! compiler vectorizes: no control character (JSON forbids them raw), and
//! UTF-8 (ASCII needs no further check).

/// A cursor over one JSON text; see the [module documentation](self).
#[derive(Debug)]
pub(crate) struct Scanner<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// Where the text is plain — at most [`INDEXED`] bytes, all printable
    /// ASCII (no backslash, no control character, so no escape and no
    /// whitespace but spaces) — bit `i` is set iff byte `i` is a `"`: a
    /// string's end is then the next set bit, found without reading it again.
    quotes: Option<[u64; INDEXED / 64]>,
}

/// The longest text [`Scanner`] indexes.
const INDEXED: usize = 1024;

impl<'a> Scanner<'a> {
    /// A scanner at the start of `bytes`.
    #[inline]
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Scanner { bytes, pos: 0, quotes: index_quotes(bytes) }
    }

    #[inline]
    fn skip_whitespace(&mut self) {
        while let Some(&b) = self.bytes.get(self.pos) {
            if !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
                break;
            }
            self.pos += 1;
        }
    }

    /// The byte `b` (after any whitespace).
    #[inline]
    pub(crate) fn punct(&mut self, b: u8) -> Option<()> {
        self.skip_whitespace();
        if self.bytes.get(self.pos) == Some(&b) {
            self.pos += 1;
            Some(())
        } else {
            None
        }
    }

    /// After a member of an object: `,` (`Some(true)`, another member
    /// follows) or `}` (`Some(false)`, the object ends).
    #[inline]
    pub(crate) fn next_member(&mut self) -> Option<bool> {
        self.skip_whitespace();
        let more = match self.bytes.get(self.pos)? {
            b',' => true,
            b'}' => false,
            _ => return None,
        };
        self.pos += 1;
        Some(more)
    }

    /// The end of the text (nothing but whitespace left).
    #[inline]
    pub(crate) fn end(&mut self) -> Option<()> {
        self.skip_whitespace();
        (self.pos == self.bytes.len()).then_some(())
    }

    /// A string without escapes: its bytes, and whether they are all
    /// printable ASCII (so checked already).
    #[inline]
    fn raw_string(&mut self) -> Option<(&'a [u8], bool)> {
        self.skip_whitespace();
        if self.bytes.get(self.pos) != Some(&b'"') {
            return None;
        }
        let start = self.pos + 1;
        if let Some(quotes) = &self.quotes {
            let end = next_set_bit(quotes, start)?;
            self.pos = end + 1;
            return Some((&self.bytes[start..end], true));
        }
        let rest = &self.bytes[start..];
        let first = first_special(rest)?;
        let (len, ascii) = match rest[first] {
            b'"' => (first, true),
            b if b >= 0x80 => {
                let len = first + memchr::memchr2(b'"', b'\\', &rest[first..])?;
                (len, false)
            }
            _ => return None,
        };
        if rest[len] != b'"' {
            return None;
        }
        self.pos = start + len + 1;
        Some((&rest[..len], ascii))
    }

    /// An object key and its `:`.
    #[inline]
    pub(crate) fn key(&mut self) -> Option<&'a [u8]> {
        let (key, _) = self.raw_string()?;
        self.punct(b':')?;
        Some(key)
    }

    /// A string without escapes, with no control character, in UTF-8.
    #[inline]
    pub(crate) fn string(&mut self) -> Option<&'a str> {
        match self.raw_string()? {
            // SAFETY: printable ASCII is UTF-8.
            (bytes, true) => Some(unsafe { std::str::from_utf8_unchecked(bytes) }),
            (bytes, false) => text(bytes),
        }
    }

    /// The next byte after any whitespace, not consumed.
    #[inline]
    pub(crate) fn peek(&mut self) -> Option<u8> {
        self.skip_whitespace();
        self.bytes.get(self.pos).copied()
    }

    /// The word `word` (`true`, `false`, `null`).
    #[inline]
    pub(crate) fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.skip_whitespace();
        if self.bytes[self.pos..].starts_with(word) {
            self.pos += word.len();
            Some(())
        } else {
            None
        }
    }

    /// A number of at most 18 significant digits and an exponent (after the
    /// fraction's digits) of at most 22 either way, computed as `serde_json`
    /// (without `float_roundtrip`) computes it: the digits as an integer,
    /// times or divided by a power of ten that is exact in `f64`, so the
    /// result is the same to the bit. Other numbers: `None`.
    #[inline]
    pub(crate) fn number(&mut self) -> Option<Number> {
        self.skip_whitespace();
        let b = self.bytes;
        let mut i = self.pos;
        let negative = b.get(i) == Some(&b'-');
        i += usize::from(negative);
        let int_start = i;
        let mut digits = 0u64;
        let mut count = 0;
        while let Some(d) = b.get(i).map(|c| c.wrapping_sub(b'0')).filter(|d| *d <= 9) {
            digits = digits * 10 + u64::from(d);
            count += 1;
            i += 1;
            if count > 18 {
                return None;
            }
        }
        let int_digits = i - int_start;
        if int_digits == 0 || (int_digits > 1 && b[int_start] == b'0') {
            return None;
        }
        let mut exponent: i32 = 0;
        let mut float = false;
        if b.get(i) == Some(&b'.') {
            float = true;
            i += 1;
            let frac_start = i;
            while let Some(d) = b.get(i).map(|c| c.wrapping_sub(b'0')).filter(|d| *d <= 9) {
                digits = digits * 10 + u64::from(d);
                count += 1;
                i += 1;
                if count > 18 {
                    return None;
                }
            }
            if i == frac_start {
                return None;
            }
            exponent -= (i - frac_start) as i32;
        }
        if matches!(b.get(i), Some(b'e' | b'E')) {
            float = true;
            i += 1;
            let minus = match b.get(i) {
                Some(b'-') => {
                    i += 1;
                    true
                }
                Some(b'+') => {
                    i += 1;
                    false
                }
                _ => false,
            };
            let exp_start = i;
            let mut value: i32 = 0;
            while let Some(d) = b.get(i).map(|c| c.wrapping_sub(b'0')).filter(|d| *d <= 9) {
                value = value * 10 + i32::from(d);
                i += 1;
                if i - exp_start > 3 {
                    return None;
                }
            }
            if i == exp_start {
                return None;
            }
            exponent += if minus { -value } else { value };
        }
        let number = if float || (negative && digits == 0) {
            if exponent.abs() > 22 {
                return None;
            }
            let power = POW10[exponent.unsigned_abs() as usize];
            let f = if exponent >= 0 { digits as f64 * power } else { digits as f64 / power };
            Number::F64(if negative { -f } else { f })
        } else if negative {
            Number::I64(-(digits as i64))
        } else {
            Number::U64(digits)
        };
        self.pos = i;
        Some(number)
    }

    /// A string as [`string`](Self::string), then its `:`: an object's key.
    #[inline]
    pub(crate) fn key_text(&mut self) -> Option<&'a str> {
        let key = self.string()?;
        self.punct(b':')?;
        Some(key)
    }

    /// A non-negative integer of at most 18 digits (so any `i64` or `u64`
    /// field takes it), without a leading zero, fraction or exponent.
    #[inline]
    pub(crate) fn integer(&mut self) -> Option<u64> {
        self.skip_whitespace();
        let (value, digits) = digits(self.bytes.get(self.pos..)?)?;
        self.pos += digits;
        if matches!(self.bytes.get(self.pos), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        Some(value)
    }
}

/// The integer that `bytes` starts with, of 1 to 18 digits without a
/// leading zero (so any `i64` holds it), and the count of its digits;
/// `None` for anything else (no digit, a leading zero, more digits). What
/// follows the digits is the caller's to check.
#[inline(always)]
pub(crate) fn digits(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    let mut n = 0;
    while let Some(&b) = bytes.get(n) {
        let digit = b.wrapping_sub(b'0');
        if digit > 9 {
            break;
        }
        if n == 18 {
            return None;
        }
        value = value * 10 + u64::from(digit);
        n += 1;
    }
    if n == 0 || (n > 1 && bytes[0] == b'0') {
        return None;
    }
    Some((value, n))
}

/// A JSON number as `serde_json` reads it (which `visit_*` it calls).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Number {
    /// A non-negative integer.
    U64(u64),
    /// A negative integer.
    I64(i64),
    /// A number with a fraction or an exponent, or `-0`.
    F64(f64),
}

/// The powers of ten that are exact in `f64` (`serde_json`'s table starts so).
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20,
    1e21, 1e22,
];

/// The first set bit at or after `from`.
#[inline]
fn next_set_bit(bits: &[u64; INDEXED / 64], from: usize) -> Option<usize> {
    let mut word = from / 64;
    let mut rest = *bits.get(word)? & (!0u64 << (from % 64));
    while rest == 0 {
        word += 1;
        rest = *bits.get(word)?;
    }
    Some(word * 64 + rest.trailing_zeros() as usize)
}

/// The quotes of `bytes` as bits, if it is plain (see [`Scanner::quotes`]):
/// one pass, sixteen bytes at a time.
#[cfg(target_arch = "x86_64")]
#[inline]
fn index_quotes(bytes: &[u8]) -> Option<[u64; INDEXED / 64]> {
    if bytes.len() > INDEXED {
        return None;
    }
    let mut quotes = [0u64; INDEXED / 64];
    let mut special = 0;
    let mut blocks = bytes.chunks_exact(16);
    for (i, block) in blocks.by_ref().enumerate() {
        let (q, other) = classify(block.try_into().expect("sixteen bytes"));
        special |= other;
        quotes[i / 4] |= u64::from(q) << ((i % 4) * 16);
    }
    let at = bytes.len() - blocks.remainder().len();
    for (i, &b) in blocks.remainder().iter().enumerate() {
        special |= u32::from(b == b'\\' || !(0x20..0x80).contains(&b));
        quotes[(at + i) / 64] |= u64::from(b == b'"') << ((at + i) % 64);
    }
    (special == 0).then_some(quotes)
}

/// The bytes of a block of sixteen that are `"` (the first mask, a bit per
/// byte) and those that are `\\`, a control character or not ASCII (the
/// second), with SSE2 (part of every x86-64 CPU).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn classify(block: &[u8; 16]) -> (u32, u32) {
    use std::arch::x86_64::{
        _mm_cmpeq_epi8, _mm_cmplt_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
    };
    // SAFETY: SSE2 is part of x86-64, and the load reads the block's 16
    // bytes (unaligned loads are allowed).
    unsafe {
        let v = _mm_loadu_si128(block.as_ptr().cast());
        let quote = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
        // Signed: bytes from 0x80 up are negative, so below 0x20 as well.
        let other = _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8)), _mm_cmplt_epi8(v, _mm_set1_epi8(0x20)));
        (_mm_movemask_epi8(quote) as u32, _mm_movemask_epi8(other) as u32)
    }
}

/// No index on other CPUs.
#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn index_quotes(_: &[u8]) -> Option<[u64; INDEXED / 64]> {
    None
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The index of the first byte of `bytes` that is `"`, `\\`, a control
/// character or not ASCII: sixteen bytes at a time with SSE2 (every x86-64
/// CPU has it), the rest eight at a time.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn first_special(bytes: &[u8]) -> Option<usize> {
    let mut blocks = bytes.chunks_exact(16);
    let mut at = 0;
    for block in blocks.by_ref() {
        let (quote, other) = classify(block.try_into().expect("sixteen bytes"));
        let mask = quote | other;
        if mask != 0 {
            return Some(at + mask.trailing_zeros() as usize);
        }
        at += 16;
    }
    first_special_in_words(blocks.remainder()).map(|i| at + i)
}

/// [`first_special`] on other CPUs.
#[cfg(not(target_arch = "x86_64"))]
#[inline]
pub(crate) fn first_special(bytes: &[u8]) -> Option<usize> {
    first_special_in_words(bytes)
}

/// [`first_special`] eight bytes at a time, each word tested for all four
/// kinds at once (the lowest byte the test flags is always a true one).
#[inline]
fn first_special_in_words(bytes: &[u8]) -> Option<usize> {
    let mut words = bytes.chunks_exact(8);
    let mut at = 0;
    for word in words.by_ref() {
        let w = u64::from_le_bytes(word.try_into().expect("eight bytes"));
        let quote = w ^ (ONES * u64::from(b'"'));
        let backslash = w ^ (ONES * u64::from(b'\\'));
        let flags = ((quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | (w.wrapping_sub(ONES * 0x20) & !w)
            | w)
            & HIGHS;
        if flags != 0 {
            return Some(at + (flags.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    words.remainder().iter().position(|&b| b == b'"' || b == b'\\' || !(0x20..0x80).contains(&b)).map(|i| at + i)
}

/// `bytes` as a JSON string's text: `None` if it holds a control character
/// or is not UTF-8.
#[inline]
fn text(bytes: &[u8]) -> Option<&str> {
    let (mut control, mut high) = (false, false);
    for &b in bytes {
        control |= b < 0x20;
        high |= b >= 0x80;
    }
    if control {
        return None;
    }
    if high {
        std::str::from_utf8(bytes).ok()
    } else {
        // SAFETY: every byte is below 0x80, and ASCII is UTF-8.
        Some(unsafe { std::str::from_utf8_unchecked(bytes) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_it_is_asked_for_and_gives_up_on_the_rest() {
        let mut s = Scanner::new(br#" { "a" : 12 , "b":"x y","c":0}  "#);
        assert_eq!(s.punct(b'{'), Some(()));
        assert_eq!(s.key(), Some(&b"a"[..]));
        assert_eq!(s.integer(), Some(12));
        assert_eq!(s.next_member(), Some(true));
        assert_eq!(s.key(), Some(&b"b"[..]));
        assert_eq!(s.string(), Some("x y"));
        assert_eq!(s.next_member(), Some(true));
        assert_eq!(s.key(), Some(&b"c"[..]));
        assert_eq!(s.integer(), Some(0));
        assert_eq!(s.next_member(), Some(false));
        assert_eq!(s.end(), Some(()));

        for number in ["01", "-1", "-0", "1.5", "1e3", "1E3", "", "1234567890123456789", "x"] {
            assert_eq!(Scanner::new(number.as_bytes()).integer(), None, "{number}");
        }
        assert_eq!(Scanner::new(b"123456789012345678").integer(), Some(123_456_789_012_345_678));
        for string in [r#""a\"b""#, "\"a\tb\"", "\"\u{1}\"", "\"open", "x"] {
            assert_eq!(Scanner::new(string.as_bytes()).string(), None, "{string:?}");
        }
        assert_eq!(Scanner::new(b"\"\xff\"").string(), None);
        assert_eq!(Scanner::new("\"é ü\"".as_bytes()).string(), Some("é ü"));
        assert_eq!(Scanner::new(b"} x").end(), None);
    }

    #[test]
    fn plain_texts_are_indexed_and_read_alike() {
        let plain =
            br#"{"a":"xyz","bb":"","c":"0123456789012345678901234567890123456789012345678901234567890123456789"}"#;
        let mut s = Scanner::new(plain);
        assert!(s.quotes.is_some());
        let mut unindexed = Scanner::new(plain);
        unindexed.quotes = None;
        for scanner in [&mut s, &mut unindexed] {
            scanner.punct(b'{').unwrap();
            assert_eq!(scanner.key(), Some(&b"a"[..]));
            assert_eq!(scanner.string(), Some("xyz"));
            scanner.next_member().unwrap();
            assert_eq!(scanner.key(), Some(&b"bb"[..]));
            assert_eq!(scanner.string(), Some(""));
            scanner.next_member().unwrap();
            assert_eq!(scanner.key(), Some(&b"c"[..]));
            assert_eq!(scanner.string().map(str::len), Some(70));
            assert_eq!(scanner.next_member(), Some(false));
            assert_eq!(scanner.end(), Some(()));
        }
        // An unterminated string at every length, indexed.
        for len in 0..200 {
            let mut text = b"\"".to_vec();
            text.extend(std::iter::repeat_n(b'x', len));
            let mut s = Scanner::new(&text);
            assert!(s.quotes.is_some());
            assert_eq!(s.string(), None);
            text.push(b'"');
            assert_eq!(Scanner::new(&text).string().map(str::len), Some(len));
        }
        for text in [&b"\"a\\\"b\""[..], b"\"a\tb\"", "\"é\"".as_bytes(), b"{ \n}"] {
            assert!(Scanner::new(text).quotes.is_none(), "{text:?}");
        }
        assert!(Scanner::new(&vec![b' '; INDEXED + 1]).quotes.is_none());
    }

    #[test]
    fn the_word_at_a_time_search_finds_the_first_special_byte() {
        // Every position in a word and in the tail, every kind of byte,
        // after plain and after non-ASCII text.
        for len in 0..40 {
            for special in [b'"', b'\\', 0x00, 0x1f, 0x80, 0xff] {
                for filler in [b'a', b' ', b'~', 0x7f] {
                    let mut bytes = vec![filler; len];
                    bytes.push(special);
                    bytes.extend_from_slice(b"\"\\\x01\xc3");
                    assert_eq!(first_special(&bytes), Some(len), "{len} {special:#x} {filler:#x}");
                    assert_eq!(first_special_in_words(&bytes), Some(len), "{len} {special:#x} {filler:#x}");
                }
            }
            assert_eq!(first_special(&vec![b'x'; len]), None);
            assert_eq!(first_special_in_words(&vec![b'x'; len]), None);
        }
    }
}
