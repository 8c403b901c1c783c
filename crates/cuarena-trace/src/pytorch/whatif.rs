//! Which settings to try, and which one to recommend.

use super::settings::AllocatorSettings;
use super::SimReport;

/// The settings tried beside the recorded ones: PyTorch's defaults,
/// `expandable_segments:True`, `max_split_size_mb:128` and
/// `roundup_power2_divisions:4` (each alone; those equal to the recorded
/// settings are left out). `garbage_collection_threshold` is not among them:
/// it acts only under a per-process memory fraction, which a snapshot does
/// not record.
pub fn candidates(recorded: &AllocatorSettings) -> Vec<AllocatorSettings> {
    let mut out: Vec<AllocatorSettings> = Vec::new();
    for conf in [
        "",
        "expandable_segments:True",
        "max_split_size_mb:128",
        "roundup_power2_divisions:4",
    ] {
        let Ok(s) = AllocatorSettings::parse_conf(conf) else {
            continue;
        };
        if &s != recorded && !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// What to tell the user, from the runs of [`super::Session::what_if`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recommendation {
    /// The trace has `oom` events and the run at this index, under other
    /// settings than the recorded ones, serves every request within what
    /// PyTorch had reserved (the lowest peak of those that do).
    Fits {
        /// Index into the runs.
        index: usize,
    },
    /// The trace has `oom` events and no other settings serve every
    /// request within what PyTorch had.
    NoneFits,
    /// No `oom`: the run at this index reserves at least 1% less at its
    /// peak than the recorded settings from the same start (the lowest
    /// peak).
    Saves {
        /// Index into the runs.
        index: usize,
        /// Index of the run it is compared with: the recorded settings,
        /// from the same start.
        baseline: usize,
    },
    /// No `oom`, and no settings tried reserve 1% less than the recorded
    /// ones.
    KeepRecorded,
}

/// Picks the recommendation from `runs` (the recorded run first; the
/// others under other settings, except one of the recorded settings from
/// an empty start); `ooms` says whether the recording has `oom` events.
pub fn recommend(runs: &[SimReport], ooms: bool) -> Recommendation {
    let Some(first) = runs.first() else {
        return Recommendation::KeepRecorded;
    };
    let others = runs
        .iter()
        .enumerate()
        .filter(|(_, r)| r.settings != first.settings);
    if ooms {
        return match others
            .filter(|(_, r)| r.ooms.is_empty())
            .min_by_key(|(_, r)| r.reserved_peak_bytes)
        {
            Some((index, _)) => Recommendation::Fits { index },
            None => Recommendation::NoneFits,
        };
    }
    let baseline = runs
        .iter()
        .rposition(|r| r.settings == first.settings)
        .unwrap_or(0);
    match others.min_by_key(|(_, r)| r.reserved_peak_bytes) {
        Some((index, r))
            if (r.reserved_peak_bytes as f64)
                < 0.99 * runs[baseline].reserved_peak_bytes as f64 =>
        {
            Recommendation::Saves { index, baseline }
        }
        _ => Recommendation::KeepRecorded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pytorch::ModelOom;

    fn run(peak: u64, ooms: usize) -> SimReport {
        SimReport {
            settings: AllocatorSettings {
                max_split_size: peak,
                ..AllocatorSettings::default()
            },
            reserved_peak_bytes: peak,
            ooms: vec![
                ModelOom {
                    event: 1,
                    requested_bytes: 1,
                    recorded: true,
                    allocated_bytes: 0,
                    reserved_bytes: 0,
                };
                ooms
            ],
            ..SimReport::default()
        }
    }

    #[test]
    fn candidates_leave_out_the_recorded_settings() {
        let d = AllocatorSettings::default();
        let c = candidates(&d);
        assert_eq!(c.len(), 3);
        assert!(c.iter().all(|s| s != &d));
        let e = AllocatorSettings::parse_conf("expandable_segments:True").unwrap();
        assert_eq!(candidates(&e).len(), 3);
    }

    #[test]
    fn recommendations() {
        // With an oom: the lowest run that serves everything, never one of
        // the recorded settings.
        let runs = [run(100, 1), run(90, 1), run(95, 0), run(99, 0)];
        assert_eq!(recommend(&runs, true), Recommendation::Fits { index: 2 });
        assert_eq!(recommend(&runs[..2], true), Recommendation::NoneFits);
        // Without: 1% less than the recorded settings, or keep.
        let runs = [run(100, 0), run(98, 0), run(99, 0)];
        assert_eq!(
            recommend(&runs, false),
            Recommendation::Saves {
                index: 1,
                baseline: 0
            }
        );
        let runs = [run(100, 0), run(101, 0), run(99, 0)];
        assert_eq!(recommend(&runs, false), Recommendation::KeepRecorded);
        // The recorded settings again from an empty start: the baseline.
        let mut fresh = run(100, 0);
        fresh.reserved_peak_bytes = 90;
        let runs = [run(100, 0), fresh, run(95, 0)];
        assert_eq!(recommend(&runs, false), Recommendation::KeepRecorded);
    }
}
