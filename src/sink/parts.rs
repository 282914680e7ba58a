//! Exactly-once output to a directory of committed CSV part files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use highwater_operators::checkpoint::CheckpointId;
use highwater_operators::time::watermark_of;
use highwater_operators::{EventStream, Timestamp, Update};
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::generic::Operator;

use super::SinkHandle;
use crate::checkpoint::{CheckpointError, Checkpoints, SinkCommitter, SinkPart, SinkSubmission};

/// Writes the lines of `stream` to `dir` with exactly-once effect: one part
/// file per checkpoint, `part-{id}.csv`, each starting with `header`.
///
/// At every checkpoint cut `T` the lines whose timely time is below `T` and
/// not yet written are set aside, sorted by (time, event time, line), and
/// written as a pending part before the checkpoint's manifest; the part is
/// renamed into `dir` once the manifest exists. A consumer listing `dir`
/// therefore never sees a partial part (a part appears whole, by a rename) and
/// never a duplicated line: after a crash, recovery re-commits the parts of the
/// checkpoint it restores (a no-op if done), removes pending parts and parts of
/// newer checkpoints, and the replay produces only lines at or after that
/// checkpoint's time. Read in name order, the parts' data lines are the
/// stream's lines ordered by time, whatever the checkpoint times were: the
/// same bytes for a run that crashed and recovered as for one that did not.
///
/// Lines go to worker 0, which writes the parts. In [`PartFormat::Rows`] a
/// retraction (negative diff) cannot be applied to appended output and is
/// counted in the handle's `unapplied_retractions`; an updating stream is
/// written as a [`PartFormat::Changelog`].
///
/// The sink commits with the job's checkpoints, which the timely computation
/// must be configured with ([`Checkpoints::configure`]); without them it
/// returns [`CheckpointError::NotConfigured`].
pub fn write_parts(
    stream: &EventStream<'_, String>,
    name: &str,
    dir: PathBuf,
    header: Option<String>,
    format: PartFormat,
) -> Result<SinkHandle, CheckpointError> {
    let handle = SinkHandle::default();
    let h = handle.clone();
    let worker = stream.scope().index();
    let Some(checkpoints) = Checkpoints::of(&stream.scope()) else {
        return Err(CheckpointError::NotConfigured {
            what: format!("the exactly-once sink {name}"),
            job: crate::job::in_job(stream.scope().worker().config()),
        });
    };
    let checkpoints = (worker == 0).then_some(checkpoints);
    if let Some(c) = checkpoints.as_ref() {
        c.register_sink(name, worker, Arc::new(PartFiles::new(dir.clone())))?;
    }
    let sink = name.to_owned();
    let mut buffer: BTreeMap<Timestamp, Vec<(Timestamp, String, i64)>> = BTreeMap::new();
    let mut done: Option<CheckpointId> = None;
    // After a recovery from a cut at `T`, what travels below `T` was committed
    // before (see `EventStream::as_collection`).
    let replayed_below = checkpoints.as_ref().and_then(|c| c.restored_time()).unwrap_or(0);
    stream.inner.clone().sink(Exchange::new(|_: &Update<String>| 0), name, move |(input, frontier)| {
        input.for_each_stamp(|at, data| {
            let time = *at.least().expect("highwater messages travel under a capability");
            if time < replayed_below {
                // Derived from a restored collection's replay: committed before the crash.
                data.for_each(Vec::clear);
                return;
            }
            let lines = buffer.entry(time).or_default();
            for batch in data {
                lines.extend(batch.drain(..).map(|(line, t, diff)| (t, line, diff)));
            }
        });
        let Some(c) = checkpoints.as_ref() else { return };
        let watermark = watermark_of(frontier);
        while let Some(cut) = c.cut_after(done).filter(|cut| cut.time <= watermark) {
            let later = buffer.split_off(&cut.time);
            let due = std::mem::replace(&mut buffer, later);
            let mut rows: Vec<(Timestamp, Timestamp, String, i64)> =
                due.into_iter().flat_map(|(at, lines)| lines.into_iter().map(move |(t, l, d)| (at, t, l, d))).collect();
            rows.sort_unstable();
            let mut bytes = Vec::new();
            if let Some(header) = header.as_ref() {
                bytes.extend_from_slice(header.as_bytes());
                if format == PartFormat::Changelog {
                    bytes.extend_from_slice(b",diff");
                }
                bytes.push(b'\n');
            }
            let mut count = 0u64;
            for (_, _, line, diff) in rows {
                match format {
                    PartFormat::Changelog => {
                        if diff != 0 {
                            bytes.extend_from_slice(format!("{line},{diff}\n").as_bytes());
                            count += 1;
                        }
                    }
                    PartFormat::Rows => {
                        if diff < 0 {
                            h.unapplied_retractions.add(diff.unsigned_abs());
                        }
                        for _ in 0..diff.max(0) {
                            bytes.extend_from_slice(line.as_bytes());
                            bytes.push(b'\n');
                            count += 1;
                        }
                    }
                }
            }
            h.lines.add(count);
            let part = (count > 0).then_some((bytes, count));
            c.submit_sink(0, cut, SinkSubmission { sink: sink.clone(), part });
            done = Some(cut.id);
        }
    });
    Ok(handle)
}

/// How [`write_parts`] writes a stream's lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartFormat {
    /// One line per inserted row: for append-only streams.
    Rows,
    /// Every change as the line with its diff as a last column (`diff`,
    /// `1` for an insertion, `-1` for a retraction): for updating streams.
    /// Summing the diffs per line over the parts, in name order or any
    /// other, gives the stream's table.
    Changelog,
}

/// Commits the part files of [`write_parts`]: pending in `dir/.pending`,
/// renamed into `dir`.
///
/// [`write_parts`] registers it; a program may also register it before its
/// workers start ([`Checkpoints::register_sink`] with the sink's name), e.g.
/// to commit the parts of a restored final checkpoint without running.
#[derive(Debug)]
pub struct PartFiles {
    dir: PathBuf,
}

impl PartFiles {
    /// The committer of part files in `dir`.
    pub fn new(dir: PathBuf) -> Self {
        PartFiles { dir }
    }
}

fn io(what: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError {
    let what = what.display().to_string();
    move |source| CheckpointError::Io { what, source }
}

/// The id of a committed part's file name (`part-{id}.csv`).
fn part_id(name: &str) -> Option<CheckpointId> {
    name.strip_prefix("part-").and_then(|n| n.strip_suffix(".csv")).and_then(|n| n.parse().ok())
}

impl SinkCommitter for PartFiles {
    fn prepare(&self, id: CheckpointId, part: Option<(&[u8], u64)>) -> Result<SinkPart, CheckpointError> {
        let committed = format!("part-{id:010}.csv");
        let mut out = SinkPart {
            sink: String::new(),
            kind: "files".to_owned(),
            target: self.dir.display().to_string(),
            pending: String::new(),
            committed,
            rows: 0,
        };
        if let Some((bytes, rows)) = part {
            let pending = format!(".pending/part-{id:010}.csv");
            let path = self.dir.join(&pending);
            std::fs::write(&path, bytes).map_err(io(&path))?;
            std::fs::File::open(&path).and_then(|f| f.sync_all()).map_err(io(&path))?;
            crate::checkpoint::store::sync_dir(&self.dir.join(".pending"))?;
            out.pending = pending;
            out.rows = rows;
        }
        Ok(out)
    }

    fn commit(&self, part: &SinkPart) -> Result<(), CheckpointError> {
        if part.pending.is_empty() {
            return Ok(());
        }
        let pending = self.dir.join(&part.pending);
        let committed = self.dir.join(&part.committed);
        match std::fs::rename(&pending, &committed) {
            Ok(()) => crate::checkpoint::store::sync_dir(&self.dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && committed.exists() => Ok(()),
            Err(e) => Err(CheckpointError::Io {
                what: format!("committing {} as {}", pending.display(), committed.display()),
                source: e,
            }),
        }
    }

    fn abort_after(&self, id: CheckpointId) -> Result<(), CheckpointError> {
        let pending = self.dir.join(".pending");
        std::fs::create_dir_all(&pending).map_err(io(&pending))?;
        for entry in std::fs::read_dir(&pending).map_err(io(&pending))?.flatten() {
            std::fs::remove_file(entry.path()).map_err(io(&entry.path()))?;
        }
        for entry in std::fs::read_dir(&self.dir).map_err(io(&self.dir))?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if part_id(&name).is_some_and(|part| part > id) {
                tracing::warn!(part = %name, "removing a part of a checkpoint newer than the one recovered");
                std::fs::remove_file(entry.path()).map_err(io(&entry.path()))?;
            }
        }
        Ok(())
    }
}
