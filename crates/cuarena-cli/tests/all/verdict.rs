//! The verdict's parts on hand-made snapshots: the device replayed when
//! several have events, the three capacities, and the `--json` schema
//! against `cuarena replay --help`.

use std::collections::BTreeSet;

use serde_pickle::Value;

use crate::cli::cuarena;
use crate::snapshots::{block, ev, free, json, segment, snapshot, temp, text, u};
use cuarena_testkit::trace::{data, dict};

const MIB: i64 = 1 << 20;

fn oom(size: i64, free: i64) -> Value {
    dict(vec![
        ("action", Value::String("oom".into())),
        ("device_free", Value::I64(free)),
        ("size", Value::I64(size)),
        ("stream", Value::I64(0)),
    ])
}

/// A three-GPU job whose `oom` is on device 1; device 0 has the largest
/// peak.
fn three_devices() -> Vec<u8> {
    let d0 = vec![ev("alloc", 0x1000_0000, 64 * MIB)];
    let d1 = vec![ev("alloc", 0x2000_0000, 8 * MIB), oom(40 * MIB, 4 * MIB)];
    let d2 = vec![ev("alloc", 0x3000_0000, 16 * MIB)];
    snapshot(vec![d0, d1, d2], vec![])
}

#[test]
fn the_device_with_the_oom_is_replayed() {
    let p = temp("three.pickle", &three_devices());
    let o = cuarena(&["replay", &p]);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", text(&o.stderr));
    let lines: Vec<&str> = out.lines().collect();
    // Every device on one line, the replayed one marked.
    assert!(lines[2].trim_start().starts_with("0 "), "{out}");
    assert!(lines[3].trim_start().starts_with("1 *"), "{out}");
    assert!(lines[4].trim_start().starts_with("2 "), "{out}");
    assert!(lines[3].trim_end().ends_with(" 1"), "the oom count: {out}");
    assert!(
        lines[5].starts_with("device 1, the first with an oom event"),
        "{out}"
    );
    // Events are numbered across devices: device 0's one comes first.
    assert!(out.contains("oom at event 2: asked 40.00 MiB"), "{out}");
    let j = json(&[&p]);
    assert_eq!(j["device"], 1);
    assert_eq!(j["oom_events"], 1);
    let summary = j["devices_summary"].as_array().unwrap();
    let ooms: Vec<u64> = summary.iter().map(|d| u(d, "oom_events")).collect();
    let peaks: Vec<u64> = summary.iter().map(|d| u(d, "peak_live_bytes")).collect();
    assert_eq!(ooms, [0, 1, 0]);
    assert_eq!(peaks, [64 << 20, 8 << 20, 16 << 20]);
    // --device still picks.
    assert_eq!(json(&[&p, "--device", "0"])["device"], 0);
    // Without an oom: the largest peak.
    let two = data().join("snap_two_devices.pickle.gz");
    let j = json(&[&two.to_string_lossy()]);
    let summary = j["devices_summary"].as_array().unwrap();
    let largest = summary
        .iter()
        .max_by_key(|d| u(d, "peak_live_bytes"))
        .unwrap();
    assert_eq!(j["device"], largest["device"]);
}

/// Three 4 MiB tensors, the outer two freed, then 8 MiB: PyTorch puts them
/// in one 20 MiB segment (20 MiB reserved); a best fit in one region needs
/// 16 MiB (two 4 MiB holes apart cannot hold 8 MiB); the arena 12 MiB.
#[test]
fn three_capacities() {
    let (a, b, c) = (0x7000_0000, 0x7040_0000, 0x7080_0000);
    let events = [
        vec![
            ev("segment_alloc", a, 20 * MIB),
            ev("alloc", a, 4 * MIB),
            ev("alloc", b, 4 * MIB),
            ev("alloc", c, 4 * MIB),
        ],
        free(a, 4 * MIB),
        free(c, 4 * MIB),
        vec![ev("alloc", c, 8 * MIB)],
        free(b, 4 * MIB),
        free(c, 8 * MIB),
    ]
    .concat();
    let seg = segment(0, a, 20 * MIB, vec![block(a, 20 * MIB, "inactive", false)]);
    let p = temp(
        "three_capacities.pickle",
        &snapshot(vec![events], vec![seg]),
    );
    let j = json(&[&p]);
    assert_eq!(u(&j, "peak_live_bytes"), 12 << 20);
    assert_eq!(u(&j, "pytorch_reserved_peak_bytes"), 20 << 20);
    assert_eq!(u(&j, "best_fit_capacity_bytes"), 16 << 20);
    assert_eq!(u(&j, "arena_capacity_bytes"), 12 << 20);
    // The model of PyTorch's allocator makes the one 20 MiB segment too.
    let sim = &j["pytorch_sim"][0];
    assert_eq!(sim["segment_events"]["segment_alloc"], 1);
    assert_eq!(u(sim, "reserved_peak_bytes"), 20 << 20);
    let o = cuarena(&["replay", &p]);
    let out = text(&o.stdout);
    for (label, ratio) in [
        (
            "PyTorch reserved",
            "= 1.6667 x peak live: what PyTorch paid",
        ),
        (
            "best fit, one region",
            "= 1.3333 x peak live: no cache rounding or segments",
        ),
        (
            "cuarena, compacting",
            "= 1.0000 x peak live: compaction removes",
        ),
    ] {
        let line = out.lines().find(|l| l.trim_start().starts_with(label));
        assert!(line.is_some_and(|l| l.contains(ratio)), "{label}: {out}");
    }
}

/// Every key of `value` (nested objects and arrays included).
fn keys(value: &serde_json::Value, out: &mut BTreeSet<String>) {
    match value {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                out.insert(k.clone());
                keys(v, out);
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| keys(v, out)),
        _ => {}
    }
}

/// The field names `--help` documents: the snake_case words of its
/// `--json fields` section, except those in backticks (PyTorch's names)
/// and the alternatives of a `(a|b)` list (values).
fn documented() -> (BTreeSet<String>, String) {
    let o = cuarena(&["replay", "--help"]);
    let help = text(&o.stdout);
    let start = help.find("--json fields").expect("a --json section");
    let end = help[start..].find("exit status:").expect("an exit section") + start;
    let section = help[start..end].to_owned();
    let mut out = BTreeSet::new();
    let mut quoted = false;
    let mut word = String::new();
    let mut prev = ' ';
    for c in section.chars().chain([' ']) {
        if c.is_ascii_lowercase() || c.is_ascii_digit() || (c == '_' && !word.is_empty()) {
            word.push(c);
            continue;
        }
        let in_list = c == '|' || prev == '|';
        if word.contains('_') && !quoted && !in_list {
            out.insert(std::mem::take(&mut word));
        }
        word.clear();
        if c == '`' {
            quoted = !quoted;
        }
        prev = c;
    }
    (out, section)
}

#[test]
fn json_fields_are_the_documented_ones() {
    let p = data().join("snap_oom_caught.pickle.gz");
    let j = json(&[&p.to_string_lossy(), "--find-min"]);
    let mut present = BTreeSet::new();
    keys(&j, &mut present);
    let (doc, section) = documented();
    let missing: Vec<_> = doc.difference(&present).collect();
    assert!(
        missing.is_empty(),
        "documented, not in the JSON: {missing:?}"
    );
    let undocumented: Vec<_> = present
        .iter()
        .filter(|k| {
            if k.contains('_') {
                !doc.contains(*k)
            } else {
                !section
                    .split(|c: char| !c.is_ascii_alphanumeric())
                    .any(|w| w == k.as_str())
            }
        })
        .collect();
    assert!(
        undocumented.is_empty(),
        "in the JSON, not documented: {undocumented:?}"
    );
    assert!(doc.len() >= 50, "{doc:?}");
}

#[test]
fn json_goes_with_find_min() {
    let p = data().join("corpus_bert-infer_s0.pickle.gz");
    let j = json(&[&p.to_string_lossy(), "--find-min"]);
    let m = &j["min_capacity"];
    assert_eq!(m["arena_capacity_bytes"], j["arena_capacity_bytes"]);
    assert!(u(m, "arena_trials") >= 1);
    assert!(u(m, "non_moving_segregated_fit_capacity_bytes") >= u(&j, "peak_live_bytes"));
    // Without --find-min, no such object.
    assert!(json(&[&p.to_string_lossy()]).get("min_capacity").is_none());
}

/// `--policy` picks the arena's policy; `--json` reports every policy at
/// the replayed capacity, and naive moves at least what `auto` moves.
#[test]
fn policy_picks_the_arena_and_json_reports_every_policy() {
    let p = data().join("corpus_bert-infer_s0.pickle.gz");
    let path = p.to_string_lossy();
    let j = json(&[&path, "--policy", "naive", "--capacity", "1.01"]);
    assert_eq!(j["policy"], "naive");
    let rows = j["policies"].as_array().expect("policies");
    let names: Vec<&str> = rows.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(names, ["bounded", "auto", "naive", "nonmoving"]);
    let cap = rows[0]["capacity_bytes"].as_u64().unwrap();
    assert!(rows
        .iter()
        .all(|r| r["capacity_bytes"].as_u64() == Some(cap)));
    let moved = |k: usize| rows[k]["bytes_moved"].as_u64().unwrap();
    assert!(moved(1) <= moved(2), "auto moved more than naive: {rows:?}");
    assert_eq!(moved(3), 0);
    for r in rows {
        let c = r["compactions"].as_u64().unwrap();
        let t = r["targeted_compactions"].as_u64().unwrap();
        let f = r["full_compactions"].as_u64().unwrap();
        assert_eq!(c, t + f);
        assert_eq!(
            r["completed"].as_bool().unwrap(),
            r["failed_at_event"].is_null()
        );
    }
    let o = cuarena(&["replay", &path, "--policy", "targeted"]);
    assert_eq!(o.status.code(), Some(2));
    let err = text(&o.stderr);
    assert!(
        err.contains("`targeted`") && err.contains("bounded, auto, naive, nonmoving"),
        "{err}"
    );
}

/// `--elastic`: the elastic replay's fields are filled in, and meet issue
/// 34's checks on a recorded trace (peak mapped within max(2 MiB, 1%) of
/// peak live; bytes moved within naive's at peak live plus twice peak live).
#[test]
fn elastic_replay_fills_its_fields() {
    let p = data().join("corpus_bert-infer_s0.pickle.gz");
    let j = json(&[&p.to_string_lossy(), "--elastic"]);
    let e = &j["elastic"];
    assert_eq!(e["completed"], true);
    let peak = u(&j, "peak_live_bytes");
    assert!(u(e, "peak_mapped_bytes") <= peak + (2 << 20u64).max(peak / 100));
    assert!(u(e, "mean_mapped_bytes") > 0 && u(e, "window_us") > 0);
    assert!(u(&j, "mean_live_bytes") > 0);
    let naive = u(&j, "naive_bytes_moved_at_peak_live");
    assert!(u(e, "bytes_moved") <= naive + 2 * peak);
    // Without --elastic, the fields are there and null.
    let plain = json(&[&p.to_string_lossy()]);
    assert!(plain["elastic"]["peak_mapped_bytes"].is_null());
    assert!(plain["naive_bytes_moved_at_peak_live"].is_null());
}
