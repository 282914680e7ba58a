//! CSV encoding in the canonical form the Nexmark comparison uses.

/// A record that can be written as a CSV row.
pub trait CsvRow {
    /// The column names, in order.
    fn header() -> &'static [&'static str];
    /// Appends the row (without the line ending) to `out`.
    fn write_row(&self, out: &mut String);
}

/// Appends `value` as a CSV field: verbatim, or double-quoted (with `"` doubled)
/// if it contains a comma, a quote, CR or LF.
///
/// ```
/// let mut s = String::new();
/// highwater::sink::csv_field(&mut s, "plain");
/// s.push(',');
/// highwater::sink::csv_field(&mut s, "a \"quoted\", value");
/// assert_eq!(s, r#"plain,"a ""quoted"", value""#);
/// ```
pub fn csv_field(out: &mut String, value: &str) {
    if value.contains([',', '"', '\r', '\n']) {
        out.push('"');
        for c in value.chars() {
            if c == '"' {
                out.push('"');
            }
            out.push(c);
        }
        out.push('"');
    } else {
        out.push_str(value);
    }
}
