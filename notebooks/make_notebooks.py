import json, sys, os
out = sys.argv[1]
def nb(cells):
    return {"cells": [{"cell_type": t, "metadata": {}, "source": src.strip("\n").splitlines(True), **({"execution_count": None, "outputs": []} if t == "code" else {})} for t, src in cells],
            "metadata": {"kernelspec": {"display_name": "Rust", "language": "rust", "name": "rust"},
                         "language_info": {"codemirror_mode": "rust", "file_extension": ".rs", "mimetype": "text/rust", "name": "Rust", "pygment_lexer": "rust", "version": ""}},
            "nbformat": 4, "nbformat_minor": 5}
# The same dependencies, in the same order, in every notebook: evcxr's cache
# then reuses one notebook's build in the next (a different set builds
# everything again).
DEPS = '''
:cache 2000
:opt 0
:dep highwater = { path = "..", default-features = false }
:dep timely = "0.32"
:dep serde_json = "1"
:dep plotters = { version = "0.3", default-features = false, features = ["evcxr", "line_series", "svg_backend"] }
'''
HTML = '''
/// Shows rows as an HTML table in the notebook (evcxr displays what is
/// printed between these markers as that MIME type).
fn show_table(header: &[&str], rows: &[Vec<String>]) {
    let mut html = String::from("<table><tr>");
    for h in header {
        html += &format!("<th>{h}</th>");
    }
    html += "</tr>";
    for row in rows {
        html += "<tr>";
        for cell in row {
            html += &format!("<td>{cell}</td>");
        }
        html += "</tr>";
    }
    html += "</table>";
    println!("EVCXR_BEGIN_CONTENT text/html\\n{html}\\nEVCXR_END_CONTENT");
}
'''

tour = nb([
("markdown", '''
# A guided tour of highwater

This notebook walks through event time in highwater with a handful of
hand-written click events: a windowed count stepped by hand, the watermark
advancing, a late event that corrects a result within the allowed lateness,
and a late event beyond it going to the late side output.

Run it top to bottom (the first cell compiles highwater, about two minutes
the first time; later runs use evcxr's cache).
'''),
("code", DEPS),
("code", '''
use std::sync::{Arc, Mutex};

use highwater::prelude::*;
use timely::dataflow::operators::Probe;
use timely::dataflow::InputHandle;
'''),
("markdown", '''
## Events, windows and the watermark

A record is `(data, event time in ms, diff)`. Its *timely* time is the
watermark it travelled at: the frontier of the dataflow is the watermark.
Below, clicks are counted per user in 10 s tumbling windows, with 5 s of
allowed lateness. A window fires when the watermark passes its end; a click
that arrives after that but less than 5 s behind the end corrects the
window (a retraction of the old count, then the new one); a click later
still goes to the late output, never silently dropped.

`tour` runs a script of steps on one worker and returns what happened after
each, as lines.
'''),
("code", '''
/// One step of the tour: a click (user, event time), or the watermark
/// moving to a time.
#[derive(Clone, Debug)]
enum Step {
    Click(&'static str, u64),
    Watermark(u64),
}

fn tour(steps: &[Step]) -> Vec<String> {
    let steps = steps.to_vec();
    timely::execute_directly(move |worker| {
        let log = Arc::new(Mutex::new(Vec::<String>::new()));
        let mut input = InputHandle::new();
        let (late_log, result_log) = (Arc::clone(&log), Arc::clone(&log));
        let probe = worker.dataflow(|scope| {
            let clicks = EventStream::new(input.to_stream(scope));
            let counts = clicks
                .window(Tumbling::of(10.secs()))
                .key_by(|user: &String| user.clone())
                .allowed_lateness(5.secs())
                .aggregate(Count);
            counts.late.stream.inspect(move |(user, time, _)| {
                late_log.lock().unwrap().push(format!("  late, to the side output: {user} at {time} ms"));
            });
            let (probe, _) = counts
                .results
                .inspect(move |(r, _, diff)| {
                    let what = if *diff > 0 { "fires" } else { "retracts" };
                    result_log.lock().unwrap().push(format!(
                        "  window [{}, {}) {what}: {} clicked {} times",
                        r.window.start, r.window.end, r.key, r.value
                    ));
                })
                .inner
                .probe();
            probe
        });
        let mut lines = Vec::new();
        for step in steps {
            match step {
                Step::Click(user, time) => {
                    lines.push(format!("click: {user} at {time} ms (watermark {} ms)", input.time()));
                    input.send((user.to_string(), time, 1i64));
                }
                Step::Watermark(time) => {
                    lines.push(format!("watermark -> {time} ms"));
                    input.advance_to(time);
                    while probe.less_than(&time) {
                        worker.step();
                    }
                    lines.extend(log.lock().unwrap().drain(..));
                }
            }
        }
        lines.push("end of input: the watermark moves past every time".to_owned());
        input.close();
        while worker.step() {}
        lines.extend(log.lock().unwrap().drain(..));
        lines
    })
}
'''),
("markdown", '''
## Stepping by hand

Three clicks in the first window, then the watermark passes 10 s: the
window `[0, 10000)` fires. Then a click for the second window, and the
watermark moves to 12 s: nothing fires, the second window ends at 20 s. At
the end of the input the watermark moves past every time, and it fires.
'''),
("code", '''
use Step::*;
let first = [Click("ann", 1_000), Click("bob", 3_000), Click("ann", 8_000), Watermark(10_000), Click("ann", 12_000), Watermark(12_000)];
for line in tour(&first) {
    println!("{line}");
}
'''),
("markdown", '''
## Late events

Now bob's click at 7 s arrives when the watermark is already at 12 s: 5 s
behind it, but within the allowed lateness (the window ended at 10 s, and
is kept until 15 s), so the first window is corrected. Once the watermark
has passed 20 s, ann's click at 2 s is too late for any correction: it goes
to the late output.
'''),
("code", '''
let mut steps = first.to_vec();
steps.extend([Click("bob", 7_000), Watermark(20_000), Click("ann", 2_000), Watermark(30_000)]);
let lines = tour(&steps);
for line in &lines {
    println!("{line}");
}
'''),
("markdown", '''
## Check

The last cell checks what the tour showed (the notebook is executed in CI).
'''),
("code", '''
{
    let has = |line: &str| lines.iter().any(|l| l == line);
    assert!(has("  window [0, 10000) fires: ann clicked 2 times"));
    assert!(has("  window [0, 10000) fires: bob clicked 1 times"));
    assert!(has("  window [0, 10000) retracts: bob clicked 1 times"));
    assert!(has("  window [0, 10000) fires: bob clicked 2 times"));
    assert!(has("  window [10000, 20000) fires: ann clicked 1 times"));
    assert!(has("  late, to the side output: ann at 2000 ms"));
    assert_eq!(lines.iter().filter(|l| l.contains("retracts")).count(), 1);
}
println!("tour: all checks passed");
'''),
])

nexmark = nb([
("markdown", '''
# Nexmark in a notebook

Nexmark is the benchmark of stream processors: an auction site's people,
auctions and bids. highwater has a generator and all queries q0–q22 as
dataflows (`highwater::nexmark`). This notebook runs q5 (hot items: the
auctions with the most bids in sliding windows) and q7 (the highest bid of
every 10 s window) on generated events, shows the results as tables and
plots throughput and window results inline.
'''),
("code", DEPS),
("code", '''
use std::sync::Arc;
use std::time::Instant;

use highwater::nexmark::{build, Event, Generator, GeneratorConfig, GeneratorSource, Query, QueryOptions};
use highwater::prelude::*;
use plotters::prelude::*;
'''),
("code", HTML),
("markdown", '''
`run` generates `events` events (1 000 a second of event time, so that
200 000 events make 200 s: twenty 10 s windows) on `workers` workers, runs a query and
returns its header, its final rows (CSV lines, consolidated) and the
throughput in events per second.
'''),
("code", '''
fn run(query: u8, events: u64, workers: usize) -> (Vec<&'static str>, Vec<String>, f64) {
    let generator = Arc::new(Generator::new(GeneratorConfig { events: Some(events), rate: 1_000.0, ..Default::default() }).unwrap());
    let rows = Collected::default();
    let header = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (sink, head) = (rows.clone(), Arc::clone(&header));
    let started = Instant::now();
    Job::new(timely::Config::process(workers))
        .run(move |worker| {
            let (generator, sink, head) = (Arc::clone(&generator), sink.clone(), Arc::clone(&head));
            worker.dataflow(|scope| -> Result<(), highwater::source::SourceError> {
                let source = Arc::new(GeneratorSource::new(generator, scope.peers()));
                let read = FromSource::new(source, |e: &Event| e.time()).build(scope)?;
                let out = build(Query(query), &read.events, &QueryOptions::default());
                *head.lock().unwrap() = out.header.to_vec();
                collect(&out.rows, &sink);
                Ok(())
            })
        })
        .unwrap();
    let seconds = started.elapsed().as_secs_f64();
    let header = header.lock().unwrap().clone();
    (header, rows.rows(), events as f64 / seconds)
}
'''),
("markdown", '''
## q5: hot items

The auctions with the most bids in each 10 s window, sliding every 2 s.
'''),
("code", '''
let (q5_header, q5_rows, q5_rate) = run(5, 200_000, 2);
println!("q5: {} rows, {:.0} events/s", q5_rows.len(), q5_rate);
let cells: Vec<Vec<String>> = q5_rows.iter().take(10).map(|r| r.split(',').map(str::to_owned).collect()).collect();
show_table(&q5_header, &cells);
'''),
("markdown", '''
## q7: the highest bid of every window
'''),
("code", '''
let (q7_header, q7_rows, q7_rate) = run(7, 200_000, 2);
println!("q7: {} rows, {:.0} events/s", q7_rows.len(), q7_rate);
let cells: Vec<Vec<String>> = q7_rows.iter().take(10).map(|r| r.split(',').map(str::to_owned).collect()).collect();
show_table(&q7_header, &cells);
'''),
("markdown", '''
The highest price of each window, over the run (q7's `price` column, by
window end). Prices are in cents.
'''),
("code", '''
let price = q7_header.iter().position(|h| *h == "price").expect("q7 has a price column");
let end = q7_header.iter().position(|h| h.contains("end") || h.contains("time")).unwrap_or(q7_header.len() - 1);
let mut points: Vec<(usize, f64)> = q7_rows
    .iter()
    .map(|r| r.split(',').collect::<Vec<_>>())
    .map(|c| (c[end].to_owned(), c[price].parse::<f64>().unwrap_or(0.0)))
    .collect::<std::collections::BTreeMap<_, _>>()
    .into_values()
    .enumerate()
    .collect();
points.sort_by(|a, b| a.0.cmp(&b.0));
let top = points.iter().map(|p| p.1).fold(1.0, f64::max);
evcxr_figure((640, 300), |root| {
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("q7: highest bid per 10 s window", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0..points.len(), 0.0..top * 1.1)?;
    chart.configure_mesh().x_desc("window").y_desc("price").draw()?;
    chart.draw_series(LineSeries::new(points.iter().copied(), &BLUE))?;
    Ok(())
})
'''),
("markdown", '''
## Throughput

q5 on one and two workers, on inputs of growing size. In a notebook the
code is built without optimisation (`:opt 0`: it compiles fastest) and the
inputs are small,
so these figures are far below the release binary's (BENCHMARKS.md): the
point is the shape, not the numbers.
'''),
("code", '''
let sizes = [50_000u64, 100_000, 200_000];
let mut rates: Vec<(usize, Vec<(u64, f64)>)> = Vec::new();
for workers in [1usize, 2] {
    let series = sizes.iter().map(|&n| (n, run(5, n, workers).2)).collect::<Vec<_>>();
    rates.push((workers, series));
}
for (workers, series) in &rates {
    println!("{workers} worker(s): {series:?}");
}
let top = rates.iter().flat_map(|(_, s)| s.iter().map(|p| p.1)).fold(1.0, f64::max);
evcxr_figure((640, 300), |root| {
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("q5 throughput (events/s)", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(0u64..sizes[sizes.len() - 1], 0.0..top * 1.2)?;
    chart.configure_mesh().x_desc("events").draw()?;
    for (workers, series) in &rates {
        let color = if *workers == 1 { &RED } else { &BLUE };
        chart
            .draw_series(LineSeries::new(series.iter().copied(), color))?
            .label(format!("{workers} worker(s)"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart.configure_series_labels().background_style(&WHITE).draw()?;
    Ok(())
})
'''),
("markdown", '''
## Check

Results do not depend on the number of workers: q7 on one worker gives the
same rows as on two.
'''),
("code", '''
let (_, q7_one, _) = run(7, 200_000, 1);
assert_eq!(q7_one, q7_rows);
assert!(!q5_rows.is_empty() && !q7_rows.is_empty());
assert_eq!(rates.len(), 2);
println!("nexmark: all checks passed");
'''),
])

cep = nb([
("markdown", '''
# Complex event processing

A pattern over each user's events in event-time order: one or more failed
logins, then a password reset, within 60 seconds (a sign of account
takeover). We write it twice, as text (`PATTERN ... DEFINE ...`, as
`highwater cep --pattern` reads it) and with the Rust builder, run both over
the same sample events, and look at the matches and at the partial matches
that timed out.
'''),
("code", DEPS),
("code", '''
use std::sync::{Arc, Mutex};

use highwater::cep::compile;
use serde_json::Value;
use highwater::prelude::*;
use timely::dataflow::operators::ToStream;
'''),
("markdown", '''
## Sample events

JSON Lines, out of order, for three users. alice fails twice and resets,
bob fails once and never resets (his partial match times out after 60 s),
carol resets without failing (no match).
'''),
("code", '''
let lines = r#"
{"time":1700000000000,"user":"alice","kind":"login_failed"}
{"time":1700000005000,"user":"bob","kind":"login_failed"}
{"time":1700000030000,"user":"alice","kind":"password_reset"}
{"time":1700000010000,"user":"alice","kind":"login_failed"}
{"time":1700000020000,"user":"carol","kind":"password_reset"}
{"time":1700000200000,"user":"dave","kind":"login_failed"}
"#;
let json: Vec<serde_json::Value> = lines.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).unwrap()).collect();
// (user, value) records with their event times, for the text pattern ...
let as_values: Vec<((String, Value), u64, i64)> = json
    .iter()
    .map(|j| ((j["user"].as_str().unwrap().to_owned(), j.clone()), j["time"].as_u64().unwrap(), 1))
    .collect();
// ... and (user, kind) records for the builder.
let as_pairs: Vec<((String, String), u64, i64)> = json
    .iter()
    .map(|j| ((j["user"].as_str().unwrap().to_owned(), j["kind"].as_str().unwrap().to_owned()), j["time"].as_u64().unwrap(), 1))
    .collect();
println!("{} events", json.len());
'''),
("markdown", '''
## The pattern as text
'''),
("code", '''
let text = "
PATTERN (fail+ reset) WITHIN 60s
AFTER MATCH SKIP PAST LAST ROW
DEFINE fail  AS kind = 'login_failed',
       reset AS kind = 'password_reset'
";
let program = Arc::new(compile(text).expect("the pattern compiles"));
println!("steps: {:?}, within {:?} ms", program.step_names(), program.within());
'''),
("markdown", '''
`find_matches` runs a pattern over keyed records on one worker and returns the
matches (user, number of failures, time of the match) and the users whose
partial matches timed out.
'''),
("code", '''
fn find_matches<E: highwater::operators::key::Data + Sync>(
    records: Vec<((String, E), u64, i64)>,
    pattern: highwater::operators::cep::Pattern<(String, E)>,
) -> (Vec<(String, usize, u64)>, Vec<String>) {
    let found = Arc::new(Mutex::new((Vec::new(), Vec::new())));
    let into = Arc::clone(&found);
    timely::execute_directly(move |worker| {
        worker.dataflow::<u64, _, _>(|scope| {
            let out = EventStream::new(records.to_stream(scope))
                .match_pattern(|e: &(String, E)| e.0.clone(), pattern)
                .expect("a valid pattern");
            let (m, t) = (Arc::clone(&into), Arc::clone(&into));
            out.matches.inspect(move |(found, time, _)| {
                m.lock().unwrap().0.push((found.key.clone(), found.events("fail").len(), *time));
            });
            out.timeouts.inspect(move |(partial, _, _)| t.lock().unwrap().1.push(partial.key.clone()));
        });
    });
    let (mut found, mut timed_out) = std::mem::take(&mut *found.lock().unwrap());
    found.sort();
    timed_out.sort();
    (found, timed_out)
}
'''),
("code", '''
let from_text = find_matches(as_values, program.pattern_with(|e: &(String, Value)| &e.1));
println!("matches: {:?}", from_text.0);
println!("timed out: {:?}", from_text.1);
'''),
("markdown", '''
## The same pattern with the builder
'''),
("code", '''
use highwater::operators::cep::{AfterMatchSkip, Pattern};
let built = Pattern::<(String, String)>::begin("fail")
    .where_(|e| e.1 == "login_failed")
    .one_or_more()
    .greedy()
    .followed_by("reset")
    .where_(|e| e.1 == "password_reset")
    .within(60.secs())
    .skip(AfterMatchSkip::SkipPastLastEvent);
let from_builder = find_matches(as_pairs, built);
println!("matches: {:?}", from_builder.0);
println!("timed out: {:?}", from_builder.1);
'''),
("markdown", '''
## Check

Both forms find alice's burst of two failures (ending with her reset at
30 s) and time out bob's and dave's failures; carol has no match.
'''),
("code", '''
assert_eq!(from_text.0, vec![("alice".to_owned(), 2, 1_700_000_030_000)]);
assert_eq!(from_text.1, vec!["bob".to_owned(), "dave".to_owned()]);
assert_eq!(from_text, from_builder);
println!("cep: all checks passed");
'''),
])

for name, book in [("01_tour", tour), ("02_nexmark", nexmark), ("03_cep", cep)]:
    with open(os.path.join(out, name + ".ipynb"), "w") as f:
        json.dump(book, f, indent=1)
        f.write("\n")
