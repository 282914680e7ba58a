//! Served views under load: point reads over HTTP from a load generator in
//! a second process (on loopback) while a job ingests into the served table
//! as fast as it can, the ingest rate with and without the readers, and
//! reads as of a past time against a history of 1 M retained updates.
//!
//! - `ingest`: upserts to random keys of `--keys` (loaded first) into an
//!   upsert table served as a view (no history kept), in batches of
//!   10 000 with the watermark at each batch, for `--seconds`; alone, then
//!   while a load generator reads random keys (`GET /views/t/{key}`) for
//!   the same time: `wrk -t1 -c16 --latency` (`--connections` sets `-c`),
//!   or with `--own-client` this bench's own client in a child process (a
//!   thread per connection, one request at a time, every request timed).
//!   `wrk`'s latency figures do not hold together on this machine (with
//!   one connection it reports a mean latency several times the time
//!   between two requests), so the latency targets are read from the own
//!   client.
//! - `as-of`: 100 000 keys × 10 versions (1 M retained updates), input
//!   closed; `wrk` reads random keys as of random times (`?as_of=`), and
//!   the same reads in process (`TableReader::get_as_of`).
//!
//! Needs `wrk` (Debian: `apt-get install wrk`). Each figure is the median
//! of `--runs` runs. With `WRK_OUT` set, `wrk`'s own report goes to
//! standard error.
//!
//! ```text
//! cargo bench --bench views -- --keys 1000000 --seconds 10 --runs 3
//! cargo bench --bench views -- --keys 1000000 --seconds 10 --runs 3 --connections 4 --own-client
//! cargo bench --bench views -- --keys 1000000 --seconds 10 --runs 3 --ingest-rate 200000
//! ```
//!
//! (`--ingest-rate` caps the upserts a second after the load.)

mod common;

use common::{median, Rng};

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use highwater::serve::{serve_views, ServeOptions, Views};
use highwater_operators::prelude::*;
use highwater_operators::table::TableReader;
use highwater_operators::Update;
use timely::dataflow::operators::{Input, Probe};
use timely::dataflow::ProbeHandle;

/// The allocator of the `highwater` binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCH: u64 = 10_000;
const AHEAD: u64 = 8;

struct Options {
    keys: u64,
    seconds: u64,
    runs: usize,
    /// At most this many upserts a second after the load (none: as fast as
    /// the worker goes).
    ingest_rate: Option<f64>,
    /// `wrk`'s connections, each a request at a time.
    connections: usize,
    /// Point reads from this bench's own client (a child process, a thread
    /// per connection, each request timed on its own) instead of `wrk`.
    own_client: bool,
}

fn parse_args() -> Options {
    let mut o =
        Options { keys: 1_000_000, seconds: 10, runs: 3, ingest_rate: None, connections: 16, own_client: false };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--keys" => o.keys = value().parse().expect("--keys N"),
            "--seconds" => o.seconds = value().parse().expect("--seconds N"),
            "--runs" => o.runs = value().parse().expect("--runs N"),
            "--ingest-rate" => o.ingest_rate = Some(value().parse().expect("--ingest-rate UPSERTS_PER_S")),
            "--connections" => o.connections = value().parse().expect("--connections N"),
            "--own-client" => o.own_client = true,
            "--client" => {
                let (addr, seconds, keys) = (value(), value(), value());
                let connections = value().parse().expect("connections");
                client(&addr, seconds.parse().expect("seconds"), keys.parse().expect("keys"), connections);
                std::process::exit(0);
            }
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    o
}

/// What `wrk` measured.
#[derive(Debug, Default, Clone, Copy)]
struct Load {
    reads_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    non_2xx: u64,
}

/// A duration as `wrk` prints it (`512.00us`, `1.20ms`, `2.00s`), in ms.
fn wrk_ms(text: &str) -> f64 {
    let (number, unit) = text.split_at(text.find(|c: char| c.is_ascii_alphabetic()).expect("a unit"));
    let n: f64 = number.parse().expect("a number");
    match unit {
        "us" => n / 1e3,
        "ms" => n,
        "s" => n * 1e3,
        "m" => n * 60e3,
        other => panic!("unit {other}"),
    }
}

/// The bench's own client (`--client ADDR SECONDS KEYS CONNECTIONS`, run
/// as a child process): `connections` threads, each a keep-alive HTTP/1.1
/// connection reading random keys one request at a time, every request
/// timed; prints the reads per second, p50 and p99 (ms).
fn client(addr: &str, seconds: u64, keys: u64, connections: usize) {
    use std::io::{BufRead, BufReader, Read, Write};
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let threads: Vec<_> = (0..connections)
        .map(|c| {
            let addr = addr.to_owned();
            std::thread::spawn(move || {
                let stream = std::net::TcpStream::connect(&addr).expect("connects");
                stream.set_nodelay(true).unwrap();
                let mut writer = stream.try_clone().unwrap();
                let mut reader = BufReader::new(stream);
                let mut rng = Rng(0x5eed + c as u64);
                let (mut took, mut line, mut body) = (Vec::new(), String::new(), Vec::new());
                while Instant::now() < deadline {
                    let request = format!("GET /views/t/{} HTTP/1.1\r\nHost: bench\r\n\r\n", rng.next() % keys);
                    let start = Instant::now();
                    writer.write_all(request.as_bytes()).unwrap();
                    let mut length = 0;
                    line.clear();
                    reader.read_line(&mut line).unwrap();
                    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
                    loop {
                        line.clear();
                        reader.read_line(&mut line).unwrap();
                        if line == "\r\n" {
                            break;
                        }
                        const LENGTH: &str = "content-length:";
                        if line.get(..LENGTH.len()).is_some_and(|name| name.eq_ignore_ascii_case(LENGTH)) {
                            length = line[LENGTH.len()..].trim().parse().unwrap();
                        }
                    }
                    body.resize(length, 0);
                    reader.read_exact(&mut body).unwrap();
                    took.push(start.elapsed().as_secs_f64() * 1e3);
                }
                took
            })
        })
        .collect();
    let mut took: Vec<f64> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    took.sort_by(f64::total_cmp);
    let at = |q: f64| took[((took.len() as f64 * q) as usize).min(took.len() - 1)];
    println!("{} {} {}", took.len() as f64 / seconds as f64, at(0.5), at(0.99));
}

/// Runs the bench's own client against `base` for `seconds`.
fn own_client(base: &str, keys: u64, seconds: u64, connections: usize) -> Load {
    let addr = base.trim_start_matches("http://");
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--client", addr, &seconds.to_string(), &keys.to_string(), &connections.to_string()])
        .output()
        .expect("the client runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let f: Vec<f64> = text.split_whitespace().map(|n| n.parse().unwrap()).collect();
    assert_eq!(f.len(), 3, "client: {text} {}", String::from_utf8_lossy(&out.stderr));
    Load { reads_per_s: f[0], p50_ms: f[1], p99_ms: f[2], non_2xx: 0 }
}

/// Runs `wrk` for `seconds` against `base` with the request `script` (Lua).
fn wrk(base: &str, script: &str, seconds: u64, connections: usize) -> Load {
    let path = std::env::temp_dir().join(format!("highwater-views-bench-{}.lua", std::process::id()));
    std::fs::write(&path, script).unwrap();
    let out = Command::new("wrk")
        .args(["-t1", &format!("-c{connections}"), &format!("-d{seconds}s"), "--latency", "-s"])
        .arg(&path)
        .arg(base)
        .output()
        .expect("wrk runs (apt-get install wrk)");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if std::env::var_os("WRK_OUT").is_some() {
        eprintln!("{text}");
    }
    let mut load = Load::default();
    for line in text.lines().map(str::trim) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["Requests/sec:", n] => load.reads_per_s = n.parse().unwrap(),
            ["50%", t] => load.p50_ms = wrk_ms(t),
            ["99%", t] => load.p99_ms = wrk_ms(t),
            ["Non-2xx", "or", "3xx", "responses:", n] => load.non_2xx = n.parse().unwrap(),
            _ => {}
        }
    }
    assert!(load.reads_per_s > 0.0, "wrk: {text}");
    let _ = std::fs::remove_file(path);
    load
}

/// The ingest job on one worker: loads every key, then upserts random keys
/// until `stop`; returns the upserts per second after the load.
fn ingest(
    keys: u64,
    cap: Option<f64>,
    reader: TableReader<u64, u64>,
    loaded: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> f64 {
    let rate = Arc::new(AtomicU64::new(0));
    let r = Arc::clone(&rate);
    timely::execute(timely::Config::thread(), move |worker| {
        let probe = ProbeHandle::new();
        let mut input = worker.dataflow::<Timestamp, _, _>(|scope| {
            let (input, stream) = scope.new_input::<Vec<Update<(u64, Option<u64>)>>>();
            let table = EventStream::new(stream).upsert().table;
            table.serve(&reader);
            table.changelog().inner.probe_with(&probe);
            input
        });
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut batch: Timestamp = 1;
        // A batch of upserts at time `batch`, then the watermark past it,
        // at most AHEAD batches ahead of the output.
        let mut next_key = 0u64;
        let mut loading = true;
        let mut from = 0;
        let mut start = Instant::now();
        loop {
            if loading && next_key >= keys {
                while probe.less_than(&batch) {
                    worker.step();
                }
                loaded.store(true, Ordering::Release);
                loading = false;
                (start, from) = (Instant::now(), batch);
            }
            if !loading && stop.load(Ordering::Acquire) {
                break;
            }
            for _ in 0..BATCH {
                let k = if loading {
                    next_key += 1;
                    (next_key - 1) % keys
                } else {
                    rng.next() % keys
                };
                input.send(((k, Some(batch)), batch, 1));
            }
            batch += 1;
            input.advance_to(batch);
            while probe.less_than(&batch.saturating_sub(AHEAD)) {
                worker.step();
            }
            if let (Some(cap), false) = (cap, loading) {
                let due = Duration::from_secs_f64(((batch - from) * BATCH) as f64 / cap);
                while start.elapsed() < due {
                    worker.step_or_park(Some(due.saturating_sub(start.elapsed())));
                }
            }
        }
        while probe.less_than(&batch) {
            worker.step();
        }
        let upserts = (batch - from) * BATCH;
        r.store((upserts as f64 / start.elapsed().as_secs_f64()) as u64, Ordering::Release);
    })
    .expect("timely starts")
    .join()
    .into_iter()
    .for_each(|r| r.expect("the worker succeeds"));
    rate.load(Ordering::Acquire) as f64
}

/// One ingest run: the upserts per second, and what `wrk` saw if it read.
fn ingest_run(o: &Options, read: bool) -> (f64, Option<Load>) {
    let views = Views::new();
    let reader: TableReader<u64, u64> = views.table("t", 0);
    let server = serve_views("127.0.0.1:0".parse().unwrap(), views, ServeOptions::default()).unwrap();
    let base = format!("http://{}", server.local_addr());
    let (loaded, stop) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let job = {
        let (keys, cap, loaded, stop) = (o.keys, o.ingest_rate, Arc::clone(&loaded), Arc::clone(&stop));
        std::thread::spawn(move || ingest(keys, cap, reader, loaded, stop))
    };
    while !loaded.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let script = format!(
        "math.randomseed(7)\nrequest = function()\n  return wrk.format(\"GET\", \"/views/t/\" .. math.random(0, {}))\nend\n",
        o.keys - 1
    );
    let load = if read {
        Some(if o.own_client {
            own_client(&base, o.keys, o.seconds, o.connections)
        } else {
            wrk(&base, &script, o.seconds, o.connections)
        })
    } else {
        std::thread::sleep(Duration::from_secs(o.seconds));
        None
    };
    stop.store(true, Ordering::Release);
    let rate = job.join().unwrap();
    drop(server);
    (rate, load)
}

/// The as-of run: `wrk` reading random keys as of random times, and the
/// in-process latency of the same reads (p50, p99, in µs).
fn as_of_run(o: &Options) -> (Load, f64, f64) {
    const KEYS: u64 = 100_000;
    const VERSIONS: u64 = 10;
    let views = Views::new();
    let reader: TableReader<u64, u64> = views.table("t", u64::MAX);
    let r = reader.clone();
    timely::execute(timely::Config::thread(), move |worker| {
        let mut input = worker.dataflow::<Timestamp, _, _>(|scope| {
            let (input, stream) = scope.new_input::<Vec<Update<(u64, Option<u64>)>>>();
            EventStream::new(stream).upsert().table.serve(&r);
            input
        });
        for version in 1..=VERSIONS {
            for k in 0..KEYS {
                input.send(((k, Some(version * 1_000 + k % 7)), version, 1));
            }
            input.advance_to(version + 1);
            worker.step();
        }
    })
    .expect("timely starts")
    .join()
    .into_iter()
    .for_each(|r| r.expect("the worker succeeds"));
    let mut rng = Rng(12345);
    let mut latencies: Vec<f64> = (0..100_000)
        .map(|_| {
            let (k, t) = (rng.next() % KEYS, 1 + rng.next() % VERSIONS);
            let start = Instant::now();
            let value = reader.get_as_of(&k, t).expect("within the history");
            let took = start.elapsed().as_secs_f64() * 1e6;
            assert_eq!(value, Some(t * 1_000 + k % 7));
            took
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    let (p50, p99) = (latencies[latencies.len() / 2], latencies[latencies.len() * 99 / 100]);
    let server = serve_views("127.0.0.1:0".parse().unwrap(), views, ServeOptions::default()).unwrap();
    let script = format!(
        "math.randomseed(7)\nrequest = function()\n  return wrk.format(\"GET\", \"/views/t/\" .. math.random(0, {}) .. \"?as_of=\" .. math.random(1, {VERSIONS}))\nend\n",
        KEYS - 1
    );
    let load = wrk(&format!("http://{}", server.local_addr()), &script, o.seconds, o.connections);
    (load, p50, p99)
}

fn main() {
    let o = parse_args();
    let (mut alone, mut with, mut loads) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..o.runs {
        alone.push(ingest_run(&o, false).0);
        let (rate, load) = ingest_run(&o, true);
        with.push(rate);
        loads.push(load.expect("read"));
    }
    let pick = |f: fn(&Load) -> f64| median(loads.iter().map(f).collect());
    println!("| measure | median of {} |", o.runs);
    println!("| --- | ---: |");
    println!("| ingest alone (upserts/s, {} keys) | {:.0} |", o.keys, median(alone.clone()));
    println!("| ingest while the client reads (upserts/s) | {:.0} |", median(with.clone()));
    println!("| ingest with readers / alone | {:.2} |", median(with) / median(alone));
    let client = if o.own_client { "own client" } else { "wrk -t1" };
    println!("| point reads/s ({client}, {} connections) | {:.0} |", o.connections, pick(|l| l.reads_per_s));
    println!("| point read p50 (ms) | {:.3} |", pick(|l| l.p50_ms));
    println!("| point read p99 (ms) | {:.3} |", pick(|l| l.p99_ms));
    println!("| non-2xx answers | {} |", loads.iter().map(|l| l.non_2xx).sum::<u64>());
    let (load, p50, p99) = as_of_run(&o);
    println!("| as-of reads/s over HTTP (1 M retained updates) | {:.0} |", load.reads_per_s);
    println!("| as-of read p50 / p99 over HTTP (ms) | {:.3} / {:.3} |", load.p50_ms, load.p99_ms);
    println!("| as-of read p50 / p99 in process (µs) | {p50:.2} / {p99:.2} |");
}
