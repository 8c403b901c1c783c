// cuarena: shared definitions of the compaction kernels (kernels/moves.cu).
//
// The host side (src/backend/cuda/) mirrors `WaveArgs` field for field as a
// #[repr(C)] struct; change both together.
#pragma once

typedef unsigned int u32;
typedef unsigned long long u64;

// Threads per CTA of the move kernel.
#ifndef CUARENA_THREADS
#define CUARENA_THREADS 256
#endif

// 16-byte vectors each thread stages in registers per tile.
#ifndef CUARENA_VPT
#define CUARENA_VPT 8
#endif

// Bytes of one tile: every CTA loads a whole tile into registers, then
// stores it. A tile never spans two moves.
#define CUARENA_TILE_BYTES ((u64)CUARENA_THREADS * CUARENA_VPT * 16)

// Spin iterations (each with a short sleep) before a wait gives up and
// reports CUARENA_ERR_TIMEOUT instead of hanging the GPU.
#ifndef CUARENA_SPIN_LIMIT
#define CUARENA_SPIN_LIMIT (1u << 26)
#endif

// Bits of the error word ctl[1].
#define CUARENA_ERR_ORDER 1u   // a destination overlaps a later move's source
#define CUARENA_ERR_TIMEOUT 2u // a wait never completed

// One tile, written by cuarena_prep and read by cuarena_move.
struct TileDesc {
    u64 src;   // device address of the tile's first source byte
    u64 dst;   // device address of its first destination byte
    u32 n;     // bytes (1..=CUARENA_TILE_BYTES)
    u32 lo;    // tiles lo..=hi must be loaded before the waiting part stores
    u32 hi;    //   (lo > hi: none). Deferred tiles: lo is the byte offset in
               //   the side buffer of the lower part, hi its length.
    u32 wait;  // bits 0..23: the first `wait` destination bytes lie below the
               // tile's own source and may cover earlier tiles' sources: they
               // store after the wait; the rest covers at most the tile's own
               // source and stores right after the tile is loaded.
               // Bit 24 (CUARENA_SHIFTED): source or destination is not
               // 16-byte aligned, so the tile takes the shifting path.
               // Bit 25 (CUARENA_DEFERRED): the lower part goes to the side
               // buffer instead of waiting, and cuarena_settle copies it to
               // its destination after the move kernel (see moves.cu).
               // Bit 26 (CUARENA_KEEP): the tile's source lies inside its
               // move's destination, so the move overwrites it later; the
               // bulk kernel loads it with the L2 evict_last policy (see
               // bulk.cu).
};

#define CUARENA_WAIT_MASK 0xFFFFFFu
#define CUARENA_SHIFTED (1u << 24)
#define CUARENA_DEFERRED (1u << 25)
#define CUARENA_KEEP (1u << 26)

// A tile defers its lower part only when it is at most this many bytes and
// at most 1/CUARENA_DEFER_RATIO of the tile: the detour through the side
// buffer costs two extra passes over those bytes.
#define CUARENA_DEFER_MAX 4096u
#define CUARENA_DEFER_RATIO 32u

// One move as the host uploads it: one record per move, so that a chunk of
// moves is one contiguous upload.
struct MoveRec {
    u64 src;              // source offset (ascending, disjoint over the wave)
    u64 dst;              // destination offset
    u64 len;              // bytes (> 0)
    u32 tile_base;        // index of the move's first tile (from 0 in each chunk)
    u32 pad;
};

// One chunk of a wave (the check kernel: the whole wave), passed by value.
// `moves` is indexed by the move's position in the chunk, per-tile arrays
// by the tile's position (tiles count from 0 in every chunk).
struct WaveArgs {
    u64 base;             // device address of the arena region
    const MoveRec* moves; // [n_moves]
    TileDesc* tiles;      // [n_tiles] (prep); consecutive chunks use different buffers, so
                          // that one chunk's prep can run beside the chunk before's moves
    u32* flags;           // [n_tiles] == epoch once the tile's source is in registers
    u32* ctl;             // ctl[0]: ticket counter (reset by prep); ctl[1]: sticky error bits;
                          // ctl[2..4]: side-buffer bytes taken, a u64 (reset by cuarena_settle);
                          // one block per buffer of `tiles`, for the same reason
    u32 n_moves;
    u32 n_tiles;
    u32 epoch;            // distinct for every launch of cuarena_move on these flags
    u32 bulk_stages;      // cuarena_move_bulk: tiles in flight per CTA (else 0)
    u64 side;             // device address of the side buffer (256-byte aligned)
    u32 side_cap;         // its bytes; 0: no tile defers (and cuarena_settle does not run)
    u32 pad;
};
