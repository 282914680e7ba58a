//! A sink of your own: implement [`Sink`] (take updates, learn when the
//! watermark passes them, finish) and run it with [`write`], on worker 0 or
//! on every worker.
//!
//! ```sh
//! cargo run --release --example custom_sink -- /tmp/orders-view.csv -w 2
//! ```
//!
//! The job keeps a table of open orders from a stream of order updates
//! (placed, amended, cancelled: upserts and deletes by order id). The sink
//! materializes the table's changelog into a CSV file that always holds the
//! table as of the watermark: it applies insertions and retractions to its
//! rows, and each time the watermark passes new updates it rewrites the file
//! (to a temporary file, then renamed, so a reader never sees half of it).
//! The program checks the final file against the open orders computed
//! directly from the updates and prints how often the view was refreshed.
//! The first argument is the view's path, the rest timely's `-w -n -p -h`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use highwater::prelude::*;
use highwater::sink::{write, Placement, Sink, SinkError};
use highwater::Timestamp;

/// An order update: `amount` cents, or `None` when the order is cancelled.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct OrderUpdate {
    /// The order.
    pub order: u32,
    /// Its amount in cents, or `None` if cancelled.
    pub amount: Option<i64>,
    /// Event time (ms).
    pub time: u64,
}

/// Updates of 400 orders over two partitions: each placed, some amended,
/// some cancelled.
pub fn updates() -> Vec<Vec<OrderUpdate>> {
    let mut partitions = vec![Vec::new(), Vec::new()];
    for order in 0..400u32 {
        let at = u64::from(order) * 250;
        let p = &mut partitions[(order % 2) as usize];
        p.push(OrderUpdate { order, amount: Some(i64::from(order) * 10 + 5), time: at });
        if order % 3 == 0 {
            p.push(OrderUpdate { order, amount: Some(i64::from(order) * 10 + 7), time: at + 900 });
        }
        if order % 7 == 0 {
            p.push(OrderUpdate { order, amount: None, time: at + 1_500 });
        }
    }
    for p in &mut partitions {
        p.sort_by_key(|u| u.time);
    }
    partitions
}

/// The open orders after every update, computed directly: `order,amount` rows.
pub fn expected() -> Vec<String> {
    let mut all: Vec<OrderUpdate> = updates().into_iter().flatten().collect();
    all.sort_by_key(|u| u.time);
    let mut open = BTreeMap::new();
    for u in all {
        match u.amount {
            Some(amount) => open.insert(u.order, amount),
            None => open.remove(&u.order),
        };
    }
    let mut rows: Vec<String> = open.into_iter().map(|(order, amount)| format!("{order},{amount}")).collect();
    // As the view file holds them: sorted as text.
    rows.sort();
    rows
}

/// A view file: the table of rows as of the watermark.
#[derive(Debug)]
pub struct ViewFile {
    path: PathBuf,
    /// Each row with its multiplicity.
    rows: BTreeMap<String, i64>,
    /// Whether rows changed since the file was last written.
    changed: bool,
    /// How many times the file was written.
    pub refreshes: u64,
}

impl ViewFile {
    /// A view at `path`, empty until the first refresh.
    pub fn new(path: PathBuf) -> Self {
        ViewFile { path, rows: BTreeMap::new(), changed: true, refreshes: 0 }
    }

    fn refresh(&mut self, watermark: Option<Timestamp>) -> Result<u64, SinkError> {
        if !self.changed {
            return Ok(0);
        }
        let io = |source| SinkError::Io { what: self.path.display().to_string(), source };
        let tmp = self.path.with_extension("tmp");
        let mut file = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
        let mut written = 0;
        let as_of = watermark.map_or("end of input".to_owned(), |w| format!("watermark {w}"));
        writeln!(file, "# open orders as of {as_of}").map_err(io)?;
        writeln!(file, "order,amount").map_err(io)?;
        for (row, n) in &self.rows {
            for _ in 0..*n {
                writeln!(file, "{row}").map_err(io)?;
                written += 1;
            }
        }
        file.into_inner().map_err(|e| io(e.into_error()))?.sync_all().map_err(io)?;
        std::fs::rename(&tmp, &self.path).map_err(io)?;
        self.changed = false;
        self.refreshes += 1;
        std::fs::write(self.path.with_extension("refreshes"), self.refreshes.to_string()).map_err(io)?;
        Ok(written)
    }
}

impl Sink for ViewFile {
    type Item = String;

    fn write(&mut self, updates: &mut Vec<(String, Timestamp, i64)>) -> Result<u64, SinkError> {
        for (row, _time, diff) in updates.drain(..) {
            let n = self.rows.entry(row.clone()).or_insert(0);
            *n += diff;
            if *n == 0 {
                self.rows.remove(&row);
            }
            self.changed = true;
        }
        Ok(0)
    }

    fn advance(&mut self, frontier: Timestamp) -> Result<u64, SinkError> {
        // Every update before `frontier` has been written: the rows are the
        // table as of the watermark.
        self.refresh(Some(frontier))
    }

    fn finish(&mut self) -> Result<u64, SinkError> {
        self.refresh(None)
    }
}

/// Runs the job, writing the view to `path`; returns how often the view was
/// refreshed (on process 0, where the sink runs).
pub fn run(path: &Path, timely_args: &[String]) -> anyhow::Result<u64> {
    let source = Arc::new(MemorySource::new(updates()));
    let view = path.to_owned();
    Job::from_args(timely_args)?.run(move |worker| {
        let (source, view) = (Arc::clone(&source), view.clone());
        worker.dataflow(|scope| -> anyhow::Result<()> {
            // Small reads, so that the watermark advances many times.
            let orders = FromSource::new(source, |u: &OrderUpdate| u.time).batch_size(16).build(scope)?;
            let table = orders.events.map(|u| (u.order, u.amount)).upsert().table;
            let rows = table.changelog().map(|(order, amount)| format!("{order},{amount}"));
            write(&rows, "ViewFile", Placement::Worker0, move |_worker, _handle| Ok(ViewFile::new(view)));
            Ok(())
        })
    })?;
    let refreshes = std::fs::read_to_string(path.with_extension("refreshes")).unwrap_or_default();
    Ok(refreshes.trim().parse().unwrap_or(0))
}

/// The rows of the view file at `path` (comment and header left out).
pub fn view_rows(path: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path)?;
    Ok(text.lines().skip(2).map(str::to_owned).collect())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((path, timely_args)) = args.split_first() else {
        anyhow::bail!("usage: custom_sink VIEW.csv [-w N]");
    };
    let path = Path::new(path);
    let refreshes = run(path, timely_args)?;
    let rows = view_rows(path)?;
    anyhow::ensure!(rows == expected(), "the view differs from the open orders computed directly");
    anyhow::ensure!(refreshes > 1, "the view was written only once: it should follow the watermark");
    println!("ok: {} open orders in {}, refreshed {refreshes} times", rows.len(), path.display());
    Ok(())
}
