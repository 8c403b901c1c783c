//! Snapshots as PyTorch users bring them: every shipped trace reads, its
//! program starts with the blocks live before recording, ends with the
//! bytes `segments` held active, and `cuarena replay` answers first. Hand-
//! made snapshots cover what the fixtures may lack (an `oom` without
//! `addr`, PyTorch 2.0's block layout, several devices, an empty trace).

use std::path::PathBuf;

use cuarena_trace::trace::{Action, FreePoint, Trace};
use serde_pickle::Value;

use crate::cli::cuarena;
use cuarena_testkit::trace::{data, dict};

/// Every snapshot (pickle) shipped in the trace crate's `tests/data`.
fn shipped_snapshots() -> Vec<PathBuf> {
    let v = cuarena_testkit::trace::shipped_snapshots();
    assert!(v.len() >= 6, "{v:?}");
    v
}

pub(crate) fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn every_shipped_snapshot_ends_with_what_segments_hold() {
    for p in shipped_snapshots() {
        let t = Trace::read(&p).unwrap();
        for device in t.devices() {
            let ops = t.ops(device).unwrap();
            let active = t.active_at_dump(device).expect("snapshots have segments");
            // The invariant: what the replay leaves live is what PyTorch
            // said was active at the dump (allocated, or pending free).
            assert_eq!(
                ops.live_bytes_at_end,
                active.allocated + active.pending_free,
                "{} device {device}",
                p.display()
            );
            // Peak live counts the tensors live before recording.
            assert!(ops.peak_live_bytes >= ops.initial_bytes, "{}", p.display());
            assert!(ops.peak_live_bytes >= active.allocated, "{}", p.display());
            let first = t.ops_with(device, FreePoint::FirstFree).unwrap();
            assert_eq!(first.live_bytes_at_end, active.allocated, "{}", p.display());
            // Reserved at the start is what the segments hold less what
            // the segment events added.
            let r = t.reserved(device);
            assert!(r.initial.is_some() && r.peak >= r.at_dump.unwrap());
        }
    }
}

/// `cuarena replay PATH --json`, parsed.
pub(crate) fn json(args: &[&str]) -> serde_json::Value {
    let mut a = vec!["replay"];
    a.extend_from_slice(args);
    a.push("--json");
    let o = cuarena(&a);
    assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o.stderr));
    let out = text(&o.stdout);
    assert_eq!(out.lines().count(), 1, "{out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

pub(crate) fn u(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k}: {v}"))
}

#[test]
fn every_shipped_trace_prints_the_verdict_first() {
    let mut all: Vec<PathBuf> = shipped_snapshots();
    all.push(data().join("resnet50_varbatch.csv.gz"));
    for p in all {
        let path = p.to_string_lossy().into_owned();
        let t = Trace::read(&p).unwrap();
        let j = json(&[&path]);
        check_json(&j, &t, &path);
        // The screen on the small ones (the large ones take seconds each).
        if std::fs::metadata(&p).unwrap().len() > 300 << 10 {
            continue;
        }
        let o = cuarena(&["replay", &path]);
        let out = text(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{path}: {}", text(&o.stderr));
        let lines: Vec<&str> = out.lines().collect();
        let n = t.devices().len();
        // The file, the devices' table (a header and a line each), then the
        // replayed device's three capacities.
        assert!(lines[0].starts_with("cuarena replay: "), "{out}");
        assert!(lines[1].trim_start().starts_with("device"), "{out}");
        assert!(lines[2 + n].starts_with("device "), "{out}");
        let v = &lines[3 + n..];
        assert!(v[0].trim_start().starts_with("peak live"), "{out}");
        assert!(v[1].trim_start().starts_with("PyTorch reserved"), "{out}");
        assert!(
            v[2].trim_start().starts_with("best fit, one region"),
            "{out}"
        );
        assert!(
            v[3].trim_start().starts_with("cuarena, compacting"),
            "{out}"
        );
        assert!(v[3].contains("x peak live"), "{out}");
    }
}

/// The JSON verdict, consistent with the library.
fn check_json(j: &serde_json::Value, t: &Trace, path: &str) {
    {
        // One device's program: the one replayed.
        let ops = t.ops(u(j, "device") as u32).unwrap();
        assert_eq!(
            u(j, "peak_live_bytes"),
            ops.peak_live_rounded(256),
            "{path}"
        );
        assert_eq!(u(j, "live_at_end_bytes"), ops.live_bytes_at_end, "{path}");
        assert_eq!(
            u(j, "live_before_recording_bytes"),
            ops.initial_bytes,
            "{path}"
        );
        if let Some(a) = t.active_at_dump(ops.device) {
            assert_eq!(u(j, "segments_active_bytes"), a.allocated + a.pending_free);
            assert!(u(j, "pytorch_reserved_peak_bytes") >= a.reserved, "{path}");
        }
        // No allocator needs less than peak live.
        let peak = u(j, "peak_live_bytes");
        assert!(u(j, "arena_capacity_bytes") >= peak, "{path}");
        assert!(u(j, "best_fit_capacity_bytes") >= peak, "{path}");
        let n = t.devices().len();
        assert_eq!(j["devices_summary"].as_array().unwrap().len(), n, "{path}");
        // The model's first run is under the recorded settings.
        assert_eq!(j["pytorch_sim"][0]["from_recorded_state"], true, "{path}");
    }
}

// ---- hand-made snapshots -------------------------------------------------

pub(crate) fn ev(action: &str, addr: i64, size: i64) -> Value {
    dict(vec![
        ("action", Value::String(action.into())),
        ("addr", Value::I64(addr)),
        ("size", Value::I64(size)),
        ("stream", Value::I64(0)),
        ("time_us", Value::I64(1)),
        ("frames", Value::List(vec![])),
    ])
}

/// A free as PyTorch records it: `free_requested`, then `free_completed`.
pub(crate) fn free(addr: i64, size: i64) -> Vec<Value> {
    vec![
        ev("free_requested", addr, size),
        ev("free_completed", addr, size),
    ]
}

/// A block in PyTorch 2.1+'s layout, or 2.0's (no address, no requested
/// size, a `history`).
pub(crate) fn block(addr: i64, size: i64, state: &str, v20: bool) -> Value {
    if v20 {
        dict(vec![
            ("size", Value::I64(size)),
            ("state", Value::String(state.into())),
            (
                "history",
                Value::List(vec![dict(vec![("addr", Value::I64(addr))])]),
            ),
        ])
    } else {
        dict(vec![
            ("address", Value::I64(addr)),
            ("size", Value::I64(size)),
            ("requested_size", Value::I64(size - 7)),
            ("state", Value::String(state.into())),
            ("frames", Value::List(vec![])),
        ])
    }
}

pub(crate) fn segment(device: i64, addr: i64, total: i64, blocks: Vec<Value>) -> Value {
    dict(vec![
        ("device", Value::I64(device)),
        ("address", Value::I64(addr)),
        ("total_size", Value::I64(total)),
        ("stream", Value::I64(0)),
        ("segment_type", Value::String("large".into())),
        ("is_expandable", Value::Bool(false)),
        ("blocks", Value::List(blocks)),
    ])
}

pub(crate) fn snapshot(devices: Vec<Vec<Value>>, segments: Vec<Value>) -> Vec<u8> {
    let top = dict(vec![
        ("segments", Value::List(segments)),
        (
            "device_traces",
            Value::List(devices.into_iter().map(Value::List).collect()),
        ),
        ("allocator_settings", dict(vec![])),
    ]);
    serde_pickle::value_to_vec(&top, serde_pickle::SerOptions::new()).unwrap()
}

/// A session recorded after its model was loaded, that hit an OOM and went
/// on: 1 MiB of weights live before recording (only in `segments`), 512 KiB
/// freed that was allocated before, an `oom` with `device_free` and no
/// `addr`, in both block layouts.
fn oom_session(v20: bool) -> Vec<u8> {
    let mib = 1 << 20;
    let oom = dict(vec![
        ("action", Value::String("oom".into())),
        ("device_free", Value::I64(mib)),
        ("size", Value::I64(3 * mib)),
        ("stream", Value::I64(0)),
    ]);
    let events = [
        vec![
            ev("alloc", 0x10_0000 * 8, mib),
            ev("segment_alloc", 0x10_0000 * 16, 2 * mib),
        ],
        free(0x10_0000 * 4, mib / 2),
        vec![ev("snapshot", 0, 0), oom, ev("alloc", 0x10_0000 * 16, mib)],
        free(0x10_0000 * 8, mib),
        vec![
            ev("mystery", 1, 1),
            dict(vec![
                ("action", Value::String("oom".into())),
                ("size", Value::I64(10 * mib)),
            ]),
        ],
    ]
    .concat();
    let segments = vec![
        segment(
            0,
            0,
            4 * mib,
            vec![
                block(0, mib, "active_allocated", v20),
                block(mib, 3 * mib, "inactive", v20),
            ],
        ),
        segment(
            0,
            0x10_0000 * 16,
            2 * mib,
            vec![
                block(0x10_0000 * 16, mib, "active_allocated", v20),
                block(0x10_0000 * 17, mib, "inactive", v20),
            ],
        ),
    ];
    snapshot(vec![events], segments)
}

#[test]
fn a_session_with_an_oom_reads_and_counts_what_was_live_before() {
    for v20 in [false, true] {
        let t = Trace::from_bytes(&oom_session(v20), "oom").unwrap();
        assert_eq!(t.counts.of(Action::Oom), 2);
        assert_eq!((t.counts.snapshot, t.counts.unknown.len()), (1, 1));
        let oom = t.events.iter().find(|e| e.action == Action::Oom).unwrap();
        assert_eq!((oom.addr, oom.size), (1 << 20, 3 << 20));
        let ops = t.ops(0).unwrap();
        // The weights (from `segments`) and the 512 KiB freed in the trace.
        assert_eq!(ops.initial_blocks, 2, "v20 {v20}");
        assert_eq!(ops.initial_bytes, (1 << 20) + (1 << 19));
        assert_eq!(ops.initial_frees, 1);
        assert_eq!(ops.live_bytes_at_end, 2 << 20);
        let r = t.reserved(0);
        assert_eq!(
            (r.initial, r.at_dump, r.peak),
            (Some(4 << 20), Some(6 << 20), 6 << 20)
        );
    }
}

pub(crate) fn temp(name: &str, bytes: &[u8]) -> String {
    let dir = std::env::temp_dir().join(format!("cuarena-snapshots-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p.to_string_lossy().into_owned()
}

#[test]
fn the_verdict_answers_an_oom() {
    let p = temp("oom.pickle", &oom_session(false));
    let o = cuarena(&["replay", &p]);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}{}", text(&o.stderr));
    let find = |needle: &str| {
        out.lines()
            .position(|l| l.starts_with(needle))
            .unwrap_or_else(|| panic!("no `{needle}`: {out}"))
    };
    let line = |i: usize| out.lines().nth(i).unwrap_or_default().to_owned();
    // Peak live: 1 MiB of weights, 512 KiB freed later, 1 MiB, then 1 MiB.
    let peak = find("  peak live");
    assert!(
        line(peak).contains("3.00 MiB  at event 5, counting 1.50 MiB live before recording"),
        "{out}"
    );
    assert!(
        line(peak + 1).contains("6.00 MiB = 2.0000 x peak live"),
        "{out}"
    );
    assert!(
        line(peak + 3).contains("3.00 MiB = 1.0000 x peak live"),
        "{out}"
    );
    // 2 MiB live and 3 MiB asked: 5 MiB at once, within the 6 MiB reserved.
    let first = find("  oom at event 4");
    assert!(
        line(first).contains("asked 3.00 MiB, 2.00 MiB live: 5.00 MiB needed at once"),
        "{out}"
    );
    assert!(
        line(first + 1).contains("6.00 MiB reserved; the device had 1.00 MiB free"),
        "{out}"
    );
    assert!(
        line(first + 2)
            .contains("an arena of PyTorch's reserved (6.00 MiB) serves it and the rest"),
        "{out}"
    );
    // 10 MiB asked: 12 MiB at once, more than the 6 MiB reserved.
    let second = find("  oom at event 8");
    assert!(line(second).contains("12.00 MiB needed at once"), "{out}");
    assert!(
        line(second + 2).contains("(6.00 MiB) would not serve it: it needs 12.00 MiB"),
        "{out}"
    );
    assert!(out.contains("skipped: 1 snapshot, 1 `mystery`"), "{out}");
    assert!(out.contains("; 1 free matched against them"), "{out}");
    let j = json(&[&p]);
    assert_eq!(j["oom_events"], 2);
    let (a, b) = (&j["ooms"][0], &j["ooms"][1]);
    assert_eq!(a["served_by_arena_of_reserved"], true, "{a}");
    assert_eq!(a["live_plus_request_bytes"], 5 << 20, "{a}");
    assert_eq!(a["device_free_bytes"], 1 << 20, "{a}");
    assert_eq!(a["device_arena_bytes"], 7 << 20, "{a}");
    assert_eq!(a["process_capped"], false, "{a}");
    assert_eq!(b["served_by_arena_of_reserved"], false, "{b}");
    assert_eq!(b["arena_of_reserved_fails_at_event"], 8, "{b}");
    assert_eq!(b["needed_bytes"], 12 << 20, "{b}");
    assert_eq!(b["device_free_bytes"], serde_json::Value::Null, "{b}");
}

#[test]
fn several_devices_and_empty_traces() {
    let two = snapshot(
        vec![vec![ev("alloc", 4096, 100)], vec![ev("alloc", 8192, 300)]],
        vec![segment(
            1,
            0,
            4096,
            vec![block(0, 1024, "active_allocated", false)],
        )],
    );
    let p = temp("two.pickle", &two);
    let o = cuarena(&["replay", &p, "--device", "1", "--json"]);
    let json = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(json.contains("\"device\":1,\"devices\":[0,1]"), "{json}");
    assert!(
        json.contains("\"live_before_recording_bytes\":1024"),
        "{json}"
    );
    let o = cuarena(&["replay", &p, "--device", "2"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("--device 2"),
        "{}",
        text(&o.stderr)
    );

    let empty = temp("empty.pickle", &snapshot(vec![vec![]], vec![]));
    let o = cuarena(&["replay", &empty]);
    assert_eq!(o.status.code(), Some(3));
    let err = text(&o.stderr);
    assert!(err.contains("_record_memory_history(max_entries="), "{err}");
    assert!(err.contains("_dump_snapshot(path)"), "{err}");
}

#[test]
fn bad_values_exit_with_their_own_codes() {
    let huge = temp(
        "huge.csv",
        format!(
            "action,addr,size,stream,time_us\nalloc,1,{},0,0\n",
            u64::MAX - 5
        )
        .as_bytes(),
    );
    let o = cuarena(&["replay", &huge]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("18446744073709551610"),
        "{}",
        text(&o.stderr)
    );
    let csv = "tests/data/resnet50_varbatch.csv.gz";
    for (args, needle) in [
        (
            vec!["--capacity", "18446744073709551615"],
            "18446744073709551615",
        ),
        (
            vec!["--capacity", "2000000TiB"],
            "past the largest capacity",
        ),
        (vec!["--align", "2147483648"], "2147483648"),
        (vec!["--align", "3"], "not a power of two"),
        (vec!["--json", "--gpu"], "--gpu"),
    ] {
        let mut a = vec!["replay", csv];
        a.extend(args.iter().copied());
        let o = cuarena(&a);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o.stderr));
        assert!(
            text(&o.stderr).contains(needle),
            "{args:?}: {}",
            text(&o.stderr)
        );
    }
}

/// A snapshot whose pending-free and allocated blocks sum past 2^64: the
/// `--json` verdict saturates (or refuses), never wraps.
#[test]
fn json_segments_active_bytes_do_not_wrap() {
    // 2^14 pending-free blocks of 2^50 B (sum 2^64, saturating) plus one
    // allocated block: allocated + pending_free overflows u64.
    let mut blocks: Vec<Value> = (0..1i64 << 14)
        .map(|i| {
            dict(vec![
                ("address", Value::I64(i << 40)),
                ("size", Value::I64(1 << 50)),
                ("state", Value::String("active_pending_free".into())),
            ])
        })
        .collect();
    blocks.push(dict(vec![
        ("address", Value::I64(1 << 62)),
        ("size", Value::I64(512)),
        ("state", Value::String("active_allocated".into())),
    ]));
    let seg = dict(vec![
        ("address", Value::I64(0)),
        ("total_size", Value::I64(1 << 62)),
        ("blocks", Value::List(blocks)),
    ]);
    let ev = dict(vec![
        ("action", Value::String("alloc".into())),
        ("addr", Value::I64(1 << 62)),
        ("size", Value::I64(512)),
    ]);
    let top = dict(vec![
        ("segments", Value::List(vec![seg])),
        ("device_traces", Value::List(vec![Value::List(vec![ev])])),
    ]);
    let path =
        std::env::temp_dir().join(format!("cuarena-review-ovf-{}.pickle", std::process::id()));
    std::fs::write(
        &path,
        serde_pickle::value_to_vec(&top, Default::default()).unwrap(),
    )
    .unwrap();
    let o = cuarena(&["replay", &path.to_string_lossy(), "--json"]);
    let _ = std::fs::remove_file(&path);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.code().is_some(), "killed: {o:?}");
    // A wrapped sum reads 511; saturating reads u64::MAX (or refuse it).
    assert!(
        !out.contains("\"segments_active_bytes\":511,"),
        "wrapped: {out}"
    );
}
