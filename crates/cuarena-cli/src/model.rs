//! What `PYTORCH_CUDA_ALLOC_CONF` would have done: the model of PyTorch's
//! caching allocator ([`cuarena_trace::pytorch`]) run under the recorded
//! settings (checked against the recording) and under the others it tries,
//! and the setting to recommend.

use cuarena::fmt_bytes;
use cuarena_trace::pytorch::{recommend, Recommendation, Recorded, Session, SimReport};
use cuarena_trace::trace::Trace;

use crate::progress::Progress;
use crate::units::{count, ratio};
use crate::Res;

/// The model's runs on the replayed device.
pub(crate) struct Modelled {
    /// Whether the snapshot recorded its settings (else PyTorch's defaults
    /// were assumed).
    pub(crate) settings_recorded: bool,
    /// What the recording says.
    pub(crate) truth: Recorded,
    /// The recorded settings first, then the others tried.
    pub(crate) runs: Vec<SimReport>,
    pub(crate) recommendation: Recommendation,
    /// The memory limit the runs were held to (with `oom` events).
    pub(crate) cap: Option<u64>,
}

pub(crate) fn run(trace: &Trace, device: u32) -> Res<Modelled> {
    let mut progress = Progress::new();
    progress.show("modelling PyTorch's caching allocator");
    let session = Session::new(trace, device)?;
    progress.show("modelling PyTorch's caching allocator under other settings");
    let runs = session.what_if()?;
    progress.clear();
    let truth = session.truth();
    Ok(Modelled {
        settings_recorded: session.settings_recorded(),
        recommendation: recommend(&runs, truth.ooms > 0),
        truth,
        runs,
        cap: session.cap_bytes(),
    })
}

/// The settings of a run, as `PYTORCH_CUDA_ALLOC_CONF` would be written.
pub(crate) fn conf(r: &SimReport) -> String {
    r.settings.to_string()
}

/// How the model's run under the recorded settings compares with the
/// recording: "reproduces ..." or what differs.
fn check_line(m: &Modelled) -> String {
    let (t, r) = (m.truth.segment_events, &m.runs[0]);
    let s = r.segment_events;
    let mut parts = Vec::new();
    for (name, rec, got) in [
        ("segment_alloc", t.alloc, s.alloc),
        ("segment_free", t.free, s.free),
        ("segment_map", t.map, s.map),
        ("segment_unmap", t.unmap, s.unmap),
    ] {
        if rec > 0 || got > 0 {
            parts.push(if rec == got {
                format!("{rec} {name}")
            } else {
                format!("{got} {name} (recorded {rec})")
            });
        }
    }
    let same_events = t == s;
    let peak = if r.reserved_peak_bytes == m.truth.reserved_peak_bytes {
        format!("peak {}", fmt_bytes(r.reserved_peak_bytes))
    } else {
        format!(
            "peak {} (recorded {}, {:+.2}%)",
            fmt_bytes(r.reserved_peak_bytes),
            fmt_bytes(m.truth.reserved_peak_bytes),
            (ratio(r.reserved_peak_bytes, m.truth.reserved_peak_bytes) - 1.0) * 100.0
        )
    };
    if parts.is_empty() {
        parts.push("no segment events".to_owned());
    }
    let which = if m.settings_recorded {
        "recorded settings"
    } else {
        "PyTorch's defaults"
    };
    let verb = if same_events && r.reserved_peak_bytes == m.truth.reserved_peak_bytes {
        format!("{which}: the model reproduces the recording's")
    } else {
        format!("{which}: the model makes")
    };
    format!("{verb} {}, {peak}", parts.join(", "))
}

/// The lines of the first screen.
pub(crate) fn print(m: &Modelled) -> Res<()> {
    let assumed = if m.settings_recorded {
        ""
    } else {
        " (settings not recorded: PyTorch's defaults assumed)"
    };
    match m.cap {
        Some(c) => {
            outln!(
                "  PYTORCH_CUDA_ALLOC_CONF, modelled within the {} PyTorch had at its peak{assumed}",
                fmt_bytes(c)
            )?;
            outln!("  (no limit: the same run with no cap, every request served):")?;
        }
        None => outln!("  PYTORCH_CUDA_ALLOC_CONF, modelled{assumed}:")?,
    }
    let labels: Vec<String> = m
        .runs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut label = conf(r);
            let which = if m.settings_recorded {
                "recorded"
            } else {
                "assumed"
            };
            if i == 0 {
                label.push_str(&format!(" ({which})"));
            } else if r.settings == m.runs[0].settings {
                label.push_str(&format!(" ({which}, empty start)"));
            }
            label
        })
        .collect();
    let width = labels.iter().map(String::len).max().unwrap_or(0);
    for (r, label) in m.runs.iter().zip(&labels) {
        let mut line = format!(
            "    {label:<width$} {:>10} at peak",
            fmt_bytes(r.reserved_peak_bytes)
        );
        if m.cap.is_some() {
            line.push_str(&format!(
                "  {:<7}",
                count(r.ooms.len() as u64, "oom", "ooms")
            ));
        }
        if let Some(u) = r.unlimited_peak_bytes {
            line.push_str(&format!("  no limit {:>10}", fmt_bytes(u)));
        }
        outln!("{line}")?;
    }
    outln!("    ({})", check_line(m))?;
    outln!("  => {}", recommendation_line(m))
}

/// The recommendation, in a sentence.
pub(crate) fn recommendation_line(m: &Modelled) -> String {
    let budget = m.cap.map(fmt_bytes).unwrap_or_default();
    match m.recommendation {
        Recommendation::Fits { index } => {
            let r = &m.runs[index];
            format!(
                "PYTORCH_CUDA_ALLOC_CONF={} would have needed {}: this job fits in what it had ({budget})",
                conf(r),
                fmt_bytes(r.reserved_peak_bytes)
            )
        }
        Recommendation::NoneFits => {
            let least = m
                .runs
                .iter()
                .filter_map(|r| r.unlimited_peak_bytes.map(|u| (u, r)))
                .min_by_key(|(u, _)| *u);
            let least = match least {
                Some((u, r)) => format!("; the least needed is {} ({})", fmt_bytes(u), conf(r)),
                None => String::new(),
            };
            format!("no setting tried serves every request within {budget}{least}")
        }
        Recommendation::Saves { index, baseline } => {
            let (r, b) = (&m.runs[index], &m.runs[baseline]);
            format!(
                "PYTORCH_CUDA_ALLOC_CONF={} would have reserved {} at peak instead of {} ({:.1}% less)",
                conf(r),
                fmt_bytes(r.reserved_peak_bytes),
                fmt_bytes(b.reserved_peak_bytes),
                (1.0 - ratio(r.reserved_peak_bytes, b.reserved_peak_bytes)) * 100.0
            )
        }
        Recommendation::KeepRecorded => {
            "no setting tried reserves 1% less than the recorded ones: keep them".to_owned()
        }
    }
}
