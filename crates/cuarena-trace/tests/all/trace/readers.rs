//! The trace readers: CSV and PyTorch snapshot pickles, plain and gzipped;
//! malformed and corrupted input is an error naming the record, never a
//! panic.

use std::path::PathBuf;

use super::shared;
use cuarena::ArenaConfig;
use cuarena_testkit::trace::{dict, gzip};
use cuarena_trace::trace::{replay, Action, Trace, TraceFormat};
use cuarena_trace::ToolError;
use serde_pickle::Value;

/// A fresh directory under the system temp dir, unique per test and process.
fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cuarena-trace-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const CSV: &str = "action,addr,size,stream,time_us
segment_alloc,4096,2097152,0,1
alloc,4096,1000,0,2
alloc,5120,512,0,3
free_requested,4096,1000,0,4
free_completed,4096,1000,0,5
alloc,4096,300,0,6
free_requested,8192,77,0,7
free_completed,8192,77,0,8
free_requested,5120,512,0,9
free_completed,5120,512,0,10
";

fn check_small_csv(t: &Trace) {
    assert_eq!(t.format, TraceFormat::Csv);
    assert_eq!(t.events.len(), 10);
    assert_eq!(t.events[1].action, Action::Alloc);
    assert_eq!((t.events[1].addr, t.events[1].size), (4096, 1000));
    let ops = t.ops(0).unwrap();
    // 8192 is freed but never allocated: live from the start of recording.
    assert_eq!((ops.allocs, ops.frees, ops.skipped_frees), (3, 3, 0));
    assert_eq!(
        (ops.initial_blocks, ops.initial_bytes, ops.initial_frees),
        (1, 77, 1)
    );
    assert_eq!(ops.live_at_end, 1);
    assert_eq!(ops.live_bytes_at_end, 300);
    assert_eq!(ops.peak_live_bytes, 77 + 1512);
    assert_eq!(ops.peak_live_rounded(256), 256 + 1024 + 512);
    assert_eq!(ops.ops.len(), 7);
    assert_eq!(ops.event_index, vec![0, 1, 2, 4, 5, 7, 9]);
    assert_eq!(ops.time_us, vec![1, 2, 3, 5, 6, 8, 10]);
    assert_eq!(t.reserved_series(0), vec![(0, 2097152)]);
}

#[test]
fn csv_plain_and_gzipped() {
    let dir = temp_dir("csv");
    let plain = dir.join("t.csv");
    let gz = dir.join("t.csv.gz");
    let gz_misnamed = dir.join("t.csv.txt");
    std::fs::write(&plain, CSV).unwrap();
    std::fs::write(&gz, gzip(CSV.as_bytes())).unwrap();
    std::fs::write(&gz_misnamed, gzip(CSV.as_bytes())).unwrap();
    for p in [&plain, &gz, &gz_misnamed] {
        check_small_csv(&Trace::read(p).unwrap());
    }
    check_small_csv(&Trace::from_csv_reader(CSV.as_bytes(), "mem").unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}

/// An event dict as PyTorch 2.11 writes it, frames included.
fn py_event(action: &str, addr: i64, size: i64, time_us: i64) -> Value {
    let frame = dict(vec![
        ("name", Value::String("forward".into())),
        ("filename", Value::String("model.py".into())),
        ("line", Value::I64(42)),
    ]);
    dict(vec![
        ("action", Value::String(action.into())),
        ("addr", Value::I64(addr)),
        ("size", Value::I64(size)),
        ("stream", Value::I64(0)),
        ("time_us", Value::I64(time_us)),
        ("compile_context", Value::String("N/A".into())),
        ("user_metadata", Value::String(String::new())),
        ("frames", Value::List(vec![frame])),
    ])
}

/// A snapshot with PyTorch's top-level layout and two devices.
fn py_snapshot() -> Vec<u8> {
    let base: i64 = 139_996_067_528_704;
    let segment = dict(vec![
        ("device", Value::I64(0)),
        ("address", Value::I64(base)),
        ("total_size", Value::I64(2 << 20)),
        ("segment_type", Value::String("small".into())),
        (
            "segment_pool_id",
            Value::Tuple(vec![Value::I64(0), Value::I64(0)]),
        ),
        ("is_expandable", Value::Bool(false)),
        ("frames", Value::List(vec![])),
        ("blocks", Value::List(vec![])),
    ]);
    let dev0 = vec![
        py_event("segment_alloc", base, 2 << 20, 1),
        py_event("alloc", base, 4096, 2),
        py_event("alloc", base + 4096, 512, 3),
        py_event("free_requested", base, 4096, 4),
        py_event("free_completed", base, 4096, 5),
        py_event("oom", 0, 1 << 30, 6),
    ];
    let dev1 = vec![py_event("alloc", base, 100, 7)];
    let top = dict(vec![
        ("segments", Value::List(vec![segment])),
        (
            "device_traces",
            Value::List(vec![Value::List(dev0), Value::List(dev1)]),
        ),
        (
            "allocator_settings",
            dict(vec![
                ("PYTORCH_CUDA_ALLOC_CONF", Value::String(String::new())),
                ("max_split_size", Value::I64(-1)),
                ("garbage_collection_threshold", Value::F64(0.0)),
                ("expandable_segments", Value::Bool(false)),
            ]),
        ),
        ("external_annotations", Value::List(vec![Value::None])),
    ]);
    serde_pickle::value_to_vec(&top, serde_pickle::SerOptions::new()).unwrap()
}

#[test]
fn pickle_fixture_in_pytorch_layout() {
    let bytes = py_snapshot();
    assert_eq!(bytes[0], 0x80);
    let t = Trace::from_pickle_bytes(&bytes, "fixture").unwrap();
    assert_eq!(t.format, TraceFormat::Pickle);
    assert_eq!(t.events.len(), 7);
    assert_eq!(t.devices(), vec![0, 1]);
    assert_eq!(t.events[5].action, Action::Oom);
    assert_eq!(t.events[6].device, 1);
    let ops0 = t.ops(0).unwrap();
    assert_eq!((ops0.allocs, ops0.frees, ops0.live_at_end), (2, 1, 1));
    assert_eq!(ops0.peak_live_bytes, 4608);
    let ops1 = t.ops(1).unwrap();
    assert_eq!((ops1.allocs, ops1.peak_live_bytes), (1, 100));
    // Gzipped, through the file reader.
    let dir = temp_dir("pickle");
    let p = dir.join("snap.pickle.gz");
    std::fs::write(&p, gzip(&bytes)).unwrap();
    assert_eq!(Trace::read(&p).unwrap().events, t.events);
    let _ = std::fs::remove_dir_all(&dir);
}

fn record_of(r: Result<Trace, ToolError>) -> (u64, String) {
    match r {
        Err(ToolError::Trace {
            record, message, ..
        }) => (record, message),
        other => panic!("expected a trace error, got {other:?}"),
    }
}

#[test]
fn malformed_input_is_an_error_naming_the_record() {
    let dir = temp_dir("malformed");
    // A bad number on line 4.
    let bad = "action,addr,size,stream,time_us\nalloc,1,2,0,0\nalloc,3,4,0,0\nalloc,5,4x,0,0\n";
    let p = dir.join("bad.csv");
    std::fs::write(&p, bad).unwrap();
    let e = Trace::read(&p).unwrap_err();
    assert!(e.to_string().contains("record 4"), "{e}");
    assert!(e.to_string().contains("bad.csv"), "{e}");
    let p = dir.join("bad.csv.gz");
    std::fs::write(&p, gzip(bad.as_bytes())).unwrap();
    assert_eq!(record_of(Trace::read(&p)).0, 4);

    // Truncated gzip.
    let gz = gzip(CSV.as_bytes());
    for cut in [3, 10, gz.len() / 2, gz.len() - 1] {
        let (record, message) = record_of(Trace::from_bytes(&gz[..cut], "cut.gz"));
        assert_eq!(record, 0);
        assert!(message.contains("gzip"), "{message}");
    }

    // Pickles that are not snapshots.
    let list = serde_pickle::value_to_vec(&Value::List(vec![]), Default::default()).unwrap();
    assert!(record_of(Trace::from_bytes(&list, "l"))
        .1
        .contains("not a dict"));
    let no_traces = serde_pickle::value_to_vec(
        &dict(vec![("segments", Value::List(vec![]))]),
        Default::default(),
    )
    .unwrap();
    assert!(record_of(Trace::from_bytes(&no_traces, "d"))
        .1
        .contains("device_traces"));
    let bad_event = serde_pickle::value_to_vec(
        &dict(vec![(
            "device_traces",
            Value::List(vec![Value::List(vec![
                py_event("alloc", 1, 2, 0),
                py_event("alloc", 1, 2, 0),
                dict(vec![("action", Value::String("alloc".into()))]),
            ])]),
        )]),
        Default::default(),
    )
    .unwrap();
    assert_eq!(record_of(Trace::from_bytes(&bad_event, "e")).0, 3);
    assert_eq!(record_of(Trace::from_bytes(&[0x80, 0x05, 0xff], "x")).0, 0);
    assert_eq!(record_of(Trace::read(&dir.join("missing.csv"))).0, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Cuts and corrupts real bytes in many places: every result is `Ok` or
/// `Err`, never a panic.
#[test]
fn corrupted_files_never_panic() {
    let mut inputs: Vec<Vec<u8>> =
        vec![py_snapshot(), CSV.as_bytes().to_vec(), gzip(CSV.as_bytes())];
    if let Some(p) = shared("mlp_small_with_stacks.pickle") {
        inputs.push(std::fs::read(p).unwrap());
    }
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for input in &inputs {
        for k in 0..40 {
            let cut = (rnd() as usize) % input.len();
            let _ = Trace::from_bytes(&input[..cut], "cut");
            let mut flipped = input.clone();
            for _ in 0..=(k % 4) {
                let i = (rnd() as usize) % flipped.len();
                flipped[i] = rnd() as u8;
            }
            if let Ok(t) = Trace::from_bytes(&flipped, "flip") {
                // Whatever parsed must also pair and replay without panics.
                let ops = t.ops(0).unwrap();
                let _ = ops.peak_live_rounded(256);
            }
        }
    }
}

#[test]
fn shared_pickle_reads() {
    let Some(p) = shared("mlp_small_with_stacks.pickle") else {
        return;
    };
    let t = Trace::read(&p).unwrap();
    assert_eq!(t.format, TraceFormat::Pickle);
    assert_eq!(t.events.len(), 430);
    assert_eq!(t.devices(), vec![0]);
    let ops = t.ops(0).unwrap();
    assert_eq!((ops.allocs, ops.frees, ops.skipped_frees), (143, 140, 0));
    assert_eq!(ops.live_at_end, 3);
    assert_eq!(ops.peak_live_bytes, 86_163_656);
    let cap = ops.peak_live_rounded(256);
    let r = replay(&ops, &ArenaConfig::new(cap)).unwrap();
    assert!(r.completed(), "{:?}", r.outcome);
}
