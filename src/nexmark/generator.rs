//! The Nexmark event generator, as a partitioned source.
//!
//! It follows the model of the standard Nexmark generator (and of the
//! reference `gen.py` of the Nexmark format): events are numbered; in every
//! block of 50 the first is a person, the next three auctions, the rest bids
//! (proportions 1:3:46); ids grow with the numbers; bids go to a hot auction
//! (the first of the latest 100) half of the time and otherwise to one of the
//! 100 auctions in flight (plus a lead of 10 not yet opened); bidders and
//! sellers are hot (a fixed person of the latest 100) three times out of four,
//! otherwise one of the 1000 active people (plus a lead of 10); prices are
//! log-uniform from 1 to 1 000 000 dollars; half of the bids come from the four
//! hot channels; auctions expire within twice the time it takes to open 100
//! more; records carry filler to average sizes of 200 / 500 / 100 bytes.
//!
//! Every event is a pure function of its number and the seed (each event
//! draws from its own random stream), so partitions generate their share of
//! the numbers independently and the same events come out whatever the number
//! of workers. Event `n` has time `base + n · 10⁹/rate ns`. With an
//! out-of-orderness bound `N`, each event is delayed by a random `0..=N` ms and
//! a partition emits its events in order of time plus delay, so no event is
//! more than `N` ms older than one emitted before it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::model::{Auction, Bid, Event, Person};
use crate::dead_letter::DeadLetter;
use crate::source::{Offset, PartitionReader, ReadStatus, Source, SourceError};
use crate::time::Timestamp;

const FIRST_PERSON_ID: i64 = 1000;
const FIRST_AUCTION_ID: i64 = 1000;
const FIRST_CATEGORY_ID: i64 = 10;
const NUM_CATEGORIES: u64 = 5;
const PERSON_ID_LEAD: u64 = 10;
const AUCTION_ID_LEAD: u64 = 10;
const HOT_BATCH: u64 = 100;
const HOT_CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];
const CHANNELS: usize = 10_000;
const MIN_STRING_LENGTH: u64 = 3;
const POOL_SIZE: usize = 1 << 18;
const US_STATES: [&str; 6] = ["AZ", "CA", "ID", "OR", "WA", "WY"];
const US_CITIES: [&str; 10] =
    ["Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent", "Cheyenne"];
const FIRST_NAMES: [&str; 11] =
    ["Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter"];
const LAST_NAMES: [&str; 9] = ["Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"];

/// 2024-01-01T00:00:03.456Z: deliberately not a multiple of 2 s or 10 s.
pub const DEFAULT_BASE_TIME: Timestamp = 1_704_067_203_456;

/// The generator's parameters; the defaults are the standard Nexmark ones.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GeneratorConfig {
    /// Number of events; `None` generates for ever.
    pub events: Option<u64>,
    /// Random seed.
    pub seed: u64,
    /// Events per second of event time.
    pub rate: f64,
    /// Event time of event 0, epoch ms.
    pub base_time: Timestamp,
    /// Out-of-orderness bound in ms (0: in order).
    pub max_out_of_order_ms: u64,
    /// Persons per block.
    pub person_proportion: u64,
    /// Auctions per block.
    pub auction_proportion: u64,
    /// Bids per block.
    pub bid_proportion: u64,
    /// Size of the active-person set.
    pub num_active_people: u64,
    /// Size of the in-flight auction set.
    pub num_in_flight_auctions: u64,
    /// P(hot auction) = 1 − 1/ratio.
    pub hot_auction_ratio: u64,
    /// P(hot bidder) = 1 − 1/ratio.
    pub hot_bidders_ratio: u64,
    /// P(hot seller) = 1 − 1/ratio.
    pub hot_sellers_ratio: u64,
    /// Average person size the filler aims at.
    pub avg_person_bytes: u64,
    /// Average auction size the filler aims at.
    pub avg_auction_bytes: u64,
    /// Average bid size the filler aims at.
    pub avg_bid_bytes: u64,
    /// Number of partitions (0: one per worker).
    pub partitions: usize,
    /// Generate in real time: event `n` is released when the wall clock reaches
    /// its event time, with the base time set to the start of the run.
    pub real_time: bool,
}

impl Default for GeneratorConfig {
    fn default() -> Self {
        GeneratorConfig {
            events: Some(1000),
            seed: 42,
            rate: 10_000.0,
            base_time: DEFAULT_BASE_TIME,
            max_out_of_order_ms: 0,
            person_proportion: 1,
            auction_proportion: 3,
            bid_proportion: 46,
            num_active_people: 1000,
            num_in_flight_auctions: 100,
            hot_auction_ratio: 2,
            hot_bidders_ratio: 4,
            hot_sellers_ratio: 4,
            avg_person_bytes: 200,
            avg_auction_bytes: 500,
            avg_bid_bytes: 100,
            partitions: 0,
            real_time: false,
        }
    }
}

/// A configuration error, naming the field.
#[derive(Debug, thiserror::Error)]
#[error("generator option `{field}`: {reason}")]
pub struct ConfigError {
    /// The field.
    pub field: &'static str,
    /// What is expected.
    pub reason: &'static str,
}

/// SplitMix64: tiny, fast, and good enough for synthetic data.
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64, stream: u64) -> Self {
        Rng(mix(seed ^ mix(stream.wrapping_add(0x9e37_79b9_7f4a_7c15))))
    }
    #[inline]
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }
    /// Uniform in `[0, 1)`.
    #[inline]
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    /// Uniform in `[0, n)`.
    #[inline]
    fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
    /// True with probability `1 − 1/ratio` (the reference's `r · ratio >= 1`).
    #[inline]
    fn hot(&mut self, ratio: u64) -> bool {
        self.unit() * ratio as f64 >= 1.0
    }
}

#[inline]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Java's `Math.abs(Integer.reverse(c))`.
fn reverse32(c: u32) -> u32 {
    (c.reverse_bits() as i32).unsigned_abs()
}

/// Tables derived from the seed, shared by all partitions of a process.
#[derive(Debug)]
struct Tables {
    /// ASCII pools, sliced by byte offsets (always char boundaries).
    letters: String,
    spaced: String,
    channel_names: Vec<Arc<str>>,
    channel_urls: Vec<Arc<str>>,
    hot_urls: Vec<Arc<str>>,
    hot_names: Vec<Arc<str>>,
}

impl Tables {
    fn new(seed: u64) -> Self {
        let mut rng = Rng::new(seed, u64::MAX);
        let letter = |rng: &mut Rng| b'a' + rng.below(26) as u8;
        let letters = (0..POOL_SIZE + 256).map(|_| letter(&mut rng) as char).collect();
        let spaced =
            (0..POOL_SIZE + 256).map(|_| if rng.below(13) == 0 { ' ' } else { letter(&mut rng) as char }).collect();
        let mut crng = Rng::new(seed, u64::MAX - 1);
        let base_url = |rng: &mut Rng| {
            let mut parts = Vec::new();
            for _ in 0..3 {
                let len = MIN_STRING_LENGTH + rng.below(5 - MIN_STRING_LENGTH);
                let part: String = (0..len)
                    .map(|_| if rng.below(13) == 0 { '_' } else { (b'a' + rng.below(26) as u8) as char })
                    .collect();
                parts.push(part);
            }
            format!("https://www.nexmark.com/{}/{}/{}/item.htm?query=1", parts[0], parts[1], parts[2])
        };
        let hot_urls = HOT_CHANNELS.iter().map(|_| Arc::from(base_url(&mut crng))).collect();
        let hot_names = HOT_CHANNELS.iter().map(|c| Arc::from(*c)).collect();
        let mut channel_names = Vec::with_capacity(CHANNELS);
        let mut channel_urls = Vec::with_capacity(CHANNELS);
        for c in 0..CHANNELS {
            let mut url = base_url(&mut crng);
            if crng.below(10) > 0 {
                url.push_str(&format!("&channel_id={}", reverse32(c as u32)));
            }
            channel_names.push(Arc::from(format!("channel-{c}")));
            channel_urls.push(Arc::from(url));
        }
        Tables { letters, spaced, channel_names, channel_urls, hot_urls, hot_names }
    }
}

/// The Nexmark generator: a [`Source`] of [`Event`]s.
///
/// ```
/// use highwater::nexmark::{Generator, GeneratorConfig, Event};
/// let gen = Generator::new(GeneratorConfig { events: Some(100), ..Default::default() }).unwrap();
/// let events: Vec<Event> = (0..100).map(|n| gen.event(n)).collect();
/// assert!(matches!(events[0], Event::Person(_)));
/// assert!(matches!(events[1], Event::Auction(_)));
/// assert!(matches!(events[4], Event::Bid(_)));
/// assert_eq!(gen.event(7), events[7]); // a pure function of the number
/// ```
#[derive(Debug)]
pub struct Generator {
    config: GeneratorConfig,
    tables: Tables,
    inter_event_ns: u64,
    total: u64,
    events_for_auctions: u64,
    bid_extra: (u64, u64),
}

impl Generator {
    /// A generator; checks the configuration.
    pub fn new(config: GeneratorConfig) -> Result<Self, ConfigError> {
        if !(config.rate > 0.0 && config.rate.is_finite()) {
            return Err(ConfigError { field: "rate", reason: "must be a positive number of events per second" });
        }
        let inter_event_ns = (1e9 / config.rate).round() as u64;
        if inter_event_ns == 0 {
            return Err(ConfigError { field: "rate", reason: "is too high (events closer than 1 ns)" });
        }
        if config.person_proportion < 1 || config.auction_proportion < 1 {
            return Err(ConfigError { field: "person_proportion/auction_proportion", reason: "must be at least 1" });
        }
        for (field, ratio) in [
            ("hot_auction_ratio", config.hot_auction_ratio),
            ("hot_bidders_ratio", config.hot_bidders_ratio),
            ("hot_sellers_ratio", config.hot_sellers_ratio),
        ] {
            if ratio == 0 {
                return Err(ConfigError { field, reason: "must be at least 1" });
            }
        }
        let total = config.person_proportion + config.auction_proportion + config.bid_proportion;
        let events_for_auctions = config.num_in_flight_auctions * total / config.auction_proportion;
        let bid_extra = extra_bounds(32, config.avg_bid_bytes);
        let tables = Tables::new(config.seed);
        Ok(Generator { config, tables, inter_event_ns, total, events_for_auctions, bid_extra })
    }

    /// The configuration.
    pub fn config(&self) -> &GeneratorConfig {
        &self.config
    }

    /// Event time of event `n`.
    #[inline]
    pub fn timestamp(&self, n: u64) -> Timestamp {
        self.config.base_time + ((n as u128 * self.inter_event_ns as u128) / 1_000_000) as u64
    }

    /// Event `n`.
    pub fn event(&self, n: u64) -> Event {
        let c = &self.config;
        let mut rng = Rng::new(c.seed, n);
        let epoch = n / self.total;
        let offset = n % self.total;
        let ts = self.timestamp(n);
        // Base-0 ids of the latest person and auction generated before a bid or auction.
        let last_person = epoch * c.person_proportion + (c.person_proportion - 1);
        let num_people = last_person + 1;
        let active = num_people.min(c.num_active_people);
        let person_base = num_people - active;
        let random_person = |rng: &mut Rng| FIRST_PERSON_ID + (person_base + rng.below(active + PERSON_ID_LEAD)) as i64;

        if offset < c.person_proportion {
            let id = FIRST_PERSON_ID + (epoch * c.person_proportion + offset) as i64;
            let name = format!("{} {}", FIRST_NAMES[rng.below(11) as usize], LAST_NAMES[rng.below(9) as usize]);
            let email = format!("{}@{}.com", self.next_string(&mut rng, 7), self.next_string(&mut rng, 5));
            let credit_card = format!(
                "{:04} {:04} {:04} {:04}",
                rng.below(10_000),
                rng.below(10_000),
                rng.below(10_000),
                rng.below(10_000)
            );
            let city = US_CITIES[rng.below(10) as usize].to_owned();
            let state = US_STATES[rng.below(6) as usize].to_owned();
            let current = 8 + name.len() + email.len() + credit_card.len() + city.len() + state.len();
            let extra = self.next_extra(&mut rng, current as u64, c.avg_person_bytes);
            Event::Person(Box::new(Person {
                id,
                name,
                email_address: email,
                credit_card,
                city,
                state,
                date_time: ts,
                extra,
            }))
        } else if offset < c.person_proportion + c.auction_proportion {
            let id = FIRST_AUCTION_ID + (epoch * c.auction_proportion + (offset - c.person_proportion)) as i64;
            let seller = if rng.hot(c.hot_sellers_ratio) {
                FIRST_PERSON_ID + (last_person / HOT_BATCH * HOT_BATCH) as i64
            } else {
                random_person(&mut rng)
            };
            let category = FIRST_CATEGORY_ID + rng.below(NUM_CATEGORIES) as i64;
            let initial_bid = price(&mut rng);
            let horizon = self.timestamp(n + self.events_for_auctions) - ts;
            let expires = ts + 1 + rng.below((horizon * 2).max(1));
            let item_name = self.next_string(&mut rng, 20);
            let description = self.next_string(&mut rng, 100);
            let reserve = initial_bid + price(&mut rng);
            let current = 48 + item_name.len() + description.len();
            let extra = self.next_extra(&mut rng, current as u64, c.avg_auction_bytes);
            Event::Auction(Box::new(Auction {
                id,
                item_name,
                description,
                initial_bid,
                reserve,
                date_time: ts,
                expires,
                seller,
                category,
                extra,
            }))
        } else {
            let last_auction = epoch * c.auction_proportion + (c.auction_proportion - 1);
            let auction = if rng.hot(c.hot_auction_ratio) {
                FIRST_AUCTION_ID + (last_auction / HOT_BATCH * HOT_BATCH) as i64
            } else {
                let min = last_auction.saturating_sub(c.num_in_flight_auctions);
                FIRST_AUCTION_ID + (min + rng.below(last_auction - min + 1 + AUCTION_ID_LEAD)) as i64
            };
            let bidder = if rng.hot(c.hot_bidders_ratio) {
                FIRST_PERSON_ID + (last_person / HOT_BATCH * HOT_BATCH + 1) as i64
            } else {
                random_person(&mut rng)
            };
            let price = price(&mut rng);
            let (channel, url) = if rng.hot(2) {
                let i = rng.below(4) as usize;
                (Arc::clone(&self.tables.hot_names[i]), Arc::clone(&self.tables.hot_urls[i]))
            } else {
                let i = rng.below(CHANNELS as u64) as usize;
                (Arc::clone(&self.tables.channel_names[i]), Arc::clone(&self.tables.channel_urls[i]))
            };
            let (lo, span) = self.bid_extra;
            let size = lo + if span > 0 { rng.below(span) } else { 0 };
            let extra = self.slice(&self.tables.letters, &mut rng, size as usize);
            Event::Bid(Bid { auction, bidder, price, channel, url, date_time: ts, extra })
        }
    }

    fn slice(&self, pool: &str, rng: &mut Rng, len: usize) -> String {
        let off = rng.below(POOL_SIZE as u64) as usize;
        pool[off..off + len.min(256)].to_owned()
    }

    /// Nexmark's `nextString(max)`: 3 to max−1 characters, spaces trimmed.
    fn next_string(&self, rng: &mut Rng, max: u64) -> String {
        let len = MIN_STRING_LENGTH + rng.below(max - MIN_STRING_LENGTH);
        let off = rng.below(POOL_SIZE as u64) as usize;
        self.tables.spaced[off..off + len as usize].trim().to_owned()
    }

    fn next_extra(&self, rng: &mut Rng, current: u64, avg: u64) -> String {
        let (lo, span) = extra_bounds(current, avg);
        let size = lo + if span > 0 { rng.below(span) } else { 0 };
        if size == 0 {
            return String::new();
        }
        self.slice(&self.tables.letters, rng, size as usize)
    }

    /// The arrival delay of event `n` in ms, for out-of-order generation.
    fn delay(&self, n: u64) -> u64 {
        if self.config.max_out_of_order_ms == 0 {
            0
        } else {
            Rng::new(self.config.seed ^ 0x5eed_0f0d_e1a7, n).below(self.config.max_out_of_order_ms + 1)
        }
    }

    fn partition_count(&self, peers: usize) -> usize {
        if self.config.partitions > 0 {
            self.config.partitions
        } else {
            peers.max(1)
        }
    }
}

/// `round(10^(6u) · 100)`: cents from 1 to 1 000 000 dollars, log-uniform.
#[inline]
fn price(rng: &mut Rng) -> i64 {
    (10f64.powf(rng.unit() * 6.0) * 100.0 + 0.5).floor() as i64
}

/// Nexmark's filler length: `(desired − delta, 2·delta)` with `delta = round(0.2·desired)`.
fn extra_bounds(current: u64, avg: u64) -> (u64, u64) {
    if current > avg {
        return (0, 0);
    }
    let desired = avg - current;
    let delta = (desired as f64 * 0.2 + 0.5).floor() as u64;
    (desired - delta, 2 * delta)
}

/// The generator as a source with a given number of partitions.
///
/// [`Generator`] itself does not know how many workers will read it; this
/// wrapper fixes the partition count (one per worker unless the configuration
/// says otherwise). Partition `p` of `P` generates events `p, p + P, p + 2P, …`.
#[derive(Debug, Clone)]
pub struct GeneratorSource {
    generator: Arc<Generator>,
    partitions: usize,
    start: Arc<Instant>,
    wall_base: Timestamp,
}

impl GeneratorSource {
    /// A source of `generator`'s events for `peers` workers.
    pub fn new(generator: Arc<Generator>, peers: usize) -> Self {
        let partitions = generator.partition_count(peers);
        let wall_base = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        GeneratorSource { generator, partitions, start: Arc::new(Instant::now()), wall_base }
    }
}

impl Source for GeneratorSource {
    type Record = Event;
    type Reader = GeneratorReader;

    fn partitions(&self) -> Result<Vec<String>, SourceError> {
        Ok((0..self.partitions).map(|p| format!("nexmark-{p}")).collect())
    }

    fn open(&self, index: usize, from: Option<Offset>) -> Result<GeneratorReader, SourceError> {
        if index >= self.partitions {
            return Err(SourceError::Config(format!("no generator partition {index}")));
        }
        let mut reader = GeneratorReader {
            generator: Arc::clone(&self.generator),
            next: index as u64,
            step: self.partitions as u64,
            pending: BinaryHeap::new(),
            emitted: 0,
            start: Arc::clone(&self.start),
            time_shift: if self.generator.config.real_time {
                self.wall_base as i64 - self.generator.config.base_time as i64
            } else {
                0
            },
        };
        // In order, event `k` of the partition is number `index + k·step`: seek
        // there. Out of order, the release order depends on the events before:
        // rewinding replays the partition up to the offset (events are cheap to make).
        let skip = from.unwrap_or(0);
        if self.generator.config.max_out_of_order_ms == 0 {
            reader.next = index as u64 + skip.saturating_mul(reader.step);
            reader.emitted = skip;
        }
        let mut dead = Vec::new();
        while reader.emitted < skip {
            let want = (skip - reader.emitted).min(4096) as usize;
            if reader.read(want, &mut |_| {}, &mut dead)? == ReadStatus::End {
                break;
            }
        }
        Ok(reader)
    }
}

/// Generates one partition's events.
#[derive(Debug)]
pub struct GeneratorReader {
    generator: Arc<Generator>,
    next: u64,
    step: u64,
    /// Out-of-order mode: events by (arrival time, number).
    pending: BinaryHeap<Reverse<(Timestamp, u64)>>,
    emitted: u64,
    start: Arc<Instant>,
    /// Real-time mode: shift from the configured base time to the wall clock.
    time_shift: i64,
}

impl GeneratorReader {
    fn shifted(&self, mut event: Event) -> Event {
        if self.time_shift != 0 {
            let shift = |t: &mut Timestamp| *t = (*t as i64 + self.time_shift) as Timestamp;
            match &mut event {
                Event::Person(p) => shift(&mut p.date_time),
                Event::Auction(a) => {
                    shift(&mut a.date_time);
                    shift(&mut a.expires);
                }
                Event::Bid(b) => shift(&mut b.date_time),
            }
        }
        event
    }
}

impl PartitionReader for GeneratorReader {
    type Record = Event;

    fn read(
        &mut self,
        max: usize,
        out: &mut dyn FnMut(Event),
        _dead: &mut Vec<DeadLetter>,
    ) -> Result<ReadStatus, SourceError> {
        let g = &*self.generator;
        let limit = g.config.events.unwrap_or(u64::MAX);
        // Real time: only events whose time the wall clock has reached.
        let horizon = if g.config.real_time {
            let elapsed_ns = self.start.elapsed().as_nanos();
            (elapsed_ns / g.inter_event_ns.max(1) as u128).min(u64::MAX as u128) as u64
        } else {
            u64::MAX
        };
        let mut taken = 0;
        while taken < max {
            if g.config.max_out_of_order_ms == 0 {
                if self.next >= limit || self.next > horizon {
                    break;
                }
                out(self.shifted(g.event(self.next)));
                taken += 1;
                self.next += self.step;
            } else {
                // Release everything due by the next event's time, as gen.py does.
                let next_time = (self.next < limit && self.next <= horizon).then(|| g.timestamp(self.next));
                match self.pending.peek() {
                    Some(Reverse((arrival, n))) if next_time.is_none_or(|t| *arrival <= t) => {
                        if next_time.is_none() && self.next < limit {
                            break; // real time: wait for the clock
                        }
                        let n = *n;
                        self.pending.pop();
                        out(self.shifted(g.event(n)));
                        taken += 1;
                    }
                    _ => match next_time {
                        Some(t) => {
                            self.pending.push(Reverse((t + g.delay(self.next), self.next)));
                            self.next += self.step;
                        }
                        None => break,
                    },
                }
            }
        }
        self.emitted += taken as u64;
        let exhausted = self.next >= limit && self.pending.is_empty();
        Ok(if exhausted {
            ReadStatus::End
        } else if taken > 0 {
            ReadStatus::Data
        } else {
            ReadStatus::Idle
        })
    }

    fn offset(&self) -> Offset {
        self.emitted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(config: GeneratorConfig, peers: usize) -> Vec<Event> {
        let source = GeneratorSource::new(Arc::new(Generator::new(config).unwrap()), peers);
        let mut out = Vec::new();
        for p in 0..source.partitions {
            let mut reader = source.open(p, None).unwrap();
            while reader.read(1000, &mut |e| out.push(e), &mut Vec::new()).unwrap() != ReadStatus::End {}
        }
        out
    }

    #[test]
    fn proportions_and_ids_follow_the_model() {
        let events = all(GeneratorConfig { events: Some(5000), ..Default::default() }, 1);
        let persons = events.iter().filter(|e| matches!(e, Event::Person(_))).count();
        let auctions = events.iter().filter(|e| matches!(e, Event::Auction(_))).count();
        assert_eq!((persons, auctions, events.len() - persons - auctions), (100, 300, 4600));
        let Event::Auction(a) = &events[1] else { panic!() };
        assert_eq!(a.id, 1000);
        assert!(a.expires > a.date_time && a.reserve > a.initial_bid);
        assert_eq!(events[0].time(), DEFAULT_BASE_TIME);
        assert_eq!(events[4999].time(), DEFAULT_BASE_TIME + 499);
    }

    #[test]
    fn out_of_order_is_bounded_and_holds_the_same_events() {
        let config = GeneratorConfig { events: Some(20_000), max_out_of_order_ms: 300, ..Default::default() };
        let shuffled = all(config.clone(), 1);
        let mut max_seen: u64 = 0;
        let mut worst = 0;
        for e in &shuffled {
            worst = worst.max(max_seen.saturating_sub(e.time()));
            max_seen = max_seen.max(e.time());
        }
        assert!(worst <= 300 && worst > 100, "out-of-orderness {worst}");
        let mut a = shuffled;
        let mut b = all(GeneratorConfig { max_out_of_order_ms: 0, ..config }, 3);
        a.sort();
        b.sort();
        assert_eq!(a, b);
    }

    #[test]
    fn rewinding_resumes_at_the_offset() {
        // In order (a seek) and out of order (a replay).
        for max_out_of_order_ms in [0, 50] {
            let config = GeneratorConfig { events: Some(3000), max_out_of_order_ms, ..Default::default() };
            let source = GeneratorSource::new(Arc::new(Generator::new(config).unwrap()), 2);
            let mut first = Vec::new();
            let mut reader = source.open(1, None).unwrap();
            reader.read(700, &mut |e| first.push(e), &mut Vec::new()).unwrap();
            let offset = reader.offset();
            let mut rest = Vec::new();
            reader.read(100, &mut |e| rest.push(e), &mut Vec::new()).unwrap();
            let mut again = Vec::new();
            let mut resumed = source.open(1, Some(offset)).unwrap();
            resumed.read(100, &mut |e| again.push(e), &mut Vec::new()).unwrap();
            assert_eq!(rest, again, "max_out_of_order_ms {max_out_of_order_ms}");
            assert_eq!(resumed.offset(), offset + 100);
        }
    }
}
