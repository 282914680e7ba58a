//! The single-concept examples, run as the README says and checked against
//! what each computes directly from its input: a custom source, a custom
//! sink, allowed lateness with corrections (on 1 and 3 workers), and a job
//! on two real processes. (`examples/checkpointed_job.rs` runs in
//! `tests/checkpoint_setup.rs`, `examples/dedup.rs` in
//! `tests/example_dedup.rs`.)

#[path = "../examples/custom_source.rs"]
#[allow(dead_code, unreachable_pub)]
mod custom_source;

#[path = "../examples/custom_sink.rs"]
#[allow(dead_code, unreachable_pub)]
mod custom_sink;

#[path = "../examples/late_corrections.rs"]
#[allow(dead_code, unreachable_pub)]
mod late_corrections;

#[path = "../examples/several_processes.rs"]
#[allow(dead_code, unreachable_pub)]
mod several_processes;

#[path = "common/crash.rs"]
mod crash;

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_custom_source_gives_the_maxima_and_dead_letters_of_its_lines() {
    let logs = custom_source::logs(6, 2_000);
    let expected = custom_source::expected(&logs);
    assert!(!expected.dead.is_empty());
    for workers in ["1", "3"] {
        let found = custom_source::run(logs.clone(), &args(&["-w", workers])).unwrap();
        assert_eq!(found, expected, "-w {workers}");
    }
}

#[test]
fn a_custom_sink_materializes_the_table_as_of_the_watermark() {
    let dir = crash::Scratch::new("examples", "custom-sink");
    let path = dir.0.join("view.csv");
    let refreshes = custom_sink::run(&path, &args(&["-w", "2"])).unwrap();
    assert_eq!(custom_sink::view_rows(&path).unwrap(), custom_sink::expected());
    assert!(refreshes > 1, "refreshed {refreshes} times");
}

#[test]
fn late_records_correct_their_windows_or_go_to_the_late_output() {
    let (late, sums) = late_corrections::model(&late_corrections::taps());
    assert!(!late.is_empty());
    for workers in ["1", "3"] {
        let outcome = late_corrections::run(&args(&["-w", workers]), false).unwrap();
        assert_eq!(outcome.late, late, "-w {workers}: late taps");
        assert_eq!(outcome.sums(), sums, "-w {workers}: the changelog applied");
    }
}

/// Set in the processes [`a_job_on_two_processes_counts_every_word_once`]
/// starts: this test binary, running [`one_process_of_the_job`] only.
const PROCESS: &str = "HIGHWATER_TEST_EXAMPLE_PROCESS";

/// One process of the job, when this test binary is started as one: the
/// example's `run` with the arguments in the variable, one per line.
#[test]
fn one_process_of_the_job() {
    let Ok(args) = std::env::var(PROCESS) else { return };
    let args: Vec<String> = args.lines().map(str::to_owned).collect();
    let (out, timely_args) = args.split_first().expect("the output directory and timely's arguments");
    several_processes::run(std::path::Path::new(out), timely_args).unwrap();
}

#[test]
fn a_job_on_two_processes_counts_every_word_once() {
    let dir = crash::Scratch::new("examples", "several-processes");
    let out = dir.0.join("out");
    let exe = std::env::current_exe().unwrap();
    let program = |args: Vec<String>| {
        let mut command = std::process::Command::new(&exe);
        command.args(["--exact", "one_process_of_the_job", "--nocapture"]).env(PROCESS, args.join("\n"));
        command
    };
    several_processes::launch(program, &out, 2, 2).unwrap();
    let rows = several_processes::written(&out).unwrap();
    assert_eq!(rows, several_processes::expected());
    // Every worker of both processes computed some of them.
    let files = std::fs::read_dir(&out).unwrap().count();
    assert_eq!(files, 4);
}

#[path = "../examples/sessionize.rs"]
#[allow(dead_code, unreachable_pub)]
mod sessionize;

#[test]
fn sessionize_prints_the_sessions_it_documents() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/data/clicks.jsonl");
    for workers in ["1", "2"] {
        let lines = sessionize::run(path, &args(&["-w", workers])).unwrap();
        // The dead letters name the file as given: the example's relative path.
        let lines: Vec<String> =
            lines.into_iter().map(|l| l.replace(concat!(env!("CARGO_MANIFEST_DIR"), "/"), "")).collect();
        assert_eq!(sessionize::consolidated(&lines), sessionize::EXPECTED, "-w {workers}");
    }
}

#[path = "../examples/enrich_clicks.rs"]
#[allow(dead_code, unreachable_pub)]
mod enrich_clicks;

#[test]
fn enrich_clicks_attributes_and_enriches_the_clicks_it_documents() {
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/data/");
    let file = |name: &str| format!("{data}{name}");
    for workers in ["1", "2"] {
        let mut lines = enrich_clicks::run(
            &file("impressions.jsonl"),
            &file("ad_clicks.jsonl"),
            &file("profiles.jsonl"),
            &args(&["-w", workers]),
        )
        .unwrap();
        lines.sort();
        assert_eq!(lines, enrich_clicks::EXPECTED, "-w {workers}");
    }
}
