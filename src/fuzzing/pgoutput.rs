//! PostgreSQL's pgoutput messages and the text form of column values.

use super::Outcome;
use crate::cdc::postgres::pgoutput::{parse, Message, OldKind, Tuple, TupleValue};
use crate::cdc::postgres::types::PgType;
use crate::cdc::Value;

/// Writes `message` in the pgoutput format that [`parse`] reads.
pub fn encode_pgoutput(message: &Message<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    let string = |out: &mut Vec<u8>, s: &str| {
        out.extend_from_slice(s.as_bytes());
        out.push(0);
    };
    let tuple = |out: &mut Vec<u8>, t: &Tuple<'_>| {
        out.extend_from_slice(&i16::try_from(t.len()).expect("at most i16::MAX columns").to_be_bytes());
        for value in t {
            match value {
                TupleValue::Null => out.push(b'n'),
                TupleValue::Unchanged => out.push(b'u'),
                TupleValue::Text(b) | TupleValue::Binary(b) => {
                    out.push(if matches!(value, TupleValue::Text(_)) { b't' } else { b'b' });
                    out.extend_from_slice(&u32::try_from(b.len()).expect("a value under 4 GiB").to_be_bytes());
                    out.extend_from_slice(b);
                }
            }
        }
    };
    let old_kind = |kind: &OldKind| match kind {
        OldKind::Key => b'K',
        OldKind::Full => b'O',
    };
    match message {
        Message::Begin(b) => {
            out.push(b'B');
            out.extend_from_slice(&b.final_lsn.to_be_bytes());
            out.extend_from_slice(&b.commit_time.to_be_bytes());
            out.extend_from_slice(&b.xid.to_be_bytes());
        }
        Message::Commit(c) => {
            out.push(b'C');
            out.push(c.flags);
            out.extend_from_slice(&c.commit_lsn.to_be_bytes());
            out.extend_from_slice(&c.end_lsn.to_be_bytes());
            out.extend_from_slice(&c.commit_time.to_be_bytes());
        }
        Message::Origin { lsn, name } => {
            out.push(b'O');
            out.extend_from_slice(&lsn.to_be_bytes());
            string(&mut out, name);
        }
        Message::Relation(r) => {
            out.push(b'R');
            out.extend_from_slice(&r.id.to_be_bytes());
            string(&mut out, &r.namespace);
            string(&mut out, &r.name);
            out.push(r.replica_identity);
            out.extend_from_slice(&i16::try_from(r.columns.len()).expect("at most i16::MAX columns").to_be_bytes());
            for c in &r.columns {
                out.push(u8::from(c.key));
                string(&mut out, &c.name);
                out.extend_from_slice(&c.type_oid.to_be_bytes());
                out.extend_from_slice(&c.type_modifier.to_be_bytes());
            }
        }
        Message::Type { oid, namespace, name } => {
            out.push(b'Y');
            out.extend_from_slice(&oid.to_be_bytes());
            string(&mut out, namespace);
            string(&mut out, name);
        }
        Message::Insert { relation, new } => {
            out.push(b'I');
            out.extend_from_slice(&relation.to_be_bytes());
            out.push(b'N');
            tuple(&mut out, new);
        }
        Message::Update { relation, old, new } => {
            out.push(b'U');
            out.extend_from_slice(&relation.to_be_bytes());
            if let Some((kind, t)) = old {
                out.push(old_kind(kind));
                tuple(&mut out, t);
            }
            out.push(b'N');
            tuple(&mut out, new);
        }
        Message::Delete { relation, old: (kind, t) } => {
            out.push(b'D');
            out.extend_from_slice(&relation.to_be_bytes());
            out.push(old_kind(kind));
            tuple(&mut out, t);
        }
        Message::Truncate { relations, options } => {
            out.push(b'T');
            out.extend_from_slice(&u32::try_from(relations.len()).expect("at most u32::MAX tables").to_be_bytes());
            out.push(*options);
            for r in relations {
                out.extend_from_slice(&r.to_be_bytes());
            }
        }
        Message::Message { transactional, lsn, prefix, content } => {
            out.push(b'M');
            out.push(u8::from(*transactional));
            out.extend_from_slice(&lsn.to_be_bytes());
            string(&mut out, prefix);
            out.extend_from_slice(&u32::try_from(content.len()).expect("content under 4 GiB").to_be_bytes());
            out.extend_from_slice(content);
        }
    }
    out
}

const TYPES: [PgType; 12] = [
    PgType::Bool,
    PgType::Int,
    PgType::Float,
    PgType::Numeric,
    PgType::Text,
    PgType::Bytea,
    PgType::Date,
    PgType::Timestamp,
    PgType::TimestampTz,
    PgType::Time,
    PgType::Uuid,
    PgType::Json,
];

/// A pgoutput message ([`parse`]), and the text of each of its tuple values
/// read as every supported column type ([`PgType::parse`]), as the CDC
/// source decodes them. An accepted message writes back
/// ([`encode_pgoutput`]) to at most its own bytes, which parse to the same
/// message, and no shorter piece of that encoding parses; values that parse
/// are checked against their text (dates and times written back, UUIDs in
/// lower case, bytes in hex).
pub fn pgoutput(data: &[u8]) -> Outcome {
    let parsed = parse(data);
    if let Ok(message) = &parsed {
        let bytes = encode_pgoutput(message);
        assert!(bytes.len() <= data.len(), "a message re-encodes longer than it was");
        assert_eq!(parse(&bytes).as_ref(), Ok(message), "a message does not round-trip");
        for cut in [bytes.len() - 1, bytes.len() / 2] {
            assert!(parse(&bytes[..cut]).is_err(), "a message cut to {cut} of {} bytes parses", bytes.len());
        }
        let tuples: Vec<&Tuple<'_>> = match message {
            Message::Insert { new, .. } => vec![new],
            Message::Update { old, new, .. } => old.iter().map(|(_, t)| t).chain([new]).collect(),
            Message::Delete { old: (_, t), .. } => vec![t],
            _ => vec![],
        };
        for value in tuples.into_iter().flatten() {
            if let TupleValue::Text(bytes) = value {
                if let Ok(text) = std::str::from_utf8(bytes) {
                    for ty in TYPES {
                        check_value(ty, text);
                    }
                }
            }
        }
    }
    Outcome::from(&parsed)
}

fn check_value(ty: PgType, text: &str) {
    let Ok(value) = ty.parse(text) else { return };
    let back = match (&value, ty) {
        (Value::Date(d), PgType::Date) if *d != i32::MAX && *d != i32::MIN => Some(format_date(i64::from(*d))),
        (Value::Time(t), PgType::Time) => Some(format_time(*t)),
        (Value::Timestamp(t), PgType::Timestamp) if *t != i64::MAX && *t != i64::MIN => {
            let (days, micros) = (t.div_euclid(86_400_000_000), t.rem_euclid(86_400_000_000));
            let (date, bc) = format_ymd(days);
            Some(format!("{date} {}{bc}", format_time(micros)))
        }
        (Value::TimestampTz(t), PgType::TimestampTz) if *t != i64::MAX && *t != i64::MIN => {
            let (days, micros) = (t.div_euclid(86_400_000_000), t.rem_euclid(86_400_000_000));
            let (date, bc) = format_ymd(days);
            Some(format!("{date} {}+00{bc}", format_time(micros)))
        }
        (Value::Bytes(b), PgType::Bytea) => {
            Some(format!("\\x{}", b.iter().map(|x| format!("{x:02x}")).collect::<String>()))
        }
        (Value::Uuid(u), PgType::Uuid) => {
            assert_eq!(u, &text.to_ascii_lowercase());
            None
        }
        (Value::Int(i), PgType::Int) => Some(i.to_string()),
        (Value::Bool(_), PgType::Bool)
        | (Value::Float(_), PgType::Float)
        | (Value::Numeric(_), PgType::Numeric)
        | (Value::Text(_), PgType::Text)
        | (Value::Json(_), PgType::Json)
        | (Value::Date(_), PgType::Date)
        | (Value::Timestamp(_), PgType::Timestamp)
        | (Value::TimestampTz(_), PgType::TimestampTz) => None,
        (v, ty) => panic!("{ty:?} parsed {text:?} as {v:?}"),
    };
    if let Some(back) = back {
        assert_eq!(ty.parse(&back), Ok(value), "{ty:?}: {text:?} and its value written back ({back:?}) differ");
    }
}

/// Days since 1970-01-01 as `YYYY-MM-DD` and the era suffix (` BC` or ``).
fn format_ymd(days: i64) -> (String, &'static str) {
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    if year <= 0 {
        (format!("{:04}-{month:02}-{day:02}", 1 - year), " BC")
    } else {
        (format!("{year:04}-{month:02}-{day:02}"), "")
    }
}

fn format_date(days: i64) -> String {
    let (date, bc) = format_ymd(days);
    format!("{date}{bc}")
}

fn format_time(micros: i64) -> String {
    let (s, us) = (micros / 1_000_000, micros % 1_000_000);
    format!("{:02}:{:02}:{:02}.{us:06}", s / 3600, s / 60 % 60, s % 60)
}
