//! The binary messages of PostgreSQL's built-in `pgoutput` logical decoding
//! plugin, protocol version 1 (text tuple data, no streaming of transactions
//! in progress).
//!
//! Integers are big-endian, strings NUL-terminated UTF-8. See the
//! PostgreSQL manual, "Logical Replication Message Formats".

/// A message that does not follow the protocol.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The message ended early.
    #[error("pgoutput message truncated while reading {0}")]
    Truncated(&'static str),
    /// An empty message.
    #[error("empty pgoutput message")]
    Empty,
    /// A message type this parser does not know.
    #[error("unknown pgoutput message type {0:?}")]
    UnknownMessage(char),
    /// A byte that is not one of those allowed at its place.
    #[error("unexpected {found:?} in {context}")]
    Unexpected {
        /// Where.
        context: &'static str,
        /// The byte found.
        found: char,
    },
    /// A string that is not NUL-terminated UTF-8.
    #[error("malformed string in {0}")]
    BadString(&'static str),
}

/// `Begin`: a transaction starts (sent when its commit is decoded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Begin {
    /// The LSN of the transaction's commit record.
    pub final_lsn: u64,
    /// The commit timestamp, µs since 2000-01-01 00:00 UTC.
    pub commit_time: i64,
    /// The transaction id (32 bits, without epoch).
    pub xid: u32,
}

/// `Commit`: the transaction ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Commit {
    /// Flags (unused, 0).
    pub flags: u8,
    /// The LSN of the commit record.
    pub commit_lsn: u64,
    /// The LSN just past the commit record: decoding from there on skips this transaction.
    pub end_lsn: u64,
    /// The commit timestamp, µs since 2000-01-01 00:00 UTC.
    pub commit_time: i64,
}

/// One column of a [`Relation`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelationColumn {
    /// Part of the replica identity (the key old-key tuples carry).
    pub key: bool,
    /// The column name.
    pub name: String,
    /// The type OID.
    pub type_oid: u32,
    /// The type modifier.
    pub type_modifier: i32,
}

/// `Relation`: the columns of a table, sent before its first change in a
/// session and after it changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relation {
    /// The table's OID.
    pub id: u32,
    /// The schema.
    pub namespace: String,
    /// The table name.
    pub name: String,
    /// `relreplident`: `d` (primary key), `n` (nothing), `f` (full), `i` (index).
    pub replica_identity: u8,
    /// The published columns, in order.
    pub columns: Vec<RelationColumn>,
}

/// One column value of a tuple.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TupleValue<'a> {
    /// NULL.
    Null,
    /// An unchanged TOASTed value: not sent, the old one stays.
    Unchanged,
    /// The value in text form.
    Text(&'a [u8]),
    /// The value in binary form (not requested by this source).
    Binary(&'a [u8]),
}

/// Which old image an update or delete carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OldKind {
    /// `K`: the replica identity columns only (the others are NULL).
    Key,
    /// `O`: the whole old row (`REPLICA IDENTITY FULL`).
    Full,
}

/// A row image.
pub type Tuple<'a> = Vec<TupleValue<'a>>;

/// One pgoutput message; tuple values borrow from the message bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message<'a> {
    /// `B`.
    Begin(Begin),
    /// `C`.
    Commit(Commit),
    /// `O`: the transaction came from another node.
    Origin {
        /// The LSN of the commit on the origin server.
        lsn: u64,
        /// The origin's name.
        name: String,
    },
    /// `R`.
    Relation(Relation),
    /// `Y`: a non-built-in type used by a column.
    Type {
        /// The type OID.
        oid: u32,
        /// Its schema.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// `I`.
    Insert {
        /// The table's OID.
        relation: u32,
        /// The new row.
        new: Tuple<'a>,
    },
    /// `U`.
    Update {
        /// The table's OID.
        relation: u32,
        /// The old key (if it changed) or old row (`REPLICA IDENTITY FULL`).
        old: Option<(OldKind, Tuple<'a>)>,
        /// The new row.
        new: Tuple<'a>,
    },
    /// `D`.
    Delete {
        /// The table's OID.
        relation: u32,
        /// The old key or row.
        old: (OldKind, Tuple<'a>),
    },
    /// `T`.
    Truncate {
        /// The tables' OIDs.
        relations: Vec<u32>,
        /// Option bits: 1 = CASCADE, 2 = RESTART IDENTITY.
        options: u8,
    },
    /// `M`: a message written with `pg_logical_emit_message`.
    Message {
        /// Whether it was transactional.
        transactional: bool,
        /// Its LSN.
        lsn: u64,
        /// Its prefix.
        prefix: String,
        /// Its content.
        content: &'a [u8],
    },
}

struct Cursor<'a> {
    bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ProtocolError> {
        if self.bytes.len() < n {
            return Err(ProtocolError::Truncated(what));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, ProtocolError> {
        Ok(self.take(1, what)?[0])
    }
    fn i16(&mut self, what: &'static str) -> Result<i16, ProtocolError> {
        let b = self.take(2, what)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, ProtocolError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, ProtocolError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    fn string(&mut self, what: &'static str) -> Result<String, ProtocolError> {
        let end = self.bytes.iter().position(|&b| b == 0).ok_or(ProtocolError::BadString(what))?;
        let s = std::str::from_utf8(&self.bytes[..end]).map_err(|_| ProtocolError::BadString(what))?;
        self.bytes = &self.bytes[end + 1..];
        Ok(s.to_owned())
    }
    fn tuple(&mut self) -> Result<Tuple<'a>, ProtocolError> {
        let n = self.i16("tuple column count")?;
        let n = usize::try_from(n).map_err(|_| ProtocolError::Truncated("tuple column count"))?;
        let mut values = Vec::with_capacity(n);
        for _ in 0..n {
            values.push(match self.u8("tuple column kind")? {
                b'n' => TupleValue::Null,
                b'u' => TupleValue::Unchanged,
                kind @ (b't' | b'b') => {
                    let len = self.u32("tuple value length")? as usize;
                    let bytes = self.take(len, "tuple value")?;
                    if kind == b't' {
                        TupleValue::Text(bytes)
                    } else {
                        TupleValue::Binary(bytes)
                    }
                }
                other => return Err(ProtocolError::Unexpected { context: "tuple column kind", found: other as char }),
            });
        }
        Ok(values)
    }
    fn old_tuple(&mut self, kind: u8) -> Result<(OldKind, Tuple<'a>), ProtocolError> {
        let kind = match kind {
            b'K' => OldKind::Key,
            b'O' => OldKind::Full,
            other => return Err(ProtocolError::Unexpected { context: "old tuple kind", found: other as char }),
        };
        Ok((kind, self.tuple()?))
    }
    fn expect(&mut self, byte: u8, context: &'static str) -> Result<(), ProtocolError> {
        match self.u8(context)? {
            b if b == byte => Ok(()),
            other => Err(ProtocolError::Unexpected { context, found: other as char }),
        }
    }
}

/// Parses one pgoutput message (the `data` of one row returned by
/// `pg_logical_slot_peek_binary_changes`).
///
/// ```
/// use highwater::cdc::postgres::pgoutput::{parse, Message};
/// let mut bytes = vec![b'B'];
/// bytes.extend_from_slice(&0x0100u64.to_be_bytes()); // final LSN
/// bytes.extend_from_slice(&1_000_000i64.to_be_bytes()); // commit time
/// bytes.extend_from_slice(&42u32.to_be_bytes()); // xid
/// match parse(&bytes).unwrap() {
///     Message::Begin(begin) => assert_eq!((begin.final_lsn, begin.xid), (0x0100, 42)),
///     other => panic!("{other:?}"),
/// }
/// ```
pub fn parse(bytes: &[u8]) -> Result<Message<'_>, ProtocolError> {
    let (&tag, rest) = bytes.split_first().ok_or(ProtocolError::Empty)?;
    let mut c = Cursor { bytes: rest };
    let message = match tag {
        b'B' => Message::Begin(Begin {
            final_lsn: c.u64("begin LSN")?,
            commit_time: c.u64("begin timestamp")? as i64,
            xid: c.u32("begin xid")?,
        }),
        b'C' => Message::Commit(Commit {
            flags: c.u8("commit flags")?,
            commit_lsn: c.u64("commit LSN")?,
            end_lsn: c.u64("commit end LSN")?,
            commit_time: c.u64("commit timestamp")? as i64,
        }),
        b'O' => Message::Origin { lsn: c.u64("origin LSN")?, name: c.string("origin name")? },
        b'R' => {
            let id = c.u32("relation id")?;
            let namespace = c.string("relation namespace")?;
            let name = c.string("relation name")?;
            let replica_identity = c.u8("relation replica identity")?;
            let n = c.i16("relation column count")?;
            let n = usize::try_from(n).map_err(|_| ProtocolError::Truncated("relation column count"))?;
            let mut columns = Vec::with_capacity(n);
            for _ in 0..n {
                columns.push(RelationColumn {
                    key: c.u8("column flags")? & 1 == 1,
                    name: c.string("column name")?,
                    type_oid: c.u32("column type")?,
                    type_modifier: c.u32("column type modifier")? as i32,
                });
            }
            Message::Relation(Relation { id, namespace, name, replica_identity, columns })
        }
        b'Y' => Message::Type {
            oid: c.u32("type oid")?,
            namespace: c.string("type namespace")?,
            name: c.string("type name")?,
        },
        b'I' => {
            let relation = c.u32("insert relation")?;
            c.expect(b'N', "insert")?;
            Message::Insert { relation, new: c.tuple()? }
        }
        b'U' => {
            let relation = c.u32("update relation")?;
            let old = match c.u8("update")? {
                b'N' => None,
                kind => {
                    let old = c.old_tuple(kind)?;
                    c.expect(b'N', "update")?;
                    Some(old)
                }
            };
            Message::Update { relation, old, new: c.tuple()? }
        }
        b'D' => {
            let relation = c.u32("delete relation")?;
            let kind = c.u8("delete")?;
            Message::Delete { relation, old: c.old_tuple(kind)? }
        }
        b'T' => {
            let n = c.u32("truncate relation count")?;
            let options = c.u8("truncate options")?;
            let relations = (0..n).map(|_| c.u32("truncate relation")).collect::<Result<_, _>>()?;
            Message::Truncate { relations, options }
        }
        b'M' => {
            let transactional = c.u8("message flags")? & 1 == 1;
            let lsn = c.u64("message LSN")?;
            let prefix = c.string("message prefix")?;
            let len = c.u32("message length")? as usize;
            Message::Message { transactional, lsn, prefix, content: c.take(len, "message content")? }
        }
        other => return Err(ProtocolError::UnknownMessage(other as char)),
    };
    Ok(message)
}

/// Builders of protocol messages, for tests.
#[cfg(test)]
pub(crate) mod build {
    /// A message under construction.
    #[derive(Default)]
    pub(crate) struct Msg(pub(crate) Vec<u8>);

    impl Msg {
        pub(crate) fn new(tag: u8) -> Self {
            Msg(vec![tag])
        }
        pub(crate) fn u8(mut self, v: u8) -> Self {
            self.0.push(v);
            self
        }
        pub(crate) fn i16(mut self, v: i16) -> Self {
            self.0.extend_from_slice(&v.to_be_bytes());
            self
        }
        pub(crate) fn u32(mut self, v: u32) -> Self {
            self.0.extend_from_slice(&v.to_be_bytes());
            self
        }
        pub(crate) fn u64(mut self, v: u64) -> Self {
            self.0.extend_from_slice(&v.to_be_bytes());
            self
        }
        pub(crate) fn str(mut self, s: &str) -> Self {
            self.0.extend_from_slice(s.as_bytes());
            self.0.push(0);
            self
        }
        /// A tuple: `None` is NULL, `Some("\u{0}u")` is unchanged TOAST, else text.
        pub(crate) fn tuple(mut self, values: &[Option<&str>]) -> Self {
            self = self.i16(values.len() as i16);
            for v in values {
                match v {
                    None => self = self.u8(b'n'),
                    Some("\u{0}u") => self = self.u8(b'u'),
                    Some(text) => self = self.u8(b't').u32(text.len() as u32).raw(text.as_bytes()),
                }
            }
            self
        }
        pub(crate) fn raw(mut self, bytes: &[u8]) -> Self {
            self.0.extend_from_slice(bytes);
            self
        }
    }

    pub(crate) fn begin(lsn: u64, time: i64, xid: u32) -> Vec<u8> {
        Msg::new(b'B').u64(lsn).u64(time as u64).u32(xid).0
    }
    pub(crate) fn commit(lsn: u64, end: u64, time: i64) -> Vec<u8> {
        Msg::new(b'C').u8(0).u64(lsn).u64(end).u64(time as u64).0
    }
    /// A relation `public.<name>` with `(name, type oid, key)` columns.
    pub(crate) fn relation(id: u32, name: &str, identity: u8, columns: &[(&str, u32, bool)]) -> Vec<u8> {
        let mut m = Msg::new(b'R').u32(id).str("public").str(name).u8(identity).i16(columns.len() as i16);
        for (n, oid, key) in columns {
            m = m.u8(u8::from(*key)).str(n).u32(*oid).u32(u32::MAX);
        }
        m.0
    }
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;

    #[test]
    fn transaction_messages() {
        assert_eq!(
            parse(&begin(0x10, -5, 7)).unwrap(),
            Message::Begin(Begin { final_lsn: 0x10, commit_time: -5, xid: 7 })
        );
        assert_eq!(
            parse(&commit(0x10, 0x40, 9)).unwrap(),
            Message::Commit(Commit { flags: 0, commit_lsn: 0x10, end_lsn: 0x40, commit_time: 9 })
        );
        let origin = Msg::new(b'O').u64(3).str("node").0;
        assert_eq!(parse(&origin).unwrap(), Message::Origin { lsn: 3, name: "node".into() });
        let ty = Msg::new(b'Y').u32(16_400).str("public").str("mood").0;
        assert_eq!(parse(&ty).unwrap(), Message::Type { oid: 16_400, namespace: "public".into(), name: "mood".into() });
    }

    #[test]
    fn relation() {
        let bytes = super::build::relation(99, "t", b'd', &[("id", 23, true), ("v", 25, false)]);
        let Message::Relation(r) = parse(&bytes).unwrap() else { panic!() };
        assert_eq!((r.id, r.namespace.as_str(), r.name.as_str(), r.replica_identity), (99, "public", "t", b'd'));
        assert_eq!(
            r.columns,
            vec![
                RelationColumn { key: true, name: "id".into(), type_oid: 23, type_modifier: -1 },
                RelationColumn { key: false, name: "v".into(), type_oid: 25, type_modifier: -1 },
            ]
        );
    }

    #[test]
    fn row_changes() {
        let insert = Msg::new(b'I').u32(99).u8(b'N').tuple(&[Some("1"), None, Some("\u{0}u")]).0;
        assert_eq!(
            parse(&insert).unwrap(),
            Message::Insert {
                relation: 99,
                new: vec![TupleValue::Text(b"1"), TupleValue::Null, TupleValue::Unchanged]
            }
        );
        let plain = Msg::new(b'U').u32(99).u8(b'N').tuple(&[Some("1")]).0;
        assert_eq!(
            parse(&plain).unwrap(),
            Message::Update { relation: 99, old: None, new: vec![TupleValue::Text(b"1")] }
        );
        let keyed = Msg::new(b'U').u32(99).u8(b'K').tuple(&[Some("1"), None]).u8(b'N').tuple(&[Some("2"), Some("")]).0;
        assert_eq!(
            parse(&keyed).unwrap(),
            Message::Update {
                relation: 99,
                old: Some((OldKind::Key, vec![TupleValue::Text(b"1"), TupleValue::Null])),
                new: vec![TupleValue::Text(b"2"), TupleValue::Text(b"")]
            }
        );
        let full = Msg::new(b'D').u32(99).u8(b'O').tuple(&[Some("1"), Some("x")]).0;
        assert_eq!(
            parse(&full).unwrap(),
            Message::Delete {
                relation: 99,
                old: (OldKind::Full, vec![TupleValue::Text(b"1"), TupleValue::Text(b"x")])
            }
        );
        let truncate = Msg::new(b'T').u32(2).u8(1).u32(5).u32(6).0;
        assert_eq!(parse(&truncate).unwrap(), Message::Truncate { relations: vec![5, 6], options: 1 });
    }

    #[test]
    fn malformed_messages_are_errors() {
        assert_eq!(parse(&[]), Err(ProtocolError::Empty));
        assert_eq!(parse(b"Z"), Err(ProtocolError::UnknownMessage('Z')));
        let full = begin(1, 2, 3);
        for cut in 1..full.len() {
            assert!(matches!(parse(&full[..cut]), Err(ProtocolError::Truncated(_))), "cut at {cut}");
        }
        let bad_kind = Msg::new(b'I').u32(1).u8(b'N').i16(1).u8(b'x').0;
        assert!(matches!(parse(&bad_kind), Err(ProtocolError::Unexpected { found: 'x', .. })));
        let too_long = Msg::new(b'I').u32(1).u8(b'N').i16(1).u8(b't').u32(1_000).raw(b"abc").0;
        assert_eq!(parse(&too_long), Err(ProtocolError::Truncated("tuple value")));
        let unterminated = Msg::new(b'O').u64(1).raw(b"abc").0;
        assert_eq!(parse(&unterminated), Err(ProtocolError::BadString("origin name")));
        let bad_delete = Msg::new(b'D').u32(1).u8(b'N').tuple(&[]).0;
        assert!(matches!(parse(&bad_delete), Err(ProtocolError::Unexpected { found: 'N', .. })));
    }
}
