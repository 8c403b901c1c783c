//! Replaying a program on an elastic metadata arena: no capacity given,
//! memory mapped as the blocks need it and given back by the automatic
//! trim, on the trace's own clock.
//!
//! Time is the events' `time_us` where the trace has it (a PyTorch
//! snapshot), else one microsecond per op. Means are weighted by time:
//! the state after an op holds until the next op; a trace without time
//! weighs every op alike.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::ops::{round_up, Op, Ops};
use super::replay::{replay_with, Allocator, Outcome, ReplayOptions};
use crate::{Result, ToolError};
use cuarena::backend::Backend;
use cuarena::{Arena, ArenaConfig, Handle};

/// What an elastic replay did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ElasticReport {
    /// Completed or failed.
    pub outcome: Outcome,
    /// Peak live bytes (sizes rounded to the alignment).
    pub peak_live_bytes: u64,
    /// Peak mapped bytes.
    pub peak_mapped_bytes: u64,
    /// Time-weighted mean of the mapped bytes.
    pub mean_mapped_bytes: u64,
    /// Time-weighted mean of the live bytes.
    pub mean_live_bytes: u64,
    /// Time-weighted mean of the largest live bytes of the trailing window.
    pub mean_window_peak_live_bytes: u64,
    /// The automatic trim's window (and that of the mean above).
    pub window_us: u64,
    /// Whether the trace has time (else one microsecond per op).
    pub timed: bool,
    /// Bytes the arena moved.
    pub bytes_moved: u64,
    /// Trims that gave memory back.
    pub trims: u64,
    /// Wall time of the replay.
    pub wall_time: Duration,
}

/// The time of each op, from 0, never decreasing: `time_us` where the
/// trace has it, else the op's index; and whether it had.
pub fn op_times(ops: &Ops) -> (Vec<u64>, bool) {
    let t = &ops.time_us;
    let timed = t.len() == ops.ops.len() && t.iter().any(|&x| x != t[0]);
    let mut out = Vec::with_capacity(ops.ops.len());
    if timed {
        let mut last = 0u64;
        for &x in t {
            last = last.max(u64::try_from(x.saturating_sub(t[0])).unwrap_or(0));
            out.push(last);
        }
    } else {
        out.extend(0..ops.ops.len() as u64);
    }
    (out, timed)
}

/// Time-weighted mean of `value(i)`, the value after op `i`, which holds
/// until op `i + 1` (every op alike when no time passes at all).
pub fn time_weighted_mean(times: &[u64], mut value: impl FnMut(usize) -> u64) -> u64 {
    let n = times.len();
    let span = match (times.first(), times.last()) {
        (Some(a), Some(b)) if b > a => b - a,
        _ => 0,
    };
    if n == 0 {
        return 0;
    }
    let mut sum = 0f64;
    if span == 0 {
        for i in 0..n {
            sum += value(i) as f64;
        }
        return (sum / n as f64) as u64;
    }
    for i in 0..n - 1 {
        let w = times[i + 1] - times[i];
        if w > 0 {
            sum += value(i) as f64 * w as f64;
        }
    }
    (sum / span as f64) as u64
}

/// The largest of the values that held within the trailing window: a
/// monotone queue of `(until, value)`, as the arena keeps its own.
struct WindowPeak {
    window: u64,
    q: VecDeque<(u64, u64)>,
}

impl WindowPeak {
    fn note(&mut self, now: u64, v: u64) -> u64 {
        if let Some(b) = self.q.back_mut() {
            b.0 = now;
        }
        while self.q.back().is_some_and(|&(_, l)| l <= v) {
            self.q.pop_back();
        }
        self.q.push_back((u64::MAX, v));
        let from = now.saturating_sub(self.window);
        while self.q.front().is_some_and(|&(u, _)| u <= from) {
            self.q.pop_front();
        }
        self.q.front().map_or(v, |&(_, l)| l)
    }
}

/// Replays `ops` on an elastic metadata arena (the default policy, sizes
/// rounded to `align`, the automatic trim's window `window_us`, growth
/// slack `slack`), stopping at the first failing op.
pub fn replay_elastic(ops: &Ops, align: u64, window_us: u64, slack: f64) -> Result<ElasticReport> {
    let t0 = Instant::now();
    let config = ArenaConfig::elastic()
        .with_alignment_bytes(align)
        .with_trim_window_us(window_us)
        .with_elastic_slack(slack);
    let mut arena = Arena::metadata(config)?;
    let (times, timed) = op_times(ops);
    let mut handles: Vec<Option<Handle>> = vec![None; ops.sizes.len()];
    let n = ops.ops.len();
    let (mut mapped, mut live, mut wpeak) = (vec![0u64; n], vec![0u64; n], vec![0u64; n]);
    let mut window = WindowPeak {
        window: window_us,
        q: VecDeque::new(),
    };
    let mut now_live = 0u64;
    let mut outcome = Outcome::Completed;
    let mut ran = 0;
    for (i, &op) in ops.ops.iter().enumerate() {
        arena.backend().set_time_us(times[i]);
        let r: Result<()> = match op {
            Op::Alloc { id, size } => match handles.get_mut(id as usize) {
                None => Err(ToolError::Program {
                    reason: format!("op names block {id}, beyond the program's sizes"),
                }),
                Some(_) if size == 0 => Ok(()),
                Some(slot) => arena
                    .alloc(size)
                    .map(|h| {
                        *slot = Some(h);
                        now_live += round_up(size, align);
                    })
                    .map_err(Into::into),
            },
            Op::Free { id } => match handles.get_mut(id as usize).and_then(Option::take) {
                Some(h) => arena
                    .free(h)
                    .map(|()| {
                        now_live -= round_up(ops.sizes[id as usize], align);
                    })
                    .map_err(Into::into),
                None => Ok(()),
            },
        };
        if let Err(error) = r {
            let event = ops.event_index.get(i).copied().unwrap_or(i as u64);
            outcome = Outcome::Failed {
                op: i,
                event,
                error,
            };
            break;
        }
        ran = i + 1;
        mapped[i] = arena.backend().mapped_bytes();
        live[i] = now_live;
        wpeak[i] = window.note(times[i], now_live);
    }
    let times = &times[..ran];
    let st = arena.stats();
    Ok(ElasticReport {
        outcome,
        peak_live_bytes: live[..ran].iter().copied().max().unwrap_or(0),
        peak_mapped_bytes: st.peak_mapped_bytes,
        mean_mapped_bytes: time_weighted_mean(times, |i| mapped[i]),
        mean_live_bytes: time_weighted_mean(times, |i| live[i]),
        mean_window_peak_live_bytes: time_weighted_mean(times, |i| wpeak[i]),
        window_us,
        timed,
        bytes_moved: st.bytes_moved,
        trims: st.trims,
        wall_time: t0.elapsed(),
    })
}

/// Bytes naive compact-on-failure moves on `ops` at a fixed capacity of
/// the peak live bytes (`None` if it fails there).
pub fn naive_bytes_moved_at_peak_live(ops: &Ops, align: u64) -> Result<Option<u64>> {
    let peak = ops.peak_live_rounded(align).max(align);
    let config = ArenaConfig::new(round_up(peak, align)).with_alignment_bytes(align);
    let r = replay_with(
        ops,
        &config,
        &ReplayOptions::default().with_allocator(Allocator::NaiveCompacting),
    )?;
    Ok(r.completed().then_some(r.compaction.bytes_moved))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_means_and_the_window() {
        assert_eq!(time_weighted_mean(&[0, 10, 30], |i| [5, 20, 99][i]), 15);
        assert_eq!(time_weighted_mean(&[7, 7], |i| [2, 4][i]), 3);
        let mut w = WindowPeak {
            window: 100,
            q: VecDeque::new(),
        };
        assert_eq!(w.note(0, 10), 10);
        assert_eq!(w.note(10, 50), 50);
        assert_eq!(w.note(20, 5), 50);
        assert_eq!(w.note(121, 6), 6);
    }
}
