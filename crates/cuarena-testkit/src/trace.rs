//! What the trace crate's tests and the `cuarena` command's share: the
//! recorded traces, and pickle and gzip inputs built byte by byte
//! (feature `trace`).
#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde_pickle::{HashableValue, Value};

/// The recorded traces and snapshots (`crates/cuarena-trace/tests/data`),
/// from either crate's tests.
pub fn data() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../cuarena-trace/tests/data"
    ))
}

/// Every snapshot (pickle, gzipped or not) in [`data`], sorted by name.
pub fn shipped_snapshots() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(data())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            n.ends_with(".pickle") || n.ends_with(".pickle.gz")
        })
        .collect();
    v.sort();
    v
}

/// A recorded trace a bench reads.
pub struct BenchTrace {
    pub path: PathBuf,
    /// The file name.
    pub name: String,
    /// Its half of the corpus (`design` or `report`), or `other`.
    pub half: String,
}

/// The traces of a bench over recorded traces: every snapshot and CSV
/// trace in the folder `CUARENA_TRACES` names (default: [`data`]), sorted
/// by name (a relative folder is taken from the workspace root, where
/// `cargo bench` is typed, though the bench runs in its crate's folder),
/// only those whose name contains `CUARENA_ONLY` where it is set;
/// each with its half from the folder's `manifest.json` or
/// `corpus_manifest.json` (as `scripts/record-corpus.sh` writes them).
pub fn bench_traces() -> Vec<BenchTrace> {
    let dir = std::env::var_os("CUARENA_TRACES").map_or_else(data, |d| {
        let d = PathBuf::from(d);
        if d.is_relative() && !d.exists() {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(d)
        } else {
            d
        }
    });
    let dir = dir.as_path();
    let mut halves = BTreeMap::new();
    for manifest in ["manifest.json", "corpus_manifest.json"] {
        let Ok(text) = std::fs::read_to_string(dir.join(manifest)) else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        for t in v["traces"].as_array().into_iter().flatten() {
            if let (Some(f), Some(h)) = (t["file"].as_str(), t["half"].as_str()) {
                halves.insert(f.to_owned(), h.to_owned());
            }
        }
    }
    let only = std::env::var("CUARENA_ONLY").ok();
    let mut traces: Vec<BenchTrace> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| {
            panic!(
                "CUARENA_TRACES: {} is no folder of traces: {e}",
                dir.display()
            )
        })
        .filter_map(|e| e.ok().map(|e| e.path()))
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let half = halves.get(&name).map_or("other", String::as_str).to_owned();
            BenchTrace { path, name, half }
        })
        .filter(|t| {
            let n = &t.name;
            (n.ends_with(".pickle") || n.ends_with(".pickle.gz") || n.ends_with(".csv.gz"))
                && only.as_ref().is_none_or(|o| n.contains(o.as_str()))
        })
        .collect();
    traces.sort_by(|a, b| a.name.cmp(&b.name));
    traces
}

/// `bytes` gzipped (fast).
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// PROTO 4 then `body` then STOP.
pub fn pickle(body: &[u8]) -> Vec<u8> {
    let mut b = vec![0x80, 4];
    b.extend_from_slice(body);
    b.push(b'.');
    b
}

/// SHORT_BINUNICODE `t` (at most 255 bytes).
pub fn short_str(t: &str) -> Vec<u8> {
    let mut b = vec![0x8c, t.len() as u8];
    b.extend_from_slice(t.as_bytes());
    b
}

/// The shortest integer op for `v`: BININT1, BININT2 or BININT.
pub fn int(v: u32) -> Vec<u8> {
    match v {
        0..=0xff => vec![b'K', v as u8],
        0x100..=0xffff => [&[b'M'][..], &(v as u16).to_le_bytes()].concat(),
        _ => [&[b'J'][..], &v.to_le_bytes()].concat(),
    }
}

/// The items of an `alloc` event dict (after its MARK, before SETITEMS):
/// `"action": "alloc", "addr": addr, "size": size`.
pub fn alloc_items(addr: u32, size: u32) -> Vec<u8> {
    let mut b = short_str("action");
    b.extend(short_str("alloc"));
    b.extend(short_str("addr"));
    b.extend(int(addr));
    b.extend(short_str("size"));
    b.extend(int(size));
    b
}

/// `{"device_traces": [[{"action": "alloc", "addr": 1, "size": 5}]],
/// "segments": [{"address": 0, "total_size": 2^40, "blocks": [B] * n}]}`
/// where B is one block dict, shared: `block` pushes it and memoizes it
/// as memo `memo`, and the list holds a memo get of it and n - 1 DUPs (one
/// byte per block).
pub fn shared_block_snapshot(block: &[u8], memo: u8, n: usize) -> Vec<u8> {
    let mut b = vec![b'}'];
    b.extend(short_str("device_traces"));
    b.extend(b"]]}(");
    b.extend(alloc_items(1, 5));
    b.extend(b"uaas");
    b.extend(short_str("segments"));
    b.extend(b"]}(");
    b.extend(short_str("address"));
    b.extend(b"K\x00");
    b.extend(short_str("total_size"));
    b.extend(b"\x8a\x06\x00\x00\x00\x00\x00\x01");
    b.extend(short_str("blocks"));
    b.push(b']');
    b.extend_from_slice(block);
    // POP the dict, MARK, BINGET it, DUP it, APPENDS.
    b.extend([b'0', b'(', b'h', memo]);
    b.resize(b.len() + n - 1, b'2');
    b.extend(b"euas");
    pickle(&b)
}

pub const DEEP: usize = 500_000;

/// EMPTY_LIST × `depth`, APPEND × (`depth` - 1): a list nested `depth` deep.
pub fn deep_list_pickle(depth: usize) -> Vec<u8> {
    let mut body = vec![b']'; depth];
    body.resize(2 * depth - 1, b'a');
    pickle(&body)
}

/// EMPTY_LIST then (DUP, TUPLE2) × `pairs`: 2^`pairs` leaves if copied,
/// `pairs` deep.
pub fn dup_tuple2_pickle(pairs: usize) -> Vec<u8> {
    let mut body = vec![b']'];
    for _ in 0..pairs {
        body.extend_from_slice(b"2\x86");
    }
    pickle(&body)
}

/// `marks` MARKs and nothing else.
pub fn mark_flood_pickle(marks: usize) -> Vec<u8> {
    pickle(&vec![b'('; marks])
}

/// A LONG4 integer claiming `claimed` bytes of digits (16 present).
pub fn long4_pickle(claimed: u32) -> Vec<u8> {
    let mut body = vec![0x8b];
    body.extend_from_slice(&claimed.to_le_bytes());
    body.extend_from_slice(&[0xff; 16]);
    pickle(&body)
}

/// A pickle's first bytes, then `copies` gzip members of `member_bytes`
/// zeros each (a multi-member gzip is valid): built streaming, never held
/// inflated. (Zeros alone are refused at their first byte, as no format.)
pub fn gzip_zeros(member_bytes: usize, copies: usize) -> Vec<u8> {
    let mut head = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    head.write_all(&[0x80, 0x04]).unwrap();
    let head = head.finish().unwrap();
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let zeros = vec![0u8; member_bytes.min(1 << 20)];
    let mut left = member_bytes;
    while left > 0 {
        let n = left.min(zeros.len());
        enc.write_all(&zeros[..n]).unwrap();
        left -= n;
    }
    let member = enc.finish().unwrap();
    let mut bomb = Vec::with_capacity(head.len() + member.len() * copies);
    bomb.extend_from_slice(&head);
    for _ in 0..copies {
        bomb.extend_from_slice(&member);
    }
    bomb
}

/// A pickle string key.
pub fn s(x: &str) -> HashableValue {
    HashableValue::String(x.to_owned())
}

pub fn dict(items: Vec<(&str, Value)>) -> Value {
    Value::Dict(
        items
            .into_iter()
            .map(|(k, v)| (s(k), v))
            .collect::<BTreeMap<_, _>>(),
    )
}

/// The memo bomb: a snapshot whose one `alloc` event dict is memoized once
/// and appended `1 + 100,000 × batches` times (a memo get, then DUPs, per
/// batch), gzipped: 320 batches make a 31 KB file of 32 million events
/// that passes the readers' limits. Built streaming, never held inflated.
pub fn memo_bomb_gz(batches: usize) -> Vec<u8> {
    let mut p = vec![0x80, 4, b'}'];
    p.extend(short_str("device_traces"));
    p.extend_from_slice(b"]]}(");
    p.extend(alloc_items(1 << 20, 512));
    // SETITEMS, MEMOIZE (memo 0), APPEND to the device's list.
    p.extend_from_slice(b"u\x94a");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(&p).unwrap();
    // MARK, BINGET 0, 99,999 x DUP, APPENDS.
    let mut batch = vec![b'(', b'h', 0];
    batch.resize(3 + 99_999, b'2');
    batch.push(b'e');
    for _ in 0..batches {
        enc.write_all(&batch).unwrap();
    }
    // The list into the outer one, that into the top dict, STOP.
    enc.write_all(b"as.").unwrap();
    enc.finish().unwrap()
}
