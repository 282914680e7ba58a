//! CEP against a brute-force reference, on random keyed streams in random
//! arrival order with random patterns drawn from the builder's grammar, at 1
//! and 3 workers: the same matches and the same timed-out partial matches.
//!
//! The reference enumerates, per key and in event-time order, every
//! subsequence of events with every assignment of its events to steps, and
//! keeps those that satisfy the pattern's definition directly:
//! - each event satisfies its step's condition (given the events before it);
//! - step counts are within the quantifiers; steps are left only after their
//!   minimum, skipped only if optional; negations take no event;
//! - between two taken events, the skipped events obey the contiguity of the
//!   second one's step (strict: none; relaxed: none satisfies that step's
//!   condition; non-deterministic: any), `not_next` forbids the first event
//!   after the previous step, `not_followed_by` any skipped event;
//! - a greedy repeated step is left only with a maximal run (no event it
//!   could take is skipped or taken by the next step); a reluctant one (past
//!   its minimum) does not take an event a next step could;
//! - all events lie less than `within` after the first; a trailing
//!   `not_followed_by` holds until the end of that bound.
//!
//! A timed-out partial match is a prefix obeying the same rules that is not a
//! match itself and could still have gone on when its bound ran out (some way
//! to continue it skips every later event within the bound). The after-match
//! skip strategy is applied to both, in emission order.

use std::collections::BTreeMap;
use std::sync::Arc;

use highwater::sink::{collect, Collected};
use highwater::source::{read, MemorySource, SourceMetrics, SourceOptions};
use highwater::time::WatermarkStrategy;
use highwater_operators::cep::{AfterMatchSkip, Pattern};
use highwater_operators::prelude::*;
use proptest::prelude::*;

/// (id, key, kind, value, time)
type Ev = (u32, u8, u8, u8, u64);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Take,
    NotNext,
    NotFollowedBy,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Contig {
    Strict,
    Relaxed,
    Any,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GreedDesc {
    Both,
    Greedy,
    Reluctant,
}

/// A step's condition.
#[derive(Clone, Copy, Debug)]
enum Cond {
    Kind(u8),
    KindOrAbove(u8, u8),
    /// The value is greater than the value of the first event of an earlier step (false if none).
    AboveFirstOf(usize),
}

#[derive(Clone, Debug)]
struct StepDesc {
    kind: Kind,
    cond: Cond,
    min: u32,
    max: Option<u32>,
    greed: GreedDesc,
    entry: Contig,
    inner: Contig,
}

#[derive(Clone, Debug)]
struct PatDesc {
    steps: Vec<StepDesc>,
    within: Option<u64>,
    skip: u8,
}

fn name(i: usize) -> String {
    format!("s{i}")
}

fn holds(cond: Cond, e: &Ev, taken: &[(usize, Ev)]) -> bool {
    match cond {
        Cond::Kind(k) => e.2 == k,
        Cond::KindOrAbove(k, v) => e.2 == k || e.3 > v,
        Cond::AboveFirstOf(s) => taken.iter().find(|(st, _)| *st == s).is_some_and(|(_, f)| e.3 > f.3),
    }
}

fn skip_of(d: &PatDesc) -> AfterMatchSkip {
    match d.skip {
        0 | 1 => AfterMatchSkip::NoSkip,
        2 => AfterMatchSkip::SkipPastLastEvent,
        3 => AfterMatchSkip::SkipToNext,
        4 => AfterMatchSkip::SkipToFirst(name(0)),
        _ => AfterMatchSkip::SkipToLast(name(0)),
    }
}

fn build(d: &PatDesc) -> Pattern<Ev> {
    let mut p: Option<Pattern<Ev>> = None;
    for (i, s) in d.steps.iter().enumerate() {
        let n = name(i);
        let mut q = match (p.take(), s.kind, s.entry) {
            (None, _, _) => Pattern::begin(&n),
            (Some(p), Kind::NotNext, _) => p.not_next(&n),
            (Some(p), Kind::NotFollowedBy, _) => p.not_followed_by(&n),
            (Some(p), Kind::Take, Contig::Strict) => p.next(&n),
            (Some(p), Kind::Take, Contig::Relaxed) => p.followed_by(&n),
            (Some(p), Kind::Take, Contig::Any) => p.followed_by_any(&n),
        };
        q = match s.cond {
            Cond::AboveFirstOf(step) => {
                let target = name(step);
                q.where_matched(move |e, m| m.first(&target).is_some_and(|f| e.3 > f.3))
            }
            c => q.where_(move |e| holds(c, e, &[])),
        };
        if s.kind == Kind::Take {
            q = match (s.min, s.max) {
                (1, Some(1)) => q,
                (0, Some(1)) => q.optional(),
                (min, Some(max)) => q.times_between(min, max),
                (min, None) => q.times_or_more(min),
            };
            q = match s.greed {
                GreedDesc::Both => q,
                GreedDesc::Greedy => q.greedy(),
                GreedDesc::Reluctant => q.reluctant(),
            };
            q = match s.inner {
                Contig::Strict => q.consecutive(),
                Contig::Relaxed => q,
                Contig::Any => q.allow_combinations(),
            };
        }
        p = Some(q);
    }
    let mut p = p.expect("a step").skip(skip_of(d));
    if let Some(w) = d.within {
        p = p.within(w);
    }
    p
}

fn pattern_desc() -> impl Strategy<Value = PatDesc> {
    let contig = prop::sample::select(vec![Contig::Strict, Contig::Relaxed, Contig::Relaxed, Contig::Any]);
    let quant = prop::sample::select(vec![
        (1, Some(1)),
        (1, Some(1)),
        (0, Some(1)),
        (1, None),
        (2, Some(2)),
        (1, Some(3)),
        (0, None),
    ]);
    let greed = prop::sample::select(vec![GreedDesc::Both, GreedDesc::Both, GreedDesc::Greedy, GreedDesc::Reluctant]);
    let kind = prop::sample::select(vec![Kind::Take, Kind::Take, Kind::Take, Kind::NotNext, Kind::NotFollowedBy]);
    let step = (kind, 0u8..3, 0u8..10, 0u8..3, quant, greed, contig.clone(), contig);
    (prop::collection::vec(step, 1..=4), prop::option::weighted(0.7, 2u64..12), 0u8..6).prop_map(
        |(raw, within, skip)| {
            let steps = raw
                .into_iter()
                .enumerate()
                .map(|(i, (kind, k, v, c, (min, max), greed, entry, inner))| {
                    let kind = if i == 0 { Kind::Take } else { kind };
                    let cond = match c {
                        0 => Cond::Kind(k),
                        1 if i > 0 => Cond::AboveFirstOf(0),
                        _ => Cond::KindOrAbove(k, v),
                    };
                    let (min, max) = if kind == Kind::Take { (min, max) } else { (1, Some(1)) };
                    let greed = if kind == Kind::Take { greed } else { GreedDesc::Both };
                    StepDesc { kind, cond, min, max, greed, entry, inner }
                })
                .collect();
            PatDesc { steps, within: within.map(|w| w * 10), skip }
        },
    )
}

/// A found item: (key, [(step, id)], time, timed out).
type Item = (u8, Vec<(usize, u32)>, u64, bool);

/// Take steps reachable next, each with the negations crossed to reach it.
type Targets = Vec<(usize, Vec<usize>)>;

/// Where an item is emitted: (sequence number, 0 = before that event / 1 =
/// after it, expiry time).
type Position = (usize, u8, u64);

/// Taken events: (index in event-time order, step).
type Prefix = Vec<(usize, usize)>;

/// Which start positions an emitted match prunes, from its position on.
type Barrier = (Position, Box<dyn Fn(usize) -> bool>);

struct Reference<'a> {
    d: &'a PatDesc,
    events: Vec<Ev>,
}

impl Reference<'_> {
    fn pred(&self, step: usize, e: &Ev, taken: &[(usize, Ev)]) -> bool {
        holds(self.d.steps[step].cond, e, taken)
    }

    /// The take steps reachable right after `from` (None: the start) once it
    /// may be left, with the negations crossed; and whether the end is reached
    /// (with the `not_followed_by` steps crossed to it).
    fn closure(&self, from: Option<usize>) -> (Targets, Option<Vec<usize>>) {
        let steps = &self.d.steps;
        let mut k = from.map_or(0, |s| s + 1);
        let mut crossed: Vec<usize> = Vec::new();
        let mut targets: Vec<(usize, Vec<usize>)> = Vec::new();
        loop {
            if k == steps.len() {
                let nfb: Vec<usize> =
                    crossed.iter().copied().filter(|n| steps[*n].kind == Kind::NotFollowedBy).collect();
                return (targets, Some(nfb));
            }
            match steps[k].kind {
                Kind::Take => {
                    targets.push((k, crossed.clone()));
                    if steps[k].min > 0 {
                        return (targets, None);
                    }
                }
                _ => crossed.push(k),
            }
            k += 1;
        }
    }

    /// Whether taking `x` (index `xi`) into `step` after the partial match
    /// `taken` (last at index `last`, its step `at` with `count` events) obeys
    /// the rules for the gap between them.
    fn gap_ok(&self, taken: &[(usize, Ev)], last: usize, at: usize, count: u32, xi: usize, step: usize) -> bool {
        let steps = &self.d.steps;
        let x = &self.events[xi];
        let skipped = &self.events[last + 1..xi];
        let ctx = taken;
        if step == at {
            let s = &steps[at];
            if s.max.is_some_and(|m| count >= m) {
                return false;
            }
            if s.greed == GreedDesc::Reluctant && count >= s.min {
                let (targets, _) = self.closure(Some(at));
                if targets.iter().any(|(j, _)| self.pred(*j, x, ctx)) {
                    return false;
                }
            }
            return match s.inner {
                Contig::Strict => skipped.is_empty(),
                Contig::Relaxed => skipped.iter().all(|y| !self.pred(at, y, ctx)),
                Contig::Any => true,
            };
        }
        if count < steps[at].min {
            return false;
        }
        let (targets, _) = self.closure(Some(at));
        let Some((_, crossed)) = targets.iter().find(|(j, _)| *j == step) else { return false };
        let s = &steps[at];
        if s.greed == GreedDesc::Greedy
            && s.max.is_none_or(|m| count < m)
            && (self.pred(at, x, ctx) || skipped.iter().any(|y| self.pred(at, y, ctx)))
        {
            // A greedy step is left only with a maximal run of its events.
            return false;
        }
        let first_after = skipped.first().unwrap_or(x);
        for n in crossed {
            match steps[*n].kind {
                Kind::NotNext if self.pred(*n, first_after, ctx) => return false,
                Kind::NotFollowedBy if skipped.iter().any(|y| self.pred(*n, y, ctx)) => return false,
                _ => {}
            }
        }
        match steps[step].entry {
            Contig::Strict => skipped.is_empty(),
            Contig::Relaxed => skipped.iter().all(|y| !self.pred(step, y, ctx)),
            Contig::Any => true,
        }
    }

    /// Every valid prefix (taken event indices with steps), depth first.
    fn prefixes(&self) -> Vec<Vec<(usize, usize)>> {
        let mut out = Vec::new();
        let (starts, _) = self.closure(None);
        for xi in 0..self.events.len() {
            for (s, _) in &starts {
                if self.pred(*s, &self.events[xi], &[]) {
                    self.grow(vec![(xi, *s)], &mut out);
                }
            }
        }
        out
    }

    fn grow(&self, prefix: Vec<(usize, usize)>, out: &mut Vec<Vec<(usize, usize)>>) {
        let taken: Vec<(usize, Ev)> = prefix.iter().map(|(i, s)| (*s, self.events[*i])).collect();
        let (last, at) = *prefix.last().expect("non-empty");
        let count = prefix.iter().rev().take_while(|(_, s)| *s == at).count() as u32;
        let first_time = self.events[prefix[0].0].4;
        for xi in last + 1..self.events.len() {
            let x = &self.events[xi];
            if self.d.within.is_some_and(|w| x.4 - first_time >= w) {
                break;
            }
            for step in at..self.d.steps.len() {
                if self.d.steps[step].kind == Kind::Take
                    && self.pred(step, x, &taken)
                    && self.gap_ok(&taken, last, at, count, xi, step)
                {
                    let mut next = prefix.clone();
                    next.push((xi, step));
                    self.grow(next, out);
                }
            }
        }
        out.push(prefix);
    }

    /// Every match and timed-out partial match, with their positions, before skipping.
    /// Position: (sequence number, 0 = before that event / 1 = after it, expiry time).
    fn items(&self, key: u8) -> Vec<(Position, Item, Prefix)> {
        let n = self.events.len();
        let mut out = Vec::new();
        for prefix in self.prefixes() {
            let taken: Vec<(usize, Ev)> = prefix.iter().map(|(i, s)| (*s, self.events[*i])).collect();
            let (last, at) = *prefix.last().expect("non-empty");
            let count = prefix.iter().rev().take_while(|(_, s)| *s == at).count() as u32;
            let first = &self.events[prefix[0].0];
            let mut ids: Vec<(usize, u32)> = prefix.iter().map(|(i, s)| (*s, self.events[*i].0)).collect();
            ids.sort_by_key(|(_, id)| *id);
            let expiry = self.d.within.map(|w| first.4 + w);
            // Events after the last taken one, within the bound.
            let later: Vec<usize> = (last + 1..n).filter(|i| expiry.is_none_or(|e| self.events[*i].4 < e)).collect();
            // Expiry happens before the first event at or after the bound, in bound order.
            let expiry_pos = (later.last().map_or(last + 1, |l| l + 1), 0u8, expiry.unwrap_or(u64::MAX));
            let (_, end) = if count >= self.d.steps[at].min { self.closure(Some(at)) } else { (Vec::new(), None) };
            let mut complete = false;
            if let Some(nfb) = &end {
                if nfb.is_empty() {
                    complete = true;
                    out.push(((last, 1, 0), (key, ids.clone(), self.events[last].4, false), prefix.clone()));
                } else if later.iter().all(|i| nfb.iter().all(|n| !self.pred(*n, &self.events[*i], &taken))) {
                    complete = true;
                    let w = self.d.within.expect("validated");
                    out.push((expiry_pos, (key, ids.clone(), first.4 + w - 1, false), prefix.clone()));
                }
            }
            let Some(w) = self.d.within else { continue };
            if complete || end.as_ref().is_some_and(|nfb| nfb.is_empty()) {
                continue;
            }
            // Could it still have gone on? Some branch skips every later event.
            let s = &self.d.steps[at];
            let mut alive = false;
            if s.max.is_none_or(|m| count < m) {
                alive |= later.iter().all(|i| match s.inner {
                    Contig::Strict => false,
                    Contig::Relaxed => !self.pred(at, &self.events[*i], &taken),
                    Contig::Any => true,
                });
            }
            if count >= s.min {
                let (targets, _) = self.closure(Some(at));
                let greedy = s.greed == GreedDesc::Greedy && s.max.is_none_or(|m| count < m);
                for (j, crossed) in targets {
                    let ok = later.iter().enumerate().all(|(pos, i)| {
                        let y = &self.events[*i];
                        if greedy && self.pred(at, y, &taken) {
                            return false;
                        }
                        let negated = crossed.iter().any(|nn| match self.d.steps[*nn].kind {
                            Kind::NotNext => pos == 0 && self.pred(*nn, y, &taken),
                            _ => self.pred(*nn, y, &taken),
                        });
                        !negated
                            && match self.d.steps[j].entry {
                                Contig::Strict => false,
                                Contig::Relaxed => !self.pred(j, y, &taken),
                                Contig::Any => true,
                            }
                    });
                    alive |= ok;
                }
            }
            if alive {
                out.push((expiry_pos, (key, ids, first.4 + w - 1, true), prefix));
            }
        }
        out
    }

    /// Applies the skip strategy in emission order.
    fn emitted(&self, key: u8) -> Vec<Item> {
        let mut items = self.items(key);
        // Emission order: position; at one position pending matches, then time-outs
        // (both at expiry), or the matches of the event; each by their events.
        items.sort_by(|a, b| (a.0, a.1 .3, &a.2).cmp(&(b.0, b.1 .3, &b.2)));
        let skip = skip_of(self.d);
        let mut barriers: Vec<Barrier> = Vec::new();
        // Whether a partial match starting at event `i` existed at emission position `pos`.
        let started_before = |i: usize, pos: Position| if pos.1 == 1 { i <= pos.0 } else { i < pos.0 };
        let mut out = Vec::new();
        for (pos, item, prefix) in items {
            let start = prefix[0].0;
            if barriers.iter().any(|(at, prune)| started_before(start, *at) && prune(start)) {
                continue;
            }
            if !item.3 {
                let first = prefix[0].0;
                let last = prefix[prefix.len() - 1].0;
                let of_step0 = |last_one: bool| {
                    let mut it = prefix.iter().filter(|(_, s)| *s == 0).map(|(i, _)| *i);
                    if last_one {
                        it.next_back()
                    } else {
                        it.next()
                    }
                };
                let prune: Option<Box<dyn Fn(usize) -> bool>> = match skip {
                    AfterMatchSkip::NoSkip => None,
                    AfterMatchSkip::SkipPastLastEvent => Some(Box::new(move |s| s <= last)),
                    AfterMatchSkip::SkipToNext => Some(Box::new(move |s| s <= first)),
                    AfterMatchSkip::SkipToFirst(_) => of_step0(false).map(|at| Box::new(move |s| s < at) as Box<_>),
                    AfterMatchSkip::SkipToLast(_) => of_step0(true).map(|at| Box::new(move |s| s < at) as Box<_>),
                };
                if let Some(prune) = prune {
                    barriers.push((pos, prune));
                }
            }
            out.push(item);
        }
        out
    }
}

#[derive(Clone, Debug)]
struct Case {
    partitions: Vec<Vec<Ev>>,
    bound: u64,
    /// The operator's allowed lateness (0: late events are rejected).
    lateness: u64,
}

/// Read batches: the watermark advances between batches of this many events.
const BATCH: usize = 2;

/// The events the operator takes into account (those not later than the
/// allowed lateness when read), and the others.
fn accepted(case: &Case) -> (Vec<Ev>, Vec<Ev>) {
    let (mut keep, mut late) = (Vec::new(), Vec::new());
    for p in &case.partitions {
        let mut max_seen: Option<u64> = None;
        for batch in p.chunks(BATCH) {
            let watermark = max_seen.map_or(0, |m| m.saturating_sub(case.bound));
            for e in batch {
                if e.4 + 1 + case.lateness > watermark {
                    keep.push(*e);
                } else {
                    late.push(*e);
                }
            }
            for e in batch {
                max_seen = Some(max_seen.map_or(e.4, |m| m.max(e.4)));
            }
        }
    }
    (keep, late)
}

/// Random partitions; with `late`, some events are later than the watermark
/// (by little or by far) and the operator allows some lateness.
fn case(late: bool) -> impl Strategy<Value = Case> {
    let event =
        (0u8..2, 0u8..3, 0u8..10, 1u64..4, 0u64..4, prop::bool::weighted(if late { 0.2 } else { 0.0 }), 0u64..12);
    let lateness = if late { prop::sample::select(vec![0u64, 6, 15, 60]).boxed() } else { Just(0u64).boxed() };
    (prop::collection::vec(prop::collection::vec(event, 0..10), 1..=3), 0u64..4, lateness).prop_map(
        move |(raw, bound, lateness)| {
            let mut id = 0;
            let mut used = std::collections::BTreeSet::new();
            let partitions = raw
                .into_iter()
                .map(|p| {
                    let mut clock = 0;
                    p.into_iter()
                        .filter_map(|(key, kind, value, step, back, very_late, far)| {
                            clock += step * 3;
                            let back = if very_late { bound + 1 + far } else { back % (bound + 1) };
                            let t = clock.saturating_sub(back * 3);
                            // Distinct times per key: equal times have no order across partitions.
                            if !used.insert((key, t)) {
                                return None;
                            }
                            id += 1;
                            Some((id, key, kind, value, t))
                        })
                        .collect()
                })
                .collect();
            Case { partitions, bound: bound * 3, lateness }
        },
    )
}

fn reference(case: &Case, d: &PatDesc) -> BTreeMap<Item, i64> {
    let mut out = BTreeMap::new();
    let (accepted, _) = accepted(case);
    for key in 0..2u8 {
        let mut events: Vec<Ev> = accepted.iter().filter(|e| e.1 == key).copied().collect();
        events.sort_by_key(|e| e.4);
        for item in (Reference { d, events }).emitted(key) {
            *out.entry(item).or_insert(0) += 1;
        }
    }
    out
}

fn run(case: &Case, d: &PatDesc, workers: usize) -> (BTreeMap<Item, i64>, BTreeMap<Ev, i64>) {
    let source = Arc::new(MemorySource::new(case.partitions.clone()));
    let found = Collected::default();
    let late = Collected::default();
    let (f, l) = (found.clone(), late.clone());
    let (bound, lateness) = (case.bound, case.lateness);
    let d = d.clone();
    timely::execute(timely::Config::process(workers), move |worker| {
        let source = Arc::clone(&source);
        let (f, l) = (f.clone(), l.clone());
        let pattern = build(&d);
        worker.dataflow::<Timestamp, _, _>(|scope| {
            let options = SourceOptions {
                watermark: WatermarkStrategy::bounded(bound),
                idle_timeout: None,
                batch_size: BATCH,
                ..Default::default()
            };
            let events = read(scope, source, |e: &Ev| e.4, options, &SourceMetrics::default(), None).unwrap().events;
            let out = events.allowed_lateness(lateness).key_by(|e| e.1).pattern(pattern).unwrap();
            let item = |timed_out: bool| {
                move |(m, t, d): Update<highwater_operators::cep::Match<u8, Ev>>, out: &mut Vec<Update<Item>>| {
                    let mut ids = Vec::new();
                    for (n, events) in &m.steps {
                        let step: usize = n[1..].parse().unwrap();
                        ids.extend(events.iter().map(|e| (step, e.0)));
                    }
                    ids.sort_by_key(|(_, id)| *id);
                    out.push(((m.key, ids, t, timed_out), t, d));
                }
            };
            let all =
                out.matches.flat_map_updates("M", item(false)).concat(&out.timeouts.flat_map_updates("T", item(true)));
            collect(&all, &f);
            collect(&out.late.stream, &l);
        });
    })
    .unwrap()
    .join()
    .into_iter()
    .for_each(|r| r.unwrap());
    (found.consolidated(), late.consolidated())
}

use highwater_operators::Update;

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, max_global_rejects: 100_000, ..ProptestConfig::default() })]

    #[test]
    fn matches_and_timeouts_equal_the_reference(case in case(false), d in pattern_desc()) {
        prop_assume!(build(&d).validate().is_ok());
        let want = reference(&case, &d);
        prop_assert_eq!(run(&case, &d, 1).0, want.clone(), "1 worker, pattern {:?}", d);
        prop_assert_eq!(run(&case, &d, 3).0, want, "3 workers");
    }

    /// Late events within the allowed lateness correct the outputs (their
    /// changelog sums to the reference over the accepted events); later ones
    /// go to the late output.
    #[test]
    fn late_events_correct_the_outputs(case in case(true), d in pattern_desc()) {
        prop_assume!(build(&d).validate().is_ok());
        let want = reference(&case, &d);
        let (_, rejected) = accepted(&case);
        let mut late_want = BTreeMap::new();
        for e in rejected {
            *late_want.entry(e).or_insert(0) += 1;
        }
        for workers in [1, 3] {
            let (got, late) = run(&case, &d, workers);
            prop_assert_eq!(got, want.clone(), "{} workers, lateness {}, pattern {:?}", workers, case.lateness, d);
            prop_assert_eq!(late, late_want.clone(), "late events at {} workers", workers);
        }
    }
}
