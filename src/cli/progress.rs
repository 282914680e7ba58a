//! The progress line and the end-of-run summary on stderr.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::nexmark::queries::{utc_day, utc_hour_minute};
use crate::operators::{Counter, Timestamp, END_OF_TIME};
use crate::source::{Alignment, SourceMetrics};
use crate::time::Millis;

/// A drift for watermark alignment on the command line: a duration (`10s`)
/// or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Drift(pub(super) Option<Millis>);

impl std::str::FromStr for Drift {
    type Err = crate::time::DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("off") {
            Ok(Drift(None))
        } else {
            s.parse().map(|d| Drift(Some(d)))
        }
    }
}

/// Formats an epoch-ms time as `yyyy-MM-ddTHH:mm:ss.SSSZ`.
pub(super) fn iso(ms: Timestamp) -> String {
    if ms == END_OF_TIME {
        return "end".to_owned();
    }
    let (h, m) = utc_hour_minute(ms);
    format!("{}T{h:02}:{m:02}:{:02}.{:03}Z", utc_day(ms), ms / 1000 % 60, ms % 1000)
}

/// What the progress line reads.
#[derive(Clone, Debug, Default)]
pub(super) struct Gauges {
    pub(super) source: SourceMetrics,
    /// The watermark at the outputs (worker 0's probe).
    pub(super) watermark: Arc<AtomicU64>,
    /// Records dropped to late outputs, per operator and worker.
    pub(super) late: Arc<std::sync::Mutex<Vec<Counter>>>,
    /// Records in flight between the process's workers (flow control).
    pub(super) in_flight: Option<highwater_operators::flow::InFlight>,
    /// The job's watermark alignment (for the current drift).
    pub(super) alignment: Option<Alignment>,
    /// The job's counters in this process (for what expired).
    pub(super) totals: Option<crate::totals::Totals>,
}

impl Gauges {
    pub(super) fn late(&self) -> u64 {
        self.late.lock().map(|l| l.iter().map(Counter::get).sum()).unwrap_or(0)
    }

    /// Entries expired by a state time-to-live so far, in this process.
    pub(super) fn expired(&self) -> u64 {
        let Some(totals) = self.totals.as_ref() else { return 0 };
        totals.local().iter().filter(|(name, _)| name.ends_with(".expired")).map(|(_, n)| n).sum()
    }

    /// The circuit breakers of the job's calls to services, for the
    /// progress line (empty when the job calls none).
    pub(super) fn breakers(&self) -> String {
        self.totals.as_ref().map_or_else(String::new, |totals| breakers(&totals.local()))
    }
}

/// ` | breakers NAME open N half-open M` for each enrichment operator in
/// `totals` (its gauges `NAME.breaker_open` and `NAME.breaker_half_open`,
/// summed over the workers); empty when there is none.
pub(super) fn breakers(totals: &BTreeMap<String, u64>) -> String {
    let mut line = String::new();
    for (name, open) in totals.iter().filter_map(|(n, v)| n.strip_suffix(".breaker_open").map(|n| (n, v))) {
        let half_open = totals.get(&format!("{name}.breaker_half_open")).copied().unwrap_or(0);
        let opened = totals.get(&format!("{name}.breaker_opened")).copied().unwrap_or(0);
        line.push_str(&format!(
            " | breaker {name}: {} (opened {opened}x)",
            match (open, half_open) {
                (0, 0) => "closed".to_owned(),
                (n, 0) => format!("open on {n}"),
                (0, m) => format!("half-open on {m}"),
                (n, m) => format!("open on {n}, half-open on {m}"),
            }
        ));
    }
    line
}

/// Prints a progress line every second until dropped.
pub(super) struct Progress {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Progress {
    pub(super) fn start(gauges: Gauges, started: Instant) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut last = (Instant::now(), 0u64);
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                if last.0.elapsed() < Duration::from_secs(1) {
                    continue;
                }
                let now = Instant::now();
                let records = gauges.source.records.get();
                let rate = (records - last.1) as f64 / now.duration_since(last.0).as_secs_f64();
                last = (now, records);
                let watermark = gauges.watermark.load(Ordering::Relaxed);
                let max_seen = gauges.source.max_event_time.load(Ordering::Relaxed);
                let lag =
                    if watermark == 0 || watermark == END_OF_TIME { 0 } else { max_seen.saturating_sub(watermark) };
                eprintln!(
                    "[{:>6.1}s] events {} ({:.2} M ev/s) | watermark {} | lag {:.1} s | late {} | dead letters {} \
                     | in flight {} | throttled {:.1} s | drift {} | aligned {:.1} s | expired {}{}",
                    started.elapsed().as_secs_f64(),
                    records,
                    rate / 1e6,
                    iso(watermark),
                    lag as f64 / 1000.0,
                    gauges.late(),
                    gauges.source.dead_letters.get(),
                    gauges.in_flight.as_ref().map_or(0, |f| f.records()),
                    gauges.source.throttled_us.get() as f64 / 1e6,
                    gauges
                        .alignment
                        .as_ref()
                        .and_then(Alignment::greatest_drift)
                        .map_or_else(|| "-".to_owned(), |ms| format!("{:.1} s", ms as f64 / 1000.0)),
                    gauges.source.aligned_us.get() as f64 / 1e6,
                    gauges.expired(),
                    gauges.breakers(),
                );
            }
        });
        Progress { stop, thread: Some(thread) }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The process's peak resident set size in MiB (Linux; 0 elsewhere).
pub(super) fn peak_rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<u64>().ok()))
        .map_or(0, |kb| kb / 1024)
}

/// The one-line summary of a run.
pub(super) fn summary(gauges: &Gauges, totals: &BTreeMap<String, u64>, started: Instant, rows: u64) -> String {
    let seconds = started.elapsed().as_secs_f64();
    // The job's totals over all processes when they were exchanged; else this process's.
    let total = |suffix: &str, local: u64| {
        let mut found = totals.iter().filter(|(name, _)| name.ends_with(suffix)).peekable();
        if found.peek().is_none() {
            local
        } else {
            found.map(|(_, n)| n).sum()
        }
    };
    let events = total(".records", gauges.source.records.get());
    let rows = totals.get("rows").copied().unwrap_or(rows);
    format!(
        "events={events} seconds={seconds:.3} events/s={:.0} late={} late_read={} dead_letters={} rows={rows} \
         throttled_ms={} aligned_ms={} expired={} peak_rss_mib={}",
        events as f64 / seconds.max(1e-9),
        totals.get("late").copied().unwrap_or_else(|| total(".late", gauges.late())),
        total(".late_read", gauges.source.late.get()),
        total(".dead_letters", gauges.source.dead_letters.get()),
        total(".throttled_us", gauges.source.throttled_us.get()) / 1000,
        total(".aligned_us", gauges.source.aligned_us.get()) / 1000,
        total(".expired", 0),
        peak_rss_mib(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_progress_line_names_each_breaker_and_its_state() {
        let totals = |entries: &[(&str, u64)]| -> BTreeMap<String, u64> {
            entries.iter().map(|(n, v)| ((*n).to_owned(), *v)).collect()
        };
        assert_eq!(breakers(&totals(&[("Source.records", 5)])), "");
        let line = breakers(&totals(&[
            ("Profiles.breaker_open", 2),
            ("Profiles.breaker_half_open", 0),
            ("Profiles.breaker_opened", 3),
            ("Scores.breaker_open", 0),
            ("Scores.breaker_half_open", 1),
            ("Prices.breaker_open", 0),
        ]));
        assert_eq!(
            line,
            " | breaker Prices: closed (opened 0x) | breaker Profiles: open on 2 (opened 3x) \
             | breaker Scores: half-open on 1 (opened 0x)"
        );
    }
}
