//! Global windows: late records on the direct path, and the end of input with
//! an accumulating processing-time trigger.

use std::sync::{Arc, Mutex};

use highwater_operators::prelude::*;
use highwater_operators::Update;
use timely::dataflow::operators::{Input, Inspect, Probe};
use timely::dataflow::ProbeHandle;

type Seen = Arc<Mutex<Vec<(String, i64)>>>;

/// The consolidated (window, key, sum) rows.
fn table(seen: &Seen) -> Vec<String> {
    let mut t = std::collections::BTreeMap::<String, i64>::new();
    for (row, diff) in seen.lock().unwrap().iter() {
        *t.entry(row.clone()).or_default() += diff;
    }
    t.into_iter().filter(|(_, d)| *d != 0).map(|(r, d)| format!("{r} x{d}")).collect()
}

/// A record late but within the lateness reaches an event-time trigger after
/// the operator released its capability: its timer must still fire.
#[test]
fn late_record_sets_a_timer_after_everything_fired() {
    let seen: Seen = Arc::default();
    let s = Arc::clone(&seen);
    timely::execute_directly(move |worker| {
        let probe = ProbeHandle::new();
        let mut input = worker.dataflow(|scope| {
            let s = Arc::clone(&s);
            let (input, stream) = scope.new_input::<Vec<Update<(char, i64)>>>();
            EventStream::new(stream)
                .window(GlobalWindows::with_trigger(EventTimeTrigger(10)))
                .key_by(|r: &(char, i64)| r.0)
                .allowed_lateness(10)
                .aggregate(Sum::of(|r: &(char, i64)| r.1))
                .results
                .inner
                .inspect(move |(r, _, d)| {
                    s.lock().unwrap().push((format!("{}..{} {} {}", r.window.start, r.window.end, r.key, r.value), *d))
                })
                .probe_with(&probe);
            input
        });
        input.send((('a', 1), 5, 1));
        input.advance_to(25);
        worker.step_while(|| probe.less_than(&25));
        // Everything has fired; 22 is below the watermark but within the lateness.
        input.send((('a', 10), 22, 1));
        input.advance_to(40);
        worker.step_while(|| probe.less_than(&40));
    });
    // The accumulating window fired at 10 with 1, then at 30 with 11 (replacing it).
    assert_eq!(table(&seen), vec!["5..30 a 11 x1".to_string()]);
}

/// An accumulating processing-time trigger over a bounded input: the end of
/// input fires what changed, once.
#[test]
fn processing_time_trigger_flushes_once_at_the_end() {
    let seen: Seen = Arc::default();
    let s = Arc::clone(&seen);
    timely::execute_directly(move |worker| {
        let mut input = worker.dataflow(|scope| {
            let s = Arc::clone(&s);
            let (input, stream) = scope.new_input::<Vec<Update<(char, i64)>>>();
            EventStream::new(stream)
                .window(GlobalWindows::with_trigger(ProcessingTimeTrigger(60_000)))
                .key_by(|r: &(char, i64)| r.0)
                .aggregate(Sum::of(|r: &(char, i64)| r.1))
                .results
                .inner
                .inspect(move |(r, _, d)| s.lock().unwrap().push((format!("{} {}", r.key, r.value), *d)));
            input
        });
        for (i, key) in ['a', 'b', 'a'].into_iter().enumerate() {
            input.send(((key, 1 + i as i64), 10 * i as u64, 1));
        }
        input.close();
    });
    assert_eq!(table(&seen), vec!["a 4 x1".to_string(), "b 2 x1".to_string()]);
}
