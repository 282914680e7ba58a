//! Checkpoints in S3-compatible object storage, against a real server: a
//! throwaway `moto_server` (PyPI `moto[server]`) per test on a free loopback
//! port. The store's operations round-trip (shards of one part and of
//! several, manifests, listing, deletion) and damaged or missing shard files
//! are reported as corrupt, naming the key. And `highwater nexmark`,
//! checkpointing into S3, killed five times (three SIGKILLs from outside at
//! times that depend on the run's progress, two from inside at the store's
//! kill points: a shard half uploaded, a checkpoint without its manifest)
//! and recovered each time, writes exactly the rows of an uninterrupted run
//! with local checkpoints. The job is 20 M events (several seconds of work)
//! so that it is still running at every kill.
//!
//! And an S3 store that starts refusing writes (a proxy in front of moto
//! answers `403 AccessDenied` to every write, as after revoked credentials)
//! fails the job at once, without a final checkpoint or sink commit; with
//! writes allowed again, a recovery resumes from the last good checkpoint to
//! the rows of an uninterrupted run.
//!
//! `moto_server` must be on `PATH` (`pip install 'moto[server]'`): without
//! it these tests fail, they do not skip.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use highwater::checkpoint::s3::S3Store;
use highwater::checkpoint::{CheckpointError, CheckpointStore, FileInfo};

/// The tests run one at a time: the store API test sets the AWS variables in
/// this process's environment, which must not race with another test.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("highwater-s3-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `moto_server`, killed on drop.
struct Moto {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Moto {
    /// Starts a server on a free loopback port and waits until it answers.
    fn start(dir: &Path) -> Moto {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = dir.join("moto.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start moto_server ({e}): the S3 checkpoint tests need it on PATH \
                     (install it with `pip install 'moto[server]'`)"
                )
            });
        let mut moto = Moto { child, port, log };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = moto.child.try_wait().unwrap() {
                panic!("moto_server exited ({status}) before answering: {}", moto.log());
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() && moto.http("GET", "/").0 == 200 {
                return moto;
            }
            assert!(Instant::now() < deadline, "moto_server did not answer within 60 s: {}", moto.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A plain (unsigned) HTTP request; moto does not check signatures.
    /// Returns the status and the body; status 0 if the server is not there.
    fn http(&self, method: &str, path: &str) -> (u16, String) {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else { return (0, String::new()) };
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        );
        if stream.write_all(request.as_bytes()).is_err() {
            return (0, String::new());
        }
        let mut response = Vec::new();
        if stream.read_to_end(&mut response).is_err() {
            return (0, String::new());
        }
        let response = String::from_utf8_lossy(&response).into_owned();
        let status = response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let body = response.split_once("\r\n\r\n").map_or(String::new(), |(_, b)| b.to_owned());
        (status, body)
    }

    /// Points this process's environment at the server: `S3Store::open`
    /// reads its configuration from there.
    fn configure_this_process(&self) {
        for (key, value) in self.env() {
            std::env::set_var(key, value);
        }
        for key in ["AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"] {
            std::env::remove_var(key);
        }
    }

    /// Creates a bucket (object_store cannot).
    fn create_bucket(&self, bucket: &str) {
        let (status, body) = self.http("PUT", &format!("/{bucket}"));
        assert_eq!(status, 200, "creating bucket {bucket}: {body}");
    }

    /// The keys under `prefix` in `bucket` (one page: up to 1000).
    fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let (status, body) = self.http("GET", &format!("/{bucket}?list-type=2&prefix={prefix}"));
        assert_eq!(status, 200, "listing {bucket}/{prefix}: {body}");
        body.split("<Key>").skip(1).filter_map(|s| s.split_once("</Key>")).map(|(k, _)| k.to_owned()).collect()
    }

    /// The environment that points the AWS client at this server.
    fn env(&self) -> [(&'static str, String); 4] {
        [
            ("AWS_ACCESS_KEY_ID", "testing".into()),
            ("AWS_SECRET_ACCESS_KEY", "testing".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ENDPOINT_URL", self.endpoint()),
        ]
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Pseudo-random bytes (xorshift), so that the CRC-32 sees varied data.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn the_store_round_trips_and_reports_damage() {
    let _serial = serial();
    let tmp = TempDir::new("api");
    let moto = Moto::start(&tmp.0);
    moto.create_bucket("bucket");
    moto.configure_this_process();

    let store = S3Store::open("s3://bucket/api/").unwrap();
    assert_eq!(store.describe(), "s3://bucket/api");
    assert_eq!(store.list().unwrap(), Vec::<u64>::new());

    // A shard's directory: a small file and one big enough for a multipart
    // upload (the store puts every file of it, whatever the names).
    let local = tmp.0.join("shard");
    std::fs::create_dir_all(&local).unwrap();
    let small = noise(10_000, 1);
    let big = noise(40 << 20, 2);
    std::fs::write(local.join("000001.sst"), &small).unwrap();
    std::fs::write(local.join("000002.sst"), &big).unwrap();
    let files = store.put_shard(1, 0, &local).unwrap();
    let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["000001.sst", "000002.sst"]);
    assert_eq!(files[0].size, small.len() as u64);
    assert_eq!(files[0].crc32, crc32fast::hash(&small));
    assert_eq!(files[1].size, big.len() as u64);
    assert_eq!(files[1].crc32, crc32fast::hash(&big));
    assert!(!local.exists(), "put_shard takes the local shard over");
    assert_eq!(
        moto.keys("bucket", "api/"),
        ["api/chk-0000000001/shard-0/000001.sst", "api/chk-0000000001/shard-0/000002.sst"]
    );

    // Without its manifest the checkpoint is listed but incomplete.
    assert_eq!(store.list().unwrap(), [1]);
    assert_eq!(store.get_manifest(1).unwrap(), None);
    store.put_manifest(1, b"the manifest").unwrap();
    assert_eq!(store.get_manifest(1).unwrap().as_deref(), Some(&b"the manifest"[..]));

    // Fetched by another store (no cache), checked, in a local directory.
    let reader = S3Store::open("s3://bucket/api").unwrap();
    let dir = reader.get_shard(1, 0, &files).unwrap();
    assert!(dir.starts_with(reader.staging()));
    assert_eq!(std::fs::read(dir.join("000001.sst")).unwrap(), small);
    assert_eq!(std::fs::read(dir.join("000002.sst")).unwrap(), big);
    // Again (from the cache, still checked).
    assert_eq!(reader.get_shard(1, 0, &files).unwrap(), dir);

    // A file that does not match the manifest, and a missing one.
    let mut wrong = files.clone();
    wrong[0].crc32 ^= 1;
    match reader.get_shard(1, 0, &wrong) {
        Err(CheckpointError::Corrupt { what, reason }) => {
            assert_eq!(what, "s3://bucket/api/chk-0000000001/shard-0/000001.sst");
            assert!(reason.contains("crc32"), "{reason}");
        }
        other => panic!("a checksum mismatch must be Corrupt, got {other:?}"),
    }
    let missing = vec![FileInfo { name: "000003.sst".into(), size: 1, crc32: 0 }];
    match reader.get_shard(1, 0, &missing) {
        Err(CheckpointError::Corrupt { what, .. }) => {
            assert_eq!(what, "s3://bucket/api/chk-0000000001/shard-0/000003.sst")
        }
        other => panic!("a missing shard file must be Corrupt, got {other:?}"),
    }

    // Deletion takes the manifest and every object of the checkpoint.
    store.put_manifest(2, b"another").unwrap();
    assert_eq!(store.list().unwrap(), [1, 2]);
    store.delete(1).unwrap();
    assert_eq!(store.list().unwrap(), [2]);
    assert_eq!(store.get_manifest(1).unwrap(), None);
    assert_eq!(moto.keys("bucket", "api/"), ["api/chk-0000000002/MANIFEST"]);
    store.delete(2).unwrap();
    store.delete(2).unwrap();
    assert!(moto.keys("bucket", "api/").is_empty());
    store.put_manifest(2, b"another").unwrap();

    // Shared files (a state backend's SSTs): put once, listed beside the
    // checkpoints (not as one), read back checked, and deleted by garbage
    // collection once no kept checkpoint lists them.
    use highwater::checkpoint::store::{collect_garbage, shared_name};
    let sst = tmp.0.join("000007.sst");
    std::fs::write(&sst, &small).unwrap();
    let old = store.put_shared(&shared_name(3, "db-000007.sst"), &sst).unwrap();
    let kept = store.put_shared(&shared_name(4, "db-000008.sst"), &sst).unwrap();
    let pending = store.put_shared(&shared_name(6, "db-000009.sst"), &sst).unwrap();
    assert_eq!((kept.size, kept.crc32), (small.len() as u64, crc32fast::hash(&small)));
    assert_eq!(store.list_shared().unwrap(), [old.name.clone(), kept.name.clone(), pending.name.clone()]);
    assert_eq!(store.list().unwrap(), [2]);
    let back = tmp.0.join("back.sst");
    reader.get_shared(&kept, &back).unwrap();
    assert_eq!(std::fs::read(&back).unwrap(), small);
    let mut wrong = kept.clone();
    wrong.size += 1;
    assert!(matches!(reader.get_shared(&wrong, &tmp.0.join("w")), Err(CheckpointError::Corrupt { .. })));
    let manifest = highwater::checkpoint::Manifest {
        format_version: highwater::checkpoint::FORMAT_VERSION,
        id: 5,
        time: 5,
        fingerprint: String::new(),
        workers: 1,
        created_unix_ms: 0,
        sources: Default::default(),
        shards: vec![],
        sinks: vec![],
        schemas: Default::default(),
        shared: vec![kept.clone()],
    };
    store.put_manifest(5, &manifest.to_bytes()).unwrap();
    collect_garbage(&store, 1, 5).unwrap();
    assert_eq!(store.list().unwrap(), [5]);
    assert_eq!(store.list_shared().unwrap(), [kept.name.clone(), pending.name.clone()]);
    store.delete(5).unwrap();
    store.delete_shared(&kept.name).unwrap();
    store.delete_shared(&pending.name).unwrap();
    assert!(moto.keys("bucket", "api/").is_empty());

    // A missing bucket is an error naming it, not a panic.
    let err = S3Store::open("s3://no-such-bucket/x").unwrap().list().unwrap_err();
    assert!(err.to_string().contains("s3://no-such-bucket/x"), "{err}");
    assert!(matches!(err, CheckpointError::ObjectStore { .. }), "{err:?}");

    drop((store, reader));
}

/// The data rows of the committed part files of `dir`, in name order, less
/// each file's header line.
fn data_rows(dir: &Path) -> (Vec<u8>, usize) {
    let mut parts: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("part-") && name.ends_with(".csv")
        })
        .collect();
    parts.sort();
    let mut rows = Vec::new();
    for part in &parts {
        let bytes = std::fs::read(part).unwrap();
        let body = match bytes.iter().position(|&b| b == b'\n') {
            Some(i) => &bytes[i + 1..],
            None => &[][..],
        };
        rows.extend_from_slice(body);
    }
    (rows, parts.len())
}

/// The job's events: enough for a run of several seconds at two workers,
/// so that each restart is killed before it ends (20 M took 1 s to finish
/// from a late checkpoint once watermark alignment made q5 faster).
const EVENTS: &str = "40000000";

fn nexmark(checkpoints: &str, out: &Path, recover: bool) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_highwater"));
    command.args(["--log", "highwater=info", "nexmark", "-q", "q5", "--events", EVENTS]);
    command.args(["--checkpoint-dir", checkpoints]);
    command.args(["--checkpoint-interval", "200ms", "--output-dir", out.to_str().unwrap()]);
    if recover {
        command.arg("--recover");
    }
    command.args(["--", "-w", "2"]).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    command
}

fn stderr_of(child: Child) -> (std::process::ExitStatus, String) {
    let out = child.wait_with_output().unwrap();
    (out.status, strip_ansi(&String::from_utf8_lossy(&out.stderr)))
}

/// The text without terminal colour sequences (`ESC [ … m`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The id of the checkpoint a run recovered from, from its log.
fn recovered_from(stderr: &str) -> Option<u64> {
    let line = stderr.lines().find(|l| l.contains("recovering from checkpoint"))?;
    line.split_whitespace().find_map(|w| w.strip_prefix("id=")).and_then(|id| id.parse().ok())
}

/// The greatest id of a checkpoint with a manifest under `job/` in S3.
fn newest_manifest(moto: &Moto) -> Option<u64> {
    moto.keys("bucket", "job/")
        .iter()
        .filter_map(|k| k.strip_prefix("job/chk-")?.strip_suffix("/MANIFEST")?.parse().ok())
        .max()
}

#[cfg(feature = "fault-injection")]
#[test]
fn nexmark_recovers_from_s3_checkpoints_after_kills() {
    let _serial = serial();
    let tmp = TempDir::new("kills");

    // The reference: one uninterrupted run with local checkpoints.
    let local_out = tmp.0.join("local-out");
    let local_checkpoints = tmp.0.join("local-checkpoints");
    let started = Instant::now();
    let (status, stderr) = stderr_of(nexmark(local_checkpoints.to_str().unwrap(), &local_out, false).spawn().unwrap());
    assert!(status.success(), "the uninterrupted run failed: {stderr}");
    let reference_time = started.elapsed();
    let (want, reference_parts) = data_rows(&local_out);
    assert!(!want.is_empty(), "the uninterrupted run wrote no rows");
    eprintln!("uninterrupted run: {reference_time:?}, {reference_parts} parts, {} bytes of rows", want.len());

    let moto = Moto::start(&tmp.0);
    moto.create_bucket("bucket");
    let out = tmp.0.join("s3-out");
    // The runs' staging directories (left behind by the killed ones) go into
    // the test's directory.
    let child_tmp = tmp.0.join("tmp");
    std::fs::create_dir_all(&child_tmp).unwrap();
    let run = |kill_at: Option<&str>| {
        let mut command = nexmark("s3://bucket/job", &out, true);
        command.env("TMPDIR", &child_tmp);
        command.env_remove("AWS_ENDPOINT_URL_S3").env_remove("AWS_SESSION_TOKEN").env_remove("AWS_DEFAULT_REGION");
        command.env_remove("HIGHWATER_KILL_AT");
        command.envs(moto.env());
        if let Some(point) = kill_at {
            command.env("HIGHWATER_KILL_AT", point);
        }
        command.spawn().unwrap()
    };

    // Three SIGKILLs from outside, 0.5 to 1 s after each run has committed a
    // checkpoint of its own to S3 (so that each restart recovers from a newer
    // one), wherever the run then is: possibly in the middle of writing the
    // next checkpoint. Between them, kills from inside at the S3 store's
    // kill points: one of the two workers' shards uploaded, and all shards but no manifest;
    // the restart must pass over that incomplete checkpoint.
    let mut recovered = None::<u64>;
    let steps: [(&str, Option<&str>, u64); 5] = [
        ("SIGKILL", None, 500),
        ("inside, after the 1st of the 2 shard files", Some("shard-write:1"), 0),
        ("SIGKILL", None, 750),
        ("inside, before the 1st manifest upload", Some("manifest-write:1"), 0),
        ("SIGKILL", None, 1000),
    ];
    for (n, (how, kill_at, after_ms)) in steps.into_iter().enumerate() {
        let started = Instant::now();
        let seen_before = newest_manifest(&moto);
        let mut child = run(kill_at);
        let (status, stderr) = if kill_at.is_some() {
            stderr_of(child)
        } else {
            let deadline = Instant::now() + Duration::from_secs(60);
            while newest_manifest(&moto) <= seen_before {
                if child.try_wait().unwrap().is_some() {
                    panic!("run {} ended before committing a checkpoint: {:?}", n + 1, stderr_of(child));
                }
                assert!(Instant::now() < deadline, "run {} committed no checkpoint within 60 s", n + 1);
                std::thread::sleep(Duration::from_millis(20));
            }
            std::thread::sleep(Duration::from_millis(after_ms));
            let finished = child.try_wait().unwrap();
            assert!(finished.is_none(), "run {} ended before it was killed: {:?}", n + 1, stderr_of(child));
            child.kill().unwrap(); // SIGKILL
            stderr_of(child)
        };
        assert!(!status.success(), "run {} was not killed: {stderr}", n + 1);
        eprintln!("run {} killed ({how}) after {:?}; its log:\n{stderr}", n + 1, started.elapsed());
        let from = recovered_from(&stderr);
        if n > 0 {
            let from = from.unwrap_or_else(|| panic!("run {} did not recover: {stderr}", n + 1));
            assert!(Some(from) >= recovered, "run {} recovered from an older checkpoint than before", n + 1);
            recovered = Some(from);
        }
        if kill_at.is_some() {
            // Killed within its first checkpoint: the next one's shard files
            // (some or all) are in S3, its manifest is not.
            let next = format!("job/chk-{:010}/", recovered.unwrap() + 1);
            let keys = moto.keys("bucket", &next);
            assert!(keys.iter().any(|k| k.contains("/shard-")), "run {}: no shard file under {next}", n + 1);
            assert!(!keys.iter().any(|k| k.ends_with("/MANIFEST")), "run {}: a manifest under {next}", n + 1);
            assert_eq!(newest_manifest(&moto), seen_before, "run {} committed a checkpoint", n + 1);
        }
    }
    let started = Instant::now();
    let (status, stderr) = stderr_of(run(None));
    assert!(status.success(), "the last run failed: {stderr}\nmoto_server: {}", moto.log());
    eprintln!("last run: {:?}; its log:\n{stderr}", started.elapsed());
    let from = recovered_from(&stderr).unwrap_or_else(|| panic!("the last run did not recover from S3: {stderr}"));
    assert!(Some(from) > recovered, "the killed runs after the last kill point committed nothing");

    let keys = moto.keys("bucket", "job/");
    assert!(keys.iter().any(|k| k.contains("/shard-")), "no shard in S3: {keys:?}");
    let (got, parts) = data_rows(&out);
    eprintln!("after 5 kills: {parts} parts, {} bytes of rows, {} objects in S3", got.len(), keys.len());
    assert!(got == want, "the rows after recoveries differ from the uninterrupted run's");

    // The final checkpoint is in S3: recovering again has nothing to do.
    let (status, stderr) = stderr_of(run(None));
    assert!(status.success(), "recovering a completed job failed: {stderr}");
    assert!(stderr.contains("the job has completed"), "a completed job recovered from S3 should say so: {stderr}");
    assert_eq!(data_rows(&out).0, want);
}

/// Incremental checkpoints in S3: q20 with its keyed state on RocksDB puts
/// its database files as shared objects. A run killed between putting a
/// checkpoint's files and its manifest, a run that recovers from the
/// previous checkpoint onto 3 workers (fetching the files from S3) and is
/// killed in turn, and a last run on 1 worker commit exactly the rows of an
/// uninterrupted in-memory run; in the end every shared object is
/// referenced by a kept checkpoint, and the state directory is empty.
#[cfg(feature = "fault-injection")]
#[test]
fn incremental_rocksdb_checkpoints_in_s3_recover_onto_other_worker_counts() {
    let _serial = serial();
    let tmp = TempDir::new("incremental");
    let state = tmp.0.join("state");
    let q20 = |checkpoints: &str, out: &Path, workers: usize, rocksdb: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_highwater"));
        command.args(["--log", "highwater=info", "nexmark", "-q", "q20", "--events", "1500000"]);
        command.args(["--checkpoint-dir", checkpoints, "--checkpoint-interval", "100ms", "--recover"]);
        command.args(["--output-dir", out.to_str().unwrap()]);
        if rocksdb {
            command.args(["--state-backend", "rocksdb", "--state-cache", "16MiB", "--state-dir"]).arg(&state);
        }
        command.args(["--", "-w", &workers.to_string()]);
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        command
    };
    let sorted_rows = |dir: &Path| {
        let (rows, _) = data_rows(dir);
        let mut lines: Vec<String> = String::from_utf8(rows).unwrap().lines().map(str::to_owned).collect();
        lines.sort_unstable();
        lines
    };
    let local = tmp.0.join("local-checkpoints");
    let reference_out = tmp.0.join("reference-out");
    let (status, stderr) = stderr_of(q20(local.to_str().unwrap(), &reference_out, 2, false).spawn().unwrap());
    assert!(status.success(), "the uninterrupted run failed: {stderr}");
    let want = sorted_rows(&reference_out);
    assert!(!want.is_empty(), "the uninterrupted run wrote no rows");

    let moto = Moto::start(&tmp.0);
    moto.create_bucket("bucket");
    let out = tmp.0.join("s3-out");
    let child_tmp = tmp.0.join("tmp");
    std::fs::create_dir_all(&child_tmp).unwrap();
    let run = |workers: usize, kill_at: Option<&str>| {
        let mut command = q20("s3://bucket/job", &out, workers, true);
        command.env("TMPDIR", &child_tmp);
        command.env_remove("AWS_ENDPOINT_URL_S3").env_remove("AWS_SESSION_TOKEN").env_remove("AWS_DEFAULT_REGION");
        command.env_remove("HIGHWATER_KILL_AT");
        command.envs(moto.env());
        if let Some(point) = kill_at {
            command.env("HIGHWATER_KILL_AT", point);
        }
        stderr_of(command.spawn().unwrap())
    };
    let shared = || moto.keys("bucket", "job/shared/");

    let (status, stderr) = run(2, Some("database-put:3"));
    assert!(!status.success(), "run 1 was not killed: {stderr}");
    assert!(!shared().is_empty(), "run 1 put no database files into S3: {stderr}");
    let (status, stderr) = run(3, Some("sink-commit:3"));
    assert!(!status.success(), "run 2 was not killed: {stderr}");
    assert!(recovered_from(&stderr).is_some(), "run 2 did not recover: {stderr}");
    assert!(stderr.contains("database files fetched"), "run 2 did not fetch database files: {stderr}");
    let (status, stderr) = run(1, None);
    assert!(status.success(), "the last run failed: {stderr}\nmoto_server: {}", moto.log());
    assert!(recovered_from(&stderr).is_some(), "the last run did not recover: {stderr}");
    assert!(sorted_rows(&out) == want, "the rows after recoveries differ from the uninterrupted run's");

    // Every shared object is referenced by a kept checkpoint's manifest.
    moto.configure_this_process();
    let store = S3Store::open("s3://bucket/job").unwrap();
    let mut referenced = std::collections::HashSet::new();
    for id in store.list().unwrap() {
        let Some(bytes) = store.get_manifest(id).unwrap() else { continue };
        let manifest = highwater::checkpoint::Manifest::from_bytes(&bytes, "manifest").unwrap();
        assert!(manifest.bytes_written() <= manifest.state_bytes());
        referenced.extend(manifest.shared.iter().map(|f| format!("job/shared/{}", f.name)));
    }
    let objects = shared();
    assert!(!objects.is_empty(), "no database files in S3");
    let unreferenced: Vec<_> = objects.iter().filter(|k| !referenced.contains(*k)).collect();
    assert!(unreferenced.is_empty(), "shared objects no kept checkpoint references: {unreferenced:?}");
    let left: Vec<_> = std::fs::read_dir(&state).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "state directories left behind: {left:?}");
}

/// An HTTP proxy in front of moto that forwards every request, one per
/// connection, or, while `refusing`, answers writes (`PUT`, `POST`,
/// `DELETE`) with `403 AccessDenied`, as S3 does once a bucket policy or the
/// credentials stop allowing them.
struct RefusingProxy {
    port: u16,
    refusing: Arc<AtomicBool>,
}

impl RefusingProxy {
    fn start(upstream: u16) -> RefusingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let refusing = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&refusing);
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let flag = Arc::clone(&flag);
                std::thread::spawn(move || {
                    let _ = Self::serve(client, upstream, &flag);
                });
            }
        });
        RefusingProxy { port, refusing }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn refuse(&self, refusing: bool) {
        self.refusing.store(refusing, Ordering::SeqCst);
    }

    /// Reads one request from `client`, forwards it (or refuses it), closes.
    fn serve(mut client: TcpStream, upstream: u16, refusing: &AtomicBool) -> std::io::Result<()> {
        let (head, body) = read_message(&mut client, true)?;
        let method = head.split(' ').next().unwrap_or_default().to_owned();
        if refusing.load(Ordering::SeqCst) && matches!(method.as_str(), "PUT" | "POST" | "DELETE") {
            let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AccessDenied</Code>\
                        <Message>Access Denied</Message></Error>";
            let response = format!(
                "HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            );
            return client.write_all(response.as_bytes());
        }
        let mut server = TcpStream::connect(("127.0.0.1", upstream))?;
        server.write_all(close_connection(&head).as_bytes())?;
        server.write_all(&body)?;
        let (head, body) = read_message(&mut server, false)?;
        client.write_all(close_connection(&head).as_bytes())?;
        client.write_all(&body)
    }
}

/// The head with `Connection: close` instead of any `Connection` header.
fn close_connection(head: &str) -> String {
    let mut lines: Vec<&str> = head.trim_end().split("\r\n").collect();
    lines.retain(|l| !l.to_ascii_lowercase().starts_with("connection:"));
    lines.push("Connection: close");
    lines.join("\r\n") + "\r\n\r\n"
}

/// One HTTP message: its head (with the blank line) and body, by
/// `Content-Length` (a request without one has none; a response without one
/// runs to the end of the connection).
fn read_message(stream: &mut TcpStream, request: bool) -> std::io::Result<(String, Vec<u8>)> {
    let mut data = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    let end = loop {
        if let Some(i) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed before the head"));
        }
        data.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&data[..end]).into_owned();
    let length = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("content-length").then(|| value.trim().parse::<usize>().ok()).flatten()
    });
    let mut body = data.split_off(end);
    match length {
        Some(n) => {
            while body.len() < n {
                let read = stream.read(&mut buf)?;
                if read == 0 {
                    break;
                }
                body.extend_from_slice(&buf[..read]);
            }
        }
        None if !request => {
            stream.read_to_end(&mut body)?;
        }
        None => {}
    }
    Ok((head, body))
}

#[test]
fn a_store_that_starts_refusing_writes_fails_the_job_which_recovers() {
    let _serial = serial();
    let tmp = TempDir::new("refusing");

    // The reference: one uninterrupted run with local checkpoints.
    let local_out = tmp.0.join("local-out");
    let local_checkpoints = tmp.0.join("local-checkpoints");
    let (status, stderr) = stderr_of(nexmark(local_checkpoints.to_str().unwrap(), &local_out, false).spawn().unwrap());
    assert!(status.success(), "the uninterrupted run failed: {stderr}");
    let (want, _) = data_rows(&local_out);
    assert!(!want.is_empty(), "the uninterrupted run wrote no rows");

    let moto = Moto::start(&tmp.0);
    moto.create_bucket("bucket");
    let proxy = RefusingProxy::start(moto.port);
    let out = tmp.0.join("s3-out");
    let child_tmp = tmp.0.join("tmp");
    std::fs::create_dir_all(&child_tmp).unwrap();
    let run = || {
        let mut command = nexmark("s3://bucket/job", &out, true);
        command.env("TMPDIR", &child_tmp);
        command.env_remove("AWS_ENDPOINT_URL_S3").env_remove("AWS_SESSION_TOKEN").env_remove("AWS_DEFAULT_REGION");
        command.env_remove("HIGHWATER_KILL_AT");
        command.envs(moto.env()).env("AWS_ENDPOINT_URL", proxy.endpoint());
        command.spawn().unwrap()
    };

    // A checkpoint is committed; then the store refuses every write.
    let mut child = run();
    let deadline = Instant::now() + Duration::from_secs(60);
    while newest_manifest(&moto).is_none() {
        if child.try_wait().unwrap().is_some() {
            panic!("the run ended before committing a checkpoint: {:?}", stderr_of(child));
        }
        assert!(Instant::now() < deadline, "no checkpoint committed within 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    proxy.refuse(true);
    let refused_at = Instant::now();
    let good = newest_manifest(&moto);
    let (status, stderr) = stderr_of(child);
    let stopped_after = refused_at.elapsed();
    assert!(!status.success(), "the run succeeded although the store refused its writes: {stderr}");
    assert!(stderr.contains("checkpointing failed") && stderr.contains("403"), "the error names the refusal: {stderr}");
    // Any checkpoint committed after the refusal began was already past its writes.
    let latest = newest_manifest(&moto);
    assert!(latest <= good.map(|g| g + 1), "checkpoints committed while refused: {good:?} -> {latest:?}");
    let (partial, _) = data_rows(&out);
    assert!(partial.len() < want.len(), "the failed run committed everything (it ran to its end)");
    assert!(want.starts_with(&partial), "what the failed run committed is a prefix of the uninterrupted rows");
    eprintln!("refused: the run stopped {stopped_after:?} after the store began refusing writes");

    // Writes allowed again: the job recovers from its last good checkpoint.
    proxy.refuse(false);
    let (status, stderr) = stderr_of(run());
    assert!(status.success(), "the recovery failed: {stderr}\nmoto_server: {}", moto.log());
    let from = recovered_from(&stderr).unwrap_or_else(|| panic!("the run did not recover: {stderr}"));
    assert_eq!(Some(from), latest, "it recovers from the last good checkpoint");
    assert!(data_rows(&out).0 == want, "the rows after the recovery differ from the uninterrupted run's");
}
