//! Pieces the benchmark harnesses share.

#![allow(dead_code)]

/// The median of some measurements (the upper one of an even count).
pub(crate) fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// A cheap, seedable pseudo-random sequence (xorshift64*).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    /// The next number.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// A field `name=value` of a `highwater` summary line.
pub(crate) fn field(summary: &str, name: &str) -> f64 {
    summary
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {summary:?}"))
}

/// Runs the release `highwater` binary on a Nexmark query (`--discard`, the
/// input given by `input`: `--input FILE` or `--events N`), with
/// `--source-only` if asked, on `workers` workers; returns (events/s, peak
/// RSS MiB) from its summary line.
pub(crate) fn run_query<S: AsRef<std::ffi::OsStr>>(
    query: &str,
    input: &[S],
    workers: usize,
    source_only: bool,
) -> (f64, f64) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_highwater"));
    cmd.args(["nexmark", "--query", query, "--discard"]).args(input);
    if source_only {
        cmd.arg("--source-only");
    }
    cmd.args(["--", "-w", &workers.to_string()]);
    let out = cmd.output().expect("running highwater");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{query}: {stderr}");
    let summary = stderr.lines().last().unwrap_or_default();
    (field(summary, "events/s"), field(summary, "peak_rss_mib"))
}
