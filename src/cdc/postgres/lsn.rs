//! Log sequence numbers: positions in PostgreSQL's write-ahead log, written
//! as two hexadecimal halves (`16/B374D848`).

/// Parses an LSN in PostgreSQL's text form (`16/B374D848`).
///
/// ```
/// use highwater::cdc::postgres::lsn::{format_lsn, parse_lsn};
/// assert_eq!(parse_lsn("16/B374D848"), Some(0x16_B374_D848));
/// assert_eq!(format_lsn(0x16_B374_D848), "16/B374D848");
/// assert_eq!(parse_lsn("nonsense"), None);
/// ```
pub fn parse_lsn(text: &str) -> Option<u64> {
    let (high, low) = text.trim().split_once('/')?;
    let high = u32::from_str_radix(high, 16).ok()?;
    let low = u32::from_str_radix(low, 16).ok()?;
    Some((u64::from(high) << 32) | u64::from(low))
}

/// Formats an LSN the way PostgreSQL writes it (`16/B374D848`).
pub fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF)
}
