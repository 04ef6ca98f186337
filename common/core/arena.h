/* arena.h - per-step scratch memory on a backend (ggml_init/ggml_reset style).
 * Allocations are bump-pointer, 64-byte aligned, and all released at once by
 * ferry_arena_reset. After a reset the arena coalesces into one chunk as large as
 * the previous high-water mark, so a steady-state step allocates nothing.
 * Under FERRY_SANITIZE every allocation is its own block, so ASan sees overflows. */
#ifndef FERRY_ARENA_H
#define FERRY_ARENA_H

#include <stddef.h>

#include "backend.h"

typedef struct ferry_arena ferry_arena;

ferry_status ferry_arena_create(ferry_backend *be, size_t chunk_bytes, ferry_arena **out);
void ferry_arena_destroy(ferry_arena *a);
/* NULL (with an error set) when the backend is out of memory. */
void *ferry_arena_alloc(ferry_arena *a, size_t nbytes);
void ferry_arena_reset(ferry_arena *a);
/* Bytes handed out since the last reset, and the high-water mark. */
size_t ferry_arena_used(const ferry_arena *a);
size_t ferry_arena_peak(const ferry_arena *a);

#endif /* FERRY_ARENA_H */
