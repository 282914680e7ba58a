//! Count windows: windows of the last N records of a key, in event-time order.

use std::collections::VecDeque;
use std::rc::Rc;

use super::{skeleton, Skeleton, Window, WindowResult, WindowSpec, Windowed};
use crate::aggregate::Aggregate;
use crate::hold::{Hold, Waiting};
use crate::key::{Data, Key, StateMap};
use crate::stream::{EventStream, Update};
use crate::time::{arrival_time, watermark_of, AllowedLateness, Timestamp};

/// Windows of a number of records per key, counted in event-time order.
///
/// Records of a key are taken in event-time order once the watermark passes
/// them (ties in one millisecond by the records' own order, so the result does
/// not depend on arrival order). `sliding(size, slide)` fires every `slide`
/// records over the last `size` of them (fewer at the start), as Flink's
/// `countWindow(size, slide)`; `tumbling(size)` fires on every complete group
/// of `size`, as `countWindow(size)`. A result's window spans the first to the
/// last record's time, and its event time is the last record's.
///
/// A late record within the allowed lateness is put in its place, and every
/// window it shifts is retracted and emitted again; the state for this keeps
/// the records of the last `allowed lateness` ms plus `size` more. Count
/// windows take insertions only.
///
/// ```
/// use highwater_operators::prelude::*;
/// use timely::dataflow::operators::ToStream;
/// use timely::dataflow::operators::capture::{Capture, Extract};
///
/// let captured = timely::example(|scope| {
///     let prices = vec![(10u64, 1_000u64, 1i64), (20, 2_000, 1), (60, 3_000, 1)];
///     EventStream::new(prices.to_stream(scope))
///         .window(CountWindows::sliding(2, 1))
///         .aggregate(Sum::of(|p: &u64| *p as i64))
///         .results.inner.capture()
/// });
/// let out: Vec<i64> = captured.extract().into_iter().flat_map(|(_, d)| d).map(|(r, _, _)| r.value).collect();
/// assert_eq!(out, vec![10, 30, 80]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CountWindows {
    size: u64,
    slide: u64,
    tumbling: bool,
}

impl CountWindows {
    /// Every complete group of `size` records.
    ///
    /// # Panics
    /// If `size` is zero.
    pub fn tumbling(size: u64) -> Self {
        assert!(size > 0, "a count window holds at least one record");
        CountWindows { size, slide: size, tumbling: true }
    }
    /// Every `slide` records, the last `size` records ("the last N events").
    ///
    /// # Panics
    /// If `size` or `slide` is zero.
    pub fn sliding(size: u64, slide: u64) -> Self {
        assert!(size > 0 && slide > 0, "count windows need a positive size and slide");
        CountWindows { size, slide, tumbling: false }
    }

    /// Whether a window ends at the record with absolute index `i`, and where it starts.
    fn window_ending_at(&self, i: u64) -> Option<u64> {
        if (i + 1) % self.slide != 0 {
            return None;
        }
        if self.tumbling {
            Some(i + 1 - self.size)
        } else {
            Some((i + 1).saturating_sub(self.size))
        }
    }
}

/// The processed records of a key and the windows emitted over them.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct KeyState<D, O> {
    /// Processed records in order; `history[0]` has absolute index `base`.
    history: VecDeque<(Timestamp, D)>,
    base: u64,
    /// Emitted windows: (absolute index of the last record, window, value).
    emitted: VecDeque<(u64, Window, O)>,
    /// Changed since the last trim.
    touched: bool,
}

impl<D, O> KeyState<D, O> {
    fn new() -> Self {
        KeyState { history: VecDeque::new(), base: 0, emitted: VecDeque::new(), touched: false }
    }
}

impl<D: Data + Ord> WindowSpec<D> for CountWindows {
    fn aggregate_core<'scope, K, KF, A>(
        self,
        stream: &EventStream<'scope, D>,
        name: &str,
        key: KF,
        lateness: AllowedLateness,
        agg: A,
    ) -> Windowed<'scope, K, A::Output, D>
    where
        D: Data,
        K: Key,
        KF: Fn(&D) -> K + 'static,
        A: Aggregate<D>,
    {
        aggregate(stream, name, key, self, lateness, agg)
    }
}

fn aggregate<'scope, D, K, KF, A>(
    stream: &EventStream<'scope, D>,
    name: &str,
    key: KF,
    spec: CountWindows,
    lateness: AllowedLateness,
    agg: A,
) -> Windowed<'scope, K, A::Output, D>
where
    D: Data + Ord,
    K: Key,
    KF: Fn(&D) -> K + 'static,
    A: Aggregate<D>,
{
    let key = Rc::new(key);
    let (
        Skeleton { builder, checkpointer: _, mut input, results: mut results_out, late: mut late_out, late_count },
        windowed,
    ) = skeleton(stream, name, &key, false);
    let counter = late_count;

    // The windows ending at absolute indexes `from..to`, computed from `history`.
    let evaluate = move |state: &KeyState<D, A::Output>,
                         from: u64,
                         to: u64,
                         agg: &A,
                         k: &K,
                         out: &mut Vec<Update<WindowResult<K, A::Output>>>,
                         emitted: &mut Vec<(u64, Window, A::Output)>| {
        for i in from..to {
            let Some(first) = spec.window_ending_at(i) else {
                continue;
            };
            let first = first.max(state.base);
            let mut acc = agg.init();
            let records = state.history.range((first - state.base) as usize..=(i - state.base) as usize);
            let mut window = Window::new(Timestamp::MAX, 0);
            for (t, d) in records {
                agg.update(&mut acc, d, 1);
                window.start = window.start.min(*t);
                window.end = window.end.max(t + 1);
            }
            if let Some(value) = agg.output(&acc) {
                out.push((WindowResult { window, key: k.clone(), value: value.clone() }, window.end - 1, 1));
                emitted.push((i, window, value));
            }
        }
    };

    builder.build(move |_initial_capabilities| {
        let mut keys: StateMap<K, KeyState<D, A::Output>> = StateMap::default();
        let mut waiting: Waiting<D> = Waiting::default();
        let mut hold = Hold::default();
        let mut processed_upto: Timestamp = 0;
        let mut out = Vec::new();
        let mut emitted = Vec::new();
        let mut touched: Vec<K> = Vec::new();

        move |frontiers| {
            let mut results = results_out.activate();
            let mut late = late_out.activate();

            input.for_each_stamp(|cap, data| {
                let arrived = arrival_time(&cap);
                for batch in data {
                    for (record, time, diff) in batch.drain(..) {
                        assert!(diff > 0, "count windows take insertions only (got diff {diff})");
                        // Too late by its own time: judged first, so that the outcome
                        // does not depend on how far this operator has got.
                        if lateness.release_at(time.saturating_add(1)) <= arrived {
                            late.session(&cap).give((record, time, diff));
                            counter.add(1);
                            continue;
                        }
                        if time >= processed_upto {
                            for _ in 0..diff {
                                waiting.insert(record.clone(), time, arrived, &mut hold, &cap);
                            }
                            continue;
                        }
                        // Late but allowed: insert in place, re-emit every shifted window.
                        let k = key(&record);
                        let state = keys.entry(k.clone()).or_insert_with(KeyState::new);
                        if !std::mem::replace(&mut state.touched, true) {
                            touched.push(k.clone());
                        }
                        for _ in 0..diff {
                            let pos = state.history.partition_point(|(t, d)| (*t, d) <= (time, &record));
                            let abs = state.base + pos as u64;
                            while state.emitted.back().is_some_and(|(last, _, _)| *last >= abs) {
                                let (_, window, value) = state.emitted.pop_back().expect("checked non-empty");
                                out.push((WindowResult { window, key: k.clone(), value }, window.end - 1, -1));
                            }
                            state.history.insert(pos, (time, record.clone()));
                            let end = state.base + state.history.len() as u64;
                            evaluate(state, abs, end, &agg, &k, &mut out, &mut emitted);
                            state.emitted.extend(emitted.drain(..));
                        }
                    }
                }
                if !out.is_empty() {
                    results.session(&cap).give_iterator(out.drain(..));
                }
            });

            let watermark = watermark_of(&frontiers[0]);
            if watermark > processed_upto {
                processed_upto = watermark;
                while let Some((time, mut records, emit_at)) = waiting.pop_before(watermark, &mut hold) {
                    records.sort();
                    for record in records {
                        let k = key(&record);
                        let state = keys.entry(k.clone()).or_insert_with(KeyState::new);
                        if !std::mem::replace(&mut state.touched, true) {
                            touched.push(k.clone());
                        }
                        state.history.push_back((time, record));
                        let end = state.base + state.history.len() as u64;
                        evaluate(state, end - 1, end, &agg, &k, &mut out, &mut emitted);
                        state.emitted.extend(emitted.drain(..));
                    }
                    if !out.is_empty() {
                        results.session(&hold.at(emit_at)).give_iterator(out.drain(..));
                    }
                }
                // Keep the records a late record could still shift, plus a window's
                // worth before them. Only keys that changed need trimming: the others
                // were trimmed when they last changed and hold at most that much.
                let horizon = watermark.saturating_sub(lateness.0);
                for k in touched.drain(..) {
                    let Some(state) = keys.get_mut(&k) else { continue };
                    state.touched = false;
                    let recent = state.base + state.history.partition_point(|(t, _)| *t < horizon) as u64;
                    let keep_from =
                        if spec.tumbling { recent - recent % spec.size } else { recent.saturating_sub(spec.size - 1) }
                            .max(state.base);
                    state.history.drain(..(keep_from - state.base) as usize);
                    state.base = keep_from;
                    while state.emitted.front().is_some_and(|(last, _, _)| *last < recent) {
                        state.emitted.pop_front();
                    }
                    // An empty key is forgotten only where the count restarts at 0.
                    if state.history.is_empty() && state.base % spec.slide == 0 {
                        keys.remove(&k);
                    }
                }
                hold.settle(None);
            }
        }
    });

    windowed
}
