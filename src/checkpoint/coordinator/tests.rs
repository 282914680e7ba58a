//! The state machine's transitions, without threads or sockets: each test
//! drives a [`State`] through events and looks at its phase and effects.

use crate::operators::checkpoint::Cut;
use crate::operators::END_OF_TIME;

use super::super::cluster::{Message, ProcessPart};
use super::super::CheckpointError;
use super::phase::{CutPhase, Effect, Job, Layout, Phase, Share, State};

/// A process of `workers` workers, one operator and one source on each.
fn process(workers: usize, processes: usize, leads: bool) -> State {
    let mut state = State::new(Layout { workers, processes, leads }, 1, 0);
    for worker in 0..workers {
        state.job.registry.operators.insert((worker, "count".into()));
        state.job.registry.sources.insert(("input".into(), worker));
    }
    state
}

/// The effects queued so far (taken).
fn effects(state: &mut State) -> Vec<Effect> {
    std::mem::take(&mut state.job.effects)
}

/// The messages among `effects` that go to the other processes.
fn sent(effects: &[Effect]) -> Vec<&Message> {
    effects.iter().filter_map(|e| if let Effect::Send(m) = e { Some(m) } else { None }).collect()
}

fn step(
    state: &mut State,
    transition: impl FnOnce(Phase, &mut Job) -> Result<Phase, CheckpointError>,
) -> Result<(), CheckpointError> {
    state.apply(transition)
}

fn build(state: &mut State) {
    for worker in 0..state.job.layout.workers {
        step(state, |p, j| p.worker_built(worker, j)).unwrap();
    }
}

/// Every operator's and source's share of cut `id`.
fn hand_in_all(state: &mut State, id: u64) {
    for worker in 0..state.job.layout.workers {
        let operator = Share::Operator { worker, operator: "count".into(), entries: Vec::new(), files: None };
        step(state, |p, j| p.hand_in(id, operator, j)).unwrap();
        let source = Share::Source { source: "input".into(), partitions: Vec::new() };
        step(state, |p, j| p.hand_in(id, source, j)).unwrap();
    }
}

fn cut_phase(state: &State, id: u64) -> Option<&CutPhase> {
    state.phase.cuts()?.cuts.get(&id)
}

fn protocol(result: Result<(), CheckpointError>) -> String {
    match result {
        Err(e @ CheckpointError::Protocol { .. }) => e.to_string(),
        other => panic!("expected a protocol error, got {other:?}"),
    }
}

#[test]
fn a_process_alone_goes_from_building_to_finished() {
    let mut state = process(2, 1, true);
    step(&mut state, |p, j| p.worker_built(0, j)).unwrap();
    assert!(matches!(state.phase, Phase::Building { .. }));
    assert!(!state.may_begin());
    step(&mut state, |p, j| p.worker_built(1, j)).unwrap();
    assert!(matches!(state.phase, Phase::Running(_)));
    assert!(state.may_begin());

    state.job.published = 41;
    step(&mut state, |p, j| p.next_cut(std::time::Instant::now(), j)).unwrap();
    assert!(matches!(cut_phase(&state, 1), Some(CutPhase::Collecting(c)) if c.cut == Cut { id: 1, time: 42 }));
    assert_eq!(state.phase.collecting_after(None), Some(Cut { id: 1, time: 42 }));
    assert!(!state.may_begin(), "one cut at a time");
    let begun = effects(&mut state);
    assert!(matches!(begun[0], Effect::Begun(Cut { id: 1, .. })));
    assert!(begun.iter().any(|e| matches!(e, Effect::Wake)));

    hand_in_all(&mut state, 1);
    assert!(matches!(cut_phase(&state, 1), Some(CutPhase::Writing(_))));
    assert_eq!(state.phase.collecting_after(None), None);
    let collected = effects(&mut state);
    assert!(matches!(&collected[..], [Effect::Collected(c)] if c.operators.len() == 2 && c.source_parts == 2));
    assert_eq!(state.phase.in_flight(), 1);

    step(&mut state, |p, j| p.written(1, false, j)).unwrap();
    assert!(matches!(state.phase, Phase::Running(_)));
    assert_eq!(state.job.written, [1]);

    state.job.registry.finished.insert(("input".into(), 0));
    step(&mut state, Phase::source_finished).unwrap();
    assert!(matches!(state.phase, Phase::Running(_)));
    state.job.registry.finished.insert(("input".into(), 1));
    step(&mut state, Phase::source_finished).unwrap();
    // Alone, the final cut begins as soon as the sources have ended.
    assert!(matches!(state.phase, Phase::Final(_)));
    assert!(state.phase.final_begun());
    assert!(matches!(cut_phase(&state, 2), Some(CutPhase::Collecting(c)) if c.cut.time == END_OF_TIME));

    hand_in_all(&mut state, 2);
    step(&mut state, |p, j| p.written(2, true, j)).unwrap();
    assert!(matches!(state.phase, Phase::Finished));
    assert_eq!(state.job.written, [1, 2]);
}

#[test]
fn sources_that_end_while_building_drain_once_built() {
    let mut state = process(1, 1, true);
    state.job.registry.finished.insert(("input".into(), 0));
    step(&mut state, Phase::source_finished).unwrap();
    assert!(matches!(state.phase, Phase::Building { .. }));
    build(&mut state);
    assert!(matches!(state.phase, Phase::Final(_)));
}

#[test]
fn a_job_without_sources_takes_no_checkpoint() {
    let mut state = State::new(Layout { workers: 1, processes: 1, leads: true }, 1, 0);
    build(&mut state);
    assert!(matches!(state.phase, Phase::Draining(_)));
    assert!(!state.may_begin());
}

#[test]
fn reports_that_do_not_fit_fail_the_checkpointing() {
    let mut state = process(1, 1, true);
    let share = Share::Source { source: "input".into(), partitions: Vec::new() };
    let error = protocol(step(&mut state, |p, j| p.hand_in(1, share, j)));
    assert!(error.contains("source input handed in its share of checkpoint 1"), "{error}");
    assert!(error.contains("building their dataflows"), "{error}");
    assert!(state.phase.is_failed());
    // The failure is told to the other processes, and everyone is woken.
    let failed = effects(&mut state);
    assert!(matches!(&failed[..], [Effect::Inform(Message::Failed { .. }), Effect::Wake]));

    let mut state = state_running(1);
    let error = protocol(step(&mut state, |p, j| p.worker_built(0, j)));
    assert!(error.contains("worker 0 built its dataflow"), "{error}");

    let mut state = state_running(1);
    step(&mut state, |p, j| p.next_cut(std::time::Instant::now(), j)).unwrap();
    let error = protocol(step(&mut state, |p, j| p.written(1, false, j)));
    assert!(error.contains("checkpoint 1 (time 1) is being collected"), "{error}");

    let mut state = state_running(1);
    let share = Share::Source { source: "input".into(), partitions: Vec::new() };
    let error = protocol(step(&mut state, |p, j| p.hand_in(7, share, j)));
    assert!(error.contains("checkpoint 7 is not begun (the next is 1)"), "{error}");
}

fn state_running(workers: usize) -> State {
    let mut state = process(workers, 1, true);
    build(&mut state);
    effects(&mut state);
    state
}

#[test]
fn the_first_failure_stays_and_later_events_are_ignored() {
    let mut state = state_running(1);
    state.fail("first".into());
    state.fail("second".into());
    assert_eq!(state.phase.error(), Some("first"));
    let told = effects(&mut state);
    assert_eq!(told.iter().filter(|e| matches!(e, Effect::Inform(Message::Failed { .. }))).count(), 1);
    // A share of an abandoned cut is no error.
    let share = Share::Source { source: "input".into(), partitions: Vec::new() };
    step(&mut state, |p, j| p.hand_in(1, share, j)).unwrap();
    step(&mut state, |p, j| p.receive(1, Message::SourcesFinished, j)).unwrap();
    assert_eq!(state.phase.error(), Some("first"));
    assert!(state.phase.final_begun());
    assert!(!state.frozen());
}

#[test]
fn the_coordinator_prepares_a_cut_above_every_processs_answer() {
    let mut state = process(1, 3, true);
    build(&mut state);
    // Until every process's workers are built, the coordinator's phase is building.
    assert!(matches!(state.phase, Phase::Building { .. }));
    step(&mut state, |p, j| p.receive(1, Message::Built, j)).unwrap();
    step(&mut state, |p, j| p.receive(2, Message::Built, j)).unwrap();
    assert!(matches!(state.phase, Phase::Running(_)));
    assert!(sent(&effects(&mut state)).is_empty());

    state.job.published = 15;
    step(&mut state, |p, j| p.next_cut(std::time::Instant::now(), j)).unwrap();
    assert!(matches!(sent(&effects(&mut state))[..], [Message::Prepare { id: 1 }]));
    assert!(state.frozen());
    assert_eq!(state.phase.preparing().map(|(id, _)| id), Some(1));
    assert_eq!(state.phase.in_flight(), 0);

    step(&mut state, |p, j| p.receive(1, Message::Prepared { id: 1, max_published: 20 }, j)).unwrap();
    assert!(state.frozen());
    step(&mut state, |p, j| p.receive(2, Message::Prepared { id: 1, max_published: 10 }, j)).unwrap();
    assert!(!state.frozen());
    let announced = effects(&mut state);
    assert!(matches!(sent(&announced)[..], [Message::Announce { cut: Cut { id: 1, time: 21 } }]));
    assert!(matches!(cut_phase(&state, 1), Some(CutPhase::Collecting(_))));
    assert_eq!(state.job.published, 20);

    // Another process's part goes to the writer while the cut is in flight.
    let part = Message::ProcessDone { id: 1, part: ProcessPart::default() };
    step(&mut state, |p, j| p.receive(2, part, j)).unwrap();
    assert!(matches!(&effects(&mut state)[..], [Effect::Part { process: 2, id: 1, .. }]));
}

#[test]
fn the_final_cut_takes_the_place_of_the_one_being_prepared() {
    let mut state = process(1, 2, true);
    build(&mut state);
    step(&mut state, |p, j| p.receive(1, Message::Built, j)).unwrap();
    step(&mut state, |p, j| p.next_cut(std::time::Instant::now(), j)).unwrap();
    assert!(matches!(sent(&effects(&mut state))[..], [Message::Prepare { id: 1 }]));
    state.job.registry.finished.insert(("input".into(), 0));
    step(&mut state, Phase::source_finished).unwrap();
    assert!(matches!(state.phase, Phase::Draining(_)));
    step(&mut state, |p, j| p.receive(1, Message::SourcesFinished, j)).unwrap();
    assert!(matches!(state.phase, Phase::Final(_)));
    assert!(matches!(cut_phase(&state, 1), Some(CutPhase::Collecting(c)) if c.cut.is_final()));
    assert!(!state.frozen());
    let last = Cut { id: 1, time: END_OF_TIME };
    assert!(matches!(sent(&effects(&mut state))[..], [Message::Announce { cut }] if *cut == last));
    // The answer to the prepare is late: it changes nothing.
    step(&mut state, |p, j| p.receive(1, Message::Prepared { id: 1, max_published: 5 }, j)).unwrap();
    assert!(matches!(state.phase, Phase::Final(_)));
    assert!(effects(&mut state).is_empty());
}

#[test]
fn a_follower_answers_and_holds_its_sources_until_the_cut_is_announced() {
    let mut state = process(1, 2, false);
    build(&mut state);
    assert!(matches!(state.phase, Phase::Running(_)));
    assert!(matches!(sent(&effects(&mut state))[..], [Message::Built]));

    state.job.published = 7;
    step(&mut state, |p, j| p.receive(0, Message::Prepare { id: 1 }, j)).unwrap();
    assert!(matches!(sent(&effects(&mut state))[..], [Message::Prepared { id: 1, max_published: 7 }]));
    assert!(state.frozen());
    step(&mut state, |p, j| p.receive(0, Message::Announce { cut: Cut { id: 1, time: 30 } }, j)).unwrap();
    assert!(!state.frozen());
    assert_eq!(state.job.published, 29);
    hand_in_all(&mut state, 1);
    step(&mut state, |p, j| p.receive(0, Message::Written { id: 1, is_final: false }, j)).unwrap();
    assert_eq!(state.job.written, [1]);

    state.job.registry.finished.insert(("input".into(), 0));
    step(&mut state, Phase::source_finished).unwrap();
    assert!(matches!(sent(&effects(&mut state))[..], [Message::SourcesFinished]));
    // A follower waits for the coordinator's final cut.
    assert!(matches!(state.phase, Phase::Draining(_)));
    let last = Cut { id: 2, time: END_OF_TIME };
    step(&mut state, |p, j| p.receive(0, Message::Announce { cut: last }, j)).unwrap();
    hand_in_all(&mut state, 2);
    step(&mut state, |p, j| p.receive(0, Message::Written { id: 2, is_final: true }, j)).unwrap();
    assert!(matches!(state.phase, Phase::Finished));
}

#[test]
fn messages_out_of_turn_fail_the_checkpointing() {
    // A cut announced to a follower still building.
    let mut state = process(1, 2, false);
    let announce = Message::Announce { cut: Cut { id: 1, time: 5 } };
    let error = protocol(step(&mut state, |p, j| p.receive(0, announce, j)));
    assert!(error.contains("checkpoint 1 (time 5) begun, but the workers are building"), "{error}");
    assert!(state.phase.is_failed());

    // A cut announced out of order.
    let mut state = process(1, 2, false);
    build(&mut state);
    let announce = Message::Announce { cut: Cut { id: 3, time: 5 } };
    let error = protocol(step(&mut state, |p, j| p.receive(0, announce, j)));
    assert!(error.contains("the next checkpoint is 1"), "{error}");

    // The final cut announced to a follower whose sources have not ended.
    let mut state = process(1, 2, false);
    build(&mut state);
    let announce = Message::Announce { cut: Cut { id: 1, time: END_OF_TIME } };
    let error = protocol(step(&mut state, |p, j| p.receive(0, announce, j)));
    assert!(error.contains("the final checkpoint 1 begun, but checkpoints are being taken"), "{error}");

    // What only the coordinator sends, sent to it.
    let mut state = process(1, 2, true);
    let error = protocol(step(&mut state, |p, j| p.receive(1, Message::Prepare { id: 1 }, j)));
    assert!(error.contains("process 1 sent a prepare of checkpoint 1, but this process coordinates"), "{error}");

    // What only followers send, sent to a follower.
    let mut state = process(1, 2, false);
    let error = protocol(step(&mut state, |p, j| p.receive(0, Message::Built, j)));
    assert!(error.contains("but this process follows process 0"), "{error}");

    // A greeting after the start.
    let mut state = process(1, 2, true);
    let hello = Message::Hello { process: 1, workers: 1 };
    let error = protocol(step(&mut state, |p, j| p.receive(1, hello, j)));
    assert!(error.contains("process 1 sent a hello"), "{error}");

    // Twice the same report.
    let mut state = process(1, 3, true);
    step(&mut state, |p, j| p.receive(1, Message::Built, j)).unwrap();
    let error = protocol(step(&mut state, |p, j| p.receive(1, Message::Built, j)));
    assert!(error.contains("process 1 had reported it already"), "{error}");

    // An answer to a prepare never sent.
    let mut state = process(1, 2, true);
    build(&mut state);
    step(&mut state, |p, j| p.receive(1, Message::Built, j)).unwrap();
    let answer = Message::Prepared { id: 1, max_published: 3 };
    let error = protocol(step(&mut state, |p, j| p.receive(1, answer, j)));
    assert!(error.contains("checkpoint 1 is not begun"), "{error}");

    // A part of a checkpoint not in flight.
    let mut state = process(1, 2, true);
    build(&mut state);
    step(&mut state, |p, j| p.receive(1, Message::Built, j)).unwrap();
    let part = Message::ProcessDone { id: 4, part: ProcessPart::default() };
    let error = protocol(step(&mut state, |p, j| p.receive(1, part, j)));
    assert!(error.contains("process 1 reported its part of checkpoint 4 written"), "{error}");
    // The failure names the message, and is told to the other processes.
    let told = effects(&mut state);
    assert!(told
        .iter()
        .any(|e| matches!(e, Effect::Inform(Message::Failed { error }) if error.contains("checkpoint 4"))));
}

#[test]
fn a_failure_from_another_process_fails_this_one() {
    let mut state = process(1, 2, false);
    build(&mut state);
    step(&mut state, |p, j| p.receive(0, Message::Failed { error: "disk full".into() }, j)).unwrap();
    assert_eq!(state.phase.error(), Some("process 0: disk full"));
}

#[test]
fn alone_no_cut_is_begun_until_a_source_publishes_at_or_above_the_last_one() {
    let mut state = state_running(1);
    state.job.published = 41;
    step(&mut state, |p, j| p.next_cut(std::time::Instant::now(), j)).unwrap();
    assert!(matches!(cut_phase(&state, 1), Some(CutPhase::Collecting(c)) if c.cut.time == 42));
    hand_in_all(&mut state, 1);
    step(&mut state, |p, j| p.written(1, false, j)).unwrap();
    effects(&mut state);
    // The sources rest (an idle one moved up to the cut without publishing):
    // a cut at 42 again would be none, one at 43 would move them up for nothing.
    step(&mut state, |p, j| p.next_cut(std::time::Instant::now(), j)).unwrap();
    assert_eq!(cut_phase(&state, 2).map(|_| ()), None);
    assert!(state.may_begin());
    assert!(effects(&mut state).is_empty());
    // A record sent at the cut's time: the next cut lies above it.
    state.job.published = 42;
    step(&mut state, |p, j| p.next_cut(std::time::Instant::now(), j)).unwrap();
    assert!(matches!(cut_phase(&state, 2), Some(CutPhase::Collecting(c)) if c.cut.time == 43));
}

#[test]
fn across_processes_a_prepare_that_finds_nothing_new_is_skipped_and_the_followers_publish_again() {
    let mut state = process(1, 2, true);
    build(&mut state);
    step(&mut state, |p, j| p.receive(1, Message::Built, j)).unwrap();
    state.job.published = 9;
    step(&mut state, |p, j| p.next_cut(std::time::Instant::now(), j)).unwrap();
    step(&mut state, |p, j| p.receive(1, Message::Prepared { id: 1, max_published: 4 }, j)).unwrap();
    hand_in_all(&mut state, 1);
    step(&mut state, |p, j| p.written(1, false, j)).unwrap();
    effects(&mut state);

    step(&mut state, |p, j| p.next_cut(std::time::Instant::now(), j)).unwrap();
    assert!(matches!(sent(&effects(&mut state))[..], [Message::Prepare { id: 2 }]));
    step(&mut state, |p, j| p.receive(1, Message::Prepared { id: 2, max_published: 9 }, j)).unwrap();
    let skipped = effects(&mut state);
    assert!(matches!(sent(&skipped)[..], [Message::Skip { id: 2 }]));
    assert!(skipped.iter().any(|e| matches!(e, Effect::Wake)));
    assert!(!state.frozen());
    assert!(state.may_begin());
    // The next prepare is of the same checkpoint; this time a follower sent.
    step(&mut state, |p, j| p.next_cut(std::time::Instant::now(), j)).unwrap();
    assert!(matches!(sent(&effects(&mut state))[..], [Message::Prepare { id: 2 }]));
    step(&mut state, |p, j| p.receive(1, Message::Prepared { id: 2, max_published: 10 }, j)).unwrap();
    assert!(matches!(sent(&effects(&mut state))[..], [Message::Announce { cut: Cut { id: 2, time: 11 } }]));

    // A follower: the skip lets its sources publish again.
    let mut follower = process(1, 2, false);
    build(&mut follower);
    step(&mut follower, |p, j| p.receive(0, Message::Prepare { id: 1 }, j)).unwrap();
    assert!(follower.frozen());
    step(&mut follower, |p, j| p.receive(0, Message::Skip { id: 1 }, j)).unwrap();
    assert!(!follower.frozen());
    step(&mut follower, |p, j| p.receive(0, Message::Prepare { id: 1 }, j)).unwrap();
    step(&mut follower, |p, j| p.receive(0, Message::Announce { cut: Cut { id: 1, time: 5 } }, j)).unwrap();
    // A skip of a cut begun is out of turn.
    let error = protocol(step(&mut follower, |p, j| p.receive(0, Message::Skip { id: 1 }, j)));
    assert!(error.contains("process 0 skipped checkpoint 1"), "{error}");
}
