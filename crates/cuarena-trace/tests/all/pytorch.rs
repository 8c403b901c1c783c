//! The model of PyTorch's caching allocator on every shipped snapshot:
//! under the settings each was recorded with, from the state it implies,
//! it makes the recording's own segment events (count and bytes) and its
//! reserved peak; and what it says under other settings.

use std::path::PathBuf;

use cuarena_trace::pytorch::{recommend, Recommendation, Session};
use cuarena_trace::trace::Trace;

use cuarena_testkit::trace::{data, shipped_snapshots};

/// Every snapshot (pickle) shipped in `tests/data`.
fn snapshots() -> Vec<PathBuf> {
    let v = shipped_snapshots();
    assert!(v.len() >= 20, "{v:?}");
    v
}

#[test]
fn the_model_reproduces_every_shipped_snapshot() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for p in snapshots() {
        let t = Trace::read(&p).unwrap();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        for device in t.devices() {
            let s = Session::new(&t, device).unwrap();
            let (truth, run) = (s.truth(), s.recorded());
            checked += 1;
            // Segment events: count and bytes of each kind.
            if truth.segment_events != run.segment_events {
                failures.push(format!(
                    "{name} device {device}: segment events {:?}, recorded {:?}",
                    run.segment_events, truth.segment_events
                ));
            }
            // The reserved peak within 1%, the start exactly.
            let err = run.reserved_peak_bytes as f64 / truth.reserved_peak_bytes as f64 - 1.0;
            if err.abs() > 0.01 {
                failures.push(format!(
                    "{name} device {device}: reserved peak {} vs recorded {} ({:+.2}%)",
                    run.reserved_peak_bytes,
                    truth.reserved_peak_bytes,
                    err * 100.0
                ));
            }
            if truth.reserved_initial_bytes != Some(run.reserved_initial_bytes) {
                failures.push(format!(
                    "{name} device {device}: reserved at the start {} vs {:?}",
                    run.reserved_initial_bytes, truth.reserved_initial_bytes
                ));
            }
            // The recorded `oom` requests fail again, and nothing else does.
            let recorded_ooms = run.ooms.iter().filter(|o| o.recorded).count() as u64;
            if recorded_ooms != truth.ooms || run.ooms.len() as u64 != truth.ooms {
                failures.push(format!(
                    "{name} device {device}: {} model ooms ({recorded_ooms} recorded ones), {} recorded",
                    run.ooms.len(),
                    truth.ooms
                ));
            }
            assert_eq!(run.unplaced_initial_blocks, 0, "{name}");
        }
    }
    assert!(checked >= 26, "{checked}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_recorded_settings_are_read() {
    let t = Trace::read(&data().join("snap_expandable.pickle.gz")).unwrap();
    let s = t.allocator_settings.clone().unwrap();
    assert!(s.expandable_segments);
    assert_eq!(s.to_string(), "expandable_segments:True");
    let session = Session::new(&t, 0).unwrap();
    // `torch.cuda.empty_cache()` once, seen as unmaps the model's own
    // retry does not explain.
    assert_eq!(session.recorded().empty_cache_events.len(), 1);
    let t = Trace::read(&data().join("snap_oom_caught.pickle.gz")).unwrap();
    assert_eq!(t.allocator_settings.unwrap().to_string(), "default");
    // A CSV records none.
    let t = Trace::read(&data().join("resnet50_varbatch.csv.gz")).unwrap();
    assert!(t.allocator_settings.is_none());
}

#[test]
fn what_if_on_a_recorded_oom_and_on_a_training_run() {
    // The notebook under a 2 GiB cap: its 3 GiB request is more than
    // PyTorch ever reserved, so no setting serves every request within it.
    let t = Trace::read(&data().join("snap_oom_caught.pickle.gz")).unwrap();
    let s = Session::new(&t, 0).unwrap();
    let runs = s.what_if().unwrap();
    assert_eq!(runs[0], *s.recorded());
    assert!(runs.len() >= 4, "{}", runs.len());
    let cap = s.cap_bytes().unwrap();
    assert_eq!(cap, s.truth().reserved_peak_bytes);
    for r in &runs {
        assert_eq!(r.cap_bytes, Some(cap));
        assert!(r.reserved_peak_bytes <= cap, "{r:?}");
        let three_gib = r.ooms.iter().find(|o| o.requested_bytes == 3 << 30);
        assert!(three_gib.is_some_and(|o| o.recorded), "{}", r.settings);
        // Without the cap every request is served.
        assert!(r.unlimited_peak_bytes.unwrap() >= 3 << 30);
    }
    assert_eq!(recommend(&runs, true), Recommendation::NoneFits);

    // A GPT-2 training run with varying sequence lengths: expandable
    // segments reserve less than the default caching at the peak.
    let t = Trace::read(&data().join("corpus_gpt2-varlen-amp_s2.pickle.gz")).unwrap();
    let s = Session::new(&t, 0).unwrap();
    assert!(s.cap_bytes().is_none());
    let runs = s.what_if().unwrap();
    let exp = runs
        .iter()
        .position(|r| r.settings.expandable_segments)
        .unwrap();
    assert!(runs[exp].reserved_peak_bytes < runs[0].reserved_peak_bytes);
    assert!(runs.iter().all(|r| r.ooms.is_empty()));
    match recommend(&runs, false) {
        Recommendation::Saves { index, baseline } => {
            assert_eq!(baseline, 0);
            assert!(runs[index].reserved_peak_bytes <= runs[exp].reserved_peak_bytes);
        }
        other => panic!("{other:?}"),
    }
}
