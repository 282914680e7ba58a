//! A PostgreSQL table as a live materialized aggregate.
//!
//! Reads a table through logical decoding (an exact snapshot of its rows, then
//! every committed change), keeps it as a highwater table keyed by its
//! primary key, and maintains `count(*)` and `sum(<amount>)` grouped by a
//! column, printing each change of the view as it happens: `-` the old row of
//! the view, `+` the new one, at the commit time of the transaction that
//! caused it. Transactions are applied atomically, so the view never shows
//! half of one.
//!
//! The server needs `wal_level = logical` (see the PostgreSQL section of
//! `scripts/test.sh` for a throwaway cluster). With a table
//!
//! ```sql
//! CREATE TABLE orders (id int PRIMARY KEY, customer text NOT NULL, amount numeric(10,2) NOT NULL);
//! INSERT INTO orders VALUES (1, 'ann', 10.50), (2, 'bob', 3.00);
//! ```
//!
//! run
//!
//! ```text
//! cargo run --release --example cdc_view -- "host=127.0.0.1 port=5432 user=postgres dbname=postgres" orders customer amount
//! ```
//!
//! which prints the snapshot's view, then follows the table:
//!
//! ```text
//! + ann: 1 rows, total 10.50
//! + bob: 1 rows, total 3.00
//! ```
//!
//! and after `BEGIN; INSERT INTO orders VALUES (3, 'ann', 4.50); UPDATE orders SET customer = 'ann' WHERE id = 2; COMMIT;`:
//!
//! ```text
//! - ann: 1 rows, total 10.50
//! + ann: 3 rows, total 18.00
//! - bob: 1 rows, total 3.00
//! ```
//!
//! It runs until stopped (Ctrl-C). The replication slot and publication it
//! creates are named `highwater_cdc_view`; drop them with
//! `SELECT pg_drop_replication_slot('highwater_cdc_view'); DROP PUBLICATION highwater_cdc_view;`.

use std::sync::Arc;

use anyhow::Context;
use highwater::cdc::postgres::{PostgresConfig, PostgresSource};
use highwater::cdc::{Change, Row, Value};
use highwater::prelude::*;

/// An amount in cents, from a numeric, integer or float column.
fn cents(value: Option<&Value>) -> i64 {
    value.and_then(Value::as_f64).map_or(0, |v| (v * 100.0).round() as i64)
}

fn main() -> anyhow::Result<()> {
    let usage = "usage: cdc_view CONNECTION TABLE GROUP_COLUMN AMOUNT_COLUMN";
    let mut args = std::env::args().skip(1);
    let url = args.next().context(usage)?;
    let table = args.next().context(usage)?;
    let group: Arc<str> = args.next().context(usage)?.into();
    let amount: Arc<str> = args.next().context(usage)?.into();

    let config = PostgresConfig::new(url, [table], "highwater_cdc_view", "highwater_cdc_view");
    let source = Arc::new(PostgresSource::new(config)?);
    let metrics = SourceMetrics::default();
    let errors = metrics.clone();
    timely::execute_directly(move |worker| {
        worker.dataflow::<u64, _, _>(|scope| {
            let options = SourceOptions { name: "postgres".into(), ..Default::default() };
            let changes = read(scope, source, |c: &Change| c.time, options, &metrics, None).expect("source opens");
            // The table, keyed by primary key.
            let rows = changes.events.flat_map(|change| {
                let key: Vec<&str> = change.key.columns.iter().map(|(name, _)| &**name).collect();
                change.upserts(|before| before.project(&key))
            });
            let table = rows.upsert().table;
            // The view: count and sum per group, maintained under inserts, updates and deletes.
            let (g, a) = (Arc::clone(&group), Arc::clone(&amount));
            let view = table.changelog().aggregate_by_key(
                move |(_, row): &(Row, Row)| row.get(&g).map(ToString::to_string).unwrap_or_default(),
                (Count, Sum::of(move |(_, row): &(Row, Row)| cents(row.get(&a)))),
            );
            view.inspect(|((group, (count, total)), _time, diff)| {
                let sign = if *diff > 0 { '+' } else { '-' };
                let total = format!("{:.2}", *total as f64 / 100.0);
                println!("{sign} {group}: {count} rows, total {total}");
            });
            changes.dead_letters.inspect(|(d, _, _)| eprintln!("dead letter: {d}"));
        });
        // A source that fails for good (the server gone) stops the job.
        let _ = highwater::source::run_until_failed(worker, &[&metrics]);
    });
    let problems = errors.errors();
    if !problems.is_empty() {
        anyhow::bail!("{}", problems.join("; "));
    }
    Ok(())
}
