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

use std::path::PathBuf;

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

/// The example binary, built next to this test's (`cargo test` builds the
/// examples before it runs the tests).
fn example_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let path = dir.join("examples").join(name);
    assert!(path.exists(), "{} is missing: run with `cargo test --examples --tests`", path.display());
    path
}

#[test]
fn a_job_on_two_processes_counts_every_word_once() {
    let dir = crash::Scratch::new("examples", "several-processes");
    let out = dir.0.join("out");
    several_processes::launch(&example_binary("several_processes"), &out, 2, 2).unwrap();
    let rows = several_processes::written(&out).unwrap();
    assert_eq!(rows, several_processes::expected());
    // Every worker of both processes computed some of them.
    let files = std::fs::read_dir(&out).unwrap().count();
    assert_eq!(files, 4);
}
