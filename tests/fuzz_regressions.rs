//! The fuzz targets' inputs on the stable toolchain: every minimized crash
//! under `tests/fuzz/<target>/` and every seed (those built here and those
//! under `fuzz/seeds/<target>/`) goes through the same harness as the
//! `cargo fuzz` target of that name (`highwater::fuzzing`), which panics if
//! the parser panics or an invariant breaks, and gives the outcome that the
//! input must have.
//!
//! `cargo test --test fuzz_regressions -- --ignored write_seeds` writes the
//! seeds built here to `fuzz/seeds/` (see TESTING.md).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use highwater::cdc::postgres::pgoutput::{Begin, Commit, Message, OldKind, Relation, RelationColumn, TupleValue};
use highwater::checkpoint::{FileInfo, Manifest, PartitionState, ShardInfo, SinkPart, FORMAT_VERSION};
use highwater::fuzzing::{self, Outcome};
use highwater::nexmark::{write_event, Auction, Bid, Event, Person};
use highwater::operators::checkpoint::encode_chunk;

type Harness = fn(&[u8]) -> Outcome;

/// The targets, by the name of their `cargo fuzz` target and directories.
const TARGETS: [(&str, Harness); 9] = [
    ("json_lines", fuzzing::json_lines),
    ("nexmark", fuzzing::nexmark),
    ("nexmark_fast", fuzzing::nexmark_fast),
    ("debezium", fuzzing::debezium),
    ("pgoutput", fuzzing::pgoutput),
    ("cep", fuzzing::cep),
    ("manifest", fuzzing::manifest),
    ("shard_chunk", fuzzing::shard_chunk),
    ("shard_file", fuzzing::shard_file),
];

/// What each minimized crash under `tests/fuzz/<target>/` must give now: the
/// target, the file name, and whether it is accepted (else rejected with an
/// error containing the text).
const CRASHES: &[(&str, &str, Result<(), &str>)] = &[
    // Thousands of `(` overflowed the recursive-descent parser's stack.
    ("cep", "stack-overflow-nested-parens", Err("nests more than 64")),
    // A body with a file size of u64::MAX: Manifest::state_bytes overflowed.
    ("manifest", "overflow-state-bytes", Ok(())),
    // Inserts whose text value, read as a time, a timestamptz or a date,
    // overflowed in PgType::parse (the message itself is well formed).
    ("pgoutput", "overflow-time-hours", Ok(())),
    ("pgoutput", "overflow-utc-offset", Ok(())),
    ("pgoutput", "overflow-year", Ok(())),
    // A chunk whose length varint is overlong (`f8 f8 f8 00`): postcard reads
    // it as the canonical `f8 f8 78`, so it stands for the same entries; the
    // harness had demanded the canonical bytes.
    ("shard_chunk", "overlong-varint", Ok(())),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The files of `dir` (none if it does not exist), sorted by name.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<(String, Vec<u8>)> = entries
        .map(|e| e.expect("listing a directory").path())
        .filter(|p| p.is_file())
        .map(|p| {
            let name = p.file_name().expect("a file name").to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display())))
        })
        .collect();
    out.sort();
    out
}

fn harness(target: &str) -> Harness {
    TARGETS.iter().find(|(t, _)| *t == target).unwrap_or_else(|| panic!("no target {target}")).1
}

#[test]
fn minimized_crashes_give_their_outcome() {
    let mut seen = 0;
    for (target, run) in TARGETS {
        for (name, bytes) in files(&root().join("tests/fuzz").join(target)) {
            let expected = CRASHES
                .iter()
                .find(|(t, n, _)| *t == target && *n == name)
                .unwrap_or_else(|| panic!("tests/fuzz/{target}/{name} has no entry in CRASHES"))
                .2;
            let outcome = run(&bytes);
            match (expected, &outcome) {
                (Ok(()), Outcome::Accepted) => {}
                (Err(text), Outcome::Rejected(error)) if error.contains(text) => {}
                _ => panic!("tests/fuzz/{target}/{name}: expected {expected:?}, got {outcome:?}"),
            }
            seen += 1;
        }
    }
    assert_eq!(seen, CRASHES.len(), "an entry of CRASHES has no file");
}

#[test]
fn seeds_give_their_outcome() {
    let mut seeds = seeds();
    for (target, _) in TARGETS {
        for (name, bytes) in files(&root().join("fuzz/seeds").join(target)) {
            seeds.push((target, name, bytes));
        }
    }
    for (target, name, bytes) in &seeds {
        let outcome = harness(target)(bytes);
        // A seed named bad-* is an input that must be rejected.
        assert_eq!(outcome.is_accepted(), !name.starts_with("bad-"), "seed {target}/{name}: {outcome:?}");
    }
    for (target, _) in TARGETS {
        assert!(seeds.iter().any(|(t, ..)| *t == target), "no seed for {target}");
    }
}

#[test]
fn harnesses_reject_garbage_without_panicking() {
    let garbage: [&[u8]; 6] = [b"", b"\0", b"\xff\xfe", b"{", b"[[[[[[[[", b"null"];
    for (target, run) in TARGETS {
        for g in garbage {
            let _ = run(g);
        }
        assert!(!run(b"\xff{\xff{").is_accepted(), "{target} accepted garbage");
    }
}

/// Writes the seeds built by [`seeds`] to `fuzz/seeds/<target>/`.
#[test]
#[ignore = "writes files: run by hand when the seeds change"]
fn write_seeds() {
    for (target, name, bytes) in seeds() {
        let dir = root().join("fuzz/seeds").join(target);
        std::fs::create_dir_all(&dir).expect("creating a seed directory");
        std::fs::write(dir.join(name), bytes).expect("writing a seed");
    }
}

/// A few valid (and, named bad-*, invalid) inputs per target, from the
/// project's fixtures and examples and the formats' writers.
fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out: Vec<(&'static str, String, Vec<u8>)> = Vec::new();
    let mut add = |target: &'static str, name: &str, bytes: Vec<u8>| out.push((target, name.to_owned(), bytes));
    let read = |path: &str| std::fs::read(root().join(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"));

    // JSON Lines of clicks: two parameter bytes (blocks, records per read), then the file.
    let clicks = concat!(
        r#"{"user":"ann","time":1700000000000,"page":{"kind":"home"}}"#,
        "\n",
        r#"{"user":"bob","time":1700000005000,"page":{"kind":"item","id":7},"tags":["a","b"],"delta":-3}"#,
        "\r\n\n",
        r#"{"user":"c\u00e9c\"ile","time":1700000006000}"#,
        "\n",
        r#"  {"time":1700000060000, "user":"ann", "tags":[]}"#,
    );
    add("json_lines", "clicks", [b"\x03\x02".as_slice(), clicks.as_bytes()].concat());
    add("json_lines", "one-block", [b"\x00\x07".as_slice(), clicks.as_bytes(), b"\n"].concat());
    let bad = concat!(
        r#"{"user":"ann","time":1}"#,
        "\nnot json\n",
        r#"{"user":"cid","time":"yesterday"}"#,
        "\n",
        r#"{"user":"dan","time":2,"extra":1}"#,
        "\n"
    );
    add("json_lines", "bad-dead-letters", [b"\x05\x01".as_slice(), bad.as_bytes()].concat());

    // Nexmark: one event of each kind, as the writer writes them.
    let person = Person {
        id: 1000,
        name: "Peter Jones".into(),
        email_address: "pj@example.com".into(),
        credit_card: "1234 5678 9012 3456".into(),
        city: "Boise".into(),
        state: "ID".into(),
        date_time: 1_704_067_200_000,
        extra: "x".into(),
    };
    let auction = Auction {
        id: 1000,
        item_name: "clock".into(),
        description: "old \"clock\"\n".into(),
        initial_bid: 100,
        reserve: 250,
        date_time: 1_704_067_201_000,
        expires: 1_704_067_211_000,
        seller: 1000,
        category: 10,
        extra: String::new(),
    };
    let bid = Bid {
        auction: 1000,
        bidder: 1001,
        price: 16_637,
        channel: "Google".into(),
        url: "https://www.nexmark.com/a/b/c/item.htm?query=1".into(),
        date_time: 1_704_067_203_456,
        extra: "é".into(),
    };
    for (name, event) in [
        ("person", Event::Person(Box::new(person))),
        ("auction", Event::Auction(Box::new(auction))),
        ("bid", Event::Bid(bid)),
    ] {
        let mut line = Vec::new();
        write_event(&mut line, &event).expect("writing to a Vec");
        add("nexmark", name, line.clone());
        add("nexmark_fast", name, line);
    }
    add("nexmark", "bad-wrong-key", br#"{"event_type":1,"bid":{}}"#.to_vec());
    add("nexmark", "bad-type", br#"{"event_type":3}"#.to_vec());
    // The fast path's edges: whitespace, another key order, an escape, numbers
    // it leaves to serde_json, a repeated key.
    let bid = r#"{"event_type":2,"bid":{"auction":1000,"bidder":1001,"price":16637,"channel":"Google","url":"u","dateTime":1704067203456,"extra":""}}"#;
    add("nexmark_fast", "spaced", bid.replace(',', " ,\t").replace(':', " : ").into_bytes());
    add(
        "nexmark_fast",
        "bid-first",
        br#"{"bid":{"auction":1,"bidder":2,"price":3,"channel":"c","url":"u","dateTime":4,"extra":""},"event_type":2}"#
            .to_vec(),
    );
    add("nexmark_fast", "escape", bid.replace("Google", "Goo\\u0067le").into_bytes());
    add("nexmark_fast", "bad-leading-zero", bid.replace("16637", "016637").into_bytes());
    add("nexmark_fast", "bad-negative-zero", bid.replace("16637", "-0").into_bytes());
    add("nexmark_fast", "bad-fraction", bid.replace("16637", "16637.0").into_bytes());
    add("nexmark_fast", "bad-big", bid.replace("16637", "9223372036854775808").into_bytes());
    add("nexmark_fast", "bad-repeated", bid.replace("\"price\"", "\"price\":1,\"price\"").into_bytes());
    add("nexmark_fast", "bad-control", bid.replace("Google", "Go\togle").into_bytes());

    // Debezium: fixture lines (with and without a schema), and every logical type.
    let customers = read("tests/fixtures/debezium/customers.jsonl");
    let lines: Vec<&[u8]> = customers.split(|b| *b == b'\n').filter(|l| !l.is_empty()).collect();
    add("debezium", "schemaless", lines.iter().find(|l| !l.starts_with(b"{\"schema\"")).expect("a line").to_vec());
    add("debezium", "with-schema", lines.iter().find(|l| l.starts_with(b"{\"schema\"")).expect("a line").to_vec());
    let typed = r#"{"schema":{"type":"struct","fields":[{"type":"struct","field":"after","fields":[
        {"type":"int64","field":"id"},{"type":"bytes","field":"b"},{"type":"float64","field":"f"},
        {"type":"boolean","field":"ok"},{"type":"string","name":"io.debezium.data.Uuid","field":"u"},
        {"type":"string","name":"io.debezium.data.Json","field":"j"},
        {"type":"int64","name":"io.debezium.time.NanoTimestamp","field":"nt"},
        {"type":"int64","name":"io.debezium.time.Timestamp","field":"ts"},
        {"type":"int64","name":"io.debezium.time.MicroTime","field":"mt"},
        {"type":"int32","name":"io.debezium.time.Date","field":"d"},
        {"type":"struct","name":"io.debezium.data.VariableScaleDecimal","field":"v"},
        {"type":"bytes","name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":3},"field":"dec"}]}]},
        "payload":{"op":"r","before":null,"after":{"id":7,"b":"AAE=","f":1.5,"ok":true,
        "u":"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11","j":"{\"a\":1}","nt":1000000,"ts":5,"mt":6,"d":-1,
        "v":{"scale":2,"value":"BNI="},"dec":"+w=="},"source":{"ts_ms":9,"db":"shop","table":"t","lsn":77}}}"#;
    add("debezium", "logical-types", typed.replace("\n        ", "").into_bytes());
    add(
        "debezium",
        "delete",
        br#"{"op":"d","before":{"id":3,"v":"x"},"after":null,"source":{"ts_ms":1,"schema":"s","table":"t"}}"#.to_vec(),
    );
    add("debezium", "tombstone", b"null".to_vec());
    let malformed = read("tests/fixtures/debezium/malformed.jsonl");
    for (i, line) in malformed.split(|b| *b == b'\n').filter(|l| !l.is_empty() && l.len() < 200).take(6).enumerate() {
        add("debezium", &format!("bad-malformed-{i}"), line.to_vec());
    }

    // pgoutput: one message of each kind, values of every column type.
    let columns = [("id", 20), ("name", 25), ("born", 1082), ("seen", 1114), ("at", 1184), ("t", 1083)];
    let relation = Relation {
        id: 16_384,
        namespace: "public".into(),
        name: "users".into(),
        replica_identity: b'd',
        columns: columns
            .iter()
            .enumerate()
            .map(|(i, (name, oid))| RelationColumn {
                key: i == 0,
                name: (*name).into(),
                type_oid: *oid,
                type_modifier: -1,
            })
            .collect(),
    };
    let row: Vec<TupleValue<'_>> =
        [&b"42"[..], b"ann", b"1999-12-31", b"2024-02-29 13:14:15.5", b"0044-03-15 12:00:00+05:30 BC", b"24:00:00"]
            .into_iter()
            .map(TupleValue::Text)
            .collect();
    let other: Vec<TupleValue<'_>> =
        [&b"\\xDEADbeef"[..], b"A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", b"t", b"-1.5e+20", b"12.50", b"{\"a\": [1]}"]
            .into_iter()
            .map(TupleValue::Text)
            .chain([TupleValue::Null, TupleValue::Unchanged, TupleValue::Binary(b"\x00\x01")])
            .collect();
    let messages = [
        ("begin", Message::Begin(Begin { final_lsn: 0x0100_0000, commit_time: 757_382_400_000_000, xid: 42 })),
        ("commit", Message::Commit(Commit { flags: 0, commit_lsn: 0x100, end_lsn: 0x140, commit_time: 9 })),
        ("origin", Message::Origin { lsn: 3, name: "node".into() }),
        ("type", Message::Type { oid: 16_400, namespace: "public".into(), name: "mood".into() }),
        ("relation", Message::Relation(relation)),
        ("insert", Message::Insert { relation: 16_384, new: row.clone() }),
        ("update", Message::Update { relation: 16_384, old: Some((OldKind::Key, other.clone())), new: row.clone() }),
        ("delete", Message::Delete { relation: 16_384, old: (OldKind::Full, row) }),
        ("truncate", Message::Truncate { relations: vec![16_384, 16_385], options: 1 }),
        ("message", Message::Message { transactional: true, lsn: 5, prefix: "p".into(), content: b"hello" }),
    ];
    for (name, message) in &messages {
        add("pgoutput", name, fuzzing::encode_pgoutput(message));
    }
    add("pgoutput", "bad-unknown", b"Z".to_vec());

    // CEP: the examples' patterns with their events, and the grammar's corners.
    for name in ["cart_abandonment", "cart_payment", "fraud", "login_reset"] {
        let text = read(&format!("examples/cep/{name}.cep"));
        let events = read(&format!("examples/cep/{name}.jsonl"));
        let events: Vec<&[u8]> = events.split(|b| *b == b'\n').take(6).collect();
        add("cep", name, [text, vec![0], events.join(&b'\n')].concat());
    }
    add(
        "cep",
        "corners",
        concat!(
            "PATTERN (a{2,}+ CONSECUTIVE . \"b c\"?? ~ d* COMBINATIONS !e) WITHIN 1.5s AFTER MATCH SKIP TO FIRST d\n",
            "DEFINE a AS x.y[0] - -2 * 3 % 4 / 5 >= prev.x AND NOT (z IS NOT NULL OR w IN (1, 'it''s', -0.5e3)),\n",
            "  \"b c\" AS first(a).x != last(a).x, d AS count(a) < 3 -- comment\n",
            "\0{\"x\":{\"y\":[7]},\"z\":null,\"w\":1}\n{\"x\":2}"
        )
        .as_bytes()
        .to_vec(),
    );
    add("cep", "path", b"user.\"odd name\"[1].id".to_vec());
    add("cep", "bad-syntax", b"PATTERN (a b\nDEFINE a AS x = ".to_vec());

    // Manifests: the JSON body (the harness adds the header) and a whole file.
    let shared_file = FileInfo { name: "0000000007-0d1f-000009.sst".into(), size: 2_048, crc32: 0x0bad_cafe };
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        id: 7,
        time: 12_000,
        fingerprint: "abc".into(),
        workers: 2,
        created_unix_ms: 1_700_000_000_000,
        sources: BTreeMap::from([(
            "Nexmark".into(),
            vec![
                PartitionState { partition: 0, offset: Some(10), max_seen: Some(5), floor: 0, done: false },
                PartitionState { partition: 1, offset: None, max_seen: None, floor: 3, done: true },
            ],
        )]),
        shards: vec![ShardInfo {
            worker: 0,
            entries: 3,
            files: vec![FileInfo { name: "000004.sst".into(), size: 1_024, crc32: 0xdead_beef }],
            databases: vec![highwater::checkpoint::DatabaseInfo {
                operator: "Join@[0, 5]".into(),
                identity: "0d1f".into(),
                files: BTreeMap::from([("000009.sst".into(), shared_file.clone())]),
            }],
        }],
        schemas: BTreeMap::from([(
            "Window@[0, 4]".into(),
            highwater::operators::checkpoint::Schema::new("window.aligned", 1),
        )]),
        sinks: vec![SinkPart {
            sink: "out".into(),
            kind: "files".into(),
            target: "/tmp/out".into(),
            pending: "p".into(),
            committed: "c".into(),
            rows: 9,
        }],
        shared: vec![shared_file],
    };
    add("manifest", "body", serde_json::to_vec_pretty(&manifest).expect("serializes"));
    add("manifest", "file", manifest.to_bytes());
    add("manifest", "bad-not-json", b"{\"format_version\":1".to_vec());

    // Chunks of shard entries, as the shard writer encodes them.
    let entries: Vec<(u64, Vec<u8>)> = vec![(0, vec![]), (1, b"one".to_vec()), (u64::MAX, vec![7; 40])];
    add("shard_chunk", "entries", encode_chunk(&entries));
    add("shard_chunk", "empty", encode_chunk(&[]));
    add("shard_chunk", "bad-truncated", encode_chunk(&entries)[..30].to_vec());

    // Shard files, as the shard writer writes them.
    let operators = vec![("window.1".to_owned(), entries.clone()), ("join".to_owned(), vec![])];
    let mut shard = Vec::new();
    highwater::checkpoint::shard::write_to(&mut shard, &operators).expect("writes to memory");
    add("shard_file", "bad-truncated", shard[..shard.len() - 3].to_vec());
    add("shard_file", "operators", shard);
    add("shard_file", "empty", highwater::checkpoint::shard::MAGIC.to_vec());
    add("shard_file", "bad-header", b"HWSHARD0".to_vec());
    out
}
