//! Materialized views served over HTTP (feature `serve`): tables a job
//! maintains, read by key, by key range or prefix, as of the current
//! watermark or any retained past time, several at one time, and
//! subscribed to as a changelog with progress — while the dataflow runs.
//!
//! ```no_run
//! use highwater::serve::{serve_views, ServeOptions, Views};
//! use highwater_operators::table::TableReader;
//!
//! let views = Views::new();
//! // Served by `Table::serve(&balances)` in the dataflow, on every worker.
//! let balances: TableReader<u64, i64> = views.table("balances", 24 * 3_600_000);
//! let server = serve_views("127.0.0.1:8080".parse().unwrap(), views, ServeOptions::default()).unwrap();
//! println!("http://{}/views/balances/42", server.local_addr());
//! # drop(balances);
//! ```
//!
//! Each process serves the keys of its own workers: on several processes,
//! ask each (or put one process in front).

mod server;
mod slice;
mod views;

pub use server::{serve_views, ServeError, ServeOptions, ViewServer};
pub use views::{Change, Scan, ViewError, Views};
