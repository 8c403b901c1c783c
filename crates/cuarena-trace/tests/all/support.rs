//! Test helpers shared by this crate's tests and the `cuarena` command's
//! (`crates/cuarena-cli/tests/all/main.rs` includes this file by path): the
//! recorded traces, and pickle and gzip inputs built byte by byte.
// Each test binary uses its own part.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;

use serde_pickle::{HashableValue, Value};

/// The recorded traces and snapshots (`crates/cuarena-trace/tests/data`),
/// from either crate's tests.
pub fn data() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../cuarena-trace/tests/data"
    ))
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
