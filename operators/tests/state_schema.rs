//! Versioned operator state: a checkpoint taken by version 1 of an
//! operator's state is refused by version 2 without a migration, with an
//! error naming the operator and both versions, and restored through the
//! migration when version 2 has one.

use highwater_operators::checkpoint::memory::{check_recovery, recover_from, Input};
use highwater_operators::state::{KeyedContext, KeyedProcess, Schema, StateError};
use highwater_operators::Timestamp;

/// Version 1: a running count per key, emitted with every record.
struct CountV1;

impl KeyedProcess<u8, u8> for CountV1 {
    type State = u64;
    type Output = (u8, u64);
    const SCHEMA: Schema = Schema::new("test.count", 1);

    fn on_record(&self, ctx: &mut KeyedContext<'_, u8, u64, (u8, u64)>, k: u8, time: Timestamp, _diff: i64) {
        let n = ctx.state_or_insert_with(|| 0);
        *n += 1;
        let n = *n;
        ctx.emit((k, n), time, 1);
    }
}

/// Version 2: the count and the latest time; migrates from v1 when asked to.
struct CountV2;

impl KeyedProcess<u8, u8> for CountV2 {
    type State = (u64, Timestamp);
    type Output = (u8, u64);
    const SCHEMA: Schema = Schema::new("test.count", 2);
    const MIGRATES_FROM: &'static [u32] = &[1];

    fn on_record(&self, ctx: &mut KeyedContext<'_, u8, (u64, Timestamp), (u8, u64)>, k: u8, time: Timestamp, _: i64) {
        let (n, latest) = ctx.state_or_insert_with(|| (0, 0));
        *n += 1;
        *latest = (*latest).max(time);
        let n = *n;
        ctx.emit((k, n), time, 1);
    }

    fn migrate(version: u32, bytes: &[u8]) -> Result<(u64, Timestamp), StateError> {
        assert_eq!(version, 1);
        let n: u64 = highwater_operators::checkpoint::decode(bytes)
            .map_err(|e| StateError::Decode { schema: Schema::new("test.count", 1), reason: e.to_string() })?;
        Ok((n, 0))
    }
}

/// Its migrations switched off: as if `MIGRATES_FROM` were empty.
struct CountV2NoMigration;

impl KeyedProcess<u8, u8> for CountV2NoMigration {
    type State = (u64, Timestamp);
    type Output = (u8, u64);
    const SCHEMA: Schema = Schema::new("test.count", 2);

    fn on_record(&self, ctx: &mut KeyedContext<'_, u8, (u64, Timestamp), (u8, u64)>, k: u8, t: Timestamp, d: i64) {
        CountV2.on_record(ctx, k, t, d)
    }
}

fn input() -> Vec<Input<u8>> {
    (0..60u64).map(|i| ((i % 3) as u8, i * 10, 1, i * 10)).collect()
}

#[test]
fn version_2_refuses_a_version_1_checkpoint_without_a_migration() {
    let input = input();
    let run = check_recovery(&input, 300, 1, 1, |s| s.process_keyed("Count", |k: &u8| *k, CountV1));
    assert!(run.failures.is_empty(), "{:?}", run.failures);
    assert_eq!(run.recovered, run.expected);
    let (_, failures) =
        recover_from(&run.checkpoint, &input, 300, 2, |s| s.process_keyed("Count", |k: &u8| *k, CountV2NoMigration));
    // Refused on both workers (as the operator registers; restoring it fails too).
    assert!(failures.len() >= 2, "refused on both workers: {failures:?}");
    for message in &failures {
        assert!(message.starts_with("Count@"), "names the operator: {message}");
        assert!(message.contains("state schema test.count v1"), "names the checkpoint's version: {message}");
        assert!(message.contains("state schema test.count v2"), "names the program's version: {message}");
    }
}

#[test]
fn version_2_restores_a_version_1_checkpoint_through_its_migration() {
    let input = input();
    let run = check_recovery(&input, 300, 1, 1, |s| s.process_keyed("Count", |k: &u8| *k, CountV1));
    let (after, failures) =
        recover_from(&run.checkpoint, &input, 300, 2, |s| s.process_keyed("Count", |k: &u8| *k, CountV2));
    assert!(failures.is_empty(), "{failures:?}");
    // The counts go on from the checkpoint's: as the uninterrupted v1 run's.
    let expected: std::collections::BTreeMap<_, _> = run.expected.into_iter().filter(|((_, t), _)| *t >= 300).collect();
    assert!(!expected.is_empty());
    assert_eq!(after, expected);
}
