//! A replication connection (`replication=database`) that creates the slot
//! and exports its snapshot.
//!
//! The `postgres` crate cannot open a replication session (it sends no
//! `replication` start-up parameter), so this speaks the few messages needed
//! itself, over TCP or a Unix socket, without TLS like the rest of the
//! source: start-up, authentication (trust, cleartext, MD5, SCRAM-SHA-256;
//! the hashing and the SCRAM exchange, with SASLprep of the password, are
//! the `postgres-protocol` crate's, as in the `postgres` client) and one
//! simple query, `CREATE_REPLICATION_SLOT … LOGICAL
//! pgoutput EXPORT_SNAPSHOT`. The exported snapshot stays valid while the
//! connection is open and runs no other command; `snapshot.rs` says why it
//! makes the snapshot and the stream exactly consistent.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::str::FromStr;
use std::time::Duration;

use postgres::config::{Host, SslMode};
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256, SCRAM_SHA_256};

use super::error::Failure;
use super::lsn::parse_lsn;

/// The protocol version 3.0.
const PROTOCOL_VERSION: i32 = 196_608;
/// The largest message accepted from the server.
const MAX_MESSAGE: usize = 64 << 20;

enum Stream {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(std::os::unix::net::UnixStream),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            #[cfg(unix)]
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            #[cfg(unix)]
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            #[cfg(unix)]
            Stream::Unix(s) => s.flush(),
        }
    }
}

/// A server error: its SQLSTATE and message.
#[derive(Debug)]
struct ServerError {
    code: String,
    message: String,
}

/// What a slot created with an exported snapshot gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CreatedSlot {
    /// The consistent point: the stream holds exactly the transactions
    /// committing from here on.
    pub(crate) consistent: u64,
    /// The exported snapshot's name, for `SET TRANSACTION SNAPSHOT`.
    pub(crate) snapshot: String,
}

/// An open replication connection.
pub(crate) struct ReplicationConnection {
    stream: Stream,
}

impl std::fmt::Debug for ReplicationConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicationConnection").finish_non_exhaustive()
    }
}

impl Drop for ReplicationConnection {
    fn drop(&mut self) {
        // Terminate; the server ends the session (and the exported snapshot).
        let _ = self.stream.write_all(&[b'X', 0, 0, 0, 4]);
    }
}

fn io_retry(what: &str, e: std::io::Error) -> Failure {
    Failure::Retry(format!("replication connection: {what}: {e}"))
}

impl ReplicationConnection {
    /// Connects with the settings of the connection string `url` (its
    /// hosts in order, port, user, password, database, connect timeout).
    pub(crate) fn connect(url: &str) -> Result<ReplicationConnection, Failure> {
        let config =
            postgres::Config::from_str(url).map_err(|e| Failure::config(format!("invalid connection string: {e}")))?;
        if config.get_ssl_mode() == SslMode::Require {
            return Err(Failure::config("sslmode=require: the postgres source does not support TLS"));
        }
        let user = match config.get_user() {
            Some(user) => user.to_owned(),
            None => {
                std::env::var("USER").map_err(|_| Failure::config("the connection string names no user (user=…)"))?
            }
        };
        let timeout = config.get_connect_timeout().copied().unwrap_or(Duration::from_secs(10));
        let stream = Self::open_stream(&config, timeout)?;
        let mut connection = ReplicationConnection { stream };
        connection.start_up(&config, &user)?;
        Ok(connection)
    }

    fn open_stream(config: &postgres::Config, timeout: Duration) -> Result<Stream, Failure> {
        let hosts = config.get_hosts();
        let addrs = config.get_hostaddrs();
        let ports = config.get_ports();
        let count = hosts.len().max(addrs.len());
        if count == 0 {
            return Err(Failure::config("the connection string names no host"));
        }
        let mut last = None;
        for i in 0..count {
            let port = ports.get(i).or_else(|| ports.first()).copied().unwrap_or(5432);
            let result = match (addrs.get(i), hosts.get(i)) {
                (Some(ip), _) => TcpStream::connect_timeout(&(*ip, port).into(), timeout).map(Stream::Tcp),
                (None, Some(Host::Tcp(name))) => Self::connect_tcp(name, port, timeout),
                #[cfg(unix)]
                (None, Some(Host::Unix(dir))) => {
                    std::os::unix::net::UnixStream::connect(dir.join(format!(".s.PGSQL.{port}"))).map(Stream::Unix)
                }
                (None, None) => continue,
            };
            match result {
                Ok(stream) => {
                    if let Stream::Tcp(s) = &stream {
                        let _ = s.set_nodelay(true);
                    }
                    return Ok(stream);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(io_retry("connecting", last.unwrap_or_else(|| std::io::Error::other("no address"))))
    }

    fn connect_tcp(name: &str, port: u16, timeout: Duration) -> std::io::Result<Stream> {
        let mut last = None;
        for addr in (name, port).to_socket_addrs()? {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(s) => return Ok(Stream::Tcp(s)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other(format!("{name} has no address"))))
    }

    fn send(&mut self, tag: Option<u8>, body: &[u8]) -> Result<(), Failure> {
        let mut message = Vec::with_capacity(body.len() + 5);
        message.extend(tag);
        let length = i32::try_from(body.len() + 4).map_err(|_| Failure::config("message too long"))?;
        message.extend_from_slice(&length.to_be_bytes());
        message.extend_from_slice(body);
        self.stream.write_all(&message).map_err(|e| io_retry("sending", e))
    }

    /// The next message: its tag and body.
    fn receive(&mut self) -> Result<(u8, Vec<u8>), Failure> {
        let mut header = [0u8; 5];
        self.stream.read_exact(&mut header).map_err(|e| io_retry("receiving", e))?;
        let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if !(4..=MAX_MESSAGE).contains(&length) {
            return Err(Failure::invalid("the replication connection", format!("message length {length}")));
        }
        let mut body = vec![0u8; length - 4];
        self.stream.read_exact(&mut body).map_err(|e| io_retry("receiving", e))?;
        Ok((header[0], body))
    }

    fn start_up(&mut self, config: &postgres::Config, user: &str) -> Result<(), Failure> {
        let mut body = PROTOCOL_VERSION.to_be_bytes().to_vec();
        let mut params = vec![("user", user), ("replication", "database"), ("client_encoding", "UTF8")];
        params.push(("application_name", config.get_application_name().unwrap_or("highwater-cdc")));
        if let Some(db) = config.get_dbname() {
            params.push(("database", db));
        }
        if let Some(options) = config.get_options() {
            params.push(("options", options));
        }
        for (key, value) in params {
            if value.contains('\0') {
                return Err(Failure::config(format!("connection setting {key} contains a NUL character")));
            }
            body.extend_from_slice(key.as_bytes());
            body.push(0);
            body.extend_from_slice(value.as_bytes());
            body.push(0);
        }
        body.push(0);
        self.send(None, &body)?;
        let password =
            || config.get_password().ok_or_else(|| Failure::config("the server asks for a password and none is given"));
        let mut scram = ScramState::NotBegun;
        loop {
            let (tag, body) = self.receive()?;
            match tag {
                b'R' => {
                    let mut reader = Reader::new(&body);
                    let code = reader.i32()?;
                    match code {
                        0 => {
                            // A SCRAM exchange ends with the server's proof
                            // that it knows the password: without it, the
                            // server is not who it claims to be.
                            if matches!(scram, ScramState::Started(_)) {
                                return Err(Failure::invalid(
                                    "SCRAM authentication",
                                    "the server accepted the login without proving it knows the password",
                                ));
                            }
                        }
                        3 => {
                            let mut answer = password()?.to_vec();
                            answer.push(0);
                            self.send(Some(b'p'), &answer)?;
                        }
                        5 => {
                            let salt = reader.take(4)?;
                            let salt = [salt[0], salt[1], salt[2], salt[3]];
                            let mut answer = md5_hash(user.as_bytes(), password()?, salt).into_bytes();
                            answer.push(0);
                            self.send(Some(b'p'), &answer)?;
                        }
                        10 => {
                            let mut mechanisms = Vec::new();
                            while let Some(m) = reader.cstr().ok().filter(|m| !m.is_empty()) {
                                mechanisms.push(m);
                            }
                            if !mechanisms.iter().any(|m| m == SCRAM_SHA_256) {
                                return Err(Failure::config(format!(
                                    "replication connection: the server offers SASL mechanisms {mechanisms:?}, \
                                     none of which is supported ({SCRAM_SHA_256})"
                                )));
                            }
                            // Without TLS there is no channel to bind to: the
                            // client says it does not support binding ("n").
                            let exchange = ScramSha256::new(password()?, ChannelBinding::unsupported());
                            let first = exchange.message();
                            let mut answer = SCRAM_SHA_256.as_bytes().to_vec();
                            answer.push(0);
                            answer.extend_from_slice(&(first.len() as i32).to_be_bytes());
                            answer.extend_from_slice(first);
                            self.send(Some(b'p'), &answer)?;
                            scram = ScramState::Started(exchange);
                        }
                        11 => {
                            let ScramState::Started(exchange) = &mut scram else {
                                return Err(unexpected("SASLContinue"));
                            };
                            exchange.update(reader.rest()).map_err(|e| Failure::invalid("SCRAM authentication", e))?;
                            self.send(Some(b'p'), exchange.message())?;
                        }
                        12 => {
                            let ScramState::Started(exchange) = &mut scram else {
                                return Err(unexpected("SASLFinal"));
                            };
                            exchange.finish(reader.rest()).map_err(|e| Failure::invalid("SCRAM authentication", e))?;
                            scram = ScramState::Verified;
                        }
                        other => {
                            return Err(Failure::config(format!(
                                "replication connection: authentication method {other} is not supported \
                                 (trust, password, md5 and scram-sha-256 are)"
                            )))
                        }
                    }
                }
                b'E' => return Err(server_failure(parse_error(&body))),
                b'Z' => return Ok(()),
                // Parameter status, backend key, notices.
                _ => {}
            }
        }
    }

    /// Runs one simple query; returns its rows (text values).
    fn simple_query(&mut self, query: &str) -> Result<Vec<Vec<Option<String>>>, Failure> {
        let mut body = query.as_bytes().to_vec();
        body.push(0);
        self.send(Some(b'Q'), &body)?;
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            let (tag, body) = self.receive()?;
            match tag {
                b'D' => {
                    let mut reader = Reader::new(&body);
                    let count = reader.i16()?;
                    let mut row = Vec::new();
                    for _ in 0..count {
                        let length = reader.i32()?;
                        row.push(if length < 0 {
                            None
                        } else {
                            Some(String::from_utf8_lossy(reader.take(length as usize)?).into_owned())
                        });
                    }
                    rows.push(row);
                }
                b'E' => error = Some(parse_error(&body)),
                b'Z' => break,
                // Row description, command complete, notices.
                _ => {}
            }
        }
        match error {
            Some(e) => Err(server_failure(e)),
            None => Ok(rows),
        }
    }

    /// Creates the persistent pgoutput slot `slot` and exports its snapshot,
    /// valid until this connection runs another command or closes.
    pub(crate) fn create_slot(&mut self, slot: &str) -> Result<CreatedSlot, Failure> {
        // The slot name was checked (lower-case letters, digits, _); the old
        // syntax works from PostgreSQL 10 on.
        let rows =
            self.simple_query(&format!("CREATE_REPLICATION_SLOT \"{slot}\" LOGICAL pgoutput EXPORT_SNAPSHOT"))?;
        let bad = || Failure::invalid("creating the slot", "unexpected result of CREATE_REPLICATION_SLOT");
        let row = rows.first().ok_or_else(bad)?;
        let consistent = row.get(1).and_then(|v| v.as_deref()).and_then(parse_lsn).ok_or_else(bad)?;
        let snapshot = row.get(2).and_then(|v| v.clone()).ok_or_else(bad)?;
        Ok(CreatedSlot { consistent, snapshot })
    }
}

/// Where a SCRAM exchange is.
enum ScramState {
    /// None begun.
    NotBegun,
    /// Begun, the server not yet verified.
    Started(ScramSha256),
    /// The server proved that it knows the password.
    Verified,
}

fn unexpected(what: &str) -> Failure {
    Failure::invalid("the replication connection", format!("unexpected {what}"))
}

/// The fields of an error response.
fn parse_error(body: &[u8]) -> ServerError {
    let mut error = ServerError { code: String::new(), message: String::new() };
    let mut reader = Reader::new(body);
    while let Ok(field) = reader.take(1) {
        let field = field[0];
        if field == 0 {
            break;
        }
        let Ok(value) = reader.cstr() else { break };
        match field {
            b'C' => error.code = value,
            b'M' => error.message = value,
            _ => {}
        }
    }
    error
}

/// Server errors are retried or fatal as in `error.rs`.
fn server_failure(e: ServerError) -> Failure {
    let text = format!("replication connection: {} (SQLSTATE {})", e.message, e.code);
    if super::error::retryable_code(&e.code) {
        Failure::Retry(text)
    } else {
        Failure::config(text)
    }
}

/// Reads a message body.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Failure> {
        if self.bytes.len() < n {
            return Err(unexpected("end of a message"));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    fn i16(&mut self) -> Result<i16, Failure> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn i32(&mut self) -> Result<i32, Failure> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn cstr(&mut self) -> Result<String, Failure> {
        let end = self.bytes.iter().position(|&b| b == 0).ok_or_else(|| unexpected("unterminated string"))?;
        let text = String::from_utf8_lossy(&self.bytes[..end]).into_owned();
        self.bytes = &self.bytes[end + 1..];
        Ok(text)
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_fields() {
        let e = parse_error(b"SERROR\0C42704\0Mslot \"x\" does not exist\0\0");
        assert_eq!((e.code.as_str(), e.message.as_str()), ("42704", "slot \"x\" does not exist"));
        // Truncated input gives what was there, no panic.
        let e = parse_error(b"C08006\0Mgone");
        assert_eq!((e.code.as_str(), e.message.as_str()), ("08006", ""));
        assert!(matches!(server_failure(e), Failure::Retry(_)));
    }

    /// A fake server on 127.0.0.1 for one client: reads the start-up
    /// message and hands the connection to `script`.
    fn fake_server<T: Send + 'static>(
        script: impl FnOnce(&mut TcpStream) -> T + Send + 'static,
    ) -> (String, std::thread::JoinHandle<T>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut length = [0u8; 4];
            s.read_exact(&mut length).unwrap();
            let mut startup = vec![0u8; u32::from_be_bytes(length) as usize - 4];
            s.read_exact(&mut startup).unwrap();
            let result = script(&mut s);
            // Let the client read everything before the connection closes.
            let _ = s.read(&mut [0u8; 1]);
            result
        });
        (format!("host=127.0.0.1 port={port} user=md5_user password=password connect_timeout=5"), server)
    }

    /// Reads a password message (`p`) from the client.
    fn answer(s: &mut TcpStream) -> Vec<u8> {
        let mut header = [0u8; 5];
        s.read_exact(&mut header).unwrap();
        assert_eq!(header[0], b'p');
        let mut body = vec![0u8; u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize - 4];
        s.read_exact(&mut body).unwrap();
        body
    }

    fn auth(s: &mut TcpStream, code: i32, rest: &[u8]) {
        let mut m = vec![b'R'];
        m.extend_from_slice(&(rest.len() as i32 + 8).to_be_bytes());
        m.extend_from_slice(&code.to_be_bytes());
        m.extend_from_slice(rest);
        s.write_all(&m).unwrap();
    }

    fn ok_and_ready(s: &mut TcpStream) {
        auth(s, 0, b"");
        s.write_all(&[b'Z', 0, 0, 0, 5, b'I']).unwrap();
    }

    #[test]
    fn trust_cleartext_and_md5_logins() {
        let (url, server) = fake_server(ok_and_ready);
        drop(ReplicationConnection::connect(&url).unwrap());
        server.join().unwrap();

        let (url, server) = fake_server(|s| {
            auth(s, 3, b"");
            let password = answer(s);
            ok_and_ready(s);
            password
        });
        drop(ReplicationConnection::connect(&url).unwrap());
        assert_eq!(server.join().unwrap(), b"password\0");

        // postgres-protocol's own vector: user md5_user, password "password".
        let (url, server) = fake_server(|s| {
            auth(s, 5, &[0x2a, 0x3d, 0x8f, 0xe0]);
            let hash = answer(s);
            ok_and_ready(s);
            hash
        });
        drop(ReplicationConnection::connect(&url).unwrap());
        assert_eq!(server.join().unwrap(), b"md562af4dd09bbb41884907a838a3233294\0");
    }

    /// Runs a SCRAM exchange up to the client's proof, then `end`. Returns
    /// the client's initial response and final message.
    fn scram_exchange(end: fn(&mut TcpStream)) -> (Result<ReplicationConnection, Failure>, (Vec<u8>, Vec<u8>)) {
        let (url, server) = fake_server(move |s| {
            auth(s, 10, b"SCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0");
            let initial = answer(s);
            let first = String::from_utf8(initial[initial.len() - 32..].to_vec()).unwrap();
            let nonce = first.split_once("r=").unwrap().1.to_owned();
            auth(s, 11, format!("r={nonce}server,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096").as_bytes());
            let last = answer(s);
            end(s);
            (initial, last)
        });
        let connection = ReplicationConnection::connect(&url);
        (connection, server.join().unwrap())
    }

    #[test]
    fn scram_requires_the_server_to_prove_it_knows_the_password() {
        // The client asks for SCRAM-SHA-256 without channel binding ("n,,":
        // there is no TLS), leaves the user name to the start-up message and
        // answers with a proof.
        let (result, (initial, last)) = scram_exchange(|s| {
            auth(s, 12, b"v=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=");
        });
        let prefix = b"SCRAM-SHA-256\0";
        assert_eq!(&initial[..prefix.len()], prefix);
        let first = std::str::from_utf8(&initial[prefix.len() + 4..]).unwrap();
        assert!(first.starts_with("n,,n=,r="), "{first}");
        let last = std::str::from_utf8(&last).unwrap();
        assert!(last.starts_with("c=biws,r=") && last.contains("server,p="), "{last}");
        // A wrong server signature is refused.
        let e = result.unwrap_err().to_string();
        assert!(e.contains("SCRAM"), "{e}");
        // So is a login accepted without the server's signature.
        let (result, _) = scram_exchange(ok_and_ready);
        let e = result.unwrap_err().to_string();
        assert!(e.contains("without proving"), "{e}");
    }

    #[test]
    fn reader_refuses_short_input() {
        let mut r = Reader::new(&[0, 1]);
        assert!(r.i32().is_err());
        assert_eq!(r.i16().unwrap(), 1);
        assert!(r.cstr().is_err());
    }
}
