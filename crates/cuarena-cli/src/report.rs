//! `--json`: the verdict as one JSON object, written by serde from these
//! typed structs (each field is documented in `cuarena replay --help`; a
//! schema test checks that every documented field is present).

use cuarena_trace::pytorch::{Recommendation, SegmentEvents, SimReport};
use cuarena_trace::trace::{Allocator, MinCapacity, ReplayReport, TraceFormat};
use serde::Serialize;

use crate::model::{conf, Modelled};
use crate::oom::Oom;
use crate::replay::Loaded;
use crate::units::ratio;
use crate::verdict::Verdict;

/// The whole report.
#[derive(Serialize)]
pub(crate) struct Report {
    trace: String,
    format: &'static str,
    device: u32,
    devices: Vec<u32>,
    devices_summary: Vec<DeviceJson>,
    events: u64,
    events_skipped: u64,
    alignment_bytes: u64,
    peak_live_bytes: u64,
    peak_live_event: u64,
    live_before_recording_bytes: u64,
    blocks_before_recording: u64,
    frees_matched_before_recording: u64,
    live_at_end_bytes: u64,
    segments_active_bytes: Option<u64>,
    pytorch_reserved_initial_bytes: Option<u64>,
    pytorch_reserved_peak_bytes: Option<u64>,
    pytorch_reserved_complete: bool,
    pytorch_reserved_over_peak_live: Option<f64>,
    best_fit_capacity_bytes: Option<u64>,
    best_fit_capacity_over_peak_live: Option<f64>,
    arena_capacity_bytes: Option<u64>,
    arena_capacity_over_peak_live: Option<f64>,
    oom_events: u64,
    ooms: Vec<OomJson>,
    pytorch_settings_recorded: bool,
    pytorch_recorded: RecordedJson,
    pytorch_sim: Vec<SimJson>,
    pytorch_recommendation: RecommendationJson,
    /// `--policy`: the arena policy of the verdict and the search.
    policy: &'static str,
    /// Every policy at the replayed capacity.
    policies: Vec<PolicyJson>,
    /// With `--find-min`.
    #[serde(skip_serializing_if = "Option::is_none")]
    min_capacity: Option<MinJson>,
    mean_live_bytes: u64,
    pytorch_reserved_mean_bytes: Option<u64>,
    naive_bytes_moved_at_peak_live: Option<u64>,
    /// With `--elastic` (null fields otherwise).
    elastic: ElasticJson,
}

/// The elastic replay (`--elastic`).
#[derive(Serialize, Default)]
struct ElasticJson {
    completed: Option<bool>,
    peak_mapped_bytes: Option<u64>,
    mean_mapped_bytes: Option<u64>,
    mean_window_peak_live_bytes: Option<u64>,
    window_us: Option<u64>,
    bytes_moved: Option<u64>,
    trims: Option<u64>,
}

/// One policy's metadata replay at the replayed capacity.
#[derive(Serialize)]
struct PolicyJson {
    policy: &'static str,
    capacity_bytes: u64,
    completed: bool,
    failed_at_event: Option<u64>,
    bytes_moved: u64,
    moves: u64,
    compactions: u64,
    targeted_compactions: u64,
    full_compactions: u64,
}

impl From<&ReplayReport> for PolicyJson {
    fn from(r: &ReplayReport) -> Self {
        PolicyJson {
            policy: r.allocator.name(),
            capacity_bytes: r.capacity_bytes,
            completed: r.completed(),
            failed_at_event: r.failed_event(),
            bytes_moved: r.compaction.bytes_moved,
            moves: r.compaction.moves,
            compactions: r.compaction.count(),
            targeted_compactions: r.compaction.targeted_compactions,
            full_compactions: r.compaction.full_compactions,
        }
    }
}

#[derive(Serialize)]
struct DeviceJson {
    device: u32,
    events: u64,
    peak_live_bytes: u64,
    pytorch_reserved_peak_bytes: Option<u64>,
    oom_events: u64,
}

#[derive(Serialize)]
struct OomJson {
    event: u64,
    requested_bytes: u64,
    live_bytes: u64,
    live_plus_request_bytes: u64,
    allocated_bytes: Option<u64>,
    reserved_bytes: u64,
    device_free_bytes: Option<u64>,
    served_by_arena_of_reserved: bool,
    arena_of_reserved_fails_at_event: Option<u64>,
    needed_bytes: Option<u64>,
    device_arena_bytes: Option<u64>,
    served_by_device_arena: Option<bool>,
    device_arena_fails_at_event: Option<u64>,
    process_capped: Option<bool>,
}

#[derive(Serialize)]
struct SegmentJson {
    segment_alloc: u64,
    segment_alloc_bytes: u64,
    segment_free: u64,
    segment_free_bytes: u64,
    segment_map: u64,
    segment_map_bytes: u64,
    segment_unmap: u64,
    segment_unmap_bytes: u64,
}

impl From<SegmentEvents> for SegmentJson {
    fn from(s: SegmentEvents) -> Self {
        SegmentJson {
            segment_alloc: s.alloc,
            segment_alloc_bytes: s.alloc_bytes,
            segment_free: s.free,
            segment_free_bytes: s.free_bytes,
            segment_map: s.map,
            segment_map_bytes: s.map_bytes,
            segment_unmap: s.unmap,
            segment_unmap_bytes: s.unmap_bytes,
        }
    }
}

#[derive(Serialize)]
struct RecordedJson {
    reserved_initial_bytes: Option<u64>,
    reserved_peak_bytes: u64,
    segment_events: SegmentJson,
    ooms: u64,
}

#[derive(Serialize)]
struct SimJson {
    settings: String,
    pytorch_cuda_alloc_conf: String,
    from_recorded_state: bool,
    cap_bytes: Option<u64>,
    reserved_initial_bytes: u64,
    reserved_peak_bytes: u64,
    reserved_peak_event: Option<u64>,
    reserved_peak_unlimited_bytes: Option<u64>,
    ooms: u64,
    oom_at_events: Vec<u64>,
    served_oom_events: Vec<u64>,
    empty_cache_events: u64,
    segment_events: SegmentJson,
}

impl From<&SimReport> for SimJson {
    fn from(r: &SimReport) -> Self {
        SimJson {
            settings: conf(r),
            pytorch_cuda_alloc_conf: r.settings.conf(),
            from_recorded_state: r.from_recorded_state,
            cap_bytes: r.cap_bytes,
            reserved_initial_bytes: r.reserved_initial_bytes,
            reserved_peak_bytes: r.reserved_peak_bytes,
            reserved_peak_event: r.reserved_peak_event,
            reserved_peak_unlimited_bytes: r.unlimited_peak_bytes,
            ooms: r.ooms.len() as u64,
            oom_at_events: r.ooms.iter().map(|o| o.event).collect(),
            served_oom_events: r.served_recorded_ooms.clone(),
            empty_cache_events: r.empty_cache_events.len() as u64,
            segment_events: r.segment_events.into(),
        }
    }
}

#[derive(Serialize)]
struct RecommendationJson {
    kind: &'static str,
    /// Index into `pytorch_sim` (`fits`, `saves`).
    index: Option<usize>,
    pytorch_cuda_alloc_conf: Option<String>,
    reserved_peak_bytes: Option<u64>,
    text: String,
}

fn recommendation(m: &Modelled) -> RecommendationJson {
    let (kind, index) = match m.recommendation {
        Recommendation::Fits { index } => ("fits", Some(index)),
        Recommendation::NoneFits => ("none_fits", None),
        Recommendation::Saves { index, .. } => ("saves", Some(index)),
        Recommendation::KeepRecorded => ("keep_recorded", None),
    };
    let run = index.and_then(|i| m.runs.get(i));
    RecommendationJson {
        kind,
        index,
        pytorch_cuda_alloc_conf: run.map(|r| r.settings.conf()),
        reserved_peak_bytes: run.map(|r| r.reserved_peak_bytes),
        text: crate::model::recommendation_line(m),
    }
}

/// The smallest capacities (`--find-min`).
#[derive(Serialize)]
pub(crate) struct MinJson {
    pub(crate) arena_capacity_bytes: Option<u64>,
    pub(crate) arena_trials: Option<u32>,
    pub(crate) non_moving_segregated_fit_capacity_bytes: Option<u64>,
}

impl MinJson {
    pub(crate) fn new(arena: Option<&MinCapacity>, segregated: Option<&MinCapacity>) -> Self {
        MinJson {
            arena_capacity_bytes: arena.map(|m| m.capacity_bytes),
            arena_trials: arena.map(|m| m.trials),
            non_moving_segregated_fit_capacity_bytes: segregated.map(|m| m.capacity_bytes),
        }
    }
}

fn oom(o: &Oom, align: u64) -> OomJson {
    OomJson {
        event: o.event,
        requested_bytes: o.requested,
        live_bytes: o.live,
        live_plus_request_bytes: o.live_plus_request(align),
        allocated_bytes: o.allocated,
        reserved_bytes: o.reserved,
        device_free_bytes: o.device_free,
        served_by_arena_of_reserved: o.of_reserved.serves,
        arena_of_reserved_fails_at_event: o.of_reserved.fails_at,
        needed_bytes: o.needed,
        device_arena_bytes: o.of_device.map(|d| d.bytes),
        served_by_device_arena: o.of_device.map(|d| d.serves),
        device_arena_fails_at_event: o.of_device.and_then(|d| d.fails_at),
        process_capped: o.capped(),
    }
}

impl Report {
    pub(crate) fn new(
        l: &Loaded,
        v: &Verdict,
        align: u64,
        policy: Allocator,
        policies: &[ReplayReport],
        min: Option<MinJson>,
        elastic: Option<&crate::elastic::ElasticOut>,
    ) -> Report {
        let (mean_live_bytes, pytorch_reserved_mean_bytes) = crate::elastic::means(l, align);
        let elastic_json = elastic.map_or_else(ElasticJson::default, |e| {
            let r = &e.report;
            ElasticJson {
                completed: Some(r.outcome.is_completed()),
                peak_mapped_bytes: Some(r.peak_mapped_bytes),
                mean_mapped_bytes: Some(r.mean_mapped_bytes),
                mean_window_peak_live_bytes: Some(r.mean_window_peak_live_bytes),
                window_us: Some(r.window_us),
                bytes_moved: Some(r.bytes_moved),
                trims: Some(r.trims),
            }
        });
        let o = &l.ops;
        let active = l.trace.active_at_dump(l.device);
        let reserved_known = !v.reserved.series.is_empty() || v.reserved.initial.is_some();
        let m = &v.pytorch;
        Report {
            trace: l.trace.source.clone(),
            format: match l.trace.format {
                TraceFormat::Csv => "csv",
                TraceFormat::Pickle => "pickle",
            },
            device: l.device,
            devices: l.devices.iter().map(|d| d.device).collect(),
            devices_summary: l
                .devices
                .iter()
                .map(|d| DeviceJson {
                    device: d.device,
                    events: d.events,
                    peak_live_bytes: d.peak_live,
                    pytorch_reserved_peak_bytes: d.reserved_peak,
                    oom_events: d.ooms,
                })
                .collect(),
            events: l.trace.events.len() as u64,
            events_skipped: l.trace.counts.skipped(),
            alignment_bytes: align,
            peak_live_bytes: v.peak,
            peak_live_event: v.peak_event,
            live_before_recording_bytes: o.initial_bytes,
            blocks_before_recording: o.initial_blocks,
            frees_matched_before_recording: o.initial_frees,
            live_at_end_bytes: o.live_bytes_at_end,
            segments_active_bytes: active.map(|a| a.allocated.saturating_add(a.pending_free)),
            pytorch_reserved_initial_bytes: v.reserved.initial,
            pytorch_reserved_peak_bytes: reserved_known.then_some(v.reserved.peak),
            pytorch_reserved_complete: v.reserved.initial.is_some(),
            pytorch_reserved_over_peak_live: reserved_known.then(|| ratio(v.reserved.peak, v.peak)),
            best_fit_capacity_bytes: v.best_fit,
            best_fit_capacity_over_peak_live: v.best_fit.map(|b| ratio(b, v.peak)),
            arena_capacity_bytes: v.capacity,
            arena_capacity_over_peak_live: v.capacity.map(|c| ratio(c, v.peak)),
            oom_events: v.ooms_total,
            ooms: v.ooms.iter().map(|x| oom(x, align)).collect(),
            pytorch_settings_recorded: m.settings_recorded,
            pytorch_recorded: RecordedJson {
                reserved_initial_bytes: m.truth.reserved_initial_bytes,
                reserved_peak_bytes: m.truth.reserved_peak_bytes,
                segment_events: m.truth.segment_events.into(),
                ooms: m.truth.ooms,
            },
            pytorch_sim: m.runs.iter().map(SimJson::from).collect(),
            pytorch_recommendation: recommendation(m),
            policy: policy.name(),
            policies: policies.iter().map(PolicyJson::from).collect(),
            min_capacity: min,
            mean_live_bytes,
            pytorch_reserved_mean_bytes,
            naive_bytes_moved_at_peak_live: elastic.and_then(|e| e.naive_at_peak),
            elastic: elastic_json,
        }
    }

    /// One line of JSON.
    pub(crate) fn to_line(&self) -> String {
        // Every field is a plain number, string, bool, null or list: the
        // serializer cannot fail on them (a non-finite ratio is written as
        // null by serde_json).
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}
