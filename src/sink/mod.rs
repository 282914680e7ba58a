//! Sinks: where results go. Lines (CSV or JSON) to a file or stdout, in append
//! or table mode, and an in-memory collector for tests and notebooks.

mod collect;
mod csv;
mod lines;

pub use collect::{collect, Collected};
pub use csv::{csv_field, CsvRow};
pub use lines::{write_lines, LineTarget, SinkHandle, SinkMode};
