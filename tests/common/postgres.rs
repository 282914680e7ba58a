//! Throwaway PostgreSQL clusters for the CDC tests: `initdb` into a temporary
//! folder, logical decoding on, a free port on 127.0.0.1, stopped and removed
//! on drop. Needs the server binaries (Debian's `postgresql` package, which
//! scripts/test.sh installs); without them the tests fail, never pass silently.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// A running (or stopped) cluster of our own.
#[derive(Debug)]
pub(crate) struct PgCluster {
    bin: PathBuf,
    root: PathBuf,
    data: PathBuf,
    log: PathBuf,
    port: u16,
    as_postgres: bool,
    running: bool,
}

/// The directory of the newest installed server binaries.
fn find_bin() -> PathBuf {
    if let Some(dir) = std::env::var_os("HIGHWATER_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some((_, bin)) => bin,
        None => panic!(
            "PostgreSQL server binaries not found (/usr/lib/postgresql/*/bin/initdb): run scripts/test.sh, \
             which installs them (apt-get install postgresql), or set HIGHWATER_PG_BIN"
        ),
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

impl PgCluster {
    /// Creates and starts a new cluster.
    pub(crate) fn start() -> PgCluster {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let bin = find_bin();
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let root = std::env::temp_dir().join(format!(
            "highwater-pg-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&root).expect("creating the cluster folder");
        // SAFETY: geteuid has no preconditions.
        let as_postgres = unsafe { libc::geteuid() } == 0;
        if as_postgres {
            // initdb refuses to run as root: the cluster belongs to `postgres`.
            run(Command::new("chown").arg("postgres:postgres").arg(&root), "chown");
        }
        let mut cluster = PgCluster {
            bin,
            data: root.join("data"),
            log: root.join("server.log"),
            root,
            port: free_port(),
            as_postgres,
            running: false,
        };
        let data = cluster.data.clone();
        cluster.pg(
            "initdb",
            &["-D", path(&data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync"],
        );
        let conf = format!(
            "\nlisten_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = '{}'\nwal_level = logical\n\
             max_replication_slots = 10\nmax_wal_senders = 10\nfsync = off\nsynchronous_commit = on\n",
            cluster.port,
            cluster.root.display()
        );
        let conf_path = cluster.data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf_path).expect("reading postgresql.conf");
        text.push_str(&conf);
        std::fs::write(&conf_path, text).expect("writing postgresql.conf");
        cluster.start_again();
        cluster
    }

    /// A cluster shared by the tests running at the same time (stopped when
    /// the last of them drops it).
    pub(crate) fn shared() -> Arc<PgCluster> {
        static SHARED: Mutex<Weak<PgCluster>> = Mutex::new(Weak::new());
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cluster) = shared.upgrade() {
            return cluster;
        }
        let cluster = Arc::new(PgCluster::start());
        *shared = Arc::downgrade(&cluster);
        cluster
    }

    /// Runs a server program (as `postgres` when we are root); panics with
    /// its output if it fails.
    fn pg(&self, program: &str, args: &[&str]) {
        let exe = self.bin.join(program);
        let mut command = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        command.args(args).current_dir(&self.root);
        run(&mut command, program);
    }

    /// Starts the (stopped) cluster again, on the same port.
    pub(crate) fn start_again(&mut self) {
        let (data, log) = (self.data.clone(), self.log.clone());
        let started = Instant::now();
        self.pg("pg_ctl", &["-D", path(&data), "-l", path(&log), "-w", "-t", "60", "start"]);
        self.running = true;
        tracing::info!(port = self.port, "PostgreSQL started in {:?}", started.elapsed());
    }

    /// Stops the cluster (`pg_ctl stop -m fast`: clients are disconnected).
    pub(crate) fn stop(&mut self) {
        let data = self.data.clone();
        self.pg("pg_ctl", &["-D", path(&data), "-w", "-t", "60", "-m", "fast", "stop"]);
        self.running = false;
    }

    /// Makes `user` authenticate with `method` (`md5`, `scram-sha-256`,
    /// `password`) over TCP, ahead of the cluster's `trust` lines, and
    /// reloads the configuration.
    pub(crate) fn require_password(&self, user: &str, method: &str) {
        let hba = self.data.join("pg_hba.conf");
        let text = std::fs::read_to_string(&hba).expect("reading pg_hba.conf");
        std::fs::write(&hba, format!("host all {user} 127.0.0.1/32 {method}\n{text}")).expect("writing pg_hba.conf");
        let data = self.data.clone();
        self.pg("pg_ctl", &["-D", path(&data), "reload"]);
    }

    /// The connection string for the `postgres` database as `user` with `password`.
    pub(crate) fn url_as(&self, user: &str, password: &str) -> String {
        format!("host=127.0.0.1 port={} user={user} password={password} dbname=postgres", self.port)
    }

    /// The port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// The connection string for the `postgres` database.
    pub(crate) fn url(&self) -> String {
        format!("host=127.0.0.1 port={} user=postgres dbname=postgres", self.port)
    }

    /// A new connection; retried for a few seconds (the server may be starting).
    pub(crate) fn client(&self) -> postgres::Client {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match postgres::Client::connect(&self.url(), postgres::NoTls) {
                Ok(client) => return client,
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!("connecting: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("connecting to the test cluster on port {}: {e}", self.port),
            }
        }
    }

    /// The server log, for failure messages.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if self.running {
            let data = self.data.clone();
            let exe = self.bin.join("pg_ctl");
            let mut command = if self.as_postgres {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(&exe);
                c
            } else {
                Command::new(&exe)
            };
            let _ = command.args(["-D", path(&data), "-w", "-m", "immediate", "stop"]).current_dir(&self.root).output();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temporary path")
}

fn run(command: &mut Command, what: &str) {
    let output = command.output().unwrap_or_else(|e| panic!("running {what}: {e}"));
    if !output.status.success() {
        panic!(
            "{what} failed ({}):\n{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// Drops a test's slot (ending the backend that may still hold it), its
/// publication and its tables.
pub(crate) fn drop_objects(client: &mut postgres::Client, slot: &str, publication: &str, tables: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let _ = client.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active",
            &[&slot],
        );
        match client.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        ) {
            Ok(_) => break,
            Err(e) if Instant::now() < deadline => {
                tracing::debug!("dropping slot {slot}: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("dropping slot {slot}: {e}"),
        }
    }
    client.batch_execute(&format!("DROP PUBLICATION IF EXISTS {publication}")).unwrap();
    for table in tables {
        client.batch_execute(&format!("DROP TABLE IF EXISTS {table}")).unwrap();
    }
}
