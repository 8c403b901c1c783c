//! Each `oom` event, against an arena: the live bytes then, the request and
//! their sum; whether an arena of what PyTorch had reserved serves the
//! request (and the rest of the trace), and if not, the capacity that would;
//! then an arena of everything the device had free as well.

use cuarena::ArenaConfig;
use cuarena_trace::pytorch::ModelOom;
use cuarena_trace::trace::{
    find_min_capacity, replay_with, Action, Op, Ops, Outcome, ReplayOptions, Reserved,
    DEVICE_FREE_UNKNOWN,
};

use crate::replay::Loaded;
use crate::{Failure, Res};

/// `oom` events analysed in full (each costs replays); the rest are counted.
pub(crate) const MAX_OOMS: usize = 8;

/// An arena replay of the program with the failed request put back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ArenaTry {
    /// Its capacity.
    pub(crate) bytes: u64,
    /// Whether it serves the request.
    pub(crate) serves: bool,
    /// The event at which it fails, if it does (`None`: it runs the rest of
    /// the trace).
    pub(crate) fails_at: Option<u64>,
}

/// One `oom` event.
pub(crate) struct Oom {
    pub(crate) event: u64,
    /// Bytes asked for (as PyTorch rounded them).
    pub(crate) requested: u64,
    /// Bytes live then (the program's, sizes rounded to the alignment).
    pub(crate) live: u64,
    /// Bytes PyTorch had reserved then.
    pub(crate) reserved: u64,
    /// Bytes PyTorch had allocated then (block sizes, from the model of its
    /// allocator), when the model failed there too.
    pub(crate) allocated: Option<u64>,
    /// Bytes the device had free (`device_free`), when recorded.
    pub(crate) device_free: Option<u64>,
    /// An arena of `reserved` bytes.
    pub(crate) of_reserved: ArenaTry,
    /// The smallest capacity at which an arena serves it and runs the rest
    /// of the trace (`None`: none found).
    pub(crate) needed: Option<u64>,
    /// An arena of `reserved + device_free` bytes, when `device_free` is
    /// recorded.
    pub(crate) of_device: Option<ArenaTry>,
}

impl Oom {
    /// Live bytes and the request: what the job needed at once.
    pub(crate) fn live_plus_request(&self, align: u64) -> u64 {
        self.live
            .saturating_add(self.requested.div_ceil(align).saturating_mul(align))
    }

    /// The device had more free than the request: PyTorch was held below
    /// the device (a per-process fraction, or memory used outside it).
    pub(crate) fn capped(&self) -> Option<bool> {
        self.device_free.map(|f| f >= self.requested)
    }
}

/// Bytes live (rounded) after the first `n` ops.
fn live_after(ops: &Ops, n: usize, align: u64) -> Res<u64> {
    let mut live = Vec::new();
    live.try_reserve_exact(ops.sizes.len())
        .map_err(|_| Failure::Io("out of memory: the live blocks at an oom event".into()))?;
    live.resize(ops.sizes.len(), false);
    let round = |s: u64| s.div_ceil(align).saturating_mul(align);
    let mut bytes: u64 = 0;
    for op in &ops.ops[..n.min(ops.ops.len())] {
        match *op {
            Op::Alloc { id, size } => {
                live[id as usize] = true;
                bytes = bytes.saturating_add(round(size));
            }
            Op::Free { id } => {
                if std::mem::take(&mut live[id as usize]) {
                    bytes = bytes.saturating_sub(round(ops.sizes[id as usize]));
                }
            }
        }
    }
    Ok(bytes)
}

/// `ops` with an alloc of `size` bytes and its free inserted before op
/// `pos` (the request served, then given back: the program went on without
/// it). The copy is allocated fallibly.
fn with_probe(ops: &Ops, pos: usize, size: u64, event: u64) -> Res<Ops> {
    let oom = |_| Failure::Io("out of memory: a copy of the program for an oom event".into());
    let id = u32::try_from(ops.sizes.len())
        .map_err(|_| Failure::Io("the program has no room for one more block".into()))?;
    let t = ops.time_us.get(pos).copied().unwrap_or(0);
    let mut o = Ops::default();
    o.ops.try_reserve_exact(ops.ops.len() + 2).map_err(oom)?;
    o.event_index
        .try_reserve_exact(ops.ops.len() + 2)
        .map_err(oom)?;
    o.time_us
        .try_reserve_exact(ops.ops.len() + 2)
        .map_err(oom)?;
    o.sizes
        .try_reserve_exact(ops.sizes.len() + 1)
        .map_err(oom)?;
    o.sizes.extend_from_slice(&ops.sizes);
    o.sizes.push(size);
    let pos = pos.min(ops.ops.len());
    o.ops.extend_from_slice(&ops.ops[..pos]);
    o.ops.extend([Op::Alloc { id, size }, Op::Free { id }]);
    o.ops.extend_from_slice(&ops.ops[pos..]);
    o.event_index.extend_from_slice(&ops.event_index[..pos]);
    o.event_index.extend([event, event]);
    o.event_index.extend_from_slice(&ops.event_index[pos..]);
    o.time_us.extend_from_slice(&ops.time_us[..pos]);
    o.time_us.extend([t, t]);
    o.time_us.extend_from_slice(&ops.time_us[pos..]);
    o.device = ops.device;
    Ok(o)
}

/// The probe program replayed on an arena of `bytes` (rounded down to the
/// alignment); the request is op `pos`.
fn try_arena(probe: &Ops, pos: usize, bytes: u64, align: u64, event: u64) -> Res<ArenaTry> {
    let bytes = bytes.min(crate::args::MAX_CAPACITY) / align * align;
    if bytes == 0 {
        return Ok(ArenaTry {
            bytes,
            serves: false,
            fails_at: Some(event),
        });
    }
    let config = ArenaConfig::new(bytes).with_alignment_bytes(align);
    let r = replay_with(probe, &config, &ReplayOptions::default())?;
    Ok(match r.outcome {
        Outcome::Completed => ArenaTry {
            bytes,
            serves: true,
            fails_at: None,
        },
        Outcome::Failed { op, event: at, .. } => ArenaTry {
            bytes,
            serves: op > pos,
            fails_at: Some(at),
        },
    })
}

/// The first [`MAX_OOMS`] `oom` events of the device, and how many there
/// are. `model` holds the model's failures under the recorded settings (for
/// PyTorch's allocated bytes).
pub(crate) fn analyse(
    l: &Loaded,
    align: u64,
    reserved: &Reserved,
    model: &[ModelOom],
) -> Res<(Vec<Oom>, u64)> {
    let ops = &l.ops;
    let mut out = Vec::new();
    let mut total = 0;
    for (i, e) in l.trace.events.iter().enumerate() {
        if e.device != l.device || e.action != Action::Oom {
            continue;
        }
        total += 1;
        if out.len() >= MAX_OOMS {
            continue;
        }
        let event = i as u64;
        let pos = ops.event_index.partition_point(|&x| x <= event);
        let live = live_after(ops, pos, align)?;
        let at = reserved.at(event);
        let device_free = (e.addr != DEVICE_FREE_UNKNOWN).then_some(e.addr);
        let probe = with_probe(ops, pos, e.size, event)?;
        let of_reserved = try_arena(&probe, pos, at, align, event)?;
        let needed = find_min_capacity(&probe, align)
            .ok()
            .map(|m| m.capacity_bytes);
        let of_device = match device_free {
            Some(free) => Some(try_arena(
                &probe,
                pos,
                at.saturating_add(free),
                align,
                event,
            )?),
            None => None,
        };
        let allocated = model
            .iter()
            .find(|m| m.event == event && m.recorded)
            .map(|m| m.allocated_bytes);
        out.push(Oom {
            event,
            requested: e.size,
            live,
            reserved: at,
            allocated,
            device_free,
            of_reserved,
            needed,
            of_device,
        });
    }
    Ok((out, total))
}
