//! The help texts: `cuarena --help` and `cuarena replay --help` (the
//! command's reference: every flag, the JSON fields, the exit statuses).

pub(crate) const MAIN_HELP: &str = "\
cuarena: a compacting GPU tensor arena, tried on your PyTorch program's allocations

usage: cuarena COMMAND [options]

commands:
  replay TRACE       a PyTorch memory snapshot or CSV trace: peak live bytes, what
                     PyTorch reserved, what a best fit and cuarena's compacting
                     arena need, each `oom` against them, what PYTORCH_CUDA_ALLOC_CONF
                     would have done; replays on the arena and baselines, SVG
                     pictures, --gpu with real bytes on a CUDA GPU
  help [COMMAND]     this text, or a command's

options:
  -h, --help         this text (`cuarena replay --help` for replay's options)
  -V, --version      the version

exit status:
  0  done, or stdout was closed by its reader (`| head`): the output stops
     there, quietly
  1  the arena failed: it did not complete the trace at the capacity asked for,
     or a check of the bytes on the GPU failed
  2  bad command line
  3  the trace cannot be read or parsed, or an output file or stdout cannot be
     written
  4  --gpu, and no usable CUDA GPU (or a build without the `cuda` feature)

Record a trace in PyTorch (2.0 or later) around a few training steps:
  torch.cuda.memory._record_memory_history(max_entries=1_000_000)
  ...  # the steps
  torch.cuda.memory._dump_snapshot(\"snapshot.pickle\")
then:
  cuarena replay snapshot.pickle --find-min --svg timeline.svg";

pub(crate) const REPLAY_HELP: &str = "\
cuarena replay: what a PyTorch allocation trace needed, what PyTorch reserved for it, and
what to change

usage: cuarena replay TRACE [options]

  TRACE                      a torch.cuda.memory._dump_snapshot pickle (PyTorch 2.x),
                             or a CSV with the header action,addr,size,stream,time_us;
                             either may be gzipped

The first lines answer the question. A table lists every device of the trace (events,
peak live bytes, what PyTorch reserved at its peak, `oom` events); the one replayed is
--device, else the first with an `oom` event, else the one with the largest peak live.
On it, three capacities for the peak live bytes (which count the tensors live before
recording began, from the snapshot's `segments`), each over peak live:
  PyTorch reserved           what PyTorch's caching allocator reserved at its peak:
                             its rounding, its cached segments, and fragmentation
  best fit, one region       the smallest region in which an exact best fit (the
                             smallest free range that holds a request, nothing moved)
                             runs the trace: no cache rounding or segments, but the
                             fragmentation of a non-moving allocator remains
  cuarena, compacting        the capacity at which cuarena's arena runs the trace:
                             compaction removes the fragmentation too
For each `oom` event: the request, the bytes live then and their sum (what the job
needed at once); PyTorch's allocated and reserved bytes and the device's free bytes;
whether an arena of PyTorch's reserved bytes serves the request and the rest of the
trace, and if not the capacity that would; then an arena of reserved plus the device's
free bytes. With more free on the device than the request, the process was held below
the device: a per-process memory fraction (which snapshots do not record) or memory
used outside PyTorch's allocator.

Then what PYTORCH_CUDA_ALLOC_CONF would have done: a model of PyTorch's caching
allocator (rounding, small and large pools, segment sizes, block splitting, per-stream
pools, max_split_size_mb, roundup_power2_divisions, garbage_collection_threshold,
expandable_segments) replays the trace under the settings the snapshot recorded
(`allocator_settings`; PyTorch's defaults when absent), from the state the snapshot
implies, and is checked against the recording's segment events and reserved peak; then
from an empty allocator under default, expandable_segments:True, max_split_size_mb:128
and roundup_power2_divisions:4. Segments get the addresses the recording's cudaMalloc
returned for the same size where it can (the driver's choice decides between equal free
blocks). With `oom` events every run is held to what PyTorch reserved at its peak (what
the process could hold), and the recommendation is the setting that serves every
request within it; without, the setting that reserves at least 1% less at its peak.

Then the details: the replays run on metadata-only arenas (placement and planning, no
bytes, no GPU needed): cuarena's policies, a naive compacting arena (full compaction on
failure) and the arena's non-moving placement (a two-level segregated fit), all at the
same capacity.

options:
  --capacity SIZE|RATIO      arena capacity: bytes, with a unit or not (15000000000,
                             12GiB, 12GB, 11000MiB, 11.5GiB; KB/MB/GB/TB are powers of
                             1000, KiB/MiB/GiB/TiB and K/M/G/T of 1024), or a ratio of
                             peak live bytes (1.02 or 1.02x); default 1.0, with --gpu
                             the smallest the metadata search finds; at most 2^60 bytes
  --find-min                 also search for the smallest capacity that completes, for
                             cuarena and for the non-moving segregated fit
  --elastic                  also replay on an elastic arena: no capacity, memory mapped
                             in chunks as needed and given back by the automatic trim
                             (default window, on the trace's `time_us`), beside naive at
                             a fixed capacity of peak live and PyTorch's reserved bytes
  --device N                 device of the trace to replay (default: the first with an
                             `oom` event, else the largest peak live)
  --align BYTES              arena alignment, a power of two up to 2^30 (default 256)
  --free-at completed|first  free at free_completed (default) or at the first free event
  --json                     print the verdict alone, as one JSON object (fields below);
                             with --find-min, the smallest capacities too; with
                             --capacity, the policies replayed at it
  --svg FILE                 write a timeline of the arena replay as SVG
  --map FILE                 write memory maps before/after the largest compaction as SVG
  --policy bounded|auto|naive|nonmoving
                             the arena's policy for the verdict's capacity, the
                             search, the pictures and --gpu (default bounded: naive's
                             bytes moved plus twice the peak live at most; auto:
                             never more than naive; naive: a full compaction when a
                             request fits in no hole; nonmoving: never moves)
  --gpu                      replay on the GPU with real bytes, against a capped CUDA
                             memory pool and cuMemAlloc (capacity default: the
                             smallest the metadata search finds)
  --gpu-ordinal N            CUDA device for --gpu (default 0)
  --gpu-no-baselines         with --gpu, skip the CUDA pool and cuMemAlloc replays
  --gpu-warmup N             passes over the trace before the timed one on the same
                             arena, checked too (default 1)
  --gpu-corrupt ID           self-test of the checks: overwrite block ID after its fill;
                             the GPU replay must fail at its free (no baselines run)
  --check-all                with --gpu, check every byte of every tensor at its free
                             (default: moved tensors and every 8th in full, 64 KiB at
                             each end of the others)
  -h, --help                 this text

--json fields (bytes are integers; null where the trace does not say):
  trace, format (pickle|csv), device (the one replayed), devices, events (kept),
  events_skipped
  devices_summary            one per device: device, events, peak_live_bytes,
                             pytorch_reserved_peak_bytes, oom_events
  alignment_bytes            every size is rounded up to it
  peak_live_bytes            peak of the bytes live at once, sizes rounded
  peak_live_event            index of the (kept) event where it is first reached
  live_before_recording_bytes, blocks_before_recording
                             tensors live when recording began (from `segments`
                             and from frees of blocks the trace never allocated)
  frees_matched_before_recording
                             frees in the trace matched against those blocks
  live_at_end_bytes          live at the end of the replay; equals
  segments_active_bytes      the bytes `segments` held active at the dump
  pytorch_reserved_initial_bytes, pytorch_reserved_peak_bytes
                             what the caching allocator reserved from the driver
                             when recording began and at its peak
  pytorch_reserved_complete  false when the trace has no `segments` (a CSV): the
                             reserved figures then omit what was reserved before
  pytorch_reserved_over_peak_live
  best_fit_capacity_bytes, best_fit_capacity_over_peak_live
                             the smallest region in which an exact best fit runs the
                             trace (found by the search --find-min uses; best fit is
                             not the arena's non-moving placement, a segregated fit)
  arena_capacity_bytes, arena_capacity_over_peak_live
                             the capacity at which cuarena (--policy) completes the
                             trace
  oom_events                 number of `oom` events on the device
  ooms                       the first 8, each: event, requested_bytes (as PyTorch
                             rounded the request), live_bytes (live then, sizes
                             rounded), live_plus_request_bytes (what the job needed at
                             once), allocated_bytes (PyTorch's, from the model; null
                             where it does not fail there), reserved_bytes,
                             device_free_bytes, served_by_arena_of_reserved (an arena of
                             reserved_bytes serves the request; the request is given
                             back at once, as the program went on without it),
                             arena_of_reserved_fails_at_event (null: it runs the rest
                             of the trace), needed_bytes (the smallest arena that
                             serves it and the rest), device_arena_bytes (reserved +
                             device free), served_by_device_arena,
                             device_arena_fails_at_event, process_capped (more free
                             on the device than the request)
  pytorch_settings_recorded  whether the snapshot recorded `allocator_settings`
  pytorch_recorded           what the recording says on the device:
                             reserved_initial_bytes, reserved_peak_bytes, ooms,
                             segment_events
  pytorch_sim                the model's runs, the recorded settings first: settings
                             (as PYTORCH_CUDA_ALLOC_CONF, or `default`),
                             pytorch_cuda_alloc_conf (the value to set; empty for the
                             defaults), from_recorded_state (else from an empty
                             allocator), cap_bytes (the limit it was held to),
                             reserved_initial_bytes, reserved_peak_bytes,
                             reserved_peak_event, reserved_peak_unlimited_bytes (with a
                             cap: the same run without it), ooms (requests it could not
                             serve), oom_at_events, served_oom_events (recorded `oom`
                             requests it served), empty_cache_events (cache emptied
                             where the recording shows it), segment_events
  segment_events             segment_alloc, segment_alloc_bytes, segment_free,
                             segment_free_bytes, segment_map, segment_map_bytes,
                             segment_unmap, segment_unmap_bytes
  pytorch_recommendation     kind (fits|none_fits|saves|keep_recorded), index (into
                             pytorch_sim), pytorch_cuda_alloc_conf, reserved_peak_bytes,
                             text (the sentence the screen prints)
  policy                     the --policy name
  policies                   every policy at the replayed capacity (--capacity,
                             default 1.0 x peak live), each: policy, capacity_bytes,
                             completed, failed_at_event (null: completed),
                             bytes_moved, moves, compactions, targeted_compactions,
                             full_compactions
  min_capacity               with --find-min: arena_capacity_bytes, arena_trials,
                             non_moving_segregated_fit_capacity_bytes
  mean_live_bytes            live bytes (sizes rounded), averaged over time: weighted
                             by `time_us` where the trace has it, else per event
  pytorch_reserved_mean_bytes
                             PyTorch's reserved bytes averaged the same way (from the
                             snapshot's segment events)
  naive_bytes_moved_at_peak_live
                             with --elastic: bytes naive moves at a fixed capacity of
                             peak live (null: it fails there, or no --elastic)
  elastic                    with --elastic (else every field null): completed,
                             peak_mapped_bytes, mean_mapped_bytes (over time, as
                             above), mean_window_peak_live_bytes (the mean over time of
                             the largest live of the trailing window), window_us (the
                             automatic trim's window), bytes_moved, trims (trims that
                             gave memory back)

exit status:
  0  done: cuarena completed the trace at the capacity replayed (with --find-min
     and no --capacity: a smallest capacity was found); or stdout was closed by
     its reader (`| head`): the command stops there, quietly
  1  cuarena did not complete the trace at --capacity (default 1.0 x peak live),
     or no capacity completes, or a check of the bytes on the GPU failed
  2  bad command line (the message names the value)
  3  the trace cannot be read or parsed (the message names the record and the
     value), or it passes a memory limit of the stages after reading (the message
     names the limit), or an output file or stdout cannot be written
  4  --gpu, and no usable CUDA GPU (or a build without the `cuda` feature)

A progress line goes to stderr while the capacities are searched (when stderr
is a terminal); the results go to stdout.";
