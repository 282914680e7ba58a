//! JSON decoding: the ceiling (splitting lines), each parser candidate, and
//! highwater's decoder, on one Nexmark JSON Lines file this harness writes
//! itself; then the `highwater` binary on that file (`--source-only` and
//! queries), all in one run.
//!
//! The parsers run on one thread over the lines already in memory, each line
//! decoded into a record and folded into a checksum (so nothing is optimized
//! away): `serde_json` into owned records (highwater's decoder before its fast
//! path) and into records that borrow their strings (`Cow<str>`), `sonic-rs`
//! into both, `simd-json` (its serde path needs a mutable copy of each line)
//! into borrowed ones, and highwater's decoders: `JsonDecoder<T>` (any serde
//! type) into the owned records, `NexmarkDecoder` into `Event`s.
//!
//! ```text
//! cargo bench --bench decode -- --events 5000000 --runs 3 --workers 1,2 --queries q0,q1,q2,q5,q7
//! ```
//!
//! Prints Markdown tables for BENCHMARKS.md.

mod common;

use std::borrow::Cow;
use std::io::Write;
use std::time::Instant;

use common::{median, run_query};
use highwater::nexmark::{write_event, Auction, Bid, Generator, GeneratorConfig, NexmarkDecoder, Person};
use highwater::source::{Decode, JsonDecoder};
use serde::Deserialize;

struct Options {
    events: u64,
    runs: usize,
    workers: Vec<usize>,
    queries: Vec<String>,
}

fn parse_args() -> Options {
    let mut o = Options {
        events: 5_000_000,
        runs: 3,
        workers: vec![1, 2],
        queries: ["q0", "q1", "q2", "q5", "q7"].map(str::to_owned).to_vec(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--events" => o.events = value().parse().expect("--events N"),
            "--runs" => o.runs = value().parse().expect("--runs N"),
            "--workers" => o.workers = value().split(',').map(|w| w.parse().expect("--workers 1,2")).collect(),
            "--queries" => o.queries = value().split(',').map(str::to_owned).collect(),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    o
}

/// A Nexmark line with owned records (as highwater's decoder reads it
/// through serde).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Owned {
    #[allow(dead_code)]
    event_type: u8,
    person: Option<Person>,
    auction: Option<Auction>,
    bid: Option<Bid>,
}

impl Owned {
    fn checksum(&self) -> u64 {
        match (&self.person, &self.auction, &self.bid) {
            (Some(p), _, _) => p.id as u64 + p.extra.len() as u64,
            (_, Some(a), _) => a.id as u64 + a.extra.len() as u64,
            (_, _, Some(b)) => b.price as u64 + b.extra.len() as u64 + b.url.len() as u64,
            _ => 0,
        }
    }
}

/// A Nexmark line whose records borrow their strings from the line.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Borrowed<'a> {
    #[allow(dead_code)]
    event_type: u8,
    #[serde(borrow)]
    person: Option<PersonRef<'a>>,
    #[serde(borrow)]
    auction: Option<AuctionRef<'a>>,
    #[serde(borrow)]
    bid: Option<BidRef<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)]
struct PersonRef<'a> {
    id: i64,
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow)]
    email_address: Cow<'a, str>,
    #[serde(borrow)]
    credit_card: Cow<'a, str>,
    #[serde(borrow)]
    city: Cow<'a, str>,
    #[serde(borrow)]
    state: Cow<'a, str>,
    date_time: u64,
    #[serde(borrow)]
    extra: Cow<'a, str>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)]
struct AuctionRef<'a> {
    id: i64,
    #[serde(borrow)]
    item_name: Cow<'a, str>,
    #[serde(borrow)]
    description: Cow<'a, str>,
    initial_bid: i64,
    reserve: i64,
    date_time: u64,
    expires: u64,
    seller: i64,
    category: i64,
    #[serde(borrow)]
    extra: Cow<'a, str>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)]
struct BidRef<'a> {
    auction: i64,
    bidder: i64,
    price: i64,
    #[serde(borrow)]
    channel: Cow<'a, str>,
    #[serde(borrow)]
    url: Cow<'a, str>,
    date_time: u64,
    #[serde(borrow)]
    extra: Cow<'a, str>,
}

impl Borrowed<'_> {
    fn checksum(&self) -> u64 {
        match (&self.person, &self.auction, &self.bid) {
            (Some(p), _, _) => p.id as u64 + p.extra.len() as u64,
            (_, Some(a), _) => a.id as u64 + a.extra.len() as u64,
            (_, _, Some(b)) => b.price as u64 + b.extra.len() as u64 + b.url.len() as u64,
            _ => 0,
        }
    }
}

fn event_checksum(event: &highwater::nexmark::Event) -> u64 {
    use highwater::nexmark::Event;
    match event {
        Event::Person(p) => p.id as u64 + p.extra.len() as u64,
        Event::Auction(a) => a.id as u64 + a.extra.len() as u64,
        Event::Bid(b) => b.price as u64 + b.extra.len() as u64 + b.url.len() as u64,
    }
}

/// Times `decode` over every line; returns lines/s.
fn measure(lines: &[&[u8]], expected: u64, decode: &mut dyn FnMut(&[u8]) -> u64) -> f64 {
    let started = Instant::now();
    let mut sum = 0u64;
    for line in lines {
        sum = sum.wrapping_add(decode(line));
    }
    let seconds = started.elapsed().as_secs_f64();
    assert!(expected == 0 || sum == expected, "a parser read different values");
    lines.len() as f64 / seconds
}

fn parsers(o: &Options, text: &[u8]) {
    let lines: Vec<&[u8]> = text.split(|&b| b == b'\n').filter(|l| !l.is_empty()).collect();
    let expected: u64 = lines
        .iter()
        .map(|l| serde_json::from_slice::<Owned>(l).expect("a valid line").checksum())
        .fold(0, u64::wrapping_add);
    let bytes_per_line = text.len() as f64 / lines.len() as f64;
    let mut scratch = Vec::new();
    type Candidate<'c> = (&'c str, Box<dyn FnMut(&[u8]) -> u64 + 'c>);
    let mut candidates: Vec<Candidate<'_>> = vec![
        ("splitting lines (`memchr`), the ceiling", Box::new(|_: &[u8]| 0)),
        (
            "`serde_json`, owned records (highwater before issue 16)",
            Box::new(|l: &[u8]| serde_json::from_slice::<Owned>(l).unwrap().checksum()),
        ),
        (
            "`serde_json`, borrowed records",
            Box::new(|l: &[u8]| serde_json::from_slice::<Borrowed<'_>>(l).unwrap().checksum()),
        ),
        ("`sonic-rs`, owned records", Box::new(|l: &[u8]| sonic_rs::from_slice::<Owned>(l).unwrap().checksum())),
        (
            "`sonic-rs`, borrowed records",
            Box::new(|l: &[u8]| sonic_rs::from_slice::<Borrowed<'_>>(l).unwrap().checksum()),
        ),
        (
            "`simd-json`, borrowed records (a mutable copy per line)",
            Box::new(move |l: &[u8]| {
                scratch.clear();
                scratch.extend_from_slice(l);
                simd_json::serde::from_slice::<Borrowed<'_>>(&mut scratch).unwrap().checksum()
            }),
        ),
        (
            "highwater `JsonDecoder<T>` (any serde type: its fast path), owned records",
            Box::new(|l: &[u8]| JsonDecoder::<Owned>::new().decode(l).unwrap().checksum()),
        ),
        (
            "highwater `NexmarkDecoder` (fast path), owned `Event`s",
            Box::new(|l: &[u8]| event_checksum(&NexmarkDecoder.decode(l).unwrap())),
        ),
    ];
    println!(
        "### Decoding {} lines in memory, one thread, median of {} runs ({bytes_per_line:.0} bytes per line)\n",
        lines.len(),
        o.runs
    );
    println!("| decoder | events/s | MB/s | ratio to serde_json owned |\n|---|---:|---:|---:|");
    let mut baseline = None;
    for (i, (name, decode)) in candidates.iter_mut().enumerate() {
        let rates: Vec<f64> = (0..o.runs)
            .map(|_| {
                if i == 0 {
                    // Splitting: count the lines of the text with memchr.
                    let started = Instant::now();
                    let n = memchr::memchr_iter(b'\n', text).count();
                    assert_eq!(n, lines.len());
                    n as f64 / started.elapsed().as_secs_f64()
                } else {
                    measure(&lines, expected, decode.as_mut())
                }
            })
            .collect();
        let rate = median(rates);
        if i == 1 {
            baseline = Some(rate);
        }
        let ratio = baseline.map_or(String::new(), |b| format!("{:.2}", rate / b));
        println!("| {name} | {:.2} M | {:.0} | {ratio} |", rate / 1e6, rate * bytes_per_line / 1e6);
    }
    println!();
}

fn queries(o: &Options, file: &str, bytes_per_line: f64) {
    println!("### The `highwater` binary on the file, median of {} runs\n", o.runs);
    print!("| run |");
    for w in &o.workers {
        print!(" {w} worker ev/s | MB/s | peak RSS MiB |");
    }
    println!();
    print!("|---|");
    for _ in &o.workers {
        print!("---:|---:|---:|");
    }
    println!();
    let mut rows = vec![("source only".to_owned(), "q0", true)];
    rows.extend(o.queries.iter().map(|q| (q.clone(), q.as_str(), false)));
    for (label, query, source_only) in rows {
        print!("| {label} |");
        for &w in &o.workers {
            let results: Vec<(f64, f64)> =
                (0..o.runs).map(|_| run_query(query, &["--input", file], w, source_only)).collect();
            let rate = median(results.iter().map(|r| r.0).collect());
            let rss = results.iter().map(|r| r.1).fold(0.0, f64::max);
            print!(" {:.2} M | {:.0} | {rss:.0} |", rate / 1e6, rate * bytes_per_line / 1e6);
        }
        println!();
    }
    println!();
}

fn main() {
    let o = parse_args();
    let generator = Generator::new(GeneratorConfig::default()).expect("the default configuration");
    let mut text = Vec::with_capacity(o.events as usize * 300);
    for n in 0..o.events {
        write_event(&mut text, &generator.event(n)).expect("writing to a Vec");
    }
    let path = std::env::temp_dir().join(format!("highwater-decode-{}.jsonl", std::process::id()));
    std::fs::File::create(&path).and_then(|mut f| f.write_all(&text)).expect("writing the file");
    println!("{} events, {:.2} GB\n", o.events, text.len() as f64 / 1e9);
    parsers(&o, &text);
    let bytes_per_line = text.len() as f64 / o.events as f64;
    drop(text);
    queries(&o, path.to_str().expect("a UTF-8 path"), bytes_per_line);
    let _ = std::fs::remove_file(&path);
}
