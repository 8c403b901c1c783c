// cuarena: resolving handles inside your own CUDA kernels.
//
// The arena keeps a device copy of its handle table (one CuarenaEntry per
// slot) in stream order with compactions. Pass the region's base address,
// the table's address (`Arena::handle_table_ptr()`, which flushes it) and
// handle bits (`Handle::to_bits()`) to a kernel launched on the arena
// stream, and resolve there: the kernel then sees every block where it is
// at that point of the stream, even if a compaction moved it since the
// host last looked.
//
// A handle's bits are `version << 32 | slot`. Live versions are odd; a
// free slot has version 0, so a stale handle never matches in the checked
// variant.
#pragma once

struct CuarenaEntry {
    unsigned long long offset;  // offset of the block in the region
    unsigned int version;       // version of the live handle in this slot; 0 when free
    unsigned int len;           // bytes of the block, saturated to 0xFFFFFFFF
};

// Address of the block named by `handle` (no checks).
__device__ __forceinline__ void* cuarena_resolve(unsigned long long base, const CuarenaEntry* table,
                                                 unsigned long long handle) {
    return reinterpret_cast<void*>(base + table[(unsigned int)handle].offset);
}

// Address of the block, or nullptr when the handle is stale or the block
// holds fewer than `need_bytes` bytes. `slots` is the table's length.
__device__ __forceinline__ void* cuarena_resolve_checked(unsigned long long base,
                                                         const CuarenaEntry* table,
                                                         unsigned int slots,
                                                         unsigned long long handle,
                                                         unsigned long long need_bytes) {
    const unsigned int slot = (unsigned int)handle;
    if (slot >= slots) return nullptr;
    const CuarenaEntry e = table[slot];
    if (e.version != (unsigned int)(handle >> 32) || need_bytes > e.len) return nullptr;
    return reinterpret_cast<void*>(base + e.offset);
}
