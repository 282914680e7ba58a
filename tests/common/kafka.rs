//! Throwaway Kafka-protocol brokers for the Kafka tests: `noida-db` (pinned
//! 0.2.3, from PyPI; scripts/test.sh installs it) started on a free port of
//! 127.0.0.1 with a data folder of its own, killed and removed on drop.
//! Without the broker the tests fail, never pass silently.
#![allow(dead_code)]

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running broker of our own.
#[derive(Debug)]
pub(crate) struct KafkaBroker {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    child: Option<Child>,
}

/// The broker binary inside the `noida_db` Python package (not its console
/// script, a wrapper whose child outlives it when it is killed).
fn find_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("HIGHWATER_KAFKA_BIN") {
        return PathBuf::from(bin);
    }
    let out = Command::new("python3")
        .args(["-c", "import noida_db, os; print(os.path.dirname(noida_db.__file__))"])
        .output()
        .expect("running python3");
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let bin = PathBuf::from(dir).join("noida-db");
    assert!(
        out.status.success() && bin.exists(),
        "the Kafka test broker is missing: run scripts/test.sh, which installs it (pip install noida-db==0.2.3), \
         or set HIGHWATER_KAFKA_BIN ({})",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

impl KafkaBroker {
    /// Starts a new broker with an empty log.
    pub(crate) fn start() -> KafkaBroker {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let data = std::env::temp_dir().join(format!("highwater-kafka-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&data).expect("creating the broker's folder");
        let mut broker = KafkaBroker { bin: find_bin(), data, port: free_port(), child: None };
        broker.resume();
        broker
    }

    /// `host:port`, for `bootstrap.servers`.
    pub(crate) fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills the broker (SIGKILL); its log stays for [`resume`](Self::resume).
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the broker again on its port and log.
    pub(crate) fn resume(&mut self) {
        assert!(self.child.is_none(), "the broker is running");
        let log = std::fs::File::create(self.data.join("broker.log")).expect("creating the broker's log");
        let child = Command::new(&self.bin)
            .arg("start")
            .arg("--data-dir")
            .arg(self.data.join("data"))
            .args(["--only", "kafka", "--kafka-port", &self.port.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the broker's log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.bin.display()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("the Kafka broker exited with {status}: {}", self.log());
            }
            assert!(Instant::now() < deadline, "the Kafka broker did not listen within 30 s: {}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The broker's output so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.data.join("broker.log")).unwrap_or_default()
    }
}

impl Drop for KafkaBroker {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

/// Sends `record` with `producer`, waiting while librdkafka's queue is full
/// (the benches produce faster than the broker takes records).
pub(crate) fn send_queued<K, P>(
    producer: &rdkafka::producer::BaseProducer,
    record: rdkafka::producer::BaseRecord<'_, K, P>,
) where
    K: rdkafka::message::ToBytes + ?Sized,
    P: rdkafka::message::ToBytes + ?Sized,
{
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode;
    let mut record = record;
    loop {
        match producer.send(record) {
            Ok(()) => return,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                producer.poll(Duration::from_millis(1));
            }
            Err((e, _)) => panic!("producing: {e}"),
        }
    }
}
