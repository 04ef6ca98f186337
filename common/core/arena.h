/* arena.h - per-step scratch memory (ggml_init/ggml_reset style) in chunks from an
 * allocator: host memory, or a backend's (ferry_ctx passes one).
 * Allocations are bump-pointer, 64-byte aligned, and all released at once by
 * ferry_arena_reset. After a reset the arena coalesces into one chunk as large as
 * the previous high-water mark, so a steady-state step allocates nothing.
 * Under FERRY_SANITIZE every allocation is its own block, so ASan sees overflows. */
#ifndef FERRY_ARENA_H
#define FERRY_ARENA_H

#include <stddef.h>

#include "ferry/status.h"

typedef struct ferry_arena ferry_arena;

/* Where chunks come from: alloc returns NULL when out of memory. */
typedef struct ferry_arena_allocator {
    void *(*alloc)(void *user, size_t nbytes);
    void (*free)(void *user, void *ptr);
    void *user;
} ferry_arena_allocator;

/* The allocator is copied. */
ferry_status ferry_arena_create(const ferry_arena_allocator *mem, size_t chunk_bytes,
                                ferry_arena **out);
void ferry_arena_destroy(ferry_arena *a);
/* NULL (with an error set) when the backend is out of memory. */
void *ferry_arena_alloc(ferry_arena *a, size_t nbytes);
void ferry_arena_reset(ferry_arena *a);
/* Bytes handed out since the last reset, and the high-water mark. */
size_t ferry_arena_used(const ferry_arena *a);
size_t ferry_arena_peak(const ferry_arena *a);

#endif /* FERRY_ARENA_H */
