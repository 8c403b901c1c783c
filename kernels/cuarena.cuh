// cuarena: resolving handles inside your own CUDA kernels.
//
// The arena keeps a device copy of its handle table (one CuarenaEntry per
// slot) in stream order with compactions. Pass the region's base address,
// the table's address (`Arena::handle_table_ptr()`, which flushes it) and
// handle bits (`Handle::to_bits()`) to a kernel launched on the arena
// stream, and resolve there: the kernel then sees every block where it is
// at that point of the stream, even if a compaction moved it since the
// host last looked. `cuarena::graph::HandleArgs` packs base,
// table and slot count into one `CuarenaTable` argument, and `ArenaGraph`
// captures such kernels into a CUDA graph that stays correct across
// compactions (the table's address is fixed while the graph lives; see
// `graph::reserve_handle_table`).
//
// Sources compiled with `cuarena::backend::cuda::compile` include this
// header by name (`#include "cuarena.cuh"`); its text is
// `cuarena::backend::cuda::CUARENA_CUH`, for other compilers.
//
// # The handle ABI (defined by the crate: src/slots.rs, pinned by the
// # host test `the_header_decodes_the_abi` in tests/all/abi.rs)
//
// - A handle's bits (`Handle::to_bits()`, a `u64` kernel argument) are
//   `version << 32 | slot`: CUARENA_HANDLE_SLOT and CUARENA_HANDLE_VERSION
//   below take them apart.
// - A slot's version counts its allocations and frees: odd while a block
//   lives in it, even once it is freed. The first block in a slot has
//   version 1, so the first handles an arena gives out are `1 << 32 | 0`,
//   `1 << 32 | 1`, ...; a slot freed and reused gets version 3, and so on.
// - The device table's entry of a slot that holds no resident block (never
//   used, freed, or spilled to the host tier) reads version 0 (and offset
//   0), which no handle carries, so the checked resolve rejects a stale
//   handle, a freed one and a spilled one. Replay through
//   `ArenaGraph::launch` (or take `launch_args`), which brings spilled
//   handles back first.
// - A slot whose version would wrap past 2^32 - 1 is retired: never reused,
//   so a stale handle can never name a later block.
//
// # What it costs (benches/handles.rs on an H200, CUDA events, same run,
// # median of 100 interleaved launches; BENCHMARKS.md has the tables)
//
// Resolving is one dependent 8-byte load per handle (16 bytes for the
// checked variant) from a table that every thread of a launch reads at the
// same few addresses, so after the first CTA it is an L1/L2 hit. Resolve
// once, at the top of the kernel, not inside the element loop (stores
// through the resolved pointer may alias the table as far as the compiler
// knows, so it would reload the entry each iteration). Done that way,
// c = a + b over three 1 GiB f32 tensors (3 GiB of traffic, ~0.78 ms at
// ~4.1 TB/s) costs:
//   grid-stride loop, 8 CTAs/SM:     +0.24% unchecked, +0.36% checked
//   one float4 per thread (2^26 threads, each resolving three handles):
//                                    +0.05% unchecked, +0.04% checked
// against raw pointers of the same kernel: within run-to-run noise, and
// well under the 2% target.
//
// Keeping the table current costs the arena one host-to-device copy of the
// changed slots per compaction, enqueued on the arena stream right after
// the moves: 16 bytes per slot between the lowest and highest changed slot.
// A full compaction of 100,000 blocks of 4-64 KiB (3317 MiB moved, 2.01 ms
// of device time) sends 199,625 slots (3.05 MiB): +0.095 ms of device time
// (+4.7%) over the moves alone; the copy by itself takes 0.114 ms of the
// device. Those figures were taken with the copy made from pageable
// memory, and for this 3 MiB table the driver made the host wait for the
// stream: the compaction's host time went from 0.53 ms to 2.09 ms (the
// moves' device time). From page-locked memory the same copy costs
// +0.065 ms of device time and no host wait, so the upload now goes
// through double-buffered page-locked staging (`Scratch::table_staging` in
// src/backend/cuda/mod.rs): a sync waits only for the upload before last.
#pragma once

struct CuarenaEntry {
    unsigned long long offset;  // offset of the block in the region
    unsigned int version;       // version of the live, resident block in this slot (odd);
                                // CUARENA_FREE_VERSION (0) when free, unused or spilled
    unsigned int len;           // bytes of the block, saturated to 0xFFFFFFFF
};

// The table as one kernel argument; mirrors `graph::HandleArgs` (24 bytes).
struct CuarenaTable {
    unsigned long long base;    // device address of the region's first byte
    const CuarenaEntry* table;  // device address of the handle table
    unsigned int slots;         // entries of the table that are valid to read
    unsigned int pad;
};

// The parts of a handle's bits (see the ABI above).
#define CUARENA_HANDLE_SLOT(h) ((unsigned int)((unsigned long long)(h) & 0xFFFFFFFFull))
#define CUARENA_HANDLE_VERSION(h) ((unsigned int)((unsigned long long)(h) >> 32))
// The version a free, unused or spilled slot reads in the device table.
#define CUARENA_FREE_VERSION 0u

// Address of the block named by `handle` (no checks). The address is made
// through `__cvta_global_to_generic`, so the compiler knows it is global
// memory and emits the same `ld.global` / `st.global` (and `.nc` loads under
// `__restrict__`) as for a pointer argument.
__device__ __forceinline__ void* cuarena_resolve(unsigned long long base, const CuarenaEntry* table,
                                                 unsigned long long handle) {
    return __cvta_global_to_generic((size_t)(base + table[CUARENA_HANDLE_SLOT(handle)].offset));
}

// Address of the block, or nullptr when the handle is stale or the block
// holds fewer than `need_bytes` bytes. `slots` is the table's length.
__device__ __forceinline__ void* cuarena_resolve_checked(unsigned long long base,
                                                         const CuarenaEntry* table,
                                                         unsigned int slots,
                                                         unsigned long long handle,
                                                         unsigned long long need_bytes) {
    const unsigned int slot = CUARENA_HANDLE_SLOT(handle);
    if (slot >= slots) return nullptr;
    const CuarenaEntry e = table[slot];
    // A free slot's version (0) is never a handle's (odd), so it never matches.
    if (e.version != CUARENA_HANDLE_VERSION(handle) || need_bytes > e.len) return nullptr;
    return __cvta_global_to_generic((size_t)(base + e.offset));
}

// `cuarena_resolve` through a `CuarenaTable`.
__device__ __forceinline__ void* cuarena_at(const CuarenaTable& t, unsigned long long handle) {
    return cuarena_resolve(t.base, t.table, handle);
}

// `cuarena_resolve_checked` through a `CuarenaTable`.
__device__ __forceinline__ void* cuarena_at_checked(const CuarenaTable& t,
                                                    unsigned long long handle,
                                                    unsigned long long need_bytes) {
    return cuarena_resolve_checked(t.base, t.table, t.slots, handle, need_bytes);
}
