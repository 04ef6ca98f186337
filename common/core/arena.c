/* arena.c - bump allocation over chunks from the arena's allocator; see arena.h. */
#include <stdlib.h>

#include "common/core/arena.h"
#include "common/core/log.h"

typedef struct arena_chunk {
    struct arena_chunk *next;
    char *base;
    size_t size, used;
} arena_chunk;

struct ferry_arena {
    ferry_arena_allocator mem;
    size_t chunk_bytes;
    arena_chunk *head; /* current chunk first */
    size_t used, peak;
};

ferry_status ferry_arena_create(const ferry_arena_allocator *mem, size_t chunk_bytes,
                                ferry_arena **out) {
    ferry_arena *a = calloc(1, sizeof *a);
    if (a == NULL)
        return FERRY_NOMEM();
    a->mem = *mem;
    a->chunk_bytes = chunk_bytes ? chunk_bytes : (1u << 20);
    *out = a;
    return FERRY_OK;
}

static void arena_free_chunks(ferry_arena *a) {
    arena_chunk *c = a->head;
    while (c != NULL) {
        arena_chunk *next = c->next;
        a->mem.free(a->mem.user, c->base);
        free(c);
        c = next;
    }
    a->head = NULL;
}

void ferry_arena_destroy(ferry_arena *a) {
    if (a == NULL)
        return;
    arena_free_chunks(a);
    free(a);
}

static arena_chunk *arena_new_chunk(ferry_arena *a, size_t size) {
    arena_chunk *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    if ((c->base = a->mem.alloc(a->mem.user, size)) == NULL) {
        free(c);
        return NULL;
    }
    c->size = size;
    c->next = a->head;
    a->head = c;
    return c;
}

void *ferry_arena_alloc(ferry_arena *a, size_t nbytes) {
    size_t need = (nbytes + 63) & ~(size_t)63;
    if (need == 0)
        need = 64;
    arena_chunk *c = a->head;
#ifdef FERRY_SANITIZE
    c = NULL; /* one exact-size block per allocation */
    c = arena_new_chunk(a, nbytes ? nbytes : 1);
    if (c == NULL) {
        (void)ferry_errorf(FERRY_ERR_NOMEM, "arena: cannot allocate %zu bytes", nbytes);
        return NULL;
    }
    c->used = c->size;
#else
    if (c == NULL || c->size - c->used < need) {
        size_t size = need > a->chunk_bytes ? need : a->chunk_bytes;
        c = arena_new_chunk(a, size);
        if (c == NULL) {
            (void)ferry_errorf(FERRY_ERR_NOMEM, "arena: cannot allocate %zu bytes", size);
            return NULL;
        }
    }
    c->used += need;
#endif
    a->used += need;
    if (a->used > a->peak)
        a->peak = a->used;
#ifdef FERRY_SANITIZE
    return c->base;
#else
    return c->base + c->used - need;
#endif
}

void ferry_arena_reset(ferry_arena *a) {
#ifdef FERRY_SANITIZE
    arena_free_chunks(a);
#else
    if (a->head != NULL && a->head->next != NULL) {
        /* Several chunks: replace them by one that fits the whole high-water mark. */
        arena_free_chunks(a);
        size_t size = a->peak > a->chunk_bytes ? a->peak : a->chunk_bytes;
        if (arena_new_chunk(a, size) == NULL)
            FERRY_LOG_WARN("arena: cannot coalesce into %zu bytes; will grow again", size);
    }
    if (a->head != NULL)
        a->head->used = 0;
#endif
    a->used = 0;
}

size_t ferry_arena_used(const ferry_arena *a) {
    return a->used;
}

size_t ferry_arena_peak(const ferry_arena *a) {
    return a->peak;
}
