//! Every error variant, produced by a call that earns it (host backend),
//! with its fields, its message and the two helpers checked. The backend's
//! CUDA and NCCL failures are built from their codes where no device is
//! present (the GPU tests produce them on a device).

use cuarena::backend::{Backend, HostBackend};
use cuarena::plan::{Move, Plan, PlanKind};
use cuarena::{
    Arena, ArenaConfig, BackendError, CompactionPolicy, DType, Error, Result, SharedArena,
};

const KIB: u64 = 1024;

fn arena(cap: u64) -> Arena {
    Arena::host(ArenaConfig::new(cap)).expect("arena")
}

/// `e`'s message holds every one of `parts`.
fn says(e: &Error, parts: &[&str]) {
    let msg = e.to_string();
    for p in parts {
        assert!(msg.contains(p), "{msg:?} does not say {p:?}");
    }
}

/// Neither helper claims an argument error.
fn plain(e: &Error) {
    assert!(!e.is_out_of_memory() && !e.is_retryable(), "{e:?}");
}

#[test]
fn argument_errors_name_what_was_given() {
    let mut a = arena(64 * KIB);
    let e = a.alloc(0).unwrap_err();
    assert_eq!(e, Error::ZeroSize);
    says(&e, &["zero-sized"]);
    plain(&e);

    let e = a.alloc_aligned(64, 3).unwrap_err();
    assert_eq!(
        e,
        Error::InvalidAlignment {
            align_bytes: 3,
            max_align_bytes: ArenaConfig::MAX_ALIGN
        }
    );
    says(&e, &["3 B", "1073741824"]);
    plain(&e);

    let e = Arena::host(ArenaConfig::new(1000)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidInput {
                input: "config",
                ..
            }
        ),
        "{e:?}"
    );
    says(&e, &["invalid config", "1000 B"]);
    plain(&e);
    // A hand-made plan that breaks the wave rule.
    let mv = |src, dst| Move {
        key: src,
        src,
        dst,
        len: 100,
    };
    let e = Plan::new(PlanKind::Full, [vec![mv(0, 150), mv(200, 300)]])
        .validate(1000)
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidInput { input: "plan", .. }),
        "{e:?}"
    );
    says(&e, &["invalid plan", "later move"]);

    let x = a.alloc_storage_dtype(DType::F32, 4).expect("x");
    let e = a.write(&x, &[1.0f32; 3]).unwrap_err();
    assert_eq!(
        e,
        Error::LengthMismatch {
            range_bytes: 16,
            given_bytes: 12
        }
    );
    says(&e, &["16 B", "12 B"]);
    plain(&e);

    let e = a.read::<u32>(&x).unwrap_err();
    assert_eq!(
        e,
        Error::TypeMismatch {
            range_type: "f32",
            requested_type: "u32"
        }
    );
    says(&e, &["f32", "u32", "as_dtype"]);
    plain(&e);

    // Not whole elements, and an offset inside one.
    let bytes = a.alloc(10).expect("bytes");
    let e = a.read::<u64>(bytes).unwrap_err();
    assert_eq!(
        e,
        Error::Misaligned {
            offset_bytes: 0,
            len_bytes: 10,
            elem_type: "u64",
            elem_bytes: 8
        }
    );
    says(&e, &["10 B", "8-byte", "u64"]);
    let e = x
        .as_dtype(DType::U8)
        .and_then(|b| b.slice(1..3))
        .and_then(|s| s.as_dtype(DType::I16))
        .unwrap_err();
    assert_eq!(
        e,
        Error::Misaligned {
            offset_bytes: 1,
            len_bytes: 2,
            elem_type: "i16",
            elem_bytes: 2
        }
    );
    plain(&e);
    // The backend's own fill check (a 3-byte pattern).
    let mut b = HostBackend::new(KIB).expect("backend");
    let e = b.fill(0, 6, &[1, 2, 3]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Misaligned {
                elem_bytes: 3,
                len_bytes: 6,
                ..
            }
        ),
        "{e:?}"
    );

    // Past the end, and reversed.
    let e = x.slice(2..6).unwrap_err();
    assert_eq!(
        e,
        Error::OutOfBounds {
            start_bytes: 8,
            end_bytes: 24,
            available_bytes: 16
        }
    );
    says(&e, &["8..24", "16 B available"]);
    #[allow(clippy::reversed_empty_ranges)]
    let e = x.slice(3..2).unwrap_err();
    assert_eq!(
        e,
        Error::OutOfBounds {
            start_bytes: 12,
            end_bytes: 8,
            available_bytes: 16
        }
    );
    says(&e, &["12..8", "ends before it starts"]);
    plain(&e);
    let e = b.write(KIB - 2, &[0; 4]).unwrap_err();
    assert_eq!(
        e,
        Error::OutOfBounds {
            start_bytes: KIB - 2,
            end_bytes: KIB + 2,
            available_bytes: KIB
        }
    );

    let e = a
        .copy(x.slice(0..3).expect("s"), x.slice(1..4).expect("d"))
        .unwrap_err();
    assert_eq!(
        e,
        Error::Overlap {
            first_offset: 0,
            first_bytes: 12,
            second_offset: 4,
            second_bytes: 12
        }
    );
    says(&e, &["12 B at 0 B", "12 B at 4 B", "overlap"]);
    plain(&e);
}

#[test]
fn handle_and_stream_errors_name_their_owner() {
    let mut a = arena(64 * KIB);
    let mut b = arena(64 * KIB);
    let h = a.alloc(100).expect("h");
    a.free(h).expect("free");
    let e = a.free(h).unwrap_err();
    assert_eq!(e, Error::StaleHandle);
    says(&e, &["stale handle"]);
    plain(&e);

    let hb = b.alloc(100).expect("hb");
    let e = a.info(hb).unwrap_err();
    assert_eq!(
        e,
        Error::Foreign {
            kind: "handle",
            owner: b.id(),
            arena: a.id()
        }
    );
    says(&e, &["handle", &format!("#{}", b.id())]);
    plain(&e);
    let sb = b.register_stream(()).expect("stream of b");
    let x = a.alloc(64).expect("x");
    let e = a.record_stream(x, sb).unwrap_err();
    assert_eq!(
        e,
        Error::Foreign {
            kind: "stream",
            owner: b.id(),
            arena: a.id()
        }
    );

    // An id a backend handed out, given to an arena that never registered it.
    let loose = HostBackend::new(KIB)
        .expect("backend")
        .register_stream(())
        .expect("stream");
    let e = a.wait_on_arena(loose).unwrap_err();
    assert_eq!(
        e,
        Error::UnknownStream {
            stream: 1,
            registered: 1
        }
    );
    says(&e, &["#1", "1 streams"]);
    plain(&e);
}

#[test]
fn capacity_errors_say_what_was_asked_and_available() {
    let mut a = arena(64 * KIB);
    let e = a.alloc(64 * KIB + 1).unwrap_err();
    assert_eq!(
        e,
        Error::TooLarge {
            requested_bytes: 64 * KIB + 256,
            capacity_bytes: 64 * KIB
        }
    );
    assert!(e.is_out_of_memory() && !e.is_retryable());
    // Rounded up past u64::MAX: as asked.
    assert_eq!(
        a.alloc(u64::MAX).unwrap_err(),
        Error::TooLarge {
            requested_bytes: u64::MAX,
            capacity_bytes: 64 * KIB
        }
    );

    let big = a.alloc(40 * KIB).expect("big");
    a.pin(big).expect("pin");
    let e = a.alloc(32 * KIB).unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfMemory {
                requested_bytes: 32768,
                free_bytes: 24576,
                largest_free_bytes: 24576,
                reachable_bytes: 24576
            }
        ),
        "{e:?}"
    );
    says(&e, &["out of memory", "32768 B", "24576 B"]);
    assert!(e.is_out_of_memory() && e.is_retryable());

    // Spilling with a tier too small for what must go.
    let config = ArenaConfig::new(16 * KIB).with_spill_host_bytes(4 * KIB);
    let mut s = Arena::host(config).expect("spilling arena");
    let _kept = s.alloc(12 * KIB).expect("kept");
    let e = s.alloc(12 * KIB).unwrap_err();
    assert_eq!(
        e,
        Error::HostTierFull {
            requested_bytes: 12 * KIB,
            needed_bytes: 12 * KIB,
            host_tier_bytes: 4 * KIB,
            host_free_bytes: 4 * KIB,
            host_largest_free_bytes: 4 * KIB
        }
    );
    says(&e, &["host tier of 4096 B"]);
    assert!(e.is_out_of_memory() && e.is_retryable());

    let mut m = Arena::metadata(ArenaConfig::new(1 << 62)).expect("metadata arena");
    let huge = m.alloc(1 << 61).expect("huge");
    let e = m.read_bytes(huge).unwrap_err();
    assert!(
        matches!(e, Error::HostMemory { requested_bytes, .. } if requested_bytes == 1 << 61),
        "{e:?}"
    );
    says(&e, &["host memory", "Arena::read_bytes"]);
    assert!(e.is_out_of_memory() && e.is_retryable());

    let e = a.alloc_dtype(DType::F64, u64::MAX / 4).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LimitReached {
                requested,
                limit,
                ..
            } if requested == u64::MAX / 4 && limit == u64::MAX / 8
        ),
        "{e:?}"
    );
    says(&e, &["elements", "at most"]);
    plain(&e);
}

#[test]
fn state_errors_say_what_to_do_next() {
    let config = ArenaConfig::new(16 * KIB).with_spill_host_bytes(32 * KIB);
    let mut a = Arena::host(config).expect("arena");
    let x = a.alloc(12 * KIB).expect("x");
    let _y = a.alloc(12 * KIB).expect("y spills x");
    let e = a.read::<u8>(x).unwrap_err();
    assert_eq!(e, Error::NotResident);
    says(&e, &["make_resident"]);
    assert!(e.is_retryable() && !e.is_out_of_memory());

    let p = a.alloc(256).expect("p");
    let e = a.unpin(p).unwrap_err();
    assert_eq!(e, Error::Pinned { pins: 0 });
    plain(&e);
    a.pin(p).expect("pin");
    let e = a.free(p).unwrap_err();
    assert_eq!(e, Error::Pinned { pins: 1 });
    says(&e, &["1 pin(s)"]);
    assert!(e.is_retryable());

    // A graph's table that moved (CUDA graphs only): built here.
    let e = Error::TableMoved {
        reserved_slots: 16,
        slots_in_use: 20,
    };
    says(&e, &["16 slots", "20 in use", "reserve_handle_table"]);
    plain(&e);

    let shared = SharedArena::new(arena(16 * KIB));
    let inner = shared.clone();
    let e = shared
        .with(|_| inner.alloc_storage(8).map(drop))
        .expect("the outer lock")
        .unwrap_err();
    assert_eq!(
        e,
        Error::Reentrant {
            call: "alloc_storage",
            arena: shared.id(),
            held: shared.id()
        }
    );
    says(&e, &["SharedArena::alloc_storage"]);
    assert!(e.is_retryable());
}

/// A host backend whose plans fail part-way, and whose writes report a
/// device fault when the flag is set (`arena.rs` uses it too).
pub(crate) struct Faulty(pub(crate) HostBackend, pub(crate) bool);

impl Backend for Faulty {
    type Stream = ();
    fn capacity_bytes(&self) -> u64 {
        self.0.capacity_bytes()
    }
    fn write(&mut self, o: u64, b: &[u8]) -> Result<()> {
        if !self.1 {
            return self.0.write(o, b);
        }
        Err(BackendError::DeviceFault {
            reason: "the watchdog fired".into(),
        }
        .into())
    }
    fn read(&self, o: u64, b: &mut [u8]) -> Result<()> {
        self.0.read(o, b)
    }
    fn copy(&mut self, s: u64, d: u64, n: u64) -> Result<()> {
        self.0.copy(s, d, n)
    }
    fn fill(&mut self, o: u64, n: u64, p: &[u8]) -> Result<()> {
        self.0.fill(o, n, p)
    }
    fn execute(&mut self, _: &Plan) -> Result<()> {
        Err(BackendError::Driver {
            call: "cuLaunchKernel",
            code: 700,
            name: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
        }
        .into())
    }
}

#[test]
fn a_device_fault_poisons_and_every_later_call_says_why() {
    let cap = 16 * KIB;
    let config = ArenaConfig::new(cap).with_compaction(CompactionPolicy::Manual);
    let mut a = Arena::with_backend(config, Faulty(HostBackend::new(cap).expect("b"), true))
        .expect("arena");
    let h = a.alloc(256).expect("h");
    let e = a.write(h, &[0u8; 256]).unwrap_err();
    assert!(
        matches!(&e, Error::Backend(BackendError::DeviceFault { reason }) if reason == "the watchdog fired"),
        "{e:?}"
    );
    says(&e, &["device fault", "watchdog"]);
    plain(&e);
    let e = a.alloc(256).unwrap_err();
    assert_eq!(
        e,
        Error::Poisoned {
            reason: "device fault: the watchdog fired".into()
        }
    );
    says(&e, &["unusable", "watchdog"]);
    plain(&e);
}

#[cfg(feature = "cuda")]
#[test]
fn backend_errors_keep_their_codes() {
    // No such device: on every machine.
    let e = Arena::cuda(ArenaConfig::new(KIB), 1 << 20).unwrap_err();
    assert!(
        matches!(&e, Error::Backend(BackendError::NoDevice { .. })),
        "{e:?}"
    );
    says(&e, &["no CUDA device"]);
    plain(&e);

    // A driver failure, from its result code.
    use cuarena::backend::cuda::cudarc::driver::{sys::CUresult, DriverError};
    let oom = BackendError::driver(
        "cuMemAlloc",
        DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY),
    );
    assert_eq!(
        oom,
        BackendError::Driver {
            call: "cuMemAlloc",
            code: 2,
            name: "CUDA_ERROR_OUT_OF_MEMORY".into()
        }
    );
    let e = Error::from(oom);
    says(
        &e,
        &["cuMemAlloc", "CUDA_ERROR_OUT_OF_MEMORY", "CUresult 2"],
    );
    assert!(e.is_out_of_memory() && e.is_retryable());
    let e = Error::from(BackendError::driver(
        "cuMemcpy",
        DriverError(CUresult::CUDA_ERROR_INVALID_VALUE),
    ));
    plain(&e);

    // The others carry what the driver, NVRTC or NCCL said.
    for (e, part) in [
        (
            BackendError::Nvrtc {
                source_name: "moves.cu",
                log: "error: expected a ';'".into(),
            },
            "moves.cu",
        ),
        (
            BackendError::Nccl {
                call: "ncclAllReduce",
                reason: "timed out after 60 s".into(),
            },
            "ncclAllReduce",
        ),
        (
            BackendError::ForeignStream {
                reason: "another context".into(),
            },
            "stream refused",
        ),
        (BackendError::EmptyCapture, "recorded no work"),
    ] {
        let e = Error::from(e);
        says(&e, &[part]);
        plain(&e);
    }
}

#[test]
fn a_failed_plan_poisons_the_arena() {
    let cap = 16 * KIB;
    let config = ArenaConfig::new(cap).with_compaction(CompactionPolicy::Manual);
    let mut a = Arena::with_backend(config, Faulty(HostBackend::new(cap).expect("b"), true))
        .expect("arena");
    let hs: Vec<_> = (0..4).map(|_| a.alloc(KIB).expect("h")).collect();
    a.free(hs[0]).expect("free");
    let e = a.compact().unwrap_err();
    assert!(
        matches!(&e, Error::Backend(BackendError::Driver { code: 700, .. })),
        "{e:?}"
    );
    assert!(matches!(a.alloc(1), Err(Error::Poisoned { .. })));
}

/// What an error must leave as it was: every block (where, how large,
/// pinned, resident), every resident block's bytes, and the counts of
/// allocations, frees, moves and spills (a failed allocation is counted,
/// and compaction's timers run: neither is compared).
fn snapshot<B: Backend>(a: &Arena<B>) -> impl PartialEq + std::fmt::Debug {
    let blocks = a.blocks();
    let bytes: Vec<_> = blocks
        .iter()
        .filter(|b| b.resident && b.size_bytes <= 1 << 20)
        .map(|b| a.read_bytes(b.handle))
        .collect();
    let st = a.stats();
    let counts = [
        st.allocs,
        st.frees,
        st.moves,
        st.evictions,
        st.restores,
        st.allocated_bytes,
        st.host_tier_used_bytes,
        st.pinned_blocks,
    ];
    (blocks, bytes, counts)
}

/// Runs `f` on `a`, which must fail with an error that `is` accepts, and
/// leave `a` as it was.
fn unchanged<B: Backend>(
    a: &mut Arena<B>,
    what: &str,
    is: impl Fn(&Error) -> bool,
    f: impl FnOnce(&mut Arena<B>) -> Result<()>,
) {
    let before = snapshot(a);
    let e = f(a).expect_err(what);
    assert!(is(&e), "{what}: {e:?}");
    assert_eq!(snapshot(a), before, "{what} changed the arena");
}

/// A range of 8 bytes at offset 60 of a block of 64: past its end.
struct PastTheEnd(cuarena::Handle);

impl cuarena::AsRange for PastTheEnd {
    fn block_range(&self) -> cuarena::BlockRange {
        cuarena::BlockRange {
            handle: Some(self.0),
            offset_bytes: 60,
            len_bytes: Some(8),
            dtype: None,
        }
    }
}

/// The guide's examples: typed reads, writes and fills at a byte offset
/// that is not a multiple of the element's size are `Misaligned`, and
/// change nothing; at an aligned offset they work.
#[test]
fn typed_access_at_a_misaligned_offset_is_misaligned() {
    let mut a = arena(64 * KIB);
    let s = a.alloc_storage(64).expect("untyped storage");
    a.write_bytes(&s, &[7; 64]).expect("bytes");
    let mis = |offset_bytes, len_bytes, elem_type, elem_bytes| {
        move |e: &Error| {
            *e == Error::Misaligned {
                offset_bytes,
                len_bytes,
                elem_type,
                elem_bytes,
            }
        }
    };
    let r = |a: &Arena, range| {
        a.read::<f32>(s.slice_bytes(range).expect("slice"))
            .map(drop)
    };
    unchanged(&mut a, "read::<f32> at 1", mis(1, 4, "f32", 4), |a| {
        r(a, 1..5)
    });
    unchanged(&mut a, "read::<f64> at 3", mis(3, 8, "f64", 8), |a| {
        a.read::<f64>(s.slice_bytes(3..11).expect("slice"))
            .map(drop)
    });
    unchanged(&mut a, "write::<u32> at 1", mis(1, 4, "u32", 4), |a| {
        a.write::<u32>(s.slice_bytes(1..5).expect("slice"), &[9])
    });
    unchanged(&mut a, "read_into::<u16> at 5", mis(5, 4, "u16", 2), |a| {
        a.read_into::<u16>(s.slice_bytes(5..9).expect("slice"), &mut [0; 2])
    });
    unchanged(&mut a, "fill::<i64> at 4", mis(4, 16, "i64", 8), |a| {
        a.fill(s.slice_bytes(4..20).expect("slice"), -1i64)
    });
    // A typed storage read as bytes can be sliced anywhere; reading it back
    // as the type needs an aligned offset too.
    let t = a.alloc_storage_dtype(DType::F32, 4).expect("f32s");
    let at2 = t
        .as_dtype(DType::U8)
        .expect("bytes")
        .slice(2..6)
        .expect("2..6");
    assert_eq!(
        at2.as_dtype(DType::F32).unwrap_err(),
        Error::Misaligned {
            offset_bytes: 2,
            len_bytes: 4,
            elem_type: "f32",
            elem_bytes: 4
        }
    );
    unchanged(
        &mut a,
        "read::<u32> of bytes at 2",
        mis(2, 4, "u32", 4),
        |a| a.read::<u32>(s.slice_bytes(2..6).expect("slice")).map(drop),
    );
    // Aligned: fine, and bytes at any offset still are.
    assert_eq!(r(&a, 4..8), Ok(()));
    a.write::<u32>(s.slice_bytes(8..12).expect("slice"), &[9])
        .expect("aligned write");
    assert_eq!(
        a.read_bytes(s.slice_bytes(7..13).expect("slice"))
            .expect("bytes"),
        [7, 9, 0, 0, 0, 7]
    );
}

/// Each row of the guide's error table that a host arena can produce,
/// from the trigger the table names, leaves the arena as it was (blocks,
/// bytes, counts). `Poisoned` is the exception by design (the arena is
/// unusable after it): see `a_device_fault_poisons_and_every_later_call_says_why`.
#[test]
fn every_documented_error_leaves_the_arena_as_it_was() {
    let mut a = arena(64 * KIB);
    let x = a.alloc_storage_dtype(DType::F32, 16).expect("x");
    a.write(&x, &[1.5f32; 16]).expect("x's values");
    let h = a.alloc(64).expect("h");
    a.write_bytes(h, &[3; 64]).expect("h's bytes");
    let u = a.alloc_storage(64).expect("untyped");
    let pinned = a.alloc(256).expect("pinned");
    a.pin(pinned).expect("pin");
    let gone = a.alloc(64).expect("gone");
    a.free(gone).expect("free");
    let mut b = arena(64 * KIB);
    let theirs = b.alloc(64).expect("b's handle");
    let their_stream = b.register_stream(()).expect("b's stream");
    let loose = HostBackend::new(KIB)
        .expect("backend")
        .register_stream(())
        .expect("stream");

    type Row<'a> = (
        &'a str,
        fn(&Error) -> bool,
        Box<dyn FnOnce(&mut Arena) -> Result<()> + 'a>,
    );
    let rows: Vec<Row> = vec![
        (
            "ZeroSize",
            |e| *e == Error::ZeroSize,
            Box::new(|a| a.alloc(0).map(drop)),
        ),
        (
            "InvalidAlignment",
            |e| matches!(e, Error::InvalidAlignment { .. }),
            Box::new(|a| a.alloc_aligned(64, 48).map(drop)),
        ),
        (
            "LengthMismatch",
            |e| matches!(e, Error::LengthMismatch { .. }),
            Box::new(|a| a.write(&x, &[0f32; 15])),
        ),
        (
            "TypeMismatch",
            |e| matches!(e, Error::TypeMismatch { .. }),
            Box::new(|a| a.write(&x, &[0u32; 16])),
        ),
        (
            "Misaligned",
            |e| matches!(e, Error::Misaligned { .. }),
            Box::new(|a| a.write::<u64>(u.slice_bytes(4..12).expect("slice"), &[0])),
        ),
        (
            "OutOfBounds",
            |e| matches!(e, Error::OutOfBounds { .. }),
            Box::new(|a| a.write_bytes(PastTheEnd(h), &[0; 8])),
        ),
        (
            "Overlap",
            |e| matches!(e, Error::Overlap { .. }),
            Box::new(|a| a.copy(x.slice(0..8).expect("s"), x.slice(4..12).expect("d"))),
        ),
        (
            "StaleHandle",
            |e| *e == Error::StaleHandle,
            Box::new(|a| a.write_bytes(gone, &[0; 64])),
        ),
        (
            "Foreign",
            |e| matches!(e, Error::Foreign { kind: "handle", .. }),
            Box::new(|a| a.free(theirs)),
        ),
        (
            "Foreign",
            |e| matches!(e, Error::Foreign { kind: "stream", .. }),
            Box::new(|a| a.record_stream(h, their_stream)),
        ),
        (
            "UnknownStream",
            |e| matches!(e, Error::UnknownStream { .. }),
            Box::new(|a| a.record_stream(h, loose)),
        ),
        (
            "TooLarge",
            |e| matches!(e, Error::TooLarge { .. }),
            Box::new(|a| a.alloc(64 * KIB + 1).map(drop)),
        ),
        (
            "OutOfMemory",
            |e| matches!(e, Error::OutOfMemory { .. }),
            Box::new(|a| a.alloc(63 * KIB + 1).map(drop)),
        ),
        (
            "LimitReached",
            |e| matches!(e, Error::LimitReached { .. }),
            Box::new(|a| a.alloc_dtype(DType::F64, u64::MAX / 4).map(drop)),
        ),
        (
            "Pinned",
            |e| *e == Error::Pinned { pins: 1 },
            Box::new(|a| a.free(pinned)),
        ),
        (
            "Pinned",
            |e| *e == Error::Pinned { pins: 0 },
            Box::new(|a| a.unpin(h).map(drop)),
        ),
    ];
    for (what, is, f) in rows {
        unchanged(&mut a, what, is, f);
    }

    // Spilling: a tier too small, and a read of a spilled block.
    let config = ArenaConfig::new(16 * KIB).with_spill_host_bytes(4 * KIB);
    let mut s = Arena::host(config).expect("spilling arena");
    let kept = s.alloc(12 * KIB).expect("kept");
    s.write_bytes(kept, &[5; 12 * 1024]).expect("kept's bytes");
    unchanged(
        &mut s,
        "HostTierFull",
        |e| matches!(e, Error::HostTierFull { .. }),
        |s| s.alloc(12 * KIB).map(drop),
    );
    let config = ArenaConfig::new(16 * KIB).with_spill_host_bytes(32 * KIB);
    let mut s = Arena::host(config).expect("spilling arena");
    let out = s.alloc(12 * KIB).expect("out");
    let _in = s.alloc(12 * KIB).expect("spills out");
    unchanged(
        &mut s,
        "NotResident",
        |e| *e == Error::NotResident,
        |s| s.read::<u8>(out).map(drop),
    );
    // A host buffer larger than memory.
    let mut m = Arena::metadata(ArenaConfig::new(1 << 62)).expect("metadata arena");
    let huge = m.alloc(1 << 61).expect("huge");
    unchanged(
        &mut m,
        "HostMemory",
        |e| matches!(e, Error::HostMemory { .. }),
        |m| m.read_bytes(huge).map(drop),
    );
    // A configuration out of range makes no arena.
    assert!(matches!(
        Arena::host(ArenaConfig::new(1000)),
        Err(Error::InvalidInput {
            input: "config",
            ..
        })
    ));
    // Re-entry into a shared arena from its own closure.
    let shared = SharedArena::new(a);
    let inner = shared.clone();
    let before = shared.with(snapshot).expect("lock");
    let e = shared
        .with(|_| inner.write_bytes(h, &[0; 64]))
        .expect("the outer lock")
        .unwrap_err();
    assert!(matches!(e, Error::Reentrant { .. }), "{e:?}");
    assert_eq!(shared.with(snapshot).expect("lock"), before);
}

/// Every row of `docs/guide.md`'s error table is named by a test of this
/// file (a new row needs a test here).
#[test]
fn every_row_of_the_guides_error_table_has_a_test() {
    let guide = include_str!("../../docs/guide.md");
    let this = include_str!("errors.rs");
    let table = guide
        .split("| error | when | what to do |")
        .nth(1)
        .expect("the guide's error table");
    let mut rows = 0;
    for line in table.lines().skip(2).take_while(|l| l.starts_with('|')) {
        // `Name { .. }` or `Backend(Name { .. })`: the variant's name.
        let cell = line.split('`').nth(1).expect("a variant in backticks");
        let name = cell
            .trim_start_matches("Backend(")
            .split([' ', '{', ')'])
            .next()
            .expect("a name");
        let named = [format!("Error::{name}"), format!("BackendError::{name}")];
        assert!(
            named.iter().any(|n| this.contains(n.as_str())),
            "the guide's row `{cell}` has no test in tests/all/errors.rs"
        );
        rows += 1;
    }
    assert!(rows >= 28, "the table has {rows} rows");
}
