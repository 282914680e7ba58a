//! State time-to-live on unbounded input (issue 35): q20, the unwindowed
//! join of every bid with its auction, on the Nexmark generator without an
//! end at `-w 2` with `--state-ttl`: its memory stays flat in memory, and on
//! the RocksDB backend the state on disk stops growing. Without the TTL the
//! same job grows by gigabytes a minute.
//!
//! The jobs run as child processes of the `highwater` binary; RSS is read
//! from `/proc`, the state directory's size from the file system.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

/// One job at a time: they measure memory and disk on a shared machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn start(dir: &Path, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_highwater"))
        .args(["nexmark", "--query", "q20", "--events", "100000000000", "--discard", "--state-ttl", "10s"])
        .args(extra)
        .args(["--", "-w", "2"])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn rss_mib(child: &Child) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() / 1024
}

/// The bytes of the files under `dir`.
fn size_of(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => size_of(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

fn stop(mut child: Child) {
    assert!(child.try_wait().unwrap().is_none(), "the job ended by itself");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn q20_with_a_ttl_keeps_flat_memory_on_an_unbounded_generator() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("highwater-ttl-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let child = start(&dir, &[]);
    std::thread::sleep(Duration::from_secs(10));
    let early = rss_mib(&child);
    let mut samples = vec![early];
    for _ in 0..5 {
        std::thread::sleep(Duration::from_secs(10));
        samples.push(rss_mib(&child));
    }
    stop(child);
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("RSS every 10 s from 10 s on, MiB: {samples:?}");
    let late = *samples.last().unwrap();
    assert!(late as f64 <= early as f64 * 1.25, "RSS {early} MiB after 10 s, {late} MiB after 60 s: {samples:?}");
}

#[test]
fn q20_with_a_ttl_on_rocksdb_stops_growing_on_disk() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("highwater-ttl-rocksdb-{}", std::process::id()));
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let child =
        start(&dir, &["--state-backend", "rocksdb", "--state-dir", state.to_str().unwrap(), "--state-cache", "64MiB"]);
    // One sample a second from 10 s to 60 s: compactions (which drop what
    // expired) make the size go up and down by a factor of two within
    // seconds, so the windows compare their peaks, each seen at many points.
    std::thread::sleep(Duration::from_secs(10));
    let mut disk = Vec::new();
    let mut rss = Vec::new();
    for second in 0..=50 {
        if second > 0 {
            std::thread::sleep(Duration::from_secs(1));
        }
        disk.push(size_of(&state) >> 20);
        if second % 10 == 0 {
            rss.push(rss_mib(&child));
        }
    }
    stop(child);
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("state on disk every second from 10 s on, MiB: {disk:?}; RSS every 10 s: {rss:?}");
    // The state fills its time-to-live in the first seconds; from then on
    // its peak stays where it was: the largest size from 40 s to 60 s
    // against the largest from 10 s to 30 s. Without the TTL it grows by
    // hundreds of MiB every 10 s.
    let first = disk[..=20].iter().max().copied().unwrap();
    let last = disk[30..].iter().max().copied().unwrap();
    assert!(first > 0, "the state is on disk: {disk:?}");
    assert!(last as f64 <= first as f64 * 1.5, "the state on disk grows: {disk:?} MiB");
    assert!(*rss.last().unwrap() as f64 <= rss[0] as f64 * 1.25 + 64.0, "RSS grows: {rss:?} MiB");
}
