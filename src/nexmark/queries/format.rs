//! Formatting values the way the canonical CSV wants them.

use std::fmt::Write;

use crate::sink::csv_field;
use crate::time::Timestamp;

/// `price · 0.908` as an exact decimal with three fractional digits
/// (integer arithmetic in thousandths).
///
/// ```
/// assert_eq!(highwater::nexmark::queries::euros(1000), "908.000");
/// assert_eq!(highwater::nexmark::queries::euros(1), "0.908");
/// assert_eq!(highwater::nexmark::queries::euros(-3), "-2.724");
/// ```
pub fn euros(price: i64) -> String {
    let thousandths = i128::from(price) * 908;
    let sign = if thousandths < 0 { "-" } else { "" };
    let a = thousandths.unsigned_abs();
    format!("{sign}{}.{:03}", a / 1000, a % 1000)
}

/// Days since the epoch to (year, month, day), proleptic Gregorian (H. Hinnant).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The UTC day of an epoch-ms time, `yyyy-MM-dd`.
///
/// ```
/// assert_eq!(highwater::nexmark::queries::utc_day(1_704_067_203_456), "2024-01-01");
/// ```
pub fn utc_day(ms: Timestamp) -> String {
    let (y, m, d) = civil_from_days((ms / 86_400_000) as i64);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The UTC hour and minute of an epoch-ms time.
pub fn utc_hour_minute(ms: Timestamp) -> (u32, u32) {
    let in_day = ms % 86_400_000;
    ((in_day / 3_600_000) as u32, (in_day / 60_000 % 60) as u32)
}

/// Whether rows are written out or only counted.
#[derive(Clone, Copy, Debug)]
pub(super) struct RowFormat {
    pub(super) blackhole: bool,
}

impl RowFormat {
    /// A new row (one that ignores its fields, for a blackhole).
    pub(super) fn row(self) -> Row {
        Row { line: String::with_capacity(if self.blackhole { 0 } else { 128 }), empty: true, muted: self.blackhole }
    }
}

/// The header of a bid's columns ([`Row::bid`]).
pub(super) const BID_COLUMNS: [&str; 7] = ["auction", "bidder", "price", "channel", "url", "dateTime", "extra"];

/// Builds a CSV line from fields.
pub(super) struct Row {
    line: String,
    empty: bool,
    muted: bool,
}

impl Row {
    #[cfg(test)]
    fn new() -> Self {
        RowFormat { blackhole: false }.row()
    }
    #[inline]
    fn sep(&mut self) {
        if !std::mem::replace(&mut self.empty, false) {
            self.line.push(',');
        }
    }
    #[inline]
    pub(super) fn int(mut self, v: impl std::fmt::Display) -> Self {
        if self.muted {
            return self;
        }
        self.sep();
        let _ = write!(self.line, "{v}");
        self
    }
    #[inline]
    pub(super) fn str(mut self, v: &str) -> Self {
        if self.muted {
            return self;
        }
        self.sep();
        csv_field(&mut self.line, v);
        self
    }
    /// A day since the epoch as `yyyy-MM-dd`.
    #[inline]
    pub(super) fn day(self, day: u64) -> Self {
        if self.muted {
            return self;
        }
        self.str(&utc_day(day * 86_400_000))
    }
    /// A price as exact euros (see [`euros`]).
    #[inline]
    pub(super) fn euros(self, price: i64) -> Self {
        if self.muted {
            return self;
        }
        self.str(&euros(price))
    }
    #[inline]
    pub(super) fn float(self, v: f64) -> Self {
        self.int(v)
    }
    /// A bid's columns ([`BID_COLUMNS`]), as q0 gives them.
    #[inline]
    pub(super) fn bid(self, b: &crate::nexmark::Bid) -> Self {
        if self.muted {
            return self;
        }
        self.int(b.auction).int(b.bidder).int(b.price).str(&b.channel).str(&b.url).int(b.date_time).str(&b.extra)
    }
    #[inline]
    pub(super) fn done(self) -> String {
        self.line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_convert() {
        assert_eq!(utc_day(0), "1970-01-01");
        assert_eq!(utc_day(951_782_400_000), "2000-02-29");
        assert_eq!(utc_hour_minute(1_704_067_203_456 + 13 * 3_600_000 + 7 * 60_000), (13, 7));
    }

    #[test]
    fn rows_quote_and_separate() {
        assert_eq!(Row::new().int(1).str("a,b").float(0.5).done(), "1,\"a,b\",0.5");
        assert_eq!(Row::new().str("").int(2).done(), ",2");
    }
}
