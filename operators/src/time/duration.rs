//! Durations written as `4s`, `250ms`, `2m`, `1h` in configuration and on the
//! command line.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A parse error naming the text and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {text:?}: expected a whole number followed by ms, s, m or h (e.g. 4s, 250ms)")]
pub struct DurationError {
    /// The text that did not parse.
    pub text: String,
}

/// Parses `250ms`, `4s`, `2m`, `1h` (or a bare number of milliseconds) into milliseconds.
///
/// # Examples
/// ```
/// use highwater_operators::time::parse_duration;
/// assert_eq!(parse_duration("4s"), Ok(4_000));
/// assert_eq!(parse_duration("250ms"), Ok(250));
/// assert!(parse_duration("four seconds").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<u64, DurationError> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let err = || DurationError { text: text.to_owned() };
    let n: u64 = number.parse().map_err(|_| err())?;
    let scale = match unit.trim() {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        _ => return Err(err()),
    };
    n.checked_mul(scale).ok_or_else(err)
}

/// A duration, as every highwater function that takes one accepts it:
/// milliseconds as an integer (`250`, `10.secs()`, `2.minutes()`), a
/// [`std::time::Duration`], or a [`Millis`] from configuration. Event time
/// is kept in whole milliseconds: a `Duration` is truncated to them (and
/// saturates at `u64::MAX`), and a negative integer counts as zero.
///
/// ```
/// use std::time::Duration;
/// use highwater_operators::time::{IntoMillis, Millis};
/// use highwater_operators::DurationExt;
/// assert_eq!(Duration::from_secs(4).into_millis(), 4_000);
/// assert_eq!(4.secs().into_millis(), 4_000);
/// assert_eq!(250.into_millis(), 250);
/// assert_eq!(Millis(7).into_millis(), 7);
/// assert_eq!((-5i64).into_millis(), 0);
/// ```
pub trait IntoMillis {
    /// The duration in milliseconds.
    fn into_millis(self) -> u64;
}

impl IntoMillis for std::time::Duration {
    fn into_millis(self) -> u64 {
        u64::try_from(self.as_millis()).unwrap_or(u64::MAX)
    }
}

impl IntoMillis for Millis {
    fn into_millis(self) -> u64 {
        self.0
    }
}

macro_rules! unsigned_millis {
    ($($t:ty),*) => {$(
        impl IntoMillis for $t {
            fn into_millis(self) -> u64 {
                self as u64
            }
        }
    )*};
}
unsigned_millis!(u64, u32, u16, u8, usize);

macro_rules! signed_millis {
    ($($t:ty),*) => {$(
        impl IntoMillis for $t {
            fn into_millis(self) -> u64 {
                self.max(0) as u64
            }
        }
    )*};
}
signed_millis!(i64, i32, i16, i8, isize);

/// A duration in milliseconds that reads and writes as text (`"4s"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Millis(pub u64);

impl FromStr for Millis {
    type Err = DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_duration(s).map(Millis)
    }
}

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0;
        if ms != 0 && ms % 3_600_000 == 0 {
            write!(f, "{}h", ms / 3_600_000)
        } else if ms != 0 && ms % 60_000 == 0 {
            write!(f, "{}m", ms / 60_000)
        } else if ms != 0 && ms % 1_000 == 0 {
            write!(f, "{}s", ms / 1_000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

impl Serialize for Millis {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Millis {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Serde for a [`std::time::Duration`] in configuration: written as text
/// (`"30s"`, `"250ms"`), read from text or from a number of milliseconds.
/// Use with `#[serde(with = "highwater::time::duration_text")]`.
pub mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    use super::Millis;

    /// Writes `d` as text, e.g. `"30s"`.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&Millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
    }

    /// Reads a duration from text (`"30s"`) or milliseconds (`30000`).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Ms(u64),
            Text(Millis),
        }
        Ok(Duration::from_millis(match Either::deserialize(d)? {
            Either::Ms(ms) => ms,
            Either::Text(Millis(ms)) => ms,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for text in ["4s", "250ms", "2m", "1h", "0ms"] {
            assert_eq!(text.parse::<Millis>().unwrap().to_string(), text);
        }
        assert_eq!("1500".parse::<Millis>(), Ok(Millis(1500)));
        assert!("s".parse::<Millis>().is_err());
        assert!("5 parsecs".parse::<Millis>().is_err());
    }

    #[test]
    fn durations_in_configuration_read_text_or_milliseconds() {
        use serde::de::value::{Error, StrDeserializer, U64Deserializer};
        use std::time::Duration;
        let text = StrDeserializer::<Error>::new("30s");
        assert_eq!(duration_text::deserialize(text), Ok(Duration::from_secs(30)));
        let ms = U64Deserializer::<Error>::new(250);
        assert_eq!(duration_text::deserialize(ms), Ok(Duration::from_millis(250)));
        assert!(duration_text::deserialize(StrDeserializer::<Error>::new("soon")).is_err());
    }
}
