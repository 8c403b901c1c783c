//! Plans the move kernels must refuse or report: rule 3 broken (inside one
//! launch and across chunks; the fault is sticky) and ranges outside the
//! region (rejected on the host before any launch).

use super::{backend, each_kernel, KIB, MIB};
use cuarena::backend::cuda::CudaOptions;
use cuarena::backend::Backend;
use cuarena::plan::{Move, Plan, PlanKind};
use cuarena::BackendError;
use cuarena::Error;
use cuarena_testkit::gpu_available;
use cuarena_testkit::{mv, plan_of};

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn a_plan_breaking_rule_3_is_reported_and_does_not_hang() {
    if !gpu_available() {
        return;
    }
    each_kernel(|options| {
        let (mut b, _c) = backend(MIB, options);
        // Move 0 writes over the source of move 1 before it is read.
        let bad = plan_of(vec![vec![
            mv(0, 150 * KIB, 100 * KIB),
            mv(200 * KIB, 400 * KIB, 100 * KIB),
        ]]);
        assert!(bad.validate(MIB).is_err());
        b.execute(&bad)
            .expect("host checks pass: bounds and order are fine");
        let mut out = [0u8; 16];
        assert!(matches!(
            b.read(0, &mut out),
            Err(Error::Backend(BackendError::DeviceFault { .. }))
        ));
        // Faults are sticky: every later check reports it again.
        assert!(matches!(
            b.read(0, &mut out),
            Err(Error::Backend(BackendError::DeviceFault { .. }))
        ));
        assert!(matches!(
            b.write(0, &[1, 2, 3]),
            Err(Error::Backend(BackendError::DeviceFault { .. }))
        ));
        assert!(matches!(
            b.synchronize(),
            Err(Error::Backend(BackendError::DeviceFault { .. }))
        ));
    });
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn a_plan_breaking_rule_3_across_chunks_is_reported() {
    if !gpu_available() {
        return;
    }
    each_kernel(|options| {
        let (mut b, _c) = backend(8 * MIB, options);
        // 3000 moves (several chunks) of 512 B from 4 MiB down to 0; the first
        // one's destination is then pointed at the source of move 2500, which
        // only a later chunk reads.
        let base = 4 * MIB;
        let mut moves: Vec<Move> = (0..3000u64)
            .map(|i| mv(base + i * 1024, i * 1024, 512))
            .collect();
        moves[0].dst = base + 2500 * 1024;
        b.execute(&plan_of(vec![moves])).expect("host checks pass");
        let mut out = [0u8; 4];
        assert!(matches!(
            b.read(0, &mut out),
            Err(Error::Backend(BackendError::DeviceFault { .. }))
        ));
        assert!(
            matches!(
                b.read(0, &mut out),
                Err(Error::Backend(BackendError::DeviceFault { .. }))
            ),
            "sticky"
        );
    });
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn bad_ranges_are_rejected_before_any_launch() {
    if !gpu_available() {
        return;
    }
    let (mut b, _c) = backend(MIB, CudaOptions::default());
    assert!(matches!(
        b.write(MIB - 2, &[0; 4]),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        b.read(MIB, &mut [0; 1]),
        Err(Error::OutOfBounds { .. })
    ));
    let outside = plan_of(vec![vec![mv(0, MIB - 10, 11)]]);
    assert!(matches!(
        b.execute(&outside),
        Err(Error::OutOfBounds { .. })
    ));
    let unsorted = plan_of(vec![vec![mv(500, 0, 10), mv(100, 50, 10)]]);
    assert!(matches!(
        b.execute(&unsorted),
        Err(Error::InvalidInput { input: "plan", .. })
    ));
    b.execute(&Plan::empty(PlanKind::Full)).expect("empty plan");
    b.synchronize().expect("no kernel error");
}
