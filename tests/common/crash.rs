//! Helpers of the crash tests: scratch directories, replayable kill times,
//! input files, and the committed and plain outputs of a query.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Runs this test binary again, as a child that runs only its ignored
/// test `child_job`, which reads what to do from the environment variable
/// `var` (set to `spec`); the child's log goes to `log`. The crash tests
/// kill such children with SIGKILL.
pub(crate) fn start_child_job(var: &str, spec: &str, log: &Path) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["child_job", "--exact", "--ignored", "--nocapture", "--test-threads", "1"])
        .env(var, spec)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_highwater");

/// Nexmark events as a JSON Lines file (the file source rewinds by byte offset).
pub(crate) fn events_file(dir: &Path, events: u64) -> PathBuf {
    let path = dir.join("events.jsonl");
    let out =
        Command::new(BIN).args(["generate", "--events", &events.to_string(), "--output"]).arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    path
}

/// The data rows of the part files committed to `output`, in the parts'
/// order. Every part is a `part-*.csv` that starts with the same header and
/// holds rows, and none is left pending.
pub(crate) fn committed_parts(output: &Path) -> String {
    let mut rows = String::new();
    let mut header: Option<String> = None;
    for part in part_files(output) {
        let text = std::fs::read_to_string(&part).unwrap();
        let (first, data) = text.split_once('\n').unwrap_or((&text, ""));
        match &header {
            None => header = Some(first.to_owned()),
            Some(h) => assert_eq!(h, first, "{} starts with a different header", part.display()),
        }
        assert!(!data.is_empty(), "{} holds no rows (empty parts are not written)", part.display());
        rows.push_str(data);
    }
    rows
}

/// The lines of the part files committed to `output` without a header
/// (`PartFormat::Rows`), in the parts' order; none is left pending.
pub(crate) fn committed_lines(output: &Path) -> Vec<String> {
    part_files(output)
        .iter()
        .flat_map(|p| std::fs::read_to_string(p).unwrap().lines().map(str::to_owned).collect::<Vec<_>>())
        .collect()
}

/// The `part-*.csv` files of `output` in order, after checking that
/// nothing else is there and none is left pending.
fn part_files(output: &Path) -> Vec<PathBuf> {
    let mut parts: Vec<PathBuf> = std::fs::read_dir(output)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "csv"))
        .collect();
    parts.sort();
    for part in &parts {
        let name = part.file_name().unwrap().to_string_lossy();
        assert!(name.starts_with("part-"), "unexpected file {} in the output directory", part.display());
    }
    let pending = std::fs::read_dir(output.join(".pending")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(pending, 0, "parts left pending after a completed run");
    parts
}

/// The query's rows without checkpoints (its plain CSV output, 2 workers),
/// sorted; `input` adds the source's arguments to the command.
pub(crate) fn plain_rows(query: &str, dir: &Path, input: impl FnOnce(&mut Command)) -> Vec<String> {
    let csv = dir.join(format!("{query}-plain.csv"));
    let mut cmd = Command::new(BIN);
    cmd.args(["nexmark", "-q", query]);
    input(&mut cmd);
    let out = cmd.arg("--output").arg(&csv).args(["--", "-w", "2"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut rows: Vec<String> = text.lines().skip(1).map(str::to_owned).collect();
    rows.sort();
    rows
}

/// A scratch directory, removed on drop.
pub(crate) struct Scratch(pub(crate) PathBuf);

impl Scratch {
    /// `$TMPDIR/highwater-{suite}-{name}-{pid}`, empty.
    pub(crate) fn new(suite: &str, name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("highwater-{suite}-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// xorshift64*: kill times that a seed replays.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A duration in `[lo, hi)` ms.
    pub(crate) fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo))
    }
}

/// The seed of the kill times: `HIGHWATER_CRASH_SEED`, or the clock (printed, to replay a run).
pub(crate) fn seed() -> u64 {
    let seed = std::env::var("HIGHWATER_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
    });
    eprintln!("HIGHWATER_CRASH_SEED={seed}");
    seed
}
