//! One job on several processes: the same binary started once per process
//! with timely's `-n` (processes), `-p` (this one's index) and `-h` (a file
//! of `host:port` lines), its sources' partitions spread over every worker
//! of every process, keyed state exchanged between them over TCP.
//!
//! ```sh
//! # Starts 2 processes of 2 workers each on free local ports, waits for them
//! # and checks their output:
//! cargo run --release --example several_processes
//! # or by hand, one command per process (same hosts file everywhere):
//! printf 'localhost:2101\nlocalhost:2102\n' > hosts
//! cargo run --release --example several_processes -- /tmp/out -w 2 -n 2 -p 0 -h hosts &
//! cargo run --release --example several_processes -- /tmp/out -w 2 -n 2 -p 1 -h hosts
//! ```
//!
//! The job counts words per 5 s window over 8 partitions of text; every
//! worker writes the results it computed to `OUT/worker-<index>.csv`. Run
//! without arguments, the program starts its own processes (itself, with the
//! arguments above), then checks that the files together hold exactly the
//! counts computed directly from the text, each once.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use highwater::prelude::*;
use highwater::sink::{write, Placement, Sink, SinkError};

/// A line of text with its event time.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Line {
    /// The text.
    pub text: String,
    /// Event time (ms).
    pub time: u64,
}

const WORDS: [&str; 7] = ["stream", "window", "watermark", "state", "join", "time", "event"];

/// 8 partitions of 500 lines each.
pub fn partitions() -> Vec<Vec<Line>> {
    (0..8u64)
        .map(|p| {
            (0..500u64)
                .map(|i| {
                    let words: Vec<&str> = (0..(i % 4 + 1)).map(|w| WORDS[((i * 3 + w + p) % 7) as usize]).collect();
                    Line { text: words.join(" "), time: i * 40 + p }
                })
                .collect()
        })
        .collect()
}

/// `window_start,word,count` rows, computed directly, sorted as text.
pub fn expected() -> Vec<String> {
    let mut counts: BTreeMap<(u64, String), u64> = BTreeMap::new();
    for line in partitions().into_iter().flatten() {
        for word in line.text.split(' ') {
            *counts.entry((line.time / 5_000 * 5_000, word.to_owned())).or_insert(0) += 1;
        }
    }
    let mut rows: Vec<String> = counts.into_iter().map(|((start, word), n)| format!("{start},{word},{n}")).collect();
    rows.sort();
    rows
}

/// Appends each worker's results to its own file.
#[derive(Debug)]
struct WorkerFile(std::io::BufWriter<std::fs::File>, PathBuf);

impl Sink for WorkerFile {
    type Item = String;
    fn write(&mut self, updates: &mut Vec<(String, u64, i64)>) -> Result<u64, SinkError> {
        let io = |source| SinkError::Io { what: self.1.display().to_string(), source };
        let mut n = 0;
        for (row, _, diff) in updates.drain(..) {
            // Without allowed lateness, window results are final: insertions only.
            for _ in 0..diff {
                writeln!(self.0, "{row}").map_err(io)?;
                n += 1;
            }
        }
        Ok(n)
    }
    fn finish(&mut self) -> Result<u64, SinkError> {
        self.0.flush().map_err(|source| SinkError::Io { what: self.1.display().to_string(), source })?;
        Ok(0)
    }
}

/// Runs this process's part of the job, writing into `out`.
pub fn run(out: &Path, timely_args: &[String]) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    let source = Arc::new(MemorySource::new(partitions()));
    let out = out.to_owned();
    Job::from_args(timely_args)?.run(move |worker| {
        let (source, out) = (Arc::clone(&source), out.clone());
        worker.dataflow(|scope| -> anyhow::Result<()> {
            let lines = FromSource::new(source, |l: &Line| l.time).batch_size(64).build(scope)?;
            let words = lines.events.flat_map(|l| l.text.split(' ').map(str::to_owned).collect::<Vec<_>>());
            let counts = words.key_by(|w: &String| w.clone()).window(Tumbling::of(5.secs())).aggregate(Count);
            let rows = counts.results.map(|r| format!("{},{},{}", r.window.start, r.key, r.value));
            write(&rows, "WorkerFile", Placement::EachWorker, move |index, _| {
                let path = out.join(format!("worker-{index}.csv"));
                let file = std::fs::File::create(&path)
                    .map_err(|source| SinkError::Io { what: path.display().to_string(), source })?;
                Ok(WorkerFile(std::io::BufWriter::new(file), path))
            });
            Ok(())
        })
    })?;
    Ok(())
}

/// Every row the workers wrote into `out`, sorted.
pub fn written(out: &Path) -> anyhow::Result<Vec<String>> {
    let mut rows = Vec::new();
    for file in std::fs::read_dir(out)?.flatten() {
        rows.extend(std::fs::read_to_string(file.path())?.lines().map(str::to_owned));
    }
    rows.sort();
    Ok(rows)
}

/// Starts `processes` processes of `workers` workers each, on free local
/// ports, writing into `out`; waits for them. Each is `program(args)`: this
/// program, given the arguments of its [`run`].
pub fn launch(
    program: impl Fn(Vec<String>) -> Command,
    out: &Path,
    processes: usize,
    workers: usize,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    let hosts = out.with_extension("hosts");
    let mut list = String::new();
    for _ in 0..processes {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        list.push_str(&format!("127.0.0.1:{port}\n"));
    }
    std::fs::write(&hosts, list)?;
    let children: Vec<_> = (0..processes)
        .map(|p| {
            let mut args = vec![out.display().to_string()];
            for (flag, value) in [("-w", workers), ("-n", processes), ("-p", p)] {
                args.extend([flag.to_owned(), value.to_string()]);
            }
            args.extend(["-h".to_owned(), hosts.display().to_string()]);
            program(args).spawn()
        })
        .collect::<Result<_, _>>()?;
    for (p, mut child) in children.into_iter().enumerate() {
        let status = child.wait()?;
        anyhow::ensure!(status.success(), "process {p} failed: {status}");
    }
    let _ = std::fs::remove_file(&hosts);
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.split_first() {
        Some((out, timely_args)) => run(Path::new(out), timely_args),
        None => {
            let out = std::env::temp_dir().join(format!("highwater-several-processes-{}", std::process::id()));
            let exe = std::env::current_exe()?;
            let program = |args: Vec<String>| {
                let mut command = Command::new(&exe);
                command.args(args);
                command
            };
            launch(program, &out, 2, 2)?;
            let rows = written(&out)?;
            let _ = std::fs::remove_dir_all(&out);
            anyhow::ensure!(rows == expected(), "the workers' rows differ from the counts computed directly");
            println!("ok: {} window counts from 2 processes of 2 workers, each once, as computed directly", rows.len());
            Ok(())
        }
    }
}
