/* buf.h - 64-byte-aligned heap buffers whose large ones are recycled: received
 * tensors (common/rpc) and the CPU backend's memory (gradient blocks, context
 * tensors) live in them.
 * A fresh multi-megabyte block is fresh pages, and page-faulting them in costs
 * about what the loop that fills them costs. A server allocates the same sizes every
 * step, on whichever of its threads runs the call, and glibc keeps each thread's
 * frees in that thread's arena, so a block freed on one thread was not reused by the
 * next step's other thread: medium's gradient blocks page-faulted ~5,000 pages in per
 * rank-step (docs/benchmarks.md). Buffers of 1 MiB or more go back to one process-wide
 * cache (up to 8 and 512 MiB kept) and serve the next request of a size they fit
 * without wasting more than a quarter of it. Under FERRY_SANITIZE nothing is recycled
 * and no header precedes a buffer, so ASan sees every underflow and use after free.
 * Thread-safe. */
#ifndef FERRY_CORE_BUF_H
#define FERRY_CORE_BUF_H

#include <stddef.h>

/* NULL when out of memory (n == 0 gives a valid minimal buffer). Release with
 * ferry_buf_free, never free(); ferry_buf_free(NULL) is a no-op. */
void *ferry_buf_alloc(size_t n);
void ferry_buf_free(void *p);
/* Frees the cached idle buffers (after a burst, such as dropping dead trainers'
 * state); the next large allocation pays the page faults again. */
void ferry_buf_release_idle(void);

#endif /* FERRY_CORE_BUF_H */
