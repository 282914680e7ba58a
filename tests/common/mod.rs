//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use highwater::nexmark::{build, Event, Generator, GeneratorConfig, GeneratorSource, Query, QueryOptions};
use highwater::operators::Timestamp;
use highwater::sink::{collect, Collected};
use highwater::source::{read, SourceMetrics, SourceOptions};
use highwater::time::WatermarkStrategy;
use highwater_operators::Counter;

/// The generator configuration the Nexmark tests use: 30 s of event time.
pub(crate) fn config(events: u64, out_of_order_ms: u64) -> GeneratorConfig {
    GeneratorConfig { events: Some(events), rate: 2_000.0, max_out_of_order_ms: out_of_order_ms, ..Default::default() }
}

/// All events of a configuration, by number.
pub(crate) fn events(config: &GeneratorConfig) -> Vec<Event> {
    let g = Generator::new(config.clone()).unwrap();
    (0..config.events.unwrap()).map(|n| g.event(n)).collect()
}

/// Runs `query` on the generator with `workers` workers; returns the final
/// result (consolidated rows, sorted) and the number of late records.
pub(crate) fn run_query(
    query: Query,
    config: &GeneratorConfig,
    workers: usize,
    options: QueryOptions,
) -> (Vec<String>, u64) {
    let generator = Arc::new(Generator::new(config.clone()).unwrap());
    let out = Collected::default();
    let late = Arc::new(std::sync::Mutex::new(Vec::<Counter>::new()));
    let (o, l) = (out.clone(), Arc::clone(&late));
    let guards = timely::execute(timely::Config::process(workers), move |worker| {
        let generator = Arc::clone(&generator);
        let options = options.clone();
        worker.dataflow::<Timestamp, _, _>(|scope| {
            let source = Arc::new(GeneratorSource::new(generator, scope.peers()));
            let source_options =
                SourceOptions { watermark: WatermarkStrategy::bounded(4_000), batch_size: 257, ..Default::default() };
            let streams =
                read(scope, source, |e: &Event| e.time(), source_options, &SourceMetrics::default(), None).unwrap();
            let output = build(query, &streams.events, &options);
            l.lock().unwrap().extend(output.late.iter().cloned());
            collect(&output.rows, &o);
        });
    })
    .unwrap();
    for r in guards.join() {
        r.unwrap();
    }
    let late = late.lock().unwrap().iter().map(Counter::get).sum();
    (out.rows(), late)
}

/// Quotes a CSV field the canonical way.
pub(crate) fn field(s: &str) -> String {
    if s.contains([',', '"', '\r', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}
