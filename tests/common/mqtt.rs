//! Throwaway MQTT brokers for the MQTT tests: Debian's `mosquitto`
//! (scripts/test.sh installs it) on a free port of 127.0.0.1 with a config
//! file and a persistence folder of its own, stopped and removed on drop.
//! Without the broker the tests fail, never pass silently.
#![allow(dead_code)]

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running broker of our own.
#[derive(Debug)]
pub(crate) struct MqttBroker {
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

fn mosquitto() -> PathBuf {
    for candidate in ["/usr/sbin/mosquitto", "/usr/bin/mosquitto", "/usr/local/sbin/mosquitto"] {
        if std::path::Path::new(candidate).exists() {
            return PathBuf::from(candidate);
        }
    }
    panic!("mosquitto is missing: run scripts/test.sh, which installs it (apt-get install mosquitto)");
}

impl MqttBroker {
    /// Starts a new broker with an empty persistence store.
    pub(crate) fn start() -> MqttBroker {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!("highwater-mqtt-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("creating the broker's folder");
        let port = free_port();
        // Unacknowledged QoS 1 messages wait for the job's checkpoints: no
        // in-flight limit; sessions and queued messages persist across a
        // restart of the broker.
        let config = format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\nuser root\npersistence true\n\
             persistence_location {}/\nautosave_interval 1\nmax_inflight_messages 0\nmax_queued_messages 0\n\
             log_dest stderr\n",
            dir.display()
        );
        std::fs::write(dir.join("mosquitto.conf"), config).expect("writing the broker's config");
        let mut broker = MqttBroker { dir, port, child: None };
        broker.resume();
        broker
    }

    /// `host:port`.
    pub(crate) fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Stops the broker (SIGTERM: it saves its sessions and queued messages).
    pub(crate) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let _ = child.wait();
        }
    }

    /// Starts the broker again on its port, with its persistence store.
    pub(crate) fn resume(&mut self) {
        assert!(self.child.is_none(), "the broker is running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("broker.log"))
            .expect("the broker's log");
        let child = Command::new(mosquitto())
            .arg("-c")
            .arg(self.dir.join("mosquitto.conf"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the broker's log"))
            .stderr(log)
            .spawn()
            .expect("starting mosquitto");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("mosquitto exited with {status}: {}", self.log());
            }
            assert!(Instant::now() < deadline, "mosquitto did not listen within 20 s: {}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The broker's log so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("broker.log")).unwrap_or_default()
    }
}

impl Drop for MqttBroker {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
