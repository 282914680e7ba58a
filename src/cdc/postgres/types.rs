//! PostgreSQL column types and their text form, mapped to [`Value`]s.
//!
//! Values arrive as text, from pgoutput's tuple data and from the initial
//! snapshot alike, both produced by the types' output functions in a session
//! the source configures (`DateStyle = ISO, YMD`, `TimeZone = UTC`,
//! `bytea_output = hex`, `extra_float_digits = 3`), so one parser serves both.
//! The mapping is the one documented on [`Value`]; infinite dates and
//! timestamps map to the extremes of their range (`i32::MAX`/`i32::MIN`,
//! `i64::MAX`/`i64::MIN`), the way PostgreSQL stores them.

use crate::cdc::{Float, Value};

/// The PostgreSQL types the source reads, by what they become.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PgType {
    /// `bool` → [`Value::Bool`].
    Bool,
    /// `int2`, `int4`, `int8`, `oid` → [`Value::Int`].
    Int,
    /// `float4`, `float8` → [`Value::Float`].
    Float,
    /// `numeric` → [`Value::Numeric`].
    Numeric,
    /// `text`, `varchar`, `bpchar`, `name`, `"char"` → [`Value::Text`].
    Text,
    /// `bytea` → [`Value::Bytes`].
    Bytea,
    /// `date` → [`Value::Date`].
    Date,
    /// `timestamp` → [`Value::Timestamp`].
    Timestamp,
    /// `timestamptz` → [`Value::TimestampTz`].
    TimestampTz,
    /// `time` → [`Value::Time`].
    Time,
    /// `uuid` → [`Value::Uuid`].
    Uuid,
    /// `json`, `jsonb` → [`Value::Json`].
    Json,
}

/// The names of the supported types, for error messages.
pub const SUPPORTED_TYPES: &str = "bool, int2, int4, int8, oid, float4, float8, numeric, text, varchar, bpchar, name, \
                                   \"char\", bytea, date, timestamp, timestamptz, time, uuid, json, jsonb";

/// A value whose text does not parse as its type.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot read {text:?} as {ty:?}: {reason}")]
pub struct ValueError {
    /// The type expected.
    pub ty: PgType,
    /// The text (cut at 100 bytes).
    pub text: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl PgType {
    /// The type of a built-in type OID, if supported.
    pub fn from_oid(oid: u32) -> Option<PgType> {
        Some(match oid {
            16 => PgType::Bool,
            20 | 21 | 23 | 26 => PgType::Int,
            700 | 701 => PgType::Float,
            1700 => PgType::Numeric,
            18 | 19 | 25 | 1042 | 1043 => PgType::Text,
            17 => PgType::Bytea,
            1082 => PgType::Date,
            1114 => PgType::Timestamp,
            1184 => PgType::TimestampTz,
            1083 => PgType::Time,
            2950 => PgType::Uuid,
            114 | 3802 => PgType::Json,
            _ => return None,
        })
    }

    /// Parses a value of this type from its text form.
    ///
    /// ```
    /// use highwater::cdc::postgres::types::PgType;
    /// use highwater::cdc::Value;
    /// assert_eq!(PgType::Date.parse("1970-01-02"), Ok(Value::Date(1)));
    /// assert_eq!(PgType::Bytea.parse("\\x0aff"), Ok(Value::Bytes(vec![10, 255])));
    /// assert!(PgType::Int.parse("twelve").is_err());
    /// ```
    pub fn parse(self, text: &str) -> Result<Value, ValueError> {
        let err = |reason: &'static str| ValueError { ty: self, text: text.chars().take(100).collect(), reason };
        Ok(match self {
            PgType::Bool => match text {
                "t" | "true" => Value::Bool(true),
                "f" | "false" => Value::Bool(false),
                _ => return Err(err("expected t or f")),
            },
            PgType::Int => Value::Int(text.parse().map_err(|_| err("not a 64-bit integer"))?),
            PgType::Float => Value::Float(Float(match text {
                "NaN" => f64::NAN,
                "Infinity" => f64::INFINITY,
                "-Infinity" => f64::NEG_INFINITY,
                _ if text.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+' | b'e' | b'E')) => {
                    text.parse().map_err(|_| err("not a number"))?
                }
                _ => return Err(err("not a number")),
            })),
            PgType::Numeric => {
                if text.is_empty() {
                    return Err(err("empty"));
                }
                Value::Numeric(text.to_owned())
            }
            PgType::Text => Value::Text(text.to_owned()),
            PgType::Bytea => Value::Bytes(parse_hex_bytea(text).ok_or_else(|| err("expected \\x and hex digits"))?),
            PgType::Date => Value::Date(parse_date(text).ok_or_else(|| err("expected YYYY-MM-DD"))?),
            PgType::Timestamp => Value::Timestamp(
                parse_timestamp(text, false).ok_or_else(|| err("expected YYYY-MM-DD HH:MM:SS[.ffffff]"))?,
            ),
            PgType::TimestampTz => Value::TimestampTz(
                parse_timestamp(text, true).ok_or_else(|| err("expected YYYY-MM-DD HH:MM:SS[.ffffff]+HH[:MM]"))?,
            ),
            PgType::Time => Value::Time(parse_time(text).ok_or_else(|| err("expected HH:MM:SS[.ffffff]"))?),
            PgType::Uuid => {
                let ok = text.len() == 36
                    && text.bytes().enumerate().all(|(i, b)| {
                        if matches!(i, 8 | 13 | 18 | 23) {
                            b == b'-'
                        } else {
                            b.is_ascii_hexdigit()
                        }
                    });
                if !ok {
                    return Err(err("not a UUID"));
                }
                Value::Uuid(text.to_ascii_lowercase())
            }
            PgType::Json => Value::Json(text.to_owned()),
        })
    }
}

/// `\x0aff` → `[10, 255]`.
fn parse_hex_bytea(text: &str) -> Option<Vec<u8>> {
    let hex = text.strip_prefix("\\x")?.as_bytes();
    if hex.len() % 2 != 0 {
        return None;
    }
    let digit = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    hex.chunks_exact(2).map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?)).collect()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (astronomical year:
/// 1 BC is year 0).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((month + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if year.rem_euclid(4) == 0 && (year.rem_euclid(100) != 0 || year.rem_euclid(400) == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

fn digits<T: std::str::FromStr>(text: &str) -> Option<T> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The last year PostgreSQL's dates reach (timestamps end earlier).
const MAX_YEAR: i64 = 5_874_897;

/// `YYYY-MM-DD` (the year may be longer), with `bc`: days since 1970-01-01.
fn parse_ymd(text: &str, bc: bool) -> Option<i64> {
    let mut parts = text.splitn(3, '-');
    let year: i64 = digits(parts.next()?)?;
    let month: u32 = digits(parts.next()?)?;
    let day: u32 = digits(parts.next()?)?;
    // Past PostgreSQL's range the day count would overflow.
    if year == 0 || year > MAX_YEAR || !(1..=12).contains(&month) {
        return None;
    }
    let year = if bc { 1 - year } else { year };
    if day == 0 || day > days_in_month(year, month) {
        return None;
    }
    Some(days_from_civil(year, month, day))
}

fn strip_bc(text: &str) -> (&str, bool) {
    match text.strip_suffix(" BC") {
        Some(rest) => (rest, true),
        None => (text, false),
    }
}

fn parse_date(text: &str) -> Option<i32> {
    match text {
        "infinity" => return Some(i32::MAX),
        "-infinity" => return Some(i32::MIN),
        _ => {}
    }
    let (text, bc) = strip_bc(text);
    i32::try_from(parse_ymd(text, bc)?).ok()
}

/// `HH:MM:SS[.ffffff]` → µs since midnight (up to `24:00:00`).
fn parse_time(text: &str) -> Option<i64> {
    let mut parts = text.splitn(3, ':');
    let hours: i64 = digits(parts.next()?)?;
    let minutes: i64 = digits(parts.next()?)?;
    let seconds = parts.next()?;
    let (whole, fraction) = seconds.split_once('.').unwrap_or((seconds, ""));
    let whole: i64 = digits(whole)?;
    if hours > 24 || minutes > 59 || whole > 59 || fraction.len() > 6 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let micros =
        fraction.bytes().chain(std::iter::repeat(b'0')).take(6).fold(0i64, |acc, b| acc * 10 + i64::from(b - b'0'));
    let total = ((hours * 60 + minutes) * 60 + whole) * 1_000_000 + micros;
    (total <= 86_400_000_000).then_some(total)
}

/// `+HH[:MM[:SS]]` or `-HH...` → seconds east of UTC.
fn parse_offset(text: &str) -> Option<i64> {
    let (sign, rest) = match text.as_bytes().first()? {
        b'+' => (1, &text[1..]),
        b'-' => (-1, &text[1..]),
        _ => return None,
    };
    let mut seconds: i64 = 0;
    for (i, part) in rest.split(':').enumerate() {
        let n: i64 = digits(part)?;
        if i > 2 || (i > 0 && n > 59) {
            return None;
        }
        seconds = seconds.checked_add(n.checked_mul([3600, 60, 1][i])?)?;
    }
    Some(sign * seconds)
}

/// `YYYY-MM-DD HH:MM:SS[.ffffff][+HH[:MM[:SS]]][ BC]` → µs since 1970-01-01
/// (UTC when `with_zone`).
fn parse_timestamp(text: &str, with_zone: bool) -> Option<i64> {
    match text {
        "infinity" => return Some(i64::MAX),
        "-infinity" => return Some(i64::MIN),
        _ => {}
    }
    let (text, bc) = strip_bc(text);
    let (date, time) = text.split_once(' ')?;
    let days = parse_ymd(date, bc)?;
    let (time, offset) = if with_zone {
        let at = time.rfind(['+', '-'])?;
        (&time[..at], parse_offset(&time[at..])?)
    } else {
        (time, 0)
    };
    let micros = parse_time(time)?;
    days.checked_mul(86_400_000_000)?.checked_add(micros)?.checked_sub(offset.checked_mul(1_000_000)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(ty: PgType, text: &str) -> Value {
        ty.parse(text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn scalars() {
        assert_eq!(ok(PgType::Bool, "t"), Value::Bool(true));
        assert_eq!(ok(PgType::Bool, "f"), Value::Bool(false));
        assert!(PgType::Bool.parse("yes").is_err());
        assert_eq!(ok(PgType::Int, "-9223372036854775808"), Value::Int(i64::MIN));
        assert!(PgType::Int.parse("1.5").is_err());
        assert_eq!(ok(PgType::Float, "1.5e+20"), Value::Float(Float(1.5e20)));
        assert_eq!(ok(PgType::Float, "-0"), Value::Float(Float(-0.0)));
        assert!(matches!(ok(PgType::Float, "NaN"), Value::Float(f) if f.0.is_nan()));
        assert_eq!(ok(PgType::Float, "Infinity"), Value::Float(Float(f64::INFINITY)));
        assert_eq!(ok(PgType::Float, "-Infinity"), Value::Float(Float(f64::NEG_INFINITY)));
        assert!(PgType::Float.parse("inf").is_err());
        assert_eq!(ok(PgType::Numeric, "12.50"), Value::Numeric("12.50".into()));
        assert_eq!(ok(PgType::Numeric, "NaN"), Value::Numeric("NaN".into()));
        assert_eq!(ok(PgType::Text, "  padded "), Value::Text("  padded ".into()));
        assert_eq!(ok(PgType::Bytea, "\\x"), Value::Bytes(vec![]));
        assert_eq!(ok(PgType::Bytea, "\\xDEADbeef"), Value::Bytes(vec![0xde, 0xad, 0xbe, 0xef]));
        assert!(PgType::Bytea.parse("\\x0").is_err());
        assert!(PgType::Bytea.parse("\\000").is_err());
        assert_eq!(
            ok(PgType::Uuid, "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11"),
            Value::Uuid("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11".into())
        );
        assert!(PgType::Uuid.parse("a0eebc99").is_err());
        assert_eq!(ok(PgType::Json, r#"{"a": [1]}"#), Value::Json(r#"{"a": [1]}"#.into()));
    }

    #[test]
    fn dates_and_times() {
        assert_eq!(ok(PgType::Date, "1970-01-01"), Value::Date(0));
        assert_eq!(ok(PgType::Date, "2000-03-01"), Value::Date(11_017));
        assert_eq!(ok(PgType::Date, "1969-12-31"), Value::Date(-1));
        assert_eq!(ok(PgType::Date, "2024-02-29"), Value::Date(19_782));
        assert!(PgType::Date.parse("2023-02-29").is_err());
        assert_eq!(ok(PgType::Date, "0001-01-01 BC"), Value::Date(-719_528));
        assert_eq!(ok(PgType::Date, "0001-01-01"), Value::Date(-719_162));
        assert_eq!(ok(PgType::Date, "infinity"), Value::Date(i32::MAX));
        assert_eq!(ok(PgType::Date, "-infinity"), Value::Date(i32::MIN));
        assert_eq!(ok(PgType::Time, "00:00:00"), Value::Time(0));
        assert_eq!(ok(PgType::Time, "13:14:15.5"), Value::Time(47_655_500_000));
        assert_eq!(ok(PgType::Time, "24:00:00"), Value::Time(86_400_000_000));
        assert!(PgType::Time.parse("24:00:01").is_err());
        assert!(PgType::Time.parse("12:60:00").is_err());
        assert_eq!(ok(PgType::Timestamp, "1970-01-01 00:00:01.000001"), Value::Timestamp(1_000_001));
        assert_eq!(ok(PgType::Timestamp, "2000-01-01 00:00:00"), Value::Timestamp(946_684_800_000_000));
        assert_eq!(ok(PgType::Timestamp, "10000-01-01 00:00:00"), Value::Timestamp(253_402_300_800_000_000));
        assert_eq!(ok(PgType::Timestamp, "infinity"), Value::Timestamp(i64::MAX));
        assert_eq!(ok(PgType::TimestampTz, "1970-01-01 00:00:00+00"), Value::TimestampTz(0));
        assert_eq!(ok(PgType::TimestampTz, "1970-01-01 05:30:00+05:30"), Value::TimestampTz(0));
        assert_eq!(ok(PgType::TimestampTz, "1969-12-31 23:00:00.25-01"), Value::TimestampTz(250_000));
        assert_eq!(ok(PgType::TimestampTz, "0044-03-15 12:00:00+00 BC"), {
            Value::TimestampTz((days_from_civil(-43, 3, 15) * 86_400 + 43_200) * 1_000_000)
        });
        assert!(PgType::TimestampTz.parse("1970-01-01 00:00:00").is_err());
        assert!(PgType::Timestamp.parse("1970-01-01T00:00:00").is_err());
        // Found by fuzzing (tests/fuzz/pgoutput): these overflowed instead of failing.
        assert!(PgType::Time.parse("99999999999999:00:00").is_err());
        assert!(PgType::Time.parse("25:00:00").is_err());
        assert!(PgType::TimestampTz.parse("2000-01-01 00:00:00+9999999999999999").is_err());
        assert!(PgType::Date.parse("999999999999999999-01-01").is_err());
        assert!(PgType::Timestamp.parse("999999999999999999-01-01 00:00:00 BC").is_err());
        assert_eq!(ok(PgType::Date, "5874897-12-31"), Value::Date(2_145_042_905));
    }

    #[test]
    fn oids() {
        assert_eq!(PgType::from_oid(23), Some(PgType::Int));
        assert_eq!(PgType::from_oid(3802), Some(PgType::Json));
        // point, int4[], interval, money
        for oid in [600, 1007, 1186, 790] {
            assert_eq!(PgType::from_oid(oid), None);
        }
    }
}
