//! Hostile trace files: each is built here, and each must give a clear
//! error (the right variant, naming the limit) quickly, within the readers'
//! stated memory bound; real files still read to exactly the events a
//! general unpickler (serde-pickle) gives.

use std::time::{Duration, Instant};

use cuarena_trace::trace::limits::{MAX_INT_BYTES, MAX_MARKS, MAX_NESTING};
use cuarena_trace::trace::{Action, Trace, TraceEvent};
use cuarena_trace::ToolError;
use serde_pickle::{HashableValue, Value};

use cuarena_testkit::trace::{
    alloc_items, data, deep_list_pickle, dict, dup_tuple2_pickle, gzip_zeros, long4_pickle,
    mark_flood_pickle, pickle, shared_block_snapshot, short_str, DEEP,
};

/// Reads `bytes`, checking it takes under 10 s (release; debug is slower).
fn read(bytes: &[u8]) -> Result<Trace, ToolError> {
    let t0 = Instant::now();
    let r = Trace::from_bytes(bytes, "hostile");
    let limit = if cfg!(debug_assertions) { 120 } else { 10 };
    assert!(
        t0.elapsed() < Duration::from_secs(limit),
        "{:?}",
        t0.elapsed()
    );
    r
}

fn describe(r: &Result<Trace, ToolError>) -> String {
    match r {
        Ok(t) => format!("Ok({} events)", t.events.len()),
        Err(e) => format!("Err({e:?})"),
    }
}

/// Asserts a [`ToolError::Limit`] named `name`; returns (asked, limit).
fn expect_limit(r: Result<Trace, ToolError>, name: &str) -> (u64, u64) {
    match r {
        Err(ToolError::Limit {
            name: n,
            asked,
            limit,
            ref path,
            ..
        }) if n == name => {
            assert_eq!(path, "hostile");
            let msg = r
                .as_ref()
                .err()
                .map(ToString::to_string)
                .unwrap_or_default();
            assert!(msg.contains(name), "{msg}");
            (asked, limit)
        }
        other => panic!("expected Limit {name}, got {}", describe(&other)),
    }
}

/// Asserts a [`ToolError::Trace`] whose message contains `needle`.
fn expect_trace(r: Result<Trace, ToolError>, needle: &str) {
    match r {
        Err(ToolError::Trace { ref message, .. }) if message.contains(needle) => {}
        other => panic!(
            "expected Trace error with {needle:?}, got {}",
            describe(&other)
        ),
    }
}

#[test]
fn deep_list_nesting() {
    let (asked, limit) = expect_limit(read(&deep_list_pickle(DEEP)), "MAX_NESTING");
    assert_eq!((asked, limit), (MAX_NESTING + 1, MAX_NESTING));
}

#[test]
fn deep_mark_list_nesting() {
    // MARK × N, LIST × N.
    let mut body = vec![b'('; DEEP];
    body.resize(2 * DEEP, b'l');
    expect_limit(read(&pickle(&body)), "MAX_MARKS");
    // MARK, (EMPTY_DICT, MARK) × N: as deep as dicts being filled get.
    let mut body = vec![b'('];
    for _ in 0..DEEP {
        body.extend_from_slice(b"}(");
    }
    let (asked, _) = expect_limit(read(&pickle(&body)), "MAX_MARKS");
    assert_eq!(asked, MAX_MARKS + 1);
}

#[test]
fn deep_tuple_via_memo() {
    // x = (); repeat: x = (x,) through the memo (MEMOIZE, POP, BINGET).
    let mut body = b")\x94".to_vec();
    for i in 0..DEEP as u32 {
        body.push(b'0');
        body.push(b'j');
        body.extend_from_slice(&i.to_le_bytes());
        body.extend_from_slice(b"\x85\x94");
    }
    expect_limit(read(&pickle(&body)), "MAX_NESTING");
}

#[test]
fn dup_tuple2_bomb() {
    // The 84-byte bomb: EMPTY_LIST then (DUP, TUPLE2) × 40 would be 2^40
    // leaves if copied; shared, it is 41 small nodes and a clean error.
    let bytes = dup_tuple2_pickle(40);
    assert!(bytes.len() <= 84, "{}", bytes.len());
    expect_trace(read(&bytes), "top level is a tuple");
    // Longer: nesting passes the limit.
    expect_limit(read(&dup_tuple2_pickle(DEEP)), "MAX_NESTING");
}

#[test]
fn mark_flood() {
    let (asked, limit) = expect_limit(read(&mark_flood_pickle(50 << 20)), "MAX_MARKS");
    assert_eq!((asked, limit), (MAX_MARKS + 1, MAX_MARKS));
    // MARK, POP_MARK pairs cost nothing that lasts: a clean error at STOP.
    let body = b"(1".repeat(5 << 20);
    expect_trace(read(&pickle(&body)), "empty stack");
}

#[test]
fn memo_bombs() {
    // Doubling through the memo: x = (x, x), 500,000 times.
    let mut body = b"]\x94".to_vec();
    for i in 0..DEEP as u32 {
        for _ in 0..2 {
            body.push(b'j');
            body.extend_from_slice(&i.to_le_bytes());
        }
        body.extend_from_slice(b"\x86\x94");
    }
    expect_limit(read(&pickle(&body)), "MAX_NESTING");
    // A flood of memo entries, each charged to the memory budget.
    let mut body = vec![b'N'];
    body.resize(16 << 20, 0x94);
    expect_limit(
        read(&pickle(&body)),
        "MEMORY_PER_INPUT_BYTE × input bytes + MEMORY_BASE_BYTES",
    );
    // Every LONG_BINPUT index apart: no dense table grows to the index.
    let mut body = vec![b'N'];
    for i in 0..1000u32 {
        body.push(b'r');
        body.extend_from_slice(&(u32::MAX - i * 4_000_000).to_le_bytes());
    }
    expect_trace(read(&pickle(&body)), "top level is a None");
}

/// `{"device_traces": [[ev, ev, ...]]}`: one device list of `n` memo
/// gets of one event dict whose items `fields` pushes (memo 0..=4: top,
/// key, dt, dev0, ev).
fn shared_event_snapshot_of(fields: &[u8], n: usize) -> Vec<u8> {
    let mut b = b"}\x94(\x8c\x0ddevice_traces\x94]\x94]\x94(}\x94(".to_vec();
    b.extend_from_slice(fields);
    b.push(b'u');
    for _ in 1..n {
        b.extend_from_slice(b"h\x04");
    }
    b.extend_from_slice(b"eau");
    pickle(&b)
}

/// A snapshot whose one device list holds `n` references (memo gets) to
/// one event dict with a `len`-byte action: each event copies the action.
fn shared_event_snapshot(n: usize, len: usize) -> Vec<u8> {
    let mut fields = b"\x8c\x06action\x8d".to_vec();
    fields.extend_from_slice(&(len as u64).to_le_bytes());
    fields.resize(fields.len() + len, b'x');
    fields.extend_from_slice(b"\x8c\x04addrK\x01\x8c\x04sizeK\x02");
    shared_event_snapshot_of(&fields, n)
}

#[test]
fn shared_event_bomb_is_decoded_once() {
    // A small version reads: an unknown action, counted and skipped.
    let t = read(&shared_event_snapshot(3, 5)).unwrap();
    assert!(t.events.is_empty());
    assert_eq!(t.counts.unknown, vec![("xxxxx".to_owned(), 3)]);
    // 1 MB of action string handed out 2 million times: 2 TB if copied,
    // 2 TB of comparisons if decoded at every use. Decoded once, counted
    // under its first 40 characters.
    let t = read(&shared_event_snapshot(2_000_000, 1 << 20)).unwrap();
    assert_eq!(t.counts.unknown, vec![("x".repeat(40), 2_000_000)]);
    assert_eq!(t.decoded_event_dicts, 1);
}

/// `n` events that are one shared `alloc` dict with `keys` extra keys.
fn shared_wide_event_snapshot(n: usize, keys: usize) -> Vec<u8> {
    let mut fields = Vec::new();
    for k in 0..keys {
        fields.extend(short_str(&format!("k{k}")));
        fields.extend_from_slice(b"K\x01");
    }
    fields.extend_from_slice(b"\x8c\x06action\x8c\x05alloc\x8c\x04addrK\x01\x8c\x04sizeK\x02");
    shared_event_snapshot_of(&fields, n)
}

#[test]
fn shared_wide_event_reads_in_linear_work() {
    // One dict of 100,000 keys shared by 1,000,000 events (2.6 MB): key
    // lookups scan the dict, so decoding it at each use is 6 x 10^11 steps.
    let t = read(&shared_wide_event_snapshot(1_000_000, 100_000)).unwrap();
    assert_eq!(t.events.len(), 1_000_000);
    assert_eq!(t.decoded_event_dicts, 1);
    assert_eq!((t.events[999_999].addr, t.events[999_999].size), (1, 2));
}

#[test]
fn gzip_bomb() {
    // 10 GB of zeros: one 64 MiB member compressed once, repeated.
    let bomb = gzip_zeros(64 << 20, (10 << 30) / (64 << 20));
    let (asked, limit) = expect_limit(
        read(&bomb),
        "MAX_GZIP_RATIO × compressed bytes + GZIP_RATIO_SLACK_BYTES",
    );
    assert!(asked < 200 << 20, "inflated {asked} bytes (limit {limit})");
}

#[test]
fn oversized_plain_file_is_refused_unread() {
    let dir = std::env::temp_dir().join(format!("cuarena-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("big.pickle");
    let f = std::fs::File::create(&p).unwrap();
    // Sparse: 5 GiB claimed, nothing written.
    f.set_len(5 << 30).unwrap();
    drop(f);
    let t0 = Instant::now();
    let r = Trace::read(&p);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert!(
        matches!(
            r,
            Err(ToolError::Limit {
                name: "MAX_DECOMPRESSED_BYTES",
                ..
            })
        ),
        "{}",
        describe(&r)
    );
}

#[test]
fn huge_integers() {
    // LONG4 claiming 2 GiB of digits.
    let (asked, limit) = expect_limit(read(&long4_pickle(0x7fff_ffff)), "MAX_INT_BYTES");
    assert_eq!((asked, limit), (0x7fff_ffff, MAX_INT_BYTES));
    // LONG1 with 255 bytes.
    let mut body = vec![0x8a, 255];
    body.resize(257, 1);
    expect_limit(read(&pickle(&body)), "MAX_INT_BYTES");
    // LONG4 of negative length.
    let mut body = vec![0x8b];
    body.extend_from_slice(&(-5i32).to_le_bytes());
    expect_trace(read(&pickle(&body)), "negative length");
}

#[test]
fn giant_length_claims() {
    for (op, width) in [(0x8du8, 8usize), (b'X', 4), (b'B', 4), (0x8e, 8), (0x8c, 1)] {
        let mut body = vec![op];
        body.extend_from_slice(&u64::MAX.to_le_bytes()[..width]);
        body.extend_from_slice(b"abc");
        expect_trace(read(&pickle(&body)), "only");
    }
}

#[test]
fn unknown_opcodes_and_recursion() {
    expect_trace(read(&pickle(b"\xff")), "unsupported opcode 0xff");
    expect_trace(read(&pickle(b"S'x'\n")), "unsupported opcode 0x53");
    // A list appended to itself.
    expect_trace(read(&pickle(b"]\x94h\x00a")), "inside itself");
    // A list changed after being nested.
    expect_trace(read(&pickle(b"]\x94]h\x00aNh\x00")), "top level");
    expect_trace(read(&pickle(b"]\x94]h\x00a0h\x00Na")), "changed after");
}

fn real(name: &str) -> Vec<u8> {
    let b = std::fs::read(data().join(name)).unwrap();
    if b.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&b[..]), &mut out).unwrap();
        out
    } else {
        b
    }
}

#[test]
fn truncated_files() {
    let bytes = real("mlp_small_with_stacks.pickle");
    let step = bytes.len() / 97;
    for cut in (0..bytes.len()).step_by(step) {
        let r = read(&bytes[..cut]);
        assert!(
            matches!(r, Err(ToolError::Trace { .. })),
            "cut at {cut}: {}",
            describe(&r)
        );
    }
}

#[test]
fn csv_long_line() {
    let mut csv = b"action,addr,size,stream,time_us\nalloc,1,2,0,0\nalloc,".to_vec();
    csv.resize(csv.len() + (1 << 20), b'9');
    expect_limit(read(&csv), "MAX_CSV_LINE_BYTES");
    let mut header = b"action,addr,size,stream,time_us".to_vec();
    header.resize(1 << 20, b'x');
    expect_limit(read(&header), "MAX_CSV_LINE_BYTES");
}

/// The events a general unpickler gives (the reader before this one).
fn reference_events(bytes: &[u8]) -> Vec<TraceEvent> {
    let opts = serde_pickle::DeOptions::new()
        .replace_unresolved_globals()
        .decode_strings();
    let top = serde_pickle::value_from_slice(bytes, opts).unwrap();
    let key = |v: &Value, k: &str| -> Option<Value> {
        match v {
            Value::Dict(d) => d.get(&HashableValue::String(k.into())).cloned(),
            _ => None,
        }
    };
    let int = |v: Option<Value>| -> i128 {
        match v {
            Some(Value::I64(i)) => i128::from(i),
            Some(Value::Int(b)) => b.to_string().parse().unwrap(),
            None => 0,
            other => panic!("{other:?}"),
        }
    };
    let Some(Value::List(devices)) = key(&top, "device_traces") else {
        panic!("no device_traces")
    };
    let mut out = Vec::new();
    for (d, list) in devices.iter().enumerate() {
        let Value::List(list) = list else { panic!() };
        for e in list {
            let Some(Value::String(a)) = key(e, "action") else {
                panic!()
            };
            let Some(action) = Action::parse(&a) else {
                continue;
            };
            out.push(TraceEvent {
                action,
                addr: int(key(e, "addr")) as u64,
                size: int(key(e, "size")) as u64,
                stream: int(key(e, "stream")) as i64,
                time_us: int(key(e, "time_us")) as i64,
                device: d as u32,
            });
        }
    }
    out
}

#[test]
fn real_snapshots_read_as_before() {
    for (name, count) in [
        ("mlp_small_with_stacks.pickle", 430),
        ("gpt2_varlen_h100.pickle.gz", 5444),
        ("resnet50_varbatch_h100.pickle.gz", 26612),
    ] {
        let bytes = real(name);
        let t = read(&bytes).unwrap();
        assert_eq!(t.events.len(), count, "{name}");
        assert!(t.events == reference_events(&bytes), "{name}");
    }
}

// ---- Review findings (branch `review`): each test fails on a60c355. ----

/// A snapshot of one segment of `n` blocks that are one block dict
/// (memo 1) holding `dups` duplicated `size` keys (memo 0 is the key).
fn shared_dup_key_snapshot(dups: usize, n: usize) -> Vec<u8> {
    let mut block = vec![b'}'];
    block.extend(short_str("size"));
    block.extend(b"\x940(");
    for _ in 0..dups {
        block.extend(b"h\x00K\x01");
    }
    block.extend(b"u\x94");
    shared_block_snapshot(&block, 1, n)
}

#[test]
fn shared_block_dict_with_duplicate_keys_reads_in_linear_work() {
    // A block dict listed twice is refused at its second appearance
    // (PyTorch writes each block once); one listed once holds each of its
    // keys once (the last value set), however often the file repeats it.
    expect_trace(
        read(&shared_dup_key_snapshot(3, 4)),
        "same object as an earlier one",
    );
    let t = read(&shared_dup_key_snapshot(100_000, 1)).unwrap();
    let segs = t.segments.as_ref().unwrap();
    assert_eq!(segs[0].blocks.len(), 1);
    assert_eq!(segs[0].blocks[0].size, 1);
    // 655 KB: one block dict of 131,072 `size` keys (each lookup of an
    // absent key scans them all) shared by 131,072 blocks: 5 x 10^10 steps,
    // 51 s on a60c355. Linear work (or a clear error) reads it in far less.
    let r = read(&shared_dup_key_snapshot(1 << 17, 1 << 17));
    println!("{}", describe(&r));
    expect_trace(r, "same object as an earlier one");
}

#[test]
fn event_dict_shared_between_devices_keeps_each_device() {
    // serde-pickle does not memoize: share the dict by hand.
    // {"device_traces": [[E], [E]]} with E memoized (memo 0), as Python's
    // pickle writes `e = {...}; {"device_traces": [[e], [e]]}`.
    let mut b = vec![b'}'];
    b.extend(short_str("device_traces"));
    b.extend(b"(]((");
    b.extend(alloc_items(4096, 1024));
    b.extend(b"d\x94e](h\x00el");
    b.extend(b"s");
    let r = read(&pickle(&b));
    match r {
        // Refusing the shared dict is fine too.
        Err(ToolError::Trace { .. }) => {}
        Ok(t) => {
            assert_eq!(t.events.len(), 2);
            assert_eq!(
                (t.events[0].device, t.events[1].device),
                (0, 1),
                "device 1's event read as device 0's"
            );
            assert_eq!(t.devices(), vec![0, 1]);
        }
        other => panic!("{}", describe(&other)),
    }
}

#[test]
fn repeated_unmatched_frees_of_one_address_are_separate_blocks() {
    // Two blocks at 4096 freed without being allocated (as PyTorch's viewer
    // reads it: two blocks live before recording, each freed once), then
    // an alloc left live. Nothing else is live at the end.
    let csv = "action,addr,size,stream,time_us\n\
               free_completed,4096,512,0,0\n\
               free_completed,4096,2048,0,1\n\
               alloc,8192,256,0,2\n";
    let t = Trace::from_csv_reader(csv.as_bytes(), "hostile").unwrap();
    let ops = t.ops(0).unwrap();
    assert_eq!(ops.initial_blocks, 2);
    assert_eq!(ops.initial_bytes, 2560);
    assert_eq!(ops.initial_frees, 2, "one initial block is never freed");
    assert_eq!(ops.live_bytes_at_end, 256);
}

#[test]
fn pending_free_block_not_in_the_trace_is_live_to_the_end() {
    let block = |addr: i64, size: i64, state: &str| {
        dict(vec![
            ("address", Value::I64(addr)),
            ("size", Value::I64(size)),
            ("requested_size", Value::I64(size)),
            ("state", Value::String(state.into())),
        ])
    };
    let ev = |a: &str, addr: i64, size: i64| {
        dict(vec![
            ("action", Value::String(a.into())),
            ("addr", Value::I64(addr)),
            ("size", Value::I64(size)),
        ])
    };
    let seg = dict(vec![
        ("device", Value::I64(0)),
        ("address", Value::I64(0)),
        ("total_size", Value::I64(8192)),
        (
            "blocks",
            Value::List(vec![
                // Freed by its tensor before recording, still used by a
                // stream at the dump: its memory was held all along.
                block(0, 1024, "active_pending_free"),
                block(1024, 512, "active_allocated"),
                block(1536, 8192 - 1536, "inactive"),
            ]),
        ),
    ]);
    let top = dict(vec![
        ("segments", Value::List(vec![seg])),
        (
            "device_traces",
            Value::List(vec![Value::List(vec![
                ev("alloc", 1024, 512),
                ev("alloc", 2048, 512),
                ev("free_requested", 2048, 512),
                ev("free_completed", 2048, 512),
            ])]),
        ),
    ]);
    let bytes = serde_pickle::value_to_vec(&top, Default::default()).unwrap();
    let t = read(&bytes).unwrap();
    let ops = t.ops(0).unwrap();
    let active = t.active_at_dump(0).unwrap();
    assert_eq!(
        ops.live_bytes_at_end,
        active.allocated + active.pending_free,
        "bytes live at the end differ from the bytes active in `segments`"
    );
    assert_eq!(ops.peak_live_bytes, 1024 + 512 + 512);
}

/// The memo bomb (one `alloc` dict shared by millions of events) passes the
/// readers' limits; building its alloc/free program passes the same budget
/// and is refused, before any work, as the limit it passes, never an
/// abort. 12 million events here (the 32 million of the 31 KB file run
/// through the command, under an address-space limit, in the command's
/// tests).
#[test]
fn memo_bomb_program_is_refused_by_the_budget() {
    let bomb = cuarena_testkit::trace::memo_bomb_gz(120);
    assert!(bomb.len() < 16 << 10, "{} bytes", bomb.len());
    let t = Trace::from_bytes(&bomb, "bomb").unwrap();
    assert_eq!(t.events.len(), 12_000_001);
    assert_eq!(t.decoded_event_dicts, 1);
    let t0 = std::time::Instant::now();
    match t.ops(0) {
        Err(ToolError::Limit {
            name, asked, limit, ..
        }) => {
            assert_eq!(
                name,
                "MEMORY_PER_INPUT_BYTE × input bytes + MEMORY_BASE_BYTES"
            );
            assert!(asked > limit);
            assert_eq!(limit, t.memory_budget().limit());
        }
        other => panic!("{:?}", other.map(|o| o.len())),
    }
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        t0.elapsed()
    );
    // The model of PyTorch's allocator is held to it as well.
    assert!(matches!(
        cuarena_trace::pytorch::Session::new(&t, 0),
        Err(ToolError::Limit { .. })
    ));
}
