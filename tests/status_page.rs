//! The status page, the served result, the operators' and checkpoints'
//! metrics of a running job (`--serve-addr`, issue 18): a checkpointed
//! `highwater nexmark` q5 job at `-w 2` with a bearer token, read with a real
//! HTTP client while it runs, and its status page rendered by a real
//! browser (headless Chromium): the page shows the job's live numbers.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "common/prometheus.rs"]
mod prometheus;

use prometheus::{value as sample, Sample};

const TOKEN: &str = "s3cret-token";

/// The job, killed when dropped.
struct Job(Child);

impl Drop for Job {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the job and returns it with its server's base URL.
fn start(checkpoints: &std::path::Path) -> (Job, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_highwater"))
        .args(["nexmark", "--query", "q5", "--events", "100000000000", "--rate-limit", "100000", "--discard"])
        .args(["--checkpoint-dir", checkpoints.to_str().unwrap(), "--checkpoint-interval", "300ms"])
        .args(["--serve-addr", "127.0.0.1:0", "--serve-token", TOKEN, "--serve-retain", "60s", "--", "-w", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let base = loop {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "the job ended before serving");
        if let Some(rest) = line.trim().strip_prefix("status page at ") {
            break rest.trim_end_matches('/').to_owned();
        }
    };
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    (Job(child), base)
}

fn get(url: &str, token: Option<&str>) -> Result<String, u16> {
    let mut request = ureq::get(url);
    if let Some(token) = token {
        request = request.set("Authorization", &format!("Bearer {token}"));
    }
    match request.call() {
        Ok(response) => Ok(response.into_string().expect("a text body")),
        Err(ureq::Error::Status(code, _)) => Err(code),
        Err(e) => panic!("{url}: {e}"),
    }
}

fn status(base: &str) -> serde_json::Value {
    serde_json::from_str(&get(&format!("{base}/status"), Some(TOKEN)).expect("the status")).expect("JSON")
}

/// The samples of the job's metrics.
fn scrape(base: &str) -> Vec<Sample> {
    prometheus::scrape(&format!("{base}/metrics"), Some(TOKEN))
}

/// The text of the element with `id` in a rendered DOM.
fn text_of<'a>(dom: &'a str, id: &str) -> &'a str {
    let open = format!("id=\"{id}\"");
    let at = dom.find(&open).unwrap_or_else(|| panic!("no element {id} in the page"));
    let rest = &dom[at..];
    let start = rest.find('>').expect("a tag") + 1;
    let end = rest[start..].find('<').expect("a closing tag") + start;
    &rest[start..end]
}

fn number(text: &str) -> f64 {
    text.replace(',', "").parse().unwrap_or_else(|_| panic!("{text:?} is not a number"))
}

#[test]
fn a_running_job_serves_its_status_page_result_and_metrics() {
    let dir = std::env::temp_dir().join(format!("highwater-status-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (job, base) = start(&dir.join("checkpoints"));

    // The token is enforced on every route but the page itself (which
    // holds no numbers: its script reads /status with the token).
    assert_eq!(get(&format!("{base}/status"), None).unwrap_err(), 401);
    assert_eq!(get(&format!("{base}/metrics"), Some("wrong")).unwrap_err(), 401);
    assert_eq!(get(&format!("{base}/views/q5"), None).unwrap_err(), 401);
    assert!(get(&format!("{base}/"), None).unwrap().contains("<title>highwater job status</title>"));

    // Running: records read, a checkpoint written, windows complete.
    let deadline = Instant::now() + Duration::from_secs(60);
    let first = loop {
        let s = status(&base);
        let written = s["checkpoints"]["completed"].as_u64().unwrap_or(0);
        if s["records"].as_u64().unwrap_or(0) > 0 && written > 0 && s["watermark"].is_u64() {
            break s;
        }
        assert!(Instant::now() < deadline, "the job did not get going: {s}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let ops = first["operators"].as_array().unwrap();
    let window = ops.iter().find(|o| o["name"] == "BidsPerAuction").expect("q5's window operator is listed");
    assert!(window["address"].as_str().unwrap().starts_with("0."), "{window}");
    let generator = ops.iter().find(|o| o["name"] == "Nexmark").expect("the source operator is listed");
    assert!(
        generator["feeds"].as_array().is_some_and(|f| !f.is_empty()),
        "the dataflow's edges are known: {generator}"
    );

    // Metrics: they parse, the operators' and checkpoints' counters move.
    let m1 = scrape(&base);
    std::thread::sleep(Duration::from_millis(1500));
    let m2 = scrape(&base);
    let received =
        |m: &[Sample]| sample(m, "highwater_operator_records_received_total", Some(("operator", "BidsPerAuction")));
    let (r1, r2) = (received(&m1).expect("records in"), received(&m2).expect("records in"));
    assert!(r1 > 0.0 && r2 > r1, "the window's records in move: {r1} then {r2}");
    let busy = sample(&m2, "highwater_operator_busy_seconds_total", Some(("operator", "BidsPerAuction")));
    assert!(busy.is_some_and(|b| b > 0.0), "busy time {busy:?}");
    let completed = |m: &[Sample]| sample(m, "highwater_checkpoints_total", Some(("outcome", "completed"))).unwrap();
    assert!(completed(&m2) > completed(&m1), "checkpoints are written every 300 ms");
    assert_eq!(sample(&m2, "highwater_checkpoints_total", Some(("outcome", "failed"))), Some(0.0));
    assert!(sample(&m2, "highwater_checkpoint_state_bytes", None).is_some_and(|b| b > 0.0));
    let age = sample(&m2, "highwater_checkpoint_age_seconds", None).expect("age");
    assert!((0.0..10.0).contains(&age), "the latest checkpoint is recent: {age} s");
    let duration = sample(&m2, "highwater_checkpoint_duration_seconds", None).expect("duration");
    assert!((0.0..10.0).contains(&duration), "{duration}");
    let source = sample(&m2, "highwater_source_watermark_seconds", Some(("source", "Nexmark"))).expect("watermark");
    let output = sample(&m2, "highwater_watermark_seconds", None).expect("output watermark");
    assert!(source >= output - 1.0, "the source's watermark {source} is not behind the output's {output}");
    let lag = sample(&m2, "highwater_source_watermark_lag_seconds", Some(("source", "Nexmark"))).unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    assert!((lag - (now - source)).abs() < 10.0, "lag {lag} against the wall clock minus {source}");

    // State: every stateful operator's entries and their size, encoded,
    // which the latest checkpoint (of the same state, every 300 ms)
    // measures exactly, each entry framed with its route and length (a
    // hash's varint and a byte): the two agree within a sample's error and
    // the state's change between them.
    let state_bytes = prometheus::sum(&m2, "highwater_state_bytes");
    let entries = prometheus::sum(&m2, "highwater_state_entries");
    let checkpointed = sample(&m2, "highwater_checkpoint_state_bytes", None).unwrap();
    let framed = state_bytes + 11.0 * entries;
    assert!(
        framed > checkpointed * 0.8 && framed < checkpointed * 1.25,
        "the operators' {entries} entries are estimated at {state_bytes} bytes ({framed} framed), \
         the latest checkpoint's at {checkpointed}"
    );
    assert!(first["state_bytes"]["BidsPerAuction"].as_u64().is_some(), "{}", first["state_bytes"]);

    // Per partition: watermarks, offsets and records, which sum to the source's.
    let records = sample(&m2, "highwater_source_records_total", Some(("source", "Nexmark"))).unwrap();
    let by_partition = prometheus::sum(&m2, "highwater_partition_records_total");
    // (Read one after the other while the source reads on: within a few batches.)
    assert!(
        (by_partition - records).abs() <= 5_000.0 + records * 0.02,
        "the partitions' records {by_partition} add up to the source's {records}"
    );
    let partitions = m2.iter().filter(|(m, _, _)| m == "highwater_partition_watermark_seconds").count();
    assert!(partitions >= 2, "{partitions} partitions with a watermark");
    let least = m2
        .iter()
        .filter(|(m, _, _)| m == "highwater_partition_watermark_seconds")
        .map(|(_, _, v)| *v)
        .fold(f64::MAX, f64::min);
    assert!(
        (least - source).abs() < 5.0,
        "the source's watermark {source} is about its partitions' least {least} (read a moment apart)"
    );
    assert!(m2.iter().any(|(m, _, v)| m == "highwater_partition_offset" && *v > 0.0), "offsets move");

    // The served result: q5's rows, keyed by their text, values by column.
    let body = get(&format!("{base}/views/q5?limit=50"), Some(TOKEN)).expect("the result");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    let rows = answer["rows"].as_array().expect("rows");
    assert!(!rows.is_empty(), "windows have fired: {answer}");
    let watermark = answer["watermark"].as_u64().unwrap();
    for row in rows {
        let key = row["key"].as_str().unwrap();
        let value = &row["value"];
        let fields: Vec<&str> = key.split(',').collect();
        let columns = ["window_start", "window_end", "auction", "num"];
        assert_eq!(fields.len(), columns.len(), "{row}");
        for (field, column) in fields.iter().zip(columns) {
            assert_eq!(value[column].as_str(), Some(*field), "{row}");
        }
        let (start, end): (u64, u64) = (fields[0].parse().unwrap(), fields[1].parse().unwrap());
        assert_eq!(end - start, 10_000, "q5's windows are 10 s long: {row}");
        assert!(end <= watermark, "a window fires once the watermark passes its end: {row}, watermark {watermark}");
    }

    // The page in a real browser: it renders the live numbers.
    let before = status(&base);
    let chromium = Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        .args(["--virtual-time-budget=5000", "--dump-dom", &format!("{base}/?token={TOKEN}")])
        .output()
        .expect("chromium runs (scripts/test.sh installs it)");
    assert!(chromium.status.success(), "chromium: {}", String::from_utf8_lossy(&chromium.stderr));
    let after = status(&base);
    let dom = String::from_utf8(chromium.stdout).unwrap();
    let updates: usize = dom
        .split("data-updates=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .and_then(|n| n.parse().ok())
        .expect("the page has rendered /status");
    assert!(updates >= 2, "the page polls: {updates} updates");
    assert_eq!(text_of(&dom, "state"), "running");
    let shown = number(text_of(&dom, "records"));
    let (lo, hi) = (before["records"].as_f64().unwrap(), after["records"].as_f64().unwrap());
    assert!(lo <= shown && shown <= hi, "the page shows {shown} records read, between {lo} and {hi}");
    let written = number(text_of(&dom, "ck_completed"));
    assert!(written >= before["checkpoints"]["completed"].as_f64().unwrap(), "checkpoints written: {written}");
    assert_eq!(text_of(&dom, "ck_failed"), "0");
    assert_eq!(text_of(&dom, "dead_letters"), "0");
    assert!(text_of(&dom, "rate").ends_with('K'), "records/s on the page: {}", text_of(&dom, "rate"));
    assert!(text_of(&dom, "watermark").starts_with("2024-"), "the generator's event times start in 2024");
    assert!(dom.contains("<td>Nexmark</td>"), "the source is listed");
    assert!(dom.contains("<td>BidsPerAuction</td>"), "the operators are listed");
    let partitions_table = &dom[dom.find("id=\"partitions\"").expect("a partitions table")..];
    assert!(partitions_table[..partitions_table.find("</table>").unwrap()].contains("<td>Nexmark</td>"));
    assert!(dom.contains("<polyline"), "the charts are drawn");
    assert!(dom.contains("<rect"), "the dataflow is drawn");
    drop(job);
    let _ = std::fs::remove_dir_all(&dir);
}
