//! Two `highwater` processes (`-n 2 -p 0|1 -h hosts`) compute what one does.

use std::io::Write;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};

/// A port nobody listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn canonical(csv: &str) -> String {
    let mut lines = csv.lines();
    let header = lines.next().unwrap_or_default().to_owned();
    let mut rows: Vec<&str> = lines.collect();
    rows.sort();
    std::iter::once(header.as_str()).chain(rows).map(|l| format!("{l}\n")).collect()
}

fn two_processes(query: &str, input: &[&str]) {
    let dir = std::env::temp_dir().join(format!("highwater-cluster-{query}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hosts = dir.join("hosts.txt");
    let mut f = std::fs::File::create(&hosts).unwrap();
    writeln!(f, "127.0.0.1:{}\n127.0.0.1:{}", free_port(), free_port()).unwrap();
    let spawn = |process: &str| {
        Command::new(env!("CARGO_BIN_EXE_highwater"))
            .args(["nexmark", "--query", query])
            .args(input)
            .args(["--", "-w", "2", "-n", "2", "-p", process, "-h", hosts.to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (p0, p1) = (spawn("0"), spawn("1"));
    let (o0, o1) = (p0.wait_with_output().unwrap(), p1.wait_with_output().unwrap());
    assert!(o0.status.success(), "process 0: {}", String::from_utf8_lossy(&o0.stderr));
    assert!(o1.status.success(), "process 1: {}", String::from_utf8_lossy(&o1.stderr));
    // Worker 0 (in process 0) writes the output.
    assert!(o1.stdout.is_empty(), "process 1 writes nothing");
    let single =
        Command::new(env!("CARGO_BIN_EXE_highwater")).args(["nexmark", "--query", query]).args(input).output().unwrap();
    assert_eq!(
        canonical(&String::from_utf8(o0.stdout).unwrap()),
        canonical(&String::from_utf8(single.stdout).unwrap())
    );
    // Each process's summary line counts the whole job: the counters of
    // both processes, exchanged at the end, equal one process's alone.
    let counts = |stderr: &[u8]| -> Vec<String> {
        let text = String::from_utf8_lossy(stderr).into_owned();
        let line = text.lines().find(|l| l.starts_with("events=")).unwrap_or_else(|| panic!("no summary in {text}"));
        let keys = ["events", "late", "late_read", "dead_letters", "rows"];
        line.split(' ').filter(|kv| keys.iter().any(|k| kv.starts_with(&format!("{k}=")))).map(str::to_owned).collect()
    };
    let whole = counts(&single.stderr);
    assert_eq!(whole.len(), 5, "{whole:?}");
    assert_eq!(counts(&o0.stderr), whole, "process 0's summary");
    assert_eq!(counts(&o1.stderr), whole, "process 1's summary");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn q5_on_two_processes_of_two_workers() {
    let input = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/events-ooo.jsonl");
    two_processes("q5", &["--input", input.to_str().unwrap()]);
}

#[test]
fn q4_on_the_generator_across_processes() {
    two_processes("q4", &["--events", "200000", "--max-out-of-order", "1s"]);
}
